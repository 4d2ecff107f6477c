/*
 * kvlane demo: the main job on one host. A decode process registers its KV
 * cache and publishes its metadata; a prefill process fills its own KV cache,
 * loads the decode side's metadata and WRITEs a scattered block table into
 * it with a notification attached; the decode side waits for the
 * notification and verifies every byte, including that blocks outside the
 * table were not touched.
 *
 * KV layout on both sides: [layer][K|V][block][block_size bytes], one
 * registered region. "Block b of every layer" is one strided descriptor:
 * base + b*block_size, stride blocks*block_size, count 2*layers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "cli.h"

typedef struct {
    const char *backend;
    uint64_t layers, blocks, block_size, xfer_blocks, seed, repeat;
    int shareable;          /* 1: kvl_mem_alloc (memfd), 0: plain anonymous memory */
    int timeout_ms;
} kvl_demo_cfg_t;

#define KVL_DEMO_MAGIC 0x4b56444d /* "KVDM" */

typedef struct {
    uint32_t magic, version;
    uint64_t seed, n_blocks, bytes, duration_ns, post_ns, first_ns, repeat;
    char path[64];
} kvl_demo_notif_t;

static uint64_t kvl_demo_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The bytes prefill holds in (plane, block): plane = layer*2 + kv. */
static uint64_t kvl_demo_word(uint64_t seed, uint64_t plane, uint64_t block, uint64_t w)
{
    return kvl_demo_mix(seed ^ (plane << 44) ^ (block << 24) ^ w);
}

/* Block table: which prefill block goes to which decode block. Derived
 * from the seed on both sides: a shuffled, scattered mapping. */
static void kvl_demo_table(const kvl_demo_cfg_t *c, uint32_t *pblk, uint32_t *dblk)
{
    uint32_t *perm = malloc(c->blocks * sizeof(*perm));
    for (int side = 0; side < 2; side++) {
        for (uint64_t i = 0; i < c->blocks; i++)
            perm[i] = (uint32_t)i;
        uint64_t s = c->seed * 2 + (uint64_t)side + 1;
        for (uint64_t i = c->blocks - 1; i > 0; i--) {
            s = kvl_demo_mix(s);
            uint64_t j = s % (i + 1);
            uint32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        memcpy(side ? dblk : pblk, perm, c->xfer_blocks * sizeof(*perm));
    }
    free(perm);
}

static void *kvl_demo_alloc(kvl_agent_t *a, const kvl_demo_cfg_t *c, size_t len)
{
    void *p = NULL;
    if (c->shareable) {
        if (kvl_mem_alloc(a, len, &p) != KVL_OK) {
            kvl_cli_print_error("kvl_mem_alloc");
            return NULL;
        }
        return p;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "kvlane demo: mmap(%zu) failed: %s\n", len, strerror(errno));
        return NULL;
    }
    return p;
}

static kvl_agent_t *kvl_demo_agent(const char *name, const kvl_demo_cfg_t *c)
{
    kvl_agent_t *a = NULL;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    if (kvl_agent_create(name, &cfg, &a) != KVL_OK) {
        kvl_cli_print_error("kvl_agent_create");
        return NULL;
    }
    if (kvl_backend_create(a, c->backend, NULL, 0, NULL) != KVL_OK) {
        kvl_cli_print_error("kvl_backend_create");
        kvl_agent_destroy(a);
        return NULL;
    }
    return a;
}

static int kvl_demo_register(kvl_agent_t *a, void *p, size_t len, const char *who)
{
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)p, len, KVL_DEV_ANY};
    kvl_reg_report_t *rep = NULL;
    kvl_status_t st = kvl_mem_register(a, &d, 1, NULL, &rep);
    if (st != KVL_OK) {
        kvl_cli_print_error("kvl_mem_register");
        kvl_reg_report_free(rep);
        return -1;
    }
    char buf[2048];
    kvl_reg_report_render(rep, buf, sizeof(buf));
    printf("%s: %s", who, buf);
    kvl_reg_report_free(rep);
    return 0;
}

