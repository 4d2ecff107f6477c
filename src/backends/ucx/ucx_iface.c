/*
 * kvlane ucx backend: the interface object. open/close, the progress
 * thread, process-exit teardown and the ops table with the module's one
 * exported symbol, kvl_backend_module_v1().
 *
 * Progress model: one UCP worker per backend, created UCS_THREAD_MODE_MULTI
 * so any thread may call UCP (metadata loading, notif_send). One progress
 * thread owns the data path: it issues puts/gets, flushes, sends transfer
 * notifications and calls ucp_worker_progress(). While transfers are in
 * flight it polls; when idle it arms the worker (ucp_worker_arm) and sleeps
 * in poll() on the worker's event fd and our own eventfd (woken by
 * xfer_post/cancel/close), at most 20 ms at a time.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/iface.h"
#include "ucx.h"

static const kvl_param_t kvli_ucx_params[] = {
    { "tls", "" },                   /* UCX_TLS for this backend ("" = environment) */
    { "net_devices", "" },           /* UCX_NET_DEVICES for this backend */
    { "missing_devices", "refuse" }, /* refuse | warn */
    { "error_handling", "peer" },    /* peer | none */
    { "data_path", "rma" },          /* rma (put/get; VRAM UCX cannot map staged) | am */
    { NULL, NULL }
};

/* Live interfaces, torn down at process exit when the program did not
 * destroy its agent (UCX must not be left with mapped regions). */
static pthread_mutex_t kvli_ucx_live_lock = PTHREAD_MUTEX_INITIALIZER;
static kvli_ucx_iface_t *kvli_ucx_live;



/* A turn of the progress thread (common/progress.c runs the loop): move
 * transfers and UCX; wait in poll only once UCX is idle and armed. */
static int64_t kvli_ucx_progress_prepare(void *arg, kvli_pollset_t *ps)
{
    kvli_ucx_iface_t *iface = arg;
    int active;
    unsigned n = 0, c;

    active = kvli_ucx_peers_sweep(iface);
    active |= kvli_ucx_xfer_progress(iface);
    active |= kvli_ucx_stage_progress(iface);
    active |= kvli_ucx_notif_progress(iface);
    do {
        c = ucp_worker_progress(iface->worker);
        for (size_t i = 0; i < iface->pw_n; i++)
            c += ucp_worker_progress(iface->pw[i]);
        n += c;
    } while (c != 0 && n < 256);
    if (n != 0) {
        iface->idle = 0;
        return KVLI_PROGRESS_AGAIN;
    }
    /* Spin a little while transfers move: waking from poll() costs more
     * than a few empty progress calls. */
    if (active && ++iface->idle < 64)
        return KVLI_PROGRESS_AGAIN;
    iface->idle = 0;
    if (kvli_pollset_reserve(&iface->pg, ps, 2 + iface->pw_n) != 0)
        return KVLI_PROGRESS_BACKOFF;
    for (size_t i = 0; i <= iface->pw_n; i++) {
        ucp_worker_h w = i == 0 ? iface->worker : iface->pw[i - 1];
        int efd = i == 0 ? iface->efd : iface->pw_efd[i - 1];
        ucs_status_t s;
        if (efd < 0)
            continue;
        s = ucp_worker_arm(w);
        if (s == UCS_ERR_BUSY)
            return KVLI_PROGRESS_AGAIN;
        if (s == UCS_OK)
            kvli_pollset_add(ps, efd, POLLIN, NULL);
    }
    return (active ? 1 : 20) * 1000000LL;
}

static void kvli_ucx_progress_dispatch(void *arg, kvli_pollset_t *ps)
{
    (void)arg; /* the next turn's ucp_worker_progress() serves what fired */
    (void)ps;
}

static const kvli_progress_ops_t kvli_ucx_progress_ops = {
    .prepare = kvli_ucx_progress_prepare,
    .dispatch = kvli_ucx_progress_dispatch,
};

