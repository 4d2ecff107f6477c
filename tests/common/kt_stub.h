/*
 * A stub backend for unit tests of the core: it moves no bytes, answers
 * every slot the way the test sets it and counts what the core asked of it.
 * kt_stub_attach() puts it on an agent the way kvl_backend_create() does
 * (same ctx services), so registration, metadata, remote agents and
 * transfers run their real code against it. Handles it hands out are the
 * addresses they stand for: mem_reg gives (void *)addr, rregion_load the
 * remote region's address, peer_load the stub itself.
 *
 * Remote agents need no second process: kt_md_blob() encodes metadata of a
 * made-up agent whose backends have the stubs' names, and kvl_metadata_load
 * hands it to the stubs.
 */
#ifndef KT_STUB_H
#define KT_STUB_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/kvlane.h>
#include <kvlane/backend.h>

typedef struct kt_stub {
    kvl_backend_ops_t ops;
    kvl_backend_t *bk;            /* set by kt_stub_attach */
    char name[32];
    /* behaviour (KVL_OK: succeed) */
    kvl_status_t reg_status;      /* mem_reg */
    kvl_status_t conn_status;     /* conn_pack */
    kvl_status_t pack_status;     /* region_pack */
    kvl_status_t peer_status;     /* peer_load */
    uint64_t rload_fail_addr;     /* rregion_load refuses the region at this address */
    kvl_status_t post_status;     /* xfer_post */
    int complete;                 /* xfer_post completes at once with done_status */
    kvl_status_t done_status;
    kvl_status_t notif_status;    /* notif_send */
    const char *describe;         /* peer_describe text; NULL: slot absent */
    int cache_tabs;               /* indexed posts set the list caches */
    int prepare_tabs;             /* ptab_prepare sets the list's cache */
    int lend_idx;                 /* idx_alloc lends memory (else NULL: the core's) */
    /* what the core asked */
    unsigned regs, deregs, peers, unpeers, rloads, runloads;
    unsigned posts, cancels, releases, notifs, closes, ptab_releases;
    unsigned deregs_at_close, unpeers_at_close, runloads_at_close; /* counts when closed */
    unsigned ptab_prepares;       /* ptab_prepare calls, with the last one's arguments: */
    size_t prep_n;                /* entries of the list */
    void *prep_mh0;               /* handle of its first region */
    int prep_remote;
    unsigned idx_allocs, idx_frees; /* idx_alloc calls that lent, idx_free calls */
    void *idx_buf;                /* the last memory lent */
    size_t idx_bytes;
    kvl_bk_xfer_t *last;          /* last posted */
    kvl_bk_xfer_t *pending;       /* posted, not completed */
    size_t notif_len;             /* last notification sent */
    unsigned char notif_head[16];
} kt_stub_t;

/* Fill s (zeroed first) and put it on agent a as its next backend. s must
 * outlive a; kvl_agent_destroy closes it like any backend. */
kvl_backend_t *kt_stub_attach(kvl_agent_t *a, kt_stub_t *s, const char *name, uint32_t mem_local,
                              uint32_t mem_remote, uint32_t caps);
/* Complete the pending transfer with status (through ctx->xfer_done). */
void kt_stub_complete(kt_stub_t *s, kvl_status_t status);

/* Metadata of a made-up remote agent: every region carries a key (its
 * address, 8 bytes) for every backend named. kinds NULL: all DRAM.
 * Returns a malloc'ed blob. */
typedef struct kt_rmd {
    const char *name;
    uint64_t incarnation, start_ns, generation;
    const char *backends[4];
    unsigned n_backends;
    const kvl_mem_desc_t *regions;
    const kvl_mem_kind_t *kinds;
    size_t n_regions;
} kt_rmd_t;
void *kt_md_blob(const kt_rmd_t *m, size_t *len_p);
/* kt_md_blob, then kvl_metadata_load on a (must succeed). */
void kt_md_load(kvl_agent_t *a, const kt_rmd_t *m);

#endif
