/*
 * The agent's registry: registered regions sorted by address, their
 * reference counts and lookups, what the registry answers (kvl_mem_query),
 * and the target-side pins backends take on it.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>
#include "internal.h"

void kvli_region_get(kvli_region_t *r)
{
    atomic_fetch_add(&r->objref, 1);
}

void kvli_region_put(kvli_region_t *r)
{
    if (atomic_fetch_sub(&r->objref, 1) == 1)
        free(r);
}

/* Index of the first region whose (addr, len) is >= the key. */
static size_t kvli_registry_lower(const kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = a->nregs;
    /* lists are mostly registered in address order: past the last region
     * is answered without the search (whose probes miss the cache) */
    if (hi > 0) {
        const kvli_region_t *last = a->regs[hi - 1];
        if (last->addr < addr || (last->addr == addr && last->len < len))
            return hi;
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const kvli_region_t *r = a->regs[mid];
        if (r->addr < addr || (r->addr == addr && r->len < len))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* reg_reach from index i on, after regs changed there. */
static void kvli_registry_reach(kvl_agent_t *a, size_t i)
{
    for (; i < a->nregs; i++) {
        uint64_t end = a->regs[i]->addr + a->regs[i]->len;
        a->reg_reach[i] = i > 0 && a->reg_reach[i - 1] > end ? a->reg_reach[i - 1] : end;
    }
}

kvli_region_t *kvli_registry_find(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    kvli_region_t *r = a->last_hit;
    if (r != NULL && addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr))
        return r;
    /* Regions may overlap: walk back from the last start <= addr while some
     * region at or before the index still reaches past addr. */
    size_t i = kvli_registry_lower(a, addr, UINT64_MAX);
    while (i > 0 && a->reg_reach[i - 1] > addr) {
        r = a->regs[--i];
        if (addr - r->addr <= r->len && len <= r->len - (addr - r->addr)) {
            a->last_hit = r;
            return r;
        }
    }
    return NULL;
}

kvli_region_t *kvli_registry_overlap(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    /* one that starts before and reaches past addr (reg_reach says whether
     * there is one; the walk back stops at it): the one registered around
     * it, named first; else one that starts inside [addr, addr+len) */
    size_t i = kvli_registry_lower(a, addr, 0);
    for (size_t k = i; k > 0 && a->reg_reach[k - 1] > addr;) {
        kvli_region_t *r = a->regs[--k];
        if (r->addr + r->len > addr)
            return r;
    }
    for (size_t k = i; k < a->nregs && a->regs[k]->addr < addr + len; k++) {
        kvli_region_t *r = a->regs[k];
        if (!(r->addr == addr && r->len == len) && r->len > 0)
            return r;
    }
    return NULL;
}

kvli_region_t *kvli_registry_nearest(kvl_agent_t *a, uint64_t addr)
{
    kvli_region_t *best = NULL;
    uint64_t bestd = UINT64_MAX;
    size_t i = kvli_registry_lower(a, addr, 0);
    for (size_t k = (i > 0 ? i - 1 : 0); k < a->nregs && k <= i; k++) {
        kvli_region_t *r = a->regs[k];
        uint64_t d = addr < r->addr ? r->addr - addr
                   : (addr - r->addr < r->len ? 0 : addr - r->addr - r->len + 1);
        if (d < bestd) {
            bestd = d;
            best = r;
        }
    }
    /* Regions overlap: one that starts further back may still be nearer,
     * or contain addr; none can once even the longest would end too soon. */
    for (size_t k = i > 1 ? i - 1 : 0; k-- > 0 && bestd > 0;) {
        kvli_region_t *r = a->regs[k];
        uint64_t gap = addr - r->addr;
        if (gap > a->max_len && gap - a->max_len >= bestd)
            break;
        uint64_t d = gap < r->len ? 0 : gap - r->len + 1;
        if (d < bestd) {
            bestd = d;
            best = r;
        }
    }
    return best;
}

kvl_status_t kvli_registry_insert(kvl_agent_t *a, kvli_region_t *r, kvl_error_t *err)
{
    if (a->nregs == a->capregs) {
        size_t cap = a->capregs ? a->capregs * 2 : 64;
        kvli_region_t **n = realloc(a->regs, cap * sizeof(*n));
        if (n != NULL)
            a->regs = n;
        uint64_t *m = n != NULL ? realloc(a->reg_reach, cap * sizeof(*m)) : NULL;
        if (m == NULL) {
            kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "registry: cannot grow to %zu regions", cap);
            return KVL_ERR_NO_MEMORY;
        }
        a->reg_reach = m;
        a->capregs = cap;
    }
    size_t i = kvli_registry_lower(a, r->addr, r->len);
    memmove(&a->regs[i + 1], &a->regs[i], (a->nregs - i) * sizeof(*a->regs));
    a->regs[i] = r;
    a->nregs++;
    kvli_registry_reach(a, i); /* appended in address order (the usual): one entry */
    if (r->len > a->max_len)
        a->max_len = r->len;
    return KVL_OK;
}

