/*
 * Transfers (src/core/xfer.c) against stub backends, which show exactly
 * what the core hands a backend: pairing blocks into segments (strides,
 * coalescing, region tables), refusals, backend choice, indexed transfers
 * (from KVLI_IDX_MIN pairs, expanded on request), and the life of a
 * transfer: post, test, wait, cancel, release, errors and staleness.
 */
#include <pthread.h>
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
#define IDX_MIN 256 /* KVLI_IDX_MIN in xfer.c */

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM), VRAM = KVL_MEM_BIT(KVL_MEM_VRAM);
static uint64_t B;                        /* 1 MiB mapped: L0 = B+0..256K, L1 = B+512K..768K */
static const uint64_t R0 = 0x100000, R1 = 0x400000; /* the remote's regions */

static kvl_agent_t *setup(const char *name, kt_stub_t *s, uint32_t caps)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    kt_stub_attach(a, s, "s1", DRAM, DRAM, caps);
    kvl_mem_desc_t d[2] = {{B, 256 * KiB, KVL_DEV_ANY}, {B + 512 * KiB, 256 * KiB, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(a, d, 2, NULL, NULL));
    static const kvl_mem_desc_t rd[2] = {{0x100000, 0x100000, 0}, {0x400000, 0x10000, 0}};
    kt_rmd_t rm = {.name = "peer", .incarnation = 5, .start_ns = 1, .generation = 1,
                   .backends = {"s1"}, .n_backends = 1, .regions = rd, .n_regions = 2};
    kt_md_load(a, &rm);
    return a;
}

static kvl_dlist_t *list(void)
{
    kvl_dlist_t *dl;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &dl));
    return dl;
}

/* Build a transfer of l -> r (both freed). */
static kvl_xfer_t *make(kvl_agent_t *a, kvl_dlist_t *l, kvl_dlist_t *r,
                        const kvl_xfer_params_t *params)
{
    kvl_xfer_t *x;
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, params, &x));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return x;
}

static void seg_is(const kvl_seg_t *s, uint64_t la, uint64_t ra, uint64_t len, uint64_t count,
                   uint64_t ls, uint64_t rs)
{
    if (s->laddr != la || s->raddr != ra || s->len != len || s->count != count ||
        s->lstride != ls || s->rstride != rs) {
        fprintf(stderr, "segment: l 0x%llx r 0x%llx len %llu count %llu strides %llu/%llu\n",
                ULL(s->laddr), ULL(s->raddr), ULL(s->len), ULL(s->count), ULL(s->lstride),
                ULL(s->rstride));
        KT_CHECK(0);
    }
}

