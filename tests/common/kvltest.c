/* Helpers for kvlane's C tests. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

/* Peers still running, killed when a check fails so that no stopped or
 * orphaned peer keeps the test runner waiting on its output. */
static pid_t kt_live_peers[64];

static void kt_peer_track(pid_t pid, int add)
{
    for (int i = 0; i < 64; i++) {
        if (add ? kt_live_peers[i] == 0 : kt_live_peers[i] == pid) {
            kt_live_peers[i] = add ? pid : 0;
            return;
        }
    }
}

void kt_fail_at(const char *file, int line, const char *expr, int with_error)
{
    for (int i = 0; i < 64; i++)
        if (kt_live_peers[i] > 0)
            kill(kt_live_peers[i], SIGKILL);
    fprintf(stderr, "FAIL %s:%d: %s\n", file, line, expr);
    if (with_error) {
        char buf[8192];
        kvl_error_render(NULL, buf, sizeof(buf));
        fprintf(stderr, "  last error:\n%s\n", buf);
    }
    fflush(stderr);
    exit(1);
}

int kt_error_has(const char *needle)
{
    char buf[16384];
    kvl_error_render(NULL, buf, sizeof(buf));
    return strstr(buf, needle) != NULL;
}

static uint64_t kt_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void kt_fill(void *p, size_t len, uint64_t seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)kt_mix(seed ^ (i >> 3)) >> ((i & 7) ? 0 : 0) ^ (unsigned char)(i * 131);
}

static pthread_mutex_t kt_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char kt_logbuf[1 << 18];
static size_t kt_logn;

void kt_log_cb(kvl_log_level_t level, const char *comp, const char *msg, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&kt_log_lock);
    int w = snprintf(kt_logbuf + kt_logn, sizeof(kt_logbuf) - kt_logn, "[%d] %s: %s\n",
                     (int)level, comp, msg);
    if (w > 0 && kt_logn + (size_t)w < sizeof(kt_logbuf))
        kt_logn += (size_t)w;
    pthread_mutex_unlock(&kt_log_lock);
}

int kt_log_has(const char *needle)
{
    pthread_mutex_lock(&kt_log_lock);
    int r = strstr(kt_logbuf, needle) != NULL;
    pthread_mutex_unlock(&kt_log_lock);
    return r;
}

void kt_log_clear(void)
{
    pthread_mutex_lock(&kt_log_lock);
    kt_logn = 0;
    kt_logbuf[0] = 0;
    pthread_mutex_unlock(&kt_log_lock);
}

static kt_netns_pair_t *kt_netns_live;

void kt_netns_remove(void)
{
    if (kt_netns_live == NULL)
        return;
    kt_sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", kt_netns_live->ns[0],
          kt_netns_live->ns[1]);
    kt_netns_live = NULL;
}

void kt_netns_pair(kt_netns_pair_t *n, const char tag[2], int net)
{
    int pid = (int)getpid(), id = pid % 200 + 20;
    char err[64], why[256] = "";
    for (int i = 0; i < 2; i++) {
        snprintf(n->ns[i], sizeof(n->ns[i]), "kvl%c%d", tag[i], pid);
        snprintf(n->veth[i], sizeof(n->veth[i]), "kv%c%d", tag[i] | 0x20, pid % 100000);
        snprintf(n->ip[i], sizeof(n->ip[i]), "10.%d.%d.%d", id, net, i + 1);
    }
    snprintf(err, sizeof(err), "/tmp/kvl_netns_err_%d.txt", pid);
    if (kt_sh("ip netns add %s 2>%s", n->ns[0], err) != 0) {
        FILE *f = fopen(err, "r");
        if (f) {
            if (!fgets(why, sizeof(why), f))
                why[0] = 0;
            fclose(f);
        }
        unlink(err);
        KT_SKIP("'ip netns add' is not allowed here: %s", why);
    }
    unlink(err);
    if (kt_netns_live == NULL)
        atexit(kt_netns_remove);
    kt_netns_live = n;
    KT_CHECK(kt_sh("ip netns add %s", n->ns[1]) == 0);
    KT_CHECK(kt_sh("ip link add %s type veth peer name %s", n->veth[0], n->veth[1]) == 0);
    KT_CHECK(kt_sh("ip link set %s netns %s && ip link set %s netns %s", n->veth[0], n->ns[0],
                   n->veth[1], n->ns[1]) == 0);
    for (int i = 0; i < 2; i++)
        KT_CHECK(kt_sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up && "
                       "ip -n %s link set lo up", n->ns[i], n->ip[i], n->veth[i], n->ns[i],
                       n->veth[i], n->ns[i]) == 0);
}

