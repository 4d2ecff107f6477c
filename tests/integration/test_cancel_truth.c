/*
 * Cancel and failure never lie (issue 16 item 3), on the paths whose target
 * copies the bytes itself: tcp, and shm over its socket (cma=off).
 *
 * The target is a real process, stopped with SIGSTOP before a 64 MiB WRITE
 * is posted, so the WRITE's first bytes sit in socket buffers that nobody
 * reads. Then, per case:
 *   cancel   kvl_xfer_cancel after 200 ms: CANCELED only if nothing of the
 *            transfer can land; else an error that says bytes may still land
 *            and how many ("up to N bytes").
 *   fail     no cancel: the transfer must end (its timeout is 1.5 s, the
 *            agent's 120 s: a wait bounded by 60 s proves the transfer's own
 *            timeout is honoured) in an error that says the same.
 *   small    a cancelled 64 KiB WRITE, all of it handed to the socket
 *            (kct_small says what each path does with it);
 *   destroy  kvl_agent_destroy with the transfer live must return while the
 *            target is still stopped (it cannot wait for it: the transfer's
 *            and the agent's timeouts are 120 s; the hang guard is 60 s).
 * In every case the target is resumed (SIGCONT) once the initiator has given
 * up, and we wait until it has read to the end of the connection (its socket
 * closes: seen in /proc/<pid>/fd, no timing). Then its buffer must hold no
 * byte of the transfer: the initiator reset or shut the connection while
 * the target was stopped, and a target drops the data of a connection its
 * initiator abandoned before copying it (tcp protocol 2, shm protocol 4).
 * Whatever an error claims may land bounds what did land.
 *
 * Nothing is timed: the waits are bounded only so that a hang fails.
 * KVL_TEST_LABELS: tcp
 */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define LEN (64u << 20)
#define LONG_MS 120000u        /* agent and target timeouts: never reached */
#define XFER_TMO_MS 1500u      /* the transfer's own timeout */
#define GUARD_S 60u            /* hang guard of one step */
#define SOCKS_MAX 64

typedef struct kct_path {
    const char *name, *backend, *params, *peer_params;
} kct_path_t;

static const kct_path_t kct_paths[] = {
    {"tcp", "tcp", "host=127.0.0.1", "host=127.0.0.1"},
    {"shm/socket", "shm", "cma=off", NULL},
};

typedef struct kct_case {
    const kct_path_t *path;
    kvl_agent_t *a;
    kt_peer_t p;
    uint8_t *buf;
    unsigned long socks[SOCKS_MAX];   /* the target's sockets once connected */
    int nsocks;
} kct_case_t;

static double kct_ms(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Inodes of the sockets process pid holds. */
static int kct_sockets(pid_t pid, unsigned long *ino, int max)
{
    char dir[64], path[128], link[128];
    struct dirent *e;
    int n = 0;
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    KT_CHECK(d != NULL);
    while ((e = readdir(d)) != NULL && n < max) {
        ssize_t l;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%.32s", dir, e->d_name);
        l = readlink(path, link, sizeof(link) - 1);
        if (l <= 0)
            continue;
        link[l] = '\0';
        if (strncmp(link, "socket:[", 8) == 0)
            ino[n++] = strtoul(link + 8, NULL, 10);
    }
    closedir(d);
    return n;
}

/* After SIGCONT: wait until one socket the target held once connected is
 * closed, i.e. it read the abandoned connection to its end. */
static void kct_target_drained(kct_case_t *c)
{
    for (unsigned i = 0; i < GUARD_S * 100u; i++) {
        unsigned long now[SOCKS_MAX];
        int n = kct_sockets(c->p.pid, now, SOCKS_MAX), gone = 0;
        for (int k = 0; k < c->nsocks; k++) {
            int still = 0;
            for (int j = 0; j < n; j++)
                still |= now[j] == c->socks[k];
            gone += !still;
        }
        if (gone > 0)
            return;
        usleep(10000);
    }
    fprintf(stderr, "the target did not close the abandoned connection within %u s\n",
            GUARD_S);
    kt_fail_at(__FILE__, __LINE__, "target drained", 0);
}

/* Bytes of the target's buffer the WRITE reached (it starts zero, our
 * source holds no zero byte). */
static uint64_t kct_landed(kct_case_t *c)
{
    uint64_t landed = 0;
    uint8_t *tmp = malloc(8u << 20);
    KT_CHECK(tmp != NULL);
    for (uint64_t off = 0; off < LEN; off += 8u << 20) {
        kt_peer_read(&c->p, off, tmp, 8u << 20);
        for (size_t i = 0; i < (8u << 20); i++)
            landed += tmp[i] != 0;
    }
    free(tmp);
    return landed;
}

static void kct_open(kct_case_t *c, const kct_path_t *path)
{
    memset(c, 0, sizeof(*c));
    c->path = path;
    c->a = kt_agent_tmo("initiator", path->backend, path->params, LONG_MS);
    c->buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(c->buf != MAP_FAILED);
    memset(c->buf, 0x5a, LEN);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)c->buf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(c->a, &d, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = "target", .len = LEN, .backend = path->backend,
                        .params = path->peer_params, .timeout_ms = LONG_MS};
    kt_peer_start(&c->p, &o, c->a);
    /* one READ round trip: the target has accepted our connection */
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, (uint64_t)(uintptr_t)c->buf, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, c->p.base, 4096, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(c->a, KVL_READ, l, "target", r, NULL, &x));
    KT_CHECK(kvl_xfer_post(x) >= 0);
    KT_OK(kvl_xfer_wait(x, (int64_t)GUARD_S * 1000));
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    memset(c->buf, 0x5a, 4096);
    c->nsocks = kct_sockets(c->p.pid, c->socks, SOCKS_MAX);
}

