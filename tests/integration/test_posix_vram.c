/*
 * posix backend, GPU memory to and from files, staged through pinned host
 * buffers (GPU machine; skips with the reason elsewhere): VRAM -> file ->
 * VRAM with every byte checked, scattered blocks in shuffled file order,
 * pieces larger than the staging chunk, O_DIRECT when the file system takes
 * it, 300 prepared pairs (an indexed transfer) out and back, a short file,
 * and the registration report naming the staged path and why GPUDirect
 * Storage is not used (gds=off here: test_posix_gds drives cuFile).
 * KVL_TEST_LABELS: gpu
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "gpu/kvl_cuda_test.h"

static kt_cuda_t cu;
static char dir[256];

static kvl_status_t move(kvl_agent_t *a, kvl_xfer_op_t op, kt_cu_ptr d, const uint64_t *doff,
                         const uint64_t *foff, size_t n, uint64_t len, int fd)
{
    char path[80];
    kvl_status_t st = kt_file_move(a, op, KVL_MEM_VRAM, 0, d, doff, foff, n, len, fd, path,
                                   sizeof(path));
    if (st == KVL_OK)
        printf("  %s %zu x %llu bytes: path %s\n", op == KVL_WRITE ? "WRITE" : "READ", n,
               (unsigned long long)len, path);
    return st;
}

static void run(int direct)
{
    enum { LEN = 48 << 20 };
    char p[512];
    snprintf(p, sizeof(p), "%s/vram-%d.bin", dir, direct);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct) {
        printf("O_DIRECT part skipped: %s refuses O_DIRECT (%s)\n", dir, strerror(errno));
        return;
    }
    KT_CHECK(fd >= 0);
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create(direct ? "posix-vram-d" : "posix-vram", &cfg, &a));
    kvl_param_t prm[] = {{"stage_chunk_kib", "1024"}, {"gds", "off"}, {NULL, NULL}};
    KT_OK(kvl_backend_create(a, "posix", prm, 2, NULL));
    kt_cu_ptr d;
    KT_CHECK(cu.MemAlloc(&d, LEN) == 0);
    kt_cuda_fill(&cu, d, LEN, 11);
    kvl_mem_desc_t dv = {d, LEN, 0}, df = {0, 2ull * LEN, fd};
    kvl_reg_params_t pv = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
    kvl_reg_params_t pf = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    kvl_reg_report_t *rep = NULL;
    KT_OK(kvl_mem_register(a, &dv, 1, &pv, &rep));
    char text[8192];
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    KT_CHECK(strstr(text, "staged through pinned host buffers") != NULL);
    KT_CHECK(strstr(text, "GPUDirect Storage not used: parameter gds=off") != NULL);
    kvl_reg_report_free(rep);
    KT_OK(kvl_mem_register(a, &df, 1, &pf, NULL));

    /* 1. one 48 MiB block (48 staged pieces of 1 MiB) out and back */
    uint64_t z = 0;
    KT_OK(move(a, KVL_WRITE, d, &z, &z, 1, LEN, fd));
    unsigned char *h = malloc(LEN), *want = malloc(LEN);
    KT_CHECK(h && want);
    kt_fill(want, LEN, 11);
    int rfd = open(p, O_RDONLY);
    KT_CHECK(rfd >= 0 && pread(rfd, h, LEN, 0) == LEN && memcmp(h, want, LEN) == 0);
    KT_CHECK(cu.MemsetD8(d, 0, LEN) == 0);
    KT_OK(move(a, KVL_READ, d, &z, &z, 1, LEN, fd));
    KT_CHECK(kt_cuda_verify(&cu, d, LEN, 11) == -1);

    /* 2. 512 scattered 64 KiB blocks at shuffled file offsets */
    enum { NB = 512, BS = 64 << 10 };
    uint64_t *doff = malloc(NB * 8), *foff = malloc(NB * 8);
    for (uint64_t i = 0; i < NB; i++) {
        doff[i] = i * BS;
        foff[i] = LEN + ((i * 181) % NB) * BS; /* 181 prime to 512 */
    }
    kt_cuda_fill(&cu, d, LEN, 12);
    KT_OK(move(a, KVL_WRITE, d, doff, foff, NB, BS, fd));
    KT_CHECK(cu.MemsetD8(d, 0, LEN) == 0);
    KT_OK(move(a, KVL_READ, d, doff, foff, NB, BS, fd));
    KT_CHECK(kt_cuda_verify(&cu, d, (uint64_t)NB * BS, 12) == -1);
    KT_CHECK(pread(rfd, h, BS, (off_t)foff[7]) == BS);
    kt_fill(want, (uint64_t)NB * BS, 12);
    KT_CHECK(memcmp(h, want + 7 * BS, BS) == 0);

    /* 2b. prepared lists (NIXL's make_prepped_xfer): 300 pairs of uniform
     * lists are an indexed transfer, its file operations built from the
     * index arrays at its first posting (never paired). Block k
     * of the GPU buffer goes to file slot (k * 101) % NB, is posted again
     * with new bytes, and comes back to block k. */
    {
        enum { NP = 300 };
        kvl_dlist_t *lv, *lf;
        kvl_prep_t *pv2, *pf2;
        int64_t li[NP], fi[NP];
        KT_OK(kvl_dlist_create(KVL_MEM_VRAM, NB, &lv));
        KT_OK(kvl_dlist_create(KVL_MEM_FILE, NB, &lf));
        for (uint64_t i = 0; i < NB; i++) {
            KT_OK(kvl_dlist_add(lv, d + i * BS, BS, 0));
            KT_OK(kvl_dlist_add(lf, LEN + i * BS, BS, fd));
        }
        KT_OK(kvl_prep_local(a, lv, &pv2));
        KT_OK(kvl_prep_remote(a, kvl_agent_name(a), lf, &pf2));
        for (int k = 0; k < NP; k++) {
            li[k] = k;
            fi[k] = (k * 101) % NB; /* 101 is prime to 512 */
        }
        kvl_xfer_t *x;
        kvl_xfer_stats_t xs;
        KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, pv2, li, pf2, fi, NP, NULL, &x));
        KT_OK(kvl_xfer_get_stats(x, &xs));
        KT_CHECK(xs.segments == 0 && xs.blocks == NP);
        for (uint64_t post = 0; post < 2; post++) {
            kt_cuda_fill(&cu, d, (uint64_t)NB * BS, 13 + post); /* the re-post's bytes land */
            kvl_status_t st = kvl_xfer_post(x);
            KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
            KT_OK(kvl_xfer_wait(x, 60000));
        }
        KT_OK(kvl_xfer_get_stats(x, &xs));
        KT_CHECK(xs.segments == 0 && xs.bytes == (uint64_t)NP * BS);
        printf("  prepared WRITE of %d pairs: backend %s, path %s\n", NP, xs.backend, xs.path);
        KT_CHECK(strcmp(xs.backend, "posix") == 0);
        kvl_xfer_release(x);
        KT_CHECK(cu.MemsetD8(d, 0, LEN) == 0);
        KT_OK(kvl_xfer_create_prepped(a, KVL_READ, pv2, li, pf2, fi, NP, NULL, &x));
        kvl_status_t st = kvl_xfer_post(x);
        KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
        KT_OK(kvl_xfer_wait(x, 60000));
        kvl_xfer_release(x);
        KT_CHECK(kt_cuda_verify(&cu, d, (uint64_t)NP * BS, 14) == -1);
        KT_CHECK(pread(rfd, h, BS, (off_t)(LEN + (uint64_t)(7 * 101 % NB) * BS)) == BS);
        kt_fill(want, (uint64_t)NB * BS, 14);
        KT_CHECK(memcmp(h, want + 7 * BS, BS) == 0);
        kvl_prep_release(pv2);
        kvl_prep_release(pf2);
        kvl_dlist_destroy(lv);
        kvl_dlist_destroy(lf);
    }

    /* 3. a READ past the end of the file: refused before anything moves */
    KT_CHECK(ftruncate(fd, 4096) == 0);
    KT_STATUS(move(a, KVL_READ, d, &z, &z, 1, LEN, fd), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("short file");

    kvl_mem_desc_t dr[2] = {dv, df};
    KT_OK(kvl_mem_deregister(a, &dr[0], 1));
    KT_OK(kvl_mem_deregister(a, &dr[1], 1));
    kvl_agent_destroy(a);
    cu.MemFree(d);
    close(rfd);
    close(fd);
    free(h), free(want), free(doff), free(foff);
    printf("VRAM <-> file%s: ok\n", direct ? " (O_DIRECT)" : "");
}

int main(void)
{
    char why[512];
    if (kt_cuda_open(&cu, why, sizeof(why)) != 0)
        KT_SKIP("%s", why);
    if (kvl_backend_available("cuda", why, sizeof(why)) != KVL_OK)
        KT_SKIP("cuda backend (the staging copies) not available: %s", why);
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/kvl-posix-vram-XXXXXX", t && t[0] ? t : "/tmp");
    if (mkdtemp(dir) == NULL)
        KT_SKIP("cannot make a temp dir: %s", strerror(errno));
    run(0);
    run(1);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("PASS\n");
    return 0;
}
