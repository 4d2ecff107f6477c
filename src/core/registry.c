/*
 * Local memory: registration with per-backend outcomes, reference counting,
 * all-or-nothing lists, deregistration guards, shareable allocations.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
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

kvli_region_t *kvli_registry_find(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    kvli_region_t *r = a->last_hit;
    if (r != NULL && addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr))
        return r;
    /* Regions may overlap: walk back from the last start <= addr while a
     * region that long could still reach addr. */
    size_t i = kvli_registry_lower(a, addr, UINT64_MAX);
    while (i > 0) {
        r = a->regs[--i];
        if (addr - r->addr > a->max_len)
            break;
        if (addr - r->addr <= r->len && len <= r->len - (addr - r->addr)) {
            a->last_hit = r;
            return r;
        }
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
    return best;
}

static kvl_status_t kvli_registry_insert(kvl_agent_t *a, kvli_region_t *r, kvl_error_t *err)
{
    if (a->nregs == a->capregs) {
        size_t cap = a->capregs ? a->capregs * 2 : 64;
        kvli_region_t **n = realloc(a->regs, cap * sizeof(*n));
        if (n == NULL) {
            kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "registry: cannot grow to %zu regions", cap);
            return KVL_ERR_NO_MEMORY;
        }
        a->regs = n;
        a->capregs = cap;
    }
    size_t i = kvli_registry_lower(a, r->addr, r->len);
    memmove(&a->regs[i + 1], &a->regs[i], (a->nregs - i) * sizeof(*a->regs));
    a->regs[i] = r;
    a->nregs++;
    if (r->len > a->max_len)
        a->max_len = r->len;
    return KVL_OK;
}

static void kvli_registry_remove(kvl_agent_t *a, kvli_region_t *r)
{
    size_t i = kvli_registry_lower(a, r->addr, r->len);
    while (i < a->nregs && a->regs[i] != r)
        i++;
    if (i == a->nregs)
        return;
    memmove(&a->regs[i], &a->regs[i + 1], (a->nregs - i - 1) * sizeof(*a->regs));
    a->nregs--;
    if (a->last_hit == r)
        a->last_hit = NULL;
}

static kvli_region_t *kvli_registry_exact(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    size_t i = kvli_registry_lower(a, addr, len);
    if (i < a->nregs && a->regs[i]->addr == addr && a->regs[i]->len == len)
        return a->regs[i];
    return NULL;
}

static const kvli_alloc_t *kvli_alloc_containing(const kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < a->nallocs; i++) {
        const kvli_alloc_t *al = &a->allocs[i];
        uint64_t base = (uint64_t)(uintptr_t)al->ptr;
        if (al->fd < 0)
            continue; /* a backend's allocation: that backend knows it */
        if (addr >= base && addr - base <= al->len && len <= al->len - (addr - base))
            return al;
    }
    return NULL;
}

/* Undo one backend registration set; the region leaves every backend. */
static void kvli_region_unregister_backends(kvl_agent_t *a, kvli_region_t *r)
{
    for (int b = (int)a->nbks - 1; b >= 0; b--) {
        if (r->bk_mask & (1u << b)) {
            a->bks[b]->ops->mem_dereg(a->bks[b]->bk, r->mh[b]);
            r->mh[b] = NULL;
        }
    }
    r->bk_mask = 0;
}

static bool kvli_numa_node_exists(int32_t node)
{
    char path[64];
    if (node == 0)
        return true;
    snprintf(path, sizeof(path), "/sys/devices/system/node/node%d", node);
    return access(path, F_OK) == 0;
}

/* Decide kind and device of one range: ask backends that know special
 * memory (CUDA), else it must be mapped host memory. */
