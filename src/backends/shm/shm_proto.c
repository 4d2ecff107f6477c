/* kvlane shm backend: framing helpers for the Unix socket protocol. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include "common/sock.h"
#include "shm_proto.h"

int kvli_shm_proto_sendv(int fd, struct iovec *iov, int iovcnt)
{
    return kvli_sock_send_fds(fd, iov, iovcnt, NULL, 0);
}

int kvli_shm_proto_sendv_tmo(int fd, struct iovec *iov, int iovcnt, uint64_t timeout_ms,
                             uint64_t *sent_p)
{
    int first = 0;
    *sent_p = 0;
    while (first < iovcnt && iov[first].iov_len == 0)
        first++;
    while (first < iovcnt) {
        struct msghdr mh;
        ssize_t n;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov + first;
        mh.msg_iovlen = (size_t)(iovcnt - first);
        if (mh.msg_iovlen > 1024)
            mh.msg_iovlen = 1024;
        n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            struct pollfd p = {fd, POLLOUT, 0};
            int r;
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return errno;
            /* the peer takes nothing: wait, bounded from the last progress */
            r = poll(&p, 1, timeout_ms > INT32_MAX ? INT32_MAX : (int)timeout_ms);
            if (r < 0 && errno != EINTR)
                return errno;
            if (r == 0)
                return ETIMEDOUT;
            continue;
        }
        *sent_p += (uint64_t)n;
        first += kvli_iov_advance(iov + first, iovcnt - first, (size_t)n);
        while (first < iovcnt && iov[first].iov_len == 0)
            first++;
    }
    return 0;
}

int kvli_shm_proto_recvv(int fd, struct iovec *iov, int iovcnt)
{
    int first = 0;
    while (first < iovcnt && iov[first].iov_len == 0)
        first++;
    while (first < iovcnt) {
        struct msghdr mh;
        ssize_t n;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov + first;
        mh.msg_iovlen = (size_t)(iovcnt - first);
        if (mh.msg_iovlen > 1024)
            mh.msg_iovlen = 1024;
        n = recvmsg(fd, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;  /* EAGAIN here means SO_RCVTIMEO expired */
        }
        if (n == 0)
            return KVLI_SHM_EOF;
        first += kvli_iov_advance(iov + first, iovcnt - first, (size_t)n);
        while (first < iovcnt && iov[first].iov_len == 0)
            first++;
    }
    return 0;
}

int kvli_shm_proto_recv(int fd, void *buf, size_t len, int *fd_p)
{
    int one = -1, nfd = fd_p != NULL ? 1 : 0;
    int rc = kvli_sock_recv_fds(fd, buf, len, &one, &nfd); /* -1 is KVLI_SHM_EOF */
    if (fd_p != NULL)
        *fd_p = nfd ? one : -1;
    return rc;
}

int kvli_shm_proto_drain(int fd, uint64_t len, void *scratch, size_t cap)
{
    while (len > 0) {
        size_t n = len < cap ? (size_t)len : cap;
        int rc = kvli_shm_proto_recv(fd, scratch, n, NULL);
        if (rc != 0)
            return rc;
        len -= n;
    }
    return 0;
}

const char *kvli_shm_proto_type_name(uint32_t type)
{
    switch (type) {
    case KVLI_SHM_MSG_HELLO: return "HELLO";
    case KVLI_SHM_MSG_HELLO_ACK: return "HELLO_ACK";
    case KVLI_SHM_MSG_NOTIF: return "NOTIF";
    case KVLI_SHM_MSG_NOTIF_ACK: return "NOTIF_ACK";
    case KVLI_SHM_MSG_NOTIF_GRANTED: return "NOTIF_GRANTED";
    case KVLI_SHM_MSG_FD_REQ: return "FD_REQ";
    case KVLI_SHM_MSG_FD_REPLY: return "FD_REPLY";
    case KVLI_SHM_MSG_WRITE: return "WRITE";
    case KVLI_SHM_MSG_WRITE_ACK: return "WRITE_ACK";
    case KVLI_SHM_MSG_READ: return "READ";
    case KVLI_SHM_MSG_READ_DATA: return "READ_DATA";
    default: return "unknown";
    }
}
