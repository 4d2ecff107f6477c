/*
 * kvlane cuda backend: private structures shared by the files of this folder.
 *
 * The CUDA driver is reached through dlopen("libcuda.so.1") at run time
 * (cuda_driver.c): the library has no build-time CUDA dependency, so the few
 * driver types it needs are declared here with the driver's ABI layout.
 *
 * Objects and who owns what:
 *   drv    - process-wide: the dlopen'ed driver, its entry points and the
 *            visible devices with their retained primary contexts.
 *   iface  - one per open(): listening socket, progress thread, per-device
 *            streams, the gather kernel and descriptor slots.
 *   peer   - one per peer_load(): our connection to a remote agent and the
 *            remote memory mapped here (IPC handles, VMM imports, memfds).
 *   conn   - one per accepted connection (target side, progress thread only).
 *   mh/rh  - local region handle (mem_reg) / remote region handle.
 *   xpriv  - per posted transfer (work units in flight, cancel state).
 *
 * iface->lock guards every list and counter; it is never held across a
 * call that can block on a peer, nor across a call into the core.
 */
#ifndef KVLI_CUDA_H
#define KVLI_CUDA_H

#include <pthread.h>
#include <stdbool.h>
#include "common/accept.h"
#include "common/clock.h"
#include "common/chunk.h"
#include "common/progress.h"
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <kvlane/backend.h>
#include <kvlane/notif.h>

#define KVLI_CUDA_NAME "cuda"
#define KVLI_CUDA_MAX_DEVICES 64
#define KVLI_CUDA_STREAMS 4                /* streams per device per iface */
#define KVLI_CUDA_UNIT_BYTES (512ull << 20) /* cancel is checked between units */
/* Units of indexed transfers: one launch for up to 2 GiB (the window of 4
 * units of 512 MiB that a re-post enqueues at once anyway), no tail of a
 * launch between them. */
#define KVLI_CUDA_IDX_UNIT_BYTES (2048ull << 20)
#define KVLI_CUDA_IDX_THREADS 512u
#define KVLI_CUDA_WARP_THREADS 256u        /* kvl_gather_idx_warp: 8 pairs per block */
#define KVLI_CUDA_WARP_MAX_LEN (64u << 10) /* pairs up to this use a warp each, */
#define KVLI_CUDA_WARP_MIN_PAIRS 4096u     /* in requests of at least this many */
#define KVLI_CUDA_UNIT_BLOCKS 8192u        /* blocks per batch / uncached kernel launch at most */
/* Small requests carry their table in the launch (kernels.cu, same sizes):
 * up to this many descriptors, or index pairs of an indexed transfer. */
#define KVLI_CUDA_INLINE_BLOCKS 128u
#define KVLI_CUDA_INLINE_PAIRS 384u
#define KVLI_CUDA_WINDOW 4                 /* units in flight per transfer */
/* Unit slots per device whose small launches tell their end in host memory
 * (kvl_signal_end in kernels.cu); later slots use their event alone. */
#define KVLI_CUDA_FLAGS 1024u
/* How long after posting a poll trusts that word alone: later polls ask the
 * event too, which also reports a failed launch. */
#define KVLI_CUDA_FLAG_TRUST_NS 200000ull
#define KVLI_CUDA_PIECE (1ull << 20)       /* kernel splits blocks above this */
#define KVLI_CUDA_DEFAULT_TIMEOUT_MS 5000u
/* For this long after a posting the progress thread polls its events
 * without sleeping (a small request completes within it), then every
 * KVLI_CUDA_POLL_NS (cuda_iface.c). */
#define KVLI_CUDA_SPIN_NS 50000ull
#define KVLI_CUDA_TEXT_MAX 256
#define KVLI_CUDA_MAX_CHUNKS 65536u        /* VMM chunks per region */

