/* What kvlane reads from etcd's answers (src/store/etcd_parse.c, and the
 * WebSocket framing of src/store/etcd_ws.c): well-formed answers read as
 * etcd means them; every shape that json-c would abort on (an array call on
 * a null, an object, a string), values that are not base64, presence values
 * that are not "<incarnation> <generation>", and WebSocket frames a server
 * must not send are refused or ignored, never a crash. */
#include <string.h>
#include "common/kvltest.h"

#ifndef KVL_HAVE_ETCD
int main(void)
{
    KT_SKIP("%s", KT_NO_ETCD_STORE);
}
#else
#include "store/etcd_client.h"

static json_object *J(const char *text)
{
    json_object *o = json_tokener_parse(text);
    KT_CHECK(o != NULL);
    return o;
}

static kvl_status_t range(const char *text, size_t *len, char *why)
{
    json_object *o = J(text);
    void *blob = NULL;
    why[0] = '\0';
    kvl_status_t st = kvli_etcd_range_value(o, &blob, len, why, 96);
    KT_CHECK((st == KVL_OK) == (blob != NULL));
    free(blob);
    json_object_put(o);
    return st;
}

static void test_range(void)
{
    size_t len = 0;
    char why[96];
    /* "a2x2" is base64 of "klv" */
    KT_CHECK(range("{\"kvs\":[{\"key\":\"eA==\",\"value\":\"a2x2\"}]}", &len, why) == KVL_OK &&
             len == 3);
    KT_CHECK(range("{\"header\":{\"revision\":\"5\"}}", &len, why) == KVL_ERR_NOT_FOUND);
    KT_CHECK(range("{\"kvs\":[]}", &len, why) == KVL_ERR_NOT_FOUND);
    KT_CHECK(range("{\"kvs\":[{\"key\":\"eA==\",\"value\":\"\"}]}", &len, why) ==
             KVL_ERR_NOT_FOUND);
    /* the shapes json-c's array calls assert on */
    KT_CHECK(range("{\"kvs\":null}", &len, why) == KVL_ERR_NOT_FOUND);
    KT_CHECK(range("{\"kvs\":{}}", &len, why) == KVL_ERR_NOT_FOUND);
    KT_CHECK(range("{\"kvs\":\"x\"}", &len, why) == KVL_ERR_NOT_FOUND);
    KT_CHECK(range("{\"kvs\":[null]}", &len, why) == KVL_ERR_NOT_FOUND);
    KT_CHECK(range("{\"kvs\":[7]}", &len, why) == KVL_ERR_NOT_FOUND);
    /* a key whose value kvlane cannot read is not "no metadata" */
    KT_CHECK(range("{\"kvs\":[{\"value\":null}]}", &len, why) == KVL_ERR_REMOTE &&
             strstr(why, "not a string") != NULL);
    KT_CHECK(range("{\"kvs\":[{\"value\":{\"a\":1}}]}", &len, why) == KVL_ERR_REMOTE);
    KT_CHECK(range("{\"kvs\":[{\"value\":\"a2x\"}]}", &len, why) == KVL_ERR_REMOTE &&
             strstr(why, "not base64") != NULL);
    KT_CHECK(range("{\"kvs\":[{\"value\":\"a2!2\"}]}", &len, why) == KVL_ERR_REMOTE);
}

