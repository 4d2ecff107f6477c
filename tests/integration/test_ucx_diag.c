/*
 * ucx backend diagnoses, each reproduced:
 *   (a) UCX_NET_DEVICES naming a device that does not exist (mlx5_7:1),
 *       with a fake sysfs tree that lists it but has no /dev node;
 *   (b) UCX_TLS naming no transport UCX has, and UCX_TLS leaving the two
 *       agents no common transport;
 *   (c) a locked-memory limit below the registration (what UCX really does
 *       here: tcp and shared memory do not pin, so it registers and says so);
 *   (d) VRAM offered to a UCX without GPU support by a core that lends no
 *       staging copies (through the module ABI): both reasons, DRAM still ok;
 *   (e) RDMA devices listed in sysfs without /dev/infiniband nodes
 *       (src/common/rdma_diag.c on fake trees).
 * Each names the device or transport, quotes UCX's status and log, and
 * gives the fix; under policy "any" with shm present the region registers
 * and the report carries UCX's reason.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <kvlane/backend.h>
#include "common/kvltest.h"
#include "common/rdma_diag.h"

static char g_tmp[256];

static void mkfile(const char *rel, const char *content)
{
    char path[512], cmd[700];
    snprintf(path, sizeof(path), "%s/%s", g_tmp, rel);
    snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\"", path);
    KT_CHECK(system(cmd) == 0);
    FILE *f = fopen(path, "w");
    KT_CHECK(f != NULL);
    fputs(content, f);
    fclose(f);
}

static void mkdir_p(const char *rel)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/%s'", g_tmp, rel);
    KT_CHECK(system(cmd) == 0);
}

/* (e) fake trees: mlx5_0 listed with uverbs0 missing from dev; mlx5_1 fine;
 * mlx5_7 listed but no uverbs device at all. */
static void fake_trees(void)
{
    mkdir_p("sys/class/infiniband/mlx5_0");
    mkdir_p("sys/class/infiniband/mlx5_1");
    mkdir_p("sys/class/infiniband/mlx5_7");
    mkfile("sys/class/infiniband_verbs/uverbs0/ibdev", "mlx5_0\n");
    mkfile("sys/class/infiniband_verbs/uverbs1/ibdev", "mlx5_1\n");
    mkfile("dev/infiniband/rdma_cm", "");
    mkfile("dev/infiniband/uverbs1", "");
    char v[300];
    snprintf(v, sizeof(v), "%s/sys", g_tmp);
    setenv("KVL_SYSFS_ROOT", v, 1);
    snprintf(v, sizeof(v), "%s/dev", g_tmp);
    setenv("KVL_DEV_ROOT", v, 1);
}

static void test_rdma_diag(void)
{
    kvli_rdma_scan_t s;
    char text[4096];
    printf("--- (e) sysfs lists RDMA devices, /dev/infiniband lacks their nodes\n");
    kvli_rdma_diag_scan(&s);
    KT_CHECK(s.n == 3);
    KT_CHECK(s.n_broken == 2);
    KT_CHECK(kvli_rdma_diag_render(&s, text, sizeof(text)) == 2);
    printf("%s\n", text);
    KT_CHECK(strstr(text, "mlx5_0 is listed") != NULL);
    KT_CHECK(strstr(text, "/dev/infiniband/uverbs0 does not exist") != NULL);
    KT_CHECK(strstr(text, "rdma_cm") != NULL);          /* what the dir holds */
    KT_CHECK(strstr(text, "mlx5_7 is listed") != NULL && strstr(text, "ib_uverbs") != NULL);
    KT_CHECK(strstr(text, "mlx5_1") == NULL);            /* the good one is not blamed */
    kvli_rdma_diag_explain(&s, "mlx5_9:1", text, sizeof(text));
    printf("%s\n", text);
    KT_CHECK(strstr(text, "mlx5_9:1 is not listed") != NULL && strstr(text, "mlx5_1") != NULL);
    /* no /dev/infiniband at all */
    char v[300];
    snprintf(v, sizeof(v), "%s/nodev", g_tmp);
    setenv("KVL_DEV_ROOT", v, 1);
    kvli_rdma_diag_scan(&s);
    KT_CHECK(s.n_broken == 3 && !s.dev_dir_present);
    kvli_rdma_diag_render(&s, text, sizeof(text));
    KT_CHECK(strstr(text, "the directory is missing") != NULL);
    snprintf(v, sizeof(v), "%s/dev", g_tmp);
    setenv("KVL_DEV_ROOT", v, 1);
}

static uint8_t *region(size_t len)
{
    uint8_t *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(b != MAP_FAILED);
    return b;
}

