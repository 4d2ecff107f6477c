/* The protobuf codec (src/store/etcd_pb.c) against a real etcd: the same
 * request sent as JSON to the gateway and, encoded, as gRPC over h2c (the
 * same port) gets answers that, decoded, equal the gateway's JSON exactly.
 * Read-only requests on a fixed store, so both answers carry the same
 * revision; a watch from revision 1 replays a history of puts and deletes.
 * libcurl does the HTTP/2 here, not kvlane's own gRPC path. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "common/kvltest.h"
#include "common/kt_etcd.h"

#ifndef KVL_HAVE_ETCD
int main(void)
{
    KT_SKIP("%s", KT_NO_ETCD_STORE);
}
#else
#include "store/etcd_client.h"
#include "store/etcd_pb.h"

static kt_etcd_t etcd;

typedef struct body {
    char *p;
    size_t len, cap;
    bool grpc;
    unsigned want;      /* stop once this many messages came (0: read to the end) */
    unsigned got;
    int grpc_status;    /* from the trailers; -1 none */
} body_t;

/* Whole messages in b: gRPC frames, or lines of JSON. */
static unsigned messages(const body_t *b)
{
    unsigned n = 0;
    if (!b->grpc) {
        for (size_t i = 0; i < b->len; i++)
            n += b->p[i] == '\n';
        return n;
    }
    size_t at = 0;
    while (at + 5 <= b->len) {
        const uint8_t *h = (const uint8_t *)b->p + at;
        size_t l = ((size_t)h[1] << 24) | ((size_t)h[2] << 16) | ((size_t)h[3] << 8) | h[4];
        if (at + 5 + l > b->len)
            break;
        at += 5 + l;
        n++;
    }
    return n;
}

static size_t on_data(char *d, size_t sz, size_t nm, void *arg)
{
    body_t *b = arg;
    if (kvli_etcd_append(&b->p, &b->len, &b->cap, d, sz * nm) != 0)
        return 0;
    if (b->want > 0 && messages(b) >= b->want)
        return 0; /* enough of a stream: end it here */
    return sz * nm;
}

static size_t on_header(char *d, size_t sz, size_t nm, void *arg)
{
    body_t *b = arg;
    if (sz * nm > 12 && strncasecmp(d, "grpc-status:", 12) == 0)
        b->grpc_status = atoi(d + 12);
    return sz * nm;
}

/* POST data to path: the gateway (JSON) or gRPC (h2c, framed). want:
 * messages to read from a stream (0: a unary call). */
static void post(const char *path, const void *data, size_t n, bool grpc, unsigned want,
                 body_t *b)
{
    char url[256];
    memset(b, 0, sizeof(*b));
    b->grpc = grpc;
    b->want = want;
    b->grpc_status = -1;
    snprintf(url, sizeof(url), "%s%s", etcd.url, path);
    CURL *h = curl_easy_init();
    struct curl_slist *hd = NULL;
    KT_CHECK(h != NULL);
    if (grpc) {
        hd = curl_slist_append(hd, "content-type: application/grpc");
        hd = curl_slist_append(hd, "te: trailers");
        curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, data);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)n);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, b);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L); /* a bound, not a wait */
    CURLcode cc = curl_easy_perform(h);
    if (!(cc == CURLE_OK || (want > 0 && cc == CURLE_WRITE_ERROR && messages(b) >= want))) {
        fprintf(stderr, "POST %s (%s): %s, %zu bytes\n", path, grpc ? "gRPC" : "JSON",
                curl_easy_strerror(cc), b->len);
        KT_CHECK(0);
    }
    if (grpc && want == 0 && b->grpc_status != 0) {
        fprintf(stderr, "POST %s: grpc-status %d\n", path, b->grpc_status);
        KT_CHECK(0);
    }
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
}

/* The gateway's answers (JSON lines) and gRPC's (decoded): arrays. */
static json_object *gateway(const char *path, const char *json, unsigned want)
{
    body_t b;
    post(path, json, strlen(json), false, want, &b);
    json_object *a = json_object_new_array();
    char *save = NULL, *nl = b.p != NULL ? strrchr(b.p, '\n') : NULL;
    if (want > 0 && nl != NULL)
        nl[1] = '\0'; /* a stream cut short: its whole lines */
    for (char *l = b.p != NULL ? strtok_r(b.p, "\n", &save) : NULL; l != NULL;
         l = strtok_r(NULL, "\n", &save)) {
        json_object *o = json_tokener_parse(l);
        KT_CHECK(o != NULL);
        json_object_array_add(a, o);
    }
    free(b.p);
    return a;
}

