/*
 * kvlane agent listener: the wire format (little-endian), parsed by pure
 * functions that are fuzzed (tests/fuzz/fuzz_tcp_proto.c).
 *
 * A connection carries the authentication exchange of the tcp backend
 * (common/auth.h, purpose "listener"), then one request and one
 * reply, then it closes.
 *   request  0 magic u32 ("KVLQ") | 4 type u32 | 8 body length u64 | body
 *   reply    0 magic u32 ("KVLR") | 4 status i32 | 8 text length u32 |
 *            12 reserved u32 (0) | 16 body length u64 | text | body
 * Requests: FETCH (no body; the reply's body is our metadata blob), PUSH
 * (body: the sender's metadata blob, loaded here), INVALIDATE (body:
 * incarnation u64 | name; drops that agent if the incarnation matches).
 */
#ifndef KVLI_LISTENER_PROTO_H
#define KVLI_LISTENER_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define KVLI_LSN_REQ_MAGIC 0x514c564bu     /* "KVLQ" */
#define KVLI_LSN_REP_MAGIC 0x524c564bu     /* "KVLR" */
#define KVLI_LSN_REQ_LEN 16u
#define KVLI_LSN_REP_LEN 24u
#define KVLI_LSN_BLOB_MAX (64ull << 20)    /* metadata blobs are at most 64 MiB */
#define KVLI_LSN_TEXT_MAX 1024u
#define KVLI_LSN_NAME_MAX 63u

enum { KVLI_LSN_FETCH = 1, KVLI_LSN_PUSH = 2, KVLI_LSN_INVALIDATE = 3 };

void kvli_listener_proto_req_build(uint8_t *b, uint32_t type, uint64_t len);
int kvli_listener_proto_req_parse(const uint8_t *b, uint32_t *type, uint64_t *len, char *why,
                                  size_t why_cap);
void kvli_listener_proto_rep_build(uint8_t *b, int32_t status, uint32_t text_len, uint64_t len);
int kvli_listener_proto_rep_parse(const uint8_t *b, int32_t *status, uint32_t *text_len,
                                  uint64_t *len, char *why, size_t why_cap);
/* INVALIDATE body; name gets a NUL-terminated copy (cap >= 64). */
size_t kvli_listener_proto_inval_build(uint8_t *b, uint64_t incarnation, const char *name);
int kvli_listener_proto_inval_parse(const uint8_t *b, size_t len, uint64_t *incarnation,
                                    char *name, size_t name_cap, char *why, size_t why_cap);
const char *kvli_listener_proto_type_name(uint32_t type);

#endif
