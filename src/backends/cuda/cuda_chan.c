/*
 * kvlane cuda backend: the Unix socket channel between two agents on one
 * host. It carries what cannot travel in metadata: the file descriptors of
 * VMM allocations (cuMemExportToShareableHandle) and of kvl_mem_alloc
 * memfds, passed with SCM_RIGHTS, and notifications, sent once a
 * transfer's data is complete. Both ends run on one host with one ABI, so
 * fields are in native byte order; every length is still checked.
 *
 * The initiator (peer_load) connects and sends HELLO; then NOTIF (answered
 * by NOTIF_ACK: queued, or refused when the target's queue is full) and
 * FDS_REQ (answered by FDS_REPLY), one request at a time per connection. The target serves accepted connections from its progress
 * thread.
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
#include "common/sock.h"
#include "common/errname.h"
#include "common/notif_full.h"
#include "cuda.h"

#define KVLI_CUDA_CONN_FIXED 68u

typedef struct kvli_cuda_hello {
    uint32_t version;
    uint32_t name_len;
    uint64_t incarnation;
    uint32_t pid;
    uint32_t reserved;
} kvli_cuda_hello_t;

/* ---- framing ---- */

static const char *kvli_cuda_io_text(int rc, char *buf, size_t cap)
{
    if (rc == -1)
        snprintf(buf, cap, "the connection was closed by the peer");
    else if (rc == EAGAIN || rc == EWOULDBLOCK)
        snprintf(buf, cap, "no answer within the timeout (EAGAIN)");
    else
        snprintf(buf, cap, "%s (%s)", kvli_errno_name(rc), strerror(rc));
    return buf;
}

static int kvli_cuda_sock_timeouts(int fd, uint64_t ms)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000u);
    tv.tv_usec = (suseconds_t)(ms % 1000u) * 1000;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
        return errno;
    return 0;
}

/* ---- listening ---- */

kvl_status_t kvli_cuda_chan_listen(kvli_cuda_iface_t *iface, kvl_error_t *err)
{
    char name[96];
    int e;
    snprintf(name, sizeof(name), "kvlane-cuda-%d-%016" PRIx64, (int)getpid(),
             iface->ctx->incarnation);
    memset(&iface->addr, 0, sizeof(iface->addr));
    iface->addr.sun_family = AF_UNIX;
    snprintf(iface->sock_name, sizeof(iface->sock_name), "%s", name);
    memcpy(iface->addr.sun_path + 1, name, strlen(name));
    iface->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    iface->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (iface->listen_fd < 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_CUDA_NAME, -1,
                         "socket(AF_UNIX, SOCK_STREAM) = -1 %s (%s)", kvli_errno_name(e),
                         strerror(e));
        kvl_bk_error_hint(err, "check the process's open-file limit (ulimit -n)");
        return KVL_ERR_SYSTEM;
    }
    if (bind(iface->listen_fd, (struct sockaddr *)&iface->addr, iface->addrlen) != 0 ||
        listen(iface->listen_fd, 128) != 0) {
        e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_CUDA_NAME, -1,
                         "bind/listen(@%s) = -1 %s (%s)", iface->sock_name,
                         kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, e == EADDRINUSE ? "create one cuda backend per agent"
                                               : "check the kernel's socket limits");
        close(iface->listen_fd);
        iface->listen_fd = -1;
        return KVL_ERR_SYSTEM;
    }
    return KVL_OK;
}

/* Layout: 0 magic u32 | 4 version u16 | 6 flags u16 | 8 incarnation u64 | 16 pid u32
 * | 20 uid u32 | 24 boot id char[40] | 64 name length u16 | 66 pad u16 | 68 name */
kvl_status_t kvli_cuda_chan_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p)
{
    kvli_cuda_iface_t *iface = bk;
    size_t sl = strlen(iface->sock_name), need = KVLI_CUDA_CONN_FIXED + sl;
    uint32_t magic = KVLI_CUDA_CONN_MAGIC, pid = (uint32_t)getpid(), uid = (uint32_t)getuid();
    uint16_t ver = KVLI_CUDA_CONN_VERSION, nl = (uint16_t)sl;
    if (cap < need)
        return KVL_ERR_INVALID_ARG;
    memset(buf, 0, need);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &ver, 2);
    memcpy(buf + 8, &iface->ctx->incarnation, 8);
    memcpy(buf + 16, &pid, 4);
    memcpy(buf + 20, &uid, 4);
    memcpy(buf + 24, iface->boot_id, 36);
    memcpy(buf + 64, &nl, 2);
    memcpy(buf + KVLI_CUDA_CONN_FIXED, iface->sock_name, sl);
    *len_p = need;
    return KVL_OK;
}

