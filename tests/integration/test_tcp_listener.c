/*
 * Agent listener and tcp security: fetch/push/invalidate by address,
 * invalidation on deregistration and at destroy, a shared secret on the
 * listener and on data connections (peers without it or with another one are
 * refused, with a clear error on both sides), a malicious peer sending
 * requests outside registered memory (refused; target memory unchanged,
 * checked byte by byte), and random garbage on the listener and data ports
 * (the agent survives and keeps serving).
 * KVL_TEST_LABELS: tcp listener
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/auth.h"
#include "backends/tcp/tcp_proto.h"
#include "common/inet.h"

/* The refusing side logs after the refused side returns: wait for it. */
static int log_wait(const char *needle)
{
    for (int i = 0; i < 100; i++) {
        if (kt_log_has(needle))
            return 1;
        usleep(20000);
    }
    return 0;
}

static kvl_agent_t *agent(const char *name, const char *secret)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 1000};
    if (secret) {
        cfg.field_mask |= KVL_AGENT_CFG_SECRET;
        cfg.secret = secret;
    }
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p = {"host", "127.0.0.1"};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    return a;
}

static size_t nregions(kvl_agent_t *a, const char *name)
{
    kvl_mem_desc_t r[8];
    size_t n = 0;
    if (kvl_remote_regions(a, name, r, NULL, 8, &n) != KVL_OK)
        return 0;
    return n;
}

/* Address of the tcp data port of an agent, from its metadata. */
static void data_addr(kvl_agent_t *target, kvl_agent_t *probe, struct sockaddr_in *sa)
{
    void *blob;
    size_t len;
    char d[512];
    KT_OK(kvl_metadata_get(target, &blob, &len));
    KT_OK(kvl_metadata_load(probe, blob, len, NULL, 0));
    kvl_free(blob);
    kvl_remote_describe(probe, kvl_agent_name(target), d, sizeof(d));
    char *p = strstr(d, "socket ");
    KT_CHECK(p != NULL);
    char host[64];
    uint16_t port;
    char *sp = strchr(p + 7, ' ');
    KT_CHECK(sp != NULL);
    *sp = 0;
    KT_CHECK(kvli_tcp_hostport_split(p + 7, host, sizeof(host), &port) == 0);
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    inet_pton(AF_INET, host, &sa->sin_addr);
    KT_OK(kvl_remote_remove(probe, kvl_agent_name(target)));
}

static int raw_connect(const struct sockaddr_in *sa)
{
    int e = 0;
    int fd = kvli_tcp_connect((const struct sockaddr *)sa, sizeof(*sa), 2000, &e);
    KT_CHECK(fd >= 0);
    return fd;
}

static uint64_t deadline(void)
{
    return kvli_clock_ns() + 3000000000ull;
}

/* A malicious initiator: authenticated and HELLO'd like a real one, then asks
 * for memory the target never exposed. Returns the reply status. */
static int32_t evil_request(int fd, uint16_t type, uint64_t id, uint64_t addr, uint64_t len)
{
    uint8_t hdr[KVLI_TCP_HDR_LEN], rng[16], rep[KVLI_TCP_HDR_LEN], text[KVLI_TCP_TEXT_MAX + 1];
    kvli_tcp_hdr_t h;
    char why[128];
    kvli_tcp_proto_hdr_build(hdr, type, id, 16 + (type == KVLI_TCP_MSG_WRITE ? len : 0), len);
    kvli_put64(rng, addr);
    kvli_put64(rng + 8, len);
    KT_CHECK(kvli_tcp_io_write(fd, hdr, sizeof(hdr), deadline()) == 0);
    KT_CHECK(kvli_tcp_io_write(fd, rng, sizeof(rng), deadline()) == 0);
    if (type == KVLI_TCP_MSG_WRITE) {
        uint8_t *junk = malloc(len);
        memset(junk, 0xEE, len);
        KT_CHECK(kvli_tcp_io_write(fd, junk, len, deadline()) == 0);
        free(junk);
    }
    KT_CHECK(kvli_tcp_io_read(fd, rep, sizeof(rep), deadline()) == 0);
    KT_CHECK(kvli_tcp_proto_hdr_parse(rep, KVLI_TCP_DIR_REPLY, &h, why, sizeof(why)) == 0);
    KT_CHECK(h.id == id && h.len == h.text_len);
    KT_CHECK(kvli_tcp_io_read(fd, text, h.text_len, deadline()) == 0);
    text[h.text_len] = 0;
    printf("   evil %s 0x%llx+%llu -> %s: %s\n", kvli_tcp_proto_type_name(type),
           (unsigned long long)addr, (unsigned long long)len, kvl_status_name(h.status), text);
    return h.status;
}

