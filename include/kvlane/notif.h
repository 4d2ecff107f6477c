/* kvlane: notifications, small messages between agents. */
#ifndef KVLANE_NOTIF_H
#define KVLANE_NOTIF_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVL_NOTIF_MAX 65536

typedef struct kvl_notif {
    char from[KVL_NAME_MAX];
    size_t len;
    unsigned char *msg;       /* len bytes, followed by a NUL for convenience */
} kvl_notif_t;

/* Send a message to a loaded remote agent, over the first backend of both
 * that carries notifications. Returns once the remote agent queued it, or,
 * for a small one (<= 1 KiB) the shm or tcp backend sends within the room
 * the remote granted it, once it is on its way to that room (it is queued
 * for sure unless the remote dies): KVL_ERR_REMOTE_FULL when its queue is
 * full (its application has not taken its notifications: see
 * kvl_notif_queue_info). */
kvl_status_t kvl_notif_send(kvl_agent_t *agent, const char *remote,
                            const void *msg, size_t len);

/*
 * Take up to max received notifications in arrival order. *n_p gets how
 * many; each msg must be freed with kvl_notif_free(). Never blocks.
 */
kvl_status_t kvl_notif_poll(kvl_agent_t *agent, kvl_notif_t *out, size_t max,
                            size_t *n_p);

/* Block until a notification arrives or timeout_ms passes (-1 forever).
 * KVL_OK when one is waiting, KVL_ERR_TIMEOUT otherwise. */
kvl_status_t kvl_notif_wait(kvl_agent_t *agent, int64_t timeout_ms);

void kvl_notif_free(kvl_notif_t *n);

/*
 * The queue of received notifications the application has not taken yet,
 * and its bound (kvl_agent_config_t notif_max_bytes / notif_max_msgs). A
 * notification that would take msgs past max_msgs or bytes (message bytes)
 * past max_bytes, or the sender's holdings past max_peer_msgs or
 * max_peer_bytes (its share), is refused and its sender gets
 * KVL_ERR_REMOTE_FULL; refused counts them since the agent was created.
 */
typedef struct kvl_notif_queue_info {
    uint64_t msgs, bytes;
    uint64_t max_msgs, max_bytes;
    uint64_t refused;
    /* Room reserved for peers (shm, tcp) so that they need not wait for an answer
     * to each small notification: counted in the bound (msgs + reserved_msgs
     * <= max_msgs, bytes + reserved_bytes <= max_bytes). At most 256
     * notifications of 1 KiB per peer, and no more than 1/256 of the bound. */
    uint64_t reserved_msgs, reserved_bytes;
    /* One sending agent's share of the bound (notif_peer_percent). */
    uint64_t max_peer_msgs, max_peer_bytes;
} kvl_notif_queue_info_t;

kvl_status_t kvl_notif_queue_info(kvl_agent_t *agent, kvl_notif_queue_info_t *info);

#ifdef __cplusplus
}
#endif
#endif
