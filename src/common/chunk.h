/*
 * Walking a transfer's segments piece by piece (shared layer).
 *
 * A transfer is a list of segments (kvl_seg_t): `count` blocks of `len`
 * bytes, the blocks `lstride`/`rstride` apart. Every backend cuts it into
 * its own units (a copy-engine batch, a socket request, a bounce buffer,
 * a worker's iovec batch) the same way: from a cursor (segment, block,
 * offset in the block), take the next piece, at most as many bytes as the
 * unit has room for, and move the cursor past what was taken. A block
 * larger than the room is split; empty segments are stepped over.
 *
 *     kvli_chunk_cur_t cur = {0};
 *     kvli_piece_t p;
 *     while (room > 0 && kvli_chunk_peek(&cur, x->segs, x->nsegs, room, &p)) {
 *         ... use p.laddr, p.raddr, p.len (p.seg is its segment) ...
 *         kvli_chunk_take(&cur, x->segs, p.len);
 *         room -= p.len;
 *     }
 *
 * peek does not move the cursor past the piece, so a unit that turns out
 * full (out of iovecs, another data path) leaves it for the next unit. The
 * cursor is a plain value: copy it to look ahead.
 */
#ifndef KVLI_CHUNK_H
#define KVLI_CHUNK_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/backend.h>

typedef struct kvli_chunk_cur {
    size_t seg;                      /* segment; nsegs when walked */
    uint64_t blk;                    /* block in the segment */
    uint64_t off;                    /* bytes of the block already taken */
} kvli_chunk_cur_t;

typedef struct kvli_piece {
    uint64_t laddr, raddr, len;      /* local and remote address, bytes */
    size_t seg;                      /* the segment it belongs to */
} kvli_piece_t;

/* The piece's regions (indices into x->lmh / x->rmh), from kvli_xchunk_peek. */
typedef struct kvli_xpiece {
    kvli_piece_t p;
    uint32_t lreg, rreg;
} kvli_xpiece_t;

/* The piece at the cursor, at most max (> 0) bytes: 1, or 0 when the
 * transfer is walked. Steps the cursor over empty segments only. */
static inline int kvli_chunk_peek(kvli_chunk_cur_t *c, const kvl_seg_t *segs, size_t nsegs,
                                  uint64_t max, kvli_piece_t *p)
{
    const kvl_seg_t *s;
    while (c->seg < nsegs && (segs[c->seg].len == 0 || segs[c->seg].count == 0)) {
        c->seg++;
        c->blk = c->off = 0;
    }
    if (c->seg >= nsegs)
        return 0;
    s = &segs[c->seg];
    p->laddr = s->laddr + c->blk * s->lstride + c->off;
    p->raddr = s->raddr + c->blk * s->rstride + c->off;
    p->len = s->len - c->off < max ? s->len - c->off : max;
    p->seg = c->seg;
    return 1;
}

/* Move the cursor past len bytes of the piece peek returned (len <= its len). */
static inline void kvli_chunk_take(kvli_chunk_cur_t *c, const kvl_seg_t *segs, uint64_t len)
{
    const kvl_seg_t *s = &segs[c->seg];
    c->off += len;
    if (c->off == s->len) {
        c->off = 0;
        if (++c->blk == s->count) {
            c->blk = 0;
            c->seg++;
        }
    }
}

/* Whether the whole transfer has been walked (empty tail segments aside). */
static inline int kvli_chunk_done(const kvli_chunk_cur_t *c, const kvl_seg_t *segs,
                                  size_t nsegs)
{
    size_t i = c->seg;
    while (i < nsegs && (segs[i].len == 0 || segs[i].count == 0))
        i++;
    return i >= nsegs;
}

/*
 * The same walk over a whole transfer, segmented or indexed: an indexed
 * transfer (x->nidx > 0, x->nsegs == 0: KVL_BK_CAP_INDEXED backends) is
 * walked pair by pair from its index arrays and the two lists' address
 * tables, without pairing it into segments first (cur.seg is the pair).
 * The piece also names its regions.
 */
static inline int kvli_xchunk_indexed(const kvl_bk_xfer_t *x)
{
    return x->nsegs == 0 && x->nidx > 0;
}

/* How many segments x has, or pairs when it is indexed (cur.seg's range). */
static inline size_t kvli_xchunk_count(const kvl_bk_xfer_t *x)
{
    return kvli_xchunk_indexed(x) ? x->nidx : x->nsegs;
}

/* Segment i of x, or, indexed, pair i as a one-block segment. */
static inline kvl_seg_t kvli_xchunk_seg(const kvl_bk_xfer_t *x, size_t i)
{
    if (!kvli_xchunk_indexed(x))
        return x->segs[i];
    uint32_t li = x->lidx[i], ri = x->ridx[i];
    return (kvl_seg_t){x->ltab->addrs[li], x->rtab->addrs[ri], x->ltab->len, 1, 0, 0,
                       x->ltab->regs[li], x->rtab->regs[ri]};
}

static inline int kvli_xchunk_peek(kvli_chunk_cur_t *c, const kvl_bk_xfer_t *x, uint64_t max,
                                   kvli_xpiece_t *xp)
{
    if (!kvli_xchunk_indexed(x)) {
        if (!kvli_chunk_peek(c, x->segs, x->nsegs, max, &xp->p))
            return 0;
        xp->lreg = x->segs[xp->p.seg].lreg;
        xp->rreg = x->segs[xp->p.seg].rreg;
        return 1;
    }
    uint64_t len = x->ltab->len;
    if (c->seg >= x->nidx || len == 0)
        return 0;
    uint32_t li = x->lidx[c->seg], ri = x->ridx[c->seg];
    xp->p.laddr = x->ltab->addrs[li] + c->off;
    xp->p.raddr = x->rtab->addrs[ri] + c->off;
    xp->p.len = len - c->off < max ? len - c->off : max;
    xp->p.seg = c->seg;
    xp->lreg = x->ltab->regs[li];
    xp->rreg = x->rtab->regs[ri];
    return 1;
}

static inline void kvli_xchunk_take(kvli_chunk_cur_t *c, const kvl_bk_xfer_t *x, uint64_t len)
{
    if (!kvli_xchunk_indexed(x)) {
        kvli_chunk_take(c, x->segs, len);
        return;
    }
    c->off += len;
    if (c->off == x->ltab->len) {
        c->off = 0;
        c->seg++;
    }
}

static inline int kvli_xchunk_done(const kvli_chunk_cur_t *c, const kvl_bk_xfer_t *x)
{
    if (!kvli_xchunk_indexed(x))
        return kvli_chunk_done(c, x->segs, x->nsegs);
    return c->seg >= x->nidx || x->ltab->len == 0;
}

#endif
