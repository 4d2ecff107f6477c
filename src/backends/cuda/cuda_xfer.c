/*
 * kvlane cuda backend: transfers. A posted transfer is cut into work units
 * (up to KVLI_CUDA_UNIT_BYTES or KVLI_CUDA_UNIT_BLOCKS each) enqueued on one
 * of the executing device's streams, each followed by an event. xfer_post
 * enqueues the first KVLI_CUDA_WINDOW units and returns; the progress thread
 * polls the events, enqueues the next units, and once the last one is
 * complete sends the notification and calls xfer_done. No caller thread
 * ever waits on the GPU.
 *
 * How a unit moves:
 *   one big block         cuMemcpyAsync (the copy path of the driver);
 *   many blocks, GPU-GPU  one launch of the gather kernel (kernels.cu) per unit
 *                         over a descriptor table (src, dst, len) built and
 *                         uploaded at the first posting and kept on the GPU
 *                         in x->bk_priv (xfer_release frees it): a re-post is
 *                         a few launches, no host work per block; units of up
 *                         to KVLI_CUDA_UNIT_BYTES, all enqueued at post when
 *                         they fit the window (2 GiB: 4 launches);
 *   many blocks, else     cuMemcpyBatchAsync, or one cuMemcpyAsync per block
 *                         when the driver has no batch call.
 * Small requests (up to KVLI_CUDA_INLINE_BLOCKS descriptors, or
 * KVLI_CUDA_INLINE_PAIRS pairs of an indexed transfer) pass their table as
 * the launch's parameter: one operation on the stream, nothing uploaded.
 * Indexed transfers read the prepared lists' address tables (uploaded when
 * the lists are prepared) and their own indices, which the core writes at
 * creation into pinned memory this backend lends (kvli_cuda_idx_alloc): the
 * warp kernel reads them there in place (the memory is mapped), else the
 * posting uploads them from there with one copy call, no copy on the host.
 *
 * Cancel tells the truth: no unit is enqueued after a cancel; once the units
 * already enqueued are complete the transfer ends CANCELED, or DONE (with its
 * notification) when every unit had been enqueued before the cancel.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda.h"

static void kvli_cuda_deadline(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000u);
    ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Streams and the kernel of one device, made on first use. */
/*
 * The host words small launches write their end to (kvl_signal_end in
 * kernels.cu), and their CTA counters, zeroed (context pushed, under
 * iface->lock). Failing, the slots use their events alone: same results,
 * ~2 us later.
 */
static void kvli_cuda_flags_make(kvli_cuda_iface_t *iface, kvli_cuda_devres_t *r, int dev)
{
    const kvli_cuda_drv_t *d = iface->drv;
    const size_t bytes = KVLI_CUDA_FLAGS * sizeof(uint32_t);
    void *h = NULL;
    CUresult cr = d->cuMemHostGetDevicePointer == NULL ? -1
                  : d->cuMemHostAlloc(&h, bytes, KVLI_CU_HOSTREG_PORTABLE |
                                                     KVLI_CU_HOSTREG_DEVICEMAP);
    char eb[160];

    if (cr == KVLI_CUDA_SUCCESS) {
        memset(h, 0, bytes);
        cr = d->cuMemHostGetDevicePointer(&r->flags_dev, h, 0);
    }
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuMemAlloc(&r->ctrs, bytes);
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuMemcpyHtoDAsync(r->ctrs, h, bytes, r->streams[0]);
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuStreamSynchronize(r->streams[0]);
    if (cr == KVLI_CUDA_SUCCESS) {
        r->flags = h;
        return;
    }
    iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "no host words for the ends of small launches on "
                    "device %d (%.150s); their events tell", dev,
                    d->cuMemHostGetDevicePointer == NULL ? "the driver has no "
                    "cuMemHostGetDevicePointer" : kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
    if (r->ctrs != 0)
        d->cuMemFree(r->ctrs);
    if (h != NULL)
        d->cuMemFreeHost(h);
    r->ctrs = r->flags_dev = 0;
}

static kvli_cuda_devres_t *kvli_cuda_devres_get(kvli_cuda_iface_t *iface, int dev,
                                                kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_devres_t *r = &iface->dres[dev];
    char eb[160];
    CUresult cr;

    pthread_mutex_lock(&iface->lock);
    if (r->ready != 0)
        goto out;
    cr = kvli_cuda_drv_push(dev);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(r->text, sizeof(r->text), "cuDevicePrimaryCtxRetain/cuCtxPushCurrent(device %d) "
                 "= %.150s", dev, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        r->ready = -1;
        goto out;
    }
    for (int i = 0; i < KVLI_CUDA_STREAMS && cr == KVLI_CUDA_SUCCESS; i++)
        cr = d->cuStreamCreate(&r->streams[i], KVLI_CU_STREAM_NON_BLOCKING);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(r->text, sizeof(r->text), "cuStreamCreate(device %d) = %.150s", dev,
                 kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        r->ready = -1;
        kvli_cuda_drv_pop();
        goto out;
    }
    if (kvli_cuda_drv_have_kernel() && !iface->kernel_off) {
        cr = d->cuModuleLoadData(&r->mod, kvli_cuda_drv_kernel_image());
        if (cr == KVLI_CUDA_SUCCESS)
            cr = d->cuModuleGetFunction(&r->fn, r->mod, "kvl_gather");
        if (cr == KVLI_CUDA_SUCCESS &&
            d->cuModuleGetFunction(&r->fn_idx, r->mod, "kvl_gather_idx") != KVLI_CUDA_SUCCESS)
            r->fn_idx = NULL;
        if (cr == KVLI_CUDA_SUCCESS &&
            d->cuModuleGetFunction(&r->fn_idx_warp, r->mod, "kvl_gather_idx_warp") !=
                KVLI_CUDA_SUCCESS)
            r->fn_idx_warp = NULL;
        if (cr == KVLI_CUDA_SUCCESS &&
            d->cuModuleGetFunction(&r->fn_inline, r->mod, "kvl_gather_inline") !=
                KVLI_CUDA_SUCCESS)
            r->fn_inline = NULL;
        if (cr == KVLI_CUDA_SUCCESS &&
            d->cuModuleGetFunction(&r->fn_idx_inline, r->mod, "kvl_gather_idx_inline") !=
                KVLI_CUDA_SUCCESS)
            r->fn_idx_inline = NULL;
        if (cr != KVLI_CUDA_SUCCESS) {
            r->fn = NULL;
            iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                            "loading the gather kernel on device %d failed: %s; many small "
                            "blocks move with batched copies instead (slower)", dev,
                            kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        }
    }
    if (r->fn_inline != NULL || r->fn_idx_inline != NULL)
        kvli_cuda_flags_make(iface, r, dev);
    kvli_cuda_drv_pop();
    r->ready = 1;
out:
    pthread_mutex_unlock(&iface->lock);
    if (r->ready < 0) {
        kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, dev, "%s", r->text);
        kvl_bk_error_hint(err, "the GPU is unusable in this process (a previous error may have "
                          "left its context broken); check nvidia-smi and the log");
        return NULL;
    }
    return r;
}

static kvli_cuda_slot_t *kvli_cuda_slot_get(kvli_cuda_iface_t *iface, int dev, int kernel,
                                            int batch, char *text, size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_devres_t *r = &iface->dres[dev];
    kvli_cuda_slot_t *s;
    CUresult cr = KVLI_CUDA_SUCCESS;
    char eb[160];

    pthread_mutex_lock(&iface->lock);
    s = r->free_slots;
    if (s != NULL)
        r->free_slots = s->next;
    pthread_mutex_unlock(&iface->lock);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL) {
            snprintf(text, cap, "out of memory");
            return NULL;
        }
        s->cap = KVLI_CUDA_UNIT_BLOCKS;
        cr = d->cuEventCreate(&s->ev, KVLI_CU_EVENT_DISABLE_TIMING);
        if (cr != KVLI_CUDA_SUCCESS) {
            free(s);
            snprintf(text, cap, "cuEventCreate = %.150s", kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
            return NULL;
        }
        /* The host word only once the slot exists: words are never given
         * back, so one taken for a slot that failed would be lost for good. */
        pthread_mutex_lock(&iface->lock);
        if (r->flags != NULL && r->nflags < KVLI_CUDA_FLAGS) {
            s->flag = r->flags + r->nflags;
            s->flag_dev = r->flags_dev + r->nflags * sizeof(uint32_t);
            s->ctr = r->ctrs + r->nflags * sizeof(uint32_t);
            r->nflags++;
        }
        pthread_mutex_unlock(&iface->lock);
    }
    /* Each pair of tables whole or not at all: a slot goes back to the free
     * list with both or neither (a half would be taken for whole next). */
    if (kernel && s->host == NULL) {
        void *h = NULL;
        CUdeviceptr dv = 0;
        cr = d->cuMemHostAlloc(&h, s->cap * sizeof(kvli_cuda_blk_t), KVLI_CU_HOSTREG_PORTABLE);
        if (cr == KVLI_CUDA_SUCCESS)
            cr = d->cuMemAlloc(&dv, s->cap * sizeof(kvli_cuda_blk_t));
        if (cr == KVLI_CUDA_SUCCESS) {
            s->host = h;
            s->dev = dv;
        } else if (h != NULL) {
            d->cuMemFreeHost(h);
        }
    }
    if (batch && cr == KVLI_CUDA_SUCCESS && s->bsrc == NULL) {
        CUdeviceptr *bs = malloc(s->cap * sizeof(*s->bsrc));
        CUdeviceptr *bd = malloc(s->cap * sizeof(*s->bdst));
        size_t *bz = malloc(s->cap * sizeof(*s->bsize));
        if (bs == NULL || bd == NULL || bz == NULL) {
            free(bs);
            free(bd);
            free(bz);
            snprintf(text, cap, "out of memory for copy lists");
            cr = -1;
        } else {
            s->bsrc = bs;
            s->bdst = bd;
            s->bsize = bz;
        }
    }
    if (cr != KVLI_CUDA_SUCCESS) {
        if (text[0] == '\0')
            snprintf(text, cap, "allocating a %zu-entry descriptor table = %.150s", s->cap,
                     kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        pthread_mutex_lock(&iface->lock);
        s->next = r->free_slots;
        r->free_slots = s;
        pthread_mutex_unlock(&iface->lock);
        return NULL;
    }
    return s;
}

