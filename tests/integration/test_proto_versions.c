/*
 * An initiator of an older protocol is refused clearly (issue 16 item 3 made
 * targets drop the data of a connection its initiator gave up: tcp protocol
 * 2, shm protocol 4; issue 16's bounded notification queue made targets
 * answer every notification: tcp protocol 3, shm protocol 5. An initiator of
 * an old protocol relies on none of that, but the two must not exchange
 * data). A raw client plays the old
 * initiator, as an old kvlane build would:
 *  1. tcp: after authentication, a HELLO of protocol 1 or 2 gets a HELLO_ACK
 *     that refuses it and names both versions (an old initiator prints the text);
 *     the same client with the current version is let in;
 *  2. shm: a HELLO of protocol 3 or 4 gets no HELLO_ACK (the connection is closed,
 *     which an old initiator reports); the current version gets one.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/inet.h"
#include "backends/tcp/tcp_proto.h"
#include "backends/shm/shm_proto.h"

/* A free loopback port (bound, read, released). */
static uint16_t free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* HELLO of protocol `version` to the tcp target; returns the HELLO_ACK's
 * status and copies its text. */
static int tcp_hello(uint16_t port, const char *target, uint64_t inc, uint32_t version,
                     char *text, size_t cap)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    uint64_t dl = kvli_clock_ns() + 10000000000ull;
    uint8_t msg[KVLI_TCP_HDR_LEN + KVLI_TCP_HELLO_MAX], body[KVLI_TCP_ACK_MAX + 1];
    kvl_error_t err;
    kvli_tcp_hdr_t h;
    char why[160];
    int e = 0;
    int fd = kvli_tcp_connect((struct sockaddr *)&sa, sizeof(sa), 10000, &e);
    KT_CHECK(fd >= 0);
    KT_OK(kvli_tcp_auth_client(fd, KVLI_AUTH_PURPOSE_DATA, NULL, 0, dl, "tcp", "the target",
                               &err));
    size_t bl = kvli_tcp_proto_hello_build(msg + KVLI_TCP_HDR_LEN, "oldie", 7, target, inc);
    kvli_put32(msg + KVLI_TCP_HDR_LEN, version);
    kvli_tcp_proto_hdr_build(msg, KVLI_TCP_MSG_HELLO, 0, bl, 0);
    KT_CHECK(kvli_tcp_io_write(fd, msg, KVLI_TCP_HDR_LEN + bl, dl) == 0);
    KT_CHECK(kvli_tcp_io_read(fd, msg, KVLI_TCP_HDR_LEN, dl) == 0);
    KT_CHECK(kvli_tcp_proto_hdr_parse(msg, KVLI_TCP_DIR_REPLY, &h, why, sizeof(why)) == 0);
    KT_CHECK(h.type == KVLI_TCP_MSG_HELLO_ACK && h.len <= KVLI_TCP_ACK_MAX);
    KT_CHECK(kvli_tcp_io_read(fd, body, (size_t)h.len, dl) == 0);
    snprintf(text, cap, "%.*s", (int)h.text_len, (const char *)body);
    close(fd);
    return h.status;
}

static void test_tcp(void)
{
    char port[16], text[512], want[160];
    uint16_t p = free_port();
    snprintf(port, sizeof(port), "%u", (unsigned)p);
    kvl_agent_t *t = kt_agent("versioned", NULL, NULL);
    kvl_param_t prm[2] = {{"host", "127.0.0.1"}, {"port", port}};
    KT_OK(kvl_backend_create(t, "tcp", prm, 2, NULL));
    uint64_t inc = kvl_agent_incarnation(t);

    for (uint32_t v = 1; v < KVLI_TCP_PROTO_VERSION; v++) {
        int st = tcp_hello(p, "versioned", inc, v, text, sizeof(text));
        printf("tcp: a HELLO of protocol %u is answered with status %d: %s\n", v, st, text);
        snprintf(want, sizeof(want), "speaks kvlane tcp protocol %u, the initiator protocol %u",
                 KVLI_TCP_PROTO_VERSION, v);
        KT_CHECK(st == KVL_ERR_UNSUPPORTED && strstr(text, want) != NULL);
    }
    int st;
    st = tcp_hello(p, "versioned", inc, KVLI_TCP_PROTO_VERSION, text, sizeof(text));
    printf("tcp: a HELLO of protocol %u is answered with status %d\n", KVLI_TCP_PROTO_VERSION,
           st);
    KT_CHECK(st == 0);
    kvl_agent_destroy(t);
}

/* HELLO of protocol `version` to the shm target: 0 when a HELLO_ACK came
 * back, -1 when the connection was closed instead. */
static int shm_hello(const char *sock, uint32_t version)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    const char *me = "oldie";
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_HELLO, 0,
                            sizeof(kvli_shm_msg_hello_t) + strlen(me)};
    kvli_shm_msg_hello_t m = {version, (uint32_t)strlen(me), 42, (uint32_t)getpid(), 0};
    uint8_t buf[256];
    struct timeval tv = {10, 0};
    ssize_t r;
    memcpy(a.sun_path + 1, sock, strlen(sock));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    KT_CHECK(connect(fd, (struct sockaddr *)&a,
                     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sock))) == 0);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &m, sizeof(m));
    memcpy(buf + sizeof(h) + sizeof(m), me, strlen(me));
    KT_CHECK(send(fd, buf, sizeof(h) + sizeof(m) + strlen(me), MSG_NOSIGNAL) > 0);
    r = recv(fd, &h, sizeof(h), MSG_WAITALL);
    close(fd);
    if (r == 0)
        return -1;
    KT_CHECK(r == (ssize_t)sizeof(h)); /* not a timeout: an answer or a close */
    KT_CHECK(h.type == KVLI_SHM_MSG_HELLO_ACK);
    return 0;
}

static void test_shm(void)
{
    char sock[96];
    kvl_agent_t *t = kt_agent("versioned", "shm", NULL);
    snprintf(sock, sizeof(sock), "kvlane-shm-%d-%016llx", (int)getpid(),
             (unsigned long long)kvl_agent_incarnation(t));
    for (uint32_t v = 3; v < KVLI_SHM_PROTO_VERSION; v++) {
        KT_CHECK(shm_hello(sock, v) == -1);
        printf("shm: a HELLO of protocol %u gets no HELLO_ACK: the connection is closed\n", v);
    }
    KT_CHECK(shm_hello(sock, KVLI_SHM_PROTO_VERSION) == 0);
    printf("shm: a HELLO of protocol %u gets its HELLO_ACK\n", KVLI_SHM_PROTO_VERSION);
    kvl_agent_destroy(t);
}

int main(void)
{
    test_tcp();
    test_shm();
    printf("older initiators are refused\n");
    return 0;
}
