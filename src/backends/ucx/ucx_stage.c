/*
 * kvlane ucx backend: staged transfers. A UCX built without CUDA (Debian's,
 * Ubuntu's) cannot map GPU memory, so a one-sided put or get cannot reach
 * VRAM. Such VRAM is registered without a UCX handle ("staged"), and every
 * transfer touching it moves as active messages through host bounce
 * buffers: VRAM <-> pinned host buffer with the copies the core lends
 * (ctx->stage_*, the cuda backend's streams), buffer <-> wire with UCX.
 * The parameter data_path=am sends every transfer of the backend this way.
 *
 * Initiator: a posting is cut into requests of at most KVLI_UCX_STAGE_CHUNK
 *   bytes and stage_max_ranges ranges. WRITE: the request's VRAM pieces are
 *   downloaded into its bounce buffer (host pieces copied), then the buffer
 *   goes out with the request; the target's ACK confirms the bytes are in
 *   place. READ: the request goes out alone; the target's DATA reply lands
 *   in the bounce buffer and is uploaded/copied to the local pieces. Up to
 *   KVLI_UCX_STAGE_INIT_BUFS requests are in flight per backend, so copies
 *   overlap the wire. The notification goes out after the last ACK/upload.
 * Target: the handler checks every range against the regions registered on
 *   this backend (pinned until the request is served), then the progress
 *   thread receives the data into a bounce buffer and scatters it (WRITE),
 *   or gathers it and sends it back (READ), and replies on the request's
 *   reply endpoint. A refused request gets a reply saying why.
 *
 * Wire format (native byte order, like the rest of the module):
 *   request, KVLI_UCX_AM_STAGE:
 *     0 magic u32 | 4 op u8 (1 WRITE, 2 READ) | 5 pad u8 | 6 ranges u16
 *     8 id u64 | 16 bytes u64 | 24 ranges x (addr u64, len u64)
 *     a WRITE carries the bytes of its ranges, in order, as the AM data.
 *   reply, KVLI_UCX_AM_STAGE_REPLY:
 *     0 magic u32 | 4 op u8 (3 ACK, 4 DATA) | 5 pad u8 | 6 pad u16
 *     8 id u64 | 16 status i32 | 20 text length u32 | 24 text
 *     DATA carries the READ's bytes when status is 0; text says why not.
 *
 * No byte lands after a transfer ended: a reply for an ended request is
 * dropped (its rendezvous data never received), and a request that ended
 * keeps its bounce buffer until UCX has let go of it. Everything here runs
 * on the progress thread (AM handlers run inside ucp_worker_progress), or
 * after it was joined.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ucx.h"

#define KVLI_UCX_STAGE_MAGIC 0x534c554bu  /* "KULS" */
#define KVLI_UCX_STAGE_HDR 24u
#define KVLI_UCX_STAGE_TEXT 200u

enum { KVLI_UCX_OP_WRITE = 1, KVLI_UCX_OP_READ = 2, KVLI_UCX_OP_ACK = 3, KVLI_UCX_OP_DATA = 4 };

/* initiator requests */
enum {
    KVLI_UCX_C_GATHER,                /* WRITE: downloading VRAM into the buffer */
    KVLI_UCX_C_SENT,                  /* request out, waiting for the reply */
    KVLI_UCX_C_RECV,                  /* READ: receiving rendezvous data */
    KVLI_UCX_C_SCATTER,               /* READ: uploading the buffer to VRAM */
    KVLI_UCX_C_DONE
};

/* target jobs */
enum {
    KVLI_UCX_J_BUF,                   /* waiting for a bounce buffer */
    KVLI_UCX_J_RECV,                  /* WRITE: receiving rendezvous data */
    KVLI_UCX_J_COPY,                  /* VRAM copies in flight */
    KVLI_UCX_J_REPLY,                 /* reply to send */
    KVLI_UCX_J_SENDING,               /* reply out, UCX still owns the buffer */
    KVLI_UCX_J_DONE
};

typedef struct kvli_ucx_piece {
    uint64_t laddr, raddr, len;
    int32_t dev;                      /* local VRAM: its device; -1: host memory */
} kvli_ucx_piece_t;

struct kvli_ucx_chunk {
    kvli_ucx_chunk_t *next;           /* xp->chunks */
    kvli_ucx_chunk_t *live_next;      /* iface->stage_live (also once orphaned) */
    kvli_ucx_xpriv_t *xp;             /* NULL once the transfer ended */
    ucp_worker_h worker;              /* the peer's data worker: its reply arrives there */
    kvl_xfer_op_t op;
    uint64_t id, bytes;
    unsigned n;
    kvli_ucx_piece_t *p;
    uint8_t *hdr;
    size_t hlen;
    uint8_t *buf;
    int state;
    void *ticket;                     /* stage copy in flight */
    kvli_ucx_token_t *tok;            /* the request's send */
    kvli_ucx_token_t *rtok;           /* READ: receiving rendezvous data */
    void *desc;                       /* READ: rendezvous data not received yet */
    int replied;
    int32_t rstatus;
    char rtext[KVLI_UCX_STAGE_TEXT];
};

typedef struct kvli_ucx_range {
    uint64_t addr, len;
    int32_t dev;                      /* VRAM: its device; -1: host memory */
    void *pin;
} kvli_ucx_range_t;

struct kvli_ucx_job {
    kvli_ucx_job_t *next;
    int op;
    uint64_t id, bytes;
    unsigned n;
    kvli_ucx_range_t *r;
    ucp_ep_h ep;                      /* the request's reply endpoint */
    void *desc;                       /* WRITE: rendezvous data */
    uint8_t *data;                    /* WRITE: eager data, copied */
    uint8_t *buf;
    int state;
    uint64_t since_ms;                /* entered RECV or SENDING */
    void *ticket;
    kvli_ucx_token_t *tok;            /* receive, then the reply's send */
    int32_t status;
    char text[KVLI_UCX_STAGE_TEXT];
    int logged;                       /* the refusal's whole reason was logged */
    uint8_t rhdr[KVLI_UCX_STAGE_HDR + KVLI_UCX_STAGE_TEXT];
};

