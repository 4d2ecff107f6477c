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
 * prepares transfer after transfer touches warm memory.
 *
 * Arrays of 4 KiB up to 128 KiB (a request's index arrays: 8 KiB for 1024
 * pairs) come from malloc, rounded up to a power of two, and go back to a
 * free list of their size: an engine holds one per request in flight, and
 * when a burst of them is released malloc returns the top of its heap to
 * the kernel, so the next burst would fault every page in again (2 faults
 * a request of 1024 pairs, ~12 us each on a VM). The lists hold at most
 * KVLI_BUF_MID_MAX bytes in all. Smaller arrays use malloc.
 */
#define KVLI_BUF_BIG (128u << 10)
#define KVLI_BUF_SLOTS 8
#define KVLI_BUF_CACHE_MAX (512ull << 20)
#define KVLI_BUF_MID_MIN_SHIFT 12        /* 4 KiB */
#define KVLI_BUF_MID_CLASSES 5           /* 4, 8, 16, 32, 64 KiB; 64..128 KiB: 128 */
/* Under AddressSanitizer the arrays go back to malloc, which then catches
 * a use after free. */
#if defined(__SANITIZE_ADDRESS__)
#define KVLI_BUF_MID_MAX 0u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVLI_BUF_MID_MAX 0u
#endif
#endif
#ifndef KVLI_BUF_MID_MAX
#define KVLI_BUF_MID_MAX (8u << 20)
#endif

static pthread_mutex_t kvli_buf_mid_lock = PTHREAD_MUTEX_INITIALIZER;
static void *kvli_buf_mid_head[KVLI_BUF_MID_CLASSES + 1]; /* free lists, linked through the arrays */
static size_t kvli_buf_mid_bytes;

/* The free list of an array of bytes (4 KiB <= bytes < 128 KiB): the
 * smallest power of two that holds it. */
static unsigned kvli_buf_mid_class(size_t bytes)
{
    unsigned c = 0;
    while (((size_t)1 << (KVLI_BUF_MID_MIN_SHIFT + c)) < bytes)
        c++;
    return c;
}

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
    if (bytes < ((size_t)1 << KVLI_BUF_MID_MIN_SHIFT))
        return malloc(bytes ? bytes : 1);
    if (bytes < KVLI_BUF_BIG) {
        unsigned c = kvli_buf_mid_class(bytes);
        size_t len = (size_t)1 << (KVLI_BUF_MID_MIN_SHIFT + c);
        pthread_mutex_lock(&kvli_buf_mid_lock);
        void *p = kvli_buf_mid_head[c];
        if (p != NULL) {
            memcpy(&kvli_buf_mid_head[c], p, sizeof(void *));
            kvli_buf_mid_bytes -= len;
        }
        pthread_mutex_unlock(&kvli_buf_mid_lock);
        return p != NULL ? p : malloc(len);
    }
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

size_t kvli_buf_mid_cached(size_t *max_p)
{
    if (max_p != NULL)
        *max_p = KVLI_BUF_MID_MAX;
    pthread_mutex_lock(&kvli_buf_mid_lock);
    size_t v = kvli_buf_mid_bytes;
    pthread_mutex_unlock(&kvli_buf_mid_lock);
    return v;
}

void kvli_buf_free(void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (bytes < ((size_t)1 << KVLI_BUF_MID_MIN_SHIFT)) {
        free(p);
        return;
    }
    if (bytes < KVLI_BUF_BIG) {
        unsigned c = kvli_buf_mid_class(bytes);
        size_t len = (size_t)1 << (KVLI_BUF_MID_MIN_SHIFT + c);
        pthread_mutex_lock(&kvli_buf_mid_lock);
        if (kvli_buf_mid_bytes + len <= KVLI_BUF_MID_MAX) {
            memcpy(p, &kvli_buf_mid_head[c], sizeof(void *));
            kvli_buf_mid_head[c] = p;
            kvli_buf_mid_bytes += len;
            p = NULL;
        }
        pthread_mutex_unlock(&kvli_buf_mid_lock);
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
