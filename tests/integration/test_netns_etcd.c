/*
 * The etcd store across a network partition: two hosts made of network
 * namespaces joined by a veth pair (created and removed here; skipped with
 * 77 when the machine forbids it or etcd is absent). Host E runs etcd and the
 * agent "stay"; host P runs the agent "part" (a child process). Checked:
 * "stay" fetches "part" through etcd and writes to it over tcp; the link is
 * cut (P's packets go nowhere: no refusal, only silence); a publish in P
 * fails bounded by its timeout, naming the endpoint; "part"'s lease expires
 * and "stay" drops it; the link comes back; "part"'s keeper grants a new
 * lease and publishes again; "stay" fetches it again and the write works.
 * And a watch resumed after etcd compacted its history: "part" follows the
 * agents "other" and "still" (host E); while P is cut off, "other" restarts
 * (a new incarnation) and etcd is compacted past P's watches; once healed,
 * each watch finds its revision compacted, P checks that peer, drops
 * "other"'s old incarnation and keeps "still".
 * KVL_TEST_LABELS: etcd netns
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/kt_etcd.h"

/* host E (etcd, this process): ns[0]; host P (the agent "part"): ns[1] */
static kt_netns_pair_t net;
static kt_etcd_t etcd;

static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int fd, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    kt_send_msg(fd, buf, strlen(buf));
}

/* An agent with a tcp backend on this host's address (timeout 2 s). */
static kvl_agent_t *tcp_agent(const char *name, const char *ip)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 2000};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p = {"host", ip};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    return a;
}

/* Host P: the agent "part"; commands from the parent on cmd, replies on rep. */
static void part_main(int cmd, int rep)
{
    kt_netns_join(net.ns[1]);
    kvl_agent_t *a = tcp_agent("part", net.ip[1]);
    uint8_t *buf = calloc(1, 1 << 20);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, 1 << 20, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_etcd_config_t ec = {.endpoints = etcd.url, .prefix = "/kt/netns", .lease_ttl_s = 3};
    KT_OK(kvl_etcd_attach(a, &ec));
    KT_OK(kvl_etcd_publish(a, NULL));
    say(rep, "ready %llu", (unsigned long long)(uintptr_t)buf);
    for (;;) {
        uint64_t len;
        char *m = kt_recv_msg(cmd, &len, -1);
        if (m == NULL || strcmp(m, "exit") == 0)
            break;
        if (strcmp(m, "publish") == 0) {
            uint64_t t0 = kt_now_ms();
            kvl_status_t st = kvl_etcd_publish(a, NULL);
            say(rep, "%s %llu %s", kvl_status_name(st), (unsigned long long)(kt_now_ms() - t0),
                st == KVL_OK ? "" : kvl_last_error()->what);
        } else if (strncmp(m, "follow ", 7) == 0) {
            say(rep, "%s", kvl_status_name(kvl_etcd_fetch(a, m + 7, NULL, 10000)));
        } else if (strncmp(m, "has ", 4) == 0) {
            say(rep, "%s", kvl_status_name(kvl_remote_check(a, m + 4)));
        } else if (strcmp(m, "check") == 0) {
            long bad = kt_verify(buf, 4096, 91);
            say(rep, "%s", bad == -1 ? "verified" : "differs");
        }
        free(m);
    }
    kvl_agent_destroy(a);
    _exit(0);
}

/* An agent on host E ("other", "still"), published under /kt/netns. */
static kvl_agent_t *other_start(const char *name)
{
    kvl_agent_t *o = tcp_agent(name, net.ip[0]);
    kvl_etcd_config_t ec = {.endpoints = etcd.url, .prefix = "/kt/netns", .lease_ttl_s = 3};
    KT_OK(kvl_etcd_attach(o, &ec));
    KT_OK(kvl_etcd_publish(o, NULL));
    return o;
}

/* Ask host P whether it still holds agent name, until it answers want. */
static int part_has(int cmd, int rep, const char *name, const char *want, int seconds)
{
    for (int i = 0; i < seconds * 10; i++) {
        uint64_t len;
        say(cmd, "has %s", name);
        char *m = kt_recv_msg(rep, &len, 30000);
        KT_CHECK(m != NULL);
        int same = strcmp(m, want) == 0;
        free(m);
        if (same)
            return 1;
        usleep(100000);
    }
    return 0;
}

static int wait_check(kvl_agent_t *a, const char *name, kvl_status_t want, int seconds)
{
    for (int i = 0; i < seconds * 20; i++) {
        if (kvl_remote_check(a, name) == want)
            return 1;
        usleep(50000);
    }
    return 0;
}

