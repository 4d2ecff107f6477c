/*
 * kvlane shm backend: transfers. Posting and cancelling, and the copy
 * workers that walk a transfer's segments in chunks and move each chunk by
 * the best path its remote region allows: a mapped memfd (memcpy), cross
 * memory attach (process_vm_readv/writev), or socket requests.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/uio.h>
#include "common/errname.h"
#include "common/chunk.h"
#include "common/clock.h"
#include "shm.h"
#include "shm_proto.h"

enum {
    KVLI_SHM_PATH_MMAP = 1,
    KVLI_SHM_PATH_CMA = 2,
    KVLI_SHM_PATH_SOCK = 4
};

/* The path a transfer took, for its report: one of eight constant names. */
static void kvli_shm_path_name(unsigned paths, char *out, size_t cap)
{
    static const char *const names[8] = {"", "mmap", "cma", "mmap+cma", "socket",
                                          "mmap+socket", "cma+socket", "mmap+cma+socket"};
    const char *n = names[paths & 7u];
    size_t l = strlen(n);
    if (l >= cap)
        l = cap - 1;
    memcpy(out, n, l);
    out[l] = '\0';
}

/* Walks a transfer (common/chunk.h); segments are checked as it reaches them. */
typedef struct kvli_shm_cursor {
    kvli_chunk_cur_t pos;
    size_t checked;                  /* segments validated so far */
} kvli_shm_cursor_t;

typedef struct kvli_shm_run {
    kvli_shm_worker_t *w;
    kvli_shm_xpriv_t *xp;
    kvl_bk_xfer_t *x;
    kvli_shm_peer_t *peer;
    uint64_t timeout_ms;
    uint64_t moved;                  /* by mmap and cma */
    unsigned paths;
    int n;                           /* pieces in w->liov/riov */
    uint64_t bytes;
    /* regions of the batch entered in the target's guard table (shm_guard.c) */
    const kvli_shm_rh_t *held[KVLI_SHM_HELD_MAX];
    unsigned nheld;
} kvli_shm_run_t;

int kvli_shm_worker_init(kvli_shm_worker_t *w, kvli_shm_iface_t *iface)
{
    int i;
    w->iface = iface;
    w->liov = malloc(sizeof(struct iovec) * (KVLI_SHM_IOV_MAX + 3));
    w->riov = malloc(sizeof(struct iovec) * KVLI_SHM_IOV_MAX);
    w->ranges = malloc(sizeof(uint64_t) * 2 * KVLI_SHM_IOV_MAX);
    w->req_iov = malloc(sizeof(struct iovec) * KVLI_SHM_WINDOW * KVLI_SHM_IOV_MAX);
    for (i = 0; i < KVLI_SHM_WINDOW; i++)
        w->reqs[i].done = 1;
    if (w->liov == NULL || w->riov == NULL || w->ranges == NULL || w->req_iov == NULL)
        return -1;
    return 0;
}

void kvli_shm_worker_fini(kvli_shm_worker_t *w)
{
    free(w->liov);
    free(w->riov);
    free(w->ranges);
    free(w->req_iov);
    w->liov = w->riov = w->req_iov = NULL;
    w->ranges = NULL;
}

static uint64_t kvli_shm_moved(kvli_shm_run_t *run)
{
    uint64_t v;
    pthread_mutex_lock(&run->w->iface->lock);
    v = run->moved + run->xp->sock_moved;
    pthread_mutex_unlock(&run->w->iface->lock);
    return v;
}

static uint64_t kvli_shm_inflight(kvli_shm_run_t *run)
{
    uint64_t v;
    pthread_mutex_lock(&run->w->iface->lock);
    v = run->xp->sock_inflight;
    pthread_mutex_unlock(&run->w->iface->lock);
    return v;
}

/* The peer is dead: the transfer's error, with what of it may still land. */
static kvl_status_t kvli_shm_run_gone(kvli_shm_run_t *run, kvl_error_t *err)
{
    return kvli_shm_peer_disconnect_error(run->peer, kvli_shm_moved(run), run->x->total_bytes,
                                          kvli_shm_inflight(run), err);
}

static int kvli_shm_span_ok(uint64_t base, uint64_t len, uint64_t stride, uint64_t count,
                            uint64_t rbase, uint64_t rlen)
{
    uint64_t last, end;
    if (__builtin_mul_overflow(count - 1, stride, &last) ||
        __builtin_add_overflow(base, last, &last) ||
        __builtin_add_overflow(last, len, &end))
        return 0;
    return base >= rbase && end <= rbase + rlen;
}

static kvl_status_t kvli_shm_seg_check(kvli_shm_run_t *run, size_t i, kvl_error_t *err)
{
    const kvl_seg_t seg = kvli_xchunk_seg(run->x, i), *s = &seg;
    const kvli_shm_mh_t *lh = run->x->lmh[s->lreg];
    const kvli_shm_rh_t *rh = run->x->rmh[s->rreg];
    const char *side = NULL;
    if (lh == NULL || rh == NULL || rh->peer != run->peer)
        side = "region handle";
    else if (!kvli_shm_span_ok(s->laddr, s->len, s->lstride, s->count, lh->addr, lh->len))
        side = "local blocks";
    else if (!kvli_shm_span_ok(s->raddr, s->len, s->rstride, s->count, rh->addr, rh->len))
        side = "remote blocks";
    if (side == NULL)
        return KVL_OK;
    kvl_bk_error_set(err, KVL_ERR_OUT_OF_BOUNDS, 0, KVLI_SHM_NAME, -1,
                     "segment %zu (local 0x%" PRIx64 ", remote 0x%" PRIx64 ", %" PRIu64
                     " x %" PRIu64 " bytes, strides %" PRIu64 "/%" PRIu64 "): %s outside "
                     "the region the segment names", i, s->laddr, s->raddr, s->count,
                     s->len, s->lstride, s->rstride, side);
    kvl_bk_error_hint(err, "a kvlane bug: the core validates descriptors before posting");
    return KVL_ERR_OUT_OF_BOUNDS;
}