static void test_pairing(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("pairing", &s, 0);
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    kvl_xfer_stats_t st;

    /* contiguous on both sides: one segment */
    l = list(), r = list();
    for (int i = 0; i < 3; i++) {
        KT_OK(kvl_dlist_add(l, B + 64 * (uint64_t)i, 64, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, R0 + 64 * (uint64_t)i, 64, KVL_DEV_ANY));
    }
    x = make(a, l, r, NULL);
    KT_CHECK(x->nsegs == 1 && x->blocks == 3 && x->bx.total_bytes == 192);
    seg_is(&x->segs[0], B, R0, 192, 1, 0, 0);
    KT_OK(kvl_xfer_get_stats(x, &st));
    KT_CHECK(st.bytes == 192 && st.blocks == 3 && st.segments == 1 && st.post_ns == 0);
    KT_CHECK(strcmp(st.backend, "s1") == 0 && st.path[0] == '\0');
    KT_CHECK(x->bx.op == KVL_WRITE && x->bx.segs == x->segs && x->bx.nsegs == 1);
    KT_CHECK(x->bx.peer == &s && x->bx.core == x && x->bx.nidx == 0);
    KT_CHECK(x->bx.notif == NULL && x->bx.timeout_ms == a->timeout_ms);
    KT_CHECK(a->xfers == x && kvl_xfer_state(x) == KVL_XFER_IDLE);
    kvl_xfer_release(x);
    KT_CHECK(a->xfers == NULL && s.releases == 0); /* never posted: nothing to release */

    /* strided locally, plain remotely: block by block */
    l = list(), r = list();
    KT_OK(kvl_dlist_add_strided(l, B, 4096, 8, 256, KVL_DEV_ANY));
    for (int i = 0; i < 8; i++)
        KT_OK(kvl_dlist_add(r, R0 + 256 * (uint64_t)i, 256, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    KT_CHECK(x->nsegs == 8 && x->blocks == 8);
    for (int i = 0; i < 8; i++)
        seg_is(&x->segs[i], B + 4096 * (uint64_t)i, R0 + 256 * (uint64_t)i, 256, 1, 0, 0);
    kvl_xfer_release(x);

    /* strided on both sides, contiguous on both: one block */
    l = list(), r = list();
    KT_OK(kvl_dlist_add_strided(l, B, 64, 16, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, R0, 64, 16, 64, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    KT_CHECK(x->nsegs == 1 && x->blocks == 16);
    seg_is(&x->segs[0], B, R0, 1024, 1, 0, 0);
    kvl_xfer_release(x);

    /* strided with different strides; counts split 6 = 4 + 2 */
    l = list(), r = list();
    KT_OK(kvl_dlist_add_strided(l, B, 4096, 6, 128, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, R0, 1024, 4, 128, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, R0 + 64 * KiB, 512, 2, 128, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    KT_CHECK(x->nsegs == 2 && x->blocks == 6 && x->bx.total_bytes == 6 * 128);
    seg_is(&x->segs[0], B, R0, 128, 4, 4096, 1024);
    seg_is(&x->segs[1], B + 4 * 4096, R0 + 64 * KiB, 128, 2, 4096, 512);
    kvl_xfer_release(x);

    /* regions: only those used, in order of use; segments index them */
    l = list(), r = list();
    KT_OK(kvl_dlist_add(l, B + 512 * KiB, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(l, B + 100 * KiB, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R1, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0 + 8, 64, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    KT_CHECK(x->nlregs == 2 && x->nrregs == 2 && x->nsegs == 2);
    KT_CHECK(x->lregs[0]->addr == B + 512 * KiB && x->lregs[1]->addr == B);
    for (int i = 0; i < 2; i++) {
        const kvl_seg_t *g = &x->segs[i];
        const kvli_region_t *lr = x->lregs[g->lreg];
        KT_CHECK(g->laddr >= lr->addr && g->laddr + g->len <= lr->addr + lr->len);
        KT_CHECK(x->lmh[g->lreg] == (void *)(uintptr_t)lr->addr); /* the stub's handle */
    }
    KT_CHECK(x->rmh[x->segs[0].rreg] == (void *)(uintptr_t)R1);
    KT_CHECK(x->rmh[x->segs[1].rreg] == (void *)(uintptr_t)R0);
    KT_CHECK(x->bx.lmh == (void *const *)x->lmh && x->bx.rmh == (void *const *)x->rmh);
    kvl_xfer_release(x);
    l = list(), r = list();
    KT_OK(kvl_dlist_add(l, B + 600 * KiB, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    KT_CHECK(x->nlregs == 1 && x->lmh[0] == (void *)(uintptr_t)(B + 512 * KiB));
    kvl_xfer_release(x);
    kvl_agent_destroy(a);
}

static void test_refused(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("refusals", &s, 0);
    kvl_dlist_t *l = list(), *r = list();
    kvl_xfer_t *x = (kvl_xfer_t *)&x;

    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(l, B + 64, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0 + 64, 128, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("block 1: local entry 1 has 64-byte blocks, remote entry 1 has 128-byte blocks");
    KT_ERROR_HAS("fix: paired blocks must have the same length");
    KT_CHECK(x == NULL && a->xfers == NULL);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add_strided(r, R0, 64, 3, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("the remote list has more blocks than the local list (2 paired so far)");
    KT_ERROR_HAS("fix: both lists must describe the same number of blocks");
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", l, NULL, &x),
              KVL_ERR_OUT_OF_BOUNDS); /* a local address is not the peer's */
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_READ, l, "peer", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("the local list has more blocks than the remote list (1 paired so far)");
    kvl_dlist_t *e1 = list(), *e2 = list();
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, e1, "peer", e2, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("the transfer moves nothing (empty lists)");
    kvl_dlist_destroy(e1);
    kvl_dlist_destroy(e2);
    kvl_dlist_clear(l);
    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, (kvl_xfer_op_t)7, l, "peer", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("transfer operation 7 is neither KVL_READ nor KVL_WRITE");
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "nobody", r, NULL, &x), KVL_ERR_NOT_FOUND);
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, NULL, "peer", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_xfer_create: NULL argument");
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, NULL), KVL_ERR_INVALID_ARG);

    /* the notification must fit */
    static char big[KVL_NOTIF_MAX + 1];
    kvl_xfer_params_t p = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = big,
                           .notif_len = KVL_NOTIF_MAX + 1};
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, &p, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("notification of 65537 bytes: NULL or larger than KVL_NOTIF_MAX (65536)");
    p.notif = NULL;
    p.notif_len = 1;
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, &p, &x), KVL_ERR_INVALID_ARG);
    /* nothing leaked by any refusal: every region back to the registry's reference */
    KT_CHECK(atomic_load(&a->regs[0]->objref) == 1 && a->xfers == NULL);
    KT_CHECK(atomic_load(&a->remotes->objref) == 1);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
}

static void test_params(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("params", &s, 0);
    kvl_dlist_t *l = list(), *r = list();
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));

    char note[] = "kv ready";
    kvl_xfer_params_t p = {.field_mask = KVL_XFER_PARAM_NOTIF | KVL_XFER_PARAM_TIMEOUT |
                                         KVL_XFER_PARAM_BACKEND,
                           .notif = note, .notif_len = 8, .timeout_ms = 42, .backend = "s1"};
    KT_OK(kvl_xfer_create(a, KVL_READ, l, "peer", r, &p, &x));
    note[0] = 'X'; /* a copy was taken */
    KT_CHECK(x->bx.notif_len == 8 && memcmp(x->bx.notif, "kv ready", 8) == 0);
    KT_CHECK(x->bx.notif != (const void *)note && x->bx.timeout_ms == 42 && x->bx.op == KVL_READ);
    kvl_xfer_release(x);
    /* an empty notification is still one; timeout 0 means the agent's */
    p = (kvl_xfer_params_t){.field_mask = KVL_XFER_PARAM_NOTIF | KVL_XFER_PARAM_TIMEOUT,
                            .notif = "", .notif_len = 0, .timeout_ms = 0};
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, &p, &x));
    KT_CHECK(x->bx.notif != NULL && x->bx.notif_len == 0 && x->bx.timeout_ms == a->timeout_ms);
    kvl_xfer_release(x);
    /* fields without their bit are not read */
    p = (kvl_xfer_params_t){.field_mask = 0, .notif = NULL, .notif_len = 5, .backend = "nope"};
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, &p, &x));
    KT_CHECK(x->bx.notif == NULL);
    kvl_xfer_release(x);
    p = (kvl_xfer_params_t){.field_mask = KVL_XFER_PARAM_BACKEND, .backend = "nope"};
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, &p, &x), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("backend 'nope' requested for the transfer is not created on agent 'params'");
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
}

