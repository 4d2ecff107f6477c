/*
 * kvlane etcd client: gRPC over cleartext HTTP/2 (see etcd_h2.h).
 *
 * nghttp2 does the HTTP/2 framing, HPACK and flow control; it does no I/O
 * here: bytes it wants sent go through nghttp2_session_mem_send into an
 * outgoing buffer written to a non-blocking socket, bytes read go in
 * through nghttp2_session_mem_recv. Every wait is a poll() bounded by a
 * deadline.
 *
 * gRPC framing (the gRPC "HTTP/2 protocol" document): each message is a
 * 1-byte compressed flag, a 4-byte big-endian length, then the bytes; a
 * message may be split over DATA frames and a frame may hold several. The
 * call's outcome comes in grpc-status/grpc-message, in the trailers or, for
 * a "trailers-only" answer (etcd's errors), in the only HEADERS frame.
 *
 * nghttp2's callbacks never call the user's: whole messages and stream
 * ends of kvli_h2_stream_open's streams are queued and handed out by
 * kvli_h2_pump after nghttp2 returned, so a callback may send on a stream.
 */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "common/clock.h"
#include "common/errname.h"
#include "common/inet.h"
#include "etcd_h2.h"

#define KVLI_H2_WINDOW (16 << 20)          /* our receive window, connection and stream */
/* buffered for the socket before asking nghttp2 for more */
#define KVLI_H2_OUT_HIGH (256u << 10)
#define KVLI_H2_PUMP_READ (4u << 20)       /* bytes one pump reads at most */
#define KVLI_H2_MAX_DEFAULT ((size_t)64 << 20) /* a stream message's bound before the first pump */
#define KVLI_H2_PREFIX 5u

typedef struct kvli_h2_st {
    struct kvli_h2_st *next;
    int32_t sid;
    bool unary;
    char path[128];
    size_t max;                        /* unary: its bound (streams: c->pump_max) */
    uint8_t *out;                      /* prefixed messages not yet taken by nghttp2 */
    size_t out_off, out_len, out_cap;
    bool out_eof;                      /* END_STREAM once out is taken */
    uint8_t *in;                       /* received bytes of the message being reassembled */
    size_t in_len, in_cap;
    int http;
    bool has_status;
    int gstatus;
    char gmsg[512];
    char ctype[64];
    uint8_t *msg;                      /* unary: the response message */
    size_t msg_len;
    bool got_msg;
    bool headers_sent, closed, reset_by_peer;
    uint32_t close_code;
    bool cancelled;                    /* by us (kvli_h2_stream_cancel): no end event */
    bool failed;                       /* a message that broke the gRPC framing: fail says */
    char fail[320];
} kvli_h2_st_t;

typedef struct kvli_h2_ev {
    struct kvli_h2_ev *next;
    int32_t sid;
    bool end;
    int status;
    char text[600];
    uint8_t *msg;
    size_t len;
} kvli_h2_ev_t;

struct kvli_h2 {
    char ep[256], authority[256];
    int fd;
    nghttp2_session *s;
    uint8_t *out;                      /* serialized frames for the socket */
    size_t out_off, out_len, out_cap;
    kvli_h2_st_t *streams;
    kvli_h2_ev_t *ev_head, *ev_tail;
    size_t pump_max;
    bool checked;                      /* the first 9 bytes were a SETTINGS frame's header */
    bool not_h2;                       /* they were not */
    uint8_t first[64];
    size_t first_len;
    bool settings_seen;
    bool goaway;
    int32_t goaway_last;
    uint32_t goaway_code;
    char goaway_debug[80];
    bool broken;
    char fail[400];
    char lib_err[200];                 /* nghttp2's last error text */
    uint8_t rbuf[16384];
};

/* ---- small helpers ------------------------------------------------------- */