static kvl_status_t kvli_ucx_available(char *reason, size_t len)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    ucp_context_h c;
    kvli_ucx_log_t log;
    kvl_error_t err;
    unsigned maj, min, rel;
    char types[64];
    ucs_status_t s;

    ucp_get_version(&maj, &min, &rel);
    kvli_ucx_log_begin(&log);
    s = ucp_init(&p, NULL, &c);
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        kvli_ucx_diag_init_failed(&err, "ucp_init()", s, &log, "", "");
        if (reason != NULL && len > 0)
            snprintf(reason, len, "%.300s; fix: %.200s", err.what, err.hint);
        return err.code;
    }
    if (ucp_context_query(c, &a) != UCS_OK)
        a.memory_types = 1u << UCS_MEMORY_TYPE_HOST;
    ucp_cleanup(c);
    if (reason != NULL && len > 0)
        snprintf(reason, len, "UCX %u.%u.%u; memory types: %s%s", maj, min, rel,
                 kvli_ucx_mem_types_str(a.memory_types, types, sizeof(types)),
                 (a.memory_types & (1u << UCS_MEMORY_TYPE_CUDA)) ? "" : " (no GPU memory: VRAM "
                 "is staged through host memory)");
    return KVL_OK;
}

static kvl_status_t kvli_ucx_parse_params(kvli_ucx_iface_t *iface, const kvl_param_t *params,
                                          size_t n, const char **tls_p, const char **dev_p,
                                          kvl_error_t *err)
{
    *tls_p = "";
    *dev_p = "";
    iface->missing_refuse = 1;
    iface->err_mode_peer = 1;
    for (size_t i = 0; i < n && params != NULL && params[i].key != NULL; i++) {
        const char *k = params[i].key, *v = params[i].value ? params[i].value : "";
        if (strcmp(k, "tls") == 0) {
            *tls_p = v;
        } else if (strcmp(k, "net_devices") == 0) {
            *dev_p = v;
        } else if (strcmp(k, "missing_devices") == 0 &&
                   (strcmp(v, "refuse") == 0 || strcmp(v, "warn") == 0)) {
            iface->missing_refuse = v[0] == 'r';
        } else if (strcmp(k, "error_handling") == 0 &&
                   (strcmp(v, "peer") == 0 || strcmp(v, "none") == 0)) {
            iface->err_mode_peer = v[0] == 'p';
        } else if (strcmp(k, "data_path") == 0 &&
                   (strcmp(v, "rma") == 0 || strcmp(v, "am") == 0)) {
            iface->data_path_am = v[0] == 'a';
        } else {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_UCX_NAME, -1,
                             "parameter %.40s=\"%.80s\" is not valid", k, v);
            kvl_bk_error_hint(err, "ucx parameters: tls=<UCX_TLS list>, net_devices=<UCX_NET_"
                              "DEVICES list>, missing_devices=refuse|warn, error_handling="
                              "peer|none, data_path=rma|am");
            return KVL_ERR_INVALID_ARG;
        }
    }
    return KVL_OK;
}

/* Apply one UCX setting unless the user set its environment variable. */
static void kvli_ucx_config_set(ucp_config_t *cfg, const char *name, const char *value,
                                int force)
{
    char env[64];
    snprintf(env, sizeof(env), "UCX_%s", name);
    if (value == NULL || value[0] == '\0' || (!force && getenv(env) != NULL))
        return;
    ucp_config_modify(cfg, name, value);
}

