/*
 * ucx backend: a WRITE that ends while its puts are still in flight keeps
 * its local (source) region in use until those puts end, as a READ keeps
 * the region its gets land in (test_ucx_read_linger, test_ucx_get_refused):
 * UCX may still read the region through its memory handle (the NIC, on
 * RDMA), which deregistering it unmaps, and send what it then holds.
 *
 * The target is stopped (SIGSTOP) before each WRITE is posted, over
 * UCX_TLS=tcp, so the puts issued cannot end until it is continued: nothing
 * here depends on timing. Three ways a WRITE ends with its puts out:
 *   timeout  - the WRITE (bound 1 s) times out waiting for its batch's flush;
 *   refused  - the test's ucp_put_nbx (KVL_TEST_INTERPOSE below: the ucx
 *              backend is a module loaded at run time, which --wrap cannot
 *              reach) refuses put 2048 of 4096, after 2047 went out;
 *   cancel   - kvl_xfer_cancel once the puts are going out: the backend
 *              waits for their flush, and gives up after the bound.
 * Each must fail saying the puts may still read the local regions; the
 * deregistration of the local region must then say in use; once the target
 * is continued the puts end and the deregistration goes through, after
 * which the region, rewritten, sends nothing more to the target. Before the
 * fix the deregistration went through at once (the test then prints how
 * many bytes written into the memory given back reached the target).
 *
 * The waits are hang guards, nothing is asserted on time. Skips (77) without
 * the ucx module.
 * KVL_TEST_INTERPOSE: ucp_put_nbx
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

#define BUF (32u << 20)
#define STRIDE 8192u
#define BLOCK 4096u
#define NPUTS (BUF / STRIDE)  /* 4096 puts of 4 KiB: one batch */
#define FAIL_AT 2048u         /* the refused one: 2047 issued before it */
#define UCS_ERR_NO_RESOURCE_ (-2) /* ucs_status_t, ABI-stable */
#define SENT 0x11             /* what the WRITEs send */
#define REUSED 0xee           /* written into the region once given back */

/* UCX's prototype with its handles as void * (this test builds without UCX's
 * headers; it skips when the module is missing). */
typedef void *(*kt_put_fn)(void *ep, const void *buffer, size_t count, uint64_t remote_addr,
                           void *rkey, const void *param);
void *ucp_put_nbx(void *ep, const void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param);

static kt_put_fn real_put;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static atomic_uint seen;      /* calls that reached this stand-in */
static atomic_uint armed_at;  /* 0: pass every call through; k: refuse the k-th */
static atomic_uint armed_calls;

static void find_real_put(void)
{
    void *sym = kt_ucx_real("ucp_put_nbx");
    memcpy(&real_put, &sym, sizeof(real_put));
}

void *ucp_put_nbx(void *ep, const void *buffer, size_t count, uint64_t remote_addr, void *rkey,
                  const void *param)
{
    unsigned k = atomic_load(&armed_at);
    atomic_fetch_add(&seen, 1);
    if (k != 0 && atomic_fetch_add(&armed_calls, 1) + 1 == k)
        return (void *)(intptr_t)UCS_ERR_NO_RESOURCE_;
    pthread_once(&real_once, find_real_put);
    return real_put(ep, buffer, count, remote_addr, rkey, param);
}

