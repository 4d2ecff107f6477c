/*
 * kvlane._kvlane: module setup, errors and array conversion.
 */
#include <errno.h>
#include <stdlib.h>
#include <pthread.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "kvlpy.h"
#include "common/rdma_diag.h"

static PyObject *kvlpy_error_factory;   /* kvlane.errors._make, set by the package */

/* ---- errors ---------------------------------------------------------------- */

static int kvlpy_dict_set(PyObject *d, const char *key, PyObject *v)
{
    if (v == NULL)
        return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

static PyObject *kvlpy_device_obj(int dev)
{
    if (dev < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(dev);
}

static PyObject *kvlpy_cause_dict(const kvl_error_cause_t *c)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    if (kvlpy_dict_set(d, "code", PyLong_FromLong(c->code)) ||
        kvlpy_dict_set(d, "name", PyUnicode_FromString(kvl_status_name(c->code))) ||
        kvlpy_dict_set(d, "errno", PyLong_FromLong(c->sys_errno)) ||
        kvlpy_dict_set(d, "backend", PyUnicode_DecodeUTF8(c->backend, (Py_ssize_t)strlen(c->backend), "replace")) ||
        kvlpy_dict_set(d, "device", kvlpy_device_obj(c->device)) ||
        kvlpy_dict_set(d, "what", PyUnicode_DecodeUTF8(c->what, (Py_ssize_t)strlen(c->what), "replace")) ||
        kvlpy_dict_set(d, "hint", PyUnicode_DecodeUTF8(c->hint, (Py_ssize_t)strlen(c->hint), "replace"))) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *kvlpy_str(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

/* Fields of err as a dict for the factory. */
static PyObject *kvlpy_error_fields(const kvl_error_t *err)
{
    size_t need = kvl_error_render(err, NULL, 0);
    char *text = PyMem_Malloc(need + 1);
    if (text == NULL)
        return PyErr_NoMemory();
    kvl_error_render(err, text, need + 1);
    PyObject *d = PyDict_New();
    PyObject *causes = PyList_New(0);
    if (d == NULL || causes == NULL)
        goto fail;
    for (unsigned i = 0; i < err->n_causes && i < KVL_ERROR_MAX_CAUSES; i++) {
        PyObject *c = kvlpy_cause_dict(&err->causes[i]);
        if (c == NULL || PyList_Append(causes, c) < 0) {
            Py_XDECREF(c);
            goto fail;
        }
        Py_DECREF(c);
    }
    if (kvlpy_dict_set(d, "code", PyLong_FromLong(err->code)) ||
        kvlpy_dict_set(d, "name", kvlpy_str(kvl_status_name(err->code))) ||
        kvlpy_dict_set(d, "errno", PyLong_FromLong(err->sys_errno)) ||
        kvlpy_dict_set(d, "backend", kvlpy_str(err->backend)) ||
        kvlpy_dict_set(d, "device", kvlpy_device_obj(err->device)) ||
        kvlpy_dict_set(d, "agent", kvlpy_str(err->agent)) ||
        kvlpy_dict_set(d, "region", kvlpy_str(err->region)) ||
        kvlpy_dict_set(d, "what", kvlpy_str(err->what)) ||
        kvlpy_dict_set(d, "hint", kvlpy_str(err->hint)) ||
        kvlpy_dict_set(d, "causes_dropped", PyLong_FromUnsignedLong(err->n_causes_dropped)) ||
        kvlpy_dict_set(d, "text", kvlpy_str(text)))
        goto fail;
    if (PyDict_SetItemString(d, "causes", causes) < 0)
        goto fail;
    Py_DECREF(causes);
    PyMem_Free(text);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(causes);
    PyMem_Free(text);
    return NULL;
}

static PyObject *kvlpy_raise_error(const kvl_error_t *err, PyObject *report)
{
    PyObject *fields = kvlpy_error_fields(err);
    if (fields == NULL)
        return NULL;
    if (kvlpy_error_factory == NULL) {
        PyObject *text = PyDict_GetItemString(fields, "text");
        PyErr_SetObject(PyExc_RuntimeError, text);
        Py_DECREF(fields);
        return NULL;
    }
    PyObject *exc = PyObject_CallFunctionObjArgs(kvlpy_error_factory, fields,
                                                 report ? report : Py_None, NULL);
    Py_DECREF(fields);
    if (exc == NULL)
        return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *kvlpy_raise(kvl_status_t st, PyObject *report)
{
    return kvlpy_raise_err(kvl_last_error(), st, report);
}

PyObject *kvlpy_raise_err(const kvl_error_t *last, kvl_status_t st, PyObject *report)
{
    if (last != NULL && last->code == st)
        return kvlpy_raise_error(last, report);
    /* The call failed without filling the thread's error (or filled another
     * one): report the status itself rather than a stale error. */
    kvl_error_t *e = PyMem_Calloc(1, sizeof(*e));
    if (e == NULL)
        return PyErr_NoMemory();
    e->code = st;
    e->device = -1;
    snprintf(e->what, sizeof(e->what), "%s", kvl_status_str(st));
    PyObject *r = kvlpy_raise_error(e, report);
    PyMem_Free(e);
    return r;
}

PyObject *kvlpy_raise_msg(kvl_status_t st, const char *what, const char *hint)
{
    kvl_error_t *e = PyMem_Calloc(1, sizeof(*e));
    if (e == NULL)
        return PyErr_NoMemory();
    e->code = st;
    e->device = -1;
    snprintf(e->what, sizeof(e->what), "%s", what);
    if (hint)
        snprintf(e->hint, sizeof(e->hint), "%s", hint);
    PyObject *r = kvlpy_raise_error(e, NULL);
    PyMem_Free(e);
    return r;
}

/* ---- integer arrays ---------------------------------------------------- */

/* Type character of a struct-module format, or 0 for a non-native order. */
static char kvlpy_format_char(const char *fmt)
{
    if (fmt == NULL)
        return 'B';
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<')
        fmt++;
    else if (fmt[0] == '>' || fmt[0] == '!')
        return 0;
    if (fmt[0] == 0 || fmt[1] != 0)
        return 0;
    return fmt[0];
}

/*
 * The converted copies' memory. The last two freed buffers are kept (every
 * caller holds the GIL), so a request's index arrays reuse the previous
 * request's pages instead of faulting fresh ones in: malloc hands arrays
 * this size back to the kernel at each free, and faulting 512 KiB in again
 * cost ~55 us of a 65536-pair request. Buffers above 64 MiB are not kept.
 */
#define KVLPY_KEEP_MAX (64u << 20)
static struct {
    void *p;
    size_t cap;
} kvlpy_keep[2];

static uint64_t *kvlpy_tmp_alloc(kvlpy_array_t *a, size_t n)
{
    size_t bytes = (n ? n : 1) * sizeof(uint64_t);
    for (int i = 0; i < 2; i++)
        if (kvlpy_keep[i].p != NULL && kvlpy_keep[i].cap >= bytes) {
            a->tmp = kvlpy_keep[i].p;
            a->tmp_cap = kvlpy_keep[i].cap;
            kvlpy_keep[i].p = NULL;
            return a->tmp;
        }
    a->tmp = PyMem_Malloc(bytes);
    a->tmp_cap = bytes;
    return a->tmp;
}

static void kvlpy_tmp_free(kvlpy_array_t *a)
{
    int slot = -1;
    if (a->tmp == NULL)
        return;
    if (a->tmp_cap <= KVLPY_KEEP_MAX) {
        for (int i = 0; i < 2 && slot < 0; i++)
            if (kvlpy_keep[i].p == NULL)
                slot = i; /* an empty place first */
        for (int i = 0; i < 2 && slot < 0; i++)
            if (kvlpy_keep[i].cap < a->tmp_cap)
                slot = i; /* else the place of a smaller one */
    }
    if (slot >= 0) {
        PyMem_Free(kvlpy_keep[slot].p); /* a smaller one, or NULL */
        kvlpy_keep[slot].p = a->tmp;
        kvlpy_keep[slot].cap = a->tmp_cap;
    } else {
        PyMem_Free(a->tmp);
    }
    a->tmp = NULL;
}

/*
 * Narrower integers widened to 64 bits, one loop per element type written
 * for the vectorizer (numpy int32 index arrays cost a copy, not a branch per
 * element); 32-bit ones have an AVX2 copy chosen at run time, as the core's
 * index narrowing does (xfer.c: GCC's -O2 cost model leaves these scalar,
 * ~0.4 ns an element, and SSE2 has no sign extension). Each returns the
 * position of the first negative element, or -1.
 */
#if defined(__GNUC__) && !defined(__clang__)
#define KVLPY_VECTORIZE __attribute__((optimize("vect-cost-model=dynamic")))
#else
#define KVLPY_VECTORIZE
#endif
#define KVLPY_WIDEN(name, type, attr)                                                          \
    attr KVLPY_VECTORIZE static Py_ssize_t name(const void *in, Py_ssize_t n,                  \
                                                uint64_t *restrict out)                        \
    {                                                                                          \
        const type *restrict p = in;                                                           \
        int neg = 0;                                                                           \
        for (Py_ssize_t i = 0; i < n; i++) {                                                   \
            out[i] = (uint64_t)(int64_t)p[i];                                                  \
            neg |= (int64_t)p[i] < 0;                                                               \
        }                                                                                      \
        if (neg)                                                                               \
            for (Py_ssize_t i = 0; i < n; i++)                                                 \
                if ((int64_t)p[i] < 0)                                                            \
                    return i;                                                                  \
        return -1;                                                                             \
    }
KVLPY_WIDEN(kvlpy_widen_i8, int8_t, )
KVLPY_WIDEN(kvlpy_widen_i16, int16_t, )
KVLPY_WIDEN(kvlpy_widen_i32_any, int32_t, )
KVLPY_WIDEN(kvlpy_widen_u8, uint8_t, )
KVLPY_WIDEN(kvlpy_widen_u16, uint16_t, )
KVLPY_WIDEN(kvlpy_widen_u32_any, uint32_t, )
#if defined(__x86_64__) && defined(__GNUC__)
KVLPY_WIDEN(kvlpy_widen_i32_avx2, int32_t, __attribute__((target("avx2"))))
KVLPY_WIDEN(kvlpy_widen_u32_avx2, uint32_t, __attribute__((target("avx2"))))

static int kvlpy_avx2(void)
{
    static int have = -1; /* under the GIL */
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return have;
}
#define KVLPY_WIDEN32(sfx, in, n, out)                                                         \
    (kvlpy_avx2() ? kvlpy_widen_##sfx##_avx2(in, n, out) : kvlpy_widen_##sfx##_any(in, n, out))
#else
#define KVLPY_WIDEN32(sfx, in, n, out) kvlpy_widen_##sfx##_any(in, n, out)
#endif
#undef KVLPY_WIDEN

/* The buffer's elements: a 1-D array of 1-, 2-, 4- or 8-byte integers.
 * 0 with *signed_p, or -1 with TypeError. */
static int kvlpy_array_kind(const kvlpy_array_t *a, const char *argname, int *signed_p)
{
    if (a->view.ndim != 1) {
        /* a (1, n) array is not n indices: flattening it would take a
         * table for a list without saying so */
        PyErr_Format(PyExc_TypeError, "%s: a 1-D array is needed, got one of %d dimensions",
                     argname, a->view.ndim);
        return -1;
    }
    Py_ssize_t isz = a->view.itemsize;
    int ok;
    switch (kvlpy_format_char(a->view.format)) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': *signed_p = 1; ok = 1; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': *signed_p = 0; ok = 1; break;
    default: *signed_p = 0; ok = 0; break;
    }
    if (!ok || (isz != 1 && isz != 2 && isz != 4 && isz != 8)) {
        PyErr_Format(PyExc_TypeError, "%s: integer array needed, got format '%s'", argname,
                     a->view.format ? a->view.format : "B");
        return -1;
    }
    return 0;
}

/* A 1-D integer array whose elements are not next to each other (a slice
 * with a step, a column of a table): gathered into 64 bits one by one, as
 * NIXL's binding takes it (a copy; contiguous arrays take the loops above). */
static int kvlpy_array_from_strided(PyObject *obj, int is_signed, const char *argname,
                                    kvlpy_array_t *a)
{
    int src_signed;
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: an integer array is needed (its buffer cannot be "
                     "read with strides)", argname);
        return -1;
    }
    a->has_view = 1;
    if (kvlpy_array_kind(a, argname, &src_signed) < 0)
        return -1;
    a->n = a->view.shape[0];
    uint64_t *out = kvlpy_tmp_alloc(a, (size_t)a->n);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    const char *p = a->view.buf;
    Py_ssize_t step = a->view.strides[0], isz = a->view.itemsize;
    for (Py_ssize_t i = 0; i < a->n; i++, p += step) {
        int64_t sv = 0;
        uint64_t uv = 0;
        if (src_signed) {
            int8_t v1;
            int16_t v2;
            int32_t v4;
            switch (isz) {
            case 1: memcpy(&v1, p, 1); sv = v1; break;
            case 2: memcpy(&v2, p, 2); sv = v2; break;
            case 4: memcpy(&v4, p, 4); sv = v4; break;
            default: memcpy(&sv, p, 8); break;
            }
            if (sv < 0 && !is_signed) {
                PyErr_Format(PyExc_ValueError, "%s[%zd] is negative", argname, i);
                return -1;
            }
            out[i] = (uint64_t)sv;
        } else {
            uint8_t v1;
            uint16_t v2;
            uint32_t v4;
            switch (isz) {
            case 1: memcpy(&v1, p, 1); uv = v1; break;
            case 2: memcpy(&v2, p, 2); uv = v2; break;
            case 4: memcpy(&v4, p, 4); uv = v4; break;
            default: memcpy(&uv, p, 8); break;
            }
            if (is_signed && uv > (uint64_t)INT64_MAX) {
                PyErr_Format(PyExc_ValueError, "%s[%zd] is %llu, past the largest index "
                             "(2**63 - 1)", argname, i, (unsigned long long)uv);
                return -1;
            }
            out[i] = uv;
        }
    }
    a->data = out;
    return 0;
}

static int kvlpy_array_from_buffer(PyObject *obj, int is_signed, const char *argname,
                                   kvlpy_array_t *a)
{
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return kvlpy_array_from_strided(obj, is_signed, argname, a);
    }
    a->has_view = 1;
    int ok_signed;
    if (kvlpy_array_kind(a, argname, &ok_signed) < 0)
        return -1;
    Py_ssize_t isz = a->view.itemsize;
    a->n = isz > 0 ? a->view.len / isz : 0;
    if (isz == 8) {
        a->data = a->view.buf;
        if (!is_signed && ok_signed) {
            const int64_t *v = a->data;
            for (Py_ssize_t i = 0; i < a->n; i++)
                if (v[i] < 0) {
                    PyErr_Format(PyExc_ValueError, "%s[%zd] is negative", argname, i);
                    return -1;
                }
        }
        if (is_signed && !ok_signed) {
            /* uint64 read as int64: a value past INT64_MAX would turn negative
             * (one OR over the array, vectorized; the culprit looked up after) */
            const uint64_t *v = a->data;
            uint64_t any = 0;
            for (Py_ssize_t i = 0; i < a->n; i++)
                any |= v[i];
            for (Py_ssize_t i = 0; (any >> 63) != 0 && i < a->n; i++)
                if (v[i] > (uint64_t)INT64_MAX) {
                    PyErr_Format(PyExc_ValueError, "%s[%zd] is %llu, past the largest index "
                                 "(2**63 - 1)", argname, i, (unsigned long long)v[i]);
                    return -1;
                }
        }
        return 0;
    }
    uint64_t *out = kvlpy_tmp_alloc(a, (size_t)a->n);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    a->data = out;
    Py_ssize_t neg;
    switch ((ok_signed ? 0 : 4) + (int)isz) {
    case 1: neg = kvlpy_widen_i8(a->view.buf, a->n, out); break;
    case 2: neg = kvlpy_widen_i16(a->view.buf, a->n, out); break;
    case 4: neg = KVLPY_WIDEN32(i32, a->view.buf, a->n, out); break;
    case 5: neg = kvlpy_widen_u8(a->view.buf, a->n, out); break;
    case 6: neg = kvlpy_widen_u16(a->view.buf, a->n, out); break;
    default: neg = KVLPY_WIDEN32(u32, a->view.buf, a->n, out); break;
    }
    if (neg >= 0 && !is_signed) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] is negative", argname, neg);
        return -1;
    }
    return 0;
}

