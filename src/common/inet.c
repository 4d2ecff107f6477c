/* Inet socket helpers (addresses, bounded connect and I/O); see inet.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "inet.h"



int kvli_tcp_hostport_split(const char *hp, char *host, size_t host_cap, uint16_t *port_p)
{
    const char *colon, *hs, *he;
    char *end;
    unsigned long port;
    if (hp == NULL || host == NULL || host_cap == 0)
        return -1;
    if (hp[0] == '[') {
        he = strchr(hp, ']');
        if (he == NULL || he[1] != ':')
            return -1;
        hs = hp + 1;
        colon = he + 1;
    } else {
        colon = strrchr(hp, ':');
        if (colon == NULL || memchr(hp, ':', (size_t)(colon - hp)) != NULL)
            return -1;
        hs = hp;
        he = colon;
    }
    if (he == hs || (size_t)(he - hs) >= host_cap)
        return -1;
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || port > 65535)
        return -1;
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    *port_p = (uint16_t)port;
    return 0;
}

void kvli_tcp_default_host(char *buf, size_t cap)
{
    struct ifaddrs *ifa = NULL, *i;
    snprintf(buf, cap, "127.0.0.1");
    if (getifaddrs(&ifa) != 0)
        return;
    for (i = ifa; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
            (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, buf,
                  (socklen_t)cap);
        break;
    }
    freeifaddrs(ifa);
}

int kvli_tcp_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss,
                     socklen_t *len_p, char *why, size_t why_cap)
{
    struct addrinfo hints, *res = NULL;
    char ps[8];
    int rc;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(ps, sizeof(ps), "%u", (unsigned)port);
    rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(why, why_cap, "getaddrinfo(\"%.100s\") = %s", host,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        if (res)
            freeaddrinfo(res);
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void kvli_tcp_addr_str(const struct sockaddr *sa, char *buf, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        snprintf(buf, cap, "%s:%u", ip, (unsigned)ntohs(s4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, cap, "[%s]:%u", ip, (unsigned)ntohs(s6->sin6_port));
    } else {
        snprintf(buf, cap, "(family %d)", (int)sa->sa_family);
    }
}

int kvli_tcp_connect(const struct sockaddr *sa, socklen_t len, uint64_t timeout_ms, int *errno_p)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct pollfd p;
    int e = 0, rc;
    socklen_t el = sizeof(e);
    if (fd < 0) {
        *errno_p = errno;
        return -1;
    }
    if (connect(fd, sa, len) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        *errno_p = errno;
        close(fd);
        return -1;
    }
    p.fd = fd;
    p.events = POLLOUT;
    p.revents = 0;
    do {
        rc = poll(&p, 1, timeout_ms > 0x7fffffff ? 0x7fffffff : (int)timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
        *errno_p = ETIMEDOUT;
        close(fd);
        return -1;
    }
    if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e != 0) {
        *errno_p = rc < 0 ? errno : e ? e : errno;
        close(fd);
        return -1;
    }
    return fd;
}

void kvli_tcp_sock_tune(int fd, uint64_t timeout_ms, int sndbuf, int rcvbuf)
{
    int one = 1, idle, intvl = 1, cnt = 3;
    unsigned ut = timeout_ms > 0x7fffffffu ? 0x7fffffffu : (unsigned)timeout_ms;
    idle = (int)(timeout_ms / 2000u);
    if (idle < 1)
        idle = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
    if (sndbuf > 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    if (rcvbuf > 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
}

static int kvli_tcp_io_wait(int fd, short ev, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvli_clock_ns();
        struct pollfd p;
        int rc, ms;
        if (now >= deadline_ns)
            return ETIMEDOUT;
        ms = (int)((deadline_ns - now + 999999u) / 1000000u);
        p.fd = fd;
        p.events = ev;
        p.revents = 0;
        rc = poll(&p, 1, ms);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return errno;
    }
}

int kvli_tcp_io_write(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const uint8_t *b = buf;
    while (len > 0) {
        ssize_t n = send(fd, b, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            b += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        int rc = kvli_tcp_io_wait(fd, POLLOUT, deadline_ns);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kvli_tcp_io_read(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    uint8_t *b = buf;
    while (len > 0) {
        ssize_t n = recv(fd, b, len, MSG_DONTWAIT);
        if (n > 0) {
            b += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return KVLI_TCP_EOF;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        int rc = kvli_tcp_io_wait(fd, POLLIN, deadline_ns);
        if (rc != 0)
            return rc;
    }
    return 0;
}

const char *kvli_tcp_io_text(int rc)
{
    if (rc == KVLI_TCP_EOF)
        return "connection closed by the peer";
    if (rc == ETIMEDOUT)
        return "no answer before the deadline";
    return strerror(rc);
}

int kvli_tcp_iov_append(struct iovec *dst, int k, int max, const struct iovec *src, int n,
                        size_t skip)
{
    for (int i = 0; i < n && k < max; i++) {
        if (skip >= src[i].iov_len) {
            skip -= src[i].iov_len;
            continue;
        }
        dst[k].iov_base = (uint8_t *)src[i].iov_base + skip;
        dst[k++].iov_len = src[i].iov_len - skip;
        skip = 0;
    }
    return k;
}
