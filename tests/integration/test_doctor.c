/*
 * kvlane doctor finds injected faults and exits with the right code:
 * a clean run, a locked-memory limit below the planned registration (and
 * the same limit with CAP_IPC_LOCK, which lifts it), an
 * unreachable peer, and cross-memory attach forbidden by a seccomp filter
 * (as Docker's default profile does without CAP_SYS_PTRACE) - where the shm
 * smoke test must still pass over the socket fallback.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"

static char out[1 << 16];

/* Run `kvlane doctor args...` with a fault set up in the child; returns
 * the exit code, output in out. */
static int doctor(int fault, const char *const *args)
{
    const char *bin = getenv("KVL_BIN");
    int p[2];
    KT_CHECK(bin != NULL && pipe(p) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        if (fault == 1 || fault == 3) {
            struct rlimit rl = {64 << 10, 64 << 10};
            setrlimit(RLIMIT_MEMLOCK, &rl);
            /* CAP_IPC_LOCK lifts the limit: drop it (root keeps it across exec
             * only through the bounding set) unless the case wants it */
            if (fault == 1)
                prctl(PR_CAPBSET_DROP, 14 /* CAP_IPC_LOCK */, 0, 0, 0);
        } else if (fault == 2) {
            struct sock_filter f[] = {
                BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 2, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 1, 0),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
                BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
            };
            struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
                _exit(99);
        }
        const char *argv[16] = {bin, "doctor"};
        int n = 2;
        for (; args[n - 2] && n < 15; n++)
            argv[n] = args[n - 2];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(98);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while ((r = read(p[0], out + len, sizeof(out) - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = 0;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    printf("---- doctor (fault %d) exit %d\n%s", fault, WEXITSTATUS(st), out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int has_line(const char *status, const char *check, const char *needle)
{
    for (char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        char line[2048];
        size_t n = strcspn(l, "\n");
        if (n >= sizeof(line))
            n = sizeof(line) - 1;
        memcpy(line, l, n);
        line[n] = 0;
        if (strncmp(line, status, strlen(status)) == 0 && strstr(line, check) &&
            (needle == NULL || strstr(line, needle)))
            return 1;
    }
    return 0;
}

int main(void)
{
    const char *clean[] = {"--json", NULL};
    int rc = doctor(0, clean);
    KT_CHECK(rc == 0 || rc == 1);
    KT_CHECK(strstr(out, "\"checks\":[") != NULL);
    KT_CHECK(strstr(out, "\"name\":\"smoke.shm.DRAM\",\"status\":\"ok\"") != NULL);
    KT_CHECK(strstr(out, "\"name\":\"smoke.shm.DRAM.shareable\",\"status\":\"ok\"") != NULL);
    /* the JSON parses */
    FILE *py = popen("python3 -c 'import json,sys; d=json.load(sys.stdin); "
                     "assert all(set(c)=={\"name\",\"status\",\"observed\",\"hint\"} for c in d[\"checks\"])'",
                     "w");
    KT_CHECK(py != NULL);
    fputs(out, py);
    KT_CHECK(pclose(py) == 0);

    const char *mem[] = {"--size", "1G", "--no-smoke", NULL};
    rc = doctor(1, mem);
    KT_CHECK(rc == 2);
    KT_CHECK(has_line("fail", "limits.memlock", "64 KiB < planned registration 1.0 GiB"));
    KT_CHECK(strstr(out, "ulimit -l unlimited") != NULL);

    /* with CAP_IPC_LOCK (root in a container with IPC_LOCK) the limit does not bind */
    FILE *st = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long capeff = 0;
    while (st && fgets(line, sizeof(line), st))
        if (strncmp(line, "CapEff:", 7) == 0)
            capeff = strtoull(line + 7, NULL, 16);
    if (st)
        fclose(st);
    if (capeff & (1ull << 14)) {
        rc = doctor(3, mem);
        KT_CHECK(has_line("ok", "limits.memlock", "but CAP_IPC_LOCK is effective"));
    }

    /* /dev/shm is compared with the planned size (issue 17 item 7) */
    const char *huge[] = {"--size", "1000000G", "--no-smoke", NULL};
    rc = doctor(0, huge);
    KT_CHECK(has_line("warn", "limits.dev_shm", "free < planned 1000000.0 GiB"));

    const char *peer[] = {"--peer", "127.0.0.1:1", "--no-smoke", NULL};
    rc = doctor(0, peer);
    KT_CHECK(rc == 2);
    KT_CHECK(has_line("fail", "net.peer", "Connection refused"));

    const char *cma[] = {"--backend", "shm", NULL};
    rc = doctor(2, cma);
    KT_CHECK(rc == 1);
    KT_CHECK(has_line("warn", "cma.process_vm_readv", "Operation not permitted"));
    KT_CHECK(strstr(out, "seccomp") != NULL);
    /* the fallback really moves the bytes */
    KT_CHECK(has_line("ok", "smoke.shm.DRAM ", "path socket"));
    printf("doctor: every injected fault found\n");
    return 0;
}
