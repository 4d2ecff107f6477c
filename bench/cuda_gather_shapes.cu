/*
 * Gather-kernel shapes for scattered KV blocks on one GPU: which block and
 * thread shape, loads in flight and cache hints move 65536 x 32 KiB pairs in
 * random order fastest, next to a device-to-device copy of the same bytes.
 * The cuda backend's kvl_gather_idx (src/backends/cuda/kernels.cu) is the
 * shape this chose.
 *
 *   nvcc -O3 -arch=sm_90 bench/cuda_gather_shapes.cu -o /tmp/gather_shapes
 *   /tmp/gather_shapes [nblocks] [block_bytes] [reps] [seq|srand|winW|rand] [host]
 * seq: destinations in the sources' order (no shuffle), for the ceiling;
 * srand: the sources shuffled instead (destinations written in order);
 * winW: the destinations shuffled within windows of W pairs, the windows
 * in order (how much the destinations' locality costs);
 * rand (or anything else): the destinations shuffled.
 * host: the kernels read the index arrays in place from pinned host memory
 * mapped for the GPU (what the backend's warp kernel does for large
 * requests), instead of from GPU memory; compare with a run without it.
 * Last, "bucketed" rows: the pairs put in destination order by buckets on
 * the GPU first (two more launches), then gathered; timed together.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { HINT_CS = 0, HINT_NONE = 1, HINT_LDCS_ONLY = 2, HINT_LDG_STCS = 3 };

template <int H> __device__ __forceinline__ uint4 ld(const uint4 *p)
{
    if (H == HINT_CS || H == HINT_LDCS_ONLY)
        return __ldcs(p);
    if (H == HINT_LDG_STCS)
        return __ldg(p);
    return *p;
}
template <int H> __device__ __forceinline__ void st(uint4 *p, uint4 v)
{
    if (H == HINT_CS || H == HINT_LDG_STCS)
        __stcs(p, v);
    else
        *p = v;
}

/* One CTA per pair (grid-stride), UNROLL loads in flight per thread. */
template <int UNROLL, int H>
__global__ void g_cta(const unsigned long long *stab, const unsigned long long *dtab,
                      const unsigned *sidx, const unsigned *didx, unsigned long long n,
                      unsigned long long len)
{
    const unsigned bd = blockDim.x;
    for (unsigned long long b = blockIdx.x; b < n; b += gridDim.x) {
        const uint4 *s = (const uint4 *)__ldg(&stab[__ldg(&sidx[b])]);
        uint4 *t = (uint4 *)__ldg(&dtab[__ldg(&didx[b])]);
        unsigned long long n4 = len >> 4, i = threadIdx.x;
        for (; i + (UNROLL - 1ull) * bd < n4; i += (unsigned long long)UNROLL * bd) {
            uint4 r[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++)
                r[k] = ld<H>(s + i + (unsigned long long)k * bd);
#pragma unroll
            for (int k = 0; k < UNROLL; k++)
                st<H>(t + i + (unsigned long long)k * bd, r[k]);
        }
        for (; i < n4; i += bd)
            st<H>(t + i, ld<H>(s + i));
    }
}

