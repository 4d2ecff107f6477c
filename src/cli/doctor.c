/*
 * kvlane doctor: preflight for a pod or host before the engine starts.
 * Each check reports ok / warn / fail, what it observed and the fix; then a
 * smoke test per available backend and memory kind runs the same path the
 * engine will (allocate, register, transfer to a second agent, verify,
 * deregister). Exit code: 0 all ok, 1 warnings only, 2 a failure that will
 * break registration or transfers.
 *
 * Fault injection for tests: KVL_SYSFS_ROOT / KVL_DEV_ROOT / KVL_PROC_ROOT
 * replace /sys, /dev and /proc for the file-based checks.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "cli.h"
#include "common/host.h"
#include "common/rdma_diag.h"

enum { KVL_OKAY = 0, KVL_WARN = 1, KVL_FAIL = 2 };

typedef struct {
    char name[64];
    int status;
    char observed[2048];
    char hint[1024];
} kvl_check_t;

typedef struct {
    kvl_check_t *v;
    size_t n, cap;
    int json;
} kvl_report_t;

static kvl_report_t kvl_rep;

static void kvl_check(const char *name, int status, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void kvl_check(const char *name, int status, const char *hint, const char *fmt, ...)
{
    if (kvl_rep.n == kvl_rep.cap) {
        kvl_rep.cap = kvl_rep.cap ? kvl_rep.cap * 2 : 32;
        kvl_rep.v = realloc(kvl_rep.v, kvl_rep.cap * sizeof(*kvl_rep.v));
        if (kvl_rep.v == NULL)
            exit(2);
    }
    kvl_check_t *c = &kvl_rep.v[kvl_rep.n++];
    va_list ap;
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->status = status;
    va_start(ap, fmt);
    vsnprintf(c->observed, sizeof(c->observed), fmt, ap);
    va_end(ap);
    snprintf(c->hint, sizeof(c->hint), "%s", status == KVL_OKAY || hint == NULL ? "" : hint);
}

static void kvl_probe_cb(void *arg, const char *check, int status, const char *observed,
                         const char *hint)
{
    char name[64];
    snprintf(name, sizeof(name), "%s.%s", (const char *)arg, check);
    kvl_check(name, status < 0 || status > 2 ? KVL_FAIL : status, hint, "%s", observed);
}

static const char *kvl_root(const char *env, const char *def)
{
    const char *r = getenv(env);
    return r && r[0] ? r : def;
}

static int kvl_read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return 0;
}

static void kvl_fmt_bytes(uint64_t v, char *buf, size_t cap)
{
    if (v == RLIM_INFINITY)
        snprintf(buf, cap, "unlimited");
    else if (v >= (1ull << 30))
        snprintf(buf, cap, "%.1f GiB", (double)v / (1ull << 30));
    else if (v >= (1ull << 20))
        snprintf(buf, cap, "%.1f MiB", (double)v / (1ull << 20));
    else
        snprintf(buf, cap, "%" PRIu64 " KiB", v >> 10);
}

/* ---- system checks ---- */

static void kvl_check_host(void)
{
    struct utsname u;
    uname(&u);
    kvl_check("host.kernel", KVL_OKAY, NULL, "%s %s on %s (%ld CPUs)", u.sysname, u.release,
              u.machine, sysconf(_SC_NPROCESSORS_ONLN));
}

static int kvl_have_cap(int cap);

static void kvl_check_memlock(uint64_t planned, kvl_mem_kind_t mem)
{
    struct rlimit rl;
    char cur[32], want[32];
    getrlimit(RLIMIT_MEMLOCK, &rl);
    kvl_fmt_bytes(rl.rlim_cur, cur, sizeof(cur));
    kvl_fmt_bytes(planned, want, sizeof(want));
    if (rl.rlim_cur == RLIM_INFINITY || (planned && rl.rlim_cur >= planned))
        kvl_check("limits.memlock", KVL_OKAY, NULL, "locked-memory limit %s%s%s", cur,
                  planned ? ", planned registration " : "", planned ? want : "");
    else if (planned && kvl_have_cap(14 /* CAP_IPC_LOCK */) == 1)
        /* the kernel lets a CAP_IPC_LOCK process pin beyond the limit (mlock,
         * ibv_reg_mr): the Kubernetes way, where the runtime's limit is fixed */
        kvl_check("limits.memlock", KVL_OKAY, NULL, "locked-memory limit %s < planned "
                  "registration %s, but CAP_IPC_LOCK is effective: the kernel lets this process "
                  "pin memory beyond the limit", cur, want);
    else
        kvl_check("limits.memlock", planned ? KVL_FAIL : KVL_OKAY,
                  "raise it: `ulimit -l unlimited` in the engine's shell, LimitMEMLOCK=infinity "
                  "in a systemd unit, or the container runtime's memlock ulimit "
                  "(docker --ulimit memlock=-1; Kubernetes: the node's containerd LimitMEMLOCK), "
                  "or give the process CAP_IPC_LOCK (Kubernetes: securityContext.capabilities.add: "
                  "[IPC_LOCK]), which lifts the limit",
                  "locked-memory limit %s%s%s: RDMA registration and pinned GPU staging lock "
                  "the registered memory", cur, planned ? " < planned registration " : "",
                  planned ? want : " (pass --size to check a planned registration)");
    (void)mem;
}

