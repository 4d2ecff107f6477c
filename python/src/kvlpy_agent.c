/*
 * kvlane._kvlane.Agent: agent, backends, registration, metadata,
 * notifications and the listener.
 */
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kvlpy.h"

static kvlpy_agent_t *kvlpy_live_head;   /* newest first; no references held */

static void kvlpy_live_add(kvlpy_agent_t *a)
{
    a->live_prev = NULL;
    a->live_next = kvlpy_live_head;
    if (kvlpy_live_head)
        kvlpy_live_head->live_prev = a;
    kvlpy_live_head = a;
}

static void kvlpy_live_remove(kvlpy_agent_t *a)
{
    if (a->live_prev)
        a->live_prev->live_next = a->live_next;
    else if (kvlpy_live_head == a)
        kvlpy_live_head = a->live_next;
    if (a->live_next)
        a->live_next->live_prev = a->live_prev;
    a->live_prev = a->live_next = NULL;
}

int kvlpy_agent_enter(kvlpy_agent_t *a)
{
    if (a->agent != NULL && a->pid != kvlpy_getpid()) {
        kvlpy_raise_msg(KVL_ERR_STATE, "the agent was created by another process (fork)",
                        "create agents after fork, or start workers with the 'spawn' method");
        return -1;
    }
    if (a->agent == NULL || a->closing) {
        kvlpy_raise_msg(KVL_ERR_STATE, "the agent is closed",
                        "create a new Agent; objects of a closed agent cannot be used");
        return -1;
    }
    a->active++;
    kvl_error_clear();
    return 0;
}

void kvlpy_agent_leave(kvlpy_agent_t *a)
{
    a->active--;
}

static void kvlpy_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Destroy the C agent once no call runs without the GIL. Called with the
 * GIL. At interpreter finalization threads that still run a call cannot
 * come back for the GIL: the agent is then left to process exit (which
 * libkvlane handles cleanly) rather than waited for forever. */
static void kvlpy_agent_close(kvlpy_agent_t *a)
{
    if (a->agent == NULL || a->closing)
        return;
    if (a->pid != kvlpy_getpid()) {
        /* A forked child: the agent's threads live in the parent only. */
        kvlpy_live_remove(a);
        a->agent = NULL;
        return;
    }
    a->closing = 1;
    while (a->active > 0) {
        if (kvlpy_finalizing()) {
            kvlpy_live_remove(a);
            a->agent = NULL;
            return;
        }
        Py_BEGIN_ALLOW_THREADS
        kvlpy_sleep_ms(1);
        Py_END_ALLOW_THREADS
    }
    kvl_agent_t *agent = a->agent;
    Py_BEGIN_ALLOW_THREADS
    kvl_agent_destroy(agent);
    Py_END_ALLOW_THREADS
    a->agent = NULL;
    kvlpy_live_remove(a);
}

void kvlpy_agents_shutdown(void)
{
    while (kvlpy_live_head) {
        kvlpy_agent_t *a = kvlpy_live_head;
        Py_INCREF(a);
        kvlpy_agent_close(a);
        kvlpy_live_remove(a);   /* closed or abandoned: never visited twice */
        Py_DECREF(a);
    }
}

/* ---- lifecycle ------------------------------------------------------------ */

static PyObject *kvlpy_agent_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    kvlpy_agent_t *a = (kvlpy_agent_t *)type->tp_alloc(type, 0);
    return (PyObject *)a;
}

static int kvlpy_agent_init(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "backends", "timeout_ms", "secret", "workers",
                             "notif_max_bytes", "notif_max_msgs", "notif_peer_percent", NULL};
    const char *name;
    PyObject *backends = NULL;
    unsigned long long timeout_ms = 0, notif_max_bytes = 0, notif_max_msgs = 0;
    const char *secret = NULL;
    unsigned int workers = 0, notif_peer_percent = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OO&zO&O&O&O&:Agent", kwlist, &name, &backends,
                                     kvlpy_u64_arg, &timeout_ms, &secret, kvlpy_u32_arg,
                                     &workers, kvlpy_u64_arg, &notif_max_bytes, kvlpy_u64_arg,
                                     &notif_max_msgs, kvlpy_u32_arg, &notif_peer_percent))
        return -1;
    if (self->agent != NULL || self->closing) {
        /* closing: a closed agent; a new C agent would stay unusable (every
         * call sees it closing) and never be destroyed */
        kvlpy_raise_msg(KVL_ERR_EXISTS, "Agent.__init__ called twice",
                        "create a new Agent (a closed one cannot be opened again)");
        return -1;
    }
    PyObject *bk_str = NULL;
    if (backends == NULL || backends == Py_None) {
        bk_str = PyUnicode_FromString("shm");
    } else if (PyUnicode_Check(backends)) {
        bk_str = Py_NewRef(backends);
    } else {
        PyObject *sep = PyUnicode_FromString(",");
        if (sep == NULL)
            return -1;
        bk_str = PyUnicode_Join(sep, backends);
        Py_DECREF(sep);
    }
    if (bk_str == NULL)
        return -1;
    const char *bk = PyUnicode_AsUTF8(bk_str);
    if (bk == NULL) {
        Py_DECREF(bk_str);
        return -1;
    }
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = bk};
    if (timeout_ms) {
        cfg.field_mask |= KVL_AGENT_CFG_TIMEOUT;
        cfg.timeout_ms = timeout_ms;
    }
    if (workers) {
        cfg.field_mask |= KVL_AGENT_CFG_WORKERS;
        cfg.workers = workers;
    }
    if (secret) {
        cfg.field_mask |= KVL_AGENT_CFG_SECRET;
        cfg.secret = secret;
    }
    if (notif_max_bytes || notif_max_msgs) {
        cfg.field_mask |= KVL_AGENT_CFG_NOTIF_BOUND;
        cfg.notif_max_bytes = notif_max_bytes;
        cfg.notif_max_msgs = notif_max_msgs;
    }
    if (notif_peer_percent) {
        cfg.field_mask |= KVL_AGENT_CFG_NOTIF_SHARE;
        cfg.notif_peer_percent = notif_peer_percent;
    }
    kvl_agent_t *agent = NULL;
    kvl_status_t st;
    kvl_error_clear();
    Py_BEGIN_ALLOW_THREADS
    st = kvl_agent_create(name, &cfg, &agent);
    Py_END_ALLOW_THREADS
    Py_DECREF(bk_str);
    if (st != KVL_OK) {
        kvlpy_raise(st, NULL);
        return -1;
    }
    self->agent = agent;
    self->pid = kvlpy_getpid();
    kvlpy_live_add(self);
    return 0;
}

