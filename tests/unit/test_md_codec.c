/* Metadata codec (src/core/md_codec.c): round trips at every limit, every
 * corruption and truncation refused, each structural check with its reason,
 * and the 64 MiB bound on both sides. */
#include <string.h>
#include "common/kvltest.h"
#include "core/md_codec.h"

static void build(kvli_md_t *md, kvli_md_region_t *regs, unsigned nregs)
{
    static const uint8_t conn0[] = "conn-bytes-of-shm";
    static const uint8_t key[] = {1, 2, 3, 4, 5, 6, 7, 8};
    memset(md, 0, sizeof(*md));
    strcpy(md->name, "decode-0");
    md->incarnation = 0x1122334455667788ull;
    md->start_ns = 123456789;
    md->generation = 7;
    md->n_backends = 2;
    strcpy(md->backends[0].name, "shm");
    md->backends[0].conn = conn0;
    md->backends[0].conn_len = sizeof(conn0);
    strcpy(md->backends[1].name, "tcp");
    md->backends[1].conn = conn0;
    md->backends[1].conn_len = 3;
    memset(regs, 0, nregs * sizeof(*regs));
    for (unsigned i = 0; i < nregs; i++) {
        regs[i].addr = 0x7f0000000000ull + i * 0x100000ull;
        regs[i].len = 0x100000;
        regs[i].kind = KVL_MEM_DRAM;
        regs[i].dev = 0;
        regs[i].keys[0] = (kvli_md_key_t){key, sizeof(key), true};
        if (i & 1)
            regs[i].keys[1] = (kvli_md_key_t){key, 2, true};
    }
    md->regions = regs;
    md->n_regions = nregs;
}

/* ---- blobs written by hand, sealed with a valid length and checksum, so
 * that the decoder's structural checks are the ones that answer ---- */

typedef struct {
    uint8_t *p;
    size_t n;
} wb_t;

static void put(wb_t *w, uint64_t v, unsigned bytes)
{
    w->p = realloc(w->p, w->n + bytes);
    for (unsigned i = 0; i < bytes; i++)
        w->p[w->n++] = (uint8_t)(v >> (8 * i));
}

static void put_str(wb_t *w, const char *s)
{
    size_t n = strlen(s);
    put(w, n, 1);
    w->p = realloc(w->p, w->n + n);
    memcpy(w->p + w->n, s, n);
    w->n += n;
}

static void put_zeros(wb_t *w, size_t n)
{
    while (n--)
        put(w, 0, 1);
}

static wb_t header(unsigned hlen, uint32_t flags)
{
    wb_t w = {NULL, 0};
    put(&w, 'K', 1);
    put(&w, 'V', 1);
    put(&w, 'L', 1);
    put(&w, 'M', 1);
    put(&w, KVLI_MD_VERSION, 2);
    put(&w, hlen, 2);
    put(&w, 0, 4); /* total */
    put(&w, 0, 4); /* crc */
    put(&w, flags, 4);
    return w;
}

/* Agent "ag", incarnation inc, generation 1, then nb backends "b0", "b1"... */
static void agent_part(wb_t *w, uint64_t inc, unsigned nb)
{
    put_str(w, "ag");
    put(w, inc, 8);
    put(w, 1, 8);
    put(w, 1, 8);
    put(w, nb, 1);
    for (unsigned b = 0; b < nb; b++) {
        char name[8];
        snprintf(name, sizeof(name), "b%u", b);
        put_str(w, name);
        put(w, 1, 4);
        put(w, 'c', 1);
    }
}

static void region(wb_t *w, uint64_t addr, uint64_t len, unsigned kind, uint32_t dev,
                   unsigned nkeys)
{
    put(w, addr, 8);
    put(w, len, 8);
    put(w, kind, 1);
    put(w, dev, 4);
    put(w, nkeys, 1);
}

static void key(wb_t *w, unsigned b, unsigned len)
{
    put(w, b, 1);
    put(w, len, 2);
    put_zeros(w, len);
}

