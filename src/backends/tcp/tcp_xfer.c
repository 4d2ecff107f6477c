/*
 * kvlane tcp backend: transfers. Posting and cancelling (application
 * threads), and what the progress thread does with a posted transfer: cut it
 * into requests of at most `chunk` bytes and 1022 ranges, keep a window of
 * requests in flight per peer (round robin between transfers, so many can
 * move at once on one connection), and finish it once every request it sent
 * was answered: then, and only then, no more of its bytes can land.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tcp.h"

int kvli_tcp_peer_busy(const kvli_tcp_peer_t *peer)
{
    return peer->xfers != NULL || peer->sq_head != NULL || peer->wq_head != NULL;
}

void kvli_tcp_xfer_fail(kvli_tcp_xpriv_t *xp, kvl_status_t st, const kvl_error_t *err)
{
    /* caller holds iface->lock; the first failure wins */
    if (xp->status != KVL_OK)
        return;
    xp->status = st;
    xp->err = malloc(sizeof(*xp->err));
    if (xp->err != NULL && err != NULL)
        memcpy(xp->err, err, sizeof(*err));
    else if (xp->err != NULL)
        kvl_bk_error_set(xp->err, st, 0, KVLI_TCP_NAME, -1, "%s", kvl_status_str(st));
}

void kvli_tcp_xfer_inflight_note(kvli_tcp_xpriv_t *xp)
{
    /* caller holds iface->lock: xp failed before its connection was given
     * up; its error must also say what may still land */
    size_t l;
    if (xp->inflight == 0 || xp->err == NULL)
        return;
    l = strlen(xp->err->what);
    snprintf(xp->err->what + l, sizeof(xp->err->what) - l, "; then the connection was reset: "
             "up to %" PRIu64 " bytes of this transfer reached the peer unanswered and may "
             "still land", xp->inflight);
}

static int kvli_tcp_span_ok(uint64_t base, uint64_t len, uint64_t stride, uint64_t count,
                            uint64_t rbase, uint64_t rlen)
{
    uint64_t last, end;
    if (count == 0 || __builtin_mul_overflow(count - 1, stride, &last) ||
        __builtin_add_overflow(base, last, &last) || __builtin_add_overflow(last, len, &end))
        return 0;
    return base >= rbase && end <= rbase + rlen;
}

static int kvli_tcp_seg_ok(kvli_tcp_xpriv_t *xp, const kvli_xpiece_t *pc)
{
    const kvl_bk_xfer_t *x = xp->x;
    uint64_t len, count, lstride, rstride, laddr = pc->p.laddr, raddr = pc->p.raddr;
    if (kvli_xchunk_indexed(x)) {
        len = x->ltab->len, count = 1, lstride = rstride = 0;
    } else {
        const kvl_seg_t *s = &x->segs[pc->p.seg];
        len = s->len, count = s->count, lstride = s->lstride, rstride = s->rstride;
    }
    const kvli_tcp_mh_t *lh = x->lmh[pc->lreg];
    const kvli_tcp_rh_t *rh = x->rmh[pc->rreg];
    if (lh == NULL || rh == NULL || rh->peer != xp->peer ||
        !kvli_tcp_span_ok(laddr, len, lstride, count, lh->addr, lh->len) ||
        !kvli_tcp_span_ok(raddr, len, rstride, count, rh->addr, rh->len)) {
        kvl_error_t e;
        kvl_bk_error_set(&e, KVL_ERR_OUT_OF_BOUNDS, 0, KVLI_TCP_NAME, -1,
                         "tcp %s %zu (local 0x%" PRIx64 ", remote 0x%" PRIx64 ", %" PRIu64
                         " x %" PRIu64 " bytes) lies outside the regions it names",
                         kvli_xchunk_indexed(x) ? "pair" : "segment", pc->p.seg, laddr, raddr,
                         count, len);
        kvl_bk_error_hint(&e, "a kvlane bug: the core validates descriptors before posting");
        kvli_tcp_xfer_fail(xp, KVL_ERR_OUT_OF_BOUNDS, &e);
        return 0;
    }
    return 1;
}

/* Walk the cursor (common/chunk.h) over at most KVLI_TCP_RANGES_MAX pieces
 * and `chunk` bytes; fill (when m is not NULL) local iovecs and remote
 * ranges. Without m, each segment is checked when first reached, and
 * *staged_p says whether a piece lies in staged (VRAM) memory. */