static kvl_status_t kvli_mem_classify(kvl_agent_t *a, const kvl_mem_desc_t *d,
                                      kvl_mem_kind_t declared, kvl_mem_kind_t *kind_p,
                                      int32_t *dev_p, kvl_error_t *err)
{
    const kvl_backend_ops_t *ops;
    kvl_error_t qerr, why; /* why: a backend's reason for not claiming declared memory */
    bool have_why = false;
    for (size_t i = 0; (ops = kvli_backend_builtin(i)) != NULL; i++) {
        kvl_mem_kind_t k;
        int32_t dev;
        char info[256] = "";
        if (ops->size < offsetof(kvl_backend_ops_t, mem_query) + sizeof(ops->mem_query) ||
            ops->mem_query == NULL)
            continue;
        memset(&qerr, 0, offsetof(kvl_error_t, causes));
        qerr.device = -1;
        kvl_status_t st = ops->mem_query(d->addr, d->len, d->dev, &k, &dev, info, sizeof(info),
                                         &qerr);
        if (st == KVL_ERR_NOT_FOUND) {
            /* A backend may say why it does not claim the memory (no CUDA
             * driver, freed GPU memory): keep the first such reason from a
             * backend serving the declared kind. */
            if (!have_why && qerr.code != KVL_OK && declared != KVL_MEM_AUTO &&
                declared != KVL_MEM_DRAM && (ops->mem_local & KVL_MEM_BIT(declared))) {
                memcpy(&why, &qerr, offsetof(kvl_error_t, causes));
                why.n_causes = why.n_causes_dropped = 0;
                if (!why.backend[0])
                    kvli_scopy(why.backend, sizeof(why.backend), ops->name);
                have_why = true;
            }
            continue;
        }
        if (st != KVL_OK) {
            memcpy(err, &qerr, offsetof(kvl_error_t, causes));
            err->n_causes = err->n_causes_dropped = 0;
            if (err->code == KVL_OK)
                kvli_err(err, st, 0, "backend %s refused this memory", ops->name);
            return err->code;
        }
        if (declared != KVL_MEM_AUTO && declared != k) {
            kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                     "declared %s, but the %s backend says this memory is %s%s%.200s",
                     kvl_mem_kind_name(declared), ops->name, kvl_mem_kind_name(k),
                     info[0] ? ": " : "", info);
            kvli_hint(err, "declare %s (or KVL_MEM_AUTO and let kvlane detect it)",
                      kvl_mem_kind_name(k));
            return KVL_ERR_DEVICE_MISMATCH;
        }
        if (d->dev != KVL_DEV_ANY && d->dev != dev) {
            /* the backend should have said so itself; keep a generic net */
            kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                     "declared device %d, but this %s lives on device %d%s%.200s",
                     d->dev, kvl_mem_kind_name(k), dev, info[0] ? " " : "", info);
            kvli_hint(err, "pass the device the memory lives on as this process numbers it "
                           "(or KVL_DEV_ANY to detect it)");
            err->device = d->dev;
            return KVL_ERR_DEVICE_MISMATCH;
        }
        *kind_p = k;
        *dev_p = dev;
        return KVL_OK;
    }
    if (declared != KVL_MEM_AUTO && declared != KVL_MEM_DRAM) {
        char names[256] = "";
        size_t off = 0;
        for (unsigned b = 0; b < a->nbks && off < sizeof(names); b++)
            off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%s", b ? ", " : "",
                                    a->bks[b]->ops->name);
        kvli_err(err, KVL_ERR_NO_BACKEND, 0,
                 "%s memory declared, but no backend created on this agent can recognise it "
                 "(created: %s)", kvl_mem_kind_name(declared), a->nbks ? names : "none");
        kvli_hint(err, "%s", declared == KVL_MEM_VRAM
                                 ? "create the cuda backend (kvlane doctor says whether a CUDA "
                                   "driver and GPU are present)"
                                 : "create a backend that serves this memory kind");
        if (have_why) {
            /* e.g. "no CUDA driver found: dlopen(...)": the actual reason */
            kvli_err_add_cause(err, &why);
            if (why.hint[0])
                kvli_hint(err, "%.500s", why.hint);
        }
        return KVL_ERR_NO_BACKEND;
    }
    /* Host memory: the range must be mapped in this process. msync checks
     * the whole range with one call and fails with ENOMEM on any hole. */
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t start = d->addr & ~((uint64_t)pg - 1);
    if (msync((void *)(uintptr_t)start, d->addr + d->len - start, MS_ASYNC) != 0) {
        int e = errno;
        kvli_err(err, KVL_ERR_INVALID_ARG, e,
                 "msync(0x%llx, %llu, MS_ASYNC) failed: the range is not (fully) mapped in "
                 "this process",
                 (unsigned long long)start, (unsigned long long)(d->addr + d->len - start));
        kvli_hint(err, "pass the address and length of memory this process allocated; a GPU "
                       "pointer needs the cuda backend");
        return KVL_ERR_INVALID_ARG;
    }
    if (d->dev != KVL_DEV_ANY && (d->dev < 0 || !kvli_numa_node_exists(d->dev))) {
        kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                 "declared device %d for DRAM, but this host has no NUMA node %d", d->dev,
                 d->dev);
        kvli_hint(err, "for DRAM pass 0 (or the NUMA node the memory is on) or KVL_DEV_ANY; "
                       "a GPU ordinal or TP rank does not belong here");
        err->device = d->dev;
        return KVL_ERR_DEVICE_MISMATCH;
    }
    *kind_p = KVL_MEM_DRAM;
    *dev_p = d->dev == KVL_DEV_ANY ? 0 : d->dev;
    return KVL_OK;
}

