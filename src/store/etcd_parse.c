/*
 * kvlane etcd client: reading what etcd answers. Everything here came over
 * the network (from etcd, or from whatever listens at a configured
 * endpoint: a proxy, another service), so nothing is believed unchecked.
 * json-c asserts, and so aborts the process, when an array call meets a
 * value of another type ({"kvs": null} would end the engine), so every
 * field is read through a typed accessor that answers "absent" for a
 * missing field, a JSON null or a value of another type.
 *
 * No agent state and no I/O: etcd.c acts on what these return, and
 * tests/fuzz/fuzz_etcd.c drives them with arbitrary bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "etcd_client.h"

json_object *kvli_etcd_arr(json_object *o, const char *field)
{
    json_object *f = NULL;
    if (o == NULL || !json_object_object_get_ex(o, field, &f) ||
        !json_object_is_type(f, json_type_array))
        return NULL;
    return f;
}

json_object *kvli_etcd_obj(json_object *o, const char *field)
{
    json_object *f = NULL;
    if (o == NULL || !json_object_object_get_ex(o, field, &f) ||
        !json_object_is_type(f, json_type_object))
        return NULL;
    return f;
}

const char *kvli_etcd_str(json_object *o, const char *field)
{
    json_object *f = NULL;
    if (o == NULL || !json_object_object_get_ex(o, field, &f) ||
        !json_object_is_type(f, json_type_string))
        return NULL;
    return json_object_get_string(f);
}

bool kvli_etcd_true(json_object *o, const char *field)
{
    json_object *f = NULL;
    return o != NULL && json_object_object_get_ex(o, field, &f) &&
           json_object_is_type(f, json_type_boolean) && json_object_get_boolean(f);
}

bool kvli_etcd_has(json_object *o, const char *field)
{
    return o != NULL && json_object_object_get_ex(o, field, NULL);
}

/* A decimal int64 and nothing else (the gateway writes int64 fields as
 * strings): true with *v. */
static bool kvli_etcd_dec(const char *s, int64_t *v)
{
    char *end = NULL;
    if (s == NULL || *s == '\0' || (*s != '-' && (*s < '0' || *s > '9')))
        return false;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return false;
    *v = (int64_t)x;
    return true;
}

int64_t kvli_etcd_i64(json_object *o, const char *field)
{
    json_object *f = NULL;
    int64_t v = 0;
    if (o == NULL || !json_object_object_get_ex(o, field, &f))
        return 0;
    if (json_object_is_type(f, json_type_string))
        return kvli_etcd_dec(json_object_get_string(f), &v) ? v : 0;
    if (json_object_is_type(f, json_type_int))
        return json_object_get_int64(f);
    return 0;
}

/* The metadata in one range answer: KVL_OK with *blob_p (malloc'ed), or
 * KVL_ERR_NOT_FOUND (no key, or an empty value: no metadata, as NIXL), or
 * KVL_ERR_REMOTE: the answer holds a key whose value is not base64 (why
 * says so; a value kvlane cannot read is not taken for no value). */
kvl_status_t kvli_etcd_range_value(json_object *ans, void **blob_p, size_t *len_p, char *why,
                                   size_t why_cap)
{
    json_object *kvs = kvli_etcd_arr(ans, "kvs"), *kv;
    *blob_p = NULL;
    *len_p = 0;
    if (kvs == NULL || json_object_array_length(kvs) == 0 ||
        (kv = json_object_array_get_idx(kvs, 0)) == NULL || !kvli_etcd_has(kv, "value"))
        return KVL_ERR_NOT_FOUND;
    const char *v = kvli_etcd_str(kv, "value");
    if (v == NULL || (*blob_p = kvli_etcd_unb64(v, len_p)) == NULL) {
        snprintf(why, why_cap, "etcd answered a key whose value is %s",
                 v == NULL ? "not a string" : "not base64");
        return KVL_ERR_REMOTE;
    }
    if (*len_p == 0) {
        free(*blob_p);
        *blob_p = NULL;
        return KVL_ERR_NOT_FOUND;
    }
    return KVL_OK;
}

