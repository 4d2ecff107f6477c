/*
 * Registering memory: kind and device checks, per-backend outcomes and the
 * report, all-or-nothing lists, deregistration guards.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/host.h"
#include "internal.h"

void kvli_region_unregister_backends(kvl_agent_t *a, kvli_region_t *r)
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

/* The host-memory check of a registration list, made for the whole rest
 * of the list when its first host range needs it: a list of 1,000 slices
 * of one buffer costs one query of its mapping (or one msync and one
 * batch of probes), not 1,000 of each. */
typedef struct {
    const kvl_mem_desc_t *regions;
    size_t n;
    size_t from;              /* checked: [from, n); none when ranges is NULL */
    kvli_host_range_t *ranges;
    kvli_host_range_t one;    /* ranges when one is left: no malloc */
} kvli_hostchk_t;

static void kvli_hostchk_free(kvli_hostchk_t *hc)
{
    if (hc->ranges != &hc->one)
        free(hc->ranges);
    hc->ranges = NULL;
}

static int kvli_hostchk(kvli_hostchk_t *hc, size_t k, uint64_t *bad_p)
{
    if (hc->ranges == NULL || k < hc->from) {
        kvli_hostchk_free(hc);
        hc->from = k;
        hc->ranges = hc->n - k == 1 ? &hc->one : malloc((hc->n - k) * sizeof(*hc->ranges));
        if (hc->ranges == NULL)
            return kvli_host_readable(hc->regions[k].addr, hc->regions[k].len, bad_p);
        for (size_t i = k; i < hc->n; i++)
            hc->ranges[i - k] = (kvli_host_range_t){hc->regions[i].addr, hc->regions[i].len, 0, 0};
        kvli_host_readable_many(hc->ranges, hc->n - k);
    }
    const kvli_host_range_t *r = &hc->ranges[k - hc->from];
    *bad_p = r->bad;
    return r->err;
}

/* Decide kind and device of one range (entry k of the list hc holds): ask
 * backends that know special memory (CUDA), else it must be mapped host
 * memory. */
static kvl_status_t kvli_mem_classify(kvl_agent_t *a, kvli_hostchk_t *hc, size_t at,
                                      kvl_mem_kind_t declared, kvl_mem_kind_t *kind_p,
                                      int32_t *dev_p, kvl_error_t *err)
{
    const kvl_mem_desc_t *d = &hc->regions[at];
    const kvl_backend_ops_t *ops;
    kvl_error_t qerr, why; /* why: a backend's reason for not claiming declared memory */
    bool have_why = false;
    /* Declared DRAM that this process can read is served as host memory:
     * on PCIe hosts GPU memory does not read from the CPU (cudaMalloc
     * ranges are inaccessible mappings there), so the device query, a
     * driver call per region, is asked only to explain a range that fails
     * the host check ("this is VRAM on GPU 0"). */
    uint64_t unread0;
    bool host_first = declared == KVL_MEM_DRAM && kvli_hostchk(hc, at, &unread0) == 0;
    for (size_t i = 0; !host_first && (ops = kvli_backend_builtin(i)) != NULL; i++) {
        kvl_mem_kind_t k;
        int32_t dev;
        char info[256] = "";
        if (ops->device == NULL || ops->device->mem_query == NULL)
            continue;
        /* The reason a backend does not claim memory is wanted only for a
         * declared device kind: for AUTO and DRAM (every host region) the
         * query may skip explaining, and is asked again for a refusal. */
        bool want_why = declared != KVL_MEM_AUTO && declared != KVL_MEM_DRAM;
        memset(&qerr, 0, offsetof(kvl_error_t, causes));
        qerr.device = -1;
        kvl_status_t st = ops->device->mem_query(d->addr, d->len, d->dev, &k, &dev, info,
                                                 sizeof(info), want_why ? &qerr : NULL);
        if (!want_why && st != KVL_OK && st != KVL_ERR_NOT_FOUND)
            st = ops->device->mem_query(d->addr, d->len, d->dev, &k, &dev, info, sizeof(info),
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
    if (declared != KVL_MEM_AUTO && declared != KVL_MEM_DRAM && have_why &&
        why.code == KVL_ERR_DEVICE_MISMATCH) {
        /* a device backend says what the memory is instead: host memory */
        kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0, "declared %s, but the %s backend says: %s",
                 kvl_mem_kind_name(declared), why.backend, why.what);
        kvli_hint(err, "%s", why.hint);
        err->device = d->dev == KVL_DEV_ANY ? -1 : d->dev;
        return KVL_ERR_DEVICE_MISMATCH;
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
    /* Host memory: the range must be mapped in this process (a hole is
     * ENOMEM), and readable: the CUDA driver keeps freed GPU ranges
     * reserved as inaccessible (PROT_NONE) mappings, and such a "DRAM"
     * region would fail every transfer later (kvli_host_readable_many). */
    uint64_t unreadable = 0;
    int he = kvli_hostchk(hc, at, &unreadable);
    if (he == ENOMEM) {
        kvli_err(err, KVL_ERR_INVALID_ARG, he,
                 "0x%llx+%llu: the range is not (fully) mapped in this process",
                 (unsigned long long)d->addr, (unsigned long long)d->len);
        kvli_hint(err, "pass the address and length of memory this process allocated; a GPU "
                       "pointer needs the cuda backend");
        return KVL_ERR_INVALID_ARG;
    }
    if (he == EFAULT) {
        kvli_err(err, KVL_ERR_INVALID_ARG, EFAULT,
                 "0x%llx+%llu is mapped in this process but 0x%llx cannot be read (an "
                 "inaccessible mapping: a freed GPU allocation's reserved range, or a guard "
                 "region)", (unsigned long long)d->addr, (unsigned long long)d->len,
                 (unsigned long long)unreadable);
        kvli_hint(err, "register live memory: a GPU pointer that is still allocated (the cuda "
                       "backend claims it), or host memory this process can read");
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

kvl_status_t kvli_file_range_check(const char *what, uint64_t off, uint64_t len, int32_t fd,
                                   kvl_error_t *err)
{
    if (fd < 0 || fd >= KVL_FILE_FD_MAX) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s: FILE range (offset %llu, len %llu) names fd %d, "
                 "which is not a file descriptor kvlane can hold (0 <= fd < %d)", what,
                 (unsigned long long)off, (unsigned long long)len, (int)fd, KVL_FILE_FD_MAX);
        kvli_hint(err, "a FILE range is (offset, length, fd): pass the descriptor of the file you "
                       "opened as its device");
        return KVL_ERR_INVALID_ARG;
    }
    if (len == 0 || off >= KVL_FILE_OFFSET_MAX || len > KVL_FILE_OFFSET_MAX - off) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s: FILE range of fd %d (offset %llu, len %llu) %s",
                 what, (int)fd, (unsigned long long)off, (unsigned long long)len,
                 len == 0 ? "is empty" : "ends past 1 TiB, the largest file offset kvlane serves");
        kvli_hint(err, "%s", len == 0 ? "pass the byte length of the range"
                                      : "split the data over several files of at most 1 TiB");
        return KVL_ERR_INVALID_ARG;
    }
    return KVL_OK;
}

