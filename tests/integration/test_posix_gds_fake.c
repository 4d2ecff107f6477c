/*
 * posix backend, GPUDirect Storage's code path without a GPU: a stand-in
 * CUDA driver and libcufile (tests/fakes/fake_gpu.c, one module named by
 * KVL_CUDA_DRIVER and KVL_CUFILE). "VRAM" is host memory the fake driver
 * knows; its cuFileRead/Write pread/pwrite it, and fail unless a device
 * context is current and the buffer lies in a live allocation.
 * Checked: the reports (compatibility mode, GPUDirect Storage with the
 * version, through nvidia-fs or PCI P2PDMA, staged and why: driver open
 * failed, cuFileHandleRegister
 * refused), the transfers' paths and bytes (whole, pieces of the staging
 * chunk, scattered; short cuFile calls continued), gds=on refusing at
 * registration and at posting, failed and short cuFile calls as errors
 * naming the call, file, offset and cuFile status, every handle, buffer and
 * driver session given back, and kvlane doctor's line (--mem VRAM).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/kvltest.h"

enum { LEN = 4 << 20, CHUNK_KIB = 1024 };

static char dir[256];
static int (*fake_alloc)(unsigned long long *, size_t);
static int (*fake_free)(unsigned long long);
static void (*fake_stats)(long *, size_t);
enum { S_OPEN, S_CLOSE, S_HREG, S_HDEREG, S_BREG, S_BDEREG, S_READS, S_WRITES, S_RB, S_WB,
       S_NOCTX, S_N };

typedef struct {
    kvl_agent_t *a;
    int fd;
    unsigned long long src, dst;
    char vdet[2100], fdet[2100];
    kvl_status_t vst;                /* the VRAM registration's status */
} gcase_t;

/* An agent with posix (gds=gds), two 4 MiB "VRAM" ranges and a file, under
 * KVL_FAKE_CUFILE=fake; the reports' details in c. */
static void setup(gcase_t *c, const char *fake, const char *gds, int direct)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    memset(c, 0, sizeof(*c));
    KT_CHECK(setenv("KVL_FAKE_CUFILE", fake, 1) == 0);
    KT_OK(kvl_agent_create("posix-gds-fake", &cfg, &c->a));
    char ck[16];
    snprintf(ck, sizeof(ck), "%d", CHUNK_KIB);
    kvl_param_t prm[] = {{"stage_chunk_kib", ck}, {"gds", gds}};
    KT_OK(kvl_backend_create(c->a, "posix", prm, 2, NULL));
    KT_CHECK(fake_alloc(&c->src, LEN) == 0 && fake_alloc(&c->dst, LEN) == 0);
    char p[512];
    snprintf(p, sizeof(p), "%s/f-%s-%s.bin", dir, fake[0] ? fake : "compat", gds);
    c->fd = open(p, O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
    if (c->fd < 0 && direct)
        c->fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644); /* tmpfs: no O_DIRECT */
    KT_CHECK(c->fd >= 0);
    kvl_reg_params_t pv = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
    kvl_reg_params_t pf = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    kvl_mem_desc_t dv[2] = {{c->src, LEN, 0}, {c->dst, LEN, 0}}, df = {0, 2ull * LEN, c->fd};
    kvl_reg_report_t *rep = NULL;
    c->vst = kvl_mem_register(c->a, dv, 2, &pv, &rep);
    if (rep != NULL && rep->n_entries > 0 && rep->entries[0].n_outcomes > 0)
        snprintf(c->vdet, sizeof(c->vdet), "%s", rep->entries[0].outcomes[0].detail);
    kvl_reg_report_free(rep);
    rep = NULL;
    KT_OK(kvl_mem_register(c->a, &df, 1, &pf, &rep));
    snprintf(c->fdet, sizeof(c->fdet), "%s", rep->entries[0].outcomes[0].detail);
    kvl_reg_report_free(rep);
    printf("[%s, gds=%s] VRAM: %s\n[%s, gds=%s] FILE: %s\n", fake, gds,
           c->vst == KVL_OK ? c->vdet : kvl_last_error()->what, fake, gds, c->fdet);
}

