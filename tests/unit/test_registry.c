/*
 * The registry (src/core/registry.c): the sorted array of regions and its
 * lookups, checked against brute force over overlapping regions (a lookup
 * must find a region that contains the range whenever one does; "nearest"
 * must be a nearest one); the lookup cache across removals; kvl_mem_query;
 * and the target-side pins backends take.
 */
#include <string.h>
#include <sys/mman.h>
#include "common/kvltest.h"
#include "core/internal.h"

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static kvli_region_t *mk(uint64_t addr, uint64_t len)
{
    kvli_region_t *r = calloc(1, sizeof(*r));
    KT_CHECK(r != NULL);
    r->addr = addr;
    r->len = len;
    r->kind = KVL_MEM_DRAM;
    r->refcount = 1;
    atomic_init(&r->objref, 1);
    atomic_init(&r->valid, true);
    return r;
}

static int contains(const kvli_region_t *r, uint64_t addr, uint64_t len)
{
    return addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr);
}

static int overlaps(const kvli_region_t *r, uint64_t addr, uint64_t len)
{
    return r->len > 0 && r->addr < addr + len && r->addr + r->len > addr &&
           !(r->addr == addr && r->len == len);
}

static uint64_t dist(const kvli_region_t *r, uint64_t addr)
{
    if (addr < r->addr)
        return r->addr - addr;
    return addr - r->addr < r->len ? 0 : addr - r->addr - r->len + 1;
}

static uint64_t g_seed = 12345;
static uint64_t rnd(uint64_t n)
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (g_seed >> 33) % n;
}

/* Every lookup over [lo, hi) agrees with brute force. */
static void sweep(kvl_agent_t *a, uint64_t lo, uint64_t hi, int queries)
{
    for (int q = 0; q < queries; q++) {
        uint64_t addr = lo + rnd(hi - lo), len = 1 + rnd(q % 4 ? 0x200 : 0x4000);
        kvli_region_t *any = NULL;
        uint64_t bestd = UINT64_MAX;
        for (size_t i = 0; i < a->nregs; i++) {
            if (contains(a->regs[i], addr, len))
                any = a->regs[i];
            if (dist(a->regs[i], addr) < bestd)
                bestd = dist(a->regs[i], addr);
        }
        kvli_region_t *f = kvli_registry_find(a, addr, len);
        if ((f == NULL) != (any == NULL) || (f && !contains(f, addr, len))) {
            fprintf(stderr, "find(0x%llx, %llu) = %p, brute force %p\n", (unsigned long long)addr,
                    (unsigned long long)len, (void *)f, (void *)any);
            KT_CHECK(0);
        }
        /* overlap: any region sharing a byte, other than the same (addr, len) */
        int ov_any = 0;
        for (size_t i = 0; i < a->nregs && !ov_any; i++)
            ov_any = overlaps(a->regs[i], addr, len);
        kvli_region_t *o = kvli_registry_overlap(a, addr, len);
        if ((o != NULL) != ov_any || (o && !overlaps(o, addr, len))) {
            fprintf(stderr, "overlap(0x%llx, %llu) = %p, brute force %d\n",
                    (unsigned long long)addr, (unsigned long long)len, (void *)o, ov_any);
            KT_CHECK(0);
        }
        kvli_region_t *n = kvli_registry_nearest(a, addr);
        if (n == NULL || dist(n, addr) != bestd) {
            fprintf(stderr, "nearest(0x%llx) = 0x%llx+%llu at %llu; a region at %llu exists\n",
                    (unsigned long long)addr, n ? (unsigned long long)n->addr : 0,
                    n ? (unsigned long long)n->len : 0, n ? (unsigned long long)dist(n, addr) : 0,
                    (unsigned long long)bestd);
            KT_CHECK(0);
        }
    }
}

