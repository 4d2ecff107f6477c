/*
 * kvlane shm backend: the interface object. open/close, the listening
 * socket, the progress thread (which also drives the target side of every
 * accepted connection, shm_target.c) and the ops table, the one exported
 * symbol.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include "common/errname.h"
#include "common/iface.h"
#include "shm.h"
#include "common/host.h"
#include "common/mac.h"
#include "shm_proto.h"

/* Progress scratch: the largest body read into it is a NOTIF (64 KiB) */
#define KVLI_SHM_SCRATCH (KVL_NOTIF_MAX + 4096)

static const kvl_param_t kvli_shm_params[] = {
    { "cma", "auto" },
    { "socket_dir", "" },
    { "allow_uids", "self" },     /* self | any | comma-separated uids besides ours */
    { "inline_max", "auto" },     /* bytes a transfer may have to run in the poster's thread */
    { NULL, NULL }
};

/* ---- small shared helpers ---- */


void kvli_shm_hello_mac(const kvl_bk_ctx_t *ctx, int ack, uint64_t first_inc,
                        uint64_t second_inc, const char *name, size_t name_len, uint8_t *out)
{
    static const char lh[] = "kvlane-shm-v2 hello", la[] = "kvlane-shm-v2 ack";
    uint8_t a[8], b[8];
    for (int k = 0; k < 8; k++) {
        a[k] = (uint8_t)(first_inc >> (8 * k));
        b[k] = (uint8_t)(second_inc >> (8 * k));
    }
    kvli_mac_part_t parts[4] = {{ack ? la : lh, ack ? sizeof(la) - 1 : sizeof(lh) - 1},
                                {a, 8}, {b, 8}, {name, name_len}};
    kvli_mac(ctx->secret, ctx->secret_len, parts, 4, out);
}

int kvli_shm_uid_allowed(const kvli_shm_iface_t *iface, uid_t uid)
{
    if (iface->uid_any || uid == geteuid())
        return 1;
    for (unsigned i = 0; i < iface->nuids; i++)
        if (iface->uids[i] == uid)
            return 1;
    return 0;
}

void kvli_shm_deadline(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000u);
    ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}


int kvli_shm_sock_set_timeouts(int fd, uint64_t ms)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000u);
    tv.tv_usec = (suseconds_t)(ms % 1000u) * 1000;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0)
        return errno;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
        return errno;
    return 0;
}


static kvl_status_t kvli_shm_read_boot_id(char *buf, size_t cap, kvl_error_t *err)
{
    char why[200];
    int e = kvli_host_boot_id(buf, cap, why, sizeof(why));
    if (e == 0)
        return KVL_OK;
    kvl_bk_error_set(err, KVL_ERR_SYSTEM, e == EIO ? 0 : e, KVLI_SHM_NAME, -1,
                     "%s: cannot tell which host this is", why);
    kvl_bk_error_hint(err, e == EIO ? "check that /proc is a real procfs mount"
                                    : "mount /proc (the shm backend compares boot ids to be "
                                      "sure both agents share one machine)");
    return KVL_ERR_SYSTEM;
}

static kvl_status_t kvli_shm_ns_ino(const char *path, uint64_t *ino_p, kvl_error_t *err)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "stat(%s) = -1 %s (%s)", path, kvli_errno_name(e),
                         strerror(e));
        kvl_bk_error_hint(err, "mount /proc; the shm backend checks that both "
                          "agents share pid and network namespaces");
        return KVL_ERR_SYSTEM;
    }
    *ino_p = (uint64_t)st.st_ino;
    return KVL_OK;
}

/* ---- progress (common/progress.c runs the loop) ---- */