/* Which backend moves it, and why each other one cannot. */
static void test_backend_choice(void)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    kt_stub_t vram_only, no_reach, absent, unreg, staged, direct;
    KT_OK(kvl_agent_create("chooser", &none, &a));
    kt_stub_attach(a, &vram_only, "vr", VRAM, DRAM, 0);
    kt_stub_attach(a, &no_reach, "nr", DRAM, VRAM, 0);
    kt_stub_attach(a, &absent, "ab", DRAM, DRAM, 0);
    kt_stub_attach(a, &unreg, "ur", DRAM, DRAM, 0);
    const char *on[] = {"nr", "ab"};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = on, .n_backends = 2};
    kvl_mem_desc_t d = {B, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, &rp, NULL));
    static const kvl_mem_desc_t rd[1] = {{0x100000, 0x1000, 0}};
    kt_rmd_t rm = {.name = "peer", .incarnation = 5, .start_ns = 1, .generation = 1,
                   .backends = {"vr", "nr", "ur"}, .n_backends = 3, .regions = rd, .n_regions = 1};
    kt_md_load(a, &rm);
    kvl_dlist_t *l = list(), *r = list();
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, 0x100000, 64, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, &x), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("no backend can move DRAM -> DRAM between agent 'chooser' and agent 'peer'");
    KT_ERROR_HAS("cause 1: [vr] KVL_ERR_UNSUPPORTED: does not serve local DRAM memory");
    KT_ERROR_HAS("cause 2: [nr] KVL_ERR_UNSUPPORTED: cannot reach remote DRAM memory");
    KT_ERROR_HAS("cause 3: [ab] KVL_ERR_UNSUPPORTED: peer not reachable: the remote agent has no "
                 "ab backend");
    HAS("cause 4: [ur] KVL_ERR_UNSUPPORTED: local region 0x%llx+4096 is not registered on it",
        ULL(B));
    KT_ERROR_HAS("fix: create a backend on both agents that serves both memory kinds");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    kvl_agent_destroy(a);

    /* VRAM on either side: backends that reach it directly before those
     * that stage it, whatever their order */
    KT_OK(kvl_agent_create("vram", &none, &a));
    kt_stub_attach(a, &staged, "stg", DRAM | VRAM, DRAM | VRAM, KVL_BK_CAP_STAGED_VRAM);
    kt_stub_attach(a, &direct, "dir", DRAM | VRAM, DRAM | VRAM, 0);
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    static const kvl_mem_kind_t kinds[2] = {KVL_MEM_VRAM, KVL_MEM_DRAM};
    static const kvl_mem_desc_t rd2[2] = {{0x100000, 0x1000, 0}, {0x200000, 0x1000, 0}};
    kt_rmd_t rm2 = {.name = "gpu", .incarnation = 6, .start_ns = 1, .generation = 1,
                    .backends = {"stg", "dir"}, .n_backends = 2, .regions = rd2, .kinds = kinds,
                    .n_regions = 2};
    kt_md_load(a, &rm2);
    kvl_dlist_t *rv;
    KT_OK(kvl_dlist_create(KVL_MEM_VRAM, 0, &rv));
    KT_OK(kvl_dlist_add(rv, 0x100000, 64, 0));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "gpu", rv, NULL, &x));
    KT_CHECK(x->bk == direct.bk);
    kvl_xfer_release(x);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(r, 0x200000, 64, 0)); /* DRAM both sides: the first one */
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "gpu", r, NULL, &x));
    KT_CHECK(x->bk == staged.bk);
    kvl_xfer_release(x);
    kvl_xfer_params_t p = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = "stg"};
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "gpu", rv, &p, &x)); /* staged when asked */
    KT_CHECK(x->bk == staged.bk);
    kvl_xfer_release(x);
    kvl_dlist_destroy(rv);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
}