static void kvli_outcome(kvl_reg_entry_t *e, const char *backend, kvl_status_t st,
                         const char *detail)
{
    if (e == NULL || e->n_outcomes >= KVL_REG_MAX_OUTCOMES)
        return;
    kvl_reg_outcome_t *o = &e->outcomes[e->n_outcomes++];
    kvli_scopy(o->backend, sizeof(o->backend), backend);
    o->status = st;
    kvli_scopy(o->detail, sizeof(o->detail), detail);
}

/* Pick candidate backends: named ones, or all that serve the kind. */
static kvl_status_t kvli_reg_candidates(kvl_agent_t *a, const kvl_reg_params_t *p,
                                        kvl_mem_kind_t kind, uint32_t *mask_p, kvl_error_t *err)
{
    uint32_t mask = 0;
    bool named = p && (p->field_mask & KVL_REG_PARAM_BACKENDS) && p->n_backends > 0;
    if (named) {
        for (size_t i = 0; i < p->n_backends; i++) {
            unsigned b;
            for (b = 0; b < a->nbks; b++)
                if (p->backends[i] && strcmp(p->backends[i], a->bks[b]->ops->name) == 0)
                    break;
            if (b == a->nbks) {
                kvli_err(err, KVL_ERR_NOT_FOUND, 0,
                         "backend '%s' named for registration is not created on agent '%s'",
                         p->backends[i] ? p->backends[i] : "(null)", a->name);
                kvli_hint(err, "create it first with kvl_backend_create()");
                return KVL_ERR_NOT_FOUND;
            }
            mask |= 1u << b;
        }
    } else {
        for (unsigned b = 0; b < a->nbks; b++)
            if (a->bks[b]->ops->mem_local & KVL_MEM_BIT(kind))
                mask |= 1u << b;
    }
    if (mask == 0) {
        kvli_err(err, KVL_ERR_NO_BACKEND, 0, "no backend created on agent '%s' serves %s memory",
                 a->name, kvl_mem_kind_name(kind));
        for (unsigned b = 0; b < a->nbks; b++) {
            kvl_error_t c;
            kvl_bk_error_set(&c, KVL_ERR_UNSUPPORTED, 0, a->bks[b]->ops->name, -1,
                             "serves %s%s%s locally", (a->bks[b]->ops->mem_local & KVL_MEM_BIT(KVL_MEM_DRAM)) ? "DRAM " : "",
                             (a->bks[b]->ops->mem_local & KVL_MEM_BIT(KVL_MEM_VRAM)) ? "VRAM " : "",
                             (a->bks[b]->ops->mem_local & KVL_MEM_BIT(KVL_MEM_FILE)) ? "FILE" : "");
            c.hint[0] = '\0';
            kvli_err_add_cause(err, &c);
        }
        kvli_hint(err, "create a backend that serves %s (kvl_backend_create)",
                  kvl_mem_kind_name(kind));
        return KVL_ERR_NO_BACKEND;
    }
    *mask_p = mask;
    return KVL_OK;
}

