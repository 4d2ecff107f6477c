/*
 * kvlane tcp backend: the interface object. open/close, parameters, the
 * listening socket, the progress thread and the ops table, the one exported
 * symbol.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/errname.h"
#include "common/iface.h"
#include "tcp.h"

static const kvl_param_t kvli_tcp_params[] = {
    { "host", "" },          /* listen address; "" = first non-loopback IPv4, else 127.0.0.1 */
    { "port", "0" },         /* 0 = any free port */
    { "sndbuf", "0" },       /* SO_SNDBUF bytes, 0 = kernel autotuning */
    { "rcvbuf", "0" },       /* SO_RCVBUF bytes, 0 = kernel autotuning */
    { "chunk_kib", "4096" }, /* bytes per request (KiB) */
    { NULL, NULL }
};


/* ---- the progress thread ---- */

static void kvli_tcp_peer_timeouts(kvli_tcp_peer_t *peer, uint64_t now)
{
    uint64_t tmo = peer->iface->timeout_ms;
    unsigned waiting = 0, queued = 0;
    if (peer->dead || !kvli_tcp_peer_busy(peer))
        return;
    for (kvli_tcp_xpriv_t *xp = peer->xfers; xp != NULL; xp = xp->next)
        if (xp->timeout_ms < tmo)
            tmo = xp->timeout_ms;
    if (now <= peer->progress_ns || now - peer->progress_ns <= tmo * 1000000u)
        return;
    for (kvli_tcp_msg_t *m = peer->wq_head; m != NULL; m = m->next)
        waiting++;
    for (kvli_tcp_msg_t *m = peer->sq_head; m != NULL; m = m->next)
        queued++;
    kvli_tcp_peer_mark_dead(peer, ETIMEDOUT, "no byte from or to the peer for %" PRIu64 " ms "
                            "while %u request(s) waited for an answer and %u message(s) to be "
                            "sent (link down, host down, or the peer stopped)", tmo, waiting,
                            queued);
}

/* A turn of the progress thread (common/progress.c runs the loop): peers'
 * work under the lock, then the poll set: wake fd, listener, peers (slots
 * 2..poll_npeers-1, the fd polled kept in the slot), accepted connections. */
static int64_t kvli_tcp_progress_prepare(void *arg, kvli_pollset_t *ps)
{
    kvli_tcp_iface_t *iface = arg;
    kvli_tcp_xpriv_t *done = NULL;
    size_t need = 2;
    int busy = 0;

    kvli_bounce_fill_if_wanted(&iface->bounce);
    pthread_mutex_lock(&iface->lock);
    if (kvli_progress_stopping(&iface->pg)) {
        pthread_mutex_unlock(&iface->lock);
        return KVLI_PROGRESS_STOP;
    }
    for (kvli_tcp_peer_t *p = iface->peers; p != NULL; p = p->next) {
        need++;
        if (p->detached)
            continue;
        if (p->unloading) {
            /* Once detached here, this thread never touches the peer again. */
            kvli_tcp_peer_mark_dead(p, ECANCELED, "agent unloaded");
            kvli_tcp_xfer_reap(p, &done);
            p->detached = 1;
            pthread_cond_broadcast(&iface->cond);
            continue;
        }
        if (p->up_head != NULL)
            kvli_tcp_stage_uploads(p);
        kvli_tcp_xfer_reap(p, &done);
        kvli_tcp_xfer_generate(p);
        if (!p->dead)
            kvli_tcp_peer_tx(p);
        kvli_tcp_peer_timeouts(p, kvli_clock_ns());
        kvli_tcp_xfer_reap(p, &done);
        busy |= kvli_tcp_peer_busy(p);
    }
    need += iface->nconns;
    if (kvli_pollset_reserve(&iface->pg, ps, need) != 0) {
        pthread_mutex_unlock(&iface->lock);
        kvli_tcp_xfer_complete(iface, done);
        return KVLI_PROGRESS_BACKOFF;
    }
    /* slot 1 even while accepting is paused (events 0): dispatch counts on it;
     * the wait below is bounded by that pause as seen at this same now */
    uint64_t now = kvli_clock_ns();
    kvli_pollset_add(ps, iface->listen_fd, kvli_accept_events(&iface->accept_bo, now), NULL);
    for (kvli_tcp_peer_t *p = iface->peers; p != NULL; p = p->next) {
        if (p->detached || p->dead)
            continue;
        kvli_pollset_add(ps, p->fd, (short)(POLLIN | (p->sq_head != NULL &&
                                                      p->sq_head->ticket == NULL
                                                      ? POLLOUT : 0)), p);
    }
    iface->poll_npeers = ps->n;
    pthread_mutex_unlock(&iface->lock);
    kvli_tcp_xfer_complete(iface, done);

    for (kvli_tcp_conn_t *c = iface->conns; c != NULL; c = c->next) {
        kvli_pollset_add(ps, c->fd, kvli_tcp_conn_events(c), c);
        if (c->state != KVLI_TCP_CONN_READY || c->oq_head != NULL || c->rphase != 0)
            busy = 1;
    }
    /* staging copies wake us when done (cuLaunchHostFunc); 1 ms is the
     * backstop for a driver without host functions */
    return kvli_accept_wait_ns(&iface->accept_bo, now,
                               (atomic_load(&iface->staging) ? 1 : busy ? 50 : 1000) * 1000000LL);
}

