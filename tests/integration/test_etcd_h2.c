/*
 * The gRPC transport over cleartext HTTP/2 (src/store/etcd_h2.c) against a
 * real etcd (temporary data dir, free ports), with protobuf messages
 * encoded by hand: unary LeaseGrant, Put then Range, 1000 calls on one
 * connection, etcd errors as grpc-status/grpc-message, LeaseKeepAlive as a
 * unary call, a Watch stream (created, an event, then 24 MiB of events: more
 * than the 16 MiB window, so flow control must move on; each event's
 * message spans many DATA frames); failures: nothing listening, an HTTP/1.1
 * server, a server that never answers, https refused, and etcd killed
 * mid-connection and stopped (calls fail, the watch ends, usable() turns
 * false); and against a scripted HTTP/2 server (nghttp2 server side): two
 * messages in a DATA frame, a prefix split over frames, a stream ended by
 * the server, a compressed message, two answers to a unary call,
 * RST_STREAM(REFUSED_STREAM), GOAWAY, a trailers-only percent-encoded error.
 * KVL_TEST_LABELS: etcd
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/kvltest.h"

#ifndef KVL_HAVE_ETCD
int main(void)
{
    KT_SKIP("built without the etcd store");
}
#else

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <nghttp2/nghttp2.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kt_etcd.h"
#include "store/etcd_h2.h"

#define TMO 10000u
#define MAXMSG ((size_t)64 << 20)

static kt_etcd_t etcd;

/* ---- a few protobuf reads and writes ------------------------------------ */

