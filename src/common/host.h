/* Which machine this is (shared layer): backends that reach peers on this
 * host only (shm, cuda) compare boot ids to be sure both agents share one. */
#ifndef KVLI_HOST_H
#define KVLI_HOST_H

#include <stddef.h>
#include <stdint.h>

#define KVLI_BOOT_ID_LEN 36

/* The kernel's boot id (36 characters and a NUL) into buf (cap >= 37): 0,
 * or an errno (EIO for a short read) with why ("open(...) = -1 ENOENT (...)"
 * or "read(...) = n: expected a 36-character boot id"). */
int kvli_host_boot_id(char *buf, size_t cap, char *why, size_t why_cap);

/* /dev/shm's size and free bytes: 0, or the errno of statvfs. */
int kvli_host_dev_shm_size(uint64_t *total_p, uint64_t *avail_p);
/* "/dev/shm: 64.0 MiB, 12.0 MiB free" (or why it cannot be read) into buf:
 * what an allocation in shared memory has room for. */
void kvli_host_dev_shm(char *buf, size_t cap);

/* Whether [addr, addr+len) is host memory this process can read, checked
 * without touching it (no fault): 0; ENOMEM when part of it is not mapped;
 * EFAULT when it is mapped but a byte cannot be read (*bad_p says which: an
 * inaccessible mapping, such as the range the CUDA driver keeps reserved
 * after freeing GPU memory). Where the kernel has PROCMAP_QUERY (Linux
 * 6.11) anonymous mappings are looked up (one ioctl a mapping; every page
 * is covered and *bad_p is the first byte that cannot be read); otherwise,
 * and for file mappings, msync finds holes and the two end bytes are
 * probed (*bad_p: the end that failed). */
int kvli_host_readable(uint64_t addr, uint64_t len, uint64_t *bad_p);
/* The page size (sysconf once). */
uint64_t kvli_host_pagesize(void);

/* The same check for many ranges at once (a registration list): err and bad
 * of each range are filled in as kvli_host_readable returns and sets them.
 * Ranges that touch or overlap share one msync; the end bytes are probed
 * once per distinct page, up to 1,024 per writev(2) into a pipe (EFAULT,
 * never a fault, for a byte that cannot be read; halves to find it), or
 * process_vm_readv of this process where no pipe can be made. */
typedef struct kvli_host_range {
    uint64_t addr, len;
    int err;
    uint64_t bad;
} kvli_host_range_t;
void kvli_host_readable_many(kvli_host_range_t *r, size_t n);
/* 1 when this process checks ranges by PROCMAP_QUERY (tests). */
int kvli_host_maps_query_available(void);

#endif
