/*
 * kvlane ucx backend: memory. Local regions are mapped with an explicit
 * memory type (ucp_mem_map + UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) and their
 * packed rkey travels in the region key; remote keys are checked and
 * unpacked on the peer's endpoint.
 *
 * Every mapped region is on iface->mhs until unmapped, so close() and the
 * process-exit teardown unmap whatever is left before the worker and the
 * context go (UCX aborts with "destroying inuse region" otherwise).
 *
 * Region key (native byte order, version 1):
 *   0 magic u32 | 4 version u16 | 6 memory type u16 | 8 addr u64 | 16 len u64
 *  24 rkey length u32 | 28 crc32 of the rkey u32 | 32 rkey bytes
 * A staged VRAM region (UCX cannot map GPU memory; ucx_stage.c) has no
 * rkey: memory type cuda, rkey length 0, crc 0.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/host.h"
#include "ucx.h"

#define KVLI_UCX_KEY_MAGIC 0x4b554c4bu   /* "KLUK" */
#define KVLI_UCX_KEY_VERSION 1u
#define KVLI_UCX_KEY_FIXED 32u

void kvli_ucx_md_unmap(kvli_ucx_iface_t *iface, kvli_ucx_mh_t *mh)
{
    pthread_mutex_lock(&iface->lock);
    if (mh->prev)
        mh->prev->next = mh->next;
    else if (iface->mhs == mh)
        iface->mhs = mh->next;
    if (mh->next)
        mh->next->prev = mh->prev;
    mh->next = mh->prev = NULL;
    pthread_mutex_unlock(&iface->lock);
    if (mh->rkey_buf != NULL)
        ucp_rkey_buffer_release(mh->rkey_buf);
    mh->rkey_buf = NULL;
    if (mh->alloc != NULL) {
        /* the allocation's memh: it is unmapped with the allocation */
        pthread_mutex_lock(&iface->lock);
        mh->alloc->regions--;
        pthread_mutex_unlock(&iface->lock);
        mh->alloc = NULL;
        mh->memh = NULL;
    }
    if (mh->memh != NULL && iface->context != NULL) {
        ucs_status_t s = ucp_mem_unmap(iface->context, mh->memh);
        if (s != UCS_OK)
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "ucp_mem_unmap(0x%llx+%llu) = %s",
                            (unsigned long long)mh->addr, (unsigned long long)mh->len,
                            ucs_status_string(s));
    }
    mh->memh = NULL;
}

/* Under iface->lock: the allocation holding [addr, addr+len), or NULL. */
static kvli_ucx_alloc_t *kvli_ucx_alloc_find(kvli_ucx_iface_t *iface, uint64_t addr,
                                             uint64_t len)
{
    for (kvli_ucx_alloc_t *al = iface->allocs; al != NULL; al = al->next)
        if (addr >= al->addr && addr - al->addr <= al->len && len <= al->len - (addr - al->addr))
            return al;
    return NULL;
}

/* What backs the memory at addr, from /proc/self/maps: UCX's sysv and posix
 * memory domains allocate shared segments peers can map; anything else
 * (UCX fell back to mmap or the heap) is private memory. */
static void kvli_ucx_alloc_backing(kvli_ucx_alloc_t *al)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    snprintf(al->backing, sizeof(al->backing), "private memory");
    al->shared = 0;
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long long lo, hi;
        int off = 0;
        if (sscanf(line, "%llx-%llx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2 || off == 0)
            continue;
        if (al->addr < lo || al->addr >= hi)
            continue;
        const char *path = line + off;
        if (strstr(path, "SYSV") != NULL) {
            snprintf(al->backing, sizeof(al->backing), "sysv shared memory segment");
            al->shared = 1;
        } else if (strstr(path, "/dev/shm") != NULL || strstr(path, "ucx_shm_posix") != NULL ||
                   strstr(path, "memfd:") != NULL) {
            snprintf(al->backing, sizeof(al->backing), "posix shared memory");
            al->shared = 1;
        } else if (strstr(path, "hugepages") != NULL) {
            snprintf(al->backing, sizeof(al->backing), "huge pages (private)");
        }
        break;
    }
    fclose(f);
}

