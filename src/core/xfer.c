/* Transfers: pair prepared lists into segments, pick a backend, post, wait,
 * cancel truthfully. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"

/* Fewer pairs than this go through segments even when indices could do. */
#define KVLI_IDX_MIN 256

typedef struct {
    kvl_seg_t *segs;
    size_t n, cap;
} kvli_segv_t;

static bool kvli_segv_push(kvli_segv_t *v, const kvl_seg_t *s)
{
    if (v->n > 0) {
        kvl_seg_t *p = &v->segs[v->n - 1];
        /* Coalesce contiguous neighbours on both sides. */
        if (p->count == 1 && s->count == 1 && p->lreg == s->lreg && p->rreg == s->rreg &&
            p->laddr + p->len == s->laddr && p->raddr + p->len == s->raddr) {
            p->len += s->len;
            return true;
        }
    }
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        kvl_seg_t *ns = kvli_buf_alloc(cap * sizeof(*ns));
        if (ns == NULL)
            return false;
        if (v->n)
            memcpy(ns, v->segs, v->n * sizeof(*ns));
        kvli_buf_free(v->segs, v->cap * sizeof(*ns));
        v->segs = ns;
        v->cap = cap;
    }
    v->segs[v->n++] = *s;
    return true;
}

/* Backend b's handle of region i of the remote list (a FILE list of this
 * agent's own files: the agent's own registration). */
static void *kvli_rp_handle(const kvl_prep_t *rp, size_t i, unsigned b)
{
    if (rp->self_files)
        return ((kvli_region_t *)rp->regs[i])->mh[b];
    return ((const kvli_rregion_t *)rp->regs[i])->rh[b];
}

/* A FILE list's regions are the agent's own: a transfer holds them against
 * deregistration as it holds its local ones (x->lregs has room). */
static void kvli_hold_self_files(kvl_xfer_t *x, const kvl_prep_t *rp, const bool *rused)
{
    if (!rp->self_files)
        return;
    for (size_t i = 0; i < rp->nregs; i++) {
        if (rused != NULL && !rused[i])
            continue;
        kvli_region_t *r = rp->regs[i];
        x->lregs[x->nlregs++] = r;
        kvli_region_get(r);
    }
}

/*
 * Whether backend b cannot move this transfer: 0 it can; 1 it cannot, and
 * with why (not NULL) the reason. The picking pass runs without why, so a
 * transfer that finds its backend formats nothing; only a failed pick
 * builds the error (one more pass).
 */
static int kvli_bk_refuses(const kvl_agent_t *a, unsigned b, const kvl_prep_t *lp,
                           const kvl_prep_t *rp, const bool *lused, const bool *rused, char *why,
                           size_t cap)
{
    const struct kvl_backend *bk = a->bks[b];
    const kvli_remote_t *rem = rp->rem;
    if (!(bk->ops->mem_local & KVL_MEM_BIT(lp->kind))) {
        if (why)
            snprintf(why, cap, "does not serve local %s memory", kvl_mem_kind_name(lp->kind));
        return 1;
    }
    if (!(bk->ops->mem_remote & KVL_MEM_BIT(rp->kind))) {
        if (why)
            snprintf(why, cap, "cannot reach remote %s memory", kvl_mem_kind_name(rp->kind));
        return 1;
    }
    if (!rp->self_files && rem->peer[b] == NULL) {
        if (why)
            snprintf(why, cap, "peer not reachable: %s",
                     rem->unreachable[b][0] ? rem->unreachable[b] : "no connection info");
        return 1;
    }
    for (size_t i = 0; i < lp->nregs; i++) {
        const kvli_region_t *r = lp->regs[i];
        if (lused[i] && !(r->bk_mask & (1u << b))) {
            if (why)
                snprintf(why, cap, "local region 0x%llx+%llu is not registered on it",
                         (unsigned long long)r->addr, (unsigned long long)r->len);
            return 1;
        }
    }
    for (size_t i = 0; rp->self_files && i < rp->nregs; i++) {
        const kvli_region_t *r = rp->regs[i];
        if (rused[i] && !(r->bk_mask & (1u << b))) {
            if (why)
                snprintf(why, cap, "file range (fd %d, offset %llu, len %llu) is not "
                         "registered on it", (int)r->dev,
                         (unsigned long long)kvli_file_off(r->addr), (unsigned long long)r->len);
            return 1;
        }
    }
    for (size_t i = 0; !rp->self_files && i < rp->nregs; i++) {
        const kvli_rregion_t *g = rp->regs[i];
        if (rused[i] && g->rh[b] == NULL) {
            if (why)
                snprintf(why, cap, "remote region 0x%llx+%llu carries no key for it",
                         (unsigned long long)g->addr, (unsigned long long)g->len);
            return 1;
        }
    }
    return 0;
}