static int pb_varint(const uint8_t *p, size_t n, size_t *off, uint64_t *v)
{
    *v = 0;
    for (unsigned s = 0; s < 64 && *off < n; s += 7) {
        uint8_t b = p[(*off)++];
        *v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

/* The k-th (0-based) occurrence of field f: 1 varint (*v) or 2 bytes (*b,
 * *bl); 0 absent; -1 malformed. */
static int pb_get(const uint8_t *p, size_t n, unsigned f, int k, uint64_t *v,
                  const uint8_t **b, size_t *bl)
{
    size_t off = 0;
    while (off < n) {
        uint64_t tag, x;
        if (pb_varint(p, n, &off, &tag) != 0)
            return -1;
        unsigned wt = (unsigned)(tag & 7), fn = (unsigned)(tag >> 3);
        const uint8_t *start = NULL;
        if (wt == 0) {
            if (pb_varint(p, n, &off, &x) != 0)
                return -1;
        } else if (wt == 2) {
            if (pb_varint(p, n, &off, &x) != 0 || x > n - off)
                return -1;
            start = p + off;
            off += (size_t)x;
        } else if (wt == 1 || wt == 5) {
            x = 0;
            off += wt == 1 ? 8 : 4;
            if (off > n)
                return -1;
        } else {
            return -1;
        }
        if (fn == f && k-- == 0) {
            if (wt == 0) {
                *v = x;
                return 1;
            }
            if (wt == 2) {
                *b = start;
                *bl = (size_t)x;
                return 2;
            }
            return -1;
        }
    }
    return 0;
}

static uint64_t pb_u(const uint8_t *p, size_t n, unsigned f)
{
    uint64_t v = 0;
    const uint8_t *b;
    size_t bl;
    return pb_get(p, n, f, 0, &v, &b, &bl) == 1 ? v : 0;
}

static int pb_count(const uint8_t *p, size_t n, unsigned f)
{
    int k = 0;
    uint64_t v;
    const uint8_t *b;
    size_t bl;
    while (pb_get(p, n, f, k, &v, &b, &bl) > 0)
        k++;
    return k;
}

static size_t pb_put_varint(uint8_t *o, uint64_t v)
{
    size_t n = 0;
    do {
        o[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            o[n] |= 0x80;
        n++;
    } while (v);
    return n;
}

/* field f (bytes) = s[0..len) */
static size_t pb_put_bytes(uint8_t *o, unsigned f, const void *s, size_t len)
{
    size_t n = pb_put_varint(o, (uint64_t)f << 3 | 2);
    n += pb_put_varint(o + n, len);
    memcpy(o + n, s, len);
    return n + len;
}

/* ---- calls --------------------------------------------------------------- */

static kvli_h2_t *conn(void)
{
    kvli_h2_t *c = NULL;
    char why[512];
    int rc = kvli_h2_open(&c, etcd.url, TMO, why, sizeof(why));
    if (rc != 0)
        fprintf(stderr, "kvli_h2_open(%s): %d: %s\n", etcd.url, rc, why);
    KT_CHECK(rc == 0 && c != NULL && kvli_h2_usable(c));
    KT_CHECK(strcmp(kvli_h2_ep(c), etcd.url) == 0);
    return c;
}

/* A unary call that must complete; its reply in *r. */
static void call(kvli_h2_t *c, const char *path, const uint8_t *m, size_t n, kvli_h2_reply_t *r)
{
    char why[512];
    int rc = kvli_h2_unary(c, path, NULL, m, n, MAXMSG, TMO, r, why, sizeof(why));
    if (rc != 0)
        fprintf(stderr, "%s: %s\n", path, why);
    KT_CHECK(rc == 0);
}

static void put(kvli_h2_t *c, const char *key, const void *val, size_t vlen)
{
    size_t cap = strlen(key) + vlen + 32, n;
    uint8_t *m = malloc(cap);
    KT_CHECK(m != NULL);
    n = pb_put_bytes(m, 1, key, strlen(key));
    n += pb_put_bytes(m + n, 2, val, vlen);
    kvli_h2_reply_t r;
    call(c, "/etcdserverpb.KV/Put", m, n, &r);
    if (r.status != 0)
        fprintf(stderr, "Put %s: %d %s\n", key, r.status, r.message);
    KT_CHECK(r.status == 0 && r.http == 200 && r.msg != NULL);
    kvli_h2_reply_free(&r);
    free(m);
}

/* Range key: the first kv's value into out (NUL-terminated). */
static void range1(kvli_h2_t *c, const char *key, char *out, size_t cap)
{
    uint8_t m[128];
    size_t n = pb_put_bytes(m, 1, key, strlen(key));
    kvli_h2_reply_t r;
    const uint8_t *kv, *val;
    size_t kvl, vl;
    uint64_t v;
    call(c, "/etcdserverpb.KV/Range", m, n, &r);
    KT_CHECK(r.status == 0 && r.msg != NULL);
    KT_CHECK(pb_get(r.msg, r.len, 2, 0, &v, &kv, &kvl) == 2);   /* kvs[0] */
    KT_CHECK(pb_get(kv, kvl, 5, 0, &v, &val, &vl) == 2);        /* .value */
    KT_CHECK(vl < cap);
    memcpy(out, val, vl);
    out[vl] = '\0';
    kvli_h2_reply_free(&r);
}

static void unary_basics(kvli_h2_t *c, uint64_t *lease)
{
    kvli_h2_reply_t r;
    const uint8_t grant[] = {0x08, 0x05}; /* LeaseGrantRequest{TTL: 5} */
    call(c, "/etcdserverpb.Lease/LeaseGrant", grant, sizeof(grant), &r);
    KT_CHECK(r.status == 0 && r.http == 200 && r.msg != NULL && r.len > 0);
    *lease = pb_u(r.msg, r.len, 2);
    KT_CHECK(*lease != 0);
    KT_CHECK(pb_u(r.msg, r.len, 3) == 5);
    kvli_h2_reply_free(&r);
    KT_CHECK(r.msg == NULL);

    const uint8_t pv[] = {0x0a, 0x01, 'k', 0x12, 0x01, 'v'};
    call(c, "/etcdserverpb.KV/Put", pv, sizeof(pv), &r);
    KT_CHECK(r.status == 0 && r.msg != NULL);
    kvli_h2_reply_free(&r);
    char val[64];
    range1(c, "k", val, sizeof(val));
    KT_CHECK(strcmp(val, "v") == 0);
    printf("unary: LeaseGrant (lease %llx), Put, Range answered\n", (unsigned long long)*lease);
}

static void many_calls(kvli_h2_t *c)
{
    char val[64], want[64];
    for (int i = 0; i < 1000; i++) {
        snprintf(want, sizeof(want), "v%d", i);
        if (i % 10 == 0)
            put(c, "many", want, strlen(want));
        range1(c, "many", val, sizeof(val));
        snprintf(want, sizeof(want), "v%d", i - i % 10);
        KT_CHECK(strcmp(val, want) == 0);
    }
    KT_CHECK(kvli_h2_usable(c));
    printf("1000 calls on one connection\n");
}

static void etcd_errors(kvli_h2_t *c)
{
    kvli_h2_reply_t r;
    uint8_t m[16];
    m[0] = 0x08;
    size_t n = 1 + pb_put_varint(m + 1, 0x7eadbeef1234ull);
    call(c, "/etcdserverpb.Lease/LeaseRevoke", m, n, &r);
    printf("LeaseRevoke of an unknown lease: %d \"%s\"\n", r.status, r.message);
    KT_CHECK(r.status == 5 && strcmp(r.message, "etcdserver: requested lease not found") == 0);
    KT_CHECK(r.msg == NULL);
    kvli_h2_reply_free(&r);

    call(c, "/etcdserverpb.KV/Range", NULL, 0, &r); /* RangeRequest{} : no key */
    printf("Range without a key: %d \"%s\"\n", r.status, r.message);
    KT_CHECK(r.status == 3 && strcmp(r.message, "etcdserver: key is not provided") == 0);
    kvli_h2_reply_free(&r);

    call(c, "/etcdserverpb.KV/NoSuchMethod", NULL, 0, &r);
    printf("an unknown method: %d \"%s\"\n", r.status, r.message);
    KT_CHECK(r.status == 12); /* UNIMPLEMENTED */
    kvli_h2_reply_free(&r);
    KT_CHECK(kvli_h2_usable(c));

    /* a response above max: refused, the connection given up */
    kvli_h2_t *d = conn();
    char why[512];
    const uint8_t rk[] = {0x0a, 0x01, 'k'};
    KT_CHECK(kvli_h2_unary(d, "/etcdserverpb.KV/Range", NULL, rk, sizeof(rk), 4, TMO, &r, why,
                           sizeof(why)) == -1);
    printf("an answer above max: %s\n", why);
    KT_CHECK(strstr(why, "above the 4 allowed") != NULL && !kvli_h2_usable(d));
    KT_CHECK(r.msg == NULL);
    kvli_h2_close(d);
}

static void keepalive(kvli_h2_t *c, uint64_t lease)
{
    uint8_t m[16];
    m[0] = 0x08;
    size_t n = 1 + pb_put_varint(m + 1, lease);
    kvli_h2_reply_t r;
    call(c, "/etcdserverpb.Lease/LeaseKeepAlive", m, n, &r);
    KT_CHECK(r.status == 0 && r.msg != NULL);
    KT_CHECK(pb_u(r.msg, r.len, 2) == lease);
    uint64_t ttl = pb_u(r.msg, r.len, 3);
    printf("LeaseKeepAlive as a unary call: TTL %llu\n", (unsigned long long)ttl);
    KT_CHECK(ttl > 0);
    kvli_h2_reply_free(&r);
}

/* ---- watch --------------------------------------------------------------- */

typedef struct {
    int32_t sid;
    int created, events, msgs, ends, end_status, others;
    size_t bytes, biggest;
    char end_msg[600];
} watch_t;

static void on_msg(void *arg, int32_t sid, const uint8_t *m, size_t n)
{
    watch_t *w = arg;
    if (sid != w->sid) {
        w->others++;
        return;
    }
    w->msgs++;
    w->bytes += n;
    if (n > w->biggest)
        w->biggest = n;
    if (pb_u(m, n, 3) == 1)
        w->created++;
    w->events += pb_count(m, n, 11);
}

static void on_end(void *arg, int32_t sid, int status, const char *message)
{
    watch_t *w = arg;
    if (sid != w->sid) {
        w->others++;
        return;
    }
    w->ends++;
    w->end_status = status;
    snprintf(w->end_msg, sizeof(w->end_msg), "%s", message);
}

/* Pump c until *count >= want or the connection ends (bounded: 20 s):
 * the pump's result. */
static int pump_until(kvli_h2_t *c, watch_t *w, const int *count, int want)
{
    char why[512];
    uint64_t end = kt_now_ms() + 20000;
    while (*count < want && kt_now_ms() < end) {
        struct pollfd p = {.fd = kvli_h2_fd(c), .events = POLLIN};
        if (kvli_h2_want_write(c))
            p.events |= POLLOUT;
        if (poll(&p, 1, kvli_h2_pending(c) ? 0 : 200) < 0 && errno != EINTR)
            KT_CHECK(!"poll");
        if (kvli_h2_pump(c, MAXMSG, on_msg, on_end, w, why, sizeof(why)) != 0) {
            printf("pump: %s\n", why);
            return -1;
        }
    }
    return 0;
}

static void watch_create(kvli_h2_t *c, watch_t *w, const char *key)
{
    char why[512];
    uint8_t inner[64], m[80];
    memset(w, 0, sizeof(*w));
    KT_CHECK(kvli_h2_stream_open(c, "/etcdserverpb.Watch/Watch", NULL, &w->sid, TMO, why,
                                 sizeof(why)) == 0);
    KT_CHECK(w->sid > 0);
    size_t in = pb_put_bytes(inner, 1, key, strlen(key));  /* WatchCreateRequest{key} */
    size_t n = pb_put_bytes(m, 1, inner, in);               /* WatchRequest{create_request} */
    KT_CHECK(kvli_h2_stream_send(c, w->sid, m, n, TMO, why, sizeof(why)) == 0);
    KT_CHECK(pump_until(c, w, &w->created, 1) == 0);
    KT_CHECK(w->created == 1 && w->ends == 0);
}

static void watch(kvli_h2_t *c1, kvli_h2_t **wc, watch_t *w)
{
    *wc = conn();
    watch_create(*wc, w, "w");
    put(c1, "w", "1", 1);
    KT_CHECK(pump_until(*wc, w, &w->events, 1) == 0);
    KT_CHECK(w->events == 1 && w->ends == 0 && w->others == 0);
    printf("watch: created, one event\n");
    /* a call on the watcher's own connection: the event may be read while
     * it waits, and then waits in the queue (pending) */
    put(*wc, "w", "2", 1);
    KT_CHECK(pump_until(*wc, w, &w->events, 2) == 0);
    KT_CHECK(w->events == 2 && w->ends == 0);

    /* 24 values of 1 MiB: 24 MiB to the watcher, past its 16 MiB window;
     * each event message spans many 16 KiB DATA frames */
    size_t big = (size_t)1 << 20;
    char *v = malloc(big);
    KT_CHECK(v != NULL);
    for (int i = 0; i < 24; i++) {
        memset(v, 'a' + i, big);
        put(c1, "w", v, big);
        char why[512];
        /* keep the watcher's connection read now and then, not always */
        if (i % 8 == 7)
            KT_CHECK(kvli_h2_pump(*wc, MAXMSG, on_msg, on_end, w, why, sizeof(why)) == 0);
    }
    free(v);
    KT_CHECK(pump_until(*wc, w, &w->events, 26) == 0);
    printf("watch: %d events in %d messages, %zu bytes (biggest message %zu)\n", w->events,
           w->msgs, w->bytes, w->biggest);
    KT_CHECK(w->events == 26 && w->ends == 0 && w->bytes > 24 * big);
    KT_CHECK(kvli_h2_usable(*wc));
}

/* ---- servers that are not etcd ------------------------------------------- */

static int listener(unsigned *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    KT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
             listen(fd, 4) == 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

/* Accept one connection, read what comes within 1 s, answer as an HTTP/1.1
 * server does to bytes it cannot parse, and close (after the client did:
 * no reset that could drop the answer). */
static void *http1_server(void *arg)
{
    int lfd = *(int *)arg;
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, 20000) != 1)
        return NULL;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char buf[4096];
    p.fd = fd;
    if (poll(&p, 1, 1000) == 1 && recv(fd, buf, sizeof(buf), 0) < 0)
        perror("recv");
    const char *ans = "HTTP/1.1 400 Bad Request\r\n\r\n";
    if (send(fd, ans, strlen(ans), MSG_NOSIGNAL) < 0)
        perror("send");
    shutdown(fd, SHUT_WR);
    while (poll(&p, 1, 5000) == 1 && recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    close(fd);
    return NULL;
}

/* Accept one connection, read the client's preface (so that the close is
 * a FIN, not a reset) and close it without a byte. */
static void *closing_server(void *arg)
{
    int lfd = *(int *)arg;
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, 20000) != 1)
        return NULL;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char buf[4096];
    p.fd = fd;
    if (poll(&p, 1, 5000) == 1 && recv(fd, buf, sizeof(buf), 0) < 0)
        perror("recv");
    close(fd);
    return NULL;
}

static void not_etcd(void)
{
    kvli_h2_t *c = NULL;
    char why[512], ep[64];
    unsigned port = kt_free_port();

    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", port);
    KT_CHECK(kvli_h2_open(&c, ep, 3000, why, sizeof(why)) == -1 && c == NULL);
    printf("nothing listening: %s\n", why);
    KT_CHECK(strstr(why, "ECONNREFUSED") != NULL && strstr(why, ep) != NULL);

    snprintf(ep, sizeof(ep), "https://127.0.0.1:%u", port);
    KT_CHECK(kvli_h2_open(&c, ep, 3000, why, sizeof(why)) == -1 && c == NULL);
    printf("https: %s\n", why);
    KT_CHECK(strstr(why, "https") != NULL);

    int lfd = listener(&port);
    pthread_t th;
    KT_CHECK(pthread_create(&th, NULL, http1_server, &lfd) == 0);
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", port);
    int rc = kvli_h2_open(&c, ep, 10000, why, sizeof(why));
    printf("an HTTP/1.1 server: %d: %s\n", rc, why);
    KT_CHECK(rc == -2 && c == NULL && strstr(why, "HTTP/1.1 400 Bad Request\\r\\n") != NULL);
    pthread_join(th, NULL);
    close(lfd);

    /* accepted and closed without a byte (a member going down, a balancer
     * with no backend, etcd's TLS listener): -3, neither not reached nor
     * "no HTTP/2" (that would keep the endpoint off gRPC for good) */
    lfd = listener(&port);
    KT_CHECK(pthread_create(&th, NULL, closing_server, &lfd) == 0);
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", port);
    rc = kvli_h2_open(&c, ep, 10000, why, sizeof(why));
    printf("a server that closes at once: %d: %s\n", rc, why);
    KT_CHECK(rc == -3 && c == NULL && strstr(why, "closed the connection without") != NULL);
    pthread_join(th, NULL);
    close(lfd);

    /* accepted by the kernel (listen backlog), never answered */
    lfd = listener(&port);
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", port);
    uint64_t t0 = kt_now_ms();
    rc = kvli_h2_open(&c, ep, 500, why, sizeof(why));
    printf("a silent server: %d after %llu ms: %s\n", rc,
           (unsigned long long)(kt_now_ms() - t0), why);
    KT_CHECK(rc == -1 && c == NULL && strstr(why, "no HTTP/2 SETTINGS") != NULL);
    close(lfd);
    kvli_h2_close(NULL);
}

/* ---- a scripted HTTP/2 server (nghttp2's server side) ------------------- */
/* What etcd does not do on demand: several messages in one DATA frame, a
 * prefix split over frames, a compressed flag, two answers to a unary
 * call, RST_STREAM, GOAWAY, a trailers-only answer with an encoded message,
 * a stream's last messages, its trailers and the connection's close read
 * by one pump.
 * The method's path says what it answers. */

typedef struct {
    uint8_t buf[128];
    size_t len, off, chunks[8];
    int n, i;
} fake_body_t;

typedef struct {
    nghttp2_session *s;
    char path[64][32];        /* by stream id / 2 (client ids are odd) */
    fake_body_t body[16];
    int nbody;
    bool close_after;         /* close the connection once all is sent */
} fake_t;

static atomic_int fake_stop;
static atomic_int fake_closed; /* connections closed by close_after */

static ssize_t fake_read(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)ud;
    fake_body_t *b = src->ptr;
    size_t n = b->chunks[b->i++];
    if (n > length)
        n = length;
    memcpy(buf, b->buf + b->off, n);
    b->off += n;
    if (b->i == b->n) {
        nghttp2_nv tr[] = {{(uint8_t *)"grpc-status", (uint8_t *)"0", 11, 1, 0}};
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        nghttp2_submit_trailer(s, sid, tr, 1);
    }
    return (ssize_t)n;
}

