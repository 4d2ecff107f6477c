/* Prepared lists: every entry checked once against registered memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Map region pointer -> index in prep->regs; open addressing, grows. */
typedef struct {
    void **keys;
    uint32_t *vals;
    size_t cap, n;
} kvli_pmap_t;

static size_t kvli_phash(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

static bool kvli_pmap_grow(kvli_pmap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    void **k = calloc(cap, sizeof(*k));
    uint32_t *v = malloc(cap * sizeof(*v));
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == NULL)
            continue;
        size_t j = kvli_phash(m->keys[i], cap);
        while (k[j])
            j = (j + 1) & (cap - 1);
        k[j] = m->keys[i];
        v[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = k;
    m->vals = v;
    m->cap = cap;
    return true;
}

/* Index of p, inserting it as next (== *n) when new; -1 on OOM. */
static int64_t kvli_pmap_index(kvli_pmap_t *m, void *p, size_t next)
{
    if ((m->n + 1) * 2 > m->cap && !kvli_pmap_grow(m))
        return -1;
    size_t j = kvli_phash(p, m->cap);
    while (m->keys[j]) {
        if (m->keys[j] == p)
            return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = p;
    m->vals[j] = (uint32_t)next;
    m->n++;
    return (int64_t)next;
}

static void kvli_describe_miss(kvl_error_t *err, size_t i, const kvli_dent_t *e, uint64_t span,
                               uint64_t near_addr, uint64_t near_len, bool have_near,
                               const char *whose)
{
    char where[160] = "";
    if (have_near) {
        if (e->addr < near_addr)
            snprintf(where, sizeof(where), "; it starts %llu bytes before it",
                     (unsigned long long)(near_addr - e->addr));
        else if (e->addr >= near_addr + near_len)
            snprintf(where, sizeof(where), "; it starts %llu bytes past its end",
                     (unsigned long long)(e->addr - near_addr - near_len));
        else
            snprintf(where, sizeof(where), "; it runs %llu bytes past its end",
                     (unsigned long long)(e->addr + span - near_addr - near_len));
    }
    if (e->count > 1)
        kvli_err(err, KVL_ERR_OUT_OF_BOUNDS, 0,
                 "descriptor %zu (strided: base 0x%llx, stride %llu, count %llu, len %llu; "
                 "spans 0x%llx..0x%llx) is not inside one region %s registered%s",
                 i, (unsigned long long)e->addr, (unsigned long long)e->stride,
                 (unsigned long long)e->count, (unsigned long long)e->len,
                 (unsigned long long)e->addr, (unsigned long long)(e->addr + span), whose, where);
    else
        kvli_err(err, KVL_ERR_OUT_OF_BOUNDS, 0,
                 "descriptor %zu (0x%llx+%llu) is outside memory %s registered%s", i,
                 (unsigned long long)e->addr, (unsigned long long)e->len, whose, where);
    if (have_near)
        kvli_hint(err, "nearest registered region: 0x%llx+%llu; register the memory first, or fix "
                       "the address/length%s", (unsigned long long)near_addr,
                  (unsigned long long)near_len,
                  e->count > 1 ? " (split a strided entry that crosses regions)" : "");
    else
        kvli_hint(err, "no memory is registered there; register it first%s",
                  whose[0] == 't' ? "" : " and reload the remote agent's metadata");
    kvli_err_region(err, "descriptor %zu", i);
}

/* Whether [addr, addr+span) is covered end to end by two or more
 * registrations (adjacent or overlapping), as engines register one region
 * per layer or tensor: how many, with the first two. 0 when not covered. */
static unsigned kvli_span_chain(kvl_agent_t *a, const kvli_remote_t *rem, uint64_t addr,
                                uint64_t span, uint64_t ra[2], uint64_t rl[2])
{
    uint64_t at = addr, end = addr + span;
    unsigned n = 0;
    while (at < end && n < 4096) {
        uint64_t ga, gl;
        if (rem != NULL) {
            const kvli_rregion_t *g = kvli_rregion_find(rem, at, 1);
            if (g == NULL)
                return 0;
            ga = g->addr, gl = g->len;
        } else {
            const kvli_region_t *r = kvli_registry_find(a, at, 1);
            if (r == NULL)
                return 0;
            ga = r->addr, gl = r->len;
        }
        if (n < 2)
            ra[n] = ga, rl[n] = gl;
        n++;
        at = ga + gl;
    }
    return at >= end && n >= 2 ? n : 0;
}

/* A descriptor that crosses from one registration into the next. */
static void kvli_describe_chain(kvl_error_t *err, size_t i, const kvli_dent_t *e, uint64_t span,
                                unsigned n, const uint64_t ra[2], const uint64_t rl[2],
                                const char *whose)
{
    kvli_err(err, KVL_ERR_OUT_OF_BOUNDS, 0,
             "descriptor %zu (0x%llx+%llu%s) crosses %u registrations of %s: it starts in "
             "0x%llx+%llu and goes on into 0x%llx+%llu%s; a descriptor must lie inside one "
             "registration", i, (unsigned long long)e->addr, (unsigned long long)span,
             e->count > 1 ? ", strided" : "", n, whose, (unsigned long long)ra[0],
             (unsigned long long)rl[0], (unsigned long long)ra[1], (unsigned long long)rl[1],
             n > 2 ? " and more" : "");
    kvli_hint(err, "split the descriptor at 0x%llx where the first registration ends, or "
                   "register the whole range once (deregister the parts first)",
              (unsigned long long)(ra[0] + rl[0]));
    kvli_err_region(err, "descriptor %zu", i);
}

kvl_status_t kvli_prep_build(kvl_agent_t *a, kvli_remote_t *rem, const kvl_dlist_t *dl,
                             kvl_prep_t **prep_p, kvl_error_t *err)
{
    kvl_prep_t *p = calloc(1, sizeof(*p));
    kvli_pmap_t map = {0};
    size_t capregs = 0;
    kvl_status_t st = KVL_OK;
    char whose[96];

    if (p == NULL || (dl->n && !(p->ents = kvli_buf_alloc(dl->n * sizeof(*p->ents))))) {
        free(p);
        kvli_err(err, KVL_ERR_NO_MEMORY, 0, "cannot prepare a list of %zu entries", dl->n);
        return KVL_ERR_NO_MEMORY;
    }
    p->agent = a;
    p->remote = rem != NULL;
    p->rem = rem;
    /* FILE transfers name this agent as the remote: its own registry. */
    bool lookup_local = rem == NULL || rem->self_files;
    p->self_files = rem != NULL && rem->self_files;
    p->kind = dl->kind;
    p->n = dl->n;
    atomic_init(&p->refs, 1);
    pthread_mutex_init(&p->tab_lock, NULL);
    p->uniform = dl->n > 0;
    p->ulen = dl->n > 0 ? dl->ents[0].len : 0;
    if (!lookup_local)
        snprintf(whose, sizeof(whose), "remote agent '%s'", rem->name);
    else
        snprintf(whose, sizeof(whose), "this agent ('%s')", a->name);

    void *last = NULL;
    uint32_t last_idx = 0;
    uint64_t last_lo = 1, last_hi = 0; /* empty */
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < dl->n; i++) {
        const kvli_dent_t *e = &dl->ents[i];
        uint64_t span = e->stride * (e->count - 1) + e->len; /* checked at add */
        void *reg;
        kvl_mem_kind_t kind;
        int32_t dev;
        uint64_t raddr, rlen;

        if (e->addr >= last_lo && e->addr <= last_hi && span <= last_hi - e->addr) {
            reg = last; /* fast path: same region as the entry before */
        } else if (!lookup_local) {
            const kvli_rregion_t *g = kvli_rregion_find(rem, e->addr, span);
            uint64_t ca[2], cl[2];
            unsigned nc = g == NULL ? kvli_span_chain(a, rem, e->addr, span, ca, cl) : 0;
            if (nc > 0) {
                kvli_describe_chain(err, i, e, span, nc, ca, cl, whose);
                kvli_scopy(err->agent, sizeof(err->agent), rem->name);
                st = KVL_ERR_OUT_OF_BOUNDS;
                break;
            }
            if (g == NULL) {
                const kvli_rregion_t *nr = kvli_rregion_nearest(rem, e->addr);
                kvli_describe_miss(err, i, e, span, nr ? nr->addr : 0, nr ? nr->len : 0, nr != NULL,
                                   whose);
                kvli_scopy(err->agent, sizeof(err->agent), rem->name);
                st = KVL_ERR_OUT_OF_BOUNDS;
                break;
            }
            reg = (void *)g;
            kind = g->kind, dev = g->dev, raddr = g->addr, rlen = g->len;
            goto check;
        } else {
            kvli_region_t *r = kvli_registry_find(a, e->addr, span);
            uint64_t ca[2], cl[2];
            unsigned nc = r == NULL ? kvli_span_chain(a, NULL, e->addr, span, ca, cl) : 0;
            if (nc > 0) {
                kvli_describe_chain(err, i, e, span, nc, ca, cl, whose);
                st = KVL_ERR_OUT_OF_BOUNDS;
                break;
            }
            if (r == NULL && dl->kind == KVL_MEM_FILE) {
                kvli_err(err, KVL_ERR_OUT_OF_BOUNDS, 0,
                         "descriptor %zu (fd %d, offset %llu, len %llu%s) is not inside a FILE "
                         "range registered on agent '%s'", i, (int)e->dev,
                         (unsigned long long)kvli_file_off(e->addr), (unsigned long long)span,
                         e->count > 1 ? ", strided" : "", a->name);
                kvli_hint(err, "register (offset, length, fd) of the file first (kind FILE); a "
                               "descriptor names the fd it was registered with (a dup or a "
                               "reopened file is another fd) and lies inside one registration");
                kvli_err_region(err, "descriptor %zu", i);
                st = KVL_ERR_OUT_OF_BOUNDS;
                break;
            }
            if (r == NULL) {
                kvli_region_t *nr = kvli_registry_nearest(a, e->addr);
                kvli_describe_miss(err, i, e, span, nr ? nr->addr : 0, nr ? nr->len : 0, nr != NULL,
                                   whose);
                st = KVL_ERR_OUT_OF_BOUNDS;
                break;
            }
            reg = r;
            kind = r->kind, dev = r->dev, raddr = r->addr, rlen = r->len;
        check:
            if (kind != dl->kind) {
                kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                         "descriptor %zu (0x%llx+%llu): list is %s but the region it lies in "
                         "(0x%llx+%llu) is %s", i, (unsigned long long)e->addr,
                         (unsigned long long)e->len, kvl_mem_kind_name(dl->kind),
                         (unsigned long long)raddr, (unsigned long long)rlen, kvl_mem_kind_name(kind));
                kvli_hint(err, "create the list with the kind the memory was registered as");
                st = KVL_ERR_DEVICE_MISMATCH;
                break;
            }
            if (e->dev != KVL_DEV_ANY && e->dev != dev) {
                kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                         "descriptor %zu (0x%llx+%llu) declares device %d but lies in %s region "
                         "0x%llx+%llu of device %d", i, (unsigned long long)e->addr,
                         (unsigned long long)e->len, e->dev, kvl_mem_kind_name(kind),
                         (unsigned long long)raddr, (unsigned long long)rlen, dev);
                kvli_hint(err, "pass the device the region was registered on, or KVL_DEV_ANY");
                err->device = e->dev;
                st = KVL_ERR_DEVICE_MISMATCH;
                break;
            }
            int64_t idx = kvli_pmap_index(&map, reg, p->nregs);
            if (idx < 0) {
                st = KVL_ERR_NO_MEMORY;
                kvli_err(err, st, 0, "out of memory preparing %zu entries", dl->n);
                break;
            }
            if ((size_t)idx == p->nregs) {
                if (p->nregs == capregs) {
                    capregs = capregs ? capregs * 2 : 8;
                    void **nr = realloc(p->regs, capregs * sizeof(*nr));
                    if (nr == NULL) {
                        st = KVL_ERR_NO_MEMORY;
                        kvli_err(err, st, 0, "out of memory preparing %zu entries", dl->n);
                        break;
                    }
                    p->regs = nr;
                }
                p->regs[p->nregs++] = reg;
                if (lookup_local)
                    kvli_region_get(reg);
            }
            last = reg;
            last_idx = (uint32_t)idx;
            last_lo = raddr;
            last_hi = raddr + rlen;
        }
        p->ents[i] = (kvli_pent_t){e->addr, e->count > 1 ? e->stride : 0, e->count, e->len, last_idx};
        if (e->count != 1 || e->len != p->ulen)
            p->uniform = false;
        /* The fast path skips the device check: recheck it cheaply. */
        if (reg == last && e->dev != KVL_DEV_ANY) {
            int32_t rdev = !lookup_local ? ((const kvli_rregion_t *)reg)->dev
                                         : ((kvli_region_t *)reg)->dev;
            if (rdev != e->dev) {
                kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                         "descriptor %zu (0x%llx+%llu) declares device %d but its region is on "
                         "device %d", i, (unsigned long long)e->addr, (unsigned long long)e->len,
                         e->dev, rdev);
                kvli_hint(err, "pass the device the region was registered on, or KVL_DEV_ANY");
                err->device = e->dev;
                st = KVL_ERR_DEVICE_MISMATCH;
                break;
            }
        }
    }
    if (rem && st == KVL_OK)
        kvli_remote_get(rem);
    pthread_mutex_unlock(&a->lock);
    free(map.keys);
    free(map.vals);
    if (st != KVL_OK) {
        p->rem = NULL; /* no reference was taken */
        kvli_prep_free(p);
        return st;
    }
    *prep_p = p;
    return KVL_OK;
}