static const kvl_reg_outcome_t *outcome(const kvl_reg_report_t *rep, const char *bk)
{
    for (unsigned i = 0; i < rep->entries[0].n_outcomes; i++)
        if (strcmp(rep->entries[0].outcomes[i].backend, bk) == 0)
            return &rep->entries[0].outcomes[i];
    return NULL;
}

static void test_net_devices(void)
{
    printf("--- (a) UCX_NET_DEVICES=mlx5_7:1 (listed in fake sysfs, no uverbs node)\n");
    setenv("UCX_NET_DEVICES", "mlx5_7:1", 1);
    kvl_agent_t *a = kt_agent("diag-a", "shm", NULL);
    KT_OK(kvl_backend_create(a, "ucx", NULL, 0, NULL));
    unsetenv("UCX_NET_DEVICES");
    uint8_t *b = region(1 << 20);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)b, 1 << 20, KVL_DEV_ANY};
    kvl_reg_report_t *rep;
    /* policy any: shm takes it, the report carries UCX's reason */
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    char text[8192];
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    const kvl_reg_outcome_t *o = outcome(rep, "ucx");
    KT_CHECK(o != NULL && o->status == KVL_ERR_NO_DEVICE);
    KT_CHECK(strstr(o->detail, "mlx5_7:1") != NULL);
    KT_CHECK(strstr(o->detail, "is not available") != NULL);   /* UCX's own words */
    KT_CHECK(outcome(rep, "shm") != NULL && outcome(rep, "shm")->status == KVL_OK);
    kvl_reg_report_free(rep);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    /* ucx only: the error says it all */
    const char *only[] = {"ucx"};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = only, .n_backends = 1};
    /* one cause: the core reports NO_BACKEND carrying ucx's NO_DEVICE */
    KT_STATUS(kvl_mem_register(a, &d, 1, &rp, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("KVL_ERR_NO_DEVICE");
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s\n", text);
    KT_ERROR_HAS("mlx5_7:1");
    KT_ERROR_HAS("UCX_NET_DEVICES");
    KT_ERROR_HAS("Success");                /* ucp_init's status: UCX went on without it */
    KT_ERROR_HAS("is not available");
    KT_ERROR_HAS("ucx_info -d");            /* the fix */
    KT_ERROR_HAS("infiniband_verbs");       /* rdma_diag: listed, no uverbs device */
    kvl_agent_destroy(a);
    munmap(b, 1 << 20);
}

/* Issue 17 item 1: no diagnosis is cut, in the error nor in the report row. */
static void test_not_cut(void)
{
    printf("--- (a2) UCX_NET_DEVICES=mlx5_0:1 (listed, its /dev node missing): nothing cut\n");
    setenv("UCX_NET_DEVICES", "mlx5_0:1", 1);
    kvl_agent_t *a = kt_agent("diag-a2", "shm", NULL);
    KT_OK(kvl_backend_create(a, "ucx", NULL, 0, NULL));
    unsetenv("UCX_NET_DEVICES");
    uint8_t *b = region(1 << 20);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)b, 1 << 20, KVL_DEV_ANY};
    kvl_reg_report_t *rep;
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    char text[16384];
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    const kvl_reg_outcome_t *o = outcome(rep, "ucx");
    KT_CHECK(o != NULL && o->status == KVL_ERR_NO_DEVICE);
    /* the explanation to its last words, and the fix after it */
    KT_CHECK(strstr(o->detail, "--device=/dev/infiniband/uverbs0) or leave it out of "
                               "UCX_NET_DEVICES") != NULL);
    KT_CHECK(strstr(o->detail, "; fix: ") != NULL);
    KT_CHECK(strstr(o->detail, "ucx_info -d") != NULL);
    kvl_reg_report_free(rep);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    const char *only[] = {"ucx"};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = only, .n_backends = 1};
    KT_STATUS(kvl_mem_register(a, &d, 1, &rp, NULL), KVL_ERR_NO_BACKEND);
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s\n", text);
    KT_ERROR_HAS("--device=/dev/infiniband/uverbs0) or leave it out of UCX_NET_DEVICES");
    KT_ERROR_HAS("ucx_info -d");
    kvl_agent_destroy(a);
    munmap(b, 1 << 20);
}

