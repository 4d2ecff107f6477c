/*
 * ucx_bench: kvlane WRITE bandwidth over the ucx backend between two
 * processes on this host, for comparison with ucx_perftest -t ucp_put_bw
 * (bench/ucx_compare.sh runs both).
 *
 *   ucx_bench [-s SIZE] [-b BLOCKS] [-t SECONDS] [-w INFLIGHT] [-p k=v,...]
 *             [-a app|ucx] [-f spread|same]
 *
 * Each transfer moves BLOCKS blocks of SIZE bytes, one put each; INFLIGHT
 * transfers are kept posted. BLOCKS defaults to 32 MiB / SIZE (at least 1).
 *   -a app     both sides register memory the application mapped (mmap);
 *              UCX reaches it through cma on one host (default)
 *   -a ucx     both sides allocate with kvl_mem_alloc_ex(backend "ucx"), i.e.
 *              ucp_mem_map(ALLOCATE) as ucx_perftest does: a sysv/posix
 *              segment UCX's shared-memory transports copy into directly
 *   -f spread  block j at offset 2*j*SIZE on both sides: a footprint of
 *              2*BLOCKS*SIZE per side, nothing coalesces (default)
 *   -f same    every block is the same SIZE bytes at offset 0 on both sides
 *              (a buffer of SIZE per side, BLOCKS identical list entries,
 *              which kvlane does not merge), as ucx_perftest -t ucp_put_bw
 *              puts one SIZE buffer to one remote address again and again
 * Prints "size <SIZE> blocks <n> inflight <n> alloc <a> footprint <f> GB/s
 * <x> path <path>". UCX_* variables (UCX_TLS...) apply to both processes.
 * Exit 0 ok, 1 failure, 77 ucx unavailable.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <kvlane/kvlane.h>

static double kvb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int kvb_fail(const char *what)
{
    char buf[4096];
    kvl_error_render(NULL, buf, sizeof(buf));
    fprintf(stderr, "ucx_bench: %s failed:\n%s\n", what, buf);
    return 1;
}

static kvl_agent_t *kvb_agent(const char *name, char *params)
{
    kvl_agent_t *a;
    kvl_param_t prm[8];
    size_t np = 0;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    if (kvl_agent_create(name, &cfg, &a) != KVL_OK)
        return NULL;
    char *save = NULL;
    for (char *kv = params ? strtok_r(params, ",", &save) : NULL; kv && np < 8;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        prm[np].key = kv;
        prm[np++].value = eq + 1;
    }
    if (kvl_backend_create(a, "ucx", prm, np, NULL) != KVL_OK) {
        kvb_fail("kvl_backend_create(ucx)");
        kvl_agent_destroy(a);
        return NULL;
    }
    return a;
}

static int kvb_ucx_alloc; /* -a ucx */

