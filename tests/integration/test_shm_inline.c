/* shm: small transfers on a direct path (a shared mapping or cross-memory
 * attach) run in the poster's thread (issue 18): kvl_xfer_post returns
 * KVL_OK with the bytes in place and the notification sent, with the same
 * guarantees as the copy workers':
 *   1. a 4 KiB WRITE and READ, shareable and plain target memory: post says
 *      KVL_OK (done), the bytes are there, the notification follows them;
 *   2. order: a small WRITE posted while a large one is in flight does not
 *      overtake it (it is queued behind it: when the small one is done, so
 *      is the large one) and lands last in the bytes both touch;
 *   3. inline_max=0 hands everything to the workers; inline_max=64K leaves
 *      a 128 KiB WRITE to them too; inline_max=auto (the default) may run
 *      it either way (post never says KVL_OK for them is not asserted: a
 *      worker may be fast; the data and order are);
 *   4. a bad inline_max is refused, naming the parameter; auto is the
 *      default, and its bound is the measured hand-off delay times the
 *      measured copy rate, within [64 KiB, 1 MiB];
 *   5. after the target deregisters, an inline WRITE fails with the
 *      revocation's error and nothing lands (the guard table applies).
 * Nothing here depends on timing. */
#include <string.h>
#include "common/kvltest.h"
#include "backends/shm/shm.h"

#define BUF (8u << 20)

static kvl_xfer_t *one(kvl_agent_t *a, kvl_xfer_op_t op, uint64_t l, const char *to, uint64_t r,
                       uint64_t len, const char *notif)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    kvl_xfer_params_t p = {0};
    if (notif) {
        p.field_mask = KVL_XFER_PARAM_NOTIF;
        p.notif = notif;
        p.notif_len = strlen(notif);
    }
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add(ld, l, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(rd, r, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, op, ld, to, rd, notif ? &p : NULL, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static uint8_t *local_buf(kvl_agent_t *a)
{
    static uint8_t *buf;
    buf = aligned_alloc(4096, BUF);
    KT_CHECK(buf != NULL);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    return buf;
}

static void small_done_at_post(int shareable)
{
    kvl_agent_t *a = kt_agent("inl-init", "shm", NULL);
    uint8_t *buf = local_buf(a);
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "inl-target", .len = BUF, .shareable = shareable};
    kt_peer_start(&p, &o, a);
    void *md;
    size_t mdlen;
    KT_OK(kvl_metadata_get(a, &md, &mdlen));
    kt_peer_load(&p, md, mdlen);
    kvl_free(md);

    kt_fill(buf, 4096, 11);
    kvl_xfer_t *w = one(a, KVL_WRITE, (uint64_t)(uintptr_t)buf, p.name, p.base + 8192, 4096,
                        "inline-w");
    for (int i = 0; i < 3; i++) {
        KT_STATUS(kvl_xfer_post(w), KVL_OK); /* done before post returned */
        KT_CHECK(kvl_xfer_state(w) == KVL_XFER_DONE);
    }
    KT_CHECK(kt_peer_verify(&p, 8192, 4096, 11) == -1);
    char msg[64], from[64];
    for (int i = 0; i < 3; i++) {
        KT_CHECK(kt_peer_notif(&p, 10000, msg, sizeof(msg), from, sizeof(from)) == 8);
        KT_CHECK(memcmp(msg, "inline-w", 8) == 0 && strcmp(from, "inl-init") == 0);
    }
    kvl_xfer_stats_t st;
    KT_OK(kvl_xfer_get_stats(w, &st));
    KT_CHECK(strcmp(st.path, shareable ? "mmap" : "cma") == 0);
    kvl_xfer_release(w);

    /* READ back a different 4 KiB */
    kt_peer_fill(&p, 12);
    kvl_xfer_t *r = one(a, KVL_READ, (uint64_t)(uintptr_t)buf + 4096, p.name, p.base + 65536,
                        4096, NULL);
    KT_STATUS(kvl_xfer_post(r), KVL_OK);
    uint8_t ref[4096];
    kt_peer_read(&p, 65536, ref, sizeof(ref));
    KT_CHECK(memcmp(buf + 4096, ref, sizeof(ref)) == 0);
    kvl_xfer_release(r);

    /* 5: revoked by the target: the inline WRITE fails, nothing lands */
    KT_STATUS(kt_peer_dereg(&p, 13), KVL_OK);
    kvl_xfer_t *w2 = one(a, KVL_WRITE, (uint64_t)(uintptr_t)buf, p.name, p.base, 4096, NULL);
    kvl_status_t s = kvl_xfer_post(w2);
    if (s == KVL_IN_PROGRESS)
        s = kvl_xfer_wait(w2, 10000);
    KT_CHECK(s != KVL_OK);
    KT_CHECK(kt_peer_verify(&p, 0, 4096, 13) == -1);
    kvl_xfer_release(w2);
    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    free(buf);
}

/* 2 and 3: a small WRITE behind a large one over the same bytes. */
static void order(const char *params)
{
    kvl_agent_t *a = kt_agent("inl-order", "shm", params);
    uint8_t *buf = local_buf(a);
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "inl-order-t", .len = BUF};
    kt_peer_start(&p, &o, a);
    kt_fill(buf, BUF, 21);       /* the large WRITE: all of it */
    kt_fill(buf + BUF - 4096, 4096, 22); /* the small one's source: its own seed */
    kvl_xfer_t *big = one(a, KVL_WRITE, (uint64_t)(uintptr_t)buf, p.name, p.base, BUF - 4096,
                          NULL);
    kvl_xfer_t *small = one(a, KVL_WRITE, (uint64_t)(uintptr_t)buf + BUF - 4096, p.name,
                            p.base, 4096, NULL);
    kvl_xfer_t *mid = one(a, KVL_WRITE, (uint64_t)(uintptr_t)buf, p.name, p.base + 4096,
                          128 << 10, NULL);
    for (int round = 0; round < 20; round++) {
        kvl_status_t sb = kvl_xfer_post(big);
        KT_CHECK(sb == KVL_OK || sb == KVL_IN_PROGRESS);
        kvl_status_t ss = kvl_xfer_post(small);
        KT_CHECK(ss == KVL_OK || ss == KVL_IN_PROGRESS);
        if (ss == KVL_IN_PROGRESS)
            ss = kvl_xfer_wait(small, 30000);
        KT_STATUS(ss, KVL_OK);
        /* done after the large one, which was posted first */
        KT_CHECK(kvl_xfer_state(big) == KVL_XFER_DONE);
        KT_OK(kvl_xfer_wait(big, 30000));
        /* the small one's bytes won where both wrote */
        KT_CHECK(kt_peer_verify(&p, 0, 4096, 22) == -1);
        kvl_status_t sm = kvl_xfer_post(mid); /* 128 KiB: above a fixed 64K */
        if (sm == KVL_IN_PROGRESS)
            sm = kvl_xfer_wait(mid, 30000);
        KT_STATUS(sm, KVL_OK);
    }
    kvl_xfer_release(big);
    kvl_xfer_release(small);
    kvl_xfer_release(mid);
    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    free(buf);
}

