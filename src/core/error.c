/* Errors: filled once where decided, kept per thread and per agent. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "common/errname.h"

static _Thread_local kvl_error_t kvli_tls_err;

static void kvli_err_reset(kvl_error_t *err)
{
    memset(err, 0, offsetof(kvl_error_t, causes));
    err->device = -1;
}

void kvli_err(kvl_error_t *err, kvl_status_t code, int sys_errno, const char *fmt, ...)
{
    va_list ap;
    kvli_err_reset(err);
    err->code = code;
    err->sys_errno = sys_errno;
    va_start(ap, fmt);
    vsnprintf(err->what, sizeof(err->what), fmt, ap);
    va_end(ap);
}

void kvli_hint(kvl_error_t *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->hint, sizeof(err->hint), fmt, ap);
    va_end(ap);
}

void kvli_err_region(kvl_error_t *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->region, sizeof(err->region), fmt, ap);
    va_end(ap);
}

void kvli_err_blank(kvl_error_t *err)
{
    err->code = KVL_OK;
    err->sys_errno = 0;
    err->device = -1;
    err->backend[0] = err->agent[0] = err->region[0] = err->what[0] = err->hint[0] = '\0';
    err->n_causes = err->n_causes_dropped = 0;
}

void kvli_err_add_cause(kvl_error_t *err, const kvl_error_t *cause)
{
    if (err->n_causes >= KVL_ERROR_MAX_CAUSES) {
        err->n_causes_dropped++;
        return;
    }
    kvl_error_cause_t *c = &err->causes[err->n_causes++];
    c->code = cause->code;
    c->sys_errno = cause->sys_errno;
    c->device = cause->device;
    kvli_scopy(c->backend, sizeof(c->backend), cause->backend);
    kvli_scopy(c->what, sizeof(c->what), cause->what);
    kvli_scopy(c->hint, sizeof(c->hint), cause->hint);
    /* the cause's own causes (a backend's lower errors) follow it */
    for (unsigned i = 0; i < cause->n_causes && i < KVL_ERROR_MAX_CAUSES; i++) {
        if (err->n_causes >= KVL_ERROR_MAX_CAUSES) {
            err->n_causes_dropped++;
            continue;
        }
        err->causes[err->n_causes++] = cause->causes[i];
    }
    err->n_causes_dropped += cause->n_causes_dropped;
}

static void kvli_err_copy(kvl_error_t *dst, const kvl_error_t *src)
{
    memcpy(dst, src, offsetof(kvl_error_t, causes));
    memcpy(dst->causes, src->causes, src->n_causes * sizeof(src->causes[0]));
}

kvl_status_t kvli_fail(kvl_agent_t *agent, const kvl_error_t *err)
{
    if (err != &kvli_tls_err)
        kvli_err_copy(&kvli_tls_err, err);
    if (agent != NULL) {
        pthread_mutex_lock(&agent->err_lock);
        kvli_err_copy(&agent->last_err, err);
        pthread_mutex_unlock(&agent->err_lock);
    }
    if (kvli_log_enabled(KVL_LOG_DEBUG)) {
        char buf[1024];
        kvl_error_render(err, buf, sizeof(buf));
        kvli_log(KVL_LOG_DEBUG, "core", "returning error: %s", buf);
    }
    return err->code;
}

kvl_status_t kvli_fail_simple(kvl_agent_t *agent, kvl_status_t code, const char *hint,
                              const char *fmt, ...)
{
    kvl_error_t *err = &kvli_tls_err;
    va_list ap;
    kvli_err_reset(err);
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->what, sizeof(err->what), fmt, ap);
    va_end(ap);
    if (hint != NULL)
        kvli_scopy(err->hint, sizeof(err->hint), hint);
    return kvli_fail(agent, err);
}

const kvl_error_t *kvl_last_error(void)
{
    /* A thread's error starts zeroed (TLS): nothing recorded claims no device. */
    if (kvli_tls_err.code == KVL_OK && kvli_tls_err.what[0] == '\0')
        kvli_tls_err.device = -1;
    return &kvli_tls_err;
}

