/*
 * kvlane doctor's etcd checks (kvl_etcd_probe): each endpoint on its own —
 * reachable and its version, the namespace readable with the credentials
 * given, and a lease's clock (granted, read back 2 s later, revoked).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "common/clock.h"
#include "etcd_client.h"

static size_t kvli_probe_sink(char *d, size_t sz, size_t nm, void *arg)
{
    char *buf = arg;
    size_t have = strlen(buf), n = sz * nm;
    if (have + n >= 512)
        n = 511 - have;
    memcpy(buf + have, d, n);
    buf[have + n] = '\0';
    return sz * nm;
}

/* GET <ep>/version: 0 with the server and cluster versions, -1 with why. */
static int kvli_probe_version(const char *ep, uint64_t tmo, char *server, char *cluster,
                              size_t cap, double *ms, char *why, size_t why_cap)
{
    char url[KVLI_ETCD_EP_LEN + 16], body[512] = "", eb[CURL_ERROR_SIZE] = "";
    CURL *h = curl_easy_init();
    if (h == NULL) {
        snprintf(why, why_cap, "curl_easy_init failed");
        return -1;
    }
    snprintf(url, sizeof(url), "%s/version", ep);
    kvli_etcd_curl_setup(h, tmo);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvli_probe_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, (void *)body);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, eb);
    uint64_t t0 = kvli_clock_ns();
    CURLcode cc = curl_easy_perform(h);
    *ms = (double)(kvli_clock_ns() - t0) / 1e6;
    curl_easy_cleanup(h);
    if (cc != CURLE_OK) {
        snprintf(why, why_cap, "%s%s%s", curl_easy_strerror(cc), eb[0] ? ": " : "", eb);
        return -1;
    }
    json_object *o = json_tokener_parse(body), *sv = NULL, *cv = NULL;
    if (o == NULL || !json_object_object_get_ex(o, "etcdserver", &sv)) {
        snprintf(why, why_cap, "GET /version answered something that is not etcd's (%.80s)",
                 body);
        if (o != NULL)
            json_object_put(o);
        return -2;
    }
    kvli_scopy(server, cap, json_object_get_string(sv));
    kvli_scopy(cluster, cap, json_object_object_get_ex(o, "etcdcluster", &cv)
                                 ? json_object_get_string(cv) : "?");
    json_object_put(o);
    return 0;
}

