/*
 * kvlane ucx backend: private structures shared by the files of this folder.
 *
 * Objects and who owns what:
 *   iface  - one per open(): UCP context + its main worker (UCS_THREAD_MODE_MULTI,
 *            the address in our metadata), the progress thread, the lists below.
 *   dw     - a data worker: carries the endpoints to peers (see below).
 *   peer   - one per peer_load(): the UCP endpoint to a remote agent (one
 *            incarnation of it), on the current data worker.
 *   mh/rh  - local region (ucp_mem_map'd) / remote region (unpacked rkey).
 *   xpriv  - one per posting of a transfer (x->bk_priv).
 *   token  - the user_data of one outstanding UCP request (flush, AM send),
 *            so a transfer can finish (timeout) while UCX still owns the
 *            request: the callback frees an abandoned token.
 *   chunk  - one staged request of a posting (ucx_stage.c): VRAM UCX cannot
 *            map, or data_path=am; job - one such request served as target.
 *
 * Lock discipline (the reason the backend cannot deadlock with UCX):
 *   - iface->lock guards every list and every xpriv/peer field written by
 *     more than one thread. It is NEVER held across a ucp_*() call, because
 *     UCX callbacks (run inside ucp_worker_progress with the worker's own
 *     lock held) take iface->lock.
 *   - UCX callbacks only record results; they never call into the core,
 *     except notif_deliver (a leaf that takes only the core's queue lock).
 *   - Only the progress thread calls ucp_worker_progress, issues puts/gets,
 *     flushes, closes endpoints and destroys peers' workers while the iface
 *     is open; other threads queue work and wait on iface->cond, bounded by
 *     the timeout.
 */
#ifndef KVLI_UCX_H
#define KVLI_UCX_H

#include <pthread.h>
#include "common/clock.h"
#include "common/bounce.h"
#include "common/chunk.h"
#include "common/progress.h"
#include <stdatomic.h>
#include <ucp/api/ucp.h>
#include <kvlane/backend.h>
#include <kvlane/notif.h>

#define KVLI_UCX_NAME "ucx"
#define KVLI_UCX_DEFAULT_TIMEOUT_MS 5000u
#define KVLI_UCX_AM_ID 0x4b4cu                 /* notification AM id */
#define KVLI_UCX_AM_STAGE 0x4b4du              /* staged data: initiator -> target */
#define KVLI_UCX_AM_STAGE_REPLY 0x4b4eu        /* acks and READ data: target -> initiator */
#define KVLI_UCX_AM_NOTIF_ANS 0x4b4fu          /* a notification's answer: target -> sender */
#define KVLI_UCX_NOTIF_TEXT 256u               /* an answer's text, at most */
#define KVLI_UCX_STAGE_CHUNK (4u << 20)        /* bytes per staged request */
#define KVLI_UCX_STAGE_BUFS 16u                /* bounce buffers per backend, at most */
#define KVLI_UCX_STAGE_INIT_BUFS 8u            /* of which an initiator holds at most */
#define KVLI_UCX_STAGE_RANGES 256u             /* ranges per staged request, at most */
#define KVLI_UCX_BATCH_BYTES (64u << 20)       /* cancel is checked between batches */
#define KVLI_UCX_BATCH_OPS 4096u
#define KVLI_UCX_PIECE (4u << 20)              /* bytes per put/get, at most */
#define KVLI_UCX_EXIT_FLUSH_MS 20u             /* teardown: flush of live peers, all */
#define KVLI_UCX_CLOSE_FLUSH_MS 50u            /* unload: flush of a live peer */
#define KVLI_UCX_LOG_MAX 1024                  /* captured UCX log text per call */
#define KVLI_UCX_PAD 512                       /* zero padding behind untrusted blobs */

