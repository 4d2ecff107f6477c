/*
 * posix backend: the ops table, open/close, registrations and what peers
 * would need (files are local: no peer reaches them).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/resource.h>
#include <unistd.h>
#include <linux/stat.h>
#include "posix.h"

static const kvl_param_t kvli_posix_params[] = {
    {"engine", "auto"},          /* auto | io_uring | threads */
    {"queue_depth", "64"},       /* ops in flight (io_uring) */
    {"threads", "8"},            /* pread/pwrite threads (fallback) */
    {"stage_threads", "4"},      /* VRAM: staging threads, one pinned buffer each */
    {"stage_chunk_kib", "4096"}, /* VRAM: bytes per staged piece */
    {"fixed_buffers_mib", "4096"}, /* DRAM pinned as io_uring fixed buffers, at most (0: off) */
    {"gds", "auto"},             /* VRAM <-> FILE: auto | on | off (GPUDirect Storage, cuFile) */
    {NULL, NULL}
};

static kvl_status_t kvli_posix_available(char *reason, size_t len)
{
    if (reason && len)
        reason[0] = '\0';
    return KVL_OK; /* io_uring or, failing it, pread/pwrite threads */
}

static kvl_status_t kvli_posix_num(const char *k, const char *v, uint64_t lo, uint64_t hi,
                                   uint64_t *out, kvl_error_t *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (v[0] == '\0' || v[0] == '-' || errno != 0 || end == NULL || *end != '\0' || n < lo ||
        n > hi) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_POSIX_NAME, -1,
                         "parameter %s='%s' is not a number in [%llu, %llu]", k, v,
                         (unsigned long long)lo, (unsigned long long)hi);
        return KVL_ERR_INVALID_ARG;
    }
    *out = n;
    return KVL_OK;
}

static void kvli_posix_close(void *bk)
{
    kvli_posix_iface_t *iface = bk;
    if (iface == NULL)
        return;
    kvli_posix_engine_close(iface);
    kvli_posix_gds_close(iface);
    pthread_mutex_destroy(&iface->gds_lock);
    pthread_mutex_destroy(&iface->lock);
    pthread_mutex_destroy(&iface->stage_lock);
    pthread_cond_destroy(&iface->cond);
    free(iface);
}

static kvl_status_t kvli_posix_open(kvl_bk_ctx_t *ctx, const kvl_param_t *params, size_t n,
                                    void **bk_p, kvl_error_t *err)
{
    const char *engine = "auto";
    uint64_t qd = KVLI_POSIX_QD_DEFAULT, th = KVLI_POSIX_THREADS_DEFAULT;
    uint64_t sth = KVLI_POSIX_STAGERS_DEFAULT, sch = KVLI_POSIX_STAGE_CHUNK >> 10;
    uint64_t fmib = KVLI_POSIX_FIXED_MIB_DEFAULT;
    int gds = KVLI_POSIX_GDS_AUTO;
    const char *genv = getenv("KVL_POSIX_GDS"), *gds_by = "KVL_POSIX_GDS=0";
    if (genv != NULL && genv[0] != '\0' &&
        kvli_posix_gds_mode("KVL_POSIX_GDS", genv, &gds, err) != KVL_OK)
        return KVL_ERR_INVALID_ARG;
    for (size_t i = 0; i < n && params != NULL && params[i].key != NULL; i++) {
        const char *k = params[i].key, *v = params[i].value ? params[i].value : "";
        kvl_status_t st = KVL_OK;
        if (strcmp(k, "engine") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "io_uring") != 0 && strcmp(v, "threads") != 0) {
                kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_POSIX_NAME, -1,
                                 "parameter engine='%s' is not auto, io_uring or threads", v);
                return KVL_ERR_INVALID_ARG;
            }
            engine = v;
        } else if (strcmp(k, "queue_depth") == 0) {
            st = kvli_posix_num(k, v, 1, 4096, &qd, err);
        } else if (strcmp(k, "threads") == 0) {
            st = kvli_posix_num(k, v, 1, 256, &th, err);
        } else if (strcmp(k, "stage_threads") == 0) {
            st = kvli_posix_num(k, v, 1, 64, &sth, err);
        } else if (strcmp(k, "stage_chunk_kib") == 0) {
            st = kvli_posix_num(k, v, 4, 1u << 20, &sch, err);
        } else if (strcmp(k, "fixed_buffers_mib") == 0) {
            st = kvli_posix_num(k, v, 0, 1u << 30, &fmib, err);
        } else if (strcmp(k, "gds") == 0) {
            st = kvli_posix_gds_mode("parameter gds", v, &gds, err);
            gds_by = "parameter gds=off";
        } else {
            kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_POSIX_NAME, -1,
                             "unknown parameter '%s' for backend posix", k);
            kvl_bk_error_hint(err, "known: engine (auto|io_uring|threads), queue_depth, threads, "
                                   "stage_threads, stage_chunk_kib, fixed_buffers_mib, gds "
                                   "(auto|on|off)");
            return KVL_ERR_INVALID_ARG;
        }
        if (st != KVL_OK)
            return st;
    }
    kvli_posix_iface_t *iface = calloc(1, sizeof(*iface));
    if (iface == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_POSIX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    iface->ctx = ctx;
    iface->qd = (unsigned)qd;
    iface->nthreads = (unsigned)th;
    iface->nstagers = (unsigned)sth;
    iface->stage_chunk = (size_t)(sch << 10);
    iface->fixed_max = fmib << 20;
    iface->gds_mode = gds;
    pthread_mutex_init(&iface->lock, NULL);
    pthread_mutex_init(&iface->stage_lock, NULL);
    pthread_mutex_init(&iface->gds_lock, NULL);
    kvli_posix_gds_probe(iface, gds_by);
    pthread_cond_init(&iface->cond, NULL);
    kvl_status_t st = kvli_posix_engine_open(iface, engine, err);
    if (st != KVL_OK) {
        kvli_posix_close(iface);
        return st;
    }
    *bk_p = iface;
    return KVL_OK;
}

