/* Metadata of this agent: the blob a peer loads (kvl_metadata_get). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "md_codec.h"

void kvl_free(void *p)
{
    free(p);
}

/* Pack backend b's connection info into conn (KVL_BK_CONN_MAX bytes) for mb
 * (a->lock held). */
static kvl_status_t kvli_md_pack_conn(kvl_agent_t *a, unsigned b, uint8_t *conn,
                                      kvli_md_backend_t *mb, kvl_error_t *err)
{
    struct kvl_backend *bk = a->bks[b];
    size_t cl = 0;
    kvl_status_t st = bk->ops->conn_pack(bk->bk, conn, KVL_BK_CONN_MAX, &cl);
    if (st != KVL_OK || cl > KVL_BK_CONN_MAX) {
        kvli_err(err, KVL_ERR_INTERNAL, 0, "backend %s could not pack its connection info (%s)",
                 bk->ops->name, kvl_status_name(st));
        kvli_scopy(err->backend, sizeof(err->backend), bk->ops->name);
        return KVL_ERR_INTERNAL;
    }
    mb->conn = conn;
    mb->conn_len = (uint32_t)cl;
    return KVL_OK;
}

/* Describe region r in mr with a key for each blob backend j (agent backend
 * map[j]) that reaches it, packed at keys + *k slots; whether any did
 * (a->lock held). */
static bool kvli_md_pack_region(kvl_agent_t *a, const kvli_region_t *r, const unsigned *map,
                                unsigned nmap, uint8_t *keys, size_t *k, kvli_md_region_t *mr)
{
    bool any = false;
    mr->addr = r->addr;
    mr->len = r->len;
    mr->kind = r->kind;
    mr->dev = r->dev;
    for (unsigned j = 0; j < nmap; j++) {
        unsigned b = map[j];
        size_t kl = 0;
        if (!(r->bk_mask & (1u << b)))
            continue;
        uint8_t *kb = keys + *k * KVL_BK_KEY_MAX;
        if (a->bks[b]->ops->region_pack(a->bks[b]->bk, r->mh[b], kb, KVL_BK_KEY_MAX, &kl) !=
                KVL_OK || kl > KVL_BK_KEY_MAX)
            continue; /* not remotely reachable through this backend */
        mr->keys[j] = (kvli_md_key_t){kb, (uint16_t)kl, true};
        (*k)++;
        any = true;
    }
    return any;
}

kvl_status_t kvl_metadata_get(kvl_agent_t *a, void **blob_p, size_t *len_p)
{
    kvl_error_t err;
    kvli_md_t md;
    kvl_status_t st;
    if (a == NULL || blob_p == NULL || len_p == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_metadata_get: NULL argument");
    *blob_p = NULL;
    *len_p = 0;
    memset(&md, 0, sizeof(md));

    pthread_mutex_lock(&a->lock);
    kvli_scopy(md.name, sizeof(md.name), a->name);
    md.incarnation = a->incarnation;
    md.start_ns = a->start_ns;
    md.generation = atomic_load(&a->generation);
    md.n_backends = a->nbks;
    size_t nkeys = 0;
    for (size_t i = 0; i < a->nregs; i++)
        nkeys += (size_t)__builtin_popcount(a->regs[i]->bk_mask);
    uint8_t *conn = malloc((size_t)a->nbks * KVL_BK_CONN_MAX + 1);
    uint8_t *keys = malloc(nkeys * KVL_BK_KEY_MAX + 1);
    md.regions = calloc(a->nregs + 1, sizeof(*md.regions));
    if (conn == NULL || keys == NULL || md.regions == NULL) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, ENOMEM, "kvl_metadata_get: out of memory for %zu regions",
                 a->nregs);
        st = KVL_ERR_NO_MEMORY;
        goto out;
    }
    unsigned map[KVLI_MAX_BACKENDS];   /* every backend, in order */
    for (unsigned b = 0; b < a->nbks; b++) {
        kvli_scopy(md.backends[b].name, sizeof(md.backends[b].name), a->bks[b]->ops->name);
        st = kvli_md_pack_conn(a, b, conn + (size_t)b * KVL_BK_CONN_MAX, &md.backends[b], &err);
        if (st != KVL_OK)
            goto out;
        map[b] = b;
    }
    size_t k = 0;
    for (size_t i = 0; i < a->nregs; i++)
        if (kvli_md_pack_region(a, a->regs[i], map, a->nbks, keys, &k,
                                &md.regions[md.n_regions]))
            md.n_regions++;
    st = kvli_md_encode(&md, (uint8_t **)blob_p, len_p, &err);
out:
    pthread_mutex_unlock(&a->lock);
    free(conn);
    free(keys);
    free(md.regions);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