static unsigned kvli_shm_seg_path(const kvli_shm_run_t *run, const kvli_shm_rh_t *rh)
{
    if (run->peer->guard == NULL) /* the target gave no guard table */
        return KVLI_SHM_PATH_SOCK;
    if (rh->map != NULL)
        return KVLI_SHM_PATH_MMAP;
    return run->peer->cma_ok ? KVLI_SHM_PATH_CMA : KVLI_SHM_PATH_SOCK;
}

/*
 * Fill w->liov/riov with the next pieces that share one path: up to
 * KVLI_SHM_IOV_MAX pieces and one chunk of bytes. For the mmap path riov
 * holds addresses in our mapping, else remote addresses.
 */
/* Leave the guard of every region the last batch copied into or out of. */
static void kvli_shm_guard_release(kvli_shm_run_t *run)
{
    for (unsigned i = 0; i < run->nheld; i++)
        kvli_shm_guard_leave(run->peer, run->held[i]);
    run->nheld = 0;
}

/* Before a direct copy touches rh: enter its guard (once per batch). 1 ok;
 * 0 the batch is full of regions (end it here); -1 the target revoked rh. */
static int kvli_shm_guard_hold(kvli_shm_run_t *run, const kvli_shm_rh_t *rh, kvl_error_t *err)
{
    for (unsigned i = run->nheld; i-- > 0;)
        if (run->held[i] == rh)
            return 1;
    if (run->nheld == KVLI_SHM_HELD_MAX)
        return 0;
    if (!kvli_shm_guard_enter(run->peer, rh)) {
        kvl_bk_error_set(err, KVL_ERR_STALE, 0, KVLI_SHM_NAME, -1,
                         "agent '%s' deregistered its region [0x%" PRIx64 ", +%" PRIu64 ") "
                         "(our metadata of it is stale): nothing more is copied into or out "
                         "of it", run->peer->name, rh->addr, rh->len);
        kvl_bk_error_hint(err, "the peer freed or re-registered that memory: fetch its "
                          "metadata again (kvl_metadata_load) and build the transfer again");
        return -1;
    }
    run->held[run->nheld++] = rh;
    return 1;
}

/* Validate the segments before `end` not checked yet. */
static kvl_status_t kvli_shm_check_below(kvli_shm_run_t *run, kvli_shm_cursor_t *c, size_t end,
                                         kvl_error_t *err)
{
    for (; c->checked < end; c->checked++) {
        kvl_status_t st = kvli_shm_seg_check(run, c->checked, err);
        if (st != KVL_OK)
            return st;
    }
    return KVL_OK;
}

static kvl_status_t kvli_shm_batch(kvli_shm_run_t *run, kvli_shm_cursor_t *c,
                                   unsigned *path_p, kvl_error_t *err)
{
    kvl_bk_xfer_t *x = run->x;
    unsigned path = 0;
    uint64_t limit = KVLI_SHM_CHUNK;
    kvli_xpiece_t xpc;
    const kvli_piece_t *pc = &xpc.p;
    kvl_status_t st;
    struct iovec *liov = run->w->liov, *riov = run->w->riov;
    uint32_t lreg = 0, rreg = 0;     /* the last piece's regions */
    run->n = 0;
    run->bytes = 0;
    *path_p = 0;
    while (run->n < KVLI_SHM_IOV_MAX && run->bytes < limit) {
        const kvli_shm_rh_t *rh;
        uint64_t piece, ra;
        unsigned p;
        if (!kvli_xchunk_peek(&c->pos, x, UINT64_MAX, &xpc))
            return kvli_shm_check_below(run, c, kvli_xchunk_count(x), err);
        st = kvli_shm_check_below(run, c, pc->seg + 1, err);
        if (st != KVL_OK)
            return st;
        rh = x->rmh[xpc.rreg];
        p = kvli_shm_seg_path(run, rh);
        if (path != 0 && p != path)
            break;
        if (p != KVLI_SHM_PATH_SOCK) {
            int h = kvli_shm_guard_hold(run, rh, err);
            if (h < 0)
                return KVL_ERR_STALE;
            if (h == 0)
                break;
        }
        path = p;
        *path_p = path;
        /* Each process_vm_writev call pays a ptrace check and page pinning
         * setup: give it more per call (still ~2 ms between cancel checks). */
        limit = p == KVLI_SHM_PATH_CMA ? KVLI_SHM_CMA_CHUNK : KVLI_SHM_CHUNK;
        piece = pc->len < limit - run->bytes ? pc->len : limit - run->bytes;
        ra = pc->raddr;
        if (p == KVLI_SHM_PATH_MMAP)
            ra = (uint64_t)(uintptr_t)(rh->map->base + rh->shm_off + (ra - rh->addr));
        if (run->n > 0 && xpc.lreg == lreg && xpc.rreg == rreg &&
            (uint64_t)(uintptr_t)liov[run->n - 1].iov_base + liov[run->n - 1].iov_len ==
                pc->laddr &&
            (uint64_t)(uintptr_t)riov[run->n - 1].iov_base + riov[run->n - 1].iov_len == ra) {
            /* the next bytes on both sides, in the same two regions (an
             * indexed transfer's run of neighbouring blocks, which pairing
             * into segments would have merged): one iovec, one range */
            liov[run->n - 1].iov_len += (size_t)piece;
            riov[run->n - 1].iov_len += (size_t)piece;
        } else {
            liov[run->n].iov_base = (void *)(uintptr_t)pc->laddr;
            liov[run->n].iov_len = (size_t)piece;
            riov[run->n].iov_base = (void *)(uintptr_t)ra;
            riov[run->n].iov_len = (size_t)piece;
            run->n++;
            lreg = xpc.lreg;
            rreg = xpc.rreg;
        }
        run->bytes += piece;
        kvli_xchunk_take(&c->pos, x, piece);
    }
    return KVL_OK;
}

