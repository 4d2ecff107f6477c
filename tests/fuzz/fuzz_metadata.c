/* libFuzzer target: the metadata parser must refuse or accept any input
 * without crashing, and what it accepts must re-encode to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/md_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvli_md_t md;
    kvl_error_t err;
    if (kvli_md_decode(data, size, &md, &err) != KVL_OK)
        return 0;
    uint8_t *blob;
    size_t len;
    if (kvli_md_encode(&md, &blob, &len, &err) == KVL_OK) {
        /* Canonical form: decode(encode(x)) == x byte for byte. */
        if (len != size || memcmp(blob, data, size) != 0)
            abort();
        free(blob);
    }
    kvli_md_release(&md);
    return 0;
}
