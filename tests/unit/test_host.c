/* The host-memory check registration runs on every DRAM range
 * (src/common/host.c). Where the kernel has PROCMAP_QUERY (Linux 6.11),
 * anonymous mappings are looked up: every page of a range is covered. For
 * file mappings, and on older kernels: mapped (msync over runs of touching
 * ranges) and readable at both ends (one-byte probes written to a pipe, or
 * read with process_vm_readv where no pipe can be made). Checked on pages
 * made unreadable and unmapped on purpose, on more pages than one probe
 * call takes, on a list spread over more mappings than the queries take,
 * on a file mapping that runs past its file, in a forked child that
 * unmapped what its parent still has, after the descriptor kvlane holds
 * (and the probe pipe) was closed and its number reused behind its back,
 * in children under a seccomp filter that refuses process_vm_readv or the
 * query's ioctl, and without file descriptors, and through
 * kvl_mem_register on a 1,000-region list. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include "common/kvltest.h"
#include "common/host.h"

static long pg;
static char *base; /* 8 pages: 3 unreadable, 6 unmapped */
static int byquery; /* PROCMAP_QUERY answers (else the probes) */

static uint64_t at(size_t page, size_t off)
{
    return (uint64_t)(uintptr_t)(base + page * (size_t)pg + off);
}

static void layout(void)
{
    pg = sysconf(_SC_PAGESIZE);
    base = mmap(NULL, 8 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                0);
    KT_CHECK(base != MAP_FAILED);
    memset(base, 7, 8 * (size_t)pg);
    KT_CHECK(mprotect(base + 3 * pg, (size_t)pg, PROT_NONE) == 0);
    KT_CHECK(munmap(base + 6 * pg, (size_t)pg) == 0);
}

/* Where a range with an unreadable page fails: the first byte that cannot
 * be read (queries), or the end byte that does not read (probes). */
static uint64_t bad_byte(uint64_t first, uint64_t end)
{
    return byquery ? first : end;
}

