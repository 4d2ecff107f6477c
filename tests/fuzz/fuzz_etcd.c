/* libFuzzer target: what kvlane reads from etcd (or from whatever answers
 * at a configured endpoint) must be refused or accepted without crashing,
 * and what is accepted must respect the bounds etcd.c relies on. The first
 * byte picks the reader:
 *   0  JSON text: a watch answer with its events, a range answer, int64s
 *   1  WebSocket bytes: frames, fragmented messages, in two deliveries
 *   2  the WebSocket upgrade answer's head
 * (src/store/etcd_parse.c, src/store/etcd_ws.c). */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 3) {
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
