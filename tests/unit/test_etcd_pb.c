/* The codec between etcd's gateway JSON and etcd v3 protobuf
 * (src/store/etcd_pb.c): what kvlane sends encodes to the bytes the
 * protobuf spec gives (worked out by hand here) and decodes back; answers
 * built byte by byte decode to exactly what the gateway writes, and read
 * through etcd_parse.c as before; every malformed input is refused with a
 * why that names the problem. */
#include <string.h>
#include "common/kvltest.h"

#ifndef KVL_HAVE_ETCD
int main(void)
{
    KT_SKIP("%s", KT_NO_ETCD_STORE);
}
#else
#include "store/etcd_client.h"
#include "store/etcd_pb.h"

static json_object *J(const char *text)
{
    json_object *o = json_tokener_parse(text);
    if (o == NULL)
        fprintf(stderr, "not JSON: %s\n", text);
    KT_CHECK(o != NULL);
    return o;
}

/* "08 05" -> bytes */
static size_t hex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = 0;
    while (*s != '\0') {
        if (*s == ' ') {
            s++;
            continue;
        }
        unsigned v = 0;
        KT_CHECK(sscanf(s, "%2x", &v) == 1 && n < cap);
        out[n++] = (uint8_t)v;
        s += 2;
    }
    return n;
}

static void show(const char *what, const uint8_t *b, size_t n)
{
    fprintf(stderr, "%s:", what);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %02x", b[i]);
    fprintf(stderr, "\n");
}

/* Encode json; compare with want_hex (NULL: any bytes). The bytes are
 * returned (malloc'ed) in *bp, *np when bp is not NULL. */
static void enc_ok(kvli_etcd_pb_msg_t m, const char *json, const char *want_hex, uint8_t **bp,
                   size_t *np)
{
    json_object *o = J(json);
    uint8_t *b = NULL, want[512];
    size_t n = 0;
    char why[256] = "";
    int r = kvli_etcd_pb_encode(m, o, &b, &n, why, sizeof(why));
    if (r != 0)
        fprintf(stderr, "encoding %s %s: %s\n", kvli_etcd_pb_name(m), json, why);
    KT_CHECK(r == 0 && b != NULL);
    if (want_hex != NULL) {
        size_t wn = hex(want_hex, want, sizeof(want));
        if (wn != n || memcmp(want, b, n) != 0) {
            fprintf(stderr, "encoding %s %s\n", kvli_etcd_pb_name(m), json);
            show("  got ", b, n);
            show("  want", want, wn);
            KT_CHECK(0);
        }
    }
    json_object_put(o);
    if (bp != NULL) {
        *bp = b;
        *np = n;
    } else {
        free(b);
    }
}

/* Decode bytes; the result must equal want (JSON text). Returns it. */
static json_object *dec_eq(kvli_etcd_pb_msg_t m, const uint8_t *b, size_t n, const char *want)
{
    json_object *o = NULL, *w = J(want);
    char why[256] = "";
    int r = kvli_etcd_pb_decode(m, b, n, &o, why, sizeof(why));
    if (r != 0) {
        fprintf(stderr, "decoding %s: %s\n", kvli_etcd_pb_name(m), why);
        show("  bytes", b, n);
    }
    KT_CHECK(r == 0 && o != NULL);
    if (!json_object_equal(o, w)) {
        fprintf(stderr, "decoding %s\n  got  %s\n", kvli_etcd_pb_name(m),
                json_object_to_json_string(o));
        fprintf(stderr, "  want %s\n", want);
        KT_CHECK(0);
    }
    json_object_put(w);
    return o;
}

static json_object *dec_hex(kvli_etcd_pb_msg_t m, const char *h, const char *want)
{
    uint8_t b[512];
    size_t n = hex(h, b, sizeof(b));
    return dec_eq(m, b, n, want);
}

static void dec_hex_put(kvli_etcd_pb_msg_t m, const char *h, const char *want)
{
    json_object_put(dec_hex(m, h, want));
}

static void enc_bad(kvli_etcd_pb_msg_t m, const char *json, const char *needle)
{
    json_object *o = J(json);
    uint8_t *b = (uint8_t *)"x";
    size_t n = 7;
    char why[256] = "";
    int r = kvli_etcd_pb_encode(m, o, &b, &n, why, sizeof(why));
    if (r != -1 || b != NULL || n != 0 || strstr(why, needle) == NULL) {
        fprintf(stderr, "encoding %s %s: r %d, why '%s' (expected '%s')\n",
                kvli_etcd_pb_name(m), json, r, why, needle);
        KT_CHECK(0);
    }
    json_object_put(o);
}

static void dec_bad_n(kvli_etcd_pb_msg_t m, const uint8_t *b, size_t n, const char *needle)
{
    json_object *o = (json_object *)1;
    char why[256] = "";
    int r = kvli_etcd_pb_decode(m, b, n, &o, why, sizeof(why));
    if (r != -1 || o != NULL || strstr(why, needle) == NULL) {
        fprintf(stderr, "decoding %s: r %d, why '%s' (expected '%s')\n", kvli_etcd_pb_name(m),
                r, why, needle);
        show("  bytes", b, n);
        KT_CHECK(0);
    }
}

static void dec_bad(kvli_etcd_pb_msg_t m, const char *h, const char *needle)
{
    uint8_t b[512];
    size_t n = hex(h, b, sizeof(b));
    dec_bad_n(m, b, n, needle);
}

/* JSON -> pb -> JSON: the answer is want (the gateway's form of json). */
static void round_trip(kvli_etcd_pb_msg_t m, const char *json, const char *want)
{
    uint8_t *b = NULL;
    size_t n = 0;
    enc_ok(m, json, NULL, &b, &n);
    json_object_put(dec_eq(m, b, n, want != NULL ? want : json));
    free(b);
}