static void kvli_shm_run_mmap(kvli_shm_run_t *run)
{
    struct iovec *l = run->w->liov, *r = run->w->riov;
    int i;
    if (run->x->op == KVL_WRITE) {
        for (i = 0; i < run->n; i++)
            memcpy(r[i].iov_base, l[i].iov_base, l[i].iov_len);
    } else {
        for (i = 0; i < run->n; i++)
            memcpy(l[i].iov_base, r[i].iov_base, l[i].iov_len);
    }
    run->moved += run->bytes;
}

static kvl_status_t kvli_shm_run_cma(kvli_shm_run_t *run, kvl_error_t *err)
{
    struct iovec *l = run->w->liov, *r = run->w->riov;
    int write = run->x->op == KVL_WRITE;
    int first = 0, n = run->n;
    const char *call = write ? "process_vm_writev" : "process_vm_readv";

    while (first < n) {
        unsigned long cnt = (unsigned long)(n - first);
        ssize_t got = write
            ? process_vm_writev(run->peer->pid, l + first, cnt, r + first, cnt, 0)
            : process_vm_readv(run->peer->pid, l + first, cnt, r + first, cnt, 0);
        int e = errno;
        if (got > 0 && first == 0 && (uint64_t)got == run->bytes) {
            run->moved += (uint64_t)got; /* all of it in one call: the usual case */
            break;
        }
        if (got > 0) {
            /* Paired pieces have equal lengths, so both arrays advance alike. */
            kvli_iov_advance(r + first, n - first, (size_t)got);
            first += kvli_iov_advance(l + first, n - first, (size_t)got);
            run->moved += (uint64_t)got;
            continue;
        }
        if (got < 0 && e == EINTR)
            continue;
        if (got == 0)
            e = EFAULT;  /* no progress: the next remote page is not there */
        if (e == ESRCH) {
            kvli_shm_peer_mark_dead(run->peer, ESRCH, "%s(pid %d) = -1 ESRCH (%s)", call,
                                    (int)run->peer->pid, strerror(ESRCH));
            return kvli_shm_run_gone(run, err);
        }
        kvl_bk_error_set(err, e == EFAULT ? KVL_ERR_REMOTE : e == EPERM ? KVL_ERR_PERMISSION
                         : KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "%s(pid %d, %lu iovecs, remote 0x%" PRIxPTR " local 0x%" PRIxPTR
                         ") = %zd %s (%s) after %" PRIu64 " of %" PRIu64 " bytes", call,
                         (int)run->peer->pid, cnt, (uintptr_t)r[first].iov_base,
                         (uintptr_t)l[first].iov_base, got, kvli_errno_name(e),
                         strerror(e), run->moved, run->x->total_bytes);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", run->peer->name);
        kvl_bk_error_hint(err, e == EFAULT
                          ? "the peer's memory there is not mapped: it freed or unmapped "
                            "a registered region (deregister before freeing)"
                          : e == EPERM
                          ? "the peer became non-attachable after loading (changed "
                            "credentials or PR_SET_DUMPABLE); reload its metadata"
                          : "unexpected; report it with the log");
        return err != NULL ? err->code : KVL_ERR_SYSTEM;
    }
    return KVL_OK;
}

/* Waits (lock held) for a free request slot. */
static kvli_shm_req_t *kvli_shm_slot_get(kvli_shm_run_t *run, kvl_status_t *st,
                                         kvl_error_t *err)
{
    kvli_shm_iface_t *iface = run->w->iface;
    struct timespec dl;
    uint64_t seen = run->xp->sock_moved;
    int i;
    kvli_shm_deadline(&dl, run->timeout_ms);
    for (;;) {
        if (atomic_load(&run->peer->dead)) {
            *st = KVL_ERR_REMOTE_DISCONNECT;
            return NULL;
        }
        for (i = 0; i < KVLI_SHM_WINDOW; i++)
            if (run->w->reqs[i].done)
                return &run->w->reqs[i];
        if (pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) == ETIMEDOUT) {
            if (run->xp->sock_moved != seen) {
                seen = run->xp->sock_moved;
                kvli_shm_deadline(&dl, run->timeout_ms);
                continue;
            }
            kvl_bk_error_set(err, KVL_ERR_TIMEOUT, ETIMEDOUT, KVLI_SHM_NAME, -1,
                             "agent '%s' (pid %d) acknowledged no socket request for %"
                             PRIu64 " ms (%" PRIu64 " of %" PRIu64 " bytes moved)",
                             run->peer->name, (int)run->peer->pid, run->timeout_ms,
                             run->moved + run->xp->sock_moved, run->x->total_bytes);
            kvl_bk_error_hint(err, "the peer is stuck or overloaded; check it, or raise "
                              "the transfer timeout");
            *st = KVL_ERR_TIMEOUT;
            return NULL;
        }
    }
}