/* A WRITE of len bytes (from offset 0 to 0), posted with the target stopped. */
static kvl_xfer_t *kct_post_len(kct_case_t *c, uint64_t len, uint64_t timeout_ms)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    kvl_xfer_params_t prm = {.field_mask = KVL_XFER_PARAM_TIMEOUT, .timeout_ms = timeout_ms};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, (uint64_t)(uintptr_t)c->buf, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, c->p.base, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(c->a, KVL_WRITE, l, "target", r, &prm, &x));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kt_peer_stop_signal(&c->p);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    return x;
}

/* The 64 MiB WRITE: more than every socket buffer holds. */
static kvl_xfer_t *kct_post_stopped(kct_case_t *c, uint64_t timeout_ms)
{
    return kct_post_len(c, LEN, timeout_ms);
}

/* A transfer that ended without completing: CANCELED claims nothing can
 * land (*bound_p 0); an error must say what may ("up to N bytes ... may
 * still land", *bound_p N) or that nothing can. */
static void kct_judge(kct_case_t *c, kvl_xfer_t *x, const char *what, uint64_t *bound_p)
{
    char text[16384];
    kvl_xfer_state_t st = kvl_xfer_state(x);
    kvl_status_t s = kvl_xfer_test(x);
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s %s: state %d, %s\n  %s\n", c->path->name, what, (int)st, kvl_status_name(s), text);
    KT_CHECK(st == KVL_XFER_CANCELED || st == KVL_XFER_ERROR);
    *bound_p = 0;
    if (st == KVL_XFER_CANCELED)
        return;
    const char *up = strstr(text, "up to ");
    if (up != NULL && strstr(up, "may still land") != NULL) {
        *bound_p = strtoull(up + 6, NULL, 10);
        KT_CHECK(*bound_p > 0 && *bound_p <= LEN);
    } else if (strstr(text, "none of its bytes can land") == NULL) {
        fprintf(stderr, "%s: the error neither bounds what may still land nor says that "
                "nothing can\n", what);
        kt_fail_at(__FILE__, __LINE__, "error text", 0);
    }
}

/* Resume the target, let it read the abandoned connection, count. */
static void kct_check_landed(kct_case_t *c, const char *what, uint64_t bound)
{
    kill(c->p.pid, SIGCONT);
    kct_target_drained(c);
    uint64_t landed = kct_landed(c);
    printf("%s %s: %" PRIu64 " bytes landed after SIGCONT (bound claimed: %" PRIu64 ")\n",
           c->path->name, what, landed, bound);
    if (landed > bound) {
        fprintf(stderr, "%s: %" PRIu64 " bytes landed after the transfer ended, it claimed at "
                "most %" PRIu64 "\n", what, landed, bound);
        kt_fail_at(__FILE__, __LINE__, "landed within the claim", 0);
    }
    if (landed != 0) {
        fprintf(stderr, "%s: the target wrote %" PRIu64 " bytes of a connection its initiator "
                "had abandoned\n", what, landed);
        kt_fail_at(__FILE__, __LINE__, "abandoned data dropped", 0);
    }
}

static void kct_close(kct_case_t *c)
{
    kt_peer_stop(&c->p);
    if (c->a != NULL)
        kvl_agent_destroy(c->a);
    munmap(c->buf, LEN);
}

static void kct_cancel(const kct_path_t *path)
{
    kct_case_t c;
    kvl_xfer_state_t st;
    uint64_t bound;
    kct_open(&c, path);
    kvl_xfer_t *x = kct_post_stopped(&c, XFER_TMO_MS);
    usleep(200000); /* how far it got changes nothing that is checked */
    alarm(GUARD_S);
    kvl_status_t s = kvl_xfer_cancel(x, &st);
    alarm(0);
    KT_CHECK(st == KVL_XFER_CANCELED || st == KVL_XFER_ERROR);
    KT_CHECK((s == KVL_OK) == (st == KVL_XFER_CANCELED));
    kct_judge(&c, x, "cancel", &bound);
    kct_check_landed(&c, "cancel", bound);
    kvl_xfer_release(x);
    kct_close(&c);
}

