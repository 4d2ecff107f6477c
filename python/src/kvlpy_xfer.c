/*
 * kvlane._kvlane.Prep and Xfer: prepared lists and transfers.
 */
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kvlpy.h"

/* A Prep/Xfer is usable while its agent is open and it was not released. */
static int kvlpy_owner_open(kvlpy_agent_t *owner)
{
    return owner != NULL && owner->agent != NULL && !owner->closing &&
           owner->pid == kvlpy_getpid();
}

/* ---- Prep ----------------------------------------------------------------- */

static PyObject *kvlpy_prep_make(kvlpy_agent_t *self, PyObject *remote, PyObject *dl_o)
{
    if (!PyObject_TypeCheck(dl_o, &kvlpy_dlist_type)) {
        PyErr_SetString(PyExc_TypeError, "a kvlane.DList is needed");
        return NULL;
    }
    kvlpy_dlist_t *dl = (kvlpy_dlist_t *)dl_o;
    if (dl->dl == NULL)
        return kvlpy_raise_msg(KVL_ERR_STATE, "DList.__init__ was not called", NULL);
    const char *rname = NULL;
    if (remote != Py_None && (rname = PyUnicode_AsUTF8(remote)) == NULL)
        return NULL;
    kvlpy_prep_t *p = PyObject_New(kvlpy_prep_t, &kvlpy_prep_type);
    if (p == NULL)
        return NULL;
    p->owner = NULL;
    p->prep = NULL;
    p->busy = 0;
    p->remote = Py_NewRef(remote);
    if (kvlpy_agent_enter(self) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    kvl_prep_t *prep = NULL;
    kvl_status_t st;
    kvlpy_dlist_hold(dl);
    Py_BEGIN_ALLOW_THREADS
    st = rname ? kvl_prep_remote(self->agent, rname, dl->dl, &prep)
               : kvl_prep_local(self->agent, dl->dl, &prep);
    Py_END_ALLOW_THREADS
    kvlpy_dlist_unhold(dl);
    kvlpy_agent_leave(self);
    if (st != KVL_OK) {
        Py_DECREF(p);
        return kvlpy_raise(st, NULL);
    }
    p->owner = (kvlpy_agent_t *)Py_NewRef((PyObject *)self);
    p->prep = prep;
    return (PyObject *)p;
}

PyObject *kvlpy_agent_prep_local(kvlpy_agent_t *self, PyObject *arg);
PyObject *kvlpy_agent_prep_local(kvlpy_agent_t *self, PyObject *arg)
{
    return kvlpy_prep_make(self, Py_None, arg);
}

PyObject *kvlpy_agent_prep_remote(kvlpy_agent_t *self, PyObject *args);
PyObject *kvlpy_agent_prep_remote(kvlpy_agent_t *self, PyObject *args)
{
    PyObject *remote, *dl;
    if (!PyArg_ParseTuple(args, "UO:prep_remote", &remote, &dl))
        return NULL;
    return kvlpy_prep_make(self, remote, dl);
}

static void kvlpy_prep_free(kvlpy_prep_t *self)
{
    if (self->prep && kvlpy_owner_open(self->owner)) {
        kvl_prep_t *prep = self->prep;
        self->prep = NULL;
        kvl_prep_release(prep);
    }
    self->prep = NULL;
}

static PyObject *kvlpy_prep_release(kvlpy_prep_t *self, PyObject *unused)
{
    (void)unused;
    if (self->busy)
        return kvlpy_raise_msg(KVL_ERR_IN_USE, "the prepared list is in use by another thread",
                               "release it once the other call returned");
    kvlpy_prep_free(self);
    Py_RETURN_NONE;
}

static void kvlpy_prep_dealloc(kvlpy_prep_t *self)
{
    kvlpy_prep_free(self);
    Py_XDECREF(self->owner);
    Py_XDECREF(self->remote);
    PyObject_Free(self);
}

static int kvlpy_prep_bool(kvlpy_prep_t *self)
{
    return self->prep != NULL && kvlpy_owner_open(self->owner);
}

static Py_ssize_t kvlpy_prep_len(kvlpy_prep_t *self)
{
    if (!kvlpy_prep_bool(self))
        return 0;
    return (Py_ssize_t)kvl_prep_entries(self->prep);
}

static PyObject *kvlpy_prep_get_remote(kvlpy_prep_t *self, void *c)
{
    (void)c;
    return Py_NewRef(self->remote);
}

static PyObject *kvlpy_prep_get_valid(kvlpy_prep_t *self, void *c)
{
    (void)c;
    return PyBool_FromLong(kvlpy_prep_bool(self));
}

static PyObject *kvlpy_prep_repr(kvlpy_prep_t *self)
{
    const char *state = kvlpy_prep_bool(self) ? "" : ", released";
    if (self->remote == Py_None)
        return PyUnicode_FromFormat("<kvlane.Prep local: %zd entries%s>", kvlpy_prep_len(self),
                                    state);
    return PyUnicode_FromFormat("<kvlane.Prep remote %S: %zd entries%s>", self->remote,
                                kvlpy_prep_len(self), state);
}

static PyMethodDef kvlpy_prep_methods[] = {
    {"release", (PyCFunction)kvlpy_prep_release, METH_NOARGS, "Free the prepared list."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef kvlpy_prep_getset[] = {
    {"remote", (getter)kvlpy_prep_get_remote, NULL, "Remote agent name, None when local.", NULL},
    {"valid", (getter)kvlpy_prep_get_valid, NULL, "Not released and its agent open.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyNumberMethods kvlpy_prep_num = {.nb_bool = (inquiry)kvlpy_prep_bool};
static PySequenceMethods kvlpy_prep_seq = {.sq_length = (lenfunc)kvlpy_prep_len};

PyTypeObject kvlpy_prep_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlane._kvlane.Prep",
    .tp_basicsize = sizeof(kvlpy_prep_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A prepared descriptor list (Agent.prep_local / Agent.prep_remote).",
    .tp_dealloc = (destructor)kvlpy_prep_dealloc,
    .tp_methods = kvlpy_prep_methods,
    .tp_getset = kvlpy_prep_getset,
    .tp_as_number = &kvlpy_prep_num,
    .tp_as_sequence = &kvlpy_prep_seq,
    .tp_repr = (reprfunc)kvlpy_prep_repr,
};

/* ---- Xfer creation ------------------------------------------------------------ */

static int kvlpy_op_get(PyObject *o, kvl_xfer_op_t *op)
{
    if (PyLong_Check(o) && !PyBool_Check(o)) { /* True is no operation 1 (READ) */
        long v = PyLong_AsLong(o);
        if (v == KVL_READ || v == KVL_WRITE) {
            *op = (kvl_xfer_op_t)v;
            return 0;
        }
    } else if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        if (s && strcmp(s, "READ") == 0) {
            *op = KVL_READ;
            return 0;
        }
        if (s && strcmp(s, "WRITE") == 0) {
            *op = KVL_WRITE;
            return 0;
        }
    }
    PyErr_Clear();
    kvlpy_raise_msg(KVL_ERR_INVALID_ARG, "operation must be \"READ\" or \"WRITE\"", NULL);
    return -1;
}

/* Common optional parameters; msg must be released by the caller. */
typedef struct {
    kvl_xfer_params_t p;
    Py_buffer msg;
    int has_msg;
} kvlpy_xparams_t;

static int kvlpy_xparams_get(PyObject *notif, const char *backend, unsigned long long timeout_ms,
                             kvlpy_xparams_t *x)
{
    memset(x, 0, sizeof(*x));
    if (notif && notif != Py_None) {
        if (PyUnicode_Check(notif)) {
            Py_ssize_t n;
            const char *s = PyUnicode_AsUTF8AndSize(notif, &n);
            if (s == NULL || PyBuffer_FillInfo(&x->msg, notif, (void *)s, n, 1, PyBUF_SIMPLE) < 0)
                return -1;
        } else if (PyObject_GetBuffer(notif, &x->msg, PyBUF_SIMPLE) < 0) {
            return -1;
        }
        x->has_msg = 1;
        x->p.field_mask |= KVL_XFER_PARAM_NOTIF;
        x->p.notif = x->msg.buf;
        x->p.notif_len = (size_t)x->msg.len;
    }
    if (backend && backend[0]) {
        x->p.field_mask |= KVL_XFER_PARAM_BACKEND;
        x->p.backend = backend;
    }
    if (timeout_ms) {
        x->p.field_mask |= KVL_XFER_PARAM_TIMEOUT;
        x->p.timeout_ms = timeout_ms;
    }
    return 0;
}

static void kvlpy_xparams_free(kvlpy_xparams_t *x)
{
    if (x->has_msg)
        PyBuffer_Release(&x->msg);
}

static PyObject *kvlpy_xfer_wrap(kvlpy_agent_t *owner, kvl_xfer_t *xfer, kvl_xfer_op_t op,
                                 PyObject *remote)
{
    kvlpy_xfer_t *x = PyObject_New(kvlpy_xfer_t, &kvlpy_xfer_type);
    if (x == NULL) {
        kvl_xfer_release(xfer);
        return NULL;
    }
    x->owner = (kvlpy_agent_t *)Py_NewRef((PyObject *)owner);
    x->xfer = xfer;
    x->busy = 0;
    x->op = (int)op;
    x->remote = Py_NewRef(remote);
    return (PyObject *)x;
}

PyObject *kvlpy_agent_create_xfer(kvlpy_agent_t *self, PyObject *args, PyObject *kw);
PyObject *kvlpy_agent_create_xfer(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"op", "local", "remote", "remote_list", "notif", "backend",
                             "timeout_ms", NULL};
    PyObject *op_o, *remote, *notif = Py_None;
    kvlpy_dlist_t *local, *rlist;
    const char *backend = NULL;
    unsigned long long timeout_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!UO!|OzO&:create_xfer", kwlist, &op_o,
                                     &kvlpy_dlist_type, &local, &remote, &kvlpy_dlist_type,
                                     &rlist, &notif, &backend, kvlpy_u64_arg, &timeout_ms))
        return NULL;
    kvl_xfer_op_t op;
    if (kvlpy_op_get(op_o, &op) < 0)
        return NULL;
    if (local->dl == NULL || rlist->dl == NULL)
        return kvlpy_raise_msg(KVL_ERR_STATE, "DList.__init__ was not called", NULL);
    const char *rname = PyUnicode_AsUTF8(remote);
    if (rname == NULL)
        return NULL;
    kvlpy_xparams_t xp;
    if (kvlpy_xparams_get(notif, backend, timeout_ms, &xp) < 0)
        return NULL;
    if (kvlpy_agent_enter(self) < 0) {
        kvlpy_xparams_free(&xp);
        return NULL;
    }
    kvl_xfer_t *xfer = NULL;
    kvl_status_t st;
    kvlpy_dlist_hold(local);
    kvlpy_dlist_hold(rlist);
    Py_BEGIN_ALLOW_THREADS
    st = kvl_xfer_create(self->agent, op, local->dl, rname, rlist->dl, &xp.p, &xfer);
    Py_END_ALLOW_THREADS
    kvlpy_dlist_unhold(local);
    kvlpy_dlist_unhold(rlist);
    kvlpy_agent_leave(self);
    kvlpy_xparams_free(&xp);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return kvlpy_xfer_wrap(self, xfer, op, remote);
}

PyObject *kvlpy_agent_create_xfer_prepped(kvlpy_agent_t *self, PyObject *args, PyObject *kw);
PyObject *kvlpy_agent_create_xfer_prepped(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"op", "local", "local_idx", "remote", "remote_idx", "notif",
                             "backend", "timeout_ms", NULL};
    PyObject *op_o, *lidx_o, *ridx_o, *notif = Py_None;
    kvlpy_prep_t *lp, *rp;
    const char *backend = NULL;
    unsigned long long timeout_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!OO!O|OzO&:create_xfer_prepped", kwlist, &op_o,
                                     &kvlpy_prep_type, &lp, &lidx_o, &kvlpy_prep_type, &rp,
                                     &ridx_o, &notif, &backend, kvlpy_u64_arg, &timeout_ms))
        return NULL;
    kvl_xfer_op_t op;
    if (kvlpy_op_get(op_o, &op) < 0)
        return NULL;
    if (lp->owner != self || rp->owner != self)
        return kvlpy_raise_msg(KVL_ERR_INVALID_ARG, "a prepared list belongs to another agent",
                               NULL);
    if (!kvlpy_prep_bool(lp) || !kvlpy_prep_bool(rp))
        return kvlpy_raise_msg(KVL_ERR_STATE, "a prepared list was released",
                               "prepare it again (prep_local / prep_remote)");
    kvlpy_array_t li = {0}, ri = {0};
    const int64_t *lptr = NULL, *rptr = NULL;
    Py_ssize_t ln = -1, rn = -1;
    if (lidx_o != Py_None) {
        if (kvlpy_array_get(lidx_o, 1, "local_idx", &li) < 0)
            return NULL;
        lptr = li.data;
        ln = li.n;
    }
    if (ridx_o != Py_None) {
        if (kvlpy_array_get(ridx_o, 1, "remote_idx", &ri) < 0) {
            kvlpy_array_free(&li);
            return NULL;
        }
        rptr = ri.data;
        rn = ri.n;
    }
    size_t n;
    if (ln >= 0 && rn >= 0 && ln != rn) {
        kvlpy_array_free(&li);
        kvlpy_array_free(&ri);
        char what[160];
        snprintf(what, sizeof(what), "local_idx has %zd entries, remote_idx %zd", ln, rn);
        return kvlpy_raise_msg(KVL_ERR_INVALID_ARG, what, "pass index lists of equal length");
    }
    if (ln >= 0)
        n = (size_t)ln;
    else if (rn >= 0)
        n = (size_t)rn;
    else
        n = kvl_prep_entries(lp->prep);
    kvlpy_xparams_t xp;
    if (kvlpy_xparams_get(notif, backend, timeout_ms, &xp) < 0) {
        kvlpy_array_free(&li);
        kvlpy_array_free(&ri);
        return NULL;
    }
    if (kvlpy_agent_enter(self) < 0) {
        kvlpy_array_free(&li);
        kvlpy_array_free(&ri);
        kvlpy_xparams_free(&xp);
        return NULL;
    }
    kvl_xfer_t *xfer = NULL;
    kvl_status_t st;
    lp->busy++;
    rp->busy++;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_xfer_create_prepped(self->agent, op, lp->prep, lptr, rp->prep, rptr, n, &xp.p,
                                 &xfer);
    Py_END_ALLOW_THREADS
    lp->busy--;
    rp->busy--;
    kvlpy_agent_leave(self);
    kvlpy_array_free(&li);
    kvlpy_array_free(&ri);
    kvlpy_xparams_free(&xp);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return kvlpy_xfer_wrap(self, xfer, op, rp->remote);
}