static int kvli_tcp_walk(kvli_tcp_xpriv_t *xp, uint64_t chunk, kvli_chunk_cur_t *cur,
                         kvli_tcp_msg_t *m, uint64_t *bytes_p, int *staged_p)
{
    const kvl_bk_xfer_t *x = xp->x;
    uint64_t bytes = 0;
    kvli_xpiece_t pc;
    int n = 0;
    while (n < (int)KVLI_TCP_RANGES_MAX && bytes < chunk &&
           kvli_xchunk_peek(cur, x, chunk - bytes, &pc)) {
        const kvli_piece_t p = pc.p;
        const kvli_tcp_mh_t *lh = x->lmh[pc.lreg];
        if (m == NULL && cur->blk == 0 && cur->off == 0 && !kvli_tcp_seg_ok(xp, &pc))
            return -1;
        if (m == NULL && lh->staged)
            *staged_p = 1;
        if (m != NULL) {
            m->iov[n].iov_base = (void *)(uintptr_t)p.laddr;
            if (m->bounce != NULL && lh->staged) {
                /* VRAM: the socket sees the bounce buffer, the copy sees VRAM */
                m->iov[n].iov_base = (uint8_t *)m->bounce + bytes;
                m->sp[m->nsp++] = (kvl_stage_piece_t){p.laddr, m->iov[n].iov_base, p.len,
                                                      lh->dev};
            }
            m->iov[n].iov_len = (size_t)p.len;
            kvli_put64(m->head + KVLI_TCP_HDR_LEN + 16u * (unsigned)n, p.raddr);
            kvli_put64(m->head + KVLI_TCP_HDR_LEN + 16u * (unsigned)n + 8, p.len);
        }
        n++;
        bytes += p.len;
        kvli_xchunk_take(cur, x, p.len);
    }
    *bytes_p = bytes;
    return n;
}