/* grpc message m (flag fl) at the end of b */
static void fake_msg(fake_body_t *b, uint8_t fl, const char *m)
{
    size_t n = strlen(m);
    uint8_t pre[5] = {fl, 0, 0, 0, (uint8_t)n};
    memcpy(b->buf + b->len, pre, 5);
    memcpy(b->buf + b->len + 5, m, n);
    b->len += 5 + n;
}

static void fake_answer(fake_t *f, int32_t sid)
{
    const char *p = f->path[(sid / 2) % 64];
    nghttp2_nv hd[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, 0},
                       {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, 0},
                       {(uint8_t *)"grpc-status", (uint8_t *)"5", 11, 1, 0},
                       {(uint8_t *)"grpc-message", (uint8_t *)"not%20here%21%", 12, 14, 0}};
    if (strcmp(p, "/t/trailers-only") == 0) {
        nghttp2_submit_response(f->s, sid, hd, 4, NULL);
        return;
    }
    if (strcmp(p, "/t/refused") == 0) {
        nghttp2_submit_rst_stream(f->s, NGHTTP2_FLAG_NONE, sid, NGHTTP2_REFUSED_STREAM);
        return;
    }
    if (strcmp(p, "/t/goaway") == 0) {
        nghttp2_submit_goaway(f->s, NGHTTP2_FLAG_NONE, sid - 2 > 0 ? sid - 2 : 0,
                              NGHTTP2_ENHANCE_YOUR_CALM, (const uint8_t *)"calm", 4);
        return;
    }
    fake_body_t *b = &f->body[f->nbody++ % 16];
    memset(b, 0, sizeof(*b));
    if (strcmp(p, "/t/compressed") == 0) {
        fake_msg(b, 1, "x");
        b->chunks[b->n++] = b->len;
    } else if (strcmp(p, "/t/two") == 0) {
        fake_msg(b, 0, "one");
        fake_msg(b, 0, "two");
        b->chunks[b->n++] = b->len;
    } else if (strcmp(p, "/t/stream-close") == 0) {
        /* two messages, the trailers, then the connection closes */
        fake_msg(b, 0, "one");
        fake_msg(b, 0, "two");
        b->chunks[b->n++] = b->len;
        f->close_after = true;
    } else { /* /t/stream: two messages in one frame, a third split in its prefix */
        fake_msg(b, 0, "one");
        fake_msg(b, 0, "two");
        fake_msg(b, 0, "three, split");
        b->chunks[b->n++] = 16;
        b->chunks[b->n++] = 2;
        b->chunks[b->n++] = 4;
        b->chunks[b->n++] = b->len - 22;
    }
    nghttp2_data_provider prd = {.source.ptr = b, .read_callback = fake_read};
    nghttp2_submit_response(f->s, sid, hd, 2, &prd);
}