static int kvl_demo_decode(const kvl_demo_cfg_t *c, int md_fd)
{
    size_t plane = c->blocks * c->block_size, len = plane * 2 * c->layers;
    kvl_agent_t *a = kvl_demo_agent("decode", c);
    if (a == NULL)
        return 1;
    uint8_t *kv = kvl_demo_alloc(a, c, len);
    if (kv == NULL)
        return 1;
    memset(kv, 0xD1, len); /* sentinel: untouched blocks must keep it */
    if (kvl_demo_register(a, kv, len, "decode") != 0)
        return 1;
    void *blob;
    size_t blen;
    if (kvl_metadata_get(a, &blob, &blen) != KVL_OK) {
        kvl_cli_print_error("kvl_metadata_get");
        return 1;
    }
    uint32_t l32 = (uint32_t)blen;
    if (kvl_cli_write_all(md_fd, &l32, sizeof(l32)) || kvl_cli_write_all(md_fd, blob, blen)) {
        fprintf(stderr, "decode: cannot hand metadata to prefill: %s\n", strerror(errno));
        return 1;
    }
    kvl_free(blob);
    close(md_fd);
    printf("decode: KV cache %" PRIu64 " layers x K/V x %" PRIu64 " blocks x %" PRIu64
           " B = %.1f MiB registered; metadata published (%zu bytes); waiting for prefill\n",
           c->layers, c->blocks, c->block_size, (double)len / (1 << 20), blen);
    fflush(stdout);

    if (kvl_notif_wait(a, c->timeout_ms) != KVL_OK) {
        fprintf(stderr, "decode: no notification from prefill within %d ms\n", c->timeout_ms);
        return 1;
    }
    kvl_notif_t n;
    size_t got = 0;
    kvl_notif_poll(a, &n, 1, &got);
    kvl_demo_notif_t hdr;
    if (got != 1 || n.len != sizeof(hdr)) {
        fprintf(stderr, "decode: unexpected notification (%zu bytes)\n", got ? n.len : 0);
        return 1;
    }
    memcpy(&hdr, n.msg, sizeof(hdr));
    if (hdr.magic != KVL_DEMO_MAGIC || hdr.seed != c->seed || hdr.n_blocks != c->xfer_blocks) {
        fprintf(stderr, "decode: notification does not describe this run\n");
        return 1;
    }
    printf("decode: notification from '%s': %" PRIu64 " blocks ready\n", n.from, hdr.n_blocks);
    kvl_notif_free(&n);
    /* prefill's report of how the transfer went */
    if (kvl_notif_wait(a, c->timeout_ms) != KVL_OK || kvl_notif_poll(a, &n, 1, &got) != KVL_OK ||
        got != 1 || n.len != sizeof(hdr)) {
        fprintf(stderr, "decode: no transfer report from prefill within %d ms\n", c->timeout_ms);
        return 1;
    }
    memcpy(&hdr, n.msg, sizeof(hdr));
    kvl_notif_free(&n);

    /* Verify every byte: moved blocks hold prefill's pattern, the rest the
     * sentinel. */
    uint32_t *pblk = malloc(c->xfer_blocks * sizeof(*pblk));
    uint32_t *dblk = malloc(c->xfer_blocks * sizeof(*dblk));
    int64_t *src = malloc(c->blocks * sizeof(*src));
    kvl_demo_table(c, pblk, dblk);
    for (uint64_t b = 0; b < c->blocks; b++)
        src[b] = -1;
    for (uint64_t i = 0; i < c->xfer_blocks; i++)
        src[dblk[i]] = pblk[i];
    uint64_t bad = 0, checked = 0, untouched = 0;
    uint64_t words = c->block_size / 8;
    for (uint64_t p = 0; p < 2 * c->layers; p++) {
        for (uint64_t b = 0; b < c->blocks; b++) {
            const uint8_t *blk = kv + p * plane + b * c->block_size;
            if (src[b] < 0) {
                for (uint64_t k = 0; k < c->block_size; k++)
                    bad += blk[k] != 0xD1;
                untouched++;
                continue;
            }
            for (uint64_t w = 0; w < words; w++) {
                uint64_t v;
                memcpy(&v, blk + w * 8, 8);
                bad += v != kvl_demo_word(c->seed, p, (uint64_t)src[b], w);
            }
            checked++;
        }
    }
    free(pblk);
    free(dblk);
    free(src);
    double gbps = hdr.duration_ns ? (double)hdr.bytes / (double)hdr.duration_ns : 0;
    double cold = hdr.first_ns ? (double)hdr.bytes / (double)hdr.first_ns : 0;
    printf("decode: moved %.1f MiB (%" PRIu64 " blocks of %" PRIu64 " B) over backend %s (path %s):"
           " %.2f GB/s (%.2f ms; first of %" PRIu64 " transfers: %.2f GB/s)\n",
           (double)hdr.bytes / (1 << 20), checked, c->block_size, c->backend, hdr.path, gbps,
           hdr.duration_ns / 1e6, hdr.repeat, cold);
    if (bad) {
        printf("decode: FAILED: %" PRIu64 " mismatching words/bytes\n", bad);
        return 1;
    }
    printf("decode: verified %" PRIu64 " moved blocks byte for byte and %" PRIu64
           " untouched blocks: verified\n", checked, untouched);
    kvl_agent_destroy(a);
    return 0;
}

