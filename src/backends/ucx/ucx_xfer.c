/*
 * kvlane ucx backend: transfers and notifications.
 *
 * A posting is queued to the progress thread, which issues the blocks as
 * ucp_put_nbx (WRITE) / ucp_get_nbx (READ) in batches of at most
 * KVLI_UCX_BATCH_BYTES or KVLI_UCX_BATCH_OPS, each batch followed by
 * ucp_ep_flush_nbx: when the flush completes every byte of the batch is in
 * place at the target. After the last flush the notification goes out as a
 * UCX active message, so it can never overtake the data.
 *
 * Cancel tells the truth: the progress thread stops issuing at the next
 * batch boundary and waits for the flush of what was issued (bounded); the
 * transfer ends CANCELED only when some blocks were never issued and no
 * issued byte can still land. A transfer whose last batch was already
 * issued completes normally (DONE, notification sent). One that ends
 * failed (the flush's bound, a refused put/get or flush, a dead peer) while
 * UCX may still hold its puts or gets keeps its local regions pinned until
 * the flush behind them ends (kvli_ucx_linger_start).
 *
 * A dead peer (UCX's endpoint error callback, or no flush completion for
 * timeout_ms) fails the transfer with the peer's name and the bytes moved.
 *
 * A transfer touching VRAM this UCX cannot map (or any, with data_path=am)
 * is staged instead: ucx_stage.c moves its bytes as active messages through
 * bounce buffers; cancel, dead peers and the notification work the same.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/notif_full.h"
#include "ucx.h"

/*
 * A notification: header {magic, name length, reserved, incarnation, id}
 * + the sender's name; the message is the AM's data. The target answers
 * every one on the reply endpoint with {magic, status, id, text length,
 * reserved} + text: KVL_OK once the message is queued, or why it was
 * refused (its queue is full), so the sender's call or transfer ends with
 * the truth, never KVL_OK for a message that was dropped.
 */
#define KVLI_UCX_NOTIF_MAGIC 0x4e554c4bu  /* "KLUN" */
#define KVLI_UCX_NOTIF_HDR 24u
#define KVLI_UCX_ANS_MAGIC 0x41554c4bu    /* "KLUA" */
#define KVLI_UCX_ANS_HDR 24u

void kvli_ucx_tok_cb(void *req, ucs_status_t status, void *user_data)
{
    kvli_ucx_token_t *tok = user_data;
    kvli_ucx_iface_t *iface = tok->iface;
    ucp_request_free(req);
    pthread_mutex_lock(&iface->lock);
    if (tok->abandoned) {
        pthread_mutex_unlock(&iface->lock);
        free(tok->buf);
        free(tok);
        return;
    }
    tok->done = 1;
    tok->status = status;
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
}

/* Under iface->lock: tok no longer waits for an answer (none can reach it). */
static void kvli_ucx_ans_unlink(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok)
{
    if (!tok->ans_linked)
        return;
    for (kvli_ucx_token_t **pp = &iface->ans_wait; *pp != NULL; pp = &(*pp)->ans_next)
        if (*pp == tok) {
            *pp = tok->ans_next;
            break;
        }
    tok->ans_linked = 0;
}

/* Give up on a token: free it now if UCX is done with it, else let the
 * callback free it. */
void kvli_ucx_tok_drop(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok)
{
    int done;
    if (tok == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    kvli_ucx_ans_unlink(iface, tok);
    done = tok->done;
    tok->abandoned = 1;
    pthread_mutex_unlock(&iface->lock);
    if (done) {
        free(tok->buf);
        free(tok);
    }
}

kvli_ucx_token_t *kvli_ucx_tok_new(kvli_ucx_iface_t *iface, size_t buf_len)
{
    kvli_ucx_token_t *tok = calloc(1, sizeof(*tok));
    if (tok == NULL)
        return NULL;
    tok->iface = iface;
    if (buf_len > 0 && (tok->buf = malloc(buf_len)) == NULL) {
        free(tok);
        return NULL;
    }
    return tok;
}

int kvli_ucx_tok_done(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok, ucs_status_t *s)
{
    int done;
    pthread_mutex_lock(&iface->lock);
    done = tok->done;
    *s = tok->status;
    pthread_mutex_unlock(&iface->lock);
    return done;
}

/* Has xp's notification been answered? (the answer handler runs on the
 * progress thread, but under the lock like every token field) */
static int kvli_ucx_tok_answered(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    int a;
    pthread_mutex_lock(&iface->lock);
    a = xp->tok->answered;
    pthread_mutex_unlock(&iface->lock);
    return a;
}

/* Build an AM notification (header + message) into tok->buf; the token
 * waits for its answer from now on. */
static size_t kvli_ucx_notif_build(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok,
                                   const void *msg, size_t len)
{
    uint8_t *buf = tok->buf;
    uint32_t magic = KVLI_UCX_NOTIF_MAGIC;
    uint16_t nl = (uint16_t)strlen(iface->ctx->agent_name), rsv = 0;

    pthread_mutex_lock(&iface->lock);
    tok->ans_id = ++iface->ans_next_id;
    tok->ans_next = iface->ans_wait;
    iface->ans_wait = tok;
    tok->ans_linked = 1;
    pthread_mutex_unlock(&iface->lock);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &nl, 2);
    memcpy(buf + 6, &rsv, 2);
    memcpy(buf + 8, &iface->ctx->incarnation, 8);
    memcpy(buf + 16, &tok->ans_id, 8);
    memcpy(buf + KVLI_UCX_NOTIF_HDR, iface->ctx->agent_name, nl);
    if (len > 0)
        memcpy(buf + KVLI_UCX_NOTIF_HDR + nl, msg, len);
    return KVLI_UCX_NOTIF_HDR + nl;
}

