/* Remote agents: loading their metadata (untrusted), looking up their
 * regions, describing and removing them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "md_codec.h"

/* ---- remote agents ---- */

void kvli_remote_get(kvli_remote_t *r)
{
    atomic_fetch_add(&r->objref, 1);
}

/* Unload the region handles of n regions (the peers stay). */
static void kvli_rregions_unload(kvl_agent_t *a, kvli_remote_t *r, kvli_rregion_t *g, size_t n)
{
    for (unsigned b = 0; b < a->nbks; b++) {
        struct kvl_backend *bk = a->bks[b];
        if (r->peer[b] == NULL)
            continue;
        for (size_t i = 0; i < n; i++)
            if (g[i].rh[b] != NULL) {
                bk->ops->rregion_unload(bk->bk, r->peer[b], g[i].rh[b]);
                g[i].rh[b] = NULL;
            }
    }
}

static void kvli_remote_free(kvl_agent_t *a, kvli_remote_t *r)
{
    kvli_rregions_unload(a, r, r->regions, r->n_regions);
    for (kvli_rretired_t *t = r->retired, *next; t != NULL; t = next) {
        next = t->next;
        kvli_rregions_unload(a, r, t->gone, t->n_gone);
        free(t->gone);
        free(t->array);
        free(t);
    }
    for (unsigned b = 0; b < a->nbks; b++)
        if (r->peer[b] != NULL)
            a->bks[b]->ops->peer_unload(a->bks[b]->bk, r->peer[b]);
    free(r->regions);
    free(r);
}

void kvli_remote_put(kvl_agent_t *a, kvli_remote_t *r)
{
    if (atomic_fetch_sub(&r->objref, 1) == 1)
        kvli_remote_free(a, r);
}

/* FNV-1a of a name: the chain of kvl_agent.rtab it hangs on. */
static size_t kvli_remote_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return (size_t)(h ^ (h >> 32));
}

kvli_remote_t *kvli_remote_find(kvl_agent_t *a, const char *name)
{
    if (a->rtab != NULL) {
        for (kvli_remote_t *r = a->rtab[kvli_remote_hash(name) & (a->rtab_cap - 1)]; r;
             r = r->hnext)
            if (strcmp(r->name, name) == 0)
                return r;
        return NULL;
    }
    for (kvli_remote_t *r = a->remotes; r; r = r->next)
        if (strcmp(r->name, name) == 0)
            return r;
    return NULL;
}

/* Add r to the list and the table (under lock). The table grows to twice
 * the remotes held. Without memory to grow it, it stays as it is (longer
 * chains); without memory for a first one, lookups keep the list. */
static void kvli_remote_link(kvl_agent_t *a, kvli_remote_t *r)
{
    r->next = a->remotes;
    a->remotes = r;
    a->nremotes++;
    if (a->nremotes > a->rtab_cap / 2 && a->rtab_cap != SIZE_MAX) {
        size_t cap = a->rtab_cap ? a->rtab_cap * 2 : 64;
        kvli_remote_t **t = calloc(cap, sizeof(*t));
        if (t != NULL) {
            for (kvli_remote_t *x = a->remotes->next; x; x = x->next) {
                size_t i = kvli_remote_hash(x->name) & (cap - 1);
                x->hnext = t[i];
                t[i] = x;
            }
            free(a->rtab);
            a->rtab = t;
            a->rtab_cap = cap;
        } else if (a->rtab == NULL) {
            a->rtab_cap = SIZE_MAX; /* no table: the list serves for good */
        }
    }
    if (a->rtab != NULL) {
        size_t i = kvli_remote_hash(r->name) & (a->rtab_cap - 1);
        r->hnext = a->rtab[i];
        a->rtab[i] = r;
    }
}

kvli_remote_t *kvli_remote_acquire(kvl_agent_t *a, const char *name, kvl_error_t *err)
{
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *r = kvli_remote_find(a, name);
    if (r)
        kvli_remote_get(r);
    pthread_mutex_unlock(&a->lock);
    if (r == NULL) {
        kvli_err(err, KVL_ERR_NOT_FOUND, 0, "remote agent '%s' is not loaded on agent '%s'", name,
                 a->name);
        kvli_scopy(err->agent, sizeof(err->agent), name);
        kvli_hint(err, "load its metadata first (kvl_metadata_load)");
    }
    return r;
}