static kvl_status_t kvli_shm_run_sock(kvli_shm_run_t *run, kvl_error_t *err)
{
    kvli_shm_worker_t *w = run->w;
    kvli_shm_iface_t *iface = w->iface;
    int write = run->x->op == KVL_WRITE;
    kvli_shm_msg_hdr_t h;
    kvli_shm_msg_rw_t m;
    kvli_shm_req_t *req;
    struct iovec *siov;
    kvl_status_t st = KVL_OK;
    int i, k, n = run->n;

    pthread_mutex_lock(&iface->lock);
    if (run->xp->abort) {
        /* the agent is destroyed: nothing more goes out (see xfer_abort) */
        pthread_mutex_unlock(&iface->lock);
        return KVL_ERR_CANCELED;
    }
    req = kvli_shm_slot_get(run, &st, err);
    if (req == NULL) {
        pthread_mutex_unlock(&iface->lock);
        if (st == KVL_ERR_REMOTE_DISCONNECT)
            return kvli_shm_run_gone(run, err);
        return st;
    }
    req->expect = write ? KVLI_SHM_MSG_WRITE_ACK : KVLI_SHM_MSG_READ_DATA;
    req->xp = run->xp;
    req->bytes = run->bytes;
    req->iov = w->req_iov + (req - w->reqs) * KVLI_SHM_IOV_MAX;
    req->iovcnt = n;
    if (!write)
        memcpy(req->iov, w->liov, sizeof(struct iovec) * (size_t)n);
    kvli_shm_peer_req_add(run->peer, req);
    run->xp->sending = 1;
    pthread_mutex_unlock(&iface->lock);

    for (i = 0; i < n; i++) {
        w->ranges[2 * i] = (uint64_t)(uintptr_t)w->riov[i].iov_base;
        w->ranges[2 * i + 1] = w->riov[i].iov_len;
    }
    h.magic = KVLI_SHM_MSG_MAGIC;
    h.type = write ? KVLI_SHM_MSG_WRITE : KVLI_SHM_MSG_READ;
    h.id = req->id;
    h.len = sizeof(m) + 16u * (uint64_t)n + (write ? run->bytes : 0);
    m.nranges = (uint32_t)n;
    m.reserved = 0;
    m.payload = run->bytes;
    /* Header, ranges and payload in one ordered write: the payload comes
     * straight from the caller's memory. liov has 3 spare slots for this. */
    siov = w->liov;
    if (write)
        memmove(siov + 3, siov, sizeof(struct iovec) * (size_t)n);
    siov[0].iov_base = &h;
    siov[0].iov_len = sizeof(h);
    siov[1].iov_base = &m;
    siov[1].iov_len = sizeof(m);
    siov[2].iov_base = w->ranges;
    siov[2].iov_len = 16u * (size_t)n;
    k = 3 + (write ? n : 0);
    /* Bounded by the transfer's timeout, not the agent's: a peer that takes
     * nothing for that long is given up in the middle of the request. */
    st = kvli_shm_peer_send_req(run->peer, req, siov[0].iov_len + siov[1].iov_len +
                                siov[2].iov_len, siov, k, run->timeout_ms);
    pthread_mutex_lock(&iface->lock);
    run->xp->sending = 0;
    pthread_mutex_unlock(&iface->lock);
    if (st != KVL_OK)
        return kvli_shm_run_gone(run, err);
    return KVL_OK;
}

/* Wait until every socket request of this transfer was answered; then none
 * of its bytes can land any more. */
static kvl_status_t kvli_shm_sock_drain(kvli_shm_run_t *run, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = run->w->iface;
    kvli_shm_xpriv_t *xp = run->xp;
    struct timespec dl;
    uint64_t seen;
    unsigned left;
    int i, timed_out = 0;

    pthread_mutex_lock(&iface->lock);
    seen = xp->sock_moved;
    left = xp->outstanding;
    kvli_shm_deadline(&dl, run->timeout_ms);
    while (xp->outstanding > 0 || xp->busy > 0) {
        if (!timed_out &&
            pthread_cond_timedwait(&iface->cond, &iface->lock, &dl) == ETIMEDOUT) {
            if (xp->sock_moved != seen || xp->outstanding != left) {
                seen = xp->sock_moved;
                left = xp->outstanding;
                kvli_shm_deadline(&dl, run->timeout_ms);
                continue;
            }
            timed_out = 1;
            for (i = 0; i < KVLI_SHM_WINDOW; i++)
                if (!run->w->reqs[i].done)
                    kvli_shm_peer_req_drop(run->peer, &run->w->reqs[i]);
        } else if (timed_out) {
            /* Only a receive in progress is left; it is bounded by SO_RCVTIMEO. */
            pthread_cond_wait(&iface->cond, &iface->lock);
        }
    }
    pthread_mutex_unlock(&iface->lock);
    if (timed_out) {
        /* The connection stays: the peer may still copy the WRITEs dropped
         * here once it runs again (their bytes are in sock_inflight). */
        uint64_t inflight = kvli_shm_inflight(run);
        if (inflight > 0)
            kvl_bk_error_set(err, KVL_ERR_TIMEOUT, ETIMEDOUT, KVLI_SHM_NAME, -1,
                             "agent '%s' (pid %d) left %u socket request(s) unanswered for %"
                             PRIu64 " ms (%" PRIu64 " of %" PRIu64 " bytes confirmed); up to %"
                             PRIu64 " bytes of this transfer may still land", run->peer->name,
                             (int)run->peer->pid, left, run->timeout_ms,
                             run->moved + xp->sock_moved, run->x->total_bytes, inflight);
        else
            kvl_bk_error_set(err, KVL_ERR_TIMEOUT, ETIMEDOUT, KVLI_SHM_NAME, -1,
                             "agent '%s' (pid %d) left %u socket READ request(s) unanswered "
                             "for %" PRIu64 " ms (%" PRIu64 " of %" PRIu64 " bytes confirmed); "
                             "none of its bytes can land any more (late answers are dropped)",
                             run->peer->name, (int)run->peer->pid, left, run->timeout_ms,
                             run->moved + xp->sock_moved, run->x->total_bytes);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", run->peer->name);
        kvl_bk_error_hint(err, "the peer is stuck or overloaded; check it, or raise the "
                          "transfer timeout");
        return KVL_ERR_TIMEOUT;
    }
    return KVL_OK;
}