static void kvlpy_agent_dealloc(kvlpy_agent_t *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    /* Off the list of live agents before the close drops the GIL: another
     * thread's kvlpy_agents_shutdown() would otherwise take this object,
     * whose count is zero, and free it a second time. */
    kvlpy_live_remove(self);
    if (self->agent) {
        PyObject *exc = kvlpy_err_take();
        kvlpy_agent_close(self);
        kvlpy_err_give(exc);
    }
    kvlpy_live_remove(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *kvlpy_agent_close_m(kvlpy_agent_t *self, PyObject *unused)
{
    (void)unused;
    kvlpy_agent_close(self);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_get_name(kvlpy_agent_t *self, void *c)
{
    (void)c;
    if (self->agent == NULL)
        return kvlpy_raise_msg(KVL_ERR_STATE, "the agent is closed", NULL);
    return PyUnicode_FromString(kvl_agent_name(self->agent));
}

static PyObject *kvlpy_agent_get_incarnation(kvlpy_agent_t *self, void *c)
{
    (void)c;
    if (self->agent == NULL)
        return kvlpy_raise_msg(KVL_ERR_STATE, "the agent is closed", NULL);
    return PyLong_FromUnsignedLongLong(kvl_agent_incarnation(self->agent));
}

static PyObject *kvlpy_agent_get_closed(kvlpy_agent_t *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->agent == NULL || self->closing);
}

/* ---- backends --------------------------------------------------------------- */

static PyObject *kvlpy_agent_create_backend(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "params", NULL};
    const char *name;
    PyObject *params = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:create_backend", kwlist, &name, &params))
        return NULL;
    kvl_param_t prm[32];
    size_t np = 0;
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return NULL;
    if (params && params != Py_None) {
        if (!PyDict_Check(params)) {
            Py_DECREF(keep);
            PyErr_SetString(PyExc_TypeError, "params must be a dict of str to str");
            return NULL;
        }
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(params, &pos, &k, &v)) {
            if (np == sizeof(prm) / sizeof(prm[0])) {
                Py_DECREF(keep);
                PyErr_SetString(PyExc_ValueError, "at most 32 backend parameters");
                return NULL;
            }
            PyObject *ks = PyObject_Str(k), *vs = PyObject_Str(v);
            if (ks == NULL || vs == NULL || PyList_Append(keep, ks) < 0 ||
                PyList_Append(keep, vs) < 0) {
                Py_XDECREF(ks);
                Py_XDECREF(vs);
                Py_DECREF(keep);
                return NULL;
            }
            prm[np].key = PyUnicode_AsUTF8(ks);
            prm[np].value = PyUnicode_AsUTF8(vs);
            Py_DECREF(ks);
            Py_DECREF(vs);
            if (prm[np].key == NULL || prm[np].value == NULL) {
                Py_DECREF(keep);
                return NULL;
            }
            np++;
        }
    }
    if (kvlpy_agent_enter(self) < 0) {
        Py_DECREF(keep);
        return NULL;
    }
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_backend_create(self->agent, name, prm, np, NULL);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    Py_DECREF(keep);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_backends(kvlpy_agent_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_backend_t *bk[64];
    size_t n = kvl_agent_backends(self->agent, bk, 64);
    kvlpy_agent_leave(self);
    PyObject *l = PyList_New(0);
    for (size_t i = 0; l && i < n && i < 64; i++) {
        PyObject *s = PyUnicode_FromString(kvl_backend_name(bk[i]));
        if (s == NULL || PyList_Append(l, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(l);
            break;
        }
        Py_DECREF(s);
    }
    return l;
}

/* ---- registration ------------------------------------------------------------- */

/* (text, [(addr, len, kind, dev, status, reused, [(backend, status, detail)])]) */
/* ---- RegReport: a registration report, turned into Python objects only
 * when read (a list of 1,000 regions registered by an engine is never
 * looked at unless something fails). ---- */

typedef struct {
    PyObject_HEAD
    kvl_reg_report_t *rep;
} kvlpy_report_t;

static void kvlpy_report_dealloc(kvlpy_report_t *self)
{
    kvl_reg_report_free(self->rep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* text() -> the readable table (kvl_reg_report_render). */
static PyObject *kvlpy_report_text(kvlpy_report_t *self, PyObject *unused)
{
    (void)unused;
    size_t need = kvl_reg_report_render(self->rep, NULL, 0);
    char *text = PyMem_Malloc(need + 1);
    if (text == NULL)
        return PyErr_NoMemory();
    kvl_reg_report_render(self->rep, text, need + 1);
    PyObject *r = PyUnicode_FromStringAndSize(text, (Py_ssize_t)need);
    PyMem_Free(text);
    return r;
}

/* entries() -> [(addr, len, kind, dev, status, reused, [(backend, status, detail)])]. */
static PyObject *kvlpy_report_entries(kvlpy_report_t *self, PyObject *unused)
{
    (void)unused;
    const kvl_reg_report_t *rep = self->rep;
    PyObject *entries = PyList_New((Py_ssize_t)rep->n_entries);
    if (entries == NULL)
        return NULL;
    for (size_t i = 0; i < rep->n_entries; i++) {
        const kvl_reg_entry_t *e = &rep->entries[i];
        unsigned no = e->n_outcomes < KVL_REG_MAX_OUTCOMES ? e->n_outcomes : KVL_REG_MAX_OUTCOMES;
        PyObject *outs = PyList_New(no);
        if (outs == NULL)
            goto fail;
        for (unsigned j = 0; j < no; j++) {
            const kvl_reg_outcome_t *o = &e->outcomes[j];
            PyObject *t = Py_BuildValue("(sis)", o->backend, o->status, o->detail);
            if (t == NULL) {
                Py_DECREF(outs);
                goto fail;
            }
            PyList_SET_ITEM(outs, j, t);
        }
        PyObject *t = Py_BuildValue("(KKsiiiN)", (unsigned long long)e->addr,
                                    (unsigned long long)e->len, kvl_mem_kind_name(e->kind),
                                    (int)e->dev, e->status, e->reused, outs);
        if (t == NULL)
            goto fail;
        PyList_SET_ITEM(entries, (Py_ssize_t)i, t);
    }
    return entries;
fail:
    Py_DECREF(entries);
    return NULL;
}

static Py_ssize_t kvlpy_report_len(kvlpy_report_t *self)
{
    return (Py_ssize_t)self->rep->n_entries;
}

static PyMethodDef kvlpy_report_methods[] = {
    {"text", (PyCFunction)kvlpy_report_text, METH_NOARGS, "The readable table."},
    {"entries", (PyCFunction)kvlpy_report_entries, METH_NOARGS,
     "[(addr, len, kind, dev, status, reused, [(backend, status, detail)])]"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods kvlpy_report_seq = {
    .sq_length = (lenfunc)kvlpy_report_len,
};

PyTypeObject kvlpy_report_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvlane._kvlane.RegReport",
    .tp_basicsize = sizeof(kvlpy_report_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A registration report as kvlane returned it (read through "
              "kvlane.RegistrationReport).",
    .tp_dealloc = (destructor)kvlpy_report_dealloc,
    .tp_methods = kvlpy_report_methods,
    .tp_as_sequence = &kvlpy_report_seq,
};

/* Owns rep from here on (freed with the object, or now on failure). */
static PyObject *kvlpy_report_wrap(kvl_reg_report_t *rep)
{
    if (rep == NULL)
        Py_RETURN_NONE;
    kvlpy_report_t *r = PyObject_New(kvlpy_report_t, &kvlpy_report_type);
    if (r == NULL) {
        kvl_reg_report_free(rep);
        return NULL;
    }
    r->rep = rep;
    return (PyObject *)r;
}

/* Names from None, a str ("shm,tcp") or a sequence of str. keep holds the
 * strings alive. */
static int kvlpy_names_get(PyObject *obj, const char **names, size_t max, size_t *n_p,
                           PyObject *keep)
{
    *n_p = 0;
    if (obj == NULL || obj == Py_None)
        return 0;
    PyObject *seq;
    if (PyUnicode_Check(obj)) {
        PyObject *sep = PyUnicode_FromString(",");
        seq = sep ? PyUnicode_Split(obj, sep, -1) : NULL;
        Py_XDECREF(sep);
    } else {
        seq = PySequence_List(obj);
    }
    if (seq == NULL)
        return -1;
    if (PyList_Append(keep, seq) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    Py_DECREF(seq);
    Py_ssize_t n = PyList_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s = PyUnicode_Check(PyList_GET_ITEM(seq, i))
                            ? PyUnicode_AsUTF8(PyList_GET_ITEM(seq, i)) : NULL;
        if (s == NULL) {
            PyErr_SetString(PyExc_TypeError, "backend names must be str");
            return -1;
        }
        if (s[0] == 0)
            continue;
        if (*n_p == max) {
            PyErr_SetString(PyExc_ValueError, "too many backend names");
            return -1;
        }
        names[(*n_p)++] = s;
    }
    return 0;
}

/* dev=None: keep each region's device; an int: use it for every region. */
static int kvlpy_dev_override(PyObject *o, int32_t *dev)
{
    if (o == Py_None)
        return 0;
    return kvlpy_dev_obj(o, -1, dev);
}

PyObject *kvlpy_agent_register_rows(kvlpy_agent_t *self, PyObject *regions,
                                    const kvl_reg_params_t *prm, int32_t dev, int force_dev)
{
    size_t n;
    kvl_mem_desc_t *d = kvlpy_regions_get(regions, dev, force_dev, &n);
    if (d == NULL)
        return NULL;
    if (kvlpy_agent_enter(self) < 0) {
        PyMem_Free(d);
        return NULL;
    }
    kvl_reg_report_t *rep = NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_mem_register(self->agent, d, n, prm, &rep);
    Py_END_ALLOW_THREADS
    kvl_error_t *err = NULL;
    if (st != KVL_OK) {
        /* Building the report may call into libkvlane: keep the error. */
        err = PyMem_Malloc(sizeof(*err));
        if (err)
            memcpy(err, kvl_last_error(), sizeof(*err));
    }
    kvlpy_agent_leave(self);
    PyMem_Free(d);
    PyObject *r = kvlpy_report_wrap(rep);
    if (st != KVL_OK) {
        if (r == NULL) {
            PyErr_Clear();
            r = Py_NewRef(Py_None);
        }
        kvlpy_raise_err(err, st, r);
        PyMem_Free(err);
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *kvlpy_agent_register(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"regions", "kind", "backends", "strict", "dev", NULL};
    PyObject *regions, *kind_o = NULL, *bk_o = NULL, *dev_o = Py_None;
    int strict = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOpO:_register", kwlist, &regions, &kind_o,
                                     &bk_o, &strict, &dev_o))
        return NULL;
    int32_t dev = KVL_DEV_ANY;
    if (kvlpy_dev_override(dev_o, &dev) < 0)
        return NULL;
    kvl_reg_params_t prm = {.field_mask = KVL_REG_PARAM_KIND | KVL_REG_PARAM_POLICY};
    if (kvlpy_kind_get(kind_o, &prm.kind) < 0)
        return NULL;
    prm.policy = strict ? KVL_REG_ALL : KVL_REG_ANY;
    const char *names[16];
    PyObject *keep = NULL; /* the names' strings, when backends are named */
    if (bk_o != NULL && bk_o != Py_None &&
        ((keep = PyList_New(0)) == NULL ||
         kvlpy_names_get(bk_o, names, 16, &prm.n_backends, keep) < 0)) {
        Py_XDECREF(keep);
        return NULL;
    }
    if (prm.n_backends) {
        prm.field_mask |= KVL_REG_PARAM_BACKENDS;
        prm.backends = names;
    }
    PyObject *r = kvlpy_agent_register_rows(self, regions, &prm, dev, dev_o != Py_None);
    Py_XDECREF(keep);
    return r;
}

PyObject *kvlpy_agent_deregister_rows(kvlpy_agent_t *self, PyObject *regions, int32_t dev,
                                      int force_dev)
{
    size_t n;
    kvl_mem_desc_t *d = kvlpy_regions_get(regions, dev, force_dev, &n);
    if (d == NULL)
        return NULL;
    if (kvlpy_agent_enter(self) < 0) {
        PyMem_Free(d);
        return NULL;
    }
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_mem_deregister(self->agent, d, n);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    PyMem_Free(d);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_deregister(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"regions", "dev", NULL};
    PyObject *regions, *dev_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:_deregister", kwlist, &regions, &dev_o))
        return NULL;
    int32_t dev = KVL_DEV_ANY;
    if (kvlpy_dev_override(dev_o, &dev) < 0)
        return NULL;
    return kvlpy_agent_deregister_rows(self, regions, dev, dev_o != Py_None);
}

/* query_range(addr, len) -> None, or (kind, dev, addr, len, [backends]) of the
 * registered region containing the range. */
static PyObject *kvlpy_agent_query_range(kvlpy_agent_t *self, PyObject *args)
{
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "O&O&:query_range", kvlpy_u64_arg, &addr, kvlpy_u64_arg, &len))
        return NULL;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_mem_info_t info;
    kvl_error_clear();
    kvl_status_t st = kvl_mem_query(self->agent, addr, len, &info);
    kvlpy_agent_leave(self);
    if (st == KVL_ERR_NOT_FOUND)
        Py_RETURN_NONE;
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    PyObject *list;
    if (info.backends[0]) {
        PyObject *names = PyUnicode_FromString(info.backends), *sep = PyUnicode_FromString(",");
        list = (names && sep) ? PyUnicode_Split(names, sep, -1) : NULL;
        Py_XDECREF(names);
        Py_XDECREF(sep);
    } else {
        list = PyList_New(0);
    }
    if (list == NULL)
        return NULL;
    return Py_BuildValue("(siKKN)", kvl_mem_kind_name(info.kind), (int)info.dev,
                         (unsigned long long)info.addr, (unsigned long long)info.len, list);
}

/* ---- metadata ------------------------------------------------------------------ */

static PyObject *kvlpy_agent_get_metadata(kvlpy_agent_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    void *blob = NULL;
    size_t len = 0;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_metadata_get(self->agent, &blob, &len);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    PyObject *b = PyBytes_FromStringAndSize(blob, (Py_ssize_t)len);
    kvl_free(blob);
    return b;
}

/* get_partial_metadata(dlist=None, inc_conn_info=False, backends=None) -> bytes */
static PyObject *kvlpy_agent_get_partial_metadata(kvlpy_agent_t *self, PyObject *args,
                                                 PyObject *kw)
{
    static char *kwlist[] = {"dlist", "inc_conn_info", "backends", NULL};
    PyObject *dl_o = Py_None, *bk_o = Py_None;
    int conn = 0;
    const char *names[16];
    size_t nb = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OpO:get_partial_metadata", kwlist, &dl_o, &conn,
                                     &bk_o))
        return NULL;
    kvlpy_dlist_t *dl_h = NULL;
    if (dl_o != Py_None) {
        if (!PyObject_TypeCheck(dl_o, &kvlpy_dlist_type)) {
            PyErr_SetString(PyExc_TypeError, "a kvlane.DList or None is needed");
            return NULL;
        }
        dl_h = (kvlpy_dlist_t *)dl_o;
        if (dl_h->dl == NULL)
            return kvlpy_raise_msg(KVL_ERR_STATE, "DList.__init__ was not called", NULL);
    }
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return NULL;
    if (kvlpy_names_get(bk_o, names, 16, &nb, keep) < 0 || kvlpy_agent_enter(self) < 0) {
        Py_DECREF(keep);
        return NULL;
    }
    void *blob = NULL;
    size_t len = 0;
    kvl_status_t st;
    /* The list's C pointer is read only now: reading the backend names may
     * have run Python code that called the DList's __init__ again, which
     * freed the list it had. */
    kvl_dlist_t *dl = dl_h != NULL ? dl_h->dl : NULL;
    if (dl_h != NULL)
        kvlpy_dlist_hold(dl_h);
    Py_BEGIN_ALLOW_THREADS
    st = kvl_metadata_get_partial(self->agent, dl, conn != 0, nb ? names : NULL, nb, &blob, &len);
    Py_END_ALLOW_THREADS
    if (dl_h != NULL)
        kvlpy_dlist_unhold(dl_h);
    kvlpy_agent_leave(self);
    Py_DECREF(keep);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    PyObject *b = PyBytes_FromStringAndSize(blob, (Py_ssize_t)len);
    kvl_free(blob);
    return b;
}

static PyObject *kvlpy_agent_load_metadata(kvlpy_agent_t *self, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    if (kvlpy_agent_enter(self) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    char name[KVL_NAME_MAX] = "";
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_metadata_load(self->agent, v.buf, (size_t)v.len, name, sizeof(name));
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    PyBuffer_Release(&v);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return PyUnicode_FromString(name);
}

typedef kvl_status_t (*kvlpy_name_fn)(kvl_agent_t *, const char *);

static PyObject *kvlpy_agent_name_call(kvlpy_agent_t *self, PyObject *arg, kvlpy_name_fn fn,
                                       int bool_result)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->agent, name);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (bool_result) {
        if (st == KVL_OK)
            Py_RETURN_TRUE;
        if (st == KVL_ERR_NOT_FOUND) {
            kvl_error_clear();
            Py_RETURN_FALSE;
        }
    }
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_remove_remote(kvlpy_agent_t *self, PyObject *arg)
{
    return kvlpy_agent_name_call(self, arg, kvl_remote_remove, 0);
}

static PyObject *kvlpy_agent_check_remote(kvlpy_agent_t *self, PyObject *arg)
{
    return kvlpy_agent_name_call(self, arg, kvl_remote_check, 1);
}

static PyObject *kvlpy_agent_remote_incarnation(kvlpy_agent_t *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || kvlpy_agent_enter(self) < 0)
        return NULL;
    uint64_t inc = kvl_remote_incarnation(self->agent, name);
    kvlpy_agent_leave(self);
    return PyLong_FromUnsignedLongLong(inc);
}

static PyObject *kvlpy_agent_remote_regions(kvlpy_agent_t *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || kvlpy_agent_enter(self) < 0)
        return NULL;
    size_t n = 0, cap = 0;
    kvl_mem_desc_t *d = NULL;
    kvl_mem_kind_t *k = NULL;
    kvl_status_t st;
    for (;;) {
        st = kvl_remote_regions(self->agent, name, d, k, cap, &n);
        if (st != KVL_OK || n <= cap)
            break;
        PyMem_Free(d);
        PyMem_Free(k);
        cap = n + 16;
        d = PyMem_Malloc(cap * sizeof(*d));
        k = PyMem_Malloc(cap * sizeof(*k));
        if (d == NULL || k == NULL) {
            kvlpy_agent_leave(self);
            PyMem_Free(d);
            PyMem_Free(k);
            return PyErr_NoMemory();
        }
    }
    kvlpy_agent_leave(self);
    if (st != KVL_OK) {
        PyMem_Free(d);
        PyMem_Free(k);
        return kvlpy_raise(st, NULL);
    }
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *t = Py_BuildValue("(KKis)", (unsigned long long)d[i].addr,
                                    (unsigned long long)d[i].len, (int)d[i].dev,
                                    kvl_mem_kind_name(k[i]));
        if (t == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    PyMem_Free(d);
    PyMem_Free(k);
    return l;
}

static PyObject *kvlpy_agent_describe_remote(kvlpy_agent_t *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || kvlpy_agent_enter(self) < 0)
        return NULL;
    char small[1024];
    size_t need = kvl_remote_describe(self->agent, name, small, sizeof(small));
    PyObject *r;
    if (need < sizeof(small)) {
        r = PyUnicode_FromString(small);
    } else {
        char *big = PyMem_Malloc(need + 1);
        if (big == NULL) {
            kvlpy_agent_leave(self);
            return PyErr_NoMemory();
        }
        kvl_remote_describe(self->agent, name, big, need + 1);
        r = PyUnicode_FromString(big);
        PyMem_Free(big);
    }
    kvlpy_agent_leave(self);
    return r;
}