/* ---- the driver ABI (subset; layouts as in cuda.h) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;                       /* CU_MEM_ALLOCATION_TYPE_PINNED */
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct {
    int srcAccessOrder;
    CUmemLocation srcLocHint;
    CUmemLocation dstLocHint;
    unsigned int flags;
} CUmemcpyAttributes;

enum {
    KVLI_CUDA_SUCCESS = 0,
    KVLI_CUDA_ERROR_INVALID_VALUE = 1,
    KVLI_CUDA_ERROR_NOT_INITIALIZED = 3,
    KVLI_CUDA_ERROR_DEINITIALIZED = 4,
    KVLI_CUDA_ERROR_STUB_LIBRARY = 34,
    KVLI_CUDA_ERROR_NO_DEVICE = 100,
    KVLI_CUDA_ERROR_ALREADY_MAPPED = 208,
    KVLI_CUDA_ERROR_NOT_READY = 600,
    KVLI_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    KVLI_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713
};
enum {
    KVLI_CU_PTR_CONTEXT = 1,
    KVLI_CU_PTR_MEMORY_TYPE = 2,
    KVLI_CU_PTR_BUFFER_ID = 7,
    KVLI_CU_PTR_IS_MANAGED = 8,
    KVLI_CU_PTR_DEVICE_ORDINAL = 9,
    KVLI_CU_PTR_IS_LEGACY_IPC = 10,
    KVLI_CU_PTR_RANGE_START = 11,
    KVLI_CU_PTR_RANGE_SIZE = 12,
    KVLI_CU_PTR_MAPPED = 13,
    KVLI_CU_PTR_ALLOWED_HANDLES = 14
};
enum { KVLI_CU_MEMTYPE_HOST = 1, KVLI_CU_MEMTYPE_DEVICE = 2, KVLI_CU_MEMTYPE_UNIFIED = 4 };
#define KVLI_CU_DEV_ATTR_SM_COUNT 16
#define KVLI_CU_DEV_ATTR_UVA 41
#define KVLI_CU_DEV_ATTR_VMM 102
#define KVLI_CU_DEV_ATTR_POSIX_FD 103
#define KVLI_CU_HANDLE_POSIX_FD 1
#define KVLI_CU_LOCATION_DEVICE 1
#define KVLI_CU_ACCESS_RW 3
#define KVLI_CU_ALLOC_PINNED 1
#define KVLI_CU_IPC_LAZY_PEER 1
#define KVLI_CU_STREAM_NON_BLOCKING 1
#define KVLI_CU_EVENT_DISABLE_TIMING 2
#define KVLI_CU_HOSTREG_PORTABLE 1
#define KVLI_CU_HOSTREG_DEVICEMAP 2
#define KVLI_CU_SRC_ORDER_STREAM 1

/* Driver entry points; NULL where the driver lacks an optional one. */
typedef struct kvli_cuda_drv {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuGetErrorName)(CUresult, const char **);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDeviceCanAccessPeer)(int *, CUdevice, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxPushCurrent)(CUcontext);
    CUresult (*cuCtxPopCurrent)(CUcontext *);
    CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*cuMemHostRegister)(void *, size_t, unsigned);
    CUresult (*cuMemHostUnregister)(void *);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned); /* optional */
    CUresult (*cuMemFreeHost)(void *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    /* stream-ordered allocation (optional: CUDA >= 11.2) */
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    /* CUDA >= 13: no failIdx; 12.8/12.9: with failIdx. At most one is set. */
    CUresult (*cuMemcpyBatchAsync_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                      CUmemcpyAttributes *, size_t *, size_t, CUstream);
    CUresult (*cuMemcpyBatchAsync_v1)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                                      CUmemcpyAttributes *, size_t *, size_t, size_t *,
                                      CUstream);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
    /* optional: CUDA >= 10.0 */
    CUresult (*cuLaunchHostFunc)(CUstream, void (*)(void *), void *);
    CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
    /* virtual memory management (optional: CUDA >= 10.2) */
    CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int,
                                             unsigned long long);
    CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
    CUresult (*cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *,
                                                       CUmemGenericAllocationHandle);
    CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                    unsigned long long);
    CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
    CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                         unsigned long long);
    CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
    CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);

    /* what was found */
    void *handle;
    char path[256];                  /* the libcuda actually loaded */
    int version;                     /* cuDriverGetVersion, e.g. 13000 */
    int ndev;
    int vmm;                         /* VMM entry points present */
    struct {
        CUdevice dev;
        char pci[32];                /* "0000:1b:00.0", lower case */
        char name[96];
        int sm_count;
        int posix_fd;                /* can export VMM memory as fd */
        CUcontext ctx;               /* primary, retained on first use */
        pthread_mutex_t lock;
    } devs[KVLI_CUDA_MAX_DEVICES];
} kvli_cuda_drv_t;

