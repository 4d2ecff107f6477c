/*
 * Backends: built-in ones register statically (cuda among them: it loads
 * the CUDA driver at run time); those with heavy build dependencies (UCX)
 * are modules, libkvlane-<name>.so, loaded at run
 * time so the core and the CLI run where those libraries are absent.
 * A module exports kvl_backend_module_v1() returning its ops table.
 * Search order: $KVL_MODULE_PATH (colon-separated directories), the build
 * tree's module directory, then the installed one.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "internal.h"

#ifndef KVL_MODULE_DIR
#define KVL_MODULE_DIR "/usr/local/lib/kvlane"
#endif
#ifndef KVL_BUILD_MODULE_DIR
#define KVL_BUILD_MODULE_DIR ""
#endif
#ifndef KVL_BUILD_DIR
#define KVL_BUILD_DIR ""
#endif
#ifndef KVL_LIBDIR_NAME
#define KVL_LIBDIR_NAME "lib"
#endif

extern const kvl_backend_ops_t kvli_shm_ops;
#ifdef KVL_HAVE_TCP
extern const kvl_backend_ops_t kvli_tcp_ops;
#endif
#ifdef KVL_HAVE_CUDA
extern const kvl_backend_ops_t kvli_cuda_ops;
#endif
#ifdef KVL_HAVE_POSIX
extern const kvl_backend_ops_t kvli_posix_ops;
#endif

static const kvl_backend_ops_t *const kvli_builtin_src[] = {
    &kvli_shm_ops,
#ifdef KVL_HAVE_TCP
    &kvli_tcp_ops,
#endif
#ifdef KVL_HAVE_CUDA
    &kvli_cuda_ops,
#endif
#ifdef KVL_HAVE_POSIX
    &kvli_posix_ops,
#endif
};
#define KVLI_NBUILTIN (sizeof(kvli_builtin_src) / sizeof(kvli_builtin_src[0]))

/*
 * Every ops table the core uses is a full-size copy made once, when the
 * backend is first looked up: the slots a backend was built without (its
 * size is smaller) are NULL there, so the core tests a slot for NULL and
 * never does size arithmetic. size keeps what the backend was built with.
 */
static kvl_backend_ops_t kvli_builtin[KVLI_NBUILTIN];
static kvl_device_ops_t kvli_builtin_dev[KVLI_NBUILTIN];
static pthread_once_t kvli_builtin_once = PTHREAD_ONCE_INIT;

static void kvli_ops_fill(kvl_backend_ops_t *dst, const kvl_backend_ops_t *src)
{
    memset(dst, 0, sizeof(*dst));
    memcpy(dst, src, src->size < sizeof(*dst) ? src->size : sizeof(*dst));
}

/* Device services the same way: a full-size copy, and all five staging
 * slots or none (a stager missing one would fail half-way); the context
 * pair likewise. */
static void kvli_dev_fill(kvl_device_ops_t *dst, const kvl_device_ops_t *src)
{
    memset(dst, 0, sizeof(*dst));
    memcpy(dst, src, src->size < sizeof(*dst) ? src->size : sizeof(*dst));
    if (!dst->stage_check || !dst->stage_host_alloc || !dst->stage_host_free ||
        !dst->stage_copy || !dst->stage_test)
        dst->stage_check = NULL, dst->stage_host_alloc = NULL, dst->stage_host_free = NULL,
        dst->stage_copy = NULL, dst->stage_test = NULL;
    if (!dst->ctx_enter || !dst->ctx_leave)
        dst->ctx_enter = NULL, dst->ctx_leave = NULL;
}

static void kvli_builtin_init(void)
{
    for (size_t i = 0; i < KVLI_NBUILTIN; i++) {
        kvli_ops_fill(&kvli_builtin[i], kvli_builtin_src[i]);
        if (kvli_builtin[i].device != NULL) {
            kvli_dev_fill(&kvli_builtin_dev[i], kvli_builtin[i].device);
            kvli_builtin[i].device = &kvli_builtin_dev[i];
        }
    }
}

/* Modules this build knows of, loaded on first use. */
static const char *const kvli_module_names[] = {"ucx"};
#define KVLI_NMODULES (sizeof(kvli_module_names) / sizeof(kvli_module_names[0]))

static struct {
    bool tried;
    const kvl_backend_ops_t *ops;   /* &filled once loaded, else NULL */
    kvl_backend_ops_t filled;
    char reason[512];
} kvli_modules[KVLI_NMODULES];
static pthread_mutex_t kvli_module_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *kvli_names[KVLI_NBUILTIN + KVLI_NMODULES + 1];
static pthread_once_t kvli_names_once = PTHREAD_ONCE_INIT;