static kvl_status_t kvli_pick_backend(kvl_agent_t *a, kvl_xfer_t *x, const kvl_prep_t *lp,
                                      const kvl_prep_t *rp, const bool *lused, const bool *rused,
                                      const char *want, kvl_error_t *err)
{
    kvli_remote_t *rem = rp->rem;
    /* VRAM on either side: backends that reach it directly come first, those
     * that stage it through host memory (tcp) after them. Pass 0 picks;
     * pass 1, when nothing was picked, says why of each. */
    bool vram = lp->kind == KVL_MEM_VRAM || rp->kind == KVL_MEM_VRAM;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            if (rp->self_files)
                kvli_err(err, KVL_ERR_NO_BACKEND, 0, "no backend of agent '%s' can move %s "
                         "memory to and from its files", a->name, kvl_mem_kind_name(lp->kind));
            else
                kvli_err(err, KVL_ERR_NO_BACKEND, 0, "no backend can move %s -> %s between "
                         "agent '%s' and agent '%s'", kvl_mem_kind_name(lp->kind),
                         kvl_mem_kind_name(rp->kind), a->name, rem->name);
            kvli_scopy(err->agent, sizeof(err->agent), rem->name);
        }
        for (unsigned k = 0; k < 2 * a->nbks; k++) {
            unsigned b = k % a->nbks;
            struct kvl_backend *bk = a->bks[b];
            bool staged = vram && (bk->ops->caps & KVL_BK_CAP_STAGED_VRAM);
            if (want && strcmp(want, bk->ops->name) != 0)
                continue;
            if ((k < a->nbks) == staged)
                continue; /* first round: direct backends; second: staging ones */
            if (pass == 0) {
                if (!kvli_bk_refuses(a, b, lp, rp, lused, rused, NULL, 0)) {
                    x->bk = bk;
                    return KVL_OK;
                }
                continue;
            }
            char why[256] = "";
            kvli_bk_refuses(a, b, lp, rp, lused, rused, why, sizeof(why));
            kvl_error_t c;
            kvl_bk_error_set(&c, KVL_ERR_UNSUPPORTED, 0, bk->ops->name, -1, "%s", why);
            c.hint[0] = '\0';
            kvli_err_add_cause(err, &c);
        }
    }
    if (want && err->n_causes == 0)
        snprintf(err->what, sizeof(err->what), "backend '%s' requested for the transfer is not "
                 "created on agent '%s'", want, a->name);
    kvli_hint(err, "create a backend on both agents that serves both memory kinds, register the "
                   "memory on it and reload the remote metadata");
    return KVL_ERR_NO_BACKEND;
}

/* A transfer object before its backend is picked (NULL: out of memory). */
static kvl_xfer_t *kvli_xfer_new(kvl_agent_t *a, kvl_xfer_op_t op)
{
    kvl_xfer_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return NULL;
    x->agent = a;
    x->op = op;
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->cond, NULL);
    return x;
}

static const char *kvli_xfer_want(const kvl_xfer_params_t *params)
{
    return params && (params->field_mask & KVL_XFER_PARAM_BACKEND) ? params->backend : NULL;
}

/* Common end of building a transfer (x has its backend, regions and
 * segments or indices): the notification, the backend's view, the agent's
 * list. Only fails for memory. */
static kvl_status_t kvli_xfer_finish(kvl_agent_t *a, kvl_xfer_t *x, kvl_xfer_op_t op,
                                     const void *notif, size_t notif_len,
                                     const kvl_xfer_params_t *params, uint64_t bytes)
{
    unsigned b = x->bk->index;
    if (notif_len > 0 || notif != NULL) {
        x->notif = malloc(notif_len + 1);
        if (x->notif == NULL)
            return KVL_ERR_NO_MEMORY;
        memcpy(x->notif, notif, notif_len);
        x->notif_len = notif_len;
    }
    x->bx = (kvl_bk_xfer_t){
        .op = op,
        .peer = x->rem->peer[b],
        .segs = x->segs,
        .nsegs = x->nsegs,
        .total_bytes = bytes,
        .lmh = x->lmh,
        .rmh = x->rmh,
        .notif = x->notif,
        .notif_len = x->notif_len,
        .timeout_ms = (params && (params->field_mask & KVL_XFER_PARAM_TIMEOUT) && params->timeout_ms)
                          ? params->timeout_ms : a->timeout_ms,
        .core = x,
    };
    if (x->lidx != NULL) {
        x->bx.ltab = &x->lprep->tab;
        x->bx.rtab = &x->rprep->tab;
        x->bx.lidx = x->lidx;
        x->bx.ridx = x->ridx;
        x->bx.nidx = x->blocks;
        x->bx.ltab_cache = &x->lprep->bk_cache[b];
        x->bx.rtab_cache = &x->rprep->bk_cache[b];
        x->bx.idx_cookie = x->idx_cookie;
    }
    atomic_init(&x->state, KVL_XFER_IDLE);
    pthread_mutex_lock(&a->lock);
    x->next = a->xfers;
    if (a->xfers)
        a->xfers->prev = x;
    a->xfers = x;
    pthread_mutex_unlock(&a->lock);
    return KVL_OK;
}

/* Narrow n indices to 32 bits: the OR of their high halves and the largest
 * low half come back, so one test after the loop checks both bounds (a
 * negative index has high bits). Written for the vectorizer: a request of
 * 65536 pairs is 131072 indices, and this loop was most of creating it. On
 * x86-64 an AVX2 copy is chosen at run time (3.5x the scalar loop on an
 * EPYC); not through target_clones, whose resolver runs before a sanitizer
 * runtime is up. */
#define KVLI_IDX_NARROW_BODY                                                                       \
    uint64_t high = 0;                                                                             \
    uint32_t top = 0;                                                                              \
    for (size_t i = 0; i < n; i++) {                                                               \
        uint64_t k = (uint64_t)idx[i];                                                             \
        uint32_t v = (uint32_t)k;                                                                  \
        high |= k >> 32;                                                                           \
        top = v > top ? v : top;                                                                   \
        out[i] = v;                                                                                \
    }                                                                                              \
    *high_p = high;                                                                                \
    return top;

#if defined(__GNUC__) && !defined(__clang__)
/* -O2's cost model leaves the AVX2 loop scalar. */
#define KVLI_IDX_VECTORIZE __attribute__((optimize("vect-cost-model=dynamic")))
#else
#define KVLI_IDX_VECTORIZE
#endif

