/*
 * kvlane._kvlane.DList: descriptor lists built without Python-level loops.
 */
#include <string.h>
#include "kvlpy.h"

static int kvlpy_dlist_ok(kvlpy_dlist_t *self)
{
    if (self->dl == NULL) {
        kvlpy_raise_msg(KVL_ERR_STATE, "DList.__init__ was not called", NULL);
        return -1;
    }
    return 0;
}

/* For the methods that change the list: also refused while a call of
 * another thread reads it without the GIL (prep_local, prep_remote,
 * create_xfer, get_partial_metadata), whose entries a change could free. */
static int kvlpy_dlist_mut_ok(kvlpy_dlist_t *self)
{
    if (kvlpy_dlist_ok(self) < 0)
        return -1;
    if (self->busy > 0) {
        kvlpy_raise_msg(KVL_ERR_IN_USE, "the descriptor list is in use by another thread",
                        "change it once that thread's prep, create_xfer or "
                        "get_partial_metadata call returned");
        return -1;
    }
    return 0;
}

static int kvlpy_dlist_init(kvlpy_dlist_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind", "capacity", NULL};
    PyObject *kind_o = NULL;
    Py_ssize_t cap = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|On:DList", kwlist, &kind_o, &cap))
        return -1;
    kvl_mem_kind_t kind = KVL_MEM_DRAM;
    if (kind_o && kvlpy_kind_get(kind_o, &kind) < 0)
        return -1;
    if (self->dl != NULL && kvlpy_dlist_mut_ok(self) < 0)
        return -1; /* the old list is freed below */
    kvl_dlist_t *dl;
    kvl_error_clear();
    kvl_status_t st = kvl_dlist_create(kind, cap > 0 ? (size_t)cap : 0, &dl);
    if (st != KVL_OK) {
        kvlpy_raise(st, NULL);
        return -1;
    }
    kvl_dlist_destroy(self->dl);
    self->dl = dl;
    return 0;
}

static void kvlpy_dlist_dealloc(kvlpy_dlist_t *self)
{
    kvl_dlist_destroy(self->dl);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *kvlpy_dlist_result(kvl_status_t st)
{
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_dlist_add(kvlpy_dlist_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"addr", "len", "dev", NULL};
    unsigned long long addr, len;
    int dev = KVL_DEV_ANY;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|i:add", kwlist, kvlpy_u64_arg, &addr,
                                     kvlpy_u64_arg, &len, &dev) ||
        kvlpy_dlist_mut_ok(self) < 0)
        return NULL;
    kvl_error_clear();
    return kvlpy_dlist_result(kvl_dlist_add(self->dl, addr, len, dev));
}

static PyObject *kvlpy_dlist_add_strided(kvlpy_dlist_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"base", "stride", "count", "len", "dev", NULL};
    unsigned long long base, stride, count, len;
    int dev = KVL_DEV_ANY;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&O&|i:add_strided", kwlist, kvlpy_u64_arg,
                                     &base, kvlpy_u64_arg, &stride, kvlpy_u64_arg, &count,
                                     kvlpy_u64_arg, &len, &dev) ||
        kvlpy_dlist_mut_ok(self) < 0)
        return NULL;
    kvl_error_clear();
    return kvlpy_dlist_result(kvl_dlist_add_strided(self->dl, base, stride, count, len, dev));
}

/*
 * A multi-part add was refused: drop what it added (the list has n0 entries
 * again) and raise the core's error, which names no index or one within a
 * part, as about entry i of the caller's input. Only a refused entry
 * (KVL_ERR_INVALID_ARG) is named; out of memory is raised as it is.
 */
static PyObject *kvlpy_dlist_refused(kvlpy_dlist_t *self, size_t n0, kvl_status_t st,
                                     const char *method, size_t i)
{
    kvl_error_t *e = PyMem_Malloc(sizeof(*e));
    if (e == NULL) {
        kvl_dlist_truncate(self->dl, n0);
        return PyErr_NoMemory();
    }
    *e = *kvl_last_error();
    kvl_dlist_truncate(self->dl, n0); /* cannot fail: n0 <= entries */
    if (st == KVL_ERR_INVALID_ARG && e->code == st) {
        char why[sizeof(e->what)];
        memcpy(why, e->what, sizeof(why));
        why[sizeof(why) - 1] = 0;
        snprintf(e->what, sizeof(e->what), "%s: entry %zu: %.900s; nothing was added", method,
                 i, why);
    }
    PyObject *r = kvlpy_raise_err(e, st, NULL);
    PyMem_Free(e);
    return r;
}

/* add_array(addrs, lens=None, len=0, dev=-1): lens an array, or None with
 * every entry len bytes (lens may also be an int). */