static void teardown(gcase_t *c)
{
    kvl_agent_destroy(c->a); /* deregisters everything, closes posix */
    close(c->fd);
    fake_free(c->src);
    fake_free(c->dst);
}

/* n blocks of len: VRAM at d + doff[i] <-> file at foff[i]; path into path */
static kvl_status_t move(gcase_t *c, kvl_xfer_op_t op, unsigned long long d,
                         const uint64_t *doff, const uint64_t *foff, size_t n, uint64_t len,
                         char *path)
{
    return kt_file_move(c->a, op, KVL_MEM_VRAM, 0, d, doff, foff, n, len, c->fd, path, 64);
}

/* WRITE src -> file, READ -> dst, whole then scattered, bytes checked; each
 * path starts with want. */
static void roundtrip(gcase_t *c, const char *want)
{
    char path[80];
    uint64_t z = 0;
    unsigned char *src = (unsigned char *)(uintptr_t)c->src;
    unsigned char *dst = (unsigned char *)(uintptr_t)c->dst;
    kt_fill(src, LEN, 31);
    memset(dst, 0, LEN);
    KT_OK(move(c, KVL_WRITE, c->src, &z, &z, 1, LEN, path));
    printf("  WRITE %d MiB: path %s\n", LEN >> 20, path);
    KT_CHECK(strncmp(path, want, strlen(want)) == 0);
    KT_OK(move(c, KVL_READ, c->dst, &z, &z, 1, LEN, path));
    KT_CHECK(strncmp(path, want, strlen(want)) == 0);
    KT_CHECK(memcmp(src, dst, LEN) == 0);
    enum { NB = 16, BS = 64 << 10 };
    uint64_t doff[NB], foff[NB];
    for (uint64_t i = 0; i < NB; i++)
        doff[i] = i * BS, foff[i] = LEN + ((i * 7) % NB) * BS;
    kt_fill(src, LEN, 32);
    memset(dst, 0, LEN);
    KT_OK(move(c, KVL_WRITE, c->src, doff, foff, NB, BS, path));
    KT_OK(move(c, KVL_READ, c->dst, doff, foff, NB, BS, path));
    KT_CHECK(memcmp(src, dst, (size_t)NB * BS) == 0);
    char link[64], *h = malloc(BS);
    snprintf(link, sizeof(link), "/proc/self/fd/%d", c->fd);
    int rfd = open(link, O_RDONLY);
    KT_CHECK(h && rfd >= 0 && pread(rfd, h, BS, (off_t)foff[3]) == BS);
    KT_CHECK(memcmp(h, src + 3 * BS, BS) == 0);
    close(rfd);
    free(h);
}

static void stats(long *s)
{
    fake_stats(s, S_N);
}

/* No nvidia-fs: compatibility mode, cuFile moves it; gds=on refuses. */
static void compat(void)
{
    gcase_t c;
    long s0[S_N], s1[S_N];
    stats(s0);
    setup(&c, "", "auto", 1);
    KT_OK(c.vst);
    KT_CHECK(strstr(c.vdet, "VRAM on GPU 0: cuFile in compatibility mode through libcufile "
                            "1.15: nvidia-fs is not loaded (cuFileDriverGetProperties: "
                            "nvidia-fs version 0.0)"));
    KT_CHECK(strstr(c.vdet, "buffer registered with cuFile"));
    KT_CHECK(strstr(c.fdet, "; VRAM with it: cuFile (compatibility mode)"));
    roundtrip(&c, "cuFile (compatibility mode)");
    stats(s1);
    /* 4 MiB in 1 MiB pieces each way, then 16 blocks each way */
    KT_CHECK(s1[S_WRITES] - s0[S_WRITES] == 4 + 16 && s1[S_READS] - s0[S_READS] == 4 + 16);
    KT_CHECK(s1[S_NOCTX] == s0[S_NOCTX]);
    teardown(&c);

    setup(&c, "", "on", 1);
    KT_STATUS(c.vst, KVL_ERR_NO_BACKEND); /* posix refused it: the cause says why */
    KT_ERROR_HAS("parameter gds=on, but GPUDirect Storage cannot be used: cuFile in "
                 "compatibility mode");
    teardown(&c);
}