KVLI_IDX_VECTORIZE
static uint32_t kvli_idx_narrow_any(const int64_t *restrict idx, size_t n, uint32_t *restrict out,
                                    uint64_t *high_p)
{
    KVLI_IDX_NARROW_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KVLI_IDX_AVX2 1
#include <immintrin.h>

__attribute__((target("avx2"))) KVLI_IDX_VECTORIZE
static uint32_t kvli_idx_narrow_avx2(const int64_t *restrict idx, size_t n,
                                     uint32_t *restrict out, uint64_t *high_p)
{
    KVLI_IDX_NARROW_BODY
}

/*
 * The same with non-temporal stores, for indices written into pinned memory
 * that a GPU's copy engine reads next: the CPU never reads them again, and
 * storing around the cache spares each line's read for ownership. A
 * microbenchmark on the H200 machine's host, 131072 indices into
 * cuMemHostAlloc memory that was not in the cache (as after the previous
 * request's upload): 65-76 us with ordinary stores, 31-43 us streamed; into
 * cached lines streaming is slower (33-44 against 25-40 us), so only large
 * arrays are streamed. In a whole request the gain is within that host's
 * noise (docs/performance.md, session 12).
 */
__attribute__((target("avx2")))
static uint32_t kvli_idx_narrow_avx2_nt(const int64_t *restrict idx, size_t n,
                                        uint32_t *restrict out, uint64_t *high_p)
{
    /* up to the first 32-byte boundary of out, and past the last one: the
     * plain loop */
    size_t i = (((uintptr_t)0 - (uintptr_t)out) & 31u) / sizeof(*out);
    uint64_t high, h2;
    if (i > n)
        i = n;
    uint32_t top = kvli_idx_narrow_any(idx, i, out, &high);
    __m256i vh = _mm256_setzero_si256(), vt = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(idx + i)));
        __m256 b = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(idx + i + 4)));
        /* low and high halves of the 8 indices, in lane order a0 a1 b0 b1
         * a2 a3 b2 b3; the permute puts the low halves back in order */
        __m256i lo = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88));
        __m256i hi = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD));
        lo = _mm256_permute4x64_epi64(lo, 0xD8);
        vh = _mm256_or_si256(vh, hi);
        vt = _mm256_max_epu32(vt, lo);
        _mm256_stream_si256((__m256i *)(void *)(out + i), lo);
    }
    uint32_t h8[8], t8[8];
    _mm256_storeu_si256((__m256i *)(void *)h8, vh);
    _mm256_storeu_si256((__m256i *)(void *)t8, vt);
    for (int j = 0; j < 8; j++) {
        high |= h8[j];
        top = t8[j] > top ? t8[j] : top;
    }
    uint32_t t2 = kvli_idx_narrow_any(idx + i, n - i, out + i, &h2);
    high |= h2;
    top = t2 > top ? t2 : top;
    _mm_sfence(); /* the streamed lines are visible before the upload is queued */
    *high_p = high;
    return top;
}
#endif

/* Arrays at least this long go around the cache when asked (stream). */
#define KVLI_IDX_STREAM_MIN 16384

static uint32_t kvli_idx_narrow(const int64_t *idx, size_t n, uint32_t *out, uint64_t *high_p,
                                bool stream)
{
#ifdef KVLI_IDX_AVX2
    static int avx2 = -1; /* a benign race: every thread computes the same value */
    int have = __atomic_load_n(&avx2, __ATOMIC_RELAXED);
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&avx2, have, __ATOMIC_RELAXED);
    }
    if (have && stream && n >= KVLI_IDX_STREAM_MIN)
        return kvli_idx_narrow_avx2_nt(idx, n, out, high_p);
    if (have)
        return kvli_idx_narrow_avx2(idx, n, out, high_p);
#endif
    (void)stream;
    return kvli_idx_narrow_any(idx, n, out, high_p);
}

/* Check n indices against a list of len entries; the first bad one named. */
static kvl_status_t kvli_idx_copy(const int64_t *idx, size_t n, size_t len, uint32_t *out,
                                  bool stream, const char *side, kvl_error_t *err)
{
    uint64_t high;
    uint32_t top = kvli_idx_narrow(idx, n, out, &high, stream);
    if (n == 0 || (high == 0 && top < len))
        return KVL_OK;
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0 || (uint64_t)idx[i] >= len) {
            kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s index %zu is %lld; the prepared list has "
                     "%zu entries", side, i, (long long)idx[i], len);
            break;
        }
    return KVL_ERR_INVALID_ARG;
}

/*
 * Indexed transfer: when both lists are uniform (every entry one block of
 * the same length) and the backend moves indices itself, pairing is left to
 * it (a GPU gathers from the index arrays): creation costs a bounds check and
 * a copy of the indices, whatever the order of the blocks. *done_p false:
 * not applicable (the caller pairs segments as usual).
 */