static kvl_xfer_t *strided_write(kvl_agent_t *a, uint64_t l, uint64_t r, uint64_t tmo)
{
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_TIMEOUT, .timeout_ms = tmo};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add_strided(ld, l, STRIDE, NPUTS, BLOCK, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(rd, r, STRIDE, NPUTS, BLOCK, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, ld, "target", rd, &xp, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    return x;
}

/* bytes of the blocks the WRITEs put at the target equal to v (the target
 * must be running; the gaps between them keep kt_peer_fill's pattern) */
static size_t target_has(kt_peer_t *p, uint8_t v)
{
    static uint8_t tb[BUF];
    size_t n = 0;
    kt_peer_read(p, 0, tb, BUF);
    for (size_t b = 0; b < NPUTS; b++)
        for (size_t i = 0; i < BLOCK; i++)
            n += tb[b * STRIDE + i] == v;
    return n;
}

static void nap_20ms(void)
{
    struct timespec nap = {0, 20000000};
    nanosleep(&nap, NULL);
}

/*
 * The WRITE just failed (text: its error) with the target stopped: its
 * local region must be in use until the puts end, then go, after which
 * nothing written into it reaches the target. Registers it again.
 */
static void check_lingers(const char *how, kvl_agent_t *a, kvl_mem_desc_t *d, uint8_t *buf,
                          kt_peer_t *p, const char *text)
{
    char dtext[4096] = "";
    int says = strstr(text, "puts still in flight may still read the local regions") != NULL;
    kvl_status_t st = kvl_mem_deregister(a, d, 1);
    kvl_error_render(NULL, dtext, sizeof(dtext));
    printf("%s: deregister while the target sleeps: %s\n%.500s\n", how, kvl_status_name(st),
           st == KVL_OK ? "" : dtext);
    if (st == KVL_OK) {
        /* what that costs: the memory given back is reused, the target
         * wakes, and what the puts still out read from it goes there */
        memset(buf, REUSED, BUF);
        kill(p->pid, SIGCONT);
        for (int i = 0; i < 100; i++)
            nap_20ms();
        printf("%s: deregistration went through with the puts out: %zu bytes written into the "
               "memory given back reached the target\n", how, target_has(p, REUSED));
    }
    KT_CHECK(says);
    KT_STATUS(st, KVL_ERR_IN_USE);
    KT_ERROR_HAS("the puts of a failed WRITE that may still read it");

    /* the target wakes, the puts end, the region can go */
    kill(p->pid, SIGCONT);
    int waits = 0;
    while ((st = kvl_mem_deregister(a, d, 1)) == KVL_ERR_IN_USE && waits++ < 3000)
        nap_20ms();
    KT_OK(st);
    memset(buf, REUSED, BUF);
    for (int i = 0; i < 50; i++) /* many turns of both sides' progress, then look */
        nap_20ms();
    size_t reached = target_has(p, REUSED);
    printf("%s: after deregistration (%d waits for the puts to end): %zu bytes written into the "
           "memory given back reached the target\n", how, waits, reached);
    KT_CHECK(reached == 0);
    memset(buf, SENT, BUF);
    KT_OK(kvl_mem_register(a, d, 1, NULL, NULL));
}

int main(void)
{
    kt_need_ucx();
    kvl_agent_t *a = kt_agent_tmo("initiator", "ucx", "tls=tcp", 60000);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    memset(buf, SENT, BUF);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .backend = "ucx", .params = "tls=tcp",
                        .timeout_ms = 60000};
    kt_peer_start(&p, &o, a);
    kt_peer_fill(&p, 9);

    /* warm-up, nothing refused: the connection is up, and the backend's
     * puts do come through this stand-in (else the test proves nothing) */
    kvl_xfer_t *x = strided_write(a, d.addr, p.base, 1000);
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 120000);
    KT_OK(st);
    size_t sent = target_has(&p, SENT);
    printf("warm-up WRITE: %u puts through the stand-in, %zu bytes at the target\n",
           atomic_load(&seen), sent);
    KT_CHECK(atomic_load(&seen) >= NPUTS);
    KT_CHECK(sent == (size_t)NPUTS * BLOCK);

    char text[4096] = "";

    /* timeout: the batch's flush cannot end while the target is stopped */
    kt_peer_stop_signal(&p);
    st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 120000);
    kvl_error_render(NULL, text, sizeof(text));
    printf("timeout: WRITE to the stopped target: %s\n%.700s\n", kvl_status_name(st), text);
    KT_STATUS(st, KVL_ERR_TIMEOUT);
    kvl_xfer_release(x);
    check_lingers("timeout", a, &d, buf, &p, text);
    x = strided_write(a, d.addr, p.base, 1000);

    /* refused: put FAIL_AT of the batch, the ones before it are out */
    kt_peer_stop_signal(&p);
    atomic_store(&armed_calls, 0);
    atomic_store(&armed_at, FAIL_AT);
    st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 120000);
    kvl_error_render(NULL, text, sizeof(text));
    printf("refused: WRITE with put %u of %u refused: %s (%u calls)\n%.700s\n", FAIL_AT, NPUTS,
           kvl_status_name(st), atomic_load(&armed_calls), text);
    KT_STATUS(st, KVL_ERR_REMOTE);
    KT_ERROR_HAS("ucp_put_nbx() = ");
    KT_CHECK(atomic_load(&armed_calls) == FAIL_AT); /* nothing issued after the refusal */
    atomic_store(&armed_at, 0);
    kvl_xfer_release(x);
    check_lingers("refused", a, &d, buf, &p, text);
    x = strided_write(a, d.addr, p.base, 1000);

    /* cancel: once the batch is going out; its flush cannot end, so the
     * cancel returns with the WRITE failed on its bound */
    kt_peer_stop_signal(&p);
    unsigned seen0 = atomic_load(&seen);
    st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    for (int i = 0; atomic_load(&seen) == seen0 && i < 3000; i++)
        nap_20ms();
    KT_CHECK(atomic_load(&seen) > seen0);
    kvl_xfer_state_t state = KVL_XFER_IDLE;
    st = kvl_xfer_cancel(x, &state);
    kvl_error_render(NULL, text, sizeof(text));
    printf("cancel: of the WRITE to the stopped target: %s, state %d\n%.700s\n",
           kvl_status_name(st), (int)state, text);
    KT_CHECK(state == KVL_XFER_ERROR);
    KT_STATUS(st, KVL_ERR_TIMEOUT);
    kvl_xfer_release(x);
    check_lingers("cancel", a, &d, buf, &p, text);

    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    munmap(buf, BUF);
    printf("test_ucx_write_linger: passed\n");
    return 0;
}
