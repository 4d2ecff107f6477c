/*
 * kvlane tcp backend: the wire format. Everything that crosses the network is
 * little-endian and parsed here by pure functions (no I/O, no state), so the
 * parsers are fuzzed on their own (tests/fuzz/fuzz_tcp_proto.c).
 *
 * A data connection is opened by the initiator (peer_load) and carries, in
 * order:
 *   1. the authentication exchange (tcp_auth.h): AUTH1 -> AUTH2 -> AUTH3 -> AUTH4
 *   2. HELLO -> HELLO_ACK (names, incarnations: a restarted target is refused
 *      as stale here)
 *   3. requests from the initiator (WRITE, READ, NOTIF, NOTIF_GRANTED,
 *      CANCELED), answered in order by the target (WRITE_ACK, READ_DATA,
 *      NOTIF_ACK: queued, or refused when its notification queue is full;
 *      NOTIF_GRANTED only when its id is not 0; CANCELED has no answer).
 *   4. the end: an orderly close, or a reset (SO_LINGER 0) when the
 *      initiator gives up requests still unanswered (peer timeout, cancel
 *      the peer does not confirm, agent destroyed). Before copying WRITE
 *      payload into registered memory (at its start and every
 *      KVLI_TCP_HUP_CHECK bytes) the target checks that the connection is
 *      not closed or reset; once it is, the rest of that connection's WRITE
 *      payloads are read and dropped, nothing is answered (protocol 2).
 *
 * Message header, 32 bytes:
 *    0 magic u32 ("KVTC")  4 type u16  6 flags u16 (0)
 *    8 id u64 (request id, echoed in the reply)
 *   16 len u64 (body bytes after the header)
 *   24 aux u64: WRITE/READ: payload bytes; replies: status (low 32 bits, an
 *      int32) and text length (high 32 bits); others 0.
 * Bodies:
 *   WRITE      nranges x {addr u64, len u64}, then the payload (sum of lens)
 *   READ       nranges x {addr u64, len u64}
 *   NOTIF      the message (<= KVL_NOTIF_MAX); aux: slots given back
 *   NOTIF_GRANTED the message (<= KVLI_TCP_NOTIF_SLOT)
 *   CANCELED   the notification of a cancelled transfer (<= KVL_NOTIF_MAX)
 *   HELLO      version u32 | flags u32 | incarnation u64 | expected target
 *              incarnation u64 | name_len u16 | target_name_len u16 | names
 *   replies    text (text length bytes), then READ_DATA's payload when the
 *              status is 0; HELLO_ACK: text, then incarnation u64 and the name;
 *              NOTIF_ACK: text, then the slots added u32
 */
#ifndef KVLI_TCP_PROTO_H
#define KVLI_TCP_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include "common/wire.h"
#include <string.h>

#define KVLI_TCP_MAGIC 0x4354564bu          /* "KVTC" */
/* 2: a target copies a WRITE's payload only while the initiator holds the
 * connection (checked before copying), so an initiator gives requests up by
 * resetting it; a target refuses a HELLO of another version with a
 * HELLO_ACK that says both versions. */
/* 3: NOTIF is answered (NOTIF_ACK, status and text like every reply): the
 * target queues it within its bound or refuses it (KVL_ERR_REMOTE_FULL).
 * Grants (as shm protocol 5): a NOTIF_ACK's body ends with 4 bytes, the
 * slots added to the initiator's grant (room for one notification of at
 * most KVLI_TCP_NOTIF_SLOT bytes each, reserved in the target's bound); the
 * initiator sends that many NOTIF_GRANTED without waiting for an answer (id
 * 0), or with an id to ask for more (answered by a NOTIF_ACK it does not
 * wait for); a NOTIF's aux gives the unused slots back (surrender). A
 * NOTIF_GRANTED past the grant, or a surrender of more than it holds, is a
 * protocol error. */
#define KVLI_TCP_PROTO_VERSION 3u
#define KVLI_TCP_HDR_LEN 32u
#define KVLI_TCP_RANGES_MAX 1022u           /* + header + ranges = UIO_MAXIOV */
#define KVLI_TCP_PAYLOAD_MAX (64ull << 20)  /* of one request */
#define KVLI_TCP_TEXT_MAX 256u              /* refusal text in a reply */
#define KVLI_TCP_NOTIF_MAX 65536u           /* KVL_NOTIF_MAX */
#define KVLI_TCP_HELLO_FIXED 28u
#define KVLI_TCP_NAME_MAX 63u
#define KVLI_TCP_HELLO_MAX (KVLI_TCP_HELLO_FIXED + 2u * KVLI_TCP_NAME_MAX)
#define KVLI_TCP_ACK_MAX (KVLI_TCP_TEXT_MAX + 8u + KVLI_TCP_NAME_MAX)