static void test_methods(void)
{
    static const struct {
        const char *gw, *grpc;
        kvli_etcd_pb_msg_t req, resp;
        bool stream;
    } want[] = {
        {"/v3/kv/range", "/etcdserverpb.KV/Range", KVLI_PB_RANGE_REQ, KVLI_PB_RANGE_RESP, 0},
        {"/v3/kv/put", "/etcdserverpb.KV/Put", KVLI_PB_PUT_REQ, KVLI_PB_PUT_RESP, 0},
        {"/v3/kv/deleterange", "/etcdserverpb.KV/DeleteRange", KVLI_PB_DELETE_REQ,
         KVLI_PB_DELETE_RESP, 0},
        {"/v3/kv/txn", "/etcdserverpb.KV/Txn", KVLI_PB_TXN_REQ, KVLI_PB_TXN_RESP, 0},
        {"/v3/lease/grant", "/etcdserverpb.Lease/LeaseGrant", KVLI_PB_LEASE_GRANT_REQ,
         KVLI_PB_LEASE_GRANT_RESP, 0},
        {"/v3/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke", KVLI_PB_LEASE_REVOKE_REQ,
         KVLI_PB_LEASE_REVOKE_RESP, 0},
        {"/v3/lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive",
         KVLI_PB_LEASE_KEEPALIVE_REQ, KVLI_PB_LEASE_KEEPALIVE_RESP, 1},
        {"/v3/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive", KVLI_PB_LEASE_TTL_REQ,
         KVLI_PB_LEASE_TTL_RESP, 0},
        {"/v3/auth/authenticate", "/etcdserverpb.Auth/Authenticate", KVLI_PB_AUTH_REQ,
         KVLI_PB_AUTH_RESP, 0},
        {"/v3/watch", "/etcdserverpb.Watch/Watch", KVLI_PB_WATCH_REQ, KVLI_PB_WATCH_RESP, 1},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *g = NULL;
        kvli_etcd_pb_msg_t rq = KVLI_PB_N, rs = KVLI_PB_N;
        bool st = !want[i].stream;
        KT_CHECK(kvli_etcd_pb_method(want[i].gw, &g, &rq, &rs, &st));
        KT_CHECK(g != NULL && strcmp(g, want[i].grpc) == 0);
        KT_CHECK(rq == want[i].req && rs == want[i].resp && st == want[i].stream);
    }
    KT_CHECK(!kvli_etcd_pb_method("/v3/kv/compaction", NULL, NULL, NULL, NULL));
    KT_CHECK(!kvli_etcd_pb_method("/v3/kv/rangex", NULL, NULL, NULL, NULL));
    KT_CHECK(!kvli_etcd_pb_method("", NULL, NULL, NULL, NULL));
    KT_CHECK(!kvli_etcd_pb_method(NULL, NULL, NULL, NULL, NULL));
    KT_CHECK(strcmp(kvli_etcd_pb_name(KVLI_PB_WATCH_RESP), "WatchResponse") == 0);
    KT_CHECK(strcmp(kvli_etcd_pb_name(KVLI_PB_N), "?") == 0);
}

