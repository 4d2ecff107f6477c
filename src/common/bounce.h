/*
 * Bounce buffers (shared layer): the pool a backend that moves host memory
 * only (tcp, ucx without GPU support, ucx's data_path=am) stages transfers
 * through. Buffers are `size` bytes, pinned by the staging copies the core
 * lends (ctx->stage_host_alloc, so VRAM copies run at full speed), or -- in
 * a pool made with heap_ok -- page-aligned heap memory when those are not
 * there. At most `cap` buffers exist; takers flagged KVLI_BOUNCE_QUOTA (an
 * initiator) hold at most `quota` of them at once, so the other side (a
 * target serving peers) always finds one.
 *
 * Allocation happens outside the pool's lock: takers on several threads do
 * not wait for each other's cuMemHostAlloc. The progress thread fills the
 * pool ahead of the first staged transfer when asked (kvli_bounce_expect),
 * so that transfer does not pay for the allocations.
 */
#ifndef KVLI_BOUNCE_H
#define KVLI_BOUNCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <kvlane/backend.h>
#include "progress.h"

#define KVLI_BOUNCE_MAX 16u

/* kvli_bounce_get flags */
#define KVLI_BOUNCE_QUOTA 1u   /* counts against the quota */
#define KVLI_BOUNCE_ONEOFF 2u  /* larger than size, or none free: a one-off pinned buffer */

typedef struct kvli_bounce_pool {
    kvl_bk_ctx_t *ctx;
    const char *bk;                  /* backend name, in messages */
    size_t size;
    unsigned cap, quota;
    int heap_ok;
    pthread_mutex_t lock;
    void *buf[KVLI_BOUNCE_MAX];      /* NULL: a hole (or being allocated, when busy) */
    unsigned char pinned[KVLI_BOUNCE_MAX];
    unsigned char busy[KVLI_BOUNCE_MAX];
    unsigned char quota_held[KVLI_BOUNCE_MAX];
    unsigned nquota;
    /* set aside (kvli_bounce_retire): freed by kvli_bounce_fini only */
    void *retired[KVLI_BOUNCE_MAX];
    unsigned char retired_pinned[KVLI_BOUNCE_MAX];
    unsigned nretired;
    atomic_int want;
} kvli_bounce_pool_t;

/* Whether the core lends staging copies (ctx->stage_*), all five slots. */
int kvli_stage_usable(const kvl_bk_ctx_t *ctx);

/* cap and quota at most KVLI_BOUNCE_MAX; quota <= cap. */
void kvli_bounce_init(kvli_bounce_pool_t *pool, kvl_bk_ctx_t *ctx, const char *bk, size_t size,
                      unsigned cap, unsigned quota, int heap_ok);
/* Free every buffer, retired ones too; after nothing uses them any more. */
void kvli_bounce_fini(kvli_bounce_pool_t *pool);

/*
 * A buffer of at least len bytes. NULL with err->code KVL_OK: none free now
 * (or the quota is used up): wait for one to come back. NULL with an error:
 * allocating one failed (err says why and what to do).
 */
void *kvli_bounce_get(kvli_bounce_pool_t *pool, size_t len, unsigned flags, kvl_error_t *err);
/* Give a buffer back (a one-off one is freed). NULL is ignored. */
void kvli_bounce_put(kvli_bounce_pool_t *pool, void *b);
/* A buffer someone else (a transport) may still write: out of the pool,
 * never reused, freed at fini. */
void kvli_bounce_retire(kvli_bounce_pool_t *pool, void *b);

/* Ask the progress thread pg to fill the pool: any thread. */
void kvli_bounce_expect(kvli_bounce_pool_t *pool, const kvli_progress_t *pg);
/* Progress thread: fill the pool if asked since the last call. A failed
 * allocation is only logged (DEBUG): the transfer that needs it retries. */
void kvli_bounce_fill_if_wanted(kvli_bounce_pool_t *pool);

#endif
