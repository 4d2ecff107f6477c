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
#define KVLI_ETCD_TOKEN_MAX 2048u       /* an auth token (a JWT signed with RSA-4096 is ~900) */

/* How an endpoint is spoken to: etcd's gRPC API over HTTP/2 (cleartext,
 * http:// endpoints), or its JSON gateway over HTTP/1.1. KVL_ETCD_API picks
 * one for all endpoints; auto (the default) tries gRPC and keeps to the
 * gateway where what answers is not HTTP/2 (a proxy, an older etcd). */
typedef enum {
    KVLI_ETCD_API_AUTO,
    KVLI_ETCD_API_GRPC,
    KVLI_ETCD_API_GATEWAY
} kvli_etcd_api_t;

typedef struct kvli_etcd_client {
    char eps[KVLI_ETCD_EPS_MAX][KVLI_ETCD_EP_LEN]; /* "http://host:port", no trailing / */
    unsigned n_eps;
    atomic_uint cur;                               /* endpoint tried first */
    kvli_etcd_api_t api;                           /* KVL_ETCD_API */
    atomic_int ep_api[KVLI_ETCD_EPS_MAX];          /* what each speaks: AUTO until known */
    char ep_no_grpc[KVLI_ETCD_EPS_MAX][160];       /* what answered gRPC's preface instead */
    char user[128], password[128];                 /* user "" : no authentication */
    uint64_t timeout_ms;
    pthread_mutex_t tok_lock;
    char token[KVLI_ETCD_TOKEN_MAX];               /* "" until authenticated */
    /* TLS (etcd_tls.c): "" when not given. tls: any file given, so every
     * endpoint is https. subject: the client certificate's. */
    char cacert[KVLI_ETCD_PATH_MAX], cert[KVLI_ETCD_PATH_MAX], key[KVLI_ETCD_PATH_MAX];
    char subject[256];
    bool tls, verify_name;
} kvli_etcd_client_t;

struct kvli_h2;

/* The connection one thread makes its calls on: an HTTP/2 connection for
 * gRPC (to one endpoint) and a curl handle for the JSON gateway, each made
 * at its first use. One thread at a time. */
typedef struct kvli_etcd_conn {
    struct kvli_h2 *h2;
    CURL *curl;
} kvli_etcd_conn_t;
kvli_etcd_conn_t *kvli_etcd_conn_new(void); /* NULL: out of memory */
void kvli_etcd_conn_free(kvli_etcd_conn_t *h); /* NULL: nothing */

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

/* Whether endpoint i is to be tried over gRPC (not known to be the gateway
 * only, and neither KVL_ETCD_API nor its scheme says otherwise). */
bool kvli_etcd_grpc_on(kvli_etcd_client_t *c, unsigned i);
/* Endpoint i answered the HTTP/2 preface with something else (why): use its
 * gateway from now on (logged once). */
void kvli_etcd_grpc_off(kvli_etcd_client_t *c, unsigned i, const char *why);
/* The index of endpoint ep in c (c->n_eps when not one of them). */
unsigned kvli_etcd_ep_index(const kvli_etcd_client_t *c, const char *ep);

/* curl_global_init, once per process. */
void kvli_etcd_global_init(void);

/*
 * POST body (JSON) to path ("/v3/kv/put") on the first endpoint that
 * answers. h: a connection of the caller's thread (reused) or NULL. On
 * KVL_OK *out is the parsed answer (json_object_put it); on error err names
 * the endpoint(s), what each answered and what to do. ep_out (optional)
 * gets the endpoint that answered.
 */
kvl_status_t kvli_etcd_call(kvli_etcd_client_t *c, kvli_etcd_conn_t *h, const char *path,
                            json_object *body, json_object **out, char *ep_out, size_t ep_cap,
                            kvl_error_t *err);

/* Authenticate now (user set), on the first endpoint that answers. */
kvl_status_t kvli_etcd_authenticate(kvli_etcd_client_t *c, kvli_etcd_conn_t *h,
                                    kvl_error_t *err);

/* Copy the current "Authorization" header value ("" when none). */
void kvli_etcd_token(kvli_etcd_client_t *c, char *buf, size_t cap);

/* base64 of len bytes (malloc'ed, NUL-terminated) / decoded bytes (malloc'ed). */
char *kvli_etcd_b64(const void *p, size_t len);
void *kvli_etcd_unb64(const char *s, size_t *len_p);

