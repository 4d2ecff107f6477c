/* Stream-socket helpers; see sock.h. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "sock.h"

int kvli_sock_recv_fds(int fd, void *buf, size_t len, int *fds, int *nfd_p)
{
    size_t got = 0;
    int cap = nfd_p ? *nfd_p : 0, nfd = 0, rc = 0;
    while (got < len) {
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int) * KVLI_SOCK_FDS_MAX)];
        } cbuf;
        struct iovec iov = {(uint8_t *)buf + got, len - got};
        struct msghdr mh;
        struct cmsghdr *c;
        ssize_t n;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = sizeof(cbuf.buf);
        n = recvmsg(fd, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = errno;
            break;
        }
        /* Take ownership of passed descriptors before anything else. */
        for (c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t m = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t k = 0; k < m; k++) {
                int pfd;
                memcpy(&pfd, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
                if (fds != NULL && nfd < cap)
                    fds[nfd++] = pfd;
                else
                    close(pfd);
            }
        }
        if (n == 0) {
            rc = -1;
            break;
        }
        got += (size_t)n;
    }
    if (nfd_p)
        *nfd_p = nfd;
    return rc;
}

int kvli_iov_advance(struct iovec *iov, int iovcnt, size_t n)
{
    int i = 0;
    while (i < iovcnt && n >= iov[i].iov_len) {
        n -= iov[i].iov_len;
        i++;
    }
    if (i < iovcnt && n > 0) {
        iov[i].iov_base = (uint8_t *)iov[i].iov_base + n;
        iov[i].iov_len -= n;
    }
    return i;
}

int kvli_sock_send_fds(int fd, struct iovec *iov, int iovcnt, const int *fds, int nfd)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * KVLI_SOCK_FDS_MAX)];
    } cbuf;
    int first = 0;
    if (nfd < 0 || nfd > KVLI_SOCK_FDS_MAX)
        return EINVAL;
    /* Zero-length entries would otherwise leave the loop spinning at the end. */
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
        if (nfd > 0) {
            struct cmsghdr *cm;
            memset(&cbuf, 0, sizeof(cbuf));
            mh.msg_control = cbuf.buf;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfd);
            cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfd);
            memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfd);
        }
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        nfd = 0; /* the kernel took them with the first bytes */
        first += kvli_iov_advance(iov + first, iovcnt - first, (size_t)n);
        while (first < iovcnt && iov[first].iov_len == 0)
            first++;
    }
    return 0;
}

int kvli_sock_peer_gone(int fd)
{
    struct pollfd p = {fd, POLLRDHUP, 0};
    int r;
    do
        r = poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}