static kvl_status_t kvli_xfer_build_indexed(kvl_agent_t *a, kvl_xfer_op_t op, kvl_prep_t *lp,
                                            const int64_t *lidx, kvl_prep_t *rp,
                                            const int64_t *ridx, size_t n, const void *notif,
                                            size_t notif_len, const kvl_xfer_params_t *params,
                                            kvl_xfer_t **xfer_p, bool *done_p, kvl_error_t *err)
{
    bool *lused = NULL, *rused = NULL;
    kvl_xfer_t *x = NULL;
    kvl_status_t st;

    *done_p = false;
    if (!lp->uniform || !rp->uniform || lp->ulen != rp->ulen || n < KVLI_IDX_MIN ||
        lp->n > UINT32_MAX || rp->n > UINT32_MAX)
        return KVL_OK;
    lused = malloc(lp->nregs + 1);
    rused = malloc(rp->nregs + 1);
    if (lused == NULL || rused == NULL || (x = kvli_xfer_new(a, op)) == NULL)
        goto oom;
    memset(lused, 1, lp->nregs + 1);
    memset(rused, 1, rp->nregs + 1);
    pthread_mutex_lock(&a->lock);
    st = kvli_pick_backend(a, x, lp, rp, lused, rused, kvli_xfer_want(params), err);
    if (st != KVL_OK || !(x->bk->ops->caps & KVL_BK_CAP_INDEXED)) {
        /* Not with every region of both lists: the usual path decides on
         * the regions this transfer really uses. */
        pthread_mutex_unlock(&a->lock);
        memset(err, 0, offsetof(kvl_error_t, causes));
        err->device = -1;
        kvli_xfer_free(x); /* holds nothing yet */
        free(lused);
        free(rused);
        return KVL_OK;
    }
    unsigned b = x->bk->index;
    x->lregs = malloc((lp->nregs + (rp->self_files ? rp->nregs : 0) + 1) * sizeof(*x->lregs));
    x->lmh = malloc((lp->nregs + 1) * sizeof(*x->lmh));
    x->rmh = malloc((rp->nregs + 1) * sizeof(*x->rmh));
    if (!x->lregs || !x->lmh || !x->rmh) {
        pthread_mutex_unlock(&a->lock);
        goto oom;
    }
    for (size_t i = 0; i < lp->nregs; i++) {
        kvli_region_t *r = lp->regs[i];
        x->lregs[x->nlregs] = r;
        x->lmh[x->nlregs++] = r->mh[b];
        kvli_region_get(r);
    }
    for (size_t i = 0; i < rp->nregs; i++)
        x->rmh[x->nrregs++] = kvli_rp_handle(rp, i, b);
    kvli_hold_self_files(x, rp, NULL);
    x->rem = rp->rem;
    kvli_remote_get(x->rem);
    pthread_mutex_unlock(&a->lock);
    free(lused);
    free(rused);
    lused = rused = NULL;
    *done_p = true;
    /* Where the backend reads them from when it lends memory (pinned, for
     * an upload without a copy), else from the buffer cache: a request's
     * arrays reuse the last one's pages (x->blocks sizes them for
     * kvli_xfer_free). One pass checks and writes them. */
    x->blocks = n;
    const kvl_backend_ops_t *ops = x->bk->ops;
    if (KVLI_OPS_HAS(ops, idx_alloc) && KVLI_OPS_HAS(ops, idx_free))
        x->lidx = ops->idx_alloc(x->bk->bk, x->lmh, lp->nregs, 2 * n * sizeof(*x->lidx),
                                 &x->idx_cookie);
    if (x->lidx == NULL) {
        x->idx_cookie = NULL;
        x->lidx = kvli_buf_alloc(2 * n * sizeof(*x->lidx)); /* ridx follows lidx */
    }
    x->ridx = x->lidx != NULL ? x->lidx + n : NULL;
    if (x->lidx == NULL || kvli_prep_tab(lp) == NULL || kvli_prep_tab(rp) == NULL)
        goto oom;
    /* lent memory is read by a device next: written around the cache */
    bool stream = x->idx_cookie != NULL;
    st = kvli_idx_copy(lidx, n, lp->n, x->lidx, stream, "local", err);
    if (st == KVL_OK)
        st = kvli_idx_copy(ridx, n, rp->n, x->ridx, stream, "remote", err);
    if (st != KVL_OK) {
        kvli_xfer_free(x);
        return st;
    }
    kvli_prep_ref(lp);
    kvli_prep_ref(rp);
    x->lprep = lp;
    x->rprep = rp;
    if (kvli_xfer_finish(a, x, op, notif, notif_len, params, n * lp->ulen) != KVL_OK)
        goto oom;
    *xfer_p = x;
    return KVL_OK;

oom:
    free(lused);
    free(rused);
    if (x != NULL)
        kvli_xfer_free(x);
    *done_p = true;
    kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory building a transfer of %zu pairs", n);
    return KVL_ERR_NO_MEMORY;
}

/* ctx->xfer_expand: segments from an indexed transfer's pairs, once. */
kvl_status_t kvli_xfer_ctx_expand(kvl_bk_ctx_t *ctx, kvl_bk_xfer_t *bx, kvl_error_t *err)
{
    kvl_xfer_t *x = bx->core;
    kvli_segv_t v = {0};
    (void)ctx;
    if (x->lidx == NULL || x->segs != NULL)
        return KVL_OK;
    v.cap = x->blocks;
    v.segs = kvli_buf_alloc(v.cap * sizeof(*v.segs));
    if (v.segs == NULL) {
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory pairing a transfer of %llu blocks",
                 (unsigned long long)x->blocks);
        return KVL_ERR_NO_MEMORY;
    }
    const kvli_pent_t *le = x->lprep->ents, *re = x->rprep->ents;
    uint64_t len = x->lprep->ulen;
    for (size_t i = 0; i < x->blocks; i++) {
        const kvli_pent_t *l = &le[x->lidx[i]], *r = &re[x->ridx[i]];
        kvl_seg_t sg = {l->addr, r->addr, len, 1, 0, 0, l->reg, r->reg};
        kvli_segv_push(&v, &sg); /* never grows: at most one segment per pair */
    }
    x->segs = v.segs;
    x->nsegs = v.n;
    x->segs_cap = v.cap;
    bx->segs = x->segs;
    bx->nsegs = x->nsegs;
    return KVL_OK;
}

