/*
 * kvlane cuda backend: local memory. Classifying a pointer through the
 * driver's pointer attributes (mem_query, called for every registration),
 * registering VRAM and host memory, and the key peers use to map it.
 *
 * Pinned host memory (cuMemHostAlloc, cuMemHostRegister) is DRAM: mem_query
 * does not claim it (KVL_ERR_NOT_FOUND), so the core checks it as host memory
 * and every DRAM backend serves it; this backend sees it is page-locked
 * already and copies to and from it asynchronously.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/host.h"
#include "cuda.h"

#define KVLI_CUDA_KEY_MAGIC 0x4b43554bu      /* "KUCK" */
#define KVLI_CUDA_KEY_VERSION 1u
#define KVLI_CUDA_KEY_LEN 160u

/* Read one pointer attribute into a zeroed 8-byte cell (types vary: bool,
 * int, unsigned, u64; all little-endian on the platforms CUDA supports). */
static CUresult kvli_cuda_attr(const kvli_cuda_drv_t *d, int attr, uint64_t addr, uint64_t *v)
{
    *v = 0;
    return d->cuPointerGetAttribute(v, attr, (CUdeviceptr)addr);
}

static int32_t kvli_cuda_i32(uint64_t v)
{
    uint32_t u = (uint32_t)v;
    int32_t i;
    memcpy(&i, &u, sizeof(i));
    return i;
}

/* Memory type at addr: 0 when the driver does not know the address. */
unsigned kvli_cuda_memtype(const kvli_cuda_drv_t *d, uint64_t addr, CUresult *r_p)
{
    uint64_t v;
    CUresult r = kvli_cuda_attr(d, KVLI_CU_PTR_MEMORY_TYPE, addr, &v);
    if (r_p)
        *r_p = r;
    return r == KVLI_CUDA_SUCCESS ? (unsigned)(uint32_t)v : 0u;
}

/* The allocation holding addr, in the owning device's context. */
static CUresult kvli_cuda_range(const kvli_cuda_drv_t *d, int dev, uint64_t addr, uint64_t *base_p,
                                uint64_t *size_p)
{
    CUdeviceptr b = 0;
    size_t s = 0;
    CUresult r = kvli_cuda_drv_push(dev);
    if (r != KVLI_CUDA_SUCCESS)
        return r;
    r = d->cuMemGetAddressRange(&b, &s, (CUdeviceptr)addr);
    kvli_cuda_drv_pop();
    *base_p = b;
    *size_p = s;
    return r;
}

/*
 * Walk the VMM mappings (chunks) that [addr, addr+len) spans: each must be
 * device memory of the same device, mapped back to back. With bases NULL
 * only counts. Returns 0, or -1 with text.
 */
static int kvli_cuda_walk(const kvli_cuda_drv_t *d, int dev, uint64_t addr, uint64_t len,
                          uint64_t *bases, uint64_t *sizes, uint32_t cap, uint32_t *n_p,
                          char *text, size_t tcap)
{
    uint64_t p = addr, end = addr + len;
    uint32_t n = 0;
    char eb[160];
    while (p < end) {
        uint64_t b = 0, s = 0, v = 0;
        CUresult r;
        if (p != addr) {
            unsigned t = kvli_cuda_memtype(d, p, NULL);
            kvli_cuda_attr(d, KVLI_CU_PTR_DEVICE_ORDINAL, p, &v);
            if (t != KVLI_CU_MEMTYPE_DEVICE || kvli_cuda_i32(v) != dev) {
                snprintf(text, tcap, "the range ends past the mapped GPU memory: 0x%" PRIx64
                         " (offset %" PRIu64 ") is %s", p, p - addr,
                         t == 0 ? "not CUDA memory (unmapped or freed)" : "on another device");
                return -1;
            }
        }
        r = kvli_cuda_range(d, dev, p, &b, &s);
        if (r != KVLI_CUDA_SUCCESS || s == 0 || b > p || p - b >= s) {
            snprintf(text, tcap, "cuMemGetAddressRange(0x%" PRIx64 ") = %.150s", p,
                     kvli_cuda_drv_errstr(r, eb, sizeof(eb)));
            return -1;
        }
        if (n >= cap && bases != NULL) {
            snprintf(text, tcap, "the region spans more than %u mappings", cap);
            return -1;
        }
        if (bases != NULL) {
            bases[n] = b;
            sizes[n] = s;
        }
        n++;
        if (n > KVLI_CUDA_MAX_CHUNKS) {
            snprintf(text, tcap, "the region spans more than %u VMM mappings",
                     KVLI_CUDA_MAX_CHUNKS);
            return -1;
        }
        p = b + s;
    }
    *n_p = n;
    return 0;
}

