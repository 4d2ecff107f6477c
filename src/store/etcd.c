/*
 * kvlane etcd store: agents publish their metadata in etcd under
 * <prefix>/<name>/<label>, attached to a lease the agent keeps alive; peers
 * fetch it by name and follow it through one watch on the namespace, so a
 * restart (new incarnation) or a departure (key deleted, lease expired)
 * drops the loaded metadata at every agent that loaded it.
 *
 * Threads per attached agent: the keeper (lease keepalive every TTL/3, new
 * lease and republish after an outage or a deregistration), the watcher
 * (one streaming watch; reconnects from the next revision, resynchronises
 * the followed peers when etcd compacted past it) and, from the first
 * background fetch on, the fetcher (every kvl_etcd_fetch_async of the
 * agent: the keys of all that are due in one read) and up to
 * KVLI_ETCD_LOADERS loaders (loading what it found). User calls (publish,
 * fetch, unpublish) run on the caller's thread. Nothing here is on a
 * transfer's path.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include "common/clock.h"
#include "core/md_codec.h"
#include "etcd_client.h"
#include "etcd_h2.h"
#include "etcd_pb.h"
#include "store.h"

#define KVLI_ETCD_LABEL_MAX 64u
#define KVLI_ETCD_PUBS_MAX 16u /* labels one agent publishes (the keeper republishes them all) */
#define KVLI_ETCD_PREFIX_MAX 200u

typedef struct kvli_etcd_follow {
    struct kvli_etcd_follow *next;
    char name[KVL_NAME_MAX];
    char label[KVLI_ETCD_LABEL_MAX];
    uint64_t incarnation, generation;
    int64_t rev;                       /* watch its presence key from this revision */
    /* A newer generation announced whose load failed (0: none): the
     * watcher tries it again at retry_ms (monotonic), with a backoff. */
    uint64_t pending, retry_ms;
    unsigned backoff_ms, failures;
} kvli_etcd_follow_t;

/* A kvl_etcd_fetch waiting for an agent to publish. */
typedef struct kvli_etcd_waiter {
    struct kvli_etcd_waiter *next;
    const char *name;
    bool put;                          /* its presence key was put */
    int64_t rev;                       /* watch from (after the first read; 0 before) */
} kvli_etcd_waiter_t;

/* A background fetch (kvl_etcd_fetch_async), served by the fetcher
 * thread; kept after it ended, for kvl_etcd_fetch_status. */
typedef struct kvli_etcd_bg {
    struct kvli_etcd_bg *next;
    char name[KVL_NAME_MAX];
    char label[KVLI_ETCD_LABEL_MAX];
    uint64_t wait_ms, deadline;        /* deadline: monotonic ms */
    uint64_t next_read;                /* monotonic ms of its next read (0: at once) */
    uint64_t seq;                      /* asked again: the read in flight does not end it */
    bool busy;                         /* being read, or its metadata being loaded */
    kvli_etcd_waiter_t wt;             /* in s->waiters while it is pending */
    kvl_status_t st;                   /* KVL_IN_PROGRESS, KVL_OK or why it failed */
    kvl_error_t *err;                  /* the failure (allocated when it failed; NULL: no memory) */
} kvli_etcd_bg_t;

/* A read of one key, sent to etcd with the reads other threads of the
 * agent wait for (kvli_etcd_get_key). */
typedef struct kvli_etcd_read {
    struct kvli_etcd_read *next;
    const char *key;
    bool done;
    kvl_status_t st;
    void *blob;
    size_t len;
    int64_t rev;
    kvl_error_t *err;                  /* a failure goes here (a batch's reads may share it) */
} kvli_etcd_read_t;

#define KVLI_ETCD_READ_BATCH 64u       /* etcd allows 128 operations per transaction */
#define KVLI_ETCD_LOADERS 4u           /* loader threads per agent (kvli_etcd_t.loaders) */
/* Background fetches whose result is kept: past this many, the oldest
 * ended ones are forgotten (peers come and go under new names). */
#define KVLI_ETCD_BG_KEEP 4096u

typedef struct kvli_etcd_pub {
    struct kvli_etcd_pub *next;
    char label[KVLI_ETCD_LABEL_MAX];
    /* Partial metadata published as is (kvl_etcd_publish_partial); NULL:
     * the full metadata, made again at each put. */
    void *blob;
    size_t len;
} kvli_etcd_pub_t;

typedef struct kvli_etcd {
    kvl_agent_t *a;
    kvli_etcd_client_t cl;
    char prefix[KVLI_ETCD_PREFIX_MAX]; /* no trailing '/' */
    unsigned ttl_s;
    pthread_mutex_t lock;              /* everything below */
    pthread_cond_t cond;               /* keeper and watcher wake-ups */
    pthread_cond_t put_cond;           /* fetch waiters: a PUT was seen */
    bool attached, stopping;
    int64_t lease;                     /* 0: none (not granted, lost or revoked) */
    bool lease_wanted;                 /* something is published: keep a lease */
    bool down;                         /* the keeper's calls fail */
    bool unreached;                    /* ... because no endpoint answered */
    bool dirty;                        /* republish (regions changed) */
    uint64_t presence_gen;             /* the highest generation announced */
    kvli_etcd_waiter_t *waiters;
    kvli_etcd_pub_t *pubs;
    kvli_etcd_follow_t *follows;
    CURLM *multi;                      /* the HTTP watcher's, NULL when it does not run */
    int wake_fd;                       /* eventfd: wakes the WebSocket watcher */
    bool watch_restart;
    pthread_t keeper, watcher;
    bool threads;
    /* call_h: the agent's one connection for calls (attach, publish,
     * unpublish, the keeper's renewals, batches of reads), one at a time
     * under call_lock, which is never taken under lock. A connection to
     * etcd's gateway costs etcd more CPU (~1.4 ms) than two requests. */
    pthread_mutex_t call_lock;
    kvli_etcd_conn_t *call_h;
    kvli_etcd_read_t *reads, **reads_tail; /* reads queued for the next batch */
    bool reading;                      /* a batch is with etcd */
    pthread_cond_t read_cond;          /* a batch came back */
    kvli_etcd_bg_t *bgs;               /* background fetches, pending or ended */
    struct kvli_etcd_due *bg_due;      /* the fetcher's: reads in flight */
    kvl_error_t *bg_err, *bg_rerr;     /* the fetcher's: a failure, a failed read's */
    pthread_cond_t bg_cond;            /* a background fetch ended */
    pthread_t fetcher;
    bool fetcher_on;
    /* Metadata read by background fetches, loaded by up to
     * KVLI_ETCD_LOADERS loader threads, started as loads find none free: a
     * load connects to the peer, so loads run side by side, and one that
     * cannot be reached does not hold the others up. */
    struct kvli_etcd_load *loads, **loads_tail;
    pthread_cond_t load_cond;          /* a load was queued */
    struct kvli_etcd_loader {
        struct kvli_etcd *s;
        pthread_t th;
        kvl_error_t *err;              /* its failures */
    } loaders[KVLI_ETCD_LOADERS];
    unsigned nloaders, idle_loaders;
} kvli_etcd_t;

static void *kvli_etcd_create(kvl_agent_t *a)
{
    kvli_etcd_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->a = a;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    pthread_cond_init(&s->put_cond, NULL);
    pthread_cond_init(&s->read_cond, NULL);
    pthread_cond_init(&s->bg_cond, NULL);
    pthread_cond_init(&s->load_cond, NULL);
    s->reads_tail = &s->reads;
    s->loads_tail = &s->loads;
    pthread_mutex_init(&s->call_lock, NULL);
    return s;
}

static void kvli_etcd_destroy(kvl_agent_t *a, void *state);
static void kvli_etcd_regions_changed(kvl_agent_t *a, void *state);

static const kvli_store_ops_t kvli_etcd_store = {
    .name = "etcd",
    .create = kvli_etcd_create,
    .destroy = kvli_etcd_destroy,
    .regions_changed = kvli_etcd_regions_changed,
};

/* Wake the watcher (under s->lock): the set of watched agents changed. */
static void kvli_etcd_wake(kvli_etcd_t *s)
{
    if (s->multi != NULL)
        curl_multi_wakeup(s->multi);
    uint64_t one = 1;
    if (s->wake_fd >= 0 && write(s->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        kvli_log(KVL_LOG_DEBUG, "etcd", "watcher wake: %s", strerror(errno));
}

/* ---- keys ---- */

static void kvli_etcd_key(const kvli_etcd_t *s, const char *name, const char *label, char *buf,
                          size_t cap)
{
    snprintf(buf, cap, "%s/%s/%s", s->prefix, name, label);
}

/* The presence key: "<incarnation hex> <generation>", put with every
 * publish in the same transaction. The watch covers these small keys only,
 * so a change reaches every watcher without the metadata itself. */
static void kvli_etcd_pkey(const kvli_etcd_t *s, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.199s.inc/%.63s", s->prefix, name);
}

static void kvli_etcd_put_key(json_object *o, const char *field, const char *key)
{
    char *b = kvli_etcd_b64(key, strlen(key));
    json_object_object_add(o, field, json_object_new_string(b ? b : ""));
    free(b);
}

static kvl_status_t kvli_etcd_label_ok(const char *label, kvl_error_t *err)
{
    if (strlen(label) >= KVLI_ETCD_LABEL_MAX || strchr(label, '/') != NULL) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd metadata label '%.100s' is longer than %u "
                 "bytes or contains '/'", label, KVLI_ETCD_LABEL_MAX - 1);
        kvli_hint(err, "use a short label without '/' (NIXL's default is \"metadata\")");
        return KVL_ERR_INVALID_ARG;
    }
    return KVL_OK;
}

static kvli_etcd_t *kvli_etcd_get(kvl_agent_t *a, const char *fn, kvl_error_t *err)
{
    kvli_etcd_t *s = kvli_store_state(a, &kvli_etcd_store, false);
    bool ok = false;
    if (s != NULL) {
        pthread_mutex_lock(&s->lock);
        ok = s->attached && !s->stopping;
        pthread_mutex_unlock(&s->lock);
    }
    if (!ok) {
        kvli_err(err, KVL_ERR_STATE, 0, "%s: agent '%s' is not attached to etcd", fn, a->name);
        kvli_hint(err, "call kvl_etcd_attach first (Python: set NIXL_ETCD_ENDPOINTS before the "
                       "nixl_agent is created, or Agent.etcd_attach)");
        return NULL;
    }
    return s;
}

/* ---- lease ---- */

static kvl_status_t kvli_etcd_grant(kvli_etcd_t *s, kvli_etcd_conn_t *h, int64_t *lease_p,
                                    int64_t *rev_p, kvl_error_t *err)
{
    json_object *b = json_object_new_object(), *out = NULL;
    json_object_object_add(b, "TTL", json_object_new_int64(s->ttl_s));
    kvl_status_t st = kvli_etcd_call(&s->cl, h, "/v3/lease/grant", b, &out, NULL, 0, err);
    json_object_put(b);
    if (st != KVL_OK)
        return st;
    json_object *hdr = NULL;
    json_object_object_get_ex(out, "header", &hdr);
    *lease_p = kvli_etcd_i64(out, "ID");
    if (rev_p != NULL)
        *rev_p = kvli_etcd_i64(hdr, "revision");
    json_object_put(out);
    if (*lease_p == 0) {
        kvli_err(err, KVL_ERR_REMOTE, EPROTO, "etcd granted no lease (no ID in its answer)");
        kvli_hint(err, "check etcd's log; is it an etcd v3.4 or later?");
        return KVL_ERR_REMOTE;
    }
    return KVL_OK;
}

static kvl_status_t kvli_etcd_revoke(kvli_etcd_t *s, kvli_etcd_conn_t *h, int64_t lease,
                                     kvl_error_t *err)
{
    json_object *b = json_object_new_object(), *out = NULL;
    char id[32];
    snprintf(id, sizeof(id), "%" PRId64, lease);
    json_object_object_add(b, "ID", json_object_new_string(id));
    kvl_status_t st = kvli_etcd_call(&s->cl, h, "/v3/lease/revoke", b, &out, NULL, 0, err);
    json_object_put(b);
    if (out != NULL)
        json_object_put(out);
    return st == KVL_ERR_NOT_FOUND ? KVL_OK : st; /* already expired */
}

/* Put our metadata (the partial blob given, else the full metadata) under
 * label with lease. */
