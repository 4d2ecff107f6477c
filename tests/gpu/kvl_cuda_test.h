/*
 * Helpers for kvlane's GPU tests and the cuda benchmark: the CUDA driver
 * through dlopen (tests never link libcudart or libcuda), allocation of
 * device memory (cuMemAlloc and VMM), pinned host memory, copies.
 * Header-only; include once per program.
 */
#ifndef KVL_CUDA_TEST_H
#define KVL_CUDA_TEST_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef int kt_cu_res;
typedef unsigned long long kt_cu_ptr;
typedef struct kt_cu_ctx *kt_cu_ctx_t;
typedef struct kt_cu_stream *kt_cu_stream_t;
typedef struct kt_cu_event *kt_cu_event_t;
typedef struct { int type; int id; } kt_cu_loc;
typedef struct {
    int type, requestedHandleTypes;
    kt_cu_loc location;
    void *win32;
    unsigned char compression, rdma;
    unsigned short usage;
    unsigned char reserved[4];
} kt_cu_prop;
typedef struct { kt_cu_loc location; int flags; } kt_cu_access;

typedef struct kt_cuda {
    void *h;
    kt_cu_res (*Init)(unsigned);
    kt_cu_res (*DeviceGetCount)(int *);
    kt_cu_res (*DeviceGet)(int *, int);
    kt_cu_res (*PrimaryCtxRetain)(kt_cu_ctx_t *, int);
    kt_cu_res (*CtxSetCurrent)(kt_cu_ctx_t);
    kt_cu_res (*CtxSynchronize)(void);
    kt_cu_res (*CtxEnablePeerAccess)(kt_cu_ctx_t, unsigned);
    kt_cu_res (*MemAlloc)(kt_cu_ptr *, size_t);
    kt_cu_res (*MemFree)(kt_cu_ptr);
    kt_cu_res (*MemcpyHtoD)(kt_cu_ptr, const void *, size_t);
    kt_cu_res (*MemcpyDtoH)(void *, kt_cu_ptr, size_t);
    kt_cu_res (*MemcpyDtoD)(kt_cu_ptr, kt_cu_ptr, size_t);
    kt_cu_res (*MemcpyDtoDAsync)(kt_cu_ptr, kt_cu_ptr, size_t, kt_cu_stream_t);
    kt_cu_res (*MemcpyDtoHAsync)(void *, kt_cu_ptr, size_t, kt_cu_stream_t);
    kt_cu_res (*MemsetD8)(kt_cu_ptr, unsigned char, size_t);
    kt_cu_res (*MemHostAlloc)(void **, size_t, unsigned);
    kt_cu_res (*MemFreeHost)(void *);
    kt_cu_res (*MemHostGetFlags)(unsigned *, void *); /* 0: the address is page-locked */
    kt_cu_res (*MemCreate)(unsigned long long *, size_t, const kt_cu_prop *, unsigned long long);
    kt_cu_res (*MemRelease)(unsigned long long);
    kt_cu_res (*MemAddressReserve)(kt_cu_ptr *, size_t, size_t, kt_cu_ptr, unsigned long long);
    kt_cu_res (*MemAddressFree)(kt_cu_ptr, size_t);
    kt_cu_res (*MemMap)(kt_cu_ptr, size_t, size_t, unsigned long long, unsigned long long);
    kt_cu_res (*MemUnmap)(kt_cu_ptr, size_t);
    kt_cu_res (*MemSetAccess)(kt_cu_ptr, size_t, const kt_cu_access *, size_t);
    kt_cu_res (*MemGetAllocationGranularity)(size_t *, const kt_cu_prop *, int);
    kt_cu_res (*StreamCreate)(kt_cu_stream_t *, unsigned);
    kt_cu_res (*StreamSynchronize)(kt_cu_stream_t);
    kt_cu_res (*EventCreate)(kt_cu_event_t *, unsigned);
    kt_cu_res (*EventRecord)(kt_cu_event_t, kt_cu_stream_t);
    kt_cu_res (*EventSynchronize)(kt_cu_event_t);
    kt_cu_res (*EventElapsedTime)(float *, kt_cu_event_t, kt_cu_event_t);
    int ndev;
} kt_cuda_t;

/* Load the driver and make device 0's primary context current. 0 ok; else
 * why (for a 77 skip) in buf. Call in the process that uses CUDA (not
 * before fork). */
