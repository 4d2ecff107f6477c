/*
 * kvlane cuda backend: pinning registered host memory (param pin_host).
 *
 * cuMemHostRegister is what lets GPU<->host copies of a host region run at
 * the DMA rate, but it faults in and locks every page: ~70 us for 1 MiB and
 * 0.14-0.6 s for 4 GiB on an H200 host, a hundred times what the rest of a
 * host registration costs. With pin_host=auto (the default) a registration
 * queues the region to this backend's pin thread and returns; the thread
 * pins the regions in turn. Until a region's pin lands, GPU copies of it
 * are staged by the driver (the same bytes, more slowly); from then on they
 * are DMA. The thread also asks the driver whether a region is page-locked
 * already (cudaHostAlloc memory), which costs ~2 us a region on an H200
 * host: the registration itself makes no driver call. pin_host=sync asks
 * and pins in the registering call, so its report says what became of the
 * region; pin_host=off never pins.
 *
 * Deregistration takes a queued region out of the queue unpinned, waits for
 * one being pinned, and unpins what was pinned: no page this backend locked
 * stays locked after kvl_mem_deregister returns. The thread starts with the
 * first queued region (an agent that registers no host memory has none) and
 * is joined at close.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include "common/errname.h"
#include "common/host.h"
#include "common/iface.h"
#include "cuda.h"

/* cuMemHostRegister of mh's pages. 0 pinned (pinned_here set), 1 a
 * page-locked range overlaps it, -1 failed: logged, the driver's words in
 * eb. Any thread. */
static int kvli_cuda_pin_range(kvli_cuda_iface_t *iface, kvli_cuda_mh_t *mh, char *eb,
                               size_t el)
{
    const kvli_cuda_drv_t *d = iface->drv;
    uint64_t ps = kvli_host_pagesize();
    uint64_t b = mh->addr & ~(ps - 1), e = (mh->addr + mh->len + ps - 1) & ~(ps - 1);
    CUresult cr = kvli_cuda_drv_push(0);
    if (cr == KVLI_CUDA_SUCCESS) {
        cr = d->cuMemHostRegister((void *)(uintptr_t)b, (size_t)(e - b),
                                  KVLI_CU_HOSTREG_PORTABLE | KVLI_CU_HOSTREG_DEVICEMAP);
        kvli_cuda_drv_pop();
    }
    if (cr == KVLI_CUDA_SUCCESS) {
        mh->pinned_here = 1;
        mh->pin_base = b;
        mh->pin_len = e - b;
        return 0;
    }
    if (cr == KVLI_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        return 1;
    kvli_cuda_drv_errstr(cr, eb, el);
    iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                    "cuMemHostRegister(0x%" PRIx64 ", %" PRIu64 ") = %s: GPU copies of this "
                    "region are staged by the driver (slower); check the locked-memory limit "
                    "(ulimit -l)", b, e - b, eb);
    return -1;
}

static void *kvli_cuda_pin_main(void *arg)
{
    kvli_cuda_iface_t *iface = arg;
    char eb[160];
    pthread_mutex_lock(&iface->pin_lock);
    for (;;) {
        while (iface->pin_head == NULL && !iface->pin_stop) {
            iface->pin_idle = 1;
            pthread_cond_wait(&iface->pin_cond, &iface->pin_lock);
            iface->pin_idle = 0;
        }
        if (iface->pin_stop)
            break;
        kvli_cuda_mh_t *mh = iface->pin_head;
        iface->pin_head = mh->pin_next;
        if (iface->pin_head != NULL)
            iface->pin_head->pin_prev = NULL;
        else
            iface->pin_tail = NULL;
        mh->pin_next = mh->pin_prev = NULL;
        mh->pin_state = KVLI_CUDA_PIN_BUSY;
        pthread_mutex_unlock(&iface->pin_lock);
        /* Memory page-locked already (cudaHostAlloc, another registration)
         * is left alone: it is not ours to unlock later. */
        if (kvli_cuda_memtype(iface->drv, mh->addr, NULL) != KVLI_CU_MEMTYPE_HOST)
            (void)kvli_cuda_pin_range(iface, mh, eb, sizeof(eb));
        pthread_mutex_lock(&iface->pin_lock);
        mh->pin_state = KVLI_CUDA_PIN_NONE;
        pthread_cond_broadcast(&iface->pin_cond); /* a deregistration may wait for it */
    }
    pthread_mutex_unlock(&iface->pin_lock);
    return NULL;
}

