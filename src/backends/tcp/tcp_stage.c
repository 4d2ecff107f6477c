/*
 * kvlane tcp backend: VRAM over the socket, staged through pinned host
 * buffers with the copies the core lends (ctx->stage_*, done by the cuda
 * backend's streams).
 *
 * Initiator, WRITE: a request's VRAM pieces are downloaded into a pooled
 *   bounce buffer when the request is cut; it is sent once the download is
 *   done. Up to two requests wait unsent ahead of the socket (within the
 *   32 MiB window in flight), so the download of the next chunks runs
 *   while earlier ones are on the wire.
 * Initiator, READ: the reply lands in the bounce buffer; its upload to VRAM
 *   runs while the next replies arrive; the request counts as answered (and
 *   the transfer can finish) only after the upload.
 * Target: a request's VRAM ranges go through one bounce buffer; the copy
 *   runs asynchronously (tcp_conn.c, RX_STAGE) before the WRITE is
 *   acknowledged or the READ data is sent. That connection is not read
 *   meanwhile; the progress thread serves everything else.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tcp.h"

int kvli_tcp_stage_usable(const kvl_bk_ctx_t *ctx)
{
    return ctx->size >= offsetof(kvl_bk_ctx_t, stage_test) + sizeof(ctx->stage_test) &&
           ctx->stage_check != NULL && ctx->stage_host_alloc != NULL &&
           ctx->stage_host_free != NULL && ctx->stage_copy != NULL && ctx->stage_test != NULL;
}

void *kvli_tcp_bounce_get(kvli_tcp_iface_t *iface, size_t len, int may_alloc_big,
                          kvl_error_t *err)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    void *b = NULL;
    kvl_error_t e;
    memset(err, 0, offsetof(kvl_error_t, causes));
    if (len <= iface->chunk) {
        pthread_mutex_lock(&iface->pool_lock);
        if (iface->pool_free > 0) {
            b = iface->pool[--iface->pool_free];
            pthread_mutex_unlock(&iface->pool_lock);
            return b;
        }
        if (iface->pool_total < KVLI_TCP_STAGE_BUFS) {
            iface->pool_total++; /* reserved: allocated outside the lock */
            pthread_mutex_unlock(&iface->pool_lock);
            if (ctx->stage_host_alloc(ctx, iface->chunk, &b, &e) == KVL_OK) {
                pthread_mutex_lock(&iface->pool_lock);
                for (unsigned i = 0; i < KVLI_TCP_STAGE_BUFS; i++)
                    if (iface->pool_all[i] == NULL) {
                        iface->pool_all[i] = b;
                        break;
                    }
                pthread_mutex_unlock(&iface->pool_lock);
                return b;
            }
            pthread_mutex_lock(&iface->pool_lock);
            iface->pool_total--;
            pthread_mutex_unlock(&iface->pool_lock);
            goto fail;
        }
        pthread_mutex_unlock(&iface->pool_lock);
        if (!may_alloc_big)
            return NULL; /* all in use: the caller waits for one to come back */
    }
    /* larger than a pool buffer (a peer with a larger chunk), or pool busy */
    if (ctx->stage_host_alloc(ctx, len, &b, &e) == KVL_OK)
        return b;
fail:
    kvl_bk_error_set(err, e.code ? e.code : KVL_ERR_NO_MEMORY, e.sys_errno, KVLI_TCP_NAME, e.device,
                     "tcp: no pinned staging buffer of %zu bytes for VRAM: %.300s", len, e.what);
    kvl_bk_error_hint(err, "%s", e.hint);
    return NULL;
}

void kvli_tcp_bounce_put(kvli_tcp_iface_t *iface, void *b)
{
    if (b == NULL)
        return;
    pthread_mutex_lock(&iface->pool_lock);
    /* pool buffers go back to the pool, one-off ones are freed */
    for (unsigned i = 0; i < KVLI_TCP_STAGE_BUFS; i++)
        if (iface->pool_all[i] == b) {
            iface->pool[iface->pool_free++] = b;
            pthread_mutex_unlock(&iface->pool_lock);
            return;
        }
    pthread_mutex_unlock(&iface->pool_lock);
    iface->ctx->stage_host_free(iface->ctx, b);
}

void kvli_tcp_pool_fill(kvli_tcp_iface_t *iface)
{
    void *taken[KVLI_TCP_STAGE_BUFS];
    unsigned n = 0;
    kvl_error_t e;
    while (n < KVLI_TCP_STAGE_BUFS) {
        void *b = kvli_tcp_bounce_get(iface, (size_t)iface->chunk, 0, &e);
        if (b == NULL) {
            if (e.code != KVL_OK) /* the transfer that needs it retries and says why */
                iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "filling the staging pool: %s",
                                e.what);
            break;
        }
        taken[n++] = b;
    }
    for (unsigned k = 0; k < n; k++)
        kvli_tcp_bounce_put(iface, taken[k]);
}

void kvli_tcp_pool_fini(kvli_tcp_iface_t *iface)
{
    for (unsigned i = 0; i < KVLI_TCP_STAGE_BUFS; i++)
        if (iface->pool_all[i] != NULL)
            iface->ctx->stage_host_free(iface->ctx, iface->pool_all[i]);
    memset(iface->pool_all, 0, sizeof(iface->pool_all));
    iface->pool_free = iface->pool_total = 0;
}

void kvli_tcp_stage_notify(void *arg)
{
    kvli_progress_wake(&((kvli_tcp_iface_t *)arg)->pg);
}

void kvli_tcp_msg_free(kvli_tcp_iface_t *iface, kvli_tcp_msg_t *m)
{
    if (m->ticket != NULL) {
        kvl_error_t e;
        /* nothing may still write the bounce buffer (or VRAM) */
        iface->ctx->stage_test(iface->ctx, m->ticket, 1, &e);
        m->ticket = NULL;
        atomic_fetch_sub(&iface->staging, 1);
    }
    kvli_tcp_bounce_put(iface, m->bounce);
    free(m->sp);
    free(m);
}

int kvli_tcp_stage_request(kvli_tcp_peer_t *peer, kvli_tcp_msg_t *m)
{
    kvli_tcp_iface_t *iface = peer->iface;
    kvl_error_t e;
    if (m->nsp == 0 || m->type != KVLI_TCP_MSG_WRITE)
        return 0;
    if (iface->ctx->stage_copy(iface->ctx, 1, m->sp, (size_t)m->nsp, kvli_tcp_stage_notify,
                               iface, &m->ticket, &e) != KVL_OK) {
        kvli_tcp_xfer_fail(m->xp, e.code, &e);
        return -1;
    }
    atomic_fetch_add(&iface->staging, 1);
    return 0;
}

void kvli_tcp_stage_uploads(kvli_tcp_peer_t *peer)
{
    kvli_tcp_iface_t *iface = peer->iface;
    kvli_tcp_msg_t **pp = &peer->up_head;
    while (*pp != NULL) {
        kvli_tcp_msg_t *m = *pp;
        kvl_error_t e;
        int r = iface->ctx->stage_test(iface->ctx, m->ticket, 0, &e);
        if (r == 0) {
            pp = &m->next;
            continue;
        }
        m->ticket = NULL;
        atomic_fetch_sub(&iface->staging, 1);
        *pp = m->next;
        m->xp->outstanding--;
        if (r > 0)
            m->xp->moved += m->bytes;
        else
            kvli_tcp_xfer_fail(m->xp, e.code, &e);
        kvli_tcp_msg_free(iface, m);
    }
}