/* ---- notifications ----------------------------------------------------------------- */

static PyObject *kvlpy_agent_send_notif(kvlpy_agent_t *self, PyObject *args)
{
    const char *remote;
    Py_buffer msg;
    if (!PyArg_ParseTuple(args, "ss*:send_notif", &remote, &msg))
        return NULL;
    if (kvlpy_agent_enter(self) < 0) {
        PyBuffer_Release(&msg);
        return NULL;
    }
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_notif_send(self->agent, remote, msg.buf, (size_t)msg.len);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    PyBuffer_Release(&msg);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* The queue of notifications not taken yet and its bound, as a dict. */
static PyObject *kvlpy_agent_notif_queue_info(kvlpy_agent_t *self, PyObject *noargs)
{
    (void)noargs;
    kvl_notif_queue_info_t q;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st = kvl_notif_queue_info(self->agent, &q);
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "msgs",
                         (unsigned long long)q.msgs,
                         "bytes", (unsigned long long)q.bytes, "max_msgs",
                         (unsigned long long)q.max_msgs, "max_bytes",
                         (unsigned long long)q.max_bytes, "refused",
                         (unsigned long long)q.refused, "reserved_msgs",
                         (unsigned long long)q.reserved_msgs, "reserved_bytes",
                         (unsigned long long)q.reserved_bytes, "max_peer_msgs",
                         (unsigned long long)q.max_peer_msgs, "max_peer_bytes",
                         (unsigned long long)q.max_peer_bytes);
}