enum {
    KVLI_TCP_MSG_HELLO = 1,
    KVLI_TCP_MSG_HELLO_ACK = 2,
    KVLI_TCP_MSG_NOTIF = 3,
    KVLI_TCP_MSG_WRITE = 4,
    KVLI_TCP_MSG_WRITE_ACK = 5,
    KVLI_TCP_MSG_READ = 6,
    KVLI_TCP_MSG_READ_DATA = 7,
    KVLI_TCP_MSG_CANCELED = 8,
    KVLI_TCP_MSG_NOTIF_ACK = 9,
    KVLI_TCP_MSG_NOTIF_GRANTED = 10
};

#define KVLI_TCP_NOTIF_SLOT 1024u           /* a granted notification's largest size */
#define KVLI_TCP_NOTIF_GRANT_MAX 65536u     /* slots a NOTIF_ACK may add */

/* What the receiver of a header is: the target reads requests, the
 * initiator reads replies. */
enum { KVLI_TCP_DIR_REQUEST = 0, KVLI_TCP_DIR_REPLY = 1 };

typedef struct kvli_tcp_hdr {
    uint16_t type;
    uint64_t id;
    uint64_t len;          /* body bytes */
    uint64_t aux;
    /* derived by the parser */
    uint32_t nranges;      /* WRITE/READ */
    uint64_t payload;      /* WRITE/READ: data bytes; READ_DATA: data after the text */
    int32_t status;        /* replies */
    uint32_t text_len;     /* replies */
} kvli_tcp_hdr_t;

typedef struct kvli_tcp_hello {
    uint32_t version, flags;
    uint64_t incarnation, expect_incarnation;
    char name[KVLI_TCP_NAME_MAX + 1];
    char target[KVLI_TCP_NAME_MAX + 1];
} kvli_tcp_hello_t;

/*
 * conn_pack record (metadata; untrusted on load), 36 bytes:
 *   0 magic u32 ("KVTA") | 4 version u16 | 6 family u16 (4 or 6) | 8 port u16
 *  10 reserved u16 (0) | 12 incarnation u64 | 20 address (4 or 16 bytes, the
 *  rest zero)
 */
#define KVLI_TCP_CONN_MAGIC 0x4154564bu     /* "KVTA" */
#define KVLI_TCP_CONN_VERSION 1u
#define KVLI_TCP_CONN_LEN 36u

typedef struct kvli_tcp_conninfo {
    int family;                             /* 4 or 6 */
    uint16_t port;
    uint64_t incarnation;
    uint8_t addr[16];
} kvli_tcp_conninfo_t;

/* Region key: 0 magic u32 ("KVTR") | 4 version u16 | 6 flags u16 (0) |
 * 8 addr u64 | 16 len u64. */
#define KVLI_TCP_KEY_MAGIC 0x5254564bu      /* "KVTR" */
#define KVLI_TCP_KEY_VERSION 1u
#define KVLI_TCP_KEY_LEN 24u

/* Build a header into b (KVLI_TCP_HDR_LEN bytes). */
void kvli_tcp_proto_hdr_build(uint8_t *b, uint16_t type, uint64_t id, uint64_t len, uint64_t aux);
/* aux of a reply */
uint64_t kvli_tcp_proto_reply_aux(int32_t status, uint32_t text_len);

/*
 * Parse and check a header read from the wire. dir: KVLI_TCP_DIR_REQUEST or
 * _REPLY. Returns 0, or -1 with why filled (a short English reason).
 */
int kvli_tcp_proto_hdr_parse(const uint8_t *b, int dir, kvli_tcp_hdr_t *h, char *why,
                             size_t why_cap);

/*
 * Check n ranges (16 bytes each at b): no empty or wrapping range, and their
 * sum equals payload. On success out[2i], out[2i+1] get addr and len.
 */
int kvli_tcp_proto_ranges_parse(const uint8_t *b, uint32_t n, uint64_t payload, uint64_t *out,
                                char *why, size_t why_cap);

/* HELLO body. Returns its length (<= KVLI_TCP_HELLO_MAX). */
size_t kvli_tcp_proto_hello_build(uint8_t *b, const char *name, uint64_t incarnation,
                                  const char *target, uint64_t expect_incarnation);
int kvli_tcp_proto_hello_parse(const uint8_t *b, size_t len, kvli_tcp_hello_t *h, char *why,
                               size_t why_cap);
/* HELLO_ACK tail (after the text): incarnation and name. */
int kvli_tcp_proto_ack_parse(const uint8_t *b, size_t len, uint64_t *incarnation, char *name,
                             size_t name_cap, char *why, size_t why_cap);

void kvli_tcp_proto_conn_build(uint8_t *b, const kvli_tcp_conninfo_t *ci);
int kvli_tcp_proto_conn_parse(const uint8_t *b, size_t len, kvli_tcp_conninfo_t *ci, char *why,
                              size_t why_cap);

void kvli_tcp_proto_key_build(uint8_t *b, uint64_t addr, uint64_t len);
int kvli_tcp_proto_key_parse(const uint8_t *b, size_t len, uint64_t *addr, uint64_t *rlen,
                             char *why, size_t why_cap);

/* A name is 1..63 bytes of printable ASCII without spaces. */
int kvli_tcp_proto_name_ok(const uint8_t *b, size_t len);
const char *kvli_tcp_proto_type_name(unsigned type);

#endif
