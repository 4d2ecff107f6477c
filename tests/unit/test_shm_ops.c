/*
 * Two-process test of the shm backend, driven only through kvli_shm_ops with
 * a small kvl_bk_ctx_t of its own. Children are forked before any thread
 * exists; each opens a backend, registers memory and serves requests. The
 * children's target buffers are MAP_SHARED, so the parent checks the bytes
 * that landed through its own view of the same pages.
 *
 * Exit 0 pass, 1 fail, 77 skip.
 * KVL_TEST_TIMEOUT: 900 (50 s idle, 83 s under stress --cpu 2 beside builds)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <kvlane/backend.h>
#include <kvlane/notif.h>

extern const kvl_backend_ops_t kvli_shm_ops;

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define TIMEOUT_MS 3000u

static int g_fail;
static const kvl_backend_ops_t *ops = &kvli_shm_ops;

#define CHECK(cond, ...) do { \
    if (!(cond)) { \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__); \
        fprintf(stderr, "\n"); \
        g_fail = 1; \
    } \
} while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)(void *)p;
    size_t i, n = len / 8;
    for (i = 0; i < n; i++)
        w[i] = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
    for (i = n * 8; i < len; i++)
        p[i] = (uint8_t)(seed + i);
}

static int check_fill(const uint8_t *p, size_t len, uint64_t seed)
{
    const uint64_t *w = (const uint64_t *)(const void *)p;
    size_t i, n = len / 8;
    for (i = 0; i < n; i++)
        if (w[i] != seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull)
            return 0;
    for (i = n * 8; i < len; i++)
        if (p[i] != (uint8_t)(seed + i))
            return 0;
    return 1;
}

/* ---- the test's core stand-in ---- */

typedef struct treg {
    uint64_t addr, len;
    void *mh;
} treg_t;

/* Lives in MAP_SHARED memory so the parent sees what a child received. */
typedef struct shared {
    atomic_int notif_count;
    atomic_int notif_bad;
    atomic_int pins;
    char last_notif[128];
} shared_t;

typedef struct tctx {
    kvl_bk_ctx_t bk;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    treg_t regs[8];
    int nregs;
    uint64_t alloc_id;
    int alloc_fd;
    uint64_t alloc_size;
    shared_t *sh;
    atomic_int notifs;
} tctx_t;

typedef struct txfer {
    kvl_bk_xfer_t x;
    tctx_t *t;
    int done;
    kvl_status_t st;
    kvl_error_t err;
} txfer_t;

static void t_log(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void t_log(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    if (level > KVL_LOG_WARN && getenv("TEST_SHM_DEBUG") == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "  %.6f [%s pid %d shm %s] %s\n", now_s(), ctx->agent_name, (int)getpid(),
            level == KVL_LOG_ERROR ? "error" : level == KVL_LOG_WARN ? "warn" : "info",
            buf);
}

static void t_xfer_done(kvl_bk_xfer_t *x, kvl_status_t st, const kvl_error_t *err)
{
    txfer_t *tx = (txfer_t *)x;
    pthread_mutex_lock(&tx->t->lock);
    tx->st = st;
    if (err != NULL)
        tx->err = *err;
    tx->done++;
    pthread_cond_broadcast(&tx->t->cond);
    pthread_mutex_unlock(&tx->t->lock);
}

static void t_notif(kvl_bk_ctx_t *ctx, const char *from, const void *msg, size_t len)
{
    tctx_t *t = (tctx_t *)ctx;
    char buf[128];
    unsigned long long addr, n, seed;
    (void)from;
    atomic_fetch_add(&t->notifs, 1);
    if (t->sh == NULL)
        return;
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    /* The data must be complete when its notification arrives. */
    if (sscanf(buf, "CHECK %llx %llx %llu", &addr, &n, &seed) == 3 &&
        !check_fill((const uint8_t *)(uintptr_t)addr, (size_t)n, seed))
        atomic_fetch_add(&t->sh->notif_bad, 1);
    snprintf(t->sh->last_notif, sizeof(t->sh->last_notif), "%.40s:%.80s", from, buf);
    atomic_fetch_add(&t->sh->notif_count, 1);
}

static kvl_status_t t_pin(kvl_bk_ctx_t *ctx, uint64_t addr, uint64_t len, void **mh_p,
                          void **pin_p, kvl_error_t *err)
{
    tctx_t *t = (tctx_t *)ctx;
    int i;
    pthread_mutex_lock(&t->lock);
    for (i = 0; i < t->nregs; i++) {
        if (addr >= t->regs[i].addr && addr + len >= addr &&
            addr + len <= t->regs[i].addr + t->regs[i].len) {
            *mh_p = t->regs[i].mh;
            *pin_p = &t->regs[i];
            if (t->sh != NULL)
                atomic_fetch_add(&t->sh->pins, 1);
            pthread_mutex_unlock(&t->lock);
            return KVL_OK;
        }
    }
    pthread_mutex_unlock(&t->lock);
    kvl_bk_error_set(err, KVL_ERR_OUT_OF_BOUNDS, 0, "test", -1,
                     "[0x%" PRIx64 ", +%" PRIu64 ") is not registered", addr, len);
    return KVL_ERR_OUT_OF_BOUNDS;
}

static void t_unpin(kvl_bk_ctx_t *ctx, void *pin)
{
    tctx_t *t = (tctx_t *)ctx;
    (void)pin;
    if (t->sh != NULL)
        atomic_fetch_sub(&t->sh->pins, 1);
}

static kvl_status_t t_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p,
                                   uint64_t *size_p)
{
    tctx_t *t = (tctx_t *)ctx;
    if (t->alloc_fd < 0 || id != t->alloc_id)
        return KVL_ERR_NOT_FOUND;
    *fd_p = t->alloc_fd;
    *size_p = t->alloc_size;
    return KVL_OK;
}

