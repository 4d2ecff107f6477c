/* Errors: filled once where decided, kept per thread and per agent. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "common/errname.h"

/*
 * Each thread's last error, made at the thread's first failure and freed when
 * the thread exits. Not a kvl_error_t in thread-local storage itself: with
 * its causes it is ~36 KiB, and static TLS that size is zeroed (and its pages
 * faulted in) at the creation of every thread of the process, kvlane's or
 * the engine's, whether it ever calls kvlane or not. A thread whose record
 * cannot be allocated reads kvli_err_nomem; one that never failed, the blank
 * kvli_err_none.
 */
static _Thread_local kvl_error_t *kvli_tls_err;
static _Thread_local int kvli_tls_lost; /* the last failure found no record */
static pthread_key_t kvli_tls_key;
static pthread_once_t kvli_tls_once = PTHREAD_ONCE_INIT;
static int kvli_tls_key_ok;
static const kvl_error_t kvli_err_none = {.code = KVL_OK, .device = -1};
static const kvl_error_t kvli_err_nomem = {
    .code = KVL_ERR_NO_MEMORY, .sys_errno = ENOMEM, .device = -1,
    .what = "out of memory: this thread's error record could not be allocated (the call's "
            "status code is right; its details are lost)",
    .hint = "the process is out of memory"};

/* The records of the living threads, linked from here: a thread still
 * running at exit (the main one never runs its key destructors) holds a
 * record that is in use, not lost, and leak checkers see it so. */
typedef struct kvli_tls_node {
    kvl_error_t err; /* first: the record is its error */
    struct kvli_tls_node *prev, *next;
} kvli_tls_node_t;
static kvli_tls_node_t *kvli_tls_all;
static pthread_mutex_t kvli_tls_lock = PTHREAD_MUTEX_INITIALIZER;

static void kvli_tls_free(void *p)
{
    kvli_tls_node_t *r = p;
    pthread_mutex_lock(&kvli_tls_lock);
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        kvli_tls_all = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    pthread_mutex_unlock(&kvli_tls_lock);
    free(r);
    kvli_tls_err = NULL;
}

/* fork() while another thread links or unlinks its record: the child (the
 * forking thread alone) must not inherit the lock held. */
static void kvli_tls_fork_prepare(void)
{
    pthread_mutex_lock(&kvli_tls_lock);
}

static void kvli_tls_fork_done(void)
{
    pthread_mutex_unlock(&kvli_tls_lock);
}

static void kvli_tls_init(void)
{
    kvli_tls_key_ok = pthread_key_create(&kvli_tls_key, kvli_tls_free) == 0;
    (void)pthread_atfork(kvli_tls_fork_prepare, kvli_tls_fork_done, kvli_tls_fork_done);
}

/* At unload (dlclose): no thread may run kvli_tls_free after its code left
 * (the records of threads still running stay theirs). */
__attribute__((destructor)) static void kvli_tls_fini(void)
{
    if (kvli_tls_key_ok) {
        kvli_tls_key_ok = 0;
        pthread_key_delete(kvli_tls_key);
    }
}

/* This thread's record, made now if it has none; NULL: out of memory. */
static kvl_error_t *kvli_tls_rec(void)
{
    if (kvli_tls_err != NULL)
        return kvli_tls_err;
    pthread_once(&kvli_tls_once, kvli_tls_init);
    kvli_tls_node_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->err.device = -1;
    if (kvli_tls_key_ok && pthread_setspecific(kvli_tls_key, r) != 0) {
        free(r);
        return NULL;
    }
    pthread_mutex_lock(&kvli_tls_lock);
    r->next = kvli_tls_all;
    if (r->next != NULL)
        r->next->prev = r;
    kvli_tls_all = r;
    pthread_mutex_unlock(&kvli_tls_lock);
    kvli_tls_err = &r->err;
    return &r->err;
}

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
    kvl_error_t *t = kvli_tls_rec();
    kvli_tls_lost = t == NULL;
    if (t != NULL && err != t)
        kvli_err_copy(t, err);
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
    kvl_error_t *err = kvli_tls_rec();
    va_list ap;
    if (err == NULL) {
        /* no record for the text: the caller still gets the code */
        kvli_tls_lost = 1;
        return code;
    }
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
    if (kvli_tls_lost)
        return &kvli_err_nomem;
    return kvli_tls_err != NULL ? kvli_tls_err : &kvli_err_none;
}

void kvl_error_clear(void)
{
    /* Called before most API calls (the Python module: every one): an error
     * that is already clear is not cleared again (2 KiB of memset), and a
     * thread that never failed has nothing to clear. */
    kvl_error_t *e = kvli_tls_err;
    kvli_tls_lost = 0;
    if (e == NULL)
        return;
    if (e->code != KVL_OK || e->what[0] || e->hint[0] || e->n_causes) {
        kvli_err_reset(e);
        e->code = KVL_OK;
    }
    e->device = -1;
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
        err = kvl_last_error();
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
