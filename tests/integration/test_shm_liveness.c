/* shm: how an initiator knows a cross-memory-attach target is alive before
 * each copy (shm_guard.c). A target of our uid holds a robust lock in the
 * guard table it shares; the initiator reads its word instead of polling a
 * pidfd per copy.
 *
 * 1. What the scheme rests on, checked on this kernel and C library: a
 *    process-shared robust mutex locked by a thread of another process reads
 *    that thread's id without FUTEX_OWNER_DIED while it lives, and reads
 *    FUTEX_OWNER_DIED once that process is killed (SIGKILL, reaped) or the
 *    thread ends on its own.
 * 2. End to end: a CMA target says it is checked through its lock, 4 KiB
 *    WRITEs land; once it is killed and reaped (its pid free for reuse), a
 *    WRITE to it fails and copies nothing anywhere.
 * No timing: every wait is for an event, bounded. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include "common/kvltest.h"

typedef struct {
    pthread_mutex_t m;
    volatile int ready;
    int keep;
} shared_t;

static void *hold(void *arg)
{
    shared_t *s = arg;
    if (pthread_mutex_lock(&s->m) != 0)
        _exit(3);
    __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
    while (s->keep)
        pause(); /* holds it until the process is killed */
    return NULL; /* ends holding it; the process lives on */
}

static uint32_t word(shared_t *s)
{
    return __atomic_load_n((uint32_t *)(void *)&s->m, __ATOMIC_ACQUIRE);
}

/* A child whose second thread locks the mutex; then it either sleeps until
 * killed (keep 1) or lets that thread end and sleeps (keep 0). */
static pid_t child(shared_t *s, int keep, int *pfd)
{
    int p[2];
    KT_CHECK(pipe(p) == 0);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        pthread_t t;
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
        if (getppid() == 1)
            _exit(5);
        if (pthread_create(&t, NULL, hold, s) != 0)
            _exit(2);
        if (!keep)
            pthread_join(t, NULL);
        while (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
            ;
        char c = 'r';
        if (write(p[1], &c, 1) != 1)
            _exit(4);
        for (;;)
            pause();
    }
    close(p[1]);
    char c;
    KT_CHECK(read(p[0], &c, 1) == 1); /* blocks until locked (or the child died) */
    *pfd = p[0];
    return pid;
}

static void contract(void)
{
    pthread_mutexattr_t at;
    shared_t *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
    KT_CHECK(s != MAP_FAILED);
    for (int keep = 1; keep >= 0; keep--) {
        memset(s, 0, sizeof(*s));
        s->keep = keep;
        KT_CHECK(pthread_mutexattr_init(&at) == 0);
        KT_CHECK(pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED) == 0);
        KT_CHECK(pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST) == 0);
        KT_CHECK(pthread_mutex_init(&s->m, &at) == 0);
        pthread_mutexattr_destroy(&at);
        int fd;
        pid_t pid = child(s, keep, &fd);
        uint32_t w = word(s);
        if (keep) {
            printf("1. held by a live thread: word 0x%08x\n", w);
            KT_CHECK((w & FUTEX_TID_MASK) != 0 && !(w & FUTEX_OWNER_DIED));
            KT_CHECK(kill(pid, SIGKILL) == 0);
            KT_CHECK(waitpid(pid, NULL, 0) == pid);
            w = word(s);
            printf("1. after SIGKILL and reaping: word 0x%08x\n", w);
        } else {
            printf("1. after the holding thread ended (process alive): word 0x%08x\n", w);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        KT_CHECK(w & FUTEX_OWNER_DIED);
        close(fd);
    }
    munmap(s, sizeof(*s));
}

static kvl_status_t write4k(kvl_agent_t *a, const char *to, uint64_t laddr, uint64_t raddr)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, laddr, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, raddr, 4096, KVL_DEV_ANY));
    kvl_status_t st = kvl_xfer_create(a, KVL_WRITE, l, to, r, NULL, &x);
    if (st == KVL_OK) {
        st = kvl_xfer_post(x);
        if (st == KVL_OK || st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 10000);
        kvl_xfer_release(x);
    }
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return st;
}

static void end_to_end(void)
{
    kvl_agent_t *a = kt_agent("liveness-init", "shm", NULL);
    size_t len = 1u << 20;
    uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kt_fill(buf, len, 7);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "liveness-target", .len = len}; /* not shareable: cma */
    kt_peer_start(&p, &o, a);
    char desc[512] = "";
    kvl_remote_describe(a, p.name, desc, sizeof(desc));
    printf("2. %s\n", desc);
    if (strstr(desc, "cma") == NULL) {
        printf("2. cross-memory attach is refused here; the lock is not used (end-to-end "
               "part skipped)\n");
        kt_peer_kill(&p);
    } else {
        KT_CHECK(strstr(desc, "target alive: its lock, read per copy") != NULL);
        for (int i = 0; i < 64; i++)
            KT_OK(write4k(a, p.name, d.addr + (uint64_t)i * 4096, p.base + (uint64_t)i * 4096));
        KT_CHECK(kt_peer_verify(&p, 0, 64 * 4096, 7) < 0);
        kt_peer_kill(&p); /* killed and reaped: its pid may now be anyone's */
        kvl_status_t st = write4k(a, p.name, d.addr, p.base);
        printf("2. a WRITE after the target was killed: %s: %s\n", kvl_status_name(st),
               kvl_last_error()->what);
        KT_CHECK(st == KVL_ERR_REMOTE_DISCONNECT);
    }
    KT_OK(kvl_mem_deregister(a, &d, 1));
    kvl_agent_destroy(a);
    munmap(buf, len);
}

int main(void)
{
    contract();
    end_to_end();
    printf("ok\n");
    return 0;
}
