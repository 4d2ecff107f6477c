/*
 * kvlane shm backend: revoking peers' access to deregistered memory.
 *
 * Cross-memory attach and mapped memfds let an initiator write into our
 * memory without asking us, so deregistration alone cannot stop a peer that
 * still holds our old metadata. Each registered region gets a slot and a
 * generation (never reused); each accepted connection gets a guard table in
 * a sealed memfd we share with that initiator (sent with HELLO_ACK): slot s
 * holds {gen, busy}. Around every direct copy into or out of a region the
 * initiator does
 *     busy += 1; if gen != the generation in its key: busy -= 1, refuse;
 *     copy; busy -= 1
 * and before a region is dropped we do
 *     gen = 0 (every table); wait until busy == 0 (every live initiator)
 * (sequentially consistent atomics: either the initiator sees gen 0, or we
 * see its busy and wait for it). A dead initiator copies nothing, so its
 * busy is not waited for; a live one stuck with busy set for longer than
 * the backend's timeout makes the deregistration fail with KVL_ERR_IN_USE
 * (the region stays registered, access restored). The socket path needs no
 * guard: we copy ourselves, into registered memory only (ctx->region_pin).
 *
 * Liveness. Cross-memory attach names the target by pid, so before each
 * copy the initiator must know the target has not exited (its pid could be
 * someone else's by then). Polling a pidfd costs a system call per copy
 * (0.4-0.6 us on a VM, a third of a 4 KiB copy). Instead the last
 * KVLI_SHM_LIVE_SLOTS entries of each table hold a process-shared robust
 * mutex that the target's progress thread locks when it makes the table and
 * unlocks when the connection closes. When that thread ends, by exit, kill
 * or exec, the kernel marks the lock FUTEX_OWNER_DIED before the process can
 * be reaped, so before its pid can be reused: the lock's word holding a
 * thread id without that bit proves the target was alive when it was read,
 * as a pidfd poll would. An initiator trusts the word only from a target of
 * its own uid (one that could write to any of that uid's processes itself);
 * with another uid (allow_uids), a word of 0 (an older target, the table
 * closed, more than KVLI_SHM_LIVE_MAX tables) or the bit set, it polls the
 * pidfd as before.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include "common/errname.h"
#include "shm.h"

#define KVLI_SHM_GUARD_BYTES ((size_t)KVLI_SHM_GUARD_SLOTS * sizeof(kvli_shm_gslot_t))
#define KVLI_SHM_GUARD_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

_Static_assert(sizeof(pthread_mutex_t) <= KVLI_SHM_LIVE_SLOTS * sizeof(kvli_shm_gslot_t),
               "the liveness lock fits in the reserved guard slots");

static pthread_mutex_t *kvli_shm_live_lock(kvli_shm_gslot_t *map)
{
    return (pthread_mutex_t *)(void *)&map[KVLI_SHM_GUARD_REGIONS];
}

/* ---- target side: slots ---- */

kvl_status_t kvli_shm_guard_slot_get(kvli_shm_iface_t *iface, kvli_shm_mh_t *mh,
                                     kvl_error_t *err)
{
    uint32_t s;
    pthread_mutex_lock(&iface->lock);
    if (iface->slot_nfree > 0) {
        s = iface->slot_free[--iface->slot_nfree];
    } else if (iface->slot_next < KVLI_SHM_GUARD_REGIONS) {
        s = iface->slot_next++;
    } else {
        pthread_mutex_unlock(&iface->lock);
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, 0, KVLI_SHM_NAME, -1,
                         "register [0x%" PRIx64 ", +%" PRIu64 "): %u regions are already "
                         "registered on the shm backend, its most", mh->addr, mh->len,
                         KVLI_SHM_GUARD_REGIONS);
        kvl_bk_error_hint(err, "register fewer, larger regions (one per buffer, not per "
                          "block); deregister regions no longer used");
        return KVL_ERR_NO_MEMORY;
    }
    if (++iface->gen_next == 0)
        iface->gen_next = 1;
    mh->slot = s;
    mh->gen = iface->gen_next;
    iface->slot_gen[s] = mh->gen;
    for (kvli_shm_guard_t *g = iface->guards; g != NULL; g = g->next)
        atomic_store(&g->map[s].gen, mh->gen);
    pthread_mutex_unlock(&iface->lock);
    return KVL_OK;
}

