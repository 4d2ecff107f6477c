/* kvlane tcp backend: pure encoders and hardened parsers of the wire format. */
#include <inttypes.h>
#include <stdio.h>
#include "tcp_proto.h"

void kvli_tcp_proto_hdr_build(uint8_t *b, uint16_t type, uint64_t id, uint64_t len, uint64_t aux)
{
    kvli_put32(b, KVLI_TCP_MAGIC);
    kvli_put16(b + 4, type);
    kvli_put16(b + 6, 0);
    kvli_put64(b + 8, id);
    kvli_put64(b + 16, len);
    kvli_put64(b + 24, aux);
}

uint64_t kvli_tcp_proto_reply_aux(int32_t status, uint32_t text_len)
{
    return (uint64_t)(uint32_t)status | ((uint64_t)text_len << 32);
}

static int kvli_tcp_proto_bad(char *why, size_t cap, const char *fmt, uint64_t v)
{
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s (%" PRIu64 ")", fmt, v);
    return -1;
}

int kvli_tcp_proto_hdr_parse(const uint8_t *b, int dir, kvli_tcp_hdr_t *h, char *why,
                             size_t why_cap)
{
    uint32_t magic = kvli_get32(b);
    memset(h, 0, sizeof(*h));
    h->type = kvli_get16(b + 4);
    h->id = kvli_get64(b + 8);
    h->len = kvli_get64(b + 16);
    h->aux = kvli_get64(b + 24);
    if (magic != KVLI_TCP_MAGIC)
        return kvli_tcp_proto_bad(why, why_cap, "bad message magic", magic);
    if (kvli_get16(b + 6) != 0)
        return kvli_tcp_proto_bad(why, why_cap, "unknown message flags", kvli_get16(b + 6));
    if (dir == KVLI_TCP_DIR_REQUEST) {
        switch (h->type) {
        case KVLI_TCP_MSG_HELLO:
            if (h->len < KVLI_TCP_HELLO_FIXED || h->len > KVLI_TCP_HELLO_MAX || h->aux != 0)
                return kvli_tcp_proto_bad(why, why_cap, "HELLO length out of range", h->len);
            return 0;
        case KVLI_TCP_MSG_NOTIF:
        case KVLI_TCP_MSG_CANCELED:
            if (h->len > KVLI_TCP_NOTIF_MAX)
                return kvli_tcp_proto_bad(why, why_cap, "notification longer than KVL_NOTIF_MAX",
                                          h->len);
            if (h->aux > (h->type == KVLI_TCP_MSG_NOTIF ? KVLI_TCP_NOTIF_GRANT_MAX : 0))
                return kvli_tcp_proto_bad(why, why_cap, "notification gives back too many slots",
                                          h->aux);
            return 0;
        case KVLI_TCP_MSG_NOTIF_GRANTED:
            if (h->len > KVLI_TCP_NOTIF_SLOT || h->aux != 0)
                return kvli_tcp_proto_bad(why, why_cap, "NOTIF_GRANTED longer than a slot",
                                          h->len);
            return 0;
        case KVLI_TCP_MSG_WRITE:
        case KVLI_TCP_MSG_READ: {
            uint64_t rb;
            h->payload = h->aux;
            if (h->payload == 0 || h->payload > KVLI_TCP_PAYLOAD_MAX)
                return kvli_tcp_proto_bad(why, why_cap, "payload size out of range", h->payload);
            if (h->type == KVLI_TCP_MSG_WRITE) {
                if (h->len <= h->payload)
                    return kvli_tcp_proto_bad(why, why_cap, "WRITE body shorter than its payload",
                                              h->len);
                rb = h->len - h->payload;
            } else {
                rb = h->len;
            }
            if (rb % 16u != 0 || rb / 16u == 0 || rb / 16u > KVLI_TCP_RANGES_MAX)
                return kvli_tcp_proto_bad(why, why_cap, "range count out of 1..1022", rb / 16u);
            h->nranges = (uint32_t)(rb / 16u);
            return 0;
        }
        default:
            return kvli_tcp_proto_bad(why, why_cap, "unexpected request type", h->type);
        }
    }
    h->status = (int32_t)(uint32_t)(h->aux & 0xffffffffu);
    h->text_len = (uint32_t)(h->aux >> 32);
    if (h->text_len > KVLI_TCP_TEXT_MAX || h->len < h->text_len)
        return kvli_tcp_proto_bad(why, why_cap, "reply text length out of range", h->text_len);
    switch (h->type) {
    case KVLI_TCP_MSG_HELLO_ACK:
        if (h->status == 0 && (h->len - h->text_len < 9 || h->len - h->text_len > 8 + KVLI_TCP_NAME_MAX))
            return kvli_tcp_proto_bad(why, why_cap, "HELLO_ACK length out of range", h->len);
        if (h->status != 0 && h->len != h->text_len)
            return kvli_tcp_proto_bad(why, why_cap, "refusing HELLO_ACK carries data", h->len);
        return 0;
    case KVLI_TCP_MSG_WRITE_ACK:
        if (h->len != h->text_len)
            return kvli_tcp_proto_bad(why, why_cap, "WRITE_ACK carries data", h->len);
        return 0;
    case KVLI_TCP_MSG_NOTIF_ACK:
        h->payload = h->len - h->text_len;
        if (h->payload != 4)
            return kvli_tcp_proto_bad(why, why_cap, "NOTIF_ACK without its 4-byte grant",
                                      h->len);
        return 0;
    case KVLI_TCP_MSG_READ_DATA:
        h->payload = h->len - h->text_len;
        if (h->status != 0 && h->payload != 0)
            return kvli_tcp_proto_bad(why, why_cap, "refusing READ_DATA carries data", h->payload);
        if (h->payload > KVLI_TCP_PAYLOAD_MAX)
            return kvli_tcp_proto_bad(why, why_cap, "READ_DATA payload out of range", h->payload);
        return 0;
    default:
        return kvli_tcp_proto_bad(why, why_cap, "unexpected reply type", h->type);
    }
}

