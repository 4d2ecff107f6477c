/* kvlane: agent metadata, what a remote agent needs to reach this one. */
#ifndef KVLANE_METADATA_H
#define KVLANE_METADATA_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/agent.h>
#include <kvlane/memory.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Serialise this agent's metadata: name, incarnation, generation, each
 * backend's connection info and every registered region with its keys.
 * The blob is versioned, length-checked and checksummed. Free with kvl_free.
 */
kvl_status_t kvl_metadata_get(kvl_agent_t *agent, void **blob_p, size_t *len_p);

/*
 * Load a remote agent's metadata. The blob is untrusted: a malformed,
 * truncated, oversized, wrong-version or corrupted blob, or one older than
 * what is held for that agent (older incarnation or generation), is refused
 * and changes nothing. A newer incarnation replaces the old one (its
 * connections are dropped). name_out (optional) receives the agent's name.
 */
kvl_status_t kvl_metadata_load(kvl_agent_t *agent, const void *blob, size_t len,
                               char *name_out, size_t name_cap);

/* Forget a remote agent; in-flight transfers to it are cancelled. */
kvl_status_t kvl_remote_remove(kvl_agent_t *agent, const char *name);

/* KVL_OK when metadata of the agent is loaded, KVL_ERR_NOT_FOUND else. */
kvl_status_t kvl_remote_check(kvl_agent_t *agent, const char *name);

/* Incarnation id of a loaded remote agent (0 if unknown). */
uint64_t kvl_remote_incarnation(kvl_agent_t *agent, const char *name);

/*
 * Regions a loaded remote agent exposes, sorted by address: up to max are
 * copied into out (kind into kinds when not NULL); *n_p gets the total.
 */
kvl_status_t kvl_remote_regions(kvl_agent_t *agent, const char *name, kvl_mem_desc_t *out,
                                kvl_mem_kind_t *kinds, size_t max, size_t *n_p);

/*
 * How each backend reaches a loaded remote agent (one line per backend,
 * e.g. "shm: socket (cross-memory attach refused: ...)"). Returns the length
 * the full text needs.
 */
size_t kvl_remote_describe(kvl_agent_t *agent, const char *name, char *buf, size_t len);

/* Free memory returned by kvlane (blobs, notification lists). */
void kvl_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