kvl_status_t kvli_xfer_build(kvl_agent_t *a, kvl_xfer_op_t op, const kvl_prep_t *lp,
                             const int64_t *lidx, size_t nl, const kvl_prep_t *rp,
                             const int64_t *ridx, size_t nr, const kvl_xfer_params_t *params,
                             kvl_xfer_t **xfer_p, kvl_error_t *err)
{
    kvli_segv_t v = {0};
    bool *lused = NULL, *rused = NULL;
    uint32_t *lmap = NULL, *rmap = NULL;
    kvl_xfer_t *x = NULL;
    kvl_status_t st = KVL_ERR_NO_MEMORY;
    uint64_t bytes = 0, blocks = 0;

    if (op != KVL_READ && op != KVL_WRITE) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "transfer operation %d is neither KVL_READ nor "
                 "KVL_WRITE", (int)op);
        return KVL_ERR_INVALID_ARG;
    }
    if (lp->remote || !rp->remote || rp->rem == NULL) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "the first prepared list must be local and the "
                 "second remote");
        return KVL_ERR_INVALID_ARG;
    }
    if (lp->kind == KVL_MEM_FILE || (rp->kind == KVL_MEM_FILE && !rp->self_files)) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s", lp->kind == KVL_MEM_FILE
                 ? "the local list of the transfer is FILE: files are the remote side of a "
                   "transfer, the local side is the DRAM or VRAM they fill or empty"
                 : "the remote list is FILE ranges of another agent: files are local to the "
                   "process that registered them");
        kvli_hint(err, "pass the DRAM/VRAM list as local and the FILE list as remote, naming "
                       "this agent ('%s') as the remote agent", a->name);
        return KVL_ERR_INVALID_ARG;
    }
    const void *notif = NULL;
    size_t notif_len = 0;
    if (params && (params->field_mask & KVL_XFER_PARAM_NOTIF)) {
        notif = params->notif;
        notif_len = params->notif_len;
        if (notif_len > KVL_NOTIF_MAX || (notif == NULL && notif_len > 0)) {
            kvli_err(err, KVL_ERR_INVALID_ARG, 0, "notification of %zu bytes: NULL or larger "
                     "than KVL_NOTIF_MAX (%d)", notif_len, KVL_NOTIF_MAX);
            return KVL_ERR_INVALID_ARG;
        }
    }
    if (lidx != NULL && ridx != NULL && nl == nr) {
        /* The lists are the caller's (const in the API); an indexed transfer
         * takes a reference on them and makes their tables once. */
        bool done;
        st = kvli_xfer_build_indexed(a, op, (kvl_prep_t *)lp, lidx, (kvl_prep_t *)rp, ridx, nl,
                                     notif, notif_len, params, xfer_p, &done, err);
        if (done)
            return st;
    }
    /* Pairing yields at most one segment per entry of either side. */
    v.cap = nl + nr;
    v.segs = kvli_buf_alloc(v.cap * sizeof(*v.segs));
    if (v.segs == NULL)
        goto oom;
    lused = calloc(lp->nregs + 1, 1);
    rused = calloc(rp->nregs + 1, 1);
    if (lused == NULL || rused == NULL)
        goto oom;

    /* Pair block streams: entries may be strided on either side. */
    size_t li = 0, ri = 0;
    uint64_t lj = 0, rj = 0;
    const kvli_pent_t *le = NULL, *re = NULL;
    for (;;) {
        if (le == NULL && li < nl) {
            int64_t k = lidx ? lidx[li] : (int64_t)li;
            if (k < 0 || (size_t)k >= lp->n) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "local index %zu is %lld; the prepared "
                         "list has %zu entries", li, (long long)k, lp->n);
                st = KVL_ERR_INVALID_ARG;
                goto fail;
            }
            le = &lp->ents[k];
            lj = 0;
        }
        if (re == NULL && ri < nr) {
            int64_t k = ridx ? ridx[ri] : (int64_t)ri;
            if (k < 0 || (size_t)k >= rp->n) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "remote index %zu is %lld; the prepared "
                         "list has %zu entries", ri, (long long)k, rp->n);
                st = KVL_ERR_INVALID_ARG;
                goto fail;
            }
            re = &rp->ents[k];
            rj = 0;
        }
        if (le == NULL || re == NULL) {
            if (le != NULL || re != NULL) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "the %s list has more blocks than the %s "
                         "list (%llu paired so far)", le ? "local" : "remote",
                         le ? "remote" : "local", (unsigned long long)blocks);
                kvli_hint(err, "both lists must describe the same number of blocks");
                st = KVL_ERR_INVALID_ARG;
                goto fail;
            }
            break;
        }
        if (le->len != re->len) {
            kvli_err(err, KVL_ERR_INVALID_ARG, 0, "block %llu: local entry %zu has %llu-byte "
                     "blocks, remote entry %zu has %llu-byte blocks", (unsigned long long)blocks,
                     li, (unsigned long long)le->len, ri, (unsigned long long)re->len);
            kvli_hint(err, "paired blocks must have the same length");
            st = KVL_ERR_INVALID_ARG;
            goto fail;
        }
        uint64_t m = le->count - lj < re->count - rj ? le->count - lj : re->count - rj;
        kvl_seg_t s = {le->addr + lj * le->stride, re->addr + rj * re->stride, le->len, m,
                       le->stride, re->stride, le->reg, re->reg};
        if (m == 1)
            s.lstride = s.rstride = 0;
        else if (s.lstride == s.len && s.rstride == s.len) {
            s.len *= m; /* contiguous on both sides: one block */
            s.count = 1;
            s.lstride = s.rstride = 0;
        }
        if (!kvli_segv_push(&v, &s))
            goto oom;
        lused[le->reg] = true;
        rused[re->reg] = true;
        bytes += m * le->len;
        blocks += m;
        lj += m;
        rj += m;
        if (lj == le->count) {
            le = NULL;
            li++;
        }
        if (rj == re->count) {
            re = NULL;
            ri++;
        }
    }
    if (blocks == 0) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "the transfer moves nothing (empty lists)");
        st = KVL_ERR_INVALID_ARG;
        goto fail;
    }

    x = kvli_xfer_new(a, op);
    if (x == NULL)
        goto oom;

    pthread_mutex_lock(&a->lock);
    st = kvli_pick_backend(a, x, lp, rp, lused, rused, kvli_xfer_want(params), err);
    if (st != KVL_OK) {
        pthread_mutex_unlock(&a->lock);
        goto fail;
    }
    unsigned b = x->bk->index;
    /* Compact region arrays to those used; remap segment indices. */
    lmap = malloc((lp->nregs + 1) * sizeof(*lmap));
    rmap = malloc((rp->nregs + 1) * sizeof(*rmap));
    x->lregs = malloc((lp->nregs + (rp->self_files ? rp->nregs : 0) + 1) * sizeof(*x->lregs));
    x->lmh = malloc((lp->nregs + 1) * sizeof(*x->lmh));
    x->rmh = malloc((rp->nregs + 1) * sizeof(*x->rmh));
    if (!lmap || !rmap || !x->lregs || !x->lmh || !x->rmh) {
        pthread_mutex_unlock(&a->lock);
        goto oom;
    }
    for (size_t i = 0; i < lp->nregs; i++) {
        if (!lused[i])
            continue;
        kvli_region_t *r = lp->regs[i];
        lmap[i] = (uint32_t)x->nlregs;
        x->lregs[x->nlregs] = r;
        x->lmh[x->nlregs++] = r->mh[b];
        kvli_region_get(r);
    }
    for (size_t i = 0; i < rp->nregs; i++) {
        if (!rused[i])
            continue;
        rmap[i] = (uint32_t)x->nrregs;
        x->rmh[x->nrregs++] = kvli_rp_handle(rp, i, b);
    }
    kvli_hold_self_files(x, rp, rused);
    x->rem = rp->rem;
    kvli_remote_get(x->rem);
    pthread_mutex_unlock(&a->lock);
    for (size_t i = 0; i < v.n; i++) {
        v.segs[i].lreg = lmap[v.segs[i].lreg];
        v.segs[i].rreg = rmap[v.segs[i].rreg];
    }
    x->segs = v.segs;
    x->nsegs = v.n;
    x->segs_cap = v.cap;
    x->blocks = blocks;
    if (kvli_xfer_finish(a, x, op, notif, notif_len, params, bytes) != KVL_OK)
        goto oom;
    free(lused);
    free(rused);
    free(lmap);
    free(rmap);
    *xfer_p = x;
    return KVL_OK;

