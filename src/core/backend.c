/*
 * Backends on an agent: creating one (kvl_backend_create), listing them, and
 * the context the core lends each (logging, completions, target-side pins,
 * allocations, staging, indexed transfers, the shared secret).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "internal.h"

void kvli_xfer_ctx_done(kvl_bk_xfer_t *x, kvl_status_t status, const kvl_error_t *err);
kvl_status_t kvli_ctx_region_pin(kvl_bk_ctx_t *ctx, uint64_t addr, uint64_t len, void **mh_p,
                                 void **pin_p, kvl_error_t *err);
void kvli_ctx_region_unpin(kvl_bk_ctx_t *ctx, void *pin);
kvl_status_t kvli_ctx_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p, uint64_t *size_p);
/* stage.c */
kvl_status_t kvli_ctx_stage_check(kvl_bk_ctx_t *ctx, kvl_mem_kind_t kind, int32_t dev,
                                  kvl_error_t *err);
kvl_status_t kvli_ctx_stage_host_alloc(kvl_bk_ctx_t *ctx, size_t len, void **ptr_p,
                                       kvl_error_t *err);
void kvli_ctx_stage_host_free(kvl_bk_ctx_t *ctx, void *ptr);
kvl_status_t kvli_ctx_stage_copy(kvl_bk_ctx_t *ctx, int to_host, const kvl_stage_piece_t *p,
                                 size_t n, void (*notify)(void *arg), void *arg, void **ticket_p,
                                 kvl_error_t *err);
int kvli_ctx_stage_test(kvl_bk_ctx_t *ctx, void *ticket, int wait, kvl_error_t *err);
kvl_status_t kvli_ctx_stage_enter(kvl_bk_ctx_t *ctx, int32_t dev, kvl_error_t *err);
void kvli_ctx_stage_leave(kvl_bk_ctx_t *ctx);