static void test_i64(void)
{
    json_object *o = J("{\"a\":\"12\",\"b\":13,\"c\":\"12abc\",\"d\":\"\",\"e\":1.5,\"f\":null,"
                       "\"g\":[1],\"h\":\"-4\",\"i\":\"99999999999999999999\",\"j\":\" 3\"}");
    KT_CHECK(kvli_etcd_i64(o, "a") == 12);
    KT_CHECK(kvli_etcd_i64(o, "b") == 13);
    KT_CHECK(kvli_etcd_i64(o, "c") == 0); /* not a number: not its first digits */
    KT_CHECK(kvli_etcd_i64(o, "d") == 0);
    KT_CHECK(kvli_etcd_i64(o, "e") == 0);
    KT_CHECK(kvli_etcd_i64(o, "f") == 0);
    KT_CHECK(kvli_etcd_i64(o, "g") == 0);
    KT_CHECK(kvli_etcd_i64(o, "h") == -4);
    KT_CHECK(kvli_etcd_i64(o, "i") == 0); /* out of range */
    KT_CHECK(kvli_etcd_i64(o, "j") == 0);
    KT_CHECK(kvli_etcd_i64(o, "absent") == 0);
    KT_CHECK(kvli_etcd_i64(NULL, "a") == 0);
    KT_CHECK(kvli_etcd_str(o, "b") == NULL && kvli_etcd_str(o, "f") == NULL);
    KT_CHECK(kvli_etcd_arr(o, "f") == NULL && kvli_etcd_arr(o, "g") != NULL);
    KT_CHECK(kvli_etcd_obj(o, "g") == NULL && !kvli_etcd_true(o, "a"));
    json_object_put(o);
    size_t n = 1;
    KT_CHECK(kvli_etcd_unb64(NULL, &n) == NULL && n == 0);
    /* base64 as etcd sends it, and nothing else: '=' inside the text, padding
     * of three, blanks, other characters (OpenSSL's decoder alone made bytes
     * of each of these) */
    static const char *const bad[] = {"QQ=A", "Q===", "====", "A=B=", "QUJD    ", "QUJ\n",
                                      "QU-D", "QUJ*", "QQ==QUJD" /* padding, then more */};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        void *v = kvli_etcd_unb64(bad[i], &n);
        if (v != NULL)
            fprintf(stderr, "'%s' decoded to %zu bytes\n", bad[i], n);
        KT_CHECK(v == NULL && n == 0);
    }
    static const struct {
        const char *in, *out;
    } good[] = {{"", ""}, {"QQ==", "A"}, {"QUI=", "AB"}, {"QUJD", "ABC"},
                {"a2V5L3dpdGgvc2xhc2hlcysr", "key/with/slashes++"}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char *v = kvli_etcd_unb64(good[i].in, &n);
        KT_CHECK(v != NULL && n == strlen(good[i].out) && memcmp(v, good[i].out, n) == 0);
        free(v);
    }
}

/* base64 of text, as a JSON string's contents */
static char *b64(const char *text)
{
    return kvli_etcd_b64(text, strlen(text));
}

static kvli_etcd_ev_kind_t ev(const char *type, const char *key, const char *val_json,
                              kvli_etcd_ev_t *e)
{
    char *k = b64(key), text[1024];
    snprintf(text, sizeof(text), "{%s%s%s\"kv\":{\"key\":\"%s\",\"mod_revision\":\"41\"%s%s}}",
             type ? "\"type\":" : "", type ? type : "", type ? "," : "", k,
             val_json ? ",\"value\":" : "", val_json ? val_json : "");
    free(k);
    json_object *o = J(text);
    kvli_etcd_ev_kind_t kind = kvli_etcd_ev_parse(o, "/p.inc/", e);
    json_object_put(o);
    return kind;
}

static void test_events(void)
{
    kvli_etcd_ev_t e;
    char *v = b64("00000000deadbeef 7"), val[128];
    snprintf(val, sizeof(val), "\"%s\"", v);
    free(v);
    /* a put (the gateway leaves the zero enum PUT out) and a delete */
    KT_CHECK(ev(NULL, "/p.inc/a0", val, &e) == KVLI_ETCD_EV_OK && !e.del &&
             strcmp(e.name, "a0") == 0 && e.inc == 0xdeadbeefu && e.gen == 7 && e.mod_rev == 41);
    KT_CHECK(ev("\"PUT\"", "/p.inc/a0", val, &e) == KVLI_ETCD_EV_OK && !e.del);
    KT_CHECK(ev("\"DELETE\"", "/p.inc/a1", NULL, &e) == KVLI_ETCD_EV_OK && e.del &&
             strcmp(e.name, "a1") == 0);
    /* not an agent's presence key: ignored */
    KT_CHECK(ev(NULL, "/q.inc/a0", val, &e) == KVLI_ETCD_EV_NONE);
    KT_CHECK(ev(NULL, "/p.inc/", val, &e) == KVLI_ETCD_EV_NONE);
    KT_CHECK(ev(NULL, "/p.inc/a/b", val, &e) == KVLI_ETCD_EV_NONE);
    KT_CHECK(ev("null", "/p.inc/a0", val, &e) == KVLI_ETCD_EV_OK && !e.del); /* no type: PUT */
    /* a type that is neither: what happened to the agent cannot be told */
    KT_CHECK(ev("\"COMPACT\"", "/p.inc/a0", val, &e) == KVLI_ETCD_EV_BAD &&
             strstr(e.bad, "type COMPACT") != NULL);
    KT_CHECK(ev("1", "/p.inc/a0", val, &e) == KVLI_ETCD_EV_BAD && strstr(e.bad, "type 1") != NULL);
    /* an agent's key holding what kvlane did not write */
    const char *bad[] = {"00000000deadbeef", "00000000deadbeef 7 ", "00000000DEADBEEF 7",
                         "0000000deadbeef 7", "00000000deadbeef -7", "00000000deadbeef 7x",
                         "00000000deadbeef 99999999999999999999", "x", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = b64(bad[i]);
        snprintf(val, sizeof(val), "\"%s\"", v);
        free(v);
        KT_CHECK(ev(NULL, "/p.inc/a2", val, &e) == KVLI_ETCD_EV_BAD &&
                 strcmp(e.name, "a2") == 0 && strstr(e.bad, "presence key holds") != NULL);
    }
    KT_CHECK(ev(NULL, "/p.inc/a2", "null", &e) == KVLI_ETCD_EV_BAD &&
             strstr(e.bad, "no value") != NULL);
    KT_CHECK(ev(NULL, "/p.inc/a2", "\"%%%%\"", &e) == KVLI_ETCD_EV_BAD &&
             strstr(e.bad, "not base64") != NULL);
    /* shapes without a key */
    const char *odd[] = {"{}", "{\"kv\":null}", "{\"kv\":[]}", "{\"kv\":{\"key\":null}}",
                         "{\"kv\":{\"key\":5}}", "{\"kv\":{\"key\":\"***\"}}", "[]", "null"};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        json_object *o = json_tokener_parse(odd[i]);
        KT_CHECK(kvli_etcd_ev_parse(o, "/p.inc/", &e) == KVLI_ETCD_EV_NONE);
        if (o != NULL)
            json_object_put(o);
    }
}