/* nvidia-fs loaded: GPUDirect Storage, gds=on included; short calls continue. */
static void gpudirect(void)
{
    gcase_t c;
    setup(&c, "nvfs", "on", 1);
    KT_OK(c.vst);
    KT_CHECK(strstr(c.vdet, "VRAM on GPU 0: GPUDirect Storage through libcufile 1.15 "
                            "(nvidia-fs 2.20), buffer registered with cuFile"));
    KT_CHECK(strstr(c.fdet, "; VRAM with it: GPUDirect Storage"));
    roundtrip(&c, "cuFile (GPUDirect Storage)");
    teardown(&c);

    setup(&c, "p2p", "on", 1);
    KT_OK(c.vst);
    KT_CHECK(strstr(c.vdet, "VRAM on GPU 0: GPUDirect Storage through libcufile 1.15 (PCI "
                            "P2PDMA; nvidia-fs not loaded)"));
    teardown(&c);

    long s0[S_N], s1[S_N];
    stats(s0);
    setup(&c, "nvfs half", "auto", 1);
    roundtrip(&c, "cuFile (GPUDirect Storage)");
    stats(s1);
    KT_CHECK(s1[S_WRITES] - s0[S_WRITES] > 4 + 16); /* each piece in several calls */
    teardown(&c);
}

/* Staged, and why: the driver does not open; the file's handle is refused
 * (gds=on: the posting is refused). */
static void staged(void)
{
    gcase_t c;
    setup(&c, "open_fail", "auto", 0);
    KT_OK(c.vst);
    KT_CHECK(strstr(c.vdet, "staged through pinned host buffers (4 x 1024 KiB); GPUDirect "
                            "Storage not used: cuFileDriverOpen = CU_FILE_DRIVER_NOT_INITIALIZED"));
    KT_CHECK(strstr(c.fdet, "; VRAM with it: staged, GPUDirect Storage not used: "
                            "cuFileDriverOpen"));
    roundtrip(&c, "staged (pinned host buffers)");
    teardown(&c);

    setup(&c, "nvfs handle_fail", "auto", 0);
    char want[128];
    snprintf(want, sizeof(want), "; VRAM with it: staged: cuFileHandleRegister on fd %d: "
             "CU_FILE_IO_NOT_SUPPORTED", c.fd);
    KT_CHECK(strstr(c.fdet, want));
    roundtrip(&c, "staged (pinned host buffers)");
    teardown(&c);

    setup(&c, "nvfs handle_fail", "on", 0);
    KT_OK(c.vst);
    char path[80];
    uint64_t z = 0;
    KT_STATUS(move(&c, KVL_WRITE, c.src, &z, &z, 1, LEN, path), KVL_ERR_UNSUPPORTED);
    KT_ERROR_HAS("parameter gds=on, but GPUDirect Storage cannot be used for this file: staged: "
                 "cuFileHandleRegister on fd");
    teardown(&c);
}

