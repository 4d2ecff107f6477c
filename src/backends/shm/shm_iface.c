/*
 * kvlane shm backend: the interface object. open/close, the listening
 * socket, the progress thread (which also serves the target side of every
 * accepted connection) and the ops table, the one exported symbol.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include "common/errname.h"
#include "shm.h"
#include "common/mac.h"
#include "shm_proto.h"

/* Progress scratch: the largest body read into it is a NOTIF (64 KiB) */
#define KVLI_SHM_SCRATCH (KVL_NOTIF_MAX + 4096)

static const kvl_param_t kvli_shm_params[] = {
    { "cma", "auto" },
    { "socket_dir", "" },
    { "allow_uids", "self" },     /* self | any | comma-separated uids besides ours */
    { NULL, NULL }
};

/* ---- small shared helpers ---- */

uint64_t kvli_shm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void kvli_shm_hello_mac(const kvl_bk_ctx_t *ctx, int ack, uint64_t first_inc,
                        uint64_t second_inc, const char *name, size_t name_len, uint8_t *out)
{
    static const char lh[] = "kvlane-shm-v2 hello", la[] = "kvlane-shm-v2 ack";
    uint8_t a[8], b[8];
    for (int k = 0; k < 8; k++) {
        a[k] = (uint8_t)(first_inc >> (8 * k));
        b[k] = (uint8_t)(second_inc >> (8 * k));
    }
    kvli_mac_part_t parts[4] = {{ack ? la : lh, ack ? sizeof(la) - 1 : sizeof(lh) - 1},
                                {a, 8}, {b, 8}, {name, name_len}};
    kvli_mac(ctx->secret, ctx->secret_len, parts, 4, out);
}

int kvli_shm_uid_allowed(const kvli_shm_iface_t *iface, uid_t uid)
{
    if (iface->uid_any || uid == geteuid())
        return 1;
    for (unsigned i = 0; i < iface->nuids; i++)
        if (iface->uids[i] == uid)
            return 1;
    return 0;
}

void kvli_shm_deadline(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000u);
    ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}


int kvli_shm_sock_set_timeouts(int fd, uint64_t ms)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000u);
    tv.tv_usec = (suseconds_t)(ms % 1000u) * 1000;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0)
        return errno;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
        return errno;
    return 0;
}

void kvli_shm_iface_wake(kvli_shm_iface_t *iface)
{
    uint64_t one = 1;
    ssize_t n = write(iface->wake_fd, &one, sizeof(one));
    (void)n; /* a full counter already means "wake up" */
}

static kvl_status_t kvli_shm_read_boot_id(char *buf, size_t cap, kvl_error_t *err)
{
    static const char path[] = "/proc/sys/kernel/random/boot_id";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;
    if (fd < 0) {
        int e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "open(%s) = -1 %s (%s): cannot tell which host this is",
                         path, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "mount /proc (the shm backend compares boot ids to "
                          "be sure both agents share one machine)");
        return KVL_ERR_SYSTEM;
    }
    n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 36) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, KVLI_SHM_NAME, -1,
                         "read(%s) = %zd: expected a 36-character boot id", path, n);
        kvl_bk_error_hint(err, "check that /proc is a real procfs mount");
        return KVL_ERR_SYSTEM;
    }
    buf[36] = '\0';
    return KVL_OK;
}

static kvl_status_t kvli_shm_ns_ino(const char *path, uint64_t *ino_p, kvl_error_t *err)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "stat(%s) = -1 %s (%s)", path, kvli_errno_name(e),
                         strerror(e));
        kvl_bk_error_hint(err, "mount /proc; the shm backend checks that both "
                          "agents share pid and network namespaces");
        return KVL_ERR_SYSTEM;
    }
    *ino_p = (uint64_t)st.st_ino;
    return KVL_OK;
}

/* ---- target side: accepted connections ---- */

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