static void kvli_tcp_progress_dispatch(void *arg, kvli_pollset_t *ps)
{
    kvli_tcp_iface_t *iface = arg;
    kvli_tcp_conn_t *c, **cp;
    size_t npeers = iface->poll_npeers;
    uint64_t now;

    if (ps->pfd[1].revents & POLLIN)
        kvli_tcp_conn_accept(iface);

    pthread_mutex_lock(&iface->lock);
    for (size_t i = 2; i < npeers; i++) {
        kvli_tcp_peer_t *p = ps->who[i];
        short ev = ps->pfd[i].revents;
        /* the peer may have reconnected since: its new fd is not this one */
        if (ev == 0 || p->detached || p->dead || p->fd != ps->pfd[i].fd)
            continue;
        if (ev & (POLLIN | POLLHUP | POLLERR))
            kvli_tcp_peer_rx(p);
        if (!p->dead && (ev & POLLOUT))
            kvli_tcp_peer_tx(p);
    }
    pthread_mutex_unlock(&iface->lock);

    now = kvli_clock_ns();
    for (size_t i = npeers; i < ps->n; i++) {
        c = ps->who[i];
        if (ps->pfd[i].revents != 0 || c->rphase == KVLI_TCP_RX_STAGE)
            kvli_tcp_conn_progress(iface, c, ps->pfd[i].revents);
        kvli_tcp_conn_check(iface, c, now);
    }
    for (cp = &iface->conns; *cp != NULL;) {
        c = *cp;
        if (c->state == KVLI_TCP_CONN_CLOSED) {
            *cp = c->next;
            kvli_tcp_conn_free(iface, c);
            iface->nconns--;
            if (iface->nconns < KVLI_TCP_CONNS_MAX / 2)
                iface->warned_conns = 0;
        } else {
            cp = &c->next;
        }
    }
}

static const kvli_progress_ops_t kvli_tcp_progress_ops = {
    .prepare = kvli_tcp_progress_prepare,
    .dispatch = kvli_tcp_progress_dispatch,
};

/* ---- ops ---- */

static kvl_status_t kvli_tcp_available(char *reason, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (reason != NULL && len > 0)
            snprintf(reason, len, "socket(AF_INET, SOCK_STREAM) = -1 %s (%s)",
                     kvli_errno_name(e), strerror(e));
        return KVL_ERR_UNSUPPORTED;
    }
    close(fd);
    if (reason != NULL && len > 0)
        reason[0] = '\0';
    return KVL_OK;
}

