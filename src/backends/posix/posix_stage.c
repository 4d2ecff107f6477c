/*
 * posix backend: GPU memory (VRAM) to and from files, staged through pinned
 * host buffers with the copies the core lends (ctx->stage_*, done by the
 * cuda backend's streams).
 *
 * Staging threads (stagers), each with one pinned buffer of stage_chunk
 * bytes, take the pieces of staged transfers (at most stage_chunk each):
 *   WRITE: device -> buffer (stage_copy, waited), then pwrite from it;
 *   READ:  pread into the buffer, then buffer -> device (stage_copy, waited).
 * With several stagers one piece's copy runs while another's I/O does: a
 * pipeline as deep as the number of stagers. The buffers are page-aligned,
 * so O_DIRECT files take them.
 *
 * A piece whose file has a cuFile handle (posix_gds.c) goes through
 * cuFileRead/cuFileWrite on the same threads instead, device memory to file
 * directly: a piece at a time, so progress and cancel work alike.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "posix.h"

/* The staging slots of the context this core lends (all five or none). */
static bool kvli_posix_can_stage(const kvl_bk_ctx_t *ctx)
{
    return ctx->size >= offsetof(kvl_bk_ctx_t, stage_test) + sizeof(ctx->stage_test) &&
           ctx->stage_check != NULL && ctx->stage_host_alloc != NULL &&
           ctx->stage_host_free != NULL && ctx->stage_copy != NULL && ctx->stage_test != NULL;
}

kvl_status_t kvli_posix_stage_reg(kvli_posix_iface_t *iface, const kvl_region_info_t *r,
                                  kvli_posix_mh_t *mh, char *detail, size_t detail_len,
                                  kvl_error_t *err)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    if (!kvli_posix_can_stage(ctx)) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, r->dev,
                         "VRAM on device %d: the kvlane core offers no staging copies to "
                         "posix", (int)r->dev);
        kvl_bk_error_hint(err, "stage VRAM through a DRAM buffer");
        return KVL_ERR_UNSUPPORTED;
    }
    kvl_error_t why;
    memset(&why, 0, offsetof(kvl_error_t, causes));
    why.device = -1;
    kvl_status_t st = ctx->stage_check(ctx, KVL_MEM_VRAM, r->dev, &why);
    if (st != KVL_OK) {
        kvl_bk_error_set(err, st, why.sys_errno, KVLI_POSIX_NAME, r->dev,
                         "VRAM on device %d cannot be staged through host memory: %.600s",
                         (int)r->dev, why.what);
        kvl_bk_error_hint(err, "%.500s", why.hint[0] ? why.hint
                                                     : "stage VRAM through a DRAM buffer");
        return st;
    }
    char gds[768];
    bool cufile = false;
    st = kvli_posix_gds_vram(iface, mh, gds, sizeof(gds), &cufile, err);
    if (st != KVL_OK)
        return st;
    if (cufile)
        snprintf(detail, detail_len, "VRAM on GPU %d: %s; with a file cuFile does not take, "
                 "staged through pinned host buffers (%u x %zu KiB)", (int)r->dev, gds,
                 iface->nstagers, iface->stage_chunk >> 10);
    else
        snprintf(detail, detail_len, "VRAM on GPU %d, staged through pinned host buffers (%u x "
                 "%zu KiB); %s", (int)r->dev, iface->nstagers, iface->stage_chunk >> 10, gds);
    return KVL_OK;
}

static void *kvli_posix_stager_main(void *arg);

typedef struct {
    kvli_posix_iface_t *iface;
    unsigned i;
} kvli_posix_stager_arg_t;