typedef struct kvli_ucx_iface kvli_ucx_iface_t;
typedef struct kvli_ucx_peer kvli_ucx_peer_t;
typedef struct kvli_ucx_xpriv kvli_ucx_xpriv_t;
typedef struct kvli_ucx_token kvli_ucx_token_t;
typedef struct kvli_ucx_chunk kvli_ucx_chunk_t;
typedef struct kvli_ucx_job kvli_ucx_job_t;
typedef struct kvli_ucx_nans kvli_ucx_nans_t;

/* UCX log lines captured on this thread during one UCX call. */
typedef struct kvli_ucx_log {
    char text[KVLI_UCX_LOG_MAX];
    size_t len;
    unsigned lines;
} kvli_ucx_log_t;

/* Memory UCX allocated for the user (mem_alloc: ucp_mem_map ALLOCATE). */
typedef struct kvli_ucx_alloc {
    struct kvli_ucx_alloc *next, *prev; /* iface->allocs, until unmapped */
    uint64_t addr, len;
    ucp_mem_h memh;
    unsigned regions;                 /* mh's using memh (under iface->lock) */
    int shared;                       /* a sysv/posix segment peers can map */
    char backing[64];                 /* "sysv segment", "posix shared memory", ... */
} kvli_ucx_alloc_t;

typedef struct kvli_ucx_mh {
    struct kvli_ucx_mh *next, *prev;  /* iface->mhs: unmapped at close at the latest */
    uint64_t addr, len;
    kvl_mem_kind_t kind;
    int32_t dev;
    int staged;                       /* VRAM UCX cannot map: no memh, no rkey */
    kvli_ucx_alloc_t *alloc;          /* inside a UCX allocation: its memh (not ours) */
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
} kvli_ucx_mh_t;

typedef struct kvli_ucx_rh {
    struct kvli_ucx_rh *next;         /* peer->rhs */
    kvli_ucx_peer_t *peer;
    uint64_t addr, len;
    ucp_rkey_h rkey;                  /* NULL when the peer stages the region */
} kvli_ucx_rh_t;

/*
 * Data workers. Endpoints to peers live on a data worker, not on the main
 * worker (iface->worker, whose address our metadata carries and which takes
 * the peers' requests and notifications); the peers' replies (staged data,
 * UCX's own protocol) come back to it. UCX 1.13 keeps a failed
 * shared-memory endpoint whose FIFO the dead process left full (a kill
 * during a WRITE) until its worker is destroyed: 4 MiB mapped and a flush
 * retried at every progress call, per kill. So a data worker is retired
 * when one of its peers dies (UCX's error callback) or is closed without a
 * clean flush: new peers go to a fresh one (iface->dw_cur), and a retired
 * worker is destroyed, with all UCX kept for its dead, when its last peer
 * is unloaded. A worker costs ~4.4 MB resident and ~12 descriptors on
 * UCX's default transports, so peers share one while nothing dies.
 */
typedef struct kvli_ucx_dw {
    struct kvli_ucx_dw *next;         /* iface->dws */
    ucp_worker_h worker;
    int efd;                          /* its event fd, -1 if none */
    /* under iface->lock */
    unsigned peers;                   /* peers whose endpoint is (was) on it */
    int retired;                      /* no new peers; destroyed once empty */
} kvli_ucx_dw_t;

