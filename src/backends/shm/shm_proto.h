/*
 * kvlane shm backend: the Unix socket protocol between two agents.
 *
 * Both ends run on one host with one ABI, so fields are in native byte
 * order; every length is still checked, the peer is untrusted.
 *
 * A connection is opened by the initiator (peer_load) and carries, in
 * order: HELLO (answered by HELLO_ACK and the guard table's fd), then
 * requests (NOTIF, NOTIF_GRANTED, FD_REQ, WRITE, READ). The target answers on
 * the same connection (HELLO_ACK, NOTIF_ACK, FD_REPLY, WRITE_ACK, READ_DATA);
 * NOTIF_GRANTED, a small notification sent within a grant (see protocol 5
 * below), has no answer. Every message is a header followed by hdr.len bytes
 * of body.
 */
#ifndef KVLI_SHM_PROTO_H
#define KVLI_SHM_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include "common/sock.h" /* kvli_iov_advance */

#define KVLI_SHM_MSG_MAGIC 0x4b4c534du     /* "KLSM" */
/* 4: a target copies a WRITE's payload only while the initiator holds the
 * connection (checked before every receive into registered memory); an
 * initiator gives requests up by shutting the connection down. */
/* 5: NOTIF is answered (NOTIF_ACK): the target queues it within its bound or
 * refuses it (KVL_ERR_REMOTE_FULL and why), so the sender knows; the answer
 * grants room for small notifications sent without an answer (NOTIF_GRANTED):
 * the reply's payload field is the number of slots added to the sender's
 * grant (each one notification of at most KVLI_SHM_NOTIF_SLOT bytes, held for
 * it in the target's bound). Both ends count: the sender spends a slot per
 * NOTIF_GRANTED, the target takes one per NOTIF_GRANTED received; one beyond
 * the grant is a protocol error. A NOTIF (body: kvli_shm_msg_notif_t, then
 * the message) gives the sender's unused slots back (surrender), so room held
 * for it serves its own larger notifications. A NOTIF_GRANTED with an id (not 0) also asks
 * for more: the target answers it with a NOTIF_ACK (status 0, the slots
 * added), which the sender does not wait for. */
#define KVLI_SHM_PROTO_VERSION 5u
/* Upper bound of a data request's payload; we send at most KVLI_SHM_CHUNK. */
#define KVLI_SHM_PAYLOAD_MAX (64ull << 20)

enum {
    KVLI_SHM_MSG_HELLO = 1,
    KVLI_SHM_MSG_HELLO_ACK = 2,
    KVLI_SHM_MSG_NOTIF = 3,
    KVLI_SHM_MSG_FD_REQ = 4,
    KVLI_SHM_MSG_FD_REPLY = 5,
    KVLI_SHM_MSG_WRITE = 6,
    KVLI_SHM_MSG_WRITE_ACK = 7,
    KVLI_SHM_MSG_READ = 8,
    KVLI_SHM_MSG_READ_DATA = 9,
    KVLI_SHM_MSG_NOTIF_ACK = 10,
    KVLI_SHM_MSG_NOTIF_GRANTED = 11
};

#define KVLI_SHM_NOTIF_SLOT 1024u       /* a granted notification's largest size */
#define KVLI_SHM_NOTIF_GRANT_MAX 65536u /* slots a NOTIF_ACK may add */

typedef struct kvli_shm_msg_hdr {
    uint32_t magic;
    uint32_t type;
    uint64_t id;                /* request id, echoed in the reply */
    uint64_t len;               /* body bytes after the header */
} kvli_shm_msg_hdr_t;

/*
 * HELLO and HELLO_ACK; the agent name follows (name_len bytes, no NUL), then,
 * with KVLI_SHM_HELLO_MAC in flags, a proof of the agent's shared secret
 * (KVLI_MAC_LEN bytes):
 *   HELLO:     HMAC-SHA256(secret, "kvlane-shm-v2 hello" | target incarnation |
 *              initiator incarnation | initiator name)
 *   HELLO_ACK: HMAC-SHA256(secret, "kvlane-shm-v2 ack" | initiator incarnation |
 *              target incarnation | target name)
 * (incarnations as 8 little-endian bytes). The target's incarnation is new
 * at every start, so a proof is good for one target process only.
 */
typedef struct kvli_shm_msg_hello {
    uint32_t version;
    uint32_t name_len;
    uint64_t incarnation;
    uint32_t pid;
    uint32_t flags;             /* KVLI_SHM_HELLO_* */
} kvli_shm_msg_hello_t;

#define KVLI_SHM_HELLO_MAC 1u
/* HELLO_ACK: the connection's guard table (shm_guard.c) is passed with it
 * (SCM_RIGHTS); without it the initiator must use the socket path only. */
#define KVLI_SHM_HELLO_GUARD 2u

/* Every reply: then text_len bytes of refusal text, then payload bytes. */
typedef struct kvli_shm_msg_reply {
    int32_t status;
    uint32_t text_len;
    uint64_t payload;           /* READ_DATA: data bytes; FD_REPLY: map size */
} kvli_shm_msg_reply_t;

/* WRITE and READ: then nranges {addr, len} pairs, then (WRITE) payload. */
typedef struct kvli_shm_msg_rw {
    uint32_t nranges;
    uint32_t reserved;
    uint64_t payload;
} kvli_shm_msg_rw_t;

/* NOTIF: then the message (hdr.len - 8 bytes). */
typedef struct kvli_shm_msg_notif {
    uint32_t surrender;         /* unused slots of the grant given back */
    uint32_t reserved;
} kvli_shm_msg_notif_t;

typedef struct kvli_shm_msg_fdreq {
    uint64_t shm_id;
} kvli_shm_msg_fdreq_t;

/*
 * conn_pack record (metadata, untrusted on load), native byte order:
 *   0 magic u32 | 4 version u16 | 6 flags u16 (bit 0: abstract socket)
 *   8 incarnation u64 | 16 probe word address u64 | 24 netns inode u64
 *  32 pidns inode u64 | 40 pid u32 | 44 uid u32 | 48 boot id char[40]
 *  88 socket name length u16 | 90 reserved u16 | 92 socket name (no NUL)
 */
#define KVLI_SHM_CONN_MAGIC 0x48534c4bu     /* "KLSH" */
#define KVLI_SHM_CONN_VERSION 1u
#define KVLI_SHM_CONN_FIXED 92u

#define KVLI_SHM_EOF (-1)   /* helpers: orderly close by the other side */

/* Helpers return 0, a positive errno, or KVLI_SHM_EOF. They modify iov. */
int kvli_shm_proto_sendv(int fd, struct iovec *iov, int iovcnt);
/* Like sendv, without blocking longer than timeout_ms without progress
 * (ETIMEDOUT then); *sent_p gets the bytes handed over. */
int kvli_shm_proto_sendv_tmo(int fd, struct iovec *iov, int iovcnt, uint64_t timeout_ms,
                             uint64_t *sent_p);
int kvli_shm_proto_recvv(int fd, struct iovec *iov, int iovcnt);
/* Receive exactly len bytes; a passed fd (at most one) lands in *fd_p,
 * any other is closed. fd_p may be NULL (then every passed fd is closed). */
int kvli_shm_proto_recv(int fd, void *buf, size_t len, int *fd_p);
int kvli_shm_proto_drain(int fd, uint64_t len, void *scratch, size_t cap);
const char *kvli_shm_proto_type_name(uint32_t type);

#endif