static void kvli_ucx_stage_notify(void *arg)
{
    kvli_progress_wake(&((kvli_ucx_iface_t *)arg)->pg);
}

static void kvli_ucx_stage_recv_cb(void *req, ucs_status_t status, size_t length, void *ud)
{
    (void)length;
    kvli_ucx_tok_cb(req, status, ud);
}

/* ---- registration ---- */

kvl_status_t kvli_ucx_stage_reg(kvli_ucx_iface_t *iface, const kvl_region_info_t *r,
                                kvl_error_t *err)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    kvl_error_t e;
    char types[64];
    unsigned maj, min, rel;

    memset(&e, 0, offsetof(kvl_error_t, causes));
    e.device = r->dev;
    if (!kvli_stage_usable(ctx))
        snprintf(e.what, sizeof(e.what), "this kvlane core lends no staging copies");
    else if (ctx->stage_check(ctx, r->kind, r->dev, &e) == KVL_OK)
        return KVL_OK;
    ucp_get_version(&maj, &min, &rel);
    kvl_bk_error_set(err, e.code ? e.code : KVL_ERR_UNSUPPORTED, 0, KVLI_UCX_NAME,
                     r->dev, "VRAM on GPU %d refused: this UCX (%u.%u.%u) has no GPU memory "
                     "support (memory types: %s) and staging it through host memory failed "
                     "(the cause below)", (int)r->dev, maj, min, rel,
                     kvli_ucx_mem_types_str(iface->mem_types, types, sizeof(types)));
    kvl_bk_error_hint(err, "fix the cause below, or use a UCX built with CUDA (ucx_info -d lists "
                      "cuda_copy), or move VRAM with the cuda backend");
    if (e.code == KVL_OK) {
        e.code = KVL_ERR_UNSUPPORTED;
        snprintf(e.backend, sizeof(e.backend), "%s", KVLI_UCX_NAME);
    }
    kvl_bk_error_cause(err, &e); /* whole, with its own fix */
    return err->code;
}

int kvli_ucx_stage_needed(kvli_ucx_iface_t *iface, const kvl_bk_xfer_t *x)
{
    if (kvli_xchunk_indexed(x)) {
        /* not paired yet: any region of its two lists may be used */
        for (size_t i = 0; i < x->ltab->nregs; i++) {
            const kvli_ucx_mh_t *mh = x->lmh[i];
            if (mh != NULL && (mh->staged || (iface->data_path_am && mh->kind == KVL_MEM_VRAM)))
                return 2;
        }
        for (size_t i = 0; i < x->rtab->nregs; i++) {
            const kvli_ucx_rh_t *rh = x->rmh[i];
            if (rh != NULL && rh->rkey == NULL)
                return 2;
        }
        return iface->data_path_am ? 1 : 0;
    }
    for (size_t i = 0; i < x->nsegs; i++) {
        const kvli_ucx_mh_t *mh = x->lmh[x->segs[i].lreg];
        const kvli_ucx_rh_t *rh = x->rmh[x->segs[i].rreg];
        if (mh->staged || rh->rkey == NULL || (iface->data_path_am && mh->kind == KVL_MEM_VRAM))
            return 2;
    }
    return iface->data_path_am ? 1 : 0;
}

/* ---- bounce buffers: iface->bounce (common/bounce.c), KVLI_UCX_STAGE_CHUNK
 * bytes each, pinned when the staging copies can allocate them, page-aligned
 * heap memory otherwise; initiator requests hold at most
 * KVLI_UCX_STAGE_INIT_BUFS so the target side always finds one ---- */

/* Staging is about to be used: ask the progress thread to fill the pool. */
void kvli_ucx_stage_expect(kvli_ucx_iface_t *iface)
{
    kvli_bounce_expect(&iface->bounce, &iface->pg);
}

/* ---- initiator ---- */

static void kvli_ucx_chunk_free(kvli_ucx_iface_t *iface, kvli_ucx_chunk_t *c)
{
    for (kvli_ucx_chunk_t **pp = &iface->stage_live; *pp != NULL; pp = &(*pp)->live_next)
        if (*pp == c) {
            *pp = c->live_next;
            break;
        }
    free(c->tok);
    free(c->rtok);
    kvli_bounce_put(&iface->bounce, c->buf);
    free(c->p);
    free(c->hdr);
    free(c);
}