void kt_netns_join(const char *ns)
{
    char p[128];
    snprintf(p, sizeof(p), "/var/run/netns/%s", ns);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    KT_CHECK(fd >= 0 && setns(fd, CLONE_NEWNET) == 0);
    close(fd);
}

void kt_md_load_from(kvl_agent_t *into, kvl_agent_t *from)
{
    void *blob;
    size_t len;
    KT_OK(kvl_metadata_get(from, &blob, &len));
    kvl_status_t st = kvl_metadata_load(into, blob, len, NULL, 0);
    kvl_free(blob);
    KT_OK(st);
}

void kt_write_wait(kvl_agent_t *from, const char *to, const void *src, uint64_t dst,
                   uint64_t len, int wait_ms)
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
        st = kvl_xfer_wait(x, wait_ms);
    KT_OK(st);
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

int kt_sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

uint64_t kt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int kt_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    KT_CHECK(d != NULL);
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own fd */
}

int kt_count_maps(const char *needle)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    KT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        if (needle == NULL || strstr(line, needle) != NULL)
            n++;
    fclose(f);
    return n;
}

long kt_verify(const void *p, size_t len, uint64_t seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        if (b[i] != ((unsigned char)kt_mix(seed ^ (i >> 3)) ^ (unsigned char)(i * 131)))
            return (long)i;
    return -1;
}

/* ---- pipes ---- */

