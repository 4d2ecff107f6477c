/*
 * kvlane Python extension (kvlane._kvlane): shared declarations.
 *
 * Objects: Agent (kvlpy_agent.c), DList (kvlpy_dlist.c), Prep and Xfer
 * (kvlpy_xfer.c). Errors become instances of the classes in kvlane/errors.py
 * through a factory the package installs (kvlpy_module.c).
 *
 * Lifetime: Prep and Xfer hold a strong reference to their Agent. An agent
 * closed explicitly or by the atexit hook destroys its transfers and
 * prepared lists in C; the Python objects then only forget their pointers.
 * Every call that releases the GIL is counted in agent->active, and closing
 * waits for that count to drop to zero, so no call runs on a destroyed agent.
 */
#ifndef KVLPY_H
#define KVLPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <kvlane/kvlane.h>

/* Whether the interpreter is shutting down (public from Python 3.13, which
 * removed the older private name). */
#if PY_VERSION_HEX >= 0x030D0000
#define kvlpy_finalizing() Py_IsFinalizing()
#else
#define kvlpy_finalizing() _Py_IsFinalizing()
#endif

/* The exception being raised, taken off the thread with its traceback (a
 * new reference; NULL when none), and put back (the reference is stolen).
 * Python 3.12 deprecates PyErr_Fetch/PyErr_Restore for these two. */
