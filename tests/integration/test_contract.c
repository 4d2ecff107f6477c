/*
 * The transfer contract: what every backend promises when it moves bytes,
 * written once and run on every path (a backend and one of its data paths)
 * between this process and a target agent in another process.
 *
 *   kc_paths[]      shm over cross-memory attach, over the target's mapped
 *                   memfd and over its socket; tcp; ucx on its default
 *                   transports, on tcp, and through active messages
 *                   (data_path=am) on both; cuda between host buffers.
 *                   A new backend gets the whole contract with one row.
 *   kc_scenarios[]  WRITE, READ, odd sizes, strided and scattered lists,
 *                   many descriptors, many transfers in flight, notifications
 *                   (with a transfer and alone, both ways), re-posting,
 *                   polling, a stopped target, cancel, release, prepared
 *                   lists and index arrays, blocks of two registrations
 *                   that touch, wrong input.
 *
 * Each (path, scenario) runs in its own process (this program again, with
 * --case PATH SCENARIO) with a fresh initiator and a fresh target, so a
 * failing case neither stops nor disturbs the others. One line per case,
 * then a matrix and a summary; exit 0 when nothing failed, 77 when nothing
 * could run. A path whose module or hardware is missing (ucx, cuda) is
 * skipped with the reason.
 *
 * Every byte is checked: the test keeps what the target's buffer and its
 * own must hold, applies each transfer's block pairs to those models and
 * compares whole buffers afterwards, gaps and neighbours included.
 * Nothing is timed: waits are bounded, generously, only so that a hang
 * becomes a failure.
 *
 * usage: test_contract [PATH|SCENARIO]...   (a subset; default all)
 *        test_contract --case PATH SCENARIO (one case, in this process)
 * KVL_TEST_LABELS: tcp ucx
 * KVL_TEST_TIMEOUT: 1200 (153 cases: about 55 s idle, over 300 s under stress --cpu 2 beside builds)
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define KC_BUF (8u << 20)       /* each side's registered buffer */
#define KC_MIB (1u << 20)
#define KC_WAIT_MS 60000        /* bound on any wait for the target */
#define KC_CASE_S 240           /* bound on one case, then it is killed */

/* ---- paths ---- */

enum {
    /* the initiator cannot finish a transfer while the target is stopped */
    KC_NEEDS_PEER = 1u << 0,
    /* a cancelled transfer's notification reaches the target as
     * "kvlane:canceled:<notification>" (tcp); without it, nothing arrives */
    KC_CANCEL_NOTICE = 1u << 1,
    /* a module or hardware: skipped when it cannot start here */
    KC_OPTIONAL = 1u << 2
};

typedef struct kc_path {
    const char *name;
    const char *backend;
    const char *params;          /* the initiator's backend parameters */
    const char *peer_params;     /* the target's */
    int peer_shareable;          /* target buffer from kvl_mem_alloc (memfd) */
    const char *write_path;      /* kvl_xfer_stats_t.path of a WRITE contains it */
    const char *read_path;       /* ... of a READ */
    unsigned flags;
} kc_path_t;

static const kc_path_t kc_paths[] = {
    {"shm/cma", "shm", NULL, NULL, 0, "cma", "cma", 0},
    {"shm/mmap", "shm", NULL, NULL, 1, "mmap", "mmap", 0},
    {"shm/socket", "shm", "cma=off", NULL, 0, "socket", "socket", KC_NEEDS_PEER},
    {"tcp", "tcp", "host=127.0.0.1", "host=127.0.0.1", 0, "socket", "socket",
     KC_NEEDS_PEER | KC_CANCEL_NOTICE},
    {"ucx/default", "ucx", NULL, NULL, 0, "ucp put over", "ucp get over", KC_OPTIONAL},
    {"ucx/tcp", "ucx", "tls=tcp", "tls=tcp", 0, "ucp put over tcp", "ucp get over tcp",
     KC_OPTIONAL},
    {"ucx/am", "ucx", "data_path=am", "data_path=am", 0, "ucp am via host bounce",
     "ucp am via host bounce", KC_OPTIONAL | KC_NEEDS_PEER},
    {"ucx/tcp-am", "ucx", "tls=tcp,data_path=am", "tls=tcp,data_path=am", 0,
     "ucp am via host bounce", "ucp am via host bounce", KC_OPTIONAL | KC_NEEDS_PEER},
    /* host memory both sides: the target's from kvl_mem_alloc, which the
     * initiator maps and pins (the cuda backend's only host-to-host path) */
    {"cuda/host", "cuda", NULL, NULL, 1, "cuda copy (host)", "cuda copy (host)", KC_OPTIONAL},
};
#define KC_NPATHS (sizeof(kc_paths) / sizeof(kc_paths[0]))

/* ---- one case: an initiator, a target and the models ---- */

typedef struct kc_case {
    const kc_path_t *path;
    kvl_agent_t *a;
    kt_peer_t p;
    uint8_t *buf;                /* ours, registered */
    uint64_t lb;                 /* its address */
    uint8_t *model;              /* what the target's buffer must hold */
    uint8_t *lexp;               /* what ours must hold after a READ */
    uint8_t *tmp;
    char note[256];              /* the report's line */
} kc_case_t;