static void kct_fail(const kct_path_t *path)
{
    kct_case_t c;
    uint64_t bound;
    kct_open(&c, path);
    kvl_xfer_t *x = kct_post_stopped(&c, XFER_TMO_MS);
    /* the transfer's 1.5 s, not the agent's 120 s, must end it */
    kvl_status_t s = kvl_xfer_wait(x, (int64_t)GUARD_S * 1000);
    if (kvl_xfer_state(x) == KVL_XFER_POSTED) {
        fprintf(stderr, "%s: the transfer was still in flight after %u s: its %u ms timeout "
                "was not honoured\n", path->name, GUARD_S, XFER_TMO_MS);
        kt_fail_at(__FILE__, __LINE__, "transfer timeout honoured", 0);
    }
    KT_CHECK(s != KVL_OK);
    kct_judge(&c, x, "fail", &bound);
    kct_check_landed(&c, "fail", bound);
    kvl_xfer_release(x);
    kct_close(&c);
}

/*
 * A small WRITE (64 KiB: it fits the socket buffers, every byte is handed
 * over) cancelled while the target is stopped. tcp gives the connection up
 * (reset): nothing may land. shm's socket path keeps the connection when
 * only answers are missing: the cancel ends in KVL_ERR_TIMEOUT saying how
 * much may still land, and it does land once the target runs; we wait for
 * that with a READ on the same connection (served in order), then compare.
 */
static void kct_small(const kct_path_t *path)
{
    kct_case_t c;
    kvl_xfer_state_t st;
    uint64_t bound;
    const uint64_t small = 64u << 10;
    kct_open(&c, path);
    kvl_xfer_t *x = kct_post_len(&c, small, XFER_TMO_MS);
    usleep(200000);
    alarm(GUARD_S);
    kvl_xfer_cancel(x, &st);
    alarm(0);
    kct_judge(&c, x, "small", &bound);
    KT_CHECK(bound <= small);
    if (kvl_xfer_test(x) != KVL_ERR_TIMEOUT) {
        kct_check_landed(&c, "small", bound); /* the connection was given up */
    } else {
        kill(c.p.pid, SIGCONT);
        kvl_dlist_t *l, *r;
        kvl_xfer_t *rd;
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
        KT_OK(kvl_dlist_add(l, (uint64_t)(uintptr_t)c.buf + LEN - 4096, 4096, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, c.p.base + LEN - 4096, 4096, KVL_DEV_ANY));
        KT_OK(kvl_xfer_create(c.a, KVL_READ, l, "target", r, NULL, &rd));
        KT_CHECK(kvl_xfer_post(rd) >= 0);
        KT_OK(kvl_xfer_wait(rd, (int64_t)GUARD_S * 1000));
        kvl_xfer_release(rd);
        kvl_dlist_destroy(l);
        kvl_dlist_destroy(r);
        uint64_t landed = kct_landed(&c);
        printf("%s small: %" PRIu64 " bytes landed after SIGCONT (bound claimed: %" PRIu64
               ")\n", path->name, landed, bound);
        KT_CHECK(landed <= bound);
    }
    kvl_xfer_release(x);
    kct_close(&c);
}

static void kct_destroy(const kct_path_t *path)
{
    kct_case_t c;
    struct timespec t0;
    kct_open(&c, path);
    kct_post_stopped(&c, LONG_MS);
    usleep(200000);
    alarm(GUARD_S);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvl_agent_destroy(c.a);
    double ms = kct_ms(&t0);
    alarm(0);
    c.a = NULL;
    printf("%s destroy: kvl_agent_destroy with a live WRITE to a stopped target returned in "
           "%.1f ms\n", path->name, ms);
    kct_check_landed(&c, "destroy", 0);
    kct_close(&c);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(const kct_path_t *);
    } cases[] = {{"cancel", kct_cancel}, {"fail", kct_fail}, {"small", kct_small},
                   {"destroy", kct_destroy}};
    char why[256];
    int ran = 0;
    signal(SIGPIPE, SIG_IGN);
    for (size_t pi = 0; pi < sizeof(kct_paths) / sizeof(kct_paths[0]); pi++) {
        const kct_path_t *path = &kct_paths[pi];
        if (kvl_backend_available(path->backend, why, sizeof(why)) != KVL_OK) {
            printf("%s: backend not available: %s\n", path->name, why);
            continue;
        }
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            if (argc > 1 && strcmp(argv[1], cases[ci].name) != 0 &&
                strcmp(argv[1], path->name) != 0)
                continue;
            printf("== %s %s\n", path->name, cases[ci].name);
            fflush(stdout);
            cases[ci].run(path);
            ran++;
        }
    }
    if (ran == 0)
        KT_SKIP("no backend path could run here");
    printf("cancel and failure told the truth on %d case(s)\n", ran);
    return 0;
}
