/*
 * kvlane.nixl's per-registration and per-request methods for the shapes
 * engines pass, in C: _kvlane.NixlAgentBase is the base class of
 * kvlane.nixl.nixl_agent. A call in one of these shapes costs no Python
 * frame:
 *   register_memory(nixlRegDList | [(addr, len, dev, meta), ...], mem_type)
 *   deregister_memory(nixlRegDList)
 *     with backends left out or None, any is_sorted, a memory type other
 *     than FILE;
 *   transfer(handle), transfer(handle, b"" or None)
 *   check_xfer_state(handle)
 *     with a nixl_xfer_handle over kvlane's transfer.
 * Every other call (other shapes, named backends, FILE lists, a message,
 * bad arguments) goes to the Python implementation (nixl_agent's
 * _register_memory_py, _deregister_memory_py, _transfer_py,
 * _check_xfer_state_py), which decides and words the errors; a failure on
 * the C path is raised through kvlane.nixl's own conversions, so both give
 * the same results and exceptions (tests/python/test_nixl_dropin.py runs
 * both). kvlane.nixl hands over what the C side needs with _nixl_bind().
 */
#include <time.h>

#include "kvlpy.h"

static struct {
    PyObject *regdlist; /* the class nixlRegDList */
    PyObject *xhandle;  /* the class nixl_xfer_handle */
    PyObject *mem_str;  /* dict: NIXL memory type name -> kvlane kind name */
    PyObject *as_error; /* callable(exc) -> exc made a nixlBackendError */
    PyObject *xfailed;  /* callable(handle, exc, posting): raises what NIXL raises */
    PyObject *error;    /* kvlane.Error */
    PyObject *empty;    /* kvlane.nixl's "argument left out" sentinel */
    PyObject *m_register, *m_deregister; /* _kvlane.Agent's _register, _deregister */
    /* interned names and values */
    PyObject *s_agent, *s_descs, *s_mem_type, *s_rep, *s_backends, *s_is_sorted, *s_reg_py,
        *s_dereg_py, *s_notif_msg, *s_xfer, *s_start_us, *s_error, *s_transfer_py,
        *s_check_py, *s_done, *s_proc, *s_register, *s_deregister;
} nx;

/* _nixl_bind(nixlRegDList, nixl_xfer_handle, mem_str, as_error, xfer_failed,
 * Error, empty) */
PyObject *kvlpy_nixl_bind(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *regdlist, *xhandle, *mem_str, *as_error, *xfailed, *error, *empty;
    if (!PyArg_ParseTuple(args, "O!O!O!OOO!O:_nixl_bind", &PyType_Type, &regdlist,
                          &PyType_Type, &xhandle, &PyDict_Type, &mem_str, &as_error, &xfailed,
                          &PyType_Type, &error, &empty))
        return NULL;
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&nx.s_agent, "agent"},         {&nx.s_descs, "_descs"},
        {&nx.s_mem_type, "mem_type"},   {&nx.s_rep, "_rep"},
        {&nx.s_backends, "backends"},   {&nx.s_is_sorted, "is_sorted"},
        {&nx.s_reg_py, "_register_memory_py"}, {&nx.s_dereg_py, "_deregister_memory_py"},
        {&nx.s_notif_msg, "notif_msg"}, {&nx.s_xfer, "xfer"},
        {&nx.s_start_us, "start_us"},   {&nx.s_error, "error"},
        {&nx.s_transfer_py, "_transfer_py"}, {&nx.s_check_py, "_check_xfer_state_py"},
        {&nx.s_done, "DONE"},           {&nx.s_proc, "PROC"},
        {&nx.s_register, "_register"},  {&nx.s_deregister, "_deregister"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot != NULL)
            continue;
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    /* the method descriptors themselves (NULL would only send every call to
     * the Python path) */
    Py_XSETREF(nx.m_register, PyObject_GetAttr((PyObject *)&kvlpy_agent_type, nx.s_register));
    Py_XSETREF(nx.m_deregister,
               PyObject_GetAttr((PyObject *)&kvlpy_agent_type, nx.s_deregister));
    PyErr_Clear();
    Py_XSETREF(nx.regdlist, Py_NewRef(regdlist));
    Py_XSETREF(nx.xhandle, Py_NewRef(xhandle));
    Py_XSETREF(nx.mem_str, Py_NewRef(mem_str));
    Py_XSETREF(nx.as_error, Py_NewRef(as_error));
    Py_XSETREF(nx.xfailed, Py_NewRef(xfailed));
    Py_XSETREF(nx.error, Py_NewRef(error));
    Py_XSETREF(nx.empty, Py_NewRef(empty));
    Py_RETURN_NONE;
}