/* O_DIRECT alignment of an open file: statx's answer where the kernel gives
 * it (6.1+), else the logical block size of the device, else 4096. */
static void kvli_posix_dio_align(int fd, uint32_t *mem_p, uint32_t *off_p)
{
    struct statx sx;
    *mem_p = *off_p = 0;
    memset(&sx, 0, sizeof(sx));
    if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 0) {
        *mem_p = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : sx.stx_dio_offset_align;
        *off_p = sx.stx_dio_offset_align;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) == 0) {
        char path[96];
        unsigned maj = S_ISBLK(st.st_mode) ? major(st.st_rdev) : major(st.st_dev);
        unsigned min = S_ISBLK(st.st_mode) ? minor(st.st_rdev) : minor(st.st_dev);
        snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/logical_block_size", maj, min);
        FILE *f = fopen(path, "r");
        unsigned v = 0;
        if (f != NULL) {
            if (fscanf(f, "%u", &v) != 1)
                v = 0;
            fclose(f);
        }
        if (v >= 512 && v <= 65536 && (v & (v - 1)) == 0) {
            *mem_p = *off_p = v;
            return;
        }
    }
    *mem_p = *off_p = 4096;
}

static kvl_status_t kvli_posix_mem_reg(void *bk, const kvl_region_info_t *r, void **mh_p,
                                       char *detail, size_t detail_len, kvl_error_t *err)
{
    kvli_posix_iface_t *iface = bk;
    if (r->kind != KVL_MEM_DRAM && r->kind != KVL_MEM_FILE && r->kind != KVL_MEM_VRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, r->dev,
                         "backend posix moves host memory (DRAM) to and from files; %s memory "
                         "is not served", kvl_mem_kind_name(r->kind));
        kvl_bk_error_hint(err, "stage VRAM through a DRAM buffer");
        return KVL_ERR_UNSUPPORTED;
    }
    kvli_posix_mh_t *mh = calloc(1, sizeof(*mh));
    if (mh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_POSIX_NAME, -1, "out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    mh->kind = r->kind;
    mh->addr = r->addr;
    mh->len = r->len;
    mh->fd = -1;
    mh->dev = r->dev;
    mh->buf_index = -1;
    mh->file_index = -1;
    if (r->kind == KVL_MEM_VRAM) {
        kvl_status_t st = kvli_posix_stage_reg(iface, r, mh, detail, detail_len, err);
        if (st != KVL_OK)
            free(mh);
        else
            *mh_p = mh;
        return st;
    }
    if (r->kind == KVL_MEM_DRAM) {
        char why[320];
        mh->buf_index = kvli_posix_fixed_add(iface, r->addr, r->len, why, sizeof(why));
        if (mh->buf_index >= 0)
            snprintf(detail, detail_len, "host memory, io_uring fixed buffer %d (pinned)",
                     mh->buf_index);
        else
            snprintf(detail, detail_len, "host memory (not an io_uring fixed buffer: %s)", why);
        *mh_p = mh;
        return KVL_OK;
    }
    mh->fd = r->dev;
    mh->off = kvl_bk_file_offset(r->addr);
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", mh->fd);
    ssize_t pl = readlink(link, mh->path, sizeof(mh->path) - 1);
    if (pl <= 0)
        snprintf(mh->path, sizeof(mh->path), "fd %d", mh->fd);
    else
        mh->path[pl] = '\0';
    int fl = fcntl(mh->fd, F_GETFL);
    struct stat st;
    if (fl < 0 || fstat(mh->fd, &st) != 0) {
        int e = errno;
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, e, KVLI_POSIX_NAME, -1,
                         "fd %d is not an open file: %s", mh->fd, strerror(e));
        kvl_bk_error_hint(err, "open the file and pass its descriptor");
        free(mh);
        return KVL_ERR_INVALID_ARG;
    }
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_POSIX_NAME, -1,
                         "fd %d (%s) is not a regular file or a block device (mode 0%o): posix "
                         "reads and writes at offsets", mh->fd, mh->path,
                         (unsigned)(st.st_mode & S_IFMT));
        kvl_bk_error_hint(err, "register files (or block devices), not pipes, sockets or "
                               "terminals");
        free(mh);
        return KVL_ERR_INVALID_ARG;
    }
    int acc = fl & O_ACCMODE;
    mh->can_read = acc == O_RDONLY || acc == O_RDWR;
    mh->can_write = acc == O_WRONLY || acc == O_RDWR;
    mh->direct = (fl & O_DIRECT) != 0;
    if (mh->direct)
        kvli_posix_dio_align(mh->fd, &mh->dio_mem, &mh->dio_off);
    if (mh->direct)
        snprintf(detail, detail_len, "%s, %s, O_DIRECT (align %u bytes, memory %u)", mh->path,
                 mh->can_read && mh->can_write ? "read-write" : mh->can_read ? "read-only"
                                                                             : "write-only",
                 mh->dio_off, mh->dio_mem);
    else
        snprintf(detail, detail_len, "%s, %s, page cache", mh->path,
                 mh->can_read && mh->can_write ? "read-write" : mh->can_read ? "read-only"
                                                                             : "write-only");
    char why[200];
    size_t dl = strlen(detail);
    mh->file_index = kvli_posix_file_add(iface, mh->fd, why, sizeof(why));
    if (mh->file_index >= 0)
        snprintf(detail + dl, detail_len - dl, ", io_uring registered file %d", mh->file_index);
    else
        snprintf(detail + dl, detail_len - dl, " (not an io_uring registered file: %s)", why);
    kvli_posix_gds_file(iface, mh, detail, detail_len);
    *mh_p = mh;
    return KVL_OK;
}