/* A table of at least bytes from the device's free list, else a new one
 * (context pushed). NULL with text. */
static kvli_cuda_tab_t *kvli_cuda_tab_get(kvli_cuda_iface_t *iface, int dev, size_t bytes,
                                          char *text, size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_devres_t *r = &iface->dres[dev];
    kvli_cuda_tab_t *t, **pp, **best = NULL;
    void *h = NULL;
    CUresult cr;
    char eb[160];

    pthread_mutex_lock(&iface->lock);
    for (pp = &r->free_tabs; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->cap >= bytes && (best == NULL || (*pp)->cap < (*best)->cap))
            best = pp;
    if (best != NULL) {
        t = *best;
        *best = t->next;
        r->n_free_tabs--;
        pthread_mutex_unlock(&iface->lock);
        return t;
    }
    pthread_mutex_unlock(&iface->lock);
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(text, cap, "out of memory");
        return NULL;
    }
    t->ordinal = dev;
    t->cap = 64u << 10;
    while (t->cap < bytes)
        t->cap <<= 1;
    /* Mapped as well when the driver can say where: the warp kernel then
     * reads large index arrays in place (kvli_cuda_unit_launch). */
    cr = d->cuMemHostGetDevicePointer == NULL ? -1
         : d->cuMemHostAlloc(&h, t->cap, KVLI_CU_HOSTREG_PORTABLE | KVLI_CU_HOSTREG_DEVICEMAP);
    if (cr == KVLI_CUDA_SUCCESS && d->cuMemHostGetDevicePointer(&t->hmap, h, 0) != KVLI_CUDA_SUCCESS)
        t->hmap = 0;
    if (cr != KVLI_CUDA_SUCCESS)
        cr = d->cuMemHostAlloc(&h, t->cap, KVLI_CU_HOSTREG_PORTABLE);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(text, cap, "cuMemHostAlloc(%zu) for the descriptor table = %.150s", t->cap,
                 kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        free(t);
        return NULL;
    }
    t->host = h;
    cr = d->cuMemAlloc(&t->dev, t->cap);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(text, cap, "allocating the %zu-byte descriptor table on device %d = %.150s",
                 t->cap, dev, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        d->cuMemFreeHost(t->host);
        free(t);
        return NULL;
    }
    return t;
}

static void kvli_cuda_tab_destroy(const kvli_cuda_drv_t *d, kvli_cuda_tab_t *t)
{
    d->cuMemFreeHost(t->host);
    d->cuMemFree(t->dev);
    free(t);
}

/* Give a table back; nothing may still read it. Beyond KVLI_CUDA_TABS_KEPT
 * free tables the smallest goes. */
static void kvli_cuda_tab_put(kvli_cuda_iface_t *iface, int dev, kvli_cuda_tab_t *t)
{
    kvli_cuda_devres_t *r = &iface->dres[dev];
    kvli_cuda_tab_t *drop = NULL, **pp, **small;

    pthread_mutex_lock(&iface->lock);
    t->next = r->free_tabs;
    r->free_tabs = t;
    if (++r->n_free_tabs > KVLI_CUDA_TABS_KEPT) {
        small = &r->free_tabs;
        for (pp = &r->free_tabs; *pp != NULL; pp = &(*pp)->next)
            if ((*pp)->cap < (*small)->cap)
                small = pp;
        drop = *small;
        *small = drop->next;
        r->n_free_tabs--;
    }
    pthread_mutex_unlock(&iface->lock);
    if (drop != NULL && kvli_cuda_drv_push(dev) == KVLI_CUDA_SUCCESS) {
        kvli_cuda_tab_destroy(iface->drv, drop);
        kvli_cuda_drv_pop();
    }
}

/* Have a free table of at least bytes on dev, made now if none is (context
 * pushed): a list's first request then finds its index memory ready. */
static void kvli_cuda_tab_warm(kvli_cuda_iface_t *iface, int dev, size_t bytes)
{
    kvli_cuda_devres_t *r = &iface->dres[dev];
    char text[256] = "";
    int have = 0;
    pthread_mutex_lock(&iface->lock);
    for (kvli_cuda_tab_t *t = r->free_tabs; t != NULL && !have; t = t->next)
        have = t->cap >= bytes;
    pthread_mutex_unlock(&iface->lock);
    if (have)
        return;
    kvli_cuda_tab_t *t = kvli_cuda_tab_get(iface, dev, bytes, text, sizeof(text));
    if (t == NULL) {
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "no index table warmed for a prepared list "
                        "(%.200s); its first request makes one", text);
        return;
    }
    kvli_cuda_tab_put(iface, dev, t);
}

static void kvli_cuda_slot_put(kvli_cuda_iface_t *iface, int dev, kvli_cuda_slot_t *s)
{
    pthread_mutex_lock(&iface->lock);
    s->next = iface->dres[dev].free_slots;
    iface->dres[dev].free_slots = s;
    pthread_mutex_unlock(&iface->lock);
}

/*
 * Each gather kernel launched once with nothing to move, and the launches
 * waited for (context pushed): whatever the driver does at a function's
 * first launch is done at registration, not in the first transfer.
 */
static void kvli_cuda_kernels_warm(kvli_cuda_iface_t *iface, kvli_cuda_devres_t *r)
{
    const kvli_cuda_drv_t *d = iface->drv;
    static kvli_cuda_inline_tab_t none_tab;   /* n = 0 */
    static kvli_cuda_inline_idx_t none_idx;
    CUdeviceptr z = 0;
    unsigned long long n0 = 0, len0 = 0;
    void *args[2] = {&z, &n0};
    void *iargs[6] = {&z, &z, &z, &z, &n0, &len0};
    unsigned seq0 = 0;
    void *targs[4] = {&none_tab, &z, &z, &seq0};
    void *pargs[8] = {&z, &z, &n0, &len0, &none_idx, &z, &z, &seq0};
    CUstream st = r->streams[0];
    CUresult cr = KVLI_CUDA_SUCCESS;
    char eb[160];

    if (r->fn != NULL)
        cr = d->cuLaunchKernel(r->fn, 1, 1, 1, 256, 1, 1, 0, st, args, NULL);
    if (cr == KVLI_CUDA_SUCCESS && r->fn_idx != NULL)
        cr = d->cuLaunchKernel(r->fn_idx, 1, 1, 1, KVLI_CUDA_IDX_THREADS, 1, 1, 0, st, iargs,
                               NULL);
    if (cr == KVLI_CUDA_SUCCESS && r->fn_idx_warp != NULL)
        cr = d->cuLaunchKernel(r->fn_idx_warp, 1, 1, 1, KVLI_CUDA_WARP_THREADS, 1, 1, 0, st,
                               iargs, NULL);
    if (cr == KVLI_CUDA_SUCCESS && r->fn_inline != NULL)
        cr = d->cuLaunchKernel(r->fn_inline, 1, 1, 1, 256, 1, 1, 0, st, targs, NULL);
    if (cr == KVLI_CUDA_SUCCESS && r->fn_idx_inline != NULL)
        cr = d->cuLaunchKernel(r->fn_idx_inline, 1, 1, 1, KVLI_CUDA_IDX_THREADS, 1, 1, 0, st,
                               pargs, NULL);
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuStreamSynchronize(st);
    if (cr != KVLI_CUDA_SUCCESS)
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "warming the gather kernels up = %.150s; the "
                        "first transfer launches them cold",
                        kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
}

