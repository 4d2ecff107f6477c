/*
 * kvlane tcp backend: the peer object. Loading a peer from untrusted
 * metadata, connecting (authentication, HELLO with the incarnation check),
 * reconnecting, the initiator side of the connection (sending requests,
 * reading replies) and peer death.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include "common/errname.h"
#include "common/notif_full.h"
#include "tcp.h"

static kvl_status_t kvli_tcp_bad_meta(kvl_error_t *err, const char *name, const char *why)
{
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_TCP_NAME, -1,
                     "tcp connection info of agent '%s': %s", name, why);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", name);
    kvl_bk_error_hint(err, "the metadata blob is corrupted or was produced by an incompatible "
                      "kvlane build; fetch it again from the peer");
    return KVL_ERR_BAD_METADATA;
}

kvli_tcp_msg_t *kvli_tcp_msg_new(uint16_t type, int niov, size_t head_len)
{
    size_t sz = sizeof(kvli_tcp_msg_t) + (size_t)niov * sizeof(struct iovec) + head_len;
    kvli_tcp_msg_t *m = malloc(sz);
    if (m == NULL)
        return NULL;
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->niov = niov;
    m->iov = (struct iovec *)(void *)(m + 1);
    m->head = (uint8_t *)(m->iov + niov);
    m->head_len = head_len;
    m->total = head_len;
    return m;
}

/*
 * A notification message (NOTIF or NOTIF_GRANTED) for len bytes of message,
 * its bytes to be copied in at head + KVLI_TCP_HDR_LEN; NULL when out of
 * memory. The NOTIF_ACK's grant lands in m->grant.
 */
kvli_tcp_msg_t *kvli_tcp_notif_new(size_t len)
{
    kvli_tcp_msg_t *m = kvli_tcp_msg_new(KVLI_TCP_MSG_NOTIF, 1, KVLI_TCP_HDR_LEN + len);
    if (m != NULL) {
        m->iov[0].iov_base = m->grant;
        m->iov[0].iov_len = sizeof(m->grant);
    }
    return m;
}

/*
 * Under iface->lock, before m is queued: within our grant (small, a slot
 * left) it goes as NOTIF_GRANTED (unanswered, or asking for more once half
 * the grant is spent); else as NOTIF, answered, giving the unused grant
 * back. Returns 1 when it goes within the grant.
 */
int kvli_tcp_notif_form(kvli_tcp_peer_t *peer, kvli_tcp_msg_t *m, size_t len)
{
    uint64_t aux = 0;
    if (len <= KVLI_TCP_NOTIF_SLOT && peer->notif_slots > 0) {
        peer->notif_slots--;
        m->type = KVLI_TCP_MSG_NOTIF_GRANTED;
        m->id = 0;
        if (peer->notif_slots < peer->notif_slots_hi / 2 && !peer->notif_topup) {
            peer->notif_topup = 1;
            m->id = ++peer->next_id;
        }
    } else {
        m->type = KVLI_TCP_MSG_NOTIF;
        m->id = ++peer->next_id;
        aux = peer->notif_slots;
        peer->notif_slots = 0;
    }
    kvli_tcp_proto_hdr_build(m->head, m->type, m->id, len, aux);
    return m->type == KVLI_TCP_MSG_NOTIF_GRANTED;
}

void kvli_tcp_peer_enqueue(kvli_tcp_peer_t *peer, kvli_tcp_msg_t *m)
{
    /* caller holds iface->lock */
    m->next = NULL;
    if (peer->sq_tail != NULL)
        peer->sq_tail->next = m;
    else
        peer->sq_head = m;
    peer->sq_tail = m;
    peer->sq_unsent++;
}

static void kvli_tcp_msgs_free(kvli_tcp_iface_t *iface, kvli_tcp_msg_t *m)
{
    while (m != NULL) {
        kvli_tcp_msg_t *n = m->next;
        if (m->wait != NULL)
            m->wait->state = -1;
        kvli_tcp_msg_free(iface, m);
        m = n;
    }
}

/* ---- death ---- */

/* WRITE payload bytes of m that reached the peer: handed to our kernel and
 * below cut, where the bytes our kernel never transmitted begin (those die
 * with the reset). */
static uint64_t kvli_tcp_msg_landable(const kvli_tcp_msg_t *m, uint64_t cut)
{
    uint64_t start = m->off0 + m->head_len, end = m->off0 + m->sent;
    if (m->type != KVLI_TCP_MSG_WRITE || m->sent == 0)
        return 0;
    if (end > cut)
        end = cut;
    return end > start ? end - start : 0;
}

/*
 * Give up the connection. When WRITE requests are unanswered, it is reset
 * (SO_LINGER 0): what our kernel has not transmitted is dropped, and the
 * target, which checks for the reset before copying a payload (tcp_conn.c),
 * drops what it has not copied yet. Only bytes that reached the peer's
 * kernel unanswered may still land: each transfer's count is kept for its
 * error. Otherwise an orderly close lets sent notifications through.
 */
