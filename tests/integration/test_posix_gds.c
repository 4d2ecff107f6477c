/*
 * posix backend, GPU memory to and from files through GPUDirect Storage
 * (cuFile, GPU machine; skips with the reason elsewhere). With gds=auto:
 * VRAM -> file -> other VRAM, one block larger than the staging chunk and
 * scattered blocks at shuffled file offsets, every byte checked (on the GPU
 * and in the file); prints the path taken (GPUDirect Storage, cuFile's
 * compatibility mode, or staged) and why, from the registration reports, and
 * checks that the transfers took that path. With gds=on: the same round trip
 * passes on GPUDirect Storage, or the registration (or the first posting)
 * fails with the error that says why.
 * The directory: $KVL_GDS_DIR (a file system GDS supports, e.g. ext4 or XFS
 * on local NVMe), else $TMPDIR, else /tmp. O_DIRECT when it takes it.
 * libcufile: $KVL_CUFILE (a path), else the loader's libcufile.so.0.
 * KVL_TEST_LABELS: gpu
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "gpu/kvl_cuda_test.h"

enum { LEN = 16 << 20, NB = 64, BS = 64 << 10 };

static kt_cuda_t cu;
static char dir[256];

/* One transfer of n blocks of len: VRAM at d + doff[i] <-> file at foff[i].
 * Its path into path (when it completed). */
static kvl_status_t move(kvl_agent_t *a, kvl_xfer_op_t op, kt_cu_ptr d, const uint64_t *doff,
                         const uint64_t *foff, size_t n, uint64_t len, int fd, char *path,
                         size_t cap)
{
    kvl_status_t st = kt_file_move(a, op, KVL_MEM_VRAM, 0, d, doff, foff, n, len, fd, path, cap);
    if (st == KVL_OK)
        printf("  %s %zu x %llu bytes: path %s\n", op == KVL_WRITE ? "WRITE" : "READ", n,
               (unsigned long long)len, path);
    return st;
}

/* Register one range of kind on a; its report's detail into det. */
static kvl_status_t reg(kvl_agent_t *a, kvl_mem_kind_t kind, uint64_t addr, uint64_t len,
                        int32_t dev, char *det, size_t cap)
{
    kvl_mem_desc_t d = {addr, len, dev};
    kvl_reg_params_t p = {.field_mask = KVL_REG_PARAM_KIND, .kind = kind};
    kvl_reg_report_t *rep = NULL;
    kvl_status_t st = kvl_mem_register(a, &d, 1, &p, &rep);
    det[0] = '\0';
    if (rep != NULL && rep->n_entries > 0 && rep->entries[0].n_outcomes > 0)
        snprintf(det, cap, "%s", rep->entries[0].outcomes[0].detail);
    kvl_reg_report_free(rep);
    return st;
}

static int open_file(const char *name, int *direct)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    *direct = fd >= 0;
    if (fd < 0) {
        printf("%s refuses O_DIRECT (%s): the file is opened without it\n", dir,
               strerror(errno));
        fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
    }
    KT_CHECK(fd >= 0);
    return fd;
}

/* The path the VRAM report names: "GDS", "compat" or "staged". */
static const char *path_of(const char *vdet)
{
    return strstr(vdet, "GPUDirect Storage through libcufile") ? "GDS"
           : strstr(vdet, "cuFile in compatibility mode") ? "compat" : "staged";
}

/* WRITE src -> file, READ file -> dst, whole and scattered, bytes checked.
 * Every transfer's path starts with want_path. KVL_OK, or the first
 * failing transfer's status (nothing checked after it). */
