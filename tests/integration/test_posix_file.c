/*
 * posix backend on a real file system (a temp dir under $TMPDIR or /tmp):
 * DRAM -> FILE -> DRAM with verification, on io_uring and on the thread
 * pool; many files at offset 0 (HiCache/LMCache shape); scattered blocks;
 * O_DIRECT (when the file system takes it) with a misaligned descriptor
 * diagnosed at prepare; a READ past the end of a file; a read-only fd
 * written; registration of a bad fd and a pipe; deregistration by
 * (offset, len, fd); a transfer with a notification; cancel (a cancelled
 * transfer's notification is never delivered); io_uring refused by a seccomp
 * filter (as container runtimes do): the fallback to pread/pwrite threads,
 * said in the path, and engine=io_uring refused with the reason. io_uring
 * fixed buffers: DRAM registered on posix is pinned as one (the report and
 * the transfer's path say so) and bytes move through it; with
 * fixed_buffers_mib=0, or a RLIMIT_MEMLOCK too low to pin it (a child without
 * CAP_IPC_LOCK), the region still registers and moves, and the report says
 * why it is not a fixed buffer; the file goes into the ring's file table
 * (the path says "registered files"). GPUDirect Storage: the parameter gds (auto,
 * on, off; KVL_POSIX_GDS its default) checked at open, and what a FILE
 * registration's report says VRAM transfers with it use (here, with no GPU:
 * staged, and why: gds off, or libcufile.so not found).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include "common/kvltest.h"

static char dir[256];

static int open_in(const char *name, int flags)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return open(p, flags | O_CREAT, 0644);
}

static kvl_agent_t *make_agent(const char *name, const char *engine)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p[] = {{"engine", engine}, {NULL, NULL}};
    kvl_backend_t *bk;
    KT_OK(kvl_backend_create(a, "posix", p, 1, &bk));
    return a;
}

static void reg(kvl_agent_t *a, kvl_mem_kind_t kind, uint64_t addr, uint64_t len, int32_t dev)
{
    kvl_mem_desc_t d = {addr, len, dev};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_KIND, .kind = kind};
    KT_OK(kvl_mem_register(a, &d, 1, &rp, NULL));
}

/* One transfer between host blocks and file blocks; returns its status. */
static kvl_status_t move(kvl_agent_t *a, kvl_xfer_op_t op, const uint64_t *host,
                         const uint64_t *off, const int *fds, size_t n, uint64_t len,
                         const char *notif)
{
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, n, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, n, &r));
    for (size_t i = 0; i < n; i++) {
        KT_OK(kvl_dlist_add(l, host[i], len, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, off[i], len, fds[i]));
    }
    kvl_xfer_params_t xp = {0};
    if (notif) {
        xp.field_mask = KVL_XFER_PARAM_NOTIF;
        xp.notif = notif;
        xp.notif_len = strlen(notif);
    }
    kvl_status_t st = kvl_xfer_create(a, op, l, kvl_agent_name(a), r, &xp, &x);
    if (st == KVL_OK) {
        st = kvl_xfer_post(x);
        if (st == KVL_OK || st == KVL_IN_PROGRESS)
            st = kvl_xfer_wait(x, 60000);
        kvl_xfer_release(x);
    }
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    return st;
}