static int64_t kvli_shm_progress_prepare(void *arg, kvli_pollset_t *ps)
{
    kvli_shm_iface_t *iface = arg;
    kvli_shm_peer_t *p;
    kvli_shm_conn_t *c;
    size_t need = 2;

    pthread_mutex_lock(&iface->lock);
    if (kvli_progress_stopping(&iface->pg)) {
        pthread_mutex_unlock(&iface->lock);
        return KVLI_PROGRESS_STOP;
    }
    /* Once detached here, this thread never touches the peer again. */
    for (p = iface->peers; p != NULL; p = p->next) {
        if (p->unloading && !p->detached) {
            p->detached = 1;
            pthread_cond_broadcast(&iface->cond);
        }
        if (!p->detached && !p->released && p->running == 0 && atomic_load(&p->dead))
            kvli_shm_peer_release(p);
        need++;
    }
    for (c = iface->conns; c != NULL; c = c->next)
        need++;
    if (kvli_pollset_reserve(&iface->pg, ps, need) != 0) {
        pthread_mutex_unlock(&iface->lock);
        return KVLI_PROGRESS_BACKOFF;
    }
    /* slot 1 even while accepting is paused (events 0): dispatch counts on it;
     * the wait below is bounded by that pause as seen at this same now (read
     * again, the pause could be over while the socket was left out of the
     * poll, and the wait would have no bound: the connection never taken) */
    uint64_t now = kvli_clock_ns();
    kvli_pollset_add(ps, iface->listen_fd, kvli_accept_events(&iface->accept_bo, now), NULL);
    for (p = iface->peers; p != NULL; p = p->next)
        if (!p->detached && !atomic_load(&p->dead))
            kvli_pollset_add(ps, p->fd, POLLIN, p);
    iface->poll_npeers = ps->n;
    pthread_mutex_unlock(&iface->lock);
    for (c = iface->conns; c != NULL; c = c->next)
        kvli_pollset_add(ps, c->fd, (short)(POLLIN | (c->out_head != NULL ? POLLOUT : 0)), c);
    return kvli_accept_wait_ns(&iface->accept_bo, now, KVLI_PROGRESS_FOREVER);
}