/*
 * At VRAM registration: make the device's streams and kernels, one free
 * descriptor table and a window's worth of unit slots (events) now, and
 * launch each kernel once, so that the first transfer on it pays for none
 * of them. Failures are left for the first transfer to report.
 */
void kvli_cuda_xfer_warm(kvli_cuda_iface_t *iface, int dev)
{
    kvl_error_t e;
    char text[256];
    kvli_cuda_tab_t *t;
    kvli_cuda_slot_t *slots[KVLI_CUDA_WINDOW];
    kvli_cuda_devres_t *r;

    if (dev < 0 || dev >= iface->drv->ndev || (r = kvli_cuda_devres_get(iface, dev, &e)) == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    int have = r->free_tabs != NULL || r->fn == NULL;
    /* The kernels once per device: their launch waits for stream 0, which a
     * later registration must not do behind a transfer in flight. */
    int launch = !have && !r->kernels_warm;
    if (launch)
        r->kernels_warm = 1;
    pthread_mutex_unlock(&iface->lock);
    if (have || kvli_cuda_drv_push(dev) != KVLI_CUDA_SUCCESS)
        return;
    t = kvli_cuda_tab_get(iface, dev, KVLI_CUDA_TAB_WARM, text, sizeof(text));
    for (unsigned i = 0; i < KVLI_CUDA_WINDOW; i++)
        slots[i] = kvli_cuda_slot_get(iface, dev, 0, 0, text, sizeof(text));
    for (unsigned i = 0; i < KVLI_CUDA_WINDOW; i++)
        if (slots[i] != NULL)
            kvli_cuda_slot_put(iface, dev, slots[i]);
    if (launch)
        kvli_cuda_kernels_warm(iface, r);
    kvli_cuda_drv_pop();
    if (t != NULL)
        kvli_cuda_tab_put(iface, dev, t);
}

void kvli_cuda_xfer_devres_fini(kvli_cuda_iface_t *iface)
{
    const kvli_cuda_drv_t *d = iface->drv;
    if (d == NULL)
        return;
    for (int dev = 0; dev < d->ndev; dev++) {
        kvli_cuda_devres_t *r = &iface->dres[dev];
        kvli_cuda_slot_t *s, *n;
        if (r->ready != 1 || kvli_cuda_drv_push(dev) != KVLI_CUDA_SUCCESS)
            continue;
        for (int i = 0; i < KVLI_CUDA_STREAMS; i++)
            if (r->streams[i] != NULL) {
                d->cuStreamSynchronize(r->streams[i]);
                d->cuStreamDestroy(r->streams[i]);
            }
        for (s = r->free_slots; s != NULL; s = n) {
            n = s->next;
            d->cuEventDestroy(s->ev);
            if (s->host != NULL)
                d->cuMemFreeHost(s->host);
            if (s->dev != 0)
                d->cuMemFree(s->dev);
            free(s->bsrc);
            free(s->bdst);
            free(s->bsize);
            free(s);
        }
        while (r->free_tabs != NULL) {
            kvli_cuda_tab_t *t = r->free_tabs;
            r->free_tabs = t->next;
            kvli_cuda_tab_destroy(d, t);
        }
        if (r->mod != NULL)
            d->cuModuleUnload(r->mod);
        if (r->flags != NULL) {
            d->cuMemFreeHost(r->flags);
            d->cuMemFree(r->ctrs);
        }
        kvli_cuda_drv_pop();
        memset(r, 0, sizeof(*r));
    }
}

/* Where a remote address is mapped in this process. */
static uint64_t kvli_cuda_rptr(const kvl_bk_xfer_t *x, const kvl_seg_t *s, uint64_t raddr)
{
    const kvli_cuda_rh_t *rh = x->rmh[s->rreg];
    return (uint64_t)(uintptr_t)rh->local + (raddr - rh->addr);
}

#define KVLI_CUDA_GRID_MAX (1u << 30)

/* Is there a unit of xp left to enqueue? */
static int kvli_cuda_xp_more(const kvli_cuda_xpriv_t *xp)
{
    return xp->xc != NULL ? xp->unit < xp->xc->nunits
                          : !kvli_chunk_done(&xp->cur, xp->x->segs, xp->x->nsegs);
}

/* Record the unit's event after a failed enqueue (whatever was enqueued
 * completes before it) and keep the unit, so completion waits for it. */
static int kvli_cuda_unit_failed(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp,
                                 kvli_cuda_slot_t *s)
{
    const kvli_cuda_drv_t *d = iface->drv;
    if (d->cuEventRecord(s->ev, xp->stream) != KVLI_CUDA_SUCCESS) {
        d->cuStreamSynchronize(xp->stream);
        kvli_cuda_slot_put(iface, xp->dev, s);
        return -1;
    }
    xp->units[(xp->u_head + xp->u_count) % KVLI_CUDA_WINDOW] = (kvli_cuda_unit_t){s, xp->dev, 0};
    xp->u_count++;
    return -1;
}

/* Whether nb pairs of len bytes of an indexed transfer go a warp each
 * (kvl_gather_idx_warp: many small pairs). That kernel reads the indices in
 * place from the pinned host memory they were written to when it is mapped
 * for the GPU: nothing to upload. On an H200 the kernel takes the same time
 * for 65536 pairs and ~2 us more for 4096, about the upload it saves (each
 * warp's first read over PCIe hides behind the other warps' copies; the
 * block-per-pair kernel does not hide it in small grids, and keeps the
 * upload: docs/performance.md, session 13). */
static int kvli_cuda_idx_warp(const kvli_cuda_devres_t *dr, const kvli_cuda_xcache_t *xc,
                              unsigned long long nb, unsigned long long len)
{
    return xc->indexed && dr->fn_idx_warp != NULL && len <= KVLI_CUDA_WARP_MAX_LEN &&
           nb >= KVLI_CUDA_WARP_MIN_PAIRS;
}

/* Whether those pairs' indices are read in place (the warp kernel, and the
 * transfer's index table mapped for the GPU). */
static int kvli_cuda_idx_in_place(const kvli_cuda_devres_t *dr, const kvli_cuda_xcache_t *xc,
                                  unsigned long long nb, unsigned long long len)
{
    return xc->tab != NULL && xc->tab->hmap != 0 && kvli_cuda_idx_warp(dr, xc, nb, len);
}

/* Next unit of a transfer whose table is on the GPU: one launch over its
 * slice of the table, then its event (context pushed). 0, or -1 with text. */
static int kvli_cuda_unit_launch(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp, char *text,
                                 size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_xcache_t *xc = xp->xc;
    uint32_t u = xp->unit;
    uint64_t first = u > 0 ? xc->unit_end[u - 1] : 0;
    unsigned long long nb = xc->unit_end[u] - first;
    CUdeviceptr tdev = xc->tab != NULL ? xc->tab->dev : 0; /* none: inline */
    CUdeviceptr tab = tdev + first * sizeof(kvli_cuda_blk_t);
    unsigned long long len = xp->x->ltab != NULL ? xp->x->ltab->len : 0;
    const kvli_cuda_devres_t *dr = &iface->dres[xp->dev];
    int warp = kvli_cuda_idx_warp(dr, xc, nb, len);
    int in_place = kvli_cuda_idx_in_place(dr, xc, nb, len);
    /* Indexed: the tab holds the source indices, then the destination ones,
     * read by the kernel on the GPU, or in place in its host memory. */
    CUdeviceptr ibase = in_place ? xc->tab->hmap : tdev;
    CUdeviceptr lidx = ibase + first * sizeof(uint32_t);
    CUdeviceptr ridx = ibase + (xc->npieces + first) * sizeof(uint32_t);
    CUdeviceptr sidx = xp->x->op == KVL_WRITE ? lidx : ridx;
    CUdeviceptr didx = xp->x->op == KVL_WRITE ? ridx : lidx;
    void *args[2] = {&tab, &nb};
    void *iargs[6] = {(void *)&xc->stab, (void *)&xc->dtab, &sidx, &didx, &nb, &len};
    unsigned grid = nb < KVLI_CUDA_GRID_MAX ? (unsigned)nb : KVLI_CUDA_GRID_MAX;
    kvli_cuda_slot_t *s;
    CUresult cr;
    char eb[160];

    s = kvli_cuda_slot_get(iface, xp->dev, 0, 0, text, cap);
    if (s == NULL)
        return -1;
    uint32_t seq = 0;
    if (xc->inl != NULL || xc->idx_inline) {
        /* A small request: its table is the launch's parameter (copied by
         * the driver at the call), nothing to upload first; its end is
         * written to the slot's host word when it has one. */
        CUdeviceptr ctr = 0, flag = 0;
        if (s->flag != NULL) {
            seq = ++s->seq != 0 ? s->seq : ++s->seq;
            ctr = s->ctr;
            flag = s->flag_dev;
        }
        if (xc->inl != NULL) {
            void *targs[4] = {xc->inl, &ctr, &flag, &seq};
            cr = d->cuLaunchKernel(dr->fn_inline, grid, 1, 1, 256, 1, 1, 0, xp->stream, targs,
                                   NULL);
        } else {
            kvli_cuda_inline_idx_t p;
            const uint32_t *si = xp->x->op == KVL_WRITE ? xp->x->lidx : xp->x->ridx;
            const uint32_t *di = xp->x->op == KVL_WRITE ? xp->x->ridx : xp->x->lidx;
            void *pargs[8] = {(void *)&xc->stab, (void *)&xc->dtab, &nb, &len, &p, &ctr, &flag,
                              &seq};
            memcpy(p.s, si + first, (size_t)nb * sizeof(uint32_t));
            memcpy(p.d, di + first, (size_t)nb * sizeof(uint32_t));
            cr = d->cuLaunchKernel(dr->fn_idx_inline, grid, 1, 1, KVLI_CUDA_IDX_THREADS, 1, 1, 0,
                                   xp->stream, pargs, NULL);
        }
        goto launched;
    }
    if (xc->indexed && u >= xc->up_units) {
        /* This unit's indices (local, then remote: ridx follows lidx). Lent
         * memory already holds them where the upload (or the kernel) reads:
         * the core wrote them there at creation; a unit of every pair is one
         * upload. */
        uint32_t *h = (uint32_t *)(void *)xc->tab->host;
        size_t bytes = (size_t)nb * sizeof(uint32_t);
        if (!xc->tab_lent) {
            memcpy(h + first, xp->x->lidx + first, bytes);
            memcpy(h + xc->npieces + first, xp->x->ridx + first, bytes);
        }
        if (in_place)
            cr = KVLI_CUDA_SUCCESS;
        else if (xc->tab_lent && first == 0 && nb == xc->npieces) {
            cr = d->cuMemcpyHtoDAsync(lidx, h, 2 * bytes, xp->stream);
        } else {
            cr = d->cuMemcpyHtoDAsync(lidx, h + first, bytes, xp->stream);
            if (cr == KVLI_CUDA_SUCCESS)
                cr = d->cuMemcpyHtoDAsync(ridx, h + xc->npieces + first, bytes, xp->stream);
        }
        if (cr != KVLI_CUDA_SUCCESS) {
            snprintf(text, cap, "uploading the indices of unit %u of %u (%llu pairs) on device "
                     "%d = %.150s", u + 1, xc->nunits, nb, xp->dev,
                     kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
            return kvli_cuda_unit_failed(iface, xp, s);
        }
        xc->up_units = u + 1;
    }
    if (warp) {
        unsigned long long per = KVLI_CUDA_WARP_THREADS / 32u, wg = (nb + per - 1) / per;
        cr = d->cuLaunchKernel(dr->fn_idx_warp, wg < KVLI_CUDA_GRID_MAX ? (unsigned)wg
                                                                         : KVLI_CUDA_GRID_MAX,
                               1, 1, KVLI_CUDA_WARP_THREADS, 1, 1, 0, xp->stream, iargs, NULL);
    } else if (xc->indexed)
        cr = d->cuLaunchKernel(dr->fn_idx, grid, 1, 1, KVLI_CUDA_IDX_THREADS, 1,
                               1, 0, xp->stream, iargs, NULL);
    else
        cr = d->cuLaunchKernel(iface->dres[xp->dev].fn, grid, 1, 1, 256, 1, 1, 0, xp->stream,
                               args, NULL);
launched:
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuEventRecord(s->ev, xp->stream);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(text, cap, "launching the gather kernel (unit %u of %u, %llu blocks) on device "
                 "%d = %.150s", u + 1, xc->nunits, nb, xp->dev,
                 kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        return kvli_cuda_unit_failed(iface, xp, s);
    }
    xp->units[(xp->u_head + xp->u_count) % KVLI_CUDA_WINDOW] = (kvli_cuda_unit_t){s, xp->dev, seq};
    xp->u_count++;
    xp->unit++;
    xp->enq_bytes += xc->unit_bytes[u];
    return 0;
}

/* Free a transfer's cached table (back to the device's free list). Nothing
 * that reads it may be pending. */
static void kvli_cuda_xc_free(kvli_cuda_iface_t *iface, kvli_cuda_xcache_t *xc)
{
    if (xc->tab != NULL && !xc->tab_lent)
        kvli_cuda_tab_put(iface, xc->dev, xc->tab);
    free(xc->inl);
    free(xc->unit_end);
    free(xc->unit_bytes);
    free(xc);
}

/*
 * First posting of a many-block GPU transfer (context pushed): build the
 * whole descriptor table once, remote addresses translated to their local
 * mappings, cut into units of at most KVLI_CUDA_UNIT_BYTES, and enqueue its
 * upload on the posting's stream ahead of the first launch. 0, or -1 with
 * text (nothing enqueued that reads the table).
 */
static int kvli_cuda_xc_build(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp,
                              kvli_cuda_xcache_t *xc, char *text, size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    const kvl_bk_xfer_t *x = xp->x;
    uint64_t np = 0, bytes = 0, total = 0, ucap = 4;
    size_t tb;
    kvli_cuda_blk_t *h;
    CUresult cr;
    char eb[160];

    for (size_t i = 0; i < x->nsegs; i++) {
        const kvl_seg_t *g = &x->segs[i];
        np += g->count * ((g->len + KVLI_CUDA_PIECE - 1) / KVLI_CUDA_PIECE);
        total += g->count * g->len;
    }
    if (np == 0) {
        snprintf(text, cap, "no bytes to move");
        return -1;
    }
    tb = (size_t)np * sizeof(kvli_cuda_blk_t);
    xc->unit_end = malloc(ucap * sizeof(*xc->unit_end));
    xc->unit_bytes = malloc(ucap * sizeof(*xc->unit_bytes));
    if (xc->unit_end == NULL || xc->unit_bytes == NULL) {
        snprintf(text, cap, "out of memory for the unit list");
        return -1;
    }
    if (np <= KVLI_CUDA_INLINE_BLOCKS && total <= KVLI_CUDA_UNIT_BYTES &&
        iface->dres[xp->dev].fn_inline != NULL &&
        (xc->inl = malloc(sizeof(*xc->inl))) != NULL) {
        /* Few blocks, one unit: the table travels in the launch. */
        xc->inl->n = np;
        h = xc->inl->b;
    } else {
        xc->tab = kvli_cuda_tab_get(iface, xp->dev, tb, text, cap);
        if (xc->tab == NULL)
            return -1;
        h = xc->tab->host;
    }
    xc->npieces = np;
    np = 0;
    for (size_t i = 0; i < x->nsegs; i++) {
        const kvl_seg_t *g = &x->segs[i];
        const kvli_cuda_rh_t *rh = x->rmh[g->rreg];
        uint64_t rbase = (uint64_t)(uintptr_t)rh->local - rh->addr;
        for (uint64_t b = 0; b < g->count; b++) {
            uint64_t la = g->laddr + b * g->lstride, ra = rbase + g->raddr + b * g->rstride;
            for (uint64_t off = 0; off < g->len; off += KVLI_CUDA_PIECE) {
                uint64_t take = g->len - off < KVLI_CUDA_PIECE ? g->len - off : KVLI_CUDA_PIECE;
                if (bytes > 0 && bytes + take > KVLI_CUDA_UNIT_BYTES) {
                    if (xc->nunits + 1 >= ucap) {
                        uint64_t *ne = realloc(xc->unit_end, 2 * ucap * sizeof(*ne));
                        if (ne != NULL)
                            xc->unit_end = ne;
                        uint64_t *nbt = realloc(xc->unit_bytes, 2 * ucap * sizeof(*nbt));
                        if (nbt != NULL)
                            xc->unit_bytes = nbt;
                        if (ne == NULL || nbt == NULL) {
                            snprintf(text, cap, "out of memory for the unit list");
                            return -1;
                        }
                        ucap *= 2;
                    }
                    xc->unit_end[xc->nunits] = np;
                    xc->unit_bytes[xc->nunits++] = bytes;
                    bytes = 0;
                }
                h[np].src = x->op == KVL_WRITE ? la + off : ra + off;
                h[np].dst = x->op == KVL_WRITE ? ra + off : la + off;
                h[np++].len = take;
                bytes += take;
            }
        }
    }
    xc->unit_end[xc->nunits] = np;
    xc->unit_bytes[xc->nunits++] = bytes;
    if (xc->inl != NULL) {
        xc->ready = 1;
        return 0;
    }
    cr = d->cuMemcpyHtoDAsync(xc->tab->dev, h, tb, xp->stream);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(text, cap, "uploading the descriptor table on device %d = %.150s", xp->dev,
                 kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        return -1;
    }
    xc->ready = 1;
    xp->staged = 1;
    return 0;
}

/*
 * A prepared list's address table on device dev (context pushed): the
 * entries' addresses, remote ones translated to their mappings here
 * (handles[t->regs[i]]: local mh or remote rh), uploaded on stream and
 * finished before it returns, so transfers on any stream may use it at once.
 * Once per list: pageable memory and a synchronous upload (pinning staging
 * memory would cost more than the copy). NULL with text.
 */
static kvli_cuda_ptab_t *kvli_cuda_ptab_make(kvli_cuda_iface_t *iface, int dev, CUstream stream,
                                             const kvl_bk_ptab_t *t, void *const *handles,
                                             int remote, char *text, size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_ptab_t *pt;
    CUresult cr;
    char eb[160];

    pt = calloc(1, sizeof(*pt));
    uint64_t *h = malloc(t->n * sizeof(uint64_t));
    if (pt == NULL || h == NULL) {
        free(pt);
        free(h);
        snprintf(text, cap, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (remote) {
            const kvli_cuda_rh_t *rh = handles[t->regs[i]];
            h[i] = (uint64_t)(uintptr_t)rh->local + (t->addrs[i] - rh->addr);
        } else {
            h[i] = t->addrs[i];
        }
    }
    pt->dev = dev;
    pt->n = t->n;
    cr = d->cuMemAlloc(&pt->addrs, t->n * sizeof(uint64_t));
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuMemcpyHtoDAsync(pt->addrs, h, t->n * sizeof(uint64_t), stream);
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuStreamSynchronize(stream);
    free(h);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(text, cap, "uploading the %zu-entry address table of a prepared list on device "
                 "%d = %.150s", t->n, dev, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        if (pt->addrs != 0)
            d->cuMemFree(pt->addrs);
        free(pt);
        return NULL;
    }
    return pt;
}

/*
 * A prepared list's address table for xp's device: the one ptab_prepare
 * made when the list was prepared, else made now (at the list's first
 * indexed transfer) and kept in its slot (context pushed). NULL with text,
 * or NULL with no text: the table lives on another device.
 */
static kvli_cuda_ptab_t *kvli_cuda_ptab_get(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp,
                                            const kvl_bk_ptab_t *t, void **slot, int remote,
                                            char *text, size_t cap)
{
    const kvl_bk_xfer_t *x = xp->x;
    kvli_cuda_ptab_t *pt;

    pthread_mutex_lock(&iface->lock);
    pt = *slot;
    pthread_mutex_unlock(&iface->lock);
    if (pt != NULL)
        return pt->dev == xp->dev ? pt : NULL;
    /* For an indexed transfer lmh / rmh are the lists' regions in order. */
    pt = kvli_cuda_ptab_make(iface, xp->dev, xp->stream, t, remote ? x->rmh : x->lmh, remote,
                             text, cap);
    if (pt == NULL)
        return NULL;
    pthread_mutex_lock(&iface->lock);
    if (*slot == NULL) {
        *slot = pt;
        pt = NULL;
    }
    kvli_cuda_ptab_t *won = *slot;
    pthread_mutex_unlock(&iface->lock);
    if (pt != NULL) { /* another thread published one first */
        iface->drv->cuMemFree(pt->addrs);
        free(pt);
    }
    return won->dev == xp->dev ? won : NULL;
}

/*
 * ptab_prepare: a list of equal blocks was prepared. When its regions are
 * all GPU memory on one device (reachable here, for a remote list) and the
 * indexed kernel runs there, its address table goes to that GPU now, as the
 * staging pools are warmed at registration: the first transfer after
 * registration then uploads only its indices. Otherwise, or on a failure
 * (logged), the first transfer makes it as before.
 */
void kvli_cuda_ptab_prepare(void *bk, const kvl_bk_ptab_t *t, void *const *mh, int remote,
                            void **cache_p)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_devres_t *dr;
    kvli_cuda_ptab_t *pt;
    kvl_error_t e;
    char text[300] = "";
    int dev = -1;

    if (t->n == 0 || t->len == 0 || t->len > KVLI_CUDA_PIECE || iface->kernel_off)
        return;
    for (size_t i = 0; i < t->nregs; i++) {
        int rdev;
        if (remote) {
            const kvli_cuda_rh_t *rh = mh[i];
            if (rh->kind == KVLI_CUDA_MEM_HOST || rh->local == NULL)
                return;
            rdev = rh->dev;
        } else {
            const kvli_cuda_mh_t *lh = mh[i];
            if (lh->kind == KVLI_CUDA_MEM_HOST)
                return;
            rdev = lh->dev;
        }
        if (rdev < 0 || (dev >= 0 && rdev != dev))
            return;
        dev = rdev;
    }
    if (dev < 0 || dev >= iface->drv->ndev || (dr = kvli_cuda_devres_get(iface, dev, &e)) == NULL ||
        dr->fn_idx == NULL)
        return;
    if (kvli_cuda_drv_push(dev) != KVLI_CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&iface->lock);
    CUstream stream = dr->streams[dr->next_stream++ % KVLI_CUDA_STREAMS];
    pthread_mutex_unlock(&iface->lock);
    pt = kvli_cuda_ptab_make(iface, dev, stream, t, mh, remote, text, sizeof(text));
    /* And the pinned index memory a request over the whole list needs
     * (kvli_cuda_idx_alloc lends it), so that the first transfer after
     * preparation allocates nothing either. */
    if (pt != NULL && 2 * t->n * sizeof(uint32_t) > 2 * KVLI_CUDA_INLINE_PAIRS * sizeof(uint32_t))
        kvli_cuda_tab_warm(iface, dev, 2 * t->n * sizeof(uint32_t));
    kvli_cuda_drv_pop();
    if (pt == NULL) {
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "no address table for a prepared list of %zu "
                        "entries at preparation (%.250s); its first transfer makes it", t->n,
                        text);
        return;
    }
    *cache_p = pt;
}

/*
 * idx_alloc: an indexed transfer's index arrays in one of the device's
 * descriptor tables (pinned host memory with its device twin), so the core
 * writes the checked indices where the upload reads them: no copy at
 * posting. The device is the one of the transfer's first local GPU region
 * (the one its posting runs on); none (host memory only), or no indexed
 * kernel there: NULL, the core keeps them.
 */
void *kvli_cuda_idx_alloc(void *bk, void *const *lmh, size_t nlmh, size_t bytes, void **cookie_p)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_devres_t *dr;
    kvli_cuda_tab_t *t;
    kvl_error_t e;
    char text[256] = "";
    int dev = -1;

    for (size_t i = 0; i < nlmh && dev < 0; i++) {
        const kvli_cuda_mh_t *mh = lmh[i];
        if (mh != NULL && mh->kind != KVLI_CUDA_MEM_HOST)
            dev = mh->dev;
    }
    if (dev < 0 || dev >= iface->drv->ndev || iface->kernel_off ||
        (dr = kvli_cuda_devres_get(iface, dev, &e)) == NULL || dr->fn_idx == NULL)
        return NULL;
    if (bytes <= 2 * KVLI_CUDA_INLINE_PAIRS * sizeof(uint32_t) && dr->fn_idx_inline != NULL)
        return NULL; /* few pairs: the launch carries them, nothing is uploaded */
    if (kvli_cuda_drv_push(dev) != KVLI_CUDA_SUCCESS)
        return NULL;
    t = kvli_cuda_tab_get(iface, dev, bytes, text, sizeof(text));
    kvli_cuda_drv_pop();
    if (t == NULL) {
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "no pinned memory for the indices of a "
                        "transfer (%.200s): they are copied at its posting", text);
        return NULL;
    }
    *cookie_p = t;
    return t->host;
}

