/* The chunk iterator (src/common/chunk.h) every backend cuts transfers
 * with: pieces cover each block's bytes exactly once, in order, never more
 * than the room asked for; peek does not move the cursor; empty segments
 * are stepped over. Checked against a byte-by-byte reference walk. */
#include <string.h>
#include "common/kvltest.h"
#include "common/chunk.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The i-th byte of the transfer, as (local, remote) addresses. */
static int nth_byte(const kvl_seg_t *segs, size_t nsegs, uint64_t i, uint64_t *l, uint64_t *r)
{
    for (size_t s = 0; s < nsegs; s++) {
        uint64_t sz = segs[s].len * segs[s].count;
        if (i < sz) {
            uint64_t b = i / segs[s].len, o = i % segs[s].len;
            *l = segs[s].laddr + b * segs[s].lstride + o;
            *r = segs[s].raddr + b * segs[s].rstride + o;
            return 1;
        }
        i -= sz;
    }
    return 0;
}

static void walk_random(unsigned round)
{
    kvl_seg_t segs[8];
    size_t nsegs = 1 + next() % 8;
    uint64_t total = 0, seen = 0, pieces = 0;
    kvli_chunk_cur_t cur = {0};
    kvli_piece_t p, q;

    memset(segs, 0, sizeof(segs));
    for (size_t s = 0; s < nsegs; s++) {
        /* every third segment may be empty (len or count 0) */
        segs[s].len = next() % 3 == 0 ? (next() & 1 ? 0 : 1 + next() % 5000) : 1 + next() % 5000;
        segs[s].count = next() % 4 == 0 && segs[s].len != 0 ? 0 : 1 + next() % 6;
        segs[s].lstride = segs[s].len + next() % 100;
        segs[s].rstride = segs[s].len + next() % 300;
        segs[s].laddr = 0x100000ull * (s + 1);
        segs[s].raddr = 0x80000000ull + 0x200000ull * (s + 1);
        total += segs[s].len * segs[s].count;
    }
    for (;;) {
        uint64_t room = 1 + next() % 7000;
        if (!kvli_chunk_peek(&cur, segs, nsegs, room, &p))
            break;
        /* peeking again gives the same piece: the cursor did not move */
        KT_CHECK(kvli_chunk_peek(&cur, segs, nsegs, room, &q));
        KT_CHECK(q.laddr == p.laddr && q.raddr == p.raddr && q.len == p.len && q.seg == p.seg);
        KT_CHECK(p.len >= 1 && p.len <= room);
        KT_CHECK(segs[p.seg].len != 0 && segs[p.seg].count != 0);
        KT_CHECK(!kvli_chunk_done(&cur, segs, nsegs));
        /* take only part of it sometimes, as a full unit would */
        uint64_t take = next() % 4 == 0 ? 1 + next() % p.len : p.len;
        uint64_t l, r;
        KT_CHECK(nth_byte(segs, nsegs, seen, &l, &r));
        KT_CHECK(l == p.laddr && r == p.raddr);
        KT_CHECK(nth_byte(segs, nsegs, seen + take - 1, &l, &r));
        KT_CHECK(l == p.laddr + take - 1 && r == p.raddr + take - 1); /* one block */
        kvli_chunk_take(&cur, segs, take);
        seen += take;
        pieces++;
        KT_CHECK(pieces <= total + 1);
    }
    KT_CHECK(seen == total);
    KT_CHECK(kvli_chunk_done(&cur, segs, nsegs));
    KT_CHECK(cur.seg == nsegs);
    if (round < 3)
        printf("round %u: %zu segments, %llu bytes in %llu pieces\n", round, nsegs,
               (unsigned long long)total, (unsigned long long)pieces);
}

int main(void)
{
    /* A block larger than the room is split, and the cursor stays inside it. */
    kvl_seg_t one = {.laddr = 1000, .raddr = 9000, .len = 10, .count = 2, .lstride = 16,
                     .rstride = 32};
    kvli_chunk_cur_t c = {0};
    kvli_piece_t p;
    KT_CHECK(kvli_chunk_peek(&c, &one, 1, 4, &p) && p.laddr == 1000 && p.len == 4);
    kvli_chunk_take(&c, &one, 4);
    KT_CHECK(c.seg == 0 && c.blk == 0 && c.off == 4);
    KT_CHECK(kvli_chunk_peek(&c, &one, 1, 100, &p) && p.laddr == 1004 && p.raddr == 9004 &&
             p.len == 6);
    kvli_chunk_take(&c, &one, 6);
    KT_CHECK(c.blk == 1 && c.off == 0);
    KT_CHECK(kvli_chunk_peek(&c, &one, 1, 100, &p) && p.laddr == 1016 && p.raddr == 9032 &&
             p.len == 10);
    kvli_chunk_take(&c, &one, 10);
    KT_CHECK(kvli_chunk_done(&c, &one, 1) && !kvli_chunk_peek(&c, &one, 1, 1, &p));

    /* Only empty segments: nothing to walk. */
    kvl_seg_t empty[2] = {{.len = 0, .count = 3}, {.len = 8, .count = 0}};
    kvli_chunk_cur_t e = {0};
    KT_CHECK(kvli_chunk_done(&e, empty, 2) && !kvli_chunk_peek(&e, empty, 2, 64, &p));
    KT_CHECK(!kvli_chunk_peek(&e, empty, 0, 64, &p));

    for (unsigned i = 0; i < 2000; i++)
        walk_random(i);
    printf("ok\n");
    return 0;
}
