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

/* curl's verbose lines of the TLS handshake: "SSL connection using
 * TLSv1.3 / ...", "SSL certificate verify ok." (a debug callback, so that
 * no TLS library is linked for it). */
static int kvli_probe_debug(CURL *h, curl_infotype type, char *data, size_t n, void *arg)
{
    char *tls = arg;
    (void)h;
    if (type != CURLINFO_TEXT)
        return 0;
    if (n > 21 && strncmp(data, "SSL connection using ", 21) == 0) {
        size_t l = n - 21;
        while (l > 0 && (data[21 + l - 1] == '\n' || data[21 + l - 1] == '\r'))
            l--;
        snprintf(tls, 128, "%.*s", (int)(l > 100 ? 100 : l), data + 21);
    }
    return 0;
}

/* GET <ep>/version: 0 with the server and cluster versions (and, over
 * https, the TLS version and cipher in tls[128]), -1 with why (and fix_p
 * set when it is a TLS matter), -2 not etcd's answer. */
static int kvli_probe_version(const kvli_etcd_client_t *c, const char *ep, uint64_t tmo,
                              char *server, char *cluster, size_t cap, double *ms, char *tls,
                              char *why, size_t why_cap, const char **fix_p)
{
    char url[KVLI_ETCD_EP_LEN + 16], body[512] = "", eb[CURL_ERROR_SIZE] = "";
    *fix_p = NULL;
    tls[0] = '\0';
    CURL *h = curl_easy_init();
    if (h == NULL) {
        snprintf(why, why_cap, "curl_easy_init failed");
        return -1;
    }
    snprintf(url, sizeof(url), "%s/version", ep);
    kvli_etcd_curl_setup(c, h, tmo);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvli_probe_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, (void *)body);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, eb);
    curl_easy_setopt(h, CURLOPT_DEBUGFUNCTION, kvli_probe_debug);
    curl_easy_setopt(h, CURLOPT_DEBUGDATA, (void *)tls);
    curl_easy_setopt(h, CURLOPT_VERBOSE, 1L);
    uint64_t t0 = kvli_clock_ns();
    CURLcode cc = curl_easy_perform(h);
    *ms = (double)(kvli_clock_ns() - t0) / 1e6;
    if (cc != CURLE_OK) {
        snprintf(why, why_cap, "%s%s%s", curl_easy_strerror(cc), eb[0] ? ": " : "", eb);
        *fix_p = kvli_etcd_tls_explain(c, h, ep, (int)cc, eb, why, why_cap);
        curl_easy_cleanup(h);
        return -1;
    }
    curl_easy_cleanup(h);
    if ((*fix_p = kvli_etcd_tls_explain(c, NULL, ep, CURLE_OK, body, why, why_cap)) != NULL)
        return -1;
    json_object *o = json_tokener_parse(body);
    const char *sv = kvli_etcd_str(o, "etcdserver"), *cv = kvli_etcd_str(o, "etcdcluster");
    if (sv == NULL) {
        snprintf(why, why_cap, "GET /version answered something that is not etcd's (%.80s)",
                 body);
        if (o != NULL)
            json_object_put(o);
        return -2;
    }
    kvli_scopy(server, cap, sv);
    kvli_scopy(cluster, cap, cv != NULL ? cv : "?");
    json_object_put(o);
    return 0;
}

kvl_status_t kvl_etcd_probe(const kvl_etcd_config_t *cfg, kvl_probe_cb_t cb, void *arg)
{
    return kvl_etcd_probe_tls(cfg, NULL, cb, arg);
}