/*
 * etcd_parse.c: typed reads of what etcd answered. A field that is absent,
 * a JSON null or of another type reads as absent (NULL, false, 0): json-c
 * aborts the process when an array call meets another type.
 */
json_object *kvli_etcd_arr(json_object *o, const char *field);
json_object *kvli_etcd_obj(json_object *o, const char *field);
const char *kvli_etcd_str(json_object *o, const char *field);
bool kvli_etcd_true(json_object *o, const char *field); /* a JSON true */
bool kvli_etcd_has(json_object *o, const char *field);  /* present, whatever its value */
/* An int64 field, which the gateway writes as a string ("revision":"12"):
 * a JSON integer or a string of exactly a decimal int64; else 0. */
int64_t kvli_etcd_i64(json_object *o, const char *field);

/* The metadata in a range answer: KVL_OK with *blob_p (malloc'ed, *len_p
 * bytes); KVL_ERR_NOT_FOUND: no key, or an empty value; KVL_ERR_REMOTE: a
 * value that is not base64 (why). */
kvl_status_t kvli_etcd_range_value(json_object *ans, void **blob_p, size_t *len_p, char *why,
                                   size_t why_cap);

/* One watch answer (a message on the WebSocket, or a line of an HTTP watch
 * stream). events is borrowed from the parsed message. */
typedef struct kvli_etcd_wres {
    bool created, canceled;
    int64_t watch_id, compact;         /* compact: etcd compacted past the asked revision */
    char reason[160];                  /* cancel_reason, or "no reason given" */
    json_object *events;               /* the events array, NULL when none */
    char fail[256];                    /* when not a result: etcd's error, as text */
} kvli_etcd_wres_t;
/* false: o is no watch result (an error object, or no JSON object): fail
 * says what etcd said. */
bool kvli_etcd_wres_parse(json_object *o, kvli_etcd_wres_t *r);

/* One watch event on a presence key under pfx ("<prefix>.inc/"). */
typedef enum {
    KVLI_ETCD_EV_NONE, /* not a presence key of an agent (ignored) */
    KVLI_ETCD_EV_OK,   /* name, del, and for a put inc and gen */
    KVLI_ETCD_EV_BAD   /* an agent's key whose value cannot be read (bad says what) */
} kvli_etcd_ev_kind_t;
typedef struct kvli_etcd_ev {
    bool del;
    char name[KVL_NAME_MAX];
    uint64_t inc, gen;
    int64_t mod_rev;                   /* filled whatever the kind (0: absent) */
    char bad[128];
} kvli_etcd_ev_t;
kvli_etcd_ev_kind_t kvli_etcd_ev_parse(json_object *ev, const char *pfx, kvli_etcd_ev_t *e);

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
    bool msg_on;                       /* a message is begun (its first frame came) */
} kvli_etcd_ws_t;

/* One frame received: header and payload (payload points into w->in). */
typedef struct kvli_etcd_ws_frame {
    unsigned fin, op;
    const char *payload;
    uint64_t len;
    size_t size;                       /* header + payload */
} kvli_etcd_ws_frame_t;

/* The parts of kvli_etcd_ws_read that do no I/O (fuzzed):
 * next: the first whole frame of w->in, checked as a client must check a
 *   server's (RFC 6455: no mask, no reserved bits, known opcodes, control
 *   frames whole and short, at most KVLI_ETCD_REPLY_MAX): 1 with *f, 0 when
 *   more bytes are needed, -1 (why);
 * collect: a data frame (opcode 0, 1, 2) into w->msg: 1 a whole message is
 *   there (w->msg, w->msg_len, NUL-terminated; kvli_etcd_ws_taken after),
 *   0 not yet, -1 (why: a continuation of nothing, a message inside one);
 * consume: drop frame f from w->in.
 * upgraded: head (the handshake answer up to its blank line) is the 101
 *   answer with the accept value RFC 6455 derives from key. */
int kvli_etcd_ws_next(const kvli_etcd_ws_t *w, kvli_etcd_ws_frame_t *f, char *why,
                      size_t why_cap);
int kvli_etcd_ws_collect(kvli_etcd_ws_t *w, const kvli_etcd_ws_frame_t *f, char *why,
                         size_t why_cap);
void kvli_etcd_ws_taken(kvli_etcd_ws_t *w);
void kvli_etcd_ws_consume(kvli_etcd_ws_t *w, const kvli_etcd_ws_frame_t *f);
bool kvli_etcd_ws_upgraded(const char *head, const char *key);

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
