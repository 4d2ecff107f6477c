/*
 * kvlane bench: throughput and latency per backend, memory kind, block
 * size, batch, descriptor count and pattern. Starts its own target process
 * on this host (or joins one: --target host:port, served by
 * `kvlane bench --serve HOST:PORT` through the agent listener), sweeps the
 * block sizes, and prints a table; --csv/--json write the rows, --plot draws
 * bandwidth against block size per backend with gnuplot.
 *
 * Patterns:
 *   contiguous  one range cut into blocks (adjacent blocks coalesce)
 *   kv          scattered KV blocks of a model shape, one plain descriptor
 *               per block per layer and K/V (what engines without strided
 *               lists post)
 *   strided     the same blocks as kv, one strided descriptor per block
 *               ("block b of every layer")
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "bench_costs.h"
#include "cli.h"

typedef struct {
    const char *name;
    unsigned layers, kv_heads, head_dim, tokens_per_block, dtype_bytes;
} kvl_model_t;

/* Shapes of common models (KV heads after GQA), bf16/fp16 KV cache. */
static const kvl_model_t kvl_models[] = {
    {"llama3-8b", 32, 8, 128, 16, 2},   {"llama3-70b", 80, 8, 128, 16, 2},
    {"qwen2.5-7b", 28, 4, 128, 16, 2},  {"mistral-7b", 32, 8, 128, 16, 2},
    {"deepseek-v2-lite", 27, 1, 576, 64, 2},
};

typedef struct {
    char backends[256];
    kvl_xfer_op_t op;
    const char *pattern;
    uint64_t sizes[32];
    int nsizes;
    uint64_t total;            /* bytes per transfer */
    unsigned batch, threads, warmup, iters;
    int verify, shareable;
    kvl_model_t model;
    int have_model;
    const char *csv, *json, *plot, *target, *serve;
    int quiet, costs;
} kvl_bench_cfg_t;

typedef struct {
    char backend[32], path[64];
    const char *pattern;
    uint64_t block, entries, blocks, bytes;
    double gbps, p50_us, p99_us, prep_ns, post_ns;
    int verified;
} kvl_row_t;

static double kvl_thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}


static void kvl_bench_die(const char *what)
{
    kvl_cli_print_error(what);
    exit(1);
}

/* ---- the target: registers a buffer and hands out its metadata ---- */

static int kvl_bench_target(const char *backends, uint64_t size, int shareable, int out_fd,
                            const char *listen)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = backends};
    if (kvl_agent_create("bench-target", &cfg, &a) != KVL_OK)
        kvl_bench_die("target: kvl_agent_create");
    void *buf;
    if (shareable) {
        if (kvl_mem_alloc(a, size, &buf) != KVL_OK)
            kvl_bench_die("target: kvl_mem_alloc");
    } else {
        buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (buf == MAP_FAILED) {
            perror("kvlane bench: target mmap");
            return 1;
        }
    }
    memset(buf, 0x5a, size);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, size, KVL_DEV_ANY};
    if (kvl_mem_register(a, &d, 1, NULL, NULL) != KVL_OK)
        kvl_bench_die("target: kvl_mem_register");
    if (listen != NULL) {
        char host[256], bound[300];
        const char *c = strrchr(listen, ':');
        uint64_t port = 0;
        if (c == NULL || (size_t)(c - listen) >= sizeof(host) ||
            kvl_cli_parse_uint(c + 1, 65535, &port) != 0) {
            /* atoi read "99999" as a port modulo 65536 */
            fprintf(stderr, "kvlane bench: --serve takes HOST:PORT\n");
            return 2;
        }
        memcpy(host, listen, (size_t)(c - listen));
        host[c - listen] = 0;
        if (kvl_agent_listen(a, host, (uint16_t)port, bound, sizeof(bound)) != KVL_OK)
            kvl_bench_die("kvl_agent_listen");
        printf("kvlane bench: serving %.1f MiB as agent 'bench-target' on %s (backends %s); "
               "Ctrl-C to stop\n", (double)size / (1 << 20), bound, backends);
        fflush(stdout);
        pause();
        return 0;
    }
    void *blob;
    size_t len;
    if (kvl_metadata_get(a, &blob, &len) != KVL_OK)
        kvl_bench_die("target: kvl_metadata_get");
    uint32_t l32 = (uint32_t)len;
    if (kvl_cli_write_all(out_fd, &l32, 4) || kvl_cli_write_all(out_fd, blob, len))
        return 1;
    kvl_free(blob);
    char c;
    while (read(out_fd, &c, 1) > 0) /* the pipe is bidirectional: EOF = done */
        ;
    kvl_agent_destroy(a);
    return 0;
}

/* ---- building the descriptor lists ---- */

typedef struct {
    kvl_dlist_t *l, *r;
} kvl_lists_t;

