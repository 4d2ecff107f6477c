/*
 * The notification queue is bounded (issue 16: "256 MiB of notifications
 * from one peer raised the target's RSS from 8 to 266 MiB"). On each backend
 * that carries notifications itself (shm, tcp, ucx, whose target answers
 * every notification, and cuda between host buffers when the backend starts
 * here), a target that does not take its notifications:
 *   1. count bound: with notif_max_msgs 16, sixteen notifications are
 *      queued, the seventeenth is refused: the sender gets
 *      KVL_ERR_REMOTE_FULL naming the target and its bound, nothing more is
 *      queued (kvl_notif_queue_info), and once the target took one, sending
 *      works again;
 *   2. byte bound: with notif_max_bytes 256 KiB, four 64 KiB messages fit,
 *      the fifth is refused;
 *   3. a WRITE whose notification finds the queue full fails with
 *      KVL_ERR_REMOTE_FULL, saying its data is in place, and the data is
 *      there; after the target took its notifications the same transfer
 *      completes and its notification arrives;
 *   4. small notifications (shm: sent within a grant, unanswered) never
 *      pass the bound: with room for 512, 600 sends queue exactly 512;
 *   5. four threads sending at once, the target taking as they come: all
 *      8100 delivered, none refused, the connection never dropped;
 *   6. one peer's share (notif_peer_percent 50): a flooding peer is refused
 *      at half the bound while another still gets the other half;
 *   7. the flood: 256 MiB of 64 KiB notifications from one peer at a
 *      target with the defaults (64 MiB, a peer's share 50%): exactly 512
 *      (32 MiB) are queued, every other is refused, and the process's RSS
 *      grows by no more than 32 MiB plus 48 MiB of slack (not checked under a
 *      sanitizer);
 *   8. (shm) a raw peer that sends past its grant, or gives back more than it
 *      holds, is cut off and nothing of it passes the bound.
 * Nothing here depends on timing: a send returns the target's answer, or
 * (shm, small ones within a grant) the room for it was reserved before.
 * KVL_TEST_LABELS: tsan
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "common/kvltest.h"
#include "backends/shm/shm_proto.h"

#define BUF (1u << 20)

typedef struct nb_path {
    const char *name, *backend, *params;
    int shareable;               /* the target's buffer from kvl_mem_alloc */
} nb_path_t;

static const nb_path_t paths[] = {
    {"shm", "shm", NULL, 0},
    {"tcp", "tcp", "host=127.0.0.1", 0},
    {"ucx", "ucx", NULL, 0},
    {"cuda/host", "cuda", NULL, 1},
};

/* pct: one peer's share in percent (0: the default, 50) */
static kvl_agent_t *nb_agent_pct(const nb_path_t *p, const char *name, uint64_t max_bytes,
                                 uint64_t max_msgs, unsigned pct)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT |
                                            KVL_AGENT_CFG_NOTIF_BOUND | KVL_AGENT_CFG_NOTIF_SHARE,
                              .create_backends = "", .timeout_ms = 10000,
                              .notif_max_bytes = max_bytes, .notif_max_msgs = max_msgs,
                              .notif_peer_percent = pct};
    kvl_param_t prm[1];
    size_t np = 0;
    KT_OK(kvl_agent_create(name, &cfg, &a));
    if (p->params) {
        prm[0] = (kvl_param_t){"host", "127.0.0.1"};
        np = 1;
    }
    KT_OK(kvl_backend_create(a, p->backend, prm, np, NULL));
    return a;
}

/* one peer may fill the whole bound */
static kvl_agent_t *nb_agent(const nb_path_t *p, const char *name, uint64_t max_bytes,
                             uint64_t max_msgs)
{
    return nb_agent_pct(p, name, max_bytes, max_msgs, 100);
}

/* The target's metadata into the sender. */
static void nb_connect(kvl_agent_t *s, kvl_agent_t *t)
{
    void *md;
    size_t len;
    KT_OK(kvl_metadata_get(t, &md, &len));
    KT_OK(kvl_metadata_load(s, md, len, NULL, 0));
    kvl_free(md);
}

