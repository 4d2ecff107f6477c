/*
 * kvlane etcd client: JSON over HTTP to etcd's v3 gateway, endpoint
 * failover, authentication (see etcd_client.h).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "etcd_client.h"
#include "etcd_h2.h"
#include "etcd_pb.h"

static pthread_once_t kvli_etcd_once = PTHREAD_ONCE_INIT;

static void kvli_etcd_global_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void kvli_etcd_global_init(void)
{
    pthread_once(&kvli_etcd_once, kvli_etcd_global_init_once);
}

kvl_status_t kvli_etcd_client_init(kvli_etcd_client_t *c, const char *endpoints,
                                   const char *user, const char *password, uint64_t timeout_ms,
                                   const kvl_etcd_tls_t *tls, kvl_error_t *err)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->tok_lock, NULL);
    c->timeout_ms = timeout_ms ? timeout_ms : 5000;
    const char *api = getenv("KVL_ETCD_API");
    if (api == NULL || api[0] == '\0' || strcmp(api, "auto") == 0) {
        c->api = KVLI_ETCD_API_AUTO;
    } else if (strcmp(api, "grpc") == 0) {
        c->api = KVLI_ETCD_API_GRPC;
    } else if (strcmp(api, "gateway") == 0) {
        c->api = KVLI_ETCD_API_GATEWAY;
    } else {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "KVL_ETCD_API='%.60s' is not one of auto, grpc, "
                 "gateway", api);
        kvli_hint(err, "unset it: auto speaks gRPC where the endpoint serves it and the JSON "
                       "gateway where not");
        return KVL_ERR_INVALID_ARG;
    }
    /* The files first: with TLS, host:port means https:// (never plain http). */
    kvl_status_t tst = kvli_etcd_tls_init(c, tls, err);
    if (tst != KVL_OK)
        return tst;
    if (endpoints == NULL || endpoints[0] == '\0') {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd: no endpoint given");
        kvli_hint(err, "set NIXL_ETCD_ENDPOINTS (or kvl_etcd_config_t.endpoints) to etcd's "
                       "client URLs, e.g. http://10.0.0.5:2379,http://10.0.0.6:2379");
        return KVL_ERR_INVALID_ARG;
    }
    const char *p = endpoints;
    while (*p != '\0') {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n > 0 && isspace((unsigned char)*p)) {
            p++;
            n--;
        }
        while (n > 0 && (isspace((unsigned char)p[n - 1]) || p[n - 1] == '/'))
            n--;
        if (n > 0) {
            bool scheme = strstr(p, "://") != NULL && (size_t)(strstr(p, "://") - p) < n;
            if (c->n_eps == KVLI_ETCD_EPS_MAX) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd endpoint list '%.300s' names more "
                         "than %u endpoints", endpoints, KVLI_ETCD_EPS_MAX);
                kvli_hint(err, "list at most %u members (a client needs a few to fail over)",
                          KVLI_ETCD_EPS_MAX);
                return KVL_ERR_INVALID_ARG;
            }
            if (scheme && strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd endpoint '%.*s': only http:// and "
                         "https:// URLs are understood", (int)(n > 200 ? 200 : n), p);
                kvli_hint(err, "write each endpoint as http://host:port or host:port");
                return KVL_ERR_INVALID_ARG;
            }
            if (scheme && c->tls && strncmp(p, "http://", 7) == 0) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd endpoint '%.*s' is plain http, but "
                         "TLS files were given", (int)(n > 200 ? 200 : n), p);
                kvli_hint(err, "write https://host:port (etcd's --listen-client-urls with "
                               "--cert-file), or give no TLS files for a plain-http etcd");
                return KVL_ERR_INVALID_ARG;
            }
            int w = snprintf(c->eps[c->n_eps], KVLI_ETCD_EP_LEN, "%s%.*s",
                             scheme ? "" : c->tls ? "https://" : "http://", (int)n, p);
            if (w < 0 || (size_t)w >= KVLI_ETCD_EP_LEN) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd endpoint '%.200s...' is longer than "
                         "%u characters", p, KVLI_ETCD_EP_LEN - 1);
                kvli_hint(err, "write each endpoint as http://host:port");
                return KVL_ERR_INVALID_ARG;
            }
            const char *hostpart = strstr(c->eps[c->n_eps], "://") + 3;
            if (hostpart[0] == '\0' || strchr(hostpart, '/') != NULL ||
                strpbrk(hostpart, " \t\"\\") != NULL) {
                kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd endpoint '%s' is not a client URL "
                         "(scheme://host:port, no path)", c->eps[c->n_eps]);
                kvli_hint(err, "write each endpoint as http://host:port");
                return KVL_ERR_INVALID_ARG;
            }
            c->n_eps++;
        }
        if (e == NULL)
            break;
        p = e + 1;
    }
    if (c->n_eps == 0) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd endpoint list '%.300s' names no endpoint",
                 endpoints);
        kvli_hint(err, "write it as http://host:port[,http://host:port...]");
        return KVL_ERR_INVALID_ARG;
    }
    for (unsigned i = 0; i < c->n_eps; i++) {
        if (c->api == KVLI_ETCD_API_GRPC && strncmp(c->eps[i], "https://", 8) == 0) {
            kvli_err(err, KVL_ERR_INVALID_ARG, 0, "KVL_ETCD_API=grpc, but etcd endpoint '%s' is "
                     "https: this kvlane reaches etcd over TLS through its JSON gateway only",
                     c->eps[i]);
            kvli_hint(err, "unset KVL_ETCD_API (or set it to gateway) for TLS endpoints");
            return KVL_ERR_INVALID_ARG;
        }
        atomic_init(&c->ep_api[i], c->api == KVLI_ETCD_API_GATEWAY ||
                                   strncmp(c->eps[i], "https://", 8) == 0
                                   ? KVLI_ETCD_API_GATEWAY : c->api);
    }
    /* Agents spread over the members (each keeps the one that answered). */
    atomic_store(&c->cur, (unsigned)(kvli_random64() % c->n_eps));
    if (user != NULL && user[0] != '\0') {
        if (strlen(user) >= sizeof(c->user) || password == NULL ||
            strlen(password) >= sizeof(c->password)) {
            kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd user or password: %s",
                     password == NULL ? "a user without a password" : "longer than 127 bytes");
            kvli_hint(err, "give both, each at most 127 bytes");
            return KVL_ERR_INVALID_ARG;
        }
        kvli_scopy(c->user, sizeof(c->user), user);
        kvli_scopy(c->password, sizeof(c->password), password);
    }
    return KVL_OK;
}