kvl_status_t kvli_ucx_md_alloc(void *bk, size_t len, void **ptr_p, void **ah_p, char *detail,
                               size_t detail_len, kvl_error_t *err)
{
    kvli_ucx_iface_t *iface = bk;
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t ma;
    kvli_ucx_alloc_t *al;
    kvli_ucx_log_t log;
    char said[1100];
    ucs_status_t s;

    if (iface->config_bad && iface->missing_refuse) {
        memcpy(err, &iface->config_err, offsetof(kvl_error_t, causes));
        return iface->config_err.code;
    }
    al = calloc(1, sizeof(*al));
    if (al == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1,
                         "calloc(%zu) failed", sizeof(*al));
        return KVL_ERR_NO_MEMORY;
    }
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = NULL;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    mp.memory_type = UCS_MEMORY_TYPE_HOST;
    kvli_ucx_log_begin(&log);
    s = ucp_mem_map(iface->context, &mp, &al->memh);
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        char shm[96];
        kvli_host_dev_shm(shm, sizeof(shm));
        kvl_bk_error_set(err, s == UCS_ERR_NO_MEMORY ? KVL_ERR_NO_MEMORY : KVL_ERR_SYSTEM, 0,
                         KVLI_UCX_NAME, -1, "ucp_mem_map(ALLOCATE, %zu bytes, host) = %s (%s)%s",
                         len, ucs_status_string(s), shm,
                         kvli_ucx_log_said(&log, said, sizeof(said)));
        kvl_bk_error_hint(err, "check free memory and the shared-memory limits UCX allocates "
                          "under: /dev/shm size (posix), kernel.shmmax/shmall and ulimit -l "
                          "(sysv); UCX_ALLOC_PRIO sets where UCX allocates");
        free(al);
        return err->code;
    }
    memset(&ma, 0, sizeof(ma));
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(al->memh, &ma);
    if (s != UCS_OK || ma.address == NULL || ma.length < len) {
        kvl_bk_error_set(err, KVL_ERR_INTERNAL, 0, KVLI_UCX_NAME, -1,
                         "ucp_mem_query(allocation of %zu bytes) = %s, %zu bytes at %p", len,
                         ucs_status_string(s), s == UCS_OK ? ma.length : 0,
                         s == UCS_OK ? ma.address : NULL);
        kvl_bk_error_hint(err, "this UCX did not report the memory it allocated; use "
                          "kvl_mem_alloc() or application memory");
        ucp_mem_unmap(iface->context, al->memh);
        free(al);
        return KVL_ERR_INTERNAL;
    }
    al->addr = (uint64_t)(uintptr_t)ma.address;
    al->len = len;
    kvli_ucx_alloc_backing(al);
    pthread_mutex_lock(&iface->lock);
    al->next = iface->allocs;
    if (iface->allocs)
        iface->allocs->prev = al;
    iface->allocs = al;
    pthread_mutex_unlock(&iface->lock);
    snprintf(detail, detail_len, "ucp_mem_map ALLOCATE, %s", al->backing);
    *ptr_p = ma.address;
    *ah_p = al;
    return KVL_OK;
}

void kvli_ucx_md_alloc_unmap(kvli_ucx_iface_t *iface, kvli_ucx_alloc_t *al)
{
    pthread_mutex_lock(&iface->lock);
    if (al->prev)
        al->prev->next = al->next;
    else if (iface->allocs == al)
        iface->allocs = al->next;
    if (al->next)
        al->next->prev = al->prev;
    al->next = al->prev = NULL;
    pthread_mutex_unlock(&iface->lock);
    if (al->memh != NULL && iface->context != NULL) {
        ucs_status_t s = ucp_mem_unmap(iface->context, al->memh);
        if (s != UCS_OK)
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "ucp_mem_unmap(UCX allocation "
                            "0x%llx+%llu) = %s", (unsigned long long)al->addr,
                            (unsigned long long)al->len, ucs_status_string(s));
    }
    al->memh = NULL;
}

void kvli_ucx_md_free(void *bk, void *ah)
{
    kvli_ucx_alloc_t *al = ah;
    if (al == NULL)
        return;
    kvli_ucx_md_alloc_unmap(bk, al);
    free(al);
}

/* On iface->mhs from now on: unmapped at close at the latest. */
static void kvli_ucx_mh_link(kvli_ucx_iface_t *iface, kvli_ucx_mh_t *mh)
{
    pthread_mutex_lock(&iface->lock);
    mh->next = iface->mhs;
    if (iface->mhs)
        iface->mhs->prev = mh;
    iface->mhs = mh;
    pthread_mutex_unlock(&iface->lock);
}

