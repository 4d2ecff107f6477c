/*
 * posix backend: the engine that runs file operations.
 *
 * io_uring (the default): one ring per backend, driven by the shared
 * progress thread (common/progress.c): each turn submits as many queued ops
 * as the queue depth allows and waits on the ring's descriptor, which polls
 * readable when completions are there.
 *
 * Thread pool (when the kernel refuses io_uring: io_uring_disabled sysctl,
 * a seccomp profile, an old kernel; or engine=threads): threads that take
 * ops from the queue and run pread/pwrite. Same counting, same completion.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include "posix.h"

void kvli_posix_engine_queue(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp)
{
    pthread_mutex_lock(&iface->lock);
    /* A re-post may come as soon as the core has the last posting's end
     * (kvli_posix_xfer_finish tells the core first, then lets go of xp):
     * xp is reset and queued only once that posting let go, or its late
     * `running = false` would hide this posting from cancel and release. */
    while (xp->running)
        pthread_cond_wait(&iface->cond, &iface->lock);
    xp->next = xp->completed = xp->inflight = 0;
    xp->retry = NULL;
    for (size_t i = 0; i < xp->nops; i++)
        xp->ops[i].done = 0, xp->ops[i].retry = NULL;
    xp->canceled = xp->failed = false;
    xp->status = KVL_OK;
    xp->queued = xp->running = true;
    xp->qnext = NULL;
    if (iface->qtail)
        iface->qtail->qnext = xp;
    else
        iface->qhead = xp;
    iface->qtail = xp;
    bool empty = xp->nops == 0 && kvli_posix_xfer_check_end(iface, xp);
    if (iface->engine == KVLI_POSIX_POOL || xp->staged)
        pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    if (empty)
        kvli_posix_xfer_finish(iface, xp);
    else if (iface->engine == KVLI_POSIX_URING && !xp->staged)
        kvli_progress_wake(&iface->pg);
}

/* ---- thread pool ---- */

static void *kvli_posix_pool_main(void *arg)
{
    kvli_posix_iface_t *iface = arg;
    pthread_mutex_lock(&iface->lock);
    while (!iface->stop) {
        kvli_posix_op_t *op = kvli_posix_op_next(iface, false);
        if (op == NULL) {
            pthread_cond_wait(&iface->cond, &iface->lock);
            continue;
        }
        int write = op->xp->x->op == KVL_WRITE;
        pthread_mutex_unlock(&iface->lock);
        ssize_t r;
        do {
            r = write ? pwrite(op->fd, op->buf + op->done, op->len - op->done,
                               (off_t)(op->off + op->done))
                      : pread(op->fd, op->buf + op->done, op->len - op->done,
                              (off_t)(op->off + op->done));
        } while (r < 0 && errno == EINTR);
        long long res = r < 0 ? -(long long)errno : (long long)r;
        pthread_mutex_lock(&iface->lock);
        kvli_posix_xpriv_t *xp = op->xp;
        if (kvli_posix_op_done(iface, op, res)) {
            pthread_mutex_unlock(&iface->lock);
            kvli_posix_xfer_finish(iface, xp);
            pthread_mutex_lock(&iface->lock);
        } else if (xp->retry != NULL) {
            pthread_cond_signal(&iface->cond);
        }
    }
    pthread_mutex_unlock(&iface->lock);
    return NULL;
}

static kvl_status_t kvli_posix_pool_open(kvli_posix_iface_t *iface, kvl_error_t *err)
{
    iface->threads = calloc(iface->nthreads, sizeof(*iface->threads));
    if (iface->threads == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_POSIX_NAME, -1,
                         "out of memory for %u I/O threads", iface->nthreads);
        return KVL_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < iface->nthreads; i++) {
        int e = pthread_create(&iface->threads[i], NULL, kvli_posix_pool_main, iface);
        if (e != 0) {
            kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_POSIX_NAME, -1,
                             "pthread_create of I/O thread %u failed: %s", i, strerror(e));
            kvl_bk_error_hint(err, "the process may be at its thread limit (ulimit -u)");
            return KVL_ERR_SYSTEM;
        }
        iface->nstarted++;
    }
    return KVL_OK;
}

