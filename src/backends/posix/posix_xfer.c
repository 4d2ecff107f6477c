/*
 * posix backend: transfers. The first posting of a transfer cuts its
 * segments into ops (one read or write of a contiguous piece) and checks
 * each against how its file was opened (O_DIRECT alignment, access mode);
 * later postings reuse them. The engine (posix_engine.c) runs the ops; this
 * file counts what finished and ends the transfer once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/chunk.h"
#include "posix.h"

static const char *kvli_posix_errname(int e)
{
    switch (e) {
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EACCES: return "EACCES";
    case EROFS: return "EROFS";
    case EPERM: return "EPERM";
    case EBADF: return "EBADF";
    case EINVAL: return "EINVAL";
    case EIO: return "EIO";
    case EFBIG: return "EFBIG";
    case ECANCELED: return "ECANCELED";
    default: return "errno";
    }
}

kvl_error_t *kvli_posix_xp_fail(kvli_posix_xpriv_t *xp, kvl_status_t code)
{
    xp->failed = true;
    xp->fail_code = code;
    if (xp->err == NULL)
        xp->err = malloc(sizeof(*xp->err));
    return xp->err;
}

/* The status of an I/O that failed with errno e (e == 0: a READ that found
 * the end of the file). */
static kvl_status_t kvli_posix_io_code(int e)
{
    return e == 0 ? KVL_ERR_OUT_OF_BOUNDS
           : e == ENOSPC || e == EDQUOT ? KVL_ERR_NO_MEMORY : KVL_ERR_SYSTEM;
}

/* Fill err (NULL: nothing to fill) for an I/O that failed with errno e (or,
 * e == 0, a READ that found the end of the file). */
static void kvli_posix_io_error(kvl_error_t *err, const kvli_posix_op_t *op, int write, int e)
{
    if (err == NULL)
        return;
    const kvli_posix_mh_t *f = op->fmh;
    uint64_t at = op->off + op->done;
    if (e == 0) {
        kvl_bk_error_set(err, kvli_posix_io_code(e), 0, KVLI_POSIX_NAME, -1,
                         "READ of %s (fd %d) at offset %llu found the end of the file: the "
                         "descriptor (offset %llu, len %u) runs past it (short file)",
                         f->path, f->fd, (unsigned long long)at, (unsigned long long)op->off,
                         op->len);
        kvl_bk_error_hint(err, "read only what was written: the file is shorter than the "
                               "registered range (truncated, or never written this far)");
        return;
    }
    kvl_bk_error_set(err, kvli_posix_io_code(e), e,
                     KVLI_POSIX_NAME, -1, "%s of %u bytes at offset %llu of %s (fd %d) failed: "
                     "%s (%s)", write ? "WRITE" : "READ", op->len - op->done,
                     (unsigned long long)at, f->path, f->fd, strerror(e), kvli_posix_errname(e));
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        kvl_bk_error_hint(err, "the file system holding %s is full (or its quota is spent): free "
                               "space there (df -h) or offload to another directory", f->path);
        break;
    case EACCES:
    case EPERM:
    case EROFS:
        kvl_bk_error_hint(err, "%s is not writable here (read-only file system or mount, or "
                               "permissions): open a file on a writable file system",
                          f->path);
        break;
    case EINVAL:
        kvl_bk_error_hint(err, "%s", f->direct
                          ? "the file is opened with O_DIRECT: the file system refused this "
                            "aligned I/O (a file system without O_DIRECT support?); open it "
                            "without O_DIRECT"
                          : "the kernel refused the request; check the file descriptor");
        break;
    case EBADF:
        kvl_bk_error_hint(err, "the descriptor was closed (or reopened for another file) while "
                               "registered: keep it open until it is deregistered");
        break;
    default:
        kvl_bk_error_hint(err, "check the device and file system holding %s (dmesg)", f->path);
    }
}

/* Build the ops of x once: every block of every segment, or every pair of
 * an indexed transfer (read from its index arrays: nothing is paired into
 * segments first), cut at 1 GiB (VRAM: at the staging chunk, through cuFile
 * where the file takes it). */
