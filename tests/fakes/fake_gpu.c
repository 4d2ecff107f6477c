/*
 * A stand-in for the CUDA driver (libcuda.so.1) and libcufile in one shared
 * object, for testing posix's GPUDirect Storage path on machines without a
 * GPU (test_posix_gds_fake loads it through KVL_CUDA_DRIVER and a
 * libcufile.so.0 link to it). "Device memory" is host memory from
 * cuMemAlloc, known to cuPointerGetAttribute; copies are memcpy; cuFile's
 * reads and writes are pread/pwrite into it, and fail unless a context is
 * current on the calling thread and the buffer lies in a live allocation.
 *
 * KVL_FAKE_CUFILE, read at each call, a list of words:
 *   nvfs         nvidia-fs is loaded (else cuFile is in compatibility mode)
 *   p2p          cuFile reports PCI P2PDMA support (GPUDirect without nvidia-fs)
 *   open_fail    cuFileDriverOpen fails (CU_FILE_DRIVER_NOT_INITIALIZED)
 *   handle_fail  cuFileHandleRegister fails (CU_FILE_IO_NOT_SUPPORTED)
 *   io_fail      cuFileRead/Write fail (CU_FILE_IO_ERROR)
 *   read_zero    cuFileRead returns 0 (the end of the file)
 *   half         cuFileRead/Write move half of what is asked (4 KiB multiples)
 *   hostreg_fail cuMemHostRegister fails (CUDA_ERROR_OUT_OF_MEMORY)
 * kvl_fake_gpu_stats() counts the calls; kvl_fake_gpu_hostreg() tells the
 * page-locked host ranges and kvl_fake_gpu_gate() holds cuMemHostRegister
 * (test_cuda_pin_fake).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

typedef unsigned long long dptr_t;
typedef struct { int err, cu_err; } cf_status_t;

enum { MAXA = 64 };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { dptr_t base; size_t size; int bufreg; } allocs[MAXA];
static __thread int ctx_depth;
static int ctx_cell;
/* opens, closes, handle reg, handle dereg, buf reg, buf dereg, reads, writes, read bytes,
 * write bytes, calls without a context */
static long stats[11];

void kvl_fake_gpu_stats(long *out, size_t n)
{
    pthread_mutex_lock(&lock);
    memcpy(out, stats, (n < 11 ? n : 11) * sizeof(long));
    pthread_mutex_unlock(&lock);
}

static int mode(const char *w)
{
    const char *e = getenv("KVL_FAKE_CUFILE");
    return e != NULL && strstr(e, w) != NULL;
}

/* the allocation holding [p, p+len), -1 none; under lock */
static int find(dptr_t p, size_t len)
{
    for (int i = 0; i < MAXA; i++)
        if (allocs[i].size && p >= allocs[i].base && p + len <= allocs[i].base + allocs[i].size)
            return i;
    return -1;
}

/* Host registration: the live page-locked ranges; cuMemHostRegister fails
 * under "hostreg_fail" and waits while the gate is shut (kvl_fake_gpu_gate). */
enum { MAXH = 2048 };
static struct { uintptr_t base; size_t size; } hregs[MAXH];
static long hreg_calls, hreg_done, hunreg_done, hreg_waiting;
static int hgate_shut;
static pthread_cond_t hgate_cond = PTHREAD_COND_INITIALIZER;