static kvl_status_t kvli_cuda_conn_bad(kvl_error_t *err, const char *name, const char *why,
                                       uint64_t v)
{
    kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_CUDA_NAME, -1,
                     "cuda connection info of agent '%s': %s (%" PRIu64 ")", name, why, v);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", name);
    kvl_bk_error_hint(err, "the metadata blob is corrupted or from an incompatible kvlane "
                      "build; fetch it again from the peer");
    return KVL_ERR_BAD_METADATA;
}

kvl_status_t kvli_cuda_chan_peer_load(void *bk, const char *name, uint64_t incarnation,
                                      const uint8_t *conn, size_t len, void **peer_p,
                                      kvl_error_t *err)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_peer_t *p;
    uint32_t magic, pid;
    uint16_t ver, nl;
    uint64_t inc;
    char boot[40], io[160];
    uint8_t hb[sizeof(kvli_cuda_hello_t) + KVL_NAME_MAX];
    kvli_cuda_hdr_t h;
    kvli_cuda_hello_t m;
    size_t mynl = strlen(iface->ctx->agent_name);
    int rc, e;

    if (conn == NULL || len < KVLI_CUDA_CONN_FIXED)
        return kvli_cuda_conn_bad(err, name, "shorter than its fixed part", len);
    memcpy(&magic, conn, 4);
    memcpy(&ver, conn + 4, 2);
    memcpy(&inc, conn + 8, 8);
    memcpy(&pid, conn + 16, 4);
    memcpy(boot, conn + 24, 36);
    boot[36] = '\0';
    memcpy(&nl, conn + 64, 2);
    if (magic != KVLI_CUDA_CONN_MAGIC)
        return kvli_cuda_conn_bad(err, name, "bad magic", magic);
    if (ver != KVLI_CUDA_CONN_VERSION)
        return kvli_cuda_conn_bad(err, name, "version not supported", ver);
    if (nl == 0 || nl > 100 || (size_t)nl != len - KVLI_CUDA_CONN_FIXED)
        return kvli_cuda_conn_bad(err, name, "socket name length is wrong", nl);
    if (inc != incarnation)
        return kvli_cuda_conn_bad(err, name, "incarnation differs from the blob's", inc);
    for (size_t i = 0; i < nl; i++)
        if (conn[KVLI_CUDA_CONN_FIXED + i] <= 0x20 || conn[KVLI_CUDA_CONN_FIXED + i] >= 0x7f)
            return kvli_cuda_conn_bad(err, name, "socket name has a non-printable byte", i);
    if (memcmp(boot, iface->boot_id, 36) != 0) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_CUDA_NAME, -1,
                         "agent '%s' runs on another host (boot id %.36s, ours %.36s): the cuda "
                         "backend reaches GPUs of this host only", name, boot, iface->boot_id);
        kvl_bk_error_hint(err, "use a network backend (tcp, ucx) for other hosts");
        return KVL_ERR_UNSUPPORTED;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_CUDA_NAME, -1, "calloc(%zu) failed",
                         sizeof(*p));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    p->iface = iface;
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->incarnation = incarnation;
    p->pid = (pid_t)pid;
    p->addr.sun_family = AF_UNIX;
    memcpy(p->addr.sun_path + 1, conn + KVLI_CUDA_CONN_FIXED, nl);
    p->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    snprintf(p->sock_desc, sizeof(p->sock_desc), "@%.*s", (int)nl,
             (const char *)conn + KVLI_CUDA_CONN_FIXED);
    pthread_mutex_init(&p->io_lock, NULL);
    p->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->fd < 0 || kvli_cuda_sock_timeouts(p->fd, iface->timeout_ms) != 0 ||
        connect(p->fd, (struct sockaddr *)&p->addr, p->addrlen) != 0) {
        e = errno;
        kvl_bk_error_set(err, e == ECONNREFUSED || e == ENOENT ? KVL_ERR_REMOTE_DISCONNECT
                                                               : KVL_ERR_SYSTEM,
                         e, KVLI_CUDA_NAME, -1,
                         "connect(%s) to agent '%s' (pid %u) = -1 %s (%s)", p->sock_desc, name,
                         pid, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "the peer exited or closed its cuda backend, or runs in another "
                          "network namespace; fetch its metadata again once it is up");
        goto fail;
    }
    if (mynl > KVL_NAME_MAX - 1)
        mynl = KVL_NAME_MAX - 1;
    h.magic = KVLI_CUDA_MSG_MAGIC;
    h.type = KVLI_CUDA_MSG_HELLO;
    h.len = sizeof(m) + mynl;
    m.version = KVLI_CUDA_PROTO_VERSION;
    m.name_len = (uint32_t)mynl;
    m.incarnation = iface->ctx->incarnation;
    m.pid = (uint32_t)getpid();
    m.reserved = 0;
    {
        struct iovec iov[3] = {{&h, sizeof(h)}, {&m, sizeof(m)},
                               {(void *)(uintptr_t)iface->ctx->agent_name, mynl}};
        rc = kvli_sock_send_fds(p->fd, iov, 3, NULL, 0);
    }
    if (rc == 0)
        rc = kvli_sock_recv_fds(p->fd, &h, sizeof(h), NULL, NULL);
    if (rc == 0 && (h.magic != KVLI_CUDA_MSG_MAGIC || h.type != KVLI_CUDA_MSG_HELLO_ACK ||
                    h.len < sizeof(m) || h.len > sizeof(m) + KVL_NAME_MAX))
        rc = EPROTO;
    if (rc == 0)
        rc = kvli_sock_recv_fds(p->fd, hb, (size_t)h.len, NULL, NULL);
    if (rc == 0) {
        memcpy(&m, hb, sizeof(m));
        if (m.incarnation != incarnation || m.name_len != h.len - sizeof(m) ||
            strlen(name) != m.name_len || memcmp(hb + sizeof(m), name, m.name_len))
            rc = ESTALE;
    }
    if (rc != 0) {
        kvl_bk_error_set(err, rc == ESTALE ? KVL_ERR_STALE : KVL_ERR_REMOTE_DISCONNECT,
                         rc > 0 ? rc : 0, KVLI_CUDA_NAME, -1,
                         "HELLO exchange with agent '%s' on %s failed: %.150s", name,
                         p->sock_desc,
                         rc == ESTALE ? "a different agent or incarnation answered"
                         : rc == EPROTO ? "the answer is not a cuda HELLO_ACK"
                                        : kvli_cuda_io_text(rc, io, sizeof(io)));
        kvl_bk_error_hint(err, "the peer restarted or is overloaded, or runs another kvlane "
                          "version (it closes a connection of another cuda protocol; this "
                          "agent speaks protocol %u): fetch its metadata again, run the same "
                          "kvlane version on both", KVLI_CUDA_PROTO_VERSION);
        goto fail;
    }
    pthread_mutex_lock(&iface->lock);
    p->next = iface->peers;
    iface->peers = p;
    pthread_mutex_unlock(&iface->lock);
    *peer_p = p;
    return KVL_OK;
