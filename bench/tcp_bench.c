/*
 * tcp backend throughput between two processes: WRITE (or READ) of --total
 * bytes in blocks of --block-size. Blocks are scattered on the remote side
 * (reverse order), so none coalesce and each is one range on the wire.
 *
 *   tcp_bench [--block-size BYTES] [--total BYTES] [--iters N] [--warmup N] [--read]
 *             [--host ADDR] [--params k=v,...]
 * Prints one line per iteration and a final summary line:
 *   tcp_bench: op=WRITE block=1048576 total=1073741824 best=1.71 median=1.65 GB/s
 * The target is this program re-executed with --target (fork + exec).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <kvlane/kvlane.h>

static void die(const char *what)
{
    char buf[4096];
    kvl_error_render(NULL, buf, sizeof(buf));
    fprintf(stderr, "tcp_bench: %s failed:\n%s\n", what, buf);
    exit(1);
}

static int xwrite(int fd, const void *b, size_t n)
{
    const char *c = b;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int xread(int fd, void *b, size_t n)
{
    char *c = b;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static kvl_agent_t *make_agent(const char *name, const char *host, const char *params)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 10000};
    kvl_param_t prm[8];
    size_t np = 0;
    static char buf[512];
    kvl_agent_t *a;
    if (kvl_agent_create(name, &cfg, &a) != KVL_OK)
        die("kvl_agent_create");
    prm[np].key = "host";
    prm[np++].value = host;
    snprintf(buf, sizeof(buf), "%s", params ? params : "");
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv && np < 8;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        prm[np].key = kv;
        prm[np++].value = eq + 1;
    }
    if (kvl_backend_create(a, "tcp", prm, np, NULL) != KVL_OK)
        die("kvl_backend_create(tcp)");
    return a;
}

static void *alloc_reg(kvl_agent_t *a, size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("tcp_bench: mmap");
        exit(1);
    }
    memset(p, 0x5a, len); /* fault every page in before measuring */
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)p, len, KVL_DEV_ANY};
    if (kvl_mem_register(a, &d, 1, NULL, NULL) != KVL_OK)
        die("kvl_mem_register");
    return p;
}

