/* Metadata wire format: encode and a hardened decoder for untrusted blobs. */
#ifndef KVLI_MD_CODEC_H
#define KVLI_MD_CODEC_H

#include "internal.h"

#define KVLI_MD_MAGIC "KVLM"
#define KVLI_MD_VERSION 1
#define KVLI_MD_HEADER_LEN 20
#define KVLI_MD_MAX_LEN (64u << 20)       /* refuse larger blobs outright */
#define KVLI_MD_MAX_REGIONS (1u << 22)
/* Header flags. PARTIAL: the blob names only some regions (they are merged
 * into the agent already loaded, kvl_metadata_get_partial); NO_CONN (only
 * with PARTIAL): the backends carry no connection info, only the names the
 * region keys refer to. A full blob has flags 0. */
#define KVLI_MD_FLAG_PARTIAL 0x1u
#define KVLI_MD_FLAG_NO_CONN 0x2u
#define KVLI_MD_FLAGS_KNOWN (KVLI_MD_FLAG_PARTIAL | KVLI_MD_FLAG_NO_CONN)

typedef struct kvli_md_key {
    const uint8_t *data;
    uint16_t len;
    bool present;
} kvli_md_key_t;

typedef struct kvli_md_region {
    uint64_t addr, len;
    kvl_mem_kind_t kind;
    int32_t dev;
    kvli_md_key_t keys[KVLI_MAX_BACKENDS];   /* indexed by backend number */
} kvli_md_region_t;

typedef struct kvli_md_backend {
    char name[32];
    const uint8_t *conn;
    uint32_t conn_len;
} kvli_md_backend_t;

typedef struct kvli_md {
    char name[KVL_NAME_MAX];
    uint64_t incarnation, start_ns, generation;
    uint32_t flags;                          /* KVLI_MD_FLAG_* */
    unsigned n_backends;
    kvli_md_backend_t backends[KVLI_MAX_BACKENDS];
    uint32_t n_regions;
    kvli_md_region_t *regions;               /* decoded: malloc'ed */
} kvli_md_t;

/* Encode md into a malloc'ed blob. */
kvl_status_t kvli_md_encode(const kvli_md_t *md, uint8_t **blob_p, size_t *len_p,
                            kvl_error_t *err);
/* Decode an untrusted blob; pointers in *md point into blob. Free with
 * kvli_md_release(). On error *md holds nothing to free. */
kvl_status_t kvli_md_decode(const void *blob, size_t len, kvli_md_t *md, kvl_error_t *err);
void kvli_md_release(kvli_md_t *md);
/* KVL_OK when blob is partial metadata of agent a, this incarnation (what
 * kvl_metadata_get_partial made); err filled, naming call, otherwise. */
kvl_status_t kvli_md_check_own_partial(kvl_agent_t *a, const void *blob, size_t len,
                                       const char *call, kvl_error_t *err);

#endif
