/* This agent's metadata (src/core/metadata.c): what the blob holds (the
 * agent, each backend's connection info, every reachable region with one key
 * per backend), what is left out, and failures. */
#include <string.h>
#include <sys/mman.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"
#include "core/md_codec.h"

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM);

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static void get_decoded(kvl_agent_t *a, kvli_md_t *md, void **blob_p, size_t *len_p)
{
    kvl_error_t err;
    KT_OK(kvl_metadata_get(a, blob_p, len_p));
    KT_CHECK(kvli_md_decode(*blob_p, *len_p, md, &err) == KVL_OK);
}

static void test_empty(void)
{
    kvl_agent_t *a = bare("empty");
    void *blob = &blob;
    size_t len = 1;
    kvli_md_t md;
    KT_STATUS(kvl_metadata_get(a, NULL, &len), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_metadata_get: NULL argument");
    KT_STATUS(kvl_metadata_get(a, &blob, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_metadata_get(NULL, &blob, &len), KVL_ERR_INVALID_ARG);
    get_decoded(a, &md, &blob, &len);
    KT_CHECK(strcmp(md.name, "empty") == 0 && md.incarnation == a->incarnation);
    KT_CHECK(md.start_ns == a->start_ns && md.generation == 1);
    KT_CHECK(md.n_backends == 0 && md.n_regions == 0);
    kvli_md_release(&md);
    kvl_free(blob);
    kvl_free(NULL);
    kvl_agent_destroy(a);
}

static void test_contents(void)
{
    kvl_agent_t *a = bare("exporter");
    kt_stub_t s1, s2;
    kt_stub_attach(a, &s1, "s1", DRAM, DRAM, 0);
    kt_stub_attach(a, &s2, "s2", DRAM, DRAM, 0);
    uint8_t *buf = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t b = (uint64_t)(uintptr_t)buf;
    const char *n1[] = {"s1"}, *n2[] = {"s2"};
    kvl_reg_params_t on1 = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = n1, .n_backends = 1};
    kvl_reg_params_t on2 = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = n2, .n_backends = 1};
    kvl_mem_desc_t both = {b + 8192, 4096, KVL_DEV_ANY}, one = {b, 4096, KVL_DEV_ANY},
                   two = {b + 16384, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &both, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &one, 1, &on1, NULL));
    KT_OK(kvl_mem_register(a, &two, 1, &on2, NULL));

    void *blob, *blob2;
    size_t len, len2;
    kvli_md_t md;
    get_decoded(a, &md, &blob, &len);
    KT_CHECK(md.generation == atomic_load(&a->generation) && md.generation == 6);
    KT_CHECK(md.n_backends == 2 && strcmp(md.backends[0].name, "s1") == 0);
    KT_CHECK(strcmp(md.backends[1].name, "s2") == 0 && md.backends[1].conn_len == 2);
    KT_CHECK(memcmp(md.backends[1].conn, "s2", 2) == 0);
    /* regions in address order, a key for each backend they are on */
    KT_CHECK(md.n_regions == 3);
    const kvli_md_region_t *r = md.regions;
    KT_CHECK(r[0].addr == b && r[1].addr == b + 8192 && r[2].addr == b + 16384);
    KT_CHECK(r[0].len == 4096 && r[0].kind == KVL_MEM_DRAM && r[0].dev == 0);
    KT_CHECK(r[0].keys[0].present && !r[0].keys[1].present);
    KT_CHECK(r[1].keys[0].present && r[1].keys[1].present);
    KT_CHECK(!r[2].keys[0].present && r[2].keys[1].present);
    uint64_t k;
    KT_CHECK(r[1].keys[1].len == sizeof(k));
    memcpy(&k, r[1].keys[1].data, sizeof(k));
    KT_CHECK(k == b + 8192); /* the key region_pack made for that region */
    kvli_md_release(&md);

    /* nothing changed, nothing different */
    KT_OK(kvl_metadata_get(a, &blob2, &len2));
    KT_CHECK(len2 == len && memcmp(blob, blob2, len) == 0);
    kvl_free(blob2);
    kvl_free(blob);

    /* a region no backend can pack a key for is left out, not sent keyless */
    s2.pack_status = KVL_ERR_UNSUPPORTED;
    get_decoded(a, &md, &blob, &len);
    KT_CHECK(md.n_regions == 2 && md.regions[0].addr == b && md.regions[1].addr == b + 8192);
    KT_CHECK(md.regions[1].keys[0].present && !md.regions[1].keys[1].present);
    kvli_md_release(&md);
    kvl_free(blob);

    /* a backend that cannot pack its connection info fails the call */
    s2.conn_status = KVL_ERR_SYSTEM;
    blob = &blob;
    len = 7;
    KT_STATUS(kvl_metadata_get(a, &blob, &len), KVL_ERR_INTERNAL);
    KT_ERROR_HAS("backend s2 could not pack its connection info (KVL_ERR_SYSTEM)");
    KT_CHECK(strcmp(kvl_last_error()->backend, "s2") == 0 && blob == NULL && len == 0);
    kvl_agent_destroy(a);
    munmap(buf, 1 << 16);
}