static void kvli_shm_conn_free(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
{
    kvli_shm_outq_t *q = c->out_head, *nq;
    for (; q != NULL; q = nq) {
        nq = q->next;
        kvli_shm_outq_free(iface, q);
    }
    close(c->fd);
    free(c);
}

/* Send queued replies without blocking: the progress thread must never wait
 * on a peer's reader, or two agents reading from each other could deadlock. */
static void kvli_shm_conn_flush(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
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
        first = kvli_shm_proto_iov_advance(tmp, n, skip);
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

    if (h->len < sizeof(m) || h->len > sizeof(m) + KVL_NAME_MAX - 1) {
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
        kvli_shm_conn_proto_error(iface, c, "HELLO protocol version not supported",
                                  m.version);
        return;
    }
    size_t maclen = (m.flags & KVLI_SHM_HELLO_MAC) ? KVLI_MAC_LEN : 0;
    if (m.name_len == 0 || h->len < sizeof(m) + maclen ||
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
    q = calloc(1, sizeof(*q));
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
        m.flags = ml ? KVLI_SHM_HELLO_MAC : 0;
        memcpy(q->hdr, &rh, sizeof(rh));
        memcpy(q->hdr + sizeof(rh), &m, sizeof(m));
        memcpy(q->hdr + sizeof(rh) + sizeof(m), iface->ctx->agent_name, nl);
        if (ml)
            kvli_shm_hello_mac(iface->ctx, 1, peer_inc, iface->ctx->incarnation,
                               iface->ctx->agent_name, nl, q->hdr + sizeof(rh) + sizeof(m) + nl);
        q->hdr_len = q->total = sizeof(rh) + sizeof(m) + nl + ml;
        q->fd = -1;
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
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "request from agent '%s' "
                            "(pid %d) refused: %s", c->name, (int)c->cred_pid, text);
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
        rc = kvli_shm_proto_recvv(c->fd, iov, (int)m.nranges);
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
    kvli_shm_conn_push(iface, c, kvli_shm_reply_new(KVLI_SHM_MSG_WRITE_ACK, h->id, st,
                                                    st == KVL_OK ? NULL : text, 0));
}

static void kvli_shm_conn_progress(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
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
        if (h.len > KVL_NOTIF_MAX) {
            kvli_shm_conn_proto_error(iface, c, "NOTIF longer than KVL_NOTIF_MAX", h.len);
            return;
        }
        rc = kvli_shm_proto_recv(c->fd, iface->scratch, (size_t)h.len, NULL);
        if (rc != 0) {
            kvli_shm_conn_io_error(iface, c, "NOTIF", rc);
            return;
        }
        iface->ctx->notif_deliver(iface->ctx, c->name, iface->scratch, (size_t)h.len);
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

static void kvli_shm_accept(kvli_shm_iface_t *iface)
{
    for (;;) {
        kvli_shm_conn_t *c;
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        int fd = accept4(iface->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e != EAGAIN && e != EWOULDBLOCK && e != EINTR)
                iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                                "accept4(%s) = -1 %s (%s)", iface->sock_name,
                                kvli_errno_name(e), strerror(e));
            return;
        }
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

static void *kvli_shm_progress_main(void *arg)
{
    kvli_shm_iface_t *iface = arg;
    struct pollfd *pfd = NULL;
    void **who = NULL;
    size_t cap = 0;

    for (;;) {
        kvli_shm_peer_t *p;
        kvli_shm_conn_t *c, **cp;
        size_t n = 0, need = 2, i, npeers;

        pthread_mutex_lock(&iface->lock);
        if (atomic_load(&iface->stopping)) {
            pthread_mutex_unlock(&iface->lock);
            break;
        }
        /* Once detached here, this thread never touches the peer again. */
        for (p = iface->peers; p != NULL; p = p->next) {
            if (p->unloading && !p->detached) {
                p->detached = 1;
                pthread_cond_broadcast(&iface->cond);
            }
            need++;
        }
        for (c = iface->conns; c != NULL; c = c->next)
            need++;
        if (need > cap) {
            struct pollfd *np = realloc(pfd, need * sizeof(*pfd));
            void **nw;
            if (np != NULL)
                pfd = np;
            nw = realloc(who, need * sizeof(*who));
            if (nw != NULL)
                who = nw;
            if (np == NULL || nw == NULL) {
                pthread_mutex_unlock(&iface->lock);
                iface->ctx->log(iface->ctx, KVL_LOG_ERROR,
                                "realloc() of the poll set failed; retrying");
                poll(NULL, 0, 10);
                continue;
            }
            cap = need;
        }
        pfd[n].fd = iface->wake_fd;
        pfd[n].events = POLLIN;
        who[n++] = NULL;
        pfd[n].fd = iface->listen_fd;
        pfd[n].events = POLLIN;
        who[n++] = NULL;
        for (p = iface->peers; p != NULL; p = p->next) {
            if (p->detached || atomic_load(&p->dead))
                continue;
            pfd[n].fd = p->fd;
            pfd[n].events = POLLIN;
            who[n++] = p;
        }
        npeers = n;
        pthread_mutex_unlock(&iface->lock);
        for (c = iface->conns; c != NULL; c = c->next) {
            pfd[n].fd = c->fd;
            pfd[n].events = (short)(POLLIN | (c->out_head != NULL ? POLLOUT : 0));
            who[n++] = c;
        }
        for (i = 0; i < n; i++)
            pfd[i].revents = 0;

        if (poll(pfd, (nfds_t)n, -1) < 0 && errno != EINTR) {
            int e = errno;
            iface->ctx->log(iface->ctx, KVL_LOG_ERROR, "poll() = -1 %s (%s)",
                            kvli_errno_name(e), strerror(e));
            poll(NULL, 0, 10);
            continue;
        }
        if (pfd[0].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(iface->wake_fd, &v, sizeof(v));
            (void)r;
        }
        if (pfd[1].revents & POLLIN)
            kvli_shm_accept(iface);
        for (i = 2; i < npeers; i++)
            if (pfd[i].revents != 0)
                kvli_shm_peer_progress(who[i]);
        for (i = npeers; i < n; i++) {
            c = who[i];
            if (pfd[i].revents & POLLOUT)
                kvli_shm_conn_flush(iface, c);
            if (!c->closing && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                kvli_shm_conn_progress(iface, c);
        }
        for (cp = &iface->conns; *cp != NULL;) {
            c = *cp;
            if (c->closing) {
                *cp = c->next;
                kvli_shm_conn_free(iface, c);
            } else {
                cp = &c->next;
            }
        }
    }
    free(pfd);
    free(who);
    return NULL;
}

/* ---- ops ---- */

static kvl_status_t kvli_shm_available(char *reason, size_t len)
{
    kvl_error_t err;
    char boot[40];
    int fd;
    if (kvli_shm_read_boot_id(boot, sizeof(boot), &err) != KVL_OK) {
        if (reason != NULL && len > 0)
            snprintf(reason, len, "%s", err.what);
        return KVL_ERR_SYSTEM;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (reason != NULL && len > 0)
            snprintf(reason, len, "socket(AF_UNIX, SOCK_STREAM) = -1 %s (%s)",
                     kvli_errno_name(e), strerror(e));
        return KVL_ERR_UNSUPPORTED;
    }
    close(fd);
    if (reason != NULL && len > 0)
        reason[0] = '\0';
    return KVL_OK;
}

static kvl_status_t kvli_shm_parse_params(kvli_shm_iface_t *iface,
                                          const kvl_param_t *params, size_t n,
                                          const char **dir_p, kvl_error_t *err)
{
    size_t i;
    *dir_p = "";
    for (i = 0; i < n && params != NULL && params[i].key != NULL; i++) {
        const char *k = params[i].key, *v = params[i].value ? params[i].value : "";
        if (strcmp(k, "cma") == 0) {
            if (strcmp(v, "auto") == 0) {
                iface->cma_off = 0;
            } else if (strcmp(v, "off") == 0) {
                iface->cma_off = 1;
            } else {
                kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                                 "parameter cma=\"%s\" is not one of auto, off", v);
                kvl_bk_error_hint(err, "use cma=auto (cross-memory attach when the "
                                  "kernel allows it) or cma=off (socket copies)");
                return KVL_ERR_INVALID_ARG;
            }
        } else if (strcmp(k, "socket_dir") == 0) {
            *dir_p = v;
        } else if (strcmp(k, "allow_uids") == 0) {
            iface->uid_any = strcmp(v, "any") == 0;
            iface->nuids = 0;
            if (!iface->uid_any && strcmp(v, "self") != 0) {
                const char *p = v;
                while (*p) {
                    char *end;
                    errno = 0;
                    unsigned long u = strtoul(p, &end, 10);
                    if (end == p || errno != 0 || u > UINT32_MAX - 1 || (*end && *end != ',') ||
                        iface->nuids == sizeof(iface->uids) / sizeof(iface->uids[0])) {
                        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                                         "parameter allow_uids=\"%.100s\" is not self, any or "
                                         "a comma-separated list of at most 16 uids", v);
                        kvl_bk_error_hint(err, "e.g. allow_uids=1001,1002 lets those users' "
                                          "agents in besides our own uid");
                        return KVL_ERR_INVALID_ARG;
                    }
                    iface->uids[iface->nuids++] = (uid_t)u;
                    p = *end ? end + 1 : end;
                }
            }
        } else {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                             "unknown parameter \"%s\" (the shm backend knows: cma, "
                             "socket_dir, allow_uids)", k);
            kvl_bk_error_hint(err, "remove it or fix its spelling");
            return KVL_ERR_INVALID_ARG;
        }
    }
    return KVL_OK;
}

