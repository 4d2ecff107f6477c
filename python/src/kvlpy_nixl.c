/*
 * kvlane.nixl's register_memory and deregister_memory for the shapes engines
 * pass, in C: _kvlane.NixlAgentBase is the base class of
 * kvlane.nixl.nixl_agent. A call in one of these shapes costs no Python
 * frame:
 *   register_memory(nixlRegDList | [(addr, len, dev, meta), ...], mem_type)
 *   deregister_memory(nixlRegDList)
 * with backends left out or None, any is_sorted, and a memory type other
 * than FILE. Every other call (other shapes, named backends, FILE lists,
 * bad arguments) goes to the Python implementation
 * (nixl_agent._register_memory_py, _deregister_memory_py), which decides
 * and words the errors; the C path gives the same results and exceptions
 * for the calls it takes (tests/python/test_nixl_dropin.py runs both).
 * kvlane.nixl hands over what the C side needs with _nixl_bind().
 */
#include "kvlpy.h"

static struct {
    PyObject *regdlist; /* the class nixlRegDList */
    PyObject *mem_str;  /* dict: NIXL memory type name -> kvlane kind name */
    PyObject *as_error; /* callable(exc) -> exc made a nixlBackendError */
    PyObject *error;    /* kvlane.Error */
    PyObject *empty;    /* kvlane.nixl's "argument left out" sentinel */
    /* interned names */
    PyObject *s_agent, *s_descs, *s_mem_type, *s_rep, *s_backends, *s_is_sorted, *s_reg_py,
        *s_dereg_py;
} nx;

/* _nixl_bind(nixlRegDList, mem_str, as_error, Error, empty) */
PyObject *kvlpy_nixl_bind(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *regdlist, *mem_str, *as_error, *error, *empty;
    if (!PyArg_ParseTuple(args, "O!O!OO!O:_nixl_bind", &PyType_Type, &regdlist, &PyDict_Type,
                          &mem_str, &as_error, &PyType_Type, &error, &empty))
        return NULL;
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&nx.s_agent, "agent"},         {&nx.s_descs, "_descs"},
        {&nx.s_mem_type, "mem_type"},   {&nx.s_rep, "_rep"},
        {&nx.s_backends, "backends"},   {&nx.s_is_sorted, "is_sorted"},
        {&nx.s_reg_py, "_register_memory_py"}, {&nx.s_dereg_py, "_deregister_memory_py"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot != NULL)
            continue;
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    Py_XSETREF(nx.regdlist, Py_NewRef(regdlist));
    Py_XSETREF(nx.mem_str, Py_NewRef(mem_str));
    Py_XSETREF(nx.as_error, Py_NewRef(as_error));
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
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value == NULL || PyObject_IsInstance(value, nx.error) != 1) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    PyObject *conv = PyObject_CallOneArg(nx.as_error, value);
    if (conv == NULL) {
        Py_XDECREF(type);
        Py_DECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    Py_DECREF(conv); /* as_nixl changes the exception's class in place */
    PyException_SetCause(value, NULL); /* also sets __suppress_context__ */
    Py_XDECREF(type);
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(value)), value, tb);
    return NULL;
}

/* Sorts the call's arguments for the C path: positional ones into pos[0..],
 * keywords by name (a keyword in kw[] or is_sorted). 0 when the call is one
 * the C path does not take (the Python one will judge it). */
static int nx_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **pos, Py_ssize_t npos, PyObject *const *kw)
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
        } else if (name != nx.s_is_sorted) {
            return 0; /* unknown, or not interned: the Python path sorts it out */
        }
    }
    return 1;
}

static int nx_no_backends(PyObject *bk)
{
    return bk == NULL || bk == nx.empty || bk == Py_None;
}

/* The agent behind a nixl_agent, when it is kvlane's (code may replace
 * nixl_agent.agent). New reference or NULL (no exception). */
static kvlpy_agent_t *nx_agent(PyObject *self)
{
    PyObject *a = PyObject_GetAttr(self, nx.s_agent);
    if (a == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (!PyObject_TypeCheck(a, &kvlpy_agent_type)) {
        Py_DECREF(a);
        return NULL;
    }
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
    if (nx.regdlist == NULL || !nx_args(args, nargs, kwnames, pos, 3, kw) ||
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
    kvlpy_agent_t *agent = nx_agent(self);
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
    if (nx.regdlist == NULL || !nx_args(args, nargs, kwnames, pos, 2, kw) ||
        !nx_no_backends(pos[1]) || Py_TYPE(pos[0]) != (PyTypeObject *)nx.regdlist)
        return nx_slow(self, nx.s_dereg_py, args, nargsf, kwnames);
    kvlpy_agent_t *agent = nx_agent(self);
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
    {NULL, NULL, 0, NULL},
};

PyTypeObject kvlpy_nixl_base_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvlane._kvlane.NixlAgentBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The base of kvlane.nixl.nixl_agent: register_memory and deregister_memory "
              "in C for the shapes engines pass.",
    .tp_new = PyType_GenericNew,
    .tp_methods = nx_methods,
};