static void kvli_shm_progress_dispatch(void *arg, kvli_pollset_t *ps)
{
    kvli_shm_iface_t *iface = arg;
    kvli_shm_conn_t *c, **cp;
    size_t i, npeers = iface->poll_npeers;

    if (ps->pfd[1].revents & POLLIN)
        kvli_shm_accept(iface);
    for (i = 2; i < npeers; i++)
        if (ps->pfd[i].revents != 0)
            kvli_shm_peer_progress(ps->who[i]);
    for (i = npeers; i < ps->n; i++) {
        c = ps->who[i];
        if (ps->pfd[i].revents & POLLOUT)
            kvli_shm_conn_flush(iface, c);
        if (!c->closing && (ps->pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
            kvli_shm_conn_progress(iface, c);
    }
    for (cp = &iface->conns; *cp != NULL;) {
        c = *cp;
        if (c->closing) {
            *cp = c->next;
            kvli_shm_conn_free(iface, c);
        } else {
            cp = &c->next;
        }
    }
}

static const kvli_progress_ops_t kvli_shm_progress_ops = {
    .prepare = kvli_shm_progress_prepare,
    .dispatch = kvli_shm_progress_dispatch,
};

/* ---- ops ---- */

static kvl_status_t kvli_shm_available(char *reason, size_t len)
{
    kvl_error_t err;
    char boot[40];
    int fd;
    if (kvli_shm_read_boot_id(boot, sizeof(boot), &err) != KVL_OK) {
        if (reason != NULL && len > 0)
            snprintf(reason, len, "%s", err.what);
        return KVL_ERR_SYSTEM;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (reason != NULL && len > 0)
            snprintf(reason, len, "socket(AF_UNIX, SOCK_STREAM) = -1 %s (%s)",
                     kvli_errno_name(e), strerror(e));
        return KVL_ERR_UNSUPPORTED;
    }
    close(fd);
    if (reason != NULL && len > 0)
        reason[0] = '\0';
    return KVL_OK;
}

/* "65536", "64K", "1M": 0 and the bytes, or -1. */
static int kvli_shm_parse_bytes(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long b = strtoull(v, &end, 10);
    if (end == v || errno != 0 || *v == '-')
        return -1;
    if (*end == 'K' || *end == 'k')
        b <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        b <<= 20, end++;
    if (*end != '\0')
        return -1;
    *out = b;
    return 0;
}

static kvl_status_t kvli_shm_parse_params(kvli_shm_iface_t *iface,
                                          const kvl_param_t *params, size_t n,
                                          const char **dir_p, kvl_error_t *err)
{
    size_t i;
    *dir_p = "";
    for (i = 0; i < n && params != NULL && params[i].key != NULL; i++) {
        const char *k = params[i].key, *v = params[i].value ? params[i].value : "";
        if (strcmp(k, "cma") == 0) {
            if (strcmp(v, "auto") == 0) {
                iface->cma_off = 0;
            } else if (strcmp(v, "off") == 0) {
                iface->cma_off = 1;
            } else {
                kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                                 "parameter cma=\"%s\" is not one of auto, off", v);
                kvl_bk_error_hint(err, "use cma=auto (cross-memory attach when the "
                                  "kernel allows it) or cma=off (socket copies)");
                return KVL_ERR_INVALID_ARG;
            }
        } else if (strcmp(k, "socket_dir") == 0) {
            *dir_p = v;
        } else if (strcmp(k, "inline_max") == 0) {
            uint64_t b = 0;
            iface->inline_adapt = strcmp(v, "auto") == 0;
            if (!iface->inline_adapt && (kvli_shm_parse_bytes(v, &b) != 0 || b > (16ull << 20))) {
                kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                                 "parameter inline_max=\"%.100s\" is not auto or a byte count "
                                 "from 0 to 16M", v);
                kvl_bk_error_hint(err, "inline_max=auto (the default: bounded by this host's "
                                  "measured hand-off delay, 64K to 1M), a fixed bound such as "
                                  "64K, or 0 to hand every transfer to the copy workers");
                return KVL_ERR_INVALID_ARG;
            }
            iface->inline_max = b;
        } else if (strcmp(k, "allow_uids") == 0) {
            iface->uid_any = strcmp(v, "any") == 0;
            iface->nuids = 0;
            if (!iface->uid_any && strcmp(v, "self") != 0) {
                const char *p = v;
                while (*p) {
                    char *end;
                    errno = 0;
                    unsigned long u = strtoul(p, &end, 10);
                    if (end == p || errno != 0 || u > UINT32_MAX - 1 || (*end && *end != ',') ||
                        iface->nuids == sizeof(iface->uids) / sizeof(iface->uids[0])) {
                        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                                         "parameter allow_uids=\"%.100s\" is not self, any or "
                                         "a comma-separated list of at most 16 uids", v);
                        kvl_bk_error_hint(err, "e.g. allow_uids=1001,1002 lets those users' "
                                          "agents in besides our own uid");
                        return KVL_ERR_INVALID_ARG;
                    }
                    iface->uids[iface->nuids++] = (uid_t)u;
                    p = *end ? end + 1 : end;
                }
            }
        } else {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                             "unknown parameter \"%s\" (the shm backend knows: cma, "
                             "socket_dir, allow_uids, inline_max)", k);
            kvl_bk_error_hint(err, "remove it or fix its spelling");
            return KVL_ERR_INVALID_ARG;
        }
    }
    return KVL_OK;
}