void kvl_error_clear(void)
{
    /* Called before most API calls (the Python module: every one): an error
     * that is already clear is not cleared again (2 KiB of memset). */
    if (kvli_tls_err.code != KVL_OK || kvli_tls_err.what[0] || kvli_tls_err.hint[0] ||
        kvli_tls_err.n_causes) {
        kvli_err_reset(&kvli_tls_err);
        kvli_tls_err.code = KVL_OK;
    }
    kvli_tls_err.device = -1;
}

void kvl_agent_last_error(kvl_agent_t *agent, kvl_error_t *err)
{
    if (agent == NULL || err == NULL)
        return;
    pthread_mutex_lock(&agent->err_lock);
    kvli_err_copy(err, &agent->last_err);
    pthread_mutex_unlock(&agent->err_lock);
}

/* Append to a bounded buffer, tracking the length the full text needs. */
typedef struct {
    char *buf;
    size_t cap, need;
} kvli_sbuf_t;

static void kvli_sbuf_printf(kvli_sbuf_t *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void kvli_sbuf_printf(kvli_sbuf_t *s, const char *fmt, ...)
{
    va_list ap;
    size_t room = s->need < s->cap ? s->cap - s->need : 0;
    va_start(ap, fmt);
    int n = vsnprintf(room ? s->buf + s->need : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        s->need += (size_t)n;
}

/* " (errno N: text)" after a message, unless the message already quotes the
 * errno (its name, "ENOENT", or its text): errno is formatted once. */
static void kvli_render_errno(kvli_sbuf_t *s, int e, const char *what)
{
    if (e != 0) {
        char eb[128];
        const char *msg = strerror_r(e, eb, sizeof(eb));
        const char *name = kvli_errno_name(e);
        if ((name != NULL && name[0] && strstr(what, name) != NULL) ||
            (msg != NULL && msg[0] && strstr(what, msg) != NULL))
            return;
        kvli_sbuf_printf(s, " (errno %d: %s)", e, msg);
    }
}

size_t kvl_error_render(const kvl_error_t *err, char *buf, size_t len)
{
    kvli_sbuf_t s = {buf, len, 0};
    if (buf != NULL && len > 0)
        buf[0] = '\0';
    if (err == NULL)
        err = &kvli_tls_err;
    kvli_sbuf_printf(&s, "%s: %s", kvl_status_name(err->code),
                     err->what[0] ? err->what : kvl_status_str(err->code));
    kvli_render_errno(&s, err->sys_errno, err->what);
    if (err->backend[0] || err->device >= 0 || err->agent[0] || err->region[0]) {
        const char *sep = "";
        kvli_sbuf_printf(&s, "\n  where: ");
        if (err->backend[0]) {
            kvli_sbuf_printf(&s, "backend %s", err->backend);
            sep = ", ";
        }
        if (err->device >= 0) {
            kvli_sbuf_printf(&s, "%sdevice %d", sep, err->device);
            sep = ", ";
        }
        if (err->agent[0]) {
            kvli_sbuf_printf(&s, "%sremote agent '%s'", sep, err->agent);
            sep = ", ";
        }
        if (err->region[0])
            kvli_sbuf_printf(&s, "%s%s", sep, err->region);
    }
    for (unsigned i = 0; i < err->n_causes && i < KVL_ERROR_MAX_CAUSES; i++) {
        const kvl_error_cause_t *c = &err->causes[i];
        kvli_sbuf_printf(&s, "\n  cause %u: ", i + 1);
        if (c->backend[0])
            kvli_sbuf_printf(&s, "[%s] ", c->backend);
        if (c->device >= 0)
            kvli_sbuf_printf(&s, "[device %d] ", c->device);
        kvli_sbuf_printf(&s, "%s: %s", kvl_status_name(c->code), c->what);
        kvli_render_errno(&s, c->sys_errno, c->what);
        if (c->hint[0])
            kvli_sbuf_printf(&s, "\n    fix: %s", c->hint);
    }
    if (err->n_causes_dropped)
        kvli_sbuf_printf(&s, "\n  (%u more causes not kept)", err->n_causes_dropped);
    if (err->hint[0])
        kvli_sbuf_printf(&s, "\n  fix: %s", err->hint);
    return s.need;
}