/* ---- io_uring ---- */

#ifdef KVL_HAVE_LIBURING
static int64_t kvli_posix_uring_prepare(void *arg, kvli_pollset_t *ps)
{
    kvli_posix_iface_t *iface = arg;
    unsigned queued = 0;
    (void)ps; /* the ring is waited on in the kernel, the wake fd in ppoll */
    pthread_mutex_lock(&iface->lock);
    while (iface->ring_inflight < iface->qd && io_uring_sq_space_left(&iface->ring) > 0) {
        kvli_posix_op_t *op = kvli_posix_op_next(iface, false);
        if (op == NULL)
            break;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&iface->ring); /* room checked */
        int fd = op->file_index >= 0 ? op->file_index : op->fd;
        if (op->buf_index >= 0 && op->xp->x->op == KVL_WRITE)
            io_uring_prep_write_fixed(sqe, fd, op->buf + op->done, op->len - op->done,
                                      op->off + op->done, op->buf_index);
        else if (op->buf_index >= 0)
            io_uring_prep_read_fixed(sqe, fd, op->buf + op->done, op->len - op->done,
                                     op->off + op->done, op->buf_index);
        else if (op->xp->x->op == KVL_WRITE)
            io_uring_prep_write(sqe, fd, op->buf + op->done, op->len - op->done,
                                op->off + op->done);
        else
            io_uring_prep_read(sqe, fd, op->buf + op->done, op->len - op->done,
                               op->off + op->done);
        if (op->file_index >= 0)
            io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
        io_uring_sqe_set_data(sqe, op);
        iface->ring_inflight++;
        queued++;
    }
    pthread_mutex_unlock(&iface->lock);
    if (iface->ring_inflight > 0 && io_uring_cq_ready(&iface->ring) == 0) {
        /* Operations in flight: submit and wait for a completion in the
         * kernel (one io_uring_enter), as fio does, instead of a ppoll
         * wake-up per completion. New postings wait at most for the next
         * completion; the wake fd is needed only when nothing is in flight. */
        int r;
        do {
            r = io_uring_submit_and_wait(&iface->ring, 1);
        } while (r == -EINTR);
        if (r < 0) {
            iface->ctx->log(iface->ctx, KVL_LOG_ERROR, "io_uring_submit failed: %s",
                            strerror(-r));
            return KVLI_PROGRESS_BACKOFF;
        }
    } else if (queued > 0) {
        int r;
        do {
            r = io_uring_submit(&iface->ring);
        } while (r == -EINTR);
        if (r < 0) {
            iface->ctx->log(iface->ctx, KVL_LOG_ERROR, "io_uring_submit failed: %s",
                            strerror(-r));
            return KVLI_PROGRESS_BACKOFF;
        }
    }
    if (io_uring_cq_ready(&iface->ring) > 0)
        return 0; /* no wait: straight to dispatch, which reaps them */
    return KVLI_PROGRESS_FOREVER; /* nothing in flight: the wake fd only */
}

static void kvli_posix_uring_dispatch(void *arg, kvli_pollset_t *ps)
{
    kvli_posix_iface_t *iface = arg;
    (void)ps;
    for (;;) {
        struct io_uring_cqe *cqes[64];
        unsigned n = io_uring_peek_batch_cqe(&iface->ring, cqes, 64);
        if (n == 0)
            return;
        kvli_posix_xpriv_t *ended[64];
        unsigned nend = 0;
        pthread_mutex_lock(&iface->lock);
        for (unsigned i = 0; i < n; i++) {
            kvli_posix_op_t *op = io_uring_cqe_get_data(cqes[i]);
            long long res = cqes[i]->res;
            iface->ring_inflight--;
            if (kvli_posix_op_done(iface, op, res))
                ended[nend++] = op->xp;
        }
        io_uring_cq_advance(&iface->ring, n);
        pthread_mutex_unlock(&iface->lock);
        for (unsigned i = 0; i < nend; i++)
            kvli_posix_xfer_finish(iface, ended[i]);
    }
}

static const kvli_progress_ops_t kvli_posix_uring_ops = {
    .prepare = kvli_posix_uring_prepare,
    .dispatch = kvli_posix_uring_dispatch,
};

