/* Descriptor lists (src/core/desc.c): shapes accepted and refused with the
 * exact reason, address-space boundaries, growth, all-or-nothing arrays,
 * truncation (how callers undo several adds). */
#include <string.h>
#include "common/kvltest.h"
#include "core/internal.h"

/* The last error's text contains this printf-formatted string. */
#define HAS(...)                                    \
    do {                                            \
        char want_[256];                            \
        snprintf(want_, sizeof(want_), __VA_ARGS__); \
        KT_ERROR_HAS(want_);                        \
    } while (0)
#define ULL(x) ((unsigned long long)(x))

static void test_create(void)
{
    kvl_dlist_t *dl = (kvl_dlist_t *)&dl;
    KT_STATUS(kvl_dlist_create(KVL_MEM_AUTO, 0, &dl), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_create: memory kind 0 is not a concrete kind");
    KT_ERROR_HAS("fix: use KVL_MEM_DRAM, KVL_MEM_VRAM or KVL_MEM_FILE");
    KT_CHECK(dl == NULL);
    KT_STATUS(kvl_dlist_create((kvl_mem_kind_t)4, 0, &dl), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("memory kind 4 is not a concrete kind");
    KT_STATUS(kvl_dlist_create((kvl_mem_kind_t)-1, 0, &dl), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_dlist_create(KVL_MEM_DRAM, 0, NULL), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_create: dl_p is NULL");

    static const kvl_mem_kind_t kinds[] = {KVL_MEM_DRAM, KVL_MEM_VRAM, KVL_MEM_FILE};
    for (size_t i = 0; i < 3; i++) {
        KT_OK(kvl_dlist_create(kinds[i], 3, &dl));
        KT_CHECK(kvl_dlist_kind(dl) == kinds[i]);
        KT_CHECK(dl->cap == 3 && kvl_dlist_entries(dl) == 0);
        KT_CHECK(kvl_dlist_blocks(dl) == 0 && kvl_dlist_bytes(dl) == 0);
        kvl_dlist_destroy(dl);
    }
    /* NULL is an empty list to every reader */
    KT_CHECK(kvl_dlist_kind(NULL) == KVL_MEM_AUTO && kvl_dlist_entries(NULL) == 0);
    KT_CHECK(kvl_dlist_blocks(NULL) == 0 && kvl_dlist_bytes(NULL) == 0);
    kvl_dlist_destroy(NULL);
    kvl_dlist_clear(NULL);
}

static void test_shapes(void)
{
    kvl_dlist_t *dl;
    uint64_t a, s, c, l;
    int32_t d;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &dl));

    KT_OK(kvl_dlist_add(dl, 0x1000, 64, 0));
    KT_OK(kvl_dlist_add_strided(dl, 0x10000, 4096, 1000000, 512, KVL_DEV_ANY));
    /* count 1: the stride means nothing and reads back as 0 (no overlap check) */
    KT_OK(kvl_dlist_add_strided(dl, 0x2000, 3, 1, 64, 5));
    /* stride == len: contiguous blocks are fine */
    KT_OK(kvl_dlist_add_strided(dl, 0x3000, 64, 4, 64, 0));
    KT_CHECK(kvl_dlist_entries(dl) == 4);
    KT_CHECK(kvl_dlist_blocks(dl) == 1 + 1000000 + 1 + 4);
    KT_CHECK(kvl_dlist_bytes(dl) == 64 + 512ull * 1000000 + 64 + 256);

    KT_OK(kvl_dlist_get(dl, 1, &a, &s, &c, &l, &d));
    KT_CHECK(a == 0x10000 && s == 4096 && c == 1000000 && l == 512 && d == KVL_DEV_ANY);
    KT_OK(kvl_dlist_get(dl, 2, &a, &s, &c, &l, &d));
    KT_CHECK(a == 0x2000 && s == 0 && c == 1 && l == 64 && d == 5);
    KT_OK(kvl_dlist_get(dl, 0, &a, &s, &c, &l, &d));
    KT_CHECK(a == 0x1000 && s == 0 && c == 1 && l == 64 && d == 0);
    KT_OK(kvl_dlist_get(dl, 3, NULL, NULL, &c, NULL, NULL)); /* outputs are optional */
    KT_CHECK(c == 4);
    KT_STATUS(kvl_dlist_get(dl, 4, &a, &s, &c, &l, &d), KVL_ERR_NOT_FOUND);
    KT_ERROR_HAS("kvl_dlist_get: index 4 is past the list's 4 entries");
    KT_STATUS(kvl_dlist_get(NULL, 0, &a, &s, &c, &l, &d), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_get: list is NULL");

    /* refusals, each with its reason; none adds anything */
    KT_STATUS(kvl_dlist_add(dl, 0x1000, 0, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("descriptor 0x1000: zero length");
    KT_ERROR_HAS("fix: every entry needs len > 0");
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, 64, 0, 64, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("strided descriptor at 0x1000: count 0");
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, 32, 4, 64, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("strided descriptor at 0x1000: stride 32 < len 64");
    KT_ERROR_HAS("blocks of one strided entry must not overlap: stride >= len");
    KT_STATUS(kvl_dlist_add(NULL, 1, 1, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_add/add_strided: list is NULL");
    KT_CHECK(kvl_dlist_entries(dl) == 4 && kvl_dlist_blocks(dl) == 1000006);

    kvl_dlist_clear(dl);
    KT_CHECK(kvl_dlist_entries(dl) == 0 && kvl_dlist_blocks(dl) == 0 && kvl_dlist_bytes(dl) == 0);
    KT_STATUS(kvl_dlist_get(dl, 0, &a, &s, &c, &l, &d), KVL_ERR_NOT_FOUND);
    /* a cleared list takes entries again */
    KT_OK(kvl_dlist_add(dl, 0x4000, 8, 0));
    KT_OK(kvl_dlist_get(dl, 0, &a, NULL, NULL, &l, NULL));
    KT_CHECK(a == 0x4000 && l == 8 && kvl_dlist_bytes(dl) == 8);
    kvl_dlist_destroy(dl);
}

/* The last byte of an entry may be the last byte of the address space; an
 * entry whose end (exclusive) would be 2^64 is refused. */
static void test_address_space_end(void)
{
    kvl_dlist_t *dl;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &dl));
    KT_OK(kvl_dlist_add(dl, UINT64_MAX - 64, 64, 0));
    KT_STATUS(kvl_dlist_add(dl, UINT64_MAX - 63, 64, 0), KVL_ERR_INVALID_ARG);
    HAS("descriptor at 0x%llx (stride 0, count 1, len 64) runs past the end of the address space",
        ULL(UINT64_MAX - 63));
    KT_ERROR_HAS("fix: check the address, stride and count arithmetic");
    KT_STATUS(kvl_dlist_add(dl, UINT64_MAX, 1, 0), KVL_ERR_INVALID_ARG);

    /* strided: span = stride * (count - 1) + len, exactly up to the end */
    KT_OK(kvl_dlist_add_strided(dl, 0, UINT64_MAX - 1, 2, 1, 0));
    KT_STATUS(kvl_dlist_add_strided(dl, 1, UINT64_MAX - 1, 2, 1, 0), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_dlist_add_strided(dl, 0, UINT64_MAX, 2, 1, 0), KVL_ERR_INVALID_ARG);
    HAS("descriptor at 0x0 (stride %llu, count 2, len 1) runs past", ULL(UINT64_MAX));
    /* stride * (count - 1) itself wraps */
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, 1ull << 33, 1ull << 32, 64, 0),
              KVL_ERR_INVALID_ARG);
    HAS("descriptor at 0x1000 (stride %llu, count %llu, len 64) runs past", ULL(1) << 33,
        ULL(1) << 32);
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, UINT64_MAX / 2, 4, 64, 0), KVL_ERR_INVALID_ARG);
    KT_CHECK(kvl_dlist_entries(dl) == 2);
    kvl_dlist_destroy(dl);
}