static int target_main(int in, int out, size_t total, const char *host, const char *params)
{
    kvl_agent_t *a = make_agent("bench-target", host, params);
    void *buf = alloc_reg(a, total);
    void *blob;
    size_t len;
    uint64_t l, base = (uint64_t)(uintptr_t)buf;
    char c;
    if (kvl_metadata_get(a, &blob, &len) != KVL_OK)
        die("kvl_metadata_get");
    l = len;
    if (xwrite(out, &l, 8) || xwrite(out, &base, 8) || xwrite(out, blob, len))
        return 1;
    kvl_free(blob);
    (void)xread(in, &c, 1); /* until the initiator says stop or exits */
    kvl_agent_destroy(a);
    return 0;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    uint64_t v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    else if (*end == 'G' || *end == 'g')
        v <<= 30;
    return v;
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv)
{
    uint64_t bs = 1u << 20, total = 1u << 30;
    int iters = 5, warmup = 0, read_op = 0, target = 0, in = -1, out = -1;
    const char *host = "127.0.0.1", *params = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--block-size") && i + 1 < argc)
            bs = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--total") && i + 1 < argc)
            total = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--read"))
            read_op = 1;
        else if (!strcmp(argv[i], "--host") && i + 1 < argc)
            host = argv[++i];
        else if (!strcmp(argv[i], "--params") && i + 1 < argc)
            params = argv[++i];
        else if (!strcmp(argv[i], "--target") && i + 2 < argc) {
            target = 1;
            in = atoi(argv[++i]);
            out = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: tcp_bench [--block-size N[K|M]] [--total N[K|M|G]] "
                            "[--iters N] [--warmup N] [--read] [--host ADDR] "
                            "[--params k=v,...]\n");
            return 2;
        }
    }
    if (bs == 0 || total < bs || iters < 1) {
        fprintf(stderr, "tcp_bench: need 0 < block-size <= total and iters >= 1\n");
        return 2;
    }
    total -= total % bs;
    if (target)
        return target_main(in, out, total, host, params);

    int to[2], from[2];
    if (pipe(to) || pipe(from)) {
        perror("tcp_bench: pipe");
        return 1;
    }
    char fin[16], fout[16], tot[32], bss[32];
    snprintf(fin, sizeof(fin), "%d", to[0]);
    snprintf(fout, sizeof(fout), "%d", from[1]);
    snprintf(tot, sizeof(tot), "%" PRIu64, total);
    snprintf(bss, sizeof(bss), "%" PRIu64, bs);
    char *targv[16];
    int k = 0;
    targv[k++] = argv[0];
    targv[k++] = "--total";
    targv[k++] = tot;
    targv[k++] = "--block-size";
    targv[k++] = bss;
    targv[k++] = "--host";
    targv[k++] = (char *)host;
    if (params) {
        targv[k++] = "--params";
        targv[k++] = (char *)params;
    }
    targv[k++] = "--target";
    targv[k++] = fin;
    targv[k++] = fout;
    targv[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        close(to[1]);
        close(from[0]);
        execv("/proc/self/exe", targv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);

    kvl_agent_t *a = make_agent("bench-init", host, params);
    uint8_t *buf = alloc_reg(a, total);
    uint64_t blen, base;
    if (xread(from[0], &blen, 8) || xread(from[0], &base, 8)) {
        fprintf(stderr, "tcp_bench: the target did not start\n");
        return 1;
    }
    void *blob = malloc(blen);
    if (blob == NULL || xread(from[0], blob, blen))
        return 1;
    if (kvl_metadata_load(a, blob, blen, NULL, 0) != KVL_OK)
        die("kvl_metadata_load");
    free(blob);

    uint64_t n = total / bs;
    uint64_t *la = malloc(n * 8), *ra = malloc(n * 8);
    for (uint64_t i = 0; i < n; i++) {
        la[i] = (uint64_t)(uintptr_t)buf + i * bs;
        ra[i] = base + (n - 1 - i) * bs;
    }
    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    if (kvl_dlist_create(KVL_MEM_DRAM, n, &ld) || kvl_dlist_create(KVL_MEM_DRAM, n, &rd) ||
        kvl_dlist_add_array(ld, la, NULL, bs, KVL_DEV_ANY, n) ||
        kvl_dlist_add_array(rd, ra, NULL, bs, KVL_DEV_ANY, n))
        die("kvl_dlist_*");
    if (kvl_xfer_create(a, read_op ? KVL_READ : KVL_WRITE, ld, "bench-target", rd, NULL, &x))
        die("kvl_xfer_create");
    double *g = calloc((size_t)iters, sizeof(double));
    for (int it = 0; it < warmup; it++) {   /* not counted: first touch of memory */
        kvl_status_t st = kvl_xfer_post(x);
        if (st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 120000);
        if (st != KVL_OK)
            die("transfer");
    }
    for (int it = 0; it < iters; it++) {
        uint64_t t0 = now_ns();
        kvl_status_t st = kvl_xfer_post(x);
        if (st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 120000);
        if (st != KVL_OK)
            die("transfer");
        g[it] = (double)total / (double)(now_ns() - t0);
        printf("tcp_bench: iter %d: %.3f GB/s\n", it, g[it]);
    }
    qsort(g, (size_t)iters, sizeof(double), cmp_d);
    printf("tcp_bench: op=%s block=%" PRIu64 " total=%" PRIu64 " best=%.3f median=%.3f GB/s\n",
           read_op ? "READ" : "WRITE", bs, total, g[iters - 1], g[iters / 2]);
    kvl_xfer_release(x);
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    kvl_agent_destroy(a);
    (void)xwrite(to[1], "q", 1);
    close(to[1]);
    waitpid(pid, NULL, 0);
    free(la);
    free(ra);
    free(g);
    return 0;
}