static kvl_status_t kvli_posix_build(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp,
                                     kvl_bk_xfer_t *x, kvl_error_t *err)
{
    uint64_t xp_chunk = iface->stage_chunk;
    size_t n = 0, nsegs = kvli_xchunk_count(x);
    const char *what = kvli_xchunk_indexed(x) ? "pair" : "segment";
    for (size_t s = 0; s < nsegs; s++) {
        const kvl_seg_t g = kvli_xchunk_seg(x, s);
        const kvli_posix_mh_t *l = x->lmh[g.lreg];
        uint64_t piece = l != NULL && l->kind == KVL_MEM_VRAM ? xp_chunk : KVLI_POSIX_OP_MAX;
        n += g.count * ((g.len + piece - 1) / piece);
    }
    xp->ops = calloc(n ? n : 1, sizeof(*xp->ops));
    if (xp->ops == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_POSIX_NAME, -1,
                         "out of memory for %zu file operations", n);
        return KVL_ERR_NO_MEMORY;
    }
    int write = x->op == KVL_WRITE;
    uint64_t block = 0;
    for (size_t s = 0; s < nsegs; s++) {
        const kvl_seg_t gs = kvli_xchunk_seg(x, s), *g = &gs;
        const kvli_posix_mh_t *l = x->lmh[g->lreg];
        kvli_posix_mh_t *f = x->rmh[g->rreg];
        if (l == NULL || f == NULL || (l->kind != KVL_MEM_DRAM && l->kind != KVL_MEM_VRAM) ||
            f->kind != KVL_MEM_FILE) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_POSIX_NAME, -1,
                             "%s %zu is not host memory paired with a file range", what, s);
            kvl_bk_error_hint(err, "the local list must be DRAM and the remote list FILE");
            return KVL_ERR_INVALID_ARG;
        }
        bool staged = l->kind == KVL_MEM_VRAM;
        uint64_t piece = staged ? xp_chunk : KVLI_POSIX_OP_MAX;
        xp->staged = staged;
        if (write ? !f->can_write : !f->can_read) {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, EBADF, KVLI_POSIX_NAME, -1,
                             "%s of %s (fd %d): the descriptor was opened %s", write ? "WRITE"
                             : "READ", f->path, f->fd, write ? "read-only" : "write-only");
            kvl_bk_error_hint(err, "open the file with O_RDWR (or O_%s) to %s it",
                              write ? "WRONLY" : "RDONLY", write ? "write" : "read");
            return KVL_ERR_INVALID_ARG;
        }
        bool gds = false;
        kvl_status_t gst = staged ? kvli_posix_gds_use(iface, f, l, write, &gds, err) : KVL_OK;
        if (gst != KVL_OK)
            return gst;
        for (uint64_t j = 0; j < g->count; j++, block++) {
            uint64_t la = g->laddr + j * g->lstride, ra = g->raddr + j * g->rstride;
            uint64_t off = f->off + (ra - f->addr);
            /* staged: the memory I/O sees is a page-aligned pinned buffer */
            if (f->direct && ((off | g->len) % f->dio_off != 0 ||
                              (!staged && la % f->dio_mem != 0))) {
                kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, EINVAL, KVLI_POSIX_NAME, -1,
                                 "block %llu of the transfer (memory 0x%llx, file offset %llu, "
                                 "len %llu) is not aligned for O_DIRECT on %s (fd %d): %s",
                                 (unsigned long long)block, (unsigned long long)la,
                                 (unsigned long long)off, (unsigned long long)g->len, f->path,
                                 f->fd, la % f->dio_mem != 0 ? "the memory address"
                                 : off % f->dio_off != 0 ? "the file offset" : "the length");
                kvl_bk_error_hint(err, "with O_DIRECT the file offset and length must be "
                                       "multiples of %u bytes and the memory address a multiple "
                                       "of %u (this file system's direct-I/O alignment); align "
                                       "the blocks, or open the file without O_DIRECT",
                                  f->dio_off, f->dio_mem);
                return KVL_ERR_INVALID_ARG;
            }
            for (uint64_t p = 0; p < g->len; p += piece) {
                uint64_t len = g->len - p < piece ? g->len - p : piece;
                kvli_posix_op_t *op = &xp->ops[xp->nops++];
                op->staged = staged;
                op->gds = gds;
                op->vmh = staged ? l : NULL;
                op->dev = l->dev;
                op->fd = f->fd;
                op->off = off + p;
                op->len = (uint32_t)len;
                op->buf = (char *)(uintptr_t)(la + p);
                op->buf_index = staged ? -1 : l->buf_index;
                op->file_index = staged || gds ? -1 : f->file_index;
                op->fmh = f;
                op->xp = xp;
            }
        }
    }
    return KVL_OK;
}

/* READ: a file shorter than what the transfer reads is found before any
 * byte moves (checked at every posting: files grow and shrink). */
