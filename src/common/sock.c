/* Stream-socket helpers; see sock.h. */
#include <errno.h>
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