/* "DRAM (NUMA node 0)", "VRAM on GPU 1": a kind and its device in words. */
static const char *kvli_kind_where(kvl_mem_kind_t kind, int32_t dev, char *buf, size_t cap)
{
    if (kind == KVL_MEM_DRAM)
        snprintf(buf, cap, "DRAM (NUMA node %d)", (int)dev);
    else if (kind == KVL_MEM_VRAM)
        snprintf(buf, cap, "VRAM on GPU %d", (int)dev);
    else if (kind == KVL_MEM_FILE)
        snprintf(buf, cap, "FILE (fd %d)", (int)dev);
    else
        snprintf(buf, cap, "%s (device %d)", kvl_mem_kind_name(kind), (int)dev);
    return buf;
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
                             "serves%s%s%s locally", (a->bks[b]->ops->mem_local & KVL_MEM_BIT(KVL_MEM_DRAM)) ? " DRAM" : "",
                             (a->bks[b]->ops->mem_local & KVL_MEM_BIT(KVL_MEM_VRAM)) ? " VRAM" : "",
                             (a->bks[b]->ops->mem_local & KVL_MEM_BIT(KVL_MEM_FILE)) ? " FILE" : "");
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
/* A backend refused region d: its reason becomes a cause of all, which is
 * made at the first refusal. */
static void kvli_reg_refused(kvl_error_t *all, kvl_mem_kind_t kind, const kvl_mem_desc_t *d,
                             const kvl_error_t *berr)
{
    if (all->code == KVL_OK && kind == KVL_MEM_FILE)
        kvli_err(all, KVL_ERR_NO_BACKEND, 0, "no backend accepted FILE range (fd %d, offset %llu, "
                 "len %llu)", (int)d->dev, (unsigned long long)kvli_file_off(d->addr),
                 (unsigned long long)d->len);
    else if (all->code == KVL_OK)
        kvli_err(all, KVL_ERR_NO_BACKEND, 0, "no backend accepted %s region 0x%llx+%llu",
                 kvl_mem_kind_name(kind), (unsigned long long)d->addr,
                 (unsigned long long)d->len);
    kvli_err_add_cause(all, berr);
}