static kvl_status_t kvli_etcd_put_md(kvli_etcd_t *s, kvli_etcd_conn_t *h, const char *label,
                                     const void *partial, size_t partial_len, int64_t lease,
                                     kvl_error_t *err)
{
    void *blob = NULL;
    size_t len = 0;
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + KVLI_ETCD_LABEL_MAX + 4], id[32];
    if (partial != NULL) {
        if ((blob = malloc(partial_len)) == NULL) {
            kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "etcd: no memory to copy %zu bytes of "
                     "metadata", partial_len);
            return KVL_ERR_NO_MEMORY;
        }
        memcpy(blob, partial, partial_len);
        len = partial_len;
    } else if (kvl_metadata_get(s->a, &blob, &len) != KVL_OK) {
        *err = *kvl_last_error();
        return err->code;
    }
    kvli_md_t md;
    kvl_error_t derr;
    uint64_t gen = 0;
    if (kvli_md_decode(blob, len, &md, &derr) == KVL_OK) {
        gen = md.generation;
        kvli_md_release(&md);
    }
    char *v = kvli_etcd_b64(blob, len);
    kvl_free(blob);
    if (v == NULL) {
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "etcd: no memory to encode %zu bytes of "
                 "metadata", len);
        return KVL_ERR_NO_MEMORY;
    }
    /* One transaction: the metadata and the presence key. */
    char pkey[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + 8], pval[64];
    json_object *b = json_object_new_object(), *ops = json_object_new_array(), *out = NULL;
    json_object *p1 = json_object_new_object(), *p2 = json_object_new_object();
    json_object *o1 = json_object_new_object(), *o2 = json_object_new_object();
    snprintf(id, sizeof(id), "%" PRId64, lease);
    kvli_etcd_key(s, s->a->name, label, key, sizeof(key));
    kvli_etcd_put_key(p1, "key", key);
    json_object_object_add(p1, "value", json_object_new_string(v));
    json_object_object_add(p1, "lease", json_object_new_string(id));
    free(v);
    kvli_etcd_pkey(s, s->a->name, pkey, sizeof(pkey));
    /* The presence key announces the newest generation published, never an
     * older one: a partial blob made before the last registration change
     * carries its own older generation, and a follower that resyncs from
     * this key (after a compaction) reloads only on a higher one. */
    pthread_mutex_lock(&s->lock);
    if (gen < s->presence_gen)
        gen = s->presence_gen;
    else
        s->presence_gen = gen;
    pthread_mutex_unlock(&s->lock);
    snprintf(pval, sizeof(pval), "%016" PRIx64 " %" PRIu64, s->a->incarnation, gen);
    char *pv = kvli_etcd_b64(pval, strlen(pval));
    kvli_etcd_put_key(p2, "key", pkey);
    json_object_object_add(p2, "value", json_object_new_string(pv ? pv : ""));
    json_object_object_add(p2, "lease", json_object_new_string(id));
    free(pv);
    json_object_object_add(o1, "request_put", p1);
    json_object_object_add(o2, "request_put", p2);
    json_object_array_add(ops, o1);
    json_object_array_add(ops, o2);
    json_object_object_add(b, "success", ops);
    kvl_status_t st = kvli_etcd_call(&s->cl, h, "/v3/kv/txn", b, &out, NULL, 0, err);
    json_object_put(b);
    if (out != NULL)
        json_object_put(out);
    return st;
}

/* Whether every region a partial blob names is still registered, as it was
 * (same address, length and kind); the first one that is not into gone. */
static bool kvli_etcd_partial_current(kvl_agent_t *a, const void *blob, size_t len, char *gone,
                                      size_t cap)
{
    kvli_md_t md;
    kvl_error_t err;
    bool ok = true;
    if (kvli_md_decode(blob, len, &md, &err) != KVL_OK) {
        kvli_scopy(gone, cap, err.what);
        return false;
    }
    pthread_mutex_lock(&a->lock);
    for (uint32_t i = 0; i < md.n_regions && ok; i++) {
        const kvli_md_region_t *g = &md.regions[i];
        const kvli_region_t *r = kvli_registry_find(a, g->addr, g->len);
        ok = r != NULL && r->addr == g->addr && r->len == g->len && r->kind == g->kind;
        if (!ok)
            snprintf(gone, cap, "region 0x%llx+%llu is no longer registered",
                     (unsigned long long)g->addr, (unsigned long long)g->len);
    }
    pthread_mutex_unlock(&a->lock);
    kvli_md_release(&md);
    return ok;
}

/* Delete our key under label (a partial label that is out of date). */
static kvl_status_t kvli_etcd_del_md(kvli_etcd_t *s, kvli_etcd_conn_t *h, const char *label,
                                     kvl_error_t *err)
{
    char key[1300]; /* the compiler cannot bound the label here: room for any */
    json_object *b = json_object_new_object(), *out = NULL;
    kvli_etcd_key(s, s->a->name, label, key, sizeof(key));
    kvli_etcd_put_key(b, "key", key);
    kvl_status_t st = kvli_etcd_call(&s->cl, h, "/v3/kv/deleterange", b, &out, NULL, 0, err);
    json_object_put(b);
    if (out != NULL)
        json_object_put(out);
    return st;
}

static kvl_status_t kvli_etcd_republish_labels(kvli_etcd_t *s, kvli_etcd_conn_t *h,
                                               char labels[][KVLI_ETCD_LABEL_MAX], void **blobs,
                                               const size_t *lens, unsigned n, int64_t lease,
                                               kvl_error_t *err);

/* Every label published, again, under the current lease (granted when
 * missing). A partial label whose regions are no longer all registered is
 * not: its key is deleted and it is forgotten, so that no peer loads a
 * deregistered region from it. Called by the keeper; err filled on failure. */
static kvl_status_t kvli_etcd_republish(kvli_etcd_t *s, kvli_etcd_conn_t *h, kvl_error_t *err)
{
    char labels[KVLI_ETCD_PUBS_MAX][KVLI_ETCD_LABEL_MAX];
    void *blobs[KVLI_ETCD_PUBS_MAX] = {NULL};
    size_t lens[KVLI_ETCD_PUBS_MAX] = {0};
    unsigned n = 0;
    int64_t lease;
    kvl_status_t st = KVL_OK;
    pthread_mutex_lock(&s->lock);
    lease = s->lease;
    for (kvli_etcd_pub_t *p = s->pubs; p != NULL && n < KVLI_ETCD_PUBS_MAX; p = p->next) {
        if (p->blob != NULL && (blobs[n] = malloc(p->len)) == NULL) {
            st = KVL_ERR_NO_MEMORY;
            break;
        }
        if (p->blob != NULL)
            memcpy(blobs[n], p->blob, p->len);
        lens[n] = p->len;
        kvli_scopy(labels[n++], KVLI_ETCD_LABEL_MAX, p->label);
    }
    s->dirty = st != KVL_OK;
    pthread_mutex_unlock(&s->lock);
    if (st != KVL_OK) {
        for (unsigned i = 0; i < n; i++)
            free(blobs[i]);
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "etcd: no memory to publish again");
        return st;
    }
    st = kvli_etcd_republish_labels(s, h, labels, blobs, lens, n, lease, err);
    for (unsigned i = 0; i < n; i++)
        free(blobs[i]);
    return st;
}

static kvl_status_t kvli_etcd_republish_labels(kvli_etcd_t *s, kvli_etcd_conn_t *h,
                                               char labels[][KVLI_ETCD_LABEL_MAX], void **blobs,
                                               const size_t *lens, unsigned n, int64_t lease,
                                               kvl_error_t *err)
{
    if (lease == 0) {
        kvl_status_t st = kvli_etcd_grant(s, h, &lease, NULL, err);
        if (st != KVL_OK)
            return st;
        pthread_mutex_lock(&s->lock);
        s->lease = lease;
        pthread_mutex_unlock(&s->lock);
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': new etcd lease %" PRIx64 " (TTL %u s)",
                 s->a->name, (uint64_t)lease, s->ttl_s);
    }
    for (unsigned i = 0; i < n; i++) {
        char gone[200];
        if (blobs[i] != NULL && !kvli_etcd_partial_current(s->a, blobs[i], lens[i], gone,
                                                           sizeof(gone))) {
            kvli_log(KVL_LOG_WARN, "etcd", "agent '%s': partial metadata under label '%s' is "
                     "withdrawn from etcd (%s); publish it again with "
                     "kvl_etcd_publish_partial", s->a->name, labels[i], gone);
            pthread_mutex_lock(&s->lock);
            for (kvli_etcd_pub_t **pp = &s->pubs; *pp != NULL; pp = &(*pp)->next)
                if (strcmp((*pp)->label, labels[i]) == 0 && (*pp)->blob != NULL) {
                    kvli_etcd_pub_t *p = *pp;
                    *pp = p->next;
                    free(p->blob);
                    free(p);
                    break;
                }
            pthread_mutex_unlock(&s->lock);
            kvl_status_t st = kvli_etcd_del_md(s, h, labels[i], err);
            if (st != KVL_OK)
                return st;
            continue;
        }
        kvl_status_t st = kvli_etcd_put_md(s, h, labels[i], blobs[i], lens[i], lease, err);
        if (st != KVL_OK) {
            pthread_mutex_lock(&s->lock);
            s->dirty = true;
            pthread_mutex_unlock(&s->lock);
            return st;
        }
    }
    if (n > 0)
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': metadata published again (%u label(s))",
                 s->a->name, n);
    return KVL_OK;
}

/* The keeper thread: lease keepalive, new lease after an outage, republish. */
static void *kvli_etcd_keeper_main(void *arg)
{
    kvli_etcd_t *s = arg;
    uint64_t period_ms = s->ttl_s * 1000u / 3u;
    if (period_ms < 300)
        period_ms = 300;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (s->down ? 500u : period_ms) * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        while (!s->dirty && !s->stopping && pthread_cond_timedwait(&s->cond, &s->lock, &ts) == 0)
            ;
        if (s->stopping)
            break;
        pthread_mutex_unlock(&s->lock);
        /* The lease is looked at under the call lock: publish and unpublish
         * change it under that lock, and an unpublish between a look before
         * it and the renewal revoked the lease looked at (the renewal then
         * logged it as expired and granted a new one, nothing published). */
        pthread_mutex_lock(&s->call_lock);
        pthread_mutex_lock(&s->lock);
        int64_t lease = s->lease;
        bool wanted = s->lease_wanted, dirty = s->dirty;
        pthread_mutex_unlock(&s->lock);
        kvli_etcd_conn_t *h = s->call_h;

        kvl_error_t err;
        kvli_err_blank(&err);
        kvl_status_t st = KVL_OK;
        bool lost = false;
        if (lease != 0) {
            json_object *b = json_object_new_object(), *out = NULL, *res = NULL;
            char id[32];
            snprintf(id, sizeof(id), "%" PRId64, lease);
            json_object_object_add(b, "ID", json_object_new_string(id));
            st = kvli_etcd_call(&s->cl, h, "/v3/lease/keepalive", b, &out, NULL, 0, &err);
            json_object_put(b);
            if (st == KVL_OK) {
                if (!json_object_object_get_ex(out, "result", &res))
                    res = out;
                lost = kvli_etcd_i64(res, "TTL") <= 0;
                json_object_put(out);
            }
            lost = lost || st == KVL_ERR_NOT_FOUND;
            if (lost) {
                st = KVL_OK;
                kvli_log(KVL_LOG_WARN, "etcd", "agent '%s': etcd lease %" PRIx64 " expired "
                         "(etcd was out of reach or too busy to renew it for longer than its "
                         "TTL of %u s, or the lease was revoked): granting a new one and "
                         "publishing again", s->a->name, (uint64_t)lease, s->ttl_s);
                pthread_mutex_lock(&s->lock);
                if (s->lease == lease)
                    s->lease = 0;
                pthread_mutex_unlock(&s->lock);
            }
        }
        if (st == KVL_OK && wanted && (lost || dirty || lease == 0))
            st = kvli_etcd_republish(s, h, &err);
        pthread_mutex_unlock(&s->call_lock);

        /* No endpoint answered (st TIMEOUT or REMOTE_DISCONNECT): the watch
         * connection may be just as dead without knowing it (a cut link
         * stays silent), so it is made again, and again once etcd answers
         * (not waiting out its backoff). etcd answered with an error
         * (overloaded: "request timed out", no leader): the connections
         * work; making every follower's watches again would only add to
         * the load of an etcd already behind. */
        bool unreached = st == KVL_ERR_TIMEOUT || st == KVL_ERR_REMOTE_DISCONNECT;
        pthread_mutex_lock(&s->lock);
        if (st != KVL_OK && !s->stopping) {
            if (!s->down)
                kvli_log(KVL_LOG_WARN, "etcd", "agent '%s': etcd keepalive failed: %s; "
                         "transfers already set up keep working, the lease is renewed and the "
                         "metadata published again when etcd answers", s->a->name, err.what);
            s->down = true;
            if (unreached && !s->unreached) {
                s->unreached = true;
                s->watch_restart = true;
                kvli_etcd_wake(s);
            }
        } else if (st == KVL_OK && s->down) {
            kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': etcd answers again", s->a->name);
            if (s->unreached) {
                s->watch_restart = true;
                kvli_etcd_wake(s);
            }
            s->down = s->unreached = false;
            pthread_cond_broadcast(&s->cond);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---- following peers ---- */

static kvli_etcd_follow_t *kvli_etcd_follow_find(kvli_etcd_t *s, const char *name)
{
    for (kvli_etcd_follow_t *f = s->follows; f != NULL; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f;
    return NULL;
}

/* Drop the followed peer's metadata (under no lock). */
static void kvli_etcd_drop(kvli_etcd_t *s, const char *name, const char *why)
{
    pthread_mutex_lock(&s->lock);
    for (kvli_etcd_follow_t **pp = &s->follows; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) == 0) {
            kvli_etcd_follow_t *f = *pp;
            *pp = f->next;
            free(f);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    kvl_status_t st = kvl_remote_remove(s->a, name);
    kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': %s agent '%s' (%s)", s->a->name,
             st == KVL_OK ? "dropped the metadata of" : "no longer follows", name, why);
}

/* Range-get one key: KVL_OK with *blob_p (malloc'ed) or KVL_ERR_NOT_FOUND. */
static kvl_status_t kvli_etcd_get_key(kvli_etcd_t *s, const char *key, void **blob_p,
                                      size_t *len_p, int64_t *rev_p, kvl_error_t *err);

#define KVLI_ETCD_RELOAD_RETRY_MS 200u       /* first retry of a failed reload ... */
#define KVLI_ETCD_RELOAD_RETRY_MAX_MS 10000u /* ... doubling up to this */

/*
 * Load the followed agent's metadata again (a new generation, announced by
 * its presence key), on the watcher's thread. When that fails (the read of
 * its key, or the load: the peer out of reach for a moment), the generation
 * loaded before stays in use and the watcher tries again
 * (kvli_etcd_reload_due) with a backoff until it loads, or the peer is
 * dropped: nothing else would, the watch having moved past the event. Its
 * key gone (KVL_ERR_NOT_FOUND): its delete follows. KVL_ERR_STALE: what is
 * loaded is newer.
 */
static void kvli_etcd_reload(kvli_etcd_t *s, const char *name, const char *label,
                             uint64_t gen)
{
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + KVLI_ETCD_LABEL_MAX + 4];
    void *blob = NULL;
    size_t bl = 0;
    kvl_error_t err;
    kvli_err_blank(&err);
    kvli_etcd_key(s, name, label, key, sizeof(key));
    kvl_status_t st = kvli_etcd_get_key(s, key, &blob, &bl, NULL, &err);
    if (st == KVL_OK) {
        st = kvl_metadata_load(s->a, blob, bl, NULL, 0);
        if (st != KVL_OK) {
            const kvl_error_t *le = kvl_last_error();
            memcpy(&err, le, offsetof(kvl_error_t, causes) +
                                 le->n_causes * sizeof(le->causes[0]));
        }
        free(blob);
    }
    bool done = st == KVL_OK || st == KVL_ERR_NOT_FOUND || st == KVL_ERR_STALE;
    unsigned failures = 0, backoff = 0;
    pthread_mutex_lock(&s->lock);
    kvli_etcd_follow_t *f = kvli_etcd_follow_find(s, name);
    bool followed = f != NULL;
    if (f != NULL && done) {
        if (st == KVL_OK && f->generation < gen)
            f->generation = gen;
        failures = f->failures;
        if (f->pending <= gen) {
            f->pending = 0;
            f->failures = 0;
            f->backoff_ms = 0;
        }
    } else if (f != NULL) {
        if (f->pending < gen)
            f->pending = gen;
        backoff = f->backoff_ms == 0 ? KVLI_ETCD_RELOAD_RETRY_MS : f->backoff_ms * 2;
        if (backoff > KVLI_ETCD_RELOAD_RETRY_MAX_MS)
            backoff = KVLI_ETCD_RELOAD_RETRY_MAX_MS;
        f->backoff_ms = backoff;
        f->retry_ms = kvli_clock_ms() + backoff;
        failures = ++f->failures;
    }
    pthread_mutex_unlock(&s->lock);
    if (!followed)
        return; /* dropped meanwhile */
    if (st == KVL_OK && failures > 0)
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': loaded generation %" PRIu64 " of agent "
                 "'%s' after %u failed tries", s->a->name, gen, name, failures);
    else if (st == KVL_OK)
        kvli_log(KVL_LOG_DEBUG, "etcd", "agent '%s': loaded generation %" PRIu64 " of agent "
                 "'%s'", s->a->name, gen, name);
    else if (!done)
        kvli_log(failures == 1 ? KVL_LOG_WARN : KVL_LOG_DEBUG, "etcd", "agent '%s': loading "
                 "generation %" PRIu64 " of agent '%s' failed: %s; the generation loaded "
                 "before stays in use, and the load is tried again in %u ms (then less often, "
                 "up to every %u s) until it succeeds", s->a->name, gen, name, err.what,
                 backoff, KVLI_ETCD_RELOAD_RETRY_MAX_MS / 1000u);
}

