/*
 * ucx backend: a peer killed in the middle of a transfer ends it with an
 * error naming the peer, within the agent's bound, never a hang; on UCX's
 * default transports (shared memory: sysv/posix/cma) and on UCX_TLS=tcp,
 * each with data_path=rma and data_path=am. Skips (77) when the ucx module
 * is not available. WRITE, READ, strided lists, notifications, re-posting
 * and cancel on the same four paths are in the transfer contract
 * (test_contract.c).
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

/* 2048 blocks of 2 KiB, every 4 KiB on both sides */
static kvl_xfer_t *mk(kvl_agent_t *a, uint64_t l, uint64_t r)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add_strided(ld, l, 4096, 2048, 2048, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(rd, r, 4096, 2048, 2048, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, ld, "target", rd, NULL, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
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
    /* as in use: the peer holds our metadata too, the connection has
     * carried a transfer */
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(a, &blob, &blen));
    kt_peer_load(&p, blob, blen);
    kvl_free(blob);
    kt_fill(buf, BUF, 11);
    kvl_xfer_t *x = mk(a, d.addr, p.base);
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 20000));

    /* peer killed mid-transfer: an error naming it within the bound */
    st = kvl_xfer_post(x);
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
    kt_need_ucx();
    run_mode("UCX default (shared memory)", NULL);
    run_mode("UCX_TLS=tcp", "tls=tcp");
    /* the staged path VRAM takes when UCX cannot map it, here with DRAM */
    run_mode("UCX default, data_path=am", "data_path=am");
    run_mode("UCX_TLS=tcp, data_path=am", "tls=tcp,data_path=am");
    printf("PASS\n");
    return 0;
}