bool kvli_etcd_wres_parse(json_object *o, kvli_etcd_wres_t *r)
{
    memset(r, 0, sizeof(*r));
    json_object *res = kvli_etcd_obj(o, "result");
    if (res == NULL) {
        /* the gateway's error object: {"error":{"grpc_code":..,"message":..}} or flat */
        json_object *e = kvli_etcd_obj(o, "error");
        json_object *src = e != NULL ? e : o;
        const char *m = kvli_etcd_str(src, "message");
        if (m == NULL)
            m = kvli_etcd_str(o, "error");
        int64_t code = kvli_etcd_i64(src, "code");
        if (code == 0)
            code = kvli_etcd_i64(src, "grpc_code");
        snprintf(r->fail, sizeof(r->fail), "%.200s (gRPC code %" PRId64 ")",
                 m != NULL ? m : "an answer that is not a watch result", code);
        return false;
    }
    r->created = kvli_etcd_true(res, "created");
    r->canceled = kvli_etcd_true(res, "canceled");
    r->watch_id = kvli_etcd_i64(res, "watch_id");
    r->compact = kvli_etcd_i64(res, "compact_revision");
    const char *why = kvli_etcd_str(res, "cancel_reason");
    kvli_scopy(r->reason, sizeof(r->reason), why != NULL && why[0] != '\0' ? why
                                                                           : "no reason given");
    r->events = kvli_etcd_arr(res, "events");
    return true;
}

/* "<16 hex digits> <decimal generation>", as etcd.c writes it, exactly. */
static bool kvli_etcd_presence_parse(const char *v, size_t len, uint64_t *inc, uint64_t *gen)
{
    uint64_t a = 0, g = 0;
    if (len < 18 || len > 16 + 1 + 20 || v[16] != ' ')
        return false;
    for (size_t i = 0; i < 16; i++) {
        char c = v[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16u;
        if (d == 16u)
            return false;
        a = a << 4 | d;
    }
    for (size_t i = 17; i < len; i++) {
        if (v[i] < '0' || v[i] > '9' || g > (UINT64_MAX - 9) / 10)
            return false;
        g = g * 10 + (uint64_t)(v[i] - '0');
    }
    *inc = a;
    *gen = g;
    return true;
}

kvli_etcd_ev_kind_t kvli_etcd_ev_parse(json_object *ev, const char *pfx, kvli_etcd_ev_t *e)
{
    memset(e, 0, sizeof(*e));
    json_object *kv = kvli_etcd_obj(ev, "kv");
    const char *k64 = kvli_etcd_str(kv, "key");
    e->mod_rev = kvli_etcd_i64(kv, "mod_revision");
    if (k64 == NULL)
        return KVLI_ETCD_EV_NONE;
    size_t kl = 0, pl = strlen(pfx);
    char *key = kvli_etcd_unb64(k64, &kl);
    if (key == NULL)
        return KVLI_ETCD_EV_NONE;
    key[kl] = '\0';
    bool ours = kl > pl && memcmp(key, pfx, pl) == 0 && kl - pl < sizeof(e->name) &&
                memchr(key + pl, '/', kl - pl) == NULL && memchr(key + pl, '\0', kl - pl) == NULL;
    if (ours)
        memcpy(e->name, key + pl, kl - pl + 1);
    free(key);
    if (!ours)
        return KVLI_ETCD_EV_NONE;
    /* PUT is the enum's zero: the gateway leaves it out */
    json_object *t = NULL;
    const char *type = kvli_etcd_str(ev, "type");
    if (type != NULL && strcmp(type, "DELETE") == 0) {
        e->del = true;
        return KVLI_ETCD_EV_OK;
    }
    if (type != NULL ? strcmp(type, "PUT") != 0
                     : json_object_object_get_ex(ev, "type", &t) && t != NULL) {
        snprintf(e->bad, sizeof(e->bad), "etcd sent an event of type %.40s on its presence key "
                 "(neither PUT nor DELETE)", type != NULL ? type : json_object_get_string(t));
        return KVLI_ETCD_EV_BAD;
    }
    const char *v64 = kvli_etcd_str(kv, "value");
    size_t vl = 0;
    char *val = v64 != NULL ? kvli_etcd_unb64(v64, &vl) : NULL;
    bool ok = val != NULL && kvli_etcd_presence_parse(val, vl, &e->inc, &e->gen);
    if (!ok) {
        if (val != NULL) {
            for (size_t i = 0; i < vl; i++)
                if (val[i] < 0x20 || val[i] > 0x7e)
                    val[i] = '?';
            val[vl] = '\0';
        }
        snprintf(e->bad, sizeof(e->bad), "its presence key holds %s%.40s%s, not \"<incarnation> "
                 "<generation>\"", val != NULL ? "'" : "", val != NULL ? val
                 : v64 != NULL ? "a value that is not base64" : "no value", val != NULL ? "'" : "");
    }
    free(val);
    return ok ? KVLI_ETCD_EV_OK : KVLI_ETCD_EV_BAD;
}