/* The watcher: reload the followed agents whose reload failed and is due
 * again. Returns when none is due: the monotonic ms of the next one
 * (UINT64_MAX: none pending). */
static uint64_t kvli_etcd_reload_due(kvli_etcd_t *s)
{
    for (;;) {
        char name[KVL_NAME_MAX], label[KVLI_ETCD_LABEL_MAX];
        uint64_t now = kvli_clock_ms(), next = UINT64_MAX, gen = 0;
        pthread_mutex_lock(&s->lock);
        for (kvli_etcd_follow_t *f = s->follows; f != NULL; f = f->next) {
            if (f->pending <= f->generation)
                continue;
            if (gen == 0 && f->retry_ms <= now) {
                kvli_scopy(name, sizeof(name), f->name);
                kvli_scopy(label, sizeof(label), f->label);
                gen = f->pending;
            } else if (f->retry_ms < next) {
                next = f->retry_ms;
            }
        }
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->lock);
        if (gen == 0 || stop)
            return next;
        kvli_etcd_reload(s, name, label, gen); /* done, or due again later */
    }
}

/* One event of the watch on the presence keys. */
static void kvli_etcd_event(kvli_etcd_t *s, json_object *ev)
{
    char pfx[KVLI_ETCD_PREFIX_MAX + 8];
    kvli_etcd_ev_t e;
    kvli_etcd_pkey(s, "", pfx, sizeof(pfx));
    kvli_etcd_ev_kind_t kind = kvli_etcd_ev_parse(ev, pfx, &e);
    if (kind == KVLI_ETCD_EV_NONE)
        return;
    pthread_mutex_lock(&s->lock);
    if (kind == KVLI_ETCD_EV_OK && !e.del) {
        for (kvli_etcd_waiter_t *w = s->waiters; w != NULL; w = w->next)
            if (strcmp(w->name, e.name) == 0)
                w->put = true;
        pthread_cond_broadcast(&s->put_cond);
    }
    kvli_etcd_follow_t *f = kvli_etcd_follow_find(s, e.name);
    /* An event older than what the fetch read (a stream opened for the
     * fetch's wait delivers it late) says nothing about what is loaded. */
    bool mine = f != NULL && e.mod_rev >= f->rev;
    uint64_t held = mine ? f->incarnation : 0, held_gen = mine ? f->generation : 0;
    char label[KVLI_ETCD_LABEL_MAX] = "";
    if (mine)
        kvli_scopy(label, sizeof(label), f->label);
    pthread_mutex_unlock(&s->lock);
    if (!mine)
        return;
    if (kind == KVLI_ETCD_EV_BAD) {
        /* what it holds now cannot be told: not what was loaded */
        kvli_log(KVL_LOG_WARN, "etcd", "agent '%s': agent '%s': %s; its metadata is dropped "
                 "(does another program write under the prefix '%s', or a proxy rewrite etcd's "
                 "answers?)", s->a->name, e.name, e.bad, s->prefix);
        kvli_etcd_drop(s, e.name, e.bad);
    } else if (e.del) {
        kvli_etcd_drop(s, e.name, "its etcd key was deleted: it was destroyed, unpublished, or "
                                  "its lease expired");
    } else if (e.inc != held) {
        char why[128];
        snprintf(why, sizeof(why), "it restarted: incarnation %016" PRIx64 " replaced %016"
                 PRIx64, e.inc, held);
        kvli_etcd_drop(s, e.name, why);
    } else if (e.gen > held_gen) {
        kvli_etcd_reload(s, e.name, label, e.gen);
    }
}

/* After the watch on agent `name` lost events (etcd compacted past its
 * revision): read its presence key now and act on it as on an event, so a
 * restart or departure the watch missed is not missed for good. Only that
 * peer: each peer has its own watch, which meets the compaction itself.
 * false when etcd could not be read: the caller keeps the watch's old
 * revision, so its resumption is refused as compacted again and the check
 * is repeated (with the watch's backoff) until it succeeds. */
static bool kvli_etcd_resync(kvli_etcd_t *s, kvli_etcd_conn_t *h, const char *name)
{
    pthread_mutex_lock(&s->lock);
    bool followed = kvli_etcd_follow_find(s, name) != NULL;
    pthread_mutex_unlock(&s->lock);
    if (!followed)
        return true; /* awaited by a fetch, not loaded: nothing held to correct */
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + 8];
    json_object *b = json_object_new_object(), *out = NULL, *kvs = NULL;
    kvl_error_t err;
    kvli_err_blank(&err);
    kvli_etcd_pkey(s, name, key, sizeof(key));
    kvli_etcd_put_key(b, "key", key);
    kvl_status_t st = kvli_etcd_call(&s->cl, h, "/v3/kv/range", b, &out, NULL, 0, &err);
    json_object_put(b);
    if (st != KVL_OK)
        return false;
    if ((kvs = kvli_etcd_arr(out, "kvs")) != NULL && json_object_array_length(kvs) > 0) {
        json_object *ev = json_object_new_object();
        json_object_object_add(ev, "kv", json_object_get(json_object_array_get_idx(kvs, 0)));
        kvli_etcd_event(s, ev);
        json_object_put(ev);
    } else {
        kvli_etcd_drop(s, name, "its etcd key is gone (found after the watch resumed)");
    }
    json_object_put(out);
    return true;
}

/* The events of one watch answer, in order; *rev moves past the last. */
static void kvli_etcd_events(kvli_etcd_t *s, json_object *evs, int64_t *rev)
{
    size_t n = evs != NULL ? json_object_array_length(evs) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *ev = json_object_array_get_idx(evs, i);
        int64_t mr = kvli_etcd_i64(kvli_etcd_obj(ev, "kv"), "mod_revision");
        kvli_etcd_event(s, ev);
        if (mr > 0 && mr >= *rev)
            *rev = mr + 1;
    }
}

/* One watch stream: the presence key of one agent this one follows or
 * waits for (a watch per peer, so a change reaches only its followers). */
typedef struct kvli_etcd_stream {
    struct kvli_etcd_stream *next;
    kvli_etcd_t *s;
    CURL *h;
    kvli_etcd_conn_t *rh;              /* rh: reloads from the watcher thread */
    struct curl_slist *hd;
    char name[KVL_NAME_MAX];
    char body[1024];
    int64_t rev;                       /* next revision to watch from (0: now) */
    int64_t compact_rev;               /* etcd's compaction, when it refused rev */
    bool running, created, compacted, failed, warned, wanted;
    uint64_t retry_ms;                 /* monotonic ms of the next start */
    unsigned backoff_ms;
    char *buf;
    size_t len, cap;
    char fail[256];
} kvli_etcd_stream_t;

static void kvli_etcd_line(kvli_etcd_stream_t *w, const char *line)
{
    kvli_etcd_t *s = w->s;
    kvli_etcd_wres_t r;
    json_object *o = json_tokener_parse(line);
    if (o == NULL)
        return;
    if (!kvli_etcd_wres_parse(o, &r)) {
        kvli_scopy(w->fail, sizeof(w->fail), r.fail);
        w->failed = true;
        json_object_put(o);
        return;
    }
    if (r.created)
        w->created = true;
    if (r.canceled && r.compact <= 0) {
        snprintf(w->fail, sizeof(w->fail), "etcd canceled the watch: %s", r.reason);
        w->failed = true;
    }
    if (r.compact > 0) {
        w->compact_rev = r.compact;
        w->compacted = true;
    }
    kvli_etcd_events(s, r.events, &w->rev);
    json_object_put(o);
}

static size_t kvli_etcd_stream_sink(char *data, size_t sz, size_t nm, void *arg)
{
    kvli_etcd_stream_t *w = arg;
    size_t n = sz * nm;
    if (kvli_etcd_append(&w->buf, &w->len, &w->cap, data, n) != 0)
        return 0;
    char *nl;
    while ((nl = memchr(w->buf, '\n', w->len)) != NULL) {
        *nl = '\0';
        kvli_etcd_line(w, w->buf);
        size_t used = (size_t)(nl - w->buf) + 1;
        memmove(w->buf, nl + 1, w->len - used + 1);
        w->len -= used;
    }
    return w->compacted || w->failed ? 0 : n;
}

static void kvli_etcd_stream_start(kvli_etcd_t *s, CURLM *m, kvli_etcd_stream_t *w)
{
    char url[KVLI_ETCD_EP_LEN + 16], tok[KVLI_ETCD_TOKEN_MAX], auth[KVLI_ETCD_TOKEN_MAX + 32];
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + 8];
    json_object *b = json_object_new_object(), *cr = json_object_new_object();
    kvli_etcd_pkey(s, w->name, key, sizeof(key));
    kvli_etcd_put_key(cr, "key", key);
    if (w->rev > 0)
        json_object_object_add(cr, "start_revision", json_object_new_int64(w->rev));
    json_object_object_add(b, "create_request", cr);
    kvli_scopy(w->body, sizeof(w->body), json_object_to_json_string_ext(b, JSON_C_TO_STRING_PLAIN));
    json_object_put(b);
    snprintf(url, sizeof(url), "%s/v3/watch", s->cl.eps[atomic_load(&s->cl.cur) % s->cl.n_eps]);
    if (w->h == NULL)
        w->h = curl_easy_init();
    curl_easy_reset(w->h);
    kvli_etcd_curl_setup(&s->cl, w->h, s->cl.timeout_ms);
    curl_easy_setopt(w->h, CURLOPT_TIMEOUT_MS, 0L); /* a stream: no total bound */
    curl_easy_setopt(w->h, CURLOPT_URL, url);
    curl_easy_setopt(w->h, CURLOPT_POSTFIELDS, w->body);
    curl_easy_setopt(w->h, CURLOPT_WRITEFUNCTION, kvli_etcd_stream_sink);
    curl_easy_setopt(w->h, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(w->h, CURLOPT_PRIVATE, w);
    curl_easy_setopt(w->h, CURLOPT_FORBID_REUSE, 1L);
    curl_slist_free_all(w->hd);
    w->hd = curl_slist_append(NULL, "Content-Type: application/json");
    kvli_etcd_token(&s->cl, tok, sizeof(tok));
    if (tok[0] != '\0') {
        snprintf(auth, sizeof(auth), "Authorization: %s", tok);
        w->hd = curl_slist_append(w->hd, auth);
    }
    curl_easy_setopt(w->h, CURLOPT_HTTPHEADER, w->hd);
    w->created = w->compacted = w->failed = false;
    w->len = 0;
    w->fail[0] = '\0';
    if (curl_multi_add_handle(m, w->h) == CURLM_OK)
        w->running = true;
}

static void kvli_etcd_stream_stop(CURLM *m, kvli_etcd_stream_t *w)
{
    if (w->running)
        curl_multi_remove_handle(m, w->h);
    w->running = false;
}

/* A stream ended (etcd away, endpoint dead, compaction, auth): log once,
 * move to the next endpoint when it never worked, retry with backoff. */
