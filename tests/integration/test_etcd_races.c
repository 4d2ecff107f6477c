/*
 * The etcd store's threads against each other and the agent's own calls,
 * against a real etcd. Each interleaving is forced through wrapped
 * functions (gates that hold one thread until another reached a point),
 * never left to timing; every wait is bounded.
 *
 * reload: a follower fails to load a peer's new generation, once because
 *   the read of the peer's key fails (kvli_etcd_call on /v3/kv/range), once
 *   because the load itself fails (kvl_metadata_load, as when the peer is
 *   briefly unreachable). The follower kept the old generation until the
 *   peer changed again; now it tries again until the load succeeds.
 * destroy: the keeper finds the lease gone (revoked here from inside its
 *   keepalive, held until destroy is joining it) and grants a new one while
 *   the agent is destroyed. Destroy revoked the lease it had read before
 *   joining the keeper, and the new lease kept the agent's keys in etcd
 *   until its TTL; now it revokes the keeper's last lease.
 * unpublish: the keeper looked at the lease, then waited for the call lock
 *   (held here, before its lock) while the agent unpublished (revoking the
 *   lease). The keeper renewed the lease it had looked at, logged it as
 *   expired and granted a new one, though nothing was published; now it
 *   looks at the lease under the call lock.
 *
 * batch: background fetches of two peers go to etcd as one read-only
 *   transaction of two reads (held back behind a first read until both
 *   were queued), and that transaction fails (etcd out of reach). The
 *   fetcher read the missing answers with json-c's asserting array call
 *   and aborted the process; now each read fails with the call's error.
 *
 * KVL_TEST_WRAP: kvli_etcd_call kvl_metadata_load pthread_join
 * KVL_TEST_WRAP: pthread_mutex_lock pthread_mutex_unlock
 * KVL_TEST_LABELS: etcd
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#ifndef KVL_HAVE_ETCD
int main(void)
{
    KT_SKIP("%s", KT_NO_ETCD_STORE);
}
#else
#include "common/kt_etcd.h"
#include "store/etcd_client.h"

static kt_etcd_t etcd;
static const char *const pfx = "/kt/races";

/* ---- the gates ---- */

int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __real_pthread_mutex_unlock(pthread_mutex_t *m);
int __real_pthread_join(pthread_t t, void **ret);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t *m);
int __wrap_pthread_join(pthread_t t, void **ret);
kvl_status_t __real_kvli_etcd_call(kvli_etcd_client_t *c, kvli_etcd_conn_t *h,
                                   const char *path, json_object *body, json_object **out,
                                   char *ep_out, size_t ep_cap, kvl_error_t *err);
kvl_status_t __wrap_kvli_etcd_call(kvli_etcd_client_t *c, kvli_etcd_conn_t *h,
                                   const char *path, json_object *body, json_object **out,
                                   char *ep_out, size_t ep_cap, kvl_error_t *err);
kvl_status_t __real_kvl_metadata_load(kvl_agent_t *a, const void *blob, size_t len,
                                      char *name_out, size_t name_cap);
kvl_status_t __wrap_kvl_metadata_load(kvl_agent_t *a, const void *blob, size_t len,
                                      char *name_out, size_t name_cap);

/* g_mu (locked with the real functions: the wrappers use it) guards all below. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;

/* reload */
static char fail_key_b64[256];         /* a range read of this key fails ... */
static int fail_reads;                 /* ... this many times */
static int reads_failed;
static int fail_loads, loads_failed;   /* kvl_metadata_load fails this many times */

/* destroy */
static bool hold_keepalive;            /* the next keepalive waits for join(keeper) */
static bool keepalive_held, keeper_joined;
static pthread_t held_keeper;

/* unpublish */
static bool learn;                     /* the next keepalive names the keeper and its call lock */
static bool learned;
static pthread_t keeper_tid;
static pthread_mutex_t *keeper_call_lock;
static bool gate_armed, gate_reached, gate_open;
/* batch: the next range read waits until reads_go; then read batches
 * (a transaction of ranges) fail, fail_batches of them */
