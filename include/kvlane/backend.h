/*
 * kvlane: backend ABI. A backend (transport) fills one kvl_backend_ops_t.
 * Built-in backends register statically; modules export
 *     const kvl_backend_ops_t *kvl_backend_module_v1(void);
 * The table starts with its ABI version and size: slots are only ever
 * appended, and the core never calls a slot beyond the size a backend was
 * built with (a missing slot means "not supported").
 * Three roles, three places: the transport slots (kvl_backend_ops_t), the
 * device services of built-in device backends (kvl_device_ops_t, reached
 * through ops->device), and what the core lends every backend (kvl_bk_ctx_t).
 * ABI 2 moved mem_query and the stage_* slots into kvl_device_ops_t.
 */
#ifndef KVLANE_BACKEND_H
#define KVLANE_BACKEND_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <kvlane/status.h>
#include <kvlane/error.h>
#include <kvlane/log.h>
#include <kvlane/agent.h>
#include <kvlane/memory.h>
#include <kvlane/notif.h>
#include <kvlane/xfer.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVL_BACKEND_ABI_VERSION 2u
#define KVL_BK_CONN_MAX 4096    /* room conn_pack gets */
#define KVL_BK_KEY_MAX 1024     /* room region_pack gets */

#define KVL_MEM_BIT(kind) (1u << (unsigned)(kind))

enum {
    KVL_BK_CAP_NOTIF = 1u << 0,       /* carries notifications */
    KVL_BK_CAP_SAME_HOST = 1u << 1,   /* reaches peers on this host only */
    /* VRAM in mem_local/mem_remote is staged through host memory: transfers
     * touching VRAM pick it only when no backend reaches VRAM directly */
    KVL_BK_CAP_STAGED_VRAM = 1u << 2,
    /* takes indexed transfers (kvl_bk_xfer_t.nidx > 0, see kvl_bk_ptab_t):
     * it moves them from the index arrays, or calls ctx->xfer_expand first */
    KVL_BK_CAP_INDEXED = 1u << 3
};

/*
 * FILE regions and segments: the core keys a FILE range (fd, offset) as an
 * address of its own (bit 63 set, the fd above bit 40); kvl_region_info_t.dev
 * is the fd, and the file offset of any address in it is this.
 */
static inline uint64_t kvl_bk_file_offset(uint64_t addr)
{
    return addr & (KVL_FILE_OFFSET_MAX - 1);
}

/*
 * Copy src (NULL: "") into dst of cap bytes, cut to fit, NUL-terminated:
 * for constant texts such as a registration's detail, instead of
 * snprintf("%s"), which is three times slower in processes that load
 * libquadmath, as NumPy's BLAS does through libgfortran (its printf
 * handlers send every format down glibc's slow path). The core's
 * kvli_scopy is this.
 */
