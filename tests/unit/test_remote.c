/*
 * Remote agents (src/core/remote.c), against stub backends: loading
 * metadata (sorting, staleness by generation and incarnation, replacement,
 * refusal of a bad key undoing everything), lookups over overlapping
 * regions checked against brute force, listing, describing, removing, and
 * when the backends' handles go back; a thousand remotes found by name.
 */
#include <string.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

#define HAS(...)                                     \
    do {                                             \
        char want_[512];                             \
        snprintf(want_, sizeof(want_), __VA_ARGS__); \
        KT_ERROR_HAS(want_);                         \
    } while (0)

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM);

/* Regions of the remote, deliberately unsorted and overlapping. */
static const kvl_mem_desc_t g_regs[] = {
    {0x50000, 0x1000, 0}, {0x10000, 0x10000, 0}, {0x12000, 0x100, 1},
    {0x11000, 0x2000, 0}, {0x11000, 0x80, 0},    {0x30000, 0x400, 0},
};
#define NREGS (sizeof(g_regs) / sizeof(g_regs[0]))

static kt_rmd_t peer_md(uint64_t inc, uint64_t start, uint64_t gen)
{
    return (kt_rmd_t){.name = "peer", .incarnation = inc, .start_ns = start, .generation = gen,
                      .backends = {"s1"}, .n_backends = 1, .regions = g_regs,
                      .n_regions = NREGS};
}

static int contains(const kvli_rregion_t *g, uint64_t addr, uint64_t len)
{
    return addr >= g->addr && addr - g->addr <= g->len && len <= g->len - (addr - g->addr);
}

static uint64_t dist(const kvli_rregion_t *g, uint64_t addr)
{
    if (addr < g->addr)
        return g->addr - addr;
    return addr - g->addr < g->len ? 0 : addr - g->addr - g->len + 1;
}

