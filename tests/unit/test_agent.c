/* The agent (src/core/agent.c): memory-kind names, creation (names,
 * configuration defaults, the backends list, the secret), hooks, and the
 * ordered teardown with everything still alive. */
#include <string.h>
#include <sys/mman.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

static void test_mem_kinds(void)
{
    static const char *names[] = {"AUTO", "DRAM", "VRAM", "FILE"};
    kvl_mem_kind_t k;
    for (int i = 0; i < 4; i++) {
        KT_CHECK(strcmp(kvl_mem_kind_name((kvl_mem_kind_t)i), names[i]) == 0);
        KT_OK(kvl_mem_kind_parse(names[i], &k));
        KT_CHECK(k == (kvl_mem_kind_t)i);
    }
    KT_CHECK(strcmp(kvl_mem_kind_name((kvl_mem_kind_t)4), "UNKNOWN") == 0);
    KT_CHECK(strcmp(kvl_mem_kind_name((kvl_mem_kind_t)-1), "UNKNOWN") == 0);
    KT_OK(kvl_mem_kind_parse("vram", &k));
    KT_CHECK(k == KVL_MEM_VRAM);
    KT_OK(kvl_mem_kind_parse("DrAm", &k));
    KT_CHECK(k == KVL_MEM_DRAM);
    k = KVL_MEM_FILE;
    KT_STATUS(kvl_mem_kind_parse("GPU", &k), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("'GPU' is not a memory kind");
    KT_ERROR_HAS("fix: use DRAM, VRAM, FILE or AUTO");
    KT_CHECK(k == KVL_MEM_FILE); /* untouched on failure */
    KT_STATUS(kvl_mem_kind_parse("DRAM ", &k), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_kind_parse("UNKNOWN", &k), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_mem_kind_parse(NULL, &k), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("'(null)' is not a memory kind");
    KT_STATUS(kvl_mem_kind_parse("DRAM", NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_mem_kind_parse: kind_p is NULL");
}

static void test_names(void)
{
    kvl_agent_t *a = (kvl_agent_t *)&a;
    char n64[65];
    memset(n64, 'q', 64);
    n64[64] = '\0';
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};

    KT_STATUS(kvl_agent_create(n64, &none, &a), KVL_ERR_INVALID_ARG);
    KT_CHECK(a == NULL);
    KT_ERROR_HAS("is not valid");
    KT_ERROR_HAS("fix: use 1 to 63 printable characters without spaces");
    KT_STATUS(kvl_agent_create("two words", &none, &a), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("agent name 'two words' is not valid");
    KT_STATUS(kvl_agent_create("", &none, &a), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("agent name '' is not valid");
    KT_STATUS(kvl_agent_create(NULL, &none, &a), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("agent name '(null)' is not valid");
    KT_STATUS(kvl_agent_create("fine", &none, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_agent_create: agent_p is NULL");

    n64[63] = '\0';
    KT_OK(kvl_agent_create(n64, &none, &a));
    KT_CHECK(strcmp(kvl_agent_name(a), n64) == 0);
    /* the same name again is another incarnation */
    kvl_agent_t *b;
    KT_OK(kvl_agent_create(n64, &none, &b));
    KT_CHECK(kvl_agent_incarnation(a) != 0 && kvl_agent_incarnation(b) != 0);
    KT_CHECK(kvl_agent_incarnation(a) != kvl_agent_incarnation(b));
    KT_CHECK(a->start_ns > 0 && b->start_ns >= a->start_ns);
    kvl_agent_destroy(a);
    kvl_agent_destroy(b);
    KT_CHECK(kvl_agent_name(NULL) == NULL && kvl_agent_incarnation(NULL) == 0);
    kvl_agent_destroy(NULL);
}

static void test_config(void)
{
    kvl_agent_t *a;
    kvl_backend_t *bks[4];

    /* no configuration: the shm backend, default timeout and workers */
    KT_OK(kvl_agent_create("defaults", NULL, &a));
    KT_CHECK(kvl_agent_backends(a, bks, 4) == 1 && strcmp(kvl_backend_name(bks[0]), "shm") == 0);
    KT_CHECK(a->timeout_ms == 5000 && a->workers == 1 && a->secret == NULL);
    KT_CHECK(atomic_load(&a->generation) == 2); /* 1, +1 for the backend */
    kvl_agent_destroy(a);

    /* fields count only when their bit is set; 0 means the default */
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_TIMEOUT | KVL_AGENT_CFG_WORKERS,
                              .create_backends = "", .timeout_ms = 0, .workers = 0,
                              .secret = "unused"};
    KT_OK(kvl_agent_create("masked", &cfg, &a));
    KT_CHECK(kvl_agent_backends(a, NULL, 0) == 1); /* create_backends ignored: "shm" */
    KT_CHECK(a->timeout_ms == 5000 && a->workers == 1 && a->secret == NULL);
    kvl_agent_destroy(a);

    cfg = (kvl_agent_config_t){.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT |
                                             KVL_AGENT_CFG_WORKERS | KVL_AGENT_CFG_SECRET,
                               .create_backends = " tcp , shm ", .timeout_ms = 1234,
                               .workers = 4, .secret = "s3cret"};
    KT_OK(kvl_agent_create("configured", &cfg, &a));
    KT_CHECK(kvl_agent_backends(a, bks, 4) == 2);
    KT_CHECK(strcmp(kvl_backend_name(bks[0]), "tcp") == 0);
    KT_CHECK(strcmp(kvl_backend_name(bks[1]), "shm") == 0);
    KT_CHECK(a->timeout_ms == 1234 && a->workers == 4);
    KT_CHECK(a->secret_len == 6 && memcmp(a->secret, "s3cret", 6) == 0);
    KT_CHECK((const void *)a->secret != (const void *)cfg.secret); /* a copy */
    /* backends see what the agent was given */
    KT_CHECK(bks[1]->ctx.timeout_ms == 1234 && bks[1]->ctx.workers == 4);
    KT_CHECK(bks[1]->ctx.secret == a->secret && bks[1]->ctx.secret_len == 6);
    KT_CHECK(bks[0]->ctx.incarnation == a->incarnation);
    KT_CHECK(strcmp(bks[0]->ctx.agent_name, "configured") == 0);
    kvl_agent_destroy(a);

    /* a long list is read whole: a name past 255 characters is not cut off
     * (it was, and the agent came up without it) */
    char longlist[400];
    memset(longlist, ' ', sizeof(longlist));
    memcpy(longlist + 300, "tcp,nosuch", 11);
    cfg = (kvl_agent_config_t){.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = longlist};
    KT_STATUS(kvl_agent_create("long-list", &cfg, &a), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("nosuch");
    memcpy(longlist + 300, "tcp", 4);
    KT_OK(kvl_agent_create("long-list", &cfg, &a));
    KT_CHECK(kvl_agent_backends(a, bks, 4) == 1 && strcmp(kvl_backend_name(bks[0]), "tcp") == 0);
    kvl_agent_destroy(a);

    /* an empty secret is no secret */
    cfg = (kvl_agent_config_t){.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_SECRET,
                               .create_backends = "", .secret = ""};
    KT_OK(kvl_agent_create("nosecret", &cfg, &a));
    KT_CHECK(a->secret == NULL && a->secret_len == 0 && kvl_agent_backends(a, NULL, 0) == 0);
    KT_CHECK(atomic_load(&a->generation) == 1);
    kvl_agent_destroy(a);
}

static void test_backend_list_refused(void)
{
    kvl_agent_t *a = (kvl_agent_t *)&a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = "shm,nope"};
    KT_STATUS(kvl_agent_create("partial", &cfg, &a), KVL_ERR_NOT_FOUND);
    KT_CHECK(a == NULL); /* the shm backend made before is gone with the agent */
    KT_ERROR_HAS("backend 'nope' cannot be created: no backend named 'nope' in this build (known:");
    KT_ERROR_HAS("fix: run 'kvlane doctor' to see which backends this machine supports");

    /* an empty entry is refused, never skipped: nothing is created */
    const char *holes[] = {"shm,,tcp", "shm, ,tcp", ",shm", "shm,", " , ", ","};
    for (size_t i = 0; i < sizeof(holes) / sizeof(holes[0]); i++) {
        cfg.create_backends = holes[i];
        a = (kvl_agent_t *)&a;
        KT_STATUS(kvl_agent_create("holes", &cfg, &a), KVL_ERR_INVALID_ARG);
        KT_CHECK(a == NULL);
        KT_ERROR_HAS("has an empty entry");
        KT_ERROR_HAS(holes[i]);
    }
    /* blanks around names, or blanks alone, are not empty entries */
    const char *fine[] = {" shm ", "shm , tcp", "   "};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        cfg.create_backends = fine[i];
        KT_OK(kvl_agent_create("fine", &cfg, &a));
        KT_CHECK(kvl_agent_backends(a, NULL, 0) == (i == 2 ? 0u : i + 1));
        kvl_agent_destroy(a);
    }

    /* a backend this machine cannot run: the agent fails with its reason */
    char reason[512];
    kvl_status_t st = kvl_backend_available("cuda", reason, sizeof(reason));
    if (st != KVL_OK) {
        cfg.create_backends = "cuda";
        KT_STATUS(kvl_agent_create("nocuda", &cfg, &a), st);
        KT_ERROR_HAS(reason);
    }
}

static int g_destroyed;
static void on_destroy(kvl_agent_t *a)
{
    KT_CHECK(strcmp(a->name, "hooked") == 0);
    g_destroyed++;
}
static void on_changed(kvl_agent_t *a)
{
    (void)a;
}
static const kvli_agent_hooks_t g_hooks = {on_destroy, on_changed};

static void test_hooks(void)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create("hooked", &none, &a));
    KT_CHECK(kvli_agent_hooks(a) == NULL);
    pthread_mutex_lock(&a->lock);
    a->hooks = &g_hooks;
    pthread_mutex_unlock(&a->lock);
    KT_CHECK(kvli_agent_hooks(a) == &g_hooks);
    kvl_agent_destroy(a);
    KT_CHECK(g_destroyed == 1);
}

/*
 * Destroy with everything alive: a transfer in flight, a prepared list,
 * a remote agent, registered memory, a memfd allocation and a queued
 * notification. The transfer is cancelled, every handle goes back to its
 * backend, and backends close last.
 */
static void test_teardown(void)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    kt_stub_t s;
    KT_OK(kvl_agent_create("teardown", &none, &a));
    kvl_backend_t *bk = kt_stub_attach(a, &s, "stub", KVL_MEM_BIT(KVL_MEM_DRAM),
                                       KVL_MEM_BIT(KVL_MEM_DRAM), KVL_BK_CAP_NOTIF);
    uint8_t *buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(buf != MAP_FAILED);
    kvl_mem_desc_t d[2] = {{(uint64_t)(uintptr_t)buf, 4096, KVL_DEV_ANY},
                           {(uint64_t)(uintptr_t)buf + 8192, 4096, KVL_DEV_ANY}};
    KT_OK(kvl_mem_register(a, d, 2, NULL, NULL));
    void *shared;
    KT_OK(kvl_mem_alloc(a, 1 << 16, &shared));
    kvl_mem_desc_t rd[3] = {{0x10000, 4096, 0}, {0x20000, 4096, 0}, {0x30000, 4096, 0}};
    kt_rmd_t rm = {.name = "peer", .incarnation = 9, .start_ns = 1, .generation = 1,
                   .backends = {"stub"}, .n_backends = 1, .regions = rd, .n_regions = 3};
    kt_md_load(a, &rm);

    kvl_dlist_t *l, *r;
    kvl_prep_t *lp;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &r));
    KT_OK(kvl_dlist_add(l, d[0].addr, 64, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, 0x20000, 64, KVL_DEV_ANY));
    KT_OK(kvl_prep_local(a, l, &lp));
    KT_OK(kvl_xfer_create(a, KVL_WRITE, l, "peer", r, NULL, &x));
    KT_STATUS(kvl_xfer_post(x), KVL_IN_PROGRESS);
    bk->ctx.notif_deliver(&bk->ctx, "peer", "queued", 6);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);

    kvl_agent_destroy(a);
    KT_CHECK(s.cancels == 1 && s.pending == NULL);
    KT_CHECK(s.regs == 2 && s.deregs == 2 && s.deregs_at_close == 2);
    KT_CHECK(s.peers == 1 && s.unpeers == 1 && s.unpeers_at_close == 1);
    KT_CHECK(s.rloads == 3 && s.runloads == 3 && s.runloads_at_close == 3);
    KT_CHECK(s.releases == 1 && s.closes == 1);
    munmap(buf, 1 << 20);
}

int main(void)
{
    test_mem_kinds();
    test_names();
    test_config();
    test_backend_list_refused();
    test_hooks();
    test_teardown();
    printf("test_agent: passed\n");
    return 0;
}