static size_t kvli_rregion_upper(const kvli_remote_t *r, uint64_t addr)
{
    size_t lo = 0, hi = r->n_regions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->regions[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const kvli_rregion_t *kvli_rregion_find(const kvli_remote_t *r, uint64_t addr, uint64_t len)
{
    size_t i = kvli_rregion_upper(r, addr);
    while (i > 0) {
        const kvli_rregion_t *g = &r->regions[--i];
        if (addr - g->addr > r->max_len)
            break;
        if (addr - g->addr <= g->len && len <= g->len - (addr - g->addr))
            return g;
    }
    return NULL;
}

const kvli_rregion_t *kvli_rregion_nearest(const kvli_remote_t *r, uint64_t addr)
{
    size_t i = kvli_rregion_upper(r, addr);
    const kvli_rregion_t *best = NULL;
    uint64_t bestd = UINT64_MAX;
    for (size_t k = (i > 0 ? i - 1 : 0); k < r->n_regions && k <= i; k++) {
        const kvli_rregion_t *g = &r->regions[k];
        uint64_t d = addr < g->addr ? g->addr - addr
                   : (addr - g->addr < g->len ? 0 : addr - g->addr - g->len + 1);
        if (d < bestd) {
            bestd = d;
            best = g;
        }
    }
    /* Regions overlap: one that starts further back may still be nearer,
     * or contain addr; none can once even the longest would end too soon. */
    for (size_t k = i > 1 ? i - 1 : 0; k-- > 0 && bestd > 0;) {
        const kvli_rregion_t *g = &r->regions[k];
        uint64_t gap = addr - g->addr;
        if (gap > r->max_len && gap - r->max_len >= bestd)
            break;
        uint64_t d = gap < g->len ? 0 : gap - g->len + 1;
        if (d < bestd) {
            bestd = d;
            best = g;
        }
    }
    return best;
}

static int kvli_rregion_cmp(const void *x, const void *y)
{
    const kvli_rregion_t *p = x, *q = y;
    if (p->addr != q->addr)
        return p->addr < q->addr ? -1 : 1;
    return p->len < q->len ? -1 : p->len > q->len;
}

/* Cancel every transfer of the agent that targets r (r already invalid). */
static void kvli_remote_quiesce(kvl_agent_t *a, kvli_remote_t *r)
{
    pthread_mutex_lock(&a->xfer_lock);
    pthread_mutex_lock(&a->lock);
    kvl_xfer_t *list = a->xfers;
    pthread_mutex_unlock(&a->lock);
    /* The list cannot change under xfer_lock except by creation, which
     * prepends: walking from the head we saw is safe. */
    for (kvl_xfer_t *x = list; x; x = x->next)
        if (x->rem == r)
            kvli_xfer_quiesce(x);
    pthread_mutex_unlock(&a->xfer_lock);
}

static void kvli_remote_unlink(kvl_agent_t *a, kvli_remote_t *r)
{
    for (kvli_remote_t **pp = &a->remotes; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            a->nremotes--;
            break;
        }
    if (a->rtab != NULL)
        for (kvli_remote_t **pp = &a->rtab[kvli_remote_hash(r->name) & (a->rtab_cap - 1)]; *pp;
             pp = &(*pp)->hnext)
            if (*pp == r) {
                *pp = r->hnext;
                break;
            }
    atomic_store(&r->valid, false);
}

/* Fold one loaded key (local backend b) into a region's key checksum: a
 * region of a partial blob equal to a held one (address, length, kind,
 * device, keys) is kept as held instead of replacing it. */
static uint32_t kvli_keysum(uint32_t sum, unsigned b, const kvli_md_key_t *key)
{
    uint8_t bb = (uint8_t)b;
    sum = kvli_crc32c(sum, &bb, 1);
    return key->len ? kvli_crc32c(sum, key->data, key->len) : sum;
}

static bool kvli_rregion_same(const kvli_rregion_t *x, const kvli_rregion_t *y)
{
    return x->addr == y->addr && x->len == y->len && x->kind == y->kind && x->dev == y->dev &&
           x->keysum == y->keysum;
}

/* Merge a partial blob of the held incarnation into r (referenced by the
 * caller): load its region keys through the peers r already has, then,
 * under the lock, add its regions, each replacing a held region at the same
 * address. The replaced array and regions stay until r is freed: preps of
 * transfers in flight point into them. */
static kvl_status_t kvli_remote_merge(kvl_agent_t *a, kvli_remote_t *r, const kvli_md_t *md,
                                      kvl_error_t *err)
{
    struct kvl_backend *bks[KVLI_MAX_BACKENDS];
    pthread_mutex_lock(&a->lock);
    unsigned nbks = a->nbks;
    memcpy(bks, a->bks, sizeof(bks));
    pthread_mutex_unlock(&a->lock);

    size_t n = md->n_regions;
    kvli_rregion_t *add = calloc(n + 1, sizeof(*add));
    kvli_rretired_t *t = calloc(1, sizeof(*t));
    if (add == NULL || t == NULL) {
        free(add);
        free(t);
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory merging %zu regions of agent "
                 "'%s'", n, md->name);
        return KVL_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        add[i] = (kvli_rregion_t){.addr = md->regions[i].addr, .len = md->regions[i].len,
                                  .kind = md->regions[i].kind, .dev = md->regions[i].dev};
    /* r's peers never change once it is listed: no lock needed to read them */
    for (unsigned b = 0; b < nbks; b++) {
        struct kvl_backend *bk = bks[b];
        int mb = -1;
        if (r->peer[b] == NULL)
            continue;
        for (unsigned j = 0; j < md->n_backends; j++)
            if (strcmp(md->backends[j].name, bk->ops->name) == 0)
                mb = (int)j;
        for (size_t i = 0; mb >= 0 && i < n; i++) {
            const kvli_md_key_t *key = &md->regions[i].keys[mb];
            kvl_error_t berr;
            if (!key->present)
                continue;
            kvl_region_info_t info = {.addr = add[i].addr, .len = add[i].len,
                                      .kind = add[i].kind, .dev = add[i].dev, .shm_fd = -1};
            memset(&berr, 0, offsetof(kvl_error_t, causes));
            berr.device = -1;
            add[i].keysum = kvli_keysum(add[i].keysum, b, key);
            if (bk->ops->rregion_load(bk->bk, r->peer[b], &info, key->data, key->len,
                                      &add[i].rh[b], &berr) != KVL_OK) {
                add[i].rh[b] = NULL;
                if (!berr.backend[0])
                    kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
                kvli_err(err, KVL_ERR_BAD_METADATA, 0,
                         "agent '%s': region %zu (0x%llx+%llu) has a key backend %s refuses",
                         md->name, i, (unsigned long long)info.addr, (unsigned long long)info.len,
                         bk->ops->name);
                kvli_err_add_cause(err, &berr);
                kvli_scopy(err->agent, sizeof(err->agent), md->name);
                kvli_rregions_unload(a, r, add, n);
                free(add);
                free(t);
                return KVL_ERR_BAD_METADATA;
            }
        }
    }
    if (n > 1)
        qsort(add, n, sizeof(*add), kvli_rregion_cmp);

    pthread_mutex_lock(&a->lock);
    kvli_rregion_t *merged = NULL;
    bool *dup = NULL;
    bool current = atomic_load(&r->valid) && md->generation >= r->generation;
    if (current) {
        merged = calloc(r->n_regions + n + 1, sizeof(*merged));
        t->gone = calloc(r->n_regions + 1, sizeof(*t->gone));
        dup = calloc(n + 1, sizeof(*dup));
    }
    if (!current || merged == NULL || t->gone == NULL || dup == NULL) {
        uint64_t now = r->generation;
        pthread_mutex_unlock(&a->lock);
        kvli_rregions_unload(a, r, add, n);
        free(merged);
        free(dup);
        free(t->gone);
        free(t);
        free(add);
        if (current) {
            kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory merging %zu regions of "
                     "agent '%s'", n, md->name);
            return KVL_ERR_NO_MEMORY;
        }
        kvli_err(err, KVL_ERR_STALE, 0, "partial metadata of agent '%s' (generation %llu) was "
                 "not merged: the agent's metadata was replaced or a newer generation (%llu) "
                 "loaded meanwhile", md->name, (unsigned long long)md->generation,
                 (unsigned long long)now);
        kvli_scopy(err->agent, sizeof(err->agent), md->name);
        kvli_hint(err, "fetch the agent's current metadata; what is loaded stays in use");
        return KVL_ERR_STALE;
    }
    /* A region equal to a held one keeps the held one (its new handles are
     * unloaded): loading the same blob again retires nothing. Any other
     * region replaces every held region at its address. */
    size_t m = 0, kept = 0;
    uint64_t max_len = 0;
    for (size_t i = 0; i < r->n_regions; i++) {
        const kvli_rregion_t *g = &r->regions[i];
        size_t lo = 0, hi = n;  /* first of add at g's address (add sorted) */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (add[mid].addr < g->addr)
                lo = mid + 1;
            else
                hi = mid;
        }
        bool same_addr = lo < n && add[lo].addr == g->addr, equal = false;
        for (size_t j = lo; j < n && add[j].addr == g->addr && !equal; j++)
            if (!dup[j] && kvli_rregion_same(&add[j], g))
                equal = dup[j] = true;
        if (same_addr && !equal)
            t->gone[t->n_gone++] = *g;
        else
            merged[m++] = *g;
        kept += equal;
    }
    for (size_t j = 0; j < n; j++)
        if (!dup[j])
            merged[m++] = add[j];
    if (m > 1)
        qsort(merged, m, sizeof(*merged), kvli_rregion_cmp);
    for (size_t i = 0; i < m; i++)
        if (merged[i].len > max_len)
            max_len = merged[i].len;
    if (kept == n && t->n_gone == 0) {
        free(merged); /* nothing new: the held array stays */
        free(t->gone);
        free(t);
        t = NULL;
        m = r->n_regions;
    } else {
        t->array = r->regions;
        t->next = r->retired;
        r->retired = t;
        r->regions = merged;
        r->n_regions = m;
        r->max_len = max_len;
    }
    r->generation = md->generation;
    r->partial = true;
    size_t gone = t ? t->n_gone : 0;
    pthread_mutex_unlock(&a->lock);
    /* the duplicates' handles: unload them, keep the others (now in merged) */
    size_t nd = 0;
    for (size_t j = 0; j < n; j++)
        if (dup[j])
            add[nd++] = add[j];
    kvli_rregions_unload(a, r, add, nd);
    free(dup);
    free(add);
    kvli_log(KVL_LOG_DEBUG, "core", "agent '%s': merged %zu region(s) of remote '%s' "
             "(generation %llu, %zu unchanged, %zu replaced; %zu held)", a->name, n, md->name,
             (unsigned long long)md->generation, kept, gone, m);
    return KVL_OK;
}

