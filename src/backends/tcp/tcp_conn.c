/*
 * kvlane tcp backend: the target side. Accepted connections, served by the
 * progress thread alone with non-blocking sockets: authentication, HELLO
 * (refused when the initiator expects another incarnation: its metadata of
 * us is stale), then requests. Every range of a WRITE or READ must lie in
 * memory this agent registered on tcp (ctx->region_pin): a refused request
 * touches no byte of our memory, its payload is read into scratch and
 * dropped, the initiator gets the reason and we log it.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/errname.h"
#include "common/notif_full.h"
#include "common/sock.h"
#include "tcp.h"

/* ---- replies ---- */

static void kvli_tcp_reply_free(kvli_tcp_iface_t *iface, kvli_tcp_reply_t *r)
{
    kvli_bounce_put(&iface->bounce, r->bounce);
    for (unsigned i = 0; i < r->npins; i++)
        iface->ctx->region_unpin(iface->ctx, r->pins[i]);
    free(r->pins);
    free(r->iov);
    free(r);
}

static void kvli_tcp_conn_close(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    (void)iface;
    c->state = KVLI_TCP_CONN_CLOSED;
}

static void kvli_tcp_conn_push(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, kvli_tcp_reply_t *r)
{
    if (r == NULL) {
        iface->ctx->log(iface->ctx, KVL_LOG_ERROR, "tcp: out of memory for a reply to %s; "
                        "dropping the connection", c->addr);
        kvli_tcp_conn_close(iface, c);
        return;
    }
    if (c->oq_tail != NULL)
        c->oq_tail->next = r;
    else
        c->oq_head = r;
    c->oq_tail = r;
    c->oq_n++;
}

static kvli_tcp_reply_t *kvli_tcp_reply_raw(const uint8_t *b, size_t len)
{
    kvli_tcp_reply_t *r = calloc(1, sizeof(*r));
    if (r == NULL || len > sizeof(r->head)) {
        free(r);
        return NULL;
    }
    memcpy(r->head, b, len);
    r->head_len = r->total = len;
    return r;
}

static kvli_tcp_reply_t *kvli_tcp_reply_new(uint16_t type, uint64_t id, kvl_status_t status,
                                            const char *text, uint64_t payload,
                                            const uint8_t *tail, size_t tail_len)
{
    kvli_tcp_reply_t *r = calloc(1, sizeof(*r));
    size_t tl = text ? strlen(text) : 0;
    if (r == NULL)
        return NULL;
    if (tl > KVLI_TCP_TEXT_MAX)
        tl = KVLI_TCP_TEXT_MAX;
    kvli_tcp_proto_hdr_build(r->head, type, id, tl + tail_len + payload,
                             kvli_tcp_proto_reply_aux(status, (uint32_t)tl));
    memcpy(r->head + KVLI_TCP_HDR_LEN, text ? text : "", tl);
    if (tail_len > 0)
        memcpy(r->head + KVLI_TCP_HDR_LEN + tl, tail, tail_len);
    r->head_len = KVLI_TCP_HDR_LEN + tl + tail_len;
    r->total = r->head_len + payload;
    return r;
}

static void kvli_tcp_conn_flush(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    while (c->oq_head != NULL && c->state != KVLI_TCP_CONN_CLOSED) {
        kvli_tcp_reply_t *r = c->oq_head;
        size_t skip = r->sent;
        struct msghdr mh;
        ssize_t n;
        int k = kvli_tcp_iov_append(iface->tx_iov, 0, 1024,
                                    &(struct iovec){r->head, r->head_len}, 1, skip);
        skip = skip > r->head_len ? skip - r->head_len : 0;
        /* READ data straight from our registered memory. */
        k = kvli_tcp_iov_append(iface->tx_iov, k, 1024, r->iov, r->niov, skip);
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iface->tx_iov;
        mh.msg_iovlen = (size_t)k;
        n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return;
            if (e == EINTR)
                continue;
            iface->ctx->log(iface->ctx, KVL_LOG_INFO, "sendmsg() to agent '%s' (%s) = -1 %s "
                            "(%s); dropping the connection", c->name, c->addr,
                            kvli_errno_name(e), strerror(e));
            kvli_tcp_conn_close(iface, c);
            return;
        }
        c->progress_ns = kvli_clock_ns();
        r->sent += (size_t)n;
        if (r->sent < r->total)
            continue;
        c->oq_head = r->next;
        if (c->oq_head == NULL)
            c->oq_tail = NULL;
        c->oq_n--;
        kvli_tcp_reply_free(iface, r);
    }
    if (c->oq_head == NULL && c->state == KVLI_TCP_CONN_DRAINING)
        kvli_tcp_conn_close(iface, c);
}

/* ---- accept ---- */