/* idx_free: the transfer is freed; nothing reads its indices any more
 * (xfer_release ran, every unit's event had completed). */
void kvli_cuda_idx_free(void *bk, void *ptr, void *cookie)
{
    kvli_cuda_tab_t *t = cookie;
    (void)ptr;
    kvli_cuda_tab_put(bk, t->ordinal, t);
}

void kvli_cuda_ptab_release(void *bk, void *cache)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_ptab_t *pt = cache;
    if (kvli_cuda_drv_push(pt->dev) == KVLI_CUDA_SUCCESS) {
        iface->drv->cuMemFree(pt->addrs);
        kvli_cuda_drv_pop();
    }
    free(pt);
}

/*
 * First posting of an indexed transfer (context pushed): the lists' address
 * tables (made when the lists were prepared, else now), units of at most
 * KVLI_CUDA_IDX_UNIT_BYTES, and where the index arrays (local, then remote)
 * come from: the launch itself for few pairs (KVLI_CUDA_INLINE_PAIRS), else
 * uploaded at each unit's first launch from the pinned memory the core wrote
 * them into (lent by kvli_cuda_idx_alloc), or copied into a table first when
 * the core used its own memory. 0; 1: not here (a list lives on another
 * device: expand); -1 with text.
 */
static int kvli_cuda_xc_build_indexed(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp,
                                      kvli_cuda_xcache_t *xc, char *text, size_t cap)
{
    const kvl_bk_xfer_t *x = xp->x;
    size_t n = x->nidx;
    uint64_t len = x->ltab->len, per = KVLI_CUDA_IDX_UNIT_BYTES / len;
    kvli_cuda_ptab_t *lt, *rt;

    lt = kvli_cuda_ptab_get(iface, xp, x->ltab, x->ltab_cache, 0, text, cap);
    if (lt == NULL)
        return text[0] ? -1 : 1;
    rt = kvli_cuda_ptab_get(iface, xp, x->rtab, x->rtab_cache, 1, text, cap);
    if (rt == NULL)
        return text[0] ? -1 : 1;
    xc->stab = x->op == KVL_WRITE ? lt->addrs : rt->addrs;
    xc->dtab = x->op == KVL_WRITE ? rt->addrs : lt->addrs;
    if (per == 0)
        per = 1;
    xc->nunits = 0;
    xc->unit_end = malloc(((n + per - 1) / per) * sizeof(*xc->unit_end));
    xc->unit_bytes = malloc(((n + per - 1) / per) * sizeof(*xc->unit_bytes));
    if (xc->unit_end == NULL || xc->unit_bytes == NULL) {
        snprintf(text, cap, "out of memory for the unit list");
        return -1;
    }
    for (size_t k = 0; k < n; k += per) {
        size_t e = n - k < per ? n : k + per;
        xc->unit_end[xc->nunits] = e;
        xc->unit_bytes[xc->nunits++] = (e - k) * len;
    }
    if (n <= KVLI_CUDA_INLINE_PAIRS && xc->nunits == 1 &&
        iface->dres[xp->dev].fn_idx_inline != NULL) {
        /* Few pairs: the indices travel in the launch, read from x->lidx /
         * x->ridx at each posting (kvli_cuda_unit_launch). */
        xc->npieces = n;
        xc->indexed = 1;
        xc->idx_inline = 1;
        xc->ready = 1;
        return 0;
    }
    /* The index memory the transfer was made with, when this backend lent
     * it for this device (kvli_cuda_idx_alloc): the upload reads it there. */
    kvli_cuda_tab_t *lent = x->idx_cookie;
    if (lent != NULL && lent->ordinal == xp->dev && (void *)lent->host == (void *)x->lidx &&
        lent->cap >= 2 * n * sizeof(uint32_t)) {
        xc->tab = lent;
        xc->tab_lent = 1;
    } else {
        xc->tab = kvli_cuda_tab_get(iface, xp->dev, 2 * n * sizeof(uint32_t), text, cap);
        if (xc->tab == NULL)
            return -1;
    }
    /* The indices go up unit by unit, each just before its launch
     * (kvli_cuda_unit_launch); a re-post uploads none. */
    xc->npieces = n;
    xc->up_units = 0;
    xc->indexed = 1;
    xc->ready = 1;
    xp->staged = 1;
    return 0;
}