static void kvli_etcd_stream_ended(kvli_etcd_t *s, kvli_etcd_stream_t *w, CURLcode cc)
{
    uint64_t now = kvli_clock_ms();
    if (w->compacted) {
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': etcd compacted past the watch's "
                 "revision; checking agent '%s'", s->a->name, w->name);
        if (kvli_etcd_resync(s, w->rh, w->name)) {
            w->rev = w->compact_rev;
            w->retry_ms = now;
            return;
        }
        snprintf(w->fail, sizeof(w->fail), "etcd compacted past its revision and the check "
                 "of agent '%s' could not read etcd", w->name);
        w->failed = true;
        w->created = false; /* as a stream that never worked: backoff, next endpoint, WARN */
    }
    if (w->failed && strstr(w->fail, "token") != NULL && s->cl.user[0] != '\0') {
        kvl_error_t err;
        kvli_err_blank(&err);
        (void)kvli_etcd_authenticate(&s->cl, w->rh, &err);
    }
    if (!w->created && s->cl.n_eps > 1) {
        unsigned cur = atomic_load(&s->cl.cur);
        atomic_compare_exchange_strong(&s->cl.cur, &cur, (cur + 1) % s->cl.n_eps);
    }
    if (!w->warned) {
        kvli_log(w->created ? KVL_LOG_INFO : KVL_LOG_WARN, "etcd", "agent '%s': etcd watch on "
                 "agent '%s' ended: %s; resuming from revision %" PRId64 " (its restarts and "
                 "departures are seen when it resumes)", s->a->name, w->name,
                 w->failed ? w->fail : curl_easy_strerror(cc), w->rev);
        w->warned = !w->created;
    }
    if (w->created)
        w->backoff_ms = 100;
    w->retry_ms = now + w->backoff_ms;
    w->backoff_ms = w->backoff_ms * 2 > 2000 ? 2000 : w->backoff_ms * 2;
}

/* Every agent to watch (under s->lock): each followed one, and each one a
 * fetch waits for once its first read is done, with the revision to watch
 * from; fn marks (and creates) the watch of that name. */
typedef void (*kvli_etcd_want_fn)(void *ctx, const char *name, int64_t rev);

static void kvli_etcd_wanted(kvli_etcd_t *s, kvli_etcd_want_fn fn, void *ctx)
{
    for (kvli_etcd_follow_t *f = s->follows; f != NULL; f = f->next)
        fn(ctx, f->name, f->rev);
    for (kvli_etcd_waiter_t *wt = s->waiters; wt != NULL; wt = wt->next)
        if (wt->rev != 0)
            fn(ctx, wt->name, wt->rev);
}

typedef struct kvli_etcd_http_want {
    kvli_etcd_t *s;
    kvli_etcd_conn_t *rh;
    kvli_etcd_stream_t **streams;
} kvli_etcd_http_want_t;

static void kvli_etcd_http_want(void *ctx, const char *name, int64_t rev)
{
    kvli_etcd_http_want_t *hw = ctx;
    kvli_etcd_stream_t *w = *hw->streams;
    while (w != NULL && strcmp(w->name, name) != 0)
        w = w->next;
    if (w == NULL && (w = calloc(1, sizeof(*w))) != NULL) {
        w->s = hw->s;
        w->rh = hw->rh;
        kvli_scopy(w->name, sizeof(w->name), name);
        w->rev = rev;
        w->backoff_ms = 100;
        w->next = *hw->streams;
        *hw->streams = w;
    }
    if (w != NULL)
        w->wanted = true;
}

/* The watcher over plain HTTP: one stream per followed or awaited agent,
 * driven by one curl multi handle; resumed from the next revision. Used
 * with etcd authentication (etcd's WebSocket proxy does not pass the token
 * on) and where the gateway refuses WebSockets. */
static void kvli_etcd_watcher_http(kvli_etcd_t *s)
{
    CURLM *m = curl_multi_init();
    kvli_etcd_conn_t *rh = kvli_etcd_conn_new();
    kvli_etcd_stream_t *streams = NULL;
    pthread_mutex_lock(&s->lock);
    s->multi = m;
    pthread_mutex_unlock(&s->lock);
    for (;;) {
        pthread_mutex_lock(&s->lock);
        bool stop = s->stopping, restart = s->watch_restart;
        s->watch_restart = false;
        for (kvli_etcd_stream_t *w = streams; w != NULL; w = w->next)
            w->wanted = false;
        kvli_etcd_http_want_t hw = {.s = s, .rh = rh, .streams = &streams};
        if (!stop)
            kvli_etcd_wanted(s, kvli_etcd_http_want, &hw);
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
        uint64_t now = kvli_clock_ms(), next = now + 1000;
        for (kvli_etcd_stream_t **pp = &streams; *pp != NULL;) {
            kvli_etcd_stream_t *w = *pp;
            if (!w->wanted) {
                kvli_etcd_stream_stop(m, w);
                *pp = w->next;
                curl_easy_cleanup(w->h);
                curl_slist_free_all(w->hd);
                free(w->buf);
                free(w);
                continue;
            }
            if (restart && w->running) {
                kvli_etcd_stream_stop(m, w);
                w->retry_ms = now;
            }
            if (!w->running && now >= w->retry_ms)
                kvli_etcd_stream_start(s, m, w);
            if (!w->running && w->retry_ms < next)
                next = w->retry_ms;
            pp = &w->next;
        }
        int still = 0, left = 0;
        curl_multi_perform(m, &still);
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(m, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            kvli_etcd_stream_t *w = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&w);
            if (w == NULL)
                continue;
            CURLcode cc = msg->data.result;
            kvli_etcd_stream_stop(m, w);
            pthread_mutex_lock(&s->lock);
            stop = s->stopping;
            pthread_mutex_unlock(&s->lock);
            if (!stop)
                kvli_etcd_stream_ended(s, w, cc);
        }
        uint64_t reload_at = kvli_etcd_reload_due(s);
        if (reload_at < next)
            next = reload_at;
        /* Woken by traffic, by curl_multi_wakeup (followers changed, the
         * keeper, destroy), or for the next retry. */
        uint64_t after = kvli_clock_ms();
        int wait_ms = next > after ? (int)(next - after) : 0;
        for (kvli_etcd_stream_t *w = streams; w != NULL; w = w->next)
            if (!w->running && w->retry_ms <= after)
                wait_ms = 0;
        curl_multi_poll(m, NULL, 0, wait_ms > 1000 ? 1000 : wait_ms, NULL);
    }
    pthread_mutex_lock(&s->lock);
    s->multi = NULL;
    pthread_mutex_unlock(&s->lock);
    while (streams != NULL) {
        kvli_etcd_stream_t *w = streams;
        streams = w->next;
        kvli_etcd_stream_stop(m, w);
        curl_easy_cleanup(w->h);
        curl_slist_free_all(w->hd);
        free(w->buf);
        free(w);
    }
    curl_multi_cleanup(m);
    kvli_etcd_conn_free(rh);
}

/* ---- the watcher over one WebSocket ---- */

/* One watch on the agent's WebSocket: the presence key of one agent. */
typedef struct kvli_etcd_ww {
    struct kvli_etcd_ww *next;
    char name[KVL_NAME_MAX];
    int64_t id;                        /* our watch_id on the connection */
    int64_t rev;                       /* next revision to watch from (0: now) */
    uint64_t order;                    /* when its create was sent (creates answer in order) */
    bool sent, pending, wanted, warned;
    uint64_t retry_ms;                 /* monotonic ms of the next create */
    unsigned backoff_ms;
} kvli_etcd_ww_t;

typedef struct kvli_etcd_wsw {
    kvli_etcd_t *s;
    kvli_etcd_conn_t *rh;              /* reloads and resyncs */
    kvli_etcd_ws_t ws;
    bool grpc;                         /* a gRPC Watch stream on h2 instead of the WebSocket */
    bool reauth;                       /* etcd refused the stream's token: a new one first */
    kvli_h2_t *h2;
    int32_t sid;
    bool open, ever, warned, broken;
    kvli_etcd_ww_t *list;
    int64_t next_id;
    uint64_t next_order, retry_ms;
    unsigned backoff_ms;
    char fail[256];
} kvli_etcd_wsw_t;

static void kvli_etcd_ws_want(void *ctx, const char *name, int64_t rev)
{
    kvli_etcd_wsw_t *c = ctx;
    kvli_etcd_ww_t *w = c->list;
    while (w != NULL && strcmp(w->name, name) != 0)
        w = w->next;
    if (w == NULL && (w = calloc(1, sizeof(*w))) != NULL) {
        kvli_scopy(w->name, sizeof(w->name), name);
        w->rev = rev;
        w->backoff_ms = 100;
        w->next = c->list;
        c->list = w;
    }
    if (w != NULL)
        w->wanted = true;
}

static kvli_etcd_ww_t *kvli_etcd_ww_by_id(kvli_etcd_wsw_t *c, int64_t id)
{
    for (kvli_etcd_ww_t *w = c->list; w != NULL; w = w->next)
        if (w->sent && !w->pending && w->id == id)
            return w;
    return NULL;
}

/* The create that this "created" answer is for: the oldest one unanswered. */
static kvli_etcd_ww_t *kvli_etcd_ww_oldest(kvli_etcd_wsw_t *c)
{
    kvli_etcd_ww_t *o = NULL;
    for (kvli_etcd_ww_t *w = c->list; w != NULL; w = w->next)
        if (w->pending && (o == NULL || w->order < o->order))
            o = w;
    return o;
}

/* Send one watch request (create or cancel): false when the connection broke. */
static bool kvli_etcd_ws_req(kvli_etcd_wsw_t *c, json_object *req, const char *what)
{
    char why[200];
    int r;
    if (c->grpc) {
        uint8_t *m = NULL;
        size_t n = 0;
        r = kvli_etcd_pb_encode(KVLI_PB_WATCH_REQ, req, &m, &n, why, sizeof(why));
        if (r == 0)
            r = kvli_h2_stream_send(c->h2, c->sid, m, n, c->s->cl.timeout_ms, why, sizeof(why));
        free(m);
    } else {
        r = kvli_etcd_ws_send(&c->ws, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN),
                              c->s->cl.timeout_ms, why, sizeof(why));
    }
    json_object_put(req);
    if (r != 0) {
        snprintf(c->fail, sizeof(c->fail), "%s: %s", what, why);
        c->broken = true;
    }
    return r == 0;
}

static void kvli_etcd_ws_create(kvli_etcd_wsw_t *c, kvli_etcd_ww_t *w)
{
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + 8];
    json_object *b = json_object_new_object(), *cr = json_object_new_object();
    kvli_etcd_pkey(c->s, w->name, key, sizeof(key));
    kvli_etcd_put_key(cr, "key", key);
    if (w->rev > 0)
        json_object_object_add(cr, "start_revision", json_object_new_int64(w->rev));
    w->id = ++c->next_id;
    json_object_object_add(cr, "watch_id", json_object_new_int64(w->id));
    json_object_object_add(b, "create_request", cr);
    if (kvli_etcd_ws_req(c, b, "creating a watch")) {
        w->sent = w->pending = true;
        w->order = ++c->next_order;
    }
}

static void kvli_etcd_ws_cancel(kvli_etcd_wsw_t *c, kvli_etcd_ww_t *w)
{
    json_object *b = json_object_new_object(), *cr = json_object_new_object();
    json_object_object_add(cr, "watch_id", json_object_new_int64(w->id));
    json_object_object_add(b, "cancel_request", cr);
    (void)kvli_etcd_ws_req(c, b, "cancelling a watch");
}

/* A watch etcd ended or refused: again after its backoff. */
static void kvli_etcd_ww_retry(kvli_etcd_wsw_t *c, kvli_etcd_ww_t *w, const char *why)
{
    if (!w->warned)
        kvli_log(KVL_LOG_WARN, "etcd", "agent '%s': etcd watch on agent '%s' ended: %s; "
                 "resuming from revision %" PRId64 " (its restarts and departures are seen "
                 "when it resumes)", c->s->a->name, w->name, why, w->rev);
    w->warned = true;
    w->sent = w->pending = false;
    w->retry_ms = kvli_clock_ms() + w->backoff_ms;
    w->backoff_ms = w->backoff_ms * 2 > 2000 ? 2000 : w->backoff_ms * 2;
}

/* One watch answer (o, as the gateway writes it; taken). */
static void kvli_etcd_watch_answer(kvli_etcd_wsw_t *c, json_object *o)
{
    kvli_etcd_wres_t r;
    if (!kvli_etcd_wres_parse(o, &r)) {
        kvli_scopy(c->fail, sizeof(c->fail), r.fail);
        c->broken = true;
        json_object_put(o);
        return;
    }
    kvli_etcd_ww_t *w = r.created ? kvli_etcd_ww_oldest(c) : kvli_etcd_ww_by_id(c, r.watch_id);
    if (w == NULL) {
        json_object_put(o); /* a watch cancelled since */
        return;
    }
    if (r.created) {
        w->pending = false;
        if (!r.canceled) {
            w->backoff_ms = 100;
            if (w->warned)
                kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': etcd watch on agent '%s' resumed",
                         c->s->a->name, w->name);
            w->warned = false;
        }
    }
    if (r.canceled && r.compact > 0) {
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': etcd compacted past the watch's "
                 "revision; checking agent '%s'", c->s->a->name, w->name);
        if (kvli_etcd_resync(c->s, c->rh, w->name)) {
            w->rev = r.compact;
            w->sent = w->pending = false;
        } else {
            kvli_etcd_ww_retry(c, w, "etcd compacted past its revision and the check of the "
                                     "agent could not read etcd");
        }
    } else if (r.canceled) {
        char why[200];
        snprintf(why, sizeof(why), "etcd canceled the watch: %.150s", r.reason);
        kvli_etcd_ww_retry(c, w, why);
        /* a gRPC stream carries the token it was opened with: when etcd no
         * longer takes it, the stream is opened again with a new one */
        if (c->grpc && c->s->cl.user[0] != '\0' && strstr(r.reason, "token") != NULL) {
            c->reauth = c->broken = true;
            snprintf(c->fail, sizeof(c->fail), "%s", why);
        }
    }
    if (!r.canceled)
        kvli_etcd_events(c->s, r.events, &w->rev);
    json_object_put(o);
}