static void kvli_tcp_peer_close_fd(kvli_tcp_peer_t *peer)
{
    uint64_t cut = peer->tx_off;
    int unsent = 0, abandon = 0;
    if (peer->fd < 0)
        return;
    if (ioctl(peer->fd, SIOCOUTQNSD, &unsent) == 0 && unsent > 0 && (uint64_t)unsent <= cut)
        cut -= (uint64_t)unsent;
    for (int q = 0; q < 2; q++)
        for (kvli_tcp_msg_t *m = q ? peer->sq_head : peer->wq_head; m != NULL; m = m->next) {
            if (m->type != KVLI_TCP_MSG_WRITE || m->sent == 0)
                continue;
            abandon = 1;
            if (m->xp != NULL)
                m->xp->inflight += kvli_tcp_msg_landable(m, cut);
        }
    if (abandon) {
        struct linger lg = {1, 0};
        if (setsockopt(peer->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) != 0)
            peer->iface->ctx->log(peer->iface->ctx, KVL_LOG_WARN, "setsockopt(SO_LINGER) on the "
                                  "connection to agent '%s' = -1 %s (%s): it closes without "
                                  "a reset", peer->name, kvli_errno_name(errno),
                                  strerror(errno));
    } else {
        shutdown(peer->fd, SHUT_RDWR);
    }
    close(peer->fd);
    peer->fd = -1;
}

void kvli_tcp_peer_mark_dead(kvli_tcp_peer_t *peer, int sys_errno, const char *fmt, ...)
{
    kvli_tcp_iface_t *iface = peer->iface;
    kvli_tcp_xpriv_t *xp;
    va_list ap;
    /* caller holds iface->lock (progress thread) */
    if (peer->dead)
        return;
    peer->dead = 1;
    peer->dead_errno = sys_errno;
    va_start(ap, fmt);
    vsnprintf(peer->dead_what, sizeof(peer->dead_what), fmt, ap);
    va_end(ap);
    kvli_tcp_peer_close_fd(peer);
    /* Nothing on this connection can land any more: every request ends. */
    kvli_tcp_msgs_free(iface, peer->sq_head);
    kvli_tcp_msgs_free(iface, peer->wq_head);
    /* uploads of replies already in: waited for, so none lands after the
     * transfer is reported */
    kvli_tcp_msgs_free(iface, peer->up_head);
    peer->sq_head = peer->sq_tail = peer->wq_head = peer->wq_tail = peer->up_head = NULL;
    peer->sq_unsent = 0;
    peer->win_bytes = 0;
    peer->win_reqs = 0;
    peer->rhdr_got = 0;
    peer->rphase = 0;
    for (xp = peer->xfers; xp != NULL; xp = xp->next) {
        kvl_error_t e;
        if (xp->finished)
            continue; /* its outcome is decided and being reported */
        xp->outstanding = 0;
        if (xp->notif_state == KVLI_TCP_NOTIF_QUEUED)
            xp->notif_state = KVLI_TCP_NOTIF_NONE;
        if (atomic_load(&xp->cancel) && xp->inflight == 0 && xp->status == KVL_OK)
            continue; /* nothing of it can land any more: it ends as cancelled */
        if (xp->status != KVL_OK) {
            kvli_tcp_xfer_inflight_note(xp);
            continue;
        }
        if (atomic_load(&xp->cancel)) {
            kvl_bk_error_set(&e, KVL_ERR_REMOTE_DISCONNECT, peer->dead_errno, KVLI_TCP_NAME, -1,
                             "transfer to agent '%s' (tcp %s) was cancelled but the peer did "
                             "not confirm it (%s): up to %" PRIu64 " bytes of it reached the "
                             "peer unanswered and may still land (%" PRIu64 " of %" PRIu64
                             " bytes confirmed before)", peer->name, peer->addr,
                             peer->dead_what, xp->inflight, xp->moved, xp->x->total_bytes);
            snprintf(e.agent, sizeof(e.agent), "%s", peer->name);
            kvl_bk_error_hint(&e, "the connection was reset, so a kvlane target (tcp protocol "
                              "2) drops what it had not copied yet; still, treat the "
                              "destination blocks as undefined and write them again");
        } else {
            kvli_tcp_peer_disconnect_error(peer, xp->moved, xp->x->total_bytes, xp->inflight,
                                           &e);
        }
        kvli_tcp_xfer_fail(xp, KVL_ERR_REMOTE_DISCONNECT, &e);
    }
    pthread_cond_broadcast(&iface->cond);
    if (!peer->unloading)
        iface->ctx->log(iface->ctx, KVL_LOG_INFO, "agent '%s' (tcp %s) disconnected: %s",
                        peer->name, peer->addr, peer->dead_what);
}

