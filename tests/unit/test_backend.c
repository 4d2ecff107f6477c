/* Backends on an agent (src/core/backend.c): creating one, every refusal,
 * listing them, and the context the core lends each. */
#include <string.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static void test_refusals(void)
{
    kvl_agent_t *a = bare("refusing");
    kvl_backend_t *bk = (kvl_backend_t *)&bk;
    kvl_error_t e;

    KT_STATUS(kvl_backend_create(NULL, "shm", NULL, 0, &bk), KVL_ERR_INVALID_ARG);
    KT_CHECK(bk == NULL);
    KT_ERROR_HAS("kvl_backend_create: agent or name is NULL");
    KT_STATUS(kvl_backend_create(a, NULL, NULL, 0, NULL), KVL_ERR_INVALID_ARG);

    KT_STATUS(kvl_backend_create(a, "nope", NULL, 0, NULL), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("backend 'nope' cannot be created: no backend named 'nope' in this build");
    KT_CHECK(strcmp(kvl_last_error()->backend, "nope") == 0);
    kvl_agent_last_error(a, &e);
    KT_CHECK(e.code == KVL_ERR_NOT_FOUND); /* recorded on the agent too */

    /* a parameter the backend does not know: its parameters listed */
    kvl_param_t bad = {"bogus", "1"};
    KT_STATUS(kvl_backend_create(a, "shm", &bad, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("backend 'shm' has no parameter 'bogus'");
    char keys[256] = "fix: its parameters are:";
    for (const kvl_param_t *p = kvl_backend_params("shm"); p->key; p++)
        snprintf(keys + strlen(keys), sizeof(keys) - strlen(keys), " %s", p->key);
    KT_ERROR_HAS(keys);
    kvl_param_t nokey[2] = {{"cma", "auto"}, {NULL, "x"}};
    KT_STATUS(kvl_backend_create(a, "shm", nokey, 2, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("backend 'shm' has no parameter '(null)'");

    /* the backend's own refusal (open) comes back with its name */
    kvl_param_t value = {"allow_uids", "bogus"};
    KT_STATUS(kvl_backend_create(a, "shm", &value, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("parameter allow_uids=\"bogus\"");
    KT_CHECK(strcmp(kvl_last_error()->backend, "shm") == 0);
    /* nothing was added by any refusal */
    KT_CHECK(kvl_agent_backends(a, NULL, 0) == 0 && atomic_load(&a->generation) == 1);
    kvl_agent_destroy(a);
}

static void test_create_and_list(void)
{
    kvl_agent_t *a = bare("lister");
    kvl_backend_t *bk, *list[4] = {NULL, NULL, NULL, NULL};
    kvl_param_t ok = {"cma", "off"};

    KT_OK(kvl_backend_create(a, "shm", &ok, 1, &bk));
    KT_CHECK(strcmp(kvl_backend_name(bk), "shm") == 0);
    KT_CHECK(bk->agent == a && bk->index == 0 && bk->ops == kvli_backend_find("shm"));
    KT_CHECK(atomic_load(&a->generation) == 2);
    /* names are case-insensitive, so this is the same backend */
    KT_STATUS(kvl_backend_create(a, "SHM", NULL, 0, NULL), KVL_ERR_EXISTS);
    KT_ERROR_HAS("backend 'SHM' is already created on agent 'lister'");
    KT_OK(kvl_backend_create(a, "tcp", NULL, 0, NULL)); /* bk_p is optional */

    KT_CHECK(kvl_agent_backends(a, list, 4) == 2);
    KT_CHECK(list[0] == bk && strcmp(kvl_backend_name(list[1]), "tcp") == 0);
    KT_CHECK(list[1]->index == 1 && list[2] == NULL);
    list[0] = list[1] = NULL;
    KT_CHECK(kvl_agent_backends(a, list, 1) == 2); /* the count, one filled */
    KT_CHECK(list[0] == bk && list[1] == NULL);
    KT_CHECK(kvl_agent_backends(NULL, list, 4) == 0);
    KT_CHECK(kvl_backend_name(NULL) == NULL);
    kvl_agent_destroy(a);
}

static void test_full(void)
{
    kvl_agent_t *a = bare("crowded");
    kt_stub_t s[KVLI_MAX_BACKENDS];
    char name[16];
    for (int i = 0; i < KVLI_MAX_BACKENDS; i++) {
        snprintf(name, sizeof(name), "stub%d", i);
        kt_stub_attach(a, &s[i], name, KVL_MEM_BIT(KVL_MEM_DRAM), 0, 0);
    }
    KT_STATUS(kvl_backend_create(a, "shm", NULL, 0, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("agent 'crowded' already has 8 backends");
    kvl_agent_destroy(a);
    for (int i = 0; i < KVLI_MAX_BACKENDS; i++)
        KT_CHECK(s[i].closes == 1);
}

typedef struct {
    int calls;
    kvl_log_level_t level;
    char component[32], msg[256];
} seen_t;

static void on_log(kvl_log_level_t level, const char *component, const char *message, void *arg)
{
    seen_t *s = arg;
    s->calls++;
    s->level = level;
    kvli_scopy(s->component, sizeof(s->component), component);
    kvli_scopy(s->msg, sizeof(s->msg), message);
}

/* What a backend gets: its agent's identity and settings, and services. */
static void test_ctx(void)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT |
                                            KVL_AGENT_CFG_WORKERS,
                              .create_backends = "", .timeout_ms = 777, .workers = 3};
    kvl_agent_t *a;
    kvl_backend_t *bk;
    KT_OK(kvl_agent_create("lender", &cfg, &a));
    KT_OK(kvl_backend_create(a, "tcp", NULL, 0, &bk));
    kvl_bk_ctx_t *c = &bk->ctx;
    KT_CHECK(c->size == sizeof(kvl_bk_ctx_t) && c->core == bk);
    KT_CHECK(strcmp(c->agent_name, "lender") == 0 && c->incarnation == a->incarnation);
    KT_CHECK(c->timeout_ms == 777 && c->workers == 3);
    KT_CHECK(c->secret == NULL && c->secret_len == 0);
    KT_CHECK(c->xfer_done && c->region_pin && c->region_unpin && c->alloc_lookup);
    KT_CHECK(c->stage_check && c->stage_host_alloc && c->stage_host_free && c->stage_copy);
    KT_CHECK(c->stage_test && c->xfer_expand);

    /* logging on its behalf: the component is the backend's name */
    seen_t s = {0};
    kvl_log_set_callback(on_log, &s);
    c->log(c, KVL_LOG_ERROR, "socket %d closed", 5);
    kvl_log_set_callback(NULL, NULL);
    KT_CHECK(s.calls == 1 && s.level == KVL_LOG_ERROR);
    KT_CHECK(strcmp(s.component, "tcp") == 0 && strcmp(s.msg, "socket 5 closed") == 0);

    /* a notification handed in lands on this agent */
    kvl_notif_t n;
    size_t got;
    c->notif_deliver(c, "someone", "hi", 2);
    KT_OK(kvl_notif_poll(a, &n, 1, &got));
    KT_CHECK(got == 1 && strcmp(n.from, "someone") == 0 && n.len == 2 && memcmp(n.msg, "hi", 3) == 0);
    kvl_notif_free(&n);
    kvl_agent_destroy(a);
}

int main(void)
{
    test_refusals();
    test_create_and_list();
    test_full();
    test_ctx();
    printf("test_backend: passed\n");
    return 0;
}