/* Enqueue the next unit of xp on its stream (context pushed). 0, or -1 with text. */
static int kvli_cuda_unit_enqueue(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp, char *text,
                                  size_t cap)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvl_bk_xfer_t *x = xp->x;
    int kernel = xp->use_kernel;
    kvli_cuda_slot_t *s;
    /* One big block: a plain copy, no table. */
    int single = x->nsegs == 1 && x->segs[0].count == 1;
    uint64_t bytes = 0, piece_max = kernel && !single ? KVLI_CUDA_PIECE : KVLI_CUDA_UNIT_BYTES;
    size_t n = 0;
    CUresult cr = KVLI_CUDA_SUCCESS;
    char eb[160];
    kvli_piece_t pc;

    if (xp->xc != NULL)
        return kvli_cuda_unit_launch(iface, xp, text, cap);
    s = kvli_cuda_slot_get(iface, xp->dev, kernel && !single, !kernel && !single, text, cap);
    if (s == NULL)
        return -1;
    /* Tables of KVLI_CUDA_UNIT_BLOCKS: the host builds the next one while
     * the GPU runs the previous launch. */
    uint64_t unit_bytes = KVLI_CUDA_UNIT_BYTES;
    size_t unit_blocks = s->cap;
    while (n < unit_blocks && bytes < unit_bytes &&
           kvli_chunk_peek(&xp->cur, x->segs, x->nsegs,
                           single || piece_max < unit_bytes - bytes ? piece_max
                                                                    : unit_bytes - bytes, &pc)) {
        const kvl_seg_t *g = &x->segs[pc.seg];
        uint64_t la = pc.laddr, ra = kvli_cuda_rptr(x, g, pc.raddr), take = pc.len;
        uint64_t src = x->op == KVL_WRITE ? la : ra, dst = x->op == KVL_WRITE ? ra : la;
        if (single) {
            cr = d->cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)take, xp->stream);
            n = 1;
        } else if (kernel) {
            s->host[n].src = src;
            s->host[n].dst = dst;
            s->host[n++].len = take;
        } else {
            s->bsrc[n] = (CUdeviceptr)src;
            s->bdst[n] = (CUdeviceptr)dst;
            s->bsize[n++] = (size_t)take;
        }
        bytes += take;
        kvli_chunk_take(&xp->cur, x->segs, take);
        if (single || cr != KVLI_CUDA_SUCCESS)
            break;
    }
    if (!single && cr == KVLI_CUDA_SUCCESS) {
        if (kernel) {
            unsigned long long nb = n;
            unsigned grid = (unsigned)(n < (size_t)d->devs[xp->dev].sm_count * 16u
                                           ? n : (size_t)d->devs[xp->dev].sm_count * 16u);
            void *args[2] = {&s->dev, &nb};
            cr = d->cuMemcpyHtoDAsync(s->dev, s->host, n * sizeof(kvli_cuda_blk_t), xp->stream);
            if (cr == KVLI_CUDA_SUCCESS)
                cr = d->cuLaunchKernel(iface->dres[xp->dev].fn, grid, 1, 1, 256, 1, 1, 0,
                                       xp->stream, args, NULL);
        } else {
            CUmemcpyAttributes attr;
            size_t aidx = 0, fail = 0;
            memset(&attr, 0, sizeof(attr));
            attr.srcAccessOrder = KVLI_CU_SRC_ORDER_STREAM;
            cr = -1;
            if (n > 1 && d->cuMemcpyBatchAsync_v2 != NULL)
                cr = d->cuMemcpyBatchAsync_v2(s->bdst, s->bsrc, s->bsize, n, &attr, &aidx, 1,
                                              xp->stream);
            else if (n > 1 && d->cuMemcpyBatchAsync_v1 != NULL)
                cr = d->cuMemcpyBatchAsync_v1(s->bdst, s->bsrc, s->bsize, n, &attr, &aidx, 1,
                                              &fail, xp->stream);
            if (cr != KVLI_CUDA_SUCCESS) {
                /* No batch call (or it refused these pointers): one copy each. */
                cr = KVLI_CUDA_SUCCESS;
                for (size_t i = 0; i < n && cr == KVLI_CUDA_SUCCESS; i++)
                    cr = d->cuMemcpyAsync(s->bdst[i], s->bsrc[i], s->bsize[i], xp->stream);
            }
        }
    }
    if (cr == KVLI_CUDA_SUCCESS)
        cr = d->cuEventRecord(s->ev, xp->stream);
    if (cr != KVLI_CUDA_SUCCESS) {
        snprintf(text, cap, "%s on device %d = %.150s",
                 single ? "cuMemcpyAsync" : kernel ? "launching the gather kernel"
                                                   : "cuMemcpyBatchAsync/cuMemcpyAsync",
                 xp->dev, kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
        /* Whatever was enqueued completes before any later event of the stream. */
        return kvli_cuda_unit_failed(iface, xp, s);
    }
    xp->units[(xp->u_head + xp->u_count) % KVLI_CUDA_WINDOW] = (kvli_cuda_unit_t){s, xp->dev, 0};
    xp->u_count++;
    xp->enq_bytes += bytes;
    return 0;
}