static int kvli_ptr_cmp(const void *x, const void *y)
{
    uintptr_t p = (uintptr_t)*(void *const *)x, q = (uintptr_t)*(void *const *)y;
    return p < q ? -1 : p > q;
}

/* The descriptor as the caller gave it: "0x...+len, device d" (FILE: fd). */
static void kvli_partial_desc(char *buf, size_t cap, kvl_mem_kind_t kind, const kvli_dent_t *e,
                              uint64_t span)
{
    if (kind == KVL_MEM_FILE)
        snprintf(buf, cap, "offset %llu+%llu, fd %d", (unsigned long long)kvli_file_off(e->addr),
                 (unsigned long long)span, (int)e->dev);
    else
        snprintf(buf, cap, "0x%llx+%llu, device %d", (unsigned long long)e->addr,
                 (unsigned long long)span, (int)e->dev);
}

/* The regions the descriptors lie in, each once (under the agent lock). */
static kvl_status_t kvli_partial_regions(kvl_agent_t *a, const kvl_dlist_t *dl, uint32_t sel,
                                         const char *selnames, kvli_region_t ***regs_p,
                                         size_t *n_p, kvl_error_t *err)
{
    kvli_region_t **regs = malloc((dl->n + 1) * sizeof(*regs));
    size_t n = 0;
    char what[160];
    if (regs == NULL) {
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "partial metadata: out of memory for %zu "
                 "descriptors", dl->n);
        return KVL_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < dl->n; i++) {
        const kvli_dent_t *e = &dl->ents[i];
        uint64_t span = e->stride * (e->count - 1) + e->len; /* checked at add */
        kvli_region_t *r = kvli_registry_find(a, e->addr, span);
        kvli_partial_desc(what, sizeof(what), dl->kind, e, span);
        if (r == NULL) {
            kvli_err(err, KVL_ERR_OUT_OF_BOUNDS, 0, "partial metadata: descriptor %zu (%s) is "
                     "not inside a region registered on agent '%s'", i, what, a->name);
            kvli_hint(err, "register the memory first, or pass only descriptors of registered "
                           "memory; a descriptor must lie inside one registration");
        } else if (r->kind != dl->kind || (e->dev != KVL_DEV_ANY && e->dev != r->dev)) {
            kvli_err(err, KVL_ERR_DEVICE_MISMATCH, 0, "partial metadata: descriptor %zu (%s, %s) "
                     "lies in region 0x%llx+%llu registered as %s device %d", i, what,
                     kvl_mem_kind_name(dl->kind), (unsigned long long)r->addr,
                     (unsigned long long)r->len, kvl_mem_kind_name(r->kind), (int)r->dev);
            kvli_hint(err, "pass a list of the kind and device the memory was registered with");
        } else if ((r->bk_mask & sel) == 0) {
            kvli_err(err, KVL_ERR_NO_BACKEND, 0, "partial metadata: descriptor %zu (%s) lies in "
                     "region 0x%llx+%llu, which none of the selected backends (%s) has "
                     "registered", i, what, (unsigned long long)r->addr,
                     (unsigned long long)r->len, selnames);
            kvli_hint(err, "select a backend the region is registered on, or register it there");
        } else {
            regs[n++] = r;
            continue;
        }
        kvli_err_region(err, "descriptor %zu", i);
        free(regs);
        return err->code;
    }
    if (n > 1)
        qsort(regs, n, sizeof(*regs), kvli_ptr_cmp);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || regs[u - 1] != regs[i])
            regs[u++] = regs[i];
    *regs_p = regs;
    *n_p = u;
    return KVL_OK;
}