void kvli_prep_ref(kvl_prep_t *p)
{
    atomic_fetch_add(&p->refs, 1);
}

void kvli_prep_unref(kvl_prep_t *p)
{
    if (p != NULL && atomic_fetch_sub(&p->refs, 1) == 1)
        kvli_prep_free(p);
}

const kvl_bk_ptab_t *kvli_prep_tab(kvl_prep_t *p)
{
    static atomic_uint_fast64_t ids;
    pthread_mutex_lock(&p->tab_lock);
    if (p->tab_addrs == NULL) {
        uint64_t *ad = kvli_buf_alloc(p->n * sizeof(*ad));
        uint32_t *rg = kvli_buf_alloc(p->n * sizeof(*rg));
        if (ad == NULL || rg == NULL) {
            kvli_buf_free(ad, p->n * sizeof(*ad));
            kvli_buf_free(rg, p->n * sizeof(*rg));
            pthread_mutex_unlock(&p->tab_lock);
            return NULL;
        }
        for (size_t i = 0; i < p->n; i++) {
            ad[i] = p->ents[i].addr;
            rg[i] = p->ents[i].reg;
        }
        p->tab = (kvl_bk_ptab_t){atomic_fetch_add(&ids, 1) + 1, p->n, p->ulen, ad, rg, p->nregs};
        p->tab_regs = rg;
        p->tab_addrs = ad;
    }
    pthread_mutex_unlock(&p->tab_lock);
    return &p->tab;
}