/* The Python implementation, with the call's arguments as they came. */
static PyObject *nx_slow(PyObject *self, PyObject *name, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames)
{
    PyObject *m = PyObject_GetAttr(self, name);
    if (m == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(m, args, nargsf, kwnames);
    Py_DECREF(m);
    return r;
}

/* A failed registration is a nixlBackendError as well (kvlane.nixl's
 * as_nixl), raised "from None"; other exceptions pass unchanged. */
static PyObject *nx_reraise(void)
{
    PyObject *value = kvlpy_err_take();
    if (value == NULL || PyObject_IsInstance(value, nx.error) != 1) {
        kvlpy_err_give(value);
        return NULL;
    }
    PyObject *conv = PyObject_CallOneArg(nx.as_error, value);
    if (conv == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    Py_DECREF(conv); /* as_nixl changes the exception's class in place */
    PyException_SetCause(value, NULL); /* also sets __suppress_context__ */
    kvlpy_err_give(value); /* raised as its new class */
    return NULL;
}

/* Sorts the call's arguments for the C path: positional ones into pos[0..],
 * keywords by name (one in kw[], or ignored, which is taken and dropped).
 * 0 when the call is one the C path does not take (the Python one will
 * judge it). */
static int nx_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **pos, Py_ssize_t npos, PyObject *const *kw, PyObject *ignored)
{
    if (nargs < 1 || nargs > npos)
        return 0;
    for (Py_ssize_t i = 0; i < nargs; i++)
        pos[i] = args[i];
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t j = 1;
        while (j < npos && kw[j] != name)
            j++;
        if (j < npos) {
            if (j < nargs || pos[j] != NULL)
                return 0; /* given twice */
            pos[j] = args[nargs + k];
        } else if (ignored == NULL || name != ignored) {
            return 0; /* unknown, or not interned: the Python path sorts it out */
        }
    }
    return 1;
}

static int nx_no_backends(PyObject *bk)
{
    return bk == NULL || bk == nx.empty || bk == Py_None;
}

/* The agent behind a nixl_agent, when it is kvlane's and its method (m,
 * what the Python path would call) is _kvlane.Agent's own: code may replace
 * nixl_agent.agent, or subclass the agent. New reference or NULL (no
 * exception). */
static kvlpy_agent_t *nx_agent(PyObject *self, PyObject *name, PyObject *m)
{
    PyObject *a = PyObject_GetAttr(self, nx.s_agent);
    if (a == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *found = NULL; /* the method as the type resolves it (public API) */
    if (m == NULL || !PyObject_TypeCheck(a, &kvlpy_agent_type) ||
        (found = PyObject_GetAttr((PyObject *)Py_TYPE(a), name)) != m) {
        if (found == NULL)
            PyErr_Clear();
        Py_XDECREF(found);
        Py_DECREF(a);
        return NULL;
    }
    Py_DECREF(found);
    return (kvlpy_agent_t *)a;
}

/* A new nixlRegDList of kind over a copy of rows (a list). */
static PyObject *nx_new_regdlist(PyObject *kind, PyObject *rows)
{
    PyTypeObject *tp = (PyTypeObject *)nx.regdlist;
    PyObject *d = tp->tp_alloc(tp, 0);
    if (d == NULL)
        return NULL;
    PyObject *copy = PyList_GetSlice(rows, 0, PyList_GET_SIZE(rows));
    if (copy == NULL || PyObject_SetAttr(d, nx.s_mem_type, kind) < 0 ||
        PyObject_SetAttr(d, nx.s_rep, Py_None) < 0 || PyObject_SetAttr(d, nx.s_descs, copy) < 0) {
        Py_XDECREF(copy);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(copy);
    return d;
}

/* rows as engines pass them: a list of (int, int, int, str) tuples. */
int kvlpy_engine_rows_ok(PyObject *rows)
{
    if (!PyList_CheckExact(rows))
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *t = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 4 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(t, 2)) ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(t, 3)))
            return 0;
    }
    return 1;
}

/* descs' rows and kind name (new references) when the C path takes the list:
 * non-empty rows, a kind other than FILE. 0 otherwise. */
static int nx_rows_kind(PyObject *descs, PyObject **rows, PyObject **kind)
{
    *rows = PyObject_GetAttr(descs, nx.s_descs);
    *kind = *rows ? PyObject_GetAttr(descs, nx.s_mem_type) : NULL;
    if (*kind != NULL && PyList_CheckExact(*rows) && PyList_GET_SIZE(*rows) > 0 &&
        PyUnicode_CheckExact(*kind) && PyUnicode_CompareWithASCIIString(*kind, "FILE") != 0)
        return 1;
    PyErr_Clear();
    Py_CLEAR(*rows);
    Py_CLEAR(*kind);
    return 0;
}

