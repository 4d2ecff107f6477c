/*
 * kvlane cuda backend: a peer's memory mapped into this process.
 *   legacy  cudaMalloc memory: cuIpcOpenMemHandle of the key's handle, once
 *           per allocation and peer (the driver refuses a second open);
 *   VMM     cuMemCreate memory (PyTorch expandable segments): the peer
 *           exports each mapping as a POSIX fd over the socket; we import,
 *           reserve one address range and map them back to back;
 *   host    kvl_mem_alloc memory: its memfd over the socket, mmap, then
 *           cuMemHostRegister so the GPU copies to it directly.
 * Mapping is eager (at metadata load); a failure does not refuse the blob
 * (that would cut off the peer's other regions and backends) but is kept
 * and reported by the first transfer that needs the region.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "common/errname.h"
#include "cuda.h"

static kvl_status_t kvli_cuda_key_bad(kvl_error_t *err, kvli_cuda_peer_t *peer,
                                      const kvl_region_info_t *r, const char *why, uint64_t v)
{
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_CUDA_NAME, -1,
                     "cuda key of agent '%s' region [0x%" PRIx64 ", +%" PRIu64 "): %s (%" PRIu64
                     ")", peer->name, r ? r->addr : 0, r ? r->len : 0, why, v);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
    kvl_bk_error_hint(err, "the metadata blob is corrupted or from an incompatible kvlane "
                      "build; fetch it again from the peer");
    return KVL_ERR_BAD_METADATA;
}

static kvli_cuda_map_t *kvli_cuda_map_find(kvli_cuda_peer_t *peer, int kind, uint64_t key,
                                           uint64_t buffer_id)
{
    for (kvli_cuda_map_t *m = peer->maps; m != NULL; m = m->next)
        if (m->kind == kind && m->key == key && m->buffer_id == buffer_id)
            return m;
    return NULL;
}

static void kvli_cuda_map_release(const kvli_cuda_drv_t *d, kvli_cuda_map_t *m)
{
    if (m->kind == KVLI_CUDA_MEM_LEGACY) {
        if (kvli_cuda_drv_push(m->dev) == KVLI_CUDA_SUCCESS) {
            d->cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)m->base);
            kvli_cuda_drv_pop();
        }
    } else {
        if (m->host_pinned && kvli_cuda_drv_push(0) == KVLI_CUDA_SUCCESS) {
            d->cuMemHostUnregister(m->base);
            kvli_cuda_drv_pop();
        }
        munmap(m->base, (size_t)m->size);
    }
    free(m);
}

/* Insert a new mapping unless another thread made one meanwhile. */
static kvli_cuda_map_t *kvli_cuda_map_add(kvli_cuda_peer_t *peer, kvli_cuda_map_t *m)
{
    kvli_cuda_iface_t *iface = peer->iface;
    kvli_cuda_map_t *o;
    pthread_mutex_lock(&iface->lock);
    o = kvli_cuda_map_find(peer, m->kind, m->key, m->buffer_id);
    if (o != NULL) {
        o->refs++;
        pthread_mutex_unlock(&iface->lock);
        kvli_cuda_map_release(iface->drv, m);
        return o;
    }
    m->refs = 1;
    m->next = peer->maps;
    peer->maps = m;
    pthread_mutex_unlock(&iface->lock);
    return m;
}

static void kvli_cuda_rh_unreachable(kvli_cuda_rh_t *rh, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void kvli_cuda_rh_unreachable(kvli_cuda_rh_t *rh, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rh->unreachable, sizeof(rh->unreachable), fmt, ap);
    va_end(ap);
    rh->peer->iface->ctx->log(rh->peer->iface->ctx, KVL_LOG_INFO,
                              "region 0x%" PRIx64 "+%" PRIu64 " of agent '%s' is not mapped: %s",
                              rh->addr, rh->len, rh->peer->name, rh->unreachable);
}