static void kc_open(kc_case_t *c, const kc_path_t *path)
{
    char why[512];
    memset(c, 0, sizeof(*c));
    c->path = path;
    if (kvl_backend_available(path->backend, why, sizeof(why)) != KVL_OK) {
        if (path->flags & KC_OPTIONAL)
            KT_SKIP("%s backend not available here: %s", path->backend, why);
        fprintf(stderr, "%s backend not available: %s\n", path->backend, why);
        kt_fail_at(__FILE__, __LINE__, "kvl_backend_available", 0);
    }
    /* The agent first, without backends, so that a backend that cannot
     * start is told apart from a broken agent. */
    c->a = kt_agent_tmo("initiator", NULL, NULL, KC_WAIT_MS);
    kvl_param_t prm[4];
    size_t np = 0;
    char pbuf[256] = "";
    if (path->params) {
        snprintf(pbuf, sizeof(pbuf), "%s", path->params);
        char *save = NULL;
        for (char *kv = strtok_r(pbuf, ",", &save); kv && np < 4; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            KT_CHECK(eq != NULL);
            *eq = 0;
            prm[np++] = (kvl_param_t){kv, eq + 1};
        }
    }
    if (kvl_backend_create(c->a, path->backend, prm, np, NULL) != KVL_OK) {
        kvl_error_render(NULL, why, sizeof(why));
        if (path->flags & KC_OPTIONAL)
            KT_SKIP("%s backend cannot start here: %s", path->backend, why);
        kt_fail_at(__FILE__, __LINE__, "kvl_backend_create", 1);
    }
    c->buf = mmap(NULL, KC_BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(c->buf != MAP_FAILED);
    memset(c->buf, 0, KC_BUF);
    c->lb = (uint64_t)(uintptr_t)c->buf;
    kvl_mem_desc_t d = {c->lb, KC_BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(c->a, &d, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = "target", .len = KC_BUF, .backend = path->backend,
                        .params = path->peer_params, .shareable = path->peer_shareable,
                        .timeout_ms = KC_WAIT_MS};
    kt_peer_start(&c->p, &o, c->a);
    c->model = calloc(1, KC_BUF);          /* the target starts with zeros */
    c->lexp = malloc(KC_BUF);
    c->tmp = malloc(KC_BUF);
    KT_CHECK(c->model != NULL && c->lexp != NULL && c->tmp != NULL);
    kvl_remote_describe(c->a, "target", why, sizeof(why));
    printf("path %s: %s", path->name, why);
}

static void kc_close(kc_case_t *c)
{
    kt_peer_stop(&c->p);
    kvl_agent_destroy(c->a);
    munmap(c->buf, KC_BUF);
    free(c->model);
    free(c->lexp);
    free(c->tmp);
}

/* Our buffer and the target's get a fresh pattern (the models follow). */
static void kc_fill_local(kc_case_t *c, uint64_t seed)
{
    kt_fill(c->buf, KC_BUF, seed);
}

static void kc_fill_remote(kc_case_t *c, uint64_t seed)
{
    kt_peer_fill(&c->p, seed);
    kt_fill(c->model, KC_BUF, seed);
}

static void kc_report_diff(const char *side, const uint8_t *got, const uint8_t *want, size_t len,
                           const char *what)
{
    size_t first = 0, last = 0, n = 0;
    for (size_t i = 0; i < len; i++)
        if (got[i] != want[i]) {
            if (n++ == 0)
                first = i;
            last = i;
        }
    fprintf(stderr, "%s: %s buffer differs from the model in %zu bytes, offsets %zu..%zu "
            "(first: got 0x%02x, want 0x%02x)\n", what, side, n, first, last, got[first],
            want[first]);
}

/* The target's whole buffer against the model. */
static void kc_check_remote(kc_case_t *c, const char *what)
{
    kt_peer_read(&c->p, 0, c->tmp, KC_BUF);
    if (memcmp(c->tmp, c->model, KC_BUF) != 0) {
        kc_report_diff("target", c->tmp, c->model, KC_BUF, what);
        kt_fail_at(__FILE__, __LINE__, what, 0);
    }
}

/* Our whole buffer against what it must hold. */
static void kc_check_local(kc_case_t *c, const char *what)
{
    if (memcmp(c->buf, c->lexp, KC_BUF) != 0) {
        kc_report_diff("local", c->buf, c->lexp, KC_BUF, what);
        kt_fail_at(__FILE__, __LINE__, what, 0);
    }
}

/* Before a READ: our buffer as it is, the READ's blocks are applied on top. */
static void kc_snapshot(kc_case_t *c)
{
    memcpy(c->lexp, c->buf, KC_BUF);
}

/* One block pair of a finished transfer, applied to the models. */
static void kc_apply_block(kc_case_t *c, kvl_xfer_op_t op, uint64_t laddr, uint64_t raddr,
                           uint64_t len)
{
    KT_CHECK(laddr >= c->lb && laddr + len <= c->lb + KC_BUF);
    KT_CHECK(raddr >= c->p.base && raddr + len <= c->p.base + KC_BUF);
    uint64_t lo = laddr - c->lb, ro = raddr - c->p.base;
    if (op == KVL_WRITE)
        memcpy(c->model + ro, c->buf + lo, len);
    else
        memcpy(c->lexp + lo, c->model + ro, len);
}

/* A finished transfer built from two lists: blocks pair in order, strided
 * entries counted block by block. */
static void kc_apply(kc_case_t *c, kvl_xfer_op_t op, const kvl_dlist_t *l, const kvl_dlist_t *r)
{
    size_t li = 0, ri = 0, ln = kvl_dlist_entries(l), rn = kvl_dlist_entries(r);
    uint64_t lj = 0, rj = 0;
    while (li < ln && ri < rn) {
        uint64_t la, ls, lc, ll, ra, rs, rc, rl;
        KT_OK(kvl_dlist_get(l, li, &la, &ls, &lc, &ll, NULL));
        KT_OK(kvl_dlist_get(r, ri, &ra, &rs, &rc, &rl, NULL));
        KT_CHECK(ll == rl);
        kc_apply_block(c, op, la + lj * ls, ra + rj * rs, ll);
        if (++lj == lc) {
            lj = 0;
            li++;
        }
        if (++rj == rc) {
            rj = 0;
            ri++;
        }
    }
    KT_CHECK(li == ln && ri == rn);
}

static kvl_dlist_t *kc_list(void)
{
    kvl_dlist_t *l;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 4, &l));
    return l;
}

/* Offsets in our buffer and the target's, as descriptor addresses. */
#define KC_L(c, off) ((c)->lb + (uint64_t)(off))
#define KC_R(c, off) ((c)->p.base + (uint64_t)(off))

static kvl_xfer_t *kc_xfer(kc_case_t *c, kvl_xfer_op_t op, const kvl_dlist_t *l,
                           const kvl_dlist_t *r, const char *notif)
{
    kvl_xfer_t *x;
    kvl_xfer_params_t prm = {0};
    if (notif) {
        prm.field_mask = KVL_XFER_PARAM_NOTIF;
        prm.notif = notif;
        prm.notif_len = strlen(notif);
    }
    KT_OK(kvl_xfer_create(c->a, op, l, "target", r, &prm, &x));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_IDLE);
    return x;
}

/* Post and wait for it: done, all bytes in place. */
static void kc_post_wait(kvl_xfer_t *x)
{
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, KC_WAIT_MS));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE);
    KT_OK(kvl_xfer_test(x));
}

/* A whole transfer: create, post, wait, release, then check both buffers. */
static void kc_move(kc_case_t *c, kvl_xfer_op_t op, const kvl_dlist_t *l, const kvl_dlist_t *r,
                    const char *what)
{
    kvl_xfer_t *x = kc_xfer(c, op, l, r, NULL);
    if (op == KVL_READ)
        kc_snapshot(c);
    kc_post_wait(x);
    kvl_xfer_release(x);
    kc_apply(c, op, l, r);
    if (op == KVL_READ)
        kc_check_local(c, what);
    else
        kc_check_remote(c, what);
}

/* One notification on the target: exactly msg, from us. */
static void kc_expect_notif(kc_case_t *c, const char *msg)
{
    char got[512], from[64];
    long n = kt_peer_notif(&c->p, KC_WAIT_MS, got, sizeof(got), from, sizeof(from));
    if (n != (long)strlen(msg) || strcmp(got, msg) != 0 || strcmp(from, "initiator") != 0) {
        fprintf(stderr, "target got notification \"%s\" (%ld bytes) from '%s', expected \"%s\" "
                "from 'initiator'\n", n < 0 ? "(none)" : got, n, from, msg);
        kt_fail_at(__FILE__, __LINE__, "notification", 0);
    }
}

static kvl_xfer_stats_t kc_stats(kvl_xfer_t *x)
{
    kvl_xfer_stats_t s;
    KT_OK(kvl_xfer_get_stats(x, &s));
    return s;
}

static void kc_check_path(kc_case_t *c, const kvl_xfer_stats_t *s, kvl_xfer_op_t op)
{
    const char *want = op == KVL_WRITE ? c->path->write_path : c->path->read_path;
    if (strcmp(s->backend, c->path->backend) != 0 || strstr(s->path, want) == NULL) {
        fprintf(stderr, "moved by backend '%s' on path '%s', expected backend '%s' on a path "
                "containing '%s'\n", s->backend, s->path, c->path->backend, want);
        kt_fail_at(__FILE__, __LINE__, "backend and path", 0);
    }
}

/* ---- scenarios ---- */

/* WRITE of 1 MiB to an offset: the bytes land, the neighbours keep theirs;
 * the stats name the backend and path. */
static void sc_write(kc_case_t *c)
{
    kc_fill_local(c, 11);
    kc_fill_remote(c, 5);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), KC_MIB, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 4096), KC_MIB, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    kc_post_wait(x);
    kvl_xfer_stats_t s = kc_stats(x);
    kc_check_path(c, &s, KVL_WRITE);
    KT_CHECK(s.bytes == KC_MIB && s.blocks == 1 && s.segments == 1);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "WRITE 1 MiB at offset 4096");
    /* the whole buffer, more than one request or chunk on every path */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    kc_fill_local(c, 12);
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), KC_BUF, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), KC_BUF, KVL_DEV_ANY));
    kc_move(c, KVL_WRITE, l, r, "WRITE of the whole buffer");
    snprintf(c->note, sizeof(c->note), "1 MiB and 8 MiB, path \"%s\"", s.path);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* READ of 2 MiB into an odd offset: the bytes arrive, our neighbours keep
 * theirs; then the whole buffer. */
static void sc_read(kc_case_t *c)
{
    kc_fill_local(c, 3);
    kc_fill_remote(c, 77);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add(l, KC_L(c, 100), 2 * KC_MIB, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), 2 * KC_MIB, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_READ, l, r, NULL);
    kc_snapshot(c);
    kc_post_wait(x);
    kvl_xfer_stats_t s = kc_stats(x);
    kc_check_path(c, &s, KVL_READ);
    KT_CHECK(s.bytes == 2 * KC_MIB && s.blocks == 1);
    kvl_xfer_release(x);
    kc_apply(c, KVL_READ, l, r);
    kc_check_local(c, "READ 2 MiB into offset 100");
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    kc_fill_remote(c, 78);
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), KC_BUF, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), KC_BUF, KVL_DEV_ANY));
    kc_move(c, KVL_READ, l, r, "READ of the whole buffer");
    snprintf(c->note, sizeof(c->note), "2 MiB and 8 MiB, path \"%s\"", s.path);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Sizes and offsets that are not round: one byte, odd addresses, a page
 * plus or minus one, a size past a 4 MiB chunk, odd strides; each written,
 * then read back to another place. (Zero lengths are refused: sc_bad_input.) */