static void kvl_check_shm(uint64_t planned)
{
    uint64_t total = 0, avail = 0;
    char tot[32], fr[32];
    int e = kvli_host_dev_shm_size(&total, &avail);
    if (e != 0) {
        kvl_check("limits.dev_shm", KVL_WARN,
                  "mount a tmpfs on /dev/shm (Kubernetes: an emptyDir with medium: Memory)",
                  "statvfs(/dev/shm) failed: %s", strerror(e));
        return;
    }
    kvl_fmt_bytes(total, tot, sizeof(tot));
    kvl_fmt_bytes(avail, fr, sizeof(fr));
    int small = total < (1ull << 30), short_ = planned != 0 && avail < planned;
    char want[32];
    kvl_fmt_bytes(planned, want, sizeof(want));
    /* kvl_mem_alloc_ex(ucx) and UCX's shared-memory transports allocate
     * there; a planned size it cannot hold fails those allocations */
    kvl_check("limits.dev_shm", small || short_ ? KVL_WARN : KVL_OKAY,
              "UCX's shared-memory transports and UCX-allocated memory (kvl_mem_alloc_ex with "
              "ucx) use /dev/shm; enlarge it (docker --shm-size=16g; Kubernetes: emptyDir "
              "medium: Memory mounted at /dev/shm)",
              "/dev/shm %s, %s free%s%s%s", tot, fr,
              short_ ? " < planned " : planned ? ", planned " : "", planned ? want : "",
              small ? " (containers default to 64 MiB)" : "");
}

static int kvl_have_cap(int cap)
{
    char buf[4096], path[256];
    snprintf(path, sizeof(path), "%s/self/status", kvl_root("KVL_PROC_ROOT", "/proc"));
    if (kvl_read_file(path, buf, sizeof(buf)) != 0)
        return -1;
    const char *p = strstr(buf, "CapEff:");
    if (p == NULL)
        return -1;
    unsigned long long v = strtoull(p + 7, NULL, 16);
    return (int)((v >> cap) & 1);
}

static void kvl_check_cma(void)
{
    char scope[32] = "", path[256];
    snprintf(path, sizeof(path), "%s/sys/kernel/yama/ptrace_scope", kvl_root("KVL_PROC_ROOT", "/proc"));
    int have_yama = kvl_read_file(path, scope, sizeof(scope)) == 0;
    int cap = kvl_have_cap(19 /* CAP_SYS_PTRACE */);
    /* Try it for real, the way a peer engine would: a child reads its
     * parent's memory (yama ptrace_scope=1 lets ancestors attach to
     * descendants only, so the reverse direction would hide it). */
    static volatile uint64_t word = 0x6b766c616e65ull;
    int pfd[2];
    int ok = 0, err = 0;
    if (pipe(pfd) == 0) {
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid == 0) {
            uint64_t got = 0;
            struct iovec l = {&got, sizeof(got)}, r = {(void *)&word, sizeof(word)};
            ssize_t n = process_vm_readv(parent, &l, 1, &r, 1, 0);
            int res[2] = {n == (ssize_t)sizeof(got) && got == word, n < 0 ? errno : 0};
            if (write(pfd[1], res, sizeof(res)) < 0)
                _exit(1);
            _exit(0);
        }
        close(pfd[1]);
        int res[2] = {0, EIO};
        if (pid > 0 && kvl_cli_read_all(pfd[0], res, sizeof(res), 5000) == 0) {
            ok = res[0];
            err = res[1];
        }
        close(pfd[0]);
        if (pid > 0)
            waitpid(pid, NULL, 0);
    }
    if (ok)
        kvl_check("cma.process_vm_readv", KVL_OKAY, NULL,
                  "cross-memory attach works between processes of this user%s%s%s",
                  have_yama ? " (yama ptrace_scope=" : "", have_yama ? scope : "",
                  have_yama ? ")" : "");
    else
        kvl_check("cma.process_vm_readv", KVL_WARN,
                  "shm falls back to a slower socket path; allow it with "
                  "`sysctl kernel.yama.ptrace_scope=0` or CAP_SYS_PTRACE (docker --cap-add "
                  "SYS_PTRACE), or allocate host KV buffers with kvl_mem_alloc()",
                  "process_vm_readv between two processes of this user failed: %s; yama "
                  "ptrace_scope=%s, CAP_SYS_PTRACE %s (a container's seccomp profile may forbid "
                  "the call)", strerror(err), have_yama ? scope : "absent",
                  cap == 1 ? "present" : cap == 0 ? "absent" : "unknown");
}

static void kvl_check_net(void)
{
    struct ifaddrs *ifs, *i;
    char list[480] = "";
    size_t off = 0;
    int nonloop = 0;
    if (getifaddrs(&ifs) != 0) {
        kvl_check("net.interfaces", KVL_WARN, "check the network namespace", "getifaddrs failed: %s",
                  strerror(errno));
        return;
    }
    for (i = ifs; i; i = i->ifa_next) {
        if (i->ifa_addr == NULL || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        char host[INET6_ADDRSTRLEN] = "";
        getnameinfo(i->ifa_addr, i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                                   : sizeof(struct sockaddr_in6),
                    host, sizeof(host), NULL, 0, NI_NUMERICHOST);
        if (!(i->ifa_flags & IFF_LOOPBACK) && (i->ifa_flags & IFF_UP))
            nonloop++;
        if (off < sizeof(list) - 1)
            off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s %s%s", off ? ", " : "",
                                    i->ifa_name, host, (i->ifa_flags & IFF_UP) ? "" : " (down)");
    }
    freeifaddrs(ifs);
    kvl_check("net.interfaces", nonloop ? KVL_OKAY : KVL_WARN,
              "only loopback is up: peers on other hosts cannot reach this one",
              "%s", list[0] ? list : "none");
}

