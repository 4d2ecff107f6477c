/*
 * Waking a progress thread (shared layer): each backend's progress thread
 * polls an eventfd; kvli_wake makes its next poll return. A full counter
 * already means "wake up", so a failed write is not an error.
 */
#ifndef KVLI_WAKE_H
#define KVLI_WAKE_H

#include <stdint.h>
#include <unistd.h>

static inline void kvli_wake(int fd)
{
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof(one));
    (void)n;
}

/* Reset the counter after a wake-up (the fd is non-blocking). */
static inline void kvli_wake_drain(int fd)
{
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
}

#endif
