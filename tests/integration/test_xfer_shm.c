/*
 * Two processes on one host over shm: register, exchange metadata, WRITE and
 * READ with plain and strided lists, notifications (alone and attached),
 * cancel and wait with a timeout; for each path: cross-memory attach, mapped
 * shareable memory, and the socket fallback.
 */
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common/kvltest.h"

#define BUF (8u << 20)

typedef struct {
    const char *label, *params;
    int shareable;
    const char *want_path;
} kt_mode_t;

static kvl_xfer_t *xfer_one(kvl_agent_t *a, kvl_xfer_op_t op, uint64_t laddr, const char *remote,
                            uint64_t raddr, uint64_t len, const char *notif)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    kvl_xfer_params_t p = {0};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, laddr, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, raddr, len, KVL_DEV_ANY));
    if (notif) {
        p.field_mask = KVL_XFER_PARAM_NOTIF;
        p.notif = notif;
        p.notif_len = strlen(notif);
    }
    KT_OK(kvl_xfer_create(a, op, l, remote, r, &p, &x));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return x;
}

static void run_done(kvl_xfer_t *x)
{
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 10000));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE);
}

static void run_mode(const kt_mode_t *m)
{
    printf("--- mode %s\n", m->label);
    kvl_agent_t *a = kt_agent("initiator", "shm", m->params);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .shareable = m->shareable};
    kt_peer_start(&p, &o, a);
    uint64_t lb = (uint64_t)(uintptr_t)buf;

    /* WRITE plain: 1 MiB at offset 4096 */
    kt_fill(buf, BUF, 11);
    kvl_xfer_t *x = xfer_one(a, KVL_WRITE, lb, "target", p.base + 4096, 1 << 20, NULL);
    run_done(x);
    kvl_xfer_stats_t s;
    KT_OK(kvl_xfer_get_stats(x, &s));
    printf("WRITE 1 MiB: backend %s path %s\n", s.backend, s.path);
    KT_CHECK(strcmp(s.backend, "shm") == 0);
    KT_CHECK(strstr(s.path, m->want_path) != NULL);
    KT_CHECK(s.bytes == 1 << 20);
    KT_CHECK(kt_peer_verify(&p, 4096, 1 << 20, 11) == -1);
    /* posting again moves the same bytes again */
    kt_peer_fill(&p, 99);
    run_done(x);
    KT_CHECK(kt_peer_verify(&p, 4096, 1 << 20, 11) == -1);
    kvl_xfer_release(x);

    /* WRITE strided both sides with different strides; blocks pair in order */
    kt_peer_fill(&p, 5);
    kvl_dlist_t *l, *r;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 4, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 4, &r));
    KT_OK(kvl_dlist_add_strided(l, lb, 65536, 32, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, p.base + (4u << 20), 8192, 16, 4096, KVL_DEV_ANY));
    for (int i = 0; i < 16; i++) /* remote side: 16 more as plain entries */
        KT_OK(kvl_dlist_add(r, p.base + (6u << 20) + (uint64_t)i * 4096, 4096, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "target", r, NULL, &x));
    run_done(x);
    KT_OK(kvl_xfer_get_stats(x, &s));
    KT_CHECK(s.blocks == 32 && s.bytes == 32 * 4096);
    kvl_xfer_release(x);
    uint8_t *chk = malloc(1 << 20);
    kt_peer_read(&p, 4u << 20, chk, 16 * 8192);
    for (int i = 0; i < 16; i++) {
        KT_CHECK(memcmp(chk + i * 8192, buf + (size_t)i * 65536, 4096) == 0);
        /* the gaps keep the peer's own pattern */
        uint8_t *exp = malloc(BUF);
        kt_fill(exp, BUF, 5);
        KT_CHECK(memcmp(chk + i * 8192 + 4096, exp + (4u << 20) + i * 8192 + 4096, 4096) == 0);
        free(exp);
    }
    kt_peer_read(&p, 6u << 20, chk, 16 * 4096); /* last 16 blocks, now contiguous */
    for (int i = 0; i < 16; i++)
        KT_CHECK(memcmp(chk + i * 4096, buf + (size_t)(16 + i) * 65536, 4096) == 0);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);

    /* READ: the peer's pattern lands in our buffer */
    kt_peer_fill(&p, 77);
    memset(buf, 0, BUF);
    x = xfer_one(a, KVL_READ, lb + 100, "target", p.base, 2 << 20, NULL);
    run_done(x);
    kvl_xfer_release(x);
    KT_CHECK(kt_verify(buf + 100, 2 << 20, 77) == -1);
    KT_CHECK(buf[99] == 0 && buf[100 + (2 << 20)] == 0);

    /* READ strided from the remote into a contiguous local range */
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, lb + (4u << 20), 8 * 1024, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, p.base, 65536, 8, 1024, KVL_DEV_ANY));
    /* 1 local entry of 8 KiB vs 8 remote blocks of 1 KiB: sizes differ */
    KT_STATUS(kvl_xfer_create(a, KVL_READ, l, "target", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("same length");
    kvl_dlist_destroy(l);
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_add_strided(l, lb + (4u << 20), 1024, 8, 1024, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_READ, l, "target", r, NULL, &x));
    run_done(x);
    kvl_xfer_release(x);
    uint8_t *exp = malloc(BUF);
    kt_fill(exp, BUF, 77);
    for (int i = 0; i < 8; i++)
        KT_CHECK(memcmp(buf + (4u << 20) + i * 1024, exp + (size_t)i * 65536, 1024) == 0);
    free(exp);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);

    /* notification alone */
    KT_OK(kvl_notif_send(a, "target", "hello", 5));
    char msg[256], from[64];
    KT_CHECK(kt_peer_notif(&p, 5000, msg, sizeof(msg), from, sizeof(from)) == 5);
    KT_CHECK(strcmp(msg, "hello") == 0 && strcmp(from, "initiator") == 0);

    /* attached notification arrives only with the data in place: the peer
     * checks the bytes right after it sees the notification */
    kt_fill(buf, BUF, 1234);
    x = xfer_one(a, KVL_WRITE, lb, "target", p.base, BUF, "kv-ready:42");
    KT_CHECK(kvl_xfer_post(x) >= 0);
    KT_CHECK(kt_peer_notif(&p, 10000, msg, sizeof(msg), from, sizeof(from)) == 11);
    KT_CHECK(strcmp(msg, "kv-ready:42") == 0);
    KT_CHECK(kt_peer_verify(&p, 0, BUF, 1234) == -1);
    KT_OK(kvl_xfer_wait(x, 10000));
    kvl_xfer_release(x);

    /* peer -> us: it loads our metadata and notifies us */
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(a, &blob, &blen));
    kt_peer_load(&p, blob, blen);
    kvl_free(blob);
    kt_peer_notify(&p, "initiator", "pong");
    KT_OK(kvl_notif_wait(a, 5000));
    kvl_notif_t n;
    size_t got;
    KT_OK(kvl_notif_poll(a, &n, 1, &got));
    KT_CHECK(got == 1 && n.len == 4 && memcmp(n.msg, "pong", 4) == 0 && strcmp(n.from, "target") == 0);
    kvl_notif_free(&n);

    /* cancel tells the truth: either cancelled (no notification ever) or
     * done (notification delivered) */
    int cancelled = 0, completed = 0;
    for (int round = 0; round < 6; round++) {
        x = xfer_one(a, KVL_WRITE, lb, "target", p.base, BUF, "must-not-arrive-if-cancelled");
        KT_CHECK(kvl_xfer_post(x) >= 0);
        if (round & 1)
            usleep(200);
        kvl_xfer_state_t st;
        KT_OK(kvl_xfer_cancel(x, &st));
        KT_CHECK(st == KVL_XFER_CANCELED || st == KVL_XFER_DONE);
        KT_CHECK(kvl_xfer_state(x) == st);
        long cnt = kt_peer_notif(&p, st == KVL_XFER_DONE ? 5000 : 300, msg, sizeof(msg), NULL, 0);
        if (st == KVL_XFER_CANCELED) {
            KT_CHECK(cnt == -1);
            KT_STATUS(kvl_xfer_test(x), KVL_ERR_CANCELED);
            cancelled++;
        } else {
            KT_CHECK(cnt > 0);
            completed++;
        }
        kvl_xfer_release(x);
    }
    printf("cancel: %d cancelled, %d completed first\n", cancelled, completed);
    KT_CHECK(kt_peer_notif_count(&p) == 0);

    /* wait with a timeout: a stopped peer cannot take socket data, so the
     * transfer is still moving when the wait gives up (socket path only:
     * cross-memory attach and mapped memory do not need the peer to run) */
    if (strcmp(m->want_path, "socket") == 0) {
        kt_peer_stop_signal(&p);
        x = xfer_one(a, KVL_WRITE, lb, "target", p.base, BUF, NULL);
        KT_CHECK(kvl_xfer_post(x) == KVL_IN_PROGRESS);
        KT_STATUS(kvl_xfer_wait(x, 200), KVL_ERR_TIMEOUT);
        KT_ERROR_HAS("not complete after 200 ms");
        KT_CHECK(kvl_xfer_test(x) == KVL_IN_PROGRESS);
        kill(p.pid, SIGCONT);
        KT_OK(kvl_xfer_wait(x, 10000));
        kvl_xfer_release(x);
    } else {
        x = xfer_one(a, KVL_WRITE, lb, "target", p.base, BUF, NULL);
        KT_CHECK(kvl_xfer_post(x) >= 0);
        kvl_status_t w = kvl_xfer_wait(x, 0);
        KT_CHECK(w == KVL_OK || w == KVL_ERR_TIMEOUT);
        KT_OK(kvl_xfer_wait(x, 10000));
        kvl_xfer_release(x);
    }

    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    munmap(buf, BUF);
    free(chk);
}

int main(void)
{
    static const kt_mode_t modes[] = {
        {"cross-memory attach", NULL, 0, "cma"},
        {"shareable memory (mmap)", NULL, 1, "mmap"},
        {"socket fallback", "cma=off", 0, "socket"},
    };
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
        run_mode(&modes[i]);
    printf("all modes passed\n");
    return 0;
}