void kvli_registry_remove(kvl_agent_t *a, kvli_region_t *r)
{
    size_t i = kvli_registry_lower(a, r->addr, r->len);
    while (i < a->nregs && a->regs[i] != r)
        i++;
    if (i == a->nregs)
        return;
    memmove(&a->regs[i], &a->regs[i + 1], (a->nregs - i - 1) * sizeof(*a->regs));
    a->nregs--;
    kvli_registry_reach(a, i);
    if (a->last_hit == r)
        a->last_hit = NULL;
}

void kvli_registry_remove_invalid(kvl_agent_t *a)
{
    size_t k = 0, first = SIZE_MAX;
    for (size_t i = 0; i < a->nregs; i++) {
        if (atomic_load(&a->regs[i]->valid))
            a->regs[k++] = a->regs[i];
        else if (first == SIZE_MAX)
            first = i;
    }
    a->nregs = k;
    if (first != SIZE_MAX)
        kvli_registry_reach(a, first);
    if (a->last_hit != NULL && !atomic_load(&a->last_hit->valid))
        a->last_hit = NULL;
}

kvli_region_t *kvli_registry_exact(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    size_t i = kvli_registry_lower(a, addr, len);
    if (i < a->nregs && a->regs[i]->addr == addr && a->regs[i]->len == len)
        return a->regs[i];
    return NULL;
}


/* kvl_agent_destroy, a->lock held, after region_pin started refusing: wait
 * (lock released meanwhile) until no backend thread serving a peer holds a
 * region, bounded by the agent's timeout; only then do backends release
 * their handles. Returns the pins still held when the bound passed. */
unsigned kvli_registry_unpinned(kvl_agent_t *a)
{
    uint64_t deadline = kvli_now_ns() + a->timeout_ms * 1000000ull;
    for (;;) {
        unsigned pins = 0;
        for (size_t i = 0; i < a->nregs; i++)
            pins += atomic_load(&a->regs[i]->pins);
        if (pins == 0 || kvli_now_ns() > deadline)
            return pins;
        pthread_mutex_unlock(&a->lock);
        struct timespec ts = {0, 200000}; /* a request finishing a copy */
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&a->lock);
    }
}

void kvli_registry_destroy(kvl_agent_t *a)
{
    /* Reverse order of addresses is what we have; registration order is not
     * kept, and backends need only that each handle is released once. */
    for (size_t i = a->nregs; i-- > 0;) {
        kvli_region_t *r = a->regs[i];
        atomic_store(&r->valid, false);
        /* Peers that copy without asking (shm's cross-memory attach and
         * mapped memfds) stop, and copies in progress finish, before the
         * memory is given back: as for kvl_mem_deregister. */
        for (unsigned b = 0; b < a->nbks; b++) {
            kvl_error_t e;
            if (kvli_region_revoke_on(a, r, b, &e) != KVL_OK)
                kvli_log(KVL_LOG_WARN, "core", "agent '%s' destroyed while a peer still "
                         "copied into 0x%llx+%llu over %s: %.400s", a->name,
                         (unsigned long long)r->addr, (unsigned long long)r->len,
                         a->bks[b]->ops->name, e.what);
        }
        kvli_region_unregister_backends(a, r);
        kvli_region_put(r);
    }
    free(a->regs);
    free(a->reg_reach);
    a->regs = NULL;
    a->reg_reach = NULL;
    a->nregs = a->capregs = 0;
    a->last_hit = NULL;
}