void kvli_shm_guard_slot_put(kvli_shm_iface_t *iface, kvli_shm_mh_t *mh)
{
    pthread_mutex_lock(&iface->lock);
    iface->slot_gen[mh->slot] = 0;
    for (kvli_shm_guard_t *g = iface->guards; g != NULL; g = g->next)
        atomic_store(&g->map[mh->slot].gen, 0);
    iface->slot_free[iface->slot_nfree++] = mh->slot;
    pthread_mutex_unlock(&iface->lock);
}

/* Whether the initiator behind g has exited (then it copies nothing). */
static int kvli_shm_guard_owner_gone(const kvli_shm_guard_t *g)
{
    struct pollfd p = {g->pidfd, POLLIN, 0};
    if (g->pidfd >= 0)
        return poll(&p, 1, 0) == 1;
    return kill(g->pid, 0) != 0 && errno == ESRCH;
}

static void kvli_shm_guard_unref(kvli_shm_iface_t *iface, kvli_shm_guard_t *g)
{
    int last;
    pthread_mutex_lock(&iface->lock);
    last = --g->refs == 0;
    pthread_mutex_unlock(&iface->lock);
    if (!last)
        return;
    munmap(g->map, KVLI_SHM_GUARD_BYTES);
    if (g->pidfd >= 0)
        close(g->pidfd);
    free(g);
}

kvl_status_t kvli_shm_md_revoke(void *bk, void *mh_h, int revoke, kvl_error_t *err)
{
    kvli_shm_iface_t *iface = bk;
    kvli_shm_mh_t *mh = mh_h;
    kvli_shm_guard_t **held = NULL, *g;
    size_t n = 0, i;
    uint64_t start;
    kvl_status_t st = KVL_OK;

    pthread_mutex_lock(&iface->lock);
    iface->slot_gen[mh->slot] = revoke ? 0 : mh->gen;
    for (g = iface->guards; g != NULL; g = g->next)
        n++;
    if (revoke && n > 0)
        held = malloc(n * sizeof(*held));
    i = 0;
    for (g = iface->guards; g != NULL; g = g->next) {
        atomic_store(&g->map[mh->slot].gen, revoke ? 0 : mh->gen);
        if (held != NULL) {
            g->refs++;
            held[i++] = g;
        }
    }
    pthread_mutex_unlock(&iface->lock);
    if (!revoke || n == 0)
        return KVL_OK;
    if (held == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_SHM_NAME, -1,
                         "deregister [0x%" PRIx64 ", +%" PRIu64 "): out of memory while "
                         "revoking peers' access", mh->addr, mh->len);
        kvl_bk_error_hint(err, "the process is out of memory; retry the deregistration");
        kvli_shm_md_revoke(bk, mh, 0, NULL);
        return KVL_ERR_NO_MEMORY;
    }
    /* Copies in flight are short (one chunk); wait with a growing nap. */
    start = kvli_clock_ms(); /* only when a peer may be copying */
    for (i = 0; i < n && st == KVL_OK; i++) {
        long nap = 2000; /* ns */
        g = held[i];
        while (atomic_load(&g->map[mh->slot].busy) != 0 && !kvli_shm_guard_owner_gone(g)) {
            uint64_t waited = kvli_clock_ms() - start;
            if (waited > iface->timeout_ms) {
                kvl_bk_error_set(err, KVL_ERR_IN_USE, 0, KVLI_SHM_NAME, -1,
                                 "deregister [0x%" PRIx64 ", +%" PRIu64 "): agent '%s' (pid "
                                 "%d) has been copying into or out of it directly for %" PRIu64
                                 " ms; the region stays registered", mh->addr, mh->len,
                                 g->name, (int)g->pid, waited);
                kvl_bk_error_hint(err, "that agent is stopped or stuck in a transfer: wait "
                                  "for it or stop it, then deregister again");
                st = KVL_ERR_IN_USE;
                break;
            }
            struct timespec ts = {0, nap};
            nanosleep(&ts, NULL);
            if (nap < 1000000)
                nap *= 2;
        }
    }
    for (i = 0; i < n; i++)
        kvli_shm_guard_unref(iface, held[i]);
    free(held);
    if (st != KVL_OK)
        kvli_shm_md_revoke(bk, mh, 0, NULL);
    return st;
}