static int kt_write(int fd, const void *buf, size_t len)
{
    const char *c = buf;
    while (len) {
        ssize_t n = write(fd, c, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

static int kt_read(int fd, void *buf, size_t len, int timeout_ms)
{
    char *c = buf;
    while (len) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t n = read(fd, c, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

void kt_send_msg(int fd, const void *buf, uint64_t len)
{
    if (kt_write(fd, &len, sizeof(len)) || (len && kt_write(fd, buf, len)))
        _exit(3);
}

void *kt_recv_msg(int fd, uint64_t *len, int timeout_ms)
{
    if (kt_read(fd, len, sizeof(*len), timeout_ms))
        return NULL;
    void *b = malloc(*len + 1);
    if (b == NULL || (*len && kt_read(fd, b, *len, timeout_ms))) {
        free(b);
        return NULL;
    }
    ((char *)b)[*len] = 0;
    return b;
}

kvl_agent_t *kt_agent(const char *name, const char *backend, const char *params)
{
    return kt_agent_tmo(name, backend, params, 3000);
}

kvl_agent_t *kt_agent_tmo(const char *name, const char *backend, const char *params,
                          uint64_t timeout_ms)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = timeout_ms};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    if (backend && backend[0]) {
        kvl_param_t prm[8];
        size_t np = 0;
        char buf[256] = "";
        if (params) {
            snprintf(buf, sizeof(buf), "%s", params);
            char *save = NULL;
            for (char *kv = strtok_r(buf, ",", &save); kv && np < 8; kv = strtok_r(NULL, ",", &save)) {
                char *eq = strchr(kv, '=');
                if (!eq)
                    continue;
                *eq = 0;
                prm[np].key = kv;
                prm[np].value = eq + 1;
                np++;
            }
        }
        KT_OK(kvl_backend_create(a, backend, prm, np, NULL));
    }
    return a;
}

/* A command's arguments, written right after its byte: a peer that cannot
 * read them says so and exits (it once went on with whatever was in arg). */
static void kt_peer_args(int in, uint64_t *arg, size_t len)
{
    if (kt_read(in, arg, len, 120000) != 0) {
        fprintf(stderr, "kvltest peer %d: the %zu bytes of a command's arguments did not "
                "arrive\n", (int)getpid(), len);
        _exit(4);
    }
}

/* The child's loop: commands are one byte plus arguments. */
static void kt_peer_main(const kt_peer_opts_t *o, int in, int out)
{
    if (o->non_dumpable)
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    kvl_agent_t *a = kt_agent_tmo(o->name, o->backend ? o->backend : "shm", o->params,
                                  o->timeout_ms ? o->timeout_ms : 3000);
    void *buf;
    if (o->shareable == 2) {
        kvl_alloc_params_t ap = {.field_mask = KVL_ALLOC_PARAM_BACKEND,
                                 .backend = o->backend ? o->backend : "shm"};
        KT_OK(kvl_mem_alloc_ex(a, o->len, &ap, &buf));
    } else if (o->shareable)
        KT_OK(kvl_mem_alloc(a, o->len, &buf));
    else {
        buf = mmap(NULL, o->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        KT_CHECK(buf != MAP_FAILED);
    }
    memset(buf, 0, o->len);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, o->len, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_mem_desc_t ds[2] = {d}; /* what is registered now ('P' splits it) */
    size_t nd = 1;
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(a, &blob, &blen));
    kt_send_msg(out, blob, blen);
    kvl_free(blob);
    for (;;) {
        char cmd;
        uint64_t arg[3];
        if (kt_read(in, &cmd, 1, -1))
            break;
        switch (cmd) {
        case 'F':
            kt_peer_args(in, arg, 8);
            kt_fill(buf, o->len, arg[0]);
            kt_send_msg(out, "", 0);
            break;
        case 'V': {
            kt_peer_args(in, arg, 24);
            unsigned char *tmp = malloc(arg[1]);
            kt_fill(tmp, arg[1], arg[2]);
            long bad = -1;
            for (uint64_t i = 0; i < arg[1]; i++)
                if (((unsigned char *)buf)[arg[0] + i] != tmp[i]) {
                    bad = (long)i;
                    break;
                }
            free(tmp);
            kt_send_msg(out, &bad, sizeof(bad));
            break;
        }
        case 'R':
            kt_peer_args(in, arg, 16);
            kt_send_msg(out, (char *)buf + arg[0], arg[1]);
            break;
        case 'N': {
            kt_peer_args(in, arg, 8);
            kvl_notif_t n;
            size_t got = 0;
            if (kvl_notif_wait(a, (int64_t)arg[0]) == KVL_OK)
                kvl_notif_poll(a, &n, 1, &got);
            if (got == 0) {
                kt_send_msg(out, "", 0);
                kt_send_msg(out, "", 0);
            } else {
                kt_send_msg(out, n.from, strlen(n.from));
                kt_send_msg(out, n.msg, n.len);
                kvl_notif_free(&n);
            }
            break;
        }
        case 'C': {
            /* count waiting notifications without taking them: take and count */
            kvl_notif_t n[64];
            size_t got = 0, total = 0;
            do {
                kvl_notif_poll(a, n, 64, &got);
                for (size_t i = 0; i < got; i++)
                    kvl_notif_free(&n[i]);
                total += got;
            } while (got == 64);
            long t = (long)total;
            kt_send_msg(out, &t, sizeof(t));
            break;
        }
        case 'M':
            KT_OK(kvl_metadata_get(a, &blob, &blen));
            kt_send_msg(out, blob, blen);
            kvl_free(blob);
            break;
        case 'L': {
            uint64_t l;
            void *b = kt_recv_msg(in, &l, 5000);
            kvl_status_t st = kvl_metadata_load(a, b, l, NULL, 0);
            free(b);
            kt_send_msg(out, &st, sizeof(st));
            break;
        }
        case 'T': {
            uint64_t l1, l2;
            char *to = kt_recv_msg(in, &l1, 5000);
            char *msg = kt_recv_msg(in, &l2, 5000);
            kvl_status_t st = kvl_notif_send(a, to, msg, l2);
            free(to);
            free(msg);
            kt_send_msg(out, &st, sizeof(st));
            break;
        }
        case 'P': {
            /* the buffer registered again as two regions that touch at
             * offset arg[0] (then 'D' deregisters both) */
            kt_peer_args(in, arg, 8);
            kvl_mem_desc_t h[2] = {{d.addr, arg[0], KVL_DEV_ANY},
                                   {d.addr + arg[0], o->len - arg[0], KVL_DEV_ANY}};
            kvl_status_t st = arg[0] == 0 || arg[0] >= o->len || nd != 1
                                  ? KVL_ERR_INVALID_ARG : kvl_mem_deregister(a, &d, 1);
            if (st == KVL_OK)
                st = kvl_mem_register(a, h, 2, NULL, NULL);
            if (st == KVL_OK) {
                ds[0] = h[0];
                ds[1] = h[1];
                nd = 2;
            } else {
                fprintf(stderr, "peer: split: %s\n", kvl_last_error()->what);
            }
            kt_send_msg(out, &st, sizeof(st));
            break;
        }
        case 'D': {
            /* deregister the buffer, then fill it with a pattern (seed) */
            kt_peer_args(in, arg, 8);
            kvl_status_t st = kvl_mem_deregister(a, ds, nd);
            if (st == KVL_OK)
                kt_fill(buf, o->len, arg[0]);
            else
                fprintf(stderr, "peer: deregister: %s\n", kvl_last_error()->what);
            kt_send_msg(out, &st, sizeof(st));
            break;
        }
        case 'W': {
            /* WRITE the whole buffer to agent `to` at raddr, again and again,
             * until a transfer fails: answers "started", then the status */
            uint64_t l1;
            char *to = kt_recv_msg(in, &l1, 5000);
            kt_peer_args(in, arg, 8);
            kvl_dlist_t *ll, *rl;
            kvl_xfer_t *x;
            kvl_status_t st;
            KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ll));
            KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rl));
            KT_OK(kvl_dlist_add(ll, (uint64_t)(uintptr_t)buf, o->len, KVL_DEV_ANY));
            KT_OK(kvl_dlist_add(rl, arg[0], o->len, KVL_DEV_ANY));
            KT_OK(kvl_xfer_create(a, KVL_WRITE, ll, to, rl, NULL, &x));
            kt_send_msg(out, "", 0);
            do {
                st = kvl_xfer_post(x);
                if (st == KVL_OK || st == KVL_IN_PROGRESS)
                    st = kvl_xfer_wait(x, 20000);
            } while (st == KVL_OK);
            kt_send_msg(out, &st, sizeof(st));
            kvl_xfer_release(x);
            kvl_dlist_destroy(ll);
            kvl_dlist_destroy(rl);
            free(to);
            break;
        }
        case 'Q':
            kvl_agent_destroy(a);
            kt_send_msg(out, "", 0);
            _exit(0);
        default:
            _exit(2);
        }
    }
    _exit(0);
}