static kvl_status_t kvli_tcp_param_num(const char *k, const char *v, uint64_t max, uint64_t *out,
                                       kvl_error_t *err)
{
    char *end;
    unsigned long long n;
    errno = 0;
    n = strtoull(v, &end, 10);
    if (v[0] == '\0' || v[0] == '-' || *end != '\0' || errno != 0 || n > max) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                         "tcp parameter %s=\"%s\" is not a number in 0..%" PRIu64, k, v, max);
        kvl_bk_error_hint(err, "give a decimal number (port=0 picks a free port)");
        return KVL_ERR_INVALID_ARG;
    }
    *out = n;
    return KVL_OK;
}

static kvl_status_t kvli_tcp_parse_params(kvli_tcp_iface_t *iface, const kvl_param_t *params,
                                          size_t n, uint16_t *port_p, kvl_error_t *err)
{
    uint64_t v;
    *port_p = 0;
    iface->chunk = KVLI_TCP_CHUNK_DEFAULT;
    for (size_t i = 0; i < n && params != NULL && params[i].key != NULL; i++) {
        const char *k = params[i].key, *val = params[i].value ? params[i].value : "";
        kvl_status_t st = KVL_OK;
        if (strcmp(k, "host") == 0) {
            snprintf(iface->host, sizeof(iface->host), "%s", val);
        } else if (strcmp(k, "port") == 0) {
            st = kvli_tcp_param_num(k, val, 65535, &v, err);
            *port_p = (uint16_t)v;
        } else if (strcmp(k, "sndbuf") == 0 || strcmp(k, "rcvbuf") == 0) {
            st = kvli_tcp_param_num(k, val, 1u << 30, &v, err);
            if (k[0] == 's')
                iface->sndbuf = (int)v;
            else
                iface->rcvbuf = (int)v;
        } else if (strcmp(k, "chunk_kib") == 0) {
            st = kvli_tcp_param_num(k, val, KVLI_TCP_PAYLOAD_MAX >> 10, &v, err);
            if (st == KVL_OK && v < 4) {
                kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                                 "tcp parameter chunk_kib=%" PRIu64 " is below 4", v);
                kvl_bk_error_hint(err, "use 4..65536 (KiB per request; default 4096)");
                st = KVL_ERR_INVALID_ARG;
            }
            iface->chunk = v << 10;
        } else {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                             "unknown parameter \"%s\" (the tcp backend knows: host, port, "
                             "sndbuf, rcvbuf, chunk_kib)", k);
            kvl_bk_error_hint(err, "remove it or fix its spelling");
            st = KVL_ERR_INVALID_ARG;
        }
        if (st != KVL_OK)
            return st;
    }
    return KVL_OK;
}

