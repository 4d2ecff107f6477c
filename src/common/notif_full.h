/*
 * The sender's side of a refused notification (the target's queue is full,
 * or it could not allocate): one wording for every backend that carries
 * notifications, so the error names the target, quotes its bound (the text
 * the target sent back) and says what to do.
 */
#ifndef KVLI_NOTIF_FULL_H
#define KVLI_NOTIF_FULL_H

#include <inttypes.h>
#include <stddef.h>
#include <kvlane/backend.h>

/*
 * Target side: hand a received notification to the core within its bound
 * (ctx->notif_offer); why gets the refusal's text. A core without that slot
 * (an older or a test host) takes it through notif_deliver, unbounded.
 */
static inline kvl_status_t kvli_notif_take(kvl_bk_ctx_t *ctx, const char *from, const void *msg,
                                           size_t len, char *why, size_t why_len)
{
    if (ctx->size >= offsetof(kvl_bk_ctx_t, notif_offer) + sizeof(ctx->notif_offer) &&
        ctx->notif_offer != NULL)
        return ctx->notif_offer(ctx, from, msg, len, why, why_len);
    ctx->notif_deliver(ctx, from, msg, len);
    return KVL_OK;
}

/* Grants (kvl_bk_ctx_t notif_reserve ...): none from a core without them. */
static inline int kvli_notif_grants(const kvl_bk_ctx_t *ctx)
{
    return ctx->size >= offsetof(kvl_bk_ctx_t, notif_unreserve) + sizeof(ctx->notif_unreserve) &&
           ctx->notif_reserve != NULL && ctx->notif_offer_reserved != NULL &&
           ctx->notif_unreserve != NULL;
}

/*
 * Fill err for a notification that agent peer refused with status (from
 * the target, KVL_ERR_REMOTE_FULL or KVL_ERR_NO_MEMORY) and text. xfer_bytes:
 * the notification ended a transfer whose xfer_bytes bytes are in place;
 * (uint64_t)-1 for a notification sent alone. Returns the status to report.
 */
static inline kvl_status_t kvli_notif_refused(kvl_error_t *err, const char *backend,
                                              const char *peer, kvl_status_t status,
                                              const char *text, uint64_t xfer_bytes)
{
    kvl_status_t st = status == KVL_ERR_REMOTE_FULL || status == KVL_ERR_NO_MEMORY
                          ? KVL_ERR_REMOTE_FULL : KVL_ERR_REMOTE_REFUSED;
    const char *t = text != NULL && text[0] ? text : "no reason given";
    if (xfer_bytes == UINT64_MAX)
        kvl_bk_error_set(err, st, 0, backend, -1, "notification to agent '%s' refused: %s",
                         peer, t);
    else
        kvl_bk_error_set(err, st, 0, backend, -1, "the transfer's data reached agent '%s' (all "
                         "%" PRIu64 " bytes are in place) but its notification was refused: %s",
                         peer, xfer_bytes, t);
    if (err != NULL)
        snprintf(err->agent, sizeof(err->agent), "%s", peer);
    if (st == KVL_ERR_REMOTE_FULL)
        kvl_bk_error_hint(err, xfer_bytes == UINT64_MAX
                          ? "the application on that agent is not taking its notifications "
                            "(kvl_notif_poll; NIXL: get_new_notifs) as fast as they come: make "
                            "it take them, then send again; or raise its bound "
                            "(kvl_agent_config_t notif_max_bytes / notif_max_msgs)"
                          : "the application on that agent is not taking its notifications "
                            "(kvl_notif_poll; NIXL: get_new_notifs) as fast as they come: make "
                            "it take them; the data need not move again, send the notification "
                            "alone (kvl_notif_send) once it has; or raise its bound "
                            "(kvl_agent_config_t notif_max_bytes / notif_max_msgs)");
    else
        kvl_bk_error_hint(err, "the target refused the notification for the reason quoted; "
                          "see docs/troubleshooting.md");
    return st;
}

#endif
