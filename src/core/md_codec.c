/*
 * Metadata wire format, version 1 (all integers little endian):
 *   header: "KVLM" | u16 version | u16 header length (20) | u32 total length
 *           | u32 crc32c | u32 flags (0: full; PARTIAL, PARTIAL|NO_CONN: see
 *           md_codec.h; an older kvlane refuses partial blobs by their flags)
 *   body:   u8 name length | name | u64 incarnation | u64 start ns |
 *           u64 generation | u8 backends | { u8 len | name | u32 len | conn }
 *           | u32 regions | { u64 addr | u64 len | u8 kind | i32 dev | u8 keys
 *           | { u8 backend | u16 len | key } }
 * The crc covers the whole blob with its crc field taken as zero. The blob
 * must end exactly where the body does. Every count and length is bounded.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "md_codec.h"

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    bool oom;
} kvli_wbuf_t;

static void kvli_w(kvli_wbuf_t *w, const void *p, size_t n)
{
    if (w->oom || n == 0) /* p may be NULL then: memcpy must not see it */
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *nb = realloc(w->buf, cap);
        if (nb == NULL) {
            w->oom = true;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void kvli_w8(kvli_wbuf_t *w, uint8_t v) { kvli_w(w, &v, 1); }

static void kvli_wle(kvli_wbuf_t *w, uint64_t v, unsigned bytes)
{
    uint8_t b[8];
    for (unsigned i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    kvli_w(w, b, bytes);
}

static void kvli_put_le32(uint8_t *p, uint32_t v)
{
    for (unsigned i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

kvl_status_t kvli_md_encode(const kvli_md_t *md, uint8_t **blob_p, size_t *len_p, kvl_error_t *err)
{
    kvli_wbuf_t w = {0};
    kvli_w(&w, KVLI_MD_MAGIC, 4);
    kvli_wle(&w, KVLI_MD_VERSION, 2);
    kvli_wle(&w, KVLI_MD_HEADER_LEN, 2);
    kvli_wle(&w, 0, 4);   /* total, patched */
    kvli_wle(&w, 0, 4);   /* crc, patched */
    kvli_wle(&w, md->flags, 4);
    size_t nl = strlen(md->name);
    kvli_w8(&w, (uint8_t)nl);
    kvli_w(&w, md->name, nl);
    kvli_wle(&w, md->incarnation, 8);
    kvli_wle(&w, md->start_ns, 8);
    kvli_wle(&w, md->generation, 8);
    kvli_w8(&w, (uint8_t)md->n_backends);
    for (unsigned b = 0; b < md->n_backends; b++) {
        size_t bl = strlen(md->backends[b].name);
        kvli_w8(&w, (uint8_t)bl);
        kvli_w(&w, md->backends[b].name, bl);
        kvli_wle(&w, md->backends[b].conn_len, 4);
        kvli_w(&w, md->backends[b].conn, md->backends[b].conn_len);
    }
    kvli_wle(&w, md->n_regions, 4);
    for (uint32_t i = 0; i < md->n_regions; i++) {
        const kvli_md_region_t *r = &md->regions[i];
        uint8_t nk = 0;
        kvli_wle(&w, r->addr, 8);
        kvli_wle(&w, r->len, 8);
        kvli_w8(&w, (uint8_t)r->kind);
        kvli_wle(&w, (uint32_t)r->dev, 4);
        for (unsigned b = 0; b < md->n_backends; b++)
            nk += r->keys[b].present;
        kvli_w8(&w, nk);
        for (unsigned b = 0; b < md->n_backends; b++) {
            if (!r->keys[b].present)
                continue;
            kvli_w8(&w, (uint8_t)b);
            kvli_wle(&w, r->keys[b].len, 2);
            kvli_w(&w, r->keys[b].data, r->keys[b].len);
        }
    }
    if (w.oom) {
        free(w.buf);
        kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "out of memory encoding metadata of %u regions",
                 md->n_regions);
        return err->code;
    }
    if (w.len > KVLI_MD_MAX_LEN) {
        free(w.buf);
        kvli_err(err, KVL_ERR_UNSUPPORTED, 0, "metadata of %u regions would be %zu bytes, over the "
                 "64 MiB limit", md->n_regions, w.len);
        kvli_hint(err, "register fewer, larger regions");
        return err->code;
    }
    kvli_put_le32(w.buf + 8, (uint32_t)w.len);
    kvli_put_le32(w.buf + 12, kvli_crc32c(0, w.buf, w.len));
    *blob_p = w.buf;
    *len_p = w.len;
    return KVL_OK;
}

/* ---- decoding: every read is bounds-checked ---- */

typedef struct {
    const uint8_t *p;
    size_t len, off;
    kvl_error_t *err;
    bool failed;
} kvli_rbuf_t;

static bool kvli_r_need(kvli_rbuf_t *r, size_t n, const char *field)
{
    if (r->failed)
        return false;
    if (n > r->len - r->off) {
        kvli_err(r->err, KVL_ERR_BAD_METADATA, 0,
                 "metadata truncated: field '%s' needs %zu bytes at offset %zu, blob has %zu",
                 field, n, r->off, r->len);
        r->failed = true;
        return false;
    }
    return true;
}

static uint64_t kvli_rle(kvli_rbuf_t *r, unsigned bytes, const char *field)
{
    uint64_t v = 0;
    if (!kvli_r_need(r, bytes, field))
        return 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)r->p[r->off + i] << (8 * i);
    r->off += bytes;
    return v;
}

static const uint8_t *kvli_rbytes(kvli_rbuf_t *r, size_t n, const char *field)
{
    if (!kvli_r_need(r, n, field))
        return NULL;
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

static bool kvli_r_bad(kvli_rbuf_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool kvli_r_bad(kvli_rbuf_t *r, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    kvli_err(r->err, KVL_ERR_BAD_METADATA, 0, "metadata invalid at offset %zu: %s", r->off, what);
    r->failed = true;
    return false;
}

static bool kvli_r_name(kvli_rbuf_t *r, char *out, size_t cap, const char *field)
{
    size_t n = (size_t)kvli_rle(r, 1, field);
    const uint8_t *s = kvli_rbytes(r, n, field);
    if (s == NULL)
        return false;
    if (n == 0 || n >= cap)
        return kvli_r_bad(r, "%s length %zu is outside 1..%zu", field, n, cap - 1);
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] >= 0x7f)
            return kvli_r_bad(r, "%s has a non-printable byte 0x%02x", field, s[i]);
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

kvl_status_t kvli_md_decode(const void *blob, size_t len, kvli_md_t *md, kvl_error_t *err)
{
    kvli_rbuf_t r = {blob, len, 0, err, false};
    memset(md, 0, sizeof(*md));
    if (blob == NULL || len < KVLI_MD_HEADER_LEN) {
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "metadata blob of %zu bytes is shorter than its "
                 "%d-byte header", blob ? len : 0, KVLI_MD_HEADER_LEN);
        goto fail_hint;
    }
    if (len > KVLI_MD_MAX_LEN) {
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "metadata blob of %zu bytes exceeds the %u-byte limit",
                 len, KVLI_MD_MAX_LEN);
        goto fail_hint;
    }
    if (memcmp(blob, KVLI_MD_MAGIC, 4) != 0) {
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "not kvlane metadata: magic bytes are not \"KVLM\"");
        goto fail_hint;
    }
    r.off = 4;
    unsigned version = (unsigned)kvli_rle(&r, 2, "version");
    unsigned hlen = (unsigned)kvli_rle(&r, 2, "header length");
    uint64_t total = kvli_rle(&r, 4, "total length");
    uint32_t crc = (uint32_t)kvli_rle(&r, 4, "crc32c");
    uint32_t flags = (uint32_t)kvli_rle(&r, 4, "flags");
    if (version != KVLI_MD_VERSION) {
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "metadata version %u; this kvlane reads version %d",
                 version, KVLI_MD_VERSION);
        kvli_hint(err, "run the same kvlane version on both sides");
        return KVL_ERR_BAD_METADATA;
    }
    if (hlen != KVLI_MD_HEADER_LEN || (flags & ~KVLI_MD_FLAGS_KNOWN) != 0 ||
        flags == KVLI_MD_FLAG_NO_CONN) {
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "metadata header length %u / flags 0x%x not valid "
                 "for version 1", hlen, flags);
        goto fail_hint;
    }
    if (total != len) {
        kvli_err(err, KVL_ERR_BAD_METADATA, 0, "metadata says it is %llu bytes but %zu were given "
                 "(truncated or padded in transit)", (unsigned long long)total, len);
        goto fail_hint;
    }
    {
        static const uint8_t zero[4];
        uint32_t c = kvli_crc32c(0, blob, 12);
        c = kvli_crc32c(c, zero, 4);
        c = kvli_crc32c(c, (const uint8_t *)blob + 16, len - 16);
        if (c != crc) {
            kvli_err(err, KVL_ERR_BAD_METADATA, 0, "metadata checksum mismatch (crc32c 0x%08x, "
                     "computed 0x%08x): the blob was corrupted in transit or storage", crc, c);
            goto fail_hint;
        }
    }
    md->flags = flags;
    if (!kvli_r_name(&r, md->name, sizeof(md->name), "agent name"))
        goto fail;
    md->incarnation = kvli_rle(&r, 8, "incarnation");
    md->start_ns = kvli_rle(&r, 8, "start time");
    md->generation = kvli_rle(&r, 8, "generation");
    md->n_backends = (unsigned)kvli_rle(&r, 1, "backend count");
    if (r.failed)
        goto fail;
    if (md->incarnation == 0) {
        kvli_r_bad(&r, "incarnation id is 0");
        goto fail;
    }
    if (md->n_backends > KVLI_MAX_BACKENDS) {
        kvli_r_bad(&r, "%u backends, at most %d allowed", md->n_backends, KVLI_MAX_BACKENDS);
        goto fail;
    }
    for (unsigned b = 0; b < md->n_backends; b++) {
        kvli_md_backend_t *be = &md->backends[b];
        if (!kvli_r_name(&r, be->name, sizeof(be->name), "backend name"))
            goto fail;
        for (unsigned j = 0; j < b; j++)
            if (strcmp(md->backends[j].name, be->name) == 0) {
                kvli_r_bad(&r, "backend '%s' appears twice", be->name);
                goto fail;
            }
        be->conn_len = (uint32_t)kvli_rle(&r, 4, "connection info length");
        if (!r.failed && be->conn_len > KVL_BK_CONN_MAX) {
            kvli_r_bad(&r, "backend '%s' connection info of %u bytes exceeds %d", be->name,
                       be->conn_len, KVL_BK_CONN_MAX);
            goto fail;
        }
        if (!r.failed && be->conn_len > 0 && (flags & KVLI_MD_FLAG_NO_CONN)) {
            kvli_r_bad(&r, "backend '%s' has %u bytes of connection info in a blob flagged as "
                       "carrying none", be->name, be->conn_len);
            goto fail;
        }
        be->conn = kvli_rbytes(&r, be->conn_len, "connection info");
        if (r.failed)
            goto fail;
    }
    md->n_regions = (uint32_t)kvli_rle(&r, 4, "region count");
    if (r.failed)
        goto fail;
    /* A region takes at least 22 bytes: reject counts the blob cannot hold
     * before allocating for them. */
    if (md->n_regions > KVLI_MD_MAX_REGIONS || md->n_regions > (len - r.off) / 22) {
        kvli_r_bad(&r, "region count %u is larger than the blob can hold", md->n_regions);
        goto fail;
    }
    if (md->n_regions > 0) {
        md->regions = calloc(md->n_regions, sizeof(*md->regions));
        if (md->regions == NULL) {
            kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "cannot allocate %u decoded regions", md->n_regions);
            return KVL_ERR_NO_MEMORY;
        }
    }
    for (uint32_t i = 0; i < md->n_regions; i++) {
        kvli_md_region_t *rg = &md->regions[i];
        rg->addr = kvli_rle(&r, 8, "region address");
        rg->len = kvli_rle(&r, 8, "region length");
        unsigned kind = (unsigned)kvli_rle(&r, 1, "region kind");
        rg->dev = (int32_t)(uint32_t)kvli_rle(&r, 4, "region device");
        unsigned nk = (unsigned)kvli_rle(&r, 1, "region key count");
        if (r.failed)
            goto fail;
        if (rg->len == 0 || kvli_add_overflows(rg->addr, rg->len)) {
            kvli_r_bad(&r, "region %u (0x%llx+%llu) is empty or wraps", i,
                       (unsigned long long)rg->addr, (unsigned long long)rg->len);
            goto fail;
        }
        if (kind < KVL_MEM_DRAM || kind > KVL_MEM_FILE) {
            kvli_r_bad(&r, "region %u has memory kind %u", i, kind);
            goto fail;
        }
        rg->kind = (kvl_mem_kind_t)kind;
        if (nk > md->n_backends) {
            kvli_r_bad(&r, "region %u has %u keys for %u backends", i, nk, md->n_backends);
            goto fail;
        }
        /* Keys come in backend order, as the encoder writes them: one
         * encoding per metadata (what decodes re-encodes to the same bytes). */
        for (unsigned k = 0, prev = 0; k < nk; k++) {
            unsigned b = (unsigned)kvli_rle(&r, 1, "key backend");
            unsigned kl = (unsigned)kvli_rle(&r, 2, "key length");
            if (r.failed)
                goto fail;
            if (b >= md->n_backends || rg->keys[b].present) {
                kvli_r_bad(&r, "region %u key %u names backend %u (%s)", i, k, b,
                           b >= md->n_backends ? "no such backend" : "twice");
                goto fail;
            }
            if (k > 0 && b < prev) {
                kvli_r_bad(&r, "region %u key %u names backend %u after backend %u (keys come "
                           "in backend order)", i, k, b, prev);
                goto fail;
            }
            prev = b;
            if (kl > KVL_BK_KEY_MAX) {
                kvli_r_bad(&r, "region %u key of %u bytes exceeds %d", i, kl, KVL_BK_KEY_MAX);
                goto fail;
            }
            rg->keys[b].data = kvli_rbytes(&r, kl, "region key");
            rg->keys[b].len = (uint16_t)kl;
            rg->keys[b].present = true;
            if (r.failed)
                goto fail;
        }
    }
    if (r.off != len) {
        kvli_r_bad(&r, "%zu unexpected bytes after the last region", len - r.off);
        goto fail;
    }
    return KVL_OK;
fail:
    kvli_md_release(md);
fail_hint:
    if (!err->hint[0])
        kvli_hint(err, "pass the exact bytes the remote agent's kvl_metadata_get() produced "
                       "(Python: get_metadata(), or get_agent_metadata() through nixl), "
                       "through a binary-safe transport, without text re-encoding");
    return KVL_ERR_BAD_METADATA;
}

void kvli_md_release(kvli_md_t *md)
{
    free(md->regions);
    md->regions = NULL;
    md->n_regions = 0;
}