/* [(from, bytes)], up to max (all when max < 0). */
static PyObject *kvlpy_agent_poll_notifs(kvlpy_agent_t *self, PyObject *args)
{
    Py_ssize_t max = -1;
    if (!PyArg_ParseTuple(args, "|n:poll_notifs", &max))
        return NULL;
    PyObject *l = PyList_New(0);
    if (l == NULL || kvlpy_agent_enter(self) < 0) {
        Py_XDECREF(l);
        return NULL;
    }
    kvl_notif_t batch[64];
    for (;;) {
        size_t want = 64, got = 0;
        if (max >= 0) {
            Py_ssize_t left = max - PyList_GET_SIZE(l);
            if (left <= 0)
                break;
            if ((size_t)left < want)
                want = (size_t)left;
        }
        kvl_status_t st = kvl_notif_poll(self->agent, batch, want, &got);
        if (st != KVL_OK) {
            kvlpy_agent_leave(self);
            Py_DECREF(l);
            return kvlpy_raise(st, NULL);
        }
        int failed = 0;
        for (size_t i = 0; i < got; i++) {
            if (!failed) {
                PyObject *t = Py_BuildValue("(sy#)", batch[i].from, (const char *)batch[i].msg,
                                            (Py_ssize_t)batch[i].len);
                if (t == NULL || PyList_Append(l, t) < 0)
                    failed = 1;
                Py_XDECREF(t);
            }
            kvl_notif_free(&batch[i]);
        }
        if (failed) {
            kvlpy_agent_leave(self);
            Py_DECREF(l);
            return NULL;
        }
        if (got < want)
            break;
    }
    kvlpy_agent_leave(self);
    return l;
}