kvl_status_t kvl_metadata_get_partial(kvl_agent_t *a, const kvl_dlist_t *descs,
                                      bool inc_conn_info, const char *const *backends,
                                      size_t n_backends, void **blob_p, size_t *len_p)
{
    kvl_error_t err;
    kvli_md_t md;
    kvl_status_t st = KVL_OK;
    kvli_region_t **regs = NULL;
    size_t nregs = 0;
    uint8_t *conn = NULL, *keys = NULL;
    unsigned map[KVLI_MAX_BACKENDS];   /* blob backend -> agent backend */
    char selnames[256] = "";

    if (a == NULL || blob_p == NULL || len_p == NULL || (backends == NULL && n_backends > 0))
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_metadata_get_partial: NULL argument");
    *blob_p = NULL;
    *len_p = 0;
    memset(&md, 0, sizeof(md));
    bool with_regions = descs != NULL && descs->n > 0;
    bool with_conn = inc_conn_info || !with_regions;

    pthread_mutex_lock(&a->lock);
    uint32_t sel = 0;
    for (size_t i = 0; i < n_backends; i++) {
        unsigned b = 0;
        while (b < a->nbks && (backends[i] == NULL || strcmp(a->bks[b]->ops->name, backends[i]) != 0))
            b++;
        if (b == a->nbks) {
            char have[256] = "";
            for (unsigned j = 0; j < a->nbks; j++)
                snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s", j ? ", " : "",
                         a->bks[j]->ops->name);
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "partial metadata: backend '%.64s' is not "
                     "created on agent '%s'", backends[i] ? backends[i] : "(null)", a->name);
            kvli_hint(&err, "created: %s", have[0] ? have : "none");
            st = KVL_ERR_NOT_FOUND;
            goto out;
        }
        sel |= 1u << b;
    }
    if (n_backends == 0)
        sel = a->nbks >= 32 ? UINT32_MAX : (1u << a->nbks) - 1;
    for (unsigned b = 0; b < a->nbks; b++)
        if (sel & (1u << b))
            snprintf(selnames + strlen(selnames), sizeof(selnames) - strlen(selnames), "%s%s",
                     selnames[0] ? ", " : "", a->bks[b]->ops->name);
    if (with_regions) {
        st = kvli_partial_regions(a, descs, sel, selnames[0] ? selnames : "none", &regs, &nregs,
                                  &err);
        if (st != KVL_OK)
            goto out;
    }
    kvli_scopy(md.name, sizeof(md.name), a->name);
    md.incarnation = a->incarnation;
    md.start_ns = a->start_ns;
    md.generation = atomic_load(&a->generation);
    md.flags = KVLI_MD_FLAG_PARTIAL | (with_conn ? 0 : KVLI_MD_FLAG_NO_CONN);
    conn = malloc((size_t)a->nbks * KVL_BK_CONN_MAX + 1);
    keys = malloc(nregs * a->nbks * KVL_BK_KEY_MAX + 1);
    md.regions = calloc(nregs + 1, sizeof(*md.regions));
    if (conn == NULL || keys == NULL || md.regions == NULL) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, ENOMEM, "kvl_metadata_get_partial: out of memory for "
                 "%zu regions", nregs);
        st = KVL_ERR_NO_MEMORY;
        goto out;
    }
    for (unsigned b = 0; b < a->nbks; b++) {
        kvli_md_backend_t *mb = &md.backends[md.n_backends];
        if (!(sel & (1u << b)))
            continue;
        kvli_scopy(mb->name, sizeof(mb->name), a->bks[b]->ops->name);
        if (with_conn) {
            st = kvli_md_pack_conn(a, b, conn + (size_t)b * KVL_BK_CONN_MAX, mb, &err);
            if (st != KVL_OK)
                goto out;
        }
        map[md.n_backends++] = b;
    }
    size_t k = 0;
    for (size_t i = 0; i < nregs; i++) {
        const kvli_region_t *r = regs[i];
        if (!kvli_md_pack_region(a, r, map, md.n_backends, keys, &k,
                                 &md.regions[md.n_regions])) {
            kvli_err(&err, KVL_ERR_NO_BACKEND, 0, "partial metadata: region 0x%llx+%llu (%s) "
                     "cannot be reached by remote agents through any selected backend (%s)",
                     (unsigned long long)r->addr, (unsigned long long)r->len,
                     kvl_mem_kind_name(r->kind), selnames);
            kvli_hint(&err, "select a backend that serves this memory to remote agents "
                            "(local-only backends such as POSIX or GDS do not)");
            st = KVL_ERR_NO_BACKEND;
            goto out;
        }
        md.n_regions++;
    }
    st = kvli_md_encode(&md, (uint8_t **)blob_p, len_p, &err);
out:
    pthread_mutex_unlock(&a->lock);
    free(regs);
    free(conn);
    free(keys);
    free(md.regions);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

kvl_status_t kvli_md_check_own_partial(kvl_agent_t *a, const void *blob, size_t len,
                                       const char *call, kvl_error_t *err)
{
    kvli_md_t md;
    if (kvli_md_decode(blob, len, &md, err) != KVL_OK)
        return err->code;
    kvli_md_release(&md);
    bool partial = (md.flags & KVLI_MD_FLAG_PARTIAL) != 0;
    if (partial && strcmp(md.name, a->name) == 0 && md.incarnation == a->incarnation)
        return KVL_OK;
    kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s: the blob is %s metadata of agent '%s' "
             "(incarnation %016llx), not partial metadata of this agent '%s' (incarnation "
             "%016llx)", call, partial ? "partial" : "full", md.name,
             (unsigned long long)md.incarnation, a->name, (unsigned long long)a->incarnation);
    kvli_hint(err, "pass the blob kvl_metadata_get_partial() made on this agent; the full "
                   "metadata is sent by kvl_metadata_push / kvl_etcd_publish");
    return KVL_ERR_INVALID_ARG;
}
