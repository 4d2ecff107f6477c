/*
 * One agent used from 8 threads at once: each registers its own memory,
 * prepares and posts transfers, polls them, sends notifications and
 * deregisters, over and over. Run under ThreadSanitizer by the tsan suite.
 */
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include "common/kvltest.h"

#define THREADS 8
#define SLICE (256u << 10)
#define ROUNDS 12

static kvl_agent_t *agent;
static kt_peer_t peer;
static uint8_t *mem;

static void *worker(void *arg)
{
    long id = (long)arg;
    uint8_t *mine = mem + (size_t)id * SLICE;
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)mine, SLICE, KVL_DEV_ANY};
    for (int round = 0; round < ROUNDS; round++) {
        KT_OK(kvl_mem_register(agent, &d, 1, NULL, NULL));
        memset(mine, (int)(id * 16 + round), SLICE);
        kvl_dlist_t *l, *r;
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 8, &l));
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 8, &r));
        KT_OK(kvl_dlist_add_strided(l, d.addr, 4096, SLICE / 4096, 2048, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add_strided(r, peer.base + (uint64_t)id * SLICE, 4096, SLICE / 4096, 2048,
                                    KVL_DEV_ANY));
        kvl_prep_t *lp, *rp;
        KT_OK(kvl_prep_local(agent, l, &lp));
        KT_OK(kvl_prep_remote(agent, "peer", r, &rp));
        kvl_xfer_t *x;
        char note[32];
        snprintf(note, sizeof(note), "t%ld-r%d", id, round);
        kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = note,
                                .notif_len = strlen(note)};
        KT_OK(kvl_xfer_create_prepped(agent, round & 1 ? KVL_READ : KVL_WRITE, lp, NULL, rp, NULL, 1,
                                      &xp, &x));
        KT_CHECK(kvl_xfer_post(x) >= 0);
        kvl_status_t st;
        while ((st = kvl_xfer_test(x)) == KVL_IN_PROGRESS)
            ;
        KT_OK(st);
        if (round % 4 == 3) {
            kvl_xfer_state_t cs;
            KT_CHECK(kvl_xfer_post(x) >= 0);
            KT_OK(kvl_xfer_cancel(x, &cs));
        }
        kvl_xfer_release(x);
        kvl_prep_release(lp);
        kvl_prep_release(rp);
        kvl_dlist_destroy(l);
        kvl_dlist_destroy(r);
        KT_OK(kvl_notif_send(agent, "peer", note, strlen(note)));
        size_t n;
        kvl_notif_t got[4];
        KT_OK(kvl_notif_poll(agent, got, 4, &n));
        for (size_t i = 0; i < n; i++)
            kvl_notif_free(&got[i]);
        KT_OK(kvl_mem_deregister(agent, &d, 1));
        void *blob;
        size_t blen;
        KT_OK(kvl_metadata_get(agent, &blob, &blen));
        kvl_free(blob);
    }
    return NULL;
}

int main(void)
{
    agent = kt_agent("busy", "shm", NULL);
    mem = mmap(NULL, (size_t)THREADS * SLICE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    KT_CHECK(mem != MAP_FAILED);
    kt_peer_opts_t o = {.name = "peer", .len = (size_t)THREADS * SLICE};
    kt_peer_start(&peer, &o, agent);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        KT_CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    kt_peer_stop(&peer);
    kvl_agent_destroy(agent);
    munmap(mem, (size_t)THREADS * SLICE);
    printf("8 threads x %d rounds: ok\n", ROUNDS);
    return 0;
}