static int kvli_shm_peer_exited(kvli_shm_peer_t *peer)
{
    struct pollfd p;
    if (kvli_shm_guard_alive(peer) > 0)
        return 0; /* no system call (shm_guard.c) */
    if (peer->pidfd < 0)
        return 0;
    p.fd = peer->pidfd;
    p.events = POLLIN;
    p.revents = 0;
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static kvl_status_t kvli_shm_run(kvli_shm_worker_t *w, kvli_shm_xpriv_t *xp,
                                 kvl_error_t *err)
{
    kvli_shm_iface_t *iface = w->iface;
    kvli_shm_run_t run;
    kvli_shm_cursor_t cur;
    kvl_status_t st = KVL_OK, st2;
    kvl_bk_xfer_t *x = xp->x;
    unsigned path;

    memset(&run, 0, sizeof(run));
    memset(&cur, 0, sizeof(cur));
    run.w = w;
    run.xp = xp;
    run.x = x;
    run.peer = xp->peer;
    run.timeout_ms = x->timeout_ms ? x->timeout_ms : iface->timeout_ms;

    while (!kvli_xchunk_done(&cur.pos, x)) {
        if (atomic_load(&xp->cancel) || kvli_progress_stopping(&iface->pg)) {
            st = KVL_ERR_CANCELED;
            break;
        }
        if (!atomic_load(&run.peer->dead) && kvli_shm_peer_exited(run.peer))
            kvli_shm_peer_mark_dead(run.peer, ESRCH, "pidfd of pid %d reports the process "
                                    "exited", (int)run.peer->pid);
        if (atomic_load(&run.peer->dead)) {
            st = kvli_shm_run_gone(&run, err);
            break;
        }
        if (run.paths & KVLI_SHM_PATH_SOCK) {
            /* A refused request fails the transfer: stop sending more. */
            int refused;
            pthread_mutex_lock(&iface->lock);
            refused = xp->sock_status != KVL_OK;
            pthread_mutex_unlock(&iface->lock);
            if (refused)
                break;
        }
        st = kvli_shm_batch(&run, &cur, &path, err);
        if (st != KVL_OK || run.n == 0) {
            kvli_shm_guard_release(&run);
            break;
        }
        run.paths |= path;
        if (path == KVLI_SHM_PATH_MMAP)
            kvli_shm_run_mmap(&run);
        else if (path == KVLI_SHM_PATH_CMA)
            st = kvli_shm_run_cma(&run, err);
        else
            st = kvli_shm_run_sock(&run, err);
        kvli_shm_guard_release(&run);
        if (st != KVL_OK)
            break;
    }

    if (run.paths & KVLI_SHM_PATH_SOCK) {
        kvl_error_t e2;
        st2 = kvli_shm_sock_drain(&run, &e2);
        if (st2 != KVL_OK && (st == KVL_OK || st == KVL_ERR_CANCELED)) {
            st = st2;
            if (err != NULL)
                *err = e2;
        }
        if (st == KVL_OK || st == KVL_ERR_CANCELED) {
            pthread_mutex_lock(&iface->lock);
            if (xp->sock_status != KVL_OK) {
                kvl_bk_error_set(err, KVL_ERR_REMOTE_REFUSED, 0, KVLI_SHM_NAME, -1,
                                 "socket %s request refused by agent '%s': %s",
                                 x->op == KVL_WRITE ? "WRITE" : "READ", run.peer->name,
                                 xp->sock_text);
                kvl_bk_error_hint(err, "the transfer reaches memory the peer has not "
                                  "registered (or deregistered); fetch its metadata "
                                  "again and check the remote descriptors");
                if (err != NULL)
                    snprintf(err->agent, sizeof(err->agent), "%s", run.peer->name);
                st = KVL_ERR_REMOTE_REFUSED;
                pthread_mutex_unlock(&iface->lock);
            } else {
                pthread_mutex_unlock(&iface->lock);
                if (atomic_load(&run.peer->dead))
                    st = kvli_shm_run_gone(&run, err);
            }
        }
    }
    /* Data copied into a dead peer's mapping reached nobody. */
    if (st == KVL_OK && atomic_load(&run.peer->dead))
        st = kvli_shm_run_gone(&run, err);
    if (st == KVL_OK && x->notif != NULL) {
        st = kvli_shm_peer_notif(run.peer, x->notif, x->notif_len, x->total_bytes,
                                 run.timeout_ms, err);
        if (st == KVL_ERR_REMOTE_DISCONNECT)
            st = kvli_shm_peer_disconnect_error(run.peer, x->total_bytes, x->total_bytes, 0,
                                                err);
    }
    if (st == KVL_ERR_CANCELED)
        kvl_bk_error_set(err, KVL_ERR_CANCELED, 0, KVLI_SHM_NAME, -1,
                         "transfer to agent '%s' cancelled after %" PRIu64 " of %" PRIu64
                         " bytes; no more bytes will land", run.peer->name,
                         kvli_shm_moved(&run), x->total_bytes);

    kvli_shm_path_name(run.paths, x->path, sizeof(x->path));
    return st;
}

/* Run xp, whose peer->running the caller raised (under iface->lock), then
 * lower it: a dead peer no transfer uses any more may be released. */
static kvl_status_t kvli_shm_run_held(kvli_shm_worker_t *w, kvli_shm_xpriv_t *xp,
                                      kvl_error_t *err)
{
    kvli_shm_iface_t *iface = w->iface;
    kvl_bk_error_none(err);
    kvl_status_t st = kvli_shm_run(w, xp, err);
    pthread_mutex_lock(&iface->lock);
    if (--xp->peer->running == 0 && atomic_load(&xp->peer->dead))
        kvli_progress_wake(&iface->pg); /* it may release the peer now */
    pthread_mutex_unlock(&iface->lock);
    return st;
}

/* A zeroed transfer state: the spare one when there is, else a new one. */
static kvli_shm_xpriv_t *kvli_shm_xpriv_get(kvli_shm_iface_t *iface)
{
    kvli_shm_xpriv_t *xp = atomic_exchange(&iface->spare, NULL);
    if (xp == NULL)
        return calloc(1, sizeof(*xp));
    memset(xp, 0, sizeof(*xp));
    return xp;
}

/* xp is no longer reachable from anything: keep it as the spare or free it. */
static void kvli_shm_xpriv_put(kvli_shm_iface_t *iface, kvli_shm_xpriv_t *xp)
{
    kvli_shm_xpriv_t *none = NULL;
    if (!atomic_compare_exchange_strong(&iface->spare, &none, xp))
        free(xp);
}

/* Hand the result to the core, then let xfer_cancel() waiters go. */
static void kvli_shm_finish(kvli_shm_iface_t *iface, kvli_shm_xpriv_t *xp,
                            kvl_status_t st, const kvl_error_t *err)
{
    kvli_shm_xpriv_t **pp;
    if (st != KVL_OK && st != KVL_ERR_CANCELED && err != NULL) {
        kvl_error_t *e = malloc(sizeof(*e));
        if (e != NULL) {
            memcpy(e, err, sizeof(*e));
            kvl_bk_xfer_error(e, xp->x, xp->peer->name);
            iface->ctx->xfer_done(xp->x, st, e);
            free(e);
        } else {
            iface->ctx->xfer_done(xp->x, st, err);
        }
    } else {
        iface->ctx->xfer_done(xp->x, st, st == KVL_OK ? NULL : err);
    }
    pthread_mutex_lock(&iface->lock);
    for (pp = &iface->xfers; *pp != NULL; pp = &(*pp)->next_all) {
        if (*pp == xp) {
            *pp = xp->next_all;
            break;
        }
    }
    xp->finished = 1;
    pthread_cond_broadcast(&iface->cond);
    if (xp->waiters == 0) {
        pthread_mutex_unlock(&iface->lock);
        kvli_shm_xpriv_put(iface, xp);
        return;
    }
    pthread_mutex_unlock(&iface->lock);
}

/* The most bytes a transfer may have to run in the poster's thread. */
static uint64_t kvli_shm_inline_limit(kvli_shm_iface_t *iface)
{
    return iface->inline_adapt ? atomic_load_explicit(&iface->inline_auto, memory_order_relaxed)
                               : iface->inline_max;
}

/* Transfers up to this size and segment count, handed to idle workers,
 * are the samples of inline_max=auto (larger ones are not: the segment
 * walk below would cost more than it tells). */
#define KVLI_SHM_LEARN_BYTES (8ull << 20)
#define KVLI_SHM_LEARN_SEGS 1024u
#define KVLI_SHM_LEARN_WAKE_NS 250000u

/*
 * Whether x may run in the poster's thread: every segment on a direct
 * path (a shared mapping or cross-memory attach: no socket round trips),
 * and nothing else of this backend posted, queued or running, so it cannot
 * overtake an earlier transfer; and at most `most` bytes. 1: it may; 2:
 * all but its size (a sample for inline_max=auto); 0: no. Under iface->lock.
 */
static int kvli_shm_inline_ok(kvli_shm_iface_t *iface, const kvl_bk_xfer_t *x,
                              const kvli_shm_peer_t *peer, uint64_t most)
{
    int small = x->total_bytes <= most;
    if (!small && (!iface->inline_adapt || x->total_bytes > KVLI_SHM_LEARN_BYTES ||
                   kvli_xchunk_count(x) > KVLI_SHM_LEARN_SEGS))
        return 0;
    if (iface->xfers != NULL || peer->guard == NULL)
        return 0;
    if (peer->cma_ok)
        return small ? 1 : 2; /* every region is reached directly */
    if (kvli_xchunk_indexed(x)) {
        /* the pairs may use any region of the remote list */
        for (size_t i = 0; i < x->rtab->nregs; i++)
            if (((const kvli_shm_rh_t *)x->rmh[i])->map == NULL)
                return 0;
        return small ? 1 : 2;
    }
    for (size_t i = 0; i < x->nsegs; i++) {
        const kvli_shm_rh_t *rh = x->rmh[x->segs[i].rreg];
        if (rh->map == NULL)
            return 0;
    }
    return small ? 1 : 2;
}

/*
 * inline_max=auto: a worker ran xp, queued to it while the backend was
 * idle, from start_ns to end_ns. The wake-up it waited and the rate it
 * copied at move the bound (kvli_shm_inline_bound); a bound half or double
 * the one last logged is logged at debug level. Relaxed atomics: workers
 * may race, and a lost sample only delays the average.
 */
static void kvli_shm_learn(kvli_shm_iface_t *iface, const kvli_shm_xpriv_t *xp,
                           uint64_t start_ns, uint64_t end_ns)
{
    uint64_t wake, rate, bound, was;
    /* a worker that took longer to start was not idle on a free core (a
     * cold start, a preempted thread): not the hand-off this bound is for */
    if (end_ns <= start_ns || start_ns < xp->queued_ns ||
        start_ns - xp->queued_ns > KVLI_SHM_LEARN_WAKE_NS)
        return;
    wake = kvli_shm_avg8(atomic_load_explicit(&iface->wake_ns, memory_order_relaxed),
                         start_ns - xp->queued_ns);
    rate = kvli_shm_avg8(atomic_load_explicit(&iface->rate_bpus, memory_order_relaxed),
                         xp->x->total_bytes * 1000 / (end_ns - start_ns));
    atomic_store_explicit(&iface->wake_ns, wake, memory_order_relaxed);
    atomic_store_explicit(&iface->rate_bpus, rate, memory_order_relaxed);
    bound = kvli_shm_inline_bound(wake, rate);
    atomic_store_explicit(&iface->inline_auto, bound, memory_order_relaxed);
    was = atomic_load_explicit(&iface->inline_logged, memory_order_relaxed);
    if (bound >= 2 * was || 2 * bound <= was) {
        atomic_store_explicit(&iface->inline_logged, bound, memory_order_relaxed);
        iface->ctx->log(iface->ctx, KVL_LOG_DEBUG,
                        "transfers up to %" PRIu64 " KiB now run in the poster's thread "
                        "(inline_max=auto: hand-off delay %" PRIu64 " us, copies at %" PRIu64
                        " MB/s)", bound >> 10, wake / 1000, rate);
    }
}

void *kvli_shm_xfer_worker(void *arg)
{
    kvli_shm_worker_t *w = arg;
    kvli_shm_iface_t *iface = w->iface;
    for (;;) {
        kvli_shm_xpriv_t *xp;
        kvl_error_t err;
        kvl_status_t st;
        pthread_mutex_lock(&iface->lock);
        while (iface->q_head == NULL && !kvli_progress_stopping(&iface->pg))
            pthread_cond_wait(&iface->qcond, &iface->lock);
        if (kvli_progress_stopping(&iface->pg)) {
            pthread_mutex_unlock(&iface->lock);
            break;
        }
        xp = iface->q_head;
        iface->q_head = xp->next_q;
        if (iface->q_head == NULL)
            iface->q_tail = NULL;
        xp->state = KVLI_SHM_XRUNNING;
        xp->peer->running++; /* its fds and mappings stay while we use them */
        pthread_mutex_unlock(&iface->lock);

        uint64_t start_ns = xp->queued_ns ? kvli_clock_ns() : 0;
        st = kvli_shm_run_held(w, xp, &err);
        if (start_ns != 0 && st == KVL_OK)
            kvli_shm_learn(iface, xp, start_ns, kvli_clock_ns());
        kvli_shm_finish(iface, xp, st, &err);
    }
    return NULL;
}

/* Run xp now, in this thread, as a worker would (iface->lock held on entry,
 * released; iface->inline_lock held, released). */
static void kvli_shm_run_inline(kvli_shm_iface_t *iface, kvli_shm_xpriv_t *xp)
{
    kvl_error_t e;
    kvl_status_t st;
    xp->state = KVLI_SHM_XRUNNING;
    xp->next_all = iface->xfers; /* cancel finds it; later posts queue behind it */
    iface->xfers = xp;
    xp->peer->running++;
    pthread_mutex_unlock(&iface->lock);
    st = kvli_shm_run_held(&iface->inline_w, xp, &e);
    pthread_mutex_unlock(&iface->inline_lock);
    kvli_shm_finish(iface, xp, st, &e);
}

kvl_status_t kvli_shm_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_peer_t *peer;
    kvli_shm_xpriv_t *xp;

    /* An indexed transfer (made cheaply from two prepared lists and index
     * arrays) is walked pair by pair from them (kvli_xchunk_*): pairing it
     * into segments first took 56 bytes a pair at every first posting. */
    if (x == NULL || x->peer == NULL || (x->op != KVL_READ && x->op != KVL_WRITE) ||
        (x->nsegs > 0 && (x->segs == NULL || x->lmh == NULL || x->rmh == NULL)) ||
        (kvli_xchunk_indexed(x) && (x->ltab == NULL || x->rtab == NULL || x->lidx == NULL ||
                                    x->ridx == NULL || x->lmh == NULL || x->rmh == NULL))) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_SHM_NAME, -1,
                         "xfer_post: transfer %p lacks a peer, an operation or its "
                         "segments", (void *)x);
        kvl_bk_error_hint(err, "a kvlane bug: the core builds transfers");
        return KVL_ERR_INVALID_ARG;
    }
    peer = x->peer;
    if (atomic_load(&peer->dead))
        return kvli_shm_peer_disconnect_error(peer, 0, 0, 0, err);
    xp = kvli_shm_xpriv_get(iface);
    if (xp == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "calloc(%zu) failed", sizeof(*xp));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    xp->x = x;
    xp->peer = peer;
    xp->state = KVLI_SHM_XQUEUED;
    x->bk_priv = xp;
    x->path[0] = '\0';
    pthread_mutex_lock(&iface->lock);
    if (kvli_progress_stopping(&iface->pg)) {
        pthread_mutex_unlock(&iface->lock);
        free(xp);
        kvl_bk_error_set(err, KVL_ERR_STATE, 0, KVLI_SHM_NAME, -1,
                         "xfer_post: the shm backend is closing");
        kvl_bk_error_hint(err, "do not post transfers while the agent is destroyed");
        return KVL_ERR_STATE;
    }
    uint64_t most = kvli_shm_inline_limit(iface);
    int inl = most > 0 ? kvli_shm_inline_ok(iface, x, peer, most) : 0;
    if (inl == 1 && pthread_mutex_trylock(&iface->inline_lock) == 0) {
        /* Small and direct: done before post returns, no thread hand-off. */
        kvli_shm_run_inline(iface, xp);
        return KVL_OK;
    }
    if (inl == 2)
        xp->queued_ns = kvli_clock_ns();
    xp->next_all = iface->xfers;
    iface->xfers = xp;
    if (iface->q_tail != NULL)
        iface->q_tail->next_q = xp;
    else
        iface->q_head = xp;
    iface->q_tail = xp;
    pthread_cond_signal(&iface->qcond);
    pthread_mutex_unlock(&iface->lock);
    return KVL_OK;
}

