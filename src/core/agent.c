/* The agent: lifetime, configuration, hooks, and the ordered teardown. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "internal.h"
#include "common/mac.h"

/* At load: before any thread of ours can be inside libcrypto (mac.c). */
static void kvli_lib_init(void) __attribute__((constructor));
static void kvli_lib_init(void)
{
    kvli_crypto_init();
}

/* Live agents stay reachable from here, so a process that exits without
 * destroying them is not reported as leaking by LeakSanitizer. */
static pthread_mutex_t kvli_live_lock = PTHREAD_MUTEX_INITIALIZER;
static kvl_agent_t *kvli_live;

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
    if (kind_p == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_mem_kind_parse: kind_p is NULL");
    for (size_t i = 0; s && i < 4; i++) {
        if (strcasecmp(s, kvl_mem_kind_name(kinds[i])) == 0) {
            *kind_p = kinds[i];
            return KVL_OK;
        }
    }
    return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, "use DRAM, VRAM, FILE or AUTO",
                            "'%s' is not a memory kind", s ? s : "(null)");
}


/* A comma-separated list with an empty entry: two commas with only blanks
 * between them, or a comma first or last. Blanks around names are fine; a
 * list of blanks alone names nothing. */
static bool kvli_list_has_empty(const char *s)
{
    bool named = false, comma = false; /* a name since the last comma */
    for (; *s != '\0'; s++) {
        if (*s == ',') {
            if (!named)
                return true;
            named = false;
            comma = true;
        } else if (*s != ' ') {
            named = true;
        }
    }
    return comma && !named;
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
    a->nq_max_bytes = KVL_NOTIF_QUEUE_BYTES_DEFAULT;
    a->nq_max_msgs = KVL_NOTIF_QUEUE_MSGS_DEFAULT;
    if (cfg && (cfg->field_mask & KVL_AGENT_CFG_NOTIF_BOUND)) {
        if (cfg->notif_max_bytes)
            a->nq_max_bytes = cfg->notif_max_bytes;
        if (cfg->notif_max_msgs)
            a->nq_max_msgs = cfg->notif_max_msgs;
    }
    a->nq_peer_pct = KVL_NOTIF_PEER_PERCENT_DEFAULT;
    if (cfg && (cfg->field_mask & KVL_AGENT_CFG_NOTIF_SHARE) && cfg->notif_peer_percent) {
        if (cfg->notif_peer_percent > 100) {
            if (a->secret != NULL)
                explicit_bzero(a->secret, a->secret_len);
            free(a->secret);
            free(a);
            return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, "give a percentage from 1 to "
                                    "100 (100: one peer may fill the whole queue)",
                                    "notif_peer_percent %u is not in 1..100",
                                    cfg->notif_peer_percent);
        }
        a->nq_peer_pct = cfg->notif_peer_percent;
    }
    a->nq_peer_msgs = a->nq_max_msgs / 100 * a->nq_peer_pct +
                      a->nq_max_msgs % 100 * a->nq_peer_pct / 100;
    a->nq_peer_bytes = a->nq_max_bytes / 100 * a->nq_peer_pct +
                       a->nq_max_bytes % 100 * a->nq_peer_pct / 100;
    if (a->nq_peer_msgs == 0)
        a->nq_peer_msgs = 1;
    if (a->nq_peer_bytes == 0)
        a->nq_peer_bytes = 1;
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
    char *buf = strdup(list); /* whole: a long list is never cut */
    if (buf == NULL) {
        kvl_agent_destroy(a);
        return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL,
                                "kvl_agent_create: out of memory for the backend list");
    }
    if (kvli_list_has_empty(buf)) {
        free(buf);
        kvl_agent_destroy(a);
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, "name each backend once between "
                                "commas, e.g. \"shm,tcp\" (\"\" creates none)",
                                "kvl_agent_create: the backend list '%.200s' has an empty entry",
                                list);
    }
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        kvl_status_t st = kvl_backend_create(a, tok, NULL, 0, NULL);
        if (st != KVL_OK) {
            kvl_error_t err = *kvl_last_error();
            free(buf);
            kvl_agent_destroy(a);
            return kvli_fail(NULL, &err);
        }
    }
    free(buf);
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
    /* 1. transfers: abort what moves (no wait for a peer that stopped
     *    answering: backends give its requests up), then free (the lock is
     *    not held while waiting, completion callbacks need it) */
    atomic_store(&a->destroying, true);
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
    unsigned held = kvli_registry_unpinned(a);
    if (held != 0)
        kvli_log(KVL_LOG_WARN, "core", "agent '%s': %u peer request(s) still held registered "
                 "memory after %llu ms; releasing it anyway (the peer stopped mid-request)",
                 a->name, held, (unsigned long long)a->timeout_ms);
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

