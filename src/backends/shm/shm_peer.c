/*
 * kvlane shm backend: the peer object. Loading a peer from untrusted
 * metadata, the HELLO handshake, the cross-memory-attach probe and its
 * diagnosis, the initiator side of the socket protocol (replies read by the
 * progress thread) and peer death.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include "common/errname.h"
#include "shm.h"
#include "common/mac.h"
#include "common/notif_full.h"
#include "shm_proto.h"


static uint16_t kvli_shm_get16(const uint8_t *b) { uint16_t v; memcpy(&v, b, 2); return v; }
static uint32_t kvli_shm_get32(const uint8_t *b) { uint32_t v; memcpy(&v, b, 4); return v; }
static uint64_t kvli_shm_get64(const uint8_t *b) { uint64_t v; memcpy(&v, b, 8); return v; }

static kvl_status_t kvli_shm_bad_meta(kvl_error_t *err, const char *name,
                                      const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kvl_status_t kvli_shm_bad_meta(kvl_error_t *err, const char *name,
                                      const char *fmt, ...)
{
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_SHM_NAME, -1,
                     "shm connection info of agent '%s': %s", name, what);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", name);
    kvl_bk_error_hint(err, "the metadata blob is corrupted or was produced by an "
                      "incompatible kvlane build; fetch it again from the peer");
    return KVL_ERR_BAD_METADATA;
}

/* ---- death and replies ---- */

void kvli_shm_peer_mark_dead(kvli_shm_peer_t *peer, int sys_errno, const char *fmt, ...)
{
    kvli_shm_iface_t *iface = peer->iface;
    kvli_shm_req_t *r;
    va_list ap;
    int first = 0;

    pthread_mutex_lock(&iface->lock);
    if (!atomic_load(&peer->dead)) {
        first = 1;
        peer->dead_errno = sys_errno;
        va_start(ap, fmt);
        vsnprintf(peer->dead_what, sizeof(peer->dead_what), fmt, ap);
        va_end(ap);
        atomic_store(&peer->dead, 1);
        /* Every request still waiting ends now; none gets a reply any more.
         * The socket is shut down below, so the target (protocol 4) drops
         * what it has not copied; what it may have is kept for the error. */
        while ((r = peer->pending) != NULL) {
            peer->pending = r->next;
            r->done = 1;
            r->status = KVL_ERR_REMOTE_DISCONNECT;
            r->sys_errno = sys_errno;
            if (r->xp != NULL && r->xp->outstanding > 0)
                r->xp->outstanding--;
            if (r->xp != NULL && r->expect == KVLI_SHM_MSG_WRITE_ACK)
                r->xp->sock_inflight += r->landable;
        }
        pthread_cond_broadcast(&iface->cond);
        /* Wakes any thread blocked sending to it. Under the lock: the
         * progress thread closes a dead peer's fd under it too. */
        if (peer->fd >= 0)
            shutdown(peer->fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&iface->lock);
    if (first) {
        iface->ctx->log(iface->ctx, KVL_LOG_INFO, "agent '%s' (pid %d) disconnected: %s",
                        peer->name, (int)peer->pid, peer->dead_what);
    }
}

void kvli_shm_peer_release(kvli_shm_peer_t *peer)
{
    kvli_shm_iface_t *iface = peer->iface;
    peer->released = 1;
    pthread_mutex_lock(&peer->send_lock); /* a sender in flight returns first */
    close(peer->fd);
    peer->fd = -1;
    pthread_mutex_unlock(&peer->send_lock);
    if (peer->pidfd >= 0)
        close(peer->pidfd);
    peer->pidfd = -1;
    kvli_shm_md_unmap_dead(peer);
    kvli_shm_guard_detach(peer);
    iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "agent '%s' (pid %d): dead, its socket and "
                    "mappings released", peer->name, (int)peer->pid);
}

kvl_status_t kvli_shm_peer_disconnect_error(kvli_shm_peer_t *peer, uint64_t moved,
                                            uint64_t total, uint64_t inflight,
                                            kvl_error_t *err)
{
    char what[200];
    int e;
    pthread_mutex_lock(&peer->iface->lock);
    snprintf(what, sizeof(what), "%s", peer->dead_what);
    e = peer->dead_errno;
    pthread_mutex_unlock(&peer->iface->lock);
    if (total > 0 && inflight > 0)
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, e, KVLI_SHM_NAME, -1,
                         "agent '%s' (pid %d) disconnected after %" PRIu64 " of %" PRIu64
                         " bytes moved: %s; up to %" PRIu64 " bytes of this transfer reached "
                         "its socket unanswered and may still land", peer->name,
                         (int)peer->pid, moved, total, what, inflight);
    else if (total > 0)
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, e, KVLI_SHM_NAME, -1,
                         "agent '%s' (pid %d) disconnected after %" PRIu64 " of %" PRIu64
                         " bytes moved: %s; none of its bytes can land any more", peer->name,
                         (int)peer->pid, moved, total, what);
    else
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, e, KVLI_SHM_NAME, -1,
                         "agent '%s' (pid %d) disconnected: %s", peer->name,
                         (int)peer->pid, what);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    kvl_bk_error_hint(err, inflight > 0
                      ? "the connection was shut down, so a kvlane target (shm protocol 4) "
                        "drops what it had not copied yet; still, treat the destination "
                        "blocks as undefined and write them again"
                      : "the peer process exited, crashed or closed its agent; "
                        "check its logs, load its new metadata once it is back, retry");
    return KVL_ERR_REMOTE_DISCONNECT;
}

static void kvli_shm_peer_io_dead(kvli_shm_peer_t *peer, const char *call, int rc)
{
    if (rc == KVLI_SHM_EOF)
        kvli_shm_peer_mark_dead(peer, 0, "%s = 0 (connection closed by the peer)", call);
    else if (rc == EAGAIN || rc == EWOULDBLOCK)
        kvli_shm_peer_mark_dead(peer, ETIMEDOUT, "%s = -1 EAGAIN: no data for %" PRIu64
                                " ms in the middle of a message", call,
                                peer->iface->timeout_ms);
    else
        kvli_shm_peer_mark_dead(peer, rc, "%s = -1 %s (%s)", call,
                                kvli_errno_name(rc), strerror(rc));
}