/*
 * The table of accepted connections is full: make room for one more. Closed
 * connections are freed once this turn of the progress thread ends; failing
 * that, the oldest connection still in its handshake (not authenticated, or
 * without HELLO yet) is closed, so connections that never authenticate
 * cannot lock real peers out. Returns 0 when every connection is a peer's.
 */
static int kvli_tcp_conn_make_room(kvli_tcp_iface_t *iface, const char *from)
{
    kvli_tcp_conn_t *oldest = NULL;
    unsigned closed = 0;
    for (kvli_tcp_conn_t *c = iface->conns; c != NULL; c = c->next) {
        if (c->state == KVLI_TCP_CONN_CLOSED)
            closed++;
        else if (c->state != KVLI_TCP_CONN_READY &&
                 (oldest == NULL || c->deadline_ns <= oldest->deadline_ns))
            oldest = c;
    }
    if (iface->nconns - closed < KVLI_TCP_CONNS_MAX)
        return 1;
    if (oldest == NULL)
        return 0;
    if (!iface->warned_conns)
        iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                        "tcp %s: %u connections already open; closing the oldest one still in "
                        "its handshake (from %s) to accept one from %s", iface->addr,
                        iface->nconns - closed, oldest->addr, from);
    iface->warned_conns = 1;
    kvli_tcp_conn_close(iface, oldest);
    return 1;
}

void kvli_tcp_conn_accept(kvli_tcp_iface_t *iface)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        kvli_tcp_conn_t *c;
        int fd = accept4(iface->listen_fd, (struct sockaddr *)&ss, &sl,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            /* out of descriptors: paused, so the pending connection does not
             * spin this thread (common/accept.h) */
            if (!kvli_accept_failed(&iface->accept_bo, e) && e != EAGAIN &&
                e != EWOULDBLOCK && e != EINTR && e != ECONNABORTED)
                iface->ctx->log(iface->ctx, KVL_LOG_WARN, "tcp accept4(%s) = -1 %s (%s)",
                                iface->addr, kvli_errno_name(e), strerror(e));
            return;
        }
        kvli_accept_ok(&iface->accept_bo);
        char from[KVLI_TCP_ADDR_STR];
        kvli_tcp_addr_str((struct sockaddr *)&ss, from, sizeof(from));
        if (iface->nconns >= KVLI_TCP_CONNS_MAX && !kvli_tcp_conn_make_room(iface, from)) {
            if (!iface->warned_conns)
                iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                                "tcp %s: %u connections already open; refusing new ones until "
                                "some close", iface->addr, iface->nconns);
            iface->warned_conns = 1;
            close(fd);
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            return;
        }
        c->fd = fd;
        snprintf(c->addr, sizeof(c->addr), "%s", from);
        snprintf(c->name, sizeof(c->name), "?");
        c->auth.secret = iface->secret;
        c->auth.secret_len = iface->secret_len;
        c->auth.purpose = KVLI_AUTH_PURPOSE_DATA;
        c->progress_ns = kvli_clock_ns();
        c->deadline_ns = c->progress_ns + iface->timeout_ms * 1000000u;
        kvli_tcp_sock_tune(fd, iface->timeout_ms, iface->sndbuf, iface->rcvbuf);
        c->next = iface->conns;
        iface->conns = c;
        iface->nconns++;
    }
}

void kvli_tcp_conn_free(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    kvli_tcp_reply_t *r = c->oq_head, *n;
    if (c->ticket != NULL) {
        kvl_error_t e;
        /* nothing may still write the bounce buffer or the VRAM */
        iface->ctx->stage_test(iface->ctx, c->ticket, 1, &e);
        c->ticket = NULL;
        atomic_fetch_sub(&iface->staging, 1);
    }
    if (c->stage_reply != NULL)
        kvli_tcp_reply_free(iface, c->stage_reply);
    for (; r != NULL; r = n) {
        n = r->next;
        kvli_tcp_reply_free(iface, r);
    }
    for (unsigned i = 0; i < c->npins; i++)
        iface->ctx->region_unpin(iface->ctx, c->pins[i]);
    if (c->notif_slots > 0)
        iface->ctx->notif_unreserve(iface->ctx, c->name, c->notif_slots, KVLI_TCP_NOTIF_SLOT);
    kvli_bounce_put(&iface->bounce, c->bounce);
    close(c->fd);
    free(c->body);
    free(c->ranges);
    free(c->iov);
    free(c->pins);
    free(c->sp);
    free(c);
}

short kvli_tcp_conn_events(const kvli_tcp_conn_t *c)
{
    short ev = 0;
    if (c->state == KVLI_TCP_CONN_CLOSED)
        return 0;
    if (c->oq_head != NULL)
        ev |= POLLOUT;
    /* Backpressure: a peer that does not read its replies stops being read;
     * so does one whose request's VRAM copy runs. */
    if (c->state != KVLI_TCP_CONN_DRAINING && c->oq_n < KVLI_TCP_OUTQ_MAX &&
        c->rphase != KVLI_TCP_RX_STAGE)
        ev |= POLLIN;
    return ev;
}

