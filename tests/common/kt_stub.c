/* A stub backend for unit tests of the core (see kt_stub.h). */
#include <stdlib.h>
#include <string.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"
#include "core/md_codec.h"

/* The core's completion service (xfer.c), which kvl_backend_create lends. */
void kvli_xfer_ctx_done(kvl_bk_xfer_t *x, kvl_status_t status, const kvl_error_t *err);

static kvl_status_t kt_stub_fail(kt_stub_t *s, kvl_status_t st, kvl_error_t *err, const char *what)
{
    kvl_bk_error_set(err, st, 0, s->name, -1, "stub %s: %s", s->name, what);
    return st;
}

static void kt_stub_close(void *bk)
{
    kt_stub_t *s = bk;
    s->closes++;
    s->deregs_at_close = s->deregs;
    s->unpeers_at_close = s->unpeers;
    s->runloads_at_close = s->runloads;
}

static kvl_status_t kt_stub_mem_reg(void *bk, const kvl_region_info_t *r, void **mh_p,
                                    char *detail, size_t detail_len, kvl_error_t *err)
{
    kt_stub_t *s = bk;
    if (s->reg_status != KVL_OK)
        return kt_stub_fail(s, s->reg_status, err, "mem_reg refused");
    s->regs++;
    *mh_p = (void *)(uintptr_t)r->addr;
    snprintf(detail, detail_len, "stub-path");
    return KVL_OK;
}

static void kt_stub_mem_dereg(void *bk, void *mh)
{
    (void)mh;
    ((kt_stub_t *)bk)->deregs++;
}

static kvl_status_t kt_stub_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p)
{
    kt_stub_t *s = bk;
    if (s->conn_status != KVL_OK)
        return s->conn_status;
    size_t n = strlen(s->name);
    if (n > cap)
        return KVL_ERR_INTERNAL;
    memcpy(buf, s->name, n);
    *len_p = n;
    return KVL_OK;
}

static kvl_status_t kt_stub_region_pack(void *bk, void *mh, uint8_t *buf, size_t cap,
                                        size_t *len_p)
{
    kt_stub_t *s = bk;
    uint64_t addr = (uint64_t)(uintptr_t)mh;
    if (s->pack_status != KVL_OK || cap < sizeof(addr))
        return s->pack_status != KVL_OK ? s->pack_status : KVL_ERR_INTERNAL;
    memcpy(buf, &addr, sizeof(addr));
    *len_p = sizeof(addr);
    return KVL_OK;
}

static kvl_status_t kt_stub_peer_load(void *bk, const char *name, uint64_t incarnation,
                                      const uint8_t *conn, size_t len, void **peer_p,
                                      kvl_error_t *err)
{
    kt_stub_t *s = bk;
    (void)name;
    (void)incarnation;
    (void)conn;
    (void)len;
    if (s->peer_status != KVL_OK)
        return kt_stub_fail(s, s->peer_status, err, "peer refused");
    s->peers++;
    *peer_p = s;
    return KVL_OK;
}

static void kt_stub_peer_unload(void *bk, void *peer)
{
    (void)peer;
    ((kt_stub_t *)bk)->unpeers++;
}

static kvl_status_t kt_stub_rregion_load(void *bk, void *peer, const kvl_region_info_t *r,
                                         const uint8_t *key, size_t len, void **rh_p,
                                         kvl_error_t *err)
{
    kt_stub_t *s = bk;
    uint64_t k;
    (void)peer;
    if (r->addr == s->rload_fail_addr)
        return kt_stub_fail(s, KVL_ERR_BAD_METADATA, err, "key refused");
    if (len != sizeof(k))
        return kt_stub_fail(s, KVL_ERR_BAD_METADATA, err, "key length");
    memcpy(&k, key, sizeof(k));
    if (k != r->addr)
        return kt_stub_fail(s, KVL_ERR_BAD_METADATA, err, "key names another region");
    s->rloads++;
    *rh_p = (void *)(uintptr_t)r->addr;
    return KVL_OK;
}

static void kt_stub_rregion_unload(void *bk, void *peer, void *rh)
{
    (void)peer;
    (void)rh;
    ((kt_stub_t *)bk)->runloads++;
}

