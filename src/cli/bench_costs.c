/*
 * kvlane bench --suite costs: what a request costs besides moving bytes,
 * each row beside its physical reference measured in the same run:
 *
 *   post -> complete   one 4 KiB WRITE per backend, p50/p99 over many posts
 *                      (the caller polls kvl_xfer_test, as engines poll
 *                      check_xfer_state); references: memcpy of 4 KiB and a
 *                      bare process_vm_writev of 4 KiB into the target
 *   register           1 region, and a list of 1,000 regions in one call, per
 *                      region; deregistration likewise; reference: mmap +
 *                      mlock + munlock + munmap of one 4 KiB region
 *   make / post        a transfer made from two prepared lists per request
 *                      (n = 1 and n = 1,024 random pairs of 4 KiB blocks):
 *                      the fixed cost and the cost per descriptor, with and
 *                      without a transfer between requests
 *
 * Times are wall-clock medians (and p99 where it says) of many repetitions;
 * nothing here asserts a number: the table is for reading side by side.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "cli.h"
#include "bench_costs.h"


/* The q-quantile (0.5, 0.99) of n samples, sorted in place. */
static double kvl_costs_q(double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), kvl_cli_cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static void kvl_costs_row(const char *what, const char *backend, double p50_us, double p99_us,
                          const char *ref, double ref_us)
{
    char p99[32] = "-", r[32] = "-";
    if (p99_us >= 0)
        snprintf(p99, sizeof(p99), "%.2f", p99_us);
    if (ref != NULL && ref_us >= 0)
        snprintf(r, sizeof(r), "%.3f", ref_us);
    printf("%-52s %-8s %10.3f %10s   %-34s %10s\n", what, backend, p50_us, p99,
           ref != NULL ? ref : "-", r);
}

/* One 4 KiB WRITE posted and polled to completion, reps times. */
static int kvl_costs_latency(const kvl_costs_ctx_t *c, const char *backend, double *v,
                             size_t reps, double *p50, double *p99)
{
    kvl_dlist_t *l = NULL, *r = NULL;
    kvl_xfer_t *x = NULL;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = backend};
    int rc = -1;
    if (kvl_dlist_create(KVL_MEM_DRAM, 1, &l) != KVL_OK ||
        kvl_dlist_create(KVL_MEM_DRAM, 1, &r) != KVL_OK ||
        kvl_dlist_add(l, c->lbase, 4096, KVL_DEV_ANY) != KVL_OK ||
        kvl_dlist_add(r, c->rbase, 4096, KVL_DEV_ANY) != KVL_OK ||
        kvl_xfer_create(c->a, KVL_WRITE, l, c->target, r, &xp, &x) != KVL_OK)
        goto out;
    for (size_t i = 0; i < reps + reps / 10; i++) {
        double t0 = kvl_cli_now();
        kvl_status_t st = kvl_xfer_post(x);
        while (st == KVL_IN_PROGRESS)
            st = kvl_xfer_test(x);
        if (st != KVL_OK)
            goto out;
        if (i >= reps / 10) /* the first tenth warms up */
            v[i - reps / 10] = (kvl_cli_now() - t0) * 1e6;
    }
    *p99 = kvl_costs_q(v, reps, 0.99);
    *p50 = kvl_costs_q(v, reps, 0.5);
    rc = 0;
out:
    if (rc != 0)
        kvl_cli_print_error("bench costs: 4 KiB WRITE");
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return rc;
}

static double kvl_costs_memcpy_ref(double *v, size_t reps)
{
    static char a[4096], b[4096];
    for (size_t i = 0; i < reps; i++) {
        double t0 = kvl_cli_now();
        memcpy(b, a, sizeof(a));
        __asm__ __volatile__("" ::"r"(b) : "memory");
        v[i] = (kvl_cli_now() - t0) * 1e6;
    }
    return kvl_costs_q(v, reps, 0.5);
}

/* A bare cross-memory-attach write of 4 KiB into the target: what the shm
 * backend's cma path does in the kernel. -1 when not allowed here. */
static double kvl_costs_cma_ref(const kvl_costs_ctx_t *c, double *v, size_t reps)
{
    struct iovec lv = {(void *)(uintptr_t)c->lbase, 4096};
    struct iovec rv = {(void *)(uintptr_t)c->rbase, 4096};
    for (size_t i = 0; i < reps; i++) {
        double t0 = kvl_cli_now();
        if (process_vm_writev(c->target_pid, &lv, 1, &rv, 1, 0) != 4096)
            return -1;
        v[i] = (kvl_cli_now() - t0) * 1e6;
    }
    return kvl_costs_q(v, reps, 0.5);
}

