/*
 * Shareable allocations (kvl_mem_alloc, kvl_mem_alloc_ex): memfd-backed or
 * made by a backend, and the lookup peers' backends use to map them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "internal.h"

const kvli_alloc_t *kvli_alloc_containing(const kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < a->nallocs; i++) {
        const kvli_alloc_t *al = &a->allocs[i];
        uint64_t base = (uint64_t)(uintptr_t)al->ptr;
        if (al->fd < 0)
            continue; /* a backend's allocation: that backend knows it */
        if (addr >= base && addr - base <= al->len && len <= al->len - (addr - base))
            return al;
    }
    return NULL;
}

/* Undo one backend registration set; the region leaves every backend. */

/* ---- shareable allocations ---- */

/* Under the agent lock: room for one more allocation record. */
static bool kvli_allocs_grow(kvl_agent_t *a)
{
    if (a->nallocs < a->capallocs)
        return true;
    size_t cap = a->capallocs ? a->capallocs * 2 : 8;
    kvli_alloc_t *na = realloc(a->allocs, cap * sizeof(*na));
    if (na == NULL)
        return false;
    a->allocs = na;
    a->capallocs = cap;
    return true;
}

kvl_status_t kvl_mem_alloc(kvl_agent_t *a, size_t len, void **ptr_p)
{
    kvl_error_t err;
    if (a == NULL || ptr_p == NULL || len == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_mem_alloc: agent or ptr_p is NULL, or len is 0");
    *ptr_p = NULL;
    if (len > (size_t)INT64_MAX) /* ftruncate takes an off_t */
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, "pass the size in bytes",
                                "kvl_mem_alloc: %zu bytes is more than a memfd can hold", len);
    char name[96];
    snprintf(name, sizeof(name), "kvlane-%s", a->name);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        kvli_err(&err, KVL_ERR_SYSTEM, errno, "memfd_create(\"%s\") failed", name);
        kvli_hint(&err, "the kernel must support memfd (Linux >= 3.17); check RLIMIT_NOFILE");
        return kvli_fail(a, &err);
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, errno, "ftruncate(memfd, %zu) failed", len);
        kvli_hint(&err, "check memory cgroup limits and free memory");
        close(fd);
        return kvli_fail(a, &err);
    }
    /* Peers map this memfd: forbid shrinking, which would turn their copies
     * into SIGBUS. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        kvli_err(&err, KVL_ERR_SYSTEM, errno, "fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) failed");
        kvli_hint(&err, "the kernel must support memfd sealing (Linux >= 3.17)");
        close(fd);
        return kvli_fail(a, &err);
    }
    /* Populate now: faulting 16 KiB blocks later during a transfer would
     * cost more than the copy itself. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        kvli_err(&err, KVL_ERR_NO_MEMORY, errno, "mmap(%zu bytes, MAP_SHARED, memfd) failed", len);
        kvli_hint(&err, "check free memory, the memory cgroup limit and vm.max_map_count");
        close(fd);
        return kvli_fail(a, &err);
    }
    pthread_mutex_lock(&a->lock);
    if (!kvli_allocs_grow(a)) {
        pthread_mutex_unlock(&a->lock);
        munmap(p, len);
        close(fd);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_alloc: out of memory");
    }
    a->allocs[a->nallocs++] = (kvli_alloc_t){++a->next_alloc_id, p, len, fd, NULL, NULL};
    pthread_mutex_unlock(&a->lock);
    *ptr_p = p;
    return KVL_OK;
}

kvl_status_t kvl_mem_alloc_ex(kvl_agent_t *a, size_t len, const kvl_alloc_params_t *params,
                              void **ptr_p)
{
    kvl_error_t err;
    const char *name = params && (params->field_mask & KVL_ALLOC_PARAM_BACKEND) ? params->backend
                                                                             : NULL;
    if (name == NULL || name[0] == '\0')
        return kvl_mem_alloc(a, len, ptr_p);
    if (a == NULL || ptr_p == NULL || len == 0)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_mem_alloc_ex: agent or ptr_p is NULL, or len is 0");
    *ptr_p = NULL;
    struct kvl_backend *bk = NULL;
    pthread_mutex_lock(&a->lock);
    for (unsigned b = 0; b < a->nbks; b++)
        if (strcmp(a->bks[b]->ops->name, name) == 0)
            bk = a->bks[b];
    pthread_mutex_unlock(&a->lock);
    if (bk == NULL) {
        kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "kvl_mem_alloc_ex: backend '%s' is not created on "
                 "agent '%s'", name, a->name);
        kvli_scopy(err.backend, sizeof(err.backend), name);
        kvli_hint(&err, "create the backend first (kvl_backend_create or the agent's "
                  "create_backends), or leave the backend unset for memfd memory");
        return kvli_fail(a, &err);
    }
    const kvl_backend_ops_t *ops = bk->ops;
    if (!KVLI_OPS_HAS(ops, mem_alloc) || !KVLI_OPS_HAS(ops, mem_free)) {
        kvli_err(&err, KVL_ERR_UNSUPPORTED, 0, "kvl_mem_alloc_ex: backend '%s' does not "
                 "allocate memory", name);
        kvli_scopy(err.backend, sizeof(err.backend), name);
        kvli_hint(&err, "name a backend that allocates (ucx), or use kvl_mem_alloc() (memfd "
                  "memory, which the shm backend maps)");
        return kvli_fail(a, &err);
    }
    void *p = NULL, *ah = NULL;
    char detail[256] = "";
    memset(&err, 0, offsetof(kvl_error_t, causes));
    err.device = -1;
    kvl_status_t st = ops->mem_alloc(bk->bk, len, &p, &ah, detail, sizeof(detail), &err);
    if (st != KVL_OK) {
        if (err.code == KVL_OK)
            kvl_bk_error_set(&err, st, 0, name, -1, "mem_alloc failed");
        if (!err.backend[0])
            kvli_scopy(err.backend, sizeof(err.backend), name);
        return kvli_fail(a, &err);
    }
    pthread_mutex_lock(&a->lock);
    if (!kvli_allocs_grow(a)) {
        ops->mem_free(bk->bk, ah);
        pthread_mutex_unlock(&a->lock);
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_mem_alloc_ex: out of memory");
    }
    a->allocs[a->nallocs++] = (kvli_alloc_t){++a->next_alloc_id, p, len, -1, bk, ah};
    pthread_mutex_unlock(&a->lock);
    kvli_log(KVL_LOG_INFO, "core", "agent '%s': %zu bytes at %p allocated by backend %s (%s)",
             a->name, len, p, name, detail);
    *ptr_p = p;
    return KVL_OK;
}

/* Under the agent lock. */
static void kvli_alloc_release(kvli_alloc_t *al)
{
    if (al->bk != NULL) {
        al->bk->ops->mem_free(al->bk->bk, al->ah);
    } else {
        munmap(al->ptr, al->len);
        close(al->fd);
    }
}