static int kvl_demo_prefill(const kvl_demo_cfg_t *c, int md_fd)
{
    size_t plane = c->blocks * c->block_size, len = plane * 2 * c->layers;
    kvl_agent_t *a = kvl_demo_agent("prefill", c);
    if (a == NULL)
        return 1;
    uint8_t *kv = kvl_demo_alloc(a, c, len);
    if (kv == NULL)
        return 1;
    uint64_t words = c->block_size / 8;
    for (uint64_t p = 0; p < 2 * c->layers; p++)
        for (uint64_t b = 0; b < c->blocks; b++) {
            uint8_t *blk = kv + p * plane + b * c->block_size;
            for (uint64_t w = 0; w < words; w++) {
                uint64_t v = kvl_demo_word(c->seed, p, b, w);
                memcpy(blk + w * 8, &v, 8);
            }
        }
    if (kvl_demo_register(a, kv, len, "prefill") != 0)
        return 1;

    uint32_t l32;
    if (kvl_cli_read_all(md_fd, &l32, sizeof(l32), c->timeout_ms) != 0 || l32 == 0 || l32 > (64u << 20)) {
        fprintf(stderr, "prefill: no metadata from decode within %d ms\n", c->timeout_ms);
        return 1;
    }
    void *blob = malloc(l32);
    if (blob == NULL || kvl_cli_read_all(md_fd, blob, l32, c->timeout_ms) != 0) {
        fprintf(stderr, "prefill: metadata from decode truncated\n");
        return 1;
    }
    char remote[KVL_NAME_MAX];
    if (kvl_metadata_load(a, blob, l32, remote, sizeof(remote)) != KVL_OK) {
        kvl_cli_print_error("kvl_metadata_load");
        return 1;
    }
    free(blob);

    /* Decode registered its whole KV cache as one region: its base comes
     * from the loaded metadata, as an engine reads the peer's KV layout. */
    kvl_mem_desc_t rreg;
    size_t nr = 0;
    if (kvl_remote_regions(a, remote, &rreg, NULL, 1, &nr) != KVL_OK || nr != 1 || rreg.len != len) {
        fprintf(stderr, "prefill: decode exposes %zu regions, expected one of %zu bytes\n", nr, len);
        return 1;
    }
    uint64_t rbase = rreg.addr;

    uint32_t *pblk = malloc(c->xfer_blocks * sizeof(*pblk));
    uint32_t *dblk = malloc(c->xfer_blocks * sizeof(*dblk));
    kvl_demo_table(c, pblk, dblk);
    kvl_dlist_t *ld, *rd;
    kvl_dlist_create(KVL_MEM_DRAM, c->xfer_blocks, &ld);
    kvl_dlist_create(KVL_MEM_DRAM, c->xfer_blocks, &rd);
    for (uint64_t i = 0; i < c->xfer_blocks; i++) {
        if (kvl_dlist_add_strided(ld, (uint64_t)(uintptr_t)kv + pblk[i] * c->block_size, plane,
                                  2 * c->layers, c->block_size, KVL_DEV_ANY) != KVL_OK ||
            kvl_dlist_add_strided(rd, rbase + dblk[i] * c->block_size, plane, 2 * c->layers,
                                  c->block_size, KVL_DEV_ANY) != KVL_OK) {
            kvl_cli_print_error("kvl_dlist_add_strided");
            return 1;
        }
    }
    free(pblk);
    free(dblk);

    kvl_demo_notif_t hdr = {.magic = KVL_DEMO_MAGIC, .version = 1, .seed = c->seed,
                            .n_blocks = c->xfer_blocks};
    kvl_xfer_t *x;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = &hdr,
                            .notif_len = sizeof(hdr)};
    /* Earlier requests' blocks move first (a serving engine moves blocks
     * again and again): silent transfers, then the one that carries the
     * notification. The first shows the cold cost, the best the steady one. */
    kvl_xfer_params_t silent = {0};
    double tc = kvl_cli_now(), t0 = 0, t1 = 0, best = 1e30, first = 0;
    kvl_status_t st = KVL_OK;
    for (uint64_t r = 0; r < c->repeat && st == KVL_OK; r++) {
        int last = r + 1 == c->repeat;
        if (kvl_xfer_create(a, KVL_WRITE, ld, remote, rd, last ? &xp : &silent, &x) != KVL_OK) {
            kvl_cli_print_error("kvl_xfer_create");
            return 1;
        }
        if (r == 0)
            t0 = kvl_cli_now();
        double ts = kvl_cli_now();
        st = kvl_xfer_post(x);
        if (st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, c->timeout_ms);
        t1 = kvl_cli_now();
        if (r == 0)
            first = t1 - ts;
        if (t1 - ts < best)
            best = t1 - ts;
        if (!last)
            kvl_xfer_release(x);
    }
    if (st != KVL_OK) {
        kvl_cli_print_error("transfer");
        return 1;
    }
    (void)t0;
    kvl_xfer_stats_t stats;
    kvl_xfer_get_stats(x, &stats);
    /* The data and its notification are in place; tell decode how it went
     * (a second, plain notification, ordered after the first). */
    hdr.bytes = stats.bytes;
    hdr.duration_ns = (uint64_t)(best * 1e9);
    hdr.first_ns = (uint64_t)(first * 1e9);
    hdr.repeat = c->repeat;
    hdr.post_ns = stats.post_ns;
    snprintf(hdr.path, sizeof(hdr.path), "%s", stats.path);
    if (kvl_notif_send(a, remote, &hdr, sizeof(hdr)) != KVL_OK) {
        kvl_cli_print_error("kvl_notif_send");
        return 1;
    }
    printf("prefill: %" PRIu64 " descriptors prepared and posted in %.1f us per transfer\n",
           2 * c->xfer_blocks, stats.post_ns / 1e3);
    (void)tc;
    printf("prefill: wrote %.1f MiB as %" PRIu64 " strided descriptors (%" PRIu64
           " blocks) to '%s' over %s (path %s) %" PRIu64 " time(s): first %.2f GB/s, best %.2f "
           "GB/s; the last carried the notification\n",
           (double)stats.bytes / (1 << 20), c->xfer_blocks, stats.blocks, remote, stats.backend,
           stats.path, c->repeat, (double)stats.bytes / (first * 1e9),
           (double)stats.bytes / (best * 1e9));
    kvl_xfer_release(x);
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);
    kvl_agent_destroy(a);
    return 0;
}