/* n uniform entries of len bytes: local at B + i*len (reversed when asked),
 * remote at R0 + i*len. */
static void preps(kvl_agent_t *a, size_t n, uint64_t len, kvl_prep_t **lp, kvl_prep_t **rp)
{
    kvl_dlist_t *l = list(), *r = list();
    for (size_t i = 0; i < n; i++) {
        KT_OK(kvl_dlist_add(l, B + i * len, len, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, R0 + i * len, len, KVL_DEV_ANY));
    }
    KT_OK(kvl_prep_local(a, l, lp));
    KT_OK(kvl_prep_remote(a, "peer", r, rp));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
}

static void test_prepped(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("prepped", &s, 0);
    kvl_prep_t *lp, *rp;
    kvl_xfer_t *x = (kvl_xfer_t *)&x;
    preps(a, 4, 64, &lp, &rp);
    int64_t li[3] = {3, 0, 1}, ri[3] = {0, 1, 2};
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 3, NULL, &x));
    KT_CHECK(x->lidx == NULL && x->nsegs == 2 && x->blocks == 3); /* few pairs: segments */
    seg_is(&x->segs[0], B + 192, R0, 64, 1, 0, 0);
    seg_is(&x->segs[1], B, R0 + 64, 128, 1, 0, 0); /* 0,1 -> 1,2: coalesced */
    kvl_xfer_release(x);
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, NULL, rp, NULL, 4, NULL, &x));
    KT_CHECK(x->nsegs == 1 && x->segs[0].len == 256);
    kvl_xfer_release(x);
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, NULL, rp, ri, 3, NULL, &x));
    KT_CHECK(x->nsegs == 1 && x->segs[0].raddr == R0 && x->segs[0].len == 192);
    kvl_xfer_release(x);

    li[1] = 4;
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 3, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("local index 1 is 4; the prepared list has 4 entries");
    KT_CHECK(x == NULL);
    li[1] = 0;
    ri[2] = -1;
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 3, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("remote index 2 is -1; the prepared list has 4 entries");
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, NULL, rp, NULL, 5, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("local index 4 is 4; the prepared list has 4 entries");
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, NULL, lp, NULL, 4, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("the first prepared list must be local and the second remote");
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, rp, NULL, rp, NULL, 4, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, NULL, NULL, NULL, 4, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_xfer_create_prepped: NULL argument");
    kt_stub_t s2;
    kvl_agent_t *b = setup("other", &s2, 0);
    KT_STATUS(kvl_xfer_create_prepped(b, KVL_WRITE, lp, NULL, rp, NULL, 4, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_xfer_create_prepped: a prepared list belongs to another agent");
    kvl_agent_destroy(b);
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kvl_agent_destroy(a);
}

static void test_indexed(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("indexed", &s, KVL_BK_CAP_INDEXED);
    const size_t n = 300;
    kvl_prep_t *lp, *rp;
    kvl_xfer_t *x;
    kvl_error_t err;
    preps(a, n, 64, &lp, &rp);
    int64_t *li = malloc(n * sizeof(*li)), *ri = malloc(n * sizeof(*ri));
    for (size_t i = 0; i < n; i++) {
        li[i] = (int64_t)i;
        ri[i] = (int64_t)(n - 1 - i);
    }
    /* one pair short of KVLI_IDX_MIN: segments */
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, IDX_MIN - 1, NULL, &x));
    KT_CHECK(x->lidx == NULL && x->nsegs == IDX_MIN - 1 && x->bx.nidx == 0);
    kvl_xfer_release(x);

    /* KVLI_IDX_MIN pairs: indices, checked and copied, no segments */
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, IDX_MIN, NULL, &x));
    KT_CHECK(x->lidx != NULL && x->segs == NULL && x->nsegs == 0 && x->blocks == IDX_MIN);
    KT_CHECK(x->bx.nidx == IDX_MIN && x->bx.nsegs == 0 && x->bx.total_bytes == IDX_MIN * 64);
    KT_CHECK(x->bx.ltab == &lp->tab && x->bx.rtab == &rp->tab && lp->tab.n == n);
    KT_CHECK(x->bx.ridx == x->bx.lidx + IDX_MIN);
    KT_CHECK(x->bx.lidx[7] == 7 && x->bx.ridx[7] == n - 1 - 7);
    KT_CHECK(x->bx.ltab_cache == &lp->bk_cache[0] && x->bx.rtab_cache == &rp->bk_cache[0]);
    KT_CHECK(x->nlregs == lp->nregs && x->nrregs == rp->nregs);
    KT_CHECK(atomic_load(&lp->refs) == 2 && atomic_load(&rp->refs) == 2);
    kvl_xfer_stats_t st;
    KT_OK(kvl_xfer_get_stats(x, &st));
    KT_CHECK(st.blocks == IDX_MIN && st.segments == 0 && st.bytes == IDX_MIN * 64);
    /* pairing on request, once: reversed on one side, so one segment a pair */
    kvl_bk_ctx_t *c = &s.bk->ctx;
    KT_OK(c->xfer_expand(c, &x->bx, &err));
    KT_CHECK(x->nsegs == IDX_MIN && x->bx.segs == x->segs && x->bx.nsegs == IDX_MIN);
    for (size_t i = 0; i < IDX_MIN; i++)
        seg_is(&x->segs[i], B + 64 * i, R0 + 64 * (n - 1 - i), 64, 1, 0, 0);
    const kvl_seg_t *first = x->segs;
    KT_OK(c->xfer_expand(c, &x->bx, &err));
    KT_CHECK(x->segs == first);
    /* the lists outlive their owner's release while the transfer uses them */
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    KT_CHECK(atomic_load(&lp->refs) == 1 && a->preps == NULL);
    s.complete = 1;
    s.cache_tabs = 1;
    KT_OK(kvl_xfer_post(x));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE && lp->bk_cache[0] == &s);
    kvl_xfer_release(x); /* the last user: both lists freed, their caches released */
    KT_CHECK(s.ptab_releases == 2 && s.releases == 1);

    /* in order on both sides: expanded into one segment */
    preps(a, n, 64, &lp, &rp);
    KT_OK(kvl_xfer_create_prepped(a, KVL_READ, lp, li, rp, li, n, NULL, &x));
    KT_OK(c->xfer_expand(c, &x->bx, &err));
    KT_CHECK(x->nsegs == 1);
    seg_is(&x->segs[0], B, R0, 64 * n, 1, 0, 0);
    kvl_xfer_release(x);

    /* bad indices, named as on the other path */
    li[3] = (int64_t)n;
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, n, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("local index 3 is 300; the prepared list has 300 entries");
    li[3] = 3;
    ri[0] = -1;
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, n, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("remote index 0 is -1; the prepared list has 300 entries");
    /* high bits set, low half in range: still refused */
    ri[0] = ((int64_t)1 << 32) + 1;
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, n, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("remote index 0 is 4294967297; the prepared list has 300 entries");
    ri[0] = (int64_t)n - 1;
    KT_CHECK(atomic_load(&lp->refs) == 1 && a->xfers == NULL);
    kvl_prep_release(lp);
    kvl_prep_release(rp);

    /* lists of blocks of different lengths, or not uniform: segments */
    kvl_dlist_t *l = list(), *r = list();
    for (size_t i = 0; i < n; i++) {
        KT_OK(kvl_dlist_add(l, B + i * 64, i == 5 ? 32 : 64, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, R0 + i * 64, i == 5 ? 32 : 64, KVL_DEV_ANY));
    }
    KT_OK(kvl_prep_local(a, l, &lp));
    KT_OK(kvl_prep_remote(a, "peer", r, &rp));
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, li, n, NULL, &x));
    KT_CHECK(x->lidx == NULL && x->nsegs == 2 && x->bx.total_bytes == 64 * n - 32);
    kvl_xfer_release(x);
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);

    /* a backend that does not take indices: segments */
    a = setup("noindex", &s, 0);
    preps(a, n, 64, &lp, &rp);
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, n, NULL, &x));
    KT_CHECK(x->lidx == NULL && x->nsegs == n);
    kvl_xfer_release(x);
    kvl_agent_destroy(a); /* the preps with it */
    free(li);
    free(ri);
}