/* Register one range; on success *r_p is the region (new or reused). */
static kvl_status_t kvli_register_one(kvl_agent_t *a, const kvl_mem_desc_t *d,
                                      const kvl_reg_params_t *p, kvl_reg_entry_t *e,
                                      kvli_region_t **r_p, bool *reused_p, kvl_error_t *err)
{
    kvl_mem_kind_t declared = (p && (p->field_mask & KVL_REG_PARAM_KIND)) ? p->kind : KVL_MEM_AUTO;
    kvl_reg_policy_t policy = (p && (p->field_mask & KVL_REG_PARAM_POLICY)) ? p->policy : KVL_REG_ANY;
    kvl_mem_kind_t kind = KVL_MEM_AUTO;
    int32_t dev = KVL_DEV_ANY;
    kvl_status_t st;

    if (e) {
        e->addr = d->addr;
        e->len = d->len;
        e->kind = declared;
        e->dev = d->dev;
    }
    if (d->len == 0 || d->addr == 0 || kvli_add_overflows(d->addr, d->len)) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s",
                 d->addr == 0 ? "address is NULL" : d->len == 0 ? "length is 0"
                                                  : "addr + len wraps past 2^64");
        kvli_hint(err, "pass the start address and byte length of the buffer");
        return KVL_ERR_INVALID_ARG;
    }
    if ((int)declared < KVL_MEM_AUTO || declared > KVL_MEM_FILE || (policy != KVL_REG_ANY && policy != KVL_REG_ALL)) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "memory kind %d or policy %d is not valid",
                 (int)declared, (int)policy);
        return KVL_ERR_INVALID_ARG;
    }
    if (declared == KVL_MEM_FILE) {
        kvli_err(err, KVL_ERR_UNSUPPORTED, 0, "FILE memory needs the file backend, which this build "
                                              "does not have yet");
        return KVL_ERR_UNSUPPORTED;
    }
    /* The same range again is a lookup, not a registration: it was
     * classified and checked when first registered. */
    kvli_region_t *r = kvli_registry_exact(a, d->addr, d->len);
    if (r != NULL && (declared == KVL_MEM_AUTO || declared == r->kind) &&
        (d->dev == KVL_DEV_ANY || d->dev == r->dev)) {
        kind = r->kind;
        dev = r->dev;
        if (e) {
            e->kind = kind;
            e->dev = dev;
        }
        r->refcount++;
        *r_p = r;
        *reused_p = true;
        if (e) {
            e->reused = 1;
            e->status = KVL_OK;
            for (unsigned b = 0; b < a->nbks; b++)
                if (r->bk_mask & (1u << b)) {
                    char det[64];
                    snprintf(det, sizeof(det), "already registered (refcount %u)", r->refcount);
                    kvli_outcome(e, a->bks[b]->ops->name, KVL_OK, det);
                }
        }
        return KVL_OK;
    }
    st = kvli_mem_classify(a, d, declared, &kind, &dev, err);
    if (st != KVL_OK)
        return st;
    if (e) {
        e->kind = kind;
        e->dev = dev;
    }

    uint32_t mask;
    st = kvli_reg_candidates(a, p, kind, &mask, err);
    if (st != KVL_OK)
        return st;

    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "cannot allocate a region record");
        return KVL_ERR_NO_MEMORY;
    }
    r->addr = d->addr;
    r->len = d->len;
    r->kind = kind;
    r->dev = dev;
    r->refcount = 1;
    atomic_init(&r->objref, 1);
    atomic_init(&r->valid, true);

    kvl_region_info_t info = {.addr = d->addr, .len = d->len, .kind = kind, .dev = dev, .shm_fd = -1};
    const kvli_alloc_t *al = kind == KVL_MEM_DRAM ? kvli_alloc_containing(a, d->addr, d->len) : NULL;
    if (al != NULL) {
        info.shm_fd = al->fd;
        info.shm_id = al->id;
        info.shm_off = d->addr - (uint64_t)(uintptr_t)al->ptr;
        info.shm_size = al->len;
        r->shm_id = al->id;
    }

    kvl_error_t all;
    kvli_err(&all, KVL_ERR_NO_BACKEND, 0, "no backend accepted %s region 0x%llx+%llu",
             kvl_mem_kind_name(kind), (unsigned long long)d->addr, (unsigned long long)d->len);
    unsigned ok = 0, tried = 0;
    for (unsigned b = 0; b < a->nbks; b++) {
        if (!(mask & (1u << b)))
            continue;
        struct kvl_backend *bk = a->bks[b];
        char detail[384] = "";
        kvl_error_t berr;
        memset(&berr, 0, offsetof(kvl_error_t, causes));
        berr.device = -1;
        tried++;
        if (!(bk->ops->mem_local & KVL_MEM_BIT(kind))) {
            kvl_bk_error_set(&berr, KVL_ERR_UNSUPPORTED, 0, bk->ops->name, dev,
                             "backend %s does not serve %s memory", bk->ops->name,
                             kvl_mem_kind_name(kind));
            kvli_outcome(e, bk->ops->name, berr.code, berr.what);
            kvli_err_add_cause(&all, &berr);
            continue;
        }
        st = bk->ops->mem_reg(bk->bk, &info, &r->mh[b], detail, sizeof(detail), &berr);
        if (st == KVL_OK) {
            r->bk_mask |= 1u << b;
            ok++;
            kvli_outcome(e, bk->ops->name, KVL_OK, detail);
        } else {
            if (berr.code == KVL_OK)
                kvl_bk_error_set(&berr, st, 0, bk->ops->name, dev, "mem_reg failed");
            if (!berr.backend[0])
                kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
            char line[384];
            snprintf(line, sizeof(line), "%.200s%s%.170s", berr.what, berr.hint[0] ? "; fix: " : "", berr.hint);
            kvli_outcome(e, bk->ops->name, st, line);
            kvli_err_add_cause(&all, &berr);
        }
    }
    if (ok == 0 || (policy == KVL_REG_ALL && ok != tried)) {
        kvli_region_unregister_backends(a, r);
        free(r);
        if (ok != 0)
            snprintf(all.what, sizeof(all.what),
                     "policy 'all': %u of %u backends refused %s region 0x%llx+%llu (the %u that "
                     "accepted were undone)", tried - ok, tried, kvl_mem_kind_name(kind),
                     (unsigned long long)d->addr, (unsigned long long)d->len, ok);
        memcpy(err, &all, offsetof(kvl_error_t, causes) + all.n_causes * sizeof(all.causes[0]));
        kvli_err_region(err, "region 0x%llx+%llu (%s)", (unsigned long long)d->addr,
                        (unsigned long long)d->len, kvl_mem_kind_name(kind));
        if (err->n_causes == 1) {
            err->sys_errno = err->causes[0].sys_errno;
            err->device = err->causes[0].device;
            kvli_scopy(err->backend, sizeof(err->backend), err->causes[0].backend);
        }
        kvli_hint(err, "each backend's reason is listed as a cause");
        return err->code;
    }
    st = kvli_registry_insert(a, r, err);
    if (st != KVL_OK) {
        kvli_region_unregister_backends(a, r);
        free(r);
        return st;
    }
    *r_p = r;
    *reused_p = false;
    if (e)
        e->status = KVL_OK;
    return KVL_OK;
}

