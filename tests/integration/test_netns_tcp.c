/*
 * Two hosts made of network namespaces joined by a veth pair (created and
 * removed here; skipped with 77 when the machine forbids it). The target runs
 * in its own namespace (ip netns exec); this process joins the other one.
 * Metadata crosses the "network" through the agent listener. Checked: a
 * verified WRITE/READ, the link set down mid-transfer (bounded error, then
 * reconnect once it is up), kill -9 of the target mid-transfer, the target
 * restarting under the same name and port (stale refused until the new
 * metadata is fetched), and a peer without the shared secret (refused).
 * KVL_TEST_LABELS: tcp netns
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define MIB (1ull << 20)
#define TLEN (64 * MIB)

static char self[4096];
static kt_netns_pair_t net;   /* host A: ns[0], ip[0]; host B (the target): ns[1] */

/* ---- the target, in namespace B ---- */
static int target_main(char **argv)
{
    const char *name = argv[2], *host = argv[3], *port = argv[4], *secret = argv[6];
    int lport = atoi(argv[5]);
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 2000};
    if (strcmp(secret, "-") != 0) {
        cfg.field_mask |= KVL_AGENT_CFG_SECRET;
        cfg.secret = secret;
    }
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p[2] = {{"host", host}, {"port", port}};
    KT_OK(kvl_backend_create(a, "tcp", p, 2, NULL));
    void *buf = mmap(NULL, TLEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kt_fill(buf, TLEN, 77);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, TLEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    char bound[128];
    KT_OK(kvl_agent_listen(a, host, (uint16_t)lport, bound, sizeof(bound)));
    printf("ready %s\n", bound);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)   /* until the parent closes our stdin */
        ;
    kvl_agent_destroy(a);
    return 0;
}

typedef struct {
    pid_t pid;
    int in, out;
    char hp[128];
} target_t;