static void *complete_ok(void *arg)
{
    kt_stub_complete(arg, KVL_OK);
    return NULL;
}

/* Post, test, wait, cancel, repost, release. */
static void test_life(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("life", &s, 0);
    kvl_dlist_t *l = list(), *r = list();
    kvl_xfer_t *x;
    kvl_xfer_state_t state;
    kvl_xfer_stats_t st;
    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(l, B + 512 * KiB, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 128, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, &x), KVL_ERR_INVALID_ARG);
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R1, 64, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    kvli_region_t *l0 = x->lregs[0], *l1 = x->lregs[1];

    /* never posted */
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_STATE);
    KT_ERROR_HAS("transfer to agent 'peer' was never posted");
    KT_ERROR_HAS("fix: post it first (kvl_xfer_post)");
    KT_STATUS(kvl_xfer_wait(x, 0), KVL_ERR_STATE);
    KT_STATUS(kvl_xfer_cancel(x, &state), KVL_ERR_STATE);
    KT_ERROR_HAS("cancel: transfer to agent 'peer' was never posted");
    KT_CHECK(state == KVL_XFER_IDLE && s.cancels == 0);

    /* in flight: its regions cannot go, it cannot be posted twice */
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_POSTED && s.pending == &x->bx && s.posts == 1);
    KT_CHECK(atomic_load(&l0->inflight) == 1 && atomic_load(&l1->inflight) == 1);
    kvl_mem_desc_t d0 = {B, 256 * KiB, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_deregister(a, &d0, 1), KVL_ERR_IN_USE);
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_STATE);
    KT_ERROR_HAS("transfer to agent 'peer' is already in flight");
    KT_STATUS(kvl_xfer_test(x), KVL_IN_PROGRESS);
    KT_STATUS(kvl_xfer_wait(x, 0), KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("transfer to agent 'peer' not complete after 0 ms");
    KT_ERROR_HAS("fix: the transfer is still moving: wait again, or cancel it");
    KT_STATUS(kvl_xfer_wait(x, 30), KVL_ERR_TIMEOUT); /* a bounded wait runs out */
    KT_ERROR_HAS("not complete after 30 ms");
    KT_OK(kvl_xfer_get_stats(x, &st));
    KT_CHECK(st.duration_ns == 0);

    /* completed from another thread while we wait, however it interleaves */
    pthread_t t;
    KT_CHECK(pthread_create(&t, NULL, complete_ok, &s) == 0);
    KT_OK(kvl_xfer_wait(x, -1));
    KT_CHECK(pthread_join(t, NULL) == 0);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kt_stub_complete(&s, KVL_OK);
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE && atomic_load(&l0->inflight) == 0);
    KT_OK(kvl_xfer_test(x));
    KT_OK(kvl_xfer_wait(x, -1));
    KT_OK(kvl_xfer_get_stats(x, &st));
    KT_CHECK(strcmp(st.path, "stub-path") == 0 && st.bytes == 128 && st.segments == 2);
    /* cancelling what is done: it stays done */
    KT_OK(kvl_xfer_cancel(x, &state));
    KT_CHECK(state == KVL_XFER_DONE && s.cancels == 0 && s.posts == 2);

    /* again, and cancelled this time */
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_cancel(x, &state));
    KT_CHECK(state == KVL_XFER_CANCELED && s.cancels == 1 && s.pending == NULL);
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_CANCELED);
    KT_ERROR_HAS("transfer to agent 'peer' was cancelled");
    KT_CHECK(atomic_load(&l1->inflight) == 0);

    /* completing at once, inside the post */
    s.complete = 1;
    KT_OK(kvl_xfer_post(x));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE && s.posts == 4);

    /* failing: the backend's error, with the peer named */
    s.complete = 0;
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kt_stub_complete(&s, KVL_ERR_REMOTE_DISCONNECT);
    KT_STATUS(kvl_xfer_wait(x, 1000), KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS("stub s1: completed with KVL_ERR_REMOTE_DISCONNECT");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    KT_STATUS(kvl_xfer_cancel(x, &state), KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(state == KVL_XFER_ERROR);
    /* failing without saying why: the core says which backend */
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kvli_xfer_quiesce(x); /* what destroy and removal do: cancels */
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_CANCELED);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    s.pending = NULL;
    s.bk->ctx.xfer_done(&x->bx, KVL_ERR_SYSTEM, NULL);
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_SYSTEM);
    KT_ERROR_HAS("transfer failed in backend s1");

    /* refused by the backend: nothing in flight, an error state, post again */
    s.post_status = KVL_ERR_NO_MEMORY;
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_NO_MEMORY);
    KT_ERROR_HAS("stub s1: post refused");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_ERROR && atomic_load(&l0->inflight) == 0);
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_NO_MEMORY);
    s.post_status = KVL_OK;
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);

    /* released in flight: cancelled first, then the backend lets go of it */
    unsigned posts = s.posts;
    kvl_xfer_release(x);
    KT_CHECK(s.cancels == 3 && s.releases == 1 && s.posts == posts && a->xfers == NULL);
    KT_CHECK(atomic_load(&l0->objref) == 1 && atomic_load(&l0->inflight) == 0);

    KT_STATUS(kvl_xfer_post(NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_xfer_post: xfer is NULL");
    KT_STATUS(kvl_xfer_test(NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_xfer_wait(NULL, 0), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_xfer_cancel(NULL, &state), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_xfer_get_stats(NULL, &st), KVL_ERR_INVALID_ARG);
    KT_CHECK(kvl_xfer_state(NULL) == KVL_XFER_ERROR);
    kvl_xfer_release(NULL);
    kvl_agent_destroy(a);
}

/* What a transfer was built against changes before it is posted. */
static void test_stale(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("stale", &s, 0);
    kvl_dlist_t *l = list(), *r = list();
    KT_OK(kvl_dlist_add(l, B + 512 * KiB, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    kvl_xfer_t *x = make(a, l, r, NULL);
    l = list(), r = list();
    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    kvl_xfer_t *y = make(a, l, r, NULL);

    /* the local region went */
    kvl_mem_desc_t d1 = {B + 512 * KiB, 256 * KiB, KVL_DEV_ANY};
    KT_OK(kvl_mem_deregister(a, &d1, 1));
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_STATE);
    HAS("local region 0x%llx+262144 was deregistered since this transfer was created",
        ULL(B + 512 * KiB));
    KT_ERROR_HAS("fix: register the memory again and create a new transfer");
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_IDLE && s.posts == 0);

    /* the peer's metadata replaced (a new generation) */
    static const kvl_mem_desc_t rd[1] = {{0x100000, 0x100000, 0}};
    kt_rmd_t rm = {.name = "peer", .incarnation = 5, .start_ns = 1, .generation = 2,
                   .backends = {"s1"}, .n_backends = 1, .regions = rd, .n_regions = 1};
    kt_md_load(a, &rm);
    KT_STATUS(kvl_xfer_post(y), KVL_ERR_STALE);
    KT_ERROR_HAS("remote agent 'peer' (incarnation 0000000000000005) was removed or replaced "
                 "since this transfer was created");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0 && kvl_xfer_state(y) == KVL_XFER_IDLE);
    KT_CHECK(s.unpeers == 0); /* the old remote lives while transfers hold it */
    kvl_xfer_release(y);
    KT_CHECK(s.unpeers == 0);
    kvl_xfer_release(x);
    KT_CHECK(s.unpeers == 1);

    /* the peer removed while a transfer to it moves: cancelled */
    l = list(), r = list();
    KT_OK(kvl_dlist_add(l, B, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, R0, 64, KVL_DEV_ANY));
    x = make(a, l, r, NULL);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    KT_OK(kvl_remote_remove(a, "peer"));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_CANCELED && s.cancels == 1);
    KT_STATUS(kvl_xfer_wait(x, -1), KVL_ERR_CANCELED);
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_STALE);
    kvl_xfer_release(x);
    KT_CHECK(s.unpeers == 2);
    kvl_agent_destroy(a);
}