/* Send it. NULL (sent already) marks the token done: no callback comes. */
static ucs_status_ptr_t kvli_ucx_notif_issue(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                                             kvli_ucx_token_t *tok, size_t hlen, size_t len)
{
    ucp_request_param_t rp;
    ucs_status_ptr_t req;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = kvli_ucx_tok_cb;
    rp.user_data = tok;
    /* eager: the receiver gets the whole message in its handler; reply: it
     * answers on the endpoint it names */
    rp.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    req = ucp_am_send_nbx(peer->ep, KVLI_UCX_AM_ID, tok->buf, hlen,
                          (uint8_t *)tok->buf + hlen, len, &rp);
    if (req == NULL) {
        pthread_mutex_lock(&iface->lock);
        tok->done = 1;
        tok->status = UCS_OK;
        pthread_mutex_unlock(&iface->lock);
    }
    return req;
}

/* A notification that never left: no answer will come. */
static void kvli_ucx_notif_unissued(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok)
{
    pthread_mutex_lock(&iface->lock);
    kvli_ucx_ans_unlink(iface, tok);
    pthread_mutex_unlock(&iface->lock);
    free(tok->buf);
    free(tok);
}

/* Queue the answer to notification id (progress thread: the AM handler). */
static void kvli_ucx_notif_answer(kvli_ucx_iface_t *iface, ucp_ep_h ep, uint64_t id,
                                  kvl_status_t st, const char *text)
{
    uint32_t magic = KVLI_UCX_ANS_MAGIC, tlen = (uint32_t)strnlen(text, KVLI_UCX_NOTIF_TEXT - 1);
    int32_t st32 = st;
    kvli_ucx_nans_t *a = calloc(1, sizeof(*a));
    uint8_t *h;

    if (a == NULL || (a->tok = kvli_ucx_tok_new(iface, KVLI_UCX_ANS_HDR + tlen)) == NULL) {
        free(a);
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "could not answer a notification (out of "
                        "memory): its sender's bound ends its wait");
        return;
    }
    h = a->tok->buf;
    memset(h, 0, KVLI_UCX_ANS_HDR);
    memcpy(h, &magic, 4);
    memcpy(h + 4, &st32, 4);
    memcpy(h + 8, &id, 8);
    memcpy(h + 16, &tlen, 4);
    memcpy(h + KVLI_UCX_ANS_HDR, text, tlen);
    a->ep = ep;
    a->hlen = KVLI_UCX_ANS_HDR;
    a->tlen = tlen;
    if (iface->ans_out_tail == NULL)
        iface->ans_out_tail = &iface->ans_out;
    *iface->ans_out_tail = a;
    iface->ans_out_tail = &a->next;
}

ucs_status_t kvli_ucx_notif_recv(void *arg, const void *header, size_t header_length,
                                 void *data, size_t length, const ucp_am_recv_param_t *param)
{
    kvli_ucx_iface_t *iface = arg;
    const uint8_t *h = header;
    uint32_t magic;
    uint16_t nl;
    uint64_t id;
    char from[KVL_NAME_MAX], why[KVLI_UCX_NOTIF_TEXT];
    kvl_status_t st;

    if (header_length < KVLI_UCX_NOTIF_HDR || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "dropped a notification: header of %zu "
                        "bytes%s%s", header_length,
                        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? ", rendezvous" : "",
                        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? ""
                        : ", no reply endpoint");
        return UCS_OK;
    }
    memcpy(&magic, h, 4);
    memcpy(&nl, h + 4, 2);
    memcpy(&id, h + 16, 8);
    if (magic != KVLI_UCX_NOTIF_MAGIC || nl == 0 || nl >= KVL_NAME_MAX ||
        KVLI_UCX_NOTIF_HDR + (size_t)nl != header_length || length > KVL_NOTIF_MAX) {
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "dropped a malformed notification (header "
                        "%zu bytes, message %zu bytes)", header_length, length);
        return UCS_OK;
    }
    memcpy(from, h + KVLI_UCX_NOTIF_HDR, nl);
    from[nl] = '\0';
    why[0] = '\0';
    st = kvli_notif_take(iface->ctx, from, data, length, why, sizeof(why));
    kvli_ucx_notif_answer(iface, param->reply_ep, id, st, why);
    return UCS_OK;
}

ucs_status_t kvli_ucx_notif_ans_recv(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kvli_ucx_iface_t *iface = arg;
    const uint8_t *h = header;
    uint32_t magic, tlen;
    int32_t st;
    uint64_t id;
    kvli_ucx_token_t *tok;

    if (header_length != KVLI_UCX_ANS_HDR || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        goto bad;
    memcpy(&magic, h, 4);
    memcpy(&st, h + 4, 4);
    memcpy(&id, h + 8, 8);
    memcpy(&tlen, h + 16, 4);
    if (magic != KVLI_UCX_ANS_MAGIC || tlen != length || tlen >= KVLI_UCX_NOTIF_TEXT ||
        st > 0 || st < -999)
        goto bad;
    pthread_mutex_lock(&iface->lock);
    for (tok = iface->ans_wait; tok != NULL && tok->ans_id != id; tok = tok->ans_next)
        ;
    if (tok != NULL) {
        kvli_ucx_ans_unlink(iface, tok);
        tok->answered = 1;
        tok->ans_status = (kvl_status_t)st;
        memcpy(tok->ans_text, data, tlen);
        tok->ans_text[tlen] = '\0';
        pthread_cond_broadcast(&iface->cond);
    }
    pthread_mutex_unlock(&iface->lock);
    /* no waiter: its sender gave up (timeout, cancel, destroy) */
    return UCS_OK;

bad:
    iface->ctx->log(iface->ctx, KVL_LOG_WARN, "dropped a malformed answer to a notification "
                    "(header %zu bytes, text %zu bytes)", header_length, length);
    return UCS_OK;
}

int kvli_ucx_notif_progress(kvli_ucx_iface_t *iface)
{
    kvli_ucx_nans_t *a;
    while ((a = iface->ans_out) != NULL) {
        ucp_request_param_t rp;
        ucs_status_ptr_t req;
        iface->ans_out = a->next;
        if (iface->ans_out == NULL)
            iface->ans_out_tail = &iface->ans_out;
        memset(&rp, 0, sizeof(rp));
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                          UCP_OP_ATTR_FIELD_FLAGS;
        rp.cb.send = kvli_ucx_tok_cb;
        rp.user_data = a->tok;
        rp.flags = UCP_AM_SEND_FLAG_EAGER;
        req = ucp_am_send_nbx(a->ep, KVLI_UCX_AM_NOTIF_ANS, a->tok->buf, a->hlen,
                              (uint8_t *)a->tok->buf + a->hlen, a->tlen, &rp);
        if (UCS_PTR_IS_ERR(req))
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "answer to a notification not sent: "
                            "ucp_am_send_nbx() = %s (its sender's bound ends its wait)",
                            ucs_status_string(UCS_PTR_STATUS(req)));
        if (req == NULL || UCS_PTR_IS_ERR(req)) {
            free(a->tok->buf);
            free(a->tok);
        } else {
            kvli_ucx_tok_drop(iface, a->tok); /* the callback frees it */
        }
        free(a);
    }
    return 0;
}

