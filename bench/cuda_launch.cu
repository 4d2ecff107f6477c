/*
 * What a small GPU request costs the host and how soon its end can be seen,
 * without kvlane: a kernel launch by parameter size (the cuda backend's
 * inline kernels carry up to 3104 bytes), launch -> event complete (polled
 * with cudaEventQuery), launch -> a word of host memory written by the
 * kernel's end (what kvl_signal_end does), cudaEventRecord and
 * cudaEventQuery themselves, and cuStreamWriteValue32 as the other way to
 * write such a word.
 *
 *   nvcc -O2 -arch=sm_90 bench/cuda_launch.cu -o /tmp/cuda_launch -lcuda && /tmp/cuda_launch
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
#include <algorithm>
#include <vector>
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
template <int N> struct P { unsigned v[N]; };
template <int N> __global__ void k(P<N> p, unsigned *out) { if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = p.v[N - 1]; }
__global__ void kflag(unsigned *out, volatile unsigned *flag, unsigned seq) { if (threadIdx.x == 0 && blockIdx.x == 0) { out[0] = 1; __threadfence_system(); *flag = seq; } }
template <int N> void run(unsigned *out, cudaStream_t s, cudaEvent_t ev) {
    P<N> p; for (int i = 0; i < N; i++) p.v[i] = i;
    std::vector<double> host, lat;
    for (int r = 0; r < 300; r++) {
        double t0 = now();
        k<N><<<16, 256, 0, s>>>(p, out);
        double t1 = now();
        cudaEventRecord(ev, s);
        while (cudaEventQuery(ev) == cudaErrorNotReady) {}
        double t2 = now();
        if (r >= 20) { host.push_back(t1 - t0); lat.push_back(t2 - t0); }
    }
    std::sort(host.begin(), host.end()); std::sort(lat.begin(), lat.end());
    printf("params %5zu B: launch call p50 %.2f us, launch->event done p50 %.2f us\n", sizeof(P<N>), host[host.size()/2], lat[lat.size()/2]);
}
int main() {
    unsigned *out; cudaMalloc(&out, 64);
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t ev; cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    run<2>(out, s, ev); run<64>(out, s, ev); run<256>(out, s, ev); run<776>(out, s, ev); run<2>(out, s, ev);
    // host-flag completion
    unsigned *flag; cudaHostAlloc(&flag, 64, cudaHostAllocMapped); unsigned *dflag; cudaHostGetDevicePointer(&dflag, flag, 0);
    std::vector<double> lat, q;
    for (unsigned r = 1; r < 300; r++) {
        double t0 = now();
        kflag<<<16, 256, 0, s>>>(out, dflag, r);
        while (*(volatile unsigned *)flag != r) {}
        double t2 = now();
        if (r >= 20) lat.push_back(t2 - t0);
    }
    std::sort(lat.begin(), lat.end());
    printf("host flag written by the kernel: launch->seen p50 %.2f us\n", lat[lat.size()/2]);
    // cost of one event record and one query
    std::vector<double> rec, qq;
    for (int r = 0; r < 300; r++) {
        double t0 = now(); cudaEventRecord(ev, s); double t1 = now(); cudaEventQuery(ev); double t2 = now();
        cudaStreamSynchronize(s);
        rec.push_back(t1 - t0); qq.push_back(t2 - t1);
    }
    std::sort(rec.begin(), rec.end()); std::sort(qq.begin(), qq.end());
    printf("cudaEventRecord p50 %.2f us, cudaEventQuery p50 %.2f us\n", rec[150], qq[150]);
    // stream write value
    CUstream cs = (CUstream)s; CUdeviceptr fp = (CUdeviceptr)dflag;
    std::vector<double> wv, wl;
    for (unsigned r = 1000; r < 1300; r++) {
        double t0 = now();
        k<2><<<16, 256, 0, s>>>(P<2>{{1,2}}, out);
        double t1 = now();
        CUresult cr = cuStreamWriteValue32(cs, fp, r, 0);
        double t2 = now();
        if (cr != CUDA_SUCCESS) { printf("cuStreamWriteValue32 = %d\n", cr); break; }
        while (*(volatile unsigned *)flag != r) {}
        double t3 = now();
        wv.push_back(t2 - t1); wl.push_back(t3 - t0);
    }
    if (!wv.empty()) { std::sort(wv.begin(), wv.end()); std::sort(wl.begin(), wl.end());
    printf("cuStreamWriteValue32 call p50 %.2f us; launch->value seen p50 %.2f us\n", wv[wv.size()/2], wl[wl.size()/2]); }
    return 0;
}