/* Wait for a notification: True when one is waiting, False on timeout.
 * timeout_ms < 0 waits forever (in slices, so Ctrl-C and close work). */
static PyObject *kvlpy_agent_wait_notif(kvlpy_agent_t *self, PyObject *args)
{
    double timeout_ms = -1;
    if (!PyArg_ParseTuple(args, "|d:wait_notif", &timeout_ms))
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
        if (kvlpy_agent_enter(self) < 0)
            return NULL;
        kvl_status_t st;
        Py_BEGIN_ALLOW_THREADS
        st = kvl_notif_wait(self->agent, slice);
        Py_END_ALLOW_THREADS
        kvlpy_agent_leave(self);
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

/* ---- listener ---------------------------------------------------------------------- */

static PyObject *kvlpy_no_listener(void)
{
    return kvlpy_raise_msg(KVL_ERR_UNSUPPORTED,
                           "the agent listener is not in the libkvlane this module was built with",
                           "rebuild kvlane with the listener (src/store/); until then exchange "
                           "get_metadata()/load_metadata() bytes yourself");
}

static PyObject *kvlpy_agent_listen(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"host", "port", NULL};
    const char *host = "0.0.0.0";
    int port = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|si:listen", kwlist, &host, &port))
        return NULL;
    kvl_status_t (*fn)(kvl_agent_t *, const char *, uint16_t, char *, size_t) = kvl_agent_listen;
    if (fn == NULL)
        return kvlpy_no_listener();
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port %d is not in 0..65535", port);
        return NULL;
    }
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    char bound[256] = "";
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->agent, host, (uint16_t)port, bound, sizeof(bound));
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return PyUnicode_FromString(bound);
}

