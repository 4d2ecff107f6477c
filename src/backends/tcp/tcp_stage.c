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
 * Buffers come from the backend's pool (common/bounce.c): chunk bytes each,
 * pinned, at most KVLI_TCP_STAGE_BUFS; a larger request from a peer with a
 * larger chunk gets a one-off buffer.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tcp.h"

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
    kvli_bounce_put(&iface->bounce, m->bounce);
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
