/*
 * Prepared lists (src/core/prep.c): every entry checked once against local
 * registrations or a remote agent's regions; the region table it keeps
 * (deduplicated, indices per entry, references), the uniform flag and the
 * table indexed transfers use; each refusal with the descriptor, the nearest
 * region and where the entry lies relative to it.
 */
#include <string.h>
#include <sys/mman.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

#define HAS(...)                                     \
    do {                                             \
        char want_[512];                             \
        snprintf(want_, sizeof(want_), __VA_ARGS__); \
        KT_ERROR_HAS(want_);                         \
    } while (0)
#define ULL(x) ((unsigned long long)(x))
#define KiB 1024ull

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM);
static uint64_t B; /* 1 MiB mapped */

static kvl_agent_t *agent(const char *name, kt_stub_t *s)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    kt_stub_attach(a, s, "s1", DRAM | KVL_MEM_BIT(KVL_MEM_VRAM), DRAM | KVL_MEM_BIT(KVL_MEM_VRAM),
                   0);
    return a;
}

static void reg(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    kvl_mem_desc_t d = {addr, len, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
}

static kvli_region_t *region_at(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    pthread_mutex_lock(&a->lock);
    kvli_region_t *r = kvli_registry_exact(a, addr, len);
    pthread_mutex_unlock(&a->lock);
    KT_CHECK(r != NULL);
    return r;
}

static kvl_dlist_t *list(kvl_mem_kind_t kind)
{
    kvl_dlist_t *dl;
    KT_OK(kvl_dlist_create(kind, 0, &dl));
    return dl;
}

static void test_local(void)
{
    kt_stub_t s;
    kvl_agent_t *a = agent("preparer", &s);
    reg(a, B, 64 * KiB);
    reg(a, B + 128 * KiB, 64 * KiB);
    kvli_region_t *r0 = region_at(a, B, 64 * KiB), *r1 = region_at(a, B + 128 * KiB, 64 * KiB);
    kvl_dlist_t *dl = list(KVL_MEM_DRAM);
    KT_OK(kvl_dlist_add(dl, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(dl, B + 64 * KiB - 64, 64, 0)); /* the last bytes of r0 */
    KT_OK(kvl_dlist_add(dl, B + 128 * KiB, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(dl, B + 130 * KiB, 4096, 4, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(dl, B + 4096, 64, KVL_DEV_ANY));
    kvl_prep_t *p;
    KT_OK(kvl_prep_local(a, dl, &p));
    KT_CHECK(kvl_prep_entries(p) == 5 && p->n == 5 && !p->remote && p->rem == NULL);
    KT_CHECK(p->agent == a && p->kind == KVL_MEM_DRAM && a->preps == p);
    KT_CHECK(p->nregs == 2 && p->regs[0] == r0 && p->regs[1] == r1);
    static const uint32_t want_reg[5] = {0, 0, 1, 1, 0};
    for (int i = 0; i < 5; i++)
        KT_CHECK(p->ents[i].reg == want_reg[i]);
    KT_CHECK(p->ents[3].addr == B + 130 * KiB && p->ents[3].stride == 4096);
    KT_CHECK(p->ents[3].count == 4 && p->ents[3].len == 64 && p->ents[0].stride == 0);
    KT_CHECK(!p->uniform); /* one entry is strided */
    /* one reference per region, whatever the number of entries in it */
    KT_CHECK(atomic_load(&r0->objref) == 2 && atomic_load(&r1->objref) == 2);

    /* the list it was made from can change or go: the prep keeps its copy */
    kvl_dlist_clear(dl);
    kvl_dlist_destroy(dl);
    KT_CHECK(p->ents[4].addr == B + 4096);

    /* deregistered memory stays referenced (not pinned) by the prep */
    kvl_mem_desc_t d1 = {B + 128 * KiB, 64 * KiB, KVL_DEV_ANY};
    KT_OK(kvl_mem_deregister(a, &d1, 1));
    KT_CHECK(!atomic_load(&r1->valid) && atomic_load(&r1->objref) == 1 && s.deregs == 1);
    kvl_prep_release(p); /* frees r1 too */
    KT_CHECK(a->preps == NULL && atomic_load(&r0->objref) == 1);
    kvl_prep_release(NULL);
    KT_CHECK(kvl_prep_entries(NULL) == 0);

    /* an empty list prepares to an empty prep */
    dl = list(KVL_MEM_DRAM);
    KT_OK(kvl_prep_local(a, dl, &p));
    KT_CHECK(kvl_prep_entries(p) == 0 && p->nregs == 0 && !p->uniform);
    kvl_prep_release(p);

    KT_STATUS(kvl_prep_local(a, NULL, &p), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_prep: NULL argument");
    KT_CHECK(p == NULL);
    KT_STATUS(kvl_prep_local(a, dl, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_prep_local(NULL, dl, &p), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_prep_remote(a, NULL, dl, &p), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_prep_remote: remote is NULL");
    KT_STATUS(kvl_prep_remote(a, "nobody", dl, &p), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("remote agent 'nobody' is not loaded on agent 'preparer'");
    kvl_dlist_destroy(dl);

    /* left alive: freed with the agent */
    dl = list(KVL_MEM_DRAM);
    KT_OK(kvl_dlist_add(dl, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, dl, &p));
    KT_OK(kvl_prep_local(a, dl, &p));
    kvl_dlist_destroy(dl);
    kvl_agent_destroy(a);
}

/* Uniform lists (every entry one block of one length) and their table. */
static void test_uniform_and_table(void)
{
    kt_stub_t s;
    kvl_agent_t *a = agent("tables", &s);
    const int nr = 100; /* regions: past the first growths of the region map */
    for (int i = 0; i < nr; i++)
        reg(a, B + (uint64_t)i * 8 * KiB, 4 * KiB);
    kvl_dlist_t *dl = list(KVL_MEM_DRAM);
    for (int i = 0; i < 3 * nr; i++) /* regions in an order of their own */
        KT_OK(kvl_dlist_add(dl, B + (uint64_t)((i * 37) % nr) * 8 * KiB + (uint64_t)(i % 3) * 128, 128,
                            KVL_DEV_ANY));
    kvl_prep_t *p, *q;
    KT_OK(kvl_prep_local(a, dl, &p));
    KT_CHECK(p->uniform && p->ulen == 128 && p->nregs == (size_t)nr);
    for (int i = 0; i < 3 * nr; i++) {
        const kvli_region_t *r = p->regs[p->ents[i].reg];
        KT_CHECK(r->addr == B + (uint64_t)((i * 37) % nr) * 8 * KiB);
    }
    for (int i = 0; i < nr; i++) /* regions listed in order of first use */
        KT_CHECK(((const kvli_region_t *)p->regs[i])->addr == B + (uint64_t)((i * 37) % nr) * 8 * KiB);

    const kvl_bk_ptab_t *t = kvli_prep_tab(p);
    KT_CHECK(t != NULL && t->n == (size_t)(3 * nr) && t->len == 128 && t->nregs == (size_t)nr);
    KT_CHECK(t->id != 0);
    for (int i = 0; i < 3 * nr; i++)
        KT_CHECK(t->addrs[i] == p->ents[i].addr && t->regs[i] == p->ents[i].reg);
    KT_CHECK(kvli_prep_tab(p) == t && t->id == p->tab.id); /* made once */
    KT_OK(kvl_prep_local(a, dl, &q));
    KT_CHECK(kvli_prep_tab(q)->id != t->id);
    kvl_prep_release(q);

    /* one length apart, or one strided entry: not uniform */
    KT_OK(kvl_dlist_add(dl, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, dl, &q));
    KT_CHECK(!q->uniform);
    kvl_prep_release(q);
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add_strided(dl, B, 128, 2, 128, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, dl, &q));
    KT_CHECK(!q->uniform);
    kvl_prep_release(q);
    /* references shared by the prep and an indexed transfer */
    kvli_prep_ref(p);
    KT_CHECK(atomic_load(&p->refs) == 2);
    kvl_prep_release(p);
    KT_CHECK(a->preps == NULL && atomic_load(&p->refs) == 1 && p->tab.addrs == t->addrs);
    kvli_prep_unref(p); /* the last */
    kvli_prep_unref(NULL);
    kvl_dlist_destroy(dl);
    kvl_agent_destroy(a);
}

static void test_local_refused(void)
{
    kt_stub_t s;
    kvl_agent_t *a = agent("strict", &s);
    kvl_dlist_t *dl = list(KVL_MEM_DRAM);
    kvl_prep_t *p = (kvl_prep_t *)&p;

    KT_OK(kvl_dlist_add(dl, B, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_local(a, dl, &p), KVL_ERR_OUT_OF_BOUNDS);
    HAS("descriptor 0 (0x%llx+64) is outside memory this agent ('strict') registered", ULL(B));
    KT_ERROR_HAS("fix: no memory is registered there; register it first");
    KT_CHECK(strstr(kvl_last_error()->hint, "reload") == NULL && p == NULL);
    KT_CHECK(strcmp(kvl_last_error()->region, "descriptor 0") == 0);

    /* a big region with two small ones inside it */
    reg(a, B, 64 * KiB);
    reg(a, B + 8 * KiB, 4 * KiB);
    reg(a, B + 32 * KiB, 4 * KiB);
    kvli_region_t *big = region_at(a, B, 64 * KiB);
    static const struct {
        uint64_t off, len;
        int runs; /* starts inside the nearest region */
        uint64_t n;
    } miss[] = {
        {64 * KiB + 100, 64, 0, 100},
        {16 * KiB, 64 * KiB, 1, 16 * KiB}, /* from inside the big one only */
        {60 * KiB, 8 * KiB, 1, 4 * KiB},
    };
    for (size_t i = 0; i < sizeof(miss) / sizeof(miss[0]); i++) {
        kvl_dlist_clear(dl);
        KT_OK(kvl_dlist_add(dl, B + 4096, 64, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(dl, B + miss[i].off, miss[i].len, KVL_DEV_ANY));
        KT_STATUS(kvl_prep_local(a, dl, &p), KVL_ERR_OUT_OF_BOUNDS);
        HAS("descriptor 1 (0x%llx+%llu) is outside memory this agent ('strict') registered; ",
            ULL(B + miss[i].off), ULL(miss[i].len));
        if (miss[i].runs)
            HAS("; it runs %llu bytes past its end", ULL(miss[i].n));
        else
            HAS("; it starts %llu bytes past its end", ULL(miss[i].n));
        HAS("nearest registered region: 0x%llx+65536; register the memory first, or fix the "
            "address/length", ULL(B));
        KT_CHECK(strcmp(kvl_last_error()->region, "descriptor 1") == 0);
    }
    /* before every region */
    reg(a, B + 512 * KiB, 4 * KiB);
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add(dl, B + 512 * KiB - 10, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_local(a, dl, &p), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("it starts 10 bytes before it");
    /* a strided entry across regions */
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add_strided(dl, B + 56 * KiB, 4 * KiB, 4, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_local(a, dl, &p), KVL_ERR_OUT_OF_BOUNDS);
    HAS("descriptor 0 (strided: base 0x%llx, stride 4096, count 4, len 64; spans 0x%llx..0x%llx) "
        "is not inside one region this agent ('strict') registered; it runs %llu bytes past its "
        "end", ULL(B + 56 * KiB), ULL(B + 56 * KiB), ULL(B + 56 * KiB + 12 * KiB + 64),
        ULL(4 * KiB + 64));
    KT_ERROR_HAS("(split a strided entry that crosses regions)");

    /* kind and device */
    kvl_dlist_t *vl = list(KVL_MEM_VRAM);
    KT_OK(kvl_dlist_add(vl, B + 100, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_local(a, vl, &p), KVL_ERR_DEVICE_MISMATCH);
    HAS("descriptor 0 (0x%llx+64): list is VRAM but the region it lies in (0x%llx+65536) is DRAM",
        ULL(B + 100), ULL(B));
    KT_ERROR_HAS("fix: create the list with the kind the memory was registered as");
    kvl_dlist_destroy(vl);
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add(dl, B + 100, 64, 3));
    KT_STATUS(kvl_prep_local(a, dl, &p), KVL_ERR_DEVICE_MISMATCH);
    HAS("descriptor 0 (0x%llx+64) declares device 3 but lies in DRAM region 0x%llx+65536 of "
        "device 0", ULL(B + 100), ULL(B));
    KT_CHECK(kvl_last_error()->device == 3);
    /* the same region as the entry before: the device is checked all the same */
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add(dl, B + 100, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(dl, B + 200, 64, 0));
    KT_OK(kvl_dlist_add(dl, B + 300, 64, 2));
    KT_STATUS(kvl_prep_local(a, dl, &p), KVL_ERR_DEVICE_MISMATCH);
    HAS("descriptor 2 (0x%llx+64) declares device 2 but its region is on device 0", ULL(B + 300));
    /* nothing held after a refusal */
    KT_CHECK(atomic_load(&big->objref) == 1 && a->preps == NULL);
    kvl_dlist_destroy(dl);
    kvl_agent_destroy(a);
}

static void test_remote(void)
{
    kt_stub_t s;
    kvl_agent_t *a = agent("remoteprep", &s);
    static const kvl_mem_desc_t rd[3] = {{0x100000, 0x10000, 0}, {0x200000, 0x1000, 1},
                                         {0x300000, 0x1000, 0}};
    static const kvl_mem_kind_t kinds[3] = {KVL_MEM_DRAM, KVL_MEM_DRAM, KVL_MEM_VRAM};
    kt_rmd_t rm = {.name = "peer", .incarnation = 5, .start_ns = 1, .generation = 1,
                   .backends = {"s1"}, .n_backends = 1, .regions = rd, .kinds = kinds,
                   .n_regions = 3};
    kt_md_load(a, &rm);
    kvli_remote_t *rem = kvli_remote_find(a, "peer");
    kvl_dlist_t *dl = list(KVL_MEM_DRAM);
    KT_OK(kvl_dlist_add(dl, 0x200010, 64, 1));
    KT_OK(kvl_dlist_add(dl, 0x100000, 0x10000, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(dl, 0x200100, 64, KVL_DEV_ANY));
    kvl_prep_t *p;
    KT_OK(kvl_prep_remote(a, "peer", dl, &p));
    KT_CHECK(p->remote && p->rem == rem && atomic_load(&rem->objref) == 2);
    KT_CHECK(p->nregs == 2 && p->regs[0] == &rem->regions[1] && p->regs[1] == &rem->regions[0]);
    KT_CHECK(p->ents[0].reg == 0 && p->ents[1].reg == 1 && p->ents[2].reg == 0);

    /* the remote removed: the prep keeps what it needs until released */
    KT_OK(kvl_remote_remove(a, "peer"));
    KT_CHECK(s.unpeers == 0 && !atomic_load(&rem->valid));
    kvl_prep_release(p);
    KT_CHECK(s.unpeers == 1 && s.runloads == 3);

    kt_md_load(a, &rm);
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add(dl, 0x300000, 64, KVL_DEV_ANY)); /* VRAM there */
    KT_STATUS(kvl_prep_remote(a, "peer", dl, &p), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("descriptor 0 (0x300000+64): list is DRAM but the region it lies in "
                 "(0x300000+4096) is VRAM");
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add(dl, 0x200000, 64, 0));
    KT_STATUS(kvl_prep_remote(a, "peer", dl, &p), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("declares device 0 but lies in DRAM region 0x200000+4096 of device 1");
    kvl_dlist_clear(dl);
    KT_OK(kvl_dlist_add(dl, 0x200ff0, 32, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_remote(a, "peer", dl, &p), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("descriptor 0 (0x200ff0+32) is outside memory remote agent 'peer' registered; "
                 "it runs 16 bytes past its end");
    KT_ERROR_HAS("nearest registered region: 0x200000+4096");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    rem = kvli_remote_find(a, "peer");
    KT_CHECK(atomic_load(&rem->objref) == 1); /* no reference kept by a refusal */

    /* a remote with no regions at all */
    kt_rmd_t empty = {.name = "bare", .incarnation = 6, .start_ns = 1, .generation = 1,
                      .backends = {"s1"}, .n_backends = 1};
    kt_md_load(a, &empty);
    KT_STATUS(kvl_prep_remote(a, "bare", dl, &p), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("fix: no memory is registered there; register it first and reload the remote "
                 "agent's metadata");
    kvl_dlist_destroy(dl);
    kvl_agent_destroy(a);
}

int main(void)
{
    uint8_t *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(m != MAP_FAILED);
    B = (uint64_t)(uintptr_t)m;
    test_local();
    test_uniform_and_table();
    test_local_refused();
    test_remote();
    munmap(m, 1 << 20);
    printf("test_prep: passed\n");
    return 0;
}
