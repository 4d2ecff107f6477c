/*
 * tcp data port: a flood of connections that never authenticate must not
 * lock real peers out. 1025 idle connections from 127.0.0.2 fill the
 * target's table of accepted connections (1024) -- the target says so in
 * its log -- then an initiator from 127.0.0.1 loads the target's metadata
 * (which connects and authenticates) and writes through it. The flood's
 * connections are still within their handshake bound (the target's timeout
 * is 60 s), so only the target's choice of whom to close decides.
 * Nothing is timed: waits are bounded only so that a hang fails the test.
 * KVL_TEST_LABELS: tcp
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/inet.h"

#define FLOOD 1025
#define LEN 4096u

int main(void)
{
    struct rlimit rl;
    KT_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2 * FLOOD + 256) {
        printf("SKIP: RLIMIT_NOFILE hard limit %llu is below %d\n",
               (unsigned long long)rl.rlim_max, 2 * FLOOD + 256);
        return 77;
    }
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 8192 ? 8192 : rl.rlim_max;
    KT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    kvl_log_set_callback(kt_log_cb, NULL);

    kvl_agent_t *t = kt_agent_tmo("tgt", "tcp", "host=127.0.0.1", 60000);
    kvl_agent_t *a = kt_agent_tmo("init", "tcp", "host=127.0.0.1", 20000);
    uint8_t *tbuf = calloc(1, LEN), *abuf = malloc(LEN);
    KT_CHECK(tbuf != NULL && abuf != NULL);
    kvl_mem_desc_t td = {(uint64_t)(uintptr_t)tbuf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &td, 1, NULL, NULL));
    kvl_mem_desc_t ad = {(uint64_t)(uintptr_t)abuf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &ad, 1, NULL, NULL));
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(t, &blob, &blen));

    /* the target's data port, from a first (ordinary) load */
    char d[512], host[64];
    uint16_t port;
    KT_OK(kvl_metadata_load(a, blob, blen, NULL, 0));
    kvl_remote_describe(a, "tgt", d, sizeof(d));
    char *p = strstr(d, "socket "), *sp = p ? strchr(p + 7, ' ') : NULL;
    KT_CHECK(p != NULL && sp != NULL);
    *sp = '\0';
    KT_CHECK(kvli_tcp_hostport_split(p + 7, host, sizeof(host), &port) == 0);
    KT_OK(kvl_remote_remove(a, "tgt"));

    /* the flood: connect and say nothing */
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    KT_CHECK(inet_pton(AF_INET, host, &dst.sin_addr) == 1);
    static int flood[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        struct sockaddr_in src = {.sin_family = AF_INET};
        inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
        flood[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        KT_CHECK(flood[i] >= 0);
        KT_CHECK(bind(flood[i], (struct sockaddr *)&src, sizeof(src)) == 0);
        KT_CHECK(connect(flood[i], (struct sockaddr *)&dst, sizeof(dst)) == 0);
    }
    /* the target has accepted 1024 of them and seen one more */
    int full = 0;
    for (int i = 0; i < 6000 && !full; i++) { /* a bound for a hang: 120 s */
        full = kt_log_has("connections already open");
        if (!full)
            usleep(20000);
    }
    KT_CHECK(full);

    /* a real peer from another address still gets in */
    kvl_status_t st = kvl_metadata_load(a, blob, blen, NULL, 0);
    char text[2048] = "";
    if (st != KVL_OK)
        kvl_error_render(NULL, text, sizeof(text));
    printf("load during a flood of %d unauthenticated connections: %s %s\n", FLOOD,
           kvl_status_name(st), text);
    KT_OK(st);
    kt_fill(abuf, LEN, 21);
    kt_write_wait(a, "tgt", abuf, td.addr, LEN, 20000);
    KT_CHECK(memcmp(tbuf, abuf, LEN) == 0);

    for (int i = 0; i < FLOOD; i++)
        close(flood[i]);
    kvl_agent_destroy(a);
    kvl_agent_destroy(t);
    kvl_log_set_callback(NULL, NULL);
    kvl_free(blob);
    free(tbuf);
    free(abuf);
    printf("test_tcp_conn_flood: passed\n");
    return 0;
}
