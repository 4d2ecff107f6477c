/* The kernel's boot id (see host.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
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

void kvli_host_dev_shm(char *buf, size_t cap)
{
    struct statvfs sv;
    char tot[32], fr[32];
    if (statvfs("/dev/shm", &sv) != 0) {
        int e = errno;
        snprintf(buf, cap, "/dev/shm: statvfs = -1 %s (%s)", kvli_errno_name(e), strerror(e));
        return;
    }
    kvli_host_bytes((uint64_t)sv.f_blocks * sv.f_frsize, tot, sizeof(tot));
    kvli_host_bytes((uint64_t)sv.f_bavail * sv.f_frsize, fr, sizeof(fr));
    snprintf(buf, cap, "/dev/shm: %s, %s free", tot, fr);
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
