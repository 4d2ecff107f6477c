/*
 * kvlane shm backend: memory. Local registration and its key, remote
 * regions, and the mappings of peers' shareable (memfd) allocations.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "common/errname.h"
#include "common/host.h"
#include "shm.h"

#define KVLI_SHM_KEY_MAGIC 0x52534c4bu      /* "KLSR" */
#define KVLI_SHM_KEY_VERSION 2u
#define KVLI_SHM_KEY_LEN 40u
enum { KVLI_SHM_KEY_CMA_ONLY = 1, KVLI_SHM_KEY_MEMFD = 2 };

kvl_status_t kvli_shm_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p,
                             char *detail, size_t detail_len, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_mh_t *mh;
    uintptr_t ps = (uintptr_t)kvli_host_pagesize();
    kvl_status_t st;

    if (r == NULL || mh_p == NULL || r->len == 0 || r->addr + r->len < r->addr ||
        r->addr + r->len > (uint64_t)UINTPTR_MAX - ps) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                         "register [0x%" PRIx64 ", +%" PRIu64 "): empty or wrapping range",
                         r ? r->addr : 0, r ? r->len : 0);
        kvl_bk_error_hint(err, "pass a non-empty range inside the address space");
        return KVL_ERR_INVALID_ARG;
    }
    if (r->kind != KVL_MEM_DRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_SHM_NAME, r->dev,
                         "register [0x%" PRIx64 ", +%" PRIu64 "): memory kind %d is not "
                         "DRAM", r->addr, r->len, (int)r->kind);
        kvl_bk_error_hint(err, "the shm backend moves host memory only; use the cuda "
                          "backend for GPU memory");
        return KVL_ERR_UNSUPPORTED;
    }
    /* That the range is mapped and readable host memory the core checked
     * for the whole registration list at once (common/host.c). */
    if (r->shm_fd >= 0 && (r->shm_off > r->shm_size || r->len > r->shm_size - r->shm_off)) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                         "register [0x%" PRIx64 ", +%" PRIu64 "): offset %" PRIu64
                         " + length exceeds its shareable allocation of %" PRIu64 " bytes",
                         r->addr, r->len, r->shm_off, r->shm_size);
        kvl_bk_error_hint(err, "a kvlane bug (the core computed the allocation bounds)");
        return KVL_ERR_INVALID_ARG;
    }
    mh = calloc(1, sizeof(*mh));
    if (mh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "calloc(%zu) failed", sizeof(*mh));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    mh->addr = r->addr;
    mh->len = r->len;
    mh->shareable = r->shm_fd >= 0;
    mh->shm_id = r->shm_id;
    mh->shm_off = r->shm_off;
    mh->shm_size = r->shm_size;
    st = kvli_shm_guard_slot_get(iface, mh, err);
    if (st != KVL_OK) {
        free(mh);
        return st;
    }
    kvl_bk_scopy(detail, detail_len, mh->shareable ? "mmap (shareable allocation)"
                                                        : "cma (cross-memory attach)");
    *mh_p = mh;
    return KVL_OK;
}

void kvli_shm_md_dereg(void *bk, void *mh)
{
    kvli_shm_guard_slot_put(bk, mh); /* no peer copies into it from here on */
    free(mh);
}

/* Key layout: 0 magic u32 | 4 version u16 | 6 kind u16 | 8 shm_id | 16 shm_off
 * | 24 shm_size (u64 each) | 32 guard slot u32 | 36 generation u32 (native
 * order). */
kvl_status_t kvli_shm_md_pack(void *bk, void *mh_h, uint8_t *buf, size_t cap,
                              size_t *len_p)
{
    kvli_shm_mh_t *mh = mh_h;
    uint32_t magic = KVLI_SHM_KEY_MAGIC;
    uint16_t ver = KVLI_SHM_KEY_VERSION;
    uint16_t kind = mh->shareable ? KVLI_SHM_KEY_MEMFD : KVLI_SHM_KEY_CMA_ONLY;
    uint64_t zero = 0;
    (void)bk;
    if (cap < KVLI_SHM_KEY_LEN)
        return KVL_ERR_INVALID_ARG;
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &ver, 2);
    memcpy(buf + 6, &kind, 2);
    memcpy(buf + 8, mh->shareable ? &mh->shm_id : &zero, 8);
    memcpy(buf + 16, mh->shareable ? &mh->shm_off : &zero, 8);
    memcpy(buf + 24, mh->shareable ? &mh->shm_size : &zero, 8);
    memcpy(buf + 32, &mh->slot, 4);
    memcpy(buf + 36, &mh->gen, 4);
    *len_p = KVLI_SHM_KEY_LEN;
    return KVL_OK;
}