static kvl_status_t kvli_shm_listen(kvli_shm_iface_t *iface, const char *dir,
                                    kvl_error_t *err)
{
    char name[96];
    int e;
    snprintf(name, sizeof(name), "kvlane-shm-%d-%016" PRIx64, (int)getpid(),
             iface->ctx->incarnation);
    memset(&iface->addr, 0, sizeof(iface->addr));
    iface->addr.sun_family = AF_UNIX;
    if (dir[0] == '\0') {
        iface->abstract = 1;
        snprintf(iface->sock_name, sizeof(iface->sock_name), "%s", name);
        memcpy(iface->addr.sun_path + 1, name, strlen(name));
        iface->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                     strlen(name));
    } else {
        int w = snprintf(iface->sock_name, sizeof(iface->sock_name), "%s/%s.sock", dir,
                         name);
        if (w < 0 || (size_t)w >= sizeof(iface->addr.sun_path)) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, ENAMETOOLONG, KVLI_SHM_NAME, -1,
                             "socket path \"%s/%s.sock\" is %d bytes; a Unix socket "
                             "path holds at most %zu", dir, name, w,
                             sizeof(iface->addr.sun_path) - 1);
            kvl_bk_error_hint(err, "use a shorter socket_dir (or leave it empty for "
                              "the abstract namespace)");
            return KVL_ERR_INVALID_ARG;
        }
        memcpy(iface->addr.sun_path, iface->sock_name, (size_t)w);
        iface->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                     (size_t)w + 1);
    }
    iface->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (iface->listen_fd < 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "socket(AF_UNIX, SOCK_STREAM) = -1 %s (%s)",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n)");
        return KVL_ERR_SYSTEM;
    }
    if (bind(iface->listen_fd, (struct sockaddr *)&iface->addr, iface->addrlen) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "bind(%s%s) = -1 %s (%s)", iface->abstract ? "@" : "",
                         iface->sock_name, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, e == EADDRINUSE
                          ? "an shm backend of this agent already listens there: "
                            "create one shm backend per agent"
                          : "check that socket_dir exists and is writable, or leave "
                            "it empty for the abstract namespace");
        goto err_close;
    }
    if (listen(iface->listen_fd, 128) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "listen(%s%s) = -1 %s (%s)", iface->abstract ? "@" : "",
                         iface->sock_name, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the kernel's socket limits");
        goto err_unlink;
    }
    return KVL_OK;

err_unlink:
    if (!iface->abstract)
        unlink(iface->sock_name);
err_close:
    close(iface->listen_fd);
    iface->listen_fd = -1;
    return KVL_ERR_SYSTEM;
}

static void kvli_shm_close(void *bk);

