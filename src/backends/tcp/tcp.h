/*
 * kvlane tcp backend: private structures shared by the files of this folder.
 *
 * Objects and who owns what:
 *   iface  - one per open(): listening socket, the progress thread.
 *   peer   - one per peer_load(): our connection to a remote agent (we are the
 *            initiator on it), its send queue, the requests waiting for a
 *            reply and the transfers posted to it.
 *   conn   - one per accepted connection: a remote agent that loaded us (we
 *            are the target on it). Only the progress thread touches conns.
 *   msg    - one outgoing message on a peer connection: a request (WRITE,
 *            READ) with its ranges and payload iovecs, or a NOTIF/CANCELED.
 *   xpriv  - per posted transfer (x->bk_priv).
 *
 * Progress model: one progress thread per backend does all socket I/O with
 * non-blocking sockets and poll(): it cuts posted transfers into requests,
 * sends them (sendmsg straight from registered memory), reads replies
 * (recvmsg straight into registered memory), serves accepted connections and
 * checks every bound. Application threads only queue work and wait.
 *
 * Locking: iface->lock guards peers, their queues and transfers. The
 * progress thread holds it while it works on peer connections (all of that is
 * non-blocking) and releases it around poll(), around calls into the core
 * (xfer_done, region_pin, notif_deliver) and while it serves accepted
 * connections, which are its alone.
 */
#ifndef KVLI_TCP_H
#define KVLI_TCP_H

#include <pthread.h>
#include "common/accept.h"
#include "common/clock.h"
#include "common/bounce.h"
#include "common/chunk.h"
#include "common/progress.h"
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <kvlane/backend.h>
#include "common/auth.h"
#include "tcp_proto.h"
#include "common/inet.h"

#define KVLI_TCP_NAME "tcp"
#define KVLI_TCP_DEFAULT_TIMEOUT_MS 5000u
#define KVLI_TCP_CHUNK_DEFAULT (4u << 20)      /* bytes per request */
#define KVLI_TCP_WINDOW_BYTES (32ull << 20)    /* requests in flight per peer */
#define KVLI_TCP_WINDOW_REQS 32u
#define KVLI_TCP_CONNS_MAX 1024u               /* accepted connections */
#define KVLI_TCP_OUTQ_MAX 64u                  /* replies queued before we stop reading */
#define KVLI_TCP_BUDGET (16u << 20)            /* bytes per connection per loop */
#define KVLI_TCP_CANCEL_PREFIX "kvlane:canceled:"
#define KVLI_TCP_STAGE_BUFS 12u                /* pinned chunk buffers for VRAM staging */
#define KVLI_TCP_STAGE_MAX (256ull << 20)      /* largest request a target stages */
#define KVLI_TCP_HUP_CHECK (1u << 20)          /* WRITE bytes copied between checks that
                                                * the initiator still holds the connection */

typedef struct kvli_tcp_iface kvli_tcp_iface_t;
typedef struct kvli_tcp_peer kvli_tcp_peer_t;
typedef struct kvli_tcp_conn kvli_tcp_conn_t;
typedef struct kvli_tcp_msg kvli_tcp_msg_t;
typedef struct kvli_tcp_reply kvli_tcp_reply_t;
typedef struct kvli_tcp_xpriv kvli_tcp_xpriv_t;


typedef struct kvli_tcp_mh {
    uint64_t addr, len;
    int staged;                     /* VRAM: moved through pinned host buffers */
    int32_t dev;
} kvli_tcp_mh_t;

typedef struct kvli_tcp_rh {
    kvli_tcp_peer_t *peer;
    uint64_t addr, len;
} kvli_tcp_rh_t;

/* A kvl_notif_send waiting for its answer (under iface->lock). */
typedef struct kvli_tcp_nwait {
    int state;                      /* 0 waiting, 1 queued, 2 refused, -1 lost */
    kvl_status_t status;            /* the refusal's */
    char text[KVLI_TCP_TEXT_MAX + 1];
} kvli_tcp_nwait_t;