static void kvli_cuda_xp_fail(kvli_cuda_xpriv_t *xp, kvl_status_t st, const char *text)
{
    if (xp->failed)
        return;
    xp->failed = 1;
    xp->fail_status = st;
    if (xp->fail_err == NULL)
        xp->fail_err = calloc(1, sizeof(*xp->fail_err));
    if (xp->fail_err != NULL) {
        kvl_bk_error_set(xp->fail_err, st, 0, KVLI_CUDA_NAME, xp->dev, "on CUDA device %d: %s",
                         xp->dev, text);
        /* The fix follows what failed, not one guess for every failure. */
        if (strstr(text, "ILLEGAL_ADDRESS") != NULL || strstr(text, "INVALID_ADDRESS") != NULL)
            kvl_bk_error_hint(xp->fail_err, "the GPU met an address it cannot reach: a registered "
                              "region was probably freed (or reallocated) while registered; "
                              "deregister GPU memory before freeing it. The GPU context is now "
                              "unusable in this process: restart it");
        else if (strstr(text, "OUT_OF_MEMORY") != NULL)
            kvl_bk_error_hint(xp->fail_err, "the GPU has no memory left for the transfer's "
                              "descriptor tables or copies; free GPU memory or move fewer blocks "
                              "per transfer");
        else if (strstr(text, "out of memory") != NULL)
            kvl_bk_error_hint(xp->fail_err, "the process is out of host memory");
        else
            kvl_bk_error_hint(xp->fail_err, "see the CUDA call and its error above; check "
                              "nvidia-smi and the log (after a failed launch the GPU context "
                              "may be unusable)");
        kvl_bk_xfer_error(xp->fail_err, xp->x, xp->peer->name);
    }
}