static uint64_t kvl_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void kvl_shuffle(uint32_t *v, uint64_t n, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1;
    for (uint64_t i = 0; i < n; i++)
        v[i] = (uint32_t)i;
    for (uint64_t i = n - 1; i > 0 && n > 1; i--) {
        uint64_t j = kvl_rng(&s) % (i + 1);
        uint32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* Lists for one thread's slice [off, off+len) of both buffers. */
static int kvl_build(const kvl_bench_cfg_t *c, uint64_t block, uint64_t lbase, uint64_t rbase,
                     uint64_t len, kvl_lists_t *ls)
{
    kvl_dlist_create(KVL_MEM_DRAM, 0, &ls->l);
    kvl_dlist_create(KVL_MEM_DRAM, 0, &ls->r);
    if (strcmp(c->pattern, "contiguous") == 0) {
        if (block > len)
            return -2;
        for (uint64_t o = 0; o + block <= len; o += block)
            if (kvl_dlist_add(ls->l, lbase + o, block, KVL_DEV_ANY) ||
                kvl_dlist_add(ls->r, rbase + o, block, KVL_DEV_ANY))
                return -1;
        return 0;
    }
    /* KV layout: [plane = layer*2 + kv][block]; with a model, the block is
     * its per-layer K (or V) block and the sweep size is ignored. */
    uint64_t planes = c->have_model ? 2ull * c->model.layers : 64;
    uint64_t nblocks = len / (planes * block);
    if (nblocks < 1)
        return -2;
    uint64_t plane = nblocks * block;
    uint32_t *pb = malloc(nblocks * 4), *db = malloc(nblocks * 4);
    kvl_shuffle(pb, nblocks, 1);
    kvl_shuffle(db, nblocks, 2);
    int strided = strcmp(c->pattern, "strided") == 0;
    for (uint64_t i = 0; i < nblocks; i++) {
        if (strided) {
            if (kvl_dlist_add_strided(ls->l, lbase + pb[i] * block, plane, planes, block, KVL_DEV_ANY) ||
                kvl_dlist_add_strided(ls->r, rbase + db[i] * block, plane, planes, block, KVL_DEV_ANY))
                return -1;
            continue;
        }
        for (uint64_t p = 0; p < planes; p++)
            if (kvl_dlist_add(ls->l, lbase + p * plane + pb[i] * block, block, KVL_DEV_ANY) ||
                kvl_dlist_add(ls->r, rbase + p * plane + db[i] * block, block, KVL_DEV_ANY))
                return -1;
    }
    free(pb);
    free(db);
    return 0;
}

/* ---- one measurement ---- */

typedef struct {
    const kvl_bench_cfg_t *c;
    kvl_agent_t *a;
    const char *backend;
    kvl_lists_t ls;
    kvl_xfer_t *x[64];
    double prep_cpu, post_cpu, *lat;
    unsigned nlat;
    pthread_barrier_t *bar;
    kvl_status_t st;
    kvl_error_t *err;                  /* a copy of this thread's error when st failed */
} kvl_worker_t;

static void *kvl_bench_worker(void *arg)
{
    kvl_worker_t *w = arg;
    const kvl_bench_cfg_t *c = w->c;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = w->backend};
    double t0 = kvl_thread_cpu();
    for (unsigned b = 0; b < c->batch && w->st == KVL_OK; b++)
        w->st = kvl_xfer_create(w->a, c->op, w->ls.l, "bench-target", w->ls.r, &xp, &w->x[b]);
    /* a failed create still meets every barrier below (w->st stops the
     * work): the measuring thread waits on them for all threads */
    w->prep_cpu = kvl_thread_cpu() - t0;
    for (unsigned it = 0; it < c->warmup + c->iters; it++) {
        pthread_barrier_wait(w->bar);
        double ts = kvl_cli_now(), cpu = kvl_thread_cpu();
        for (unsigned b = 0; b < c->batch && w->st == KVL_OK; b++) {
            kvl_status_t s = kvl_xfer_post(w->x[b]);
            if (s < 0)
                w->st = s;
        }
        if (it >= c->warmup)
            w->post_cpu += kvl_thread_cpu() - cpu;
        for (unsigned b = 0; b < c->batch && w->st == KVL_OK; b++)
            w->st = kvl_xfer_wait(w->x[b], 60000);
        if (it >= c->warmup)
            w->lat[w->nlat++] = kvl_cli_now() - ts;
        pthread_barrier_wait(w->bar);
    }
    if (w->st != KVL_OK && (w->err = malloc(sizeof(*w->err))) != NULL)
        memcpy(w->err, kvl_last_error(), sizeof(*w->err)); /* errors are kept per thread */
    return NULL;
}

static int kvl_measure(const kvl_bench_cfg_t *c, kvl_agent_t *a, const char *backend, uint64_t block,
                       uint8_t *lbuf, uint64_t rbase, kvl_row_t *row)
{
    unsigned nt = c->threads;
    uint64_t slice = c->total / nt;
    kvl_worker_t w[64];
    pthread_t th[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, nt + 1);
    memset(row, 0, sizeof(*row));
    snprintf(row->backend, sizeof(row->backend), "%s", backend);
    row->pattern = c->pattern;
    row->block = block;
    for (unsigned t = 0; t < nt; t++) {
        w[t] = (kvl_worker_t){.c = c, .a = a, .backend = backend, .bar = &bar};
        w[t].lat = calloc(c->iters + 1, sizeof(double));
        int rc = kvl_build(c, block, (uint64_t)(uintptr_t)lbuf + t * slice, rbase + t * slice, slice, &w[t].ls);
        if (rc != 0) {
            fprintf(stderr, "kvlane bench: %" PRIu64 "-byte blocks do not fit a %" PRIu64
                    "-byte slice with this pattern\n", block, slice);
            return -1;
        }
        row->entries += kvl_dlist_entries(w[t].ls.l) * c->batch;
        row->blocks += kvl_dlist_blocks(w[t].ls.l) * c->batch;
        row->bytes += kvl_dlist_bytes(w[t].ls.l) * c->batch;
        pthread_create(&th[t], NULL, kvl_bench_worker, &w[t]);
    }
    double wall0 = 0, wall = 0;
    for (unsigned it = 0; it < c->warmup + c->iters; it++) {
        pthread_barrier_wait(&bar);
        if (it == c->warmup)
            wall0 = kvl_cli_now();
        pthread_barrier_wait(&bar);
    }
    wall = kvl_cli_now() - wall0;
    int failed = 0;
    double *all = calloc((size_t)nt * c->iters + 1, sizeof(double));
    unsigned n = 0;
    for (unsigned t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        if (w[t].st != KVL_OK && !failed) {
            char buf[8192] = "(no memory was left to keep the error)";
            if (w[t].err != NULL)
                kvl_error_render(w[t].err, buf, sizeof(buf));
            fprintf(stderr, "kvlane: transfer failed:\n%s\n", buf);
            failed = 1;
        }
        free(w[t].err);
        for (unsigned i = 0; i < w[t].nlat; i++)
            all[n++] = w[t].lat[i];
        row->prep_ns += w[t].prep_cpu;
        row->post_ns += w[t].post_cpu;
    }
    if (!failed) {
        qsort(all, n, sizeof(*all), kvl_cli_cmp_double);
        /* nearest-rank percentiles */
        row->p50_us = all[(n + 1) / 2 - 1] * 1e6;
        row->p99_us = all[(size_t)ceil(0.99 * n) - 1] * 1e6;
        row->gbps = (double)row->bytes * c->iters / wall / 1e9;
        row->prep_ns = row->prep_ns / (double)row->entries * 1e9;
        row->post_ns = row->post_ns / ((double)row->entries * c->iters) * 1e9;
        kvl_xfer_stats_t s;
        kvl_xfer_get_stats(w[0].x[0], &s);
        snprintf(row->path, sizeof(row->path), "%s", s.path);
    }
    /* verify: write a fresh pattern, read it back elsewhere, compare */
    if (!failed && c->verify) {
        uint64_t len = slice;
        uint8_t *back = malloc(len);
        for (uint64_t i = 0; i < len; i++)
            lbuf[i] = (uint8_t)(i * 31 + block);
        kvl_dlist_t *l, *r;
        kvl_xfer_t *x;
        kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = backend};
        kvl_dlist_create(KVL_MEM_DRAM, 1, &l);
        kvl_dlist_create(KVL_MEM_DRAM, 1, &r);
        kvl_dlist_add(r, rbase, len, KVL_DEV_ANY);
        /* the bench's own lists move the blocks; then read the whole slice */
        kvl_xfer_params_t wp = xp;
        kvl_xfer_t *wx;
        kvl_status_t st = kvl_xfer_create(a, KVL_WRITE, w[0].ls.l, "bench-target", w[0].ls.r, &wp, &wx);
        if (st == KVL_OK && (st = kvl_xfer_post(wx)) >= 0)
            st = kvl_xfer_wait(wx, 60000);
        if (st == KVL_OK) {
            kvl_xfer_release(wx);
            kvl_mem_desc_t bd = {(uint64_t)(uintptr_t)back, len, KVL_DEV_ANY};
            st = kvl_mem_register(a, &bd, 1, NULL, NULL);
            kvl_dlist_add(l, bd.addr, len, KVL_DEV_ANY);
            if (st == KVL_OK && (st = kvl_xfer_create(a, KVL_READ, l, "bench-target", r, &xp, &x)) == KVL_OK) {
                if ((st = kvl_xfer_post(x)) >= 0)
                    st = kvl_xfer_wait(x, 60000);
                kvl_xfer_release(x);
            }
            kvl_mem_deregister(a, &bd, 1);
        }
        /* each block of the local list must be at its remote place */
        uint64_t bad = st == KVL_OK ? 0 : 1;
        for (size_t e = 0; st == KVL_OK && e < kvl_dlist_entries(w[0].ls.l); e++) {
            uint64_t la, ra, ls_, rs_, cnt, bl;
            kvl_dlist_get(w[0].ls.l, e, &la, &ls_, &cnt, &bl, NULL);
            kvl_dlist_get(w[0].ls.r, e, &ra, &rs_, NULL, NULL, NULL);
            for (uint64_t j = 0; j < cnt; j++)
                bad += memcmp((uint8_t *)(uintptr_t)(la + j * ls_), back + (ra + j * rs_ - rbase), bl) != 0;
        }
        row->verified = bad == 0 ? 1 : -1;
        free(back);
        kvl_dlist_destroy(l);
        kvl_dlist_destroy(r);
        if (bad) {
            fprintf(stderr, "kvlane bench: verify FAILED for %s %" PRIu64 "-byte blocks (%s)\n",
                    backend, block, st == KVL_OK ? "bytes differ" : kvl_status_name(st));
            failed = 1;
        }
    }
    for (unsigned t = 0; t < nt; t++) {
        for (unsigned b = 0; b < c->batch; b++)
            if (w[t].x[b])
                kvl_xfer_release(w[t].x[b]);
        kvl_dlist_destroy(w[t].ls.l);
        kvl_dlist_destroy(w[t].ls.r);
        free(w[t].lat);
    }
    free(all);
    pthread_barrier_destroy(&bar);
    return failed ? -1 : 0;
}