/* Drop one registration reference; the last one unregisters everywhere. */
static void kvli_region_drop(kvl_agent_t *a, kvli_region_t *r)
{
    if (--r->refcount > 0)
        return;
    kvli_registry_remove(a, r);
    atomic_store(&r->valid, false);
    kvli_region_unregister_backends(a, r);
    kvli_region_put(r);
}

kvl_status_t kvl_mem_register(kvl_agent_t *a, const kvl_mem_desc_t *regions, size_t n,
                              const kvl_reg_params_t *params, kvl_reg_report_t **report_p)
{
    kvl_error_t err;
    kvl_reg_report_t *rep = NULL;
    kvl_status_t st = KVL_OK;

    if (report_p)
        *report_p = NULL;
    if (a == NULL || (regions == NULL && n > 0) || n == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, "pass an agent and at least one region",
                                "kvl_mem_register: %s", a == NULL ? "agent is NULL"
                                                        : n == 0 ? "no regions (n = 0)"
                                                                 : "regions is NULL");
    if (report_p) {
        rep = calloc(1, sizeof(*rep));
        if (rep)
            rep->entries = calloc(n, sizeof(*rep->entries));
        if (rep == NULL || rep->entries == NULL) {
            free(rep);
            return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                    "kvl_mem_register: cannot allocate a report for %zu regions", n);
        }
        rep->n_entries = n;
    }
    kvli_region_t **done = malloc(n * sizeof(*done));
    if (done == NULL) {
        kvl_reg_report_free(rep);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_register: out of memory");
    }

    pthread_mutex_lock(&a->lock);
    size_t k;
    for (k = 0; k < n; k++) {
        bool reused = false;
        st = kvli_register_one(a, &regions[k], params, rep ? &rep->entries[k] : NULL, &done[k],
                               &reused, &err);
        if (st != KVL_OK) {
            if (rep)
                rep->entries[k].status = st;
            break;
        }
    }
    if (st != KVL_OK) {
        /* All or nothing: undo 0..k-1 in reverse order. */
        for (size_t j = k; j-- > 0;)
            kvli_region_drop(a, done[j]);
        if (rep)
            for (size_t j = k + 1; j < n; j++)
                rep->entries[j].status = KVL_ERR_CANCELED;
        if (n > 1) {
            char what[sizeof(err.what)];
            kvli_scopy(what, sizeof(what), err.what);
            snprintf(err.what, sizeof(err.what),
                     "region %zu of %zu (0x%llx+%llu): %.400s; regions 0..%zu were undone", k, n,
                     (unsigned long long)regions[k].addr, (unsigned long long)regions[k].len,
                     what, k ? k - 1 : 0);
            if (k == 0)
                snprintf(err.what, sizeof(err.what), "region 0 of %zu (0x%llx+%llu): %.400s", n,
                         (unsigned long long)regions[0].addr,
                         (unsigned long long)regions[0].len, what);
        } else if (!err.region[0]) {
            kvli_err_region(&err, "region 0x%llx+%llu", (unsigned long long)regions[0].addr,
                            (unsigned long long)regions[0].len);
        }
    } else {
        atomic_fetch_add(&a->generation, 1);
    }
    pthread_mutex_unlock(&a->lock);
    free(done);
    if (report_p)
        *report_p = rep;
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