/* Only through kvli_prep_unref or at agent destroy (no transfer left). */
void kvli_prep_free(kvl_prep_t *p)
{
    if (p == NULL)
        return;
    for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++) {
        if (p->bk_cache[b] == NULL || b >= p->agent->nbks)
            continue;
        struct kvl_backend *bk = p->agent->bks[b];
        if (KVLI_OPS_HAS(bk->ops, ptab_release))
            bk->ops->ptab_release(bk->bk, p->bk_cache[b]);
    }
    kvli_buf_free(p->tab_addrs, p->n * sizeof(*p->tab_addrs));
    kvli_buf_free(p->tab_regs, p->n * sizeof(*p->tab_regs));
    pthread_mutex_destroy(&p->tab_lock);
    if (!p->remote || p->self_files)
        for (size_t i = 0; i < p->nregs; i++)
            kvli_region_put(p->regs[i]);
    if (p->rem)
        kvli_remote_put(p->agent, p->rem);
    free(p->regs);
    kvli_buf_free(p->ents, p->n * sizeof(*p->ents));
    free(p);
}

/*
 * A new uniform list: the backends that move indexed transfers derive their
 * tables from it now (ptab_prepare), each with the list's region handles on
 * it, instead of at the first transfer. Nothing here fails the preparation.
 */
