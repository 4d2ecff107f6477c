/* Small utilities: clocks, randomness, CRC32C, name checks. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"

uint64_t kvli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvli_realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvli_random64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        /* getrandom cannot fail for 8 bytes once the pool is ready; mix what
         * we have rather than return a constant if it ever does. */
        v = kvli_now_ns() ^ ((uint64_t)getpid() << 32) ^ kvli_realtime_ns();
    }
    return v ? v : 1;
}

/* CRC32C (Castagnoli), table driven, slicing by one byte: metadata blobs are
 * small, so simplicity wins over speed here. */
static uint32_t kvli_crc_table[256];
static pthread_once_t kvli_crc_once = PTHREAD_ONCE_INIT;

static void kvli_crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        kvli_crc_table[i] = c;
    }
}

uint32_t kvli_crc32c(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    pthread_once(&kvli_crc_once, kvli_crc_init);
    crc = ~crc;
    while (len--)
        crc = kvli_crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

bool kvli_name_valid(const char *name)
{
    size_t n;
    if (name == NULL)
        return false;
    n = strlen(name);
    if (n == 0 || n >= KVL_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c <= ' ' || c >= 0x7f)
            return false;
    }
    return true;
}

bool kvli_add_overflows(uint64_t a, uint64_t b)
{
    return a + b < a;
}

void kvli_scopy(char *dst, size_t cap, const char *src)
{
    kvl_bk_scopy(dst, cap, src);
}

/*
 * Large scratch arrays (prepared entries, segments). Fresh pages cost a
 * fault each, which on virtual machines dwarfs the work per descriptor, so
 * arrays of 128 KiB and more (where malloc would map fresh pages each time)
 * are kept in a small process-wide cache and reused: an engine that
 * prepares transfer after transfer touches warm memory. Smaller arrays use
 * malloc.
 */
#define KVLI_BUF_BIG (128u << 10)
#define KVLI_BUF_SLOTS 8
#define KVLI_BUF_CACHE_MAX (512ull << 20)

static pthread_mutex_t kvli_buf_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t len;
} kvli_buf_cache[KVLI_BUF_SLOTS];
static size_t kvli_buf_cached;

static size_t kvli_buf_round(size_t bytes)
{
    return (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
}

void *kvli_buf_alloc(size_t bytes)
{
    if (bytes < KVLI_BUF_BIG)
        return malloc(bytes ? bytes : 1);
    size_t len = kvli_buf_round(bytes);
    int best = -1;
    pthread_mutex_lock(&kvli_buf_lock);
    for (int i = 0; i < KVLI_BUF_SLOTS; i++) {
        size_t l = kvli_buf_cache[i].len;
        if (kvli_buf_cache[i].p && l >= len && l <= 2 * len &&
            (best < 0 || l < kvli_buf_cache[best].len))
            best = i;
    }
    void *p = NULL;
    size_t have = 0;
    if (best >= 0) {
        p = kvli_buf_cache[best].p;
        have = kvli_buf_cache[best].len;
        kvli_buf_cache[best].p = NULL;
        kvli_buf_cached -= have;
        kvli_buf_cache[best].len = 0;
    }
    pthread_mutex_unlock(&kvli_buf_lock);
    if (p != NULL) {
        /* The caller frees it with its own size: keep only that much. */
        if (have > len)
            munmap((char *)p + len, have - len);
        return p;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    /* Descriptor tables are read in the order of the caller's indices, not
     * in address order: huge pages spare a TLB miss per entry. */
    if (len >= (2u << 20))
        (void)madvise(p, len, MADV_HUGEPAGE);
#endif
    return p;
}

void kvli_buf_free(void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (bytes < KVLI_BUF_BIG) {
        free(p);
        return;
    }
    size_t len = kvli_buf_round(bytes);
    pthread_mutex_lock(&kvli_buf_lock);
    if (kvli_buf_cached + len <= KVLI_BUF_CACHE_MAX) {
        int slot = -1;
        for (int i = 0; i < KVLI_BUF_SLOTS && slot < 0; i++)
            if (kvli_buf_cache[i].p == NULL)
                slot = i;
        if (slot >= 0) {
            kvli_buf_cache[slot].p = p;
            kvli_buf_cache[slot].len = len;
            kvli_buf_cached += len;
            p = NULL;
        }
    }
    pthread_mutex_unlock(&kvli_buf_lock);
    if (p != NULL)
        munmap(p, len);
}