kvl_status_t kvli_tcp_peer_disconnect_error(kvli_tcp_peer_t *peer, uint64_t moved, uint64_t total,
                                            uint64_t inflight, kvl_error_t *err)
{
    /* caller holds iface->lock or the peer is no longer shared */
    if (total > 0 && inflight > 0)
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, peer->dead_errno, KVLI_TCP_NAME, -1,
                         "agent '%s' (tcp %s) disconnected after %" PRIu64 " of %" PRIu64
                         " bytes moved: %s; up to %" PRIu64 " bytes of this transfer reached "
                         "the peer unanswered and may still land", peer->name, peer->addr,
                         moved, total, peer->dead_what, inflight);
    else if (total > 0)
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, peer->dead_errno, KVLI_TCP_NAME, -1,
                         "agent '%s' (tcp %s) disconnected after %" PRIu64 " of %" PRIu64
                         " bytes moved: %s; none of its bytes can land any more", peer->name,
                         peer->addr, moved, total, peer->dead_what);
    else
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, peer->dead_errno, KVLI_TCP_NAME, -1,
                         "agent '%s' (tcp %s) disconnected: %s", peer->name, peer->addr,
                         peer->dead_what);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    int net = peer->dead_errno == ETIMEDOUT || peer->dead_errno == ENETUNREACH ||
              peer->dead_errno == EHOSTUNREACH || peer->dead_errno == ENETDOWN ||
              peer->dead_errno == EHOSTDOWN;
    kvl_bk_error_hint(err, inflight > 0
                      ? "the connection was reset, so a kvlane target (tcp protocol 2) drops "
                        "what it had not copied yet; still, treat the destination blocks as "
                        "undefined and write them again once the peer answers"
                      : peer->dead_errno == EPROTO
                      ? "the peer broke the tcp protocol (an incompatible kvlane build, or "
                        "another program on its port): run the same kvlane version on both "
                        "agents; the next transfer reconnects"
                      : net
                      ? "the peer stopped answering (host down, link down, process stopped); "
                        "check the network and the peer; the next transfer reconnects"
                      : "the peer process exited, crashed or closed its agent; check its "
                        "logs, load its new metadata once it is back, retry");
    return KVL_ERR_REMOTE_DISCONNECT;
}

/* ---- connecting ---- */

static void kvli_tcp_peer_conn_error(kvli_tcp_peer_t *peer, int e, kvl_error_t *err)
{
    kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, e, KVLI_TCP_NAME, -1,
                     "connect(%s) to agent '%s' = -1 %s (%s)", peer->addr, peer->name,
                     kvli_errno_name(e), strerror(e));
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    kvl_bk_error_hint(err, e == ECONNREFUSED
                      ? "no agent listens there: the peer exited or restarted on another port "
                        "(its metadata is stale); fetch its current metadata"
                      : e == ETIMEDOUT
                      ? "no answer within the agent timeout: host down, link down or a "
                        "firewall drops the packets; check the route to the peer"
                      : "check the address in the peer's metadata (tcp host= parameter) and "
                        "the route to it");
}

static kvl_status_t kvli_tcp_peer_hello(kvli_tcp_peer_t *peer, int fd, uint64_t deadline,
                                        kvl_error_t *err)
{
    kvli_tcp_iface_t *iface = peer->iface;
    uint8_t msg[KVLI_TCP_HDR_LEN + KVLI_TCP_HELLO_MAX], body[KVLI_TCP_ACK_MAX + 1];
    char why[160] = "", name[KVL_NAME_MAX];
    kvli_tcp_hdr_t h;
    uint64_t inc = 0;
    size_t bl = kvli_tcp_proto_hello_build(msg + KVLI_TCP_HDR_LEN, iface->ctx->agent_name,
                                           iface->ctx->incarnation, peer->name,
                                           peer->incarnation);
    int rc;

    kvli_tcp_proto_hdr_build(msg, KVLI_TCP_MSG_HELLO, 0, bl, 0);
    rc = kvli_tcp_io_write(fd, msg, KVLI_TCP_HDR_LEN + bl, deadline);
    if (rc == 0)
        rc = kvli_tcp_io_read(fd, msg, KVLI_TCP_HDR_LEN, deadline);
    if (rc != 0)
        goto io_err;
    if (kvli_tcp_proto_hdr_parse(msg, KVLI_TCP_DIR_REPLY, &h, why, sizeof(why)) != 0 ||
        h.type != KVLI_TCP_MSG_HELLO_ACK) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, KVLI_TCP_NAME, -1,
                         "agent '%s' at %s answered HELLO with a %s message: %s", peer->name,
                         peer->addr, kvli_tcp_proto_type_name(h.type), why[0] ? why : "not HELLO_ACK");
        kvl_bk_error_hint(err, "another program owns that port or the peer runs an "
                          "incompatible kvlane; check the peer's version");
        return KVL_ERR_REMOTE;
    }
    rc = kvli_tcp_io_read(fd, body, (size_t)h.len, deadline);
    if (rc != 0)
        goto io_err;
    if (h.status != 0) {
        kvl_status_t st = h.status == KVL_ERR_STALE ? KVL_ERR_STALE : KVL_ERR_REMOTE_REFUSED;
        char text[KVLI_TCP_TEXT_MAX + 1];
        memcpy(text, body, h.text_len);
        text[h.text_len] = '\0';
        kvl_bk_error_set(err, st, 0, KVLI_TCP_NAME, -1, "agent '%s' at %s refused the "
                         "connection: %s", peer->name, peer->addr, text);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        kvl_bk_error_hint(err, st == KVL_ERR_STALE
                          ? "the peer restarted (new incarnation): the metadata loaded here is "
                            "stale; fetch and load its current metadata"
                          : "see the peer's reason; check both agents' versions");
        return st;
    }
    if (kvli_tcp_proto_ack_parse(body + h.text_len, (size_t)h.len - h.text_len, &inc, name,
                                 sizeof(name), why, sizeof(why)) != 0) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, KVLI_TCP_NAME, -1,
                         "agent '%s' at %s sent a malformed HELLO_ACK: %s", peer->name,
                         peer->addr, why);
        kvl_bk_error_hint(err, "another program owns that port or the peer runs an "
                          "incompatible kvlane; check the peer's version");
        return KVL_ERR_REMOTE;
    }
    if (inc != peer->incarnation || strcmp(name, peer->name) != 0) {
        kvl_bk_error_set(err, KVL_ERR_STALE, 0, KVLI_TCP_NAME, -1,
                         "%s is served by agent '%s' incarnation 0x%016" PRIx64 "; the metadata "
                         "of agent '%s' names incarnation 0x%016" PRIx64, peer->addr, name, inc,
                         peer->name, peer->incarnation);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        kvl_bk_error_hint(err, "the peer restarted (new incarnation): the metadata loaded here "
                          "is stale; fetch and load its current metadata");
        return KVL_ERR_STALE;
    }
    return KVL_OK;

