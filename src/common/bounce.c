/*
 * Bounce buffers (shared layer): see bounce.h.
 */
#include "bounce.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvli_stage_usable(const kvl_bk_ctx_t *ctx)
{
    return ctx->size >= offsetof(kvl_bk_ctx_t, stage_test) + sizeof(ctx->stage_test) &&
           ctx->stage_check != NULL && ctx->stage_host_alloc != NULL &&
           ctx->stage_host_free != NULL && ctx->stage_copy != NULL && ctx->stage_test != NULL;
}

void kvli_bounce_init(kvli_bounce_pool_t *pool, kvl_bk_ctx_t *ctx, const char *bk, size_t size,
                      unsigned cap, unsigned quota, int heap_ok)
{
    memset(pool, 0, sizeof(*pool));
    pool->ctx = ctx;
    pool->bk = bk;
    pool->size = size;
    pool->cap = cap < KVLI_BOUNCE_MAX ? cap : KVLI_BOUNCE_MAX;
    pool->quota = quota < pool->cap ? quota : pool->cap;
    pool->heap_ok = heap_ok;
    pthread_mutex_init(&pool->lock, NULL);
    atomic_init(&pool->want, 0);
}

static void kvli_bounce_free(kvli_bounce_pool_t *pool, void *b, int pinned)
{
    if (pinned)
        pool->ctx->stage_host_free(pool->ctx, b);
    else
        free(b);
}

void kvli_bounce_fini(kvli_bounce_pool_t *pool)
{
    if (pool->ctx == NULL)
        return; /* never initialized */
    for (unsigned i = 0; i < pool->nretired; i++)
        kvli_bounce_free(pool, pool->retired[i], pool->retired_pinned[i]);
    for (unsigned i = 0; i < pool->cap; i++)
        if (pool->buf[i] != NULL)
            kvli_bounce_free(pool, pool->buf[i], pool->pinned[i]);
    pthread_mutex_destroy(&pool->lock);
    memset(pool, 0, sizeof(*pool));
}

/* A new buffer of len bytes: pinned, else (heap_ok) from the heap. */
static void *kvli_bounce_alloc(kvli_bounce_pool_t *pool, size_t len, int heap_ok, int *pinned_p,
                               kvl_error_t *err)
{
    kvl_bk_ctx_t *ctx = pool->ctx;
    kvl_error_t e;
    void *b = NULL;

    memset(&e, 0, offsetof(kvl_error_t, causes));
    e.device = -1;
    if (kvli_stage_usable(ctx)) {
        if (ctx->stage_host_alloc(ctx, len, &b, &e) == KVL_OK) {
            *pinned_p = 1;
            return b;
        }
    } else {
        e.code = KVL_ERR_UNSUPPORTED;
        snprintf(e.backend, sizeof(e.backend), "%s", pool->bk);
        snprintf(e.what, sizeof(e.what), "this kvlane core lends no staging copies (it was "
                 "built without the cuda backend)");
        snprintf(e.hint, sizeof(e.hint), "build kvlane with the cuda backend");
    }
    if (heap_ok) {
        if (posix_memalign(&b, 4096, len) == 0) {
            *pinned_p = 0;
            return b;
        }
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, pool->bk, -1,
                         "no bounce buffer of %zu bytes for a staged transfer: "
                         "posix_memalign failed", len);
        kvl_bk_error_hint(err, "free host memory, or lower the number of transfers in flight");
        return NULL;
    }
    kvl_bk_error_set(err, e.code && kvli_stage_usable(ctx) ? e.code : KVL_ERR_NO_MEMORY, 0,
                     pool->bk, e.device,
                     "no pinned staging buffer of %zu bytes for VRAM (the cause below)", len);
    kvl_bk_error_hint(err, "fix the cause below, or lower the number of transfers in flight");
    kvl_bk_error_cause(err, &e); /* the allocator's own error, whole */
    return NULL;
}