static void bad_param(void)
{
    kvl_agent_t *a = kt_agent("inl-bad", NULL, NULL);
    kvl_param_t pr[] = {{"inline_max", "lots"}, {NULL, NULL}};
    KT_STATUS(kvl_backend_create(a, "shm", pr, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("parameter inline_max=\"lots\" is not auto or a byte count from 0 to 16M");
    kvl_param_t big[] = {{"inline_max", "32M"}, {NULL, NULL}};
    KT_STATUS(kvl_backend_create(a, "shm", big, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("inline_max=\"32M\"");
    kvl_param_t ok[] = {{"inline_max", "4K"}, {NULL, NULL}};
    KT_OK(kvl_backend_create(a, "shm", ok, 1, NULL));
    kvl_agent_destroy(a);
    a = kt_agent("inl-auto", NULL, NULL);
    kvl_param_t au[] = {{"inline_max", "auto"}, {NULL, NULL}};
    KT_OK(kvl_backend_create(a, "shm", au, 1, NULL));
    kvl_agent_destroy(a);
    const kvl_param_t *def = kvl_backend_params("shm");
    int seen = 0;
    for (; def != NULL && def->key != NULL; def++)
        if (strcmp(def->key, "inline_max") == 0)
            seen = strcmp(def->value, "auto") == 0;
    KT_CHECK(seen);
}

/* inline_max=auto: delay (ns) x rate (bytes per us), within [64 KiB, 1 MiB]. */
static void auto_bound(void)
{
    KT_CHECK(kvli_shm_inline_bound(0, 0) == 64u << 10);          /* nothing measured */
    KT_CHECK(kvli_shm_inline_bound(10000, 0) == 64u << 10);
    KT_CHECK(kvli_shm_inline_bound(10000, 20000) == 200000);     /* 10 us x 20 GB/s */
    KT_CHECK(kvli_shm_inline_bound(3000, 10000) == 64u << 10);   /* 30 KB: the floor */
    KT_CHECK(kvli_shm_inline_bound(100000, 100000) == 1u << 20); /* 10 MB: the cap */
    KT_CHECK(kvli_shm_inline_bound(UINT64_MAX, UINT64_MAX) == 1u << 20); /* no overflow */
    KT_CHECK(kvli_shm_inline_bound(UINT64_MAX, 1) == 1u << 20);
    KT_CHECK(kvli_shm_avg8(0, 80) == 80);                         /* the first sample */
    KT_CHECK(kvli_shm_avg8(80, 160) == 90);
    uint64_t avg = 0;
    for (int i = 0; i < 200; i++)
        avg = kvli_shm_avg8(avg, i == 0 ? 1000000 : 8000);       /* one outlier forgotten */
    KT_CHECK(avg >= 8000 && avg < 8100);
}

int main(void)
{
    small_done_at_post(1);
    small_done_at_post(0);
    order(NULL);
    order("inline_max=0");
    order("inline_max=64K");
    bad_param();
    auto_bound();
    printf("ok\n");
    return 0;
}