/* ---- cuda_driver.c ---- */
/* The driver table, loaded once; NULL when unusable (reason says why). */
const kvli_cuda_drv_t *kvli_cuda_drv_get(void);
const char *kvli_cuda_drv_reason(void);
/* Whether the CUDA driver is loaded in this process (by kvlane or by the
 * application), without loading it: where it is not, no memory of this
 * process can be CUDA's, and a query that only classifies need not pay
 * for cuInit (hundreds of ms, serialised across processes on one GPU). */
bool kvli_cuda_drv_in_process(void);
/* "CUDA_ERROR_X (text)" */
const char *kvli_cuda_drv_errstr(CUresult r, char *buf, size_t cap);
/* Push device d's primary context (retaining it on first use). */
CUresult kvli_cuda_drv_push(int d);
void kvli_cuda_drv_pop(void);
/* Device ordinal with this PCI bus id, -1 when not visible here. */
int kvli_cuda_drv_dev_by_pci(const char *pci);
/* Whether the gather kernel is built in, and a line saying which. */
int kvli_cuda_drv_have_kernel(void);
const char *kvli_cuda_drv_kernel_note(void);
const void *kvli_cuda_drv_kernel_image(void);
/* Explain CUDA_VISIBLE_DEVICES for a declared id that is not the ordinal. */
void kvli_cuda_drv_remap_text(int declared, int actual, char *buf, size_t cap);

/* ---- local regions (cuda_md.c) ---- */
enum { KVLI_CUDA_MEM_LEGACY = 1, KVLI_CUDA_MEM_VMM = 2, KVLI_CUDA_MEM_HOST = 3 };

typedef struct kvli_cuda_mh {
    uint64_t addr, len;
    int kind;                        /* KVLI_CUDA_MEM_* */
    int dev;                         /* VRAM: ordinal; host: -1 */
    uint64_t alloc_base, alloc_size; /* VRAM: allocation (legacy) or first chunk */
    uint64_t buffer_id;              /* VRAM: detects free + reuse */
    uint32_t nchunks;                /* VMM chunks the region spans */
    int exportable;                  /* peers can map it */
    char why_local[240];             /* VRAM, when !exportable */
    CUipcMemHandle ipc;              /* legacy */
    int pinned_here;                 /* host: we called cuMemHostRegister */
    uint64_t pin_base, pin_len;
    int pin_async;                   /* host: handed to the pin thread (cuda_pin.c) */
    int pin_state;                   /* KVLI_CUDA_PIN_* (iface->pin_lock) */
    struct kvli_cuda_mh *pin_prev, *pin_next; /* the pin queue (iface->pin_lock) */
    uint64_t shm_id, shm_off, shm_size;
} kvli_cuda_mh_t;

typedef struct kvli_cuda_iface kvli_cuda_iface_t;
typedef struct kvli_cuda_peer kvli_cuda_peer_t;

/* ---- pinning registered host memory (cuda_pin.c) ---- */
enum { KVLI_CUDA_PINH_OFF = 0, KVLI_CUDA_PINH_AUTO = 1, KVLI_CUDA_PINH_SYNC = 2 }; /* pin_host */
enum { KVLI_CUDA_PIN_NONE = 0, KVLI_CUDA_PIN_QUEUED = 1, KVLI_CUDA_PIN_BUSY = 2 };

