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

static char ns_e[32], ns_p[32], veth_e[16], veth_p[16], ip_e[32], ip_p[32];
static int net_made;
static kt_etcd_t etcd;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void net_teardown(void)
{
    if (!net_made)
        return;
    sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_e, ns_p);
    net_made = 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void join_ns(const char *ns)
{
    char p[128];
    snprintf(p, sizeof(p), "/var/run/netns/%s", ns);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    KT_CHECK(fd >= 0 && setns(fd, CLONE_NEWNET) == 0);
    close(fd);
}

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

/* Host P: the agent "part"; commands from the parent on cmd, replies on rep. */
static void part_main(int cmd, int rep)
{
    join_ns(ns_p);
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 2000};
    KT_OK(kvl_agent_create("part", &cfg, &a));
    kvl_param_t p = {"host", ip_p};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
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
            uint64_t t0 = now_ms();
            kvl_status_t st = kvl_etcd_publish(a, NULL);
            say(rep, "%s %llu %s", kvl_status_name(st), (unsigned long long)(now_ms() - t0),
                st == KVL_OK ? "" : kvl_last_error()->what);
        } else if (strcmp(m, "check") == 0) {
            long bad = kt_verify(buf, 4096, 91);
            say(rep, "%s", bad == -1 ? "verified" : "differs");
        }
        free(m);
    }
    kvl_agent_destroy(a);
    _exit(0);
}

static void write_to(kvl_agent_t *from, const char *to, void *src, uint64_t dst, uint64_t len)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, (uint64_t)(uintptr_t)src, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, dst, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(from, KVL_WRITE, l, to, r, NULL, &x));
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 20000);
    KT_OK(st);
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
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
    if (sh("command -v ip >/dev/null 2>&1") != 0)
        KT_SKIP("the ip command (iproute2) is not installed");
    signal(SIGPIPE, SIG_IGN);
    int id = getpid() % 200 + 20;
    snprintf(ns_e, sizeof(ns_e), "kvlE%d", (int)getpid());
    snprintf(ns_p, sizeof(ns_p), "kvlP%d", (int)getpid());
    snprintf(veth_e, sizeof(veth_e), "kve%d", (int)getpid() % 100000);
    snprintf(veth_p, sizeof(veth_p), "kvp%d", (int)getpid() % 100000);
    snprintf(ip_e, sizeof(ip_e), "10.%d.78.1", id);
    snprintf(ip_p, sizeof(ip_p), "10.%d.78.2", id);
    if (sh("ip netns add %s 2>/tmp/kvl_netns_etcd_err.txt", ns_e) != 0) {
        char why[256] = "";
        FILE *f = fopen("/tmp/kvl_netns_etcd_err.txt", "r");
        if (f) {
            if (!fgets(why, sizeof(why), f))
                why[0] = 0;
            fclose(f);
        }
        KT_SKIP("'ip netns add' is not allowed here: %s", why);
    }
    net_made = 1;
    atexit(net_teardown);
    KT_CHECK(sh("ip netns add %s", ns_p) == 0);
    KT_CHECK(sh("ip link add %s type veth peer name %s", veth_e, veth_p) == 0);
    KT_CHECK(sh("ip link set %s netns %s && ip link set %s netns %s", veth_e, ns_e, veth_p,
                ns_p) == 0);
    KT_CHECK(sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up && ip -n %s link set "
                "lo up", ns_e, ip_e, veth_e, ns_e, veth_e, ns_e) == 0);
    KT_CHECK(sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up && ip -n %s link set "
                "lo up", ns_p, ip_p, veth_p, ns_p, veth_p, ns_p) == 0);
    /* This process becomes host E (before any thread exists); etcd runs here. */
    join_ns(ns_e);
    etcd.host = ip_e;
    kt_etcd_start(&etcd);
    printf("hosts: %s (%s, etcd %s) <-veth-> %s (%s)\n", ns_e, ip_e, etcd.url, ns_p, ip_p);

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

    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 2000};
    KT_OK(kvl_agent_create("stay", &cfg, &a));
    kvl_param_t p = {"host", ip_e};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    uint8_t *src = malloc(4096);
    kt_fill(src, 4096, 91);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)src, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_etcd_config_t ec = {.endpoints = etcd.url, .prefix = "/kt/netns", .lease_ttl_s = 3};
    KT_OK(kvl_etcd_attach(a, &ec));
    KT_OK(kvl_etcd_fetch(a, "part", NULL, 10000));
    write_to(a, "part", src, pbuf, 4096);
    say(cmd[1], "check");
    m = kt_recv_msg(rep[0], &len, 30000);
    KT_CHECK(m != NULL && strcmp(m, "verified") == 0);
    free(m);
    printf("across hosts: fetched through etcd, write verified\n");

    /* partition: E's end goes down; P's packets to etcd vanish */
    KT_CHECK(sh("ip -n %s link set %s down", ns_e, veth_e) == 0);
    uint64_t t0 = now_ms();
    say(cmd[1], "publish");
    m = kt_recv_msg(rep[0], &len, 120000);
    KT_CHECK(m != NULL);
    printf("publish in the partitioned host: %s\n", m);
    KT_CHECK(strncmp(m, "KVL_ERR_TIMEOUT", 15) == 0 ||
             strncmp(m, "KVL_ERR_REMOTE_DISCONNECT", 25) == 0);
    KT_CHECK(strstr(m, etcd.url) != NULL);
    KT_CHECK(now_ms() - t0 < 60000); /* bounded: never hangs */
    free(m);
    KT_CHECK(wait_check(a, "part", KVL_ERR_NOT_FOUND, 60)); /* its lease expired (TTL 3 s) */
    printf("partition: publish failed bounded naming etcd; the follower dropped 'part' at "
           "lease expiry\n");

    /* heal: part's keeper grants a new lease and publishes again */
    KT_CHECK(sh("ip -n %s link set %s up", ns_e, veth_e) == 0);
    KT_OK(kvl_etcd_fetch(a, "part", NULL, 60000));
    kt_fill(src, 4096, 91);
    write_to(a, "part", src, pbuf, 4096);
    say(cmd[1], "check");
    m = kt_recv_msg(rep[0], &len, 30000);
    KT_CHECK(m != NULL && strcmp(m, "verified") == 0);
    free(m);
    printf("healed: 'part' published again under a new lease, fetched again, write verified\n");

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