/* ---- reading ---- */

static void kvli_tcp_conn_proto_error(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c,
                                      const char *why)
{
    iface->ctx->log(iface->ctx, KVL_LOG_WARN, "protocol error on the tcp connection from agent "
                    "'%s' (%s): %s; dropping the connection", c->name, c->addr, why);
    kvli_tcp_conn_close(iface, c);
}

/* 1: got all `want` bytes, 0: wait for more, -1: closed. */
static int kvli_tcp_conn_recv(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, uint8_t *buf,
                              size_t want, size_t *got)
{
    while (*got < want) {
        ssize_t n = recv(c->fd, buf + *got, want - *got, MSG_DONTWAIT);
        if (n > 0) {
            *got += (size_t)n;
            c->progress_ns = kvli_clock_ns();
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            iface->ctx->log(iface->ctx, KVL_LOG_DEBUG, "agent '%s' (%s) closed its tcp "
                            "connection", c->name, c->addr);
        else
            iface->ctx->log(iface->ctx, KVL_LOG_INFO, "recv() from agent '%s' (%s) = -1 %s "
                            "(%s); dropping the connection", c->name, c->addr,
                            kvli_errno_name(errno), strerror(errno));
        kvli_tcp_conn_close(iface, c);
        return -1;
    }
    return 1;
}

static int kvli_tcp_conn_body_reserve(kvli_tcp_conn_t *c, size_t n)
{
    if (n <= c->body_cap)
        return 0;
    uint8_t *b = realloc(c->body, n);
    if (b == NULL)
        return -1;
    c->body = b;
    c->body_cap = n;
    return 0;
}

static void kvli_tcp_conn_auth(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    uint8_t out[KVLI_AUTH4_FIXED + KVLI_AUTH_TEXT_MAX + KVLI_AUTH2_LEN];
    char why[256] = "";
    size_t ol = 0;
    if (c->state == KVLI_TCP_CONN_AUTH1) {
        if (kvli_tcp_auth_step2(&c->auth, c->body, out, why, sizeof(why)) != 0) {
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "refused a tcp connection from %s: %s",
                            c->addr, why);
            kvli_tcp_conn_close(iface, c);
            return;
        }
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_raw(out, KVLI_AUTH2_LEN));
        c->state = KVLI_TCP_CONN_AUTH3;
        return;
    }
    if (kvli_tcp_auth_step4(&c->auth, c->body, out, &ol, iface->ctx->agent_name, why,
                            sizeof(why)) != 0) {
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "refused a tcp connection from %s: %s",
                        c->addr, why);
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_raw(out, ol));
        c->state = KVLI_TCP_CONN_DRAINING;
        return;
    }
    kvli_tcp_conn_push(iface, c, kvli_tcp_reply_raw(out, ol));
    c->state = KVLI_TCP_CONN_HELLO;
}

static void kvli_tcp_conn_hello(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    kvli_tcp_hello_t h;
    uint8_t tail[8 + KVLI_TCP_NAME_MAX];
    char why[160] = "", text[KVLI_TCP_TEXT_MAX];
    size_t nl = strlen(ctx->agent_name);
    if (c->body_len >= 4 && kvli_get32(c->body) != KVLI_TCP_PROTO_VERSION) {
        /* another kvlane version: said to it (it prints our text), not just dropped */
        snprintf(text, sizeof(text), "agent '%.63s' speaks kvlane tcp protocol %u, the "
                 "initiator protocol %u: run the same kvlane version on both agents",
                 ctx->agent_name, KVLI_TCP_PROTO_VERSION, kvli_get32(c->body));
        ctx->log(ctx, KVL_LOG_WARN, "refused the tcp connection from %s: %s", c->addr, text);
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(KVLI_TCP_MSG_HELLO_ACK, c->h.id,
                                                        KVL_ERR_UNSUPPORTED, text, 0, NULL, 0));
        c->state = KVLI_TCP_CONN_DRAINING;
        return;
    }
    if (kvli_tcp_proto_hello_parse(c->body, c->body_len, &h, why, sizeof(why)) != 0) {
        kvli_tcp_conn_proto_error(iface, c, why);
        return;
    }
    if (nl > KVLI_TCP_NAME_MAX)
        nl = KVLI_TCP_NAME_MAX;
    if (strcmp(h.target, ctx->agent_name) != 0 || h.expect_incarnation != ctx->incarnation) {
        snprintf(text, sizeof(text), "this is agent '%.63s' incarnation 0x%016" PRIx64
                 "; you expected agent '%.63s' incarnation 0x%016" PRIx64 ": stale metadata",
                 ctx->agent_name, ctx->incarnation, h.target,
                 h.expect_incarnation);
        ctx->log(ctx, KVL_LOG_WARN, "refused agent '%s' (%s): it holds stale metadata: %s",
                 h.name, c->addr, text);
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(KVLI_TCP_MSG_HELLO_ACK, c->h.id,
                                                        KVL_ERR_STALE, text, 0, NULL, 0));
        c->state = KVLI_TCP_CONN_DRAINING;
        return;
    }
    snprintf(c->name, sizeof(c->name), "%s", h.name);
    c->incarnation = h.incarnation;
    kvli_put64(tail, ctx->incarnation);
    memcpy(tail + 8, ctx->agent_name, nl);
    kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(KVLI_TCP_MSG_HELLO_ACK, c->h.id, KVL_OK, NULL,
                                                    0, tail, 8 + nl));
    c->state = KVLI_TCP_CONN_READY;
    ctx->log(ctx, KVL_LOG_DEBUG, "agent '%s' (%s, incarnation %016" PRIx64 ") connected over tcp",
             c->name, c->addr, c->incarnation);
}