static void tctx_init(tctx_t *t, const char *name, uint64_t inc)
{
    pthread_condattr_t ca;
    memset(t, 0, sizeof(*t));
    t->bk.size = sizeof(t->bk);
    t->bk.agent_name = name;
    t->bk.incarnation = inc;
    t->bk.timeout_ms = TIMEOUT_MS;
    t->bk.workers = 1;
    t->bk.log = t_log;
    t->bk.xfer_done = t_xfer_done;
    t->bk.notif_deliver = t_notif;
    t->bk.region_pin = t_pin;
    t->bk.region_unpin = t_unpin;
    t->bk.alloc_lookup = t_alloc_lookup;
    t->alloc_fd = -1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cond, &ca);
    pthread_condattr_destroy(&ca);
}

static void *reg(tctx_t *t, void *bk, void *addr, uint64_t len, int shm_fd, uint64_t id,
                 uint64_t off, uint64_t size)
{
    kvl_region_info_t r;
    kvl_error_t err;
    char detail[128];
    void *mh = NULL;
    kvl_status_t st;
    memset(&r, 0, sizeof(r));
    r.addr = (uint64_t)(uintptr_t)addr;
    r.len = len;
    r.kind = KVL_MEM_DRAM;
    r.dev = -1;
    r.shm_fd = shm_fd;
    r.shm_id = id;
    r.shm_off = off;
    r.shm_size = size;
    st = ops->mem_reg(bk, &r, &mh, detail, sizeof(detail), &err);
    CHECK(st == KVL_OK, "mem_reg: %d %s", st, err.what);
    if (st != KVL_OK)
        return NULL;
    if (t != NULL) {
        pthread_mutex_lock(&t->lock);
        t->regs[t->nregs].addr = r.addr;
        t->regs[t->nregs].len = len;
        t->regs[t->nregs].mh = mh;
        t->nregs++;
        pthread_mutex_unlock(&t->lock);
    }
    return mh;
}

/* ---- children ---- */

/* What a child tells the parent over the control socket. */
typedef struct hello_msg {
    pid_t pid;
    uint64_t inc;
    size_t conn_len;
    uint8_t conn[512];
    uint8_t key0[64], key1[64];
    size_t key0_len, key1_len;
    uint64_t r0_addr, r0_len, r1_addr, r1_len;
} hello_msg_t;

typedef struct child {
    pid_t pid;
    int ctl;
    hello_msg_t h;
    uint8_t *buf0;           /* cma/socket target, MAP_SHARED anonymous */
    size_t buf0_len;          /* mapped; registered: buf0_len - 1 MiB */
    uint8_t *buf1;           /* memfd allocation */
    size_t buf1_len;
    int memfd;
    shared_t *sh;
} child_t;

static int child_main(child_t *c, int ctl, const char *name, uint64_t inc)
{
    tctx_t t;
    void *bk = NULL, *mh0, *mh1;
    kvl_error_t err;
    hello_msg_t h;
    kvl_status_t st;
    char cmd[16];

    tctx_init(&t, name, inc);
    t.sh = c->sh;
    t.alloc_id = 7;
    t.alloc_fd = c->memfd;
    t.alloc_size = c->buf1_len;
    st = ops->open(&t.bk, NULL, 0, &bk, &err);
    if (st != KVL_OK) {
        fprintf(stderr, "child open: %s\n", err.what);
        return 1;
    }
    memset(&h, 0, sizeof(h));
    /* The last MiB of buf0 stays unregistered: the out-of-bounds target. */
    mh0 = reg(&t, bk, c->buf0, c->buf0_len - MiB, -1, 0, 0, 0);
    mh1 = reg(&t, bk, c->buf1, c->buf1_len, c->memfd, 7, 0, c->buf1_len);
    if (mh0 == NULL || mh1 == NULL)
        return 1;
    h.pid = getpid();
    h.inc = inc;
    ops->conn_pack(bk, h.conn, sizeof(h.conn), &h.conn_len);
    ops->region_pack(bk, mh0, h.key0, sizeof(h.key0), &h.key0_len);
    ops->region_pack(bk, mh1, h.key1, sizeof(h.key1), &h.key1_len);
    h.r0_addr = (uint64_t)(uintptr_t)c->buf0;
    h.r0_len = c->buf0_len - MiB;
    h.r1_addr = (uint64_t)(uintptr_t)c->buf1;
    h.r1_len = c->buf1_len;
    if (write(ctl, &h, sizeof(h)) != (ssize_t)sizeof(h))
        return 1;
    /* Serve until the parent says EXIT or goes away. */
    while (read(ctl, cmd, sizeof(cmd)) > 0)
        if (strncmp(cmd, "EXIT", 4) == 0)
            break;
    ops->mem_dereg(bk, mh0);
    ops->mem_dereg(bk, mh1);
    ops->close(bk);
    return 0;
}