static void kvli_h2_why(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kvli_h2_why(char *why, size_t cap, const char *fmt, ...)
{
    if (why == NULL || cap == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

/* The connection is broken: the first reason stays. */
static void kvli_h2_break(kvli_h2_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kvli_h2_break(kvli_h2_t *c, const char *fmt, ...)
{
    if (c->broken)
        return;
    c->broken = true;
    int n = snprintf(c->fail, sizeof(c->fail), "etcd at %s: ", c->ep);
    if (n < 0 || (size_t)n >= sizeof(c->fail))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fail + n, sizeof(c->fail) - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Append n bytes at *len of a growing buffer: 0, or -1 out of memory. */
static int kvli_h2_put(uint8_t **b, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (n > SIZE_MAX / 2 - *len)
        return -1;
    if (*len + n > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *len + n)
            nc *= 2;
        uint8_t *nb = realloc(*b, nc);
        if (nb == NULL)
            return -1;
        *b = nb;
        *cap = nc;
    }
    if (n > 0)
        memcpy(*b + *len, p, n);
    *len += n;
    return 0;
}

/* Drop the taken front (off) of a buffer that has one. */
static void kvli_h2_compact(uint8_t *b, size_t *off, size_t *len)
{
    if (*off == 0)
        return;
    if (*off < *len)
        memmove(b, b + *off, *len - *off);
    *len -= *off;
    *off = 0;
}

static const char *kvli_h2_code_name(uint32_t code)
{
    return nghttp2_http2_strerror(code);
}

/* bytes as printable text: \r \n \t as such, other bytes as \xHH. */
static void kvli_h2_quote(const uint8_t *p, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        char t[8];
        uint8_t b = p[i];
        if (b == '\r')
            snprintf(t, sizeof(t), "\\r");
        else if (b == '\n')
            snprintf(t, sizeof(t), "\\n");
        else if (b == '\t')
            snprintf(t, sizeof(t), "\\t");
        else if (b == '"' || b == '\\')
            snprintf(t, sizeof(t), "\\%c", b);
        else if (b >= 0x20 && b < 0x7f)
            snprintf(t, sizeof(t), "%c", b);
        else
            snprintf(t, sizeof(t), "\\x%02x", b);
        size_t tl = strlen(t);
        if (o + tl + 1 > cap)
            break;
        memcpy(out + o, t, tl);
        o += tl;
    }
    out[o] = '\0';
}

static int kvli_h2_hex(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

void kvli_h2_pct_decode(const char *in, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return;
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        int hi, lo;
        if (in[i] == '%' && i + 2 < n && (hi = kvli_h2_hex((unsigned char)in[i + 1])) >= 0 &&
            (lo = kvli_h2_hex((unsigned char)in[i + 2])) >= 0) {
            out[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[o++] = in[i];
        }
    }
    out[o] = '\0';
}

void kvli_h2_grpc_timeout(uint64_t timeout_ms, char *out, size_t cap)
{
    /* TimeoutValue is at most 8 digits. */
    if (timeout_ms <= 99999999u)
        snprintf(out, cap, "%llum", (unsigned long long)timeout_ms);
    else if (timeout_ms / 1000u <= 99999999u)
        snprintf(out, cap, "%lluS", (unsigned long long)(timeout_ms / 1000u));
    else
        snprintf(out, cap, "99999999S");
}

static kvli_h2_st_t *kvli_h2_find(const kvli_h2_t *c, int32_t sid)
{
    for (kvli_h2_st_t *st = c->streams; st != NULL; st = st->next)
        if (st->sid == sid)
            return st;
    return NULL;
}

static void kvli_h2_st_free(kvli_h2_st_t *st)
{
    if (st == NULL)
        return;
    free(st->out);
    free(st->in);
    free(st->msg);
    free(st);
}

static void kvli_h2_unlink(kvli_h2_t *c, kvli_h2_st_t *st)
{
    for (kvli_h2_st_t **pp = &c->streams; *pp != NULL; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            return;
        }
}

/* Queue an event for kvli_h2_pump; msg is copied. false: out of memory. */
static bool kvli_h2_queue(kvli_h2_t *c, int32_t sid, bool end, int status, const char *text,
                          const uint8_t *msg, size_t len)
{
    kvli_h2_ev_t *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return false;
    ev->sid = sid;
    ev->end = end;
    ev->status = status;
    snprintf(ev->text, sizeof(ev->text), "%s", text ? text : "");
    if (!end) {
        ev->msg = malloc(len ? len : 1);
        if (ev->msg == NULL) {
            free(ev);
            return false;
        }
        if (len)
            memcpy(ev->msg, msg, len);
        ev->len = len;
    }
    if (c->ev_tail)
        c->ev_tail->next = ev;
    else
        c->ev_head = ev;
    c->ev_tail = ev;
    return true;
}

/* Drop the queued events of stream sid. */
static void kvli_h2_unqueue(kvli_h2_t *c, int32_t sid)
{
    kvli_h2_ev_t **pp = &c->ev_head, *last = NULL;
    while (*pp != NULL) {
        kvli_h2_ev_t *ev = *pp;
        if (ev->sid == sid) {
            *pp = ev->next;
            free(ev->msg);
            free(ev);
        } else {
            last = ev;
            pp = &ev->next;
        }
    }
    c->ev_tail = last;
}

/* ---- nghttp2 callbacks --------------------------------------------------- */

/* A stream's message broke the framing (or its bound): reset the stream;
 * a stream of kvli_h2_stream_open learns it through its end event. */
static void kvli_h2_st_fail(kvli_h2_t *c, kvli_h2_st_t *st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kvli_h2_st_fail(kvli_h2_t *c, kvli_h2_st_t *st, const char *fmt, ...)
{
    if (st->failed)
        return;
    st->failed = true;
    int n = snprintf(st->fail, sizeof(st->fail), "etcd at %s: %s: ", c->ep, st->path);
    if (n > 0 && (size_t)n < sizeof(st->fail)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->fail + n, sizeof(st->fail) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    st->in_len = 0;
    nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, st->sid, NGHTTP2_CANCEL);
    if (!st->unary && !st->cancelled) {
        if (!kvli_h2_queue(c, st->sid, true, -1, st->fail, NULL, 0))
            kvli_h2_break(c, "out of memory for a stream's end");
        st->cancelled = true; /* its end is told */
    }
}

/* Take the whole messages at the front of st->in. */
static void kvli_h2_reassemble(kvli_h2_t *c, kvli_h2_st_t *st)
{
    size_t off = 0, max = st->unary ? st->max : c->pump_max;
    while (!st->failed && st->in_len - off >= KVLI_H2_PREFIX) {
        const uint8_t *p = st->in + off;
        uint32_t n = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
        if (p[0] == 1) {
            kvli_h2_st_fail(c, st, "a compressed gRPC message (none was asked for)");
            return;
        }
        if (p[0] != 0) {
            kvli_h2_st_fail(c, st, "a gRPC message with flags 0x%02x (not a gRPC answer?)",
                            p[0]);
            return;
        }
        if (n > max) {
            kvli_h2_st_fail(c, st, "a gRPC message of %lu bytes, above the %zu allowed",
                            (unsigned long)n, max);
            return;
        }
        if (st->in_len - off - KVLI_H2_PREFIX < n)
            break;
        const uint8_t *m = p + KVLI_H2_PREFIX;
        if (st->unary) {
            if (st->got_msg) {
                kvli_h2_st_fail(c, st, "more than one response message to a unary call");
                return;
            }
            st->msg = malloc(n ? n : 1);
            if (st->msg == NULL) {
                kvli_h2_st_fail(c, st, "out of memory for a message of %lu bytes",
                                (unsigned long)n);
                return;
            }
            if (n)
                memcpy(st->msg, m, n);
            st->msg_len = n;
            st->got_msg = true;
        } else if (!st->cancelled && !kvli_h2_queue(c, st->sid, false, 0, NULL, m, n)) {
            kvli_h2_st_fail(c, st, "out of memory for a message of %lu bytes",
                            (unsigned long)n);
            return;
        }
        off += KVLI_H2_PREFIX + n;
    }
    if (!st->failed)
        kvli_h2_compact(st->in, &off, &st->in_len);
}

static int kvli_h2_on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data,
                           size_t len, void *ud)
{
    (void)flags;
    kvli_h2_t *c = ud;
    kvli_h2_st_t *st = nghttp2_session_get_stream_user_data(s, sid);
    if (st == NULL || st->failed || st->cancelled)
        return 0; /* consumed all the same: the window moves on */
    /* Only the prefix's bound matters for memory: a message is kept whole
     * only when its length passed the check in kvli_h2_reassemble. */
    if (kvli_h2_put(&st->in, &st->in_len, &st->in_cap, data, len) != 0) {
        kvli_h2_st_fail(c, st, "out of memory reassembling a message");
        return 0;
    }
    kvli_h2_reassemble(c, st);
    return 0;
}

static int kvli_h2_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                             size_t namelen, const uint8_t *value, size_t valuelen,
                             uint8_t flags, void *ud)
{
    (void)flags;
    (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS)
        return 0;
    kvli_h2_st_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (st == NULL)
        return 0;
    const char *nm = (const char *)name, *v = (const char *)value;
    if (namelen == 7 && memcmp(nm, ":status", 7) == 0) {
        int h = 0;
        for (size_t i = 0; i < valuelen && i < 3 && v[i] >= '0' && v[i] <= '9'; i++)
            h = h * 10 + (v[i] - '0');
        st->http = h;
    } else if (namelen == 11 && memcmp(nm, "grpc-status", 11) == 0) {
        int g = 0;
        bool ok = valuelen > 0 && valuelen <= 4;
        for (size_t i = 0; ok && i < valuelen; i++) {
            ok = v[i] >= '0' && v[i] <= '9';
            g = g * 10 + (v[i] - '0');
        }
        if (ok) {
            st->has_status = true;
            st->gstatus = g;
        }
    } else if (namelen == 12 && memcmp(nm, "grpc-message", 12) == 0) {
        kvli_h2_pct_decode(v, valuelen, st->gmsg, sizeof(st->gmsg));
    } else if (namelen == 12 && memcmp(nm, "content-type", 12) == 0) {
        snprintf(st->ctype, sizeof(st->ctype), "%.*s", (int)(valuelen < 60 ? valuelen : 60), v);
    }
    return 0;
}

static int kvli_h2_outcome(const kvli_h2_t *c, const kvli_h2_st_t *st, char *msg, size_t cap);

static int kvli_h2_on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    kvli_h2_t *c = ud;
    if (f->hd.type == NGHTTP2_SETTINGS && !(f->hd.flags & NGHTTP2_FLAG_ACK)) {
        c->settings_seen = true;
    } else if (f->hd.type == NGHTTP2_GOAWAY) {
        c->goaway = true;
        c->goaway_last = f->goaway.last_stream_id;
        c->goaway_code = f->goaway.error_code;
        kvli_h2_quote(f->goaway.opaque_data, f->goaway.opaque_data_len < 60
                                                 ? f->goaway.opaque_data_len : 60,
                      c->goaway_debug, sizeof(c->goaway_debug));
    } else if (f->hd.type == NGHTTP2_RST_STREAM) {
        kvli_h2_st_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
        if (st != NULL)
            st->reset_by_peer = true;
    } else if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) &&
               (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        /* The server ended its side of a stream whose side we keep open
         * (a Watch it ended): the call is over (its messages were queued
         * before); tell it now and close our side too, as gRPC clients do,
         * with RST_STREAM(NO_ERROR). st stays until nghttp2 closes it. */
        kvli_h2_st_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
        if (st != NULL && !st->unary && !st->cancelled) {
            char text[600];
            int status = kvli_h2_outcome(c, st, text, sizeof(text));
            if (!kvli_h2_queue(c, st->sid, true, status, text, NULL, 0))
                kvli_h2_break(c, "out of memory for a stream's end");
            st->cancelled = true;
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, st->sid, NGHTTP2_NO_ERROR);
        }
    }
    return 0;
}