static void kvli_shm_unqueue(kvli_shm_iface_t *iface, kvli_shm_xpriv_t *xp)
{
    /* caller holds iface->lock */
    kvli_shm_xpriv_t **pp, *prev = NULL;
    for (pp = &iface->q_head; *pp != NULL; prev = *pp, pp = &(*pp)->next_q) {
        if (*pp == xp) {
            *pp = xp->next_q;
            if (iface->q_tail == xp)
                iface->q_tail = prev;
            break;
        }
    }
    for (pp = &iface->xfers; *pp != NULL; pp = &(*pp)->next_all) {
        if (*pp == xp) {
            *pp = xp->next_all;
            break;
        }
    }
}

static void kvli_shm_cancel_queued(kvli_shm_iface_t *iface, kvli_shm_xpriv_t *xp)
{
    kvl_error_t err;
    kvl_bk_xfer_t *x = xp->x;
    kvl_bk_error_set(&err, KVL_ERR_CANCELED, 0, KVLI_SHM_NAME, -1,
                     "transfer to agent '%s' cancelled before it started; nothing moved",
                     xp->peer->name);
    x->path[0] = '\0';
    free(xp);
    iface->ctx->xfer_done(x, KVL_ERR_CANCELED, &err);
}

static void kvli_shm_xfer_stop(void *bk, kvl_bk_xfer_t *x, int abort);