static void test_watch_answers(void)
{
    kvli_etcd_wres_t r;
    json_object *o = J("{\"result\":{\"header\":{\"revision\":\"9\"},\"watch_id\":\"3\","
                       "\"created\":true}}");
    KT_CHECK(kvli_etcd_wres_parse(o, &r) && r.created && !r.canceled && r.watch_id == 3 &&
             r.events == NULL);
    json_object_put(o);
    o = J("{\"result\":{\"watch_id\":\"3\",\"canceled\":true,\"compact_revision\":\"17\"}}");
    KT_CHECK(kvli_etcd_wres_parse(o, &r) && r.canceled && r.compact == 17 &&
             strcmp(r.reason, "no reason given") == 0);
    json_object_put(o);
    o = J("{\"result\":{\"canceled\":true,\"cancel_reason\":null,\"events\":{}}}");
    KT_CHECK(kvli_etcd_wres_parse(o, &r) && r.canceled && r.events == NULL &&
             strcmp(r.reason, "no reason given") == 0);
    json_object_put(o);
    o = J("{\"result\":{\"events\":[{},null,3]}}");
    KT_CHECK(kvli_etcd_wres_parse(o, &r) && r.events != NULL &&
             json_object_array_length(r.events) == 3);
    json_object_put(o);
    o = J("{\"error\":{\"grpc_code\":14,\"message\":\"etcdserver: no leader\"}}");
    KT_CHECK(!kvli_etcd_wres_parse(o, &r) && strstr(r.fail, "no leader") != NULL &&
             strstr(r.fail, "gRPC code 14") != NULL);
    json_object_put(o);
    o = J("{\"code\":7,\"message\":\"permission denied\"}");
    KT_CHECK(!kvli_etcd_wres_parse(o, &r) && strstr(r.fail, "permission denied") != NULL);
    json_object_put(o);
    o = J("{\"result\":null}");
    KT_CHECK(!kvli_etcd_wres_parse(o, &r) && strstr(r.fail, "not a watch result") != NULL);
    json_object_put(o);
    KT_CHECK(!kvli_etcd_wres_parse(NULL, &r));
}

/* Frames the way a server sends them: unmasked. */
static size_t frame(uint8_t *out, unsigned fin, unsigned op, const char *pl, size_t n)
{
    size_t h = 0;
    out[h++] = (uint8_t)((fin ? 0x80u : 0) | op);
    if (n < 126) {
        out[h++] = (uint8_t)n;
    } else {
        out[h++] = 126;
        out[h++] = (uint8_t)(n >> 8);
        out[h++] = (uint8_t)n;
    }
    memcpy(out + h, pl, n);
    return h + n;
}

/* Feed bytes; the messages collected joined by '|' into got; -1 on a
 * protocol error (why), else the number of whole messages. */