static void sc_odd_sizes(kc_case_t *c)
{
    static const struct { uint64_t lo, ro, len; } t[] = {
        {0, 0, 1}, {1, 8191, 1}, {3, 4099, 3}, {7, 12289, 4095}, {4096, 20000, 4097},
        {12345, 1000003, 65537}, {1, 3 * KC_MIB + 5, KC_MIB + 1}, {5, 2 * KC_MIB + 7, 4 * KC_MIB + 3},
    };
    kc_fill_local(c, 21);
    kc_fill_remote(c, 22);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        kvl_dlist_clear(l);
        kvl_dlist_clear(r);
        KT_OK(kvl_dlist_add(l, KC_L(c, t[i].lo), t[i].len, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, KC_R(c, t[i].ro), t[i].len, KVL_DEV_ANY));
        kc_move(c, KVL_WRITE, l, r, "WRITE of an odd size");
        /* back to another place, which holds the complement of what
         * comes: a READ that did nothing cannot pass */
        kvl_dlist_clear(l);
        uint64_t back = (KC_BUF - t[i].len) / 2 + 1 + i;
        for (uint64_t j = 0; j < t[i].len; j++)
            c->buf[back + j] = (uint8_t)~c->model[t[i].ro + j];
        KT_OK(kvl_dlist_add(l, KC_L(c, back), t[i].len, KVL_DEV_ANY));
        kc_move(c, KVL_READ, l, r, "READ of an odd size");
    }
    /* strided: 7-byte blocks, strides 13 here and 29 there */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 6 * KC_MIB + 1), 13, 101, 7, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 7 * KC_MIB + 3), 29, 101, 7, KVL_DEV_ANY));
    kc_move(c, KVL_WRITE, l, r, "strided WRITE of 7-byte blocks");
    kc_fill_remote(c, 23);
    kc_move(c, KVL_READ, l, r, "strided READ of 7-byte blocks");
    snprintf(c->note, sizeof(c->note), "%zu sizes from 1 B to 4 MiB+3 at odd offsets, both ways; "
             "101 strided 7-byte blocks", sizeof(t) / sizeof(t[0]));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Strided WRITE: different strides on the two sides; the remote side
 * partly strided, partly plain entries in descending order; every other
 * block here into dense blocks there. Blocks pair in order, gaps keep
 * their bytes. */
static void sc_strided_write(kc_case_t *c)
{
    kc_fill_local(c, 31);
    kc_fill_remote(c, 32);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 0), 8192, 300, 3000, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 100), 5000, 300, 3000, KVL_DEV_ANY));
    kc_move(c, KVL_WRITE, l, r, "strided WRITE, strides 8192 -> 5000");
    kvl_dlist_clear(r);
    kc_fill_local(c, 33);
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 100), 5000, 150, 3000, KVL_DEV_ANY));
    for (int i = 149; i >= 0; i--)
        KT_OK(kvl_dlist_add(r, KC_R(c, 6 * KC_MIB + (uint64_t)i * 3072), 3000, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    kc_post_wait(x);
    kvl_xfer_stats_t s = kc_stats(x);
    KT_CHECK(s.blocks == 300 && s.bytes == 300 * 3000);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "strided WRITE, strided and plain remote entries");
    /* 32 blocks of 4 KiB, every 64 KiB here, every 8 KiB there */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 0), 65536, 32, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 4 * KC_MIB), 8192, 32, 4096, KVL_DEV_ANY));
    kc_move(c, KVL_WRITE, l, r, "strided WRITE, 4 KiB blocks");
    /* every other 4 KiB block here, dense there */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    kc_fill_local(c, 34);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 0), 8192, 300, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, KC_MIB), 4096, 300, 4096, KVL_DEV_ANY));
    kc_move(c, KVL_WRITE, l, r, "strided WRITE into dense blocks");
    snprintf(c->note, sizeof(c->note), "300 x 3000 B (strides 8192 / 5000; and 150 strided + 150 "
             "plain: %llu segments), 32 x 4 KiB, 300 x 4 KiB into dense",
             (unsigned long long)s.segments);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Strided READ: remote blocks into our blocks of another stride, into
 * contiguous blocks (stride == length), dense remote blocks into every
 * other block here, and several entries into one strided entry. */
static void sc_strided_read(kc_case_t *c)
{
    kc_fill_local(c, 41);
    kc_fill_remote(c, 42);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 4096), 4096, 300, 3000, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 100), 5000, 300, 3000, KVL_DEV_ANY));
    kc_move(c, KVL_READ, l, r, "strided READ, strides 5000 -> 4096");
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 4 * KC_MIB), 1024, 8, 1024, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 0), 65536, 8, 1024, KVL_DEV_ANY));
    kc_move(c, KVL_READ, l, r, "strided READ into contiguous blocks");
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 4096), 8192, 300, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, KC_MIB), 4096, 300, 4096, KVL_DEV_ANY));
    kc_move(c, KVL_READ, l, r, "strided READ of dense blocks into every other block");
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 5 * KC_MIB + 4096), 8192, 40, 4096, KVL_DEV_ANY));
    for (int i = 0; i < 4; i++)
        KT_OK(kvl_dlist_add_strided(r, KC_R(c, 2 * KC_MIB + (uint64_t)i * 262144), 4096 + 512 * i,
                                    10, 4096, KVL_DEV_ANY));
    kc_move(c, KVL_READ, l, r, "strided READ, 4 remote entries into 1");
    snprintf(c->note, sizeof(c->note), "300 x 3000 B, 8 x 1 KiB into contiguous, 300 x 4 KiB dense "
             "into every other, 4 entries into 1");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* A cheap permutation of 0..n-1 (n a power of two, a odd). */
static uint64_t kc_perm(uint64_t i, uint64_t n, uint64_t a)
{
    return (i * a + 7) & (n - 1);
}

/* Many descriptors: 4096 scattered 512-byte blocks in shuffled order,
 * 1024 adjacent entries that coalesce into one segment, and 2000 entries of
 * 2000 different lengths read back. */
static void sc_many(kc_case_t *c)
{
    enum { N1 = 4096, N2 = 1024, N3 = 2000 };
    uint64_t *la = malloc(N3 * sizeof(*la)), *ra = malloc(N3 * sizeof(*ra));
    uint64_t *lens = malloc(N3 * sizeof(*lens));
    KT_CHECK(la && ra && lens);
    kc_fill_local(c, 51);
    kc_fill_remote(c, 52);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    for (uint64_t i = 0; i < N1; i++) {
        la[i % N3] = KC_L(c, kc_perm(i, N1, 2654435761u) * 512);
        ra[i % N3] = KC_R(c, i * 1024 + 1);
        if (i % N3 == N3 - 1 || i == N1 - 1) {
            KT_OK(kvl_dlist_add_array(l, la, NULL, 512, KVL_DEV_ANY, i % N3 + 1));
            KT_OK(kvl_dlist_add_array(r, ra, NULL, 512, KVL_DEV_ANY, i % N3 + 1));
        }
    }
    KT_CHECK(kvl_dlist_entries(l) == N1 && kvl_dlist_blocks(r) == N1);
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    kc_post_wait(x);
    kvl_xfer_stats_t s = kc_stats(x);
    KT_CHECK(s.blocks == N1 && s.bytes == N1 * 512);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "4096 scattered blocks");
    /* adjacent on both sides: one segment */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    for (uint64_t i = 0; i < N2; i++) {
        KT_OK(kvl_dlist_add(l, KC_L(c, 4 * KC_MIB + i * 4096), 4096, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, KC_R(c, 3 * KC_MIB + 8 + i * 4096), 4096, KVL_DEV_ANY));
    }
    x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    kc_post_wait(x);
    kvl_xfer_stats_t s2 = kc_stats(x);
    KT_CHECK(s2.blocks == N2 && s2.segments == 1 && s2.bytes == N2 * 4096);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "1024 adjacent entries");
    /* READ: entries of 2000 different lengths, packed here, spread there */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    uint64_t lo = 0, ro = 0;
    for (uint64_t i = 0; i < N3; i++) {
        lens[i] = 1 + (i * 37) % 997;
        la[i] = KC_L(c, lo);
        ra[i] = KC_R(c, 2 * KC_MIB + ro);
        lo += lens[i];
        ro += lens[i] + 1 + i % 5;
    }
    KT_OK(kvl_dlist_add_array(l, la, lens, 0, KVL_DEV_ANY, N3));
    KT_OK(kvl_dlist_add_array(r, ra, lens, 0, KVL_DEV_ANY, N3));
    kc_move(c, KVL_READ, l, r, "2000 entries of different lengths");
    snprintf(c->note, sizeof(c->note), "4096 scattered (%llu segments), 1024 adjacent (1 segment), "
             "2000 sizes read back", (unsigned long long)s.segments);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    free(la);
    free(ra);
    free(lens);
}

