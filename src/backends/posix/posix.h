/*
 * kvlane posix backend: KV offload between host memory and files the
 * application opened (FILE memory).
 *
 * Objects:
 *   iface  - one per open(): the engine (io_uring ring driven by the shared
 *            progress thread, or a pool of pread/pwrite threads when the
 *            kernel refuses io_uring), the queue of posted transfers.
 *   mh     - one per registered range: DRAM (a host range) or FILE (fd,
 *            offset, how the fd was opened: O_DIRECT, access mode, the
 *            alignment O_DIRECT needs, a path for messages).
 *   op     - one read or write of one contiguous piece (<= 1 GiB).
 *   xpriv  - per transfer (x->bk_priv), kept across postings: its ops, made
 *            and checked at the first posting (alignment, access mode).
 *
 * Files are local: the remote side of a transfer is this agent's own FILE
 * registrations (the core hands their handles as rmh); peers never reach
 * them.
 *
 * Locking: iface->lock guards the queue and every xpriv's counters. The
 * progress thread (io_uring) or the pool threads take ops under it and do
 * the I/O outside it; xfer_done is called without it.
 */
#ifndef KVLI_POSIX_H
#define KVLI_POSIX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include <kvlane/backend.h>
#include "common/progress.h"
#include "posix_cufile.h"
#ifdef KVL_HAVE_LIBURING
#include <liburing.h>
#endif

#define KVLI_POSIX_NAME "posix"
#define KVLI_POSIX_OP_MAX (1u << 30)     /* bytes per read/write */
#define KVLI_POSIX_QD_DEFAULT 64u
#define KVLI_POSIX_THREADS_DEFAULT 8u
#define KVLI_POSIX_STAGERS_DEFAULT 4u    /* VRAM staging threads, one buffer each */
#define KVLI_POSIX_STAGE_CHUNK (4u << 20) /* bytes per staged piece */
#define KVLI_POSIX_FIXED_SLOTS 1024u     /* io_uring fixed buffers (registered DRAM regions) */
#define KVLI_POSIX_FIXED_LEN (1ull << 30) /* the kernel's bound per fixed buffer */
#define KVLI_POSIX_FIXED_MIB_DEFAULT 4096u /* pinned for fixed buffers, at most */
#define KVLI_POSIX_FILE_SLOTS 1024u      /* io_uring registered files (FILE regions' files) */

enum { KVLI_POSIX_URING = 1, KVLI_POSIX_POOL = 2 };
/* parameter gds */
enum { KVLI_POSIX_GDS_AUTO = 0, KVLI_POSIX_GDS_ON = 1, KVLI_POSIX_GDS_OFF = 2 };
/* iface->gds_state: staged only (why in gds_why), libcufile loaded and the
 * driver not opened yet, driver open with nvidia-fs, or in compatibility mode */
enum {
    KVLI_POSIX_GDS_NONE = 0,
    KVLI_POSIX_GDS_LOADED = 1,
    KVLI_POSIX_GDS_UP = 2,
    KVLI_POSIX_GDS_COMPAT = 3
};

typedef struct kvli_posix_mh {
    kvl_mem_kind_t kind;
    uint64_t addr, len;              /* FILE: the core's key */
    int32_t dev;                     /* VRAM: the device ordinal */
    int fd;                          /* FILE */
    uint64_t off;                    /* FILE: file offset of addr */
    bool direct, can_read, can_write;
    uint32_t dio_mem, dio_off;       /* O_DIRECT: alignment of memory and of offset/len */
    char path[256];                  /* for messages: /proc/self/fd/N resolved */
    int buf_index;                   /* DRAM: its io_uring fixed buffer, -1 none */
    int file_index;                  /* FILE: its io_uring registered file, -1 none */
    /* GPUDirect Storage (posix_gds.c), under iface->gds_lock */
    bool gds_buf;                    /* VRAM: cuFileBufRegister'ed */
    int gds_st;                      /* FILE: cuFile handle 0 not tried, 1 registered, -1 failed */
    kvli_cufile_handle_t gds_fh;
    char gds_why[320];               /* FILE: the path VRAM transfers with it take, and why */
} kvli_posix_mh_t;

