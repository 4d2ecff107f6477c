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
    for (unsigned b = 0; b < a->nbks; b++) {
        struct kvl_backend *bk = a->bks[b];
        size_t cl = 0;
        kvli_scopy(md.backends[b].name, sizeof(md.backends[b].name), bk->ops->name);
        st = bk->ops->conn_pack(bk->bk, conn + (size_t)b * KVL_BK_CONN_MAX, KVL_BK_CONN_MAX, &cl);
        if (st != KVL_OK || cl > KVL_BK_CONN_MAX) {
            kvli_err(&err, KVL_ERR_INTERNAL, 0, "backend %s could not pack its connection info (%s)",
                     bk->ops->name, kvl_status_name(st));
            kvli_scopy(err.backend, sizeof(err.backend), bk->ops->name);
            st = KVL_ERR_INTERNAL;
            goto out;
        }
        md.backends[b].conn = conn + (size_t)b * KVL_BK_CONN_MAX;
        md.backends[b].conn_len = (uint32_t)cl;
    }
    size_t k = 0;
    for (size_t i = 0; i < a->nregs; i++) {
        const kvli_region_t *r = a->regs[i];
        kvli_md_region_t *mr = &md.regions[md.n_regions];
        mr->addr = r->addr;
        mr->len = r->len;
        mr->kind = r->kind;
        mr->dev = r->dev;
        bool any = false;
        for (unsigned b = 0; b < a->nbks; b++) {
            size_t kl = 0;
            if (!(r->bk_mask & (1u << b)))
                continue;
            uint8_t *kb = keys + k * KVL_BK_KEY_MAX;
            if (a->bks[b]->ops->region_pack(a->bks[b]->bk, r->mh[b], kb, KVL_BK_KEY_MAX, &kl) != KVL_OK ||
                kl > KVL_BK_KEY_MAX)
                continue; /* not remotely reachable through this backend */
            mr->keys[b] = (kvli_md_key_t){kb, (uint16_t)kl, true};
            k++;
            any = true;
        }
        if (any)
            md.n_regions++;
    }
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