static PyObject *kvlpy_agent_fetch_metadata(kvlpy_agent_t *self, PyObject *arg)
{
    kvl_status_t (*fn)(kvl_agent_t *, const char *, char *, size_t) = kvl_metadata_fetch;
    if (fn == NULL)
        return kvlpy_no_listener();
    const char *hp = PyUnicode_AsUTF8(arg);
    if (hp == NULL || kvlpy_agent_enter(self) < 0)
        return NULL;
    char name[KVL_NAME_MAX] = "";
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->agent, hp, name, sizeof(name));
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return PyUnicode_FromString(name);
}

static PyObject *kvlpy_agent_push_metadata(kvlpy_agent_t *self, PyObject *arg)
{
    kvl_status_t (*fn)(kvl_agent_t *, const char *) = kvl_metadata_push;
    if (fn == NULL)
        return kvlpy_no_listener();
    const char *hp = PyUnicode_AsUTF8(arg);
    if (hp == NULL || kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->agent, hp);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* push_partial_metadata('host:port', blob) */
static PyObject *kvlpy_agent_push_partial_metadata(kvlpy_agent_t *self, PyObject *args)
{
    kvl_status_t (*fn)(kvl_agent_t *, const char *, const void *, size_t) =
        kvl_metadata_push_partial;
    const char *hp;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "sy*:push_partial_metadata", &hp, &v))
        return NULL;
    if (fn == NULL) {
        PyBuffer_Release(&v);
        return kvlpy_no_listener();
    }
    if (kvlpy_agent_enter(self) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->agent, hp, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    PyBuffer_Release(&v);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_invalidate_metadata(kvlpy_agent_t *self, PyObject *args)
{
    const char *hp = NULL;
    if (!PyArg_ParseTuple(args, "|z:invalidate_metadata", &hp))
        return NULL;
    kvl_status_t (*fn)(kvl_agent_t *, const char *) = kvl_metadata_invalidate;
    if (fn == NULL)
        return kvlpy_no_listener();
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->agent, hp);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* ---- etcd ------------------------------------------------------------------------- */

static PyObject *kvlpy_agent_etcd_attach(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"endpoints", "prefix", "lease_ttl_s", "user", "password",
                             "timeout_ms", "cacert", "cert", "key", "verify_name", NULL};
    kvl_etcd_config_t c = {0};
    kvl_etcd_tls_t t = {.field_mask = KVL_ETCD_TLS_CA_FILE | KVL_ETCD_TLS_CERT_FILE |
                                      KVL_ETCD_TLS_KEY_FILE | KVL_ETCD_TLS_VERIFY_NAME,
                        .verify_name = 1};
    unsigned long long tmo = 0;
    int ttl = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zizzO&zzzp:etcd_attach", kwlist, &c.endpoints,
                                     &c.prefix, &ttl, &c.user, &c.password, kvlpy_u64_arg, &tmo,
                                     &t.ca_file,
                                     &t.cert_file, &t.key_file, &t.verify_name))
        return NULL;
    if (ttl < 0) {
        PyErr_Format(PyExc_ValueError, "lease_ttl_s %d is negative", ttl);
        return NULL;
    }
    if (c.user != NULL && c.user[0] == '\0')
        c.user = NULL;
    c.lease_ttl_s = (unsigned)ttl;
    c.timeout_ms = tmo;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_etcd_attach_tls(self->agent, &c, &t);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_etcd_publish(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"label", "blob", NULL};
    const char *label = NULL;
    Py_buffer v = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zz*:etcd_publish", kwlist, &label, &v))
        return NULL;
    if (kvlpy_agent_enter(self) < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = v.buf != NULL ? kvl_etcd_publish_partial(self->agent, label, v.buf, (size_t)v.len)
                       : kvl_etcd_publish(self->agent, label);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    PyBuffer_Release(&v);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* etcd_fetch (in the caller's thread) and etcd_fetch_async (in the
 * agent's background threads): the same arguments. */
static PyObject *kvlpy_agent_etcd_fetch_any(kvlpy_agent_t *self, PyObject *args, PyObject *kw,
                                            int background)
{
    static char *kwlist[] = {"name", "label", "wait_ms", NULL};
    const char *name, *label = NULL;
    unsigned long long wait_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, background ? "s|zO&:etcd_fetch_async"
                                                          : "s|zO&:etcd_fetch",
                                     kwlist, &name, &label, kvlpy_u64_arg, &wait_ms))
        return NULL;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = background ? kvl_etcd_fetch_async(self->agent, name, label, wait_ms)
                    : kvl_etcd_fetch(self->agent, name, label, wait_ms);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_agent_etcd_fetch(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    return kvlpy_agent_etcd_fetch_any(self, args, kw, 0);
}

static PyObject *kvlpy_agent_etcd_fetch_async(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    return kvlpy_agent_etcd_fetch_any(self, args, kw, 1);
}

static PyObject *kvlpy_agent_etcd_fetch_status(kvlpy_agent_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "wait_ms", NULL};
    const char *name;
    unsigned long long wait_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O&:etcd_fetch_status", kwlist, &name,
                                     kvlpy_u64_arg, &wait_ms))
        return NULL;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_etcd_fetch_status(self->agent, name, wait_ms);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st == KVL_OK)
        Py_RETURN_TRUE;
    if (st == KVL_IN_PROGRESS)
        Py_RETURN_FALSE;
    return kvlpy_raise(st, NULL);
}

