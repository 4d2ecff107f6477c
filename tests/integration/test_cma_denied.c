/*
 * Cross-memory attach refused by the kernel: the target makes itself
 * non-dumpable and the initiator gives up CAP_SYS_PTRACE, as an engine in a
 * locked-down container would be. The initiator must say exactly why CMA is
 * refused (log, remote description, transfer path) and still move the bytes
 * over the socket fallback, in both directions.
 */
#include <linux/capability.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "common/kvltest.h"

static char logged[8192];

static void capture(kvl_log_level_t lvl, const char *comp, const char *msg, void *arg)
{
    (void)arg;
    if (lvl <= KVL_LOG_WARN) {
        size_t n = strlen(logged);
        snprintf(logged + n, sizeof(logged) - n, "[%s] %s\n", comp, msg);
    }
}

static int drop_ptrace(void)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0)
        return -1;
    d[0].effective &= ~(1u << CAP_SYS_PTRACE);
    d[0].permitted &= ~(1u << CAP_SYS_PTRACE);
    d[0].inheritable &= ~(1u << CAP_SYS_PTRACE);
    return (int)syscall(SYS_capset, &h, d);
}

int main(void)
{
    if (drop_ptrace() != 0)
        KT_SKIP("cannot drop CAP_SYS_PTRACE here (capset failed)");
    kvl_log_set_callback(capture, NULL);

    const size_t len = 4u << 20;
    kvl_agent_t *a = kt_agent("locked", "shm", NULL);
    uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));

    kt_peer_t p;
    kt_peer_opts_t o = {.name = "sealed", .len = len, .non_dumpable = 1};
    kt_peer_start(&p, &o, a);

    char desc[1024];
    kvl_remote_describe(a, "sealed", desc, sizeof(desc));
    printf("remote: %s", desc);
    printf("log: %s", logged);
    if (strstr(desc, "cma") != NULL && strstr(desc, "refused") == NULL)
        KT_SKIP("cross-memory attach still allowed after dropping CAP_SYS_PTRACE "
                "(kernel without ptrace access checks?)");
    KT_CHECK(strstr(desc, "socket") != NULL);
    KT_CHECK(strstr(desc, "refused") != NULL);
    KT_CHECK(strstr(desc, "EPERM") != NULL || strstr(desc, "Operation not permitted") != NULL);
    KT_CHECK(strstr(logged, "sealed") != NULL && strstr(logged, "socket") != NULL);

    /* WRITE and READ really move the bytes through the fallback */
    kt_fill(buf, len, 31);
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, d.addr, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, p.base, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "sealed", r, NULL, &x));
    KT_CHECK(kvl_xfer_post(x) >= 0);
    KT_OK(kvl_xfer_wait(x, 10000));
    kvl_xfer_stats_t s;
    KT_OK(kvl_xfer_get_stats(x, &s));
    printf("WRITE path: %s\n", s.path);
    KT_CHECK(strcmp(s.path, "socket") == 0);
    kvl_xfer_release(x);
    KT_CHECK(kt_peer_verify(&p, 0, len, 31) == -1);

    kt_peer_fill(&p, 32);
    KT_OK(kvl_xfer_create(a, KVL_READ, l, "sealed", r, NULL, &x));
    KT_CHECK(kvl_xfer_post(x) >= 0);
    KT_OK(kvl_xfer_wait(x, 10000));
    kvl_xfer_release(x);
    KT_CHECK(kt_verify(buf, len, 32) == -1);

    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kt_peer_stop(&p);
    kvl_agent_destroy(a);
    printf("cma denied: diagnosed and fell back to the socket path\n");
    return 0;
}
