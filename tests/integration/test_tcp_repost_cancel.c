/*
 * tcp: cancelling a transfer that was posted again right after it completed.
 * The progress thread reports a finished transfer to the core (xfer_done)
 * before it takes that transfer's record off the peer's list; a kvl_xfer_post
 * of the same transfer in that window adds a second record for the same
 * kvl_xfer_t. A cancel then must stop the new post, not wait for the old
 * record and return with the new post still moving.
 *
 * Made deterministic with two wraps, no sleeps:
 *   - pthread_mutex_unlock: the progress thread, unlocking the transfer's
 *     lock once the core has marked the first post DONE, stops there (that
 *     is, inside the window) until the test lets it go;
 *   - pthread_cond_wait: the test thread's first wait inside
 *     kvl_xfer_cancel (the backend waiting for the transfer to end) lets the
 *     progress thread go.
 * The target is SIGSTOPped before the second post, so nothing but the cancel
 * can end the second post while the test looks at it.
 * KVL_TEST_WRAP: pthread_mutex_unlock pthread_cond_wait
 * KVL_TEST_LABELS: tcp
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include "common/kvltest.h"
#include "core/internal.h"

#define LEN (64u << 10)

int __real_pthread_mutex_unlock(pthread_mutex_t *m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t *m);
int __real_pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m);
int __wrap_pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m);

static pthread_t g_main;
static kvl_xfer_t *g_x;
static atomic_int g_pause_armed, g_go_armed;
static sem_t g_paused, g_go;

static int sem_wait_s(sem_t *s, int secs)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += secs;
    int rc;
    while ((rc = sem_timedwait(s, &ts)) != 0 && errno == EINTR)
        ;
    return rc;
}

int __wrap_pthread_mutex_unlock(pthread_mutex_t *m)
{
    int rc = __real_pthread_mutex_unlock(m);
    if (g_x != NULL && m == &g_x->lock && !pthread_equal(pthread_self(), g_main) &&
        atomic_load(&g_x->state) == KVL_XFER_DONE && atomic_exchange(&g_pause_armed, 0)) {
        sem_post(&g_paused);
        /* bounded: a test that never lets it go still ends */
        (void)sem_wait_s(&g_go, 20);
    }
    return rc;
}

int __wrap_pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
    if (pthread_equal(pthread_self(), g_main) && atomic_exchange(&g_go_armed, 0))
        sem_post(&g_go);
    return __real_pthread_cond_wait(c, m);
}

int main(void)
{
    g_main = pthread_self();
    KT_CHECK(sem_init(&g_paused, 0, 0) == 0 && sem_init(&g_go, 0, 0) == 0);
    kvl_agent_t *a = kt_agent_tmo("init", "tcp", "host=127.0.0.1", 20000);
    uint8_t *buf = calloc(1, LEN);
    KT_CHECK(buf != NULL);
    kt_fill(buf, LEN, 5);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = "tgt", .len = LEN, .backend = "tcp", .params = "host=127.0.0.1",
                        .timeout_ms = 20000};
    kt_peer_t p;
    kt_peer_start(&p, &o, a);

    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add(ld, d.addr, LEN, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(rd, p.base, LEN, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, ld, "tgt", rd, NULL, &x));

    /* 1. the first post completes; the progress thread stops right after
     *    reporting it */
    g_x = x;
    atomic_store(&g_pause_armed, 1);
    kvl_status_t s = kvl_xfer_post(x);
    KT_CHECK(s == KVL_OK || s == KVL_IN_PROGRESS);
    KT_CHECK(sem_wait_s(&g_paused, 20) == 0);
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE);
    KT_CHECK(kt_peer_verify(&p, 0, LEN, 5) == -1);

    /* 2. the target stops answering; the transfer is posted again and
     *    cancelled while the first post's record is still listed */
    kt_peer_stop_signal(&p);
    s = kvl_xfer_post(x);
    KT_CHECK(s == KVL_OK || s == KVL_IN_PROGRESS);
    atomic_store(&g_go_armed, 1);
    kvl_xfer_state_t st = KVL_XFER_POSTED;
    s = kvl_xfer_cancel(x, &st);
    KT_CHECK(atomic_load(&g_go_armed) == 0); /* the cancel waited, and let the thread go */
    printf("cancel of the second post: %s, state %d (posted %d, canceled %d)\n",
           kvl_status_name(s), (int)st, (int)KVL_XFER_POSTED, (int)KVL_XFER_CANCELED);
    int still_posted = st == KVL_XFER_POSTED;

    /* clean up either way: the target resumes, the transfer ends */
    kill(p.pid, SIGCONT);
    if (kvl_xfer_state(x) == KVL_XFER_POSTED)
        (void)kvl_xfer_wait(x, 20000);
    KT_CHECK(!still_posted); /* kvl_xfer_cancel returned with the transfer still moving */
    KT_CHECK(st == KVL_XFER_CANCELED);
    KT_CHECK(s == KVL_OK);

    kvl_xfer_release(x);
    g_x = NULL;
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    free(buf);
    printf("test_tcp_repost_cancel: ok\n");
    return 0;
}
