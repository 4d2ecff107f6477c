/*
 * Who may talk to an agent's shm socket (issue 16, item 1), with a raw client
 * speaking the shm protocol as an attacker would:
 *  1. allocations are handed out (FD_REQ) only when memory inside them is
 *     registered: asking for the unregistered one by its sequential id fails;
 *  2. a process of another uid is refused before anything is read (needs
 *     root to become another user; that part is skipped otherwise);
 *  3. shared secrets: same secret works (also with names of the longest
 *     length, whose HELLO carries the proof after them); a wrong one, a
 *     missing one on either side is refused, each with its diagnosis;
 *  1b. a HELLO with a name past KVL_NAME_MAX - 1 bytes is refused.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "backends/shm/shm_proto.h"

#define ALLOC (1u << 20)

static char sock_name[96];

/* The target's abstract socket (named from its pid and incarnation): set
 * before forking, the child's pid is not the target's. */
static void name_of(kvl_agent_t *target)
{
    snprintf(sock_name, sizeof(sock_name), "kvlane-shm-%d-%016" PRIx64, (int)getpid(),
             kvl_agent_incarnation(target));
}

static int raw_connect(void)
{
    const char *name = sock_name;
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path + 1, name, strlen(name));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(fd >= 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read exactly n bytes (and at most one passed fd); 0 ok, -1 EOF/error. */
static int raw_recv(int fd, void *buf, size_t n, int *passed)
{
    size_t got = 0;
    while (got < n) {
        union {
            char b[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } cb;
        struct iovec iov = {(char *)buf + got, n - got};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
                            .msg_controllen = sizeof(cb.b)};
        ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (r <= 0)
            return -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_type == SCM_RIGHTS && passed != NULL)
                memcpy(passed, CMSG_DATA(c), sizeof(int));
        got += (size_t)r;
    }
    return 0;
}

/* HELLO from `me` without a proof; 0 when a HELLO_ACK came back, -1 when
 * refused. */
static int raw_hello_as(int fd, const char *me)
{
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_HELLO, 0,
                            sizeof(kvli_shm_msg_hello_t) + strlen(me)};
    kvli_shm_msg_hello_t m = {KVLI_SHM_PROTO_VERSION, (uint32_t)strlen(me), 42,
                              (uint32_t)getpid(), 0};
    uint8_t buf[256];
    KT_CHECK(sizeof(h) + sizeof(m) + strlen(me) <= sizeof(buf));
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &m, sizeof(m));
    memcpy(buf + sizeof(h) + sizeof(m), me, strlen(me));
    if (send(fd, buf, sizeof(h) + sizeof(m) + strlen(me), MSG_NOSIGNAL) < 0)
        return -1;
    if (raw_recv(fd, &h, sizeof(h), NULL) != 0 || h.type != KVLI_SHM_MSG_HELLO_ACK ||
        h.len > sizeof(buf))
        return -1;
    return raw_recv(fd, buf, (size_t)h.len, NULL);
}

static int raw_hello(int fd)
{
    return raw_hello_as(fd, "intruder");
}

/* FD_REQ for allocation id: its reply status, *fd_p the fd passed (or -1). */
static int raw_fdreq(int fd, uint64_t id, int *fd_p)
{
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_FD_REQ, 7,
                            sizeof(kvli_shm_msg_fdreq_t)};
    kvli_shm_msg_fdreq_t m = {id};
    kvli_shm_msg_reply_t r;
    uint8_t buf[sizeof(h) + sizeof(m)];
    char text[512];
    *fd_p = -1;
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &m, sizeof(m));
    if (send(fd, buf, sizeof(buf), MSG_NOSIGNAL) < 0)
        return -9999;
    if (raw_recv(fd, &h, sizeof(h), fd_p) != 0 || raw_recv(fd, &r, sizeof(r), fd_p) != 0)
        return -9998;
    if (r.text_len > 0 && r.text_len < sizeof(text) && raw_recv(fd, text, r.text_len, NULL) == 0)
        printf("  FD_REQ(%" PRIu64 "): %.*s\n", id, (int)r.text_len, text);
    return r.status;
}

