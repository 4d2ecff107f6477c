/*
 * ucx backend: a live peer that is silent for a while is not taken for dead
 * (issue 16 item 5). The target is stopped (SIGSTOP) while a WRITE to it is
 * in flight: that transfer ends with KVL_ERR_TIMEOUT after its own bound
 * (no progress from the peer), naming the peer, and only that transfer:
 * once the target is continued (SIGCONT), the next WRITE to it, with the
 * same metadata, succeeds and its bytes land. Then the same target is
 * killed: a transfer posted to it fails with KVL_ERR_REMOTE_DISCONNECT (UCX
 * found it dead), not a timeout of its 30 s bound. A notification sent to
 * the stopped target (from an agent whose bound is 1.5 s) gets no answer:
 * KVL_ERR_TIMEOUT saying it may or may not have been queued, never KVL_OK;
 * after SIGCONT it turns out queued, and the next one is answered.
 *
 * On UCX's default transports (shared memory) and on UCX_TLS=tcp. Times are
 * printed, not asserted (the waits are hang guards). Skips (77) without the
 * ucx module.
 * KVL_TEST_LABELS: ucx
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define BUF (32u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static kvl_xfer_t *mk(kvl_agent_t *a, uint64_t l, uint64_t r, uint64_t timeout_ms)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_TIMEOUT, .timeout_ms = timeout_ms};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add_strided(ld, l, 8192, BUF / 8192, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(rd, r, 8192, BUF / 8192, 4096, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, ld, "target", rd, &xp, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static kvl_status_t post_wait(kvl_xfer_t *x)
{
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_IN_PROGRESS || st == KVL_OK)
        st = kvl_xfer_wait(x, 120000);
    /* hang guard: the wait itself must not have run out */
    KT_CHECK(kvl_xfer_state(x) != KVL_XFER_POSTED);
    return st;
}

static void run_mode(const char *label, const char *params)
{
    char e[4096];
    printf("--- transports: %s\n", label);
    fflush(stdout);
    /* the agent's bound is long: only the transfer's own 1 s bound or UCX
     * may end a transfer here */
    kvl_agent_t *a = kt_agent_tmo("initiator", "ucx", params, 60000);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .backend = "ucx", .params = params,
                        .timeout_ms = 60000};
    kt_peer_start(&p, &o, a);
    kvl_xfer_t *x = mk(a, d.addr, p.base, 1000);
    kt_fill(buf, BUF, 5);
    KT_OK(post_wait(x)); /* connected and moving */
    size_t md_len;
    void *md = kt_peer_metadata(&p, &md_len);

    /* 1. silent: stopped with the transfer in flight */
    kt_fill(buf, BUF, 6);
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    kt_peer_stop_signal(&p);
    double t0 = now_s();
    st = kvl_xfer_wait(x, 120000);
    KT_CHECK(kvl_xfer_state(x) != KVL_XFER_POSTED);
    kvl_error_render(NULL, e, sizeof(e));
    printf("1. peer stopped: %s after %.2f s\n%s\n", kvl_status_name(st), now_s() - t0,
           st == KVL_OK ? "(finished before the stop took hold)" : e);
    if (st != KVL_OK) {
        KT_CHECK(st == KVL_ERR_TIMEOUT);
        KT_ERROR_HAS("target");
        KT_ERROR_HAS("no progress from the peer");
    }

    /* 1b. a notification to the stopped peer: no answer, so no KVL_OK; an
     * agent whose bound is 1.5 s sends it */
    kvl_agent_t *b = kt_agent_tmo("notifier", "ucx", params, 1500);
    KT_OK(kvl_metadata_load(b, md, md_len, NULL, 0));
    free(md);
    t0 = now_s();
    st = kvl_notif_send(b, "target", "while-stopped", 13);
    kvl_error_render(NULL, e, sizeof(e));
    printf("1b. notification to the stopped peer: %s after %.2f s\n%s\n", kvl_status_name(st),
           now_s() - t0, e);
    KT_STATUS(st, KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("notification to agent 'target'");
    KT_ERROR_HAS("no answer from the peer within the timeout");
    KT_ERROR_HAS("may or may not have been queued there");

    /* 2. continued: the same peer, the same metadata, works again */
    kill(p.pid, SIGCONT);
    {
        /* it was queued after all (the error said it might be) */
        char msg[64], from[64];
        long n = kt_peer_notif(&p, 30000, msg, sizeof(msg), from, sizeof(from));
        KT_CHECK(n == 13 && memcmp(msg, "while-stopped", 13) == 0 &&
                 strcmp(from, "notifier") == 0);
        KT_OK(kvl_notif_send(b, "target", "after", 5)); /* answered again */
        n = kt_peer_notif(&p, 30000, msg, sizeof(msg), from, sizeof(from));
        KT_CHECK(n == 5 && memcmp(msg, "after", 5) == 0);
    }
    kvl_agent_destroy(b);
    kt_fill(buf, BUF, 7);
    st = post_wait(x);
    if (st != KVL_OK) {
        kvl_error_render(NULL, e, sizeof(e));
        fprintf(stderr, "the transfer after SIGCONT failed: %s\n%s\n", kvl_status_name(st), e);
    }
    KT_OK(st);
    KT_CHECK(kt_peer_verify(&p, 0, 4096, 7) == -1);
    printf("2. peer continued: the next WRITE succeeded\n");

    /* 3. dead: UCX says so (keepalive or connection reset), not a timeout:
     * this transfer's bound is 30 s */
    kvl_xfer_t *x30 = mk(a, d.addr, p.base, 30000);
    kt_peer_kill(&p);
    t0 = now_s();
    st = post_wait(x30);
    kvl_xfer_release(x30);
    kvl_error_render(NULL, e, sizeof(e));
    printf("3. peer killed: %s after %.2f s\n%s\n", kvl_status_name(st), now_s() - t0, e);
    KT_CHECK(st == KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS("target");
    kvl_xfer_release(x);
    kvl_agent_destroy(a);
    munmap(buf, BUF);
}

int main(void)
{
    kt_need_ucx();
    /* UCX's keepalive every 200 ms (the agents' 60 s bound would make it
     * 15 s): a SIGSTOPped peer still passes it (its process is there), a
     * killed one fails it */
    setenv("UCX_KEEPALIVE_INTERVAL", "200ms", 1);
    run_mode("UCX default (shared memory)", NULL);
    run_mode("UCX_TLS=tcp", "tls=tcp");
    printf("PASS\n");
    return 0;
}