oom:
    kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory building a transfer of %zu entries", nl);
    st = KVL_ERR_NO_MEMORY;
fail:
    free(lused);
    free(rused);
    free(lmap);
    free(rmap);
    if (x != NULL) {
        x->segs = NULL;
        kvli_xfer_free(x);
    }
    kvli_buf_free(v.segs, v.cap * sizeof(*v.segs));
    return st;
}

void kvli_xfer_free(kvl_xfer_t *x)
{
    /* A completion may have published its state and still be unlocking:
     * taking the lock once waits for it to leave before the lock dies. */
    pthread_mutex_lock(&x->lock);
    pthread_mutex_unlock(&x->lock);
    if (x->bk != NULL && x->posted_once) {
        const kvl_backend_ops_t *ops = x->bk->ops;
        if (KVLI_OPS_HAS(ops, xfer_release))
            ops->xfer_release(x->bk->bk, &x->bx);
    }
    for (size_t i = 0; i < x->nlregs; i++)
        kvli_region_put(x->lregs[i]);
    if (x->rem)
        kvli_remote_put(x->agent, x->rem);
    pthread_mutex_destroy(&x->lock);
    pthread_cond_destroy(&x->cond);
    free(x->lregs);
    free(x->lmh);
    free(x->rmh);
    kvli_buf_free(x->segs, x->segs_cap * sizeof(*x->segs));
    if (x->idx_cookie != NULL)
        x->bk->ops->idx_free(x->bk->bk, x->lidx, x->idx_cookie);
    else
        kvli_buf_free(x->lidx, 2 * x->blocks * sizeof(*x->lidx));
    kvli_prep_unref(x->lprep);
    kvli_prep_unref(x->rprep);
    free(x->notif);
    free(x->err);
    free(x);
}