int main(void)
{
    kvl_log_set_callback(kt_log_cb, NULL);
    const char *secret = "correct horse battery staple";
    kvl_agent_t *a = agent("alpha", secret), *b = agent("beta", secret);
    const size_t len = 1 << 20, page = 4096;
    /* alpha's registered buffer sits between two mapped, unregistered pages */
    uint8_t *map = mmap(NULL, len + 2 * page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(map != MAP_FAILED);
    uint8_t *abuf = map + page, *ref = malloc(len + 2 * page);
    kt_fill(map, len + 2 * page, 11);
    kvl_mem_desc_t ad = {(uint64_t)(uintptr_t)abuf, len, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &ad, 1, NULL, NULL));
    uint8_t *bbuf = malloc(2 * len);
    kt_fill(bbuf, 2 * len, 12);
    kvl_mem_desc_t bd[2] = {{(uint64_t)(uintptr_t)bbuf, len, KVL_DEV_ANY},
                            {(uint64_t)(uintptr_t)bbuf + len, len, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(b, bd, 2, NULL, NULL));

    /* 1. listen, fetch with the right secret, write through the data path */
    char la[128], lb[128], name[64];
    KT_OK(kvl_agent_listen(a, "127.0.0.1", 0, la, sizeof(la)));
    KT_STATUS(kvl_agent_listen(a, "127.0.0.1", 0, NULL, 0), KVL_ERR_EXISTS);
    KT_OK(kvl_agent_listen(b, "127.0.0.1", 0, lb, sizeof(lb)));
    printf("alpha listens on %s, beta on %s\n", la, lb);
    KT_OK(kvl_metadata_fetch(b, la, name, sizeof(name)));
    KT_CHECK(strcmp(name, "alpha") == 0);
    kt_write_wait(b, "alpha", bbuf, ad.addr, len, 10000);
    KT_CHECK(memcmp(abuf, bbuf, len) == 0);
    char d[512];
    kvl_remote_describe(b, "alpha", d, sizeof(d));
    KT_CHECK(strstr(d, "authenticated") != NULL);
    printf("1. fetch + authenticated write: ok (%s", d);
    printf(")\n");

    /* 2. push, refresh after deregistration, invalidate, destroy */
    KT_OK(kvl_metadata_push(b, la));
    KT_OK(kvl_remote_check(a, "beta"));
    KT_CHECK(nregions(a, "beta") == 2);
    KT_OK(kvl_mem_deregister(b, &bd[1], 1));
    for (int i = 0; i < 100 && nregions(a, "beta") != 1; i++)
        usleep(20000);
    KT_CHECK(nregions(a, "beta") == 1);
    KT_OK(kvl_metadata_invalidate(b, la));
    KT_STATUS(kvl_remote_check(a, "beta"), KVL_ERR_NOT_FOUND);
    KT_OK(kvl_metadata_push(b, la));
    KT_OK(kvl_remote_check(a, "beta"));
    printf("2. push, refresh on deregistration, invalidate: ok\n");

    /* 3. secrets: none, or another one, are refused on the listener and on
     *    data connections; both sides say why */
    kvl_agent_t *c = agent("gamma", NULL), *dd = agent("delta", "another secret");
    kt_log_clear();
    KT_STATUS(kvl_metadata_fetch(c, la, NULL, 0), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("requires a shared secret and this agent has none");
    KT_CHECK(log_wait("refused a connection from"));
    kt_log_clear();
    KT_STATUS(kvl_metadata_fetch(dd, la, NULL, 0), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("different secrets");
    KT_CHECK(log_wait("different secrets"));
    {   /* a secret-holding client refuses a listener without one */
        char lc[128];
        KT_OK(kvl_agent_listen(c, "127.0.0.1", 0, lc, sizeof(lc)));
        KT_STATUS(kvl_metadata_fetch(a, lc, NULL, 0), KVL_ERR_PERMISSION);
        KT_ERROR_HAS("cannot prove it knows ours");
    }
    void *blob;
    size_t bl;
    KT_OK(kvl_metadata_get(a, &blob, &bl));
    kt_log_clear();
    KT_STATUS(kvl_metadata_load(c, blob, bl, NULL, 0), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("requires a shared secret");
    KT_CHECK(log_wait("refused a tcp connection"));
    KT_STATUS(kvl_metadata_load(dd, blob, bl, NULL, 0), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("different secrets");
    kvl_free(blob);
    printf("3. peers without the secret or with another one: refused, both sides told\n");

    /* 4. a malicious peer asks for memory outside alpha's registrations */
    struct sockaddr_in sa;
    data_addr(a, b, &sa);
    memcpy(ref, map, len + 2 * page);
    {
        int fd = raw_connect(&sa);
        kvl_error_t err;
        KT_OK(kvli_tcp_auth_client(fd, KVLI_AUTH_PURPOSE_DATA, (const uint8_t *)secret,
                                   strlen(secret), deadline(), "tcp", "alpha", &err));
        uint8_t m[KVLI_TCP_HDR_LEN + KVLI_TCP_HELLO_MAX], r[KVLI_TCP_HDR_LEN + KVLI_TCP_ACK_MAX];
        size_t hl = kvli_tcp_proto_hello_build(m + KVLI_TCP_HDR_LEN, "mallory", 42, "alpha",
                                               kvl_agent_incarnation(a));
        kvli_tcp_proto_hdr_build(m, KVLI_TCP_MSG_HELLO, 0, hl, 0);
        KT_CHECK(kvli_tcp_io_write(fd, m, KVLI_TCP_HDR_LEN + hl, deadline()) == 0);
        kvli_tcp_hdr_t h;
        char why[128];
        KT_CHECK(kvli_tcp_io_read(fd, r, KVLI_TCP_HDR_LEN, deadline()) == 0);
        KT_CHECK(kvli_tcp_proto_hdr_parse(r, KVLI_TCP_DIR_REPLY, &h, why, sizeof(why)) == 0);
        KT_CHECK(h.status == 0 && kvli_tcp_io_read(fd, r, h.len, deadline()) == 0);
        kt_log_clear();
        uint64_t A = ad.addr;
        KT_CHECK(evil_request(fd, KVLI_TCP_MSG_WRITE, 1, A - page, page) == KVL_ERR_OUT_OF_BOUNDS);
        KT_CHECK(evil_request(fd, KVLI_TCP_MSG_WRITE, 2, A + len - 100, 200) == KVL_ERR_OUT_OF_BOUNDS);
        KT_CHECK(evil_request(fd, KVLI_TCP_MSG_WRITE, 3, A + len, page) == KVL_ERR_OUT_OF_BOUNDS);
        KT_CHECK(evil_request(fd, KVLI_TCP_MSG_WRITE, 4, (uint64_t)(uintptr_t)ref, 64) ==
                 KVL_ERR_OUT_OF_BOUNDS);
        KT_CHECK(evil_request(fd, KVLI_TCP_MSG_READ, 5, A - 8, 16) == KVL_ERR_OUT_OF_BOUNDS);
        KT_CHECK(evil_request(fd, KVLI_TCP_MSG_READ, 6, 0x1000, 4096) == KVL_ERR_OUT_OF_BOUNDS);
        close(fd);
        for (size_t i = 0; i < len + 2 * page; i++)
            if (map[i] != ref[i]) {
                fprintf(stderr, "target byte %zu changed\n", i);
                KT_CHECK(0);
            }
        KT_CHECK(kt_log_has("refused, nothing touched"));
        printf("4. out-of-region requests refused, target memory unchanged (%zu bytes checked)\n",
               len + 2 * page);
    }

    /* 5. garbage on the listener and the data port; the agent keeps serving */
    {
        unsigned seed = 12345;
        struct sockaddr_in ls;
        char lh[64];
        uint16_t lp;
        KT_CHECK(kvli_tcp_hostport_split(la, lh, sizeof(lh), &lp) == 0);
        memset(&ls, 0, sizeof(ls));
        ls.sin_family = AF_INET;
        ls.sin_port = htons(lp);
        inet_pton(AF_INET, lh, &ls.sin_addr);
        int idle[8];
        for (int i = 0; i < 8; i++)   /* connect and say nothing */
            idle[i] = raw_connect(i % 2 ? &sa : &ls);
        for (int round = 0; round < 200; round++) {
            int fd = raw_connect(round % 2 ? &sa : &ls);
            size_t n = (size_t)(rand_r(&seed) % 3000);
            uint8_t g[3000];
            for (size_t k = 0; k < n; k++)
                g[k] = (uint8_t)rand_r(&seed);
            if (round % 7 == 0 && n >= 4)  /* valid magic, garbage after it */
                memcpy(g, round % 2 ? "KVA1" : "KVLQ", 4);
            (void)kvli_tcp_io_write(fd, g, n, kvli_clock_ns() + 200000000ull);
            if (round % 3 == 0) {
                uint8_t sink[256];
                (void)kvli_tcp_io_read(fd, sink, sizeof(sink), kvli_clock_ns() + 50000000ull);
            }
            close(fd);
        }
        /* serving goes on while the idle connections are still open */
        KT_OK(kvl_metadata_fetch(b, la, NULL, 0));
        kt_fill(bbuf, len, 13);
        kt_write_wait(b, "alpha", bbuf, ad.addr, len, 10000);
        KT_CHECK(memcmp(abuf, bbuf, len) == 0);
        for (int i = 0; i < 8; i++)
            close(idle[i]);
        printf("5. 200 garbage connections + 8 idle ones: alpha still serves\n");
    }

    /* 5b. a flood of idle connections from one address holds at most
     * KVLI_LSN_PER_HOST slots: a client from another address is served */
    {
        char lh[128];
        unsigned lp = 0;
        snprintf(lh, sizeof(lh), "%s", la);
        char *colon = strrchr(lh, ':');
        KT_CHECK(colon != NULL);
        *colon = '\0';
        lp = (unsigned)atoi(colon + 1);
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)lp)};
        inet_pton(AF_INET, lh, &dst.sin_addr);
        int flood[40], held = 0;
        for (int i = 0; i < 40; i++) {
            flood[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            struct sockaddr_in src = {.sin_family = AF_INET};
            inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
            KT_CHECK(bind(flood[i], (struct sockaddr *)&src, sizeof(src)) == 0);
            held += connect(flood[i], (struct sockaddr *)&dst, sizeof(dst)) == 0;
        }
        KT_CHECK(held == 40); /* accepted by the kernel; the listener decides */
        KT_OK(kvl_metadata_fetch(b, la, NULL, 0)); /* from 127.0.0.1 */
        for (int i = 0; i < 40; i++)
            close(flood[i]);
        printf("5b. 40 idle connections from 127.0.0.2: a client from 127.0.0.1 is served\n");
    }

    /* 5c. an agent's own metadata pushed to it is refused */
    KT_STATUS(kvl_metadata_push(a, la), KVL_ERR_REMOTE_REFUSED);
    KT_ERROR_HAS("refuses metadata that names itself");
    printf("5c. alpha's own metadata pushed to alpha: refused\n");

    /* 6. destroy sends INVALIDATE to every listener we pushed to */
    KT_OK(kvl_remote_check(a, "beta"));
    kvl_agent_destroy(b);
    KT_STATUS(kvl_remote_check(a, "beta"), KVL_ERR_NOT_FOUND);
    printf("6. destroy invalidated beta at alpha\n");
    kvl_agent_destroy(c);
    kvl_agent_destroy(dd);
    kvl_agent_destroy(a);
    kvl_log_set_callback(NULL, NULL);
    munmap(map, len + 2 * page);
    free(ref);
    free(bbuf);
    printf("listener: ok\n");
    return 0;
}