fail:
    if (p->fd >= 0)
        close(p->fd);
    pthread_mutex_destroy(&p->io_lock);
    free(p);
    return err ? err->code : KVL_ERR_SYSTEM;
}

void kvli_cuda_chan_peer_unload(void *bk, void *peer_h)
{
    kvli_cuda_iface_t *iface = bk;
    kvli_cuda_peer_t *p = peer_h, **pp;
    if (p == NULL)
        return;
    kvli_cuda_xfer_cancel_peer(iface, p);
    pthread_mutex_lock(&iface->lock);
    for (pp = &iface->peers; *pp != NULL; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    pthread_mutex_unlock(&iface->lock);
    kvli_cuda_ipc_unmap_all(p);
    close(p->fd);
    pthread_mutex_destroy(&p->io_lock);
    free(p);
}

void kvli_cuda_chan_peer_describe(void *bk, void *peer_h, char *buf, size_t len)
{
    kvli_cuda_peer_t *p = peer_h;
    (void)bk;
    snprintf(buf, len, "cuda ipc (socket %.100s, pid %d)%s", p->sock_desc, (int)p->pid,
             atomic_load(&p->dead) ? ", connection lost" : "");
}

static kvl_status_t kvli_cuda_peer_io_error(kvli_cuda_peer_t *p, const char *what, int rc,
                                            kvl_error_t *err)
{
    char io[160];
    kvli_cuda_io_text(rc, io, sizeof(io));
    if (rc != EAGAIN && rc != EWOULDBLOCK) {
        atomic_store(&p->dead, 1);
        snprintf(p->dead_what, sizeof(p->dead_what), "%.60s: %.130s", what, io);
    }
    kvl_bk_error_set(err, rc == EAGAIN || rc == EWOULDBLOCK ? KVL_ERR_TIMEOUT
                                                           : KVL_ERR_REMOTE_DISCONNECT,
                     rc > 0 ? rc : 0, KVLI_CUDA_NAME, -1,
                     "%s to agent '%s' (pid %d) failed: %.150s", what, p->name, (int)p->pid, io);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", p->name);
    kvl_bk_error_hint(err, "the peer exited, hung or restarted; fetch its metadata again");
    return err ? err->code : KVL_ERR_REMOTE_DISCONNECT;
}

kvl_status_t kvli_cuda_chan_notif(kvli_cuda_peer_t *p, const void *msg, size_t len,
                                  uint64_t xfer_bytes, kvl_error_t *err)
{
    kvli_cuda_hdr_t h = {KVLI_CUDA_MSG_MAGIC, KVLI_CUDA_MSG_NOTIF, len};
    struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)(uintptr_t)msg, len}};
    kvli_cuda_notifack_t ack;
    char text[KVLI_CUDA_TEXT_MAX + 1];
    int rc;
    if (len > KVL_NOTIF_MAX) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_CUDA_NAME, -1,
                         "notification of %zu bytes is larger than KVL_NOTIF_MAX", len);
        return KVL_ERR_INVALID_ARG;
    }
    if (atomic_load(&p->dead)) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE_DISCONNECT, 0, KVLI_CUDA_NAME, -1,
                         "the connection to agent '%s' was lost earlier (%.180s)", p->name,
                         p->dead_what);
        kvl_bk_error_hint(err, "the peer exited or restarted; fetch its metadata again");
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    memset(&ack, 0, sizeof(ack));
    pthread_mutex_lock(&p->io_lock);
    rc = kvli_sock_send_fds(p->fd, iov, 2, NULL, 0);
    /* the answer (protocol 2); SO_RCVTIMEO bounds the wait */
    if (rc == 0)
        rc = kvli_sock_recv_fds(p->fd, &h, sizeof(h), NULL, NULL);
    if (rc == 0 && (h.magic != KVLI_CUDA_MSG_MAGIC || h.type != KVLI_CUDA_MSG_NOTIF_ACK ||
                    h.len < sizeof(ack) || h.len > sizeof(ack) + KVLI_CUDA_TEXT_MAX))
        rc = EPROTO;
    if (rc == 0)
        rc = kvli_sock_recv_fds(p->fd, &ack, sizeof(ack), NULL, NULL);
    if (rc == 0 && ack.text_len != h.len - sizeof(ack))
        rc = EPROTO;
    if (rc == 0 && ack.text_len > 0)
        rc = kvli_sock_recv_fds(p->fd, text, ack.text_len, NULL, NULL);
    pthread_mutex_unlock(&p->io_lock);
    if (rc == EPROTO) {
        snprintf(p->dead_what, sizeof(p->dead_what), "malformed answer to a notification");
        atomic_store(&p->dead, 1);
        kvl_bk_error_set(err, KVL_ERR_REMOTE, 0, KVLI_CUDA_NAME, -1,
                         "agent '%s' answered a notification with a malformed reply", p->name);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", p->name);
        kvl_bk_error_hint(err, "both agents must run the same kvlane version");
        return KVL_ERR_REMOTE;
    }
    if (rc != 0)
        return kvli_cuda_peer_io_error(p, "sending a notification", rc, err);
    if (ack.status != KVL_OK) {
        text[ack.text_len] = '\0';
        return kvli_notif_refused(err, KVLI_CUDA_NAME, p->name, ack.status, text, xfer_bytes);
    }
    return KVL_OK;
}

