/*
 * kvlane agent listener, server side and lifetime: kvl_agent_listen(), the
 * accept thread, one bounded worker per connection (FETCH, PUSH,
 * INVALIDATE), the updater that refreshes our metadata at the listeners we
 * pushed to after a deregistration, and teardown at kvl_agent_destroy().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/accept.h"
#include "common/clock.h"
#include "common/errname.h"
#include "common/auth.h"
#include "common/inet.h"
#include "core/md_codec.h"
#include "listener.h"
#include "listener_proto.h"

static void kvli_listener_regions_changed(kvl_agent_t *a, void *state);
static void kvli_listener_agent_destroy(kvl_agent_t *a, void *state);

static void *kvli_listener_create(kvl_agent_t *a)
{
    kvli_listener_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->agent = a;
    l->listen_fd = -1;
    for (unsigned i = 0; i < KVLI_LSN_WORKERS; i++)
        l->worker_fd[i] = -1;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->cond, NULL);
    return l;
}

/* The listener as a metadata store (store.h). */
static const kvli_store_ops_t kvli_listener_store = {
    .name = "listener",
    .create = kvli_listener_create,
    .destroy = kvli_listener_agent_destroy,
    .regions_changed = kvli_listener_regions_changed,
};

kvli_listener_t *kvli_listener_get(kvl_agent_t *a, bool create)
{
    return kvli_store_state(a, &kvli_listener_store, create);
}

/* ---- serving one connection ---- */

typedef struct kvli_listener_job {
    kvli_listener_t *l;
    int fd;
    unsigned slot;
    char addr[KVLI_TCP_ADDR_STR];
} kvli_listener_job_t;

static void kvli_listener_reply(int fd, int32_t status, const char *text, const void *body,
                                size_t len, uint64_t deadline)
{
    uint8_t rep[KVLI_LSN_REP_LEN];
    size_t tl = text ? strlen(text) : 0;
    if (tl > KVLI_LSN_TEXT_MAX)
        tl = KVLI_LSN_TEXT_MAX;
    kvli_listener_proto_rep_build(rep, status, (uint32_t)tl, len);
    if (kvli_tcp_io_write(fd, rep, sizeof(rep), deadline) == 0 &&
        (tl == 0 || kvli_tcp_io_write(fd, text, tl, deadline) == 0) && len > 0)
        (void)kvli_tcp_io_write(fd, body, len, deadline + len / 10000u * 1000000u);
}

static void kvli_listener_error_text(char *buf, size_t cap)
{
    const kvl_error_t *e = kvl_last_error();
    snprintf(buf, cap, "%.600s%s%.400s", e->what, e->hint[0] ? " (hint: " : "", e->hint);
    if (e->hint[0] && strlen(buf) + 2 <= cap)
        strcat(buf, ")");
}