static void test_sorted_array(void)
{
    kvl_agent_t *a = bare("sorted");
    kvl_error_t err;
    pthread_mutex_lock(&a->lock); /* the registry's functions run under it */
    KT_CHECK(kvli_registry_find(a, 0x1000, 1) == NULL && kvli_registry_nearest(a, 0x1000) == NULL);

    /* a big region holding small ones, regions sharing a start, nested and
     * disjoint ones; inserted out of order, past the first growth */
    KT_OK(kvli_registry_insert(a, mk(0x10000, 0x10000), &err));
    KT_OK(kvli_registry_insert(a, mk(0x12000, 0x100), &err));
    KT_OK(kvli_registry_insert(a, mk(0x11000, 0x100), &err));
    KT_OK(kvli_registry_insert(a, mk(0x11000, 0x80), &err));
    KT_OK(kvli_registry_insert(a, mk(0x11000, 0x2000), &err));
    KT_OK(kvli_registry_insert(a, mk(0x18000, 0x100), &err));
    for (int i = 0; i < 120; i++)
        KT_OK(kvli_registry_insert(a, mk(0x40000 + rnd(0x40000), 1 + rnd(0x3000)), &err));
    KT_OK(kvli_registry_insert(a, mk(0x30000, 0x400), &err));
    KT_CHECK(a->nregs == 127 && a->capregs >= 127 && a->max_len == 0x10000);
    for (size_t i = 1; i < a->nregs; i++) {
        const kvli_region_t *p = a->regs[i - 1], *r = a->regs[i];
        KT_CHECK(p->addr < r->addr || (p->addr == r->addr && p->len <= r->len));
    }
    /* exact: address and length */
    kvli_region_t *e = kvli_registry_exact(a, 0x11000, 0x100);
    KT_CHECK(e != NULL && e->addr == 0x11000 && e->len == 0x100);
    KT_CHECK(kvli_registry_exact(a, 0x11000, 0x101) == NULL);
    KT_CHECK(kvli_registry_exact(a, 0x11001, 0x100) == NULL);

    /* containment: inside a small region, across its end (only the big one
     * holds it), past everything */
    kvli_region_t *f = kvli_registry_find(a, 0x12010, 0x10);
    KT_CHECK(f && contains(f, 0x12010, 0x10));
    f = kvli_registry_find(a, 0x12ff0, 0x20);
    KT_CHECK(f && f->addr == 0x10000 && f->len == 0x10000);
    KT_CHECK(kvli_registry_find(a, 0x1fff0, 0x10) == f);  /* up to the last byte */
    KT_CHECK(kvli_registry_find(a, 0x1fff0, 0x11) == NULL); /* one past */
    KT_CHECK(kvli_registry_find(a, 0x30000, 0x401) == NULL);
    KT_CHECK(kvli_registry_find(a, 0x0fff, 2) == NULL);

    /* nearest: before all, in a gap, inside a region that overlaps others */
    KT_CHECK(kvli_registry_nearest(a, 0x100)->addr == 0x10000);
    kvli_region_t *n = kvli_registry_nearest(a, 0x30500);
    KT_CHECK(n->addr == 0x30000 && n->len == 0x400);
    n = kvli_registry_nearest(a, 0x17000); /* inside the big one only */
    KT_CHECK(dist(n, 0x17000) == 0);
    sweep(a, 0x8000, 0x90000, 20000);
    pthread_mutex_unlock(&a->lock);
    kvl_agent_destroy(a); /* frees what is left */
}