static kvl_status_t kvli_posix_check_eof(kvli_posix_xpriv_t *xp, kvl_error_t *err)
{
    const kvli_posix_mh_t *last = NULL;
    struct stat st;
    for (size_t i = 0; i < xp->nops; i++) {
        const kvli_posix_op_t *op = &xp->ops[i];
        if (op->fmh != last) {
            last = op->fmh;
            if (fstat(op->fd, &st) != 0) {
                int e = errno;
                kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_POSIX_NAME, -1,
                                 "fstat of %s (fd %d) failed: %s", last->path, op->fd,
                                 strerror(e));
                kvl_bk_error_hint(err, "keep the file open while it is registered");
                return KVL_ERR_SYSTEM;
            }
            if (!S_ISREG(st.st_mode))
                st.st_size = INT64_MAX; /* block devices: their size is not st_size */
        }
        if (op->off + op->len > (uint64_t)st.st_size) {
            kvl_bk_error_set(err, KVL_ERR_OUT_OF_BOUNDS, 0, KVLI_POSIX_NAME, -1,
                             "READ of %s (fd %d): descriptor at offset %llu, len %u ends past "
                             "the end of the file (%lld bytes): short file", last->path, op->fd,
                             (unsigned long long)op->off, op->len, (long long)st.st_size);
            kvl_bk_error_hint(err, "read only what was written: the file is shorter than the "
                                   "range (truncated, or never written this far)");
            return KVL_ERR_OUT_OF_BOUNDS;
        }
    }
    return KVL_OK;
}

kvl_status_t kvli_posix_xfer_post(void *bk, kvl_bk_xfer_t *x, kvl_error_t *err)
{
    kvli_posix_iface_t *iface = bk;
    kvli_posix_xpriv_t *xp = x->bk_priv;
    if (xp == NULL) {
        xp = calloc(1, sizeof(*xp));
        if (xp == NULL) {
            kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_POSIX_NAME, -1,
                             "out of memory for a transfer");
            return KVL_ERR_NO_MEMORY;
        }
        xp->x = x;
        kvl_status_t st = kvli_posix_build(iface, xp, x, err);
        if (st != KVL_OK) {
            free(xp->ops);
            free(xp);
            return st;
        }
        x->bk_priv = xp;
    }
    if (x->op == KVL_READ) {
        kvl_status_t st = kvli_posix_check_eof(xp, err);
        if (st != KVL_OK)
            return st;
    }
    if (xp->staged) {
        kvl_status_t st = kvli_posix_stage_start(iface, err);
        if (st != KVL_OK)
            return st;
    }
    bool gds = xp->nops > 0 && xp->ops[0].gds;
    snprintf(x->path, sizeof(x->path), "%s%s",
             gds && iface->gds_state == KVLI_POSIX_GDS_COMPAT ? "cuFile (compatibility mode)"
             : gds ? "cuFile (GPUDirect Storage)"
             : xp->staged ? "staged (pinned host buffers), pread/pwrite"
             : iface->engine != KVLI_POSIX_URING ? "pread/pwrite threads"
             : xp->nops > 0 && xp->ops[0].buf_index >= 0 && xp->ops[0].file_index >= 0
                 ? "io_uring, fixed buffers, registered files"
             : xp->nops > 0 && xp->ops[0].buf_index >= 0 ? "io_uring, fixed buffers"
             : xp->nops > 0 && xp->ops[0].file_index >= 0 ? "io_uring, registered files"
                                                           : "io_uring",
             xp->nops > 0 && xp->ops[0].fmh->direct ? ", O_DIRECT" : ", page cache");
    kvli_posix_engine_queue(iface, xp);
    return KVL_OK;
}

long long kvli_posix_rw(int fd, char *buf, size_t len, uint64_t off, int write)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = write ? pwrite(fd, buf + done, len - done, (off_t)(off + done))
                          : pread(fd, buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return done > 0 ? (long long)done : -(long long)errno;
        if (r == 0)
            break; /* READ: the end of the file */
        done += (size_t)r;
    }
    return (long long)done;
}

kvli_posix_op_t *kvli_posix_op_next(kvli_posix_iface_t *iface, bool staged)
{
    for (kvli_posix_xpriv_t *xp = iface->qhead; xp != NULL; xp = xp->qnext) {
        if (xp->canceled || xp->failed || xp->staged != staged)
            continue;
        if (xp->retry != NULL) {
            kvli_posix_op_t *op = xp->retry;
            xp->retry = op->retry;
            op->retry = NULL;
            xp->inflight++;
            return op;
        }
        if (xp->next < xp->nops) {
            xp->inflight++;
            return &xp->ops[xp->next++];
        }
    }
    return NULL;
}