kvli_etcd_conn_t *kvli_etcd_conn_new(void)
{
    return calloc(1, sizeof(kvli_etcd_conn_t));
}

void kvli_etcd_conn_free(kvli_etcd_conn_t *h)
{
    if (h == NULL)
        return;
    kvli_h2_close(h->h2);
    if (h->curl != NULL)
        curl_easy_cleanup(h->curl);
    free(h);
}

bool kvli_etcd_grpc_on(kvli_etcd_client_t *c, unsigned i)
{
    return i < c->n_eps && atomic_load(&c->ep_api[i]) != KVLI_ETCD_API_GATEWAY;
}

void kvli_etcd_grpc_off(kvli_etcd_client_t *c, unsigned i, const char *why)
{
    int was = KVLI_ETCD_API_AUTO;
    if (i < c->n_eps &&
        atomic_compare_exchange_strong(&c->ep_api[i], &was, KVLI_ETCD_API_GATEWAY)) {
        kvli_scopy(c->ep_no_grpc[i], sizeof(c->ep_no_grpc[i]), why);
        kvli_log(KVL_LOG_INFO, "etcd", "etcd at %s does not serve gRPC (%s); using its JSON "
                 "gateway", c->eps[i], why);
    }
}

unsigned kvli_etcd_ep_index(const kvli_etcd_client_t *c, const char *ep)
{
    unsigned i = 0;
    while (i < c->n_eps && strcmp(c->eps[i], ep) != 0)
        i++;
    return i;
}

void kvli_etcd_client_fini(kvli_etcd_client_t *c)
{
    memset(c->password, 0, sizeof(c->password));
    pthread_mutex_destroy(&c->tok_lock);
}

void kvli_etcd_token(kvli_etcd_client_t *c, char *buf, size_t cap)
{
    pthread_mutex_lock(&c->tok_lock);
    kvli_scopy(buf, cap, c->token);
    pthread_mutex_unlock(&c->tok_lock);
}

char *kvli_etcd_b64(const void *p, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (out != NULL)
        EVP_EncodeBlock((unsigned char *)out, p, (int)len);
    return out;
}

