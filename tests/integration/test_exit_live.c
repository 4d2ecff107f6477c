/*
 * Teardown safety. A child process exits without destroying its agent while
 * it has live registrations, a remote agent and transfers in flight: it must
 * exit cleanly (no abort, no crash, no sanitizer report). Then the same
 * state is destroyed explicitly, which must also be clean. Last, children
 * exit while one of their threads computes the HMACs that authenticate
 * peers (libcrypto): the crypto library must not be torn down under it.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/mac.h"

#define LEN (32u << 20)

static kvl_agent_t *busy_agent(kt_peer_t *p, kvl_xfer_t **x)
{
    kvl_agent_t *a = kt_agent("leaver", "shm", NULL);
    uint8_t *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_mem_desc_t d2 = {(uint64_t)(uintptr_t)buf, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d2, 1, NULL, NULL));
    kt_peer_opts_t o = {.name = "stayer", .len = LEN};
    kt_peer_start(p, &o, a);
    kvl_dlist_t *l, *r;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add_strided(l, d.addr, 8192, LEN / 8192, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add_strided(r, p->base, 8192, LEN / 8192, 4096, KVL_DEV_ANY));
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = "bye", .notif_len = 3};
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "stayer", r, &xp, x));
    kvl_prep_t *lp;
    KT_OK(kvl_prep_local(a, l, &lp)); /* left for destroy to release */
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    KT_CHECK(kvl_xfer_post(*x) >= 0);
    return a;
}

static atomic_uint g_macs;

/* What a progress thread does when a peer connects, without end. */
static void *mac_loop(void *arg)
{
    (void)arg;
    static const uint8_t key[32] = {1};
    uint8_t out[KVLI_MAC_LEN];
    kvli_mac_part_t part = {"nonce", 5};
    for (;;) {
        kvli_mac(key, sizeof(key), &part, 1, out);
        atomic_fetch_add(&g_macs, 1);
    }
    return NULL;
}

int main(void)
{
    /* 1. exit() with everything live */
    pid_t pid = fork();
    if (pid == 0) {
        kt_peer_t p;
        kvl_xfer_t *x;
        busy_agent(&p, &x);
        exit(0); /* no destroy; the peer child notices the pipe close */
    }
    int status;
    waitpid(pid, &status, 0);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* 2. destroy with everything live, then the peer sees a clean close */
    kt_peer_t p;
    kvl_xfer_t *x;
    kvl_agent_t *a = busy_agent(&p, &x);
    kvl_agent_destroy(a);
    kt_peer_stop(&p);

    /* 3. exit() while a thread is inside libcrypto: OpenSSL's own exit
     * handler would free its tables under that thread (a crash in most
     * runs when it is registered). */
    for (int i = 0; i < 10; i++) {
        pid = fork();
        if (pid == 0) {
            kvl_agent_t *m = kt_agent("macer", "shm", NULL);
            (void)m;
            pthread_t t;
            if (pthread_create(&t, NULL, mac_loop, NULL) != 0)
                _exit(3);
            while (atomic_load(&g_macs) < 100)
                sched_yield();
            exit(0);
        }
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            printf("child %d: %s %d\n", i, WIFSIGNALED(status) ? "killed by signal" : "exit",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    printf("exit and destroy with live state: clean\n");
    return 0;
}