static void kvli_listener_serve(kvli_listener_t *l, int fd, const char *addr)
{
    kvl_agent_t *a = l->agent;
    uint64_t deadline = kvli_clock_ns() + a->timeout_ms * 1000000u, len = 0;
    uint8_t req[KVLI_LSN_REQ_LEN];
    char why[256] = "", text[KVLI_LSN_TEXT_MAX + 1] = "", name[KVL_NAME_MAX] = "";
    uint32_t type = 0;
    uint8_t *body = NULL;
    int rc;

    /* A connection that does not authenticate promptly gives its slot back:
     * idle sockets cannot hold the listener. */
    uint64_t auth_ms = a->timeout_ms < KVLI_LSN_AUTH_MS ? a->timeout_ms : KVLI_LSN_AUTH_MS;
    if (kvli_tcp_auth_server(fd, KVLI_AUTH_PURPOSE_LISTENER, a->secret, a->secret_len,
                             kvli_clock_ns() + auth_ms * 1000000u, a->name, why,
                             sizeof(why)) != 0) {
        kvli_log(KVL_LOG_WARN, "listener", "agent '%s': refused a connection from %s: %s",
                 a->name, addr, why);
        return;
    }
    rc = kvli_tcp_io_read(fd, req, sizeof(req), deadline);
    if (rc != 0) {
        kvli_log(KVL_LOG_INFO, "listener", "agent '%s': connection from %s ended before a "
                 "request: %s", a->name, addr, kvli_tcp_io_text(rc));
        return;
    }
    if (kvli_listener_proto_req_parse(req, &type, &len, why, sizeof(why)) != 0) {
        kvli_log(KVL_LOG_WARN, "listener", "agent '%s': malformed request from %s: %s; "
                 "dropping the connection", a->name, addr, why);
        return;
    }
    if (len > 0) {
        body = malloc((size_t)len);
        if (body == NULL) {
            kvli_listener_reply(fd, KVL_ERR_NO_MEMORY, "out of memory", NULL, 0, deadline);
            return;
        }
        rc = kvli_tcp_io_read(fd, body, (size_t)len, deadline + len / 10000u * 1000000u);
        if (rc != 0) {
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': %s request from %s: reading "
                     "%" PRIu64 " bytes: %s", a->name, kvli_listener_proto_type_name(type), addr,
                     len, kvli_tcp_io_text(rc));
            free(body);
            return;
        }
    }
    if (type == KVLI_LSN_FETCH) {
        void *blob = NULL;
        size_t bl = 0;
        if (kvl_metadata_get(a, &blob, &bl) != KVL_OK) {
            kvli_listener_error_text(text, sizeof(text));
            kvli_listener_reply(fd, kvl_last_error()->code, text, NULL, 0, deadline);
        } else {
            kvli_listener_reply(fd, KVL_OK, NULL, blob, bl, deadline);
            kvl_free(blob);
        }
        kvli_log(KVL_LOG_DEBUG, "listener", "agent '%s': served FETCH from %s", a->name, addr);
    } else if (type == KVLI_LSN_PUSH) {
        kvl_status_t st;
        kvli_md_t md;
        kvl_error_t derr;
        int own = 0;
        /* Our own metadata would make this agent a peer of itself. */
        if (kvli_md_decode(body, (size_t)len, &md, &derr) == KVL_OK) {
            own = strcmp(md.name, a->name) == 0;
            kvli_md_release(&md);
        }
        if (own) {
            st = KVL_ERR_INVALID_ARG;
            snprintf(text, sizeof(text), "agent '%s' refuses metadata that names itself (pushed "
                     "from %s): an agent is not its own peer", a->name, addr);
        } else {
            st = kvl_metadata_load(a, body, (size_t)len, name, sizeof(name));
        }
        if (own) {
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': metadata pushed from %s refused: %s",
                     a->name, addr, text);
        } else if (st != KVL_OK) {
            kvli_listener_error_text(text, sizeof(text));
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': metadata pushed from %s refused: %s",
                     a->name, addr, text);
        } else {
            kvli_log(KVL_LOG_INFO, "listener", "agent '%s': loaded the metadata of agent '%s' "
                     "pushed from %s", a->name, name, addr);
        }
        kvli_listener_reply(fd, st, text, NULL, 0, deadline);
    } else {
        uint64_t inc = 0, held;
        kvl_status_t st = KVL_OK;
        if (kvli_listener_proto_inval_parse(body, (size_t)len, &inc, name, sizeof(name), why,
                                            sizeof(why)) != 0) {
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': malformed request from %s: %s; "
                     "dropping the connection", a->name, addr, why);
            free(body);
            return;
        }
        held = kvl_remote_incarnation(a, name);
        if (held == 0) {
            st = KVL_ERR_NOT_FOUND;
            snprintf(text, sizeof(text), "agent '%s' is not loaded here", name);
        } else if (held != inc) {
            st = KVL_ERR_STALE;
            snprintf(text, sizeof(text), "agent '%s' incarnation %016" PRIx64 " is loaded here, "
                     "not %016" PRIx64 "; kept", name, held, inc);
        } else {
            st = kvl_remote_remove(a, name);
            if (st != KVL_OK)
                kvli_listener_error_text(text, sizeof(text));
            else
                kvli_log(KVL_LOG_INFO, "listener", "agent '%s': dropped agent '%s' "
                         "(incarnation %016" PRIx64 ") at its request from %s", a->name, name,
                         inc, addr);
        }
        kvli_listener_reply(fd, st, text, NULL, 0, deadline);
    }
    free(body);
}

