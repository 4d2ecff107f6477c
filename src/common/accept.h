/*
 * Accepting connections when descriptors run out (shared layer: the tcp and
 * shm progress threads, the agent listener's accept thread).
 *
 * accept4() that fails with EMFILE/ENFILE (no free file descriptor) or
 * ENOBUFS/ENOMEM leaves the connection pending, so the listening socket
 * stays readable: a loop that polls it again at once spins at 100% CPU.
 * kvli_accept_backoff_t pauses accepting instead: after such a failure the
 * caller polls the listening socket with events 0 (its slot in the poll set
 * stays where it is) and bounds its wait by the pause's end, KVLI_ACCEPT_
 * PAUSE_MS later; then it tries again. One WARN per episode names the
 * socket, the errno and the fix; an INFO says when accepting works again.
 *
 *   kvli_accept_backoff_init(&b, "tcp 10.0.0.1:4000", log, arg);
 *   poll: events = kvli_accept_events(&b, now);  wait = kvli_accept_wait_ns(&b, now, wait)
 *   fd = accept4(...);  fd < 0 ? kvli_accept_failed(&b, errno) : kvli_accept_ok(&b);
 *
 * One thread uses a given state (the one that accepts).
 */
#ifndef KVLI_ACCEPT_H
#define KVLI_ACCEPT_H

#include <stdint.h>
#include <kvlane/log.h>

#define KVLI_ACCEPT_PAUSE_MS 100u

/* Where the messages go: the caller's logger (a backend's ctx->log, the
 * core's kvli_log for the listener). */
typedef void (*kvli_accept_log_fn)(void *arg, kvl_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef struct kvli_accept_backoff {
    char what[128];              /* names the socket in messages */
    kvli_accept_log_fn log;
    void *log_arg;
    uint64_t until_ns;           /* accepting paused until then (monotonic); 0: not */
    uint64_t since_ns;           /* first failure of the episode */
    uint64_t failures;           /* failed accept4() calls in the episode; 0: none */
    int err;                     /* errno of the episode's first failure */
} kvli_accept_backoff_t;

void kvli_accept_backoff_init(kvli_accept_backoff_t *b, const char *what, kvli_accept_log_fn log,
                              void *log_arg);

/* A kvli_accept_log_fn for backends: arg is the backend's kvl_bk_ctx_t,
 * the messages go to its log (the agent's). */
void kvli_accept_bk_log(void *bk_ctx, kvl_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Is e a shortage (EMFILE, ENFILE, ENOBUFS, ENOMEM) that leaves the
 * connection pending? */
int kvli_accept_shortage(int e);

/* accept4() on the socket failed with e. A shortage pauses accepting (the
 * episode's first one is logged) and returns 1; any other errno, 0. */
int kvli_accept_failed(kvli_accept_backoff_t *b, int e);

/* accept4() returned a connection: ends an episode (logged). */
void kvli_accept_ok(kvli_accept_backoff_t *b);

/* The events to poll the listening socket for at now: POLLIN, or 0 while
 * paused. */
short kvli_accept_events(const kvli_accept_backoff_t *b, uint64_t now);

/* A poll wait (ns; negative: without bound) bounded by the pause's end.
 * Pass the now that kvli_accept_events was given for the same poll: with a
 * later one the pause may be over while the socket was left out of the
 * poll, and an unbounded wait would never take the waiting connection. */
int64_t kvli_accept_wait_ns(const kvli_accept_backoff_t *b, uint64_t now, int64_t wait_ns);

/* The same for poll() (ms; negative: without bound), rounded up. */
int kvli_accept_wait_ms(const kvli_accept_backoff_t *b, uint64_t now, int wait_ms);

#endif
