/*
 * Inet socket helpers of the shared layer, used by the tcp backend and the
 * agent listener (src/store/): addresses, bounded connect, reads and writes
 * with a deadline.
 */
#ifndef KVLI_INET_H
#define KVLI_INET_H

#include <sys/uio.h>
#include "clock.h"
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <kvlane/backend.h>

#define KVLI_TCP_EOF (-1)          /* helpers: orderly close by the other side */
#define KVLI_TCP_ADDR_STR 64


/* "host:port" or "[v6]:port" -> host, port. Returns 0 or -1. */
int kvli_tcp_hostport_split(const char *hp, char *host, size_t host_cap, uint16_t *port_p);
/* First non-loopback IPv4 address of an interface that is up, else
 * "127.0.0.1". */
void kvli_tcp_default_host(char *buf, size_t cap);
/* Resolve host (numeric or name) and port. Returns 0 or a getaddrinfo text
 * in why. */
int kvli_tcp_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss,
                     socklen_t *len_p, char *why, size_t why_cap);
/* "1.2.3.4:5" or "[::1]:5" */
void kvli_tcp_addr_str(const struct sockaddr *sa, char *buf, size_t cap);

/* Connect with a bound; returns the fd (non-blocking, close-on-exec) or -1
 * with *errno_p set (ETIMEDOUT when the bound passed). */
int kvli_tcp_connect(const struct sockaddr *sa, socklen_t len, uint64_t timeout_ms, int *errno_p);
/* TCP_NODELAY, keepalive and TCP_USER_TIMEOUT from timeout_ms; buffer sizes
 * when not 0. */
void kvli_tcp_sock_tune(int fd, uint64_t timeout_ms, int sndbuf, int rcvbuf);

/* Exactly len bytes before deadline_ns (CLOCK_MONOTONIC). Return 0, an
 * errno (ETIMEDOUT when the deadline passed) or KVLI_TCP_EOF. */
int kvli_tcp_io_write(int fd, const void *buf, size_t len, uint64_t deadline_ns);
int kvli_tcp_io_read(int fd, void *buf, size_t len, uint64_t deadline_ns);
/* Text of a helper result: "connection closed by the peer", "no data before
 * the deadline", strerror. */
const char *kvli_tcp_io_text(int rc);

/* Append src[0..n) to dst[k..max) leaving out the first skip bytes (what a
 * partial send already took); returns the new count. */
int kvli_tcp_iov_append(struct iovec *dst, int k, int max, const struct iovec *src, int n,
                        size_t skip);

#endif
