/*
 * kvlane shm backend: the target side. Connections peers open to this agent
 * (accepted by the progress thread): who may connect (uid, shared secret),
 * HELLO, the memfds of shareable allocations (FD_REQ), WRITE/READ through
 * the socket checked against registered memory, notifications, replies.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include "common/errname.h"
#include "common/mac.h"
#include "common/notif_full.h"
#include "common/sock.h"
#include "shm.h"
#include "shm_proto.h"

static void kvli_shm_outq_free(kvli_shm_iface_t *iface, kvli_shm_outq_t *q)
{
    unsigned i;
    for (i = 0; i < q->npins; i++)
        iface->ctx->region_unpin(iface->ctx, q->pins[i]);
    if (q->fd >= 0)
        close(q->fd);
    free(q->pins);
    free(q->iov);
    free(q);
}

void kvli_shm_conn_free(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
{
    kvli_shm_outq_t *q = c->out_head, *nq;
    for (; q != NULL; q = nq) {
        nq = q->next;
        kvli_shm_outq_free(iface, q);
    }
    kvli_shm_guard_close(iface, c);
    if (c->notif_slots > 0)
        iface->ctx->notif_unreserve(iface->ctx, c->name, c->notif_slots, KVLI_SHM_NOTIF_SLOT);
    close(c->fd);
    free(c);
}

/* Send queued replies without blocking: the progress thread must never wait
 * on a peer's reader, or two agents reading from each other could deadlock. */
void kvli_shm_conn_flush(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
{
    struct iovec tmp[KVLI_SHM_IOV_MAX];
    while (c->out_head != NULL && !c->closing) {
        kvli_shm_outq_t *q = c->out_head;
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } cbuf;
        struct msghdr mh;
        size_t skip = q->sent;
        int n = 0, i = 0, first;
        ssize_t rc;

        /* Start at the entry holding byte q->sent, so a reply of 1024 ranges
         * plus its header still fits the kernel's iovec limit per call. */
        if (skip < q->hdr_len) {
            tmp[n].iov_base = q->hdr;
            tmp[n++].iov_len = q->hdr_len;
        } else {
            skip -= q->hdr_len;
            while (i < q->iovcnt && skip >= q->iov[i].iov_len)
                skip -= q->iov[i++].iov_len;
        }
        for (; i < q->iovcnt && n < KVLI_SHM_IOV_MAX; i++)
            tmp[n++] = q->iov[i];
        first = kvli_iov_advance(tmp, n, skip);
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = tmp + first;
        mh.msg_iovlen = (size_t)(n - first);
        if (q->fd >= 0 && q->sent == 0) {
            struct cmsghdr *cm;
            memset(&cbuf, 0, sizeof(cbuf));
            mh.msg_control = cbuf.buf;
            mh.msg_controllen = sizeof(cbuf.buf);
            cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &q->fd, sizeof(int));
        }
        rc = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (rc < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
                return;
            iface->ctx->log(iface->ctx, KVL_LOG_INFO,
                            "sendmsg() to agent '%s' (pid %d) = -1 %s (%s); "
                            "dropping the connection", c->name, (int)c->cred_pid,
                            kvli_errno_name(e), strerror(e));
            c->closing = 1;
            return;
        }
        q->sent += (size_t)rc;
        if (q->sent >= q->total) {
            c->out_head = q->next;
            if (c->out_head == NULL)
                c->out_tail = NULL;
            kvli_shm_outq_free(iface, q);
        } else if (q->fd >= 0 && rc > 0) {
            /* The kernel took the fd with the first bytes. */
            close(q->fd);
            q->fd = -1;
        }
    }
}