static void seal(wb_t *w)
{
    for (unsigned i = 0; i < 4; i++)
        w->p[8 + i] = (uint8_t)(w->n >> (8 * i));
    memset(w->p + 12, 0, 4);
    uint32_t c = kvli_crc32c(0, w->p, w->n);
    for (unsigned i = 0; i < 4; i++)
        w->p[12 + i] = (uint8_t)(c >> (8 * i));
}

/* The sealed blob is refused with this text in what. */
static void expect_refused(wb_t *w, const char *want)
{
    kvli_md_t out;
    kvl_error_t err;
    seal(w);
    kvl_status_t st = kvli_md_decode(w->p, w->n, &out, &err);
    if (st != KVL_ERR_BAD_METADATA || strstr(err.what, want) == NULL) {
        fprintf(stderr, "wanted \"%s\", got %s: %s\n", want, kvl_status_name(st), err.what);
        KT_CHECK(0);
    }
    KT_CHECK(out.regions == NULL && out.n_regions == 0); /* nothing to free */
    KT_CHECK(strstr(err.hint, "pass the exact bytes the remote agent's kvl_metadata_get() "
                              "produced") == err.hint);
    free(w->p);
}

static void test_structure_refused(void)
{
    wb_t w;
    /* a well-formed hand-written blob decodes */
    w = header(20, 0);
    agent_part(&w, 7, 2);
    put(&w, 1, 4);
    region(&w, 0x1000, 0x100, KVL_MEM_VRAM, 3, 2);
    key(&w, 0, 0);
    key(&w, 1, 4);
    seal(&w);
    kvli_md_t out;
    kvl_error_t err;
    KT_CHECK(kvli_md_decode(w.p, w.n, &out, &err) == KVL_OK);
    KT_CHECK(out.n_regions == 1 && out.regions[0].kind == KVL_MEM_VRAM && out.regions[0].dev == 3);
    KT_CHECK(out.regions[0].keys[0].present && out.regions[0].keys[0].len == 0);
    KT_CHECK(out.regions[0].keys[1].present && out.regions[0].keys[1].len == 4);
    kvli_md_release(&out);
    KT_CHECK(out.regions == NULL);
    free(w.p);

    w = header(20, 0);
    memcpy(w.p, "KVLX", 4);
    agent_part(&w, 7, 0);
    put(&w, 0, 4);
    expect_refused(&w, "not kvlane metadata: magic bytes are not \"KVLM\"");
    w = header(24, 0);
    agent_part(&w, 7, 0);
    put(&w, 0, 4);
    expect_refused(&w, "metadata header length 24 / flags 0x0 not valid for version 1");
    w = header(20, 2);
    agent_part(&w, 7, 0);
    put(&w, 0, 4);
    expect_refused(&w, "metadata header length 20 / flags 0x2 not valid for version 1");

    w = header(20, 0);
    put(&w, 0, 1); /* empty agent name */
    expect_refused(&w, "agent name length 0 is outside 1..63");
    w = header(20, 0);
    put(&w, 64, 1);
    put_zeros(&w, 64);
    expect_refused(&w, "agent name length 64 is outside 1..63");
    w = header(20, 0);
    put_str(&w, "a b");
    expect_refused(&w, "agent name has a non-printable byte 0x20");
    w = header(20, 0);
    agent_part(&w, 0, 0);
    put(&w, 0, 4);
    expect_refused(&w, "incarnation id is 0");
    w = header(20, 0);
    agent_part(&w, 7, 9);
    expect_refused(&w, "9 backends, at most 8 allowed");
    w = header(20, 0);
    agent_part(&w, 7, 0);
    w.p[w.n - 1] = 2; /* two backends, both "b0" */
    for (int i = 0; i < 2; i++) {
        put_str(&w, "b0");
        put(&w, 0, 4);
    }
    expect_refused(&w, "backend 'b0' appears twice");
    w = header(20, 0);
    agent_part(&w, 7, 0);
    w.p[w.n - 1] = 1;
    put_str(&w, "b0");
    put(&w, KVL_BK_CONN_MAX + 1, 4);
    put_zeros(&w, KVL_BK_CONN_MAX + 1);
    expect_refused(&w, "backend 'b0' connection info of 4097 bytes exceeds 4096");
    w = header(20, 0);
    agent_part(&w, 7, 1);
    put(&w, 1000, 4); /* 1000 regions in what remains */
    region(&w, 0x1000, 0x10, KVL_MEM_DRAM, 0, 0);
    expect_refused(&w, "region count 1000 is larger than the blob can hold");

    static const struct {
        uint64_t addr, len;
        unsigned kind;
        const char *why;
    } regs[] = {
        {0x1000, 0, KVL_MEM_DRAM, "region 0 (0x1000+0) is empty or wraps"},
        {UINT64_MAX - 15, 16, KVL_MEM_DRAM, "region 0 (0xfffffffffffffff0+16) is empty or wraps"},
        {0x1000, 16, KVL_MEM_AUTO, "region 0 has memory kind 0"},
        {0x1000, 16, 4, "region 0 has memory kind 4"},
    };
    for (size_t i = 0; i < sizeof(regs) / sizeof(regs[0]); i++) {
        w = header(20, 0);
        agent_part(&w, 7, 1);
        put(&w, 1, 4);
        region(&w, regs[i].addr, regs[i].len, regs[i].kind, 0, 0);
        expect_refused(&w, regs[i].why);
    }
    w = header(20, 0);
    agent_part(&w, 7, 2);
    put(&w, 1, 4);
    region(&w, 0x1000, 16, KVL_MEM_DRAM, 0, 3);
    expect_refused(&w, "region 0 has 3 keys for 2 backends");
    w = header(20, 0);
    agent_part(&w, 7, 2);
    put(&w, 1, 4);
    region(&w, 0x1000, 16, KVL_MEM_DRAM, 0, 1);
    key(&w, 2, 0);
    expect_refused(&w, "region 0 key 0 names backend 2 (no such backend)");
    w = header(20, 0);
    agent_part(&w, 7, 2);
    put(&w, 1, 4);
    region(&w, 0x1000, 16, KVL_MEM_DRAM, 0, 2);
    key(&w, 1, 1);
    key(&w, 1, 1);
    expect_refused(&w, "region 0 key 1 names backend 1 (twice)");
    w = header(20, 0);
    agent_part(&w, 7, 2);
    put(&w, 1, 4);
    region(&w, 0x1000, 16, KVL_MEM_DRAM, 0, 2);
    key(&w, 1, 1);
    key(&w, 0, 1);
    expect_refused(&w, "region 0 key 1 names backend 0 after backend 1 (keys come in backend "
                       "order)");
    w = header(20, 0);
    agent_part(&w, 7, 1);
    put(&w, 1, 4);
    region(&w, 0x1000, 16, KVL_MEM_DRAM, 0, 1);
    key(&w, 0, KVL_BK_KEY_MAX + 1);
    expect_refused(&w, "region 0 key of 1025 bytes exceeds 1024");
    w = header(20, 0);
    agent_part(&w, 7, 1);
    put(&w, 2, 4);
    region(&w, 0x1000, 16, KVL_MEM_DRAM, 0, 0);
    region(&w, 0x2000, 16, KVL_MEM_DRAM, 0, 1);
    put(&w, 0, 1);
    put(&w, 30, 2); /* a key longer than what is left */
    put_zeros(&w, 10);
    expect_refused(&w, "metadata truncated: field 'region key' needs 30 bytes at offset");
    w = header(20, 0);
    agent_part(&w, 7, 1);
    put(&w, 0, 4);
    put_zeros(&w, 2);
    expect_refused(&w, "2 unexpected bytes after the last region");
}