/*
 * The peer runs in a fresh process image: fork() of a process that already
 * runs kvlane threads may copy a lock some thread held (sanitizer runtimes'
 * allocators included), so the child execs this same program at once and
 * the constructor below turns it into the peer.
 */
static void kt_peer_ctor(void) __attribute__((constructor));
static void kt_peer_ctor(void)
{
    const char *env = getenv("KVL_TEST_PEER");
    if (env == NULL)
        return;
    static char name[64], backend[32], params[256];
    kt_peer_opts_t o = {0};
    unsigned long long len, tmo;
    int in, out, shareable, nd;
    if (sscanf(env, "%63[^;];%llu;%d;%31[^;];%255[^;];%d;%d;%d;%llu", name, &len, &shareable,
               backend, params, &nd, &in, &out, &tmo) != 9)
        _exit(4);
    unsetenv("KVL_TEST_PEER");
    o.name = name;
    o.len = (size_t)len;
    o.shareable = shareable;
    o.backend = backend;
    o.params = strcmp(params, "-") ? params : NULL;
    o.non_dumpable = nd;
    o.timeout_ms = tmo;
    kt_peer_main(&o, in, out);
    _exit(0);
}

void kt_peer_start(kt_peer_t *p, const kt_peer_opts_t *o, kvl_agent_t *agent)
{
    int a[2], b[2];
    /* close-on-exec, so no peer inherits another peer's pipes */
    KT_CHECK(pipe2(a, O_CLOEXEC) == 0 && pipe2(b, O_CLOEXEC) == 0);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", o->name);
    p->len = o->len;
    /* everything the child needs is prepared before fork: it only execs */
    char env[512];
    snprintf(env, sizeof(env), "KVL_TEST_PEER=%s;%zu;%d;%s;%s;%d;%d;%d;%llu", o->name, o->len,
             o->shareable, o->backend ? o->backend : "shm",
             o->params && o->params[0] ? o->params : "-", o->non_dumpable, a[0], b[1],
             (unsigned long long)o->timeout_ms);
    extern char **environ;
    size_t ne = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc(ne + 2, sizeof(*envp));
    KT_CHECK(envp != NULL);
    memcpy(envp, environ, ne * sizeof(*envp));
    envp[ne] = env;
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    KT_CHECK(el > 0);
    exe[el] = 0;
    char *argv[] = {exe, NULL};
    p->pid = fork();
    KT_CHECK(p->pid >= 0);
    if (p->pid == 0) {
        fcntl(a[0], F_SETFD, 0);
        fcntl(b[1], F_SETFD, 0);
        execve(exe, argv, envp);
        _exit(5);
    }
    free(envp);
    kt_peer_track(p->pid, 1);
    close(a[0]);
    close(b[1]);
    p->to = a[1];
    p->from = b[0];
    uint64_t len;
    void *blob = kt_recv_msg(p->from, &len, 20000);
    KT_CHECK(blob != NULL);
    if (agent) {
        kvl_status_t st = kvl_metadata_load(agent, blob, len, NULL, 0);
        free(blob);
        KT_OK(st);
        kvl_mem_desc_t r;
        size_t n = 0;
        KT_OK(kvl_remote_regions(agent, o->name, &r, NULL, 1, &n));
        KT_CHECK(n == 1 && r.len == o->len);
        p->base = r.addr;
    } else {
        free(blob);
    }
}