kvl_status_t kvl_mem_deregister(kvl_agent_t *a, const kvl_mem_desc_t *regions, size_t n)
{
    kvl_error_t err;
    if (a == NULL || regions == NULL || n == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_mem_deregister: agent or regions is NULL, or n = 0");
    pthread_mutex_lock(&a->lock);
    /* Check everything first so a refused call changes nothing. Counting
     * duplicates in the request matters: two drops of a refcount-1 range
     * must fail. */
    for (size_t i = 0; i < n; i++) {
        kvli_region_t *r = kvli_registry_exact(a, regions[i].addr, regions[i].len);
        if (r == NULL) {
            kvli_region_t *near = kvli_registry_nearest(a, regions[i].addr);
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0,
                     "deregister: region %zu (0x%llx+%llu) is not registered on agent '%s'", i,
                     (unsigned long long)regions[i].addr, (unsigned long long)regions[i].len,
                     a->name);
            if (near)
                kvli_hint(&err, "deregister exactly the address and length that were registered; "
                                "nearest registered region: 0x%llx+%llu",
                          (unsigned long long)near->addr, (unsigned long long)near->len);
            else
                kvli_hint(&err, "nothing is registered on this agent (already deregistered?)");
            goto fail;
        }
        uint32_t drops = 0;
        for (size_t j = 0; j <= i; j++)
            if (regions[j].addr == r->addr && regions[j].len == r->len)
                drops++;
        if (drops > r->refcount) {
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0,
                     "deregister: region 0x%llx+%llu is registered %u time(s) but this call "
                     "drops it %u times", (unsigned long long)r->addr,
                     (unsigned long long)r->len, r->refcount, drops);
            goto fail;
        }
        if (drops == r->refcount &&
            (atomic_load(&r->inflight) > 0 || atomic_load(&r->pins) > 0)) {
            bool local = atomic_load(&r->inflight) > 0;
            kvli_err(&err, KVL_ERR_IN_USE, 0,
                     "deregister: region 0x%llx+%llu is in use by %u %s", (unsigned long long)r->addr,
                     (unsigned long long)r->len,
                     local ? atomic_load(&r->inflight) : atomic_load(&r->pins),
                     local ? "in-flight transfer(s) of this agent"
                           : "incoming request(s) from a peer being served right now");
            kvli_hint(&err, "wait for the transfers (kvl_xfer_wait) or cancel them, then deregister");
            goto fail;
        }
    }
    for (size_t i = 0; i < n; i++)
        kvli_region_drop(a, kvli_registry_exact(a, regions[i].addr, regions[i].len));
    atomic_fetch_add(&a->generation, 1);
    const kvli_agent_hooks_t *hooks = a->hooks;
    pthread_mutex_unlock(&a->lock);
    if (hooks != NULL && hooks->regions_changed != NULL)
        hooks->regions_changed(a);
    return KVL_OK;
fail:
    pthread_mutex_unlock(&a->lock);
    kvli_err_region(&err, "region 0x%llx+%llu", (unsigned long long)regions[0].addr,
                    (unsigned long long)regions[0].len);
    return kvli_fail(a, &err);
}

void kvli_registry_destroy(kvl_agent_t *a)
{
    /* Reverse order of addresses is what we have; registration order is not
     * kept, and backends need only that each handle is released once. */
    for (size_t i = a->nregs; i-- > 0;) {
        kvli_region_t *r = a->regs[i];
        atomic_store(&r->valid, false);
        kvli_region_unregister_backends(a, r);
        kvli_region_put(r);
    }
    free(a->regs);
    a->regs = NULL;
    a->nregs = a->capregs = 0;
    a->last_hit = NULL;
}

