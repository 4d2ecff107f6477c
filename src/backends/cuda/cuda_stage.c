/*
 * kvlane cuda backend: staging for host-only backends. The core lends these
 * copies to tcp (and any backend that moves host memory only) so VRAM can
 * travel over it: device -> pinned host buffer before a send, pinned host
 * buffer -> device after a receive.
 *
 * Needs no created backend: the driver table is process-wide, and so are
 * the two streams per device used here (one per direction, so uploads and
 * downloads overlap on the copy engines). A ticket is one event per device
 * the copies touched; with a notify callback, the last stream first waits
 * for the others, runs the callback (cuLaunchHostFunc) and only then
 * records its event, so "done" always means "notify has run".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda.h"

typedef struct kvli_cuda_ticket {
    unsigned n;
    struct {
        int dev;
        CUevent ev;
    } e[];
} kvli_cuda_ticket_t;

static pthread_mutex_t kvli_cuda_stage_lock = PTHREAD_MUTEX_INITIALIZER;
static CUstream kvli_cuda_stage_streams[KVLI_CUDA_MAX_DEVICES][2];

static void kvli_cuda_stage_nodrv(kvl_error_t *err, int32_t dev)
{
    kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, dev,
                     "cannot stage VRAM through host memory: %.400s", kvli_cuda_drv_reason());
    kvl_bk_error_hint(err, "install the NVIDIA driver (libcuda.so.1) or make it visible to the "
                      "container (NVIDIA container toolkit), or set KVL_CUDA_DRIVER to its path");
}

kvl_status_t kvli_cuda_stage_check(kvl_mem_kind_t kind, int32_t dev, kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    if (kind != KVL_MEM_VRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_CUDA_NAME, dev,
                         "staging serves VRAM only, not %s memory", kvl_mem_kind_name(kind));
        kvl_bk_error_hint(err, "register host memory directly on the backend");
        return KVL_ERR_UNSUPPORTED;
    }
    if (d == NULL) {
        kvli_cuda_stage_nodrv(err, dev);
        return KVL_ERR_NO_DEVICE;
    }
    if (dev < 0 || dev >= d->ndev) {
        kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, dev,
                         "cannot stage VRAM of device %d: this process sees %d CUDA device(s)",
                         (int)dev, d->ndev);
        kvl_bk_error_hint(err, "register the memory with its CUDA ordinal in this process "
                          "(after CUDA_VISIBLE_DEVICES remapping)");
        return KVL_ERR_NO_DEVICE;
    }
    return KVL_OK;
}

kvl_status_t kvli_cuda_stage_host_alloc(size_t len, void **ptr_p, kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    char eb[160];
    CUresult r;
    if (d == NULL) {
        kvli_cuda_stage_nodrv(err, -1);
        return KVL_ERR_NO_DEVICE;
    }
    r = kvli_cuda_drv_push(0);
    if (r == KVLI_CUDA_SUCCESS) {
        /* Portable: pinned for every context, so any device copies from it. */
        r = d->cuMemHostAlloc(ptr_p, len, KVLI_CU_HOSTREG_PORTABLE);
        kvli_cuda_drv_pop();
    }
    if (r != KVLI_CUDA_SUCCESS) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, 0, KVLI_CUDA_NAME, 0,
                         "cuMemHostAlloc(%zu bytes) for a staging buffer = %.150s", len,
                         kvli_cuda_drv_errstr(r, eb, sizeof(eb)));
        kvl_bk_error_hint(err, "pinned host memory is short: lower the backend's chunk size "
                          "(tcp chunk_kib) or free pinned memory; check `ulimit -l` in containers");
        return KVL_ERR_NO_MEMORY;
    }
    return KVL_OK;
}

void kvli_cuda_stage_host_free(void *ptr)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    if (d != NULL && ptr != NULL)
        d->cuMemFreeHost(ptr); /* DEINITIALIZED at process exit: the memory goes anyway */
}