static void *kvli_listener_worker(void *arg)
{
    kvli_listener_job_t *job = arg;
    kvli_listener_t *l = job->l;
    kvli_listener_serve(l, job->fd, job->addr);
    pthread_mutex_lock(&l->lock);
    l->worker_fd[job->slot] = -1;
    close(job->fd);
    l->nworkers--;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    free(job);
    return NULL;
}

/* The accept backoff's messages (common/accept.h) go to the log. */
static void kvli_listener_accept_log(void *arg, kvl_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kvli_listener_accept_log(void *arg, kvl_log_level_t level, const char *fmt, ...)
{
    va_list ap;
    (void)arg;
    va_start(ap, fmt);
    kvli_vlog(level, "listener", fmt, ap);
    va_end(ap);
}

static void *kvli_listener_accept_main(void *arg)
{
    kvli_listener_t *l = arg;
    kvli_accept_backoff_t bo;
    char what[KVLI_LSN_HP_MAX + 64];
    snprintf(what, sizeof(what), "agent '%.40s': listener %s", l->agent->name, l->bound);
    kvli_accept_backoff_init(&bo, what, kvli_listener_accept_log, NULL);
    for (;;) {
        uint64_t now = kvli_clock_ns();
        /* out of descriptors: the pending connection waits, unpolled, while
         * accepting is paused (common/accept.h) */
        struct pollfd p = {l->listen_fd, kvli_accept_events(&bo, now), 0};
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        kvli_listener_job_t *job;
        pthread_attr_t attr;
        pthread_t t;
        unsigned slot;
        int fd;

        pthread_mutex_lock(&l->lock);
        int stop = l->stopping;
        pthread_mutex_unlock(&l->lock);
        if (stop)
            break;
        if (poll(&p, 1, kvli_accept_wait_ms(&bo, now, 200)) <= 0)
            continue;
        fd = accept4(l->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            kvli_accept_failed(&bo, errno);
            continue;
        }
        kvli_accept_ok(&bo);
        kvli_tcp_sock_tune(fd, l->agent->timeout_ms, 0, 0);
        job = calloc(1, sizeof(*job));
        if (job == NULL) {
            close(fd);
            continue;
        }
        job->l = l;
        job->fd = fd;
        kvli_tcp_addr_str((struct sockaddr *)&ss, job->addr, sizeof(job->addr));
        char host[64];
        snprintf(host, sizeof(host), "%s", job->addr);
        char *colon = strrchr(host, ':');
        if (colon != NULL)
            *colon = '\0';
        unsigned same = 0;
        pthread_mutex_lock(&l->lock);
        for (unsigned i = 0; i < KVLI_LSN_WORKERS; i++)
            same += l->worker_fd[i] >= 0 && strcmp(l->worker_host[i], host) == 0;
        if (same >= KVLI_LSN_PER_HOST) {
            pthread_mutex_unlock(&l->lock);
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': %u connections from %s are being "
                     "served; refusing another (at most %u per address)", l->agent->name, same,
                     host, KVLI_LSN_PER_HOST);
            close(fd);
            free(job);
            continue;
        }
        for (slot = 0; slot < KVLI_LSN_WORKERS && l->worker_fd[slot] >= 0; slot++)
            ;
        if (slot == KVLI_LSN_WORKERS) {
            pthread_mutex_unlock(&l->lock);
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': %u connections are being served; "
                     "refusing the one from %s", l->agent->name, KVLI_LSN_WORKERS, job->addr);
            close(fd);
            free(job);
            continue;
        }
        job->slot = slot;
        l->worker_fd[slot] = fd;
        snprintf(l->worker_host[slot], sizeof(l->worker_host[slot]), "%s", host);
        l->nworkers++;
        pthread_mutex_unlock(&l->lock);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, kvli_listener_worker, job) != 0) {
            pthread_mutex_lock(&l->lock);
            l->worker_fd[slot] = -1;
            l->nworkers--;
            pthread_mutex_unlock(&l->lock);
            close(fd);
            free(job);
        }
        pthread_attr_destroy(&attr);
    }
    return NULL;
}