static void test_load_and_lookups(void)
{
    kvl_agent_t *a = bare("loader");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    kt_rmd_t m = peer_md(0xabc, 100, 5);
    size_t len;
    char name[8];
    void *blob = kt_md_blob(&m, &len);
    KT_OK(kvl_metadata_load(a, blob, len, name, sizeof(name)));
    KT_CHECK(strcmp(name, "peer") == 0);
    KT_CHECK(kvl_remote_check(a, "peer") == KVL_OK && kvl_remote_incarnation(a, "peer") == 0xabc);
    KT_CHECK(s.peers == 1 && s.rloads == NREGS);

    /* listed sorted by address (then length); each keeps its own handle */
    kvl_mem_desc_t out[NREGS + 1];
    kvl_mem_kind_t kinds[NREGS + 1];
    size_t n = 0;
    KT_OK(kvl_remote_regions(a, "peer", out, kinds, NREGS + 1, &n));
    KT_CHECK(n == NREGS);
    for (size_t i = 1; i < n; i++)
        KT_CHECK(out[i - 1].addr < out[i].addr ||
                 (out[i - 1].addr == out[i].addr && out[i - 1].len <= out[i].len));
    KT_CHECK(out[0].addr == 0x10000 && out[1].addr == 0x11000 && out[1].len == 0x80);
    KT_CHECK(out[3].addr == 0x12000 && out[3].dev == 1 && kinds[3] == KVL_MEM_DRAM);
    kvli_remote_t *r = kvli_remote_find(a, "peer");
    KT_CHECK(r != NULL && r->n_regions == NREGS && r->max_len == 0x10000);
    for (size_t i = 0; i < n; i++)
        KT_CHECK(r->regions[i].rh[0] == (void *)(uintptr_t)r->regions[i].addr);
    n = 0;
    KT_OK(kvl_remote_regions(a, "peer", out, NULL, 2, &n)); /* the total, two filled */
    KT_CHECK(n == NREGS && out[1].addr == 0x11000);
    KT_OK(kvl_remote_regions(a, "peer", NULL, NULL, 0, &n));
    KT_CHECK(n == NREGS);
    KT_STATUS(kvl_remote_regions(a, "peer", NULL, NULL, 1, &n), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_remote_regions(a, "nobody", out, NULL, 1, &n), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("remote agent 'nobody' is not loaded on agent 'loader'");
    KT_ERROR_HAS("fix: load its metadata first (kvl_metadata_load)");

    /* lookups agree with brute force */
    uint64_t seed = 99;
    for (int q = 0; q < 20000; q++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t addr = 0x8000 + (seed >> 33) % 0x50000, l = 1 + (seed >> 20) % 0x800;
        const kvli_rregion_t *any = NULL;
        uint64_t bestd = UINT64_MAX;
        for (size_t i = 0; i < r->n_regions; i++) {
            if (contains(&r->regions[i], addr, l))
                any = &r->regions[i];
            if (dist(&r->regions[i], addr) < bestd)
                bestd = dist(&r->regions[i], addr);
        }
        const kvli_rregion_t *f = kvli_rregion_find(r, addr, l);
        KT_CHECK((f == NULL) == (any == NULL) && (f == NULL || contains(f, addr, l)));
        const kvli_rregion_t *nr = kvli_rregion_nearest(r, addr);
        if (nr == NULL || dist(nr, addr) != bestd)
            fprintf(stderr, "nearest(0x%llx): at %llu, one at %llu exists\n",
                    (unsigned long long)addr, nr ? (unsigned long long)dist(nr, addr) : 0,
                    (unsigned long long)bestd);
        KT_CHECK(nr != NULL && dist(nr, addr) == bestd);
    }
    KT_CHECK(kvli_rregion_find(r, 0x12ff0, 0x20)->len == 0x10000);
    KT_CHECK(dist(kvli_rregion_nearest(r, 0x17000), 0x17000) == 0);

    /* the same generation again: nothing to do */
    KT_OK(kvl_metadata_load(a, blob, len, NULL, 0));
    KT_CHECK(s.peers == 1 && kvli_remote_find(a, "peer") == r);
    free(blob);
    kvl_agent_destroy(a);
    KT_CHECK(s.unpeers == 1 && s.runloads == NREGS);
}

static void test_staleness(void)
{
    kvl_agent_t *a = bare("judge");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    kt_rmd_t m = peer_md(0x1111, 5000000000ull, 5);
    kt_md_load(a, &m);
    kvl_error_t err;
    kvli_remote_t *held = kvli_remote_acquire(a, "peer", &err); /* a user of the old one */
    KT_CHECK(held != NULL && atomic_load(&held->valid));

    size_t len;
    void *blob;
    /* an older generation of the same incarnation */
    m.generation = 3;
    blob = kt_md_blob(&m, &len);
    KT_STATUS(kvl_metadata_load(a, blob, len, NULL, 0), KVL_ERR_STALE);
    KT_ERROR_HAS("metadata of agent 'peer' is stale: generation 3 is older than the loaded "
                 "generation 5 of the same incarnation");
    KT_ERROR_HAS("fix: fetch the agent's current metadata; the loaded one stays in use");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    free(blob);
    /* an incarnation that started earlier */
    m = peer_md(0x2222, 4000000000ull, 9);
    blob = kt_md_blob(&m, &len);
    KT_STATUS(kvl_metadata_load(a, blob, len, NULL, 0), KVL_ERR_STALE);
    HAS("incarnation %016llx started 1.000 s before the loaded incarnation %016llx", 0x2222ull,
        0x1111ull);
    free(blob);
    KT_CHECK(kvli_remote_find(a, "peer") == held && s.peers == 1);

    /* a newer generation replaces it; the old one's handles go back when its
     * last user lets go */
    m = peer_md(0x1111, 5000000000ull, 6);
    kt_md_load(a, &m);
    KT_CHECK(kvli_remote_find(a, "peer") != held && !atomic_load(&held->valid));
    KT_CHECK(s.peers == 2 && s.unpeers == 0 && s.runloads == 0);
    kvli_remote_put(a, held);
    KT_CHECK(s.unpeers == 1 && s.runloads == NREGS);

    /* a restart (new incarnation, later start) replaces it as well */
    m = peer_md(0x3333, 6000000000ull, 1);
    kt_md_load(a, &m);
    KT_CHECK(kvl_remote_incarnation(a, "peer") == 0x3333 && s.unpeers == 2);
    /* same start time, other incarnation: not older, so it replaces */
    m = peer_md(0x4444, 6000000000ull, 1);
    kt_md_load(a, &m);
    KT_CHECK(kvl_remote_incarnation(a, "peer") == 0x4444 && s.unpeers == 3);

    KT_OK(kvl_remote_remove(a, "peer"));
    KT_CHECK(s.unpeers == 4 && s.runloads == 4 * NREGS);
    KT_CHECK(kvl_remote_check(a, "peer") == KVL_ERR_NOT_FOUND);
    KT_CHECK(kvl_remote_incarnation(a, "peer") == 0);
    KT_STATUS(kvl_remote_remove(a, "peer"), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("remote agent 'peer' is not loaded on agent 'judge'");
    KT_ERROR_HAS("fix: it was never loaded or is already removed");
    KT_STATUS(kvl_remote_remove(a, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_remote_remove(NULL, "peer"), KVL_ERR_INVALID_ARG);
    KT_CHECK(kvl_remote_check(a, NULL) == KVL_ERR_INVALID_ARG);
    KT_CHECK(kvl_remote_incarnation(NULL, "peer") == 0);
    KT_CHECK(kvli_remote_acquire(a, "peer", &err) == NULL && err.code == KVL_ERR_NOT_FOUND);
    KT_CHECK(strcmp(err.agent, "peer") == 0);
    kvl_agent_destroy(a);
}

static void test_refused(void)
{
    kvl_agent_t *a = bare("picky");
    kt_stub_t s;
    size_t len;
    char name[16] = "junk";
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);

    KT_STATUS(kvl_metadata_load(a, "junk", 4, name, sizeof(name)), KVL_ERR_BAD_METADATA);
    KT_CHECK(name[0] == '\0');
    KT_STATUS(kvl_metadata_load(NULL, "junk", 4, NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_metadata_load: agent is NULL");

    /* a key the backend refuses poisons the whole blob; a loaded older
     * generation stays */
    kt_rmd_t m = peer_md(7, 1, 1);
    kt_md_load(a, &m);
    unsigned loaded = s.rloads;
    m.generation = 2;
    s.rload_fail_addr = 0x12000;
    void *blob = kt_md_blob(&m, &len);
    KT_STATUS(kvl_metadata_load(a, blob, len, NULL, 0), KVL_ERR_BAD_METADATA);
    KT_ERROR_HAS("agent 'peer': region 2 (0x12000+256) has a key backend s1 refuses");
    KT_ERROR_HAS("cause 1: [s1] KVL_ERR_BAD_METADATA: stub s1: key refused");
    free(blob);
    KT_CHECK(s.peers == 2 && s.unpeers == 1); /* the new connection dropped */
    KT_CHECK(s.rloads - loaded == 2 && s.runloads == 2); /* regions 0 and 1 undone */
    KT_CHECK(kvli_remote_find(a, "peer")->generation == 1);
    s.rload_fail_addr = 0;

    /* reachable through no backend: each backend's reason */
    kt_rmd_t other = {.name = "other", .incarnation = 8, .start_ns = 1, .generation = 1,
                      .backends = {"tcp"}, .n_backends = 1, .regions = g_regs, .n_regions = 1};
    blob = kt_md_blob(&other, &len);
    KT_STATUS(kvl_metadata_load(a, blob, len, NULL, 0), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("agent 'other' cannot be reached through any backend of agent 'picky'");
    KT_ERROR_HAS("cause 1: [s1] KVL_ERR_UNSUPPORTED: the remote agent has no s1 backend");
    KT_ERROR_HAS("fix: each backend's reason is listed");
    KT_CHECK(kvl_remote_check(a, "other") == KVL_ERR_NOT_FOUND);
    s.peer_status = KVL_ERR_REMOTE_REFUSED;
    other.backends[0] = "s1";
    free(blob);
    blob = kt_md_blob(&other, &len);
    KT_STATUS(kvl_metadata_load(a, blob, len, NULL, 0), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("cause 1: [s1] KVL_ERR_REMOTE_REFUSED: stub s1: peer refused");
    free(blob);
    kvl_agent_destroy(a);

    a = bare("lonely");
    blob = kt_md_blob(&other, &len);
    KT_STATUS(kvl_metadata_load(a, blob, len, NULL, 0), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("fix: create a backend on this agent first");
    free(blob);
    kvl_agent_destroy(a);
}

static void test_describe(void)
{
    kvl_agent_t *a = bare("describer");
    kt_stub_t s1, s2, s3, s4;
    kt_stub_attach(a, &s1, "s1", DRAM, DRAM, 0);
    kt_stub_attach(a, &s2, "s2", DRAM, DRAM, 0);
    kt_stub_attach(a, &s3, "s3", DRAM, DRAM, 0);
    kt_stub_attach(a, &s4, "s4", DRAM, DRAM, 0);
    s1.describe = "via stub one";
    s2.ops.peer_describe = NULL; /* the slot is optional */
    s4.peer_status = KVL_ERR_PERMISSION;
    kt_rmd_t m = {.name = "far", .incarnation = 1, .start_ns = 1, .generation = 1,
                  .backends = {"s2", "s1", "s4"}, .n_backends = 3, .regions = g_regs,
                  .n_regions = 2};
    kt_md_load(a, &m);
    const char *want = "s1: via stub one\n"
                       "s2: connected\n"
                       "s3: unreachable: the remote agent has no s3 backend\n"
                       "s4: unreachable: stub s4: peer refused\n";
    char out[512];
    size_t need = kvl_remote_describe(a, "far", out, sizeof(out));
    KT_CHECK(strcmp(out, want) == 0 && need == strlen(want));
    char small[12];
    KT_CHECK(kvl_remote_describe(a, "far", small, sizeof(small)) == need);
    KT_CHECK(strcmp(small, "s1: via stu") == 0);
    KT_CHECK(kvl_remote_describe(a, "far", NULL, 0) == need);
    KT_CHECK(kvl_remote_describe(a, "nobody", out, sizeof(out)) == 0 && out[0] == '\0');
    KT_CHECK(kvl_remote_describe(NULL, "far", out, sizeof(out)) == 0);
    /* keys were loaded only on the backends that reached the peer */
    KT_CHECK(s1.rloads == 2 && s2.rloads == 2 && s3.rloads == 0 && s4.rloads == 0);
    kvl_agent_destroy(a);
    KT_CHECK(s1.unpeers == 1 && s2.unpeers == 1 && s3.unpeers == 0 && s4.unpeers == 0);
}

/* Many remotes: found by name through the agent's table as it grows,
 * removed and replaced in it, every lookup checked against what was
 * loaded. */
static void test_many(void)
{
    enum { N = 1000 };
    kvl_agent_t *a = bare("hub");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    char names[N][16];
    for (unsigned i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "r%u", i);
        kt_rmd_t m = peer_md(0x1000 + i, 1000000000ull, 1);
        m.name = names[i];
        kt_md_load(a, &m);
    }
    KT_CHECK(a->nremotes == N && a->rtab != NULL && a->rtab_cap >= 2 * N);
    for (unsigned i = 0; i < N; i++) {
        kvli_remote_t *r = kvli_remote_find(a, names[i]);
        KT_CHECK(r != NULL && strcmp(r->name, names[i]) == 0 && r->incarnation == 0x1000 + i);
    }
    KT_CHECK(kvli_remote_find(a, "r1000") == NULL && kvli_remote_find(a, "") == NULL);
    /* every third removed; every fifth replaced (a newer generation) */
    for (unsigned i = 0; i < N; i += 3)
        KT_OK(kvl_remote_remove(a, names[i]));
    for (unsigned i = 0; i < N; i += 5) {
        kt_rmd_t m = peer_md(0x1000 + i, 1000000000ull, 2);
        m.name = names[i];
        kt_md_load(a, &m);
    }
    size_t held = 0;
    for (unsigned i = 0; i < N; i++) {
        kvli_remote_t *r = kvli_remote_find(a, names[i]);
        bool there = i % 3 != 0 || i % 5 == 0;
        KT_CHECK((r != NULL) == there);
        KT_CHECK(kvl_remote_check(a, names[i]) == (there ? KVL_OK : KVL_ERR_NOT_FOUND));
        if (r != NULL) {
            KT_CHECK(strcmp(r->name, names[i]) == 0 && r->generation == (i % 5 == 0 ? 2u : 1u));
            held++;
        }
    }
    KT_CHECK(a->nremotes == held);
    size_t listed = 0;
    for (kvli_remote_t *r = a->remotes; r != NULL; r = r->next)
        listed++;
    KT_CHECK(listed == held);
    kvl_agent_destroy(a); /* unloads every one held */
    KT_CHECK(s.unpeers == s.peers);
}

int main(void)
{
    test_load_and_lookups();
    test_staleness();
    test_refused();
    test_describe();
    test_many();
    printf("test_remote: passed\n");
    return 0;
}
