/*
 * tcp backend between processes on loopback, what only tcp does: the peer
 * is described by its socket address, kill -9 of the target mid-transfer
 * (bounded, named error; the reconnect fails fast and says why) and a
 * target restarting under the same name and port (stale refused, new
 * works). WRITE, READ, strided lists, notifications both ways, transfers in
 * flight and cancel (with tcp's CANCELED notice) are in the transfer
 * contract (test_contract.c).
 * KVL_TEST_LABELS: tcp
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define MIB (1ull << 20)

/* A WRITE of len bytes from l here to r there. */
static kvl_xfer_t *mk(kvl_agent_t *a, uint64_t l, uint64_t r, uint64_t len, const char *remote)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add(ld, l, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(rd, r, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, ld, remote, rd, NULL, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static uint16_t free_port(void)
{
    struct sockaddr_in s = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(s);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    KT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&s, sizeof(s)) == 0);
    KT_CHECK(getsockname(fd, (struct sockaddr *)&s, &sl) == 0);
    close(fd);
    return ntohs(s.sin_port);
}

typedef struct {
    pid_t pid;
    int ms;
} killer_t;

static void *killer(void *arg)
{
    killer_t *k = arg;
    usleep((useconds_t)k->ms * 1000u);
    kill(k->pid, SIGKILL);
    return NULL;
}

int main(void)
{
    const size_t len = 64 * MIB;
    kvl_agent_t *a = kt_agent("init", "tcp", "host=127.0.0.1");
    uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = "tgt", .len = len, .backend = "tcp", .params = "host=127.0.0.1"};
    kt_peer_t p;
    kt_peer_start(&p, &o, a);
    char text[4096];
    kvl_remote_describe(a, "tgt", text, sizeof(text));
    printf("describe: %s", text);
    KT_CHECK(strstr(text, "tcp: socket 127.0.0.1:") != NULL);

    /* the peer holds our metadata too, as in use */
    {
        void *blob;
        size_t bl;
        KT_OK(kvl_metadata_get(a, &blob, &bl));
        kt_peer_load(&p, blob, bl);
        kvl_free(blob);
    }
    kvl_xfer_t *x;

    /* 1. kill -9 of the target mid-transfer: error within the bound, naming
     *    the peer, the backend and the bytes moved */
    {
        kvl_xfer_params_t prm = {.field_mask = KVL_XFER_PARAM_TIMEOUT, .timeout_ms = 2000};
        kvl_dlist_t *ld, *rd;
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
        KT_OK(kvl_dlist_add(ld, d.addr, len, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(rd, p.base, len, KVL_DEV_ANY));
        KT_OK(kvl_xfer_create(a, KVL_WRITE, ld, "tgt", rd, &prm, &x));
        killer_t k = {p.pid, 150};
        pthread_t t;
        pthread_create(&t, NULL, killer, &k);
        kvl_status_t s = KVL_OK;
        uint64_t t0 = kt_now_ms(), worst = 0;
        while (s == KVL_OK && kt_now_ms() - t0 < 20000) {
            uint64_t w0 = kt_now_ms();
            s = kvl_xfer_post(x);
            if (s == KVL_IN_PROGRESS)
                s = kvl_xfer_wait(x, 10000);
            if (kt_now_ms() - w0 > worst)
                worst = kt_now_ms() - w0;
        }
        pthread_join(t, NULL);
        kt_peer_kill(&p);
        char e[4096];
        kvl_error_render(NULL, e, sizeof(e));
        printf("1. after kill -9: %s (slowest post+wait %llu ms)\n%s\n", kvl_status_name(s),
               (unsigned long long)worst, e);
        KT_CHECK(s == KVL_ERR_REMOTE_DISCONNECT);
        KT_CHECK(worst < 4000);
        KT_ERROR_HAS("agent 'tgt'");
        KT_ERROR_HAS("tcp");
        KT_ERROR_HAS("disconnected");
        /* posting again: the reconnect fails fast and says why */
        t0 = kt_now_ms();
        KT_STATUS(kvl_xfer_post(x), KVL_ERR_REMOTE_DISCONNECT);
        KT_CHECK(kt_now_ms() - t0 < 3000);
        KT_ERROR_HAS("connect(");
        kvl_xfer_release(x);
        kvl_dlist_destroy(ld);
        kvl_dlist_destroy(rd);
        KT_OK(kvl_remote_remove(a, "tgt"));
    }

    /* 2. a target restarting under the same name and port */
    {
        char params[128];
        snprintf(params, sizeof(params), "host=127.0.0.1,port=%u", (unsigned)free_port());
        kt_peer_opts_t o2 = {.name = "tgt2", .len = 4 * MIB, .backend = "tcp", .params = params};
        kt_peer_t p2, p3;
        kt_peer_start(&p2, &o2, a);
        uint64_t inc_old = kvl_remote_incarnation(a, "tgt2");
        kt_fill(buf, 4 * MIB, 9);
        x = mk(a, d.addr, p2.base, 4 * MIB, "tgt2");
        kvl_xfer_post(x);
        KT_OK(kvl_xfer_wait(x, 10000));
        kt_peer_stop(&p2);
        kt_peer_start(&p3, &o2, NULL);      /* same name and port, new incarnation */
        kvl_status_t s = kvl_xfer_post(x);
        if (s == KVL_IN_PROGRESS)
            s = kvl_xfer_wait(x, 10000);
        char e[4096];
        kvl_error_render(NULL, e, sizeof(e));
        printf("2. old metadata against the restarted target: %s\n%s\n", kvl_status_name(s), e);
        KT_CHECK(s == KVL_ERR_STALE);
        KT_ERROR_HAS("stale");
        size_t bl;
        void *blob = kt_peer_metadata(&p3, &bl);
        KT_OK(kvl_metadata_load(a, blob, bl, NULL, 0));
        free(blob);
        KT_CHECK(kvl_remote_incarnation(a, "tgt2") != inc_old);
        KT_STATUS(kvl_xfer_post(x), KVL_ERR_STALE);   /* the core: prepare it again */
        kvl_xfer_release(x);
        kvl_mem_desc_t r;
        size_t nr = 0;
        KT_OK(kvl_remote_regions(a, "tgt2", &r, NULL, 1, &nr));
        x = mk(a, d.addr, r.addr, 4 * MIB, "tgt2");
        kvl_xfer_post(x);
        KT_OK(kvl_xfer_wait(x, 10000));
        KT_CHECK(kt_peer_verify(&p3, 0, 4 * MIB, 9) == -1);
        kvl_xfer_release(x);
        kt_peer_stop(&p3);
        printf("2. restart: stale refused, new incarnation works\n");
    }
    kvl_agent_destroy(a);
    munmap(buf, len);
    printf("tcp: ok\n");
    return 0;
}
