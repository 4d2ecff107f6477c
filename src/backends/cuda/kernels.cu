/*
 * kvlane cuda backend: the gather/scatter kernel. One launch moves every
 * block of a work unit: descriptor b of the table is copied by one CTA
 * (blocks above 1 MiB are split on the host; the grid is normally one CTA
 * per descriptor, and strides when the table is longer than the grid).
 * Aligned blocks move 16 bytes per thread with eight loads in flight per
 * thread (32 KiB per CTA pass), with streaming cache hints: every byte is
 * read and written once. The table is usually resident on the GPU for the
 * life of the transfer (cuda_xfer.c), so a re-post is launches only.
 * Compiled to a fatbin (sm_XX code + PTX) at build time by
 * cmake/KvlCudaKernels.cmake, embedded in libkvlane and loaded with
 * cuModuleLoadData; the table layout matches kvli_cuda_blk_t (cuda.h).
 * kvl_gather_idx is the same copy driven by index arrays (see below).
 */
struct kvl_blk {
    unsigned long long src, dst, len;
};

#define KVL_UNROLL 8

/* One CTA copies one block, UNROLL 16-byte loads in flight per thread. */
template <int UNROLL>
static __device__ __forceinline__ void kvl_copy_block(unsigned long long src,
                                                      unsigned long long dst,
                                                      unsigned long long len)
{
    const unsigned bd = blockDim.x;
    unsigned long long i = threadIdx.x;
    if (((src | dst | len) & 15ull) == 0) {
        const uint4 *s = (const uint4 *)src;
        uint4 *t = (uint4 *)dst;
        const unsigned long long n4 = len >> 4;
        for (; i + (UNROLL - 1ull) * bd < n4; i += (unsigned long long)UNROLL * bd) {
            uint4 r[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++)
                r[k] = __ldcs(s + i + (unsigned long long)k * bd);
#pragma unroll
            for (int k = 0; k < UNROLL; k++)
                __stcs(t + i + (unsigned long long)k * bd, r[k]);
        }
        for (; i < n4; i += bd)
            __stcs(t + i, __ldcs(s + i));
    } else if (((src | dst | len) & 7ull) == 0) {
        const unsigned long long *s = (const unsigned long long *)src;
        unsigned long long *t = (unsigned long long *)dst;
        for (; i < (len >> 3); i += bd)
            t[i] = s[i];
    } else {
        const unsigned char *s = (const unsigned char *)src;
        unsigned char *t = (unsigned char *)dst;
        for (; i < len; i += bd)
            t[i] = s[i];
    }
}

extern "C" __global__ void __launch_bounds__(256)
kvl_gather(const kvl_blk *__restrict__ tab, unsigned long long n)
{
    for (unsigned long long b = blockIdx.x; b < n; b += gridDim.x)
        kvl_copy_block<KVL_UNROLL>(__ldg(&tab[b].src), __ldg(&tab[b].dst), __ldg(&tab[b].len));
}

/*
 * Indexed form (a transfer made from two prepared lists and index arrays):
 * pair b copies len bytes from stab[sidx[b]] to dtab[didx[b]]. The address
 * tables belong to the prepared lists and stay on the GPU; only the index
 * arrays are uploaded per transfer, so the host never pairs blocks. Blocks
 * of 512 threads with 4 loads in flight each: measured on an H200 with
 * 65536 x 32 KiB pairs in random order, 92.4% of a device-to-device copy
 * against 91.0% for the 256 x 8 shape of kvl_gather.
 */
extern "C" __global__ void __launch_bounds__(512)
kvl_gather_idx(const unsigned long long *__restrict__ stab,
               const unsigned long long *__restrict__ dtab, const unsigned *__restrict__ sidx,
               const unsigned *__restrict__ didx, unsigned long long n, unsigned long long len)
{
    for (unsigned long long b = blockIdx.x; b < n; b += gridDim.x)
        kvl_copy_block<4>(__ldg(&stab[__ldg(&sidx[b])]), __ldg(&dtab[__ldg(&didx[b])]), len);
}

/*
 * The same copy with one warp per pair, 8 warps per block, 8 plain 16-byte
 * loads in flight per lane: for many small blocks (bench/cuda_gather_shapes.cu
 * on an H200, 65536 random pairs: 93.1% of a device-to-device copy for 32 KiB
 * blocks and 16 KiB blocks alike, against 92.3% and 88.8% for one block of
 * 512 threads per pair). cuda_xfer.c launches it for requests of many pairs
 * of at most KVLI_CUDA_WARP_MAX_LEN bytes; few or large pairs keep the block
 * per pair, which spreads one pair over more threads.
 */
