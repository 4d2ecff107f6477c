/* The set of metadata stores attached to an agent, and the core's hooks
 * forwarded to each (see store.h). */
#include <stdlib.h>
#include "store.h"

struct kvli_stores {
    unsigned n;
    const kvli_store_ops_t *ops[KVLI_STORES_MAX];
    void *state[KVLI_STORES_MAX];
};

static void kvli_stores_destroy(kvl_agent_t *a);
static void kvli_stores_regions_changed(kvl_agent_t *a);

static const kvli_agent_hooks_t kvli_store_hooks = {
    .destroy = kvli_stores_destroy,
    .regions_changed = kvli_stores_regions_changed,
};

void *kvli_store_state(kvl_agent_t *a, const kvli_store_ops_t *ops, bool create)
{
    void *st = NULL;
    pthread_mutex_lock(&a->lock);
    struct kvli_stores *s = a->stores;
    for (unsigned i = 0; s != NULL && i < s->n; i++)
        if (s->ops[i] == ops)
            st = s->state[i];
    if (st == NULL && create) {
        if (s == NULL && (s = calloc(1, sizeof(*s))) != NULL) {
            a->stores = s;
            a->hooks = &kvli_store_hooks;
        }
        if (s != NULL && s->n < KVLI_STORES_MAX && (st = ops->create(a)) != NULL) {
            s->ops[s->n] = ops;
            s->state[s->n++] = st;
        }
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}

/* The stores attached now (a copy: a store may attach while we call). */
static unsigned kvli_stores_snapshot(kvl_agent_t *a, const kvli_store_ops_t **ops, void **state)
{
    unsigned n = 0;
    pthread_mutex_lock(&a->lock);
    struct kvli_stores *s = a->stores;
    for (unsigned i = 0; s != NULL && i < s->n; i++, n++) {
        ops[i] = s->ops[i];
        state[i] = s->state[i];
    }
    pthread_mutex_unlock(&a->lock);
    return n;
}

static void kvli_stores_regions_changed(kvl_agent_t *a)
{
    const kvli_store_ops_t *ops[KVLI_STORES_MAX];
    void *state[KVLI_STORES_MAX];
    unsigned n = kvli_stores_snapshot(a, ops, state);
    for (unsigned i = 0; i < n; i++)
        if (ops[i]->regions_changed != NULL)
            ops[i]->regions_changed(a, state[i]);
}

static void kvli_stores_destroy(kvl_agent_t *a)
{
    const kvli_store_ops_t *ops[KVLI_STORES_MAX];
    void *state[KVLI_STORES_MAX];
    unsigned n = kvli_stores_snapshot(a, ops, state);
    while (n-- > 0)
        ops[n]->destroy(a, state[n]);
    pthread_mutex_lock(&a->lock);
    free(a->stores);
    a->stores = NULL;
    pthread_mutex_unlock(&a->lock);
}