static kvl_status_t kvli_shm_listen(kvli_shm_iface_t *iface, const char *dir,
                                    kvl_error_t *err)
{
    char name[96];
    int e;
    snprintf(name, sizeof(name), "kvlane-shm-%d-%016" PRIx64, (int)getpid(),
             iface->ctx->incarnation);
    memset(&iface->addr, 0, sizeof(iface->addr));
    iface->addr.sun_family = AF_UNIX;
    if (dir[0] == '\0') {
        iface->abstract = 1;
        snprintf(iface->sock_name, sizeof(iface->sock_name), "%s", name);
        memcpy(iface->addr.sun_path + 1, name, strlen(name));
        iface->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                     strlen(name));
    } else {
        int w = snprintf(iface->sock_name, sizeof(iface->sock_name), "%s/%s.sock", dir,
                         name);
        if (w < 0 || (size_t)w >= sizeof(iface->addr.sun_path)) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, ENAMETOOLONG, KVLI_SHM_NAME, -1,
                             "socket path \"%s/%s.sock\" is %d bytes; a Unix socket "
                             "path holds at most %zu", dir, name, w,
                             sizeof(iface->addr.sun_path) - 1);
            kvl_bk_error_hint(err, "use a shorter socket_dir (or leave it empty for "
                              "the abstract namespace)");
            return KVL_ERR_INVALID_ARG;
        }
        memcpy(iface->addr.sun_path, iface->sock_name, (size_t)w);
        iface->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                     (size_t)w + 1);
    }
    iface->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (iface->listen_fd < 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "socket(AF_UNIX, SOCK_STREAM) = -1 %s (%s)",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n)");
        return KVL_ERR_SYSTEM;
    }
    if (bind(iface->listen_fd, (struct sockaddr *)&iface->addr, iface->addrlen) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "bind(%s%s) = -1 %s (%s)", iface->abstract ? "@" : "",
                         iface->sock_name, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, e == EADDRINUSE
                          ? "an shm backend of this agent already listens there: "
                            "create one shm backend per agent"
                          : "check that socket_dir exists and is writable, or leave "
                            "it empty for the abstract namespace");
        goto err_close;
    }
    if (listen(iface->listen_fd, 128) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "listen(%s%s) = -1 %s (%s)", iface->abstract ? "@" : "",
                         iface->sock_name, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the kernel's socket limits");
        goto err_unlink;
    }
    return KVL_OK;