static kvl_notif_queue_info_t nb_info(kvl_agent_t *t)
{
    kvl_notif_queue_info_t q;
    KT_OK(kvl_notif_queue_info(t, &q));
    return q;
}

static size_t nb_take(kvl_agent_t *t, size_t max)
{
    kvl_notif_t n[64];
    size_t got = 0, k;
    while (got < max) {
        size_t want = max - got < 64 ? max - got : 64;
        KT_OK(kvl_notif_poll(t, n, want, &k));
        for (size_t i = 0; i < k; i++)
            kvl_notif_free(&n[i]);
        got += k;
        if (k < want)
            break;
    }
    return got;
}

static void nb_expect_full(const char *target, const char *bound)
{
    const kvl_error_t *e = kvl_last_error();
    char want[128];
    KT_CHECK(e->code == KVL_ERR_REMOTE_FULL);
    snprintf(want, sizeof(want), "agent '%s'", target);
    KT_ERROR_HAS(want);
    KT_ERROR_HAS(bound);
    KT_ERROR_HAS("kvl_notif_poll");
    KT_CHECK(strcmp(e->agent, target) == 0);
}

static void nb_count(const nb_path_t *p)
{
    kvl_agent_t *t = nb_agent(p, "nb-target", 0, 16);
    kvl_agent_t *s = nb_agent(p, "nb-sender", 0, 0);
    char msg[100];
    nb_connect(s, t);
    memset(msg, 'c', sizeof(msg));
    for (int i = 0; i < 16; i++)
        KT_OK(kvl_notif_send(s, "nb-target", msg, sizeof(msg)));
    KT_STATUS(kvl_notif_send(s, "nb-target", msg, sizeof(msg)), KVL_ERR_REMOTE_FULL);
    nb_expect_full("nb-target", "its bound is 16 notifications");
    char text[2048];
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s: the 17th notification:\n%s\n", p->name, text);
    kvl_notif_queue_info_t q = nb_info(t);
    KT_CHECK(q.msgs == 16 && q.bytes == 16 * sizeof(msg) && q.max_msgs == 16 && q.refused == 1);
    KT_CHECK(q.max_bytes == KVL_NOTIF_QUEUE_BYTES_DEFAULT);
    /* taken one: room for one */
    KT_CHECK(nb_take(t, 1) == 1);
    KT_OK(kvl_notif_send(s, "nb-target", msg, sizeof(msg)));
    KT_STATUS(kvl_notif_send(s, "nb-target", msg, sizeof(msg)), KVL_ERR_REMOTE_FULL);
    KT_CHECK(nb_take(t, 100) == 16);
    q = nb_info(t);
    KT_CHECK(q.msgs == 0 && q.bytes == 0 && q.refused == 2);
    KT_OK(kvl_notif_send(s, "nb-target", msg, sizeof(msg)));
    KT_CHECK(nb_take(t, 100) == 1);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
}

static void nb_bytes(const nb_path_t *p)
{
    kvl_agent_t *t = nb_agent(p, "nb-target", 256u << 10, 0);
    kvl_agent_t *s = nb_agent(p, "nb-sender", 0, 0);
    static char msg[KVL_NOTIF_MAX];
    nb_connect(s, t);
    memset(msg, 'b', sizeof(msg));
    for (int i = 0; i < 4; i++)
        KT_OK(kvl_notif_send(s, "nb-target", msg, sizeof(msg)));
    KT_STATUS(kvl_notif_send(s, "nb-target", msg, sizeof(msg)), KVL_ERR_REMOTE_FULL);
    nb_expect_full("nb-target", "or 262144 bytes");
    /* a small one still fits the count, not the bytes */
    KT_STATUS(kvl_notif_send(s, "nb-target", msg, 1), KVL_ERR_REMOTE_FULL);
    kvl_notif_queue_info_t q = nb_info(t);
    KT_CHECK(q.msgs == 4 && q.bytes == 4 * sizeof(msg) && q.refused == 2);
    KT_CHECK(q.max_msgs == KVL_NOTIF_QUEUE_MSGS_DEFAULT);
    KT_CHECK(nb_take(t, 1) == 1);
    KT_OK(kvl_notif_send(s, "nb-target", msg, sizeof(msg)));
    KT_CHECK(nb_take(t, 100) == 4);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
}

