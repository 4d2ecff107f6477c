/* kvlane: descriptor lists, what a transfer moves. */
#ifndef KVLANE_DESC_H
#define KVLANE_DESC_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/memory.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A list of entries. A plain entry is (addr, len, dev). A strided entry is
 * (base, stride, count, len, dev): count blocks of len bytes at base,
 * base+stride, ... It is never expanded into per-block entries.
 * All entries of a list have the list's memory kind.
 */
typedef struct kvl_dlist kvl_dlist_t;

kvl_status_t kvl_dlist_create(kvl_mem_kind_t kind, size_t capacity_hint,
                              kvl_dlist_t **dl_p);
void kvl_dlist_destroy(kvl_dlist_t *dl);

kvl_status_t kvl_dlist_add(kvl_dlist_t *dl, uint64_t addr, uint64_t len, int32_t dev);
kvl_status_t kvl_dlist_add_strided(kvl_dlist_t *dl, uint64_t base, uint64_t stride,
                                   uint64_t count, uint64_t len, int32_t dev);
/* Append n plain entries at once; lens NULL means every entry has len. */
kvl_status_t kvl_dlist_add_array(kvl_dlist_t *dl, const uint64_t *addrs,
                                 const uint64_t *lens, uint64_t len, int32_t dev,
                                 size_t n);
void kvl_dlist_clear(kvl_dlist_t *dl);
/*
 * Keep the first n entries and drop the rest (blocks and bytes follow; the
 * memory is kept). With n = kvl_dlist_entries() read before a series of adds,
 * it undoes them all: how a caller adding in several calls leaves the list as
 * it was when one is refused. n above kvl_dlist_entries() is refused
 * (KVL_ERR_INVALID_ARG) and changes nothing.
 */
kvl_status_t kvl_dlist_truncate(kvl_dlist_t *dl, size_t n);

kvl_mem_kind_t kvl_dlist_kind(const kvl_dlist_t *dl);
size_t kvl_dlist_entries(const kvl_dlist_t *dl);   /* entries as added */
uint64_t kvl_dlist_blocks(const kvl_dlist_t *dl);  /* blocks, strided counted */
uint64_t kvl_dlist_bytes(const kvl_dlist_t *dl);

/* Read entry i back (count 1 and stride 0 for a plain entry). */
kvl_status_t kvl_dlist_get(const kvl_dlist_t *dl, size_t i, uint64_t *addr_p,
                           uint64_t *stride_p, uint64_t *count_p, uint64_t *len_p,
                           int32_t *dev_p);

#ifdef __cplusplus
}
#endif
#endif