void kvli_cuda_pin_init(kvli_cuda_iface_t *iface)
{
    kvli_lock_init(&iface->pin_lock, &iface->pin_cond);
    iface->pin_head = iface->pin_tail = NULL;
    iface->pin_started = iface->pin_stop = iface->pin_idle = 0;
}

void kvli_cuda_pin_fini(kvli_cuda_iface_t *iface)
{
    pthread_mutex_lock(&iface->pin_lock);
    iface->pin_stop = 1;
    /* The core deregistered every region first; whatever is still queued
     * is forgotten unpinned. */
    for (kvli_cuda_mh_t *mh = iface->pin_head; mh != NULL; mh = mh->pin_next)
        mh->pin_state = KVLI_CUDA_PIN_NONE;
    iface->pin_head = iface->pin_tail = NULL;
    pthread_cond_broadcast(&iface->pin_cond);
    pthread_mutex_unlock(&iface->pin_lock);
    if (iface->pin_started)
        pthread_join(iface->pin_thread, NULL);
    iface->pin_started = 0;
    pthread_cond_destroy(&iface->pin_cond);
    pthread_mutex_destroy(&iface->pin_lock);
}

void kvli_cuda_pin_host(kvli_cuda_iface_t *iface, kvli_cuda_mh_t *mh, char *det, size_t dl)
{
    char eb[160];
    int e = 0;

    if (iface->pin_host == KVLI_CUDA_PINH_AUTO) {
        pthread_mutex_lock(&iface->pin_lock);
        if (!iface->pin_started && !iface->pin_stop &&
            (e = pthread_create(&iface->pin_thread, NULL, kvli_cuda_pin_main, iface)) == 0)
            iface->pin_started = 1;
        if (iface->pin_started && !iface->pin_stop) {
            mh->pin_prev = iface->pin_tail;
            mh->pin_next = NULL;
            if (iface->pin_tail != NULL)
                iface->pin_tail->pin_next = mh;
            else
                iface->pin_head = mh;
            iface->pin_tail = mh;
            mh->pin_state = KVLI_CUDA_PIN_QUEUED;
            mh->pin_async = 1;
            /* a busy thread looks at the queue before it waits again: only
             * an idle one needs waking (one wake-up for a list, not a
             * system call a region) */
            if (iface->pin_idle) {
                iface->pin_idle = 0;
                pthread_cond_broadcast(&iface->pin_cond);
            }
            pthread_mutex_unlock(&iface->pin_lock);
            kvl_bk_scopy(det, dl, "host memory, pinned by cuMemHostRegister in the background "
                         "unless page-locked already (GPU copies are staged by the driver "
                         "until then)");
            return;
        }
        pthread_mutex_unlock(&iface->pin_lock);
        if (e != 0)
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "pthread_create(pin thread) = %s (%s): "
                            "host memory is pinned in the registering call (pin_host=sync)",
                            kvli_errno_name(e), strerror(e));
    }
    switch (kvli_cuda_pin_range(iface, mh, eb, sizeof(eb))) {
    case 0:
        kvl_bk_scopy(det, dl, "host memory pinned with cuMemHostRegister");
        break;
    case 1:
        kvl_bk_scopy(det, dl, "host memory (a page-locked range overlaps it)");
        break;
    default:
        snprintf(det, dl, "pageable host memory (cuMemHostRegister = %.150s)", eb);
    }
}

void kvli_cuda_pin_drop(kvli_cuda_iface_t *iface, kvli_cuda_mh_t *mh)
{
    if (mh->pin_async) {
        pthread_mutex_lock(&iface->pin_lock);
        if (mh->pin_state == KVLI_CUDA_PIN_QUEUED) {
            if (mh->pin_prev != NULL)
                mh->pin_prev->pin_next = mh->pin_next;
            else
                iface->pin_head = mh->pin_next;
            if (mh->pin_next != NULL)
                mh->pin_next->pin_prev = mh->pin_prev;
            else
                iface->pin_tail = mh->pin_prev;
            mh->pin_next = mh->pin_prev = NULL;
            mh->pin_state = KVLI_CUDA_PIN_NONE;
        }
        while (mh->pin_state == KVLI_CUDA_PIN_BUSY)
            pthread_cond_wait(&iface->pin_cond, &iface->pin_lock);
        pthread_mutex_unlock(&iface->pin_lock);
    }
    if (mh->pinned_here && kvli_cuda_drv_push(0) == KVLI_CUDA_SUCCESS) {
        iface->drv->cuMemHostUnregister((void *)(uintptr_t)mh->pin_base);
        kvli_cuda_drv_pop();
        mh->pinned_here = 0;
    }
}