void kvli_shm_peer_req_add(kvli_shm_peer_t *peer, kvli_shm_req_t *req)
{
    /* caller holds iface->lock */
    req->id = ++peer->next_id;
    req->landable = req->expect == KVLI_SHM_MSG_WRITE_ACK ? req->bytes : 0;
    req->done = 0;
    req->status = KVL_OK;
    req->sys_errno = 0;
    req->text[0] = '\0';
    req->fd = -1;
    req->next = peer->pending;
    peer->pending = req;
    if (req->xp != NULL)
        req->xp->outstanding++;
}

void kvli_shm_peer_req_drop(kvli_shm_peer_t *peer, kvli_shm_req_t *req)
{
    /* caller holds iface->lock; a late reply to it is drained and ignored */
    kvli_shm_req_t **rp;
    for (rp = &peer->pending; *rp != NULL; rp = &(*rp)->next) {
        if (*rp == req) {
            *rp = req->next;
            if (req->xp != NULL && req->xp->outstanding > 0)
                req->xp->outstanding--;
            if (req->xp != NULL && req->expect == KVLI_SHM_MSG_WRITE_ACK)
                req->xp->sock_inflight += req->landable;
            req->done = 1;
            return;
        }
    }
}

static kvli_shm_req_t *kvli_shm_req_find(kvli_shm_peer_t *peer, uint64_t id)
{
    kvli_shm_req_t *r;
    for (r = peer->pending; r != NULL; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

static void kvli_shm_req_complete(kvli_shm_peer_t *peer, kvli_shm_req_t *r)
{
    /* caller holds iface->lock */
    kvli_shm_req_t **rp;
    kvli_shm_xpriv_t *xp = r->xp;
    if (r->done)
        return;
    for (rp = &peer->pending; *rp != NULL; rp = &(*rp)->next) {
        if (*rp == r) {
            *rp = r->next;
            break;
        }
    }
    r->done = 1;
    if (xp != NULL) {
        if (xp->outstanding > 0)
            xp->outstanding--;
        if (r->status == KVL_OK) {
            xp->sock_moved += r->bytes;
        } else if (xp->sock_status == KVL_OK) {
            xp->sock_status = KVL_ERR_REMOTE_REFUSED;
            snprintf(xp->sock_text, sizeof(xp->sock_text), "%s (status %d)", r->text,
                     (int)r->status);
        }
    }
    pthread_cond_broadcast(&peer->iface->cond);
}

/* Progress thread: one reply from the peer we connected to. */
void kvli_shm_peer_progress(kvli_shm_peer_t *peer)
{
    kvli_shm_iface_t *iface = peer->iface;
    kvli_shm_msg_hdr_t h;
    kvli_shm_msg_reply_t m;
    kvli_shm_req_t *r;
    char text[KVLI_SHM_TEXT_MAX + 1];
    uint64_t payload;
    int fd = -1, rc;

    rc = kvli_shm_proto_recv(peer->fd, &h, sizeof(h), &fd);
    if (rc != 0) {
        kvli_shm_peer_io_dead(peer, "recvmsg(reply header)", rc);
        goto out;
    }
    if (h.magic != KVLI_SHM_MSG_MAGIC ||
        (h.type != KVLI_SHM_MSG_WRITE_ACK && h.type != KVLI_SHM_MSG_READ_DATA &&
         h.type != KVLI_SHM_MSG_FD_REPLY && h.type != KVLI_SHM_MSG_NOTIF_ACK) ||
        h.len < sizeof(m)) {
        kvli_shm_peer_mark_dead(peer, EPROTO, "protocol error: reply magic 0x%08x type %u "
                                "length %" PRIu64 " is not valid", h.magic, h.type, h.len);
        goto out;
    }
    rc = kvli_shm_proto_recv(peer->fd, &m, sizeof(m), NULL);
    if (rc != 0) {
        kvli_shm_peer_io_dead(peer, "recvmsg(reply)", rc);
        goto out;
    }
    payload = h.type == KVLI_SHM_MSG_READ_DATA && m.status == KVL_OK ? m.payload : 0;
    if (m.text_len > KVLI_SHM_TEXT_MAX || payload > KVLI_SHM_PAYLOAD_MAX ||
        h.len != sizeof(m) + m.text_len + payload) {
        kvli_shm_peer_mark_dead(peer, EPROTO, "protocol error: %s reply of %" PRIu64
                                " bytes with text %u and payload %" PRIu64,
                                kvli_shm_proto_type_name(h.type), h.len, m.text_len,
                                payload);
        goto out;
    }
    rc = kvli_shm_proto_recv(peer->fd, text, m.text_len, NULL);
    if (rc != 0) {
        kvli_shm_peer_io_dead(peer, "recvmsg(reply text)", rc);
        goto out;
    }
    text[m.text_len] = '\0';
    if (h.type == KVLI_SHM_MSG_NOTIF_ACK && m.payload > KVLI_SHM_NOTIF_GRANT_MAX) {
        kvli_shm_peer_mark_dead(peer, EPROTO, "protocol error: NOTIF_ACK grants %" PRIu64
                                " slots (at most %u)", m.payload, KVLI_SHM_NOTIF_GRANT_MAX);
        goto out;
    }

    pthread_mutex_lock(&iface->lock);
    /* the grant counts even when nobody waits for the answer any more (the
     * target reserved it): our count must never fall behind its */
    if (h.type == KVLI_SHM_MSG_NOTIF_ACK) {
        peer->notif_slots += (uint32_t)m.payload;
        if (peer->notif_slots > peer->notif_slots_hi)
            peer->notif_slots_hi = peer->notif_slots;
        peer->notif_topup = 0;
    }
    r = kvli_shm_req_find(peer, h.id);
    if (r != NULL && r->expect == h.type && h.type == KVLI_SHM_MSG_READ_DATA &&
        m.status == KVL_OK && payload != r->bytes) {
        /* A READ answered as done must carry exactly the bytes asked for:
         * fewer (none at all) would leave the transfer's memory unwritten
         * and still report it done. */
        uint64_t want = r->bytes;
        pthread_mutex_unlock(&iface->lock);
        kvli_shm_peer_mark_dead(peer, EPROTO, "protocol error: READ_DATA reply to request %"
                                PRIu64 " carries %" PRIu64 " bytes, the request asked for %"
                                PRIu64, h.id, payload, want);
        goto out;
    }
    if (r == NULL || r->expect != h.type ||
        (payload != 0 && payload != r->bytes)) {
        pthread_mutex_unlock(&iface->lock);
        /* A request we gave up on (timeout): keep the stream in step. */
        if (payload != 0) {
            rc = kvli_shm_proto_drain(peer->fd, payload, iface->scratch,
                                      iface->scratch_len);
            if (rc != 0)
                kvli_shm_peer_io_dead(peer, "recvmsg(stale READ data)", rc);
        }
        goto out;
    }
    if (payload != 0) {
        /* Lands straight in the transfer's memory; busy keeps the transfer from
         * finishing (and its memory from being reused) while we write. */
        r->xp->busy++;
        pthread_mutex_unlock(&iface->lock);
        rc = kvli_shm_proto_recvv(peer->fd, r->iov, r->iovcnt);
        pthread_mutex_lock(&iface->lock);
        r->xp->busy--;
        pthread_cond_broadcast(&iface->cond);
        pthread_mutex_unlock(&iface->lock);
        if (rc != 0) {
            kvli_shm_peer_io_dead(peer, "recvmsg(READ data)", rc);
            goto out;
        }
        pthread_mutex_lock(&iface->lock);
    }
    r->status = m.status;
    memcpy(r->text, text, m.text_len + 1);
    if (h.type == KVLI_SHM_MSG_FD_REPLY) {
        r->fd = fd;
        r->size = m.payload;
        fd = -1;
    }
    kvli_shm_req_complete(peer, r);
    pthread_mutex_unlock(&iface->lock);
out:
    if (fd >= 0)
        close(fd);
}

kvl_status_t kvli_shm_peer_send(kvli_shm_peer_t *peer, struct iovec *iov, int iovcnt,
                                kvl_error_t *err)
{
    int rc;
    if (atomic_load(&peer->dead))
        return kvli_shm_peer_disconnect_error(peer, 0, 0, 0, err);
    pthread_mutex_lock(&peer->send_lock);
    /* released (dead) since the check: its fd is closed */
    rc = peer->fd >= 0 ? kvli_shm_proto_sendv(peer->fd, iov, iovcnt) : ECONNRESET;
    pthread_mutex_unlock(&peer->send_lock);
    if (rc != 0) {
        if (rc == EAGAIN || rc == EWOULDBLOCK)
            kvli_shm_peer_mark_dead(peer, ETIMEDOUT, "sendmsg() = -1 EAGAIN: the peer "
                                    "took no data for %" PRIu64 " ms",
                                    peer->iface->timeout_ms);
        else
            kvli_shm_peer_mark_dead(peer, rc, "sendmsg() = -1 %s (%s)",
                                    kvli_errno_name(rc), strerror(rc));
        return kvli_shm_peer_disconnect_error(peer, 0, 0, 0, err);
    }
    return KVL_OK;
}

kvl_status_t kvli_shm_peer_send_req(kvli_shm_peer_t *peer, kvli_shm_req_t *req, size_t head_len,
                                    struct iovec *iov, int iovcnt, uint64_t timeout_ms)
{
    kvli_shm_iface_t *iface = peer->iface;
    uint64_t sent = 0;
    int rc;
    if (atomic_load(&peer->dead))
        return KVL_ERR_REMOTE_DISCONNECT;
    pthread_mutex_lock(&peer->send_lock);
    /* released (dead) since the check: its fd is closed */
    rc = peer->fd >= 0 ? kvli_shm_proto_sendv_tmo(peer->fd, iov, iovcnt, timeout_ms, &sent)
                       : ECONNRESET;
    pthread_mutex_unlock(&peer->send_lock);
    if (rc == 0)
        return KVL_OK;
    /* A message cut short breaks the stream: the peer is given up. Only the
     * payload bytes the socket took can land. */
    pthread_mutex_lock(&iface->lock);
    req->landable = sent > head_len ? sent - head_len : 0;
    if (req->landable > req->bytes)
        req->landable = req->bytes;
    pthread_mutex_unlock(&iface->lock);
    if (rc == ETIMEDOUT)
        kvli_shm_peer_mark_dead(peer, ETIMEDOUT, "sendmsg(): the peer took no data for %" PRIu64
                                " ms (the transfer's timeout) in the middle of a request",
                                timeout_ms);
    else
        kvli_shm_peer_mark_dead(peer, rc, "sendmsg() = -1 %s (%s)", kvli_errno_name(rc),
                                strerror(rc));
    return KVL_ERR_REMOTE_DISCONNECT;
}

/* After sending req (st: how the send went): wait for its answer, bounded
 * by timeout_ms; the request leaves the peer's list unless it was answered.
 * 1 when no answer came in time, else 0 (req.status holds the answer when
 * st was KVL_OK). */
static int kvli_shm_peer_req_wait(kvli_shm_peer_t *peer, kvli_shm_req_t *req, kvl_status_t st,
                                  uint64_t timeout_ms)
{
    kvli_shm_iface_t *iface = peer->iface;
    struct timespec dl;
    int timed_out = 0;
    kvli_shm_deadline(&dl, timeout_ms);
    pthread_mutex_lock(&iface->lock);
    while (st == KVL_OK && !req->done && !timed_out)
        timed_out = pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) == ETIMEDOUT &&
                    !req->done;
    if (st != KVL_OK || timed_out)
        kvli_shm_peer_req_drop(peer, req);
    pthread_mutex_unlock(&iface->lock);
    return timed_out;
}

kvl_status_t kvli_shm_peer_fd_request(kvli_shm_peer_t *peer, uint64_t shm_id, int *fd_p,
                                      uint64_t *size_p, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = peer->iface;
    kvli_shm_req_t req;
    kvli_shm_msg_hdr_t h;
    kvli_shm_msg_fdreq_t m;
    struct iovec iov[2];
    kvl_status_t st;

    memset(&req, 0, sizeof(req));
    req.expect = KVLI_SHM_MSG_FD_REPLY;
    pthread_mutex_lock(&iface->lock);
    kvli_shm_peer_req_add(peer, &req);
    pthread_mutex_unlock(&iface->lock);
    h.magic = KVLI_SHM_MSG_MAGIC;
    h.type = KVLI_SHM_MSG_FD_REQ;
    h.id = req.id;
    h.len = sizeof(m);
    m.shm_id = shm_id;
    iov[0].iov_base = &h;
    iov[0].iov_len = sizeof(h);
    iov[1].iov_base = &m;
    iov[1].iov_len = sizeof(m);
    st = kvli_shm_peer_send(peer, iov, 2, err);
    if (kvli_shm_peer_req_wait(peer, &req, st, iface->timeout_ms)) {
        kvl_bk_error_set(err, KVL_ERR_TIMEOUT, ETIMEDOUT, KVLI_SHM_NAME, -1,
                         "agent '%s' (pid %d) did not answer FD_REQ for allocation "
                         "%" PRIu64 " within %" PRIu64 " ms", peer->name,
                         (int)peer->pid, shm_id, iface->timeout_ms);
        kvl_bk_error_hint(err, "the peer is stuck or overloaded; check it, or raise "
                          "the agent timeout");
        return KVL_ERR_TIMEOUT;
    }
    if (st != KVL_OK)
        return st;
    if (req.status == KVL_ERR_REMOTE_DISCONNECT)
        return kvli_shm_peer_disconnect_error(peer, 0, 0, 0, err);
    if (req.status != KVL_OK || req.fd < 0) {
        if (req.fd >= 0)
            close(req.fd);
        kvl_bk_error_set(err, KVL_ERR_REMOTE_REFUSED, 0, KVLI_SHM_NAME, -1,
                         "agent '%s' refused to share allocation %" PRIu64 ": %s",
                         peer->name, shm_id,
                         req.text[0] ? req.text : "its reply carried no descriptor");
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        kvl_bk_error_hint(err, "the peer freed the allocation or its metadata is stale; "
                          "fetch the peer's metadata again");
        return KVL_ERR_REMOTE_REFUSED;
    }
    *fd_p = req.fd;
    *size_p = req.size;
    return KVL_OK;
}

/*
 * A notification (protocol 5): sent within our grant (small, room reserved
 * for it there) it is queued for sure and not answered; otherwise it is
 * answered: KVL_OK once the target queued it (the answer tops our grant up);
 * its refusal (queue full) or no answer within timeout_ms is the error.
 * xfer_bytes: the notification ends a transfer of that many bytes, all in
 * place (UINT64_MAX: sent alone), for the refusal's text.
 */
kvl_status_t kvli_shm_peer_notif(kvli_shm_peer_t *peer, const void *msg, size_t len,
                                 uint64_t xfer_bytes, uint64_t timeout_ms, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = peer->iface;
    kvli_shm_msg_hdr_t h;
    kvli_shm_msg_notif_t nm;
    kvli_shm_req_t req;
    struct iovec iov[3];
    kvl_status_t st;
    if (len > KVL_NOTIF_MAX || (len > 0 && msg == NULL)) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                         "notification of %zu bytes (limit %d)", len, KVL_NOTIF_MAX);
        kvl_bk_error_hint(err, "send at most KVL_NOTIF_MAX bytes; put bulk data in a "
                          "transfer");
        return KVL_ERR_INVALID_ARG;
    }
    h.magic = KVLI_SHM_MSG_MAGIC;
    h.len = len;
    iov[0].iov_base = &h;
    iov[0].iov_len = sizeof(h);
    iov[1].iov_base = (void *)(uintptr_t)msg;
    iov[1].iov_len = len;
    /* Small, and room granted for it: queued for sure, no answer to wait for. */
    pthread_mutex_lock(&iface->lock);
    if (len <= KVLI_SHM_NOTIF_SLOT && peer->notif_slots > 0) {
        /* Half spent: this one asks for more too (nobody waits for the
         * answer), so a steady stream never stops for a round trip. */
        peer->notif_slots--;
        h.id = 0;
        if (peer->notif_slots < peer->notif_slots_hi / 2 && !peer->notif_topup) {
            peer->notif_topup = 1;
            h.id = ++peer->next_id;
        }
        pthread_mutex_unlock(&iface->lock);
        h.type = KVLI_SHM_MSG_NOTIF_GRANTED;
        return kvli_shm_peer_send(peer, iov, 2, err);
    }
    /* Answered: it gives our unused slots back first, so the room held for
     * us counts for it (the target takes them off its count on arrival). */
    memset(&nm, 0, sizeof(nm));
    nm.surrender = peer->notif_slots;
    peer->notif_slots = 0;
    memset(&req, 0, sizeof(req));
    req.expect = KVLI_SHM_MSG_NOTIF_ACK;
    kvli_shm_peer_req_add(peer, &req);
    pthread_mutex_unlock(&iface->lock);
    h.type = KVLI_SHM_MSG_NOTIF;
    h.id = req.id;
    h.len = sizeof(nm) + len;
    iov[2] = iov[1];
    iov[1].iov_base = &nm;
    iov[1].iov_len = sizeof(nm);
    st = kvli_shm_peer_send(peer, iov, 3, err);
    if (kvli_shm_peer_req_wait(peer, &req, st, timeout_ms)) {
        kvl_bk_error_set(err, KVL_ERR_TIMEOUT, ETIMEDOUT, KVLI_SHM_NAME, -1,
                         "agent '%s' (pid %d) did not answer a notification within %"
                         PRIu64 " ms; it may or may not have queued it", peer->name,
                         (int)peer->pid, timeout_ms);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        kvl_bk_error_hint(err, "the peer is stuck or overloaded; check it, or raise "
                          "the agent timeout");
        return KVL_ERR_TIMEOUT;
    }
    if (st != KVL_OK)
        return st;
    if (req.status == KVL_ERR_REMOTE_DISCONNECT)
        return kvli_shm_peer_disconnect_error(peer, 0, 0, 0, err);
    if (req.status != KVL_OK)
        return kvli_notif_refused(err, KVLI_SHM_NAME, peer->name, req.status, req.text,
                                  xfer_bytes);
    return KVL_OK;
}