io_err:
    kvl_bk_error_set(err, rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT,
                     rc > 0 ? rc : ECONNRESET, KVLI_TCP_NAME, -1, "HELLO with agent '%s' at %s: %s",
                     peer->name, peer->addr, kvli_tcp_io_text(rc));
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    kvl_bk_error_hint(err, "the peer closed the connection or did not answer (it may have "
                      "refused us: see its log; a target of tcp protocol 1, an older kvlane, "
                      "closes the connection on our protocol 2 HELLO); check it and load its "
                      "metadata again");
    return rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT;
}

static kvl_status_t kvli_tcp_peer_connect(kvli_tcp_peer_t *peer, uint64_t timeout_ms,
                                          kvl_error_t *err)
{
    kvli_tcp_iface_t *iface = peer->iface;
    uint64_t deadline = kvli_clock_ns() + timeout_ms * 1000000u;
    char desc[KVL_NAME_MAX + KVLI_TCP_ADDR_STR + 16];
    kvl_status_t st;
    int e = 0, fd;

    fd = kvli_tcp_connect((struct sockaddr *)&peer->sa, peer->salen, timeout_ms, &e);
    if (fd < 0) {
        kvli_tcp_peer_conn_error(peer, e, err);
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    kvli_tcp_sock_tune(fd, iface->timeout_ms, iface->sndbuf, iface->rcvbuf);
    snprintf(desc, sizeof(desc), "agent '%s' at %s", peer->name, peer->addr);
    st = kvli_tcp_auth_client(fd, KVLI_AUTH_PURPOSE_DATA, iface->secret, iface->secret_len,
                              deadline, KVLI_TCP_NAME, desc, err);
    if (st == KVL_OK)
        st = kvli_tcp_peer_hello(peer, fd, deadline, err);
    if (st != KVL_OK) {
        if (err != NULL && !err->agent[0])
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        close(fd);
        return st;
    }
    pthread_mutex_lock(&iface->lock);
    if (peer->unloading || kvli_progress_stopping(&iface->pg)) {
        pthread_mutex_unlock(&iface->lock);
        close(fd);
        kvl_bk_error_set(err, KVL_ERR_STATE, 0, KVLI_TCP_NAME, -1,
                         "agent '%s' is being unloaded", peer->name);
        kvl_bk_error_hint(err, "do not use a remote agent while it is removed or the agent "
                          "is destroyed");
        return KVL_ERR_STATE;
    }
    peer->fd = fd;
    peer->dead = 0;
    peer->dead_what[0] = '\0';
    peer->rhdr_got = 0;
    peer->rphase = 0;
    peer->tx_off = 0;
    peer->notif_slots = peer->notif_slots_hi = 0; /* a new connection: no grant yet */
    peer->notif_topup = 0;
    peer->progress_ns = kvli_clock_ns();
    peer->connects++;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    return KVL_OK;
}

kvl_status_t kvli_tcp_peer_ensure(kvli_tcp_peer_t *peer, uint64_t timeout_ms, kvl_error_t *err)
{
    kvli_tcp_iface_t *iface = peer->iface;
    kvl_status_t st = KVL_OK;
    int dead;
    pthread_mutex_lock(&iface->lock);
    dead = peer->dead;
    pthread_mutex_unlock(&iface->lock);
    if (!dead)
        return KVL_OK;
    pthread_mutex_lock(&peer->connect_lock);
    pthread_mutex_lock(&iface->lock);
    dead = peer->dead;
    pthread_mutex_unlock(&iface->lock);
    if (dead) {
        st = kvli_tcp_peer_connect(peer, timeout_ms, err);
        if (st == KVL_OK)
            iface->ctx->log(iface->ctx, KVL_LOG_INFO, "agent '%s' (tcp %s): reconnected",
                            peer->name, peer->addr);
    }
    pthread_mutex_unlock(&peer->connect_lock);
    return st;
}

kvl_status_t kvli_tcp_peer_load(void *bk, const char *name, uint64_t incarnation,
                                const uint8_t *conn, size_t len, void **peer_p, kvl_error_t *err)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_conninfo_t ci;
    kvli_tcp_peer_t *peer;
    char why[160];
    kvl_status_t st;

    if (name == NULL)
        name = "?";
    if (kvli_tcp_proto_conn_parse(conn, len, &ci, why, sizeof(why)) != 0)
        return kvli_tcp_bad_meta(err, name, why);
    if (ci.incarnation != incarnation) {
        snprintf(why, sizeof(why), "incarnation 0x%016" PRIx64 " differs from the agent's "
                 "0x%016" PRIx64, ci.incarnation, incarnation);
        return kvli_tcp_bad_meta(err, name, why);
    }
    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: calloc(%zu) failed", sizeof(*peer));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    peer->iface = iface;
    peer->fd = -1;
    peer->dead = 1;
    snprintf(peer->dead_what, sizeof(peer->dead_what), "not connected yet");
    snprintf(peer->name, sizeof(peer->name), "%s", name);
    peer->incarnation = incarnation;
    if (ci.family == 4) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)(void *)&peer->sa;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(ci.port);
        memcpy(&s4->sin_addr, ci.addr, 4);
        peer->salen = sizeof(*s4);
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)(void *)&peer->sa;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(ci.port);
        memcpy(&s6->sin6_addr, ci.addr, 16);
        peer->salen = sizeof(*s6);
    }
    kvli_tcp_addr_str((struct sockaddr *)&peer->sa, peer->addr, sizeof(peer->addr));
    pthread_mutex_init(&peer->connect_lock, NULL);
    st = kvli_tcp_peer_connect(peer, iface->timeout_ms, err);
    if (st != KVL_OK) {
        pthread_mutex_destroy(&peer->connect_lock);
        free(peer);
        return st;
    }
    pthread_mutex_lock(&iface->lock);
    peer->next = iface->peers;
    iface->peers = peer;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "agent '%s' loaded: tcp %s, incarnation %016" PRIx64,
                    peer->name, peer->addr, peer->incarnation);
    *peer_p = peer;
    return KVL_OK;
}