static void roundtrip(const char *engine)
{
    char name[64];
    snprintf(name, sizeof(name), "posix-%s", engine);
    kvl_agent_t *a = make_agent(name, engine);
    enum { NF = 8, BLK = 64 * 1024 };
    char *src = malloc(NF * BLK), *dst = malloc(NF * BLK);
    KT_CHECK(src && dst);
    kt_fill(src, NF * BLK, 7);
    memset(dst, 0, NF * BLK);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)src, NF * BLK, KVL_DEV_ANY);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)dst, NF * BLK, KVL_DEV_ANY);
    /* many files, each registered at offset 0 with the same length */
    int fds[NF];
    uint64_t hs[NF], hd[NF], off[NF];
    for (int i = 0; i < NF; i++) {
        char fn[64];
        snprintf(fn, sizeof(fn), "%s-%d.bin", engine, i);
        fds[i] = open_in(fn, O_RDWR | O_TRUNC);
        KT_CHECK(fds[i] >= 0);
        reg(a, KVL_MEM_FILE, 0, BLK, fds[i]);
        /* reversed so the pairing is not the identity */
        hs[i] = (uint64_t)(uintptr_t)(src + (size_t)(NF - 1 - i) * BLK);
        hd[i] = (uint64_t)(uintptr_t)(dst + (size_t)(NF - 1 - i) * BLK);
        off[i] = 0;
    }
    KT_OK(move(a, KVL_WRITE, hs, off, fds, NF, BLK, "written"));
    for (int i = 0; i < NF; i++) {
        struct stat st;
        KT_CHECK(fstat(fds[i], &st) == 0 && st.st_size == BLK);
    }
    /* the notification reaches this agent, after the data */
    kvl_notif_t nt;
    size_t nn = 0;
    KT_OK(kvl_notif_wait(a, 10000));
    KT_OK(kvl_notif_poll(a, &nt, 1, &nn));
    KT_CHECK(nn == 1 && nt.len == 7 && memcmp(nt.msg, "written", 7) == 0 &&
             strcmp(nt.from, name) == 0);
    kvl_notif_free(&nt);
    KT_OK(move(a, KVL_READ, hd, off, fds, NF, BLK, NULL));
    KT_CHECK(kt_verify(dst, NF * BLK, 7) == -1);

    /* scattered small blocks inside one file, in shuffled order */
    enum { NB = 512, SB = 4096 };
    int big = open_in("scatter.bin", O_RDWR | O_TRUNC);
    KT_CHECK(big >= 0);
    char *s2 = malloc(NB * SB), *d2 = malloc(NB * SB);
    KT_CHECK(s2 && d2);
    kt_fill(s2, NB * SB, 99);
    memset(d2, 0, NB * SB);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)s2, NB * SB, KVL_DEV_ANY);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)d2, NB * SB, KVL_DEV_ANY);
    reg(a, KVL_MEM_FILE, 0, (uint64_t)NB * SB * 2, big);
    uint64_t *h1 = malloc(NB * 8), *h2 = malloc(NB * 8), *o = malloc(NB * 8);
    int *bf = malloc(NB * sizeof(int));
    for (int i = 0; i < NB; i++) {
        int j = (i * 37) % NB; /* 37 is prime to 512: a permutation */
        h1[i] = (uint64_t)(uintptr_t)(s2 + (size_t)i * SB);
        h2[i] = (uint64_t)(uintptr_t)(d2 + (size_t)i * SB);
        o[i] = (uint64_t)j * 2 * SB; /* every other slot: holes between */
        bf[i] = big;
    }
    KT_OK(move(a, KVL_WRITE, h1, o, bf, NB, SB, NULL));
    KT_OK(move(a, KVL_READ, h2, o, bf, NB, SB, NULL));
    KT_CHECK(kt_verify(d2, NB * SB, 99) == -1);
    /* the bytes are in the file where the descriptors said */
    char chk[SB];
    KT_CHECK(pread(big, chk, SB, (off_t)o[5]) == SB);
    KT_CHECK(memcmp(chk, s2 + 5 * SB, SB) == 0);

    /* Prepared lists and index arrays (kvl_xfer_create_prepped, NIXL's
     * make_prepped_xfer): 300 pairs of uniform lists are an indexed
     * transfer: creation pairs nothing, and posix builds its file operations
     * from the index arrays, never pairing them into segments either. Block
     * k of s2 goes to file slot (k * 101) % NB and comes back to block k of
     * d2; a re-post moves it again; an index past the list is refused. */
    {
        enum { NP = 300 };
        kvl_dlist_t *ls, *ld, *lf;
        kvl_prep_t *ps, *pd, *pf;
        int64_t li[NP], fi[NP];
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, NB, &ls));
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, NB, &ld));
        KT_OK(kvl_dlist_create(KVL_MEM_FILE, NB, &lf));
        for (int i = 0; i < NB; i++) {
            KT_OK(kvl_dlist_add(ls, h1[i], SB, KVL_DEV_ANY));
            KT_OK(kvl_dlist_add(ld, h2[i], SB, KVL_DEV_ANY));
            KT_OK(kvl_dlist_add(lf, (uint64_t)i * 2 * SB, SB, big));
        }
        KT_OK(kvl_prep_local(a, ls, &ps));
        KT_OK(kvl_prep_local(a, ld, &pd));
        KT_OK(kvl_prep_remote(a, name, lf, &pf));
        for (int k = 0; k < NP; k++) {
            li[k] = k;
            fi[k] = (k * 101) % NB; /* 101 is prime to 512 */
        }
        memset(d2, 0, NB * SB);
        kvl_xfer_t *xw, *xr;
        kvl_xfer_stats_t xs;
        KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, ps, li, pf, fi, NP, NULL, &xw));
        KT_OK(kvl_xfer_get_stats(xw, &xs));
        KT_CHECK(xs.segments == 0 && xs.blocks == NP);
        for (int post = 0; post < 2; post++) {
            kt_fill(s2, NB * SB, 123 + (uint64_t)post); /* the re-post's bytes must land */
            kvl_status_t st = kvl_xfer_post(xw);
            KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
            KT_OK(kvl_xfer_wait(xw, 60000));
        }
        KT_OK(kvl_xfer_get_stats(xw, &xs));
        KT_CHECK(xs.segments == 0 && xs.blocks == NP && xs.bytes == (uint64_t)NP * SB);
        kvl_xfer_release(xw);
        KT_OK(kvl_xfer_create_prepped(a, KVL_READ, pd, li, pf, fi, NP, NULL, &xr));
        kvl_status_t st = kvl_xfer_post(xr);
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        KT_OK(kvl_xfer_wait(xr, 60000));
        kvl_xfer_release(xr);
        KT_CHECK(memcmp(d2, s2, (size_t)NP * SB) == 0);
        KT_CHECK(pread(big, chk, SB, (off_t)(7 * 101 % NB) * 2 * SB) == SB);
        KT_CHECK(memcmp(chk, s2 + 7 * SB, SB) == 0);
        fi[NP - 1] = NB;
        KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, ps, li, pf, fi, NP, NULL, &xw),
                  KVL_ERR_INVALID_ARG);
        KT_ERROR_HAS("remote index 299");
        kvl_prep_release(ps);
        kvl_prep_release(pd);
        kvl_prep_release(pf);
        kvl_dlist_destroy(ls);
        kvl_dlist_destroy(ld);
        kvl_dlist_destroy(lf);
    }

    /* READ past the end of a file: a short file, found before any byte moves */
    int shortf = open_in("short.bin", O_RDWR | O_TRUNC);
    KT_CHECK(shortf >= 0 && ftruncate(shortf, 1000) == 0);
    reg(a, KVL_MEM_FILE, 0, BLK, shortf);
    uint64_t z = 0;
    KT_STATUS(move(a, KVL_READ, hd, &z, &shortf, 1, BLK, NULL), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("short file");

    /* WRITE through a read-only descriptor: said at prepare */
    int ro = open_in("short.bin", O_RDONLY);
    KT_CHECK(ro >= 0);
    reg(a, KVL_MEM_FILE, 0, BLK, ro);
    KT_STATUS(move(a, KVL_WRITE, hs, &z, &ro, 1, BLK, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("read-only");

    /* a descriptor outside every registration names fd and offset */
    uint64_t far = 1ull << 30;
    KT_STATUS(move(a, KVL_WRITE, hs, &far, &fds[0], 1, BLK, NULL), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("offset 1073741824");

    /* deregister by (offset, len, fd), all files at offset 0 in one call */
    kvl_mem_desc_t dr[NF];
    for (int i = 0; i < NF; i++)
        dr[i] = (kvl_mem_desc_t){0, BLK, fds[i]};
    KT_OK(kvl_mem_deregister(a, dr, NF));
    KT_STATUS(kvl_mem_deregister(a, dr, 1), KVL_ERR_NOT_FOUND);
    kvl_agent_destroy(a);
    for (int i = 0; i < NF; i++)
        close(fds[i]);
    close(big);
    close(shortf);
    close(ro);
    free(src), free(dst), free(s2), free(d2), free(h1), free(h2), free(o), free(bf);
    printf("roundtrip on %s: ok\n", engine);
}

static void bad_registrations(void)
{
    kvl_agent_t *a = make_agent("posix-bad", "auto");
    kvl_mem_desc_t d = {0, 4096, 9999};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    KT_STATUS(kvl_mem_register(a, &d, 1, &rp, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("not an open file descriptor");
    d.dev = -1;
    KT_STATUS(kvl_mem_register(a, &d, 1, &rp, NULL), KVL_ERR_INVALID_ARG);
    int pfd[2];
    KT_CHECK(pipe(pfd) == 0);
    d.dev = pfd[0];
    KT_STATUS(kvl_mem_register(a, &d, 1, &rp, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("not a regular file");
    int f = open_in("big.bin", O_RDWR);
    d = (kvl_mem_desc_t){KVL_FILE_OFFSET_MAX - 10, 4096, f};
    KT_STATUS(kvl_mem_register(a, &d, 1, &rp, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("1 TiB");
    /* a FILE list as the local side is refused with the fix */
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    reg(a, KVL_MEM_FILE, 0, 4096, f);
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, 1, &r));
    KT_OK(kvl_dlist_add(l, 0, 4096, f));
    KT_OK(kvl_dlist_add(r, 0, 4096, f));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "posix-bad", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("local list of the transfer is FILE");
    /* a FILE descriptor list without a fd */
    KT_STATUS(kvl_dlist_add(r, 0, 4096, KVL_DEV_ANY), KVL_ERR_INVALID_ARG);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    close(pfd[0]);
    close(pfd[1]);
    close(f);
    kvl_agent_destroy(a);
    printf("bad registrations: ok\n");
}

static void direct_io(void)
{
    int f = open_in("direct.bin", O_RDWR | O_DIRECT | O_TRUNC);
    if (f < 0) {
        printf("O_DIRECT part skipped: %s refuses O_DIRECT (%s)\n", dir, strerror(errno));
        return;
    }
    kvl_agent_t *a = make_agent("posix-direct", "auto");
    size_t len = 4u << 20;
    char *src, *dst;
    KT_CHECK(posix_memalign((void **)&src, 4096, len + 4096) == 0);
    KT_CHECK(posix_memalign((void **)&dst, 4096, len) == 0);
    kt_fill(src, len, 3);
    memset(dst, 0, len);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)src, len + 4096, KVL_DEV_ANY);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)dst, len, KVL_DEV_ANY);
    reg(a, KVL_MEM_FILE, 0, len + 4096, f);
    uint64_t h[4], o[4], hd[4];
    int fds[4] = {f, f, f, f};
    for (int i = 0; i < 4; i++) {
        h[i] = (uint64_t)(uintptr_t)(src + (size_t)i * (len / 4));
        hd[i] = (uint64_t)(uintptr_t)(dst + (size_t)i * (len / 4));
        o[i] = (uint64_t)(3 - i) * (len / 4);
    }
    KT_OK(move(a, KVL_WRITE, h, o, fds, 4, len / 4, NULL));
    KT_OK(move(a, KVL_READ, hd, o, fds, 4, len / 4, NULL));
    KT_CHECK(kt_verify(dst, len, 3) == -1);
    /* misaligned memory: refused at prepare, naming the block and alignment */
    uint64_t bad = (uint64_t)(uintptr_t)(src + 100), zero = 0;
    KT_STATUS(move(a, KVL_WRITE, &bad, &zero, &f, 1, 4096, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("not aligned for O_DIRECT");
    KT_ERROR_HAS("memory address");
    uint64_t odd = 512 + 1;
    KT_STATUS(move(a, KVL_WRITE, h, &odd, &f, 1, 4096, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("file offset");
    kvl_agent_destroy(a);
    close(f);
    free(src);
    free(dst);
    printf("O_DIRECT: ok\n");
}

static void cancel_big(void)
{
    /* Cancel a large write: the transfer ends (canceled or done), never
     * hangs, and the agent stays usable. */
    kvl_agent_t *a = make_agent("posix-cancel", "auto");
    size_t blk = 1u << 20, n = 64;
    char *src = malloc(blk * n);
    KT_CHECK(src != NULL);
    memset(src, 1, blk * n);
    int f = open_in("cancel.bin", O_RDWR | O_TRUNC);
    reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)src, blk * n, KVL_DEV_ANY);
    reg(a, KVL_MEM_FILE, 0, blk * n, f);
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, n, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, n, &r));
    for (size_t i = 0; i < n; i++) {
        KT_OK(kvl_dlist_add(l, (uint64_t)(uintptr_t)(src + i * blk), blk, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, (n - 1 - i) * blk, blk, f));
    }
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = "done", .notif_len = 4};
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "posix-cancel", r, &xp, &x));
    unsigned done = 0;
    for (int round = 0; round < 5; round++) {
        kvl_status_t st = kvl_xfer_post(x);
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        kvl_xfer_state_t state;
        st = kvl_xfer_cancel(x, &state);
        KT_CHECK(st == KVL_OK || st == KVL_ERR_CANCELED || st == KVL_ERR_STATE);
        KT_CHECK(state == KVL_XFER_CANCELED || state == KVL_XFER_DONE);
        done += state == KVL_XFER_DONE;
    }
    /* one notification per posting that completed, none for a cancelled one */
    kvl_notif_t nt[8];
    size_t nn = 0;
    KT_OK(kvl_notif_poll(a, nt, 8, &nn));
    KT_CHECK(nn == done);
    for (size_t i = 0; i < nn; i++)
        kvl_notif_free(&nt[i]);
    printf("cancel: %u of 5 postings completed before the cancel\n", done);
    /* after the cancels, the same transfer posts and completes */
    kvl_status_t pst = kvl_xfer_post(x);
    if (pst != KVL_OK && pst != KVL_IN_PROGRESS)
        fprintf(stderr, "post after cancel: %s\n", kvl_status_name(pst));
    KT_CHECK(pst == KVL_OK || pst == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 60000));
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_mem_desc_t d = {0, blk * n, f};
    KT_OK(kvl_mem_deregister(a, &d, 1));
    kvl_agent_destroy(a);
    close(f);
    free(src);
    printf("cancel: ok\n");
}