/* ---- output ---- */

/* Close an output file: 0, or -1 having said why (a full disk shows here). */
static int kvl_out_close(FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "kvlane bench: cannot write %s: %s\n", path,
                strerror(errno ? errno : EIO));
        return -1;
    }
    return 0;
}

static int kvl_write_csv(const char *path, const kvl_row_t *rows, int n, const kvl_bench_cfg_t *c)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvlane bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "backend,op,pattern,block_bytes,entries,blocks,bytes,batch,threads,gbps,p50_us,p99_us,"
               "prep_ns_per_desc,post_ns_per_desc,path,verified\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s,%s,%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%u,%u,%.3f,%.1f,%.1f,%.2f,%.2f,%s,%s\n",
                rows[i].backend, c->op == KVL_READ ? "read" : "write", rows[i].pattern, rows[i].block,
                rows[i].entries, rows[i].blocks, rows[i].bytes, c->batch, c->threads, rows[i].gbps,
                rows[i].p50_us, rows[i].p99_us, rows[i].prep_ns, rows[i].post_ns, rows[i].path,
                rows[i].verified > 0 ? "yes" : rows[i].verified < 0 ? "FAILED" : "not checked");
    return kvl_out_close(f, path);
}

static int kvl_write_json(const char *path, const kvl_row_t *rows, int n, const kvl_bench_cfg_t *c)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvlane bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"op\":\"%s\",\"pattern\":\"%s\",\"batch\":%u,\"threads\":%u,\"iters\":%u,\"rows\":[",
            c->op == KVL_READ ? "read" : "write", c->pattern, c->batch, c->threads, c->iters);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\n {\"backend\":\"%s\",\"block_bytes\":%" PRIu64 ",\"entries\":%" PRIu64
                   ",\"blocks\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"gbps\":%.3f,\"p50_us\":%.1f,"
                   "\"p99_us\":%.1f,\"prep_ns_per_desc\":%.2f,\"post_ns_per_desc\":%.2f,"
                   "\"path\":\"%s\",\"verified\":%s}",
                i ? "," : "", rows[i].backend, rows[i].block, rows[i].entries, rows[i].blocks,
                rows[i].bytes, rows[i].gbps, rows[i].p50_us, rows[i].p99_us, rows[i].prep_ns,
                rows[i].post_ns, rows[i].path, rows[i].verified > 0 ? "true" : "false");
    fprintf(f, "\n]}\n");
    return kvl_out_close(f, path);
}