static void nb_xfer(const nb_path_t *p)
{
    kvl_agent_t *t = nb_agent(p, "nb-target", 0, 2);
    kvl_agent_t *s = nb_agent(p, "nb-sender", 0, 0);
    uint8_t *tb, *sb;
    if (p->shareable) {
        void *v;
        KT_OK(kvl_mem_alloc(t, BUF, &v));
        tb = v;
    } else {
        tb = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        KT_CHECK(tb != MAP_FAILED);
    }
    sb = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(sb != MAP_FAILED);
    memset(tb, 0, BUF);
    kvl_mem_desc_t td = {(uint64_t)(uintptr_t)tb, BUF, KVL_DEV_ANY};
    kvl_mem_desc_t sd = {(uint64_t)(uintptr_t)sb, BUF, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &td, 1, NULL, NULL));
    KT_OK(kvl_mem_register(s, &sd, 1, NULL, NULL));
    nb_connect(s, t);
    KT_OK(kvl_notif_send(s, "nb-target", "one", 3));
    KT_OK(kvl_notif_send(s, "nb-target", "two", 3));

    kvl_dlist_t *ld, *rd;
    kvl_xfer_t *x;
    kvl_xfer_params_t xp = {.field_mask = KVL_XFER_PARAM_NOTIF, .notif = "written",
                            .notif_len = 7};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &ld));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &rd));
    KT_OK(kvl_dlist_add(ld, (uint64_t)(uintptr_t)sb, 64u << 10, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(rd, (uint64_t)(uintptr_t)tb + 4096, 64u << 10, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(s, KVL_WRITE, ld, "nb-target", rd, &xp, &x));
    kvl_dlist_destroy(ld);
    kvl_dlist_destroy(rd);

    kt_fill(sb, 64u << 10, 5);
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 30000);
    KT_CHECK(st == KVL_ERR_REMOTE_FULL);
    KT_CHECK(kvl_xfer_state(x) == KVL_XFER_ERROR);
    nb_expect_full("nb-target", "its bound is 2 notifications");
    KT_ERROR_HAS("bytes are in place");
    char text[2048];
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s: a WRITE with a notification to a full queue:\n%s\n", p->name, text);
    KT_CHECK(kt_verify(tb + 4096, 64u << 10, 5) == -1); /* the data is there */
    KT_CHECK(nb_info(t).msgs == 2);

    /* the target takes its notifications: the same transfer goes through */
    KT_CHECK(nb_take(t, 10) == 2);
    kt_fill(sb, 64u << 10, 6);
    st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 30000);
    KT_OK(st);
    KT_CHECK(kt_verify(tb + 4096, 64u << 10, 6) == -1);
    kvl_notif_t n;
    size_t k;
    KT_OK(kvl_notif_poll(t, &n, 1, &k));
    KT_CHECK(k == 1 && n.len == 7 && memcmp(n.msg, "written", 7) == 0 &&
             strcmp(n.from, "nb-sender") == 0);
    kvl_notif_free(&n);
    kvl_xfer_release(x);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
    munmap(sb, BUF);
    if (!p->shareable)
        munmap(tb, BUF);
}

/* Small notifications go within a grant (shm: unanswered), never past the
 * bound: with 512 notifications of room, 600 sends queue exactly 512. */