struct kvli_tcp_msg {
    kvli_tcp_msg_t *next;
    kvli_tcp_xpriv_t *xp;           /* transfer it belongs to, NULL for kvl_notif_send */
    uint16_t type;
    uint64_t id;
    uint64_t bytes;                 /* WRITE: payload sent; READ: payload expected */
    uint64_t off0;                  /* connection stream offset of its first byte (once sent) */
    size_t head_len;                /* header + ranges or notification bytes */
    size_t total, sent;
    int niov;                       /* WRITE: source; READ: where the reply lands */
    struct iovec *iov;
    uint8_t *head;
    kvli_tcp_nwait_t *wait;         /* kvl_notif_send waits for the NOTIF_ACK (or the send) */
    uint8_t grant[4];               /* NOTIF_ACK's tail: slots added */
    /* VRAM staging: the chunk's VRAM pieces go through bounce (iovs point
     * into it). WRITE: ticket is the download, sent once done. READ: the
     * reply lands in bounce, then the upload (ticket) runs before the
     * request counts as answered. */
    void *bounce;
    void *ticket;
    kvl_stage_piece_t *sp;
    int nsp;
};

enum { KVLI_TCP_NOTIF_NONE = 0, KVLI_TCP_NOTIF_QUEUED = 1, KVLI_TCP_NOTIF_SENT = 2 };

struct kvli_tcp_xpriv {
    kvli_tcp_xpriv_t *next;         /* peer->xfers */
    kvl_bk_xfer_t *x;
    kvli_tcp_peer_t *peer;
    uint64_t timeout_ms;
    kvli_chunk_cur_t cur;           /* chunking cursor (progress thread, under lock) */
    int all_queued;
    unsigned outstanding;           /* requests queued or waiting for a reply */
    uint64_t moved;                 /* bytes confirmed by the target */
    uint64_t inflight;              /* WRITE bytes that reached the peer's kernel unanswered
                                     * when the connection was given up: they may still land */
    int notif_state;
    int notice;                     /* the notif_state message is a CANCELED notice */
    int staged;                     /* a chunk was staged: the path says so */
    atomic_int cancel;
    int abort;                      /* agent destroyed: give its requests on the wire up */
    kvl_status_t status;            /* first failure */
    kvl_error_t *err;
    int finished;                   /* 0 live, -1 being reported, 1 reported */
    unsigned waiters;
    kvli_tcp_xpriv_t *next_done;
};

struct kvli_tcp_peer {
    kvli_tcp_peer_t *next;
    kvli_tcp_iface_t *iface;
    char name[KVL_NAME_MAX];
    uint64_t incarnation;
    struct sockaddr_storage sa;
    socklen_t salen;
    char addr[KVLI_TCP_ADDR_STR];
    pthread_mutex_t connect_lock;   /* one (re)connection at a time */
    /* under iface->lock */
    int fd;                         /* -1 when dead */
    int dead;
    int dead_errno;
    char dead_what[256];
    int unloading, detached;
    unsigned connects;
    kvli_tcp_xpriv_t *xfers;
    kvli_tcp_xpriv_t *rr;
    kvli_tcp_msg_t *sq_head, *sq_tail;
    kvli_tcp_msg_t *wq_head, *wq_tail;
    kvli_tcp_msg_t *up_head;        /* READ replies being uploaded to VRAM */
    unsigned sq_unsent;
    uint32_t notif_slots;           /* our notification grant there (under iface->lock) */
    uint32_t notif_slots_hi;        /* the most it held: more is asked at half */
    int notif_topup;                /* a NOTIF_GRANTED asking for more is unanswered */
    uint64_t next_id;
    uint64_t tx_off;                /* bytes handed to the kernel on this connection */
    uint64_t win_bytes;
    unsigned win_reqs;
    uint64_t progress_ns;
    /* reply being read */
    uint8_t rhdr[KVLI_TCP_HDR_LEN];
    size_t rhdr_got;
    int rphase;
    kvli_tcp_hdr_t rh;
    char rtext[KVLI_TCP_TEXT_MAX + 1];
    size_t rtext_got;
    uint64_t rpay_got;
};

struct kvli_tcp_reply {
    kvli_tcp_reply_t *next;
    uint8_t head[KVLI_TCP_HDR_LEN + KVLI_TCP_ACK_MAX];
    size_t head_len;
    struct iovec *iov;              /* READ_DATA payload in our memory */
    int niov;
    void **pins;                    /* held until the payload is sent */
    unsigned npins;
    size_t total, sent;
    void *bounce;                   /* READ of VRAM: the staged data */
};