static kvl_status_t kvli_shm_open(kvl_bk_ctx_t *ctx, const kvl_param_t *params,
                                  size_t n, void **bk_p, kvl_error_t *err)
{
    kvli_shm_iface_t *iface;
    const char *dir;
    kvl_status_t st;
    unsigned i;
    int e;
    char what[128];

    iface = kvli_iface_new(ctx, bk_p, KVLI_SHM_NAME, sizeof(*iface), &st, err);
    if (iface == NULL)
        return st;
    iface->ctx = ctx;
    iface->probe = ctx->incarnation;
    iface->timeout_ms = ctx->timeout_ms ? ctx->timeout_ms : KVLI_SHM_DEFAULT_TIMEOUT_MS;
    iface->listen_fd = -1;
    kvli_progress_init(&iface->pg, ctx, KVLI_SHM_NAME);
    iface->nworkers = ctx->workers ? ctx->workers : 1;
    iface->inline_adapt = 1;
    atomic_init(&iface->inline_auto, KVLI_SHM_INLINE_MIN);
    atomic_init(&iface->wake_ns, 0);
    atomic_init(&iface->rate_bpus, 0);
    atomic_init(&iface->inline_logged, KVLI_SHM_INLINE_MIN);

    st = kvli_shm_parse_params(iface, params, n, &dir, err);
    if (st != KVL_OK)
        goto err_free;
    st = kvli_shm_read_boot_id(iface->boot_id, sizeof(iface->boot_id), err);
    if (st != KVL_OK)
        goto err_free;
    st = kvli_shm_ns_ino("/proc/self/ns/net", &iface->netns_ino, err);
    if (st != KVL_OK)
        goto err_free;
    st = kvli_shm_ns_ino("/proc/self/ns/pid", &iface->pidns_ino, err);
    if (st != KVL_OK)
        goto err_free;

    kvli_lock_init(&iface->lock, &iface->cond);
    kvli_cond_init(&iface->qcond);
    pthread_mutex_init(&iface->inline_lock, NULL);

    iface->scratch_len = KVLI_SHM_SCRATCH;
    iface->scratch = malloc(iface->scratch_len);
    iface->pins = malloc(sizeof(void *) * KVLI_SHM_IOV_MAX);
    iface->workers = calloc(iface->nworkers, sizeof(*iface->workers));
    /* large and mostly untouched: the kernel backs only the pages used */
    iface->slot_gen = calloc(KVLI_SHM_GUARD_SLOTS, sizeof(*iface->slot_gen));
    iface->slot_free = malloc(KVLI_SHM_GUARD_SLOTS * sizeof(*iface->slot_free));
    if (iface->scratch == NULL || iface->pins == NULL || iface->workers == NULL ||
        iface->slot_gen == NULL || iface->slot_free == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "malloc() of the progress buffers (%zu bytes) failed",
                         iface->scratch_len);
        kvl_bk_error_hint(err, "the process is out of memory");
        st = KVL_ERR_NO_MEMORY;
        goto err_close;
    }
    st = kvli_progress_open(&iface->pg, err);
    if (st != KVL_OK)
        goto err_close;
    st = kvli_shm_listen(iface, dir, err);
    if (st != KVL_OK)
        goto err_close;

    if (kvli_shm_worker_init(&iface->inline_w, iface) != 0) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "malloc() of the inline copier's iovec arrays failed");
        kvl_bk_error_hint(err, "the process is out of memory");
        st = KVL_ERR_NO_MEMORY;
        goto err_close;
    }
    for (i = 0; i < iface->nworkers; i++) {
        kvli_shm_worker_t *w = &iface->workers[i];
        if (kvli_shm_worker_init(w, iface) != 0) {
            kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                             "malloc() of copy worker %u's iovec arrays failed", i);
            kvl_bk_error_hint(err, "the process is out of memory");
            st = KVL_ERR_NO_MEMORY;
            goto err_close;
        }
        e = pthread_create(&w->thread, NULL, kvli_shm_xfer_worker, w);
        if (e != 0) {
            kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                             "pthread_create(copy worker %u) = %s (%s)", i,
                             kvli_errno_name(e), strerror(e));
            kvl_bk_error_hint(err, "check the thread limit (ulimit -u, pids cgroup)");
            st = KVL_ERR_SYSTEM;
            goto err_close;
        }
        w->started = 1;
    }
    snprintf(what, sizeof(what), "shm socket %s%.100s", iface->abstract ? "@" : "",
             iface->sock_name);
    kvli_accept_backoff_init(&iface->accept_bo, what, kvli_accept_bk_log, iface->ctx);
    st = kvli_progress_start(&iface->pg, &kvli_shm_progress_ops, iface, err);
    if (st != KVL_OK)
        goto err_close;
    char inl[64] = "auto (64 KiB until measured)";
    if (!iface->inline_adapt)
        snprintf(inl, sizeof(inl), "%" PRIu64 " bytes", iface->inline_max);
    ctx->log(ctx, KVL_LOG_DEBUG, "listening on %s%s, cma=%s, %u copy worker(s), inline_max=%s",
             iface->abstract ? "@" : "", iface->sock_name, iface->cma_off ? "off" : "auto",
             iface->nworkers, inl);
    *bk_p = iface;
    return KVL_OK;

err_close:
    kvli_shm_close(iface);
    return st;
err_free:
    free(iface);
    return st;
}

static void kvli_shm_close(void *bk)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_conn_t *c, *nc;
    kvli_shm_peer_t *p, *np;
    unsigned i;

    if (iface == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    atomic_store(&iface->pg.stopping, 1);
    pthread_cond_broadcast(&iface->qcond);
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    /* Every blocking call of these threads is bounded by timeout_ms. */
    kvli_progress_stop(&iface->pg);
    for (i = 0; iface->workers != NULL && i < iface->nworkers; i++) {
        if (iface->workers[i].started)
            pthread_join(iface->workers[i].thread, NULL);
        kvli_shm_worker_fini(&iface->workers[i]);
    }
    kvli_shm_worker_fini(&iface->inline_w);
    /* The core releases everything first; this only guards against leaks. */
    kvli_shm_xfer_cancel_queued_all(iface);
    free(atomic_load(&iface->spare));
    for (c = iface->conns; c != NULL; c = nc) {
        nc = c->next;
        kvli_shm_conn_free(iface, c);
    }
    for (p = iface->peers; p != NULL; p = np) {
        np = p->next;
        kvli_shm_md_unmap_all(p);
        kvli_shm_guard_detach(p);
        if (p->fd >= 0)
            close(p->fd);
        if (p->pidfd >= 0)
            close(p->pidfd);
        pthread_mutex_destroy(&p->send_lock);
        free(p);
    }
    if (iface->listen_fd >= 0) {
        close(iface->listen_fd);
        if (!iface->abstract)
            unlink(iface->sock_name);
    }
    kvli_progress_close(&iface->pg);
    pthread_cond_destroy(&iface->cond);
    pthread_cond_destroy(&iface->qcond);
    pthread_mutex_destroy(&iface->inline_lock);
    pthread_mutex_destroy(&iface->lock);
    free(iface->workers);
    free(iface->slot_gen);
    free(iface->slot_free);
    free(iface->scratch);
    free(iface->pins);
    free(iface);
}