kvl_status_t kvli_cuda_md_query(uint64_t addr, uint64_t len, int32_t declared_dev,
                                kvl_mem_kind_t *kind_p, int32_t *dev_p, char *info,
                                size_t info_len, kvl_error_t *err)
{
    /* Asked only to classify (no one wants a reason): a process without
     * the driver loaded holds no CUDA memory, and loading it here would
     * cost every CPU-only process a cuInit. */
    if (err == NULL && !kvli_cuda_drv_in_process())
        return KVL_ERR_NOT_FOUND;
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    uint64_t v, base = 0, size = 0, bad;
    unsigned type;
    int dev, legacy;
    CUresult r;
    char eb[160], remap[400];

    if (d == NULL) {
        /* Not ours to claim; the core shows this when VRAM was declared. */
        kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, declared_dev,
                         "%.500s", kvli_cuda_drv_reason());
        kvl_bk_error_hint(err, "install the NVIDIA driver (libcuda.so.1) or make it visible "
                          "to the container (NVIDIA container toolkit), or set KVL_CUDA_DRIVER "
                          "to its path; DRAM keeps working without it");
        return KVL_ERR_NOT_FOUND;
    }
    type = kvli_cuda_memtype(d, addr, &r);
    if (err == NULL && type != KVLI_CU_MEMTYPE_DEVICE && type != KVLI_CU_MEMTYPE_UNIFIED)
        return KVL_ERR_NOT_FOUND; /* not ours, and no one asked why */
    if (type == KVLI_CU_MEMTYPE_HOST || (type != KVLI_CU_MEMTYPE_DEVICE &&
                                         type != KVLI_CU_MEMTYPE_UNIFIED &&
                                         kvli_host_readable(addr, len, &bad) == 0)) {
        /* Host memory: a kind mismatch when VRAM was declared (the core says so). */
        kvl_bk_error_set(err, KVL_ERR_DEVICE_MISMATCH, 0, KVLI_CUDA_NAME, declared_dev,
                         "0x%" PRIx64 "+%" PRIu64 " is %s, not GPU memory", addr, len,
                         type == KVLI_CU_MEMTYPE_HOST
                         ? "page-locked host memory (cudaMallocHost, cuMemHostAlloc or "
                           "cudaHostRegister)"
                         : "host memory mapped in this process (the CUDA driver does not know "
                           "it)");
        kvl_bk_error_hint(err, "register it as DRAM (or KVL_MEM_AUTO to detect the kind): every "
                          "DRAM backend moves it%s", type == KVLI_CU_MEMTYPE_HOST
                          ? ", and the cuda backend copies page-locked memory asynchronously" : "");
        return KVL_ERR_NOT_FOUND;
    }
    if (type != KVLI_CU_MEMTYPE_DEVICE && type != KVLI_CU_MEMTYPE_UNIFIED) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, declared_dev,
                         "the CUDA driver does not know address 0x%" PRIx64 " as GPU memory "
                         "(cuPointerGetAttribute(MEMORY_TYPE) = %.120s, type %u): not GPU "
                         "memory, or freed", addr, kvli_cuda_drv_errstr(r, eb, sizeof(eb)), type);
        kvl_bk_error_hint(err, "pass a live pointer from cudaMalloc / cuMemAlloc / cuMemMap "
                          "(torch: tensor.data_ptr()); host memory is DRAM");
        return KVL_ERR_NOT_FOUND;
    }
    kvli_cuda_attr(d, KVLI_CU_PTR_IS_MANAGED, addr, &v);
    if ((v & 0xff) != 0 || type == KVLI_CU_MEMTYPE_UNIFIED) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_CUDA_NAME, declared_dev,
                         "0x%" PRIx64 " is CUDA managed (unified) memory: the cuda backend "
                         "cannot share it with other processes", addr);
        kvl_bk_error_hint(err, "allocate KV cache with cudaMalloc or the VMM API (PyTorch's "
                          "default allocator), not cudaMallocManaged");
        return KVL_ERR_UNSUPPORTED;
    }
    kvli_cuda_attr(d, KVLI_CU_PTR_DEVICE_ORDINAL, addr, &v);
    dev = kvli_cuda_i32(v);
    if (dev < 0 || dev >= d->ndev) {
        kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, declared_dev,
                         "0x%" PRIx64 " is device memory of CUDA device %d, which is not one of "
                         "the %d devices this process sees", addr, dev, d->ndev);
        kvl_bk_error_hint(err, "check CUDA_VISIBLE_DEVICES");
        return KVL_ERR_NO_DEVICE;
    }
    if (declared_dev != KVL_DEV_ANY && declared_dev != dev) {
        kvli_cuda_drv_remap_text(declared_dev, dev, remap, sizeof(remap));
        kvl_bk_error_set(err, KVL_ERR_DEVICE_MISMATCH, 0, KVLI_CUDA_NAME, declared_dev,
                         "declared device %d, pointer lives on CUDA device %d (PCI %.32s)%.400s",
                         declared_dev, dev, d->devs[dev].pci, remap);
        kvl_bk_error_hint(err, "pass the in-process CUDA ordinal (torch: tensor.device.index, "
                          "torch.cuda.current_device()) or KVL_DEV_ANY to detect it; never the "
                          "TP rank or the physical GPU index");
        return KVL_ERR_DEVICE_MISMATCH;
    }
    r = kvli_cuda_range(d, dev, addr, &base, &size);
    if (r != KVLI_CUDA_SUCCESS) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, dev,
                         "cuMemGetAddressRange(0x%" PRIx64 ") on CUDA device %d = %.160s: the "
                         "allocation was freed or is not mapped", addr, dev,
                         kvli_cuda_drv_errstr(r, eb, sizeof(eb)));
        kvl_bk_error_hint(err, "register only live allocations");
        return KVL_ERR_INVALID_ARG;
    }
    kvli_cuda_attr(d, KVLI_CU_PTR_IS_LEGACY_IPC, addr, &v);
    legacy = (v & 0xff) != 0;
    if (addr + len > base + size) {
        char why[300];
        uint32_t n = 0;
        if (legacy || !d->vmm ||
            kvli_cuda_walk(d, dev, addr, len, NULL, NULL, 0, &n, why, sizeof(why)) != 0) {
            if (legacy || !d->vmm)
                snprintf(why, sizeof(why), "one cudaMalloc allocation per region");
            kvl_bk_error_set(err, KVL_ERR_OUT_OF_BOUNDS, 0, KVLI_CUDA_NAME, dev,
                             "range 0x%" PRIx64 "+%" PRIu64 " crosses the end of its CUDA "
                             "allocation [0x%" PRIx64 ", 0x%" PRIx64 ") (%" PRIu64 " bytes) on "
                             "device %d: %.200s", addr, len, base, base + size, size, dev, why);
            kvl_bk_error_hint(err, "register at most %" PRIu64 " bytes from 0x%" PRIx64
                              ", or register each allocation as its own region",
                              base + size - addr, addr);
            return KVL_ERR_OUT_OF_BOUNDS;
        }
    }
    if (info != NULL && info_len > 0)
        snprintf(info, info_len, "CUDA device %d (%.40s, PCI %.32s), %s allocation 0x%" PRIx64
                 "+%" PRIu64, dev, d->devs[dev].name, d->devs[dev].pci,
                 legacy ? "cudaMalloc" : "VMM", base, size);
    *kind_p = KVL_MEM_VRAM;
    *dev_p = dev;
    return KVL_OK;
}