static int kvli_h2_on_frame_send(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    kvli_h2_t *c = ud;
    if (f->hd.type == NGHTTP2_HEADERS) {
        kvli_h2_st_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
        if (st != NULL)
            st->headers_sent = true;
    } else if (f->hd.type == NGHTTP2_GOAWAY && f->goaway.error_code != NGHTTP2_NO_ERROR) {
        /* nghttp2 ends the connection when the server broke HTTP/2 */
        kvli_h2_break(c, "the server broke the HTTP/2 protocol (%s%s%s); connection ended",
                      kvli_h2_code_name(f->goaway.error_code), c->lib_err[0] ? ": " : "",
                      c->lib_err);
    }
    return 0;
}

/* The text of why a stream that nghttp2 closed with error code code ended. */
static void kvli_h2_reset_text(const kvli_h2_t *c, const kvli_h2_st_t *st, char *out,
                               size_t cap)
{
    if (c->goaway && st->sid > c->goaway_last)
        snprintf(out, cap, "etcd at %s: %s: the server sent GOAWAY (%s%s%s) before taking "
                 "this stream; retry on a new connection", c->ep, st->path,
                 kvli_h2_code_name(c->goaway_code), c->goaway_debug[0] ? ", " : "",
                 c->goaway_debug);
    else
        snprintf(out, cap, "etcd at %s: %s: HTTP/2 stream reset by %s (%s)", c->ep, st->path,
                 st->reset_by_peer ? "the server" : "this client",
                 kvli_h2_code_name(st->close_code));
}

/* The end of a stream that closed cleanly: its status and message. */
static int kvli_h2_outcome(const kvli_h2_t *c, const kvli_h2_st_t *st, char *msg, size_t cap)
{
    if (st->in_len > 0) {
        snprintf(msg, cap, "etcd at %s: %s: the stream ended inside a gRPC message (%zu bytes "
                 "of it came)", c->ep, st->path, st->in_len);
        return -1;
    }
    if (st->has_status) {
        snprintf(msg, cap, "%s", st->gmsg);
        return st->gstatus;
    }
    snprintf(msg, cap, "the stream ended without a grpc-status (HTTP status %d%s%s)",
             st->http, st->ctype[0] ? ", content-type " : "", st->ctype);
    return -1;
}