/* One warp per pair: WPB warps per CTA. */
template <int UNROLL, int H>
__global__ void g_warp(const unsigned long long *stab, const unsigned long long *dtab,
                       const unsigned *sidx, const unsigned *didx, unsigned long long n,
                       unsigned long long len)
{
    unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    for (unsigned long long b = (unsigned long long)blockIdx.x * wpb + w; b < n;
         b += (unsigned long long)gridDim.x * wpb) {
        const uint4 *s = (const uint4 *)__ldg(&stab[__ldg(&sidx[b])]);
        uint4 *t = (uint4 *)__ldg(&dtab[__ldg(&didx[b])]);
        unsigned long long n4 = len >> 4, i = lane;
        for (; i + (UNROLL - 1ull) * 32 < n4; i += UNROLL * 32ull) {
            uint4 r[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++)
                r[k] = ld<H>(s + i + k * 32ull);
#pragma unroll
            for (int k = 0; k < UNROLL; k++)
                st<H>(t + i + k * 32ull, r[k]);
        }
        for (; i < n4; i += 32)
            st<H>(t + i, ld<H>(s + i));
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVL_BULK 1
#endif

/* Hopper's bulk copy engine (TMA without a tensor map): one thread per CTA
 * streams its pairs in CH-byte chunks global -> shared -> global through S
 * stages, loads running S-1 chunks ahead of the stores. */
static __device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

template <unsigned CH, unsigned S>
__global__ void g_bulk(const unsigned long long *stab, const unsigned long long *dtab,
                       const unsigned *sidx, const unsigned *didx, unsigned long long n,
                       unsigned long long len)
{
#ifdef KVL_BULK
    extern __shared__ __align__(128) unsigned char buf[];
    __shared__ __align__(8) unsigned long long bar[S];
    if (threadIdx.x != 0)
        return;
    for (unsigned j = 0; j < S; j++)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[j])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const unsigned long long per = len / CH; /* chunks per pair (len a multiple of CH) */
    const unsigned long long mine = n > blockIdx.x ? (n - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned long long K = mine * per;
    auto gaddr = [&](unsigned long long k, bool dst) {
        unsigned long long b = blockIdx.x + (k / per) * gridDim.x;
        unsigned long long base = dst ? __ldg(&dtab[__ldg(&didx[b])]) : __ldg(&stab[__ldg(&sidx[b])]);
        return base + (k % per) * CH;
    };
    auto load = [&](unsigned long long k) {
        unsigned st = (unsigned)(k % S);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                         smem_u32(&bar[st])), "r"(CH) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                     "%2, [%3];" ::"r"(smem_u32(buf + st * CH)), "l"(gaddr(k, false)), "r"(CH),
                     "r"(smem_u32(&bar[st])) : "memory");
    };
    for (unsigned long long k = 0; k < K && k < S; k++)
        load(k);
    for (unsigned long long k = 0; k < K; k++) {
        unsigned st = (unsigned)(k % S), phase = (unsigned)((k / S) & 1), done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                         "selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(smem_u32(&bar[st])), "r"(phase)
                         : "memory");
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                         gaddr(k, true)), "r"(smem_u32(buf + st * CH)), "r"(CH) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        /* the store before this one has read its stage: reload that stage */
        if (k >= 1 && k - 1 + S < K) {
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            load(k - 1 + S);
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/*
 * Destination bucketing (an experiment for requests measured one at a time):
 * put the pairs in the order of their destination index's high bits before
 * the gather, so that the blocks written at once lie close together. Three
 * launches: a histogram of the buckets whose last CTA scans it into offsets
 * (and clears the counts for the next request), a scatter of the pairs into
 * bucket order (order within a bucket is arrival order), then the gather.
 */
#define BK_BUCKETS 1024u

__global__ void g_bk_hist(const unsigned *didx, unsigned long long n, unsigned shift,
                          unsigned *cnt, unsigned *off, unsigned *done)
{
    __shared__ unsigned h[BK_BUCKETS];
    __shared__ bool last;
    for (unsigned j = threadIdx.x; j < BK_BUCKETS; j += blockDim.x)
        h[j] = 0;
    __syncthreads();
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        atomicAdd(&h[__ldg(&didx[i]) >> shift], 1u);
    __syncthreads();
    for (unsigned j = threadIdx.x; j < BK_BUCKETS; j += blockDim.x)
        if (h[j] != 0)
            atomicAdd(&cnt[j], h[j]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last)
        return;
    /* the last CTA: exclusive scan of the counts (blockDim.x == BK_BUCKETS) */
    __shared__ unsigned sc[BK_BUCKETS];
    unsigned t = threadIdx.x;
    unsigned v = atomicExch(&cnt[t], 0u); /* cleared for the next request */
    sc[t] = v;
    __syncthreads();
    for (unsigned d = 1; d < BK_BUCKETS; d <<= 1) {
        unsigned x = t >= d ? sc[t - d] : 0;
        __syncthreads();
        sc[t] += x;
        __syncthreads();
    }
    off[t] = sc[t] - v;
    if (t == 0)
        *done = 0;
}

__global__ void g_bk_scatter(const unsigned *sidx, const unsigned *didx, unsigned long long n,
                             unsigned shift, unsigned *off, unsigned *os, unsigned *od)
{
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned d = __ldg(&didx[i]), s = __ldg(&sidx[i]);
        unsigned p = atomicAdd(&off[d >> shift], 1u);
        os[p] = s;
        od[p] = d;
    }
}