static int fake_header(nghttp2_session *s, const nghttp2_frame *fr, const uint8_t *name,
                       size_t nl, const uint8_t *value, size_t vl, uint8_t flags, void *ud)
{
    (void)s;
    (void)flags;
    fake_t *f = ud;
    if (nl == 5 && memcmp(name, ":path", 5) == 0)
        snprintf(f->path[(fr->hd.stream_id / 2) % 64], 32, "%.*s", (int)vl, (const char *)value);
    return 0;
}

static int fake_frame(nghttp2_session *s, const nghttp2_frame *fr, void *ud)
{
    (void)s;
    fake_t *f = ud;
    int32_t sid = fr->hd.stream_id;
    if (sid == 0 || (fr->hd.type != NGHTTP2_HEADERS && fr->hd.type != NGHTTP2_DATA))
        return 0;
    bool end = fr->hd.flags & NGHTTP2_FLAG_END_STREAM;
    bool stream = strncmp(f->path[(sid / 2) % 64], "/t/stream", 9) == 0;
    if ((end && !stream) || (stream && fr->hd.type == NGHTTP2_HEADERS))
        fake_answer(f, sid);
    return 0;
}

static void fake_serve(int fd)
{
    fake_t *f = calloc(1, sizeof(*f));
    nghttp2_session_callbacks *cb = NULL;
    KT_CHECK(f != NULL && nghttp2_session_callbacks_new(&cb) == 0);
    nghttp2_session_callbacks_set_on_header_callback(cb, fake_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, fake_frame);
    KT_CHECK(nghttp2_session_server_new(&f->s, cb, f) == 0);
    nghttp2_session_callbacks_del(cb);
    nghttp2_submit_settings(f->s, NGHTTP2_FLAG_NONE, NULL, 0);
    uint64_t end = kt_now_ms() + 20000;
    while (kt_now_ms() < end && !atomic_load(&fake_stop)) {
        const uint8_t *out;
        ssize_t n;
        while ((n = nghttp2_session_mem_send(f->s, &out)) > 0)
            if (send(fd, out, (size_t)n, MSG_NOSIGNAL) != n) {
                fprintf(stderr, "fake server: send %zd: %s\n", n, strerror(errno));
                goto done;
            }
        if (n < 0)
            fprintf(stderr, "fake server: %s\n", nghttp2_strerror((int)n));
        if (f->close_after && !nghttp2_session_want_write(f->s))
            break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) != 1)
            continue;
        uint8_t buf[4096];
        ssize_t r = recv(fd, buf, sizeof(buf), 0), u = 0;
        if (r <= 0 || (u = nghttp2_session_mem_recv(f->s, buf, (size_t)r)) < 0) {
            if (u < 0)
                fprintf(stderr, "fake server: %s\n", nghttp2_strerror((int)u));
            break;
        }
    }