int kvli_tcp_proto_ranges_parse(const uint8_t *b, uint32_t n, uint64_t payload, uint64_t *out,
                                char *why, size_t why_cap)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t a = kvli_get64(b + 16u * i), l = kvli_get64(b + 16u * i + 8);
        if (l == 0 || a + l < a || sum + l < sum)
            return kvli_tcp_proto_bad(why, why_cap, "empty or wrapping range at address", a);
        sum += l;
        out[2 * i] = a;
        out[2 * i + 1] = l;
    }
    if (sum != payload)
        return kvli_tcp_proto_bad(why, why_cap, "ranges do not add up to the payload", sum);
    return 0;
}

int kvli_tcp_proto_name_ok(const uint8_t *b, size_t len)
{
    return kvli_wire_name_ok(b, len, KVLI_TCP_NAME_MAX);
}

size_t kvli_tcp_proto_hello_build(uint8_t *b, const char *name, uint64_t incarnation,
                                  const char *target, uint64_t expect_incarnation)
{
    size_t nl = strlen(name), tl = strlen(target);
    if (nl > KVLI_TCP_NAME_MAX)
        nl = KVLI_TCP_NAME_MAX;
    if (tl > KVLI_TCP_NAME_MAX)
        tl = KVLI_TCP_NAME_MAX;
    kvli_put32(b, KVLI_TCP_PROTO_VERSION);
    kvli_put32(b + 4, 0);
    kvli_put64(b + 8, incarnation);
    kvli_put64(b + 16, expect_incarnation);
    kvli_put16(b + 24, (uint16_t)nl);
    kvli_put16(b + 26, (uint16_t)tl);
    memcpy(b + KVLI_TCP_HELLO_FIXED, name, nl);
    memcpy(b + KVLI_TCP_HELLO_FIXED + nl, target, tl);
    return KVLI_TCP_HELLO_FIXED + nl + tl;
}

int kvli_tcp_proto_hello_parse(const uint8_t *b, size_t len, kvli_tcp_hello_t *h, char *why,
                               size_t why_cap)
{
    size_t nl, tl;
    memset(h, 0, sizeof(*h));
    if (len < KVLI_TCP_HELLO_FIXED)
        return kvli_tcp_proto_bad(why, why_cap, "HELLO too short", len);
    h->version = kvli_get32(b);
    h->flags = kvli_get32(b + 4);
    h->incarnation = kvli_get64(b + 8);
    h->expect_incarnation = kvli_get64(b + 16);
    nl = kvli_get16(b + 24);
    tl = kvli_get16(b + 26);
    if (h->version != KVLI_TCP_PROTO_VERSION)
        return kvli_tcp_proto_bad(why, why_cap, "HELLO protocol version not supported", h->version);
    if (h->flags != 0)
        return kvli_tcp_proto_bad(why, why_cap, "HELLO flags not supported", h->flags);
    if (KVLI_TCP_HELLO_FIXED + nl + tl != len)
        return kvli_tcp_proto_bad(why, why_cap, "HELLO name lengths disagree with its size", len);
    if (!kvli_tcp_proto_name_ok(b + KVLI_TCP_HELLO_FIXED, nl) ||
        !kvli_tcp_proto_name_ok(b + KVLI_TCP_HELLO_FIXED + nl, tl))
        return kvli_tcp_proto_bad(why, why_cap, "HELLO name is empty, too long or not printable",
                                  nl);
    memcpy(h->name, b + KVLI_TCP_HELLO_FIXED, nl);
    memcpy(h->target, b + KVLI_TCP_HELLO_FIXED + nl, tl);
    return 0;
}