/* Cut the next request of xp; 0 when no staging buffer is free (wait). */
static int kvli_tcp_xfer_chunk(kvli_tcp_peer_t *peer, kvli_tcp_xpriv_t *xp)
{
    kvli_tcp_iface_t *iface = peer->iface;
    kvli_chunk_cur_t ahead = xp->cur;
    uint64_t bytes = 0;
    uint16_t type = xp->x->op == KVL_WRITE ? KVLI_TCP_MSG_WRITE : KVLI_TCP_MSG_READ;
    kvli_tcp_msg_t *m;
    void *bounce = NULL;
    int staged = 0;
    int n = kvli_tcp_walk(xp, iface->chunk, &ahead, NULL, &bytes, &staged);
    if (n < 0)
        return 1;
    if (n == 0) {
        xp->all_queued = 1;
        return 1;
    }
    if (staged) {
        kvl_error_t e;
        xp->staged = 1; /* for the path it reports */
        bounce = kvli_bounce_get(&iface->bounce, (size_t)iface->chunk, 0, &e);
        if (bounce == NULL) {
            if (e.code != KVL_OK)
                kvli_tcp_xfer_fail(xp, e.code, &e);
            return e.code != KVL_OK;
        }
    }
    m = kvli_tcp_msg_new(type, n, KVLI_TCP_HDR_LEN + 16u * (size_t)n);
    if (m != NULL && bounce != NULL) {
        m->bounce = bounce;
        m->sp = malloc(sizeof(*m->sp) * (size_t)n);
    }
    if (m == NULL || (bounce != NULL && m->sp == NULL)) {
        kvl_error_t e;
        kvl_bk_error_set(&e, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: malloc() of a request of %d ranges failed", n);
        kvl_bk_error_hint(&e, "the process is out of memory");
        kvli_tcp_xfer_fail(xp, KVL_ERR_NO_MEMORY, &e);
        if (m != NULL)
            kvli_tcp_msg_free(iface, m);
        else
            kvli_bounce_put(&iface->bounce, bounce);
        return 1;
    }
    kvli_tcp_walk(xp, iface->chunk, &xp->cur, m, &bytes, NULL);
    m->xp = xp;
    if (kvli_tcp_stage_request(peer, m) != 0) {
        kvli_tcp_msg_free(iface, m);
        return 1;
    }
    m->id = ++peer->next_id;
    m->bytes = bytes;
    kvli_tcp_proto_hdr_build(m->head, type, m->id,
                             16u * (uint64_t)n + (type == KVLI_TCP_MSG_WRITE ? bytes : 0), bytes);
    if (type == KVLI_TCP_MSG_WRITE)
        m->total += bytes;
    xp->outstanding++;
    peer->win_reqs++;
    peer->win_bytes += bytes;
    kvli_tcp_peer_enqueue(peer, m);
    if (kvli_xchunk_done(&xp->cur, xp->x))
        xp->all_queued = 1;
    return 1;
}

static kvli_tcp_xpriv_t *kvli_tcp_xfer_pick(kvli_tcp_peer_t *peer)
{
    kvli_tcp_xpriv_t *start = peer->rr ? peer->rr : peer->xfers, *xp = start;
    if (start == NULL)
        return NULL;
    do {
        if (!xp->all_queued && !xp->finished && xp->status == KVL_OK &&
            !atomic_load(&xp->cancel)) {
            peer->rr = xp->next;
            return xp;
        }
        xp = xp->next ? xp->next : peer->xfers;
    } while (xp != start);
    return NULL;
}

void kvli_tcp_xfer_generate(kvli_tcp_peer_t *peer)
{
    while (!peer->dead && peer->sq_unsent < 2 && peer->win_reqs < KVLI_TCP_WINDOW_REQS &&
           peer->win_bytes < KVLI_TCP_WINDOW_BYTES) {
        kvli_tcp_xpriv_t *xp = kvli_tcp_xfer_pick(peer);
        if (xp == NULL || !kvli_tcp_xfer_chunk(peer, xp))
            return;
    }
}

/* Requests of xp not yet started go away; one partly on the wire stays. */
static void kvli_tcp_xfer_unqueue(kvli_tcp_peer_t *peer, kvli_tcp_xpriv_t *xp)
{
    kvli_tcp_msg_t **pp = &peer->sq_head, *prev = NULL;
    while (*pp != NULL) {
        kvli_tcp_msg_t *m = *pp;
        if (m->xp == xp && m->sent == 0 &&
            (m->type == KVLI_TCP_MSG_WRITE || m->type == KVLI_TCP_MSG_READ)) {
            *pp = m->next;
            if (peer->sq_tail == m)
                peer->sq_tail = prev;
            peer->sq_unsent--;
            peer->win_reqs--;
            peer->win_bytes -= m->bytes;
            xp->outstanding--;
            kvli_tcp_msg_free(peer->iface, m);
            continue;
        }
        prev = m;
        pp = &m->next;
    }
}

static int kvli_tcp_xfer_notice(kvli_tcp_peer_t *peer, kvli_tcp_xpriv_t *xp, uint16_t type)
{
    const kvl_bk_xfer_t *x = xp->x;
    kvli_tcp_msg_t *m = type == KVLI_TCP_MSG_NOTIF
                            ? kvli_tcp_notif_new(x->notif_len)
                            : kvli_tcp_msg_new(type, 0, KVLI_TCP_HDR_LEN + x->notif_len);
    if (m == NULL)
        return -1;
    /* NOTIF is answered (NOTIF_ACK), unless it goes within our grant */
    if (type == KVLI_TCP_MSG_NOTIF) {
        if (!kvli_tcp_notif_form(peer, m, x->notif_len))
            xp->outstanding++;
    } else {
        kvli_tcp_proto_hdr_build(m->head, type, m->id, x->notif_len, 0);
    }
    if (x->notif_len > 0)
        memcpy(m->head + KVLI_TCP_HDR_LEN, x->notif, x->notif_len);
    m->xp = xp;
    xp->notif_state = KVLI_TCP_NOTIF_QUEUED;
    kvli_tcp_peer_enqueue(peer, m);
    return 0;
}

static void kvli_tcp_xfer_finish(kvli_tcp_xpriv_t *xp, kvl_status_t st, kvli_tcp_xpriv_t **done)
{
    kvli_tcp_peer_t *peer = xp->peer;
    if (st == KVL_ERR_CANCELED) {
        kvl_error_t e;
        kvl_bk_error_set(&e, KVL_ERR_CANCELED, 0, KVLI_TCP_NAME, -1,
                         "transfer to agent '%s' cancelled after %" PRIu64 " of %" PRIu64
                         " bytes; no more bytes will land%s", peer->name, xp->moved,
                         xp->x->total_bytes,
                         xp->notif_state == KVLI_TCP_NOTIF_SENT
                             ? "; the peer got a CANCELED notice instead of the notification"
                             : "");
        xp->status = KVL_OK;
        kvli_tcp_xfer_fail(xp, KVL_ERR_CANCELED, &e);
    } else if (st == KVL_OK) {
        xp->status = KVL_OK;
    }
    xp->finished = -1; /* reaped: done is being reported */
    if (peer->rr == xp)
        peer->rr = xp->next;
    xp->next_done = *done;
    *done = xp;
}

void kvli_tcp_xfer_reap(kvli_tcp_peer_t *peer, kvli_tcp_xpriv_t **done)
{
    for (kvli_tcp_xpriv_t *xp = peer->xfers; xp != NULL; xp = xp->next) {
        int cancelled = atomic_load(&xp->cancel);
        const kvl_bk_xfer_t *x = xp->x;
        if (xp->finished)
            continue;
        if (xp->status != KVL_OK || (cancelled && xp->notif_state == KVLI_TCP_NOTIF_NONE))
            kvli_tcp_xfer_unqueue(peer, xp);
        if (xp->abort && !peer->dead && xp->outstanding > 0) {
            /* The agent is destroyed: no waiting for answers. The reset makes
             * a target drop what it has not copied (tcp_conn.c). */
            kvli_tcp_peer_mark_dead(peer, ECANCELED, "the agent is being destroyed: requests "
                                    "still on the wire were given up");
        }
        if (xp->outstanding > 0 ||
            (peer->sq_head != NULL && peer->sq_head->xp == xp && peer->sq_head->sent > 0))
            continue;
        if (xp->status != KVL_OK) {
            kvli_tcp_xfer_finish(xp, xp->status, done);
        } else if (xp->notif_state == KVLI_TCP_NOTIF_QUEUED) {
            continue; /* waits until its notification is answered (or its notice sent) */
        } else if (xp->notif_state == KVLI_TCP_NOTIF_SENT) {
            kvli_tcp_xfer_finish(xp, xp->notice ? KVL_ERR_CANCELED : KVL_OK, done);
        } else if (cancelled) {
            if (x->notif != NULL && !peer->dead && !xp->abort) {
                /* The remote expected a notification: it gets the notice. */
                if (kvli_tcp_xfer_notice(peer, xp, KVLI_TCP_MSG_CANCELED) == 0) {
                    xp->notice = 1;
                    continue;
                }
            }
            kvli_tcp_xfer_finish(xp, KVL_ERR_CANCELED, done);
        } else if (xp->all_queued) {
            if (x->notif != NULL && !peer->dead &&
                kvli_tcp_xfer_notice(peer, xp, KVLI_TCP_MSG_NOTIF) == 0)
                continue;
            if (x->notif != NULL) {
                kvl_error_t e;
                kvl_bk_error_set(&e, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                                 "tcp: malloc() of a %zu-byte notification failed",
                                 x->notif_len);
                kvl_bk_error_hint(&e, "the process is out of memory");
                kvli_tcp_xfer_fail(xp, KVL_ERR_NO_MEMORY, &e);
                kvli_tcp_xfer_finish(xp, KVL_ERR_NO_MEMORY, done);
                continue;
            }
            kvli_tcp_xfer_finish(xp, KVL_OK, done);
        }
    }
}

/* Report finished transfers to the core, then release cancel() waiters. */
void kvli_tcp_xfer_complete(kvli_tcp_iface_t *iface, kvli_tcp_xpriv_t *done)
{
    while (done != NULL) {
        kvli_tcp_xpriv_t *xp = done, **pp;
        kvl_bk_xfer_t *x = xp->x;
        done = xp->next_done;
        snprintf(x->path, sizeof(x->path), "%s",
                 xp->staged ? "socket, VRAM staged via pinned host memory" : "socket");
        if (xp->status != KVL_OK && xp->status != KVL_ERR_CANCELED)
            kvl_bk_xfer_error(xp->err, x, xp->peer->name);
        iface->ctx->xfer_done(x, xp->status, xp->status == KVL_OK ? NULL : xp->err);
        pthread_mutex_lock(&iface->lock);
        for (pp = &xp->peer->xfers; *pp != NULL; pp = &(*pp)->next)
            if (*pp == xp) {
                *pp = xp->next;
                break;
            }
        if (xp->peer->rr == xp)
            xp->peer->rr = NULL;
        xp->finished = 1;
        pthread_cond_broadcast(&iface->cond);
        if (xp->waiters == 0) {
            free(xp->err);
            free(xp);
        }
        pthread_mutex_unlock(&iface->lock);
    }
}

kvl_status_t kvli_tcp_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_peer_t *peer;
    kvli_tcp_xpriv_t *xp, **pp;
    kvl_status_t st;
    uint64_t tmo;

    if (x == NULL || x->peer == NULL || (x->op != KVL_READ && x->op != KVL_WRITE) ||
        (x->nsegs > 0 && (x->segs == NULL || x->lmh == NULL || x->rmh == NULL))) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                         "tcp xfer_post: transfer %p lacks a peer, an operation or its segments",
                         (void *)x);
        kvl_bk_error_hint(err, "a kvlane bug: the core builds transfers");
        return KVL_ERR_INVALID_ARG;
    }
    peer = x->peer;
    tmo = x->timeout_ms ? x->timeout_ms : iface->timeout_ms;
    st = kvli_tcp_peer_ensure(peer, tmo, err);
    if (st != KVL_OK)
        return st;
    xp = calloc(1, sizeof(*xp));
    if (xp == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: calloc(%zu) failed", sizeof(*xp));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    xp->x = x;
    xp->peer = peer;
    xp->timeout_ms = tmo;
    x->bk_priv = xp;
    x->path[0] = '\0';
    pthread_mutex_lock(&iface->lock);
    if (kvli_progress_stopping(&iface->pg) || peer->unloading) {
        pthread_mutex_unlock(&iface->lock);
        free(xp);
        kvl_bk_error_set(err, KVL_ERR_STATE, 0, KVLI_TCP_NAME, -1,
                         "tcp xfer_post: the backend is closing or the peer is being unloaded");
        kvl_bk_error_hint(err, "do not post transfers while the agent is destroyed or the "
                          "remote agent removed");
        return KVL_ERR_STATE;
    }
    if (peer->dead) {
        st = kvli_tcp_peer_disconnect_error(peer, 0, 0, 0, err);
        pthread_mutex_unlock(&iface->lock);
        free(xp);
        return st;
    }
    if (!kvli_tcp_peer_busy(peer))
        peer->progress_ns = kvli_clock_ns();
    for (pp = &peer->xfers; *pp != NULL; pp = &(*pp)->next)
        ;
    *pp = xp;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    return KVL_OK;
}

