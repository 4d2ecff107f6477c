/*
 * kvlane etcd client: the messages kvlane exchanges with etcd, between the
 * JSON form of etcd's gateway (json-c objects, as etcd.c builds and reads
 * them) and etcd v3's protobuf wire bytes (its gRPC API). One schema table
 * (etcd_pb.c) describes every message; one encoder and one decoder walk it.
 *
 * The JSON form is grpc-gateway's: .proto field names, int64 and uint64 as
 * decimal strings, bytes as padded base64, enums by name, default values
 * and empty repeated fields left out, true the only bool written.
 */
#ifndef KVLI_ETCD_PB_H
#define KVLI_ETCD_PB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <json-c/json.h>

typedef enum {
    KVLI_PB_RANGE_REQ, KVLI_PB_RANGE_RESP, KVLI_PB_PUT_REQ, KVLI_PB_PUT_RESP,
    KVLI_PB_DELETE_REQ, KVLI_PB_DELETE_RESP, KVLI_PB_TXN_REQ, KVLI_PB_TXN_RESP,
    KVLI_PB_LEASE_GRANT_REQ, KVLI_PB_LEASE_GRANT_RESP, KVLI_PB_LEASE_REVOKE_REQ,
    KVLI_PB_LEASE_REVOKE_RESP, KVLI_PB_LEASE_KEEPALIVE_REQ, KVLI_PB_LEASE_KEEPALIVE_RESP,
    KVLI_PB_AUTH_REQ, KVLI_PB_AUTH_RESP, KVLI_PB_WATCH_REQ, KVLI_PB_WATCH_RESP,
    KVLI_PB_LEASE_TTL_REQ, KVLI_PB_LEASE_TTL_RESP, /* LeaseTimeToLive (kvlane doctor) */
    KVLI_PB_N
} kvli_etcd_pb_msg_t;

#define KVLI_ETCD_PB_DEPTH_MAX 8u /* messages inside messages, at most */

/* The gateway path kvlane posts to ("/v3/kv/txn") as a gRPC method:
 * its HTTP/2 path ("/etcdserverpb.KV/Txn"), request and answer types, and
 * whether the method is a stream in gRPC (LeaseKeepAlive, Watch: the gateway
 * wraps their answers as {"result": {...}}). false: a path kvlane does not
 * know. Any out pointer may be NULL. */
bool kvli_etcd_pb_method(const char *gw_path, const char **grpc_path,
                         kvli_etcd_pb_msg_t *req, kvli_etcd_pb_msg_t *resp, bool *stream);

/* The protobuf name of m ("RangeRequest"); "?" when m is out of range. */
const char *kvli_etcd_pb_name(kvli_etcd_pb_msg_t m);

/* JSON (as kvlane builds it for the gateway) -> protobuf bytes (malloc'ed
 * in *buf, *len; an all-default message is 0 bytes and *buf non-NULL).
 * 0, or -1 with why: a field the message does not have, a value of the
 * wrong JSON type, a base64 that does not decode, an int64 string that is
 * not exactly a decimal int64, an enum name that is not one of the enum's,
 * two members of one oneof, nesting deeper than KVLI_ETCD_PB_DEPTH_MAX.
 * Never guesses. int64/uint64 fields take a JSON integer too, enums their
 * number; a JSON null is an absent field (as jsonpb reads it). */
int kvli_etcd_pb_encode(kvli_etcd_pb_msg_t m, json_object *o, uint8_t **buf, size_t *len,
                        char *why, size_t why_cap);

/* protobuf bytes -> a json_object in the form etcd's gateway writes (so
 * the existing readers in etcd.c/etcd_parse.c work unchanged). 0 with
 * *out, or -1 with why (truncated varint/length, a wire type that does not
 * match the field's, a length past the buffer, nesting deeper than
 * KVLI_ETCD_PB_DEPTH_MAX, more than KVLI_ETCD_REPLY_MAX bytes). Unknown
 * field numbers are skipped (protobuf's forward compatibility), with
 * their wire type checked. A field seen twice: the last scalar wins,
 * messages merge, repeated fields append, a oneof member clears the
 * others (protobuf's rules). The answer of a stream method is the bare
 * message: kvli_etcd_pb_answer wraps it as the gateway does. */
int kvli_etcd_pb_decode(kvli_etcd_pb_msg_t m, const uint8_t *buf, size_t len,
                        json_object **out, char *why, size_t why_cap);

/* The answer to gw_path's method, as the gateway would have written it:
 * kvli_etcd_pb_decode of its answer type, inside {"result": ...} when the
 * method is a stream. 0 with *out, or -1 with why (also: an unknown path). */
int kvli_etcd_pb_answer(const char *gw_path, const uint8_t *buf, size_t len, json_object **out,
                        char *why, size_t why_cap);

/* A failed call (gRPC's grpc-status code, and its grpc-message as it came,
 * percent-encoded, or NULL) as the gateway writes it, for every method:
 * {"error":msg,"message":msg,"code":code}, which the existing readers of
 * errors take. NULL: out of memory. */
json_object *kvli_etcd_pb_status(int code, const char *grpc_message);

#endif
