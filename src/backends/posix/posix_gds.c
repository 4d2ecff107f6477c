/*
 * posix backend: GPUDirect Storage through libcufile, loaded at run time.
 *
 *   backend open   - parameter gds (auto | on | off, default from the
 *                    environment's KVL_POSIX_GDS, else auto); unless off,
 *                    dlopen libcufile (once per process: $KVL_CUFILE, else
 *                    libcufile.so.0, else libcufile.so) and resolve the
 *                    entry points by name.
 *   VRAM region    - the first one opens the cuFile driver (slow; in the
 *                    device's context, made current through the core's
 *                    stage_ctx_enter), once per process, held by each posix
 *                    backend that uses it; then cuFileBufRegister on the
 *                    range (optional for cuFile: a failure is reported).
 *   FILE region    - cuFileHandleRegister on its fd, once the driver is open
 *                    (at registration, or at the first VRAM transfer).
 *   transfer       - a VRAM <-> FILE piece goes through cuFileRead/Write on
 *                    a staging thread when the driver is open and the file's
 *                    handle registered; otherwise it is staged.
 *
 * Without nvidia-fs the driver opens in compatibility mode (cuFile does the
 * POSIX I/O itself, through its own buffers): the reports say so, and
 * gds=on refuses it as it refuses every way GPUDirect Storage is not there.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "posix.h"

/* Process-wide: the library (loaded once, kept) and the driver session
 * (opened by the first backend that needs it, closed by the last). */
static struct {
    pthread_once_t once;
    kvli_cufile_api_t api;
    bool ok;
    char why[256];                   /* not ok: why */
    int version;                     /* cuFileGetVersion, 0 unknown */
    pthread_mutex_t lock;
    unsigned refs;                   /* backends holding the driver open */
    bool compat;
    char what[256];                  /* open: what it is (version, nvidia-fs) */
} kvli_cufile = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* The cuFile status names (cufile.h's CU_FILE_* codes, 5000 + n) */
static const char *const kvli_cufile_names[] = {
    [1] = "DRIVER_NOT_INITIALIZED (nvidia-fs not loaded and compatibility mode off)",
    [2] = "DRIVER_INVALID_PROPS", [3] = "DRIVER_UNSUPPORTED_LIMIT",
    [4] = "DRIVER_VERSION_MISMATCH (libcufile and nvidia-fs differ)",
    [5] = "DRIVER_VERSION_READ_ERROR", [6] = "DRIVER_CLOSING",
    [7] = "PLATFORM_NOT_SUPPORTED", [8] = "IO_NOT_SUPPORTED (file system not supported)",
    [9] = "DEVICE_NOT_SUPPORTED (GPU not supported)", [10] = "NVFS_DRIVER_ERROR",
    [11] = "CUDA_DRIVER_ERROR", [12] = "CUDA_POINTER_INVALID",
    [13] = "CUDA_MEMORY_TYPE_INVALID", [14] = "CUDA_POINTER_RANGE_ERROR",
    [15] = "CUDA_CONTEXT_MISMATCH", [16] = "INVALID_MAPPING_SIZE",
    [17] = "INVALID_MAPPING_RANGE", [18] = "INVALID_FILE_TYPE",
    [19] = "INVALID_FILE_OPEN_FLAG", [20] = "DIO_NOT_SET (file not opened with O_DIRECT)",
    [22] = "INVALID_VALUE", [23] = "MEMORY_ALREADY_REGISTERED",
    [24] = "MEMORY_NOT_REGISTERED", [25] = "PERMISSION_DENIED (/dev/nvidia-fs*)",
    [26] = "DRIVER_ALREADY_OPEN", [27] = "HANDLE_NOT_REGISTERED",
    [28] = "HANDLE_ALREADY_REGISTERED", [29] = "DEVICE_NOT_FOUND",
    [30] = "INTERNAL_ERROR", [31] = "GETNEWFD_FAILED", [33] = "NVFS_SETUP_ERROR",
    [34] = "IO_DISABLED (disabled by cufile.json for this file)",
    [36] = "GPU_MEMORY_PINNING_FAILED (BAR1 space)", [43] = "NOMEM_ERROR",
    [44] = "IO_ERROR", [45] = "INTERNAL_BUF_REGISTER_ERROR",
    [47] = "INVALID_CONTEXT_ERROR", [48] = "NVFS_INTERNAL_DRIVER_ERROR",
    [49] = "BATCH_NOCOMPAT_ERROR (compatibility mode off)",
};

/* A cuFile status or data-path return (-errno, or -(5000 + n)) as text. */
static const char *kvli_cufile_text(long long code, char *buf, size_t cap)
{
    long long c = code < 0 ? -code : code;
    size_t n = sizeof(kvli_cufile_names) / sizeof(kvli_cufile_names[0]);
    if (c > KVLI_CUFILE_BASE_ERR && c - KVLI_CUFILE_BASE_ERR < (long long)n &&
        kvli_cufile_names[c - KVLI_CUFILE_BASE_ERR] != NULL)
        snprintf(buf, cap, "CU_FILE_%s (%lld)", kvli_cufile_names[c - KVLI_CUFILE_BASE_ERR], c);
    else if (c > KVLI_CUFILE_BASE_ERR)
        snprintf(buf, cap, "cuFile error %lld", c);
    else
        snprintf(buf, cap, "%s (errno %lld)", strerror((int)c), c);
    return buf;
}

static const char *kvli_cufile_stext(kvli_cufile_status_t s, char *buf, size_t cap)
{
    kvli_cufile_text(s.err, buf, cap);
    if (s.err == KVLI_CUFILE_CUDA_DRIVER_ERROR) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, ", CUresult %d", s.cu_err);
    }
    return buf;
}