/* "O&" converters for unsigned arguments: 'K' and 'I' would take -1 as
 * 2^64 - 1 (or 2^32 - 1) and cut larger values down without a word. */
static int kvlpy_uint_arg(PyObject *o, unsigned long long most, const char *range,
                          unsigned long long *v)
{
    if (PyBool_Check(o)) { /* True is no length, address or count of 1 */
        PyErr_SetString(PyExc_TypeError, "an integer is needed, got bool");
        return 0;
    }
    PyObject *ix = PyNumber_Index(o);
    if (ix == NULL) {
        PyErr_Format(PyExc_TypeError, "an integer is needed, got %.100s",
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    *v = PyLong_AsUnsignedLongLong(ix);
    if (*v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        *v = 0;
        PyErr_Format(PyExc_OverflowError, "%R is not an integer in %s", ix, range);
        Py_DECREF(ix);
        return 0;
    }
    Py_DECREF(ix);
    if (*v > most) {
        PyErr_Format(PyExc_OverflowError, "%llu is not an integer in %s", *v, range);
        return 0;
    }
    return 1;
}

int kvlpy_u64_arg(PyObject *o, void *out)
{
    return kvlpy_uint_arg(o, ULLONG_MAX, "0..2**64 - 1", out);
}

int kvlpy_u32_arg(PyObject *o, void *out)
{
    unsigned long long v;
    if (!kvlpy_uint_arg(o, UINT32_MAX, "0..2**32 - 1", &v))
        return 0;
    *(unsigned int *)out = (unsigned int)v;
    return 1;
}

#define KVLPY_DEV_RANGE "is not a 32-bit device id (-1 for any device, else a GPU ordinal " \
                        "or NUMA node from 0 to 2147483647)"

/* i >= 0: the descriptor it came from, named in the message. */
int kvlpy_dev_i64(long long v, Py_ssize_t i, int32_t *out)
{
    if (v < INT32_MIN || v > INT32_MAX) {
        if (i >= 0)
            PyErr_Format(PyExc_OverflowError, "descriptor %zd: device id %lld " KVLPY_DEV_RANGE,
                         i, v);
        else
            PyErr_Format(PyExc_OverflowError, "device id %lld " KVLPY_DEV_RANGE, v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

int kvlpy_table_row(const uint64_t *row, Py_ssize_t w, int is_signed, Py_ssize_t i,
                    int want_dev, int32_t *dev)
{
    if (is_signed && (int64_t)(row[0] | row[1]) < 0) {
        PyErr_Format(PyExc_ValueError, "descriptor %zd: addr and len must be non-negative "
                     "64-bit integers, got %lld and %lld", i, (long long)(int64_t)row[0],
                     (long long)(int64_t)row[1]);
        return -1;
    }
    if (!want_dev || w < 3)
        return 0;
    if (!is_signed && row[2] > (uint64_t)INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "descriptor %zd: device id %llu " KVLPY_DEV_RANGE, i,
                     (unsigned long long)row[2]);
        return -1;
    }
    return kvlpy_dev_i64((long long)(int64_t)row[2], i, dev);
}

int kvlpy_dev_obj(PyObject *o, Py_ssize_t i, int32_t *out)
{
    PyObject *ix = PyNumber_Index(o);
    if (ix == NULL) {
        PyErr_Clear();
        if (i >= 0)
            PyErr_Format(PyExc_TypeError, "descriptor %zd: a device id must be an integer, "
                         "got %.100s", i, Py_TYPE(o)->tp_name);
        else
            PyErr_Format(PyExc_TypeError, "a device id must be an integer, got %.100s",
                         Py_TYPE(o)->tp_name);
        return -1;
    }
    int over = 0;
    long long v = PyLong_AsLongLongAndOverflow(ix, &over);
    if (over) {
        if (i >= 0)
            PyErr_Format(PyExc_OverflowError, "descriptor %zd: device id %R " KVLPY_DEV_RANGE,
                         i, ix);
        else
            PyErr_Format(PyExc_OverflowError, "device id %R " KVLPY_DEV_RANGE, ix);
        Py_DECREF(ix);
        return -1;
    }
    Py_DECREF(ix);
    if (v == -1 && PyErr_Occurred())
        return -1;
    return kvlpy_dev_i64(v, i, out);
}

int kvlpy_timeout_nan(double timeout_ms)
{
    if (!isnan(timeout_ms))
        return 0;
    PyErr_SetString(PyExc_ValueError, "timeout_ms is NaN: pass milliseconds, or -1 to wait "
                    "without a bound");
    return 1;
}

int kvlpy_array_get(PyObject *obj, int is_signed, const char *argname, kvlpy_array_t *a)
{
    memset(a, 0, sizeof(*a));
    if (PyBytes_Check(obj) || PyByteArray_Check(obj)) {
        /* b"\x01\x02" is not the indices [1, 2] but a message or a blob
         * passed in the wrong place */
        PyErr_Format(PyExc_TypeError, "%s: a sequence or array of integers is needed, got %.100s",
                     argname, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_CheckBuffer(obj) && !PyUnicode_Check(obj)) {
        if (kvlpy_array_from_buffer(obj, is_signed, argname, a) < 0) {
            kvlpy_array_free(a);
            return -1;
        }
        return 0;
    }
    PyObject *seq = PySequence_Fast(obj, "");
    if (seq == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: a sequence or array of integers is needed, got %.100s",
                     argname, Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *out = kvlpy_tmp_alloc(a, (size_t)n);
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i];
        if (PyBool_Check(it)) {
            /* a mask is not a list of indices: [True, False] is not [1, 0] */
            PyErr_Format(PyExc_ValueError, "%s[%zd] is %R, a bool: indices are needed (for a "
                         "mask, np.flatnonzero(mask) gives its indices)", argname, i, it);
            kvlpy_tmp_free(a);
            Py_DECREF(seq);
            return -1;
        }
        if (is_signed) {
            long long v = PyLong_AsLongLong(it);
            if (v == -1 && PyErr_Occurred())
                goto bad;
            out[i] = (uint64_t)v;
        } else {
            unsigned long long v;
            if (PyLong_Check(it)) {
                v = PyLong_AsUnsignedLongLong(it);
            } else {
                PyObject *ix = PyNumber_Index(it);
                if (ix == NULL)
                    goto bad;
                v = PyLong_AsUnsignedLongLong(ix);
                Py_DECREF(ix);
            }
            if (v == (unsigned long long)-1 && PyErr_Occurred())
                goto bad;
            out[i] = v;
        }
        continue;
    bad:
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s[%zd]: %s integer needed, got %.100R", argname, i,
                     is_signed ? "a 64-bit" : "a non-negative 64-bit", it);
        kvlpy_tmp_free(a);
        Py_DECREF(seq);
        return -1;
    }
    Py_DECREF(seq);
    a->data = out;
    a->n = n;
    return 0;
}

void kvlpy_array_free(kvlpy_array_t *a)
{
    if (a->has_view)
        PyBuffer_Release(&a->view);
    a->has_view = 0;
    kvlpy_tmp_free(a);
    a->data = NULL;
}

static int kvlpy_u64(PyObject *o, uint64_t *v)
{
    PyObject *ix = PyNumber_Index(o);
    if (ix == NULL)
        return -1;
    *v = PyLong_AsUnsignedLongLong(ix);
    Py_DECREF(ix);
    return (*v == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

kvl_mem_desc_t *kvlpy_regions_get(PyObject *obj, int32_t def_dev, int force_dev, size_t *n_p)
{
    kvl_mem_desc_t *out = NULL;
    *n_p = 0;
    /* An integer buffer of shape (N, 2) or (N, 3). */
    if (PyObject_CheckBuffer(obj) && !PyBytes_Check(obj)) {
        Py_buffer v;
        if (PyObject_GetBuffer(obj, &v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        char c = kvlpy_format_char(v.format);
        int ok = (c == 'q' || c == 'Q' || c == 'l' || c == 'L' || c == 'n' || c == 'N') &&
                 v.itemsize == 8 && v.ndim == 2 && (v.shape[1] == 2 || v.shape[1] == 3);
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "descriptor array: a C-contiguous int64/uint64 "
                                             "array of shape (N, 3) or (N, 2) is needed");
            PyBuffer_Release(&v);
            return NULL;
        }
        Py_ssize_t n = v.shape[0], w = v.shape[1];
        out = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(*out));
        if (out == NULL) {
            PyBuffer_Release(&v);
            PyErr_NoMemory();
            return NULL;
        }
        const uint64_t *p = v.buf;
        int is_signed = c == 'q' || c == 'l' || c == 'n';
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i].addr = p[i * w];
            out[i].len = p[i * w + 1];
            out[i].dev = def_dev;
            if (kvlpy_table_row(p + i * w, w, is_signed, i, !force_dev, &out[i].dev) < 0) {
                PyBuffer_Release(&v);
                PyMem_Free(out);
                return NULL;
            }
        }
        PyBuffer_Release(&v);
        *n_p = (size_t)n;
        return out;
    }
    PyObject *seq = PySequence_Fast(obj, "descriptors: a list of (addr, len, dev) tuples or an "
                                         "(N, 3) integer array is needed");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(*out));
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        PyObject *ts = (PyTuple_Check(t) || PyList_Check(t)) ? t : NULL;
        Py_ssize_t tn = ts ? PySequence_Fast_GET_SIZE(ts) : 0;
        if (ts == NULL || tn < 2 || tn > 4) {
            PyErr_Format(PyExc_TypeError, "descriptor %zd: an (addr, len, dev) tuple is needed, "
                                          "got %.100R", i, t);
            goto fail;
        }
        PyObject **f = PySequence_Fast_ITEMS(ts);
        if (kvlpy_u64(f[0], &out[i].addr) < 0 || kvlpy_u64(f[1], &out[i].len) < 0)
            goto fail_item;
        out[i].dev = def_dev;
        if (tn >= 3 && !force_dev) {
            if (kvlpy_dev_obj(f[2], i, &out[i].dev) < 0)
                goto fail;
        }
        continue;
    fail_item:
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "descriptor %zd: addr and len must be non-negative "
                                       "64-bit integers, got %.100R", i, t);
        goto fail;
    }
    Py_DECREF(seq);
    *n_p = (size_t)n;
    return out;