static void kvli_cuda_map_legacy(kvli_cuda_rh_t *rh, const CUipcMemHandle *h, uint64_t base,
                                 uint64_t size, uint64_t buffer_id)
{
    kvli_cuda_peer_t *peer = rh->peer;
    kvli_cuda_iface_t *iface = peer->iface;
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_map_t *m;
    CUdeviceptr p = 0;
    CUresult cr;
    char eb[160];

    pthread_mutex_lock(&iface->lock);
    m = kvli_cuda_map_find(peer, KVLI_CUDA_MEM_LEGACY, base, buffer_id);
    if (m != NULL)
        m->refs++;
    pthread_mutex_unlock(&iface->lock);
    if (m == NULL) {
        cr = kvli_cuda_drv_push(rh->dev);
        if (cr == KVLI_CUDA_SUCCESS) {
            cr = d->cuIpcOpenMemHandle(&p, *h, KVLI_CU_IPC_LAZY_PEER);
            kvli_cuda_drv_pop();
        }
        if (cr != KVLI_CUDA_SUCCESS) {
            kvli_cuda_rh_unreachable(rh, "cuIpcOpenMemHandle(allocation 0x%" PRIx64 " of agent "
                                     "'%s' on its device %d, PCI %s) on our device %d = %s",
                                     base, peer->name, rh->rdev, rh->pci, rh->dev,
                                     kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
            return;
        }
        m = calloc(1, sizeof(*m));
        if (m == NULL) {
            if (kvli_cuda_drv_push(rh->dev) == KVLI_CUDA_SUCCESS) {
                d->cuIpcCloseMemHandle(p);
                kvli_cuda_drv_pop();
            }
            kvli_cuda_rh_unreachable(rh, "out of memory");
            return;
        }
        m->kind = KVLI_CUDA_MEM_LEGACY;
        m->key = base;
        m->buffer_id = buffer_id;
        m->base = (uint8_t *)(uintptr_t)p;
        m->size = size;
        m->dev = rh->dev;
        m = kvli_cuda_map_add(peer, m);
    }
    rh->map = m;
    rh->local = m->base + (rh->addr - base);
}

static void kvli_cuda_map_vmm(kvli_cuda_rh_t *rh, uint32_t nchunks, uint64_t first_base)
{
    kvli_cuda_peer_t *peer = rh->peer;
    const kvli_cuda_drv_t *d = peer->iface->drv;
    int fds[KVLI_CUDA_FDS_MAX];
    uint64_t sizes[KVLI_CUDA_FDS_MAX], off = 0;
    uint32_t got = 0, n, total;
    CUmemAllocationProp prop;
    size_t gran = 0;
    CUresult cr = KVLI_CUDA_SUCCESS;
    kvl_error_t e;
    char eb[160];

    if (!d->vmm) {
        kvli_cuda_rh_unreachable(rh, "this CUDA driver lacks the VMM entry points needed to map "
                                 "the peer's VMM memory");
        return;
    }
    rh->handles = calloc(nchunks, sizeof(*rh->handles));
    rh->chunk_size = calloc(nchunks, sizeof(*rh->chunk_size));
    if (rh->handles == NULL || rh->chunk_size == NULL) {
        kvli_cuda_rh_unreachable(rh, "out of memory");
        return;
    }
    while (got < nchunks) {
        memset(&e, 0, sizeof(e));
        if (kvli_cuda_chan_fds_request(peer, KVLI_CUDA_FDS_VMM, rh->addr, rh->len, got, fds, sizes,
                                       &n, &total, &e) != KVL_OK) {
            kvli_cuda_rh_unreachable(rh, "%s", e.what);
            return;
        }
        if (total != nchunks) {
            for (uint32_t i = 0; i < n; i++)
                close(fds[i]);
            kvli_cuda_rh_unreachable(rh, "the peer now has %u mappings for the region, its "
                                     "metadata said %u (stale metadata?)", total, nchunks);
            return;
        }
        for (uint32_t i = 0; i < n; i++) {
            if (cr == KVLI_CUDA_SUCCESS) {
                cr = kvli_cuda_drv_push(rh->dev);
                if (cr == KVLI_CUDA_SUCCESS) {
                    cr = d->cuMemImportFromShareableHandle(&rh->handles[rh->nh],
                                                           (void *)(uintptr_t)fds[i],
                                                           KVLI_CU_HANDLE_POSIX_FD);
                    kvli_cuda_drv_pop();
                }
                if (cr == KVLI_CUDA_SUCCESS) {
                    rh->chunk_size[rh->nh++] = sizes[i];
                    off += sizes[i];
                }
            }
            close(fds[i]);
        }
        if (cr != KVLI_CUDA_SUCCESS) {
            kvli_cuda_rh_unreachable(rh, "cuMemImportFromShareableHandle(fd of agent '%s', "
                                     "mapping %u) = %s", peer->name, rh->nh,
                                     kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
            return;
        }
        got += n;
    }
    if (rh->addr - first_base + rh->len > off) {
        kvli_cuda_rh_unreachable(rh, "the peer's mappings cover %" PRIu64 " bytes, the region "
                                 "needs %" PRIu64, off, rh->addr - first_base + rh->len);
        return;
    }
    memset(&prop, 0, sizeof(prop));
    prop.type = KVLI_CU_ALLOC_PINNED;
    prop.location.type = KVLI_CU_LOCATION_DEVICE;
    prop.location.id = rh->dev;
    cr = kvli_cuda_drv_push(rh->dev);
    if (cr != KVLI_CUDA_SUCCESS) {
        kvli_cuda_rh_unreachable(rh, "cuCtxPushCurrent(device %d) = %s", rh->dev,
                                 kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        return;
    }
    d->cuMemGetAllocationGranularity(&gran, &prop, 0);
    cr = d->cuMemAddressReserve(&rh->va, (size_t)off, gran, 0, 0);
    if (cr == KVLI_CUDA_SUCCESS) {
        uint64_t o = 0;
        rh->va_size = off;
        for (uint32_t i = 0; i < rh->nh && cr == KVLI_CUDA_SUCCESS; i++) {
            cr = d->cuMemMap(rh->va + o, (size_t)rh->chunk_size[i], 0, rh->handles[i], 0);
            o += rh->chunk_size[i];
        }
        if (cr == KVLI_CUDA_SUCCESS) {
            CUmemAccessDesc a[KVLI_CUDA_MAX_DEVICES];
            size_t na = 0;
            for (int dv = 0; dv < d->ndev; dv++) {
                int can = dv == rh->dev;
                if (!can)
                    d->cuDeviceCanAccessPeer(&can, d->devs[dv].dev, d->devs[rh->dev].dev);
                if (!can)
                    continue;
                a[na].location.type = KVLI_CU_LOCATION_DEVICE;
                a[na].location.id = dv;
                a[na++].flags = KVLI_CU_ACCESS_RW;
            }
            cr = d->cuMemSetAccess(rh->va, (size_t)off, a, na);
        }
    }
    kvli_cuda_drv_pop();
    if (cr != KVLI_CUDA_SUCCESS) {
        kvli_cuda_rh_unreachable(rh, "mapping %u VMM allocation(s) of agent '%s' (%" PRIu64
                                 " bytes) on device %d failed: %s", rh->nh, peer->name, off,
                                 rh->dev, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        return;
    }
    rh->local = (uint8_t *)(uintptr_t)(rh->va + (rh->addr - first_base));
}

static void kvli_cuda_map_host(kvli_cuda_rh_t *rh, uint64_t id, uint64_t off, uint64_t size)
{
    kvli_cuda_peer_t *peer = rh->peer;
    kvli_cuda_iface_t *iface = peer->iface;
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_map_t *m;
    uint64_t sizes[KVLI_CUDA_FDS_MAX];
    int fds[KVLI_CUDA_FDS_MAX];
    uint32_t n = 0, total = 0;
    struct stat st;
    kvl_error_t e;
    void *base;
    CUresult cr;
    char eb[160];

    pthread_mutex_lock(&iface->lock);
    m = kvli_cuda_map_find(peer, KVLI_CUDA_MEM_HOST, id, 0);
    if (m != NULL)
        m->refs++;
    pthread_mutex_unlock(&iface->lock);
    if (m == NULL) {
        memset(&e, 0, sizeof(e));
        if (kvli_cuda_chan_fds_request(peer, KVLI_CUDA_FDS_MEMFD, id, 0, 0, fds, sizes, &n, &total,
                                       &e) != KVL_OK) {
            kvli_cuda_rh_unreachable(rh, "%s", e.what);
            return;
        }
        for (uint32_t i = 1; i < n; i++)
            close(fds[i]);
        if (n != 1 || sizes[0] != size || fstat(fds[0], &st) != 0 ||
            (uint64_t)st.st_size < size || size > (uint64_t)SIZE_MAX) {
            close(fds[0]);
            kvli_cuda_rh_unreachable(rh, "the peer's allocation %" PRIu64 " is not the %" PRIu64
                                     " bytes its metadata says (stale metadata?)", id, size);
            return;
        }
        base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                    fds[0], 0);
        close(fds[0]);
        if (base == MAP_FAILED) {
            int en = errno;
            kvli_cuda_rh_unreachable(rh, "mmap(%" PRIu64 " bytes, memfd of agent '%s') = -1 "
                                     "%s (%s)", size, peer->name, kvli_errno_name(en),
                                     strerror(en));
            return;
        }
        m = calloc(1, sizeof(*m));
        if (m == NULL) {
            munmap(base, (size_t)size);
            kvli_cuda_rh_unreachable(rh, "out of memory");
            return;
        }
        m->kind = KVLI_CUDA_MEM_HOST;
        m->key = id;
        m->base = base;
        m->size = size;
        m->dev = -1;
        cr = kvli_cuda_drv_push(0);
        if (cr == KVLI_CUDA_SUCCESS) {
            cr = d->cuMemHostRegister(base, (size_t)size, KVLI_CU_HOSTREG_PORTABLE |
                                                              KVLI_CU_HOSTREG_DEVICEMAP);
            kvli_cuda_drv_pop();
        }
        if (cr == KVLI_CUDA_SUCCESS)
            m->host_pinned = 1;
        else
            iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                            "cuMemHostRegister(mapping of agent '%s' allocation %" PRIu64
                            ", %" PRIu64 " bytes) = %s: GPU copies to it are staged by the "
                            "driver (slower); check the locked-memory limit (ulimit -l)",
                            peer->name, id, size, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        m = kvli_cuda_map_add(peer, m);
    }
    rh->map = m;
    rh->local = m->base + off;
}

kvl_status_t kvli_cuda_ipc_rload(void *bk, void *peer_h, const kvl_region_info_t *r,
                                 const uint8_t *key, size_t len, void **rh_p, kvl_error_t *err)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_peer_t *peer = peer_h;
    kvli_cuda_rh_t *rh;
    uint32_t magic, nchunks;
    uint16_t ver, kind;
    int32_t dev;
    uint64_t abase, asize, addr, rlen, bid, sid, soff, ssize;
    CUipcMemHandle h;
    char pci[17];

    if (r == NULL || r->len == 0 || r->addr + r->len < r->addr)
        return kvli_cuda_key_bad(err, peer, r, "empty or wrapping region", r ? r->len : 0);
    if (key == NULL || len != 160)
        return kvli_cuda_key_bad(err, peer, r, "key length is not 160", len);
    memcpy(&magic, key, 4);
    memcpy(&ver, key + 4, 2);
    memcpy(&kind, key + 6, 2);
    memcpy(&dev, key + 8, 4);
    memcpy(&nchunks, key + 12, 4);
    memcpy(&abase, key + 16, 8);
    memcpy(&asize, key + 24, 8);
    memcpy(&addr, key + 32, 8);
    memcpy(&rlen, key + 40, 8);
    memcpy(&bid, key + 48, 8);
    memcpy(pci, key + 56, 16);
    pci[16] = '\0';
    memcpy(&sid, key + 72, 8);
    memcpy(&soff, key + 80, 8);
    memcpy(&ssize, key + 88, 8);
    memcpy(&h, key + 96, 64);
    if (magic != 0x4b43554bu)
        return kvli_cuda_key_bad(err, peer, r, "bad key magic", magic);
    if (ver != 1)
        return kvli_cuda_key_bad(err, peer, r, "key version not supported", ver);
    if (addr != r->addr || rlen != r->len)
        return kvli_cuda_key_bad(err, peer, r, "key is for another range, address", addr);
    if (kind == KVLI_CUDA_MEM_LEGACY || kind == KVLI_CUDA_MEM_VMM) {
        if (r->kind != KVL_MEM_VRAM || dev < 0 || dev >= KVLI_CUDA_MAX_DEVICES)
            return kvli_cuda_key_bad(err, peer, r, "GPU key for a region that is not VRAM of a "
                                     "valid device, device", (uint64_t)(uint32_t)dev);
        if (asize == 0 || abase + asize < abase || addr < abase ||
            (kind == KVLI_CUDA_MEM_LEGACY && rlen > asize - (addr - abase)) ||
            (kind == KVLI_CUDA_MEM_VMM && addr - abase >= asize))
            return kvli_cuda_key_bad(err, peer, r, "region lies outside its allocation at",
                                     abase);
        if (kind == KVLI_CUDA_MEM_VMM && (nchunks == 0 || nchunks > KVLI_CUDA_MAX_CHUNKS))
            return kvli_cuda_key_bad(err, peer, r, "VMM mapping count out of range", nchunks);
        if (memchr(pci, '\0', 16) == NULL)
            return kvli_cuda_key_bad(err, peer, r, "PCI id is not terminated", 16);
    } else if (kind == KVLI_CUDA_MEM_HOST) {
        if (r->kind != KVL_MEM_DRAM || ssize == 0 || soff > ssize || rlen > ssize - soff)
            return kvli_cuda_key_bad(err, peer, r, "host key outside its allocation at offset",
                                     soff);
    } else {
        return kvli_cuda_key_bad(err, peer, r, "unknown key kind", kind);
    }
    rh = calloc(1, sizeof(*rh));
    if (rh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_CUDA_NAME, -1, "calloc(%zu) failed",
                         sizeof(*rh));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    rh->peer = peer;
    rh->addr = addr;
    rh->len = rlen;
    rh->kind = kind;
    rh->rdev = dev;
    snprintf(rh->pci, sizeof(rh->pci), "%s", pci);
    rh->dev = -1;
    if (kind != KVLI_CUDA_MEM_HOST) {
        /* Map it on the same physical GPU when this process sees it. */
        rh->dev = kvli_cuda_drv_dev_by_pci(pci);
        if (rh->dev < 0)
            rh->dev = 0;
    }
    if (peer->pid == getpid()) {
        /* Both agents live in this process: the address is usable as is. */
        if (kind != KVLI_CUDA_MEM_HOST)
            rh->dev = dev < iface->drv->ndev ? dev : 0;
        rh->local = (uint8_t *)(uintptr_t)addr;
    } else if (kind == KVLI_CUDA_MEM_LEGACY) {
        kvli_cuda_map_legacy(rh, &h, abase, asize, bid);
    } else if (kind == KVLI_CUDA_MEM_VMM) {
        kvli_cuda_map_vmm(rh, nchunks, abase);
    } else {
        kvli_cuda_map_host(rh, sid, soff, ssize);
    }
    *rh_p = rh;
    return KVL_OK;
}

static void kvli_cuda_map_put(kvli_cuda_peer_t *peer, kvli_cuda_map_t *m)
{
    kvli_cuda_iface_t *iface = peer->iface;
    kvli_cuda_map_t **mp;
    int last = 0;
    pthread_mutex_lock(&iface->lock);
    if (--m->refs == 0) {
        for (mp = &peer->maps; *mp != NULL; mp = &(*mp)->next)
            if (*mp == m) {
                *mp = m->next;
                break;
            }
        last = 1;
    }
    pthread_mutex_unlock(&iface->lock);
    if (last)
        kvli_cuda_map_release(iface->drv, m);
}

void kvli_cuda_ipc_runload(void *bk, void *peer_h, void *rh_h)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_rh_t *rh = rh_h;
    const kvli_cuda_drv_t *d = iface->drv;
    (void)peer_h;
    if (rh == NULL)
        return;
    if (rh->map != NULL)
        kvli_cuda_map_put(rh->peer, rh->map);
    if (rh->nh > 0 && kvli_cuda_drv_push(rh->dev) == KVLI_CUDA_SUCCESS) {
        if (rh->va != 0) {
            d->cuMemUnmap(rh->va, (size_t)rh->va_size);
            d->cuMemAddressFree(rh->va, (size_t)rh->va_size);
        }
        for (uint32_t i = 0; i < rh->nh; i++)
            d->cuMemRelease(rh->handles[i]);
        kvli_cuda_drv_pop();
    }
    free(rh->handles);
    free(rh->chunk_size);
    free(rh);
}

void kvli_cuda_ipc_unmap_all(kvli_cuda_peer_t *peer)
{
    kvli_cuda_map_t *m, *n;
    for (m = peer->maps; m != NULL; m = n) {
        n = m->next;
        kvli_cuda_map_release(peer->iface->drv, m);
    }
    peer->maps = NULL;
}

int kvli_cuda_ipc_export(kvli_cuda_iface_t *iface, int what, uint64_t addr, uint64_t len,
                         uint32_t first, int *fds, uint64_t *sizes, int max, uint32_t *total_p,
                         char *text, size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvl_error_t e;
    void *mh_v = NULL, *pin = NULL;
    int n = 0;

    if (what == KVLI_CUDA_FDS_MEMFD) {
        int fd = -1;
        uint64_t size = 0;
        if (iface->ctx->alloc_lookup(iface->ctx, addr, &fd, &size) != KVL_OK || fd < 0) {
            snprintf(text, cap, "agent '%s' has no shareable allocation with id %" PRIu64,
                     iface->ctx->agent_name, addr);
            return -1;
        }
        fds[0] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (fds[0] < 0) {
            snprintf(text, cap, "fcntl(F_DUPFD_CLOEXEC) = -1 %s", strerror(errno));
            return -1;
        }
        sizes[0] = size;
        *total_p = 1;
        return 1;
    }
    if (what != KVLI_CUDA_FDS_VMM) {
        snprintf(text, cap, "unknown request kind %d", what);
        return -1;
    }
    memset(&e, 0, sizeof(e));
    if (iface->ctx->region_pin(iface->ctx, addr, len, &mh_v, &pin, &e) != KVL_OK) {
        snprintf(text, cap, "%s", e.what);
        return -1;
    }
    {
        kvli_cuda_mh_t *mh = mh_v;
        uint64_t *b = NULL, *s = NULL;
        uint32_t nc = 0;
        char eb[160];
        if (mh == NULL || mh->kind != KVLI_CUDA_MEM_VMM || !mh->exportable) {
            snprintf(text, cap, "region 0x%" PRIx64 "+%" PRIu64 " is not exportable VMM memory",
                     addr, len);
            n = -1;
        } else if (kvli_cuda_md_chunks(mh, &b, &s, &nc, text, cap) != KVL_OK) {
            n = -1;
        } else if (first >= nc) {
            snprintf(text, cap, "mapping %u asked for, the region has %u", first, nc);
            n = -1;
        } else {
            CUresult cr = kvli_cuda_drv_push(mh->dev);
            int pushed = cr == KVLI_CUDA_SUCCESS;
            for (uint32_t i = first; cr == KVLI_CUDA_SUCCESS && i < nc && n < max; i++) {
                CUmemGenericAllocationHandle h = 0;
                int fd = -1;
                cr = d->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)b[i]);
                if (cr == KVLI_CUDA_SUCCESS) {
                    cr = d->cuMemExportToShareableHandle(&fd, h, KVLI_CU_HANDLE_POSIX_FD, 0);
                    d->cuMemRelease(h);
                }
                if (cr == KVLI_CUDA_SUCCESS) {
                    fds[n] = fd;
                    sizes[n++] = s[i];
                }
            }
            if (pushed)
                kvli_cuda_drv_pop();
            if (cr != KVLI_CUDA_SUCCESS) {
                for (int i = 0; i < n; i++)
                    close(fds[i]);
                snprintf(text, cap, "cuMemExportToShareableHandle(POSIX fd) of mapping %u = %.150s",
                         first + (uint32_t)n, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
                n = -1;
            }
            *total_p = nc;
        }
        free(b);
        free(s);
    }
    iface->ctx->region_unpin(iface->ctx, pin);
    return n;
}
