/*
 * kvlane ucx backend: endpoints. Our connection info is the UCP worker
 * address (plus the transports we offer, for diagnoses); peer_load creates
 * an endpoint with peer error handling on the current data worker, so a
 * dead peer fails transfers instead of hanging them. Unload has the
 * progress thread flush (bounded) and close the endpoint; a data worker
 * that carried a dead peer is retired and destroyed once empty, which frees
 * everything UCX kept for the dead (ucx.h says why).
 *
 * Connection info (native byte order, version 2: notifications are
 * answered; a peer of version 1 is refused at load, both versions named):
 *   0 magic u32 | 4 version u16 | 6 flags u16 (bit 0: peer error handling)
 *   8 incarnation u64 | 16 pid u32 | 20 address length u32
 *  24 transports length u16 | 26 reserved u16 | 28 crc32 of the address u32
 *  32 transports (text, no NUL) | then the worker address
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ucx.h"

#define KVLI_UCX_CONN_MAGIC 0x43554c4bu  /* "KLUC" */
#define KVLI_UCX_CONN_VERSION 2u
#define KVLI_UCX_CONN_FIXED 32u

uint32_t kvli_ucx_crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

kvl_status_t kvli_ucx_ep_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p)
{
    kvli_ucx_iface_t *iface = bk;
    uint32_t magic = KVLI_UCX_CONN_MAGIC, pid = (uint32_t)getpid(), al, crc;
    uint16_t ver = KVLI_UCX_CONN_VERSION, flags = (uint16_t)(iface->err_mode_peer ? 1 : 0);
    uint16_t tl = (uint16_t)strlen(iface->tls_list), rsv = 0;
    size_t need = KVLI_UCX_CONN_FIXED + tl + iface->addr_len;
    if (iface->addr == NULL || cap < need)
        return KVL_ERR_INVALID_ARG;
    al = (uint32_t)iface->addr_len;
    crc = kvli_ucx_crc32((const uint8_t *)iface->addr, iface->addr_len);
    memcpy(buf + 0, &magic, 4);
    memcpy(buf + 4, &ver, 2);
    memcpy(buf + 6, &flags, 2);
    memcpy(buf + 8, &iface->ctx->incarnation, 8);
    memcpy(buf + 16, &pid, 4);
    memcpy(buf + 20, &al, 4);
    memcpy(buf + 24, &tl, 2);
    memcpy(buf + 26, &rsv, 2);
    memcpy(buf + 28, &crc, 4);
    memcpy(buf + KVLI_UCX_CONN_FIXED, iface->tls_list, tl);
    memcpy(buf + KVLI_UCX_CONN_FIXED + tl, iface->addr, iface->addr_len);
    *len_p = need;
    return KVL_OK;
}

/* UCX calls this (inside ucp_worker_progress) when the endpoint fails:
 * record it; the progress thread fails the peer's transfers. */
void kvli_ucx_peer_mark_dead(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                             ucs_status_t status, const char *what)
{
    /* whatever UCX keeps of this endpoint stays until its worker goes: no
     * new peer joins that worker (the restarted incarnation gets a fresh one) */
    if (peer->dw != NULL) {
        peer->dw->retired = 1;
        if (iface->dw_cur == peer->dw)
            iface->dw_cur = NULL;
        atomic_store(&iface->sweep, 1);
    }
    if (!peer->dead) {
        peer->dead = 1;
        peer->dead_status = status;
        snprintf(peer->dead_what, sizeof(peer->dead_what), "%s", what);
    }
}

static void kvli_ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvli_ucx_peer_t *peer = arg;
    kvli_ucx_iface_t *iface = peer->iface;
    char what[200];
    (void)ep;
    snprintf(what, sizeof(what), "UCX reported the endpoint to agent '%.60s' failed: %s",
             peer->name, ucs_status_string(status));
    pthread_mutex_lock(&iface->lock);
    kvli_ucx_peer_mark_dead(iface, peer, status, what);
    pthread_mutex_unlock(&iface->lock);
    kvli_progress_wake(&iface->pg);
}

static kvl_status_t kvli_ucx_conn_bad(kvl_error_t *err, const char *name, const char *why)
{
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_UCX_NAME, -1,
                     "ucx connection info of agent '%.60s' is invalid: %s", name, why);
    kvl_bk_error_hint(err, "the metadata is corrupted or comes from an incompatible kvlane; "
                      "fetch it again from the agent");
    return KVL_ERR_BAD_METADATA;
}

/* The current data worker, one more peer on it (a new one when there is
 * none: at the first peer, or after its predecessor was retired). */