/* A removed region leaves the lookup cache; lookups then find another one. */
static void test_remove(void)
{
    kvl_agent_t *a = bare("removing");
    kvl_error_t err;
    kvli_region_t *big = mk(0x10000, 0x10000), *small = mk(0x11000, 0x100);
    pthread_mutex_lock(&a->lock);
    KT_OK(kvli_registry_insert(a, big, &err));
    KT_OK(kvli_registry_insert(a, small, &err));
    KT_CHECK(kvli_registry_find(a, 0x11000, 0x100) == small && a->last_hit == small);
    kvli_registry_remove(a, small);
    KT_CHECK(a->nregs == 1 && a->last_hit == NULL);
    kvli_region_put(small);
    KT_CHECK(kvli_registry_find(a, 0x11000, 0x100) == big);
    KT_CHECK(kvli_registry_exact(a, 0x11000, 0x100) == NULL);
    /* removing what is not there changes nothing */
    kvli_region_t *stray = mk(0x10000, 0x10000);
    kvli_registry_remove(a, stray);
    KT_CHECK(a->nregs == 1 && a->regs[0] == big && a->last_hit == big);
    /* references: the registry's, plus one per user */
    kvli_region_get(stray);
    KT_CHECK(atomic_load(&stray->objref) == 2);
    kvli_region_put(stray);
    kvli_region_put(stray); /* the last: freed */

    /* removals keep the lookups right: one big region far before many small
     * ones (a walk bounded by the longest region would pass them all), then
     * the big one removed, then every other small one marked invalid */
    for (int i = 0; i < 300; i++)
        KT_OK(kvli_registry_insert(a, mk(0x100000 + (uint64_t)i * 0x1000, 0x800), &err));
    kvli_region_t *huge = mk(0x80000, 0x400000);
    KT_OK(kvli_registry_insert(a, huge, &err));
    sweep(a, 0x8000, 0x500000, 5000);
    kvli_registry_remove(a, huge);
    kvli_region_put(huge);
    sweep(a, 0x8000, 0x500000, 5000);
    for (size_t i = 0; i < a->nregs; i += 2)
        if (a->regs[i] != big)
            atomic_store(&a->regs[i]->valid, false);
    kvli_region_t **gone = calloc(a->nregs, sizeof(*gone));
    size_t ngone = 0;
    for (size_t i = 0; i < a->nregs; i++)
        if (!atomic_load(&a->regs[i]->valid))
            gone[ngone++] = a->regs[i];
    kvli_registry_remove_invalid(a);
    for (size_t i = 0; i < ngone; i++)
        kvli_region_put(gone[i]);
    free(gone);
    sweep(a, 0x8000, 0x500000, 5000);
    pthread_mutex_unlock(&a->lock);
    kvl_agent_destroy(a);
}

/* ---- through the API, with real backends ---- */

