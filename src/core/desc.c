/* Descriptor lists: plain and strided entries, never expanded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

kvl_status_t kvl_dlist_create(kvl_mem_kind_t kind, size_t capacity_hint, kvl_dlist_t **dl_p)
{
    if (dl_p == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_dlist_create: dl_p is NULL");
    *dl_p = NULL;
    if (kind < KVL_MEM_DRAM || kind > KVL_MEM_FILE)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG,
                                "use KVL_MEM_DRAM, KVL_MEM_VRAM or KVL_MEM_FILE",
                                "kvl_dlist_create: memory kind %d is not a concrete kind",
                                (int)kind);
    kvl_dlist_t *dl = calloc(1, sizeof(*dl));
    if (dl == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL, "kvl_dlist_create: out of memory");
    dl->kind = kind;
    if (capacity_hint > SIZE_MAX / sizeof(*dl->ents)) {
        free(dl);
        return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL,
                                "kvl_dlist_create: cannot allocate %zu entries", capacity_hint);
    }
    if (capacity_hint > 0) {
        /* Big lists come from the buffer cache: a list made per request
         * reuses the pages of the last one instead of faulting in new ones. */
        dl->ents = kvli_buf_alloc(capacity_hint * sizeof(*dl->ents));
        if (dl->ents == NULL) {
            free(dl);
            return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL,
                                    "kvl_dlist_create: cannot allocate %zu entries", capacity_hint);
        }
        dl->cap = capacity_hint;
    }
    *dl_p = dl;
    return KVL_OK;
}

void kvl_dlist_destroy(kvl_dlist_t *dl)
{
    if (dl == NULL)
        return;
    kvli_buf_free(dl->ents, dl->cap * sizeof(*dl->ents));
    free(dl);
}

static kvl_status_t kvli_dlist_reserve(kvl_dlist_t *dl, size_t more)
{
    /* Room to double up to the byte size a size_t holds. */
    if (more > SIZE_MAX / (2 * sizeof(*dl->ents)) - dl->n)
        return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL,
                                "descriptor list of %zu entries: cannot grow by %zu entries",
                                dl->n, more);
    if (dl->n + more <= dl->cap)
        return KVL_OK;
    size_t cap = dl->cap ? dl->cap : 16;
    while (cap < dl->n + more)
        cap *= 2;
    kvli_dent_t *e = kvli_buf_alloc(cap * sizeof(*e));
    if (e == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_NO_MEMORY, NULL,
                                "descriptor list: cannot grow to %zu entries", cap);
    if (dl->n)
        memcpy(e, dl->ents, dl->n * sizeof(*e));
    kvli_buf_free(dl->ents, dl->cap * sizeof(*e));
    dl->ents = e;
    dl->cap = cap;
    return KVL_OK;
}

/* Check one entry's shape; the range check against memory comes at prepare. */
static kvl_status_t kvli_dent_check(uint64_t addr, uint64_t stride, uint64_t count, uint64_t len)
{
    if (len == 0)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, "every entry needs len > 0",
                                "descriptor 0x%llx: zero length", (unsigned long long)addr);
    if (count == 0)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, "a strided entry needs count >= 1",
                                "strided descriptor at 0x%llx: count 0", (unsigned long long)addr);
    /* end = addr + stride*(count-1) + len must not wrap */
    uint64_t span;
    if (count > 1 && stride > (UINT64_MAX - len) / (count - 1))
        goto overflow;
    span = stride * (count - 1) + len;
    if (kvli_add_overflows(addr, span))
        goto overflow;
    return KVL_OK;
overflow:
    return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG,
                            "check the address, stride and count arithmetic",
                            "descriptor at 0x%llx (stride %llu, count %llu, len %llu) "
                            "runs past the end of the address space",
                            (unsigned long long)addr, (unsigned long long)stride,
                            (unsigned long long)count, (unsigned long long)len);
}

kvl_status_t kvl_dlist_add(kvl_dlist_t *dl, uint64_t addr, uint64_t len, int32_t dev)
{
    return kvl_dlist_add_strided(dl, addr, 0, 1, len, dev);
}