static kvl_status_t kvli_posix_uring_open(kvli_posix_iface_t *iface, kvl_error_t *err)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
#ifdef IORING_SETUP_COOP_TASKRUN
    /* completions are reaped by the thread that waits for them: no
     * interrupt of it per completion (Linux 5.19+; refused before) */
    p.flags = IORING_SETUP_COOP_TASKRUN;
#endif
    int r = io_uring_queue_init_params(iface->qd < 8 ? 8 : iface->qd, &iface->ring, &p);
    if (r == -EINVAL && p.flags != 0) {
        memset(&p, 0, sizeof(p));
        r = io_uring_queue_init_params(iface->qd < 8 ? 8 : iface->qd, &iface->ring, &p);
    }
    if (r < 0) {
        const char *why = r == -ENOSYS ? "the kernel has no io_uring (ENOSYS)"
                        : r == -EPERM ? "io_uring is disabled for this process (EPERM: the "
                                        "kernel.io_uring_disabled sysctl, or a seccomp profile "
                                        "such as a container runtime's default)"
                        : r == -ENOMEM ? "the kernel could not allocate the ring (ENOMEM: "
                                         "RLIMIT_MEMLOCK too low on kernels before 5.12)"
                                       : "io_uring_queue_init failed";
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, -r, KVLI_POSIX_NAME, -1, "%s: %s", why,
                         strerror(-r));
        kvl_bk_error_hint(err, "kvlane falls back to pread/pwrite threads; to use io_uring, "
                               "allow io_uring_setup/io_uring_enter in the seccomp profile or set "
                               "kernel.io_uring_disabled=0");
        return KVL_ERR_UNSUPPORTED;
    }
    iface->ring_up = true;
    /* a table of empty fixed-buffer slots, filled as DRAM is registered */
    if (iface->fixed_max == 0) {
        snprintf(iface->fixed_why, sizeof(iface->fixed_why), "fixed_buffers_mib=0");
    } else {
        r = io_uring_register_buffers_sparse(&iface->ring, KVLI_POSIX_FIXED_SLOTS);
        if (r == 0)
            iface->fixed_up = true;
        else
            snprintf(iface->fixed_why, sizeof(iface->fixed_why),
                     "io_uring_register_buffers_sparse(%u) = %s (Linux 5.19+)",
                     KVLI_POSIX_FIXED_SLOTS, strerror(-r));
    }
    /* and of empty file slots, filled as FILE ranges are registered */
    r = io_uring_register_files_sparse(&iface->ring, KVLI_POSIX_FILE_SLOTS);
    if (r == 0)
        iface->files_up = true;
    else
        snprintf(iface->files_why, sizeof(iface->files_why),
                 "io_uring_register_files_sparse(%u) = %s (Linux 5.19+)", KVLI_POSIX_FILE_SLOTS,
                 strerror(-r));
    kvl_status_t st = kvli_progress_open(&iface->pg, err);
    if (st == KVL_OK)
        st = kvli_progress_start(&iface->pg, &kvli_posix_uring_ops, iface, err);
    return st;
}
#endif

