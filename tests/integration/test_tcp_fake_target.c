/*
 * tcp: a target that answers READs wrongly. This process creates an agent
 * with tcp on a known port, keeps its metadata, destroys it and serves that
 * port itself (same name and incarnation, so the HELLO checks pass),
 * speaking the tcp protocol as a broken or hostile target would. An
 * initiator agent of this process loads the metadata and READs 4 KiB, one
 * connection per case (a protocol error drops the connection, the next post
 * connects again):
 *   1. a READ_DATA that says done but carries 100 of the 4096 bytes;
 *   2. a READ_DATA that carries 4196 bytes for the 4096 asked;
 *   3. the right reply: the READ completes with those bytes, so the fake
 *      speaks the protocol well enough for the refusals above to mean what
 *      they say.
 * Cases 1 and 2 must fail as a protocol error that says what was wrong (the
 * byte count), never complete, never wait for the transfer's timeout.
 * Nothing is timed: waits are bounded only so that a hang fails the test.
 * KVL_TEST_LABELS: tcp
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/kt_etcd.h" /* kt_free_port */
#include "common/auth.h"
#include "common/inet.h"
#include "backends/tcp/tcp_proto.h"

#define LEN 4096u

enum { CASE_SHORT, CASE_LONG, CASE_GOOD, NCASES };
static const char *const case_name[NCASES] = {"100 of 4096 bytes", "4196 bytes for 4096",
                                              "4096 bytes"};
static const uint64_t case_bytes[NCASES] = {100, LEN + 100, LEN};

typedef struct {
    int ls;
    char name[64];
    uint64_t incarnation;
} fake_t;

static uint64_t dl(void)
{
    return kvli_clock_ns() + 20000000000ull;
}

/* The initiator hangs up on a bad reply: what it does not read is of no
 * interest, so sends may fail. */
static void send_all(int fd, const void *b, size_t n)
{
    (void)kvli_tcp_io_write(fd, b, n, dl());
}

/* One connection: authentication (no secret), HELLO, then READs answered
 * as case `how` says, until the initiator closes. */
static void serve(fake_t *f, int fd, int how)
{
    char why[256];
    uint8_t h[KVLI_TCP_HDR_LEN], body[16 * KVLI_TCP_RANGES_MAX + KVLI_TCP_HELLO_MAX];
    kvli_tcp_hdr_t rh;
    KT_CHECK(kvli_tcp_auth_server(fd, KVLI_AUTH_PURPOSE_DATA, NULL, 0, dl(), f->name, why,
                                  sizeof(why)) == 0);
    while (kvli_tcp_io_read(fd, h, sizeof(h), dl()) == 0) {
        KT_CHECK(kvli_tcp_proto_hdr_parse(h, KVLI_TCP_DIR_REQUEST, &rh, why, sizeof(why)) == 0);
        KT_CHECK(rh.type == KVLI_TCP_MSG_HELLO || rh.type == KVLI_TCP_MSG_READ);
        KT_CHECK(rh.len <= sizeof(body));
        KT_CHECK(kvli_tcp_io_read(fd, body, (size_t)rh.len, dl()) == 0);
        if (rh.type == KVLI_TCP_MSG_HELLO) {
            uint8_t a[KVLI_TCP_HDR_LEN + 8 + 64];
            size_t nl = strlen(f->name);
            kvli_tcp_proto_hdr_build(a, KVLI_TCP_MSG_HELLO_ACK, rh.id, 8 + nl,
                                     kvli_tcp_proto_reply_aux(0, 0));
            kvli_put64(a + KVLI_TCP_HDR_LEN, f->incarnation);
            memcpy(a + KVLI_TCP_HDR_LEN + 8, f->name, nl);
            send_all(fd, a, KVLI_TCP_HDR_LEN + 8 + nl);
            continue;
        }
        uint64_t n = case_bytes[how];
        uint8_t a[KVLI_TCP_HDR_LEN], data[LEN + 100];
        KT_CHECK(rh.payload == LEN);
        kt_fill(data, sizeof(data), 77);
        kvli_tcp_proto_hdr_build(a, KVLI_TCP_MSG_READ_DATA, rh.id, n,
                                 kvli_tcp_proto_reply_aux(0, 0));
        send_all(fd, a, sizeof(a));
        send_all(fd, data, (size_t)n);
    }
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    for (int how = 0; how < NCASES; how++) {
        struct pollfd p = {f->ls, POLLIN, 0};
        KT_CHECK(poll(&p, 1, 20000) == 1);
        int fd = accept4(f->ls, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        KT_CHECK(fd >= 0);
        serve(f, fd, how);
        close(fd);
    }
    return NULL;
}

int main(void)
{
    /* the target to impersonate: its metadata, then its port */
    uint16_t port = (uint16_t)kt_free_port();
    char params[96];
    snprintf(params, sizeof(params), "host=127.0.0.1,port=%u", (unsigned)port);
    fake_t f;
    snprintf(f.name, sizeof(f.name), "fake");
    kvl_agent_t *t = kt_agent_tmo(f.name, "tcp", params, 20000);
    uint8_t *tbuf = calloc(1, LEN);
    KT_CHECK(tbuf != NULL);
    kvl_mem_desc_t td = {(uint64_t)(uintptr_t)tbuf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &td, 1, NULL, NULL));
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(t, &blob, &blen));
    f.incarnation = kvl_agent_incarnation(t);
    KT_OK(kvl_mem_deregister(t, &td, 1));
    kvl_agent_destroy(t);

    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    f.ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(f.ls >= 0);
    KT_CHECK(setsockopt(f.ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0);
    KT_CHECK(bind(f.ls, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(f.ls, 4) == 0);
    pthread_t th;
    KT_CHECK(pthread_create(&th, NULL, fake_main, &f) == 0);

    kvl_agent_t *a = kt_agent_tmo("reader", "tcp", "host=127.0.0.1", 20000);
    uint8_t *buf = calloc(1, LEN);
    KT_CHECK(buf != NULL);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    char name[KVL_NAME_MAX];
    KT_OK(kvl_metadata_load(a, blob, blen, name, sizeof(name)));
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, d.addr, LEN, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, td.addr, LEN, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_READ, l, name, r, NULL, &x));
    for (int how = 0; how < NCASES; how++) {
        memset(buf, 0, LEN);
        kvl_status_t st = kvl_xfer_post(x);
        if (st == KVL_OK || st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 60000);
        char text[2048] = "";
        if (st != KVL_OK)
            kvl_error_render(NULL, text, sizeof(text));
        printf("  %s: %s%s%.600s\n", case_name[how], kvl_status_name(st), st ? ": " : "", text);
        if (how == CASE_GOOD) {
            KT_OK(st);
            KT_CHECK(kt_verify(buf, LEN, 77) == -1);
            continue;
        }
        KT_CHECK(st == KVL_ERR_REMOTE_DISCONNECT);
        KT_CHECK(strstr(text, "protocol error: READ_DATA reply") != NULL);
        KT_CHECK(strstr(text, how == CASE_SHORT ? "carries 100 bytes" : "carries 4196 bytes") !=
                 NULL);
        KT_CHECK(strstr(text, "asked for 4096") != NULL);
        KT_CHECK(strstr(text, "the peer broke the tcp protocol") != NULL); /* not "exited" */
    }
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
    KT_CHECK(pthread_join(th, NULL) == 0);
    close(f.ls);
    kvl_free(blob);
    free(buf);
    free(tbuf);
    printf("test_tcp_fake_target: passed\n");
    return 0;
}
