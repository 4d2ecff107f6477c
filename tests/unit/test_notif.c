/*
 * Notifications (src/core/notif.c): the agent's queue (arrival order,
 * partial polls, contents kept byte for byte), waiting, and sending (size
 * limit, which backend carries it, every backend's reason when none can),
 * then a real shm round trip between two agents of this process.
 */
#include <pthread.h>
#include <string.h>
#include "common/kt_stub.h"
#include "common/kvltest.h"
#include "core/internal.h"

static const uint32_t DRAM = KVL_MEM_BIT(KVL_MEM_DRAM);

static kvl_agent_t *bare(const char *name)
{
    kvl_agent_config_t none = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a;
    KT_OK(kvl_agent_create(name, &none, &a));
    return a;
}

static void test_queue(void)
{
    kvl_agent_t *a = bare("queue");
    kt_stub_t s;
    kvl_bk_ctx_t *c = &kt_stub_attach(a, &s, "s1", DRAM, DRAM, KVL_BK_CAP_NOTIF)->ctx;
    kvl_notif_t out[128];
    size_t n = 99;
    char m[16];

    KT_OK(kvl_notif_poll(a, out, 128, &n));
    KT_CHECK(n == 0);
    for (int i = 0; i < 100; i++) {
        int len = snprintf(m, sizeof(m), "m%d", i);
        c->notif_deliver(c, i % 2 ? "odd" : "even", m, (size_t)len);
    }
    /* part of the queue, in arrival order; the rest stays */
    KT_OK(kvl_notif_poll(a, out, 30, &n));
    KT_CHECK(n == 30);
    for (int i = 0; i < 30; i++) {
        snprintf(m, sizeof(m), "m%d", i);
        KT_CHECK(strcmp((char *)out[i].msg, m) == 0 && out[i].len == strlen(m));
        KT_CHECK(strcmp(out[i].from, i % 2 ? "odd" : "even") == 0);
        kvl_notif_free(&out[i]);
        KT_CHECK(out[i].msg == NULL && out[i].len == 0);
    }
    KT_OK(kvl_notif_poll(a, NULL, 0, &n)); /* asking for none takes none */
    KT_CHECK(n == 0);
    KT_OK(kvl_notif_poll(a, out, 128, &n));
    KT_CHECK(n == 70 && strcmp((char *)out[0].msg, "m30") == 0);
    KT_CHECK(strcmp((char *)out[69].msg, "m99") == 0);
    for (size_t i = 0; i < n; i++)
        kvl_notif_free(&out[i]);
    KT_CHECK(a->nhead == NULL && a->ntail == NULL);

    /* bytes kept as sent, a NUL after them; empty messages; odd senders */
    const unsigned char bin[5] = {0, 'x', 0, 0xff, 0};
    char longname[100];
    memset(longname, 'L', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    c->notif_deliver(c, "bin", bin, sizeof(bin));
    c->notif_deliver(c, NULL, NULL, 0);
    c->notif_deliver(c, longname, "x", 1);
    KT_OK(kvl_notif_poll(a, out, 3, &n));
    KT_CHECK(n == 3 && out[0].len == 5 && memcmp(out[0].msg, bin, 5) == 0 && out[0].msg[5] == 0);
    KT_CHECK(out[1].len == 0 && out[1].msg != NULL && out[1].msg[0] == 0 && out[1].from[0] == 0);
    KT_CHECK(strlen(out[2].from) == KVL_NAME_MAX - 1 && out[2].from[0] == 'L');
    for (size_t i = 0; i < n; i++)
        kvl_notif_free(&out[i]);
    kvl_notif_free(&out[0]); /* twice: nothing left to free */
    kvl_notif_free(NULL);

    KT_STATUS(kvl_notif_poll(NULL, out, 1, &n), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_notif_poll: NULL argument");
    KT_STATUS(kvl_notif_poll(a, out, 1, NULL), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_notif_poll(a, NULL, 1, &n), KVL_ERR_INVALID_ARG);
    /* queued at destroy: freed with the agent */
    c->notif_deliver(c, "late", "unread", 6);
    kvl_agent_destroy(a);
}

static void *deliver_one(void *arg)
{
    kvl_bk_ctx_t *c = arg;
    c->notif_deliver(c, "thread", "wake", 4);
    return NULL;
}

static void test_wait(void)
{
    kvl_agent_t *a = bare("waiter");
    kt_stub_t s;
    kvl_bk_ctx_t *c = &kt_stub_attach(a, &s, "s1", DRAM, DRAM, KVL_BK_CAP_NOTIF)->ctx;
    kvl_notif_t n;
    size_t got;

    KT_STATUS(kvl_notif_wait(a, 0), KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("no notification on agent 'waiter' within 0 ms");
    KT_ERROR_HAS("fix: wait again, or check that the peer sent it");
    KT_STATUS(kvl_notif_wait(a, 20), KVL_ERR_TIMEOUT);
    KT_ERROR_HAS("within 20 ms");
    KT_STATUS(kvl_notif_wait(NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_notif_wait: agent is NULL");

    c->notif_deliver(c, "p", "1", 1);
    KT_OK(kvl_notif_wait(a, 0)); /* waiting already: at once */
    KT_OK(kvl_notif_wait(a, -1));
    KT_OK(kvl_notif_poll(a, &n, 1, &got));
    kvl_notif_free(&n);
    /* woken by a delivery from another thread, however it interleaves */
    pthread_t t;
    KT_CHECK(pthread_create(&t, NULL, deliver_one, c) == 0);
    KT_OK(kvl_notif_wait(a, -1));
    KT_CHECK(pthread_join(t, NULL) == 0);
    KT_OK(kvl_notif_poll(a, &n, 1, &got));
    KT_CHECK(got == 1 && strcmp(n.from, "thread") == 0);
    kvl_notif_free(&n);
    kvl_agent_destroy(a);
}

static void test_send(void)
{
    kvl_agent_t *a = bare("sender");
    kt_stub_t plain, away, ok;
    kt_stub_attach(a, &plain, "plain", DRAM, DRAM, 0); /* carries no notifications */
    kt_stub_attach(a, &away, "away", DRAM, DRAM, KVL_BK_CAP_NOTIF); /* the peer lacks it */
    kt_stub_attach(a, &ok, "ok", DRAM, DRAM, KVL_BK_CAP_NOTIF);
    kvl_mem_desc_t rd = {0x10000, 4096, 0};
    kt_rmd_t rm = {.name = "peer", .incarnation = 3, .start_ns = 1, .generation = 1,
                   .backends = {"ok", "plain"}, .n_backends = 2, .regions = &rd, .n_regions = 1};
    kt_md_load(a, &rm);

    static unsigned char big[KVL_NOTIF_MAX + 1];
    KT_STATUS(kvl_notif_send(a, "peer", big, KVL_NOTIF_MAX + 1), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("notification of 65537 bytes exceeds KVL_NOTIF_MAX (65536)");
    KT_ERROR_HAS("fix: send large payloads as a transfer");
    KT_STATUS(kvl_notif_send(a, "peer", NULL, 1), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_notif_send: NULL argument");
    KT_STATUS(kvl_notif_send(a, NULL, "x", 1), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_notif_send(NULL, "peer", "x", 1), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_notif_send(a, "stranger", "x", 1), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("remote agent 'stranger' is not loaded on agent 'sender'");
    KT_CHECK(ok.notifs == 0);

    /* the first backend that carries notifications and reaches the peer */
    big[0] = 'B';
    big[KVL_NOTIF_MAX - 1] = 'E';
    KT_OK(kvl_notif_send(a, "peer", big, KVL_NOTIF_MAX));
    KT_CHECK(ok.notifs == 1 && ok.notif_len == KVL_NOTIF_MAX && ok.notif_head[0] == 'B');
    KT_CHECK(plain.notifs == 0 && away.notifs == 0);
    KT_OK(kvl_notif_send(a, "peer", NULL, 0));
    KT_CHECK(ok.notifs == 2 && ok.notif_len == 0);

    /* none can: every backend's reason, and the code of the real failure */
    ok.notif_status = KVL_ERR_REMOTE_DISCONNECT;
    KT_STATUS(kvl_notif_send(a, "peer", "x", 1), KVL_ERR_REMOTE_DISCONNECT);
    KT_ERROR_HAS("no backend can carry a notification to agent 'peer'");
    KT_ERROR_HAS("cause 1: [plain] KVL_ERR_UNSUPPORTED: backend carries no notifications");
    KT_ERROR_HAS("cause 2: [away] KVL_ERR_UNSUPPORTED: the remote agent has no away backend");
    KT_ERROR_HAS("cause 3: [ok] KVL_ERR_REMOTE_DISCONNECT: stub ok: notification refused");
    KT_CHECK(strcmp(kvl_last_error()->agent, "peer") == 0);
    /* a failure that is the only cause gives its code and errno at once */
    kvl_agent_t *b = bare("single");
    kt_stub_t only;
    kt_stub_attach(b, &only, "ok", DRAM, DRAM, KVL_BK_CAP_NOTIF);
    kt_md_load(b, &rm);
    only.notif_status = KVL_ERR_REMOTE_DISCONNECT;
    KT_STATUS(kvl_notif_send(b, "peer", "x", 1), KVL_ERR_REMOTE_DISCONNECT);
    KT_CHECK(kvl_last_error()->n_causes == 1);
    /* sent and not answered in time (it may be queued there): the backend's
     * own error, and no other backend is tried (it would deliver it twice) */
    only.notif_status = KVL_ERR_TIMEOUT;
    KT_STATUS(kvl_notif_send(b, "peer", "x", 1), KVL_ERR_TIMEOUT);
    KT_CHECK(kvl_last_error()->n_causes == 0);
    KT_ERROR_HAS("stub ok: notification refused");
    KT_CHECK(strstr(kvl_last_error()->what, "no backend can carry") == NULL);
    kvl_agent_destroy(b);
    kvl_agent_destroy(a);

    /* no backend that carries notifications at all */
    a = bare("mute");
    kt_stub_attach(a, &plain, "plain", DRAM, DRAM, 0);
    kt_md_load(a, &rm);
    KT_STATUS(kvl_notif_send(a, "peer", "x", 1), KVL_ERR_NO_BACKEND);
    KT_ERROR_HAS("cause 1: [plain] KVL_ERR_UNSUPPORTED: backend carries no notifications");
    kvl_agent_destroy(a);
}

/* Two agents of this process over the real shm backend. */
static void test_shm_round_trip(void)
{
    kvl_agent_t *a = kt_agent("nsrc", "shm", NULL), *b = kt_agent("ndst", "shm", NULL);
    void *blob;
    size_t len;
    KT_OK(kvl_metadata_get(b, &blob, &len));
    KT_OK(kvl_metadata_load(a, blob, len, NULL, 0));
    kvl_free(blob);

    static unsigned char big[KVL_NOTIF_MAX];
    kt_fill(big, sizeof(big), 5);
    KT_OK(kvl_notif_send(a, "ndst", "first", 5));
    KT_OK(kvl_notif_send(a, "ndst", big, sizeof(big)));
    KT_OK(kvl_notif_send(a, "ndst", "", 0));
    kvl_notif_t got[3];
    size_t n = 0, k;
    while (n < 3) {
        KT_OK(kvl_notif_wait(b, 10000));
        KT_OK(kvl_notif_poll(b, got + n, 3 - n, &k));
        n += k;
    }
    KT_CHECK(strcmp(got[0].from, "nsrc") == 0 && got[0].len == 5);
    KT_CHECK(memcmp(got[0].msg, "first", 6) == 0);
    KT_CHECK(got[1].len == sizeof(big) && kt_verify(got[1].msg, sizeof(big), 5) == -1);
    KT_CHECK(got[2].len == 0 && strcmp(got[2].from, "nsrc") == 0);
    for (int i = 0; i < 3; i++)
        kvl_notif_free(&got[i]);
    kvl_agent_destroy(a);
    kvl_agent_destroy(b);
}

int main(void)
{
    test_queue();
    test_wait();
    test_send();
    test_shm_round_trip();
    printf("test_notif: passed\n");
    return 0;
}
