/* libFuzzer target: a live agent's tcp and shm targets, fed through their
 * sockets by a client that passed authentication and HELLO, as any host
 * (tcp, no secret) or same-user process (shm) can. What follows the HELLO
 * is the input: requests with any header, ranges, lengths and payloads,
 * cut anywhere; then a NOTIF whose answer says all before it was answered
 * (the connection stays open until then: a target drops the WRITEs of an
 * initiator that went away). The agent must answer or drop each
 * connection, never crash, write outside its registered buffer, or leak
 * (LeakSanitizer). fuzz_tcp_proto.c covers the tcp parsers alone; this
 * covers what the targets do with what they parsed. The first byte picks
 * the target: bit 2 the agent listener (one request: FETCH, PUSH of a
 * metadata blob, INVALIDATE), else bit 0 tcp (0) or shm (1); bit 1 maps
 * the addresses of WRITE and READ ranges into the registered buffer. */
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "common/auth.h"
#include "common/clock.h"
#include "common/inet.h"
#include "backends/tcp/tcp_proto.h"
#include "backends/shm/shm_proto.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BUF_LEN (1u << 20)
#define GUARD 4096u

static kvl_agent_t *g_agent;
static uint8_t *g_mem; /* GUARD | registered BUF_LEN | GUARD */
static uint16_t g_port, g_lport; /* the tcp backend's port, the listener's */
static char g_sock[96];

/* A harness step that must work failed: say which and why, then stop. */
static void die(const char *what)
{
    char buf[2048];
    kvl_error_render(kvl_last_error(), buf, sizeof(buf));
    fprintf(stderr, "fuzz_agent_wire: %s failed (last kvlane error: %s)\n", what, buf);
    abort();
}

static uint16_t free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
        die("finding a free port");
    close(fd);
    return ntohs(sa.sin_port);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char port[16];
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 2000};
    if (kvl_agent_create("fz-target", &cfg, &g_agent) != KVL_OK)
        die("kvl_agent_create");
    g_port = free_port();
    snprintf(port, sizeof(port), "%u", g_port);
    kvl_param_t tp[2] = {{"host", "127.0.0.1"}, {"port", port}};
    if (kvl_backend_create(g_agent, "tcp", tp, 2, NULL) != KVL_OK)
        die("creating the tcp backend");
    if (kvl_backend_create(g_agent, "shm", NULL, 0, NULL) != KVL_OK)
        die("creating the shm backend");
    g_mem = calloc(1, BUF_LEN + 2 * GUARD);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)(g_mem + GUARD), BUF_LEN, KVL_DEV_ANY};
    if (g_mem == NULL || kvl_mem_register(g_agent, &d, 1, NULL, NULL) != KVL_OK)
        die("registering the buffer");
    snprintf(g_sock, sizeof(g_sock), "kvlane-shm-%d-%016" PRIx64, (int)getpid(),
             kvl_agent_incarnation(g_agent));
    char bound[64];
    if (kvl_agent_listen(g_agent, "127.0.0.1", 0, bound, sizeof(bound)) != KVL_OK)
        die("kvl_agent_listen");
    g_lport = (uint16_t)atoi(strrchr(bound, ':') + 1);
    return 0;
}

#define SENTINEL 0x5e5e5e5e5e5e5e5eull /* the id of the NOTIF sent after the input */

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Bit 1 of the selector: addresses in the WRITE and READ ranges of the
 * input become offsets into the registered buffer (up to 64 bytes past its
 * end), so that requests reach the copy paths instead of being refused. */