static kvl_status_t kt_stub_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err)
{
    kt_stub_t *s = bk;
    s->posts++;
    s->last = x;
    if (s->post_status != KVL_OK)
        return kt_stub_fail(s, s->post_status, err, "post refused");
    if (s->cache_tabs && x->nidx > 0) {
        if (*x->ltab_cache == NULL)
            *x->ltab_cache = s;
        if (*x->rtab_cache == NULL)
            *x->rtab_cache = s;
    }
    snprintf(x->path, sizeof(x->path), "stub-path");
    if (s->complete) {
        kvl_error_t e;
        kvl_bk_error_set(&e, s->done_status, 0, s->name, -1, "stub %s: completed with %s",
                         s->name, kvl_status_name(s->done_status));
        kvli_xfer_ctx_done(x, s->done_status, s->done_status == KVL_OK ? NULL : &e);
    } else {
        s->pending = x;
    }
    return KVL_OK;
}

static void kt_stub_xfer_cancel(void *bk, kvl_bk_xfer_t *x)
{
    kt_stub_t *s = bk;
    s->cancels++;
    if (s->pending == x) {
        s->pending = NULL;
        kvli_xfer_ctx_done(x, KVL_ERR_CANCELED, NULL);
    }
}

static void kt_stub_xfer_release(void *bk, kvl_bk_xfer_t *x)
{
    (void)x;
    ((kt_stub_t *)bk)->releases++;
}

static kvl_status_t kt_stub_notif_send(void *bk, void *peer, const void *msg, size_t len,
                                       kvl_error_t *err)
{
    kt_stub_t *s = bk;
    (void)peer;
    if (s->notif_status != KVL_OK)
        return kt_stub_fail(s, s->notif_status, err, "notification refused");
    s->notifs++;
    s->notif_len = len;
    memset(s->notif_head, 0, sizeof(s->notif_head));
    if (len)
        memcpy(s->notif_head, msg, len < sizeof(s->notif_head) ? len : sizeof(s->notif_head));
    return KVL_OK;
}

static void kt_stub_describe(void *bk, void *peer, char *buf, size_t len)
{
    (void)peer;
    snprintf(buf, len, "%s", ((kt_stub_t *)bk)->describe);
}

static void kt_stub_ptab_release(void *bk, void *cache)
{
    kt_stub_t *s = bk;
    KT_CHECK(cache == s);
    s->ptab_releases++;
}

static void kt_stub_ptab_prepare(void *bk, const kvl_bk_ptab_t *t, void *const *mh, int remote,
                                 void **cache_p)
{
    kt_stub_t *s = bk;
    KT_CHECK(*cache_p == NULL && t->nregs > 0);
    s->ptab_prepares++;
    s->prep_n = t->n;
    s->prep_mh0 = mh[0];
    s->prep_remote = remote;
    if (s->prepare_tabs)
        *cache_p = s;
}

static void *kt_stub_idx_alloc(void *bk, void *const *lmh, size_t nlmh, size_t bytes,
                               void **cookie_p)
{
    kt_stub_t *s = bk;
    KT_CHECK(nlmh > 0 && lmh[0] != NULL);
    if (!s->lend_idx)
        return NULL;
    s->idx_buf = malloc(bytes);
    KT_CHECK(s->idx_buf != NULL);
    s->idx_bytes = bytes;
    s->idx_allocs++;
    *cookie_p = s;
    return s->idx_buf;
}

static void kt_stub_idx_free(void *bk, void *ptr, void *cookie)
{
    kt_stub_t *s = bk;
    KT_CHECK(cookie == s && ptr == s->idx_buf);
    free(ptr);
    s->idx_buf = NULL;
    s->idx_frees++;
}

