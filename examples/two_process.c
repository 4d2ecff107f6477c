/*
 * Minimal kvlane program: a decode process exposes a buffer, a prefill
 * process writes into it with a notification attached, the decode process
 * checks the bytes when the notification arrives.
 *
 *   cc two_process.c $(pkg-config --cflags --libs kvlane) -o two_process
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <kvlane/kvlane.h>

#define LEN (16u << 20)

static int check(kvl_status_t st, const char *what)
{
    if (st == KVL_OK || st == KVL_IN_PROGRESS)
        return 0;
    char buf[4096];
    kvl_error_render(kvl_last_error(), buf, sizeof(buf));
    fprintf(stderr, "%s failed:\n%s\n", what, buf);
    exit(1);
}

static void decode(int to_prefill)
{
    kvl_agent_t *agent;
    void *kv;
    void *blob;
    size_t len;

    check(kvl_agent_create("decode", NULL, &agent), "kvl_agent_create");
    /* Shareable memory lets the shm backend copy with plain memcpy. */
    check(kvl_mem_alloc(agent, LEN, &kv), "kvl_mem_alloc");
    kvl_mem_desc_t region = {(uint64_t)(uintptr_t)kv, LEN, KVL_DEV_ANY};
    check(kvl_mem_register(agent, &region, 1, NULL, NULL), "kvl_mem_register");

    /* Hand our metadata to the prefill side (any channel will do). */
    check(kvl_metadata_get(agent, &blob, &len), "kvl_metadata_get");
    if (write(to_prefill, &len, sizeof(len)) != sizeof(len) ||
        write(to_prefill, blob, len) != (ssize_t)len)
        exit(1);
    kvl_free(blob);

    /* The notification arrives only once the data is in place. */
    check(kvl_notif_wait(agent, 10000), "kvl_notif_wait");
    kvl_notif_t n;
    size_t got;
    check(kvl_notif_poll(agent, &n, 1, &got), "kvl_notif_poll");
    unsigned char *p = kv;
    for (size_t i = 0; i < LEN; i++)
        if (p[i] != (unsigned char)(i * 7)) {
            fprintf(stderr, "decode: byte %zu is wrong\n", i);
            exit(1);
        }
    printf("decode: '%.*s' from %s, %u MiB verified\n", (int)n.len, (char *)n.msg, n.from,
           LEN >> 20);
    kvl_notif_free(&n);
    kvl_agent_destroy(agent);
}

static void prefill(int from_decode)
{
    kvl_agent_t *agent;
    size_t len;
    char remote[KVL_NAME_MAX];

    check(kvl_agent_create("prefill", NULL, &agent), "kvl_agent_create");
    unsigned char *kv = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        kv[i] = (unsigned char)(i * 7);
    kvl_mem_desc_t region = {(uint64_t)(uintptr_t)kv, LEN, KVL_DEV_ANY};
    check(kvl_mem_register(agent, &region, 1, NULL, NULL), "kvl_mem_register");

    if (read(from_decode, &len, sizeof(len)) != sizeof(len))
        exit(1);
    char *blob = malloc(len);
    for (size_t off = 0; off < len;) {
        ssize_t r = read(from_decode, blob + off, len - off);
        if (r <= 0)
            exit(1);
        off += (size_t)r;
    }
    check(kvl_metadata_load(agent, blob, len, remote, sizeof(remote)), "kvl_metadata_load");
    free(blob);

    /* Where the remote buffer is: from the loaded metadata. */
    kvl_mem_desc_t rregion;
    size_t nr;
    check(kvl_remote_regions(agent, remote, &rregion, NULL, 1, &nr), "kvl_remote_regions");

    /* Two blocks of 8 MiB each, written in one transfer. */
    kvl_dlist_t *local, *dst;
    check(kvl_dlist_create(KVL_MEM_DRAM, 2, &local), "kvl_dlist_create");
    check(kvl_dlist_create(KVL_MEM_DRAM, 2, &dst), "kvl_dlist_create");
    check(kvl_dlist_add_strided(local, region.addr, LEN / 2, 2, LEN / 2, KVL_DEV_ANY), "add");
    check(kvl_dlist_add_strided(dst, rregion.addr, LEN / 2, 2, LEN / 2, KVL_DEV_ANY), "add");
    kvl_xfer_params_t params = {.field_mask = KVL_XFER_PARAM_NOTIF,
                                .notif = "kv-ready", .notif_len = 8};
    kvl_xfer_t *xfer;
    check(kvl_xfer_create(agent, KVL_WRITE, local, remote, dst, &params, &xfer), "kvl_xfer_create");
    check(kvl_xfer_post(xfer), "kvl_xfer_post");
    check(kvl_xfer_wait(xfer, 10000), "kvl_xfer_wait");
    printf("prefill: wrote %u MiB to %s\n", LEN >> 20, remote);
    kvl_xfer_release(xfer);
    kvl_dlist_destroy(local);
    kvl_dlist_destroy(dst);
    kvl_agent_destroy(agent);
    free(kv);
}

int main(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        decode(fds[1]);
        fflush(NULL);
        _exit(0);
    }
    close(fds[1]);
    prefill(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