static void test_growth(void)
{
    kvl_dlist_t *dl;
    const size_t n = 5000; /* past the hint, and past the 128 KiB buffer-cache threshold */
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 4, &dl));
    for (size_t i = 0; i < n; i++)
        KT_OK(i % 2 ? kvl_dlist_add(dl, 0x100000 + i * 64, 64, (int32_t)(i % 3))
                    : kvl_dlist_add_strided(dl, 0x100000 + i * 64, 8, 2, 8, (int32_t)(i % 3)));
    KT_CHECK(kvl_dlist_entries(dl) == n && dl->cap >= n);
    KT_CHECK(kvl_dlist_blocks(dl) == n / 2 + 2 * (n / 2));
    KT_CHECK(kvl_dlist_bytes(dl) == 64 * (n / 2) + 16 * (n / 2));
    for (size_t i = 0; i < n; i++) {
        uint64_t a, s, c, l;
        int32_t d;
        KT_OK(kvl_dlist_get(dl, i, &a, &s, &c, &l, &d));
        KT_CHECK(a == 0x100000 + i * 64 && d == (int32_t)(i % 3));
        KT_CHECK(i % 2 ? (s == 0 && c == 1 && l == 64) : (s == 8 && c == 2 && l == 8));
    }
    kvl_dlist_destroy(dl);
}