static void *kvli_cufile_sym(void *h, const char *a, const char *b)
{
    void *p = dlsym(h, a);
    return p != NULL || b == NULL ? p : dlsym(h, b);
}

static void kvli_cufile_load(void)
{
    kvli_cufile_api_t *f = &kvli_cufile.api;
    const char *env = getenv("KVL_CUFILE");
    void *h = NULL;
    if (env != NULL && env[0] != '\0') {
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            snprintf(kvli_cufile.why, sizeof(kvli_cufile.why), "libcufile not loaded from "
                     "KVL_CUFILE (%.200s)", dlerror());
            return;
        }
    }
    if (h == NULL)
        h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        h = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(kvli_cufile.why, sizeof(kvli_cufile.why), "libcufile.so not found (%.180s)",
                 dlerror());
        return;
    }
    *(void **)&f->DriverOpen = kvli_cufile_sym(h, "cuFileDriverOpen", NULL);
    *(void **)&f->DriverClose = kvli_cufile_sym(h, "cuFileDriverClose_v2", "cuFileDriverClose");
    *(void **)&f->DriverGetProperties = kvli_cufile_sym(h, "cuFileDriverGetProperties", NULL);
    *(void **)&f->GetVersion = kvli_cufile_sym(h, "cuFileGetVersion", NULL);
    *(void **)&f->HandleRegister = kvli_cufile_sym(h, "cuFileHandleRegister", NULL);
    *(void **)&f->HandleDeregister = kvli_cufile_sym(h, "cuFileHandleDeregister", NULL);
    *(void **)&f->BufRegister = kvli_cufile_sym(h, "cuFileBufRegister", NULL);
    *(void **)&f->BufDeregister = kvli_cufile_sym(h, "cuFileBufDeregister", NULL);
    *(void **)&f->Read = kvli_cufile_sym(h, "cuFileRead", NULL);
    *(void **)&f->Write = kvli_cufile_sym(h, "cuFileWrite", NULL);
    const char *miss = !f->DriverOpen ? "cuFileDriverOpen" : !f->DriverClose ? "cuFileDriverClose"
                       : !f->HandleRegister ? "cuFileHandleRegister"
                       : !f->HandleDeregister ? "cuFileHandleDeregister"
                       : !f->Read ? "cuFileRead" : !f->Write ? "cuFileWrite" : NULL;
    if (miss != NULL) {
        snprintf(kvli_cufile.why, sizeof(kvli_cufile.why), "libcufile.so has no %s", miss);
        dlclose(h);
        return;
    }
    if (!f->BufRegister || !f->BufDeregister)
        f->BufRegister = NULL, f->BufDeregister = NULL;
    if (f->GetVersion == NULL || f->GetVersion(&kvli_cufile.version).err != 0)
        kvli_cufile.version = 0;
    kvli_cufile.ok = true; /* kept loaded: the driver session is process-wide */
}