/* Bytes worked out by hand from the protobuf encoding rules. */
static void test_encode_bytes(void)
{
    /* field 1 varint (tag 0x08), 5 */
    enc_ok(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":5}", "08 05", NULL, NULL);
    enc_ok(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":\"5\"}", "08 05", NULL, NULL);
    enc_ok(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":5,\"ID\":\"300\"}", "08 05 10 ac 02", NULL, NULL);
    enc_ok(KVLI_PB_LEASE_REVOKE_REQ, "{\"ID\":\"123\"}", "08 7b", NULL, NULL);
    /* negative int64: ten bytes of two's complement */
    enc_ok(KVLI_PB_LEASE_KEEPALIVE_REQ, "{\"ID\":\"-1\"}", "08 ff ff ff ff ff ff ff ff ff 01",
           NULL, NULL);
    enc_ok(KVLI_PB_LEASE_KEEPALIVE_REQ, "{\"ID\":-2}", "08 fe ff ff ff ff ff ff ff ff 01", NULL,
           NULL);
    enc_ok(KVLI_PB_LEASE_KEEPALIVE_REQ, "{\"ID\":\"-9223372036854775808\"}",
           "08 80 80 80 80 80 80 80 80 80 01", NULL, NULL);
    enc_ok(KVLI_PB_LEASE_KEEPALIVE_REQ, "{\"ID\":\"9223372036854775807\"}",
           "08 ff ff ff ff ff ff ff ff 7f", NULL, NULL);
    /* defaults are not written; an all-default message is no bytes */
    enc_ok(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":0,\"ID\":\"0\"}", "", NULL, NULL);
    enc_ok(KVLI_PB_RANGE_REQ, "{\"key\":\"\",\"keys_only\":false,\"sort_order\":\"NONE\"}", "",
           NULL, NULL);
    enc_ok(KVLI_PB_RANGE_REQ, "{\"limit\":null}", "", NULL, NULL);
    /* key "a" (YQ==), value "b" (Yg==), lease 1 */
    enc_ok(KVLI_PB_PUT_REQ, "{\"key\":\"YQ==\",\"value\":\"Yg==\",\"lease\":\"1\"}",
           "0a 01 61 12 01 62 18 01", NULL, NULL);
    /* keys_only is field 8: tag 0x40 */
    enc_ok(KVLI_PB_RANGE_REQ, "{\"key\":\"YQ==\",\"count_only\":true}", "0a 01 61 48 01", NULL,
           NULL);
    enc_ok(KVLI_PB_RANGE_REQ, "{\"key\":\"YQ==\",\"sort_order\":\"DESCEND\",\"sort_target\":4}",
           "0a 01 61 28 02 30 04", NULL, NULL);
    enc_ok(KVLI_PB_TXN_REQ, "{\"success\":[{\"request_range\":{\"key\":\"YQ==\",\"keys_only\":true}}]}",
           "12 07 0a 05 0a 01 61 40 01", NULL, NULL);
    /* schema order, not the JSON's: failure (3) after success (2) */
    enc_ok(KVLI_PB_TXN_REQ, "{\"failure\":[{}],\"success\":[{}]}", "12 00 1a 00", NULL, NULL);
    /* a oneof member is written even when default; so is a present empty message */
    enc_ok(KVLI_PB_TXN_REQ, "{\"compare\":[{\"key\":\"YQ==\",\"version\":0}]}",
           "0a 05 1a 01 61 20 00", NULL, NULL);
    /* range_end is field 64: tag 64<<3|2 = 0x202, varint 82 04 */
    enc_ok(KVLI_PB_TXN_REQ, "{\"compare\":[{\"result\":\"NOT_EQUAL\",\"target\":\"MOD\","
           "\"key\":\"YQ==\",\"mod_revision\":\"7\",\"range_end\":\"Yg==\"}]}",
           "0a 0d 08 03 10 02 1a 01 61 30 07 82 04 01 62", NULL, NULL);
    /* watch create: start_revision 300 (ac 02), watch_id 2 (field 7, tag 0x38) */
    enc_ok(KVLI_PB_WATCH_REQ,
           "{\"create_request\":{\"key\":\"YQ==\",\"start_revision\":300,\"watch_id\":2}}",
           "0a 08 0a 01 61 18 ac 02 38 02", NULL, NULL);
    enc_ok(KVLI_PB_WATCH_REQ, "{\"cancel_request\":{\"watch_id\":0}}", "12 00", NULL, NULL);
    enc_ok(KVLI_PB_WATCH_REQ, "{\"progress_request\":{}}", "1a 00", NULL, NULL);
    /* repeated enums: packed, defaults included */
    enc_ok(KVLI_PB_WATCH_REQ, "{\"create_request\":{\"filters\":[\"NODELETE\",\"NOPUT\"]}}",
           "0a 04 2a 02 01 00", NULL, NULL);
    enc_ok(KVLI_PB_WATCH_REQ, "{\"create_request\":{\"filters\":[]}}", "0a 00", NULL, NULL);
    enc_ok(KVLI_PB_AUTH_REQ, "{\"name\":\"u\",\"password\":\"pw\"}", "0a 01 75 12 02 70 77",
           NULL, NULL);
    /* uint64 up to its top (only answers have uint64s, but both ways work) */
    enc_ok(KVLI_PB_RANGE_RESP, "{\"header\":{\"cluster_id\":\"18446744073709551615\"}}",
           "0a 0b 08 ff ff ff ff ff ff ff ff ff 01", NULL, NULL);
    {
        json_object *o = json_object_new_object(), *h = json_object_new_object();
        json_object_object_add(h, "member_id", json_object_new_uint64(UINT64_MAX));
        json_object_object_add(o, "header", h);
        uint8_t *b = NULL;
        size_t n = 0;
        char why[128];
        KT_CHECK(kvli_etcd_pb_encode(KVLI_PB_RANGE_RESP, o, &b, &n, why, sizeof(why)) == 0);
        KT_CHECK(n == 13 && b[2] == 0x10 && b[11] == 0xff && b[12] == 0x01);
        free(b);
        json_object_put(o);
    }
}

/* Every request kvlane builds (src/store/etcd.c, etcd_client.c), through
 * protobuf and back: the gateway's form (int64s as strings). */
static void test_round_trips(void)
{
    round_trip(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":5}", "{\"TTL\":\"5\"}");
    round_trip(KVLI_PB_LEASE_REVOKE_REQ, "{\"ID\":\"7587869712345678\"}", NULL);
    round_trip(KVLI_PB_LEASE_KEEPALIVE_REQ, "{\"ID\":\"7587869712345678\"}", NULL);
    round_trip(KVLI_PB_LEASE_KEEPALIVE_REQ, "{\"ID\":\"-7\"}", NULL);
    round_trip(KVLI_PB_TXN_REQ,
               "{\"success\":[{\"request_put\":{\"key\":\"L2t2bC9hZzEvZGVmYXVsdA==\","
               "\"value\":\"S1ZMTQEgbWV0YQ==\",\"lease\":\"7587869712345678\"}},"
               "{\"request_put\":{\"key\":\"L2t2bC5pbmMvYWcx\",\"value\":\"MDAwMSAy\","
               "\"lease\":\"7587869712345678\"}}]}", NULL);
    round_trip(KVLI_PB_TXN_REQ,
               "{\"success\":[{\"request_range\":{\"key\":\"YQ==\",\"keys_only\":true}},"
               "{\"request_range\":{\"key\":\"Yg==\",\"keys_only\":true}}]}", NULL);
    round_trip(KVLI_PB_TXN_REQ, "{\"success\":[{\"request_range\":{\"key\":\"YQ==\"}},"
               "{\"request_range\":{\"key\":\"Yg==\"}},{\"request_range\":{\"key\":\"Yw==\"}}]}",
               NULL);
    round_trip(KVLI_PB_DELETE_REQ, "{\"key\":\"L2t2bC9hZzEvcGFydA==\"}", NULL);
    round_trip(KVLI_PB_RANGE_REQ, "{\"key\":\"L2t2bC5pbmMvYWcx\"}", NULL);
    round_trip(KVLI_PB_RANGE_REQ, "{\"key\":\"YQ==\",\"range_end\":\"Yg==\",\"count_only\":true}",
               NULL);
    round_trip(KVLI_PB_PUT_REQ, "{\"key\":\"YQ==\",\"value\":\"AAEC/w==\",\"prev_kv\":true}", NULL);
    round_trip(KVLI_PB_WATCH_REQ,
               "{\"create_request\":{\"key\":\"L2t2bC5pbmMvYWcx\",\"start_revision\":12,"
               "\"watch_id\":3}}",
               "{\"create_request\":{\"key\":\"L2t2bC5pbmMvYWcx\",\"start_revision\":\"12\","
               "\"watch_id\":\"3\"}}");
    round_trip(KVLI_PB_WATCH_REQ, "{\"create_request\":{\"key\":\"L2t2bC5pbmMvYWcx\"}}", NULL);
    round_trip(KVLI_PB_WATCH_REQ, "{\"cancel_request\":{\"watch_id\":3}}",
               "{\"cancel_request\":{\"watch_id\":\"3\"}}");
    round_trip(KVLI_PB_AUTH_REQ, "{\"name\":\"root\",\"password\":\"s3cret\"}", NULL);
    round_trip(KVLI_PB_TXN_REQ, "{\"compare\":[{\"key\":\"YQ==\",\"target\":\"LEASE\","
               "\"lease\":\"0\"}],\"failure\":[{\"request_delete_range\":{\"key\":\"YQ==\"}}]}",
               NULL);
}

