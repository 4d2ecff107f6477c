/*
 * VRAM over the tcp backend, staged through pinned host buffers (skips with
 * 77 and the reason without a driver or GPU). Two processes; the initiator
 * creates the tcp backend only (the cuda backend's copies are lent through
 * the core), the target tcp and cuda. Covers:
 *   - registration: VRAM accepted by tcp, the report says it is staged;
 *   - WRITE local VRAM -> remote VRAM (64 MiB), notification after the data;
 *   - READ remote VRAM -> local VRAM;
 *   - 2048 scattered 16 KiB blocks both ways (the target checks every byte
 *     in and between the blocks);
 *   - VRAM -> remote plain DRAM (malloc) and plain DRAM -> remote VRAM;
 *   - the transfer's path says it was staged;
 *   - with cuda created too (after tcp), VRAM -> VRAM picks CUDA IPC, and
 *     asking for tcp still stages.
 *
 * CUDA is not fork-safe: the parent never touches it.
 * KVL_TEST_LABELS: gpu nosan tcp
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "gpu/kvl_cuda_test.h"

/* test_ucx_vram.c builds this file again for the ucx backend */
#ifndef KVL_VRAM_BK
#define KVL_VRAM_BK "tcp"
/* the path of host memory -> remote VRAM: tcp stages on the target only */
#define KVL_VRAM_DRAM_PATH "socket"
#endif

#define MB (1ull << 20)
#define LEN (64 * MB)
#define BS (16384ull)
#define NBLK 2048ull

static kt_cuda_t cu;

static char *rcv(int fd, uint64_t *len_p)
{
    uint64_t len;
    char *b = kt_recv_msg(fd, &len, -1);
    KT_CHECK(b != NULL);
    if (len_p)
        *len_p = len;
    return b;
}

static kvl_agent_t *mk_agent(const char *name, const char *backends)
{
    char why[256];
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = backends, .timeout_ms = 10000};
    kvl_agent_t *a;
    if (kt_cuda_open(&cu, why, sizeof(why)) != 0)
        KT_SKIP("%s", why);
    if (kvl_backend_available(KVL_VRAM_BK, why, sizeof(why)) != KVL_OK)
        KT_SKIP("%s backend not available: %s", KVL_VRAM_BK, why);
    /* ucx stages VRAM only when UCX cannot map it itself */
    if (strcmp(KVL_VRAM_BK, "ucx") == 0 && strstr(why, "no GPU memory") == NULL)
        KT_SKIP("this UCX maps GPU memory itself (%s): nothing to stage", why);
    KT_OK(kvl_agent_create(name, &cfg, &a));
    return a;
}

/* Register on the backend under test; VRAM must be accepted as staged. */
static void reg(kvl_agent_t *a, uint64_t addr, uint64_t len, kvl_mem_kind_t kind, int32_t dev)
{
    kvl_reg_params_t p = {.field_mask = KVL_REG_PARAM_KIND, .kind = kind};
    kvl_mem_desc_t d = {addr, len, dev};
    kvl_reg_report_t *rep = NULL;
    char text[4096];
    kvl_status_t st = kvl_mem_register(a, &d, 1, &p, &rep);
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    KT_OK(st);
    KT_CHECK(rep->n_entries == 1 && rep->entries[0].n_outcomes >= 1);
    for (unsigned k = 0; k < rep->entries[0].n_outcomes && kind == KVL_MEM_VRAM; k++)
        if (strcmp(rep->entries[0].outcomes[k].backend, KVL_VRAM_BK) == 0)
            KT_CHECK(strstr(rep->entries[0].outcomes[k].detail, "staged") != NULL);
    kvl_reg_report_free(rep);
}

static unsigned char *host_image(uint64_t len, uint64_t seed)
{
    unsigned char *h = malloc(len);
    KT_CHECK(h != NULL);
    kt_fill(h, len, seed);
    return h;
}

/* Expected content: base seed, with every other BS block from `over`
 * (the scattered pattern) when scattered, else all of `over`. */