static void ranges(void)
{
    byquery = kvli_host_maps_query_available();
    printf("pid %d: checks by %s\n", (int)getpid(),
           byquery ? "PROCMAP_QUERY" : "msync and probes");
    fflush(stdout);
    kvli_host_range_t r[] = {
        {at(0, 0), 2 * (uint64_t)pg, -1, 1},   /* 0 ok */
        {at(2, 100), 200, -1, 1},              /* 1 ok, touches 0 */
        {at(3, 0), 10, -1, 1},                 /* 2 unreadable first byte */
        {at(2, 0), 2 * (uint64_t)pg, -1, 1},   /* 3 unreadable last byte */
        {at(5, 0), 2 * (uint64_t)pg, -1, 1},   /* 4 a hole (page 6) */
        {at(7, 1), 17, -1, 1},                 /* 5 ok, after the hole */
        {at(1, 0), 0, -1, 1},                  /* 6 empty */
        {at(4, 0), (uint64_t)pg, -1, 1},       /* 7 ok, between 3 and the hole */
    };
    kvli_host_readable_many(r, sizeof(r) / sizeof(r[0]));
    KT_CHECK(r[0].err == 0 && r[1].err == 0 && r[5].err == 0 && r[7].err == 0);
    KT_CHECK(r[2].err == EFAULT && r[2].bad == at(3, 0));
    KT_CHECK(r[3].err == EFAULT && r[3].bad == bad_byte(at(3, 0), at(3, (size_t)pg - 1)));
    KT_CHECK(r[4].err == ENOMEM);
    KT_CHECK(r[6].err == ENOMEM);

    /* One range: the same answers. */
    uint64_t bad = 0;
    KT_CHECK(kvli_host_readable(at(0, 5), 100, &bad) == 0);
    KT_CHECK(kvli_host_readable(at(2, 5), (uint64_t)pg, &bad) == EFAULT &&
             bad == bad_byte(at(3, 0), at(3, 4)));
    KT_CHECK(kvli_host_readable(at(6, 0), 1, &bad) == ENOMEM);
    /* ends readable in pages 5 and 7, page 6 unmapped between: not one
     * probe of the two ends (they are not in adjacent pages) */
    KT_CHECK(kvli_host_readable(at(5, 0), 3 * (uint64_t)pg, &bad) == ENOMEM);
    KT_CHECK(kvli_host_readable(at(5, 0), 2 * (uint64_t)pg, &bad) == ENOMEM); /* page 6 */
    /* past two pages: msync and the two end bytes, no probe table */
    KT_CHECK(kvli_host_readable(at(0, 1), 3 * (uint64_t)pg - 2, &bad) == 0);
    bad = 0;
    KT_CHECK(kvli_host_readable(at(0, 0), 4 * (uint64_t)pg, &bad) == EFAULT &&
             bad == bad_byte(at(3, 0), at(3, (size_t)pg - 1)));
    KT_CHECK(kvli_host_readable(at(4, 0), 3 * (uint64_t)pg, &bad) == ENOMEM);
    /* pages 2 to 4: both ends read, the middle page does not; the queries
     * see it, the probes of the ends cannot */
    bad = 0;
    int mid = kvli_host_readable(at(2, 0), 3 * (uint64_t)pg, &bad);
    KT_CHECK(byquery ? mid == EFAULT && bad == at(3, 0) : mid == 0);

    /* Single probes leave their bytes in the pipe until 4 KiB gather:
     * thousands of them, with failures among them, keep their answers. */
    for (int i = 0; i < 20000; i++) {
        if (i % 997 == 5)
            KT_CHECK(kvli_host_readable(at(3, (size_t)i % 64), 1, &bad) == EFAULT &&
                     bad == at(3, (size_t)i % 64));
        else if (i % 997 == 9)
            KT_CHECK(kvli_host_readable(at(6, 0), 8, &bad) == ENOMEM);
        else
            KT_CHECK(kvli_host_readable(at((size_t)i % 3, (size_t)i % 100), 1 + (uint64_t)i % 3000,
                                        &bad) == 0);
    }

    /* 1,500 one-byte ranges (three process_vm_readv calls): only the one
     * in the unreadable page fails, wherever it falls. */
    enum { N = 1500 };
    static kvli_host_range_t many[N];
    for (size_t bad_at = 0; bad_at < N; bad_at += 511) {
        for (size_t i = 0; i < N; i++)
            many[i] = (kvli_host_range_t){i == bad_at ? at(3, i % 64) : at(i % 3, i), 1, -1, 0};
        kvli_host_readable_many(many, N);
        for (size_t i = 0; i < N; i++)
            KT_CHECK(i == bad_at ? many[i].err == EFAULT && many[i].bad == at(3, i % 64)
                                 : many[i].err == 0);
    }
}

/* More distinct pages than one process_vm_readv call probes (1,024): the
 * unreadable page is found in a later call, its neighbours pass. */
