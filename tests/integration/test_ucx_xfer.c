/*
 * ucx backend between two processes on this host, on UCX's default
 * transports (shared memory: sysv/posix/cma) and on UCX_TLS=tcp: WRITE and
 * READ, strided lists, notifications (attached and alone), cancel that tells
 * the truth, and a peer killed mid-transfer (an error naming it, within the
 * bound, never a hang). The same again with data_path=am: every byte through
 * active messages and bounce buffers, the protocol staged VRAM uses.
 * Skips (77) when the ucx module is not available.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define BUF (8u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static kvl_xfer_t *mk(kvl_agent_t *a, kvl_xfer_op_t op, uint64_t l, uint64_t lstride,
                      uint64_t r, uint64_t rstride, uint64_t count, uint64_t len,
                      const char *notif)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    kvl_xfer_params_t p = {0};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    if (count == 1) {
        KT_OK(kvl_dlist_add(ld, l, len, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(rd, r, len, KVL_DEV_ANY));
    } else {
        KT_OK(kvl_dlist_add_strided(ld, l, lstride, count, len, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add_strided(rd, r, rstride, count, len, KVL_DEV_ANY));
    }
    if (notif) {
        p.field_mask = KVL_XFER_PARAM_NOTIF;
        p.notif = notif;
        p.notif_len = strlen(notif);
    }
    KT_OK(kvl_xfer_create(a, op, ld, "target", rd, &p, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static void run_done(kvl_xfer_t *x)
{
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 20000));
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_DONE);
}

static void run_mode(const char *label, const char *params)
{
    printf("--- transports: %s\n", label);
    fflush(stdout);
    kvl_agent_t *a = kt_agent("initiator", "ucx", params);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .backend = "ucx", .params = params};
    kt_peer_start(&p, &o, a);
    uint64_t lb = d.addr;
    /* the peer loads our metadata so it can notify us back */
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(a, &blob, &blen));
    kt_peer_load(&p, blob, blen);
    kvl_free(blob);

    /* WRITE 1 MiB plain at offset 4096 */
    kt_fill(buf, BUF, 11);
    kvl_xfer_t *x = mk(a, KVL_WRITE, lb, 0, p.base + 4096, 0, 1, 1 << 20, NULL);
    run_done(x);
    kvl_xfer_stats_t s;
    KT_OK(kvl_xfer_get_stats(x, &s));
    printf("WRITE 1 MiB: backend %s path %s\n", s.backend, s.path);
    KT_CHECK(strcmp(s.backend, "ucx") == 0);
    /* data_path=am: through active messages and bounce buffers */
    KT_CHECK((params != NULL && strstr(params, "data_path=am") != NULL) ==
             (strstr(s.path, "ucp am") != NULL));
    KT_CHECK(kt_peer_verify(&p, 4096, 1 << 20, 11) == -1);
    kt_peer_fill(&p, 99); /* posting again moves the same bytes again */
    run_done(x);
    KT_CHECK(kt_peer_verify(&p, 4096, 1 << 20, 11) == -1);
    kvl_xfer_release(x);

    /* READ 2 MiB: the peer's pattern lands here */
    kt_peer_fill(&p, 5);
    memset(buf, 0, BUF);
    x = mk(a, KVL_READ, lb + 8192, 0, p.base, 0, 1, 2 << 20, NULL);
    run_done(x);
    {
        uint8_t *want = malloc(BUF);
        kt_fill(want, BUF, 5);
        KT_CHECK(memcmp(buf + 8192, want, 2 << 20) == 0);
        free(want);
    }
    kvl_xfer_release(x);

    /* strided WRITE: 300 blocks of 3000 B, stride 8192 here, 5000 there */
    kt_fill(buf, BUF, 21);
    kt_peer_fill(&p, 0);
    x = mk(a, KVL_WRITE, lb, 8192, p.base + 100, 5000, 300, 3000, NULL);
    run_done(x);
    {
        uint8_t *remote = malloc(300 * 5000);
        kt_peer_read(&p, 100, remote, 300 * 5000);
        for (int i = 0; i < 300; i++)
            KT_CHECK(memcmp(remote + (size_t)i * 5000, buf + (size_t)i * 8192, 3000) == 0);
        free(remote);
    }
    kvl_xfer_release(x);

    /* strided READ back into another layout */
    memset(buf, 0, BUF);
    x = mk(a, KVL_READ, lb + 4096, 4096, p.base + 100, 5000, 300, 3000, NULL);
    run_done(x);
    {
        uint8_t *remote = malloc(300 * 5000);
        kt_peer_read(&p, 100, remote, 300 * 5000);
        for (int i = 0; i < 300; i++)
            KT_CHECK(memcmp(remote + (size_t)i * 5000, buf + 4096 + (size_t)i * 4096, 3000) == 0);
        free(remote);
    }
    kvl_xfer_release(x);

    /* notification attached: it arrives after the data */
    kt_fill(buf, BUF, 33);
    x = mk(a, KVL_WRITE, lb, 0, p.base, 0, 1, 4 << 20, "kv-ready");
    run_done(x);
    char msg[64], from[64];
    KT_CHECK(kt_peer_notif(&p, 5000, msg, sizeof(msg), from, sizeof(from)) == 8);
    KT_CHECK(strcmp(msg, "kv-ready") == 0 && strcmp(from, "initiator") == 0);
    KT_CHECK(kt_peer_verify(&p, 0, 4 << 20, 33) == -1);
    kvl_xfer_release(x);

    /* notification alone, both ways */
    KT_OK(kvl_notif_send(a, "target", "hello", 5));
    KT_CHECK(kt_peer_notif(&p, 5000, msg, sizeof(msg), from, sizeof(from)) == 5);
    KT_CHECK(strcmp(msg, "hello") == 0);
    kt_peer_notify(&p, "initiator", "back");
    KT_OK(kvl_notif_wait(a, 5000));
    kvl_notif_t n;
    size_t got = 0;
    KT_OK(kvl_notif_poll(a, &n, 1, &got));
    KT_CHECK(got == 1 && n.len == 4 && memcmp(n.msg, "back", 4) == 0 &&
             strcmp(n.from, "target") == 0);
    kvl_notif_free(&n);

    /* cancel right after posting: CANCELED means no notification, ever;
     * DONE means it was delivered */
    x = mk(a, KVL_WRITE, lb, 4096, p.base, 4096, 2048, 2048, "cancel-probe");
    for (int i = 0; i < 5; i++) {
        kvl_xfer_state_t state;
        kvl_status_t st = kvl_xfer_post(x);
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        KT_OK(kvl_xfer_cancel(x, &state));
        KT_CHECK(state == KVL_XFER_CANCELED || state == KVL_XFER_DONE);
        long nl = kt_peer_notif(&p, state == KVL_XFER_DONE ? 5000 : 300, msg, sizeof(msg),
                                NULL, 0);
        printf("cancel %d: %s, notification %s\n", i,
               state == KVL_XFER_CANCELED ? "CANCELED" : "DONE", nl > 0 ? "delivered" : "none");
        KT_CHECK((state == KVL_XFER_DONE) == (nl > 0));
    }
    kvl_xfer_release(x);

    /* peer killed mid-transfer: an error naming it within the bound */
    x = mk(a, KVL_WRITE, lb, 4096, p.base, 4096, 2048, 2048, NULL);
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    kt_peer_kill(&p);
    double t0 = now_s();
    int failed = 0;
    for (int i = 0; i < 200 && !failed; i++) {
        st = kvl_xfer_wait(x, 10000);
        KT_CHECK(st != KVL_ERR_TIMEOUT); /* never still moving after the bound */
        if (st != KVL_OK) {
            failed = 1;
            break;
        }
        st = kvl_xfer_post(x);
        if (st < 0)
            failed = 1;
    }
    double dt = now_s() - t0;
    char text[4096];
    kvl_error_render(NULL, text, sizeof(text));
    printf("peer killed: failed after %.2f s: %s\n", dt, text);
    KT_CHECK(failed);
    KT_CHECK(dt < 3.0 + 4.0);   /* agent timeout 3 s, plus slack */
    KT_ERROR_HAS("target");
    kvl_xfer_release(x);
    kvl_agent_destroy(a);
    munmap(buf, BUF);
}

int main(void)
{
    kt_ucx_sanitizer_env();
    char reason[512];
    if (kvl_backend_available("ucx", reason, sizeof(reason)) != KVL_OK)
        KT_SKIP("ucx backend not available: %s", reason);
    printf("ucx: %s\n", reason);
    run_mode("UCX default (shared memory)", NULL);
    run_mode("UCX_TLS=tcp", "tls=tcp");
    /* the staged path VRAM takes when UCX cannot map it, here with DRAM */
    run_mode("UCX default, data_path=am", "data_path=am");
    run_mode("UCX_TLS=tcp, data_path=am", "tls=tcp,data_path=am");
    printf("PASS\n");
    return 0;
}