static kvl_status_t roundtrip(kvl_agent_t *a, kt_cu_ptr src, kt_cu_ptr dst, int fd,
                              const char *want_path)
{
    char path[80];
    uint64_t z = 0;
    kt_cuda_fill(&cu, src, LEN, 21);
    KT_CHECK(cu.MemsetD8(dst, 0, LEN) == 0);
    kvl_status_t st = move(a, KVL_WRITE, src, &z, &z, 1, LEN, fd, path, sizeof(path));
    if (st != KVL_OK)
        return st;
    KT_CHECK(strncmp(path, want_path, strlen(want_path)) == 0);
    unsigned char *h = malloc(LEN), *want = malloc(LEN);
    KT_CHECK(h && want);
    kt_fill(want, LEN, 21);
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    int rfd = open(link, O_RDONLY); /* without O_DIRECT: any buffer reads it */
    KT_CHECK(rfd >= 0 && pread(rfd, h, BS, 0) == BS && memcmp(h, want, BS) == 0);
    KT_OK(move(a, KVL_READ, dst, &z, &z, 1, LEN, fd, path, sizeof(path)));
    KT_CHECK(strncmp(path, want_path, strlen(want_path)) == 0);
    KT_CHECK(kt_cuda_verify(&cu, dst, LEN, 21) == -1);

    uint64_t doff[NB], foff[NB];
    for (uint64_t i = 0; i < NB; i++) {
        doff[i] = i * BS;
        foff[i] = LEN + ((i * 37) % NB) * BS; /* 37 prime to 64 */
    }
    kt_cuda_fill(&cu, src, LEN, 22);
    KT_CHECK(cu.MemsetD8(dst, 0, LEN) == 0);
    KT_OK(move(a, KVL_WRITE, src, doff, foff, NB, BS, fd, path, sizeof(path)));
    KT_OK(move(a, KVL_READ, dst, doff, foff, NB, BS, fd, path, sizeof(path)));
    KT_CHECK(strncmp(path, want_path, strlen(want_path)) == 0);
    KT_CHECK(kt_cuda_verify(&cu, dst, (uint64_t)NB * BS, 22) == -1);
    kt_fill(want, (uint64_t)NB * BS, 22);
    KT_CHECK(pread(rfd, h, BS, (off_t)foff[5]) == BS && memcmp(h, want + 5 * BS, BS) == 0);
    close(rfd);
    free(h), free(want);
    return KVL_OK;
}

static kvl_agent_t *make_agent(const char *name, const char *gds, kvl_status_t *st)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t prm[] = {{"stage_chunk_kib", "1024"}, {"gds", gds}};
    *st = kvl_backend_create(a, "posix", prm, 2, NULL);
    return a;
}

/* gds=auto: the path the reports name, and the transfers take it. */
static const char *run_auto(kt_cu_ptr src, kt_cu_ptr dst)
{
    char vdet[2100], fdet[2100];
    int direct;
    kvl_status_t st;
    kvl_agent_t *a = make_agent("posix-gds-auto", "auto", &st);
    KT_OK(st);
    int fd = open_file("auto.bin", &direct);
    KT_OK(reg(a, KVL_MEM_VRAM, src, LEN, 0, vdet, sizeof(vdet)));
    KT_OK(reg(a, KVL_MEM_VRAM, dst, LEN, 0, fdet, sizeof(fdet)));
    KT_OK(reg(a, KVL_MEM_FILE, 0, 2ull * LEN, fd, fdet, sizeof(fdet)));
    const char *p = path_of(vdet);
    printf("gds=auto: VRAM report: %s\n", vdet);
    printf("gds=auto: FILE report: %s\n", fdet);
    const char *vw = strstr(fdet, "VRAM with it: ");
    KT_CHECK(vw != NULL);
    int handle = strncmp(vw, "VRAM with it: GPUDirect Storage", 31) == 0 ||
                 strncmp(vw, "VRAM with it: cuFile (compatibility mode)", 41) == 0;
    int staged = strcmp(p, "staged") == 0 || !handle;
    const char *want = staged ? "staged" : strcmp(p, "GDS") == 0 ? "cuFile (GPUDirect Storage)"
                                                                 : "cuFile (compatibility mode)";
    const char *reason = !staged ? vdet : strcmp(p, "staged") == 0 ? vdet : vw;
    printf("gds=auto: path %s, file %s; why: %s\n", staged ? "staged" : p,
           direct ? "O_DIRECT" : "page cache", reason);
    KT_OK(roundtrip(a, src, dst, fd, want));
    kvl_agent_destroy(a); /* deregisters: cuFile's handle and buffers go back */
    close(fd);
    printf("gds=auto: ok\n");
    return staged ? "staged" : p;
}