size_t kvl_reg_report_render(const kvl_reg_report_t *rep, char *buf, size_t len)
{
    size_t need = 0;
    if (buf && len)
        buf[0] = '\0';
    if (rep == NULL)
        return 0;
#define KVLI_APPEND(...)                                                              \
    do {                                                                              \
        size_t room = need < len ? len - need : 0;                                    \
        int w = snprintf(room ? buf + need : NULL, room, __VA_ARGS__);                \
        if (w > 0)                                                                    \
            need += (size_t)w;                                                        \
    } while (0)
    KVLI_APPEND("registration report: %zu region(s)\n", rep->n_entries);
    for (size_t i = 0; i < rep->n_entries; i++) {
        const kvl_reg_entry_t *e = &rep->entries[i];
        KVLI_APPEND("  [%zu] 0x%llx+%llu %s dev %d: %s%s\n", i, (unsigned long long)e->addr,
                    (unsigned long long)e->len, kvl_mem_kind_name(e->kind), e->dev,
                    e->status == KVL_OK ? "registered" : e->status == KVL_ERR_CANCELED
                                                           ? "undone (an entry failed)"
                                                           : kvl_status_name(e->status),
                    e->reused ? " (reused)" : "");
        for (unsigned j = 0; j < e->n_outcomes; j++)
            KVLI_APPEND("      %-6s %-4s %s\n", e->outcomes[j].backend,
                        e->outcomes[j].status == KVL_OK ? "ok" : "FAIL", e->outcomes[j].detail);
    }
#undef KVLI_APPEND
    return need;
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

void kvl_reg_report_free(kvl_reg_report_t *rep)
{
    if (rep == NULL)
        return;
    free(rep->entries);
    free(rep);
}

/* ---- shareable allocations ---- */

/* Under the agent lock: room for one more allocation record. */
static bool kvli_allocs_grow(kvl_agent_t *a)
{
    if (a->nallocs < a->capallocs)
        return true;
    size_t cap = a->capallocs ? a->capallocs * 2 : 8;
    kvli_alloc_t *na = realloc(a->allocs, cap * sizeof(*na));
    if (na == NULL)
        return false;
    a->allocs = na;
    a->capallocs = cap;
    return true;
}

kvl_status_t kvl_mem_alloc(kvl_agent_t *a, size_t len, void **ptr_p)
{
    kvl_error_t err;
    if (a == NULL || ptr_p == NULL || len == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_mem_alloc: agent or ptr_p is NULL, or len is 0");
    *ptr_p = NULL;
    char name[96];
    snprintf(name, sizeof(name), "kvlane-%s", a->name);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        kvli_err(&err, KVL_ERR_SYSTEM, errno, "memfd_create(\"%s\") failed", name);
        kvli_hint(&err, "the kernel must support memfd (Linux >= 3.17); check RLIMIT_NOFILE");
        return kvli_fail(a, &err);
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, errno, "ftruncate(memfd, %zu) failed", len);
        kvli_hint(&err, "check memory cgroup limits and free memory");
        close(fd);
        return kvli_fail(a, &err);
    }
    /* Peers map this memfd: forbid shrinking, which would turn their copies
     * into SIGBUS. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        kvli_err(&err, KVL_ERR_SYSTEM, errno, "fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) failed");
        kvli_hint(&err, "the kernel must support memfd sealing (Linux >= 3.17)");
        close(fd);
        return kvli_fail(a, &err);
    }
    /* Populate now: faulting 16 KiB blocks later during a transfer would
     * cost more than the copy itself. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, errno, "mmap(%zu bytes, MAP_SHARED, memfd) failed", len);
        kvli_hint(&err, "check free memory, the memory cgroup limit and vm.max_map_count");
        close(fd);
        return kvli_fail(a, &err);
    }
    pthread_mutex_lock(&a->lock);
    if (!kvli_allocs_grow(a)) {
        pthread_mutex_unlock(&a->lock);
        munmap(p, len);
        close(fd);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_alloc: out of memory");
    }
    a->allocs[a->nallocs++] = (kvli_alloc_t){++a->next_alloc_id, p, len, fd, NULL, NULL};
    pthread_mutex_unlock(&a->lock);
    *ptr_p = p;
    return KVL_OK;
}

kvl_status_t kvl_mem_alloc_ex(kvl_agent_t *a, size_t len, const kvl_alloc_params_t *params,
                              void **ptr_p)
{
    kvl_error_t err;
    const char *name = params && (params->field_mask & KVL_ALLOC_PARAM_BACKEND) ? params->backend
                                                                             : NULL;
    if (name == NULL || name[0] == '\0')
        return kvl_mem_alloc(a, len, ptr_p);
    if (a == NULL || ptr_p == NULL || len == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_mem_alloc_ex: agent or ptr_p is NULL, or len is 0");
    *ptr_p = NULL;
    struct kvl_backend *bk = NULL;
    pthread_mutex_lock(&a->lock);
    for (unsigned b = 0; b < a->nbks; b++)
        if (strcmp(a->bks[b]->ops->name, name) == 0)
            bk = a->bks[b];
    pthread_mutex_unlock(&a->lock);
    if (bk == NULL) {
        kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "kvl_mem_alloc_ex: backend '%s' is not created on "
                 "agent '%s'", name, a->name);
        kvli_scopy(err.backend, sizeof(err.backend), name);
        kvli_hint(&err, "create the backend first (kvl_backend_create or the agent's "
                  "create_backends), or leave the backend unset for memfd memory");
        return kvli_fail(a, &err);
    }
    const kvl_backend_ops_t *ops = bk->ops;
    if (ops->size < offsetof(kvl_backend_ops_t, mem_free) + sizeof(ops->mem_free) ||
        ops->mem_alloc == NULL || ops->mem_free == NULL) {
        kvli_err(&err, KVL_ERR_UNSUPPORTED, 0, "kvl_mem_alloc_ex: backend '%s' does not "
                 "allocate memory", name);
        kvli_scopy(err.backend, sizeof(err.backend), name);
        kvli_hint(&err, "name a backend that allocates (ucx), or use kvl_mem_alloc() (memfd "
                  "memory, which the shm backend maps)");
        return kvli_fail(a, &err);
    }
    void *p = NULL, *ah = NULL;
    char detail[256] = "";
    memset(&err, 0, offsetof(kvl_error_t, causes));
    err.device = -1;
    kvl_status_t st = ops->mem_alloc(bk->bk, len, &p, &ah, detail, sizeof(detail), &err);
    if (st != KVL_OK) {
        if (err.code == KVL_OK)
            kvl_bk_error_set(&err, st, 0, name, -1, "mem_alloc failed");
        if (!err.backend[0])
            kvli_scopy(err.backend, sizeof(err.backend), name);
        return kvli_fail(a, &err);
    }
    pthread_mutex_lock(&a->lock);
    if (!kvli_allocs_grow(a)) {
        ops->mem_free(bk->bk, ah);
        pthread_mutex_unlock(&a->lock);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_alloc_ex: out of memory");
    }
    a->allocs[a->nallocs++] = (kvli_alloc_t){++a->next_alloc_id, p, len, -1, bk, ah};
    pthread_mutex_unlock(&a->lock);
    kvli_log(KVL_LOG_INFO, "core", "agent '%s': %zu bytes at %p allocated by backend %s (%s)",
             a->name, len, p, name, detail);
    *ptr_p = p;
    return KVL_OK;
}

/* Under the agent lock. */
static void kvli_alloc_release(kvli_alloc_t *al)
{
    if (al->bk != NULL) {
        al->bk->ops->mem_free(al->bk->bk, al->ah);
    } else {
        munmap(al->ptr, al->len);
        close(al->fd);
    }
}

kvl_status_t kvl_mem_free(kvl_agent_t *a, void *ptr)
{
    kvl_error_t err;
    if (a == NULL || ptr == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_mem_free: agent or ptr is NULL");
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->nallocs; i++) {
        kvli_alloc_t *al = &a->allocs[i];
        if (al->ptr != ptr)
            continue;
        uint64_t base = (uint64_t)(uintptr_t)al->ptr;
        for (size_t j = 0; j < a->nregs; j++) {
            kvli_region_t *r = a->regs[j];
            if (r->addr < base + al->len && base < r->addr + r->len) {
                kvli_err(&err, KVL_ERR_IN_USE, 0,
                         "kvl_mem_free: allocation %p still has registered region 0x%llx+%llu",
                         ptr, (unsigned long long)r->addr, (unsigned long long)r->len);
                kvli_hint(&err, "deregister its regions first");
                pthread_mutex_unlock(&a->lock);
                return kvli_fail(a, &err);
            }
        }
        kvli_alloc_release(al);
        a->allocs[i] = a->allocs[--a->nallocs];
        pthread_mutex_unlock(&a->lock);
        return KVL_OK;
    }
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    for (size_t i = 0; i < a->nallocs; i++) {
        uint64_t base = (uint64_t)(uintptr_t)a->allocs[i].ptr;
        if (p > base && p - base < a->allocs[i].len) {
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "kvl_mem_free: %p lies inside allocation %p "
                     "(%zu bytes) but is not its start", ptr, a->allocs[i].ptr,
                     a->allocs[i].len);
            kvli_hint(&err, "pass the pointer kvl_mem_alloc/kvl_mem_alloc_ex returned");
            pthread_mutex_unlock(&a->lock);
            return kvli_fail(a, &err);
        }
    }
    pthread_mutex_unlock(&a->lock);
    kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "kvl_mem_free: %p was not returned by kvl_mem_alloc or "
             "kvl_mem_alloc_ex on agent '%s'", ptr, a->name);
    kvli_hint(&err, "free only memory this agent allocated, once (other memory is the "
              "application's to free)");
    return kvli_fail(a, &err);
}