/* ---- Xfer ------------------------------------------------------------------------ */

static int kvlpy_xfer_ok(kvlpy_xfer_t *self)
{
    if (self->xfer == NULL) {
        kvlpy_raise_msg(KVL_ERR_STATE, "the transfer was released", NULL);
        return -1;
    }
    if (!kvlpy_owner_open(self->owner)) {
        kvlpy_raise_msg(KVL_ERR_STATE, "the transfer's agent is closed", NULL);
        return -1;
    }
    return 0;
}

/* post() -> True when already complete, False while moving. */
PyObject *kvlpy_xfer_post(kvlpy_xfer_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_xfer_ok(self) < 0 || kvlpy_agent_enter(self->owner) < 0)
        return NULL;
    kvl_status_t st;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_xfer_post(self->xfer);
    Py_END_ALLOW_THREADS
    self->busy--;
    kvlpy_agent_leave(self->owner);
    if (st == KVL_OK)
        Py_RETURN_TRUE;
    if (st == KVL_IN_PROGRESS)
        Py_RETURN_FALSE;
    return kvlpy_raise(st, NULL);
}

/* test() -> True done, False moving; raises the transfer's error. */
PyObject *kvlpy_xfer_test(kvlpy_xfer_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_xfer_ok(self) < 0 || kvlpy_agent_enter(self->owner) < 0)
        return NULL;
    kvl_status_t st = kvl_xfer_test(self->xfer);
    kvlpy_agent_leave(self->owner);
    if (st == KVL_OK)
        Py_RETURN_TRUE;
    if (st == KVL_IN_PROGRESS)
        Py_RETURN_FALSE;
    return kvlpy_raise(st, NULL);
}