int main(void)
{
    if (kvl_etcd_attach(NULL, NULL) == KVL_ERR_UNSUPPORTED) /* built without the store */
        KT_SKIP("%s", kvl_last_error()->what);
    if (kt_etcd_binary() == NULL)
        KT_SKIP("no etcd binary (/usr/bin/etcd from Debian's etcd-server, or KVL_ETCD_BIN)");
    if (geteuid() != 0)
        KT_SKIP("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); running as uid %d",
                (int)geteuid());
    if (kt_sh("command -v ip >/dev/null 2>&1") != 0)
        KT_SKIP("the ip command (iproute2) is not installed");
    signal(SIGPIPE, SIG_IGN);
    kt_netns_pair(&net, "EP", 78);
    /* This process becomes host E (before any thread exists); etcd runs here. */
    kt_netns_join(net.ns[0]);
    etcd.host = net.ip[0];
    kt_etcd_start(&etcd);
    printf("hosts: %s (%s, etcd %s) <-veth-> %s (%s)\n", net.ns[0], net.ip[0], etcd.url,
           net.ns[1], net.ip[1]);

    int cmd[2], rep[2];
    KT_CHECK(pipe(cmd) == 0 && pipe(rep) == 0);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        close(cmd[1]);
        close(rep[0]);
        part_main(cmd[0], rep[1]);
    }
    close(cmd[0]);
    close(rep[1]);
    uint64_t len;
    char *m = kt_recv_msg(rep[0], &len, 60000);
    KT_CHECK(m != NULL && strncmp(m, "ready ", 6) == 0);
    uint64_t pbuf = strtoull(m + 6, NULL, 10);
    free(m);

    kvl_agent_t *a = tcp_agent("stay", net.ip[0]);
    uint8_t *src = malloc(4096);
    kt_fill(src, 4096, 91);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)src, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_etcd_config_t ec = {.endpoints = etcd.url, .prefix = "/kt/netns", .lease_ttl_s = 3};
    KT_OK(kvl_etcd_attach(a, &ec));
    KT_OK(kvl_etcd_fetch(a, "part", NULL, 10000));
    kt_write_wait(a, "part", src, pbuf, 4096, 20000);
    say(cmd[1], "check");
    m = kt_recv_msg(rep[0], &len, 30000);
    KT_CHECK(m != NULL && strcmp(m, "verified") == 0);
    free(m);
    printf("across hosts: fetched through etcd, write verified\n");
    kvl_agent_t *other = other_start("other"), *still = other_start("still");
    for (int i = 0; i < 2; i++) {
        say(cmd[1], "follow %s", i ? "still" : "other");
        m = kt_recv_msg(rep[0], &len, 30000);
        KT_CHECK(m != NULL && strcmp(m, "KVL_OK") == 0);
        free(m);
    }

    /* partition: E's end goes down; P's packets to etcd vanish */
    KT_CHECK(kt_sh("ip -n %s link set %s down", net.ns[0], net.veth[0]) == 0);
    uint64_t t0 = kt_now_ms();
    say(cmd[1], "publish");
    m = kt_recv_msg(rep[0], &len, 120000);
    KT_CHECK(m != NULL);
    printf("publish in the partitioned host: %s\n", m);
    KT_CHECK(strncmp(m, "KVL_ERR_TIMEOUT", 15) == 0 ||
             strncmp(m, "KVL_ERR_REMOTE_DISCONNECT", 25) == 0);
    KT_CHECK(strstr(m, etcd.url) != NULL);
    KT_CHECK(kt_now_ms() - t0 < 60000); /* bounded: never hangs */
    free(m);
    KT_CHECK(wait_check(a, "part", KVL_ERR_NOT_FOUND, 60)); /* its lease expired (TTL 3 s) */
    printf("partition: publish failed bounded naming etcd; the follower dropped 'part' at "
           "lease expiry\n");
    /* meanwhile "other" restarts and etcd forgets the events P's watch missed */
    kvl_agent_destroy(other);
    other = other_start("other");
    KT_CHECK(kt_etcd_compact(&etcd) == 0);
    KT_CHECK(part_has(cmd[1], rep[0], "other", "KVL_OK", 1)); /* P cannot know yet */

    /* heal: part's keeper grants a new lease and publishes again */
    KT_CHECK(kt_sh("ip -n %s link set %s up", net.ns[0], net.veth[0]) == 0);
    KT_OK(kvl_etcd_fetch(a, "part", NULL, 60000));
    kt_fill(src, 4096, 91);
    kt_write_wait(a, "part", src, pbuf, 4096, 20000);
    say(cmd[1], "check");
    m = kt_recv_msg(rep[0], &len, 30000);
    KT_CHECK(m != NULL && strcmp(m, "verified") == 0);
    free(m);
    printf("healed: 'part' published again under a new lease, fetched again, write verified\n");
    KT_CHECK(part_has(cmd[1], rep[0], "other", "KVL_ERR_NOT_FOUND", 60));
    /* "still" did not change: its own watch met the compaction too (its
     * check found the same incarnation); P keeps it */
    KT_CHECK(part_has(cmd[1], rep[0], "still", "KVL_OK", 1));
    printf("compacted: P's watches resumed past etcd's compaction; P checked each peer, dropped "
           "the old incarnation of 'other' and kept 'still'\n");
    kvl_agent_destroy(other);
    kvl_agent_destroy(still);

    say(cmd[1], "exit");
    int st;
    waitpid(pid, &st, 0);
    KT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    kvl_agent_destroy(a);
    free(src);
    kt_etcd_stop(&etcd);
    printf("netns etcd: all cases passed\n");
    return 0;
}
