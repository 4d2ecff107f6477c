/*
 * kvlane shm backend: private structures shared by the files of this folder.
 *
 * Objects and who owns what:
 *   iface  - one per open(): listening socket, progress thread, workers.
 *   peer   - one per peer_load(): our outgoing connection to a remote agent,
 *            its CMA verdict, its memfd mappings and pending socket requests.
 *   conn   - one per accepted connection: a remote agent that loaded us. Only
 *            the progress thread touches conns.
 *   mh/rh  - local region handle (mem_reg) / remote region handle.
 *   xpriv  - per posted transfer state (x->bk_priv).
 *
 * One mutex (iface->lock) guards every list and counter; it is never held
 * across a system call that can block on a peer, and never across a call
 * into the core.
 */
#ifndef KVLI_SHM_H
#define KVLI_SHM_H

#include <pthread.h>
#include "common/accept.h"
#include "common/clock.h"
#include "common/progress.h"
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <kvlane/backend.h>
#include <kvlane/notif.h>

#define KVLI_SHM_NAME "shm"
#define KVLI_SHM_IOV_MAX 1024              /* kernel UIO_MAXIOV */
#define KVLI_SHM_CHUNK (4u << 20)          /* cancel is checked between chunks */
#define KVLI_SHM_CMA_CHUNK (16u << 20)     /* the same for cross-memory attach */
#define KVLI_SHM_WINDOW 16                 /* socket requests in flight per worker */
#define KVLI_SHM_DEFAULT_TIMEOUT_MS 5000u
#define KVLI_SHM_TEXT_MAX 256              /* refusal text carried in a reply */
#define KVLI_SHM_GUARD_SLOTS (1u << 20)    /* entries of a guard table */
#define KVLI_SHM_LIVE_SLOTS 8u             /* its last ones: the target's liveness lock */
#define KVLI_SHM_GUARD_REGIONS (KVLI_SHM_GUARD_SLOTS - KVLI_SHM_LIVE_SLOTS) /* regions, at most */
#define KVLI_SHM_LIVE_MAX 1024u            /* guard tables with a liveness lock at once */
#define KVLI_SHM_HELD_MAX 64               /* regions one direct-copy batch touches */

typedef struct kvli_shm_iface kvli_shm_iface_t;
typedef struct kvli_shm_peer kvli_shm_peer_t;
typedef struct kvli_shm_conn kvli_shm_conn_t;
typedef struct kvli_shm_map kvli_shm_map_t;
typedef struct kvli_shm_xpriv kvli_shm_xpriv_t;
typedef struct kvli_shm_req kvli_shm_req_t;
typedef struct kvli_shm_worker kvli_shm_worker_t;
typedef struct kvli_shm_outq kvli_shm_outq_t;
typedef struct kvli_shm_guard kvli_shm_guard_t;

/* One region's entry in a guard table (shm_guard.c), shared with a peer. */
typedef struct kvli_shm_gslot {
    _Atomic uint32_t gen;            /* the region's generation; 0: no access */
    _Atomic uint32_t busy;           /* the peer's direct copies in progress */
} kvli_shm_gslot_t;

/* Target side: the guard table of one accepted connection. */
struct kvli_shm_guard {
    kvli_shm_guard_t *next;          /* iface->guards, under iface->lock */
    kvli_shm_gslot_t *map;
    pid_t pid;                       /* the initiator (SO_PEERCRED) */
    int pidfd;
    char name[KVL_NAME_MAX];
    unsigned refs;                   /* under iface->lock */
    int live;                        /* its liveness lock is held by `owner` */
    pthread_t owner;
};

/* Local region handle. */
typedef struct kvli_shm_mh {
    uint64_t addr, len;
    int shareable;
    uint64_t shm_id, shm_off, shm_size;
    uint32_t slot, gen;              /* guard table entry (shm_guard.c) */
} kvli_shm_mh_t;

/* A peer's memfd mapped here, shared by every rregion of that allocation. */
struct kvli_shm_map {
    kvli_shm_map_t *next;
    uint64_t shm_id;
    uint8_t *base;
    uint64_t size;
    unsigned refs;
};

