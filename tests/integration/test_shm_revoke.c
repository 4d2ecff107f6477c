/* shm: after a deregistration returns, no byte from any peer lands in the
 * range (issue 16, item 2). Direct copies (cross-memory attach, mapped
 * memfds) go around the target, so the target revokes them through the
 * guard table it shares with each initiator (src/backends/shm/shm_guard.c).
 *
 * 1. Racing: this process WRITEs into the peer's buffer in a loop while the
 *    peer deregisters it and fills it with a new pattern. The deregistration
 *    succeeds, the first transfer after it fails with KVL_ERR_STALE naming
 *    the region, and the new pattern is intact: nothing landed afterwards.
 *    Rounds with cross-memory attach and with a shareable (memfd) buffer.
 * 2. A dead initiator does not block a deregistration: a peer WRITEs into
 *    our buffer in a loop and is killed mid-loop (its guard entry may stay
 *    busy); our deregistration must still succeed.
 * 3. Destroying the agent is a deregistration too: a peer WRITEs into our
 *    buffer in a loop, we destroy the agent and fill the buffer; the
 *    peer's loop ends with an error and the fill is intact.
 * Nothing here depends on timing: every wait is for an event, bounded. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include "common/kvltest.h"

#define BUF (4u << 20)
#define ROUNDS 12

typedef struct writer {
    kvl_agent_t *a;
    kvl_xfer_t *x;
    atomic_uint done_ok;
    kvl_status_t failed;             /* first failure */
    char what[1024];
    atomic_uint limit;               /* stop after this many successes (0: none) */
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    kvl_status_t st;
    for (;;) {
        unsigned lim = atomic_load(&w->limit);
        if (lim != 0 && atomic_load(&w->done_ok) >= lim)
            break; /* transfers kept succeeding after the deregistration */
        st = kvl_xfer_post(w->x);
        if (st == KVL_OK || st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(w->x, 20000);
        if (st != KVL_OK) {
            w->failed = st;
            snprintf(w->what, sizeof(w->what), "%s", kvl_last_error()->what);
            break;
        }
        atomic_fetch_add(&w->done_ok, 1);
    }
    return NULL;
}

static kvl_xfer_t *write_all(kvl_agent_t *a, uint64_t laddr, const char *to, uint64_t raddr)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    /* scattered 64 KiB blocks: many pieces per batch, as a KV cache moves */
    for (uint64_t off = 0; off < BUF; off += 128 << 10) {
        KT_OK(kvl_dlist_add(l, laddr + off, 64 << 10, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, raddr + (BUF - (128 << 10) - off), 64 << 10, KVL_DEV_ANY));
    }
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, to, r, NULL, &x));
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return x;
}

static void race_round(int shareable, unsigned round)
{
    kvl_agent_t *a = kt_agent("initiator", "shm", NULL);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kt_fill(buf, BUF, 7);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "target", .len = BUF, .shareable = shareable};
    kt_peer_start(&p, &o, a);

    writer_t w = {.a = a, .failed = KVL_OK};
    w.x = write_all(a, d.addr, "target", p.base);
    pthread_t th;
    KT_CHECK(pthread_create(&th, NULL, writer_main, &w) == 0);
    /* let some transfers complete first (counted, not timed), then a
     * varying number more each round so the deregistration lands at
     * different points of a transfer */
    while (atomic_load(&w.done_ok) < 2 + round % 3 && w.failed == KVL_OK)
        sched_yield();
    KT_CHECK(w.failed == KVL_OK);
    kvl_status_t st = kt_peer_dereg(&p, 1000 + round);
    KT_CHECK(st == KVL_OK);
    /* the writer stops at its first failure; without revocation it would
     * go on succeeding: give it a few transfers, then stop it */
    atomic_store(&w.limit, atomic_load(&w.done_ok) + 3);
    pthread_join(th, NULL);
    if (round == 0)
        printf("  %s: after %u transfers: %s: %s\n", shareable ? "memfd" : "cma",
               atomic_load(&w.done_ok), kvl_status_name(w.failed), w.what);
    KT_CHECK(w.failed == KVL_ERR_STALE);
    KT_CHECK(strstr(w.what, "deregistered its region") != NULL);
    /* the pattern written after the deregistration returned is intact */
    KT_CHECK(kt_peer_verify(&p, 0, BUF, 1000 + round) == -1);
    kvl_xfer_release(w.x);
    kt_peer_stop(&p);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    kvl_agent_destroy(a);
    munmap(buf, BUF);
}