kvl_status_t kvli_cuda_chan_notif_send(void *bk, void *peer_h, const void *msg, size_t len,
                                       kvl_error_t *err)
{
    (void)bk;
    return kvli_cuda_chan_notif(peer_h, msg, len, UINT64_MAX, err);
}

kvl_status_t kvli_cuda_chan_fds_request(kvli_cuda_peer_t *p, uint32_t what, uint64_t addr,
                                        uint64_t len, uint32_t first, int *fds, uint64_t *sizes,
                                        uint32_t *n_p, uint32_t *total_p, kvl_error_t *err)
{
    kvli_cuda_hdr_t h = {KVLI_CUDA_MSG_MAGIC, KVLI_CUDA_MSG_FDS_REQ, sizeof(kvli_cuda_fdsreq_t)};
    kvli_cuda_fdsreq_t q = {what, first, addr, len};
    kvli_cuda_fdsrep_t rep;
    struct iovec iov[2] = {{&h, sizeof(h)}, {&q, sizeof(q)}};
    char text[KVLI_CUDA_TEXT_MAX + 1];
    int rc, nfd = KVLI_CUDA_FDS_MAX;

    pthread_mutex_lock(&p->io_lock);
    rc = kvli_sock_send_fds(p->fd, iov, 2, NULL, 0);
    /* The fds travel with the first bytes of the reply: the header. */
    if (rc == 0)
        rc = kvli_sock_recv_fds(p->fd, &h, sizeof(h), fds, &nfd);
    else
        nfd = 0;
    if (rc == 0 && (h.magic != KVLI_CUDA_MSG_MAGIC || h.type != KVLI_CUDA_MSG_FDS_REPLY ||
                    h.len < sizeof(rep)))
        rc = EPROTO;
    if (rc == 0) {
        int more = KVLI_CUDA_FDS_MAX - nfd;
        rc = kvli_sock_recv_fds(p->fd, &rep, sizeof(rep), fds + nfd, &more);
        nfd += more;
    }
    if (rc == 0 && (rep.n > KVLI_CUDA_FDS_MAX || (int)rep.n != nfd || rep.text_len > KVLI_CUDA_TEXT_MAX ||
                    h.len != sizeof(rep) + rep.n * 8u + rep.text_len ||
                    (rep.status == KVL_OK && (rep.n == 0 || first + rep.n > rep.total))))
        rc = EPROTO;
    if (rc == 0 && rep.n > 0)
        rc = kvli_sock_recv_fds(p->fd, sizes, rep.n * 8u, NULL, NULL);
    if (rc == 0 && rep.text_len > 0)
        rc = kvli_sock_recv_fds(p->fd, text, rep.text_len, NULL, NULL);
    pthread_mutex_unlock(&p->io_lock);
    if (rc != 0) {
        for (int i = 0; i < nfd; i++)
            close(fds[i]);
        if (rc == EPROTO) {
            snprintf(p->dead_what, sizeof(p->dead_what), "malformed reply to a file-descriptor "
                     "request");
            atomic_store(&p->dead, 1);
            kvl_bk_error_set(err, KVL_ERR_REMOTE, 0, KVLI_CUDA_NAME, -1,
                             "agent '%s' answered a file-descriptor request with a malformed "
                             "reply", p->name);
            kvl_bk_error_hint(err, "both agents must run the same kvlane version");
            return KVL_ERR_REMOTE;
        }
        return kvli_cuda_peer_io_error(p, "asking for memory handles", rc, err);
    }
    if (rep.status != KVL_OK) {
        text[rep.text_len] = '\0';
        kvl_bk_error_set(err, rep.status < 0 && rep.status > -600 ? rep.status : KVL_ERR_REMOTE, 0,
                         KVLI_CUDA_NAME, -1, "agent '%s' refused to share memory handles: %.300s",
                         p->name, text);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", p->name);
        kvl_bk_error_hint(err, "the peer deregistered or freed the memory; fetch its metadata "
                          "again");
        return err ? err->code : KVL_ERR_REMOTE;
    }
    *n_p = rep.n;
    *total_p = rep.total;
    return KVL_OK;
}