int kvli_tcp_proto_ack_parse(const uint8_t *b, size_t len, uint64_t *incarnation, char *name,
                             size_t name_cap, char *why, size_t why_cap)
{
    if (len < 9 || len > 8 + KVLI_TCP_NAME_MAX || !kvli_tcp_proto_name_ok(b + 8, len - 8) ||
        name_cap < len - 8 + 1)
        return kvli_tcp_proto_bad(why, why_cap, "HELLO_ACK name is not valid", len);
    *incarnation = kvli_get64(b);
    memcpy(name, b + 8, len - 8);
    name[len - 8] = '\0';
    return 0;
}

void kvli_tcp_proto_conn_build(uint8_t *b, const kvli_tcp_conninfo_t *ci)
{
    memset(b, 0, KVLI_TCP_CONN_LEN);
    kvli_put32(b, KVLI_TCP_CONN_MAGIC);
    kvli_put16(b + 4, KVLI_TCP_CONN_VERSION);
    kvli_put16(b + 6, (uint16_t)ci->family);
    kvli_put16(b + 8, ci->port);
    kvli_put64(b + 12, ci->incarnation);
    memcpy(b + 20, ci->addr, ci->family == 4 ? 4 : 16);
}

int kvli_tcp_proto_conn_parse(const uint8_t *b, size_t len, kvli_tcp_conninfo_t *ci, char *why,
                              size_t why_cap)
{
    static const uint8_t zero[16];
    memset(ci, 0, sizeof(*ci));
    if (b == NULL || len != KVLI_TCP_CONN_LEN)
        return kvli_tcp_proto_bad(why, why_cap, "record length is not 36", b ? len : 0);
    if (kvli_get32(b) != KVLI_TCP_CONN_MAGIC)
        return kvli_tcp_proto_bad(why, why_cap, "bad record magic", kvli_get32(b));
    if (kvli_get16(b + 4) != KVLI_TCP_CONN_VERSION)
        return kvli_tcp_proto_bad(why, why_cap, "record version not supported", kvli_get16(b + 4));
    ci->family = kvli_get16(b + 6);
    ci->port = kvli_get16(b + 8);
    ci->incarnation = kvli_get64(b + 12);
    if (ci->family != 4 && ci->family != 6)
        return kvli_tcp_proto_bad(why, why_cap, "address family is neither 4 nor 6",
                                  (uint64_t)ci->family);
    if (ci->port == 0 || kvli_get16(b + 10) != 0)
        return kvli_tcp_proto_bad(why, why_cap, "port 0 or reserved bits set", ci->port);
    if (ci->family == 4 && memcmp(b + 24, zero, 12) != 0)
        return kvli_tcp_proto_bad(why, why_cap, "IPv4 address with trailing bytes", 0);
    if (memcmp(b + 20, zero, ci->family == 4 ? 4 : 16) == 0)
        return kvli_tcp_proto_bad(why, why_cap, "unspecified address (all zero)", 0);
    memcpy(ci->addr, b + 20, 16);
    return 0;
}

void kvli_tcp_proto_key_build(uint8_t *b, uint64_t addr, uint64_t len)
{
    kvli_put32(b, KVLI_TCP_KEY_MAGIC);
    kvli_put16(b + 4, KVLI_TCP_KEY_VERSION);
    kvli_put16(b + 6, 0);
    kvli_put64(b + 8, addr);
    kvli_put64(b + 16, len);
}

int kvli_tcp_proto_key_parse(const uint8_t *b, size_t len, uint64_t *addr, uint64_t *rlen,
                             char *why, size_t why_cap)
{
    if (b == NULL || len != KVLI_TCP_KEY_LEN)
        return kvli_tcp_proto_bad(why, why_cap, "key length is not 24", b ? len : 0);
    if (kvli_get32(b) != KVLI_TCP_KEY_MAGIC)
        return kvli_tcp_proto_bad(why, why_cap, "bad key magic", kvli_get32(b));
    if (kvli_get16(b + 4) != KVLI_TCP_KEY_VERSION || kvli_get16(b + 6) != 0)
        return kvli_tcp_proto_bad(why, why_cap, "key version not supported", kvli_get16(b + 4));
    *addr = kvli_get64(b + 8);
    *rlen = kvli_get64(b + 16);
    return 0;
}

const char *kvli_tcp_proto_type_name(unsigned type)
{
    switch (type) {
    case KVLI_TCP_MSG_HELLO: return "HELLO";
    case KVLI_TCP_MSG_HELLO_ACK: return "HELLO_ACK";
    case KVLI_TCP_MSG_NOTIF: return "NOTIF";
    case KVLI_TCP_MSG_WRITE: return "WRITE";
    case KVLI_TCP_MSG_WRITE_ACK: return "WRITE_ACK";
    case KVLI_TCP_MSG_READ: return "READ";
    case KVLI_TCP_MSG_READ_DATA: return "READ_DATA";
    case KVLI_TCP_MSG_CANCELED: return "CANCELED";
    case KVLI_TCP_MSG_NOTIF_ACK: return "NOTIF_ACK";
    case KVLI_TCP_MSG_NOTIF_GRANTED: return "NOTIF_GRANTED";
    default: return "unknown";
    }
}