kvl_status_t kvli_ucx_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p,
                             char *detail, size_t detail_len, kvl_error_t *err)
{
    kvli_ucx_iface_t *iface = bk;
    ucp_mem_map_params_t mp;
    kvli_ucx_log_t log;
    kvli_ucx_mh_t *mh;
    char said[1100], note[200];
    ucs_status_t s;

    if (iface->config_bad && iface->missing_refuse) {
        memcpy(err, &iface->config_err, offsetof(kvl_error_t, causes));
        return iface->config_err.code;
    }
    if (r->kind != KVL_MEM_DRAM && r->kind != KVL_MEM_VRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_UCX_NAME, r->dev,
                         "%s memory is not served by the ucx backend", 
                         r->kind == KVL_MEM_FILE ? "FILE" : "this kind of");
        kvl_bk_error_hint(err, "register DRAM or VRAM on ucx");
        return KVL_ERR_UNSUPPORTED;
    }
    /* VRAM this UCX cannot map is staged through host memory */
    int staged = r->kind == KVL_MEM_VRAM && !(iface->mem_types & (1ull << UCS_MEMORY_TYPE_CUDA));
    if (staged && kvli_ucx_stage_reg(iface, r, err) != KVL_OK)
        return err->code;
    mh = calloc(1, sizeof(*mh));
    if (mh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, r->dev,
                         "calloc(%zu) failed", sizeof(*mh));
        return KVL_ERR_NO_MEMORY;
    }
    mh->addr = r->addr;
    mh->len = r->len;
    mh->kind = r->kind;
    mh->dev = r->dev;
    mh->staged = staged;
    if (staged) {
        unsigned maj, min, rel;
        ucp_get_version(&maj, &min, &rel);
        kvli_ucx_mh_link(iface, mh);
        kvli_ucx_stage_expect(iface);
        snprintf(detail, detail_len, "staged: VRAM <-> pinned host buffers (CUDA copies) <-> "
                 "UCX active messages over %.80s; this UCX (%u.%u.%u) cannot map GPU memory",
                 iface->tls_list, maj, min, rel);
        *mh_p = mh;
        return KVL_OK;
    }
    /* Inside memory UCX allocated (mem_alloc): use the allocation's handle.
     * Mapping the range again would register it as application memory,
     * which only cma reaches; the allocation's handle carries the sysv/posix
     * segment peers map. */
    if (r->kind == KVL_MEM_DRAM) {
        pthread_mutex_lock(&iface->lock);
        mh->alloc = kvli_ucx_alloc_find(iface, r->addr, r->len);
        if (mh->alloc != NULL) {
            mh->alloc->regions++;
            mh->memh = mh->alloc->memh;
        }
        pthread_mutex_unlock(&iface->lock);
    }
    if (mh->alloc == NULL) {
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.address = (void *)(uintptr_t)r->addr;
        mp.length = r->len;
        mp.memory_type = r->kind == KVL_MEM_VRAM ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
        kvli_ucx_log_begin(&log);
        s = ucp_mem_map(iface->context, &mp, &mh->memh);
        kvli_ucx_log_end();
        if (s != UCS_OK) {
            mh->memh = NULL;
            kvli_ucx_diag_map_failed(iface, r, s, &log, err);
            free(mh);
            return err->code;
        }
    }
    kvli_ucx_log_begin(&log);
    s = ucp_rkey_pack(iface->context, mh->memh, &mh->rkey_buf, &mh->rkey_len);
    kvli_ucx_log_end();
    if (s != UCS_OK || mh->rkey_len > KVL_BK_KEY_MAX - KVLI_UCX_KEY_FIXED) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_UCX_NAME, r->dev,
                         "ucp_rkey_pack(0x%llx+%llu) = %s, key %zu bytes (room %u)%s",
                         (unsigned long long)r->addr, (unsigned long long)r->len,
                         ucs_status_string(s), s == UCS_OK ? mh->rkey_len : 0,
                         KVL_BK_KEY_MAX - KVLI_UCX_KEY_FIXED,
                         kvli_ucx_log_said(&log, said, sizeof(said)));
        kvl_bk_error_hint(err, "limit the transports (UCX_TLS) so the remote key fits");
        if (s != UCS_OK)
            mh->rkey_buf = NULL;
        /* not on the list yet: unmap here, on this error path too */
        if (mh->rkey_buf != NULL)
            ucp_rkey_buffer_release(mh->rkey_buf);
        if (mh->alloc != NULL) {
            pthread_mutex_lock(&iface->lock);
            mh->alloc->regions--;
            pthread_mutex_unlock(&iface->lock);
        } else {
            ucp_mem_unmap(iface->context, mh->memh);
        }
        free(mh);
        return KVL_ERR_SYSTEM;
    }
    kvli_ucx_mh_link(iface, mh);
    if (detail_len == 0) { /* no report asked for: format nothing */
        *mh_p = mh;
        return KVL_OK;
    }
    if (mh->alloc != NULL) {
        const char *tl = iface->tls_list;
        int mm = strstr(tl, "sysv") != NULL || strstr(tl, "posix") != NULL;
        snprintf(detail, detail_len, "UCX-allocated memory (%.60s, from kvl_mem_alloc_ex): the "
                 "allocation's ucp_mem_map handle, rkey %zu B; %s; transports %.100s",
                 mh->alloc->backing, mh->rkey_len,
                 mh->alloc->shared && mm ? "peers on this host reach it with a direct copy "
                                           "into the mapped segment (sysv/posix)"
                 : strstr(tl, "cma") != NULL ? "peers on this host reach it through cma"
                                             : "no shared-memory transport: peers reach it "
                                               "through the network transports",
                 tl);
        *mh_p = mh;
        return KVL_OK;
    }
    kvli_ucx_diag_memlock(iface, r->len, note, sizeof(note));
    snprintf(detail, detail_len, "ucp_mem_map(%s), rkey %zu B, transports %.100s%s",
             r->kind == KVL_MEM_VRAM ? "cuda" : "host", mh->rkey_len, iface->tls_list, note);
    *mh_p = mh;
    return KVL_OK;
}