/* gds=on: passes on GPUDirect Storage, or fails saying why. */
static void run_on(kt_cu_ptr src, kt_cu_ptr dst)
{
    char vdet[2100], fdet[2100];
    int direct;
    kvl_status_t st;
    kvl_agent_t *a = make_agent("posix-gds-on", "on", &st);
    KT_OK(st);
    int fd = open_file("on.bin", &direct);
    st = reg(a, KVL_MEM_VRAM, src, LEN, 0, vdet, sizeof(vdet));
    if (st != KVL_OK) {
        const kvl_error_t *e = kvl_last_error();
        KT_STATUS(st, KVL_ERR_NO_BACKEND); /* posix refused it: the cause says why */
        KT_ERROR_HAS("parameter gds=on, but GPUDirect Storage cannot be used: ");
        printf("gds=on: VRAM registration refused, as it must be without GPUDirect Storage: "
               "%s\n", e->n_causes > 0 ? e->causes[0].what : e->what);
    } else {
        printf("gds=on: VRAM report: %s\n", vdet);
        KT_CHECK(strcmp(path_of(vdet), "GDS") == 0);
        KT_OK(reg(a, KVL_MEM_VRAM, dst, LEN, 0, fdet, sizeof(fdet)));
        KT_OK(reg(a, KVL_MEM_FILE, 0, 2ull * LEN, fd, fdet, sizeof(fdet)));
        printf("gds=on: FILE report: %s\n", fdet);
        st = roundtrip(a, src, dst, fd, "cuFile (GPUDirect Storage)");
        if (st != KVL_OK) {
            KT_STATUS(st, KVL_ERR_UNSUPPORTED);
            KT_ERROR_HAS("parameter gds=on, but GPUDirect Storage cannot be used for this "
                         "file: ");
            printf("gds=on: the transfer was refused, as it must be for a file cuFile does not "
                   "take: %s\n", kvl_last_error()->what);
        } else {
            printf("gds=on: GPUDirect Storage round trip ok\n");
        }
    }
    kvl_agent_destroy(a);
    close(fd);
}

int main(void)
{
    char why[512];
    if (kt_cuda_open(&cu, why, sizeof(why)) != 0)
        KT_SKIP("%s", why);
    if (kvl_backend_available("cuda", why, sizeof(why)) != KVL_OK)
        KT_SKIP("cuda backend (the device context and staging copies) not available: %s", why);
    const char *t = getenv("KVL_GDS_DIR");
    if (t == NULL || !t[0])
        t = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/kvl-posix-gds-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    const char *cf = getenv("KVL_CUFILE");
    void *h = dlopen(cf && cf[0] ? cf : "libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL && !(cf && cf[0]))
        h = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    printf("libcufile (KVL_CUFILE=%s): %s; files in %s\n", cf ? cf : "", h != NULL ? "loads"
           : dlerror(), dir);
    if (h != NULL)
        dlclose(h);
    kt_cu_ptr src = 0, dst = 0;
    KT_CHECK(cu.MemAlloc(&src, LEN) == 0 && cu.MemAlloc(&dst, LEN) == 0);
    const char *p = run_auto(src, dst);
    if (h != NULL)
        run_on(src, dst);
    cu.MemFree(src);
    cu.MemFree(dst);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    if (h == NULL)
        KT_SKIP("libcufile.so does not load here: the staged path passed, cuFile untested");
    printf("PASS (path %s)\n", p);
    return 0;
}