/* One message on the WebSocket: a watch answer. */
static void kvli_etcd_ws_msg(void *arg, const char *text, size_t len)
{
    json_object *o = json_tokener_parse(text);
    (void)len;
    if (o != NULL)
        kvli_etcd_watch_answer(arg, o);
}

/* One message on the gRPC Watch stream: a WatchResponse, handed on in the
 * gateway's form ({"result": ...}). */
static void kvli_etcd_h2_msg(void *arg, int32_t sid, const uint8_t *msg, size_t len)
{
    kvli_etcd_wsw_t *c = arg;
    json_object *o = NULL;
    char why[200];
    if (sid != c->sid || c->broken)
        return;
    if (kvli_etcd_pb_decode(KVLI_PB_WATCH_RESP, msg, len, &o, why, sizeof(why)) != 0) {
        snprintf(c->fail, sizeof(c->fail), "a watch answer that is not etcd's protobuf (%s)",
                 why);
        c->broken = true;
        return;
    }
    json_object *res = json_object_new_object();
    json_object_object_add(res, "result", o);
    kvli_etcd_watch_answer(c, res);
}

/* etcd ended the Watch stream (its trailers, or a reset). */
static void kvli_etcd_h2_end(void *arg, int32_t sid, int status, const char *message)
{
    kvli_etcd_wsw_t *c = arg;
    if (sid != c->sid)
        return;
    if (status < 0)
        snprintf(c->fail, sizeof(c->fail), "etcd reset the watch stream (%.200s)", message);
    else
        snprintf(c->fail, sizeof(c->fail), "etcd ended the watch stream: %.200s (gRPC code %d)",
                 message[0] ? message : "no message", status);
    if (status > 0 && c->s->cl.user[0] != '\0' && strstr(message, "token") != NULL)
        c->reauth = true;
    c->broken = true;
}

/* The connection went (or never came): every watch is created again on
 * the next one, from its revision. */
static void kvli_etcd_ws_down(kvli_etcd_wsw_t *c, const char *why)
{
    kvli_etcd_t *s = c->s;
    if (c->open && c->grpc) {
        kvli_h2_close(c->h2);
        c->h2 = NULL;
    } else if (c->open) {
        kvli_etcd_ws_close(&c->ws);
    }
    if (!c->warned)
        kvli_log(c->ever ? KVL_LOG_INFO : KVL_LOG_WARN, "etcd", "agent '%s': etcd watch "
                 "connection to %s ended: %s; resuming every watch from its revision (restarts "
                 "and departures are seen when it resumes)", s->a->name,
                 s->cl.eps[atomic_load(&s->cl.cur) % s->cl.n_eps], why);
    c->warned = true;
    if (!c->open && s->cl.n_eps > 1) {
        unsigned cur = atomic_load(&s->cl.cur);
        atomic_compare_exchange_strong(&s->cl.cur, &cur, (cur + 1) % s->cl.n_eps);
    }
    c->open = c->broken = false;
    for (kvli_etcd_ww_t *w = c->list; w != NULL; w = w->next)
        w->sent = w->pending = false;
    c->retry_ms = kvli_clock_ms() + c->backoff_ms;
    c->backoff_ms = c->backoff_ms * 2 > 2000 ? 2000 : c->backoff_ms * 2;
}

/* The gRPC Watch stream on a new connection to ep: as kvli_etcd_ws_open. */
static int kvli_etcd_h2_watch_open(kvli_etcd_wsw_t *c, const char *ep, char *why, size_t cap)
{
    kvli_etcd_t *s = c->s;
    char tok[KVLI_ETCD_TOKEN_MAX] = "";
    unsigned i = kvli_etcd_ep_index(&s->cl, ep);
    if (!kvli_etcd_grpc_on(&s->cl, i)) {
        snprintf(why, cap, "it serves no gRPC");
        return -2;
    }
    if (c->reauth) {
        kvl_error_t err;
        kvli_err_blank(&err);
        if (kvli_etcd_authenticate(&s->cl, c->rh, &err) != KVL_OK) {
            snprintf(why, cap, "authenticating again: %.200s", err.what);
            return -1;
        }
        c->reauth = false;
    }
    int r = kvli_h2_open(&c->h2, ep, s->cl.timeout_ms, why, cap);
    if (r == -2 && s->cl.api == KVLI_ETCD_API_AUTO)
        kvli_etcd_grpc_off(&s->cl, i, why);
    if (r != 0)
        return r == -2 && s->cl.api == KVLI_ETCD_API_AUTO ? -2 : -1;
    kvli_etcd_token(&s->cl, tok, sizeof(tok));
    if (kvli_h2_stream_open(c->h2, "/etcdserverpb.Watch/Watch", tok, &c->sid, s->cl.timeout_ms,
                            why, cap) != 0) {
        kvli_h2_close(c->h2);
        c->h2 = NULL;
        return -1;
    }
    return 0;
}

/* Connect when due: 1 open, 0 not now, -1 the endpoint answers no gRPC (a
 * gRPC watcher) or no WebSocket upgrade: another kind of watcher instead. */
static int kvli_etcd_ws_connect(kvli_etcd_wsw_t *c)
{
    kvli_etcd_t *s = c->s;
    char why[300];
    if (c->open)
        return 1;
    if (kvli_clock_ms() < c->retry_ms)
        return 0;
    const char *ep = s->cl.eps[atomic_load(&s->cl.cur) % s->cl.n_eps];
    int r = c->grpc ? kvli_etcd_h2_watch_open(c, ep, why, sizeof(why))
                    : kvli_etcd_ws_open(&c->ws, &s->cl, ep, "/v3/watch", s->cl.timeout_ms, why,
                                        sizeof(why));
    if (r == -2 && c->grpc)
        return -1;
    if (r == -2) {
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': etcd at %s: %s; watching each agent on a "
                 "plain HTTP stream of its own instead", s->a->name, ep, why);
        return -1;
    }
    if (r != 0) {
        kvli_etcd_ws_down(c, why);
        return 0;
    }
    if (c->warned)
        kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': etcd watch connection to %s is back",
                 s->a->name, ep);
    c->open = c->ever = true;
    c->warned = false;
    c->backoff_ms = 100;
    return 1;
}

/* Creates and cancels the wanted set needs; the time of the next retry. */
static uint64_t kvli_etcd_ws_sync(kvli_etcd_wsw_t *c, uint64_t now)
{
    uint64_t next = now + 1000;
    for (kvli_etcd_ww_t **pp = &c->list; *pp != NULL;) {
        kvli_etcd_ww_t *w = *pp;
        if (!w->wanted && !w->pending) {
            /* one still unanswered stays until its answer, so the order holds */
            if (w->sent && c->open && !c->broken)
                kvli_etcd_ws_cancel(c, w);
            *pp = w->next;
            free(w);
            continue;
        }
        if (w->wanted && !w->sent && c->open && !c->broken && now >= w->retry_ms)
            kvli_etcd_ws_create(c, w);
        if (w->wanted && !w->sent && w->retry_ms < next)
            next = w->retry_ms;
        pp = &w->next;
    }
    return next;
}

/* The watcher over one connection, every watch of the agent on it: a gRPC
 * Watch stream (grpc), or a WebSocket to the gateway. Returns false when
 * the endpoint serves neither (no gRPC; no WebSocket upgrade). */
static bool kvli_etcd_watcher_ws(kvli_etcd_t *s, bool grpc)
{
    kvli_etcd_wsw_t c = {.s = s, .rh = kvli_etcd_conn_new(), .backoff_ms = 100, .grpc = grpc};
    bool ok = true;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        bool stop = s->stopping, restart = s->watch_restart;
        s->watch_restart = false;
        for (kvli_etcd_ww_t *w = c.list; w != NULL; w = w->next)
            w->wanted = false;
        if (!stop)
            kvli_etcd_wanted(s, kvli_etcd_ws_want, &c);
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
        if (restart && c.open) {
            kvli_etcd_ws_down(&c, "etcd was out of reach");
            c.retry_ms = kvli_clock_ms();
        }
        int r = c.list != NULL ? kvli_etcd_ws_connect(&c) : 0;
        if (r < 0) {
            ok = false;
            break;
        }
        uint64_t reload_at = kvli_etcd_reload_due(s);
        uint64_t now = kvli_clock_ms(), next = kvli_etcd_ws_sync(&c, now);
        if (!c.open && c.list != NULL && c.retry_ms < next)
            next = c.retry_ms;
        if (reload_at < next)
            next = reload_at;
        struct pollfd p[2] = {{.fd = s->wake_fd, .events = POLLIN},
                              {.fd = !c.open ? -1 : c.grpc ? kvli_h2_fd(c.h2) : c.ws.fd,
                               .events = POLLIN}};
        if (c.open && c.grpc && kvli_h2_want_write(c.h2))
            p[1].events |= POLLOUT;
        /* messages the connection already read (during a send) wait no poll */
        bool queued = c.open && c.grpc && kvli_h2_pending(c.h2);
        int wait_ms = c.broken || queued ? 0 : next > now ? (int)(next - now) : 0;
        (void)poll(p, 2, wait_ms > 1000 ? 1000 : wait_ms);
        if (p[0].revents & POLLIN) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                kvli_log(KVL_LOG_DEBUG, "etcd", "watcher wake read: %s", strerror(errno));
        }
        char why[300] = "";
        int rr = 0;
        if (c.open && !c.broken)
            rr = c.grpc ? kvli_h2_pump(c.h2, KVLI_ETCD_REPLY_MAX, kvli_etcd_h2_msg,
                                       kvli_etcd_h2_end, &c, why, sizeof(why))
                        : kvli_etcd_ws_read(&c.ws, kvli_etcd_ws_msg, &c, why, sizeof(why));
        if (rr != 0)
            kvli_etcd_ws_down(&c, why);
        else if (c.open && c.broken)
            kvli_etcd_ws_down(&c, c.fail);
    }
    if (c.open && c.grpc)
        kvli_h2_close(c.h2);
    else if (c.open)
        kvli_etcd_ws_close(&c.ws);
    while (c.list != NULL) {
        kvli_etcd_ww_t *w = c.list;
        c.list = w->next;
        free(w);
    }
    kvli_etcd_conn_free(c.rh);
    return ok;
}

static void *kvli_etcd_watcher_main(void *arg)
{
    kvli_etcd_t *s = arg;
    /* gRPC where the endpoint serves it (the token rides on the stream);
     * else the gateway's WebSocket, which does not hand a token on; else a
     * plain HTTP stream per watched agent */
    unsigned cur = atomic_load(&s->cl.cur) % s->cl.n_eps;
    if (kvli_etcd_grpc_on(&s->cl, cur) && kvli_etcd_watcher_ws(s, true))
        return NULL;
    if (s->cl.user[0] != '\0' || !kvli_etcd_watcher_ws(s, false))
        kvli_etcd_watcher_http(s);
    return NULL;
}

/* ---- public calls ---- */

kvl_status_t kvl_etcd_attach(kvl_agent_t *a, const kvl_etcd_config_t *cfg)
{
    return kvl_etcd_attach_tls(a, cfg, NULL);
}