kvl_status_t kvli_cuda_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_peer_t *peer = x->peer;
    kvli_cuda_xcache_t *xc = x->bk_priv;
    kvli_cuda_xpriv_t *xp;
    kvli_cuda_devres_t *dr;
    uint32_t nl = 0, nr = 0;
    int dev = -1, all_gpu = 1, kernel_ok, single = x->nsegs == 1 && x->segs[0].count == 1;
    char text[1024] = "";

    if (atomic_load(&peer->dead)) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, 0, KVLI_CUDA_NAME, -1,
                         "the connection to agent '%s' was lost earlier (%.180s)", peer->name,
                         peer->dead_what);
        kvl_bk_error_hint(err, "the peer exited or restarted; fetch its metadata again");
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    if (xc != NULL) {
        /* Posted before: the regions the segments use are known. */
        nl = xc->nl;
        nr = xc->nr;
    } else if (x->nidx > 0 && x->nsegs == 0) {
        /* Indexed: the transfer's region arrays are the lists' regions. */
        nl = (uint32_t)x->ltab->nregs;
        nr = (uint32_t)x->rtab->nregs;
    } else {
        for (size_t i = 0; i < x->nsegs; i++) {
            if (x->segs[i].lreg + 1 > nl)
                nl = x->segs[i].lreg + 1;
            if (x->segs[i].rreg + 1 > nr)
                nr = x->segs[i].rreg + 1;
        }
    }
    for (uint32_t i = 0; i < nl; i++) {
        const kvli_cuda_mh_t *mh = x->lmh[i];
        kvl_status_t st = kvli_cuda_md_check_live(mh, err);
        if (st != KVL_OK)
            return st;
        if (mh->kind == KVLI_CUDA_MEM_HOST)
            all_gpu = 0;
        else if (dev < 0)
            dev = mh->dev;
        else if (mh->dev != dev)
            all_gpu = 0;
    }
    for (uint32_t i = 0; i < nr; i++) {
        const kvli_cuda_rh_t *rh = x->rmh[i];
        if (rh->local == NULL) {
            kvl_bk_error_set(err, KVL_ERR_REMOTE, 0, KVLI_CUDA_NAME, rh->dev,
                             "region 0x%" PRIx64 "+%" PRIu64 " of agent '%s' could not be mapped "
                             "here: %.300s", rh->addr, rh->len, peer->name, rh->unreachable);
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
            kvl_bk_error_hint(err, "both processes must see the GPU (same CUDA_VISIBLE_DEVICES "
                              "set or a superset), share the host IPC namespace (docker "
                              "--ipc=host) and run as users allowed to open each other's "
                              "memory; see docs/backends-cuda.md");
            return KVL_ERR_REMOTE;
        }
        if (rh->kind == KVLI_CUDA_MEM_HOST)
            all_gpu = 0;
        else if (dev < 0)
            dev = rh->dev;
        else if (rh->dev != dev)
            all_gpu = 0;
    }
    if (dev < 0)
        dev = 0;
    dr = kvli_cuda_devres_get(iface, dev, err);
    if (dr == NULL)
        return KVL_ERR_NO_DEVICE;
    kernel_ok = all_gpu && dr->fn != NULL;
    if (xc == NULL) {
        /* Kept across postings (xfer_release frees it). Without memory for
         * it, every posting scans the segments again. */
        xc = calloc(1, sizeof(*xc));
        if (xc != NULL) {
            xc->nl = nl;
            xc->nr = nr;
            xc->dev = dev;
            x->bk_priv = xc;
        }
    }
    xp = calloc(1, sizeof(*xp));
    if (xp == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_CUDA_NAME, -1, "calloc(%zu) failed",
                         sizeof(*xp));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    xp->x = x;
    xp->peer = peer;
    xp->dev = dev;
    xp->use_kernel = kernel_ok;
    xp->t_post = kvli_clock_ns();
    pthread_mutex_lock(&iface->lock);
    xp->stream = dr->streams[dr->next_stream++ % KVLI_CUDA_STREAMS];
    pthread_mutex_unlock(&iface->lock);
    snprintf(x->path, sizeof(x->path), "%s%s",
             single ? "cuda copy"
             : kernel_ok ? "cuda gather kernel" : "cuda batched copies",
             all_gpu ? " (ipc)" : " (host)");

    if (kvli_cuda_drv_push(dev) != KVLI_CUDA_SUCCESS) {
        free(xp);
        kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, dev,
                         "cuCtxPushCurrent(device %d) failed", dev);
        return KVL_ERR_NO_DEVICE;
    }
    /* Indexed: from the index arrays on the GPU when the kernel can, else
     * paired into segments by the core once, and on as below. */
    if (x->nidx > 0 && x->nsegs == 0) {
        int r = 1;
        if (kernel_ok && dr->fn_idx != NULL && x->ltab->len <= KVLI_CUDA_PIECE && xc != NULL &&
            xc->dev == dev)
            r = xc->ready ? 0 : kvli_cuda_xc_build_indexed(iface, xp, xc, text, sizeof(text));
        if (r == 0) {
            int in_place = kvli_cuda_idx_in_place(dr, xc, xc->unit_end[0], x->ltab->len);
            xp->xc = xc;
            snprintf(x->path, sizeof(x->path), "cuda gather kernel, indexed%s%s",
                     in_place ? ", indices in place" : "", all_gpu ? " (ipc)" : " (host)");
        } else {
            if (r < 0)
                iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "indexed transfer to '%s' not moved "
                                "from its indices (%.200s); pairing it", peer->name, text);
            text[0] = '\0';
            if (xc != NULL && (xc->tab != NULL || xc->unit_end != NULL)) {
                /* A half-built indexed cache goes; the next posting makes a
                 * cache for the segments. */
                if (xc->tab != NULL)
                    iface->drv->cuStreamSynchronize(xp->stream); /* a pending upload */
                x->bk_priv = NULL;
                kvli_cuda_xc_free(iface, xc);
                xc = NULL;
            }
            kvl_status_t est = iface->ctx->xfer_expand(iface->ctx, x, err);
            if (est != KVL_OK) {
                kvli_cuda_drv_pop();
                free(xp);
                return est;
            }
            single = x->nsegs == 1 && x->segs[0].count == 1;
            snprintf(x->path, sizeof(x->path), "%s%s", single ? "cuda copy"
                     : kernel_ok ? "cuda gather kernel" : "cuda batched copies",
                     all_gpu ? " (ipc)" : " (host)");
        }
    }
    /* Many blocks through the kernel: the table on the GPU, built at the
     * first posting (if that fails, this posting builds host tables unit by
     * unit as below, and the next one tries again). */
    if (xp->xc == NULL && kernel_ok && !single && xc != NULL && xc->dev == dev && !xc->indexed) {
        if (!xc->ready && kvli_cuda_xc_build(iface, xp, xc, text, sizeof(text)) != 0) {
            iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "no GPU-resident table for a transfer "
                            "to '%s' (%.200s); building tables per unit", peer->name, text);
            text[0] = '\0';
            x->bk_priv = NULL;
            kvli_cuda_xc_free(iface, xc);
            xc = NULL;
        }
        if (xc != NULL && xc->ready)
            xp->xc = xc;
    }
    /* One big copy, or a resident table: the whole window now (cheap).
     * Many blocks otherwise: the first table only; the progress thread
     * builds the rest while the GPU works, so the caller's thread returns
     * after one table's worth of work. */
    while (xp->u_count < (single || xp->xc != NULL ? KVLI_CUDA_WINDOW : 1u) &&
           kvli_cuda_xp_more(xp)) {
        if (kvli_cuda_unit_enqueue(iface, xp, text, sizeof(text)) != 0) {
            if (xp->u_count == 0) {
                if (xp->staged) /* the upload may be pending: the table stays */
                    iface->drv->cuStreamSynchronize(xp->stream);
                kvli_cuda_drv_pop();
                free(xp);
                kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_CUDA_NAME, dev,
                                 "posting to agent '%s' on CUDA device %d: %.300s", peer->name,
                                 dev, text);
                kvl_bk_error_hint(err, "nothing was moved; check the log and nvidia-smi");
                return KVL_ERR_SYSTEM;
            }
            kvli_cuda_xp_fail(xp, KVL_ERR_SYSTEM, text);
            break;
        }
    }
    kvli_cuda_drv_pop();
    pthread_mutex_lock(&iface->lock);
    xp->next = iface->xfers;
    iface->xfers = xp;
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_kick(&iface->pg); /* no system call while it spins or polls */
    return KVL_OK;
}