fail:
    Py_DECREF(seq);
    PyMem_Free(out);
    return NULL;
}

int kvlpy_kind_get(PyObject *obj, kvl_mem_kind_t *kind_p)
{
    if (obj == NULL || obj == Py_None) {
        *kind_p = KVL_MEM_AUTO;
        return 0;
    }
    if (PyLong_Check(obj) && !PyBool_Check(obj)) { /* True is no kind 1 (DRAM) */
        long k = PyLong_AsLong(obj);
        if (k < KVL_MEM_AUTO || k > KVL_MEM_FILE) {
            PyErr_Format(PyExc_ValueError, "memory kind %ld is not one of 0..3", k);
            return -1;
        }
        *kind_p = (kvl_mem_kind_t)k;
        return 0;
    }
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (s == NULL || kvl_mem_kind_parse(s, kind_p) != KVL_OK) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "memory kind must be \"DRAM\", \"VRAM\", \"FILE\" or "
                                       "\"AUTO\", got %.100R", obj);
        return -1;
    }
    return 0;
}

/* ---- module functions ---------------------------------------------------- */

static PyObject *kvlpy_set_error_factory(PyObject *mod, PyObject *f)
{
    (void)mod;
    Py_XSETREF(kvlpy_error_factory, Py_NewRef(f));
    Py_RETURN_NONE;
}