/* A WRITE the kernel fails while it runs (EFBIG: past the process's file
 * size limit, RLIMIT_FSIZE, with SIGXFSZ ignored), in a child so the limit
 * stays there: the transfer fails with the errno named and the file named;
 * the same transfer posted again once the limit is lifted moves every byte,
 * then fails again under the limit, saying so again. */
static void io_failure(const char *engine)
{
    fflush(stdout);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        enum { N = 4, B = 64 * 1024 };
        kvl_agent_t *a = make_agent("posix-efbig", engine);
        char *src = malloc(N * B), *back = calloc(1, N * B);
        KT_CHECK(src && back);
        kt_fill(src, N * B, 33);
        int fd = open_in("efbig.bin", O_RDWR | O_TRUNC);
        KT_CHECK(fd >= 0);
        reg(a, KVL_MEM_DRAM, (uintptr_t)src, N * B, KVL_DEV_ANY);
        reg(a, KVL_MEM_DRAM, (uintptr_t)back, N * B, KVL_DEV_ANY);
        reg(a, KVL_MEM_FILE, 0, N * B, fd);
        kvl_dlist_t *l, *f, *lb;
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, N, &l));
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, N, &lb));
        KT_OK(kvl_dlist_create(KVL_MEM_FILE, N, &f));
        for (uint64_t i = 0; i < N; i++) {
            KT_OK(kvl_dlist_add(l, (uintptr_t)src + i * B, B, KVL_DEV_ANY));
            KT_OK(kvl_dlist_add(lb, (uintptr_t)back + i * B, B, KVL_DEV_ANY));
            KT_OK(kvl_dlist_add(f, i * B, B, fd));
        }
        kvl_xfer_t *x, *rd;
        KT_OK(kvl_xfer_create(a, KVL_WRITE, l, kvl_agent_name(a), f, NULL, &x));
        KT_OK(kvl_xfer_create(a, KVL_READ, lb, kvl_agent_name(a), f, NULL, &rd));
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit old, lim;
        KT_CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
        lim = old;
        lim.rlim_cur = B; /* the first block fits, the others do not */
        for (int round = 0; round < 2; round++) {
            KT_CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
            kvl_status_t st = kvl_xfer_post(x);
            if (st == KVL_OK || st == KVL_IN_PROGRESS)
                st = kvl_xfer_wait(x, 60000);
            KT_STATUS(st, KVL_ERR_SYSTEM);
            KT_ERROR_HAS("WRITE of");
            KT_ERROR_HAS("efbig.bin");
            KT_ERROR_HAS("(EFBIG)");
            KT_CHECK(kvl_last_error()->sys_errno == EFBIG);
            KT_CHECK(strcmp(kvl_last_error()->backend, "posix") == 0);
            KT_CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
            st = kvl_xfer_post(x);
            if (st == KVL_OK || st == KVL_IN_PROGRESS)
                st = kvl_xfer_wait(x, 60000);
            KT_OK(st);
            memset(back, 0, N * B);
            st = kvl_xfer_post(rd);
            if (st == KVL_OK || st == KVL_IN_PROGRESS)
                st = kvl_xfer_wait(rd, 60000);
            KT_OK(st);
            KT_CHECK(kt_verify(back, N * B, 33) == -1);
            KT_CHECK(ftruncate(fd, 0) == 0);
        }
        kvl_xfer_release(x);
        kvl_xfer_release(rd);
        kvl_dlist_destroy(l);
        kvl_dlist_destroy(lb);
        kvl_dlist_destroy(f);
        kvl_agent_destroy(a);
        close(fd);
        free(src), free(back);
        exit(0);
    }
    int ws = 0;
    KT_CHECK(waitpid(pid, &ws, 0) == pid);
    KT_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* A seccomp filter that answers io_uring_setup with EPERM, as a container
 * runtime's default profile does; everything else is allowed. */
