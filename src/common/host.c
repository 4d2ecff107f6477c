/* Facts about this host and process (see host.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
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

/* One byte: write(2) copies it into a pipe and says EFAULT when it cannot. */
static int kvli_host_byte_readable(uint64_t addr)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static int fds[2] = {-1, -1};
    int ok = 1;
    char c;
    pthread_mutex_lock(&lock);
    if (fds[0] < 0 && pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
        fds[0] = fds[1] = -1;
    if (fds[0] >= 0) {
        ssize_t n = write(fds[1], (const void *)(uintptr_t)addr, 1);
        if (n == 1) {
            ssize_t r = read(fds[0], &c, 1);
            (void)r;
        } else if (n < 0 && errno == EFAULT) {
            ok = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

int kvli_host_readable(uint64_t addr, uint64_t len, uint64_t *bad_p)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), start = addr & ~(pg - 1);
    if (len == 0 || addr + len < addr ||
        msync((void *)(uintptr_t)start, (size_t)(addr + len - start), MS_ASYNC) != 0)
        return ENOMEM;
    if (!kvli_host_byte_readable(addr)) {
        *bad_p = addr;
        return EFAULT;
    }
    if (!kvli_host_byte_readable(addr + len - 1)) {
        *bad_p = addr + len - 1;
        return EFAULT;
    }
    return 0;
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