kvl_status_t kvli_shm_peer_notif_send(void *bk, void *peer_h, const void *msg, size_t len,
                                      kvl_error_t *err)
{
    kvli_shm_iface_t *iface = bk;
    return kvli_shm_peer_notif(peer_h, msg, len, UINT64_MAX, iface->timeout_ms, err);
}

/* ---- cross-memory attach probe ---- */

static int kvli_shm_read_int_file(const char *path, int *v)
{
    char buf[32];
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    *v = atoi(buf);
    return 0;
}

/* 1: CAP_SYS_PTRACE (bit 19) in our effective set, 0: not, -1: unknown */
static int kvli_shm_has_cap_ptrace(void)
{
    char buf[4096];
    ssize_t n;
    char *p;
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    p = strstr(buf, "CapEff:");
    if (p == NULL)
        return -1;
    return (strtoull(p + 7, NULL, 16) >> 19) & 1u ? 1 : 0;
}

static void kvli_shm_cma_explain(kvli_shm_peer_t *peer, int e, char *buf, size_t len)
{
    size_t o;
    int scope, cap;
    o = (size_t)snprintf(buf, len, "process_vm_readv(pid %d, 0x%" PRIx64 ", 8) = -1 %s (%s)",
                         (int)peer->pid, peer->probe_addr, kvli_errno_name(e),
                         strerror(e));
    if (o >= len)
        return;
    if (e == EPERM || e == EACCES) {
        if (kvli_shm_read_int_file("/proc/sys/kernel/yama/ptrace_scope", &scope) == 0)
            o += (size_t)snprintf(buf + o, len - o, "; yama ptrace_scope=%d%s", scope,
                                  scope == 1 ? " (only ancestors may attach)"
                                  : scope == 2 ? " (only CAP_SYS_PTRACE may attach)"
                                  : scope >= 3 ? " (attach disabled)" : "");
        if (o < len)
            o += (size_t)snprintf(buf + o, len - o, "; peer uid %u, ours %u",
                                  (unsigned)peer->uid, (unsigned)getuid());
        cap = kvli_shm_has_cap_ptrace();
        if (o < len)
            snprintf(buf + o, len - o, "; CAP_SYS_PTRACE %s our effective set%s",
                     cap == 1 ? "in" : cap == 0 ? "not in" : "unknown in",
                     peer->uid == getuid()
                     ? "; with equal uids the peer may be non-dumpable "
                       "(PR_SET_DUMPABLE 0) or seccomp forbids the call" : "");
    } else if (e == ESRCH) {
        snprintf(buf + o, len - o, "; pid %d is not visible here (exited?)",
                 (int)peer->pid);
    } else if (e == ENOSYS) {
        snprintf(buf + o, len - o, "; kernel without CONFIG_CROSS_MEMORY_ATTACH");
    } else if (e == EFAULT) {
        snprintf(buf + o, len - o, "; the probe address is not mapped in that process");
    }
}

