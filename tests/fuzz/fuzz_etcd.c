/* libFuzzer target: what kvlane reads from etcd (or from whatever answers
 * at a configured endpoint) must be refused or accepted without crashing,
 * and what is accepted must respect the bounds etcd.c relies on. The first
 * byte picks the reader:
 *   0  JSON text: a watch answer with its events, a range answer, int64s
 *   1  WebSocket bytes: frames, fragmented messages, in two deliveries
 *   2  the WebSocket upgrade answer's head
 *   3 + m            protobuf bytes of message m (kvli_etcd_pb_msg_t): decoded;
 *                    what decodes must encode, and encode the same bytes again
 *   3 + KVLI_PB_N + m  JSON text encoded as message m: what encodes must decode,
 *                    and encode again to the same bytes
 * (src/store/etcd_parse.c, src/store/etcd_ws.c, src/store/etcd_pb.c). The
 * first byte is taken modulo 3 + 2 * KVLI_PB_N, so 0, 1 and 2 stay as they
 * were for the corpus. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef KVL_HAVE_ETCD
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0; /* this build has no etcd store */
}
#else
#include "store/etcd_client.h"
#include "store/etcd_pb.h"

static char *text_of(const uint8_t *data, size_t size)
{
    char *t = malloc(size + 1);
    if (t != NULL) {
        memcpy(t, data, size);
        t[size] = '\0';
    }
    return t;
}

static void check_event(json_object *ev)
{
    kvli_etcd_ev_t e;
    kvli_etcd_ev_kind_t k = kvli_etcd_ev_parse(ev, "/p.inc/", &e);
    if (k == KVLI_ETCD_EV_NONE)
        return;
    size_t nl = strnlen(e.name, sizeof(e.name));
    /* a name etcd.c can look up: not empty, bounded, one path element */
    if (nl == 0 || nl >= sizeof(e.name) || strchr(e.name, '/') != NULL)
        abort();
    if (k == KVLI_ETCD_EV_BAD && strnlen(e.bad, sizeof(e.bad)) == 0)
        abort();
}

static void json_answers(const uint8_t *data, size_t size)
{
    char *t = text_of(data, size);
    if (t == NULL)
        return;
    json_object *o = json_tokener_parse(t);
    free(t);
    kvli_etcd_wres_t r;
    if (kvli_etcd_wres_parse(o, &r)) {
        size_t n = r.events != NULL ? json_object_array_length(r.events) : 0;
        for (size_t i = 0; i < n; i++)
            check_event(json_object_array_get_idx(r.events, i));
        if (strnlen(r.reason, sizeof(r.reason)) == sizeof(r.reason))
            abort();
    } else if (strnlen(r.fail, sizeof(r.fail)) == 0) {
        abort();
    }
    check_event(o); /* the answer itself as an event */
    void *blob = NULL;
    size_t len = 7;
    char why[96] = "";
    kvl_status_t st = kvli_etcd_range_value(o, &blob, &len, why, sizeof(why));
    if ((st == KVL_OK) != (blob != NULL) || (st == KVL_OK && len == 0) ||
        (st == KVL_ERR_REMOTE && why[0] == '\0'))
        abort();
    free(blob);
    (void)kvli_etcd_i64(o, "revision");
    (void)kvli_etcd_i64(kvli_etcd_obj(o, "header"), "revision");
    if (o != NULL)
        json_object_put(o);
}

static int ws_drain(kvli_etcd_ws_t *w)
{
    char why[256];
    for (;;) {
        kvli_etcd_ws_frame_t f;
        int r = kvli_etcd_ws_next(w, &f, why, sizeof(why));
        if (r <= 0)
            return r;
        if (f.size > w->in_len || f.len > KVLI_ETCD_REPLY_MAX ||
            f.payload + f.len != w->in + f.size)
            abort();
        if (f.op <= 2) {
            int c = kvli_etcd_ws_collect(w, &f, why, sizeof(why));
            if (c < 0)
                return -1;
            if (c == 1) {
                if (w->msg == NULL || w->msg[w->msg_len] != '\0')
                    abort();
                kvli_etcd_ws_taken(w);
            }
        }
        kvli_etcd_ws_consume(w, &f);
    }
}