void kvli_allocs_destroy(kvl_agent_t *a, bool backends)
{
    size_t keep = 0;
    for (size_t i = 0; i < a->nallocs; i++) {
        if ((a->allocs[i].bk != NULL) == backends)
            kvli_alloc_release(&a->allocs[i]);
        else
            a->allocs[keep++] = a->allocs[i];
    }
    a->nallocs = keep;
    if (keep == 0) {
        free(a->allocs);
        a->allocs = NULL;
        a->capallocs = 0;
    }
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

kvl_status_t kvli_ctx_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p, uint64_t *size_p);
kvl_status_t kvli_ctx_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p, uint64_t *size_p)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    kvl_status_t st = KVL_ERR_NOT_FOUND;
    bool registered = false;
    pthread_mutex_lock(&a->lock);
    /* Only an allocation in which memory is registered on this backend is
     * handed out: ids are sequential, and an unregistered allocation is not
     * the user's to share. */
    for (size_t i = 0; i < a->nregs && !registered; i++)
        registered = a->regs[i]->shm_id == id && (a->regs[i]->bk_mask & (1u << bk->index));
    for (size_t i = 0; i < a->nallocs && registered; i++) {
        if (a->allocs[i].id == id && a->allocs[i].fd >= 0) {
            *fd_p = a->allocs[i].fd;
            *size_p = a->allocs[i].len;
            st = KVL_OK;
            break;
        }
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}
