/* kvlane: the agent listener, how agents find each other by address. */
#ifndef KVLANE_LISTENER_H
#define KVLANE_LISTENER_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Listen on host:port so peers can fetch this agent's metadata, push theirs
 * and invalidate what they pushed. port 0 picks a free port; bound (optional)
 * receives "host:port" as bound. One listener per agent. With a shared secret
 * set in the agent's configuration (KVL_AGENT_CFG_SECRET), peers that do not
 * know it are refused (challenge-response; the secret never crosses the wire).
 */
kvl_status_t kvl_agent_listen(kvl_agent_t *agent, const char *host, uint16_t port, char *bound,
                              size_t bound_len);

/* Fetch the metadata of the agent listening at host_port ("host:port") and
 * load it (same checks as kvl_metadata_load). name_out gets its name. */
kvl_status_t kvl_metadata_fetch(kvl_agent_t *agent, const char *host_port, char *name_out,
                                size_t name_cap);

/* Send this agent's metadata to the listener at host_port, which loads it. */
kvl_status_t kvl_metadata_push(kvl_agent_t *agent, const char *host_port);

/* Send partial metadata of this agent (kvl_metadata_get_partial) to the
 * listener at host_port, which loads it: merged into what it holds of us
 * (see kvl_metadata_load). A blob that is not partial metadata of this
 * agent is refused (KVL_ERR_INVALID_ARG). Like kvl_metadata_push, the
 * listener is remembered: it is sent our full metadata after a
 * deregistration, and INVALIDATE when the agent is destroyed. */
kvl_status_t kvl_metadata_push_partial(kvl_agent_t *agent, const char *host_port,
                                       const void *blob, size_t len);

/* Ask the listener at host_port to forget this agent (it drops our metadata
 * and cancels its transfers to us). host_port NULL: every listener we pushed
 * to. Also done automatically when the agent is destroyed. */
kvl_status_t kvl_metadata_invalidate(kvl_agent_t *agent, const char *host_port);

#ifdef __cplusplus
}
#endif
#endif