static void kvli_ucx_stage_err(kvl_error_t *err, kvl_status_t code, const char *hint,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void kvli_ucx_stage_err(kvl_error_t *err, kvl_status_t code, const char *hint,
                               const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    kvl_bk_error_set(err, code, 0, KVLI_UCX_NAME, -1, "%s", what);
    kvl_bk_error_hint(err, "%s", hint);
}

/* Cut the next request of xp: pieces from the cursor (seg, blk, off), up to
 * a chunk of bytes and stage_max_ranges pieces; adjacent pieces of the same
 * two regions merge (never across regions, even adjacent ones: the target
 * checks each range against one of its regions, and a staging copy may not
 * span two allocations). */
static kvli_ucx_chunk_t *kvli_ucx_chunk_cut(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp,
                                            uint8_t *buf)
{
    kvl_bk_xfer_t *x = xp->x;
    unsigned max = iface->stage_max_ranges;
    kvli_ucx_chunk_t *c = calloc(1, sizeof(*c));
    kvli_xpiece_t xpc;
    uint32_t last_lreg = 0, last_rreg = 0;
    if (c == NULL)
        return NULL;
    c->p = calloc(max, sizeof(*c->p));
    c->hdr = malloc(KVLI_UCX_STAGE_HDR + (size_t)max * 16u);
    if (c->p == NULL || c->hdr == NULL) {
        free(c->p);
        free(c->hdr);
        free(c);
        return NULL;
    }
    c->xp = xp;
    c->worker = xp->peer->worker;
    c->op = x->op;
    c->buf = buf;
    c->id = ++iface->stage_next_id;
    while (c->bytes < KVLI_UCX_STAGE_CHUNK &&
           kvli_xchunk_peek(&xp->cur, x, KVLI_UCX_STAGE_CHUNK - c->bytes, &xpc)) {
        const kvli_piece_t pc = xpc.p;
        const kvli_ucx_mh_t *mh = x->lmh[xpc.lreg];
        int32_t dev = mh->kind == KVL_MEM_VRAM ? mh->dev : -1;
        kvli_ucx_piece_t *last = c->n ? &c->p[c->n - 1] : NULL;
        if (last != NULL && last->laddr + last->len == pc.laddr &&
            last->raddr + last->len == pc.raddr && last->dev == dev &&
            last_lreg == xpc.lreg && last_rreg == xpc.rreg) {
            last->len += pc.len;
        } else {
            if (c->n == max)
                break;
            c->p[c->n++] = (kvli_ucx_piece_t){pc.laddr, pc.raddr, pc.len, dev};
            last_lreg = xpc.lreg;
            last_rreg = xpc.rreg;
        }
        c->bytes += pc.len;
        kvli_xchunk_take(&xp->cur, x, pc.len);
    }
    uint32_t magic = KVLI_UCX_STAGE_MAGIC;
    uint8_t op = c->op == KVL_WRITE ? KVLI_UCX_OP_WRITE : KVLI_UCX_OP_READ, pad = 0;
    uint16_t n = (uint16_t)c->n;
    memcpy(c->hdr, &magic, 4);
    memcpy(c->hdr + 4, &op, 1);
    memcpy(c->hdr + 5, &pad, 1);
    memcpy(c->hdr + 6, &n, 2);
    memcpy(c->hdr + 8, &c->id, 8);
    memcpy(c->hdr + 16, &c->bytes, 8);
    for (unsigned i = 0; i < c->n; i++) {
        memcpy(c->hdr + KVLI_UCX_STAGE_HDR + 16u * i, &c->p[i].raddr, 8);
        memcpy(c->hdr + KVLI_UCX_STAGE_HDR + 16u * i + 8, &c->p[i].len, 8);
    }
    c->hlen = KVLI_UCX_STAGE_HDR + 16u * c->n;
    xp->issued += c->bytes;
    c->live_next = iface->stage_live;
    iface->stage_live = c;
    return c;
}

/* Copy between a bounce buffer and n places (sp[i].host: the place's spot
 * in the buffer): host memory now, VRAM as one staging request (*ticket,
 * NULL when none was needed). sp is reordered. */
static kvl_status_t kvli_ucx_places_copy(kvli_ucx_iface_t *iface, kvl_stage_piece_t *sp,
                                         size_t n, int to_host, void **ticket, kvl_error_t *err)
{
    size_t k = 0;
    *ticket = NULL;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].dev >= 0)
            sp[k++] = sp[i];
        else if (to_host)
            memcpy(sp[i].host, (void *)(uintptr_t)sp[i].dev_addr, sp[i].len);
        else
            memcpy((void *)(uintptr_t)sp[i].dev_addr, sp[i].host, sp[i].len);
    }
    if (k == 0)
        return KVL_OK;
    if (!kvli_stage_usable(iface->ctx)) {
        kvli_ucx_stage_err(err, KVL_ERR_UNSUPPORTED, "build kvlane with the cuda backend",
                           "staged transfer touching VRAM: this kvlane core lends no staging "
                           "copies");
        return KVL_ERR_UNSUPPORTED;
    }
    kvl_status_t st = iface->ctx->stage_copy(iface->ctx, to_host, sp, k, kvli_ucx_stage_notify,
                                             iface, ticket, err);
    if (st != KVL_OK)
        *ticket = NULL;
    return st;
}

/* The request's local pieces <-> its bounce buffer. */
static kvl_status_t kvli_ucx_chunk_copy(kvli_ucx_iface_t *iface, kvli_ucx_chunk_t *c,
                                        int to_host, kvl_error_t *err)
{
    kvl_stage_piece_t *sp = calloc(c->n, sizeof(*sp));
    uint64_t off = 0;
    if (sp == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < c->n; i++) {
        sp[i] = (kvl_stage_piece_t){c->p[i].laddr, c->buf + off, c->p[i].len, c->p[i].dev};
        off += c->p[i].len;
    }
    kvl_status_t st = kvli_ucx_places_copy(iface, sp, c->n, to_host, &c->ticket, err);
    free(sp);
    return st;
}