/* ---- target side ---- */

void kvli_cuda_chan_conn_free(kvli_cuda_conn_t *c)
{
    close(c->fd);
    free(c);
}

void kvli_cuda_chan_accept(kvli_cuda_iface_t *iface)
{
    for (;;) {
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        kvli_cuda_conn_t *c;
        int fd = accept4(iface->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            /* out of descriptors: paused, so the pending connection does not
             * spin this thread (common/accept.h) */
            if (!kvli_accept_failed(&iface->accept_bo, e) && e != EAGAIN &&
                e != EWOULDBLOCK && e != EINTR)
                iface->ctx->log(iface->ctx, KVL_LOG_WARN, "accept4(@%s) = -1 %s (%s)",
                                iface->sock_name, kvli_errno_name(e), strerror(e));
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
        /* GPU memory handles go only to processes of our own user. */
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != geteuid()) {
            iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                            "refused a cuda connection from pid %d uid %u on @%s: only uid %u "
                            "(ours) may map this agent's GPU memory", (int)cred.pid,
                            (unsigned)cred.uid, iface->sock_name, (unsigned)geteuid());
            close(fd);
            free(c);
            continue;
        }
        c->cred_pid = cred.pid;
        kvli_cuda_sock_timeouts(fd, iface->timeout_ms);
        c->next = iface->conns;
        iface->conns = c;
    }
}