/* ---- the CUDA driver ---- */
int cuInit(unsigned f) { (void)f; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuGetErrorName(int r, const char **s) { (void)r; *s = "CUDA_ERROR_FAKE"; return 0; }
int cuGetErrorString(int r, const char **s) { (void)r; *s = "fake driver error"; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int n, int d) { (void)d; strncpy(s, "Fake GPU", (size_t)n); return 0; }
int cuDeviceGetPCIBusId(char *s, int n, int d)
{
    (void)d;
    strncpy(s, "0000:00:00.0", (size_t)n);
    return 0;
}
int cuDeviceGetAttribute(int *v, int a, int d) { (void)a, (void)d; *v = 0; return 0; }
int cuDeviceCanAccessPeer(int *v, int a, int b) { (void)a, (void)b; *v = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = &ctx_cell; return 0; }
int cuCtxPushCurrent_v2(void *c) { (void)c; ctx_depth++; return 0; }
int cuCtxPopCurrent_v2(void **c)
{
    if (ctx_depth == 0)
        return 201; /* CUDA_ERROR_INVALID_CONTEXT */
    ctx_depth--;
    if (c)
        *c = &ctx_cell;
    return 0;
}

int cuPointerGetAttribute(void *data, int attr, dptr_t p)
{
    pthread_mutex_lock(&lock);
    int i = find(p, 1), host = 0;
    for (int h = 0; i < 0 && h < MAXH; h++)
        host |= hregs[h].size && p >= hregs[h].base && p < hregs[h].base + hregs[h].size;
    pthread_mutex_unlock(&lock);
    if (host) { /* page-locked host memory: MEMORY_TYPE HOST, the rest zero */
        uint64_t v = attr == 2 ? 1 : 0;
        memcpy(data, &v, attr == 1 || attr == 7 || attr == 11 || attr == 12 ? 8 : 4);
        return 0;
    }
    if (i < 0)
        return 1; /* CUDA_ERROR_INVALID_VALUE: not CUDA memory */
    uint64_t v = 0;
    switch (attr) {
    case 1: v = (uint64_t)(uintptr_t)&ctx_cell; break;  /* CONTEXT */
    case 2: v = 2; break;                                 /* MEMORY_TYPE: DEVICE */
    case 7: v = (uint64_t)i + 1; break;                   /* BUFFER_ID */
    case 10: v = 1; break;                                /* IS_LEGACY_IPC */
    case 11: v = allocs[i].base; break;                   /* RANGE_START */
    case 12: v = allocs[i].size; break;                   /* RANGE_SIZE */
    case 13: v = 1; break;                                /* MAPPED */
    default: v = 0;                                       /* ordinal 0, not managed, ... */
    }
    memcpy(data, &v, attr == 1 || attr == 7 || attr == 11 || attr == 12 ? 8 : 4);
    return 0;
}

int cuMemGetAddressRange_v2(dptr_t *b, size_t *s, dptr_t p)
{
    pthread_mutex_lock(&lock);
    int i = find(p, 1);
    if (i >= 0)
        *b = allocs[i].base, *s = allocs[i].size;
    pthread_mutex_unlock(&lock);
    return i < 0 ? 1 : 0;
}

int cuMemAlloc_v2(dptr_t *p, size_t n)
{
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAXA; i++)
        if (allocs[i].size == 0) {
            allocs[i].base = (dptr_t)(uintptr_t)m, allocs[i].size = n, allocs[i].bufreg = 0;
            break;
        }
    pthread_mutex_unlock(&lock);
    *p = (dptr_t)(uintptr_t)m;
    return 0;
}

int cuMemFree_v2(dptr_t p)
{
    pthread_mutex_lock(&lock);
    int i = find(p, 1);
    if (i >= 0) {
        munmap((void *)(uintptr_t)allocs[i].base, allocs[i].size);
        allocs[i].size = 0;
    }
    pthread_mutex_unlock(&lock);
    return i < 0 ? 1 : 0;
}

int cuMemHostAlloc(void **p, size_t n, unsigned f)
{
    (void)f;
    *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    return *p ? 0 : 2;
}
int cuMemFreeHost(void *p) { free(p); return 0; }
void kvl_fake_gpu_gate(int shut)
{
    pthread_mutex_lock(&lock);
    hgate_shut = shut;
    pthread_cond_broadcast(&hgate_cond);
    pthread_mutex_unlock(&lock);
}

/* out: calls, pinned, unpinned, waiting at the gate, live ranges; and
 * whether [p, p+1) lies in a live range */
