/*
 * kvlane etcd client: gateway JSON <-> etcd v3 protobuf (etcd_pb.h).
 *
 * The messages are data: a table of fields per message (number, JSON name,
 * kind, repeated or oneof), taken from etcd v3.4's rpc.proto and kv.proto.
 * The encoder walks a message's fields in table order (so its output is
 * deterministic); the decoder walks the wire bytes, which came over the
 * network and are checked before anything is believed: every length
 * against what is left, every wire type against the field's, the depth,
 * the size. Unknown field numbers are skipped, as protobuf says.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "etcd_client.h"
#include "etcd_pb.h"

/* ---- the schema */

typedef enum { PB_I64, PB_U64, PB_BOOL, PB_ENUM, PB_BYTES, PB_STR, PB_MSG } kvli_pb_kind_t;

/* Message types: the public ones, then those only found inside them. */
enum {
    PBM_HEADER = KVLI_PB_N, PBM_KV, PBM_EVENT, PBM_REQOP, PBM_RESPOP, PBM_COMPARE,
    PBM_WCREATE, PBM_WCANCEL, PBM_WPROGRESS, PBM_COUNT
};

#define PB_REP 1u /* repeated */

typedef struct kvli_pb_enum {
    const char *name;
    const char *const *vals; /* names by number, 0..n-1 */
    unsigned n;
} kvli_pb_enum_t;

typedef struct kvli_pb_field {
    uint32_t num;
    const char *name;
    uint8_t kind;                /* kvli_pb_kind_t */
    uint8_t flags;               /* PB_REP */
    uint8_t oneof;               /* 0: none; members of one oneof share a number */
    int msg;                     /* PB_MSG: its type */
    const kvli_pb_enum_t *en;    /* PB_ENUM: its names */
} kvli_pb_field_t;

typedef struct kvli_pb_msgdef {
    const char *name;
    const kvli_pb_field_t *f;
    unsigned n;
} kvli_pb_msgdef_t;