static PyObject *kvlpy_dlist_add_array(kvlpy_dlist_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"addrs", "lens", "len", "dev", NULL};
    PyObject *addrs_o, *lens_o = Py_None;
    unsigned long long len = 0;
    int dev = KVL_DEV_ANY;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO&i:add_array", kwlist, &addrs_o, &lens_o,
                                     kvlpy_u64_arg, &len, &dev) ||
        kvlpy_dlist_mut_ok(self) < 0)
        return NULL;
    if (PyBool_Check(lens_o)) {
        PyErr_SetString(PyExc_TypeError, "add_array: lens is a bool; a length (an integer) or "
                        "an array of lengths is needed");
        return NULL;
    }
    if (PyLong_Check(lens_o)) {
        len = PyLong_AsUnsignedLongLong(lens_o);
        if (PyErr_Occurred())
            return NULL;
        lens_o = Py_None;
    }
    kvlpy_array_t addrs, lens;
    if (kvlpy_array_get(addrs_o, 0, "addrs", &addrs) < 0)
        return NULL;
    const uint64_t *lp = NULL;
    if (lens_o != Py_None) {
        if (kvlpy_array_get(lens_o, 0, "lens", &lens) < 0) {
            kvlpy_array_free(&addrs);
            return NULL;
        }
        if (lens.n != addrs.n) {
            kvlpy_array_free(&addrs);
            kvlpy_array_free(&lens);
            return kvlpy_raise_msg(KVL_ERR_INVALID_ARG, "addrs and lens differ in length", NULL);
        }
        lp = lens.data;
    }
    /* again: the conversions above may have run Python code (and let
     * another thread start reading the list) */
    if (kvlpy_dlist_mut_ok(self) < 0) {
        kvlpy_array_free(&addrs);
        if (lens_o != Py_None)
            kvlpy_array_free(&lens);
        return NULL;
    }
    kvl_error_clear();
    kvl_status_t st = kvl_dlist_add_array(self->dl, addrs.data, lp, len, dev, (size_t)addrs.n);
    kvlpy_array_free(&addrs);
    if (lens_o != Py_None)
        kvlpy_array_free(&lens);
    return kvlpy_dlist_result(st);
}

/* add_strided_array(bases, stride, count, len, dev=-1): one strided entry per base. */
static PyObject *kvlpy_dlist_add_strided_array(kvlpy_dlist_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"bases", "stride", "count", "len", "dev", NULL};
    PyObject *bases_o;
    unsigned long long stride, count, len;
    int dev = KVL_DEV_ANY;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&O&O&|i:add_strided_array", kwlist, &bases_o,
                                     kvlpy_u64_arg, &stride, kvlpy_u64_arg, &count,
                                     kvlpy_u64_arg, &len, &dev) ||
        kvlpy_dlist_mut_ok(self) < 0)
        return NULL;
    kvlpy_array_t bases;
    if (kvlpy_array_get(bases_o, 0, "bases", &bases) < 0)
        return NULL;
    if (kvlpy_dlist_mut_ok(self) < 0) { /* again, after Python code may have run */
        kvlpy_array_free(&bases);
        return NULL;
    }
    const uint64_t *b = bases.data;
    size_t n0 = kvl_dlist_entries(self->dl);
    kvl_status_t st = KVL_OK;
    Py_ssize_t i = 0;
    kvl_error_clear();
    for (; i < bases.n; i++)
        if ((st = kvl_dlist_add_strided(self->dl, b[i], stride, count, len, dev)) != KVL_OK)
            break;
    kvlpy_array_free(&bases);
    if (st != KVL_OK) /* all or nothing: the bases before i are taken back */
        return kvlpy_dlist_refused(self, n0, st, "DList.add_strided_array", (size_t)i);
    Py_RETURN_NONE;
}

/* Scratch columns for add_descs, kept warm between calls (GIL held). */
static uint64_t *kvlpy_scratch;
static size_t kvlpy_scratch_n;

/* An (N, 2) or (N, 3) int64/uint64 table: columns gathered into warm scratch
 * arrays, then one kvl_dlist_add_array per run of equal devices. All or
 * nothing: a refused run takes the runs before it back out. */
