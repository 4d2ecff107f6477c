/*
 * The etcd metadata store against a real etcd (temporary data dir, free
 * ports): publish with a lease, fetch by name (and waiting for a publish;
 * in the background, many at once),
 * a transfer set up through it, removal on destroy, a restart (new
 * incarnation) and a process killed -9 seen by the watcher, a region update
 * republished; failures: etcd down at start, killed mid-run (calls fail
 * bounded and named, the transfer already set up keeps working, the agent
 * republishes when etcd is back), a revoked (expired) lease, a dead member
 * in the endpoint list, authentication refused; bad input refused; the
 * presence key never goes back to an older generation (a partial label
 * republished after the full one).
 * KVL_TEST_LABELS: etcd tsan
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/kt_etcd.h"

static kt_etcd_t etcd;

static kvl_agent_t *agent(const char *name)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 1500};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p = {"host", "127.0.0.1"};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    return a;
}

static kvl_status_t attach(kvl_agent_t *a, const char *eps, const char *prefix, unsigned ttl)
{
    kvl_etcd_config_t c = {.endpoints = eps, .prefix = prefix, .lease_ttl_s = ttl};
    return kvl_etcd_attach(a, &c);
}

/* Poll (bounded: never hangs) until kvl_remote_check(a, name) == want. */
static int wait_check(kvl_agent_t *a, const char *name, kvl_status_t want, int seconds)
{
    for (int i = 0; i < seconds * 20; i++) {
        if (kvl_remote_check(a, name) == want)
            return 1;
        usleep(50000);
    }
    return 0;
}

/* A child process whose agent `name` published under pfx (lease ttl),
 * then waits to be killed, stopped (SIGSTOP) when stop. Fork before this
 * process has threads. */
static pid_t publisher(const char *name, const char *pfx, unsigned ttl, bool stop)
{
    int pfd[2];
    KT_CHECK(pipe(pfd) == 0);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        kvl_agent_t *c = agent(name);
        if (attach(c, etcd.url, pfx, ttl) != KVL_OK || kvl_etcd_publish(c, NULL) != KVL_OK)
            _exit(2);
        if (write(pfd[1], "x", 1) != 1)
            _exit(3);
        if (stop)
            raise(SIGSTOP);
        for (;;)
            pause();
    }
    close(pfd[1]);
    char ch;
    KT_CHECK(read(pfd[0], &ch, 1) == 1);
    close(pfd[0]);
    if (stop) {
        int wst;
        KT_CHECK(waitpid(pid, &wst, WUNTRACED) == pid && WIFSTOPPED(wst));
    }
    return pid;
}