static void remap(uint8_t *in, size_t size, bool tcp)
{
    uint64_t base = (uint64_t)(uintptr_t)(g_mem + GUARD);
    size_t p = 0;
    while (p + (tcp ? 32u : 40u) <= size) {
        uint64_t len, nr;
        uint32_t type;
        size_t first;
        if (tcp) {
            uint16_t t16;
            memcpy(&t16, in + p + 4, 2);
            type = t16;
            len = rd64(in + p + 16);
            uint64_t aux = rd64(in + p + 24); /* WRITE: payload bytes after the ranges */
            nr = type == KVLI_TCP_MSG_WRITE ? (aux <= len ? (len - aux) / 16 : 0)
                 : type == KVLI_TCP_MSG_READ ? len / 16 : 0;
            first = p + 32;
        } else {
            memcpy(&type, in + p + 4, 4);
            len = rd64(in + p + 16);
            uint32_t n32;
            memcpy(&n32, in + p + 24, 4);
            nr = type == KVLI_SHM_MSG_WRITE || type == KVLI_SHM_MSG_READ ? n32 : 0;
            first = p + 40;
        }
        for (uint64_t i = 0; i < nr && first + 16 * i + 8 <= size; i++) {
            uint64_t v = base + rd64(in + first + 16 * i) % (BUF_LEN + 64);
            memcpy(in + first + 16 * i, &v, 8);
        }
        if (len > size - p)
            break;
        p += (tcp ? 32u : 24u) + (size_t)len;
    }
}

/* After the input, a NOTIF whose answer says the target has answered
 * everything before it (answers come in order); for tcp, and for shm. */
static size_t sentinel(uint8_t *out, bool tcp)
{
    static const char msg[] = "fuzz-sentinel";
    if (tcp) {
        kvli_tcp_proto_hdr_build(out, KVLI_TCP_MSG_NOTIF, SENTINEL, sizeof(msg), 0);
        memcpy(out + KVLI_TCP_HDR_LEN, msg, sizeof(msg));
        return KVLI_TCP_HDR_LEN + sizeof(msg);
    }
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_NOTIF, SENTINEL,
                            sizeof(kvli_shm_msg_notif_t) + sizeof(msg)};
    kvli_shm_msg_notif_t n = {0, 0};
    memcpy(out, &h, sizeof(h));
    memcpy(out + sizeof(h), &n, sizeof(n));
    memcpy(out + sizeof(h) + sizeof(n), msg, sizeof(msg));
    return sizeof(h) + sizeof(n) + sizeof(msg);
}

/* Read the answers until the sentinel's, the target's close, or 50 ms of
 * silence (an input that left a message unfinished: the target waits for
 * the rest, which never comes). Answers are walked by their headers. */
static void answers(int fd, bool tcp)
{
    static uint8_t buf[1 << 16];
    size_t have = 0;
    uint64_t skip = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            return;
        ssize_t r = read(fd, buf + have, sizeof(buf) - have);
        if (r <= 0)
            return;
        have += (size_t)r;
        size_t hl = tcp ? KVLI_TCP_HDR_LEN : sizeof(kvli_shm_msg_hdr_t), at = 0;
        for (;;) {
            if (skip > 0) {
                size_t k = skip < have - at ? (size_t)skip : have - at;
                at += k;
                skip -= k;
                if (skip > 0)
                    break;
            }
            if (have - at < hl)
                break;
            uint64_t id = rd64(buf + at + 8), len = rd64(buf + at + 16);
            if (id == SENTINEL)
                return;
            at += hl;
            skip = len;
        }
        memmove(buf, buf + at, have - at);
        have -= at;
    }
}

/* The agent listener: authenticated (purpose listener); the input is the
 * one request a connection carries (FETCH, PUSH of a metadata blob,
 * INVALIDATE). */
static int listener_open(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(g_lport),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    kvl_error_t err;
    int e = 0;
    int fd = kvli_tcp_connect((struct sockaddr *)&sa, sizeof(sa), 5000, &e);
    if (fd < 0)
        die("connecting to the listener");
    if (kvli_tcp_auth_client(fd, KVLI_AUTH_PURPOSE_LISTENER, NULL, 0,
                             kvli_clock_ns() + 5000000000ull, "listener", "the listener",
                             &err) != KVL_OK)
        die("authenticating to the listener");
    return fd;
}