typedef void (*kfn)(const unsigned long long *, const unsigned long long *, const unsigned *,
                    const unsigned *, unsigned long long, unsigned long long);

struct shape {
    const char *name;
    kfn fn;
    unsigned threads;
    int per_warp;       /* grid counts warps */
    unsigned grid_div;  /* 0: one CTA (or warp) per pair; else SMs * grid_div CTAs */
    unsigned smem;      /* dynamic shared memory (bulk shapes) */
};

int main(int argc, char **argv)
{
    unsigned long long n = argc > 1 ? strtoull(argv[1], 0, 0) : 65536;
    unsigned long long len = argc > 2 ? strtoull(argv[2], 0, 0) : 32768;
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    unsigned long long bytes = n * len;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    char *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaMemset(b, 0, bytes));
    std::vector<unsigned long long> hs(n), hd(n);
    std::vector<unsigned> si(n), di(n);
    for (unsigned long long i = 0; i < n; i++) {
        hs[i] = (unsigned long long)a + i * len;
        hd[i] = (unsigned long long)b + i * len;
        si[i] = di[i] = (unsigned)i;
    }
    /* "seq": pairs in address order; "srand": sources in random order */
    bool in_order = argc > 4 && argv[4][0] == 's' && argv[4][1] == 'e';
    bool src_rand = argc > 4 && argv[4][0] == 's' && argv[4][1] == 'r';
    /* "winW": destinations shuffled only within windows of W pairs (their
     * locality, windows in order) */
    unsigned long long win = argc > 4 && argv[4][0] == 'w' ? strtoull(argv[4] + 3, 0, 0) : 0;
    if (win == 0 || win > n)
        win = n;
    std::vector<unsigned> &shuf = src_rand ? si : di;
    srand(7);
    for (unsigned long long base = 0; base < n && !in_order; base += win) {
        unsigned long long m = n - base < win ? n - base : win;
        for (unsigned long long i = m - 1; i > 0; i--)
            std::swap(shuf[base + i], shuf[base + (unsigned long long)rand() % (i + 1)]);
    }
    unsigned long long *stab, *dtab;
    unsigned *sidx, *didx;
    CK(cudaMalloc(&stab, n * 8));
    CK(cudaMalloc(&dtab, n * 8));
    CK(cudaMalloc(&sidx, n * 4));
    CK(cudaMalloc(&didx, n * 4));
    CK(cudaMemcpy(stab, hs.data(), n * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dtab, hd.data(), n * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sidx, si.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(didx, di.data(), n * 4, cudaMemcpyHostToDevice));
    bool host_idx = argc > 5 && argv[5][0] == 'h';
    if (host_idx) {
        unsigned *h, *hd;
        CK(cudaHostAlloc((void **)&h, 2 * n * 4, cudaHostAllocMapped | cudaHostAllocPortable));
        CK(cudaHostGetDevicePointer((void **)&hd, h, 0));
        memcpy(h, si.data(), n * 4);
        memcpy(h + n, di.data(), n * 4);
        sidx = hd;
        didx = hd + n;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto med = [&](auto launch) {
        std::vector<float> t;
        for (int r = 0; r < reps + 2; r++) {
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2)
                t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    float ref = med([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
    printf("gather shapes: %llu pairs x %llu B, %s", n, len,
           in_order ? "sequential" : src_rand ? "sources in random order"
           : win < n ? "destinations in random order within windows of"
                     : "destinations in random order");
    if (!in_order && !src_rand && win < n)
        printf(" %llu pairs (%llu MiB)", win, win * len >> 20);
    printf(", indices in %s, %d SMs\n",
           host_idx ? "pinned host memory (read in place)" : "GPU memory", sms);
    printf("%-34s %9.3f ms %8.1f GB/s\n", "cudaMemcpy D2D (reference)", ref, bytes / ref / 1e6);
    shape shapes[] = {
        {"cta512 x4 cs (kvlane before)", g_cta<4, HINT_CS>, 512, 0, 0},
        {"cta256 x8 cs", g_cta<8, HINT_CS>, 256, 0, 0},
        {"cta1024 x2 cs", g_cta<2, HINT_CS>, 1024, 0, 0},
        {"cta128 x16 cs", g_cta<16, HINT_CS>, 128, 0, 0},
        {"cta512 x4 none", g_cta<4, HINT_NONE>, 512, 0, 0},
        {"cta512 x4 ldcs", g_cta<4, HINT_LDCS_ONLY>, 512, 0, 0},
        {"cta512 x4 ldg+stcs", g_cta<4, HINT_LDG_STCS>, 512, 0, 0},
        {"cta256 x4 cs", g_cta<4, HINT_CS>, 256, 0, 0},
        {"cta512 x4 cs persist SMs*4", g_cta<4, HINT_CS>, 512, 0, 4},
        {"cta256 x8 cs persist SMs*8", g_cta<8, HINT_CS>, 256, 0, 8},
        {"warp x8 cs, 8 warps/CTA", g_warp<8, HINT_CS>, 256, 1, 0},
        {"warp x8 cs, 4 warps/CTA", g_warp<8, HINT_CS>, 128, 1, 0},
        {"warp x4 cs, 8 warps/CTA", g_warp<4, HINT_CS>, 256, 1, 0},
        {"warp x16 cs, 4 warps/CTA", g_warp<16, HINT_CS>, 128, 1, 0},
        {"warp x8 none, 8 warps/CTA", g_warp<8, HINT_NONE>, 256, 1, 0},
        {"warp x8 cs, 8 w/CTA, SMs*1", g_warp<8, HINT_CS>, 256, 1, 1},
        {"warp x8 cs, 8 w/CTA, SMs*2", g_warp<8, HINT_CS>, 256, 1, 2},
        {"warp x8 cs, 8 w/CTA, SMs*4", g_warp<8, HINT_CS>, 256, 1, 4},
        {"warp x16 cs, 8 w/CTA, SMs*2", g_warp<16, HINT_CS>, 256, 1, 2},
        {"warp x16 cs, 4 w/CTA, SMs*4", g_warp<16, HINT_CS>, 128, 1, 4},
        {"bulk 16K x4 stages, SMs*3", g_bulk<16384, 4>, 32, 0, 3, 4 * 16384},
        {"bulk 8K x6 stages, SMs*4", g_bulk<8192, 6>, 32, 0, 4, 6 * 8192},
        {"bulk 32K x3 stages, SMs*2", g_bulk<32768, 3>, 32, 0, 2, 3 * 32768},
        {"bulk 16K x2 stages, SMs*6", g_bulk<16384, 2>, 32, 0, 6, 2 * 16384},
        {"bulk 8K x3 stages, SMs*8", g_bulk<8192, 3>, 32, 0, 8, 3 * 8192},
        {"bulk 4K x8 stages, SMs*6", g_bulk<4096, 8>, 32, 0, 6, 8 * 4096},
        {"bulk 32K x6 stages, SMs*1", g_bulk<32768, 6>, 32, 0, 1, 6 * 32768},
    };
    for (auto &s : shapes) {
        unsigned long long per = s.per_warp ? s.threads / 32 : 1;
        unsigned grid = s.grid_div ? (unsigned)(sms * s.grid_div)
                                   : (unsigned)((n + per - 1) / per);
        if (s.smem > 0)
            CK(cudaFuncSetAttribute(s.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, s.smem));
        CK(cudaMemset(b, 0, bytes));
        float t = med([&] { s.fn<<<grid, s.threads, s.smem>>>(stab, dtab, sidx, didx, n, len); });
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        /* every destination block holds the source's bytes (all 1) */
        unsigned char c0[16], c1[16];
        CK(cudaMemcpy(c0, b + (unsigned long long)di[n / 3] * len, 16, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(c1, b + (unsigned long long)di[n - 1] * len + len - 16, 16,
                      cudaMemcpyDeviceToHost));
        printf("%-34s %9.3f ms %8.1f GB/s  %.3f of copy%s\n", s.name, t, bytes / t / 1e6, ref / t,
               c0[0] == 1 && c1[15] == 1 ? "" : "  WRONG BYTES");
    }
    {
        /* bucketing: the key range is the destination list's length (n) */
        unsigned shift = 0;
        while ((n - 1) >> shift >= BK_BUCKETS)
            shift++;
        unsigned *cnt, *off, *done, *os, *od;
        CK(cudaMalloc(&cnt, BK_BUCKETS * 4));
        CK(cudaMalloc(&off, BK_BUCKETS * 4));
        CK(cudaMalloc(&done, 4));
        CK(cudaMalloc(&os, n * 4));
        CK(cudaMalloc(&od, n * 4));
        CK(cudaMemset(cnt, 0, BK_BUCKETS * 4));
        CK(cudaMemset(done, 0, 4));
        unsigned hg = (unsigned)(sms * 2), tg = (unsigned)((n + 1023) / 1024);
        auto bucket = [&] {
            g_bk_hist<<<hg, BK_BUCKETS>>>(didx, n, shift, cnt, off, done);
            g_bk_scatter<<<tg, 1024>>>(sidx, didx, n, shift, off, os, od);
        };
        float tb = med(bucket);
        CK(cudaGetLastError());
        printf("%-34s %9.3f ms  (%u buckets of %llu pairs' destinations)\n",
               "bucketing alone (hist+scan, scatter)", tb, BK_BUCKETS, 1ull << shift);
        struct {
            const char *name;
            kfn fn;
            unsigned threads;
            int per_warp;
        } g[] = {{"bucketed + cta512 x4 none", g_cta<4, HINT_NONE>, 512, 0},
                 {"bucketed + cta512 x4 cs", g_cta<4, HINT_CS>, 512, 0},
                 {"bucketed + warp x8 cs, 8 w/CTA", g_warp<8, HINT_CS>, 256, 1},
                 {"bucketed + warp x8 none, 8 w/CTA", g_warp<8, HINT_NONE>, 256, 1}};
        for (auto &x : g) {
            unsigned long long per = x.per_warp ? x.threads / 32 : 1;
            unsigned grid = (unsigned)((n + per - 1) / per);
            CK(cudaMemset(b, 0, bytes));
            float t = med([&] {
                bucket();
                x.fn<<<grid, x.threads>>>(stab, dtab, os, od, n, len);
            });
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            /* every destination written: check a spread of them */
            bool ok = true;
            for (unsigned long long k = 0; k < n && ok; k += n / 61 + 1) {
                unsigned char c[16];
                CK(cudaMemcpy(c, b + (unsigned long long)di[k] * len + len - 16, 16,
                              cudaMemcpyDeviceToHost));
                ok = c[15] == 1;
            }
            printf("%-34s %9.3f ms %8.1f GB/s  %.3f of copy%s\n", x.name, t, bytes / t / 1e6,
                   ref / t, ok ? "" : "  WRONG BYTES");
        }
    }
    CK(cudaDeviceSynchronize());
    /* Spot check of the last shape: destination block di[0] holds source 0's bytes (all 1). */
    unsigned char chk[16];
    CK(cudaMemcpy(chk, b + (unsigned long long)di[0] * len, 16, cudaMemcpyDeviceToHost));
    printf("check: %s\n", chk[0] == 1 && chk[15] == 1 ? "ok" : "WRONG");
    return chk[0] == 1 ? 0 : 1;
}