static void kvli_tcp_conn_unpin(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    for (unsigned i = 0; i < c->npins; i++)
        iface->ctx->region_unpin(iface->ctx, c->pins[i]);
    c->npins = 0;
}

/* VRAM ranges of a checked request: one bounce buffer for all of them;
 * on failure the request is refused (c->refuse) and nothing is touched. */
static void kvli_tcp_conn_stage_prepare(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, int write)
{
    uint64_t total = 0, off = 0;
    kvl_error_t e;
    for (int k = 0; k < c->nsp; k++)
        total += c->sp[k].len;
    if (total > KVLI_TCP_STAGE_MAX) {
        c->refuse = KVL_ERR_INVALID_ARG;
        snprintf(c->refuse_text, sizeof(c->refuse_text),
                 "agent '%.63s' refused %s of %" PRIu64 " bytes of VRAM in one request: more "
                 "than it stages at once (%llu)", iface->ctx->agent_name, write ? "WRITE" : "READ",
                 total, (unsigned long long)KVLI_TCP_STAGE_MAX);
    } else {
        c->bounce = kvli_bounce_get(&iface->bounce, (size_t)total, KVLI_BOUNCE_ONEOFF, &e);
        if (c->bounce == NULL) {
            c->refuse = e.code;
            snprintf(c->refuse_text, sizeof(c->refuse_text), "agent '%.63s' could not stage "
                     "VRAM: %.160s", iface->ctx->agent_name, e.what);
            /* the reply carries KVLI_TCP_TEXT_MAX bytes; the log the whole reason */
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "request from agent '%s' (%s): could "
                            "not stage VRAM: %s", c->name, c->addr, e.what);
        }
    }
    if (c->refuse != KVL_OK) {
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "request from agent '%s' (%s) refused, "
                        "nothing touched: %s", c->name, c->addr, c->refuse_text);
        kvli_tcp_conn_unpin(iface, c);
        return;
    }
    /* the socket sees the bounce buffer where a range is VRAM */
    for (int i = 0, k = 0; i < c->niov && k < c->nsp; i++) {
        if ((uint64_t)(uintptr_t)c->iov[i].iov_base != c->sp[k].dev_addr ||
            c->iov[i].iov_len != c->sp[k].len)
            continue;
        c->sp[k].host = (uint8_t *)c->bounce + off;
        c->iov[i].iov_base = c->sp[k].host;
        off += c->sp[k++].len;
    }
}

static void kvli_tcp_conn_stage_failed(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c,
                                       const kvl_error_t *e)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    c->refuse = e->code ? e->code : KVL_ERR_SYSTEM;
    snprintf(c->refuse_text, sizeof(c->refuse_text), "agent '%.63s' failed to stage VRAM for "
             "%s: %.120s", ctx->agent_name, c->stage_write ? "WRITE" : "READ", e->what);
    ctx->log(ctx, KVL_LOG_WARN, "request from agent '%s' (%s): failed to stage VRAM for %s: %s",
             c->name, c->addr, c->stage_write ? "WRITE" : "READ", e->what);
}

/* The request's VRAM copy is done (or failed, c->refuse): queue its reply
 * and read the next request. */
