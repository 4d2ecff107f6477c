/*
 * Teardown safety. A child process exits without destroying its agent while
 * it has live registrations, a remote agent and transfers in flight: it must
 * exit cleanly (no abort, no crash, no sanitizer report). Then the same
 * state is destroyed explicitly, which must also be clean.
 */
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"

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
    printf("exit and destroy with live state: clean\n");
    return 0;
}