struct kvli_ucx_peer {
    kvli_ucx_peer_t *next;
    kvli_ucx_iface_t *iface;
    char name[KVL_NAME_MAX];
    uint64_t incarnation;
    uint32_t pid;
    char remote_tls[256];             /* transports the peer's UCX offered */
    kvli_ucx_dw_t *dw;                /* the data worker of its endpoint */
    ucp_worker_h worker;              /* dw->worker; NULL once closed */
    ucp_ep_h ep;
    kvli_ucx_rh_t *rhs;
    /* Liveness: the last time the peer showed progress (a put, get, flush
     * or send to it completed), kvli_clock_ms(). A transfer times out only
     * when neither it nor the peer moved for its timeout; death is UCX's
     * to say (endpoint error callback: keepalive or transport error). */
    _Atomic uint64_t heard_ms;
    /* puts/gets UCX still holds (their callback takes the peer): a peer
     * closed with some left, or whose close did not finish, is a zombie,
     * kept (iface->zombies) until the backend closes */
    atomic_uint rma_out;
    /* under iface->lock */
    int dead;                         /* UCX's endpoint error callback */
    ucs_status_t dead_status;
    char dead_what[200];
    unsigned active;                  /* postings in flight */
    int closing;                      /* unload asked the progress thread to close it */
    int gone;                         /* closed: its endpoint too, off iface->peers */
    int zombie;                       /* UCX may still call back with it: never freed
                                         before the backend closes (iface->zombies) */
    /* progress thread only (kvli_ucx_peers_sweep) */
    kvli_ucx_peer_t *close_next;
    int close_state;                  /* 0 asked, 1 flushing, 2 to destroy, 3 destroyed */
    int close_dead;
    int close_clean;                  /* the closing flush completed: nothing left */
    void *close_req;                  /* the closing flush */
    uint64_t close_until;
};

enum {
    KVLI_UCX_X_ISSUE = 0,             /* more batches to issue */
    KVLI_UCX_X_FLUSH = 1,             /* a batch flush is outstanding */
    KVLI_UCX_X_NOTIF = 2,             /* data flushed, notification in flight */
    KVLI_UCX_X_END = 3                /* finished (xfer_done called) */
};

/* under iface->lock: the callback may run while a waiter looks */
struct kvli_ucx_token {
    kvli_ucx_iface_t *iface;
    int abandoned;                    /* owner gave up: the callback frees it */
    int done;
    ucs_status_t status;
    void *buf;                        /* AM header + message copy */
    /* a notification waiting for the target's answer (iface->ans_wait) */
    kvli_ucx_token_t *ans_next;
    uint64_t ans_id;
    int ans_linked;                   /* on iface->ans_wait */
    int answered;
    kvl_status_t ans_status;          /* the target's: KVL_OK or why it refused */
    char ans_text[KVLI_UCX_NOTIF_TEXT];
};

/* An answer to a received notification, queued by the AM handler for the
 * progress thread to send on the sender's reply endpoint. */
struct kvli_ucx_nans {
    kvli_ucx_nans_t *next;
    ucp_ep_h ep;
    kvli_ucx_token_t *tok;            /* buf: header + text */
    size_t hlen, tlen;
};

struct kvli_ucx_xpriv {
    kvli_ucx_xpriv_t *next;           /* iface->queue, then the progress list */
    kvl_bk_xfer_t *x;
    kvli_ucx_peer_t *peer;
    int state;
    kvli_chunk_cur_t cur;             /* the next piece to issue (common/chunk.h) */
    uint64_t issued, confirmed;       /* bytes */
    uint64_t last_ms;                 /* last progress, for the watchdog */
    uint64_t timeout_ms;
    kvli_ucx_token_t *tok;            /* outstanding flush / AM */
    /* staged (ucx_stage.c): data through active messages and bounce buffers */
    int staged;
    kvli_ucx_chunk_t *chunks;         /* requests in flight, oldest first */
    /* under iface->lock */
    int cancel;
    int abort;                        /* kvl_agent_destroy: no waiting for the peer */
    int finished;                     /* xfer_done called, off the lists */
    unsigned waiters;
    atomic_int done_called;           /* xfer_done exactly once */
};

