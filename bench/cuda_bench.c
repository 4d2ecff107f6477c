/*
 * cuda backend benchmark: two processes on one GPU, kvlane against a plain
 * driver copy of the same bytes, in one run.
 *   VRAM->VRAM 1 GiB (CUDA IPC)          vs cuMemcpyDtoD 1 GiB     target >= 90%
 *   65536 scattered 32 KiB blocks        vs cuMemcpyDtoD 2 GiB     target >= 75%
 *   VRAM->remote pinned DRAM 1 GiB       vs cuMemcpyDtoH 1 GiB     target >= 90%
 *   VRAM->VRAM 256 MiB over tcp, staged  vs DRAM->DRAM over tcp    information
 *   VRAM->VRAM 256 MiB over ucx, staged  vs DRAM->DRAM over ucx    information
 *     (the ucx row when the ucx module loads and its UCX cannot map GPU
 *     memory, like Debian's and Ubuntu's UCX)
 * kvlane time: post to completion seen by kvl_xfer_wait (wall clock, the
 * caller's view), re-posting the same transfer as engines re-post prepared
 * transfers; reference: the copy call plus stream synchronize. Median of
 * ITERS after WARMUP. The scattered blocks are checked afterwards: read back
 * (scattered READ, also timed) into a contiguous buffer and compared with
 * the pattern of every source block. Exit 77 without a GPU, 1 on a mismatch.
 *
 * --peer-dev N: across GPUs. The target's memory is on device N, the
 * initiator's on device 0; the reference is a plain peer-to-peer copy
 * (cuMemcpyDtoDAsync into device N with peer access on) of the same bytes:
 *   GPU 0 -> GPU N 1 GiB, 2 processes     vs P2P copy 1 GiB          target >= 90%
 *   65536 scattered 32 KiB blocks         vs P2P copy 2 GiB          target >= 75%
 * (the host and staged rows are left out). Exit 77 when device N does not
 * exist. --peer-dev 0 runs the same code on one GPU: a dry run only.
 * Usage: cuda_bench [iters] [--peer-dev N]
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "../tests/gpu/kvl_cuda_test.h"

#define GIB (1ull << 30)
#define BLK (32ull << 10)
#define NBLK 65536ull
#define WARMUP 3
#define TCPB (256ull << 20)

static kt_cuda_t cu;
static int iters = 20;
static int peer_dev = -1;     /* --peer-dev N: target memory on device N */

static void die(const char *what)
{
    char text[2048];
    kvl_error_render(NULL, text, sizeof(text));
    fprintf(stderr, "cuda_bench: %s failed\n%s\n", what, text);
    exit(1);
}
#define OK(call) do { if ((call) != KVL_OK) die(#call); } while (0)
#define CU(call) do { if ((call) != 0) { fprintf(stderr, "cuda_bench: %s failed\n", #call); exit(1); } } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(*t), cmp_d);
    return t[n / 2];
}

static void snd(int fd, const void *p, uint64_t len)
{
    if (write(fd, &len, 8) != 8 || write(fd, p, len) != (ssize_t)len)
        exit(1);
}

static void *rcv(int fd, uint64_t *len_p)
{
    uint64_t len = 0, got = 0;
    if (read(fd, &len, 8) != 8)
        exit(1);
    char *b = malloc(len + 1);
    while (got < len) {
        ssize_t r = read(fd, b + got, len - got);
        if (r <= 0)
            exit(1);
        got += (uint64_t)r;
    }
    *len_p = len;
    return b;
}

static kvl_agent_t *agent(const char *name)
{
    /* cuda first: it serves every row but the staged ones, which ask for
     * tcp or ucx (ucx when its module loads) */
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = "cuda,tcp"};
    kvl_agent_t *a;
    char why[256];
    OK(kvl_agent_create(name, &cfg, &a));
    if (kvl_backend_available("ucx", why, sizeof(why)) == KVL_OK && strstr(why, "no GPU memory"))
        OK(kvl_backend_create(a, "ucx", NULL, 0, NULL));
    return a;
}

static void reg(kvl_agent_t *a, uint64_t addr, uint64_t len, kvl_mem_kind_t kind)
{
    kvl_reg_params_t p = {.field_mask = KVL_REG_PARAM_KIND, .kind = kind};
    kvl_mem_desc_t d = {addr, len, KVL_DEV_ANY};
    OK(kvl_mem_register(a, &d, 1, &p, NULL));
}