kvl_status_t kvl_mem_query(kvl_agent_t *a, uint64_t addr, uint64_t len, kvl_mem_info_t *info)
{
    if (a == NULL || info == NULL || len == 0 || addr + len < addr)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_mem_query: NULL agent or "
                                "info, or an empty or wrapping range [0x%llx, +%llu)",
                                (unsigned long long)addr, (unsigned long long)len);
    memset(info, 0, sizeof(*info));
    pthread_mutex_lock(&a->lock);
    kvli_region_t *r = kvli_registry_find(a, addr, len);
    if (r != NULL) {
        size_t off = 0;
        info->addr = r->addr;
        info->len = r->len;
        info->kind = r->kind;
        info->dev = r->dev;
        info->refcount = r->refcount;
        for (unsigned b = 0; b < a->nbks; b++) {
            if (!(r->bk_mask & (1u << b)))
                continue;
            int w = snprintf(info->backends + off, sizeof(info->backends) - off, "%s%s",
                             off ? "," : "", a->bks[b]->ops->name);
            if (w < 0 || (size_t)w >= sizeof(info->backends) - off)
                break;
            off += (size_t)w;
        }
    }
    pthread_mutex_unlock(&a->lock);
    if (r == NULL)
        return kvli_fail_simple(a, KVL_ERR_NOT_FOUND, NULL, "kvl_mem_query: no registered region "
                                "of agent '%s' contains [0x%llx, +%llu)", a->name,
                                (unsigned long long)addr, (unsigned long long)len);
    return KVL_OK;
}


/* ---- services for backends (target side) ---- */

kvl_status_t kvli_ctx_region_pin(kvl_bk_ctx_t *ctx, uint64_t addr, uint64_t len, void **mh_p,
                                 void **pin_p, kvl_error_t *err);
kvl_status_t kvli_ctx_region_pin(kvl_bk_ctx_t *ctx, uint64_t addr, uint64_t len, void **mh_p,
                                 void **pin_p, kvl_error_t *err)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    pthread_mutex_lock(&a->lock);
    if (atomic_load(&a->destroying)) {
        /* The agent's memory is about to be released: no new peer request
         * may start using it (kvl_agent_destroy waits for those that did). */
        kvl_bk_error_set(err, KVL_ERR_STATE, 0, bk->ops->name, -1,
                         "request for 0x%llx+%llu refused: agent '%s' is being destroyed",
                         (unsigned long long)addr, (unsigned long long)len, a->name);
        kvl_bk_error_hint(err, "the target is shutting down; its memory is no longer served");
        pthread_mutex_unlock(&a->lock);
        return KVL_ERR_STATE;
    }
    kvli_region_t *r = (len == 0 || kvli_add_overflows(addr, len)) ? NULL
                                                                    : kvli_registry_find(a, addr, len);
    if (r == NULL || !(r->bk_mask & (1u << bk->index))) {
        kvli_region_t *near = kvli_registry_nearest(a, addr);
        kvl_bk_error_set(err, KVL_ERR_OUT_OF_BOUNDS, 0, bk->ops->name, -1,
                         "request for 0x%llx+%llu lies outside memory agent '%s' registered on "
                         "backend %s%s", (unsigned long long)addr, (unsigned long long)len,
                         a->name, bk->ops->name, r ? " (registered, but not on this backend)" : "");
        if (near)
            kvl_bk_error_hint(err, "nearest registered region: 0x%llx+%llu; the peer's metadata may "
                              "be stale (reload it after every registration change)",
                              (unsigned long long)near->addr, (unsigned long long)near->len);
        pthread_mutex_unlock(&a->lock);
        return KVL_ERR_OUT_OF_BOUNDS;
    }
    atomic_fetch_add(&r->pins, 1);
    kvli_region_get(r);
    *mh_p = r->mh[bk->index];
    *pin_p = r;
    pthread_mutex_unlock(&a->lock);
    return KVL_OK;
}

void kvli_ctx_region_unpin(kvl_bk_ctx_t *ctx, void *pin);
void kvli_ctx_region_unpin(kvl_bk_ctx_t *ctx, void *pin)
{
    (void)ctx;
    kvli_region_t *r = pin;
    atomic_fetch_sub(&r->pins, 1);
    kvli_region_put(r);
}