static inline PyObject *kvlpy_err_take(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_DECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static inline void kvlpy_err_give(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    if (exc == NULL)
        return;
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

/* The agent listener (src/store/) may be absent from the library this module
 * is linked with; its entry points are weak so that the module loads anyway
 * and the methods that need them raise UnsupportedError. */
#pragma weak kvl_agent_listen
#pragma weak kvl_metadata_fetch
#pragma weak kvl_metadata_push
#pragma weak kvl_metadata_push_partial
#pragma weak kvl_metadata_invalidate

/* Cast a METH_VARARGS|METH_KEYWORDS function to PyCFunction without a
 * -Wcast-function-type warning. */
#define KVLPY_FN(f) ((PyCFunction)(void (*)(void))(f))

/* Longest slice a blocking wait runs without the GIL, so that signals are
 * seen and closing an agent never waits long. */
#define KVLPY_WAIT_SLICE_MS 50

typedef struct kvlpy_agent {
    PyObject_HEAD
    kvl_agent_t *agent;       /* NULL once closed */
    int closing;              /* set (with the GIL) when close begins */
    long active;              /* calls running without the GIL (changed with the GIL) */
    long pid;                 /* process that created it: a forked child never uses it */
    struct kvlpy_agent *live_prev, *live_next;
    PyObject *weakrefs;
} kvlpy_agent_t;

typedef struct {
    PyObject_HEAD
    kvl_dlist_t *dl;
    long busy;                /* calls reading dl without the GIL (changed with the GIL) */
} kvlpy_dlist_t;

typedef struct {
    PyObject_HEAD
    kvlpy_agent_t *owner;     /* strong reference */
    kvl_prep_t *prep;         /* NULL once released */
    long busy;
    PyObject *remote;         /* str or None */
} kvlpy_prep_t;

typedef struct {
    PyObject_HEAD
    kvlpy_agent_t *owner;     /* strong reference */
    kvl_xfer_t *xfer;         /* NULL once released */
    long busy;
    int op;
    PyObject *remote;         /* str */
} kvlpy_xfer_t;

extern PyTypeObject kvlpy_agent_type;
extern PyTypeObject kvlpy_dlist_type;
extern PyTypeObject kvlpy_prep_type;
extern PyTypeObject kvlpy_xfer_type;
extern PyTypeObject kvlpy_report_type;
extern PyTypeObject kvlpy_nixl_base_type;

/* post() -> True when already complete, False while moving (kvlpy_xfer.c). */
PyObject *kvlpy_xfer_post(kvlpy_xfer_t *self, PyObject *unused);
/* test() -> True done, False moving; raises the transfer's error. */
PyObject *kvlpy_xfer_test(kvlpy_xfer_t *self, PyObject *unused);

/* A call about to read dl->dl without the GIL marks the list busy: until
 * it ends, every method that changes or replaces the list raises
 * KVL_ERR_IN_USE (another thread could free the entries being read). */
static inline void kvlpy_dlist_hold(kvlpy_dlist_t *dl) { dl->busy++; }
static inline void kvlpy_dlist_unhold(kvlpy_dlist_t *dl) { dl->busy--; }

/* ---- kvlane.nixl's C part (kvlpy_nixl.c) ---- */

/* _nixl_bind(): hands NixlAgentBase what it needs from kvlane.nixl. */
PyObject *kvlpy_nixl_bind(PyObject *mod, PyObject *args);
/* 1 when rows is a list of (int, int, int, str) tuples, as engines pass to
 * register_memory (taken without the per-row checks of other shapes). */
int kvlpy_engine_rows_ok(PyObject *rows);

/* ---- errors (kvlpy_module.c) ---- */

/* Raise the exception for a failed call that returned st: the calling
 * thread's kvl_last_error() when it matches, else one made from st.
 * report (optional) is attached. Always returns NULL. */
PyObject *kvlpy_raise(kvl_status_t st, PyObject *report);
/* Same with an error saved by the caller (err may be NULL). */
PyObject *kvlpy_raise_err(const kvl_error_t *err, kvl_status_t st, PyObject *report);
/* Raise an error decided by the extension itself (usage errors). */
PyObject *kvlpy_raise_msg(kvl_status_t st, const char *what, const char *hint);

/* ---- integer arrays from buffers or sequences (kvlpy_module.c) ---- */

typedef struct {
    Py_buffer view;
    int has_view;
    void *tmp;                /* converted copy, freed by kvlpy_array_free */
    size_t tmp_cap;           /* its bytes */
    const void *data;         /* n 8-byte integers */
    Py_ssize_t n;
} kvlpy_array_t;

/* obj: a C-contiguous buffer of integers (any width; 8-byte ones used in
 * place, others converted) or a sequence of ints. Signed results for
 * is_signed, else unsigned; negative values are refused when unsigned. */
/* getpid() of this process, cached (refreshed after fork). */
long kvlpy_getpid(void);

int kvlpy_array_get(PyObject *obj, int is_signed, const char *argname, kvlpy_array_t *a);
/* "O&" converters: an unsigned 64- / 32-bit argument, refused (OverflowError,
 * TypeError) when negative, too large or not an integer. */
int kvlpy_u64_arg(PyObject *o, void *out);
int kvlpy_u32_arg(PyObject *o, void *out);
/* A device id as libkvlane takes it (int32_t: -1 any, else a GPU ordinal
 * or NUMA node; the library judges the value). One outside int32_t is
 * refused (OverflowError naming it), never cut to 32 bits, where 2**32
 * would become device 0. i >= 0 names the descriptor it came from. 0 ok,
 * -1 with the exception set. */
int kvlpy_dev_i64(long long v, Py_ssize_t i, int32_t *out);
int kvlpy_dev_obj(PyObject *o, Py_ssize_t i, int32_t *out);
/* Row i (w 2 or 3 columns) of a descriptor table read as 8-byte integers,
 * signed (is_signed: format q, l, n) or not: a negative addr or len is
 * refused (ValueError), as in a tuple, never read as 2**64 - x; with
 * want_dev the third column is checked as kvlpy_dev_i64 does (an unsigned
 * 2**64 - 1 is no -1) and stored in *dev. 0 ok, -1 with the exception set. */
int kvlpy_table_row(const uint64_t *row, Py_ssize_t w, int is_signed, Py_ssize_t i,
                    int want_dev, int32_t *dev);
/* 1 (ValueError set) when a wait's timeout_ms is NaN, which compares false
 * with everything and once waited forever; else 0. */
int kvlpy_timeout_nan(double timeout_ms);
void kvlpy_array_free(kvlpy_array_t *a);

/* Regions/descriptors: a sequence of (addr, len[, dev[, anything]]) or an
 * integer buffer of shape (N, 2) or (N, 3). dev defaults to def_dev; with
 * force_dev set every dev becomes def_dev. Returns a PyMem_Malloc'ed array. */
kvl_mem_desc_t *kvlpy_regions_get(PyObject *obj, int32_t def_dev, int force_dev, size_t *n_p);

/* Parse "DRAM"/"VRAM"/"FILE"/"AUTO" (str) or an int kind. */
int kvlpy_kind_get(PyObject *obj, kvl_mem_kind_t *kind_p);

/* ---- agent helpers (kvlpy_agent.c) ---- */

/* Check the agent is open and count a call that will release the GIL.
 * Returns -1 with an exception set when closed. */
int kvlpy_agent_enter(kvlpy_agent_t *a);
void kvlpy_agent_leave(kvlpy_agent_t *a);
/* Register regions (as kvlpy_regions_get reads them; dev and force_dev as
 * there) with prm: the report object (None when the library made none), or
 * NULL with kvlane's exception set, the report attached. */
PyObject *kvlpy_agent_register_rows(kvlpy_agent_t *self, PyObject *regions,
                                    const kvl_reg_params_t *prm, int32_t dev, int force_dev);
/* Deregister them: None, or NULL with the exception set. */
PyObject *kvlpy_agent_deregister_rows(kvlpy_agent_t *self, PyObject *regions, int32_t dev,
                                      int force_dev);
/* Close every live agent, newest first (the atexit hook). */
void kvlpy_agents_shutdown(void);

#endif
