/* libFuzzer target: the metadata parser must refuse or accept any input
 * without crashing, and what it accepts must re-encode to the same bytes.
 * Inputs that do not start with the magic "KVLM" are sealed first (what
 * follows their first byte gets a valid header: magic, version, header and
 * total length, crc32c; the flags are the input's): random bytes almost
 * never carry a right checksum, and sealing lets the fuzzer reach the
 * body's parser, as a peer that computes the checksum of what it sends
 * can. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/wire.h"
#include "core/md_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size)
{
    kvli_md_t md;
    kvl_error_t err;
    if (kvli_md_decode(data, size, &md, &err) != KVL_OK)
        return;
    uint8_t *blob;
    size_t len;
    if (kvli_md_encode(&md, &blob, &len, &err) == KVL_OK) {
        /* Canonical form: decode(encode(x)) == x byte for byte. */
        if (len != size || memcmp(blob, data, size) != 0)
            abort();
        free(blob);
    }
    kvli_md_release(&md);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || (size >= 4 && memcmp(data, KVLI_MD_MAGIC, 4) == 0)) {
        check(data, size); /* as they come (the seeds are real blobs) */
        return 0;
    }
    size_t n = size - 1;
    if (n < KVLI_MD_HEADER_LEN || n > KVLI_MD_MAX_LEN)
        return 0;
    uint8_t *b = malloc(n);
    if (b == NULL)
        abort();
    memcpy(b, data + 1, n);
    memcpy(b, KVLI_MD_MAGIC, 4);
    kvli_put16(b + 4, KVLI_MD_VERSION);
    kvli_put16(b + 6, KVLI_MD_HEADER_LEN);
    kvli_put32(b + 8, (uint32_t)n);
    kvli_put32(b + 12, 0);
    kvli_put32(b + 12, kvli_crc32c(0, b, n));
    check(b, n);
    free(b);
    return 0;
}