static const char *kvli_shm_cma_fix(int e)
{
    if (e == EPERM || e == EACCES)
        return "run both processes as the same user with kernel.yama.ptrace_scope=0 "
               "(sysctl), or grant CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE), "
               "or allocate KV memory with kvl_mem_alloc() so the mmap path is used";
    if (e == ESRCH)
        return "run both agents in one pid namespace (containers: --pid=host or a "
               "shared pod pid namespace)";
    return "allocate KV memory with kvl_mem_alloc() so the mmap path is used";
}

static void kvli_shm_peer_probe(kvli_shm_peer_t *peer)
{
    kvli_shm_iface_t *iface = peer->iface;
    uint64_t word = 0;
    struct iovec l = { &word, sizeof(word) };
    struct iovec r = { (void *)(uintptr_t)peer->probe_addr, sizeof(word) };
    const char *fix = NULL;
    ssize_t n;

    peer->cma_ok = 0;
    if (iface->cma_off) {
        snprintf(peer->cma_reason, sizeof(peer->cma_reason), "cma=off");
        return;
    }
    n = process_vm_readv(peer->pid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)sizeof(word) && word == peer->incarnation) {
        peer->cma_ok = 1;
        return;
    }
    if (n < 0) {
        int e = errno;
        kvli_shm_cma_explain(peer, e, peer->cma_reason, sizeof(peer->cma_reason));
        fix = kvli_shm_cma_fix(e);
    } else {
        snprintf(peer->cma_reason, sizeof(peer->cma_reason),
                 "process_vm_readv(pid %d, 0x%" PRIx64 ", 8) = %zd read 0x%016" PRIx64
                 ", expected incarnation 0x%016" PRIx64 ": that pid is another process "
                 "(pid namespace mismatch or pid reuse)", (int)peer->pid,
                 peer->probe_addr, n, word, peer->incarnation);
        fix = "run both agents in one pid namespace";
    }
    iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                    "transfers to agent '%s' (pid %d) fall back to the socket path "
                    "(slower, one extra copy): cross-memory attach refused: %s. "
                    "To fix: %s", peer->name, (int)peer->pid, peer->cma_reason, fix);
}