static int kvli_h2_on_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud)
{
    kvli_h2_t *c = ud;
    kvli_h2_st_t *st = nghttp2_session_get_stream_user_data(s, sid);
    if (st == NULL)
        return 0;
    st->closed = true;
    st->close_code = code;
    if (st->unary)
        return 0; /* kvli_h2_unary reads it and frees it */
    if (!st->cancelled) {
        char text[600];
        int status;
        if (code != NGHTTP2_NO_ERROR) {
            kvli_h2_reset_text(c, st, text, sizeof(text));
            status = -1;
        } else {
            status = kvli_h2_outcome(c, st, text, sizeof(text));
        }
        if (!kvli_h2_queue(c, sid, true, status, text, NULL, 0))
            kvli_h2_break(c, "out of memory for a stream's end");
    }
    nghttp2_session_set_stream_user_data(s, sid, NULL);
    kvli_h2_unlink(c, st);
    kvli_h2_st_free(st);
    return 0;
}

static int kvli_h2_on_error(nghttp2_session *s, int code, const char *msg, size_t len, void *ud)
{
    (void)s;
    (void)code;
    kvli_h2_t *c = ud;
    snprintf(c->lib_err, sizeof(c->lib_err), "%.*s", (int)(len < 190 ? len : 190), msg);
    return 0;
}

/* What nghttp2 sends of a stream's body: st->out, then END_STREAM when
 * out_eof; nothing yet (and no END_STREAM): deferred until resumed. */
static ssize_t kvli_h2_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)s;
    (void)sid;
    (void)ud;
    kvli_h2_st_t *st = src->ptr;
    size_t left = st->out_len - st->out_off;
    if (left == 0 && !st->out_eof)
        return NGHTTP2_ERR_DEFERRED;
    size_t n = left < length ? left : length;
    if (n > 0)
        memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    if (st->out_off == st->out_len) {
        st->out_off = st->out_len = 0;
        if (st->out_eof)
            *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return (ssize_t)n;
}

/* ---- I/O ----------------------------------------------------------------- */

/* Frames nghttp2 has ready, to the socket as far as it takes them without
 * blocking: 0, or -1 (broken). */
static int kvli_h2_flush(kvli_h2_t *c)
{
    if (c->broken)
        return -1;
    for (;;) {
        while (c->out_len - c->out_off < KVLI_H2_OUT_HIGH) {
            const uint8_t *p = NULL;
            ssize_t n = nghttp2_session_mem_send(c->s, &p);
            if (n < 0) {
                kvli_h2_break(c, "HTTP/2: %s", nghttp2_strerror((int)n));
                return -1;
            }
            if (n == 0)
                break;
            kvli_h2_compact(c->out, &c->out_off, &c->out_len);
            if (kvli_h2_put(&c->out, &c->out_len, &c->out_cap, p, (size_t)n) != 0) {
                kvli_h2_break(c, "out of memory for %zd bytes to send", n);
                return -1;
            }
        }
        if (c->out_off == c->out_len)
            return c->broken ? -1 : 0;
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return 0;
            kvli_h2_break(c, "sending: %s (%s)", strerror(e), kvli_errno_name(e));
            return -1;
        }
        c->out_off += (size_t)w;
        if (c->out_off == c->out_len)
            c->out_off = c->out_len = 0;
    }
}

/* Received bytes to nghttp2; before the server's first frame header was
 * seen, check that it is a SETTINGS frame's (RFC 9113 3.4: the server's
 * preface). */
static void kvli_h2_feed(kvli_h2_t *c, const uint8_t *p, size_t n)
{
    if (!c->checked) {
        size_t take = sizeof(c->first) - c->first_len < n ? sizeof(c->first) - c->first_len : n;
        memcpy(c->first + c->first_len, p, take);
        c->first_len += take;
        if (c->first_len < 9)
            return;
        const uint8_t *h = c->first;
        uint32_t flen = (uint32_t)h[0] << 16 | (uint32_t)h[1] << 8 | h[2];
        uint32_t fsid = ((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 |
                         h[8]) & 0x7fffffffu;
        if (h[3] != NGHTTP2_SETTINGS || (h[4] & NGHTTP2_FLAG_ACK) || fsid != 0 ||
            flen % 6 != 0 || flen > 16384) {
            c->not_h2 = true;
            kvli_h2_break(c, "not HTTP/2");
            return;
        }
        c->checked = true;
        /* first holds the bytes before this call's that are not yet fed,
         * and the first `take` of these */
        size_t before = c->first_len - take;
        if (before > 0)
            kvli_h2_feed(c, c->first, before);
        if (c->broken)
            return;
    }
    ssize_t r = nghttp2_session_mem_recv(c->s, p, n);
    if (r < 0) {
        kvli_h2_break(c, "HTTP/2: %s%s%s", nghttp2_strerror((int)r), c->lib_err[0] ? ": " : "",
                      c->lib_err);
        return;
    }
    if (!nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s))
        kvli_h2_break(c, "the HTTP/2 session ended%s%s%s", c->goaway ? " (GOAWAY: " : "",
                      c->goaway ? kvli_h2_code_name(c->goaway_code) : "", c->goaway ? ")" : "");
}

/* Read what the socket holds now (up to budget bytes): 0, or -1 (broken:
 * EOF, an error, bytes that are not HTTP/2). */
static int kvli_h2_fill(kvli_h2_t *c, size_t budget)
{
    size_t got = 0;
    while (!c->broken && got < budget) {
        ssize_t r = recv(c->fd, c->rbuf, sizeof(c->rbuf), MSG_DONTWAIT);
        if (r < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return 0;
            kvli_h2_break(c, "receiving: %s (%s)", strerror(e), kvli_errno_name(e));
            return -1;
        }
        if (r == 0) {
            if (c->goaway)
                kvli_h2_break(c, "the server closed the connection after GOAWAY (%s%s%s)",
                              kvli_h2_code_name(c->goaway_code), c->goaway_debug[0] ? ", " : "",
                              c->goaway_debug);
            else
                kvli_h2_break(c, "the server closed the connection");
            return -1;
        }
        got += (size_t)r;
        kvli_h2_feed(c, c->rbuf, (size_t)r);
    }
    return c->broken ? -1 : 0;
}

