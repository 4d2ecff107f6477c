/* Which machine this is (shared layer): backends that reach peers on this
 * host only (shm, cuda) compare boot ids to be sure both agents share one. */
#ifndef KVLI_HOST_H
#define KVLI_HOST_H

#include <stddef.h>

#define KVLI_BOOT_ID_LEN 36

/* The kernel's boot id (36 characters and a NUL) into buf (cap >= 37): 0,
 * or an errno (EIO for a short read) with why ("open(...) = -1 ENOENT (...)"
 * or "read(...) = n: expected a 36-character boot id"). */
int kvli_host_boot_id(char *buf, size_t cap, char *why, size_t why_cap);

/* "/dev/shm: 64.0 MiB, 12.0 MiB free" (or why it cannot be read) into buf:
 * what an allocation in shared memory has room for. */
void kvli_host_dev_shm(char *buf, size_t cap);

#endif