static CUstream kvli_cuda_stage_stream(const kvli_cuda_drv_t *d, int dev, int to_host,
                                       CUresult *r_p)
{
    CUstream s;
    pthread_mutex_lock(&kvli_cuda_stage_lock);
    s = kvli_cuda_stage_streams[dev][to_host ? 1 : 0];
    *r_p = KVLI_CUDA_SUCCESS;
    if (s == NULL) {
        /* current context is dev's (the caller pushed it) */
        *r_p = d->cuStreamCreate(&s, KVLI_CU_STREAM_NON_BLOCKING);
        if (*r_p == KVLI_CUDA_SUCCESS)
            kvli_cuda_stage_streams[dev][to_host ? 1 : 0] = s;
        else
            s = NULL;
    }
    pthread_mutex_unlock(&kvli_cuda_stage_lock);
    return s;
}

/* Wait for and destroy the ticket's events; 0 when all completed. */
static CUresult kvli_cuda_stage_drain(const kvli_cuda_drv_t *d, kvli_cuda_ticket_t *t,
                                      int *failed_dev)
{
    CUresult first = KVLI_CUDA_SUCCESS;
    for (unsigned i = 0; i < t->n; i++) {
        CUresult r = d->cuEventSynchronize(t->e[i].ev);
        if (r != KVLI_CUDA_SUCCESS && first == KVLI_CUDA_SUCCESS) {
            first = r;
            *failed_dev = t->e[i].dev;
        }
        if (kvli_cuda_drv_push(t->e[i].dev) == KVLI_CUDA_SUCCESS) {
            d->cuEventDestroy(t->e[i].ev);
            kvli_cuda_drv_pop();
        }
    }
    free(t);
    return first;
}

kvl_status_t kvli_cuda_stage_copy(int to_host, const kvl_stage_piece_t *p, size_t n,
                                  void (*notify)(void *arg), void *arg, void **ticket_p,
                                  kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    kvli_cuda_ticket_t *t;
    CUresult r = KVLI_CUDA_SUCCESS;
    const char *call = "";
    char eb[160];
    size_t i = 0, bad = 0;
    int fdev = -1;

    if (d == NULL) {
        kvli_cuda_stage_nodrv(err, -1);
        return KVL_ERR_NO_DEVICE;
    }
    for (size_t k = 0; k < n; k++)
        if (p[k].host == NULL || p[k].len == 0 || p[k].dev < 0 || p[k].dev >= d->ndev) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, p[k].dev,
                             "staging copy %zu: device %d, host %p, %" PRIu64 " bytes: no such "
                             "device, no host buffer or empty", k, (int)p[k].dev, p[k].host,
                             p[k].len);
            kvl_bk_error_hint(err, "a kvlane bug: the backend builds staging copies");
            return KVL_ERR_INVALID_ARG;
        }
    /* one event per run of pieces on one device (at most n) */
    t = calloc(1, sizeof(*t) + (n + 1) * sizeof(t->e[0]));
    if (t == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, 0, KVLI_CUDA_NAME, -1,
                         "out of memory for a staging ticket of %zu copies", n);
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    while (i < n && r == KVLI_CUDA_SUCCESS) {
        int dev = p[i].dev;
        CUstream s;
        fdev = dev;
        call = "cuCtxPushCurrent";
        if ((r = kvli_cuda_drv_push(dev)) != KVLI_CUDA_SUCCESS)
            break;
        call = "cuStreamCreate";
        s = kvli_cuda_stage_stream(d, dev, to_host, &r);
        for (; s != NULL && i < n && p[i].dev == dev && r == KVLI_CUDA_SUCCESS; i++) {
            CUdeviceptr h = (CUdeviceptr)(uintptr_t)p[i].host;
            call = to_host ? "cuMemcpyAsync(device -> host)" : "cuMemcpyAsync(host -> device)";
            bad = i;
            r = d->cuMemcpyAsync(to_host ? h : p[i].dev_addr, to_host ? p[i].dev_addr : h,
                                 (size_t)p[i].len, s);
        }
        if (r == KVLI_CUDA_SUCCESS) {
            call = "cuEventCreate";
            r = d->cuEventCreate(&t->e[t->n].ev, KVLI_CU_EVENT_DISABLE_TIMING);
        }
        if (r == KVLI_CUDA_SUCCESS) {
            t->e[t->n].dev = dev;
            if (i < n || notify == NULL || d->cuLaunchHostFunc == NULL) {
                call = "cuEventRecord";
                r = d->cuEventRecord(t->e[t->n].ev, s);
            } else {
                /* the last run: wait for the others, notify, then record */
                for (unsigned k = 0; k < t->n && r == KVLI_CUDA_SUCCESS; k++) {
                    call = "cuStreamWaitEvent";
                    r = d->cuStreamWaitEvent(s, t->e[k].ev, 0);
                }
                if (r == KVLI_CUDA_SUCCESS) {
                    call = "cuLaunchHostFunc";
                    r = d->cuLaunchHostFunc(s, notify, arg);
                }
                if (r == KVLI_CUDA_SUCCESS) {
                    call = "cuEventRecord";
                    r = d->cuEventRecord(t->e[t->n].ev, s);
                }
            }
            if (r == KVLI_CUDA_SUCCESS)
                t->n++;
            else
                d->cuEventDestroy(t->e[t->n].ev);
        }
        if (r != KVLI_CUDA_SUCCESS && s != NULL)
            d->cuStreamSynchronize(s); /* nothing may still write the buffer */
        kvli_cuda_drv_pop();
    }
    if (r != KVLI_CUDA_SUCCESS) {
        int dd = -1;
        kvli_cuda_stage_drain(d, t, &dd);
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_CUDA_NAME, fdev,
                         "staging %s on device %d: %s = %.150s (copy %zu of %zu: device 0x%" PRIx64
                         ", %" PRIu64 " bytes)", to_host ? "download" : "upload", fdev, call,
                         kvli_cuda_drv_errstr(r, eb, sizeof(eb)), bad, n,
                         n ? p[bad].dev_addr : 0, n ? p[bad].len : 0);
        kvl_bk_error_hint(err, "the GPU memory was freed while registered, or the device "
                          "failed (check nvidia-smi and dmesg for Xid errors)");
        return KVL_ERR_SYSTEM;
    }
    *ticket_p = t;
    return KVL_OK;
}