static bool hold_read, read_held, reads_go;
static int fail_batches, batches_failed;

/* The mutexes this thread holds, as the wrappers saw them locked. */
static _Thread_local pthread_mutex_t *held[16];
static _Thread_local unsigned nheld;

static void g_lock(void)
{
    __real_pthread_mutex_lock(&g_mu);
}

static void g_unlock(void)
{
    __real_pthread_mutex_unlock(&g_mu);
}

/* Wait (under g_mu) until *flag, at most 60 s: false when it never came. */
static bool g_wait(const bool *flag)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    while (!*flag)
        if (pthread_cond_timedwait(&g_cond, &g_mu, &ts) == ETIMEDOUT)
            return *flag;
    return true;
}

static bool g_wait_int(const int *v, int want)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    while (*v < want)
        if (pthread_cond_timedwait(&g_cond, &g_mu, &ts) == ETIMEDOUT)
            return *v >= want;
    return true;
}

int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
    if (m != &g_mu) {
        g_lock();
        if (gate_armed && m == keeper_call_lock && pthread_equal(pthread_self(), keeper_tid)) {
            /* the keeper, about to take its call lock: held until let go */
            gate_armed = false;
            gate_reached = true;
            pthread_cond_broadcast(&g_cond);
            if (!g_wait(&gate_open))
                fprintf(stderr, "test: the keeper's gate was never opened\n");
        }
        g_unlock();
    }
    int r = __real_pthread_mutex_lock(m);
    if (r == 0 && nheld < 16)
        held[nheld++] = m;
    return r;
}

int __wrap_pthread_mutex_unlock(pthread_mutex_t *m)
{
    for (unsigned i = nheld; i-- > 0;)
        if (held[i] == m) {
            held[i] = held[--nheld];
            break;
        }
    return __real_pthread_mutex_unlock(m);
}

int __wrap_pthread_join(pthread_t t, void **ret)
{
    g_lock();
    if (keepalive_held && pthread_equal(t, held_keeper)) {
        keeper_joined = true;
        pthread_cond_broadcast(&g_cond);
    }
    g_unlock();
    return __real_pthread_join(t, ret);
}

static void test_err(kvl_error_t *err, kvl_status_t code, const char *what)
{
    memset(err, 0, sizeof(*err));
    err->code = code;
    err->device = -1;
    snprintf(err->what, sizeof(err->what), "%s", what);
}