kvl_status_t kvli_posix_gds_mode(const char *what, const char *v, int *mode_p, kvl_error_t *err)
{
    if (strcmp(v, "auto") == 0)
        *mode_p = KVLI_POSIX_GDS_AUTO;
    else if (strcmp(v, "on") == 0 || strcmp(v, "1") == 0)
        *mode_p = KVLI_POSIX_GDS_ON;
    else if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0)
        *mode_p = KVLI_POSIX_GDS_OFF;
    else {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_POSIX_NAME, -1,
                         "%s='%s' is not auto, on or off (GPUDirect Storage for VRAM <-> FILE)",
                         what, v);
        kvl_bk_error_hint(err, "auto: GPUDirect Storage when libcufile works, else staged; on: "
                               "GPUDirect Storage or an error; off: always staged");
        return KVL_ERR_INVALID_ARG;
    }
    return KVL_OK;
}

void kvli_posix_gds_probe(kvli_posix_iface_t *iface, const char *off_by)
{
    iface->gds_state = KVLI_POSIX_GDS_NONE;
    if (iface->gds_mode == KVLI_POSIX_GDS_OFF) {
        snprintf(iface->gds_why, sizeof(iface->gds_why), "GPUDirect Storage not used: %s",
                 off_by);
        return;
    }
    pthread_once(&kvli_cufile.once, kvli_cufile_load);
    if (!kvli_cufile.ok) {
        snprintf(iface->gds_why, sizeof(iface->gds_why), "GPUDirect Storage not used: %s",
                 kvli_cufile.why);
        return;
    }
    iface->cf = &kvli_cufile.api;
    iface->gds_state = KVLI_POSIX_GDS_LOADED;
    snprintf(iface->gds_why, sizeof(iface->gds_why), "libcufile loaded, cuFile driver not "
             "opened yet (at the first VRAM registration)");
}

/* " 1.15" from cuFileGetVersion, "" when unknown */
static const char *kvli_cufile_ver(char *buf, size_t cap)
{
    buf[0] = '\0';
    if (kvli_cufile.version > 0)
        snprintf(buf, cap, " %d.%d", kvli_cufile.version / 1000,
                 kvli_cufile.version % 1000 / 10);
    return buf;
}

void kvli_posix_gds_doctor(void (*report)(void *arg, const char *check, int status,
                                           const char *observed, const char *hint),
                           void *arg)
{
    char obs[400], ver[48];
    pthread_once(&kvli_cufile.once, kvli_cufile_load);
    bool nvfs = access("/proc/driver/nvidia-fs/version", F_OK) == 0;
    if (!kvli_cufile.ok)
        snprintf(obs, sizeof(obs), "%s: VRAM <-> FILE is staged through pinned host buffers",
                 kvli_cufile.why);
    else
        snprintf(obs, sizeof(obs), "libcufile%s loads; nvidia-fs %s",
                 kvli_cufile_ver(ver, sizeof(ver)), nvfs
                 ? "loaded: VRAM <-> FILE through GPUDirect Storage where the file system takes it"
                 : "not loaded: cuFile runs in compatibility mode (POSIX I/O), unless it reaches "
                   "NVMe through PCI P2PDMA (the VRAM registration report says)");
    report(arg, "posix GPUDirect Storage", 0, obs,
           kvli_cufile.ok && nvfs ? "" : "for GPUDirect Storage: libcufile (KVL_CUFILE names it), "
           "nvidia-fs (modprobe nvidia-fs), O_DIRECT files on a file system GDS supports");
}

