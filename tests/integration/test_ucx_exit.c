/*
 * ucx teardown: no "destroying inuse region", no leak or release warnings
 * from UCX, no abort, at any exit:
 *   1. exit() without kvl_agent_destroy, with live registrations (two,
 *      overlapping), a remote agent and a transfer in flight;
 *   2. kvl_agent_destroy with all of that live;
 *   3. a backend whose open fails (UCX_TLS=rc) next to a working one;
 *   4. exit() with a transfer outstanding to a peer that was just killed
 *      (SIGKILL), before UCX noticed (keepalive set to a minute, agent
 *      timeout 20 s): the exit must not wait for UCX to find the peer dead.
 *      Ten times; the time from exit() to the child's end is printed
 *      (median, max) and bounded only as a hang guard (5 s; closing the
 *      endpoints with a flush used to wait the full 20 s here);
 *   5. kvl_agent_destroy with a transfer outstanding to a peer just killed,
 *   6. ... to a peer stopped with SIGSTOP (alive to UCX, silent): destroy
 *      gives the transfer up (xfer_abort) instead of waiting for the peer;
 *      timed around destroy, ten times each, the same 5 s hang guard
 *      (cancel-and-wait took the agent's 20 s).
 * Each scenario runs in a child whose stderr (UCX logs there, at
 * UCX_LOG_LEVEL=warn) is captured and checked. Under ASan the child's
 * leak check runs too. Skips (77) without the ucx module.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define LEN (32u << 20)

static char exit_stamp[128];
static kvl_xfer_t *x_live;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* kill_first 1: the peer is killed before the transfer is posted, so the
 * transfer is outstanding to a dead peer (UCX has not noticed yet); 2: it
 * is stopped (SIGSTOP) instead, alive to UCX but silent. */
static kvl_agent_t *busy_agent(kt_peer_t *p, uint64_t timeout_ms, int kill_first)
{
    kvl_agent_t *a = kt_agent_tmo("leaver", "ucx", NULL, timeout_ms);
    uint8_t *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_mem_desc_t d2 = {(uint64_t)(uintptr_t)buf, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d2, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = "stayer", .len = LEN, .backend = "ucx"};
    kt_peer_start(p, &o, a);
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add_strided(l, d.addr, 8192, LEN / 8192, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, p->base, 8192, LEN / 8192, 4096, KVL_DEV_ANY));
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = "bye", .notif_len = 3};
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "stayer", r, &xp, &x));
    x_live = x;
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    if (kill_first) {
        /* UCX may or may not have noticed by the time we post: either way
         * the exit below must be quick and clean */
        if (kill_first == 1)
            kt_peer_kill(p);
        else
            kt_peer_stop_signal(p);
        kvl_xfer_post(x);
        return a;
    }
    KT_CHECK(kvl_xfer_post(x) >= 0);
    return a;
}

static void scenario(int which)
{
    kt_peer_t p;
    kvl_agent_t *a;
    switch (which) {
    case 1:
        busy_agent(&p, 3000, 0);
        exit(0);
    case 2:
        a = busy_agent(&p, 3000, 0);
        kvl_agent_destroy(a);
        kt_peer_stop(&p);
        exit(0);
    case 4: {
        /* the peer is gone, UCX does not know yet: no keepalive for a
         * minute, and the agent's bound is 20 s */
        a = busy_agent(&p, 20000, 1);
        printf("transfer %s at exit\n", kvl_xfer_state(x_live) == KVL_XFER_POSTED
               ? "outstanding" : "already ended");
        FILE *f = fopen(exit_stamp, "w");
        KT_CHECK(f != NULL);
        fprintf(f, "%llu\n", (unsigned long long)now_ns());
        fclose(f);
        exit(0);
    }
    case 5:
    case 6: {
        /* kvl_agent_destroy with the transfer outstanding to a peer just
         * killed (5) or stopped (6): timed around destroy alone */
        a = busy_agent(&p, 20000, which == 5 ? 1 : 2);
        printf("transfer %s at destroy\n", kvl_xfer_state(x_live) == KVL_XFER_POSTED
               ? "outstanding" : "already ended");
        uint64_t t0 = now_ns();
        kvl_agent_destroy(a);
        uint64_t t1 = now_ns();
        if (which == 6)
            kt_peer_kill(&p);
        FILE *f = fopen(exit_stamp, "w");
        KT_CHECK(f != NULL);
        fprintf(f, "%llu\n", (unsigned long long)(t1 - t0));
        fclose(f);
        exit(0);
    }
    default:
        a = kt_agent("half", "shm", NULL);
        setenv("UCX_TLS", "rc", 1);
        KT_CHECK(kvl_backend_create(a, "ucx", NULL, 0, NULL) != KVL_OK);
        unsetenv("UCX_TLS");
        {
            uint8_t *b = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            kvl_mem_desc_t d = {(uint64_t)(uintptr_t)b, 1 << 20, KVL_DEV_ANY};
            KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
        }
        exit(0);
    }
}

int main(void)
{
    kt_need_ucx();
    setenv("UCX_LOG_LEVEL", "warn", 1);
    kt_clean_exit(scenario, 1, "exit() without kvl_agent_destroy, registrations and a transfer live");
    kt_clean_exit(scenario, 2, "kvl_agent_destroy with registrations, remote and a transfer live");
    kt_clean_exit(scenario, 3, "ucx open fails (UCX_TLS=rc) beside shm, then exit");

    setenv("UCX_KEEPALIVE_INTERVAL", "60s", 1);
    snprintf(exit_stamp, sizeof(exit_stamp), "/tmp/kvl-ucx-exit-%d.t", (int)getpid());
    static const char *const what[] = {
        "exit() with a transfer outstanding to a peer just killed",
        "kvl_agent_destroy with a transfer outstanding to a peer just killed",
        "kvl_agent_destroy with a transfer outstanding to a stopped peer"};
    for (int sc = 4; sc <= 6; sc++) {
        double ms[10];
        int n = (int)(sizeof(ms) / sizeof(ms[0]));
        for (int i = 0; i < n; i++) {
            kt_clean_exit(scenario, sc, what[sc - 4]);
            uint64_t end = now_ns();
            unsigned long long v = 0;
            FILE *f = fopen(exit_stamp, "r");
            KT_CHECK(f != NULL && fscanf(f, "%llu", &v) == 1);
            fclose(f);
            unlink(exit_stamp);
            ms[i] = (double)(sc == 4 ? end - v : v) / 1e6;
            printf("took %.1f ms\n", ms[i]);
            KT_CHECK(ms[i] < 5000.0); /* hang guard, not a speed check */
        }
        for (int i = 1; i < n; i++) /* sort for the median */
            for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                double t = ms[j];
                ms[j] = ms[j - 1];
                ms[j - 1] = t;
            }
        printf("%s: median %.1f ms, max %.1f ms (%d runs)\n", what[sc - 4],
               (ms[n / 2 - 1] + ms[n / 2]) / 2, ms[n - 1], n);
    }
    printf("PASS\n");
    return 0;
}