static kvli_ucx_dw_t *kvli_ucx_dw_get(kvli_ucx_iface_t *iface, kvl_error_t *err)
{
    kvli_ucx_dw_t *dw, *fresh, *extra = NULL;

    pthread_mutex_lock(&iface->lock);
    dw = iface->dw_cur;
    if (dw != NULL)
        dw->peers++;
    pthread_mutex_unlock(&iface->lock);
    if (dw != NULL)
        return dw;
    fresh = calloc(1, sizeof(*fresh));
    if (fresh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return NULL;
    }
    if (kvli_ucx_worker_new(iface, 0, &fresh->worker, &fresh->efd, err) != KVL_OK) {
        free(fresh);
        return NULL;
    }
    pthread_mutex_lock(&iface->lock);
    if (iface->dw_cur == NULL) {
        fresh->next = iface->dws;
        iface->dws = fresh;
        iface->dw_cur = fresh;
    } else {
        extra = fresh; /* another thread made one meanwhile */
    }
    dw = iface->dw_cur;
    dw->peers++;
    pthread_mutex_unlock(&iface->lock);
    if (extra != NULL) { /* never progressed, no endpoint: nothing to wait for */
        ucp_worker_destroy(extra->worker);
        free(extra);
    }
    return dw;
}

kvl_status_t kvli_ucx_ep_load(void *bk, const char *name, uint64_t incarnation,
                              const uint8_t *conn, size_t len, void **peer_p, kvl_error_t *err)
{
    kvli_ucx_iface_t *iface = bk;
    uint32_t magic, pid, al, crc;
    uint16_t ver, flags, tl;
    uint64_t inc;
    ucp_ep_params_t ep;
    kvli_ucx_peer_t *peer;
    kvli_ucx_log_t log;
    uint8_t *addr;
    char why[160];
    ucs_status_t s;

    if (name == NULL)
        name = "?";
    if (iface->config_bad && iface->missing_refuse) {
        memcpy(err, &iface->config_err, offsetof(kvl_error_t, causes));
        return iface->config_err.code;
    }
    if (conn == NULL || len < KVLI_UCX_CONN_FIXED) {
        snprintf(why, sizeof(why), "%zu bytes, at least %u expected", len, KVLI_UCX_CONN_FIXED);
        return kvli_ucx_conn_bad(err, name, why);
    }
    memcpy(&magic, conn, 4);
    memcpy(&ver, conn + 4, 2);
    memcpy(&flags, conn + 6, 2);
    memcpy(&inc, conn + 8, 8);
    memcpy(&pid, conn + 16, 4);
    memcpy(&al, conn + 20, 4);
    memcpy(&tl, conn + 24, 2);
    memcpy(&crc, conn + 28, 4);
    if (magic != KVLI_UCX_CONN_MAGIC || ver != KVLI_UCX_CONN_VERSION) {
        snprintf(why, sizeof(why), "magic 0x%08x version %u (want 0x%08x version %u)", magic,
                 ver, KVLI_UCX_CONN_MAGIC, KVLI_UCX_CONN_VERSION);
        return kvli_ucx_conn_bad(err, name, why);
    }
    if (al == 0 || tl > 255 || (size_t)KVLI_UCX_CONN_FIXED + tl + al != len) {
        snprintf(why, sizeof(why), "lengths (transports %u, address %u) do not add up to the "
                 "%zu bytes carried", tl, al, len);
        return kvli_ucx_conn_bad(err, name, why);
    }
    if (inc != incarnation) {
        snprintf(why, sizeof(why), "incarnation %016llx, the metadata says %016llx",
                 (unsigned long long)inc, (unsigned long long)incarnation);
        return kvli_ucx_conn_bad(err, name, why);
    }
    for (uint16_t i = 0; i < tl; i++)
        if (conn[KVLI_UCX_CONN_FIXED + i] < 0x20 || conn[KVLI_UCX_CONN_FIXED + i] > 0x7e)
            return kvli_ucx_conn_bad(err, name, "transport list is not printable text");
    if (kvli_ucx_crc32(conn + KVLI_UCX_CONN_FIXED + tl, al) != crc)
        return kvli_ucx_conn_bad(err, name, "worker address checksum mismatch");

    peer = calloc(1, sizeof(*peer));
    /* UCX's address unpack takes no length: zeros behind the bytes keep a
     * short address from making it read past our buffer. */
    addr = calloc(1, (size_t)al + KVLI_UCX_PAD);
    if (peer == NULL || addr == NULL) {
        free(peer);
        free(addr);
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_UCX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    memcpy(addr, conn + KVLI_UCX_CONN_FIXED + tl, al);
    peer->iface = iface;
    snprintf(peer->name, sizeof(peer->name), "%.63s", name);
    peer->incarnation = incarnation;
    peer->pid = pid;
    memcpy(peer->remote_tls, conn + KVLI_UCX_CONN_FIXED, tl);
    peer->remote_tls[tl] = '\0';

    atomic_init(&peer->heard_ms, kvli_clock_ms());
    atomic_init(&peer->rma_out, 0);
    peer->dw = kvli_ucx_dw_get(iface, err);
    if (peer->dw == NULL) {
        free(addr);
        free(peer);
        return err->code;
    }
    peer->worker = peer->dw->worker;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME;
    ep.address = (const ucp_address_t *)addr;
    ep.err_mode = iface->err_mode_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = kvli_ucx_ep_err_cb;
    ep.err_handler.arg = peer;
    ep.name = peer->name;
    kvli_ucx_log_begin(&log);
    s = ucp_ep_create(peer->worker, &ep, &peer->ep);
    kvli_ucx_log_end();
    free(addr);
    if (s != UCS_OK) {
        peer->ep = NULL;
        kvli_ucx_diag_unreachable(iface, peer, s, &log, err);
        pthread_mutex_lock(&iface->lock);
        peer->dw->peers--; /* the progress thread reaps it if retired */
        pthread_mutex_unlock(&iface->lock);
        atomic_store(&iface->sweep, 1);
        free(peer);
        return err->code;
    }
    pthread_mutex_lock(&iface->lock);
    peer->next = iface->peers;
    iface->peers = peer;
    pthread_mutex_unlock(&iface->lock);
    atomic_store(&iface->sweep, 1); /* a new data worker joins the next turn */
    kvli_progress_wake(&iface->pg);
    *peer_p = peer;
    return KVL_OK;
}

static void kvli_ucx_deadline(struct timespec *dl, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, dl);
    dl->tv_sec += (time_t)(ms / 1000u);
    dl->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (dl->tv_nsec >= 1000000000L) {
        dl->tv_sec++;
        dl->tv_nsec -= 1000000000L;
    }
}

