/*
 * kvlane etcd client: one WebSocket to etcd's gateway (RFC 6455), which
 * carries a bidirectional gRPC stream as JSON messages. The watcher uses it
 * to hold every watch of an agent on one connection: etcd's gateway turns
 * each plain HTTP watch request into a stream of its own, so following 8
 * peers cost 8 connections and 8 stream set-ups before.
 *
 * libcurl makes the connection (CURLOPT_CONNECT_ONLY: proxies and https as
 * for every other call); the upgrade and the framing are done here over
 * curl_easy_send/curl_easy_recv. Client frames are masked; server frames
 * must not be; text messages may arrive in fragments; pings are answered.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "common/clock.h"
#include "common/sha1.h"
#include "etcd_client.h"

#define KVLI_WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

/* Wait until the socket is readable (in) or writable (!in), up to the
 * deadline: 0 ready, -1 timed out or failed. */
static int kvli_ws_wait(kvli_etcd_ws_t *w, bool in, uint64_t deadline)
{
    uint64_t now = kvli_clock_ms();
    if (now >= deadline)
        return -1;
    struct pollfd p = {.fd = w->fd, .events = in ? POLLIN : POLLOUT};
    int r = poll(&p, 1, (int)(deadline - now));
    return r > 0 ? 0 : -1;
}

/* All n bytes, bounded by the deadline: 0, or -1 with why. */
static int kvli_ws_put(kvli_etcd_ws_t *w, const void *data, size_t n, uint64_t deadline,
                       char *why, size_t why_cap)
{
    const char *p = data;
    while (n > 0) {
        size_t sent = 0;
        CURLcode cc = curl_easy_send(w->h, p, n, &sent);
        if (cc == CURLE_AGAIN) {
            if (kvli_ws_wait(w, false, deadline) != 0) {
                snprintf(why, why_cap, "sending to etcd timed out");
                return -1;
            }
            continue;
        }
        if (cc != CURLE_OK) {
            snprintf(why, why_cap, "sending to etcd: %s", curl_easy_strerror(cc));
            return -1;
        }
        p += sent;
        n -= sent;
    }
    return 0;
}

/* Whatever the socket holds now into w->in: 1 got bytes, 0 nothing yet,
 * -1 closed or failed (why). */
static int kvli_ws_pull(kvli_etcd_ws_t *w, char *why, size_t why_cap)
{
    char buf[16384];
    size_t got = 0;
    CURLcode cc = curl_easy_recv(w->h, buf, sizeof(buf), &got);
    if (cc == CURLE_AGAIN)
        return 0;
    if (cc != CURLE_OK || got == 0) {
        snprintf(why, why_cap, "%s", cc != CURLE_OK ? curl_easy_strerror(cc)
                                                    : "etcd closed the connection");
        return -1;
    }
    int r = kvli_etcd_append(&w->in, &w->in_len, &w->in_cap, buf, got);
    if (r != 0) {
        snprintf(why, why_cap, r == -1 ? "a message of more than %u MiB from etcd"
                                       : "out of memory for %u MiB", KVLI_ETCD_REPLY_MAX >> 20);
        return -1;
    }
    return 1;
}

/* The Sec-WebSocket-Accept value etcd must answer for key. */
static void kvli_ws_accept_of(const char *key, char *out, size_t cap)
{
    char cat[128];
    uint8_t md[KVLI_SHA1_LEN];
    int n = snprintf(cat, sizeof(cat), "%s%s", key, KVLI_WS_GUID);
    out[0] = '\0';
    if (n <= 0 || (size_t)n >= sizeof(cat))
        return;
    kvli_sha1(cat, (size_t)n, md);
    char *b = kvli_etcd_b64(md, sizeof(md));
    if (b != NULL)
        snprintf(out, cap, "%s", b);
    free(b);
}