kvl_status_t kvl_agent_listen(kvl_agent_t *a, const char *host, uint16_t port, char *bound,
                              size_t bound_len)
{
    kvl_error_t err;
    struct sockaddr_storage ss;
    socklen_t sl;
    kvli_listener_t *l;
    char h[256], why[256], addr[KVLI_TCP_ADDR_STR];
    int fd, one = 1, e;

    if (bound && bound_len)
        bound[0] = '\0';
    if (a == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_agent_listen: agent is NULL");
    l = kvli_listener_get(a, true);
    if (l == NULL)
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_agent_listen: out of memory");
    pthread_mutex_lock(&l->lock);
    if (l->listen_fd >= 0) {
        kvli_err(&err, KVL_ERR_EXISTS, 0, "agent '%s' already listens on %s", a->name, l->bound);
        kvli_hint(&err, "one listener per agent: reuse the address it has");
        pthread_mutex_unlock(&l->lock);
        return kvli_fail(a, &err);
    }
    if (host == NULL || host[0] == '\0')
        kvli_tcp_default_host(h, sizeof(h));
    else
        kvli_scopy(h, sizeof(h), host);
    if (kvli_tcp_resolve(h, port, &ss, &sl, why, sizeof(why)) != 0) {
        pthread_mutex_unlock(&l->lock);
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "listener host '%.200s' cannot be resolved: %s", h,
                 why);
        kvli_hint(&err, "give an address of this host, 0.0.0.0 for all, or NULL for the first "
                        "non-loopback address");
        return kvli_fail(a, &err);
    }
    kvli_tcp_addr_str((struct sockaddr *)&ss, addr, sizeof(addr));
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 64) != 0) {
        e = errno;
        if (fd >= 0)
            close(fd);
        pthread_mutex_unlock(&l->lock);
        kvli_err(&err, KVL_ERR_SYSTEM, e, "listener socket/bind/listen(%s) = -1 %s (%s)", addr,
                 kvli_errno_name(e), strerror(e));
        kvli_hint(&err, e == EADDRINUSE ? "another process listens on that port: pass port 0 "
                                          "to pick a free one"
                        : e == EADDRNOTAVAIL ? "that address is not an address of this host"
                                             : "check the address and the open-file limit");
        return kvli_fail(a, &err);
    }
    sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    kvli_tcp_addr_str((struct sockaddr *)&ss, addr, sizeof(addr));
    if (ss.ss_family == AF_INET &&
        ((struct sockaddr_in *)(void *)&ss)->sin_addr.s_addr == htonl(INADDR_ANY)) {
        /* Report an address peers can use, not the wildcard. */
        char dh[64];
        kvli_tcp_default_host(dh, sizeof(dh));
        snprintf(addr, sizeof(addr), "%.46s:%u", dh,
                 (unsigned)ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port));
    }
    l->listen_fd = fd;
    kvli_scopy(l->bound, sizeof(l->bound), addr);
    e = pthread_create(&l->accept_thread, NULL, kvli_listener_accept_main, l);
    if (e != 0) {
        close(fd);
        l->listen_fd = -1;
        pthread_mutex_unlock(&l->lock);
        kvli_err(&err, KVL_ERR_SYSTEM, e, "listener: pthread_create(accept thread) = %s (%s)",
                 kvli_errno_name(e), strerror(e));
        kvli_hint(&err, "check the thread limit (ulimit -u, pids cgroup)");
        return kvli_fail(a, &err);
    }
    l->accept_started = 1;
    pthread_mutex_unlock(&l->lock);
    kvli_log(KVL_LOG_INFO, "listener", "agent '%s' listens on %s%s", a->name, addr,
             a->secret_len ? " (peers must prove the shared secret)" : "");
    if (bound && bound_len)
        snprintf(bound, bound_len, "%s", addr);
    return KVL_OK;
}