void *kvli_etcd_unb64(const char *s, size_t *len_p)
{
    *len_p = 0;
    if (s == NULL)
        return NULL;
    size_t n = strlen(s);
    if (n % 4 != 0 || n > INT32_MAX)
        return NULL;
    /* Strictly what etcd sends (RFC 4648, padded): OpenSSL's decoder also
     * takes '=' inside the text and blanks, and would make bytes of them. */
    size_t pad = (n >= 1 && s[n - 1] == '=') + (n >= 2 && s[n - 2] == '=');
    for (size_t i = 0; i < n - pad; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '/'))
            return NULL;
    }
    unsigned char *out = malloc(n / 4 * 3 + 1);
    if (out == NULL)
        return NULL;
    int w = n ? EVP_DecodeBlock(out, (const unsigned char *)s, (int)n) : 0;
    if (w < 0) {
        free(out);
        return NULL;
    }
    *len_p = (size_t)w - pad;
    return out;
}

void kvli_etcd_curl_setup(const kvli_etcd_client_t *c, CURL *h, uint64_t timeout_ms)
{
    kvli_etcd_tls_setup(c, h);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 2000 ? timeout_ms : 2000));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 2L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
}

typedef struct kvli_etcd_buf {
    char *p;
    size_t len, cap;
    bool over;
} kvli_etcd_buf_t;

int kvli_etcd_append(char **p, size_t *len, size_t *cap, const char *data, size_t n)
{
    if (*len + n + 1 > KVLI_ETCD_REPLY_MAX)
        return -1;
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        char *q = realloc(*p, c);
        if (q == NULL)
            return -2;
        *p = q;
        *cap = c;
    }
    memcpy(*p + *len, data, n);
    *len += n;
    (*p)[*len] = '\0';
    return 0;
}

static size_t kvli_etcd_sink(char *data, size_t sz, size_t nm, void *arg)
{
    kvli_etcd_buf_t *b = arg;
    size_t n = sz * nm;
    int r = kvli_etcd_append(&b->p, &b->len, &b->cap, data, n);
    if (r == -1)
        b->over = true;
    return r == 0 ? n : 0;
}

/* One POST to one endpoint. Returns 0 with *out parsed (etcd answered,
 * maybe with an error object), -1 with why filled (not reached), -2 (an
 * answer that is not etcd's), or -3: TLS failed (why says how, *fix_p what
 * to do). */