/* NIXL's DRAM device id is no NUMA node: -1 (any) for every DRAM region. */
static int nx_is_dram(PyObject *kind)
{
    return PyUnicode_CompareWithASCIIString(kind, "DRAM") == 0;
}

static PyObject *nx_register(PyObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *pos[3] = {NULL, NULL, NULL};
    PyObject *const kw[3] = {NULL, nx.s_mem_type, nx.s_backends};
    if (nx.regdlist == NULL || !nx_args(args, nargs, kwnames, pos, 3, kw, nx.s_is_sorted) ||
        !nx_no_backends(pos[2]))
        return nx_slow(self, nx.s_reg_py, args, nargsf, kwnames);
    PyObject *descs = NULL, *mem = pos[1];
    if (Py_TYPE(pos[0]) == (PyTypeObject *)nx.regdlist) {
        descs = Py_NewRef(pos[0]);
    } else if (PyList_CheckExact(pos[0]) && PyList_GET_SIZE(pos[0]) > 0 && mem != NULL &&
               PyUnicode_CheckExact(mem) && kvlpy_engine_rows_ok(pos[0])) {
        PyObject *kind = PyDict_GetItemWithError(nx.mem_str, mem); /* borrowed */
        if (kind == NULL) {
            PyErr_Clear();
            return nx_slow(self, nx.s_reg_py, args, nargsf, kwnames);
        }
        if ((descs = nx_new_regdlist(kind, pos[0])) == NULL)
            return NULL;
    } else {
        return nx_slow(self, nx.s_reg_py, args, nargsf, kwnames);
    }
    PyObject *rows, *kind;
    kvlpy_agent_t *agent = nx_agent(self, nx.s_register, nx.m_register);
    if (agent == NULL || !nx_rows_kind(descs, &rows, &kind)) {
        Py_XDECREF(agent);
        Py_DECREF(descs);
        return nx_slow(self, nx.s_reg_py, args, nargsf, kwnames);
    }
    kvl_reg_params_t prm = {.field_mask = KVL_REG_PARAM_KIND | KVL_REG_PARAM_POLICY,
                            .policy = KVL_REG_ANY};
    PyObject *rep = NULL;
    if (kvlpy_kind_get(kind, &prm.kind) == 0) {
        int dram = nx_is_dram(kind);
        rep = kvlpy_agent_register_rows(agent, rows, &prm, dram ? -1 : KVL_DEV_ANY, dram);
    }
    Py_DECREF(agent);
    Py_DECREF(rows);
    Py_DECREF(kind);
    /* the report is read (RegistrationReport) on first use of descs.report */
    if (rep == NULL || PyObject_SetAttr(descs, nx.s_rep, rep) < 0) {
        Py_XDECREF(rep);
        Py_DECREF(descs);
        return nx_reraise();
    }
    Py_DECREF(rep);
    return descs;
}

static PyObject *nx_deregister(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *pos[2] = {NULL, NULL};
    PyObject *const kw[2] = {NULL, nx.s_backends};
    PyObject *rows, *kind;
    if (nx.regdlist == NULL || !nx_args(args, nargs, kwnames, pos, 2, kw, NULL) ||
        !nx_no_backends(pos[1]) || Py_TYPE(pos[0]) != (PyTypeObject *)nx.regdlist)
        return nx_slow(self, nx.s_dereg_py, args, nargsf, kwnames);
    kvlpy_agent_t *agent = nx_agent(self, nx.s_deregister, nx.m_deregister);
    if (agent == NULL || !nx_rows_kind(pos[0], &rows, &kind)) {
        Py_XDECREF(agent);
        return nx_slow(self, nx.s_dereg_py, args, nargsf, kwnames);
    }
    int dram = nx_is_dram(kind);
    PyObject *r = kvlpy_agent_deregister_rows(agent, rows, dram ? -1 : KVL_DEV_ANY, dram);
    Py_DECREF(agent);
    Py_DECREF(rows);
    Py_DECREF(kind);
    return r != NULL ? r : nx_reraise();
}

/* A failed post or test: kvlane.nixl's _xfer_failed raises what NIXL
 * raises (and keeps the error in handle.error). Returns NULL. */