/* ---- target side: one table per accepted connection ---- */

/*
 * Lock the table's liveness lock in this thread, the progress thread, which
 * keeps it until the connection closes (kvli_shm_live_close) or the thread
 * ends. Best effort: a table without it reads 0 and its initiator polls.
 * The kernel walks at most 2048 robust locks of an exiting thread, hence
 * KVLI_SHM_LIVE_MAX.
 */
static void kvli_shm_live_open(kvli_shm_iface_t *iface, kvli_shm_guard_t *g)
{
    pthread_mutexattr_t at;
    pthread_mutex_t *m = kvli_shm_live_lock(g->map);
    if (iface->live_held >= KVLI_SHM_LIVE_MAX || pthread_mutexattr_init(&at) != 0)
        return;
    if (pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED) == 0 &&
        pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST) == 0 &&
        pthread_mutex_init(m, &at) == 0) {
        if (pthread_mutex_lock(m) == 0) {
            g->live = 1;
            g->owner = pthread_self();
            iface->live_held++;
        } else {
            pthread_mutex_destroy(m);
            memset(m, 0, sizeof(*m));
        }
    }
    pthread_mutexattr_destroy(&at);
}

/* Before the table is unmapped: unlock it in the thread that holds it (the
 * lock must leave that thread's robust list while mapped). Called by the
 * progress thread, or once it has ended (the lock then reads owner-dead). */
static void kvli_shm_live_close(kvli_shm_iface_t *iface, kvli_shm_guard_t *g)
{
    if (!g->live)
        return;
    g->live = 0;
    iface->live_held--;
    if (pthread_equal(g->owner, pthread_self()))
        pthread_mutex_unlock(kvli_shm_live_lock(g->map));
}

int kvli_shm_guard_open(kvli_shm_iface_t *iface, kvli_shm_conn_t *c, char *why, size_t cap)
{
    kvli_shm_guard_t *g = calloc(1, sizeof(*g));
    int fd = -1, e;
    if (g == NULL) {
        snprintf(why, cap, "calloc(%zu) failed", sizeof(*g));
        return -1;
    }
    fd = memfd_create("kvlane-shm-guard", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)KVLI_SHM_GUARD_BYTES) != 0 ||
        fcntl(fd, F_ADD_SEALS, KVLI_SHM_GUARD_SEALS) != 0) {
        e = errno;
        snprintf(why, cap, "%s = -1 %s (%s)", fd < 0 ? "memfd_create(guard table)"
                 : "ftruncate/F_ADD_SEALS(guard table)", kvli_errno_name(e), strerror(e));
        goto fail;
    }
    g->map = mmap(NULL, KVLI_SHM_GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g->map == MAP_FAILED) {
        e = errno;
        g->map = NULL;
        snprintf(why, cap, "mmap(guard table, %zu bytes) = -1 %s (%s)", KVLI_SHM_GUARD_BYTES,
                 kvli_errno_name(e), strerror(e));
        goto fail;
    }
    g->pid = c->cred_pid;
    g->pidfd = (int)syscall(SYS_pidfd_open, c->cred_pid, 0);
    kvli_shm_live_open(iface, g);
    snprintf(g->name, sizeof(g->name), "%s", c->name);
    g->refs = 1;
    pthread_mutex_lock(&iface->lock);
    for (uint32_t s = 0; s < iface->slot_next; s++)
        if (iface->slot_gen[s] != 0)
            atomic_store(&g->map[s].gen, iface->slot_gen[s]);
    g->next = iface->guards;
    iface->guards = g;
    pthread_mutex_unlock(&iface->lock);
    c->guard = g;
    return fd;