/* One header's value in the handshake answer (case-insensitive name). */
static bool kvli_ws_header(const char *head, const char *name, char *val, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *l = strstr(head, "\r\n"); l != NULL; l = strstr(l + 2, "\r\n")) {
        const char *h = l + 2;
        if (strncasecmp(h, name, nl) == 0 && h[nl] == ':') {
            h += nl + 1;
            while (*h == ' ')
                h++;
            size_t vl = strcspn(h, "\r");
            snprintf(val, cap, "%.*s", (int)vl, h);
            return true;
        }
    }
    return false;
}

bool kvli_etcd_ws_upgraded(const char *head, const char *key)
{
    char want[64], got[64];
    kvli_ws_accept_of(key, want, sizeof(want));
    return want[0] != '\0' && strncmp(head, "HTTP/1.1 101 ", 13) == 0 &&
           kvli_ws_header(head, "Sec-WebSocket-Accept", got, sizeof(got)) &&
           strcmp(got, want) == 0;
}

int kvli_etcd_ws_open(kvli_etcd_ws_t *w, const kvli_etcd_client_t *c, const char *ep,
                      const char *path, uint64_t timeout_ms, char *why, size_t why_cap)
{
    char url[KVLI_ETCD_EP_LEN + 64], req[KVLI_ETCD_EP_LEN + 512], key[32];
    uint64_t deadline = kvli_clock_ms() + timeout_ms, rnd[2] = {kvli_random64(), kvli_random64()};
    curl_socket_t fd = CURL_SOCKET_BAD;
    char eb[CURL_ERROR_SIZE] = "";
    memset(w, 0, sizeof(*w));
    w->fd = -1;
    if ((w->h = curl_easy_init()) == NULL) {
        snprintf(why, why_cap, "curl_easy_init failed (out of memory)");
        return -1;
    }
    snprintf(url, sizeof(url), "%s%s", ep, path);
    kvli_etcd_curl_setup(c, w->h, timeout_ms);
    curl_easy_setopt(w->h, CURLOPT_ERRORBUFFER, eb);
    curl_easy_setopt(w->h, CURLOPT_URL, url);
    curl_easy_setopt(w->h, CURLOPT_CONNECT_ONLY, 1L);
    /* Over https, ALPN would pick HTTP/2 and curl_easy_send/recv would
     * then go through curl's HTTP/2 layer: the upgrade is HTTP/1.1 bytes. */
    curl_easy_setopt(w->h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(w->h, CURLOPT_SSL_ENABLE_ALPN, 0L);
    CURLcode cc = curl_easy_perform(w->h);
    curl_easy_setopt(w->h, CURLOPT_ERRORBUFFER, NULL); /* eb is this frame's */
    if (cc == CURLE_OK)
        cc = curl_easy_getinfo(w->h, CURLINFO_ACTIVESOCKET, &fd);
    if (cc != CURLE_OK || fd == CURL_SOCKET_BAD) {
        char tls[400];
        const char *fix = kvli_etcd_tls_explain(c, w->h, ep, (int)cc, eb, tls, sizeof(tls));
        if (fix != NULL)
            snprintf(why, why_cap, "%s; %s", tls, fix);
        else
            snprintf(why, why_cap, "%s%s%s", curl_easy_strerror(cc), eb[0] ? ": " : "", eb);
        kvli_etcd_ws_close(w);
        return -1;
    }
    w->fd = (int)fd;
    char *k = kvli_etcd_b64(rnd, sizeof(rnd));
    snprintf(key, sizeof(key), "%s", k ? k : "a2x2bGFuZS13ZWJzb2NrZXQ=");
    free(k);
    const char *host = strstr(ep, "://") + 3;
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n", path, host, key);
    if (kvli_ws_put(w, req, (size_t)n, deadline, why, why_cap) != 0) {
        kvli_etcd_ws_close(w);
        return -1;
    }
    char *end = NULL;
    while ((end = w->in ? strstr(w->in, "\r\n\r\n") : NULL) == NULL) {
        int r = kvli_ws_pull(w, why, why_cap);
        if (r < 0 || (r == 0 && kvli_ws_wait(w, true, deadline) != 0)) {
            if (r == 0)
                snprintf(why, why_cap, "no answer to the WebSocket upgrade within %llu ms",
                         (unsigned long long)timeout_ms);
            kvli_etcd_ws_close(w);
            return -1;
        }
        if (w->in_len > 16384) {
            snprintf(why, why_cap, "an upgrade answer of more than 16 KiB");
            kvli_etcd_ws_close(w);
            return -1;
        }
    }
    *end = '\0';
    if (!kvli_etcd_ws_upgraded(w->in, key)) {
        snprintf(why, why_cap, "no WebSocket upgrade (%.*s)", (int)strcspn(w->in, "\r"),
                 w->in);
        kvli_etcd_ws_close(w);
        return -2;
    }
    size_t used = (size_t)(end - w->in) + 4;
    memmove(w->in, w->in + used, w->in_len - used + 1);
    w->in_len -= used;
    return 0;
}

void kvli_etcd_ws_close(kvli_etcd_ws_t *w)
{
    if (w->h != NULL)
        curl_easy_cleanup(w->h);
    free(w->in);
    free(w->msg);
    memset(w, 0, sizeof(*w));
    w->fd = -1;
}

/* One frame, masked as a client must: 0 or -1 with why. */
static int kvli_ws_frame(kvli_etcd_ws_t *w, unsigned op, const char *data, size_t n,
                         uint64_t deadline, char *why, size_t why_cap)
{
    unsigned char hdr[14];
    size_t hl = 0;
    uint32_t mask = (uint32_t)kvli_random64();
    hdr[hl++] = (unsigned char)(0x80u | op);
    if (n < 126) {
        hdr[hl++] = (unsigned char)(0x80u | n);
    } else if (n <= 0xffff) {
        hdr[hl++] = 0x80u | 126u;
        hdr[hl++] = (unsigned char)(n >> 8);
        hdr[hl++] = (unsigned char)n;
    } else {
        hdr[hl++] = 0x80u | 127u;
        for (int i = 7; i >= 0; i--)
            hdr[hl++] = (unsigned char)((uint64_t)n >> (8 * i));
    }
    memcpy(hdr + hl, &mask, 4);
    hl += 4;
    char *m = malloc(n + hl);
    if (m == NULL) {
        snprintf(why, why_cap, "out of memory for a %zu-byte message", n);
        return -1;
    }
    memcpy(m, hdr, hl);
    const unsigned char *mk = hdr + hl - 4;
    for (size_t i = 0; i < n; i++)
        m[hl + i] = (char)((unsigned char)data[i] ^ mk[i & 3]);
    int r = kvli_ws_put(w, m, n + hl, deadline, why, why_cap);
    free(m);
    return r;
}

int kvli_etcd_ws_send(kvli_etcd_ws_t *w, const char *text, uint64_t timeout_ms, char *why,
                      size_t why_cap)
{
    return kvli_ws_frame(w, 1, text, strlen(text), kvli_clock_ms() + timeout_ms, why, why_cap);
}

int kvli_etcd_ws_next(const kvli_etcd_ws_t *w, kvli_etcd_ws_frame_t *f, char *why,
                      size_t why_cap)
{
    const unsigned char *p = (const unsigned char *)w->in;
    if (w->in_len < 2)
        return 0;
    f->fin = p[0] >> 7;
    f->op = p[0] & 0x0fu;
    if ((p[0] & 0x70u) != 0 || (p[1] & 0x80u) != 0) {
        snprintf(why, why_cap, "etcd sent a WebSocket frame with %s",
                 (p[1] & 0x80u) ? "a mask (servers must not mask)" : "reserved bits set");
        return -1;
    }
    if (f->op > 2 && f->op != 8 && f->op != 9 && f->op != 10) {
        snprintf(why, why_cap, "etcd sent a WebSocket frame of unknown opcode %u", f->op);
        return -1;
    }
    uint64_t len = p[1] & 0x7fu;
    size_t h = 2;
    if (f->op >= 8 && (!f->fin || len > 125)) {
        snprintf(why, why_cap, "etcd sent a WebSocket control frame (opcode %u) %s", f->op,
                 f->fin ? "longer than 125 bytes" : "in fragments");
        return -1;
    }
    if (len >= 126) {
        size_t ext = len == 126 ? 2 : 8;
        if (w->in_len < 2 + ext)
            return 0;
        len = 0;
        for (size_t i = 0; i < ext; i++)
            len = len << 8 | p[2 + i];
        h += ext;
    }
    if (len > KVLI_ETCD_REPLY_MAX) {
        snprintf(why, why_cap, "a WebSocket frame of %llu bytes from etcd (more than %u MiB)",
                 (unsigned long long)len, KVLI_ETCD_REPLY_MAX >> 20);
        return -1;
    }
    if (w->in_len < h + len)
        return 0;
    f->payload = w->in + h;
    f->len = len;
    f->size = h + (size_t)len;
    return 1;
}

int kvli_etcd_ws_collect(kvli_etcd_ws_t *w, const kvli_etcd_ws_frame_t *f, char *why,
                         size_t why_cap)
{
    if (f->op == 0 && !w->msg_on) {
        snprintf(why, why_cap, "etcd continued a WebSocket message it never began");
        return -1;
    }
    if (f->op != 0 && w->msg_on) {
        snprintf(why, why_cap, "etcd began a WebSocket message inside another");
        return -1;
    }
    w->msg_on = true;
    if (kvli_etcd_append(&w->msg, &w->msg_len, &w->msg_cap, f->payload, (size_t)f->len) != 0) {
        snprintf(why, why_cap, "a message of more than %u MiB from etcd",
                 KVLI_ETCD_REPLY_MAX >> 20);
        return -1;
    }
    return f->fin ? 1 : 0;
}

void kvli_etcd_ws_taken(kvli_etcd_ws_t *w)
{
    w->msg_len = 0;
    w->msg_on = false;
}

void kvli_etcd_ws_consume(kvli_etcd_ws_t *w, const kvli_etcd_ws_frame_t *f)
{
    memmove(w->in, w->in + f->size, w->in_len - f->size + 1); /* with its NUL */
    w->in_len -= f->size;
}

int kvli_etcd_ws_read(kvli_etcd_ws_t *w, kvli_etcd_ws_msg_fn fn, void *arg, char *why,
                      size_t why_cap)
{
    int r;
    while ((r = kvli_ws_pull(w, why, why_cap)) > 0)
        ;
    if (r < 0)
        return -1;
    for (;;) {
        kvli_etcd_ws_frame_t f;
        r = kvli_etcd_ws_next(w, &f, why, why_cap);
        if (r <= 0)
            return r;
        const char *pl = f.payload;
        if (f.op == 8) {
            unsigned code = f.len >= 2 ? ((unsigned char)pl[0] << 8 | (unsigned char)pl[1]) : 0;
            int tl = f.len > 2 ? (int)(f.len - 2 > 100 ? 100 : f.len - 2) : 0;
            snprintf(why, why_cap, "etcd closed the WebSocket (code %u%s%.*s)", code,
                     tl > 0 ? ": " : "", tl, tl > 0 ? pl + 2 : "");
            return -1;
        }
        if (f.op == 9 && kvli_ws_frame(w, 10, pl, (size_t)f.len, kvli_clock_ms() + 2000, why,
                                       why_cap) != 0)
            return -1;
        if (f.op <= 2) {
            int c = kvli_etcd_ws_collect(w, &f, why, why_cap);
            if (c < 0)
                return -1;
            if (c == 1) {
                fn(arg, w->msg != NULL ? w->msg : "", w->msg_len);
                kvli_etcd_ws_taken(w);
            }
        }
        kvli_etcd_ws_consume(w, &f);
    }
}