kvl_status_t kvl_metadata_load(kvl_agent_t *a, const void *blob, size_t len, char *name_out,
                               size_t name_cap)
{
    kvl_error_t err;
    kvli_md_t md;
    kvl_status_t st;

    if (name_out && name_cap)
        name_out[0] = '\0';
    if (a == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_metadata_load: agent is NULL");
    st = kvli_md_decode(blob, len, &md, &err);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    bool partial = (md.flags & KVLI_MD_FLAG_PARTIAL) != 0;

    /* Refuse what is stale before connecting to anything. */
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *old = kvli_remote_find(a, md.name);
    if (old != NULL) {
        bool same = old->incarnation == md.incarnation;
        if ((same && md.generation < old->generation) || (!same && md.start_ns < old->start_ns)) {
            if (same)
                kvli_err(&err, KVL_ERR_STALE, 0,
                         "metadata of agent '%s' is stale: generation %llu is older than the "
                         "loaded generation %llu of the same incarnation", md.name,
                         (unsigned long long)md.generation, (unsigned long long)old->generation);
            else
                kvli_err(&err, KVL_ERR_STALE, 0,
                         "metadata of agent '%s' is stale: incarnation %016llx started %.3f s "
                         "before the loaded incarnation %016llx", md.name,
                         (unsigned long long)md.incarnation,
                         (double)(old->start_ns - md.start_ns) / 1e9,
                         (unsigned long long)old->incarnation);
            kvli_scopy(err.agent, sizeof(err.agent), md.name);
            kvli_hint(&err, "fetch the agent's current metadata; the loaded one stays in use");
            pthread_mutex_unlock(&a->lock);
            kvli_md_release(&md);
            return kvli_fail(a, &err);
        }
        if (same && partial) {
            kvli_remote_get(old);
            pthread_mutex_unlock(&a->lock);
            st = kvli_remote_merge(a, old, &md, &err);
            kvli_remote_put(a, old);
            if (st == KVL_OK && name_out)
                snprintf(name_out, name_cap, "%s", md.name);
            kvli_md_release(&md);
            return st == KVL_OK ? KVL_OK : kvli_fail(a, &err);
        }
        if (same && md.generation == old->generation && !old->partial) {
            pthread_mutex_unlock(&a->lock);
            kvli_md_release(&md);
            if (name_out)
                snprintf(name_out, name_cap, "%s", md.name);
            return KVL_OK;
        }
    }
    if (md.flags & KVLI_MD_FLAG_NO_CONN) {
        /* Regions without a way to reach the agent: nothing to merge into. */
        if (old == NULL)
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "partial metadata of agent '%s' carries no "
                     "connection info and agent '%s' is not loaded on agent '%s'", md.name,
                     md.name, a->name);
        else
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "partial metadata of agent '%s' is of a new "
                     "incarnation %016llx (it restarted; %016llx is loaded) and carries no "
                     "connection info", md.name, (unsigned long long)md.incarnation,
                     (unsigned long long)old->incarnation);
        kvli_scopy(err.agent, sizeof(err.agent), md.name);
        kvli_hint(&err, "send its connection info first: its full metadata, or partial metadata "
                        "of no descriptors or with connection info (NIXL: inc_conn_info=True)");
        pthread_mutex_unlock(&a->lock);
        kvli_md_release(&md);
        return kvli_fail(a, &err);
    }
    unsigned nbks = a->nbks;
    struct kvl_backend *bks[KVLI_MAX_BACKENDS];
    memcpy(bks, a->bks, sizeof(bks));
    pthread_mutex_unlock(&a->lock);

    kvli_remote_t *r = calloc(1, sizeof(*r));
    if (r == NULL || (md.n_regions && !(r->regions = calloc(md.n_regions, sizeof(*r->regions))))) {
        free(r);
        kvli_md_release(&md);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_metadata_load: out of memory");
    }
    kvli_scopy(r->name, sizeof(r->name), md.name);
    r->incarnation = md.incarnation;
    r->start_ns = md.start_ns;
    r->generation = md.generation;
    r->partial = partial;
    atomic_init(&r->objref, 1);
    atomic_init(&r->valid, true);
    r->n_regions = md.n_regions;

    kvli_err(&err, KVL_ERR_NO_BACKEND, 0, "agent '%s' cannot be reached through any backend of "
             "agent '%s'", md.name, a->name);
    kvli_scopy(err.agent, sizeof(err.agent), md.name);
    unsigned reachable = 0;
    for (unsigned b = 0; b < nbks; b++) {
        struct kvl_backend *bk = bks[b];
        int mb = -1;
        kvl_error_t berr;
        for (unsigned j = 0; j < md.n_backends; j++)
            if (strcmp(md.backends[j].name, bk->ops->name) == 0)
                mb = (int)j;
        memset(&berr, 0, offsetof(kvl_error_t, causes));
        berr.device = -1;
        if (mb < 0) {
            kvl_bk_error_set(&berr, KVL_ERR_UNSUPPORTED, 0, bk->ops->name, -1,
                             "the remote agent has no %s backend", bk->ops->name);
            kvli_scopy(r->unreachable[b], sizeof(r->unreachable[b]), berr.what);
            kvli_err_add_cause(&err, &berr);
            continue;
        }
        st = bk->ops->peer_load(bk->bk, md.name, md.incarnation, md.backends[mb].conn,
                                md.backends[mb].conn_len, &r->peer[b], &berr);
        if (st != KVL_OK) {
            r->peer[b] = NULL;
            if (berr.code == KVL_OK)
                kvl_bk_error_set(&berr, st, 0, bk->ops->name, -1, "peer_load failed");
            if (!berr.backend[0])
                kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
            kvli_scopy(r->unreachable[b], sizeof(r->unreachable[b]), berr.what);
            kvli_err_add_cause(&err, &berr);
            kvli_log(KVL_LOG_INFO, "core", "agent '%s': remote '%s' not reachable over %s: %s",
                     a->name, md.name, bk->ops->name, berr.what);
            continue;
        }
        reachable++;
        for (uint32_t i = 0; i < md.n_regions; i++) {
            const kvli_md_key_t *key = &md.regions[i].keys[mb];
            if (!key->present)
                continue;
            kvl_region_info_t info = {.addr = md.regions[i].addr, .len = md.regions[i].len,
                                      .kind = md.regions[i].kind, .dev = md.regions[i].dev,
                                      .shm_fd = -1};
            st = bk->ops->rregion_load(bk->bk, r->peer[b], &info, key->data, key->len,
                                       &r->regions[i].rh[b], &berr);
            r->regions[i].keysum = kvli_keysum(r->regions[i].keysum, b, key);
            if (st != KVL_OK) {
                /* A bad key poisons the whole blob: refuse it entirely. */
                if (!berr.backend[0])
                    kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
                kvli_err(&err, st == KVL_ERR_BAD_METADATA ? st : KVL_ERR_BAD_METADATA, 0,
                         "agent '%s': region %u (0x%llx+%llu) has a key backend %s refuses",
                         md.name, i, (unsigned long long)info.addr, (unsigned long long)info.len,
                         bk->ops->name);
                kvli_err_add_cause(&err, &berr);
                kvli_scopy(err.agent, sizeof(err.agent), md.name);
                r->regions[i].rh[b] = NULL;
                kvli_md_release(&md);
                kvli_remote_free(a, r);
                return kvli_fail(a, &err);
            }
        }
    }
    if (reachable == 0) {
        kvli_hint(&err, nbks ? "each backend's reason is listed; create a backend both agents "
                               "share and that can reach the peer"
                             : "create a backend on this agent first");
        kvli_md_release(&md);
        kvli_remote_free(a, r);
        return kvli_fail(a, &err);
    }
    for (uint32_t i = 0; i < md.n_regions; i++) {
        r->regions[i].addr = md.regions[i].addr;
        r->regions[i].len = md.regions[i].len;
        r->regions[i].kind = md.regions[i].kind;
        r->regions[i].dev = md.regions[i].dev;
        if (r->regions[i].len > r->max_len)
            r->max_len = r->regions[i].len;
    }
    if (r->n_regions > 1) /* none: regions is NULL, which qsort must not get */
        qsort(r->regions, r->n_regions, sizeof(*r->regions), kvli_rregion_cmp);
    kvli_md_release(&md);

    /* Swap in, re-checking: another thread may have loaded meanwhile. */
    pthread_mutex_lock(&a->lock);
    old = kvli_remote_find(a, r->name);
    if (old != NULL && partial && old->incarnation == r->incarnation) {
        /* loaded meanwhile: merge into it instead of replacing it */
        pthread_mutex_unlock(&a->lock);
        kvli_remote_free(a, r);
        return kvl_metadata_load(a, blob, len, name_out, name_cap);
    }
    if (old != NULL) {
        bool same = old->incarnation == r->incarnation;
        if ((same && (r->generation < old->generation ||
                      (r->generation == old->generation && !old->partial))) ||
            (!same && r->start_ns < old->start_ns)) {
            pthread_mutex_unlock(&a->lock);
            kvli_remote_free(a, r);
            if (name_out)
                snprintf(name_out, name_cap, "%s", old->name);
            return KVL_OK; /* someone loaded the same or newer meanwhile */
        }
        kvli_remote_unlink(a, old);
    }
    kvli_remote_link(a, r);
    pthread_mutex_unlock(&a->lock);
    if (old != NULL) {
        kvli_log(KVL_LOG_INFO, "core", "agent '%s': remote '%s' replaced (%s)", a->name, r->name,
                 old->incarnation == r->incarnation ? "new generation" : "new incarnation: it restarted");
        kvli_remote_quiesce(a, old);
        kvli_remote_put(a, old);
    }
    if (name_out)
        snprintf(name_out, name_cap, "%s", r->name);
    return KVL_OK;
}

