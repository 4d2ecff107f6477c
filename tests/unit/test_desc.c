/* Descriptor lists and status/error rendering. */
#include <string.h>
#include "common/kvltest.h"

int main(void)
{
    kvl_dlist_t *dl;
    uint64_t a, s, c, l;
    int32_t d;

    KT_STATUS(kvl_dlist_create(KVL_MEM_AUTO, 0, &dl), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("not a concrete kind");
    KT_OK(kvl_dlist_create(KVL_MEM_DRAM, 0, &dl));
    KT_OK(kvl_dlist_add(dl, 0x1000, 64, 0));
    KT_OK(kvl_dlist_add_strided(dl, 0x10000, 4096, 1000000, 512, KVL_DEV_ANY));
    KT_CHECK(kvl_dlist_entries(dl) == 2);
    KT_CHECK(kvl_dlist_blocks(dl) == 1000001);
    KT_CHECK(kvl_dlist_bytes(dl) == 64 + 512ull * 1000000);
    KT_OK(kvl_dlist_get(dl, 1, &a, &s, &c, &l, &d));
    KT_CHECK(a == 0x10000 && s == 4096 && c == 1000000 && l == 512 && d == -1);
    KT_STATUS(kvl_dlist_get(dl, 2, &a, &s, &c, &l, &d), KVL_ERR_NOT_FOUND);

    /* bad shapes */
    KT_STATUS(kvl_dlist_add(dl, 0x1000, 0, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("zero length");
    KT_STATUS(kvl_dlist_add(dl, UINT64_MAX - 10, 64, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("end of the address space");
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, UINT64_MAX / 2, 4, 64, 0), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, 32, 4, 64, 0), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("must not overlap");
    KT_STATUS(kvl_dlist_add_strided(dl, 0x1000, 64, 0, 64, 0), KVL_ERR_INVALID_ARG);
    KT_STATUS(kvl_dlist_add(NULL, 1, 1, 0), KVL_ERR_INVALID_ARG);
    KT_CHECK(kvl_dlist_entries(dl) == 2); /* nothing added by the failures */

    uint64_t addrs[3] = {0x100, 0x200, 0x300}, lens[3] = {16, 0, 16};
    KT_STATUS(kvl_dlist_add_array(dl, addrs, lens, 0, 0, 3), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("entry 1");
    KT_CHECK(kvl_dlist_entries(dl) == 2);
    KT_OK(kvl_dlist_add_array(dl, addrs, NULL, 16, 0, 3));
    KT_CHECK(kvl_dlist_entries(dl) == 5 && kvl_dlist_bytes(dl) == 64 + 512ull * 1000000 + 48);
    kvl_dlist_clear(dl);
    KT_CHECK(kvl_dlist_entries(dl) == 0 && kvl_dlist_bytes(dl) == 0);
    kvl_dlist_destroy(dl);

    /* status groups and names */
    KT_CHECK(kvl_status_group(KVL_OK) == KVL_GROUP_OK);
    KT_CHECK(kvl_status_group(KVL_ERR_OUT_OF_BOUNDS) == KVL_GROUP_USAGE);
    KT_CHECK(kvl_status_group(KVL_ERR_PERMISSION) == KVL_GROUP_SYSTEM);
    KT_CHECK(kvl_status_group(KVL_ERR_REMOTE_DISCONNECT) == KVL_GROUP_REMOTE);
    KT_CHECK(kvl_status_group(KVL_ERR_NO_BACKEND) == KVL_GROUP_UNSUPPORTED);
    KT_CHECK(kvl_status_group(KVL_ERR_INTERNAL) == KVL_GROUP_INTERNAL);
    KT_CHECK(strcmp(kvl_status_name(KVL_ERR_STALE), "KVL_ERR_STALE") == 0);
    KT_CHECK(strcmp(kvl_status_name(-12345), "KVL_ERR_UNKNOWN") == 0);

    /* rendering: bounded buffer, returns needed length */
    KT_STATUS(kvl_dlist_add(NULL, 1, 1, 0), KVL_ERR_INVALID_ARG);
    char small[8];
    size_t need = kvl_error_render(NULL, small, sizeof(small));
    KT_CHECK(need > sizeof(small) && strlen(small) == sizeof(small) - 1);
    kvl_error_clear();
    KT_CHECK(kvl_last_error()->code == KVL_OK);

    kvl_mem_kind_t k;
    KT_OK(kvl_mem_kind_parse("vram", &k));
    KT_CHECK(k == KVL_MEM_VRAM);
    KT_STATUS(kvl_mem_kind_parse("GPU", &k), KVL_ERR_INVALID_ARG);
    printf("dlist and errors: ok\n");
    return 0;
}