/* Bound on a forced close: UCX completes it at the next progress; only a
 * UCX that misbehaves reaches this. */
#define KVLI_UCX_CLOSE_MS 1000u

void kvli_ucx_ep_destroy(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                         uint64_t flush_until_ms)
{
    ucp_request_param_t rp;
    void *req = NULL;
    uint64_t end;
    int dead, zombie = 0;

    if (peer->worker == NULL)
        return;
    if (peer->close_req != NULL) { /* a closing flush the sweep started */
        ucp_request_free(peer->close_req);
        peer->close_req = NULL;
    }
    pthread_mutex_lock(&iface->lock);
    dead = peer->dead;
    pthread_mutex_unlock(&iface->lock);
    if (peer->ep != NULL && !dead && kvli_clock_ms() < flush_until_ms) {
        memset(&rp, 0, sizeof(rp));
        req = ucp_ep_flush_nbx(peer->ep, &rp);
        if (req != NULL && !UCS_PTR_IS_ERR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS &&
                   kvli_clock_ms() < flush_until_ms)
                ucp_worker_progress(peer->worker);
            peer->close_clean = ucp_request_check_status(req) == UCS_OK;
            ucp_request_free(req); /* the forced close below ends it if need be */
        } else {
            peer->close_clean = req == NULL;
        }
        req = NULL;
    }
    if (peer->ep != NULL) {
        memset(&rp, 0, sizeof(rp));
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
        req = ucp_ep_close_nbx(peer->ep, &rp);
        peer->ep = NULL;
    }
    if (UCS_PTR_IS_ERR(req)) {
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "ucp_ep_close_nbx(agent '%s') = %s",
                        peer->name, ucs_status_string(UCS_PTR_STATUS(req)));
    } else if (req != NULL) {
        end = kvli_clock_ms() + KVLI_UCX_CLOSE_MS;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && kvli_clock_ms() < end)
            ucp_worker_progress(peer->worker);
        if (ucp_request_check_status(req) == UCS_INPROGRESS) {
            iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "closing the endpoint to agent '%s' "
                            "did not finish within %u ms; its worker is retired", peer->name,
                            KVLI_UCX_CLOSE_MS);
            zombie = 1; /* its error callback may still come */
        }
        ucp_request_free(req);
    }
    if (atomic_load(&peer->rma_out) != 0) {
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "endpoint to agent '%s' closed with %u "
                        "puts/gets still held by UCX; its worker is retired", peer->name,
                        atomic_load(&peer->rma_out));
        zombie = 1; /* their callback takes the peer */
    }
    pthread_mutex_lock(&iface->lock);
    if (zombie) {
        peer->zombie = 1;
        peer->close_clean = 0;
    }
    if (!peer->close_clean) {
        peer->dw->retired = 1;
        if (iface->dw_cur == peer->dw)
            iface->dw_cur = NULL;
    }
    peer->dw->peers--;
    pthread_mutex_unlock(&iface->lock);
    peer->worker = NULL;
}