/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE of addr (KVLI_CU_MEMTYPE_*), 0 when the
 * driver does not know it (cuda_md.c). */
unsigned kvli_cuda_memtype(const kvli_cuda_drv_t *d, uint64_t addr, CUresult *r_p);
void kvli_cuda_pin_init(kvli_cuda_iface_t *iface);
/* Stop and join the pin thread (after every region is deregistered). */
void kvli_cuda_pin_fini(kvli_cuda_iface_t *iface);
/* Pin a pageable host region as pin_host says (auto: queue it; sync: now);
 * what became of it in det. */
void kvli_cuda_pin_host(kvli_cuda_iface_t *iface, kvli_cuda_mh_t *mh, char *det, size_t dl);
/* At deregistration: dequeue, or wait for the pin in progress, then unpin. */
void kvli_cuda_pin_drop(kvli_cuda_iface_t *iface, kvli_cuda_mh_t *mh);

/* A peer's memory mapped here, shared by its regions (legacy, memfd). */
typedef struct kvli_cuda_map {
    struct kvli_cuda_map *next;
    int kind;
    uint64_t key;                    /* legacy: remote alloc base; host: shm id */
    uint64_t buffer_id;
    uint8_t *base;                   /* local address of the mapping */
    uint64_t size;
    int dev;                         /* device whose context opened it */
    int host_pinned;
    unsigned refs;
} kvli_cuda_map_t;

/* Remote region handle. */
typedef struct kvli_cuda_rh {
    kvli_cuda_peer_t *peer;
    uint64_t addr, len;
    int kind;
    int rdev;                        /* ordinal in the peer's process */
    char pci[32];
    uint8_t *local;                  /* where [addr, addr+len) is mapped here */
    int dev;                         /* device that can reach it, -1 host */
    kvli_cuda_map_t *map;            /* legacy / host */
    /* VMM import */
    CUdeviceptr va;
    uint64_t va_size;
    uint32_t nh;
    uint64_t *chunk_size;
    CUmemGenericAllocationHandle *handles;
    char unreachable[300];           /* set when mapping failed: xfer_post says it */
} kvli_cuda_rh_t;

/* ---- cuda_md.c ---- */
kvl_status_t kvli_cuda_md_query(uint64_t addr, uint64_t len, int32_t declared_dev,
                                kvl_mem_kind_t *kind_p, int32_t *dev_p, char *info,
                                size_t info_len, kvl_error_t *err);
kvl_status_t kvli_cuda_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p, char *detail,
                              size_t detail_len, kvl_error_t *err);
void kvli_cuda_md_dereg(void *bk, void *mh);
kvl_status_t kvli_cuda_md_pack(void *bk, void *mh, uint8_t *buf, size_t cap, size_t *len_p);
kvl_status_t kvli_cuda_md_check_live(const kvli_cuda_mh_t *mh, kvl_error_t *err);
/* The VMM chunks of a registered region: bases and sizes (caller frees). */
kvl_status_t kvli_cuda_md_chunks(const kvli_cuda_mh_t *mh, uint64_t **base_p, uint64_t **size_p,
                                 uint32_t *n_p, char *text, size_t cap);

/* ---- cuda_ipc.c: remote regions ---- */
kvl_status_t kvli_cuda_ipc_rload(void *bk, void *peer, const kvl_region_info_t *r,
                                 const uint8_t *key, size_t len, void **rh_p, kvl_error_t *err);
void kvli_cuda_ipc_runload(void *bk, void *peer, void *rh);
void kvli_cuda_ipc_unmap_all(kvli_cuda_peer_t *peer);
/* Target side: export fds for a request; returns count or -1 with text. */
int kvli_cuda_ipc_export(kvli_cuda_iface_t *iface, int what, uint64_t addr, uint64_t len,
                         uint32_t first, int *fds, uint64_t *sizes, int max, uint32_t *total_p,
                         char *text, size_t cap);

