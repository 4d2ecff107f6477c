/* Staging (src/core/stage.c): what a host-only backend's ctx->stage_* do.
 * They forward to the built-in backend with staging copies when this build
 * has one (cuda; answers depend on the machine's driver, so the test
 * compares with asking that backend directly), else refuse with the reason. */
#include <string.h>
#include "common/kvltest.h"
#include "core/internal.h"

/* The built-in backend whose device services lend staging copies. */
static const kvl_backend_ops_t *stager(void)
{
    const kvl_backend_ops_t *ops;
    for (size_t i = 0; (ops = kvli_backend_builtin(i)) != NULL; i++)
        if (ops->device != NULL && ops->device->stage_check && ops->device->stage_host_alloc &&
            ops->device->stage_host_free && ops->device->stage_copy && ops->device->stage_test)
            return ops;
    return NULL;
}

static void clean(kvl_error_t *e)
{
    memset(e, 0, sizeof(*e));
    e->device = -1;
}

static void test_forwarded(kvl_bk_ctx_t *c, const kvl_backend_ops_t *ops)
{
    static const struct {
        kvl_mem_kind_t kind;
        int32_t dev;
    } asks[] = {{KVL_MEM_VRAM, 0}, {KVL_MEM_VRAM, 1000}, {KVL_MEM_DRAM, 0}};
    kvl_error_t e1, e2;
    for (size_t i = 0; i < sizeof(asks) / sizeof(asks[0]); i++) {
        clean(&e1);
        clean(&e2);
        kvl_status_t s1 = c->stage_check(c, asks[i].kind, asks[i].dev, &e1);
        kvl_status_t s2 = ops->device->stage_check(asks[i].kind, asks[i].dev, &e2);
        KT_CHECK(s1 == s2 && e1.code == e2.code && strcmp(e1.what, e2.what) == 0);
        printf("stage_check(%s, %d): %s %s\n", kvl_mem_kind_name(asks[i].kind), asks[i].dev,
               kvl_status_name(s1), e1.what);
    }
    void *p1 = NULL, *p2 = NULL;
    clean(&e1);
    clean(&e2);
    kvl_status_t s1 = c->stage_host_alloc(c, 1 << 20, &p1, &e1);
    kvl_status_t s2 = ops->device->stage_host_alloc(1 << 20, &p2, &e2);
    KT_CHECK(s1 == s2 && strcmp(e1.what, e2.what) == 0);
    if (s1 == KVL_OK) {
        KT_CHECK(p1 != NULL && p1 != p2);
        memset(p1, 0x5a, 1 << 20); /* host memory, writable */
        c->stage_host_free(c, p1);
        ops->device->stage_host_free(p2);
    }
    c->stage_host_free(c, NULL); /* nothing to free */
}

static void test_none(kvl_bk_ctx_t *c)
{
    kvl_error_t e;
    void *p = &p, *ticket = NULL;
    kvl_stage_piece_t piece = {0x1000, NULL, 64, 0};
    static const char *what = "tcp cannot stage device memory: this kvlane build has no "
                              "built-in device backend with staging copies";
    clean(&e);
    KT_CHECK(c->stage_check(c, KVL_MEM_VRAM, 0, &e) == KVL_ERR_UNSUPPORTED);
    KT_CHECK(strcmp(e.what, what) == 0 && strcmp(e.backend, "tcp") == 0);
    KT_CHECK(strstr(e.hint, "build kvlane with the cuda backend") != NULL);
    clean(&e);
    KT_CHECK(c->stage_host_alloc(c, 4096, &p, &e) == KVL_ERR_UNSUPPORTED);
    KT_CHECK(strcmp(e.what, what) == 0);
    clean(&e);
    KT_CHECK(c->stage_copy(c, 1, &piece, 1, NULL, NULL, &ticket, &e) == KVL_ERR_UNSUPPORTED);
    KT_CHECK(e.code == KVL_ERR_UNSUPPORTED && ticket == NULL);
    clean(&e);
    KT_CHECK(c->stage_test(c, &piece, 1, &e) == -1 && e.code == KVL_ERR_UNSUPPORTED);
    c->stage_host_free(c, &piece); /* nothing to free it with: ignored */
}

int main(void)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    kvl_backend_t *bk;
    KT_OK(kvl_agent_create("stager", &none, &a));
    KT_OK(kvl_backend_create(a, "tcp", NULL, 0, &bk));
    const kvl_backend_ops_t *ops = stager();
    if (ops != NULL) {
        printf("staging copies from the built-in backend %s\n", ops->name);
        test_forwarded(&bk->ctx, ops);
    } else {
        printf("no built-in backend with staging copies\n");
        test_none(&bk->ctx);
    }
    kvl_agent_destroy(a);
    printf("test_stage: passed\n");
    return 0;
}