static void kvli_posix_mem_dereg(void *bk, void *mhv)
{
    kvli_posix_mh_t *mh = mhv;
    if (mh != NULL && mh->buf_index >= 0)
        kvli_posix_fixed_del(bk, mh->buf_index, mh->len);
    if (mh != NULL && mh->file_index >= 0)
        kvli_posix_file_del(bk, mh->file_index);
    if (mh != NULL)
        kvli_posix_gds_dereg(bk, mh);
    free(mh);
}

static kvl_status_t kvli_posix_conn_pack(void *bk, uint8_t *buf, size_t cap, size_t *len_p)
{
    (void)bk, (void)buf, (void)cap;
    *len_p = 0;
    return KVL_OK;
}

static kvl_status_t kvli_posix_region_pack(void *bk, void *mh, uint8_t *buf, size_t cap,
                                           size_t *len_p)
{
    (void)bk, (void)mh, (void)buf, (void)cap, (void)len_p;
    return KVL_ERR_UNSUPPORTED; /* files are local: nothing a peer could use */
}

static kvl_status_t kvli_posix_peer_load(void *bk, const char *name, uint64_t incarnation,
                                         const uint8_t *conn, size_t len, void **peer_p,
                                         kvl_error_t *err)
{
    kvli_posix_iface_t *iface = bk;
    (void)conn, (void)len;
    if (strcmp(name, iface->ctx->agent_name) == 0 && incarnation == iface->ctx->incarnation) {
        *peer_p = iface; /* this agent itself */
        return KVL_OK;
    }
    kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, -1,
                     "posix moves this agent's memory to and from its own files; agent '%s' is "
                     "another process", name);
    kvl_bk_error_hint(err, "use shm, tcp or ucx between agents");
    return KVL_ERR_UNSUPPORTED;
}

static void kvli_posix_peer_unload(void *bk, void *peer)
{
    (void)bk, (void)peer;
}

static kvl_status_t kvli_posix_rregion_load(void *bk, void *peer, const kvl_region_info_t *r,
                                            const uint8_t *key, size_t len, void **rh_p,
                                            kvl_error_t *err)
{
    (void)bk, (void)peer, (void)key, (void)len, (void)rh_p;
    kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, r->dev,
                     "posix publishes no regions to peers");
    return KVL_ERR_UNSUPPORTED;
}

static void kvli_posix_rregion_unload(void *bk, void *peer, void *rh)
{
    (void)bk, (void)peer, (void)rh;
}

