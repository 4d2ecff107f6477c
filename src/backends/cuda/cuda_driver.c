/*
 * kvlane cuda backend: the CUDA driver, loaded at run time. dlopen of
 * libcuda.so.1 (or $KVL_CUDA_DRIVER), its entry points, the visible devices
 * and their primary contexts. Loaded once per process; when anything is
 * missing the reason is kept and every caller can print it.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "cuda.h"

#ifdef KVL_CUDA_KERNEL_HEADER
#include KVL_CUDA_KERNEL_HEADER /* generated: kvli_cuda_kernel_image[], KVLI_CUDA_KERNEL_NOTE */
#endif

static kvli_cuda_drv_t kvli_cuda_drv;
static int kvli_cuda_drv_ok;
static char kvli_cuda_drv_why[640];
static pthread_once_t kvli_cuda_drv_once = PTHREAD_ONCE_INIT;
static atomic_bool kvli_cuda_drv_tried;  /* kvli_cuda_drv_load ran (or runs) */

const char *kvli_cuda_drv_errstr(CUresult r, char *buf, size_t cap)
{
    const char *name = NULL, *text = NULL;
    if (kvli_cuda_drv.cuGetErrorName != NULL)
        kvli_cuda_drv.cuGetErrorName(r, &name);
    if (kvli_cuda_drv.cuGetErrorString != NULL)
        kvli_cuda_drv.cuGetErrorString(r, &text);
    if (name != NULL)
        snprintf(buf, cap, "%.60s (%.120s)", name, text ? text : "no description");
    else
        snprintf(buf, cap, "CUresult %d", (int)r);
    return buf;
}

/* Resolve one entry point; required ones make the driver unusable when absent. */
static int kvli_cuda_drv_sym(void *h, const char *name, void *slot, int required)
{
    void *p = dlsym(h, name);
    memcpy(slot, &p, sizeof(p));
    if (p == NULL && required) {
        snprintf(kvli_cuda_drv_why, sizeof(kvli_cuda_drv_why),
                 "the CUDA driver %.256s has no entry point %.60s: the driver is too old for "
                 "kvlane (it needs a CUDA 11.3 or newer driver)", kvli_cuda_drv.path, name);
        return -1;
    }
    return 0;
}

