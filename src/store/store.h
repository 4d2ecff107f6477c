/*
 * kvlane metadata stores: how agents publish and find each other's metadata.
 *
 * The core knows no store. A store (the listener, etcd) attaches its state
 * to an agent through kvli_store_attach(); store.c keeps the set on the
 * agent (agent->stores), sets the core's hooks once and forwards each hook
 * to every attached store, in the order they attached (destroy: reverse).
 * Every store is an ops table plus an opaque state pointer, as the backends
 * are.
 */
#ifndef KVLI_STORE_H
#define KVLI_STORE_H

#include "core/internal.h"

#define KVLI_STORES_MAX 4u

typedef struct kvli_store_ops {
    const char *name; /* "listener", "etcd" */
    /* Creates the state (called under agent->lock: must not take it). NULL
     * when out of memory. */
    void *(*create)(kvl_agent_t *a);
    /* First in kvl_agent_destroy: tell peers, stop threads, free the state. */
    void (*destroy)(kvl_agent_t *a, void *state);
    /* After a deregistration: peers holding our metadata get the new one. */
    void (*regions_changed)(kvl_agent_t *a, void *state);
} kvli_store_ops_t;

/*
 * The state of the store `ops` on agent a; created (ops->create) when absent
 * and create is true. NULL when absent (create false), out of memory, or the
 * agent already has KVLI_STORES_MAX stores.
 */
void *kvli_store_state(kvl_agent_t *a, const kvli_store_ops_t *ops, bool create);

#endif
