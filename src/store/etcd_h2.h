/*
 * kvlane etcd client: gRPC over cleartext HTTP/2 ("h2c" with prior
 * knowledge, which etcd serves on its client port beside the JSON gateway),
 * with libnghttp2 for the HTTP/2 framing. This layer knows gRPC's framing
 * (a 5-byte prefix per message, grpc-status/grpc-message) but not protobuf:
 * messages are opaque bytes.
 *
 * One kvli_h2_t is one connection to one endpoint, used by one thread at a
 * time. Every call is bounded by its timeout; nothing aborts; failures are
 * told in a why buffer naming the endpoint.
 */
#ifndef KVLI_ETCD_H2_H
#define KVLI_ETCD_H2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvli_h2 kvli_h2_t;

/* Connect to ep ("http://host:port"; https:// is refused: TLS is not this
 * layer's yet) and start HTTP/2 (client preface and SETTINGS), bounded by
 * timeout_ms (connect and the server's SETTINGS): 0 with *c; -1 not reached
 * (why: refused, no route, timeout, with the errno's name); -2 reached, but
 * what answered is not HTTP/2 (an HTTP/1.1 server, a proxy serving only the
 * JSON gateway: why quotes the first bytes it sent); -3 a server that
 * closed the connection without a byte: a member going down, a balancer
 * with no backend up, but also a TLS listener (etcd's https port) or a
 * server that closes on the preface yet serves HTTP/1.1: neither "not
 * reached" nor "not HTTP/2" for sure. */
int kvli_h2_open(kvli_h2_t **c, const char *ep, uint64_t timeout_ms, char *why, size_t why_cap);
void kvli_h2_close(kvli_h2_t *c); /* NULL ok */
const char *kvli_h2_ep(const kvli_h2_t *c);
/* false after a GOAWAY, a connection error, EOF, or a failed call. */
bool kvli_h2_usable(const kvli_h2_t *c);

typedef struct kvli_h2_reply {
    int status;        /* grpc-status (0 OK); -1 when the stream ended without one */
    char message[512]; /* grpc-message, percent-decoded; without a grpc-status: what came */
    int http;          /* :status (0: none came) */
    uint8_t *msg;      /* the one response message (malloc'ed; NULL when none) */
    size_t len;
} kvli_h2_reply_t;
void kvli_h2_reply_free(kvli_h2_reply_t *r);

/* One unary call (also a stream method that answers one message to one
 * request then ends, as etcd's LeaseKeepAlive does when the client
 * half-closes). path "/etcdserverpb.KV/Range"; token: etcd's auth token
 * (the "token" header; NULL or "": none); msg/len: the serialized request
 * (the 5-byte prefix is added here); max: the largest response message
 * accepted. Sends grpc-timeout from timeout_ms; bounded by it overall.
 * 0: the call completed at the HTTP/2 level (*r filled; r->status may be an
 * etcd error); -1: transport failure (connection broken, timeout, stream
 * reset, a malformed gRPC message, one larger than max, more than one):
 * why, and the connection is then not usable (close it). */
int kvli_h2_unary(kvli_h2_t *c, const char *path, const char *token, const uint8_t *msg,
                  size_t len, size_t max, uint64_t timeout_ms, kvli_h2_reply_t *r,
                  char *why, size_t why_cap);

/* Bidirectional streams (etcd's Watch).
 * open: HEADERS sent (no END_STREAM); *sid the stream's id: 0, or -1 (why).
 * send: one message (prefixed) handed to the socket within timeout_ms: 0,
 *   or -1 (why; the connection is then not usable).
 * cancel: RST_STREAM(CANCEL) on it; no end callback follows for it. */
int kvli_h2_stream_open(kvli_h2_t *c, const char *path, const char *token, int32_t *sid,
                        uint64_t timeout_ms, char *why, size_t why_cap);
int kvli_h2_stream_send(kvli_h2_t *c, int32_t sid, const uint8_t *msg, size_t len,
                        uint64_t timeout_ms, char *why, size_t why_cap);
int kvli_h2_stream_cancel(kvli_h2_t *c, int32_t sid, uint64_t timeout_ms, char *why,
                          size_t why_cap);

/* For poll(): the socket, and whether bytes wait to be written (POLLOUT).
 * pending: messages or stream ends already read (by a unary call or a send
 * on the same connection, which read the socket while waiting) wait for
 * kvli_h2_pump, or the connection broke: pump without waiting for the
 * socket, which may stay quiet. */
int kvli_h2_fd(const kvli_h2_t *c);
bool kvli_h2_want_write(const kvli_h2_t *c);
bool kvli_h2_pending(const kvli_h2_t *c);

/* Read what arrived without blocking and write what is pending; for each
 * whole message of a stream opened with kvli_h2_stream_open call
 * fn(arg, sid, msg, len) (msg valid during the call); when such a stream
 * ends (trailers, RST_STREAM, a message it sent that is malformed or larger
 * than max) call end(arg, sid, grpc-status or -1, message). 0, or -1 (why)
 * when the connection ended or broke the protocol: end is then called for
 * every stream still open, with -1 and that why. fn and end may send on or
 * open streams, not close c. */
typedef void (*kvli_h2_msg_fn)(void *arg, int32_t sid, const uint8_t *msg, size_t len);
typedef void (*kvli_h2_end_fn)(void *arg, int32_t sid, int status, const char *message);
int kvli_h2_pump(kvli_h2_t *c, size_t max, kvli_h2_msg_fn fn, kvli_h2_end_fn end, void *arg,
                 char *why, size_t why_cap);

/* Parts without I/O (exposed for tests):
 * grpc-message's percent-decoding (RFC 3986 style, as the gRPC spec asks;
 *   a malformed escape is kept as is) into out (always NUL-terminated);
 * grpc-timeout's value for timeout_ms ("5000m"; at most 8 digits). */
void kvli_h2_pct_decode(const char *in, size_t n, char *out, size_t cap);
void kvli_h2_grpc_timeout(uint64_t timeout_ms, char *out, size_t cap);

#endif