/* After cuFileDriverOpen, under the lock: GPUDirect or compatibility mode. */
static void kvli_cufile_describe(void)
{
    kvli_cufile_props_t pr;
    char ver[48];
    memset(&pr, 0, sizeof(pr));
    kvli_cufile_ver(ver, sizeof(ver));
    bool props = kvli_cufile.api.DriverGetProperties != NULL &&
                 kvli_cufile.api.DriverGetProperties(&pr).err == 0;
    bool nvfs = props ? pr.p.nvfs.major_version != 0 || pr.p.nvfs.minor_version != 0
                      : access("/proc/driver/nvidia-fs/version", F_OK) == 0;
    /* newer cuFile reach NVMe without nvidia-fs, through the kernel's P2PDMA */
    bool p2p = props && (pr.p.fflags & (1u << KVLI_CUFILE_FEATURE_P2PDMA)) != 0;
    kvli_cufile.compat = !nvfs && !p2p;
    if (!nvfs && p2p)
        snprintf(kvli_cufile.what, sizeof(kvli_cufile.what), "GPUDirect Storage through "
                 "libcufile%s (PCI P2PDMA; nvidia-fs not loaded)", ver);
    else if (nvfs && props)
        snprintf(kvli_cufile.what, sizeof(kvli_cufile.what), "GPUDirect Storage through "
                 "libcufile%s (nvidia-fs %u.%u)", ver, pr.p.nvfs.major_version,
                 pr.p.nvfs.minor_version);
    else if (nvfs)
        snprintf(kvli_cufile.what, sizeof(kvli_cufile.what), "GPUDirect Storage through "
                 "libcufile%s (nvidia-fs loaded)", ver);
    else
        snprintf(kvli_cufile.what, sizeof(kvli_cufile.what), "cuFile in compatibility mode "
                 "through libcufile%s: nvidia-fs is not loaded (%s), so cuFile does POSIX I/O "
                 "through its own host buffers, not GPUDirect", ver,
                 props ? "cuFileDriverGetProperties: nvidia-fs version 0.0"
                       : "no /proc/driver/nvidia-fs");
}

/* Open the process's cuFile session for this backend, with device dev's
 * context current; the outcome in iface->gds_state / gds_why. Under
 * iface->gds_lock. */
static void kvli_posix_gds_open(kvli_posix_iface_t *iface, int32_t dev)
{
    kvl_bk_ctx_t *ctx = iface->ctx;
    kvl_error_t e;
    char eb[160];
    memset(&e, 0, offsetof(kvl_error_t, causes));
    iface->gds_state = KVLI_POSIX_GDS_NONE;
    if (ctx->size < offsetof(kvl_bk_ctx_t, stage_ctx_leave) + sizeof(ctx->stage_ctx_leave) ||
        ctx->stage_ctx_enter == NULL || ctx->stage_ctx_leave == NULL) {
        snprintf(iface->gds_why, sizeof(iface->gds_why), "GPUDirect Storage not used: the "
                 "kvlane core lends posix no device context for cuFile");
        return;
    }
    if (ctx->stage_ctx_enter(ctx, dev, &e) != KVL_OK) {
        snprintf(iface->gds_why, sizeof(iface->gds_why), "GPUDirect Storage not used: device "
                 "%d's context: %.180s", (int)dev, e.what);
        return;
    }
    pthread_mutex_lock(&kvli_cufile.lock);
    kvli_cufile_status_t s = {0, 0};
    if (kvli_cufile.refs == 0)
        s = kvli_cufile.api.DriverOpen();
    if (s.err == 0) {
        if (kvli_cufile.refs++ == 0)
            kvli_cufile_describe();
        iface->gds_drv = true;
        iface->gds_state = kvli_cufile.compat ? KVLI_POSIX_GDS_COMPAT : KVLI_POSIX_GDS_UP;
        snprintf(iface->gds_why, sizeof(iface->gds_why), "%s", kvli_cufile.what);
    } else {
        snprintf(iface->gds_why, sizeof(iface->gds_why), "GPUDirect Storage not used: "
                 "cuFileDriverOpen = %s", kvli_cufile_stext(s, eb, sizeof(eb)));
    }
    pthread_mutex_unlock(&kvli_cufile.lock);
    ctx->stage_ctx_leave(ctx);
    /* said once per backend; every VRAM registration's report says it too */
    ctx->log(ctx, KVL_LOG_INFO, "VRAM <-> FILE: %s", iface->gds_why);
}

void kvli_posix_gds_close(kvli_posix_iface_t *iface)
{
    if (!iface->gds_drv)
        return;
    pthread_mutex_lock(&kvli_cufile.lock);
    if (--kvli_cufile.refs == 0)
        (void)kvli_cufile.api.DriverClose(); /* nothing left to tell: posix is closing */
    pthread_mutex_unlock(&kvli_cufile.lock);
    iface->gds_drv = false;
}

static bool kvli_posix_gds_usable(const kvli_posix_iface_t *iface)
{
    return iface->gds_state == KVLI_POSIX_GDS_UP || iface->gds_state == KVLI_POSIX_GDS_COMPAT;
}