struct kvli_ucx_iface {
    kvl_bk_ctx_t *ctx;
    uint64_t timeout_ms;
    int missing_refuse;               /* parameter missing_devices */
    int err_mode_peer;                /* parameter error_handling */
    ucp_context_h context;
    ucp_worker_h worker;
    uint64_t mem_types;
    char transports[256];             /* "tcp/lo sysv/memory ..." */
    char tls_list[160];               /* "tcp,sysv,posix,cma,self" */
    char tls_cfg[100];                /* UCX_TLS in effect: parameter, env or "(unset)" */
    int pinning;                      /* some transport pins memory (RDMA) */
    /* UCX_NET_DEVICES named devices UCX does not have: every mem_reg and
     * peer_load is refused with this (unless missing_devices=warn). */
    int config_bad;
    kvl_error_t config_err;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;                          /* worker event fd, -1 if none */
    kvli_progress_t pg;               /* progress thread, wake fd, stop flag */
    unsigned idle;                    /* progress thread: empty turns in a row */
    uint64_t turn_ms;                 /* progress thread: its last transfer pass */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvli_ucx_peer_t *peers;
    kvli_ucx_peer_t *zombies;         /* closed peers UCX may still call back with */
    atomic_int sweep;                 /* peers or data workers changed: sweep them */
    kvli_ucx_dw_t *dws;               /* data workers, under lock */
    kvli_ucx_dw_t *dw_cur;            /* where new peers go; NULL: a new one */
    /* progress thread only: the data workers and event fds this turn */
    ucp_worker_h *pw;
    int *pw_efd;
    size_t pw_n, pw_cap;
    kvli_ucx_mh_t *mhs;
    kvli_ucx_alloc_t *allocs;         /* unmapped after mhs, before the worker */
    kvli_ucx_xpriv_t *queue;          /* posted, not yet taken by progress */
    kvli_ucx_xpriv_t *running;        /* progress thread's own list */
    struct kvli_ucx_linger *lingers;  /* failed transfers' gets/puts in flight (progress thread) */
    /* notifications: those waiting for their answer (under lock), and the
     * answers this agent owes (progress thread only) */
    kvli_ucx_token_t *ans_wait;
    uint64_t ans_next_id;
    kvli_ucx_nans_t *ans_out, **ans_out_tail;
    /* staging (ucx_stage.c); progress thread only, or after it is joined */
    int data_path_am;                 /* parameter data_path=am */
    unsigned stage_max_ranges;        /* fits UCX's AM header limit */
    uint64_t stage_next_id;
    kvli_ucx_chunk_t *stage_live;     /* initiator requests awaiting replies */
    kvli_ucx_chunk_t *stage_orphans;  /* ended, waiting for UCX to let go */
    kvli_ucx_job_t *stage_jobs;       /* target: requests being served */
    /* bounce buffers (filled ahead of the first staged transfer once staging
     * becomes likely: a staged region here or at a peer, data_path=am) */
    kvli_bounce_pool_t bounce;
    kvli_ucx_iface_t *next_live;
    int closed;
};

/* ucx_log.c: capture UCX's log lines of one call on the calling thread */
void kvli_ucx_log_begin(kvli_ucx_log_t *log);
void kvli_ucx_log_end(void);
void kvli_ucx_log_install(void);
/* "; UCX said: <lines>" or "" */
const char *kvli_ucx_log_said(const kvli_ucx_log_t *log, char *buf, size_t len);

/* ucx_iface.c */
/* Create a worker (UCS_THREAD_MODE_MULTI) with our active-message handlers:
 * the backend's own (main: requests and notifications) or a peer's
 * (replies). KVL_OK or the diagnosis in err. */
kvl_status_t kvli_ucx_worker_new(kvli_ucx_iface_t *iface, int main_worker, ucp_worker_h *w_p,
                                 int *efd_p, kvl_error_t *err);

/* ucx_diag.c */
void kvli_ucx_diag_resources(kvli_ucx_iface_t *iface);
int kvli_ucx_tls_has_shm(const char *list);
/* tls / dev: the backend parameters (tls=, net_devices=), "" when not given:
 * the diagnosis blames the setting UCX really used, parameter or variable. */
void kvli_ucx_diag_init_failed(kvl_error_t *err, const char *call, ucs_status_t s,
                               const kvli_ucx_log_t *log, const char *tls, const char *dev);
