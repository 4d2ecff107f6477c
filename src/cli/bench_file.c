/*
 * kvlane bench --backend posix: DRAM to a file and back through the posix
 * backend (FILE memory), as an engine offloading KV cache does. One agent,
 * one file in --dir (made, laid out once, removed at the end; or --file, an
 * existing one used as is, e.g. the file fio laid out); per block
 * size, --iters transfers of --size bytes each way; the median bandwidth.
 *
 *   contiguous  the file is written / read from offset 0 in block order
 *               (memory blocks in reverse order, so that each block is one
 *               I/O of the block size: adjacent blocks would coalesce)
 *   random      --count blocks at shuffled offsets of a file of twice as many
 *               blocks (scattered KV blocks; fio's random write covers the
 *               same span): each transfer a new one (created, posted and
 *               waited for, all timed) to blocks drawn afresh, as each offload
 *               of an engine writes other blocks and fio draws every offset
 *
 * bench/file_compare.sh runs it side by side with fio on the same file, block
 * size and queue depth.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "cli.h"

typedef struct {
    const char *dir, *engine, *csv;
    const char *file;                 /* --file: an existing file, used as is */
    const char *pattern;
    uint64_t sizes[16];
    int nsizes;
    uint64_t total, count, qd;
    uint64_t bufs;                    /* --buffers: memory blocks cycle through these (0: all distinct) */
    unsigned iters;
    int direct, do_write, do_read, quiet;
    int vram, dev;
} kvl_fbench_t;

/* n of 2n block slots, drawn without replacement (a shuffle of all 2n, the
 * first n kept, in that order), as block offsets into r. */
