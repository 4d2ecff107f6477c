/*
 * Bad input gets a clear error and changes nothing: NULL, zero-length and
 * overflowing ranges, unmapped memory, wrong declared devices, unknown
 * agents, double deregistration, deregistration in flight, descriptors
 * outside registered memory (with index and nearest region), corrupted,
 * truncated and stale metadata, all-or-nothing list registration.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common/kvltest.h"

#define BUF (4u << 20)

int main(void)
{
    kvl_agent_t *a = kt_agent("checker", "shm", NULL);
    uint8_t *buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t b = (uint64_t)(uintptr_t)buf;

    /* ---- agent and backend creation ---- */
    kvl_agent_t *bad;
    KT_STATUS(kvl_agent_create("has space", NULL, &bad), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("not valid");
    KT_STATUS(kvl_agent_create("", NULL, &bad), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_agent_create(NULL, NULL, &bad), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_backend_create(a, "nosuch", NULL, 0, NULL), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("no backend named 'nosuch'");
    KT_STATUS(kvl_backend_create(a, "shm", NULL, 0, NULL), KVL_ERR_EXISTS);
    kvl_param_t wrong = {"colour", "blue"};
    kvl_agent_t *b2 = kt_agent("checker2", NULL, NULL);
    KT_STATUS(kvl_backend_create(b2, "shm", &wrong, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("no parameter 'colour'");
    /* no backend: registration says so, naming what exists */
    kvl_mem_desc_t d0 = {b, 4096, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(b2, &d0, 1, NULL, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("no backend created on agent 'checker2' serves DRAM");
    kvl_agent_destroy(b2);

    /* ---- registration ---- */
    kvl_mem_desc_t d = {b, 0, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("length is 0");
    d = (kvl_mem_desc_t){0, 4096, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("address is NULL");
    d = (kvl_mem_desc_t){UINT64_MAX - 100, 4096, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("wraps");
    d = (kvl_mem_desc_t){0x10, 4096, KVL_DEV_ANY}; /* what NIXL accepted silently */
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("not (fully) mapped");
    KT_STATUS(kvl_mem_register(NULL, &d, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_register(a, NULL, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    /* device 12345 for DRAM: refused, naming the device */
    d = (kvl_mem_desc_t){b, 4096, 12345};
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("declared device 12345 for DRAM");
    KT_CHECK(kvl_last_error()->device == 12345);
    /* VRAM declared on host memory without a GPU backend */
    kvl_reg_params_t vp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
    d = (kvl_mem_desc_t){b, 4096, 0};
    KT_STATUS(kvl_mem_register(a, &d, 1, &vp, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("VRAM memory declared");
    /* naming a backend that does not exist */
    const char *names[] = {"tcp"};
    kvl_reg_params_t np = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = names, .n_backends = 1};
    KT_STATUS(kvl_mem_register(a, &d, 1, &np, NULL), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("backend 'tcp' named for registration is not created");

    /* all or nothing: entry 2 is bad, 0 and 1 are undone */
    kvl_mem_desc_t list[3] = {{b, 4096, KVL_DEV_ANY}, {b + 8192, 4096, KVL_DEV_ANY}, {0x10, 64, KVL_DEV_ANY}};
    kvl_reg_report_t *rep;
    KT_STATUS(kvl_mem_register(a, list, 3, NULL, &rep), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("region 2 of 3");
    KT_ERROR_HAS("were undone");
    KT_CHECK(rep != NULL && rep->n_entries == 3 && rep->entries[2].status == KVL_ERR_INVALID_ARG);
    char text[4096];
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    kvl_reg_report_free(rep);
    KT_STATUS(kvl_mem_deregister(a, list, 1), KVL_ERR_NOT_FOUND); /* really undone */

    /* register, re-register (refcount), report */
    d = (kvl_mem_desc_t){b, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    KT_CHECK(rep->entries[0].kind == KVL_MEM_DRAM && rep->entries[0].dev == 0 && !rep->entries[0].reused);
    KT_CHECK(rep->entries[0].n_outcomes == 1 && rep->entries[0].outcomes[0].status == KVL_OK);
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    kvl_reg_report_free(rep);
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    KT_CHECK(rep->entries[0].reused == 1);
    kvl_reg_report_free(rep);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_STATUS(kvl_mem_deregister(a, &d, 1), KVL_ERR_NOT_FOUND); /* double deregister */
    KT_ERROR_HAS("is not registered");
    /* deregistering more references in one call than exist changes nothing */
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    kvl_mem_desc_t twice[2] = {d, d};
    KT_STATUS(kvl_mem_deregister(a, twice, 2), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("drops it 2 times");
    /* overlapping registration is separate and reference counted */
    kvl_mem_desc_t half = {b + 4096, 8192, 0};
    KT_OK(kvl_mem_register(a, &half, 1, NULL, NULL));
    kvl_mem_desc_t wrong_len = {b, 4096, 0};
    KT_STATUS(kvl_mem_deregister(a, &wrong_len, 1), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("nearest registered region");
    KT_OK(kvl_mem_deregister(a, &half, 1));

    /* ---- remote side ---- */
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 4, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 4, &r));
    KT_OK(kvl_dlist_add(l, b, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, 0x1000, 4096, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "nobody", r, NULL, &x), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("remote agent 'nobody' is not loaded");
    KT_STATUS(kvl_notif_send(a, "nobody", "x", 1), KVL_ERR_NOT_FOUND);
    KT_STATUS(kvl_remote_remove(a, "nobody"), KVL_ERR_NOT_FOUND);

    kt_peer_t p;
    kt_peer_opts_t o = {.name = "victim", .len = BUF};
    kt_peer_start(&p, &o, a);

    /* descriptor outside remote memory: index and nearest region named */
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(r, p.base, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, p.base + BUF - 100, 4096, KVL_DEV_ANY));
    kvl_dlist_clear(l);
    KT_OK(kvl_dlist_add(l, b, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(l, b + 8192, 4096, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "victim", r, NULL, &x), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("descriptor 1");
    KT_ERROR_HAS("runs 3996 bytes past its end");
    KT_ERROR_HAS("nearest registered region");
    /* descriptor outside local memory */
    kvl_dlist_clear(r);
    KT_OK(kvl_dlist_add(r, p.base, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, p.base + 8192, 4096, KVL_DEV_ANY));
    kvl_dlist_clear(l);
    KT_OK(kvl_dlist_add(l, b, 4096, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(l, b + BUF + 4096, 4096, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "victim", r, NULL, &x), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("descriptor 1");
    KT_ERROR_HAS("this agent");
    /* wrong device in a descriptor */
    kvl_dlist_clear(l);
    KT_OK(kvl_dlist_add(l, b, 4096, 3));
    KT_OK(kvl_dlist_add(l, b + 8192, 4096, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "victim", r, NULL, &x), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("declares device 3");
    /* wrong kind of list */
    kvl_dlist_t *vl;
    KT_OK(kvl_dlist_create(KVL_MEM_VRAM, 1, &vl));
    KT_OK(kvl_dlist_add(vl, b, 4096, 0));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, vl, "victim", r, NULL, &x), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("list is VRAM");
    kvl_dlist_destroy(vl);
    /* block counts differ */
    kvl_dlist_clear(l);
    KT_OK(kvl_dlist_add(l, b, 4096, KVL_DEV_ANY));
    KT_STATUS(kvl_xfer_create(a, KVL_WRITE, l, "victim", r, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("more blocks");
    /* prepared lists: bad index */
    kvl_prep_t *lp, *rp;
    KT_OK(kvl_prep_local(a, l, &lp));
    KT_OK(kvl_prep_remote(a, "victim", r, &rp));
    int64_t li[1] = {5}, ri[1] = {0};
    KT_STATUS(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 1, NULL, &x), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("local index 0 is 5");
    li[0] = 0;
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, li, rp, ri, 1, NULL, &x));
    KT_STATUS(kvl_xfer_test(x), KVL_ERR_STATE);
    kvl_xfer_state_t cs;
    KT_STATUS(kvl_xfer_cancel(x, &cs), KVL_ERR_STATE);

    /* deregister while a transfer uses the region: refused, then allowed */
    uint8_t *big = mmap(NULL, 64u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    kvl_mem_desc_t bd = {(uint64_t)(uintptr_t)big, 64u << 20, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &bd, 1, NULL, NULL));
    kvl_dlist_t *bl, *br;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &bl));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &br));
    for (int i = 0; i < 64; i++) {
        KT_OK(kvl_dlist_add(bl, bd.addr + (uint64_t)i * (1u << 20), BUF / 4, KVL_DEV_ANY));
        KT_OK(kvl_dlist_add(br, p.base + (uint64_t)(i % 4) * (BUF / 4), BUF / 4, KVL_DEV_ANY));
    }
    kvl_xfer_t *bx;
    KT_OK(kvl_xfer_create(a, KVL_WRITE, bl, "victim", br, NULL, &bx));
    int refused = 0;
    for (int round = 0; round < 20 && !refused; round++) {
        KT_CHECK(kvl_xfer_post(bx) >= 0);
        kvl_status_t st = kvl_mem_deregister(a, &bd, 1);
        if (st == KVL_ERR_IN_USE) {
            KT_ERROR_HAS("in-flight transfer");
            refused = 1;
        } else {
            /* it finished before we asked: register again and retry */
            KT_CHECK(st == KVL_OK);
            KT_OK(kvl_xfer_wait(bx, 10000));
            KT_OK(kvl_mem_register(a, &bd, 1, NULL, NULL));
            kvl_xfer_release(bx);
            KT_OK(kvl_xfer_create(a, KVL_WRITE, bl, "victim", br, NULL, &bx));
        }
        if (refused)
            KT_OK(kvl_xfer_wait(bx, 10000));
    }
    printf("deregister in flight refused: %s\n", refused ? "yes" : "never caught in flight");
    KT_OK(kvl_mem_deregister(a, &bd, 1));
    /* posting a transfer whose memory is gone is a clear error */
    KT_STATUS(kvl_xfer_post(bx), KVL_ERR_STATE);
    KT_ERROR_HAS("was deregistered since");
    kvl_xfer_release(bx);
    kvl_dlist_destroy(bl);
    kvl_dlist_destroy(br);

    /* ---- metadata ---- */
    size_t blen;
    uint8_t *blob = kt_peer_metadata(&p, &blen);
    /* every single-byte flip of a real blob is refused or harmless */
    unsigned ok = 0, refused_md = 0;
    for (size_t i = 0; i < blen; i++) {
        uint8_t *c = malloc(blen);
        memcpy(c, blob, blen);
        c[i] ^= 0x5a;
        kvl_status_t st = kvl_metadata_load(a, c, blen, NULL, 0);
        if (st == KVL_OK)
            ok++;
        else {
            KT_CHECK(st == KVL_ERR_BAD_METADATA);
            refused_md++;
        }
        free(c);
    }
    printf("metadata byte flips: %u refused, %u accepted\n", refused_md, ok);
    KT_CHECK(ok == 0);
    for (size_t l2 = 0; l2 < blen; l2 += 7)
        KT_STATUS(kvl_metadata_load(a, blob, l2, NULL, 0), KVL_ERR_BAD_METADATA);
    KT_STATUS(kvl_metadata_load(a, NULL, 10, NULL, 0), KVL_ERR_BAD_METADATA);
    /* the remote still works after all that */
    KT_CHECK(kvl_remote_check(a, "victim") == KVL_OK);
    kvl_xfer_release(x);
    KT_OK(kvl_xfer_create_prepped(a, KVL_WRITE, lp, NULL, rp, NULL, 1, NULL, &x));
    KT_CHECK(kvl_xfer_post(x) >= 0);
    KT_OK(kvl_xfer_wait(x, 5000));
    kvl_xfer_release(x);
    /* loading the same metadata again is a no-op */
    uint64_t inc = kvl_remote_incarnation(a, "victim");
    KT_OK(kvl_metadata_load(a, blob, blen, NULL, 0));
    KT_CHECK(kvl_remote_incarnation(a, "victim") == inc);

    kvl_prep_release(lp);
    kvl_prep_release(rp);
    free(blob);
    kt_peer_stop(&p);

    /* ---- stale incarnation: a restarted peer under the same name ---- */
    kt_peer_t p1, p2;
    kt_peer_opts_t o1 = {.name = "phoenix", .len = BUF};
    kt_peer_start(&p1, &o1, NULL);
    size_t l1;
    uint8_t *m1 = kt_peer_metadata(&p1, &l1);
    kt_peer_stop(&p1);
    usleep(1000);
    kt_peer_start(&p2, &o1, a);
    KT_CHECK(kvl_remote_incarnation(a, "phoenix") != 0);
    KT_STATUS(kvl_metadata_load(a, m1, l1, NULL, 0), KVL_ERR_STALE);
    KT_ERROR_HAS("stale");
    KT_ERROR_HAS("phoenix");
    free(m1);
    kt_peer_stop(&p2);

    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
    munmap(buf, BUF);
    munmap(big, 64u << 20);
    printf("bad input: all refused clearly\n");
    return 0;
}