static PyObject *kvlpy_agent_etcd_unpublish(kvlpy_agent_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_agent_enter(self) < 0)
        return NULL;
    kvl_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvl_etcd_unpublish(self->agent);
    Py_END_ALLOW_THREADS
    kvlpy_agent_leave(self);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* ---- type --------------------------------------------------------------------------- */

/* Defined in kvlpy_xfer.c. */
PyObject *kvlpy_agent_prep_local(kvlpy_agent_t *self, PyObject *arg);
PyObject *kvlpy_agent_prep_remote(kvlpy_agent_t *self, PyObject *args);
PyObject *kvlpy_agent_create_xfer(kvlpy_agent_t *self, PyObject *args, PyObject *kw);
PyObject *kvlpy_agent_create_xfer_prepped(kvlpy_agent_t *self, PyObject *args, PyObject *kw);

static PyMethodDef kvlpy_agent_methods[] = {
    {"close", (PyCFunction)kvlpy_agent_close_m, METH_NOARGS,
     "Destroy the agent: cancel transfers, deregister memory, disconnect, close backends."},
    {"create_backend", KVLPY_FN(kvlpy_agent_create_backend), METH_VARARGS | METH_KEYWORDS,
     "create_backend(name, params=None)"},
    {"backends", (PyCFunction)kvlpy_agent_backends, METH_NOARGS, "Backends created, in order."},
    {"_register", KVLPY_FN(kvlpy_agent_register), METH_VARARGS | METH_KEYWORDS,
     "_register(regions, kind=None, backends=None, strict=False, dev=None) -> (text, entries)"},
    {"_deregister", KVLPY_FN(kvlpy_agent_deregister), METH_VARARGS | METH_KEYWORDS,
     "_deregister(regions, dev=None)"},
    {"query_range", (PyCFunction)kvlpy_agent_query_range, METH_VARARGS,
     "query_range(addr, len) -> None or (kind, dev, addr, len, [backends])"},
    {"get_metadata", (PyCFunction)kvlpy_agent_get_metadata, METH_NOARGS,
     "This agent's metadata blob (bytes)."},
    {"get_partial_metadata", KVLPY_FN(kvlpy_agent_get_partial_metadata),
     METH_VARARGS | METH_KEYWORDS,
     "get_partial_metadata(dlist=None, inc_conn_info=False, backends=None) -> bytes: partial "
     "metadata (the regions the list lies in; connection info only with no list or "
     "inc_conn_info)."},
    {"load_metadata", (PyCFunction)kvlpy_agent_load_metadata, METH_O,
     "load_metadata(blob) -> remote agent name (a partial blob is merged)."},
    {"remove_remote", (PyCFunction)kvlpy_agent_remove_remote, METH_O, "Forget a remote agent."},
    {"check_remote", (PyCFunction)kvlpy_agent_check_remote, METH_O,
     "Whether a remote agent's metadata is loaded."},
    {"remote_incarnation", (PyCFunction)kvlpy_agent_remote_incarnation, METH_O,
     "Incarnation id of a loaded remote agent (0 if unknown)."},
    {"remote_regions", (PyCFunction)kvlpy_agent_remote_regions, METH_O,
     "remote_regions(name) -> [(addr, len, dev, kind)]"},
    {"describe_remote", (PyCFunction)kvlpy_agent_describe_remote, METH_O,
     "How each backend reaches a loaded remote agent."},
    {"send_notif", (PyCFunction)kvlpy_agent_send_notif, METH_VARARGS,
     "send_notif(remote, msg)"},
    {"notif_queue_info", (PyCFunction)kvlpy_agent_notif_queue_info, METH_NOARGS,
     "notif_queue_info() -> {msgs, bytes, max_msgs, max_bytes, refused, reserved_msgs, "
     "reserved_bytes, max_peer_msgs, max_peer_bytes}"},
    {"poll_notifs", (PyCFunction)kvlpy_agent_poll_notifs, METH_VARARGS,
     "poll_notifs(max=-1) -> [(from, bytes)]"},
    {"wait_notif", (PyCFunction)kvlpy_agent_wait_notif, METH_VARARGS,
     "wait_notif(timeout_ms=-1) -> bool"},
    {"listen", KVLPY_FN(kvlpy_agent_listen), METH_VARARGS | METH_KEYWORDS,
     "listen(host='0.0.0.0', port=0) -> 'host:port'"},
    {"fetch_metadata", (PyCFunction)kvlpy_agent_fetch_metadata, METH_O,
     "fetch_metadata('host:port') -> remote agent name"},
    {"push_metadata", (PyCFunction)kvlpy_agent_push_metadata, METH_O,
     "push_metadata('host:port')"},
    {"push_partial_metadata", (PyCFunction)kvlpy_agent_push_partial_metadata, METH_VARARGS,
     "push_partial_metadata('host:port', blob)"},
    {"invalidate_metadata", (PyCFunction)kvlpy_agent_invalidate_metadata, METH_VARARGS,
     "invalidate_metadata(host_port=None)"},
    {"etcd_attach", KVLPY_FN(kvlpy_agent_etcd_attach), METH_VARARGS | METH_KEYWORDS,
     "etcd_attach(endpoints, prefix=None, lease_ttl_s=0, user=None, password=None, "
     "timeout_ms=0, cacert=None, cert=None, key=None, verify_name=True): TLS files as "
     "etcdctl's --cacert/--cert/--key (docs/etcd.md)"},
    {"etcd_publish", KVLPY_FN(kvlpy_agent_etcd_publish), METH_VARARGS | METH_KEYWORDS,
     "etcd_publish(label=None, blob=None): blob, partial metadata, under a label of its own"},
    {"etcd_fetch", KVLPY_FN(kvlpy_agent_etcd_fetch), METH_VARARGS | METH_KEYWORDS,
     "etcd_fetch(name, label=None, wait_ms=0)"},
    {"etcd_fetch_async", KVLPY_FN(kvlpy_agent_etcd_fetch_async), METH_VARARGS | METH_KEYWORDS,
     "etcd_fetch_async(name, label=None, wait_ms=0): etcd_fetch in the agent's background "
     "thread; returns at once"},
    {"etcd_fetch_status", KVLPY_FN(kvlpy_agent_etcd_fetch_status), METH_VARARGS | METH_KEYWORDS,
     "etcd_fetch_status(name, wait_ms=0) -> True (loaded) or False (pending); raises the "
     "error the background fetch failed with"},
    {"etcd_unpublish", (PyCFunction)kvlpy_agent_etcd_unpublish, METH_NOARGS,
     "etcd_unpublish()"},
    {"prep_local", (PyCFunction)kvlpy_agent_prep_local, METH_O, "prep_local(dlist) -> Prep"},
    {"prep_remote", (PyCFunction)kvlpy_agent_prep_remote, METH_VARARGS,
     "prep_remote(remote, dlist) -> Prep"},
    {"create_xfer", KVLPY_FN(kvlpy_agent_create_xfer), METH_VARARGS | METH_KEYWORDS,
     "create_xfer(op, local, remote, remote_list, notif=None, backend=None, timeout_ms=0)"},
    {"create_xfer_prepped", KVLPY_FN(kvlpy_agent_create_xfer_prepped),
     METH_VARARGS | METH_KEYWORDS,
     "create_xfer_prepped(op, local, local_idx, remote, remote_idx, notif=None, backend=None, "
     "timeout_ms=0)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef kvlpy_agent_getset[] = {
    {"name", (getter)kvlpy_agent_get_name, NULL, "The agent's name.", NULL},
    {"incarnation", (getter)kvlpy_agent_get_incarnation, NULL, "Random id of this start.", NULL},
    {"closed", (getter)kvlpy_agent_get_closed, NULL, "Whether close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject kvlpy_agent_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlane._kvlane.Agent",
    .tp_basicsize = sizeof(kvlpy_agent_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Agent(name, backends='shm', timeout_ms=0, secret=None, workers=0)",
    .tp_new = kvlpy_agent_new,
    .tp_init = (initproc)kvlpy_agent_init,
    .tp_dealloc = (destructor)kvlpy_agent_dealloc,
    .tp_methods = kvlpy_agent_methods,
    .tp_getset = kvlpy_agent_getset,
    .tp_weaklistoffset = offsetof(kvlpy_agent_t, weakrefs),
};
