/* Stream-socket helpers shared by the same-host backends. */
#ifndef KVLI_SOCK_H
#define KVLI_SOCK_H

#include <stddef.h>

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

#endif