static const char *const ev_type_v[] = {"PUT", "DELETE"};
static const char *const sort_order_v[] = {"NONE", "ASCEND", "DESCEND"};
static const char *const sort_target_v[] = {"KEY", "VERSION", "CREATE", "MOD", "VALUE"};
static const char *const cmp_result_v[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
static const char *const cmp_target_v[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
static const char *const filter_v[] = {"NOPUT", "NODELETE"};
#define PB_ENUM_DEF(var, nm, v) \
    static const kvli_pb_enum_t var = {nm, v, sizeof(v) / sizeof(v[0])}
PB_ENUM_DEF(ev_type_e, "Event.EventType", ev_type_v);
PB_ENUM_DEF(sort_order_e, "RangeRequest.SortOrder", sort_order_v);
PB_ENUM_DEF(sort_target_e, "RangeRequest.SortTarget", sort_target_v);
PB_ENUM_DEF(cmp_result_e, "Compare.CompareResult", cmp_result_v);
PB_ENUM_DEF(cmp_target_e, "Compare.CompareTarget", cmp_target_v);
PB_ENUM_DEF(filter_e, "WatchCreateRequest.FilterType", filter_v);

#define F(n, nm, k) {n, nm, k, 0, 0, 0, NULL}
#define FR(n, nm, k) {n, nm, k, PB_REP, 0, 0, NULL}
#define FM(n, nm, t) {n, nm, PB_MSG, 0, 0, t, NULL}
#define FMR(n, nm, t) {n, nm, PB_MSG, PB_REP, 0, t, NULL}
#define FMO(n, nm, t) {n, nm, PB_MSG, 0, 1, t, NULL}
#define FO(n, nm, k) {n, nm, k, 0, 1, 0, NULL}
#define FE(n, nm, e) {n, nm, PB_ENUM, 0, 0, 0, &e}
#define FER(n, nm, e) {n, nm, PB_ENUM, PB_REP, 0, 0, &e}
#define HDR FM(1, "header", PBM_HEADER)

static const kvli_pb_field_t f_header[] = {
    F(1, "cluster_id", PB_U64), F(2, "member_id", PB_U64), F(3, "revision", PB_I64),
    F(4, "raft_term", PB_U64)};
static const kvli_pb_field_t f_kv[] = {
    F(1, "key", PB_BYTES), F(2, "create_revision", PB_I64), F(3, "mod_revision", PB_I64),
    F(4, "version", PB_I64), F(5, "value", PB_BYTES), F(6, "lease", PB_I64)};
static const kvli_pb_field_t f_event[] = {
    FE(1, "type", ev_type_e), FM(2, "kv", PBM_KV), FM(3, "prev_kv", PBM_KV)};
static const kvli_pb_field_t f_range_req[] = {
    F(1, "key", PB_BYTES), F(2, "range_end", PB_BYTES), F(3, "limit", PB_I64),
    F(4, "revision", PB_I64), FE(5, "sort_order", sort_order_e),
    FE(6, "sort_target", sort_target_e), F(7, "serializable", PB_BOOL),
    F(8, "keys_only", PB_BOOL), F(9, "count_only", PB_BOOL),
    F(10, "min_mod_revision", PB_I64), F(11, "max_mod_revision", PB_I64),
    F(12, "min_create_revision", PB_I64), F(13, "max_create_revision", PB_I64)};
static const kvli_pb_field_t f_range_resp[] = {
    HDR, FMR(2, "kvs", PBM_KV), F(3, "more", PB_BOOL), F(4, "count", PB_I64)};
static const kvli_pb_field_t f_put_req[] = {
    F(1, "key", PB_BYTES), F(2, "value", PB_BYTES), F(3, "lease", PB_I64),
    F(4, "prev_kv", PB_BOOL), F(5, "ignore_value", PB_BOOL), F(6, "ignore_lease", PB_BOOL)};
static const kvli_pb_field_t f_put_resp[] = {HDR, FM(2, "prev_kv", PBM_KV)};
static const kvli_pb_field_t f_del_req[] = {
    F(1, "key", PB_BYTES), F(2, "range_end", PB_BYTES), F(3, "prev_kv", PB_BOOL)};
static const kvli_pb_field_t f_del_resp[] = {
    HDR, F(2, "deleted", PB_I64), FMR(3, "prev_kvs", PBM_KV)};
static const kvli_pb_field_t f_reqop[] = {
    FMO(1, "request_range", KVLI_PB_RANGE_REQ), FMO(2, "request_put", KVLI_PB_PUT_REQ),
    FMO(3, "request_delete_range", KVLI_PB_DELETE_REQ), FMO(4, "request_txn", KVLI_PB_TXN_REQ)};
static const kvli_pb_field_t f_respop[] = {
    FMO(1, "response_range", KVLI_PB_RANGE_RESP), FMO(2, "response_put", KVLI_PB_PUT_RESP),
    FMO(3, "response_delete_range", KVLI_PB_DELETE_RESP),
    FMO(4, "response_txn", KVLI_PB_TXN_RESP)};
static const kvli_pb_field_t f_compare[] = {
    FE(1, "result", cmp_result_e), FE(2, "target", cmp_target_e), F(3, "key", PB_BYTES),
    FO(4, "version", PB_I64), FO(5, "create_revision", PB_I64), FO(6, "mod_revision", PB_I64),
    FO(7, "value", PB_BYTES), FO(8, "lease", PB_I64), F(64, "range_end", PB_BYTES)};
static const kvli_pb_field_t f_txn_req[] = {
    FMR(1, "compare", PBM_COMPARE), FMR(2, "success", PBM_REQOP), FMR(3, "failure", PBM_REQOP)};
static const kvli_pb_field_t f_txn_resp[] = {
    HDR, F(2, "succeeded", PB_BOOL), FMR(3, "responses", PBM_RESPOP)};
static const kvli_pb_field_t f_grant_req[] = {F(1, "TTL", PB_I64), F(2, "ID", PB_I64)};
static const kvli_pb_field_t f_grant_resp[] = {
    HDR, F(2, "ID", PB_I64), F(3, "TTL", PB_I64), F(4, "error", PB_STR)};
static const kvli_pb_field_t f_revoke_req[] = {F(1, "ID", PB_I64)};
static const kvli_pb_field_t f_revoke_resp[] = {HDR};
static const kvli_pb_field_t f_ka_req[] = {F(1, "ID", PB_I64)};
static const kvli_pb_field_t f_ka_resp[] = {HDR, F(2, "ID", PB_I64), F(3, "TTL", PB_I64)};
static const kvli_pb_field_t f_ttl_req[] = {F(1, "ID", PB_I64), F(2, "keys", PB_BOOL)};
static const kvli_pb_field_t f_ttl_resp[] = {
    HDR, F(2, "ID", PB_I64), F(3, "TTL", PB_I64), F(4, "grantedTTL", PB_I64),
    FR(5, "keys", PB_BYTES)};
static const kvli_pb_field_t f_auth_req[] = {F(1, "name", PB_STR), F(2, "password", PB_STR)};
static const kvli_pb_field_t f_auth_resp[] = {HDR, F(2, "token", PB_STR)};
static const kvli_pb_field_t f_watch_req[] = {
    FMO(1, "create_request", PBM_WCREATE), FMO(2, "cancel_request", PBM_WCANCEL),
    FMO(3, "progress_request", PBM_WPROGRESS)};
static const kvli_pb_field_t f_wcreate[] = {
    F(1, "key", PB_BYTES), F(2, "range_end", PB_BYTES), F(3, "start_revision", PB_I64),
    F(4, "progress_notify", PB_BOOL), FER(5, "filters", filter_e), F(6, "prev_kv", PB_BOOL),
    F(7, "watch_id", PB_I64), F(8, "fragment", PB_BOOL)};
static const kvli_pb_field_t f_wcancel[] = {F(1, "watch_id", PB_I64)};
static const kvli_pb_field_t f_watch_resp[] = {
    HDR, F(2, "watch_id", PB_I64), F(3, "created", PB_BOOL), F(4, "canceled", PB_BOOL),
    F(5, "compact_revision", PB_I64), F(6, "cancel_reason", PB_STR), F(7, "fragment", PB_BOOL),
    FMR(11, "events", PBM_EVENT)};

#define M(nm, fs) {nm, fs, sizeof(fs) / sizeof(fs[0])}
static const kvli_pb_msgdef_t pb_msgs[PBM_COUNT] = {
    [KVLI_PB_RANGE_REQ] = M("RangeRequest", f_range_req),
    [KVLI_PB_RANGE_RESP] = M("RangeResponse", f_range_resp),
    [KVLI_PB_PUT_REQ] = M("PutRequest", f_put_req),
    [KVLI_PB_PUT_RESP] = M("PutResponse", f_put_resp),
    [KVLI_PB_DELETE_REQ] = M("DeleteRangeRequest", f_del_req),
    [KVLI_PB_DELETE_RESP] = M("DeleteRangeResponse", f_del_resp),
    [KVLI_PB_TXN_REQ] = M("TxnRequest", f_txn_req),
    [KVLI_PB_TXN_RESP] = M("TxnResponse", f_txn_resp),
    [KVLI_PB_LEASE_GRANT_REQ] = M("LeaseGrantRequest", f_grant_req),
    [KVLI_PB_LEASE_GRANT_RESP] = M("LeaseGrantResponse", f_grant_resp),
    [KVLI_PB_LEASE_REVOKE_REQ] = M("LeaseRevokeRequest", f_revoke_req),
    [KVLI_PB_LEASE_REVOKE_RESP] = M("LeaseRevokeResponse", f_revoke_resp),
    [KVLI_PB_LEASE_KEEPALIVE_REQ] = M("LeaseKeepAliveRequest", f_ka_req),
    [KVLI_PB_LEASE_KEEPALIVE_RESP] = M("LeaseKeepAliveResponse", f_ka_resp),
    [KVLI_PB_AUTH_REQ] = M("AuthenticateRequest", f_auth_req),
    [KVLI_PB_AUTH_RESP] = M("AuthenticateResponse", f_auth_resp),
    [KVLI_PB_WATCH_REQ] = M("WatchRequest", f_watch_req),
    [KVLI_PB_WATCH_RESP] = M("WatchResponse", f_watch_resp),
    [KVLI_PB_LEASE_TTL_REQ] = M("LeaseTimeToLiveRequest", f_ttl_req),
    [KVLI_PB_LEASE_TTL_RESP] = M("LeaseTimeToLiveResponse", f_ttl_resp),
    [PBM_HEADER] = M("ResponseHeader", f_header),
    [PBM_KV] = M("KeyValue", f_kv),
    [PBM_EVENT] = M("Event", f_event),
    [PBM_REQOP] = M("RequestOp", f_reqop),
    [PBM_RESPOP] = M("ResponseOp", f_respop),
    [PBM_COMPARE] = M("Compare", f_compare),
    [PBM_WCREATE] = M("WatchCreateRequest", f_wcreate),
    [PBM_WCANCEL] = M("WatchCancelRequest", f_wcancel),
    [PBM_WPROGRESS] = {"WatchProgressRequest", NULL, 0},
};

static const struct {
    const char *gw, *grpc;
    kvli_etcd_pb_msg_t req, resp;
    bool stream;
} pb_methods[] = {
    {"/v3/kv/range", "/etcdserverpb.KV/Range", KVLI_PB_RANGE_REQ, KVLI_PB_RANGE_RESP, false},
    {"/v3/kv/put", "/etcdserverpb.KV/Put", KVLI_PB_PUT_REQ, KVLI_PB_PUT_RESP, false},
    {"/v3/kv/deleterange", "/etcdserverpb.KV/DeleteRange", KVLI_PB_DELETE_REQ,
     KVLI_PB_DELETE_RESP, false},
    {"/v3/kv/txn", "/etcdserverpb.KV/Txn", KVLI_PB_TXN_REQ, KVLI_PB_TXN_RESP, false},
    {"/v3/lease/grant", "/etcdserverpb.Lease/LeaseGrant", KVLI_PB_LEASE_GRANT_REQ,
     KVLI_PB_LEASE_GRANT_RESP, false},
    {"/v3/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke", KVLI_PB_LEASE_REVOKE_REQ,
     KVLI_PB_LEASE_REVOKE_RESP, false},
    {"/v3/lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive", KVLI_PB_LEASE_KEEPALIVE_REQ,
     KVLI_PB_LEASE_KEEPALIVE_RESP, true},
    {"/v3/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive", KVLI_PB_LEASE_TTL_REQ,
     KVLI_PB_LEASE_TTL_RESP, false},
    {"/v3/auth/authenticate", "/etcdserverpb.Auth/Authenticate", KVLI_PB_AUTH_REQ,
     KVLI_PB_AUTH_RESP, false},
    {"/v3/watch", "/etcdserverpb.Watch/Watch", KVLI_PB_WATCH_REQ, KVLI_PB_WATCH_RESP, true},
};

bool kvli_etcd_pb_method(const char *gw_path, const char **grpc_path,
                         kvli_etcd_pb_msg_t *req, kvli_etcd_pb_msg_t *resp, bool *stream)
{
    for (size_t i = 0; gw_path != NULL && i < sizeof(pb_methods) / sizeof(pb_methods[0]); i++) {
        if (strcmp(gw_path, pb_methods[i].gw) != 0)
            continue;
        if (grpc_path != NULL)
            *grpc_path = pb_methods[i].grpc;
        if (req != NULL)
            *req = pb_methods[i].req;
        if (resp != NULL)
            *resp = pb_methods[i].resp;
        if (stream != NULL)
            *stream = pb_methods[i].stream;
        return true;
    }
    return false;
}

const char *kvli_etcd_pb_name(kvli_etcd_pb_msg_t m)
{
    return (unsigned)m < KVLI_PB_N ? pb_msgs[m].name : "?";
}

static void pb_why(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pb_why(char *why, size_t cap, const char *fmt, ...)
{
    if (why == NULL || cap == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

/* ---- encoding */

typedef struct kvli_pb_buf {
    uint8_t *p;
    size_t len, cap;
    bool nomem;
} kvli_pb_buf_t;

static void pb_put(kvli_pb_buf_t *b, const void *data, size_t n)
{
    if (b->nomem)
        return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->nomem = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (p == NULL) {
            b->nomem = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void pb_varint(kvli_pb_buf_t *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0)
            t[n] |= 0x80;
        n++;
    } while (v != 0);
    pb_put(b, t, n);
}

static void pb_tag(kvli_pb_buf_t *b, uint32_t num, unsigned wt)
{
    pb_varint(b, ((uint64_t)num << 3) | wt);
}

/* A JSON type's name, for why. */
static const char *pb_jtype(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double: return "a fractional number";
    case json_type_int: return "an integer";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "?";
}

/* Exactly a decimal integer: optional '-' (neg_ok), digits, nothing else,
 * within int64 (or uint64 when !neg_ok). */
static bool pb_dec(const char *s, bool neg_ok, uint64_t *out)
{
    bool neg = false;
    uint64_t v = 0, lim = neg_ok ? (uint64_t)INT64_MAX : UINT64_MAX;
    if (neg_ok && *s == '-') {
        neg = true;
        lim = (uint64_t)INT64_MAX + 1;
        s++;
    }
    if (*s == '\0')
        return false;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (lim - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = neg ? (uint64_t)0 - v : v;
    return true;
}

typedef struct kvli_pb_enc {
    char *why;
    size_t cap;
} kvli_pb_enc_t;

/* One scalar value of field f (a message's name mn) as a uint64 for a
 * varint; or bytes in *data, *dlen (*dfree: malloc'ed). -1 with why. */
static int pb_enc_scalar(kvli_pb_enc_t *e, const char *mn, const kvli_pb_field_t *f,
                         json_object *v, uint64_t *u, const uint8_t **data, size_t *dlen,
                         void **dfree)
{
    json_type t = json_object_get_type(v);
    *dfree = NULL;
    switch ((kvli_pb_kind_t)f->kind) {
    case PB_I64:
    case PB_U64: {
        bool sgn = f->kind == PB_I64;
        if (t == json_type_int) {
            int64_t i = json_object_get_int64(v);
            /* json-c keeps integers past INT64_MAX as uint64 and clamps them here */
            if (i == INT64_MAX && json_object_get_uint64(v) > (uint64_t)INT64_MAX) {
                if (sgn)
                    goto range;
                *u = json_object_get_uint64(v);
                return 0;
            }
            if (!sgn && i < 0)
                goto range;
            *u = (uint64_t)i;
            return 0;
        }
        if (t == json_type_string) {
            const char *s = json_object_get_string(v);
            if (strlen(s) != (size_t)json_object_get_string_len(v) || !pb_dec(s, sgn, u)) {
                pb_why(e->why, e->cap, "%s.%s: \"%.40s\" is not exactly a decimal %s", mn,
                       f->name, s, sgn ? "int64" : "uint64");
                return -1;
            }
            return 0;
        }
        pb_why(e->why, e->cap, "%s.%s: %s where an %s (an integer or a decimal string) belongs",
               mn, f->name, pb_jtype(v), sgn ? "int64" : "uint64");
        return -1;
    range:
        pb_why(e->why, e->cap, "%s.%s: %s is out of the range of %s", mn, f->name,
               json_object_to_json_string(v), sgn ? "an int64" : "a uint64");
        return -1;
    }
    case PB_BOOL:
        if (t != json_type_boolean) {
            pb_why(e->why, e->cap, "%s.%s: %s where a boolean belongs", mn, f->name,
                   pb_jtype(v));
            return -1;
        }
        *u = json_object_get_boolean(v) ? 1 : 0;
        return 0;
    case PB_ENUM:
        if (t == json_type_string) {
            const char *s = json_object_get_string(v);
            for (unsigned i = 0; i < f->en->n; i++)
                if (strcmp(s, f->en->vals[i]) == 0 &&
                    strlen(s) == (size_t)json_object_get_string_len(v)) {
                    *u = i;
                    return 0;
                }
            pb_why(e->why, e->cap, "%s.%s: \"%.40s\" is not a name of %s", mn, f->name, s,
                   f->en->name);
            return -1;
        }
        if (t == json_type_int) {
            int64_t i = json_object_get_int64(v);
            if (i < INT32_MIN || i > INT32_MAX) {
                pb_why(e->why, e->cap, "%s.%s: %" PRId64 " is out of the range of an enum", mn,
                       f->name, i);
                return -1;
            }
            *u = (uint64_t)i; /* negative: sign-extended, as protobuf writes int32 */
            return 0;
        }
        pb_why(e->why, e->cap, "%s.%s: %s where a name of %s belongs", mn, f->name,
               pb_jtype(v), f->en->name);
        return -1;
    case PB_BYTES:
    case PB_STR:
        if (t != json_type_string) {
            pb_why(e->why, e->cap, "%s.%s: %s where a %s belongs", mn, f->name, pb_jtype(v),
                   f->kind == PB_STR ? "string" : "base64 string");
            return -1;
        }
        if (f->kind == PB_STR) {
            *data = (const uint8_t *)json_object_get_string(v);
            *dlen = (size_t)json_object_get_string_len(v);
            return 0;
        }
        {
            const char *s = json_object_get_string(v);
            size_t n = 0;
            void *d = strlen(s) == (size_t)json_object_get_string_len(v)
                          ? kvli_etcd_unb64(s, &n)
                          : NULL;
            if (d == NULL) {
                pb_why(e->why, e->cap, "%s.%s: \"%.40s\" is not base64 (RFC 4648, padded)", mn,
                       f->name, s);
                return -1;
            }
            *data = d;
            *dlen = n;
            *dfree = d;
            return 0;
        }
    case PB_MSG:
        break;
    }
    pb_why(e->why, e->cap, "%s.%s: no scalar", mn, f->name);
    return -1;
}

static int pb_enc_msg(kvli_pb_enc_t *e, int m, json_object *o, kvli_pb_buf_t *b,
                      unsigned depth);

/* One value of f: tagged, even when a default (a repeated element, a oneof
 * member) when force; else nothing for a default. */
static int pb_enc_value(kvli_pb_enc_t *e, const char *mn, const kvli_pb_field_t *f,
                        json_object *v, kvli_pb_buf_t *b, bool force, unsigned depth)
{
    if (f->kind == PB_MSG) {
        kvli_pb_buf_t sub = {NULL, 0, 0, false};
        if (!json_object_is_type(v, json_type_object)) {
            pb_why(e->why, e->cap, "%s.%s: %s where an object (%s) belongs", mn, f->name,
                   pb_jtype(v), pb_msgs[f->msg].name);
            return -1;
        }
        if (pb_enc_msg(e, f->msg, v, &sub, depth + 1) != 0) {
            free(sub.p);
            return -1;
        }
        /* a message that is set is written, even empty (it says "set") */
        pb_tag(b, f->num, 2);
        pb_varint(b, sub.len);
        pb_put(b, sub.p, sub.len);
        b->nomem = b->nomem || sub.nomem;
        free(sub.p);
        return 0;
    }
    uint64_t u = 0;
    const uint8_t *data = NULL;
    size_t dlen = 0;
    void *dfree = NULL;
    if (pb_enc_scalar(e, mn, f, v, &u, &data, &dlen, &dfree) != 0)
        return -1;
    if (f->kind == PB_BYTES || f->kind == PB_STR) {
        if (dlen > 0 || force) {
            pb_tag(b, f->num, 2);
            pb_varint(b, dlen);
            pb_put(b, data, dlen);
        }
    } else if (u != 0 || force) {
        pb_tag(b, f->num, 0);
        pb_varint(b, u);
    }
    free(dfree);
    return 0;
}

static int pb_enc_msg(kvli_pb_enc_t *e, int m, json_object *o, kvli_pb_buf_t *b, unsigned depth)
{
    const kvli_pb_msgdef_t *d = &pb_msgs[m];
    if (depth > KVLI_ETCD_PB_DEPTH_MAX) {
        pb_why(e->why, e->cap, "%s: messages nested deeper than %u", d->name,
               KVLI_ETCD_PB_DEPTH_MAX);
        return -1;
    }
    if (!json_object_is_type(o, json_type_object)) {
        pb_why(e->why, e->cap, "%s: %s where an object belongs", d->name, pb_jtype(o));
        return -1;
    }
    /* every name must be one of the message's */
    json_object_object_foreach(o, key, val) {
        (void)val;
        unsigned i = 0;
        while (i < d->n && strcmp(d->f[i].name, key) != 0)
            i++;
        if (i == d->n) {
            pb_why(e->why, e->cap, "%s has no field \"%.60s\"", d->name, key);
            return -1;
        }
    }
    const char *oneof_set = NULL;
    for (unsigned i = 0; i < d->n; i++) {
        const kvli_pb_field_t *f = &d->f[i];
        json_object *v = NULL;
        if (!json_object_object_get_ex(o, f->name, &v) || v == NULL)
            continue; /* absent, or null: not set */
        if (f->oneof != 0) {
            if (oneof_set != NULL) {
                pb_why(e->why, e->cap, "%s: %s and %s are members of one oneof (one at most)",
                       d->name, oneof_set, f->name);
                return -1;
            }
            oneof_set = f->name;
        }
        if (!(f->flags & PB_REP)) {
            if (pb_enc_value(e, d->name, f, v, b, f->oneof != 0, depth) != 0)
                return -1;
            continue;
        }
        if (!json_object_is_type(v, json_type_array)) {
            pb_why(e->why, e->cap, "%s.%s: %s where an array belongs", d->name, f->name,
                   pb_jtype(v));
            return -1;
        }
        size_t n = json_object_array_length(v);
        if (f->kind == PB_MSG || f->kind == PB_BYTES || f->kind == PB_STR) {
            for (size_t k = 0; k < n; k++) {
                json_object *el = json_object_array_get_idx(v, k);
                if (el == NULL) {
                    pb_why(e->why, e->cap, "%s.%s: null in the array", d->name, f->name);
                    return -1;
                }
                if (pb_enc_value(e, d->name, f, el, b, true, depth) != 0)
                    return -1;
            }
            continue;
        }
        /* repeated varints: packed, as proto3 writes them */
        kvli_pb_buf_t pk = {NULL, 0, 0, false};
        for (size_t k = 0; k < n; k++) {
            json_object *el = json_object_array_get_idx(v, k);
            uint64_t u = 0;
            const uint8_t *data = NULL;
            size_t dlen = 0;
            void *dfree = NULL;
            if (el == NULL) {
                pb_why(e->why, e->cap, "%s.%s: null in the array", d->name, f->name);
                free(pk.p);
                return -1;
            }
            if (pb_enc_scalar(e, d->name, f, el, &u, &data, &dlen, &dfree) != 0) {
                free(pk.p);
                return -1;
            }
            pb_varint(&pk, u);
        }
        if (n > 0) {
            pb_tag(b, f->num, 2);
            pb_varint(b, pk.len);
            pb_put(b, pk.p, pk.len);
        }
        b->nomem = b->nomem || pk.nomem;
        free(pk.p);
    }
    return 0;
}

int kvli_etcd_pb_encode(kvli_etcd_pb_msg_t m, json_object *o, uint8_t **buf, size_t *len,
                        char *why, size_t why_cap)
{
    kvli_pb_enc_t e = {why, why_cap};
    kvli_pb_buf_t b = {NULL, 0, 0, false};
    *buf = NULL;
    *len = 0;
    if ((unsigned)m >= KVLI_PB_N) {
        pb_why(why, why_cap, "message type %d is not one kvlane knows", (int)m);
        return -1;
    }
    if (pb_enc_msg(&e, (int)m, o, &b, 0) != 0) {
        free(b.p);
        return -1;
    }
    pb_put(&b, "", 0);
    if (b.p == NULL && !b.nomem)
        b.p = malloc(1);
    if (b.nomem || b.p == NULL) {
        free(b.p);
        pb_why(why, why_cap, "%s: out of memory", pb_msgs[m].name);
        return -1;
    }
    *buf = b.p;
    *len = b.len;
    return 0;
}

/* ---- decoding */

typedef struct kvli_pb_dec {
    char *why;
    size_t cap;
} kvli_pb_dec_t;

/* A varint at *p (before end): 0 and *p past it; -1 truncated or longer
 * than 10 bytes (or past 64 bits). */
static int pb_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (*p + i >= end)
            return -1;
        uint8_t c = (*p)[i];
        if (i == 9 && c > 1)
            return -1; /* bits past the 64th */
        x |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *p += i + 1;
            *v = x;
            return 0;
        }
    }
    return -1;
}

static const char *pb_wt_name(unsigned wt)
{
    static const char *const n[] = {"varint", "64-bit", "length-delimited", "group start",
                                    "group end", "32-bit", "6 (none)", "7 (none)"};
    return n[wt & 7];
}

/* The JSON of one scalar value (u: the varint; data/dlen: the bytes). */
static json_object *pb_dec_json(const kvli_pb_field_t *f, uint64_t u, const uint8_t *data,
                                size_t dlen)
{
    char t[24];
    switch ((kvli_pb_kind_t)f->kind) {
    case PB_I64:
        snprintf(t, sizeof(t), "%" PRId64, (int64_t)u);
        return json_object_new_string(t);
    case PB_U64:
        snprintf(t, sizeof(t), "%" PRIu64, u);
        return json_object_new_string(t);
    case PB_BOOL:
        return json_object_new_boolean(u != 0);
    case PB_ENUM: {
        int32_t x = (int32_t)(uint32_t)u; /* an enum is an int32 */
        if (x >= 0 && (unsigned)x < f->en->n)
            return json_object_new_string(f->en->vals[x]);
        return json_object_new_int(x); /* jsonpb writes an unknown value as its number */
    }
    case PB_BYTES: {
        char *s = kvli_etcd_b64(data, dlen);
        json_object *j = s != NULL ? json_object_new_string(s) : NULL;
        free(s);
        return j;
    }
    case PB_STR:
        return json_object_new_string_len((const char *)data, (int)dlen);
    case PB_MSG:
        break;
    }
    return NULL;
}

/* Whether a decoded scalar is its field's default (left out of the JSON). */
static bool pb_dec_default(const kvli_pb_field_t *f, uint64_t u, size_t dlen)
{
    switch ((kvli_pb_kind_t)f->kind) {
    case PB_BYTES:
        return false; /* present, even empty: the gateway's Go code keeps an empty slice */
    case PB_STR:
        return dlen == 0;
    case PB_ENUM:
        return (uint32_t)u == 0;
    default:
        return u == 0;
    }
}

static int pb_dec_msg(kvli_pb_dec_t *dc, int m, const uint8_t *p, const uint8_t *end,
                      json_object *into, unsigned depth);

/* Append j to the array o[name] (made when absent). -1: out of memory. */
static int pb_dec_append(json_object *o, const char *name, json_object *j)
{
    json_object *a = NULL;
    if (j == NULL)
        return -1;
    if (!json_object_object_get_ex(o, name, &a) || !json_object_is_type(a, json_type_array)) {
        a = json_object_new_array();
        if (a == NULL || json_object_object_add(o, name, a) != 0) {
            json_object_put(a);
            json_object_put(j);
            return -1;
        }
    }
    if (json_object_array_add(a, j) != 0) {
        json_object_put(j);
        return -1;
    }
    return 0;
}

static int pb_nomem(kvli_pb_dec_t *dc, const char *mn)
{
    pb_why(dc->why, dc->cap, "%s: out of memory", mn);
    return -1;
}

/* Field f of message d, wire type wt, its bytes at *p: into o. */
static int pb_dec_field(kvli_pb_dec_t *dc, const kvli_pb_msgdef_t *d, const kvli_pb_field_t *f,
                        unsigned wt, const uint8_t **p, const uint8_t *end, json_object *o,
                        unsigned depth)
{
    bool rep = (f->flags & PB_REP) != 0;
    bool varint = f->kind == PB_I64 || f->kind == PB_U64 || f->kind == PB_BOOL ||
                  f->kind == PB_ENUM;
    unsigned want = varint ? 0 : 2;
    /* a repeated varint field may come packed (length-delimited) */
    if (wt != want && !(varint && rep && wt == 2)) {
        pb_why(dc->why, dc->cap, "%s.%s (field %u): wire type %s where %s belongs", d->name,
               f->name, (unsigned)f->num, pb_wt_name(wt), pb_wt_name(want));
        return -1;
    }
    if (f->oneof != 0) /* a oneof member clears the others */
        for (unsigned i = 0; i < d->n; i++)
            if (d->f[i].oneof == f->oneof && &d->f[i] != f)
                json_object_object_del(o, d->f[i].name);
    if (wt == 0) {
        uint64_t u = 0;
        if (pb_get_varint(p, end, &u) != 0) {
            pb_why(dc->why, dc->cap, "%s.%s: truncated varint (or longer than 10 bytes)",
                   d->name, f->name);
            return -1;
        }
        if (rep)
            return pb_dec_append(o, f->name, pb_dec_json(f, u, NULL, 0)) == 0
                       ? 0
                       : pb_nomem(dc, d->name);
        if (f->oneof == 0 && pb_dec_default(f, u, 0)) {
            json_object_object_del(o, f->name); /* the last value wins, and it is the default */
            return 0;
        }
        json_object *j = pb_dec_json(f, u, NULL, 0);
        if (j == NULL || json_object_object_add(o, f->name, j) != 0) {
            json_object_put(j);
            return pb_nomem(dc, d->name);
        }
        return 0;
    }
    uint64_t n = 0;
    if (pb_get_varint(p, end, &n) != 0) {
        pb_why(dc->why, dc->cap, "%s.%s: truncated length", d->name, f->name);
        return -1;
    }
    if (n > (uint64_t)(end - *p)) {
        pb_why(dc->why, dc->cap, "%s.%s: length %" PRIu64 " past the end (%zu bytes left)",
               d->name, f->name, n, (size_t)(end - *p));
        return -1;
    }
    const uint8_t *s = *p, *se = *p + n;
    *p = se;
    if (varint) { /* packed */
        while (s < se) {
            uint64_t u = 0;
            if (pb_get_varint(&s, se, &u) != 0) {
                pb_why(dc->why, dc->cap, "%s.%s: truncated varint in a packed field", d->name,
                       f->name);
                return -1;
            }
            if (pb_dec_append(o, f->name, pb_dec_json(f, u, NULL, 0)) != 0)
                return pb_nomem(dc, d->name);
        }
        return 0;
    }
    if (f->kind == PB_MSG) {
        json_object *sub = NULL;
        if (rep || !json_object_object_get_ex(o, f->name, &sub) ||
            !json_object_is_type(sub, json_type_object)) {
            /* new; a message seen again merges into the one there */
            sub = json_object_new_object();
            if (sub == NULL || (rep ? pb_dec_append(o, f->name, sub)
                                    : json_object_object_add(o, f->name, sub)) != 0) {
                if (!rep)
                    json_object_put(sub);
                return pb_nomem(dc, d->name);
            }
        }
        return pb_dec_msg(dc, f->msg, s, se, sub, depth + 1);
    }
    if (f->kind == PB_STR && n > INT32_MAX)
        return pb_nomem(dc, d->name);
    if (rep)
        return pb_dec_append(o, f->name, pb_dec_json(f, 0, s, (size_t)n)) == 0
                   ? 0
                   : pb_nomem(dc, d->name);
    if (f->oneof == 0 && pb_dec_default(f, 0, (size_t)n)) {
        json_object_object_del(o, f->name);
        return 0;
    }
    json_object *j = pb_dec_json(f, 0, s, (size_t)n);
    if (j == NULL || json_object_object_add(o, f->name, j) != 0) {
        json_object_put(j);
        return pb_nomem(dc, d->name);
    }
    return 0;
}

/* Skip an unknown field's value of wire type wt. */
static int pb_skip(kvli_pb_dec_t *dc, const kvli_pb_msgdef_t *d, uint64_t num, unsigned wt,
                   const uint8_t **p, const uint8_t *end)
{
    uint64_t n = 0;
    switch (wt) {
    case 0:
        if (pb_get_varint(p, end, &n) == 0)
            return 0;
        pb_why(dc->why, dc->cap, "%s: unknown field %" PRIu64 ": truncated varint", d->name,
               num);
        return -1;
    case 1:
    case 5:
        n = wt == 1 ? 8 : 4;
        break;
    case 2:
        if (pb_get_varint(p, end, &n) != 0) {
            pb_why(dc->why, dc->cap, "%s: unknown field %" PRIu64 ": truncated length",
                   d->name, num);
            return -1;
        }
        break;
    default:
        pb_why(dc->why, dc->cap, "%s: unknown field %" PRIu64 " of wire type %s (refused)",
               d->name, num, pb_wt_name(wt));
        return -1;
    }
    if (n > (uint64_t)(end - *p)) {
        pb_why(dc->why, dc->cap, "%s: unknown field %" PRIu64 ": length %" PRIu64
               " past the end (%zu bytes left)", d->name, num, n, (size_t)(end - *p));
        return -1;
    }
    *p += n;
    return 0;
}

static int pb_dec_msg(kvli_pb_dec_t *dc, int m, const uint8_t *p, const uint8_t *end,
                      json_object *into, unsigned depth)
{
    const kvli_pb_msgdef_t *d = &pb_msgs[m];
    if (depth > KVLI_ETCD_PB_DEPTH_MAX) {
        pb_why(dc->why, dc->cap, "%s: messages nested deeper than %u", d->name,
               KVLI_ETCD_PB_DEPTH_MAX);
        return -1;
    }
    while (p < end) {
        uint64_t tag = 0;
        if (pb_get_varint(&p, end, &tag) != 0) {
            pb_why(dc->why, dc->cap, "%s: truncated varint (a field's tag)", d->name);
            return -1;
        }
        uint64_t num = tag >> 3;
        unsigned wt = (unsigned)(tag & 7);
        if (num == 0 || num > 0x1fffffff) {
            pb_why(dc->why, dc->cap, "%s: field number %" PRIu64 " is not a valid one", d->name,
                   num);
            return -1;
        }
        if (wt == 3 || wt == 4 || wt > 5) {
            pb_why(dc->why, dc->cap, "%s: field %" PRIu64 " has wire type %s (refused)", d->name,
                   num, pb_wt_name(wt));
            return -1;
        }
        unsigned i = 0;
        while (i < d->n && d->f[i].num != num)
            i++;
        int r = i < d->n ? pb_dec_field(dc, d, &d->f[i], wt, &p, end, into, depth)
                         : pb_skip(dc, d, num, wt, &p, end);
        if (r != 0)
            return -1;
    }
    return 0;
}

int kvli_etcd_pb_decode(kvli_etcd_pb_msg_t m, const uint8_t *buf, size_t len,
                        json_object **out, char *why, size_t why_cap)
{
    kvli_pb_dec_t dc = {why, why_cap};
    *out = NULL;
    if ((unsigned)m >= KVLI_PB_N) {
        pb_why(why, why_cap, "message type %d is not one kvlane knows", (int)m);
        return -1;
    }
    if (len > KVLI_ETCD_REPLY_MAX) {
        pb_why(why, why_cap, "%s: %zu bytes, more than the %u of an answer kvlane reads",
               pb_msgs[m].name, len, (unsigned)KVLI_ETCD_REPLY_MAX);
        return -1;
    }
    if (buf == NULL && len > 0) {
        pb_why(why, why_cap, "%s: no bytes", pb_msgs[m].name);
        return -1;
    }
    json_object *o = json_object_new_object();
    if (o == NULL)
        return pb_nomem(&dc, pb_msgs[m].name);
    if (len > 0 && pb_dec_msg(&dc, (int)m, buf, buf + len, o, 0) != 0) {
        json_object_put(o);
        return -1;
    }
    *out = o;
    return 0;
}

int kvli_etcd_pb_answer(const char *gw_path, const uint8_t *buf, size_t len, json_object **out,
                        char *why, size_t why_cap)
{
    kvli_etcd_pb_msg_t resp = KVLI_PB_N;
    bool stream = false;
    *out = NULL;
    if (!kvli_etcd_pb_method(gw_path, NULL, NULL, &resp, &stream)) {
        pb_why(why, why_cap, "%.100s is not a path kvlane knows a gRPC method for",
               gw_path != NULL ? gw_path : "(null)");
        return -1;
    }
    json_object *o = NULL;
    if (kvli_etcd_pb_decode(resp, buf, len, &o, why, why_cap) != 0)
        return -1;
    if (stream) {
        json_object *w = json_object_new_object();
        if (w == NULL || json_object_object_add(w, "result", o) != 0) {
            json_object_put(w);
            json_object_put(o);
            pb_why(why, why_cap, "out of memory");
            return -1;
        }
        o = w;
    }
    *out = o;
    return 0;
}

static int pb_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

json_object *kvli_etcd_pb_status(int code, const char *grpc_message)
{
    /* grpc-message is percent-encoded (gRPC over HTTP/2); a '%' not followed
     * by two hex digits stays as it is */
    const char *in = grpc_message != NULL ? grpc_message : "";
    size_t n = strlen(in), w = 0;
    char *m = malloc(n + 1);
    if (m == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        int hi = -1, lo = -1;
        if (in[i] == '%' && i + 2 < n && (hi = pb_hexval(in[i + 1])) >= 0 &&
            (lo = pb_hexval(in[i + 2])) >= 0 && (hi | lo) != 0) {
            m[w++] = (char)(hi << 4 | lo);
            i += 2;
        } else {
            m[w++] = in[i];
        }
    }
    m[w] = '\0';
    json_object *o = json_object_new_object();
    if (o != NULL) {
        json_object_object_add(o, "error", json_object_new_string(m));
        json_object_object_add(o, "message", json_object_new_string(m));
        json_object_object_add(o, "code", json_object_new_int(code));
    }
    free(m);
    return o;
}
