/*
 * Shareable allocations (src/core/alloc.c): memfd memory (sealed, zeroed,
 * numbered), the lookup peers' backends use (only for memory registered on
 * that backend), allocations made by a backend, freeing and its refusals,
 * and who frees what when the agent goes.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

/* The core's allocation lookup (alloc.c), lent as ctx->alloc_lookup. */
kvl_status_t kvli_ctx_alloc_lookup(kvl_bk_ctx_t *ctx, uint64_t id, int *fd_p, uint64_t *size_p);

#define HAS(...)                                     \
    do {                                             \
        char want_[512];                             \
        snprintf(want_, sizeof(want_), __VA_ARGS__); \
        KT_ERROR_HAS(want_);                         \
    } while (0)
#define ULL(x) ((unsigned long long)(x))

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM);

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static int mapped(const void *p, size_t len)
{
    return msync((void *)(uintptr_t)p, len, MS_ASYNC) == 0;
}

static void test_memfd(void)
{
    kvl_agent_t *a = bare("memfd");
    void *p = &p, *q;
    KT_STATUS(kvl_mem_alloc(a, 0, &p), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_alloc: agent or ptr_p is NULL, or len is 0");
    KT_STATUS(kvl_mem_alloc(a, 4096, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_alloc(NULL, 4096, &p), KVL_ERR_INVALID_ARG);
    /* more than a file can hold is a bad argument, not a memory shortage */
    KT_STATUS(kvl_mem_alloc(a, SIZE_MAX, &p), KVL_ERR_INVALID_ARG);
    HAS("kvl_mem_alloc: %zu bytes is more than a memfd can hold", SIZE_MAX);
    KT_CHECK(p == NULL);
    KT_STATUS(kvl_mem_alloc(a, (size_t)1 << 63, &p), KVL_ERR_INVALID_ARG);
    KT_CHECK(a->nallocs == 0);

    KT_OK(kvl_mem_alloc(a, 100000, &p));
    KT_OK(kvl_mem_alloc(a, 4096, &q));
    KT_CHECK(a->nallocs == 2 && ((uintptr_t)p & 4095) == 0);
    const kvli_alloc_t *al = &a->allocs[0];
    KT_CHECK(al->ptr == p && al->len == 100000 && al->id == 1 && al->bk == NULL);
    KT_CHECK(a->allocs[1].id == 2 && a->allocs[1].ptr == q);
    /* zeroed, writable, and the memfd behind it cannot shrink */
    const uint8_t *b = p;
    KT_CHECK(b[0] == 0 && b[99999] == 0);
    memset(p, 0x77, 100000);
    KT_CHECK(al->fd >= 0 && (fcntl(al->fd, F_GET_SEALS) & F_SEAL_SHRINK));
    KT_CHECK(fcntl(al->fd, F_GETFD) & FD_CLOEXEC);
    KT_CHECK(ftruncate(al->fd, 4096) != 0 && errno == EPERM);
    uint8_t c;
    KT_CHECK(pread(al->fd, &c, 1, 99999) == 1 && c == 0x77); /* the same pages */

    /* the allocation holding a range: start, end, one past, wrapping */
    pthread_mutex_lock(&a->lock);
    uint64_t base = (uint64_t)(uintptr_t)p;
    KT_CHECK(kvli_alloc_containing(a, base, 100000) == al);
    KT_CHECK(kvli_alloc_containing(a, base + 99999, 1) == al);
    KT_CHECK(kvli_alloc_containing(a, base + 100000, 0) == al);
    KT_CHECK(kvli_alloc_containing(a, base + 99999, 2) == NULL);
    KT_CHECK(kvli_alloc_containing(a, base - 1, 2) == NULL);
    KT_CHECK(kvli_alloc_containing(a, base + 10, UINT64_MAX) == NULL);
    KT_CHECK(kvli_alloc_containing(a, (uint64_t)(uintptr_t)q, 4096) == &a->allocs[1]);
    pthread_mutex_unlock(&a->lock);

    KT_OK(kvl_mem_free(a, p));
    KT_CHECK(a->nallocs == 1 && a->allocs[0].ptr == q && !mapped(p, 4096));
    kvl_agent_destroy(a); /* frees q */
    KT_CHECK(!mapped(q, 4096));
}

static void test_lookup(void)
{
    kvl_agent_t *a = bare("lookup");
    kt_stub_t s1, s2;
    kvl_backend_t *b1 = kt_stub_attach(a, &s1, "s1", DRAM, DRAM, 0);
    kvl_backend_t *b2 = kt_stub_attach(a, &s2, "s2", DRAM, DRAM, 0);
    void *p;
    int fd = -1;
    uint64_t size = 0;
    KT_OK(kvl_mem_alloc(a, 1 << 16, &p));
    uint64_t id = a->allocs[0].id;
    /* nothing registered in it yet: not handed out */
    KT_CHECK(kvli_ctx_alloc_lookup(&b1->ctx, id, &fd, &size) == KVL_ERR_NOT_FOUND);

    const char *only[] = {"s1"};
    kvl_reg_params_t on_s1 = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = only,
                              .n_backends = 1};
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)p + 4096, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, &on_s1, NULL));
    pthread_mutex_lock(&a->lock);
    KT_CHECK(kvli_registry_exact(a, d.addr, d.len)->shm_id == id);
    pthread_mutex_unlock(&a->lock);
    KT_OK(kvli_ctx_alloc_lookup(&b1->ctx, id, &fd, &size));
    KT_CHECK(fd == a->allocs[0].fd && size == 1 << 16);
    /* registered on s1 only; and ids are not guessable into other memory */
    KT_CHECK(kvli_ctx_alloc_lookup(&b2->ctx, id, &fd, &size) == KVL_ERR_NOT_FOUND);
    KT_CHECK(kvli_ctx_alloc_lookup(&b1->ctx, id + 1, &fd, &size) == KVL_ERR_NOT_FOUND);
    KT_CHECK(kvli_ctx_alloc_lookup(&b1->ctx, 0, &fd, &size) == KVL_ERR_NOT_FOUND);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_CHECK(kvli_ctx_alloc_lookup(&b1->ctx, id, &fd, &size) == KVL_ERR_NOT_FOUND);
    kvl_agent_destroy(a);
}