kvl_status_t kvl_etcd_probe_tls(const kvl_etcd_config_t *cfg, const kvl_etcd_tls_t *tls,
                                kvl_probe_cb_t cb, void *arg)
{
    kvli_etcd_client_t all;
    kvl_error_t err;
    char obs[1400], check[48];
    if (cfg == NULL || cb == NULL)
        return KVL_ERR_INVALID_ARG;
    kvli_etcd_global_init();
    kvli_err_blank(&err);
    uint64_t tmo = cfg->timeout_ms ? cfg->timeout_ms : 3000;
    if (kvli_etcd_client_init(&all, cfg->endpoints, cfg->user, cfg->password, tmo, tls,
                              &err) != KVL_OK) {
        cb(arg, strstr(err.what, "etcd TLS") != NULL ? "tls" : "endpoints", 2, err.what,
           err.hint);
        kvli_etcd_client_fini(&all);
        return err.code;
    }
    if (all.tls) {
        char ca[KVLI_ETCD_PATH_MAX + 32];
        snprintf(ca, sizeof(ca), "CA file %s", all.cacert);
        snprintf(obs, sizeof(obs), "servers verified by %s%s; client certificate %s%s%s%s",
                 all.cacert[0] ? ca : "the system's CA store",
                 all.verify_name ? "" : " (host names not checked)",
                 all.cert[0] ? all.cert : "none", all.subject[0] ? " (subject " : "",
                 all.subject, all.subject[0] ? ")" : "");
        cb(arg, "tls", 0, obs, NULL);
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
        char sv[64], cv[64], why[600], tv[128];
        const char *fix = NULL;
        double ms = 0;
        snprintf(check, sizeof(check), "%u.reach", i);
        int rc = kvli_probe_version(&all, ep, tmo, sv, cv, sizeof(sv), &ms, tv, why, sizeof(why),
                                    &fix);
        if (fix != NULL) {
            snprintf(check, sizeof(check), "%u.tls", i);
            cb(arg, check, 2, why, fix);
            continue;
        }
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
        if (strncmp(ep, "https://", 8) == 0) {
            char ca[KVLI_ETCD_PATH_MAX + 32];
            snprintf(ca, sizeof(ca), "CA file %s", all.cacert);
            snprintf(obs, sizeof(obs), "%s: %s, server verified by %s%s%s%s", ep,
                     tv[0] ? tv : "TLS", all.cacert[0] ? ca : "the system's CA store",
                     all.verify_name ? "" : " (host name not checked)",
                     all.cert[0] ? "; client certificate " : "; no client certificate",
                     all.subject);
            snprintf(check, sizeof(check), "%u.tls", i);
            cb(arg, check, 0, obs, NULL);
        }
        up++;

        /* One endpoint at a time: the failover must not hide a bad member. */
        kvli_etcd_client_t one;
        char one_ep[KVLI_ETCD_EP_LEN];
        kvli_scopy(one_ep, sizeof(one_ep), ep);
        if (kvli_etcd_client_init(&one, one_ep, cfg->user, cfg->password, tmo, tls, &err) !=
            KVL_OK) {
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
            /* how the calls went: gRPC, or the gateway and why */
            snprintf(check, sizeof(check), "%u.api", i);
            bool gw = !kvli_etcd_grpc_on(&one, 0);
            snprintf(obs, sizeof(obs), "%s: %s%.160s%s", ep,
                     !gw ? "gRPC over HTTP/2"
                     : one.ep_no_grpc[0][0] ? "the JSON gateway: no gRPC there ("
                     : one.api == KVLI_ETCD_API_GATEWAY ? "the JSON gateway (KVL_ETCD_API=gateway)"
                                                        : "the JSON gateway (TLS)",
                     gw ? one.ep_no_grpc[0] : "", gw && one.ep_no_grpc[0][0] ? ")" : "");
            cb(arg, check, gw && one.ep_no_grpc[0][0] ? 1 : 0, obs,
               gw && one.ep_no_grpc[0][0]
               ? "agents reach etcd through its JSON gateway, at 2-3x etcd's CPU per call: let "
                 "the proxy in front of etcd pass HTTP/2 (h2c), or list the members themselves"
               : NULL);
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