void kvli_tcp_peer_unload(void *bk, void *peer_h)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_peer_t *peer = peer_h, **pp;
    struct timespec dl;
    int detached;
    if (peer == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    peer->unloading = 1;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(iface->timeout_ms / 1000u) + 2;
    pthread_mutex_lock(&iface->lock);
    while (!peer->detached && iface->pg.started && !kvli_progress_stopping(&iface->pg)) {
        if (pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) == ETIMEDOUT)
            break;
    }
    detached = peer->detached || !iface->pg.started;
    if (detached)
        for (pp = &iface->peers; *pp != NULL; pp = &(*pp)->next)
            if (*pp == peer) {
                *pp = peer->next;
                break;
            }
    pthread_mutex_unlock(&iface->lock);
    if (!detached) {
        iface->ctx->log(iface->ctx, KVL_LOG_ERROR,
                        "unloading agent '%s': the tcp progress thread did not release its "
                        "connection in time; freed at backend close", peer->name);
        return;
    }
    if (peer->fd >= 0)
        close(peer->fd);
    kvli_tcp_msgs_free(iface, peer->sq_head);
    kvli_tcp_msgs_free(iface, peer->wq_head);
    kvli_tcp_msgs_free(iface, peer->up_head);
    pthread_mutex_destroy(&peer->connect_lock);
    free(peer);
}

void kvli_tcp_peer_describe(void *bk, void *peer_h, char *buf, size_t len)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_peer_t *peer = peer_h;
    if (buf == NULL || len == 0)
        return;
    pthread_mutex_lock(&iface->lock);
    if (!peer->dead)
        snprintf(buf, len, "socket %s (connected%s)", peer->addr,
                 iface->secret_len ? ", authenticated" : "");
    else
        snprintf(buf, len, "socket %s (disconnected: %.200s; the next transfer reconnects)",
                 peer->addr, peer->dead_what);
    pthread_mutex_unlock(&iface->lock);
}

/* ---- the initiator side of the connection (progress thread, under lock) ---- */

static void kvli_tcp_peer_io_dead(kvli_tcp_peer_t *peer, const char *call, ssize_t n, int e)
{
    if (n == 0)
        kvli_tcp_peer_mark_dead(peer, 0, "%s = 0 (connection closed by the peer)", call);
    else
        kvli_tcp_peer_mark_dead(peer, e, "%s = -1 %s (%s)", call, kvli_errno_name(e),
                                strerror(e));
}