static void test_array(void)
{
    kvl_dlist_t *dl;
    uint64_t a, l;
    int32_t d;
    KT_OK(kvl_dlist_create(KVL_MEM_VRAM, 0, &dl));
    KT_OK(kvl_dlist_add(dl, 0x10, 16, 0));

    uint64_t addrs[3] = {0x100, 0x200, 0x300}, lens[3] = {16, 0, 16};
    KT_STATUS(kvl_dlist_add_array(dl, addrs, lens, 0, 0, 3), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_add_array: entry 1 (addr 0x200, len 0) is empty or overflows; "
                 "nothing was added");
    KT_ERROR_HAS("fix: every entry needs 0 < len and addr + len within 2^64");
    KT_CHECK(kvl_dlist_entries(dl) == 1 && kvl_dlist_blocks(dl) == 1 && kvl_dlist_bytes(dl) == 16);
    /* the last entry wrapping undoes the two before it */
    uint64_t wrap[3] = {0x100, 0x200, UINT64_MAX - 8};
    KT_STATUS(kvl_dlist_add_array(dl, wrap, NULL, 16, 0, 3), KVL_ERR_INVALID_ARG);
    HAS("entry 2 (addr 0x%llx, len 16) is empty or overflows", ULL(UINT64_MAX - 8));
    KT_CHECK(kvl_dlist_entries(dl) == 1 && kvl_dlist_bytes(dl) == 16);
    /* lens NULL: one length for all */
    KT_STATUS(kvl_dlist_add_array(dl, addrs, NULL, 0, 0, 3), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("entry 0 (addr 0x100, len 0)");

    lens[1] = 32;
    KT_OK(kvl_dlist_add_array(dl, addrs, lens, 0, 7, 3));
    KT_CHECK(kvl_dlist_entries(dl) == 4 && kvl_dlist_blocks(dl) == 4);
    KT_CHECK(kvl_dlist_bytes(dl) == 16 + 16 + 32 + 16);
    KT_OK(kvl_dlist_get(dl, 2, &a, NULL, NULL, &l, &d));
    KT_CHECK(a == 0x200 && l == 32 && d == 7);
    KT_OK(kvl_dlist_add_array(dl, addrs, NULL, 8, KVL_DEV_ANY, 3));
    KT_CHECK(kvl_dlist_entries(dl) == 7 && kvl_dlist_bytes(dl) == 80 + 24);
    KT_OK(kvl_dlist_get(dl, 6, &a, NULL, NULL, &l, &d));
    KT_CHECK(a == 0x300 && l == 8 && d == KVL_DEV_ANY);

    /* nothing to add is fine, even without an array */
    KT_OK(kvl_dlist_add_array(dl, NULL, NULL, 8, 0, 0));
    KT_CHECK(kvl_dlist_entries(dl) == 7);
    KT_STATUS(kvl_dlist_add_array(dl, NULL, NULL, 8, 0, 1), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_add_array: list or addrs is NULL");
    KT_STATUS(kvl_dlist_add_array(NULL, addrs, NULL, 8, 0, 1), KVL_ERR_INVALID_ARG);
    kvl_dlist_destroy(dl);
}

/* kvl_dlist_truncate keeps the first n entries, their blocks and bytes, and
 * refuses to grow a list; a caller adding in several calls undoes them all. */
static void test_truncate(void)
{
    kvl_dlist_t *dl;
    uint64_t a, l;
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &dl));
    KT_OK(kvl_dlist_add(dl, 0x1000, 64, 0));
    KT_OK(kvl_dlist_add_strided(dl, 0x10000, 4096, 8, 512, 1));
    size_t n0 = kvl_dlist_entries(dl);
    uint64_t blocks0 = kvl_dlist_blocks(dl), bytes0 = kvl_dlist_bytes(dl);
    uint64_t addrs[3] = {0x100, 0x200, 0x300};
    KT_OK(kvl_dlist_add_array(dl, addrs, NULL, 16, 2, 3));
    KT_OK(kvl_dlist_add_strided(dl, 0x90000, 256, 4, 128, 2));
    KT_CHECK(kvl_dlist_entries(dl) == 6 && kvl_dlist_blocks(dl) == blocks0 + 3 + 4);
    /* more than the list has: refused, nothing changes */
    KT_STATUS(kvl_dlist_truncate(dl, 7), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_truncate: cannot keep 7 entries of a list of 6");
    KT_ERROR_HAS("fix: pass a count the list has reached (kvl_dlist_entries)");
    KT_CHECK(kvl_dlist_entries(dl) == 6);
    KT_OK(kvl_dlist_truncate(dl, 6)); /* all of them: nothing changes */
    KT_CHECK(kvl_dlist_entries(dl) == 6 && kvl_dlist_bytes(dl) == bytes0 + 48 + 512);
    KT_OK(kvl_dlist_truncate(dl, n0));
    KT_CHECK(kvl_dlist_entries(dl) == n0 && kvl_dlist_blocks(dl) == blocks0 &&
             kvl_dlist_bytes(dl) == bytes0);
    KT_OK(kvl_dlist_get(dl, 1, &a, NULL, NULL, &l, NULL));
    KT_CHECK(a == 0x10000 && l == 512);
    KT_STATUS(kvl_dlist_get(dl, 2, &a, NULL, NULL, &l, NULL), KVL_ERR_NOT_FOUND);
    /* the list grows again from there */
    KT_OK(kvl_dlist_add(dl, 0x5000, 32, 0));
    KT_OK(kvl_dlist_get(dl, 2, &a, NULL, NULL, &l, NULL));
    KT_CHECK(a == 0x5000 && l == 32 && kvl_dlist_bytes(dl) == bytes0 + 32);
    KT_OK(kvl_dlist_truncate(dl, 0));
    KT_CHECK(kvl_dlist_entries(dl) == 0 && kvl_dlist_blocks(dl) == 0 && kvl_dlist_bytes(dl) == 0);
    KT_STATUS(kvl_dlist_truncate(dl, 1), KVL_ERR_INVALID_ARG);
    kvl_dlist_destroy(dl);
    KT_STATUS(kvl_dlist_truncate(NULL, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("kvl_dlist_truncate: list is NULL");

    /* FILE lists: offsets read back, not the core's keys */
    KT_OK(kvl_dlist_create(KVL_MEM_FILE, 0, &dl));
    KT_OK(kvl_dlist_add(dl, 4096, 4096, 3));
    KT_OK(kvl_dlist_add(dl, 8192, 4096, 5));
    KT_OK(kvl_dlist_truncate(dl, 1));
    KT_OK(kvl_dlist_get(dl, 0, &a, NULL, NULL, &l, NULL));
    KT_CHECK(a == 4096 && l == 4096 && kvl_dlist_bytes(dl) == 4096);
    kvl_dlist_destroy(dl);
}

/* Sizes that wrap when multiplied by the entry size are refused, never
 * turned into a small buffer that the entries then overrun. */
static void test_size_overflow(void)
{
    kvl_dlist_t *dl = (kvl_dlist_t *)&dl;
    KT_STATUS(kvl_dlist_create(KVL_MEM_DRAM, (size_t)1 << 61, &dl), KVL_ERR_NO_MEMORY);
    HAS("kvl_dlist_create: cannot allocate %zu entries", (size_t)1 << 61);
    KT_CHECK(dl == NULL);
    KT_STATUS(kvl_dlist_create(KVL_MEM_DRAM, SIZE_MAX, &dl), KVL_ERR_NO_MEMORY);

    uint64_t addrs[4] = {0x100, 0x200, 0x300, 0x400};
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &dl));
    KT_OK(kvl_dlist_add(dl, 0x1000, 8, 0));
    /* n * entry size wraps to almost nothing */
    KT_STATUS(kvl_dlist_add_array(dl, addrs, NULL, 8, 0, SIZE_MAX / 8), KVL_ERR_NO_MEMORY);
    HAS("descriptor list of 1 entries: cannot grow by %zu entries", SIZE_MAX / 8);
    /* entries + n itself wraps */
    KT_STATUS(kvl_dlist_add_array(dl, addrs, NULL, 8, 0, SIZE_MAX), KVL_ERR_NO_MEMORY);
    KT_CHECK(kvl_dlist_entries(dl) == 1 && kvl_dlist_bytes(dl) == 8);
    KT_OK(kvl_dlist_add_array(dl, addrs, NULL, 8, 0, 4));
    KT_CHECK(kvl_dlist_entries(dl) == 5);
    kvl_dlist_destroy(dl);
}

int main(void)
{
    test_create();
    test_shapes();
    test_address_space_end();
    test_growth();
    test_array();
    test_truncate();
    test_size_overflow();
    printf("test_desc: passed\n");
    return 0;
}