int kvli_posix_file_add(kvli_posix_iface_t *iface, int fd, char *why, size_t cap)
{
#ifdef KVL_HAVE_LIBURING
    struct stat st;
    int slot = -1, free_slot = -1;
    if (iface->engine != KVLI_POSIX_URING || !iface->files_up) {
        snprintf(why, cap, "%s", iface->engine != KVLI_POSIX_URING
                                     ? "the engine is pread/pwrite threads" : iface->files_why);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &st) != 0 || fl < 0) {
        snprintf(why, cap, "fstat: %s", strerror(errno));
        return -1;
    }
    pthread_mutex_lock(&iface->lock);
    /* a slot holds the open file the descriptor named when it was
     * registered: the same number naming another file (or the same file
     * opened with other flags, O_DIRECT) gets a slot of its own */
    for (unsigned i = 0; i < KVLI_POSIX_FILE_SLOTS && slot < 0; i++) {
        if (iface->files[i].refs > 0 && iface->files[i].fd == fd &&
            iface->files[i].dev == st.st_dev && iface->files[i].ino == st.st_ino &&
            iface->files[i].flags == fl)
            slot = (int)i;
        else if (iface->files[i].refs == 0 && free_slot < 0)
            free_slot = (int)i;
    }
    if (slot >= 0) {
        iface->files[slot].refs++;
        pthread_mutex_unlock(&iface->lock);
        return slot;
    }
    if (free_slot < 0) {
        pthread_mutex_unlock(&iface->lock);
        snprintf(why, cap, "all %u registered-file slots are taken", KVLI_POSIX_FILE_SLOTS);
        return -1;
    }
    iface->files[free_slot].fd = fd;
    iface->files[free_slot].dev = st.st_dev;
    iface->files[free_slot].ino = st.st_ino;
    iface->files[free_slot].flags = fl;
    iface->files[free_slot].refs = 1;
    /* under the lock: a slot in the kernel's table matches ours */
    int r = io_uring_register_files_update(&iface->ring, (unsigned)free_slot, &fd, 1);
    if (r != 1) {
        iface->files[free_slot].refs = 0;
        pthread_mutex_unlock(&iface->lock);
        snprintf(why, cap, "io_uring_register_files_update = %s", strerror(r < 0 ? -r : EIO));
        return -1;
    }
    pthread_mutex_unlock(&iface->lock);
    return free_slot;
#else
    (void)iface, (void)fd;
    snprintf(why, cap, "this kvlane was built without liburing");
    return -1;
#endif
}

void kvli_posix_file_del(kvli_posix_iface_t *iface, int slot)
{
#ifdef KVL_HAVE_LIBURING
    if (slot < 0 || !iface->ring_up)
        return;
    pthread_mutex_lock(&iface->lock);
    /* no operation uses it: the core refuses to deregister memory in flight */
    if (iface->files[slot].refs > 0 && --iface->files[slot].refs == 0) {
        int none = -1;
        (void)io_uring_register_files_update(&iface->ring, (unsigned)slot, &none, 1);
    }
    pthread_mutex_unlock(&iface->lock);
#else
    (void)iface, (void)slot;
#endif
}

int kvli_posix_fixed_add(kvli_posix_iface_t *iface, uint64_t addr, uint64_t len, char *why,
                         size_t cap)
{
#ifdef KVL_HAVE_LIBURING
    int slot = -1;
    if (iface->engine != KVLI_POSIX_URING || !iface->fixed_up) {
        snprintf(why, cap, "%s", iface->engine != KVLI_POSIX_URING ? "the engine is pread/pwrite threads"
                                                                  : iface->fixed_why);
        return -1;
    }
    if (len > KVLI_POSIX_FIXED_LEN) {
        snprintf(why, cap, "the region is larger than 1 GiB, io_uring's bound per fixed buffer");
        return -1;
    }
    pthread_mutex_lock(&iface->lock);
    if (iface->fixed_bytes + len > iface->fixed_max) {
        pthread_mutex_unlock(&iface->lock);
        snprintf(why, cap, "fixed buffers already pin %llu bytes, the bound is %llu "
                 "(parameter fixed_buffers_mib)", (unsigned long long)iface->fixed_bytes,
                 (unsigned long long)iface->fixed_max);
        return -1;
    }
    for (unsigned i = 0; i < KVLI_POSIX_FIXED_SLOTS && slot < 0; i++)
        if (!iface->fixed_used[i])
            slot = (int)i;
    if (slot >= 0) {
        iface->fixed_used[slot] = 1;
        iface->fixed_bytes += len;
    }
    pthread_mutex_unlock(&iface->lock);
    if (slot < 0) {
        snprintf(why, cap, "all %u fixed-buffer slots are taken", KVLI_POSIX_FIXED_SLOTS);
        return -1;
    }
    /* pins the pages (faulting them in) and counts them against
     * RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK */
    struct iovec iov = {(void *)(uintptr_t)addr, (size_t)len};
    int r = io_uring_register_buffers_update_tag(&iface->ring, (unsigned)slot, &iov, NULL, 1);
    if (r == 1)
        return slot;
    if (r == -ENOMEM) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            snprintf(why, cap, "the kernel would not pin it (ENOMEM): RLIMIT_MEMLOCK is %llu "
                     "bytes; raise it (ulimit -l, the container's memlock limit) for io_uring "
                     "fixed buffers", (unsigned long long)rl.rlim_cur);
        else
            snprintf(why, cap, "the kernel would not pin it (ENOMEM)");
    } else {
        snprintf(why, cap, "io_uring_register_buffers_update_tag = %s%s", strerror(r < 0 ? -r : EIO),
                 r == -EOPNOTSUPP ? " (file-backed memory other than shmem cannot be a fixed "
                                    "buffer)" : "");
    }
    pthread_mutex_lock(&iface->lock);
    iface->fixed_used[slot] = 0;
    iface->fixed_bytes -= len;
    pthread_mutex_unlock(&iface->lock);
    return -1;