void kvli_ucx_dw_reap(kvli_ucx_iface_t *iface, int all)
{
    kvli_ucx_dw_t *dead = NULL, *dw;
    kvli_ucx_log_t log;

    pthread_mutex_lock(&iface->lock);
    for (kvli_ucx_dw_t **pp = &iface->dws; (dw = *pp) != NULL;) {
        if (all || (dw->retired && dw->peers == 0)) {
            *pp = dw->next;
            dw->next = dead;
            dead = dw;
            if (iface->dw_cur == dw)
                iface->dw_cur = NULL;
        } else {
            pp = &dw->next;
        }
    }
    pthread_mutex_unlock(&iface->lock);
    while ((dw = dead) != NULL) {
        dead = dw->next;
        kvli_ucx_stage_worker_release(iface, dw->worker);
        /* What UCX says here is about what dead peers left behind
         * ("canceling user pending request", "not all pending operations
         * were flushed"): ours to know, not the user's. */
        kvli_ucx_log_begin(&log);
        ucp_worker_destroy(dw->worker);
        kvli_ucx_log_end();
        if (log.lines != 0)
            iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "destroyed a retired data worker: UCX "
                            "said \"%s\"", log.text);
        kvli_ucx_stage_worker_gone(iface, dw->worker);
        free(dw);
    }
}

/* A closing peer not known dead gets a flush first, so a connection still
 * being set up finishes before it is cut (else the peer's UCX, finding our
 * side gone mid-setup, logs errors); the flush is followed turn by turn,
 * never waited for: at most KVLI_UCX_CLOSE_FLUSH_MS, less once UCX reports
 * the peer dead (the old incarnation of a restarted peer usually is). */
int kvli_ucx_peers_sweep(kvli_ucx_iface_t *iface)
{
    kvli_ucx_peer_t *closing = NULL, *p;
    uint64_t now;
    size_t n = 0;
    int pending = 0, gone = 0;

    /* only when something changed (or a closing flush runs): the progress
     * loop spins through here while transfers move */
    if (!atomic_exchange(&iface->sweep, 0))
        return 0;
    now = kvli_clock_ms();

    pthread_mutex_lock(&iface->lock);
    for (p = iface->peers; p != NULL; p = p->next)
        if (p->closing) {
            p->close_dead = p->dead;
            p->close_next = closing;
            closing = p;
        }
    pthread_mutex_unlock(&iface->lock);
    /* only this thread unlinks peers: those listed stay valid */
    for (p = closing; p != NULL; p = p->close_next) {
        if (p->close_state == 0) {
            void *req = NULL;
            if (p->ep != NULL && !p->close_dead) {
                ucp_request_param_t rp;
                memset(&rp, 0, sizeof(rp));
                req = ucp_ep_flush_nbx(p->ep, &rp);
            }
            if (req != NULL && !UCS_PTR_IS_ERR(req)) {
                p->close_req = req;
                p->close_until = now + KVLI_UCX_CLOSE_FLUSH_MS;
                p->close_state = 1;
            } else {
                p->close_clean = req == NULL && p->ep != NULL && !p->close_dead;
                p->close_state = 2;
            }
        }
        if (p->close_state == 1 &&
            (p->close_dead || now >= p->close_until ||
             ucp_request_check_status(p->close_req) != UCS_INPROGRESS)) {
            p->close_clean = !p->close_dead &&
                             ucp_request_check_status(p->close_req) == UCS_OK;
            ucp_request_free(p->close_req); /* the forced close ends it if need be */
            p->close_req = NULL;
            p->close_state = 2;
        }
        if (p->close_state == 2) {
            kvli_ucx_ep_destroy(iface, p, 0);
            p->close_state = 3;
            gone++;
        } else {
            pending = 1;
        }
    }
    pthread_mutex_lock(&iface->lock);
    for (kvli_ucx_peer_t **pp = &iface->peers; (p = *pp) != NULL;) {
        if (p->close_state == 3) {
            *pp = p->next;
            p->next = NULL;
            if (p->zombie) { /* freed when the backend closes */
                p->next = iface->zombies;
                iface->zombies = p;
            }
            p->gone = 1; /* the unloader frees it from here on, unless a zombie */
        } else {
            n++;
            pp = &p->next;
        }
    }
    if (gone)
        pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    kvli_ucx_dw_reap(iface, 0);
    pthread_mutex_lock(&iface->lock);
    n = 0;
    for (kvli_ucx_dw_t *dw = iface->dws; dw != NULL; dw = dw->next)
        n++;
    if (n > iface->pw_cap) {
        size_t cap = n * 2;
        ucp_worker_h *pw = realloc(iface->pw, cap * sizeof(*pw));
        if (pw != NULL)
            iface->pw = pw;
        int *pe = realloc(iface->pw_efd, cap * sizeof(*pe));
        if (pe != NULL)
            iface->pw_efd = pe;
        if (pw != NULL && pe != NULL)
            iface->pw_cap = cap;
    }
    /* retired ones too: their peers (and closing flushes) must move */
    iface->pw_n = 0;
    for (kvli_ucx_dw_t *dw = iface->dws; dw != NULL && iface->pw_n < iface->pw_cap;
         dw = dw->next) {
        iface->pw[iface->pw_n] = dw->worker;
        iface->pw_efd[iface->pw_n] = dw->efd;
        iface->pw_n++;
    }
    pthread_mutex_unlock(&iface->lock);
    if (pending)
        atomic_store(&iface->sweep, 1);
    return pending;
}