static long check(const unsigned char *got, uint64_t base, uint64_t over, int scattered)
{
    unsigned char *a = host_image(LEN, base), *b = host_image(LEN, over);
    long bad = -1;
    for (uint64_t k = 0; k < NBLK && scattered; k++)
        memcpy(a + 2 * k * BS, b + 2 * k * BS, BS);
    const unsigned char *want = scattered ? a : b;
    for (uint64_t i = 0; i < LEN && bad < 0; i++)
        if (got[i] != want[i])
            bad = (long)i;
    free(a);
    free(b);
    return bad;
}

static long dev_check(kt_cu_ptr d, uint64_t base, uint64_t over, int scattered)
{
    unsigned char *h = malloc(LEN);
    KT_CHECK(cu.MemcpyDtoH(h, d, LEN) == 0);
    long bad = check(h, base, over, scattered);
    free(h);
    return bad;
}

/* ---- target: VRAM and plain DRAM; checks on command ---- */
static void target(int fd)
{
    kvl_agent_t *a = mk_agent("tgt", KVL_VRAM_BK ",cuda");
    kt_cu_ptr d;
    unsigned char *host = malloc(LEN);
    KT_CHECK(cu.MemAlloc(&d, LEN) == 0 && host != NULL);
    kt_cuda_fill(&cu, d, LEN, 1);
    kt_fill(host, LEN, 1);
    reg(a, d, LEN, KVL_MEM_VRAM, 0);
    reg(a, (uint64_t)(uintptr_t)host, LEN, KVL_MEM_DRAM, KVL_DEV_ANY);
    void *blob;
    size_t bl;
    KT_OK(kvl_metadata_get(a, &blob, &bl));
    kt_send_msg(fd, blob, bl);
    kvl_free(blob);
    for (;;) {
        /* "<V|D> <base> <over> <scattered> <notif|->" or "bye" */
        char *cmd = rcv(fd, NULL), kind, notif[64], res[200] = "ok";
        unsigned base, over;
        int sc;
        if (strcmp(cmd, "bye") == 0) {
            free(cmd);
            break;
        }
        KT_CHECK(sscanf(cmd, "%c %u %u %d %63s", &kind, &base, &over, &sc, notif) == 5);
        if (strcmp(notif, "-") != 0) {
            kvl_notif_t nt;
            size_t got = 0;
            if (kvl_notif_wait(a, 10000) == KVL_OK)
                KT_OK(kvl_notif_poll(a, &nt, 1, &got));
            if (got == 0)
                snprintf(res, sizeof(res), "no notification");
            else {
                if (nt.len != strlen(notif) || memcmp(nt.msg, notif, nt.len) != 0)
                    snprintf(res, sizeof(res), "wrong notification");
                kvl_notif_free(&nt);
            }
        }
        if (strcmp(res, "ok") == 0) {
            long bad = kind == 'V' ? dev_check(d, base, over, sc) : check(host, base, over, sc);
            if (bad >= 0)
                snprintf(res, sizeof(res), "%s byte %ld wrong", kind == 'V' ? "VRAM" : "DRAM", bad);
        }
        if (kind == 'V')
            kt_cuda_fill(&cu, d, LEN, 1); /* reset for the next case */
        else
            kt_fill(host, LEN, 1);
        kt_send_msg(fd, res, strlen(res));
        free(cmd);
    }
    kvl_agent_destroy(a);
    KT_CHECK(cu.MemFree(d) == 0);
    free(host);
    exit(0);
}

static void ask(int fd, const char *cmd)
{
    kt_send_msg(fd, cmd, strlen(cmd));
    char *res = rcv(fd, NULL);
    if (strcmp(res, "ok") != 0)
        fprintf(stderr, "target after '%s': %s\n", cmd, res);
    KT_CHECK(strcmp(res, "ok") == 0);
    free(res);
}