kvl_status_t kvl_etcd_attach_tls(kvl_agent_t *a, const kvl_etcd_config_t *cfg,
                                 const kvl_etcd_tls_t *tls)
{
    kvl_error_t err;
    if (a == NULL || cfg == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_etcd_attach: agent or config is NULL");
    kvli_err_blank(&err);
    kvli_scopy(err.backend, sizeof(err.backend), "etcd");
    const char *prefix = cfg->prefix && cfg->prefix[0] ? cfg->prefix : KVL_ETCD_DEFAULT_PREFIX;
    size_t pl = strlen(prefix);
    while (pl > 1 && prefix[pl - 1] == '/')
        pl--;
    if (pl >= KVLI_ETCD_PREFIX_MAX || prefix[0] != '/') {
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "etcd prefix '%.250s' must start with '/' and "
                 "be shorter than %u bytes", prefix, KVLI_ETCD_PREFIX_MAX);
        kvli_hint(&err, "e.g. /nixl/agents (NIXL_ETCD_NAMESPACE)");
        return kvli_fail(a, &err);
    }
    if (strchr(a->name, '/') != NULL) {
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "agent name '%s' contains '/', which etcd keys "
                 "use as separator", a->name);
        kvli_hint(&err, "name agents without '/' to publish them in etcd");
        return kvli_fail(a, &err);
    }
    if (cfg->lease_ttl_s > 3600) {
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "etcd lease TTL of %u s is more than an hour",
                 cfg->lease_ttl_s);
        kvli_hint(&err, "a dead agent stays visible for its TTL: use seconds (default 10)");
        return kvli_fail(a, &err);
    }
    kvli_etcd_global_init();
    kvli_etcd_t *s = kvli_store_state(a, &kvli_etcd_store, true);
    if (s == NULL)
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                "kvl_etcd_attach: out of memory or file descriptors (eventfd)");
    pthread_mutex_lock(&s->call_lock);
    pthread_mutex_lock(&s->lock);
    bool busy = s->attached || s->stopping;
    pthread_mutex_unlock(&s->lock);
    if (busy) {
        pthread_mutex_unlock(&s->call_lock);
        kvli_err(&err, KVL_ERR_EXISTS, 0, "agent '%s' is already attached to etcd (%s)",
                 a->name, s->cl.eps[0]);
        kvli_hint(&err, "one attachment per agent");
        return kvli_fail(a, &err);
    }
    kvl_status_t st = kvli_etcd_client_init(&s->cl, cfg->endpoints, cfg->user, cfg->password,
                                            cfg->timeout_ms ? cfg->timeout_ms : a->timeout_ms,
                                            tls, &err);
    memcpy(s->prefix, prefix, pl);
    s->prefix[pl] = '\0';
    s->ttl_s = cfg->lease_ttl_s ? cfg->lease_ttl_s : 10;
    if (st == KVL_OK && s->call_h == NULL && (s->call_h = kvli_etcd_conn_new()) == NULL) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, ENOMEM, "etcd: out of memory for a connection");
        st = KVL_ERR_NO_MEMORY;
    }
    int64_t lease = 0, rev = 0;
    if (st == KVL_OK)
        st = kvli_etcd_grant(s, s->call_h, &lease, &rev, &err);
    if (st == KVL_OK) {
        /* Leases need no permission: reading this agent's two keys (the
         * metadata under <prefix>/, the presence key under <prefix>.inc/)
         * checks auth on both, in one read-only transaction of two single
         * keys (a count over the namespace grew with the agents). */
        char k1[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + KVLI_ETCD_LABEL_MAX + 4];
        char k2[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + 8];
        json_object *b = json_object_new_object(), *out = NULL, *ops = json_object_new_array();
        kvli_etcd_key(s, a->name, KVL_ETCD_DEFAULT_LABEL, k1, sizeof(k1));
        kvli_etcd_pkey(s, a->name, k2, sizeof(k2));
        for (int i = 0; i < 2; i++) {
            json_object *op = json_object_new_object(), *rr = json_object_new_object();
            kvli_etcd_put_key(rr, "key", i == 0 ? k1 : k2);
            json_object_object_add(rr, "keys_only", json_object_new_boolean(1));
            json_object_object_add(op, "request_range", rr);
            json_object_array_add(ops, op);
        }
        json_object_object_add(b, "success", ops);
        st = kvli_etcd_call(&s->cl, s->call_h, "/v3/kv/txn", b, &out, NULL, 0, &err);
        json_object_put(b);
        if (out != NULL)
            json_object_put(out);
        if (st != KVL_OK) {
            kvl_error_t rerr;
            kvli_err_blank(&rerr);
            (void)kvli_etcd_revoke(s, s->call_h, lease, &rerr);
        }
    }
    if (st != KVL_OK) {
        kvli_etcd_client_fini(&s->cl);
        pthread_mutex_unlock(&s->call_lock);
        kvli_scopy(err.backend, sizeof(err.backend), "etcd");
        return kvli_fail(a, &err);
    }
    pthread_mutex_lock(&s->lock);
    s->lease = lease;
    (void)rev;
    s->attached = true;
    pthread_mutex_unlock(&s->lock);
    int e = pthread_create(&s->keeper, NULL, kvli_etcd_keeper_main, s);
    if (e == 0 && (e = pthread_create(&s->watcher, NULL, kvli_etcd_watcher_main, s)) != 0) {
        pthread_mutex_lock(&s->lock);
        s->stopping = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_unlock(&s->call_lock); /* the keeper may be waiting for it */
        pthread_join(s->keeper, NULL);
        pthread_mutex_lock(&s->call_lock);
    }
    if (e != 0) {
        kvl_error_t rerr;
        (void)kvli_etcd_revoke(s, s->call_h, lease, &rerr);
        pthread_mutex_lock(&s->lock);
        s->attached = false;
        s->stopping = false;
        s->lease = 0;
        pthread_mutex_unlock(&s->lock);
        kvli_etcd_client_fini(&s->cl);
        pthread_mutex_unlock(&s->call_lock);
        kvli_err(&err, KVL_ERR_SYSTEM, e, "etcd: pthread_create = %s", strerror(e));
        kvli_hint(&err, "check the thread limit (ulimit -u, pids cgroup)");
        return kvli_fail(a, &err);
    }
    s->threads = true;
    pthread_mutex_unlock(&s->call_lock);
    kvli_log(KVL_LOG_INFO, "etcd", "agent '%s' attached to etcd %s (prefix %s, lease %" PRIx64
             ", TTL %u s)", a->name, s->cl.eps[atomic_load(&s->cl.cur)], s->prefix,
             (uint64_t)lease, s->ttl_s);
    return KVL_OK;
}

static kvl_status_t kvli_etcd_publish(kvl_agent_t *a, const char *label, const void *blob,
                                      size_t len)
{
    kvl_error_t err;
    const char *call = blob ? "kvl_etcd_publish_partial" : "kvl_etcd_publish";
    if (a == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "%s: agent is NULL", call);
    kvli_err_blank(&err);
    kvli_scopy(err.backend, sizeof(err.backend), "etcd");
    if (blob != NULL && (label == NULL || label[0] == '\0' ||
                         strcmp(label, KVL_ETCD_DEFAULT_LABEL) == 0)) {
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "kvl_etcd_publish_partial: label '%s' is the "
                 "default label, which carries the agent's full metadata", KVL_ETCD_DEFAULT_LABEL);
        kvli_hint(&err, "publish partial metadata under a label of its own (NIXL requires one "
                        "too), and fetch it with that label");
        return kvli_fail(a, &err);
    }
    if (label == NULL || label[0] == '\0')
        label = KVL_ETCD_DEFAULT_LABEL;
    kvli_etcd_t *s = kvli_etcd_get(a, call, &err);
    if (s == NULL || kvli_etcd_label_ok(label, &err) != KVL_OK ||
        (blob != NULL && kvli_md_check_own_partial(a, blob, len, call, &err) != KVL_OK))
        return kvli_fail(a, &err);
    void *copy = NULL;
    if (blob != NULL && (copy = malloc(len)) == NULL)
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "%s: out of memory", call);
    if (copy != NULL)
        memcpy(copy, blob, len);
    pthread_mutex_lock(&s->call_lock);
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->lease;
    unsigned npubs = 0;
    bool again = false; /* a label published before: replaced, not added */
    for (kvli_etcd_pub_t *p = s->pubs; p != NULL; p = p->next) {
        npubs++;
        again = again || strcmp(p->label, label) == 0;
    }
    pthread_mutex_unlock(&s->lock);
    kvl_status_t st = KVL_OK;
    if (npubs >= KVLI_ETCD_PUBS_MAX && !again) {
        kvli_err(&err, KVL_ERR_INVALID_ARG, 0, "agent '%s' already publishes %u labels in etcd",
                 a->name, KVLI_ETCD_PUBS_MAX);
        kvli_hint(&err, "reuse labels: publishing a label again replaces its metadata");
        st = KVL_ERR_INVALID_ARG;
    }
    if (st == KVL_OK && lease == 0) {
        st = kvli_etcd_grant(s, s->call_h, &lease, NULL, &err);
        if (st == KVL_OK) {
            pthread_mutex_lock(&s->lock);
            s->lease = lease;
            pthread_mutex_unlock(&s->lock);
        }
    }
    if (st == KVL_OK)
        st = kvli_etcd_put_md(s, s->call_h, label, blob, len, lease, &err);
    if (st == KVL_OK) {
        pthread_mutex_lock(&s->lock);
        kvli_etcd_pub_t *p = s->pubs;
        while (p != NULL && strcmp(p->label, label) != 0)
            p = p->next;
        if (p == NULL && (p = calloc(1, sizeof(*p))) != NULL) {
            kvli_scopy(p->label, sizeof(p->label), label);
            p->next = s->pubs;
            s->pubs = p;
        }
        if (p != NULL) {
            free(p->blob);
            p->blob = copy;
            p->len = len;
            copy = NULL;
        }
        s->lease_wanted = true;
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&s->call_lock);
    free(copy);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    kvli_log(KVL_LOG_DEBUG, "etcd", "agent '%s': published '%s'", a->name, label);
    return KVL_OK;
}

kvl_status_t kvl_etcd_publish(kvl_agent_t *a, const char *label)
{
    return kvli_etcd_publish(a, label, NULL, 0);
}

kvl_status_t kvl_etcd_publish_partial(kvl_agent_t *a, const char *label, const void *blob,
                                      size_t len)
{
    if (blob == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_etcd_publish_partial: blob is NULL");
    return kvli_etcd_publish(a, label, blob, len);
}

/* Read a batch of keys: one range, or one read-only transaction of ranges
 * (etcd answers it at one revision). Fills every read's result. */
static void kvli_etcd_read_batch(kvli_etcd_t *s, kvli_etcd_conn_t *h, kvli_etcd_read_t **batch,
                                 unsigned n)
{
    json_object *b = json_object_new_object(), *out = NULL, *resps = NULL;
    kvl_error_t err;
    kvli_err_blank(&err);
    if (n == 1) {
        kvli_etcd_put_key(b, "key", batch[0]->key);
    } else {
        json_object *ops = json_object_new_array();
        for (unsigned i = 0; i < n; i++) {
            json_object *op = json_object_new_object(), *rr = json_object_new_object();
            kvli_etcd_put_key(rr, "key", batch[i]->key);
            json_object_object_add(op, "request_range", rr);
            json_object_array_add(ops, op);
        }
        json_object_object_add(b, "success", ops);
    }
    kvl_status_t st = kvli_etcd_call(&s->cl, h, n == 1 ? "/v3/kv/range" : "/v3/kv/txn", b, &out,
                                     NULL, 0, &err);
    json_object_put(b);
    if (st == KVL_OK && n > 1 && ((resps = kvli_etcd_arr(out, "responses")) == NULL ||
                                  json_object_array_length(resps) != n)) {
        kvli_err(&err, KVL_ERR_REMOTE, EPROTO, "etcd answered a transaction of %u reads with "
                 "%zu answers", n, resps ? json_object_array_length(resps) : (size_t)0);
        kvli_hint(&err, "is that an etcd v3.4 or later? Check its log");
        st = KVL_ERR_REMOTE;
    }
    int64_t rev = st == KVL_OK ? kvli_etcd_i64(kvli_etcd_obj(out, "header"), "revision") : 0;
    for (unsigned i = 0; i < n; i++) {
        kvli_etcd_read_t *r = batch[i];
        /* resps is an array of n only when the call succeeded: json-c
         * asserts (aborts) on an array call that meets anything else */
        json_object *ans = st != KVL_OK ? NULL
                           : n > 1 ? kvli_etcd_obj(json_object_array_get_idx(resps, i),
                                                   "response_range")
                                   : out;
        char why[96];
        r->rev = rev;
        r->st = st;
        if (st == KVL_OK && ans == NULL) {
            snprintf(why, sizeof(why), "etcd answered read %u of a transaction with no range", i);
            r->st = KVL_ERR_REMOTE;
        } else if (st == KVL_OK) {
            r->st = kvli_etcd_range_value(ans, &r->blob, &r->len, why, sizeof(why));
        }
        if (st == KVL_OK && r->st == KVL_ERR_REMOTE) {
            if (r->err != NULL) {
                kvli_err(r->err, KVL_ERR_REMOTE, EPROTO, "reading key '%s': %s", r->key, why);
                kvli_hint(r->err, "kvlane writes base64 JSON through etcd's gateway: another "
                                  "program may write under that prefix, or a proxy rewrites "
                                  "the answers");
            }
        } else if (st != KVL_OK && r->err != NULL) {
            memcpy(r->err, &err, sizeof(err));
        }
    }
    if (out != NULL)
        json_object_put(out);
}

/* Read n keys (each read's result in it). Reads that threads of this
 * agent ask for at the same time go to etcd together: the caller that
 * finds no batch in flight sends every read queued so far (up to
 * KVLI_ETCD_READ_BATCH) as one request, on the agent's connection for
 * calls (call_h). */
static void kvli_etcd_get_keys(kvli_etcd_t *s, kvli_etcd_read_t **rs, unsigned n)
{
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < n; i++) {
        *s->reads_tail = rs[i];
        s->reads_tail = &rs[i]->next;
    }
    for (unsigned i = 0; i < n;) {
        if (rs[i]->done) {
            i++;
            continue;
        }
        if (s->reading) {
            pthread_cond_wait(&s->read_cond, &s->lock);
            continue;
        }
        kvli_etcd_read_t *batch[KVLI_ETCD_READ_BATCH];
        unsigned nb = 0;
        s->reading = true;
        while (s->reads != NULL && nb < KVLI_ETCD_READ_BATCH) {
            batch[nb++] = s->reads;
            s->reads = s->reads->next;
        }
        if (s->reads == NULL)
            s->reads_tail = &s->reads;
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_lock(&s->call_lock);
        kvli_etcd_read_batch(s, s->call_h, batch, nb);
        pthread_mutex_unlock(&s->call_lock);
        pthread_mutex_lock(&s->lock);
        for (unsigned k = 0; k < nb; k++)
            batch[k]->done = true;
        s->reading = false;
        pthread_cond_broadcast(&s->read_cond);
    }
    pthread_mutex_unlock(&s->lock);
}

/* Range-get one key: KVL_OK with *blob_p (malloc'ed) or KVL_ERR_NOT_FOUND
 * (read with the reads other threads ask for at the same time). */
static kvl_status_t kvli_etcd_get_key(kvli_etcd_t *s, const char *key, void **blob_p,
                                      size_t *len_p, int64_t *rev_p, kvl_error_t *err)
{
    kvli_etcd_read_t me = {.key = key, .err = err}, *rs = &me;
    kvli_etcd_get_keys(s, &rs, 1);
    *blob_p = me.blob;
    *len_p = me.len;
    if (rev_p != NULL)
        *rev_p = me.rev;
    return me.st;
}

/* Stop waiting for a publish (under s->lock). */
static void kvli_etcd_unwait(kvli_etcd_t *s, kvli_etcd_waiter_t *wt)
{
    for (kvli_etcd_waiter_t **pp = &s->waiters; *pp != NULL; pp = &(*pp)->next)
        if (*pp == wt) {
            *pp = wt->next;
            break;
        }
}

/* What every fetch checks; the attachment, or NULL with err. *label_p
 * NULL or "": the default label. */