static PyObject *kvlpy_dlist_add_table(kvlpy_dlist_t *self, PyObject *obj, int32_t dev,
                                       int force)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    const char *f = v.format ? v.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = strchr("qQlLnN", *f) != NULL && f[1] == 0 && v.itemsize == 8 && v.ndim == 2 &&
             (v.shape[1] == 2 || v.shape[1] == 3);
    if (!ok) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_TypeError, "descriptor array: a C-contiguous int64/uint64 "
                                         "array of shape (N, 3) or (N, 2) is needed");
        return NULL;
    }
    size_t n = (size_t)v.shape[0], w = (size_t)v.shape[1];
    if (kvlpy_scratch_n < 2 * n) {
        uint64_t *p = PyMem_Realloc(kvlpy_scratch, 2 * n * sizeof(uint64_t));
        if (p == NULL) {
            PyBuffer_Release(&v);
            return PyErr_NoMemory();
        }
        kvlpy_scratch = p;
        kvlpy_scratch_n = 2 * n;
    }
    uint64_t *addrs = kvlpy_scratch, *lens = kvlpy_scratch + n;
    const uint64_t *t = v.buf;
    int is_signed = *f == 'q' || *f == 'l' || *f == 'n';
    for (size_t i = 0; i < n; i++) {
        int32_t d;
        addrs[i] = t[i * w];
        lens[i] = t[i * w + 1];
        /* signs and device ids are checked before anything is added;
         * lengths, address overflow and FILE ranges by the core, run by run
         * (undone below) */
        if (kvlpy_table_row(t + i * w, (Py_ssize_t)w, is_signed, (Py_ssize_t)i, !force, &d) < 0) {
            PyBuffer_Release(&v);
            return NULL;
        }
    }
    if (kvlpy_dlist_mut_ok(self) < 0) { /* again, after the buffer's export */
        PyBuffer_Release(&v);
        return NULL;
    }
    size_t n0 = kvl_dlist_entries(self->dl);
    kvl_status_t st = KVL_OK;
    kvl_error_clear();
    for (size_t i = 0; i < n;) {
        int32_t d = (force || w == 2) ? dev : (int32_t)(int64_t)t[i * w + 2];
        size_t j = i + 1;
        if (!force && w == 3)
            while (j < n && (int32_t)(int64_t)t[j * w + 2] == d)
                j++;
        else
            j = n;
        st = kvl_dlist_add_array(self->dl, addrs + i, lens + i, 0, d, j - i);
        if (st == KVL_ERR_INVALID_ARG) {
            /* The core names the entry by its place in the run: find it again
             * one entry at a time (the same checks), for its index in the
             * table and the exact reason. Only a refused call pays for this. */
            kvl_dlist_truncate(self->dl, n0);
            for (size_t k = i; k < j; k++)
                if ((st = kvl_dlist_add(self->dl, addrs[k], lens[k], d)) != KVL_OK) {
                    PyBuffer_Release(&v);
                    return kvlpy_dlist_refused(self, n0, st, "DList.add_descs", k);
                }
            /* every entry passed alone (not expected): the run is named */
            PyBuffer_Release(&v);
            return kvlpy_dlist_refused(self, n0, KVL_ERR_INVALID_ARG, "DList.add_descs", i);
        }
        if (st != KVL_OK) { /* out of memory: no entry is at fault */
            PyBuffer_Release(&v);
            return kvlpy_dlist_refused(self, n0, st, "DList.add_descs", i);
        }
        i = j;
    }
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

/* add_descs(descs, dev=None): (addr, len[, dev]) tuples or an (N, 3) array;
 * dev given overrides every entry's device. */
static PyObject *kvlpy_dlist_add_descs(kvlpy_dlist_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"descs", "dev", NULL};
    PyObject *descs, *dev_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:add_descs", kwlist, &descs, &dev_o) ||
        kvlpy_dlist_mut_ok(self) < 0)
        return NULL;
    int force = dev_o != Py_None;
    int32_t dev = KVL_DEV_ANY;
    if (force && kvlpy_dev_obj(dev_o, -1, &dev) < 0)
        return NULL;
    if (PyObject_CheckBuffer(descs))
        return kvlpy_dlist_add_table(self, descs, dev, force);
    size_t n;
    kvl_mem_desc_t *d = kvlpy_regions_get(descs, dev, force, &n);
    if (d == NULL)
        return NULL;
    if (kvlpy_dlist_mut_ok(self) < 0) { /* again, after Python code may have run */
        PyMem_Free(d);
        return NULL;
    }
    size_t n0 = kvl_dlist_entries(self->dl), i = 0;
    kvl_status_t st = KVL_OK;
    kvl_error_clear();
    for (; i < n; i++)
        if ((st = kvl_dlist_add(self->dl, d[i].addr, d[i].len, d[i].dev)) != KVL_OK)
            break;
    PyMem_Free(d);
    if (st != KVL_OK) /* all or nothing: the entries before i are taken back */
        return kvlpy_dlist_refused(self, n0, st, "DList.add_descs", i);
    Py_RETURN_NONE;
}

static PyObject *kvlpy_dlist_clear(kvlpy_dlist_t *self, PyObject *unused)
{
    (void)unused;
    if (kvlpy_dlist_mut_ok(self) < 0)
        return NULL;
    kvl_dlist_clear(self->dl);
    Py_RETURN_NONE;
}

