/*
 * ucx backend: a flush UCX refuses (ucp_ep_flush_nbx returns an error
 * status) leaves nothing to wait on for the puts or gets it was to follow,
 * and the transfer's error says so, asking not to deregister its local
 * regions before that peer is unloaded:
 *   behind  - a put (a get) is refused in the middle of a batch, and the
 *             flush behind the ones issued before it is refused too
 *             ("the flush behind the puts issued before it could not go out
 *             either"; the READ form for gets);
 *   batch   - the flush of a whole batch of puts is refused ("the puts of
 *             the batch issued before it may still be in flight").
 * Each transfer must fail at once with KVL_ERR_REMOTE and that text, and the
 * next transfer to the same peer must succeed (nothing was left stuck).
 *
 * The test stands in for ucp_put_nbx, ucp_get_nbx and ucp_ep_flush_nbx
 * (KVL_TEST_INTERPOSE below: the ucx backend is a module loaded at run
 * time, which --wrap cannot reach): armed, the k-th put or get and the next
 * flush return UCS_ERR_NO_RESOURCE without calling UCX; every other call
 * goes to UCX's own. Nothing here depends on timing. Skips (77) without the
 * ucx module.
 * KVL_TEST_INTERPOSE: ucp_put_nbx ucp_get_nbx ucp_ep_flush_nbx
 * KVL_TEST_LABELS: ucx
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "common/kvltest.h"

#define BUF (8u << 20)
#define STRIDE 8192u
#define BLOCK 4096u
#define NOPS (BUF / STRIDE)  /* 1024 puts or gets of 4 KiB: one batch */
#define FAIL_AT 512u         /* the refused one: 511 issued before it */
#define UCS_ERR_NO_RESOURCE_ (-2) /* ucs_status_t, ABI-stable */

/* UCX's prototypes with their handles as void * (this test builds without
 * UCX's headers; it skips when the module is missing). */
typedef void *(*kt_put_fn)(void *ep, const void *buffer, size_t count, uint64_t remote_addr,
                           void *rkey, const void *param);
typedef void *(*kt_get_fn)(void *ep, void *buffer, size_t count, uint64_t remote_addr,
                           void *rkey, const void *param);
typedef void *(*kt_flush_fn)(void *ep, const void *param);
void *ucp_put_nbx(void *ep, const void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param);
void *ucp_get_nbx(void *ep, void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param);
void *ucp_ep_flush_nbx(void *ep, const void *param);

static kt_put_fn real_put;
static kt_get_fn real_get;
static kt_flush_fn real_flush;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static atomic_uint rma_seen;       /* puts and gets that reached the stand-ins */
static atomic_uint flush_seen;
static atomic_uint rma_armed_at;   /* 0: pass every call through; k: refuse the k-th */
static atomic_uint rma_calls;
static atomic_uint flush_armed;    /* 1: refuse the next flush (then 0) */
static atomic_uint flush_refused;

static void find_real(void)
{
    void *sym = kt_ucx_real("ucp_put_nbx");
    memcpy(&real_put, &sym, sizeof(real_put));
    sym = kt_ucx_real("ucp_get_nbx");
    memcpy(&real_get, &sym, sizeof(real_get));
    sym = kt_ucx_real("ucp_ep_flush_nbx");
    memcpy(&real_flush, &sym, sizeof(real_flush));
}

static int rma_refuse(void)
{
    unsigned k = atomic_load(&rma_armed_at);
    atomic_fetch_add(&rma_seen, 1);
    return k != 0 && atomic_fetch_add(&rma_calls, 1) + 1 == k;
}

void *ucp_put_nbx(void *ep, const void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param)
{
    if (rma_refuse())
        return (void *)(intptr_t)UCS_ERR_NO_RESOURCE_;
    pthread_once(&real_once, find_real);
    return real_put(ep, buffer, count, remote_addr, rkey, param);
}

void *ucp_get_nbx(void *ep, void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param)
{
    if (rma_refuse())
        return (void *)(intptr_t)UCS_ERR_NO_RESOURCE_;
    pthread_once(&real_once, find_real);
    return real_get(ep, buffer, count, remote_addr, rkey, param);
}

