/* The agent: lifetime, backends, and the ordered teardown. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "internal.h"

/* Live agents stay reachable from here, so a process that exits without
 * destroying them is not reported as leaking by LeakSanitizer. */
static pthread_mutex_t kvli_live_lock = PTHREAD_MUTEX_INITIALIZER;
static kvl_agent_t *kvli_live;

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

const char *kvl_mem_kind_name(kvl_mem_kind_t kind)
{
    switch (kind) {
    case KVL_MEM_AUTO: return "AUTO";
    case KVL_MEM_DRAM: return "DRAM";
    case KVL_MEM_VRAM: return "VRAM";
    case KVL_MEM_FILE: return "FILE";
    }
    return "UNKNOWN";
}

kvl_status_t kvl_mem_kind_parse(const char *s, kvl_mem_kind_t *kind_p)
{
    static const kvl_mem_kind_t kinds[] = {KVL_MEM_AUTO, KVL_MEM_DRAM, KVL_MEM_VRAM, KVL_MEM_FILE};
    for (size_t i = 0; s && kind_p && i < 4; i++) {
        if (strcasecmp(s, kvl_mem_kind_name(kinds[i])) == 0) {
            *kind_p = kinds[i];
            return KVL_OK;
        }
    }
    return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, "use DRAM, VRAM, FILE or AUTO",
                            "'%s' is not a memory kind", s ? s : "(null)");
}

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

kvl_status_t kvl_agent_create(const char *name, const kvl_agent_config_t *cfg, kvl_agent_t **agent_p)
{
    if (agent_p == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_agent_create: agent_p is NULL");
    *agent_p = NULL;
    if (!kvli_name_valid(name))
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG,
                                "use 1 to 63 printable characters without spaces",
                                "agent name '%s' is not valid", name ? name : "(null)");
    kvl_agent_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL, "kvl_agent_create: out of memory");
    kvli_scopy(a->name, sizeof(a->name), name);
    a->incarnation = kvli_random64();
    a->start_ns = kvli_realtime_ns();
    atomic_init(&a->generation, 1);
    a->timeout_ms = (cfg && (cfg->field_mask & KVL_AGENT_CFG_TIMEOUT) && cfg->timeout_ms)
                        ? cfg->timeout_ms : 5000;
    a->workers = (cfg && (cfg->field_mask & KVL_AGENT_CFG_WORKERS) && cfg->workers) ? cfg->workers : 1;
    if (cfg && (cfg->field_mask & KVL_AGENT_CFG_SECRET) && cfg->secret && cfg->secret[0]) {
        a->secret_len = strlen(cfg->secret);
        a->secret = malloc(a->secret_len);
        if (a->secret == NULL) {
            free(a);
            return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL, "kvl_agent_create: out of memory");
        }
        memcpy(a->secret, cfg->secret, a->secret_len);
    }
    a->last_err.device = -1;
    pthread_mutex_init(&a->lock, NULL);
    pthread_mutex_init(&a->notif_lock, NULL);
    pthread_mutex_init(&a->xfer_lock, NULL);
    pthread_cond_init(&a->notif_cond, NULL);
    pthread_mutex_init(&a->err_lock, NULL);

    pthread_mutex_lock(&kvli_live_lock);
    a->next_live = kvli_live;
    kvli_live = a;
    pthread_mutex_unlock(&kvli_live_lock);

    const char *list = (cfg && (cfg->field_mask & KVL_AGENT_CFG_BACKENDS) && cfg->create_backends)
                           ? cfg->create_backends : "shm";
    char buf[256];
    kvli_scopy(buf, sizeof(buf), list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        kvl_status_t st = kvl_backend_create(a, tok, NULL, 0, NULL);
        if (st != KVL_OK) {
            kvl_error_t err = *kvl_last_error();
            kvl_agent_destroy(a);
            return kvli_fail(NULL, &err);
        }
    }
    kvli_log(KVL_LOG_INFO, "core", "agent '%s' created, incarnation %016llx", a->name,
             (unsigned long long)a->incarnation);
    *agent_p = a;
    return KVL_OK;
}

const char *kvl_agent_name(const kvl_agent_t *a)
{
    return a ? a->name : NULL;
}

uint64_t kvl_agent_incarnation(const kvl_agent_t *a)
{
    return a ? a->incarnation : 0;
}

const kvli_agent_hooks_t *kvli_agent_hooks(kvl_agent_t *a)
{
    pthread_mutex_lock(&a->lock);
    const kvli_agent_hooks_t *h = a->hooks;
    pthread_mutex_unlock(&a->lock);
    return h;
}

void kvl_agent_destroy(kvl_agent_t *a)
{
    if (a == NULL)
        return;
    pthread_mutex_lock(&kvli_live_lock);
    for (kvl_agent_t **pp = &kvli_live; *pp; pp = &(*pp)->next_live) {
        if (*pp == a) {
            *pp = a->next_live;
            break;
        }
    }
    pthread_mutex_unlock(&kvli_live_lock);

    /* 0. what attached above the core (the listener: peers we pushed to drop
     *    our metadata; stop serving) */
    const kvli_agent_hooks_t *hooks = kvli_agent_hooks(a);
    if (hooks != NULL && hooks->destroy != NULL)
        hooks->destroy(a);
    /* 1. transfers: cancel what moves, then free (the lock is not held while
     *    waiting, completion callbacks need it) */
    for (;;) {
        pthread_mutex_lock(&a->lock);
        kvl_xfer_t *x = a->xfers;
        pthread_mutex_unlock(&a->lock);
        if (x == NULL)
            break;
        kvl_xfer_release(x);
    }
    /* 2. prepared lists */
    pthread_mutex_lock(&a->lock);
    while (a->preps) {
        kvl_prep_t *p = a->preps;
        a->preps = p->next;
        pthread_mutex_unlock(&a->lock);
        kvli_prep_free(p);
        pthread_mutex_lock(&a->lock);
    }
    pthread_mutex_unlock(&a->lock);
    /* 3. remote agents and their connections */
    kvli_remotes_destroy(a);
    /* 4. memory, 5. allocations made by backends (UCX must not close with
     *    them mapped), 6. backends (reverse order of creation), 7. memfd
     *    allocations */
    pthread_mutex_lock(&a->lock);
    kvli_registry_destroy(a);
    kvli_allocs_destroy(a, true);
    pthread_mutex_unlock(&a->lock);
    for (unsigned b = a->nbks; b-- > 0;) {
        a->bks[b]->ops->close(a->bks[b]->bk);
        free(a->bks[b]);
    }
    a->nbks = 0;
    kvli_allocs_destroy(a, false);
    kvli_notifs_destroy(a);
    pthread_mutex_destroy(&a->lock);
    pthread_mutex_destroy(&a->notif_lock);
    pthread_mutex_destroy(&a->xfer_lock);
    pthread_cond_destroy(&a->notif_cond);
    pthread_mutex_destroy(&a->err_lock);
    if (a->secret != NULL) {
        explicit_bzero(a->secret, a->secret_len);
        free(a->secret);
    }
    free(a);
}