static int child_spawn(child_t *c, size_t len0, size_t len1, const char *name, uint64_t inc)
{
    int sv[2];
    memset(c, 0, sizeof(*c));
    c->buf0_len = len0;
    c->buf1_len = len1;
    c->buf0 = mmap(NULL, len0, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    c->sh = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    c->memfd = memfd_create("test-shm-alloc", MFD_CLOEXEC);
    if (c->buf0 == MAP_FAILED || c->sh == MAP_FAILED || c->memfd < 0 ||
        ftruncate(c->memfd, (off_t)len1) != 0)
        return -1;
    c->buf1 = mmap(NULL, len1, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd, 0);
    if (c->buf1 == MAP_FAILED)
        return -1;
    memset(c->sh, 0, sizeof(*c->sh));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    c->pid = fork();
    if (c->pid < 0)
        return -1;
    if (c->pid == 0) {
        close(sv[0]);
        _exit(child_main(c, sv[1], name, inc));
    }
    close(sv[1]);
    c->ctl = sv[0];
    return 0;
}

static int child_hello(child_t *c)
{
    size_t got = 0;
    while (got < sizeof(c->h)) {
        ssize_t n = read(c->ctl, (uint8_t *)&c->h + got, sizeof(c->h) - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

static int child_finish(child_t *c)
{
    int status = 0;
    ssize_t n = send(c->ctl, "EXIT", 5, MSG_NOSIGNAL);
    (void)n;
    close(c->ctl);
    waitpid(c->pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- parent side helpers ---- */

typedef struct side {
    tctx_t t;
    void *bk;
    void *peer;
    void *rh0, *rh1, *rh0_big;
} side_t;

static int side_open(side_t *s, const char *name, uint64_t inc, const char *cma)
{
    kvl_param_t p[2] = { { "cma", cma }, { NULL, NULL } };
    kvl_error_t err;
    kvl_status_t st;
    tctx_init(&s->t, name, inc);
    st = ops->open(&s->t.bk, p, 1, &s->bk, &err);
    CHECK(st == KVL_OK, "open(cma=%s): %s", cma, err.what);
    return st == KVL_OK ? 0 : -1;
}

static void *rload(side_t *s, const child_t *c, uint64_t addr, uint64_t len,
                   const uint8_t *key, size_t klen, kvl_status_t want)
{
    kvl_region_info_t r;
    kvl_error_t err;
    void *rh = NULL;
    kvl_status_t st;
    memset(&r, 0, sizeof(r));
    r.addr = addr;
    r.len = len;
    r.kind = KVL_MEM_DRAM;
    r.dev = -1;
    r.shm_fd = -1;
    (void)c;
    st = ops->rregion_load(s->bk, s->peer, &r, key, klen, &rh, &err);
    CHECK(st == want, "rregion_load = %d (want %d): %s", st, want, err.what);
    return st == KVL_OK ? rh : NULL;
}

static int side_load(side_t *s, child_t *c, const char *child_name)
{
    kvl_error_t err;
    kvl_status_t st;
    char desc[512];
    st = ops->peer_load(s->bk, child_name, c->h.inc, c->h.conn, c->h.conn_len, &s->peer,
                        &err);
    CHECK(st == KVL_OK, "peer_load: %s / %s", err.what, err.hint);
    if (st != KVL_OK)
        return -1;
    s->rh0 = rload(s, c, c->h.r0_addr, c->h.r0_len, c->h.key0, c->h.key0_len, KVL_OK);
    s->rh1 = rload(s, c, c->h.r1_addr, c->h.r1_len, c->h.key1, c->h.key1_len, KVL_OK);
    /* Claims the unregistered last MiB too: the target must refuse it. */
    s->rh0_big = rload(s, c, c->h.r0_addr, c->h.r0_len + MiB, c->h.key0, c->h.key0_len,
                       KVL_OK);
    ops->peer_describe(s->bk, s->peer, desc, sizeof(desc));
    printf("  %s -> %s: %s\n", s->t.bk.agent_name, child_name, desc);
    return s->rh0 && s->rh1 && s->rh0_big ? 0 : -1;
}

static void side_close(side_t *s)
{
    if (s->peer != NULL) {
        if (s->rh0)
            ops->rregion_unload(s->bk, s->peer, s->rh0);
        if (s->rh1)
            ops->rregion_unload(s->bk, s->peer, s->rh1);
        if (s->rh0_big)
            ops->rregion_unload(s->bk, s->peer, s->rh0_big);
        ops->peer_unload(s->bk, s->peer);
    }
    if (s->bk != NULL)
        ops->close(s->bk);
}

static void xfer_init(txfer_t *tx, side_t *s, kvl_xfer_op_t op, const kvl_seg_t *segs,
                      size_t nsegs, void *const *lmh, void *const *rmh)
{
    size_t i;
    memset(tx, 0, sizeof(*tx));
    tx->t = &s->t;
    tx->x.op = op;
    tx->x.peer = s->peer;
    tx->x.segs = segs;
    tx->x.nsegs = nsegs;
    for (i = 0; i < nsegs; i++)
        tx->x.total_bytes += segs[i].len * segs[i].count;
    tx->x.lmh = lmh;
    tx->x.rmh = rmh;
    tx->x.timeout_ms = TIMEOUT_MS;
}

static kvl_status_t xfer_wait(txfer_t *tx, unsigned ms)
{
    struct timespec dl;
    kvl_status_t st;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&tx->t->lock);
    while (tx->done == 0)
        if (pthread_cond_timedwait(&tx->t->cond, &tx->t->lock, &dl) == ETIMEDOUT)
            break;
    st = tx->done ? tx->st : KVL_ERR_TIMEOUT;
    pthread_mutex_unlock(&tx->t->lock);
    return st;
}

/* Post, wait; returns the status and the seconds it took. */
static kvl_status_t run_xfer(txfer_t *tx, side_t *s, double *secs)
{
    kvl_error_t err;
    double t0 = now_s();
    kvl_status_t st = ops->xfer_post(s->bk, &tx->x, &err);
    if (st != KVL_OK) {
        tx->err = err;
        return st;
    }
    st = xfer_wait(tx, 60000);
    if (secs != NULL)
        *secs = now_s() - t0;
    CHECK(tx->done == 1, "xfer_done called %d times", tx->done);
    return st;
}

static void seg_blocks(kvl_seg_t *sg, uint64_t la, uint64_t ra, uint64_t len, uint64_t count,
                       uint64_t ls, uint64_t rs)
{
    memset(sg, 0, sizeof(*sg));
    sg->laddr = la;
    sg->raddr = ra;
    sg->len = len;
    sg->count = count;
    sg->lstride = ls;
    sg->rstride = rs;
}

static int wait_notifs(shared_t *sh, int want, unsigned ms)
{
    double end = now_s() + ms / 1000.0;
    while (atomic_load(&sh->notif_count) < want && now_s() < end)
        usleep(1000);
    return atomic_load(&sh->notif_count) >= want;
}

/* ---- tests ---- */

static uint8_t *L;            /* parent local buffer, 1 GiB */
static void *Lmh_auto, *Lmh_off;

/* Contiguous WRITE then READ of len bytes in 4 MiB blocks through one remote
 * region; remote view is the parent's mapping of the same pages. */
static void t_write_read(side_t *s, void *lmh, void *rh, uint8_t *rview, uint64_t raddr,
                         uint64_t len, const char *want_path, const char *label,
                         double *wsecs)
{
    kvl_seg_t sg;
    txfer_t tx;
    void *lm[1] = { lmh }, *rm[1] = { rh };
    kvl_status_t st;
    double secs;
    uint64_t blk = len >= 4 * MiB ? 4 * MiB : len;

    fill(L, len, 11);
    memset(rview, 0, len);
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, raddr, blk, len / blk, blk, blk);
    xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, &secs);
    CHECK(st == KVL_OK, "%s WRITE: %d %s", label, st, tx.err.what);
    CHECK(strcmp(tx.x.path, want_path) == 0, "%s WRITE path '%s', want '%s'", label,
          tx.x.path, want_path);
    CHECK(memcmp(L, rview, len) == 0, "%s WRITE: target bytes differ", label);
    printf("  %-7s WRITE %5" PRIu64 " MiB in 4 MiB blocks: %6.2f GB/s (path %s)\n", label,
           len / MiB, (double)len / secs / 1e9, tx.x.path);
    if (wsecs != NULL)
        *wsecs = secs;

    fill(rview, len, 12);
    memset(L, 0, len);
    xfer_init(&tx, s, KVL_READ, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, &secs);
    CHECK(st == KVL_OK, "%s READ: %d %s", label, st, tx.err.what);
    CHECK(strcmp(tx.x.path, want_path) == 0, "%s READ path '%s'", label, tx.x.path);
    CHECK(check_fill(L, len, 12), "%s READ: local bytes differ", label);
    printf("  %-7s READ  %5" PRIu64 " MiB in 4 MiB blocks: %6.2f GB/s\n", label,
           len / MiB, (double)len / secs / 1e9);
}

/* 1 GiB as 65536 scattered 16 KiB blocks: one segment per block, remote order
 * permuted, so batching has to span segments. */
static kvl_seg_t *scatter_segs(uint64_t lbase, uint64_t rbase, uint64_t len, size_t *n_p)
{
    size_t n = len / (16 * 1024), i;
    kvl_seg_t *sg = calloc(n, sizeof(*sg));
    uint64_t *perm = malloc(n * sizeof(*perm));
    uint64_t x = 88172645463325252ull;
    for (i = 0; i < n; i++)
        perm[i] = i;
    for (i = n - 1; i > 0; i--) {
        uint64_t j, tmp;
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        j = x % (i + 1);
        tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
    }
    for (i = 0; i < n; i++)
        seg_blocks(&sg[i], lbase + i * 16384, rbase + perm[i] * 16384, 16384, 1, 0, 0);
    free(perm);
    *n_p = n;
    return sg;
}

static void t_scatter(side_t *s, void *lmh, void *rh, uint8_t *rview, uint64_t raddr,
                      uint64_t len, const char *label, double *secs_p)
{
    size_t n, i;
    kvl_seg_t *sg = scatter_segs((uint64_t)(uintptr_t)L, raddr, len, &n);
    void *lm[1] = { lmh }, *rm[1] = { rh };
    txfer_t tx;
    kvl_status_t st;
    double secs;
    int ok = 1;
    fill(L, len, 21);
    xfer_init(&tx, s, KVL_WRITE, sg, n, lm, rm);
    st = run_xfer(&tx, s, &secs);
    CHECK(st == KVL_OK, "%s scattered WRITE: %d %s", label, st, tx.err.what);
    for (i = 0; i < n && ok; i++)
        ok = memcmp(L + i * 16384, rview + (sg[i].raddr - raddr), 16384) == 0;
    CHECK(ok, "%s scattered WRITE: block %zu differs", label, i - 1);
    printf("  %-7s WRITE %5" PRIu64 " MiB as %zu scattered 16 KiB blocks: %6.2f GB/s\n",
           label, len / MiB, n, (double)len / secs / 1e9);
    if (secs_p != NULL)
        *secs_p = secs;
    free(sg);
}

/* 100 blocks of 1000 bytes, strides 3000 (local) / 5000 (remote); the gaps
 * between remote blocks must stay untouched. */
static void t_strided(side_t *s, void *lmh, void *rh, uint8_t *rview, uint64_t raddr,
                      const char *label)
{
    kvl_seg_t sg[2];
    void *lm[1] = { lmh }, *rm[1] = { rh };
    txfer_t tx;
    kvl_status_t st;
    size_t j;
    int ok = 1;
    fill(L, 400000, 31);
    memset(rview, 0xAB, 600000);
    seg_blocks(&sg[0], (uint64_t)(uintptr_t)L, raddr, 1000, 100, 3000, 5000);
    /* A second segment, zero local stride: one block repeated. */
    seg_blocks(&sg[1], (uint64_t)(uintptr_t)L + 350000, raddr + 550000, 24, 4, 0, 100);
    xfer_init(&tx, s, KVL_WRITE, sg, 2, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_OK, "%s strided WRITE: %d %s", label, st, tx.err.what);
    for (j = 0; j < 100 && ok; j++) {
        size_t k;
        ok = memcmp(L + j * 3000, rview + j * 5000, 1000) == 0;
        for (k = 1000; k < 5000 && ok && j < 99; k++)
            ok = rview[j * 5000 + k] == 0xAB;
    }
    for (j = 0; j < 4 && ok; j++)
        ok = memcmp(L + 350000, rview + 550000 + j * 100, 24) == 0 &&
             rview[550000 + j * 100 + 24] == 0xAB;
    CHECK(ok, "%s strided WRITE: wrong bytes near block %zu", label, j);

    memset(L, 0, 400000);
    xfer_init(&tx, s, KVL_READ, sg, 1, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_OK, "%s strided READ: %d %s", label, st, tx.err.what);
    for (j = 0, ok = 1; j < 100 && ok; j++)
        ok = memcmp(L + j * 3000, rview + j * 5000, 1000) == 0 &&
             (j == 99 || L[j * 3000 + 1000] == 0);
    CHECK(ok, "%s strided READ: wrong bytes near block %zu", label, j);
}

/* Many tiny blocks: a full 1024-range request (and its reply) per chunk. */
static void t_small_blocks(side_t *s, void *lmh, void *rh, uint8_t *rview, uint64_t raddr,
                           const char *label)
{
    kvl_seg_t sg;
    void *lm[1] = { lmh }, *rm[1] = { rh };
    txfer_t tx;
    kvl_status_t st;
    size_t j;
    int ok = 1;
    fill(rview, 8 * MiB, 71);
    memset(L, 0, 4 * MiB);
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, raddr, 512, 4096, 512, 2048);
    xfer_init(&tx, s, KVL_READ, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_OK, "%s small-block READ: %d %s", label, st, tx.err.what);
    for (j = 0; j < 4096 && ok; j++)
        ok = memcmp(L + j * 512, rview + j * 2048, 512) == 0;
    CHECK(ok, "%s small-block READ: block %zu differs", label, j - 1);
    fill(L, 4 * MiB, 72);
    xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_OK, "%s small-block WRITE: %d %s", label, st, tx.err.what);
    for (j = 0, ok = 1; j < 4096 && ok; j++)
        ok = memcmp(L + j * 512, rview + j * 2048, 512) == 0;
    CHECK(ok, "%s small-block WRITE: block %zu differs", label, j - 1);
}

static void t_notif_after_data(side_t *s, child_t *c, void *lmh, void *rh, uint64_t raddr,
                    const char *label)
{
    kvl_seg_t sg;
    void *lm[1] = { lmh }, *rm[1] = { rh };
    txfer_t tx;
    char msg[128];
    kvl_status_t st;
    int before = atomic_load(&c->sh->notif_count);
    uint64_t len = 64 * MiB;
    fill(L, len, 41);
    snprintf(msg, sizeof(msg), "CHECK %" PRIx64 " %" PRIx64 " 41", raddr, len);
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, raddr, MiB, len / MiB, MiB, MiB);
    xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
    tx.x.notif = msg;
    tx.x.notif_len = strlen(msg);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_OK, "%s notif WRITE: %d %s", label, st, tx.err.what);
    CHECK(wait_notifs(c->sh, before + 1, 3000), "%s: notification did not arrive", label);
    CHECK(atomic_load(&c->sh->notif_bad) == 0,
          "%s: notification arrived before the data was complete", label);
}