static void kvli_shm_put16(uint8_t *b, uint16_t v) { memcpy(b, &v, 2); }
static void kvli_shm_put32(uint8_t *b, uint32_t v) { memcpy(b, &v, 4); }
static void kvli_shm_put64(uint8_t *b, uint64_t v) { memcpy(b, &v, 8); }

/* Layout: see KVLI_SHM_CONN_* in shm_proto.h. */
static kvl_status_t kvli_shm_conn_pack(void *bk, uint8_t *buf, size_t cap,
                                       size_t *len_p)
{
    kvli_shm_iface_t *iface = bk;
    size_t sl = strlen(iface->sock_name);
    size_t need = KVLI_SHM_CONN_FIXED + sl;
    if (cap < need)
        return KVL_ERR_INVALID_ARG;
    memset(buf, 0, need);
    kvli_shm_put32(buf + 0, KVLI_SHM_CONN_MAGIC);
    kvli_shm_put16(buf + 4, KVLI_SHM_CONN_VERSION);
    kvli_shm_put16(buf + 6, (uint16_t)(iface->abstract ? 1 : 0));
    kvli_shm_put64(buf + 8, iface->ctx->incarnation);
    kvli_shm_put64(buf + 16, (uint64_t)(uintptr_t)&iface->probe);
    kvli_shm_put64(buf + 24, iface->netns_ino);
    kvli_shm_put64(buf + 32, iface->pidns_ino);
    kvli_shm_put32(buf + 40, (uint32_t)getpid());
    kvli_shm_put32(buf + 44, (uint32_t)getuid());
    memcpy(buf + 48, iface->boot_id, 36);
    kvli_shm_put16(buf + 88, (uint16_t)sl);
    memcpy(buf + KVLI_SHM_CONN_FIXED, iface->sock_name, sl);
    *len_p = need;
    return KVL_OK;
}

const kvl_backend_ops_t kvli_shm_ops = {
    .abi_version = KVL_BACKEND_ABI_VERSION,
    .size = sizeof(kvl_backend_ops_t),
    .name = KVLI_SHM_NAME,
    .description = "same host DRAM: memfd mappings, cross-memory attach "
                   "(process_vm_readv/writev) or Unix socket copies",
    .mem_local = KVL_MEM_BIT(KVL_MEM_DRAM),
    .mem_remote = KVL_MEM_BIT(KVL_MEM_DRAM),
    .caps = KVL_BK_CAP_NOTIF | KVL_BK_CAP_SAME_HOST | KVL_BK_CAP_INDEXED,
    .params = kvli_shm_params,
    .available = kvli_shm_available,
    .open = kvli_shm_open,
    .close = kvli_shm_close,
    .mem_reg = kvli_shm_md_reg,
    .mem_dereg = kvli_shm_md_dereg,
    .mem_revoke = kvli_shm_md_revoke,
    .conn_pack = kvli_shm_conn_pack,
    .region_pack = kvli_shm_md_pack,
    .peer_load = kvli_shm_peer_load,
    .peer_unload = kvli_shm_peer_unload,
    .rregion_load = kvli_shm_md_rload,
    .rregion_unload = kvli_shm_md_runload,
    .xfer_post = kvli_shm_xfer_post,
    .xfer_cancel = kvli_shm_xfer_cancel,
    .notif_send = kvli_shm_peer_notif_send,
    .peer_describe = kvli_shm_peer_describe,
    .device = NULL,
    .xfer_abort = kvli_shm_xfer_abort
};