/* Remote region handle. */
typedef struct kvli_shm_rh {
    kvli_shm_peer_t *peer;
    uint64_t addr, len;
    int shareable;
    uint64_t shm_id, shm_off, shm_size;
    uint32_t slot, gen;      /* its entry in the peer's guard table */
    kvli_shm_map_t *map;     /* NULL: not mapped, use cma or the socket */
} kvli_shm_rh_t;

/*
 * A socket request waiting for its reply (initiator side). Lives in a
 * worker's window or on the stack of a thread asking for an fd; linked in
 * peer->pending while in flight.
 */
struct kvli_shm_req {
    kvli_shm_req_t *next;
    uint64_t id;
    uint32_t expect;                 /* reply type */
    kvli_shm_xpriv_t *xp;            /* NULL for fd requests */
    struct iovec *iov;               /* READ: where the payload lands */
    int iovcnt;
    uint64_t bytes;
    uint64_t landable;               /* WRITE: payload bytes handed to the socket (bound) */
    int in_flight;
    int done;
    kvl_status_t status;
    int sys_errno;
    char text[KVLI_SHM_TEXT_MAX];
    int fd;                          /* FD reply */
    uint64_t size;
};

struct kvli_shm_peer {
    kvli_shm_peer_t *next;
    kvli_shm_iface_t *iface;
    char name[KVL_NAME_MAX];
    uint64_t incarnation;
    pid_t pid;
    uid_t uid;
    uid_t cred_uid;                  /* who serves its socket (SO_PEERCRED) */
    pid_t cred_pid;
    uint64_t probe_addr;
    struct sockaddr_un addr;
    socklen_t addrlen;
    char sock_desc[160];             /* printable socket name for messages */
    int fd;
    int pidfd;                       /* -1 when pidfd_open is unavailable */
    uint32_t notif_slots;            /* our grant there, under iface->lock */
    uint32_t notif_slots_hi;         /* the most it held: a top-up is asked at half */
    int notif_topup;                 /* a NOTIF_GRANTED asking for more is unanswered */
    pthread_mutex_t send_lock;       /* one writer at a time on fd */
    int cma_ok;
    char cma_reason[400];            /* why not, when !cma_ok */
    kvli_shm_gslot_t *guard;         /* the target's guard table for us */
    /* The target's liveness lock in it (shm_guard.c), read instead of
     * polling pidfd when the target runs as our uid; NULL: poll. */
    const uint32_t *live;
    atomic_int dead;
    /* under iface->lock */
    int dead_errno;
    char dead_what[200];
    int unloading, detached;
    unsigned running;                /* workers moving a transfer to it */
    int released;                    /* dead: fds and mappings given back */
    uint64_t next_id;
    kvli_shm_req_t *pending;
    kvli_shm_map_t *maps;
    unsigned n_maps_ever;
};

/* Queued outgoing data on an accepted connection (sent without blocking). */
struct kvli_shm_outq {
    kvli_shm_outq_t *next;
    uint8_t hdr[24 + 16 + KVLI_SHM_TEXT_MAX];
    size_t hdr_len;
    struct iovec *iov;               /* payload, NULL if none */
    int iovcnt;
    void **pins;
    unsigned npins;
    int fd;                          /* to pass with SCM_RIGHTS, -1 none */
    size_t total, sent;
};

struct kvli_shm_conn {
    kvli_shm_conn_t *next;
    int fd;
    int hello;                       /* HELLO received */
    char name[KVL_NAME_MAX];
    uint64_t incarnation;
    pid_t cred_pid;
    uid_t cred_uid;
    kvli_shm_guard_t *guard;         /* its guard table, from HELLO on */
    kvli_shm_outq_t *out_head, *out_tail;
    int closing;
    /* The initiator shut the connection down: what is still queued in it
     * belongs to requests it gave up. WRITE payloads are dropped, not
     * copied; nothing is answered. */
    int abandoned;
    uint32_t notif_slots;            /* its grant (shm_proto.h): unused slots */
};

enum { KVLI_SHM_XQUEUED = 0, KVLI_SHM_XRUNNING = 1 };