kvl_status_t kvl_xfer_create_prepped(kvl_agent_t *a, kvl_xfer_op_t op, const kvl_prep_t *local,
                                     const int64_t *lidx, const kvl_prep_t *remote,
                                     const int64_t *ridx, size_t n, const kvl_xfer_params_t *params,
                                     kvl_xfer_t **xfer_p)
{
    kvl_error_t err;
    if (xfer_p)
        *xfer_p = NULL;
    if (a == NULL || local == NULL || remote == NULL || xfer_p == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_create_prepped: NULL argument");
    if (local->agent != a || remote->agent != a)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_xfer_create_prepped: a prepared list belongs to another agent");
    if (kvli_xfer_build(a, op, local, lidx, n, remote, ridx, n, params, xfer_p, &err) != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

kvl_status_t kvl_xfer_create(kvl_agent_t *a, kvl_xfer_op_t op, const kvl_dlist_t *local,
                             const char *remote, const kvl_dlist_t *remote_list,
                             const kvl_xfer_params_t *params, kvl_xfer_t **xfer_p)
{
    kvl_error_t err;
    kvl_prep_t *lp = NULL, *rp = NULL;
    kvli_remote_t *rem;
    kvl_status_t st;
    if (xfer_p)
        *xfer_p = NULL;
    if (a == NULL || local == NULL || remote == NULL || remote_list == NULL || xfer_p == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_create: NULL argument");
    if ((rem = kvli_remote_acquire_for(a, remote, remote_list->kind, &err)) == NULL)
        return kvli_fail(a, &err);
    st = kvli_prep_build(a, NULL, local, &lp, &err);
    if (st == KVL_OK)
        st = kvli_prep_build(a, rem, remote_list, &rp, &err);
    if (st == KVL_OK)
        st = kvli_xfer_build(a, op, lp, NULL, local->n, rp, NULL, remote_list->n, params, xfer_p,
                             &err);
    kvli_remote_put(a, rem);
    kvli_prep_free(lp);
    kvli_prep_free(rp);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

/* Under x->lock: keep why x failed for kvli_xfer_result (err NULL or
 * blank: the backend gave no detail). Without memory for it, x->err stays
 * NULL and the result says so. */
static void kvli_xfer_keep_err(kvl_xfer_t *x, kvl_status_t status, const kvl_error_t *err)
{
    if (x->err == NULL && (x->err = malloc(sizeof(*x->err))) == NULL)
        return;
    kvl_error_t *e = x->err;
    if (err != NULL && err->code != KVL_OK) {
        memcpy(e, err, offsetof(kvl_error_t, causes) + err->n_causes * sizeof(err->causes[0]));
    } else {
        kvli_err(e, status, 0, "transfer failed in backend %s", x->bk->ops->name);
        kvli_scopy(e->backend, sizeof(e->backend), x->bk->ops->name);
    }
    if (!e->agent[0])
        kvli_scopy(e->agent, sizeof(e->agent), x->rem->name);
}

/* Backend completion: publish the result after releasing the regions, so a
 * waiter that sees it can deregister at once. */
void kvli_xfer_ctx_done(kvl_bk_xfer_t *bx, kvl_status_t status, const kvl_error_t *err);
void kvli_xfer_ctx_done(kvl_bk_xfer_t *bx, kvl_status_t status, const kvl_error_t *err)
{
    kvl_xfer_t *x = bx->core;
    for (size_t i = 0; i < x->nlregs; i++)
        atomic_fetch_sub(&x->lregs[i]->inflight, 1);
    pthread_mutex_lock(&x->lock);
    x->duration_ns = kvli_now_ns() - x->t_post;
    x->status = status;
    kvli_scopy(x->path, sizeof(x->path), bx->path);
    if (status != KVL_OK && status != KVL_ERR_CANCELED)
        kvli_xfer_keep_err(x, status, err);
    atomic_store(&x->state, status == KVL_OK ? KVL_XFER_DONE
                          : status == KVL_ERR_CANCELED ? KVL_XFER_CANCELED : KVL_XFER_ERROR);
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
}

static kvl_status_t kvli_xfer_result(kvl_xfer_t *x, int state)
{
    switch (state) {
    case KVL_XFER_DONE:
        return KVL_OK;
    case KVL_XFER_POSTED:
        return KVL_IN_PROGRESS;
    case KVL_XFER_CANCELED:
        return kvli_fail_simple(x->agent, KVL_ERR_CANCELED, NULL,
                                "transfer to agent '%s' was cancelled", x->rem->name);
    case KVL_XFER_ERROR: {
        kvl_error_t e;
        pthread_mutex_lock(&x->lock);
        kvl_status_t st = x->status;
        bool kept = x->err != NULL;
        if (kept)
            memcpy(&e, x->err, offsetof(kvl_error_t, causes) + x->err->n_causes * sizeof(e.causes[0]));
        pthread_mutex_unlock(&x->lock);
        if (kept)
            return kvli_fail(x->agent, &e);
        kvli_err(&e, st, 0, "transfer to agent '%s' failed in backend %s; its details were lost "
                 "(no memory to keep them)", x->rem->name, x->bk->ops->name);
        kvli_scopy(e.backend, sizeof(e.backend), x->bk->ops->name);
        kvli_scopy(e.agent, sizeof(e.agent), x->rem->name);
        kvli_hint(&e, "the process is out of memory: free memory, then post the transfer again");
        return kvli_fail(x->agent, &e);
    }
    default:
        return kvli_fail_simple(x->agent, KVL_ERR_STATE, "post it first (kvl_xfer_post)",
                                "transfer to agent '%s' was never posted", x->rem->name);
    }
}

kvl_status_t kvl_xfer_post(kvl_xfer_t *x)
{
    kvl_error_t err;
    if (x == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_post: xfer is NULL");
    kvl_agent_t *a = x->agent;
    uint64_t t0 = kvli_now_ns();
    /* posting is set with the state (one lock): a cancel that sees POSTED
     * also sees that the backend may not have the transfer yet */
    pthread_mutex_lock(&x->lock);
    int expect = atomic_load(&x->state);
    bool won = expect != KVL_XFER_POSTED &&
               atomic_compare_exchange_strong(&x->state, &expect, KVL_XFER_POSTED);
    if (won)
        x->posting = true;
    pthread_mutex_unlock(&x->lock);
    if (!won)
        return kvli_fail_simple(a, KVL_ERR_STATE, "wait for it to finish before posting again",
                                "transfer to agent '%s' is already in flight", x->rem->name);
    pthread_mutex_lock(&a->lock);
    const char *gone = NULL;
    size_t bad = 0;
    if (!atomic_load(&x->rem->valid))
        gone = "remote";
    for (size_t i = 0; !gone && i < x->nlregs; i++)
        if (!atomic_load(&x->lregs[i]->valid)) {
            gone = "local";
            bad = i;
        }
    if (gone == NULL)
        for (size_t i = 0; i < x->nlregs; i++)
            atomic_fetch_add(&x->lregs[i]->inflight, 1);
    pthread_mutex_unlock(&a->lock);
    if (gone != NULL) {
        pthread_mutex_lock(&x->lock);
        atomic_store(&x->state, expect);
        x->posting = false;
        pthread_cond_broadcast(&x->cond);
        pthread_mutex_unlock(&x->lock);
        if (gone[0] == 'r') {
            kvli_err(&err, KVL_ERR_STALE, 0, "remote agent '%s' (incarnation %016llx) was removed "
                     "or replaced since this transfer was created", x->rem->name,
                     (unsigned long long)x->rem->incarnation);
            kvli_scopy(err.agent, sizeof(err.agent), x->rem->name);
            kvli_hint(&err, "the peer restarted or its metadata was reloaded: prepare the "
                            "transfer again against the current metadata");
        } else {
            kvli_err(&err, KVL_ERR_STATE, 0, "local region 0x%llx+%llu was deregistered since "
                     "this transfer was created", (unsigned long long)x->lregs[bad]->addr,
                     (unsigned long long)x->lregs[bad]->len);
            kvli_hint(&err, "register the memory again and create a new transfer");
        }
        return kvli_fail(a, &err);
    }
    pthread_mutex_lock(&x->lock);
    x->t_post = t0;
    x->status = KVL_IN_PROGRESS;
    x->path[0] = '\0';
    pthread_mutex_unlock(&x->lock);
    kvl_bk_error_none(&err); /* filled whole only on failure */
    x->bx.path[0] = '\0';
    x->posted_once = true;
    kvl_status_t st = x->bk->ops->xfer_post(x->bk->bk, &x->bx, &err);
    pthread_mutex_lock(&x->lock);
    x->posting = false;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
    if (st != KVL_OK) {
        for (size_t i = 0; i < x->nlregs; i++)
            atomic_fetch_sub(&x->lregs[i]->inflight, 1);
        if (err.code == KVL_OK)
            kvli_err(&err, st, 0, "backend %s refused to post the transfer", x->bk->ops->name);
        if (!err.backend[0])
            kvli_scopy(err.backend, sizeof(err.backend), x->bk->ops->name);
        if (!err.agent[0])
            kvli_scopy(err.agent, sizeof(err.agent), x->rem->name);
        pthread_mutex_lock(&x->lock);
        kvli_xfer_keep_err(x, st, &err);
        x->status = st;
        atomic_store(&x->state, KVL_XFER_ERROR);
        pthread_mutex_unlock(&x->lock);
        return kvli_fail(a, &err);
    }
    x->post_ns = kvli_now_ns() - t0;
    return kvli_xfer_result(x, atomic_load(&x->state));
}

/* In flight on a backend that progresses in the caller's thread: do so. */
static int kvli_xfer_poll(kvl_xfer_t *x)
{
    int state = atomic_load(&x->state);
    if (state == KVL_XFER_POSTED && KVLI_OPS_HAS(x->bk->ops, progress)) {
        x->bk->ops->progress(x->bk->bk);
        state = atomic_load(&x->state);
    }
    return state;
}

kvl_status_t kvl_xfer_test(kvl_xfer_t *x)
{
    if (x == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_test: xfer is NULL");
    return kvli_xfer_result(x, kvli_xfer_poll(x));
}

kvl_status_t kvl_xfer_wait(kvl_xfer_t *x, int64_t timeout_ms)
{
    if (x == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_wait: xfer is NULL");
    if (kvli_xfer_poll(x) != KVL_XFER_POSTED)
        return kvli_xfer_result(x, atomic_load(&x->state));
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms > 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (timeout_ms % 1000) * 1000000;
        if (dl.tv_nsec >= 1000000000) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000;
        }
    }
    pthread_mutex_lock(&x->lock);
    while (atomic_load(&x->state) == KVL_XFER_POSTED && timeout_ms != 0) {
        int rc = timeout_ms < 0 ? pthread_cond_wait(&x->cond, &x->lock)
                                : pthread_cond_timedwait(&x->cond, &x->lock, &dl);
        if (rc == ETIMEDOUT)
            break;
    }
    int state = atomic_load(&x->state);
    pthread_mutex_unlock(&x->lock);
    if (state == KVL_XFER_POSTED)
        return kvli_fail_simple(x->agent, KVL_ERR_TIMEOUT,
                                "the transfer is still moving: wait again, or cancel it",
                                "transfer to agent '%s' not complete after %lld ms", x->rem->name,
                                (long long)timeout_ms);
    return kvli_xfer_result(x, state);
}

void kvli_xfer_quiesce(kvl_xfer_t *x)
{
    /* The state says POSTED before the backend has the transfer: its cancel
     * would find nothing to stop (the work it queues next would run on, and
     * a release would free what it uses). Wait for its post to return. */
    pthread_mutex_lock(&x->lock);
    while (x->posting)
        pthread_cond_wait(&x->cond, &x->lock);
    pthread_mutex_unlock(&x->lock);
    if (atomic_load(&x->state) != KVL_XFER_POSTED)
        return;
    if (atomic_load(&x->agent->destroying) && x->bk->ops->xfer_abort != NULL)
        x->bk->ops->xfer_abort(x->bk->bk, &x->bx);
    else
        x->bk->ops->xfer_cancel(x->bk->bk, &x->bx);
}

kvl_status_t kvl_xfer_cancel(kvl_xfer_t *x, kvl_xfer_state_t *state_p)
{
    if (x == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_cancel: xfer is NULL");
    kvl_agent_t *a = x->agent;
    pthread_mutex_lock(&a->xfer_lock);
    int state = atomic_load(&x->state);
    if (state == KVL_XFER_IDLE) {
        pthread_mutex_unlock(&a->xfer_lock);
        if (state_p)
            *state_p = KVL_XFER_IDLE;
        return kvli_fail_simple(a, KVL_ERR_STATE, NULL,
                                "cancel: transfer to agent '%s' was never posted", x->rem->name);
    }
    kvli_xfer_quiesce(x);
    pthread_mutex_unlock(&a->xfer_lock);
    state = atomic_load(&x->state);
    if (state_p)
        *state_p = (kvl_xfer_state_t)state;
    if (state == KVL_XFER_ERROR)
        return kvli_xfer_result(x, state);
    return KVL_OK;
}

void kvl_xfer_release(kvl_xfer_t *x)
{
    if (x == NULL)
        return;
    kvl_agent_t *a = x->agent;
    pthread_mutex_lock(&a->xfer_lock);
    kvli_xfer_quiesce(x);
    pthread_mutex_lock(&a->lock);
    if (x->prev)
        x->prev->next = x->next;
    else if (a->xfers == x)
        a->xfers = x->next;
    if (x->next)
        x->next->prev = x->prev;
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_unlock(&a->xfer_lock);
    kvli_xfer_free(x);
}

kvl_xfer_state_t kvl_xfer_state(const kvl_xfer_t *x)
{
    return x ? (kvl_xfer_state_t)atomic_load(&x->state) : KVL_XFER_ERROR;
}

kvl_status_t kvl_xfer_get_stats(const kvl_xfer_t *x, kvl_xfer_stats_t *s)
{
    if (x == NULL || s == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_xfer_get_stats: NULL argument");
    memset(s, 0, sizeof(*s));
    s->bytes = x->bx.total_bytes;
    s->blocks = x->blocks;
    s->segments = x->nsegs;
    s->post_ns = x->post_ns;
    s->duration_ns = atomic_load(&x->state) == KVL_XFER_POSTED ? 0 : x->duration_ns;
    kvli_scopy(s->backend, sizeof(s->backend), x->bk->ops->name);
    pthread_mutex_lock((pthread_mutex_t *)&x->lock);
    kvli_scopy(s->path, sizeof(s->path), x->path);
    pthread_mutex_unlock((pthread_mutex_t *)&x->lock);
    return KVL_OK;
}