static kvli_shm_outq_t *kvli_shm_reply_new(uint32_t type, uint64_t id,
                                           kvl_status_t status, const char *text,
                                           uint64_t payload)
{
    kvli_shm_outq_t *q = calloc(1, sizeof(*q));
    kvli_shm_msg_hdr_t h;
    kvli_shm_msg_reply_t r;
    size_t tl = text ? strlen(text) : 0;
    if (q == NULL)
        return NULL;
    if (tl > KVLI_SHM_TEXT_MAX)
        tl = KVLI_SHM_TEXT_MAX;
    h.magic = KVLI_SHM_MSG_MAGIC;
    h.type = type;
    h.id = id;
    h.len = sizeof(r) + tl + (type == KVLI_SHM_MSG_READ_DATA ? payload : 0);
    r.status = status;
    r.text_len = (uint32_t)tl;
    r.payload = payload;
    memcpy(q->hdr, &h, sizeof(h));
    memcpy(q->hdr + sizeof(h), &r, sizeof(r));
    if (tl > 0)
        memcpy(q->hdr + sizeof(h) + sizeof(r), text, tl);
    q->hdr_len = sizeof(h) + sizeof(r) + tl;
    q->total = q->hdr_len;
    q->fd = -1;
    return q;
}

static void kvli_shm_conn_push(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                               kvli_shm_outq_t *q)
{
    if (q == NULL) {
        iface->ctx->log(iface->ctx, KVL_LOG_ERROR,
                        "calloc() of a reply to agent '%s' failed; dropping the "
                        "connection", c->name);
        c->closing = 1;
        return;
    }
    if (c->out_tail != NULL)
        c->out_tail->next = q;
    else
        c->out_head = q;
    c->out_tail = q;
    kvli_shm_conn_flush(iface, c);
}

static void kvli_shm_conn_proto_error(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                                      const char *why, uint64_t v)
{
    iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                    "protocol error on the connection from agent '%s' (pid %d): %s "
                    "(value %" PRIu64 "); dropping the connection",
                    c->hello ? c->name : "(no HELLO yet)", (int)c->cred_pid, why, v);
    c->closing = 1;
}

static void kvli_shm_conn_io_error(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                                   const char *what, int rc)
{
    if (rc == KVLI_SHM_EOF)
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG,
                        "agent '%s' (pid %d) closed its connection during %s",
                        c->name, (int)c->cred_pid, what);
    else
        iface->ctx->log(iface->ctx, KVL_LOG_INFO,
                        "recvmsg() from agent '%s' (pid %d) during %s = -1 %s (%s); "
                        "dropping the connection", c->name, (int)c->cred_pid, what,
                        kvli_errno_name(rc), strerror(rc));
    c->closing = 1;
}