/* Register then deregister n 4 KiB regions of buf in one call each, reps
 * times: per-region medians. */
static int kvl_costs_register(kvl_agent_t *a, uint8_t *buf, size_t n, double *v, double *w,
                              size_t reps, double *reg_us, double *dereg_us)
{
    kvl_mem_desc_t *d = calloc(n, sizeof(*d));
    if (d == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        d[i] = (kvl_mem_desc_t){(uint64_t)(uintptr_t)(buf + i * 4096), 4096, KVL_DEV_ANY};
    kvl_reg_params_t p = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_DRAM};
    for (size_t i = 0; i < reps; i++) {
        double t0 = kvl_cli_now();
        if (kvl_mem_register(a, d, n, &p, NULL) != KVL_OK) {
            kvl_cli_print_error("bench costs: register");
            free(d);
            return -1;
        }
        double t1 = kvl_cli_now();
        if (kvl_mem_deregister(a, d, n) != KVL_OK) {
            kvl_cli_print_error("bench costs: deregister");
            free(d);
            return -1;
        }
        v[i] = (t1 - t0) * 1e6 / (double)n;
        w[i] = (kvl_cli_now() - t1) * 1e6 / (double)n;
    }
    free(d);
    *reg_us = kvl_costs_q(v, reps, 0.5);
    *dereg_us = kvl_costs_q(w, reps, 0.5);
    return 0;
}

static double kvl_costs_mlock_ref(double *v, size_t reps)
{
    for (size_t i = 0; i < reps; i++) {
        double t0 = kvl_cli_now();
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return -1;
        int locked = mlock(p, 4096) == 0;
        if (locked)
            munlock(p, 4096);
        munmap(p, 4096);
        if (!locked)
            return -1;
        v[i] = (kvl_cli_now() - t0) * 1e6;
    }
    return kvl_costs_q(v, reps, 0.5);
}

/* Transfers made per request from two prepared lists of nblk 4 KiB blocks:
 * n random pairs each; between != 0 posts and completes every transfer
 * before the next is made (a request stream), else releases it at once. */
static int kvl_costs_make(const kvl_costs_ctx_t *c, const char *backend, kvl_prep_t *lp,
                          kvl_prep_t *rp, size_t nblk, size_t n, int between, double *v,
                          double *w, size_t reps, double *make_us, double *post_us)
{
    int64_t *li = malloc(n * sizeof(*li)), *ri = malloc(n * sizeof(*ri));
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_BACKEND, .backend = backend};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    size_t posted = 0;
    int rc = -1;
    if (li == NULL || ri == NULL)
        goto out;
    for (size_t it = 0; it < reps; it++) {
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            li[i] = (int64_t)(s % nblk);
            ri[i] = (int64_t)((s >> 20) % nblk);
        }
        kvl_xfer_t *x;
        double t0 = kvl_cli_now();
        if (kvl_xfer_create_prepped(c->a, KVL_WRITE, lp, li, rp, ri, n, &xp, &x) != KVL_OK) {
            kvl_cli_print_error("bench costs: kvl_xfer_create_prepped");
            goto out;
        }
        v[it] = (kvl_cli_now() - t0) * 1e6;
        if (between) {
            double t1 = kvl_cli_now();
            kvl_status_t st = kvl_xfer_post(x);
            w[posted++] = (kvl_cli_now() - t1) * 1e6;
            while (st == KVL_IN_PROGRESS)
                st = kvl_xfer_test(x);
            if (st != KVL_OK) {
                kvl_cli_print_error("bench costs: request transfer");
                kvl_xfer_release(x);
                goto out;
            }
        }
        kvl_xfer_release(x);
    }
    *make_us = kvl_costs_q(v, reps, 0.5);
    *post_us = posted ? kvl_costs_q(w, posted, 0.5) : -1;
    rc = 0;
out:
    free(li);
    free(ri);
    return rc;
}