/* Many transfers in flight at once on one connection: 24 WRITEs and 24
 * READs on disjoint ranges, all posted before any is waited for. */
static void sc_in_flight(kc_case_t *c)
{
    enum { N = 24, SZ = 160 << 10 };
    kvl_xfer_t *w[N], *rd[N];
    kvl_dlist_t *wl[N], *wr[N], *rl[N], *rr[N];
    kc_fill_local(c, 61);
    kc_fill_remote(c, 62);
    for (int i = 0; i < N; i++) {
        wl[i] = kc_list();
        wr[i] = kc_list();
        rl[i] = kc_list();
        rr[i] = kc_list();
        /* WRITEs: our first half to the target's first half, in reverse
         * order; READs: its second half to ours; odd lengths and offsets */
        KT_OK(kvl_dlist_add(wl[i], KC_L(c, (uint64_t)i * SZ), SZ - 1, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(wr[i], KC_R(c, (uint64_t)(N - 1 - i) * SZ + 1), SZ - 1, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(rl[i], KC_L(c, 4 * KC_MIB + (uint64_t)i * SZ), SZ - 3, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(rr[i], KC_R(c, 4 * KC_MIB + (uint64_t)i * SZ + 3), SZ - 3,
                            KVL_DEV_ANY));
        w[i] = kc_xfer(c, KVL_WRITE, wl[i], wr[i], NULL);
        rd[i] = kc_xfer(c, KVL_READ, rl[i], rr[i], NULL);
    }
    kc_snapshot(c);
    for (int i = 0; i < N; i++) {
        KT_CHECK(kvl_xfer_post(w[i]) >= 0);
        KT_CHECK(kvl_xfer_post(rd[i]) >= 0);
    }
    for (int i = N - 1; i >= 0; i--) {
        KT_OK(kvl_xfer_wait(rd[i], KC_WAIT_MS));
        KT_OK(kvl_xfer_wait(w[i], KC_WAIT_MS));
    }
    for (int i = 0; i < N; i++) {
        kvl_xfer_release(w[i]);
        kvl_xfer_release(rd[i]);
        kc_apply(c, KVL_WRITE, wl[i], wr[i]);
        kc_apply(c, KVL_READ, rl[i], rr[i]);
        kvl_dlist_destroy(wl[i]);
        kvl_dlist_destroy(wr[i]);
        kvl_dlist_destroy(rl[i]);
        kvl_dlist_destroy(rr[i]);
    }
    kc_check_remote(c, "WRITEs in flight");
    kc_check_local(c, "READs in flight");
    snprintf(c->note, sizeof(c->note), "%d WRITEs and %d READs of 160 KiB posted at once", N, N);
}

/* A notification attached to a transfer arrives only once the data is in
 * place: the target looks at its bytes as soon as it sees the message,
 * before we wait for the transfer. Also with a READ, and the largest
 * notification the API allows. */
static void sc_notif_xfer(kc_case_t *c)
{
    kc_fill_local(c, 71);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), KC_BUF, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), KC_BUF, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, "kv-ready:42");
    KT_CHECK(kvl_xfer_post(x) >= 0);
    kc_expect_notif(c, "kv-ready:42");
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "bytes in place when the notification arrives");
    KT_OK(kvl_xfer_wait(x, KC_WAIT_MS));
    kvl_xfer_release(x);
    /* READ with a notification: the target hears once we have its bytes */
    kc_fill_remote(c, 72);
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 1), 8192, 64, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 0), 4096, 64, 4096, KVL_DEV_ANY));
    x = kc_xfer(c, KVL_READ, l, r, "read-done");
    kc_snapshot(c);
    kc_post_wait(x);
    kvl_xfer_release(x);
    kc_apply(c, KVL_READ, l, r);
    kc_check_local(c, "READ with a notification");
    kc_expect_notif(c, "read-done");
    /* KVL_NOTIF_MAX bytes attached */
    char *big = malloc(KVL_NOTIF_MAX + 1), *got = malloc(KVL_NOTIF_MAX + 1);
    KT_CHECK(big && got);
    for (size_t i = 0; i < KVL_NOTIF_MAX; i++)
        big[i] = (char)('a' + i % 26);
    big[KVL_NOTIF_MAX] = 0;
    kvl_xfer_params_t prm = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = big,
                             .notif_len = KVL_NOTIF_MAX};
    KT_OK(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, &prm, &x));
    kc_fill_local(c, 73);
    kc_post_wait(x);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    char from[64];
    KT_CHECK(kt_peer_notif(&c->p, KC_WAIT_MS, got, KVL_NOTIF_MAX + 1, from, sizeof(from)) ==
             KVL_NOTIF_MAX);
    KT_CHECK(memcmp(got, big, KVL_NOTIF_MAX) == 0 && strcmp(from, "initiator") == 0);
    kc_check_remote(c, "WRITE with a 64 KiB notification");
    KT_CHECK(kt_peer_notif_count(&c->p) == 0);
    free(big);
    free(got);
    snprintf(c->note, sizeof(c->note), "after 8 MiB WRITE, after strided READ, 64 KiB message");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Notifications without a transfer, both ways: a short one, an empty one,
 * the largest allowed, several at once; polling never blocks. */
static void sc_notif_alone(kc_case_t *c)
{
    char msg[256], from[64];
    KT_OK(kvl_notif_send(c->a, "target", "hello", 5));
    kc_expect_notif(c, "hello");
    KT_OK(kvl_notif_send(c->a, "target", "", 0));
    KT_CHECK(kt_peer_notif(&c->p, KC_WAIT_MS, msg, sizeof(msg), from, sizeof(from)) == 0);
    KT_CHECK(strcmp(from, "initiator") == 0);
    char *big = malloc(KVL_NOTIF_MAX + 1), *got = malloc(KVL_NOTIF_MAX + 1);
    KT_CHECK(big && got);
    kt_fill(big, KVL_NOTIF_MAX, 81);
    KT_OK(kvl_notif_send(c->a, "target", big, KVL_NOTIF_MAX));
    KT_CHECK(kt_peer_notif(&c->p, KC_WAIT_MS, got, KVL_NOTIF_MAX + 1, NULL, 0) == KVL_NOTIF_MAX);
    KT_CHECK(memcmp(got, big, KVL_NOTIF_MAX) == 0);
    /* several: each arrives once (the API promises arrival order, not
     * send order, so they are matched as a set) */
    enum { N = 10 };
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        snprintf(msg, sizeof(msg), "n%d", i);
        KT_OK(kvl_notif_send(c->a, "target", msg, strlen(msg)));
    }
    for (int i = 0; i < N; i++) {
        int k;
        KT_CHECK(kt_peer_notif(&c->p, KC_WAIT_MS, msg, sizeof(msg), NULL, 0) > 0);
        KT_CHECK(sscanf(msg, "n%d", &k) == 1 && k >= 0 && k < N && !seen[k]);
        seen[k] = 1;
    }
    KT_CHECK(kt_peer_notif_count(&c->p) == 0);

    /* the target to us: it loads our metadata first */
    kvl_notif_t n[4];
    size_t got_n = 9;
    KT_OK(kvl_notif_poll(c->a, n, 4, &got_n));
    KT_CHECK(got_n == 0);
    KT_STATUS(kvl_notif_wait(c->a, 0), KVL_ERR_TIMEOUT);
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(c->a, &blob, &blen));
    kt_peer_load(&c->p, blob, blen);
    kvl_free(blob);
    kt_peer_notify(&c->p, "initiator", "back");
    kt_peer_notify(&c->p, "initiator", "again");
    size_t total = 0;
    int back = 0, again = 0;
    while (total < 2) {
        KT_OK(kvl_notif_wait(c->a, KC_WAIT_MS));
        KT_OK(kvl_notif_poll(c->a, n, 4, &got_n));
        for (size_t i = 0; i < got_n; i++) {
            KT_CHECK(strcmp(n[i].from, "target") == 0);
            KT_CHECK(n[i].msg[n[i].len] == '\0');
            back += n[i].len == 4 && memcmp(n[i].msg, "back", 4) == 0;
            again += n[i].len == 5 && memcmp(n[i].msg, "again", 5) == 0;
            kvl_notif_free(&n[i]);
        }
        total += got_n;
    }
    KT_CHECK(total == 2 && back == 1 && again == 1);
    KT_OK(kvl_notif_poll(c->a, n, 4, &got_n));
    KT_CHECK(got_n == 0);
    free(big);
    free(got);
    snprintf(c->note, sizeof(c->note), "5 B, 0 B, 64 KiB, %d at once; 2 from the target", N);
}