struct kvli_shm_xpriv {
    kvli_shm_xpriv_t *next_all;      /* iface->xfers: posted, not finished */
    kvli_shm_xpriv_t *next_q;        /* iface->queue */
    kvl_bk_xfer_t *x;
    kvli_shm_peer_t *peer;
    int state;
    atomic_int cancel;
    int abort;                       /* agent destroyed: socket requests are given up */
    int sending;                     /* a socket request is being sent */
    int finished;
    unsigned waiters;
    /* socket accounting, under iface->lock */
    unsigned outstanding;
    unsigned busy;
    kvl_status_t sock_status;
    int sock_errno;
    char sock_text[KVLI_SHM_TEXT_MAX + 64];
    uint64_t sock_moved;
    uint64_t sock_inflight;          /* WRITE bytes of requests given up unanswered:
                                      * they may still land */
    uint64_t queued_ns;              /* a sample for inline_max=auto: when it was
                                      * queued to idle workers (0: none) */
};

struct kvli_shm_worker {
    kvli_shm_iface_t *iface;
    pthread_t thread;
    int started;
    struct iovec *liov, *riov;       /* KVLI_SHM_IOV_MAX each */
    uint64_t *ranges;                /* 2 * KVLI_SHM_IOV_MAX */
    kvli_shm_req_t reqs[KVLI_SHM_WINDOW];
    struct iovec *req_iov;           /* KVLI_SHM_WINDOW * KVLI_SHM_IOV_MAX */
};

struct kvli_shm_iface {
    /* Peers read this word with process_vm_readv to prove CMA reaches us. */
    volatile uint64_t probe;
    kvl_bk_ctx_t *ctx;
    uint64_t timeout_ms;
    int cma_off;
    /* Who may connect (allow_uids): our own uid, plus these, or anyone. */
    int uid_any;
    unsigned nuids;
    unsigned live_held;              /* guard tables whose liveness lock we hold */
    uid_t uids[16];
    char boot_id[40];
    uint64_t netns_ino, pidns_ino;
    int abstract;
    struct sockaddr_un addr;
    socklen_t addrlen;
    char sock_name[108];             /* without the abstract NUL */
    int listen_fd;
    kvli_accept_backoff_t accept_bo; /* progress thread only: paused when out of fds */
    kvli_progress_t pg;              /* progress thread, wake fd, stop flag */
    size_t poll_npeers;              /* progress thread: peers end here in its poll set */
    unsigned nworkers;
    kvli_shm_worker_t *workers;
    /* Small transfers run in the poster's thread (inline_max bytes at most,
     * 0: never), one at a time, with this worker's arrays. inline_max=auto
     * (inline_adapt): the bound is inline_auto instead, learnt from the
     * transfers handed to the workers while the backend was idle
     * (kvli_shm_learn). */
    uint64_t inline_max;
    int inline_adapt;
    _Atomic uint64_t inline_auto;    /* bytes */
    _Atomic uint64_t wake_ns;        /* post to a worker's start, averaged */
    _Atomic uint64_t rate_bpus;      /* the workers' copies, bytes per us, averaged */
    _Atomic uint64_t inline_logged;  /* the bound last logged (debug) */
    pthread_mutex_t inline_lock;
    kvli_shm_worker_t inline_w;
    /* One finished transfer's state kept for the next post (saves a
     * calloc and a free per transfer); NULL when none. */
    _Atomic(kvli_shm_xpriv_t *) spare;

    pthread_mutex_t lock;
    pthread_cond_t cond;             /* replies, completions, detach */
    pthread_cond_t qcond;            /* work queue */
    kvli_shm_peer_t *peers;
    kvli_shm_conn_t *conns;          /* progress thread only */
    kvli_shm_xpriv_t *xfers;
    kvli_shm_xpriv_t *q_head, *q_tail;
    /* guard tables (shm_guard.c), under lock */
    uint32_t *slot_gen;              /* live, not revoked: its generation; else 0 */
    uint32_t *slot_free;
    uint32_t slot_nfree, slot_next, gen_next;
    kvli_shm_guard_t *guards;
    /* progress thread scratch */
    uint8_t *scratch;
    size_t scratch_len;
    void **pins;
};