static void kt_cmd(kt_peer_t *p, char c, const uint64_t *args, int nargs)
{
    KT_CHECK(kt_write(p->to, &c, 1) == 0);
    if (nargs)
        KT_CHECK(kt_write(p->to, args, (size_t)nargs * 8) == 0);
}

void kt_peer_fill(kt_peer_t *p, uint64_t seed)
{
    uint64_t l;
    kt_cmd(p, 'F', &seed, 1);
    free(kt_recv_msg(p->from, &l, 20000));
}

long kt_peer_verify(kt_peer_t *p, uint64_t off, uint64_t len, uint64_t seed)
{
    uint64_t args[3] = {off, len, seed}, l;
    kt_cmd(p, 'V', args, 3);
    long *r = kt_recv_msg(p->from, &l, 20000);
    KT_CHECK(r != NULL);
    long v = *r;
    free(r);
    return v;
}

/* A command of one argument whose answer is a kvl_status_t. */
static kvl_status_t kt_peer_status_cmd(kt_peer_t *p, char c, uint64_t arg)
{
    uint64_t l;
    kt_cmd(p, c, &arg, 1);
    kvl_status_t *r = kt_recv_msg(p->from, &l, 20000);
    KT_CHECK(r != NULL && l == sizeof(*r));
    kvl_status_t st = *r;
    free(r);
    return st;
}

kvl_status_t kt_peer_dereg(kt_peer_t *p, uint64_t seed)
{
    return kt_peer_status_cmd(p, 'D', seed);
}

kvl_status_t kt_peer_split(kt_peer_t *p, uint64_t cut)
{
    return kt_peer_status_cmd(p, 'P', cut);
}