static void run_bk(kvl_agent_t *a, kvl_xfer_op_t op, kvl_dlist_t *l, kvl_dlist_t *r,
                   const char *notif, const char *what, const char *backend, const char *want_path)
{
    kvl_xfer_params_t p = {0};
    kvl_xfer_stats_t s;
    kvl_xfer_t *x;
    if (notif) {
        p.field_mask = KVL_XFER_PARAM_NOTIF;
        p.notif = notif;
        p.notif_len = strlen(notif);
    }
    if (backend) {
        p.field_mask |= KVL_XFER_PARAM_BACKEND;
        p.backend = backend;
    }
    KT_OK(kvl_xfer_create(a, op, l, "tgt", r, &p, &x));
    kvl_status_t st = kvl_xfer_post(x);
    KT_CHECK(st == KVL_OK || st == KVL_IN_PROGRESS);
    KT_OK(kvl_xfer_wait(x, 30000));
    KT_OK(kvl_xfer_get_stats(x, &s));
    printf("  %-34s %6.1f MiB %5llu blocks  path '%s'  %.2f ms\n", what, (double)s.bytes / MB,
           (unsigned long long)s.blocks, s.path, (double)s.duration_ns / 1e6);
    KT_CHECK(strstr(s.path, want_path) != NULL);
    kvl_xfer_release(x);
}

static void run(kvl_agent_t *a, kvl_xfer_op_t op, kvl_dlist_t *l, kvl_dlist_t *r,
                const char *notif, const char *what, int want_staged)
{
    run_bk(a, op, l, r, notif, what, NULL, want_staged ? "staged" : KVL_VRAM_DRAM_PATH);
}

static kvl_dlist_t *list(kvl_mem_kind_t kind, uint64_t addr, int scattered)
{
    kvl_dlist_t *l;
    KT_OK(kvl_dlist_create(kind, 1, &l));
    if (scattered)
        KT_OK(kvl_dlist_add_strided(l, addr, 2 * BS, NBLK, BS, kind == KVL_MEM_VRAM ? 0 : KVL_DEV_ANY));
    else
        KT_OK(kvl_dlist_add(l, addr, LEN, kind == KVL_MEM_VRAM ? 0 : KVL_DEV_ANY));
    return l;
}

