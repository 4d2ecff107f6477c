/*
 * The cuda backend without a CUDA driver: what CI runs (no GPU there).
 * KVL_CUDA_DRIVER points at a library that does not exist, so this runs the
 * same on machines with a GPU. Checks: available() says no driver was found
 * and where it looked; creating the backend fails with that text; DRAM
 * registration and transfers keep working; a VRAM-declared registration
 * fails with that text; doctor's probe reports the driver check as failed.
 * When the toolkit's stub libcuda is installed, a child loads it and must
 * be told it is a stub, not a driver.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"

static int probe_fail;
static char probe_text[1024];

static void probe_cb(void *arg, const char *check, int status, const char *observed,
                     const char *hint)
{
    (void)arg;
    printf("  probe %-20s %d %s | %s\n", check, status, observed, hint);
    if (strcmp(check, "driver") == 0 && status == 2) {
        probe_fail = 1;
        snprintf(probe_text, sizeof(probe_text), "%s", observed);
    }
}

static int stub_child(const char *stub)
{
    char reason[1024];
    setenv("KVL_CUDA_DRIVER", stub, 1);
    kvl_status_t st = kvl_backend_available("cuda", reason, sizeof(reason));
    printf("  stub driver %s: %s: %s\n", stub, kvl_status_name(st), reason);
    if (st == KVL_OK)
        return 1;
    return strstr(reason, "stub") != NULL || strstr(reason, "cuInit") != NULL ? 0 : 1;
}

int main(void)
{
    static const char *stubs[] = {"/usr/local/cuda/lib64/stubs/libcuda.so",
                                  "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so"};
    char reason[1024], text[4096];
    int st;

    /* Children first: the driver is loaded once per process. */
    for (size_t i = 0; i < sizeof(stubs) / sizeof(stubs[0]); i++) {
        if (access(stubs[i], R_OK) != 0)
            continue;
        pid_t p = fork();
        if (p == 0)
            exit(stub_child(stubs[i]));
        waitpid(p, &st, 0);
        KT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        break;
    }

    setenv("KVL_CUDA_DRIVER", "/nonexistent/kvlane-test/libcuda.so.1", 1);
    KT_CHECK(kvl_backend_available("cuda", reason, sizeof(reason)) == KVL_ERR_NO_DEVICE);
    printf("available: %s\n", reason);
    KT_CHECK(strstr(reason, "no CUDA driver found") != NULL);
    KT_CHECK(strstr(reason, "dlopen(\"/nonexistent/kvlane-test/libcuda.so.1\")") != NULL);
    KT_CHECK(strstr(reason, "KVL_CUDA_DRIVER") != NULL);

    kvl_agent_t *a;
    KT_OK(kvl_agent_create("nodriver", NULL, &a));
    KT_STATUS(kvl_backend_create(a, "cuda", NULL, 0, NULL), KVL_ERR_NO_DEVICE);
    KT_ERROR_HAS("no CUDA driver found");
    KT_STATUS(kvl_backend_create(a, "cuda", NULL, 0, NULL), KVL_ERR_NO_DEVICE);

    /* DRAM keeps working: detection, registration, a transfer to a peer */
    size_t len = 1 << 20;
    char *buf = malloc(len);
    kt_fill(buf, len, 5);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY};
    kvl_reg_report_t *rep;
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    KT_CHECK(rep->entries[0].kind == KVL_MEM_DRAM);
    kvl_reg_report_free(rep);
    kt_peer_t peer;
    kt_peer_opts_t po = {.name = "nodriver-peer", .len = len};
    kt_peer_start(&peer, &po, a);
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, d.addr, len, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, peer.base, len, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, peer.name, r, NULL, &x));
    kvl_status_t ps = kvl_xfer_post(x);
    KT_CHECK(ps == KVL_OK || ps == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 10000));
    KT_CHECK(kt_peer_verify(&peer, 0, len, 5) == -1);
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kt_peer_stop(&peer);

    /* VRAM declared: refused, and the user is told there is no driver */
    char *other = malloc(len);
    kvl_mem_desc_t v = {(uint64_t)(uintptr_t)other, len, 0};
    kvl_reg_params_t vp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
    st = kvl_mem_register(a, &v, 1, &vp, NULL);
    kvl_error_render(NULL, text, sizeof(text));
    printf("VRAM registration (%s):\n%s\n", kvl_status_name(st), text);
    KT_CHECK(st != KVL_OK);
    KT_ERROR_HAS("no CUDA driver found");
    KT_ERROR_HAS("dlopen(");

    /* doctor's checks */
    KT_OK(kvl_backend_probe("cuda", probe_cb, NULL, KVL_MEM_VRAM, 0, 0));
    KT_CHECK(probe_fail);
    KT_CHECK(strstr(probe_text, "no CUDA driver found") != NULL);

    kvl_agent_destroy(a);
    free(buf);
    free(other);
    printf("test_cuda_nodriver: passed\n");
    return 0;
}