/* s in a gnuplot single-quoted string, where a quote is written twice. */
static void kvl_gp_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s != '\0'; s++) {
        if (*s == '\'')
            fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/*
 * Draw GB/s against block size into png with gnuplot. The data and the
 * script go to temporary files and gnuplot runs them directly (no shell):
 * the output name reaches gnuplot as it was given, quotes and all.
 */
static int kvl_plot(const char *png, const kvl_row_t *rows, int n)
{
    char dat[] = "/tmp/kvlane-bench-XXXXXX", gp[] = "/tmp/kvlane-bench-gp-XXXXXX";
    char seen[16][32];
    int ns = 0, rc = -1;

    /* the output first, for its own reason (a folder that does not exist) */
    bool made = true;
    int pfd = open(png, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (pfd < 0 && errno == EEXIST) {
        made = false;
        pfd = open(png, O_WRONLY | O_CLOEXEC);
    }
    if (pfd < 0) {
        fprintf(stderr, "kvlane bench: cannot write %s: %s\n", png, strerror(errno));
        return -1;
    }
    close(pfd);
    int dfd = mkstemp(dat);
    if (dfd < 0) {
        fprintf(stderr, "kvlane bench: cannot make a temporary file for the plot: %s\n",
                strerror(errno));
        return -1;
    }
    int gfd = mkstemp(gp);
    FILE *f = fdopen(dfd, "w"), *g = gfd >= 0 ? fdopen(gfd, "w") : NULL;
    if (f == NULL || g == NULL) {
        fprintf(stderr, "kvlane bench: cannot make a temporary file for the plot: %s\n",
                strerror(errno));
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int k;
        for (k = 0; k < ns && strcmp(seen[k], rows[i].backend); k++)
            ;
        if (k == ns && ns < 16)
            snprintf(seen[ns++], 32, "%s", rows[i].backend);
    }
    for (int k = 0; k < ns; k++) {
        fprintf(f, "# %s\n", seen[k]);
        for (int i = 0; i < n; i++)
            if (strcmp(rows[i].backend, seen[k]) == 0)
                fprintf(f, "%" PRIu64 " %.3f\n", rows[i].block, rows[i].gbps);
        fprintf(f, "\n\n");
    }
    /* pngcairo where this gnuplot has it, else its plain png terminal */
    fprintf(g, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 900,560 noenhanced\n"
               "} else {\n"
               "  set terminal png size 900,560 noenhanced\n"
               "}\n"
               "set output ");
    kvl_gp_quoted(g, png);
    fprintf(g, "\nset logscale x 2\nset format x '%%.0b %%BB'\nset yrange [0:*]\n"
               "set xlabel 'block size'\nset ylabel 'GB/s'\nset grid\nset key top left\n"
               "set title 'kvlane bench: bandwidth vs block size'\nplot ");
    for (int k = 0; k < ns; k++)
        fprintf(g, "%s'%s' index %d with linespoints lw 2 title '%s'", k ? ", " : "", dat, k,
                seen[k]);
    fprintf(g, "\n");
    if (fflush(f) != 0 || fflush(g) != 0) {
        fprintf(stderr, "kvlane bench: cannot write the plot's temporary files: %s\n",
                strerror(errno));
        goto out;
    }
    fflush(stdout);
    char gnuplot[] = "gnuplot", *argv[] = {gnuplot, gp, NULL};
    pid_t pid;
    int status = 0, e = posix_spawnp(&pid, gnuplot, NULL, NULL, argv, environ);
    if (e == 0 && waitpid(pid, &status, 0) != pid)
        e = errno;
    if (e == ENOENT) {
        fprintf(stderr, "kvlane bench: --plot needs gnuplot, which is not installed: install "
                        "gnuplot-nox (./scripts/deps.sh does)\n");
    } else if (e != 0) {
        fprintf(stderr, "kvlane bench: cannot run gnuplot: %s\n", strerror(e));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "kvlane bench: gnuplot could not draw %s (status %d; its own message "
                        "is above)\n", png, status);
    } else {
        rc = 0;
    }
out:
    if (f != NULL)
        fclose(f);
    else
        close(dfd);
    if (g != NULL)
        fclose(g);
    else if (gfd >= 0)
        close(gfd);
    unlink(dat);
    if (gfd >= 0)
        unlink(gp);
    if (rc != 0 && made)
        unlink(png); /* no empty picture left where none was */
    return rc;
}

static void kvl_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: kvlane bench [options]\n"
            "  --backend LIST       comma-separated backends to compare (default shm);\n"
            "                       --backend posix benches files instead (its own options:\n"
            "                       kvlane bench --backend posix --help)\n"
            "  --op write|read      (default write)\n"
            "  --block-size LIST    comma-separated sizes, e.g. 4K,64K,1M (default sweep 4K..4M)\n"
            "  --size BYTES         bytes per transfer (default 256M)\n"
            "  --pattern P          contiguous | kv | strided (default contiguous)\n"
            "  --model NAME         KV block shape for kv/strided: llama3-8b, llama3-70b,\n"
            "                       qwen2.5-7b, mistral-7b, deepseek-v2-lite\n"
            "  --layers/--kv-heads/--head-dim/--tokens-per-block/--dtype-bytes N  custom shape\n"
            "  --batch N            transfers in flight per thread (default 1)\n"
            "  --threads N          initiator threads (default 1)\n"
            "  --warmup N / --iters N  (default 2 / 10)\n"
            "  --verify             check every byte after measuring\n"
            "  --shareable          target memory from kvl_mem_alloc (shm: mmap path)\n"
            "  --csv FILE / --json FILE / --plot FILE.png\n"
            "  --target HOST:PORT   join a target served by `kvlane bench --serve HOST:PORT`\n"
            "  --serve HOST:PORT    serve a target for remote benches (with --size, --backend)\n"
            "  --suite costs        instead of bandwidth: 4 KiB post->complete latency,\n"
            "                       registration of 1 and 1,000 regions, per-request make\n"
            "                       and post, each beside its reference (memcpy,\n"
            "                       process_vm_writev, mmap+mlock)\n");
}