static void test_decode_answers(void)
{
    /* LeaseTimeToLiveResponse (kvlane doctor): ID 7, TTL 4, grantedTTL 10, one key */
    dec_hex_put(KVLI_PB_LEASE_TTL_RESP, "10 07 18 04 20 0a 2a 01 6b",
                "{\"ID\":\"7\",\"TTL\":\"4\",\"grantedTTL\":\"10\",\"keys\":[\"aw==\"]}");
    round_trip(KVLI_PB_LEASE_TTL_REQ, "{\"ID\":\"7\",\"keys\":true}", NULL);
    /* RangeResponse: header, one kv, count */
    json_object *o = dec_hex(KVLI_PB_RANGE_RESP,
        "0a 08 08 01 10 02 18 05 20 03"
        " 12 0e 0a 01 61 10 04 18 05 20 01 2a 03 78 79 7a"
        " 20 01",
        "{\"header\":{\"cluster_id\":\"1\",\"member_id\":\"2\",\"revision\":\"5\","
        "\"raft_term\":\"3\"},\"kvs\":[{\"key\":\"YQ==\",\"create_revision\":\"4\","
        "\"mod_revision\":\"5\",\"version\":\"1\",\"value\":\"eHl6\"}],\"count\":\"1\"}");
    void *blob = NULL;
    size_t len = 0;
    char why[256];
    KT_CHECK(kvli_etcd_range_value(o, &blob, &len, why, sizeof(why)) == KVL_OK && len == 3 &&
             memcmp(blob, "xyz", 3) == 0);
    KT_CHECK(kvli_etcd_i64(kvli_etcd_obj(o, "header"), "revision") == 5);
    free(blob);
    json_object_put(o);

    /* TxnResponse of two ranges: the first found a key, the second none */
    o = dec_hex(KVLI_PB_TXN_RESP,
        "0a 02 18 07 10 01"
        " 1a 10 0a 0e 0a 02 18 07 12 06 0a 01 61 2a 01 62 20 01"
        " 1a 06 0a 04 0a 02 18 07",
        "{\"header\":{\"revision\":\"7\"},\"succeeded\":true,\"responses\":["
        "{\"response_range\":{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"YQ==\","
        "\"value\":\"Yg==\"}],\"count\":\"1\"}},"
        "{\"response_range\":{\"header\":{\"revision\":\"7\"}}}]}");
    json_object *rs = kvli_etcd_arr(o, "responses");
    KT_CHECK(rs != NULL && json_object_array_length(rs) == 2);
    KT_CHECK(kvli_etcd_range_value(kvli_etcd_obj(json_object_array_get_idx(rs, 0),
                                                 "response_range"),
                                   &blob, &len, why, sizeof(why)) == KVL_OK && len == 1);
    free(blob);
    KT_CHECK(kvli_etcd_range_value(kvli_etcd_obj(json_object_array_get_idx(rs, 1),
                                                 "response_range"),
                                   &blob, &len, why, sizeof(why)) == KVL_ERR_NOT_FOUND);
    json_object_put(o);

    /* LeaseGrantResponse: ID 4660 (b4 24), TTL 5 */
    dec_hex_put(KVLI_PB_LEASE_GRANT_RESP, "0a 02 08 01 10 b4 24 18 05",
                "{\"header\":{\"cluster_id\":\"1\"},\"ID\":\"4660\",\"TTL\":\"5\"}");
    dec_hex_put(KVLI_PB_LEASE_GRANT_RESP, "10 ff ff ff ff ff ff ff ff ff 01 22 02 6e 6f",
                "{\"ID\":\"-1\",\"error\":\"no\"}");
    dec_hex_put(KVLI_PB_RANGE_RESP, "0a 0b 08 ff ff ff ff ff ff ff ff ff 01",
                "{\"header\":{\"cluster_id\":\"18446744073709551615\"}}");
    dec_hex_put(KVLI_PB_AUTH_RESP, "0a 00 12 03 74 6f 6b", "{\"header\":{},\"token\":\"tok\"}");
    dec_hex_put(KVLI_PB_DELETE_RESP, "10 01 1a 03 0a 01 61",
                "{\"deleted\":\"1\",\"prev_kvs\":[{\"key\":\"YQ==\"}]}");
    dec_hex_put(KVLI_PB_PUT_RESP, "0a 02 18 03 12 00", "{\"header\":{\"revision\":\"3\"},"
                "\"prev_kv\":{}}");
    dec_hex_put(KVLI_PB_LEASE_REVOKE_RESP, "0a 00", "{\"header\":{}}");
    dec_hex_put(KVLI_PB_LEASE_REVOKE_RESP, "", "{}");

    /* WatchResponse: a PUT (type left out: PUT is 0) and a DELETE */
    const char *wr = "0a 02 18 09 10 02"
                     " 5a 0a 12 08 0a 01 61 18 08 2a 01 62"
                     " 5a 09 08 01 12 05 0a 01 61 18 09";
    const char *wj = "{\"header\":{\"revision\":\"9\"},\"watch_id\":\"2\",\"events\":["
                     "{\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"8\",\"value\":\"Yg==\"}},"
                     "{\"type\":\"DELETE\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"9\"}}]}";
    dec_hex_put(KVLI_PB_WATCH_RESP, wr, wj);
    /* as the gateway streams it: {"result": ...}, which etcd_parse.c reads */
    uint8_t b[256];
    size_t n = hex(wr, b, sizeof(b));
    KT_CHECK(kvli_etcd_pb_answer("/v3/watch", b, n, &o, why, sizeof(why)) == 0);
    kvli_etcd_wres_t w;
    KT_CHECK(kvli_etcd_wres_parse(o, &w) && w.watch_id == 2 && !w.created && w.events != NULL &&
             json_object_array_length(w.events) == 2);
    KT_CHECK(strcmp(kvli_etcd_str(json_object_array_get_idx(w.events, 1), "type"), "DELETE") == 0);
    json_object_put(o);
    /* a presence key deleted ("/p.inc/ag1"), read by etcd_parse.c as etcd.c does */
    n = hex("5a 12 08 01 12 0e 0a 0a 2f 70 2e 69 6e 63 2f 61 67 31 18 09", b, sizeof(b));
    KT_CHECK(kvli_etcd_pb_answer("/v3/watch", b, n, &o, why, sizeof(why)) == 0);
    KT_CHECK(kvli_etcd_wres_parse(o, &w) && w.events != NULL &&
             json_object_array_length(w.events) == 1);
    kvli_etcd_ev_t ev;
    KT_CHECK(kvli_etcd_ev_parse(json_object_array_get_idx(w.events, 0), "/p.inc/", &ev) ==
             KVLI_ETCD_EV_OK && ev.del && strcmp(ev.name, "ag1") == 0 && ev.mod_rev == 9);
    json_object_put(o);
    n = hex("0a 02 18 09 18 01", b, sizeof(b));
    KT_CHECK(kvli_etcd_pb_answer("/v3/watch", b, n, &o, why, sizeof(why)) == 0);
    KT_CHECK(kvli_etcd_wres_parse(o, &w) && w.created && w.watch_id == 0 && w.events == NULL);
    json_object_put(o);
    n = hex("20 01 28 0a 32 03 63 6f 6d", b, sizeof(b));
    KT_CHECK(kvli_etcd_pb_answer("/v3/watch", b, n, &o, why, sizeof(why)) == 0);
    KT_CHECK(kvli_etcd_wres_parse(o, &w) && w.canceled && w.compact == 10 &&
             strcmp(w.reason, "com") == 0);
    json_object_put(o);
    /* keepalive: wrapped, and TTL read where etcd.c reads it */
    n = hex("10 b4 24 18 05", b, sizeof(b));
    KT_CHECK(kvli_etcd_pb_answer("/v3/lease/keepalive", b, n, &o, why, sizeof(why)) == 0);
    KT_CHECK(kvli_etcd_i64(kvli_etcd_obj(o, "result"), "TTL") == 5);
    json_object_put(o);
    /* unary methods are not wrapped */
    n = hex("10 b4 24 18 05", b, sizeof(b));
    KT_CHECK(kvli_etcd_pb_answer("/v3/lease/grant", b, n, &o, why, sizeof(why)) == 0);
    KT_CHECK(kvli_etcd_i64(o, "TTL") == 5 && !kvli_etcd_has(o, "result"));
    json_object_put(o);
    KT_CHECK(kvli_etcd_pb_answer("/v3/nope", b, n, &o, why, sizeof(why)) == -1 && o == NULL &&
             strstr(why, "/v3/nope") != NULL);
}