bool kvli_posix_xfer_check_end(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp)
{
    if (!xp->queued || xp->inflight > 0)
        return false;
    if (!xp->canceled && !xp->failed && (xp->completed < xp->nops))
        return false;
    /* unlink */
    kvli_posix_xpriv_t **pp = &iface->qhead, *prev = NULL;
    while (*pp != NULL && *pp != xp) {
        prev = *pp;
        pp = &(*pp)->qnext;
    }
    if (*pp == xp) {
        *pp = xp->qnext;
        if (iface->qtail == xp)
            iface->qtail = prev;
    }
    xp->qnext = NULL;
    xp->queued = false;
    xp->status = xp->failed ? xp->fail_code : xp->completed == xp->nops ? KVL_OK : KVL_ERR_CANCELED;
    return true;
}

bool kvli_posix_op_done(kvli_posix_iface_t *iface, kvli_posix_op_t *op, long long res)
{
    kvli_posix_xpriv_t *xp = op->xp;
    int write = xp->x->op == KVL_WRITE;
    xp->inflight--;
    if (res > 0 && (uint64_t)res < (uint64_t)(op->len - op->done)) {
        op->done += (uint32_t)res; /* short: the rest again */
        op->retry = xp->retry;
        xp->retry = op;
    } else if (res > 0) {
        op->done = op->len;
        xp->completed++;
    } else if (!xp->failed && !xp->canceled) {
        int e = res == 0 ? (write ? EIO : 0) : (int)-res;
        kvli_posix_io_error(kvli_posix_xp_fail(xp, kvli_posix_io_code(e)), op, write, e);
    }
    return kvli_posix_xfer_check_end(iface, xp);
}

void kvli_posix_xfer_finish(kvli_posix_iface_t *iface, kvli_posix_xpriv_t *xp)
{
    kvl_bk_xfer_t *x = xp->x;
    if (xp->status == KVL_OK && x->notif != NULL) {
        /* Files are this agent's: the notification is its own, after the data. */
        char why[256];
        if (iface->ctx->notif_offer != NULL)
            (void)iface->ctx->notif_offer(iface->ctx, iface->ctx->agent_name, x->notif,
                                          x->notif_len, why, sizeof(why));
        else
            iface->ctx->notif_deliver(iface->ctx, iface->ctx->agent_name, x->notif,
                                      x->notif_len);
    }
    iface->ctx->xfer_done(x, xp->status, xp->status == KVL_OK || xp->status == KVL_ERR_CANCELED
                                             ? NULL : xp->err);
    pthread_mutex_lock(&iface->lock);
    xp->running = false;
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
}

void kvli_posix_xfer_cancel(void *bk, kvl_bk_xfer_t *x)
{
    kvli_posix_iface_t *iface = bk;
    kvli_posix_xpriv_t *xp = x->bk_priv;
    if (xp == NULL)
        return;
    pthread_mutex_lock(&iface->lock);
    if (xp->running) {
        xp->canceled = true; /* nothing new starts; what is in flight ends */
        bool end = kvli_posix_xfer_check_end(iface, xp);
        if (end) {
            pthread_mutex_unlock(&iface->lock);
            kvli_posix_xfer_finish(iface, xp);
            pthread_mutex_lock(&iface->lock);
        } else {
#ifdef KVL_HAVE_LIBURING
            if (iface->engine == KVLI_POSIX_URING)
                kvli_progress_wake(&iface->pg);
#endif
        }
        while (xp->running)
            pthread_cond_wait(&iface->cond, &iface->lock);
    }
    pthread_mutex_unlock(&iface->lock);
}

void kvli_posix_xfer_release(void *bk, kvl_bk_xfer_t *x)
{
    kvli_posix_iface_t *iface = bk;
    kvli_posix_xpriv_t *xp = x->bk_priv;
    if (xp == NULL)
        return;
    /* the engine may still be leaving kvli_posix_xfer_finish */
    pthread_mutex_lock(&iface->lock);
    while (xp->running)
        pthread_cond_wait(&iface->cond, &iface->lock);
    pthread_mutex_unlock(&iface->lock);
    free(xp->ops);
    free(xp->err);
    free(xp);
    x->bk_priv = NULL;
}