kvl_status_t __wrap_kvli_etcd_call(kvli_etcd_client_t *c, kvli_etcd_conn_t *h,
                                   const char *path, json_object *body, json_object **out,
                                   char *ep_out, size_t ep_cap, kvl_error_t *err)
{
    if (strcmp(path, "/v3/kv/range") == 0) {
        json_object *k = NULL;
        const char *kb = json_object_object_get_ex(body, "key", &k) ? json_object_get_string(k)
                                                                     : NULL;
        g_lock();
        bool fail = fail_reads > 0 && kb != NULL && strcmp(kb, fail_key_b64) == 0;
        if (fail) {
            fail_reads--;
            reads_failed++;
            pthread_cond_broadcast(&g_cond);
        }
        g_unlock();
        if (fail) {
            test_err(err, KVL_ERR_TIMEOUT, "test: this read of the peer's key fails");
            return KVL_ERR_TIMEOUT;
        }
    }
    if (strcmp(path, "/v3/kv/range") == 0) {
        g_lock();
        bool hold = hold_read;
        if (hold) {
            hold_read = false;
            read_held = true;
            pthread_cond_broadcast(&g_cond);
            if (!g_wait(&reads_go))
                fprintf(stderr, "test: the held read was never let go\n");
        }
        g_unlock();
    }
    json_object *ops = NULL, *op0 = NULL;
    if (strcmp(path, "/v3/kv/txn") == 0 && json_object_object_get_ex(body, "success", &ops) &&
        json_object_is_type(ops, json_type_array) && json_object_array_length(ops) > 0 &&
        (op0 = json_object_array_get_idx(ops, 0)) != NULL &&
        json_object_object_get_ex(op0, "request_range", NULL)) {
        g_lock();
        bool fail = fail_batches > 0;
        if (fail) {
            fail_batches--;
            batches_failed++;
            pthread_cond_broadcast(&g_cond);
        }
        g_unlock();
        if (fail) {
            test_err(err, KVL_ERR_TIMEOUT, "test: this batch of reads fails");
            return KVL_ERR_TIMEOUT;
        }
    }
    if (strcmp(path, "/v3/lease/keepalive") == 0) {
        g_lock();
        bool hold = hold_keepalive;
        if (learn) {
            learn = false;
            learned = true;
            keeper_tid = pthread_self();
            /* the one mutex the keeper holds in its keepalive: its call lock */
            keeper_call_lock = nheld == 1 ? held[0] : NULL;
            pthread_cond_broadcast(&g_cond);
        }
        if (hold) {
            hold_keepalive = false;
            held_keeper = pthread_self();
            keepalive_held = true;
            pthread_cond_broadcast(&g_cond);
            if (!g_wait(&keeper_joined))
                fprintf(stderr, "test: the held keeper was never joined\n");
        }
        g_unlock();
        if (hold) {
            /* the lease went meanwhile (as if it had expired) */
            json_object *id = NULL, *b = json_object_new_object(), *o = NULL;
            kvl_error_t e;
            if (json_object_object_get_ex(body, "ID", &id))
                json_object_object_add(b, "ID", json_object_get(id));
            if (__real_kvli_etcd_call(c, h, "/v3/lease/revoke", b, &o, NULL, 0, &e) != KVL_OK)
                fprintf(stderr, "test: revoking the keeper's lease failed: %s\n", e.what);
            json_object_put(b);
            if (o != NULL)
                json_object_put(o);
        }
    }
    return __real_kvli_etcd_call(c, h, path, body, out, ep_out, ep_cap, err);
}

kvl_status_t __wrap_kvl_metadata_load(kvl_agent_t *a, const void *blob, size_t len,
                                      char *name_out, size_t name_cap)
{
    g_lock();
    bool fail = fail_loads > 0;
    if (fail) {
        fail_loads--;
        loads_failed++;
        pthread_cond_broadcast(&g_cond);
    }
    g_unlock();
    if (fail)
        return kvli_fail_simple(a, KVL_ERR_REMOTE_DISCONNECT, NULL,
                                "test: the peer cannot be reached for this load");
    return __real_kvl_metadata_load(a, blob, len, name_out, name_cap);
}

/* ---- helpers ---- */

static kvl_agent_t *agent(const char *name)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 5000};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p = {"host", "127.0.0.1"};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    return a;
}

static void attach(kvl_agent_t *a, unsigned ttl)
{
    kvl_etcd_config_t c = {.endpoints = etcd.url, .prefix = pfx, .lease_ttl_s = ttl};
    KT_OK(kvl_etcd_attach(a, &c));
}

/* The number of regions of `name` a holds, once it is want (bounded: 60 s). */
static size_t regions_become(kvl_agent_t *a, const char *name, size_t want)
{
    kvl_mem_desc_t r[8];
    size_t n = 0;
    for (int i = 0; i < 1200; i++) {
        KT_OK(kvl_remote_regions(a, name, r, NULL, 8, &n));
        if (n == want)
            break;
        usleep(50000);
    }
    return n;
}

/* Whether the log has needle, once it has it (bounded: 60 s). A line
 * logged after the change it reports (a load) may come after the test saw
 * the change. */
static bool log_wait(const char *needle)
{
    for (int i = 0; i < 1200 && !kt_log_has(needle); i++)
        usleep(50000);
    return kt_log_has(needle);
}

/* ---- the cases ---- */