static void kvli_shm_conn_hello(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                                const kvli_shm_msg_hdr_t *h)
{
    kvli_shm_msg_hello_t m;
    kvli_shm_msg_hdr_t rh;
    kvli_shm_outq_t *q;
    size_t nl = strlen(iface->ctx->agent_name ? iface->ctx->agent_name : "");
    uint32_t i;
    int rc;

    /* a name of up to KVL_NAME_MAX - 1 bytes, and the proof of the shared
     * secret after it when the initiator has one */
    if (h->len < sizeof(m) || h->len > sizeof(m) + KVL_NAME_MAX - 1 + KVLI_MAC_LEN) {
        kvli_shm_conn_proto_error(iface, c, "HELLO body length out of range", h->len);
        return;
    }
    rc = kvli_shm_proto_recv(c->fd, iface->scratch, (size_t)h->len, NULL);
    if (rc != 0) {
        kvli_shm_conn_io_error(iface, c, "HELLO", rc);
        return;
    }
    memcpy(&m, iface->scratch, sizeof(m));
    if (m.version != KVLI_SHM_PROTO_VERSION) {
        /* An older initiator does not read a version in HELLO_ACK: closing
         * is the refusal it understands (its error says the peer closed). */
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "refused the connection from pid %d: it "
                        "speaks kvlane shm protocol %u, this agent protocol %u; run the same "
                        "kvlane version on both agents", (int)c->cred_pid, m.version,
                        KVLI_SHM_PROTO_VERSION);
        c->closing = 1;
        return;
    }
    size_t maclen = (m.flags & KVLI_SHM_HELLO_MAC) ? KVLI_MAC_LEN : 0;
    if (m.name_len == 0 || m.name_len > KVL_NAME_MAX - 1 || h->len < sizeof(m) + maclen ||
        m.name_len != h->len - sizeof(m) - maclen) {
        kvli_shm_conn_proto_error(iface, c, "HELLO name length mismatch", m.name_len);
        return;
    }
    for (i = 0; i < m.name_len; i++) {
        uint8_t ch = iface->scratch[sizeof(m) + i];
        if (ch <= 0x20 || ch >= 0x7f) {
            kvli_shm_conn_proto_error(iface, c, "HELLO name has a non-printable byte",
                                      ch);
            return;
        }
    }
    memcpy(c->name, iface->scratch + sizeof(m), m.name_len);
    c->name[m.name_len] = '\0';
    if (iface->ctx->secret_len > 0) {
        uint8_t want[KVLI_MAC_LEN];
        kvli_shm_hello_mac(iface->ctx, 0, iface->ctx->incarnation, m.incarnation, c->name,
                           m.name_len, want);
        if (maclen == 0 || !kvli_mac_equal(want, iface->scratch + sizeof(m) + m.name_len,
                                           KVLI_MAC_LEN)) {
            iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                            "refused agent '%s' (pid %d, uid %u): %s", c->name,
                            (int)c->cred_pid, (unsigned)c->cred_uid,
                            maclen ? "its proof of the shared secret is wrong (another "
                                     "secret)" : "it sent no proof of the shared secret "
                                     "(none set there)");
            c->closing = 1;
            return;
        }
    }
    c->incarnation = m.incarnation;
    c->hello = 1;
    iface->ctx->log(iface->ctx, KVL_LOG_DEBUG,
                    "agent '%s' (pid %d, incarnation %016" PRIx64 ") connected",
                    c->name, (int)c->cred_pid, c->incarnation);

    if (nl > KVL_NAME_MAX - 1)
        nl = KVL_NAME_MAX - 1;
    /* The guard table goes with the answer; without one the initiator uses
     * the socket path only (we copy, into registered memory only). */
    char why[200];
    int gfd = c->guard == NULL ? kvli_shm_guard_open(iface, c, why, sizeof(why)) : -1;
    if (gfd < 0 && c->guard == NULL)
        iface->ctx->log(iface->ctx, KVL_LOG_WARN, "agent '%s' gets no guard table (%s): it "
                        "will reach our memory through the socket only, not by cross-memory "
                        "attach or mapping", c->name, why);
    q = calloc(1, sizeof(*q));
    if (q == NULL && gfd >= 0)
        close(gfd);
    if (q != NULL) {
        rh.magic = KVLI_SHM_MSG_MAGIC;
        rh.type = KVLI_SHM_MSG_HELLO_ACK;
        rh.id = h->id;
        size_t ml = iface->ctx->secret_len > 0 ? KVLI_MAC_LEN : 0;
        uint64_t peer_inc = m.incarnation;
        rh.len = sizeof(m) + nl + ml;
        m.version = KVLI_SHM_PROTO_VERSION;
        m.name_len = (uint32_t)nl;
        m.incarnation = iface->ctx->incarnation;
        m.pid = (uint32_t)getpid();
        m.flags = (ml ? KVLI_SHM_HELLO_MAC : 0) | (gfd >= 0 ? KVLI_SHM_HELLO_GUARD : 0);
        memcpy(q->hdr, &rh, sizeof(rh));
        memcpy(q->hdr + sizeof(rh), &m, sizeof(m));
        memcpy(q->hdr + sizeof(rh) + sizeof(m), iface->ctx->agent_name, nl);
        if (ml)
            kvli_shm_hello_mac(iface->ctx, 1, peer_inc, iface->ctx->incarnation,
                               iface->ctx->agent_name, nl, q->hdr + sizeof(rh) + sizeof(m) + nl);
        q->hdr_len = q->total = sizeof(rh) + sizeof(m) + nl + ml;
        q->fd = gfd;
    }
    kvli_shm_conn_push(iface, c, q);
}