/* Tables derived when a list is prepared (ptab_prepare), not at its first
 * transfer: uniform lists only, on backends that take indexed transfers,
 * with the lists' region handles; the list's release hands them back. */
static void test_prepare_tabs(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("preptabs", &s, KVL_BK_CAP_INDEXED);
    kvl_prep_t *lp, *rp;
    s.prepare_tabs = 1;
    preps(a, 300, 64, &lp, &rp);
    KT_CHECK(s.ptab_prepares == 2 && s.prep_n == 300 && s.prep_remote == 1);
    KT_CHECK(s.prep_mh0 == (void *)(uintptr_t)0x100000); /* the remote region's handle */
    KT_CHECK(lp->bk_cache[0] == &s && rp->bk_cache[0] == &s);
    KT_CHECK(lp->tab.n == 300 && rp->tab.n == 300 && lp->tab.len == 64);
    /* a transfer of them finds the tables there */
    int64_t idx[256];
    for (size_t i = 0; i < 256; i++)
        idx[i] = (int64_t)(255 - i);
    kvl_xfer_t *x;
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, idx, rp, idx, 256, NULL, &x));
    KT_CHECK(*x->bx.ltab_cache == &s && *x->bx.rtab_cache == &s);
    kvl_xfer_release(x);
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    KT_CHECK(s.ptab_releases == 2);
    /* a local list: its region's handle */
    kvl_dlist_t *l = list();
    KT_OK(kvl_dlist_add(l, B + 64, 64, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, l, &lp));
    KT_CHECK(s.ptab_prepares == 3 && s.prep_remote == 0 && s.prep_mh0 == (void *)(uintptr_t)B);
    kvl_prep_release(lp);
    /* entries of two lengths: not uniform, nothing derived */
    KT_OK(kvl_dlist_add(l, B + 256, 128, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, l, &lp));
    KT_CHECK(s.ptab_prepares == 3 && lp->bk_cache[0] == NULL);
    kvl_prep_release(lp);
    kvl_dlist_destroy(l);
    kvl_agent_destroy(a);
    /* a backend that does not take indexed transfers is not asked */
    a = setup("preptabs0", &s, 0);
    preps(a, 300, 64, &lp, &rp);
    KT_CHECK(s.ptab_prepares == 0 && lp->bk_cache[0] == NULL);
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kvl_agent_destroy(a);
}