kvl_backend_t *kt_stub_attach(kvl_agent_t *a, kt_stub_t *s, const char *name, uint32_t mem_local,
                              uint32_t mem_remote, uint32_t caps)
{
    struct kvl_backend *bk = calloc(1, sizeof(*bk));
    KT_CHECK(bk != NULL);
    memset(s, 0, sizeof(*s));
    kvli_scopy(s->name, sizeof(s->name), name);
    s->ops = (kvl_backend_ops_t){
        .abi_version = KVL_BACKEND_ABI_VERSION,
        .size = sizeof(kvl_backend_ops_t),
        .name = s->name,
        .description = "unit-test stub",
        .mem_local = mem_local,
        .mem_remote = mem_remote,
        .caps = caps,
        .close = kt_stub_close,
        .mem_reg = kt_stub_mem_reg,
        .mem_dereg = kt_stub_mem_dereg,
        .conn_pack = kt_stub_conn_pack,
        .region_pack = kt_stub_region_pack,
        .peer_load = kt_stub_peer_load,
        .peer_unload = kt_stub_peer_unload,
        .rregion_load = kt_stub_rregion_load,
        .rregion_unload = kt_stub_rregion_unload,
        .xfer_post = kt_stub_xfer_post,
        .xfer_cancel = kt_stub_xfer_cancel,
        .notif_send = kt_stub_notif_send,
        .peer_describe = kt_stub_describe,
        .xfer_release = kt_stub_xfer_release,
        .ptab_release = kt_stub_ptab_release,
        .ptab_prepare = kt_stub_ptab_prepare,
        .idx_alloc = kt_stub_idx_alloc,
        .idx_free = kt_stub_idx_free,
    };
    pthread_mutex_lock(&a->lock);
    KT_CHECK(a->nbks < KVLI_MAX_BACKENDS);
    bk->ops = &s->ops;
    bk->bk = s;
    bk->agent = a;
    bk->index = a->nbks;
    bk->ctx = (kvl_bk_ctx_t){
        .size = sizeof(kvl_bk_ctx_t),
        .agent_name = a->name,
        .incarnation = a->incarnation,
        .timeout_ms = a->timeout_ms,
        .workers = a->workers,
        .core = bk,
        .xfer_done = kvli_xfer_ctx_done,
        .notif_deliver = kvli_notif_deliver,
        .xfer_expand = kvli_xfer_ctx_expand,
    };
    a->bks[a->nbks++] = bk;
    atomic_fetch_add(&a->generation, 1);
    pthread_mutex_unlock(&a->lock);
    s->bk = bk;
    return bk;
}

void kt_stub_complete(kt_stub_t *s, kvl_status_t status)
{
    kvl_bk_xfer_t *x = s->pending;
    KT_CHECK(x != NULL);
    s->pending = NULL;
    kvl_error_t e;
    kvl_bk_error_set(&e, status, 0, s->name, -1, "stub %s: completed with %s", s->name,
                     kvl_status_name(status));
    kvli_xfer_ctx_done(x, status, status == KVL_OK ? NULL : &e);
}

void *kt_md_blob(const kt_rmd_t *m, size_t *len_p)
{
    kvli_md_t md;
    kvl_error_t err;
    uint8_t *blob = NULL;
    kvli_md_region_t *regs = calloc(m->n_regions + 1, sizeof(*regs));
    uint64_t *keys = calloc(m->n_regions + 1, sizeof(*keys));
    KT_CHECK(regs != NULL && keys != NULL);
    memset(&md, 0, sizeof(md));
    kvli_scopy(md.name, sizeof(md.name), m->name);
    md.incarnation = m->incarnation;
    md.start_ns = m->start_ns;
    md.generation = m->generation;
    md.n_backends = m->n_backends;
    for (unsigned b = 0; b < m->n_backends; b++) {
        kvli_scopy(md.backends[b].name, sizeof(md.backends[b].name), m->backends[b]);
        md.backends[b].conn = (const uint8_t *)m->backends[b];
        md.backends[b].conn_len = (uint32_t)strlen(m->backends[b]);
    }
    for (size_t i = 0; i < m->n_regions; i++) {
        keys[i] = m->regions[i].addr;
        regs[i].addr = m->regions[i].addr;
        regs[i].len = m->regions[i].len;
        regs[i].kind = m->kinds ? m->kinds[i] : KVL_MEM_DRAM;
        regs[i].dev = m->regions[i].dev;
        for (unsigned b = 0; b < m->n_backends; b++)
            regs[i].keys[b] = (kvli_md_key_t){(const uint8_t *)&keys[i], sizeof(keys[i]), true};
    }
    md.regions = regs;
    md.n_regions = (uint32_t)m->n_regions;
    KT_CHECK(kvli_md_encode(&md, &blob, len_p, &err) == KVL_OK);
    free(regs);
    free(keys);
    return blob;
}

void kt_md_load(kvl_agent_t *a, const kt_rmd_t *m)
{
    size_t len;
    void *blob = kt_md_blob(m, &len);
    KT_OK(kvl_metadata_load(a, blob, len, NULL, 0));
    free(blob);
}