static void ws_frames(const uint8_t *data, size_t size)
{
    kvli_etcd_ws_t w;
    memset(&w, 0, sizeof(w));
    w.fd = -1;
    /* two deliveries, cut where the first byte says: frames split anywhere */
    size_t cut = size > 1 ? data[0] % size : size;
    if (kvli_etcd_append(&w.in, &w.in_len, &w.in_cap, (const char *)data, cut) == 0 &&
        ws_drain(&w) == 0 &&
        kvli_etcd_append(&w.in, &w.in_len, &w.in_cap, (const char *)data + cut, size - cut) == 0)
        (void)ws_drain(&w);
    free(w.in);
    free(w.msg);
}

/* j (a decoded message m): encodes (to want, want_n when want is not
 * NULL: j was decoded from the encoder's own bytes), the bytes decode, and
 * that encodes to the same bytes again. */
static void pb_again(kvli_etcd_pb_msg_t m, json_object *j, const uint8_t *want, size_t want_n)
{
    uint8_t *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    json_object *j2 = NULL;
    char why[256] = "";
    if (kvli_etcd_pb_encode(m, j, &b1, &n1, why, sizeof(why)) != 0)
        abort(); /* what the decoder writes, the encoder must take */
    if (want != NULL && (n1 != want_n || (n1 > 0 && memcmp(b1, want, n1) != 0)))
        abort();
    if (kvli_etcd_pb_decode(m, b1, n1, &j2, why, sizeof(why)) != 0)
        abort();
    if (kvli_etcd_pb_encode(m, j2, &b2, &n2, why, sizeof(why)) != 0 || n1 != n2 ||
        (n1 > 0 && memcmp(b1, b2, n1) != 0))
        abort(); /* encoding is deterministic and loses nothing the decoder keeps */
    json_object_put(j2);
    free(b1);
    free(b2);
}

static void pb_decode(kvli_etcd_pb_msg_t m, const uint8_t *data, size_t size)
{
    json_object *j = NULL;
    char why[256] = "";
    if (kvli_etcd_pb_decode(m, data, size, &j, why, sizeof(why)) != 0) {
        if (j != NULL || why[0] == '\0')
            abort();
        return;
    }
    if (j == NULL || !json_object_is_type(j, json_type_object))
        abort();
    pb_again(m, j, NULL, 0);
    json_object_put(j);
}

static void pb_encode(kvli_etcd_pb_msg_t m, const uint8_t *data, size_t size)
{
    char *t = text_of(data, size);
    if (t == NULL)
        return;
    json_object *o = json_tokener_parse(t);
    free(t);
    uint8_t *b = NULL;
    size_t n = 0;
    char why[256] = "";
    if (kvli_etcd_pb_encode(m, o, &b, &n, why, sizeof(why)) != 0) {
        if (b != NULL || why[0] == '\0')
            abort();
    } else {
        json_object *j = NULL;
        if (kvli_etcd_pb_decode(m, b, n, &j, why, sizeof(why)) != 0)
            abort();
        pb_again(m, j, b, n);
        json_object_put(j);
        free(b);
    }
    if (o != NULL)
        json_object_put(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned sel = data[0] % (3u + 2u * KVLI_PB_N);
    if (sel >= 3u + KVLI_PB_N) {
        pb_encode((kvli_etcd_pb_msg_t)(sel - 3u - KVLI_PB_N), data + 1, size - 1);
        return 0;
    }
    if (sel >= 3u) {
        pb_decode((kvli_etcd_pb_msg_t)(sel - 3u), data + 1, size - 1);
        return 0;
    }
    switch (sel) {
    case 0:
        json_answers(data + 1, size - 1);
        break;
    case 1:
        ws_frames(data + 1, size - 1);
        break;
    default: {
        char *t = text_of(data + 1, size - 1);
        if (t != NULL)
            (void)kvli_etcd_ws_upgraded(t, "dGhlIHNhbXBsZSBub25jZQ==");
        free(t);
        break;
    }
    }
    return 0;
}
#endif