static kvl_status_t kvli_register_one(kvl_agent_t *a, kvli_hostchk_t *hc, size_t k,
                                      const kvl_reg_params_t *p, kvl_reg_entry_t *e,
                                      kvli_region_t **r_p, bool *reused_p, kvl_error_t *err)
{
    const kvl_mem_desc_t *d = &hc->regions[k];
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
    if (declared != KVL_MEM_FILE && (d->len == 0 || d->addr == 0 ||
                                     kvli_add_overflows(d->addr, d->len))) {
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
    if (declared == KVL_MEM_FILE && fcntl(d->dev, F_GETFL) < 0) {
        int e2 = errno;
        kvli_err(err, KVL_ERR_INVALID_ARG, e2, "FILE range (offset %llu, len %llu): fd %d is not an "
                 "open file descriptor of this process (fcntl: %s)",
                 (unsigned long long)kvli_file_off(d->addr), (unsigned long long)d->len,
                 (int)d->dev, strerror(e2));
        kvli_hint(err, "open the file first and pass its descriptor; keep it open while it is "
                       "registered");
        return KVL_ERR_INVALID_ARG;
    }
    /* The same range again is a lookup, not a registration: it was
     * classified and checked when first registered. */
    kvli_region_t *r = kvli_registry_exact(a, d->addr, d->len);
    struct stat fst;
    memset(&fst, 0, sizeof(fst));
    if (declared == KVL_MEM_FILE && fstat(d->dev, &fst) != 0)
        memset(&fst, 0, sizeof(fst));
    if (r != NULL && r->kind == KVL_MEM_FILE && declared == KVL_MEM_FILE &&
        (r->file_dev != (uint64_t)fst.st_dev || r->file_ino != (uint64_t)fst.st_ino)) {
        /* the same (offset, len, fd), but the fd was closed and reopened */
        kvli_err(err, KVL_ERR_STALE, 0, "FILE range (fd %d, offset %llu, len %llu) is still "
                 "registered for the file fd %d named before (inode %llu); fd %d now names "
                 "another file (inode %llu)", (int)d->dev,
                 (unsigned long long)kvli_file_off(d->addr), (unsigned long long)d->len,
                 (int)d->dev, (unsigned long long)r->file_ino, (int)d->dev,
                 (unsigned long long)fst.st_ino);
        kvli_hint(err, "deregister a FILE range before closing its descriptor");
        return KVL_ERR_STALE;
    }
    if (r != NULL && (declared == KVL_MEM_AUTO || declared == r->kind) &&
        (d->dev == KVL_DEV_ANY || d->dev == r->dev)) {
        /* Backends named this time: each must exist and already hold the
         * range (it is not registered on more by a second call). */
        if (p && (p->field_mask & KVL_REG_PARAM_BACKENDS) && p->n_backends > 0) {
            uint32_t want;
            st = kvli_reg_candidates(a, p, r->kind, &want, err);
            if (st != KVL_OK)
                return st;
            if ((want & ~r->bk_mask) != 0) {
                char has[160] = "", miss[160] = "";
                size_t oh = 0, om = 0;
                for (unsigned b = 0; b < a->nbks; b++) {
                    const char *nm = a->bks[b]->ops->name;
                    if ((r->bk_mask & (1u << b)) && oh < sizeof(has))
                        oh += (size_t)snprintf(has + oh, sizeof(has) - oh, "%s%s",
                                               oh ? ", " : "", nm);
                    if ((want & ~r->bk_mask & (1u << b)) && om < sizeof(miss))
                        om += (size_t)snprintf(miss + om, sizeof(miss) - om, "%s%s",
                                               om ? ", " : "", nm);
                }
                kvli_err(err, KVL_ERR_STATE, 0, "0x%llx+%llu is already registered (%u "
                         "time(s)) on %s; registering it again does not add %s",
                         (unsigned long long)d->addr, (unsigned long long)d->len,
                         r->refcount, has[0] ? has : "no backend", miss);
                kvli_hint(err, "register a range once with every backend it needs: deregister "
                               "it (as many times as it was registered), then register it "
                               "naming them all");
                return KVL_ERR_STATE;
            }
        }
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
    if (r != NULL) {
        /* the same range, registered as another kind or device: a conflict */
        char was[64], now[64];
        kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                 "0x%llx+%llu is already registered as %s (%u time(s)); it cannot also be %s",
                 (unsigned long long)d->addr, (unsigned long long)d->len,
                 kvli_kind_where(r->kind, r->dev, was, sizeof(was)), r->refcount,
                 kvli_kind_where(declared == KVL_MEM_AUTO ? r->kind : declared,
                                 d->dev == KVL_DEV_ANY ? r->dev : d->dev, now, sizeof(now)));
        kvli_hint(err, "a range has one kind and device: deregister it first, or register "
                       "it with kind AUTO and the device it has");
        return KVL_ERR_DEVICE_MISMATCH;
    }
    if (declared == KVL_MEM_FILE) {
        kind = KVL_MEM_FILE; /* the caller's word: a file descriptor is no address */
        dev = d->dev;
    } else {
        st = kvli_mem_classify(a, hc, k, declared, &kind, &dev, err);
        if (st != KVL_OK)
            return st;
    }
    if (e) {
        e->kind = kind;
        e->dev = dev;
    }
    kvli_region_t *ov = kvli_registry_overlap(a, d->addr, d->len);
    if (ov != NULL && (ov->kind != kind || ov->dev != dev)) {
        char was[64], now[64];
        kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0,
                 "0x%llx+%llu (%s) overlaps 0x%llx+%llu, registered as %s: one byte cannot "
                 "be both", (unsigned long long)d->addr, (unsigned long long)d->len,
                 kvli_kind_where(kind, dev, now, sizeof(now)), (unsigned long long)ov->addr,
                 (unsigned long long)ov->len, kvli_kind_where(ov->kind, ov->dev, was, sizeof(was)));
        kvli_hint(err, "the earlier registration is stale (memory freed and reused?): "
                       "deregister it first");
        return KVL_ERR_DEVICE_MISMATCH;
    }
    if (ov != NULL) {
        /* Accepted (engines register views of one buffer), and said. */
        char det[160];
        snprintf(det, sizeof(det), "overlaps 0x%llx+%llu, registered before: a descriptor "
                 "must lie inside one of them", (unsigned long long)ov->addr,
                 (unsigned long long)ov->len);
        kvli_outcome(e, "core", KVL_OK, det);
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
    if (kind == KVL_MEM_FILE) {
        r->file_dev = (uint64_t)fst.st_dev;
        r->file_ino = (uint64_t)fst.st_ino;
    }
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

    /* The error that gathers every backend's refusal is made at the first
     * refusal: a registration that succeeds (1,000 in a list) formats and
     * clears nothing it does not use. */
    kvl_error_t all;
    all.code = KVL_OK;
    unsigned ok = 0, tried = 0;
    for (unsigned b = 0; b < a->nbks; b++) {
        if (!(mask & (1u << b)))
            continue;
        struct kvl_backend *bk = a->bks[b];
        char detail[1024];
        kvl_error_t berr;
        detail[0] = '\0';
        kvli_err_blank(&berr);
        tried++;
        if (!(bk->ops->mem_local & KVL_MEM_BIT(kind))) {
            kvl_bk_error_set(&berr, KVL_ERR_UNSUPPORTED, 0, bk->ops->name, dev,
                             "backend %s does not serve %s memory", bk->ops->name,
                             kvl_mem_kind_name(kind));
            kvli_outcome(e, bk->ops->name, berr.code, berr.what);
            kvli_reg_refused(&all, kind, d, &berr);
            continue;
        }
        /* no report asked for: the backend formats no detail (detail_len 0) */
        st = bk->ops->mem_reg(bk->bk, &info, &r->mh[b], detail, e != NULL ? sizeof(detail) : 0,
                              &berr);
        if (st == KVL_OK) {
            r->bk_mask |= 1u << b;
            ok++;
            kvli_outcome(e, bk->ops->name, KVL_OK, detail);
        } else {
            if (berr.code == KVL_OK)
                kvl_bk_error_set(&berr, st, 0, bk->ops->name, dev, "mem_reg failed");
            if (!berr.backend[0])
                kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
            char line[sizeof(((kvl_reg_outcome_t *)0)->detail)];
            size_t o = (size_t)snprintf(line, sizeof(line), "%s%s%s", berr.what,
                                        berr.hint[0] ? "; fix: " : "", berr.hint);
            /* the backend's lower errors, whole as room lasts */
            for (unsigned c = 0; c < berr.n_causes && o < sizeof(line); c++) {
                const kvl_error_cause_t *bc = &berr.causes[c];
                o += (size_t)snprintf(line + o, sizeof(line) - o, "; cause: %s", bc->what);
                if (bc->hint[0] && o < sizeof(line))
                    o += (size_t)snprintf(line + o, sizeof(line) - o, " (fix: %s)", bc->hint);
            }
            kvli_outcome(e, bk->ops->name, st, line);
            kvli_reg_refused(&all, kind, d, &berr);
        }
    }
    if (ok == 0 || (policy == KVL_REG_ALL && ok != tried)) {
        kvli_region_unregister_backends(a, r);
        free(r);
        if (all.code == KVL_OK) /* no backend was even tried */
            kvli_err(&all, KVL_ERR_NO_BACKEND, 0, "no backend accepted %s region 0x%llx+%llu",
                     kvl_mem_kind_name(kind), (unsigned long long)d->addr,
                     (unsigned long long)d->len);
        if (ok != 0)
            snprintf(all.what, sizeof(all.what),
                     "policy 'all': %u of %u backends refused %s region 0x%llx+%llu (the %u that "
                     "accepted were undone)", tried - ok, tried, kvl_mem_kind_name(kind),
                     (unsigned long long)d->addr, (unsigned long long)d->len, ok);
        memcpy(err, &all, offsetof(kvl_error_t, causes) + all.n_causes * sizeof(all.causes[0]));
        if (kind == KVL_MEM_FILE)
            kvli_err_region(err, "FILE fd %d offset %llu+%llu", (int)d->dev,
                            (unsigned long long)kvli_file_off(d->addr), (unsigned long long)d->len);
        else
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

/* The report of one region, its entry right after it: the last one freed
 * is kept for the next registration (engines register buffer by buffer,
 * and each report of ~17 KiB was a malloc and a free). */
typedef struct {
    kvl_reg_report_t rep;
    kvl_reg_entry_t entry;
} kvli_report1_t;

_Static_assert(offsetof(kvli_report1_t, entry) == sizeof(kvl_reg_report_t),
               "a one-region report's entry follows its header");

static _Atomic(kvli_report1_t *) kvli_report1_spare;

static kvl_reg_report_t *kvli_report_alloc(size_t n)
{
    kvl_reg_report_t *rep;
    if (n == 1) {
        kvli_report1_t *r1 = atomic_exchange(&kvli_report1_spare, NULL);
        if (r1 == NULL && (r1 = malloc(sizeof(*r1))) == NULL)
            return NULL;
        rep = &r1->rep;
        rep->entries = &r1->entry;
    } else {
        rep = calloc(1, sizeof(*rep));
        if (rep == NULL)
            return NULL;
        rep->entries = kvli_buf_alloc(n * sizeof(*rep->entries));
        if (rep->entries == NULL) {
            free(rep);
            return NULL;
        }
    }
    rep->n_entries = n;
    return rep;
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
        rep = kvli_report_alloc(n);
        if (rep == NULL)
            return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                    "kvl_mem_register: cannot allocate a report for %zu regions", n);
        /* Each entry is ~17 KiB (8 outcomes of whole diagnoses) of which a
         * registration writes the header and an outcome or two: only those
         * are initialised, in pages the buffer cache has already faulted
         * in for the previous list. */
        for (size_t i = 0; i < n; i++)
            memset(&rep->entries[i], 0, offsetof(kvl_reg_entry_t, outcomes));
    }
    kvli_region_t **done = malloc(n * sizeof(*done));
    if (done == NULL) {
        kvl_reg_report_free(rep);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_register: out of memory");
    }

    /* FILE: (offset, len, fd) -> the range's key in the registry (internal.h) */
    const kvl_mem_desc_t *given = regions;
    kvl_mem_desc_t *keyed = NULL;
    if (params && (params->field_mask & KVL_REG_PARAM_KIND) && params->kind == KVL_MEM_FILE) {
        keyed = malloc(n * sizeof(*keyed));
        if (keyed == NULL) {
            free(done);
            kvl_reg_report_free(rep);
            return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_register: out of memory");
        }
        for (size_t i = 0; i < n; i++) {
            char what[64];
            snprintf(what, sizeof(what), "region %zu of %zu", i, n);
            if (kvli_file_range_check(what, given[i].addr, given[i].len, given[i].dev, &err) !=
                KVL_OK) {
                free(keyed);
                free(done);
                if (rep) {
                    for (size_t j = 0; j < n; j++) {
                        rep->entries[j].addr = given[j].addr;
                        rep->entries[j].len = given[j].len;
                        rep->entries[j].kind = KVL_MEM_FILE;
                        rep->entries[j].dev = given[j].dev;
                        rep->entries[j].status = j == i ? KVL_ERR_INVALID_ARG : KVL_ERR_CANCELED;
                    }
                    kvli_outcome(&rep->entries[i], "core", KVL_ERR_INVALID_ARG, err.what);
                    *report_p = rep;
                }
                return kvli_fail(a, &err);
            }
            keyed[i] = (kvl_mem_desc_t){kvli_file_key(given[i].dev, given[i].addr), given[i].len,
                                        given[i].dev};
        }
        regions = keyed;
    }

    kvli_hostchk_t hc = {.regions = regions, .n = n};
    pthread_mutex_lock(&a->lock);
    size_t k;
    for (k = 0; k < n; k++) {
        bool reused = false;
        st = kvli_register_one(a, &hc, k, params, rep ? &rep->entries[k] : NULL, &done[k],
                               &reused, &err);
        if (st != KVL_OK) {
            if (rep) {
                rep->entries[k].status = st;
                if (rep->entries[k].n_outcomes == 0) /* refused before any backend */
                    kvli_outcome(&rep->entries[k], "core", st, err.what);
            }
            break;
        }
    }
    if (st != KVL_OK) {
        /* All or nothing: undo 0..k-1 in reverse order. */
        for (size_t j = k; j-- > 0;)
            kvli_region_drop(a, done[j]);
        if (rep) {
            /* 0..k-1 were registered and undone; k+1.. were not tried */
            for (size_t j = 0; j < k; j++)
                rep->entries[j].status = KVL_ERR_CANCELED;
            for (size_t j = k + 1; j < n; j++) {
                kvl_reg_entry_t *ej = &rep->entries[j];
                ej->addr = given[j].addr;
                ej->len = given[j].len;
                ej->kind = params && (params->field_mask & KVL_REG_PARAM_KIND) ? params->kind
                                                                              : KVL_MEM_AUTO;
                ej->dev = given[j].dev;
                ej->status = KVL_ERR_CANCELED;
            }
        }
        if (n > 1) {
            char what[sizeof(err.what)];
            kvli_scopy(what, sizeof(what), err.what);
            snprintf(err.what, sizeof(err.what),
                     "region %zu of %zu (0x%llx+%llu): %.400s; regions 0..%zu were undone", k, n,
                     (unsigned long long)given[k].addr, (unsigned long long)given[k].len,
                     what, k ? k - 1 : 0);
            if (k == 0)
                snprintf(err.what, sizeof(err.what), "region 0 of %zu (0x%llx+%llu): %.400s", n,
                         (unsigned long long)given[0].addr,
                         (unsigned long long)given[0].len, what);
        } else if (!err.region[0]) {
            kvli_err_region(&err, "region 0x%llx+%llu", (unsigned long long)given[0].addr,
                            (unsigned long long)given[0].len);
        }
    } else {
        atomic_fetch_add(&a->generation, 1);
    }
    pthread_mutex_unlock(&a->lock);
    kvli_hostchk_free(&hc);
    free(done);
    if (keyed != NULL) {
        /* Reports and errors speak of what the caller gave. */
        for (size_t i = 0; rep != NULL && i < n; i++)
            rep->entries[i].addr = given[i].addr;
        free(keyed);
    }
    if (report_p)
        *report_p = rep;
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

/* Entry i of a deregistration list: its region, which drop of that region
 * it is (0 for the region's first entry in the list) and how many entries
 * name it. Sorting once keeps a list of 1,000 regions linear in practice. */
typedef struct {
    kvli_region_t *r;
    uint32_t nth, total;
} kvli_drop_t;

typedef struct {
    uint64_t addr, len;
    size_t i;
} kvli_drop_ord_t;

static int kvli_drop_cmp(const void *x, const void *y)
{
    const kvli_drop_ord_t *a = x, *b = y;
    if (a->addr != b->addr)
        return a->addr < b->addr ? -1 : 1;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* drops[i].nth and .total for every entry; -1 without memory. */
static int kvli_drops_count(const kvl_mem_desc_t *regions, size_t n, kvli_drop_t *drops)
{
    /* A list in strictly ascending (address, length) order (as lists are
     * usually built) has no entry twice: no sort. */
    bool distinct = true;
    for (size_t i = 1; i < n && distinct; i++)
        distinct = regions[i - 1].addr < regions[i].addr ||
                   (regions[i - 1].addr == regions[i].addr && regions[i - 1].len < regions[i].len);
    if (distinct) {
        for (size_t i = 0; i < n; i++) {
            drops[i].nth = 0;
            drops[i].total = 1;
        }
        return 0;
    }
    kvli_drop_ord_t *o = malloc(n * sizeof(*o));
    if (o == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        o[i] = (kvli_drop_ord_t){regions[i].addr, regions[i].len, i};
    qsort(o, n, sizeof(*o), kvli_drop_cmp);
    for (size_t g = 0; g < n;) {
        size_t e = g + 1;
        while (e < n && o[e].addr == o[g].addr && o[e].len == o[g].len)
            e++;
        for (size_t k = g; k < e; k++) {
            drops[o[k].i].nth = (uint32_t)(k - g);
            drops[o[k].i].total = (uint32_t)(e - g);
        }
        g = e;
    }
    free(o);
    return 0;
}

/* Whether this entry drops the last registration of its region (counted at
 * the region's first entry in the list only). */
static bool kvli_dereg_final(const kvli_drop_t *d)
{
    return d->nth == 0 && d->total == d->r->refcount;
}

static void kvli_region_revoke_undo(kvl_agent_t *a, kvli_region_t *r, unsigned upto)
{
    for (unsigned b = 0; b < upto; b++)
        if ((r->bk_mask & (1u << b)) && a->bks[b]->ops->mem_revoke != NULL)
            a->bks[b]->ops->mem_revoke(a->bks[b]->bk, r->mh[b], 0, NULL);
}

kvl_status_t kvli_region_revoke_on(kvl_agent_t *a, kvli_region_t *r, unsigned b,
                                   kvl_error_t *e)
{
    const kvl_backend_ops_t *ops = a->bks[b]->ops;
    if (!(r->bk_mask & (1u << b)) || ops->mem_revoke == NULL)
        return KVL_OK;
    kvli_err_blank(e); /* not 2 KiB of text cleared per region and backend */
    return ops->mem_revoke(a->bks[b]->bk, r->mh[b], 1, e);
}

/* Under the agent lock: every backend stops peers' direct access to the
 * regions this call drops for good (ops->mem_revoke, bounded by the
 * backend's timeout). All or nothing: on a refusal, access is restored. */
static kvl_status_t kvli_regions_revoke(kvl_agent_t *a, const kvli_drop_t *drops, size_t n,
                                        kvl_error_t *err)
{
    for (size_t i = 0; i < n; i++) {
        if (!kvli_dereg_final(&drops[i]))
            continue;
        kvli_region_t *r = drops[i].r;
        for (unsigned b = 0; b < a->nbks; b++) {
            kvl_error_t e;
            if (kvli_region_revoke_on(a, r, b, &e) == KVL_OK)
                continue;
            memcpy(err, &e, offsetof(kvl_error_t, causes));
            err->n_causes = err->n_causes_dropped = 0;
            if (err->code == KVL_OK)
                err->code = KVL_ERR_INTERNAL;
            kvli_region_revoke_undo(a, r, b);
            for (size_t k = 0; k < i; k++)
                if (kvli_dereg_final(&drops[k]))
                    kvli_region_revoke_undo(a, drops[k].r, a->nbks);
            return err->code;
        }
    }
    return KVL_OK;
}

kvl_status_t kvl_mem_deregister(kvl_agent_t *a, const kvl_mem_desc_t *regions, size_t n)
{
    kvl_error_t err;
    const kvl_mem_desc_t *given = regions;
    if (a == NULL || regions == NULL || n == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_mem_deregister: agent or regions is NULL, or n = 0");
    kvli_drop_t *drops = malloc(n * sizeof(*drops));
    kvl_mem_desc_t *keyed = malloc(n * sizeof(*keyed));
    if (drops == NULL || keyed == NULL) {
        free(drops);
        free(keyed);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                "kvl_mem_deregister: out of memory for a list of %zu regions", n);
    }
    pthread_mutex_lock(&a->lock);
    /* A FILE range is given as (offset, len, fd): its key, when no memory
     * range is registered at that address. */
    for (size_t i = 0; i < n; i++) {
        keyed[i] = regions[i];
        if (regions[i].dev >= 0 && regions[i].dev < KVL_FILE_FD_MAX &&
            regions[i].addr < KVL_FILE_OFFSET_MAX &&
            regions[i].len <= KVL_FILE_OFFSET_MAX - regions[i].addr &&
            kvli_registry_exact(a, regions[i].addr, regions[i].len) == NULL) {
            uint64_t k = kvli_file_key(regions[i].dev, regions[i].addr);
            if (kvli_registry_exact(a, k, regions[i].len) != NULL)
                keyed[i].addr = k;
        }
    }
    regions = keyed;
    if (kvli_drops_count(regions, n, drops) != 0) {
        pthread_mutex_unlock(&a->lock);
        free(drops);
        free(keyed);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                "kvl_mem_deregister: out of memory for a list of %zu regions", n);
    }
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
        drops[i].r = r;
        uint32_t ndrops = drops[i].nth + 1; /* drops of r in entries 0..i */
        if (ndrops > r->refcount) {
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0,
                     "deregister: region 0x%llx+%llu is registered %u time(s) but this call "
                     "drops it %u times", (unsigned long long)r->addr,
                     (unsigned long long)r->len, r->refcount, ndrops);
            goto fail;
        }
        if (ndrops == r->refcount &&
            (atomic_load(&r->inflight) > 0 || atomic_load(&r->pins) > 0)) {
            bool local = atomic_load(&r->inflight) > 0;
            kvli_err(&err, KVL_ERR_IN_USE, 0,
                     "deregister: region 0x%llx+%llu is in use by %u %s", (unsigned long long)r->addr,
                     (unsigned long long)r->len,
                     local ? atomic_load(&r->inflight) : atomic_load(&r->pins),
                     local ? "in-flight transfer(s) of this agent"
                           : "pin(s): a peer's request being served right now, a list "
                             "being prepared, or the gets of a failed READ that may still "
                             "land or the puts of a failed WRITE that may still read it");
            if (local)
                kvli_hint(&err, "wait for the transfers (kvl_xfer_wait) or cancel them, then "
                                "deregister");
            else
                kvli_hint(&err, "retry: a peer's request or a preparation ends in moments; the "
                                "gets of a failed READ or the puts of a failed WRITE end once "
                                "that peer answers again (or its backend is closed)");
            goto fail;
        }
    }
    /* Peers that copy without asking (shm's cross-memory attach) stop before
     * anything is dropped; a refusal restores their access and changes nothing. */
    if (kvli_regions_revoke(a, drops, n, &err) != KVL_OK)
        goto fail;
    /* Last references: unregistered everywhere, then taken off the registry
     * in one pass (one removal at a time moves the array n times), then
     * released. drops is reused for them: entry k < gone is a region. */
    size_t gone = 0;
    for (size_t i = 0; i < n; i++) {
        kvli_region_t *r = drops[i].r;
        if (--r->refcount > 0)
            continue;
        atomic_store(&r->valid, false);
        kvli_region_unregister_backends(a, r);
        drops[gone++].r = r; /* gone <= i: entries not read again */
    }
    kvli_registry_remove_invalid(a);
    for (size_t k = 0; k < gone; k++)
        kvli_region_put(drops[k].r);
    atomic_fetch_add(&a->generation, 1);
    const kvli_agent_hooks_t *hooks = a->hooks;
    pthread_mutex_unlock(&a->lock);
    free(drops);
    free(keyed);
    if (hooks != NULL && hooks->regions_changed != NULL)
        hooks->regions_changed(a);
    return KVL_OK;
fail:
    pthread_mutex_unlock(&a->lock);
    free(drops);
    free(keyed);
    kvli_err_region(&err, "region 0x%llx+%llu", (unsigned long long)given[0].addr,
                    (unsigned long long)given[0].len);
    return kvli_fail(a, &err);
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
    /* the entry that failed, if one did: the others were undone or not tried */
    size_t failed = rep->n_entries;
    for (size_t i = 0; i < rep->n_entries && failed == rep->n_entries; i++)
        if (rep->entries[i].status != KVL_OK && rep->entries[i].status != KVL_ERR_CANCELED)
            failed = i;
    KVLI_APPEND("registration report: %zu region(s)%s\n", rep->n_entries,
                failed < rep->n_entries ? ", nothing registered by this call (all or nothing)"
                                        : "");
    for (size_t i = 0; i < rep->n_entries; i++) {
        const kvl_reg_entry_t *e = &rep->entries[i];
        int undone = e->status == KVL_ERR_CANCELED && i < failed;
        char state[96];
        if (e->status == KVL_OK)
            snprintf(state, sizeof(state), "registered%s", e->reused ? " (reused)" : "");
        else if (e->status != KVL_ERR_CANCELED)
            snprintf(state, sizeof(state), "%s", kvl_status_name(e->status));
        else if (undone && failed < rep->n_entries)
            snprintf(state, sizeof(state), "undone: entry %zu failed%s", failed,
                     e->reused ? " (reused: registered before, it stays)" : "");
        else if (failed < rep->n_entries)
            snprintf(state, sizeof(state), "not tried: entry %zu failed", failed);
        else
            snprintf(state, sizeof(state), "undone: an entry failed");
        KVLI_APPEND("  [%zu] 0x%llx+%llu %s dev %d: %s\n", i, (unsigned long long)e->addr,
                    (unsigned long long)e->len, kvl_mem_kind_name(e->kind), e->dev, state);
        for (unsigned j = 0; j < e->n_outcomes; j++)
            KVLI_APPEND("      %-6s %-6s %s\n", e->outcomes[j].backend,
                        e->outcomes[j].status != KVL_OK ? "FAIL" : undone ? "undone" : "ok",
                        e->outcomes[j].detail);
    }
#undef KVLI_APPEND
    return need;
}


void kvl_reg_report_free(kvl_reg_report_t *rep)
{
    if (rep == NULL)
        return;
    if (rep->n_entries == 1 && rep->entries == (kvl_reg_entry_t *)(void *)(rep + 1)) {
        free(atomic_exchange(&kvli_report1_spare, (kvli_report1_t *)(void *)rep));
        return;
    }
    kvli_buf_free(rep->entries, rep->n_entries * sizeof(*rep->entries));
    free(rep);
}