extern "C" __global__ void __launch_bounds__(256)
kvl_gather_idx_warp(const unsigned long long *__restrict__ stab,
                    const unsigned long long *__restrict__ dtab,
                    const unsigned *__restrict__ sidx, const unsigned *__restrict__ didx,
                    unsigned long long n, unsigned long long len)
{
    const unsigned lane = threadIdx.x & 31u, wpb = blockDim.x >> 5;
    for (unsigned long long b = (unsigned long long)blockIdx.x * wpb + (threadIdx.x >> 5); b < n;
         b += (unsigned long long)gridDim.x * wpb) {
        unsigned long long src = __ldg(&stab[__ldg(&sidx[b])]);
        unsigned long long dst = __ldg(&dtab[__ldg(&didx[b])]);
        if (((src | dst | len) & 15ull) != 0) {
            /* unaligned: bytes (never for KV blocks, kept correct) */
            for (unsigned long long i = lane; i < len; i += 32)
                ((unsigned char *)dst)[i] = ((const unsigned char *)src)[i];
            continue;
        }
        const uint4 *s = (const uint4 *)src;
        uint4 *t = (uint4 *)dst;
        const unsigned long long n4 = len >> 4;
        unsigned long long i = lane;
        for (; i + 7ull * 32 < n4; i += 8ull * 32) {
            uint4 r[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                r[k] = s[i + k * 32ull];
#pragma unroll
            for (int k = 0; k < 8; k++)
                t[i + k * 32ull] = r[k];
        }
        for (; i < n4; i += 32)
            t[i] = s[i];
    }
}

/*
 * Small requests with their table in the launch itself: the descriptors (or
 * the index pairs) travel as a kernel parameter, so the request needs no
 * upload ahead of its launch: one operation on the stream instead of a copy
 * and a launch (the parameter layout, as PyTorch's multi_tensor_apply passes
 * its address lists). The sizes match KVLI_CUDA_INLINE_BLOCKS and
 * KVLI_CUDA_INLINE_PAIRS (cuda.h): 8 + 128 * 24 = 3080 and 3072 + 32 = 3104
 * bytes, under the 4 KiB every driver and GPU takes. Blocks index the
 * arrays with blockIdx only (uniform per block: constant-bank loads).
 */
#define KVL_INLINE_BLOCKS 128
#define KVL_INLINE_PAIRS 384

struct kvl_inline_tab {
    unsigned long long n;
    kvl_blk b[KVL_INLINE_BLOCKS];
};

struct kvl_inline_idx {
    unsigned s[KVL_INLINE_PAIRS]; /* source entries */
    unsigned d[KVL_INLINE_PAIRS]; /* destination entries */
};

static_assert(sizeof(kvl_inline_tab) == 8 + 24 * KVL_INLINE_BLOCKS &&
                  sizeof(kvl_inline_idx) == 8 * KVL_INLINE_PAIRS,
              "the layouts of kvli_cuda_inline_tab_t / kvli_cuda_inline_idx_t (cuda.h)");

/*
 * The end of a small launch, told in host memory: the host polls a word
 * instead of asking the driver about an event (a driver call of about 1.5 us
 * on an H200's host, and the event completes ~1.7 us after the kernel's last
 * store). Every CTA counts itself out after its stores (fenced); the last
 * one sets the counter back to zero for the slot's next launch, then writes
 * seq to the host word with a system-wide fence, so whoever reads seq there
 * sees every CTA's bytes. flag NULL: the event alone tells (cuda_xfer.c).
 */
static __device__ __forceinline__ void kvl_signal_end(unsigned *ctr, unsigned *flag,
                                                      unsigned seq)
{
    if (flag == nullptr)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(ctr, 1u) == gridDim.x - 1u) {
            *(volatile unsigned *)ctr = 0u;
            __threadfence_system();
            *(volatile unsigned *)flag = seq;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
kvl_gather_inline(const kvl_inline_tab t, unsigned *ctr, unsigned *flag, unsigned seq)
{
    for (unsigned long long b = blockIdx.x; b < t.n; b += gridDim.x)
        kvl_copy_block<KVL_UNROLL>(t.b[b].src, t.b[b].dst, t.b[b].len);
    kvl_signal_end(ctr, flag, seq);
}

extern "C" __global__ void __launch_bounds__(512)
kvl_gather_idx_inline(const unsigned long long *__restrict__ stab,
                      const unsigned long long *__restrict__ dtab, unsigned long long n,
                      unsigned long long len, const kvl_inline_idx p, unsigned *ctr,
                      unsigned *flag, unsigned seq)
{
    for (unsigned long long b = blockIdx.x; b < n; b += gridDim.x)
        kvl_copy_block<4>(__ldg(&stab[p.s[b]]), __ldg(&dtab[p.d[b]]), len);
    kvl_signal_end(ctr, flag, seq);
}