/* Everything at its limits survives a round trip. */
static void test_limits_round_trip(void)
{
    static uint8_t conn[KVL_BK_CONN_MAX], keybuf[KVL_BK_KEY_MAX];
    kvli_md_t md, out;
    kvli_md_region_t regs[3];
    kvl_error_t err;
    uint8_t *blob;
    size_t len;
    for (size_t i = 0; i < sizeof(conn); i++)
        conn[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < sizeof(keybuf); i++)
        keybuf[i] = (uint8_t)(i * 13);
    memset(&md, 0, sizeof(md));
    memset(regs, 0, sizeof(regs));
    memset(md.name, '~', KVL_NAME_MAX - 1);
    md.incarnation = UINT64_MAX;
    md.start_ns = 0;
    md.generation = UINT64_MAX;
    md.n_backends = KVLI_MAX_BACKENDS;
    for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++) {
        memset(md.backends[b].name, 'a' + (char)b, sizeof(md.backends[b].name) - 1);
        md.backends[b].conn = conn;
        md.backends[b].conn_len = b == 0 ? 0 : b == 1 ? KVL_BK_CONN_MAX : b;
    }
    regs[0] = (kvli_md_region_t){.addr = 0, .len = UINT64_MAX, .kind = KVL_MEM_FILE, .dev = -1};
    regs[1] = (kvli_md_region_t){.addr = UINT64_MAX - 1, .len = 1, .kind = KVL_MEM_VRAM,
                                 .dev = INT32_MIN};
    regs[2] = (kvli_md_region_t){.addr = 4096, .len = 1, .kind = KVL_MEM_DRAM, .dev = INT32_MAX};
    for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++)
        regs[1].keys[b] = (kvli_md_key_t){keybuf, (uint16_t)(b == 7 ? KVL_BK_KEY_MAX : b), true};
    regs[2].keys[7] = (kvli_md_key_t){keybuf, 1, true};
    md.regions = regs;
    md.n_regions = 3;
    KT_CHECK(kvli_md_encode(&md, &blob, &len, &err) == KVL_OK);
    KT_CHECK(kvli_md_decode(blob, len, &out, &err) == KVL_OK);
    KT_CHECK(strcmp(out.name, md.name) == 0 && out.incarnation == UINT64_MAX);
    KT_CHECK(out.start_ns == 0 && out.generation == UINT64_MAX && out.n_backends == 8);
    for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++) {
        KT_CHECK(strcmp(out.backends[b].name, md.backends[b].name) == 0);
        KT_CHECK(out.backends[b].conn_len == md.backends[b].conn_len);
        KT_CHECK(memcmp(out.backends[b].conn, conn, out.backends[b].conn_len) == 0);
    }
    KT_CHECK(out.n_regions == 3);
    for (unsigned i = 0; i < 3; i++) {
        KT_CHECK(out.regions[i].addr == regs[i].addr && out.regions[i].len == regs[i].len);
        KT_CHECK(out.regions[i].kind == regs[i].kind && out.regions[i].dev == regs[i].dev);
        for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++) {
            KT_CHECK(out.regions[i].keys[b].present == regs[i].keys[b].present);
            KT_CHECK(out.regions[i].keys[b].len == regs[i].keys[b].len);
            if (regs[i].keys[b].present)
                KT_CHECK(memcmp(out.regions[i].keys[b].data, keybuf, regs[i].keys[b].len) == 0);
        }
    }
    /* the decoded pointers point into the blob */
    KT_CHECK(out.backends[1].conn > blob && out.backends[1].conn < blob + len);
    kvli_md_release(&out);
    free(blob);
}

