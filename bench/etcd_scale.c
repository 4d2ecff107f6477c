/*
 * etcd metadata store at scale: N agents, all joining at once (attach,
 * register one region, publish, fetch P peers), then restarts (a process
 * killed -9 and started again under the same names: new incarnations) and
 * departures (killed -9, not restarted) watched by the agents that loaded
 * them. Prints join latency, how long the new incarnation / the departure
 * took to reach every watcher, and etcd's CPU and memory per agent.
 *
 * usage: etcd_scale --endpoints URL --etcd-pid PID [--agents 256] [--peers 8]
 *                   [--ttl 2] [--events 8] [--rate 0] [--per-process 1]
 * --rate R: agents start joining at R per second (0: all at once).
 * --per-process K: K agents in each process, one thread each (default 1:
 *   a process per agent). Agents of one process share nothing of kvlane's:
 *   each has its own kvl_agent_t, tcp backend (socket, progress thread),
 *   etcd lease, connections, keeper, watcher, fetcher and loaders (its
 *   background fetches: kvl_etcd_fetch_async); they share the process
 *   (address space, libcurl's and OpenSSL's one-time set-up). The bench
 *   checks that etcd holds N leases for N agents. A restart or departure
 *   kills a whole process: K agents at once. Peers are taken from other
 *   processes.
 * bench/etcd_scale.sh starts a private etcd and runs it.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#if defined(KVL_HAVE_ETCD)
/* the build found libcurl and json-c (and links them): check leases in etcd */
#include <curl/curl.h>
#include <json-c/json.h>
#define ES_LEASE_CHECK 1
#endif

static const char *g_eps;
static unsigned g_n = 256, g_peers = 8, g_ttl = 2, g_events = 8, g_rate = 0, g_k = 1;
static int g_go[2], g_obs[2], g_rep[2];

static uint64_t rt_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n > 0 && write(g_rep[1], line, (size_t)n) != n)
        _exit(5);
}

/* When this thread's agent was set up and attached (rt_ns). */
static _Thread_local uint64_t g_t_setup, g_t_attach;

static kvl_agent_t *join(unsigned i, void **mem)
{
    char name[32];
    kvl_agent_t *a;
    snprintf(name, sizeof(name), "a%u", i);
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 5000};
    if (kvl_agent_create(name, &cfg, &a) != KVL_OK)
        return NULL;
    kvl_param_t p = {"host", "127.0.0.1"};
    kvl_etcd_config_t ec = {.endpoints = g_eps, .prefix = "/bench/agents", .lease_ttl_s = g_ttl};
    *mem = calloc(1, 1 << 20);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)*mem, 1 << 20, KVL_DEV_ANY};
    bool ok = kvl_backend_create(a, "tcp", &p, 1, NULL) == KVL_OK &&
              kvl_mem_register(a, &d, 1, NULL, NULL) == KVL_OK;
    g_t_setup = rt_ns();
    ok = ok && kvl_etcd_attach(a, &ec) == KVL_OK;
    g_t_attach = rt_ns();
    if (!ok || kvl_etcd_publish(a, NULL) != KVL_OK) {
        char buf[2048];
        kvl_error_render(kvl_last_error(), buf, sizeof(buf));
        fprintf(stderr, "agent %s: join failed: %s\n", name, buf);
        return NULL;
    }
    return a;
}

/* Drops of followed peers, counted from the library's log (INFO "dropped
 * the metadata of"); followers wait on it instead of polling. Anything at
 * WARN or above still goes to stderr. */
static pthread_mutex_t g_drop_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_drop_cond = PTHREAD_COND_INITIALIZER;
static uint64_t g_drops;

static void on_log(kvl_log_level_t level, const char *component, const char *message, void *arg)
{
    (void)arg;
    if (level <= KVL_LOG_WARN)
        fprintf(stderr, "kvlane [%s] %s: %s\n", level == KVL_LOG_ERROR ? "error" : "warn",
                component, message);
    else if (strstr(message, "dropped the metadata of") != NULL) {
        pthread_mutex_lock(&g_drop_lock);
        g_drops++;
        pthread_cond_broadcast(&g_drop_cond);
        pthread_mutex_unlock(&g_drop_lock);
    }
}

/* Wait until the drop count passes seen or ms pass; the count now. */
static uint64_t drop_wait(uint64_t seen, unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&g_drop_lock);
    while (g_drops == seen && pthread_cond_timedwait(&g_drop_cond, &g_drop_lock, &ts) == 0)
        ;
    uint64_t now = g_drops;
    pthread_mutex_unlock(&g_drop_lock);
    return now;
}

