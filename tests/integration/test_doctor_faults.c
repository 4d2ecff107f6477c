/*
 * kvlane doctor's RDMA, UCX and VRAM checks, each fault injected and the
 * exact diagnosis and exit code checked:
 *   - fake sysfs/dev roots (KVL_SYSFS_ROOT, KVL_DEV_ROOT): no RDMA at all;
 *     devices listed but no uverbs node openable (the "No such device" of
 *     UCX/verbs: fail, exit 2); /dev/infiniband missing; one of two devices
 *     broken (warn); a healthy device with an openable node (a regular file)
 *     and an ACTIVE port (ok); a port DOWN (warn); a RoCE port without GID;
 *   - UCX: UCX_NET_DEVICES=mlx5_7:1 (fail, exit 2, with the sysfs/dev
 *     explanation), UCX_TLS=tcp while RDMA devices are listed (warn),
 *     UCX_TLS=self and UCX_TLS naming no transport (fail), a ucx module that
 *     does not load (warn: the module's checks did not run);
 *   - `--mem VRAM` without a CUDA driver (KVL_CUDA_DRIVER pointing nowhere):
 *     fail, with "this build has no cuda backend" when the build has none,
 *     else the cuda backend's reason.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"

static char out[1 << 17];
static char g_tmp[256];

/* Run `kvlane doctor args...` with env ("K=V" entries) set in the child;
 * returns the exit code, output (stdout) in out. */