static void t_oob(side_t *s, child_t *c)
{
    kvl_seg_t sg;
    void *lm[1] = { Lmh_off }, *rm[1] = { s->rh0_big };
    uint8_t *tail = c->buf0 + c->buf0_len - MiB;
    txfer_t tx;
    kvl_status_t st;
    size_t i;
    int ok = 1;
    memset(tail, 0x5A, MiB);
    fill(L, 256 * 1024, 51);
    /* Straddles the end of the registered range. */
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, c->h.r0_addr + c->h.r0_len - 64 * 1024,
               256 * 1024, 1, 0, 0);
    memset(tail - 64 * 1024, 0x5A, 64 * 1024);
    xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_ERR_REMOTE_REFUSED, "out-of-bounds WRITE: %d %s", st, tx.err.what);
    printf("  refused as expected: %s\n", tx.err.what);
    for (i = 0; i < MiB + 64 * 1024 && ok; i++)
        ok = (tail - 64 * 1024)[i] == 0x5A;
    CHECK(ok, "out-of-bounds WRITE changed target byte %zu", i - 1);
    xfer_init(&tx, s, KVL_READ, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_ERR_REMOTE_REFUSED, "out-of-bounds READ: %d %s", st, tx.err.what);
    /* The connection still works afterwards. */
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, c->h.r0_addr, 4096, 1, 0, 0);
    xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
    st = run_xfer(&tx, s, NULL);
    CHECK(st == KVL_OK, "WRITE after a refusal: %d %s", st, tx.err.what);
    CHECK(atomic_load(&c->sh->pins) == 0, "%d pins left on the target",
          atomic_load(&c->sh->pins));
}