kvl_status_t kvl_etcd_probe(const kvl_etcd_config_t *cfg, kvl_probe_cb_t cb, void *arg)
{
    kvli_etcd_client_t all;
    kvl_error_t err;
    char obs[1400], check[48];
    if (cfg == NULL || cb == NULL)
        return KVL_ERR_INVALID_ARG;
    kvli_etcd_global_init();
    kvli_err_blank(&err);
    uint64_t tmo = cfg->timeout_ms ? cfg->timeout_ms : 3000;
    if (kvli_etcd_client_init(&all, cfg->endpoints, cfg->user, cfg->password, tmo, &err) !=
        KVL_OK) {
        cb(arg, "endpoints", 2, err.what, err.hint);
        kvli_etcd_client_fini(&all);
        return err.code;
    }
    const char *prefix = cfg->prefix && cfg->prefix[0] ? cfg->prefix : KVL_ETCD_DEFAULT_PREFIX;
    char from[256], to[256];
    snprintf(from, sizeof(from), "%.200s/", prefix);
    if (strlen(prefix) > 1 && prefix[strlen(prefix) - 1] == '/')
        snprintf(from, sizeof(from), "%.200s", prefix);
    kvli_scopy(to, sizeof(to), from);
    to[strlen(to) - 1] = '0';
    unsigned up = 0;
    for (unsigned i = 0; i < all.n_eps; i++) {
        const char *ep = all.eps[i];
        char sv[64], cv[64], why[600];
        double ms = 0;
        snprintf(check, sizeof(check), "%u.reach", i);
        int rc = kvli_probe_version(ep, tmo, sv, cv, sizeof(sv), &ms, why, sizeof(why));
        if (rc != 0) {
            snprintf(obs, sizeof(obs), "%s: %s", ep, why);
            cb(arg, check, 1, obs, rc == -1 ? "start etcd there or remove it from the list "
                                              "(NIXL_ETCD_ENDPOINTS); check the route "
                                              "(firewall, network namespace)"
                                            : "that port is not an etcd client URL");
            continue;
        }
        unsigned maj = 0, min = 0;
        bool old = sscanf(sv, "%u.%u", &maj, &min) == 2 && (maj < 3 || (maj == 3 && min < 4));
        snprintf(obs, sizeof(obs), "%s: etcd %s (cluster %s), /version in %.1f ms", ep, sv, cv,
                 ms);
        cb(arg, check, old ? 2 : 0, obs, old ? "kvlane needs etcd 3.4 or later (its JSON "
                                               "gateway is /v3/)" : NULL);
        if (old)
            continue;
        up++;

        /* One endpoint at a time: the failover must not hide a bad member. */
        kvli_etcd_client_t one;
        char one_ep[KVLI_ETCD_EP_LEN];
        kvli_scopy(one_ep, sizeof(one_ep), ep);
        if (kvli_etcd_client_init(&one, one_ep, cfg->user, cfg->password, tmo, &err) != KVL_OK) {
            kvli_etcd_client_fini(&one);
            continue;
        }
        snprintf(check, sizeof(check), "%u.auth", i);
        json_object *b = json_object_new_object(), *out = NULL;
        char *k = kvli_etcd_b64(from, strlen(from)), *e = kvli_etcd_b64(to, strlen(to));
        json_object_object_add(b, "key", json_object_new_string(k ? k : ""));
        json_object_object_add(b, "range_end", json_object_new_string(e ? e : ""));
        json_object_object_add(b, "count_only", json_object_new_boolean(1));
        free(k);
        free(e);
        kvl_status_t st = kvli_etcd_call(&one, NULL, "/v3/kv/range", b, &out, NULL, 0, &err);
        json_object_put(b);
        if (st == KVL_OK) {
            snprintf(obs, sizeof(obs), "%s: %s can read %s (%" PRId64 " keys)", ep,
                     one.user[0] ? "user" : "no authentication:", from,
                     kvli_etcd_i64(out, "count"));
            if (one.user[0])
                snprintf(obs, sizeof(obs), "%s: user '%s' can read %s (%" PRId64 " keys)", ep,
                         one.user, from, kvli_etcd_i64(out, "count"));
            json_object_put(out);
            cb(arg, check, 0, obs, NULL);
        } else {
            cb(arg, check, 2, err.what, err.hint);
            kvli_etcd_client_fini(&one);
            continue;
        }

        /* The lease clock: a 10 s lease read back 2 s later should have
         * 7..9 s left; the keepalive round trip bounds how close to its TTL
         * an agent can run. */
        snprintf(check, sizeof(check), "%u.lease", i);
        b = json_object_new_object();
        json_object_object_add(b, "TTL", json_object_new_int64(10));
        uint64_t t0 = kvli_clock_ns();
        st = kvli_etcd_call(&one, NULL, "/v3/lease/grant", b, &out, NULL, 0, &err);
        double grant_ms = (double)(kvli_clock_ns() - t0) / 1e6;
        json_object_put(b);
        if (st != KVL_OK) {
            cb(arg, check, 2, err.what, err.hint);
            kvli_etcd_client_fini(&one);
            continue;
        }
        int64_t id = kvli_etcd_i64(out, "ID");
        json_object_put(out);
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
        char ids[32];
        snprintf(ids, sizeof(ids), "%" PRId64, id);
        b = json_object_new_object();
        json_object_object_add(b, "ID", json_object_new_string(ids));
        st = kvli_etcd_call(&one, NULL, "/v3/lease/timetolive", b, &out, NULL, 0, &err);
        int64_t left = st == KVL_OK ? kvli_etcd_i64(out, "TTL") : -2;
        if (out != NULL)
            json_object_put(out);
        out = NULL;
        (void)kvli_etcd_call(&one, NULL, "/v3/lease/revoke", b, &out, NULL, 0, &err);
        if (out != NULL)
            json_object_put(out);
        json_object_put(b);
        bool skew = left < 7 || left > 9;
        snprintf(obs, sizeof(obs), "%s: a 10 s lease had %" PRId64 " s left after 2 s (expected "
                 "7..9); grant round trip %.1f ms", ep, left, grant_ms);
        cb(arg, check, skew || grant_ms > 1000 ? 1 : 0, obs,
           skew ? "etcd's lease clock disagrees with this host's (a member's clock jumps, or "
                  "etcd is overloaded): leases may expire early or late; check the members' "
                  "time sync and load"
                : "etcd answers slowly: keep the lease TTL (KVL_ETCD_LEASE_TTL) well above "
                  "the round trip");
        kvli_etcd_client_fini(&one);
    }
    snprintf(obs, sizeof(obs), "%u of %u endpoint(s) answer", up, all.n_eps);
    cb(arg, "endpoints", up == 0 ? 2 : up < all.n_eps ? 1 : 0, obs,
       up == 0 ? "no etcd member answers: agents cannot publish or fetch metadata (transfers "
                 "already set up keep working)"
               : "a member of the list does not answer: clients fail over, but the list "
                 "should name live members");
    kvli_etcd_client_fini(&all);
    return up == 0 ? KVL_ERR_REMOTE_DISCONNECT : KVL_OK;
}