static void test_query(void)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = "shm,tcp"};
    kvl_agent_t *a;
    kvl_mem_info_t info;
    KT_OK(kvl_agent_create("querier", &cfg, &a));
    uint8_t *buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t b = (uint64_t)(uintptr_t)buf;
    kvl_mem_desc_t whole = {b, 1 << 20, KVL_DEV_ANY}, inner = {b + 4096, 4096, KVL_DEV_ANY};
    const char *tcp_only[] = {"tcp"};
    kvl_reg_params_t on_tcp = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = tcp_only,
                               .n_backends = 1};
    KT_OK(kvl_mem_register(a, &whole, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &inner, 1, &on_tcp, NULL));
    KT_OK(kvl_mem_register(a, &inner, 1, NULL, NULL)); /* again: a reference */

    KT_OK(kvl_mem_query(a, b + 4096 + 16, 64, &info));
    KT_CHECK(info.addr <= b + 4096 + 16 && b + 4096 + 16 + 64 <= info.addr + info.len);
    KT_OK(kvl_mem_query(a, b + 4096, 4096, &info));
    if (info.len == 4096) /* the inner region answered */
        KT_CHECK(info.refcount == 2 && strcmp(info.backends, "tcp") == 0);
    KT_OK(kvl_mem_query(a, b + 8000, 200, &info)); /* across the inner one's end */
    KT_CHECK(info.addr == b && info.len == 1 << 20 && info.refcount == 1);
    KT_CHECK(info.kind == KVL_MEM_DRAM && info.dev == 0 && strcmp(info.backends, "shm,tcp") == 0);

    KT_STATUS(kvl_mem_query(a, b + (1 << 20) - 8, 16, &info), KVL_ERR_NOT_FOUND);
    char want[160];
    snprintf(want, sizeof(want), "kvl_mem_query: no registered region of agent 'querier' "
             "contains [0x%llx, +16)", (unsigned long long)(b + (1 << 20) - 8));
    KT_ERROR_HAS(want);
    KT_STATUS(kvl_mem_query(a, b, 0, &info), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("an empty or wrapping range");
    KT_STATUS(kvl_mem_query(a, UINT64_MAX - 3, 4, &info), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_query(a, b, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_query(NULL, b, 1, &info), KVL_ERR_INVALID_ARG);

    /* drop the inner region while it is the cached hit: lookups move on */
    KT_OK(kvl_mem_query(a, b + 4096, 4096, &info));
    KT_OK(kvl_mem_deregister(a, &inner, 1));
    KT_OK(kvl_mem_deregister(a, &inner, 1));
    KT_OK(kvl_mem_query(a, b + 4096, 4096, &info));
    KT_CHECK(info.addr == b && info.len == 1 << 20);
    kvl_agent_destroy(a);
    munmap(buf, 1 << 20);
}

/* What a backend serving a peer's request asks: is this range registered on
 * me, and keep it so while I use it. */
static void test_pins(void)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = "shm,tcp"};
    kvl_agent_t *a;
    kvl_backend_t *bks[2];
    kvl_error_t err;
    void *mh, *pin;
    KT_OK(kvl_agent_create("target", &cfg, &a));
    KT_CHECK(kvl_agent_backends(a, bks, 2) == 2);
    kvl_bk_ctx_t *shm = &bks[0]->ctx;
    uint8_t *buf = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t b = (uint64_t)(uintptr_t)buf;

    /* nothing registered: refused, no nearest region to name */
    memset(&err, 0, sizeof(err));
    KT_CHECK(shm->region_pin(shm, b, 64, &mh, &pin, &err) == KVL_ERR_OUT_OF_BOUNDS);
    KT_CHECK(err.code == KVL_ERR_OUT_OF_BOUNDS && err.hint[0] == '\0');

    kvl_mem_desc_t d = {b, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    pthread_mutex_lock(&a->lock);
    kvli_region_t *r = kvli_registry_exact(a, b, 4096);
    pthread_mutex_unlock(&a->lock);
    KT_CHECK(r != NULL);

    KT_OK(shm->region_pin(shm, b + 100, 200, &mh, &pin, &err));
    KT_CHECK(pin == r && mh == r->mh[0] && atomic_load(&r->pins) == 1);
    KT_CHECK(atomic_load(&r->objref) == 2);
    /* pinned: cannot go away */
    KT_STATUS(kvl_mem_deregister(a, &d, 1), KVL_ERR_IN_USE);
    KT_ERROR_HAS("is in use by 1 pin(s): a peer's request being served");
    shm->region_unpin(shm, pin);
    KT_CHECK(atomic_load(&r->pins) == 0 && atomic_load(&r->objref) == 1);

    /* outside: the request and the nearest region */
    char want[200];
    KT_CHECK(shm->region_pin(shm, b + 4000, 200, &mh, &pin, &err) == KVL_ERR_OUT_OF_BOUNDS);
    snprintf(want, sizeof(want), "request for 0x%llx+200 lies outside memory agent 'target' "
             "registered on backend shm", (unsigned long long)(b + 4000));
    KT_CHECK(strcmp(err.what, want) == 0 && strcmp(err.backend, "shm") == 0);
    snprintf(want, sizeof(want), "nearest registered region: 0x%llx+4096;",
             (unsigned long long)b);
    KT_CHECK(strstr(err.hint, want) == err.hint);
    KT_CHECK(shm->region_pin(shm, b, 0, &mh, &pin, &err) == KVL_ERR_OUT_OF_BOUNDS);
    KT_CHECK(shm->region_pin(shm, UINT64_MAX - 1, 4, &mh, &pin, &err) == KVL_ERR_OUT_OF_BOUNDS);

    /* registered, but only on another backend */
    const char *tcp_only[] = {"tcp"};
    kvl_reg_params_t on_tcp = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = tcp_only,
                               .n_backends = 1};
    kvl_mem_desc_t t = {b + 8192, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &t, 1, &on_tcp, NULL));
    KT_CHECK(shm->region_pin(shm, b + 8192, 64, &mh, &pin, &err) == KVL_ERR_OUT_OF_BOUNDS);
    KT_CHECK(strstr(err.what, "on backend shm (registered, but not on this backend)") != NULL);
    kvl_bk_ctx_t *tcp = &bks[1]->ctx;
    KT_OK(tcp->region_pin(tcp, b + 8192, 64, &mh, &pin, &err));
    tcp->region_unpin(tcp, pin);
    kvl_agent_destroy(a);
    munmap(buf, 1 << 16);
}

int main(void)
{
    test_sorted_array();
    test_remove();
    test_query();
    test_pins();
    printf("test_registry: passed\n");
    return 0;
}