/* More than 64 MiB is refused when encoding, as it would be when decoding. */
static void test_encode_limit(void)
{
    static uint8_t keybuf[KVL_BK_KEY_MAX];
    kvli_md_t md;
    kvl_error_t err;
    uint8_t *blob = NULL;
    size_t len = 0;
    /* 8 keys of 1 KiB per region: 22 + 8 * (3 + 1024) bytes each */
    const uint32_t per = 22 + KVLI_MAX_BACKENDS * (3 + KVL_BK_KEY_MAX);
    uint32_t n = KVLI_MD_MAX_LEN / per + 1;
    kvli_md_region_t *regs = calloc(n, sizeof(*regs));
    KT_CHECK(regs != NULL);
    memset(&md, 0, sizeof(md));
    strcpy(md.name, "huge");
    md.incarnation = 1;
    md.n_backends = KVLI_MAX_BACKENDS;
    for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++)
        snprintf(md.backends[b].name, sizeof(md.backends[b].name), "b%u", b);
    for (uint32_t i = 0; i < n; i++) {
        regs[i] = (kvli_md_region_t){.addr = 4096ull * (i + 1), .len = 4096, .kind = KVL_MEM_DRAM};
        for (unsigned b = 0; b < KVLI_MAX_BACKENDS; b++)
            regs[i].keys[b] = (kvli_md_key_t){keybuf, KVL_BK_KEY_MAX, true};
    }
    md.regions = regs;
    md.n_regions = n;
    KT_CHECK(kvli_md_encode(&md, &blob, &len, &err) == KVL_ERR_UNSUPPORTED);
    KT_CHECK(strstr(err.what, "bytes, over the 64 MiB limit") != NULL);
    KT_CHECK(strcmp(err.hint, "register fewer, larger regions") == 0 && blob == NULL);
    /* one region fewer fits, and decodes */
    md.n_regions = n - 1;
    KT_CHECK(kvli_md_encode(&md, &blob, &len, &err) == KVL_OK && len <= KVLI_MD_MAX_LEN);
    kvli_md_t out;
    KT_CHECK(kvli_md_decode(blob, len, &out, &err) == KVL_OK && out.n_regions == n - 1);
    kvli_md_release(&out);
    free(blob);
    free(regs);
}