err_unlink:
    if (!iface->abstract)
        unlink(iface->sock_name);
err_close:
    close(iface->listen_fd);
    iface->listen_fd = -1;
    return KVL_ERR_SYSTEM;
}

static void kvli_shm_close(void *bk);

static kvl_status_t kvli_shm_open(kvl_bk_ctx_t *ctx, const kvl_param_t *params,
                                  size_t n, void **bk_p, kvl_error_t *err)
{
    kvli_shm_iface_t *iface;
    pthread_condattr_t ca;
    const char *dir;
    kvl_status_t st;
    unsigned i;
    int e;

    if (ctx == NULL || bk_p == NULL || ctx->size < sizeof(kvl_bk_ctx_t)) {
        kvl_bk_error_set(err, KVL_ERR_INTERNAL, 0, KVLI_SHM_NAME, -1,
                         "open(): backend context of %u bytes, this backend needs %zu",
                         ctx ? ctx->size : 0u, sizeof(kvl_bk_ctx_t));
        kvl_bk_error_hint(err, "the core and the shm backend were built from "
                          "different headers; rebuild both");
        return KVL_ERR_INTERNAL;
    }
    iface = calloc(1, sizeof(*iface));
    if (iface == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "calloc(%zu) failed", sizeof(*iface));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    iface->ctx = ctx;
    iface->probe = ctx->incarnation;
    iface->timeout_ms = ctx->timeout_ms ? ctx->timeout_ms : KVLI_SHM_DEFAULT_TIMEOUT_MS;
    iface->listen_fd = -1;
    iface->wake_fd = -1;
    iface->nworkers = ctx->workers ? ctx->workers : 1;

    st = kvli_shm_parse_params(iface, params, n, &dir, err);
    if (st != KVL_OK)
        goto err_free;
    st = kvli_shm_read_boot_id(iface->boot_id, sizeof(iface->boot_id), err);
    if (st != KVL_OK)
        goto err_free;
    st = kvli_shm_ns_ino("/proc/self/ns/net", &iface->netns_ino, err);
    if (st != KVL_OK)
        goto err_free;
    st = kvli_shm_ns_ino("/proc/self/ns/pid", &iface->pidns_ino, err);
    if (st != KVL_OK)
        goto err_free;

    pthread_mutex_init(&iface->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&iface->cond, &ca);
    pthread_cond_init(&iface->qcond, &ca);
    pthread_condattr_destroy(&ca);

    iface->scratch_len = KVLI_SHM_SCRATCH;
    iface->scratch = malloc(iface->scratch_len);
    iface->pins = malloc(sizeof(void *) * KVLI_SHM_IOV_MAX);
    iface->workers = calloc(iface->nworkers, sizeof(*iface->workers));
    if (iface->scratch == NULL || iface->pins == NULL || iface->workers == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "malloc() of the progress buffers (%zu bytes) failed",
                         iface->scratch_len);
        kvl_bk_error_hint(err, "the process is out of memory");
        st = KVL_ERR_NO_MEMORY;
        goto err_close;
    }
    iface->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (iface->wake_fd < 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) = -1 %s (%s)",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n)");
        st = KVL_ERR_SYSTEM;
        goto err_close;
    }
    st = kvli_shm_listen(iface, dir, err);
    if (st != KVL_OK)
        goto err_close;

    for (i = 0; i < iface->nworkers; i++) {
        kvli_shm_worker_t *w = &iface->workers[i];
        if (kvli_shm_worker_init(w, iface) != 0) {
            kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                             "malloc() of copy worker %u's iovec arrays failed", i);
            kvl_bk_error_hint(err, "the process is out of memory");
            st = KVL_ERR_NO_MEMORY;
            goto err_close;
        }
        e = pthread_create(&w->thread, NULL, kvli_shm_xfer_worker, w);
        if (e != 0) {
            kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                             "pthread_create(copy worker %u) = %s (%s)", i,
                             kvli_errno_name(e), strerror(e));
            kvl_bk_error_hint(err, "check the thread limit (ulimit -u, pids cgroup)");
            st = KVL_ERR_SYSTEM;
            goto err_close;
        }
        w->started = 1;
    }
    e = pthread_create(&iface->progress, NULL, kvli_shm_progress_main, iface);
    if (e != 0) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "pthread_create(progress thread) = %s (%s)",
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the thread limit (ulimit -u, pids cgroup)");
        st = KVL_ERR_SYSTEM;
        goto err_close;
    }
    iface->progress_started = 1;
    ctx->log(ctx, KVL_LOG_DEBUG, "listening on %s%s, cma=%s, %u copy worker(s)",
             iface->abstract ? "@" : "", iface->sock_name,
             iface->cma_off ? "off" : "auto", iface->nworkers);
    *bk_p = iface;
    return KVL_OK;

