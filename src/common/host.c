/* Facts about this host and process (see host.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include "errname.h"
#include "host.h"

static void kvli_host_bytes(uint64_t v, char *buf, size_t cap)
{
    if (v >= (1ull << 30))
        snprintf(buf, cap, "%.1f GiB", (double)v / (1ull << 30));
    else
        snprintf(buf, cap, "%.1f MiB", (double)v / (1ull << 20));
}

int kvli_host_dev_shm_size(uint64_t *total_p, uint64_t *avail_p)
{
    struct statvfs sv;
    if (statvfs("/dev/shm", &sv) != 0)
        return errno;
    *total_p = (uint64_t)sv.f_blocks * sv.f_frsize;
    *avail_p = (uint64_t)sv.f_bavail * sv.f_frsize;
    return 0;
}

void kvli_host_dev_shm(char *buf, size_t cap)
{
    uint64_t total = 0, avail = 0;
    char tot[32], fr[32];
    int e = kvli_host_dev_shm_size(&total, &avail);
    if (e != 0) {
        snprintf(buf, cap, "/dev/shm: statvfs = -1 %s (%s)", kvli_errno_name(e), strerror(e));
        return;
    }
    kvli_host_bytes(total, tot, sizeof(tot));
    kvli_host_bytes(avail, fr, sizeof(fr));
    snprintf(buf, cap, "/dev/shm: %s, %s free", tot, fr);
}

/* getpid() without a system call: cached, and refreshed in a fork's child. */
static pid_t kvli_host_pid_cached;
static pthread_once_t kvli_host_pid_once = PTHREAD_ONCE_INIT;

static void kvli_host_pid_refresh(void)
{
    kvli_host_pid_cached = getpid();
}

static void kvli_host_pid_init(void)
{
    kvli_host_pid_refresh();
    (void)pthread_atfork(NULL, NULL, kvli_host_pid_refresh);
}

static pid_t kvli_host_pid(void)
{
    pthread_once(&kvli_host_pid_once, kvli_host_pid_init);
    return kvli_host_pid_cached;
}

/*
 * Probes of readability: writev(2) copies one-byte iovecs into a pipe, and
 * fails with EFAULT (writing nothing) when one cannot be read: no fault is
 * ever taken. The pipe is this process's (a forked child makes its own) and
 * non-blocking; at most 1,024 bytes per call, below PIPE_BUF, so writers
 * never interleave. It is emptied when 4 KiB have gathered (a pipe holds
 * at least one page, even one made past the user's pipe-buffer limit), and
 * at once after a failure: a registration pays one system call, not two.
 * 1: all readable; 0: at least one is not; -1: no pipe can be made (the
 * caller uses process_vm_readv).
 */
#define KVLI_HOST_PIPE_KEEP 4096u

/* Whether fd still names the file kvlane opened as (dev, ino): a forked
 * child closes a descriptor it inherited only then (it may have closed the
 * number and reused it for a file of its own). */