static void kvl_check_peer(const char *peer)
{
    char host[256];
    const char *colon = strrchr(peer, ':');
    if (colon == NULL || colon == peer || (size_t)(colon - peer) >= sizeof(host)) {
        kvl_check("net.peer", KVL_FAIL, "pass --peer host:port", "'%s' is not host:port", peer);
        return;
    }
    uint64_t port;
    if (kvl_cli_parse_uint(colon + 1, 65535, &port) != 0 || port == 0) {
        /* getaddrinfo takes "99999" and connects to it modulo 65536 */
        kvl_check("net.peer", KVL_FAIL, "pass --peer host:port with a port of 1..65535",
                  "'%s': the port '%s' is not 1..65535", peer, colon + 1);
        return;
    }
    memcpy(host, peer, (size_t)(colon - peer));
    host[colon - peer] = '\0';
    if (host[0] == '[') { /* [v6]:port */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) {
        kvl_check("net.peer", KVL_FAIL, "check the name (DNS, /etc/hosts) and the port",
                  "cannot resolve %s: %s", peer, gai_strerror(rc));
        return;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int e = 0;
    double t0 = kvl_cli_now();
    if (fd < 0 || (connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS))
        e = errno;
    else {
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 3000) != 1)
            e = ETIMEDOUT;
        else {
            socklen_t l = sizeof(e);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
        }
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    if (e == 0)
        kvl_check("net.peer", KVL_OKAY, NULL, "TCP connect to %s in %.1f ms", peer,
                  (kvl_cli_now() - t0) * 1e3);
    else
        kvl_check("net.peer", KVL_FAIL,
                  e == ECONNREFUSED ? "nothing listens there: is the peer's agent listening on "
                                      "that port?"
                                    : "check routes, firewalls and network policies between the "
                                      "pods/hosts",
                  "TCP connect to %s: %s", peer, strerror(e));
}

static void kvl_check_container(int vram)
{
    char buf[4096], path[256];
    const char *proc = kvl_root("KVL_PROC_ROOT", "/proc");
    snprintf(path, sizeof(path), "%s/1/cgroup", proc);
    int in = access("/.dockerenv", F_OK) == 0;
    const char *runtime = in ? "docker" : NULL;
    if (kvl_read_file(path, buf, sizeof(buf)) == 0) {
        if (strstr(buf, "kubepods"))
            runtime = "kubernetes", in = 1;
        else if (strstr(buf, "docker") || strstr(buf, "containerd"))
            runtime = "container", in = 1;
    }
    char mem[64] = "";
    if (kvl_read_file("/sys/fs/cgroup/memory.max", mem, sizeof(mem)) != 0)
        snprintf(mem, sizeof(mem), "unknown");
    char ipc_self[128] = "", ipc_init[128] = "";
    snprintf(path, sizeof(path), "%s/self/ns/ipc", proc);
    ssize_t a = readlink(path, ipc_self, sizeof(ipc_self) - 1);
    snprintf(path, sizeof(path), "%s/1/ns/ipc", proc);
    ssize_t b = readlink(path, ipc_init, sizeof(ipc_init) - 1);
    if (a > 0)
        ipc_self[a] = 0;
    if (b > 0)
        ipc_init[b] = 0;
    kvl_check("container", KVL_OKAY, NULL, "%s; cgroup memory.max %s; IPC namespace %s",
              in ? runtime : "not in a container (no markers)", mem,
              a > 0 ? ipc_self : "unknown");
    if (in && vram)
        kvl_check("container.ipc", KVL_WARN,
                  "same-host GPU transfers (CUDA IPC) and shm between pods need a shared IPC "
                  "and PID view: run prefill and decode in one pod, or with hostIPC/hostPID",
                  "inside a container: peers in other pods do not share this IPC namespace");
}

/* ---- RDMA: devices listed in sysfs vs openable nodes, ports ---- */

static void kvl_check_rdma(void)
{
    kvli_rdma_scan_t *s = calloc(1, sizeof(*s));
    char text[2048], list[480] = "";
    size_t off = 0;
    if (s == NULL)
        return;
    kvli_rdma_diag_scan(s);
    if (s->n == 0) {
        if (s->dev_dir_present && s->dev_nodes[0])
            kvl_check("rdma.devices", KVL_WARN,
                      "the RDMA driver is not loaded here or sysfs is not the host's: ibv_devices "
                      "lists nothing; without RDMA, transfers use tcp/shm",
                      "%.255s/infiniband holds %.255s but %.255s/class/infiniband lists no "
                      "device", s->dev_root, s->dev_nodes, s->sysfs_root);
        else
            kvl_check("rdma.devices", KVL_OKAY, NULL, "none: tcp/shm only (%.255s/class/infiniband "
                      "lists no RDMA device)", s->sysfs_root);
        free(s);
        return;
    }
    for (unsigned i = 0; i < s->n && off < sizeof(list); i++) {
        const kvli_rdma_dev_t *v = &s->devs[i];
        off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%.63s (%.31s%s)", i ? ", " : "",
                                v->name, v->uverbs[0] ? v->uverbs : "no uverbs",
                                v->node_openable ? " opens" : v->node_present ? " not openable"
                                : v->uverbs[0] ? " missing" : "");
    }
    kvli_rdma_diag_render(s, text, sizeof(text));
    if (s->n_broken == 0)
        kvl_check("rdma.devices", KVL_OKAY, NULL, "%u listed in %.255s/class/infiniband, all "
                  "openable: %s", s->n, s->sysfs_root, list);
    else if (s->n_broken == s->n)
        kvl_check("rdma.devices", KVL_FAIL,
                  "expose the devices to the container: the RDMA device plugin's resource (e.g. "
                  "rdma/hca or nvidia.com/hostdev), or mount /dev/infiniband (docker "
                  "--device=/dev/infiniband/uverbsN); or, to run without RDMA, set UCX_TLS to "
                  "exclude it (UCX_TLS=tcp,sm)",
                  "%u RDMA device%s listed in sysfs but no uverbs node is openable: verbs, and "
                  "UCX over them, fail with \"No such device\": %s. %s", s->n, s->n == 1 ? "" : "s",
                  list, text);
    else
        kvl_check("rdma.devices", KVL_WARN,
                  "keep the engine on the openable devices (UCX_NET_DEVICES), or expose the others "
                  "to the container (RDMA device plugin, /dev/infiniband)",
                  "%u of %u RDMA devices listed in sysfs have no openable uverbs node: %s. %s",
                  s->n_broken, s->n, list, text);
    if (s->cm_openable)
        kvl_check("rdma.rdma_cm", KVL_OKAY, NULL, "%.255s/infiniband/rdma_cm opens", s->dev_root);
    else
        kvl_check("rdma.rdma_cm", KVL_WARN,
                  "expose /dev/infiniband/rdma_cm too (the RDMA device plugin does; docker "
                  "--device=/dev/infiniband/rdma_cm): UCX's rdmacm transport and RoCE connection "
                  "setup need it",
                  "%.255s/infiniband/rdma_cm %s (%s)", s->dev_root,
                  s->cm_present ? "exists but cannot be opened" : "is missing",
                  strerror(s->cm_errno));
    for (unsigned i = 0; i < s->n; i++) {
        const kvli_rdma_dev_t *v = &s->devs[i];
        char name[64], obs[256], hint[400];
        if (v->nports == 0) {
            snprintf(name, sizeof(name), "rdma.%.50s", v->name);
            kvl_check(name, KVL_WARN, "check the driver (ibstat, dmesg)",
                      "%.63s lists no ports in %.255s/class/infiniband/%.63s/ports", v->name,
                      s->sysfs_root, v->name);
            continue;
        }
        for (unsigned j = 0; j < v->nports; j++) {
            int st = kvli_rdma_diag_port(v, &v->ports[j], obs, sizeof(obs), hint, sizeof(hint));
            snprintf(name, sizeof(name), "rdma.%.50s.port%u", v->name, v->ports[j].num);
            kvl_check(name, st ? KVL_WARN : KVL_OKAY, hint, "%s", obs);
        }
    }
    free(s);
}

