/* Stream-socket helpers shared by the same-host backends. */
#ifndef KVLI_SOCK_H
#define KVLI_SOCK_H

#include <stddef.h>
#include <sys/uio.h>

#define KVLI_SOCK_FDS_MAX 64   /* descriptors one receive accepts */

/*
 * Receive exactly len bytes from a stream socket, retrying on EINTR.
 * Descriptors passed with SCM_RIGHTS (close-on-exec) land in fds, up to
 * *nfd_p of them; the rest are closed at once so none leaks. *nfd_p gets
 * how many were kept, also on failure (the caller owns them). fds/nfd_p may
 * be NULL: then every passed descriptor is closed. Returns 0, a positive
 * errno (EAGAIN when SO_RCVTIMEO expired), or -1 on an orderly close.
 */
int kvli_sock_recv_fds(int fd, void *buf, size_t len, int *fds, int *nfd_p);

/* Consume n bytes from the front of iov: entries fully covered are skipped,
 * a partly covered one is shortened. Returns the index of the first entry
 * with bytes left (iovcnt when none). */
int kvli_iov_advance(struct iovec *iov, int iovcnt, size_t n);

/*
 * Send all of iov (at most 1024 entries per sendmsg), retrying on EINTR;
 * nfd descriptors (at most KVLI_SOCK_FDS_MAX) go with the first bytes, as
 * SCM_RIGHTS. iov is consumed. Returns 0 or a positive errno (EAGAIN when
 * SO_SNDTIMEO expired).
 */
int kvli_sock_send_fds(int fd, struct iovec *iov, int iovcnt, const int *fds, int nfd);

/*
 * Has the other end of a connected stream socket shut its writing side,
 * closed or reset it? Data it sent before may still be queued here: a
 * target asks before copying a request's payload into registered memory,
 * and drops the payload of a connection its initiator gave up (issue 16
 * item 3). Does not block.
 */
int kvli_sock_peer_gone(int fd);

#endif