static void kvli_tcp_conn_stage_finish(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    kvli_tcp_reply_t *r = c->stage_reply;
    c->stage_reply = NULL;
    c->rphase = KVLI_TCP_RX_HDR;
    c->progress_ns = kvli_clock_ns();
    if (c->stage_write || c->refuse != KVL_OK) {
        kvli_bounce_put(&iface->bounce, c->bounce);
        c->bounce = NULL;
        kvli_tcp_conn_unpin(iface, c);
        if (r != NULL)
            kvli_tcp_reply_free(iface, r);
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(c->stage_write ? KVLI_TCP_MSG_WRITE_ACK
                                                        : KVLI_TCP_MSG_READ_DATA, c->h.id,
                                                        c->refuse, c->refuse == KVL_OK ? NULL
                                                        : c->refuse_text, 0, NULL, 0));
        return;
    }
    /* the reply sends the staged copy: it owns the bounce buffer and the
     * pins (the memory stays registered until the data is sent) */
    r->bounce = c->bounce;
    c->bounce = NULL;
    memcpy(r->iov, c->iov, sizeof(struct iovec) * (size_t)c->niov);
    memcpy(r->pins, c->pins, sizeof(void *) * c->npins);
    r->niov = c->niov;
    r->npins = c->npins;
    c->npins = 0;
    kvli_tcp_conn_push(iface, c, r);
}

/* Start the request's VRAM copies (to_host: a READ's download, else a
 * WRITE's upload) without waiting: the progress thread serves everything
 * else meanwhile, and the copy's end wakes it. */
static void kvli_tcp_conn_stage_start(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, int to_host)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    kvl_error_t e;
    c->stage_write = !to_host;
    c->rphase = KVLI_TCP_RX_STAGE;
    if (ctx->stage_copy(ctx, to_host, c->sp, (size_t)c->nsp, kvli_tcp_stage_notify, iface,
                        &c->ticket, &e) == KVL_OK) {
        atomic_fetch_add(&iface->staging, 1);
        return;
    }
    c->ticket = NULL;
    kvli_tcp_conn_stage_failed(iface, c, &e);
    kvli_tcp_conn_stage_finish(iface, c);
}

/* RX_STAGE: finish the request once its copy is done. */
static void kvli_tcp_conn_stage_poll(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    kvl_error_t e;
    int r;
    if (c->ticket == NULL)
        return;
    r = iface->ctx->stage_test(iface->ctx, c->ticket, 0, &e);
    if (r == 0)
        return;
    c->ticket = NULL;
    atomic_fetch_sub(&iface->staging, 1);
    if (r < 0)
        kvli_tcp_conn_stage_failed(iface, c, &e);
    kvli_tcp_conn_stage_finish(iface, c);
}

/*
 * The initiator reset or closed the connection in the middle of a WRITE's
 * payload (checked before copying, every KVLI_TCP_HUP_CHECK bytes): it gave
 * the request up, so the rest is read and dropped, not written, and so is
 * every later WRITE still queued in the connection; nothing is answered.
 */
static void kvli_tcp_conn_abandon(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    iface->ctx->log(iface->ctx, KVL_LOG_INFO, "agent '%s' (%s) reset or closed its tcp "
                    "connection with a WRITE of %" PRIu64 " bytes unanswered (%" PRIu64
                    " copied): the rest of it and every later request on the connection "
                    "are dropped, not written", c->name, c->addr, c->h.payload, c->pay_got);
    c->abandoned = 1;
    kvli_bounce_put(&iface->bounce, c->bounce);
    c->bounce = NULL;
    c->nsp = 0;
    kvli_tcp_conn_unpin(iface, c);
    c->rphase = KVLI_TCP_RX_DRAIN;
}