static PyObject *nx_xfer_failed(PyObject *h, PyObject *posting)
{
    PyObject *value = kvlpy_err_take();
    if (value == NULL || !PyObject_TypeCheck(value, (PyTypeObject *)PyExc_Exception)) {
        kvlpy_err_give(value); /* as the Python methods, which catch Exception */
        return NULL;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(nx.xfailed, h, value, posting, NULL);
    Py_XDECREF(r); /* it always raises; a return would be kvlane.nixl's bug */
    if (r != NULL)
        kvlpy_err_give(value);
    else
        Py_DECREF(value);
    return NULL;
}

/* handle's transfer, when the C path takes it: a nixl_xfer_handle over
 * kvlane's transfer object (the type itself, whose post and test the
 * Python path calls). New reference or NULL (no exception). */
static kvlpy_xfer_t *nx_handle_xfer(PyObject *h)
{
    if (nx.xhandle == NULL || Py_TYPE(h) != (PyTypeObject *)nx.xhandle)
        return NULL;
    PyObject *x = PyObject_GetAttr(h, nx.s_xfer);
    if (x == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (!Py_IS_TYPE(x, &kvlpy_xfer_type)) {
        Py_DECREF(x);
        return NULL;
    }
    return (kvlpy_xfer_t *)x;
}

static PyObject *nx_state(PyObject *done)
{
    if (done == NULL)
        return NULL;
    PyObject *r = Py_NewRef(done == Py_True ? nx.s_done : nx.s_proc);
    Py_DECREF(done);
    return r;
}

static PyObject *nx_transfer(PyObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *pos[2] = {NULL, NULL};
    PyObject *const kw[2] = {NULL, nx.s_notif_msg};
    kvlpy_xfer_t *x = NULL;
    /* no message (left out, None or b""): the handle's own, as made */
    if (nx.xhandle == NULL || !nx_args(args, nargs, kwnames, pos, 2, kw, NULL) ||
        !(pos[1] == NULL || pos[1] == Py_None ||
          (PyBytes_CheckExact(pos[1]) && PyBytes_GET_SIZE(pos[1]) == 0)) ||
        (x = nx_handle_xfer(pos[0])) == NULL)
        return nx_slow(self, nx.s_transfer_py, args, nargsf, kwnames);
    PyObject *h = pos[0];
    struct timespec ts; /* NIXL's startTime: microseconds of the wall clock */
    clock_gettime(CLOCK_REALTIME, &ts);
    PyObject *us = PyLong_FromLongLong((long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000);
    if (us == NULL || PyObject_SetAttr(h, nx.s_start_us, us) < 0 ||
        PyObject_SetAttr(h, nx.s_error, Py_None) < 0) {
        Py_XDECREF(us);
        Py_DECREF(x);
        return NULL;
    }
    Py_DECREF(us);
    PyObject *done = kvlpy_xfer_post(x, NULL);
    Py_DECREF(x);
    return done != NULL ? nx_state(done) : nx_xfer_failed(h, Py_True);
}

static PyObject *nx_check_xfer_state(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames)
{
    kvlpy_xfer_t *x = NULL;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL ||
        (x = nx_handle_xfer(args[0])) == NULL)
        return nx_slow(self, nx.s_check_py, args, nargsf, kwnames);
    PyObject *done = kvlpy_xfer_test(x, NULL);
    Py_DECREF(x);
    return done != NULL ? nx_state(done) : nx_xfer_failed(args[0], Py_False);
}

static PyMethodDef nx_methods[] = {
    {"register_memory", (PyCFunction)(void (*)(void))nx_register,
     METH_FASTCALL | METH_KEYWORDS,
     "register_memory($self, reg_list, mem_type=None, backends=(), *, is_sorted=False)\n"
     "--\n\n"
     "Register memory as NIXL does: a nixlRegDList, a list of (addr, len, dev, meta)\n"
     "tuples with mem_type, tensors or an (N, 3) array. Returns the nixlRegDList\n"
     "(its .report is kvlane's RegistrationReport)."},
    {"deregister_memory", (PyCFunction)(void (*)(void))nx_deregister,
     METH_FASTCALL | METH_KEYWORDS,
     "deregister_memory($self, dereg_list, backends=())\n--\n\n"
     "Deregister what register_memory returned (or the same descriptors)."},
    {"transfer", (PyCFunction)(void (*)(void))nx_transfer, METH_FASTCALL | METH_KEYWORDS,
     "transfer($self, handle, notif_msg=b\"\")\n--\n\n"
     "Post the transfer: \"DONE\" when it completed already, else \"PROC\". A message\n"
     "replaces the one the handle was made with."},
    {"check_xfer_state", (PyCFunction)(void (*)(void))nx_check_xfer_state,
     METH_FASTCALL | METH_KEYWORDS,
     "check_xfer_state($self, handle)\n--\n\n"
     "\"DONE\" or \"PROC\"; raises the transfer's error."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kvlpy_nixl_base_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvlane._kvlane.NixlAgentBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The base of kvlane.nixl.nixl_agent: register_memory, deregister_memory, "
              "transfer and check_xfer_state in C for the shapes engines pass.",
    .tp_new = PyType_GenericNew,
    .tp_methods = nx_methods,
};