static void test_tls(void)
{
    char text[8192];
    printf("--- (b1) UCX_TLS=rc (not in this UCX)\n");
    setenv("UCX_TLS", "rc", 1);
    kvl_agent_t *a = kt_agent("diag-b", "", NULL);
    kvl_status_t st = kvl_backend_create(a, "ucx", NULL, 0, NULL);
    unsetenv("UCX_TLS");
    KT_CHECK(st == KVL_ERR_NO_DEVICE);
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s\n", text);
    KT_ERROR_HAS("ucp_init() = No such device");
    KT_ERROR_HAS("transport 'rc' is not available");
    KT_ERROR_HAS("UCX_TLS=rc");
    KT_ERROR_HAS("UCX_TLS names transports this UCX does not have");
    kvl_agent_destroy(a);

    printf("--- (b1') the tls parameter names the missing transport (issue 17, item 5)\n");
    a = kt_agent("diag-b1p", "", NULL);
    kvl_param_t tp[] = {{"tls", "rcx"}};
    st = kvl_backend_create(a, "ucx", tp, 1, NULL);
    KT_CHECK(st == KVL_ERR_NO_DEVICE);
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s\n", text);
    KT_ERROR_HAS("tls=rcx (backend parameter; UCX_TLS=(unset))");
    KT_ERROR_HAS("the backend parameter tls names transports this UCX does not have");
    KT_CHECK(strstr(text, "set it to transports") == NULL); /* not blamed on the variable */
    kvl_agent_destroy(a);

    printf("--- (b2) this side UCX_TLS=tcp, the peer only shared memory\n");
    kt_peer_t p;
    kt_peer_opts_t o = {.name = "sm-only", .len = 1 << 20, .backend = "ucx", .params = "tls=sm"};
    kt_peer_start(&p, &o, NULL);
    size_t blen;
    void *blob = kt_peer_metadata(&p, &blen);
    a = kt_agent("diag-b2", "ucx", "tls=tcp");
    st = kvl_metadata_load(a, blob, blen, NULL, 0);
    free(blob);
    kvl_error_render(NULL, text, sizeof(text));
    printf("status %s\n%s\n", kvl_status_name(st), text);
    KT_CHECK(st != KVL_OK);
    KT_ERROR_HAS("sm-only");
    KT_ERROR_HAS("Destination is unreachable");
    KT_ERROR_HAS("(tcp)");                  /* what this side offers */
    KT_ERROR_HAS("posix");                  /* what the peer offers */
    KT_ERROR_HAS("common transport");
    kvl_agent_destroy(a);
    kt_peer_stop(&p);
}

static char g_warn[4096];
static int g_warns;

static void warn_cb(kvl_log_level_t level, const char *comp, const char *msg, void *arg)
{
    (void)arg;
    if (level == KVL_LOG_WARN && strcmp(comp, "ucx") == 0 && strstr(msg, "shared memory")) {
        snprintf(g_warn, sizeof(g_warn), "%s", msg);
        g_warns++;
    }
}

static char g_tls_obs[2048];
static int g_tls_status = -1;

static void probe_cb(void *arg, const char *check, int status, const char *observed,
                     const char *hint)
{
    (void)arg;
    (void)hint;
    if (strcmp(check, "tls") == 0) {
        g_tls_status = status;
        snprintf(g_tls_obs, sizeof(g_tls_obs), "%s", observed);
    }
}

/* Issue 17 item 6: tcp only on one host is a silent slow path; say it once
 * at backend creation, and doctor's ucx.tls warns. */
static void test_slow_tls(void)
{
    printf("--- (b3) tls=tcp: shared memory left out\n");
    kvl_log_set_callback(warn_cb, NULL);
    kvl_param_t tp[] = {{"tls", "tcp"}};
    for (int i = 0; i < 2; i++) {
        kvl_agent_t *a = kt_agent("diag-b3", "", NULL);
        KT_OK(kvl_backend_create(a, "ucx", tp, 1, NULL));
        kvl_agent_destroy(a);
    }
    kvl_log_set_callback(NULL, NULL);
    printf("warned %d time(s): %s\n", g_warns, g_warn);
    KT_CHECK(g_warns == 2); /* once per backend created */
    KT_CHECK(strstr(g_warn, "leave out shared memory") != NULL);
    KT_CHECK(strstr(g_warn, "tls parameter") != NULL);
    setenv("UCX_TLS", "tcp", 1);
    KT_OK(kvl_backend_probe("ucx", probe_cb, NULL, KVL_MEM_DRAM, -1, 0));
    unsetenv("UCX_TLS");
    printf("doctor ucx.tls: status %d: %s\n", g_tls_status, g_tls_obs);
    KT_CHECK(g_tls_status == 1 && strstr(g_tls_obs, "leaves out shared memory") != NULL);
}