void kvli_ucx_diag_net_devices(kvli_ucx_iface_t *iface, const kvli_ucx_log_t *log);
void kvli_ucx_diag_memlock(kvli_ucx_iface_t *iface, uint64_t len, char *buf, size_t cap);
void kvli_ucx_diag_map_failed(kvli_ucx_iface_t *iface, const kvl_region_info_t *r,
                              ucs_status_t s, const kvli_ucx_log_t *log, kvl_error_t *err);
void kvli_ucx_diag_unreachable(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                               ucs_status_t s, const kvli_ucx_log_t *log, kvl_error_t *err);
const char *kvli_ucx_mem_types_str(uint64_t types, char *buf, size_t len);

/* ucx_probe.c: the ops table's probe slot (kvlane doctor's ucx.* checks) */
void kvli_ucx_probe(void (*report)(void *arg, const char *check, int status,
                                   const char *observed, const char *hint),
                    void *arg, kvl_mem_kind_t mem, int32_t dev, uint64_t planned_bytes);

/* ucx_md.c */
kvl_status_t kvli_ucx_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p,
                             char *detail, size_t detail_len, kvl_error_t *err);
void kvli_ucx_md_dereg(void *bk, void *mh);
void kvli_ucx_md_unmap(kvli_ucx_iface_t *iface, kvli_ucx_mh_t *mh);
kvl_status_t kvli_ucx_md_alloc(void *bk, size_t len, void **ptr_p, void **ah_p, char *detail,
                               size_t detail_len, kvl_error_t *err);
void kvli_ucx_md_free(void *bk, void *ah);
/* Unmap an allocation (teardown); the record stays until md_free. */
void kvli_ucx_md_alloc_unmap(kvli_ucx_iface_t *iface, kvli_ucx_alloc_t *al);
kvl_status_t kvli_ucx_md_pack(void *bk, void *mh, uint8_t *buf, size_t cap, size_t *len_p);
kvl_status_t kvli_ucx_md_rload(void *bk, void *peer, const kvl_region_info_t *r,
                               const uint8_t *key, size_t len, void **rh_p, kvl_error_t *err);
void kvli_ucx_md_runload(void *bk, void *peer, void *rh);

/* ucx_ep.c */
kvl_status_t kvli_ucx_ep_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p);
kvl_status_t kvli_ucx_ep_load(void *bk, const char *name, uint64_t incarnation,
                              const uint8_t *conn, size_t len, void **peer_p,
                              kvl_error_t *err);
void kvli_ucx_ep_unload(void *bk, void *peer);
/* Under iface->lock: the peer counts as dead from now on (what), and its
 * data worker takes no new peers. */
void kvli_ucx_peer_mark_dead(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                             ucs_status_t status, const char *what);
void kvli_ucx_ep_describe(void *bk, void *peer, char *buf, size_t len);
/* Close the endpoint (forced: nothing of ours is in flight any more, or it
 * is being abandoned) and let go of its data worker (retired unless the
 * close was clean). Until flush_until_ms (kvli_clock_ms(); 0: not at all) a
 * peer not known dead first gets a flush, so a connection still being set
 * up finishes before it is cut. The progress thread (kvli_ucx_peers_sweep)
 * or teardown, never both. */
void kvli_ucx_ep_destroy(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                         uint64_t flush_until_ms);
/* Destroy the retired data workers no peer uses any more (all: every one,
 * at teardown). The progress thread or teardown. */
void kvli_ucx_dw_reap(kvli_ucx_iface_t *iface, int all);
/* Progress thread: move on the closing of the peers unload asked to close,
 * reap data workers, then list them in iface->pw for this turn. 1 while a
 * closing flush is pending. */
int kvli_ucx_peers_sweep(kvli_ucx_iface_t *iface);
uint32_t kvli_ucx_crc32(const uint8_t *p, size_t n);

/* ucx_stage.c */
kvl_status_t kvli_ucx_stage_reg(kvli_ucx_iface_t *iface, const kvl_region_info_t *r,
                                kvl_error_t *err);