void *ucp_ep_flush_nbx(void *ep, const void *param)
{
    unsigned one = 1;
    atomic_fetch_add(&flush_seen, 1);
    if (atomic_compare_exchange_strong(&flush_armed, &one, 0)) {
        atomic_fetch_add(&flush_refused, 1);
        return (void *)(intptr_t)UCS_ERR_NO_RESOURCE_;
    }
    pthread_once(&real_once, find_real);
    return real_flush(ep, param);
}

static kvl_xfer_t *strided(kvl_agent_t *a, kvl_xfer_op_t op, uint64_t l, uint64_t r)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add_strided(ld, l, STRIDE, NOPS, BLOCK, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(rd, r, STRIDE, NOPS, BLOCK, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, op, ld, "target", rd, NULL, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static kvl_status_t run(kvl_xfer_t *x)
{
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 120000);
    return st;
}

/* One transfer with the armed refusals: fails with KVL_ERR_REMOTE, its
 * error has each of needles, one flush was refused; then the same transfer,
 * nothing refused, succeeds. */
static void refused(const char *how, kvl_xfer_t *x, unsigned rma_at, const char *n1,
                    const char *n2)
{
    char text[4096] = "";
    atomic_store(&rma_calls, 0);
    atomic_store(&flush_refused, 0);
    atomic_store(&rma_armed_at, rma_at);
    atomic_store(&flush_armed, 1);
    kvl_status_t st = run(x);
    atomic_store(&rma_armed_at, 0);
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s: %s (%u puts/gets, %u flush refused)\n%.900s\n", how, kvl_status_name(st),
           atomic_load(&rma_calls), atomic_load(&flush_refused), text);
    KT_STATUS(st, KVL_ERR_REMOTE);
    KT_ERROR_HAS(n1);
    KT_ERROR_HAS(n2);
    KT_CHECK(atomic_load(&flush_refused) == 1);
    if (rma_at != 0)
        KT_CHECK(atomic_load(&rma_calls) == rma_at); /* nothing issued after the refusal */
    atomic_store(&flush_armed, 0);
    st = run(x);
    printf("%s: the next one, nothing refused: %s\n", how, kvl_status_name(st));
    KT_OK(st);
}

int main(void)
{
    kt_need_ucx();
    kvl_agent_t *a = kt_agent_tmo("initiator", "ucx", "tls=tcp", 60000);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    memset(buf, 0x11, BUF);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .backend = "ucx", .params = "tls=tcp",
                        .timeout_ms = 60000};
    kt_peer_start(&p, &o, a);
    kt_peer_fill(&p, 9);
    kvl_xfer_t *w = strided(a, KVL_WRITE, d.addr, p.base);
    kvl_xfer_t *r = strided(a, KVL_READ, d.addr, p.base);

    /* warm-up, nothing refused: the backend's calls do come through the
     * stand-ins (else the test proves nothing) */
    KT_OK(run(w));
    KT_OK(run(r));
    printf("warm-up WRITE and READ: %u puts/gets, %u flushes through the stand-ins\n",
           atomic_load(&rma_seen), atomic_load(&flush_seen));
    KT_CHECK(atomic_load(&rma_seen) >= 2 * NOPS);
    KT_CHECK(atomic_load(&flush_seen) >= 2);

    refused("behind/WRITE", w, FAIL_AT, "ucp_put_nbx() = ",
            "the flush behind the puts issued before it could not go out either");
    refused("behind/READ", r, FAIL_AT, "ucp_get_nbx() = ",
            "the flush behind the gets issued before it could not go out either");
    refused("batch/WRITE", w, 0, "ucp_ep_flush_nbx() = ",
            "the puts of the batch issued before it may still be in flight");

    kvl_xfer_release(w);
    kvl_xfer_release(r);
    kt_peer_stop(&p);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    kvl_agent_destroy(a);
    munmap(buf, BUF);
    printf("test_ucx_flush_refused: passed\n");
    return 0;
}