static void kvli_shm_conn_fdreq(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                                const kvli_shm_msg_hdr_t *h)
{
    kvli_shm_msg_fdreq_t m;
    kvli_shm_outq_t *q;
    char text[KVLI_SHM_TEXT_MAX];
    kvl_status_t st;
    uint64_t size = 0;
    int fd = -1, rc;

    if (h->len != sizeof(m)) {
        kvli_shm_conn_proto_error(iface, c, "FD_REQ body length", h->len);
        return;
    }
    rc = kvli_shm_proto_recv(c->fd, &m, sizeof(m), NULL);
    if (rc != 0) {
        kvli_shm_conn_io_error(iface, c, "FD_REQ", rc);
        return;
    }
    st = iface->ctx->alloc_lookup(iface->ctx, m.shm_id, &fd, &size);
    if (st != KVL_OK || fd < 0) {
        snprintf(text, sizeof(text),
                 "agent '%s' has no shareable allocation with id %" PRIu64
                 " (alloc_lookup = %d)", iface->ctx->agent_name, m.shm_id, (int)st);
        kvli_shm_conn_push(iface, c, kvli_shm_reply_new(KVLI_SHM_MSG_FD_REPLY, h->id,
                                                        st != KVL_OK ? st
                                                        : KVL_ERR_NOT_FOUND,
                                                        text, 0));
        return;
    }
    /* Our own copy: the allocation may be freed before the reply is sent. */
    fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        snprintf(text, sizeof(text), "agent '%s': fcntl(F_DUPFD_CLOEXEC) = -1 %s (%s)",
                 iface->ctx->agent_name, kvli_errno_name(e), strerror(e));
        kvli_shm_conn_push(iface, c, kvli_shm_reply_new(KVLI_SHM_MSG_FD_REPLY, h->id,
                                                        KVL_ERR_SYSTEM, text, 0));
        return;
    }
    q = kvli_shm_reply_new(KVLI_SHM_MSG_FD_REPLY, h->id, KVL_OK, NULL, size);
    if (q == NULL)
        close(fd);
    else
        q->fd = fd;
    kvli_shm_conn_push(iface, c, q);
}

/*
 * A WRITE's payload into registered memory, one receive at a time, each
 * after checking that the initiator still holds the connection (protocol
 * 4): once it shut it down, it gave the request up, and the rest is read
 * and dropped, as is every later WRITE on the connection (c->abandoned).
 */
static int kvli_shm_conn_recv_payload(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                                      struct iovec *iov, int iovcnt, uint64_t payload)
{
    uint64_t got = 0;
    int first = 0;
    while (got < payload) {
        struct msghdr mh;
        ssize_t n;
        if (kvli_sock_peer_gone(c->fd)) {
            iface->ctx->log(iface->ctx, KVL_LOG_INFO, "agent '%s' (pid %d) shut its "
                            "connection down with a WRITE of %" PRIu64 " bytes unanswered (%"
                            PRIu64 " copied): the rest of it and every later request on the "
                            "connection are dropped, not written", c->name, (int)c->cred_pid,
                            payload, got);
            c->abandoned = 1;
            return kvli_shm_proto_drain(c->fd, payload - got, iface->scratch,
                                        iface->scratch_len);
        }
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov + first;
        mh.msg_iovlen = (size_t)(iovcnt - first);
        if (mh.msg_iovlen > KVLI_SHM_IOV_MAX)
            mh.msg_iovlen = KVLI_SHM_IOV_MAX;
        n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno; /* EAGAIN: SO_RCVTIMEO expired */
        }
        if (n == 0)
            return KVLI_SHM_EOF;
        got += (uint64_t)n;
        first += kvli_iov_advance(iov + first, iovcnt - first, (size_t)n);
        while (first < iovcnt && iov[first].iov_len == 0)
            first++;
    }
    return 0;
}

/*
 * WRITE and READ from a peer: every range must lie in memory this agent
 * registered (ctx->region_pin); a refused request touches no byte.
 */
