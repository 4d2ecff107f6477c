/*
 * kvlane cuda backend: the interface object. available/probe, open/close,
 * the progress thread (transfer events, and the target side of accepted
 * connections) and the ops table, the one exported symbol.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/iface.h"
#include "cuda.h"
#include "common/host.h"

#define KVLI_CUDA_SCRATCH (KVL_NOTIF_MAX + 4096)
#define KVLI_CUDA_POLL_NS 4000L          /* event polling period while copies run */

static const kvl_param_t kvli_cuda_params[] = {
    {"pin_host", "auto"},
    {"kernel", "auto"},
    {NULL, NULL}
};




/* ---- progress (common/progress.c runs the loop) ---- */

static int64_t kvli_cuda_progress_prepare(void *arg, kvli_pollset_t *ps)
{
    kvli_cuda_iface_t *iface = arg;
    size_t need = 2;
    for (kvli_cuda_conn_t *c = iface->conns; c != NULL; c = c->next)
        need++;
    if (kvli_pollset_reserve(&iface->pg, ps, need) != 0)
        return KVLI_PROGRESS_BACKOFF;
    /* slot 1 even while accepting is paused (events 0): dispatch counts on it */
    uint64_t now = kvli_clock_ns();
    kvli_pollset_add(ps, iface->listen_fd, kvli_accept_events(&iface->accept_bo, now), NULL);
    for (kvli_cuda_conn_t *c = iface->conns; c != NULL; c = c->next)
        kvli_pollset_add(ps, c->fd, POLLIN, c);
    /* Poll events every few microseconds while copies run, not 50 us late;
     * right after a posting without sleeping at all (a zero wait still polls
     * the sockets, so the target side is served meanwhile). */
    int young = 0;
    pthread_mutex_lock(&iface->prog_lock);
    unsigned live = kvli_cuda_xfer_progress(iface, &young);
    pthread_mutex_unlock(&iface->prog_lock);
    int64_t wait = live == 0 ? KVLI_PROGRESS_FOREVER : young ? 0 : KVLI_CUDA_POLL_NS;
    return kvli_accept_wait_ns(&iface->accept_bo, now, wait);
}

static void kvli_cuda_progress_dispatch(void *arg, kvli_pollset_t *ps)
{
    kvli_cuda_iface_t *iface = arg;
    kvli_cuda_conn_t *c, **cp;
    if (ps->pfd[1].revents & POLLIN)
        kvli_cuda_chan_accept(iface);
    for (size_t i = 2; i < ps->n; i++)
        if (ps->pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
            kvli_cuda_chan_conn_progress(iface, ps->who[i]);
    for (cp = &iface->conns; *cp != NULL;) {
        c = *cp;
        if (c->closing) {
            *cp = c->next;
            kvli_cuda_chan_conn_free(c);
        } else {
            cp = &c->next;
        }
    }
}

/* Posted transfers the progress thread has not finished (kvli_progress_kick). */
static int kvli_cuda_progress_busy(void *arg)
{
    kvli_cuda_iface_t *iface = arg;
    pthread_mutex_lock(&iface->lock);
    int busy = iface->xfers != NULL;
    pthread_mutex_unlock(&iface->lock);
    return busy;
}

static const kvli_progress_ops_t kvli_cuda_progress_ops = {
    .prepare = kvli_cuda_progress_prepare,
    .dispatch = kvli_cuda_progress_dispatch,
    .busy = kvli_cuda_progress_busy,
};

/* ---- ops ---- */

static kvl_status_t kvli_cuda_available(char *reason, size_t len)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    if (d == NULL) {
        if (reason != NULL && len > 0)
            snprintf(reason, len, "%s", kvli_cuda_drv_reason());
        return KVL_ERR_NO_DEVICE;
    }
    if (reason != NULL && len > 0)
        snprintf(reason, len, "CUDA driver %d.%d (%.200s), %d device(s); %s", d->version / 1000,
                 (d->version % 1000) / 10, d->path, d->ndev, kvli_cuda_drv_kernel_note());
    return KVL_OK;
}