static kvl_status_t kvli_ucx_chunk_send(kvli_ucx_iface_t *iface, kvli_ucx_chunk_t *c,
                                        kvl_error_t *err)
{
    ucp_request_param_t rp;
    ucs_status_ptr_t req;
    c->tok = kvli_ucx_tok_new(iface, 0);
    if (c->tok == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = kvli_ucx_tok_cb;
    rp.user_data = c->tok;
    rp.flags = UCP_AM_SEND_FLAG_REPLY; /* the target answers on the reply endpoint */
    req = ucp_am_send_nbx(c->xp->peer->ep, KVLI_UCX_AM_STAGE, c->hdr, c->hlen,
                          c->op == KVL_WRITE ? c->buf : NULL,
                          c->op == KVL_WRITE ? c->bytes : 0, &rp);
    if (UCS_PTR_IS_ERR(req)) {
        ucs_status_t s = UCS_PTR_STATUS(req);
        int gone = s == UCS_ERR_CONNECTION_RESET || s == UCS_ERR_ENDPOINT_TIMEOUT ||
                   s == UCS_ERR_CANCELED || s == UCS_ERR_UNREACHABLE;
        kvli_ucx_stage_err(err, gone ? KVL_ERR_REMOTE_DISCONNECT : KVL_ERR_REMOTE,
                           gone ? "the peer process died or stopped answering: check it; once "
                                  "it restarts, load its new metadata and post again"
                                : "check that the peer is alive and reachable, and UCX_TLS",
                           "ucp_am_send_nbx(staged %s request) = %s",
                           c->op == KVL_WRITE ? "WRITE" : "READ", ucs_status_string(s));
        free(c->tok);
        c->tok = NULL;
        return err->code;
    }
    if (req == NULL) {
        free(c->tok); /* sent already: nothing holds the buffer */
        c->tok = NULL;
    }
    c->state = KVLI_UCX_C_SENT;
    return KVL_OK;
}

/* 1: token gone (NULL, or done and freed); 0: pending; -1: failed (*s). */
static int kvli_ucx_tok_settle(kvli_ucx_iface_t *iface, kvli_ucx_token_t **tokp, ucs_status_t *s)
{
    if (*tokp == NULL)
        return 1;
    if (!kvli_ucx_tok_done(iface, *tokp, s))
        return 0;
    free(*tokp);
    *tokp = NULL;
    return *s == UCS_OK ? 1 : -1;
}

static kvl_status_t kvli_ucx_chunk_stage_test(kvli_ucx_iface_t *iface, kvli_ucx_chunk_t *c,
                                              int *done, kvl_error_t *err)
{
    int r = iface->ctx->stage_test(iface->ctx, c->ticket, 0, err);
    *done = r != 0;
    if (r != 0)
        c->ticket = NULL;
    return r < 0 ? err->code : KVL_OK;
}

/* Move one request on. 1: it moved, 0: waiting, -1: failed (err). */
static int kvli_ucx_chunk_step(kvli_ucx_iface_t *iface, kvli_ucx_chunk_t *c, kvl_error_t *err)
{
    const char *peer = c->xp->peer->name;
    ucs_status_t s = UCS_OK;
    int done, r;

    switch (c->state) {
    case KVLI_UCX_C_GATHER:
        if (kvli_ucx_chunk_stage_test(iface, c, &done, err) != KVL_OK)
            return -1;
        if (!done)
            return 0;
        return kvli_ucx_chunk_send(iface, c, err) == KVL_OK ? 1 : -1;
    case KVLI_UCX_C_SENT:
        r = kvli_ucx_tok_settle(iface, &c->tok, &s);
        if (r < 0) {
            kvli_ucx_stage_err(err, KVL_ERR_REMOTE_DISCONNECT, "the peer process died or stopped "
                               "answering: check it", "staged request to agent '%.60s' failed: %s",
                               peer, ucs_status_string(s));
            return -1;
        }
        if (!c->replied)
            return 0;
        if (c->rstatus == 0 && r == 0)
            return 0; /* UCX still owns the request */
        if (c->rstatus != 0) {
            kvl_bk_error_set(err, KVL_ERR_REMOTE_REFUSED, 0, KVLI_UCX_NAME, -1,
                             "agent '%.60s' refused a staged %s of %llu bytes: %.300s", peer,
                             c->op == KVL_WRITE ? "WRITE" : "READ",
                             (unsigned long long)c->bytes, c->rtext);
            kvl_bk_error_hint(err, "the target's reason is above; reload its metadata if its "
                              "regions changed");
            return -1;
        }
        if (c->op == KVL_WRITE) {
            c->state = KVLI_UCX_C_DONE;
            return 1;
        }
        if (c->desc != NULL) {
            ucp_request_param_t rp;
            ucs_status_ptr_t req;
            c->rtok = kvli_ucx_tok_new(iface, 0);
            if (c->rtok == NULL) {
                kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1,
                                 "out of memory");
                return -1;
            }
            memset(&rp, 0, sizeof(rp));
            rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
            rp.cb.recv_am = kvli_ucx_stage_recv_cb;
            rp.user_data = c->rtok;
            req = ucp_am_recv_data_nbx(c->worker, c->desc, c->buf, c->bytes, &rp);
            c->desc = NULL; /* UCX owns it now */
            if (UCS_PTR_IS_ERR(req)) {
                free(c->rtok);
                c->rtok = NULL;
                kvli_ucx_stage_err(err, KVL_ERR_REMOTE, "check that the peer is alive",
                                   "receiving the staged READ data of agent '%.60s': "
                                   "ucp_am_recv_data_nbx() = %s", peer,
                                   ucs_status_string(UCS_PTR_STATUS(req)));
                return -1;
            }
            if (req == NULL) {
                free(c->rtok);
                c->rtok = NULL;
            }
        }
        c->state = KVLI_UCX_C_RECV;
        return 1;
    case KVLI_UCX_C_RECV:
        r = kvli_ucx_tok_settle(iface, &c->rtok, &s);
        if (r < 0) {
            kvli_ucx_stage_err(err, KVL_ERR_REMOTE_DISCONNECT, "the peer process died or stopped "
                               "answering: check it", "receiving the staged READ data of agent "
                               "'%.60s' failed: %s", peer, ucs_status_string(s));
            return -1;
        }
        if (r == 0)
            return 0;
        if (kvli_ucx_chunk_copy(iface, c, 0, err) != KVL_OK)
            return -1;
        c->state = c->ticket != NULL ? KVLI_UCX_C_SCATTER : KVLI_UCX_C_DONE;
        return 1;
    case KVLI_UCX_C_SCATTER:
        if (kvli_ucx_chunk_stage_test(iface, c, &done, err) != KVL_OK)
            return -1;
        if (!done)
            return 0;
        c->state = KVLI_UCX_C_DONE;
        return 1;
    default:
        return 0;
    }
}

static kvl_status_t kvli_ucx_chunk_start(kvli_ucx_iface_t *iface, kvli_ucx_chunk_t *c,
                                         kvl_error_t *err)
{
    if (c->op == KVL_READ)
        return kvli_ucx_chunk_send(iface, c, err);
    if (kvli_ucx_chunk_copy(iface, c, 1, err) != KVL_OK)
        return err->code;
    c->state = KVLI_UCX_C_GATHER;
    if (c->ticket == NULL)
        return kvli_ucx_chunk_send(iface, c, err);
    return KVL_OK;
}