/* ---- load / unload ---- */

static kvl_status_t kvli_shm_peer_parse(kvli_shm_iface_t *iface, const char *name,
                                        uint64_t incarnation, const uint8_t *c, size_t len,
                                        kvli_shm_peer_t *peer, kvl_error_t *err)
{
    uint32_t magic;
    uint16_t ver, flags, sl;
    uint64_t inc, netns, pidns;
    char boot[37];
    size_t i;

    if (c == NULL || len < KVLI_SHM_CONN_FIXED)
        return kvli_shm_bad_meta(err, name, "%zu bytes, at least %u needed",
                                 c == NULL ? (size_t)0 : len, KVLI_SHM_CONN_FIXED);
    magic = kvli_shm_get32(c);
    ver = kvli_shm_get16(c + 4);
    flags = kvli_shm_get16(c + 6);
    if (magic != KVLI_SHM_CONN_MAGIC)
        return kvli_shm_bad_meta(err, name, "magic 0x%08x, expected 0x%08x", magic,
                                 KVLI_SHM_CONN_MAGIC);
    if (ver != KVLI_SHM_CONN_VERSION)
        return kvli_shm_bad_meta(err, name, "version %u (this build reads %u)",
                                 (unsigned)ver, KVLI_SHM_CONN_VERSION);
    if (flags > 1)
        return kvli_shm_bad_meta(err, name, "unknown flags 0x%x", (unsigned)flags);
    sl = kvli_shm_get16(c + 88);
    if (sl == 0 || sl > sizeof(peer->addr.sun_path) - 2)
        return kvli_shm_bad_meta(err, name, "socket name length %u outside 1..%zu",
                                 (unsigned)sl, sizeof(peer->addr.sun_path) - 2);
    if (len != KVLI_SHM_CONN_FIXED + (size_t)sl)
        return kvli_shm_bad_meta(err, name, "%zu bytes, the socket name length says %zu",
                                 len, KVLI_SHM_CONN_FIXED + (size_t)sl);
    for (i = 0; i < sl; i++) {
        uint8_t ch = c[KVLI_SHM_CONN_FIXED + i];
        if (ch < 0x20 || ch >= 0x7f)
            return kvli_shm_bad_meta(err, name, "socket name byte %zu is 0x%02x, not "
                                     "printable", i, (unsigned)ch);
    }
    memcpy(boot, c + 48, 36);
    boot[36] = '\0';
    for (i = 0; i < 36; i++) {
        int dash = i == 8 || i == 13 || i == 18 || i == 23;
        char ch = boot[i];
        int hex = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
        if (dash ? ch != '-' : !hex)
            return kvli_shm_bad_meta(err, name, "boot id byte %zu is 0x%02x, not a UUID",
                                     i, (unsigned)(uint8_t)ch);
    }
    inc = kvli_shm_get64(c + 8);
    if (inc != incarnation)
        return kvli_shm_bad_meta(err, name, "incarnation 0x%016" PRIx64 " differs from the "
                                 "agent's 0x%016" PRIx64, inc, incarnation);
    peer->incarnation = inc;
    peer->probe_addr = kvli_shm_get64(c + 16);
    netns = kvli_shm_get64(c + 24);
    pidns = kvli_shm_get64(c + 32);
    peer->pid = (pid_t)kvli_shm_get32(c + 40);
    peer->uid = (uid_t)kvli_shm_get32(c + 44);
    if ((int32_t)kvli_shm_get32(c + 40) <= 0)
        return kvli_shm_bad_meta(err, name, "pid %d is not valid",
                                 (int32_t)kvli_shm_get32(c + 40));

    if (strcmp(boot, iface->boot_id) != 0) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_SHM_NAME, -1,
                         "agent '%s' runs on another host (boot id %s, ours %s)", name, boot,
                         iface->boot_id);
    } else if (netns != iface->netns_ino || pidns != iface->pidns_ino) {
        const char *ns = netns != iface->netns_ino ? "net" : "pid";
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_SHM_NAME, -1,
                         "agent '%s' runs on this host in another %s namespace (compare "
                         "/proc/<its pid>/ns/%s with /proc/self/ns/%s)", name, ns, ns, ns);
    }
    if (strcmp(boot, iface->boot_id) != 0 || netns != iface->netns_ino ||
        pidns != iface->pidns_ino) {
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", name);
        kvl_bk_error_hint(err, "the shm backend reaches agents on the same host in the "
                          "same pid and network namespaces only; use the tcp backend "
                          "(or share the namespaces: --pid=host --network=host)");
        return KVL_ERR_UNSUPPORTED;
    }
    memset(&peer->addr, 0, sizeof(peer->addr));
    peer->addr.sun_family = AF_UNIX;
    if (flags & 1u) {
        memcpy(peer->addr.sun_path + 1, c + KVLI_SHM_CONN_FIXED, sl);
        peer->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + sl);
    } else {
        memcpy(peer->addr.sun_path, c + KVLI_SHM_CONN_FIXED, sl);
        peer->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + sl + 1);
    }
    snprintf(peer->sock_desc, sizeof(peer->sock_desc), "%s%.*s", (flags & 1u) ? "@" : "",
             (int)sl, (const char *)c + KVLI_SHM_CONN_FIXED);
    return KVL_OK;
}