static uint64_t hash_buf(const uint8_t *p, size_t len)
{
    const uint64_t *w = (const uint64_t *)(const void *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < len / 8; i++)
        h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

static void t_cancel(side_t *s, child_t *c, void *lmh, void *rh, uint8_t *rview,
                     uint64_t raddr, uint64_t len, const char *label)
{
    kvl_seg_t sg;
    void *lm[1] = { lmh }, *rm[1] = { rh };
    txfer_t tx, tx2;
    kvl_error_t err;
    kvl_status_t st;
    char msg[] = "cancel-notif";
    int before = atomic_load(&c->sh->notif_count);
    uint64_t h1, h2;
    double t0;

    fill(L, len, 61);
    memset(rview, 0, len);
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, raddr, 4 * MiB, len / (4 * MiB), 4 * MiB,
               4 * MiB);
    xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
    tx.x.notif = msg;
    tx.x.notif_len = sizeof(msg) - 1;
    xfer_init(&tx2, s, KVL_WRITE, &sg, 1, lm, rm);
    if (getenv("TEST_SHM_DEBUG"))
        fprintf(stderr, "  %.6f posting\n", now_s());
    st = ops->xfer_post(s->bk, &tx.x, &err);
    CHECK(st == KVL_OK, "post: %s", err.what);
    st = ops->xfer_post(s->bk, &tx2.x, &err);
    CHECK(st == KVL_OK, "post 2: %s", err.what);
    /* The second one is still queued behind the first (one worker). */
    ops->xfer_cancel(s->bk, &tx2.x);
    CHECK(tx2.done == 1 && tx2.st == KVL_ERR_CANCELED, "%s: queued transfer: done %d st %d",
          label, tx2.done, tx2.st);
    /* Cancel mid-transfer: wait until the first bytes landed. */
    for (t0 = now_s(); *(volatile uint64_t *)(void *)rview == 0 && now_s() < t0 + 2;)
        usleep(100);
    if (getenv("TEST_SHM_DEBUG"))
        fprintf(stderr, "  %.6f cancelling\n", now_s());
    t0 = now_s();
    ops->xfer_cancel(s->bk, &tx.x);
    t0 = now_s() - t0;
    CHECK(tx.done == 1, "%s: cancel returned before xfer_done (%d)", label, tx.done);
    CHECK(tx.st == KVL_ERR_CANCELED || tx.st == KVL_OK, "%s: cancel status %d %s", label,
          tx.st, tx.err.what);
    h1 = hash_buf(rview, len);
    usleep(200000);
    h2 = hash_buf(rview, len);
    CHECK(h1 == h2, "%s: bytes landed after cancel returned", label);
    if (tx.st == KVL_ERR_CANCELED) {
        CHECK(atomic_load(&c->sh->notif_count) == before,
              "%s: notification of a cancelled transfer arrived", label);
        printf("  %-7s cancel: CANCELED, xfer_cancel took %.1f ms (%s)\n", label,
               t0 * 1e3, tx.err.what);
    } else {
        CHECK(wait_notifs(c->sh, before + 1, 3000),
              "%s: completed transfer's notification missing", label);
        printf("  %-7s cancel: completed first (DONE)\n", label);
    }
}