kvl_status_t kvli_cuda_md_chunks(const kvli_cuda_mh_t *mh, uint64_t **base_p, uint64_t **size_p,
                                 uint32_t *n_p, char *text, size_t cap)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    uint64_t *b, *s;
    uint32_t n = 0;
    if (d == NULL || mh->nchunks == 0) {
        snprintf(text, cap, "no VMM mappings recorded for this region");
        return KVL_ERR_INTERNAL;
    }
    b = calloc(mh->nchunks, sizeof(*b));
    s = calloc(mh->nchunks, sizeof(*s));
    if (b == NULL || s == NULL) {
        free(b);
        free(s);
        snprintf(text, cap, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    if (kvli_cuda_walk(d, mh->dev, mh->addr, mh->len, b, s, mh->nchunks, &n, text, cap) != 0 ||
        n != mh->nchunks) {
        if (n != mh->nchunks && text[0] == '\0')
            snprintf(text, cap, "the region's mappings changed since registration");
        free(b);
        free(s);
        return KVL_ERR_STATE;
    }
    *base_p = b;
    *size_p = s;
    *n_p = n;
    return KVL_OK;
}

kvl_status_t kvli_cuda_md_check_live(const kvli_cuda_mh_t *mh, kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    uint64_t id = 0;
    unsigned t;
    CUresult r;
    char eb[160];
    if (mh->kind == KVLI_CUDA_MEM_HOST || d == NULL)
        return KVL_OK;
    /* One query per posting: buffer ids are never reused, and a freed
     * pointer has none (the memory type is asked only when that fails). */
    r = kvli_cuda_attr(d, KVLI_CU_PTR_BUFFER_ID, mh->addr, &id);
    if (r == KVLI_CUDA_SUCCESS && id != 0 && id == mh->buffer_id)
        return KVL_OK;
    t = kvli_cuda_memtype(d, mh->addr, &r);
    if (t != KVLI_CU_MEMTYPE_DEVICE || id != mh->buffer_id) {
        kvl_bk_error_set(err, KVL_ERR_STATE, 0, KVLI_CUDA_NAME, mh->dev,
                         "registered GPU region 0x%" PRIx64 "+%" PRIu64 " on device %d was freed "
                         "%s since registration (memory type %u, %.120s)", mh->addr, mh->len,
                         mh->dev, t == KVLI_CU_MEMTYPE_DEVICE ? "and reallocated" : "",
                         t, kvli_cuda_drv_errstr(r, eb, sizeof(eb)));
        kvl_bk_error_hint(err, "deregister GPU memory before freeing it (PyTorch: keep the KV "
                          "tensors alive while they are registered)");
        return KVL_ERR_STATE;
    }
    return KVL_OK;
}

static kvl_status_t kvli_cuda_md_reg_vram(const kvli_cuda_drv_t *d, const kvl_region_info_t *r,
                                          kvli_cuda_mh_t *mh, char *detail, size_t dl,
                                          kvl_error_t *err)
{
    uint64_t v;
    CUresult cr;
    char eb[160], why[300];
    kvl_mem_kind_t k;
    int32_t dev;
    kvl_status_t st = kvli_cuda_md_query(r->addr, r->len, r->dev, &k, &dev, NULL, 0, err);
    if (st != KVL_OK) {
        if (st == KVL_ERR_NOT_FOUND)
            st = KVL_ERR_INVALID_ARG; /* err says why */
        return st;
    }
    mh->dev = dev;
    kvli_cuda_range(d, dev, r->addr, &mh->alloc_base, &mh->alloc_size);
    kvli_cuda_attr(d, KVLI_CU_PTR_BUFFER_ID, r->addr, &mh->buffer_id);
    kvli_cuda_attr(d, KVLI_CU_PTR_IS_LEGACY_IPC, r->addr, &v);
    if ((v & 0xff) != 0) {
        mh->kind = KVLI_CUDA_MEM_LEGACY;
        mh->nchunks = 1;
        cr = kvli_cuda_drv_push(dev);
        if (cr == KVLI_CUDA_SUCCESS) {
            cr = d->cuIpcGetMemHandle(&mh->ipc, (CUdeviceptr)mh->alloc_base);
            kvli_cuda_drv_pop();
        }
        if (cr == KVLI_CUDA_SUCCESS)
            mh->exportable = 1;
        else
            snprintf(mh->why_local, sizeof(mh->why_local), "cuIpcGetMemHandle = %.150s",
                     kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        snprintf(detail, dl, "cudaMalloc memory on device %d (PCI %.32s): %s", dev,
                 d->devs[dev].pci, mh->exportable ? "CUDA IPC (legacy handle)" : mh->why_local);
        return KVL_OK;
    }
    mh->kind = KVLI_CUDA_MEM_VMM;
    if (!d->vmm) {
        snprintf(mh->why_local, sizeof(mh->why_local), "the driver lacks the VMM entry points");
    } else {
        CUmemGenericAllocationHandle h = 0;
        uint32_t n = 0;
        cr = kvli_cuda_drv_push(dev);
        if (cr == KVLI_CUDA_SUCCESS) {
            cr = d->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)r->addr);
            if (cr == KVLI_CUDA_SUCCESS)
                d->cuMemRelease(h);
            kvli_cuda_drv_pop();
        }
        kvli_cuda_attr(d, KVLI_CU_PTR_ALLOWED_HANDLES, r->addr, &v);
        if (kvli_cuda_walk(d, dev, r->addr, r->len, NULL, NULL, 0, &n, why, sizeof(why)) != 0) {
            kvl_bk_error_set(err, KVL_ERR_OUT_OF_BOUNDS, 0, KVLI_CUDA_NAME, dev,
                             "GPU region 0x%" PRIx64 "+%" PRIu64 ": %.300s", r->addr, r->len, why);
            kvl_bk_error_hint(err, "register only mapped GPU memory");
            return KVL_ERR_OUT_OF_BOUNDS;
        }
        mh->nchunks = n;
        if (cr != KVLI_CUDA_SUCCESS)
            snprintf(mh->why_local, sizeof(mh->why_local),
                     "neither cudaMalloc memory (no legacy IPC) nor a VMM mapping "
                     "(cuMemRetainAllocationHandle = %.60s), e.g. cudaMallocAsync pool memory",
                     kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        else if (!((uint32_t)v & KVLI_CU_HANDLE_POSIX_FD))
            snprintf(mh->why_local, sizeof(mh->why_local),
                     "VMM memory created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in "
                     "requestedHandleTypes");
        else
            mh->exportable = 1;
    }
    snprintf(detail, dl, "VMM memory on device %d (PCI %.32s), %u mapping(s): %.200s", dev,
             d->devs[dev].pci, mh->nchunks,
             mh->exportable ? "CUDA IPC (POSIX fd handles)" : mh->why_local);
    return KVL_OK;
}

kvl_status_t kvli_cuda_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p, char *detail,
                              size_t detail_len, kvl_error_t *err)
{
    kvli_cuda_iface_t *iface = bk;
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_mh_t *mh;
    kvl_status_t st;
    char det[384];

    det[0] = '\0';
    if (r == NULL || mh_p == NULL || r->len == 0 || r->addr + r->len < r->addr) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, -1,
                         "register [0x%" PRIx64 ", +%" PRIu64 "): empty or wrapping range",
                         r ? r->addr : 0, r ? r->len : 0);
        kvl_bk_error_hint(err, "pass a non-empty range inside the address space");
        return KVL_ERR_INVALID_ARG;
    }
    if (r->kind != KVL_MEM_VRAM && r->kind != KVL_MEM_DRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_CUDA_NAME, r->dev,
                         "register [0x%" PRIx64 ", +%" PRIu64 "): memory kind %d is neither "
                         "VRAM nor DRAM", r->addr, r->len, (int)r->kind);
        kvl_bk_error_hint(err, "the cuda backend moves GPU and host memory");
        return KVL_ERR_UNSUPPORTED;
    }
    mh = calloc(1, sizeof(*mh));
    if (mh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_CUDA_NAME, -1,
                         "calloc(%zu) failed", sizeof(*mh));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    mh->addr = r->addr;
    mh->len = r->len;
    if (r->kind == KVL_MEM_VRAM) {
        st = kvli_cuda_md_reg_vram(d, r, mh, det, sizeof(det), err);
        if (st != KVL_OK) {
            free(mh);
            return st;
        }
        kvli_cuda_xfer_warm(iface, mh->dev);
    } else {
        mh->kind = KVLI_CUDA_MEM_HOST;
        mh->dev = -1;
        if (r->shm_fd >= 0) { /* otherwise peers' GPUs cannot map it */
            mh->exportable = 1;
            mh->shm_id = r->shm_id;
            mh->shm_off = r->shm_off;
            mh->shm_size = r->shm_size;
        }
        /* No driver call here but with pin_host=sync: asking the driver
         * whether the range is page-locked already costs ~2 us a region
         * on an H200 host, six times the rest of a host registration; the
         * pin thread asks before it pins (cuda_pin.c). */
        if (iface->pin_host == KVLI_CUDA_PINH_OFF)
            kvl_bk_scopy(det, sizeof(det), "host memory, not pinned by kvlane (pin_host=off): "
                         "GPU copies are staged by the driver unless it is page-locked already");
        else if (iface->pin_host == KVLI_CUDA_PINH_SYNC &&
                 kvli_cuda_memtype(d, r->addr, NULL) == KVLI_CU_MEMTYPE_HOST)
            kvl_bk_scopy(det, sizeof(det), "pinned host memory (page-locked already)");
        else
            kvli_cuda_pin_host(iface, mh, det, sizeof(det));
        if (mh->exportable)
            snprintf(det + strlen(det), sizeof(det) - strlen(det),
                     "; shareable allocation: peers map it");
    }
    kvl_bk_scopy(detail, detail_len, det);
    *mh_p = mh;
    return KVL_OK;
}