static int kvli_etcd_gw_post(kvli_etcd_client_t *c, kvli_etcd_conn_t *conn, const char *ep,
                             const char *path, const char *body, bool with_token,
                             json_object **out, long *http_p, char *why, size_t why_cap,
                             const char **fix_p)
{
    *fix_p = NULL;
    char url[KVLI_ETCD_EP_LEN + 64], auth[KVLI_ETCD_TOKEN_MAX + 32], errbuf[CURL_ERROR_SIZE] = "";
    kvli_etcd_buf_t b = {0};
    struct curl_slist *hd = NULL;
    CURL *own = NULL, *h = conn != NULL ? conn->curl : NULL;
    int rc = -1;

    if (conn != NULL && h == NULL)
        h = conn->curl = curl_easy_init();
    else if (h == NULL)
        h = own = curl_easy_init();
    if (h == NULL) {
        snprintf(why, why_cap, "curl_easy_init failed (out of memory)");
        return -1;
    }
    curl_easy_reset(h);
    snprintf(url, sizeof(url), "%s%s", ep, path);
    kvli_etcd_curl_setup(c, h, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kvli_etcd_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    hd = curl_slist_append(hd, "Content-Type: application/json");
    if (with_token) {
        char tok[KVLI_ETCD_TOKEN_MAX];
        kvli_etcd_token(c, tok, sizeof(tok));
        if (tok[0] != '\0') {
            snprintf(auth, sizeof(auth), "Authorization: %s", tok);
            hd = curl_slist_append(hd, auth);
        }
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    CURLcode cc = curl_easy_perform(h);
    *http_p = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, http_p);
    if (cc != CURLE_OK) {
        snprintf(why, why_cap, "%s%s%s", curl_easy_strerror(cc), errbuf[0] ? ": " : "", errbuf);
        if (b.over)
            snprintf(why, why_cap, "an answer of more than %u MiB", KVLI_ETCD_REPLY_MAX >> 20);
        else if ((*fix_p = kvli_etcd_tls_explain(c, h, ep, (int)cc, errbuf, why, why_cap)) != NULL)
            rc = -3;
    } else if ((*fix_p = kvli_etcd_tls_explain(c, h, ep, CURLE_OK, b.p, why, why_cap)) != NULL) {
        rc = -3;
    } else {
        enum json_tokener_error je = json_tokener_success;
        *out = b.p ? json_tokener_parse_verbose(b.p, &je) : NULL;
        if (*out == NULL || !json_object_is_type(*out, json_type_object)) {
            if (*out != NULL)
                json_object_put(*out);
            *out = NULL;
            snprintf(why, why_cap, "HTTP %ld with an answer that is not etcd's JSON (%.80s)",
                     *http_p, b.p ? b.p : "empty");
            rc = -2;
        } else {
            rc = 0;
        }
    }
    curl_slist_free_all(hd);
    free(b.p);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    if (own != NULL)
        curl_easy_cleanup(own);
    return rc;
}

/* Whether the connection h can take another call: what arrived while it
 * sat idle is read first (a GOAWAY, the end of a restarted etcd). */
static bool kvli_etcd_h2_alive(kvli_h2_t *h)
{
    char why[64];
    return kvli_h2_usable(h) &&
           kvli_h2_pump(h, KVLI_ETCD_REPLY_MAX, NULL, NULL, NULL, why, sizeof(why)) == 0 &&
           kvli_h2_usable(h);
}

/* One gRPC call to endpoint i, in the form of the gateway's: returns as
 * kvli_etcd_gw_post (0: etcd answered; *out the answer as the gateway
 * writes it, or its error object; -1 not reached; -2 not etcd's answer),
 * -4: this call goes to endpoint i's gateway (it serves no gRPC: marked,
 * its gateway from now on; or, unmarked, it closed the connection on the
 * HTTP/2 preface: a member going down, which the gateway finds unreached
 * too, or etcd's TLS listener, whose answer to HTTP/1.1 says so), or -5:
 * the request could not be put in protobuf (why). */
static int kvli_etcd_grpc_post(kvli_etcd_client_t *c, kvli_etcd_conn_t *conn, unsigned i,
                               const char *path, json_object *body, bool with_token,
                               json_object **out, long *http_p, char *why, size_t why_cap)
{
    const char *gpath;
    kvli_etcd_pb_msg_t mreq, mans;
    bool stream;
    uint8_t *req = NULL;
    size_t rlen = 0;
    kvli_h2_t *own = NULL, **hp = conn != NULL ? &conn->h2 : &own;
    kvli_h2_reply_t r;
    char tok[KVLI_ETCD_TOKEN_MAX] = "";
    int rc;

    *http_p = 0;
    if (!kvli_etcd_pb_method(path, &gpath, &mreq, &mans, &stream))
        return -4;
    if (kvli_etcd_pb_encode(mreq, body, &req, &rlen, why, why_cap) != 0)
        return -5;
    if (*hp != NULL && (strcmp(kvli_h2_ep(*hp), c->eps[i]) != 0 || !kvli_etcd_h2_alive(*hp))) {
        kvli_h2_close(*hp);
        *hp = NULL;
    }
    if (*hp == NULL) {
        rc = kvli_h2_open(hp, c->eps[i], c->timeout_ms, why, why_cap);
        if (rc == -2 && c->api == KVLI_ETCD_API_AUTO) {
            kvli_etcd_grpc_off(c, i, why);
            free(req);
            return -4;
        }
        if (rc == -3 && c->api == KVLI_ETCD_API_AUTO) {
            free(req);
            return -4; /* the gateway for this call only */
        }
        if (rc == -3)
            rc = -1;
        if (rc != 0) {
            free(req);
            return rc;
        }
    }
    if (with_token)
        kvli_etcd_token(c, tok, sizeof(tok));
    memset(&r, 0, sizeof(r));
    rc = kvli_h2_unary(*hp, gpath, tok, req, rlen, KVLI_ETCD_REPLY_MAX, c->timeout_ms, &r, why,
                       why_cap);
    free(req);
    if (rc != 0) {
        kvli_h2_close(*hp);
        *hp = NULL;
        return -1;
    }
    if (r.status > 0) {
        /* etcd's error, as the gateway writes it */
        *out = json_object_new_object();
        json_object_object_add(*out, "error", json_object_new_string(r.message));
        json_object_object_add(*out, "message", json_object_new_string(r.message));
        json_object_object_add(*out, "code", json_object_new_int(r.status));
        rc = 0;
    } else if (r.status < 0 || r.msg == NULL) {
        snprintf(why, why_cap, "HTTP %d %s", r.http,
                 r.status < 0 ? "without a gRPC status" : "without an answer message");
        rc = -2;
    } else {
        json_object *o = NULL;
        char dwhy[200];
        if (kvli_etcd_pb_decode(mans, r.msg, r.len, &o, dwhy, sizeof(dwhy)) != 0) {
            snprintf(why, why_cap, "an answer that is not etcd's protobuf (%s)", dwhy);
            rc = -2;
        } else if (stream) {
            /* the gateway hands a stream's messages as {"result": ...} */
            *out = json_object_new_object();
            json_object_object_add(*out, "result", o);
        } else {
            *out = o;
        }
    }
    kvli_h2_reply_free(&r);
    if (own != NULL)
        kvli_h2_close(own);
    return rc;
}

/* One call to endpoint i, over gRPC or the gateway (text: body as JSON
 * text, made at the first gateway call): as kvli_etcd_gw_post, or -5. */
static int kvli_etcd_post(kvli_etcd_client_t *c, kvli_etcd_conn_t *conn, unsigned i,
                          const char *path, json_object *body, const char **text,
                          bool with_token, json_object **out, long *http_p, char *why,
                          size_t why_cap, const char **fix_p)
{
    *fix_p = NULL;
    if (kvli_etcd_grpc_on(c, i)) {
        int rc = kvli_etcd_grpc_post(c, conn, i, path, body, with_token, out, http_p, why,
                                     why_cap);
        if (rc != -4)
            return rc;
    }
    if (*text == NULL)
        *text = json_object_to_json_string_ext(body, JSON_C_TO_STRING_PLAIN);
    return kvli_etcd_gw_post(c, conn, c->eps[i], path, *text, with_token, out, http_p, why,
                             why_cap, fix_p);
}

/* The gateway's error object: {"error":..., "message":..., "code":N}. */
static const char *kvli_etcd_errmsg(json_object *o, int *code_p)
{
    json_object *e = kvli_etcd_obj(o, "error"); /* a stream's {"error":{"grpc_code":..}} */
    json_object *src = e != NULL ? e : o;
    int64_t code = kvli_etcd_i64(src, "code");
    if (code == 0)
        code = kvli_etcd_i64(src, "grpc_code");
    *code_p = code >= INT32_MIN && code <= INT32_MAX ? (int)code : -1;
    const char *m = kvli_etcd_str(src, "message");
    if (m == NULL)
        m = kvli_etcd_str(o, "error");
    if (m == NULL && (kvli_etcd_has(o, "message") || kvli_etcd_has(o, "error")))
        m = "an error without a readable message";
    return m;
}

static kvl_status_t kvli_etcd_auth_on(kvli_etcd_client_t *c, kvli_etcd_conn_t *h,
                                      unsigned i, kvl_error_t *err)
{
    json_object *body = json_object_new_object(), *out = NULL;
    char why[512];
    const char *fix, *text = NULL, *ep = c->eps[i];
    long http = 0;
    int code;
    json_object_object_add(body, "name", json_object_new_string(c->user));
    json_object_object_add(body, "password", json_object_new_string(c->password));
    int rc = kvli_etcd_post(c, h, i, "/v3/auth/authenticate", body, &text, false, &out, &http,
                            why, sizeof(why), &fix);
    json_object_put(body);
    if (rc == -3) {
        kvli_err(err, KVL_ERR_PERMISSION, 0, "%s", why);
        kvli_hint(err, "%s", fix);
        return KVL_ERR_REMOTE_DISCONNECT; /* another endpoint may do; the text stays */
    }
    if (rc != 0) {
        kvli_err(err, KVL_ERR_REMOTE_DISCONNECT, 0, "etcd at %s: authenticate as '%s': %s", ep,
                 c->user, why);
        kvli_hint(err, "check that etcd runs there and the route to it");
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    const char *msg = kvli_etcd_errmsg(out, &code), *tok = kvli_etcd_str(out, "token");
    if (tok == NULL || tok[0] == '\0' || strlen(tok) >= sizeof(c->token) || msg != NULL) {
        kvli_err(err, KVL_ERR_PERMISSION, 0, "etcd at %s refused user '%s': %s (gRPC code %d)",
                 ep, c->user, msg ? msg : tok == NULL || tok[0] == '\0'
                                      ? "no token in the answer" : "a token that does not fit",
                 code);
        kvli_hint(err, msg && strstr(msg, "not enabled")
                  ? "etcd has authentication off: give no user (or enable it: etcdctl auth enable)"
                  : "check the user name and password (KVL_ETCD_USER, KVL_ETCD_PASSWORD or "
                    "kvl_etcd_config_t) and the user's role (etcdctl user get <user>)");
        json_object_put(out);
        return KVL_ERR_PERMISSION;
    }
    pthread_mutex_lock(&c->tok_lock);
    kvli_scopy(c->token, sizeof(c->token), tok);
    pthread_mutex_unlock(&c->tok_lock);
    json_object_put(out);
    return KVL_OK;
}

kvl_status_t kvli_etcd_authenticate(kvli_etcd_client_t *c, kvli_etcd_conn_t *h,
                                    kvl_error_t *err)
{
    kvl_status_t st = KVL_ERR_REMOTE_DISCONNECT;
    unsigned first = atomic_load(&c->cur);
    for (unsigned k = 0; k < c->n_eps; k++) {
        unsigned i = (first + k) % c->n_eps;
        st = kvli_etcd_auth_on(c, h, i, err);
        if (st != KVL_ERR_REMOTE_DISCONNECT) {
            if (st == KVL_OK)
                atomic_store(&c->cur, i);
            return st;
        }
    }
    return err->code != KVL_OK ? err->code : st; /* a TLS refusal: KVL_ERR_PERMISSION */
}

kvl_status_t kvli_etcd_call(kvli_etcd_client_t *c, kvli_etcd_conn_t *h, const char *path,
                            json_object *body, json_object **out, char *ep_out, size_t ep_cap,
                            kvl_error_t *err)
{
    const char *text = NULL;
    char whys[KVLI_ETCD_EPS_MAX][400], tls_why[400] = "";
    const char *tls_fix = NULL, *fix = NULL;
    unsigned first = atomic_load(&c->cur), tried = 0;
    bool reauthed = false, all_timeouts = true;

    *out = NULL;
    if (c->user[0] != '\0') {
        char tok[8];
        kvli_etcd_token(c, tok, sizeof(tok));
        if (tok[0] == '\0') {
            kvl_status_t st = kvli_etcd_authenticate(c, h, err);
            if (st != KVL_OK)
                return st;
            first = atomic_load(&c->cur);
        }
    }
    for (unsigned k = 0; k < c->n_eps; k++) {
        unsigned i = (first + k) % c->n_eps;
        json_object *o = NULL;
        long http = 0;
        int code;
        int rc = kvli_etcd_post(c, h, i, path, body, &text, true, &o, &http, whys[tried],
                                sizeof(whys[0]), &fix);
        if (rc == -5) {
            kvli_err(err, KVL_ERR_INTERNAL, 0, "etcd: kvlane could not put its own request to %s "
                     "in protobuf: %s", path, whys[tried]);
            kvli_hint(err, "a bug in kvlane: please report it; KVL_ETCD_API=gateway goes "
                           "around it");
            return KVL_ERR_INTERNAL;
        }
        if (rc == -3 && tls_fix == NULL) {
            kvli_scopy(tls_why, sizeof(tls_why), whys[tried]);
            tls_fix = fix;
        }
        if (rc == -1 || rc == -3) {
            /* curl's "Timeout was reached", "timed out"; the gRPC
             * transport's "(ETIMEDOUT)" (no answer, no SETTINGS, no connection) */
            if (strstr(whys[tried], "imeout") == NULL && strstr(whys[tried], "timed out") == NULL &&
                strstr(whys[tried], "ETIMEDOUT") == NULL)
                all_timeouts = false;
            tried++;
            continue;
        }
        if (ep_out != NULL)
            kvli_scopy(ep_out, ep_cap, c->eps[i]);
        if (rc == -2) {
            kvli_err(err, KVL_ERR_REMOTE, EPROTO, "etcd endpoint %s answered %s with %s",
                     c->eps[i], path, whys[tried]);
            kvli_hint(err, "is that an etcd (v3.4 or later) client URL? Another program may own "
                           "that port, or a proxy answers in its place");
            return KVL_ERR_REMOTE;
        }
        atomic_store(&c->cur, i);
        const char *msg = kvli_etcd_errmsg(o, &code);
        if (msg == NULL && http < 300) {
            *out = o;
            return KVL_OK;
        }
        if (msg != NULL && c->user[0] != '\0' && !reauthed &&
            (strstr(msg, "invalid auth token") != NULL || strstr(msg, "token") != NULL)) {
            /* Simple tokens expire after etcd's --auth-token-ttl idle: again once. */
            json_object_put(o);
            reauthed = true;
            kvl_status_t st = kvli_etcd_auth_on(c, h, i, err);
            if (st != KVL_OK)
                return err->code != KVL_OK ? err->code : st; /* TLS: KVL_ERR_PERMISSION */
            k--;
            continue;
        }
        kvl_status_t st = KVL_ERR_REMOTE;
        if (msg != NULL && (strstr(msg, "user name is empty") || code == 16 || code == 7)) {
            st = KVL_ERR_PERMISSION;
            kvli_err(err, st, 0, "etcd at %s refused %s: %s (gRPC code %d)", c->eps[i], path,
                     msg, code);
            kvli_hint(err, c->user[0] ? "the user lacks a role with read/write on the prefix "
                                        "(its keys are under <prefix>/ and <prefix>.inc/): "
                                        "etcdctl role grant-permission <role> --prefix readwrite "
                                        "<prefix>"
                                      : "etcd has authentication on: give a user and password "
                                        "(KVL_ETCD_USER and KVL_ETCD_PASSWORD, or "
                                        "kvl_etcd_config_t)");
        } else if (msg != NULL && code == 5) {
            st = KVL_ERR_NOT_FOUND;
            kvli_err(err, st, 0, "etcd at %s, %s: %s", c->eps[i], path, msg);
            kvli_hint(err, "the lease or key is gone (expired or revoked)");
        } else {
            char via[32] = ""; /* the gateway's HTTP status; none over gRPC */
            /* etcd's own limit, or (gRPC) its server's on a message */
            bool big = msg && (strstr(msg, "too large") || strstr(msg, "larger than max"));
            if (http != 0)
                snprintf(via, sizeof(via), ", HTTP %ld", http);
            kvli_err(err, st, 0, "etcd at %s answered %s with an error: %s (gRPC code %d%s)",
                     c->eps[i], path, msg ? msg : "no message", code, via);
            kvli_hint(err, big
                      ? "the metadata exceeds etcd's request limit: raise etcd's "
                        "--max-request-bytes or register fewer, larger regions"
                      : msg && strstr(msg, "no leader")
                      ? "the etcd cluster has lost its quorum: bring members back"
                      : "see etcd's log on that member");
        }
        json_object_put(o);
        return st;
    }
    /* No endpoint answered. */
    char list[1000] = "";
    size_t w = 0;
    for (unsigned k = 0; k < tried && w < sizeof(list); k++) {
        unsigned i = (first + k) % c->n_eps;
        int n = snprintf(list + w, sizeof(list) - w, "%s%s: %s", k ? "; " : "", c->eps[i],
                         whys[k]);
        if (n < 0)
            break;
        w += (size_t)n;
    }
    if (tls_fix != NULL) {
        /* A TLS refusal says more than "not reached": it leads. */
        if (tried > 1)
            kvli_err(err, KVL_ERR_PERMISSION, 0, "%s; no etcd endpoint answered %s (%.900s)",
                     tls_why, path, list);
        else
            kvli_err(err, KVL_ERR_PERMISSION, 0, "%s", tls_why);
        kvli_hint(err, "%s", tls_fix);
        return KVL_ERR_PERMISSION;
    }
    kvl_status_t st = all_timeouts ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT;
    kvli_err(err, st, 0, "no etcd endpoint answered %s within %" PRIu64 " ms each (%.900s)",
             path, c->timeout_ms, list);
    kvli_hint(err, "start etcd, or fix the endpoint list (NIXL_ETCD_ENDPOINTS); check the route "
                   "to it (firewall, network namespace). Transfers already set up keep working "
                   "meanwhile");
    return st;
}