static void kvl_check_backends(kvl_mem_kind_t mem, int32_t dev, uint64_t planned)
{
    for (const char *const *n = kvl_backend_names(); *n; n++) {
        char reason[512], name[64];
        kvl_status_t st = kvl_backend_available(*n, reason, sizeof(reason));
        snprintf(name, sizeof(name), "backend.%.40s", *n);
        if (st == KVL_OK)
            kvl_check(name, KVL_OKAY, NULL, "available%s%s", reason[0] ? ": " : "", reason);
        else
            kvl_check(name, KVL_WARN,
                      "only needed if the engine uses this backend; the reason says what is missing",
                      "unavailable: %s", reason);
        size_t at = kvl_rep.n - 1;
        /* the backend's own checks (RDMA devices, UCX transports, GPUs ...);
         * a module that is not there cannot run them: say so */
        if (kvl_backend_probe(*n, kvl_probe_cb, (void *)*n, mem, dev, planned) == KVL_ERR_NOT_FOUND &&
            st != KVL_OK) {
            kvl_check_t *c = &kvl_rep.v[at];
            size_t l = strlen(c->observed);
            snprintf(c->observed + l, sizeof(c->observed) - l, " (so its own checks, %.40s.*, "
                     "did not run)", *n);
        }
    }
}

/* ---- VRAM: is there a backend that can register GPU memory here ---- */

static int kvl_has_backend(const char *name)
{
    for (const char *const *n = kvl_backend_names(); *n; n++)
        if (strcmp(*n, name) == 0)
            return 1;
    return 0;
}

