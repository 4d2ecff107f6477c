/* Notifications: received messages queue on the agent in arrival order. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"

/* The sender's entry (created when create), under notif_lock. */
static kvli_notif_src_t *kvli_notif_src(kvl_agent_t *a, const char *from, int create)
{
    kvli_notif_src_t *s;
    for (s = a->nsrcs; s != NULL; s = s->next)
        if (strcmp(s->name, from) == 0)
            return s;
    if (!create || (s = calloc(1, sizeof(*s))) == NULL)
        return NULL;
    kvli_scopy(s->name, sizeof(s->name), from);
    s->next = a->nsrcs;
    a->nsrcs = s;
    return s;
}

/* One of s's notifications left the queue (or never entered it). */
static void kvli_notif_src_put(kvl_agent_t *a, kvli_notif_src_t *s, uint64_t msgs, uint64_t len)
{
    kvli_notif_src_t **pp;
    s->msgs -= msgs;
    s->bytes -= len;
    if (s->msgs > 0 || s->res_msgs > 0)
        return;
    for (pp = &a->nsrcs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            free(s);
            return;
        }
}

/* n (from s) joins the queue; under notif_lock. */
static void kvli_notif_append(kvl_agent_t *a, kvli_notif_t *n, kvli_notif_src_t *s,
                              const void *msg, size_t len)
{
    n->next = NULL;
    n->src = s;
    kvli_scopy(n->from, sizeof(n->from), s->name);
    n->len = len;
    if (len)
        memcpy(n->msg, msg, len);
    n->msg[len] = '\0';
    s->msgs++;
    s->bytes += len;
    a->nq_msgs++;
    a->nq_bytes += len;
    if (a->ntail)
        a->ntail->next = n;
    else
        a->nhead = n;
    a->ntail = n;
    pthread_cond_broadcast(&a->notif_cond);
}

/*
 * Queue a received notification within the agent's bound and the sender's
 * share of it. The bound is on what the application has not taken yet:
 * past it, the notification is refused (why says so, for the sender), never
 * dropped silently and never held beyond the bound.
 */
kvl_status_t kvli_notif_offer(kvl_bk_ctx_t *ctx, const char *from, const void *msg, size_t len,
                              char *why, size_t why_len)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    kvli_notif_t *n = malloc(sizeof(*n) + len + 1);
    kvli_notif_src_t *s = NULL;
    if (from == NULL)
        from = "";
    pthread_mutex_lock(&a->notif_lock);
    if (n != NULL && (a->nq_msgs + a->nq_res_msgs + 1 > a->nq_max_msgs ||
                      a->nq_bytes + a->nq_res_bytes + len > a->nq_max_bytes)) {
        uint64_t msgs = a->nq_msgs, bytes = a->nq_bytes, rm = a->nq_res_msgs;
        uint64_t rb = a->nq_res_bytes;
        a->nq_refused++;
        pthread_mutex_unlock(&a->notif_lock);
        free(n);
        if (why != NULL && why_len > 0) {
            char res[80] = "";
            if (rm > 0)
                snprintf(res, sizeof(res), " (+%" PRIu64 " and %" PRIu64 " bytes granted to "
                         "peers)", rm, rb);
            snprintf(why, why_len, "agent '%s' holds %" PRIu64 " notifications (%" PRIu64
                     " bytes) its application has not taken%s; its bound is %" PRIu64
                     " notifications or %" PRIu64 " bytes: no room for %zu bytes more",
                     a->name, msgs, bytes, res, a->nq_max_msgs, a->nq_max_bytes, len);
        }
        return KVL_ERR_REMOTE_FULL;
    }
    if (n != NULL)
        s = kvli_notif_src(a, from, 1);
    if (s != NULL && (s->msgs + s->res_msgs + 1 > a->nq_peer_msgs ||
                      s->bytes + s->res_bytes + len > a->nq_peer_bytes)) {
        uint64_t msgs = s->msgs, bytes = s->bytes;
        a->nq_refused++;
        kvli_notif_src_put(a, s, 0, 0);
        pthread_mutex_unlock(&a->notif_lock);
        free(n);
        if (why != NULL && why_len > 0)
            snprintf(why, why_len, "agent '%s' holds %" PRIu64 " notifications (%" PRIu64
                     " bytes) from you its application has not taken; one peer's share is %"
                     PRIu64 " notifications or %" PRIu64 " bytes (%u%% of its bound)", a->name,
                     msgs, bytes, a->nq_peer_msgs, a->nq_peer_bytes, a->nq_peer_pct);
        return KVL_ERR_REMOTE_FULL;
    }
    if (s == NULL) {
        a->nq_refused++;
        pthread_mutex_unlock(&a->notif_lock);
        free(n);
        if (why != NULL && why_len > 0)
            snprintf(why, why_len, "agent '%s' is out of memory: malloc(%zu) of a "
                     "notification failed", a->name, sizeof(*n) + len + 1);
        return KVL_ERR_NO_MEMORY;
    }
    kvli_notif_append(a, n, s, msg, len);
    pthread_mutex_unlock(&a->notif_lock);
    return KVL_OK;
}