static kvl_status_t kvli_ucx_context_open(kvli_ucx_iface_t *iface, const char *tls,
                                          const char *dev, kvl_error_t *err)
{
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 1,
        .name = "kvlane",
    };
    ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    ucp_config_t *cfg = NULL;
    kvli_ucx_log_t log;
    char ka[32];
    ucs_status_t s;

    /* With peer error handling UCX 1.13 leaves its shared-memory transports
     * out unless they "expose error handling" (off by default), and every
     * byte between two processes of one host then crawls through TCP
     * emulation (0.4 GB/s instead of 10+). They notice a dead peer by its
     * pid, which is all we need. These are transport (UCT) settings that
     * ucp_config_modify() does not reach, so set the environment variables
     * when the user has not: once, before the first context is created. */
    if (iface->err_mode_peer) {
        pthread_mutex_lock(&kvli_ucx_live_lock);
        setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
        setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
        pthread_mutex_unlock(&kvli_ucx_live_lock);
    }
    kvli_ucx_log_begin(&log);
    s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        kvli_ucx_log_end();
        kvli_ucx_diag_init_failed(err, "ucp_config_read()", s, &log, tls, dev);
        return KVL_ERR_UNSUPPORTED;
    }
    kvli_ucx_config_set(cfg, "TLS", tls, 1);
    snprintf(iface->tls_cfg, sizeof(iface->tls_cfg), "%.90s",
             tls[0] ? tls : getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)");
    kvli_ucx_config_set(cfg, "NET_DEVICES", dev, 1);
    /* A dead peer must be noticed within our bound, not UCX's default 20 s:
     * keepalive every quarter of the timeout, unless the user chose. */
    snprintf(ka, sizeof(ka), "%" PRIu64 "ms", iface->timeout_ms / 4 ? iface->timeout_ms / 4 : 1);
    kvli_ucx_config_set(cfg, "KEEPALIVE_INTERVAL", ka, 0);
    s = ucp_init(&p, cfg, &iface->context);
    ucp_config_release(cfg);
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        iface->context = NULL;
        kvli_ucx_diag_init_failed(err, "ucp_init()", s, &log, tls, dev);
        return err->code;
    }
    if (ucp_context_query(iface->context, &a) != UCS_OK)
        a.memory_types = 1u << UCS_MEMORY_TYPE_HOST;
    iface->mem_types = a.memory_types;
    kvli_ucx_diag_resources(iface);
    /* A silent slow path: without a shared-memory transport, agents on this
     * host move KV cache over whatever UCX is left with. Said once, when the
     * backend is created. */
    if (iface->tls_list[0] && !kvli_ucx_tls_has_shm(iface->tls_list))
        iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                        "the transports UCX may use (%s; %s) leave out shared memory: "
                        "agents on this host move KV cache over them, far slower than "
                        "shared memory; add sm to %s (e.g. sm,tcp), or let kvlane's shm "
                        "backend carry same-host transfers", iface->tls_list,
                        tls[0] ? "tls parameter" : "UCX_TLS",
                        tls[0] ? "the tls parameter" : "UCX_TLS");
    kvli_ucx_diag_net_devices(iface, &log);
    if (iface->config_bad && !iface->missing_refuse)
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "%.500s (missing_devices=warn: going on "
                        "with the devices UCX has)", iface->config_err.what);
    return KVL_OK;
}