static void many_pages(void)
{
    enum { NP = 2600, BAD = 1500 };
    char *m = mmap(NULL, (size_t)NP * (size_t)pg, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(m != MAP_FAILED);
    KT_CHECK(mprotect(m + (size_t)BAD * (size_t)pg, (size_t)pg, PROT_NONE) == 0);
    static kvli_host_range_t r[NP];
    for (size_t i = 0; i < NP; i++) /* in reverse address order */
        r[i] = (kvli_host_range_t){(uint64_t)(uintptr_t)(m + (NP - 1 - i) * (size_t)pg + 8),
                                   (uint64_t)pg - 16, -1, 0};
    kvli_host_readable_many(r, NP);
    for (size_t i = 0; i < NP; i++)
        KT_CHECK(NP - 1 - i == BAD ? r[i].err == EFAULT && r[i].bad == r[i].addr
                                   : r[i].err == 0);
    munmap(m, (size_t)NP * (size_t)pg);
}

/* A list whose ranges lie in 150 mappings (neighbouring pages alternate
 * between read-only and read-write, so no two merge): the first 64 are
 * looked up, the rest go to the probes; one unreadable page among the
 * probed ones fails alone. */
static void many_mappings(void)
{
    enum { NM = 150, BAD = 140 };
    char *m = mmap(NULL, (size_t)NM * (size_t)pg, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(m != MAP_FAILED);
    memset(m, 1, (size_t)NM * (size_t)pg);
    for (size_t i = 1; i < NM; i += 2)
        KT_CHECK(mprotect(m + i * (size_t)pg, (size_t)pg, PROT_READ) == 0);
    KT_CHECK(mprotect(m + (size_t)BAD * (size_t)pg, (size_t)pg, PROT_NONE) == 0);
    static kvli_host_range_t r[NM];
    for (size_t i = 0; i < NM; i++)
        r[i] = (kvli_host_range_t){(uint64_t)(uintptr_t)(m + i * (size_t)pg + 16),
                                   (uint64_t)pg - 32, -1, 0};
    kvli_host_readable_many(r, NM);
    for (size_t i = 0; i < NM; i++)
        KT_CHECK(i == BAD ? r[i].err == EFAULT && r[i].bad == r[i].addr : r[i].err == 0);
    munmap(m, (size_t)NM * (size_t)pg);
}

/* A file mapping of two pages over a one-page file: the second page is
 * mapped and readable as far as the mapping says, but reading it faults
 * (SIGBUS): file mappings go to the probes, whose read of the end byte
 * fails. */
static void file_past_end(void)
{
    int fd = memfd_create("kvl-test-host", MFD_CLOEXEC);
    KT_CHECK(fd >= 0 && ftruncate(fd, pg) == 0);
    char *m = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    KT_CHECK(m != MAP_FAILED);
    uint64_t bad = 0, a = (uint64_t)(uintptr_t)m;
    KT_CHECK(kvli_host_readable(a + 8, (uint64_t)pg - 8, &bad) == 0);
    KT_CHECK(kvli_host_readable(a + 8, (uint64_t)pg, &bad) == EFAULT &&
             bad == a + (uint64_t)pg + 7);
    munmap(m, 2 * (size_t)pg);
    close(fd);
}

/* The same checks where a system call is refused, as a container's seccomp
 * profile may: process_vm_readv (EPERM: the pipe probes answer), or ioctl
 * (ENOTTY, what a kernel before 6.11 answers PROCMAP_QUERY: msync and the
 * probes answer). */
static int seccomp_refuse(int nr, int eno, const char *what)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)eno & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        printf("seccomp filter refusing %s not installed (errno %d): not checked\n", what, errno);
        return 0;
    }
    return 1;
}

static int seccomp_child(void)
{
    if (!seccomp_refuse(__NR_process_vm_readv, EPERM, "process_vm_readv"))
        return 0;
    char c;
    struct iovec l = {&c, 1}, rv = {base, 1};
    KT_CHECK(process_vm_readv(getpid(), &l, 1, &rv, 1, 0) < 0 && errno == EPERM);
    ranges();
    many_pages();
    return 0;
}

static int no_query_child(void)
{
    if (!seccomp_refuse(__NR_ioctl, ENOTTY, "ioctl"))
        return 0;
    KT_CHECK(!kvli_host_maps_query_available());
    ranges();
    many_pages();
    many_mappings();
    file_past_end();
    return 0;
}

/* The number of the descriptor kvlane holds on this process's
 * /proc/<pid>/maps, or -1. */
static int maps_fd(void)
{
    char want[64], path[64], got[64];
    snprintf(want, sizeof(want), "/proc/%d/maps", (int)getpid());
    for (int fd = 0; fd < 1024; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, got, sizeof(got) - 1);
        if (n > 0 && (size_t)n == strlen(want) && memcmp(got, want, (size_t)n) == 0)
            return fd;
    }
    return -1;
}

/* The descriptor closed behind kvlane's back and its number taken by a
 * pipe: kvlane answers by the probes, lets the number go without closing
 * it (the pipe stays open), and opens a new descriptor next time. */
static int lost_fd_child(void)
{
    if (!kvli_host_maps_query_available()) {
        printf("no PROCMAP_QUERY here: a lost descriptor not checked\n");
        return 0;
    }
    int fd = maps_fd(), p[2];
    KT_CHECK(fd >= 0 && pipe(p) == 0 && dup2(p[0], fd) == fd);
    uint64_t bad = 0;
    KT_CHECK(kvli_host_readable(at(0, 5), 100, &bad) == 0);
    KT_CHECK(kvli_host_readable(at(6, 0), 8, &bad) == ENOMEM);
    struct stat was, is;
    KT_CHECK(fstat(p[0], &was) == 0 && fstat(fd, &is) == 0 && was.st_ino == is.st_ino);
    KT_CHECK(kvli_host_maps_query_available());
    KT_CHECK(maps_fd() >= 0 && maps_fd() != fd);
    ranges();
    return 0;
}

/* The child closes the probe pipe it inherited and its numbers go to
 * files of its own: kvlane's first probe in the child makes a new pipe and
 * leaves those files open. */