/* protobuf's rules: unknown fields skipped, defaults left out, the last
 * value wins, messages merge, oneof members clear each other, packed and
 * unpacked repeated fields both read. */
static void test_decode_rules(void)
{
    /* fields 99 (varint), 100 (64-bit), 101 (32-bit), 102 (bytes) are unknown */
    dec_hex_put(KVLI_PB_LEASE_GRANT_RESP,
                "98 06 01 0a 02 08 01 a1 06 01 02 03 04 05 06 07 08 10 b4 24"
                " ad 06 01 02 03 04 b2 06 02 aa bb 18 05 98 06 ff ff ff ff ff ff ff ff ff 01",
                "{\"header\":{\"cluster_id\":\"1\"},\"ID\":\"4660\",\"TTL\":\"5\"}");
    /* unknown fields inside a nested message, too */
    dec_hex_put(KVLI_PB_RANGE_RESP, "12 06 0a 01 61 3a 01 00",
                "{\"kvs\":[{\"key\":\"YQ==\"}]}");
    /* defaults on the wire are left out */
    dec_hex_put(KVLI_PB_RANGE_RESP, "18 00 20 00", "{}");
    dec_hex_put(KVLI_PB_AUTH_RESP, "12 00", "{}");
    dec_hex_put(KVLI_PB_WATCH_RESP, "5a 02 08 00", "{\"events\":[{}]}");
    /* present empty bytes: the gateway's Go code keeps them as "" */
    dec_hex_put(KVLI_PB_RANGE_RESP, "12 04 0a 00 2a 00", "{\"kvs\":[{\"key\":\"\",\"value\":\"\"}]}");
    /* last wins */
    dec_hex_put(KVLI_PB_LEASE_KEEPALIVE_RESP, "18 05 18 00", "{}");
    dec_hex_put(KVLI_PB_LEASE_KEEPALIVE_RESP, "18 00 18 05 18 06", "{\"TTL\":\"6\"}");
    /* a message seen twice merges */
    dec_hex_put(KVLI_PB_RANGE_RESP, "0a 02 08 01 0a 02 18 05 0a 02 08 02",
                "{\"header\":{\"cluster_id\":\"2\",\"revision\":\"5\"}}");
    /* a oneof member clears the other */
    dec_hex_put(KVLI_PB_TXN_RESP, "1a 04 0a 00 12 00", "{\"responses\":[{\"response_put\":{}}]}");
    dec_hex_put(KVLI_PB_WATCH_REQ, "0a 00 12 02 08 03",
                "{\"cancel_request\":{\"watch_id\":\"3\"}}");
    /* a oneof scalar member is kept even at its default */
    dec_hex_put(KVLI_PB_TXN_REQ, "0a 02 20 00 0a 04 20 01 30 00",
                "{\"compare\":[{\"version\":\"0\"},{\"mod_revision\":\"0\"}]}");
    /* repeated enum: packed, unpacked, and both */
    dec_hex_put(KVLI_PB_WATCH_REQ, "0a 04 2a 02 01 00",
                "{\"create_request\":{\"filters\":[\"NODELETE\",\"NOPUT\"]}}");
    dec_hex_put(KVLI_PB_WATCH_REQ, "0a 04 28 01 28 00",
                "{\"create_request\":{\"filters\":[\"NODELETE\",\"NOPUT\"]}}");
    dec_hex_put(KVLI_PB_WATCH_REQ, "0a 06 28 01 2a 02 00 01",
                "{\"create_request\":{\"filters\":[\"NODELETE\",\"NOPUT\",\"NODELETE\"]}}");
    dec_hex_put(KVLI_PB_WATCH_REQ, "0a 02 2a 00", "{\"create_request\":{}}");
    /* an enum value this schema does not name: its number, as jsonpb writes it */
    dec_hex_put(KVLI_PB_WATCH_RESP, "5a 02 08 05", "{\"events\":[{\"type\":5}]}");
    dec_hex_put(KVLI_PB_RANGE_REQ, "28 ff ff ff ff ff ff ff ff ff 01", "{\"sort_order\":-1}");
    /* a bool is any non-zero varint */
    dec_hex_put(KVLI_PB_TXN_RESP, "10 02", "{\"succeeded\":true}");
    /* string bytes as they are (a NUL inside included) */
    json_object *o = dec_hex(KVLI_PB_AUTH_RESP, "12 03 61 00 62", "{\"token\":\"a\\u0000b\"}");
    KT_CHECK(json_object_get_string_len(json_object_object_get(o, "token")) == 3);
    json_object_put(o);
}

