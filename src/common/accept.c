/* Accepting connections when descriptors run out (shared layer): see accept.h. */
#define _GNU_SOURCE
#include "accept.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <kvlane/backend.h>
#include <string.h>
#include "clock.h"
#include "errname.h"

void kvli_accept_backoff_init(kvli_accept_backoff_t *b, const char *what, kvli_accept_log_fn log,
                              void *log_arg)
{
    memset(b, 0, sizeof(*b));
    snprintf(b->what, sizeof(b->what), "%s", what);
    b->log = log;
    b->log_arg = log_arg;
}

void kvli_accept_bk_log(void *bk_ctx, kvl_log_level_t level, const char *fmt, ...)
{
    kvl_bk_ctx_t *ctx = bk_ctx;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    ctx->log(ctx, level, "%s", text);
}

int kvli_accept_shortage(int e)
{
    return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

int kvli_accept_failed(kvli_accept_backoff_t *b, int e)
{
    uint64_t now;
    if (!kvli_accept_shortage(e))
        return 0;
    now = kvli_clock_ns();
    if (b->failures++ == 0) {
        b->since_ns = now;
        b->err = e;
        b->log(b->log_arg, KVL_LOG_WARN, "%s: accept4() = -1 %s (%s): a connection waits; "
               "not accepting for %u ms at a time until a try succeeds; %s", b->what,
               kvli_errno_name(e), strerror(e), KVLI_ACCEPT_PAUSE_MS,
               e == EMFILE || e == ENFILE
               ? "raise the open-file limit (ulimit -n, LimitNOFILE=) or close descriptors"
               : "the kernel is short of memory: free some, or close descriptors");
    }
    b->until_ns = now + KVLI_ACCEPT_PAUSE_MS * 1000000ull;
    return 1;
}

void kvli_accept_ok(kvli_accept_backoff_t *b)
{
    if (b->failures == 0)
        return;
    b->log(b->log_arg, KVL_LOG_INFO, "%s: accepting connections again after %llu failed "
           "accept4() calls (%s) in %.1f s", b->what, (unsigned long long)b->failures,
           kvli_errno_name(b->err), (double)(kvli_clock_ns() - b->since_ns) / 1e9);
    b->failures = 0;
    b->until_ns = 0;
    b->err = 0;
}

short kvli_accept_events(const kvli_accept_backoff_t *b, uint64_t now)
{
    return now < b->until_ns ? 0 : POLLIN;
}

int64_t kvli_accept_wait_ns(const kvli_accept_backoff_t *b, uint64_t now, int64_t wait_ns)
{
    int64_t left;
    if (now >= b->until_ns)
        return wait_ns;
    left = (int64_t)(b->until_ns - now);
    return wait_ns < 0 || left < wait_ns ? left : wait_ns;
}

int kvli_accept_wait_ms(const kvli_accept_backoff_t *b, uint64_t now, int wait_ms)
{
    int left;
    if (now >= b->until_ns)
        return wait_ms;
    left = (int)((b->until_ns - now + 999999u) / 1000000u);
    return wait_ms < 0 || left < wait_ms ? left : wait_ms;
}