static void kvli_tcp_xfer_stop(void *bk, kvl_bk_xfer_t *x, int abort);

void kvli_tcp_xfer_cancel(void *bk, kvl_bk_xfer_t *x)
{
    kvli_tcp_xfer_stop(bk, x, 0);
}

void kvli_tcp_xfer_abort(void *bk, kvl_bk_xfer_t *x)
{
    kvli_tcp_xfer_stop(bk, x, 1);
}

static void kvli_tcp_xfer_stop(void *bk, kvl_bk_xfer_t *x, int abort)
{
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_xpriv_t *xp = NULL;
    pthread_mutex_lock(&iface->lock);
    /* Looked up, not taken from x->bk_priv: a finished transfer's priv is gone.
     * A record being reported (finished -1) stays listed until xfer_complete
     * takes it off after xfer_done: x may have been posted again meanwhile,
     * and then its live record (finished 0) is the one to stop. */
    for (kvli_tcp_peer_t *p = iface->peers; p != NULL; p = p->next)
        for (kvli_tcp_xpriv_t *q = p->xfers; q != NULL; q = q->next)
            if (q->x == x && q->finished != 1 && (xp == NULL || q->finished == 0))
                xp = q;
    if (xp == NULL) {
        pthread_mutex_unlock(&iface->lock);
        return;
    }
    atomic_store(&xp->cancel, 1);
    if (abort)
        xp->abort = 1;
    xp->waiters++;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    pthread_mutex_lock(&iface->lock);
    /* The progress thread ends it once its requests on the wire are answered,
     * or the peer is declared dead after timeout_ms without an answer; when
     * aborting, at once (the connection is reset). */
    while (xp->finished != 1)
        pthread_cond_wait(&iface->cond, &iface->lock);
    if (--xp->waiters == 0) {
        free(xp->err);
        free(xp);
    }
    pthread_mutex_unlock(&iface->lock);
}