static void kvli_cuda_probe(void (*report)(void *arg, const char *check, int status,
                                           const char *observed, const char *hint),
                            void *arg, kvl_mem_kind_t mem, int32_t dev, uint64_t planned_bytes)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    char obs[1024];
    (void)planned_bytes;
    if (d == NULL) {
        /* A failure only when GPU memory is planned; a warning otherwise. */
        report(arg, "driver", mem == KVL_MEM_VRAM ? 2 : 1, kvli_cuda_drv_reason(),
               "install the NVIDIA driver or expose it to the container (NVIDIA container "
               "toolkit); set KVL_CUDA_DRIVER to a libcuda.so.1 path to use another one");
        return;
    }
    snprintf(obs, sizeof(obs), "CUDA driver %d.%d at %.300s", d->version / 1000,
             (d->version % 1000) / 10, d->path);
    report(arg, "driver", 0, obs, "");
    for (int i = 0; i < d->ndev; i++) {
        char check[48];
        snprintf(check, sizeof(check), "cuda device %d", i);
        snprintf(obs, sizeof(obs), "%.80s, PCI %.32s, %d SMs, VMM fd export %s%s%.100s", d->devs[i].name,
                 d->devs[i].pci, d->devs[i].sm_count, d->devs[i].posix_fd ? "yes" : "no",
                 cvd ? ", CUDA_VISIBLE_DEVICES=" : "", cvd ? cvd : "");
        report(arg, check, 0, obs, "");
    }
    report(arg, "cuda gather kernel", kvli_cuda_drv_have_kernel() ? 0 : 1,
           kvli_cuda_drv_kernel_note(),
           kvli_cuda_drv_have_kernel() ? "" : "rebuild kvlane where nvcc is installed (cmake "
                                              "finds /usr/local/cuda/bin/nvcc or CUDACXX)");
    if (mem == KVL_MEM_VRAM && dev != KVL_DEV_ANY && (dev < 0 || dev >= d->ndev)) {
        snprintf(obs, sizeof(obs), "device %d planned, this process sees %d CUDA device(s)%s%.100s",
                 dev, d->ndev, cvd ? " (CUDA_VISIBLE_DEVICES=" : "", cvd ? cvd : "");
        if (cvd)
            snprintf(obs + strlen(obs), sizeof(obs) - strlen(obs), ")");
        report(arg, "cuda device ordinal", 2, obs,
               "pass the in-process ordinal (0..count-1), not the physical GPU index or the TP "
               "rank: CUDA_VISIBLE_DEVICES renumbers GPUs from 0 in each process");
    }
}

static kvl_status_t kvli_cuda_parse_params(kvli_cuda_iface_t *iface, const kvl_param_t *params,
                                           size_t n, kvl_error_t *err)
{
    iface->pin_host = KVLI_CUDA_PINH_AUTO;
    for (size_t i = 0; i < n && params != NULL && params[i].key != NULL; i++) {
        const char *k = params[i].key, *v = params[i].value ? params[i].value : "";
        int pin = strcmp(k, "pin_host") == 0;
        if (!pin && strcmp(k, "kernel") != 0) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, -1,
                             "unknown parameter \"%.64s\" (the cuda backend knows: pin_host, "
                             "kernel)", k);
            kvl_bk_error_hint(err, "remove it or fix its spelling");
            return KVL_ERR_INVALID_ARG;
        }
        if (strcmp(v, "auto") != 0 && strcmp(v, "off") != 0 && !(pin && strcmp(v, "sync") == 0)) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, -1,
                             "parameter %s=\"%.64s\" is not one of %s", k, v,
                             pin ? "auto, sync, off" : "auto, off");
            kvl_bk_error_hint(err, "pin_host=auto pins registered host memory "
                              "(cuMemHostRegister) in the background, sync in the registering "
                              "call; kernel=auto uses the gather kernel for many small GPU "
                              "blocks");
            return KVL_ERR_INVALID_ARG;
        }
        if (pin)
            iface->pin_host = strcmp(v, "auto") == 0   ? KVLI_CUDA_PINH_AUTO
                              : strcmp(v, "sync") == 0 ? KVLI_CUDA_PINH_SYNC
                                                       : KVLI_CUDA_PINH_OFF;
        else
            iface->kernel_off = strcmp(v, "off") == 0;
    }
    return KVL_OK;
}