static void target_start(target_t *t, const char *name, const char *port, int lport,
                         const char *secret)
{
    int to[2], from[2];
    char lp[16];
    KT_CHECK(pipe(to) == 0 && pipe(from) == 0);
    snprintf(lp, sizeof(lp), "%d", lport);
    t->pid = fork();
    KT_CHECK(t->pid >= 0);
    if (t->pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execlp("ip", "ip", "netns", "exec", net.ns[1], self, "target", name, net.ip[1], port, lp,
               secret, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    t->in = to[1];
    t->out = from[0];
    char line[256];
    size_t n = 0;
    while (n < sizeof(line) - 1) {
        ssize_t r = read(t->out, line + n, 1);
        if (r <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    KT_CHECK(strncmp(line, "ready ", 6) == 0);
    snprintf(t->hp, sizeof(t->hp), "%.120s", line + 6);
}

static void target_stop(target_t *t, int sig)
{
    if (sig)
        kill(t->pid, sig);
    close(t->in);
    waitpid(t->pid, NULL, 0);
    close(t->out);
}

static kvl_xfer_t *mk(kvl_agent_t *a, kvl_xfer_op_t op, void *l, const char *rname, uint64_t len,
                      uint64_t tmo)
{
    kvl_mem_desc_t r;
    size_t n = 0;
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    kvl_xfer_params_t prm = {.field_mask = KVL_XFER_PARAM_TIMEOUT, .timeout_ms = tmo};
    KT_OK(kvl_remote_regions(a, rname, &r, NULL, 1, &n));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add(ld, (uint64_t)(uintptr_t)l, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(rd, r.addr, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, op, ld, rname, rd, &prm, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static kvl_status_t run(kvl_xfer_t *x, uint64_t *ms)
{
    uint64_t t0 = kt_now_ms();
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 30000);
    if (ms)
        *ms = kt_now_ms() - t0;
    return st;
}

typedef struct {
    int ms;
    char cmd[256];
    pid_t pid;
} later_t;

static void *later(void *arg)
{
    later_t *l = arg;
    usleep((useconds_t)l->ms * 1000u);
    if (l->pid > 0)
        kill(l->pid, SIGKILL);
    else
        kt_sh("%s", l->cmd);
    return NULL;
}

/* Post the transfer again and again until it fails (or 20 s pass); the
 * disruption happens meanwhile. Returns the failure; *worst the slowest call. */
static kvl_status_t until_failure(kvl_xfer_t *x, later_t *l, uint64_t *worst)
{
    pthread_t t;
    kvl_status_t st = KVL_OK;
    uint64_t t0 = kt_now_ms(), ms;
    *worst = 0;
    pthread_create(&t, NULL, later, l);
    while (st == KVL_OK && kt_now_ms() - t0 < 20000) {
        st = run(x, &ms);
        if (ms > *worst)
            *worst = ms;
    }
    pthread_join(t, NULL);
    return st;
}

int main(int argc, char **argv)
{
    if (argc >= 7 && strcmp(argv[1], "target") == 0)
        return target_main(argv);
    if (geteuid() != 0)
        KT_SKIP("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); running as uid %d",
                (int)geteuid());
    if (kt_sh("command -v ip >/dev/null 2>&1") != 0)
        KT_SKIP("the ip command (iproute2) is not installed");
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    KT_CHECK(sl > 0);
    self[sl] = 0;
    kt_netns_pair(&net, "AB", 77);
    /* This process becomes host A: join namespace A before any thread exists. */
    kt_netns_join(net.ns[0]);
    printf("hosts: %s (%s) <-veth-> %s (%s)\n", net.ns[0], net.ip[0], net.ns[1], net.ip[1]);

    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 2000};
    KT_OK(kvl_agent_create("hostA", &cfg, &a));
    kvl_param_t p = {"host", net.ip[0]};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    uint8_t *buf = mmap(NULL, 2 * TLEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, 2 * TLEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));

    /* 1. fetch over the veth, READ (verify), WRITE, READ back (verify) */
    target_t t;
    target_start(&t, "hostB", "7100", 7101, "-");
    char name[64];
    KT_OK(kvl_metadata_fetch(a, t.hp, name, sizeof(name)));
    kvl_xfer_t *rx = mk(a, KVL_READ, buf, "hostB", TLEN, 2000);
    KT_OK(run(rx, NULL));
    KT_CHECK(kt_verify(buf, TLEN, 77) == -1);
    kt_fill(buf, TLEN, 5);
    kvl_xfer_t *wx = mk(a, KVL_WRITE, buf, "hostB", TLEN, 2000);
    uint64_t ms;
    KT_OK(run(wx, &ms));
    printf("1. 64 MiB over the veth in %llu ms\n", (unsigned long long)ms);
    kvl_xfer_release(rx);
    rx = mk(a, KVL_READ, buf + TLEN, "hostB", TLEN, 2000);
    KT_OK(run(rx, NULL));
    KT_CHECK(memcmp(buf, buf + TLEN, TLEN) == 0);
    kvl_xfer_release(rx);

    /* 2. link down mid-transfer: the transfer fails within its 2 s bound */
    later_t l = {.ms = 150};
    snprintf(l.cmd, sizeof(l.cmd), "ip link set %s down", net.veth[0]);
    uint64_t worst;
    kvl_status_t st = until_failure(wx, &l, &worst);
    char e[4096];
    kvl_error_render(NULL, e, sizeof(e));
    printf("2. link down: %s, slowest call %llu ms\n%s\n", kvl_status_name(st),
           (unsigned long long)worst, e);
    KT_CHECK(st != KVL_OK && st != KVL_ERR_TIMEOUT);
    KT_CHECK(worst < 2000 + 1500);
    KT_ERROR_HAS("hostB");
    KT_CHECK(kt_sh("ip link set %s up", net.veth[0]) == 0);
    usleep(300000);
    st = KVL_ERR_REMOTE;
    for (int i = 0; i < 20 && st != KVL_OK; i++) {   /* reconnects once the link is back */
        st = run(wx, NULL);
        if (st != KVL_OK)
            usleep(200000);
    }
    KT_OK(st);
    printf("2. link back up: the next transfer reconnected\n");

    /* 3. kill -9 of the target mid-transfer */
    later_t k = {.ms = 100, .pid = t.pid};
    st = until_failure(wx, &k, &worst);
    kvl_error_render(NULL, e, sizeof(e));
    printf("3. kill -9: %s, slowest call %llu ms\n%s\n", kvl_status_name(st),
           (unsigned long long)worst, e);
    KT_CHECK(st == KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(worst < 2000 + 1500);
    KT_ERROR_HAS("agent 'hostB'");
    KT_ERROR_HAS("disconnected");
    target_stop(&t, 0);

    /* 4. the target restarts under the same name and port */
    target_start(&t, "hostB", "7100", 7101, "-");
    st = run(wx, NULL);
    kvl_error_render(NULL, e, sizeof(e));
    printf("4. old metadata after the restart: %s\n%s\n", kvl_status_name(st), e);
    KT_CHECK(st == KVL_ERR_STALE);
    KT_OK(kvl_metadata_fetch(a, t.hp, NULL, 0));
    KT_STATUS(run(wx, NULL), KVL_ERR_STALE);  /* built on the old metadata */
    kvl_xfer_release(wx);
    wx = mk(a, KVL_WRITE, buf, "hostB", TLEN, 2000);
    KT_OK(run(wx, NULL));
    rx = mk(a, KVL_READ, buf + TLEN, "hostB", TLEN, 2000);
    memset(buf + TLEN, 0, TLEN);
    KT_OK(run(rx, NULL));
    KT_CHECK(memcmp(buf, buf + TLEN, TLEN) == 0);
    kvl_xfer_release(rx);
    kvl_xfer_release(wx);
    target_stop(&t, 0);
    printf("4. new incarnation fetched and verified\n");

    /* 5. a target with a shared secret refuses us (we have none) */
    target_start(&t, "hostS", "0", 0, "s3cret");
    KT_STATUS(kvl_metadata_fetch(a, t.hp, NULL, 0), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("requires a shared secret");
    target_stop(&t, 0);
    printf("5. secret required across hosts: refused\n");

    kvl_agent_destroy(a);
    kt_netns_remove();
    printf("netns: ok\n");
    return 0;
}