static int kvl_fbench_draw(kvl_dlist_t *r, uint64_t n, uint64_t bs, int fd)
{
    uint64_t slots = 2 * n;
    uint64_t *perm = malloc(slots * sizeof(*perm));
    if (perm == NULL)
        return -1;
    for (uint64_t i = 0; i < slots; i++)
        perm[i] = i;
    for (uint64_t i = slots - 1; i > 0; i--) {
        uint64_t j = ((uint64_t)rand() << 16 ^ (uint64_t)rand()) % (i + 1);
        uint64_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int rc = 0;
    for (uint64_t i = 0; i < n && rc == 0; i++)
        rc = kvl_dlist_add(r, perm[i] * bs, bs, fd) == KVL_OK ? 0 : -1;
    free(perm);
    return rc;
}

/* --iters measured transfers, after one more that warms up: the median
 * GB/s. With r: one transfer to r, re-posted (post and wait timed). Without
 * (the random pattern, as an engine offloads): every transfer a new one to
 * n blocks of bs bytes drawn afresh, as fio draws every write's offset; its
 * creation is timed with its post and wait. */
static double kvl_fbench_run(kvl_agent_t *a, kvl_xfer_op_t op, kvl_dlist_t *l, kvl_dlist_t *r,
                             uint64_t n, uint64_t bs, int fd, unsigned iters, char *path,
                             size_t path_len)
{
    double *v = calloc(iters + 1, sizeof(double));
    uint64_t bytes = kvl_dlist_bytes(l);
    double med = -1;
    kvl_xfer_t *x = NULL;
    kvl_dlist_t *fresh = NULL;
    if (v == NULL)
        return -1;
    if (r != NULL && kvl_xfer_create(a, op, l, kvl_agent_name(a), r, NULL, &x) != KVL_OK) {
        kvl_cli_print_error("kvl_xfer_create");
        goto out;
    }
    for (unsigned i = 0; i <= iters; i++) { /* i == 0: warm-up */
        if (r == NULL && (kvl_dlist_create(KVL_MEM_FILE, n, &fresh) != KVL_OK ||
                          kvl_fbench_draw(fresh, n, bs, fd) != 0)) {
            kvl_cli_print_error("bench: the file's blocks");
            goto out;
        }
        double t0 = kvl_cli_now();
        kvl_status_t st = KVL_OK;
        if (r == NULL)
            st = kvl_xfer_create(a, op, l, kvl_agent_name(a), fresh, NULL, &x);
        if (st == KVL_OK)
            st = kvl_xfer_post(x);
        if ((st != KVL_OK && st != KVL_IN_PROGRESS) || kvl_xfer_wait(x, 600000) != KVL_OK) {
            kvl_cli_print_error(op == KVL_WRITE ? "WRITE" : "READ");
            goto out;
        }
        if (i > 0)
            v[i - 1] = (double)bytes / (kvl_cli_now() - t0) / 1e9;
        kvl_xfer_stats_t s;
        if (kvl_xfer_get_stats(x, &s) == KVL_OK)
            snprintf(path, path_len, "%s", s.path);
        if (r == NULL) {
            kvl_xfer_release(x);
            x = NULL;
            kvl_dlist_destroy(fresh);
            fresh = NULL;
        }
    }
    qsort(v, iters, sizeof(double), kvl_cli_cmp_double);
    med = v[iters / 2];
out:
    kvl_xfer_release(x);
    kvl_dlist_destroy(fresh);
    free(v);
    return med;
}

static void kvl_fbench_usage(FILE *f)
{
    fprintf(f,
            "usage: kvlane bench --backend posix [options]\n"
            "  --dir DIR          where the test file goes (default $TMPDIR or /tmp)\n"
            "  --file PATH        use this existing file as is (not laid out, not removed;\n"
            "                     large enough for the rows), e.g. the one fio laid out\n"
            "  --block-size LIST  block sizes, e.g. 256K,1M,4M (default 256K,1M,4M)\n"
            "  --size BYTES       bytes per transfer, contiguous pattern (default 256M)\n"
            "  --pattern P        contiguous (default) or random (scattered blocks)\n"
            "  --count N          blocks per transfer, random pattern (default 4096)\n"
            "  --buffers N        memory blocks cycle through N buffers of the block size\n"
            "                     (default: every block its own, as a KV cache; N = the\n"
            "                     queue depth is fio's footprint: its iodepth buffers)\n"
            "  --op OP            write, read or both (default both)\n"
            "  --queue-depth N    operations in flight (default 64)\n"
            "  --engine E         auto (default), io_uring or threads\n"
            "  --buffered         page cache I/O (default: O_DIRECT)\n"
            "  --mem KIND         DRAM (default) or VRAM (staged through pinned buffers)\n"
            "  --device N         the GPU for VRAM (default 0)\n"
            "  --iters N          measured transfers per row (default 5; median reported)\n"
            "  --csv FILE         also write the rows as CSV\n"
            "  --quiet            rows only\n");
}

/* A new file of fsize bytes in c->dir, laid out with data as fio does (with
 * O_DIRECT when the rows use it, so none of it sits in the page cache and
 * every block is written): reads then read written blocks, not unwritten
 * extents, and writes overwrite. 0, or 2 with the reason printed. */
static int kvl_fbench_make_file(const kvl_fbench_t *c, uint64_t fsize, char *path, size_t cap,
                                int *fd_p)
{
    size_t lay = 4u << 20;
    char *z = NULL;
    snprintf(path, cap, "%s/kvlane-bench-XXXXXX", c->dir);
    int fd0 = mkstemp(path);
    if (fd0 < 0) {
        fprintf(stderr, "kvlane bench: cannot create a file in %s: %s\n", c->dir, strerror(errno));
        return 2;
    }
    int lfd = c->direct ? open(path, O_RDWR | O_DIRECT) : -1;
    if (lfd < 0)
        lfd = fd0; /* no O_DIRECT here: the transfers' open says so */
    if ((posix_fallocate(fd0, 0, (off_t)fsize) != 0 && ftruncate(fd0, (off_t)fsize) != 0) ||
        posix_memalign((void **)&z, 4096, lay) != 0) {
        fprintf(stderr, "kvlane bench: cannot size %s to %llu bytes: %s\n", path,
                (unsigned long long)fsize, strerror(errno));
        goto fail;
    }
    memset(z, 0xa5, lay);
    for (uint64_t at = 0; at < fsize; at += lay) {
        size_t k = fsize - at < lay ? (size_t)(fsize - at) : lay;
        if (pwrite(lfd, z, k, (off_t)at) != (ssize_t)k) {
            fprintf(stderr, "kvlane bench: cannot lay out %s (%llu bytes): %s\n", path,
                    (unsigned long long)fsize, strerror(errno));
            goto fail;
        }
    }
    free(z);
    if (lfd != fd0)
        close(lfd);
    fsync(fd0);
    posix_fadvise(fd0, 0, (off_t)fsize, POSIX_FADV_DONTNEED);
    *fd_p = fd0;
    return 0;
fail:
    free(z);
    if (lfd != fd0)
        close(lfd);
    close(fd0);
    unlink(path);
    return 2;
}

int kvl_cli_bench_file(int argc, char **argv);
int kvl_cli_bench_file(int argc, char **argv)
{
    kvl_fbench_t c = {.engine = "auto", .pattern = "contiguous", .total = 256ull << 20,
                      .count = 4096, .qd = 64, .iters = 5, .direct = 1, .do_write = 1,
                      .do_read = 1};
    static const struct option opts[] = {
        {"backend", 1, 0, 'b'}, {"dir", 1, 0, 'd'}, {"block-size", 1, 0, 's'},
        {"size", 1, 0, 'S'}, {"pattern", 1, 0, 'p'}, {"count", 1, 0, 'n'}, {"op", 1, 0, 'o'},
        {"queue-depth", 1, 0, 'Q'}, {"engine", 1, 0, 'e'}, {"buffered", 0, 0, 'u'},
        {"iters", 1, 0, 'i'}, {"csv", 1, 0, 'c'}, {"quiet", 0, 0, 'q'}, {"help", 0, 0, 'h'},
        {"mem", 1, 0, 'm'}, {"device", 1, 0, 'D'}, {"file", 1, 0, 'F'},
        {"buffers", 1, 0, 'B'}, {0, 0, 0, 0}};
    int o, li = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        uint64_t v = 0;
        if (strchr("SnQiB", o) && (kvl_cli_parse_size(optarg, &v) != 0 || v == 0)) {
            fprintf(stderr, "kvlane bench: bad value '%s' for --%s\n", optarg, opts[li].name);
            return 2;
        }
        /* the bounds of the counts: refused, never cut down or wrapped */
        uint64_t most = o == 'i' ? 1000000 : o == 'n' ? 1u << 24 : o == 'B' ? 1u << 24 : 0;
        if (most != 0 && v > most) {
            fprintf(stderr, "kvlane bench: --%s %s is more than %llu\n", opts[li].name, optarg,
                    (unsigned long long)most);
            return 2;
        }
        switch (o) {
        case 'b':
            if (strcmp(optarg, "posix") != 0) {
                fprintf(stderr, "kvlane bench: the file bench runs the posix backend only\n");
                return 2;
            }
            break;
        case 'd': c.dir = optarg; break;
        case 'F': c.file = optarg; break;
        case 's': {
            char buf[256], *items[16], why[96];
            int n = kvl_cli_split(optarg, buf, sizeof(buf), items, 16, why, sizeof(why));
            for (int i = 0; i < n; i++)
                if (kvl_cli_parse_size(items[i], &c.sizes[i]) != 0 || c.sizes[i] == 0) {
                    snprintf(why, sizeof(why), "'%.60s' is not a size above 0", items[i]);
                    n = -1;
                }
            if (n < 0) {
                fprintf(stderr, "kvlane bench: bad --block-size list '%s': %s\n", optarg, why);
                return 2;
            }
            c.nsizes = n;
            break;
        }
        case 'S': c.total = v; break;
        case 'p':
            if (strcmp(optarg, "contiguous") != 0 && strcmp(optarg, "random") != 0) {
                fprintf(stderr, "kvlane bench: --pattern for posix is contiguous or random\n");
                return 2;
            }
            c.pattern = optarg;
            break;
        case 'n': c.count = v; break;
        case 'B': c.bufs = v; break;
        case 'o':
            c.do_write = strcmp(optarg, "read") != 0;
            c.do_read = strcmp(optarg, "write") != 0;
            if (strcmp(optarg, "read") && strcmp(optarg, "write") && strcmp(optarg, "both")) {
                fprintf(stderr, "kvlane bench: --op is write, read or both\n");
                return 2;
            }
            break;
        case 'Q': c.qd = v; break;
        case 'e': c.engine = optarg; break;
        case 'u': c.direct = 0; break;
        case 'i': c.iters = (unsigned)v; break;
        case 'c': c.csv = optarg; break;
        case 'q': c.quiet = 1; break;
        case 'm':
            if (strcasecmp(optarg, "VRAM") != 0 && strcasecmp(optarg, "DRAM") != 0) {
                fprintf(stderr, "kvlane bench: --mem for posix is DRAM or VRAM\n");
                return 2;
            }
            c.vram = strcasecmp(optarg, "VRAM") == 0;
            break;
        case 'D': {
            uint64_t d;
            if (kvl_cli_parse_uint(optarg, 4095, &d) != 0) { /* atoi read "abc" as 0 */
                fprintf(stderr, "kvlane bench: bad --device '%s' (a CUDA ordinal: 0, 1, ...)\n",
                        optarg);
                return 2;
            }
            c.dev = (int)d;
            break;
        }
        case 'h': kvl_fbench_usage(stdout); return 0;
        default: kvl_fbench_usage(stderr); return 2;
        }
    }
    int random = strcmp(c.pattern, "random") == 0;
    if (c.nsizes == 0) {
        if (random) {
            c.sizes[0] = 16 << 10;
            c.nsizes = 1;
        } else {
            c.sizes[0] = 256 << 10, c.sizes[1] = 1 << 20, c.sizes[2] = 4 << 20;
            c.nsizes = 3;
        }
    }
    const char *t = getenv("TMPDIR");
    if (c.dir == NULL)
        c.dir = t && t[0] ? t : "/tmp";
    /* the largest buffer and file the rows need */
    uint64_t need = 0;
    for (int i = 0; i < c.nsizes; i++) {
        uint64_t n = c.total;
        if (random && __builtin_mul_overflow(c.count, c.sizes[i], &n)) {
            fprintf(stderr, "kvlane bench: --count %llu blocks of %llu bytes is more than 2^64 "
                            "bytes\n", (unsigned long long)c.count,
                    (unsigned long long)c.sizes[i]);
            return 2;
        }
        if (n > need)
            need = n;
    }
    char path[4200];
    uint64_t fsize = random ? 2 * need : need; /* random: twice the blocks in slots */
    int own = c.file == NULL, fd0;
    if (!own) {
        struct stat stf;
        snprintf(path, sizeof(path), "%s", c.file);
        fd0 = open(path, O_RDWR);
        if (fd0 < 0 || fstat(fd0, &stf) != 0 || (uint64_t)stf.st_size < fsize) {
            fprintf(stderr, "kvlane bench: --file %s: %s; these rows need a file of %llu bytes\n",
                    path, fd0 < 0 ? strerror(errno) : "too small",
                    (unsigned long long)fsize);
            if (fd0 >= 0)
                close(fd0);
            return 2;
        }
    } else if (kvl_fbench_make_file(&c, fsize, path, sizeof(path), &fd0) != 0) {
        return 2;
    }
    int fd = c.direct ? open(path, O_RDWR | O_DIRECT) : fd0;
    if (fd < 0) {
        fprintf(stderr, "kvlane bench: %s refuses O_DIRECT (%s); use --buffered\n", c.dir,
                strerror(errno));
        close(fd0);
        if (own)
            unlink(path);
        return 2;
    }
    unsigned char *buf = NULL;
    if (c.vram) {
        uint64_t gp = 0;
        char why[512];
        if (kvl_cli_gpu_alloc(c.dev, need, &gp, why, sizeof(why)) != 0) {
            fprintf(stderr, "kvlane bench: --mem VRAM: %s\n", why);
            if (fd != fd0)
                close(fd);
            close(fd0);
            if (own)
                unlink(path);
            return 2;
        }
        buf = (unsigned char *)(uintptr_t)gp;
    } else {
        buf = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED) {
            fprintf(stderr, "kvlane bench: mmap(%llu) failed: %s\n", (unsigned long long)need,
                    strerror(errno));
            close(fd0);
            if (own)
                unlink(path);
            return 2;
        }
        memset(buf, 0x5a, need);
        /* engines' host KV pools are pinned memory: lock it so that the
         * host's proactive reclaim does not page it out between transfers
         * (best effort: RLIMIT_MEMLOCK may refuse) */
        if (mlock(buf, need) != 0 && !c.quiet)
            printf("(the buffer is not locked: mlock: %s)\n", strerror(errno));
    }
    kvl_agent_t *a = NULL;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    char qd[32];
    snprintf(qd, sizeof(qd), "%llu", (unsigned long long)c.qd);
    kvl_param_t prm[] = {{"engine", c.engine}, {"queue_depth", qd}, {NULL, NULL}};
    int rc = 2;
    FILE *csv = NULL;
    if (kvl_agent_create("bench-file", &cfg, &a) != KVL_OK ||
        kvl_backend_create(a, "posix", prm, 2, NULL) != KVL_OK) {
        kvl_cli_print_error("posix backend");
        goto out;
    }
    kvl_mem_desc_t dm = {(uint64_t)(uintptr_t)buf, need, c.vram ? c.dev : KVL_DEV_ANY},
                   df = {0, fsize, fd};
    kvl_reg_params_t pd = {.field_mask = KVL_REG_PARAM_KIND,
                           .kind = c.vram ? KVL_MEM_VRAM : KVL_MEM_DRAM};
    kvl_reg_params_t pf = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    if (kvl_mem_register(a, &dm, 1, &pd, NULL) != KVL_OK ||
        kvl_mem_register(a, &df, 1, &pf, NULL) != KVL_OK) {
        kvl_cli_print_error("kvl_mem_register");
        goto out;
    }
    if (c.csv != NULL) {
        if ((csv = fopen(c.csv, "w")) == NULL) { /* asked for: not run without it */
            fprintf(stderr, "kvlane bench: cannot write %s: %s\n", c.csv, strerror(errno));
            rc = 2;
            goto out;
        }
        fprintf(csv, "op,pattern,block,blocks,bytes,gbps,path\n");
    }
    if (!c.quiet) {
        char blocks[64] = "all distinct";
        if (c.bufs)
            snprintf(blocks, sizeof(blocks), "cycling through %llu", (unsigned long long)c.bufs);
        printf("posix bench: %s %s, %s, queue depth %llu, file %s, memory blocks %s\n",
               c.vram ? "VRAM" : "DRAM", c.pattern, c.direct ? "O_DIRECT" : "page cache",
               (unsigned long long)c.qd, path, blocks);
    }
    printf("%-6s %-10s %10s %8s %12s %9s  %s\n", "op", "pattern", "block", "blocks", "bytes",
           "GB/s", "path");
    srand(12345);
    for (int si = 0; si < c.nsizes; si++) {
        uint64_t bs = c.sizes[si];
        uint64_t n = random ? c.count : c.total / bs;
        if (n == 0)
            continue;
        /* contiguous: the file's blocks in order, one transfer re-posted;
         * random: each transfer to n of the file's 2n block slots, drawn
         * afresh (kvl_fbench_run_random) */
        kvl_dlist_t *l = NULL, *r = NULL;
        if (kvl_dlist_create(c.vram ? KVL_MEM_VRAM : KVL_MEM_DRAM, n, &l) != KVL_OK ||
            (!random && kvl_dlist_create(KVL_MEM_FILE, n, &r) != KVL_OK)) {
            kvl_dlist_destroy(l);
            goto out;
        }
        for (uint64_t i = 0; i < n; i++) {
            /* memory blocks in reverse order: no two neighbours are adjacent on
             * both sides in the same direction, so every block is one I/O of
             * the block size (the core would merge adjacent ones) */
            uint64_t m = c.bufs ? (n - 1 - i) % c.bufs : n - 1 - i;
            kvl_dlist_add(l, (uint64_t)(uintptr_t)(buf + m * bs), bs,
                          c.vram ? c.dev : KVL_DEV_ANY);
            if (!random)
                kvl_dlist_add(r, i * bs, bs, fd);
        }
        for (int w = 0; w < 2; w++) {
            if ((w == 0 && !c.do_write) || (w == 1 && !c.do_read))
                continue;
            char xpath[64] = "";
            kvl_xfer_op_t op = w == 0 ? KVL_WRITE : KVL_READ;
            double g = kvl_fbench_run(a, op, l, r, n, bs, fd, c.iters, xpath, sizeof(xpath));
            if (g < 0) {
                kvl_dlist_destroy(l);
                kvl_dlist_destroy(r);
                goto out;
            }
            printf("%-6s %-10s %10llu %8llu %12llu %9.3f  %s\n", w == 0 ? "write" : "read",
                   c.pattern, (unsigned long long)bs, (unsigned long long)n,
                   (unsigned long long)(n * bs), g, xpath);
            if (csv)
                fprintf(csv, "%s,%s,%llu,%llu,%llu,%.4f,%s\n", w == 0 ? "write" : "read",
                        c.pattern, (unsigned long long)bs, (unsigned long long)n,
                        (unsigned long long)(n * bs), g, xpath);
        }
        kvl_dlist_destroy(l);
        kvl_dlist_destroy(r);
    }
    rc = 0;
out:
    if (csv != NULL && (ferror(csv) | fclose(csv)) != 0) {
        fprintf(stderr, "kvlane bench: cannot write %s: %s\n", c.csv, strerror(errno ? errno : EIO));
        if (rc == 0)
            rc = 1;
    }
    kvl_agent_destroy(a);
    if (c.vram)
        kvl_cli_gpu_free(c.dev, (uint64_t)(uintptr_t)buf);
    else
        munmap(buf, need);
    if (fd != fd0)
        close(fd);
    close(fd0);
    if (own)
        unlink(path);
    return rc;
}
