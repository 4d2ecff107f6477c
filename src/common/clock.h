/* Monotonic clock readings for deadlines and durations (shared layer). */
#ifndef KVLI_CLOCK_H
#define KVLI_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvli_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvli_clock_ms(void)
{
    return kvli_clock_ns() / 1000000u;
}

#endif