static int tcp_open(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(g_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    uint64_t dl = kvli_clock_ns() + 5000000000ull;
    uint8_t msg[KVLI_TCP_HDR_LEN + KVLI_TCP_HELLO_MAX];
    kvl_error_t err;
    int e = 0;
    int fd = kvli_tcp_connect((struct sockaddr *)&sa, sizeof(sa), 5000, &e);
    if (fd < 0)
        die("connecting to the tcp target");
    if (kvli_tcp_auth_client(fd, KVLI_AUTH_PURPOSE_DATA, NULL, 0, dl, "tcp", "the target",
                             &err) != KVL_OK)
        die("authenticating to the tcp target");
    size_t bl = kvli_tcp_proto_hello_build(msg + KVLI_TCP_HDR_LEN, "fz-client", 7, "fz-target",
                                           kvl_agent_incarnation(g_agent));
    kvli_tcp_proto_hdr_build(msg, KVLI_TCP_MSG_HELLO, 0, bl, 0);
    if (kvli_tcp_io_write(fd, msg, KVLI_TCP_HDR_LEN + bl, dl) != 0)
        die("sending HELLO to the tcp target");
    kvli_tcp_hdr_t h;
    char why[160];
    uint8_t body[KVLI_TCP_ACK_MAX];
    if (kvli_tcp_io_read(fd, msg, KVLI_TCP_HDR_LEN, dl) != 0 ||
        kvli_tcp_proto_hdr_parse(msg, KVLI_TCP_DIR_REPLY, &h, why, sizeof(why)) != 0 ||
        h.type != KVLI_TCP_MSG_HELLO_ACK || h.status != 0 || h.len > sizeof(body) ||
        kvli_tcp_io_read(fd, body, (size_t)h.len, dl) != 0)
        die("the tcp target's HELLO_ACK"); /* a well-formed HELLO must be answered */
    return fd;
}

static int shm_open_conn(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, g_sock, strlen(g_sock));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un,
                                                                            sun_path) +
                                                                   1 + strlen(g_sock))) != 0)
        die("connecting to the shm target");
    const char *me = "fz-client";
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_HELLO, 0,
                            sizeof(kvli_shm_msg_hello_t) + strlen(me)};
    kvli_shm_msg_hello_t m = {KVLI_SHM_PROTO_VERSION, (uint32_t)strlen(me), 7,
                              (uint32_t)getpid(), 0};
    uint8_t buf[256];
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &m, sizeof(m));
    memcpy(buf + sizeof(h) + sizeof(m), me, strlen(me));
    if (kvli_shm_proto_sendv(fd, &(struct iovec){buf, sizeof(h) + sizeof(m) + strlen(me)}, 1) !=
        0)
        die("sending HELLO to the shm target");
    /* HELLO_ACK (its guard table fd is closed by the helper) */
    if (kvli_shm_proto_recv(fd, &h, sizeof(h), NULL) != 0 || h.type != KVLI_SHM_MSG_HELLO_ACK ||
        h.len > sizeof(buf) || kvli_shm_proto_recv(fd, buf, (size_t)h.len, NULL) != 0)
        die("the shm target's HELLO_ACK");
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if ((data[0] & 4) != 0) {
        /* the listener: one request, its reply, the close */
        int lfd = listener_open();
        (void)send(lfd, data + 1, size - 1, MSG_NOSIGNAL);
        shutdown(lfd, SHUT_WR);
        char sink[4096];
        for (;;) {
            struct pollfd p = {.fd = lfd, .events = POLLIN};
            if (poll(&p, 1, 1000) <= 0 || read(lfd, sink, sizeof(sink)) <= 0)
                break;
        }
        close(lfd);
        return 0;
    }
    bool tcp = (data[0] & 1) == 0;
    int fd = tcp ? tcp_open() : shm_open_conn();
    uint8_t *in = malloc(size - 1 + 128);
    if (in == NULL)
        die("malloc");
    memcpy(in, data + 1, size - 1);
    if ((data[0] & 2) != 0)
        remap(in, size - 1, tcp);
    size_t n = size - 1 + sentinel(in + size - 1, tcp);
    (void)send(fd, in, n, MSG_NOSIGNAL);
    free(in);
    answers(fd, tcp);
    close(fd);
    /* notifications the input queued: taken, so the bound never fills */
    kvl_notif_t nb[64];
    size_t got = 0;
    while (kvl_notif_poll(g_agent, nb, 64, &got) == KVL_OK && got > 0)
        for (size_t i = 0; i < got; i++)
            kvl_notif_free(&nb[i]);
    /* nothing written outside the registered buffer */
    for (size_t i = 0; i < GUARD; i++)
        if (g_mem[i] != 0 || g_mem[GUARD + BUF_LEN + i] != 0)
            die("checking the guard bytes around the registered buffer");
    return 0;
}