static void kvli_ctx_log(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kvli_ctx_log(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
{
    struct kvl_backend *bk = ctx->core;
    va_list ap;
    va_start(ap, fmt);
    kvli_vlog(level, bk->ops->name, fmt, ap);
    va_end(ap);
}

kvl_status_t kvl_backend_create(kvl_agent_t *a, const char *name, const kvl_param_t *params,
                                size_t n_params, kvl_backend_t **bk_p)
{
    kvl_error_t err;
    char reason[512];
    if (bk_p)
        *bk_p = NULL;
    if (a == NULL || name == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_backend_create: agent or name is NULL");
    const kvl_backend_ops_t *ops = kvli_backend_find(name);
    kvl_status_t st = kvl_backend_available(name, reason, sizeof(reason));
    if (ops == NULL || st != KVL_OK) {
        kvli_err(&err, ops ? st : KVL_ERR_NOT_FOUND, 0, "backend '%s' cannot be created: %s", name,
                 reason[0] ? reason : kvl_status_str(st));
        kvli_scopy(err.backend, sizeof(err.backend), name);
        kvli_hint(&err, "run 'kvlane doctor' to see which backends this machine supports");
        return kvli_fail(a, &err);
    }
    if (ops->abi_version != KVL_BACKEND_ABI_VERSION ||
        ops->size < offsetof(kvl_backend_ops_t, peer_describe) + sizeof(ops->peer_describe)) {
        kvli_err(&err, KVL_ERR_UNSUPPORTED, 0,
                 "backend '%s' was built for backend ABI %u (table size %u); this kvlane speaks "
                 "ABI %u", name, ops->abi_version, ops->size, KVL_BACKEND_ABI_VERSION);
        kvli_hint(&err, "rebuild the backend module against this kvlane");
        return kvli_fail(a, &err);
    }
    for (size_t i = 0; i < n_params; i++) {
        const kvl_param_t *known = ops->params;
        while (known && known->key && strcmp(known->key, params[i].key ? params[i].key : "") != 0)
            known++;
        if (known == NULL || known->key == NULL) {
            char keys[256] = "";
            size_t off = 0;
            for (known = ops->params; known && known->key && off < sizeof(keys); known++)
                off += (size_t)snprintf(keys + off, sizeof(keys) - off, " %s", known->key);
            kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "backend '%s' has no parameter '%s'", name,
                     params[i].key ? params[i].key : "(null)");
            kvli_hint(&err, "its parameters are:%s", keys[0] ? keys : " (none)");
            kvli_scopy(err.backend, sizeof(err.backend), name);
            return kvli_fail(a, &err);
        }
    }

    pthread_mutex_lock(&a->lock);
    for (unsigned b = 0; b < a->nbks; b++) {
        if (a->bks[b]->ops == ops) {
            pthread_mutex_unlock(&a->lock);
            kvli_err(&err, KVL_ERR_EXISTS, 0, "backend '%s' is already created on agent '%s'",
                     name, a->name);
            return kvli_fail(a, &err);
        }
    }
    if (a->nbks == KVLI_MAX_BACKENDS) {
        pthread_mutex_unlock(&a->lock);
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "agent '%s' already has %d backends", a->name,
                 KVLI_MAX_BACKENDS);
        return kvli_fail(a, &err);
    }
    struct kvl_backend *bk = calloc(1, sizeof(*bk));
    if (bk == NULL) {
        pthread_mutex_unlock(&a->lock);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_backend_create: out of memory");
    }
    bk->ops = ops;
    bk->agent = a;
    bk->index = a->nbks;
    bk->ctx = (kvl_bk_ctx_t){
        .size = sizeof(kvl_bk_ctx_t),
        .agent_name = a->name,
        .incarnation = a->incarnation,
        .timeout_ms = a->timeout_ms,
        .workers = a->workers,
        .core = bk,
        .log = kvli_ctx_log,
        .xfer_done = kvli_xfer_ctx_done,
        .notif_deliver = kvli_notif_deliver,
        .region_pin = kvli_ctx_region_pin,
        .region_unpin = kvli_ctx_region_unpin,
        .alloc_lookup = kvli_ctx_alloc_lookup,
        .stage_check = kvli_ctx_stage_check,
        .stage_host_alloc = kvli_ctx_stage_host_alloc,
        .stage_host_free = kvli_ctx_stage_host_free,
        .stage_copy = kvli_ctx_stage_copy,
        .stage_test = kvli_ctx_stage_test,
        .xfer_expand = kvli_xfer_ctx_expand,
        .secret = a->secret,
        .secret_len = a->secret_len,
        .notif_offer = kvli_notif_offer,
        .notif_reserve = kvli_notif_reserve,
        .notif_offer_reserved = kvli_notif_offer_reserved,
        .notif_unreserve = kvli_notif_unreserve,
        .stage_ctx_enter = kvli_ctx_stage_enter,
        .stage_ctx_leave = kvli_ctx_stage_leave,
    };
    memset(&err, 0, offsetof(kvl_error_t, causes));
    err.device = -1;
    st = ops->open(&bk->ctx, params, n_params, &bk->bk, &err);
    if (st != KVL_OK) {
        pthread_mutex_unlock(&a->lock);
        free(bk);
        if (err.code == KVL_OK)
            kvli_err(&err, st, 0, "backend '%s' failed to open", name);
        if (!err.backend[0])
            kvli_scopy(err.backend, sizeof(err.backend), name);
        return kvli_fail(a, &err);
    }
    a->bks[a->nbks++] = bk;
    atomic_fetch_add(&a->generation, 1);
    pthread_mutex_unlock(&a->lock);
    kvli_log(KVL_LOG_INFO, "core", "agent '%s': backend %s created", a->name, name);
    if (bk_p)
        *bk_p = bk;
    return KVL_OK;
}

size_t kvl_agent_backends(kvl_agent_t *a, kvl_backend_t **out, size_t max)
{
    size_t n = 0;
    if (a == NULL)
        return 0;
    pthread_mutex_lock(&a->lock);
    for (unsigned b = 0; b < a->nbks; b++, n++)
        if (out && n < max)
            out[n] = a->bks[b];
    pthread_mutex_unlock(&a->lock);
    return n;
}

const char *kvl_backend_name(const kvl_backend_t *bk)
{
    return bk ? bk->ops->name : NULL;
}
