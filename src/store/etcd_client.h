/*
 * kvlane etcd client: etcd's v3 API through its JSON gateway (HTTP POST of
 * JSON to /v3/..., keys and values base64), with libcurl for HTTP and json-c
 * for JSON (both Debian packages; docs/etcd.md says why not gRPC).
 *
 * A client holds the endpoint list, which one answered last (tried first),
 * and the credentials and auth token. Every call is bounded by the client's
 * timeout per endpoint; an endpoint that cannot be reached is skipped for
 * the next one; an answer from etcd (even an error) ends the call.
 */
#ifndef KVLI_ETCD_CLIENT_H
#define KVLI_ETCD_CLIENT_H

#include <curl/curl.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdatomic.h>
#include <kvlane/etcd.h>
#include "core/internal.h"

#define KVLI_ETCD_EPS_MAX 16u
#define KVLI_ETCD_EP_LEN 256u
#define KVLI_ETCD_REPLY_MAX (64u << 20) /* bytes of one answer */
#define KVLI_ETCD_PATH_MAX 512u         /* a TLS file's path */

typedef struct kvli_etcd_client {
    char eps[KVLI_ETCD_EPS_MAX][KVLI_ETCD_EP_LEN]; /* "http://host:port", no trailing / */
    unsigned n_eps;
    atomic_uint cur;                               /* endpoint tried first */
    char user[128], password[128];                 /* user "" : no authentication */
    uint64_t timeout_ms;
    pthread_mutex_t tok_lock;
    char token[512];                               /* "" until authenticated */
    /* TLS (etcd_tls.c): "" when not given. tls: any file given, so every
     * endpoint is https. subject: the client certificate's. */
    char cacert[KVLI_ETCD_PATH_MAX], cert[KVLI_ETCD_PATH_MAX], key[KVLI_ETCD_PATH_MAX];
    char subject[256];
    bool tls, verify_name;
} kvli_etcd_client_t;

/* Parse "url[,url...]" ("host:port" gets http://, https:// with TLS files;
 * http:// with TLS files is refused) and check the TLS files (tls may be
 * NULL). err filled on failure. */
kvl_status_t kvli_etcd_client_init(kvli_etcd_client_t *c, const char *endpoints,
                                   const char *user, const char *password, uint64_t timeout_ms,
                                   const kvl_etcd_tls_t *tls, kvl_error_t *err);

/* etcd_tls.c: copy and check the files of tls (NULL: none), before any
 * connection: readable, PEM, the key the certificate's. */
kvl_status_t kvli_etcd_tls_init(kvli_etcd_client_t *c, const kvl_etcd_tls_t *tls,
                                kvl_error_t *err);
/* The TLS options of c on h (CA, client certificate and key, name check). */
void kvli_etcd_tls_setup(const kvli_etcd_client_t *c, CURL *h);
/* When a failure talking to ep is about TLS (curl's code cc and its text
 * detail, or, with cc CURLE_OK, the answer's body; h the handle that
 * failed, or NULL): what went wrong in why and what to do returned; NULL
 * when it is not a TLS matter. */
const char *kvli_etcd_tls_explain(const kvli_etcd_client_t *c, CURL *h, const char *ep, int cc,
                                  const char *detail, char *why, size_t cap);
void kvli_etcd_client_fini(kvli_etcd_client_t *c);

/* curl_global_init, once per process. */
void kvli_etcd_global_init(void);

/*
 * POST body (JSON) to path ("/v3/kv/put") on the first endpoint that
 * answers. h: a curl handle of the caller's thread (reused connection) or
 * NULL. On KVL_OK *out is the parsed answer (json_object_put it); on error
 * err names the endpoint(s), what each answered and what to do. ep_out
 * (optional) gets the endpoint that answered.
 */
kvl_status_t kvli_etcd_call(kvli_etcd_client_t *c, CURL *h, const char *path, json_object *body,
                            json_object **out, char *ep_out, size_t ep_cap, kvl_error_t *err);

/* Authenticate now (user set), on the first endpoint that answers. */
kvl_status_t kvli_etcd_authenticate(kvli_etcd_client_t *c, CURL *h, kvl_error_t *err);

/* Copy the current "Authorization" header value ("" when none). */
void kvli_etcd_token(kvli_etcd_client_t *c, char *buf, size_t cap);

/* base64 of len bytes (malloc'ed, NUL-terminated) / decoded bytes (malloc'ed). */
char *kvli_etcd_b64(const void *p, size_t len);
void *kvli_etcd_unb64(const char *s, size_t *len_p);

/* A JSON int64 field that the gateway writes as a string ("revision":"12"); 0 when absent. */
int64_t kvli_etcd_i64(json_object *o, const char *field);

/* Common curl options: timeouts, no signals, TCP keepalive, and c's TLS
 * files (c NULL: none). Every handle that talks to etcd goes through it. */
void kvli_etcd_curl_setup(const kvli_etcd_client_t *c, CURL *h, uint64_t timeout_ms);
/* Append n bytes to the NUL-terminated buffer *p (length *len, room *cap),
 * growing it: 0; -1 past KVLI_ETCD_REPLY_MAX; -2 out of memory. */
int kvli_etcd_append(char **p, size_t *len, size_t *cap, const char *data, size_t n);


/* A WebSocket to etcd's gateway (etcd_ws.c): one bidirectional stream. */
typedef struct kvli_etcd_ws {
    CURL *h;
    int fd;                            /* -1 when closed */
    char *in, *msg;                    /* received bytes; the message being reassembled */
    size_t in_len, in_cap, msg_len, msg_cap;
} kvli_etcd_ws_t;

typedef void (*kvli_etcd_ws_msg_fn)(void *arg, const char *text, size_t len);

/* Connect to ep (with c's TLS files) and upgrade path ("/v3/watch") to a
 * WebSocket, bounded by timeout_ms: 0; -1 not reached (why); -2 reached,
 * but it answered no upgrade (a gateway or proxy without WebSockets: why
 * quotes it). */
int kvli_etcd_ws_open(kvli_etcd_ws_t *w, const kvli_etcd_client_t *c, const char *ep,
                      const char *path, uint64_t timeout_ms, char *why, size_t why_cap);
/* One text message: 0, or -1 with why (then close it). */
int kvli_etcd_ws_send(kvli_etcd_ws_t *w, const char *text, uint64_t timeout_ms, char *why,
                      size_t why_cap);
/* Read what has arrived without blocking and call fn for every whole
 * message (NUL-terminated); pings are answered: 0, or -1 when the
 * connection ended or broke the protocol (why). */
int kvli_etcd_ws_read(kvli_etcd_ws_t *w, kvli_etcd_ws_msg_fn fn, void *arg, char *why,
                      size_t why_cap);
void kvli_etcd_ws_close(kvli_etcd_ws_t *w);

#endif