/* A chain of transactions, levels deep: TxnResponse > ResponseOp > TxnResponse ... */
static size_t deep_txn_resp(uint8_t *b, size_t cap, unsigned levels)
{
    /* built from the inside out at the end of b */
    size_t start = cap;
    for (unsigned l = levels; l > 0; l--) {
        size_t inner = cap - start;
        KT_CHECK(inner < 120 && start >= 2);
        b[--start] = (uint8_t)inner;
        b[--start] = (l % 2) ? 0x1a : 0x22; /* into level l: a ResponseOp (odd), a TxnResponse */
    }
    memmove(b, b + start, cap - start);
    return cap - start;
}

static void test_decode_refused(void)
{
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "10", "truncated varint");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "10 80", "truncated varint");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "80", "truncated varint");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "10 ff ff ff ff ff ff ff ff ff ff 01", "longer than 10");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "10 ff ff ff ff ff ff ff ff ff 02", "longer than 10");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "0a", "truncated length");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "0a 05 08 01", "past the end");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "0a ff ff ff ff ff ff ff ff 7f", "past the end");
    dec_bad(KVLI_PB_RANGE_RESP, "12 05 0a 09 61", "past the end");
    /* a wire type that does not match the field's */
    dec_bad(KVLI_PB_TXN_RESP, "12 00", "wire type length-delimited where varint");
    dec_bad(KVLI_PB_RANGE_RESP, "08 01", "wire type varint where length-delimited");
    dec_bad(KVLI_PB_RANGE_RESP, "09 01 02 03 04 05 06 07 08", "wire type 64-bit");
    dec_bad(KVLI_PB_AUTH_RESP, "15 01 02 03 04", "wire type 32-bit");
    dec_bad(KVLI_PB_RANGE_REQ, "08 01", "RangeRequest.key");
    /* a packed field only where the field is repeated */
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "12 01 05", "LeaseGrantResponse.ID");
    dec_bad(KVLI_PB_WATCH_REQ, "0a 03 2a 01 80", "truncated varint in a packed field");
    /* groups, wire types 6 and 7, field number 0 */
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "0b 0c", "group start");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "0c", "group end");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "9b 06 9c 06", "group start");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "0e", "wire type 6");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "9f 06 00", "wire type 7");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "00 00", "field number 0");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "80 80 80 80 80 02 00", "field number");
    /* unknown fields: checked as they are skipped */
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "98 06", "unknown field 99: truncated varint");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "98 06 ff ff ff ff ff ff ff ff ff ff 01",
            "unknown field 99: truncated varint");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "a1 06 01 02 03", "unknown field 100: length 8 past");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "ad 06 01", "unknown field 101: length 4 past");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "b2 06", "unknown field 102: truncated length");
    dec_bad(KVLI_PB_LEASE_GRANT_RESP, "b2 06 05 aa", "unknown field 102: length 5 past");
    /* refusals deep inside name the message they happened in */
    dec_bad(KVLI_PB_TXN_RESP, "1a 06 0a 04 12 02 0a 05", "KeyValue.key: length 5 past");
    dec_bad(KVLI_PB_WATCH_RESP, "5a 03 12 01 10", "KeyValue.create_revision: truncated");

    /* depth: the top message is level 0; level 8 is the deepest read */
    uint8_t b[256];
    size_t n = deep_txn_resp(b, sizeof(b), 8);
    json_object *o = NULL;
    char why[256];
    KT_CHECK(kvli_etcd_pb_decode(KVLI_PB_TXN_RESP, b, n, &o, why, sizeof(why)) == 0);
    json_object_put(o);
    n = deep_txn_resp(b, sizeof(b), 9);
    dec_bad_n(KVLI_PB_TXN_RESP, b, n, "nested deeper than 8");
    n = deep_txn_resp(b, sizeof(b), 40);
    dec_bad_n(KVLI_PB_TXN_RESP, b, n, "nested deeper than 8");

    /* size */
    uint8_t *big = calloc(1, (size_t)KVLI_ETCD_REPLY_MAX + 1);
    KT_CHECK(big != NULL);
    dec_bad_n(KVLI_PB_RANGE_RESP, big, (size_t)KVLI_ETCD_REPLY_MAX + 1, "more than");
    free(big);
    dec_bad_n(KVLI_PB_N, b, 1, "not one kvlane knows");
    dec_bad_n(KVLI_PB_RANGE_RESP, NULL, 3, "no bytes");
    KT_CHECK(kvli_etcd_pb_decode(KVLI_PB_RANGE_RESP, NULL, 0, &o, why, sizeof(why)) == 0);
    json_object_put(o);
}