typedef bool (*kvli_h2_cond_fn)(kvli_h2_t *c, const void *arg);

/* Do I/O until cond holds (0), the connection breaks (-1) or the deadline
 * passes (-2). */
static int kvli_h2_drive(kvli_h2_t *c, uint64_t deadline, kvli_h2_cond_fn cond, const void *arg)
{
    for (;;) {
        kvli_h2_flush(c);
        if (cond(c, arg))
            return 0;
        if (c->broken)
            return -1;
        uint64_t now = kvli_clock_ms();
        if (now >= deadline)
            return -2;
        uint64_t left = deadline - now;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (c->out_off < c->out_len)
            p.events |= POLLOUT;
        int r = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (r < 0 && errno != EINTR) {
            int e = errno;
            kvli_h2_break(c, "poll: %s (%s)", strerror(e), kvli_errno_name(e));
            continue;
        }
        if (r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)))
            kvli_h2_fill(c, KVLI_H2_PUMP_READ);
    }
}

/* ---- connection ---------------------------------------------------------- */

static bool kvli_h2_cond_settings(kvli_h2_t *c, const void *arg)
{
    (void)arg;
    return c->settings_seen;
}

int kvli_h2_open(kvli_h2_t **cp, const char *ep, uint64_t timeout_ms, char *why, size_t why_cap)
{
    uint64_t deadline = kvli_clock_ms() + timeout_ms;
    *cp = NULL;
    if (ep == NULL || strncmp(ep, "http://", 7) != 0) {
        if (ep != NULL && strncmp(ep, "https://", 8) == 0)
            kvli_h2_why(why, why_cap, "etcd at %s: https is not supported by the gRPC "
                        "transport yet (TLS is not this layer's)", ep);
        else
            kvli_h2_why(why, why_cap, "etcd endpoint \"%s\": not http://host:port",
                        ep ? ep : "(null)");
        return -1;
    }
    kvli_h2_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        kvli_h2_why(why, why_cap, "etcd at %s: out of memory", ep);
        return -1;
    }
    c->fd = -1;
    c->pump_max = KVLI_H2_MAX_DEFAULT;
    snprintf(c->ep, sizeof(c->ep), "%s", ep);
    size_t hl = strcspn(ep + 7, "/");
    if (hl == 0 || hl >= sizeof(c->authority)) {
        kvli_h2_why(why, why_cap, "etcd endpoint \"%s\": not http://host:port", ep);
        kvli_h2_close(c);
        return -1;
    }
    memcpy(c->authority, ep + 7, hl);
    c->authority[hl] = '\0';
    char host[256];
    uint16_t port = 0;
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char rw[200] = "";
    if (kvli_tcp_hostport_split(c->authority, host, sizeof(host), &port) != 0 || port == 0) {
        kvli_h2_why(why, why_cap, "etcd endpoint \"%s\": not http://host:port", ep);
        kvli_h2_close(c);
        return -1;
    }
    if (kvli_tcp_resolve(host, port, &ss, &sl, rw, sizeof(rw)) != 0) {
        kvli_h2_why(why, why_cap, "etcd at %s: cannot resolve %s: %s", ep, host, rw);
        kvli_h2_close(c);
        return -1;
    }
    int e = 0;
    c->fd = kvli_tcp_connect((struct sockaddr *)&ss, sl, timeout_ms, &e);
    if (c->fd < 0) {
        if (e == ETIMEDOUT)
            kvli_h2_why(why, why_cap, "etcd at %s: no connection within %llu ms (ETIMEDOUT)",
                        ep, (unsigned long long)timeout_ms);
        else
            kvli_h2_why(why, why_cap, "etcd at %s: cannot connect: %s (%s)", ep, strerror(e),
                        kvli_errno_name(e));
        kvli_h2_close(c);
        return -1;
    }
    int one = 1;
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    nghttp2_session_callbacks *cb = NULL;
    nghttp2_settings_entry set[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, KVLI_H2_WINDOW},
    };
    int rv = nghttp2_session_callbacks_new(&cb);
    if (rv == 0) {
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, kvli_h2_on_data);
        nghttp2_session_callbacks_set_on_header_callback(cb, kvli_h2_on_header);
        nghttp2_session_callbacks_set_on_frame_recv_callback(cb, kvli_h2_on_frame_recv);
        nghttp2_session_callbacks_set_on_frame_send_callback(cb, kvli_h2_on_frame_send);
        nghttp2_session_callbacks_set_on_stream_close_callback(cb, kvli_h2_on_close);
        nghttp2_session_callbacks_set_error_callback2(cb, kvli_h2_on_error);
        rv = nghttp2_session_client_new(&c->s, cb, c);
        nghttp2_session_callbacks_del(cb);
    }
    if (rv == 0)
        rv = nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, set, sizeof(set) / sizeof(set[0]));
    if (rv == 0) /* the connection's window (its SETTINGS value covers streams only) */
        rv = nghttp2_session_set_local_window_size(c->s, NGHTTP2_FLAG_NONE, 0, KVLI_H2_WINDOW);
    if (rv != 0) {
        kvli_h2_why(why, why_cap, "etcd at %s: HTTP/2 session: %s", ep, nghttp2_strerror(rv));
        kvli_h2_close(c);
        return -1;
    }
    int dr = kvli_h2_drive(c, deadline, kvli_h2_cond_settings, NULL);
    if (dr == 0) {
        *cp = c;
        return 0;
    }
    int ret = -1;
    if (c->not_h2) {
        char q[200];
        kvli_h2_quote(c->first, c->first_len, q, sizeof(q));
        kvli_h2_why(why, why_cap, "etcd at %s answered, but not in HTTP/2 (an HTTP/1.1 server, "
                    "or a proxy serving only the JSON gateway?): it sent \"%s\"", ep, q);
        ret = -2;
    } else if (dr == -1 && c->first_len == 0 && strstr(c->fail, "closed the connection")) {
        /* not -2: a member going down, or a balancer with no backend up,
         * closes too; that must not keep the endpoint off gRPC for good */
        kvli_h2_why(why, why_cap, "etcd at %s: the server closed the connection without "
                    "answering the HTTP/2 preface", ep);
        ret = -3;
    } else if (dr == -1) {
        kvli_h2_why(why, why_cap, "%s", c->fail);
    } else if (c->first_len > 0 && !c->checked) {
        char q[200];
        kvli_h2_quote(c->first, c->first_len, q, sizeof(q));
        kvli_h2_why(why, why_cap, "etcd at %s answered, but not in HTTP/2: it sent only \"%s\" "
                    "within %llu ms", ep, q, (unsigned long long)timeout_ms);
        ret = -2;
    } else {
        kvli_h2_why(why, why_cap, "etcd at %s: connected, but no HTTP/2 SETTINGS came within "
                    "%llu ms (ETIMEDOUT: a server that does not answer; is this etcd's client "
                    "port?)", ep,
                    (unsigned long long)timeout_ms);
    }
    kvli_h2_close(c);
    return ret;
}