#else
    (void)iface, (void)addr, (void)len;
    snprintf(why, cap, "this kvlane was built without liburing");
    return -1;
#endif
}

void kvli_posix_fixed_del(kvli_posix_iface_t *iface, int slot, uint64_t len)
{
#ifdef KVL_HAVE_LIBURING
    if (slot < 0 || !iface->ring_up)
        return;
    /* no operation uses it: the core refuses to deregister memory in flight */
    struct iovec iov = {NULL, 0};
    (void)io_uring_register_buffers_update_tag(&iface->ring, (unsigned)slot, &iov, NULL, 1);
    pthread_mutex_lock(&iface->lock);
    iface->fixed_used[slot] = 0;
    iface->fixed_bytes -= len;
    pthread_mutex_unlock(&iface->lock);
#else
    (void)iface, (void)slot, (void)len;
#endif
}

kvl_status_t kvli_posix_engine_open(kvli_posix_iface_t *iface, const char *want,
                                    kvl_error_t *err)
{
    kvli_progress_init(&iface->pg, iface->ctx, KVLI_POSIX_NAME);
    if (strcasecmp(want, "threads") != 0) {
#ifdef KVL_HAVE_LIBURING
        kvl_error_t uerr;
        memset(&uerr, 0, offsetof(kvl_error_t, causes));
        kvl_status_t st = kvli_posix_uring_open(iface, &uerr);
        if (st == KVL_OK) {
            iface->engine = KVLI_POSIX_URING;
            return KVL_OK;
        }
        if (iface->ring_up) { /* the progress thread failed: not io_uring's fault */
            memcpy(err, &uerr, offsetof(kvl_error_t, causes));
            return st;
        }
        snprintf(iface->engine_why, sizeof(iface->engine_why), "%.380s", uerr.what);
#else
        snprintf(iface->engine_why, sizeof(iface->engine_why),
                 "this kvlane was built without liburing (install liburing-dev and rebuild)");
#endif
        if (strcasecmp(want, "io_uring") == 0) {
            kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, -1,
                             "engine=io_uring was asked for, but %s", iface->engine_why);
            kvl_bk_error_hint(err, "use engine=auto (falls back to threads) or enable io_uring");
            return KVL_ERR_UNSUPPORTED;
        }
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "io_uring unavailable, using %u pread/pwrite "
                        "threads: %s", iface->nthreads, iface->engine_why);
    } else {
        snprintf(iface->engine_why, sizeof(iface->engine_why), "engine=threads was asked for");
    }
    iface->engine = KVLI_POSIX_POOL;
    return kvli_posix_pool_open(iface, err);
}

void kvli_posix_engine_close(kvli_posix_iface_t *iface)
{
    pthread_mutex_lock(&iface->lock);
    iface->stop = true;
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    for (unsigned i = 0; i < iface->nstarted; i++)
        pthread_join(iface->threads[i], NULL);
    kvli_posix_stage_stop(iface);
    free(iface->threads);
    iface->threads = NULL;
    iface->nstarted = 0;
    kvli_progress_stop(&iface->pg);
    kvli_progress_close(&iface->pg);
#ifdef KVL_HAVE_LIBURING
    if (iface->ring_up)
        io_uring_queue_exit(&iface->ring);
    iface->ring_up = false;
#endif
}