static int ws_feed(const uint8_t *bytes, size_t n, char *got, size_t cap, char *why)
{
    kvli_etcd_ws_t w;
    memset(&w, 0, sizeof(w));
    w.fd = -1;
    KT_CHECK(kvli_etcd_append(&w.in, &w.in_len, &w.in_cap, (const char *)bytes, n) == 0);
    got[0] = '\0';
    int msgs = 0, rc = 0;
    for (;;) {
        kvli_etcd_ws_frame_t f;
        int r = kvli_etcd_ws_next(&w, &f, why, 200);
        if (r < 0) {
            rc = -1;
            break;
        }
        if (r == 0)
            break;
        if (f.op <= 2) {
            int c = kvli_etcd_ws_collect(&w, &f, why, 200);
            if (c < 0) {
                rc = -1;
                break;
            }
            if (c == 1) {
                snprintf(got + strlen(got), cap - strlen(got), "%s%s", msgs ? "|" : "", w.msg);
                msgs++;
                kvli_etcd_ws_taken(&w);
            }
        }
        kvli_etcd_ws_consume(&w, &f);
    }
    free(w.in);
    free(w.msg);
    return rc < 0 ? -1 : msgs;
}

static void test_ws_frames(void)
{
    uint8_t b[1024];
    char got[512], why[200], big[300];
    size_t n = 0;
    n += frame(b + n, 1, 1, "{\"a\":1}", 7);
    n += frame(b + n, 0, 1, "{\"b\"", 4);
    n += frame(b + n, 1, 9, "pi", 2); /* a ping between fragments is allowed */
    n += frame(b + n, 1, 0, ":2}", 3);
    memset(big, 'x', sizeof(big));
    n += frame(b + n, 1, 1, big, sizeof(big));
    KT_CHECK(ws_feed(b, n, got, sizeof(got), why) == 3 && strncmp(got, "{\"a\":1}|{\"b\":2}|xxx",
                                                                  19) == 0);
    /* a frame cut short waits for its bytes */
    KT_CHECK(ws_feed(b, 5, got, sizeof(got), why) == 0);
    KT_CHECK(ws_feed(b, 1, got, sizeof(got), why) == 0);
    /* what a server must not send */
    struct {
        uint8_t bytes[8];
        size_t n;
        const char *why;
    } bad[] = {
        {{0x81, 0x81, 1, 2, 3, 4, 'x'}, 7, "mask"},
        {{0xc1, 0x01, 'x'}, 3, "reserved bits"},
        {{0x83, 0x01, 'x'}, 3, "unknown opcode 3"},
        {{0x8b, 0x00}, 2, "unknown opcode 11"},
        {{0x09, 0x00}, 2, "in fragments"},
        {{0x89, 0x7e, 0x00, 0x80}, 4, "longer than 125"},
        {{0x80, 0x01, 'x'}, 3, "never began"},
        {{0x81, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff}, 8, "mask"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        KT_CHECK(ws_feed(bad[i].bytes, bad[i].n, got, sizeof(got), why) == -1);
        if (strstr(why, bad[i].why) == NULL) {
            fprintf(stderr, "frame %zu: '%s' lacks '%s'\n", i, why, bad[i].why);
            KT_CHECK(0);
        }
    }
    /* a length past the bound, from the 8-byte form */
    uint8_t huge[10] = {0x81, 0x7f, 0, 0, 0, 0, 0x10, 0, 0, 0};
    KT_CHECK(ws_feed(huge, sizeof(huge), got, sizeof(got), why) == -1 &&
             strstr(why, "more than") != NULL);
    /* a new message inside a fragmented one */
    n = frame(b, 0, 1, "ab", 2);
    n += frame(b + n, 1, 1, "cd", 2);
    KT_CHECK(ws_feed(b, n, got, sizeof(got), why) == -1 && strstr(why, "inside") != NULL);
}

static void test_upgrade(void)
{
    /* RFC 6455's own example: key dGhlIHNhbXBsZSBub25jZQ== */
    const char *key = "dGhlIHNhbXBsZSBub25jZQ==";
    KT_CHECK(kvli_etcd_ws_upgraded("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                   "Connection: Upgrade\r\nsec-websocket-accept: "
                                   "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", key));
    KT_CHECK(!kvli_etcd_ws_upgraded("HTTP/1.1 101 Switching Protocols\r\n"
                                    "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOx=", key));
    KT_CHECK(!kvli_etcd_ws_upgraded("HTTP/1.1 200 OK\r\n"
                                    "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", key));
    KT_CHECK(!kvli_etcd_ws_upgraded("HTTP/1.1 1010 x\r\n"
                                    "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", key));
    KT_CHECK(!kvli_etcd_ws_upgraded("HTTP/1.1 101 Switching Protocols", key));
    KT_CHECK(!kvli_etcd_ws_upgraded("", key));
}

int main(void)
{
    test_range();
    test_i64();
    test_events();
    test_watch_answers();
    test_ws_frames();
    test_upgrade();
    printf("etcd answers: malformed shapes, values and WebSocket frames refused or ignored\n");
    return 0;
}
#endif