/* Index memory a backend lends (idx_alloc): the core checks and writes the
 * indices straight into it and gives it back when the transfer is freed,
 * also when the check refuses them. */
static void test_lent_idx(void)
{
    kt_stub_t s;
    kvl_agent_t *a = setup("lentidx", &s, KVL_BK_CAP_INDEXED);
    kvl_prep_t *lp, *rp;
    kvl_xfer_t *x;
    int64_t li[256], ri[256];
    preps(a, 300, 64, &lp, &rp);
    for (size_t i = 0; i < 256; i++) {
        li[i] = (int64_t)i;
        ri[i] = (int64_t)(299 - i);
    }
    s.lend_idx = 1;
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 256, NULL, &x));
    KT_CHECK(s.idx_allocs == 1 && s.idx_bytes == 2 * 256 * sizeof(uint32_t));
    KT_CHECK((void *)x->bx.lidx == s.idx_buf && x->bx.idx_cookie == &s);
    KT_CHECK(x->bx.ridx == x->bx.lidx + 256 && x->bx.lidx[9] == 9 && x->bx.ridx[9] == 290);
    kvl_xfer_release(x);
    KT_CHECK(s.idx_frees == 1);
    ri[100] = 300; /* out of range: refused, the memory goes back */
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 256, NULL, &x),
              KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("remote index 100 is 300");
    KT_CHECK(s.idx_allocs == 2 && s.idx_frees == 2);
    /* nothing lent: the core's own memory */
    s.lend_idx = 0;
    ri[100] = 0;
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 256, NULL, &x));
    KT_CHECK(x->bx.idx_cookie == NULL && x->bx.lidx != NULL && x->bx.ridx[100] == 0);
    kvl_xfer_release(x);
    KT_CHECK(s.idx_allocs == 2 && s.idx_frees == 2);
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kvl_agent_destroy(a);
}