void kvli_ucx_ep_unload(void *bk, void *peerv)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_peer_t *peer = peerv;
    struct timespec dl;
    int gone = 0, inline_close = 0, zombie = 0;

    if (peer == NULL)
        return;
    kvli_ucx_xfer_cancel_peer(iface, peer);
    /* rkeys before the endpoint (the core unloaded them already; this only
     * guards against a leak) */
    for (kvli_ucx_rh_t *rh = peer->rhs, *nr; rh != NULL; rh = nr) {
        nr = rh->next;
        if (rh->rkey != NULL)
            ucp_rkey_destroy(rh->rkey);
        free(rh);
    }
    peer->rhs = NULL;
    /* The progress thread progresses the data workers: it closes it. */
    kvli_ucx_deadline(&dl, 2 * iface->timeout_ms + 1000);
    pthread_mutex_lock(&iface->lock);
    if (iface->pg.started && !kvli_progress_stopping(&iface->pg)) {
        peer->closing = 1;
        pthread_mutex_unlock(&iface->lock);
        atomic_store(&iface->sweep, 1);
        kvli_progress_wake(&iface->pg);
        pthread_mutex_lock(&iface->lock);
        while (!peer->gone && !kvli_progress_stopping(&iface->pg) &&
               pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) != ETIMEDOUT)
            ;
        gone = peer->gone && !peer->zombie;
        zombie = peer->zombie;
    } else {
        for (kvli_ucx_peer_t **pp = &iface->peers; *pp != NULL; pp = &(*pp)->next)
            if (*pp == peer) {
                *pp = peer->next;
                break;
            }
        inline_close = 1;
    }
    pthread_mutex_unlock(&iface->lock);
    if (inline_close) {
        kvli_ucx_ep_destroy(iface, peer, 0);
        pthread_mutex_lock(&iface->lock);
        zombie = peer->zombie;
        if (zombie) {
            peer->next = iface->zombies;
            iface->zombies = peer;
        }
        pthread_mutex_unlock(&iface->lock);
        kvli_ucx_dw_reap(iface, 0);
        gone = !zombie;
    }
    if (gone)
        free(peer);
    else if (!zombie) /* still on iface->peers: the backend's close frees it */
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "closing the endpoint to agent '%s' did "
                        "not finish within %llu ms; leaving it to the backend's close",
                        peer->name, (unsigned long long)(2 * iface->timeout_ms + 1000));
}

void kvli_ucx_ep_describe(void *bk, void *peerv, char *buf, size_t len)
{
    kvli_ucx_iface_t *iface = bk;
    kvli_ucx_peer_t *peer = peerv;
    pthread_mutex_lock(&iface->lock);
    if (peer->dead)
        snprintf(buf, len, "UCP endpoint (dead: %.200s)", peer->dead_what);
    else
        snprintf(buf, len, "UCP endpoint over %.100s (peer offers %.100s)%s", iface->tls_list,
                 peer->remote_tls, iface->err_mode_peer ? ", peer error handling" : "");
    pthread_mutex_unlock(&iface->lock);
}