static void kvli_prep_warm(kvl_agent_t *a, kvl_prep_t *p)
{
    void **mh;
    if (!p->uniform || p->self_files || p->kind == KVL_MEM_FILE || p->n == 0 ||
        p->n > UINT32_MAX || (mh = malloc((p->nregs + 1) * sizeof(*mh))) == NULL)
        return;
    for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++) {
        struct kvl_backend *bk = NULL;
        bool all = true;
        /* The list holds its regions (and its remote) referenced, so the
         * records stay; a local region's backend handles go when it is
         * deregistered, which its pins refuse while ptab_prepare reads them
         * outside the lock. Read them as pick_backend does. */
        pthread_mutex_lock(&a->lock);
        if (b < a->nbks)
            bk = a->bks[b];
        if (bk == NULL || !KVLI_OPS_HAS(bk->ops, ptab_prepare) ||
            !(bk->ops->caps & KVL_BK_CAP_INDEXED) || p->bk_cache[b] != NULL)
            all = false;
        for (size_t i = 0; all && i < p->nregs; i++) {
            mh[i] = p->remote ? ((const kvli_rregion_t *)p->regs[i])->rh[b]
                              : ((kvli_region_t *)p->regs[i])->mh[b];
            all = mh[i] != NULL;
        }
        bool pinned = all && !p->remote;
        for (size_t i = 0; pinned && i < p->nregs; i++)
            atomic_fetch_add(&((kvli_region_t *)p->regs[i])->pins, 1);
        pthread_mutex_unlock(&a->lock);
        const kvl_bk_ptab_t *t = all ? kvli_prep_tab(p) : NULL;
        if (t != NULL)
            bk->ops->ptab_prepare(bk->bk, t, mh, p->remote ? 1 : 0, &p->bk_cache[b]);
        for (size_t i = 0; pinned && i < p->nregs; i++)
            atomic_fetch_sub(&((kvli_region_t *)p->regs[i])->pins, 1);
    }
    free(mh);
}