err_close:
    kvli_shm_close(iface);
    return st;
err_free:
    free(iface);
    return st;
}

static void kvli_shm_close(void *bk)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_conn_t *c, *nc;
    kvli_shm_peer_t *p, *np;
    unsigned i;

    if (iface == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    atomic_store(&iface->stopping, 1);
    pthread_cond_broadcast(&iface->qcond);
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    if (iface->wake_fd >= 0)
        kvli_shm_iface_wake(iface);
    /* Every blocking call of these threads is bounded by timeout_ms. */
    if (iface->progress_started)
        pthread_join(iface->progress, NULL);
    for (i = 0; iface->workers != NULL && i < iface->nworkers; i++) {
        if (iface->workers[i].started)
            pthread_join(iface->workers[i].thread, NULL);
        kvli_shm_worker_fini(&iface->workers[i]);
    }
    /* The core releases everything first; this only guards against leaks. */
    kvli_shm_xfer_cancel_queued_all(iface);
    for (c = iface->conns; c != NULL; c = nc) {
        nc = c->next;
        kvli_shm_conn_free(iface, c);
    }
    for (p = iface->peers; p != NULL; p = np) {
        np = p->next;
        kvli_shm_md_unmap_all(p);
        close(p->fd);
        if (p->pidfd >= 0)
            close(p->pidfd);
        pthread_mutex_destroy(&p->send_lock);
        free(p);
    }
    if (iface->listen_fd >= 0) {
        close(iface->listen_fd);
        if (!iface->abstract)
            unlink(iface->sock_name);
    }
    if (iface->wake_fd >= 0)
        close(iface->wake_fd);
    pthread_cond_destroy(&iface->cond);
    pthread_cond_destroy(&iface->qcond);
    pthread_mutex_destroy(&iface->lock);
    free(iface->workers);
    free(iface->scratch);
    free(iface->pins);
    free(iface);
}