static int reused_pipe_child(void)
{
    int reused[4], n = 0, dn = open("/dev/null", O_RDONLY | O_CLOEXEC);
    char path[64], got[64];
    KT_CHECK(dn >= 0);
    for (int fd = 3; fd < 1024 && n < 4; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t k = readlink(path, got, sizeof(got) - 1);
        if (k > 5 && memcmp(got, "pipe:", 5) == 0) {
            KT_CHECK(dup2(dn, fd) == fd); /* closes the pipe end, takes its number */
            reused[n++] = fd;
        }
    }
    if (n == 0) {
        printf("no inherited probe pipe: not checked\n");
        return 0;
    }
    file_past_end(); /* the probes of a file mapping */
    struct stat st, null;
    KT_CHECK(stat("/dev/null", &null) == 0);
    for (int i = 0; i < n; i++)
        KT_CHECK(fstat(reused[i], &st) == 0 && st.st_rdev == null.st_rdev);
    return 0;
}

/* A forked child inherits its parent's /proc/self/maps descriptor, which
 * describes the parent: the child must look at its own mappings. It
 * unmaps pages 0 to 2, which the parent keeps; its checks find the hole,
 * and a mapping only the child has passes. */
static int forked_child(void)
{
    KT_CHECK(munmap(base, 3 * (size_t)pg) == 0);
    uint64_t bad = 0;
    KT_CHECK(kvli_host_readable(at(0, 5), 100, &bad) == ENOMEM);
    KT_CHECK(kvli_host_readable(at(1, 0), 3 * (uint64_t)pg, &bad) == ENOMEM);
    KT_CHECK(kvli_host_readable(at(4, 0), (uint64_t)pg, &bad) == 0);
    char *own = mmap(NULL, 4 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    KT_CHECK(own != MAP_FAILED);
    KT_CHECK(kvli_host_readable((uint64_t)(uintptr_t)own + 1, 4 * (uint64_t)pg - 2, &bad) == 0);
    return 0;
}

/* No descriptor left for a pipe (RLIMIT_NOFILE): process_vm_readv answers.
 * The child also drops the pipe it inherited. */
static int nofile_child(void)
{
    struct rlimit rl = {3, 3};
    KT_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    int fds[2];
    KT_CHECK(pipe(fds) != 0 && errno == EMFILE);
    ranges();
    many_pages();
    return 0;
}

static void in_child(int (*fn)(void))
{
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0)
        _exit(fn());
    int ws;
    KT_CHECK(waitpid(pid, &ws, 0) == pid);
    KT_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

static void through_registration(void)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = "shm"};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create("host-check", &cfg, &a));
    enum { N = 1000 };
    static kvl_mem_desc_t d[N];
    static char buf[N * 64];
    for (size_t i = 0; i < N; i++)
        d[i] = (kvl_mem_desc_t){(uint64_t)(uintptr_t)(buf + i * 64), 64, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, d, N, NULL, NULL));
    KT_OK(kvl_mem_deregister(a, d, N));
    d[700] = (kvl_mem_desc_t){at(3, 8), 64, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, d, N, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("region 700 of 1000");
    KT_ERROR_HAS("is mapped in this process but");
    KT_ERROR_HAS("cannot be read");
    d[700] = (kvl_mem_desc_t){at(6, 8), 64, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, d, N, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("region 700 of 1000");
    KT_ERROR_HAS("the range is not (fully) mapped in this process");
    /* Nothing stayed registered: the whole list registers again. */
    d[700] = (kvl_mem_desc_t){(uint64_t)(uintptr_t)(buf + 700 * 64), 64, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, d, N, NULL, NULL));
    KT_OK(kvl_mem_deregister(a, d, N));
    kvl_agent_destroy(a);
}

int main(void)
{
    layout();
    ranges();
    many_pages();
    many_mappings();
    file_past_end();
    through_registration();
    in_child(forked_child);
    /* the parent's view is its own again: pages 0 to 2 are still here */
    uint64_t bad = 0;
    KT_CHECK(kvli_host_readable(at(0, 5), 3 * (uint64_t)pg - 10, &bad) == 0);
    in_child(lost_fd_child);
    in_child(reused_pipe_child);
    in_child(seccomp_child);
    in_child(no_query_child);
    in_child(nofile_child);
    printf("ok\n");
    return 0;
}