/*
 * inline_max=auto. Handing a transfer to a worker delays it by a wake-up
 * (~12 us on a 2-vCPU VM, a few us on a bare host); running it in the
 * poster's thread blocks the poster for its copy. A transfer runs inline
 * when its copy should take no longer than that delay: the bound is the
 * measured delay times the measured copy rate, kept within [64 KiB, 1 MiB]
 * (64 KiB until a first measurement).
 */
#define KVLI_SHM_INLINE_MIN (64ull << 10)
#define KVLI_SHM_INLINE_CAP (1ull << 20)

static inline uint64_t kvli_shm_inline_bound(uint64_t wake_ns, uint64_t bytes_per_us)
{
    uint64_t b;
    if (wake_ns == 0 || bytes_per_us == 0)
        return KVLI_SHM_INLINE_MIN;
    if (wake_ns > KVLI_SHM_INLINE_CAP * 1000 / bytes_per_us)
        return KVLI_SHM_INLINE_CAP;      /* also: no overflow below */
    b = wake_ns * bytes_per_us / 1000;
    return b < KVLI_SHM_INLINE_MIN ? KVLI_SHM_INLINE_MIN : b;
}

/* A running average giving each new sample 1/8 (the first is taken whole). */
static inline uint64_t kvli_shm_avg8(uint64_t avg, uint64_t sample)
{
    return avg == 0 ? sample : avg - avg / 8 + sample / 8;
}

/* shm_iface.c */
/* shm_target.c: connections peers opened to us (progress thread only). */
void kvli_shm_accept(kvli_shm_iface_t *iface);
void kvli_shm_conn_progress(kvli_shm_iface_t *iface, kvli_shm_conn_t *c);
void kvli_shm_conn_flush(kvli_shm_iface_t *iface, kvli_shm_conn_t *c);
void kvli_shm_conn_free(kvli_shm_iface_t *iface, kvli_shm_conn_t *c);
/* Proofs of the shared secret in HELLO (ack 0) and HELLO_ACK (ack 1). */
void kvli_shm_hello_mac(const kvl_bk_ctx_t *ctx, int ack, uint64_t first_inc,
                        uint64_t second_inc, const char *name, size_t name_len, uint8_t *out);
/* Is this uid allowed to talk to us (allow_uids)? */
int kvli_shm_uid_allowed(const kvli_shm_iface_t *iface, uid_t uid);
void kvli_shm_deadline(struct timespec *ts, uint64_t ms);
int kvli_shm_sock_set_timeouts(int fd, uint64_t ms);

/* shm_peer.c */
kvl_status_t kvli_shm_peer_load(void *bk, const char *name, uint64_t incarnation,
                                const uint8_t *conn, size_t len, void **peer_p,
                                kvl_error_t *err);
