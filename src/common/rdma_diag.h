/*
 * RDMA device checks that need no RDMA library: compare the devices the
 * kernel lists in sysfs with the device nodes this process can open, and
 * read the locked-memory limit. Used by the ucx backend's diagnoses and by
 * `kvlane doctor`.
 *
 * Roots are injectable for tests: KVL_SYSFS_ROOT (default /sys) and
 * KVL_DEV_ROOT (default /dev).
 */
#ifndef KVLI_RDMA_DIAG_H
#define KVLI_RDMA_DIAG_H

#include <stddef.h>
#include <stdint.h>

#define KVLI_RDMA_MAX_DEVS 32
#define KVLI_RDMA_MAX_PORTS 4

/* One port: <sysfs>/class/infiniband/<dev>/ports/<num>/{state,link_layer,gids/}. */
typedef struct kvli_rdma_port {
    unsigned num;
    char state[32];         /* "ACTIVE", "DOWN", "INIT", "ARMED"; "" unreadable */
    char link_layer[32];    /* "InfiniBand", "Ethernet"; "" unreadable */
    char netdev[32];        /* RoCE: gid_attrs/ndevs/0, e.g. "eth2"; "" none */
    unsigned gids;          /* non-zero entries of gids/ */
    int gids_dir;           /* gids/ exists */
} kvli_rdma_port_t;

typedef struct kvli_rdma_dev {
    char name[64];          /* e.g. "mlx5_0" (sysfs class/infiniband/<name>) */
    char uverbs[32];        /* e.g. "uverbs0"; "" when sysfs names none */
    int node_present;       /* <dev>/infiniband/<uverbs> exists */
    int node_openable;      /* ... and opens read-write */
    int node_errno;         /* why not, when !node_openable */
    unsigned nports;
    kvli_rdma_port_t ports[KVLI_RDMA_MAX_PORTS];
} kvli_rdma_dev_t;

typedef struct kvli_rdma_scan {
    char sysfs_root[256];
    char dev_root[256];
    unsigned n;             /* devices listed in sysfs */
    unsigned n_broken;      /* listed without an openable uverbs node */
    int dev_dir_present;    /* <dev>/infiniband exists */
    char dev_nodes[256];    /* what <dev>/infiniband holds, space-separated */
    int cm_present;         /* <dev>/infiniband/rdma_cm exists */
    int cm_openable;        /* ... and opens read-write */
    int cm_errno;
    kvli_rdma_dev_t devs[KVLI_RDMA_MAX_DEVS];
} kvli_rdma_scan_t;

/* Fill s from the (possibly injected) sysfs and dev roots: devices, their
 * uverbs nodes, rdma_cm, and each device's ports. */
void kvli_rdma_diag_scan(kvli_rdma_scan_t *s);

/* One sentence per broken device, with the fix; "" when none. Returns the
 * number of broken devices. */
unsigned kvli_rdma_diag_render(const kvli_rdma_scan_t *s, char *buf, size_t len);

/* Explain a device named by the user (e.g. UCX_NET_DEVICES "mlx5_7:1"):
 * not listed at all, listed without a node, or fine. */
void kvli_rdma_diag_explain(const kvli_rdma_scan_t *s, const char *dev, char *buf, size_t len);

/* One port in words: "ACTIVE, InfiniBand, 2 GIDs" or
 * "DOWN, Ethernet (eth2), no GID". Returns 0 ok, 1 warn (not ACTIVE, or no
 * GID), with the reason and fix in hint. */
int kvli_rdma_diag_port(const kvli_rdma_dev_t *v, const kvli_rdma_port_t *p, char *buf,
                        size_t len, char *hint, size_t hint_len);

/* RLIMIT_MEMLOCK soft limit in bytes; UINT64_MAX when unlimited. */
uint64_t kvli_rdma_diag_memlock(void);

/* "64 KiB", "8 MiB", "unlimited" */
const char *kvli_rdma_diag_size_str(uint64_t v, char *buf, size_t len);

#endif