kvl_status_t kvl_mem_free(kvl_agent_t *a, void *ptr)
{
    kvl_error_t err;
    if (a == NULL || ptr == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_mem_free: agent or ptr is NULL");
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->nallocs; i++) {
        kvli_alloc_t *al = &a->allocs[i];
        if (al->ptr != ptr)
            continue;
        uint64_t base = (uint64_t)(uintptr_t)al->ptr;
        for (size_t j = 0; j < a->nregs; j++) {
            kvli_region_t *r = a->regs[j];
            if (r->addr < base + al->len && base < r->addr + r->len) {
                kvli_err(&err, KVL_ERR_IN_USE, 0,
                         "kvl_mem_free: allocation %p still has registered region 0x%llx+%llu",
                         ptr, (unsigned long long)r->addr, (unsigned long long)r->len);
                kvli_hint(&err, "deregister its regions first");
                pthread_mutex_unlock(&a->lock);
                return kvli_fail(a, &err);
            }
        }
        kvli_alloc_release(al);
        a->allocs[i] = a->allocs[--a->nallocs];
        pthread_mutex_unlock(&a->lock);
        return KVL_OK;
    }
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    for (size_t i = 0; i < a->nallocs; i++) {
        uint64_t base = (uint64_t)(uintptr_t)a->allocs[i].ptr;
        if (p > base && p - base < a->allocs[i].len) {
            kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "kvl_mem_free: %p lies inside allocation %p "
                     "(%zu bytes) but is not its start", ptr, a->allocs[i].ptr,
                     a->allocs[i].len);
            kvli_hint(&err, "pass the pointer kvl_mem_alloc/kvl_mem_alloc_ex returned");
            pthread_mutex_unlock(&a->lock);
            return kvli_fail(a, &err);
        }
    }
    pthread_mutex_unlock(&a->lock);
    kvli_err(&err, KVL_ERR_NOT_FOUND, 0, "kvl_mem_free: %p was not returned by kvl_mem_alloc or "
             "kvl_mem_alloc_ex on agent '%s'", ptr, a->name);
    kvli_hint(&err, "free only memory this agent allocated, once (other memory is the "
              "application's to free)");
    return kvli_fail(a, &err);
}

void kvli_allocs_destroy(kvl_agent_t *a, bool backends)
{
    size_t keep = 0;
    for (size_t i = 0; i < a->nallocs; i++) {
        if ((a->allocs[i].bk != NULL) == backends)
            kvli_alloc_release(&a->allocs[i]);
        else
            a->allocs[keep++] = a->allocs[i];
    }
    a->nallocs = keep;
    if (keep == 0) {
        free(a->allocs);
        a->allocs = NULL;
        a->capallocs = 0;
    }
}


kvl_status_t kvli_ctx_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p, uint64_t *size_p);
kvl_status_t kvli_ctx_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p, uint64_t *size_p)
{
    struct kvl_backend *bk = ctx->core;
    kvl_agent_t *a = bk->agent;
    kvl_status_t st = KVL_ERR_NOT_FOUND;
    bool registered = false;
    pthread_mutex_lock(&a->lock);
    /* Only an allocation in which memory is registered on this backend is
     * handed out: ids are sequential, and an unregistered allocation is not
     * the user's to share. */
    for (size_t i = 0; i < a->nregs && !registered; i++)
        registered = a->regs[i]->shm_id == id && (a->regs[i]->bk_mask & (1u << bk->index));
    for (size_t i = 0; i < a->nallocs && registered; i++) {
        if (a->allocs[i].id == id && a->allocs[i].fd >= 0) {
            *fd_p = a->allocs[i].fd;
            *size_p = a->allocs[i].len;
            st = KVL_OK;
            break;
        }
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}