/* A TxnRequest levels deep: {"success":[{"request_txn":{...}}]} */
static char *deep_txn_req(unsigned txns)
{
    size_t cap = 64 + (size_t)txns * 40;
    char *s = malloc(cap), *p = s;
    KT_CHECK(s != NULL);
    for (unsigned i = 1; i < txns; i++)
        p += sprintf(p, "{\"success\":[{\"request_txn\":");
    p += sprintf(p, "{}");
    for (unsigned i = 1; i < txns; i++)
        p += sprintf(p, "}]}");
    return s;
}

static void test_encode_refused(void)
{
    enc_bad(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":5,\"ttl\":1}", "has no field \"ttl\"");
    enc_bad(KVLI_PB_LEASE_GRANT_REQ, "{\"id\":\"1\"}", "LeaseGrantRequest has no field \"id\"");
    enc_bad(KVLI_PB_TXN_REQ, "{\"success\":[{\"request_put\":{\"key\":\"YQ==\",\"leased\":\"1\"}}]}",
            "PutRequest has no field \"leased\"");
    /* wrong JSON types */
    enc_bad(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":true}", "a boolean where an int64");
    enc_bad(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":5.5}", "a fractional number where an int64");
    enc_bad(KVLI_PB_LEASE_GRANT_REQ, "{\"TTL\":[5]}", "an array where an int64");
    enc_bad(KVLI_PB_RANGE_REQ, "{\"keys_only\":\"true\"}", "a string where a boolean");
    enc_bad(KVLI_PB_RANGE_REQ, "{\"keys_only\":1}", "an integer where a boolean");
    enc_bad(KVLI_PB_RANGE_REQ, "{\"key\":5}", "RangeRequest.key: an integer where a base64");
    enc_bad(KVLI_PB_AUTH_REQ, "{\"name\":{}}", "an object where a string");
    enc_bad(KVLI_PB_TXN_REQ, "{\"success\":{}}", "TxnRequest.success: an object where an array");
    enc_bad(KVLI_PB_TXN_REQ, "{\"success\":[5]}", "an integer where an object (RequestOp)");
    enc_bad(KVLI_PB_TXN_REQ, "{\"success\":[null]}", "null in the array");
    enc_bad(KVLI_PB_WATCH_REQ, "{\"create_request\":{\"filters\":[null]}}", "null in the array");
    enc_bad(KVLI_PB_WATCH_REQ, "{\"create_request\":{\"filters\":\"NOPUT\"}}", "where an array");
    enc_bad(KVLI_PB_WATCH_REQ, "{\"create_request\":[]}", "an array where an object");
    enc_bad(KVLI_PB_RANGE_REQ, "[]", "RangeRequest: an array where an object belongs");
    enc_bad(KVLI_PB_RANGE_REQ, "\"x\"", "a string where an object belongs");
    /* base64 */
    enc_bad(KVLI_PB_PUT_REQ, "{\"key\":\"YQ=\"}", "PutRequest.key: \"YQ=\" is not base64");
    enc_bad(KVLI_PB_PUT_REQ, "{\"value\":\"Y!==\"}", "not base64");
    enc_bad(KVLI_PB_PUT_REQ, "{\"value\":\"YQ==YQ==\"}", "not base64");
    enc_bad(KVLI_PB_PUT_REQ, "{\"value\":\"Y Q==\"}", "not base64");
    enc_bad(KVLI_PB_PUT_REQ, "{\"value\":\"YQ\"}", "not base64");
    /* int64 strings: exactly decimal */
    static const char *const not_dec[] = {
        "12x", "", " 12", "12 ", "+12", "1.5", "1e3", "0x10", "-", "--1",
        "9223372036854775808", "-9223372036854775809", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(not_dec) / sizeof(not_dec[0]); i++) {
        char j[96];
        snprintf(j, sizeof(j), "{\"ID\":\"%s\"}", not_dec[i]);
        enc_bad(KVLI_PB_LEASE_REVOKE_REQ, j, "is not exactly a decimal int64");
    }
    enc_bad(KVLI_PB_LEASE_REVOKE_REQ, "{\"ID\":\"1\\u00002\"}", "not exactly a decimal int64");
    enc_bad(KVLI_PB_RANGE_RESP, "{\"header\":{\"cluster_id\":\"-1\"}}",
            "ResponseHeader.cluster_id: \"-1\" is not exactly a decimal uint64");
    enc_bad(KVLI_PB_RANGE_RESP, "{\"header\":{\"cluster_id\":\"18446744073709551616\"}}",
            "not exactly a decimal uint64");
    enc_bad(KVLI_PB_RANGE_RESP, "{\"header\":{\"cluster_id\":-1}}", "out of the range of a uint64");
    {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "TTL", json_object_new_uint64(UINT64_MAX));
        uint8_t *b = NULL;
        size_t n = 0;
        char why[128] = "";
        KT_CHECK(kvli_etcd_pb_encode(KVLI_PB_LEASE_GRANT_REQ, o, &b, &n, why, sizeof(why)) == -1 &&
                 b == NULL && strstr(why, "out of the range of an int64") != NULL);
        json_object_put(o);
    }
    /* enums by name, exactly */
    enc_bad(KVLI_PB_RANGE_REQ, "{\"sort_order\":\"UP\"}",
            "\"UP\" is not a name of RangeRequest.SortOrder");
    enc_bad(KVLI_PB_RANGE_REQ, "{\"sort_order\":\"ascend\"}", "not a name of");
    enc_bad(KVLI_PB_RANGE_REQ, "{\"sort_target\":true}", "a boolean where a name of");
    enc_bad(KVLI_PB_RANGE_REQ, "{\"sort_target\":4294967296}", "out of the range of an enum");
    enc_bad(KVLI_PB_WATCH_REQ, "{\"create_request\":{\"filters\":[\"NOPUT\",\"PUT\"]}}",
            "\"PUT\" is not a name of WatchCreateRequest.FilterType");
    /* oneof: one member at most */
    enc_bad(KVLI_PB_TXN_REQ, "{\"success\":[{\"request_put\":{},\"request_range\":{}}]}",
            "RequestOp: request_range and request_put are members of one oneof");
    enc_bad(KVLI_PB_WATCH_REQ, "{\"create_request\":{},\"cancel_request\":{}}", "one oneof");
    enc_bad(KVLI_PB_TXN_REQ, "{\"compare\":[{\"version\":1,\"lease\":\"2\"}]}", "one oneof");
    /* depth */
    char *s = deep_txn_req(5); /* TxnRequests at levels 0, 2, 4, 6, 8 */
    enc_ok(KVLI_PB_TXN_REQ, s, NULL, NULL, NULL);
    free(s);
    s = deep_txn_req(6);
    enc_bad(KVLI_PB_TXN_REQ, s, "nested deeper than 8");
    free(s);
    json_object *o = J("{}");
    uint8_t *b = NULL;
    size_t n = 0;
    char why[128] = "";
    KT_CHECK(kvli_etcd_pb_encode(KVLI_PB_N, o, &b, &n, why, sizeof(why)) == -1 &&
             strstr(why, "not one kvlane knows") != NULL);
    json_object_put(o);
}