static void kvli_names_init(void)
{
    size_t n = 0;
    for (size_t i = 0; i < KVLI_NBUILTIN; i++)
        kvli_names[n++] = kvli_builtin_src[i]->name;
    for (size_t i = 0; i < KVLI_NMODULES; i++)
        kvli_names[n++] = kvli_module_names[i];
    kvli_names[n] = NULL;
}

/* Try one directory; true when the file exists (loaded or not). */
static bool kvli_module_try(size_t m, const char *dir, char *tried, size_t tcap)
{
    char path[4096];
    size_t tl = strlen(tried);
    snprintf(path, sizeof(path), "%s/libkvlane-%s.so", dir, kvli_module_names[m]);
    snprintf(tried + tl, tcap - tl, "%s%s", tl ? ", " : "", dir);
    if (access(path, F_OK) != 0)
        return false;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(kvli_modules[m].reason, sizeof(kvli_modules[m].reason),
                 "module %.200s could not be loaded: %.250s", path, e ? e : "dlopen failed");
        return true;
    }
    typedef const kvl_backend_ops_t *(*entry_t)(void);
    entry_t entry;
    void *sym = dlsym(h, "kvl_backend_module_v1");
    memcpy(&entry, &sym, sizeof(entry));
    const kvl_backend_ops_t *ops = entry ? entry() : NULL;
    if (ops == NULL) {
        snprintf(kvli_modules[m].reason, sizeof(kvli_modules[m].reason),
                 "module %.200s has no kvl_backend_module_v1 entry point (not a kvlane module?)",
                 path);
        dlclose(h);
        return true;
    }
    if (ops->abi_version != KVL_BACKEND_ABI_VERSION || ops->name == NULL ||
        strcmp(ops->name, kvli_module_names[m]) != 0) {
        snprintf(kvli_modules[m].reason, sizeof(kvli_modules[m].reason),
                 "module %.200s speaks backend ABI %u for '%.32s'; this kvlane needs ABI %u for '%s' "
                 "(rebuild the module with this kvlane)", path, ops->abi_version,
                 ops->name ? ops->name : "?", KVL_BACKEND_ABI_VERSION, kvli_module_names[m]);
        dlclose(h);
        return true;
    }
    kvli_ops_fill(&kvli_modules[m].filled, ops);
    if (kvli_modules[m].filled.device != NULL) {
        /* The core asks device services of built-in backends only. */
        snprintf(kvli_modules[m].reason, sizeof(kvli_modules[m].reason),
                 "module %.200s offers device services (ops->device: mem_query, staging), "
                 "which only built-in backends may offer (rebuild the module without them)",
                 path);
        dlclose(h);
        return true;
    }
    /* Kept loaded for the life of the process: backends' threads may
     * outlive any one agent's use of them. */
    kvli_modules[m].ops = &kvli_modules[m].filled;
    return true;
}