static void test_fdreq_registered_only(void)
{
    kvl_agent_t *t;
    void *a, *b;
    KT_OK(kvl_agent_create("auth-target", NULL, &t));
    KT_OK(kvl_mem_alloc(t, ALLOC, &a)); /* allocation 1: registered */
    KT_OK(kvl_mem_alloc(t, ALLOC, &b)); /* allocation 2: never registered */
    memset(b, 0x5a, ALLOC);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)a, ALLOC, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &d, 1, NULL, NULL));

    name_of(t);
    int fd = raw_connect();
    KT_CHECK(fd >= 0);
    KT_CHECK(raw_hello(fd) == 0);
    int granted = 0, refused = 0;
    for (uint64_t id = 1; id <= 4; id++) {
        int mfd;
        int st = raw_fdreq(fd, id, &mfd);
        if (mfd >= 0) {
            granted++;
            close(mfd);
        } else {
            KT_CHECK(st == KVL_ERR_NOT_FOUND);
            refused++;
        }
    }
    /* Only the registered allocation: the other and the ids nobody has are refused. */
    KT_CHECK(granted == 1 && refused == 3);
    close(fd);
    for (size_t i = 0; i < ALLOC; i++)
        KT_CHECK(((uint8_t *)b)[i] == 0x5a);
    printf("1. FD_REQ hands out registered allocations only: ok\n");
    KT_OK(kvl_mem_deregister(t, &d, 1));
    kvl_agent_destroy(t);
}

/* A HELLO as long as one with a proof of the shared secret, but carrying a
 * name of more than KVL_NAME_MAX - 1 bytes instead: refused (the name must
 * fit the connection's record); the agent goes on serving. */
static void test_hello_name_bound(void)
{
    kvl_agent_t *t;
    KT_OK(kvl_agent_create("auth-bound", NULL, &t));
    name_of(t);
    char name[KVL_NAME_MAX + 32];
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    int fd = raw_connect();
    KT_CHECK(fd >= 0);
    KT_CHECK(raw_hello_as(fd, name) == -1);
    close(fd);
    name[KVL_NAME_MAX - 1] = '\0'; /* the longest name: taken */
    fd = raw_connect();
    KT_CHECK(fd >= 0);
    KT_CHECK(raw_hello_as(fd, name) == 0);
    close(fd);
    printf("1b. HELLO with a %zu-byte name refused, with a %d-byte one taken: ok\n",
           sizeof(name) - 1, KVL_NAME_MAX - 1);
    kvl_agent_destroy(t);
}