void kvli_cuda_md_dereg(void *bk, void *mh_h)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_mh_t *mh = mh_h;
    if (mh == NULL)
        return;
    kvli_cuda_pin_drop(iface, mh);
    free(mh);
}

/*
 * Key layout (native order): 0 magic u32 | 4 version u16 | 6 kind u16 | 8 dev i32
 * | 12 nchunks u32 | 16 alloc_base | 24 alloc_size | 32 addr | 40 len | 48 buffer_id
 * | 56 pci char[16] | 72 shm_id | 80 shm_off | 88 shm_size (u64 each) | 96 ipc[64]
 */
kvl_status_t kvli_cuda_md_pack(void *bk, void *mh_h, uint8_t *buf, size_t cap, size_t *len_p)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_mh_t *mh = mh_h;
    uint32_t magic = KVLI_CUDA_KEY_MAGIC, nchunks = mh->nchunks;
    uint16_t ver = KVLI_CUDA_KEY_VERSION, kind = (uint16_t)mh->kind;
    int32_t dev = mh->dev;
    if (!mh->exportable)
        return KVL_ERR_UNSUPPORTED; /* local use only: no key, peers use other backends */
    if (cap < KVLI_CUDA_KEY_LEN)
        return KVL_ERR_INVALID_ARG;
    memset(buf, 0, KVLI_CUDA_KEY_LEN);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &ver, 2);
    memcpy(buf + 6, &kind, 2);
    memcpy(buf + 8, &dev, 4);
    memcpy(buf + 12, &nchunks, 4);
    memcpy(buf + 16, &mh->alloc_base, 8);
    memcpy(buf + 24, &mh->alloc_size, 8);
    memcpy(buf + 32, &mh->addr, 8);
    memcpy(buf + 40, &mh->len, 8);
    memcpy(buf + 48, &mh->buffer_id, 8);
    if (mh->dev >= 0)
        memcpy(buf + 56, iface->drv->devs[mh->dev].pci,
               strnlen(iface->drv->devs[mh->dev].pci, 15));
    memcpy(buf + 72, &mh->shm_id, 8);
    memcpy(buf + 80, &mh->shm_off, 8);
    memcpy(buf + 88, &mh->shm_size, 8);
    memcpy(buf + 96, &mh->ipc, 64);
    *len_p = KVLI_CUDA_KEY_LEN;
    return KVL_OK;
}