static void kvli_cuda_conn_drop(kvli_cuda_iface_t *iface, kvli_cuda_conn_t *c, const char *why,
                                uint64_t v)
{
    iface->ctx->log(iface->ctx, KVL_LOG_WARN,
                    "protocol error on the cuda connection from agent '%s' (pid %d): %s "
                    "(value %" PRIu64 "); dropping the connection", c->name, (int)c->cred_pid,
                    why, v);
    c->closing = 1;
}

static void kvli_cuda_conn_fdsreq(kvli_cuda_iface_t *iface, kvli_cuda_conn_t *c)
{
    kvli_cuda_fdsreq_t q;
    kvli_cuda_fdsrep_t rep;
    kvli_cuda_hdr_t h = {KVLI_CUDA_MSG_MAGIC, KVLI_CUDA_MSG_FDS_REPLY, 0};
    int fds[KVLI_CUDA_FDS_MAX];
    uint64_t sizes[KVLI_CUDA_FDS_MAX];
    char text[KVLI_CUDA_TEXT_MAX] = "";
    uint32_t total = 0;
    int n, rc;

    rc = kvli_sock_recv_fds(c->fd, &q, sizeof(q), NULL, NULL);
    if (rc != 0) {
        c->closing = 1;
        return;
    }
    n = kvli_cuda_ipc_export(iface, (int)q.what, q.addr, q.len, q.first, fds, sizes,
                             KVLI_CUDA_FDS_MAX, &total, text, sizeof(text));
    memset(&rep, 0, sizeof(rep));
    if (n < 0) {
        rep.status = KVL_ERR_REMOTE_REFUSED;
        rep.text_len = (uint32_t)strnlen(text, sizeof(text));
        n = 0;
    } else {
        rep.status = KVL_OK;
        rep.n = (uint32_t)n;
        rep.total = total;
    }
    h.len = sizeof(rep) + (uint64_t)n * 8u + rep.text_len;
    {
        struct iovec iov[4] = {{&h, sizeof(h)}, {&rep, sizeof(rep)},
                               {sizes, (size_t)n * 8u}, {text, rep.text_len}};
        rc = kvli_sock_send_fds(c->fd, iov, 4, fds, n);
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    if (rc != 0)
        c->closing = 1;
}

void kvli_cuda_chan_conn_progress(kvli_cuda_iface_t *iface, kvli_cuda_conn_t *c)
{
    kvli_cuda_hdr_t h;
    kvli_cuda_hello_t m;
    int rc = kvli_sock_recv_fds(c->fd, &h, sizeof(h), NULL, NULL);
    if (rc != 0) {
        c->closing = 1;
        return;
    }
    if (h.magic != KVLI_CUDA_MSG_MAGIC) {
        kvli_cuda_conn_drop(iface, c, "bad message magic", h.magic);
        return;
    }
    if (!c->hello && h.type != KVLI_CUDA_MSG_HELLO) {
        kvli_cuda_conn_drop(iface, c, "message before HELLO", h.type);
        return;
    }
    switch (h.type) {
    case KVLI_CUDA_MSG_HELLO: {
        size_t nl = strlen(iface->ctx->agent_name);
        if (h.len < sizeof(m) + 1 || h.len > sizeof(m) + KVL_NAME_MAX - 1) {
            kvli_cuda_conn_drop(iface, c, "HELLO body length out of range", h.len);
            return;
        }
        if (kvli_sock_recv_fds(c->fd, iface->scratch, (size_t)h.len, NULL, NULL) != 0) {
            c->closing = 1;
            return;
        }
        memcpy(&m, iface->scratch, sizeof(m));
        if (m.version != KVLI_CUDA_PROTO_VERSION) {
            iface->ctx->log(iface->ctx, KVL_LOG_WARN, "refused the cuda connection from pid %d: "
                            "it speaks kvlane cuda protocol %u, this agent protocol %u; run "
                            "the same kvlane version on both agents", (int)c->cred_pid,
                            m.version, KVLI_CUDA_PROTO_VERSION);
            c->closing = 1;
            return;
        }
        if (m.name_len != h.len - sizeof(m)) {
            kvli_cuda_conn_drop(iface, c, "HELLO name length not accepted", m.name_len);
            return;
        }
        for (uint32_t i = 0; i < m.name_len; i++) {
            uint8_t ch = iface->scratch[sizeof(m) + i];
            if (ch <= 0x20 || ch >= 0x7f) {
                kvli_cuda_conn_drop(iface, c, "HELLO name has a non-printable byte", ch);
                return;
            }
        }
        memcpy(c->name, iface->scratch + sizeof(m), m.name_len);
        c->name[m.name_len] = '\0';
        c->hello = 1;
        if (nl > KVL_NAME_MAX - 1)
            nl = KVL_NAME_MAX - 1;
        h.type = KVLI_CUDA_MSG_HELLO_ACK;
        h.len = sizeof(m) + nl;
        m.version = KVLI_CUDA_PROTO_VERSION;
        m.name_len = (uint32_t)nl;
        m.incarnation = iface->ctx->incarnation;
        m.pid = (uint32_t)getpid();
        {
            struct iovec iov[3] = {{&h, sizeof(h)}, {&m, sizeof(m)},
                                   {(void *)(uintptr_t)iface->ctx->agent_name, nl}};
            if (kvli_sock_send_fds(c->fd, iov, 3, NULL, 0) != 0)
                c->closing = 1;
        }
        break;
    }
    case KVLI_CUDA_MSG_NOTIF:
        if (h.len > KVL_NOTIF_MAX) {
            kvli_cuda_conn_drop(iface, c, "NOTIF longer than KVL_NOTIF_MAX", h.len);
            return;
        }
        if (kvli_sock_recv_fds(c->fd, iface->scratch, (size_t)h.len, NULL, NULL) != 0) {
            c->closing = 1;
            return;
        }
        {
            kvli_cuda_notifack_t ack;
            char why[KVLI_CUDA_TEXT_MAX];
            ack.status = kvli_notif_take(iface->ctx, c->name, iface->scratch,
                                         (size_t)h.len, why, sizeof(why));
            ack.text_len = ack.status == KVL_OK ? 0 : (uint32_t)strnlen(why, sizeof(why));
            if (ack.status != KVL_OK)
                iface->ctx->log(iface->ctx, KVL_LOG_INFO, "refused a notification from '%s': "
                                "%s; the sender is told", c->name, why);
            h.type = KVLI_CUDA_MSG_NOTIF_ACK;
            h.len = sizeof(ack) + ack.text_len;
            struct iovec iov[3] = {{&h, sizeof(h)}, {&ack, sizeof(ack)}, {why, ack.text_len}};
            if (kvli_sock_send_fds(c->fd, iov, 3, NULL, 0) != 0)
                c->closing = 1;
        }
        break;
    case KVLI_CUDA_MSG_FDS_REQ:
        if (h.len != sizeof(kvli_cuda_fdsreq_t)) {
            kvli_cuda_conn_drop(iface, c, "FDS_REQ body length", h.len);
            return;
        }
        kvli_cuda_conn_fdsreq(iface, c);
        break;
    default:
        kvli_cuda_conn_drop(iface, c, "unexpected message type", h.type);
        break;
    }
}
