/*
 * Gather-kernel shapes for scattered KV blocks on one GPU: which block and
 * thread shape, loads in flight and cache hints move 65536 x 32 KiB pairs in
 * random order fastest, next to a device-to-device copy of the same bytes.
 * The cuda backend's kvl_gather_idx (src/backends/cuda/kernels.cu) is the
 * shape this chose.
 *
 *   nvcc -O3 -arch=sm_90 bench/cuda_gather_shapes.cu -o /tmp/gather_shapes
 *   /tmp/gather_shapes [nblocks] [block_bytes] [reps]
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

typedef void (*kfn)(const unsigned long long *, const unsigned long long *, const unsigned *,
                    const unsigned *, unsigned long long, unsigned long long);

struct shape {
    const char *name;
    kfn fn;
    unsigned threads;
    int per_warp;       /* grid counts warps */
    unsigned grid_div;  /* 0: one CTA (or warp) per pair; else SMs * grid_div CTAs */
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
    srand(7);
    for (unsigned long long i = n - 1; i > 0; i--)
        std::swap(di[i], di[(unsigned long long)rand() % (i + 1)]);
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
    printf("gather shapes: %llu pairs x %llu B, random destination order, %d SMs\n", n, len, sms);
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
    };
    for (auto &s : shapes) {
        unsigned long long per = s.per_warp ? s.threads / 32 : 1;
        unsigned grid = s.grid_div ? (unsigned)(sms * s.grid_div)
                                   : (unsigned)((n + per - 1) / per);
        float t = med([&] { s.fn<<<grid, s.threads>>>(stab, dtab, sidx, didx, n, len); });
        CK(cudaGetLastError());
        printf("%-34s %9.3f ms %8.1f GB/s  %.3f of copy\n", s.name, t, bytes / t / 1e6, ref / t);
    }
    CK(cudaDeviceSynchronize());
    /* Spot check of the last shape: destination block di[0] holds source 0's bytes (all 1). */
    unsigned char chk[16];
    CK(cudaMemcpy(chk, b + (unsigned long long)di[0] * len, 16, cudaMemcpyDeviceToHost));
    printf("check: %s\n", chk[0] == 1 && chk[15] == 1 ? "ok" : "WRONG");
    return chk[0] == 1 ? 0 : 1;
}
