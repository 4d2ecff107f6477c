/* kvlane agent listener: pure encoders and hardened parsers of its messages. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "common/wire.h"
#include "listener_proto.h"

void kvli_listener_proto_req_build(uint8_t *b, uint32_t type, uint64_t len)
{
    kvli_put32(b, KVLI_LSN_REQ_MAGIC);
    kvli_put32(b + 4, type);
    kvli_put64(b + 8, len);
}

int kvli_listener_proto_req_parse(const uint8_t *b, uint32_t *type, uint64_t *len, char *why,
                                  size_t why_cap)
{
    uint32_t magic = kvli_get32(b);
    *type = kvli_get32(b + 4);
    *len = kvli_get64(b + 8);
    if (magic != KVLI_LSN_REQ_MAGIC) {
        snprintf(why, why_cap, "request magic 0x%08" PRIx32 " is not valid", magic);
        return -1;
    }
    switch (*type) {
    case KVLI_LSN_FETCH:
        if (*len == 0)
            return 0;
        break;
    case KVLI_LSN_PUSH:
        if (*len > 0 && *len <= KVLI_LSN_BLOB_MAX)
            return 0;
        break;
    case KVLI_LSN_INVALIDATE:
        if (*len > 8 && *len <= 8 + KVLI_LSN_NAME_MAX)
            return 0;
        break;
    default:
        snprintf(why, why_cap, "request type %" PRIu32 " is not FETCH, PUSH or INVALIDATE", *type);
        return -1;
    }
    snprintf(why, why_cap, "%s request with a body of %" PRIu64 " bytes",
             kvli_listener_proto_type_name(*type), *len);
    return -1;
}

void kvli_listener_proto_rep_build(uint8_t *b, int32_t status, uint32_t text_len, uint64_t len)
{
    kvli_put32(b, KVLI_LSN_REP_MAGIC);
    kvli_put32(b + 4, (uint32_t)status);
    kvli_put32(b + 8, text_len);
    kvli_put32(b + 12, 0);
    kvli_put64(b + 16, len);
}

int kvli_listener_proto_rep_parse(const uint8_t *b, int32_t *status, uint32_t *text_len,
                                  uint64_t *len, char *why, size_t why_cap)
{
    uint32_t magic = kvli_get32(b);
    *status = (int32_t)kvli_get32(b + 4);
    *text_len = kvli_get32(b + 8);
    *len = kvli_get64(b + 16);
    if (magic != KVLI_LSN_REP_MAGIC || kvli_get32(b + 12) != 0) {
        snprintf(why, why_cap, "reply magic 0x%08" PRIx32 " is not valid", magic);
        return -1;
    }
    if (*text_len > KVLI_LSN_TEXT_MAX || *len > KVLI_LSN_BLOB_MAX || (*status != 0 && *len != 0)) {
        snprintf(why, why_cap, "reply with status %" PRId32 ", text %" PRIu32 " and body %" PRIu64
                 " bytes is out of bounds", *status, *text_len, *len);
        return -1;
    }
    return 0;
}

size_t kvli_listener_proto_inval_build(uint8_t *b, uint64_t incarnation, const char *name)
{
    size_t nl = strlen(name);
    if (nl > KVLI_LSN_NAME_MAX)
        nl = KVLI_LSN_NAME_MAX;
    kvli_put64(b, incarnation);
    memcpy(b + 8, name, nl);
    return 8 + nl;
}

int kvli_listener_proto_inval_parse(const uint8_t *b, size_t len, uint64_t *incarnation,
                                    char *name, size_t name_cap, char *why, size_t why_cap)
{
    if (len <= 8 || len > 8 + KVLI_LSN_NAME_MAX || name_cap < len - 8 + 1 ||
        !kvli_wire_name_ok(b + 8, len - 8, KVLI_LSN_NAME_MAX)) {
        snprintf(why, why_cap, "INVALIDATE names no valid agent (%zu bytes)", len);
        return -1;
    }
    *incarnation = kvli_get64(b);
    memcpy(name, b + 8, len - 8);
    name[len - 8] = '\0';
    return 0;
}

const char *kvli_listener_proto_type_name(uint32_t type)
{
    switch (type) {
    case KVLI_LSN_FETCH: return "FETCH";
    case KVLI_LSN_PUSH: return "PUSH";
    case KVLI_LSN_INVALIDATE: return "INVALIDATE";
    default: return "unknown";
    }
}