static void test_free(void)
{
    kvl_agent_t *a = bare("freer");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    uint8_t *p, *q;
    KT_OK(kvl_mem_alloc(a, 1 << 16, (void **)&p));
    KT_OK(kvl_mem_alloc(a, 1 << 16, (void **)&q));

    KT_STATUS(kvl_mem_free(a, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_free: agent or ptr is NULL");
    KT_STATUS(kvl_mem_free(NULL, p), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_free(a, p + 100), KVL_ERR_NOT_FOUND);
    HAS("kvl_mem_free: %p lies inside allocation %p (65536 bytes) but is not its start",
        (void *)(p + 100), (void *)p);
    KT_ERROR_HAS("fix: pass the pointer kvl_mem_alloc/kvl_mem_alloc_ex returned");
    int local;
    KT_STATUS(kvl_mem_free(a, &local), KVL_ERR_NOT_FOUND);
    HAS("kvl_mem_free: %p was not returned by kvl_mem_alloc or kvl_mem_alloc_ex on agent 'freer'",
        (void *)&local);

    /* a registered region inside (or reaching into) it keeps it */
    kvl_mem_desc_t in = {(uint64_t)(uintptr_t)p + 8192, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &in, 1, NULL, NULL));
    KT_STATUS(kvl_mem_free(a, p), KVL_ERR_IN_USE);
    HAS("kvl_mem_free: allocation %p still has registered region 0x%llx+4096", (void *)p,
        ULL(in.addr));
    KT_ERROR_HAS("fix: deregister its regions first");
    KT_CHECK(mapped(p, 1 << 16));
    KT_OK(kvl_mem_deregister(a, &in, 1));

    /* a region reaching into q from past its end holds it; one that starts
     * exactly at its end does not (the page after q: p, or mapped here) */
    uint8_t *next = q + (1 << 16), *m = NULL;
    if (!mapped(next, 4096)) {
        m = mmap(next, 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        KT_CHECK(m == next);
    }
    kvl_mem_desc_t across = {(uint64_t)(uintptr_t)next - 4096, 8192, KVL_DEV_ANY};
    kvl_mem_desc_t after = {(uint64_t)(uintptr_t)next, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &across, 1, NULL, NULL));
    KT_STATUS(kvl_mem_free(a, q), KVL_ERR_IN_USE);
    KT_OK(kvl_mem_deregister(a, &across, 1));
    KT_OK(kvl_mem_register(a, &after, 1, NULL, NULL));
    KT_OK(kvl_mem_free(a, q));
    KT_OK(kvl_mem_deregister(a, &after, 1));
    if (m != NULL)
        munmap(m, 4096);
    KT_OK(kvl_mem_free(a, p));
    KT_STATUS(kvl_mem_free(a, p), KVL_ERR_NOT_FOUND); /* twice */
    KT_CHECK(a->nallocs == 0);
    kvl_agent_destroy(a);
}

/* ---- allocations made by a backend ---- */

static kt_stub_t g_s;
static unsigned g_allocs, g_frees;
static kvl_status_t g_alloc_status;

static kvl_status_t stub_alloc(void *bk, size_t len, void **ptr_p, void **ah_p, char *detail,
                               size_t detail_len, kvl_error_t *err)
{
    KT_CHECK(bk == &g_s);
    if (g_alloc_status != KVL_OK) {
        if (g_alloc_status == KVL_ERR_NO_DEVICE) /* say nothing: the core must */
            return g_alloc_status;
        kvl_bk_error_set(err, g_alloc_status, ENOSPC, "", -1, "segment of %zu bytes refused", len);
        return g_alloc_status;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(p != MAP_FAILED);
    size_t *ah = malloc(sizeof(*ah));
    *ah = len;
    *ptr_p = p;
    *ah_p = ah;
    snprintf(detail, detail_len, "stub segment");
    g_allocs++;
    return KVL_OK;
}

static void stub_free(void *bk, void *ah)
{
    KT_CHECK(bk == &g_s && g_s.closes == 0); /* always before the backend closes */
    g_frees++;
    free(ah);
}

static void test_backend_alloc(void)
{
    kvl_agent_t *a = bare("bkalloc");
    kt_stub_attach(a, &g_s, "s1", DRAM, DRAM, 0);
    kvl_alloc_params_t ap = {.field_mask = KVL_ALLOC_PARAM_BACKEND, .backend = "s1"};
    void *p = &p;

    /* no backend named: memfd memory, as kvl_mem_alloc */
    KT_OK(kvl_mem_alloc_ex(a, 4096, NULL, &p));
    KT_CHECK(a->allocs[0].fd >= 0);
    kvl_alloc_params_t unset = {.field_mask = 0, .backend = "s1"};
    KT_OK(kvl_mem_alloc_ex(a, 4096, &unset, &p));
    kvl_alloc_params_t empty = {.field_mask = KVL_ALLOC_PARAM_BACKEND, .backend = ""};
    KT_OK(kvl_mem_alloc_ex(a, 4096, &empty, &p));
    KT_CHECK(a->nallocs == 3 && a->allocs[2].fd >= 0);

    kvl_alloc_params_t nope = {.field_mask = KVL_ALLOC_PARAM_BACKEND, .backend = "nope"};
    KT_STATUS(kvl_mem_alloc_ex(a, 4096, &nope, &p), KVL_ERR_NOT_FOUND);
    KT_CHECK(p == NULL);
    KT_ERROR_HAS("kvl_mem_alloc_ex: backend 'nope' is not created on agent 'bkalloc'");
    KT_CHECK(strcmp(kvl_last_error()->backend, "nope") == 0);
    KT_STATUS(kvl_mem_alloc_ex(a, 0, &ap, &p), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_alloc_ex: agent or ptr_p is NULL, or len is 0");
    KT_STATUS(kvl_mem_alloc_ex(a, 4096, &ap, &p), KVL_ERR_UNSUPPORTED);
    KT_ERROR_HAS("kvl_mem_alloc_ex: backend 's1' does not allocate memory");

    g_s.ops.mem_alloc = stub_alloc;
    g_s.ops.mem_free = stub_free;
    g_alloc_status = KVL_ERR_NO_MEMORY;
    KT_STATUS(kvl_mem_alloc_ex(a, 4096, &ap, &p), KVL_ERR_NO_MEMORY);
    KT_ERROR_HAS("segment of 4096 bytes refused");
    KT_CHECK(strcmp(kvl_last_error()->backend, "s1") == 0 && kvl_last_error()->sys_errno == ENOSPC);
    g_alloc_status = KVL_ERR_NO_DEVICE;
    KT_STATUS(kvl_mem_alloc_ex(a, 4096, &ap, &p), KVL_ERR_NO_DEVICE);
    KT_ERROR_HAS("KVL_ERR_NO_DEVICE: mem_alloc failed");
    KT_CHECK(a->nallocs == 3 && g_allocs == 0);

    g_alloc_status = KVL_OK;
    void *bp, *bq;
    KT_OK(kvl_mem_alloc_ex(a, 1 << 16, &ap, &bp));
    KT_OK(kvl_mem_alloc_ex(a, 1 << 16, &ap, &bq));
    const kvli_alloc_t *al = &a->allocs[3];
    KT_CHECK(al->ptr == bp && al->fd == -1 && al->bk == g_s.bk && al->id == 4);
    /* a backend's allocation is that backend's business: no memfd to hand out */
    pthread_mutex_lock(&a->lock);
    KT_CHECK(kvli_alloc_containing(a, (uint64_t)(uintptr_t)bp, 64) == NULL);
    pthread_mutex_unlock(&a->lock);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)bp, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    KT_STATUS(kvl_mem_free(a, bp), KVL_ERR_IN_USE);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_OK(kvl_mem_free(a, bp));
    KT_CHECK(g_frees == 1);
    munmap(bp, 1 << 16);

    /* destroy: bq goes back to the backend before it closes (stub_free checks) */
    kvl_agent_destroy(a);
    KT_CHECK(g_allocs == 2 && g_frees == 2 && g_s.closes == 1);
    munmap(bq, 1 << 16);
}

int main(void)
{
    test_memfd();
    test_lookup();
    test_free();
    test_backend_alloc();
    printf("test_alloc: passed\n");
    return 0;
}
