/* Helpers for kvlane's C tests: checks, and a peer agent in a child process. */
#ifndef KVLTEST_H
#define KVLTEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <kvlane/kvlane.h>

void kt_fail_at(const char *file, int line, const char *expr, int with_error);

#define KT_CHECK(cond)                                   \
    do {                                                 \
        if (!(cond))                                     \
            kt_fail_at(__FILE__, __LINE__, #cond, 0);    \
    } while (0)

/* The call must return KVL_OK (prints kvlane's rendered error if not). */
#define KT_OK(call)                                      \
    do {                                                 \
        kvl_status_t kt_st_ = (call);                    \
        if (kt_st_ != KVL_OK)                            \
            kt_fail_at(__FILE__, __LINE__, #call, 1);    \
    } while (0)

/* The call must fail with exactly this status. */
#define KT_STATUS(call, want)                                                        \
    do {                                                                             \
        kvl_status_t kt_st_ = (call);                                                \
        if (kt_st_ != (want)) {                                                      \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__,        \
                    __LINE__, #call, kvl_status_name(kt_st_), kvl_status_name(want)); \
            kt_fail_at(__FILE__, __LINE__, #call, 1);                                \
        }                                                                            \
    } while (0)

/* The reason an etcd test skips in a build without the etcd store. */
#define KT_NO_ETCD_STORE "this build has no etcd store (libcurl, json-c or nghttp2 " \
                         "development files were missing)"

#define KT_SKIP(...)                                     \
    do {                                                 \
        printf("SKIP: ");                                \
        printf(__VA_ARGS__);                             \
        printf("\n");                                    \
        exit(77);                                        \
    } while (0)

/* This process's open file descriptors, and its mappings whose line in
 * /proc/self/maps contains needle (NULL: all): for "nothing grows" checks. */
/* Two network namespaces ("hosts") joined by a veth pair: ns[0] has
 * ip[0] = 10.<x>.<net>.1, ns[1] ip[1] = 10.<x>.<net>.2 on veth[i]. Names
 * carry tag[i] and the pid, so tests running at once never collide. Removed
 * at exit (or kt_netns_remove). Skips (77) when namespaces cannot be made. */
typedef struct kt_netns_pair {
    char ns[2][32], veth[2][16], ip[2][32];
} kt_netns_pair_t;
void kt_netns_pair(kt_netns_pair_t *n, const char tag[2], int net);
void kt_netns_remove(void);
/* This thread (the process, before any thread exists) joins namespace ns. */
void kt_netns_join(const char *ns);
/* into loads from's metadata (two agents of this process), checked KVL_OK. */
void kt_md_load_from(kvl_agent_t *into, kvl_agent_t *from);
/* One WRITE of len bytes from src here to dst at agent `to`, waited for
 * (bounded by wait_ms), checked KVL_OK. */
void kt_write_wait(kvl_agent_t *from, const char *to, const void *src, uint64_t dst,
                   uint64_t len, int wait_ms);
/* A log callback keeping every line (kvl_log_set_callback(kt_log_cb, NULL)),
 * and questions on what it kept: any line containing needle; forget all. */
void kt_log_cb(kvl_log_level_t level, const char *comp, const char *msg, void *arg);
int kt_log_has(const char *needle);
void kt_log_clear(void);
/* Run a shell command (system(3)); its exit status, -1 when it did not exit. */
int kt_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* CLOCK_MONOTONIC in milliseconds (for printing how long things took). */
uint64_t kt_now_ms(void);
int kt_count_fds(void);
int kt_count_maps(const char *needle);

/* The last error's rendered text contains needle. */
int kt_error_has(const char *needle);
#define KT_ERROR_HAS(needle)                                                    \
    do {                                                                        \
        if (!kt_error_has(needle)) {                                            \
            fprintf(stderr, "%s:%d: error text lacks \"%s\"\n", __FILE__,       \
                    __LINE__, needle);                                          \
            kt_fail_at(__FILE__, __LINE__, "error text", 1);                    \
        }                                                                       \
    } while (0)

/* Length-prefixed messages over a pipe or socket between test processes:
 * send exits the process (status 3) when the peer is gone; recv returns a
 * NUL-terminated copy (free it), NULL on EOF or after timeout_ms (-1: no
 * bound). */
void kt_send_msg(int fd, const void *buf, uint64_t len);
void *kt_recv_msg(int fd, uint64_t *len, int timeout_ms);

/* Run fn(arg) in a child whose stderr is captured; fail unless it exits 0
 * and its stderr has none of the teardown complaints (UCX's "destroying
 * inuse", leaks, sanitizer reports). Prints label and the stderr. */
void kt_clean_exit(void (*fn)(int), int arg, const char *label);
/* Under AddressSanitizer UCX's mmap hooks break LeakSanitizer's tracer at
 * exit ("Tracer caught signal 11"): turn them off (peers inherit it). */
void kt_ucx_sanitizer_env(void);
/* The ucx tests' start: kt_ucx_sanitizer_env(), then skip (77) with the
 * reason when the ucx backend is not available, else print what it has. */
void kt_need_ucx(void);
/* UCX's own definition of a function the test stands in for
 * (KVL_TEST_INTERPOSE), from the libucp the ucx module loaded; aborts,
 * saying so, when there is none. */
void *kt_ucx_real(const char *name);

/* Deterministic pattern for checking bytes. */
void kt_fill(void *p, size_t len, uint64_t seed);
/* One transfer of n blocks of len between memory of kind on device dev (block
 * i at base + loff[i]) and agent a's own file fd (at offset foff[i]), waited
 * for (at most 120 s); the path it took into path (cap bytes, "" unless it
 * completed). Its status. */
kvl_status_t kt_file_move(kvl_agent_t *a, kvl_xfer_op_t op, kvl_mem_kind_t kind, int32_t dev,
                          uint64_t base, const uint64_t *loff, const uint64_t *foff, size_t n,
                          uint64_t len, int fd, char *path, size_t cap);
/* Offset of the first byte that differs from kt_fill(seed), or -1. */
long kt_verify(const void *p, size_t len, uint64_t seed);

/* ---- a peer agent in a child process ---- */
typedef struct kt_peer {
    pid_t pid;
    int to, from;           /* command pipes */
    uint64_t base;          /* its registered buffer */
    size_t len;
    char name[64];
} kt_peer_t;

typedef struct kt_peer_opts {
    const char *name;
    size_t len;              /* buffer registered on the peer */
    int shareable;           /* 1: buffer from kvl_mem_alloc; 2: allocated by the
                                peer's backend (kvl_mem_alloc_ex) */
    const char *backend;     /* default "shm" */
    const char *params;      /* backend "k=v,k=v" */
    int non_dumpable;        /* prctl(PR_SET_DUMPABLE, 0) before anything */
    uint64_t timeout_ms;     /* the peer agent's bound on waits; 0: 3000 */
} kt_peer_opts_t;

/* Start the peer; it registers its buffer and sends its metadata, which is
 * loaded into agent (when not NULL). */
void kt_peer_start(kt_peer_t *p, const kt_peer_opts_t *o, kvl_agent_t *agent);
/* Commands (each waits for the peer's answer, bounded). */
void kt_peer_fill(kt_peer_t *p, uint64_t seed);                     /* whole buffer */
long kt_peer_verify(kt_peer_t *p, uint64_t off, uint64_t len, uint64_t seed);
void kt_peer_read(kt_peer_t *p, uint64_t off, void *buf, uint64_t len);
/* The peer deregisters its buffer and, if that worked, fills it with the
 * pattern of seed; returns the deregistration's status. */
kvl_status_t kt_peer_dereg(kt_peer_t *p, uint64_t seed);
/* The peer deregisters its buffer and registers it again as two regions
 * that touch at offset cut; returns the status (metadata must be fetched
 * again: kt_peer_metadata). */
kvl_status_t kt_peer_split(kt_peer_t *p, uint64_t cut);
/* The peer WRITEs its whole buffer to agent `to` at raddr in a loop until a
 * transfer fails (it must have loaded to's metadata: kt_peer_load). Returns
 * once the loop started; the peer answers no other command meanwhile. */
void kt_peer_write_loop(kt_peer_t *p, const char *to, uint64_t raddr);
/* Wait for one notification on the peer; returns its length (-1 timeout),
 * message copied to buf, sender to from. */
long kt_peer_notif(kt_peer_t *p, int timeout_ms, char *buf, size_t cap, char *from, size_t fcap);
/* Number of notifications waiting on the peer right now. */
long kt_peer_notif_count(kt_peer_t *p);
/* Fresh metadata of the peer (malloc'ed). */
void *kt_peer_metadata(kt_peer_t *p, size_t *len);
/* Send my metadata so the peer can load it (for notifications back). */
void kt_peer_load(kt_peer_t *p, const void *blob, size_t len);
void kt_peer_notify(kt_peer_t *p, const char *to, const char *msg);
void kt_peer_stop(kt_peer_t *p);        /* orderly */
void kt_peer_kill(kt_peer_t *p);        /* SIGKILL */
/* SIGSTOP, returning once every thread of the peer has stopped. */
void kt_peer_stop_signal(kt_peer_t *p);

/* An agent with no default backends, then backend (if any) created with
 * params "k=v,k=v"; its bound on waits for a peer is 3000 ms, or timeout_ms. */
kvl_agent_t *kt_agent(const char *name, const char *backend, const char *params);
kvl_agent_t *kt_agent_tmo(const char *name, const char *backend, const char *params,
                          uint64_t timeout_ms);

#endif
