/*
 * kvlane agent listener: private structures of src/store/.
 *
 * One listener object per agent, a metadata store (store.h) attached on first use by
 * kvl_agent_listen() or kvl_metadata_push(). It holds:
 *   - the listening socket and its accept thread; each accepted connection
 *     is served by a short-lived worker thread (at most KVLI_LSN_WORKERS at
 *     once), every read and write bounded by the agent's timeout;
 *   - the listeners this agent pushed its metadata to ("targets"), and an
 *     updater thread that pushes fresh metadata to them after a
 *     deregistration (INVALIDATE when that fails);
 * and is torn down first in kvl_agent_destroy(), which sends INVALIDATE to
 * every target.
 */
#ifndef KVLI_LISTENER_H
#define KVLI_LISTENER_H

#include <pthread.h>
#include "store.h"

#define KVLI_LSN_WORKERS 32u
#define KVLI_LSN_PER_HOST 16u         /* connections served at once per peer address */
#define KVLI_LSN_AUTH_MS 2000u        /* bound for a connection to authenticate */
#define KVLI_LSN_HP_MAX 280u

typedef struct kvli_listener_target {
    struct kvli_listener_target *next;
    char hp[KVLI_LSN_HP_MAX];
} kvli_listener_target_t;

typedef struct kvli_listener {
    kvl_agent_t *agent;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stopping;
    /* serving */
    int listen_fd;
    char bound[KVLI_LSN_HP_MAX];
    pthread_t accept_thread;
    int accept_started;
    unsigned nworkers;
    int worker_fd[KVLI_LSN_WORKERS];
    char worker_host[KVLI_LSN_WORKERS][64]; /* peer address of each slot, no port */
    /* pushing */
    kvli_listener_target_t *targets;
    pthread_t updater;
    int updater_started;
    int dirty;
} kvli_listener_t;

/* The agent's listener object (created when create is true). */
kvli_listener_t *kvli_listener_get(kvl_agent_t *a, bool create);

/*
 * One request to the listener at host_port (client side, listener_client.c).
 * On KVL_OK, *status_p is the listener's status, text its reason and
 * (FETCH) *body_p a malloc'ed body. A failure to reach or talk to it is
 * returned with err filled.
 */
kvl_status_t kvli_listener_call(kvl_agent_t *a, const char *host_port, uint32_t type,
                                const void *body, size_t len, int32_t *status_p, char *text,
                                size_t text_cap, void **body_p, size_t *len_p, kvl_error_t *err);
/* Push our metadata / send INVALIDATE; err filled on failure. */
kvl_status_t kvli_listener_push_one(kvl_agent_t *a, const char *host_port, kvl_error_t *err);
kvl_status_t kvli_listener_invalidate_one(kvl_agent_t *a, const char *host_port, kvl_error_t *err);

#endif
