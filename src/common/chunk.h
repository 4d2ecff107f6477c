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

#endif