static void nb_grant(const nb_path_t *p)
{
    kvl_agent_t *t = nb_agent(p, "nb-target", 0, 512);
    kvl_agent_t *s = nb_agent(p, "nb-sender", 0, 0);
    unsigned ok = 0, full = 0;
    nb_connect(s, t);
    for (int i = 0; i < 600; i++) {
        kvl_status_t st = kvl_notif_send(s, "nb-target", "tiny", 4);
        if (st == KVL_OK)
            ok++;
        else if (st == KVL_ERR_REMOTE_FULL)
            full++;
        else
            KT_OK(st);
        kvl_notif_queue_info_t q = nb_info(t);
        KT_CHECK(q.msgs + q.reserved_msgs <= 512);
    }
    kvl_notif_queue_info_t q = nb_info(t);
    printf("%s: 600 small notifications, room for 512: %u queued, %u refused, %llu granted "
           "and unused\n", p->name, ok, full, (unsigned long long)q.reserved_msgs);
    KT_CHECK(ok == 512 && full == 88 && q.msgs == 512 && q.reserved_msgs == 0);
    /* all in order */
    kvl_notif_t n;
    size_t k;
    KT_OK(kvl_notif_poll(t, &n, 1, &k));
    KT_CHECK(k == 1 && n.len == 4 && memcmp(n.msg, "tiny", 4) == 0);
    kvl_notif_free(&n);
    KT_OK(kvl_notif_send(s, "nb-target", "more", 4));
    KT_CHECK(nb_take(t, 1000) == 512);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);

    /* nor past the sender's share: room 2048, a peer's share 1024 */
    t = nb_agent_pct(p, "nb-target", 0, 2048, 50);
    s = nb_agent(p, "nb-sender", 0, 0);
    nb_connect(s, t);
    ok = 0;
    for (int i = 0; i < 1100; i++)
        ok += kvl_notif_send(s, "nb-target", "tiny", 4) == KVL_OK;
    q = nb_info(t);
    printf("%s: 1100 small notifications, a peer's share 1024: %u queued\n", p->name, ok);
    KT_CHECK(ok == 1024 && q.msgs == 1024 && q.max_peer_msgs == 1024);
    KT_CHECK(nb_take(t, 2000) == 1024);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
}

/* Four threads send small notifications at once while the target takes
 * them: every one is queued (grants spent and asked for concurrently never
 * disagree between the two ends: a disagreement drops the connection). */
typedef struct nb_thr {
    kvl_agent_t *s;
    int id;
} nb_thr_t;

static void *nb_sender(void *arg)
{
    nb_thr_t *t = arg;
    char msg[64];
    for (int i = 0; i < 2000; i++) {
        int n = snprintf(msg, sizeof(msg), "%d:%d", t->id, i);
        /* every 97th is larger than a slot: it goes answered */
        KT_OK(kvl_notif_send(t->s, "nb-target", msg, i % 97 ? (size_t)n : sizeof(msg)));
    }
    return NULL;
}

static void nb_threads(const nb_path_t *p)
{
    static char big[2048];
    kvl_agent_t *t = nb_agent(p, "nb-target", 0, 0);
    kvl_agent_t *s = nb_agent(p, "nb-sender", 0, 0);
    pthread_t th[4];
    nb_thr_t a[4];
    nb_connect(s, t);
    for (int i = 0; i < 4; i++) {
        a[i] = (nb_thr_t){s, i};
        KT_CHECK(pthread_create(&th[i], NULL, nb_sender, &a[i]) == 0);
    }
    size_t got = 0;
    for (int i = 0; i < 100; i++) {
        KT_OK(kvl_notif_send(s, "nb-target", big, sizeof(big)));
        got += nb_take(t, 64);
    }
    for (int i = 0; i < 4; i++)
        KT_CHECK(pthread_join(th[i], NULL) == 0);
    /* small ones within a grant (shm) are on their way when send returns */
    for (int i = 0; got < 8100 && i < 600; i++)
        if (kvl_notif_wait(t, 100) == KVL_OK)
            got += nb_take(t, 100000);
    printf("%s: 4 threads x 2000 notifications and 100 of 2 KiB, taken as they come: %zu "
           "delivered\n", p->name, got);
    KT_CHECK(got == 8100);
    kvl_notif_queue_info_t q = nb_info(t);
    KT_CHECK(q.msgs == 0 && q.refused == 0);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
}