void kt_peer_write_loop(kt_peer_t *p, const char *to, uint64_t raddr)
{
    uint64_t l;
    kt_cmd(p, 'W', NULL, 0);
    kt_send_msg(p->to, to, strlen(to));
    KT_CHECK(kt_write(p->to, &raddr, 8) == 0);
    free(kt_recv_msg(p->from, &l, 20000));
}

void kt_peer_read(kt_peer_t *p, uint64_t off, void *buf, uint64_t len)
{
    uint64_t args[2] = {off, len}, l;
    kt_cmd(p, 'R', args, 2);
    void *r = kt_recv_msg(p->from, &l, 20000);
    if (r == NULL || l != len) {
        int ws = 0;
        pid_t w = waitpid(p->pid, &ws, WNOHANG);
        char how[64] = "is still running";
        if (w == p->pid && WIFSIGNALED(ws))
            snprintf(how, sizeof(how), "died of signal %d", WTERMSIG(ws));
        else if (w == p->pid)
            snprintf(how, sizeof(how), "exited with %d", WEXITSTATUS(ws));
        fprintf(stderr, "peer %d: %s reply to 'R' of %llu bytes; the peer %s\n", (int)p->pid,
                r == NULL ? "no" : "a wrong", (unsigned long long)len, how);
    }
    KT_CHECK(r != NULL && l == len);
    memcpy(buf, r, len);
    free(r);
}

long kt_peer_notif(kt_peer_t *p, int timeout_ms, char *buf, size_t cap, char *from, size_t fcap)
{
    uint64_t t = (uint64_t)timeout_ms, l1, l2;
    kt_cmd(p, 'N', &t, 1);
    char *f = kt_recv_msg(p->from, &l1, timeout_ms + 10000);
    char *m = kt_recv_msg(p->from, &l2, 10000);
    KT_CHECK(f != NULL && m != NULL);
    long r = l1 == 0 ? -1 : (long)l2;
    if (from)
        snprintf(from, fcap, "%s", f);
    if (buf && cap) {
        size_t n = l2 < cap - 1 ? l2 : cap - 1;
        memcpy(buf, m, n);
        buf[n] = 0;
    }
    free(f);
    free(m);
    return r;
}

long kt_peer_notif_count(kt_peer_t *p)
{
    uint64_t l;
    kt_cmd(p, 'C', NULL, 0);
    long *r = kt_recv_msg(p->from, &l, 10000);
    KT_CHECK(r != NULL);
    long v = *r;
    free(r);
    return v;
}

void *kt_peer_metadata(kt_peer_t *p, size_t *len)
{
    uint64_t l;
    kt_cmd(p, 'M', NULL, 0);
    void *b = kt_recv_msg(p->from, &l, 10000);
    KT_CHECK(b != NULL);
    *len = l;
    return b;
}

void kt_peer_load(kt_peer_t *p, const void *blob, size_t len)
{
    uint64_t l;
    kt_cmd(p, 'L', NULL, 0);
    kt_send_msg(p->to, blob, len);
    kvl_status_t *st = kt_recv_msg(p->from, &l, 10000);
    KT_CHECK(st != NULL && *st == KVL_OK);
    free(st);
}

void kt_peer_notify(kt_peer_t *p, const char *to, const char *msg)
{
    uint64_t l;
    kt_cmd(p, 'T', NULL, 0);
    kt_send_msg(p->to, to, strlen(to));
    kt_send_msg(p->to, msg, strlen(msg));
    kvl_status_t *st = kt_recv_msg(p->from, &l, 10000);
    KT_CHECK(st != NULL && *st == KVL_OK);
    free(st);
}