static void kvli_shm_conn_rw(kvli_shm_iface_t *iface, kvli_shm_conn_t *c,
                             const kvli_shm_msg_hdr_t *h)
{
    kvli_shm_msg_rw_t m;
    uint64_t *ranges = (uint64_t *)(void *)iface->scratch;
    struct iovec *iov = NULL;
    char text[KVLI_SHM_TEXT_MAX];
    kvl_status_t st = KVL_OK;
    uint64_t sum = 0, want;
    uint32_t i, npinned = 0;
    int write = h->type == KVLI_SHM_MSG_WRITE;
    int rc;

    if (h->len < sizeof(m)) {
        kvli_shm_conn_proto_error(iface, c, "WRITE/READ body too short", h->len);
        return;
    }
    rc = kvli_shm_proto_recv(c->fd, &m, sizeof(m), NULL);
    if (rc != 0) {
        kvli_shm_conn_io_error(iface, c, "WRITE/READ", rc);
        return;
    }
    if (m.nranges == 0 || m.nranges > KVLI_SHM_IOV_MAX) {
        kvli_shm_conn_proto_error(iface, c, "range count out of 1..1024", m.nranges);
        return;
    }
    if (m.payload == 0 || m.payload > KVLI_SHM_PAYLOAD_MAX) {
        kvli_shm_conn_proto_error(iface, c, "payload size out of range", m.payload);
        return;
    }
    want = sizeof(m) + (uint64_t)m.nranges * 16u + (write ? m.payload : 0);
    if (h->len != want) {
        kvli_shm_conn_proto_error(iface, c, "body length disagrees with ranges",
                                  h->len);
        return;
    }
    rc = kvli_shm_proto_recv(c->fd, ranges, (size_t)m.nranges * 16u, NULL);
    if (rc != 0) {
        kvli_shm_conn_io_error(iface, c, "WRITE/READ ranges", rc);
        return;
    }
    for (i = 0; i < m.nranges; i++) {
        uint64_t a = ranges[2 * i], l = ranges[2 * i + 1];
        if (l == 0 || a + l < a || sum + l < sum) {
            kvli_shm_conn_proto_error(iface, c, "empty or wrapping range", a);
            return;
        }
        sum += l;
    }
    if (sum != m.payload) {
        kvli_shm_conn_proto_error(iface, c, "ranges do not add up to the payload", sum);
        return;
    }
    if (c->abandoned) {
        /* a request of a connection its initiator gave up: dropped */
        rc = write ? kvli_shm_proto_drain(c->fd, m.payload, iface->scratch,
                                          iface->scratch_len) : 0;
        if (rc != 0)
            kvli_shm_conn_io_error(iface, c, "dropped WRITE payload", rc);
        return;
    }

    for (i = 0; i < m.nranges; i++) {
        kvl_error_t perr;
        void *mh = NULL;
        memset(&perr, 0, sizeof(perr));
        st = iface->ctx->region_pin(iface->ctx, ranges[2 * i], ranges[2 * i + 1], &mh,
                                    &iface->pins[i], &perr);
        if (st != KVL_OK) {
            snprintf(text, sizeof(text),
                     "agent '%s' refused %s of [0x%" PRIx64 ", +%" PRIu64 "): %.160s",
                     iface->ctx->agent_name, write ? "WRITE" : "READ",
                     ranges[2 * i], ranges[2 * i + 1],
                     perr.what[0] ? perr.what : "not inside registered memory");
            /* the reply carries at most KVLI_SHM_TEXT_MAX bytes of it; the log
             * has the whole reason */
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "request from agent '%s' "
                            "(pid %d) refused: %s of [0x%" PRIx64 ", +%" PRIu64 "): %s",
                            c->name, (int)c->cred_pid, write ? "WRITE" : "READ",
                            ranges[2 * i], ranges[2 * i + 1],
                            perr.what[0] ? perr.what : "not inside registered memory");
            break;
        }
        npinned++;
    }
    if (st == KVL_OK) {
        iov = malloc(sizeof(*iov) * m.nranges);
        if (iov == NULL) {
            st = KVL_ERR_NO_MEMORY;
            snprintf(text, sizeof(text), "agent '%s': malloc(%zu) failed",
                     iface->ctx->agent_name, sizeof(*iov) * m.nranges);
        } else {
            for (i = 0; i < m.nranges; i++) {
                iov[i].iov_base = (void *)(uintptr_t)ranges[2 * i];
                iov[i].iov_len = (size_t)ranges[2 * i + 1];
            }
        }
    }

    if (!write) {
        kvli_shm_outq_t *q;
        if (st != KVL_OK) {
            for (i = 0; i < npinned; i++)
                iface->ctx->region_unpin(iface->ctx, iface->pins[i]);
            free(iov);
            kvli_shm_conn_push(iface, c, kvli_shm_reply_new(KVLI_SHM_MSG_READ_DATA,
                                                            h->id, st, text, 0));
            return;
        }
        q = kvli_shm_reply_new(KVLI_SHM_MSG_READ_DATA, h->id, KVL_OK, NULL, m.payload);
        if (q != NULL)
            q->pins = malloc(sizeof(void *) * npinned);
        if (q == NULL || q->pins == NULL) {
            for (i = 0; i < npinned; i++)
                iface->ctx->region_unpin(iface->ctx, iface->pins[i]);
            free(iov);
            if (q != NULL)
                free(q);
            kvli_shm_conn_push(iface, c, NULL);
            return;
        }
        /* The pins keep the memory registered until the data is sent. */
        memcpy(q->pins, iface->pins, sizeof(void *) * npinned);
        q->npins = npinned;
        q->iov = iov;
        q->iovcnt = (int)m.nranges;
        q->total += m.payload;
        kvli_shm_conn_push(iface, c, q);
        return;
    }

    if (st == KVL_OK) {
        rc = kvli_shm_conn_recv_payload(iface, c, iov, (int)m.nranges, m.payload);
    } else {
        rc = kvli_shm_proto_drain(c->fd, m.payload, iface->scratch, iface->scratch_len);
    }
    for (i = 0; i < npinned; i++)
        iface->ctx->region_unpin(iface->ctx, iface->pins[i]);
    free(iov);
    if (rc != 0) {
        kvli_shm_conn_io_error(iface, c, "WRITE payload", rc);
        return;
    }
    if (c->abandoned)
        return; /* nobody waits for the answer */
    kvli_shm_conn_push(iface, c, kvli_shm_reply_new(KVLI_SHM_MSG_WRITE_ACK, h->id, st,
                                                    st == KVL_OK ? NULL : text, 0));
}