/* One peer's share (50%): a flooding peer leaves the other half to others. */
static void nb_share(const nb_path_t *p)
{
    kvl_agent_t *t = nb_agent_pct(p, "nb-target", 0, 16, 50);
    kvl_agent_t *f = nb_agent(p, "nb-flooder", 0, 0);
    kvl_agent_t *o = nb_agent(p, "nb-other", 0, 0);
    nb_connect(f, t);
    nb_connect(o, t);
    for (int i = 0; i < 8; i++)
        KT_OK(kvl_notif_send(f, "nb-target", "f", 1));
    KT_STATUS(kvl_notif_send(f, "nb-target", "f", 1), KVL_ERR_REMOTE_FULL);
    nb_expect_full("nb-target", "one peer's share is 8 notifications");
    char text[2048];
    kvl_error_render(NULL, text, sizeof(text));
    printf("%s: a peer past its share:\n%s\n", p->name, text);
    for (int i = 0; i < 8; i++)
        KT_OK(kvl_notif_send(o, "nb-target", "o", 1)); /* the other half is there */
    KT_STATUS(kvl_notif_send(o, "nb-target", "o", 1), KVL_ERR_REMOTE_FULL);
    nb_expect_full("nb-target", "its bound is 16 notifications");
    kvl_notif_queue_info_t q = nb_info(t);
    KT_CHECK(q.msgs == 16 && q.max_peer_msgs == 8 && q.refused == 2);
    KT_CHECK(nb_take(t, 4) == 4); /* the flooder's first four */
    for (int i = 0; i < 4; i++)
        KT_OK(kvl_notif_send(f, "nb-target", "f", 1));
    KT_STATUS(kvl_notif_send(f, "nb-target", "f", 1), KVL_ERR_REMOTE_FULL);
    KT_CHECK(nb_take(t, 100) == 16);
    kvl_agent_destroy(o);
    kvl_agent_destroy(f);
    kvl_agent_destroy(t);
}

/* ---- a raw shm peer that does not keep to its grant ---- */

/* Connected and past HELLO (current protocol) to agent t's shm socket. */
static int raw_connect(kvl_agent_t *t)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char sock[96];
    const char *me = "nb-raw";
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_HELLO, 1,
                            sizeof(kvli_shm_msg_hello_t) + strlen(me)};
    kvli_shm_msg_hello_t m = {KVLI_SHM_PROTO_VERSION, (uint32_t)strlen(me), 42,
                              (uint32_t)getpid(), 0};
    uint8_t buf[512];
    struct timeval tv = {10, 0};
    snprintf(sock, sizeof(sock), "kvlane-shm-%d-%016llx", (int)getpid(),
             (unsigned long long)kvl_agent_incarnation(t));
    memcpy(a.sun_path + 1, sock, strlen(sock));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    KT_CHECK(connect(fd, (struct sockaddr *)&a,
                     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sock))) == 0);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &m, sizeof(m));
    memcpy(buf + sizeof(h) + sizeof(m), me, strlen(me));
    KT_CHECK(send(fd, buf, sizeof(h) + sizeof(m) + strlen(me), MSG_NOSIGNAL) > 0);
    KT_CHECK(recv(fd, &h, sizeof(h), MSG_WAITALL) == (ssize_t)sizeof(h));
    KT_CHECK(h.type == KVLI_SHM_MSG_HELLO_ACK && h.len < sizeof(buf));
    KT_CHECK(recv(fd, buf, (size_t)h.len, MSG_WAITALL) == (ssize_t)h.len);
    return fd;
}