static void kvli_shm_put16(uint8_t *b, uint16_t v) { memcpy(b, &v, 2); }
static void kvli_shm_put32(uint8_t *b, uint32_t v) { memcpy(b, &v, 4); }
static void kvli_shm_put64(uint8_t *b, uint64_t v) { memcpy(b, &v, 8); }

/* Layout: see KVLI_SHM_CONN_* in shm_proto.h. */
static kvl_status_t kvli_shm_conn_pack(void *bk, uint8_t *buf, size_t cap,
                                       size_t *len_p)
{
    kvli_shm_iface_t *iface = bk;
    size_t sl = strlen(iface->sock_name);
    size_t need = KVLI_SHM_CONN_FIXED + sl;
    if (cap < need)
        return KVL_ERR_INVALID_ARG;
    memset(buf, 0, need);
    kvli_shm_put32(buf + 0, KVLI_SHM_CONN_MAGIC);
    kvli_shm_put16(buf + 4, KVLI_SHM_CONN_VERSION);
    kvli_shm_put16(buf + 6, (uint16_t)(iface->abstract ? 1 : 0));
    kvli_shm_put64(buf + 8, iface->ctx->incarnation);
    kvli_shm_put64(buf + 16, (uint64_t)(uintptr_t)&iface->probe);
    kvli_shm_put64(buf + 24, iface->netns_ino);
    kvli_shm_put64(buf + 32, iface->pidns_ino);
    kvli_shm_put32(buf + 40, (uint32_t)getpid());
    kvli_shm_put32(buf + 44, (uint32_t)getuid());
    memcpy(buf + 48, iface->boot_id, 36);
    kvli_shm_put16(buf + 88, (uint16_t)sl);
    memcpy(buf + KVLI_SHM_CONN_FIXED, iface->sock_name, sl);
    *len_p = need;
    return KVL_OK;
}

const kvl_backend_ops_t kvli_shm_ops = {
    .abi_version = KVL_BACKEND_ABI_VERSION,
    .size = sizeof(kvl_backend_ops_t),
    .name = KVLI_SHM_NAME,
    .description = "same host DRAM: memfd mappings, cross-memory attach "
                   "(process_vm_readv/writev) or Unix socket copies",
    .mem_local = KVL_MEM_BIT(KVL_MEM_DRAM),
    .mem_remote = KVL_MEM_BIT(KVL_MEM_DRAM),
    .caps = KVL_BK_CAP_NOTIF | KVL_BK_CAP_SAME_HOST | KVL_BK_CAP_INDEXED,
    .params = kvli_shm_params,
    .available = kvli_shm_available,
    .open = kvli_shm_open,
    .close = kvli_shm_close,
    .mem_reg = kvli_shm_md_reg,
    .mem_dereg = kvli_shm_md_dereg,
    .conn_pack = kvli_shm_conn_pack,
    .region_pack = kvli_shm_md_pack,
    .peer_load = kvli_shm_peer_load,
    .peer_unload = kvli_shm_peer_unload,
    .rregion_load = kvli_shm_md_rload,
    .rregion_unload = kvli_shm_md_runload,
    .xfer_post = kvli_shm_xfer_post,
    .xfer_cancel = kvli_shm_xfer_cancel,
    .notif_send = kvli_shm_peer_notif_send,
    .peer_describe = kvli_shm_peer_describe,
    .mem_query = NULL
};