static void kvli_tcp_peer_reply_done(kvli_tcp_peer_t *peer)
{
    kvli_tcp_msg_t *m = peer->wq_head;
    kvli_tcp_xpriv_t *xp = m->xp;
    peer->wq_head = m->next;
    if (peer->wq_head == NULL)
        peer->wq_tail = NULL;
    peer->win_reqs--;
    peer->win_bytes -= m->bytes;
    peer->rphase = 0;
    peer->rhdr_got = 0;
    if (xp != NULL && peer->rh.status == 0 && m->type == KVLI_TCP_MSG_READ && m->nsp > 0) {
        /* READ into VRAM: upload from the bounce buffer; answered once done */
        kvl_error_t e;
        if (peer->iface->ctx->stage_copy(peer->iface->ctx, 0, m->sp, (size_t)m->nsp,
                                         kvli_tcp_stage_notify, peer->iface, &m->ticket,
                                         &e) == KVL_OK) {
            atomic_fetch_add(&peer->iface->staging, 1);
            m->next = peer->up_head;
            peer->up_head = m;
            return;
        }
        xp->outstanding--;
        kvli_tcp_xfer_fail(xp, e.code, &e);
        kvli_tcp_msg_free(peer->iface, m);
        return;
    }
    if (m->type == KVLI_TCP_MSG_NOTIF || m->type == KVLI_TCP_MSG_NOTIF_GRANTED) {
        uint32_t add = kvli_get32(m->grant);
        if (add > KVLI_TCP_NOTIF_GRANT_MAX) {
            kvli_tcp_msg_free(peer->iface, m);
            kvli_tcp_peer_mark_dead(peer, EPROTO, "protocol error: NOTIF_ACK grants %u slots "
                                    "(at most %u)", add, KVLI_TCP_NOTIF_GRANT_MAX);
            return;
        }
        peer->notif_slots += add;
        if (peer->notif_slots > peer->notif_slots_hi)
            peer->notif_slots_hi = peer->notif_slots;
        peer->notif_topup = 0;
        if (m->type == KVLI_TCP_MSG_NOTIF_GRANTED) {
            kvli_tcp_msg_free(peer->iface, m); /* a request for more: answered */
            return;
        }
    }
    if (m->type == KVLI_TCP_MSG_NOTIF) {
        /* the answer to a notification: queued by the target, or refused */
        peer->rtext[peer->rh.text_len] = '\0';
        if (m->wait != NULL) {
            m->wait->state = peer->rh.status == 0 ? 1 : 2;
            m->wait->status = peer->rh.status;
            memcpy(m->wait->text, peer->rtext, peer->rh.text_len + 1);
            pthread_cond_broadcast(&peer->iface->cond);
        } else if (xp != NULL && peer->rh.status == 0) {
            xp->outstanding--;
            xp->notif_state = KVLI_TCP_NOTIF_SENT;
        } else if (xp != NULL) {
            kvl_error_t e;
            kvl_status_t st = kvli_notif_refused(&e, KVLI_TCP_NAME, peer->name, peer->rh.status,
                                                 peer->rtext, xp->x->total_bytes);
            xp->outstanding--;
            xp->notif_state = KVLI_TCP_NOTIF_NONE;
            kvli_tcp_xfer_fail(xp, st, &e);
        }
        kvli_tcp_msg_free(peer->iface, m);
        return;
    }
    if (xp != NULL) {
        xp->outstanding--;
        if (peer->rh.status == 0) {
            xp->moved += m->bytes;
        } else if (xp->status == KVL_OK) {
            kvl_error_t e;
            peer->rtext[peer->rh.text_len] = '\0';
            kvl_bk_error_set(&e, KVL_ERR_REMOTE_REFUSED, 0, KVLI_TCP_NAME, -1,
                             "agent '%s' (tcp %s) refused a %s request of %" PRIu64 " bytes "
                             "(%" PRIu64 " of %" PRIu64 " bytes moved before): %s (%s)",
                             peer->name, peer->addr, kvli_tcp_proto_type_name(m->type), m->bytes,
                             xp->moved, xp->x->total_bytes, peer->rtext,
                             kvl_status_name(peer->rh.status));
            snprintf(e.agent, sizeof(e.agent), "%s", peer->name);
            kvl_bk_error_hint(&e, "the transfer reaches memory the peer has not registered (or "
                              "deregistered): fetch its metadata again and check the remote "
                              "descriptors");
            kvli_tcp_xfer_fail(xp, KVL_ERR_REMOTE_REFUSED, &e);
        }
    }
    kvli_tcp_msg_free(peer->iface, m);
}

