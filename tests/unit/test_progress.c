/* The progress thread every backend runs (src/common/progress.c): fds the
 * backend adds are served, a wake makes a turn, AGAIN skips the wait, STOP
 * and kvli_progress_stop end the thread, a failing ppoll is logged with
 * its errno and retried, and kvli_progress_kick never loses a wake-up
 * (work published while the thread goes to sleep is seen). Waits are
 * bounded (10 s) and nothing is timed.
 * KVL_TEST_LABELS: tsan */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include "common/kvltest.h"
#include "common/progress.h"

typedef struct state {
    kvli_progress_t pg;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int pipe_r, pipe_w;
    unsigned turns, dispatched, again_left, stop_at;
    unsigned work, done;             /* kick: work published, work seen */
    size_t extra_slots;              /* slots of fd -1 added each turn */
    char got[64];
    size_t ngot;
    char log[512];
} state_t;

static state_t st;

static void log_fn(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_fn(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
{
    va_list ap;
    (void)ctx;
    pthread_mutex_lock(&st.lock);
    va_start(ap, fmt);
    if (level == KVL_LOG_ERROR)
        vsnprintf(st.log, sizeof(st.log), fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&st.cond);
    pthread_mutex_unlock(&st.lock);
}

static int64_t prepare(void *arg, kvli_pollset_t *ps)
{
    state_t *s = arg;
    int64_t r = KVLI_PROGRESS_FOREVER;
    size_t extra;
    pthread_mutex_lock(&s->lock);
    extra = s->extra_slots; /* the test's thread changes it */
    s->turns++;
    pthread_cond_broadcast(&s->cond);
    if (s->stop_at != 0 && s->turns >= s->stop_at)
        r = KVLI_PROGRESS_STOP;
    else if (s->again_left > 0) {
        s->again_left--;
        r = KVLI_PROGRESS_AGAIN;
    }
    pthread_mutex_unlock(&s->lock);
    if (r != KVLI_PROGRESS_FOREVER)
        return r;
    if (kvli_pollset_reserve(&s->pg, ps, 2 + extra) != 0)
        return KVLI_PROGRESS_BACKOFF;
    KT_CHECK(ps->n == 1 && ps->pfd[0].fd == s->pg.wake_fd); /* slot 0: the wake fd */
    kvli_pollset_add(ps, s->pipe_r, POLLIN, &s->ngot);
    for (size_t i = 0; i < extra; i++)
        kvli_pollset_add(ps, -1, POLLIN, NULL);
    return r;
}

static void dispatch(void *arg, kvli_pollset_t *ps)
{
    state_t *s = arg;
    KT_CHECK(ps->n >= 2 && ps->who[1] == &s->ngot);
    if (ps->pfd[1].revents & POLLIN) {
        char b[16];
        ssize_t n = read(s->pipe_r, b, sizeof(b));
        pthread_mutex_lock(&s->lock);
        for (ssize_t i = 0; i > -1 && i < n && s->ngot < sizeof(s->got) - 1; i++)
            s->got[s->ngot++] = b[i];
        s->dispatched++;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
}

static const kvli_progress_ops_t ops = {.prepare = prepare, .dispatch = dispatch};

/* For kick: prepare takes every published unit of work, then sleeps with no
 * bound; busy says whether work is waiting (under the lock posters use). */
static int64_t prepare_work(void *arg, kvli_pollset_t *ps)
{
    state_t *s = arg;
    (void)ps;
    pthread_mutex_lock(&s->lock);
    s->turns++;
    s->done += s->work;
    s->work = 0;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return KVLI_PROGRESS_FOREVER;
}

static void dispatch_none(void *arg, kvli_pollset_t *ps)
{
    (void)arg;
    (void)ps;
}

static int busy_work(void *arg)
{
    state_t *s = arg;
    pthread_mutex_lock(&s->lock);
    int b = s->work > 0;
    pthread_mutex_unlock(&s->lock);
    return b;
}

static const kvli_progress_ops_t ops_work = {
    .prepare = prepare_work, .dispatch = dispatch_none, .busy = busy_work};

/* Wait (10 s at most) until cond_fn holds; 0 on timeout. */
static int wait_for(int (*cond_fn)(unsigned), unsigned v)
{
    struct timespec dl;
    int ok;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    pthread_mutex_lock(&st.lock);
    while (!(ok = cond_fn(v)))
        if (pthread_cond_timedwait(&st.cond, &st.lock, &dl) == ETIMEDOUT) {
            ok = cond_fn(v);
            break;
        }
    pthread_mutex_unlock(&st.lock);
    return ok;
}
static int turns_at_least(unsigned v) { return st.turns >= v; }
static int got_at_least(unsigned v) { return st.ngot >= v; }
static int logged(unsigned v) { (void)v; return st.log[0] != '\0'; }
static int done_at_least(unsigned v) { return st.done >= v; }

static kvl_bk_ctx_t ctx = {.size = sizeof(kvl_bk_ctx_t), .log = log_fn};

static void start(unsigned stop_at, unsigned again)
{
    int fds[2];
    kvl_error_t err;
    KT_CHECK(pipe(fds) == 0);
    st.pipe_r = fds[0];
    st.pipe_w = fds[1];
    st.turns = st.dispatched = 0;
    st.ngot = 0;
    st.stop_at = stop_at;
    st.again_left = again;
    st.extra_slots = 0;
    st.log[0] = '\0';
    kvli_progress_init(&st.pg, &ctx, "test");
    KT_CHECK(st.pg.wake_fd == -1 && !kvli_progress_stopping(&st.pg));
    KT_OK(kvli_progress_open(&st.pg, &err));
    KT_OK(kvli_progress_start(&st.pg, &ops, &st, &err));
}

static void finish(void)
{
    kvli_progress_stop(&st.pg);
    kvli_progress_stop(&st.pg); /* idempotent */
    KT_CHECK(kvli_progress_stopping(&st.pg));
    kvli_progress_close(&st.pg);
    kvli_progress_close(&st.pg);
    KT_CHECK(st.pg.wake_fd == -1);
    close(st.pipe_r);
    close(st.pipe_w);
}

int main(void)
{
    unsigned t;
    pthread_mutex_init(&st.lock, NULL);
    pthread_cond_init(&st.cond, NULL);

    /* 1. An fd the backend polls is served; a wake makes another turn. */
    start(0, 0);
    KT_CHECK(wait_for(turns_at_least, 1));
    KT_CHECK(write(st.pipe_w, "abc", 3) == 3);
    KT_CHECK(wait_for(got_at_least, 3));
    KT_CHECK(memcmp(st.got, "abc", 3) == 0);
    pthread_mutex_lock(&st.lock);
    t = st.turns;
    pthread_mutex_unlock(&st.lock);
    kvli_progress_wake(&st.pg);
    KT_CHECK(wait_for(turns_at_least, t + 1));
    finish();
    printf("fd served, wake makes a turn\n");

    /* 2. AGAIN runs prepare again without waiting (turns 1-4, nothing wakes
     * the thread); STOP (turn 5) ends it: stop only joins it. */
    start(5, 4);
    KT_CHECK(wait_for(turns_at_least, 5));
    kvli_progress_stop(&st.pg);
    KT_CHECK(st.turns == 5);
    finish();
    printf("AGAIN and STOP\n");

    /* 3. Stop while the thread waits with no timeout: the wake ends it. */
    start(0, 0);
    KT_CHECK(wait_for(turns_at_least, 1));
    finish();
    printf("stop wakes a thread waiting forever\n");

    /* 4. A failing ppoll (more descriptors than RLIMIT_NOFILE: EINVAL) is
     * logged with the backend, count and errno, and the loop keeps going. */
    struct rlimit rl;
    KT_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    start(0, 0);
    KT_CHECK(wait_for(turns_at_least, 1));
    rl.rlim_cur = 64;
    KT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    pthread_mutex_lock(&st.lock);
    st.extra_slots = 100;
    pthread_mutex_unlock(&st.lock);
    kvli_progress_wake(&st.pg);
    KT_CHECK(wait_for(logged, 0));
    char logged_text[sizeof(st.log)];
    pthread_mutex_lock(&st.lock); /* the thread logs again at every retry */
    memcpy(logged_text, st.log, sizeof(logged_text));
    pthread_mutex_unlock(&st.lock);
    printf("logged: %s\n", logged_text);
    KT_CHECK(strstr(logged_text, "test: ppoll() of 102 descriptors = -1 EINVAL") != NULL);
    KT_CHECK(strstr(logged_text, "retrying in 10 ms") != NULL);
    pthread_mutex_lock(&st.lock);
    st.extra_slots = 0;
    t = st.turns;
    pthread_mutex_unlock(&st.lock);
    KT_CHECK(wait_for(turns_at_least, t + 1)); /* it retried */
    KT_CHECK(write(st.pipe_w, "z", 1) == 1);
    KT_CHECK(wait_for(got_at_least, 1));       /* and serves fds again */
    finish();

    /* 5. kick: 5000 units of work published one at a time, each followed by
     * a kick and a (bounded) wait until the thread took it. The thread goes
     * to sleep between them, so every race between its going to sleep and a
     * publication is tried; a lost wake-up would leave a unit untaken. */
    KT_CHECK(setrlimit(RLIMIT_NOFILE, &(struct rlimit){rl.rlim_max, rl.rlim_max}) == 0 ||
             setrlimit(RLIMIT_NOFILE, &(struct rlimit){1024, rl.rlim_max}) == 0);
    int fds[2];
    kvl_error_t err;
    KT_CHECK(pipe(fds) == 0);
    st.pipe_r = fds[0];
    st.pipe_w = fds[1];
    st.work = st.done = st.turns = 0;
    kvli_progress_init(&st.pg, &ctx, "test");
    KT_OK(kvli_progress_open(&st.pg, &err));
    KT_OK(kvli_progress_start(&st.pg, &ops_work, &st, &err));
    for (unsigned i = 1; i <= 5000; i++) {
        pthread_mutex_lock(&st.lock);
        st.work++;
        pthread_mutex_unlock(&st.lock);
        kvli_progress_kick(&st.pg);
        if (!wait_for(done_at_least, i)) {
            printf("unit %u was never taken: a lost wake-up\n", i);
            KT_CHECK(0);
        }
    }
    printf("kick: 5000 publications, none lost (%u turns)\n", st.turns);
    finish();
    printf("ok\n");
    return 0;
}