static bool kvli_host_fd_is(int fd, dev_t dev, ino_t ino)
{
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

static void kvli_host_pipe_drain(int fd)
{
    char sink[1024];
    while (read(fd, sink, sizeof(sink)) > 0)
        ;
}

static int kvli_host_pipe_probe(const struct iovec *iov, size_t n)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int fds[2] = {-1, -1};
    static pid_t owner = -1;
    static size_t held; /* bytes in the pipe */
    static dev_t dev;   /* the pipe's (both ends share them) */
    static ino_t ino;
    ssize_t w;
    int rc;
    if (n > 1024)
        return -1;
    pthread_mutex_lock(&lock);
    if (owner != kvli_host_pid()) {
        /* the parent's pipe, inherited: ours to close, unless the child
         * closed those numbers and reused them */
        struct stat st;
        for (int k = 0; k < 2; k++)
            if (kvli_host_fd_is(fds[k], dev, ino))
                close(fds[k]);
        int made = pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0;
        if (!made || fstat(fds[0], &st) != 0) {
            if (made) {
                close(fds[0]);
                close(fds[1]);
            }
            fds[0] = fds[1] = -1;
        } else {
            dev = st.st_dev;
            ino = st.st_ino;
        }
        owner = fds[0] >= 0 ? kvli_host_pid() : -1;
        held = 0;
    }
    if (fds[0] < 0) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    if (held + n > KVLI_HOST_PIPE_KEEP) {
        kvli_host_pipe_drain(fds[0]);
        held = 0;
    }
    w = writev(fds[1], iov, (int)n);
    rc = w == (ssize_t)n ? 1 : w < 0 && errno == EFAULT ? 0 : -1;
    if (rc == 1) {
        held += (size_t)w;
    } else {
        kvli_host_pipe_drain(fds[0]); /* whatever was written */
        held = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int kvli_host_msync(uint64_t addr, uint64_t len, uint64_t pg)
{
    uint64_t start = addr & ~(pg - 1);
    if (len == 0 || addr + len < addr)
        return ENOMEM;
    return msync((void *)(uintptr_t)start, (size_t)(addr + len - start), MS_ASYNC) == 0 ? 0
                                                                                        : ENOMEM;
}

typedef struct {
    uint64_t addr;
    size_t i;
} kvli_host_ord_t;

static int kvli_host_by_addr(const void *x, const void *y)
{
    uint64_t a = ((const kvli_host_ord_t *)x)->addr, b = ((const kvli_host_ord_t *)y)->addr;
    return a < b ? -1 : a > b;
}

/* msync over runs of ranges that touch or overlap (by page); a run that
 * fails is checked range by range to name the ranges with a hole. Returns
 * the ranges' order by address (malloc'ed), or NULL (one range, or no
 * memory: then in list order). */
static kvli_host_ord_t *kvli_host_mapped_many(kvli_host_range_t *r, size_t n, uint64_t pg)
{
    kvli_host_ord_t *ord = n > 1 ? malloc(n * sizeof(*ord)) : NULL;
    if (ord == NULL) {
        for (size_t i = 0; i < n; i++)
            r[i].err = kvli_host_msync(r[i].addr, r[i].len, pg);
        return NULL;
    }
    bool sorted = true;
    for (size_t i = 0; i < n; i++) {
        ord[i] = (kvli_host_ord_t){r[i].addr, i};
        sorted = sorted && (i == 0 || r[i - 1].addr <= r[i].addr);
    }
    if (!sorted) /* lists are usually built in address order */
        qsort(ord, n, sizeof(*ord), kvli_host_by_addr);
    for (size_t i = 0; i < n;) {
        const kvli_host_range_t *f = &r[ord[i].i];
        uint64_t lo = f->addr & ~(pg - 1), hi = f->addr + f->len;
        size_t j = i + 1;
        int bad = f->len == 0 || hi < f->addr;
        for (; j < n && !bad; j++) {
            const kvli_host_range_t *g = &r[ord[j].i];
            if ((g->addr & ~(pg - 1)) > ((hi + pg - 1) & ~(pg - 1)))
                break;
            if (g->len == 0 || g->addr + g->len < g->addr)
                bad = 1;
            else if (g->addr + g->len > hi)
                hi = g->addr + g->len;
        }
        if (!bad && msync((void *)(uintptr_t)lo, (size_t)(hi - lo), MS_ASYNC) == 0) {
            for (size_t k = i; k < j; k++)
                r[ord[k].i].err = 0;
        } else {
            for (size_t k = i; k < j; k++)
                r[ord[k].i].err = kvli_host_msync(r[ord[k].i].addr, r[ord[k].i].len, pg);
        }
        i = j;
    }
    return ord;
}

/* Readability of both end bytes of every mapped range: one probe (a byte
 * read by process_vm_readv) per distinct page, in address order, so slices
 * of one buffer share their probes. A page that cannot be read fails every
 * range with an end byte in it. */
typedef struct {
    struct iovec rv[1024];       /* the probes */
    uint32_t first[1024 + 1];    /* probe k covers ends [first[k], first[k+1]) */
    uint32_t who[2048];          /* end e: its range, */
    uint64_t byte[2048];         /* and its byte */
    size_t m, nends;
    int vm_readv;                /* no pipe: process_vm_readv */
} kvli_host_probes_t;

static void kvli_host_probe_fail(kvli_host_probes_t *p, kvli_host_range_t *r, size_t k)
{
    for (uint32_t e = p->first[k]; e < p->first[k + 1]; e++)
        if (r[p->who[e]].err == 0) {
            r[p->who[e]].err = EFAULT;
            r[p->who[e]].bad = p->byte[e];
        }
}

/* Probes [k, k+n): one writev when all are readable, halves otherwise. */
static void kvli_host_probe_span(kvli_host_probes_t *p, kvli_host_range_t *r, size_t k, size_t n)
{
    int ok = p->vm_readv ? -1 : kvli_host_pipe_probe(p->rv + k, n);
    if (ok < 0) {
        /* no pipe: process_vm_readv of this process, which stops at the
         * first probe it cannot read */
        char sink[1024];
        p->vm_readv = 1;
        for (size_t end = k + n; k < end;) {
            struct iovec lv = {sink, end - k};
            ssize_t got = process_vm_readv(getpid(), &lv, 1, p->rv + k, (unsigned long)(end - k),
                                           0);
            if (got < 0 && errno != EFAULT)
                return; /* no way to look without touching: left to the transfer */
            k += got > 0 ? (size_t)got : 0;
            if (k < end)
                kvli_host_probe_fail(p, r, k++);
        }
        return;
    }
    if (ok == 1)
        return;
    if (n == 1) {
        kvli_host_probe_fail(p, r, k);
        return;
    }
    kvli_host_probe_span(p, r, k, n / 2);
    kvli_host_probe_span(p, r, k + n / 2, n - n / 2);
}

static void kvli_host_probe_run(kvli_host_probes_t *p, kvli_host_range_t *r)
{
    p->first[p->m] = (uint32_t)p->nends;
    if (p->m > 0)
        kvli_host_probe_span(p, r, 0, p->m);
    p->m = p->nends = 0;
}

static void kvli_host_probe_add(kvli_host_probes_t *p, kvli_host_range_t *r, uint32_t i,
                                uint64_t byte, uint64_t pg)
{
    int same = p->m > 0 && ((uint64_t)(uintptr_t)p->rv[p->m - 1].iov_base & ~(pg - 1)) ==
                               (byte & ~(pg - 1));
    if (p->nends == 2048 || (!same && p->m == 1024)) {
        kvli_host_probe_run(p, r);
        same = 0;
    }
    if (!same) {
        p->first[p->m] = (uint32_t)p->nends;
        p->rv[p->m++] = (struct iovec){(void *)(uintptr_t)byte, 1};
    }
    p->who[p->nends] = i;
    p->byte[p->nends++] = byte;
}

uint64_t kvli_host_pagesize(void)
{
    static _Atomic uint64_t pg;
    uint64_t v = atomic_load_explicit(&pg, memory_order_relaxed);
    if (v == 0) {
        v = (uint64_t)sysconf(_SC_PAGESIZE);
        atomic_store_explicit(&pg, v, memory_order_relaxed);
    }
    return v;
}

/* The check by probes (any kernel): msync for holes, end bytes for
 * readability. */
static void kvli_host_readable_probe(kvli_host_range_t *r, size_t n)
{
    uint64_t pg = kvli_host_pagesize();
    /* One range within one page or two adjacent ones (a single small
     * registration): its two end bytes readable means every byte is; one
     * probe, no msync and no probe table. Anything else, a failure
     * included (to tell unmapped from unreadable), goes the long way. */
    if (n == 1 && r[0].len > 0 && r[0].addr + r[0].len > r[0].addr) {
        uint64_t lo = r[0].addr & ~(pg - 1), hi = (r[0].addr + r[0].len - 1) & ~(pg - 1);
        struct iovec v[2] = {{(void *)(uintptr_t)r[0].addr, 1},
                             {(void *)(uintptr_t)(r[0].addr + r[0].len - 1), 1}};
        /* A larger single range: mapped throughout (msync) and both end
         * bytes readable, without the probe table. */
        if ((hi - lo <= pg || kvli_host_msync(r[0].addr, r[0].len, pg) == 0) &&
            kvli_host_pipe_probe(v, lo == hi ? 1 : 2) == 1) {
            r[0].err = 0;
            r[0].bad = 0;
            return;
        }
    }
    kvli_host_probes_t *p = malloc(sizeof(*p));
    kvli_host_ord_t *ord = kvli_host_mapped_many(r, n, pg);

    for (size_t i = 0; i < n; i++)
        r[i].bad = 0;
    if (p == NULL) {
        /* no memory for the probe table: one range at a time */
        for (size_t i = 0; i < n; i++) {
            struct iovec v[2] = {{(void *)(uintptr_t)r[i].addr, 1},
                                 {(void *)(uintptr_t)(r[i].addr + r[i].len - 1), 1}};
            for (int e = 0; e < 2 && r[i].err == 0; e++)
                if (kvli_host_pipe_probe(&v[e], 1) == 0) {
                    r[i].err = EFAULT;
                    r[i].bad = (uint64_t)(uintptr_t)v[e].iov_base;
                }
        }
        free(ord);
        return;
    }
    p->m = p->nends = 0;
    p->vm_readv = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = (uint32_t)(ord != NULL ? ord[k].i : k);
        if (r[i].err != 0)
            continue;
        kvli_host_probe_add(p, r, i, r[i].addr, pg);
        kvli_host_probe_add(p, r, i, r[i].addr + r[i].len - 1, pg);
    }
    kvli_host_probe_run(p, r);
    free(p);
    free(ord);
}

/*
 * PROCMAP_QUERY (Linux 6.11 and later): an ioctl on /proc/self/maps that
 * describes the mapping at an address: its start and end, whether it is
 * readable, and its file (inode 0: anonymous memory). One query answers
 * for a whole range inside one private anonymous mapping (malloc, NumPy,
 * PyTorch CPU tensors: what engines register) where the probes take an
 * msync and a writev, and it finds an unreadable page anywhere in the
 * range, not only at its ends. Declared here: Debian 12's kernel headers
 * predate it. File mappings (memfd, /dev/shm, files) go to the probes,
 * whose end-byte reads also catch a range past the end of its file.
 */
struct kvli_procmap_query {
    uint64_t size, query_flags, query_addr;
    uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
_Static_assert(sizeof(struct kvli_procmap_query) == 104, "struct procmap_query of Linux 6.11");
#define KVLI_PROCMAP_QUERY _IOWR('f', 17, struct kvli_procmap_query)
#define KVLI_PROCMAP_READABLE 0x01u

/* This process's /proc/self/maps, opened at the first check; a forked
 * child's inherited descriptor describes its parent, so the child opens
 * its own (kvli_host_pid is refreshed at fork) and closes the inherited
 * one only if that number still names the file opened (kvli_host_fd_is).
 * A descriptor closed behind kvlane's back (EBADF, or ENOTTY from whatever
 * took its number) is let go, never closed, and the next check opens a new
 * one. */
static pthread_mutex_t kvli_host_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int kvli_host_maps_fd = -1; /* read without the lock once owned */
static dev_t kvli_host_maps_dev;
static ino_t kvli_host_maps_ino;
static _Atomic pid_t kvli_host_maps_owner = -1; /* set (release) once fd is this process's */
static bool kvli_host_maps_none; /* no PROCMAP_QUERY here: never ask again */

static int kvli_host_maps(void)
{
    pid_t me = kvli_host_pid();
    /* the fd is never closed while owner is this process: no lock to read it */
    if (atomic_load_explicit(&kvli_host_maps_owner, memory_order_acquire) == me)
        return kvli_host_maps_fd;
    pthread_mutex_lock(&kvli_host_maps_lock);
    if (kvli_host_maps_owner != me && !kvli_host_maps_none) {
        struct stat st;
        if (kvli_host_fd_is(kvli_host_maps_fd, kvli_host_maps_dev, kvli_host_maps_ino))
            close(kvli_host_maps_fd); /* the parent's, inherited */
        kvli_host_maps_fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        kvli_host_maps_owner = -1;
        if (kvli_host_maps_fd >= 0 && fstat(kvli_host_maps_fd, &st) == 0) {
            kvli_host_maps_dev = st.st_dev;
            kvli_host_maps_ino = st.st_ino;
        } else if (kvli_host_maps_fd >= 0) {
            close(kvli_host_maps_fd);
            kvli_host_maps_fd = -1;
        }
        if (kvli_host_maps_fd >= 0) {
            /* this function's own code is mapped: any failure means the
             * kernel has no such query (ENOTTY before 6.11) */
            struct kvli_procmap_query q = {.size = sizeof(q),
                                           .query_addr = (uint64_t)(uintptr_t)&kvli_host_maps};
            if (ioctl(kvli_host_maps_fd, KVLI_PROCMAP_QUERY, &q) == 0) {
                atomic_store_explicit(&kvli_host_maps_owner, me, memory_order_release);
            } else {
                close(kvli_host_maps_fd);
                kvli_host_maps_fd = -1;
                kvli_host_maps_none = true;
            }
        } else if (errno == ENOENT || errno == EACCES) {
            kvli_host_maps_none = true; /* no /proc: EMFILE and the like are tried again */
        }
    }
    int fd = kvli_host_maps_owner == me ? kvli_host_maps_fd : -1;
    pthread_mutex_unlock(&kvli_host_maps_lock);
    return fd;
}

/* fd stopped answering as /proc/self/maps: let it go (not closed: the
 * number may be someone else's now). */
static void kvli_host_maps_lost(int fd)
{
    pthread_mutex_lock(&kvli_host_maps_lock);
    if (kvli_host_maps_fd == fd && kvli_host_maps_owner == kvli_host_pid()) {
        kvli_host_maps_owner = -1;
        kvli_host_maps_fd = -1;
    }
    pthread_mutex_unlock(&kvli_host_maps_lock);
}

int kvli_host_maps_query_available(void)
{
    return kvli_host_maps() >= 0;
}

/* The mapping a list's last query found. */
typedef struct {
    uint64_t start, end;
    bool readable, anon, valid;
} kvli_host_vma_t;

/* Decide range r by mappings: 1 with r->err (and r->bad) set, 0 when the
 * probes must (a file mapping, a failed query, more queries than *budget). */
static int kvli_host_vma_range(int fd, kvli_host_range_t *r, kvli_host_vma_t *c, unsigned *budget)
{
    uint64_t at = r->addr, end = r->addr + r->len;
    if (r->len == 0 || end < r->addr)
        return 0;
    while (at < end) {
        if (!c->valid || at < c->start || at >= c->end) {
            if (*budget == 0)
                return 0;
            (*budget)--;
            struct kvli_procmap_query q = {.size = sizeof(q), .query_addr = at};
            if (ioctl(fd, KVLI_PROCMAP_QUERY, &q) != 0) {
                c->valid = false;
                int e = errno;
                if (e == EBADF || e == ENOTTY)
                    kvli_host_maps_lost(fd);
                if (e != ENOENT)
                    return 0;
                r->err = ENOMEM; /* nothing mapped at 'at' */
                r->bad = 0;
                return 1;
            }
            *c = (kvli_host_vma_t){q.vma_start, q.vma_end,
                                   (q.vma_flags & KVLI_PROCMAP_READABLE) != 0,
                                   q.inode == 0 && q.dev_major == 0 && q.dev_minor == 0, true};
            if (at < c->start || at >= c->end) { /* not what was asked: trust nothing */
                c->valid = false;
                return 0;
            }
        }
        if (!c->readable) {
            r->err = EFAULT;
            r->bad = at;
            return 1;
        }
        if (!c->anon)
            return 0;
        at = c->end;
    }
    r->err = 0;
    r->bad = 0;
    return 1;
}

void kvli_host_readable_many(kvli_host_range_t *r, size_t n)
{
    int fd = kvli_host_maps();
    if (fd < 0) {
        kvli_host_readable_probe(r, n);
        return;
    }
    /* Ranges of few mappings cost one query each mapping; a list scattered
     * over many mappings goes to the probes (one msync per run, batched
     * probes) past 64 queries. */
    kvli_host_vma_t c = {0};
    unsigned budget = 64;
    size_t left = 0;
    for (size_t i = 0; i < n; i++) {
        if (kvli_host_vma_range(fd, &r[i], &c, &budget) == 0) {
            r[i].err = -1;
            left++;
        }
    }
    if (left == 0)
        return;
    kvli_host_range_t *u = left < n ? malloc(left * sizeof(*u)) : NULL;
    if (u == NULL) {
        kvli_host_readable_probe(r, n); /* all of them (or no memory to pick) */
        return;
    }
    for (size_t i = 0, k = 0; i < n; i++)
        if (r[i].err == -1)
            u[k++] = r[i];
    kvli_host_readable_probe(u, left);
    for (size_t i = 0, k = 0; i < n; i++)
        if (r[i].err == -1)
            r[i] = u[k++];
    free(u);
}

int kvli_host_readable(uint64_t addr, uint64_t len, uint64_t *bad_p)
{
    kvli_host_range_t r = {addr, len, 0, 0};
    kvli_host_readable_many(&r, 1);
    if (r.err == EFAULT)
        *bad_p = r.bad;
    return r.err;
}

int kvli_host_boot_id(char *buf, size_t cap, char *why, size_t why_cap)
{
    static const char path[] = "/proc/sys/kernel/random/boot_id";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;
    if (fd < 0) {
        int e = errno;
        snprintf(why, why_cap, "open(%s) = -1 %s (%s)", path, kvli_errno_name(e), strerror(e));
        return e;
    }
    n = cap > KVLI_BOOT_ID_LEN ? read(fd, buf, cap - 1) : -1;
    close(fd);
    if (n < KVLI_BOOT_ID_LEN) {
        snprintf(why, why_cap, "read(%s) = %zd: expected a 36-character boot id", path, n);
        return EIO;
    }
    buf[KVLI_BOOT_ID_LEN] = '\0';
    return 0;
}
