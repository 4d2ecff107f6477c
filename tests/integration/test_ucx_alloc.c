/*
 * Memory the ucx backend allocates (kvl_mem_alloc_ex naming "ucx"):
 *   - registration on ucx reuses the allocation (detail says so) and on shm
 *     goes through cma (it is not memfd memory);
 *   - WRITE and READ with a peer whose buffer UCX allocated too, on UCX's
 *     default transports and on UCX_TLS=tcp, bytes verified; the same
 *     memory moved by the shm backend;
 *   - kvl_mem_free refuses registered memory, unknown pointers and pointers
 *     inside an allocation; kvl_mem_alloc_ex naming a backend not created or
 *     one that does not allocate is a clear error;
 *   - kvl_agent_destroy and exit() with allocations (registered or not)
 *     leave no "destroying inuse region" or other UCX complaint on stderr.
 * Skips (77) without the ucx module.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"

#define LEN (4u << 20)

static const kvl_alloc_params_t ucx_alloc = {.field_mask = KVL_ALLOC_PARAM_BACKEND,
                                             .backend = "ucx"};

static void move(kvl_agent_t *a, kvl_xfer_op_t op, const char *peer, uint64_t l, uint64_t r,
                 uint64_t len)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    /* strided blocks plus one large block: small puts and bulk */
    KT_OK(kvl_dlist_add_strided(ld, l, 8192, 64, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(rd, r, 8192, 64, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(ld, l + (1u << 20), len - (1u << 20), KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(rd, r + (1u << 20), len - (1u << 20), KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, op, ld, peer, rd, NULL, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 20000));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE);
    kvl_xfer_stats_t stats;
    KT_OK(kvl_xfer_get_stats(x, &stats));
    printf("  %s via %s\n", op == KVL_WRITE ? "WRITE" : "READ", stats.path);
    kvl_xfer_release(x);
}

/* The bytes moved by move(): strided blocks and the bulk tail. */
static void check_peer(kt_peer_t *p, uint64_t seed)
{
    for (uint64_t j = 0; j < 64; j++)
        KT_CHECK(kt_peer_verify(p, j * 8192, 4096, seed + j) == -1);
    KT_CHECK(kt_peer_verify(p, 1u << 20, LEN - (1u << 20), seed + 99) == -1);
}

static void fill_local(uint8_t *buf, uint64_t seed)
{
    for (uint64_t j = 0; j < 64; j++)
        kt_fill(buf + j * 8192, 4096, seed + j);
    kt_fill(buf + (1u << 20), LEN - (1u << 20), seed + 99);
}

static void transfers(const char *label, const char *params)
{
    printf("--- %s\n", label);
    kvl_agent_t *a = kt_agent("alloc-init", "ucx", params);
    void *p;
    KT_OK(kvl_mem_alloc_ex(a, LEN, &ucx_alloc, &p));
    uint8_t *buf = p;
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    kvl_reg_report_t *rep;
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    KT_CHECK(rep->n_entries == 1 && rep->entries[0].n_outcomes == 1);
    printf("  ucx: %s\n", rep->entries[0].outcomes[0].detail);
    KT_CHECK(strstr(rep->entries[0].outcomes[0].detail, "UCX-allocated") != NULL);
    kvl_reg_report_free(rep);

    kt_peer_t t;
    kt_peer_opts_t o = {.name = "alloc-target", .len = LEN, .backend = "ucx",
                        .params = params, .shareable = 2};
    kt_peer_start(&t, &o, a);

    /* WRITE: UCX memory to UCX memory */
    fill_local(buf, 100);
    move(a, KVL_WRITE, "alloc-target", d.addr, t.base, LEN);
    check_peer(&t, 100);

    /* READ back something else the peer holds */
    kt_peer_fill(&t, 7);
    memset(buf, 0, LEN);
    move(a, KVL_READ, "alloc-target", d.addr, t.base, LEN);
    uint8_t *want = malloc(LEN);
    KT_CHECK(want != NULL);
    kt_fill(want, LEN, 7);
    for (uint64_t j = 0; j < 64; j++)
        KT_CHECK(memcmp(buf + j * 8192, want + j * 8192, 4096) == 0);
    KT_CHECK(memcmp(buf + (1u << 20), want + (1u << 20), LEN - (1u << 20)) == 0);
    free(want);

    /* free while registered: refused, nothing changes */
    KT_STATUS(kvl_mem_free(a, p), KVL_ERR_IN_USE);
    KT_ERROR_HAS("still has registered region");
    KT_OK(kvl_mem_deregister(a, &d, 1));
    /* a sub-range registers on the allocation too, then everything goes */
    kvl_mem_desc_t half = {d.addr + LEN / 2, LEN / 2, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &half, 1, NULL, NULL));
    KT_OK(kvl_mem_deregister(a, &half, 1));
    KT_OK(kvl_mem_free(a, p));
    KT_STATUS(kvl_mem_free(a, p), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("was not returned by kvl_mem_alloc");
    kt_peer_stop(&t);
    kvl_agent_destroy(a);
}

/* The shm backend on UCX-allocated memory: cma, not the memfd path. */
static void shm_on_ucx_memory(void)
{
    printf("--- shm backend on UCX-allocated memory\n");
    kvl_agent_t *a = kt_agent("alloc-shm", "ucx", NULL);
    KT_OK(kvl_backend_create(a, "shm", NULL, 0, NULL));
    void *p;
    KT_OK(kvl_mem_alloc_ex(a, LEN, &ucx_alloc, &p));
    uint8_t *buf = p;
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    kvl_reg_report_t *rep;
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    KT_CHECK(rep->entries[0].n_outcomes == 2);
    for (unsigned i = 0; i < rep->entries[0].n_outcomes; i++) {
        const kvl_reg_outcome_t *oc = &rep->entries[0].outcomes[i];
        printf("  %s: %s: %s\n", oc->backend, kvl_status_name(oc->status), oc->detail);
        KT_CHECK(oc->status == KVL_OK);
        if (strcmp(oc->backend, "shm") == 0)
            KT_CHECK(strstr(oc->detail, "mmap") == NULL);
    }
    kvl_reg_report_free(rep);

    kt_peer_t t;
    kt_peer_opts_t o = {.name = "shm-target", .len = LEN, .backend = "shm"};
    kt_peer_start(&t, &o, a);
    fill_local(buf, 300);
    move(a, KVL_WRITE, "shm-target", d.addr, t.base, LEN);
    check_peer(&t, 300);
    kt_peer_fill(&t, 9);
    memset(buf, 0, LEN);
    move(a, KVL_READ, "shm-target", d.addr, t.base, LEN);
    {
        uint8_t *want = malloc(LEN);
        KT_CHECK(want != NULL);
        kt_fill(want, LEN, 9);
        KT_CHECK(memcmp(buf + (1u << 20), want + (1u << 20), LEN - (1u << 20)) == 0);
        free(want);
    }
    kt_peer_stop(&t);
    kvl_agent_destroy(a); /* registered and allocated: destroy frees both */
}

static void usage_errors(void)
{
    printf("--- usage errors\n");
    kvl_agent_t *a = kt_agent("alloc-usage", "shm", NULL);
    void *p = (void *)&p;
    /* ucx not created on this agent */
    KT_STATUS(kvl_mem_alloc_ex(a, 4096, &ucx_alloc, &p), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("backend 'ucx' is not created on agent 'alloc-usage'");
    KT_CHECK(p == NULL);
    /* shm is created but does not allocate */
    kvl_alloc_params_t shm = {.field_mask = KVL_ALLOC_PARAM_BACKEND, .backend = "shm"};
    KT_STATUS(kvl_mem_alloc_ex(a, 4096, &shm, &p), KVL_ERR_UNSUPPORTED);
    KT_ERROR_HAS("backend 'shm' does not allocate memory");
    /* no backend named: memfd memory, as kvl_mem_alloc */
    KT_OK(kvl_mem_alloc_ex(a, 1 << 20, NULL, &p));
    /* unknown pointers and pointers inside an allocation */
    int local;
    KT_STATUS(kvl_mem_free(a, &local), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("was not returned by kvl_mem_alloc or kvl_mem_alloc_ex");
    KT_STATUS(kvl_mem_free(a, (uint8_t *)p + 4096), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("lies inside allocation");
    KT_OK(kvl_mem_free(a, p));
    kvl_agent_destroy(a);
}

/* Teardown in a child, its stderr (UCX warns there) checked. */
static void teardown_child(int which)
{
    kvl_agent_t *a = kt_agent("alloc-leaver", "ucx", NULL);
    void *p, *q;
    KT_OK(kvl_mem_alloc_ex(a, LEN, &ucx_alloc, &p));
    KT_OK(kvl_mem_alloc_ex(a, LEN, &ucx_alloc, &q)); /* never registered */
    kvl_mem_desc_t d[2] = {{(uint64_t)(uintptr_t)p, LEN, KVL_DEV_ANY},
                           {(uint64_t)(uintptr_t)p + 4096, 8192, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(a, d, 2, NULL, NULL));
    if (which == 1)
        exit(0); /* no kvl_agent_destroy: the module's exit teardown */
    kvl_agent_destroy(a);
    exit(0);
}

int main(void)
{
    kt_need_ucx();
    usage_errors();
    transfers("UCX's default transports", NULL);
    transfers("UCX_TLS=tcp", "tls=tcp");
    shm_on_ucx_memory();
    setenv("UCX_LOG_LEVEL", "warn", 1);
    kt_clean_exit(teardown_child, 1, "exit() with UCX allocations, registered and not");
    kt_clean_exit(teardown_child, 2, "kvl_agent_destroy with UCX allocations, registered and not");
    printf("PASS\n");
    return 0;
}
