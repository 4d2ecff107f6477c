/* What every backend's open() starts with (shared layer). */
#ifndef KVLI_IFACE_H
#define KVLI_IFACE_H

#include <pthread.h>
#include <stddef.h>
#include <kvlane/backend.h>

/* Check that the core's context is one this backend was built for, then
 * allocate the interface object (size bytes, zeroed). NULL with *st_p and
 * err (KVL_ERR_INTERNAL: built from different headers; KVL_ERR_NO_MEMORY). */
void *kvli_iface_new(const kvl_bk_ctx_t *ctx, void **bk_p, const char *bk, size_t size,
                     kvl_status_t *st_p, kvl_error_t *err);

/* A condition variable whose timed waits use CLOCK_MONOTONIC (deadlines do
 * not move with the wall clock). */
void kvli_cond_init(pthread_cond_t *c);
/* A mutex and such a condition variable. */
void kvli_lock_init(pthread_mutex_t *m, pthread_cond_t *c);

#endif