/* One prepared transfer posted again and again: every posting moves the
 * bytes the memory holds then, and delivers its notification once. */
static void sc_repost(kc_case_t *c)
{
    enum { ROUNDS = 5 };
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 0), 4096, 512, 2048, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 64), 8192, 512, 2048, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, "again");
    for (int i = 0; i < ROUNDS; i++) {
        kc_fill_local(c, 100 + (uint64_t)i);
        kc_fill_remote(c, 200 + (uint64_t)i);
        kc_post_wait(x);
        kc_apply(c, KVL_WRITE, l, r);
        kc_expect_notif(c, "again");
        kc_check_remote(c, "re-posted WRITE");
        kvl_xfer_stats_t s = kc_stats(x);
        KT_CHECK(s.bytes == 512 * 2048 && s.blocks == 512);
    }
    KT_CHECK(kt_peer_notif_count(&c->p) == 0);
    kvl_xfer_release(x);
    x = kc_xfer(c, KVL_READ, l, r, NULL);
    for (int i = 0; i < ROUNDS; i++) {
        kc_fill_remote(c, 300 + (uint64_t)i);
        kc_snapshot(c);
        kc_post_wait(x);
        kc_apply(c, KVL_READ, l, r);
        kc_check_local(c, "re-posted READ");
    }
    kvl_xfer_release(x);
    snprintf(c->note, sizeof(c->note), "WRITE with notification and READ, %d postings each",
             ROUNDS);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Status by polling: idle before the post, kvl_xfer_test until done (never
 * an error in between), then done for every kind of ask. */
static void sc_poll(kc_case_t *c)
{
    kc_fill_local(c, 91);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), 4 * KC_MIB, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 4 * KC_MIB), 4 * KC_MIB, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    unsigned long polls = 0, waits = 0;
    for (int round = 0; round < 3; round++) {
        kvl_status_t st = kvl_xfer_post(x);
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        /* a zero wait answers at once: done, or still moving */
        st = kvl_xfer_wait(x, 0);
        KT_CHECK(st == KVL_OK || st == KVL_ERR_TIMEOUT);
        waits += st == KVL_ERR_TIMEOUT;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while ((st = kvl_xfer_test(x)) == KVL_IN_PROGRESS) {
            KT_CHECK(kvl_xfer_state(x) == KVL_XFER_POSTED || kvl_xfer_state(x) == KVL_XFER_DONE);
            polls++;
            usleep(100);
            clock_gettime(CLOCK_MONOTONIC, &t);
            KT_CHECK(t.tv_sec - t0.tv_sec < KC_WAIT_MS / 1000);   /* a hang, not a timing */
        }
        KT_OK(st);
        KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE);
        KT_OK(kvl_xfer_test(x));
        KT_OK(kvl_xfer_wait(x, 0));
        KT_OK(kvl_xfer_wait(x, KC_WAIT_MS));
    }
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "polled WRITE");
    snprintf(c->note, sizeof(c->note), "3 postings, %lu polls saw it moving, %lu zero waits "
             "timed out", polls, waits);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* A stopped target (paths where it must take part): the transfer stays in
 * flight, a bounded wait says so, posting it again and deregistering its
 * memory are refused; once the target runs again it completes. */
static void sc_peer_stopped(kc_case_t *c)
{
    kc_fill_local(c, 111);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), KC_BUF, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), KC_BUF, KVL_DEV_ANY));
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, "after-stop");
    kt_peer_stop_signal(&c->p);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    KT_STATUS(kvl_xfer_wait(x, 200), KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("not complete after 200 ms");
    KT_STATUS(kvl_xfer_test(x), KVL_IN_PROGRESS);
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_POSTED);
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_STATE);
    KT_ERROR_HAS("already in flight");
    kvl_mem_desc_t d = {c->lb, KC_BUF, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_deregister(c->a, &d, 1), KVL_ERR_IN_USE);
    kill(c->p.pid, SIGCONT);
    KT_OK(kvl_xfer_wait(x, KC_WAIT_MS));
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_expect_notif(c, "after-stop");
    kc_check_remote(c, "WRITE after the target resumed");
    KT_OK(kvl_mem_deregister(c->a, &d, 1));        /* no longer in use */
    snprintf(c->note, sizeof(c->note), "in flight while stopped: wait times out, re-post and "
             "deregister refused; completes after SIGCONT");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Cancel tells the truth: CANCELED (no notification, ever; tcp sends its
 * CANCELED notice instead) or DONE (notification delivered). A cancelled
 * transfer can be posted again and completes; cancelling a finished one
 * leaves it done. Which outcome a cancel right after posting gets is a
 * race the API leaves open, so none is required: rounds go on (at most 40)
 * until one was cancelled, so that both outcomes are usually checked, and
 * the note says how many of each there were. */
static void sc_cancel(kc_case_t *c)
{
    int cancelled = 0, done = 0, round;
    char msg[64], want[96], got[128];
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 0), 4096, 2048, 2048, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 0), 4096, 2048, 2048, KVL_DEV_ANY));
    for (round = 0; round < 40 && (round < 6 || cancelled == 0); round++) {
        snprintf(msg, sizeof(msg), "cancel-probe-%d", round);
        kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, msg);
        kc_fill_local(c, 120 + (uint64_t)round);
        KT_CHECK(kvl_xfer_post(x) >= 0);
        if (round % 3)          /* cancel while queued, or while moving */
            usleep(round % 3 == 1 ? 200 : 3000);
        kvl_xfer_state_t st;
        KT_OK(kvl_xfer_cancel(x, &st));
        KT_CHECK(st == KVL_XFER_CANCELED || st == KVL_XFER_DONE);
        KT_CHECK(kvl_xfer_state(x) == st);
        if (st == KVL_XFER_CANCELED) {
            cancelled++;
            KT_STATUS(kvl_xfer_test(x), KVL_ERR_CANCELED);
            KT_ERROR_HAS("cancel");
            if (c->path->flags & KC_CANCEL_NOTICE) {
                snprintf(want, sizeof(want), "kvlane:canceled:%s", msg);
                kc_expect_notif(c, want);
            } else {
                /* bounded look: a late one is caught below, as an extra */
                KT_CHECK(kt_peer_notif(&c->p, 300, got, sizeof(got), NULL, 0) == -1);
            }
        } else {
            done++;
            KT_OK(kvl_xfer_test(x));
            kc_expect_notif(c, msg);
        }
        /* posted again, it completes and notifies */
        kc_post_wait(x);
        kc_expect_notif(c, msg);
        kc_apply(c, KVL_WRITE, l, r);
        kc_check_remote(c, "re-posted after cancel");
        KT_OK(kvl_xfer_cancel(x, &st));
        KT_CHECK(st == KVL_XFER_DONE && kvl_xfer_state(x) == KVL_XFER_DONE);
        KT_CHECK(kt_peer_notif_count(&c->p) == 0);
        kvl_xfer_release(x);
    }
    snprintf(c->note, sizeof(c->note), "%d rounds: %d cancelled%s, %d completed first%s", round,
             cancelled, cancelled && (c->path->flags & KC_CANCEL_NOTICE) ? " (notice checked)" : "",
             done, cancelled ? "" : " (the CANCELED outcome was not reached this run)");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Release and lifetimes: a transfer never posted, one released in flight,
 * one whose local memory was deregistered, one whose remote agent was
 * removed; the agent goes on working after each. */