/* Returns 1 when VRAM can be registered (the cuda backend is available). */
static int kvl_check_vram(int32_t dev)
{
    char reason[512], devs[32], names[128] = "";
    size_t off = 0;
    if (dev == KVL_DEV_ANY)
        snprintf(devs, sizeof(devs), "(no --device given)");
    else
        snprintf(devs, sizeof(devs), "device %d", (int)dev);
    for (const char *const *n = kvl_backend_names(); *n && off < sizeof(names); n++)
        off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%.20s", off ? " " : "", *n);
    if (!kvl_has_backend("cuda")) {
        /* Say what a build with the cuda backend would find: the driver. */
        const char *drv = getenv("KVL_CUDA_DRIVER");
        void *h = dlopen(drv && drv[0] ? drv : "libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        const char *e = h ? NULL : dlerror();
        if (h)
            dlclose(h);
        kvl_check("vram.backend", KVL_FAIL,
                  "build kvlane with its cuda backend (src/backends/cuda, loads the driver at run "
                  "time) to register GPU memory; or run the engine with host (DRAM) KV buffers",
                  "VRAM requested: this build has no cuda backend (it has: %s), so no GPU memory "
                  "can be registered; CUDA driver: %.300s", names,
                  h ? "libcuda.so.1 loads" : e ? e : "not found");
        return 0;
    }
    kvl_status_t st = kvl_backend_available("cuda", reason, sizeof(reason));
    if (st != KVL_OK) {
        kvl_check("vram.backend", KVL_FAIL,
                  "install the NVIDIA driver or expose it and the GPU to the container (NVIDIA "
                  "container toolkit, the nvidia.com/gpu resource); check CUDA_VISIBLE_DEVICES",
                  "VRAM requested %s, but no CUDA driver/GPU is usable: %.400s", devs, reason);
        return 0;
    }
    kvl_check("vram.backend", KVL_OKAY, NULL, "VRAM requested %s: cuda backend available%s%.400s",
              devs, reason[0] ? ": " : "", reason);
    return 1;
}

/* ---- smoke test: the path the engine will use ---- */

static int kvl_smoke_one(const char *backend, kvl_mem_kind_t mem, int32_t dev, uint64_t size,
                         int shareable)
{
    char name[64], what[256] = "";
    snprintf(name, sizeof(name), "smoke.%s.%s%s", backend, kvl_mem_kind_name(mem),
             shareable ? ".shareable" : "");
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 5000};
    kvl_agent_t *a = NULL, *b = NULL;
    void *src = NULL, *dst = NULL;
    unsigned char *host = NULL;
    int rc = KVL_FAIL;
    kvl_dlist_t *l = NULL, *r = NULL;
    kvl_xfer_t *x = NULL;
    double t0 = kvl_cli_now(), t1 = t0;
    const char *step = "kvl_agent_create";
    if (kvl_agent_create("doctor-src", &cfg, &a) || kvl_agent_create("doctor-dst", &cfg, &b))
        goto out;
    step = "kvl_backend_create";
    if (kvl_backend_create(a, backend, NULL, 0, NULL) || kvl_backend_create(b, backend, NULL, 0, NULL))
        goto out;
    step = "allocate";
    if (mem == KVL_MEM_VRAM) {
        /* what the engine will register: GPU memory on --device */
        uint64_t gs = 0, gd = 0;
        if (kvl_cli_gpu_alloc(dev, size, &gs, what, sizeof(what)) != 0 ||
            kvl_cli_gpu_alloc(dev, size, &gd, what, sizeof(what)) != 0) {
            if (gs)
                kvl_cli_gpu_free(dev, gs);
            goto out;
        }
        src = (void *)(uintptr_t)gs;
        dst = (void *)(uintptr_t)gd;
        host = malloc(size);
        if (host == NULL) {
            snprintf(what, sizeof(what), "malloc(%" PRIu64 ") for the pattern failed", size);
            goto out;
        }
        for (uint64_t i = 0; i < size; i++)
            host[i] = (unsigned char)(i * 13 + 7);
        if (kvl_cli_gpu_copy(dev, 1, gs, host, size, what, sizeof(what)) != 0)
            goto out;
        memset(host, 0, size);
        if (kvl_cli_gpu_copy(dev, 1, gd, host, size, what, sizeof(what)) != 0)
            goto out;
    } else {
        src = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (src == MAP_FAILED) {
            src = NULL;
            snprintf(what, sizeof(what), "mmap(%" PRIu64 ") failed: %s", size, strerror(errno));
            goto out;
        }
        if (shareable) {
            if (kvl_mem_alloc(b, size, &dst))
                goto out;
        } else {
            dst = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (dst == MAP_FAILED) {
                dst = NULL;
                snprintf(what, sizeof(what), "mmap(%" PRIu64 ") failed: %s", size, strerror(errno));
                goto out;
            }
        }
        for (uint64_t i = 0; i < size; i++)
            ((unsigned char *)src)[i] = (unsigned char)(i * 13 + 7);
        memset(dst, 0, size);
    }
    kvl_mem_desc_t ds = {(uint64_t)(uintptr_t)src, size, dev}, dd = {(uint64_t)(uintptr_t)dst, size, dev};
    step = "kvl_mem_register";
    if (kvl_mem_register(a, &ds, 1, NULL, NULL) || kvl_mem_register(b, &dd, 1, NULL, NULL))
        goto out;
    void *blob;
    size_t blen;
    step = "kvl_metadata_get/load";
    if (kvl_metadata_get(b, &blob, &blen))
        goto out;
    kvl_status_t st = kvl_metadata_load(a, blob, blen, NULL, 0);
    kvl_free(blob);
    if (st)
        goto out;
    step = "kvl_xfer_create";
    if (kvl_dlist_create(mem, 1, &l) || kvl_dlist_create(mem, 1, &r) ||
        kvl_dlist_add(l, ds.addr, size, KVL_DEV_ANY) || kvl_dlist_add(r, dd.addr, size, KVL_DEV_ANY))
        goto out;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = backend};
    if (kvl_xfer_create(a, KVL_WRITE, l, "doctor-dst", r, &xp, &x))
        goto out;
    step = "transfer";
    t0 = kvl_cli_now();
    st = kvl_xfer_post(x);
    if (st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 10000);
    t1 = kvl_cli_now();
    if (st)
        goto out;
    step = "verify";
    if (mem == KVL_MEM_VRAM) {
        if (kvl_cli_gpu_copy(dev, 0, (uint64_t)(uintptr_t)dst, host, size, what, sizeof(what)) != 0)
            goto out;
        for (uint64_t i = 0; i < size; i++)
            if (host[i] != (unsigned char)(i * 13 + 7)) {
                snprintf(what, sizeof(what), "byte %" PRIu64 " of the GPU buffer that arrived differs", i);
                goto out;
            }
    } else if (memcmp(src, dst, size) != 0) {
        snprintf(what, sizeof(what), "the bytes that arrived differ from the bytes sent");
        goto out;
    }
    kvl_xfer_stats_t s;
    kvl_xfer_get_stats(x, &s);
    kvl_xfer_release(x);
    x = NULL;
    step = "kvl_mem_deregister";
    if (kvl_mem_deregister(a, &ds, 1) || kvl_mem_deregister(b, &dd, 1))
        goto out;
    char sz[32];
    kvl_fmt_bytes(size, sz, sizeof(sz));
    kvl_check(name, KVL_OKAY, NULL, "registered, wrote %s to a second agent over path %s "
              "(%.2f GB/s), verified, deregistered", sz, s.path, (double)size / ((t1 - t0) * 1e9));
    rc = KVL_OKAY;
