/* What every backend's open() starts with (shared layer): see iface.h. */
#include "iface.h"

#include <errno.h>
#include <stdlib.h>

void *kvli_iface_new(const kvl_bk_ctx_t *ctx, void **bk_p, const char *bk, size_t size,
                     kvl_status_t *st_p, kvl_error_t *err)
{
    void *iface;
    *st_p = KVL_ERR_INTERNAL;
    if (ctx == NULL || bk_p == NULL || ctx->size < sizeof(kvl_bk_ctx_t)) {
        kvl_bk_error_set(err, KVL_ERR_INTERNAL, 0, bk, -1,
                         "open(): backend context of %u bytes, this backend needs %zu",
                         ctx ? ctx->size : 0u, sizeof(kvl_bk_ctx_t));
        kvl_bk_error_hint(err, "the core and the %s backend were built from different "
                          "headers; rebuild both (a module: rebuild libkvlane-%s.so)", bk, bk);
        return NULL;
    }
    iface = calloc(1, size);
    *st_p = iface != NULL ? KVL_OK : KVL_ERR_NO_MEMORY;
    if (iface == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, bk, -1, "calloc(%zu) failed", size);
        kvl_bk_error_hint(err, "the process is out of memory");
    }
    return iface;
}

void kvli_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
}

void kvli_lock_init(pthread_mutex_t *m, pthread_cond_t *c)
{
    pthread_mutex_init(m, NULL);
    kvli_cond_init(c);
}