typedef struct kvli_posix_op {
    int fd;
    uint32_t len, done;              /* bytes; done: moved so far */
    uint64_t off;                    /* file offset */
    char *buf;                       /* staged: a device address */
    bool staged;                     /* VRAM: through a pinned buffer (posix_stage.c) */
    bool gds;                        /* VRAM: through cuFile instead (posix_gds.c) */
    int32_t dev;
    const kvli_posix_mh_t *fmh;      /* the file range, for messages */
    const kvli_posix_mh_t *vmh;      /* VRAM: the device range */
    int buf_index;                   /* io_uring fixed buffer holding buf, -1 none */
    int file_index;                  /* io_uring registered file of fd, -1 none */
    struct kvli_posix_xpriv *xp;
    struct kvli_posix_op *retry;     /* short transfer: resubmitted from done */
} kvli_posix_op_t;

typedef struct kvli_posix_xpriv {
    kvl_bk_xfer_t *x;
    kvli_posix_op_t *ops;
    size_t nops;
    /* per posting, under iface->lock */
    size_t next, completed, inflight;
    kvli_posix_op_t *retry;
    bool queued, running, canceled, failed;
    bool staged;                     /* local side VRAM: the staging threads move it */
    kvl_status_t status;
    kvl_status_t fail_code;          /* with failed */
    kvl_error_t *err;                /* why, allocated at the first failure (36 KiB);
                                      * NULL without memory for it */
    struct kvli_posix_xpriv *qnext;
} kvli_posix_xpriv_t;

typedef struct kvli_posix_iface {
    kvl_bk_ctx_t *ctx;
    int engine;                      /* KVLI_POSIX_URING or _POOL */
    char engine_why[384];            /* why the pool, when it is */
    unsigned qd, nthreads;
    bool sqpoll;
    pthread_mutex_t lock;
    pthread_cond_t cond;             /* pool: work; all: a transfer finished */
    kvli_posix_xpriv_t *qhead, *qtail;
    bool stop;
#ifdef KVL_HAVE_LIBURING
    struct io_uring ring;
    bool ring_up;
    unsigned ring_inflight;
    /* Fixed buffers: DRAM regions registered with the ring (pinned once, so
     * no operation pins its pages again). Slots and bytes under lock. */
    bool fixed_up;
    uint8_t fixed_used[KVLI_POSIX_FIXED_SLOTS];
    uint64_t fixed_bytes;
    /* Registered files: the files of FILE regions in the ring's file table
     * (no reference taken and dropped per operation). One slot per open
     * file, shared by its regions; under lock. */
    bool files_up;
    struct {
        int fd;
        dev_t dev;
        ino_t ino;
        int flags;                     /* the open file's status flags (F_GETFL) */
        unsigned refs;                 /* 0: free */
    } files[KVLI_POSIX_FILE_SLOTS];
#endif
    char files_why[160];             /* why FILE regions are not registered files */
    uint64_t fixed_max;              /* parameter fixed_buffers_mib, in bytes (0: off) */
    char fixed_why[256];             /* why regions are not fixed buffers, "" when they are */
    kvli_progress_t pg;
    pthread_t *threads;
    unsigned nstarted;
    /* VRAM staging (posix_stage.c): started at the first staged posting */
    pthread_mutex_t stage_lock;
    unsigned nstagers;
    size_t stage_chunk;
    void **stage_bufs;
    pthread_t *stagers;
    unsigned nstage_started;
    bool stage_up;
    bool stage_quit;                 /* under lock: the stagers leave */
    /* GPUDirect Storage (posix_gds.c) */
    int gds_mode;                    /* parameter gds: KVLI_POSIX_GDS_AUTO/ON/OFF */
    pthread_mutex_t gds_lock;        /* gds_state, gds_why, the regions' gds_* */
    int gds_state;                   /* KVLI_POSIX_GDS_NONE ... */
    bool gds_drv;                    /* holds the process's cuFile driver session */
    const kvli_cufile_api_t *cf;     /* libcufile's entry points, when loaded */
    char gds_why[384];               /* what VRAM <-> FILE uses, or why it is staged */
} kvli_posix_iface_t;

/* Under iface->lock: mark xp failed with code; where to write why (NULL:
 * no memory for it, the core then words the failure from the code). */
kvl_error_t *kvli_posix_xp_fail(kvli_posix_xpriv_t *xp, kvl_status_t code);

/* posix_engine.c */
/* The file of a FILE region in the ring's file table: its slot (shared by
 * the regions of one open file), or -1 with why. */
int kvli_posix_file_add(kvli_posix_iface_t *iface, int fd, char *why, size_t cap);
void kvli_posix_file_del(kvli_posix_iface_t *iface, int slot);

/* A DRAM region as an io_uring fixed buffer: its slot, or -1 with why
 * (the region still works, through ordinary reads and writes). */
