/* Logging: level from KVL_LOG_LEVEL, output to stderr or the host's callback. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "internal.h"

static pthread_once_t kvli_log_once = PTHREAD_ONCE_INIT;
static _Atomic int kvli_log_level = KVL_LOG_WARN;
static pthread_mutex_t kvli_log_lock = PTHREAD_MUTEX_INITIALIZER;
static kvl_log_cb_t kvli_log_cb;
static void *kvli_log_arg;

static const char *const kvli_level_names[] = {"error", "warn", "info", "debug", "trace"};

static void kvli_log_init(void)
{
    const char *env = getenv("KVL_LOG_LEVEL");
    if (env == NULL || env[0] == '\0')
        return;
    if (strcasecmp(env, "off") == 0 || strcasecmp(env, "none") == 0) {
        kvli_log_level = KVL_LOG_OFF;
        return;
    }
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(env, kvli_level_names[i]) == 0) {
            kvli_log_level = i;
            return;
        }
    }
    fprintf(stderr, "kvlane [warn] core: KVL_LOG_LEVEL='%s' is not one of "
                    "off|error|warn|info|debug|trace; keeping 'warn'\n", env);
}

void kvl_log_set_level(kvl_log_level_t level)
{
    pthread_once(&kvli_log_once, kvli_log_init);
    if (level < KVL_LOG_OFF)
        level = KVL_LOG_OFF;
    if (level > KVL_LOG_TRACE)
        level = KVL_LOG_TRACE;
    kvli_log_level = (int)level;
}

kvl_log_level_t kvl_log_get_level(void)
{
    pthread_once(&kvli_log_once, kvli_log_init);
    return (kvl_log_level_t)kvli_log_level;
}

void kvl_log_set_callback(kvl_log_cb_t cb, void *arg)
{
    pthread_mutex_lock(&kvli_log_lock);
    kvli_log_cb = cb;
    kvli_log_arg = arg;
    pthread_mutex_unlock(&kvli_log_lock);
}

bool kvli_log_enabled(kvl_log_level_t level)
{
    pthread_once(&kvli_log_once, kvli_log_init);
    return (int)level <= kvli_log_level;
}

void kvli_vlog(kvl_log_level_t level, const char *component, const char *fmt, va_list ap)
{
    char msg[2048];
    if (!kvli_log_enabled(level) || level < KVL_LOG_ERROR)
        return;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    pthread_mutex_lock(&kvli_log_lock);
    if (kvli_log_cb != NULL)
        kvli_log_cb(level, component, msg, kvli_log_arg);
    else
        fprintf(stderr, "kvlane [%s] %s: %s\n", kvli_level_names[level], component, msg);
    pthread_mutex_unlock(&kvli_log_lock);
}

void kvli_log(kvl_log_level_t level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvli_vlog(level, component, fmt, ap);
    va_end(ap);
}