void kt_peer_stop(kt_peer_t *p)
{
    uint64_t l;
    int status;
    kt_cmd(p, 'Q', NULL, 0);
    free(kt_recv_msg(p->from, &l, 10000));
    close(p->to);
    close(p->from);
    waitpid(p->pid, &status, 0);
    kt_peer_track(p->pid, 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fprintf(stderr, "peer %s: %s %d\n", p->name, WIFEXITED(status) ? "exit" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

void kt_peer_stop_signal(kt_peer_t *p)
{
    kill(p->pid, SIGSTOP);
    /* kill() returns before every thread has stopped; a thread inside a long
     * receive finishes it first. Wait until all of them show state T. */
    for (int tries = 0; tries < 400; tries++) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/task", (int)p->pid);
        DIR *d = opendir(path);
        struct dirent *e;
        int running = 0;
        while (d && (e = readdir(d)) != NULL) {
            char sp[128], buf[512];
            if (e->d_name[0] == '.')
                continue;
            snprintf(sp, sizeof(sp), "%.60s/%.32s/stat", path, e->d_name);
            FILE *f = fopen(sp, "r");
            if (f && fgets(buf, sizeof(buf), f)) {
                char *rp = strrchr(buf, ')');
                if (rp && rp[1] == ' ' && rp[2] != 'T' && rp[2] != 't')
                    running++;
            }
            if (f)
                fclose(f);
        }
        if (d)
            closedir(d);
        if (!running)
            return;
        usleep(5000);
    }
}

void kt_peer_kill(kt_peer_t *p)
{
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    kt_peer_track(p->pid, 0);
    close(p->to);
    close(p->from);
}

void kt_clean_exit(void (*fn)(int), int arg, const char *label)
{
    static const char *const bad[] = {"destroying inuse", "inuse", "leak", "not released",
                                      "was not destroyed", "Assertion", "fatal",
                                      "AddressSanitizer", "runtime error", "Aborted"};
    char path[128], text[65536];
    snprintf(path, sizeof(path), "/tmp/kvl-clean-exit-%d-%d.log", (int)getpid(), arg);
    printf("--- %s\n", label);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(9);
        fn(arg);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    int fd = open(path, O_RDONLY);
    KT_CHECK(fd >= 0);
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    unlink(path);
    text[n > 0 ? n : 0] = '\0';
    printf("exit status %d, stderr:\n%s\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1, text);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (strcasestr(text, bad[i]) != NULL) {
            fprintf(stderr, "FAIL: %s: stderr contains \"%s\"\n", label, bad[i]);
            exit(1);
        }
}

#if defined(__SANITIZE_ADDRESS__)
#define KT_UCX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KT_UCX_ASAN 1
#endif
#endif
void kt_ucx_sanitizer_env(void)
{
#ifdef KT_UCX_ASAN
    setenv("UCX_MEM_MALLOC_HOOKS", "no", 0);
    setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 0);
#endif
}

void *kt_ucx_real(const char *name)
{
    void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
    void *sym = h != NULL ? dlsym(h, name) : NULL;
    if (sym == NULL) {
        fprintf(stderr, "kt_ucx_real: UCX's %s not found (%s)\n", name, dlerror());
        abort();
    }
    return sym;
}

void kt_need_ucx(void)
{
    char reason[512];
    kt_ucx_sanitizer_env();
    if (kvl_backend_available("ucx", reason, sizeof(reason)) != KVL_OK)
        KT_SKIP("ucx backend not available: %s", reason);
    printf("ucx: %s\n", reason);
}

kvl_status_t kt_file_move(kvl_agent_t *a, kvl_xfer_op_t op, kvl_mem_kind_t kind, int32_t dev,
                          uint64_t base, const uint64_t *loff, const uint64_t *foff, size_t n,
                          uint64_t len, int fd, char *path, size_t cap)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(kind, n, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, n, &r));
    for (size_t i = 0; i < n; i++) {
        KT_OK(kvl_dlist_add(l, base + loff[i], len, dev));
        KT_OK(kvl_dlist_add(r, foff[i], len, fd));
    }
    if (cap > 0)
        path[0] = '\0';
    kvl_status_t st = kvl_xfer_create(a, op, l, kvl_agent_name(a), r, NULL, &x);
    if (st == KVL_OK) {
        st = kvl_xfer_post(x);
        if (st == KVL_OK || st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 120000);
        kvl_xfer_stats_t s;
        if (st == KVL_OK && cap > 0 && kvl_xfer_get_stats(x, &s) == KVL_OK)
            snprintf(path, cap, "%s", s.path);
        kvl_xfer_release(x);
    }
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return st;
}