/* ---- cuda_chan.c: the Unix socket channel between agents ---- */
#define KVLI_CUDA_MSG_MAGIC 0x4b4c4355u     /* "KLCU" */
/* 2: NOTIF is answered (NOTIF_ACK: status, then text_len bytes of refusal
 * text): the target queues it within its bound or refuses it. */
#define KVLI_CUDA_PROTO_VERSION 2u
#define KVLI_CUDA_CONN_MAGIC 0x55434c4bu
#define KVLI_CUDA_CONN_VERSION 1u
#define KVLI_CUDA_FDS_MAX 64               /* fds per reply */
enum {
    KVLI_CUDA_MSG_HELLO = 1,
    KVLI_CUDA_MSG_HELLO_ACK = 2,
    KVLI_CUDA_MSG_NOTIF = 3,
    KVLI_CUDA_MSG_FDS_REQ = 4,
    KVLI_CUDA_MSG_FDS_REPLY = 5,
    KVLI_CUDA_MSG_NOTIF_ACK = 6
};

typedef struct kvli_cuda_notifack {
    int32_t status;                  /* KVL_OK: queued; else the refusal */
    uint32_t text_len;               /* refusal text follows */
} kvli_cuda_notifack_t;
enum { KVLI_CUDA_FDS_VMM = 1, KVLI_CUDA_FDS_MEMFD = 2 };

typedef struct kvli_cuda_hdr {
    uint32_t magic, type;
    uint64_t len;                    /* body bytes */
} kvli_cuda_hdr_t;

typedef struct kvli_cuda_fdsreq {
    uint32_t what;                   /* KVLI_CUDA_FDS_* */
    uint32_t first;                  /* first chunk wanted */
    uint64_t addr, len;              /* VMM: region; MEMFD: addr = allocation id */
} kvli_cuda_fdsreq_t;

typedef struct kvli_cuda_fdsrep {
    int32_t status;
    uint32_t n;                      /* fds passed (sizes follow, u64 each) */
    uint32_t total;                  /* chunks in all */
    uint32_t text_len;               /* refusal text follows the sizes */
} kvli_cuda_fdsrep_t;

struct kvli_cuda_peer {
    kvli_cuda_peer_t *next;
    kvli_cuda_iface_t *iface;
    char name[KVL_NAME_MAX];
    uint64_t incarnation;
    pid_t pid;
    struct sockaddr_un addr;
    socklen_t addrlen;
    char sock_desc[120];
    int fd;
    pthread_mutex_t io_lock;         /* one request/reply at a time on fd */
    atomic_int dead;
    char dead_what[200];
    kvli_cuda_map_t *maps;           /* under iface->lock */
};

typedef struct kvli_cuda_conn {
    struct kvli_cuda_conn *next;
    int fd;
    int hello;
    char name[KVL_NAME_MAX];
    pid_t cred_pid;
    int closing;
} kvli_cuda_conn_t;

kvl_status_t kvli_cuda_chan_listen(kvli_cuda_iface_t *iface, kvl_error_t *err);
kvl_status_t kvli_cuda_chan_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p);
kvl_status_t kvli_cuda_chan_peer_load(void *bk, const char *name, uint64_t incarnation,
                                      const uint8_t *conn, size_t len, void **peer_p,
                                      kvl_error_t *err);
void kvli_cuda_chan_peer_unload(void *bk, void *peer);
void kvli_cuda_chan_peer_describe(void *bk, void *peer, char *buf, size_t len);
/* A notification, answered; xfer_bytes: it ends a transfer of that many
 * bytes, all in place (UINT64_MAX: sent alone), for a refusal's text. */
kvl_status_t kvli_cuda_chan_notif(kvli_cuda_peer_t *p, const void *msg, size_t len,
                                  uint64_t xfer_bytes, kvl_error_t *err);