void kvli_h2_close(kvli_h2_t *c)
{
    if (c == NULL)
        return;
    if (c->s != NULL) {
        if (!c->broken && c->fd >= 0) {
            /* a polite GOAWAY, if the socket takes it now; no waiting */
            nghttp2_session_terminate_session(c->s, NGHTTP2_NO_ERROR);
            kvli_h2_flush(c);
        }
        nghttp2_session_del(c->s);
    }
    if (c->fd >= 0)
        close(c->fd);
    while (c->streams != NULL) {
        kvli_h2_st_t *st = c->streams;
        c->streams = st->next;
        kvli_h2_st_free(st);
    }
    while (c->ev_head != NULL) {
        kvli_h2_ev_t *ev = c->ev_head;
        c->ev_head = ev->next;
        free(ev->msg);
        free(ev);
    }
    free(c->out);
    free(c);
}

const char *kvli_h2_ep(const kvli_h2_t *c)
{
    return c ? c->ep : "";
}

bool kvli_h2_usable(const kvli_h2_t *c)
{
    return c != NULL && !c->broken && !c->goaway && nghttp2_session_want_read(c->s);
}

int kvli_h2_fd(const kvli_h2_t *c)
{
    return c ? c->fd : -1;
}

bool kvli_h2_want_write(const kvli_h2_t *c)
{
    return c != NULL && !c->broken && c->out_off < c->out_len;
}

bool kvli_h2_pending(const kvli_h2_t *c)
{
    if (c == NULL)
        return false;
    if (c->ev_head != NULL)
        return true;
    if (!c->broken)
        return false;
    for (const kvli_h2_st_t *st = c->streams; st != NULL; st = st->next)
        if (!st->unary && !st->cancelled)
            return true; /* its end (-1) is still to be told */
    return false;
}

void kvli_h2_reply_free(kvli_h2_reply_t *r)
{
    if (r == NULL)
        return;
    free(r->msg);
    r->msg = NULL;
    r->len = 0;
}

/* ---- calls --------------------------------------------------------------- */

/* Can c take a new stream? false with why. */
static bool kvli_h2_can_start(kvli_h2_t *c, const char *path, char *why, size_t why_cap)
{
    if (c == NULL) {
        kvli_h2_why(why, why_cap, "no HTTP/2 connection");
        return false;
    }
    if (c->broken) {
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return false;
    }
    if (c->goaway) {
        kvli_h2_why(why, why_cap, "etcd at %s sent GOAWAY (%s%s%s): this connection takes no "
                    "new calls; open a new one", c->ep, kvli_h2_code_name(c->goaway_code),
                    c->goaway_debug[0] ? ", " : "", c->goaway_debug);
        return false;
    }
    if (path == NULL || path[0] != '/' || strlen(path) >= sizeof(((kvli_h2_st_t *)0)->path)) {
        kvli_h2_why(why, why_cap, "etcd at %s: bad gRPC method path \"%s\"", c->ep,
                    path ? path : "(null)");
        return false;
    }
    return true;
}

static void kvli_h2_nv(nghttp2_nv *nv, const char *name, const char *value)
{
    /* nghttp2 copies names and values (no NO_COPY flags) and never writes them */
    nv->name = (uint8_t *)(uintptr_t)name;
    nv->namelen = strlen(name);
    nv->value = (uint8_t *)(uintptr_t)value;
    nv->valuelen = strlen(value);
    nv->flags = NGHTTP2_NV_FLAG_NONE;
}

/* Submit a request on a new stream whose body is st->out (st->out_eof:
 * half-closed after it): the stream id, or -1 (why). st joins c's list. */
static int32_t kvli_h2_submit(kvli_h2_t *c, kvli_h2_st_t *st, const char *token,
                              uint64_t timeout_ms, char *why, size_t why_cap)
{
    char tmo[32];
    nghttp2_nv nv[9];
    size_t n = 0;
    kvli_h2_grpc_timeout(timeout_ms, tmo, sizeof(tmo));
    kvli_h2_nv(&nv[n++], ":method", "POST");
    kvli_h2_nv(&nv[n++], ":scheme", "http");
    kvli_h2_nv(&nv[n++], ":path", st->path);
    kvli_h2_nv(&nv[n++], ":authority", c->authority);
    kvli_h2_nv(&nv[n++], "content-type", "application/grpc");
    kvli_h2_nv(&nv[n++], "te", "trailers");
    kvli_h2_nv(&nv[n++], "user-agent", "kvlane-grpc");
    if (st->unary)
        kvli_h2_nv(&nv[n++], "grpc-timeout", tmo);
    if (token != NULL && token[0] != '\0')
        kvli_h2_nv(&nv[n++], "token", token);
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = kvli_h2_body};
    int32_t sid = nghttp2_submit_request(c->s, NULL, nv, n, &prd, st);
    if (sid < 0) {
        if (sid == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE)
            kvli_h2_break(c, "no stream ids left on this connection: open a new one");
        kvli_h2_why(why, why_cap, "etcd at %s: %s: cannot start an HTTP/2 stream: %s", c->ep,
                    st->path, nghttp2_strerror(sid));
        return -1;
    }
    st->sid = sid;
    st->next = c->streams;
    c->streams = st;
    return sid;
}

