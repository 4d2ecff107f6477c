/*
 * GPU memory for the CLI's smoke tests and demos: the CUDA driver API loaded
 * at run time (the CLI, like the library, has no build-time CUDA
 * dependency). KVL_CUDA_DRIVER overrides the library path.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

typedef int (*kvl_cu_init_t)(unsigned);
typedef int (*kvl_cu_dev_get_t)(int *, int);
typedef int (*kvl_cu_retain_t)(void **, int);
typedef int (*kvl_cu_ctx_t)(void *);
typedef int (*kvl_cu_pop_t)(void **);
typedef int (*kvl_cu_alloc_t)(unsigned long long *, size_t);
typedef int (*kvl_cu_free_t)(unsigned long long);
typedef int (*kvl_cu_htod_t)(unsigned long long, const void *, size_t);
typedef int (*kvl_cu_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*kvl_cu_err_t)(int, const char **);

static struct {
    int loaded;
    kvl_cu_init_t init;
    kvl_cu_dev_get_t dev_get;
    kvl_cu_retain_t retain;
    kvl_cu_ctx_t push;
    kvl_cu_pop_t pop;
    kvl_cu_alloc_t alloc;
    kvl_cu_free_t free_;
    kvl_cu_htod_t htod;
    kvl_cu_dtoh_t dtoh;
    kvl_cu_err_t err;
} kvl_cu;

static void *kvl_cu_sym(void *h, const char *name)
{
    return dlsym(h, name);
}

static int kvl_cu_load(char *why, size_t len)
{
    if (kvl_cu.loaded)
        return kvl_cu.loaded > 0 ? 0 : -1;
    const char *path = getenv("KVL_CUDA_DRIVER");
    void *h = dlopen(path && path[0] ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, len, "no CUDA driver: %.300s", dlerror());
        kvl_cu.loaded = -1;
        return -1;
    }
#define KVL_CU(field, type, name) *(void **)&kvl_cu.field = kvl_cu_sym(h, name)
    KVL_CU(init, kvl_cu_init_t, "cuInit");
    KVL_CU(dev_get, kvl_cu_dev_get_t, "cuDeviceGet");
    KVL_CU(retain, kvl_cu_retain_t, "cuDevicePrimaryCtxRetain");
    KVL_CU(push, kvl_cu_ctx_t, "cuCtxPushCurrent_v2");
    KVL_CU(pop, kvl_cu_pop_t, "cuCtxPopCurrent_v2");
    KVL_CU(alloc, kvl_cu_alloc_t, "cuMemAlloc_v2");
    KVL_CU(free_, kvl_cu_free_t, "cuMemFree_v2");
    KVL_CU(htod, kvl_cu_htod_t, "cuMemcpyHtoD_v2");
    KVL_CU(dtoh, kvl_cu_dtoh_t, "cuMemcpyDtoH_v2");
    KVL_CU(err, kvl_cu_err_t, "cuGetErrorString");
#undef KVL_CU
    if (!kvl_cu.init || !kvl_cu.dev_get || !kvl_cu.retain || !kvl_cu.push || !kvl_cu.pop ||
        !kvl_cu.alloc || !kvl_cu.free_ || !kvl_cu.htod || !kvl_cu.dtoh) {
        snprintf(why, len, "the CUDA driver lacks an entry point kvlane needs (too old?)");
        kvl_cu.loaded = -1;
        return -1;
    }
    kvl_cu.loaded = 1;
    return 0;
}

static const char *kvl_cu_str(int rc)
{
    const char *s = NULL;
    if (kvl_cu.err == NULL || kvl_cu.err(rc, &s) != 0 || s == NULL)
        return "unknown CUDA error";
    return s;
}

/* Run op with device dev's primary context current. */
static int kvl_cu_enter(int dev, char *why, size_t len)
{
    int d, rc;
    void *ctx;
    if (kvl_cu_load(why, len) != 0)
        return -1;
    if ((rc = kvl_cu.init(0)) != 0 || (rc = kvl_cu.dev_get(&d, dev)) != 0 ||
        (rc = kvl_cu.retain(&ctx, d)) != 0 || (rc = kvl_cu.push(ctx)) != 0) {
        snprintf(why, len, "CUDA device %d: %s (error %d)", dev, kvl_cu_str(rc), rc);
        return -1;
    }
    return 0;
}

static void kvl_cu_leave(void)
{
    void *ctx;
    kvl_cu.pop(&ctx);
}

int kvl_cli_gpu_alloc(int dev, size_t size, uint64_t *ptr_p, char *why, size_t len)
{
    unsigned long long p = 0;
    if (kvl_cu_enter(dev < 0 ? 0 : dev, why, len) != 0)
        return -1;
    int rc = kvl_cu.alloc(&p, size);
    kvl_cu_leave();
    if (rc != 0) {
        snprintf(why, len, "cuMemAlloc(%zu) on device %d: %s (error %d)", size, dev, kvl_cu_str(rc), rc);
        return -1;
    }
    *ptr_p = p;
    return 0;
}

void kvl_cli_gpu_free(int dev, uint64_t ptr)
{
    char why[64];
    if (ptr && kvl_cu_enter(dev < 0 ? 0 : dev, why, sizeof(why)) == 0) {
        kvl_cu.free_(ptr);
        kvl_cu_leave();
    }
}

int kvl_cli_gpu_copy(int dev, int to_gpu, uint64_t gpu, void *host, size_t size, char *why, size_t len)
{
    if (kvl_cu_enter(dev < 0 ? 0 : dev, why, len) != 0)
        return -1;
    int rc = to_gpu ? kvl_cu.htod(gpu, host, size) : kvl_cu.dtoh(host, gpu, size);
    kvl_cu_leave();
    if (rc != 0) {
        snprintf(why, len, "cuMemcpy%s: %s (error %d)", to_gpu ? "HtoD" : "DtoH", kvl_cu_str(rc), rc);
        return -1;
    }
    return 0;
}