/* wait(timeout_ms=-1) -> True done, False still moving at the timeout. */
static PyObject *kvlpy_xfer_wait(kvlpy_xfer_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    double timeout_ms = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|d:wait", kwlist, &timeout_ms))
        return NULL;
    if (kvlpy_timeout_nan(timeout_ms))
        return NULL;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int64_t slice = KVLPY_WAIT_SLICE_MS;
        if (timeout_ms >= 0) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            double el = (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6;
            double left = timeout_ms - el;
            if (left < 0)
                left = 0;
            if (left < (double)slice)
                slice = (int64_t)left;
        }
        if (kvlpy_xfer_ok(self) < 0 || kvlpy_agent_enter(self->owner) < 0)
            return NULL;
        kvl_status_t st;
        self->busy++;
        Py_BEGIN_ALLOW_THREADS
        st = kvl_xfer_wait(self->xfer, slice);
        Py_END_ALLOW_THREADS
        self->busy--;
        kvlpy_agent_leave(self->owner);
        if (st == KVL_OK)
            Py_RETURN_TRUE;
        if (st != KVL_ERR_TIMEOUT)
            return kvlpy_raise(st, NULL);
        kvl_error_clear();
        if (PyErr_CheckSignals() < 0)
            return NULL;
        if (timeout_ms >= 0 && slice < KVLPY_WAIT_SLICE_MS)
            Py_RETURN_FALSE;
    }
}