/* Partial blobs (kvl_metadata_get_partial): the flags round trip; NO_CONN
 * alone, unknown flags, and connection bytes in a NO_CONN blob are refused. */
static void test_partial_flags(void)
{
    kvli_md_t md, out;
    kvli_md_region_t regs[2];
    kvl_error_t err;
    uint8_t *blob;
    size_t len;
    build(&md, regs, 2);
    md.flags = KVLI_MD_FLAG_PARTIAL;
    KT_CHECK(kvli_md_encode(&md, &blob, &len, &err) == KVL_OK);
    KT_CHECK(kvli_md_decode(blob, len, &out, &err) == KVL_OK);
    KT_CHECK(out.flags == KVLI_MD_FLAG_PARTIAL && out.n_regions == 2);
    kvli_md_release(&out);
    free(blob);
    md.flags = KVLI_MD_FLAG_PARTIAL | KVLI_MD_FLAG_NO_CONN;
    md.backends[0].conn_len = md.backends[1].conn_len = 0;
    KT_CHECK(kvli_md_encode(&md, &blob, &len, &err) == KVL_OK);
    KT_CHECK(kvli_md_decode(blob, len, &out, &err) == KVL_OK);
    KT_CHECK(out.flags == (KVLI_MD_FLAG_PARTIAL | KVLI_MD_FLAG_NO_CONN));
    KT_CHECK(out.n_backends == 2 && out.backends[0].conn_len == 0 && out.n_regions == 2);
    kvli_md_release(&out);
    const char *seed = getenv("KVL_WRITE_PARTIAL_SEED");
    if (seed) {
        FILE *f = fopen(seed, "wb");
        if (f) {
            fwrite(blob, 1, len, f);
            fclose(f);
        }
    }
    free(blob);

    wb_t w = header(20, KVLI_MD_FLAG_NO_CONN);
    agent_part(&w, 7, 0);
    put(&w, 0, 4);
    expect_refused(&w, "flags 0x2 not valid");
    w = header(20, 0x4);
    agent_part(&w, 7, 0);
    put(&w, 0, 4);
    expect_refused(&w, "flags 0x4 not valid");
    w = header(20, KVLI_MD_FLAG_PARTIAL | KVLI_MD_FLAG_NO_CONN);
    agent_part(&w, 7, 1); /* b0 with one byte of connection info */
    put(&w, 0, 4);
    expect_refused(&w, "backend 'b0' has 1 bytes of connection info in a blob flagged as "
                       "carrying none");
}