static void test_other_uid(void)
{
    kvl_agent_t *t;
    void *a;
    if (geteuid() != 0) {
        printf("2. another uid: not run (needs root to become another user)\n");
        return;
    }
    KT_OK(kvl_agent_create("auth-target2", NULL, &t));
    KT_OK(kvl_mem_alloc(t, ALLOC, &a));
    memset(a, 0x11, ALLOC);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)a, ALLOC, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &d, 1, NULL, NULL));
    name_of(t);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(3);
        int fd = raw_connect();
        if (fd < 0)
            _exit(2); /* the socket must be there: only the peer check may refuse */
        int hello = raw_hello(fd);
        int mfd = -1;
        int st = raw_fdreq(fd, 1, &mfd);
        /* 0: refused (no HELLO_ACK, no fd); 1: let in */
        _exit(hello == 0 || mfd >= 0 || st == KVL_OK ? 1 : 0);
    }
    int ws;
    KT_CHECK(waitpid(pid, &ws, 0) == pid);
    KT_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    for (size_t i = 0; i < ALLOC; i++)
        KT_CHECK(((uint8_t *)a)[i] == 0x11);
    printf("2. a process of uid 65534 is refused before HELLO: ok\n");

    /* allow_uids lets it in (the secret still applies when set). */
    kvl_agent_destroy(t);
    KT_OK(kvl_agent_create("auth-target3", &(kvl_agent_config_t){
        .field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""}, &t));
    kvl_param_t p[] = {{"allow_uids", "65534"}};
    KT_OK(kvl_backend_create(t, "shm", p, 1, NULL));
    name_of(t);
    pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(3);
        int fd = raw_connect();
        _exit(fd >= 0 && raw_hello(fd) == 0 ? 0 : 1);
    }
    KT_CHECK(waitpid(pid, &ws, 0) == pid);
    KT_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    printf("   allow_uids=65534 lets it in: ok\n");
    kvl_agent_destroy(t);
    kvl_param_t bad[] = {{"allow_uids", "root"}};
    KT_OK(kvl_agent_create("auth-target4", &(kvl_agent_config_t){
        .field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""}, &t));
    KT_STATUS(kvl_backend_create(t, "shm", bad, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("is not self, any or a comma-separated list");
    kvl_agent_destroy(t);
}

static kvl_agent_t *agent_with(const char *name, const char *secret)
{
    kvl_agent_t *a;
    kvl_agent_config_t c = {.field_mask = secret ? KVL_AGENT_CFG_SECRET : 0, .secret = secret};
    KT_OK(kvl_agent_create(name, &c, &a));
    return a;
}

/* Load target's metadata into initiator: the status, error text kept. */
static kvl_status_t load(kvl_agent_t *init, kvl_agent_t *target)
{
    void *blob;
    size_t len;
    char name[64];
    KT_OK(kvl_metadata_get(target, &blob, &len));
    kvl_status_t st = kvl_metadata_load(init, blob, len, name, sizeof(name));
    free(blob);
    return st;
}

static void test_secrets(void)
{
    struct {
        const char *ti, *tt, *expect;
        int long_names; /* KVL_NAME_MAX - 1 bytes: the HELLO at its longest */
    } c[] = {
        {"alpha", "alpha", NULL, 0},
        {"beta", "alpha", "the peer closed the connection", 0},
        {NULL, "alpha", "the peer closed the connection", 0},
        {"alpha", NULL, "did not prove our shared secret (it has none set)", 0},
        {"alpha", "alpha", NULL, 1},
        {NULL, NULL, NULL, 1},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        char n1[KVL_NAME_MAX], n2[KVL_NAME_MAX];
        snprintf(n1, sizeof(n1), "sec-init-%zu", i);
        snprintf(n2, sizeof(n2), "sec-tgt-%zu", i);
        for (size_t k = strlen(n1); c[i].long_names && k < KVL_NAME_MAX - 1; k++)
            n1[k] = 'i', n1[k + 1] = '\0';
        for (size_t k = strlen(n2); c[i].long_names && k < KVL_NAME_MAX - 1; k++)
            n2[k] = 't', n2[k + 1] = '\0';
        kvl_agent_t *t = agent_with(n2, c[i].tt), *a = agent_with(n1, c[i].ti);
        kvl_status_t st = load(a, t);
        if (c[i].expect == NULL) {
            KT_CHECK(st == KVL_OK);
        } else {
            KT_CHECK(st != KVL_OK);
            KT_ERROR_HAS(c[i].expect);
        }
        char d[512] = "";
        if (st == KVL_OK)
            kvl_remote_describe(a, n2, d, sizeof(d));
        printf("3.%zu initiator secret %s, target secret %s%s: %s %s\n", i,
               c[i].ti ? c[i].ti : "(none)", c[i].tt ? c[i].tt : "(none)",
               c[i].long_names ? ", names of 63 bytes" : "", kvl_status_name(st), d);
        kvl_agent_destroy(a);
        kvl_agent_destroy(t);
    }
}

int main(void)
{
    test_fdreq_registered_only();
    test_hello_name_bound();
    test_other_uid();
    test_secrets();
    printf("test_shm_auth: passed\n");
    return 0;
}
