/*
 * Registering memory (src/core/registration.c): every refusal with its
 * reason, kind and device checks, candidate backends and policies with each
 * backend's outcome, reference counts, all-or-nothing lists and the report
 * that tells what happened to each entry, deregistration guards.
 */
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

#define HAS(...)                                     \
    do {                                             \
        char want_[512];                             \
        snprintf(want_, sizeof(want_), __VA_ARGS__); \
        KT_ERROR_HAS(want_);                         \
    } while (0)
#define ULL(x) ((unsigned long long)(x))

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM), VRAM = KVL_MEM_BIT(KVL_MEM_VRAM);
static uint8_t *g_buf; /* 1 MiB of mapped memory */
static uint64_t B;

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static int registered(kvl_agent_t *a, uint64_t addr, uint64_t len)
{
    pthread_mutex_lock(&a->lock);
    kvli_region_t *r = kvli_registry_exact(a, addr, len);
    pthread_mutex_unlock(&a->lock);
    return r ? (int)r->refcount : 0;
}

static void test_bad_input(void)
{
    kvl_agent_t *a = bare("strict");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    kvl_reg_report_t *rep = (kvl_reg_report_t *)&rep;
    kvl_mem_desc_t d = {B, 4096, KVL_DEV_ANY};

    KT_STATUS(kvl_mem_register(NULL, &d, 1, NULL, &rep), KVL_ERR_INVALID_ARG);
    KT_CHECK(rep == NULL);
    KT_ERROR_HAS("kvl_mem_register: agent is NULL");
    KT_ERROR_HAS("fix: pass an agent and at least one region");
    KT_STATUS(kvl_mem_register(a, &d, 0, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_register: no regions (n = 0)");
    KT_STATUS(kvl_mem_register(a, NULL, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_register: regions is NULL");

    static const struct {
        kvl_mem_desc_t d;
        const char *what;
    } bad[] = {
        {{0, 64, KVL_DEV_ANY}, "address is NULL"},
        {{0x1000, 0, KVL_DEV_ANY}, "length is 0"},
        {{UINT64_MAX - 7, 8, KVL_DEV_ANY}, "addr + len wraps past 2^64"},
    };
    for (size_t i = 0; i < 3; i++) {
        KT_STATUS(kvl_mem_register(a, &bad[i].d, 1, NULL, &rep), KVL_ERR_INVALID_ARG);
        KT_ERROR_HAS(bad[i].what);
        KT_ERROR_HAS("fix: pass the start address and byte length of the buffer");
        HAS("where: region 0x%llx+%llu", ULL(bad[i].d.addr), ULL(bad[i].d.len));
        KT_CHECK(rep->n_entries == 1 && rep->entries[0].status == KVL_ERR_INVALID_ARG);
        /* refused before any backend: the core's reason is the one outcome */
        KT_CHECK(rep->entries[0].addr == bad[i].d.addr && rep->entries[0].n_outcomes == 1);
        KT_CHECK(strcmp(rep->entries[0].outcomes[0].backend, "core") == 0 &&
                 strstr(rep->entries[0].outcomes[0].detail, bad[i].what) != NULL);
        kvl_reg_report_free(rep);
    }
    kvl_reg_params_t p = {.field_mask = KVL_REG_PARAM_KIND, .kind = (kvl_mem_kind_t)7};
    KT_STATUS(kvl_mem_register(a, &d, 1, &p, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("memory kind 7 or policy 0 is not valid");
    p = (kvl_reg_params_t){.field_mask = KVL_REG_PARAM_POLICY, .policy = (kvl_reg_policy_t)5};
    KT_STATUS(kvl_mem_register(a, &d, 1, &p, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("memory kind 0 or policy 5 is not valid");
    /* FILE: the device is the file descriptor; a range with none is refused,
     * and with no backend serving FILE the causes say which serve what */
    p = (kvl_reg_params_t){.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_FILE};
    KT_STATUS(kvl_mem_register(a, &d, 1, &p, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("which is not a file descriptor kvlane can hold");
    int nullfd = open("/dev/null", O_RDONLY);
    KT_CHECK(nullfd >= 0);
    kvl_mem_desc_t fd0 = {0, 4096, nullfd};
    KT_STATUS(kvl_mem_register(a, &fd0, 1, &p, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("no backend created on agent 'strict' serves FILE memory");
    close(nullfd);
    /* a field whose bit is not set is not read */
    p = (kvl_reg_params_t){.field_mask = 0, .kind = KVL_MEM_FILE, .policy = (kvl_reg_policy_t)5};
    KT_OK(kvl_mem_register(a, &d, 1, &p, NULL));
    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_CHECK(s.regs == 1 && s.deregs == 1);
    kvl_agent_destroy(a);
}

/* Host memory must be mapped, on a NUMA node this host has. */
static void test_host_memory(void)
{
    kvl_agent_t *a = bare("hostmem");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, (size_t)pg * 3, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    KT_CHECK(m != MAP_FAILED && munmap(m + pg, (size_t)pg) == 0); /* a hole */
    uint64_t base = (uint64_t)(uintptr_t)m;

    kvl_mem_desc_t d = {base + 100, (uint64_t)pg, KVL_DEV_ANY}; /* runs into the hole */
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_INVALID_ARG);
    HAS("0x%llx+%llu: the range is not (fully) mapped in this process", ULL(base + 100),
        ULL(pg));
    KT_CHECK(kvl_last_error()->sys_errno == ENOMEM);
    KT_ERROR_HAS("a GPU pointer needs the cuda backend");
    d.len = (uint64_t)pg - 100; /* unaligned start, ends at the hole: fine */
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    KT_CHECK(registered(a, d.addr, d.len) == 1);

    kvl_mem_desc_t n = {base + 2 * (uint64_t)pg, 64, 4096};
    KT_STATUS(kvl_mem_register(a, &n, 1, NULL, NULL), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("declared device 4096 for DRAM, but this host has no NUMA node 4096");
    KT_CHECK(kvl_last_error()->device == 4096);
    n.dev = -5;
    KT_STATUS(kvl_mem_register(a, &n, 1, NULL, NULL), KVL_ERR_DEVICE_MISMATCH);
    KT_ERROR_HAS("declared device -5 for DRAM");
    n.dev = 0;
    KT_OK(kvl_mem_register(a, &n, 1, NULL, NULL));
    pthread_mutex_lock(&a->lock);
    kvli_region_t *r = kvli_registry_exact(a, n.addr, n.len);
    pthread_mutex_unlock(&a->lock);
    KT_CHECK(r && r->kind == KVL_MEM_DRAM && r->dev == 0 && r->bk_mask == 1 && r->shm_id == 0);

    /* declared VRAM on host memory: nothing recognises it as such */
    char reason[512];
    if (kvl_backend_available("cuda", reason, sizeof(reason)) != KVL_OK) {
        kvl_reg_params_t vr = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_VRAM};
        kvl_mem_desc_t v = {B, 4096, KVL_DEV_ANY};
        KT_STATUS(kvl_mem_register(a, &v, 1, &vr, NULL), KVL_ERR_NO_BACKEND);
        KT_ERROR_HAS("VRAM memory declared, but no backend created on this agent can recognise "
                     "it (created: s1)");
        KT_ERROR_HAS(reason); /* the cuda backend's reason, as a cause */
    }
    kvl_agent_destroy(a);
    KT_CHECK(s.regs == 2 && s.deregs == 2);
    munmap(m, (size_t)pg);
    munmap(m + 2 * pg, (size_t)pg);
}

static void test_candidates(void)
{
    kvl_agent_t *a = bare("chooser");
    kvl_mem_desc_t d = {B, 4096, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("no backend created on agent 'chooser' serves DRAM memory");
    KT_ERROR_HAS("fix: create a backend that serves DRAM (kvl_backend_create)");
    kt_stub_t v, s;
    kt_stub_attach(a, &v, "vr", VRAM, VRAM, 0);
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("cause 1: [vr] KVL_ERR_UNSUPPORTED: serves VRAM locally");
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);

    /* naming backends: they must exist; one that cannot serve the kind says so */
    const char *names[2] = {"tcp", NULL};
    kvl_reg_params_t p = {.field_mask = KVL_REG_PARAM_BACKENDS, .backends = names,
                          .n_backends = 1};
    KT_STATUS(kvl_mem_register(a, &d, 1, &p, NULL), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("backend 'tcp' named for registration is not created on agent 'chooser'");
    names[0] = NULL;
    KT_STATUS(kvl_mem_register(a, &d, 1, &p, NULL), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("backend '(null)' named for registration");
    names[0] = "vr";
    kvl_reg_report_t *rep;
    KT_STATUS(kvl_mem_register(a, &d, 1, &p, &rep), KVL_ERR_NO_BACKEND);
    HAS("no backend accepted DRAM region 0x%llx+4096", ULL(B));
    KT_CHECK(rep->entries[0].n_outcomes == 1);
    KT_CHECK(strcmp(rep->entries[0].outcomes[0].detail, "backend vr does not serve DRAM memory") == 0);
    kvl_reg_report_free(rep);
    /* named with n_backends 0: every backend serving the kind */
    p.n_backends = 0;
    KT_OK(kvl_mem_register(a, &d, 1, &p, NULL));
    KT_CHECK(v.regs == 0 && s.regs == 1);
    kvl_agent_destroy(a);
}

static void test_policies_and_report(void)
{
    kvl_agent_t *a = bare("policy");
    kt_stub_t s1, s2;
    kt_stub_attach(a, &s1, "s1", DRAM, DRAM, 0);
    kt_stub_attach(a, &s2, "s2", DRAM, DRAM, 0);
    s2.reg_status = KVL_ERR_PERMISSION;
    kvl_mem_desc_t d = {B, 4096, KVL_DEV_ANY};
    kvl_reg_report_t *rep;
    char out[2048], want[2048];

    /* any: one acceptance is enough; the report has both outcomes */
    KT_OK(kvl_mem_register(a, &d, 1, NULL, &rep));
    snprintf(want, sizeof(want),
             "registration report: 1 region(s)\n"
             "  [0] 0x%llx+4096 DRAM dev 0: registered\n"
             "      s1     ok     stub-path\n"
             "      s2     FAIL   stub s2: mem_reg refused\n", ULL(B));
    size_t need = kvl_reg_report_render(rep, out, sizeof(out));
    KT_CHECK(strcmp(out, want) == 0 && need == strlen(want));
    KT_CHECK(rep->entries[0].outcomes[1].status == KVL_ERR_PERMISSION);
    kvl_reg_report_free(rep);
    KT_CHECK(kvl_reg_report_render(NULL, out, sizeof(out)) == 0 && out[0] == '\0');
    kvl_mem_info_t info;
    KT_OK(kvl_mem_query(a, B, 4096, &info));
    KT_CHECK(strcmp(info.backends, "s1") == 0);
    KT_OK(kvl_mem_deregister(a, &d, 1));

    /* all: one refusal undoes the acceptance */
    kvl_reg_params_t all = {.field_mask = KVL_REG_PARAM_POLICY, .policy = KVL_REG_ALL};
    KT_STATUS(kvl_mem_register(a, &d, 1, &all, NULL), KVL_ERR_NO_BACKEND);
    HAS("policy 'all': 1 of 2 backends refused DRAM region 0x%llx+4096 (the 1 that accepted "
        "were undone)", ULL(B));
    KT_ERROR_HAS("cause 1: [s2] KVL_ERR_PERMISSION: stub s2: mem_reg refused");
    KT_ERROR_HAS("fix: each backend's reason is listed as a cause");
    KT_CHECK(strcmp(kvl_last_error()->backend, "s2") == 0); /* the only cause, lifted */
    KT_CHECK(s1.regs == 2 && s1.deregs == 2 && registered(a, B, 4096) == 0);

    /* nobody: every reason */
    s1.reg_status = KVL_ERR_NO_MEMORY;
    KT_STATUS(kvl_mem_register(a, &d, 1, NULL, NULL), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("cause 1: [s1] KVL_ERR_NO_MEMORY");
    KT_ERROR_HAS("cause 2: [s2] KVL_ERR_PERMISSION");
    KT_CHECK(kvl_last_error()->backend[0] == '\0' && kvl_last_error()->n_causes == 2);
    kvl_agent_destroy(a);
}

/* The same range again is a reference, not a second registration. */
static void test_refcount(void)
{
    kvl_agent_t *a = bare("counter");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    kvl_mem_desc_t d = {B, 4096, KVL_DEV_ANY}, d0 = {B, 4096, 0};
    kvl_reg_report_t *rep;
    uint64_t gen = atomic_load(&a->generation);
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    KT_OK(kvl_mem_register(a, &d0, 1, NULL, &rep));
    KT_CHECK(rep->entries[0].reused == 1 && rep->entries[0].n_outcomes == 1);
    KT_CHECK(strcmp(rep->entries[0].outcomes[0].detail, "already registered (refcount 2)") == 0);
    char out[512];
    kvl_reg_report_render(rep, out, sizeof(out));
    KT_CHECK(strstr(out, "DRAM dev 0: registered (reused)\n") != NULL);
    kvl_reg_report_free(rep);
    KT_CHECK(s.regs == 1 && registered(a, B, 4096) == 2);
    KT_CHECK(atomic_load(&a->generation) == gen + 2); /* once per call */

    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_CHECK(registered(a, B, 4096) == 1 && s.deregs == 0);
    KT_OK(kvl_mem_deregister(a, &d, 1));
    KT_CHECK(registered(a, B, 4096) == 0 && s.deregs == 1);
    kvl_agent_destroy(a);
}

/*
 * A list is all or nothing: entry 2 fails, so 0 and 1 are undone (a range
 * registered before the call keeps its earlier reference) and 3 is never
 * tried. The report says so for each.
 */
static void test_all_or_nothing(void)
{
    kvl_agent_t *a = bare("atomic");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    kvl_mem_desc_t pre = {B + 4096, 4096, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &pre, 1, NULL, NULL));
    uint64_t gen = atomic_load(&a->generation);
    kvl_mem_desc_t d[4] = {{B, 4096, KVL_DEV_ANY}, pre, {0, 64, KVL_DEV_ANY},
                           {B + 8192, 4096, 0}};
    kvl_reg_report_t *rep;
    KT_STATUS(kvl_mem_register(a, d, 4, NULL, &rep), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("region 2 of 4 (0x0+64): address is NULL; regions 0..1 were undone");
    KT_CHECK(registered(a, B, 4096) == 0 && registered(a, pre.addr, 4096) == 1);
    KT_CHECK(registered(a, B + 8192, 4096) == 0);
    KT_CHECK(s.regs == 2 && s.deregs == 1 && atomic_load(&a->generation) == gen);

    KT_CHECK(rep->n_entries == 4);
    KT_CHECK(rep->entries[0].status == KVL_ERR_CANCELED && rep->entries[1].status == KVL_ERR_CANCELED);
    KT_CHECK(rep->entries[2].status == KVL_ERR_INVALID_ARG);
    KT_CHECK(rep->entries[3].status == KVL_ERR_CANCELED && rep->entries[3].n_outcomes == 0);
    KT_CHECK(rep->entries[3].addr == B + 8192 && rep->entries[3].len == 4096);
    char out[2048], want[2048];
    snprintf(want, sizeof(want),
             "registration report: 4 region(s), nothing registered by this call (all or "
             "nothing)\n"
             "  [0] 0x%llx+4096 DRAM dev 0: undone: entry 2 failed\n"
             "      s1     undone stub-path\n"
             "  [1] 0x%llx+4096 DRAM dev 0: undone: entry 2 failed (reused: registered "
             "before, it stays)\n"
             "      s1     undone already registered (refcount 2)\n"
             "  [2] 0x0+64 AUTO dev -1: KVL_ERR_INVALID_ARG\n"
             "      core   FAIL   address is NULL\n"
             "  [3] 0x%llx+4096 AUTO dev 0: not tried: entry 2 failed\n",
             ULL(B), ULL(B + 4096), ULL(B + 8192));
    kvl_reg_report_render(rep, out, sizeof(out));
    if (strcmp(out, want) != 0)
        fprintf(stderr, "report:\n%s\nwanted:\n%s", out, want);
    KT_CHECK(strcmp(out, want) == 0);
    kvl_reg_report_free(rep);

    /* the first entry failing */
    KT_STATUS(kvl_mem_register(a, &d[2], 2, NULL, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("region 0 of 2 (0x0+64): address is NULL");
    KT_CHECK(strstr(kvl_last_error()->what, "undone") == NULL);
    kvl_agent_destroy(a);
}

static int g_changed;
static void on_changed(kvl_agent_t *a)
{
    KT_CHECK(strcmp(a->name, "dropper") == 0);
    g_changed++;
}
static const kvli_agent_hooks_t g_hooks = {NULL, on_changed};

static void test_deregister(void)
{
    kvl_agent_t *a = bare("dropper");
    kt_stub_t s;
    kt_stub_attach(a, &s, "s1", DRAM, DRAM, 0);
    pthread_mutex_lock(&a->lock);
    a->hooks = &g_hooks;
    pthread_mutex_unlock(&a->lock);
    kvl_mem_desc_t d[2] = {{B, 4096, KVL_DEV_ANY}, {B + 4096, 4096, KVL_DEV_ANY}};

    KT_STATUS(kvl_mem_deregister(a, d, 1), KVL_ERR_NOT_FOUND);
    HAS("deregister: region 0 (0x%llx+4096) is not registered on agent 'dropper'", ULL(B));
    KT_ERROR_HAS("fix: nothing is registered on this agent (already deregistered?)");
    KT_STATUS(kvl_mem_deregister(a, NULL, 1), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_deregister: agent or regions is NULL, or n = 0");
    KT_STATUS(kvl_mem_deregister(a, d, 0), KVL_ERR_INVALID_ARG);

    KT_OK(kvl_mem_register(a, d, 2, NULL, NULL));
    uint64_t gen = atomic_load(&a->generation);
    kvl_mem_desc_t off = {B + 16, 4096, KVL_DEV_ANY};
    KT_STATUS(kvl_mem_deregister(a, &off, 1), KVL_ERR_NOT_FOUND);
    HAS("nearest registered region: 0x%llx+4096", ULL(B));
    /* the same range twice in one call, registered once: nothing dropped */
    kvl_mem_desc_t twice[3] = {d[1], d[0], d[0]};
    KT_STATUS(kvl_mem_deregister(a, twice, 3), KVL_ERR_NOT_FOUND);
    HAS("deregister: region 0x%llx+4096 is registered 1 time(s) but this call drops it 2 times",
        ULL(B));
    KT_CHECK(registered(a, B, 4096) == 1 && registered(a, B + 4096, 4096) == 1);

    /* in use by a posted transfer: refused, unless a reference remains */
    pthread_mutex_lock(&a->lock);
    kvli_region_t *r = kvli_registry_exact(a, B, 4096);
    pthread_mutex_unlock(&a->lock);
    atomic_fetch_add(&r->inflight, 1);
    KT_STATUS(kvl_mem_deregister(a, d, 1), KVL_ERR_IN_USE);
    HAS("deregister: region 0x%llx+4096 is in use by 1 in-flight transfer(s) of this agent",
        ULL(B));
    KT_ERROR_HAS("fix: wait for the transfers (kvl_xfer_wait) or cancel them, then deregister");
    KT_OK(kvl_mem_register(a, d, 1, NULL, NULL));
    KT_OK(kvl_mem_deregister(a, d, 1)); /* 2 -> 1: allowed while in use */
    atomic_fetch_sub(&r->inflight, 1);
    KT_CHECK(g_changed == 1 && atomic_load(&a->generation) == gen + 2);

    KT_OK(kvl_mem_deregister(a, d, 2));
    KT_CHECK(registered(a, B, 4096) == 0 && registered(a, B + 4096, 4096) == 0);
    KT_CHECK(s.regs == 2 && s.deregs == 2 && g_changed == 2);
    kvl_agent_destroy(a);
}

int main(void)
{
    g_buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(g_buf != MAP_FAILED);
    B = (uint64_t)(uintptr_t)g_buf;
    test_bad_input();
    test_host_memory();
    test_candidates();
    test_policies_and_report();
    test_refcount();
    test_all_or_nothing();
    test_deregister();
    munmap(g_buf, 1 << 20);
    printf("test_registration: passed\n");
    return 0;
}