static kvli_h2_st_t *kvli_h2_st_new(const char *path, bool unary, size_t max)
{
    kvli_h2_st_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NULL;
    snprintf(st->path, sizeof(st->path), "%s", path);
    st->unary = unary;
    st->max = max;
    return st;
}

/* One message with its prefix at the end of st->out: 0, or -1 out of memory. */
static int kvli_h2_frame(kvli_h2_st_t *st, const uint8_t *msg, size_t len)
{
    uint8_t pre[KVLI_H2_PREFIX] = {0, (uint8_t)(len >> 24), (uint8_t)(len >> 16),
                                   (uint8_t)(len >> 8), (uint8_t)len};
    kvli_h2_compact(st->out, &st->out_off, &st->out_len);
    if (kvli_h2_put(&st->out, &st->out_len, &st->out_cap, pre, sizeof(pre)) != 0 ||
        kvli_h2_put(&st->out, &st->out_len, &st->out_cap, msg, len) != 0)
        return -1;
    return 0;
}

static bool kvli_h2_cond_done(kvli_h2_t *c, const void *arg)
{
    (void)c;
    const kvli_h2_st_t *st = arg;
    return st->closed || st->failed;
}

int kvli_h2_unary(kvli_h2_t *c, const char *path, const char *token, const uint8_t *msg,
                  size_t len, size_t max, uint64_t timeout_ms, kvli_h2_reply_t *r,
                  char *why, size_t why_cap)
{
    uint64_t deadline = kvli_clock_ms() + timeout_ms;
    memset(r, 0, sizeof(*r));
    r->status = -1;
    if (!kvli_h2_can_start(c, path, why, why_cap))
        return -1;
    if (len > UINT32_MAX) {
        kvli_h2_why(why, why_cap, "etcd at %s: %s: a request of %zu bytes (gRPC's bound is "
                    "4 GiB)", c->ep, path, len);
        return -1;
    }
    kvli_h2_st_t *st = kvli_h2_st_new(path, true, max);
    if (st == NULL || kvli_h2_frame(st, msg, len) != 0) {
        kvli_h2_st_free(st);
        kvli_h2_why(why, why_cap, "etcd at %s: %s: out of memory", c->ep, path);
        return -1;
    }
    st->out_eof = true;
    if (kvli_h2_submit(c, st, token, timeout_ms, why, why_cap) < 0) {
        kvli_h2_st_free(st);
        return -1;
    }
    int dr = kvli_h2_drive(c, deadline, kvli_h2_cond_done, st);
    if (dr == -2) {
        kvli_h2_break(c, "%s: no answer within %llu ms (ETIMEDOUT)", path,
                      (unsigned long long)timeout_ms);
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return -1; /* st stays in c's list: nghttp2 still knows it */
    }
    if (dr == -1) {
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return -1;
    }
    if (st->failed) {
        kvli_h2_why(why, why_cap, "%s", st->fail);
        /* the stream's reason is "etcd at <ep>: <rest>"; break adds the prefix again */
        const char *rest = strstr(st->fail, ": ");
        kvli_h2_break(c, "%s", rest != NULL ? rest + 2 : st->fail);
        return -1;
    }
    if (st->close_code != NGHTTP2_NO_ERROR) {
        kvli_h2_reset_text(c, st, why, why_cap);
        kvli_h2_break(c, "%s: the stream was reset (%s)", path,
                      kvli_h2_code_name(st->close_code));
        nghttp2_session_set_stream_user_data(c->s, st->sid, NULL);
        kvli_h2_unlink(c, st);
        kvli_h2_st_free(st);
        return -1;
    }
    r->http = st->http;
    r->status = kvli_h2_outcome(c, st, r->message, sizeof(r->message));
    if (st->in_len > 0) { /* a truncated message: a transport failure */
        kvli_h2_why(why, why_cap, "%s", r->message);
        kvli_h2_break(c, "%s: the stream ended inside a message", path);
        r->status = -1;
        r->message[0] = '\0';
    } else {
        r->msg = st->msg;
        r->len = st->msg_len;
        st->msg = NULL;
    }
    bool ok = st->in_len == 0;
    nghttp2_session_set_stream_user_data(c->s, st->sid, NULL);
    kvli_h2_unlink(c, st);
    kvli_h2_st_free(st);
    return ok ? 0 : -1;
}

typedef struct {
    int32_t sid;
    bool headers; /* wait for the HEADERS frame only, else for the body taken */
} kvli_h2_sent_arg_t;

/* The stream's HEADERS (or its whole queued body) went to the socket, or
 * the stream is gone. */
static bool kvli_h2_cond_sent(kvli_h2_t *c, const void *arg)
{
    const kvli_h2_sent_arg_t *a = arg;
    kvli_h2_st_t *st = kvli_h2_find(c, a->sid);
    if (st == NULL || st->cancelled || st->failed)
        return true;
    bool taken = a->headers ? st->headers_sent : st->out_len == st->out_off;
    return taken && c->out_off == c->out_len;
}

int kvli_h2_stream_open(kvli_h2_t *c, const char *path, const char *token, int32_t *sid,
                        uint64_t timeout_ms, char *why, size_t why_cap)
{
    uint64_t deadline = kvli_clock_ms() + timeout_ms;
    *sid = -1;
    if (!kvli_h2_can_start(c, path, why, why_cap))
        return -1;
    kvli_h2_st_t *st = kvli_h2_st_new(path, false, 0);
    if (st == NULL) {
        kvli_h2_why(why, why_cap, "etcd at %s: %s: out of memory", c->ep, path);
        return -1;
    }
    int32_t id = kvli_h2_submit(c, st, token, timeout_ms, why, why_cap);
    if (id < 0) {
        kvli_h2_st_free(st);
        return -1;
    }
    kvli_h2_sent_arg_t a = {id, true};
    int dr = kvli_h2_drive(c, deadline, kvli_h2_cond_sent, &a);
    if (dr == -2)
        kvli_h2_break(c, "%s: the stream's HEADERS could not be sent within %llu ms", path,
                      (unsigned long long)timeout_ms);
    if (dr != 0) {
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return -1;
    }
    *sid = id; /* if it already ended, its end event is queued */
    return 0;
}