/* get(i) -> (addr, stride, count, len, dev) */
static PyObject *kvlpy_dlist_get(kvlpy_dlist_t *self, PyObject *arg)
{
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if ((i == -1 && PyErr_Occurred()) || kvlpy_dlist_ok(self) < 0)
        return NULL;
    Py_ssize_t n = (Py_ssize_t)kvl_dlist_entries(self->dl);
    if (i < 0)
        i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "DList index out of range");
        return NULL;
    }
    uint64_t addr, stride, count, len;
    int32_t dev;
    kvl_error_clear();
    kvl_status_t st = kvl_dlist_get(self->dl, (size_t)i, &addr, &stride, &count, &len, &dev);
    if (st != KVL_OK)
        return kvlpy_raise(st, NULL);
    return Py_BuildValue("(KKKKi)", (unsigned long long)addr, (unsigned long long)stride,
                         (unsigned long long)count, (unsigned long long)len, (int)dev);
}

static Py_ssize_t kvlpy_dlist_len(kvlpy_dlist_t *self)
{
    return self->dl ? (Py_ssize_t)kvl_dlist_entries(self->dl) : 0;
}

static PyObject *kvlpy_dlist_get_kind(kvlpy_dlist_t *self, void *c)
{
    (void)c;
    if (kvlpy_dlist_ok(self) < 0)
        return NULL;
    return PyUnicode_FromString(kvl_mem_kind_name(kvl_dlist_kind(self->dl)));
}

static PyObject *kvlpy_dlist_get_blocks(kvlpy_dlist_t *self, void *c)
{
    (void)c;
    if (kvlpy_dlist_ok(self) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(kvl_dlist_blocks(self->dl));
}

static PyObject *kvlpy_dlist_get_bytes(kvlpy_dlist_t *self, void *c)
{
    (void)c;
    if (kvlpy_dlist_ok(self) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(kvl_dlist_bytes(self->dl));
}

static PyObject *kvlpy_dlist_repr(kvlpy_dlist_t *self)
{
    if (self->dl == NULL)
        return PyUnicode_FromString("<kvlane.DList (uninitialised)>");
    return PyUnicode_FromFormat("<kvlane.DList %s: %zu entries, %llu blocks, %llu bytes>",
                                kvl_mem_kind_name(kvl_dlist_kind(self->dl)),
                                kvl_dlist_entries(self->dl),
                                (unsigned long long)kvl_dlist_blocks(self->dl),
                                (unsigned long long)kvl_dlist_bytes(self->dl));
}

static PyMethodDef kvlpy_dlist_methods[] = {
    {"add", KVLPY_FN(kvlpy_dlist_add), METH_VARARGS | METH_KEYWORDS, "add(addr, len, dev=-1)"},
    {"add_strided", KVLPY_FN(kvlpy_dlist_add_strided), METH_VARARGS | METH_KEYWORDS,
     "add_strided(base, stride, count, len, dev=-1)"},
    {"add_array", KVLPY_FN(kvlpy_dlist_add_array), METH_VARARGS | METH_KEYWORDS,
     "add_array(addrs, lens=None, len=0, dev=-1): plain entries from integer arrays"},
    {"add_strided_array", KVLPY_FN(kvlpy_dlist_add_strided_array), METH_VARARGS | METH_KEYWORDS,
     "add_strided_array(bases, stride, count, len, dev=-1): one strided entry per base"},
    {"add_descs", KVLPY_FN(kvlpy_dlist_add_descs), METH_VARARGS | METH_KEYWORDS,
     "add_descs(descs, dev=None): (addr, len, dev) tuples or an (N, 3) integer array"},
    {"clear", (PyCFunction)kvlpy_dlist_clear, METH_NOARGS, "Remove every entry."},
    {"get", (PyCFunction)kvlpy_dlist_get, METH_O, "get(i) -> (addr, stride, count, len, dev)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef kvlpy_dlist_getset[] = {
    {"kind", (getter)kvlpy_dlist_get_kind, NULL, "Memory kind of every entry.", NULL},
    {"blocks", (getter)kvlpy_dlist_get_blocks, NULL, "Blocks, strided entries counted.", NULL},
    {"bytes", (getter)kvlpy_dlist_get_bytes, NULL, "Total bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods kvlpy_dlist_seq = {.sq_length = (lenfunc)kvlpy_dlist_len};

PyTypeObject kvlpy_dlist_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlane._kvlane.DList",
    .tp_basicsize = sizeof(kvlpy_dlist_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "DList(kind='DRAM', capacity=0): a descriptor list",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)kvlpy_dlist_init,
    .tp_dealloc = (destructor)kvlpy_dlist_dealloc,
    .tp_methods = kvlpy_dlist_methods,
    .tp_getset = kvlpy_dlist_getset,
    .tp_as_sequence = &kvlpy_dlist_seq,
    .tp_repr = (reprfunc)kvlpy_dlist_repr,
};