static int doctor(const char *const *env, const char *const *args)
{
    const char *bin = getenv("KVL_BIN");
    int p[2];
    KT_CHECK(bin != NULL && pipe(p) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        for (; env && *env; env++) {
            char kv[600];
            snprintf(kv, sizeof(kv), "%s", *env);
            char *eq = strchr(kv, '=');
            if (eq == NULL)
                _exit(97);
            *eq = '\0';
            setenv(kv, eq + 1, 1);
        }
        const char *argv[24] = {bin, "doctor"};
        int n = 2;
        for (; args[n - 2] && n < 23; n++)
            argv[n] = args[n - 2];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(98);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while ((r = read(p[0], out + len, sizeof(out) - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = 0;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    printf("---- doctor exit %d\n%s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A table line "<status>  <check> ... <needle>" exists (check matched as a
 * whole word: "rdma.devices " or "ucx.tls "). */
static int has_line(const char *status, const char *check, const char *needle)
{
    char word[128];
    snprintf(word, sizeof(word), " %s ", check);
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        char line[4096];
        size_t n = strcspn(l, "\n");
        if (n >= sizeof(line))
            n = sizeof(line) - 1;
        memcpy(line, l, n);
        line[n] = 0;
        if (strncmp(line, status, strlen(status)) == 0 && strstr(line, word) &&
            (needle == NULL || strstr(line, needle)))
            return 1;
    }
    return 0;
}

/* The "fix:" line right after the check's line contains needle. */
static int has_fix(const char *check, const char *needle)
{
    char word[128];
    snprintf(word, sizeof(word), " %s ", check);
    const char *l = strstr(out, word);
    if (l == NULL || (l = strchr(l, '\n')) == NULL)
        return 0;
    l++;
    size_t n = strcspn(l, "\n");
    const char *fix = strstr(l, "fix: ");
    const char *hit = strstr(l, needle);
    return fix != NULL && fix < l + n && hit != NULL && hit < l + n;
}

#define CHECK_LINE(st, check, needle)                                                      \
    do {                                                                                   \
        if (!has_line(st, check, needle)) {                                                \
            fprintf(stderr, "no line \"%s %s ... %s\"\n", st, check, needle ? needle : ""); \
            KT_CHECK(!"line missing");                                                     \
        }                                                                                  \
    } while (0)

static void put(const char *rel, const char *content)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", g_tmp, rel);
    char dir[600];
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = '\0';
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
    KT_CHECK(system(cmd) == 0);
    FILE *f = fopen(path, "w");
    KT_CHECK(f != NULL);
    fputs(content, f);
    fclose(f);
}

/* One RDMA device in the fake sysfs: uverbs index, port 1 state/link/gid. */
static void fake_dev(const char *tree, const char *dev, int uverbs, const char *state,
                     const char *link, const char *gid0)
{
    char rel[300], v[64];
    snprintf(rel, sizeof(rel), "%s/sys/class/infiniband/%s/ports/1/state", tree, dev);
    put(rel, state);
    snprintf(rel, sizeof(rel), "%s/sys/class/infiniband/%s/ports/1/link_layer", tree, dev);
    put(rel, link);
    snprintf(rel, sizeof(rel), "%s/sys/class/infiniband/%s/ports/1/gids/0", tree, dev);
    put(rel, gid0);
    snprintf(rel, sizeof(rel), "%s/sys/class/infiniband/%s/ports/1/gids/1", tree, dev);
    put(rel, "0000:0000:0000:0000:0000:0000:0000:0000\n");
    if (strcmp(link, "Ethernet\n") == 0) {
        snprintf(rel, sizeof(rel), "%s/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/0", tree,
                 dev);
        put(rel, "eth7\n");
    }
    if (uverbs >= 0) {
        snprintf(rel, sizeof(rel), "%s/sys/class/infiniband_verbs/uverbs%d/ibdev", tree, uverbs);
        snprintf(v, sizeof(v), "%s\n", dev);
        put(rel, v);
    }
}

static void fake_node(const char *tree, const char *node)
{
    char rel[300];
    snprintf(rel, sizeof(rel), "%s/dev/infiniband/%s", tree, node);
    put(rel, "");
}

/* env entries pointing doctor at tree */
static void roots(const char *tree, char sys[512], char dev[512])
{
    snprintf(sys, 512, "KVL_SYSFS_ROOT=%s/%s/sys", g_tmp, tree);
    snprintf(dev, 512, "KVL_DEV_ROOT=%s/%s/dev", g_tmp, tree);
}

static const char *const no_smoke[] = {"--no-smoke", NULL};
static const char *const GID_IB = "fe80:0000:0000:0000:0002:c903:0031:7a01\n";

static void test_rdma(void)
{
    char sys[512], dev[512];

    printf("=== no RDMA at all: ok, tcp/shm only\n");
    put("none/sys/class/.keep", "");
    roots("none", sys, dev);
    const char *e0[] = {sys, dev, NULL};
    int rc = doctor(e0, no_smoke);
    KT_CHECK(rc == 0 || rc == 1);
    CHECK_LINE("ok", "rdma.devices", "none: tcp/shm only");
    KT_CHECK(strstr(out, "rdma.rdma_cm") == NULL); /* nothing to say without devices */

    printf("=== devices listed, no uverbs node openable: fail, exit 2\n");
    fake_dev("broken", "mlx5_0", 0, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_dev("broken", "mlx5_1", 1, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_node("broken", "rdma_cm");
    roots("broken", sys, dev);
    const char *e1[] = {sys, dev, NULL};
    rc = doctor(e1, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "rdma.devices", "2 RDMA devices listed in sysfs but no uverbs node is "
               "openable: verbs, and UCX over them, fail with \"No such device\"");
    CHECK_LINE("fail", "rdma.devices", "mlx5_0 (uverbs0 missing), mlx5_1 (uverbs1 missing)");
    CHECK_LINE("fail", "rdma.devices", "/dev/infiniband/uverbs0 does not exist");
    CHECK_LINE("fail", "rdma.devices", "holds rdma_cm)");
    KT_CHECK(has_fix("rdma.devices", "RDMA device plugin"));
    CHECK_LINE("ok", "rdma.rdma_cm", "rdma_cm opens");
    CHECK_LINE("ok", "rdma.mlx5_0.port1", "mlx5_0 port 1: ACTIVE, InfiniBand, 1 GID");

    printf("=== the same, JSON\n");
    const char *json[] = {"--json", "--no-smoke", NULL};
    rc = doctor(e1, json);
    KT_CHECK(rc == 2);
    KT_CHECK(strstr(out, "\"status\":\"fail\",\"exit_code\":2") != NULL);
    KT_CHECK(strstr(out, "{\"name\":\"rdma.devices\",\"status\":\"fail\",\"observed\":\"2 RDMA "
                         "devices listed in sysfs but no uverbs node is openable") != NULL);
    KT_CHECK(strstr(out, "fail with \\\"No such device\\\"") != NULL); /* escaped quotes */
    if (system("command -v python3 >/dev/null 2>&1") == 0) {
        FILE *py = popen("python3 -c 'import json,sys; d=json.load(sys.stdin); "
                         "c={x[\"name\"]: x for x in d[\"checks\"]}; "
                         "assert c[\"rdma.devices\"][\"status\"]==\"fail\"; "
                         "assert \"RDMA device plugin\" in c[\"rdma.devices\"][\"hint\"]; "
                         "assert d[\"exit_code\"]==2'", "w");
        KT_CHECK(py != NULL);
        fputs(out, py);
        KT_CHECK(pclose(py) == 0);
    }

    printf("=== /dev/infiniband missing altogether\n");
    fake_dev("nodir", "mlx5_0", 0, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    roots("nodir", sys, dev);
    const char *e2[] = {sys, dev, NULL};
    rc = doctor(e2, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "rdma.devices", "nothing (the directory is missing)");
    CHECK_LINE("warn", "rdma.rdma_cm", "is missing (No such file or directory)");

    printf("=== listed without a uverbs device (ib_uverbs not loaded)\n");
    fake_dev("nouv", "mlx5_3", -1, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_node("nouv", "rdma_cm");
    roots("nouv", sys, dev);
    const char *e3[] = {sys, dev, NULL};
    rc = doctor(e3, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "rdma.devices", "mlx5_3 (no uverbs)");
    CHECK_LINE("fail", "rdma.devices", "load ib_uverbs on the host");

    printf("=== healthy: node openable (a regular file), port ACTIVE with a GID\n");
    fake_dev("good", "mlx5_0", 0, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_node("good", "uverbs0");
    fake_node("good", "rdma_cm");
    roots("good", sys, dev);
    const char *e4[] = {sys, dev, NULL};
    rc = doctor(e4, no_smoke);
    KT_CHECK(rc == 0 || rc == 1); /* ucx.rdma may warn: the real UCX sees no fake NIC */
    KT_CHECK(strstr(out, "\nfail ") == NULL);
    CHECK_LINE("ok", "rdma.devices", "1 listed in");
    CHECK_LINE("ok", "rdma.devices", "all openable: mlx5_0 (uverbs0 opens)");
    CHECK_LINE("ok", "rdma.rdma_cm", "rdma_cm opens");
    CHECK_LINE("ok", "rdma.mlx5_0.port1", "mlx5_0 port 1: ACTIVE, InfiniBand, 1 GID");

    printf("=== one of two devices broken: warn\n");
    fake_dev("half", "mlx5_0", 0, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_dev("half", "mlx5_1", 1, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_node("half", "uverbs0");
    fake_node("half", "rdma_cm");
    roots("half", sys, dev);
    const char *e5[] = {sys, dev, NULL};
    rc = doctor(e5, no_smoke);
    KT_CHECK(rc == 1);
    CHECK_LINE("warn", "rdma.devices", "1 of 2 RDMA devices listed in sysfs have no openable "
               "uverbs node");
    CHECK_LINE("warn", "rdma.devices", "/dev/infiniband/uverbs1 does not exist");

    printf("=== port DOWN: warn, exit 1\n");
    fake_dev("down", "mlx5_0", 0, "1: DOWN\n", "InfiniBand\n", GID_IB);
    fake_node("down", "uverbs0");
    fake_node("down", "rdma_cm");
    roots("down", sys, dev);
    const char *e6[] = {sys, dev, NULL};
    rc = doctor(e6, no_smoke);
    KT_CHECK(rc == 1);
    CHECK_LINE("ok", "rdma.devices", "all openable");
    CHECK_LINE("warn", "rdma.mlx5_0.port1", "mlx5_0 port 1: DOWN, InfiniBand, 1 GID");
    KT_CHECK(has_fix("rdma.mlx5_0.port1", "the port is not ACTIVE"));

    printf("=== RoCE port ACTIVE without a GID: warn\n");
    fake_dev("roce", "mlx5_2", 2, "4: ACTIVE\n", "Ethernet\n",
             "0000:0000:0000:0000:0000:0000:0000:0000\n");
    fake_node("roce", "uverbs2");
    fake_node("roce", "rdma_cm");
    roots("roce", sys, dev);
    const char *e7[] = {sys, dev, NULL};
    rc = doctor(e7, no_smoke);
    KT_CHECK(rc == 1);
    CHECK_LINE("warn", "rdma.mlx5_2.port1", "mlx5_2 port 1: ACTIVE, Ethernet (eth7), no GID "
               "(all zero)");
    KT_CHECK(has_fix("rdma.mlx5_2.port1", "IP address on its network interface eth7"));
}

static void test_ucx(void)
{
    char sys[512], dev[512], reason[512];
    if (kvl_backend_available("ucx", reason, sizeof(reason)) != KVL_OK) {
        printf("=== ucx checks skipped: %s\n", reason);
        return;
    }

    printf("=== clean: ucx.version, ucx.transports, ucx.gpu_memory\n");
    roots("none", sys, dev);
    const char *e0[] = {sys, dev, NULL};
    int rc = doctor(e0, no_smoke);
    KT_CHECK(rc == 0 || rc == 1);
    CHECK_LINE("ok", "ucx.version", "UCX 1.");
    CHECK_LINE("ok", "ucx.transports", "network devices: ");
    KT_CHECK(has_line("ok", "ucx.gpu_memory", "memory types host") ||
             has_line("ok", "ucx.gpu_memory", "UCX registers GPU memory"));

    printf("=== UCX_NET_DEVICES=mlx5_7:1, no RDMA here: fail, exit 2\n");
    const char *e1[] = {sys, dev, "UCX_NET_DEVICES=mlx5_7:1", NULL};
    rc = doctor(e1, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "ucx.net_devices", "UCX_NET_DEVICES=mlx5_7:1 names mlx5_7:1, which UCX "
               "does not have");
    CHECK_LINE("fail", "ucx.net_devices", "network device 'mlx5_7:1' is not available");
    CHECK_LINE("fail", "ucx.net_devices", "mlx5_7:1 is not an RDMA device of this host");
    KT_CHECK(has_fix("ucx.net_devices", "set UCX_NET_DEVICES to devices UCX lists"));
    CHECK_LINE("ok", "ucx.env", "UCX_NET_DEVICES=mlx5_7:1");

    printf("=== UCX_NET_DEVICES=mlx5_7:1, listed in sysfs without a node\n");
    fake_dev("mlx7", "mlx5_0", 0, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_dev("mlx7", "mlx5_7", 7, "4: ACTIVE\n", "InfiniBand\n", GID_IB);
    fake_node("mlx7", "uverbs0");
    fake_node("mlx7", "rdma_cm");
    roots("mlx7", sys, dev);
    const char *e2[] = {sys, dev, "UCX_NET_DEVICES=mlx5_7:1", NULL};
    rc = doctor(e2, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "ucx.net_devices", "mlx5_7 is listed in");
    CHECK_LINE("fail", "ucx.net_devices", "/dev/infiniband/uverbs7 does not exist");
    CHECK_LINE("warn", "rdma.devices", "mlx5_7 (uverbs7 missing)");

    printf("=== the smoke test agrees: ucx refuses the registration\n");
    const char *smoke[] = {"--backend", "ucx", NULL};
    rc = doctor(e2, smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "smoke.ucx.DRAM", "kvl_mem_register failed");
    KT_CHECK(strstr(out, "KVL_ERR_NO_DEVICE: UCX has no network device mlx5_7:1") != NULL);

    printf("=== UCX_TLS=tcp while RDMA devices are listed: warn\n");
    roots("good", sys, dev);
    const char *e3[] = {sys, dev, "UCX_TLS=tcp", NULL};
    rc = doctor(e3, no_smoke);
    KT_CHECK(rc == 1);
    CHECK_LINE("warn", "ucx.tls", "UCX_TLS=tcp leaves out every RDMA transport while 1 RDMA "
               "device is listed (mlx5_0): UCX silently moves KV cache over tcp instead");
    KT_CHECK(has_fix("ucx.tls", "add it to UCX_TLS"));
    CHECK_LINE("ok", "ucx.transports", "tcp/");

    printf("=== UCX_TLS=^ud with the same devices: no tls warning\n");
    const char *e3b[] = {sys, dev, "UCX_TLS=^ud", NULL};
    rc = doctor(e3b, no_smoke);
    CHECK_LINE("ok", "ucx.tls", "UCX_TLS=^ud allows RDMA transports");

    printf("=== UCX_TLS=self: nothing reaches another process: fail\n");
    roots("none", sys, dev);
    const char *e4[] = {sys, dev, "UCX_TLS=self", NULL};
    rc = doctor(e4, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "ucx.transports", "self/");
    KT_CHECK(has_fix("ucx.transports", "UCX_TLS leaves only the loopback transport self"));

    printf("=== UCX_TLS=nosuch: no usable transport: fail\n");
    const char *e5[] = {sys, dev, "UCX_TLS=nosuch", NULL};
    rc = doctor(e5, no_smoke);
    KT_CHECK(rc == 2);
    CHECK_LINE("fail", "ucx.transports", "UCX has no usable transport: ucp_init() = No such device");
    CHECK_LINE("fail", "ucx.transports", "transport 'nosuch' is not available");
    KT_CHECK(has_fix("ucx.transports", "UCX_TLS names transports this UCX does not have"));
}

static void test_module_broken(void)
{
    printf("=== a ucx module that does not load: warn, its checks did not run\n");
    char env[600];
    put("mods/libkvlane-ucx.so", "not an ELF file\n");
    snprintf(env, sizeof(env), "KVL_MODULE_PATH=%s/mods", g_tmp);
    const char *e[] = {env, NULL};
    int rc = doctor(e, no_smoke);
    KT_CHECK(rc == 1);
    CHECK_LINE("warn", "backend.ucx", "could not be loaded");
    CHECK_LINE("warn", "backend.ucx", "(so its own checks, ucx.*, did not run)");
    KT_CHECK(strstr(out, "ucx.version") == NULL);
}

static void test_vram(void)
{
    printf("=== --mem VRAM without a CUDA driver: fail, exit 2\n");
    const char *e[] = {"KVL_CUDA_DRIVER=/nonexistent/libcuda.so.1", NULL};
    const char *args[] = {"--mem", "VRAM", "--device", "0", NULL};
    int rc = doctor(e, args);
    int has_cuda = 0;
    for (const char *const *n = kvl_backend_names(); *n; n++)
        has_cuda |= strcmp(*n, "cuda") == 0;
    KT_CHECK(rc == 2);
    if (!has_cuda) {
        CHECK_LINE("fail", "vram.backend", "VRAM requested: this build has no cuda backend");
        CHECK_LINE("fail", "vram.backend", "CUDA driver: /nonexistent/libcuda.so.1");
    } else {
        CHECK_LINE("fail", "vram.backend", "VRAM requested device 0, but no CUDA driver/GPU is "
                   "usable: ");
    }
    KT_CHECK(strstr(out, "smoke.") == NULL); /* nothing can allocate VRAM: no smoke test */
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(g_tmp, sizeof(g_tmp), "%s/kvl-doctor-XXXXXX", base && base[0] ? base : "/tmp");
    KT_CHECK(mkdtemp(g_tmp) != NULL);
    test_rdma();
    test_ucx();
    test_module_broken();
    test_vram();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%.280s'", g_tmp);
    KT_CHECK(system(cmd) == 0);
    printf("doctor: every injected RDMA/UCX/VRAM fault found\n");
    return 0;
}
