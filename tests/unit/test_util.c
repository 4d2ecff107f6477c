/* Small utilities (src/core/util.c): CRC32C and SHA-1 vectors, name rules, overflow
 * checks, bounded copies, clocks, randomness and the scratch-buffer cache. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "common/kvltest.h"
#include "core/internal.h"
#include "common/sha1.h"

static void test_crc32c(void)
{
    uint8_t buf[32];
    /* the check value of CRC-32C, and RFC 3720 (iSCSI) appendix B.4 */
    KT_CHECK(kvli_crc32c(0, "123456789", 9) == 0xE3069283u);
    memset(buf, 0, sizeof(buf));
    KT_CHECK(kvli_crc32c(0, buf, sizeof(buf)) == 0x8A9136AAu);
    memset(buf, 0xff, sizeof(buf));
    KT_CHECK(kvli_crc32c(0, buf, sizeof(buf)) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    KT_CHECK(kvli_crc32c(0, buf, sizeof(buf)) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    KT_CHECK(kvli_crc32c(0, buf, sizeof(buf)) == 0x113FDB5Cu);
    /* nothing hashed: the crc passed in */
    KT_CHECK(kvli_crc32c(0, NULL, 0) == 0);
    KT_CHECK(kvli_crc32c(0x12345678u, buf, 0) == 0x12345678u);
    /* in pieces as at once */
    uint32_t c = kvli_crc32c(0, "1234", 4);
    KT_CHECK(kvli_crc32c(c, "56789", 5) == 0xE3069283u);
}

static void sha1_hex(const void *p, size_t n, char hex[2 * KVLI_SHA1_LEN + 1])
{
    uint8_t md[KVLI_SHA1_LEN];
    kvli_sha1(p, n, md);
    for (unsigned i = 0; i < KVLI_SHA1_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

static void test_sha1(void)
{
    char hex[2 * KVLI_SHA1_LEN + 1];
    /* FIPS 180 examples: one block, two blocks (56 bytes: the length goes
     * into a second block), a million 'a' */
    sha1_hex("abc", 3, hex);
    KT_CHECK(strcmp(hex, "a9993e364706816aba3e25717850c26c9cd0d89d") == 0);
    sha1_hex("", 0, hex);
    KT_CHECK(strcmp(hex, "da39a3ee5e6b4b0d3255bfef95601890afd80709") == 0);
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha1_hex(two, strlen(two), hex);
    KT_CHECK(strcmp(hex, "84983e441c3bd26ebaae4aa1f95129e5e54670f1") == 0);
    char *m = malloc(1000000);
    KT_CHECK(m != NULL);
    memset(m, 'a', 1000000);
    sha1_hex(m, 1000000, hex);
    KT_CHECK(strcmp(hex, "34aa973cd4c4daa4f61eeb2bdbad27316534016f") == 0);
    /* 64 bytes exactly: a whole block, then a block of padding alone */
    sha1_hex(m, 64, hex);
    KT_CHECK(strcmp(hex, "0098ba824b5c16427bd7a1122a5a442a25ec644d") == 0);
    free(m);
    /* RFC 6455 section 1.3: the key the WebSocket upgrade checks */
    const char *ws = "dGhlIHNhbXBsZSBub25jZQ==258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    sha1_hex(ws, strlen(ws), hex);
    KT_CHECK(strcmp(hex, "b37a4f2cc0624f1690f64606cf385945b2bec4ea") == 0);
}

static void test_names(void)
{
    char n[80];
    KT_CHECK(kvli_name_valid("a"));
    KT_CHECK(kvli_name_valid("prefill-0.rank_7:tp2"));
    KT_CHECK(kvli_name_valid("~!@#$%^&*()"));
    memset(n, 'n', sizeof(n));
    n[KVL_NAME_MAX - 1] = '\0'; /* 63 characters: the most */
    KT_CHECK(kvli_name_valid(n));
    n[KVL_NAME_MAX - 1] = 'n';
    n[KVL_NAME_MAX] = '\0'; /* 64 */
    KT_CHECK(!kvli_name_valid(n));
    KT_CHECK(!kvli_name_valid(NULL));
    KT_CHECK(!kvli_name_valid(""));
    KT_CHECK(!kvli_name_valid("has space"));
    KT_CHECK(!kvli_name_valid("tab\there"));
    KT_CHECK(!kvli_name_valid("nl\n"));
    KT_CHECK(!kvli_name_valid("del\x7f"));
    KT_CHECK(!kvli_name_valid("caf\xc3\xa9")); /* printable ASCII only */
}

static void test_overflow(void)
{
    KT_CHECK(!kvli_add_overflows(0, 0));
    KT_CHECK(!kvli_add_overflows(UINT64_MAX, 0));
    KT_CHECK(!kvli_add_overflows(UINT64_MAX - 1, 1));
    KT_CHECK(kvli_add_overflows(UINT64_MAX, 1));
    KT_CHECK(kvli_add_overflows(1, UINT64_MAX));
    KT_CHECK(kvli_add_overflows(1ull << 63, 1ull << 63));
    KT_CHECK(!kvli_add_overflows((1ull << 63) - 1, 1ull << 63));
}

static void test_scopy(void)
{
    char d[8];
    memset(d, 'z', sizeof(d));
    kvli_scopy(d, 0, "abc"); /* no room: untouched */
    KT_CHECK(d[0] == 'z');
    kvli_scopy(d, 1, "abc");
    KT_CHECK(d[0] == '\0' && d[1] == 'z');
    kvli_scopy(d, sizeof(d), "abcdefgh"); /* one too long: truncated */
    KT_CHECK(strcmp(d, "abcdefg") == 0);
    kvli_scopy(d, sizeof(d), "abcdefg"); /* exactly fits */
    KT_CHECK(strcmp(d, "abcdefg") == 0);
    kvli_scopy(d, sizeof(d), NULL);
    KT_CHECK(d[0] == '\0');
    memset(d, 'z', sizeof(d));
    kvli_scopy(d, sizeof(d), "");
    KT_CHECK(d[0] == '\0' && d[1] == 'z');
    /* the source need not be terminated within cap */
    char src[3] = {'x', 'y', 'w'};
    kvli_scopy(d, 3, src);
    KT_CHECK(strcmp(d, "xy") == 0);
}

static void test_clocks_random(void)
{
    uint64_t t1 = kvli_now_ns(), t2 = kvli_now_ns();
    KT_CHECK(t2 >= t1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t rt = kvli_realtime_ns(), mine = (uint64_t)ts.tv_sec * 1000000000ull;
    KT_CHECK(rt >= mine);
    /* random ids are never 0 (0 means "no incarnation") and not a constant */
    uint64_t r[8];
    for (int i = 0; i < 8; i++) {
        r[i] = kvli_random64();
        KT_CHECK(r[i] != 0);
    }
    int same = 1;
    for (int i = 1; i < 8; i++)
        same &= r[i] == r[0];
    KT_CHECK(!same);
}

static int mapped(const void *p, size_t len)
{
    return msync((void *)(uintptr_t)p, len, MS_ASYNC) == 0 ? 1 : errno == ENOMEM ? 0 : -1;
}

/*
 * A cached buffer up to twice the size asked is handed out, and the caller
 * frees it with the size it asked for: nothing of the bigger buffer may stay
 * mapped once that buffer leaves the cache. Runs first, on an empty cache.
 */
static void test_buf_reuse_unmaps_all(void)
{
    const size_t mb = 1u << 20;
    uint8_t *fill[8];
    uint8_t *p = kvli_buf_alloc(5 * mb); /* a 6 MiB mapping */
    KT_CHECK(p != NULL && mapped(p, 6 * mb) == 1);
    memset(p, 1, 6 * mb);
    kvli_buf_free(p, 5 * mb);
    for (int i = 0; i < 8; i++) /* fresh mappings (the cache holds only p) */
        fill[i] = kvli_buf_alloc(2 * mb);
    uint8_t *q = kvli_buf_alloc(3 * mb); /* 4 MiB asked: p serves it */
    KT_CHECK(q == p);
    for (int i = 0; i < 8; i++) /* every slot of the cache taken */
        kvli_buf_free(fill[i], 2 * mb);
    kvli_buf_free(q, 3 * mb); /* no slot left: unmapped */
    KT_CHECK(mapped(p, 4 * mb) == 0);
    if (mapped(p + 4 * mb, 2 * mb) != 0)
        fprintf(stderr, "the last 2 MiB of a reused 6 MiB buffer stayed mapped\n");
    KT_CHECK(mapped(p + 4 * mb, 2 * mb) == 0);
    /* leave the cache empty for the next test */
    for (int i = 0; i < 8; i++) {
        fill[i] = kvli_buf_alloc(2 * mb);
        KT_CHECK(mapped(fill[i], 2 * mb) == 1);
        munmap(fill[i], 2 * mb);
    }
}

static void test_buf_cache(void)
{
    /* small: malloc, even for 0 bytes */
    void *s = kvli_buf_alloc(0);
    KT_CHECK(s != NULL);
    kvli_buf_free(s, 0);
    s = kvli_buf_alloc(1000);
    memset(s, 1, 1000);
    kvli_buf_free(s, 1000);
    kvli_buf_free(NULL, 1u << 20);

    /* big: whole 2 MiB units, kept warm and handed out again */
    size_t big = 5u << 20;
    uint8_t *p = kvli_buf_alloc(big);
    KT_CHECK(p != NULL);
    memset(p, 0xab, 6u << 20); /* rounded up: the whole 6 MiB is usable */
    kvli_buf_free(p, big);
    uint8_t *q = kvli_buf_alloc(big - 4096); /* same rounded size: reused */
    KT_CHECK(q == p && q[(6u << 20) - 1] == 0xab);
    kvli_buf_free(q, big);
    /* a cached buffer more than twice the (rounded) size asked is not handed out */
    uint8_t *small = kvli_buf_alloc(2u << 20);
    KT_CHECK(small != NULL && small != p);
    uint8_t *again = kvli_buf_alloc(3u << 20); /* 4 MiB: 6 is within twice */
    KT_CHECK(again == p);
    kvli_buf_free(small, 2u << 20);
    kvli_buf_free(again, 3u << 20);

    /* sizes that round past SIZE_MAX are refused, not wrapped to nothing */
    KT_CHECK(kvli_buf_alloc(SIZE_MAX) == NULL);
    KT_CHECK(kvli_buf_alloc(SIZE_MAX - (1u << 20)) == NULL);
}

/* Arrays of 4 KiB to 128 KiB: back to a free list of their size (a power
 * of two), handed out again for any size of that class, never to another
 * class, and never more than the bound in all. */
static void test_buf_mid(void)
{
    size_t max, base = kvli_buf_mid_cached(&max);
    KT_CHECK(base <= max);
    uint8_t *a = kvli_buf_alloc(8192);
    KT_CHECK(a != NULL);
    memset(a, 0x5a, 8192);
    kvli_buf_free(a, 8192);
    if (max == 0) { /* AddressSanitizer: malloc's own, so it sees a use after free */
        KT_CHECK(kvli_buf_mid_cached(NULL) == 0);
        printf("test_buf_mid: no free lists in this build (AddressSanitizer)\n");
        return;
    }
    KT_CHECK(kvli_buf_mid_cached(NULL) == base + 8192);
    uint8_t *b = kvli_buf_alloc(20000); /* 32 KiB class: not a */
    KT_CHECK(b != NULL && b != a && kvli_buf_mid_cached(NULL) == base + 8192);
    memset(b, 1, 32768); /* the whole class size is the caller's */
    uint8_t *c = kvli_buf_alloc(4097); /* 8 KiB class: a again, as it was left */
    KT_CHECK(c == a && c[8191] == 0x5a && kvli_buf_mid_cached(NULL) == base);
    kvli_buf_free(b, 20000);
    kvli_buf_free(c, 4097);
    KT_CHECK(kvli_buf_mid_cached(NULL) == base + 8192 + 32768);

    /* the bound: one array more than it holds goes back to malloc */
    size_t n = (max - kvli_buf_mid_cached(NULL)) / 65536 + 1;
    void **v = calloc(n, sizeof(*v));
    KT_CHECK(v != NULL);
    for (size_t i = 0; i < n; i++) {
        v[i] = kvli_buf_alloc(65536);
        KT_CHECK(v[i] != NULL);
        memset(v[i], (int)i, 65536);
    }
    for (size_t i = 0; i < n; i++)
        kvli_buf_free(v[i], 65536);
    KT_CHECK(kvli_buf_mid_cached(NULL) <= max && kvli_buf_mid_cached(NULL) > max - 65536);
    for (size_t i = 0; i < n; i++) /* taken out again */
        v[i] = kvli_buf_alloc(65536);
    KT_CHECK(kvli_buf_mid_cached(NULL) == base + 8192 + 32768);
    for (size_t i = 0; i < n; i++)
        free(v[i]); /* a cached array is malloc's: free() takes it too */
    free(v);
    /* the lists' memory is handed out again, leaving the base */
    free(kvli_buf_alloc(8192));
    free(kvli_buf_alloc(32768));
    KT_CHECK(kvli_buf_mid_cached(NULL) == base);
}

int main(void)
{
    test_buf_reuse_unmaps_all();
    test_crc32c();
    test_sha1();
    test_names();
    test_overflow();
    test_scopy();
    test_clocks_random();
    test_buf_cache();
    test_buf_mid();
    printf("test_util: passed\n");
    return 0;
}
