/*
 * A cancel from another thread while the transfer is being posted. The core
 * marks a transfer POSTED before the backend's post runs, and a backend
 * (posix building its file operations, cuda uploading its tables) takes
 * time before its cancel can find it: a cancel in between found nothing to
 * stop and returned with the transfer still POSTED (the transfer then ran to
 * its end, notification and all). The core now waits for the backend's post
 * before cancelling. Here the posix backend's queueing is wrapped to take
 * 100 ms, which opens that window every round; each round the other thread
 * cancels as soon as it sees POSTED, and must get CANCELED or DONE.
 * Nothing is asserted on time: the delay only opens the window.
 *
 * KVL_TEST_WRAP: kvli_posix_engine_queue
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/kvltest.h"

struct kvli_posix_iface;
struct kvli_posix_xpriv;
void __real_kvli_posix_engine_queue(struct kvli_posix_iface *iface, struct kvli_posix_xpriv *xp);
void __wrap_kvli_posix_engine_queue(struct kvli_posix_iface *iface, struct kvli_posix_xpriv *xp);

static atomic_int slow;
static atomic_uint queued;

void __wrap_kvli_posix_engine_queue(struct kvli_posix_iface *iface, struct kvli_posix_xpriv *xp)
{
    if (atomic_load(&slow)) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&queued, 1);
    __real_kvli_posix_engine_queue(iface, xp);
}

static void *poster(void *arg)
{
    kvl_xfer_t *x = arg;
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS || st == KVL_ERR_CANCELED);
    return NULL;
}

int main(void)
{
    enum { N = 16, B = 4096, ROUNDS = 8 };
    const char *t = getenv("TMPDIR");
    char dir[256], path[300];
    snprintf(dir, sizeof(dir), "%s/kvl-postcancel-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    snprintf(path, sizeof(path), "%s/f.bin", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    KT_CHECK(fd >= 0);
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = "posix"};
    KT_OK(kvl_agent_create("post-cancel", &cfg, &a));
    char *src = aligned_alloc(4096, N * B);
    KT_CHECK(src != NULL);
    kt_fill(src, N * B, 4);
    kvl_reg_params_t fp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    kvl_mem_desc_t dd = {(uint64_t)(uintptr_t)src, N * B, KVL_DEV_ANY}, df = {0, N * B, fd};
    KT_OK(kvl_mem_register(a, &dd, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &df, 1, &fp, NULL));
    kvl_dlist_t *l, *f;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, N, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, N, &f));
    for (uint64_t i = 0; i < N; i++) {
        KT_OK(kvl_dlist_add(l, (uintptr_t)src + i * B, B, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(f, (N - 1 - i) * B, B, fd));
    }
    struct timespec nap = {0, 100000};
    for (int r = 0; r < ROUNDS; r++) {
        kvl_xfer_t *x;
        KT_OK(kvl_xfer_create(a, KVL_WRITE, l, kvl_agent_name(a), f, NULL, &x));
        unsigned before = atomic_load(&queued);
        atomic_store(&slow, 1);
        pthread_t th;
        KT_CHECK(pthread_create(&th, NULL, poster, x) == 0);
        while (kvl_xfer_state(x) != KVL_XFER_POSTED)
            nanosleep(&nap, NULL);
        kvl_xfer_state_t s;
        kvl_xfer_cancel(x, &s);
        if (s == KVL_XFER_POSTED)
            fprintf(stderr, "round %d: cancel returned with the transfer POSTED\n", r);
        KT_CHECK(s == KVL_XFER_CANCELED || s == KVL_XFER_DONE);
        KT_CHECK(atomic_load(&queued) == before + 1); /* the backend had it: the window was open */
        KT_CHECK(pthread_join(th, NULL) == 0);
        atomic_store(&slow, 0);
        KT_CHECK(kvl_xfer_state(x) == s); /* nothing runs on after the cancel */
        kvl_xfer_release(x);
    }
    printf("%d rounds of a cancel while the backend was posting: ok\n", ROUNDS);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(f);
    kvl_agent_destroy(a);
    close(fd);
    unlink(path);
    rmdir(dir);
    free(src);
    printf("test_post_cancel: passed\n");
    return 0;
}