kvl_status_t kvli_cuda_chan_notif_send(void *bk, void *peer, const void *msg, size_t len,
                                       kvl_error_t *err);
/* Ask the peer for fds; *n_p fds land in fds[], sizes in sizes[]. */
kvl_status_t kvli_cuda_chan_fds_request(kvli_cuda_peer_t *peer, uint32_t what, uint64_t addr,
                                        uint64_t len, uint32_t first, int *fds, uint64_t *sizes,
                                        uint32_t *n_p, uint32_t *total_p, kvl_error_t *err);
/* Progress thread: the target side of accepted connections. */
void kvli_cuda_chan_accept(kvli_cuda_iface_t *iface);
void kvli_cuda_chan_conn_progress(kvli_cuda_iface_t *iface, kvli_cuda_conn_t *c);
void kvli_cuda_chan_conn_free(kvli_cuda_conn_t *c);

/* ---- cuda_xfer.c ---- */
/* One descriptor of the gather kernel (layout shared with kernels.cu). */
typedef struct kvli_cuda_blk {
    uint64_t src, dst, len;
} kvli_cuda_blk_t;

/* Kernel parameters of kvl_gather_inline / kvl_gather_idx_inline (layouts
 * shared with kernels.cu). */
typedef struct kvli_cuda_inline_tab {
    uint64_t n;
    kvli_cuda_blk_t b[KVLI_CUDA_INLINE_BLOCKS];
} kvli_cuda_inline_tab_t;

typedef struct kvli_cuda_inline_idx {
    uint32_t s[KVLI_CUDA_INLINE_PAIRS];  /* source entries */
    uint32_t d[KVLI_CUDA_INLINE_PAIRS];  /* destination entries */
} kvli_cuda_inline_idx_t;

_Static_assert(sizeof(kvli_cuda_inline_tab_t) == 8 + 24 * KVLI_CUDA_INLINE_BLOCKS &&
               sizeof(kvli_cuda_inline_idx_t) == 8 * KVLI_CUDA_INLINE_PAIRS,
               "inline kernel parameters: the layouts of kernels.cu");

typedef struct kvli_cuda_slot {
    struct kvli_cuda_slot *next;
    kvli_cuda_blk_t *host;           /* pinned */
    CUdeviceptr dev;
    size_t cap;                      /* blocks */
    CUevent ev;
    uint32_t *flag;                  /* host word the kernel writes seq to; NULL: none */
    CUdeviceptr flag_dev, ctr;       /* the word as the GPU sees it; its CTA counter */
    uint32_t seq;                    /* last value a launch was given */
    /* batch fallback arrays (host) */
    CUdeviceptr *bsrc, *bdst;
    size_t *bsize;
} kvli_cuda_slot_t;

/* A descriptor table's memory: pinned host copy and device copy of the
 * same capacity, reused across transfers (allocating pinned memory costs
 * about a millisecond, more than moving a request's blocks). */
typedef struct kvli_cuda_tab {
    struct kvli_cuda_tab *next;
    kvli_cuda_blk_t *host;           /* pinned */
    CUdeviceptr dev;
    CUdeviceptr hmap;                /* host, as the GPU reads it in place; 0: not mapped */
    size_t cap;                      /* bytes, a power of two */
    int ordinal;                     /* the device dev lies on */
} kvli_cuda_tab_t;

#define KVLI_CUDA_TABS_KEPT 16       /* free tables kept per device */

/* A prepared list's addresses on one GPU (remote ones translated to their
 * mappings here), kept in the list's backend slot until ptab_release: made
 * when the list is prepared (ptab_prepare), else at its first indexed
 * transfer. */
typedef struct kvli_cuda_ptab {
    int dev;
    size_t n;
    CUdeviceptr addrs;
} kvli_cuda_ptab_t;
#define KVLI_CUDA_TAB_WARM (2u << 20) /* made at VRAM registration: 87381 blocks */