done:
    if (f->close_after) {
        close(fd);
        atomic_fetch_add(&fake_closed, 1);
    }
    nghttp2_session_del(f->s);
    free(f);
}

static void *fake_server(void *arg)
{
    int lfd = *(int *)arg;
    while (!atomic_load(&fake_stop)) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 100) != 1)
            continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd >= 0) {
            int closed = atomic_load(&fake_closed);
            fake_serve(fd);
            if (atomic_load(&fake_closed) == closed)
                close(fd);
        }
    }
    return NULL;
}

static void scripted(void)
{
    unsigned port;
    int lfd = listener(&port);
    pthread_t th;
    char ep[64], why[512];
    kvli_h2_t *c;
    kvli_h2_reply_t r;
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", port);
    atomic_store(&fake_stop, 0);
    KT_CHECK(pthread_create(&th, NULL, fake_server, &lfd) == 0);

    /* a trailers-only answer; then the connection still serves */
    KT_CHECK(kvli_h2_open(&c, ep, TMO, why, sizeof(why)) == 0);
    KT_CHECK(kvli_h2_unary(c, "/t/trailers-only", "tok", NULL, 0, 100, TMO, &r, why,
                           sizeof(why)) == 0);
    printf("scripted, trailers-only: %d \"%s\" (HTTP %d)\n", r.status, r.message, r.http);
    KT_CHECK(r.status == 5 && strcmp(r.message, "not here!%") == 0 && r.http == 200 &&
             r.msg == NULL);

    /* messages two in a frame and split in the prefix, on a stream */
    watch_t w;
    memset(&w, 0, sizeof(w));
    KT_CHECK(kvli_h2_stream_open(c, "/t/stream", NULL, &w.sid, TMO, why, sizeof(why)) == 0);
    KT_CHECK(pump_until(c, &w, &w.ends, 1) == 0);
    printf("scripted, a stream: %d messages, %zu bytes, end %d\n", w.msgs, w.bytes,
           w.end_status);
    KT_CHECK(w.msgs == 3 && w.bytes == 3 + 3 + 12 && w.ends == 1 && w.end_status == 0);
    KT_CHECK(kvli_h2_usable(c));
    kvli_h2_close(c);

    /* a stream's last messages, its trailers and the connection's end,
     * all read by one pump: the messages are handed out before the end */
    KT_CHECK(kvli_h2_open(&c, ep, TMO, why, sizeof(why)) == 0);
    memset(&w, 0, sizeof(w));
    int closed = atomic_load(&fake_closed);
    KT_CHECK(kvli_h2_stream_open(c, "/t/stream-close", NULL, &w.sid, TMO, why,
                                 sizeof(why)) == 0);
    for (int i = 0; i < 2000 && atomic_load(&fake_closed) == closed; i++)
        usleep(10000); /* bounded: 20 s */
    KT_CHECK(atomic_load(&fake_closed) > closed);
    int prc = kvli_h2_pump(c, MAXMSG, on_msg, on_end, &w, why, sizeof(why));
    printf("scripted, a stream then the connection's end: pump %d, %d messages, %d ends "
           "(status %d)\n", prc, w.msgs, w.ends, w.end_status);
    KT_CHECK(w.msgs == 2 && w.bytes == 3 + 3 && w.ends == 1 && w.end_status == 0);
    kvli_h2_close(c);

    static const struct {
        const char *path, *want;
    } bad[] = {
        {"/t/compressed", "a compressed gRPC message"},
        {"/t/two", "more than one response message"},
        {"/t/refused", "HTTP/2 stream reset by the server (REFUSED_STREAM)"},
        {"/t/goaway", "GOAWAY (ENHANCE_YOUR_CALM, calm)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        KT_CHECK(kvli_h2_open(&c, ep, TMO, why, sizeof(why)) == 0);
        int rc = kvli_h2_unary(c, bad[i].path, NULL, NULL, 0, 100, TMO, &r, why, sizeof(why));
        printf("scripted, %s: %d: %s\n", bad[i].path, rc, why);
        KT_CHECK(rc == -1 && strstr(why, bad[i].want) != NULL && !kvli_h2_usable(c));
        KT_CHECK(r.msg == NULL);
        /* and no further call */
        KT_CHECK(kvli_h2_unary(c, "/t/two", NULL, NULL, 0, 100, TMO, &r, why,
                               sizeof(why)) == -1);
        if (i == 3)
            KT_CHECK(strstr(why, "GOAWAY") != NULL);
        kvli_h2_close(c);
    }
    atomic_store(&fake_stop, 1);
    pthread_join(th, NULL);
    close(lfd);
}

/* ---- etcd stopped (SIGTERM): a graceful stop ------------------------------ */

static void stopped(kvli_h2_t *old)
{
    kvli_h2_t *c = conn(), *wc = conn();
    watch_t w;
    char why[512];
    watch_create(wc, &w, "s");
    kill(etcd.pid, SIGTERM);
    int rc = pump_until(wc, &w, &w.ends, 1);
    printf("etcd stopped, the watch: pump %d, ends %d, status %d: %s\n", rc, w.ends,
           w.end_status, w.end_msg);
    kvli_h2_reply_t r;
    const uint8_t rk[] = {0x0a, 0x01, 'k'};
    rc = kvli_h2_unary(c, "/etcdserverpb.KV/Range", NULL, rk, sizeof(rk), MAXMSG, TMO, &r, why,
                       sizeof(why));
    printf("etcd stopped, a call: %d: %s\n", rc, rc ? why : r.message);
    /* etcd 3.4 closes its connections without a GOAWAY: either way the
     * watch ends, calls fail, the connections are given up */
    KT_CHECK(rc == -1 && !kvli_h2_usable(c));
    KT_CHECK(w.ends == 1 && w.end_status == -1 && !kvli_h2_usable(wc));
    KT_CHECK(kvli_h2_unary(old, "/etcdserverpb.KV/Range", NULL, rk, sizeof(rk), MAXMSG, TMO,
                           &r, why, sizeof(why)) == -1 && !kvli_h2_usable(old));
    kvli_h2_reply_free(&r);
    int st;
    waitpid(etcd.pid, &st, 0);
    etcd.pid = 0;
    kvli_h2_close(c);
    kvli_h2_close(wc);
    kt_etcd_restart(&etcd);
}

/* ---- etcd killed ----------------------------------------------------------- */

static void killed(kvli_h2_t *c, kvli_h2_t *wc, watch_t *w)
{
    kt_etcd_kill(&etcd);
    char why[512];
    kvli_h2_reply_t r;
    const uint8_t rk[] = {0x0a, 0x01, 'k'};
    int rc = kvli_h2_unary(c, "/etcdserverpb.KV/Range", NULL, rk, sizeof(rk), MAXMSG, TMO, &r,
                           why, sizeof(why));
    printf("etcd killed, a call: %d: %s\n", rc, why);
    KT_CHECK(rc == -1 && !kvli_h2_usable(c) && r.msg == NULL);
    KT_CHECK(strstr(why, etcd.url) != NULL);
    /* the next call fails at once, with the same reason */
    KT_CHECK(kvli_h2_unary(c, "/etcdserverpb.KV/Range", NULL, rk, sizeof(rk), MAXMSG, TMO, &r,
                           why, sizeof(why)) == -1);

    int ends = w->ends;
    KT_CHECK(pump_until(wc, w, &w->ends, ends + 1) == -1);
    printf("etcd killed, the watch: ended %d, status %d: %s\n", w->ends - ends, w->end_status,
           w->end_msg);
    KT_CHECK(w->ends == ends + 1 && w->end_status == -1 && !kvli_h2_usable(wc));
    /* and the pump keeps answering -1 without another end */
    KT_CHECK(kvli_h2_pump(wc, MAXMSG, on_msg, on_end, w, why, sizeof(why)) == -1);
    KT_CHECK(w->ends == ends + 1);
    int32_t sid;
    KT_CHECK(kvli_h2_stream_open(wc, "/etcdserverpb.Watch/Watch", NULL, &sid, TMO, why,
                                 sizeof(why)) == -1);
}

static void helpers(void)
{
    char out[64];
    kvli_h2_pct_decode("a%20b%zz%4", 10, out, sizeof(out));
    KT_CHECK(strcmp(out, "a b%zz%4") == 0);
    kvli_h2_grpc_timeout(5000, out, sizeof(out));
    KT_CHECK(strcmp(out, "5000m") == 0);
    kvli_h2_grpc_timeout(123456789012ull, out, sizeof(out));
    KT_CHECK(strcmp(out, "99999999S") == 0);
    kvli_h2_grpc_timeout(100000000ull, out, sizeof(out));
    KT_CHECK(strcmp(out, "100000S") == 0);
}

int main(void)
{
    if (kvl_etcd_attach(NULL, NULL) == KVL_ERR_UNSUPPORTED) /* built without the store */
        KT_SKIP("%s", kvl_last_error()->what);
    if (kt_etcd_binary() == NULL)
        KT_SKIP("no etcd binary (/usr/bin/etcd from Debian's etcd-server, or KVL_ETCD_BIN)");
    signal(SIGPIPE, SIG_DFL); /* the transport must not need SIG_IGN */
    helpers();
    not_etcd();
    scripted();
    kt_etcd_start(&etcd);
    kvli_h2_t *c = conn(), *wc = NULL;
    uint64_t lease = 0;
    watch_t w;
    unary_basics(c, &lease);
    many_calls(c);
    etcd_errors(c);
    keepalive(c, lease);
    stopped(c);
    kvli_h2_close(c);
    c = conn(); /* etcd restarted */
    watch(c, &wc, &w);
    killed(c, wc, &w);
    kvli_h2_close(c);
    kvli_h2_close(wc);
    kt_etcd_stop(&etcd);
    printf("etcd_h2: all cases passed\n");
    return 0;
}
#endif
