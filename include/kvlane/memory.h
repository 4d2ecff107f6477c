/* kvlane: memory kinds, registration and the registration report. */
#ifndef KVLANE_MEMORY_H
#define KVLANE_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVL_MEM_AUTO = 0,   /* detect from the address */
    KVL_MEM_DRAM = 1,
    KVL_MEM_VRAM = 2,
    KVL_MEM_FILE = 3
} kvl_mem_kind_t;

/* Device id meaning "detect it" (registration) or "any" (descriptors). */
#define KVL_DEV_ANY (-1)

const char *kvl_mem_kind_name(kvl_mem_kind_t kind); /* "DRAM", "VRAM", ... */
/* Parse "DRAM"/"VRAM"/"FILE"/"AUTO" (case-insensitive); KVL_ERR_INVALID_ARG else. */
kvl_status_t kvl_mem_kind_parse(const char *s, kvl_mem_kind_t *kind_p);

/* A range of memory: for DRAM/VRAM addr is a pointer, for FILE an offset. */
typedef struct kvl_mem_desc {
    uint64_t addr;
    uint64_t len;
    int32_t dev;        /* DRAM: NUMA node or KVL_DEV_ANY; VRAM: CUDA ordinal;
                           FILE: the file descriptor (opened by the caller) */
} kvl_mem_desc_t;

/*
 * FILE memory: a range (offset, len) of a file the caller opened, named by
 * its descriptor (dev). kvlane never opens, creates, truncates or closes it;
 * keep it open while registered. Limits: offset + len <= KVL_FILE_OFFSET_MAX
 * (1 TiB) and fd < KVL_FILE_FD_MAX; larger values are refused. Transfers
 * take FILE lists as their remote side with this agent's own name as the
 * remote agent (as NIXL does): files are local to the process.
 */
#define KVL_FILE_OFFSET_MAX (1ull << 40)
#define KVL_FILE_FD_MAX (1 << 23)

typedef enum {
    KVL_REG_ANY = 0,    /* registered if at least one backend accepts */
    KVL_REG_ALL = 1     /* every candidate backend must accept */
} kvl_reg_policy_t;

enum {
    KVL_REG_PARAM_KIND = 1u << 0,
    KVL_REG_PARAM_POLICY = 1u << 1,
    KVL_REG_PARAM_BACKENDS = 1u << 2
};

typedef struct kvl_reg_params {
    uint64_t field_mask;
    kvl_mem_kind_t kind;            /* default KVL_MEM_AUTO */
    kvl_reg_policy_t policy;        /* default KVL_REG_ANY */
    const char *const *backends;    /* names; default: every backend serving the kind */
    size_t n_backends;
} kvl_reg_params_t;

/* ---- registration report ---- */

typedef struct kvl_reg_outcome {
    char backend[64];
    kvl_status_t status;            /* KVL_OK when this backend accepted */
    char detail[2080];              /* path used ("cma", "mmap"), or the reason and its
                                       fix: a whole error's what and hint */
} kvl_reg_outcome_t;

#define KVL_REG_MAX_OUTCOMES 8

typedef struct kvl_reg_entry {
    uint64_t addr, len;
    kvl_mem_kind_t kind;            /* detected or checked kind */
    int32_t dev;                    /* detected or checked device */
    kvl_status_t status;            /* the region's overall result */
    int reused;                     /* 1: same range was registered; refcount++ */
    unsigned n_outcomes;
    kvl_reg_outcome_t outcomes[KVL_REG_MAX_OUTCOMES]; /* [n_outcomes, 8): unspecified */
} kvl_reg_entry_t;

typedef struct kvl_reg_report {
    size_t n_entries;
    kvl_reg_entry_t *entries;
} kvl_reg_report_t;

/*
 * Register n regions as one all-or-nothing operation: a failure at entry k
 * undoes entries 0..k-1 on every backend. Registering a range that is
 * already registered with the same kind increments its reference count.
 * report_p (optional) receives every backend's outcome for every region,
 * also on failure; free it with kvl_reg_report_free().
 */
kvl_status_t kvl_mem_register(kvl_agent_t *agent, const kvl_mem_desc_t *regions,
                              size_t n, const kvl_reg_params_t *params,
                              kvl_reg_report_t **report_p);

/*
 * Drop one reference of each region (exact addr and len of a registration).
 * All regions are checked first: an unknown range or one used by an
 * in-flight transfer fails the whole call and changes nothing.
 */
kvl_status_t kvl_mem_deregister(kvl_agent_t *agent, const kvl_mem_desc_t *regions,
                                size_t n);

/* What kvl_mem_query says of a registered region. */
typedef struct kvl_mem_info {
    uint64_t addr, len;          /* the registered region */
    kvl_mem_kind_t kind;
    int32_t dev;
    uint32_t refcount;           /* registrations of this exact range */
    char backends[128];          /* comma-separated backends it is registered on */
} kvl_mem_info_t;

/*
 * The registered region that contains all of [addr, addr+len): KVL_OK with
 * info_p filled, or KVL_ERR_NOT_FOUND when no single region does (nothing
 * registered there, or the range spans several regions).
 */
kvl_status_t kvl_mem_query(kvl_agent_t *agent, uint64_t addr, uint64_t len,
                           kvl_mem_info_t *info_p);

/* Render the report as a readable table. Returns the length needed. */
size_t kvl_reg_report_render(const kvl_reg_report_t *report, char *buf, size_t len);
void kvl_reg_report_free(kvl_reg_report_t *report);

/*
 * Allocate host memory that peers on this host can map (memfd-backed), so
 * the shm backend moves it with plain copies instead of cross-memory attach.
 * Register it like any memory. Free with kvl_mem_free().
 */
kvl_status_t kvl_mem_alloc(kvl_agent_t *agent, size_t len, void **ptr_p);

enum {
    KVL_ALLOC_PARAM_BACKEND = 1u << 0
};

typedef struct kvl_alloc_params {
    uint64_t field_mask;
    /* Backend that allocates (it must be created on the agent and support
     * allocation), e.g. "ucx": memory UCX allocates itself, which its
     * shared-memory transports reach with a direct copy. Default: as
     * kvl_mem_alloc (memfd). */
    const char *backend;
} kvl_alloc_params_t;

/*
 * kvl_mem_alloc with choices (params may be NULL: same as kvl_mem_alloc).
 * The memory is not registered; register it (or ranges of it) like any
 * memory. Free with kvl_mem_free() once nothing in it is registered;
 * kvl_agent_destroy frees what is left, before the backends close.
 */
kvl_status_t kvl_mem_alloc_ex(kvl_agent_t *agent, size_t len, const kvl_alloc_params_t *params,
                              void **ptr_p);
/* Free memory from kvl_mem_alloc or kvl_mem_alloc_ex. Refused while a
 * registered region lies in it, or for a pointer the agent did not allocate. */
kvl_status_t kvl_mem_free(kvl_agent_t *agent, void *ptr);

#ifdef __cplusplus
}
#endif
#endif