int kvli_ucx_stage_advance(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    kvl_bk_xfer_t *x = xp->x;
    kvli_ucx_chunk_t **pp, *c;
    kvl_error_t err;
    int moved = 0, cancel;
    uint64_t now;

    for (c = xp->chunks; c != NULL; c = c->next) {
        int r;
        while ((r = kvli_ucx_chunk_step(iface, c, &err)) > 0)
            moved = 1;
        if (r < 0)
            goto fail;
    }
    for (pp = &xp->chunks; (c = *pp) != NULL;) {
        if (c->state == KVLI_UCX_C_DONE) {
            *pp = c->next;
            xp->confirmed += c->bytes;
            kvli_ucx_chunk_free(iface, c);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_lock(&iface->lock);
    cancel = xp->cancel;
    pthread_mutex_unlock(&iface->lock);
    while (!cancel && !kvli_xchunk_done(&xp->cur, x)) {
        uint8_t *b = kvli_bounce_get(&iface->bounce, KVLI_UCX_STAGE_CHUNK, KVLI_BOUNCE_QUOTA,
                                     &err);
        if (b == NULL && err.code == KVL_OK)
            break; /* none free: a reply brings one back */
        if (b == NULL)
            goto fail;
        c = kvli_ucx_chunk_cut(iface, xp, b);
        if (c == NULL) {
            kvli_bounce_put(&iface->bounce, b);
            kvl_bk_error_set(&err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
            goto fail;
        }
        for (pp = &xp->chunks; *pp != NULL; pp = &(*pp)->next)
            ;
        *pp = c;
        moved = 1;
        if (kvli_ucx_chunk_start(iface, c, &err) != KVL_OK)
            goto fail;
    }
    now = kvli_clock_ms();
    if (moved) {
        xp->last_ms = now;
    } else if (xp->chunks != NULL && now > xp->last_ms && now - xp->last_ms > xp->timeout_ms) {
        char why[300];
        snprintf(why, sizeof(why), "no answer to a staged request for %llu ms (bound %llu ms): "
                 "it stopped answering", (unsigned long long)(now - xp->last_ms),
                 (unsigned long long)xp->timeout_ms);
        kvli_ucx_xfer_fail(iface, xp, KVL_ERR_TIMEOUT, why);
        return 1;
    }
    return 0;

fail:
    kvli_ucx_xfer_fail(iface, xp, err.code, err.what);
    return 1;
}

uint64_t kvli_ucx_stage_unconfirmed(const kvli_ucx_xpriv_t *xp)
{
    uint64_t n = 0;
    for (const kvli_ucx_chunk_t *c = xp->chunks; c != NULL; c = c->next)
        if (c->op == KVL_WRITE && c->state == KVLI_UCX_C_SENT)
            n += c->bytes;
    return n;
}

/* The transfer ended: its requests in flight are orphaned. Replies for them
 * are dropped; each keeps its bounce buffer until UCX is done with it. */
void kvli_ucx_stage_abandon(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp)
{
    for (kvli_ucx_chunk_t *c = xp->chunks, *n; c != NULL; c = n) {
        n = c->next;
        c->xp = NULL;
        c->next = NULL;
        if (c->ticket != NULL) {
            kvl_error_t e;
            iface->ctx->stage_test(iface->ctx, c->ticket, 1, &e); /* no copy may still run */
            c->ticket = NULL;
        }
        if (c->desc != NULL)
            ucp_am_data_release(c->worker, c->desc);
        c->desc = NULL;
    }
    xp->chunks = NULL;
}

ucs_status_t kvli_ucx_stage_reply_recv(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param)
{
    kvli_ucx_iface_t *iface = arg;
    const uint8_t *h = header;
    uint32_t magic, tlen;
    uint64_t id;
    int32_t status;
    uint8_t op;
    kvli_ucx_chunk_t *c;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;

    if (header_length < KVLI_UCX_STAGE_HDR)
        goto bad;
    memcpy(&magic, h, 4);
    memcpy(&op, h + 4, 1);
    memcpy(&id, h + 8, 8);
    memcpy(&status, h + 16, 4);
    memcpy(&tlen, h + 20, 4);
    if (magic != KVLI_UCX_STAGE_MAGIC || (op != KVLI_UCX_OP_ACK && op != KVLI_UCX_OP_DATA) ||
        tlen > header_length - KVLI_UCX_STAGE_HDR)
        goto bad;
    for (c = iface->stage_live; c != NULL; c = c->live_next)
        if (c->id == id && c->xp != NULL)
            break;
    if (c == NULL || c->replied)
        return UCS_OK; /* its transfer ended: dropped, rendezvous data never received */
    c->replied = 1;
    c->rstatus = status;
    if (tlen >= sizeof(c->rtext))
        tlen = sizeof(c->rtext) - 1;
    memcpy(c->rtext, h + KVLI_UCX_STAGE_HDR, tlen);
    c->rtext[tlen] = '\0';
    if (status != 0)
        return UCS_OK;
    if ((c->op == KVL_READ) != (op == KVLI_UCX_OP_DATA) ||
        (c->op == KVL_READ && length != c->bytes)) {
        c->rstatus = KVL_ERR_REMOTE;
        snprintf(c->rtext, sizeof(c->rtext), "malformed reply: %s with %zu bytes to a %s of "
                 "%llu bytes", op == KVLI_UCX_OP_DATA ? "DATA" : "ACK", length,
                 c->op == KVL_READ ? "READ" : "WRITE", (unsigned long long)c->bytes);
        return UCS_OK;
    }
    if (c->op == KVL_WRITE)
        return UCS_OK;
    if (rndv) {
        c->desc = data;
        return UCS_INPROGRESS;
    }
    memcpy(c->buf, data, length);
    return UCS_OK;

bad:
    iface->ctx->log(iface->ctx, KVL_LOG_WARN, "dropped a malformed staged reply (header %zu "
                    "bytes, data %zu bytes)", header_length, length);
    return UCS_OK;
}

/* ---- target ---- */

static void kvli_ucx_job_refuse(kvli_ucx_job_t *j, kvl_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kvli_ucx_job_refuse(kvli_ucx_job_t *j, kvl_status_t code, const char *fmt, ...)
{
    va_list ap;
    if (j->status != 0)
        return;
    j->status = code;
    va_start(ap, fmt);
    vsnprintf(j->text, sizeof(j->text), fmt, ap);
    va_end(ap);
}

/* Refuse j for a local error e: the reply carries KVLI_UCX_STAGE_TEXT bytes
 * of it (the AM header's room); the log has the whole reason. */
static void kvli_ucx_job_refuse_e(kvli_ucx_iface_t *iface, kvli_ucx_job_t *j,
                                  const char *what, const kvl_error_t *e)
{
    if (j->status != 0)
        return;
    iface->ctx->log(iface->ctx, KVL_LOG_WARN, "refusing a staged %s of %llu bytes: %s%s",
                    j->op == KVLI_UCX_OP_READ ? "READ" : "WRITE", (unsigned long long)j->bytes,
                    what, e->what);
    kvli_ucx_job_refuse(j, e->code, "%s%.180s", what, e->what);
    j->logged = 1;
}

ucs_status_t kvli_ucx_stage_req_recv(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kvli_ucx_iface_t *iface = arg;
    kvl_bk_ctx_t *ctx = iface->ctx;
    const uint8_t *h = header;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    uint64_t sum = 0;
    uint32_t magic;
    uint16_t n;
    uint8_t op;
    kvli_ucx_job_t *j, **pp;
    ucs_status_t ret = UCS_OK;

    if (header_length < KVLI_UCX_STAGE_HDR ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
        goto bad;
    memcpy(&magic, h, 4);
    memcpy(&op, h + 4, 1);
    memcpy(&n, h + 6, 2);
    if (magic != KVLI_UCX_STAGE_MAGIC || (op != KVLI_UCX_OP_WRITE && op != KVLI_UCX_OP_READ))
        goto bad;
    j = calloc(1, sizeof(*j));
    if (j == NULL)
        goto nomem;
    j->op = op;
    j->ep = param->reply_ep;
    memcpy(&j->id, h + 8, 8);
    memcpy(&j->bytes, h + 16, 8);
    if (n == 0 || n > KVLI_UCX_STAGE_RANGES || header_length != KVLI_UCX_STAGE_HDR + 16u * n) {
        kvli_ucx_job_refuse(j, KVL_ERR_BAD_METADATA, "malformed request: %u ranges in a header "
                            "of %zu bytes", n, header_length);
    } else if (j->bytes == 0 || j->bytes > KVLI_UCX_STAGE_CHUNK ||
               (op == KVLI_UCX_OP_WRITE && length != j->bytes)) {
        kvli_ucx_job_refuse(j, KVL_ERR_BAD_METADATA, "malformed request: %llu bytes (at most "
                            "%u), %zu bytes of data", (unsigned long long)j->bytes,
                            KVLI_UCX_STAGE_CHUNK, length);
    } else if ((j->r = calloc(n, sizeof(*j->r))) == NULL) {
        kvli_ucx_job_refuse(j, KVL_ERR_NO_MEMORY, "out of memory");
    }
    for (unsigned i = 0; j->status == 0 && i < n; i++) {
        kvli_ucx_range_t *r = &j->r[i];
        kvli_ucx_mh_t *mh = NULL;
        kvl_error_t e;
        memcpy(&r->addr, h + KVLI_UCX_STAGE_HDR + 16u * i, 8);
        memcpy(&r->len, h + KVLI_UCX_STAGE_HDR + 16u * i + 8, 8);
        sum += r->len;
        if (r->len > j->bytes || sum > j->bytes) {
            kvli_ucx_job_refuse(j, KVL_ERR_BAD_METADATA, "malformed request: ranges add up to "
                                "more than its %llu bytes", (unsigned long long)j->bytes);
            break;
        }
        if (ctx->region_pin(ctx, r->addr, r->len, (void **)&mh, &r->pin, &e) != KVL_OK) {
            r->pin = NULL;
            kvli_ucx_job_refuse_e(iface, j, "", &e);
            break;
        }
        j->n = i + 1;
        r->dev = mh->kind == KVL_MEM_VRAM ? mh->dev : -1;
    }
    if (j->status == 0 && sum != j->bytes)
        kvli_ucx_job_refuse(j, KVL_ERR_BAD_METADATA, "malformed request: ranges add up to %llu "
                            "bytes, not %llu", (unsigned long long)sum,
                            (unsigned long long)j->bytes);
    j->state = j->status != 0 ? KVLI_UCX_J_REPLY : KVLI_UCX_J_BUF;
    if (j->status == 0 && op == KVLI_UCX_OP_WRITE) {
        if (rndv) {
            j->desc = data;
            ret = UCS_INPROGRESS;
        } else if ((j->data = malloc(length)) != NULL) {
            memcpy(j->data, data, length);
        } else {
            kvli_ucx_job_refuse(j, KVL_ERR_NO_MEMORY, "out of memory for %zu bytes", length);
            j->state = KVLI_UCX_J_REPLY;
        }
    }
    for (pp = &iface->stage_jobs; *pp != NULL; pp = &(*pp)->next)
        ;
    *pp = j;
    return ret;

bad:
    ctx->log(ctx, KVL_LOG_WARN, "dropped a malformed staged request (header %zu bytes, data "
             "%zu bytes%s)", header_length, length,
             (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? "" : ", no reply endpoint");
    return UCS_OK;
nomem:
    ctx->log(ctx, KVL_LOG_WARN, "dropped a staged request: out of memory");
    return UCS_OK;
}

/* The job's ranges <-> its bounce buffer; the reply comes next, or after
 * the VRAM copies (J_COPY). */
static void kvli_ucx_job_copy(kvli_ucx_iface_t *iface, kvli_ucx_job_t *j, int to_host)
{
    kvl_stage_piece_t *sp = calloc(j->n, sizeof(*sp));
    kvl_error_t e;
    uint64_t off = 0;
    j->state = KVLI_UCX_J_REPLY;
    if (sp == NULL) {
        kvli_ucx_job_refuse(j, KVL_ERR_NO_MEMORY, "out of memory");
        return;
    }
    for (unsigned i = 0; i < j->n; i++) {
        sp[i] = (kvl_stage_piece_t){j->r[i].addr, j->buf + off, j->r[i].len, j->r[i].dev};
        off += j->r[i].len;
    }
    if (kvli_ucx_places_copy(iface, sp, j->n, to_host, &j->ticket, &e) != KVL_OK)
        kvli_ucx_job_refuse_e(iface, j, "staging copy: ", &e);
    else if (j->ticket != NULL)
        j->state = KVLI_UCX_J_COPY;
    free(sp);
}

static void kvli_ucx_job_reply(kvli_ucx_iface_t *iface, kvli_ucx_job_t *j)
{
    uint32_t magic = KVLI_UCX_STAGE_MAGIC, tlen = (uint32_t)strlen(j->text);
    uint8_t op = j->op == KVLI_UCX_OP_READ ? KVLI_UCX_OP_DATA : KVLI_UCX_OP_ACK;
    int data = j->op == KVLI_UCX_OP_READ && j->status == 0;
    ucp_request_param_t rp;
    ucs_status_ptr_t req;

    memset(j->rhdr, 0, KVLI_UCX_STAGE_HDR);
    memcpy(j->rhdr, &magic, 4);
    memcpy(j->rhdr + 4, &op, 1);
    memcpy(j->rhdr + 8, &j->id, 8);
    memcpy(j->rhdr + 16, &j->status, 4);
    memcpy(j->rhdr + 20, &tlen, 4);
    memcpy(j->rhdr + KVLI_UCX_STAGE_HDR, j->text, tlen);
    j->state = KVLI_UCX_J_DONE;
    if (j->status != 0 && !j->logged)
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "refused a staged %s of %llu bytes: %s",
                        j->op == KVLI_UCX_OP_READ ? "READ" : "WRITE",
                        (unsigned long long)j->bytes, j->text);
    if ((j->tok = kvli_ucx_tok_new(iface, 0)) == NULL)
        return; /* the initiator's bound ends its transfer */
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = kvli_ucx_tok_cb;
    rp.user_data = j->tok;
    req = ucp_am_send_nbx(j->ep, KVLI_UCX_AM_STAGE_REPLY, j->rhdr, KVLI_UCX_STAGE_HDR + tlen,
                          data ? j->buf : NULL, data ? j->bytes : 0, &rp);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        if (UCS_PTR_IS_ERR(req))
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "reply to a staged request not sent: "
                            "ucp_am_send_nbx() = %s", ucs_status_string(UCS_PTR_STATUS(req)));
        free(j->tok);
        j->tok = NULL;
        return;
    }
    j->state = KVLI_UCX_J_SENDING;
    j->since_ms = kvli_clock_ms();
}

/* A receive or reply UCX never completes (the initiator vanished without
 * UCX noticing): after twice the timeout the job ends; its buffer may still
 * be in UCX's hands, so it leaves the pool and is freed at teardown. */
static int kvli_ucx_job_stuck(kvli_ucx_iface_t *iface, kvli_ucx_job_t *j)
{
    uint64_t idle = kvli_clock_ms() - j->since_ms;
    if (idle <= 2 * iface->timeout_ms)
        return 0;
    iface->ctx->log(iface->ctx, KVL_LOG_WARN, "gave up on a staged %s of %llu bytes: UCX did "
                    "not complete its %s for %llu ms; its bounce buffer is set aside",
                    j->op == KVLI_UCX_OP_READ ? "READ" : "WRITE", (unsigned long long)j->bytes,
                    j->state == KVLI_UCX_J_RECV ? "receive" : "reply",
                    (unsigned long long)idle);
    kvli_ucx_tok_drop(iface, j->tok);
    j->tok = NULL;
    kvli_bounce_retire(&iface->bounce, j->buf);
    j->buf = NULL;
    j->state = KVLI_UCX_J_DONE;
    return 1;
}

static void kvli_ucx_job_free(kvli_ucx_iface_t *iface, kvli_ucx_job_t *j)
{
    if (j->ticket != NULL) {
        kvl_error_t e;
        iface->ctx->stage_test(iface->ctx, j->ticket, 1, &e);
    }
    if (j->desc != NULL && iface->worker != NULL)
        ucp_am_data_release(iface->worker, j->desc);
    for (unsigned i = 0; i < j->n; i++)
        if (j->r[i].pin != NULL)
            iface->ctx->region_unpin(iface->ctx, j->r[i].pin);
    kvli_bounce_put(&iface->bounce, j->buf);
    free(j->tok);
    free(j->data);
    free(j->r);
    free(j);
}

/* Move one job on; 1 when it moved. */
static int kvli_ucx_job_step(kvli_ucx_iface_t *iface, kvli_ucx_job_t *j)
{
    ucs_status_t s = UCS_OK;
    kvl_error_t e;
    int r;

    switch (j->state) {
    case KVLI_UCX_J_BUF:
        j->buf = kvli_bounce_get(&iface->bounce, KVLI_UCX_STAGE_CHUNK, 0, &e);
        if (j->buf == NULL) {
            if (e.code == KVL_OK)
                return 0;
            kvli_ucx_job_refuse_e(iface, j, "", &e);
            j->state = KVLI_UCX_J_REPLY;
            return 1;
        }
        if (j->op == KVLI_UCX_OP_READ) {
            kvli_ucx_job_copy(iface, j, 1);
        } else if (j->data != NULL) {
            memcpy(j->buf, j->data, j->bytes);
            free(j->data);
            j->data = NULL;
            kvli_ucx_job_copy(iface, j, 0);
        } else {
            ucp_request_param_t rp;
            ucs_status_ptr_t req;
            if ((j->tok = kvli_ucx_tok_new(iface, 0)) == NULL) {
                kvli_ucx_job_refuse(j, KVL_ERR_NO_MEMORY, "out of memory");
                j->state = KVLI_UCX_J_REPLY;
                return 1;
            }
            memset(&rp, 0, sizeof(rp));
            rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
            rp.cb.recv_am = kvli_ucx_stage_recv_cb;
            rp.user_data = j->tok;
            req = ucp_am_recv_data_nbx(iface->worker, j->desc, j->buf, j->bytes, &rp);
            j->desc = NULL;
            if (req == NULL || UCS_PTR_IS_ERR(req)) {
                free(j->tok);
                j->tok = NULL;
                if (UCS_PTR_IS_ERR(req)) {
                    kvli_ucx_job_refuse(j, KVL_ERR_REMOTE, "receiving the data: "
                                        "ucp_am_recv_data_nbx() = %s",
                                        ucs_status_string(UCS_PTR_STATUS(req)));
                    j->state = KVLI_UCX_J_REPLY;
                } else {
                    kvli_ucx_job_copy(iface, j, 0);
                }
                return 1;
            }
            j->state = KVLI_UCX_J_RECV;
            j->since_ms = kvli_clock_ms();
        }
        return 1;
    case KVLI_UCX_J_RECV:
        r = kvli_ucx_tok_settle(iface, &j->tok, &s);
        if (r == 0)
            return kvli_ucx_job_stuck(iface, j);
        if (r < 0) {
            kvli_ucx_job_refuse(j, KVL_ERR_REMOTE, "receiving the data: %s",
                                ucs_status_string(s));
            j->state = KVLI_UCX_J_REPLY;
        } else {
            kvli_ucx_job_copy(iface, j, 0);
        }
        return 1;
    case KVLI_UCX_J_COPY:
        r = iface->ctx->stage_test(iface->ctx, j->ticket, 0, &e);
        if (r == 0)
            return 0;
        j->ticket = NULL;
        if (r < 0)
            kvli_ucx_job_refuse_e(iface, j, "staging copy: ", &e);
        j->state = KVLI_UCX_J_REPLY;
        return 1;
    case KVLI_UCX_J_REPLY:
        kvli_ucx_job_reply(iface, j);
        return 1;
    case KVLI_UCX_J_SENDING:
        r = kvli_ucx_tok_settle(iface, &j->tok, &s);
        if (r == 0)
            return kvli_ucx_job_stuck(iface, j);
        if (r < 0)
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "reply to a staged request failed: %s "
                            "(the initiator's bound ends its transfer)", ucs_status_string(s));
        j->state = KVLI_UCX_J_DONE;
        return 1;
    default:
        return 0;
    }
}

int kvli_ucx_stage_progress(kvli_ucx_iface_t *iface)
{
    kvli_ucx_job_t **jp, *j;
    kvli_ucx_chunk_t *c, *n;
    ucs_status_t s;

    kvli_bounce_fill_if_wanted(&iface->bounce);

    for (jp = &iface->stage_jobs; (j = *jp) != NULL;) {
        while (kvli_ucx_job_step(iface, j))
            ;
        if (j->state == KVLI_UCX_J_DONE) {
            *jp = j->next;
            kvli_ucx_job_free(iface, j);
        } else {
            jp = &j->next;
        }
    }
    /* orphaned requests: freed once UCX no longer uses their buffers */
    for (c = iface->stage_live; c != NULL; c = n) {
        n = c->live_next;
        if (c->xp == NULL && kvli_ucx_tok_settle(iface, &c->tok, &s) != 0 &&
            kvli_ucx_tok_settle(iface, &c->rtok, &s) != 0)
            kvli_ucx_chunk_free(iface, c);
    }
    return iface->stage_jobs != NULL || iface->stage_live != NULL;
}

/* Teardown, progress thread joined, before the worker goes: hand back the
 * rendezvous data nobody will receive. */
void kvli_ucx_stage_release_descs(kvli_ucx_iface_t *iface)
{
    for (kvli_ucx_job_t *j = iface->stage_jobs; j != NULL; j = j->next)
        if (j->desc != NULL) {
            ucp_am_data_release(iface->worker, j->desc);
            j->desc = NULL;
        }
    for (kvli_ucx_chunk_t *c = iface->stage_live; c != NULL; c = c->live_next)
        if (c->desc != NULL && c->worker != NULL) {
            ucp_am_data_release(c->worker, c->desc);
            c->desc = NULL;
        }
}

void kvli_ucx_stage_worker_release(kvli_ucx_iface_t *iface, ucp_worker_h w)
{
    for (kvli_ucx_chunk_t *c = iface->stage_live; c != NULL; c = c->live_next)
        if (c->worker == w && c->desc != NULL) {
            ucp_am_data_release(w, c->desc);
            c->desc = NULL;
        }
}

/* The transfers on a data worker ended before it went (its peers were
 * unloaded, which cancels them first), so its requests here are orphans:
 * with the worker destroyed no callback will settle their sends, and
 * nothing of UCX holds their buffers any more. */
void kvli_ucx_stage_worker_gone(kvli_ucx_iface_t *iface, ucp_worker_h w)
{
    kvli_ucx_chunk_t *c, *n;
    for (c = iface->stage_live; c != NULL; c = n) {
        n = c->live_next;
        if (c->worker != w)
            continue;
        c->worker = NULL;
        if (c->xp != NULL)
            continue; /* cannot be: its transfer still runs */
        kvli_ucx_chunk_free(iface, c); /* its tokens too: no callback holds them */
    }
}

/* Teardown, after the worker is destroyed: no UCX callback can run now. */
void kvli_ucx_stage_free_all(kvli_ucx_iface_t *iface)
{
    while (iface->stage_jobs != NULL) {
        kvli_ucx_job_t *j = iface->stage_jobs;
        iface->stage_jobs = j->next;
        kvli_ucx_job_free(iface, j);
    }
    while (iface->stage_live != NULL) {
        kvli_ucx_chunk_t *c = iface->stage_live;
        if (c->ticket != NULL) {
            kvl_error_t e;
            iface->ctx->stage_test(iface->ctx, c->ticket, 1, &e);
            c->ticket = NULL;
        }
        kvli_ucx_chunk_free(iface, c);
    }
    kvli_bounce_fini(&iface->bounce);
}