static json_object *grpc(const char *path, const char *json, unsigned want)
{
    const char *gp = NULL;
    kvli_etcd_pb_msg_t rq, rs;
    bool stream = false;
    char why[256] = "";
    uint8_t *pb = NULL;
    size_t n = 0;
    KT_CHECK(kvli_etcd_pb_method(path, &gp, &rq, &rs, &stream));
    json_object *req = json_tokener_parse(json);
    if (kvli_etcd_pb_encode(rq, req, &pb, &n, why, sizeof(why)) != 0) {
        fprintf(stderr, "encoding %s: %s\n", json, why);
        KT_CHECK(0);
    }
    json_object_put(req);
    uint8_t *f = malloc(n + 5);
    KT_CHECK(f != NULL);
    f[0] = 0;
    f[1] = (uint8_t)(n >> 24);
    f[2] = (uint8_t)(n >> 16);
    f[3] = (uint8_t)(n >> 8);
    f[4] = (uint8_t)n;
    if (n > 0)
        memcpy(f + 5, pb, n);
    free(pb);
    body_t b;
    post(gp, f, n + 5, true, want, &b);
    free(f);
    json_object *a = json_object_new_array();
    size_t at = 0;
    while (at + 5 <= b.len) {
        const uint8_t *h = (const uint8_t *)b.p + at;
        size_t l = ((size_t)h[1] << 24) | ((size_t)h[2] << 16) | ((size_t)h[3] << 8) | h[4];
        KT_CHECK(h[0] == 0); /* not compressed */
        if (at + 5 + l > b.len) {
            KT_CHECK(want > 0); /* only a stream cut short ends inside a frame */
            break;
        }
        json_object *o = NULL;
        if (kvli_etcd_pb_decode(rs, h + 5, l, &o, why, sizeof(why)) != 0) {
            fprintf(stderr, "decoding the answer to %s: %s\n", gp, why);
            KT_CHECK(0);
        }
        if (stream) { /* as the gateway writes a stream's answers */
            json_object *w = json_object_new_object();
            json_object_object_add(w, "result", o);
            o = w;
        }
        json_object_array_add(a, o);
        at += 5 + l;
    }
    free(b.p);
    return a;
}

static void same(const char *path, const char *json)
{
    json_object *g = gateway(path, json, 0), *p = grpc(path, json, 0);
    if (!json_object_equal(g, p) || json_object_array_length(g) != 1) {
        fprintf(stderr, "%s %s\n  gateway %s\n", path, json, json_object_to_json_string(g));
        fprintf(stderr, "  gRPC    %s\n", json_object_to_json_string(p));
        KT_CHECK(0);
    }
    json_object_put(g);
    json_object_put(p);
}

/* A watch from revision 1 on the prefix: the created answer, then events
 * until n_events came; the watch_id each stream got is left out. */
static json_object *watch_events(json_object *answers, unsigned *created)
{
    json_object *evs = json_object_new_array();
    *created = 0;
    for (size_t i = 0; i < json_object_array_length(answers); i++) {
        json_object *r = kvli_etcd_obj(json_object_array_get_idx(answers, i), "result");
        kvli_etcd_wres_t w;
        KT_CHECK(kvli_etcd_wres_parse(json_object_array_get_idx(answers, i), &w));
        *created += w.created;
        json_object *e = kvli_etcd_arr(r, "events");
        for (size_t k = 0; e != NULL && k < json_object_array_length(e); k++)
            json_object_array_add(evs, json_object_get(json_object_array_get_idx(e, k)));
    }
    return evs;
}

static void same_watch(const char *json, unsigned n_events)
{
    /* the created answer and the replay: read until all events came */
    json_object *g = NULL, *p = NULL, *ge = NULL, *pe = NULL;
    unsigned gc = 0, pc = 0;
    for (unsigned want = 2; want < 2 + n_events; want++) {
        json_object_put(g);
        json_object_put(ge);
        g = gateway("/v3/watch", json, want);
        ge = watch_events(g, &gc);
        if (json_object_array_length(ge) >= n_events)
            break;
    }
    for (unsigned want = 2; want < 2 + n_events; want++) {
        json_object_put(p);
        json_object_put(pe);
        p = grpc("/v3/watch", json, want);
        pe = watch_events(p, &pc);
        if (json_object_array_length(pe) >= n_events)
            break;
    }
    if (gc != 1 || pc != 1 || json_object_array_length(ge) != n_events ||
        !json_object_equal(ge, pe)) {
        fprintf(stderr, "watch %s\n  gateway %s\n", json, json_object_to_json_string(g));
        fprintf(stderr, "  gRPC    %s\n", json_object_to_json_string(p));
        KT_CHECK(0);
    }
    json_object_put(g);
    json_object_put(p);
    json_object_put(ge);
    json_object_put(pe);
}