static int kvli_tcp_peer_rx_header(kvli_tcp_peer_t *peer)
{
    kvli_tcp_msg_t *m = peer->wq_head;
    char why[160] = "";
    if (kvli_tcp_proto_hdr_parse(peer->rhdr, KVLI_TCP_DIR_REPLY, &peer->rh, why, sizeof(why)) != 0) {
        kvli_tcp_peer_mark_dead(peer, EPROTO, "protocol error: reply header: %s", why);
        return -1;
    }
    if (m == NULL || m->id != peer->rh.id ||
        peer->rh.type != (m->type == KVLI_TCP_MSG_WRITE ? KVLI_TCP_MSG_WRITE_ACK
                          : m->type == KVLI_TCP_MSG_READ ? KVLI_TCP_MSG_READ_DATA
                                                         : KVLI_TCP_MSG_NOTIF_ACK)) {
        kvli_tcp_peer_mark_dead(peer, EPROTO, "protocol error: %s reply id %" PRIu64 " with %"
                                PRIu64 " bytes does not answer the oldest request (id %" PRIu64
                                ")", kvli_tcp_proto_type_name(peer->rh.type), peer->rh.id,
                                peer->rh.payload, m ? m->id : 0);
        return -1;
    }
    /* A READ answered as done must carry exactly the bytes asked for. */
    if (peer->rh.type == KVLI_TCP_MSG_READ_DATA && peer->rh.status == 0 &&
        peer->rh.payload != m->bytes) {
        kvli_tcp_peer_mark_dead(peer, EPROTO, "protocol error: READ_DATA reply to request %"
                                PRIu64 " carries %" PRIu64 " bytes, the request asked for %"
                                PRIu64, m->id, peer->rh.payload, m->bytes);
        return -1;
    }
    peer->rtext_got = 0;
    peer->rpay_got = 0;
    peer->rphase = 1;
    return 0;
}

void kvli_tcp_peer_rx(kvli_tcp_peer_t *peer)
{
    kvli_tcp_iface_t *iface = peer->iface;
    uint64_t budget = KVLI_TCP_BUDGET;
    while (!peer->dead && budget > 0) {
        ssize_t n;
        if (peer->rphase == 0) {
            n = recv(peer->fd, peer->rhdr + peer->rhdr_got, KVLI_TCP_HDR_LEN - peer->rhdr_got,
                     MSG_DONTWAIT);
            if (n <= 0)
                goto io;
            peer->progress_ns = kvli_clock_ns();
            peer->rhdr_got += (size_t)n;
            if (peer->rhdr_got < KVLI_TCP_HDR_LEN)
                continue;
            if (kvli_tcp_peer_rx_header(peer) != 0)
                return;
        }
        if (peer->rphase == 1) {
            if (peer->rtext_got < peer->rh.text_len) {
                n = recv(peer->fd, peer->rtext + peer->rtext_got,
                         peer->rh.text_len - peer->rtext_got, MSG_DONTWAIT);
                if (n <= 0)
                    goto io;
                peer->progress_ns = kvli_clock_ns();
                peer->rtext_got += (size_t)n;
                continue;
            }
            peer->rphase = 2;
        }
        if (peer->rpay_got < peer->rh.payload) {
            /* READ data lands straight in the transfer's memory. */
            kvli_tcp_msg_t *m = peer->wq_head;
            struct msghdr mh;
            int k = kvli_tcp_iov_append(iface->tx_iov, 0, 1024, m->iov, m->niov,
                                        (size_t)peer->rpay_got);
            memset(&mh, 0, sizeof(mh));
            mh.msg_iov = iface->tx_iov;
            mh.msg_iovlen = (size_t)k;
            n = recvmsg(peer->fd, &mh, MSG_DONTWAIT);
            if (n <= 0)
                goto io;
            peer->progress_ns = kvli_clock_ns();
            peer->rpay_got += (uint64_t)n;
            budget = (uint64_t)n >= budget ? 0 : budget - (uint64_t)n;
            if (peer->rpay_got < peer->rh.payload)
                continue;
        }
        kvli_tcp_peer_reply_done(peer);
        continue;
io:
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0 && errno == EINTR)
            continue;
        kvli_tcp_peer_io_dead(peer, peer->rphase == 2 ? "recvmsg(READ data)" : "recv(reply)", n,
                              n < 0 ? errno : 0);
        return;
    }
}