void kvli_ucx_notif_free_all(kvli_ucx_iface_t *iface)
{
    kvli_ucx_nans_t *a;
    while ((a = iface->ans_out) != NULL) {
        iface->ans_out = a->next;
        free(a->tok->buf);
        free(a->tok);
        free(a);
    }
    iface->ans_out_tail = &iface->ans_out;
}

kvl_status_t kvli_ucx_notif_send(void *bk, void *peerv, const void *msg, size_t len,
                                 kvl_error_t *err)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_peer_t *peer = peerv;
    kvli_ucx_token_t *tok;
    ucs_status_ptr_t req;
    ucs_status_t s = UCS_OK;
    struct timespec dl;
    size_t hlen;
    int dead, done, answered;
    kvl_status_t ans;
    char text[KVLI_UCX_NOTIF_TEXT];

    pthread_mutex_lock(&iface->lock);
    dead = peer->dead;
    if (dead)
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, 0, KVLI_UCX_NAME, -1,
                         "notification to agent '%s' not sent: %s", peer->name,
                         peer->dead_what);
    pthread_mutex_unlock(&iface->lock);
    if (dead) {
        kvl_bk_error_hint(err, "the peer died; reload its metadata once it restarts");
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    tok = kvli_ucx_tok_new(iface, KVLI_UCX_NOTIF_HDR + KVL_NAME_MAX + len);
    if (tok == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    hlen = kvli_ucx_notif_build(iface, tok, msg, len);
    req = kvli_ucx_notif_issue(iface, peer, tok, hlen, len);
    if (UCS_PTR_IS_ERR(req)) {
        s = UCS_PTR_STATUS(req);
        kvli_ucx_notif_unissued(iface, tok);
        kvl_bk_error_set(err, KVL_ERR_REMOTE, 0, KVLI_UCX_NAME, -1,
                         "ucp_am_send_nbx(notification to agent '%s', %zu bytes) = %s",
                         peer->name, len, ucs_status_string(s));
        kvl_bk_error_hint(err, "check that the peer is alive and reachable");
        return KVL_ERR_REMOTE;
    }
    /* sent (or being sent): wait for the target's answer, bounded */
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(iface->timeout_ms / 1000u);
    dl.tv_nsec += (long)(iface->timeout_ms % 1000u) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    kvli_progress_wake(&iface->pg);
    pthread_mutex_lock(&iface->lock);
    while (!tok->answered && !(tok->done && tok->status != UCS_OK) && !peer->dead &&
           pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) != ETIMEDOUT)
        ;
    done = tok->done;
    s = tok->status;
    answered = tok->answered;
    ans = tok->ans_status;
    snprintf(text, sizeof(text), "%s", tok->ans_text);
    dead = peer->dead;
    pthread_mutex_unlock(&iface->lock);
    kvli_ucx_tok_drop(iface, tok); /* freed now, or by UCX's callback */
    if (answered && ans == KVL_OK)
        return KVL_OK;
    if (answered)
        return kvli_notif_refused(err, KVLI_UCX_NAME, peer->name, ans, text, UINT64_MAX);
    if (done && s != UCS_OK)
        kvl_bk_error_set(err, dead ? KVL_ERR_REMOTE_DISCONNECT : KVL_ERR_REMOTE, 0,
                         KVLI_UCX_NAME, -1, "notification to agent '%s' (%zu bytes) not "
                         "sent: %s", peer->name, len, ucs_status_string(s));
    else
        kvl_bk_error_set(err, dead ? KVL_ERR_REMOTE_DISCONNECT : KVL_ERR_TIMEOUT, 0,
                         KVLI_UCX_NAME, -1, "notification to agent '%s' (%zu bytes): %s; it "
                         "may or may not have been queued there", peer->name, len,
                         dead ? "the peer died before it answered"
                              : "no answer from the peer within the timeout");
    snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    kvl_bk_error_hint(err, dead ? "the peer died; reload its metadata once it restarts"
                                : "check that the peer is alive and reachable, and not stopped "
                                  "or starved of CPU");
    return err->code;
}

/* ---- transfers ---- */