static void sc_release(kc_case_t *c)
{
    kc_fill_local(c, 131);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), KC_BUF, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), KC_BUF, KVL_DEV_ANY));
    kvl_xfer_release(kc_xfer(c, KVL_WRITE, l, r, "never"));
    kvl_xfer_release(NULL);
    /* released in flight: cancelled first (or done) */
    kvl_xfer_t *x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    KT_CHECK(kvl_xfer_post(x) >= 0);
    kvl_xfer_release(x);
    kc_move(c, KVL_WRITE, l, r, "WRITE after a release in flight");
    /* local memory deregistered under an idle transfer: posting it is
     * refused; registered again, a new transfer works */
    x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    kvl_mem_desc_t d = {c->lb, KC_BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_deregister(c->a, &d, 1));
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_STATE);
    KT_ERROR_HAS("was deregistered");
    kvl_xfer_release(x);
    KT_OK(kvl_mem_register(c->a, &d, 1, NULL, NULL));
    kc_fill_local(c, 132);
    kc_move(c, KVL_WRITE, l, r, "WRITE after registering again");
    /* the remote agent removed: its transfers are stale; loaded again, new
     * ones work */
    x = kc_xfer(c, KVL_WRITE, l, r, NULL);
    KT_OK(kvl_remote_remove(c->a, "target"));
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_STALE);
    KT_ERROR_HAS("removed or replaced");
    kvl_xfer_release(x);
    KT_STATUS(kvl_remote_check(c->a, "target"), KVL_ERR_NOT_FOUND);
    size_t blen;
    void *blob = kt_peer_metadata(&c->p, &blen);
    KT_OK(kvl_metadata_load(c->a, blob, blen, NULL, 0));
    free(blob);
    kc_fill_local(c, 133);
    kc_move(c, KVL_WRITE, l, r, "WRITE after loading the target again");
    kc_fill_remote(c, 134);
    kc_move(c, KVL_READ, l, r, "READ after loading the target again");
    snprintf(c->note, sizeof(c->note), "never posted, in flight, memory deregistered, remote "
             "removed and loaded again");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Prepared lists and index arrays: fewer than 256 pairs (paired at
 * creation), 300 and more (an indexed transfer, moved from the indices or
 * paired at the first posting), NULL arrays (0..n-1), re-posts, READs, and
 * an index out of range refused. */
static void sc_prepped(kc_case_t *c)
{
    enum { N = 512, BS = 4096 };
    kc_fill_local(c, 141);
    kc_fill_remote(c, 142);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    for (uint64_t i = 0; i < N; i++) {
        KT_OK(kvl_dlist_add(l, KC_L(c, i * BS), BS, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, KC_R(c, KC_BUF - (i + 1) * 2 * BS), BS, KVL_DEV_ANY));
    }
    kvl_prep_t *lp, *rp;
    KT_OK(kvl_prep_local(c->a, l, &lp));
    KT_OK(kvl_prep_remote(c->a, "target", r, &rp));
    KT_CHECK(kvl_prep_entries(lp) == N && kvl_prep_entries(rp) == N);
    int64_t li[N], ri[N];
    static const size_t counts[] = {100, 300, N};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        for (size_t i = 0; i < n; i++) {
            li[i] = (int64_t)kc_perm(i, N, 5 + 2 * k);
            ri[i] = (int64_t)kc_perm(i, N, 301 + 2 * k);
        }
        for (int op = KVL_READ; op <= KVL_WRITE; op++) {
            kvl_xfer_t *x;
            KT_OK(kvl_xfer_create_prepped(c->a, (kvl_xfer_op_t)op, lp, li, rp, ri, n, NULL, &x));
            /* 256 pairs or more of uniform lists: an indexed transfer, which
             * every backend here takes: creation pairs nothing (docs/guide.md) */
            kvl_xfer_stats_t s0 = kc_stats(x);
            KT_CHECK(n >= 256 ? s0.segments == 0 : s0.segments > 0);
            for (int post = 0; post < 2; post++) {
                if (op == KVL_WRITE)
                    kc_fill_local(c, 150 + k * 4 + (uint64_t)post);
                else
                    kc_fill_remote(c, 170 + k * 4 + (uint64_t)post);
                kc_snapshot(c);
                kc_post_wait(x);
                for (size_t i = 0; i < n; i++)
                    kc_apply_block(c, (kvl_xfer_op_t)op, KC_L(c, (uint64_t)li[i] * BS),
                                   KC_R(c, KC_BUF - ((uint64_t)ri[i] + 1) * 2 * BS), BS);
                if (op == KVL_WRITE)
                    kc_check_remote(c, "prepped WRITE");
                else
                    kc_check_local(c, "prepped READ");
                kvl_xfer_stats_t s = kc_stats(x);
                KT_CHECK(s.bytes == n * BS && s.blocks == n);
            }
            kvl_xfer_release(x);
        }
    }
    /* NULL index arrays: entries 0..n-1 of both lists */
    kvl_xfer_t *x;
    kc_fill_local(c, 190);
    KT_OK(kvl_xfer_create_prepped(c->a, KVL_WRITE, lp, NULL, rp, NULL, N, NULL, &x));
    kc_post_wait(x);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "prepped WRITE, NULL index arrays");
    /* an index out of range, on both kinds of build */
    for (size_t k = 0; k < 2; k++) {
        size_t n = k ? 300 : 100;
        for (size_t i = 0; i < n; i++)
            li[i] = ri[i] = (int64_t)i;
        li[5] = N;
        KT_STATUS(kvl_xfer_create_prepped(c->a, KVL_WRITE, lp, li, rp, ri, n, NULL, &x),
                  KVL_ERR_INVALID_ARG);
        KT_ERROR_HAS("512");
        KT_CHECK(x == NULL);
    }
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kc_check_remote(c, "nothing moved by refused index arrays");
    snprintf(c->note, sizeof(c->note), "100, 300 and 512 index pairs, both ops, re-posted; NULL "
             "arrays; index out of range refused");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

/* Blocks of two registrations that touch, on both sides: our buffer is
 * registered as two regions meeting at KC_LCUT, the target's at KC_RCUT.
 * Runs of neighbouring blocks cross those boundaries (at the same pair on
 * both sides, and at different ones), in plain transfers and in indexed
 * ones. A backend may merge neighbours into one copy or request, never
 * across two regions: the target checks a range against one region, and a
 * mapping or pinned piece covers one registration. */