static int deny_io_uring(void)
{
#ifdef __NR_io_uring_setup
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static void seccomp_fallback(void)
{
    /* a build without liburing never uses io_uring: nothing to deny */
    kvl_agent_t *probe;
    kvl_agent_config_t pcfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_param_t pp[] = {{"engine", "io_uring"}, {NULL, NULL}};
    KT_OK(kvl_agent_create("posix-uring-probe", &pcfg, &probe));
    kvl_status_t pst = kvl_backend_create(probe, "posix", pp, 1, NULL);
    int unbuilt = pst != KVL_OK && kt_error_has("built without liburing");
    kvl_agent_destroy(probe);
    if (unbuilt) {
        printf("seccomp part skipped: this kvlane was built without liburing\n");
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        if (deny_io_uring() != 0) {
            printf("seccomp part skipped: cannot install a seccomp filter (%s)\n",
                   strerror(errno));
            exit(0);
        }
        /* engine=io_uring: refused, saying why */
        kvl_agent_t *a;
        kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
        KT_OK(kvl_agent_create("posix-seccomp", &cfg, &a));
        kvl_param_t p[] = {{"engine", "io_uring"}, {NULL, NULL}};
        KT_STATUS(kvl_backend_create(a, "posix", p, 1, NULL), KVL_ERR_UNSUPPORTED);
        KT_ERROR_HAS("engine=io_uring was asked for");
        KT_ERROR_HAS("seccomp");
        kvl_agent_destroy(a);
        /* engine=auto: pread/pwrite threads, and every transfer says so */
        a = make_agent("posix-seccomp2", "auto");
        enum { L = 256 * 1024 };
        char *src = malloc(L), *dst = calloc(1, L);
        KT_CHECK(src && dst);
        kt_fill(src, L, 21);
        int fd = open_in("seccomp.bin", O_RDWR | O_TRUNC);
        KT_CHECK(fd >= 0);
        reg(a, KVL_MEM_DRAM, (uint64_t)(uintptr_t)src, L, KVL_DEV_ANY);
        reg(a, KVL_MEM_FILE, 0, L, fd);
        kvl_dlist_t *l, *r;
        kvl_xfer_t *x;
        KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
        KT_OK(kvl_dlist_create(KVL_MEM_FILE, 1, &r));
        KT_OK(kvl_dlist_add(l, (uint64_t)(uintptr_t)src, L, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(r, 0, L, fd));
        KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "posix-seccomp2", r, NULL, &x));
        kvl_status_t st = kvl_xfer_post(x);
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        KT_OK(kvl_xfer_wait(x, 60000));
        kvl_xfer_stats_t s;
        KT_OK(kvl_xfer_get_stats(x, &s));
        KT_CHECK(strstr(s.path, "pread/pwrite threads") != NULL);
        KT_CHECK(pread(fd, dst, L, 0) == L && memcmp(src, dst, L) == 0);
        printf("io_uring denied by seccomp: path '%s'\n", s.path);
        kvl_xfer_release(x);
        kvl_dlist_destroy(l);
        kvl_dlist_destroy(r);
        kvl_agent_destroy(a);
        close(fd);
        free(src);
        free(dst);
        exit(0);
    }
    int status;
    KT_CHECK(waitpid(pid, &status, 0) == pid);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Register 1 MiB of DRAM on a posix backend with params; the report's
 * detail into det; then a WRITE and READ back through a file, checked, whose
 * path goes into path. */
static void fixed_case(const kvl_param_t *prm, size_t np, char *det, size_t dcap, char *path,
                       size_t pcap)
{
    enum { L = 1 << 20 };
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create("posix-fixed", &cfg, &a));
    KT_OK(kvl_backend_create(a, "posix", prm, np, NULL));
    char *src = aligned_alloc(4096, L), *dst = aligned_alloc(4096, L);
    KT_CHECK(src && dst);
    kt_fill(src, L, 77);
    memset(dst, 0, L);
    kvl_mem_desc_t d[2] = {{(uint64_t)(uintptr_t)src, L, KVL_DEV_ANY},
                           {(uint64_t)(uintptr_t)dst, L, KVL_DEV_ANY}};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_DRAM};
    kvl_reg_report_t *rep = NULL;
    KT_OK(kvl_mem_register(a, d, 2, &rp, &rep));
    KT_CHECK(rep->n_entries == 2 && rep->entries[0].n_outcomes >= 1);
    snprintf(det, dcap, "%s", rep->entries[0].outcomes[0].detail);
    kvl_reg_report_free(rep);
    int fd = open_in("fixed.bin", O_RDWR | O_CREAT | O_TRUNC);
    KT_CHECK(fd >= 0);
    reg(a, KVL_MEM_FILE, 0, L, fd);
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, 1, &r));
    KT_OK(kvl_dlist_add(l, d[0].addr, L, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, 0, L, fd));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, kvl_agent_name(a), r, NULL, &x));
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 60000);
    KT_OK(st);
    kvl_xfer_stats_t xs;
    KT_OK(kvl_xfer_get_stats(x, &xs));
    snprintf(path, pcap, "%s", xs.path);
    kvl_xfer_release(x);
    uint64_t h = d[1].addr, off = 0;
    KT_OK(move(a, KVL_READ, &h, &off, &fd, 1, L, NULL));
    KT_CHECK(memcmp(src, dst, L) == 0);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_mem_desc_t fdsc = {0, L, fd};
    KT_OK(kvl_mem_deregister(a, &fdsc, 1));
    KT_OK(kvl_mem_deregister(a, d, 2)); /* the slots are given back */
    kvl_agent_destroy(a);
    close(fd);
    free(src);
    free(dst);
}