static void kvli_cuda_close(void *bk);

static kvl_status_t kvli_cuda_open(kvl_bk_ctx_t *ctx, const kvl_param_t *params, size_t n,
                                   void **bk_p, kvl_error_t *err)
{
    const kvli_cuda_drv_t *d = kvli_cuda_drv_get();
    kvli_cuda_iface_t *iface;
    kvl_status_t st;
    int e;

    iface = kvli_iface_new(ctx, bk_p, KVLI_CUDA_NAME, sizeof(*iface), &st, err);
    if (iface == NULL)
        return st;
    if (d == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_DEVICE, 0, KVLI_CUDA_NAME, -1, "%s",
                         kvli_cuda_drv_reason());
        kvl_bk_error_hint(err, "install the NVIDIA driver or expose it to the container "
                          "(NVIDIA container toolkit); without it create only host-memory "
                          "backends (shm, tcp)");
        free(iface);
        return KVL_ERR_NO_DEVICE;
    }
    iface->ctx = ctx;
    iface->drv = d;
    pthread_mutex_init(&iface->prog_lock, NULL);
    iface->timeout_ms = ctx->timeout_ms ? ctx->timeout_ms : KVLI_CUDA_DEFAULT_TIMEOUT_MS;
    iface->listen_fd = -1;
    kvli_progress_init(&iface->pg, ctx, KVLI_CUDA_NAME);
    st = kvli_cuda_parse_params(iface, params, n, err);
    if (st != KVL_OK) {
        free(iface);
        return st;
    }
    char why[200];
    e = kvli_host_boot_id(iface->boot_id, sizeof(iface->boot_id), why, sizeof(why));
    if (e != 0) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e == EIO ? 0 : e, KVLI_CUDA_NAME, -1,
                         "%s: cannot tell which host this is", why);
        kvl_bk_error_hint(err, "mount /proc (the cuda backend compares boot ids to be sure "
                          "both agents share one machine)");
        free(iface);
        return KVL_ERR_SYSTEM;
    }
    kvli_lock_init(&iface->lock, &iface->cond);
    kvli_cuda_pin_init(iface);
    iface->scratch_len = KVLI_CUDA_SCRATCH;
    iface->scratch = malloc(iface->scratch_len);
    if (iface->scratch == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_CUDA_NAME, -1,
                         "malloc(%zu) failed", iface->scratch_len);
        kvl_bk_error_hint(err, "the process is out of memory");
        st = KVL_ERR_NO_MEMORY;
        goto fail;
    }
    st = kvli_progress_open(&iface->pg, err);
    if (st != KVL_OK)
        goto fail;
    st = kvli_cuda_chan_listen(iface, err);
    if (st != KVL_OK)
        goto fail;
    char what[128];
    snprintf(what, sizeof(what), "cuda socket @%.100s", iface->sock_name);
    kvli_accept_backoff_init(&iface->accept_bo, what, kvli_accept_bk_log, iface->ctx);
    st = kvli_progress_start(&iface->pg, &kvli_cuda_progress_ops, iface, err);
    if (st != KVL_OK)
        goto fail;
    if (!kvli_cuda_drv_have_kernel() || iface->kernel_off)
        ctx->log(ctx, KVL_LOG_INFO, "%s", iface->kernel_off ? "kernel=off: small GPU blocks "
                 "move with batched copies" : kvli_cuda_drv_kernel_note());
    ctx->log(ctx, KVL_LOG_DEBUG, "CUDA driver %d at %s, %d device(s), listening on @%s",
             d->version, d->path, d->ndev, iface->sock_name);
    *bk_p = iface;
    return KVL_OK;