#define KC_LCUT (5 * KC_MIB)
#define KC_RCUT (3 * KC_MIB)
static void sc_adjacent(kc_case_t *c)
{
    enum { BS = 4096, N = 512 };
    kvl_mem_desc_t whole = {c->lb, KC_BUF, KVL_DEV_ANY};
    kvl_mem_desc_t halves[2] = {{c->lb, KC_LCUT, KVL_DEV_ANY},
                                {c->lb + KC_LCUT, KC_BUF - KC_LCUT, KVL_DEV_ANY}};
    KT_OK(kvl_mem_deregister(c->a, &whole, 1));
    KT_OK(kvl_mem_register(c->a, halves, 2, NULL, NULL));
    KT_OK(kt_peer_split(&c->p, KC_RCUT));
    size_t blen;
    void *blob = kt_peer_metadata(&c->p, &blen);
    KT_OK(kvl_metadata_load(c->a, blob, blen, NULL, 0));
    free(blob);
    /* plain: 64 KiB blocks, one descriptor each; remote run shifted by
     * `shift` blocks against the local one (0: both cross at pair 8) */
    static const int64_t shifts[] = {0, 4, -3};
    for (size_t k = 0; k < sizeof(shifts) / sizeof(shifts[0]); k++)
        for (int op = KVL_READ; op <= KVL_WRITE; op++) {
            kvl_dlist_t *l = kc_list(), *r = kc_list();
            uint64_t b = 64 * 1024;
            for (int64_t i = 0; i < 16; i++) {
                KT_OK(kvl_dlist_add(l, KC_L(c, KC_LCUT + (uint64_t)(i - 8) * b), b, KVL_DEV_ANY));
                KT_OK(kvl_dlist_add(r, KC_R(c, KC_RCUT + (uint64_t)(i - 8 + shifts[k]) * b), b,
                                    KVL_DEV_ANY));
            }
            if (op == KVL_WRITE)
                kc_fill_local(c, 200 + k);
            else
                kc_fill_remote(c, 210 + k);
            kc_move(c, (kvl_xfer_op_t)op, l, r, op == KVL_WRITE
                    ? "WRITE across adjacent registrations" : "READ across adjacent registrations");
            kvl_dlist_destroy(l);
            kvl_dlist_destroy(r);
        }
    /* indexed: prepared lists of 4 KiB blocks around the boundaries (the
     * local one crosses at entry N / 2, the remote ones at N / 2 and N / 4),
     * index pairs i -> i: every pair a neighbour of the last on both sides */
    kvl_dlist_t *l = kc_list(), *r1 = kc_list(), *r2 = kc_list();
    for (uint64_t i = 0; i < N; i++) {
        KT_OK(kvl_dlist_add(l, KC_L(c, KC_LCUT - N / 2 * BS + i * BS), BS, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r1, KC_R(c, KC_RCUT - N / 2 * BS + i * BS), BS, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r2, KC_R(c, KC_RCUT - N / 4 * BS + i * BS), BS, KVL_DEV_ANY));
    }
    kvl_prep_t *lp, *rp[2];
    KT_OK(kvl_prep_local(c->a, l, &lp));
    KT_OK(kvl_prep_remote(c->a, "target", r1, &rp[0]));
    KT_OK(kvl_prep_remote(c->a, "target", r2, &rp[1]));
    kvl_dlist_t *rl[2] = {r1, r2};
    int64_t ix[N];
    for (int64_t i = 0; i < N; i++)
        ix[i] = i;
    for (int k = 0; k < 2; k++)
        for (int op = KVL_READ; op <= KVL_WRITE; op++) {
            kvl_xfer_t *x;
            KT_OK(kvl_xfer_create_prepped(c->a, (kvl_xfer_op_t)op, lp, ix, rp[k], ix, N, NULL,
                                          &x));
            KT_CHECK(kc_stats(x).segments == 0); /* indexed: nothing paired at creation */
            if (op == KVL_WRITE)
                kc_fill_local(c, 220 + (uint64_t)k);
            else
                kc_fill_remote(c, 230 + (uint64_t)k);
            kc_snapshot(c);
            kc_post_wait(x);
            kvl_xfer_release(x);
            kc_apply(c, (kvl_xfer_op_t)op, l, rl[k]);
            if (op == KVL_WRITE)
                kc_check_remote(c, "indexed WRITE across adjacent registrations");
            else
                kc_check_local(c, "indexed READ across adjacent registrations");
        }
    kvl_prep_release(lp);
    kvl_prep_release(rp[0]);
    kvl_prep_release(rp[1]);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r1);
    kvl_dlist_destroy(r2);
    snprintf(c->note, sizeof(c->note), "runs over two registrations that touch, both sides, "
             "plain and indexed, both ops");
}

/* Wrong input is refused with an error that says what is wrong, and
 * changes nothing: the target's memory keeps its bytes, good transfers
 * still work. */
