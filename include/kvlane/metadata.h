/* kvlane: agent metadata, what a remote agent needs to reach this one. */
#ifndef KVLANE_METADATA_H
#define KVLANE_METADATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/desc.h>
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
 * Serialise a partial blob of this agent (NIXL's getLocalPartialMD): name,
 * incarnation, generation, and
 *   - descs NULL or empty: every selected backend's connection info and no
 *     region (what a peer needs before any partial blob of regions);
 *   - descs not empty: the registered regions the descriptors lie in, each
 *     once, with the keys of the selected backends; connection info only
 *     when inc_conn_info is true.
 * Each descriptor must lie inside one registered region of the list's kind
 * (and device, unless KVL_DEV_ANY) that a selected backend exposes; one that
 * does not is refused (KVL_ERR_OUT_OF_BOUNDS, KVL_ERR_DEVICE_MISMATCH,
 * KVL_ERR_NO_BACKEND) with its index, address, length and device: nothing
 * is dropped silently. backends (n_backends names; NULL or 0: all) restricts
 * the connection info and keys to those backends; an unknown name is
 * KVL_ERR_NOT_FOUND. Free the blob with kvl_free.
 */
kvl_status_t kvl_metadata_get_partial(kvl_agent_t *agent, const kvl_dlist_t *descs,
                                      bool inc_conn_info, const char *const *backends,
                                      size_t n_backends, void **blob_p, size_t *len_p);

/*
 * Load a remote agent's metadata, full or partial. The blob is untrusted: a
 * malformed, truncated, oversized, wrong-version or corrupted blob, or one
 * older than what is held for that agent (older incarnation or generation),
 * is refused and changes nothing. A newer incarnation replaces the old one
 * (its connections are dropped). name_out (optional) receives the agent's
 * name.
 *
 * A partial blob (kvl_metadata_get_partial) is merged:
 *   - agent not loaded (or loaded with an older incarnation): with
 *     connection info it is loaded as a full blob holding just its regions;
 *     without, it is refused (KVL_ERR_NOT_FOUND: send connection info first);
 *   - same incarnation: refused (KVL_ERR_STALE, nothing changes) when its
 *     generation is older than the one held; otherwise its regions are added
 *     to the held ones, each replacing a held region at the same address,
 *     the others stay, transfers in flight go on, and the held generation
 *     becomes the newer of the two. Connection info it carries is not loaded
 *     again (the agent's backends are reached as before).
 * Generation rule: the generation bumps on every registration and
 * deregistration, so a partial blob made before region R was deregistered
 * has a generation older than any blob made after it. Once anything made
 * after the deregistration is loaded, every blob that still names R is
 * stale and refused: R is never resurrected by an old partial blob. A
 * partial blob never removes a region; loading the agent's full metadata (a
 * newer generation, or the same one when the held set was built from
 * partial blobs) replaces the whole set.
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