/* HELLO and its answer; *gfd_p gets the fd passed with HELLO_ACK (-1: none)
 * and *flags_p the answer's flags. */
static kvl_status_t kvli_shm_peer_hello_xchg(kvli_shm_peer_t *peer, int *gfd_p,
                                             uint32_t *flags_p, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = peer->iface;
    const char *me = iface->ctx->agent_name ? iface->ctx->agent_name : "";
    size_t nl = strlen(me);
    kvli_shm_msg_hdr_t h;
    kvli_shm_msg_hello_t m;
    struct iovec iov[4];
    uint8_t body[sizeof(kvli_shm_msg_hello_t) + KVL_NAME_MAX + KVLI_MAC_LEN];
    uint8_t mac[KVLI_MAC_LEN];
    size_t ml = iface->ctx->secret_len > 0 ? KVLI_MAC_LEN : 0;
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    int rc;

    /* Who serves the socket: our uid, or one allow_uids lets in. */
    memset(&cred, 0, sizeof(cred));
    if (getsockopt(peer->fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        !kvli_shm_uid_allowed(iface, cred.uid)) {
        kvl_bk_error_set(err, KVL_ERR_PERMISSION, 0, KVLI_SHM_NAME, -1,
                         "%s (agent '%s') is served by pid %d of uid %u; only uid %u (ours) "
                         "is trusted", peer->sock_desc, peer->name, (int)cred.pid,
                         (unsigned)cred.uid, (unsigned)geteuid());
        kvl_bk_error_hint(err, "run both agents as the same user, or list the other uid in "
                          "the shm parameter allow_uids on both sides");
        return KVL_ERR_PERMISSION;
    }
    peer->cred_uid = cred.uid;
    peer->cred_pid = cred.pid;
    if (nl > KVL_NAME_MAX - 1)
        nl = KVL_NAME_MAX - 1;
    h.magic = KVLI_SHM_MSG_MAGIC;
    h.type = KVLI_SHM_MSG_HELLO;
    h.id = 0;
    h.len = sizeof(m) + nl + ml;
    m.version = KVLI_SHM_PROTO_VERSION;
    m.name_len = (uint32_t)nl;
    m.incarnation = iface->ctx->incarnation;
    m.pid = (uint32_t)getpid();
    m.flags = ml ? KVLI_SHM_HELLO_MAC : 0;
    if (ml)
        kvli_shm_hello_mac(iface->ctx, 0, peer->incarnation, iface->ctx->incarnation, me, nl,
                           mac);
    iov[0].iov_base = &h;
    iov[0].iov_len = sizeof(h);
    iov[1].iov_base = &m;
    iov[1].iov_len = sizeof(m);
    iov[2].iov_base = (void *)(uintptr_t)me;
    iov[2].iov_len = nl;
    iov[3].iov_base = mac;
    iov[3].iov_len = ml;
    rc = kvli_shm_proto_sendv(peer->fd, iov, ml ? 4 : 3);
    if (rc == 0) /* a passed fd comes with the answer's first byte */
        rc = kvli_shm_proto_recv(peer->fd, &h, sizeof(h), gfd_p);
    if (rc == 0 && (h.magic != KVLI_SHM_MSG_MAGIC || h.type != KVLI_SHM_MSG_HELLO_ACK ||
                    h.len < sizeof(m) || h.len > sizeof(m) + KVL_NAME_MAX + KVLI_MAC_LEN)) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, KVLI_SHM_NAME, -1,
                         "%s answered HELLO with magic 0x%08x type %u length %" PRIu64
                         ", not a kvlane shm HELLO_ACK", peer->sock_desc, h.magic, h.type,
                         h.len);
        kvl_bk_error_hint(err, "another program or an incompatible kvlane build owns "
                          "that socket; check the peer's version");
        return KVL_ERR_REMOTE;
    }
    if (rc == 0)
        rc = kvli_shm_proto_recv(peer->fd, body, (size_t)h.len, NULL);
    if (rc != 0) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, rc > 0 ? rc : ECONNRESET,
                         KVLI_SHM_NAME, -1, "HELLO with agent '%s' on %s: %s", peer->name,
                         peer->sock_desc,
                         rc == KVLI_SHM_EOF ? "recvmsg() = 0 (connection closed)"
                         : rc == EAGAIN ? "no answer within the timeout"
                         : strerror(rc));
        kvl_bk_error_hint(err, "the peer closed the connection: it requires a proof of its "
                          "shared secret (set the same secret on both agents), it runs "
                          "another kvlane version (shm protocol), or it is exiting or stuck; "
                          "its log (WARN) says which");
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    memcpy(&m, body, sizeof(m));
    if (m.version != KVLI_SHM_PROTO_VERSION) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_SHM_NAME, -1,
                         "agent '%s' on %s speaks kvlane shm protocol %u, this agent "
                         "protocol %u", peer->name, peer->sock_desc, m.version,
                         KVLI_SHM_PROTO_VERSION);
        kvl_bk_error_hint(err, "run the same kvlane version on both agents");
        return KVL_ERR_UNSUPPORTED;
    }
    if (m.name_len > KVL_NAME_MAX - 1 ||
        h.len != sizeof(m) + m.name_len + ((m.flags & KVLI_SHM_HELLO_MAC) ? KVLI_MAC_LEN : 0)) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, KVLI_SHM_NAME, -1,
                         "%s answered HELLO with a malformed HELLO_ACK (name length %u, "
                         "body %" PRIu64 " bytes)", peer->sock_desc, m.name_len, h.len);
        kvl_bk_error_hint(err, "another program or an incompatible kvlane build owns "
                          "that socket; check the peer's version");
        return KVL_ERR_REMOTE;
    }
    if (ml) {
        kvli_shm_hello_mac(iface->ctx, 1, iface->ctx->incarnation, m.incarnation,
                           (const char *)body + sizeof(m), m.name_len, mac);
        if (!(m.flags & KVLI_SHM_HELLO_MAC) ||
            !kvli_mac_equal(mac, body + sizeof(m) + m.name_len, KVLI_MAC_LEN)) {
            kvl_bk_error_set(err, KVL_ERR_PERMISSION, 0, KVLI_SHM_NAME, -1,
                             "agent '%s' on %s %s", peer->name, peer->sock_desc,
                             (m.flags & KVLI_SHM_HELLO_MAC)
                             ? "proved another shared secret than ours"
                             : "did not prove our shared secret (it has none set)");
            kvl_bk_error_hint(err, "set the same secret on both agents "
                              "(kvl_agent_config_t.secret, Agent(secret=...))");
            return KVL_ERR_PERMISSION;
        }
    }
    if (m.incarnation != peer->incarnation || (pid_t)m.pid != peer->pid) {
        kvl_bk_error_set(err, KVL_ERR_STALE, 0, KVLI_SHM_NAME, -1,
                         "%s is served by pid %u incarnation 0x%016" PRIx64 "; the metadata "
                         "of agent '%s' says pid %d incarnation 0x%016" PRIx64,
                         peer->sock_desc, m.pid, m.incarnation, peer->name, (int)peer->pid,
                         peer->incarnation);
        kvl_bk_error_hint(err, "the peer restarted; fetch its current metadata");
        return KVL_ERR_STALE;
    }
    *flags_p = m.flags;
    return KVL_OK;
}