out:
    if (rc != KVL_OKAY) {
        char err[1024] = "";
        if (!what[0])
            kvl_error_render(NULL, err, sizeof(err));
        kvl_check(name, KVL_FAIL, "the step's error says why; fix that before starting the engine",
                  "%s failed: %s", step, what[0] ? what : err);
    }
    if (x)
        kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
    kvl_agent_destroy(b); /* frees the shareable allocation */
    if (mem == KVL_MEM_VRAM) {
        kvl_cli_gpu_free(dev, (uint64_t)(uintptr_t)src);
        kvl_cli_gpu_free(dev, (uint64_t)(uintptr_t)dst);
    } else {
        if (dst && !shareable)
            munmap(dst, size);
        if (src)
            munmap(src, size);
    }
    free(host);
    return rc;
}

/* FILE offload (posix): the target directory takes files, has room and
 * (or not) O_DIRECT; then a file is written from registered memory and
 * read back through the backend, verified. */
static void kvl_smoke_file(const char *dir, uint64_t size)
{
    char path[4200], fs[64] = "";
    struct stat st;
    struct statvfs sv;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        kvl_check("file.dir", KVL_FAIL, "create the directory the engine offloads KV cache to, "
                  "or pass it with --dir", "%s: %s", dir,
                  errno ? strerror(errno) : "not a directory");
        return;
    }
    snprintf(path, sizeof(path), "%s/.kvlane-doctor-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        kvl_check("file.dir", KVL_FAIL, "the engine cannot create its KV files there: fix the "
                  "permissions or the mount (read-only?), or use another directory",
                  "cannot create a file in %s: %s", dir, strerror(errno));
        return;
    }
    if (fstatvfs(fd, &sv) == 0) {
        uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
        char b[32];
        kvl_fmt_bytes(avail, b, sizeof(b));
        snprintf(fs, sizeof(fs), "%s free", b);
        kvl_check("file.dir", avail < size * 2 ? KVL_WARN : KVL_OKAY,
                  "the file system is nearly full: offload writes will fail with ENOSPC; free "
                  "space or use another directory", "%s: writable, %s", dir, fs);
    }
    int dfd = open(path, O_RDWR | O_DIRECT);
    if (dfd < 0)
        kvl_check("file.o_direct", KVL_WARN, "open KV files without O_DIRECT here (page cache), "
                  "or offload to a file system that takes it (ext4, xfs on NVMe)",
                  "%s refuses O_DIRECT: %s", dir, strerror(errno));
    else
        kvl_check("file.o_direct", KVL_OKAY, NULL, "%s takes O_DIRECT", dir);
    /* the smoke test: DRAM -> file -> DRAM through posix */
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a = NULL;
    kvl_dlist_t *l = NULL, *r = NULL;
    kvl_xfer_t *x = NULL;
    const char *step = "kvl_agent_create";
    int useful = dfd >= 0 ? dfd : fd;
    size_t len = (size_t)(size & ~4095ull) ? (size_t)(size & ~4095ull) : 4096; /* O_DIRECT */
    unsigned char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
    double t0 = 0, t1 = 0;
    int ok = 0;
    if (buf == MAP_FAILED) {
        buf = NULL;
        step = "allocate";
        goto out;
    }
    for (size_t i = 0; i < len; i++)
        buf[i] = (unsigned char)(i * 31 + 7);
    if (kvl_agent_create("doctor-file", &cfg, &a) != KVL_OK)
        goto out;
    step = "kvl_backend_create";
    if (kvl_backend_create(a, "posix", NULL, 0, NULL) != KVL_OK)
        goto out;
    step = "kvl_mem_register";
    kvl_mem_desc_t dm = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY}, df = {0, len, useful};
    kvl_reg_params_t pd = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_DRAM};
    kvl_reg_params_t pf = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    if (kvl_mem_register(a, &dm, 1, &pd, NULL) != KVL_OK ||
        kvl_mem_register(a, &df, 1, &pf, NULL) != KVL_OK)
        goto out;
    step = "kvl_xfer_create";
    if (kvl_dlist_create(KVL_MEM_DRAM, 1, &l) || kvl_dlist_create(KVL_MEM_FILE, 1, &r) ||
        kvl_dlist_add(l, dm.addr, len, KVL_DEV_ANY) || kvl_dlist_add(r, 0, len, useful))
        goto out;
    if (kvl_xfer_create(a, KVL_WRITE, l, "doctor-file", r, NULL, &x) != KVL_OK)
        goto out;
    step = "WRITE";
    t0 = kvl_cli_now();
    kvl_status_t xs = kvl_xfer_post(x);
    if ((xs != KVL_OK && xs != KVL_IN_PROGRESS) || kvl_xfer_wait(x, 60000) != KVL_OK)
        goto out;
    t1 = kvl_cli_now();
    kvl_xfer_release(x);
    x = NULL;
    memset(buf, 0, len);
    step = "READ";
    if (kvl_xfer_create(a, KVL_READ, l, "doctor-file", r, NULL, &x) != KVL_OK)
        goto out;
    xs = kvl_xfer_post(x);
    if ((xs != KVL_OK && xs != KVL_IN_PROGRESS) || kvl_xfer_wait(x, 60000) != KVL_OK)
        goto out;
    step = "verify";
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (unsigned char)(i * 31 + 7))
            goto out;
    ok = 1;
out:
    if (ok) {
        kvl_xfer_stats_t xst;
        char path_used[96] = "";
        if (kvl_xfer_get_stats(x, &xst) == KVL_OK)
            snprintf(path_used, sizeof(path_used), "%s", xst.path);
        kvl_check("smoke.posix.FILE", KVL_OKAY, NULL, "wrote %.1f MiB to a file in %s (%.2f GB/s) "
                  "and read it back over %s, verified", (double)len / 1048576.0, dir,
                  t1 > t0 ? (double)len / (t1 - t0) / 1e9 : 0.0, path_used);
    } else {
        char err[1024] = "";
        kvl_error_render(NULL, err, sizeof(err));
        kvl_check("smoke.posix.FILE", KVL_FAIL, "the step's error says why; fix that before "
                  "starting the engine", "%s failed: %s", step,
                  strcmp(step, "verify") == 0 ? "the bytes read back differ" : err);
    }
    if (x)
        kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
    if (buf)
        munmap(buf, len);
    if (dfd >= 0)
        close(dfd);
    close(fd);
    unlink(path);
}