static kvl_status_t kvli_prep_api(kvl_agent_t *a, const char *remote, const kvl_dlist_t *dl,
                                  kvl_prep_t **prep_p)
{
    kvl_error_t err;
    kvli_remote_t *rem = NULL;
    if (prep_p)
        *prep_p = NULL;
    if (a == NULL || dl == NULL || prep_p == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_prep: NULL argument");
    if (remote && (rem = kvli_remote_acquire_for(a, remote, dl->kind, &err)) == NULL)
        return kvli_fail(a, &err);
    kvl_status_t st = kvli_prep_build(a, rem, dl, prep_p, &err);
    if (rem)
        kvli_remote_put(a, rem);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    kvli_prep_warm(a, *prep_p);
    pthread_mutex_lock(&a->lock);
    (*prep_p)->next = a->preps;
    if (a->preps)
        a->preps->prev = *prep_p;
    a->preps = *prep_p;
    pthread_mutex_unlock(&a->lock);
    return KVL_OK;
}

kvl_status_t kvl_prep_local(kvl_agent_t *a, const kvl_dlist_t *dl, kvl_prep_t **prep_p)
{
    return kvli_prep_api(a, NULL, dl, prep_p);
}

kvl_status_t kvl_prep_remote(kvl_agent_t *a, const char *remote, const kvl_dlist_t *dl,
                             kvl_prep_t **prep_p)
{
    if (remote == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_prep_remote: remote is NULL");
    return kvli_prep_api(a, remote, dl, prep_p);
}

void kvl_prep_release(kvl_prep_t *p)
{
    if (p == NULL)
        return;
    kvl_agent_t *a = p->agent;
    pthread_mutex_lock(&a->lock);
    if (p->prev)
        p->prev->next = p->next;
    else if (a->preps == p)
        a->preps = p->next;
    if (p->next)
        p->next->prev = p->prev;
    pthread_mutex_unlock(&a->lock);
    kvli_prep_unref(p);
}

size_t kvl_prep_entries(const kvl_prep_t *p)
{
    return p ? p->n : 0;
}