static kvli_etcd_t *kvli_etcd_fetch_args(kvl_agent_t *a, const char *fn, const char *name,
                                         const char **label_p, kvl_error_t *err)
{
    if (*label_p == NULL || (*label_p)[0] == '\0')
        *label_p = KVL_ETCD_DEFAULT_LABEL;
    kvli_etcd_t *s = kvli_etcd_get(a, fn, err);
    if (s == NULL || kvli_etcd_label_ok(*label_p, err) != KVL_OK)
        return NULL;
    if (name[0] == '\0' || strlen(name) >= KVL_NAME_MAX || strchr(name, '/') != NULL) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "%s: agent name '%.100s' is empty, too long or "
                 "contains '/'", fn, name);
        kvli_hint(err, "pass the name the peer agent was created with");
        return NULL;
    }
    if (strcmp(name, a->name) == 0) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "agent '%s' cannot fetch its own metadata from "
                 "etcd: an agent is not its own peer", name);
        kvli_hint(err, "fetch a peer's name");
        return NULL;
    }
    return s;
}

static void kvli_etcd_not_found(kvl_error_t *err, const char *name, const char *key,
                                uint64_t wait_ms)
{
    kvli_err(err, KVL_ERR_NOT_FOUND, 0, "etcd has no metadata of agent '%s' under %s "
             "(waited %" PRIu64 " ms)", name, key, wait_ms);
    kvli_hint(err, "the agent has not published yet (send_local_metadata, "
                   "kvl_etcd_publish), publishes under another prefix or label, or it "
                   "died and its lease expired");
    kvli_scopy(err->agent, sizeof(err->agent), name);
}

/* A fetch ends (under s->lock): its waiter goes. A background fetch (bg)
 * keeps its result, unless it was asked for again since its read (seq):
 * then it reads again. True when it ended. */
static bool kvli_etcd_fetch_end(kvli_etcd_t *s, kvli_etcd_waiter_t *wt, kvli_etcd_bg_t *bg,
                                uint64_t seq, kvl_status_t st, const kvl_error_t *err)
{
    if (bg == NULL) {
        kvli_etcd_unwait(s, wt);
        return true;
    }
    bg->busy = false;
    if (bg->seq != seq) {
        bg->next_read = 0;
        pthread_cond_broadcast(&s->put_cond); /* the fetcher reads it again */
        return false;
    }
    kvli_etcd_unwait(s, &bg->wt);
    bg->st = st;
    if (st != KVL_OK && (bg->err != NULL || (bg->err = malloc(sizeof(*bg->err))) != NULL))
        memcpy(bg->err, err,
               offsetof(kvl_error_t, causes) + err->n_causes * sizeof(err->causes[0]));
    pthread_cond_broadcast(&s->bg_cond);
    return true;
}

/*
 * A fetch read name's metadata (blob, freed here) at revision rev: load it
 * and follow the agent. The fetch's waiter stays until the peer is
 * followed: its watch goes on as the follower's instead of being closed and
 * opened again. bg: a background fetch, read when it was at seq.
 */
static kvl_status_t kvli_etcd_adopt(kvli_etcd_t *s, const char *name, const char *label,
                                    const char *key, void *blob, size_t len, int64_t rev,
                                    kvli_etcd_waiter_t *wt, kvli_etcd_bg_t *bg, uint64_t seq,
                                    bool *ended_p, kvl_error_t *err)
{
    kvl_agent_t *a = s->a;
    char got[KVL_NAME_MAX] = "";
    uint64_t gen = 0;
    bool partial = false;
    kvli_md_t md;
    kvl_error_t derr;
    if (kvli_md_decode(blob, len, &md, &derr) == KVL_OK) {
        gen = md.generation;
        partial = (md.flags & KVLI_MD_FLAG_PARTIAL) != 0;
        kvli_md_release(&md);
    }
    kvl_status_t st = kvl_metadata_load(a, blob, len, got, sizeof(got));
    free(blob);
    if (st != KVL_OK) {
        const kvl_error_t *le = kvl_last_error();
        memcpy(err, le, offsetof(kvl_error_t, causes) + le->n_causes * sizeof(le->causes[0]));
    } else if (strcmp(got, name) != 0) {
        (void)kvl_remote_remove(a, got);
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "etcd key %s holds the metadata of agent '%s', "
                 "not '%s'; nothing was loaded", key, got, name);
        kvli_hint(err, "two agents publish under one name, or the key was written by hand: "
                       "check the agents' names");
        st = KVL_ERR_BAD_METADATA;
    }
    if (st != KVL_OK) {
        pthread_mutex_lock(&s->lock);
        bool ended = kvli_etcd_fetch_end(s, wt, bg, seq, st, err);
        pthread_mutex_unlock(&s->lock);
        if (ended_p != NULL)
            *ended_p = ended;
        return st;
    }
    uint64_t inc = kvl_remote_incarnation(a, name);
    pthread_mutex_lock(&s->lock);
    kvli_etcd_follow_t *f = kvli_etcd_follow_find(s, name);
    bool fresh = f == NULL;
    if (f == NULL && (f = calloc(1, sizeof(*f))) != NULL) {
        kvli_scopy(f->name, sizeof(f->name), name);
        f->next = s->follows;
        s->follows = f;
    }
    if (f != NULL) {
        /* A partial label does not replace the label followed (a new
         * generation is reloaded from the full metadata when that is it). */
        if (fresh || !partial || f->incarnation != inc)
            kvli_scopy(f->label, sizeof(f->label), label);
        if (fresh || f->incarnation != inc || f->generation < gen)
            f->generation = gen;
        if (fresh || f->incarnation != inc) {
            f->pending = 0; /* a failed reload of the incarnation before */
            f->failures = f->backoff_ms = 0;
        }
        f->incarnation = inc;
        f->rev = rev + 1;
    }
    kvli_etcd_fetch_end(s, wt, bg, seq, KVL_OK, NULL);
    kvli_etcd_wake(s);
    pthread_mutex_unlock(&s->lock);
    kvli_log(KVL_LOG_DEBUG, "etcd", "agent '%s': loaded agent '%s' from etcd", a->name, name);
    return KVL_OK;
}

/* Until when (CLOCK_REALTIME, for pthread_cond_timedwait) to wait ms. */
static struct timespec kvli_etcd_abs(uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    return ts;
}

kvl_status_t kvl_etcd_fetch(kvl_agent_t *a, const char *name, const char *label,
                            uint64_t wait_ms)
{
    kvl_error_t err;
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + KVLI_ETCD_LABEL_MAX + 4];
    if (a == NULL || name == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_etcd_fetch: agent or name is NULL");
    kvli_err_blank(&err);
    kvli_scopy(err.backend, sizeof(err.backend), "etcd");
    kvli_etcd_t *s = kvli_etcd_fetch_args(a, "kvl_etcd_fetch", name, &label, &err);
    if (s == NULL)
        return kvli_fail(a, &err);
    kvli_etcd_key(s, name, label, key, sizeof(key));
    uint64_t deadline = kvli_clock_ms() + wait_ms;
    void *blob = NULL;
    size_t len = 0;
    kvl_status_t st;
    /* Registered before the first read: a publish between the read and the
     * wait is not missed. */
    kvli_etcd_waiter_t wt = {.name = name};
    int64_t last_rev = 0;
    pthread_mutex_lock(&s->lock);
    wt.next = s->waiters;
    s->waiters = &wt;
    pthread_mutex_unlock(&s->lock);
    for (;;) {
        int64_t rev = 0;
        st = kvli_etcd_get_key(s, key, &blob, &len, &rev, &err);
        if (st == KVL_OK)
            last_rev = rev;
        if (st != KVL_ERR_NOT_FOUND || kvli_clock_ms() >= deadline)
            break;
        pthread_mutex_lock(&s->lock);
        if (wt.rev == 0 && rev > 0) {
            wt.rev = rev + 1; /* the watcher starts its stream from here */
            kvli_etcd_wake(s);
        }
        pthread_mutex_unlock(&s->lock);
        /* Wait for its presence key (the watcher); read again at least
         * every second in case the watch is down. */
        pthread_mutex_lock(&s->lock);
        uint64_t left = deadline - kvli_clock_ms();
        struct timespec ts = kvli_etcd_abs(left < 1000 ? left : 1000);
        while (!wt.put && !s->stopping &&
               pthread_cond_timedwait(&s->put_cond, &s->lock, &ts) == 0)
            ;
        wt.put = false;
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
    }
    if (st == KVL_ERR_NOT_FOUND)
        kvli_etcd_not_found(&err, name, key, wait_ms);
    if (st != KVL_OK) {
        pthread_mutex_lock(&s->lock);
        kvli_etcd_unwait(s, &wt);
        pthread_mutex_unlock(&s->lock);
        return kvli_fail(a, &err);
    }
    if (kvli_etcd_adopt(s, name, label, key, blob, len, last_rev, &wt, NULL, 0, NULL, &err) !=
        KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

/* A background fetch being read: what it was when its read was sent. */
typedef struct kvli_etcd_due {
    kvli_etcd_bg_t *bg;
    uint64_t seq, wait_ms, deadline;
    char name[KVL_NAME_MAX];
    char label[KVLI_ETCD_LABEL_MAX];
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + KVLI_ETCD_LABEL_MAX + 4];
    kvli_etcd_read_t rd;
} kvli_etcd_due_t;

/* Metadata a background fetch read, waiting for a loader. */
typedef struct kvli_etcd_load {
    struct kvli_etcd_load *next;
    kvli_etcd_bg_t *bg;
    uint64_t seq;
    void *blob;
    size_t len;
    int64_t rev;
    char name[KVL_NAME_MAX];
    char label[KVLI_ETCD_LABEL_MAX];
    char key[KVLI_ETCD_PREFIX_MAX + KVL_NAME_MAX + KVLI_ETCD_LABEL_MAX + 4];
} kvli_etcd_load_t;

static void kvli_etcd_bg_failed(kvli_etcd_t *s, const char *name, const kvl_error_t *err)
{
    char text[1024];
    kvl_error_render(err, text, sizeof(text));
    kvli_log(KVL_LOG_ERROR, "etcd", "agent '%s': background fetch of agent '%s' failed: %s",
             s->a->name, name, text);
}

/* Load one background fetch's metadata (a loader, under no lock). */
static void kvli_etcd_load_one(kvli_etcd_t *s, kvli_etcd_load_t *ld, kvl_error_t *err)
{
    bool ended = false;
    kvli_err_blank(err);
    kvli_scopy(err->backend, sizeof(err->backend), "etcd");
    if (kvli_etcd_adopt(s, ld->name, ld->label, ld->key, ld->blob, ld->len, ld->rev, NULL,
                        ld->bg, ld->seq, &ended, err) != KVL_OK && ended)
        kvli_etcd_bg_failed(s, ld->name, err);
    free(ld);
}

static void *kvli_etcd_loader_main(void *arg)
{
    struct kvli_etcd_loader *me = arg;
    kvli_etcd_t *s = me->s;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stopping && s->loads == NULL) {
            s->idle_loaders++;
            pthread_cond_wait(&s->load_cond, &s->lock);
            s->idle_loaders--;
        }
        if (s->stopping)
            break;
        kvli_etcd_load_t *ld = s->loads;
        s->loads = ld->next;
        if (s->loads == NULL)
            s->loads_tail = &s->loads;
        pthread_mutex_unlock(&s->lock);
        kvli_etcd_load_one(s, ld, me->err);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Start one more loader (under s->lock); false when none could be. */
static bool kvli_etcd_loader_start(kvli_etcd_t *s)
{
    if (s->nloaders >= KVLI_ETCD_LOADERS)
        return false;
    struct kvli_etcd_loader *l = &s->loaders[s->nloaders];
    l->s = s;
    if (l->err == NULL)
        l->err = malloc(sizeof(*l->err));
    if (l->err == NULL || pthread_create(&l->th, NULL, kvli_etcd_loader_main, l) != 0)
        return false;
    s->nloaders++;
    return true;
}

/* Queue a load (under s->lock), starting a loader when none is free;
 * false: none runs and none could be started (the caller loads it). */
static bool kvli_etcd_load_queue(kvli_etcd_t *s, kvli_etcd_load_t *ld)
{
    if (s->idle_loaders == 0 && !kvli_etcd_loader_start(s) && s->nloaders == 0)
        return false;
    ld->next = NULL;
    *s->loads_tail = ld;
    s->loads_tail = &ld->next;
    pthread_cond_signal(&s->load_cond);
    return true;
}

/* One background fetch's read came back (the fetcher, under no lock):
 * found, its metadata goes to a loader. */
static void kvli_etcd_bg_read(kvli_etcd_t *s, kvli_etcd_due_t *d, kvl_error_t *err)
{
    bool ended = false;
    kvli_err_blank(err);
    kvli_scopy(err->backend, sizeof(err->backend), "etcd");
    if (d->rd.st == KVL_OK) {
        kvli_etcd_load_t *ld = malloc(sizeof(*ld));
        if (ld != NULL) {
            *ld = (kvli_etcd_load_t){.bg = d->bg, .seq = d->seq, .blob = d->rd.blob,
                                     .len = d->rd.len, .rev = d->rd.rev};
            kvli_scopy(ld->name, sizeof(ld->name), d->name);
            kvli_scopy(ld->label, sizeof(ld->label), d->label);
            kvli_scopy(ld->key, sizeof(ld->key), d->key);
            pthread_mutex_lock(&s->lock);
            bool queued = kvli_etcd_load_queue(s, ld);
            pthread_mutex_unlock(&s->lock);
            if (!queued)
                kvli_etcd_load_one(s, ld, err);
            return;
        }
        free(d->rd.blob);
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "etcd: no memory to load the metadata of "
                 "agent '%s'", d->name);
        d->rd.st = KVL_ERR_NO_MEMORY;
    } else if (d->rd.st != KVL_ERR_NOT_FOUND) {
        memcpy(err, d->rd.err, sizeof(*err)); /* the read failed */
    }
    uint64_t now = kvli_clock_ms();
    kvli_etcd_bg_t *b = d->bg;
    pthread_mutex_lock(&s->lock);
    if (b->seq != d->seq) {
        b->busy = false;
        b->next_read = 0; /* asked again since: read again, to its new deadline */
    } else if (d->rd.st == KVL_ERR_NOT_FOUND && now < d->deadline) {
        /* not there yet: the watcher watches for it from this read on */
        if (b->wt.rev == 0 && d->rd.rev > 0) {
            b->wt.rev = d->rd.rev + 1;
            kvli_etcd_wake(s);
        }
        b->busy = false;
        b->next_read = now + (d->deadline - now < 1000 ? d->deadline - now : 1000);
    } else {
        if (d->rd.st == KVL_ERR_NOT_FOUND)
            kvli_etcd_not_found(err, d->name, d->key, d->wait_ms);
        ended = kvli_etcd_fetch_end(s, NULL, b, d->seq, d->rd.st, err);
    }
    pthread_mutex_unlock(&s->lock);
    if (ended)
        kvli_etcd_bg_failed(s, d->name, err);
}