static inline void kvl_bk_scopy(char *dst, size_t cap, const char *src)
{
    size_t n;
    if (dst == NULL || cap == 0)
        return;
    n = src ? strnlen(src, cap - 1) : 0;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

/* A registered range as the core sees it. */
typedef struct kvl_region_info {
    uint64_t addr;
    uint64_t len;
    kvl_mem_kind_t kind;
    int32_t dev;                  /* FILE: the file descriptor */
    /* When the range lies in a kvl_mem_alloc() allocation: its memfd, the
     * offset of addr inside the memfd and the allocation's size. fd -1 else. */
    int shm_fd;
    uint64_t shm_id;              /* allocation id, unique within the agent */
    uint64_t shm_off;
    uint64_t shm_size;
} kvl_region_info_t;

/*
 * One paired piece of a transfer: count blocks of len bytes; block j is at
 * laddr + j*lstride locally and raddr + j*rstride remotely. lreg/rreg index
 * the transfer's lmh/rmh arrays (the regions the blocks lie in).
 */
typedef struct kvl_seg {
    uint64_t laddr, raddr, len, count;
    uint64_t lstride, rstride;
    uint32_t lreg, rreg;
} kvl_seg_t;

/*
 * One copy of a staging request: device memory (VRAM) <-> a pinned host
 * buffer. Host-only backends move VRAM this way (see the stage_* slots).
 */
typedef struct kvl_stage_piece {
    uint64_t dev_addr;            /* device address */
    void *host;                   /* inside a buffer from stage_host_alloc */
    uint64_t len;
    int32_t dev;                  /* the device's ordinal in this process */
} kvl_stage_piece_t;

/*
 * A prepared list as an indexed transfer sees it: n entries, each one block
 * of len bytes; entry i is at addrs[i] inside region regs[i], an index into
 * the transfer's lmh (local list) or rmh (remote list), which then hold
 * every region of the list in its order (nregs of them). The same list
 * serves many transfers: its id is unique in the agent, and a backend may
 * keep data derived from it (device copies of the addresses) in the slot the
 * transfer points to (ltab_cache / rtab_cache); the core hands that back to
 * ptab_release when the list is freed.
 */
typedef struct kvl_bk_ptab {
    uint64_t id;
    size_t n;
    uint64_t len;
    const uint64_t *addrs;
    const uint32_t *regs;
    size_t nregs;
} kvl_bk_ptab_t;

typedef struct kvl_bk_xfer kvl_bk_xfer_t;
struct kvl_bk_xfer {
    kvl_xfer_op_t op;
    void *peer;                   /* backend's handle from peer_load */
    const kvl_seg_t *segs;
    size_t nsegs;
    uint64_t total_bytes;
    void *const *lmh;             /* backend's local region handles */
    void *const *rmh;             /* backend's remote region handles */
    const void *notif;            /* delivered after the data, only on success */
    size_t notif_len;
    uint64_t timeout_ms;          /* bound once the peer stops answering */
    void *core;                   /* the core's, do not touch */
    void *bk_priv;                /* the backend's */
    char path[64];                /* backend writes the path it used */
    /*
     * Indexed transfers (KVL_BK_CAP_INDEXED backends only): nidx > 0 and
     * nsegs == 0 until ctx->xfer_expand fills segs. Pair k moves entry
     * lidx[k] of ltab with entry ridx[k] of rtab (equal lengths; indices
     * checked against n; ridx == lidx + nidx, one array). *ltab_cache /
     * *rtab_cache: the backend's slots for
     * the two lists (NULL until it sets them; set each at most once, under
     * its own lock: lists are shared by transfers on several threads).
     */
    const kvl_bk_ptab_t *ltab, *rtab;
    const uint32_t *lidx, *ridx;
    size_t nidx;
    void **ltab_cache, **rtab_cache;
    /* lidx lies in memory this backend lent (idx_alloc): its cookie; NULL
     * when the core's. */
    void *idx_cookie;
};

typedef struct kvl_bk_ctx kvl_bk_ctx_t;
struct kvl_bk_ctx {
    uint32_t size;                /* sizeof(kvl_bk_ctx_t) of the core */
    const char *agent_name;
    uint64_t incarnation;
    uint64_t timeout_ms;
    unsigned workers;
    void *core;                   /* the core's, do not touch */
    /* Log on behalf of the backend (component = backend name). */
    void (*log)(kvl_bk_ctx_t *ctx, kvl_log_level_t level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* Completion of a posted transfer; exactly once per posting. status is
     * KVL_OK, KVL_ERR_CANCELED or an error (err filled). */
    void (*xfer_done)(kvl_bk_xfer_t *x, kvl_status_t status, const kvl_error_t *err);
    /* Hand a received notification to the agent; when its queue is full
     * the notification is dropped with a warning in the log: backends that
     * can tell the sender use notif_offer (below) instead. */
    void (*notif_deliver)(kvl_bk_ctx_t *ctx, const char *from, const void *msg,
                          size_t len);
    /*
     * Target side: is [addr, addr+len) inside memory this agent registered on
     * this backend? On success the region is pinned (cannot be deregistered)
     * until region_unpin(*pin_p). *mh_p gets the backend's handle.
     */
    kvl_status_t (*region_pin)(kvl_bk_ctx_t *ctx, uint64_t addr, uint64_t len,
                               void **mh_p, void **pin_p, kvl_error_t *err);
    void (*region_unpin)(kvl_bk_ctx_t *ctx, void *pin);
    /* Shareable allocation containing addr (kvl_mem_alloc), matched by the id
     * the region key carries. KVL_ERR_NOT_FOUND when none, or when no memory
     * inside it is registered on this backend (only what the user registered
     * is handed to peers). */
    kvl_status_t (*alloc_lookup)(kvl_bk_ctx_t *ctx, uint64_t alloc_id, int *fd_p,
                                 uint64_t *size_p);

    /*
     * Staging, for a backend that moves host memory only: the core lends it
     * the built-in device backend's copies between VRAM and pinned host
     * buffers. Present when ctx->size covers them.
     *
     * stage_check: can memory of this kind on this device be staged here?
     * KVL_OK, or the reason (no CUDA driver, no such device) in err.
     */
    kvl_status_t (*stage_check)(kvl_bk_ctx_t *ctx, kvl_mem_kind_t kind, int32_t dev,
                                kvl_error_t *err);
    /* Pinned host memory for the copies (portable: every device reaches it). */
    kvl_status_t (*stage_host_alloc)(kvl_bk_ctx_t *ctx, size_t len, void **ptr_p,
                                     kvl_error_t *err);
    void (*stage_host_free)(kvl_bk_ctx_t *ctx, void *ptr);
    /* Start n copies, device -> host when to_host, else host -> device.
     * *ticket_p is tested with stage_test. notify(arg), when not NULL, is
     * called from a driver thread once every copy is done and before the
     * ticket tests done: it may only wake someone (write an eventfd). */
    kvl_status_t (*stage_copy)(kvl_bk_ctx_t *ctx, int to_host, const kvl_stage_piece_t *p,
                               size_t n, void (*notify)(void *arg), void *arg,
                               void **ticket_p, kvl_error_t *err);
    /* 1: the copies are done; 0: pending (only when wait is 0); -1: failed,
     * err says why. After 1 or -1 the ticket is gone. */
    int (*stage_test)(kvl_bk_ctx_t *ctx, void *ticket, int wait, kvl_error_t *err);
    /*
     * Indexed transfers: pair x's indices into segments now (x->segs and
     * x->nsegs are filled, owned by the core, kept across postings), for a
     * backend that cannot move this one from indices. Not while x is being
     * moved. KVL_OK, or KVL_ERR_NO_MEMORY / KVL_ERR_INVALID_ARG in err.
     */
    kvl_status_t (*xfer_expand)(kvl_bk_ctx_t *ctx, kvl_bk_xfer_t *x, kvl_error_t *err);
    /* The agent's shared secret (kvl_agent_config_t.secret), NULL / 0 when
     * none: peers that connect must prove it, as must those we connect to. */
    const uint8_t *secret;
    size_t secret_len;
    /*
     * Hand a received notification to the agent, within its bound (total
     * bytes and count of notifications the application has not taken yet).
     * KVL_OK: queued. KVL_ERR_REMOTE_FULL (the queue is full) or
     * KVL_ERR_NO_MEMORY: refused, nothing queued, why gets the text to send
     * back to the sender (what the bound is, what the target must do).
     * A backend that can answer its sender calls this, never notif_deliver
     * (which refuses silently but for a log line). Present when ctx->size
     * covers it.
     */
    kvl_status_t (*notif_offer)(kvl_bk_ctx_t *ctx, const char *from, const void *msg,
                                size_t len, char *why, size_t why_len);
    /*
     * Grants, so that a peer need not wait for an answer to every
     * notification: room for `slots` notifications of at most slot_len bytes
     * each, reserved in the queue's bound for one connection. notif_reserve
     * tops a connection (of agent `from`) that holds `held` unused slots up
     * to the agent's per-peer grant, within the room left (in the bound and
     * in that peer's share); it returns how many it added
     * (0: none, the queue is (nearly) full). notif_offer_reserved queues a
     * notification (len <= slot_len) in one of them: never refused for room
     * (KVL_ERR_NO_MEMORY only when malloc fails: logged, the slot is freed).
     * notif_unreserve gives unused slots back (the connection closed).
     * Present when ctx->size covers them.
     */
    uint32_t (*notif_reserve)(kvl_bk_ctx_t *ctx, const char *from, uint32_t held,
                              size_t slot_len);
    kvl_status_t (*notif_offer_reserved)(kvl_bk_ctx_t *ctx, const char *from, const void *msg,
                                         size_t len, size_t slot_len);
    void (*notif_unreserve)(kvl_bk_ctx_t *ctx, const char *from, uint32_t slots,
                            size_t slot_len);
    /*
     * For a host-only backend that calls a device library working in the
     * calling thread's current context (cuFile): make device dev's context
     * current (pushed; KVL_OK, or why not in err), and undo it (pop) on the
     * same thread. Present when ctx->size covers them and not NULL.
     */
    kvl_status_t (*stage_ctx_enter)(kvl_bk_ctx_t *ctx, int32_t dev, kvl_error_t *err);
    void (*stage_ctx_leave)(kvl_bk_ctx_t *ctx);
};

/*
 * Device services: what a built-in backend that owns a kind of device memory
 * (cuda) does for the core and for the other backends, apart from moving
 * bytes. No backend handle: they work whether or not the backend is created
 * on an agent. Every slot is optional; size says which exist.
 */
typedef struct kvl_device_ops {
    uint32_t size;                /* sizeof(kvl_device_ops_t) built against */
    /*
     * Claim memory of the backend's kind (CUDA pointers). KVL_OK with
     * kind/dev filled (info: a short description, e.g. "CUDA device 0, PCI
     * 0000:1b:00.0"); KVL_ERR_NOT_FOUND when the memory is not of its kind.
     * declared_dev is the caller's device (or KVL_DEV_ANY): on a mismatch, or
     * a range the memory cannot hold (crossing an allocation), return the
     * error with the full explanation. err may be NULL when the caller
     * needs only the answer (registering host memory): skip work that only
     * explains a KVL_ERR_NOT_FOUND; the caller asks again, with err, for
     * any other error.
     */
    kvl_status_t (*mem_query)(uint64_t addr, uint64_t len, int32_t declared_dev,
                              kvl_mem_kind_t *kind_p, int32_t *dev_p, char *info,
                              size_t info_len, kvl_error_t *err);
    /* The staging service the core lends to host-only backends through
     * kvl_bk_ctx_t's stage_* members; same contracts (all five or none). */
    kvl_status_t (*stage_check)(kvl_mem_kind_t kind, int32_t dev, kvl_error_t *err);
    kvl_status_t (*stage_host_alloc)(size_t len, void **ptr_p, kvl_error_t *err);
    void (*stage_host_free)(void *ptr);
    kvl_status_t (*stage_copy)(int to_host, const kvl_stage_piece_t *p, size_t n,
                               void (*notify)(void *arg), void *arg, void **ticket_p,
                               kvl_error_t *err);
    int (*stage_test)(void *ticket, int wait, kvl_error_t *err);
    /* kvl_bk_ctx_t's stage_ctx_enter/stage_ctx_leave (both or none). */
    kvl_status_t (*ctx_enter)(int32_t dev, kvl_error_t *err);
    void (*ctx_leave)(void);
} kvl_device_ops_t;

/*
 * A backend: one transport (open ... notif_send, the optional slots after)
 * and, for built-in device backends, its device services. Optional slots
 * may be NULL; the core copies the table once at load (to its own size, so
 * slots a backend was built without read NULL) and tests for NULL.
 */
typedef struct kvl_backend_ops {
    uint32_t abi_version;         /* KVL_BACKEND_ABI_VERSION */
    uint32_t size;                /* sizeof(kvl_backend_ops_t) built against */
    const char *name;
    const char *description;
    uint32_t mem_local;           /* KVL_MEM_BIT()s served locally */
    uint32_t mem_remote;          /* KVL_MEM_BIT()s reachable remotely */
    uint32_t caps;                /* KVL_BK_CAP_* */
    const kvl_param_t *params;    /* {key, default} list, NULL-terminated */

    /* Can it run here? KVL_OK or a status with the reason. */
    kvl_status_t (*available)(char *reason, size_t len);
    kvl_status_t (*open)(kvl_bk_ctx_t *ctx, const kvl_param_t *params, size_t n,
                         void **bk_p, kvl_error_t *err);
    /* Called after every peer, region and transfer was released. */
    void (*close)(void *bk);

    /* Register a local range; detail gets the path, e.g. "cma + mmap"
     * (detail_len 0: the caller asked for no report; format nothing). */
    kvl_status_t (*mem_reg)(void *bk, const kvl_region_info_t *r, void **mh_p,
                            char *detail, size_t detail_len, kvl_error_t *err);
    void (*mem_dereg)(void *bk, void *mh);

    /* Connection info and per-region keys for the metadata. */
    kvl_status_t (*conn_pack)(void *bk, uint8_t *buf, size_t cap, size_t *len_p);
    kvl_status_t (*region_pack)(void *bk, void *mh, uint8_t *buf, size_t cap,
                                size_t *len_p);

    /* Remote side, from untrusted metadata: validate everything. */
    kvl_status_t (*peer_load)(void *bk, const char *name, uint64_t incarnation,
                              const uint8_t *conn, size_t len, void **peer_p,
                              kvl_error_t *err);
    /* Cancels in-flight transfers to the peer (xfer_done is called). */
    void (*peer_unload)(void *bk, void *peer);
    kvl_status_t (*rregion_load)(void *bk, void *peer, const kvl_region_info_t *r,
                                 const uint8_t *key, size_t len, void **rh_p,
                                 kvl_error_t *err);
    void (*rregion_unload)(void *bk, void *peer, void *rh);

    /* Start a transfer; completion through ctx->xfer_done (maybe before
     * return). A non-OK return means nothing moved and xfer_done is not called. */
    kvl_status_t (*xfer_post)(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err);
    /* Returns only once xfer_done was called for x: with KVL_ERR_CANCELED
     * (no more bytes will land) or with the status it completed with. When
     * bytes of x may still land (the peer stopped answering), that is an
     * error whose text says so and how many, never KVL_ERR_CANCELED. */
    void (*xfer_cancel)(void *bk, kvl_bk_xfer_t *x);

    kvl_status_t (*notif_send)(void *bk, void *peer, const void *msg, size_t len,
                               kvl_error_t *err);
    /* How the peer is reached, e.g. "cma" or "socket (cma refused: ...)". */
    void (*peer_describe)(void *bk, void *peer, char *buf, size_t len);

    /* Optional, built-in backends only: device services (see
     * kvl_device_ops_t); NULL for a backend that only moves bytes. */
    const kvl_device_ops_t *device;

    /*
     * Optional: preflight checks for `kvlane doctor`, without creating the
     * backend. Calls report once per check: status 0 ok, 1 warn, 2 fail;
     * observed is what was seen, hint the fix ("" when ok). planned_bytes is
     * the registration the user plans (0 if unknown), mem the kind.
     */
    void (*probe)(void (*report)(void *arg, const char *check, int status, const char *observed,
                                 const char *hint),
                  void *arg, kvl_mem_kind_t mem, int32_t dev, uint64_t planned_bytes);

    /*
     * Optional: the core is about to free a transfer that was posted at
     * least once (x is finished: never called while in flight). A backend
     * that keeps per-transfer state in x->bk_priv across postings (device
     * tables, registered iovecs) releases it here.
     */
    void (*xfer_release)(void *bk, kvl_bk_xfer_t *x);

    /*
     * Optional: allocate len bytes of host memory for the user
     * (kvl_mem_alloc_ex naming this backend), memory this backend's
     * transports reach better than application memory (UCX: its
     * shared-memory segments). *ptr_p gets the address, *ah_p the backend's
     * handle for mem_free; detail a short description ("ucp_mem_map
     * ALLOCATE, sysv segment"). The core registers nothing: the user
     * registers the memory (or ranges of it) afterwards, and mem_reg of a
     * range inside it must use the allocation's own registration.
     */
    kvl_status_t (*mem_alloc)(void *bk, size_t len, void **ptr_p, void **ah_p, char *detail,
                              size_t detail_len, kvl_error_t *err);
    /* Free what mem_alloc returned. The core calls it only when no
     * registered region lies in the allocation, and always before close. */
    void (*mem_free)(void *bk, void *ah);

    /*
     * Optional (KVL_BK_CAP_INDEXED backends): a prepared list is being freed;
     * cache is what the backend stored in its slot for it (never NULL here).
     * No transfer using the list is alive any more.
     */
    void (*ptab_release)(void *bk, void *cache);

    /*
     * Optional, for a backend whose peers reach registered memory without
     * asking this process (cross-memory attach, shared mappings): the core
     * is about to drop the region for good. revoke 1: stop every peer's
     * access and wait (bounded by ctx->timeout_ms) until no copy of theirs
     * is in progress: after KVL_OK no byte of theirs lands in it. On error
     * (KVL_ERR_IN_USE: a live peer is still copying) access is restored and
     * the deregistration fails. revoke 0: restore access (another backend
     * refused). mem_dereg follows a successful revoke.
     */
    kvl_status_t (*mem_revoke)(void *bk, void *mh, int revoke, kvl_error_t *err);

    /*
     * Optional: xfer_cancel for kvl_agent_destroy, which must not wait for a
     * peer that stopped answering. Returns once xfer_done was called for x,
     * without waiting for answers from the peer: requests of x still
     * unanswered are given up at once (the connection is reset or shut
     * down, so a kvlane target drops what it has not copied yet). x ends
     * with KVL_ERR_CANCELED only when none of its bytes can land, else with
     * an error that says how many may. Without it, destroy uses xfer_cancel.
     */
    void (*xfer_abort)(void *bk, kvl_bk_xfer_t *x);

    /*
     * Optional (KVL_BK_CAP_INDEXED backends): a uniform list was prepared
     * (kvl_prep_local / kvl_prep_remote) whose regions all have a handle on
     * this backend. Derive what its indexed transfers need now (the cuda
     * backend uploads the list's addresses to the GPU), so that the first
     * transfer after registration pays for none of it. mh holds the handle of
     * each of the t->nregs regions (local region handles, or remote ones when
     * remote is 1). Store the result in *cache_p (NULL on entry; the list is
     * not shared yet, no lock needed; ptab_release frees it), or leave it
     * NULL: nothing here is an error, transfers then derive it at their
     * first posting.
     */
    void (*ptab_prepare)(void *bk, const kvl_bk_ptab_t *t, void *const *mh, int remote,
                         void **cache_p);

    /*
     * Optional (KVL_BK_CAP_INDEXED backends, both or neither): memory for an
     * indexed transfer's index arrays, which the core fills when it creates
     * the transfer (checked, 2 * nidx uint32_t: lidx, then ridx) and the
     * backend reads when it posts it. The cuda backend lends pinned host
     * memory it uploads to the GPU from without another copy. lmh are the
     * transfer's nlmh local region handles (where its local blocks lie, so a
     * device backend lends memory for the device that will run it). Returns
     * at least bytes, *cookie_p for idx_free; NULL: the core uses its own
     * memory (kvl_bk_xfer_t.idx_cookie is then NULL). idx_free gives it back
     * when the transfer is freed, after xfer_release: nothing reads it.
     */
    void *(*idx_alloc)(void *bk, void *const *lmh, size_t nlmh, size_t bytes, void **cookie_p);
    void (*idx_free)(void *bk, void *ptr, void *cookie);

    /*
     * Optional: advance this backend's posted transfers in the calling
     * thread, as its progress thread does, without blocking. kvl_xfer_test
     * and kvl_xfer_wait call it while one of its transfers is in flight, so
     * a completion is seen (and xfer_done called) by the thread that asks,
     * not when the progress thread next runs. It must exclude the progress
     * thread and other callers itself (a try-lock: a caller that finds it
     * taken returns at once).
     */
    void (*progress)(void *bk);
} kvl_backend_ops_t;

/* ---- helpers for backends to fill errors (header-only, no symbols) ---- */

static inline void kvl_bk_error_set(kvl_error_t *err, kvl_status_t code, int sys_errno,
                                    const char *backend, int device, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static inline void kvl_bk_error_set(kvl_error_t *err, kvl_status_t code, int sys_errno,
                                    const char *backend, int device, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL)
        return;
    memset(err, 0, offsetof(kvl_error_t, causes));
    err->code = code;
    err->sys_errno = sys_errno;
    err->device = device;
    snprintf(err->backend, sizeof(err->backend), "%s", backend ? backend : "");
    va_start(ap, fmt);
    vsnprintf(err->what, sizeof(err->what), fmt, ap);
    va_end(ap);
}

/* err says "no error" (code KVL_OK, every text empty, no causes) without
 * clearing its 2 KiB of text: for a hot path that fills it only on failure. */
static inline void kvl_bk_error_none(kvl_error_t *err)
{
    if (err == NULL)
        return;
    err->code = KVL_OK;
    err->sys_errno = 0;
    err->device = -1;
    err->backend[0] = err->agent[0] = err->region[0] = '\0';
    err->what[0] = err->hint[0] = '\0';
    err->n_causes = err->n_causes_dropped = 0;
}

static inline void kvl_bk_error_hint(kvl_error_t *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void kvl_bk_error_hint(kvl_error_t *err, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(err->hint, sizeof(err->hint), fmt, ap);
    va_end(ap);
}

/*
 * Attach a lower error (the call this backend made that failed: a driver's,
 * another backend's) to err as a cause, whole, instead of pasting its text
 * into err->what. Call after kvl_bk_error_set (which clears the causes). The
 * lower error's own causes follow it, as far as room lasts.
 */
static inline kvl_error_cause_t *kvl_bk_error_cause_slot(kvl_error_t *err)
{
    if (err->n_causes >= KVL_ERROR_MAX_CAUSES) {
        err->n_causes_dropped++;
        return NULL;
    }
    return &err->causes[err->n_causes++];
}

static inline void kvl_bk_error_cause(kvl_error_t *err, const kvl_error_t *lower)
{
    kvl_error_cause_t *c;
    if (err == NULL || lower == NULL || lower->code == KVL_OK)
        return;
    if ((c = kvl_bk_error_cause_slot(err)) != NULL) {
        c->code = lower->code;
        c->sys_errno = lower->sys_errno;
        c->device = lower->device;
        snprintf(c->backend, sizeof(c->backend), "%s", lower->backend);
        snprintf(c->what, sizeof(c->what), "%s", lower->what);
        snprintf(c->hint, sizeof(c->hint), "%s", lower->hint);
    }
    for (unsigned i = 0; i < lower->n_causes && i < KVL_ERROR_MAX_CAUSES; i++)
        if ((c = kvl_bk_error_cause_slot(err)) != NULL)
            *c = lower->causes[i];
    err->n_causes_dropped += lower->n_causes_dropped;
}

/*
 * One way to fail a transfer, on every backend: the error handed to
 * ctx->xfer_done reads "<WRITE|READ> of <n> bytes with agent '<peer>'
 * failed: <what went wrong>". e is the specific error (what failed, its
 * code, errno, device, hint and causes), rewritten in place. Nothing is
 * cut: when the two do not fit in one line, the specific error is kept
 * whole as the first cause and the line points to it. An error already in this
 * shape is left as it is. The remote agent is filled when empty.
 */
static inline void kvl_bk_xfer_error(kvl_error_t *e, const kvl_bk_xfer_t *x, const char *peer)
{
    char pre[KVL_NAME_MAX + 96];
    size_t pl, wl;
    if (e == NULL || x == NULL)
        return;
    if (e->code == KVL_OK)
        e->code = KVL_ERR_INTERNAL;
    if (!e->agent[0] && peer != NULL)
        snprintf(e->agent, sizeof(e->agent), "%s", peer);
    pl = (size_t)snprintf(pre, sizeof(pre), "%s of %llu bytes with agent '%s' failed",
                          x->op == KVL_WRITE ? "WRITE" : "READ",
                          (unsigned long long)x->total_bytes, peer ? peer : "?");
    if (pl >= sizeof(pre))
        pl = sizeof(pre) - 1;
    if (strncmp(e->what, pre, pl) == 0)
        return;
    wl = strnlen(e->what, sizeof(e->what));
    if (pl + 2 + wl < sizeof(e->what)) {
        memmove(e->what + pl + 2, e->what, wl + 1);
        memcpy(e->what, pre, pl);
        memcpy(e->what + pl, ": ", 2);
        return;
    }
    /* too long for one line: the specific error whole, as the first cause */
    if (e->n_causes >= KVL_ERROR_MAX_CAUSES) {
        e->n_causes = KVL_ERROR_MAX_CAUSES - 1;
        e->n_causes_dropped++;
    }
    memmove(&e->causes[1], &e->causes[0], e->n_causes * sizeof(e->causes[0]));
    e->n_causes++;
    e->causes[0].code = e->code;
    e->causes[0].sys_errno = e->sys_errno;
    e->causes[0].device = e->device;
    snprintf(e->causes[0].backend, sizeof(e->causes[0].backend), "%s", e->backend);
    snprintf(e->causes[0].what, sizeof(e->causes[0].what), "%s", e->what);
    snprintf(e->causes[0].hint, sizeof(e->causes[0].hint), "%s", e->hint);
    snprintf(e->what, sizeof(e->what), "%s (the cause below)", pre);
    e->sys_errno = 0; /* cause 1 carries it: formatted once */
}

#ifdef __cplusplus
}
#endif
#endif