static void kvl_smoke(kvl_mem_kind_t mem, int32_t dev, uint64_t size, const char *only)
{
    for (const char *const *n = kvl_backend_names(); *n; n++) {
        char reason[256];
        if (only && strcmp(only, *n) != 0)
            continue;
        if (kvl_backend_available(*n, reason, sizeof(reason)) != KVL_OK)
            continue;
        if (mem == KVL_MEM_DRAM && strcmp(*n, "cuda") == 0)
            continue; /* cuda's smoke test needs VRAM */
        if (mem == KVL_MEM_VRAM && strcmp(*n, "cuda") != 0)
            continue; /* ucx's GPU support is its probe's to report */
        if (strcmp(*n, "posix") == 0)
            continue; /* files, not a second agent: kvl_smoke_file */
        kvl_smoke_one(*n, mem, dev, size, 0);
        if (mem == KVL_MEM_DRAM && strcmp(*n, "shm") == 0)
            kvl_smoke_one(*n, mem, dev, size, 1);
    }
}

/* ---- output ---- */

static void kvl_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int kvl_doctor_output(void)
{
    static const char *const names[] = {"ok", "warn", "fail"};
    int worst = KVL_OKAY;
    for (size_t i = 0; i < kvl_rep.n; i++)
        if (kvl_rep.v[i].status > worst)
            worst = kvl_rep.v[i].status;
    if (kvl_rep.json) {
        printf("{\"version\":\"%s\",\"status\":\"%s\",\"exit_code\":%d,\"checks\":[", kvl_version(),
               names[worst], worst);
        for (size_t i = 0; i < kvl_rep.n; i++) {
            const kvl_check_t *c = &kvl_rep.v[i];
            printf("%s\n  {\"name\":", i ? "," : "");
            kvl_json_str(stdout, c->name);
            printf(",\"status\":\"%s\",\"observed\":", names[c->status]);
            kvl_json_str(stdout, c->observed);
            printf(",\"hint\":");
            kvl_json_str(stdout, c->hint);
            printf("}");
        }
        printf("\n]}\n");
        return worst;
    }
    int w = 10;
    for (size_t i = 0; i < kvl_rep.n; i++)
        if ((int)strlen(kvl_rep.v[i].name) > w)
            w = (int)strlen(kvl_rep.v[i].name);
    for (size_t i = 0; i < kvl_rep.n; i++) {
        const kvl_check_t *c = &kvl_rep.v[i];
        /* multi-line observations (a rendered kvlane error) stay under the column */
        printf("%-4s  %-*s  ", names[c->status], w, c->name);
        for (const char *o = c->observed; *o; o++) {
            putchar(*o);
            if (*o == '\n' && o[1])
                printf("      %-*s  ", w, "");
        }
        putchar('\n');
        if (c->hint[0])
            printf("      %-*s  fix: %s\n", w, "", c->hint);
    }
    size_t nw = 0, nf = 0;
    for (size_t i = 0; i < kvl_rep.n; i++)
        nw += kvl_rep.v[i].status == KVL_WARN, nf += kvl_rep.v[i].status == KVL_FAIL;
    printf("\n%zu checks: %zu ok, %zu warn, %zu fail -> exit %d (%s)\n", kvl_rep.n, kvl_rep.n - nw - nf,
           nw, nf, worst,
           worst == 0 ? "ready" : worst == 1 ? "works, with the warnings above"
                                            : "registration or transfers will fail");
    return worst;
}

static void kvl_doctor_usage(FILE *f)
{
    fprintf(f,
            "usage: kvlane doctor [options]\n"
            "  --json             machine-readable output (a `checks` array)\n"
            "  --mem KIND         memory the engine will register: DRAM (default) or VRAM\n"
            "  --device N         its device (CUDA ordinal as the engine sees it)\n"
            "  --size BYTES       how much it will register (checks limits, sizes the smoke test)\n"
            "  --peer HOST:PORT   check that a peer's agent listener is reachable\n"
            "  --etcd URLS        check etcd endpoints (default: $NIXL_ETCD_ENDPOINTS when set;\n"
            "                     namespace $NIXL_ETCD_NAMESPACE, credentials $KVL_ETCD_USER and\n"
            "                     $KVL_ETCD_PASSWORD; TLS files $KVL_ETCD_CACERT, $KVL_ETCD_CERT,\n"
            "                     $KVL_ETCD_KEY, else etcdctl's $ETCDCTL_CACERT, $ETCDCTL_CERT,\n"
            "                     $ETCDCTL_KEY)\n"
            "  --etcd-cacert FILE, --etcd-cert FILE, --etcd-key FILE\n"
            "                     TLS to etcd: the CA of its server certificates, a client\n"
            "                     certificate and its key (etcd --client-cert-auth);\n"
            "                     KVL_ETCD_TLS_VERIFY_NAME=0: do not check the server's name\n"
            "  --backend NAME     smoke-test only this backend\n"
            "  --dir DIR          where the engine offloads KV files (default $TMPDIR or /tmp):\n"
            "                     writable, free space, O_DIRECT, a posix write/read smoke test\n"
            "  --no-smoke         skip the register/transfer smoke tests\n"
            "exit code: 0 all ok, 1 warnings only, 2 a failure that breaks registration or "
            "transfers\n");
}