kvl_status_t kvli_posix_stage_start(kvli_posix_iface_t *iface, kvl_error_t *err)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    kvl_status_t st = KVL_OK;
    pthread_mutex_lock(&iface->stage_lock);
    if (iface->stage_up)
        goto out;
    if (!kvli_posix_can_stage(ctx)) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, -1,
                         "VRAM on device %d: the kvlane core offers no staging copies to "
                         "posix", -1);
        st = KVL_ERR_UNSUPPORTED;
        goto out;
    }
    iface->stage_bufs = calloc(iface->nstagers, sizeof(*iface->stage_bufs));
    iface->stagers = calloc(iface->nstagers, sizeof(*iface->stagers));
    if (iface->stage_bufs == NULL || iface->stagers == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_POSIX_NAME, -1,
                         "out of memory for %u staging threads", iface->nstagers);
        st = KVL_ERR_NO_MEMORY;
        goto undo;
    }
    for (unsigned i = 0; i < iface->nstagers; i++) {
        st = ctx->stage_host_alloc(ctx, iface->stage_chunk, &iface->stage_bufs[i], err);
        if (st != KVL_OK)
            goto undo;
    }
    for (unsigned i = 0; i < iface->nstagers; i++) {
        kvli_posix_stager_arg_t *a = malloc(sizeof(*a));
        int e = a == NULL ? ENOMEM : 0;
        if (a != NULL) {
            a->iface = iface;
            a->i = i;
            e = pthread_create(&iface->stagers[i], NULL, kvli_posix_stager_main, a);
            if (e != 0)
                free(a);
        }
        if (e != 0) {
            kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_POSIX_NAME, -1,
                             "pthread_create of I/O thread %u failed: %s", i, strerror(e));
            kvl_bk_error_hint(err, "the process may be at its thread limit (ulimit -u)");
            st = KVL_ERR_SYSTEM;
            goto undo;
        }
        iface->nstage_started++;
    }
    iface->stage_up = true;
    goto out;
undo:
    pthread_mutex_unlock(&iface->stage_lock);
    kvli_posix_stage_stop(iface);
    return st;
out:
    pthread_mutex_unlock(&iface->stage_lock);
    return st;
}

void kvli_posix_stage_stop(kvli_posix_iface_t *iface)
{
    pthread_mutex_lock(&iface->stage_lock);
    pthread_mutex_lock(&iface->lock);
    iface->stage_quit = true;
    pthread_cond_broadcast(&iface->cond);
    pthread_mutex_unlock(&iface->lock);
    for (unsigned i = 0; i < iface->nstage_started; i++)
        pthread_join(iface->stagers[i], NULL);
    iface->nstage_started = 0;
    pthread_mutex_lock(&iface->lock);
    iface->stage_quit = false; /* a failed start leaves the backend running */
    pthread_mutex_unlock(&iface->lock);
    for (unsigned i = 0; iface->stage_bufs != NULL && i < iface->nstagers; i++)
        if (iface->stage_bufs[i] != NULL)
            iface->ctx->stage_host_free(iface->ctx, iface->stage_bufs[i]);
    free(iface->stage_bufs);
    free(iface->stagers);
    iface->stage_bufs = NULL;
    iface->stagers = NULL;
    iface->stage_up = false;
    pthread_mutex_unlock(&iface->stage_lock);
}

/* One device <-> buffer copy, waited for; KVL_OK or the error in e. */
static kvl_status_t kvli_posix_stage_copy(kvli_posix_iface_t *iface, int to_host,
                                          const kvli_posix_op_t *op, void *buf, size_t len,
                                          kvl_error_t *e)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    kvl_stage_piece_t p = {(uint64_t)(uintptr_t)op->buf, buf, len, op->dev};
    void *ticket = NULL;
    kvl_status_t st = ctx->stage_copy(ctx, to_host, &p, 1, NULL, NULL, &ticket, e);
    if (st != KVL_OK)
        return st;
    if (ctx->stage_test(ctx, ticket, 1, e) != 1)
        return e->code != KVL_OK ? e->code : KVL_ERR_SYSTEM;
    return KVL_OK;
}

/* One piece of op (the rest of it, after a short READ): staged through buf,
 * or through cuFile. The bytes moved past op->done, or -errno (as
 * kvli_posix_rw); a copy or cuFile failure is *cst with e filled. */
