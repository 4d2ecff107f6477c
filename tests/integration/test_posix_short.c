/*
 * posix: READs that the file system answers short. pread is wrapped so that
 * the first read of every 1 MiB piece gets half the piece; the backend must
 * resume each piece and deliver every byte:
 *   1. into host memory, on the pread/pwrite threads: the rest is read
 *      straight into place;
 *   2. into GPU memory, staged through pinned buffers by several stager
 *      threads (on the GPU machine; skipped with the reason elsewhere). Here
 *      the read of the rest first finds "the end of the file" once (as a file
 *      truncated under a reader and grown again would answer), so the piece
 *      is given back short and resumed, by any stager, into its own buffer;
 *      the copy to the GPU takes the piece whole from that buffer, so it
 *      must read the whole piece again. (Before session 23 it read only the
 *      rest, which was right only because the stager that gave a piece back
 *      takes it again at once, under the same lock hold: this test passed
 *      with that code on an H100 too.)
 * Every byte is checked, and the test checks that it shortened the reads
 * it meant to (so that it can fail). Nothing is timed.
 *
 * KVL_TEST_WRAP: pread
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "gpu/kvl_cuda_test.h"

#define PIECE (1u << 20)
#define NPIECE 32u
#define LEN ((uint64_t)PIECE * NPIECE)

ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off);

static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
static int wfd = -1;                 /* the file whose reads are shortened */
static int weof;                     /* a cut piece's next read finds "the end" once */
static unsigned char cut[NPIECE];    /* per piece: 0, 1 first read cut, 2 end found */
static unsigned ncut, neof;

ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off)
{
    if (fd < 0 || off < 0 || (uint64_t)off >= LEN)
        return __real_pread(fd, buf, n, off);
    pthread_mutex_lock(&wlock);
    unsigned char *c = fd == wfd ? &cut[off / PIECE] : NULL;
    int half = c != NULL && *c == 0 && off % PIECE == 0 && n == PIECE;
    int end = c != NULL && *c == 1 && weof && off % PIECE == PIECE / 2;
    if (half)
        *c = 1, ncut++;
    if (end)
        *c = 2, neof++;
    pthread_mutex_unlock(&wlock);
    if (end)
        return 0;
    return __real_pread(fd, buf, half ? n / 2 : n, off);
}

static void arm(int fd, int eof)
{
    pthread_mutex_lock(&wlock);
    wfd = fd;
    weof = eof;
    memset(cut, 0, sizeof(cut));
    ncut = neof = 0;
    pthread_mutex_unlock(&wlock);
}

static void disarm(unsigned *ncut_p, unsigned *neof_p)
{
    pthread_mutex_lock(&wlock);
    wfd = -1;
    *ncut_p = ncut;
    *neof_p = neof;
    pthread_mutex_unlock(&wlock);
}

static kvl_agent_t *posix_agent(const char *name, const kvl_param_t *prm, size_t np)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    KT_OK(kvl_backend_create(a, "posix", prm, np, NULL));
    return a;
}

/* READ the file's NPIECE pieces into base (kind), piece i to slot
 * (i * 7) % NPIECE, with every first read of a piece cut short. */
static void read_cut(kvl_agent_t *a, kvl_mem_kind_t kind, int32_t dev, uint64_t base, int fd,
                     int eof, const char *what)
{
    uint64_t doff[NPIECE], foff[NPIECE];
    for (uint64_t i = 0; i < NPIECE; i++) {
        doff[i] = (i * 7 % NPIECE) * PIECE;
        foff[i] = i * PIECE;
    }
    char path[80];
    unsigned nc, ne;
    arm(fd, eof);
    kvl_status_t st = kt_file_move(a, KVL_READ, kind, dev, base, doff, foff, NPIECE, PIECE, fd,
                                   path, sizeof(path));
    disarm(&nc, &ne);
    printf("%s: READ of %u pieces over path %s: %s; %u first reads cut short, %u ended early\n",
           what, NPIECE, path, kvl_status_name(st), nc, ne);
    KT_OK(st);
    KT_CHECK(nc == NPIECE && ne == (eof ? NPIECE : 0u)); /* every piece was resumed */
}

/* The expected image: slot (i * 7) % NPIECE holds the file's piece i. */
static unsigned char *expected(const unsigned char *file)
{
    unsigned char *w = malloc(LEN);
    KT_CHECK(w != NULL);
    for (uint64_t i = 0; i < NPIECE; i++)
        memcpy(w + (i * 7 % NPIECE) * PIECE, file + i * PIECE, PIECE);
    return w;
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    char dir[256], p[300];
    snprintf(dir, sizeof(dir), "%s/kvl-short-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    snprintf(p, sizeof(p), "%s/short.bin", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    KT_CHECK(fd >= 0);
    unsigned char *file = malloc(LEN);
    KT_CHECK(file != NULL);
    kt_fill(file, LEN, 5);
    KT_CHECK(pwrite(fd, file, LEN, 0) == (ssize_t)LEN);
    unsigned char *want = expected(file);
    kvl_mem_desc_t df = {0, LEN, fd};
    kvl_reg_params_t pf = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};

    /* 1. host memory, pread/pwrite threads */
    kvl_param_t th[] = {{"engine", "threads"}};
    kvl_agent_t *a = posix_agent("short-host", th, 1);
    unsigned char *host = calloc(1, LEN);
    KT_CHECK(host != NULL);
    kvl_mem_desc_t dh = {(uint64_t)(uintptr_t)host, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &dh, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &df, 1, &pf, NULL));
    read_cut(a, KVL_MEM_DRAM, KVL_DEV_ANY, dh.addr, fd, 0, "host memory");
    KT_CHECK(memcmp(host, want, LEN) == 0);
    kvl_agent_destroy(a);
    free(host);

    /* 2. GPU memory, staged by four stagers of 1 MiB buffers */
    kt_cuda_t cu;
    char why[256];
    if (kt_cuda_open(&cu, why, sizeof(why)) != 0) {
        printf("GPU part skipped: %s\n", why);
    } else {
        kvl_param_t st[] = {{"stage_chunk_kib", "1024"}, {"stage_threads", "4"}, {"gds", "off"}};
        a = posix_agent("short-vram", st, 3);
        kt_cu_ptr d;
        KT_CHECK(cu.MemAlloc(&d, LEN) == 0);
        KT_CHECK(cu.MemsetD8(d, 0, LEN) == 0);
        kvl_mem_desc_t dv = {d, LEN, 0};
        kvl_reg_params_t pv = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
        KT_OK(kvl_mem_register(a, &dv, 1, &pv, NULL));
        KT_OK(kvl_mem_register(a, &df, 1, &pf, NULL));
        read_cut(a, KVL_MEM_VRAM, 0, d, fd, 1, "GPU memory");
        unsigned char *got = malloc(LEN);
        KT_CHECK(got != NULL && cu.MemcpyDtoH(got, d, LEN) == 0);
        size_t bad = 0;
        for (uint64_t i = 0; i < NPIECE; i++)
            bad += memcmp(got + i * PIECE, want + i * PIECE, PIECE) != 0;
        printf("GPU memory: %zu of %u pieces differ from the file\n", bad, NPIECE);
        KT_CHECK(bad == 0);
        free(got);
        kvl_agent_destroy(a);
        KT_CHECK(cu.MemFree(d) == 0);
    }
    close(fd);
    unlink(p);
    rmdir(dir);
    free(file);
    free(want);
    printf("test_posix_short: passed\n");
    return 0;
}