/* The agents of one process wait here until all of them joined, to read
 * the process's CPU once for all. */
static pthread_barrier_t g_joined;

typedef struct {
    unsigned i;
    bool restarted;
} agent_arg_t;

static void *agent_main(void *arg)
{
    unsigned i = ((agent_arg_t *)arg)->i;
    bool restarted = ((agent_arg_t *)arg)->restarted;
    void *mem = NULL;
    char ch;
    if (!restarted && read(g_go[0], &ch, 1) != 1)
        _exit(2);
    uint64_t t0 = rt_ns();
    kvl_agent_t *a = join(i, &mem);
    if (a == NULL)
        _exit(3);
    uint64_t t_pub = rt_ns();
    if (restarted)
        report("P %u %" PRIu64 "\n", i, t_pub);
    char peers[16][32];
    bool live[16];
    /* As engines do (NIXL's fetch is asynchronous): every peer at once, in
     * the background (kvl_etcd_fetch_async), then wait for each; peers
     * live in other processes. */
    for (unsigned k = 0; k < g_peers; k++) {
        /* at a rate: the peers that joined before this one (the first
         * ones wait for the last: not counted) */
        unsigned d = g_k * (1 + k);
        unsigned pk = g_rate ? (i + g_n - d) % g_n : (i + d) % g_n;
        snprintf(peers[k], sizeof(peers[k]), "a%u", pk);
        if (kvl_etcd_fetch_async(a, peers[k], NULL, 30000) != KVL_OK) {
            fprintf(stderr, "%s: fetch %s refused: %s\n", kvl_agent_name(a), peers[k],
                    kvl_last_error()->what);
            _exit(4);
        }
    }
    for (unsigned k = 0; k < g_peers; k++) {
        live[k] = kvl_etcd_fetch_status(a, peers[k], 60000) == KVL_OK;
        if (!live[k])
            fprintf(stderr, "%s: fetch %s failed: %s\n", kvl_agent_name(a), peers[k],
                    kvl_last_error()->what);
    }
    uint64_t t1 = rt_ns();
    if (!restarted) {
        /* the process's CPU until all its agents joined, shared out */
        pthread_barrier_wait(&g_joined);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        uint64_t cpu_us = (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec +
                          (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec;
        if (g_rate == 0 || i >= g_peers * g_k)
            report("J %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %ld\n", i,
                   t1 - t0, t_pub - t0, cpu_us / g_k, g_t_setup - t0, g_t_attach - g_t_setup,
                   ru.ru_minflt / (long)g_k);
    }
    /* Observing starts once every agent joined. A follower checks its
     * peers (kvl_remote_check, what an engine sees) when the library says
     * it dropped a peer's metadata (drop_wait) and every 250 ms besides:
     * 256 processes polling every few ms kept this machine's two cores
     * busy, starving etcd into expiring live agents' leases. */
    if (!restarted && read(g_obs[0], &ch, 1) != 1)
        _exit(2);
    uint64_t seen = 0;
    for (;;) {
        for (unsigned k = 0; k < g_peers; k++) {
            if (live[k] && kvl_remote_check(a, peers[k]) != KVL_OK) {
                live[k] = false;
                report("D %u %s %" PRIu64 "\n", i, peers[k] + 1, rt_ns());
            }
        }
        seen = drop_wait(seen, 250);
    }
    return NULL;
}

/* Process p: agents p*K .. p*K+K-1, a thread each. */
static void child(unsigned p, bool restarted)
{
    agent_arg_t args[64];
    pthread_t th[64];
    if (pthread_barrier_init(&g_joined, NULL, g_k) != 0)
        _exit(4);
    kvl_log_set_callback(on_log, NULL);
    if (kvl_log_get_level() < KVL_LOG_INFO)
        kvl_log_set_level(KVL_LOG_INFO);
    for (unsigned j = 0; j < g_k; j++) {
        args[j] = (agent_arg_t){p * g_k + j, restarted};
        if (pthread_create(&th[j], NULL, agent_main, &args[j]) != 0)
            _exit(4);
    }
    for (unsigned j = 0; j < g_k; j++)
        pthread_join(th[j], NULL);
}

static pid_t spawn(unsigned i, bool restarted)
{
    pid_t parent = getpid();
    pid_t p = fork();
    if (p == 0) {
        /* the agents go with the harness, however it ends */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(6);
        child(i, restarted);
        _exit(0);
    }
    return p;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void stats(const char *what, uint64_t *v, size_t n, double unit, const char *u)
{
    if (n == 0) {
        printf("%-44s no samples\n", what);
        return;
    }
    qsort(v, n, sizeof(*v), cmp_u64);
    printf("%-44s n=%-5zu p50=%8.1f %s  p99=%8.1f %s  max=%8.1f %s\n", what, n,
           (double)v[n / 2] / unit, u, (double)v[(n * 99 + 99) / 100 - 1] / unit, u,
           (double)v[n - 1] / unit, u);
}

/* etcd's utime+stime (clock ticks) and RSS (kB). */
static void etcd_usage(pid_t pid, uint64_t *ticks, uint64_t *rss_kb)
{
    char path[64], buf[4096];
    *ticks = *rss_kb = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fgets(buf, sizeof(buf), f) != NULL) {
            char *p = strrchr(buf, ')');
            unsigned long ut = 0, st = 0;
            if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                            &st) == 2)
                *ticks = ut + st;
        }
        fclose(f);
    }
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f != NULL) {
        while (fgets(buf, sizeof(buf), f) != NULL)
            if (strncmp(buf, "VmRSS:", 6) == 0)
                *rss_kb = strtoull(buf + 6, NULL, 10);
        fclose(f);
    }
}