typedef struct kvli_cuda_devres {
    int ready;                       /* 1 ok, -1 failed (text says why) */
    char text[256];
    CUstream streams[KVLI_CUDA_STREAMS];
    unsigned next_stream;
    CUmodule mod;
    CUfunction fn;                   /* NULL: batched copies */
    CUfunction fn_idx;               /* kvl_gather_idx; NULL: indexed transfers expand */
    CUfunction fn_idx_warp;          /* kvl_gather_idx_warp; NULL: fn_idx for all */
    CUfunction fn_inline;            /* kvl_gather_inline; NULL: small tables uploaded */
    CUfunction fn_idx_inline;        /* kvl_gather_idx_inline; NULL: indices uploaded */
    int kernels_warm;                /* launched once at registration (under iface->lock) */
    kvli_cuda_slot_t *free_slots;    /* under iface->lock */
    kvli_cuda_tab_t *free_tabs;      /* under iface->lock */
    unsigned n_free_tabs;
    uint32_t *flags;                 /* KVLI_CUDA_FLAGS host words (pinned, mapped); NULL: none */
    CUdeviceptr flags_dev, ctrs;     /* the words on the GPU; the slots' CTA counters */
    unsigned nflags;                 /* handed to slots (under iface->lock) */
} kvli_cuda_devres_t;

typedef struct kvli_cuda_unit {
    kvli_cuda_slot_t *slot;
    int dev;
    uint32_t seq;                    /* 0: the event tells the end; else the slot's word */
} kvli_cuda_unit_t;

/*
 * Per transfer, kept in x->bk_priv across postings (freed by xfer_release):
 * what the first posting learned about the regions and, for the gather
 * kernel, the whole descriptor table on the GPU with the remote addresses
 * already translated (mappings never move while the transfer holds them),
 * cut into launch units. A re-post launches from it: no host table work.
 */
typedef struct kvli_cuda_xcache {
    uint32_t nl, nr;                 /* regions the segments use */
    int dev, all_gpu;
    int ready;                       /* table uploaded (or being uploaded) */
    /* Indexed (x->nidx > 0): tab holds the two index arrays (pairs u32 each);
     * the address tables are the lists' (kvli_cuda_ptab_t); units count pairs. */
    int indexed;
    uint32_t up_units;               /* units whose indices are on the GPU */
    int tab_lent;                    /* tab is the transfer's index memory (idx_alloc):
                                        the core gives it back (idx_free), not xc_free */
    CUdeviceptr stab, dtab;          /* source / destination address tables */
    kvli_cuda_tab_t *tab;            /* npieces descriptors, host and device */
    /* Small: no tab; the launch carries the table: inl (the descriptors), or
     * for an indexed transfer the indices, from x->lidx / x->ridx. */
    kvli_cuda_inline_tab_t *inl;
    int idx_inline;
    uint64_t npieces;
    uint64_t *unit_end;              /* unit u covers pieces [end[u-1], end[u]) */
    uint64_t *unit_bytes;
    uint32_t nunits;
} kvli_cuda_xcache_t;

typedef struct kvli_cuda_xpriv {
    struct kvli_cuda_xpriv *next;
    kvl_bk_xfer_t *x;
    kvli_cuda_peer_t *peer;
    int dev;                         /* executing device */
    CUstream stream;
    int use_kernel;
    kvli_cuda_xcache_t *xc;          /* cached table (kernel path), else NULL */
    uint32_t unit;                   /* with xc: next unit to launch */
    int staged;                      /* with xc: this posting uploaded the table */
    kvli_chunk_cur_t cur;            /* the next piece to enqueue (common/chunk.h) */
    uint64_t enq_bytes;
    unsigned inflight;
    kvli_cuda_unit_t units[KVLI_CUDA_WINDOW];
    unsigned u_head, u_count;
    uint64_t t_post;                 /* kvli_clock_ns() at posting */
    atomic_int cancel;
    int failed;
    kvl_status_t fail_status;
    kvl_error_t *fail_err;
    int completing, done;
    unsigned waiters;
} kvli_cuda_xpriv_t;