static void t_kill(side_t *s, child_t *c, void *lmh, void *rh, uint64_t raddr,
                   uint64_t len, const char *label)
{
    kvl_seg_t sg;
    void *lm[1] = { lmh }, *rm[1] = { rh };
    txfer_t tx;
    kvl_error_t err;
    kvl_status_t st = KVL_OK;
    double t0 = 0, waited = 0;
    int round;
    seg_blocks(&sg, (uint64_t)(uintptr_t)L, raddr, 4 * MiB, len / (4 * MiB), 4 * MiB,
               4 * MiB);
    for (round = 0; round < 20 && st == KVL_OK; round++) {
        xfer_init(&tx, s, KVL_WRITE, &sg, 1, lm, rm);
        st = ops->xfer_post(s->bk, &tx.x, &err);
        if (st != KVL_OK) {
            tx.err = err;
            break;
        }
        if (round == 0) {
            usleep(3000);
            kill(c->pid, SIGKILL);
        }
        t0 = now_s();
        st = xfer_wait(&tx, TIMEOUT_MS * 3);
        waited = now_s() - t0;
        if (st == KVL_ERR_TIMEOUT && tx.done == 0) {
            CHECK(0, "%s: no completion within %u ms after the peer was killed", label,
                  TIMEOUT_MS * 3);
            ops->xfer_cancel(s->bk, &tx.x);
            return;
        }
    }
    CHECK(st == KVL_ERR_REMOTE_DISCONNECT, "%s kill: status %d %s", label, st, tx.err.what);
    CHECK(waited * 1000 <= TIMEOUT_MS + 500, "%s kill: took %.0f ms", label, waited * 1e3);
    CHECK(strstr(tx.err.what, "child") != NULL, "%s kill: message lacks the peer name: %s",
          label, tx.err.what);
    printf("  %-7s peer killed: %s in %.0f ms (round %d): %s\n", label,
           st == KVL_ERR_REMOTE_DISCONNECT ? "REMOTE_DISCONNECT" : "?", waited * 1e3,
           round, tx.err.what);
}