/* gRPC's failures in the gateway's error shape, which etcd_parse.c reads */
static void test_status(void)
{
    /* what etcd 3.4's gateway answered to revoking an unknown lease */
    json_object *o = kvli_etcd_pb_status(5, "etcdserver: requested lease not found");
    json_object *w = J("{\"error\":\"etcdserver: requested lease not found\","
                       "\"message\":\"etcdserver: requested lease not found\",\"code\":5}");
    KT_CHECK(o != NULL && json_object_equal(o, w));
    json_object_put(w);
    kvli_etcd_wres_t r;
    KT_CHECK(!kvli_etcd_wres_parse(o, &r) && strstr(r.fail, "lease not found") != NULL &&
             strstr(r.fail, "code 5") != NULL);
    json_object_put(o);
    /* grpc-message is percent-encoded; broken escapes and %00 stay as they are */
    o = kvli_etcd_pb_status(14, "a%20b%C3%A9%zz%00%2");
    KT_CHECK(o != NULL && strcmp(kvli_etcd_str(o, "message"), "a b\xc3\xa9%zz%00%2") == 0 &&
             kvli_etcd_i64(o, "code") == 14);
    json_object_put(o);
    o = kvli_etcd_pb_status(2, NULL);
    KT_CHECK(o != NULL && strcmp(kvli_etcd_str(o, "error"), "") == 0);
    json_object_put(o);
}

int main(void)
{
    test_methods();
    test_encode_bytes();
    test_round_trips();
    test_decode_answers();
    test_decode_rules();
    test_decode_refused();
    test_encode_refused();
    test_status();
    printf("etcd protobuf: kvlane's requests encode as the spec says and round-trip; answers "
           "decode to the gateway's JSON; malformed bytes and JSON refused with a reason\n");
    return 0;
}
#endif