static void target(int fd)
{
    char why[256];
    kt_cu_ptr v;
    void *h, *blob;
    size_t bl;
    uint64_t n;
    if (kt_cuda_open(&cu, why, sizeof(why)) != 0)
        exit(77);
    if (peer_dev >= 0)
        CU(kt_cuda_use_dev(&cu, peer_dev, NULL));
    kvl_agent_t *a = agent("bench-target");
    CU(cu.MemAlloc(&v, 2 * GIB));
    CU(cu.MemsetD8(v, 0, 2 * GIB));
    OK(kvl_mem_alloc(a, GIB, &h));
    reg(a, v, 2 * GIB, KVL_MEM_VRAM);
    reg(a, (uint64_t)(uintptr_t)h, GIB, KVL_MEM_DRAM);
    OK(kvl_metadata_get(a, &blob, &bl));
    snd(fd, blob, bl);
    kvl_free(blob);
    free(rcv(fd, &n)); /* bye */
    kvl_agent_destroy(a);
    exit(0);
}

static double time_x(kvl_xfer_t *x)
{
    double t[256];
    for (int i = 0; i < WARMUP + iters; i++) {
        double t0 = now();
        kvl_status_t st = kvl_xfer_post(x);
        if (st != KVL_OK && st != KVL_IN_PROGRESS)
            die("kvl_xfer_post");
        OK(kvl_xfer_wait(x, 60000));
        if (i >= WARMUP)
            t[i - WARMUP] = now() - t0;
    }
    return median(t, iters);
}

static double time_ref(kt_cu_stream_t s, int d2h, kt_cu_ptr dst, void *hdst, kt_cu_ptr src,
                       uint64_t len)
{
    double t[256];
    for (int i = 0; i < WARMUP + iters; i++) {
        double t0 = now();
        if (d2h)
            CU(cu.MemcpyDtoHAsync(hdst, src, len, s));
        else
            CU(cu.MemcpyDtoDAsync(dst, src, len, s));
        CU(cu.StreamSynchronize(s));
        if (i >= WARMUP)
            t[i - WARMUP] = now() - t0;
    }
    return median(t, iters);
}

static kvl_xfer_t *mkx_bk(kvl_agent_t *a, kvl_xfer_op_t op, kvl_mem_kind_t lk, kvl_mem_kind_t rk,
                          const uint64_t *la, const uint64_t *ra, uint64_t n, uint64_t bs,
                          const char *backend)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    kvl_xfer_params_t p = {.field_mask = backend ? KVL_XFER_PARAM_BACKEND : 0, .backend = backend};
    OK(kvl_dlist_create(lk, n, &l));
    OK(kvl_dlist_create(rk, n, &r));
    for (uint64_t i = 0; i < n; i++) {
        OK(kvl_dlist_add(l, la[i], bs, KVL_DEV_ANY));
        OK(kvl_dlist_add(r, ra[i], bs, KVL_DEV_ANY));
    }
    OK(kvl_xfer_create(a, op, l, "bench-target", r, &p, &x));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return x;
}

static kvl_xfer_t *mkx_op(kvl_agent_t *a, kvl_xfer_op_t op, kvl_mem_kind_t rk,
                          const uint64_t *la, const uint64_t *ra, uint64_t n, uint64_t bs)
{
    return mkx_bk(a, op, KVL_MEM_VRAM, rk, la, ra, n, bs, NULL);
}

static kvl_xfer_t *mkx(kvl_agent_t *a, kvl_mem_kind_t rk, const uint64_t *la, const uint64_t *ra,
                       uint64_t n, uint64_t bs)
{
    return mkx_op(a, KVL_WRITE, rk, la, ra, n, bs);
}

/* Word w of source block b: unique per block and offset. */
static uint64_t pat(uint64_t b, uint64_t w)
{
    return (b << 32) ^ (w * 0x9e3779b97f4a7c15ull) ^ 0x6b766c616e65ull;
}

