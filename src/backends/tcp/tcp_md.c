/* kvlane tcp backend: memory. Local registration and its key, remote regions. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include "common/host.h"
#include "tcp.h"

kvl_status_t kvli_tcp_md_reg(void *bk, const kvl_region_info_t *r, void **mh_p, char *detail,
                             size_t detail_len, kvl_error_t *err)
{
    uintptr_t ps = (uintptr_t)kvli_host_pagesize();
    kvli_tcp_iface_t *iface = bk;
    kvli_tcp_mh_t *mh;
    int staged = 0;
    if (r == NULL || mh_p == NULL || r->len == 0 || r->addr + r->len < r->addr ||
        r->addr + r->len > (uint64_t)UINTPTR_MAX - ps) {
        kvl_bk_error_set(err, KVL_ERR_INVALID_ARG, 0, KVLI_TCP_NAME, -1,
                         "tcp register [0x%" PRIx64 ", +%" PRIu64 "): empty or wrapping range",
                         r ? r->addr : 0, r ? r->len : 0);
        kvl_bk_error_hint(err, "pass a non-empty range inside the address space");
        return KVL_ERR_INVALID_ARG;
    }
    if (r->kind == KVL_MEM_VRAM) {
        /* moved through pinned host buffers with the cuda backend's copies */
        kvl_error_t e;
        memset(&e, 0, offsetof(kvl_error_t, causes));
        if (!kvli_stage_usable(iface->ctx))
            kvl_bk_error_set(&e, KVL_ERR_UNSUPPORTED, 0, KVLI_TCP_NAME, r->dev,
                             "the kvlane core offers no staging copies");
        else
            iface->ctx->stage_check(iface->ctx, r->kind, r->dev, &e);
        if (e.code != KVL_OK) {
            kvl_bk_error_set(err, e.code, 0, KVLI_TCP_NAME, r->dev,
                             "tcp register VRAM [0x%" PRIx64 ", +%" PRIu64 ") of device %d: "
                             "cannot stage it through host memory (the cause below)", r->addr, r->len,
                             (int)r->dev);
            kvl_bk_error_hint(err, "register host memory instead, or fix the cause below");
            kvl_bk_error_cause(err, &e); /* whole, with its own fix */
            return e.code;
        }
        staged = 1;
    } else if (r->kind != KVL_MEM_DRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_TCP_NAME, r->dev,
                         "tcp register [0x%" PRIx64 ", +%" PRIu64 "): memory kind %d is neither "
                         "DRAM nor VRAM", r->addr, r->len, (int)r->kind);
        kvl_bk_error_hint(err, "the tcp backend moves host memory, and GPU memory staged "
                          "through host memory; read files into registered memory first");
        return KVL_ERR_UNSUPPORTED;
    }
    /* Host memory: the core checked that it is mapped and readable, for
     * the whole registration list at once (common/host.c). */
    mh = calloc(1, sizeof(*mh));
    if (mh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: calloc(%zu) failed", sizeof(*mh));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    mh->addr = r->addr;
    mh->len = r->len;
    mh->staged = staged;
    mh->dev = r->dev;
    if (staged) /* buffers now, not in the first transfer */
        kvli_bounce_expect(&iface->bounce, &iface->pg);
    kvl_bk_scopy(detail, detail_len, staged
                      ? "staged: VRAM <-> pinned host buffers (CUDA copies) <-> socket, pipelined"
                      : "socket (sendmsg/recvmsg from/into this memory)");
    *mh_p = mh;
    return KVL_OK;
}

void kvli_tcp_md_dereg(void *bk, void *mh)
{
    (void)bk;
    free(mh);
}

kvl_status_t kvli_tcp_md_pack(void *bk, void *mh_h, uint8_t *buf, size_t cap, size_t *len_p)
{
    kvli_tcp_mh_t *mh = mh_h;
    (void)bk;
    if (cap < KVLI_TCP_KEY_LEN)
        return KVL_ERR_INVALID_ARG;
    kvli_tcp_proto_key_build(buf, mh->addr, mh->len);
    *len_p = KVLI_TCP_KEY_LEN;
    return KVL_OK;
}

kvl_status_t kvli_tcp_md_rload(void *bk, void *peer_h, const kvl_region_info_t *r,
                               const uint8_t *key, size_t len, void **rh_p, kvl_error_t *err)
{
    kvli_tcp_peer_t *peer = peer_h;
    kvli_tcp_rh_t *rh;
    uint64_t a = 0, l = 0;
    char why[128] = "";
    (void)bk;
    if (r == NULL || kvli_tcp_proto_key_parse(key, len, &a, &l, why, sizeof(why)) != 0 ||
        a != r->addr || l != r->len || r->len == 0 || r->addr + r->len < r->addr) {
        if (!why[0])
            snprintf(why, sizeof(why), "key names 0x%" PRIx64 "+%" PRIu64 ", not the region",
                     a, l);
        kvl_bk_error_set(err, KVL_ERR_BAD_METADATA, 0, KVLI_TCP_NAME, -1,
                         "tcp key of agent '%s' region [0x%" PRIx64 ", +%" PRIu64 "): %s",
                         peer->name, r ? r->addr : 0, r ? r->len : 0, why);
        if (err != NULL)
            snprintf(err->agent, sizeof(err->agent), "%s", peer->name);
        kvl_bk_error_hint(err, "the metadata blob is corrupted or from an incompatible kvlane "
                          "build; fetch it again from the peer");
        return KVL_ERR_BAD_METADATA;
    }
    if (r->kind != KVL_MEM_DRAM && r->kind != KVL_MEM_VRAM) {
        kvl_bk_error_set(err, KVL_ERR_UNSUPPORTED, 0, KVLI_TCP_NAME, -1,
                         "region [0x%" PRIx64 ", +%" PRIu64 ") of agent '%s' has memory kind "
                         "%d, neither DRAM nor VRAM", r->addr, r->len, peer->name, (int)r->kind);
        kvl_bk_error_hint(err, "the tcp backend reaches remote host memory, and remote GPU "
                          "memory the peer stages");
        return KVL_ERR_UNSUPPORTED;
    }
    rh = calloc(1, sizeof(*rh));
    if (rh == NULL) {
        kvl_bk_error_set(err, KVL_ERR_NO_MEMORY, ENOMEM, KVLI_TCP_NAME, -1,
                         "tcp: calloc(%zu) failed", sizeof(*rh));
        kvl_bk_error_hint(err, "the process is out of memory");
        return KVL_ERR_NO_MEMORY;
    }
    rh->peer = peer;
    rh->addr = r->addr;
    rh->len = r->len;
    *rh_p = rh;
    return KVL_OK;
}

void kvli_tcp_md_runload(void *bk, void *peer, void *rh)
{
    (void)bk;
    (void)peer;
    free(rh);
}