static void kvl_demo_usage(FILE *f)
{
    fprintf(f,
            "usage: kvlane demo [options]\n"
            "  --backend NAME      backend to move the KV cache (default shm)\n"
            "  --layers N          layers (default 32)\n"
            "  --blocks N          KV blocks per layer (default 512)\n"
            "  --block-size BYTES  bytes per block per K or V (default 16K)\n"
            "  --xfer-blocks N     blocks of the request, scattered (default: all)\n"
            "  --mem shareable|plain  KV cache memory: kvl_mem_alloc (default) or plain\n"
            "                      anonymous memory (moved by cross-memory attach)\n"
            "  --seed N            pattern and block-table seed (default 1)\n"
            "  --repeat N          transfers of the block table; the last carries the\n"
            "                      notification (default 3)\n"
            "  --timeout-ms N      bound for every wait (default 60000)\n");
}

int kvl_cli_demo(int argc, char **argv)
{
    kvl_demo_cfg_t c = {"shm", 32, 512, 16384, 0, 1, 3, 1, 60000};
    static const struct option opts[] = {
        {"backend", required_argument, 0, 'b'}, {"layers", required_argument, 0, 'l'},
        {"blocks", required_argument, 0, 'n'},  {"block-size", required_argument, 0, 's'},
        {"xfer-blocks", required_argument, 0, 'x'}, {"mem", required_argument, 0, 'm'},
        {"seed", required_argument, 0, 'r'},    {"timeout-ms", required_argument, 0, 't'},
        {"repeat", required_argument, 0, 'p'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int o, li = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        uint64_t v = 0;
        if (o == 'h') {
            kvl_demo_usage(stdout);
            return 0;
        }
        if (o == '?') {
            kvl_demo_usage(stderr);
            return 2;
        }
        if (o == 'b') {
            c.backend = optarg;
            continue;
        }
        if (o == 'm') {
            if (strcmp(optarg, "shareable") && strcmp(optarg, "plain")) {
                fprintf(stderr, "kvlane demo: --mem takes shareable or plain\n");
                return 2;
            }
            c.shareable = strcmp(optarg, "shareable") == 0;
            continue;
        }
        if (kvl_cli_parse_size(optarg, &v) != 0 || v == 0) {
            fprintf(stderr, "kvlane demo: bad value '%s' for --%s\n", optarg, opts[li].name);
            return 2;
        }
        /* bounds: a count is refused, never wrapped (--timeout-ms past 2^31
         * turned negative) */
        uint64_t most = o == 'l' ? 65536 : o == 'n' || o == 'x' ? UINT32_MAX
                        : o == 't' ? 86400000 : o == 'p' ? 1000000 : 0;
        if (most != 0 && v > most) {
            fprintf(stderr, "kvlane demo: --%s %s is more than %" PRIu64 "\n", opts[li].name,
                    optarg, most);
            return 2;
        }
        switch (o) {
        case 'l': c.layers = v; break;
        case 'n': c.blocks = v; break;
        case 's': c.block_size = v; break;
        case 'x': c.xfer_blocks = v; break;
        case 'r': c.seed = v; break;
        case 't': c.timeout_ms = (int)v; break;
        case 'p': c.repeat = v; break;
        }
    }
    if (c.xfer_blocks == 0)
        c.xfer_blocks = c.blocks;
    if (c.xfer_blocks > c.blocks) {
        fprintf(stderr, "kvlane demo: --xfer-blocks %" PRIu64 " is more than the %" PRIu64
                        " blocks of a layer (--blocks)\n", c.xfer_blocks, c.blocks);
        return 2;
    }
    if (c.block_size % 8) {
        fprintf(stderr, "kvlane demo: --block-size %" PRIu64 " is not a multiple of 8\n",
                c.block_size);
        return 2;
    }
    uint64_t kv;
    if (__builtin_mul_overflow(c.layers * 2, c.blocks, &kv) ||
        __builtin_mul_overflow(kv, c.block_size, &kv)) {
        fprintf(stderr, "kvlane demo: a KV cache of %" PRIu64 " x 2 x %" PRIu64 " x %" PRIu64
                        " bytes is more than 2^64 bytes\n", c.layers, c.blocks, c.block_size);
        return 2;
    }
    printf("kvlane demo: backend %s, %s memory, KV cache %" PRIu64 " x 2 x %" PRIu64 " x %" PRIu64
           " B, moving %" PRIu64 " scattered blocks\n", c.backend,
           c.shareable ? "shareable (kvl_mem_alloc)" : "plain", c.layers, c.blocks, c.block_size,
           c.xfer_blocks);
    fflush(stdout);

    int md[2];
    if (pipe(md) != 0) {
        perror("kvlane demo: pipe");
        return 1;
    }
    pid_t dec = fork();
    if (dec == 0) {
        close(md[0]);
        int r = kvl_demo_decode(&c, md[1]);
        fflush(NULL);
        _exit(r);
    }
    close(md[1]);
    /* The parent relays decode's metadata to prefill, as a router or the
     * engines' own handshake would. */
    uint32_t l32;
    void *blob = NULL;
    int rc = 1;
    int pf[2];
    if (kvl_cli_read_all(md[0], &l32, sizeof(l32), c.timeout_ms) != 0 || l32 == 0 ||
        l32 > (64u << 20) || (blob = malloc(l32)) == NULL ||
        kvl_cli_read_all(md[0], blob, l32, c.timeout_ms) != 0 || pipe(pf) != 0) {
        fprintf(stderr, "kvlane demo: decode did not publish its metadata\n");
        kill(dec, SIGKILL);
        waitpid(dec, NULL, 0);
        return 1;
    }
    pid_t pre = fork();
    if (pre == 0) {
        close(pf[1]);
        int r = kvl_demo_prefill(&c, pf[0]);
        fflush(NULL);
        _exit(r);
    }
    close(pf[0]);
    if (kvl_cli_write_all(pf[1], &l32, sizeof(l32)) || kvl_cli_write_all(pf[1], blob, l32))
        fprintf(stderr, "kvlane demo: cannot hand metadata to prefill\n");
    close(pf[1]);
    free(blob);
    int sd = 0, sp = 0;
    waitpid(pre, &sp, 0);
    if (!WIFEXITED(sp) || WEXITSTATUS(sp) != 0)
        kill(dec, SIGTERM); /* decode would wait for a notification that never comes */
    waitpid(dec, &sd, 0);
    rc = (WIFEXITED(sd) && WEXITSTATUS(sd) == 0 && WIFEXITED(sp) && WEXITSTATUS(sp) == 0) ? 0 : 1;
    printf("kvlane demo: %s\n", rc == 0 ? "success" : "FAILED");
    return rc;
}