/* What one agent exports, another (real shm backends) loads as is. */
static void test_round_trip(void)
{
    kvl_agent_t *a = kt_agent("exp", "shm", NULL), *b = kt_agent("imp", "shm", NULL);
    uint8_t *buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t base = (uint64_t)(uintptr_t)buf;
    kvl_mem_desc_t d[3] = {{base + 65536, 4096, 0}, {base, 100, KVL_DEV_ANY},
                           {base + 4096, 60000, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(a, d, 3, NULL, NULL));
    void *blob;
    size_t len;
    char name[KVL_NAME_MAX];
    KT_OK(kvl_metadata_get(a, &blob, &len));
    KT_OK(kvl_metadata_load(b, blob, len, name, sizeof(name)));
    kvl_free(blob);
    KT_CHECK(strcmp(name, "exp") == 0 && kvl_remote_incarnation(b, "exp") == a->incarnation);
    kvl_mem_desc_t out[4];
    size_t n;
    KT_OK(kvl_remote_regions(b, "exp", out, NULL, 4, &n));
    KT_CHECK(n == 3 && out[0].addr == base && out[0].len == 100);
    KT_CHECK(out[1].addr == base + 4096 && out[1].len == 60000);
    KT_CHECK(out[2].addr == base + 65536 && out[2].len == 4096 && out[2].dev == 0);
    kvl_agent_destroy(b);
    kvl_agent_destroy(a);
    munmap(buf, 1 << 20);
}

static void *partial(kvl_agent_t *a, kvl_mem_kind_t kind, const kvl_mem_desc_t *d, size_t n,
                     bool conn, size_t *len_p)
{
    kvl_dlist_t *dl;
    void *blob = NULL;
    KT_OK(kvl_dlist_create(kind, n, &dl));
    for (size_t i = 0; i < n; i++)
        KT_OK(kvl_dlist_add(dl, d[i].addr, d[i].len, d[i].dev));
    KT_OK(kvl_metadata_get_partial(a, dl, conn, NULL, 0, &blob, len_p));
    kvl_dlist_destroy(dl);
    return blob;
}

static size_t held(kvl_agent_t *b, const char *name, kvl_mem_desc_t *out)
{
    size_t n = 0;
    KT_OK(kvl_remote_regions(b, name, out, NULL, 8, &n));
    return n;
}

/* Partial metadata: what it carries, merging, refusals, staleness. */
static void test_partial(void)
{
    kvl_agent_t *a = kt_agent("pexp", "shm", NULL), *b = kt_agent("pimp", "shm", NULL);
    uint8_t *buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t base = (uint64_t)(uintptr_t)buf;
    kvl_mem_desc_t r1 = {base, 65536, KVL_DEV_ANY}, r2 = {base + 131072, 65536, KVL_DEV_ANY};
    kvl_mem_desc_t in1 = {base + 4096, 100, KVL_DEV_ANY}, in2 = {base + 131072 + 8, 8, KVL_DEV_ANY};
    kvl_mem_desc_t out[8];
    KT_OK(kvl_mem_register(a, &r1, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &r2, 1, NULL, NULL));
    void *blob, *c1, *p1, *p2, *pboth;
    size_t len, lc1, lp1, lp2, lboth;
    kvli_md_t md;
    kvl_error_t err;
    char name[KVL_NAME_MAX];

    /* no descriptors: connection info of every backend, no region */
    KT_OK(kvl_metadata_get_partial(a, NULL, false, NULL, 0, &c1, &lc1));
    KT_CHECK(kvli_md_decode(c1, lc1, &md, &err) == KVL_OK);
    KT_CHECK(md.flags == KVLI_MD_FLAG_PARTIAL && md.n_regions == 0 && md.n_backends == 1);
    KT_CHECK(md.backends[0].conn_len > 0 && md.generation == atomic_load(&a->generation));
    kvli_md_release(&md);
    /* descriptors, no connection info: the regions they lie in, each once */
    kvl_mem_desc_t twice[2] = {in1, {base + 8192, 10, KVL_DEV_ANY}};
    p1 = partial(a, KVL_MEM_DRAM, twice, 2, false, &lp1);
    KT_CHECK(kvli_md_decode(p1, lp1, &md, &err) == KVL_OK);
    KT_CHECK(md.flags == (KVLI_MD_FLAG_PARTIAL | KVLI_MD_FLAG_NO_CONN));
    KT_CHECK(md.n_regions == 1 && md.regions[0].addr == base && md.regions[0].len == 65536);
    KT_CHECK(md.n_backends == 1 && md.backends[0].conn_len == 0 && md.regions[0].keys[0].present);
    kvli_md_release(&md);
    p2 = partial(a, KVL_MEM_DRAM, &in2, 1, false, &lp2);

    /* regions before connection info: refused, nothing loaded */
    KT_STATUS(kvl_metadata_load(b, p1, lp1, name, sizeof(name)), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("partial metadata of agent 'pexp' carries no connection info and agent "
                 "'pexp' is not loaded on agent 'pimp'");
    KT_CHECK(strstr(kvl_last_error()->hint, "inc_conn_info=True") != NULL);
    KT_CHECK(kvl_remote_check(b, "pexp") == KVL_ERR_NOT_FOUND);
    /* connection info, then one region, then the other */
    KT_OK(kvl_metadata_load(b, c1, lc1, name, sizeof(name)));
    KT_CHECK(strcmp(name, "pexp") == 0 && held(b, "pexp", out) == 0);
    KT_OK(kvl_metadata_load(b, p1, lp1, NULL, 0));
    KT_CHECK(held(b, "pexp", out) == 1 && out[0].addr == base);
    kvl_prep_t *pr;
    kvl_dlist_t *dl;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &dl));
    KT_OK(kvl_dlist_add(dl, in2.addr, in2.len, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_remote(b, "pexp", dl, &pr), KVL_ERR_OUT_OF_BOUNDS);
    KT_OK(kvl_metadata_load(b, p2, lp2, NULL, 0));
    KT_CHECK(held(b, "pexp", out) == 2 && out[1].addr == r2.addr);
    KT_OK(kvl_prep_remote(b, "pexp", dl, &pr));
    kvl_dlist_destroy(dl);
    /* the same blob again, and connection info again: nothing changes, and
     * nothing is retired (an engine may send the same partial blob often) */
    kvli_rretired_t *before = kvli_remote_find(b, "pexp")->retired;
    KT_CHECK(before != NULL);
    for (int i = 0; i < 3; i++) {
        KT_OK(kvl_metadata_load(b, p1, lp1, NULL, 0));
        KT_OK(kvl_metadata_load(b, c1, lc1, NULL, 0));
    }
    KT_CHECK(held(b, "pexp", out) == 2 && kvli_remote_find(b, "pexp")->retired == before);

    /* a descriptor of no registered region, of another kind, an unknown backend */
    kvl_mem_desc_t bad[2] = {in1, {base + 70000, 16, 3}};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 2, &dl));
    KT_OK(kvl_dlist_add(dl, bad[0].addr, bad[0].len, bad[0].dev));
    KT_OK(kvl_dlist_add(dl, bad[1].addr, bad[1].len, bad[1].dev));
    blob = &blob;
    KT_STATUS(kvl_metadata_get_partial(a, dl, true, NULL, 0, &blob, &len), KVL_ERR_OUT_OF_BOUNDS);
    KT_CHECK(blob == NULL);
    char want[200];
    snprintf(want, sizeof(want), "partial metadata: descriptor 1 (0x%llx+16, device 3) is not "
             "inside a region registered on agent 'pexp'", (unsigned long long)(base + 70000));
    KT_ERROR_HAS(want);
    kvl_dlist_destroy(dl);
    KT_OK(kvl_dlist_create(KVL_MEM_VRAM, 1, &dl));
    KT_OK(kvl_dlist_add(dl, in1.addr, in1.len, 0));
    KT_STATUS(kvl_metadata_get_partial(a, dl, true, NULL, 0, &blob, &len), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("partial metadata: descriptor 0 (");
    KT_ERROR_HAS("registered as DRAM");
    const char *nope[] = {"ucx"};
    KT_STATUS(kvl_metadata_get_partial(a, NULL, true, nope, 1, &blob, &len), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("partial metadata: backend 'ucx' is not created on agent 'pexp'");
    const char *shm[] = {"shm"};
    KT_OK(kvl_metadata_get_partial(a, NULL, true, shm, 1, &blob, &len));
    kvl_free(blob);
    kvl_dlist_destroy(dl);

    /* stale: an older generation is refused and changes nothing */
    kvl_mem_desc_t r3 = {base + 262144, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &r3, 1, NULL, NULL));
    void *p3 = partial(a, KVL_MEM_DRAM, &r3, 1, false, &len);
    KT_OK(kvl_metadata_load(b, p3, len, NULL, 0));
    kvl_free(p3);
    KT_CHECK(held(b, "pexp", out) == 3);
    KT_STATUS(kvl_metadata_load(b, p1, lp1, NULL, 0), KVL_ERR_STALE);
    KT_ERROR_HAS("is older than the loaded generation");
    KT_CHECK(held(b, "pexp", out) == 3);
    /* a deregistered region is not resurrected by an old partial blob */
    kvl_prep_release(pr);
    KT_OK(kvl_mem_deregister(a, &r1, 1));
    KT_OK(kvl_metadata_get(a, &blob, &len));
    KT_OK(kvl_metadata_load(b, blob, len, NULL, 0));
    kvl_free(blob);
    KT_CHECK(held(b, "pexp", out) == 2 && out[0].addr == r2.addr);
    KT_STATUS(kvl_metadata_load(b, p1, lp1, NULL, 0), KVL_ERR_STALE);
    KT_CHECK(held(b, "pexp", out) == 2 && out[0].addr == r2.addr);
    /* a region replaced at the same address: the partial blob's wins */
    KT_OK(kvl_mem_deregister(a, &r2, 1));
    kvl_mem_desc_t r2b = {r2.addr, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &r2b, 1, NULL, NULL));
    pboth = partial(a, KVL_MEM_DRAM, &r2b, 1, false, &lboth);
    KT_OK(kvl_metadata_load(b, pboth, lboth, NULL, 0));
    KT_CHECK(held(b, "pexp", out) == 2 && out[0].addr == r2.addr && out[0].len == 4096);
    kvl_free(pboth);
    /* a full blob of the generation held replaces a set built from partial blobs */
    KT_OK(kvl_metadata_get(a, &blob, &len));
    KT_OK(kvl_metadata_load(b, blob, len, NULL, 0));
    kvl_free(blob);
    KT_CHECK(held(b, "pexp", out) == 2);

    /* a new incarnation: regions alone refused; with connection info it replaces */
    kvl_agent_destroy(a);
    a = kt_agent("pexp", "shm", NULL);
    KT_OK(kvl_mem_register(a, &r1, 1, NULL, NULL));
    blob = partial(a, KVL_MEM_DRAM, &r1, 1, false, &len);
    KT_STATUS(kvl_metadata_load(b, blob, len, NULL, 0), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("is of a new incarnation");
    kvl_free(blob);
    blob = partial(a, KVL_MEM_DRAM, &r1, 1, true, &len);
    KT_OK(kvl_metadata_load(b, blob, len, NULL, 0));
    kvl_free(blob);
    KT_CHECK(kvl_remote_incarnation(b, "pexp") == a->incarnation);
    KT_CHECK(held(b, "pexp", out) == 1 && out[0].addr == base);

    kvl_free(c1);
    kvl_free(p1);
    kvl_free(p2);
    kvl_agent_destroy(b);
    kvl_agent_destroy(a);
    munmap(buf, 1 << 20);
}

int main(void)
{
    test_empty();
    test_contents();
    test_round_trip();
    test_partial();
    printf("test_metadata: passed\n");
    return 0;
}
