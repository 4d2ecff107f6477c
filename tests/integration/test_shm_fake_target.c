/*
 * shm: a target that answers READs wrongly. This process creates an agent,
 * keeps its metadata, destroys it and serves that agent's socket itself (the
 * same pid and incarnation, so the HELLO checks pass), speaking the shm
 * protocol as a broken or hostile target would. A child process loads the
 * metadata with shm over the socket path (cma=off) and READs 4 KiB:
 *   1. a READ_DATA reply that says done but carries no data: the READ must
 *      fail as a protocol error, never complete with its memory unwritten;
 *   2. a reply carrying fewer bytes than asked: the same, at once (not a
 *      wait until the transfer's timeout);
 *   3. the right reply (4 KiB): the READ completes with those bytes, so the
 *      fake speaks the protocol well enough for the refusals above to mean
 *      what they say.
 * Nothing is timed: waits are bounded only so that a hang fails the test.
 */
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "backends/shm/shm_proto.h"

#define LEN 4096u

enum { CASE_EMPTY, CASE_SHORT, CASE_GOOD, NCASES };
static const char *const case_name[NCASES] = {"done with no data", "done with 100 of 4096 bytes",
                                              "done with 4096 bytes"};

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 20000) != 1)
            return -1;
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* The initiator may hang up at any point (it gives up on a bad reply):
 * what it does not read is of no interest. */
static void send_full(int fd, const void *buf, size_t n)
{
    if (n > 0)
        (void)send(fd, buf, n, MSG_NOSIGNAL);
}

/* Serve one connection of the child as the agent `name` would, until it
 * closes: HELLO_ACK without a guard table (so only the socket path), then
 * every READ answered as `how` says. */
static void serve(int fd, const char *name, uint64_t incarnation, int how)
{
    kvli_shm_msg_hdr_t h;
    uint8_t body[4096];
    while (read_full(fd, &h, sizeof(h)) == 0) {
        KT_CHECK(h.magic == KVLI_SHM_MSG_MAGIC && h.len <= sizeof(body));
        KT_CHECK(read_full(fd, body, (size_t)h.len) == 0);
        if (h.type == KVLI_SHM_MSG_HELLO) {
            kvli_shm_msg_hello_t m = {KVLI_SHM_PROTO_VERSION, (uint32_t)strlen(name),
                                      incarnation, (uint32_t)getpid(), 0};
            kvli_shm_msg_hdr_t a = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_HELLO_ACK, 0,
                                    sizeof(m) + strlen(name)};
            send_full(fd, &a, sizeof(a));
            send_full(fd, &m, sizeof(m));
            send_full(fd, name, strlen(name));
        } else if (h.type == KVLI_SHM_MSG_READ) {
            uint64_t n = how == CASE_EMPTY ? 0 : how == CASE_SHORT ? 100 : LEN;
            kvli_shm_msg_reply_t r = {0, 0, n};
            kvli_shm_msg_hdr_t a = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_READ_DATA, h.id,
                                    sizeof(r) + n};
            uint8_t data[LEN];
            kt_fill(data, LEN, 77);
            send_full(fd, &a, sizeof(a));
            send_full(fd, &r, sizeof(r));
            send_full(fd, data, (size_t)n);
        } else if (h.type == KVLI_SHM_MSG_NOTIF) {
            kvli_shm_msg_reply_t r = {0, 0, 0};
            kvli_shm_msg_hdr_t a = {KVLI_SHM_MSG_MAGIC, KVLI_SHM_MSG_NOTIF_ACK, h.id, sizeof(r)};
            send_full(fd, &a, sizeof(a));
            send_full(fd, &r, sizeof(r));
        }
    }
}

/* The child: load the metadata, READ 4 KiB, report the status and error. */
static int initiator(const void *blob, size_t blen, uint64_t raddr, int how)
{
    kvl_agent_t *a = kt_agent_tmo("reader", "shm", "cma=off", 20000);
    uint8_t *buf = calloc(1, LEN);
    KT_CHECK(buf != NULL);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(a, &d, 1, NULL, NULL));
    char name[KVL_NAME_MAX];
    KT_OK(kvl_metadata_load(a, blob, blen, name, sizeof(name)));
    kvl_dlist_t *l, *r;
    kvl_xfer_t *x;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &l));
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 1, &r));
    KT_OK(kvl_dlist_add(l, d.addr, LEN, KVL_DEV_ANY));
    KT_OK(kvl_dlist_add(r, raddr, LEN, KVL_DEV_ANY));
    KT_OK(kvl_xfer_create(a, KVL_READ, l, name, r, NULL, &x));
    kvl_status_t st = kvl_xfer_post(x);
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        st = kvl_xfer_wait(x, 60000);
    char text[2048] = "";
    if (st != KVL_OK)
        kvl_error_render(NULL, text, sizeof(text));
    printf("  %s: %s%s%.400s\n", case_name[how], kvl_status_name(st), st ? ": " : "", text);
    if (how == CASE_GOOD) {
        KT_OK(st);
        KT_CHECK(kt_verify(buf, LEN, 77) == -1);
    } else {
        KT_CHECK(st != KVL_OK && st != KVL_ERR_TIMEOUT);
        KT_CHECK(strstr(text, "protocol error: READ_DATA reply") != NULL);
        KT_CHECK(strstr(text, how == CASE_EMPTY ? "carries 0 bytes" : "carries 100 bytes") !=
                 NULL);
    }
    kvl_xfer_release(x);
    kvl_dlist_destroy(l);
    kvl_dlist_destroy(r);
    kvl_agent_destroy(a);
    free(buf);
    return 0;
}

static void one_case(int how)
{
    char name[32];
    snprintf(name, sizeof(name), "fake-%d", how);
    kvl_agent_t *t = kt_agent_tmo(name, "shm", NULL, 20000);
    uint8_t *tbuf = calloc(1, LEN);
    KT_CHECK(tbuf != NULL);
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)tbuf, LEN, KVL_DEV_ANY};
    KT_OK(kvl_mem_register(t, &d, 1, NULL, NULL));
    void *blob;
    size_t blen;
    KT_OK(kvl_metadata_get(t, &blob, &blen));
    uint64_t inc = kvl_agent_incarnation(t);
    KT_OK(kvl_mem_deregister(t, &d, 1));
    kvl_agent_destroy(t); /* its socket is ours to serve now */

    char sock[96];
    snprintf(sock, sizeof(sock), "kvlane-shm-%d-%016" PRIx64, (int)getpid(), inc);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path + 1, sock, strlen(sock));
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KT_CHECK(ls >= 0);
    KT_CHECK(bind(ls, (struct sockaddr *)&sa,
                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sock))) == 0);
    KT_CHECK(listen(ls, 4) == 0);

    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        close(ls);
        int rc = initiator(blob, blen, d.addr, how);
        fflush(stdout);
        _exit(rc);
    }
    struct pollfd p = {ls, POLLIN, 0};
    KT_CHECK(poll(&p, 1, 60000) == 1);
    int fd = accept(ls, NULL, NULL);
    KT_CHECK(fd >= 0);
    serve(fd, name, inc, how);
    close(fd);
    close(ls);
    int status;
    KT_CHECK(waitpid(pid, &status, 0) == pid);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kvl_free(blob);
    free(tbuf);
}

int main(void)
{
    for (int how = 0; how < NCASES; how++)
        one_case(how);
    printf("test_shm_fake_target: passed\n");
    return 0;
}