static kvl_status_t kvli_shm_key_bad(kvl_error_t *err, kvli_shm_peer_t *peer,
                                     const kvl_region_info_t *r, const char *why,
                                     uint64_t v)
{
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_SHM_NAME, -1,
                     "shm key of agent '%s' region [0x%" PRIx64 ", +%" PRIu64 "): %s "
                     "(%" PRIu64 ")", peer->name, r ? r->addr : 0, r ? r->len : 0, why, v);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    kvl_bk_error_hint(err, "the metadata blob is corrupted or from an incompatible "
                      "kvlane build; fetch it again from the peer");
    return KVL_ERR_BAD_METADATA;
}

/* Find or create the mapping of a peer's allocation; takes one reference. */
static kvl_status_t kvli_shm_map_get(kvli_shm_peer_t *peer, uint64_t shm_id,
                                     uint64_t need, kvli_shm_map_t **map_p,
                                     kvl_error_t *err)
{
    kvli_shm_iface_t *iface = peer->iface;
    kvli_shm_map_t *m;
    struct stat st;
    uint64_t size = 0;
    void *base;
    kvl_status_t s;
    int fd = -1, e;

    pthread_mutex_lock(&iface->lock);
    for (m = peer->maps; m != NULL; m = m->next) {
        if (m->shm_id == shm_id) {
            m->refs++;
            pthread_mutex_unlock(&iface->lock);
            if (m->size < need)
                goto err_small_ref;
            *map_p = m;
            return KVL_OK;
        }
    }
    pthread_mutex_unlock(&iface->lock);

    s = kvli_shm_peer_fd_request(peer, shm_id, &fd, &size, err);
    if (s != KVL_OK)
        return s;
    if (fstat(fd, &st) != 0) {
        e = errno;
        close(fd);
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "fstat(memfd of agent '%s' allocation %" PRIu64 ") = -1 %s (%s)",
                         peer->name, shm_id, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "unexpected; report it with the log");
        return KVL_ERR_SYSTEM;
    }
    /* Mapping past the file's end would SIGBUS on the first copy. */
    if (size < need || (uint64_t)st.st_size < size || size > (uint64_t)SIZE_MAX) {
        close(fd);
        kvl_bk_error_set(err, KVL_ERR_REMOTE, 0, KVLI_SHM_NAME, -1,
                         "agent '%s' allocation %" PRIu64 ": memfd is %" PRIu64 " bytes, "
                         "the peer says %" PRIu64 ", the region needs %" PRIu64,
                         peer->name, shm_id, (uint64_t)st.st_size, size, need);
        kvl_bk_error_hint(err, "the peer's allocation shrank or its metadata is stale; "
                          "fetch the peer's metadata again");
        return KVL_ERR_REMOTE;
    }
    /* Populate now so the first transfer does not pay one page fault per page. */
    base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                fd, 0);
    e = errno;
    close(fd);
    if (base == MAP_FAILED) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "mmap(%" PRIu64 " bytes, MAP_SHARED, memfd of agent '%s' "
                         "allocation %" PRIu64 ") = -1 %s (%s)", size, peer->name, shm_id,
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the address-space limit (ulimit -v) and "
                          "vm.max_map_count");
        return e == ENOMEM ? KVL_ERR_NO_MEMORY : KVL_ERR_SYSTEM;
    }
    pthread_mutex_lock(&iface->lock);
    for (m = peer->maps; m != NULL; m = m->next) {
        if (m->shm_id == shm_id) {
            /* Another thread mapped it meanwhile; keep theirs. */
            m->refs++;
            pthread_mutex_unlock(&iface->lock);
            munmap(base, (size_t)size);
            if (m->size < need)
                goto err_small_ref;
            *map_p = m;
            return KVL_OK;
        }
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        pthread_mutex_unlock(&iface->lock);
        munmap(base, (size_t)size);
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "calloc(%zu) failed", sizeof(*m));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    m->shm_id = shm_id;
    m->base = base;
    m->size = size;
    m->refs = 1;
    m->next = peer->maps;
    peer->maps = m;
    peer->n_maps_ever++;
    pthread_mutex_unlock(&iface->lock);
    iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "mapped allocation %" PRIu64 " of agent "
                    "'%s' (%" PRIu64 " bytes)", shm_id, peer->name, size);
    *map_p = m;
    return KVL_OK;

err_small_ref:
    pthread_mutex_lock(&iface->lock);
    m->refs--;
    pthread_mutex_unlock(&iface->lock);
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_SHM_NAME, -1,
                     "agent '%s' allocation %" PRIu64 " is mapped with %" PRIu64
                     " bytes; a region of its metadata needs %" PRIu64, peer->name,
                     shm_id, m->size, need);
    kvl_bk_error_hint(err, "the peer's metadata is inconsistent; fetch it again");
    return KVL_ERR_BAD_METADATA;
}