kvl_status_t kvli_ucx_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_peer_t *peer = x->peer;
    kvli_ucx_xpriv_t *xp;

    /* An indexed transfer (made from two prepared lists and index arrays:
     * creation only checks the indices) is put or got, or cut into staged
     * requests (VRAM, or data_path=am: ucx_stage.c), pair by pair from its
     * index arrays (kvli_xchunk_*): never paired into segments. */
    int staged = kvli_ucx_stage_needed(iface, x);
    if (kvli_xchunk_indexed(x)) {
        for (size_t i = 0; i < x->ltab->nregs || i < x->rtab->nregs; i++)
            if ((i < x->ltab->nregs && x->lmh[i] == NULL) ||
                (i < x->rtab->nregs && x->rmh[i] == NULL)) {
                kvl_bk_error_set(err, KVL_ERR_INTERNAL, 0, KVLI_UCX_NAME, -1,
                                 "region %zu of the transfer's lists has no ucx region handle",
                                 i);
                return KVL_ERR_INTERNAL;
            }
    }
    for (size_t i = 0; i < x->nsegs; i++)
        if (x->lmh[x->segs[i].lreg] == NULL || x->rmh[x->segs[i].rreg] == NULL) {
            kvl_bk_error_set(err, KVL_ERR_INTERNAL, 0, KVLI_UCX_NAME, -1,
                             "segment %zu has no ucx region handle", i);
            return KVL_ERR_INTERNAL;
        }
    xp = calloc(1, sizeof(*xp));
    if (xp == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    xp->x = x;
    xp->peer = peer;
    xp->state = KVLI_UCX_X_ISSUE;
    xp->timeout_ms = x->timeout_ms ? x->timeout_ms : iface->timeout_ms;
    xp->staged = staged;
    if (xp->staged)
        snprintf(x->path, sizeof(x->path), "%s", xp->staged > 1
                 ? "ucp am, VRAM staged via pinned host buffers"
                 : "ucp am via host bounce buffers (data_path=am)");
    else
        snprintf(x->path, sizeof(x->path), "ucp %s over %.48s",
                 x->op == KVL_WRITE ? "put" : "get", iface->tls_list);
    pthread_mutex_lock(&iface->lock);
    if (peer->dead || kvli_progress_stopping(&iface->pg)) {
        kvl_bk_error_set(err, peer->dead ? KVL_ERR_REMOTE_DISCONNECT : KVL_ERR_STATE, 0,
                         KVLI_UCX_NAME, -1, "transfer to agent '%.60s' not started: %.200s",
                         peer->name, peer->dead ? peer->dead_what : "the backend is closing");
        pthread_mutex_unlock(&iface->lock);
        kvl_bk_error_hint(err, "the peer died: reload its metadata once it restarts");
        free(xp);
        return err->code;
    }
    x->bk_priv = xp;
    kvli_ucx_xpriv_t **pp = &iface->queue;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = xp;
    peer->active++;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    return KVL_OK;
}

/* Call xfer_done once; the xpriv stays on the running list until the
 * progress loop releases it. */
void kvli_ucx_xfer_complete(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp, kvl_status_t st,
                            const kvl_error_t *err)
{
    int expect = 0;
    if (xp->staged)
        kvli_ucx_stage_abandon(iface, xp);
    kvli_ucx_tok_drop(iface, xp->tok);
    xp->tok = NULL;
    xp->state = KVLI_UCX_X_END;
    pthread_mutex_lock(&iface->lock);
    xp->peer->active--;
    pthread_mutex_unlock(&iface->lock);
    if (atomic_compare_exchange_strong(&xp->done_called, &expect, 1)) {
        kvl_error_t *e = NULL;
        if (st != KVL_OK && st != KVL_ERR_CANCELED && err != NULL &&
            (e = malloc(sizeof(*e))) != NULL) {
            memcpy(e, err, sizeof(*e));
            kvl_bk_xfer_error(e, xp->x, xp->peer->name); /* the one shape */
        }
        iface->ctx->xfer_done(xp->x, st, e != NULL ? e : err);
        free(e);
    }
}

/*
 * xp fails while UCX may still use its local regions: a READ's gets may
 * still write what they bring into them, a WRITE's puts may still read them
 * (the NIC, on RDMA) through the memory handles deregistration would unmap.
 * Its flush is outstanding (a batch's, or the one issued behind the puts or
 * gets that went out before a refused one, see kvli_ucx_xfer_flush_issued):
 * the flush token goes to a linger that pins those regions in the core
 * until the flush ends. 1 when it lingers, 0 when UCX holds none of them
 * any more (or nothing could be pinned: said in the log). Staged transfers
 * never linger: UCX only sees their bounce buffers.
 */
static int kvli_ucx_linger_start(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    kvl_bk_xfer_t *x = xp->x;
    size_t n = 0, k = 0;
    if (xp->staged || xp->tok == NULL || xp->state != KVLI_UCX_X_FLUSH ||
        xp->issued == xp->confirmed)
        return 0;
    /* the local regions: x->lmh[0 .. n), each one region */
    if (kvli_xchunk_indexed(x))
        n = x->ltab->nregs;
    else
        for (size_t i = 0; i < x->nsegs; i++)
            if (x->segs[i].lreg + (size_t)1 > n)
                n = x->segs[i].lreg + (size_t)1;
    kvli_ucx_linger_t *l = calloc(1, sizeof(*l) + n * sizeof(l->pins[0]));
    if (l == NULL) {
        if (x->op == KVL_READ)
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "out of memory to keep the regions of a "
                            "failed READ from agent '%s' in use while its gets end: do not "
                            "deregister them before that peer answers again", xp->peer->name);
        else
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "out of memory to keep the regions of a "
                            "failed WRITE to agent '%s' in use while its puts end: do not "
                            "deregister them before that peer answers again", xp->peer->name);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const kvli_ucx_mh_t *mh = x->lmh[i];
        void *bmh, *pin;
        kvl_error_t e;
        if (mh == NULL)
            continue;
        if (iface->ctx->region_pin(iface->ctx, mh->addr, mh->len, &bmh, &pin, &e) == KVL_OK)
            l->pins[k++] = pin;
    }
    l->npins = k;
    l->tok = xp->tok;
    xp->tok = NULL;
    l->next = iface->lingers;
    iface->lingers = l;
    return 1;
}

/* Progress thread: end the lingers whose flush ended (all: every one, at
 * teardown, once the workers are gone and nothing can land). */
void kvli_ucx_linger_sweep(kvli_ucx_iface_t *iface, int all)
{
    for (kvli_ucx_linger_t **pp = &iface->lingers, *l; (l = *pp) != NULL;) {
        ucs_status_t s;
        if (!all && !kvli_ucx_tok_done(iface, l->tok, &s)) {
            pp = &l->next;
            continue;
        }
        *pp = l->next;
        for (size_t i = 0; i < l->npins; i++)
            iface->ctx->region_unpin(iface->ctx, l->pins[i]);
        kvli_ucx_tok_drop(iface, l->tok);
        free(l);
    }
}