static void reload(void)
{
    static char buf[3 << 16];
    kvl_agent_t *f = agent("r-fol"), *p = agent("r-peer");
    kvl_mem_desc_t d[3];
    for (int i = 0; i < 3; i++)
        d[i] = (kvl_mem_desc_t){(uint64_t)(uintptr_t)buf + (uint64_t)i * (1 << 16), 1 << 16,
                                KVL_DEV_ANY};
    KT_OK(kvl_mem_register(p, d, 3, NULL, NULL));
    attach(p, 30);
    attach(f, 30);
    KT_OK(kvl_etcd_publish(p, NULL));
    KT_OK(kvl_etcd_fetch(f, "r-peer", NULL, 30000));
    KT_CHECK(regions_become(f, "r-peer", 3) == 3);
    char key[128];
    snprintf(key, sizeof(key), "%s/r-peer/metadata", pfx);
    char *kb = kvli_etcd_b64(key, strlen(key));
    KT_CHECK(kb != NULL && strlen(kb) < sizeof(fail_key_b64));
    g_lock();
    strcpy(fail_key_b64, kb);
    fail_reads = 1;
    g_unlock();
    free(kb);

    /* a new generation; the follower's read of it fails once */
    kt_log_clear();
    KT_OK(kvl_mem_deregister(p, &d[2], 1));
    g_lock();
    KT_CHECK(g_wait_int(&reads_failed, 1));
    g_unlock();
    size_t n = regions_become(f, "r-peer", 2);
    printf("reload: the read of generation 2 failed once; the follower holds %zu region(s)\n", n);
    KT_CHECK(n == 2);
    KT_CHECK(log_wait("of agent 'r-peer' failed: test: this read of the peer's key fails"));
    KT_CHECK(log_wait("of agent 'r-peer' after 1 failed tries"));

    /* another; the load itself fails once (the peer out of reach) */
    kt_log_clear();
    g_lock();
    fail_loads = 1;
    g_unlock();
    KT_OK(kvl_mem_deregister(p, &d[1], 1));
    g_lock();
    KT_CHECK(g_wait_int(&loads_failed, 1));
    g_unlock();
    n = regions_become(f, "r-peer", 1);
    printf("reload: the load of generation 3 failed once; the follower holds %zu region(s)\n", n);
    KT_CHECK(n == 1);
    KT_CHECK(log_wait("of agent 'r-peer' failed: test: the peer cannot be reached for this "
                      "load"));
    KT_CHECK(log_wait("of agent 'r-peer' after 1 failed tries"));

    kvl_agent_destroy(p);
    kvl_agent_destroy(f);
}

