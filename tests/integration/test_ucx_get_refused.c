/*
 * ucx backend: a READ whose get UCX refuses in the middle of a batch
 * (ucp_get_nbx returns an error status for the k-th get, after earlier gets
 * of the batch were issued) keeps its local region in use until those
 * earlier gets end, as a READ that times out does (test_ucx_read_linger).
 *
 * The test stands in for ucp_get_nbx (KVL_TEST_INTERPOSE below: the ucx
 * backend is a module loaded at run time, which --wrap cannot reach): armed,
 * its K-th call returns UCS_ERR_NO_RESOURCE without calling UCX; every other
 * call goes to UCX's own. The target is stopped (SIGSTOP) before the READ
 * is posted, over UCX_TLS=tcp, so the K-1 gets issued before the refusal
 * cannot end until it is continued: nothing here depends on timing. The
 * READ must fail with KVL_ERR_REMOTE naming the refused get and saying the
 * gets issued may land yet; deregistering the local region must then say
 * in use; once the target is continued the gets end and the deregistration
 * goes through, after which the region, zeroed, stays zero. Before the fix
 * the READ failed without that wait: the deregistration went through at
 * once, and the K-1 gets landed in the memory given back when the target
 * woke (the test prints how many bytes).
 *
 * The waits are hang guards, nothing is asserted on time. Skips (77) without
 * the ucx module.
 * KVL_TEST_INTERPOSE: ucp_get_nbx
 * KVL_TEST_LABELS: ucx
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

#define BUF (16u << 20)
#define STRIDE 8192u
#define BLOCK 4096u
#define NGETS (BUF / STRIDE)  /* 2048 gets of 4 KiB: one batch */
#define FAIL_AT 1024u         /* the refused one: 1023 issued before it */
#define UCS_ERR_NO_RESOURCE_ (-2) /* ucs_status_t, ABI-stable */

/* UCX's prototype with its handles as void * (this test builds without UCX's
 * headers; it skips when the module is missing). */
typedef void *(*kt_get_fn)(void *ep, void *buffer, size_t count, uint64_t remote_addr,
                           void *rkey, const void *param);
void *ucp_get_nbx(void *ep, void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param);

static kt_get_fn real_get;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static atomic_uint seen;      /* calls that reached this stand-in */
static atomic_uint armed_at;  /* 0: pass every call through; k: refuse the k-th */
static atomic_uint armed_calls;

static void find_real_get(void)
{
    void *sym = kt_ucx_real("ucp_get_nbx");
    memcpy(&real_get, &sym, sizeof(real_get));
}

void *ucp_get_nbx(void *ep, void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param)
{
    unsigned k = atomic_load(&armed_at);
    atomic_fetch_add(&seen, 1);
    if (k != 0 && atomic_fetch_add(&armed_calls, 1) + 1 == k)
        return (void *)(intptr_t)UCS_ERR_NO_RESOURCE_;
    pthread_once(&real_once, find_real_get);
    return real_get(ep, buffer, count, remote_addr, rkey, param);
}

static kvl_xfer_t *strided_read(kvl_agent_t *a, uint64_t l, uint64_t r)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add_strided(ld, l, STRIDE, NGETS, BLOCK, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(rd, r, STRIDE, NGETS, BLOCK, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_READ, ld, "target", rd, NULL, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

static size_t nonzero(const uint8_t *b)
{
    size_t n = 0;
    for (size_t i = 0; i < BUF; i++)
        n += b[i] != 0;
    return n;
}

int main(void)
{
    kt_need_ucx();
    kvl_agent_t *a = kt_agent_tmo("initiator", "ucx", "tls=tcp", 60000);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .backend = "ucx", .params = "tls=tcp",
                        .timeout_ms = 60000};
    kt_peer_start(&p, &o, a);
    kt_peer_fill(&p, 9);
    kvl_xfer_t *x = strided_read(a, d.addr, p.base);

    /* warm-up, nothing refused: the connection is up, and the backend's
     * gets do come through this stand-in (else the test proves nothing) */
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 120000);
    KT_OK(st);
    printf("warm-up READ: %u gets through the stand-in, %zu bytes read\n", atomic_load(&seen),
           nonzero(buf));
    KT_CHECK(atomic_load(&seen) >= NGETS);
    KT_CHECK(nonzero(buf) > 0);

    /* the target stopped first: the gets issued before the refusal stay out */
    memset(buf, 0, BUF);
    kt_peer_stop_signal(&p);
    atomic_store(&armed_at, FAIL_AT);
    st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 120000);
    char text[4096] = "", dtext[4096] = "";
    kvl_error_render(NULL, text, sizeof(text));
    printf("READ with get %u of %u refused: %s (%u calls)\n%.700s\n", FAIL_AT, NGETS,
           kvl_status_name(st), atomic_load(&armed_calls), text);
    KT_STATUS(st, KVL_ERR_REMOTE);
    KT_ERROR_HAS("ucp_get_nbx() = ");
    KT_CHECK(atomic_load(&armed_calls) == FAIL_AT); /* nothing issued after the refusal */
    atomic_store(&armed_at, 0);
    int says_may_land = strstr(text, "may land yet") != NULL;
    kvl_xfer_release(x);

    /* the gets issued before the refusal are still out: in use */
    kvl_status_t dst = kvl_mem_deregister(a, &d, 1);
    kvl_error_render(NULL, dtext, sizeof(dtext));
    printf("deregister while the target sleeps: %s\n%.400s\n", kvl_status_name(dst),
           dst == KVL_OK ? "" : dtext);
    if (dst == KVL_OK) {
        /* what that costs: the target wakes, its answers land in memory
         * that is no longer registered */
        memset(buf, 0, BUF);
        kill(p.pid, SIGCONT);
        struct timespec nap = {0, 20000000};
        for (int i = 0; i < 100; i++)
            nanosleep(&nap, NULL);
        printf("deregistration went through with %u gets out: %zu bytes landed in the memory "
               "given back once the target woke\n", FAIL_AT - 1, nonzero(buf));
    }
    KT_CHECK(says_may_land);
    KT_STATUS(dst, KVL_ERR_IN_USE);
    KT_ERROR_HAS("the gets of a failed READ that may still land");

    /* the target wakes, the gets end, the region can go */
    kill(p.pid, SIGCONT);
    struct timespec nap = {0, 20000000};
    int waits = 0;
    while ((st = kvl_mem_deregister(a, &d, 1)) == KVL_ERR_IN_USE && waits++ < 3000)
        nanosleep(&nap, NULL);
    KT_OK(st);
    memset(buf, 0, BUF);
    /* a READ's bytes come in through the initiator's own UCX progress: give
     * it many turns, then look */
    for (int i = 0; i < 50; i++)
        nanosleep(&nap, NULL);
    size_t landed = nonzero(buf);
    printf("after deregistration (%d waits for the gets to end): %zu bytes landed in the "
           "memory given back\n", waits, landed);
    KT_CHECK(landed == 0);
    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    munmap(buf, BUF);
    printf("test_ucx_get_refused: passed\n");
    return 0;
}