static void initiator(int fd)
{
    kvl_agent_t *a = mk_agent("ini", KVL_VRAM_BK);
    uint64_t bl;
    char *blob = rcv(fd, &bl), name[64];
    KT_OK(kvl_metadata_load(a, blob, bl, name, sizeof(name)));
    char *blob2 = blob; /* loaded again by a second agent at the end */
    uint64_t bl2 = bl;
    kvl_mem_desc_t rr[4];
    size_t nr = 0;
    kvl_mem_kind_t rk[4];
    KT_OK(kvl_remote_regions(a, "tgt", rr, rk, 4, &nr));
    KT_CHECK(nr == 2);
    uint64_t rv = rk[0] == KVL_MEM_VRAM ? rr[0].addr : rr[1].addr;
    uint64_t rd = rk[0] == KVL_MEM_VRAM ? rr[1].addr : rr[0].addr;

    kt_cu_ptr d;
    unsigned char *host = malloc(LEN);
    KT_CHECK(cu.MemAlloc(&d, LEN) == 0 && host != NULL);
    reg(a, d, LEN, KVL_MEM_VRAM, 0);
    reg(a, (uint64_t)(uintptr_t)host, LEN, KVL_MEM_DRAM, KVL_DEV_ANY);

    kvl_dlist_t *lv = list(KVL_MEM_VRAM, d, 0), *lvs = list(KVL_MEM_VRAM, d, 1);
    kvl_dlist_t *rv1 = list(KVL_MEM_VRAM, rv, 0), *rvs = list(KVL_MEM_VRAM, rv, 1);
    kvl_dlist_t *ld = list(KVL_MEM_DRAM, (uint64_t)(uintptr_t)host, 0);
    kvl_dlist_t *rd1 = list(KVL_MEM_DRAM, rd, 0);

    /* WRITE VRAM -> remote VRAM, with a notification */
    kt_cuda_fill(&cu, d, LEN, 2);
    run(a, KVL_WRITE, lv, rv1, "w-vv", "WRITE VRAM -> remote VRAM", 1);
    ask(fd, "V 1 2 0 w-vv");
    /* READ remote VRAM -> local VRAM */
    kt_cuda_fill(&cu, d, LEN, 3);
    run(a, KVL_READ, lv, rv1, NULL, "READ remote VRAM -> VRAM", 1);
    KT_CHECK(dev_check(d, 3, 1, 0) < 0);
    ask(fd, "V 1 1 0 -");
    /* scattered both ways */
    kt_cuda_fill(&cu, d, LEN, 4);
    run(a, KVL_WRITE, lvs, rvs, "w-sc", "WRITE 2048 x 16 KiB scattered", 1);
    ask(fd, "V 1 4 1 w-sc");
    kt_cuda_fill(&cu, d, LEN, 5);
    run(a, KVL_READ, lvs, rvs, NULL, "READ 2048 x 16 KiB scattered", 1);
    KT_CHECK(dev_check(d, 5, 1, 1) < 0);
    ask(fd, "V 1 1 0 -");
    /* VRAM -> remote plain DRAM, plain DRAM -> remote VRAM */
    kt_cuda_fill(&cu, d, LEN, 6);
    run(a, KVL_WRITE, lv, rd1, "w-vd", "WRITE VRAM -> remote DRAM", 1);
    ask(fd, "D 1 6 0 w-vd");
    kt_fill(host, LEN, 7);
    run(a, KVL_WRITE, ld, rv1, "w-dv", "WRITE DRAM -> remote VRAM", 0);
    ask(fd, "V 1 7 0 w-dv");

    /* With the cuda backend created too (after tcp), VRAM -> VRAM on one
     * host goes through CUDA IPC: staging backends come last. Asking for
     * tcp still stages. */
    kvl_agent_t *a2 = mk_agent("ini2", KVL_VRAM_BK ",cuda");
    KT_OK(kvl_metadata_load(a2, blob2, bl2, name, sizeof(name)));
    reg(a2, d, LEN, KVL_MEM_VRAM, 0);
    kt_cuda_fill(&cu, d, LEN, 8);
    run_bk(a2, KVL_WRITE, lv, rv1, "w-ipc", "WRITE VRAM -> VRAM, tcp+cuda", NULL, "cuda");
    ask(fd, "V 1 8 0 w-ipc");
    kt_cuda_fill(&cu, d, LEN, 9);
    run_bk(a2, KVL_WRITE, lv, rv1, "w-tcp", "WRITE VRAM -> VRAM, asks " KVL_VRAM_BK, KVL_VRAM_BK,
           "staged");
    ask(fd, "V 1 9 0 w-tcp");
    kvl_agent_destroy(a2);
    free(blob2);

    kt_send_msg(fd, "bye", 3);
    kvl_dlist_destroy(lv);
    kvl_dlist_destroy(lvs);
    kvl_dlist_destroy(rv1);
    kvl_dlist_destroy(rvs);
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd1);
    kvl_agent_destroy(a);
    KT_CHECK(cu.MemFree(d) == 0);
    free(host);
    exit(0);
}

int main(void)
{
    int sv[2], st, rc = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    KT_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid_t t = fork();
    if (t == 0) {
        alarm(120);
        close(sv[1]);
        target(sv[0]);
    }
    pid_t i = fork();
    if (i == 0) {
        alarm(120);
        close(sv[0]);
        initiator(sv[1]);
    }
    close(sv[0]);
    close(sv[1]);
    for (int k = 0; k < 2; k++) {
        pid_t p = wait(&st);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code == 77) {
            rc = rc ? rc : 77; /* both sides skip before they talk */
        } else if (code != 0) {
            fprintf(stderr, "%s exited with %d\n", p == t ? "target" : "initiator", code);
            if (rc != 1)
                kill(p == t ? i : t, SIGKILL); /* the other may wait for it */
            rc = 1;
        }
    }
    printf("test_%s_vram: %s\n", KVL_VRAM_BK, rc == 0 ? "passed" : rc == 77 ? "skipped" : "FAILED");
    return rc;
}