void kvli_shm_xfer_cancel(void *bk, kvl_bk_xfer_t *x)
{
    kvli_shm_xfer_stop(bk, x, 0);
}

/* For kvl_agent_destroy: a transfer with socket requests unanswered or one
 * being sent gives the peer up at once (mark_dead shuts the socket down,
 * which also unblocks the send), so a stopped peer cannot hold us. */
void kvli_shm_xfer_abort(void *bk, kvl_bk_xfer_t *x)
{
    kvli_shm_xfer_stop(bk, x, 1);
}

static void kvli_shm_xfer_stop(void *bk, kvl_bk_xfer_t *x, int abort)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_xpriv_t *xp;
    int give_up;

    pthread_mutex_lock(&iface->lock);
    /* Looked up, not taken from x->bk_priv: a finished transfer's priv is gone. */
    for (xp = iface->xfers; xp != NULL; xp = xp->next_all)
        if (xp->x == x)
            break;
    if (xp == NULL) {
        pthread_mutex_unlock(&iface->lock);
        return;
    }
    if (xp->state == KVLI_SHM_XQUEUED) {
        kvli_shm_unqueue(iface, xp);
        pthread_mutex_unlock(&iface->lock);
        kvli_shm_cancel_queued(iface, xp);
        return;
    }
    atomic_store(&xp->cancel, 1);
    xp->abort |= abort;
    give_up = abort && (xp->outstanding > 0 || xp->sending);
    xp->waiters++;
    if (give_up) {
        pthread_mutex_unlock(&iface->lock);
        kvli_shm_peer_mark_dead(xp->peer, ECANCELED, "the agent is being destroyed: socket "
                                "requests still unanswered were given up");
        pthread_mutex_lock(&iface->lock);
    }
    /* The worker stops within one chunk and a peer wait bounded by timeouts
     * (none when aborting: the peer was given up). */
    while (!xp->finished)
        pthread_cond_wait(&iface->cond, &iface->lock);
    if (--xp->waiters == 0) {
        pthread_mutex_unlock(&iface->lock);
        free(xp);
        return;
    }
    pthread_mutex_unlock(&iface->lock);
}

void kvli_shm_xfer_cancel_peer(kvli_shm_iface_t *iface, kvli_shm_peer_t *peer)
{
    for (;;) {
        kvli_shm_xpriv_t *xp;
        kvl_bk_xfer_t *x = NULL;
        pthread_mutex_lock(&iface->lock);
        for (xp = iface->xfers; xp != NULL; xp = xp->next_all)
            if (xp->peer == peer && !xp->finished)
                break;
        if (xp != NULL)
            x = xp->x;
        pthread_mutex_unlock(&iface->lock);
        if (x == NULL)
            return;
        kvli_shm_xfer_cancel(iface, x);
    }
}

void kvli_shm_xfer_cancel_queued_all(kvli_shm_iface_t *iface)
{
    for (;;) {
        kvli_shm_xpriv_t *xp;
        pthread_mutex_lock(&iface->lock);
        xp = iface->q_head;
        if (xp != NULL)
            kvli_shm_unqueue(iface, xp);
        pthread_mutex_unlock(&iface->lock);
        if (xp == NULL)
            return;
        kvli_shm_cancel_queued(iface, xp);
    }
}