static const char *kvlpy_state_name(kvl_xfer_state_t s)
{
    switch (s) {
    case KVL_XFER_IDLE: return "IDLE";
    case KVL_XFER_POSTED: return "POSTED";
    case KVL_XFER_DONE: return "DONE";
    case KVL_XFER_CANCELED: return "CANCELED";
    case KVL_XFER_ERROR: return "ERROR";
    }
    return "UNKNOWN";
}

/* cancel() -> "CANCELED" or "DONE" */
static PyObject *kvlpy_xfer_cancel(kvlpy_xfer_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_xfer_ok(self) < 0 || kvlpy_agent_enter(self->owner) < 0)
        return NULL;
    kvl_xfer_state_t state = KVL_XFER_IDLE;
    kvl_status_t st;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_xfer_cancel(self->xfer, &state);
    Py_END_ALLOW_THREADS
    self->busy--;
    kvlpy_agent_leave(self->owner);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return PyUnicode_FromString(kvlpy_state_name(state));
}

static void kvlpy_xfer_free(kvlpy_xfer_t *self)
{
    kvl_xfer_t *xfer = self->xfer;
    self->xfer = NULL;
    if (xfer == NULL || !kvlpy_owner_open(self->owner))
        return;
    /* Releasing cancels a transfer in flight, which may wait for the backend. */
    kvlpy_agent_t *owner = self->owner;
    owner->active++;
    Py_BEGIN_ALLOW_THREADS
    kvl_xfer_release(xfer);
    Py_END_ALLOW_THREADS
    owner->active--;
}