/* A peer's grant: 256 slots, and at most 1/256 of either bound. */
#define KVLI_NOTIF_GRANT_MAX 256u
#define KVLI_NOTIF_GRANT_SHARE 256u

uint32_t kvli_notif_reserve(kvl_bk_ctx_t *ctx, const char *from, uint32_t held,
                            size_t slot_len)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    kvli_notif_src_t *s;
    uint64_t k, n, room_m, room_b, pm, pb;
    if (slot_len == 0)
        return 0;
    pthread_mutex_lock(&a->notif_lock);
    k = KVLI_NOTIF_GRANT_MAX;
    if (k > a->nq_max_msgs / KVLI_NOTIF_GRANT_SHARE)
        k = a->nq_max_msgs / KVLI_NOTIF_GRANT_SHARE;
    if (k > a->nq_max_bytes / KVLI_NOTIF_GRANT_SHARE / slot_len)
        k = a->nq_max_bytes / KVLI_NOTIF_GRANT_SHARE / slot_len;
    n = k > held ? k - held : 0;
    /* within the room left, and within the peer's share (what it holds and
     * may still send within its grant) */
    room_m = a->nq_max_msgs - a->nq_msgs - a->nq_res_msgs;
    room_b = (a->nq_max_bytes - a->nq_bytes - a->nq_res_bytes) / slot_len;
    (void)held; /* the core counts each peer's grant itself */
    if ((s = kvli_notif_src(a, from ? from : "", 1)) == NULL) {
        pthread_mutex_unlock(&a->notif_lock);
        return 0;
    }
    pm = s->msgs + s->res_msgs;
    pb = s->bytes + s->res_bytes;
    room_m = room_m < (pm < a->nq_peer_msgs ? a->nq_peer_msgs - pm : 0)
                 ? room_m : (pm < a->nq_peer_msgs ? a->nq_peer_msgs - pm : 0);
    room_b = room_b < (pb < a->nq_peer_bytes ? (a->nq_peer_bytes - pb) / slot_len : 0)
                 ? room_b : (pb < a->nq_peer_bytes ? (a->nq_peer_bytes - pb) / slot_len : 0);
    if (n > room_m)
        n = room_m;
    if (n > room_b)
        n = room_b;
    a->nq_res_msgs += n;
    a->nq_res_bytes += n * slot_len;
    s->res_msgs += n;
    s->res_bytes += n * slot_len;
    kvli_notif_src_put(a, s, 0, 0); /* gone again when it holds nothing */
    pthread_mutex_unlock(&a->notif_lock);
    return (uint32_t)n;
}

/* n slots of s's grant (n <= what it holds) leave the reservation. */
static void kvli_notif_res_drop(kvl_agent_t *a, kvli_notif_src_t *s, uint64_t n, size_t slot_len)
{
    if (n > s->res_msgs)
        n = s->res_msgs;
    s->res_msgs -= n;
    s->res_bytes -= n * slot_len <= s->res_bytes ? n * slot_len : s->res_bytes;
    a->nq_res_msgs -= n <= a->nq_res_msgs ? n : a->nq_res_msgs;
    a->nq_res_bytes -= n * slot_len <= a->nq_res_bytes ? n * slot_len : a->nq_res_bytes;
}