/* 1: the target closed the connection (a protocol error), 0: it answered. */
static int raw_closed(int fd, kvli_shm_msg_reply_t *r)
{
    kvli_shm_msg_hdr_t h;
    char text[1024];
    ssize_t n = recv(fd, &h, sizeof(h), MSG_WAITALL);
    if (n == 0 || (n < 0 && errno == ECONNRESET))
        return 1; /* closed (reset when it left our requests unread) */
    if (n != (ssize_t)sizeof(h))
        fprintf(stderr, "recv = %zd (%s)\n", n, n < 0 ? strerror(errno) : "short");
    KT_CHECK(n == (ssize_t)sizeof(h) && h.type == KVLI_SHM_MSG_NOTIF_ACK);
    KT_CHECK(recv(fd, r, sizeof(*r), MSG_WAITALL) == (ssize_t)sizeof(*r));
    KT_CHECK(r->text_len <= sizeof(text));
    if (r->text_len)
        KT_CHECK(recv(fd, text, r->text_len, MSG_WAITALL) == (ssize_t)r->text_len);
    return 0;
}

static void raw_send(int fd, uint32_t type, uint64_t id, const void *pre, size_t pre_len,
                     const char *msg)
{
    uint8_t buf[256];
    kvli_shm_msg_hdr_t h = {KVLI_SHM_MSG_MAGIC, type, id, pre_len + strlen(msg)};
    memcpy(buf, &h, sizeof(h));
    if (pre_len > 0)
        memcpy(buf + sizeof(h), pre, pre_len);
    memcpy(buf + sizeof(h) + pre_len, msg, strlen(msg));
    KT_CHECK(send(fd, buf, sizeof(h) + pre_len + strlen(msg), MSG_NOSIGNAL) > 0);
}

/*
 * A peer that sends more than it was granted (an attacker, or a bug) is cut
 * off; nothing of it passes the bound: NOTIF_GRANTED with no grant, and a
 * NOTIF giving back more slots than it holds, each drop the connection.
 */
static void nb_raw_shm(void)
{
    const nb_path_t *p = &paths[0];
    kvl_agent_t *t = nb_agent(p, "nb-target", 0, 0);
    kvli_shm_msg_notif_t nm = {0, 0};
    kvli_shm_msg_reply_t r;

    int fd = raw_connect(t);
    raw_send(fd, KVLI_SHM_MSG_NOTIF_GRANTED, 0, NULL, 0, "free ride");
    KT_CHECK(raw_closed(fd, &r) == 1);
    close(fd);

    /* answered: queued, and a grant comes with the answer */
    fd = raw_connect(t);
    raw_send(fd, KVLI_SHM_MSG_NOTIF, 7, &nm, sizeof(nm), "asked");
    KT_CHECK(raw_closed(fd, &r) == 0 && r.status == KVL_OK && r.payload > 0);
    uint64_t granted = r.payload;
    for (uint64_t i = 0; i < granted; i++)
        raw_send(fd, KVLI_SHM_MSG_NOTIF_GRANTED, 0, NULL, 0, "granted");
    raw_send(fd, KVLI_SHM_MSG_NOTIF_GRANTED, 0, NULL, 0, "one too many");
    KT_CHECK(raw_closed(fd, &r) == 1);
    close(fd);

    fd = raw_connect(t);
    raw_send(fd, KVLI_SHM_MSG_NOTIF, 8, &nm, sizeof(nm), "asked");
    KT_CHECK(raw_closed(fd, &r) == 0 && r.status == KVL_OK);
    nm.surrender = (uint32_t)r.payload + 1;
    raw_send(fd, KVLI_SHM_MSG_NOTIF, 9, &nm, sizeof(nm), "gives back too much");
    KT_CHECK(raw_closed(fd, &r) == 1);
    close(fd);

    kvl_notif_queue_info_t q = nb_info(t);
    printf("shm: a raw peer past its grant (%llu slots) is cut off: %llu queued, %llu "
           "reserved after it left\n", (unsigned long long)granted, (unsigned long long)q.msgs,
           (unsigned long long)q.reserved_msgs);
    KT_CHECK(q.msgs == 2 + granted && q.reserved_msgs == 0);
    KT_CHECK(nb_take(t, 1000) == 2 + granted);
    kvl_agent_destroy(t);
}

/* Which sanitizer this build runs under (gcc defines the macros, clang
 * answers __has_feature). */
