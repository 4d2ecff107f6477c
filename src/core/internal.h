/* kvlane core: private structures shared by the core's files. */
#ifndef KVLI_INTERNAL_H
#define KVLI_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <kvlane/kvlane.h>
#include <kvlane/backend.h>

#define KVLI_MAX_BACKENDS 8
/* Does a backend have this optional slot? The core's ops tables are full-size
 * copies with the slots a backend lacks set to NULL (backend_table.c). */
#define KVLI_OPS_HAS(ops, slot) ((ops)->slot != NULL)

/* ---- errors (error.c) ---- */
void kvli_err(kvl_error_t *err, kvl_status_t code, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kvli_hint(kvl_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvli_err_region(kvl_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Add one cause (copied from a backend's error, or built). */
void kvli_err_add_cause(kvl_error_t *err, const kvl_error_t *cause);
/* An empty error (code KVL_OK, device -1), without clearing its 2 KiB of
 * text: for errors that are usually never filled. */
void kvli_err_blank(kvl_error_t *err);
/* Record err as the thread's (and agent's, if not NULL) last error; returns err->code. */
kvl_status_t kvli_fail(kvl_agent_t *agent, const kvl_error_t *err);
/* Shortcut for usage errors with no agent context. */
kvl_status_t kvli_fail_simple(kvl_agent_t *agent, kvl_status_t code, const char *hint,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- logging (log.c) ---- */
void kvli_log(kvl_log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kvli_vlog(kvl_log_level_t level, const char *component, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
bool kvli_log_enabled(kvl_log_level_t level);
#define kvli_warn(...) kvli_log(KVL_LOG_WARN, "core", __VA_ARGS__)
#define kvli_debug(...) \
    do { if (kvli_log_enabled(KVL_LOG_DEBUG)) kvli_log(KVL_LOG_DEBUG, "core", __VA_ARGS__); } while (0)

/* ---- utilities (util.c) ---- */
uint64_t kvli_now_ns(void);          /* CLOCK_MONOTONIC */
uint64_t kvli_realtime_ns(void);
uint64_t kvli_random64(void);
uint32_t kvli_crc32c(uint32_t crc, const void *buf, size_t len);
bool kvli_name_valid(const char *name);
bool kvli_add_overflows(uint64_t a, uint64_t b);
/* Scratch arrays; large ones come from a cache of warm memory. */
void *kvli_buf_alloc(size_t bytes);
void kvli_buf_free(void *p, size_t bytes);
/* Bytes the free lists of 4-128 KiB arrays hold now, and their bound (0:
 * none kept, under AddressSanitizer). */
size_t kvli_buf_mid_cached(size_t *max_p);
/* Copy with truncation, always NUL-terminated (src may be NULL). */
void kvli_scopy(char *dst, size_t cap, const char *src);

/* ---- FILE ranges (registration.c) ----
 * Inside the core a FILE range (fd, offset) lives at a key in an address
 * space of its own: bit 63 set (no pointer has it), the fd in bits 40..62,
 * the offset below. Registry lookups, overlaps and descriptors then work as
 * for memory, per file. Backends see keys (kvl_bk_file_offset). */
#define KVLI_FILE_TAG (1ull << 63)
static inline uint64_t kvli_file_key(int32_t fd, uint64_t off)
{
    return KVLI_FILE_TAG | ((uint64_t)(uint32_t)fd << 40) | off;
}
static inline bool kvli_file_is_key(uint64_t k)
{
    return (k & KVLI_FILE_TAG) != 0;
}
static inline uint64_t kvli_file_off(uint64_t k)
{
    return k & (KVL_FILE_OFFSET_MAX - 1);
}
/* Check a FILE range as the caller gave it (offset, len, fd); KVL_OK or
 * KVL_ERR_INVALID_ARG with err filled (what names it). */
kvl_status_t kvli_file_range_check(const char *what, uint64_t off, uint64_t len, int32_t fd,
                                   kvl_error_t *err);

/* ---- backends (backend_table.c) ---- */
const kvl_backend_ops_t *kvli_backend_find(const char *name);
/* Built-in backend i, NULL past the last. */
const kvl_backend_ops_t *kvli_backend_builtin(size_t i);

struct kvl_backend {
    const kvl_backend_ops_t *ops;
    void *bk;
    kvl_bk_ctx_t ctx;
    unsigned index;
    kvl_agent_t *agent;
};

/* ---- local memory (registry.c) ---- */
typedef struct kvli_region {
    uint64_t addr, len;
    kvl_mem_kind_t kind;
    int32_t dev;
    uint32_t refcount;                /* registrations of this exact range */
    atomic_uint inflight;             /* posted transfers using it */
    atomic_uint pins;                 /* backend target-side pins */
    atomic_uint objref;               /* registry + preps + xfers */
    atomic_bool valid;                /* false once deregistered */
    uint32_t bk_mask;                 /* backends it is registered on */
    void *mh[KVLI_MAX_BACKENDS];
    uint64_t shm_id;                  /* allocation it lies in, 0 if none */
    uint64_t file_dev, file_ino;      /* FILE: the file the fd named when registered */
} kvli_region_t;

typedef struct kvli_alloc {
    uint64_t id;
    void *ptr;
    size_t len;
    int fd;                           /* memfd; -1 when a backend allocated */
    struct kvl_backend *bk;           /* the backend that allocated, or NULL */
    void *ah;                         /* its handle */
} kvli_alloc_t;

void kvli_region_get(kvli_region_t *r);
void kvli_region_put(kvli_region_t *r);
/* Under the agent lock (registry.c): insert (sorted), remove, exact match. */
kvl_status_t kvli_registry_insert(kvl_agent_t *a, kvli_region_t *r, kvl_error_t *err);
void kvli_registry_remove(kvl_agent_t *a, kvli_region_t *r);
/* Take every region no longer valid off the registry, in one pass. */
void kvli_registry_remove_invalid(kvl_agent_t *a);
kvli_region_t *kvli_registry_exact(kvl_agent_t *a, uint64_t addr, uint64_t len);
/* Under the agent lock (alloc.c): the allocation holding a range, or NULL. */
const struct kvli_alloc *kvli_alloc_containing(const kvl_agent_t *a, uint64_t addr,
                                               uint64_t len);
/* Release a region's handle on every backend (registration.c). */
void kvli_region_unregister_backends(kvl_agent_t *a, kvli_region_t *r);
/* Lookup under the agent lock: region containing [addr, addr+len). */
kvli_region_t *kvli_registry_find(kvl_agent_t *a, uint64_t addr, uint64_t len);
/* A region other than the exact range that overlaps [addr, addr+len), the
 * lowest such; NULL when none. */
kvli_region_t *kvli_registry_overlap(kvl_agent_t *a, uint64_t addr, uint64_t len);
/* Nearest region to addr, for messages; NULL when none. */
kvli_region_t *kvli_registry_nearest(kvl_agent_t *a, uint64_t addr);
/* Backend b stops peers' direct access to region r and waits for their
 * copies in progress (ops->mem_revoke with revoke 1); KVL_OK also when r is
 * not on b or b has no such slot. Agent lock held. */
kvl_status_t kvli_region_revoke_on(kvl_agent_t *a, kvli_region_t *r, unsigned b,
                                   kvl_error_t *e);
unsigned kvli_registry_unpinned(kvl_agent_t *a);
void kvli_registry_destroy(kvl_agent_t *a);
/* Free the allocations made by backends (before they close: backends=true)
 * or the memfd ones (backends=false). */
void kvli_allocs_destroy(kvl_agent_t *a, bool backends);

/* ---- remote agents (metadata.c) ---- */
typedef struct kvli_rregion {
    uint64_t addr, len;
    kvl_mem_kind_t kind;
    int32_t dev;
    uint32_t keysum;                  /* crc32c of the keys loaded (backend, bytes) */
    void *rh[KVLI_MAX_BACKENDS];
} kvli_rregion_t;

typedef struct kvli_remote {
    char name[KVL_NAME_MAX];
    uint64_t incarnation, start_ns, generation;
    atomic_uint objref;
    atomic_bool valid;                /* false once removed or replaced */
    void *peer[KVLI_MAX_BACKENDS];    /* NULL: not reachable through it */
    char unreachable[KVLI_MAX_BACKENDS][256];
    /* The agent itself as the remote side of FILE transfers (files are
     * local): its regions are the agent's own registry (kvl_agent.self_rem). */
    bool self_files;
    size_t n_regions;
    kvli_rregion_t *regions;          /* sorted by addr */
    uint64_t max_len;
    bool partial;                     /* built from or merged with partial blobs */
    /* Arrays and regions a partial merge replaced: preps may still point
     * into them, so they are freed (handles unloaded) with the remote. */
    struct kvli_rretired *retired;
    struct kvli_remote *next;
    struct kvli_remote *hnext;        /* its chain in kvl_agent.rtab */
} kvli_remote_t;

typedef struct kvli_rretired {
    struct kvli_rretired *next;
    kvli_rregion_t *array;            /* the old regions array: free only */
    size_t n_gone;
    kvli_rregion_t *gone;             /* replaced regions: unload their handles */
} kvli_rretired_t;

void kvli_remote_get(kvli_remote_t *r);
void kvli_remote_put(kvl_agent_t *a, kvli_remote_t *r);
kvli_remote_t *kvli_remote_find(kvl_agent_t *a, const char *name); /* under lock */
/* Find and reference a remote agent; NULL with err filled when unknown. */
kvli_remote_t *kvli_remote_acquire(kvl_agent_t *a, const char *name, kvl_error_t *err);
/* The same, for a list of this kind: FILE under the agent's own name is the
 * agent itself (self_files), loaded or not. */
kvli_remote_t *kvli_remote_acquire_for(kvl_agent_t *a, const char *name, kvl_mem_kind_t kind,
                                       kvl_error_t *err);
const kvli_rregion_t *kvli_rregion_find(const kvli_remote_t *r, uint64_t addr, uint64_t len);
const kvli_rregion_t *kvli_rregion_nearest(const kvli_remote_t *r, uint64_t addr);
void kvli_remotes_destroy(kvl_agent_t *a);

/* ---- transfers (prep.c, xfer.c) ---- */
typedef struct kvli_pent {
    uint64_t addr, stride, count, len;
    uint32_t reg;                     /* index in prep->regs */
} kvli_pent_t;

struct kvl_prep {
    kvl_agent_t *agent;
    bool remote;
    bool self_files;                  /* remote side of FILE transfers: this agent's
                                         own files, regs are kvli_region_t* */
    kvli_remote_t *rem;               /* remote: referenced */
    kvl_mem_kind_t kind;
    size_t n;
    kvli_pent_t *ents;
    size_t nregs;
    void **regs;                      /* kvli_region_t* (local, referenced) or
                                         const kvli_rregion_t* (remote) */
    struct kvl_prep *prev, *next;     /* agent's list */
    /* Indexed transfers (xfer.c): every entry one block of ulen bytes. */
    bool uniform;
    uint64_t ulen;
    atomic_uint refs;                 /* the owner + indexed transfers using it */
    pthread_mutex_t tab_lock;
    kvl_bk_ptab_t tab;                /* addrs/regs made at first indexed use */
    uint64_t *tab_addrs;
    uint32_t *tab_regs;
    void *bk_cache[KVLI_MAX_BACKENDS];
};

struct kvl_xfer {
    kvl_agent_t *agent;
    kvl_xfer_op_t op;
    struct kvl_backend *bk;
    kvli_remote_t *rem;
    kvl_bk_xfer_t bx;
    kvl_seg_t *segs;
    size_t nsegs, segs_cap;
    uint64_t blocks;
    size_t nlregs, nrregs;
    kvli_region_t **lregs;
    void **lmh, **rmh;
    unsigned char *notif;
    size_t notif_len;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    _Atomic int state;                /* kvl_xfer_state_t */
    kvl_status_t status;
    uint64_t t_post, post_ns, duration_ns;
    bool posted_once;                 /* backend may hold state in bx.bk_priv */
    bool posting;                     /* inside the backend's xfer_post (under lock) */
    /* Indexed (bx.nidx > 0): the lists it indexes (referenced) and the
     * indices; segs stays NULL until a backend asks for xfer_expand. */
    kvl_prep_t *lprep, *rprep;
    uint32_t *lidx, *ridx;
    void *idx_cookie;                 /* lidx lent by the backend (idx_alloc) */
    char path[64];
    struct kvl_xfer *prev, *next;     /* agent's list */
    /* Why it failed: allocated (under lock) when it does, read only in the
     * error state; NULL if that allocation failed too. A kvl_error_t is
     * 36 KiB: embedded, it made every transfer a 37 KiB allocation whose
     * fresh heap pages a burst of makes had to fault in. */
    kvl_error_t *err;
};

/* ---- notifications (notif.c) ---- */
/* What one sending agent has in the queue (for its share). */
typedef struct kvli_notif_src {
    struct kvli_notif_src *next;
    char name[KVL_NAME_MAX];
    uint64_t msgs, bytes;
    uint64_t res_msgs, res_bytes;     /* granted to it, not used yet */
} kvli_notif_src_t;

typedef struct kvli_notif {
    struct kvli_notif *next;
    kvli_notif_src_t *src;
    char from[KVL_NAME_MAX];
    size_t len;
    unsigned char msg[];
} kvli_notif_t;

void kvli_notif_deliver(kvl_bk_ctx_t *ctx, const char *from, const void *msg, size_t len);
kvl_status_t kvli_notif_offer(kvl_bk_ctx_t *ctx, const char *from, const void *msg, size_t len,
                              char *why, size_t why_len);
uint32_t kvli_notif_reserve(kvl_bk_ctx_t *ctx, const char *from, uint32_t held,
                            size_t slot_len);
kvl_status_t kvli_notif_offer_reserved(kvl_bk_ctx_t *ctx, const char *from, const void *msg,
                                       size_t len, size_t slot_len);
void kvli_notif_unreserve(kvl_bk_ctx_t *ctx, const char *from, uint32_t slots, size_t slot_len);
void kvli_notifs_destroy(kvl_agent_t *a);

/* ---- the agent (agent.c) ---- */
struct kvl_agent {
    char name[KVL_NAME_MAX];
    uint64_t incarnation, start_ns;
    atomic_uint_fast64_t generation;  /* bumps on every (de)registration */
    uint64_t timeout_ms;
    unsigned workers;
    pthread_mutex_t lock;             /* registry, remotes, backends, lists */

    struct kvl_backend *bks[KVLI_MAX_BACKENDS];
    unsigned nbks;

    kvli_region_t **regs;             /* sorted by (addr, len) */
    uint64_t *reg_reach;              /* [i]: the furthest end of regs[0..i] */
    size_t nregs, capregs;
    uint64_t max_len;
    kvli_region_t *last_hit;          /* lookup cache (under lock) */

    kvli_alloc_t *allocs;
    size_t nallocs, capallocs;
    uint64_t next_alloc_id;

    kvli_remote_t *remotes;
    /* remotes by name (remote.c): rtab_cap chains, a power of two; NULL
     * (never grown, or no memory to) leaves lookups to the list */
    kvli_remote_t **rtab;
    size_t rtab_cap, nremotes;
    kvli_remote_t *self_rem;          /* made at first FILE transfer (remote.c) */
    struct kvl_prep *preps;
    struct kvl_xfer *xfers;
    /* Held while a transfer is released or cancelled on the agent's behalf,
     * never by progress threads, so waiting under it cannot deadlock them. */
    pthread_mutex_t xfer_lock;
    /* kvl_agent_destroy runs: transfers are aborted (ops->xfer_abort), not
     * cancelled, so a stopped peer cannot hold the teardown. */
    atomic_bool destroying;

    pthread_mutex_t notif_lock;
    pthread_cond_t notif_cond;
    kvli_notif_t *nhead, *ntail;
    /* what the queue holds and its bound (kvl_agent_config_t), under notif_lock */
    uint64_t nq_bytes, nq_msgs, nq_max_bytes, nq_max_msgs, nq_refused;
    uint64_t nq_res_bytes, nq_res_msgs;   /* granted to peers, not used yet */
    uint64_t nq_peer_bytes, nq_peer_msgs; /* one sender's share of the bound */
    unsigned nq_peer_pct;
    kvli_notif_src_t *nsrcs;

    pthread_mutex_t err_lock;
    kvl_error_t last_err;

    uint8_t *secret;                  /* shared secret (copy), NULL if none */
    size_t secret_len;
    struct kvli_stores *stores;       /* metadata stores attached (src/store/store.c) */
    const struct kvli_agent_hooks *hooks; /* set by what attaches (under lock) */

    struct kvl_agent *next_live;      /* global list of live agents */
};

/* ---- hooks for what is built above the core (the stores in src/store/) ----
 * The core knows no store: src/store/store.c sets agent->hooks (under
 * agent->lock) when the first store attaches and dispatches to each store. */
typedef struct kvli_agent_hooks {
    /* First in kvl_agent_destroy (the listener: invalidate our metadata at
     * every listener we pushed to, stop listening). */
    void (*destroy)(kvl_agent_t *a);
    /* After a deregistration (the listener: those we pushed to get the new
     * metadata). */
    void (*regions_changed)(kvl_agent_t *a);
} kvli_agent_hooks_t;
/* The hooks set on an agent, or NULL. */
const kvli_agent_hooks_t *kvli_agent_hooks(kvl_agent_t *a);

/* Build the xfer from two prepared lists (xfer.c). */
kvl_status_t kvli_xfer_build(kvl_agent_t *a, kvl_xfer_op_t op, const kvl_prep_t *lp,
                             const int64_t *lidx, size_t nl, const kvl_prep_t *rp,
                             const int64_t *ridx, size_t nr, const kvl_xfer_params_t *params,
                             kvl_xfer_t **xfer_p, kvl_error_t *err);
/* Validate a list into a prep (prep.c); no lists linked. */
kvl_status_t kvli_prep_build(kvl_agent_t *a, kvli_remote_t *rem, const kvl_dlist_t *dl,
                             kvl_prep_t **prep_p, kvl_error_t *err);
void kvli_prep_free(kvl_prep_t *p);
/* A reference for an indexed transfer; kvli_prep_unref frees at the last. */
void kvli_prep_ref(kvl_prep_t *p);
void kvli_prep_unref(kvl_prep_t *p);
/* The list's table for indexed transfers (made once). NULL: out of memory. */
const kvl_bk_ptab_t *kvli_prep_tab(kvl_prep_t *p);
kvl_status_t kvli_xfer_ctx_expand(kvl_bk_ctx_t *ctx, kvl_bk_xfer_t *bx, kvl_error_t *err);
void kvli_xfer_free(kvl_xfer_t *x);
/* Cancel (if posted) and wait; used by destroy and remote removal. */
void kvli_xfer_quiesce(kvl_xfer_t *x);

/* dlist internals (desc.c) */
typedef struct kvli_dent {
    uint64_t addr, stride, count, len;
    int32_t dev;
} kvli_dent_t;

struct kvl_dlist {
    kvl_mem_kind_t kind;
    size_t n, cap;
    uint64_t blocks, bytes;
    kvli_dent_t *ents;
};

#endif