static void sc_bad_input(kc_case_t *c)
{
    kc_fill_local(c, 161);
    kc_fill_remote(c, 162);
    kvl_dlist_t *l = kc_list(), *r = kc_list();
    kvl_xfer_t *x = (kvl_xfer_t *)&x;      /* not NULL: a refusal must set it NULL */
    /* remote descriptor past the end of the target's memory */
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), 200, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, KC_BUF - 100), 200, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, NULL, &x), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("descriptor 0");
    KT_ERROR_HAS("runs 100 bytes past its end");
    KT_CHECK(x == NULL);
    /* local descriptor outside our registered memory */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(l, KC_L(c, KC_BUF - 10), 20, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), 20, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(c->a, KVL_READ, l, "target", r, NULL, &x), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("this agent");
    KT_ERROR_HAS("runs 10 bytes past its end");
    /* paired blocks of different lengths: 1 x 8 KiB against 8 x 1 KiB */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), 8192, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, KC_R(c, 0), 65536, 8, 1024, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(c->a, KVL_READ, l, "target", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("same length");
    /* more blocks on one side */
    kvl_dlist_clear(l);
    KT_OK(kvl_dlist_add_strided(l, KC_L(c, 0), 2048, 9, 1024, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("more blocks");
    /* nothing to move: empty lists; zero-length entries are not taken */
    kvl_dlist_clear(l);
    kvl_dlist_clear(r);
    KT_STATUS(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("moves nothing");
    KT_STATUS(kvl_dlist_add(l, KC_L(c, 0), 0, KVL_DEV_ANY), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("zero length");
    KT_CHECK(kvl_dlist_entries(l) == 0);
    /* an operation that is neither READ nor WRITE */
    KT_OK(kvl_dlist_add(l, KC_L(c, 0), 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, KC_R(c, 0), 4096, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(c->a, (kvl_xfer_op_t)7, l, "target", r, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("neither");
    /* a notification over KVL_NOTIF_MAX, attached or alone */
    char *big = calloc(1, KVL_NOTIF_MAX + 1);
    KT_CHECK(big != NULL);
    kvl_xfer_params_t prm = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = big,
                             .notif_len = KVL_NOTIF_MAX + 1};
    KT_STATUS(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, &prm, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("KVL_NOTIF_MAX");
    KT_STATUS(kvl_notif_send(c->a, "target", big, KVL_NOTIF_MAX + 1), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("KVL_NOTIF_MAX");
    free(big);
    /* an agent that is not loaded; a backend that is not created */
    KT_STATUS(kvl_xfer_create(c->a, KVL_WRITE, l, "nobody", r, NULL, &x), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("remote agent 'nobody' is not loaded");
    KT_STATUS(kvl_notif_send(c->a, "nobody", "x", 1), KVL_ERR_NOT_FOUND);
    kvl_xfer_params_t fb = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = "nosuch"};
    KT_STATUS(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, &fb, &x), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("backend 'nosuch' requested for the transfer is not created");
    /* a transfer never posted: nothing to test, wait for or cancel */
    fb.backend = c->path->backend;         /* naming the right one works */
    KT_OK(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, &fb, &x));
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_STATE);
    KT_ERROR_HAS("never posted");
    KT_STATUS(kvl_xfer_wait(x, 0), KVL_ERR_STATE);
    kvl_xfer_state_t st = KVL_XFER_ERROR;
    KT_STATUS(kvl_xfer_cancel(x, &st), KVL_ERR_STATE);
    KT_CHECK(st == KVL_XFER_IDLE && kvl_xfer_state(x) == KVL_XFER_IDLE);
    /* nothing of the above touched the target */
    kc_check_remote(c, "memory after refused transfers");
    kc_post_wait(x);
    kvl_xfer_release(x);
    kc_apply(c, KVL_WRITE, l, r);
    kc_check_remote(c, "a good transfer after the refused ones");
    snprintf(c->note, sizeof(c->note), "bounds (both sides), lengths, counts, empty, zero length, "
             "op, notification size, unknown agent and backend, never posted");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

typedef struct kc_scenario {
    const char *name;
    unsigned needs;              /* path flags it needs */
    const char *why_not;         /* said when a path lacks them */
    void (*run)(kc_case_t *c);
} kc_scenario_t;

static const kc_scenario_t kc_scenarios[] = {
    {"write", 0, NULL, sc_write},
    {"read", 0, NULL, sc_read},
    {"odd-sizes", 0, NULL, sc_odd_sizes},
    {"strided-write", 0, NULL, sc_strided_write},
    {"strided-read", 0, NULL, sc_strided_read},
    {"many-descs", 0, NULL, sc_many},
    {"in-flight", 0, NULL, sc_in_flight},
    {"notif-xfer", 0, NULL, sc_notif_xfer},
    {"notif-alone", 0, NULL, sc_notif_alone},
    {"repost", 0, NULL, sc_repost},
    {"poll", 0, NULL, sc_poll},
    {"peer-stopped", KC_NEEDS_PEER,
     "a transfer here completes without the target running (one-sided path)", sc_peer_stopped},
    {"cancel", 0, NULL, sc_cancel},
    {"release", 0, NULL, sc_release},
    {"prepped", 0, NULL, sc_prepped},
    {"adjacent", 0, NULL, sc_adjacent},
    {"bad-input", 0, NULL, sc_bad_input},
};
#define KC_NSCN (sizeof(kc_scenarios) / sizeof(kc_scenarios[0]))

/* ---- one case, in this process ---- */

static int kc_case_main(const char *pname, const char *sname)
{
    const kc_path_t *path = NULL;
    const kc_scenario_t *scn = NULL;
    for (size_t i = 0; i < KC_NPATHS; i++)
        if (strcmp(kc_paths[i].name, pname) == 0)
            path = &kc_paths[i];
    for (size_t i = 0; i < KC_NSCN; i++)
        if (strcmp(kc_scenarios[i].name, sname) == 0)
            scn = &kc_scenarios[i];
    if (path == NULL || scn == NULL) {
        fprintf(stderr, "unknown path '%s' or scenario '%s'\n", pname, sname);
        return 2;
    }
    if ((path->flags & scn->needs) != scn->needs)
        KT_SKIP("%s", scn->why_not);
    kc_case_t c;
    kc_open(&c, path);
    scn->run(&c);
    kc_close(&c);
    printf("note: %s\n", c.note);
    return 0;
}

/* ---- the runner: every case in a child, one line each ---- */

typedef struct kc_result {
    int code;                    /* 0 pass, 77 skip, else fail */
    char line[320];              /* note or skip reason */
} kc_result_t;

/* Last line of text that starts with tag, without the tag. */
static void kc_last_line(const char *text, const char *tag, char *out, size_t cap)
{
    const char *p = text, *hit = NULL;
    size_t tl = strlen(tag);
    out[0] = '\0';
    while (p && *p) {
        if (strncmp(p, tag, tl) == 0)
            hit = p + tl;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    if (hit) {
        size_t n = strcspn(hit, "\n");
        snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), hit);
    }
}

static void kc_print_indented(const char *text)
{
    const char *p = text;
    while (*p) {
        size_t n = strcspn(p, "\n");
        printf("    | %.*s\n", (int)n, p);
        p += n;
        if (*p == '\n')
            p++;
    }
}

static kc_result_t kc_spawn(const char *exe, const kc_path_t *path, const kc_scenario_t *scn)
{
    kc_result_t res = {1, ""};
    if ((path->flags & scn->needs) != scn->needs) {
        res.code = 77;
        snprintf(res.line, sizeof(res.line), "%s", scn->why_not);
        return res;
    }
    int fds[2];
    KT_CHECK(pipe2(fds, O_CLOEXEC) == 0);
    fflush(stdout);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        char *argv[] = {(char *)exe, "--case", (char *)path->name, (char *)scn->name, NULL};
        execv(exe, argv);
        _exit(5);
    }
    close(fds[1]);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap + 1);
    KT_CHECK(text != NULL);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int hung = 0;
    for (;;) {
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int r = poll(&pfd, 1, 1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0) {
            if (t.tv_sec - t0.tv_sec > KC_CASE_S) {
                hung = 1;
                kill(pid, SIGKILL);
                break;
            }
            continue;
        }
        char chunk[4096];
        ssize_t n = read(fds[0], chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (len + (size_t)n > cap) {            /* keep the tail */
            size_t drop = len + (size_t)n - cap;
            memmove(text, text + drop, len - drop);
            len -= drop;
        }
        memcpy(text + len, chunk, (size_t)n);
        len += (size_t)n;
    }
    close(fds[0]);
    text[len] = '\0';
    int status;
    waitpid(pid, &status, 0);
    if (hung) {
        res.code = 1;
        snprintf(res.line, sizeof(res.line), "no result after %d s: killed", KC_CASE_S);
    } else if (WIFEXITED(status)) {
        res.code = WEXITSTATUS(status);
        kc_last_line(text, res.code == 77 ? "SKIP: " : "note: ", res.line, sizeof(res.line));
    } else {
        res.code = 1;
        snprintf(res.line, sizeof(res.line), "killed by signal %d", WTERMSIG(status));
    }
    if (res.code != 0 && res.code != 77) {
        if (!res.line[0])
            snprintf(res.line, sizeof(res.line), "exit status %d", res.code);
        kc_print_indented(text);
    }
    free(text);
    return res;
}

static int kc_selected(int argc, char **argv, const char *name, int paths)
{
    int any = 0;
    for (int i = 1; i < argc; i++) {
        int is_path = 0;
        for (size_t k = 0; k < KC_NPATHS; k++)
            is_path |= strcmp(argv[i], kc_paths[k].name) == 0;
        if (is_path != paths)
            continue;
        any = 1;
        if (strcmp(argv[i], name) == 0)
            return 1;
    }
    return !any;
}

int main(int argc, char **argv)
{
    kt_ucx_sanitizer_env();
    if (argc == 4 && strcmp(argv[1], "--case") == 0)
        return kc_case_main(argv[2], argv[3]);
    for (int i = 1; i < argc; i++) {
        int known = 0;
        for (size_t k = 0; k < KC_NPATHS; k++)
            known |= strcmp(argv[i], kc_paths[k].name) == 0;
        for (size_t k = 0; k < KC_NSCN; k++)
            known |= strcmp(argv[i], kc_scenarios[k].name) == 0;
        if (!known) {
            fprintf(stderr, "usage: %s [PATH|SCENARIO]... | --case PATH SCENARIO\n"
                    "unknown path or scenario '%s'\n", argv[0], argv[i]);
            return 2;
        }
    }
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    KT_CHECK(el > 0);
    exe[el] = '\0';

    static char mark[KC_NSCN][KC_NPATHS];
    int pass = 0, fail = 0, skip = 0;
    memset(mark, '-', sizeof(mark));
    for (size_t pi = 0; pi < KC_NPATHS; pi++) {
        if (!kc_selected(argc, argv, kc_paths[pi].name, 1))
            continue;
        for (size_t si = 0; si < KC_NSCN; si++) {
            if (!kc_selected(argc, argv, kc_scenarios[si].name, 0))
                continue;
            kc_result_t r = kc_spawn(exe, &kc_paths[pi], &kc_scenarios[si]);
            const char *word = r.code == 0 ? "PASS" : r.code == 77 ? "SKIP" : "FAIL";
            mark[si][pi] = word[0];
            pass += r.code == 0;
            skip += r.code == 77;
            fail += r.code != 0 && r.code != 77;
            printf("%s  %-12s %-14s %s\n", word, kc_paths[pi].name, kc_scenarios[si].name,
                   r.line);
            fflush(stdout);
        }
    }

    /* the matrix: P pass, F fail, S skip, - not selected */
    printf("\n%-14s", "");
    for (size_t pi = 0; pi < KC_NPATHS; pi++)
        printf(pi + 1 < KC_NPATHS ? " %-11s" : " %s", kc_paths[pi].name);
    printf("\n");
    for (size_t si = 0; si < KC_NSCN; si++) {
        printf("%-14s", kc_scenarios[si].name);
        for (size_t pi = 0; pi < KC_NPATHS; pi++)
            printf(pi + 1 < KC_NPATHS ? " %-11c" : " %c", mark[si][pi]);
        printf("\n");
    }
    printf("\ncontract: %d passed, %d failed, %d skipped (%zu paths x %zu scenarios)\n", pass,
           fail, skip, KC_NPATHS, KC_NSCN);
    if (fail)
        return 1;
    if (pass == 0)
        KT_SKIP("no case could run here (see the reasons above)");
    return 0;
}