void kvli_ucx_md_dereg(void *bk, void *mhv)
{
    kvli_ucx_mh_t *mh = mhv;
    if (mh == NULL)
        return;
    kvli_ucx_md_unmap(bk, mh);
    free(mh);
}

kvl_status_t kvli_ucx_md_pack(void *bk, void *mhv, uint8_t *buf, size_t cap, size_t *len_p)
{
    kvli_ucx_mh_t *mh = mhv;
    uint16_t ver = KVLI_UCX_KEY_VERSION, mt;
    uint32_t magic = KVLI_UCX_KEY_MAGIC, rl, crc;
    (void)bk;
    if (mh == NULL || (mh->rkey_buf == NULL && !mh->staged) ||
        cap < KVLI_UCX_KEY_FIXED + mh->rkey_len)
        return KVL_ERR_INVALID_ARG;
    mt = (uint16_t)(mh->kind == KVL_MEM_VRAM ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST);
    rl = (uint32_t)mh->rkey_len;
    crc = mh->staged ? 0 : kvli_ucx_crc32(mh->rkey_buf, mh->rkey_len);
    memcpy(buf + 0, &magic, 4);
    memcpy(buf + 4, &ver, 2);
    memcpy(buf + 6, &mt, 2);
    memcpy(buf + 8, &mh->addr, 8);
    memcpy(buf + 16, &mh->len, 8);
    memcpy(buf + 24, &rl, 4);
    memcpy(buf + 28, &crc, 4);
    if (mh->rkey_len > 0)
        memcpy(buf + KVLI_UCX_KEY_FIXED, mh->rkey_buf, mh->rkey_len);
    *len_p = KVLI_UCX_KEY_FIXED + mh->rkey_len;
    return KVL_OK;
}

static kvl_status_t kvli_ucx_key_bad(kvl_error_t *err, const kvli_ucx_peer_t *peer,
                                     const kvl_region_info_t *r, const char *why)
{
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_UCX_NAME, -1,
                     "region key of agent '%.60s' for 0x%llx+%llu is invalid: %s",
                     peer ? peer->name : "?", (unsigned long long)r->addr,
                     (unsigned long long)r->len, why);
    kvl_bk_error_hint(err, "the metadata is corrupted or comes from an incompatible kvlane; "
                      "fetch it again from the agent");
    return KVL_ERR_BAD_METADATA;
}