static const kvl_backend_ops_t *kvli_module_load(size_t m)
{
    pthread_mutex_lock(&kvli_module_lock);
    if (!kvli_modules[m].tried) {
        char tried[2048] = "";
        bool found = false;
        const char *env = getenv("KVL_MODULE_PATH");
        if (env && env[0]) {
            char buf[2048];
            snprintf(buf, sizeof(buf), "%s", env);
            char *save = NULL;
            for (char *d = strtok_r(buf, ":", &save); d && !found; d = strtok_r(NULL, ":", &save))
                found = kvli_module_try(m, d, tried, sizeof(tried));
        }
        /* Code that runs from this build tree (tests, the Python module in
         * build/python) uses this build tree's modules, never installed
         * ones. Installed code looks next to itself: <dir>/kvlane is where an
         * installed libkvlane.so keeps its modules, <dir>/../<libdir>/kvlane
         * where an installed program linked statically finds them; then the
         * configured install folder. An installed library never looks in the
         * build tree. */
        Dl_info info;
        char here[PATH_MAX] = "";
        char real[PATH_MAX];
        /* The main program's own name comes as it was run ("./kvlane", or
         * empty): resolve it, or read /proc/self/exe. */
        if (dladdr((void *)&kvli_module_load, &info) != 0 && info.dli_fname != NULL &&
            info.dli_fname[0] != '\0' && realpath(info.dli_fname, real) != NULL) {
            snprintf(here, sizeof(here), "%s", real);
        } else {
            ssize_t rl = readlink("/proc/self/exe", real, sizeof(real) - 1);
            if (rl > 0) {
                real[rl] = '\0';
                snprintf(here, sizeof(here), "%s", real);
            }
        }
        if (here[0]) {
            char *slash = strrchr(here, '/');
            if (slash != NULL)
                *slash = '\0';
            else
                snprintf(here, sizeof(here), ".");
        }
        size_t bl = strlen(KVL_BUILD_DIR);
        bool in_build = bl > 0 && strncmp(here, KVL_BUILD_DIR, bl) == 0 &&
                        (here[bl] == '/' || here[bl] == '\0');
        if (!found && in_build)
            found = kvli_module_try(m, KVL_BUILD_MODULE_DIR, tried, sizeof(tried));
        if (!found && !in_build && here[0]) {
            char d[PATH_MAX + 32];
            const char *rel[] = {"kvlane", "../" KVL_LIBDIR_NAME "/kvlane"};
            for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]) && !found; i++) {
                snprintf(d, sizeof(d), "%s/%s", here, rel[i]);
                found = kvli_module_try(m, d, tried, sizeof(tried));
            }
        }
        if (!found && !in_build)
            found = kvli_module_try(m, KVL_MODULE_DIR, tried, sizeof(tried));
        if (!found)
            snprintf(kvli_modules[m].reason, sizeof(kvli_modules[m].reason),
                     "module libkvlane-%s.so not found (looked in: %.300s); this build has no %s "
                     "support or the module was not installed", kvli_module_names[m], tried,
                     kvli_module_names[m]);
        kvli_modules[m].tried = true;
    }
    const kvl_backend_ops_t *ops = kvli_modules[m].ops;
    pthread_mutex_unlock(&kvli_module_lock);
    return ops;
}

static int kvli_module_index(const char *name)
{
    for (size_t m = 0; m < KVLI_NMODULES; m++)
        if (strcasecmp(kvli_module_names[m], name) == 0)
            return (int)m;
    return -1;
}

const kvl_backend_ops_t *kvli_backend_builtin(size_t i)
{
    pthread_once(&kvli_builtin_once, kvli_builtin_init);
    return i < KVLI_NBUILTIN ? &kvli_builtin[i] : NULL;
}

const kvl_backend_ops_t *kvli_backend_find(const char *name)
{
    if (name == NULL)
        return NULL;
    pthread_once(&kvli_builtin_once, kvli_builtin_init);
    for (size_t i = 0; i < KVLI_NBUILTIN; i++)
        if (strcasecmp(kvli_builtin[i].name, name) == 0)
            return &kvli_builtin[i];
    int m = kvli_module_index(name);
    return m >= 0 ? kvli_module_load((size_t)m) : NULL;
}

const char *const *kvl_backend_names(void)
{
    pthread_once(&kvli_names_once, kvli_names_init);
    return kvli_names;
}

const kvl_param_t *kvl_backend_params(const char *name)
{
    const kvl_backend_ops_t *ops = kvli_backend_find(name);
    return ops ? ops->params : NULL;
}

kvl_status_t kvl_backend_available(const char *name, char *reason, size_t len)
{
    const kvl_backend_ops_t *ops = kvli_backend_find(name);
    if (reason && len)
        reason[0] = '\0';
    if (ops == NULL) {
        int m = name ? kvli_module_index(name) : -1;
        if (m >= 0) {
            if (reason && len)
                snprintf(reason, len, "%s", kvli_modules[m].reason);
            return KVL_ERR_UNSUPPORTED;
        }
        if (reason && len) {
            const char *const *n = kvl_backend_names();
            size_t off = (size_t)snprintf(reason, len, "no backend named '%s' in this build (known:",
                                          name ? name : "(null)");
            for (; *n && off < len; n++)
                off += (size_t)snprintf(reason + off, len - off, " %s", *n);
            if (off < len)
                snprintf(reason + off, len - off, ")");
        }
        return KVL_ERR_NOT_FOUND;
    }
    if (ops->available == NULL)
        return KVL_OK;
    return ops->available(reason, len);
}

kvl_status_t kvl_backend_probe(const char *name, kvl_probe_cb_t cb, void *arg, int mem, int32_t dev,
                               uint64_t planned_bytes)
{
    const kvl_backend_ops_t *ops = kvli_backend_find(name);
    if (ops == NULL || cb == NULL)
        return KVL_ERR_NOT_FOUND;
    if (ops->probe == NULL)
        return KVL_ERR_UNSUPPORTED;
    ops->probe(cb, arg, (kvl_mem_kind_t)mem, dev, planned_bytes);
    return KVL_OK;
}