static kvl_status_t kvli_shm_peer_hello(kvli_shm_peer_t *peer, kvl_error_t *err)
{
    int gfd = -1;
    uint32_t flags = 0;
    kvl_status_t st = kvli_shm_peer_hello_xchg(peer, &gfd, &flags, err);
    /* The guard table lets us copy into its memory directly (shm_guard.c);
     * without one (the target could not make it) the socket path only. */
    if (st == KVL_OK && (flags & KVLI_SHM_HELLO_GUARD) && gfd < 0) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, KVLI_SHM_NAME, -1,
                         "agent '%s' on %s announced a guard table but passed no fd",
                         peer->name, peer->sock_desc);
        kvl_bk_error_hint(err, "run the same kvlane version on both agents");
        st = KVL_ERR_REMOTE;
    }
    if (st == KVL_OK && (flags & KVLI_SHM_HELLO_GUARD))
        st = kvli_shm_guard_attach(peer, gfd, err);
    if (gfd >= 0)
        close(gfd);
    return st;
}

kvl_status_t kvli_shm_peer_load(void *bk, const char *name, uint64_t incarnation,
                                const uint8_t *conn, size_t len, void **peer_p,
                                kvl_error_t *err)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_peer_t *peer;
    kvl_status_t st;
    int e;

    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "calloc(%zu) failed", sizeof(*peer));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    peer->iface = iface;
    peer->fd = -1;
    peer->pidfd = -1;
    snprintf(peer->name, sizeof(peer->name), "%s", name ? name : "?");
    st = kvli_shm_peer_parse(iface, peer->name, incarnation, conn, len, peer, err);
    if (st != KVL_OK)
        goto err_free;

    peer->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (peer->fd < 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "socket(AF_UNIX, SOCK_STREAM) = -1 %s (%s)",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n)");
        st = KVL_ERR_SYSTEM;
        goto err_free;
    }
    /* Bounds connect, HELLO and every later blocking send/recv on this socket. */
    kvli_shm_sock_set_timeouts(peer->fd, iface->timeout_ms);
    if (connect(peer->fd, (struct sockaddr *)&peer->addr, peer->addrlen) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, e, KVLI_SHM_NAME, -1,
                         "connect(%s) to agent '%s' (pid %d) = -1 %s (%s)",
                         peer->sock_desc, peer->name, (int)peer->pid,
                         kvli_errno_name(e), strerror(e));
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        kvl_bk_error_hint(err, e == EAGAIN || e == ETIMEDOUT
                          ? "the peer does not accept connections (stuck or overloaded)"
                          : "no agent listens there: the peer exited or its metadata is "
                            "stale; fetch its current metadata");
        st = KVL_ERR_REMOTE_DISCONNECT;
        goto err_close;
    }
    pthread_mutex_init(&peer->send_lock, NULL);
    st = kvli_shm_peer_hello(peer, err);
    if (st != KVL_OK)
        goto err_mutex;

