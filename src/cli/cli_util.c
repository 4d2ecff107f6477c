/* Helpers shared by the CLI's subcommands. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <kvlane/kvlane.h>
#include "cli.h"

int kvl_cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    /* digits first: strtoull would take "-5" as 2^64 - 5, and spaces or a '+' */
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (shift != 0 && v > (ULLONG_MAX >> shift))
        return -1; /* past 2^64 bytes */
    v <<= shift;
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    *out = v;
    return 0;
}

int kvl_cli_split(const char *s, char *buf, size_t cap, char **items, int max, char *why,
                  size_t wlen)
{
    size_t len = strlen(s);
    int n = 0;
    if (len >= cap) {
        snprintf(why, wlen, "is longer than %zu characters", cap - 1);
        return -1;
    }
    memcpy(buf, s, len + 1);
    for (char *p = buf;;) {
        char *end = strchr(p, ',');
        if (end != NULL)
            *end = '\0';
        if (*p == '\0') {
            snprintf(why, wlen, "has an empty entry");
            return -1;
        }
        if (n == max) {
            snprintf(why, wlen, "has more than %d entries", max);
            return -1;
        }
        items[n++] = p;
        if (end == NULL)
            return n;
        p = end + 1;
    }
}

int kvl_cli_parse_uint(const char *s, uint64_t most, uint64_t *out)
{
    char *end;
    if (s == NULL || *s < '0' || *s > '9') /* strtoull takes "-5" and " 5" */
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > most)
        return -1;
    *out = v;
    return 0;
}

void kvl_cli_print_error(const char *what)
{
    char buf[8192];
    kvl_error_render(NULL, buf, sizeof(buf));
    fprintf(stderr, "kvlane: %s failed:\n%s\n", what, buf);
}

int kvl_cli_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int kvl_cli_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
    char *p = buf;
    double deadline = kvl_cli_now() + timeout_ms / 1000.0;
    while (len > 0) {
        int left = (int)((deadline - kvl_cli_now()) * 1000);
        if (left <= 0)
            return -1;
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

double kvl_cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int kvl_cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