kvl_status_t kvl_dlist_add_strided(kvl_dlist_t *dl, uint64_t base, uint64_t stride,
                                   uint64_t count, uint64_t len, int32_t dev)
{
    kvl_status_t st;
    if (dl == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_dlist_add/add_strided: list is NULL");
    if (count == 1)
        stride = 0;
    st = kvli_dent_check(base, stride, count, len);
    if (st != KVL_OK)
        return st;
    if (count > 1 && stride < len)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG,
                                "blocks of one strided entry must not overlap: stride >= len",
                                "strided descriptor at 0x%llx: stride %llu < len %llu",
                                (unsigned long long)base, (unsigned long long)stride,
                                (unsigned long long)len);
    if (dl->kind == KVL_MEM_FILE) {
        /* (offset, len, fd): the range's key inside the core (internal.h) */
        kvl_error_t err;
        if (kvli_file_range_check("descriptor", base, stride * (count - 1) + len, dev, &err) !=
            KVL_OK)
            return kvli_fail(NULL, &err);
        base = kvli_file_key(dev, base);
    }
    if (kvli_dlist_reserve(dl, 1) != KVL_OK)
        return KVL_ERR_NO_MEMORY;
    dl->ents[dl->n++] = (kvli_dent_t){base, stride, count, len, dev};
    dl->blocks += count;
    dl->bytes += count * len;
    return KVL_OK;
}

kvl_status_t kvl_dlist_add_array(kvl_dlist_t *dl, const uint64_t *addrs, const uint64_t *lens,
                                 uint64_t len, int32_t dev, size_t n)
{
    if (dl == NULL || (addrs == NULL && n > 0))
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_dlist_add_array: list or addrs is NULL");
    if (kvli_dlist_reserve(dl, n) != KVL_OK)
        return KVL_ERR_NO_MEMORY;
    size_t base = dl->n;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t l = lens ? lens[i] : len;
        if (l == 0 || kvli_add_overflows(addrs[i], l)) {
            dl->n = base;
            return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG,
                                    "every entry needs 0 < len and addr + len within 2^64",
                                    "kvl_dlist_add_array: entry %zu (addr 0x%llx, len %llu) is "
                                    "empty or overflows; nothing was added",
                                    i, (unsigned long long)addrs[i], (unsigned long long)l);
        }
        uint64_t at = addrs[i];
        if (dl->kind == KVL_MEM_FILE) {
            kvl_error_t err;
            char what[64];
            snprintf(what, sizeof(what), "kvl_dlist_add_array: entry %zu", i);
            if (kvli_file_range_check(what, at, l, dev, &err) != KVL_OK) {
                dl->n = base;
                return kvli_fail(NULL, &err);
            }
            at = kvli_file_key(dev, at);
        }
        dl->ents[base + i] = (kvli_dent_t){at, 0, 1, l, dev};
        bytes += l;
    }
    dl->n = base + n;
    dl->blocks += n;
    dl->bytes += bytes;
    return KVL_OK;
}

void kvl_dlist_clear(kvl_dlist_t *dl)
{
    if (dl == NULL)
        return;
    dl->n = 0;
    dl->blocks = 0;
    dl->bytes = 0;
}

kvl_status_t kvl_dlist_truncate(kvl_dlist_t *dl, size_t n)
{
    if (dl == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_dlist_truncate: list is NULL");
    if (n > dl->n)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG,
                                "pass a count the list has reached (kvl_dlist_entries)",
                                "kvl_dlist_truncate: cannot keep %zu entries of a list of %zu",
                                n, dl->n);
    /* O(entries dropped): the blocks and bytes of the kept entries stay */
    for (size_t i = n; i < dl->n; i++) {
        dl->blocks -= dl->ents[i].count;
        dl->bytes -= dl->ents[i].count * dl->ents[i].len;
    }
    dl->n = n;
    return KVL_OK;
}

kvl_mem_kind_t kvl_dlist_kind(const kvl_dlist_t *dl)
{
    return dl ? dl->kind : KVL_MEM_AUTO;
}

size_t kvl_dlist_entries(const kvl_dlist_t *dl)
{
    return dl ? dl->n : 0;
}

uint64_t kvl_dlist_blocks(const kvl_dlist_t *dl)
{
    return dl ? dl->blocks : 0;
}

uint64_t kvl_dlist_bytes(const kvl_dlist_t *dl)
{
    return dl ? dl->bytes : 0;
}

kvl_status_t kvl_dlist_get(const kvl_dlist_t *dl, size_t i, uint64_t *addr_p, uint64_t *stride_p,
                           uint64_t *count_p, uint64_t *len_p, int32_t *dev_p)
{
    if (dl == NULL)
        return kvli_fail_simple(NULL, KVL_ERR_INVALID_ARG, NULL, "kvl_dlist_get: list is NULL");
    if (i >= dl->n)
        return kvli_fail_simple(NULL, KVL_ERR_NOT_FOUND, NULL,
                                "kvl_dlist_get: index %zu is past the list's %zu entries", i,
                                dl->n);
    const kvli_dent_t *e = &dl->ents[i];
    if (addr_p) *addr_p = dl->kind == KVL_MEM_FILE ? kvli_file_off(e->addr) : e->addr;
    if (stride_p) *stride_p = e->stride;
    if (count_p) *count_p = e->count;
    if (len_p) *len_p = e->len;
    if (dev_p) *dev_p = e->dev;
    return KVL_OK;
}