void kvli_tcp_peer_tx(kvli_tcp_peer_t *peer)
{
    kvli_tcp_iface_t *iface = peer->iface;
    uint64_t budget = KVLI_TCP_BUDGET;
    while (!peer->dead && peer->sq_head != NULL && budget > 0) {
        kvli_tcp_msg_t *m = peer->sq_head;
        size_t skip = m->sent;
        struct msghdr mh;
        ssize_t n;
        int k = 0;
        if (m->sent == 0 && m->xp != NULL && m->xp->status != KVL_OK &&
            (m->type == KVLI_TCP_MSG_WRITE || m->type == KVLI_TCP_MSG_READ))
            return; /* its transfer failed: reap takes the request back */
        if (m->ticket != NULL) {
            /* a staged WRITE goes once its VRAM download is done */
            kvl_error_t e;
            int r = iface->ctx->stage_test(iface->ctx, m->ticket, 0, &e);
            if (r == 0)
                return;
            m->ticket = NULL;
            atomic_fetch_sub(&iface->staging, 1);
            if (r < 0) {
                kvli_tcp_xfer_fail(m->xp, e.code, &e);
                return;
            }
        }
        k = kvli_tcp_iov_append(iface->tx_iov, k, 1024,
                                &(struct iovec){m->head, m->head_len}, 1, skip);
        skip = skip > m->head_len ? skip - m->head_len : 0;
        /* WRITE payload straight from the caller's registered memory. */
        if (m->type == KVLI_TCP_MSG_WRITE)
            k = kvli_tcp_iov_append(iface->tx_iov, k, 1024, m->iov, m->niov, skip);
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iface->tx_iov;
        mh.msg_iovlen = (size_t)k;
        n = sendmsg(peer->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return;
            if (e == EINTR)
                continue;
            kvli_tcp_peer_io_dead(peer, "sendmsg()", n, e);
            return;
        }
        peer->progress_ns = kvli_clock_ns();
        if (m->sent == 0 && n > 0) {
            peer->sq_unsent--;
            m->off0 = peer->tx_off;
        }
        peer->tx_off += (uint64_t)n;
        m->sent += (size_t)n;
        budget = (uint64_t)n >= budget ? 0 : budget - (uint64_t)n;
        if (m->sent < m->total)
            continue;
        peer->sq_head = m->next;
        if (peer->sq_head == NULL)
            peer->sq_tail = NULL;
        if (m->type == KVLI_TCP_MSG_NOTIF_GRANTED) {
            /* within the grant: as good as queued there */
            if (m->wait != NULL) {
                m->wait->state = 1;
                m->wait = NULL;
                pthread_cond_broadcast(&iface->cond);
            }
            if (m->xp != NULL) {
                m->xp->notif_state = KVLI_TCP_NOTIF_SENT;
                m->xp = NULL;
            }
            if (m->id == 0) {
                kvli_tcp_msg_free(iface, m);
                continue;
            }
        }
        if (m->type == KVLI_TCP_MSG_NOTIF || m->type == KVLI_TCP_MSG_NOTIF_GRANTED)
            peer->win_reqs++; /* answered too: waits with the requests */
        if (m->type == KVLI_TCP_MSG_WRITE || m->type == KVLI_TCP_MSG_READ ||
            m->type == KVLI_TCP_MSG_NOTIF || m->type == KVLI_TCP_MSG_NOTIF_GRANTED) {
            m->next = NULL;
            if (peer->wq_tail != NULL)
                peer->wq_tail->next = m;
            else
                peer->wq_head = m;
            peer->wq_tail = m;
        } else {
            /* a CANCELED notice: unanswered */
            if (m->xp != NULL)
                m->xp->notif_state = KVLI_TCP_NOTIF_SENT;
            kvli_tcp_msg_free(iface, m);
        }
    }
}

kvl_status_t kvli_tcp_peer_notif_send(void *bk, void *peer_h, const void *msg, size_t len,
                                      kvl_error_t *err)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_peer_t *peer = peer_h;
    kvli_tcp_msg_t *m;
    kvli_tcp_nwait_t w;
    kvl_status_t st;
    if (len > KVLI_TCP_NOTIF_MAX || (len > 0 && msg == NULL)) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                         "tcp notification of %zu bytes (limit %u)", len, KVLI_TCP_NOTIF_MAX);
        kvl_bk_error_hint(err, "send at most KVL_NOTIF_MAX bytes; put bulk data in a transfer");
        return KVL_ERR_INVALID_ARG;
    }
    st = kvli_tcp_peer_ensure(peer, iface->timeout_ms, err);
    if (st != KVL_OK)
        return st;
    m = kvli_tcp_notif_new(len);
    if (m == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: malloc() of a %zu-byte notification failed", len);
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    if (len > 0)
        memcpy(m->head + KVLI_TCP_HDR_LEN, msg, len);
    memset(&w, 0, sizeof(w));
    pthread_mutex_lock(&iface->lock);
    if (peer->dead) {
        st = kvli_tcp_peer_disconnect_error(peer, 0, 0, 0, err);
        pthread_mutex_unlock(&iface->lock);
        free(m);
        return st;
    }
    kvli_tcp_notif_form(peer, m, len);
    if (!kvli_tcp_peer_busy(peer))
        peer->progress_ns = kvli_clock_ns();
    m->wait = &w;
    kvli_tcp_peer_enqueue(peer, m);
    kvli_progress_wake(&iface->pg);
    /* Return once the target answered (protocol 3): queued, or refused
     * because its queue is full; within our grant, once the kernel has the
     * bytes (room is reserved for it there). Bounded: the progress thread
     * declares the peer dead after timeout_ms without progress. */
    while (w.state == 0 && iface->pg.started && !kvli_progress_stopping(&iface->pg))
        pthread_cond_wait(&iface->cond, &iface->lock);
    if (w.state == 0) {
        /* the backend is closing: the message stays queued and is freed with it */
        m->wait = NULL;
        w.state = -1;
    }
    if (w.state == 1)
        st = KVL_OK;
    else if (w.state == 2)
        st = kvli_notif_refused(err, KVLI_TCP_NAME, peer->name, w.status, w.text, UINT64_MAX);
    else
        st = kvli_tcp_peer_disconnect_error(peer, 0, 0, 0, err);
    pthread_mutex_unlock(&iface->lock);
    return st;
}