void *kvli_bounce_get(kvli_bounce_pool_t *pool, size_t len, unsigned flags, kvl_error_t *err)
{
    unsigned i, hole = KVLI_BOUNCE_MAX;
    int quota = (flags & KVLI_BOUNCE_QUOTA) != 0, pinned = 0;
    void *b;

    memset(err, 0, offsetof(kvl_error_t, causes));
    if (len <= pool->size) {
        pthread_mutex_lock(&pool->lock);
        if (quota && pool->nquota >= pool->quota) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        for (i = 0; i < pool->cap; i++) {
            if (pool->busy[i])
                continue;
            if (pool->buf[i] != NULL)
                break;
            if (hole == KVLI_BOUNCE_MAX)
                hole = i;
        }
        if (i == pool->cap && hole != KVLI_BOUNCE_MAX)
            i = hole;
        if (i < pool->cap) {
            pool->busy[i] = 1;
            pool->quota_held[i] = (unsigned char)quota;
            pool->nquota += (unsigned)quota;
            b = pool->buf[i];
            if (b != NULL) {
                pthread_mutex_unlock(&pool->lock);
                return b;
            }
            /* a hole: reserved (busy, no buffer) while allocated unlocked */
            pthread_mutex_unlock(&pool->lock);
            b = kvli_bounce_alloc(pool, pool->size, pool->heap_ok, &pinned, err);
            pthread_mutex_lock(&pool->lock);
            if (b != NULL) {
                pool->buf[i] = b;
                pool->pinned[i] = (unsigned char)pinned;
            } else {
                pool->busy[i] = 0;
                pool->nquota -= pool->quota_held[i];
                pool->quota_held[i] = 0;
            }
            pthread_mutex_unlock(&pool->lock);
            return b;
        }
        pthread_mutex_unlock(&pool->lock);
        if (!(flags & KVLI_BOUNCE_ONEOFF))
            return NULL; /* all in use: the caller waits for one to come back */
    } else if (!(flags & KVLI_BOUNCE_ONEOFF)) {
        kvl_bk_error_set(err, KVL_ERR_INTERNAL, 0, pool->bk, -1,
                         "a bounce buffer of %zu bytes was asked of a pool of %zu-byte buffers",
                         len, pool->size);
        kvl_bk_error_hint(err, "a kvlane bug: report it with the log");
        return NULL;
    }
    /* One-off (larger than a pooled buffer, or none free): pinned only, so
     * that put() knows how to free it. */
    return kvli_bounce_alloc(pool, len, 0, &pinned, err);
}

static unsigned kvli_bounce_slot(const kvli_bounce_pool_t *pool, const void *b)
{
    for (unsigned i = 0; i < pool->cap; i++)
        if (pool->buf[i] == b)
            return i;
    return KVLI_BOUNCE_MAX;
}

void kvli_bounce_put(kvli_bounce_pool_t *pool, void *b)
{
    unsigned i;
    if (b == NULL || pool->ctx == NULL) /* after fini nothing is the pool's */
        return;
    pthread_mutex_lock(&pool->lock);
    i = kvli_bounce_slot(pool, b);
    if (i != KVLI_BOUNCE_MAX) {
        pool->busy[i] = 0;
        pool->nquota -= pool->quota_held[i];
        pool->quota_held[i] = 0;
        pthread_mutex_unlock(&pool->lock);
        return;
    }
    pthread_mutex_unlock(&pool->lock);
    pool->ctx->stage_host_free(pool->ctx, b); /* a one-off buffer */
}

void kvli_bounce_retire(kvli_bounce_pool_t *pool, void *b)
{
    unsigned i;
    if (b == NULL || pool->ctx == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    i = kvli_bounce_slot(pool, b);
    if (i != KVLI_BOUNCE_MAX) {
        if (pool->nretired < KVLI_BOUNCE_MAX) {
            pool->retired[pool->nretired] = b;
            pool->retired_pinned[pool->nretired++] = pool->pinned[i];
        } /* beyond the record: leaked rather than freed under a transport */
        pool->buf[i] = NULL; /* the slot becomes a hole, refilled on demand */
        pool->busy[i] = 0;
        pool->nquota -= pool->quota_held[i];
        pool->quota_held[i] = 0;
    }
    pthread_mutex_unlock(&pool->lock);
}

void kvli_bounce_expect(kvli_bounce_pool_t *pool, const kvli_progress_t *pg)
{
    if (atomic_exchange(&pool->want, 1) == 0)
        kvli_progress_wake(pg);
}

void kvli_bounce_fill_if_wanted(kvli_bounce_pool_t *pool)
{
    void *taken[KVLI_BOUNCE_MAX];
    unsigned n = 0;
    kvl_error_t e;
    if (!atomic_exchange(&pool->want, 0))
        return;
    while (n < pool->cap) {
        void *b = kvli_bounce_get(pool, pool->size, 0, &e);
        if (b == NULL) {
            if (e.code != KVL_OK)
                pool->ctx->log(pool->ctx, KVL_LOG_DEBUG, "%s: filling the staging pool: %s",
                               pool->bk, e.what);
            break;
        }
        taken[n++] = b;
    }
    for (unsigned k = 0; k < n; k++)
        kvli_bounce_put(pool, taken[k]);
}