static void fixed_buffers(void)
{
    char det[2100], path[80];
    kvl_param_t on[] = {{"engine", "io_uring"}};
    kvl_agent_t *probe;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create("posix-fixed-probe", &cfg, &probe));
    kvl_status_t pst = kvl_backend_create(probe, "posix", on, 1, NULL);
    kvl_agent_destroy(probe);
    if (pst != KVL_OK) {
        printf("fixed buffers skipped: no io_uring here\n");
        return;
    }
    fixed_case(on, 1, det, sizeof(det), path, sizeof(path));
    printf("fixed buffers: %s; path '%s'\n", det, path);
    if (strstr(det, "io_uring_register_buffers_sparse") != NULL) {
        printf("fixed buffers skipped: this kernel has no sparse buffer table\n");
        return;
    }
    KT_CHECK(strstr(det, "io_uring fixed buffer") != NULL && strstr(det, "not an") == NULL);
    KT_CHECK(strstr(path, "io_uring, fixed buffers") != NULL);
    /* the file went into the ring's file table (sparse tables came together, 5.19) */
    KT_CHECK(strstr(path, "registered files") != NULL);

    kvl_param_t off[] = {{"engine", "io_uring"}, {"fixed_buffers_mib", "0"}};
    fixed_case(off, 2, det, sizeof(det), path, sizeof(path));
    printf("fixed_buffers_mib=0: %s; path '%s'\n", det, path);
    KT_CHECK(strstr(det, "not an io_uring fixed buffer: fixed_buffers_mib=0") != NULL);
    KT_CHECK(strstr(path, "fixed") == NULL && strstr(path, "io_uring, registered files") != NULL);

    /* RLIMIT_MEMLOCK too low to pin it: a child without CAP_IPC_LOCK */
    fflush(stdout);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        struct __user_cap_header_struct hd = {_LINUX_CAPABILITY_VERSION_3, 0};
        struct __user_cap_data_struct cd[2];
        struct rlimit rl = {64 << 10, 64 << 10};
        if (syscall(SYS_capget, &hd, cd) != 0)
            exit(3);
        for (int i = 0; i < 2; i++) {
            cd[i].effective &= ~(i == CAP_IPC_LOCK / 32 ? 1u << (CAP_IPC_LOCK % 32) : 0u);
            cd[i].permitted &= ~(i == CAP_IPC_LOCK / 32 ? 1u << (CAP_IPC_LOCK % 32) : 0u);
        }
        if (syscall(SYS_capset, &hd, cd) != 0 || setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
            printf("memlock part skipped: cannot drop CAP_IPC_LOCK or lower the limit (%s)\n",
                   strerror(errno));
            exit(0);
        }
        fixed_case(on, 1, det, sizeof(det), path, sizeof(path));
        printf("RLIMIT_MEMLOCK 64 KiB, no CAP_IPC_LOCK: %s; path '%s'\n", det, path);
        KT_CHECK(strstr(det, "not an io_uring fixed buffer") != NULL);
        KT_CHECK(strstr(det, "RLIMIT_MEMLOCK is 65536 bytes") != NULL);
        KT_CHECK(strstr(path, "fixed") == NULL);
        exit(0);
    }
    int status;
    KT_CHECK(waitpid(pid, &status, 0) == pid);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A posix backend with prm (and KVL_POSIX_GDS=env unless NULL): its
 * creation's status; when it opens, a FILE registration's detail in det. */