int kvl_fake_gpu_hostreg(long out[5], const void *p)
{
    int in = 0;
    long live = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAXH; i++)
        if (hregs[i].size) {
            live++;
            if ((uintptr_t)p >= hregs[i].base && (uintptr_t)p < hregs[i].base + hregs[i].size)
                in = 1;
        }
    out[0] = hreg_calls, out[1] = hreg_done, out[2] = hunreg_done, out[3] = hreg_waiting;
    out[4] = live;
    pthread_mutex_unlock(&lock);
    return in;
}

int cuMemHostRegister_v2(void *p, size_t n, unsigned f)
{
    uintptr_t b = (uintptr_t)p;
    int r = 0, slot = -1;
    (void)f;
    pthread_mutex_lock(&lock);
    hreg_calls++;
    hreg_waiting++;
    while (hgate_shut)
        pthread_cond_wait(&hgate_cond, &lock);
    hreg_waiting--;
    for (int i = 0; i < MAXH; i++) {
        if (hregs[i].size == 0 && slot < 0)
            slot = i;
        if (hregs[i].size && b < hregs[i].base + hregs[i].size && hregs[i].base < b + n)
            r = 712; /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
    }
    if (mode("hostreg_fail") || n == 0)
        r = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    else if (r == 0 && slot < 0)
        r = 2;
    if (r == 0) {
        hregs[slot].base = b, hregs[slot].size = n;
        hreg_done++;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int cuMemHostUnregister(void *p)
{
    int r = 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAXH; i++)
        if (hregs[i].size && hregs[i].base == (uintptr_t)p) {
            hregs[i].size = 0;
            hunreg_done++;
            r = 0;
            break;
        }
    pthread_mutex_unlock(&lock);
    return r;
}
int cuMemcpyAsync(dptr_t d, dptr_t s, size_t n, void *st)
{
    (void)st;
    memcpy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
    return 0;
}
int cuMemcpyHtoDAsync_v2(dptr_t d, const void *s, size_t n, void *st)
{
    (void)st;
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
int cuStreamCreate(void **s, unsigned f) { (void)f; *s = malloc(1); return 0; }
int cuStreamDestroy_v2(void *s) { free(s); return 0; }
int cuStreamSynchronize(void *s) { (void)s; return 0; }
int cuStreamWaitEvent(void *s, void *e, unsigned f) { (void)s, (void)e, (void)f; return 0; }
int cuEventCreate(void **e, unsigned f) { (void)f; *e = malloc(1); return 0; }
int cuEventDestroy_v2(void *e) { free(e); return 0; }
int cuEventRecord(void *e, void *s) { (void)e, (void)s; return 0; }
int cuEventQuery(void *e) { (void)e; return 0; }
int cuEventSynchronize(void *e) { (void)e; return 0; }
int cuIpcGetMemHandle(void *h, dptr_t p) { (void)h, (void)p; return 801; }
int cuIpcOpenMemHandle_v2(dptr_t *p, const void *h, unsigned f)
{
    (void)p, (void)h, (void)f;
    return 801;
}
int cuIpcCloseMemHandle(dptr_t p) { (void)p; return 801; }
int cuModuleLoadData(void **m, const void *i) { (void)m, (void)i; return 801; }
int cuModuleUnload(void *m) { (void)m; return 801; }
int cuModuleGetFunction(void **f, void *m, const char *n) { (void)f, (void)m, (void)n; return 801; }
int cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e,
                   unsigned g, unsigned sh, void *st, void **p, void **x)
{
    (void)f, (void)a, (void)b, (void)c, (void)d, (void)e, (void)g, (void)sh, (void)st, (void)p,
        (void)x;
    return 801;
}

/* ---- libcufile ---- */
static void count(int i, long n)
{
    pthread_mutex_lock(&lock);
    stats[i] += n;
    pthread_mutex_unlock(&lock);
}

cf_status_t cuFileDriverOpen(void)
{
    cf_status_t s = {0, 0};
    if (ctx_depth == 0)
        count(10, 1);
    if (mode("open_fail"))
        s.err = 5001;
    else
        count(0, 1);
    return s;
}

cf_status_t cuFileDriverClose_v2(void)
{
    count(1, 1);
    return (cf_status_t){0, 0};
}

cf_status_t cuFileDriverGetProperties(void *props)
{
    unsigned v[2] = {mode("nvfs") ? 2u : 0u, mode("nvfs") ? 20u : 0u};
    unsigned fflags = mode("p2p") ? 1u << 4 : 0u; /* CU_FILE_P2P_SUPPORTED, at offset 32 */
    memset(props, 0, 64);
    memcpy(props, v, sizeof(v));
    memcpy((char *)props + 32, &fflags, sizeof(fflags));
    return (cf_status_t){0, 0};
}

cf_status_t cuFileGetVersion(int *v)
{
    *v = 1150;
    return (cf_status_t){0, 0};
}

cf_status_t cuFileHandleRegister(void **fh, const int *descr)
{
    int fd = descr[2]; /* {type, pad, union at 8} */
    if (mode("handle_fail"))
        return (cf_status_t){5008, 0};
    if (descr[0] != 1 || fcntl(fd, F_GETFL) < 0)
        return (cf_status_t){5022, 0};
    int *h = malloc(sizeof(int));
    *h = fd;
    *fh = h;
    count(2, 1);
    return (cf_status_t){0, 0};
}

void cuFileHandleDeregister(void *fh)
{
    free(fh);
    count(3, 1);
}

cf_status_t cuFileBufRegister(const void *base, size_t len, int flags)
{
    (void)flags;
    pthread_mutex_lock(&lock);
    int i = find((dptr_t)(uintptr_t)base, len);
    int ok = i >= 0 && allocs[i].base == (dptr_t)(uintptr_t)base && !allocs[i].bufreg;
    if (ok)
        allocs[i].bufreg = 1, stats[4]++;
    pthread_mutex_unlock(&lock);
    return (cf_status_t){ok ? 0 : 5012, 0};
}

cf_status_t cuFileBufDeregister(const void *base)
{
    pthread_mutex_lock(&lock);
    int i = find((dptr_t)(uintptr_t)base, 1);
    int ok = i >= 0 && allocs[i].bufreg;
    if (ok)
        allocs[i].bufreg = 0, stats[5]++;
    pthread_mutex_unlock(&lock);
    return (cf_status_t){ok ? 0 : 5024, 0};
}

static ssize_t io(const int *fh, void *base, size_t size, off_t foff, off_t boff, int write)
{
    char *p = (char *)base + boff;
    if (ctx_depth == 0) {
        count(10, 1);
        return -5047; /* CU_FILE_INVALID_CONTEXT_ERROR */
    }
    pthread_mutex_lock(&lock);
    int i = find((dptr_t)(uintptr_t)p, size);
    pthread_mutex_unlock(&lock);
    if (i < 0)
        return -5012; /* CU_FILE_CUDA_POINTER_INVALID */
    if (mode("io_fail"))
        return -5044;
    if (!write && mode("read_zero"))
        return 0;
    if (mode("half") && size >= 8192)
        size = (size / 2) & ~(size_t)4095; /* stays O_DIRECT-aligned */
    ssize_t r = write ? pwrite(*fh, p, size, foff) : pread(*fh, p, size, foff);
    if (r > 0)
        count(write ? 9 : 8, r), count(write ? 7 : 6, 1);
    return r;
}

ssize_t cuFileRead(void *fh, void *base, size_t size, off_t foff, off_t boff)
{
    return io(fh, base, size, foff, boff, 0);
}

ssize_t cuFileWrite(void *fh, const void *base, size_t size, off_t foff, off_t boff)
{
    return io(fh, (void *)(uintptr_t)base, size, foff, boff, 1);
}