/* Read report lines for up to ms, handing each to fn. */
static char g_acc[1 << 16];
static size_t g_accn;
static void pump(int ms, void (*fn)(const char *))
{
    uint64_t end = rt_ns() + (uint64_t)ms * 1000000u;
    for (;;) {
        uint64_t now = rt_ns();
        if (now >= end)
            return;
        struct pollfd p = {g_rep[0], POLLIN, 0};
        if (poll(&p, 1, (int)((end - now) / 1000000u) + 1) <= 0)
            continue;
        ssize_t r = read(g_rep[0], g_acc + g_accn, sizeof(g_acc) - 1 - g_accn);
        if (r <= 0)
            continue;
        g_accn += (size_t)r;
        g_acc[g_accn] = '\0';
        char *nl;
        while ((nl = strchr(g_acc, '\n')) != NULL) {
            *nl = '\0';
            fn(g_acc);
            size_t used = (size_t)(nl - g_acc) + 1;
            memmove(g_acc, nl + 1, g_accn - used + 1);
            g_accn -= used;
        }
    }
}

static uint64_t *g_join, *g_pub, *g_cpu, *g_faults, *g_setup, *g_attach, *g_drop_t;
static unsigned *g_drop_who;
static size_t g_nj, g_nd;
static uint64_t g_pub_at[4096];

static void on_line(const char *l)
{
    unsigned i, who;
    uint64_t a, b, c, d, e, f;
    if (sscanf(l, "J %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
               &i, &a, &b, &c, &d, &e, &f) == 7) {
        g_faults[g_nj] = f;
        g_setup[g_nj] = d;
        g_attach[g_nj] = e;
        g_join[g_nj] = a;
        g_cpu[g_nj] = c;
        g_pub[g_nj++] = b;
    } else if (sscanf(l, "D %u %u %" SCNu64, &i, &who, &a) == 3) {
        g_drop_who[g_nd] = who;
        g_drop_t[g_nd++] = a;
    } else if (sscanf(l, "P %u %" SCNu64, &i, &a) == 2 && i < 4096) {
        g_pub_at[i] = a;
    }
}

/* That every agent holds a lease of its own (so agents sharing a process
 * are not sharing one): the leases of the metadata keys, read from etcd. */
static void lease_check(void)
{
#ifdef ES_LEASE_CHECK
    char url[512], body[256];
    char *ans = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&ans, &len);
    CURL *h = curl_easy_init();
    const char *from = "/bench/agents/", *to = "/bench/agents0";
    json_object *o = NULL, *kvs = NULL;
    if (f == NULL || h == NULL)
        goto out;
    /* keys and values base64 in the JSON gateway: "/bench/agents/" and "/bench/agents0" */
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\",\"keys_only\":true}",
             "L2JlbmNoL2FnZW50cy8=", "L2JlbmNoL2FnZW50czA=");
    snprintf(url, sizeof(url), "%s/v3/kv/range", g_eps);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    CURLcode cc = curl_easy_perform(h);
    fclose(f);
    f = NULL;
    if (cc != CURLE_OK || (o = json_tokener_parse(ans)) == NULL ||
        !json_object_object_get_ex(o, "kvs", &kvs)) {
        printf("leases: not checked (etcd's answer to a range of %s..%s unreadable)\n", from, to);
        goto out;
    }
    size_t n = json_object_array_length(kvs), distinct = 0;
    char **ids = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; ids != NULL && i < n; i++) {
        json_object *l = NULL;
        const char *id = json_object_object_get_ex(json_object_array_get_idx(kvs, i), "lease", &l)
                         ? json_object_get_string(l) : "0";
        size_t j = 0;
        while (j < distinct && strcmp(ids[j], id) != 0)
            j++;
        if (j == distinct && strcmp(id, "0") != 0)
            ids[distinct++] = (char *)id;
    }
    free(ids);
    printf("leases: etcd holds %zu agents' metadata under %zu distinct leases (%u agents in %u "
           "processes)\n", n, distinct, g_n, g_n / g_k);