/* (address, length, readonly) of an object exporting the buffer protocol. */
static PyObject *kvlpy_buffer_info(PyObject *mod, PyObject *obj)
{
    (void)mod;
    Py_buffer v;
    int ro = 0;
    if (PyObject_GetBuffer(obj, &v, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        if (PyObject_GetBuffer(obj, &v, PyBUF_ANY_CONTIGUOUS) < 0)
            return NULL;
        ro = 1;
    }
    PyObject *r = Py_BuildValue("(KnO)", (unsigned long long)(uintptr_t)v.buf, v.len,
                                ro ? Py_True : Py_False);
    PyBuffer_Release(&v);
    return r;
}

static PyObject *kvlpy_shutdown(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    kvlpy_agents_shutdown();
    Py_RETURN_NONE;
}

static PyObject *kvlpy_backend_names(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    PyObject *l = PyList_New(0);
    const char *const *names = kvl_backend_names();
    for (size_t i = 0; l && names && names[i]; i++) {
        PyObject *s = PyUnicode_FromString(names[i]);
        if (s == NULL || PyList_Append(l, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(l);
            break;
        }
        Py_DECREF(s);
    }
    return l;
}

/* (ok, reason) */
static PyObject *kvlpy_backend_available(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    char reason[1024] = "";
    kvl_status_t st = kvl_backend_available(name, reason, sizeof(reason));
    return Py_BuildValue("(Os)", st == KVL_OK ? Py_True : Py_False, reason);
}

static PyObject *kvlpy_backend_params(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    const kvl_param_t *p = kvl_backend_params(name);
    if (p == NULL)
        return kvlpy_raise_msg(KVL_ERR_NOT_FOUND, "unknown backend", "see kvlane.backend_names()");
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && p[i].key; i++) {
        PyObject *v = PyUnicode_FromString(p[i].value ? p[i].value : "");
        if (v == NULL || PyDict_SetItemString(d, p[i].key, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(v);
    }
    return d;
}

/* A status code (an int): one past 32 bits is refused, never cut to them
 * (2**32 once named KVL_OK). 0 ok, -1 with the exception set. */
static int kvlpy_status_arg(PyObject *arg, kvl_status_t *st)
{
    int over = 0;
    long long v = PyLong_AsLongLongAndOverflow(arg, &over);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (over || v < INT_MIN || v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "status code %R is not a 32-bit integer (kvl_status_t"
                     " is an int)", arg);
        return -1;
    }
    *st = (kvl_status_t)v;
    return 0;
}

static PyObject *kvlpy_status_name(PyObject *mod, PyObject *arg)
{
    (void)mod;
    kvl_status_t st;
    if (kvlpy_status_arg(arg, &st) < 0)
        return NULL;
    return PyUnicode_FromString(kvl_status_name(st));
}

static PyObject *kvlpy_status_str(PyObject *mod, PyObject *arg)
{
    (void)mod;
    kvl_status_t st;
    if (kvlpy_status_arg(arg, &st) < 0)
        return NULL;
    return PyUnicode_FromString(kvl_status_str(st));
}

/* rdma_usable() -> bool: an RDMA device whose node opens and which has an
 * ACTIVE port (the scan kvlane doctor and the ucx backend use). */
static PyObject *kvlpy_rdma_usable(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    kvli_rdma_scan_t *scan = calloc(1, sizeof(*scan));
    if (scan == NULL)
        return PyErr_NoMemory();
    int usable = 0;
    Py_BEGIN_ALLOW_THREADS
    kvli_rdma_diag_scan(scan);
    for (unsigned i = 0; i < scan->n && !usable; i++) {
        const kvli_rdma_dev_t *v = &scan->devs[i];
        for (unsigned k = 0; k < v->nports && v->node_openable && !usable; k++)
            usable = strcmp(v->ports[k].state, "ACTIVE") == 0;
    }
    Py_END_ALLOW_THREADS
    free(scan);
    return PyBool_FromLong(usable);
}

static PyObject *kvlpy_listener_built(PyObject *mod, PyObject *unused);

/* engine_rows(rows) -> whether rows is a list of exactly (int, int, int,
 * str) 4-tuples: what engines pass to register_memory, taken without the
 * per-row checks of other shapes (kvlane.nixl). */
static PyObject *kvlpy_engine_rows(PyObject *mod, PyObject *rows)
{
    (void)mod;
    return PyBool_FromLong(kvlpy_engine_rows_ok(rows));
}

static PyMethodDef kvlpy_module_methods[] = {
    {"engine_rows", kvlpy_engine_rows, METH_O,
     "engine_rows(rows) -> True for a list of (int, int, int, str) tuples."},
    {"_nixl_bind", kvlpy_nixl_bind, METH_VARARGS,
     "_nixl_bind(nixlRegDList, nixl_xfer_handle, mem_str, as_error, xfer_failed, Error, "
     "empty): what NixlAgentBase needs from kvlane.nixl."},
    {"_set_error_factory", kvlpy_set_error_factory, METH_O, "Install the exception factory."},
    {"buffer_info", kvlpy_buffer_info, METH_O,
     "buffer_info(obj) -> (address, nbytes, readonly) of a contiguous buffer."},
    {"_shutdown", kvlpy_shutdown, METH_NOARGS, "Close every live agent, newest first."},
    {"backend_names", kvlpy_backend_names, METH_NOARGS, "Backends this build knows."},
    {"backend_available", kvlpy_backend_available, METH_O,
     "backend_available(name) -> (ok, reason)."},
    {"backend_params", kvlpy_backend_params, METH_O,
     "backend_params(name) -> {key: default}."},
    {"rdma_usable", kvlpy_rdma_usable, METH_NOARGS,
     "Whether an RDMA device opens and has an ACTIVE port."},
    {"status_name", kvlpy_status_name, METH_O, "Constant name of a status code."},
    {"status_str", kvlpy_status_str, METH_O, "Short description of a status code."},
    {"listener_built", kvlpy_listener_built, METH_NOARGS,
     "Whether this libkvlane has the agent listener (kvlane/listener.h)."},
    {NULL, NULL, 0, NULL}};

static PyObject *kvlpy_listener_built(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    kvl_status_t (*fn)(kvl_agent_t *, const char *, uint16_t, char *, size_t) = kvl_agent_listen;
    return PyBool_FromLong(fn != NULL);
}

static struct PyModuleDef kvlpy_module = {
    PyModuleDef_HEAD_INIT, "kvlane._kvlane",
    "kvlane's C extension: agents, registration, descriptor lists, transfers.", -1,
    kvlpy_module_methods, NULL, NULL, NULL, NULL};

/* This process's id, without a system call per Python call (getpid is a
 * real one in glibc): set at import, refreshed in the child of a fork. */
static volatile long kvlpy_pid_cached;

static void kvlpy_pid_refresh(void)
{
    kvlpy_pid_cached = (long)getpid();
}

long kvlpy_getpid(void)
{
    return kvlpy_pid_cached;
}

PyMODINIT_FUNC PyInit__kvlane(void);

PyMODINIT_FUNC PyInit__kvlane(void)
{
    kvlpy_pid_refresh();
    if (pthread_atfork(NULL, NULL, kvlpy_pid_refresh) != 0)
        return PyErr_Format(PyExc_ImportError, "pthread_atfork failed: kvlane cannot notice "
                            "a fork of this process");
    PyTypeObject *types[] = {&kvlpy_agent_type, &kvlpy_dlist_type, &kvlpy_prep_type,
                             &kvlpy_xfer_type, &kvlpy_report_type, &kvlpy_nixl_base_type};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&kvlpy_module);
    if (m == NULL)
        return NULL;
    const char *names[] = {"Agent", "DList", "Prep", "Xfer", "RegReport", "NixlAgentBase"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
            goto fail;
    struct {
        const char *name;
        long value;
    } consts[] = {
        {"MEM_AUTO", KVL_MEM_AUTO}, {"MEM_DRAM", KVL_MEM_DRAM}, {"MEM_VRAM", KVL_MEM_VRAM},
        {"MEM_FILE", KVL_MEM_FILE}, {"DEV_ANY", KVL_DEV_ANY}, {"READ", KVL_READ},
        {"WRITE", KVL_WRITE}, {"XFER_IDLE", KVL_XFER_IDLE}, {"XFER_POSTED", KVL_XFER_POSTED},
        {"XFER_DONE", KVL_XFER_DONE}, {"XFER_CANCELED", KVL_XFER_CANCELED},
        {"XFER_ERROR", KVL_XFER_ERROR}, {"REG_ANY", KVL_REG_ANY}, {"REG_ALL", KVL_REG_ALL},
        {"NOTIF_MAX", KVL_NOTIF_MAX}, {"NAME_MAX", KVL_NAME_MAX},
        {"OK", KVL_OK}, {"IN_PROGRESS", KVL_IN_PROGRESS},
    };
    for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
            goto fail;
    if (PyModule_AddStringConstant(m, "version", kvl_version()) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
