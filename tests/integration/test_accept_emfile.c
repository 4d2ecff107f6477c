/*
 * Out of file descriptors while accepting (src/common/accept.c): a
 * connection waits on the tcp data port, the shm socket and the agent
 * listener while accept4() fails with EMFILE, as it does when the process's
 * descriptor table is full, and the connection stays pending (the socket
 * stays readable). The failure is the wrapped accept4's own, for as long as
 * the test says: filling the real table raced with the agents' threads,
 * which open and close descriptors (one that closed let an accept through
 * mid-shortage).
 * The threads that accept must pause rather than spin: accept4() is called
 * a few times per second per socket (every 100 ms), not thousands, and each
 * socket logs one WARN; once descriptors are free again, each says so
 * (INFO) and serves: a fetch from the listener, a write over tcp and a load
 * and write over shm succeed.
 * The only time-based check bounds the accept4() calls from above by what
 * the paused threads can make in the time that passed (measured), so a
 * slow machine cannot make it fail; a spinning thread makes thousands.
 * KVL_TEST_WRAP: accept4
 * KVL_TEST_LABELS: tcp shm listener
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/inet.h"

#define LEN 4096u

int __real_accept4(int fd, struct sockaddr *sa, socklen_t *sl, int flags);
int __wrap_accept4(int fd, struct sockaddr *sa, socklen_t *sl, int flags);

static atomic_long n_accept, n_emfile;

static atomic_int starve; /* 1: every accept4() fails with EMFILE, taking nothing */

int __wrap_accept4(int fd, struct sockaddr *sa, socklen_t *sl, int flags)
{
    atomic_fetch_add(&n_accept, 1);
    if (atomic_load(&starve)) {
        atomic_fetch_add(&n_emfile, 1);
        errno = EMFILE;
        return -1;
    }
    return __real_accept4(fd, sa, sl, flags);
}

/* WARN (out of descriptors) and INFO (accepting again) lines per socket:
 * tcp, shm, listener. */
enum { K_TCP, K_SHM, K_LSN, K_N };
static atomic_int n_warn[K_N], n_info[K_N];

static int kind_of(const char *msg)
{
    if (strncmp(msg, "tcp ", 4) == 0)
        return K_TCP;
    if (strncmp(msg, "shm socket ", 11) == 0)
        return K_SHM;
    if (strstr(msg, "': listener ") != NULL)
        return K_LSN;
    return -1;
}

static void log_cb(kvl_log_level_t level, const char *comp, const char *msg, void *arg)
{
    int k = kind_of(msg);
    if (k >= 0 && level == KVL_LOG_WARN && strstr(msg, ": accept4() = -1 EMFILE") != NULL &&
        atomic_fetch_add(&n_warn[k], 1) == 0)
        printf("log: %s: %s\n", comp, msg);
    if (k >= 0 && level == KVL_LOG_INFO && strstr(msg, ": accepting connections again") != NULL &&
        atomic_fetch_add(&n_info[k], 1) == 0)
        printf("log: %s: %s\n", comp, msg);
    kt_log_cb(level, comp, msg, arg);
}

static int all_logged(atomic_int *n)
{
    return atomic_load(&n[K_TCP]) > 0 && atomic_load(&n[K_SHM]) > 0 &&
           atomic_load(&n[K_LSN]) > 0;
}

/* The tcp data port of agent "tgt" as ai sees it (ai loads and drops it). */
static void tcp_data_addr(kvl_agent_t *ai, kvl_agent_t *t, struct sockaddr_in *dst)
{
    char d[512], host[64];
    uint16_t port;
    kt_md_load_from(ai, t);
    kvl_remote_describe(ai, "tgt", d, sizeof(d));
    char *p = strstr(d, "socket "), *sp = p ? strchr(p + 7, ' ') : NULL;
    KT_CHECK(p != NULL && sp != NULL);
    *sp = '\0';
    KT_CHECK(kvli_tcp_hostport_split(p + 7, host, sizeof(host), &port) == 0);
    KT_OK(kvl_remote_remove(ai, "tgt"));
    memset(dst, 0, sizeof(*dst));
    dst->sin_family = AF_INET;
    dst->sin_port = htons(port);
    KT_CHECK(inet_pton(AF_INET, host, &dst->sin_addr) == 1);
}

static void hp_addr(const char *hp, struct sockaddr_in *dst)
{
    char host[64];
    uint16_t port;
    KT_CHECK(kvli_tcp_hostport_split(hp, host, sizeof(host), &port) == 0);
    memset(dst, 0, sizeof(*dst));
    dst->sin_family = AF_INET;
    dst->sin_port = htons(port);
    KT_CHECK(inet_pton(AF_INET, host, &dst->sin_addr) == 1);
}