fail:
    kvli_cuda_close(iface);
    return st;
}

static void kvli_cuda_close(void *bk)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_conn_t *c, *nc;
    if (iface == NULL)
        return;
    kvli_progress_stop(&iface->pg);
    kvli_cuda_pin_fini(iface);
    /* The core released peers, regions and transfers first; guard leaks. */
    while (iface->peers != NULL)
        kvli_cuda_chan_peer_unload(iface, iface->peers);
    for (c = iface->conns; c != NULL; c = nc) {
        nc = c->next;
        kvli_cuda_chan_conn_free(c);
    }
    kvli_cuda_xfer_devres_fini(iface);
    if (iface->listen_fd >= 0)
        close(iface->listen_fd);
    kvli_progress_close(&iface->pg);
    pthread_cond_destroy(&iface->cond);
    pthread_mutex_destroy(&iface->prog_lock);
    pthread_mutex_destroy(&iface->lock);
    free(iface->scratch);
    free(iface);
}

/* Device services: classify CUDA pointers (cuda_md.c) and lend host-only
 * backends staging copies (cuda_stage.c); no backend needed. */
static const kvl_device_ops_t kvli_cuda_device_ops = {
    .size = sizeof(kvl_device_ops_t),
    .mem_query = kvli_cuda_md_query,
    .stage_check = kvli_cuda_stage_check,
    .stage_host_alloc = kvli_cuda_stage_host_alloc,
    .stage_host_free = kvli_cuda_stage_host_free,
    .stage_copy = kvli_cuda_stage_copy,
    .stage_test = kvli_cuda_stage_test,
    .ctx_enter = kvli_cuda_stage_enter,
    .ctx_leave = kvli_cuda_stage_leave,
};

const kvl_backend_ops_t kvli_cuda_ops = {
    .abi_version = KVL_BACKEND_ABI_VERSION,
    .size = sizeof(kvl_backend_ops_t),
    .name = KVLI_CUDA_NAME,
    .description = "same host GPU memory: CUDA IPC (legacy and VMM fd handles), GPU<->host "
                   "copies, a gather kernel for many small blocks; the driver is loaded at run "
                   "time",
    .mem_local = KVL_MEM_BIT(KVL_MEM_VRAM) | KVL_MEM_BIT(KVL_MEM_DRAM),
    .mem_remote = KVL_MEM_BIT(KVL_MEM_VRAM) | KVL_MEM_BIT(KVL_MEM_DRAM),
    .caps = KVL_BK_CAP_NOTIF | KVL_BK_CAP_SAME_HOST | KVL_BK_CAP_INDEXED,
    .params = kvli_cuda_params,
    .available = kvli_cuda_available,
    .open = kvli_cuda_open,
    .close = kvli_cuda_close,
    .mem_reg = kvli_cuda_md_reg,
    .mem_dereg = kvli_cuda_md_dereg,
    .conn_pack = kvli_cuda_chan_conn_pack,
    .region_pack = kvli_cuda_md_pack,
    .peer_load = kvli_cuda_chan_peer_load,
    .peer_unload = kvli_cuda_chan_peer_unload,
    .rregion_load = kvli_cuda_ipc_rload,
    .rregion_unload = kvli_cuda_ipc_runload,
    .xfer_post = kvli_cuda_xfer_post,
    .xfer_cancel = kvli_cuda_xfer_cancel,
    .progress = kvli_cuda_xfer_poll,
    .notif_send = kvli_cuda_chan_notif_send,
    .peer_describe = kvli_cuda_chan_peer_describe,
    .device = &kvli_cuda_device_ops,
    .probe = kvli_cuda_probe,
    .xfer_release = kvli_cuda_xfer_release,
    .ptab_release = kvli_cuda_ptab_release,
    .ptab_prepare = kvli_cuda_ptab_prepare,
    .idx_alloc = kvli_cuda_idx_alloc,
    .idx_free = kvli_cuda_idx_free
};
