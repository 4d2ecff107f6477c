/* kvlane: the agent, one per process or per engine rank. */
#ifndef KVLANE_AGENT_H
#define KVLANE_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvl_agent kvl_agent_t;
typedef struct kvl_backend kvl_backend_t;

/* A key=value parameter for backends (all values are strings). */
typedef struct kvl_param {
    const char *key;
    const char *value;
} kvl_param_t;

enum {
    KVL_AGENT_CFG_BACKENDS = 1u << 0,   /* create_backends is set */
    KVL_AGENT_CFG_TIMEOUT = 1u << 1,    /* timeout_ms is set */
    KVL_AGENT_CFG_WORKERS = 1u << 2,    /* workers is set */
    KVL_AGENT_CFG_SECRET = 1u << 3,     /* secret is set */
    KVL_AGENT_CFG_NOTIF_BOUND = 1u << 4, /* notif_max_bytes, notif_max_msgs are set */
    KVL_AGENT_CFG_NOTIF_SHARE = 1u << 5  /* notif_peer_percent is set */
};

#define KVL_NOTIF_QUEUE_BYTES_DEFAULT (64ull << 20)
#define KVL_NOTIF_QUEUE_MSGS_DEFAULT 65536u
#define KVL_NOTIF_PEER_PERCENT_DEFAULT 50u

/*
 * Agent configuration. Set field_mask to the fields you filled in; other
 * fields take their defaults, so new fields never break old callers.
 */
typedef struct kvl_agent_config {
    uint64_t field_mask;
    /* Comma-separated backends created with default parameters at agent
     * creation ("" for none). Default: "shm". */
    const char *create_backends;
    /* Bound for any wait on a peer (connect, reply, cancel); default 5000. */
    uint64_t timeout_ms;
    /* Copy threads per backend that uses them; default 1. */
    unsigned workers;
    /* Shared secret (NUL-terminated) that the listener and network data
     * connections require from peers; default none. */
    const char *secret;
    /* Bound of the notifications received and not yet taken by the
     * application (kvl_notif_poll): total message bytes and message count
     * (0: the default, KVL_NOTIF_QUEUE_BYTES_DEFAULT = 64 MiB and
     * KVL_NOTIF_QUEUE_MSGS_DEFAULT = 65536). A notification that would pass
     * either is refused: its sender gets KVL_ERR_REMOTE_FULL. */
    uint64_t notif_max_bytes;
    uint64_t notif_max_msgs;
    /* The share of either bound one sending agent may hold, in percent
     * (1..100; 0: the default, 50), so that one flooding peer cannot take
     * the room of the others. */
    unsigned notif_peer_percent;
} kvl_agent_config_t;

/*
 * Create an agent. name: 1..63 printable characters, no spaces. A new random
 * incarnation id is drawn at every creation. cfg may be NULL.
 */
kvl_status_t kvl_agent_create(const char *name, const kvl_agent_config_t *cfg,
                              kvl_agent_t **agent_p);

/*
 * Destroy an agent: cancels its transfers, deregisters its memory in reverse
 * order, disconnects from remote agents, then closes backends. Never aborts.
 * Safe with live registrations, remote agents and transfers in flight;
 * transfer and prepared-list handles must not be used afterwards.
 */
void kvl_agent_destroy(kvl_agent_t *agent);

const char *kvl_agent_name(const kvl_agent_t *agent);
uint64_t kvl_agent_incarnation(const kvl_agent_t *agent);

/* Copy the last error any thread saw on this agent into *err. */
void kvl_agent_last_error(kvl_agent_t *agent, kvl_error_t *err);

/* ---- backends ---- */

/* Names of backends this build knows (built in or loadable), NULL-terminated. */
const char *const *kvl_backend_names(void);

/*
 * Whether a backend can be created on this machine; when not, why (reason
 * filled, status returned). Does not create anything.
 */
kvl_status_t kvl_backend_available(const char *name, char *reason, size_t len);

/*
 * Parameters a backend accepts, as a NULL-terminated array of
 * {key, default value}; NULL for an unknown backend.
 */
const kvl_param_t *kvl_backend_params(const char *name);

/* One preflight check's outcome: status 0 ok, 1 warn, 2 fail. */
typedef void (*kvl_probe_cb_t)(void *arg, const char *check, int status, const char *observed,
                               const char *hint);

/*
 * Run a backend's preflight checks (what `kvlane doctor` prints) without
 * creating it; mem/dev/planned_bytes describe the registration the user
 * plans. KVL_ERR_UNSUPPORTED when the backend has no checks of its own.
 */
kvl_status_t kvl_backend_probe(const char *name, kvl_probe_cb_t cb, void *arg, int mem, int32_t dev,
                               uint64_t planned_bytes);

/* Create (open) a backend on the agent. bk_p may be NULL. */
kvl_status_t kvl_backend_create(kvl_agent_t *agent, const char *name,
                                const kvl_param_t *params, size_t n_params,
                                kvl_backend_t **bk_p);

/* Backends created on the agent, in creation order. */
size_t kvl_agent_backends(kvl_agent_t *agent, kvl_backend_t **out, size_t max);
const char *kvl_backend_name(const kvl_backend_t *bk);

#ifdef __cplusplus
}
#endif
#endif