kvl_status_t kvli_ucx_md_rload(void *bk, void *peerv, const kvl_region_info_t *r,
                               const uint8_t *key, size_t len, void **rh_p, kvl_error_t *err)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_peer_t *peer = peerv;
    uint32_t magic, rl, crc;
    uint16_t ver, mt;
    uint64_t addr, rlen;
    kvli_ucx_log_t log;
    kvli_ucx_rh_t *rh;
    uint8_t *pad;
    char said[1100], why[160];
    ucs_status_t s;

    if (peer == NULL || key == NULL || len < KVLI_UCX_KEY_FIXED) {
        snprintf(why, sizeof(why), "%zu bytes, at least %u expected", len, KVLI_UCX_KEY_FIXED);
        return kvli_ucx_key_bad(err, peer, r, why);
    }
    memcpy(&magic, key, 4);
    memcpy(&ver, key + 4, 2);
    memcpy(&mt, key + 6, 2);
    memcpy(&addr, key + 8, 8);
    memcpy(&rlen, key + 16, 8);
    memcpy(&rl, key + 24, 4);
    memcpy(&crc, key + 28, 4);
    if (magic != KVLI_UCX_KEY_MAGIC || ver != KVLI_UCX_KEY_VERSION) {
        snprintf(why, sizeof(why), "magic 0x%08x version %u (want 0x%08x version %u)", magic,
                 ver, KVLI_UCX_KEY_MAGIC, KVLI_UCX_KEY_VERSION);
        return kvli_ucx_key_bad(err, peer, r, why);
    }
    if (rl != len - KVLI_UCX_KEY_FIXED) {
        snprintf(why, sizeof(why), "rkey length %u does not match the %zu bytes carried", rl,
                 len - KVLI_UCX_KEY_FIXED);
        return kvli_ucx_key_bad(err, peer, r, why);
    }
    if (rl == 0 && (mt != UCS_MEMORY_TYPE_CUDA || crc != 0))
        return kvli_ucx_key_bad(err, peer, r, "no rkey, yet not a staged GPU region");
    if (addr != r->addr || rlen != r->len) {
        snprintf(why, sizeof(why), "key describes 0x%llx+%llu", (unsigned long long)addr,
                 (unsigned long long)rlen);
        return kvli_ucx_key_bad(err, peer, r, why);
    }
    if (mt != UCS_MEMORY_TYPE_HOST && mt != UCS_MEMORY_TYPE_CUDA) {
        snprintf(why, sizeof(why), "memory type %u is not host or cuda", mt);
        return kvli_ucx_key_bad(err, peer, r, why);
    }
    if (rl > 0 && kvli_ucx_crc32(key + KVLI_UCX_KEY_FIXED, rl) != crc)
        return kvli_ucx_key_bad(err, peer, r, "rkey checksum mismatch");
    if (peer->ep == NULL) {
        kvl_bk_error_set(err, KVL_ERR_STATE, 0, KVLI_UCX_NAME, -1,
                         "agent '%.60s' has no UCP endpoint", peer->name);
        return KVL_ERR_STATE;
    }
    rh = calloc(1, sizeof(*rh));
    /* UCX's unpack takes no length: give it the bytes followed by zeros, so
     * a short key cannot make it read past our buffer. */
    pad = calloc(1, rl + KVLI_UCX_PAD);
    if (rh == NULL || pad == NULL) {
        free(rh);
        free(pad);
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    memcpy(pad, key + KVLI_UCX_KEY_FIXED, rl);
    kvli_ucx_log_begin(&log);
    /* rl 0: the peer stages this VRAM; no rkey, its data moves by AM */
    s = rl == 0 ? UCS_OK : ucp_ep_rkey_unpack(peer->ep, pad, &rh->rkey);
    kvli_ucx_log_end();
    if (rl == 0)
        kvli_ucx_stage_expect(iface);
    free(pad);
    if (s != UCS_OK) {
        kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_UCX_NAME, -1,
                         "ucp_ep_rkey_unpack(agent '%.60s', 0x%llx+%llu) = %s%s", peer->name,
                         (unsigned long long)r->addr, (unsigned long long)r->len,
                         ucs_status_string(s), kvli_ucx_log_said(&log, said, sizeof(said)));
        kvl_bk_error_hint(err, "the remote key does not fit this endpoint's transports: check "
                          "that both agents use compatible UCX versions and UCX_TLS");
        free(rh);
        return KVL_ERR_BAD_METADATA;
    }
    rh->peer = peer;
    rh->addr = addr;
    rh->len = rlen;
    pthread_mutex_lock(&iface->lock);
    rh->next = peer->rhs;
    peer->rhs = rh;
    pthread_mutex_unlock(&iface->lock);
    *rh_p = rh;
    return KVL_OK;
}

void kvli_ucx_md_runload(void *bk, void *peerv, void *rhv)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_peer_t *peer = peerv;
    kvli_ucx_rh_t *rh = rhv;
    if (rh == NULL || peer == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    for (kvli_ucx_rh_t **pp = &peer->rhs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == rh) {
            *pp = rh->next;
            break;
        }
    pthread_mutex_unlock(&iface->lock);
    if (rh->rkey != NULL)
        ucp_rkey_destroy(rh->rkey);
    free(rh);
}