static void test_memlock(void)
{
    printf("--- (c) RLIMIT_MEMLOCK 64 KiB, 64 MiB registration\n");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {65536, 65536};
        KT_CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
        kvl_agent_t *a = kt_agent("diag-c", "ucx", NULL);
        uint8_t *b = region(64u << 20);
        kvl_mem_desc_t d = {(uint64_t)(uintptr_t)b, 64u << 20, KVL_DEV_ANY};
        kvl_reg_report_t *rep;
        KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
        const kvl_reg_outcome_t *o = outcome(rep, "ucx");
        printf("ucx: %s\n", o ? o->detail : "(none)");
        /* UCX 1.13 with tcp/shared memory does not lock memory: it registers,
         * and the report says the limit would matter for RDMA only */
        KT_CHECK(o != NULL && o->status == KVL_OK);
        KT_CHECK(strstr(o->detail, "locked-memory limit 64 KiB") != NULL);
        KT_CHECK(strstr(o->detail, "no transport in use pins memory") != NULL);
        kvl_reg_report_free(rep);
        kvl_agent_destroy(a);
        exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* (d) straight through the module's ops: the core only hands VRAM to a
 * backend once the cuda backend recognised the pointer. */
static void ctx_log(kvl_bk_ctx_t *c, kvl_log_level_t l, const char *fmt, ...)
{
    (void)c;
    (void)l;
    (void)fmt;
}

static void test_vram(void)
{
    char path[1024];
    const char *bdir = getenv("KVL_BUILD");
    printf("--- (d) VRAM offered to a UCX without GPU support, no staging copies lent\n");
    snprintf(path, sizeof(path), "%s/modules/libkvlane-ucx.so", bdir ? bdir : ".");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    KT_CHECK(h != NULL);
    const kvl_backend_ops_t *(*entry)(void);
    void *sym = dlsym(h, "kvl_backend_module_v1");
    KT_CHECK(sym != NULL);
    memcpy(&entry, &sym, sizeof(entry));
    const kvl_backend_ops_t *ops = entry();
    kvl_bk_ctx_t ctx = {.size = sizeof(ctx), .agent_name = "diag-d", .incarnation = 1,
                        .timeout_ms = 2000, .log = ctx_log};
    void *bk;
    kvl_error_t err;
    KT_CHECK(ops->open(&ctx, NULL, 0, &bk, &err) == KVL_OK);
    uint8_t *b = region(1 << 20);
    kvl_region_info_t r = {.addr = (uint64_t)(uintptr_t)b, .len = 1 << 20, .kind = KVL_MEM_VRAM,
                           .dev = 0, .shm_fd = -1};
    void *mh = NULL;
    char detail[384];
    memset(&err, 0, sizeof(err));
    kvl_status_t st = ops->mem_reg(bk, &r, &mh, detail, sizeof(detail), &err);
    char rtext[8192];
    kvl_error_render(&err, rtext, sizeof(rtext));
    printf("%s\n", rtext);
    KT_CHECK(st == KVL_ERR_UNSUPPORTED && mh == NULL);
    KT_CHECK(strstr(err.what, "no GPU memory support") != NULL);
    KT_CHECK(strstr(err.what, "memory types: host") != NULL);
    /* such VRAM is staged; this bare context lends no staging copies: the
     * staging error rides along whole as a cause, not pasted (issue 17
     * item 9) */
    KT_CHECK(strstr(err.what, "staging it through host memory failed (the cause below)") != NULL);
    KT_CHECK(err.n_causes == 1 && strstr(err.causes[0].what, "lends no staging copies") != NULL);
    KT_CHECK(err.causes[0].device == 0 && err.causes[0].code == KVL_ERR_UNSUPPORTED);
    KT_CHECK(strstr(rtext, "cause 1: [ucx] [device 0] KVL_ERR_UNSUPPORTED") != NULL);
    KT_CHECK(strstr(err.hint, "UCX built with CUDA") != NULL);
    /* DRAM still works on the same backend */
    r.kind = KVL_MEM_DRAM;
    KT_CHECK(ops->mem_reg(bk, &r, &mh, detail, sizeof(detail), &err) == KVL_OK);
    ops->mem_dereg(bk, mh);
    ops->close(bk);
    munmap(b, 1 << 20);
    /* the module stays loaded, as the core keeps it */
}

int main(void)
{
    kt_ucx_sanitizer_env();
    char reason[512];
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/kvl-ucx-diag-%d", (int)getpid());
    fake_trees();
    test_rdma_diag();   /* (e) needs no UCX */
    if (kvl_backend_available("ucx", reason, sizeof(reason)) != KVL_OK) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "note: could not remove %s\n", g_tmp);
        KT_SKIP("ucx backend not available: %s", reason);
    }
    test_net_devices();
    test_not_cut();
    test_tls();
    test_slow_tls();
    test_memlock();
    test_vram();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    KT_CHECK(system(cmd) == 0);
    printf("PASS\n");
    return 0;
}