kvl_status_t kvli_ucx_worker_new(kvli_ucx_iface_t *iface, int main_worker, ucp_worker_h *w_p,
                                 int *efd_p, kvl_error_t *err)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_MULTI};
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = KVLI_UCX_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = kvli_ucx_notif_recv,
        .arg = iface,
    };
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE |
                                          UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    ucp_worker_h w;
    kvli_ucx_log_t log;
    char said[1100];
    ucs_status_t s;

    *w_p = NULL;
    *efd_p = -1;
    kvli_ucx_log_begin(&log);
    s = ucp_worker_create(iface->context, &wp, &w);
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        kvli_ucx_diag_init_failed(err, "ucp_worker_create(UCS_THREAD_MODE_MULTI)", s, &log, "",
                                  "");
        return err->code;
    }
    if (ucp_worker_query(w, &wa) == UCS_OK && wa.thread_mode != UCS_THREAD_MODE_MULTI) {
        ucp_worker_destroy(w);
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_UCX_NAME, -1,
                         "ucp_worker_create(UCS_THREAD_MODE_MULTI) gave a worker of thread "
                         "mode %d: this UCX was built without multi-thread support",
                         (int)wa.thread_mode);
        kvl_bk_error_hint(err, "use a UCX built with --enable-mt (Debian's is)");
        return KVL_ERR_UNSUPPORTED;
    }
    if (main_worker) {
        /* staged requests carry their ranges in the AM header */
        iface->stage_max_ranges = KVLI_UCX_STAGE_RANGES;
        if (wa.max_am_header < 24u + 16u * KVLI_UCX_STAGE_RANGES)
            iface->stage_max_ranges = wa.max_am_header > 24u + 16u
                                      ? (unsigned)((wa.max_am_header - 24u) / 16u) : 1u;
    }
    /* Both take notifications (a peer's replies never are, but a sender
     * that is not kvlane gets the same warning either way); requests only
     * come to the main worker, replies only to a peer's. */
    kvli_ucx_log_begin(&log);
    s = ucp_worker_set_am_recv_handler(w, &ap);
    if (s == UCS_OK) {
        ap.id = main_worker ? KVLI_UCX_AM_STAGE : KVLI_UCX_AM_STAGE_REPLY;
        ap.cb = main_worker ? kvli_ucx_stage_req_recv : kvli_ucx_stage_reply_recv;
        s = ucp_worker_set_am_recv_handler(w, &ap);
    }
    if (s == UCS_OK && !main_worker) {
        /* the answers to our notifications come back on the endpoint's worker */
        ap.id = KVLI_UCX_AM_NOTIF_ANS;
        ap.cb = kvli_ucx_notif_ans_recv;
        s = ucp_worker_set_am_recv_handler(w, &ap);
    }
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        ucp_worker_destroy(w);
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_UCX_NAME, -1,
                         "setting up the UCP worker (AM handler, address) failed: %s%s",
                         ucs_status_string(s), kvli_ucx_log_said(&log, said, sizeof(said)));
        kvl_bk_error_hint(err, "run ucx_info -d to check UCX's transports");
        return KVL_ERR_SYSTEM;
    }
    if (ucp_worker_get_efd(w, efd_p) != UCS_OK)
        *efd_p = -1; /* no wakeup support: the progress thread polls */
    *w_p = w;
    return KVL_OK;
}

static kvl_status_t kvli_ucx_worker_open(kvli_ucx_iface_t *iface, kvl_error_t *err)
{
    kvli_ucx_log_t log;
    char said[1100];
    ucs_status_t s;
    kvl_status_t st;

    st = kvli_ucx_worker_new(iface, 1, &iface->worker, &iface->efd, err);
    if (st != KVL_OK)
        return st;
    kvli_ucx_log_begin(&log);
    s = ucp_worker_get_address(iface->worker, &iface->addr, &iface->addr_len);
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        iface->addr = NULL;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_UCX_NAME, -1,
                         "setting up the UCP worker (AM handler, address) failed: %s%s",
                         ucs_status_string(s), kvli_ucx_log_said(&log, said, sizeof(said)));
        kvl_bk_error_hint(err, "run ucx_info -d to check UCX's transports");
        return KVL_ERR_SYSTEM;
    }
    return KVL_OK;
}

/* Destroy every UCX object in the only safe order: transfers failed, rkeys,
 * endpoints (bounded), mapped regions, worker, context. Idempotent. */
static void kvli_ucx_iface_teardown(kvli_ucx_iface_t *iface)
{
    if (iface->closed)
        return;
    iface->closed = 1;
    kvli_progress_stop(&iface->pg);
    if (iface->worker != NULL) {
        /* live peers get a flush first, all of them together within
         * KVLI_UCX_EXIT_FLUSH_MS (a connection still being set up then
         * finishes instead of leaving the peer's UCX to complain) */
        uint64_t flush_until = kvli_clock_ms() + KVLI_UCX_EXIT_FLUSH_MS;
        kvli_ucx_xfer_fail_all(iface, "the ucx backend is closing");
        for (kvli_ucx_peer_t *p = iface->peers; p != NULL; p = p->next) {
            for (kvli_ucx_rh_t *rh = p->rhs; rh != NULL; rh = rh->next)
                if (rh->rkey != NULL) {
                    ucp_rkey_destroy(rh->rkey);
                    rh->rkey = NULL;
                }
            /* then forced: what was in flight was just failed, and a flush
             * to a peer that exited would wait for UCX's keepalive */
            kvli_ucx_ep_destroy(iface, p, flush_until);
        }
        kvli_ucx_dw_reap(iface, 1);
    }
    kvli_ucx_linger_sweep(iface, 1); /* the workers are gone: nothing lands any more */
    if (iface->worker != NULL)
        kvli_ucx_stage_release_descs(iface);
    while (iface->mhs != NULL)
        kvli_ucx_md_unmap(iface, iface->mhs);
    /* after the regions that use their memh, before the worker and context */
    while (iface->allocs != NULL)
        kvli_ucx_md_alloc_unmap(iface, iface->allocs);
    if (iface->addr != NULL)
        ucp_worker_release_address(iface->worker, iface->addr);
    iface->addr = NULL;
    if (iface->worker != NULL)
        ucp_worker_destroy(iface->worker);
    iface->worker = NULL;
    kvli_ucx_stage_free_all(iface); /* no UCX callback can run any more */
    kvli_ucx_notif_free_all(iface);
    if (iface->context != NULL)
        ucp_cleanup(iface->context);
    iface->context = NULL;
}