/* cuFile's failures end the transfer with the call, file, offset, status. */
static void failures(void)
{
    gcase_t c;
    char path[80], want[200];
    uint64_t z = 0, off = 1 << 20;
    setup(&c, "nvfs", "auto", 0);
    KT_OK(move(&c, KVL_WRITE, c.src, &z, &z, 1, LEN, path));
    KT_CHECK(setenv("KVL_FAKE_CUFILE", "nvfs io_fail", 1) == 0);
    KT_STATUS(move(&c, KVL_WRITE, c.src, &z, &off, 1, LEN, path), KVL_ERR_SYSTEM);
    KT_ERROR_HAS("cuFileWrite of 1048576 bytes at file offset ");
    snprintf(want, sizeof(want), "(fd %d), GPU 0 address 0x", c.fd);
    KT_ERROR_HAS(want);
    KT_ERROR_HAS(": failed after 0 bytes: CU_FILE_IO_ERROR (5044)");
    printf("io_fail: %s\n", kvl_last_error()->what);
    KT_CHECK(setenv("KVL_FAKE_CUFILE", "nvfs read_zero", 1) == 0);
    KT_STATUS(move(&c, KVL_READ, c.dst, &z, &z, 1, LEN, path), KVL_ERR_SYSTEM);
    KT_ERROR_HAS("cuFileRead of 1048576 bytes at file offset "); /* which piece: any */
    KT_ERROR_HAS(": short after 0 bytes: the end of the file");
    printf("read_zero: %s\n", kvl_last_error()->what);
    teardown(&c);
}

static char doctor_obs[512];
static void doctor_cb(void *arg, const char *check, int status, const char *observed,
                      const char *hint)
{
    (void)arg, (void)hint;
    if (strcmp(check, "posix GPUDirect Storage") == 0 && status == 0)
        snprintf(doctor_obs, sizeof(doctor_obs), "%s", observed);
}

/* kvlane doctor --mem VRAM: posix's line on libcufile (the driver not opened) */
static void doctor(void)
{
    long s0[S_N], s1[S_N];
    stats(s0);
    KT_OK(kvl_backend_probe("posix", doctor_cb, NULL, KVL_MEM_VRAM, 0, 0));
    stats(s1);
    printf("doctor: posix GPUDirect Storage: %s\n", doctor_obs);
    KT_CHECK(strstr(doctor_obs, "libcufile 1.15 loads; nvidia-fs "));
    KT_CHECK(s1[S_OPEN] == s0[S_OPEN]);
}

static int load_fake(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    *(void **)&fake_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&fake_free = dlsym(h, "cuMemFree_v2");
    *(void **)&fake_stats = dlsym(h, "kvl_fake_gpu_stats");
    return fake_alloc && fake_free && fake_stats ? 0 : -1;
}

int main(void)
{
    const char *b = getenv("KVL_BUILD"), *t = getenv("TMPDIR");
    char lib[600], cmd[700];
    snprintf(lib, sizeof(lib), "%s/tests/libkvl_fake_gpu.so", b && b[0] ? b : ".");
    if (access(lib, R_OK) != 0)
        KT_SKIP("the fake driver %s is not built (%s)", lib, strerror(errno));
    snprintf(dir, sizeof(dir), "%s/kvl-gds-fake-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    /* read when kvlane first needs them */
    KT_CHECK(setenv("KVL_CUDA_DRIVER", lib, 1) == 0 && setenv("KVL_CUFILE", lib, 1) == 0);
    KT_CHECK(load_fake(lib) == 0);
    compat();
    gpudirect();
    staged();
    failures();
    doctor();
    long s[S_N];
    stats(s);
    printf("cuFile calls: %ld driver opens, %ld closes; %ld/%ld handles, %ld/%ld buffers "
           "(registered/given back); %ld reads, %ld writes; %ld without a context\n",
           s[S_OPEN], s[S_CLOSE], s[S_HREG], s[S_HDEREG], s[S_BREG], s[S_BDEREG], s[S_READS],
           s[S_WRITES], s[S_NOCTX]);
    KT_CHECK(s[S_OPEN] == s[S_CLOSE] && s[S_HREG] == s[S_HDEREG] && s[S_BREG] == s[S_BDEREG]);
    KT_CHECK(s[S_NOCTX] == 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("PASS\n");
    return 0;
}
