/* Metadata codec: round trip, and every corruption refused or harmless. */
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
    printf("md codec: %u corruptions refused, %zu truncations refused\n", refused, len);
    return 0;
}