static void row(const char *name, uint64_t bytes, double tk, double tr, double target_pct,
                double post_us, const char *path)
{
    double gk = (double)bytes / tk / 1e9, gr = (double)bytes / tr / 1e9;
    printf("| %-36s | %5.2f | %11.1f | %10.1f | %5.1f%% | >= %2.0f%% %-4s | %8.1f | %s |\n", name,
           (double)bytes / GIB, gk, gr, 100.0 * gk / gr, target_pct,
           100.0 * gk / gr >= target_pct ? "ok" : "MISS", post_us, path);
    /* rows for bench/compare: claim,kvlane GB/s,reference,reference GB/s,ratio,target */
    const char *csv = getenv("KVL_COMPARE_CSV");
    FILE *f = csv && csv[0] ? fopen(csv, "a") : NULL;
    if (f != NULL) {
        char claim[96];
        snprintf(claim, sizeof(claim), "%s", name);
        for (char *c = claim; *c; c++)
            if (*c == ',')
                *c = ';';
        if (ftell(f) == 0)
            fprintf(f, "claim,kvlane_gbps,reference,reference_gbps,ratio,target\n");
        fprintf(f, "%s,%.1f,plain CUDA copy,%.1f,%.3f,%.2f\n", claim, gk, gr, gk / gr,
                target_pct / 100.0);
        fclose(f);
    }
}

/* VRAM -> remote VRAM over a host-only backend (staged), and DRAM -> remote
 * DRAM on the same backend as the reference; skipped when either agent
 * lacks the backend. */
static void staged_row(kvl_agent_t *a, const char *bk, uint64_t lvram, uint64_t rvram,
                       uint64_t lhost, uint64_t rhost)
{
    kvl_xfer_params_t p = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = bk};
    kvl_xfer_stats_t st;
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    char label[64], path[64];
    double tk, tr;
    OK(kvl_dlist_create(KVL_MEM_VRAM, 1, &l));
    OK(kvl_dlist_create(KVL_MEM_VRAM, 1, &r));
    OK(kvl_dlist_add(l, lvram, TCPB, KVL_DEV_ANY));
    OK(kvl_dlist_add(r, rvram, TCPB, KVL_DEV_ANY));
    kvl_status_t s = kvl_xfer_create(a, KVL_WRITE, l, "bench-target", r, &p, &x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    snprintf(label, sizeof(label), "VRAM->VRAM 256 MiB over %s, staged", bk);
    if (s != KVL_OK) {
        printf("| %-36s | skipped: %s |\n", label, kvl_last_error()->what);
        return;
    }
    tk = time_x(x);
    kvl_xfer_get_stats(x, &st);
    snprintf(path, sizeof(path), "%s", st.path);
    kvl_xfer_release(x);
    x = mkx_bk(a, KVL_WRITE, KVL_MEM_DRAM, KVL_MEM_DRAM, &lhost, &rhost, 1, TCPB, bk);
    tr = time_x(x);
    kvl_xfer_release(x);
    printf("| %-36s | %5.2f | %11.2f | %10.2f | %5.1f%% | %-10s | %8s | %s |\n", label,
           (double)TCPB / GIB, (double)TCPB / tk / 1e9, (double)TCPB / tr / 1e9,
           100.0 * tr / tk, "(info)", "", path);
    printf("  (plain column: DRAM->DRAM 256 MiB over %s between the same processes)\n", bk);
}