/*
 * The fetcher thread: serves the agent's background fetches as
 * kvl_etcd_fetch serves one (a peer that has not published yet is waited
 * for through the watcher, and read again at least every second), reading
 * the keys of every fetch that is due (its first read, its peer's presence
 * key put, or a second gone) in one transaction; what it finds goes to the
 * loaders. A failure is logged: the caller went on (NIXL logs it too).
 * Its buffers: s->bg_due, s->bg_err, s->bg_rerr.
 */
static void *kvli_etcd_fetcher_main(void *arg)
{
    kvli_etcd_t *s = arg;
    kvli_etcd_due_t *due = s->bg_due;
    kvli_etcd_read_t *rs[KVLI_ETCD_READ_BATCH];
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        uint64_t now = kvli_clock_ms(), next = UINT64_MAX;
        unsigned n = 0;
        for (kvli_etcd_bg_t *b = s->bgs; b != NULL; b = b->next) {
            if (b->st != KVL_IN_PROGRESS || b->busy)
                continue;
            if ((b->wt.put || b->next_read <= now) && n < KVLI_ETCD_READ_BATCH) {
                kvli_etcd_due_t *d = &due[n];
                memset(&d->rd, 0, sizeof(d->rd));
                d->rd.err = s->bg_rerr;
                d->bg = b;
                d->seq = b->seq;
                d->wait_ms = b->wait_ms;
                d->deadline = b->deadline;
                kvli_scopy(d->name, sizeof(d->name), b->name);
                kvli_scopy(d->label, sizeof(d->label), b->label);
                kvli_etcd_key(s, d->name, d->label, d->key, sizeof(d->key));
                d->rd.key = d->key;
                rs[n++] = &d->rd;
                b->wt.put = false;
                b->busy = true;
            } else if (b->next_read < next) {
                next = b->next_read;
            }
        }
        if (n == 0) {
            /* until a put, a new fetch, the agent's end (all broadcast
             * put_cond) or the next read of a pending one */
            if (next == UINT64_MAX) {
                pthread_cond_wait(&s->put_cond, &s->lock);
            } else {
                struct timespec ts = kvli_etcd_abs(next > now ? next - now : 0);
                pthread_cond_timedwait(&s->put_cond, &s->lock, &ts);
            }
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        kvli_etcd_get_keys(s, rs, n);
        for (unsigned i = 0; i < n; i++)
            kvli_etcd_bg_read(s, &due[i], s->bg_err);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

kvl_status_t kvl_etcd_fetch_async(kvl_agent_t *a, const char *name, const char *label,
                                  uint64_t wait_ms)
{
    kvl_error_t err;
    if (a == NULL || name == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_etcd_fetch_async: agent or name is NULL");
    kvli_err_blank(&err);
    kvli_scopy(err.backend, sizeof(err.backend), "etcd");
    kvli_etcd_t *s = kvli_etcd_fetch_args(a, "kvl_etcd_fetch_async", name, &label, &err);
    if (s == NULL)
        return kvli_fail(a, &err);
    pthread_mutex_lock(&s->lock);
    if (!s->fetcher_on) {
        if (s->bg_due == NULL)
            s->bg_due = calloc(KVLI_ETCD_READ_BATCH, sizeof(*s->bg_due));
        if (s->bg_err == NULL)
            s->bg_err = malloc(sizeof(*s->bg_err));
        if (s->bg_rerr == NULL)
            s->bg_rerr = malloc(sizeof(*s->bg_rerr));
        if (s->bg_due == NULL || s->bg_err == NULL || s->bg_rerr == NULL) {
            pthread_mutex_unlock(&s->lock);
            return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                    "kvl_etcd_fetch_async: out of memory");
        }
        int e = pthread_create(&s->fetcher, NULL, kvli_etcd_fetcher_main, s);
        if (e != 0) {
            pthread_mutex_unlock(&s->lock);
            kvli_err(&err, KVL_ERR_SYSTEM, e, "etcd: starting the background fetch thread: "
                     "pthread_create = %s", strerror(e));
            kvli_hint(&err, "check the thread limit (ulimit -u, pids cgroup), or fetch in the "
                            "caller's thread (kvl_etcd_fetch)");
            return kvli_fail(a, &err);
        }
        s->fetcher_on = true;
    }
    /* in the order asked (the fetcher reads and loads them in this order) */
    kvli_etcd_bg_t **pp = &s->bgs, *b;
    unsigned nbg = 0;
    while (*pp != NULL && strcmp((*pp)->name, name) != 0) {
        pp = &(*pp)->next;
        nbg++;
    }
    if ((b = *pp) == NULL && nbg >= KVLI_ETCD_BG_KEEP) {
        /* forget the oldest ended ones (nothing refers to an ended fetch) */
        for (kvli_etcd_bg_t **q = &s->bgs; *q != NULL && nbg >= KVLI_ETCD_BG_KEEP;) {
            kvli_etcd_bg_t *o = *q;
            if (o->st == KVL_IN_PROGRESS || o->busy) {
                q = &o->next;
                continue;
            }
            *q = o->next;
            free(o->err);
            free(o);
            nbg--;
        }
        for (pp = &s->bgs; *pp != NULL;)
            pp = &(*pp)->next;
    }
    if (b == NULL) {
        if ((b = calloc(1, sizeof(*b))) == NULL) {
            pthread_mutex_unlock(&s->lock);
            return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL,
                                    "kvl_etcd_fetch_async: out of memory");
        }
        kvli_scopy(b->name, sizeof(b->name), name);
        b->st = KVL_OK; /* not pending: armed below */
        *pp = b;
    }
    if (b->st != KVL_IN_PROGRESS) {
        /* registered before its first read, as kvl_etcd_fetch's */
        b->wt = (kvli_etcd_waiter_t){.name = b->name, .next = s->waiters};
        s->waiters = &b->wt;
        b->st = KVL_IN_PROGRESS;
        b->next_read = 0;
    } else if (!b->busy) {
        b->next_read = 0; /* pending: read again now (busy: once its read or load is back) */
    }
    b->seq++;
    kvli_scopy(b->label, sizeof(b->label), label);
    b->wait_ms = wait_ms;
    b->deadline = kvli_clock_ms() + wait_ms;
    pthread_cond_broadcast(&s->put_cond);
    pthread_mutex_unlock(&s->lock);
    return KVL_OK;
}

kvl_status_t kvl_etcd_fetch_status(kvl_agent_t *a, const char *name, uint64_t wait_ms)
{
    kvl_error_t err;
    if (a == NULL || name == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_etcd_fetch_status: agent or name is NULL");
    kvli_err_blank(&err);
    kvli_scopy(err.backend, sizeof(err.backend), "etcd");
    kvli_etcd_t *s = kvli_etcd_get(a, "kvl_etcd_fetch_status", &err);
    if (s == NULL)
        return kvli_fail(a, &err);
    pthread_mutex_lock(&s->lock);
    kvli_etcd_bg_t *b = s->bgs;
    while (b != NULL && strcmp(b->name, name) != 0)
        b = b->next;
    if (b == NULL) {
        pthread_mutex_unlock(&s->lock);
        kvli_err(&err, KVL_ERR_STATE, 0, "agent '%s' started no background fetch of agent "
                 "'%.100s'", a->name, name);
        kvli_hint(&err, "start one with kvl_etcd_fetch_async (Python: etcd_fetch_async; "
                        "kvlane.nixl: fetch_remote_metadata without an address)");
        kvli_scopy(err.agent, sizeof(err.agent), name);
        return kvli_fail(a, &err);
    }
    struct timespec ts = kvli_etcd_abs(wait_ms);
    while (b->st == KVL_IN_PROGRESS && !s->stopping &&
           pthread_cond_timedwait(&s->bg_cond, &s->lock, &ts) != ETIMEDOUT)
        ;
    kvl_status_t st = b->st;
    if (st != KVL_OK && st != KVL_IN_PROGRESS && b->err != NULL)
        memcpy(&err, b->err, offsetof(kvl_error_t, causes) +
                                 b->err->n_causes * sizeof(b->err->causes[0]));
    else if (st != KVL_OK && st != KVL_IN_PROGRESS)
        kvli_err(&err, st, 0, "the background fetch of agent '%.100s' failed; no memory was "
                 "left to keep its error (logged when it failed)", name);
    pthread_mutex_unlock(&s->lock);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        return st;
    return kvli_fail(a, &err);
}

kvl_status_t kvl_etcd_unpublish(kvl_agent_t *a)
{
    kvl_error_t err;
    if (a == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_etcd_unpublish: agent is NULL");
    kvli_err_blank(&err);
    kvli_scopy(err.backend, sizeof(err.backend), "etcd");
    kvli_etcd_t *s = kvli_etcd_get(a, "kvl_etcd_unpublish", &err);
    if (s == NULL)
        return kvli_fail(a, &err);
    pthread_mutex_lock(&s->call_lock);
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->lease;
    s->lease = 0;
    s->lease_wanted = false;
    while (s->pubs != NULL) {
        kvli_etcd_pub_t *p = s->pubs;
        s->pubs = p->next;
        free(p->blob);
        free(p);
    }
    pthread_mutex_unlock(&s->lock);
    kvl_status_t st = lease ? kvli_etcd_revoke(s, s->call_h, lease, &err) : KVL_OK;
    pthread_mutex_unlock(&s->call_lock);
    if (st != KVL_OK)
        return kvli_fail(a, &err);
    return KVL_OK;
}

/* ---- following the agent ---- */

static void kvli_etcd_regions_changed(kvl_agent_t *a, void *state)
{
    kvli_etcd_t *s = state;
    (void)a;
    pthread_mutex_lock(&s->lock);
    if (s->attached && s->pubs != NULL) {
        s->dirty = true;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
}

static void kvli_etcd_destroy(kvl_agent_t *a, void *state)
{
    kvli_etcd_t *s = state;
    pthread_mutex_lock(&s->lock);
    bool attached = s->attached;
    s->stopping = true;
    pthread_cond_broadcast(&s->cond);
    pthread_cond_broadcast(&s->put_cond);
    pthread_cond_broadcast(&s->bg_cond);
    kvli_etcd_wake(s);
    pthread_mutex_unlock(&s->lock);
    if (s->threads) {
        pthread_join(s->keeper, NULL);
        pthread_join(s->watcher, NULL);
    }
    /* The lease to revoke is the keeper's last: a keeper that found its
     * lease gone when destroy began grants a new one and publishes under it
     * before it sees stopping (read before the join, the old one was
     * revoked and the keys stayed in etcd until the new one's TTL). */
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->lease;
    pthread_mutex_unlock(&s->lock);
    if (s->fetcher_on)
        pthread_join(s->fetcher, NULL);
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->load_cond);
    unsigned nl = s->nloaders;
    pthread_mutex_unlock(&s->lock);
    for (unsigned i = 0; i < nl; i++)
        pthread_join(s->loaders[i].th, NULL);
    for (unsigned i = 0; i < KVLI_ETCD_LOADERS; i++)
        free(s->loaders[i].err);
    while (s->loads != NULL) {
        kvli_etcd_load_t *ld = s->loads;
        s->loads = ld->next;
        free(ld->blob);
        free(ld);
    }
    if (attached && lease != 0) {
        /* Our keys go now: followers drop us at once instead of at expiry. */
        kvl_error_t err;
        kvli_err_blank(&err);
        if (kvli_etcd_revoke(s, s->call_h, lease, &err) != KVL_OK)
            kvli_log(KVL_LOG_INFO, "etcd", "agent '%s': revoking the etcd lease at destroy "
                     "failed (%s); its keys expire with it", a->name, err.what);
    }
    if (attached)
        kvli_etcd_client_fini(&s->cl);
    while (s->pubs != NULL) {
        kvli_etcd_pub_t *p = s->pubs;
        s->pubs = p->next;
        free(p->blob);
        free(p);
    }
    while (s->follows != NULL) {
        kvli_etcd_follow_t *f = s->follows;
        s->follows = f->next;
        free(f);
    }
    while (s->bgs != NULL) {
        kvli_etcd_bg_t *b = s->bgs;
        s->bgs = b->next;
        free(b->err);
        free(b);
    }
    free(s->bg_due);
    free(s->bg_err);
    free(s->bg_rerr);
    kvli_etcd_conn_free(s->call_h);
    pthread_cond_destroy(&s->cond);
    pthread_cond_destroy(&s->put_cond);
    pthread_cond_destroy(&s->read_cond);
    pthread_cond_destroy(&s->bg_cond);
    pthread_cond_destroy(&s->load_cond);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->call_lock);
    close(s->wake_fd);
    free(s);
}