/* An agent `name` with a 4 MiB buffer registered, and a peer `writer` that
 * WRITEs its buffer (pattern of seed) into ours in a loop; returns once
 * its bytes have arrived (a whole transfer landed). */
typedef struct looped {
    kvl_agent_t *a;
    uint8_t *buf;
    kvl_mem_desc_t d;
    kt_peer_t p;
} looped_t;

static void writer_looping(looped_t *l, const char *name, const char *writer, uint64_t seed)
{
    l->a = kt_agent(name, "shm", NULL);
    l->buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(l->buf != MAP_FAILED);
    memset(l->buf, 0, BUF);
    l->d = (kvl_mem_desc_t){(uint64_t)(uintptr_t)l->buf, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(l->a, &l->d, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = writer, .len = BUF};
    kt_peer_start(&l->p, &o, l->a);
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(l->a, &blob, &blen));
    kt_peer_load(&l->p, blob, blen);
    kvl_free(blob);
    kt_peer_fill(&l->p, seed);
    kt_peer_write_loop(&l->p, name, l->d.addr);
    uint8_t want[64];
    kt_fill(want, sizeof(want), seed);
    struct timespec nap = {0, 1000000};
    for (int i = 0; i < 30000 && memcmp(l->buf, want, sizeof(want)) != 0; i++)
        nanosleep(&nap, NULL); /* 30 s at most: a bound, not a measurement */
    KT_CHECK(memcmp(l->buf, want, sizeof(want)) == 0);
}

static void dead_initiator(void)
{
    looped_t l;
    writer_looping(&l, "target2", "writer", 99);
    kvl_agent_t *a = l.a;
    kvl_mem_desc_t d = l.d;
    uint8_t *buf = l.buf;
    kt_peer_t p = l.p;
    kt_peer_kill(&p); /* mid-loop: its guard entry may well stay busy */
    kvl_status_t st = kvl_mem_deregister(a, &d, 1);
    if (st != KVL_OK)
        printf("  deregister: %s\n", kvl_last_error()->what);
    KT_CHECK(st == KVL_OK);
    printf("  dead initiator: deregistration not blocked\n");
    kvl_agent_destroy(a);
    munmap(buf, BUF);
}

static void destroyed_under_writer(unsigned round)
{
    looped_t l;
    writer_looping(&l, "target3", "writer3", 98);
    kvl_agent_t *a = l.a;
    uint8_t *buf = l.buf;
    kt_peer_t p = l.p;
    kvl_agent_destroy(a); /* mid-loop */
    kt_fill(buf, BUF, 500 + round);
    /* the peer's loop ends with a failure, which it reports */
    uint64_t mlen;
    kvl_status_t *st = kt_recv_msg(p.from, &mlen, 30000);
    KT_CHECK(st != NULL && mlen == sizeof(*st) && *st != KVL_OK);
    if (round == 0)
        printf("  the writer's loop ended with %s\n", kvl_status_name(*st));
    free(st);
    KT_CHECK(kt_verify(buf, BUF, 500 + round) == -1);
    kt_peer_stop(&p);
    munmap(buf, BUF);
}

int main(void)
{
    printf("racing deregistration, cross-memory attach\n");
    for (unsigned r = 0; r < ROUNDS; r++)
        race_round(0, r);
    printf("racing deregistration, shareable (memfd) buffer\n");
    for (unsigned r = 0; r < ROUNDS; r++)
        race_round(1, r);
    printf("killed initiator\n");
    for (unsigned r = 0; r < 5; r++)
        dead_initiator();
    printf("agent destroyed under a writer\n");
    for (unsigned r = 0; r < 5; r++)
        destroyed_under_writer(r);
    printf("ok\n");
    return 0;
}