int kvli_ucx_stage_needed(kvli_ucx_iface_t *iface, const kvl_bk_xfer_t *x);
/* 1 when the transfer ended (xfer_done called) */
int kvli_ucx_stage_advance(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp);
int kvli_ucx_stage_progress(kvli_ucx_iface_t *iface);
void kvli_ucx_stage_abandon(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp);
/* Bytes of xp's staged WRITE requests out and not acknowledged: what may
 * still land at the target if xp is given up now. */
uint64_t kvli_ucx_stage_unconfirmed(const kvli_ucx_xpriv_t *xp);
void kvli_ucx_stage_release_descs(kvli_ucx_iface_t *iface);
/* A data worker goes: release what it holds (before ucp_worker_destroy),
 * then free the ended requests it carried (after: no callback comes). */
void kvli_ucx_stage_worker_release(kvli_ucx_iface_t *iface, ucp_worker_h w);
void kvli_ucx_stage_worker_gone(kvli_ucx_iface_t *iface, ucp_worker_h w);
void kvli_ucx_stage_free_all(kvli_ucx_iface_t *iface);
void kvli_ucx_stage_expect(kvli_ucx_iface_t *iface);
ucs_status_t kvli_ucx_stage_req_recv(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length,
                                     const ucp_am_recv_param_t *param);
ucs_status_t kvli_ucx_stage_reply_recv(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param);

/* ucx_xfer.c */
/* A READ (WRITE) that ended failed with gets (puts) still in flight: until
 * the flush behind them ends (they ended, or UCX gave them up), the
 * transfer's local regions stay pinned in the core, so that deregistering
 * them is refused (in use) instead of letting those bytes land in memory
 * given back (UCX reading memory given back, through a memory handle
 * unmapped, and sending it to the peer). */
typedef struct kvli_ucx_linger {
    struct kvli_ucx_linger *next;
    kvli_ucx_token_t *tok;            /* the flush of the gets or puts */
    size_t npins;
    void *pins[];                     /* ctx->region_pin of each local region */
} kvli_ucx_linger_t;

void kvli_ucx_linger_sweep(kvli_ucx_iface_t *iface, int all);

kvli_ucx_token_t *kvli_ucx_tok_new(kvli_ucx_iface_t *iface, size_t buf_len);
void kvli_ucx_tok_cb(void *req, ucs_status_t status, void *user_data);
void kvli_ucx_tok_drop(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok);
int kvli_ucx_tok_done(kvli_ucx_iface_t *iface, kvli_ucx_token_t *tok, ucs_status_t *s);
void kvli_ucx_xfer_complete(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp, kvl_status_t st,
                            const kvl_error_t *err);
void kvli_ucx_xfer_fail(kvli_ucx_iface_t *iface, kvli_ucx_xpriv_t *xp, kvl_status_t code,
                        const char *why);
kvl_status_t kvli_ucx_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err);
void kvli_ucx_xfer_cancel(void *bk, kvl_bk_xfer_t *x);
void kvli_ucx_xfer_abort(void *bk, kvl_bk_xfer_t *x);
int kvli_ucx_xfer_progress(kvli_ucx_iface_t *iface);
void kvli_ucx_xfer_fail_all(kvli_ucx_iface_t *iface, const char *why);
void kvli_ucx_xfer_cancel_peer(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer);
kvl_status_t kvli_ucx_notif_send(void *bk, void *peer, const void *msg, size_t len,
                                 kvl_error_t *err);
ucs_status_t kvli_ucx_notif_recv(void *arg, const void *header, size_t header_length,
                                 void *data, size_t length, const ucp_am_recv_param_t *param);
ucs_status_t kvli_ucx_notif_ans_recv(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length,
                                     const ucp_am_recv_param_t *param);
/* Progress thread: send every answer owed (returns 0: none is left). */
int kvli_ucx_notif_progress(kvli_ucx_iface_t *iface);
/* Teardown, progress thread joined: drop the answers never sent. */
void kvli_ucx_notif_free_all(kvli_ucx_iface_t *iface);

#endif