static void kvli_ucx_live_remove(kvli_ucx_iface_t *iface)
{
    pthread_mutex_lock(&kvli_ucx_live_lock);
    for (kvli_ucx_iface_t **pp = &kvli_ucx_live; *pp != NULL; pp = &(*pp)->next_live)
        if (*pp == iface) {
            *pp = iface->next_live;
            break;
        }
    pthread_mutex_unlock(&kvli_ucx_live_lock);
}

/* Process exit with agents alive: unmap everything before libucp's own
 * destructors run (this module depends on libucp, so ours run first). */
static void kvli_ucx_exit(void) __attribute__((destructor));
static void kvli_ucx_exit(void)
{
    pthread_mutex_lock(&kvli_ucx_live_lock);
    for (kvli_ucx_iface_t *i = kvli_ucx_live; i != NULL; i = i->next_live)
        kvli_ucx_iface_teardown(i);
    pthread_mutex_unlock(&kvli_ucx_live_lock);
}

/* Also run as an exit handler: registered at the first open, it runs
 * before handlers registered earlier at program start (LeakSanitizer's
 * check among them), while UCX is still intact. */
static pthread_once_t kvli_ucx_atexit_once = PTHREAD_ONCE_INIT;
static void kvli_ucx_atexit_register(void)
{
    atexit(kvli_ucx_exit);
}

static void kvli_ucx_close(void *bk)
{
    kvli_ucx_iface_t *iface = bk;
    if (iface == NULL)
        return;
    kvli_ucx_live_remove(iface);
    kvli_ucx_iface_teardown(iface);
    for (kvli_ucx_peer_t *p = iface->peers, *np; p != NULL; p = np) {
        np = p->next;
        for (kvli_ucx_rh_t *rh = p->rhs, *nr; rh != NULL; rh = nr) {
            nr = rh->next;
            free(rh);
        }
        free(p);
    }
    /* their workers are destroyed: no callback can take them any more */
    for (kvli_ucx_peer_t *p = iface->zombies, *np; p != NULL; p = np) {
        np = p->next;
        free(p);
    }
    free(iface->pw);
    free(iface->pw_efd);
    kvli_progress_close(&iface->pg);
    pthread_cond_destroy(&iface->cond);
    pthread_mutex_destroy(&iface->lock);
    free(iface);
}

