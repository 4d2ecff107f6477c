/*
 * posix: a transfer posted again the moment it is seen done. The backend
 * keeps one state per transfer across postings, and its end of a posting
 * tells the core first (the caller may post again from then on) and lets
 * go of that state after. A re-post in between used to be undone by the
 * old posting's late "not running": cancel then returned with the transfer
 * still POSTED, and release freed it while its I/O ran (about once in
 * 10,000 rounds when left to chance). Here the core's completion call is
 * wrapped so that the backend lingers 5 ms after the first posting's end,
 * which opens that gap every round; the caller re-posts at once, lets the
 * linger pass, then cancels (it must not return POSTED) or releases (ASan
 * sees a use after free) while the second posting's 64 MiB still move.
 * On io_uring and on the thread pool. Nothing is asserted on time: with
 * the fix every wait here is the backend's own; without it the cancel finds
 * the transfer unlocked whenever the second posting outlives the linger.
 *
 * KVL_TEST_WRAP: kvli_xfer_ctx_done
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "kvlane/backend.h"

void __real_kvli_xfer_ctx_done(kvl_bk_xfer_t *x, kvl_status_t status, const kvl_error_t *err);
void __wrap_kvli_xfer_ctx_done(kvl_bk_xfer_t *x, kvl_status_t status, const kvl_error_t *err);

static atomic_int linger;   /* the next completions hold the backend 5 ms */
static atomic_uint wrapped; /* completions that went through the wrapper */

void __wrap_kvli_xfer_ctx_done(kvl_bk_xfer_t *x, kvl_status_t status, const kvl_error_t *err)
{
    int l = atomic_load(&linger); /* read first: the caller resets it once it sees the end */
    atomic_fetch_add(&wrapped, 1);
    __real_kvli_xfer_ctx_done(x, status, err);
    if (l) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

static void rounds(const char *engine, const char *dir)
{
    enum { N = 16, B = 4 << 20, ROUNDS = 12 };
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create("posix-repost", &cfg, &a));
    kvl_param_t p[] = {{"engine", engine}};
    KT_OK(kvl_backend_create(a, "posix", p, 1, NULL));
    char path[512];
    snprintf(path, sizeof(path), "%s/repost-%s.bin", dir, engine);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    KT_CHECK(fd >= 0);
    char *src = aligned_alloc(4096, N * B);
    KT_CHECK(src != NULL);
    kt_fill(src, N * B, 91);
    kvl_reg_params_t fp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    kvl_mem_desc_t dd = {(uint64_t)(uintptr_t)src, N * B, KVL_DEV_ANY}, fd_d = {0, N * B, fd};
    KT_OK(kvl_mem_register(a, &dd, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &fd_d, 1, &fp, NULL));
    kvl_dlist_t *l, *f;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, N, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, N, &f));
    for (uint64_t i = 0; i < N; i++) {
        KT_OK(kvl_dlist_add(l, (uintptr_t)src + i * B, B, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(f, (i * 5 % N) * B, B, fd));
    }
    unsigned before = atomic_load(&wrapped);
    for (int r = 0; r < ROUNDS; r++) {
        kvl_xfer_t *x;
        KT_OK(kvl_xfer_create(a, KVL_WRITE, l, kvl_agent_name(a), f, NULL, &x));
        atomic_store(&linger, 1); /* the first posting's end lingers */
        kvl_status_t st = kvl_xfer_post(x);
        while (st == KVL_IN_PROGRESS)
            st = kvl_xfer_test(x);
        KT_OK(st);
        atomic_store(&linger, 0);
        st = kvl_xfer_post(x); /* while the backend still holds the first */
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        struct timespec past = {0, 10000000}; /* the linger is over */
        nanosleep(&past, NULL);
        if (r % 2 == 0) {
            kvl_xfer_state_t s;
            kvl_xfer_cancel(x, &s);
            if (s == KVL_XFER_POSTED)
                fprintf(stderr, "%s round %d: cancel returned with the transfer POSTED\n",
                        engine, r);
            KT_CHECK(s == KVL_XFER_CANCELED || s == KVL_XFER_DONE);
        } else {
            KT_OK(kvl_xfer_wait(x, 60000));
        }
        kvl_xfer_release(x);
    }
    /* the wrapper was in the path: the test did what it says */
    KT_CHECK(atomic_load(&wrapped) - before >= ROUNDS);
    char *back = malloc(N * B);
    KT_CHECK(back != NULL);
    for (uint64_t i = 0; i < N; i++)
        KT_CHECK(pread(fd, back + i * B, B, (off_t)((i * 5 % N) * B)) == B);
    KT_CHECK(memcmp(back, src, N * B) == 0);
    free(back);
    printf("%s: %d rounds of 64 MiB, each re-posted while the last posting's end lingered: "
           "ok\n", engine, ROUNDS);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(f);
    kvl_agent_destroy(a);
    close(fd);
    unlink(path);
    free(src);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/kvl-repost-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    rounds("auto", dir);
    rounds("threads", dir);
    rmdir(dir);
    printf("test_posix_repost: passed\n");
    return 0;
}