/* The first of two environment variables that is set and not empty. */
static const char *kvl_doctor_env2(const char *a, const char *b)
{
    const char *v = getenv(a);
    if (v == NULL || v[0] == '\0')
        v = getenv(b);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

int kvl_cli_doctor(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},      {"mem", required_argument, 0, 'm'},
        {"device", required_argument, 0, 'd'}, {"size", required_argument, 0, 's'},
        {"peer", required_argument, 0, 'p'}, {"backend", required_argument, 0, 'b'},
        {"no-smoke", no_argument, 0, 'n'},  {"help", no_argument, 0, 'h'},
        {"etcd", required_argument, 0, 'e'},
        {"etcd-cacert", required_argument, 0, 'A'},
        {"etcd-cert", required_argument, 0, 'C'},
        {"etcd-key", required_argument, 0, 'K'},
        {"dir", required_argument, 0, 'D'},
        {0, 0, 0, 0}};
    kvl_mem_kind_t mem = KVL_MEM_DRAM;
    int32_t dev = KVL_DEV_ANY;
    uint64_t size = 0;
    const char *peer = NULL, *only = NULL, *fdir = NULL, *etcd = getenv("NIXL_ETCD_ENDPOINTS");
    const char *tls_files[3] = {kvl_doctor_env2("KVL_ETCD_CACERT", "ETCDCTL_CACERT"),
                                kvl_doctor_env2("KVL_ETCD_CERT", "ETCDCTL_CERT"),
                                kvl_doctor_env2("KVL_ETCD_KEY", "ETCDCTL_KEY")};
    int smoke = 1, o, li = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        switch (o) {
        case 'j': kvl_rep.json = 1; break;
        case 'm':
            if (kvl_mem_kind_parse(optarg, &mem) != KVL_OK || mem == KVL_MEM_AUTO ||
                mem == KVL_MEM_FILE) {
                fprintf(stderr, "kvlane doctor: --mem takes DRAM or VRAM\n");
                return 2;
            }
            break;
        case 'd': {
            /* a CUDA ordinal: digits only (strtol read "abc" as 0, "-3" as -3) */
            uint64_t d;
            if (kvl_cli_parse_uint(optarg, 4095, &d) != 0) {
                fprintf(stderr, "kvlane doctor: bad --device '%s' (a CUDA ordinal as the engine "
                                "sees it: 0, 1, ...)\n", optarg);
                return 2;
            }
            dev = (int32_t)d;
            break;
        }
        case 's':
            if (kvl_cli_parse_size(optarg, &size) != 0) {
                fprintf(stderr, "kvlane doctor: bad --size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'p': peer = optarg; break;
        case 'e': etcd = optarg; break;
        case 'A': tls_files[0] = optarg; break;
        case 'C': tls_files[1] = optarg; break;
        case 'K': tls_files[2] = optarg; break;
        case 'b': {
            const char *const *n = kvl_backend_names();
            while (*n != NULL && strcmp(*n, optarg) != 0)
                n++;
            if (*n == NULL) { /* a name that matches nothing would smoke-test nothing */
                fprintf(stderr, "kvlane doctor: unknown backend '%s' for --backend (known:",
                        optarg);
                for (n = kvl_backend_names(); *n != NULL; n++)
                    fprintf(stderr, " %s", *n);
                fprintf(stderr, ")\n");
                return 2;
            }
            only = optarg;
            break;
        }
        case 'n': smoke = 0; break;
        case 'D': fdir = optarg; break;
        case 'h': kvl_doctor_usage(stdout); return 0;
        default: kvl_doctor_usage(stderr); return 2;
        }
    }
    kvl_log_set_level(KVL_LOG_OFF); /* findings go into the report, not stderr */
    kvl_check_host();
    kvl_check_memlock(size, mem);
    kvl_check_shm(size);
    kvl_check_cma();
    kvl_check_net();
    if (peer)
        kvl_check_peer(peer);
    if (etcd != NULL && etcd[0] != '\0') {
        kvl_etcd_config_t ec = {.endpoints = etcd, .prefix = getenv("NIXL_ETCD_NAMESPACE"),
                                .user = getenv("KVL_ETCD_USER"),
                                .password = getenv("KVL_ETCD_PASSWORD")};
        const char *vn = getenv("KVL_ETCD_TLS_VERIFY_NAME");
        kvl_etcd_tls_t tls = {.field_mask = KVL_ETCD_TLS_CA_FILE | KVL_ETCD_TLS_CERT_FILE |
                                            KVL_ETCD_TLS_KEY_FILE | KVL_ETCD_TLS_VERIFY_NAME,
                              .ca_file = tls_files[0], .cert_file = tls_files[1],
                              .key_file = tls_files[2],
                              .verify_name = !(vn != NULL && strcmp(vn, "0") == 0)};
        (void)kvl_etcd_probe_tls(&ec, &tls, kvl_probe_cb, (void *)"etcd");
    }
    kvl_check_container(mem == KVL_MEM_VRAM);
    kvl_check_rdma();
    if (mem == KVL_MEM_VRAM && !kvl_check_vram(dev))
        smoke = 0; /* nothing can allocate or register VRAM: vram.backend says why */
    kvl_check_backends(mem, dev, size);
    if (smoke) {
        uint64_t ssz = size ? (size < (256ull << 20) ? size : 256ull << 20) : (16ull << 20);
        kvl_smoke(mem, dev, ssz, only);
        if (mem == KVL_MEM_DRAM && (only == NULL || strcmp(only, "posix") == 0) &&
            kvl_backend_available("posix", NULL, 0) == KVL_OK) {
            const char *t = getenv("TMPDIR");
            kvl_smoke_file(fdir ? fdir : t && t[0] ? t : "/tmp", ssz);
        }
    }
    int rc = kvl_doctor_output();
    free(kvl_rep.v);
    return rc;
}
