/* A real etcd for tests (see kt_etcd.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "kt_etcd.h"
#include "kvltest.h"

const char *kt_etcd_binary(void)
{
    const char *env = getenv("KVL_ETCD_BIN");
    if (env != NULL && access(env, X_OK) == 0)
        return env;
    return access("/usr/bin/etcd", X_OK) == 0 ? "/usr/bin/etcd" : NULL;
}

unsigned kt_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    KT_CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    close(fd);
    return ntohs(sa.sin_port);
}

int kt_tls_certs(const char *dir)
{
    const char *src = getenv("KVL_SRC") ? getenv("KVL_SRC") : ".";
    return kt_sh("bash '%s/tests/common/kt_tls_certs.sh' '%s'", src, dir);
}

/* etcdctl's TLS flags for e ("" without TLS). */
static void kt_etcd_tls_flags(const kt_etcd_t *e, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (e->tls_dir != NULL)
        snprintf(buf, cap, "--cacert=%s/ca.crt --cert=%s/client.crt --key=%s/client.key",
                 e->tls_dir, e->tls_dir, e->tls_dir);
}

/* GET /health answers {"health":"true"...}. */
static int kt_etcd_healthy(const kt_etcd_t *e)
{
    if (e->tls_dir != NULL) {
        char fl[600];
        kt_etcd_tls_flags(e, fl, sizeof(fl));
        return kt_sh("ETCDCTL_API=3 etcdctl --endpoints=%s %s --dial-timeout=1s "
                     "--command-timeout=2s endpoint health >/dev/null 2>&1", e->url, fl) == 0;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)e->client_port)};
    inet_pton(AF_INET, e->host ? e->host : "127.0.0.1", &sa.sin_addr);
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int ok = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        const char *req = "GET /health HTTP/1.0\r\n\r\n";
        char buf[1024];
        size_t n = 0;
        ssize_t r;
        if (write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
            while (n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
                n += (size_t)r;
            buf[n] = '\0';
            ok = strstr(buf, "\"true\"") != NULL;
        }
    }
    close(fd);
    return ok;
}

static void kt_etcd_spawn(kt_etcd_t *e)
{
    char curl[64], purl[64], cluster[128], log[200];
    const char *host = e->host ? e->host : "127.0.0.1";
    snprintf(curl, sizeof(curl), "%s://%s:%u", e->tls_dir ? "https" : "http", host,
             e->client_port);
    snprintf(purl, sizeof(purl), "http://%s:%u", host, e->peer_port);
    snprintf(cluster, sizeof(cluster), "kt=%s", purl);
    snprintf(log, sizeof(log), "%s/etcd.log", e->dir);
    snprintf(e->url, sizeof(e->url), "%s", curl);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        dup2(2, 1);
        char data[160];
        snprintf(data, sizeof(data), "%s/data", e->dir);
        if (e->tls_dir != NULL) {
            char crt[200], key[200], ca[200];
            snprintf(crt, sizeof(crt), "%s/server.crt", e->tls_dir);
            snprintf(key, sizeof(key), "%s/server.key", e->tls_dir);
            snprintf(ca, sizeof(ca), "%s/ca.crt", e->tls_dir);
            execl(kt_etcd_binary(), "etcd", "--name", "kt", "--data-dir", data,
                  "--listen-client-urls", curl, "--advertise-client-urls", curl,
                  "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                  "--initial-cluster", cluster, "--log-level", "warn", "--cert-file", crt,
                  "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
                  (char *)NULL);
            _exit(127);
        }
        execl(kt_etcd_binary(), "etcd", "--name", "kt", "--data-dir", data,
              "--listen-client-urls", curl, "--advertise-client-urls", curl,
              "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
              "--initial-cluster", cluster, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    e->pid = pid;
    for (int i = 0; i < 300; i++) { /* 30 s: never hangs */
        if (kt_etcd_healthy(e))
            return;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "etcd exited at start (see %s)\n", log);
            e->pid = 0;
            KT_CHECK(!"etcd started");
        }
        usleep(100000);
    }
    fprintf(stderr, "etcd did not answer /health in 30 s (see %s)\n", log);
    KT_CHECK(!"etcd answers");
}

/* A failing check exits the test: etcd must not outlive it. */
static kt_etcd_t *kt_etcd_live;
static pid_t kt_etcd_owner;

static void kt_etcd_atexit(void)
{
    if (kt_etcd_live != NULL && getpid() == kt_etcd_owner)
        kt_etcd_stop(kt_etcd_live);
}

void kt_etcd_start(kt_etcd_t *e)
{
    if (kt_etcd_live == NULL) {
        kt_etcd_owner = getpid();
        atexit(kt_etcd_atexit);
    }
    kt_etcd_live = e;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(e->dir, sizeof(e->dir), "%s/kvl-etcd-XXXXXX", base);
    KT_CHECK(mkdtemp(e->dir) != NULL);
    e->client_port = kt_free_port();
    do
        e->peer_port = kt_free_port();
    while (e->peer_port == e->client_port);
    kt_etcd_spawn(e);
}

void kt_etcd_restart(kt_etcd_t *e)
{
    kt_etcd_spawn(e);
}

void kt_etcd_kill(kt_etcd_t *e)
{
    if (e->pid > 0) {
        kill(e->pid, SIGCONT);
        kill(e->pid, SIGKILL);
        waitpid(e->pid, NULL, 0);
        e->pid = 0;
    }
}

void kt_etcd_pause(kt_etcd_t *e, int paused)
{
    if (e->pid > 0)
        kill(e->pid, paused ? SIGSTOP : SIGCONT);
}

void kt_etcd_stop(kt_etcd_t *e)
{
    char cmd[200];
    if (kt_etcd_live == e)
        kt_etcd_live = NULL;
    kt_etcd_kill(e);
    if (e->dir[0] == '/' && strstr(e->dir, "kvl-etcd-") != NULL) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", e->dir);
    }
}

int kt_etcdctl(const kt_etcd_t *e, const char *args)
{
    char cmd[1600], fl[600];
    kt_etcd_tls_flags(e, fl, sizeof(fl));
    snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s %s --dial-timeout=5s "
             "--command-timeout=10s %s >>'%s/etcdctl.log' 2>&1", e->url, fl, args, e->dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int kt_etcd_get(const kt_etcd_t *e, const char *key, int json, char *out, size_t cap)
{
    char cmd[1600], fl[600];
    kt_etcd_tls_flags(e, fl, sizeof(fl));
    snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s %s --dial-timeout=5s "
             "--command-timeout=10s get %s '%s' 2>>'%s/etcdctl.log'", e->url, fl,
             json ? "-w json" : "--print-value-only", key, e->dir);
    FILE *f = popen(cmd, "r");
    if (f == NULL || cap == 0)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    int st = pclose(f);
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        out[--n] = '\0';
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && n > 0 ? 0 : -1;
}

int kt_etcd_compact(const kt_etcd_t *e)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rev=$(ETCDCTL_API=3 etcdctl --endpoints=%s --dial-timeout=5s "
             "--command-timeout=10s put /kt-compact-mark x -w json | sed -n "
             "'s/.*\"revision\":\\([0-9]*\\).*/\\1/p') && [ -n \"$rev\" ] && "
             "ETCDCTL_API=3 etcdctl --endpoints=%s --dial-timeout=5s --command-timeout=10s "
             "compact \"$rev\" >>'%s/etcdctl.log' 2>&1", e->url, e->url, e->dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