static void initiator(int fd)
{
    char why[256], avail[512];
    kt_cu_ptr src, ref;
    kt_cu_stream_t s;
    void *pinned, *blob;
    uint64_t bl;
    kvl_mem_desc_t rr[4];
    kvl_mem_kind_t rk[4];
    size_t nr = 0;
    char nm[64];
    kvl_xfer_stats_t st;

    if (kt_cuda_open(&cu, why, sizeof(why)) != 0) {
        printf("SKIP: %s\n", why);
        exit(77);
    }
    kvl_agent_t *a = agent("bench-initiator");
    CU(cu.MemAlloc(&src, 2 * GIB));
    if (peer_dev >= 0) {
        /* the reference copy's destination is on the target's GPU, reached
         * peer to peer, as kvlane's copies are */
        kt_cu_ctx_t c0, cn;
        CU(kt_cuda_use_dev(&cu, 0, &c0));
        CU(kt_cuda_use_dev(&cu, peer_dev, &cn));
        CU(cu.MemAlloc(&ref, 2 * GIB));
        CU(cu.CtxSetCurrent(c0));
        if (peer_dev != 0) {
            int r = cu.CtxEnablePeerAccess(cn, 0);
            if (r != 0 && r != 704 /* already enabled */) {
                fprintf(stderr, "cuda_bench: cuCtxEnablePeerAccess(device %d) = %d: no peer "
                        "access between the GPUs\n", peer_dev, r);
                exit(1);
            }
        }
    } else {
        CU(cu.MemAlloc(&ref, 2 * GIB));
    }
    CU(cu.MemsetD8(src, 0x5a, 2 * GIB));
    CU(cu.MemHostAlloc(&pinned, GIB, 0));
    memset(pinned, 0, GIB);
    CU(cu.StreamCreate(&s, 1));
    reg(a, src, 2 * GIB, KVL_MEM_VRAM);
    reg(a, ref, 2 * GIB, KVL_MEM_VRAM); /* the READ-back check lands here */
    blob = rcv(fd, &bl);
    OK(kvl_metadata_load(a, blob, bl, nm, sizeof(nm)));
    free(blob);
    OK(kvl_remote_regions(a, "bench-target", rr, rk, 4, &nr));
    uint64_t rv = 0, rh = 0;
    for (size_t i = 0; i < nr; i++) {
        if (rk[i] == KVL_MEM_VRAM)
            rv = rr[i].addr;
        else
            rh = rr[i].addr;
    }
    kvl_backend_available("cuda", avail, sizeof(avail));
    printf("cuda backend: %s\n", avail);
    printf("iterations: %d (median), warm-up %d\n\n", iters, WARMUP);
    printf("| %-36s | %5s | %11s | %10s | %6s | %-10s | %8s | %s |\n", "transfer", "GiB",
           "kvlane GB/s", "plain GB/s", "ratio", "target", "post us", "kvlane path");
    printf("|--------------------------------------|-------|-------------|------------|--------|"
           "------------|----------|-------------|\n");

    /* 1. VRAM -> VRAM 1 GiB */
    uint64_t la = src, ra = rv;
    char label[64];
    kvl_xfer_t *x = mkx(a, KVL_MEM_VRAM, &la, &ra, 1, GIB);
    double tk = time_x(x), tr = time_ref(s, 0, ref, NULL, src, GIB);
    kvl_xfer_get_stats(x, &st);
    if (peer_dev >= 0)
        snprintf(label, sizeof(label), "GPU 0->GPU %d 1 GiB, 2 processes", peer_dev);
    else
        snprintf(label, sizeof(label), "VRAM->VRAM 1 GiB, 2 processes");
    row(label, GIB, tk, tr, 90, (double)st.post_ns / 1e3, st.path);
    kvl_xfer_release(x);

    /* 2. 65536 scattered 32 KiB blocks (random order on the remote side) */
    uint64_t *lv = malloc(NBLK * 8), *rv2 = malloc(NBLK * 8), *perm = malloc(NBLK * 8);
    for (uint64_t i = 0; i < NBLK; i++)
        perm[i] = i;
    srand(42);
    for (uint64_t i = NBLK - 1; i > 0; i--) {
        uint64_t j = (uint64_t)rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (uint64_t i = 0; i < NBLK; i++) {
        lv[i] = src + perm[(i * 7919) % NBLK] * BLK;  /* scattered on both sides */
        rv2[i] = rv + perm[i] * BLK;
    }
    /* a pattern unique to every source block, to check the bytes afterwards */
    uint64_t *hb = malloc(NBLK * BLK);
    if (hb == NULL)
        die("malloc(2 GiB)");
    for (uint64_t b = 0; b < NBLK; b++)
        for (uint64_t w = 0; w < BLK / 8; w++)
            hb[b * (BLK / 8) + w] = pat(b, w);
    CU(cu.MemcpyHtoD(src, hb, NBLK * BLK));
    x = mkx(a, KVL_MEM_VRAM, lv, rv2, NBLK, BLK);
    tk = time_x(x);
    tr = time_ref(s, 0, ref, NULL, src, NBLK * BLK);
    kvl_xfer_get_stats(x, &st);
    if (peer_dev >= 0)
        snprintf(label, sizeof(label), "65536 x 32 KiB scattered, GPU 0->%d", peer_dev);
    else
        snprintf(label, sizeof(label), "65536 x 32 KiB scattered, VRAM->VRAM");
    row(label, NBLK * BLK, tk, tr, 75, (double)st.post_ns / 1e3, st.path);
    kvl_xfer_release(x);
    /* read every remote block back, scattered, into ref (block i <- rv2[i]) */
    uint64_t *lref = malloc(NBLK * 8);
    for (uint64_t i = 0; i < NBLK; i++)
        lref[i] = ref + i * BLK;
    CU(cu.MemsetD8(ref, 0, NBLK * BLK));
    x = mkx_op(a, KVL_READ, KVL_MEM_VRAM, lref, rv2, NBLK, BLK);
    tk = time_x(x);
    kvl_xfer_get_stats(x, &st);
    kvl_xfer_release(x);
    CU(cu.MemcpyDtoH(hb, ref, NBLK * BLK));
    uint64_t bad = 0, first_bad = 0;
    for (uint64_t i = 0; i < NBLK; i++) {
        uint64_t sb = perm[(i * 7919) % NBLK];  /* source block written to rv2[i] */
        for (uint64_t w = 0; w < BLK / 8; w++)
            if (hb[i * (BLK / 8) + w] != pat(sb, w)) {
                if (bad++ == 0)
                    first_bad = i;
                break;
            }
    }
    printf("| %-36s | %5.2f | %11.1f | %10s | %6s | %-10s | %8.1f | %s |\n",
           "65536 x 32 KiB scattered READ back", (double)(NBLK * BLK) / GIB,
           (double)(NBLK * BLK) / tk / 1e9, "", "", "(info)", (double)st.post_ns / 1e3, st.path);
    if (bad != 0) {
        fprintf(stderr, "cuda_bench: %llu of %llu scattered blocks wrong after re-posting "
                "(first: block %llu)\n", (unsigned long long)bad, (unsigned long long)NBLK,
                (unsigned long long)first_bad);
        exit(1);
    }
    printf("scattered blocks verified: all %llu blocks of 32 KiB match their source after %d "
           "re-posts of the WRITE and of the READ\n", (unsigned long long)NBLK, WARMUP + iters);
    free(lref);
    free(hb);
    if (peer_dev >= 0) {
        /* across GPUs: rows 1 and 2 only */
        printf("  (plain column: cuMemcpyDtoDAsync from device 0 into device %d, peer access "
               "on%s)\n", peer_dev, peer_dev == 0 ? "; --peer-dev 0 is a dry run on one GPU" : "");
    } else {
        /* 3. VRAM -> remote pinned DRAM 1 GiB */
        la = src;
        ra = rh;
        x = mkx(a, KVL_MEM_DRAM, &la, &ra, 1, GIB);
        tk = time_x(x);
        tr = time_ref(s, 1, 0, pinned, src, GIB);
        kvl_xfer_get_stats(x, &st);
        row("VRAM->pinned DRAM 1 GiB, 2 processes", GIB, tk, tr, 90, (double)st.post_ns / 1e3,
            st.path);
        kvl_xfer_release(x);

        /* 4, 5. VRAM over tcp (loopback) and ucx, staged through pinned host
         * buffers, next to the same bytes host to host on the same backend:
         * what staging costs. */
        reg(a, (uint64_t)(uintptr_t)pinned, GIB, KVL_MEM_DRAM);
        staged_row(a, "tcp", src, rv, (uint64_t)(uintptr_t)pinned, rh);
        staged_row(a, "ucx", src, rv, (uint64_t)(uintptr_t)pinned, rh);
    }

    free(lv);
    free(rv2);
    free(perm);
    snd(fd, "bye", 3);
    kvl_agent_destroy(a);
    exit(0);
}

int main(int argc, char **argv)
{
    int sv[2], st, rc = 0;
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--peer-dev") == 0 && k + 1 < argc)
            peer_dev = atoi(argv[++k]);
        else if (atoi(argv[k]) > 0 && atoi(argv[k]) <= 200)
            iters = atoi(argv[k]);
    }
    if (peer_dev > 0) {
        /* does device N exist? asked in a child: the parent never loads CUDA */
        pid_t c = fork();
        if (c == 0) {
            char why[256];
            if (kt_cuda_open(&cu, why, sizeof(why)) != 0) {
                printf("SKIP: %s\n", why);
                exit(77);
            }
            if (cu.ndev <= peer_dev) {
                printf("SKIP: --peer-dev %d, but this machine shows %d CUDA device(s)\n",
                       peer_dev, cu.ndev);
                exit(77);
            }
            exit(0);
        }
        waitpid(c, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 1;
    /* CUDA is not fork-safe: both roles are children, the parent never loads it. */
    pid_t t = fork();
    if (t == 0) {
        close(sv[1]);
        target(sv[0]);
    }
    pid_t i = fork();
    if (i == 0) {
        close(sv[0]);
        initiator(sv[1]);
    }
    close(sv[0]);
    close(sv[1]);
    for (int k = 0; k < 2; k++) {
        wait(&st);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        if (code != 0 && rc == 0)
            rc = code;
    }
    return rc;
}