/* WRITE/READ ranges are in: check every one before touching anything. */
static void kvli_tcp_conn_rw(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    int write = c->h.type == KVLI_TCP_MSG_WRITE;
    char why[160] = "";
    uint32_t n = c->h.nranges;
    if (c->ranges == NULL) {
        c->ranges = malloc(sizeof(uint64_t) * 2 * KVLI_TCP_RANGES_MAX);
        c->iov = malloc(sizeof(struct iovec) * KVLI_TCP_RANGES_MAX);
        c->pins = malloc(sizeof(void *) * KVLI_TCP_RANGES_MAX);
        c->sp = malloc(sizeof(*c->sp) * KVLI_TCP_RANGES_MAX);
        if (c->ranges == NULL || c->iov == NULL || c->pins == NULL || c->sp == NULL) {
            ctx->log(ctx, KVL_LOG_ERROR, "tcp: out of memory for the ranges of a request from "
                     "%s; dropping the connection", c->addr);
            kvli_tcp_conn_close(iface, c);
            return;
        }
    }
    if (kvli_tcp_proto_ranges_parse(c->body, n, c->h.payload, c->ranges, why, sizeof(why)) != 0) {
        kvli_tcp_conn_proto_error(iface, c, why);
        return;
    }
    c->pay_got = 0;
    c->hup_at = 0;
    if (c->abandoned) {
        /* a request of a connection its initiator gave up: dropped */
        c->rphase = write ? KVLI_TCP_RX_DRAIN : KVLI_TCP_RX_HDR;
        return;
    }
    c->refuse = KVL_OK;
    c->npins = 0;
    c->nsp = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvl_error_t perr;
        void *mh = NULL;
        memset(&perr, 0, offsetof(kvl_error_t, causes));
        kvl_status_t st = ctx->region_pin(ctx, c->ranges[2 * i], c->ranges[2 * i + 1], &mh,
                                          &c->pins[c->npins], &perr);
        if (st != KVL_OK) {
            c->refuse = st;
            snprintf(c->refuse_text, sizeof(c->refuse_text),
                     "agent '%.63s' refused %s of [0x%" PRIx64 ", +%" PRIu64 "): %.140s",
                     ctx->agent_name, write ? "WRITE" : "READ", c->ranges[2 * i],
                     c->ranges[2 * i + 1], perr.what[0] ? perr.what : "not inside registered memory");
            ctx->log(ctx, KVL_LOG_WARN, "request from agent '%s' (%s) refused, nothing touched: %s",
                     c->name, c->addr, c->refuse_text);
            kvli_tcp_conn_unpin(iface, c);
            break;
        }
        c->npins++;
        c->iov[i].iov_base = (void *)(uintptr_t)c->ranges[2 * i];
        c->iov[i].iov_len = (size_t)c->ranges[2 * i + 1];
        if (((const kvli_tcp_mh_t *)mh)->staged)
            c->sp[c->nsp++] = (kvl_stage_piece_t){c->ranges[2 * i], NULL, c->ranges[2 * i + 1],
                                                  ((const kvli_tcp_mh_t *)mh)->dev};
    }
    c->niov = (int)n;
    c->pay_got = 0;
    if (c->refuse == KVL_OK && c->nsp > 0)
        kvli_tcp_conn_stage_prepare(iface, c, write);
    if (write) {
        c->rphase = c->refuse == KVL_OK ? KVLI_TCP_RX_PAYLOAD : KVLI_TCP_RX_DRAIN;
        return;
    }
    c->rphase = KVLI_TCP_RX_HDR;
    if (c->refuse != KVL_OK) {
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(KVLI_TCP_MSG_READ_DATA, c->h.id,
                                                        c->refuse, c->refuse_text, 0, NULL, 0));
        return;
    }
    kvli_tcp_reply_t *r = kvli_tcp_reply_new(KVLI_TCP_MSG_READ_DATA, c->h.id, KVL_OK, NULL,
                                             c->h.payload, NULL, 0);
    if (r != NULL) {
        r->iov = malloc(sizeof(struct iovec) * n);
        r->pins = malloc(sizeof(void *) * n);
    }
    if (r == NULL || r->iov == NULL || r->pins == NULL) {
        kvli_bounce_put(&iface->bounce, c->bounce);
        c->bounce = NULL;
        kvli_tcp_conn_unpin(iface, c);
        if (r != NULL)
            kvli_tcp_reply_free(iface, r);
        kvli_tcp_conn_push(iface, c, NULL);
        return;
    }
    c->stage_reply = r;
    c->stage_write = 0;
    if (c->nsp > 0)
        kvli_tcp_conn_stage_start(iface, c, 1); /* the reply waits for the download */
    else
        kvli_tcp_conn_stage_finish(iface, c);
}

static void kvli_tcp_conn_notif(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    char why[KVLI_TCP_TEXT_MAX];
    kvl_status_t st = KVL_OK;
    uint8_t add[4];
    uint32_t n = 0;
    if (c->h.type == KVLI_TCP_MSG_NOTIF_GRANTED) {
        /* within its grant (protocol 3): queued; answered only when it asks
         * for more (id not 0) */
        if (c->notif_slots == 0) {
            kvli_tcp_conn_proto_error(iface, c, "NOTIF_GRANTED beyond the grant (slots left 0)");
            return;
        }
        c->notif_slots--;
        ctx->notif_offer_reserved(ctx, c->name, c->body, c->body_len, KVLI_TCP_NOTIF_SLOT);
        if (c->h.id == 0)
            return;
        st = KVL_OK;
    } else if (c->h.type == KVLI_TCP_MSG_NOTIF) {
        /* answered (protocol 3): queued, or refused and the sender told why;
         * it gives its unused grant back first */
        if (c->h.aux > c->notif_slots) {
            kvli_tcp_conn_proto_error(iface, c, "NOTIF gives back more slots than granted");
            return;
        }
        if (c->h.aux > 0) {
            c->notif_slots -= (uint32_t)c->h.aux;
            ctx->notif_unreserve(ctx, c->name, (uint32_t)c->h.aux, KVLI_TCP_NOTIF_SLOT);
        }
        st = kvli_notif_take(ctx, c->name, c->body, c->body_len, why, sizeof(why));
        if (st != KVL_OK)
            ctx->log(ctx, KVL_LOG_INFO, "refused a notification from '%s': %s; the sender is "
                     "told", c->name, why);
    }
    if (c->h.type != KVLI_TCP_MSG_CANCELED) {
        /* top its grant up, within the room left */
        if (kvli_notif_grants(ctx))
            n = ctx->notif_reserve(ctx, c->name, c->notif_slots, KVLI_TCP_NOTIF_SLOT);
        if (n > KVLI_TCP_NOTIF_GRANT_MAX) {
            ctx->notif_unreserve(ctx, c->name, n - KVLI_TCP_NOTIF_GRANT_MAX, KVLI_TCP_NOTIF_SLOT);
            n = KVLI_TCP_NOTIF_GRANT_MAX;
        }
        c->notif_slots += n;
        kvli_put32(add, n);
        kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(KVLI_TCP_MSG_NOTIF_ACK, c->h.id, st,
                                                        st == KVL_OK ? NULL : why, 0, add, 4));
        return;
    }
    /* A cancelled transfer's notification: the prefix tells the application. */
    size_t pl = sizeof(KVLI_TCP_CANCEL_PREFIX) - 1, ml = c->body_len;
    uint8_t *b = malloc(pl + ml);
    if (ml > KVLI_TCP_NOTIF_MAX - pl)
        ml = KVLI_TCP_NOTIF_MAX - pl;
    if (b == NULL) {
        ctx->log(ctx, KVL_LOG_ERROR, "tcp: out of memory for the CANCELED notice of agent '%s'",
                 c->name);
        return;
    }
    memcpy(b, KVLI_TCP_CANCEL_PREFIX, pl);
    memcpy(b + pl, c->body, ml);
    /* unanswered: its transfer already ended as cancelled on the sender */
    st = kvli_notif_take(ctx, c->name, b, pl + ml, why, sizeof(why));
    if (st != KVL_OK)
        ctx->log(ctx, KVL_LOG_WARN, "dropped the CANCELED notice of a transfer from '%s': %s",
                 c->name, why);
    free(b);
}