static void kvli_shm_map_put(kvli_shm_peer_t *peer, kvli_shm_map_t *map)
{
    kvli_shm_iface_t *iface = peer->iface;
    kvli_shm_map_t **mp;
    int last = 0;
    pthread_mutex_lock(&iface->lock);
    if (--map->refs == 0) {
        for (mp = &peer->maps; *mp != NULL; mp = &(*mp)->next) {
            if (*mp == map) {
                *mp = map->next;
                break;
            }
        }
        last = 1;
    }
    pthread_mutex_unlock(&iface->lock);
    if (last) {
        if (map->base != NULL) /* NULL: released with its dead peer */
            munmap(map->base, (size_t)map->size);
        free(map);
    }
}

void kvli_shm_md_unmap_all(kvli_shm_peer_t *peer)
{
    kvli_shm_map_t *m, *n;
    for (m = peer->maps; m != NULL; m = n) {
        n = m->next;
        if (m->base != NULL)
            munmap(m->base, (size_t)m->size);
        free(m);
    }
    peer->maps = NULL;
}

void kvli_shm_md_unmap_dead(kvli_shm_peer_t *peer)
{
    for (kvli_shm_map_t *m = peer->maps; m != NULL; m = m->next) {
        if (m->base != NULL)
            munmap(m->base, (size_t)m->size);
        m->base = NULL; /* the struct stays: remote regions still count on it */
    }
}

kvl_status_t kvli_shm_md_rload(void *bk, void *peer_h, const kvl_region_info_t *r,
                               const uint8_t *key, size_t len, void **rh_p,
                               kvl_error_t *err)
{
    kvli_shm_peer_t *peer = peer_h;
    kvli_shm_rh_t *rh;
    uint32_t magic;
    uint16_t ver, kind;
    uint64_t id, off, size;
    uint32_t slot, gen;
    kvl_status_t st;
    (void)bk;

    if (r == NULL || r->len == 0 || r->addr + r->len < r->addr)
        return kvli_shm_key_bad(err, peer, r, "empty or wrapping region length",
                                r ? r->len : 0);
    if (key == NULL || len != KVLI_SHM_KEY_LEN)
        return kvli_shm_key_bad(err, peer, r, "key length is not 40", len);
    memcpy(&magic, key, 4);
    memcpy(&ver, key + 4, 2);
    memcpy(&kind, key + 6, 2);
    memcpy(&id, key + 8, 8);
    memcpy(&off, key + 16, 8);
    memcpy(&size, key + 24, 8);
    memcpy(&slot, key + 32, 4);
    memcpy(&gen, key + 36, 4);
    if (magic != KVLI_SHM_KEY_MAGIC)
        return kvli_shm_key_bad(err, peer, r, "bad key magic", magic);
    if (ver != KVLI_SHM_KEY_VERSION)
        return kvli_shm_key_bad(err, peer, r, "key version not supported", ver);
    if (kind != KVLI_SHM_KEY_CMA_ONLY && kind != KVLI_SHM_KEY_MEMFD)
        return kvli_shm_key_bad(err, peer, r, "unknown key kind", kind);
    if (slot >= KVLI_SHM_GUARD_REGIONS || gen == 0)
        return kvli_shm_key_bad(err, peer, r, "guard slot or generation out of range", slot);
    if (kind == KVLI_SHM_KEY_MEMFD && (size == 0 || off > size || r->len > size - off))
        return kvli_shm_key_bad(err, peer, r, "region exceeds its allocation at offset",
                                off);
    if (r->kind != KVL_MEM_DRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_SHM_NAME, r->dev,
                         "region [0x%" PRIx64 ", +%" PRIu64 ") of agent '%s' has memory "
                         "kind %d, not DRAM", r->addr, r->len, peer->name, (int)r->kind);
        kvl_bk_error_hint(err, "the shm backend reaches remote host memory only");
        return KVL_ERR_UNSUPPORTED;
    }
    rh = calloc(1, sizeof(*rh));
    if (rh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "calloc(%zu) failed", sizeof(*rh));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    rh->peer = peer;
    rh->addr = r->addr;
    rh->len = r->len;
    rh->shareable = kind == KVLI_SHM_KEY_MEMFD;
    rh->shm_id = id;
    rh->shm_off = off;
    rh->shm_size = size;
    rh->slot = slot;
    rh->gen = gen;
    /* Eager: a refusal surfaces here, where the caller can act on it, and
     * the first transfer pays no round trip. */
    if (rh->shareable && peer->guard != NULL) { /* no guard: socket path only */
        st = kvli_shm_map_get(peer, id, off + r->len, &rh->map, err);
        if (st != KVL_OK) {
            free(rh);
            return st;
        }
    }
    *rh_p = rh;
    return KVL_OK;
}

void kvli_shm_md_runload(void *bk, void *peer_h, void *rh_h)
{
    kvli_shm_rh_t *rh = rh_h;
    (void)bk;
    (void)peer_h;
    if (rh == NULL)
        return;
    if (rh->map != NULL)
        kvli_shm_map_put(rh->peer, rh->map);
    free(rh);
}