static kvl_status_t kvli_tcp_listen(kvli_tcp_iface_t *iface, uint16_t port, kvl_error_t *err)
{
    char why[256];
    socklen_t sl;
    int one = 1, e;
    if (iface->host[0] == '\0')
        kvli_tcp_default_host(iface->host, sizeof(iface->host));
    if (kvli_tcp_resolve(iface->host, port, &iface->sa, &iface->salen, why, sizeof(why)) != 0) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                         "tcp host=\"%.200s\" cannot be resolved: %s", iface->host, why);
        kvl_bk_error_hint(err, "give an address of this host (host=10.0.0.5) or leave host "
                          "empty for the first non-loopback address");
        return KVL_ERR_INVALID_ARG;
    }
    iface->listen_fd = socket(iface->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (iface->listen_fd < 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_TCP_NAME, -1,
                         "socket(%s, SOCK_STREAM) = -1 %s (%s)",
                         iface->sa.ss_family == AF_INET6 ? "AF_INET6" : "AF_INET",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n) and that the "
                          "network is available in this container");
        return KVL_ERR_SYSTEM;
    }
    (void)setsockopt(iface->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    kvli_tcp_addr_str((struct sockaddr *)&iface->sa, iface->addr, sizeof(iface->addr));
    if (bind(iface->listen_fd, (struct sockaddr *)&iface->sa, iface->salen) != 0 ||
        listen(iface->listen_fd, 256) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_TCP_NAME, -1,
                         "tcp bind/listen(%s) = -1 %s (%s)", iface->addr, kvli_errno_name(e),
                         strerror(e));
        kvl_bk_error_hint(err, e == EADDRINUSE
                          ? "another process listens on that port: use port=0 or another port"
                          : e == EADDRNOTAVAIL
                          ? "the host= address is not an address of this machine"
                          : "check the host= and port= parameters");
        close(iface->listen_fd);
        iface->listen_fd = -1;
        return KVL_ERR_SYSTEM;
    }
    sl = sizeof(iface->sa);
    getsockname(iface->listen_fd, (struct sockaddr *)&iface->sa, &sl);
    iface->salen = sl;
    /* Advertise a reachable address: a wildcard bind advertises the first
     * non-loopback address. */
    memset(&iface->ci, 0, sizeof(iface->ci));
    iface->ci.incarnation = iface->ctx->incarnation;
    if (iface->sa.ss_family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)(void *)&iface->sa;
        iface->ci.family = 4;
        iface->ci.port = ntohs(s4->sin_port);
        if (s4->sin_addr.s_addr == htonl(INADDR_ANY)) {
            char h[64];
            kvli_tcp_default_host(h, sizeof(h));
            inet_pton(AF_INET, h, iface->ci.addr);
        } else {
            memcpy(iface->ci.addr, &s4->sin_addr, 4);
        }
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)(void *)&iface->sa;
        iface->ci.family = 6;
        iface->ci.port = ntohs(s6->sin6_port);
        if (IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr))
            inet_pton(AF_INET6, "::1", iface->ci.addr);
        else
            memcpy(iface->ci.addr, &s6->sin6_addr, 16);
    }
    kvli_tcp_addr_str((struct sockaddr *)&iface->sa, iface->addr, sizeof(iface->addr));
    return KVL_OK;
}

static void kvli_tcp_close(void *bk);

static kvl_status_t kvli_tcp_open(kvl_bk_ctx_t *ctx, const kvl_param_t *params, size_t n,
                                  void **bk_p, kvl_error_t *err)
{
    kvli_tcp_iface_t *iface;
    kvl_status_t st;
    uint16_t port;
    char what[KVLI_TCP_ADDR_STR + 8];

    iface = kvli_iface_new(ctx, bk_p, KVLI_TCP_NAME, sizeof(*iface), &st, err);
    if (iface == NULL)
        return st;
    iface->ctx = ctx;
    iface->timeout_ms = ctx->timeout_ms ? ctx->timeout_ms : KVLI_TCP_DEFAULT_TIMEOUT_MS;
    iface->listen_fd = -1;
    kvli_progress_init(&iface->pg, ctx, KVLI_TCP_NAME);
    iface->secret = ctx->secret;
    iface->secret_len = ctx->secret_len;
    kvli_lock_init(&iface->lock, &iface->cond);

    st = kvli_tcp_parse_params(iface, params, n, &port, err);
    if (st != KVL_OK)
        goto fail;
    kvli_bounce_init(&iface->bounce, ctx, KVLI_TCP_NAME, (size_t)iface->chunk,
                     KVLI_TCP_STAGE_BUFS, KVLI_TCP_STAGE_BUFS, 0);
    iface->scratch_len = 1u << 20;
    iface->scratch = malloc(iface->scratch_len);
    iface->tx_iov = malloc(sizeof(struct iovec) * 1026);
    if (iface->scratch == NULL || iface->tx_iov == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: malloc() of the progress buffers failed");
        kvl_bk_error_hint(err, "the process is out of memory");
        st = KVL_ERR_NO_MEMORY;
        goto fail;
    }
    st = kvli_progress_open(&iface->pg, err);
    if (st != KVL_OK)
        goto fail;
    st = kvli_tcp_listen(iface, port, err);
    if (st != KVL_OK)
        goto fail;
    snprintf(what, sizeof(what), "tcp %s", iface->addr);
    kvli_accept_backoff_init(&iface->accept_bo, what, kvli_accept_bk_log, iface->ctx);
    st = kvli_progress_start(&iface->pg, &kvli_tcp_progress_ops, iface, err);
    if (st != KVL_OK)
        goto fail;
    ctx->log(ctx, KVL_LOG_INFO, "tcp: listening on %s%s", iface->addr,
             iface->secret_len ? " (peers must prove the shared secret)" : "");
    *bk_p = iface;
    return KVL_OK;
fail:
    kvli_tcp_close(iface);
    return st;
}

