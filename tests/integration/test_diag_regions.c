/* Diagnoses about registrations (issue 17, items 2, 3, 4), checked by their
 * text: a descriptor across two adjacent registrations is refused naming
 * both; the same range registered as another kind is a named conflict; an
 * overlap is reported; the report of a failed all-or-nothing registration
 * says which entries were undone and which were not tried; an inaccessible
 * mapping is not registered as DRAM (item 10). */
#include <string.h>
#include <sys/mman.h>
#include "common/kvltest.h"

#define MB (1u << 20)

int main(void)
{
    kvl_agent_t *a = kt_agent("diag", "shm", NULL);
    uint8_t *buf = mmap(NULL, 4 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    uint64_t base = (uint64_t)(uintptr_t)buf;

    /* 2. adjacent registrations, one per "layer" */
    kvl_mem_desc_t two[2] = {{base, MB, KVL_DEV_ANY}, {base + MB, MB, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(a, two, 2, NULL, NULL));
    kvl_dlist_t *dl;
    kvl_prep_t *prep;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &dl));
    KT_OK(kvl_dlist_add(dl, base + MB / 2, MB, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_local(a, dl, &prep), KVL_ERR_OUT_OF_BOUNDS);
    printf("crossing: %s\n  fix: %s\n", kvl_last_error()->what, kvl_last_error()->hint);
    KT_ERROR_HAS("crosses 2 registrations of this agent");
    char want[160];
    snprintf(want, sizeof(want), "0x%llx+%u and goes on into 0x%llx+%u",
             (unsigned long long)base, MB, (unsigned long long)(base + MB), MB);
    KT_ERROR_HAS(want);
    snprintf(want, sizeof(want), "split the descriptor at 0x%llx", (unsigned long long)(base + MB));
    KT_CHECK(strstr(kvl_last_error()->hint, want) != NULL);
    kvl_dlist_destroy(dl);
    /* inside one of them it works */
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &dl));
    KT_OK(kvl_dlist_add(dl, base + MB / 2, MB / 2, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, dl, &prep));
    kvl_prep_release(prep);
    kvl_dlist_destroy(dl);
    /* a gap between registrations stays "outside memory registered" */
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &dl));
    KT_OK(kvl_dlist_add(dl, base + MB + MB / 2, MB, KVL_DEV_ANY));
    KT_STATUS(kvl_prep_local(a, dl, &prep), KVL_ERR_OUT_OF_BOUNDS);
    KT_ERROR_HAS("is outside memory");
    kvl_dlist_destroy(dl);

    /* 3. the same range as another kind: a named conflict */
    kvl_reg_params_t vram = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
    kvl_mem_desc_t d0 = {base, MB, 0};
    KT_STATUS(kvl_mem_register(a, &d0, 1, &vram, NULL), KVL_ERR_DEVICE_MISMATCH);
    printf("conflict: %s\n", kvl_last_error()->what);
    KT_ERROR_HAS("is already registered as DRAM (NUMA node 0) (1 time(s)); it cannot also "
                 "be VRAM on GPU 0");
    /* an overlap of the same kind is accepted and reported */
    kvl_mem_desc_t ov = {base + MB / 2, MB, KVL_DEV_ANY};
    kvl_reg_report_t *rep = NULL;
    KT_OK(kvl_mem_register(a, &ov, 1, NULL, &rep));
    char text[4096];
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    snprintf(want, sizeof(want), "overlaps 0x%llx+%u, registered before",
             (unsigned long long)base, MB);
    KT_CHECK(strstr(text, want) != NULL);
    kvl_reg_report_free(rep);
    KT_OK(kvl_mem_deregister(a, &ov, 1));

    /* 4. a failed registration's report: undone, failed, not tried */
    uint8_t *hole = mmap(NULL, MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(hole != MAP_FAILED);
    munmap(hole, MB); /* an address nothing is mapped at */
    kvl_mem_desc_t four[4] = {{base + 2 * MB, MB / 2, KVL_DEV_ANY},
                              {base + 2 * MB + MB / 2, MB / 2, KVL_DEV_ANY},
                              {(uint64_t)(uintptr_t)hole, MB, KVL_DEV_ANY},
                              {base + 3 * MB, MB, KVL_DEV_ANY}};
    rep = NULL;
    kvl_status_t st = kvl_mem_register(a, four, 4, NULL, &rep);
    KT_CHECK(st != KVL_OK && rep != NULL);
    KT_ERROR_HAS("regions 0..1 were undone");
    kvl_reg_report_render(rep, text, sizeof(text));
    printf("%s", text);
    KT_CHECK(strstr(text, "nothing registered by this call (all or nothing)") != NULL);
    KT_CHECK(strstr(text, "[0] ") != NULL && strstr(text, "undone: entry 2 failed") != NULL);
    KT_CHECK(strstr(text, "registered\n") == NULL);       /* nothing claims to be */
    KT_CHECK(strstr(text, "core   FAIL") != NULL);        /* entry 2 says why */
    KT_CHECK(strstr(text, " ok ") == NULL);               /* no backend claims "ok" */
    snprintf(want, sizeof(want), "[3] 0x%llx+%u AUTO dev -1: not tried: entry 2 failed",
             (unsigned long long)(base + 3 * MB), MB);
    KT_CHECK(strstr(text, want) != NULL);
    kvl_reg_report_free(rep);
    /* and indeed nothing of it stayed registered */
    kvl_mem_desc_t again = four[0];
    KT_STATUS(kvl_mem_deregister(a, &again, 1), KVL_ERR_NOT_FOUND);

    /* 10. an inaccessible mapping (what a freed GPU allocation leaves) is not DRAM */
    uint8_t *none = mmap(NULL, MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(none != MAP_FAILED);
    kvl_mem_desc_t nd = {(uint64_t)(uintptr_t)none, MB, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, &nd, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    printf("inaccessible: %s\n", kvl_last_error()->what);
    KT_ERROR_HAS("is mapped in this process but");
    KT_ERROR_HAS("cannot be read (an inaccessible mapping: a freed GPU allocation's reserved "
                 "range, or a guard region)");
    munmap(none, MB);

    KT_OK(kvl_mem_deregister(a, two, 2));
    kvl_agent_destroy(a);
    munmap(buf, 4 * MB);
    printf("ok\n");
    return 0;
}