int main(void)
{
    kvli_md_t md, out;
    kvli_md_region_t regs[4];
    kvl_error_t err;
    uint8_t *blob;
    size_t len;

    build(&md, regs, 4);
    KT_CHECK(kvli_md_encode(&md, &blob, &len, &err) == KVL_OK);
    KT_CHECK(kvli_md_decode(blob, len, &out, &err) == KVL_OK);
    KT_CHECK(strcmp(out.name, "decode-0") == 0 && out.incarnation == md.incarnation);
    KT_CHECK(out.generation == 7 && out.n_backends == 2 && out.n_regions == 4);
    KT_CHECK(out.regions[3].addr == regs[3].addr && out.regions[3].keys[1].present);
    KT_CHECK(!out.regions[2].keys[1].present && out.regions[2].keys[0].len == 8);
    KT_CHECK(out.backends[0].conn_len == md.backends[0].conn_len &&
             memcmp(out.backends[0].conn, md.backends[0].conn, md.backends[0].conn_len) == 0);
    kvli_md_release(&out);

    /* Every single-byte flip (three different flips per byte) is refused:
     * the checksum covers every byte, so none may decode. */
    unsigned refused = 0, total = 0;
    for (size_t i = 0; i < len; i++) {
        for (int f = 0; f < 3; f++) {
            uint8_t *c = malloc(len);
            memcpy(c, blob, len);
            c[i] ^= (uint8_t)(f == 0 ? 0x01 : f == 1 ? 0x80 : 0xff);
            kvl_status_t st = kvli_md_decode(c, len, &out, &err);
            total++;
            if (st == KVL_OK) {
                fprintf(stderr, "flip at byte %zu (mask %d) decoded\n", i, f);
                kvli_md_release(&out);
            } else {
                KT_CHECK(st == KVL_ERR_BAD_METADATA);
                KT_CHECK(err.what[0] != '\0');
                refused++;
            }
            free(c);
        }
    }
    KT_CHECK(refused == total);

    /* Every truncation refused, with the reason naming the length. */
    for (size_t l = 0; l < len; l++) {
        KT_CHECK(kvli_md_decode(blob, l, &out, &err) == KVL_ERR_BAD_METADATA);
        if (l >= KVLI_MD_HEADER_LEN)
            KT_CHECK(strstr(err.what, "bytes") != NULL);
    }
    /* Wrong version, clearly reported. */
    uint8_t *c = malloc(len + 16);
    memcpy(c, blob, len);
    c[4] = 9;
    KT_CHECK(kvli_md_decode(c, len, &out, &err) == KVL_ERR_BAD_METADATA);
    KT_CHECK(strstr(err.what, "version 9") != NULL);
    /* Padding after the blob: the length field disagrees. */
    memcpy(c, blob, len);
    memset(c + len, 0, 16);
    KT_CHECK(kvli_md_decode(c, len + 16, &out, &err) == KVL_ERR_BAD_METADATA);
    KT_CHECK(strstr(err.what, "truncated or padded") != NULL);
    /* Oversized: refused before anything is read. */
    KT_CHECK(kvli_md_decode(blob, (size_t)KVLI_MD_MAX_LEN + 1, &out, &err) == KVL_ERR_BAD_METADATA);
    KT_CHECK(strstr(err.what, "limit") != NULL);
    /* Not metadata at all. */
    KT_CHECK(kvli_md_decode("hello world, this is text", 25, &out, &err) == KVL_ERR_BAD_METADATA);
    KT_CHECK(kvli_md_decode(NULL, 0, &out, &err) == KVL_ERR_BAD_METADATA);
    free(c);

    /* Write a seed for the fuzzer's corpus when asked. */
    const char *seed = getenv("KVL_WRITE_SEED");
    if (seed) {
        FILE *f = fopen(seed, "wb");
        if (f) {
            fwrite(blob, 1, len, f);
            fclose(f);
        }
    }
    free(blob);
    test_structure_refused();
    test_limits_round_trip();
    test_encode_limit();
    test_partial_flags();
    printf("md codec: %u corruptions refused, %zu truncations refused\n", refused, len);
    return 0;
}