void kvli_ucx_xfer_fail(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp, kvl_status_t code,
                        const char *why)
{
    kvl_error_t err;
    kvl_bk_xfer_t *x = xp->x;
    int lingers = kvli_ucx_linger_start(iface, xp);
    kvl_bk_error_set(&err, code, 0, KVLI_UCX_NAME, -1,
                     "%s of %llu bytes with agent '%s' failed: %s; %llu bytes confirmed "
                     "in place, %llu issued%s", x->op == KVL_WRITE ? "WRITE" : "READ",
                     (unsigned long long)x->total_bytes, xp->peer->name, why,
                     (unsigned long long)xp->confirmed, (unsigned long long)xp->issued,
                     !lingers ? ""
                     : x->op == KVL_READ ? "; the gets still in flight may land yet: the "
                                           "transfer's local regions stay in use until they end"
                     : "; the puts still in flight may still read the local regions and land at "
                       "the target: the transfer's local regions stay in use until they end");
    snprintf(err.agent, sizeof(err.agent), "%s", xp->peer->name);
    kvl_bk_error_hint(&err, code == KVL_ERR_REMOTE_DISCONNECT
                      ? "the peer process died or stopped answering: check it; once it "
                        "restarts, load its new metadata and post again"
                      : code == KVL_ERR_TIMEOUT
                      ? "the peer is alive but moved nothing for the timeout: check whether it "
                        "is stopped, hung or starved of CPU; posting again tries again; raise "
                        "the timeout if it is only slow"
                      : "check both agents' logs and UCX_TLS; the bytes not confirmed may or "
                        "may not have landed");
    kvli_ucx_xfer_complete(iface, xp, code, &err);
}

/* A put or get completed: the peer is making progress. Runs inside
 * ucp_worker_progress of the peer's data worker; a peer closed while UCX
 * still holds some of these is kept until the worker is gone (zombie). */
static void kvli_ucx_rma_cb(void *req, ucs_status_t status, void *user_data)
{
    kvli_ucx_peer_t *peer = user_data;
    if (status == UCS_OK)
        atomic_store(&peer->heard_ms, kvli_clock_ms());
    atomic_fetch_sub(&peer->rma_out, 1);
    ucp_request_free(req);
}

/* Issue the next batch of blocks; returns the first error status. */
static ucs_status_t kvli_ucx_xfer_issue(kvli_ucx_xpriv_t *xp)
{
    kvl_bk_xfer_t *x = xp->x;
    ucp_ep_h ep = xp->peer->ep;
    uint64_t bytes = 0;
    unsigned ops = 0;
    ucp_request_param_t rp;
    kvli_xpiece_t xpc;

    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_CALLBACK |
                      UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = kvli_ucx_rma_cb;
    rp.user_data = xp->peer;
    /* Pieces of at most KVLI_UCX_PIECE bytes: each completion is a sign of
     * the peer's progress, so a slow peer is never taken for a silent one
     * (the flush of a batch can take long under load). */
    while (bytes < KVLI_UCX_BATCH_BYTES && ops < KVLI_UCX_BATCH_OPS &&
           kvli_xchunk_peek(&xp->cur, x, KVLI_UCX_PIECE, &xpc)) {
        const kvli_piece_t p = xpc.p;
        const kvli_ucx_mh_t *mh = x->lmh[xpc.lreg];
        const kvli_ucx_rh_t *rh = x->rmh[xpc.rreg];
        void *l = (void *)(uintptr_t)p.laddr;
        ucs_status_ptr_t req;
        rp.memh = mh->memh;
        atomic_fetch_add(&xp->peer->rma_out, 1); /* before: the callback may run first */
        if (x->op == KVL_WRITE)
            req = ucp_put_nbx(ep, l, p.len, p.raddr, rh->rkey, &rp);
        else
            req = ucp_get_nbx(ep, l, p.len, p.raddr, rh->rkey, &rp);
        if (req == NULL || UCS_PTR_IS_ERR(req))
            atomic_fetch_sub(&xp->peer->rma_out, 1); /* no callback will come */
        if (UCS_PTR_IS_ERR(req))
            return UCS_PTR_STATUS(req);
        /* a request completes (callback) later; NULL: done already */
        bytes += p.len;
        ops++;
        xp->issued += p.len;
        kvli_xchunk_take(&xp->cur, x, p.len);
    }
    return UCS_OK;
}

/*
 * A put or get was refused in the middle of a batch (kvli_ucx_xfer_issue
 * returned an error) after others of the batch were issued. Those gets may
 * still land in the local regions, those puts may still read them: a flush
 * behind them gives kvli_ucx_linger_start its token (xp->tok, state FLUSH),
 * as for a transfer that fails while its batch's flush is out. A flush that
 * completes at once (NULL) means they all ended: confirmed. The flush takes
 * the batch's token (xp->tok, allocated before the batch; freed here when
 * nothing of the batch went out or no callback will come). UCS_OK, or why
 * no flush could be issued (then nothing can wait for those puts or gets).
 */
static ucs_status_t kvli_ucx_xfer_flush_issued(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    ucp_request_param_t rp;
    ucs_status_ptr_t req;

    if (xp->staged || xp->issued == xp->confirmed) {
        free(xp->tok); /* the batch's, never handed to UCX */
        xp->tok = NULL;
        return UCS_OK;
    }
    if (xp->tok == NULL) /* allocated before the batch: not expected */
        xp->tok = kvli_ucx_tok_new(iface, 0);
    if (xp->tok == NULL)
        return UCS_ERR_NO_MEMORY;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = kvli_ucx_tok_cb;
    rp.user_data = xp->tok;
    req = ucp_ep_flush_nbx(xp->peer->ep, &rp);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        free(xp->tok); /* no callback will come */
        xp->tok = NULL;
        if (UCS_PTR_IS_ERR(req))
            return UCS_PTR_STATUS(req);
        xp->confirmed = xp->issued;
        return UCS_OK;
    }
    xp->state = KVLI_UCX_X_FLUSH;
    return UCS_OK;
}