void kvli_notif_unreserve(kvl_bk_ctx_t *ctx, const char *from, uint32_t slots, size_t slot_len)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    kvli_notif_src_t *s;
    pthread_mutex_lock(&a->notif_lock);
    if ((s = kvli_notif_src(a, from ? from : "", 0)) != NULL) {
        kvli_notif_res_drop(a, s, slots, slot_len);
        kvli_notif_src_put(a, s, 0, 0);
    }
    pthread_mutex_unlock(&a->notif_lock);
}

/* A notification in a slot reserved for its sender: the slot becomes it. */
kvl_status_t kvli_notif_offer_reserved(kvl_bk_ctx_t *ctx, const char *from, const void *msg,
                                       size_t len, size_t slot_len)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    kvli_notif_t *n = malloc(sizeof(*n) + len + 1);
    kvli_notif_src_t *s = NULL;
    pthread_mutex_lock(&a->notif_lock);
    s = kvli_notif_src(a, from ? from : "", 0); /* it holds the grant: it exists */
    if (s != NULL)
        kvli_notif_res_drop(a, s, 1, slot_len);
    if (s == NULL || n == NULL) {
        if (s != NULL)
            kvli_notif_src_put(a, s, 0, 0);
        a->nq_refused++;
        pthread_mutex_unlock(&a->notif_lock);
        free(n);
        kvli_log(KVL_LOG_ERROR, bk->ops->name, "agent '%s': dropped a %zu-byte notification "
                 "from '%s' sent within its grant: malloc(%zu) failed (out of memory)", a->name,
                 len, from ? from : "", sizeof(*n) + len + 1);
        return KVL_ERR_NO_MEMORY;
    }
    kvli_notif_append(a, n, s, msg, len);
    pthread_mutex_unlock(&a->notif_lock);
    return KVL_OK;
}

/* For backends that cannot answer their sender: a refusal is only logged. */
void kvli_notif_deliver(kvl_bk_ctx_t *ctx, const char *from, const void *msg, size_t len)
{
    char why[400];
    if (kvli_notif_offer(ctx, from, msg, len, why, sizeof(why)) != KVL_OK) {
        struct kvl_backend *bk = ctx->core;
        kvli_log(KVL_LOG_WARN, bk->ops->name, "dropped a notification from '%s': %s; the %s "
                 "backend cannot tell the sender", from ? from : "", why, bk->ops->name);
    }
}

kvl_status_t kvl_notif_poll(kvl_agent_t *a, kvl_notif_t *out, size_t max, size_t *n_p)
{
    if (a == NULL || n_p == NULL || (out == NULL && max > 0))
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_notif_poll: NULL argument");
    size_t n = 0;
    pthread_mutex_lock(&a->notif_lock);
    while (n < max && a->nhead) {
        kvli_notif_t *q = a->nhead;
        unsigned char *m = malloc(q->len + 1);
        if (m == NULL)
            break;
        memcpy(m, q->msg, q->len + 1);
        kvli_scopy(out[n].from, sizeof(out[n].from), q->from);
        out[n].len = q->len;
        out[n].msg = m;
        n++;
        a->nq_msgs--;
        a->nq_bytes -= q->len;
        kvli_notif_src_put(a, q->src, 1, q->len);
        a->nhead = q->next;
        if (a->nhead == NULL)
            a->ntail = NULL;
        free(q);
    }
    pthread_mutex_unlock(&a->notif_lock);
    *n_p = n;
    return KVL_OK;
}

kvl_status_t kvl_notif_wait(kvl_agent_t *a, int64_t timeout_ms)
{
    if (a == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_notif_wait: agent is NULL");
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (timeout_ms % 1000) * 1000000;
        if (dl.tv_nsec >= 1000000000) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000;
        }
    }
    kvl_status_t st = KVL_OK;
    pthread_mutex_lock(&a->notif_lock);
    while (a->nhead == NULL) {
        int rc = timeout_ms < 0 ? pthread_cond_wait(&a->notif_cond, &a->notif_lock)
                                : pthread_cond_timedwait(&a->notif_cond, &a->notif_lock, &dl);
        if (rc == ETIMEDOUT) {
            st = KVL_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&a->notif_lock);
    if (st != KVL_OK)
        return kvli_fail_simple(a, st, "wait again, or check that the peer sent it",
                                "no notification on agent '%s' within %lld ms", a->name,
                                (long long)timeout_ms);
    return st;
}