/* gds=on: refuse unless the true GPUDirect path is there (state). */
static kvl_status_t kvli_posix_gds_require(const kvli_posix_iface_t *iface, int state,
                                           const char *why, int32_t dev, kvl_error_t *err)
{
    if (iface->gds_mode != KVLI_POSIX_GDS_ON || state == KVLI_POSIX_GDS_UP)
        return KVL_OK;
    kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, dev,
                     "parameter gds=on, but GPUDirect Storage cannot be used: %.700s", why);
    kvl_bk_error_hint(err, "install GPUDirect Storage (libcufile, nvidia-fs loaded: lsmod | grep "
                           "nvidia_fs; gdscheck -p) on a file system it supports, or create "
                           "posix with gds=auto to stage through host memory when it is not "
                           "there");
    return KVL_ERR_UNSUPPORTED;
}

kvl_status_t kvli_posix_gds_vram(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh, char *what,
                                 size_t cap, bool *gds_p, kvl_error_t *err)
{
    char eb[160];
    pthread_mutex_lock(&iface->gds_lock);
    if (iface->gds_state == KVLI_POSIX_GDS_LOADED)
        kvli_posix_gds_open(iface, mh->dev);
    snprintf(what, cap, "%s", iface->gds_why);
    int state = iface->gds_state;
    *gds_p = kvli_posix_gds_usable(iface);
    pthread_mutex_unlock(&iface->gds_lock);
    kvl_status_t st = kvli_posix_gds_require(iface, state, what, mh->dev, err);
    if (st != KVL_OK || !*gds_p || iface->cf->BufRegister == NULL)
        return st;
    kvl_error_t e;
    memset(&e, 0, offsetof(kvl_error_t, causes));
    if (iface->ctx->stage_ctx_enter(iface->ctx, mh->dev, &e) != KVL_OK)
        return KVL_OK; /* gds_open entered it: reported there if it fails */
    kvli_cufile_status_t s = iface->cf->BufRegister((void *)(uintptr_t)mh->addr, mh->len, 0);
    iface->ctx->stage_ctx_leave(iface->ctx);
    size_t l = strlen(what);
    mh->gds_buf = s.err == 0;
    if (mh->gds_buf)
        snprintf(what + l, cap - l, ", buffer registered with cuFile");
    else
        snprintf(what + l, cap - l, ", buffer not registered with cuFile (cuFileBufRegister = "
                 "%s: cuFile bounces it through its own GPU buffers)",
                 kvli_cufile_stext(s, eb, sizeof(eb)));
    return KVL_OK;
}

/* Register a FILE range's fd with cuFile once the driver is open; the
 * outcome in mh->gds_st / gds_why. Under iface->gds_lock. */
static void kvli_posix_gds_handle(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh)
{
    char eb[160];
    if (mh->gds_st != 0 || !kvli_posix_gds_usable(iface))
        return;
    kvli_cufile_descr_t d;
    memset(&d, 0, sizeof(d));
    d.type = KVLI_CUFILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = mh->fd;
    kvli_cufile_status_t s = iface->cf->HandleRegister(&mh->gds_fh, &d);
    mh->gds_st = s.err == 0 ? 1 : -1;
    if (s.err != 0)
        snprintf(mh->gds_why, sizeof(mh->gds_why), "staged: cuFileHandleRegister on fd %d: %s",
                 mh->fd, kvli_cufile_stext(s, eb, sizeof(eb)));
    else
        snprintf(mh->gds_why, sizeof(mh->gds_why), "%s%s", iface->gds_state ==
                 KVLI_POSIX_GDS_COMPAT ? "cuFile (compatibility mode)" : "GPUDirect Storage",
                 mh->direct ? "" : "; the fd is not O_DIRECT: cuFile moves it through the "
                                   "page cache (compatibility path), not GPUDirect");
}

void kvli_posix_gds_file(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh, char *detail,
                         size_t cap)
{
    pthread_mutex_lock(&iface->gds_lock);
    kvli_posix_gds_handle(iface, mh);
    size_t l = strlen(detail);
    snprintf(detail + l, cap - l, "; VRAM with it: %s%s", mh->gds_st != 0 ? ""
             : iface->gds_state == KVLI_POSIX_GDS_NONE ? "staged, " : "", mh->gds_st != 0
             ? mh->gds_why : iface->gds_state == KVLI_POSIX_GDS_NONE ? iface->gds_why
             : "cuFile or staged, decided when VRAM first moves with it (the cuFile "
               "driver opens at the first VRAM registration)");
    pthread_mutex_unlock(&iface->gds_lock);
}