/* Sizes, each above 0: their count, or -1 with why. */
static int kvl_parse_list(const char *s, uint64_t *out, int max, char *why, size_t wlen)
{
    char buf[512], *items[32];
    int n = kvl_cli_split(s, buf, sizeof(buf), items, max < 32 ? max : 32, why, wlen);
    for (int i = 0; i < n; i++)
        if (kvl_cli_parse_size(items[i], &out[i]) != 0 || out[i] == 0) {
            snprintf(why, wlen, "'%.60s' is not a size above 0", items[i]);
            return -1;
        }
    return n;
}

/* --backend: 1 to 8 backends of this build, each once; 0, or -1 printed. */
static int kvl_check_backends(const char *s, char *out, size_t cap)
{
    char buf[sizeof(((kvl_bench_cfg_t *)0)->backends)], why[96], *items[8];
    int n = kvl_cli_split(s, buf, sizeof(buf), items, 8, why, sizeof(why));
    if (n < 0) { /* buf is as long as out: a list that fits buf fits out */
        fprintf(stderr, "kvlane bench: the --backend list '%s' %s\n", s, why);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const char *const *k = kvl_backend_names();
        while (*k != NULL && strcmp(*k, items[i]) != 0)
            k++;
        if (*k == NULL) {
            fprintf(stderr, "kvlane bench: unknown backend '%s' for --backend (known:", items[i]);
            for (k = kvl_backend_names(); *k != NULL; k++)
                fprintf(stderr, " %s", *k);
            fprintf(stderr, ")\n");
            return -1;
        }
        if (strcmp(items[i], "posix") == 0) { /* alone, it runs the file bench */
            fprintf(stderr, "kvlane bench: posix moves data to files and is benched alone "
                    "(--backend posix), not in a list of backends\n");
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(items[j], items[i]) == 0) {
                fprintf(stderr, "kvlane bench: --backend names %s twice\n", items[i]);
                return -1;
            }
    }
    snprintf(out, cap, "%s", s);
    return 0;
}