/* ---- refreshing what peers hold ---- */

static void *kvli_listener_updater_main(void *arg)
{
    kvli_listener_t *l = arg;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (!l->dirty && !l->stopping)
            pthread_cond_wait(&l->cond, &l->lock);
        if (l->stopping)
            break;
        l->dirty = 0;
        size_t n = 0, i = 0;
        for (kvli_listener_target_t *t = l->targets; t != NULL; t = t->next)
            n++;
        char (*hps)[KVLI_LSN_HP_MAX] = n ? calloc(n, KVLI_LSN_HP_MAX) : NULL;
        for (kvli_listener_target_t *t = l->targets; t != NULL && hps != NULL; t = t->next)
            kvli_scopy(hps[i++], KVLI_LSN_HP_MAX, t->hp);
        pthread_mutex_unlock(&l->lock);
        for (i = 0; hps != NULL && i < n; i++) {
            kvl_error_t err;
            memset(&err, 0, offsetof(kvl_error_t, causes));
            if (kvli_listener_push_one(l->agent, hps[i], &err) == KVL_OK)
                continue;
            kvli_log(KVL_LOG_WARN, "listener", "agent '%s': could not refresh our metadata at "
                     "listener %s after a deregistration (%s); sending INVALIDATE",
                     l->agent->name, hps[i], err.what);
            if (kvli_listener_invalidate_one(l->agent, hps[i], &err) != KVL_OK)
                kvli_log(KVL_LOG_WARN, "listener", "agent '%s': INVALIDATE to listener %s "
                         "failed too: %s", l->agent->name, hps[i], err.what);
        }
        free(hps);
        pthread_mutex_lock(&l->lock);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

static void kvli_listener_regions_changed(kvl_agent_t *a, void *state)
{
    kvli_listener_t *l = state;
    (void)a;
    pthread_mutex_lock(&l->lock);
    if (l->targets != NULL && !l->stopping) {
        if (!l->updater_started &&
            pthread_create(&l->updater, NULL, kvli_listener_updater_main, l) == 0)
            l->updater_started = 1;
        l->dirty = 1;
        pthread_cond_broadcast(&l->cond);
    }
    pthread_mutex_unlock(&l->lock);
}

static void kvli_listener_agent_destroy(kvl_agent_t *a, void *state)
{
    kvli_listener_t *l = state;
    pthread_mutex_lock(&l->lock);
    l->stopping = 1;
    pthread_cond_broadcast(&l->cond);
    /* Wake workers blocked on a slow client; each read is bounded anyway. */
    for (unsigned i = 0; i < KVLI_LSN_WORKERS; i++)
        if (l->worker_fd[i] >= 0)
            shutdown(l->worker_fd[i], SHUT_RDWR);
    pthread_mutex_unlock(&l->lock);
    if (l->accept_started)
        pthread_join(l->accept_thread, NULL);
    if (l->updater_started)
        pthread_join(l->updater, NULL);
    pthread_mutex_lock(&l->lock);
    while (l->nworkers > 0)
        pthread_cond_wait(&l->cond, &l->lock);
    pthread_mutex_unlock(&l->lock);
    if (l->listen_fd >= 0)
        close(l->listen_fd);
    /* Peers holding our metadata drop it now rather than on their next
     * failed transfer. */
    while (l->targets != NULL) {
        kvli_listener_target_t *t = l->targets;
        kvl_error_t err;
        l->targets = t->next;
        memset(&err, 0, offsetof(kvl_error_t, causes));
        if (kvli_listener_invalidate_one(a, t->hp, &err) != KVL_OK)
            kvli_log(KVL_LOG_INFO, "listener", "agent '%s': INVALIDATE to listener %s at "
                     "destroy failed: %s", a->name, t->hp, err.what);
        free(t);
    }
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    free(l);
}