/* One step of reading; 1: continue, 0: wait for the socket, -1: closed. */
static int kvli_tcp_conn_rx_step(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, uint64_t *budget)
{
    char why[160] = "";
    int r;
    if (c->state == KVLI_TCP_CONN_AUTH1 || c->state == KVLI_TCP_CONN_AUTH3) {
        size_t want = c->state == KVLI_TCP_CONN_AUTH1 ? KVLI_AUTH1_LEN : KVLI_AUTH3_LEN;
        if (kvli_tcp_conn_body_reserve(c, KVLI_AUTH2_LEN) != 0)
            return -1;
        r = kvli_tcp_conn_recv(iface, c, c->body, want, &c->body_got);
        if (r <= 0)
            return r;
        c->body_got = 0;
        kvli_tcp_conn_auth(iface, c);
        return c->state == KVLI_TCP_CONN_CLOSED ? -1 : 1;
    }
    if (c->state != KVLI_TCP_CONN_HELLO && c->state != KVLI_TCP_CONN_READY)
        return 0;
    switch (c->rphase) {
    case KVLI_TCP_RX_HDR:
        r = kvli_tcp_conn_recv(iface, c, c->hbuf, KVLI_TCP_HDR_LEN, &c->hgot);
        if (r <= 0)
            return r;
        c->hgot = 0;
        if (kvli_tcp_proto_hdr_parse(c->hbuf, KVLI_TCP_DIR_REQUEST, &c->h, why, sizeof(why)) != 0) {
            kvli_tcp_conn_proto_error(iface, c, why);
            return -1;
        }
        if ((c->state == KVLI_TCP_CONN_HELLO) != (c->h.type == KVLI_TCP_MSG_HELLO)) {
            kvli_tcp_conn_proto_error(iface, c, c->state == KVLI_TCP_CONN_HELLO
                                      ? "a request before HELLO" : "a second HELLO");
            return -1;
        }
        c->body_len = c->h.type == KVLI_TCP_MSG_WRITE ? 16u * (size_t)c->h.nranges
                                                      : (size_t)c->h.len;
        c->body_got = 0;
        if (kvli_tcp_conn_body_reserve(c, c->body_len + 1) != 0) {
            kvli_tcp_conn_proto_error(iface, c, "out of memory for a message body");
            return -1;
        }
        c->rphase = KVLI_TCP_RX_BODY;
        return 1;
    case KVLI_TCP_RX_BODY:
        r = kvli_tcp_conn_recv(iface, c, c->body, c->body_len, &c->body_got);
        if (r <= 0)
            return r;
        c->rphase = KVLI_TCP_RX_HDR;
        switch (c->h.type) {
        case KVLI_TCP_MSG_HELLO:
            kvli_tcp_conn_hello(iface, c);
            break;
        case KVLI_TCP_MSG_NOTIF:
        case KVLI_TCP_MSG_NOTIF_GRANTED:
        case KVLI_TCP_MSG_CANCELED:
            kvli_tcp_conn_notif(iface, c);
            break;
        default:
            kvli_tcp_conn_rw(iface, c);
            break;
        }
        return c->state == KVLI_TCP_CONN_CLOSED ? -1 : 1;
    case KVLI_TCP_RX_PAYLOAD: {
        /* WRITE data lands straight in our registered memory, but only
         * while the initiator still holds the connection. */
        struct msghdr mh;
        ssize_t n;
        if (c->pay_got == 0 || c->pay_got - c->hup_at >= KVLI_TCP_HUP_CHECK) {
            c->hup_at = c->pay_got;
            if (kvli_sock_peer_gone(c->fd)) {
                kvli_tcp_conn_abandon(iface, c);
                return 1;
            }
        }
        int k = kvli_tcp_iov_append(iface->tx_iov, 0, 1024, c->iov, c->niov,
                                    (size_t)c->pay_got);
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iface->tx_iov;
        mh.msg_iovlen = (size_t)k;
        n = recvmsg(c->fd, &mh, MSG_DONTWAIT);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (n < 0 && errno == EINTR)
                return 1;
            iface->ctx->log(iface->ctx, KVL_LOG_INFO, "agent '%s' (%s) closed its tcp "
                            "connection in the middle of a WRITE (%" PRIu64 " of %" PRIu64
                            " bytes in)", c->name, c->addr, c->pay_got, c->h.payload);
            kvli_tcp_conn_close(iface, c);
            return -1;
        }
        c->progress_ns = kvli_clock_ns();
        c->pay_got += (uint64_t)n;
        *budget = (uint64_t)n >= *budget ? 0 : *budget - (uint64_t)n;
        if (c->pay_got < c->h.payload)
            return 1;
        /* VRAM ranges: the upload runs before the acknowledgement */
        c->stage_write = 1;
        if (c->nsp > 0)
            kvli_tcp_conn_stage_start(iface, c, 0);
        else
            kvli_tcp_conn_stage_finish(iface, c);
        return 1;
    }
    case KVLI_TCP_RX_STAGE:
        return 0; /* not read until the copy is done */
    case KVLI_TCP_RX_DRAIN: {
        size_t want = c->h.payload - c->pay_got < iface->scratch_len
                          ? (size_t)(c->h.payload - c->pay_got) : iface->scratch_len;
        size_t got = 0;
        r = kvli_tcp_conn_recv(iface, c, iface->scratch, want, &got);
        c->pay_got += got;
        *budget = got >= *budget ? 0 : *budget - got;
        if (r < 0)
            return -1;
        if (c->pay_got < c->h.payload)
            return r;
        c->rphase = KVLI_TCP_RX_HDR;
        if (!c->abandoned)
            kvli_tcp_conn_push(iface, c, kvli_tcp_reply_new(KVLI_TCP_MSG_WRITE_ACK, c->h.id,
                                                            c->refuse, c->refuse_text, 0, NULL,
                                                            0));
        return 1;
    }
    default:
        return -1;
    }
}