#if defined(__SANITIZE_THREAD__)
#define NB_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NB_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define NB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NB_ASAN 1
#endif
#endif
#ifndef NB_TSAN
#define NB_TSAN 0
#endif
#ifndef NB_ASAN
#define NB_ASAN 0
#endif

static int nb_sanitized(void)
{
    return NB_ASAN || NB_TSAN;
}

/* UCX's transports hand data and completions over through atomics in
 * libucp, which ThreadSanitizer does not instrument: every put it delivers
 * looks like a race with the reader. The ucx path runs in the other builds. */
static int nb_tsan(void)
{
    return NB_TSAN;
}

static long rss_kib(void)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");
    KT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &v) == 1)
            break;
    fclose(f);
    return v;
}

static void nb_flood(const nb_path_t *p)
{
    kvl_agent_t *t = nb_agent_pct(p, "nb-target", 0, 0, 0); /* the defaults */
    kvl_agent_t *s = nb_agent(p, "nb-sender", 0, 0);
    static char msg[KVL_NOTIF_MAX];
    unsigned ok = 0, full = 0;
    nb_connect(s, t);
    memset(msg, 'f', sizeof(msg));
    long before = rss_kib();
    for (unsigned i = 0; i < (256u << 20) / sizeof(msg); i++) {
        kvl_status_t st = kvl_notif_send(s, "nb-target", msg, sizeof(msg));
        if (st == KVL_OK)
            ok++;
        else if (st == KVL_ERR_REMOTE_FULL)
            full++;
        else
            KT_OK(st);
    }
    long after = rss_kib();
    kvl_notif_queue_info_t q = nb_info(t);
    printf("%s: 256 MiB of 64 KiB notifications at a target that takes none: %u queued, %u "
           "refused; the queue holds %llu bytes (bound %llu); RSS %ld -> %ld MiB\n", p->name,
           ok, full, (unsigned long long)q.bytes, (unsigned long long)q.max_bytes, before >> 10,
           after >> 10);
    /* one peer's share of the default bound: half of 64 MiB */
    KT_CHECK(q.max_peer_bytes == KVL_NOTIF_QUEUE_BYTES_DEFAULT / 2);
    KT_CHECK(ok == 512 && q.msgs == 512 && q.bytes == q.max_peer_bytes && full == 3584);
    KT_CHECK(q.refused == full && q.reserved_bytes == 0);
    /* RSS says nothing under a sanitizer (shadow memory, ASan's quarantine of
     * freed blocks): the queue's own count above holds there too */
    if (!nb_sanitized())
        KT_CHECK(after - before <= (long)((KVL_NOTIF_QUEUE_BYTES_DEFAULT >> 11) + (48 << 10)));
    KT_CHECK(nb_take(t, 2000) == ok);
    KT_OK(kvl_notif_send(s, "nb-target", msg, sizeof(msg)));
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
}

int main(void)
{
    unsigned ran = 0;
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        const nb_path_t *p = &paths[i];
        char why[512];
        if (kvl_backend_available(p->backend, why, sizeof(why)) != KVL_OK) {
            if (strcmp(p->backend, "cuda") != 0 && strcmp(p->backend, "ucx") != 0) {
                fprintf(stderr, "%s backend not available: %s\n", p->backend, why);
                return 1;
            }
            printf("%s: skipped, the %s backend is not available here: %s\n", p->name,
                   p->backend, why);
            continue;
        }
        if (strcmp(p->backend, "ucx") == 0 && nb_tsan()) {
            printf("%s: skipped under ThreadSanitizer: libucp is not instrumented, its puts "
                   "look like races\n", p->name);
            continue;
        }
        nb_count(p);
        nb_bytes(p);
        nb_xfer(p);
        nb_grant(p);
        nb_threads(p);
        nb_share(p);
        nb_flood(p);
        printf("%s: bounded, refusals reach the sender\n", p->name);
        ran++;
    }
    KT_CHECK(ran >= 2);
    nb_raw_shm();
    return 0;
}