static void t_bad_meta(side_t *s, child_t *c)
{
    uint8_t blob[512];
    kvl_error_t err;
    void *p = NULL;
    kvl_status_t st;
    memcpy(blob, c->h.conn, c->h.conn_len);
    st = ops->peer_load(s->bk, "x", c->h.inc, blob, c->h.conn_len - 1, &p, &err);
    CHECK(st == KVL_ERR_BAD_METADATA, "truncated conn: %d", st);
    printf("  truncated conn info: %s\n", err.what);
    blob[0] ^= 1;
    st = ops->peer_load(s->bk, "x", c->h.inc, blob, c->h.conn_len, &p, &err);
    CHECK(st == KVL_ERR_BAD_METADATA, "bad magic: %d", st);
    blob[0] ^= 1;
    st = ops->peer_load(s->bk, "x", c->h.inc + 1, blob, c->h.conn_len, &p, &err);
    CHECK(st == KVL_ERR_BAD_METADATA, "wrong incarnation: %d", st);
    blob[48] = blob[48] == 'a' ? 'b' : 'a';
    st = ops->peer_load(s->bk, "x", c->h.inc, blob, c->h.conn_len, &p, &err);
    CHECK(st == KVL_ERR_UNSUPPORTED, "other host: %d", st);
    printf("  other host: %s | %s\n", err.what, err.hint);
}

/* Raw baseline: process_vm_writev on the same iovecs, 1024 per call. */
static double raw_cma(pid_t pid, const kvl_seg_t *sg, size_t n)
{
    struct iovec *l = malloc(1024 * sizeof(*l)), *r = malloc(1024 * sizeof(*r));
    double t0 = now_s();
    size_t i = 0;
    while (i < n) {
        size_t k = 0;
        for (; k < 1024 && i < n; k++, i++) {
            l[k].iov_base = (void *)(uintptr_t)sg[i].laddr;
            r[k].iov_base = (void *)(uintptr_t)sg[i].raddr;
            l[k].iov_len = r[k].iov_len = sg[i].len;
        }
        if (process_vm_writev(pid, l, k, r, k, 0) < 0)
            perror("process_vm_writev");
    }
    t0 = now_s() - t0;
    free(l);
    free(r);
    return t0;
}

/*
 * WRITE of len bytes as blocks of blk (one segment per block, remote order
 * permuted when scattered), alternated with the raw call on the same
 * iovecs (memcpy into our view of the memfd, or process_vm_writev when pid
 * is set); best of 5 each, since this machine's noise is large.
 */
static void bench(side_t *s, void *lmh, void *rh, pid_t pid, uint8_t *rview, uint64_t raddr,
                  uint64_t len, uint64_t blk, int scattered)
{
    void *lm[1] = { lmh }, *rm[1] = { rh };
    double best_b = 1e9, best_r = 1e9, secs;
    size_t n, i;
    kvl_seg_t *sg;
    txfer_t tx;
    char path[64] = "";
    int k;
    if (scattered) {
        sg = scatter_segs((uint64_t)(uintptr_t)L, raddr, len, &n);
    } else {
        n = len / blk;
        sg = calloc(n, sizeof(*sg));
        for (i = 0; i < n; i++)
            seg_blocks(&sg[i], (uint64_t)(uintptr_t)L + i * blk, raddr + i * blk, blk, 1, 0, 0);
    }
    for (k = 0; k < 5; k++) {
        double t0;
        xfer_init(&tx, s, KVL_WRITE, sg, n, lm, rm);
        CHECK(run_xfer(&tx, s, &secs) == KVL_OK, "bench: %s", tx.err.what);
        snprintf(path, sizeof(path), "%s", tx.x.path);
        if (secs < best_b)
            best_b = secs;
        t0 = now_s();
        if (pid > 0)
            raw_cma(pid, sg, n);
        else
            for (i = 0; i < n; i++)
                memcpy(rview + (sg[i].raddr - raddr), (void *)(uintptr_t)sg[i].laddr,
                       (size_t)sg[i].len);
        secs = now_s() - t0;
        if (secs < best_r)
            best_r = secs;
    }
    free(sg);
    printf("  bench %-6s WRITE %" PRIu64 " MiB as %zu %s %" PRIu64 " KiB blocks: "
           "backend %.2f GB/s, raw %s %.2f GB/s (best of 5): %.0f%%\n", path, len / MiB, n,
           scattered ? "scattered" : "contiguous", blk / 1024, (double)len / best_b / 1e9,
           pid > 0 ? "process_vm_writev" : "memcpy", (double)len / best_r / 1e9,
           100.0 * best_r / best_b);
}