int kvli_cuda_stage_test(void *ticket, int wait, kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    kvli_cuda_ticket_t *t = ticket;
    char eb[160];
    int dev = -1;
    CUresult r;
    if (d == NULL || t == NULL) {
        kvli_cuda_stage_nodrv(err, -1);
        return -1;
    }
    if (!wait)
        for (unsigned i = 0; i < t->n; i++) {
            r = d->cuEventQuery(t->e[i].ev);
            if (r == KVLI_CUDA_ERROR_NOT_READY)
                return 0;
            if (r != KVLI_CUDA_SUCCESS)
                break;
        }
    r = kvli_cuda_stage_drain(d, t, &dev);
    if (r == KVLI_CUDA_SUCCESS)
        return 1;
    kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_CUDA_NAME, dev,
                     "staging copies on device %d failed: %.150s", dev,
                     kvli_cuda_drv_errstr(r, eb, sizeof(eb)));
    kvl_bk_error_hint(err, "the GPU memory was freed while a transfer used it, or the device "
                      "failed (check nvidia-smi and dmesg for Xid errors)");
    return -1;
}

kvl_status_t kvli_cuda_stage_enter(int32_t dev, kvl_error_t *err)
{
    char eb[160];
    kvl_status_t st = kvli_cuda_stage_check(KVL_MEM_VRAM, dev, err);
    if (st != KVL_OK)
        return st;
    CUresult r = kvli_cuda_drv_push(dev);
    if (r != KVLI_CUDA_SUCCESS) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_CUDA_NAME, dev,
                         "making device %d's primary context current failed: %.150s", (int)dev,
                         kvli_cuda_drv_errstr(r, eb, sizeof(eb)));
        kvl_bk_error_hint(err, "check the GPU (nvidia-smi) and dmesg for Xid errors");
        return KVL_ERR_SYSTEM;
    }
    return KVL_OK;
}

void kvli_cuda_stage_leave(void)
{
    kvli_cuda_drv_pop();
}