void kvl_notif_free(kvl_notif_t *n)
{
    if (n == NULL)
        return;
    free(n->msg);
    n->msg = NULL;
    n->len = 0;
}

void kvli_notifs_destroy(kvl_agent_t *a)
{
    while (a->nhead) {
        kvli_notif_t *q = a->nhead;
        a->nhead = q->next;
        free(q);
    }
    a->ntail = NULL;
    a->nq_msgs = 0;
    a->nq_bytes = 0;
    while (a->nsrcs) {
        kvli_notif_src_t *s = a->nsrcs;
        a->nsrcs = s->next;
        free(s);
    }
}

kvl_status_t kvl_notif_queue_info(kvl_agent_t *a, kvl_notif_queue_info_t *info)
{
    if (a == NULL || info == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_notif_queue_info: NULL argument");
    pthread_mutex_lock(&a->notif_lock);
    info->msgs = a->nq_msgs;
    info->bytes = a->nq_bytes;
    info->max_msgs = a->nq_max_msgs;
    info->max_bytes = a->nq_max_bytes;
    info->refused = a->nq_refused;
    info->reserved_msgs = a->nq_res_msgs;
    info->reserved_bytes = a->nq_res_bytes;
    info->max_peer_msgs = a->nq_peer_msgs;
    info->max_peer_bytes = a->nq_peer_bytes;
    pthread_mutex_unlock(&a->notif_lock);
    return KVL_OK;
}

kvl_status_t kvl_notif_send(kvl_agent_t *a, const char *remote, const void *msg, size_t len)
{
    kvl_error_t err;
    if (a == NULL || remote == NULL || (msg == NULL && len > 0))
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_notif_send: NULL argument");
    if (len > KVL_NOTIF_MAX)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, "send large payloads as a transfer",
                                "notification of %zu bytes exceeds KVL_NOTIF_MAX (%d)", len,
                                KVL_NOTIF_MAX);
    kvli_remote_t *r = kvli_remote_acquire(a, remote, &err);
    if (r == NULL)
        return kvli_fail(a, &err);
    kvli_err(&err, KVL_ERR_NO_BACKEND, 0, "no backend can carry a notification to agent '%s'",
             remote);
    kvli_scopy(err.agent, sizeof(err.agent), remote);
    kvl_status_t st = KVL_ERR_NO_BACKEND;
    for (unsigned b = 0; b < a->nbks && st != KVL_OK; b++) {
        struct kvl_backend *bk = a->bks[b];
        if (!(bk->ops->caps & KVL_BK_CAP_NOTIF) || r->peer[b] == NULL) {
            kvl_error_t c;
            kvl_bk_error_set(&c, KVL_ERR_UNSUPPORTED, 0, bk->ops->name, -1, "%s",
                             r->peer[b] == NULL ? (r->unreachable[b][0] ? r->unreachable[b]
                                                                         : "peer not reachable")
                                                : "backend carries no notifications");
            kvli_err_add_cause(&err, &c);
            continue;
        }
        kvl_error_t berr;
        memset(&berr, 0, offsetof(kvl_error_t, causes));
        berr.device = -1;
        st = bk->ops->notif_send(bk->bk, r->peer[b], msg, len, &berr);
        if (st == KVL_ERR_REMOTE_FULL || st == KVL_ERR_TIMEOUT) {
            /* the target's answer, not a transport's failure: no other backend
             * reaches another queue; or sent and not answered in time (it may
             * be queued there): another backend could deliver it twice */
            kvli_remote_put(a, r);
            if (!berr.backend[0])
                kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
            return kvli_fail(a, &berr);
        }
        if (st != KVL_OK) {
            if (!berr.backend[0])
                kvli_scopy(berr.backend, sizeof(berr.backend), bk->ops->name);
            kvli_err_add_cause(&err, &berr);
            if (err.n_causes == 1) {
                err.code = st;
                err.sys_errno = berr.sys_errno;
            }
        }
    }
    kvli_remote_put(a, r);
    if (st != KVL_OK) {
        if (err.code == KVL_ERR_NO_BACKEND && err.n_causes > 0 && err.causes[err.n_causes - 1].code != KVL_ERR_UNSUPPORTED)
            err.code = err.causes[err.n_causes - 1].code;
        return kvli_fail(a, &err);
    }
    return KVL_OK;
}