void kvli_shm_conn_progress(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
{
    kvli_shm_msg_hdr_t h;
    int rc = kvli_shm_proto_recv(c->fd, &h, sizeof(h), NULL);
    if (rc != 0) {
        kvli_shm_conn_io_error(iface, c, "a message header", rc);
        return;
    }
    if (h.magic != KVLI_SHM_MSG_MAGIC) {
        kvli_shm_conn_proto_error(iface, c, "bad message magic", h.magic);
        return;
    }
    if (!c->hello && h.type != KVLI_SHM_MSG_HELLO) {
        kvli_shm_conn_proto_error(iface, c, "message before HELLO", h.type);
        return;
    }
    switch (h.type) {
    case KVLI_SHM_MSG_HELLO:
        kvli_shm_conn_hello(iface, c, &h);
        break;
    case KVLI_SHM_MSG_NOTIF:
    case KVLI_SHM_MSG_NOTIF_GRANTED:
        if (h.type == KVLI_SHM_MSG_NOTIF_GRANTED &&
            (c->notif_slots == 0 || h.len > KVLI_SHM_NOTIF_SLOT)) {
            kvli_shm_conn_proto_error(iface, c, c->notif_slots == 0
                                      ? "NOTIF_GRANTED beyond the grant (slots left 0)"
                                      : "NOTIF_GRANTED longer than a slot", h.len);
            return;
        }
        if (h.type == KVLI_SHM_MSG_NOTIF) {
            kvli_shm_msg_notif_t nm;
            if (h.len < sizeof(nm) || h.len - sizeof(nm) > KVL_NOTIF_MAX) {
                kvli_shm_conn_proto_error(iface, c, "NOTIF longer than KVL_NOTIF_MAX", h.len);
                return;
            }
            rc = kvli_shm_proto_recv(c->fd, &nm, sizeof(nm), NULL);
            if (rc != 0) {
                kvli_shm_conn_io_error(iface, c, "NOTIF", rc);
                return;
            }
            if (nm.surrender > c->notif_slots) {
                kvli_shm_conn_proto_error(iface, c, "NOTIF gives back more slots than granted",
                                          nm.surrender);
                return;
            }
            if (nm.surrender > 0) {
                c->notif_slots -= nm.surrender;
                iface->ctx->notif_unreserve(iface->ctx, c->name, nm.surrender,
                                            KVLI_SHM_NOTIF_SLOT);
            }
            h.len -= sizeof(nm);
        }
        rc = kvli_shm_proto_recv(c->fd, iface->scratch, (size_t)h.len, NULL);
        if (rc != 0) {
            kvli_shm_conn_io_error(iface, c, "NOTIF", rc);
            return;
        }
        {
            char why[KVLI_SHM_TEXT_MAX];
            uint32_t add = 0;
            kvl_status_t st;
            if (h.type == KVLI_SHM_MSG_NOTIF_GRANTED) {
                /* within the grant: queued; answered only when it asks for
                 * more (id not 0), which its sender does not wait for */
                c->notif_slots--;
                st = iface->ctx->notif_offer_reserved(iface->ctx, c->name, iface->scratch,
                                                      (size_t)h.len, KVLI_SHM_NOTIF_SLOT);
                if (h.id == 0)
                    break;
                st = KVL_OK;
            } else {
                st = kvli_notif_take(iface->ctx, c->name, iface->scratch, (size_t)h.len, why,
                                     sizeof(why));
                if (st != KVL_OK)
                    iface->ctx->log(iface->ctx, KVL_LOG_INFO, "refused a notification from "
                                    "'%s': %s; the sender is told", c->name, why);
            }
            /* top its grant up, within the room left */
            if (kvli_notif_grants(iface->ctx))
                add = iface->ctx->notif_reserve(iface->ctx, c->name, c->notif_slots,
                                                KVLI_SHM_NOTIF_SLOT);
            if (add > KVLI_SHM_NOTIF_GRANT_MAX) {
                iface->ctx->notif_unreserve(iface->ctx, c->name, add - KVLI_SHM_NOTIF_GRANT_MAX,
                                            KVLI_SHM_NOTIF_SLOT);
                add = KVLI_SHM_NOTIF_GRANT_MAX;
            }
            c->notif_slots += add;
            kvli_shm_conn_push(iface, c, kvli_shm_reply_new(KVLI_SHM_MSG_NOTIF_ACK, h.id, st,
                                                            st == KVL_OK ? NULL : why, add));
        }
        break;
    case KVLI_SHM_MSG_FD_REQ:
        kvli_shm_conn_fdreq(iface, c, &h);
        break;
    case KVLI_SHM_MSG_WRITE:
    case KVLI_SHM_MSG_READ:
        kvli_shm_conn_rw(iface, c, &h);
        break;
    default:
        kvli_shm_conn_proto_error(iface, c, "unexpected message type", h.type);
        break;
    }
}

void kvli_shm_accept(kvli_shm_iface_t *iface)
{
    for (;;) {
        kvli_shm_conn_t *c;
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        int fd = accept4(iface->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            /* out of descriptors: paused, so the pending connection does not
             * spin this thread (common/accept.h) */
            if (!kvli_accept_failed(&iface->accept_bo, e) && e != EAGAIN &&
                e != EWOULDBLOCK && e != EINTR)
                iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                                "accept4(%s) = -1 %s (%s)", iface->sock_name,
                                kvli_errno_name(e), strerror(e));
            return;
        }
        kvli_accept_ok(&iface->accept_bo);
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            return;
        }
        c->fd = fd;
        snprintf(c->name, sizeof(c->name), "?");
        memset(&cred, 0, sizeof(cred));
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
            !kvli_shm_uid_allowed(iface, cred.uid)) {
            int e = errno;
            if (cl == sizeof(cred) && cred.pid != 0)
                iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                                "refused a connection from pid %d uid %u on %s: only uid %u "
                                "(ours) may connect (shm parameter allow_uids)",
                                (int)cred.pid, (unsigned)cred.uid, iface->sock_name,
                                (unsigned)geteuid());
            else
                iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                                "refused a connection on %s: getsockopt(SO_PEERCRED) = -1 %s "
                                "(%s)", iface->sock_name, kvli_errno_name(e), strerror(e));
            close(fd);
            free(c);
            continue;
        }
        c->cred_pid = cred.pid;
        c->cred_uid = cred.uid;
        /* Bound the blocking reads of a request's body and payload. */
        kvli_shm_sock_set_timeouts(fd, iface->timeout_ms);
        c->next = iface->conns;
        iface->conns = c;
    }
}

