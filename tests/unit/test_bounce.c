/* The bounce-buffer pool (src/common/bounce.c) tcp and ucx stage through:
 * cap and quota hold, buffers are reused, one-off buffers are freed on put,
 * retired ones only at fini, heap memory only where allowed, failures say
 * why; two threads never get the same buffer at once.
 * The core's pinned allocator is replaced by a counting one (malloc) that
 * can be told to fail: these tests are about the pool, not about pinning.
 * KVL_TEST_LABELS: tsan */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include "common/kvltest.h"
#include "common/bounce.h"

static atomic_int n_alloc, n_free, fail_alloc;

static kvl_status_t fake_alloc(kvl_bk_ctx_t *ctx, size_t len, void **ptr_p, kvl_error_t *err)
{
    (void)ctx;
    if (atomic_load(&fail_alloc)) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, 0, "fake", 0, "cuMemHostAlloc(%zu bytes) "
                         "for a staging buffer = CUDA_ERROR_OUT_OF_MEMORY", len);
        kvl_bk_error_hint(err, "pinned host memory is short");
        return KVL_ERR_NO_MEMORY;
    }
    *ptr_p = malloc(len);
    atomic_fetch_add(&n_alloc, 1);
    return *ptr_p ? KVL_OK : KVL_ERR_NO_MEMORY;
}
static void fake_free(kvl_bk_ctx_t *ctx, void *p)
{
    (void)ctx;
    atomic_fetch_add(&n_free, 1);
    free(p);
}
static kvl_status_t fake_check(kvl_bk_ctx_t *c, kvl_mem_kind_t k, int32_t d, kvl_error_t *e)
{
    (void)c, (void)k, (void)d, (void)e;
    return KVL_OK;
}
static kvl_status_t fake_copy(kvl_bk_ctx_t *c, int to_host, const kvl_stage_piece_t *p, size_t n,
                              void (*notify)(void *), void *arg, void **t, kvl_error_t *e)
{
    (void)c, (void)to_host, (void)p, (void)n, (void)notify, (void)arg, (void)t, (void)e;
    return KVL_ERR_UNSUPPORTED;
}
static int fake_test(kvl_bk_ctx_t *c, void *t, int wait, kvl_error_t *e)
{
    (void)c, (void)t, (void)wait, (void)e;
    return 1;
}
static void log_fn(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
{
    (void)ctx, (void)level, (void)fmt;
}

static kvl_bk_ctx_t pinned_ctx, plain_ctx;

static void *get(kvli_bounce_pool_t *p, size_t len, unsigned flags, kvl_status_t want)
{
    kvl_error_t e;
    void *b = kvli_bounce_get(p, len, flags, &e);
    KT_CHECK(e.code == want);
    if (want != KVL_OK) {
        KT_CHECK(b == NULL && e.what[0] != '\0');
        printf("  refused: %s (fix: %s)\n", e.what, e.hint);
    }
    return b;
}

typedef struct { kvli_bounce_pool_t *pool; atomic_int *owner; int id; } thr_t;

static void *hammer(void *arg)
{
    thr_t *t = arg;
    for (int i = 0; i < 20000; i++) {
        kvl_error_t e;
        unsigned char *b = kvli_bounce_get(t->pool, 64, 0, &e);
        KT_CHECK(e.code == KVL_OK);
        if (b == NULL)
            continue; /* all busy: wait and try again */
        /* the first byte records who holds it: nobody else may */
        KT_CHECK(b[0] == 0);
        b[0] = (unsigned char)t->id;
        KT_CHECK(b[0] == t->id);
        b[0] = 0;
        kvli_bounce_put(t->pool, b);
    }
    return NULL;
}

int main(void)
{
    kvli_bounce_pool_t pool;
    void *b[8], *big;
    memset(&pinned_ctx, 0, sizeof(pinned_ctx));
    pinned_ctx.size = sizeof(pinned_ctx);
    pinned_ctx.log = log_fn;
    pinned_ctx.stage_check = fake_check;
    pinned_ctx.stage_host_alloc = fake_alloc;
    pinned_ctx.stage_host_free = fake_free;
    pinned_ctx.stage_copy = fake_copy;
    pinned_ctx.stage_test = fake_test;
    plain_ctx = pinned_ctx;
    plain_ctx.stage_copy = NULL; /* a core without staging copies */
    KT_CHECK(kvli_stage_usable(&pinned_ctx) && !kvli_stage_usable(&plain_ctx));

    /* cap 4, quota 2, pinned only */
    kvli_bounce_init(&pool, &pinned_ctx, "tcp", 4096, 4, 2, 0);
    b[0] = get(&pool, 4096, KVLI_BOUNCE_QUOTA, KVL_OK);
    b[1] = get(&pool, 100, KVLI_BOUNCE_QUOTA, KVL_OK);
    KT_CHECK(b[0] != b[1]);
    KT_CHECK(get(&pool, 10, KVLI_BOUNCE_QUOTA, KVL_OK) == NULL); /* quota used: wait */
    b[2] = get(&pool, 10, 0, KVL_OK);                            /* others still get one */
    b[3] = get(&pool, 10, 0, KVL_OK);
    KT_CHECK(get(&pool, 10, 0, KVL_OK) == NULL);                 /* cap reached: wait */
    KT_CHECK(atomic_load(&n_alloc) == 4);
    /* one-off: larger than a pooled buffer, or none free */
    big = get(&pool, 10000, KVLI_BOUNCE_ONEOFF, KVL_OK);
    KT_CHECK(big != NULL && atomic_load(&n_alloc) == 5);
    kvli_bounce_put(&pool, big);
    KT_CHECK(atomic_load(&n_free) == 1);
    big = get(&pool, 10, KVLI_BOUNCE_ONEOFF, KVL_OK); /* pool busy */
    kvli_bounce_put(&pool, big);
    KT_CHECK(atomic_load(&n_free) == 2);
    get(&pool, 10000, 0, KVL_ERR_INTERNAL); /* too large without ONEOFF: a bug, said so */
    /* reuse: a returned buffer comes back, no new allocation */
    kvli_bounce_put(&pool, b[0]);
    KT_CHECK(get(&pool, 1, KVLI_BOUNCE_QUOTA, KVL_OK) == b[0]);
    kvli_bounce_put(&pool, b[1]); /* quota counts per buffer */
    KT_CHECK(get(&pool, 1, KVLI_BOUNCE_QUOTA, KVL_OK) == b[1]);
    KT_CHECK(atomic_load(&n_alloc) == 6);
    /* retire: out of the pool, its slot refilled with a new buffer, freed at fini */
    kvli_bounce_retire(&pool, b[2]);
    b[4] = get(&pool, 1, 0, KVL_OK);
    KT_CHECK(b[4] != NULL && atomic_load(&n_alloc) == 7);
    /* allocation failure: the allocator's reason, and the slot stays usable */
    kvli_bounce_put(&pool, b[0]);
    kvli_bounce_put(&pool, b[1]);
    kvli_bounce_put(&pool, b[3]);
    kvli_bounce_put(&pool, b[4]);
    atomic_store(&fail_alloc, 1);
    get(&pool, 20000, KVLI_BOUNCE_ONEOFF, KVL_ERR_NO_MEMORY);
    atomic_store(&fail_alloc, 0);
    kvli_bounce_fini(&pool);
    KT_CHECK(atomic_load(&n_free) == atomic_load(&n_alloc)); /* retired one too */
    kvli_bounce_put(&pool, b[0]); /* after fini: ignored, not freed twice */
    KT_CHECK(atomic_load(&n_free) == atomic_load(&n_alloc));

    /* A failed allocation into a hole, and the error text. */
    kvl_error_t e;
    kvli_bounce_init(&pool, &pinned_ctx, "tcp", 4096, 2, 2, 0);
    atomic_store(&fail_alloc, 1);
    KT_CHECK(kvli_bounce_get(&pool, 1, 0, &e) == NULL && e.code == KVL_ERR_NO_MEMORY);
    KT_CHECK(strcmp(e.what, "no pinned staging buffer of 4096 bytes for VRAM (the cause below)")
             == 0);
    KT_CHECK(e.sys_errno == 0 && e.device == 0); /* errno once: in the cause */
    KT_CHECK(strcmp(e.backend, "tcp") == 0);
    /* the allocator's error rides along whole, as a cause (issue 17 item 9) */
    KT_CHECK(e.n_causes == 1 && strcmp(e.causes[0].backend, "fake") == 0 &&
             strstr(e.causes[0].what, "CUDA_ERROR_OUT_OF_MEMORY") != NULL &&
             strcmp(e.causes[0].hint, "pinned host memory is short") == 0);
    atomic_store(&fail_alloc, 0);
    b[0] = get(&pool, 1, 0, KVL_OK); /* the hole was given back */
    b[1] = get(&pool, 1, 0, KVL_OK);
    KT_CHECK(b[0] && b[1] && b[0] != b[1]);
    kvli_bounce_put(&pool, b[0]);
    kvli_bounce_put(&pool, b[1]);
    kvli_bounce_fini(&pool);

    /* Without staging copies: heap memory where allowed, else a clear refusal. */
    int before = atomic_load(&n_alloc);
    kvli_bounce_init(&pool, &plain_ctx, "ucx", 8192, 2, 1, 1);
    b[0] = get(&pool, 8192, 0, KVL_OK);
    KT_CHECK(b[0] != NULL && ((uintptr_t)b[0] & 4095) == 0 && atomic_load(&n_alloc) == before);
    kvli_bounce_put(&pool, b[0]);
    kvli_bounce_fini(&pool); /* freed with free(), not the pinned allocator */
    KT_CHECK(atomic_load(&n_free) == atomic_load(&n_alloc));
    kvli_bounce_init(&pool, &plain_ctx, "tcp", 8192, 2, 2, 0);
    KT_CHECK(kvli_bounce_get(&pool, 1, 0, &e) == NULL && e.code == KVL_ERR_NO_MEMORY);
    KT_CHECK(e.n_causes == 1 && strstr(e.causes[0].what, "lends no staging copies") != NULL &&
             e.causes[0].code == KVL_ERR_UNSUPPORTED && e.causes[0].device == -1);
    kvli_bounce_fini(&pool);

    /* fill_if_wanted: only when asked, up to cap, all free afterwards. */
    kvli_progress_t pg;
    kvli_progress_init(&pg, &pinned_ctx, "tcp"); /* no thread: the wake is a no-op */
    kvli_bounce_init(&pool, &pinned_ctx, "tcp", 64, 3, 3, 0);
    before = atomic_load(&n_alloc);
    kvli_bounce_fill_if_wanted(&pool);
    KT_CHECK(atomic_load(&n_alloc) == before);
    kvli_bounce_expect(&pool, &pg);
    kvli_bounce_fill_if_wanted(&pool);
    KT_CHECK(atomic_load(&n_alloc) == before + 3);
    for (int i = 0; i < 3; i++)
        KT_CHECK((b[i] = get(&pool, 1, 0, KVL_OK)) != NULL);
    KT_CHECK(atomic_load(&n_alloc) == before + 3); /* nothing allocated on the way */
    for (int i = 0; i < 3; i++) {
        memset(b[i], 0, 64);
        kvli_bounce_put(&pool, b[i]);
    }

    /* Two threads: a buffer is never held twice. */
    thr_t t[2] = {{&pool, NULL, 1}, {&pool, NULL, 2}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        KT_CHECK(pthread_create(&th[i], NULL, hammer, &t[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    kvli_bounce_fini(&pool);
    KT_CHECK(atomic_load(&n_free) == atomic_load(&n_alloc));
    printf("ok\n");
    return 0;
}