struct kvli_cuda_iface {
    kvl_bk_ctx_t *ctx;
    const kvli_cuda_drv_t *drv;
    uint64_t timeout_ms;
    int pin_host;                    /* param pin_host: KVLI_CUDA_PINH_* */
    int kernel_off;                  /* param kernel=auto|off */
    char boot_id[40];
    struct sockaddr_un addr;
    socklen_t addrlen;
    char sock_name[108];
    int listen_fd;
    kvli_accept_backoff_t accept_bo; /* progress thread only: paused when out of fds */
    kvli_progress_t pg;              /* progress thread, wake fd, stop flag */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* Whoever advances posted transfers' units holds it: the progress
     * thread, or a caller testing its transfer (kvli_cuda_xfer_poll). */
    pthread_mutex_t prog_lock;
    kvli_cuda_peer_t *peers;
    kvli_cuda_conn_t *conns;         /* progress thread only */
    kvli_cuda_xpriv_t *xfers;        /* posted, not finished */
    kvli_cuda_devres_t dres[KVLI_CUDA_MAX_DEVICES];
    uint8_t *scratch;
    size_t scratch_len;
    /* pin_host=auto: the pin thread and its queue (cuda_pin.c) */
    pthread_mutex_t pin_lock;
    pthread_cond_t pin_cond;
    kvli_cuda_mh_t *pin_head, *pin_tail;
    pthread_t pin_thread;
    int pin_started, pin_stop;
    int pin_idle;                    /* the thread waits for work: wake it */
};

kvl_status_t kvli_cuda_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err);
void kvli_cuda_xfer_cancel(void *bk, kvl_bk_xfer_t *x);
void kvli_cuda_xfer_release(void *bk, kvl_bk_xfer_t *x);
/* Advance transfers (iface->prog_lock held); returns how many are in flight,
 * *young_p whether one of them was posted less than KVLI_CUDA_SPIN_NS ago. */
unsigned kvli_cuda_xfer_progress(kvli_cuda_iface_t *iface, int *young_p);
/* ops->progress: the same from a caller's thread, if no one else is at it. */
void kvli_cuda_xfer_poll(void *bk);
void kvli_cuda_xfer_cancel_peer(kvli_cuda_iface_t *iface, kvli_cuda_peer_t *peer);
void kvli_cuda_xfer_warm(kvli_cuda_iface_t *iface, int dev);
void kvli_cuda_ptab_release(void *bk, void *cache);
void *kvli_cuda_idx_alloc(void *bk, void *const *lmh, size_t nlmh, size_t bytes, void **cookie_p);
void kvli_cuda_idx_free(void *bk, void *ptr, void *cookie);
void kvli_cuda_ptab_prepare(void *bk, const kvl_bk_ptab_t *t, void *const *mh, int remote,
                            void **cache_p);
void kvli_cuda_xfer_devres_fini(kvli_cuda_iface_t *iface);

/* ---- cuda_stage.c: staging for host-only backends (no backend handle) ---- */
kvl_status_t kvli_cuda_stage_check(kvl_mem_kind_t kind, int32_t dev, kvl_error_t *err);
kvl_status_t kvli_cuda_stage_host_alloc(size_t len, void **ptr_p, kvl_error_t *err);
void kvli_cuda_stage_host_free(void *ptr);
kvl_status_t kvli_cuda_stage_copy(int to_host, const kvl_stage_piece_t *p, size_t n,
                                  void (*notify)(void *arg), void *arg, void **ticket_p,
                                  kvl_error_t *err);
int kvli_cuda_stage_test(void *ticket, int wait, kvl_error_t *err);
/* Device dev's primary context current on this thread (pushed), for a
 * host-only backend calling a CUDA library (cuFile); leave pops it. */
kvl_status_t kvli_cuda_stage_enter(int32_t dev, kvl_error_t *err);
void kvli_cuda_stage_leave(void);

/* ---- cuda_iface.c ---- */

#endif