static kvl_status_t kvli_posix_notif_send(void *bk, void *peer, const void *msg, size_t len,
                                          kvl_error_t *err)
{
    kvli_posix_iface_t *iface = bk;
    char why[256];
    (void)peer;
    if (iface->ctx->notif_offer == NULL) {
        iface->ctx->notif_deliver(iface->ctx, iface->ctx->agent_name, msg, len);
        return KVL_OK;
    }
    kvl_status_t st = iface->ctx->notif_offer(iface->ctx, iface->ctx->agent_name, msg, len, why,
                                              sizeof(why));
    if (st != KVL_OK) {
        kvl_bk_error_set(err, st, 0, KVLI_POSIX_NAME, -1, "notification to this agent refused: %s",
                         why);
        return st;
    }
    return KVL_OK;
}

static void kvli_posix_peer_describe(void *bk, void *peer, char *buf, size_t len)
{
    kvli_posix_iface_t *iface = bk;
    (void)peer;
    if (iface->engine == KVLI_POSIX_URING)
        snprintf(buf, len, "this agent's files: io_uring (queue depth %u)", iface->qd);
    else
        snprintf(buf, len, "this agent's files: %u pread/pwrite threads (%s)", iface->nthreads,
                 iface->engine_why);
}

/* Doctor: io_uring and the locked-memory limit (registered buffers); with
 * VRAM, GPUDirect Storage. */
static void kvli_posix_probe(void (*report)(void *arg, const char *check, int status,
                                            const char *observed, const char *hint),
                             void *arg, kvl_mem_kind_t mem, int32_t dev, uint64_t planned_bytes)
{
    char obs[512];
    (void)dev, (void)planned_bytes;
#ifdef KVL_HAVE_LIBURING
    struct io_uring ring;
    int r = io_uring_queue_init(8, &ring, 0);
    if (r == 0) {
        io_uring_queue_exit(&ring);
        report(arg, "posix io_uring", 0, "io_uring_setup works", "");
    } else {
        snprintf(obs, sizeof(obs), "io_uring_setup failed: %s%s", strerror(-r),
                 r == -EPERM ? " (kernel.io_uring_disabled or a seccomp profile)" : "");
        report(arg, "posix io_uring", 1, obs,
               "posix falls back to pread/pwrite threads (slower at small blocks); allow "
               "io_uring_setup/io_uring_enter/io_uring_register in the seccomp profile");
    }
#else
    report(arg, "posix io_uring", 1, "this build has no liburing",
           "install liburing-dev and rebuild kvlane; posix uses pread/pwrite threads");
#endif
    if (mem == KVL_MEM_VRAM)
        kvli_posix_gds_doctor(report, arg);
    FILE *f = fopen("/proc/sys/kernel/io_uring_disabled", "r");
    if (f != NULL) {
        int v = 0;
        if (fscanf(f, "%d", &v) == 1 && v != 0) {
            snprintf(obs, sizeof(obs), "kernel.io_uring_disabled = %d", v);
            report(arg, "posix io_uring sysctl", 1, obs,
                   v == 1 ? "io_uring is limited to the io_uring_group; add the user or set 0"
                          : "set kernel.io_uring_disabled=0 to use io_uring");
        }
        fclose(f);
    }
}

const kvl_backend_ops_t kvli_posix_ops = {
    .abi_version = KVL_BACKEND_ABI_VERSION,
    .size = sizeof(kvl_backend_ops_t),
    .name = KVLI_POSIX_NAME,
    .description = "this agent's DRAM to and from its files (FILE memory): io_uring, many "
                   "operations per submission, O_DIRECT checked, pread/pwrite threads when "
                   "io_uring is refused",
    /* VRAM: staged through pinned host buffers (posix_stage.c) */
    .mem_local = KVL_MEM_BIT(KVL_MEM_DRAM) | KVL_MEM_BIT(KVL_MEM_VRAM) | KVL_MEM_BIT(KVL_MEM_FILE),
    .mem_remote = KVL_MEM_BIT(KVL_MEM_FILE),
    .caps = KVL_BK_CAP_NOTIF | KVL_BK_CAP_STAGED_VRAM | KVL_BK_CAP_INDEXED,
    .params = kvli_posix_params,
    .available = kvli_posix_available,
    .open = kvli_posix_open,
    .close = kvli_posix_close,
    .mem_reg = kvli_posix_mem_reg,
    .mem_dereg = kvli_posix_mem_dereg,
    .conn_pack = kvli_posix_conn_pack,
    .region_pack = kvli_posix_region_pack,
    .peer_load = kvli_posix_peer_load,
    .peer_unload = kvli_posix_peer_unload,
    .rregion_load = kvli_posix_rregion_load,
    .rregion_unload = kvli_posix_rregion_unload,
    .xfer_post = kvli_posix_xfer_post,
    .xfer_cancel = kvli_posix_xfer_cancel,
    .notif_send = kvli_posix_notif_send,
    .peer_describe = kvli_posix_peer_describe,
    .device = NULL,
    .probe = kvli_posix_probe,
    .xfer_release = kvli_posix_xfer_release,
};
