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

int main(void)
{
    test_empty();
    test_contents();
    test_round_trip();
    printf("test_metadata: passed\n");
    return 0;
}