static PyObject *kvlpy_xfer_release(kvlpy_xfer_t *self, PyObject *unused)
{
    (void)unused;
    if (self->busy)
        return kvlpy_raise_msg(KVL_ERR_IN_USE, "the transfer is in use by another thread",
                               "release it once the other call (wait, post, cancel) returned");
    kvlpy_xfer_free(self);
    Py_RETURN_NONE;
}

static void kvlpy_xfer_dealloc(kvlpy_xfer_t *self)
{
    PyObject *exc = kvlpy_err_take();
    kvlpy_xfer_free(self);
    kvlpy_err_give(exc);
    Py_XDECREF(self->owner);
    Py_XDECREF(self->remote);
    PyObject_Free(self);
}

static PyObject *kvlpy_xfer_get_state(kvlpy_xfer_t *self, void *c)
{
    (void)c;
    if (kvlpy_xfer_ok(self) < 0)
        return NULL;
    return PyUnicode_FromString(kvlpy_state_name(kvl_xfer_state(self->xfer)));
}

static PyObject *kvlpy_xfer_stats(kvlpy_xfer_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_xfer_ok(self) < 0)
        return NULL;
    kvl_xfer_stats_t s;
    memset(&s, 0, sizeof(s));
    kvl_error_clear();
    kvl_status_t st = kvl_xfer_get_stats(self->xfer, &s);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return Py_BuildValue("{sKsKsKsKsKssss}", "bytes", (unsigned long long)s.bytes, "blocks",
                         (unsigned long long)s.blocks, "segments", (unsigned long long)s.segments,
                         "post_ns", (unsigned long long)s.post_ns, "duration_ns",
                         (unsigned long long)s.duration_ns, "backend", s.backend, "path", s.path);
}