static kvl_status_t kvli_ucx_open(kvl_bk_ctx_t *ctx, const kvl_param_t *params, size_t n,
                                  void **bk_p, kvl_error_t *err)
{
    kvli_ucx_iface_t *iface;
    const char *tls, *dev;
    kvl_status_t st;

    iface = kvli_iface_new(ctx, bk_p, KVLI_UCX_NAME, sizeof(*iface), &st, err);
    if (iface == NULL)
        return st;
    iface->ctx = ctx;
    iface->timeout_ms = ctx->timeout_ms ? ctx->timeout_ms : KVLI_UCX_DEFAULT_TIMEOUT_MS;
    iface->efd = -1;
    kvli_progress_init(&iface->pg, ctx, KVLI_UCX_NAME);
    kvli_bounce_init(&iface->bounce, ctx, KVLI_UCX_NAME, KVLI_UCX_STAGE_CHUNK, KVLI_UCX_STAGE_BUFS,
                     KVLI_UCX_STAGE_INIT_BUFS, 1);
    kvli_lock_init(&iface->lock, &iface->cond);

    st = kvli_ucx_parse_params(iface, params, n, &tls, &dev, err);
    if (st != KVL_OK)
        goto err_close;
    st = kvli_ucx_context_open(iface, tls, dev, err);
    if (st != KVL_OK)
        goto err_close;
    st = kvli_ucx_worker_open(iface, err);
    if (st != KVL_OK)
        goto err_close;
    st = kvli_progress_open(&iface->pg, err);
    if (st != KVL_OK)
        goto err_close;
    st = kvli_progress_start(&iface->pg, &kvli_ucx_progress_ops, iface, err);
    if (st != KVL_OK)
        goto err_close;
    if (iface->data_path_am)
        kvli_ucx_stage_expect(iface);
    pthread_once(&kvli_ucx_atexit_once, kvli_ucx_atexit_register);
    pthread_mutex_lock(&kvli_ucx_live_lock);
    iface->next_live = kvli_ucx_live;
    kvli_ucx_live = iface;
    pthread_mutex_unlock(&kvli_ucx_live_lock);
    ctx->log(ctx, KVL_LOG_DEBUG, "UCP context up: transports %s, worker address %zu bytes, "
             "event fd %d", iface->transports, iface->addr_len, iface->efd);
    *bk_p = iface;
    return KVL_OK;

err_close:
    kvli_ucx_close(iface);
    return st;
}

static const kvl_backend_ops_t kvli_ucx_ops = {
    .abi_version = KVL_BACKEND_ABI_VERSION,
    .size = sizeof(kvl_backend_ops_t),
    .name = KVLI_UCX_NAME,
    .description = "UCX UCP: RDMA, shared memory or TCP, whichever UCX selects; VRAM "
                   "directly when UCX was built with CUDA, else staged through host memory",
    .mem_local = KVL_MEM_BIT(KVL_MEM_DRAM) | KVL_MEM_BIT(KVL_MEM_VRAM),
    .mem_remote = KVL_MEM_BIT(KVL_MEM_DRAM) | KVL_MEM_BIT(KVL_MEM_VRAM),
    /* STAGED_VRAM: a UCX without CUDA stages VRAM, so a backend that reaches
     * VRAM directly (cuda) is tried first */
    .caps = KVL_BK_CAP_NOTIF | KVL_BK_CAP_STAGED_VRAM | KVL_BK_CAP_INDEXED,
    .params = kvli_ucx_params,
    .available = kvli_ucx_available,
    .open = kvli_ucx_open,
    .close = kvli_ucx_close,
    .mem_reg = kvli_ucx_md_reg,
    .mem_dereg = kvli_ucx_md_dereg,
    .conn_pack = kvli_ucx_ep_conn_pack,
    .region_pack = kvli_ucx_md_pack,
    .peer_load = kvli_ucx_ep_load,
    .peer_unload = kvli_ucx_ep_unload,
    .rregion_load = kvli_ucx_md_rload,
    .rregion_unload = kvli_ucx_md_runload,
    .xfer_post = kvli_ucx_xfer_post,
    .xfer_cancel = kvli_ucx_xfer_cancel,
    .xfer_abort = kvli_ucx_xfer_abort,
    .notif_send = kvli_ucx_notif_send,
    .peer_describe = kvli_ucx_ep_describe,
    .device = NULL,
    .probe = kvli_ucx_probe,
    .xfer_release = NULL,
    .mem_alloc = kvli_ucx_md_alloc,
    .mem_free = kvli_ucx_md_free,
};

const kvl_backend_ops_t *kvl_backend_module_v1(void) __attribute__((visibility("default")));
const kvl_backend_ops_t *kvl_backend_module_v1(void)
{
    return &kvli_ucx_ops;
}
