/* Small utilities: clocks, randomness, CRC32C, name checks. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
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
    size_t n;
    if (cap == 0)
        return;
    n = src ? strnlen(src, cap - 1) : 0;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}