/* Completion (progress thread): xfer_done, then forget xp. */
static void kvli_cuda_xp_finish(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp)
{
    kvl_bk_xfer_t *x = xp->x;
    kvl_status_t st;
    kvl_error_t e;
    kvli_cuda_xpriv_t **pp;

    kvl_bk_error_none(&e); /* not its 36 KiB of causes: filled only on failure */
    if (xp->failed) {
        st = xp->fail_status;
        if (xp->fail_err != NULL)
            memcpy(&e, xp->fail_err, sizeof(e));
    } else if (kvli_cuda_xp_more(xp)) {
        st = KVL_ERR_CANCELED;
    } else {
        st = KVL_OK;
        if (x->notif != NULL &&
            kvli_cuda_chan_notif(xp->peer, x->notif, x->notif_len, x->total_bytes, &e) !=
                KVL_OK) {
            st = e.code;
            if (st != KVL_ERR_REMOTE_FULL) /* that one says it all */
                snprintf(e.hint, sizeof(e.hint), "all %" PRIu64 " bytes are in place at agent "
                         "'%s', but its notification was not delivered; the peer may have "
                         "exited", x->total_bytes, xp->peer->name);
        }
    }
    pthread_mutex_lock(&iface->lock);
    xp->completing = 1;
    pthread_mutex_unlock(&iface->lock);
    iface->ctx->xfer_done(x, st, st == KVL_OK || st == KVL_ERR_CANCELED ? NULL : &e);
    pthread_mutex_lock(&iface->lock);
    for (pp = &iface->xfers; *pp != NULL; pp = &(*pp)->next)
        if (*pp == xp) {
            *pp = xp->next;
            break;
        }
    xp->done = 1;
    if (xp->waiters == 0) {
        free(xp->fail_err);
        free(xp);
    } else {
        pthread_cond_broadcast(&iface->cond);
    }
    pthread_mutex_unlock(&iface->lock);
}

/* The oldest unit of xp wrote no end to its host word yet, and was posted
 * recently enough for the word alone to be trusted (KVLI_CUDA_FLAG_TRUST_NS;
 * after that its event is asked as well, which also reports a failure). */
static int kvli_cuda_unit_running(const kvli_cuda_xpriv_t *xp)
{
    const kvli_cuda_unit_t *u = &xp->units[xp->u_head];
    return xp->u_count > 0 && u->seq != 0 &&
           __atomic_load_n(u->slot->flag, __ATOMIC_ACQUIRE) != u->seq &&
           kvli_clock_ns() - xp->t_post < KVLI_CUDA_FLAG_TRUST_NS;
}

unsigned kvli_cuda_xfer_progress(kvli_cuda_iface_t *iface, int *young_p)
{
    const kvli_cuda_drv_t *d = iface->drv;
    kvli_cuda_xpriv_t *fin[64];
    unsigned nfin = 0, live = 0;
    char text[1024], eb[160];

    pthread_mutex_lock(&iface->lock);
    /* Only the holder of prog_lock changes units after posting; the list is
     * stable except for inserts at the head, which the next round sees. */
    kvli_cuda_xpriv_t *head = iface->xfers;
    pthread_mutex_unlock(&iface->lock);
    for (kvli_cuda_xpriv_t *xp = head; xp != NULL; xp = xp->next) {
        int pushed;
        if (xp->completing)
            continue;
        live++;
        if (kvli_cuda_unit_running(xp)) {
            /* its host word says it still runs: no driver call */
            if (!*young_p && kvli_clock_ns() - xp->t_post < KVLI_CUDA_SPIN_NS)
                *young_p = 1;
            continue;
        }
        pushed = kvli_cuda_drv_push(xp->dev) == KVLI_CUDA_SUCCESS;
        while (xp->u_count > 0) {
            kvli_cuda_unit_t *u = &xp->units[xp->u_head];
            CUresult cr = u->seq != 0 && __atomic_load_n(u->slot->flag, __ATOMIC_ACQUIRE) == u->seq
                              ? KVLI_CUDA_SUCCESS : d->cuEventQuery(u->slot->ev);
            if (cr == KVLI_CUDA_ERROR_NOT_READY)
                break;
            if (cr != KVLI_CUDA_SUCCESS) {
                snprintf(text, sizeof(text), "the copy failed: cuEventQuery = %.150s",
                         kvli_cuda_drv_errstr(cr, eb, sizeof(eb)));
                kvli_cuda_xp_fail(xp, KVL_ERR_SYSTEM, text);
            }
            kvli_cuda_slot_put(iface, u->dev, u->slot);
            xp->u_head = (xp->u_head + 1) % KVLI_CUDA_WINDOW;
            xp->u_count--;
        }
        while (pushed && !xp->failed && !atomic_load(&xp->cancel) && kvli_cuda_xp_more(xp) &&
               xp->u_count < KVLI_CUDA_WINDOW) {
            text[0] = '\0';
            if (kvli_cuda_unit_enqueue(iface, xp, text, sizeof(text)) != 0)
                kvli_cuda_xp_fail(xp, KVL_ERR_SYSTEM, text);
        }
        if (pushed)
            kvli_cuda_drv_pop();
        if (xp->u_count == 0 && nfin < 64 &&
            (xp->failed || atomic_load(&xp->cancel) || !kvli_cuda_xp_more(xp)))
            fin[nfin++] = xp;
        else if (!*young_p && kvli_clock_ns() - xp->t_post < KVLI_CUDA_SPIN_NS)
            *young_p = 1;
    }
    for (unsigned i = 0; i < nfin; i++)
        kvli_cuda_xp_finish(iface, fin[i]);
    return live - nfin;
}

void kvli_cuda_xfer_poll(void *bk)
{
    kvli_cuda_iface_t *iface = bk;
    int young = 0;
    if (pthread_mutex_trylock(&iface->prog_lock) != 0)
        return; /* the progress thread or another caller is at it */
    kvli_cuda_xfer_progress(iface, &young);
    pthread_mutex_unlock(&iface->prog_lock);
}

static void kvli_cuda_xp_wait(kvli_cuda_iface_t *iface, kvli_cuda_xpriv_t *xp)
{
    /* under iface->lock */
    xp->waiters++;
    atomic_store(&xp->cancel, 1);
    kvli_progress_wake(&iface->pg);
    while (!xp->done) {
        struct timespec ts;
        kvli_cuda_deadline(&ts, 1000);
        pthread_cond_timedwait(&iface->cond, &iface->lock, &ts);
    }
    if (--xp->waiters == 0) {
        free(xp->fail_err);
        free(xp);
    }
}

void kvli_cuda_xfer_cancel(void *bk, kvl_bk_xfer_t *x)
{
    kvli_cuda_iface_t *iface = bk;
    pthread_mutex_lock(&iface->lock);
    for (kvli_cuda_xpriv_t *xp = iface->xfers; xp != NULL; xp = xp->next)
        if (xp->x == x) {
            kvli_cuda_xp_wait(iface, xp);
            break;
        }
    pthread_mutex_unlock(&iface->lock);
}

void kvli_cuda_xfer_cancel_peer(kvli_cuda_iface_t *iface, kvli_cuda_peer_t *peer)
{
    pthread_mutex_lock(&iface->lock);
    for (;;) {
        kvli_cuda_xpriv_t *xp;
        for (xp = iface->xfers; xp != NULL; xp = xp->next)
            if (xp->peer == peer && !xp->done)
                break;
        if (xp == NULL)
            break;
        kvli_cuda_xp_wait(iface, xp);
    }
    pthread_mutex_unlock(&iface->lock);
}

void kvli_cuda_xfer_release(void *bk, kvl_bk_xfer_t *x)
{
    kvli_cuda_xcache_t *xc = x->bk_priv;
    /* Never in flight here (the core's promise): nothing reads the table. */
    x->bk_priv = NULL;
    if (xc != NULL)
        kvli_cuda_xc_free(bk, xc);
}