kvl_status_t kvli_posix_gds_use(kvli_posix_iface_t *iface, kvli_posix_mh_t *f,
                                const kvli_posix_mh_t *v, bool write, bool *gds_p,
                                kvl_error_t *err)
{
    char why[400];
    pthread_mutex_lock(&iface->gds_lock);
    kvli_posix_gds_handle(iface, f);
    *gds_p = f->gds_st == 1;
    snprintf(why, sizeof(why), "%s", f->gds_st == -1 ? f->gds_why : iface->gds_why);
    int state = iface->gds_state;
    pthread_mutex_unlock(&iface->gds_lock);
    if (iface->gds_mode != KVLI_POSIX_GDS_ON || (*gds_p && state == KVLI_POSIX_GDS_UP))
        return KVL_OK;
    kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_POSIX_NAME, v->dev,
                     "%s of %s (fd %d) with VRAM on GPU %d: parameter gds=on, but GPUDirect "
                     "Storage cannot be used for this file: %.500s", write ? "WRITE" : "READ",
                     f->path, f->fd, (int)v->dev, why);
    kvl_bk_error_hint(err, "put the file on a file system GPUDirect Storage supports (gdscheck "
                           "-p lists them) with nvidia-fs loaded, or create posix with "
                           "gds=auto to stage it through host memory");
    return KVL_ERR_UNSUPPORTED;
}

void kvli_posix_gds_dereg(kvli_posix_iface_t *iface, kvli_posix_mh_t *mh)
{
    if (mh->kind == KVL_MEM_FILE && mh->gds_st == 1) {
        iface->cf->HandleDeregister(mh->gds_fh);
        mh->gds_st = 0;
    }
    if (mh->kind != KVL_MEM_VRAM || !mh->gds_buf)
        return;
    kvl_error_t e;
    memset(&e, 0, offsetof(kvl_error_t, causes));
    if (iface->ctx->stage_ctx_enter(iface->ctx, mh->dev, &e) != KVL_OK)
        return; /* the device is gone: so is what cuFile pinned on it */
    (void)iface->cf->BufDeregister((void *)(uintptr_t)mh->addr);
    iface->ctx->stage_ctx_leave(iface->ctx);
    mh->gds_buf = false;
}

/* One piece through cuFile, on a staging thread: the bytes moved (all of
 * them), or -1 with e filled. */
long long kvli_posix_gds_piece(kvli_posix_iface_t *iface, const kvli_posix_op_t *op, int write,
                               kvl_error_t *e)
{
    const kvli_posix_mh_t *v = op->vmh, *f = op->fmh;
    size_t len = op->len - op->done, done = 0;
    char *base = v->gds_buf ? (char *)(uintptr_t)v->addr : op->buf + op->done;
    off_t boff = v->gds_buf ? (off_t)((uintptr_t)op->buf + op->done - v->addr) : 0;
    char eb[160];
    ssize_t r = 0;
    if (iface->ctx->stage_ctx_enter(iface->ctx, op->dev, e) != KVL_OK)
        return -1;
    while (done < len) {
        off_t at = (off_t)(op->off + op->done + done);
        r = write ? iface->cf->Write(f->gds_fh, base, len - done, at, boff + (off_t)done)
                  : iface->cf->Read(f->gds_fh, base, len - done, at, boff + (off_t)done);
        if (r <= 0)
            break;
        done += (size_t)r;
    }
    iface->ctx->stage_ctx_leave(iface->ctx);
    if (done == len)
        return (long long)len;
    kvl_bk_error_set(e, KVL_ERR_SYSTEM, r < 0 && r > -KVLI_CUFILE_BASE_ERR ? (int)-r : 0,
                     KVLI_POSIX_NAME, op->dev,
                     "%s of %zu bytes at file offset %llu of %s (fd %d), GPU %d address 0x%llx: "
                     "%s after %zu bytes: %s", write ? "cuFileWrite" : "cuFileRead", len,
                     (unsigned long long)(op->off + op->done), f->path, f->fd, (int)op->dev,
                     (unsigned long long)(uintptr_t)(op->buf + op->done),
                     r == 0 ? "short" : "failed", done,
                     r == 0 ? (write ? "it wrote nothing more" : "the end of the file")
                            : kvli_cufile_text(r, eb, sizeof(eb)));
    kvl_bk_error_hint(e, "cuFile's log (cufile.log in the working directory, or the path in "
                         "cufile.json) has the detail; create posix with gds=off to stage "
                         "through host memory instead");
    return -1;
}
