/* shm: a dead peer costs nothing (issue 16, item 6). We load the metadata
 * of 20 peers with shareable (memfd) buffers, which maps each buffer here
 * and opens a socket and a pidfd to each; every peer is then killed. Once
 * each death is noticed, its socket, pidfd, mapping and guard table must be
 * given back, although the peer stays loaded (a transfer to it says
 * "disconnected"). Counted from /proc/self: no timing, bounded waits. */
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include "common/kvltest.h"

#define BUF (4u << 20)
#define PEERS 20

int main(void)
{
    kvl_agent_t *a = kt_agent("survivor", "shm", NULL);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    int fds0 = kt_count_fds(), maps0 = kt_count_maps("/memfd:");
    printf("before: %d fds, %d memfd mappings\n", fds0, maps0);

    kt_peer_t p[PEERS];
    char name[PEERS][32];
    for (int i = 0; i < PEERS; i++) {
        snprintf(name[i], sizeof(name[i]), "victim%d", i);
        kt_peer_opts_t o = {.name = name[i], .len = BUF, .shareable = 1};
        kt_peer_start(&p[i], &o, a); /* loads its metadata here: maps its buffer */
    }
    int fds1 = kt_count_fds(), maps1 = kt_count_maps("/memfd:");
    printf("with %d live peers: %d fds, %d memfd mappings\n", PEERS, fds1, maps1);
    KT_CHECK(maps1 >= maps0 + PEERS); /* the test sees what it is meant to */
    for (int i = 0; i < PEERS; i++)
        kt_peer_kill(&p[i]);

    /* wait (bounded) until every death was noticed and paid back */
    struct timespec nap = {0, 2000000};
    int fds2 = 0, maps2 = 0;
    for (int i = 0; i < 10000; i++) {
        fds2 = kt_count_fds();
        maps2 = kt_count_maps("/memfd:");
        if (fds2 <= fds0 && maps2 <= maps0)
            break;
        nanosleep(&nap, NULL);
    }
    printf("after the %d peers died: %d fds, %d memfd mappings\n", PEERS, fds2, maps2);
    KT_CHECK(fds2 <= fds0);
    KT_CHECK(maps2 <= maps0);

    /* they are still loaded, and say so */
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, d.addr, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, p[3].base, 4096, KVL_DEV_ANY));
    kvl_status_t st = kvl_xfer_create(a, KVL_WRITE, l, name[3], r, NULL, &x);
    if (st == KVL_OK) {
        st = kvl_xfer_post(x);
        if (st == KVL_OK || st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 10000);
        kvl_xfer_release(x);
    }
    printf("a transfer to a dead peer: %s: %s\n", kvl_status_name(st), kvl_last_error()->what);
    KT_CHECK(st == KVL_ERR_REMOTE_DISCONNECT || st == KVL_ERR_NO_BACKEND);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    kvl_agent_destroy(a);
    printf("ok\n");
    return 0;
}