int kvli_h2_stream_send(kvli_h2_t *c, int32_t sid, const uint8_t *msg, size_t len,
                        uint64_t timeout_ms, char *why, size_t why_cap)
{
    uint64_t deadline = kvli_clock_ms() + timeout_ms;
    if (c == NULL || c->broken) {
        kvli_h2_why(why, why_cap, "%s", c ? c->fail : "no HTTP/2 connection");
        return -1;
    }
    kvli_h2_st_t *st = kvli_h2_find(c, sid);
    if (st == NULL || st->unary || st->cancelled || st->failed || st->closed) {
        kvli_h2_why(why, why_cap, "etcd at %s: stream %d is not open (it ended)", c->ep,
                    (int)sid);
        return -1;
    }
    if (len > UINT32_MAX || kvli_h2_frame(st, msg, len) != 0) {
        kvli_h2_why(why, why_cap, "etcd at %s: %s: cannot queue a message of %zu bytes", c->ep,
                    st->path, len);
        return -1;
    }
    int rv = nghttp2_session_resume_data(c->s, sid);
    if (rv != 0 && rv != NGHTTP2_ERR_INVALID_ARGUMENT) { /* INVALID_ARGUMENT: not deferred */
        kvli_h2_why(why, why_cap, "etcd at %s: %s: %s", c->ep, st->path, nghttp2_strerror(rv));
        return -1;
    }
    kvli_h2_sent_arg_t a = {sid, false};
    int dr = kvli_h2_drive(c, deadline, kvli_h2_cond_sent, &a);
    if (dr == -2)
        kvli_h2_break(c, "%s: a message of %zu bytes could not be sent within %llu ms (the "
                      "server does not read?)", kvli_h2_find(c, sid) ? st->path : "stream",
                      len, (unsigned long long)timeout_ms);
    if (dr != 0) {
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return -1;
    }
    st = kvli_h2_find(c, sid);
    if (st == NULL || st->failed || st->cancelled) {
        kvli_h2_why(why, why_cap, "etcd at %s: stream %d ended while sending", c->ep, (int)sid);
        return -1;
    }
    return 0;
}

int kvli_h2_stream_cancel(kvli_h2_t *c, int32_t sid, uint64_t timeout_ms, char *why,
                          size_t why_cap)
{
    uint64_t deadline = kvli_clock_ms() + timeout_ms;
    if (c == NULL || c->broken) {
        kvli_h2_why(why, why_cap, "%s", c ? c->fail : "no HTTP/2 connection");
        return -1;
    }
    kvli_h2_unqueue(c, sid);
    kvli_h2_st_t *st = kvli_h2_find(c, sid);
    if (st == NULL || st->unary)
        return 0; /* already ended (its end event dropped above) */
    st->cancelled = true;
    nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
    kvli_h2_sent_arg_t a = {sid, true};
    if (kvli_h2_drive(c, deadline, kvli_h2_cond_sent, &a) != 0) {
        if (!c->broken)
            kvli_h2_break(c, "cancelling stream %d did not finish within %llu ms", (int)sid,
                          (unsigned long long)timeout_ms);
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return -1;
    }
    return 0;
}

int kvli_h2_pump(kvli_h2_t *c, size_t max, kvli_h2_msg_fn fn, kvli_h2_end_fn end, void *arg,
                 char *why, size_t why_cap)
{
    if (c == NULL) {
        kvli_h2_why(why, why_cap, "no HTTP/2 connection");
        return -1;
    }
    c->pump_max = max;
    if (!c->broken) {
        kvli_h2_flush(c);
        kvli_h2_fill(c, KVLI_H2_PUMP_READ);
        kvli_h2_flush(c); /* WINDOW_UPDATEs, SETTINGS and PING acks */
    }
    while (c->ev_head != NULL) {
        kvli_h2_ev_t *ev = c->ev_head;
        c->ev_head = ev->next;
        if (c->ev_head == NULL)
            c->ev_tail = NULL;
        if (ev->end) {
            if (end)
                end(arg, ev->sid, ev->status, ev->text);
        } else if (ev->len > max) {
            /* queued under a larger bound than this pump's: the stream ends here */
            char text[600];
            kvli_h2_st_t *st = kvli_h2_find(c, ev->sid);
            snprintf(text, sizeof(text), "etcd at %s: a gRPC message of %zu bytes, above the "
                     "%zu allowed", c->ep, ev->len, max);
            if (st != NULL && !st->cancelled) {
                st->cancelled = true;
                nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, ev->sid, NGHTTP2_CANCEL);
                kvli_h2_unqueue(c, ev->sid);
                if (end)
                    end(arg, ev->sid, -1, text);
            }
        } else if (fn) {
            /* handed out even when the stream's end is queued behind it (the
             * server ended it, and the connection broke before our RST_STREAM
             * went and nghttp2 let it go): a stream we cancel has its events
             * dropped there, and nothing is queued for it after */
            fn(arg, ev->sid, ev->msg, ev->len);
        }
        free(ev->msg);
        free(ev);
    }
    if (c->broken) {
        /* every stream still open ends with the connection */
        kvli_h2_st_t *st = c->streams;
        while (st != NULL) {
            kvli_h2_st_t *next = st->next;
            if (!st->unary && !st->cancelled) {
                st->cancelled = true;
                if (end)
                    end(arg, st->sid, -1, c->fail);
            }
            st = next;
        }
        kvli_h2_why(why, why_cap, "%s", c->fail);
        return -1;
    }
    kvli_h2_flush(c);
    return 0;
}
