/* kvlane: prepared descriptor lists and transfer requests. */
#ifndef KVLANE_XFER_H
#define KVLANE_XFER_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/agent.h>
#include <kvlane/desc.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KVL_READ = 1, KVL_WRITE = 2 } kvl_xfer_op_t;

typedef enum {
    KVL_XFER_IDLE = 0,      /* created or finished, can be posted */
    KVL_XFER_POSTED = 1,    /* moving */
    KVL_XFER_DONE = 2,      /* all bytes in place, notification delivered */
    KVL_XFER_CANCELED = 3,  /* stopped by kvl_xfer_cancel; no more bytes land */
    KVL_XFER_ERROR = 4
} kvl_xfer_state_t;

/*
 * A descriptor list checked against registered memory once (local) or
 * against a remote agent's metadata (remote), so transfers built from it
 * by index skip validation.
 */
typedef struct kvl_prep kvl_prep_t;

kvl_status_t kvl_prep_local(kvl_agent_t *agent, const kvl_dlist_t *dl,
                            kvl_prep_t **prep_p);
kvl_status_t kvl_prep_remote(kvl_agent_t *agent, const char *remote,
                             const kvl_dlist_t *dl, kvl_prep_t **prep_p);
void kvl_prep_release(kvl_prep_t *prep);
size_t kvl_prep_entries(const kvl_prep_t *prep);

typedef struct kvl_xfer kvl_xfer_t;

enum {
    KVL_XFER_PARAM_NOTIF = 1u << 0,
    KVL_XFER_PARAM_BACKEND = 1u << 1,
    KVL_XFER_PARAM_TIMEOUT = 1u << 2
};

typedef struct kvl_xfer_params {
    uint64_t field_mask;
    const void *notif;        /* message delivered to the remote after the data */
    size_t notif_len;         /* <= KVL_NOTIF_MAX */
    const char *backend;      /* force a backend; default: best available */
    uint64_t timeout_ms;      /* bound once the peer stops answering; default agent's */
} kvl_xfer_params_t;

/*
 * Build a transfer between a local list and a remote agent's list. Blocks
 * pair in order (strided entries counted block by block) and paired blocks
 * must have equal lengths. Every entry is validated before anything moves;
 * an invalid entry is reported with its index and the nearest registered
 * region. Adjacent entries coalesce.
 */
kvl_status_t kvl_xfer_create(kvl_agent_t *agent, kvl_xfer_op_t op,
                             const kvl_dlist_t *local, const char *remote,
                             const kvl_dlist_t *remote_list,
                             const kvl_xfer_params_t *params, kvl_xfer_t **xfer_p);

/*
 * Build a transfer from prepared lists: entries lidx[i] and ridx[i] pair up.
 * lidx/ridx NULL means 0..n-1.
 */
kvl_status_t kvl_xfer_create_prepped(kvl_agent_t *agent, kvl_xfer_op_t op,
                                     const kvl_prep_t *local, const int64_t *lidx,
                                     const kvl_prep_t *remote, const int64_t *ridx,
                                     size_t n, const kvl_xfer_params_t *params,
                                     kvl_xfer_t **xfer_p);

/* Start moving. KVL_IN_PROGRESS or KVL_OK (already complete); may be re-posted
 * once finished. */
kvl_status_t kvl_xfer_post(kvl_xfer_t *xfer);

/* KVL_OK done, KVL_IN_PROGRESS, or the transfer's error. */
kvl_status_t kvl_xfer_test(kvl_xfer_t *xfer);

/* Wait up to timeout_ms (-1 forever): KVL_OK, KVL_ERR_TIMEOUT (still
 * moving), or the transfer's error. */
kvl_status_t kvl_xfer_wait(kvl_xfer_t *xfer, int64_t timeout_ms);

/*
 * Cancel. On return the transfer is KVL_XFER_CANCELED (no more bytes will
 * land and its notification is never delivered), KVL_XFER_DONE (it completed
 * first; its notification was delivered) or KVL_XFER_ERROR (it failed, e.g.
 * the peer stopped answering: the returned error says whether and how many
 * bytes may still land). state_p gets which.
 */
kvl_status_t kvl_xfer_cancel(kvl_xfer_t *xfer, kvl_xfer_state_t *state_p);

/* Release a transfer; one in flight is cancelled first. */
void kvl_xfer_release(kvl_xfer_t *xfer);

kvl_xfer_state_t kvl_xfer_state(const kvl_xfer_t *xfer);

typedef struct kvl_xfer_stats {
    uint64_t bytes;           /* payload bytes of one posting */
    uint64_t blocks;          /* blocks after pairing */
    uint64_t segments;        /* segments after coalescing */
    uint64_t post_ns;         /* time kvl_xfer_post took */
    uint64_t duration_ns;     /* post to completion of the last posting */
    char backend[64];         /* backend that moved it */
    char path[64];            /* its path, e.g. "cma", "mmap", "socket" */
} kvl_xfer_stats_t;

kvl_status_t kvl_xfer_get_stats(const kvl_xfer_t *xfer, kvl_xfer_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