int main(void)
{
    if (kt_etcd_binary() == NULL)
        KT_SKIP("no etcd binary (/usr/bin/etcd from Debian's etcd-server, or KVL_ETCD_BIN)");
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!(curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_HTTP2))
        KT_SKIP("this libcurl has no HTTP/2");
    kt_etcd_start(&etcd);

    /* the store: /p/a (put twice), /p/b (empty value), /p/c (with a lease),
     * /p/d (put, deleted): 6 revisions of events under /p/ */
    json_object_put(gateway("/v3/kv/put", "{\"key\":\"L3AvYQ==\",\"value\":\"eHl6\"}", 0));
    json_object_put(gateway("/v3/kv/put", "{\"key\":\"L3AvYg==\",\"value\":\"\"}", 0));
    json_object_put(gateway("/v3/kv/put", "{\"key\":\"L3AvYQ==\",\"value\":\"eHl6dw==\"}", 0));
    json_object *g = gateway("/v3/lease/grant", "{\"TTL\":600}", 0);
    const char *id = kvli_etcd_str(json_object_array_get_idx(g, 0), "ID");
    KT_CHECK(id != NULL);
    char body[256];
    snprintf(body, sizeof(body),
             "{\"success\":[{\"request_put\":{\"key\":\"L3AvYw==\",\"value\":\"MQ==\","
             "\"lease\":\"%s\"}},{\"request_put\":{\"key\":\"L3AvZA==\",\"value\":\"Mg==\"}}]}",
             id);
    json_object_put(gateway("/v3/kv/txn", body, 0));
    json_object_put(gateway("/v3/kv/deleterange", "{\"key\":\"L3AvZA==\"}", 0));

    same("/v3/kv/range", "{\"key\":\"L3AvYQ==\"}");
    same("/v3/kv/range", "{\"key\":\"L3AvYg==\"}"); /* an empty value: no "value" */
    same("/v3/kv/range", "{\"key\":\"L3Avcg==\"}"); /* none */
    same("/v3/kv/range", "{\"key\":\"L3Av\",\"range_end\":\"L3Aw\",\"sort_order\":\"DESCEND\","
                         "\"sort_target\":\"KEY\",\"limit\":2}");
    same("/v3/kv/range", "{\"key\":\"L3Av\",\"range_end\":\"L3Aw\",\"count_only\":true}");
    same("/v3/kv/range", "{\"key\":\"L3Av\",\"range_end\":\"L3Aw\",\"revision\":\"4\"}");
    same("/v3/kv/txn", "{\"success\":[{\"request_range\":{\"key\":\"L3AvYQ==\",\"keys_only\":true}},"
                       "{\"request_range\":{\"key\":\"L3AvYw==\",\"keys_only\":true}}]}");
    same("/v3/kv/txn", "{\"compare\":[{\"key\":\"L3AvYQ==\",\"target\":\"VERSION\","
                       "\"result\":\"EQUAL\",\"version\":\"0\"}],\"success\":[{\"request_range\":"
                       "{\"key\":\"L3AvYQ==\"}}],\"failure\":[{\"request_range\":"
                       "{\"key\":\"L3AvYw==\"}}]}");
    same("/v3/kv/txn", "{\"compare\":[{\"key\":\"L3AvYQ==\",\"target\":\"MOD\","
                       "\"result\":\"GREATER\",\"mod_revision\":\"1\"}],\"success\":[{"
                       "\"request_range\":{\"key\":\"L3AvYQ==\",\"count_only\":true}}]}");
    printf("range and txn answers: gRPC's, decoded, equal the gateway's\n");

    /* the history: puts (type left out) and a DELETE, with prev_kv */
    same_watch("{\"create_request\":{\"key\":\"L3Av\",\"range_end\":\"L3Aw\","
               "\"start_revision\":1,\"prev_kv\":true}}", 6);
    same_watch("{\"create_request\":{\"key\":\"L3AvZA==\",\"start_revision\":1}}", 2);
    printf("watch replays: gRPC's events, decoded, equal the gateway's\n");

    json_object_put(g);
    kt_etcd_stop(&etcd);
    printf("etcd protobuf against etcd: answers decode to exactly the gateway's JSON\n");
    return 0;
}
#endif