static kvl_status_t gds_case(const char *env, const kvl_param_t *prm, size_t np, char *det,
                             size_t cap)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create("posix-gds", &cfg, &a));
    if (env != NULL)
        KT_CHECK(setenv("KVL_POSIX_GDS", env, 1) == 0);
    kvl_status_t st = kvl_backend_create(a, "posix", prm, np, NULL);
    unsetenv("KVL_POSIX_GDS");
    det[0] = '\0';
    if (st == KVL_OK) {
        int fd = open_in("gds.bin", O_RDWR | O_TRUNC);
        KT_CHECK(fd >= 0);
        kvl_mem_desc_t d = {0, 4096, fd};
        kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
        kvl_reg_report_t *rep = NULL;
        KT_OK(kvl_mem_register(a, &d, 1, &rp, &rep));
        snprintf(det, cap, "%s", rep->entries[0].outcomes[0].detail);
        kvl_reg_report_free(rep);
        KT_OK(kvl_mem_deregister(a, &d, 1));
        close(fd);
    }
    kvl_agent_destroy(a);
    return st;
}

static void gds_param(void)
{
    char det[2100];
    kvl_param_t bad[] = {{"gds", "maybe"}}, off[] = {{"gds", "off"}}, on[] = {{"gds", "on"}},
                autop[] = {{"gds", "auto"}};
    KT_STATUS(gds_case(NULL, bad, 1, det, sizeof(det)), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("parameter gds='maybe' is not auto, on or off");
    KT_STATUS(gds_case("sometimes", NULL, 0, det, sizeof(det)), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("KVL_POSIX_GDS='sometimes' is not auto, on or off");

    KT_OK(gds_case(NULL, off, 1, det, sizeof(det)));
    printf("gds=off: %s\n", det);
    KT_CHECK(strstr(det, "VRAM with it: staged, GPUDirect Storage not used: parameter gds=off"));
    KT_OK(gds_case("0", NULL, 0, det, sizeof(det)));
    printf("KVL_POSIX_GDS=0: %s\n", det);
    KT_CHECK(strstr(det, "VRAM with it: staged, GPUDirect Storage not used: KVL_POSIX_GDS=0"));

    /* on opens (it refuses VRAM <-> FILE only, where GPUDirect is not there) */
    KT_OK(gds_case(NULL, on, 1, det, sizeof(det)));
    KT_OK(gds_case("0", autop, 1, det, sizeof(det))); /* the parameter wins */
    printf("KVL_POSIX_GDS=0, gds=auto: %s\n", det);
    KT_CHECK(strstr(det, "KVL_POSIX_GDS=0") == NULL && strstr(det, "VRAM with it: "));
    void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        h = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) {
        printf("libcufile.so is here: the 'not found' report is not checked\n");
        dlclose(h);
        return;
    }
    KT_CHECK(strstr(det, "VRAM with it: staged, GPUDirect Storage not used: libcufile.so not "
                         "found ("));
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/kvl-posix-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    bad_registrations();
    roundtrip("auto");
    roundtrip("threads");
    direct_io();
    cancel_big();
    io_failure("threads");
    io_failure("auto");
    seccomp_fallback();
    fixed_buffers();
    gds_param();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("PASS\n");
    return 0;
}