static void *kvb_buf(kvl_agent_t *a, size_t len)
{
    if (kvb_ucx_alloc) {
        kvl_alloc_params_t ap = {.field_mask = KVL_ALLOC_PARAM_BACKEND, .backend = "ucx"};
        void *p = NULL;
        if (kvl_mem_alloc_ex(a, len, &ap, &p) != KVL_OK) {
            kvb_fail("kvl_mem_alloc_ex(ucx)");
            return NULL;
        }
        memset(p, 1, len); /* fault it in, as MAP_POPULATE does */
        return p;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int main(int argc, char **argv)
{
    uint64_t size = 1 << 20, blocks = 0;
    double secs = 2.0;
    unsigned inflight = 2;
    char *params = NULL;
    int c, same = 0;
    while ((c = getopt(argc, argv, "s:b:t:w:p:a:f:")) != -1) {
        switch (c) {
        case 'a':
            if (strcmp(optarg, "ucx") != 0 && strcmp(optarg, "app") != 0) {
                fprintf(stderr, "ucx_bench: -a takes app or ucx\n");
                return 2;
            }
            kvb_ucx_alloc = optarg[0] == 'u';
            break;
        case 'f':
            if (strcmp(optarg, "same") != 0 && strcmp(optarg, "spread") != 0) {
                fprintf(stderr, "ucx_bench: -f takes spread or same\n");
                return 2;
            }
            same = optarg[1] == 'a';
            break;
        case 's': size = strtoull(optarg, NULL, 0); break;
        case 'b': blocks = strtoull(optarg, NULL, 0); break;
        case 't': secs = atof(optarg); break;
        case 'w': inflight = (unsigned)atoi(optarg); break;
        case 'p': params = optarg; break;
        default:
            fprintf(stderr, "usage: ucx_bench [-s SIZE] [-b BLOCKS] [-t SECONDS] [-w INFLIGHT] "
                            "[-p k=v,...] [-a app|ucx] [-f spread|same]\n");
            return 2;
        }
    }
    char reason[512];
    if (kvl_backend_available("ucx", reason, sizeof(reason)) != KVL_OK) {
        printf("SKIP: ucx backend unavailable: %s\n", reason);
        return 77;
    }
    if (blocks == 0)
        blocks = size >= (32u << 20) ? 1 : (32u << 20) / size;
    if (inflight == 0 || inflight > 16)
        inflight = 2;
    /* spread: every other block, so nothing coalesces; same: one block */
    size_t len = same ? (size_t)size : (size_t)(blocks * size * 2);
    int md[2], go[2];
    if (pipe(md) != 0 || pipe(go) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        /* target: register, publish metadata, stay until the pipe closes */
        close(md[0]);
        close(go[1]);
        kvl_agent_t *t = kvb_agent("bench-target", params);
        void *buf = t ? kvb_buf(t, len) : NULL;
        void *blob;
        size_t bl;
        kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY};
        if (t == NULL || buf == NULL || kvl_mem_register(t, &d, 1, NULL, NULL) != KVL_OK ||
            kvl_metadata_get(t, &blob, &bl) != KVL_OK)
            _exit(kvb_fail("target setup"));
        uint64_t l64 = bl;
        if (write(md[1], &l64, 8) != 8 || write(md[1], blob, bl) != (ssize_t)bl)
            _exit(1);
        kvl_free(blob);
        char x;
        while (read(go[0], &x, 1) > 0)
            ;
        kvl_agent_destroy(t);
        _exit(0);
    }
    close(md[1]);
    close(go[0]);
    kvl_agent_t *a = kvb_agent("bench-initiator", params);
    void *buf = a ? kvb_buf(a, len) : NULL;
    if (a == NULL || buf == NULL)
        return 1;
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, len, KVL_DEV_ANY};
    if (kvl_mem_register(a, &d, 1, NULL, NULL) != KVL_OK)
        return kvb_fail("kvl_mem_register");
    uint64_t bl;
    if (read(md[0], &bl, 8) != 8)
        return 1;
    char *blob = malloc(bl);
    size_t got = 0;
    while (got < bl) {
        ssize_t n = read(md[0], blob + got, bl - got);
        if (n <= 0)
            return 1;
        got += (size_t)n;
    }
    if (kvl_metadata_load(a, blob, bl, NULL, 0) != KVL_OK)
        return kvb_fail("kvl_metadata_load");
    free(blob);
    kvl_mem_desc_t r;
    size_t nr;
    if (kvl_remote_regions(a, "bench-target", &r, NULL, 1, &nr) != KVL_OK)
        return kvb_fail("kvl_remote_regions");

    kvl_xfer_t *x[16];
    kvl_dlist_t *l, *rl;
    kvl_dlist_create(KVL_MEM_DRAM, 1, &l);
    kvl_dlist_create(KVL_MEM_DRAM, 1, &rl);
    if (same) {
        for (uint64_t j = 0; j < blocks; j++) {
            kvl_dlist_add(l, d.addr, size, KVL_DEV_ANY);
            kvl_dlist_add(rl, r.addr, size, KVL_DEV_ANY);
        }
    } else {
        kvl_dlist_add_strided(l, d.addr, 2 * size, blocks, size, KVL_DEV_ANY);
        kvl_dlist_add_strided(rl, r.addr, 2 * size, blocks, size, KVL_DEV_ANY);
    }
    for (unsigned i = 0; i < inflight; i++)
        if (kvl_xfer_create(a, KVL_WRITE, l, "bench-target", rl, NULL, &x[i]) != KVL_OK)
            return kvb_fail("kvl_xfer_create");
    /* warm up: one round */
    for (unsigned i = 0; i < inflight; i++)
        if (kvl_xfer_post(x[i]) < 0 || kvl_xfer_wait(x[i], 60000) != KVL_OK)
            return kvb_fail("warm-up transfer");
    uint64_t moved = 0;
    double t0 = kvb_now(), t;
    for (unsigned i = 0; i < inflight; i++)
        if (kvl_xfer_post(x[i]) < 0)
            return kvb_fail("kvl_xfer_post");
    unsigned k = 0;
    for (;;) {
        if (kvl_xfer_wait(x[k], 60000) != KVL_OK)
            return kvb_fail("kvl_xfer_wait");
        moved += blocks * size;
        t = kvb_now();
        if (t - t0 >= secs)
            break;
        if (kvl_xfer_post(x[k]) < 0)
            return kvb_fail("kvl_xfer_post");
        k = (k + 1) % inflight;
    }
    /* drain the rest (not counted after t) */
    for (unsigned i = 0; i < inflight; i++)
        kvl_xfer_wait(x[i], 60000);
    kvl_xfer_stats_t st;
    kvl_xfer_get_stats(x[0], &st);
    printf("size %" PRIu64 " blocks %" PRIu64 " inflight %u alloc %s footprint %s GB/s %.3f "
           "path %s\n", size, blocks, inflight, kvb_ucx_alloc ? "ucx" : "app",
           same ? "same" : "spread", (double)moved / (t - t0) / 1e9, st.path);
    for (unsigned i = 0; i < inflight; i++)
        kvl_xfer_release(x[i]);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(rl);
    kvl_agent_destroy(a);
    close(go[1]);
    int status;
    waitpid(pid, &status, 0);
    return 0;
}