void kvli_tcp_conn_progress(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, short revents)
{
    uint64_t budget = KVLI_TCP_BUDGET;
    if (c->rphase == KVLI_TCP_RX_STAGE) {
        kvli_tcp_conn_stage_poll(iface, c);
        if (c->rphase == KVLI_TCP_RX_STAGE)
            revents &= (short)~POLLIN;
    }
    if (c->oq_head != NULL)
        kvli_tcp_conn_flush(iface, c);
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
        while (budget > 0 && c->state != KVLI_TCP_CONN_CLOSED &&
               c->state != KVLI_TCP_CONN_DRAINING && c->oq_n < KVLI_TCP_OUTQ_MAX) {
            if (kvli_tcp_conn_rx_step(iface, c, &budget) <= 0)
                break;
        }
    }
    if (c->oq_head != NULL)
        kvli_tcp_conn_flush(iface, c);
}

void kvli_tcp_conn_check(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, uint64_t now)
{
    uint64_t tmo = iface->timeout_ms * 1000000u;
    if (c->state == KVLI_TCP_CONN_CLOSED)
        return;
    if (c->state < KVLI_TCP_CONN_READY || c->state == KVLI_TCP_CONN_DRAINING) {
        if (now > c->deadline_ns) {
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "dropping the tcp connection from %s: "
                            "authentication and HELLO did not complete within %" PRIu64 " ms",
                            c->addr, iface->timeout_ms);
            kvli_tcp_conn_close(iface, c);
        }
        return;
    }
    if ((c->rphase != KVLI_TCP_RX_HDR || c->hgot > 0 || c->oq_head != NULL) &&
        now > c->progress_ns && now - c->progress_ns > tmo) {
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "dropping the tcp connection from agent '%s' "
                        "(%s): no progress for %" PRIu64 " ms in the middle of a message or "
                        "with replies it does not read", c->name, c->addr, iface->timeout_ms);
        kvli_tcp_conn_close(iface, c);
    }
}