static inline int kt_cuda_open(kt_cuda_t *c, char *why, size_t cap)
{
    const char *lib = "libcuda.so.1";
    int dev = 0;
    kt_cu_ctx_t ctx;
    memset(c, 0, sizeof(*c));
    c->h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (c->h == NULL) {
        snprintf(why, cap, "no CUDA driver: dlopen(%s): %s", lib, dlerror());
        return -1;
    }
#define KT_SYM(f, s)                                                  \
    do {                                                              \
        void *p_ = dlsym(c->h, s);                                    \
        if (p_ == NULL) {                                             \
            snprintf(why, cap, "CUDA driver lacks %s", s);            \
            return -1;                                                \
        }                                                             \
        memcpy(&c->f, &p_, sizeof(p_));                               \
    } while (0)
    KT_SYM(Init, "cuInit");
    KT_SYM(DeviceGetCount, "cuDeviceGetCount");
    KT_SYM(DeviceGet, "cuDeviceGet");
    KT_SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    KT_SYM(CtxSetCurrent, "cuCtxSetCurrent");
    KT_SYM(CtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    KT_SYM(CtxSynchronize, "cuCtxSynchronize");
    KT_SYM(MemAlloc, "cuMemAlloc_v2");
    KT_SYM(MemFree, "cuMemFree_v2");
    KT_SYM(MemcpyHtoD, "cuMemcpyHtoD_v2");
    KT_SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
    KT_SYM(MemcpyDtoD, "cuMemcpyDtoD_v2");
    KT_SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    KT_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    KT_SYM(MemsetD8, "cuMemsetD8_v2");
    KT_SYM(MemHostAlloc, "cuMemHostAlloc");
    KT_SYM(MemFreeHost, "cuMemFreeHost");
    KT_SYM(MemHostGetFlags, "cuMemHostGetFlags");
    KT_SYM(MemCreate, "cuMemCreate");
    KT_SYM(MemRelease, "cuMemRelease");
    KT_SYM(MemAddressReserve, "cuMemAddressReserve");
    KT_SYM(MemAddressFree, "cuMemAddressFree");
    KT_SYM(MemMap, "cuMemMap");
    KT_SYM(MemUnmap, "cuMemUnmap");
    KT_SYM(MemSetAccess, "cuMemSetAccess");
    KT_SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    KT_SYM(StreamCreate, "cuStreamCreate");
    KT_SYM(StreamSynchronize, "cuStreamSynchronize");
    KT_SYM(EventCreate, "cuEventCreate");
    KT_SYM(EventRecord, "cuEventRecord");
    KT_SYM(EventSynchronize, "cuEventSynchronize");
    KT_SYM(EventElapsedTime, "cuEventElapsedTime_v2");
#undef KT_SYM
    kt_cu_res r = c->Init(0);
    if (r != 0) {
        snprintf(why, cap, "cuInit(0) = %d (no usable GPU)", r);
        return -1;
    }
    if (c->DeviceGetCount(&c->ndev) != 0 || c->ndev < 1) {
        snprintf(why, cap, "no CUDA device visible");
        return -1;
    }
    if (c->DeviceGet(&dev, 0) != 0 || c->PrimaryCtxRetain(&ctx, dev) != 0 ||
        c->CtxSetCurrent(ctx) != 0) {
        snprintf(why, cap, "cannot make device 0 current");
        return -1;
    }
    return 0;
}

/* Device `ord`'s primary context (retained) made current, in *ctx_p when
 * not NULL. 0 ok, -1 on a driver error. */
static inline int kt_cuda_use_dev(kt_cuda_t *c, int ord, kt_cu_ctx_t *ctx_p)
{
    int dev;
    kt_cu_ctx_t ctx;
    if (c->DeviceGet(&dev, ord) != 0 || c->PrimaryCtxRetain(&ctx, dev) != 0 ||
        c->CtxSetCurrent(ctx) != 0)
        return -1;
    if (ctx_p != NULL)
        *ctx_p = ctx;
    return 0;
}

#ifdef KVLTEST_H
/* With tests/common/kvltest.h (included first): device memory filled with,
 * and checked against, kt_fill's pattern. */
static inline void kt_cuda_fill(kt_cuda_t *c, kt_cu_ptr d, uint64_t len, uint64_t seed)
{
    unsigned char *h = malloc(len);
    KT_CHECK(h != NULL);
    kt_fill(h, len, seed);
    KT_CHECK(c->MemcpyHtoD(d, h, len) == 0);
    free(h);
}

/* Offset of the first byte that differs from kt_fill(seed), or -1. */
static inline long kt_cuda_verify(kt_cuda_t *c, kt_cu_ptr d, uint64_t len, uint64_t seed)
{
    unsigned char *h = malloc(len);
    KT_CHECK(h != NULL);
    KT_CHECK(c->MemcpyDtoH(h, d, len) == 0);
    long bad = kt_verify(h, len, seed);
    free(h);
    return bad;
}
#endif

/* VMM allocation of nchunks mappings of chunk bytes each (rounded up to the
 * granularity), mapped back to back and exportable as POSIX fds. */
static inline kt_cu_ptr kt_cuda_vmm_alloc(kt_cuda_t *c, size_t chunk, int nchunks, size_t *chunk_p)
{
    kt_cu_prop p;
    size_t g = 0;
    kt_cu_ptr va = 0;
    memset(&p, 0, sizeof(p));
    p.type = 1;                  /* pinned */
    p.requestedHandleTypes = 1;  /* POSIX fd */
    p.location.type = 1;         /* device */
    p.location.id = 0;
    if (c->MemGetAllocationGranularity(&g, &p, 0) != 0 || g == 0)
        return 0;
    chunk = (chunk + g - 1) / g * g;
    if (c->MemAddressReserve(&va, chunk * (size_t)nchunks, g, 0, 0) != 0)
        return 0;
    for (int i = 0; i < nchunks; i++) {
        unsigned long long h = 0;
        if (c->MemCreate(&h, chunk, &p, 0) != 0 || c->MemMap(va + (kt_cu_ptr)i * chunk, chunk, 0, h, 0) != 0)
            return 0;
        c->MemRelease(h); /* the mapping keeps it */
    }
    kt_cu_access a = {{1, 0}, 3};
    if (c->MemSetAccess(va, chunk * (size_t)nchunks, &a, 1) != 0)
        return 0;
    *chunk_p = chunk;
    return va;
}

#endif
