/*
 * The progress thread every backend runs (shared layer): see progress.h.
 */
#define _GNU_SOURCE
#include "progress.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include "errname.h"
#include "wake.h"

void kvli_progress_init(kvli_progress_t *pg, kvl_bk_ctx_t *ctx, const char *bk)
{
    memset(pg, 0, sizeof(*pg));
    pg->ctx = ctx;
    pg->bk = bk;
    pg->wake_fd = -1;
    atomic_init(&pg->stopping, 0);
    atomic_init(&pg->asleep, 0);
}

kvl_status_t kvli_progress_open(kvli_progress_t *pg, kvl_error_t *err)
{
    pg->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (pg->wake_fd < 0) {
        int e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, pg->bk, -1,
                         "eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) = -1 %s (%s)",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n)");
        return KVL_ERR_SYSTEM;
    }
    return KVL_OK;
}

int kvli_pollset_reserve(kvli_progress_t *pg, kvli_pollset_t *ps, size_t need)
{
    struct pollfd *np;
    void **nw;
    if (need <= ps->cap)
        return 0;
    np = realloc(ps->pfd, need * sizeof(*np));
    if (np != NULL)
        ps->pfd = np;
    nw = realloc(ps->who, need * sizeof(*nw));
    if (nw != NULL)
        ps->who = nw;
    if (np == NULL || nw == NULL) {
        pg->ctx->log(pg->ctx, KVL_LOG_ERROR, "%s: realloc() of the poll set (%zu slots) "
                     "failed; retrying in 10 ms", pg->bk, need);
        return -1;
    }
    ps->cap = need;
    return 0;
}

static void kvli_progress_nap(void)
{
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
}

static void *kvli_progress_main(void *arg)
{
    kvli_progress_t *pg = arg;
    kvli_pollset_t *ps = &pg->ps;
    /* Timed waits end when asked, not up to 50 us late (the default slack):
     * backends poll copy engines and timers at microsecond periods. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    while (!atomic_load(&pg->stopping)) {
        struct timespec ts;
        int64_t wait;
        ps->n = 0;
        if (kvli_pollset_reserve(pg, ps, 1) != 0) {
            kvli_progress_nap();
            continue;
        }
        kvli_pollset_add(ps, pg->wake_fd, POLLIN, NULL);
        wait = pg->ops->prepare(pg->arg, ps);
        if (wait == KVLI_PROGRESS_STOP)
            break;
        if (wait == KVLI_PROGRESS_AGAIN)
            continue;
        if (wait == KVLI_PROGRESS_BACKOFF) {
            kvli_progress_nap();
            continue;
        }
        if (wait >= 0) {
            ts.tv_sec = (time_t)(wait / 1000000000);
            ts.tv_nsec = (long)(wait % 1000000000);
        } else if (pg->ops->busy != NULL) {
            /* posters skip the wake while we do not sleep (kvli_progress_kick) */
            atomic_store(&pg->asleep, 1);
            if (pg->ops->busy(pg->arg)) {
                atomic_store(&pg->asleep, 0);
                continue;
            }
        }
        int pr = ppoll(ps->pfd, (nfds_t)ps->n, wait >= 0 ? &ts : NULL, NULL);
        atomic_store(&pg->asleep, 0);
        if (pr < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            pg->ctx->log(pg->ctx, KVL_LOG_ERROR, "%s: ppoll() of %zu descriptors = -1 %s (%s) "
                         "in the progress thread; retrying in 10 ms", pg->bk, ps->n,
                         kvli_errno_name(e), strerror(e));
            kvli_progress_nap();
            continue;
        }
        if (ps->pfd[0].revents & POLLIN)
            kvli_wake_drain(pg->wake_fd);
        pg->ops->dispatch(pg->arg, ps);
    }
    return NULL;
}

kvl_status_t kvli_progress_start(kvli_progress_t *pg, const kvli_progress_ops_t *ops, void *arg,
                                 kvl_error_t *err)
{
    int e;
    pg->ops = ops;
    pg->arg = arg;
    e = pthread_create(&pg->thread, NULL, kvli_progress_main, pg);
    if (e != 0) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, pg->bk, -1,
                         "pthread_create(progress thread) = %s (%s)", kvli_errno_name(e),
                         strerror(e));
        kvl_bk_error_hint(err, "check the thread limit (ulimit -u, pids cgroup)");
        return KVL_ERR_SYSTEM;
    }
    pg->started = 1;
    return KVL_OK;
}

void kvli_progress_wake(const kvli_progress_t *pg)
{
    if (pg->wake_fd >= 0)
        kvli_wake(pg->wake_fd);
}

void kvli_progress_kick(kvli_progress_t *pg)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (pg->ops == NULL || pg->ops->busy == NULL || atomic_load(&pg->asleep))
        kvli_progress_wake(pg);
}

void kvli_progress_stop(kvli_progress_t *pg)
{
    atomic_store(&pg->stopping, 1);
    kvli_progress_wake(pg);
    if (pg->started && !pg->joined) {
        pthread_join(pg->thread, NULL);
        pg->joined = 1; /* started stays set: other threads may read it */
    }
}

void kvli_progress_close(kvli_progress_t *pg)
{
    if (pg->wake_fd >= 0)
        close(pg->wake_fd);
    pg->wake_fd = -1;
    free(pg->ps.pfd);
    free(pg->ps.who);
    memset(&pg->ps, 0, sizeof(pg->ps));
}