/* kvl_agent_destroy: end xp now, whatever the peer does. CANCELED when
 * nothing of it can land any more; else the peer is given up (its endpoint
 * is closed forced when destroy unloads it) and the error says how many
 * bytes may still land. */
static void kvli_ucx_xfer_give_up(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    uint64_t may = xp->staged ? kvli_ucx_stage_unconfirmed(xp) : xp->issued - xp->confirmed;
    int notif_out = xp->state == KVLI_UCX_X_NOTIF;
    kvl_error_t err;

    if (may == 0 && !notif_out) {
        kvli_ucx_xfer_complete(iface, xp, KVL_ERR_CANCELED, NULL);
        return;
    }
    pthread_mutex_lock(&iface->lock);
    kvli_ucx_peer_mark_dead(iface, xp->peer, UCS_ERR_CANCELED, "the agent is being destroyed: "
                            "requests still in flight were given up");
    pthread_mutex_unlock(&iface->lock);
    if (notif_out)
        kvl_bk_error_set(&err, KVL_ERR_REMOTE_DISCONNECT, 0, KVLI_UCX_NAME, -1,
                         "given up as the agent is destroyed: every byte is in place, its "
                         "notification may or may not arrive");
    else
        kvl_bk_error_set(&err, KVL_ERR_REMOTE_DISCONNECT, 0, KVLI_UCX_NAME, -1,
                         "given up as the agent is destroyed: up to %llu bytes issued and not "
                         "confirmed may still land (%llu confirmed in place before)",
                         (unsigned long long)may, (unsigned long long)xp->confirmed);
    snprintf(err.agent, sizeof(err.agent), "%s", xp->peer->name);
    kvl_bk_error_hint(&err, "treat the destination blocks as undefined and write them again");
    kvli_ucx_xfer_complete(iface, xp, KVL_ERR_REMOTE_DISCONNECT, &err);
}

