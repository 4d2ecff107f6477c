/*
 * The progress thread every backend runs (shared layer).
 *
 * One thread per backend instance waits in ppoll() on its wake eventfd and
 * on whatever descriptors the backend adds to the poll set each turn. A
 * turn is:
 *   1. ops->prepare(): do the work that needs no event, fill the poll set
 *      (slot 0 is the wake fd, already there) and say how long to wait;
 *   2. ppoll() for that long (a failure is logged, the loop backs off 10 ms);
 *   3. the wake counter is reset when it fired; ops->dispatch() serves the
 *      slots that fired.
 * Any thread wakes the loop with kvli_progress_wake(); kvli_progress_stop()
 * sets the stop flag, wakes the thread and joins it. The stop flag is the
 * backend's too: its other threads (copy workers, waiters) read it with
 * kvli_progress_stopping().
 */
#ifndef KVLI_PROGRESS_H
#define KVLI_PROGRESS_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <kvlane/backend.h>

/* What prepare() returns besides a wait in nanoseconds (>= 0). */
#define KVLI_PROGRESS_FOREVER (-1)  /* wait until an fd fires */
#define KVLI_PROGRESS_AGAIN (-2)    /* skip the wait: run prepare() again now */
#define KVLI_PROGRESS_BACKOFF (-3)  /* something failed (logged): retry in 10 ms */
#define KVLI_PROGRESS_STOP (-4)     /* leave the loop */

typedef struct kvli_pollset {
    struct pollfd *pfd;
    void **who;                      /* the owner of each slot (backend's) */
    size_t n, cap;
} kvli_pollset_t;

typedef struct kvli_progress_ops {
    int64_t (*prepare)(void *arg, kvli_pollset_t *ps);
    void (*dispatch)(void *arg, kvli_pollset_t *ps);
    /* Optional: is work waiting that prepare() has not seen (under the
     * lock posters publish it with)? With it, kvli_progress_kick() wakes
     * the thread only when it sleeps without a bound. */
    int (*busy)(void *arg);
} kvli_progress_ops_t;

typedef struct kvli_progress {
    kvl_bk_ctx_t *ctx;               /* for the log */
    const char *bk;                  /* backend name, in messages */
    const kvli_progress_ops_t *ops;
    void *arg;
    int wake_fd;                     /* eventfd; -1 before open */
    int started;                     /* the thread ran (set once, before it runs) */
    int joined;
    atomic_int stopping;
    atomic_int asleep;               /* in ppoll() without a bound (ops->busy only) */
    pthread_t thread;
    kvli_pollset_t ps;
} kvli_progress_t;

/* Zero the state (wake_fd -1): safe to stop and close after this alone. */
void kvli_progress_init(kvli_progress_t *pg, kvl_bk_ctx_t *ctx, const char *bk);
/* Create the wake eventfd; KVL_ERR_SYSTEM with the failed call in err. */
kvl_status_t kvli_progress_open(kvli_progress_t *pg, kvl_error_t *err);
/* Start the thread running ops on arg; KVL_ERR_SYSTEM with why in err. */
kvl_status_t kvli_progress_start(kvli_progress_t *pg, const kvli_progress_ops_t *ops, void *arg,
                                 kvl_error_t *err);
/* Set the stop flag, wake the thread and join it. Idempotent. */
void kvli_progress_stop(kvli_progress_t *pg);
/* Close the eventfd and free the poll set (after stop). Idempotent. */
void kvli_progress_close(kvli_progress_t *pg);
/* Make the thread's current or next ppoll() return. Any thread. */
void kvli_progress_wake(const kvli_progress_t *pg);
/*
 * For a poster that has just published work (under the lock ops->busy
 * takes): wake the thread only if it sleeps without a bound. A thread that
 * is spinning or waits a bounded time sees the work on its next turn, and
 * the poster saves the eventfd write and the wake-up (2 us on an H200
 * host). Without ops->busy, the same as kvli_progress_wake.
 *   thread: asleep = 1; if (busy()) { asleep = 0; do not sleep }; ppoll
 *   poster: publish; fence; if (asleep) wake
 * Either the thread sees the work or the poster sees it asleep.
 */
void kvli_progress_kick(kvli_progress_t *pg);

static inline int kvli_progress_stopping(kvli_progress_t *pg)
{
    return atomic_load(&pg->stopping);
}

/* Room for `need` slots in all; 0, or -1 (logged; return BACKOFF). */
int kvli_pollset_reserve(kvli_progress_t *pg, kvli_pollset_t *ps, size_t need);

/* Append a slot (room reserved); its index. */
static inline size_t kvli_pollset_add(kvli_pollset_t *ps, int fd, short events, void *who)
{
    size_t i = ps->n++;
    ps->pfd[i].fd = fd;
    ps->pfd[i].events = events;
    ps->pfd[i].revents = 0;
    ps->who[i] = who;
    return i;
}

#endif