/* Large arrays written into lent memory go around the cache (AVX2 streaming
 * stores where the CPU has them): every value, the unaligned head and the
 * tail, and every way an index can be bad, found wherever it sits. */
static void test_lent_idx_large(void)
{
    enum { N = 16384 * 2 + 13 }; /* past the streaming threshold, not a multiple of 8 */
    kt_stub_t s;
    kvl_agent_t *a = setup("lentbig", &s, KVL_BK_CAP_INDEXED);
    kvl_prep_t *lp, *rp;
    kvl_xfer_t *x;
    int64_t *li = malloc(N * sizeof(*li)), *ri = malloc(N * sizeof(*ri));
    KT_CHECK(li != NULL && ri != NULL);
    preps(a, 300, 64, &lp, &rp);
    for (size_t i = 0; i < N; i++) {
        li[i] = (int64_t)(i % 300);
        ri[i] = (int64_t)((i * 7919u) % 300);
    }
    s.lend_idx = 1;
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, N, NULL, &x));
    KT_CHECK((void *)x->bx.lidx == s.idx_buf && x->bx.ridx == x->bx.lidx + N);
    size_t wrong = 0;
    for (size_t i = 0; i < N; i++)
        wrong += x->bx.lidx[i] != (uint32_t)li[i] || x->bx.ridx[i] != (uint32_t)ri[i];
    KT_CHECK(wrong == 0);
    kvl_xfer_release(x);
    static const struct {
        size_t at;
        int64_t v;
        const char *msg;
    } bad[] = {
        {5, 300, "remote index 5 is 300"},                       /* before the aligned part */
        {20000, -1, "remote index 20000 is -1"},                 /* in a vector */
        {N - 2, (int64_t)1 << 32, "remote index 32779 is 4294967296"}, /* in the tail */
        {17, ((int64_t)1 << 32) + 3, "is 4294967299"},           /* high bits, low half fine */
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        int64_t keep = ri[bad[k].at];
        ri[bad[k].at] = bad[k].v;
        KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, N, NULL, &x),
                  KVL_ERR_INVALID_ARG);
        KT_ERROR_HAS(bad[k].msg);
        ri[bad[k].at] = keep;
    }
    KT_CHECK(s.idx_allocs == 5 && s.idx_frees == 5);
    free(li);
    free(ri);
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kvl_agent_destroy(a);
}

int main(void)
{
    uint8_t *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(m != MAP_FAILED);
    B = (uint64_t)(uintptr_t)m;
    test_pairing();
    test_refused();
    test_params();
    test_backend_choice();
    test_prepped();
    test_indexed();
    test_prepare_tabs();
    test_lent_idx();
    test_lent_idx_large();
    test_life();
    test_stale();
    munmap(m, 1 << 20);
    printf("test_xfer: passed\n");
    return 0;
}