static void kvli_ucx_xfer_advance(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    kvl_bk_xfer_t *x = xp->x;
    kvli_ucx_peer_t *peer = xp->peer;
    char why[512];
    ucs_status_t s;
    int cancel, dead, abort;

    for (;;) {
        pthread_mutex_lock(&iface->lock);
        cancel = xp->cancel;
        abort = xp->abort;
        dead = peer->dead;
        if (dead)
            snprintf(why, sizeof(why), "%.200s", peer->dead_what);
        pthread_mutex_unlock(&iface->lock);
        if (xp->last_ms == 0)
            xp->last_ms = kvli_clock_ms();
        if (abort) {
            kvli_ucx_xfer_give_up(iface, xp);
            return;
        }

        if (xp->state == KVLI_UCX_X_ISSUE && xp->staged) {
            if (dead) {
                kvli_ucx_xfer_fail(iface, xp, KVL_ERR_REMOTE_DISCONNECT, why);
                return;
            }
            /* requests in flight, cancel and the watchdog: ucx_stage.c;
             * back here (0) once every byte is confirmed */
            if (kvli_ucx_stage_advance(iface, xp))
                return;
            if (xp->chunks != NULL || (!kvli_xchunk_done(&xp->cur, x) && !cancel))
                return;
        }
        if (xp->state == KVLI_UCX_X_ISSUE) {
            if (dead) {
                kvli_ucx_xfer_fail(iface, xp, KVL_ERR_REMOTE_DISCONNECT, why);
                return;
            }
            if (cancel && !kvli_xchunk_done(&xp->cur, x)) {
                kvli_ucx_xfer_complete(iface, xp, KVL_ERR_CANCELED, NULL);
                return;
            }
            if (!kvli_xchunk_done(&xp->cur, x)) {
                ucp_request_param_t rp;
                /* the batch's flush token first: with no memory for it,
                 * nothing of the batch is out yet */
                xp->tok = kvli_ucx_tok_new(iface, 0);
                if (xp->tok == NULL) {
                    kvli_ucx_xfer_fail(iface, xp, KVL_ERR_NO_MEMORY, "out of memory");
                    return;
                }
                s = kvli_ucx_xfer_issue(xp);
                if (s != UCS_OK) {
                    ucs_status_t fs = kvli_ucx_xfer_flush_issued(iface, xp);
                    int n = snprintf(why, sizeof(why), "ucp_%s_nbx() = %s",
                                     x->op == KVL_WRITE ? "put" : "get", ucs_status_string(s));
                    if (fs != UCS_OK && n > 0 && (size_t)n < sizeof(why))
                        snprintf(why + n, sizeof(why) - (size_t)n, x->op == KVL_READ
                                 ? "; the flush behind the gets issued before it could not go "
                                   "out either (%s): they may land yet and nothing can wait for "
                                   "them, so do not deregister the READ's local regions before "
                                   "that peer is unloaded"
                                 : "; the flush behind the puts issued before it could not go "
                                   "out either (%s): they may still read the local regions and "
                                   "nothing can wait for them, so do not deregister the WRITE's "
                                   "local regions before that peer is unloaded",
                                 ucs_status_string(fs));
                    kvli_ucx_xfer_fail(iface, xp, s == UCS_ERR_ENDPOINT_TIMEOUT ||
                                       s == UCS_ERR_CONNECTION_RESET || s == UCS_ERR_CANCELED ||
                                       s == UCS_ERR_UNREACHABLE
                                       ? KVL_ERR_REMOTE_DISCONNECT : KVL_ERR_REMOTE, why);
                    return;
                }
                memset(&rp, 0, sizeof(rp));
                rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
                rp.cb.send = kvli_ucx_tok_cb;
                rp.user_data = xp->tok;
                ucs_status_ptr_t req = ucp_ep_flush_nbx(peer->ep, &rp);
                if (UCS_PTR_IS_ERR(req)) {
                    free(xp->tok); /* no callback will come */
                    xp->tok = NULL;
                    snprintf(why, sizeof(why), "ucp_ep_flush_nbx() = %s; the %s of the batch "
                             "issued before it may still be in flight and nothing can wait for "
                             "them, so do not deregister the transfer's local regions before "
                             "that peer is unloaded", ucs_status_string(UCS_PTR_STATUS(req)),
                             x->op == KVL_WRITE ? "puts" : "gets");
                    kvli_ucx_xfer_fail(iface, xp, KVL_ERR_REMOTE, why);
                    return;
                }
                if (req == NULL) {
                    free(xp->tok);
                    xp->tok = NULL;
                    xp->confirmed = xp->issued;
                    xp->last_ms = kvli_clock_ms();
                    continue;
                }
                xp->state = KVLI_UCX_X_FLUSH;
                xp->last_ms = kvli_clock_ms();
                return;
            }
            /* everything in place: the notification, if any */
            if (x->notif == NULL) {
                kvli_ucx_xfer_complete(iface, xp, KVL_OK, NULL);
                return;
            }
            xp->tok = kvli_ucx_tok_new(iface, KVLI_UCX_NOTIF_HDR + KVL_NAME_MAX + x->notif_len);
            if (xp->tok == NULL) {
                kvli_ucx_xfer_fail(iface, xp, KVL_ERR_NO_MEMORY, "out of memory");
                return;
            }
            size_t hlen = kvli_ucx_notif_build(iface, xp->tok, x->notif, x->notif_len);
            ucs_status_ptr_t req = kvli_ucx_notif_issue(iface, peer, xp->tok, hlen, x->notif_len);
            if (UCS_PTR_IS_ERR(req)) {
                kvli_ucx_notif_unissued(iface, xp->tok);
                xp->tok = NULL;
                snprintf(why, sizeof(why), "data in place, but ucp_am_send_nbx(notification) "
                         "= %s", ucs_status_string(UCS_PTR_STATUS(req)));
                kvli_ucx_xfer_fail(iface, xp, KVL_ERR_REMOTE, why);
                return;
            }
            /* the transfer ends on the target's answer */
            xp->state = KVLI_UCX_X_NOTIF;
            xp->last_ms = kvli_clock_ms();
            return;
        }

        /* FLUSH or NOTIF: wait for the token. The bound is on silence:
         * it runs from the last sign of progress of this transfer or of
         * the peer (any put/get to it completing), so a slow peer under
         * load is never failed while it moves. A dead peer is UCX's to
         * report (error callback), long before this. */
        if (!kvli_ucx_tok_done(iface, xp->tok, &s) ||
            (s == UCS_OK && xp->state == KVLI_UCX_X_NOTIF && !kvli_ucx_tok_answered(iface, xp))) {
            uint64_t now = kvli_clock_ms(), heard = atomic_load(&peer->heard_ms);
            uint64_t last = heard > xp->last_ms ? heard : xp->last_ms;
            uint64_t idle = now > last ? now - last : 0;
            if (dead) {
                kvli_ucx_xfer_fail(iface, xp, KVL_ERR_REMOTE_DISCONNECT, why);
            } else if (idle > xp->timeout_ms) {
                /* this transfer only: the peer is not declared dead, the
                 * next posting tries again */
                snprintf(why, sizeof(why), "no progress from the peer for %llu ms (bound "
                         "%llu ms), although UCX still counts it alive: it is stopped or "
                         "overloaded", (unsigned long long)idle,
                         (unsigned long long)xp->timeout_ms);
                kvli_ucx_xfer_fail(iface, xp, KVL_ERR_TIMEOUT, why);
            }
            return;
        }
        if (xp->state != KVLI_UCX_X_NOTIF || s != UCS_OK) {
            kvli_ucx_tok_drop(iface, xp->tok);
            xp->tok = NULL;
        }
        if (s != UCS_OK) {
            if (xp->state == KVLI_UCX_X_NOTIF)
                snprintf(why, sizeof(why), "data in place, but the notification failed: %s%s%.200s",
                         ucs_status_string(s), dead ? "; " : "", dead ? peer->dead_what : "");
            else
                snprintf(why, sizeof(why), "ucp_ep_flush_nbx completed with %s%s%.200s",
                         ucs_status_string(s), dead ? "; " : "", dead ? peer->dead_what : "");
            kvli_ucx_xfer_fail(iface, xp, dead || s == UCS_ERR_CONNECTION_RESET ||
                               s == UCS_ERR_ENDPOINT_TIMEOUT || s == UCS_ERR_CANCELED
                               ? KVL_ERR_REMOTE_DISCONNECT : KVL_ERR_REMOTE, why);
            return;
        }
        if (xp->state == KVLI_UCX_X_NOTIF) {
            /* answered: queued there, or refused (its queue is full) */
            kvl_status_t ans = xp->tok->ans_status;
            kvl_error_t e;
            if (ans == KVL_OK) {
                kvli_ucx_xfer_complete(iface, xp, KVL_OK, NULL);
                return;
            }
            ans = kvli_notif_refused(&e, KVLI_UCX_NAME, peer->name, ans, xp->tok->ans_text,
                                     x->total_bytes);
            kvli_ucx_xfer_complete(iface, xp, ans, &e);
            return;
        }
        xp->confirmed = xp->issued;
        xp->last_ms = kvli_clock_ms();
        atomic_store(&peer->heard_ms, xp->last_ms);
        xp->state = KVLI_UCX_X_ISSUE;
        /* loop: next batch, cancel, or the notification */
    }
}

static void kvli_ucx_xfer_release(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    int free_now;
    pthread_mutex_lock(&iface->lock);
    xp->finished = 1;
    free_now = xp->waiters == 0;
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    if (free_now)
        free(xp);
}

/* The progress thread did not run for a while (this process starved of
 * CPU): that time is not the peers' silence. While transfers run it never
 * sleeps more than 1 ms, so a gap this long means it was not scheduled. */
#define KVLI_UCX_STARVED_MS 100u