static int kvlpy_xfer_bool(kvlpy_xfer_t *self)
{
    return self->xfer != NULL && kvlpy_owner_open(self->owner);
}

static PyObject *kvlpy_xfer_get_valid(kvlpy_xfer_t *self, void *c)
{
    (void)c;
    return PyBool_FromLong(kvlpy_xfer_bool(self));
}

static PyObject *kvlpy_xfer_get_op(kvlpy_xfer_t *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(self->op == KVL_READ ? "READ" : "WRITE");
}

static PyObject *kvlpy_xfer_get_remote(kvlpy_xfer_t *self, void *c)
{
    (void)c;
    return Py_NewRef(self->remote);
}

static PyObject *kvlpy_xfer_repr(kvlpy_xfer_t *self)
{
    const char *state = "released";
    if (kvlpy_xfer_bool(self))
        state = kvlpy_state_name(kvl_xfer_state(self->xfer));
    return PyUnicode_FromFormat("<kvlane.Xfer %s %R: %s>",
                                self->op == KVL_READ ? "READ from" : "WRITE to", self->remote,
                                state);
}

static PyMethodDef kvlpy_xfer_methods[] = {
    {"post", (PyCFunction)kvlpy_xfer_post, METH_NOARGS,
     "Start moving: True when already complete, False while moving."},
    {"test", (PyCFunction)kvlpy_xfer_test, METH_NOARGS,
     "True when done, False while moving; raises the transfer's error."},
    {"wait", KVLPY_FN(kvlpy_xfer_wait), METH_VARARGS | METH_KEYWORDS,
     "wait(timeout_ms=-1): True done, False still moving at the timeout."},
    {"cancel", (PyCFunction)kvlpy_xfer_cancel, METH_NOARGS,
     "Cancel: returns 'CANCELED' (nothing more lands) or 'DONE' (completed first)."},
    {"release", (PyCFunction)kvlpy_xfer_release, METH_NOARGS,
     "Release (cancels a transfer in flight)."},
    {"stats", (PyCFunction)kvlpy_xfer_stats, METH_NOARGS,
     "{bytes, blocks, segments, post_ns, duration_ns, backend, path}"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef kvlpy_xfer_getset[] = {
    {"state", (getter)kvlpy_xfer_get_state, NULL,
     "'IDLE', 'POSTED', 'DONE', 'CANCELED' or 'ERROR'.", NULL},
    {"valid", (getter)kvlpy_xfer_get_valid, NULL, "Not released and its agent open.", NULL},
    {"op", (getter)kvlpy_xfer_get_op, NULL, "'READ' or 'WRITE'.", NULL},
    {"remote", (getter)kvlpy_xfer_get_remote, NULL, "Remote agent name.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyNumberMethods kvlpy_xfer_num = {.nb_bool = (inquiry)kvlpy_xfer_bool};

PyTypeObject kvlpy_xfer_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlane._kvlane.Xfer",
    .tp_basicsize = sizeof(kvlpy_xfer_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A transfer (Agent.create_xfer / Agent.create_xfer_prepped).",
    .tp_dealloc = (destructor)kvlpy_xfer_dealloc,
    .tp_methods = kvlpy_xfer_methods,
    .tp_getset = kvlpy_xfer_getset,
    .tp_as_number = &kvlpy_xfer_num,
    .tp_repr = (reprfunc)kvlpy_xfer_repr,
};