kvl_status_t kvl_remote_remove(kvl_agent_t *a, const char *name)
{
    if (a == NULL || name == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_remote_remove: NULL argument");
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *r = kvli_remote_find(a, name);
    if (r == NULL) {
        pthread_mutex_unlock(&a->lock);
        return kvli_fail_simple(a, KVL_ERR_NOT_FOUND, "it was never loaded or is already removed",
                                "remote agent '%s' is not loaded on agent '%s'", name, a->name);
    }
    kvli_remote_unlink(a, r);
    pthread_mutex_unlock(&a->lock);
    kvli_remote_quiesce(a, r);
    kvli_remote_put(a, r);
    return KVL_OK;
}

kvl_status_t kvl_remote_check(kvl_agent_t *a, const char *name)
{
    if (a == NULL || name == NULL)
        return KVL_ERR_INVALID_ARG;
    pthread_mutex_lock(&a->lock);
    kvl_status_t st = kvli_remote_find(a, name) ? KVL_OK : KVL_ERR_NOT_FOUND;
    pthread_mutex_unlock(&a->lock);
    return st;
}

uint64_t kvl_remote_incarnation(kvl_agent_t *a, const char *name)
{
    uint64_t inc = 0;
    if (a == NULL || name == NULL)
        return 0;
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *r = kvli_remote_find(a, name);
    if (r)
        inc = r->incarnation;
    pthread_mutex_unlock(&a->lock);
    return inc;
}

kvl_status_t kvl_remote_regions(kvl_agent_t *a, const char *name, kvl_mem_desc_t *out,
                                kvl_mem_kind_t *kinds, size_t max, size_t *n_p)
{
    if (a == NULL || name == NULL || n_p == NULL || (out == NULL && max > 0))
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_remote_regions: NULL argument");
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *r = kvli_remote_find(a, name);
    if (r == NULL) {
        pthread_mutex_unlock(&a->lock);
        return kvli_fail_simple(a, KVL_ERR_NOT_FOUND, "load its metadata first (kvl_metadata_load)",
                                "remote agent '%s' is not loaded on agent '%s'", name, a->name);
    }
    for (size_t i = 0; i < r->n_regions && i < max; i++) {
        out[i] = (kvl_mem_desc_t){r->regions[i].addr, r->regions[i].len, r->regions[i].dev};
        if (kinds)
            kinds[i] = r->regions[i].kind;
    }
    *n_p = r->n_regions;
    pthread_mutex_unlock(&a->lock);
    return KVL_OK;
}

size_t kvl_remote_describe(kvl_agent_t *a, const char *name, char *buf, size_t len)
{
    size_t need = 0;
    if (buf && len)
        buf[0] = '\0';
    if (a == NULL || name == NULL)
        return 0;
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *r = kvli_remote_find(a, name);
    for (unsigned b = 0; r && b < a->nbks; b++) {
        char line[512];
        struct kvl_backend *bk = a->bks[b];
        if (r->peer[b] == NULL)
            snprintf(line, sizeof(line), "%s: unreachable: %.400s\n", bk->ops->name,
                     r->unreachable[b][0] ? r->unreachable[b] : "no connection info");
        else {
            char d[400] = "";
            if (bk->ops->peer_describe)
                bk->ops->peer_describe(bk->bk, r->peer[b], d, sizeof(d));
            snprintf(line, sizeof(line), "%s: %s\n", bk->ops->name, d[0] ? d : "connected");
        }
        size_t room = need < len ? len - need : 0;
        int w = snprintf(room ? buf + need : NULL, room, "%s", line);
        if (w > 0)
            need += (size_t)w;
    }
    pthread_mutex_unlock(&a->lock);
    return need;
}

kvli_remote_t *kvli_remote_acquire_for(kvl_agent_t *a, const char *name, kvl_mem_kind_t kind,
                                       kvl_error_t *err)
{
    if (kind != KVL_MEM_FILE || strcmp(name, a->name) != 0)
        return kvli_remote_acquire(a, name, err);
    pthread_mutex_lock(&a->lock);
    kvli_remote_t *r = a->self_rem;
    if (r == NULL && (r = calloc(1, sizeof(*r))) != NULL) {
        kvli_scopy(r->name, sizeof(r->name), a->name);
        r->incarnation = a->incarnation;
        r->self_files = true;
        atomic_init(&r->objref, 1); /* the agent's */
        atomic_init(&r->valid, true);
        a->self_rem = r;
    }
    if (r != NULL)
        kvli_remote_get(r);
    pthread_mutex_unlock(&a->lock);
    if (r == NULL)
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory preparing FILE transfers");
    return r;
}

void kvli_remotes_destroy(kvl_agent_t *a)
{
    if (a->self_rem != NULL) {
        kvli_remote_put(a, a->self_rem); /* no transfer or list holds it any more */
        a->self_rem = NULL;
    }
    for (;;) {
        pthread_mutex_lock(&a->lock);
        kvli_remote_t *r = a->remotes;
        if (r)
            kvli_remote_unlink(a, r);
        pthread_mutex_unlock(&a->lock);
        if (r == NULL)
            break;
        kvli_remote_quiesce(a, r);
        kvli_remote_put(a, r);
    }
    free(a->rtab);
    a->rtab = NULL;
    a->rtab_cap = 0;
}