int kvl_cli_bench_file(int argc, char **argv); /* bench_file.c */

int kvl_cli_bench(int argc, char **argv)
{
    /* --backend posix: DRAM to files, one agent (bench_file.c) */
    for (int i = 1; i < argc; i++)
        if ((strcmp(argv[i], "--backend") == 0 && i + 1 < argc && strcmp(argv[i + 1], "posix") == 0) ||
            strcmp(argv[i], "--backend=posix") == 0)
            return kvl_cli_bench_file(argc, argv);
    kvl_bench_cfg_t c = {.op = KVL_WRITE, .pattern = "contiguous", .total = 256ull << 20, .batch = 1,
                         .threads = 1, .warmup = 2, .iters = 10};
    snprintf(c.backends, sizeof(c.backends), "shm");
    static const struct option opts[] = {
        {"backend", 1, 0, 'b'}, {"op", 1, 0, 'o'}, {"block-size", 1, 0, 's'}, {"size", 1, 0, 'S'},
        {"pattern", 1, 0, 'p'}, {"model", 1, 0, 'm'}, {"layers", 1, 0, 'L'}, {"kv-heads", 1, 0, 'H'},
        {"head-dim", 1, 0, 'D'}, {"tokens-per-block", 1, 0, 'T'}, {"dtype-bytes", 1, 0, 'B'},
        {"batch", 1, 0, 'n'}, {"threads", 1, 0, 't'}, {"warmup", 1, 0, 'w'}, {"iters", 1, 0, 'i'},
        {"verify", 0, 0, 'v'}, {"shareable", 0, 0, 'x'}, {"csv", 1, 0, 'c'}, {"json", 1, 0, 'j'},
        {"plot", 1, 0, 'P'}, {"target", 1, 0, 'g'}, {"serve", 1, 0, 'r'}, {"serve-fd", 1, 0, 'F'},
        {"quiet", 0, 0, 'q'}, {"suite", 1, 0, 'U'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, li = 0, serve_fd = -1;
    char why[96];
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        uint64_t v = 0;
        if (strchr("SLHDTBntwi", o) && (kvl_cli_parse_size(optarg, &v) != 0 || (v == 0 && o != 'w'))) {
            fprintf(stderr, "kvlane bench: bad value '%s' for --%s\n", optarg, opts[li].name);
            return 2;
        }
        /* the bounds of the counts: refused, never cut down or wrapped */
        uint64_t most = strchr("nt", o) ? 64 : strchr("wi", o) ? 1000000 : strchr("LHDTB", o) ? 65536 : 0;
        if (most != 0 && v > most) {
            fprintf(stderr, "kvlane bench: --%s %s is more than %" PRIu64 "\n", opts[li].name,
                    optarg, most);
            return 2;
        }
        switch (o) {
        case 'b':
            if (kvl_check_backends(optarg, c.backends, sizeof(c.backends)) != 0)
                return 2;
            break;
        case 'o':
            if (strcmp(optarg, "write") && strcmp(optarg, "read")) {
                fprintf(stderr, "kvlane bench: --op takes write or read\n");
                return 2;
            }
            c.op = strcmp(optarg, "read") == 0 ? KVL_READ : KVL_WRITE;
            break;
        case 's':
            if ((c.nsizes = kvl_parse_list(optarg, c.sizes, 32, why, sizeof(why))) <= 0) {
                fprintf(stderr, "kvlane bench: bad --block-size list '%s': %s\n", optarg, why);
                return 2;
            }
            break;
        case 'S': c.total = v; break;
        case 'p':
            if (strcmp(optarg, "contiguous") && strcmp(optarg, "kv") && strcmp(optarg, "strided")) {
                fprintf(stderr, "kvlane bench: --pattern takes contiguous, kv or strided\n");
                return 2;
            }
            c.pattern = optarg;
            break;
        case 'm': {
            size_t k;
            for (k = 0; k < sizeof(kvl_models) / sizeof(kvl_models[0]); k++)
                if (strcmp(kvl_models[k].name, optarg) == 0)
                    break;
            if (k == sizeof(kvl_models) / sizeof(kvl_models[0])) {
                fprintf(stderr, "kvlane bench: unknown model '%s' (see --help)\n", optarg);
                return 2;
            }
            c.model = kvl_models[k];
            c.have_model = 1;
            break;
        }
        case 'L': c.model.layers = (unsigned)v, c.have_model = 1; break;
        case 'H': c.model.kv_heads = (unsigned)v, c.have_model = 1; break;
        case 'D': c.model.head_dim = (unsigned)v, c.have_model = 1; break;
        case 'T': c.model.tokens_per_block = (unsigned)v, c.have_model = 1; break;
        case 'B': c.model.dtype_bytes = (unsigned)v, c.have_model = 1; break;
        case 'n': c.batch = (unsigned)v; break;
        case 't': c.threads = (unsigned)v; break;
        case 'w': c.warmup = (unsigned)v; break;
        case 'i': c.iters = (unsigned)v; break;
        case 'v': c.verify = 1; break;
        case 'x': c.shareable = 1; break;
        case 'c': c.csv = optarg; break;
        case 'j': c.json = optarg; break;
        case 'P': c.plot = optarg; break;
        case 'g': c.target = optarg; break;
        case 'r': c.serve = optarg; break;
        case 'F': serve_fd = atoi(optarg); break;
        case 'q': c.quiet = 1; break;
        case 'U':
            if (strcmp(optarg, "costs") != 0) {
                fprintf(stderr, "kvlane bench: --suite takes costs\n");
                return 2;
            }
            c.costs = 1;
            break;
        case 'h': kvl_bench_usage(stdout); return 0;
        default: kvl_bench_usage(stderr); return 2;
        }
    }
    if (serve_fd >= 0 || c.serve)
        return kvl_bench_target(c.backends, c.total, c.shareable, serve_fd, c.serve);
    if (c.have_model) {
        kvl_model_t *m = &c.model;
        if (!m->layers || !m->kv_heads || !m->head_dim || !m->tokens_per_block || !m->dtype_bytes) {
            fprintf(stderr, "kvlane bench: a custom shape needs --layers, --kv-heads, --head-dim, "
                            "--tokens-per-block and --dtype-bytes\n");
            return 2;
        }
        if (!strcmp(c.pattern, "contiguous"))
            c.pattern = "kv";
        uint64_t bs = m->kv_heads;
        if (__builtin_mul_overflow(bs, (uint64_t)m->head_dim, &bs) ||
            __builtin_mul_overflow(bs, (uint64_t)m->tokens_per_block, &bs) ||
            __builtin_mul_overflow(bs, (uint64_t)m->dtype_bytes, &bs) ||
            __builtin_mul_overflow(bs, 2ull * m->layers, &(uint64_t){0}) ||
            bs * 2ull * m->layers > c.total) {
            fprintf(stderr, "kvlane bench: the shape's KV of one block (%u layers x 2 x %u heads x "
                            "%u dims x %u tokens x %u bytes) does not fit --size %" PRIu64 "\n",
                    m->layers, m->kv_heads, m->head_dim, m->tokens_per_block, m->dtype_bytes,
                    c.total);
            return 2;
        }
        c.sizes[0] = bs;
        c.nsizes = 1;
    }
    if (c.nsizes == 0) {
        static const uint64_t sweep[] = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
        for (size_t i = 0; i < 6; i++)
            c.sizes[c.nsizes++] = sweep[i];
    }
    if (c.total < (uint64_t)c.threads * 4096) {
        fprintf(stderr, "kvlane bench: --size %" PRIu64 " is less than 4 KiB for each of the %u "
                        "thread(s)\n", c.total, c.threads);
        return 2;
    }
    c.total -= c.total % ((uint64_t)c.threads * 4096);
    for (int i = 0; i < c.nsizes; i++)
        if (c.sizes[i] > c.total / c.threads) {
            fprintf(stderr, "kvlane bench: %" PRIu64 "-byte blocks do not fit the %" PRIu64
                            " bytes each thread moves (--size %" PRIu64 ", --threads %u)\n",
                    c.sizes[i], c.total / c.threads, c.total, c.threads);
            return 2;
        }

    /* The target: our own process (exec'ed before any kvlane thread runs),
     * or a remote one through its listener. */
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = c.backends};
    pid_t pid = -1;
    int sv[2] = {-1, -1};
    if (c.target == NULL) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            perror("kvlane bench: socketpair");
            return 1;
        }
        char fdarg[16], size[32], exe[4096];
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        snprintf(size, sizeof(size), "%" PRIu64, c.total);
        ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (el <= 0)
            return 1;
        exe[el] = 0;
        char *targv[] = {exe, "bench", "--serve-fd", fdarg, "--size", size, "--backend", c.backends,
                         c.shareable ? "--shareable" : NULL, NULL};
        pid = fork();
        if (pid == 0) {
            fcntl(sv[1], F_SETFD, 0); /* the child's end survives exec */
            execv(exe, targv);
            _exit(127);
        }
        close(sv[1]);
    }
    if (kvl_agent_create("bench-initiator", &cfg, &a) != KVL_OK)
        kvl_bench_die("kvl_agent_create");
    if (c.target == NULL) {
        uint32_t l32;
        void *blob = NULL;
        if (kvl_cli_read_all(sv[0], &l32, 4, 60000) != 0 || l32 == 0 || l32 > (64u << 20) ||
            (blob = malloc(l32)) == NULL || kvl_cli_read_all(sv[0], blob, l32, 60000) != 0) {
            fprintf(stderr, "kvlane bench: the target process did not start (see its error above)\n");
            return 1;
        }
        if (kvl_metadata_load(a, blob, l32, NULL, 0) != KVL_OK)
            kvl_bench_die("kvl_metadata_load");
        free(blob);
    } else {
        char name[KVL_NAME_MAX];
        if (kvl_metadata_fetch(a, c.target, name, sizeof(name)) != KVL_OK)
            kvl_bench_die("kvl_metadata_fetch");
        if (strcmp(name, "bench-target") != 0) {
            fprintf(stderr, "kvlane bench: %s serves agent '%s', not a bench target\n", c.target, name);
            return 1;
        }
    }
    kvl_mem_desc_t rr;
    size_t nr = 0;
    if (kvl_remote_regions(a, "bench-target", &rr, NULL, 1, &nr) != KVL_OK || nr < 1)
        kvl_bench_die("kvl_remote_regions");
    if (rr.len < c.total)
        c.total = rr.len - rr.len % ((uint64_t)c.threads * 4096);
    uint8_t *lbuf = mmap(NULL, c.total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (lbuf == MAP_FAILED) {
        perror("kvlane bench: mmap");
        return 1;
    }
    memset(lbuf, 0xa5, c.total);
    kvl_mem_desc_t ld = {(uint64_t)(uintptr_t)lbuf, c.total, KVL_DEV_ANY};
    if (kvl_mem_register(a, &ld, 1, NULL, NULL) != KVL_OK)
        kvl_bench_die("kvl_mem_register");

    char blist[256], bwhy[96], *bitems[8];
    const char *bks[8];
    /* checked when parsed (kvl_check_backends) */
    int nb = kvl_cli_split(c.backends, blist, sizeof(blist), bitems, 8, bwhy, sizeof(bwhy));
    for (int i = 0; i < nb; i++)
        bks[i] = bitems[i];
    if (c.costs) {
        kvl_costs_ctx_t cc = {a, "bench-target", pid, (uint64_t)(uintptr_t)lbuf, rr.addr, c.total,
                              bks, nb, c.backends};
        printf("kvlane bench --suite costs: backends %s, target %s\n", c.backends,
               c.target ? c.target : "a process on this host");
        int crc = kvl_bench_costs(&cc);
        kvl_mem_deregister(a, &ld, 1);
        kvl_agent_destroy(a);
        if (pid > 0) {
            close(sv[0]);
            waitpid(pid, NULL, 0);
        }
        return crc;
    }
    int total_runs = nb * c.nsizes, run = 0, rc = 0;
    kvl_row_t *rows = calloc((size_t)total_runs, sizeof(*rows));
    int isatty_out = isatty(1) && !c.quiet;
    if (!c.quiet)
        printf("kvlane bench: %s %s, %.0f MiB per transfer, batch %u, threads %u, %u iterations "
               "(+%u warm-up)%s\n", c.op == KVL_READ ? "READ" : "WRITE", c.pattern,
               (double)c.total / (1 << 20), c.batch, c.threads, c.iters, c.warmup,
               c.have_model ? "" : "");
    if (c.have_model && !c.quiet)
        printf("model shape: %u layers, %u KV heads, head dim %u, %u tokens/block, %u-byte dtype: "
               "%" PRIu64 "-byte blocks\n", c.model.layers, c.model.kv_heads, c.model.head_dim,
               c.model.tokens_per_block, c.model.dtype_bytes, c.sizes[0]);
    for (int b = 0; b < nb && rc == 0; b++) {
        for (int s = 0; s < c.nsizes && rc == 0; s++, run++) {
            if (isatty_out) {
                printf("\r[%d/%d] %s %" PRIu64 " B blocks ...          ", run + 1, total_runs, bks[b], c.sizes[s]);
                fflush(stdout);
            }
            if (kvl_measure(&c, a, bks[b], c.sizes[s], lbuf, rr.addr, &rows[run]) != 0)
                rc = 1;
        }
    }
    if (isatty_out)
        printf("\r%60s\r", "");
    int nrows = rc ? run - 1 : run;
    if (nrows < 0)
        nrows = 0;
    printf("%-6s %-10s %10s %9s %10s %9s %9s %9s %9s %-8s %s\n", "backend", "pattern", "block", "entries",
           "GB/s", "p50 us", "p99 us", "prep ns", "post ns", "path", "verified");
    for (int i = 0; i < nrows; i++)
        printf("%-7s %-10s %10" PRIu64 " %9" PRIu64 " %10.2f %9.0f %9.0f %9.1f %9.1f %-8s %s\n",
               rows[i].backend, rows[i].pattern, rows[i].block, rows[i].entries, rows[i].gbps,
               rows[i].p50_us, rows[i].p99_us, rows[i].prep_ns, rows[i].post_ns, rows[i].path,
               rows[i].verified > 0 ? "yes" : rows[i].verified < 0 ? "FAILED" : "-");
    /* an output asked for and not written fails the command */
    if (c.csv && kvl_write_csv(c.csv, rows, nrows, &c) != 0)
        rc = 1;
    if (c.json && kvl_write_json(c.json, rows, nrows, &c) != 0)
        rc = 1;
    if (c.plot && nrows > 0) {
        if (kvl_plot(c.plot, rows, nrows) == 0)
            printf("plot: %s\n", c.plot);
        else
            rc = 1;
    }
    kvl_mem_deregister(a, &ld, 1);
    kvl_agent_destroy(a);
    if (pid > 0) {
        close(sv[0]);
        waitpid(pid, NULL, 0);
    }
    free(rows);
    return rc;
}
