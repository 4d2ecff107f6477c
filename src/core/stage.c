/*
 * Staging: the core lends a host-only backend (tcp, ucx without GPU support)
 * the copies between VRAM and pinned host buffers of the built-in device
 * backend that offers them (cuda). The device backend need not be created
 * on the agent: its device services take no handle (kvl_device_ops_t).
 */
#include <stddef.h>
#include "internal.h"

static const kvl_device_ops_t *kvli_stager_ops;
static pthread_once_t kvli_stager_once = PTHREAD_ONCE_INIT;

static void kvli_stager_find(void)
{
    const kvl_backend_ops_t *ops;
    /* the table filled all five staging slots or none (backend_table.c) */
    for (size_t i = 0; (ops = kvli_backend_builtin(i)) != NULL; i++)
        if (ops->device != NULL && ops->device->stage_copy != NULL) {
            kvli_stager_ops = ops->device;
            return;
        }
}

/* The built-in backend's device services that offer staging (found once:
 * built-ins are fixed). */
static const kvl_device_ops_t *kvli_stager(void)
{
    pthread_once(&kvli_stager_once, kvli_stager_find);
    return kvli_stager_ops;
}

static kvl_status_t kvli_stage_none(kvl_bk_ctx_t *ctx, kvl_error_t *err)
{
    struct kvl_backend *bk = ctx->core;
    kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, bk->ops->name, -1,
                     "%s cannot stage device memory: this kvlane build has no built-in device "
                     "backend with staging copies", bk->ops->name);
    kvl_bk_error_hint(err, "build kvlane with the cuda backend (KVL_BUILTIN_BACKENDS), or "
                      "register VRAM on a backend that reaches it directly");
    return KVL_ERR_UNSUPPORTED;
}

kvl_status_t kvli_ctx_stage_check(kvl_bk_ctx_t *ctx, kvl_mem_kind_t kind, int32_t dev,
                                  kvl_error_t *err);
kvl_status_t kvli_ctx_stage_check(kvl_bk_ctx_t *ctx, kvl_mem_kind_t kind, int32_t dev,
                                  kvl_error_t *err)
{
    const kvl_device_ops_t *ops = kvli_stager();
    return ops ? ops->stage_check(kind, dev, err) : kvli_stage_none(ctx, err);
}

kvl_status_t kvli_ctx_stage_host_alloc(kvl_bk_ctx_t *ctx, size_t len, void **ptr_p,
                                       kvl_error_t *err);
kvl_status_t kvli_ctx_stage_host_alloc(kvl_bk_ctx_t *ctx, size_t len, void **ptr_p,
                                       kvl_error_t *err)
{
    const kvl_device_ops_t *ops = kvli_stager();
    return ops ? ops->stage_host_alloc(len, ptr_p, err) : kvli_stage_none(ctx, err);
}

void kvli_ctx_stage_host_free(kvl_bk_ctx_t *ctx, void *ptr);
void kvli_ctx_stage_host_free(kvl_bk_ctx_t *ctx, void *ptr)
{
    const kvl_device_ops_t *ops = kvli_stager();
    (void)ctx;
    if (ops != NULL && ptr != NULL)
        ops->stage_host_free(ptr);
}

kvl_status_t kvli_ctx_stage_copy(kvl_bk_ctx_t *ctx, int to_host, const kvl_stage_piece_t *p,
                                 size_t n, void (*notify)(void *arg), void *arg, void **ticket_p,
                                 kvl_error_t *err);
kvl_status_t kvli_ctx_stage_copy(kvl_bk_ctx_t *ctx, int to_host, const kvl_stage_piece_t *p,
                                 size_t n, void (*notify)(void *arg), void *arg, void **ticket_p,
                                 kvl_error_t *err)
{
    const kvl_device_ops_t *ops = kvli_stager();
    return ops ? ops->stage_copy(to_host, p, n, notify, arg, ticket_p, err)
               : kvli_stage_none(ctx, err);
}

int kvli_ctx_stage_test(kvl_bk_ctx_t *ctx, void *ticket, int wait, kvl_error_t *err);
int kvli_ctx_stage_test(kvl_bk_ctx_t *ctx, void *ticket, int wait, kvl_error_t *err)
{
    const kvl_device_ops_t *ops = kvli_stager();
    if (ops == NULL) {
        kvli_stage_none(ctx, err);
        return -1;
    }
    return ops->stage_test(ticket, wait, err);
}

kvl_status_t kvli_ctx_stage_enter(kvl_bk_ctx_t *ctx, int32_t dev, kvl_error_t *err);
kvl_status_t kvli_ctx_stage_enter(kvl_bk_ctx_t *ctx, int32_t dev, kvl_error_t *err)
{
    const kvl_device_ops_t *ops = kvli_stager();
    if (ops == NULL || ops->ctx_enter == NULL)
        return kvli_stage_none(ctx, err);
    return ops->ctx_enter(dev, err);
}

void kvli_ctx_stage_leave(kvl_bk_ctx_t *ctx);
void kvli_ctx_stage_leave(kvl_bk_ctx_t *ctx)
{
    const kvl_device_ops_t *ops = kvli_stager();
    (void)ctx;
    if (ops != NULL && ops->ctx_leave != NULL)
        ops->ctx_leave();
}