void kvli_shm_peer_unload(void *bk, void *peer);
void kvli_shm_peer_describe(void *bk, void *peer, char *buf, size_t len);
void kvli_shm_peer_mark_dead(kvli_shm_peer_t *peer, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kvli_shm_peer_progress(kvli_shm_peer_t *peer);
/* Progress thread, iface->lock held: a dead peer no worker uses gives back
 * its socket, pidfd, mappings and guard table at once (the object stays
 * until unloaded, answering "disconnected"). */
void kvli_shm_peer_release(kvli_shm_peer_t *peer);
kvl_status_t kvli_shm_peer_send(kvli_shm_peer_t *peer, struct iovec *iov,
                                int iovcnt, kvl_error_t *err);
/* A data request: bounded by timeout_ms without progress (the transfer's
 * own timeout); req's landable is lowered to what was handed over when the
 * send fails. A failed send marks the peer dead. */
kvl_status_t kvli_shm_peer_send_req(kvli_shm_peer_t *peer, kvli_shm_req_t *req, size_t head_len,
                                    struct iovec *iov, int iovcnt, uint64_t timeout_ms);
/* inflight: bytes of the transfer that may still land (handed to the socket
 * unanswered before it was shut down). */
kvl_status_t kvli_shm_peer_disconnect_error(kvli_shm_peer_t *peer, uint64_t moved,
                                            uint64_t total, uint64_t inflight,
                                            kvl_error_t *err);
void kvli_shm_peer_req_add(kvli_shm_peer_t *peer, kvli_shm_req_t *req);
void kvli_shm_peer_req_drop(kvli_shm_peer_t *peer, kvli_shm_req_t *req);
kvl_status_t kvli_shm_peer_fd_request(kvli_shm_peer_t *peer, uint64_t shm_id, int *fd_p,
                                      uint64_t *size_p, kvl_error_t *err);
kvl_status_t kvli_shm_peer_notif(kvli_shm_peer_t *peer, const void *msg, size_t len,
                                 uint64_t xfer_bytes, uint64_t timeout_ms, kvl_error_t *err);
kvl_status_t kvli_shm_peer_notif_send(void *bk, void *peer, const void *msg,
                                      size_t len, kvl_error_t *err);

/* shm_md.c */
kvl_status_t kvli_shm_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p,
                             char *detail, size_t detail_len, kvl_error_t *err);
void kvli_shm_md_dereg(void *bk, void *mh);
kvl_status_t kvli_shm_md_pack(void *bk, void *mh, uint8_t *buf, size_t cap,
                              size_t *len_p);
kvl_status_t kvli_shm_md_rload(void *bk, void *peer, const kvl_region_info_t *r,
                               const uint8_t *key, size_t len, void **rh_p,
                               kvl_error_t *err);
void kvli_shm_md_runload(void *bk, void *peer, void *rh);
void kvli_shm_md_unmap_all(kvli_shm_peer_t *peer);
/* A dead peer's mappings go (iface->lock held, no worker on the peer). */
void kvli_shm_md_unmap_dead(kvli_shm_peer_t *peer);

/* shm_guard.c: revoking peers' direct access at deregistration */
kvl_status_t kvli_shm_guard_slot_get(kvli_shm_iface_t *iface, kvli_shm_mh_t *mh,
                                     kvl_error_t *err);
void kvli_shm_guard_slot_put(kvli_shm_iface_t *iface, kvli_shm_mh_t *mh);
kvl_status_t kvli_shm_md_revoke(void *bk, void *mh, int revoke, kvl_error_t *err);
/* The table of a connection after its HELLO: the fd to send, or -1 (why). */
int kvli_shm_guard_open(kvli_shm_iface_t *iface, kvli_shm_conn_t *c, char *why, size_t cap);
void kvli_shm_guard_close(kvli_shm_iface_t *iface, kvli_shm_conn_t *c);
kvl_status_t kvli_shm_guard_attach(kvli_shm_peer_t *peer, int fd, kvl_error_t *err);
void kvli_shm_guard_detach(kvli_shm_peer_t *peer);
/* 1: the target's liveness lock says it is alive; -1: unknown (poll). */
int kvli_shm_guard_alive(const kvli_shm_peer_t *peer);
/* Around a direct copy into or out of rh: 0 when the target revoked it. */
int kvli_shm_guard_enter(kvli_shm_peer_t *peer, const kvli_shm_rh_t *rh);
void kvli_shm_guard_leave(kvli_shm_peer_t *peer, const kvli_shm_rh_t *rh);

/* shm_xfer.c */
kvl_status_t kvli_shm_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err);
void kvli_shm_xfer_cancel(void *bk, kvl_bk_xfer_t *x);
void kvli_shm_xfer_abort(void *bk, kvl_bk_xfer_t *x);
void *kvli_shm_xfer_worker(void *arg);
int kvli_shm_worker_init(kvli_shm_worker_t *w, kvli_shm_iface_t *iface);
void kvli_shm_worker_fini(kvli_shm_worker_t *w);
void kvli_shm_xfer_cancel_peer(kvli_shm_iface_t *iface, kvli_shm_peer_t *peer);
void kvli_shm_xfer_cancel_queued_all(kvli_shm_iface_t *iface);

#endif