static void destroy(void)
{
    static char buf[2 << 16];
    kvl_agent_t *d = agent("r-dest"), *o = agent("r-other");
    /* d's keeper is the only one: the peers of the case before are gone, o
     * attaches after d's destroy */
    kvl_mem_desc_t m[2] = {{(uint64_t)(uintptr_t)buf, 1 << 16, KVL_DEV_ANY},
                           {(uint64_t)(uintptr_t)buf + (1 << 16), 1 << 16, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(d, m, 2, NULL, NULL));
    attach(d, 60);
    KT_OK(kvl_etcd_publish(d, NULL));
    g_lock();
    hold_keepalive = true;
    g_unlock();
    kt_log_clear();
    KT_OK(kvl_mem_deregister(d, &m[1], 1)); /* wakes the keeper: keepalive, then republish */
    g_lock();
    KT_CHECK(g_wait(&keepalive_held));
    g_unlock();
    /* the keeper holds in its keepalive until destroy joins it; the lease
     * then goes, and it grants a new one and publishes again */
    kvl_agent_destroy(d);
    KT_CHECK(kt_log_has("agent 'r-dest': new etcd lease"));
    attach(o, 60);
    kvl_status_t st = kvl_etcd_fetch(o, "r-dest", NULL, 0);
    printf("destroy while the keeper granted a new lease: fetching it after = %s (%s)\n",
           kvl_status_str(st), st == KVL_OK ? "its keys outlived it" : kvl_last_error()->what);
    KT_CHECK(st == KVL_ERR_NOT_FOUND);
    kvl_agent_destroy(o);
    g_lock();
    keepalive_held = keeper_joined = false;
    g_unlock();
}

static void unpublish(void)
{
    kvl_agent_t *u = agent("r-unpub");
    attach(u, 3); /* renewed every second */
    KT_OK(kvl_etcd_publish(u, NULL));
    g_lock();
    learn = true;
    KT_CHECK(g_wait(&learned));
    KT_CHECK(keeper_call_lock != NULL); /* it held one mutex in its keepalive */
    gate_armed = true;
    KT_CHECK(g_wait(&gate_reached));
    g_unlock();
    /* the keeper looked at the lease and waits for its call lock */
    kt_log_clear();
    KT_OK(kvl_etcd_unpublish(u));
    g_lock();
    gate_open = true;
    pthread_cond_broadcast(&g_cond);
    g_unlock();
    kvl_agent_destroy(u); /* joins the keeper: its cycle is over */
    bool expired = kt_log_has("expired (etcd was out of reach");
    bool granted = kt_log_has("agent 'r-unpub': new etcd lease");
    printf("unpublish under the keeper: lease logged as expired: %s; a new lease granted: %s\n",
           expired ? "yes" : "no", granted ? "yes" : "no");
    KT_CHECK(!expired && !granted);
}

static void batch(void)
{
    kvl_agent_t *f = agent("b-fol");
    attach(f, 5);
    g_lock();
    hold_read = true;
    fail_batches = 1;
    batches_failed = 0;
    g_unlock();
    /* the first fetch's read is held; two more are queued meanwhile */
    KT_OK(kvl_etcd_fetch_async(f, "b-0", NULL, 2000));
    g_lock();
    KT_CHECK(g_wait(&read_held));
    g_unlock();
    KT_OK(kvl_etcd_fetch_async(f, "b-1", NULL, 2000));
    KT_OK(kvl_etcd_fetch_async(f, "b-2", NULL, 2000));
    g_lock();
    reads_go = true;
    pthread_cond_broadcast(&g_cond);
    KT_CHECK(g_wait_int(&batches_failed, 1)); /* b-1 and b-2 in one transaction */
    g_unlock();
    kvl_status_t st1 = kvl_etcd_fetch_status(f, "b-1", 60000);
    kvl_status_t st2 = kvl_etcd_fetch_status(f, "b-2", 60000);
    printf("batch: a failed transaction of two reads: fetches ended %s, %s\n",
           kvl_status_str(st1), kvl_status_str(st2));
    KT_CHECK(st1 != KVL_IN_PROGRESS && st1 != KVL_OK && st2 != KVL_IN_PROGRESS &&
             st2 != KVL_OK);
    kvl_agent_destroy(f);
    g_lock();
    reads_go = read_held = false;
    g_unlock();
}

/* argv: the cases to run (reload destroy unpublish batch), all when none named */
static bool wanted(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return argc < 2;
}

int main(int argc, char **argv)
{
    if (kvl_etcd_attach(NULL, NULL) == KVL_ERR_UNSUPPORTED)
        KT_SKIP("%s", kvl_last_error()->what);
    if (kt_etcd_binary() == NULL)
        KT_SKIP("no etcd binary (/usr/bin/etcd from Debian's etcd-server, or KVL_ETCD_BIN)");
    signal(SIGPIPE, SIG_IGN);
    kvl_log_set_callback(kt_log_cb, NULL);
    kvl_log_set_level(KVL_LOG_INFO);
    kt_etcd_start(&etcd);
    if (wanted(argc, argv, "reload"))
        reload();
    if (wanted(argc, argv, "destroy"))
        destroy();
    if (wanted(argc, argv, "unpublish"))
        unpublish();
    if (wanted(argc, argv, "batch"))
        batch();
    kvl_log_set_callback(NULL, NULL);
    kt_etcd_stop(&etcd);
    printf("etcd races: all cases passed\n");
    return 0;
}
#endif