enum {
    KVLI_TCP_CONN_AUTH1 = 0,        /* waiting for AUTH1 */
    KVLI_TCP_CONN_AUTH3 = 1,        /* AUTH2 sent, waiting for AUTH3 */
    KVLI_TCP_CONN_HELLO = 2,        /* authenticated, waiting for HELLO */
    KVLI_TCP_CONN_READY = 3,
    KVLI_TCP_CONN_DRAINING = 4,     /* refused: flush the last reply, then close */
    KVLI_TCP_CONN_CLOSED = 5
};

/* RX_STAGE: the request's VRAM copy runs (asynchronously); the connection
 * is not read until it is done and the reply queued. */
enum { KVLI_TCP_RX_HDR = 0, KVLI_TCP_RX_BODY = 1, KVLI_TCP_RX_PAYLOAD = 2, KVLI_TCP_RX_DRAIN = 3,
       KVLI_TCP_RX_STAGE = 4 };

struct kvli_tcp_conn {
    kvli_tcp_conn_t *next;
    int fd;
    int state;
    char addr[KVLI_TCP_ADDR_STR];
    char name[KVL_NAME_MAX];        /* "?" until HELLO */
    uint64_t incarnation;
    kvli_tcp_auth_t auth;
    uint64_t deadline_ns;           /* handshake must end by then */
    uint64_t progress_ns;
    /* request being read */
    int rphase;
    uint8_t hbuf[KVLI_TCP_HDR_LEN];
    size_t hgot;
    kvli_tcp_hdr_t h;
    uint8_t *body;                  /* auth messages, HELLO, ranges, notifications */
    size_t body_cap, body_len, body_got;
    uint64_t *ranges;
    struct iovec *iov;
    int niov;
    void **pins;
    unsigned npins;
    uint64_t pay_got;
    kvl_status_t refuse;
    char refuse_text[KVLI_TCP_TEXT_MAX];
    /* The initiator reset or closed the connection: what is still queued in
     * it belongs to requests it gave up on. WRITE payloads are dropped, not
     * copied; nothing is answered. */
    int abandoned;
    uint64_t hup_at;                /* pay_got when the connection was last checked */
    /* VRAM ranges of the request: staged through bounce */
    kvl_stage_piece_t *sp;
    int nsp;
    void *bounce;
    void *ticket;                   /* RX_STAGE: the copy in flight */
    int stage_write;                /* RX_STAGE: uploading a WRITE (else a READ's download) */
    kvli_tcp_reply_t *stage_reply;  /* RX_STAGE of a READ: queued once the copy is done */
    /* replies */
    kvli_tcp_reply_t *oq_head, *oq_tail;
    unsigned oq_n;
    uint32_t notif_slots;           /* its notification grant (tcp_proto.h): unused */
};

struct kvli_tcp_iface {
    kvl_bk_ctx_t *ctx;
    uint64_t timeout_ms;
    const uint8_t *secret;
    size_t secret_len;
    char host[256];
    struct sockaddr_storage sa;     /* bound */
    socklen_t salen;
    char addr[KVLI_TCP_ADDR_STR];   /* advertised */
    kvli_tcp_conninfo_t ci;
    int sndbuf, rcvbuf;
    uint64_t chunk;
    int listen_fd;
    kvli_progress_t pg;             /* progress thread, wake fd, stop flag */
    size_t poll_npeers;             /* progress thread: peers end here in its poll set */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvli_tcp_peer_t *peers;
    kvli_tcp_conn_t *conns;         /* progress thread only */
    unsigned nconns;
    uint8_t *scratch;               /* progress thread only */
    size_t scratch_len;
    struct iovec *tx_iov;           /* progress thread only */
    int warned_conns;
    kvli_accept_backoff_t accept_bo; /* progress thread only: paused when out of fds */
    kvli_bounce_pool_t bounce;      /* pinned staging buffers of `chunk` bytes (VRAM) */
    atomic_uint staging;            /* copies in flight: the progress loop polls */
};

/* tcp_iface.c */

/* tcp_peer.c */
kvl_status_t kvli_tcp_peer_load(void *bk, const char *name, uint64_t incarnation,
                                const uint8_t *conn, size_t len, void **peer_p, kvl_error_t *err);