#ifdef SYS_pidfd_open
    /* Lets transfers notice the process is gone before touching its pid. */
    peer->pidfd = (int)syscall(SYS_pidfd_open, (int)peer->pid, 0);
    if (peer->pidfd < 0)
        peer->pidfd = -1;
#endif
    kvli_shm_peer_probe(peer);

    pthread_mutex_lock(&iface->lock);
    peer->next = iface->peers;
    iface->peers = peer;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "agent '%s' (pid %d) loaded via %s: %s",
                    peer->name, (int)peer->pid, peer->sock_desc,
                    peer->cma_ok ? "cma" : "socket");
    *peer_p = peer;
    return KVL_OK;

err_mutex:
    pthread_mutex_destroy(&peer->send_lock);
err_close:
    kvli_shm_guard_detach(peer);
    close(peer->fd);
err_free:
    free(peer);
    return st;
}

void kvli_shm_peer_unload(void *bk, void *peer_h)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_peer_t *peer = peer_h, **pp;
    struct timespec dl;
    int detached;

    if (peer == NULL)
        return;
    kvli_shm_xfer_cancel_peer(iface, peer);

    pthread_mutex_lock(&iface->lock);
    peer->unloading = 1;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    /* Wait for the progress thread to stop polling the socket before closing it. */
    kvli_shm_deadline(&dl, iface->timeout_ms + 1000u);
    pthread_mutex_lock(&iface->lock);
    while (!peer->detached && !kvli_progress_stopping(&iface->pg)) {
        if (pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) == ETIMEDOUT)
            break;
    }
    detached = peer->detached;
    if (detached) {
        for (pp = &iface->peers; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == peer) {
                *pp = peer->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&iface->lock);
    if (!detached) {
        /* Leaking beats freeing what the progress thread may still read; close()
         * frees it after joining that thread. */
        iface->ctx->log(iface->ctx, KVL_LOG_ERROR,
                        "unloading agent '%s': the progress thread did not release its "
                        "socket within %" PRIu64 " ms; freed at backend close",
                        peer->name, iface->timeout_ms + 1000u);
        return;
    }
    kvli_shm_md_unmap_all(peer);
    kvli_shm_guard_detach(peer);
    if (peer->fd >= 0)
        close(peer->fd);
    if (peer->pidfd >= 0)
        close(peer->pidfd);
    pthread_mutex_destroy(&peer->send_lock);
    free(peer);
}

void kvli_shm_peer_describe(void *bk, void *peer_h, char *buf, size_t len)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_peer_t *peer = peer_h;
    int mapped;
    if (buf == NULL || len == 0)
        return;
    char dead[200] = "";
    pthread_mutex_lock(&iface->lock);
    mapped = peer->maps != NULL;
    if (atomic_load(&peer->dead))
        snprintf(dead, sizeof(dead), "%s", peer->dead_what);
    /* under the lock: a dead peer's guard table is unmapped under it */
    const char *alive = peer->released ? "" : kvli_shm_guard_alive(peer) > 0
                        ? "its lock, read per copy"
                        : peer->pidfd >= 0 ? "pidfd polled per copy"
                                           : "no pidfd, only the copy's ESRCH";
    pthread_mutex_unlock(&iface->lock);
    if (dead[0])
        snprintf(buf, len, "disconnected (%s); load its metadata again once it is back", dead);
    else if (peer->cma_ok)
        snprintf(buf, len, "%scma (target alive: %s)", mapped ? "mmap+" : "", alive);
    else if (iface->cma_off)
        snprintf(buf, len, "%ssocket (cma=off)", mapped ? "mmap+" : "");
    else
        snprintf(buf, len, "%ssocket (cross-memory attach refused: %s)",
                 mapped ? "mmap+" : "", peer->cma_reason);
}