fail:
    if (fd >= 0)
        close(fd);
    free(g);
    return -1;
}

void kvli_shm_guard_close(kvli_shm_iface_t *iface, kvli_shm_conn_t *c)
{
    kvli_shm_guard_t *g = c->guard, **pp;
    if (g == NULL)
        return;
    c->guard = NULL;
    kvli_shm_live_close(iface, g);
    pthread_mutex_lock(&iface->lock);
    for (pp = &iface->guards; *pp != NULL; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    pthread_mutex_unlock(&iface->lock);
    kvli_shm_guard_unref(iface, g);
}

/* ---- initiator side ---- */

kvl_status_t kvli_shm_guard_attach(kvli_shm_peer_t *peer, int fd, kvl_error_t *err)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    void *map;
    /* A table the target could shrink under us would fault our copies. */
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != KVLI_SHM_GUARD_BYTES || seals < 0 ||
        (seals & KVLI_SHM_GUARD_SEALS) != KVLI_SHM_GUARD_SEALS) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, KVLI_SHM_NAME, -1,
                         "agent '%s' sent a guard table of %lld bytes with seals 0x%x; "
                         "expected %zu bytes sealed against resizing", peer->name,
                         (long long)st.st_size, (unsigned)seals, KVLI_SHM_GUARD_BYTES);
        kvl_bk_error_hint(err, "run the same kvlane version on both agents");
        return KVL_ERR_REMOTE;
    }
    map = mmap(NULL, KVLI_SHM_GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, e, KVLI_SHM_NAME, -1,
                         "mmap(guard table of agent '%s', %zu bytes) = -1 %s (%s)",
                         peer->name, KVLI_SHM_GUARD_BYTES, kvli_errno_name(e), strerror(e));
        kvl_bk_error_hint(err, "check the address-space limit (ulimit -v)");
        return KVL_ERR_SYSTEM;
    }
    peer->guard = map;
    /* Read instead of a pidfd poll only from a target of our own uid whose
     * socket is served by the pid we copy to (see the top of this file). */
    peer->live = peer->cred_uid == geteuid() && peer->cred_pid == peer->pid
                     ? (const uint32_t *)(const void *)kvli_shm_live_lock(map) : NULL;
    return KVL_OK;
}

int kvli_shm_guard_alive(const kvli_shm_peer_t *peer)
{
    if (peer->live == NULL)
        return -1;
    /* glibc's mutex word comes first: the owner's thread id, and the
     * kernel's owner-died bit once that thread ended */
    uint32_t w = __atomic_load_n(peer->live, __ATOMIC_ACQUIRE);
    if ((w & FUTEX_OWNER_DIED) || (w & FUTEX_TID_MASK) == 0)
        return -1;
    return 1;
}

void kvli_shm_guard_detach(kvli_shm_peer_t *peer)
{
    peer->live = NULL;
    if (peer->guard != NULL)
        munmap(peer->guard, KVLI_SHM_GUARD_BYTES);
    peer->guard = NULL;
}

int kvli_shm_guard_enter(kvli_shm_peer_t *peer, const kvli_shm_rh_t *rh)
{
    kvli_shm_gslot_t *g = &peer->guard[rh->slot];
    atomic_fetch_add(&g->busy, 1);
    if (atomic_load(&g->gen) == rh->gen)
        return 1;
    atomic_fetch_sub(&g->busy, 1);
    return 0;
}

void kvli_shm_guard_leave(kvli_shm_peer_t *peer, const kvli_shm_rh_t *rh)
{
    atomic_fetch_sub(&peer->guard[rh->slot].busy, 1);
}
