/* Status codes (src/core/status.c): the name and text tables cover every
 * code, groups follow the hundreds digit, unknown codes stay printable. */
#include <limits.h>
#include <string.h>
#include "common/kvltest.h"

#define CODE(c) {c, #c}
static const struct {
    kvl_status_t code;
    const char *name;
} codes[] = {
    CODE(KVL_OK),
    CODE(KVL_IN_PROGRESS),
    CODE(KVL_ERR_INVALID_ARG),
    CODE(KVL_ERR_NOT_FOUND),
    CODE(KVL_ERR_IN_USE),
    CODE(KVL_ERR_EXISTS),
    CODE(KVL_ERR_OUT_OF_BOUNDS),
    CODE(KVL_ERR_DEVICE_MISMATCH),
    CODE(KVL_ERR_STATE),
    CODE(KVL_ERR_CANCELED),
    CODE(KVL_ERR_SYSTEM),
    CODE(KVL_ERR_NO_MEMORY),
    CODE(KVL_ERR_PERMISSION),
    CODE(KVL_ERR_TIMEOUT),
    CODE(KVL_ERR_NO_DEVICE),
    CODE(KVL_ERR_REMOTE),
    CODE(KVL_ERR_REMOTE_DISCONNECT),
    CODE(KVL_ERR_REMOTE_REFUSED),
    CODE(KVL_ERR_STALE),
    CODE(KVL_ERR_BAD_METADATA),
    CODE(KVL_ERR_REMOTE_FULL),
    CODE(KVL_ERR_UNSUPPORTED),
    CODE(KVL_ERR_NO_BACKEND),
    CODE(KVL_ERR_INTERNAL),
};
#define NCODES (sizeof(codes) / sizeof(codes[0]))

static void test_tables_complete(void)
{
    for (size_t i = 0; i < NCODES; i++) {
        const char *name = kvl_status_name(codes[i].code);
        const char *text = kvl_status_str(codes[i].code);
        if (strcmp(name, codes[i].name) != 0) {
            fprintf(stderr, "%s is named %s\n", codes[i].name, name);
            KT_CHECK(0);
        }
        KT_CHECK(strcmp(text, "unknown status") != 0 && text[0] != '\0');
        /* every text says something of its own */
        for (size_t j = 0; j < i; j++)
            KT_CHECK(strcmp(text, kvl_status_str(codes[j].code)) != 0);
    }
    KT_CHECK(strcmp(kvl_status_str(KVL_ERR_OUT_OF_BOUNDS), "outside registered memory") == 0);
    KT_CHECK(strcmp(kvl_status_str(KVL_ERR_INTERNAL), "internal error (a kvlane bug)") == 0);
}

static void test_groups(void)
{
    for (size_t i = 0; i < NCODES; i++) {
        kvl_status_t c = codes[i].code;
        kvl_status_group_t want = c >= 0 ? KVL_GROUP_OK : (kvl_status_group_t)(-c / 100);
        KT_CHECK(kvl_status_group(c) == want);
    }
    KT_CHECK(kvl_status_group(KVL_ERR_CANCELED) == KVL_GROUP_USAGE);
    KT_CHECK(kvl_status_group(KVL_ERR_NO_DEVICE) == KVL_GROUP_SYSTEM);
    KT_CHECK(kvl_status_group(KVL_ERR_BAD_METADATA) == KVL_GROUP_REMOTE);
    KT_CHECK(kvl_status_group(KVL_ERR_NO_BACKEND) == KVL_GROUP_UNSUPPORTED);
    /* the edges of each hundred */
    KT_CHECK(kvl_status_group(-100) == KVL_GROUP_USAGE);
    KT_CHECK(kvl_status_group(-199) == KVL_GROUP_USAGE);
    KT_CHECK(kvl_status_group(-200) == KVL_GROUP_SYSTEM);
    KT_CHECK(kvl_status_group(-599) == KVL_GROUP_INTERNAL);
    /* positive codes are not errors; codes outside every group are a bug */
    KT_CHECK(kvl_status_group(7) == KVL_GROUP_OK);
    KT_CHECK(kvl_status_group(INT_MAX) == KVL_GROUP_OK);
    KT_CHECK(kvl_status_group(-1) == KVL_GROUP_INTERNAL);
    KT_CHECK(kvl_status_group(-99) == KVL_GROUP_INTERNAL);
    KT_CHECK(kvl_status_group(-600) == KVL_GROUP_INTERNAL);
    KT_CHECK(kvl_status_group(-100000) == KVL_GROUP_INTERNAL);
    KT_CHECK(kvl_status_group(INT_MIN) == KVL_GROUP_INTERNAL);
}

static void test_unknown(void)
{
    static const kvl_status_t odd[] = {2, -1, -108, -205, -306, -401 - 1, -501, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        KT_CHECK(strcmp(kvl_status_name(odd[i]), "KVL_ERR_UNKNOWN") == 0);
        KT_CHECK(strcmp(kvl_status_str(odd[i]), "unknown status") == 0);
    }
}

static void test_version(void)
{
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", KVL_VERSION_MAJOR, KVL_VERSION_MINOR,
             KVL_VERSION_PATCH);
    KT_CHECK(strcmp(kvl_version(), want) == 0);
}

int main(void)
{
    test_tables_complete();
    test_groups();
    test_unknown();
    test_version();
    printf("test_status: %zu codes named, described and grouped\n", NCODES);
    return 0;
}