int kvli_posix_fixed_add(kvli_posix_iface_t *iface, uint64_t addr, uint64_t len, char *why,
                         size_t cap);
void kvli_posix_fixed_del(kvli_posix_iface_t *iface, int slot, uint64_t len);
kvl_status_t kvli_posix_engine_open(kvli_posix_iface_t *iface, const char *want,
                                    kvl_error_t *err);
void kvli_posix_engine_close(kvli_posix_iface_t *iface);
/* Queue a transfer (its counters reset) and wake the engine. */
void kvli_posix_engine_queue(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp);

/* posix_xfer.c */
kvl_status_t kvli_posix_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err);
void kvli_posix_xfer_cancel(void *bk, kvl_bk_xfer_t *x);
void kvli_posix_xfer_release(void *bk, kvl_bk_xfer_t *x);
/* One op finished with res (bytes moved, or -errno) under iface->lock;
 * returns true when its transfer is now finished (caller calls
 * kvli_posix_xfer_finish without the lock). */
bool kvli_posix_op_done(kvli_posix_iface_t *iface, kvli_posix_op_t *op, long long res);
/* Next op to run, under iface->lock, of a staged (VRAM) transfer or not;
 * NULL when none. */
kvli_posix_op_t *kvli_posix_op_next(kvli_posix_iface_t *iface, bool staged);
/* Bytes moved by pread/pwrite from buf (all, or -errno; a READ returns
 * fewer at the end of the file). */
long long kvli_posix_rw(int fd, char *buf, size_t len, uint64_t off, int write);

/* posix_stage.c */
/* Register VRAM: can the core's staging service copy it? GPUDirect Storage? */
kvl_status_t kvli_posix_stage_reg(kvli_posix_iface_t *iface, const kvl_region_info_t *r,
                                  kvli_posix_mh_t *mh, char *detail, size_t detail_len,
                                  kvl_error_t *err);
/* Start the staging threads and their pinned buffers once. */
kvl_status_t kvli_posix_stage_start(kvli_posix_iface_t *iface, kvl_error_t *err);
void kvli_posix_stage_stop(kvli_posix_iface_t *iface);
/* Called without the lock for a finished transfer: xfer_done, then marks
 * it not running (a cancel or release waits for that). */
void kvli_posix_xfer_finish(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp);
/* Under the lock: true when xp has nothing in flight and nothing left to
 * start (done, failed or canceled); removes it from the queue. */
bool kvli_posix_xfer_check_end(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp);

/* posix_gds.c */
/* Parameter gds (what names it in the error: "parameter gds", "KVL_POSIX_GDS"). */
kvl_status_t kvli_posix_gds_mode(const char *what, const char *v, int *mode_p, kvl_error_t *err);
/* At open: load libcufile unless gds is off (off_by: what turned it off). */
void kvli_posix_gds_probe(kvli_posix_iface_t *iface, const char *off_by);
/* kvlane doctor, VRAM: libcufile and nvidia-fs (the driver is not opened). */
void kvli_posix_gds_doctor(void (*report)(void *arg, const char *check, int status,
                                          const char *observed, const char *hint),
                           void *arg);
/* Release the cuFile driver session at close. */
void kvli_posix_gds_close(kvli_posix_iface_t *iface);
/* A VRAM registration: open the driver (first time), register the buffer;
 * what gets the path and why, *gds_p whether cuFile serves it. An error only
 * with gds=on. */
kvl_status_t kvli_posix_gds_vram(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh, char *what,
                                 size_t cap, bool *gds_p, kvl_error_t *err);
/* A FILE registration: its cuFile handle when the driver is open; appends
 * what VRAM transfers with it will use to detail. */
void kvli_posix_gds_file(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh, char *detail,
                         size_t cap);
/* A VRAM <-> FILE transfer's first posting: cuFile for f or not (*gds_p);
 * an error only with gds=on. */
kvl_status_t kvli_posix_gds_use(kvli_posix_iface_t *iface, kvli_posix_mh_t *f,
                                const kvli_posix_mh_t *v, bool write, bool *gds_p,
                                kvl_error_t *err);
/* Deregistration: the handle or the buffer back to cuFile. */
void kvli_posix_gds_dereg(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh);
/* One piece through cuFileRead/cuFileWrite (staging thread): its bytes, or
 * -1 with e filled. */
long long kvli_posix_gds_piece(kvli_posix_iface_t *iface, const kvli_posix_op_t *op, int write,
                               kvl_error_t *e);

#endif