static int kvli_cuda_drv_resolve(void *h)
{
    kvli_cuda_drv_t *d = &kvli_cuda_drv;
#define KVLI_REQ(field, sym) \
    if (kvli_cuda_drv_sym(h, sym, &d->field, 1) != 0) return -1
#define KVLI_OPT(field, sym) kvli_cuda_drv_sym(h, sym, &d->field, 0)
    KVLI_REQ(cuInit, "cuInit");
    KVLI_REQ(cuDriverGetVersion, "cuDriverGetVersion");
    KVLI_REQ(cuGetErrorName, "cuGetErrorName");
    KVLI_REQ(cuGetErrorString, "cuGetErrorString");
    KVLI_REQ(cuDeviceGetCount, "cuDeviceGetCount");
    KVLI_REQ(cuDeviceGet, "cuDeviceGet");
    KVLI_REQ(cuDeviceGetName, "cuDeviceGetName");
    KVLI_REQ(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
    KVLI_REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    KVLI_REQ(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer");
    KVLI_REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    KVLI_REQ(cuCtxPushCurrent, "cuCtxPushCurrent_v2");
    KVLI_REQ(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
    KVLI_REQ(cuPointerGetAttribute, "cuPointerGetAttribute");
    KVLI_REQ(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    KVLI_REQ(cuMemHostRegister, "cuMemHostRegister_v2");
    KVLI_REQ(cuMemHostUnregister, "cuMemHostUnregister");
    KVLI_REQ(cuMemHostAlloc, "cuMemHostAlloc");
    KVLI_REQ(cuMemFreeHost, "cuMemFreeHost");
    KVLI_REQ(cuMemAlloc, "cuMemAlloc_v2");
    KVLI_REQ(cuMemFree, "cuMemFree_v2");
    KVLI_REQ(cuMemcpyAsync, "cuMemcpyAsync");
    KVLI_REQ(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    KVLI_REQ(cuStreamCreate, "cuStreamCreate");
    KVLI_REQ(cuStreamDestroy, "cuStreamDestroy_v2");
    KVLI_REQ(cuStreamSynchronize, "cuStreamSynchronize");
    KVLI_REQ(cuEventCreate, "cuEventCreate");
    KVLI_REQ(cuEventDestroy, "cuEventDestroy_v2");
    KVLI_REQ(cuEventRecord, "cuEventRecord");
    KVLI_REQ(cuEventQuery, "cuEventQuery");
    KVLI_REQ(cuEventSynchronize, "cuEventSynchronize");
    KVLI_REQ(cuStreamWaitEvent, "cuStreamWaitEvent");
    KVLI_OPT(cuLaunchHostFunc, "cuLaunchHostFunc");
    KVLI_OPT(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    KVLI_REQ(cuIpcGetMemHandle, "cuIpcGetMemHandle");
    KVLI_REQ(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    KVLI_REQ(cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    KVLI_REQ(cuModuleLoadData, "cuModuleLoadData");
    KVLI_REQ(cuModuleUnload, "cuModuleUnload");
    KVLI_REQ(cuModuleGetFunction, "cuModuleGetFunction");
    KVLI_REQ(cuLaunchKernel, "cuLaunchKernel");
    KVLI_OPT(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync_v2");
    if (d->cuMemcpyBatchAsync_v2 == NULL)
        KVLI_OPT(cuMemcpyBatchAsync_v1, "cuMemcpyBatchAsync");
    KVLI_OPT(cuMemAllocAsync, "cuMemAllocAsync");
    KVLI_OPT(cuMemFreeAsync, "cuMemFreeAsync");
    KVLI_OPT(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    KVLI_OPT(cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
    KVLI_OPT(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    KVLI_OPT(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle");
    KVLI_OPT(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    KVLI_OPT(cuMemAddressReserve, "cuMemAddressReserve");
    KVLI_OPT(cuMemAddressFree, "cuMemAddressFree");
    KVLI_OPT(cuMemMap, "cuMemMap");
    KVLI_OPT(cuMemUnmap, "cuMemUnmap");
    KVLI_OPT(cuMemSetAccess, "cuMemSetAccess");
    KVLI_OPT(cuMemRelease, "cuMemRelease");
#undef KVLI_REQ
#undef KVLI_OPT
    d->vmm = d->cuMemRetainAllocationHandle && d->cuMemExportToShareableHandle &&
             d->cuMemImportFromShareableHandle && d->cuMemAddressReserve &&
             d->cuMemAddressFree && d->cuMemMap && d->cuMemUnmap && d->cuMemSetAccess &&
             d->cuMemRelease && d->cuMemGetAllocationGranularity;
    return 0;
}

static void kvli_cuda_drv_load(void)
{
    kvli_cuda_drv_t *d = &kvli_cuda_drv;
    atomic_store(&kvli_cuda_drv_tried, true);
    const char *env = getenv("KVL_CUDA_DRIVER");
    const char *want = env && env[0] ? env : "libcuda.so.1";
    char eb[200];
    CUresult r;
    int n = 0;

    snprintf(d->path, sizeof(d->path), "%s", want);
    dlerror();
    d->handle = dlopen(want, RTLD_NOW | RTLD_LOCAL);
    if (d->handle == NULL) {
        const char *e = dlerror();
        snprintf(kvli_cuda_drv_why, sizeof(kvli_cuda_drv_why),
                 "no CUDA driver found: dlopen(\"%.200s\") failed: %.300s (searched %s)", want,
                 e ? e : "unknown error",
                 env && env[0] ? "the path in KVL_CUDA_DRIVER"
                               : "LD_LIBRARY_PATH, /etc/ld.so.cache and the default library "
                                 "directories");
        return;
    }
    {
        struct link_map *lm = NULL;
        if (dlinfo(d->handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name != NULL &&
            lm->l_name[0])
            snprintf(d->path, sizeof(d->path), "%s", lm->l_name);
    }
    if (kvli_cuda_drv_resolve(d->handle) != 0)
        return;
    r = d->cuInit(0);
    if (r != KVLI_CUDA_SUCCESS) {
        snprintf(kvli_cuda_drv_why, sizeof(kvli_cuda_drv_why),
                 "the CUDA driver %.200s is present but cuInit(0) = %.200s%s", d->path,
                 kvli_cuda_drv_errstr(r, eb, sizeof(eb)),
                 r == KVLI_CUDA_ERROR_NO_DEVICE
                     ? ": no GPU is visible to this process (check CUDA_VISIBLE_DEVICES and "
                       "that the container was given a GPU)"
                 : r == KVLI_CUDA_ERROR_STUB_LIBRARY
                     ? ": this is the toolkit's stub library, not a real driver (remove the "
                       "stubs folder from LD_LIBRARY_PATH)"
                     : "");
        return;
    }
    d->cuDriverGetVersion(&d->version);
    r = d->cuDeviceGetCount(&n);
    if (r != KVLI_CUDA_SUCCESS || n <= 0) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(kvli_cuda_drv_why, sizeof(kvli_cuda_drv_why),
                 "the CUDA driver %.200s found no device (cuDeviceGetCount = %d, %.120s); "
                 "CUDA_VISIBLE_DEVICES=%.64s", d->path, n,
                 kvli_cuda_drv_errstr(r, eb, sizeof(eb)), cvd ? cvd : "(not set)");
        return;
    }
    if (n > KVLI_CUDA_MAX_DEVICES)
        n = KVLI_CUDA_MAX_DEVICES;
    for (int i = 0; i < n; i++) {
        pthread_mutex_init(&d->devs[i].lock, NULL);
        if (d->cuDeviceGet(&d->devs[i].dev, i) != KVLI_CUDA_SUCCESS)
            d->devs[i].dev = i;
        if (d->cuDeviceGetPCIBusId(d->devs[i].pci, (int)sizeof(d->devs[i].pci),
                                   d->devs[i].dev) != KVLI_CUDA_SUCCESS)
            snprintf(d->devs[i].pci, sizeof(d->devs[i].pci), "unknown");
        for (char *p = d->devs[i].pci; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        if (d->cuDeviceGetName(d->devs[i].name, (int)sizeof(d->devs[i].name),
                               d->devs[i].dev) != KVLI_CUDA_SUCCESS)
            snprintf(d->devs[i].name, sizeof(d->devs[i].name), "GPU");
        d->cuDeviceGetAttribute(&d->devs[i].sm_count, KVLI_CU_DEV_ATTR_SM_COUNT, d->devs[i].dev);
        d->cuDeviceGetAttribute(&d->devs[i].posix_fd, KVLI_CU_DEV_ATTR_POSIX_FD, d->devs[i].dev);
        if (d->devs[i].sm_count <= 0)
            d->devs[i].sm_count = 16;
    }
    d->ndev = n;
    kvli_cuda_drv_ok = 1;
}

const kvli_cuda_drv_t *kvli_cuda_drv_get(void)
{
    pthread_once(&kvli_cuda_drv_once, kvli_cuda_drv_load);
    return kvli_cuda_drv_ok ? &kvli_cuda_drv : NULL;
}

/* The loaded objects, read in memory (a dlopen with RTLD_NOLOAD searches the
 * library path first). glibc counts loads and unloads (dlpi_adds/_subs): an
 * answer stays true until they change, so registering a list asks once. */
typedef struct kvli_cuda_seen {
    const char *want;                /* libcuda.so*, or the file KVL_CUDA_DRIVER names */
    unsigned long long gen;          /* adds + subs when looked */
    bool counted, found;
} kvli_cuda_seen_t;

/* the last answer: (generation << 1) | found, one word so the two agree */
static _Atomic unsigned long long kvli_cuda_seen_last = ~0ull;

/* dl_iterate_phdr callback: the generation (first object), then whether an
 * object named like the driver is loaded (its file name, no directory). */
static int kvli_cuda_drv_seen(struct dl_phdr_info *info, size_t size, void *arg)
{
    kvli_cuda_seen_t *s = arg;
    if (!s->counted) {
        s->counted = true;
        if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            unsigned long long last = atomic_load(&kvli_cuda_seen_last);
            s->gen = info->dlpi_adds + info->dlpi_subs;
            if (last != ~0ull && last >> 1 == s->gen) {
                s->found = last & 1;
                return 1; /* nothing loaded or unloaded since: the same answer */
            }
        }
    }
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    s->found = strncmp(base, s->want, strlen(s->want)) == 0;
    return s->found;
}

bool kvli_cuda_drv_in_process(void)
{
    if (atomic_load(&kvli_cuda_drv_tried))
        return kvli_cuda_drv_get() != NULL;
    const char *env = getenv("KVL_CUDA_DRIVER");
    kvli_cuda_seen_t s = {.want = "libcuda.so", .gen = ~0ull};
    if (env && env[0])
        s.want = strrchr(env, '/') ? strrchr(env, '/') + 1 : env;
    dl_iterate_phdr(kvli_cuda_drv_seen, &s);
    if (s.gen != ~0ull)
        atomic_store(&kvli_cuda_seen_last, s.gen << 1 | (s.found ? 1u : 0u));
    return s.found;
}

const char *kvli_cuda_drv_reason(void)
{
    pthread_once(&kvli_cuda_drv_once, kvli_cuda_drv_load);
    return kvli_cuda_drv_ok ? "" : kvli_cuda_drv_why;
}

CUresult kvli_cuda_drv_push(int i)
{
    kvli_cuda_drv_t *d = &kvli_cuda_drv;
    CUresult r = KVLI_CUDA_SUCCESS;
    if (!kvli_cuda_drv_ok || i < 0 || i >= d->ndev)
        return KVLI_CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&d->devs[i].lock);
    if (d->devs[i].ctx == NULL)
        r = d->cuDevicePrimaryCtxRetain(&d->devs[i].ctx, d->devs[i].dev);
    pthread_mutex_unlock(&d->devs[i].lock);
    if (r != KVLI_CUDA_SUCCESS)
        return r;
    /* Kept for the life of the process: never depend on the caller's
     * current context, never tear down one the application shares. */
    return d->cuCtxPushCurrent(d->devs[i].ctx);
}

void kvli_cuda_drv_pop(void)
{
    CUcontext c;
    kvli_cuda_drv.cuCtxPopCurrent(&c);
}

int kvli_cuda_drv_dev_by_pci(const char *pci)
{
    for (int i = 0; i < kvli_cuda_drv.ndev; i++)
        if (strcasecmp(kvli_cuda_drv.devs[i].pci, pci) == 0)
            return i;
    return -1;
}

int kvli_cuda_drv_have_kernel(void)
{
#ifdef KVL_CUDA_KERNEL_HEADER
    return sizeof(kvli_cuda_kernel_image) > 16;
#else
    return 0;
#endif
}

const void *kvli_cuda_drv_kernel_image(void)
{
#ifdef KVL_CUDA_KERNEL_HEADER
    return kvli_cuda_kernel_image;
#else
    return NULL;
#endif
}

const char *kvli_cuda_drv_kernel_note(void)
{
#ifdef KVL_CUDA_KERNEL_HEADER
    return "gather kernel: " KVLI_CUDA_KERNEL_NOTE;
#else
    return "gather kernel: not built (no nvcc when kvlane was built): many small blocks move "
           "with batched copies (cuMemcpyBatchAsync, or one cuMemcpyAsync per block on older "
           "drivers)";
#endif
}

void kvli_cuda_drv_remap_text(int declared, int actual, char *buf, size_t cap)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = kvli_cuda_drv.ndev;
    buf[0] = '\0';
    if (cvd != NULL && cvd[0]) {
        /* Is the declared id the physical index of this very GPU? */
        char tmp[256];
        int pos = 0, hit = -1;
        snprintf(tmp, sizeof(tmp), "%s", cvd);
        for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *end;
            long v = strtol(t, &end, 10);
            if (end != t && *end == '\0' && v == declared && pos == actual)
                hit = pos;
            pos++;
        }
        if (hit >= 0) {
            snprintf(buf, cap, "; with CUDA_VISIBLE_DEVICES=%.100s this GPU is device %d inside "
                     "the process: pass the in-process ordinal", cvd, actual);
            return;
        }
        snprintf(buf, cap, "; CUDA_VISIBLE_DEVICES=%.100s renumbers the visible GPUs from 0 "
                 "inside each process (this process sees %d): %d looks like a physical GPU "
                 "index or a tensor-parallel rank, not an in-process ordinal: pass %d", cvd, n,
                 declared, actual);
        return;
    }
    if (declared >= n)
        snprintf(buf, cap, "; this process sees %d CUDA device(s), numbered from 0 "
                 "(CUDA_VISIBLE_DEVICES is not set): %d looks like a physical GPU index or a "
                 "tensor-parallel rank, not an in-process ordinal: pass %d", n, declared, actual);
    else
        snprintf(buf, cap, "; the memory is on device %d, not %d: pass %d (or KVL_DEV_ANY to "
                 "detect it)", actual, declared, actual);
}