void kvli_tcp_peer_unload(void *bk, void *peer);
void kvli_tcp_peer_describe(void *bk, void *peer, char *buf, size_t len);
/* Connect (again) when dead; KVL_OK when alive. Called without iface->lock. */
kvl_status_t kvli_tcp_peer_ensure(kvli_tcp_peer_t *peer, uint64_t timeout_ms, kvl_error_t *err);
/* Under iface->lock: close the connection and fail what was on it. */
void kvli_tcp_peer_mark_dead(kvli_tcp_peer_t *peer, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* inflight: bytes of the transfer that may still land (they reached the
 * peer's kernel unanswered before the connection was reset). */
kvl_status_t kvli_tcp_peer_disconnect_error(kvli_tcp_peer_t *peer, uint64_t moved, uint64_t total,
                                            uint64_t inflight, kvl_error_t *err);
/* Progress thread, under iface->lock. */
void kvli_tcp_peer_rx(kvli_tcp_peer_t *peer);
void kvli_tcp_peer_tx(kvli_tcp_peer_t *peer);
kvl_status_t kvli_tcp_peer_notif_send(void *bk, void *peer, const void *msg, size_t len,
                                      kvl_error_t *err);
kvli_tcp_msg_t *kvli_tcp_msg_new(uint16_t type, int niov, size_t head_len);
kvli_tcp_msg_t *kvli_tcp_notif_new(size_t len);
int kvli_tcp_notif_form(kvli_tcp_peer_t *peer, kvli_tcp_msg_t *m, size_t len);
void kvli_tcp_peer_enqueue(kvli_tcp_peer_t *peer, kvli_tcp_msg_t *m);

/* tcp_conn.c (target side, progress thread only) */
void kvli_tcp_conn_accept(kvli_tcp_iface_t *iface);
void kvli_tcp_conn_progress(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, short revents);
void kvli_tcp_conn_check(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c, uint64_t now);
short kvli_tcp_conn_events(const kvli_tcp_conn_t *c);
void kvli_tcp_conn_free(kvli_tcp_iface_t *iface, kvli_tcp_conn_t *c);

/* tcp_xfer.c */
kvl_status_t kvli_tcp_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err);
void kvli_tcp_xfer_cancel(void *bk, kvl_bk_xfer_t *x);
void kvli_tcp_xfer_abort(void *bk, kvl_bk_xfer_t *x);
/* Progress thread, under iface->lock: queue requests, collect finished
 * transfers into *done (xfer_done is called by kvli_tcp_xfer_complete). */
void kvli_tcp_xfer_generate(kvli_tcp_peer_t *peer);
void kvli_tcp_xfer_reap(kvli_tcp_peer_t *peer, kvli_tcp_xpriv_t **done);
void kvli_tcp_xfer_fail(kvli_tcp_xpriv_t *xp, kvl_status_t st, const kvl_error_t *err);
/* A failed transfer whose connection was then reset: its error gets what
 * may still land (xp->inflight). */
void kvli_tcp_xfer_inflight_note(kvli_tcp_xpriv_t *xp);
void kvli_tcp_xfer_complete(kvli_tcp_iface_t *iface, kvli_tcp_xpriv_t *done);
int kvli_tcp_peer_busy(const kvli_tcp_peer_t *peer);

/* tcp_stage.c: VRAM through pinned host buffers */
/* Called by the driver once copies are done: wakes the progress thread. */
void kvli_tcp_stage_notify(void *arg);
/* Free a message, waiting for its staging copies, returning its buffer. */
void kvli_tcp_msg_free(kvli_tcp_iface_t *iface, kvli_tcp_msg_t *m);
/* Progress thread, under lock: finished uploads of READ replies. */
void kvli_tcp_stage_uploads(kvli_tcp_peer_t *peer);
/* Initiator: stage the VRAM pieces of m (walk filled iovs and sp). */
int kvli_tcp_stage_request(kvli_tcp_peer_t *peer, kvli_tcp_msg_t *m);

/* tcp_md.c */
kvl_status_t kvli_tcp_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p, char *detail,
                             size_t detail_len, kvl_error_t *err);
void kvli_tcp_md_dereg(void *bk, void *mh);
kvl_status_t kvli_tcp_md_pack(void *bk, void *mh, uint8_t *buf, size_t cap, size_t *len_p);
kvl_status_t kvli_tcp_md_rload(void *bk, void *peer, const kvl_region_info_t *r,
                               const uint8_t *key, size_t len, void **rh_p, kvl_error_t *err);
void kvli_tcp_md_runload(void *bk, void *peer, void *rh);

#endif