out:
    if (f != NULL)
        fclose(f);
    if (o != NULL)
        json_object_put(o);
    if (h != NULL)
        curl_easy_cleanup(h);
    free(ans);
#else
    printf("leases: not checked (built without libcurl/json-c headers)\n");
#endif
}

int main(int argc, char **argv)
{
    pid_t etcd_pid = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--endpoints"))
            g_eps = argv[i + 1];
        else if (!strcmp(argv[i], "--etcd-pid"))
            etcd_pid = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--agents"))
            g_n = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--peers"))
            g_peers = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ttl"))
            g_ttl = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rate"))
            g_rate = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--events"))
            g_events = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--per-process"))
            g_k = (unsigned)atoi(argv[i + 1]);
        else {
            fprintf(stderr, "etcd_scale: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    unsigned np = g_k ? g_n / g_k : 0; /* processes */
    if (g_eps == NULL || etcd_pid <= 0 || g_n < 2 || g_n > 4000 || g_peers == 0 ||
        g_peers > 16 || g_k == 0 || g_k > 64 || g_n % g_k != 0 || g_peers >= np ||
        g_ttl == 0 || 2 * g_events * (g_peers + 1) > np) {
        fprintf(stderr, "usage: etcd_scale --endpoints URL --etcd-pid PID [--agents 256] "
                        "[--peers 8] [--ttl 2] [--events 8] [--per-process 1]\n"
                        "  (agents a multiple of per-process <= 64; with P = agents / "
                        "per-process processes: peers < P and 2*events*(peers+1) <= P)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pipe(g_go) != 0 || pipe(g_obs) != 0 || pipe(g_rep) != 0)
        return 1;
    g_join = calloc(g_n, sizeof(uint64_t));
    g_pub = calloc(g_n, sizeof(uint64_t));
    g_cpu = calloc(g_n, sizeof(uint64_t));
    g_faults = calloc(g_n, sizeof(uint64_t));
    g_setup = calloc(g_n, sizeof(uint64_t));
    g_attach = calloc(g_n, sizeof(uint64_t));
    g_drop_t = calloc(g_n * g_peers * 2, sizeof(uint64_t));
    g_drop_who = calloc(g_n * g_peers * 2, sizeof(unsigned));
    pid_t *pids = calloc(np, sizeof(pid_t));
    long hz = sysconf(_SC_CLK_TCK);
    uint64_t tk0, rss0, tk1, rss1, tk2, rss2;

    etcd_usage(etcd_pid, &tk0, &rss0);
    for (unsigned p = 0; p < np; p++)
        pids[p] = spawn(p, false);
    sleep(1); /* processes exist; the join starts for all at once */
    uint64_t tj = rt_ns();
    for (unsigned i = 0; i < g_n; i++) {
        if (write(g_go[1], "g", 1) != 1)
            return 1;
        if (g_rate > 0)
            usleep(1000000u / g_rate);
    }
    size_t want_j = g_rate ? g_n - g_peers * g_k : g_n;
    while (g_nj < want_j && rt_ns() - tj < 120000000000ull)
        pump(200, on_line);
    double join_wall = (double)(rt_ns() - tj) / 1e9;
    etcd_usage(etcd_pid, &tk1, &rss1);
    const char *api = getenv("KVL_ETCD_API");
    printf("agents %u (%u per process, %u processes), peers each %u, lease TTL %u s, etcd %s, "
           "KVL_ETCD_API=%s\n", g_n, g_k, np, g_peers, g_ttl, g_eps,
           api != NULL && api[0] != '\0' ? api : "auto (gRPC where served)");
    lease_check();
    if (g_rate > 0)
        printf("joined: %zu of %u in %.2f s (started at %u per second)\n", g_nj, g_n, join_wall,
               g_rate);
    else
        printf("joined: %zu of %u in %.2f s (all started at once)\n", g_nj, g_n, join_wall);
    stats("join (attach+register+publish+fetch peers)", g_join, g_nj, 1e6, "ms");
    stats("  of which attach+register+publish", g_pub, g_nj, 1e6, "ms");
    stats("    agent, tcp backend, register", g_setup, g_nj, 1e6, "ms");
    stats("    attach (lease grant, read check)", g_attach, g_nj, 1e6, "ms");
    stats(g_k == 1 ? "CPU of one agent process until joined"
                   : "CPU of one agent until joined (its process's / agents)", g_cpu, g_nj, 1e3,
          "ms");
    /* page faults: what a new process or thread costs most on some VMs
     * (bench/os_costs measures one fault there) */
    stats(g_k == 1 ? "page faults of one agent process until joined"
                   : "page faults of one agent until joined (its process's / agents)", g_faults,
          g_nj, 1, "");

    /* steady state: keepalives and idle watches only */
    for (unsigned i = 0; i < g_n; i++)
        if (write(g_obs[1], "o", 1) != 1)
            return 1;
    pump(10000, on_line);
    etcd_usage(etcd_pid, &tk2, &rss2);
    double cpu_steady = (double)(tk2 - tk1) / (double)hz / 10.0;
    printf("etcd steady state (10 s): CPU %.1f%% of a core (%.3f%% per agent), RSS %.1f MiB "
           "(%.1f MiB before the agents: %.1f KiB per agent)\n", 100 * cpu_steady,
           100 * cpu_steady / g_n, (double)rss2 / 1024, (double)rss0 / 1024,
           ((double)rss2 - (double)rss0) / g_n);
    printf("etcd CPU during the join: %.2f s of CPU for %u joins (%.2f ms per agent)\n",
           (double)(tk1 - tk0) / (double)hz, g_n, 1000.0 * (double)(tk1 - tk0) / (double)hz / g_n);

    /* restarts: victims spaced so that their watchers do not overlap */
    size_t nd0 = g_nd;
    unsigned stride = g_events ? np / (2 * g_events) : 0; /* in processes */
    uint64_t restart_lat[512], kill_lat[512];
    size_t nr = 0, nk = 0;
    for (unsigned e = 0; e < g_events; e++) {
        unsigned v = e * stride;
        kill(pids[v], SIGKILL);
        waitpid(pids[v], NULL, 0);
        for (unsigned j = 0; j < g_k; j++)
            g_pub_at[v * g_k + j] = 0;
        pids[v] = spawn(v, true);
        uint64_t t = rt_ns();
        for (unsigned j = 0; j < g_k; j++)
            while (g_pub_at[v * g_k + j] == 0 && rt_ns() - t < 30000000000ull)
                pump(50, on_line);
        pump(1500, on_line);
    }
    pump(2000, on_line);
    for (size_t d = nd0; d < g_nd; d++) {
        unsigned who = g_drop_who[d];
        if (who < 4096 && g_pub_at[who] != 0 && nr < 512)
            restart_lat[nr++] = g_drop_t[d] > g_pub_at[who] ? g_drop_t[d] - g_pub_at[who] : 0;
    }
    printf("restarts: %u agents killed -9 and started again (new incarnation)\n",
           g_events * g_k);
    stats("new incarnation seen by a watcher (after publish)", restart_lat, nr, 1e6, "ms");
    printf("  watchers that saw it: %zu of %u expected\n", nr, g_events * g_k * g_peers);

    /* departures: killed -9, not restarted */
    nd0 = g_nd;
    uint64_t killed_at[4096] = {0};
    for (unsigned e = 0; e < g_events; e++) {
        unsigned v = e * stride + stride / 2;
        for (unsigned j = 0; j < g_k; j++)
            killed_at[v * g_k + j] = rt_ns();
        kill(pids[v], SIGKILL);
        waitpid(pids[v], NULL, 0);
        pids[v] = 0;
    }
    pump((int)(g_ttl * 1000 + 5000), on_line);
    for (size_t d = nd0; d < g_nd; d++) {
        unsigned who = g_drop_who[d];
        if (who < 4096 && killed_at[who] != 0 && nk < 512)
            kill_lat[nk++] = g_drop_t[d] - killed_at[who];
    }
    printf("departures: %u agents killed -9 (lease TTL %u s)\n", g_events * g_k, g_ttl);
    stats("gone at a watcher (after kill -9)", kill_lat, nk, 1e6, "ms");
    printf("  watchers that saw it: %zu of %u expected; bound TTL+1 s = %u ms\n", nk,
           g_events * g_k * g_peers, g_ttl * 1000 + 1000);

    for (unsigned p = 0; p < np; p++)
        if (pids[p] > 0)
            kill(pids[p], SIGKILL);
    for (unsigned p = 0; p < np; p++)
        if (pids[p] > 0)
            waitpid(pids[p], NULL, 0);
    return 0;
}