int main(void)
{
    child_t ca, cb, cc;
    side_t pa, po;
    side_t kb, kc;
    uint64_t len = GiB;
    char reason[256];
    int rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (ops->available(reason, sizeof(reason)) != KVL_OK) {
        printf("SKIP: shm backend not available: %s\n", reason);
        return 77;
    }
    if (getenv("TEST_SHM_SMALL") != NULL)
        len = 256 * MiB;
    memset(&pa, 0, sizeof(pa));
    memset(&po, 0, sizeof(po));
    memset(&kb, 0, sizeof(kb));
    memset(&kc, 0, sizeof(kc));
    /* Fork every child before any thread exists. */
    if (child_spawn(&ca, len + 2 * MiB, len, "childA", 0xA000000000000001ull) != 0 ||
        child_spawn(&cb, 256 * MiB, 64 * MiB, "childB", 0xB000000000000002ull) != 0 ||
        child_spawn(&cc, 1 * GiB, 64 * MiB, "childC", 0xC000000000000003ull) != 0) {
        printf("SKIP: cannot set up children (memory?): %s\n", strerror(errno));
        return 77;
    }
    L = mmap(NULL, len + 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    if (L == MAP_FAILED || child_hello(&ca) || child_hello(&cb) || child_hello(&cc)) {
        printf("FAIL: children did not start\n");
        return 1;
    }
    memset(L, 0, len + 2 * MiB);

    if (side_open(&pa, "parent", 0x1111, "auto") || side_open(&po, "parent-sock", 0x2222, "off"))
        return 1;
    Lmh_auto = reg(NULL, pa.bk, L, len + 2 * MiB, -1, 0, 0, 0);
    Lmh_off = reg(NULL, po.bk, L, len + 2 * MiB, -1, 0, 0, 0);
    if (side_load(&pa, &ca, "childA") || side_load(&po, &ca, "childA"))
        return 1;

    printf("metadata validation\n");
    t_bad_meta(&pa, &ca);

    printf("mmap path (memfd)\n");
    t_write_read(&pa, Lmh_auto, pa.rh1, ca.buf1, ca.h.r1_addr, len, "mmap", "mmap", NULL);
    t_scatter(&pa, Lmh_auto, pa.rh1, ca.buf1, ca.h.r1_addr, len, "mmap", NULL);
    bench(&pa, Lmh_auto, pa.rh1, 0, ca.buf1, ca.h.r1_addr, len, 4 * MiB, 0);
    bench(&pa, Lmh_auto, pa.rh1, 0, ca.buf1, ca.h.r1_addr, len, 16 * 1024, 1);
    t_strided(&pa, Lmh_auto, pa.rh1, ca.buf1, ca.h.r1_addr, "mmap");
    t_notif_after_data(&pa, &ca, Lmh_auto, pa.rh1, ca.h.r1_addr, "mmap");

    printf("cma path\n");
    t_write_read(&pa, Lmh_auto, pa.rh0, ca.buf0, ca.h.r0_addr, len, "cma", "cma", NULL);
    t_scatter(&pa, Lmh_auto, pa.rh0, ca.buf0, ca.h.r0_addr, len, "cma", NULL);
    bench(&pa, Lmh_auto, pa.rh0, ca.pid, ca.buf0, ca.h.r0_addr, len, 4 * MiB, 0);
    bench(&pa, Lmh_auto, pa.rh0, ca.pid, ca.buf0, ca.h.r0_addr, len, 16 * 1024, 1);
    t_strided(&pa, Lmh_auto, pa.rh0, ca.buf0, ca.h.r0_addr, "cma");
    t_notif_after_data(&pa, &ca, Lmh_auto, pa.rh0, ca.h.r0_addr, "cma");

    printf("socket path (cma=off)\n");
    t_write_read(&po, Lmh_off, po.rh0, ca.buf0, ca.h.r0_addr, len, "socket", "socket", NULL);
    t_scatter(&po, Lmh_off, po.rh0, ca.buf0, ca.h.r0_addr, len / 4, "socket", NULL);
    t_strided(&po, Lmh_off, po.rh0, ca.buf0, ca.h.r0_addr, "socket");
    t_small_blocks(&po, Lmh_off, po.rh0, ca.buf0, ca.h.r0_addr, "socket");
    t_small_blocks(&pa, Lmh_auto, pa.rh0, ca.buf0, ca.h.r0_addr, "cma");
    t_notif_after_data(&po, &ca, Lmh_off, po.rh0, ca.h.r0_addr, "socket");
    t_oob(&po, &ca);

    printf("cancel\n");
    t_cancel(&po, &ca, Lmh_off, po.rh0, ca.buf0, ca.h.r0_addr, len, "socket");
    t_cancel(&pa, &ca, Lmh_auto, pa.rh0, ca.buf0, ca.h.r0_addr, len, "cma");
    t_cancel(&pa, &ca, Lmh_auto, pa.rh1, ca.buf1, ca.h.r1_addr, len, "mmap");

    printf("peer killed mid-transfer\n");
    if (side_open(&kb, "parent-kb", 0x3333, "off") == 0 && side_load(&kb, &cb, "childB") == 0) {
        void *lmh = reg(NULL, kb.bk, L, len + 2 * MiB, -1, 0, 0, 0);
        t_kill(&kb, &cb, lmh, kb.rh0, cb.h.r0_addr, 128 * MiB, "socket");
        ops->mem_dereg(kb.bk, lmh);
        side_close(&kb);
    }
    if (side_open(&kc, "parent-kc", 0x4444, "auto") == 0 && side_load(&kc, &cc, "childC") == 0) {
        void *lmh = reg(NULL, kc.bk, L, len + 2 * MiB, -1, 0, 0, 0);
        t_kill(&kc, &cc, lmh, kc.rh0, cc.h.r0_addr, len - 4 * MiB, "cma");
        ops->mem_dereg(kc.bk, lmh);
        side_close(&kc);
    }

    ops->mem_dereg(pa.bk, Lmh_auto);
    ops->mem_dereg(po.bk, Lmh_off);
    side_close(&pa);
    side_close(&po);
    rc = child_finish(&ca);
    CHECK(rc == 0, "child A exit %d", rc);
    child_finish(&cb);
    child_finish(&cc);
    printf("%s\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
