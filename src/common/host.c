/* The kernel's boot id (see host.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "errname.h"
#include "host.h"

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
