/*
 * A transfer that fails when the process has no memory left to keep why
 * (src/core/xfer.c keeps a failure's kvl_error_t in an allocation made when
 * it fails): the failure is still reported, with its code, the backend and
 * the peer, and says the details were lost; once memory is there again the
 * next failure is described in full. Allocations of exactly
 * sizeof(kvl_error_t) are refused on demand through a wrapped malloc.
 *
 * KVL_TEST_WRAP: malloc
 */
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);

static atomic_int refuse_errors; /* malloc(sizeof(kvl_error_t)) returns NULL */
static atomic_uint refused;

void *__wrap_malloc(size_t n)
{
    if (n == sizeof(kvl_error_t) && atomic_load(&refuse_errors)) {
        atomic_fetch_add(&refused, 1);
        return NULL;
    }
    return __real_malloc(n);
}

int main(void)
{
    uint8_t *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(m != MAP_FAILED);
    uint64_t b = (uint64_t)(uintptr_t)m;
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create("nomem", &none, &a));
    kt_stub_t s;
    const uint32_t dram = KVL_MEM_BIT(KVL_MEM_DRAM);
    kt_stub_attach(a, &s, "s1", dram, dram, 0);
    kvl_mem_desc_t d = {b, 1 << 20, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    static const kvl_mem_desc_t rd[1] = {{0x100000, 0x100000, 0}};
    kt_rmd_t rm = {.name = "peer", .incarnation = 5, .start_ns = 1, .generation = 1,
                   .backends = {"s1"}, .n_backends = 1, .regions = rd, .n_regions = 1};
    kt_md_load(a, &rm);
    kvl_dlist_t *l, *r;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, b, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, 0x100000, 4096, KVL_DEV_ANY));
    kvl_xfer_t *x;
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, &x));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    KT_CHECK(x->err == NULL); /* nothing kept until it fails */

    /* completed with an error, no memory to keep it */
    atomic_store(&refuse_errors, 1);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kt_stub_complete(&s, KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(atomic_load(&refused) >= 1 && x->err == NULL);
    KT_STATUS(kvl_xfer_wait(x, 1000), KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS("transfer to agent 'peer' failed in backend s1; its details were lost "
                 "(no memory to keep them)");
    KT_ERROR_HAS("fix: the process is out of memory: free memory, then post the transfer again");
    KT_CHECK(strcmp(kvl_last_error()->backend, "s1") == 0);
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_REMOTE_DISCONNECT); /* asked again: the same */
    KT_ERROR_HAS("its details were lost");

    /* refused at post, no memory to keep why: the caller still gets it whole */
    s.post_status = KVL_ERR_NO_MEMORY;
    KT_STATUS(kvl_xfer_post(x), KVL_ERR_NO_MEMORY);
    KT_ERROR_HAS("stub s1: post refused");
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_ERROR && x->err == NULL);
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_NO_MEMORY); /* later: what is left */
    KT_ERROR_HAS("its details were lost");
    s.post_status = KVL_OK;

    /* memory again: the next failure is kept in full, and stays */
    atomic_store(&refuse_errors, 0);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kt_stub_complete(&s, KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(x->err != NULL);
    KT_STATUS(kvl_xfer_wait(x, 1000), KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS("stub s1: completed with KVL_ERR_REMOTE_DISCONNECT");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);

    /* a later failure without memory reuses what it has: still in full */
    atomic_store(&refuse_errors, 1);
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kt_stub_complete(&s, KVL_ERR_SYSTEM);
    KT_STATUS(kvl_xfer_wait(x, 1000), KVL_ERR_SYSTEM);
    KT_ERROR_HAS("stub s1: completed with KVL_ERR_SYSTEM");
    atomic_store(&refuse_errors, 0);

    /* and it still moves */
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    kt_stub_complete(&s, KVL_OK);
    KT_OK(kvl_xfer_wait(x, 1000));
    kvl_xfer_release(x);
    kvl_agent_destroy(a);
    munmap(m, 1 << 20);
    printf("test_xfer_nomem: passed\n");
    return 0;
}