int main(void)
{
    kvl_log_set_level(KVL_LOG_INFO);
    kvl_log_set_callback(log_cb, NULL);

    /* targets: tcp (with a listener), shm; initiators of each */
    kvl_agent_t *t = kt_agent_tmo("tgt", "tcp", "host=127.0.0.1", 20000);
    kvl_agent_t *s = kt_agent_tmo("stgt", "shm", NULL, 20000);
    kvl_agent_t *ai = kt_agent_tmo("init", "tcp", "host=127.0.0.1", 20000);
    kvl_agent_t *as = kt_agent_tmo("sinit", "shm", NULL, 20000);
    char la[128];
    KT_OK(kvl_agent_listen(t, "127.0.0.1", 0, la, sizeof(la)));
    uint8_t *tbuf = calloc(1, LEN), *sbuf = calloc(1, LEN), *abuf = malloc(LEN);
    KT_CHECK(tbuf != NULL && sbuf != NULL && abuf != NULL);
    kvl_mem_desc_t td = {(uint64_t)(uintptr_t)tbuf, LEN, KVL_DEV_ANY};
    kvl_mem_desc_t sd = {(uint64_t)(uintptr_t)sbuf, LEN, KVL_DEV_ANY};
    kvl_mem_desc_t ad = {(uint64_t)(uintptr_t)abuf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &td, 1, NULL, NULL));
    KT_OK(kvl_mem_register(s, &sd, 1, NULL, NULL));
    KT_OK(kvl_mem_register(ai, &ad, 1, NULL, NULL));
    KT_OK(kvl_mem_register(as, &ad, 1, NULL, NULL));

    /* where each of the three accepts */
    struct sockaddr_in tcp_dst, lsn_dst;
    tcp_data_addr(ai, t, &tcp_dst);
    hp_addr(la, &lsn_dst);
    struct sockaddr_un shm_dst;
    char sname[96];
    snprintf(sname, sizeof(sname), "kvlane-shm-%d-%016" PRIx64, (int)getpid(),
             kvl_agent_incarnation(s));
    memset(&shm_dst, 0, sizeof(shm_dst));
    shm_dst.sun_family = AF_UNIX;
    memcpy(shm_dst.sun_path + 1, sname, strlen(sname));
    socklen_t shm_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sname));

    /* the client sockets first: connecting takes no descriptor */
    int ct = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int cl = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int cs = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(ct >= 0 && cl >= 0 && cs >= 0);

    /* out of descriptors, as far as accept4() says */
    atomic_store(&starve, 1);

    /* connect: each pending connection makes its socket readable */
    atomic_store(&n_accept, 0);
    atomic_store(&n_emfile, 0);
    uint64_t t0 = kt_now_ms();
    KT_CHECK(connect(ct, (struct sockaddr *)&tcp_dst, sizeof(tcp_dst)) == 0);
    KT_CHECK(connect(cl, (struct sockaddr *)&lsn_dst, sizeof(lsn_dst)) == 0);
    KT_CHECK(connect(cs, (struct sockaddr *)&shm_dst, shm_len) == 0);
    usleep(1000000);
    long calls = atomic_load(&n_accept), emfile = atomic_load(&n_emfile);
    uint64_t el = kt_now_ms() - t0;
    /* paused: at most one try per socket per 100 ms, 3 sockets, plus the
     * first tries; 60 per second is twice that */
    long bound = (long)(el * 60 / 1000) + 10;
    printf("accept4(): %ld calls (%ld EMFILE) in %llu ms while out of descriptors "
           "(bound %ld)\n", calls, emfile, (unsigned long long)el, bound);
    KT_CHECK(calls < bound);
    for (int i = 0; i < 3000 && !all_logged(n_warn); i++) /* a bound for a hang: 60 s */
        usleep(20000);
    printf("WARN lines: tcp %d, shm %d, listener %d\n", atomic_load(&n_warn[K_TCP]),
           atomic_load(&n_warn[K_SHM]), atomic_load(&n_warn[K_LSN]));
    KT_CHECK(atomic_load(&n_warn[K_TCP]) == 1);
    KT_CHECK(atomic_load(&n_warn[K_SHM]) == 1);
    KT_CHECK(atomic_load(&n_warn[K_LSN]) == 1);
    KT_CHECK(atomic_load(&n_info[K_TCP]) + atomic_load(&n_info[K_SHM]) +
             atomic_load(&n_info[K_LSN]) == 0);

    /* descriptors again: each pending connection is accepted */
    atomic_store(&starve, 0);
    for (int i = 0; i < 3000 && !all_logged(n_info); i++) /* a bound for a hang: 60 s */
        usleep(20000);
    printf("INFO lines: tcp %d, shm %d, listener %d\n", atomic_load(&n_info[K_TCP]),
           atomic_load(&n_info[K_SHM]), atomic_load(&n_info[K_LSN]));
    KT_CHECK(all_logged(n_info));
    KT_CHECK(atomic_load(&n_warn[K_TCP]) == 1 && atomic_load(&n_warn[K_SHM]) == 1 &&
             atomic_load(&n_warn[K_LSN]) == 1);

    /* and they serve: fetch from the listener, write over tcp and shm */
    char name[64];
    KT_OK(kvl_metadata_fetch(ai, la, name, sizeof(name)));
    KT_CHECK(strcmp(name, "tgt") == 0);
    kt_fill(abuf, LEN, 7);
    kt_write_wait(ai, "tgt", abuf, td.addr, LEN, 20000);
    KT_CHECK(memcmp(tbuf, abuf, LEN) == 0);
    kt_md_load_from(as, s);
    kt_fill(abuf, LEN, 8);
    kt_write_wait(as, "stgt", abuf, sd.addr, LEN, 20000);
    KT_CHECK(memcmp(sbuf, abuf, LEN) == 0);
    printf("after the shortage: fetch from %s, tcp and shm writes served\n", la);

    close(ct);
    close(cl);
    close(cs);
    kvl_agent_destroy(as);
    kvl_agent_destroy(ai);
    kvl_agent_destroy(s);
    kvl_agent_destroy(t);
    kvl_log_set_callback(NULL, NULL);
    free(tbuf);
    free(sbuf);
    free(abuf);
    printf("test_accept_emfile: passed\n");
    return 0;
}