static void kvli_tcp_close(void *bk)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_xpriv_t *done = NULL;
    if (iface == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    atomic_store(&iface->pg.stopping, 1);
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_stop(&iface->pg);
    /* The core released everything first; this only guards against leaks. */
    pthread_mutex_lock(&iface->lock);
    for (kvli_tcp_peer_t *p = iface->peers; p != NULL; p = p->next) {
        for (kvli_tcp_xpriv_t *xp = p->xfers; xp != NULL; xp = xp->next)
            atomic_store(&xp->cancel, 1);
        kvli_tcp_peer_mark_dead(p, ECANCELED, "backend closed");
        kvli_tcp_xfer_reap(p, &done);
    }
    pthread_mutex_unlock(&iface->lock);
    kvli_tcp_xfer_complete(iface, done);
    while (iface->peers != NULL) {
        kvli_tcp_peer_t *p = iface->peers;
        iface->peers = p->next;
        pthread_mutex_destroy(&p->connect_lock);
        free(p);
    }
    while (iface->conns != NULL) {
        kvli_tcp_conn_t *c = iface->conns;
        iface->conns = c->next;
        kvli_tcp_conn_free(iface, c);
    }
    kvli_bounce_fini(&iface->bounce);
    if (iface->listen_fd >= 0)
        close(iface->listen_fd);
    kvli_progress_close(&iface->pg);
    pthread_cond_destroy(&iface->cond);
    pthread_mutex_destroy(&iface->lock);
    free(iface->scratch);
    free(iface->tx_iov);
    free(iface);
}

static kvl_status_t kvli_tcp_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p)
{
    kvli_tcp_iface_t *iface = bk;
    if (cap < KVLI_TCP_CONN_LEN)
        return KVL_ERR_INVALID_ARG;
    kvli_tcp_proto_conn_build(buf, &iface->ci);
    *len_p = KVLI_TCP_CONN_LEN;
    return KVL_OK;
}

const kvl_backend_ops_t kvli_tcp_ops = {
    .abi_version = KVL_BACKEND_ABI_VERSION,
    .size = sizeof(kvl_backend_ops_t),
    .name = KVLI_TCP_NAME,
    .description = "any host, DRAM: TCP sockets, sendmsg/recvmsg straight from/into "
                   "registered memory, target-side bounds checks, optional HMAC "
                   "authentication",
    /* VRAM: staged through pinned host buffers (tcp_stage.c) */
    .mem_local = KVL_MEM_BIT(KVL_MEM_DRAM) | KVL_MEM_BIT(KVL_MEM_VRAM),
    .mem_remote = KVL_MEM_BIT(KVL_MEM_DRAM) | KVL_MEM_BIT(KVL_MEM_VRAM),
    .caps = KVL_BK_CAP_NOTIF | KVL_BK_CAP_STAGED_VRAM | KVL_BK_CAP_INDEXED,
    .params = kvli_tcp_params,
    .available = kvli_tcp_available,
    .open = kvli_tcp_open,
    .close = kvli_tcp_close,
    .mem_reg = kvli_tcp_md_reg,
    .mem_dereg = kvli_tcp_md_dereg,
    .conn_pack = kvli_tcp_conn_pack,
    .region_pack = kvli_tcp_md_pack,
    .peer_load = kvli_tcp_peer_load,
    .peer_unload = kvli_tcp_peer_unload,
    .rregion_load = kvli_tcp_md_rload,
    .rregion_unload = kvli_tcp_md_runload,
    .xfer_post = kvli_tcp_xfer_post,
    .xfer_cancel = kvli_tcp_xfer_cancel,
    .notif_send = kvli_tcp_peer_notif_send,
    .peer_describe = kvli_tcp_peer_describe,
    .device = NULL,
    .probe = NULL,
    .xfer_abort = kvli_tcp_xfer_abort
};