int kvli_ucx_xfer_progress(kvli_ucx_iface_t *iface)
{
    kvli_ucx_xpriv_t **pp, *xp;
    uint64_t now = kvli_clock_ms(), gap = iface->turn_ms ? now - iface->turn_ms : 0;

    iface->turn_ms = now;
    if (gap > KVLI_UCX_STARVED_MS)
        for (xp = iface->running; xp != NULL; xp = xp->next)
            if (xp->last_ms != 0) /* set during the last turn: never past now */
                xp->last_ms = xp->last_ms + gap < now ? xp->last_ms + gap : now;

    pthread_mutex_lock(&iface->lock);
    if (iface->queue != NULL) {
        for (pp = &iface->running; *pp != NULL; pp = &(*pp)->next)
            ;
        *pp = iface->queue;
        iface->queue = NULL;
    }
    pthread_mutex_unlock(&iface->lock);

    kvli_ucx_linger_sweep(iface, 0);
    pp = &iface->running;
    while ((xp = *pp) != NULL) {
        kvli_ucx_xfer_advance(iface, xp);
        if (xp->state == KVLI_UCX_X_END) {
            pthread_mutex_lock(&iface->lock);
            *pp = xp->next;
            pthread_mutex_unlock(&iface->lock);
            kvli_ucx_xfer_release(iface, xp);
        } else {
            pp = &xp->next;
        }
    }
    return iface->running != NULL;
}

/* Under iface->lock: the unfinished posting of x (or of peer), or NULL. */
static kvli_ucx_xpriv_t *kvli_ucx_xfer_find(kvli_ucx_iface_t *iface, const kvl_bk_xfer_t *x,
                                            const kvli_ucx_peer_t *peer)
{
    kvli_ucx_xpriv_t *lists[2] = {iface->queue, iface->running};
    for (int l = 0; l < 2; l++)
        for (kvli_ucx_xpriv_t *xp = lists[l]; xp != NULL; xp = xp->next)
            if (!xp->finished && ((x != NULL && xp->x == x) || (peer != NULL && xp->peer == peer)))
                return xp;
    return NULL;
}

/* Ask the progress thread to stop xp and wait until it is finished (its
 * xfer_done returned), bounded; 1 when it is (xp may be freed then).
 * Called and returns with iface->lock held. */
static int kvli_ucx_xfer_stop_wait(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp, int abort)
{
    struct timespec dl;
    uint64_t ms = 2 * xp->timeout_ms + 1000;
    int expect = 0, free_now;

    xp->cancel = 1;
    if (abort)
        xp->abort = 1;
    xp->waiters++;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(ms / 1000u);
    dl.tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
    pthread_mutex_lock(&iface->lock);
    while (!xp->finished && !kvli_progress_stopping(&iface->pg) &&
           pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) != ETIMEDOUT)
        ;
    if (!xp->finished && atomic_compare_exchange_strong(&xp->done_called, &expect, 1)) {
        /* The progress thread is gone or stuck: never return without an
         * answer. It will not call xfer_done for xp any more. */
        kvl_error_t err;
        kvl_bk_xfer_t *x = xp->x;
        pthread_mutex_unlock(&iface->lock);
        kvl_bk_error_set(&err, KVL_ERR_TIMEOUT, 0, KVLI_UCX_NAME, -1,
                         "cancel of the transfer with agent '%.60s' got no answer from the ucx "
                         "progress thread within %llu ms", xp->peer->name,
                         (unsigned long long)ms);
        kvl_bk_error_hint(&err, "bytes may still land; destroy the agent");
        kvl_bk_xfer_error(&err, x, xp->peer->name);
        iface->ctx->xfer_done(x, KVL_ERR_TIMEOUT, &err);
        pthread_mutex_lock(&iface->lock);
    }
    xp->waiters--;
    int finished = xp->finished;
    free_now = finished && xp->waiters == 0;
    if (free_now)
        free(xp);
    return finished;
}

static void kvli_ucx_xfer_stop(void *bk, kvl_bk_xfer_t *x, int abort)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_xpriv_t *xp;
    pthread_mutex_lock(&iface->lock);
    xp = kvli_ucx_xfer_find(iface, x, NULL);
    /* Also when xfer_done was already called: the progress thread may be
     * inside it (it marks the call before making it), and the core frees
     * the transfer as soon as this returns. Wait until it is finished. */
    if (xp != NULL)
        (void)kvli_ucx_xfer_stop_wait(iface, xp, abort);
    pthread_mutex_unlock(&iface->lock);
}

void kvli_ucx_xfer_cancel(void *bk, kvl_bk_xfer_t *x)
{
    kvli_ucx_xfer_stop(bk, x, 0);
}

/* kvl_agent_destroy: like cancel, but without waiting for answers from the
 * peer (a stopped one would hold destroy for the transfer's timeout). */
void kvli_ucx_xfer_abort(void *bk, kvl_bk_xfer_t *x)
{
    kvli_ucx_xfer_stop(bk, x, 1);
}

void kvli_ucx_xfer_cancel_peer(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer)
{
    kvli_ucx_xpriv_t *xp;
    pthread_mutex_lock(&iface->lock);
    /* each until it is finished (see kvli_ucx_xfer_stop); one the progress
     * thread never finishes (stuck) ends the loop after its bound */
    while ((xp = kvli_ucx_xfer_find(iface, NULL, peer)) != NULL)
        if (!kvli_ucx_xfer_stop_wait(iface, xp, 0))
            break;
    pthread_mutex_unlock(&iface->lock);
}

/* Teardown with the progress thread joined: end what is left. */
void kvli_ucx_xfer_fail_all(kvli_ucx_iface_t *iface, const char *why)
{
    kvli_ucx_xpriv_t *xp;
    for (;;) {
        pthread_mutex_lock(&iface->lock);
        xp = iface->queue;
        if (xp != NULL)
            iface->queue = xp->next;
        else if ((xp = iface->running) != NULL)
            iface->running = xp->next;
        pthread_mutex_unlock(&iface->lock);
        if (xp == NULL)
            return;
        if (xp->issued == 0)
            kvli_ucx_xfer_complete(iface, xp, KVL_ERR_CANCELED, NULL);
        else
            kvli_ucx_xfer_fail(iface, xp, KVL_ERR_STATE, why);
        kvli_ucx_xfer_release(iface, xp);
    }
}