static long long kvli_posix_stage_piece(kvli_posix_iface_t *iface, kvli_posix_op_t *op,
                                        char *buf, int write, kvl_status_t *cst, kvl_error_t *e)
{
    size_t len = op->len - op->done;
    long long res = (long long)len;
    *cst = KVL_OK;
    if (op->gds) {
        res = kvli_posix_gds_piece(iface, op, write, e);
        if (res < 0)
            *cst = e->code;
        return res < 0 ? (long long)len : res;
    }
    if (write) {
        *cst = kvli_posix_stage_copy(iface, 1, op, buf, op->len, e);
        if (*cst == KVL_OK)
            res = kvli_posix_rw(op->fd, buf + op->done, len, op->off + op->done, 1);
    } else {
        /* The whole piece, also when resumed after a short read: that read
         * went into another stager's buffer and never reached the GPU, and
         * the copy up takes the piece whole from this one. */
        res = kvli_posix_rw(op->fd, buf, op->len, op->off, 0);
        if (res == (long long)op->len) {
            *cst = kvli_posix_stage_copy(iface, 0, op, buf, op->len, e);
            res = (long long)len;
        } else if (res >= 0) {
            /* short again: progress is what it read past the last try (none:
             * the end of the file, an error for a READ) */
            res = res > (long long)op->done ? res - (long long)op->done : 0;
        }
    }
    return res;
}

/* Under the lock: the first failure of xp, from a piece that failed with
 * cst (e: its error). cuFile's errors are whole; a copy's is wrapped. */
static void kvli_posix_stage_fail(kvli_posix_xpriv_t *xp, const kvli_posix_op_t *op, int write,
                                  kvl_status_t cst, const kvl_error_t *e)
{
    if (xp->failed || xp->canceled)
        return;
    kvl_error_t *err = kvli_posix_xp_fail(xp, op->gds ? e->code : cst);
    if (err == NULL)
        return;
    if (op->gds) {
        memcpy(err, e, offsetof(kvl_error_t, causes));
        err->n_causes = 0;
        return;
    }
    kvl_bk_error_set(err, cst, e->sys_errno, KVLI_POSIX_NAME, op->dev,
                     "staging %u bytes %s GPU %d (device address 0x%llx) for %s of %s "
                     "failed: %.600s", op->len, write ? "from" : "to", (int)op->dev,
                     (unsigned long long)(uintptr_t)op->buf, write ? "WRITE" : "READ",
                     op->fmh->path, e->what);
    kvl_bk_error_hint(err, "%.500s", e->hint[0] ? e->hint
                      : "check the GPU (nvidia-smi) and that the memory is still "
                        "allocated");
}

static void *kvli_posix_stager_main(void *arg)
{
    kvli_posix_stager_arg_t *a = arg;
    kvli_posix_iface_t *iface = a->iface;
    char *buf = iface->stage_bufs[a->i];
    free(a);
    pthread_mutex_lock(&iface->lock);
    while (!iface->stop && !iface->stage_quit) {
        kvli_posix_op_t *op = kvli_posix_op_next(iface, true);
        if (op == NULL) {
            pthread_cond_wait(&iface->cond, &iface->lock);
            continue;
        }
        kvli_posix_xpriv_t *xp = op->xp;
        int write = xp->x->op == KVL_WRITE;
        pthread_mutex_unlock(&iface->lock);
        kvl_error_t e;
        memset(&e, 0, offsetof(kvl_error_t, causes));
        e.device = op->dev;
        kvl_status_t cst;
        long long res = kvli_posix_stage_piece(iface, op, buf, write, &cst, &e);
        pthread_mutex_lock(&iface->lock);
        if (cst != KVL_OK)
            kvli_posix_stage_fail(xp, op, write, cst, &e);
        if (kvli_posix_op_done(iface, op, cst != KVL_OK ? (long long)(op->len - op->done) : res)) {
            pthread_mutex_unlock(&iface->lock);
            kvli_posix_xfer_finish(iface, xp);
            pthread_mutex_lock(&iface->lock);
        } else if (xp->retry != NULL) {
            pthread_cond_broadcast(&iface->cond);
        }
    }
    pthread_mutex_unlock(&iface->lock);
    return NULL;
}
