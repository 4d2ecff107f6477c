/*
 * kvlane ucx backend: capture what UCX logs during one call.
 *
 * UCX reports the real cause of most failures only in its log ("network
 * device 'mlx5_7:1' is not available ...") and returns a bare status. We push
 * one log handler into libucs (ucs_log_push_handler, exported by Debian's
 * libucs) that, while a capture is open on the calling thread, keeps the
 * lines for our error text and stops UCX from printing them a second time.
 * Lines from other threads, or outside a capture, go on to UCX's own
 * handler unchanged (so teardown warnings such as "destroying inuse" stay
 * visible on stderr).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <ucs/debug/log_def.h>
#include "ucx.h"

static _Thread_local kvli_ucx_log_t *kvli_ucx_log_cur;
static pthread_once_t kvli_ucx_log_once = PTHREAD_ONCE_INIT;

static ucs_log_func_rc_t kvli_ucx_log_handler(const char *file, unsigned line,
                                              const char *function, ucs_log_level_t level,
                                              const ucs_log_component_config_t *comp,
                                              const char *fmt, va_list ap)
{
    kvli_ucx_log_t *log = kvli_ucx_log_cur;
    char msg[512];
    int n;

    (void)function;
    (void)comp;
    if (log == NULL || level > UCS_LOG_LEVEL_INFO)
        return UCS_LOG_FUNC_RC_CONTINUE;
    /* UCX's own format string: not a literal by nature */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    vsnprintf(msg, sizeof(msg), fmt, ap);
#pragma GCC diagnostic pop
    (void)file;
    (void)line;
    if (log->len < sizeof(log->text) - 1) {
        /* Short form, so the text fits a registration report line; file and
         * line go to our debug log. */
        n = snprintf(log->text + log->len, sizeof(log->text) - log->len, "%s%s: %.400s",
                     log->lines ? " | " : "",
                     level == UCS_LOG_LEVEL_FATAL ? "fatal"
                     : level == UCS_LOG_LEVEL_ERROR ? "error"
                     : level == UCS_LOG_LEVEL_WARN ? "warn" : "info", msg);
        if (n > 0)
            log->len += (size_t)n;
        if (log->len >= sizeof(log->text))
            log->len = sizeof(log->text) - 1;
    }
    log->lines++;
    return UCS_LOG_FUNC_RC_STOP;
}

static void kvli_ucx_log_push(void)
{
    ucs_log_push_handler(kvli_ucx_log_handler);
}

void kvli_ucx_log_install(void)
{
    pthread_once(&kvli_ucx_log_once, kvli_ucx_log_push);
}

void kvli_ucx_log_begin(kvli_ucx_log_t *log)
{
    kvli_ucx_log_install();
    log->text[0] = '\0';
    log->len = 0;
    log->lines = 0;
    kvli_ucx_log_cur = log;
}

void kvli_ucx_log_end(void)
{
    kvli_ucx_log_cur = NULL;
}

const char *kvli_ucx_log_said(const kvli_ucx_log_t *log, char *buf, size_t len)
{
    if (log == NULL || log->lines == 0) {
        snprintf(buf, len, "; UCX logged nothing for this call");
        return buf;
    }
    snprintf(buf, len, "; UCX said \"%.900s\"", log->text);
    return buf;
}