static void bad_input(void)
{
    kvl_agent_t *a = agent("bad");
    KT_STATUS(attach(a, "", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("no endpoint given");
    KT_STATUS(attach(a, "unix:///run/etcd.sock", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("only http:// and https://");
    KT_STATUS(attach(a, "http://127.0.0.1:2379/v3", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("is not a client URL");
    KT_STATUS(attach(a, " , ,", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("names no endpoint");
    KT_STATUS(attach(a, etcd.url, "no-slash", 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("must start with '/'");
    KT_STATUS(attach(a, etcd.url, NULL, 7200), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_etcd_publish(a, NULL), KVL_ERR_STATE);
    KT_ERROR_HAS("is not attached to etcd");
    KT_OK(attach(a, etcd.url, "/kt/bad", 5));
    KT_STATUS(attach(a, etcd.url, "/kt/bad", 5), KVL_ERR_EXISTS);
    KT_STATUS(kvl_etcd_publish(a, "a/b"), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_etcd_fetch(a, "bad", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("is not its own peer");
    KT_STATUS(kvl_etcd_fetch(a, "x/y", NULL, 0), KVL_ERR_INVALID_ARG);
    uint64_t t0 = kt_now_ms();
    KT_STATUS(kvl_etcd_fetch(a, "nobody", NULL, 300), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("etcd has no metadata of agent 'nobody' under /kt/bad/nobody/metadata");
    KT_CHECK(kt_now_ms() - t0 >= 300 && kt_now_ms() - t0 < 30000);
    kvl_agent_destroy(a);
    printf("bad input: refused, each with its reason\n");
}

static void down_at_start_and_dead_member(void)
{
    char eps[200];
    unsigned dead = kt_free_port();
    kvl_agent_t *a = agent("early");
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%u", dead);
    uint64_t t0 = kt_now_ms();
    KT_STATUS(attach(a, eps, "/kt/dead", 5), KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS("no etcd endpoint answered /v3/lease/grant");
    KT_ERROR_HAS(eps);
    KT_CHECK(kt_now_ms() - t0 < 30000);
    /* a dead member first: skipped, the live one serves */
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%u,%s", dead, etcd.url);
    KT_OK(attach(a, eps, "/kt/dead", 5));
    kvl_agent_t *b = agent("late");
    KT_OK(attach(b, eps, "/kt/dead", 5));
    KT_OK(kvl_etcd_publish(b, NULL));
    KT_OK(kvl_etcd_fetch(a, "late", NULL, 30000)); /* waits out a lease lost to load */
    kvl_agent_destroy(b);
    KT_CHECK(wait_check(a, "late", KVL_ERR_NOT_FOUND, 30));
    kvl_agent_destroy(a);
    printf("etcd down at start: refused, naming %s; a dead member in the list is skipped\n",
           "the endpoint");
}

/* etcd stopped (SIGSTOP): calls on the connection an agent holds and
 * on a new one get no answer; KVL_ERR_TIMEOUT (as through the gateway),
 * bounded; the agent works again once etcd goes on. */
static void stopped_etcd(void)
{
    kvl_agent_t *a = agent("stopped-a"), *b = agent("stopped-b");
    KT_OK(attach(a, etcd.url, "/kt/stopped", 30));
    kt_etcd_pause(&etcd, 1);
    uint64_t t0 = kt_now_ms();
    KT_STATUS(kvl_etcd_publish(a, NULL), KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("no etcd endpoint answered");
    KT_STATUS(attach(b, etcd.url, "/kt/stopped", 30), KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("no etcd endpoint answered /v3/lease/grant");
    KT_CHECK(kt_now_ms() - t0 < 60000);
    kt_etcd_pause(&etcd, 0);
    KT_OK(kvl_etcd_publish(a, NULL));
    kvl_agent_destroy(b);
    kvl_agent_destroy(a);
    printf("etcd stopped (%s): KVL_ERR_TIMEOUT, on a held connection and a new one\n",
           getenv("KVL_ETCD_API") ? getenv("KVL_ETCD_API") : "auto");
}

/* Background fetches (kvl_etcd_fetch_async): many peers at once, some
 * publishing only after the fetch started; followed like kvl_etcd_fetch's;
 * not published within the wait: failed with the reason; asked again:
 * pending until the peer comes; destroy with one pending is bounded. */
static void background(void)
{
    enum { NP = 12 };
    const char *pfx = "/kt/bg";
    char names[NP][16];
    kvl_agent_t *a = agent("bg-a"), *p[NP];
    KT_OK(attach(a, etcd.url, pfx, 5));
    KT_STATUS(kvl_etcd_fetch_async(a, "bg-a", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("is not its own peer");
    KT_STATUS(kvl_etcd_fetch_async(a, "x/y", NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_etcd_fetch_async: agent name 'x/y'");
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-0", 0), KVL_ERR_STATE);
    KT_ERROR_HAS("started no background fetch of agent 'bg-0'");
    for (int i = 0; i < NP; i++) {
        snprintf(names[i], sizeof(names[i]), "bg-%d", i);
        p[i] = agent(names[i]);
        KT_OK(attach(p[i], etcd.url, pfx, 5));
        if (i % 2 == 0)
            KT_OK(kvl_etcd_publish(p[i], NULL));
    }
    for (int i = 0; i < NP; i++)
        KT_OK(kvl_etcd_fetch_async(a, names[i], NULL, 60000));
    for (int i = 1; i < NP; i += 2)
        KT_OK(kvl_etcd_publish(p[i], NULL));
    for (int i = 0; i < NP; i++) {
        KT_OK(kvl_etcd_fetch_status(a, names[i], 60000));
        KT_OK(kvl_remote_check(a, names[i]));
    }
    /* followed: a departure drops it */
    kvl_agent_destroy(p[0]);
    KT_CHECK(wait_check(a, names[0], KVL_ERR_NOT_FOUND, 30));
    /* not published within its wait */
    KT_OK(kvl_etcd_fetch_async(a, "bg-nobody", NULL, 300));
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-nobody", 60000), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("etcd has no metadata of agent 'bg-nobody' under /kt/bg/bg-nobody/metadata "
                 "(waited 300 ms)");
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-nobody", 0), KVL_ERR_NOT_FOUND); /* it stays */
    for (int i = 0; i < 600 && !kt_log_has("background fetch of agent 'bg-nobody' failed"); i++)
        usleep(50000); /* logged by the fetcher once it let the status go */
    KT_CHECK(kt_log_has("agent 'bg-a': background fetch of agent 'bg-nobody' failed: "));
    /* asked again: pending (its peer does not exist yet) until it publishes */
    KT_OK(kvl_etcd_fetch_async(a, "bg-nobody", NULL, 60000));
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-nobody", 0), KVL_IN_PROGRESS);
    kvl_agent_t *late = agent("bg-nobody");
    KT_OK(attach(late, etcd.url, pfx, 5));
    KT_OK(kvl_etcd_publish(late, NULL));
    KT_OK(kvl_etcd_fetch_status(a, "bg-nobody", 60000));
    KT_OK(kvl_remote_check(a, "bg-nobody"));
    /* gone, published again, fetched again */
    KT_OK(kvl_etcd_unpublish(late));
    KT_CHECK(wait_check(a, "bg-nobody", KVL_ERR_NOT_FOUND, 30));
    KT_OK(kvl_etcd_publish(late, NULL));
    KT_OK(kvl_etcd_fetch_async(a, "bg-nobody", NULL, 60000));
    KT_OK(kvl_etcd_fetch_status(a, "bg-nobody", 60000));
    KT_OK(kvl_remote_check(a, "bg-nobody"));
    /* results kept: the last 4096 (13 older ones above, all ended: the
     * 4097 new names forget those and bg-x0, the oldest of the new) */
    for (int i = 0; i < 4096; i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "bg-x%d", i);
        KT_OK(kvl_etcd_fetch_async(a, nm, NULL, 0));
    }
    for (int i = 0; i < 4096; i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "bg-x%d", i);
        KT_STATUS(kvl_etcd_fetch_status(a, nm, 60000), KVL_ERR_NOT_FOUND);
    }
    KT_OK(kvl_etcd_fetch_async(a, "bg-x4096", NULL, 0));
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-x4096", 60000), KVL_ERR_NOT_FOUND);
    KT_STATUS(kvl_etcd_fetch_status(a, names[1], 0), KVL_ERR_STATE);
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-x0", 0), KVL_ERR_STATE);
    KT_ERROR_HAS("started no background fetch of agent 'bg-x0'");
    KT_STATUS(kvl_etcd_fetch_status(a, "bg-x1", 0), KVL_ERR_NOT_FOUND);
    kt_log_clear();
    /* destroyed with a fetch pending: returns within a call's timeout */
    KT_OK(kvl_etcd_fetch_async(a, "bg-never", NULL, 60000));
    uint64_t t0 = kt_now_ms();
    kvl_agent_destroy(a);
    KT_CHECK(kt_now_ms() - t0 < 30000);
    kvl_agent_destroy(late);
    for (int i = 1; i < NP; i++)
        kvl_agent_destroy(p[i]);
    printf("background fetches: %d peers at once (half published later) loaded and followed; "
           "a missing one failed with its reason, then loaded when asked again\n", NP);
}

/* A background fetch of a peer that cannot answer does not hold up the
 * others: the peer published, then stopped (SIGSTOP: its tcp listener's
 * backlog takes the connection, nobody answers the handshake), so loading
 * it waits up to the agent's timeout (60 s here) on one loader thread,
 * while a peer asked for after it loads on another. Forks before this
 * process has threads. */
static void frozen_peer(void)
{
    const char *pfx = "/kt/frozen";
    pid_t pid = publisher("fz-frozen", pfx, 30, true);
    kvl_agent_t *w, *fresh = agent("fz-fresh");
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 60000};
    KT_OK(kvl_agent_create("fz-w", &cfg, &w));
    kvl_param_t prm = {"host", "127.0.0.1"};
    KT_OK(kvl_backend_create(w, "tcp", &prm, 1, NULL));
    KT_OK(attach(w, etcd.url, pfx, 30));
    KT_OK(attach(fresh, etcd.url, pfx, 30));
    KT_OK(kvl_etcd_publish(fresh, NULL));
    uint64_t t0 = kt_now_ms();
    KT_OK(kvl_etcd_fetch_async(w, "fz-frozen", NULL, 60000)); /* read and loaded first */
    KT_OK(kvl_etcd_fetch_async(w, "fz-fresh", NULL, 60000));
    KT_OK(kvl_etcd_fetch_status(w, "fz-fresh", 50000));
    KT_OK(kvl_remote_check(w, "fz-fresh"));
    uint64_t took = kt_now_ms() - t0;
    KT_STATUS(kvl_etcd_fetch_status(w, "fz-frozen", 0), KVL_IN_PROGRESS);
    kill(pid, SIGKILL); /* its connection is reset: the load fails */
    waitpid(pid, NULL, 0);
    kvl_status_t st = kvl_etcd_fetch_status(w, "fz-frozen", 90000);
    KT_CHECK(st != KVL_OK && st != KVL_IN_PROGRESS);
    printf("frozen peer: a peer asked for after it loaded in %llu ms while its load waited; "
           "killed, its fetch failed: %s\n", (unsigned long long)took, kvl_last_error()->what);
    kvl_agent_destroy(w);
    kvl_agent_destroy(fresh);
}

static void lifecycle(void)
{
    const char *pfx = "/kt/life";
    kvl_agent_t *a = agent("alpha"), *b = agent("beta");
    size_t len = 1 << 16;
    uint8_t *abuf = malloc(len), *bbuf = malloc(2 * len);
    kt_fill(abuf, len, 1);
    memset(bbuf, 0, 2 * len);
    kvl_mem_desc_t ad = {(uint64_t)(uintptr_t)abuf, len, KVL_DEV_ANY};
    kvl_mem_desc_t bd[2] = {{(uint64_t)(uintptr_t)bbuf, len, KVL_DEV_ANY},
                            {(uint64_t)(uintptr_t)bbuf + len, len, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(a, &ad, 1, NULL, NULL));
    KT_OK(kvl_mem_register(b, bd, 2, NULL, NULL));
    KT_OK(attach(a, etcd.url, pfx, 3));
    KT_OK(attach(b, etcd.url, pfx, 3));

    /* fetch waits for a publish that comes later */
    KT_STATUS(kvl_etcd_fetch(a, "beta", NULL, 0), KVL_ERR_NOT_FOUND);
    KT_OK(kvl_etcd_publish(b, NULL));
    KT_OK(kvl_etcd_fetch(a, "beta", NULL, 30000));
    size_t n = 0;
    kvl_mem_desc_t r[4];
    KT_OK(kvl_remote_regions(a, "beta", r, NULL, 4, &n));
    KT_CHECK(n == 2);
    kt_write_wait(a, "beta", abuf, bd[0].addr, len, 10000);
    KT_CHECK(kt_verify(bbuf, len, 1) == -1);

    /* region update: beta drops one region, the watcher loads the new generation */
    KT_OK(kvl_mem_deregister(b, &bd[1], 1));
    for (int i = 0; i < 600 && n != 1; i++) {
        usleep(50000);
        KT_OK(kvl_remote_regions(a, "beta", r, NULL, 4, &n));
    }
    KT_CHECK(n == 1);
    printf("region update: republished, the follower holds 1 region\n");

    /* etcd killed mid-run: the transfer set up keeps working; store calls
     * fail bounded, naming the endpoint */
    kt_log_clear();
    kt_etcd_kill(&etcd);
    kt_fill(abuf, len, 2);
    kt_write_wait(a, "beta", abuf, bd[0].addr, len, 10000);
    KT_CHECK(kt_verify(bbuf, len, 2) == -1);
    uint64_t t0 = kt_now_ms();
    KT_STATUS(kvl_etcd_publish(b, NULL), KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS(etcd.url);
    KT_STATUS(kvl_etcd_fetch(a, "beta", NULL, 0), KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(kt_now_ms() - t0 < 60000);
    for (int i = 0; i < 200 && !kt_log_has("etcd keepalive failed"); i++)
        usleep(50000);
    KT_CHECK(kt_log_has("etcd keepalive failed"));
    KT_CHECK(kvl_remote_check(a, "beta") == KVL_OK); /* not dropped for etcd's absence */
    printf("etcd down mid-run: transfer ok, publish/fetch refused naming %s\n", etcd.url);
    sleep(4); /* longer than the TTL */
    kt_etcd_restart(&etcd);
    for (int i = 0; i < 600 && !kt_log_has("etcd answers again"); i++)
        usleep(50000);
    KT_CHECK(kt_log_has("etcd answers again"));
    KT_OK(kvl_etcd_fetch(a, "beta", NULL, 10000));
    KT_OK(kvl_etcd_publish(b, NULL));
    kt_fill(abuf, len, 3);
    kt_write_wait(a, "beta", abuf, bd[0].addr, len, 10000);
    KT_CHECK(kt_verify(bbuf, len, 3) == -1);
    printf("etcd back: fetch, publish and transfers work\n");

    /* expired lease (revoked behind the agent's back): the follower drops
     * beta, beta's keeper grants a new lease and publishes again */
    kt_log_clear();
    KT_CHECK(kt_etcdctl(&etcd, "lease list") == 0);
    {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "sh -c 'for l in $(ETCDCTL_API=3 etcdctl --endpoints=%s "
                 "lease list | tail -n +2); do ETCDCTL_API=3 etcdctl --endpoints=%s lease "
                 "revoke $l; done' >/dev/null 2>&1", etcd.url, etcd.url);
        KT_CHECK(system(cmd) == 0);
    }
    KT_CHECK(wait_check(a, "beta", KVL_ERR_NOT_FOUND, 30));
    for (int i = 0; i < 600 && !kt_log_has("expired (etcd was out of reach"); i++)
        usleep(50000);
    KT_CHECK(kt_log_has("expired (etcd was out of reach"));
    KT_OK(kvl_etcd_fetch(a, "beta", NULL, 15000));
    printf("expired lease: follower dropped beta; beta republished under a new lease\n");

    /* restart: a new incarnation of beta publishes; alpha drops the old one */
    uint64_t old = kvl_remote_incarnation(a, "beta");
    kvl_agent_t *b2 = agent("beta");
    KT_OK(kvl_mem_register(b2, bd, 1, NULL, NULL));
    KT_OK(attach(b2, etcd.url, pfx, 3));
    KT_OK(kvl_etcd_publish(b2, NULL));
    KT_CHECK(wait_check(a, "beta", KVL_ERR_NOT_FOUND, 30));
    KT_OK(kvl_etcd_fetch(a, "beta", NULL, 30000));
    KT_CHECK(kvl_remote_incarnation(a, "beta") != old);
    kvl_agent_destroy(b); /* the old incarnation's lease no longer holds the key */
    usleep(300000);
    KT_CHECK(kvl_remote_check(a, "beta") == KVL_OK);
    printf("restart: the new incarnation replaced the old one at the follower\n");

    /* destroy: the key goes at once (lease revoked), the follower drops it */
    kvl_agent_destroy(b2);
    KT_CHECK(wait_check(a, "beta", KVL_ERR_NOT_FOUND, 30));
    KT_STATUS(kvl_etcd_fetch(a, "beta", NULL, 0), KVL_ERR_NOT_FOUND);
    kvl_agent_destroy(a);
    free(abuf);
    free(bbuf);
    printf("destroy: removed from etcd and from the follower\n");
}

static void killed_agent(void)
{
    pid_t pid = publisher("gamma", "/kt/kill", 2, false);
    kvl_agent_t *a = agent("watcher");
    KT_OK(attach(a, etcd.url, "/kt/kill", 2));
    KT_OK(kvl_etcd_fetch(a, "gamma", NULL, 5000));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    KT_CHECK(wait_check(a, "gamma", KVL_ERR_NOT_FOUND, 60)); /* TTL 2 s; bound: never hangs */
    kvl_agent_destroy(a);
    printf("killed -9: dropped by the watcher when its lease expired\n");
}

/* kvlane doctor's etcd checks (kvl_etcd_probe). */
static char probe_out[8192];
static int probe_worst;

static void probe_cb(void *arg, const char *check, int status, const char *observed,
                     const char *hint)
{
    (void)arg;
    size_t n = strlen(probe_out);
    snprintf(probe_out + n, sizeof(probe_out) - n, "%d %s: %s | %s\n", status, check, observed,
             hint ? hint : "");
    if (status > probe_worst)
        probe_worst = status;
}

static void probe(const char *user, const char *password)
{
    char eps[200];
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%u,%s", kt_free_port(), etcd.url);
    kvl_etcd_config_t c = {.endpoints = eps, .prefix = "/kt/doctor", .user = user,
                           .password = password};
    probe_out[0] = '\0';
    probe_worst = 0;
    kvl_status_t st = kvl_etcd_probe(&c, probe_cb, NULL);
    printf("%s", probe_out);
    KT_CHECK(st == KVL_OK);
    KT_CHECK(strstr(probe_out, "1 0.reach: http://127.0.0.1:") != NULL); /* dead member: warn */
    KT_CHECK(strstr(probe_out, "0 1.reach: ") != NULL && strstr(probe_out, "etcd 3.") != NULL);
    KT_CHECK(strstr(probe_out, "1 endpoints: 1 of 2 endpoint(s) answer") != NULL);
}

static void doctor(void)
{
    probe(NULL, NULL);
    KT_CHECK(strstr(probe_out, "0 1.auth: ") != NULL);
    KT_CHECK(strstr(probe_out, "1.lease: ") != NULL);
    char eps[64];
    snprintf(eps, sizeof(eps), "http://127.0.0.1:%u", kt_free_port());
    kvl_etcd_config_t c = {.endpoints = eps};
    probe_out[0] = '\0';
    KT_STATUS(kvl_etcd_probe(&c, probe_cb, NULL), KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(strstr(probe_out, "2 endpoints: 0 of 1 endpoint(s) answer") != NULL);
    printf("doctor: dead member warned, live member's version/auth/lease checked, none "
           "answering is a failure\n");
}

static void auth(void)
{
    KT_CHECK(kt_etcdctl(&etcd, "user add root:rootpw --interactive=false") == 0);
    KT_CHECK(kt_etcdctl(&etcd, "auth enable") == 0);
    kvl_agent_t *a = agent("authed");
    KT_STATUS(attach(a, etcd.url, "/kt/auth", 5), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("etcd has authentication on");
    kvl_etcd_config_t c = {.endpoints = etcd.url, .prefix = "/kt/auth", .user = "root",
                           .password = "wrong"};
    KT_STATUS(kvl_etcd_attach(a, &c), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("refused user 'root'");
    c.password = "rootpw";
    KT_OK(kvl_etcd_attach(a, &c));
    kvl_agent_t *b = agent("authed2");
    KT_OK(kvl_etcd_attach(b, &c));
    KT_OK(kvl_etcd_publish(b, NULL));
    KT_OK(kvl_etcd_fetch(a, "authed2", NULL, 30000));
    kvl_agent_destroy(b);
    KT_CHECK(wait_check(a, "authed2", KVL_ERR_NOT_FOUND, 30));
    /* The token a's watch stream was opened with stops being valid while
     * the stream stays open (a password change ends every token of the
     * user; here to the same password): etcd refuses the next create on
     * it as "permission denied", and the stream is opened again with a
     * new token, so the new peer's departure is seen */
    char pw[300];
    snprintf(pw, sizeof(pw), "%s/pw", etcd.dir);
    FILE *f = fopen(pw, "w");
    KT_CHECK(f != NULL && fputs("rootpw\n", f) >= 0 && fclose(f) == 0);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "--user root:rootpw user passwd root --interactive=false <'%s'",
             pw);
    KT_CHECK(kt_etcdctl(&etcd, cmd) == 0);
    kvl_agent_t *n = agent("authed3");
    KT_OK(kvl_etcd_attach(n, &c));
    KT_OK(kvl_etcd_publish(n, NULL));
    KT_OK(kvl_etcd_fetch(a, "authed3", NULL, 30000)); /* a new watch on a's stream */
    kvl_agent_destroy(n);
    KT_CHECK(wait_check(a, "authed3", KVL_ERR_NOT_FOUND, 30));
    /* etcd restarted: its tokens are gone; the stream comes back and
     * takes a new one */
    b = agent("authed4");
    KT_OK(kvl_etcd_attach(b, &c));
    KT_OK(kvl_etcd_publish(b, NULL));
    KT_OK(kvl_etcd_fetch(a, "authed4", NULL, 30000));
    kt_etcd_kill(&etcd);
    kt_etcd_restart(&etcd);
    n = agent("authed5");
    KT_OK(kvl_etcd_attach(n, &c));
    KT_OK(kvl_etcd_publish(n, NULL));
    KT_OK(kvl_etcd_fetch(a, "authed5", NULL, 30000));
    kvl_agent_destroy(n);
    KT_CHECK(wait_check(a, "authed5", KVL_ERR_NOT_FOUND, 30));
    kvl_agent_destroy(b);
    KT_CHECK(wait_check(a, "authed4", KVL_ERR_NOT_FOUND, 30));
    kvl_agent_destroy(a);
    /* through the gateway, whose WebSocket does not hand the token on: a
     * plain HTTP stream per watched agent */
    setenv("KVL_ETCD_API", "gateway", 1);
    a = agent("authed6");
    b = agent("authed7");
    KT_OK(kvl_etcd_attach(a, &c));
    KT_OK(kvl_etcd_attach(b, &c));
    KT_OK(kvl_etcd_publish(b, NULL));
    KT_OK(kvl_etcd_fetch(a, "authed7", NULL, 30000));
    kvl_agent_destroy(b);
    KT_CHECK(wait_check(a, "authed7", KVL_ERR_NOT_FOUND, 30));
    kvl_agent_destroy(a);
    unsetenv("KVL_ETCD_API");
    /* a role on "<prefix>/" only misses the presence keys under
     * "<prefix>.inc/": refused at attach, with the grant that works */
    KT_CHECK(kt_etcdctl(&etcd, "--user root:rootpw user add half:halfpw --interactive=false") == 0);
    KT_CHECK(kt_etcdctl(&etcd, "--user root:rootpw role add half") == 0);
    KT_CHECK(kt_etcdctl(&etcd, "--user root:rootpw role grant-permission half --prefix "
                               "readwrite /kt/auth/") == 0);
    KT_CHECK(kt_etcdctl(&etcd, "--user root:rootpw user grant-role half half") == 0);
    kvl_agent_t *h = agent("halfway");
    kvl_etcd_config_t hc = {.endpoints = etcd.url, .prefix = "/kt/auth", .user = "half",
                            .password = "halfpw"};
    KT_STATUS(kvl_etcd_attach(h, &hc), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("--prefix readwrite <prefix>");
    KT_CHECK(kt_etcdctl(&etcd, "--user root:rootpw role grant-permission half --prefix "
                               "readwrite /kt/auth") == 0);
    KT_OK(kvl_etcd_attach(h, &hc));
    KT_OK(kvl_etcd_publish(h, NULL));
    kvl_agent_destroy(h);
    probe(NULL, NULL);
    KT_CHECK(strstr(probe_out, "2 1.auth: etcd at") != NULL &&
             strstr(probe_out, "authentication on") != NULL);
    probe("root", "wrong");
    KT_CHECK(strstr(probe_out, "2 1.auth: etcd at") != NULL &&
             strstr(probe_out, "refused user 'root'") != NULL);
    probe("root", "rootpw");
    KT_CHECK(strstr(probe_out, "0 1.auth: ") != NULL);
    printf("auth: no user, a wrong password and a role missing the presence keys refused by "
           "name (the first two also by the doctor's checks); the right ones work\n");
}

/* The presence key announces the newest generation published. A partial
 * blob made before a registration change carries an older generation; when
 * the keeper republished every label after the change, the partial one went
 * last and its older generation overwrote the new one in the presence key,
 * so a follower resyncing from it after a compaction kept the old regions. */
static void presence_generation(void)
{
    kvl_agent_t *a = agent("pres");
    static char buf[1 << 17];
    kvl_mem_desc_t d1 = {(uint64_t)(uintptr_t)buf, 1 << 16, KVL_DEV_ANY};
    kvl_mem_desc_t d2 = {(uint64_t)(uintptr_t)buf + (1 << 16), 1 << 16, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d1, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &d2, 1, NULL, NULL));
    KT_OK(attach(a, etcd.url, "/kt-pres", 5));
    kvl_dlist_t *dl;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &dl));
    KT_OK(kvl_dlist_add(dl, d1.addr, d1.len, KVL_DEV_ANY));
    void *pb;
    size_t pl;
    KT_OK(kvl_metadata_get_partial(a, dl, true, NULL, 0, &pb, &pl));
    KT_OK(kvl_etcd_publish_partial(a, "L", pb, pl));
    KT_OK(kvl_etcd_publish(a, NULL));
    char v[128], m0[8192], m[8192];
    unsigned long long inc, g0, g;
    KT_CHECK(kt_etcd_get(&etcd, "/kt-pres.inc/pres", 0, v, sizeof(v)) == 0);
    KT_CHECK(sscanf(v, "%llx %llu", &inc, &g0) == 2);
    KT_CHECK(kt_etcd_get(&etcd, "/kt-pres/pres/metadata", 1, m0, sizeof(m0)) == 0);
    KT_OK(kvl_mem_deregister(a, &d2, 1)); /* a new generation: the keeper republishes */
    int waits = 0;
    while ((kt_etcd_get(&etcd, "/kt-pres/pres/metadata", 1, m, sizeof(m)) != 0 ||
            strcmp(m, m0) == 0) && waits++ < 400)
        usleep(25000);
    KT_CHECK(strcmp(m, m0) != 0); /* republished (bounded wait) */
    /* the labels go one transaction each: let the last one land too */
    for (waits = 0; waits < 400; waits++) {
        KT_CHECK(kt_etcd_get(&etcd, "/kt-pres.inc/pres", 0, v, sizeof(v)) == 0);
        if (sscanf(v, "%llx %llu", &inc, &g) == 2 && g > g0)
            break;
        usleep(25000);
    }
    printf("presence generation: %llu before the change, %llu after the republish\n", g0, g);
    KT_CHECK(g > g0);
    kvl_free(pb);
    kvl_dlist_destroy(dl);
    kvl_agent_destroy(a);
}

/* KVL_ETCD_API: checked; under "gateway" the JSON gateway serves the same
 * cases (the default speaks gRPC to this etcd); "grpc" takes no https. */
static void api(void)
{
    kvl_agent_t *a = agent("api");
    setenv("KVL_ETCD_API", "h2", 1);
    KT_STATUS(attach(a, etcd.url, "/kt/api", 5), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("KVL_ETCD_API='h2' is not one of auto, grpc, gateway");
    setenv("KVL_ETCD_API", "grpc", 1);
    KT_STATUS(attach(a, "https://127.0.0.1:2379", "/kt/api", 5), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("through its JSON gateway only");
    KT_OK(attach(a, etcd.url, "/kt/api", 5));
    kvl_agent_destroy(a);
    setenv("KVL_ETCD_API", "gateway", 1);
    killed_agent();
    lifecycle();
    stopped_etcd();
    unsetenv("KVL_ETCD_API");
    printf("KVL_ETCD_API: checked; the gateway serves the lifecycle and a killed agent too\n");
}

int main(void)
{
    if (kvl_etcd_attach(NULL, NULL) == KVL_ERR_UNSUPPORTED) /* built without the store */
        KT_SKIP("%s", kvl_last_error()->what);
    if (kt_etcd_binary() == NULL)
        KT_SKIP("no etcd binary (/usr/bin/etcd from Debian's etcd-server, or KVL_ETCD_BIN)");
    signal(SIGPIPE, SIG_IGN);
    kvl_log_set_callback(kt_log_cb, NULL);
    kvl_log_set_level(KVL_LOG_INFO);
    kt_etcd_start(&etcd);
    bad_input();
    down_at_start_and_dead_member();
    killed_agent();
    frozen_peer();
    stopped_etcd();
    background();
    doctor();
    lifecycle();
    api();
    if (system("command -v etcdctl >/dev/null 2>&1") == 0) {
        presence_generation();
        auth();
    } else {
        printf("presence generation, auth: not run (no etcdctl: Debian's etcd-client)\n");
    }
    kvl_log_set_callback(NULL, NULL);
    kt_etcd_stop(&etcd);
    printf("etcd: all cases passed\n");
    return 0;
}