int kvl_bench_costs(const kvl_costs_ctx_t *c)
{
    enum { REPS = 2000, NREG = 1000, NBLK = 4096, NREQ = 1024 };
    double *v = calloc(REPS, sizeof(double)), *w = calloc(REPS, sizeof(double));
    uint8_t *regbuf = mmap(NULL, (size_t)NREG * 4096, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    int rc = 0;
    if (v == NULL || w == NULL || regbuf == MAP_FAILED || c->len < (uint64_t)NBLK * 4096) {
        fprintf(stderr, "kvlane bench: --suite costs needs %d MiB of target memory and %d KiB "
                        "of scratch (out of memory, or --size too small)\n",
                NBLK * 4096 >> 20, NREG * 4);
        free(v);
        free(w);
        return 1;
    }
    printf("%-52s %-8s %10s %10s   %-34s %10s\n", "row (microseconds)", "backend", "p50", "p99",
           "reference", "ref p50");
    double ref_memcpy = kvl_costs_memcpy_ref(v, REPS);
    double ref_cma = c->target_pid > 0 ? kvl_costs_cma_ref(c, v, REPS) : -1;
    for (int b = 0; b < c->nbk && rc == 0; b++) {
        double p50, p99;
        if (kvl_costs_latency(c, c->bks[b], v, REPS, &p50, &p99) != 0) {
            rc = 1;
            break;
        }
        int cma = strcmp(c->bks[b], "shm") == 0 && ref_cma > 0;
        kvl_costs_row("4 KiB WRITE, post -> complete", c->bks[b], p50, p99,
                      cma ? "process_vm_writev 4 KiB" : "memcpy 4 KiB", cma ? ref_cma : ref_memcpy);
    }
    double ref_mlock = kvl_costs_mlock_ref(v, REPS);
    const char *mref = ref_mlock >= 0 ? "mmap+mlock+munlock+munmap 4 KiB" : "(mlock refused)";
    for (size_t k = 0; k < 2 && rc == 0; k++) {
        size_t n = k == 0 ? 1 : NREG;
        double reg, dereg;
        if (kvl_costs_register(c->a, regbuf, n, v, w, k == 0 ? REPS : 50, &reg, &dereg) != 0) {
            rc = 1;
            break;
        }
        char row[64];
        snprintf(row, sizeof(row), "register, %zu region%s, per region", n, n > 1 ? "s" : "");
        kvl_costs_row(row, c->bkall, reg, -1, mref, ref_mlock);
        snprintf(row, sizeof(row), "deregister, %zu region%s, per region", n, n > 1 ? "s" : "");
        kvl_costs_row(row, c->bkall, dereg, -1, NULL, -1);
    }
    /* Prepared lists of NBLK 4 KiB blocks on both sides. */
    kvl_dlist_t *l = NULL, *r = NULL;
    kvl_prep_t *lp = NULL, *rp = NULL;
    if (rc == 0 &&
        (kvl_dlist_create(KVL_MEM_DRAM, NBLK, &l) != KVL_OK ||
         kvl_dlist_create(KVL_MEM_DRAM, NBLK, &r) != KVL_OK)) {
        kvl_cli_print_error("bench costs: kvl_dlist_create");
        rc = 1;
    }
    for (size_t i = 0; rc == 0 && i < NBLK; i++)
        if (kvl_dlist_add(l, c->lbase + i * 4096, 4096, KVL_DEV_ANY) != KVL_OK ||
            kvl_dlist_add(r, c->rbase + i * 4096, 4096, KVL_DEV_ANY) != KVL_OK) {
            kvl_cli_print_error("bench costs: kvl_dlist_add");
            rc = 1;
        }
    if (rc == 0 && (kvl_prep_local(c->a, l, &lp) != KVL_OK ||
                    kvl_prep_remote(c->a, c->target, r, &rp) != KVL_OK)) {
        kvl_cli_print_error("bench costs: kvl_prep_local/remote");
        rc = 1;
    }
    for (int b = 0; b < c->nbk && rc == 0; b++) {
        for (int between = 0; between < 2 && rc == 0; between++) {
            double m1, mn, p1, pn;
            if (kvl_costs_make(c, c->bks[b], lp, rp, NBLK, 1, between, v, w, REPS, &m1, &p1) ||
                kvl_costs_make(c, c->bks[b], lp, rp, NBLK, NREQ, between, v, w, 500, &mn, &pn)) {
                rc = 1;
                break;
            }
            const char *tag = between ? ", transfers between" : "";
            char row[96];
            snprintf(row, sizeof(row), "make from prepared lists, fixed%s", tag);
            kvl_costs_row(row, c->bks[b], m1, -1, NULL, -1);
            snprintf(row, sizeof(row), "make, per descriptor (n=%d)%s", NREQ, tag);
            kvl_costs_row(row, c->bks[b], (mn - m1) / (NREQ - 1), -1, NULL, -1);
            if (between) {
                snprintf(row, sizeof(row), "post of a %d-pair request", NREQ);
                kvl_costs_row(row, c->bks[b], pn, -1, NULL, -1);
            }
        }
    }
    kvl_prep_release(lp);
    kvl_prep_release(rp);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    munmap(regbuf, (size_t)NREG * 4096);
    free(v);
    free(w);
    return rc;
}
