/* A constructor whose argument parsing fails (no topic, an extra argument, an unknown
 * keyword) raises the library's TypeError subclass instead of a bare TypeError: the type's
 * tp_vectorcall (when set) and tp_init are wrapped, and a TypeError that is not already of
 * that subclass is raised again as it, with its message. The wrappers cost one call on
 * success. One wrapped type per including module (header-only, static state). */
#ifndef RMQ_ARGTYPE_H
#define RMQ_ARGTYPE_H

#include <Python.h>

static vectorcallfunc rmq_argtype_vectorcall;
static initproc rmq_argtype_init;
static PyObject *rmq_argtype_error;     /* the TypeError subclass raised instead */
static const char *rmq_argtype_name;    /* how the call is named in the message */

static void rmq_argtype_retype(void)
{
    PyObject *text;
    if (!PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(rmq_argtype_error))
        return;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
    text = PyObject_Str(exc);
    Py_DECREF(exc);
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    text = value != NULL ? PyObject_Str(value) : PyUnicode_FromString("bad arguments");
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
#endif
    if (text == NULL)
        return;                          /* its error stands */
    PyErr_Format(rmq_argtype_error, "%s: %U", rmq_argtype_name, text);
    Py_DECREF(text);
}

static PyObject *rmq_argtype_call(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *obj = rmq_argtype_vectorcall(type, args, nargsf, kwnames);
    if (obj == NULL)
        rmq_argtype_retype();
    return obj;
}

static int rmq_argtype_tp_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    int r = rmq_argtype_init(self, args, kwds);
    if (r < 0)
        rmq_argtype_retype();
    return r;
}

/* Wrap the constructor calls of ``t``: ``error`` (a TypeError subclass) instead of a bare
 * TypeError, the message prefixed with ``name`` (a string that outlives the type). */
static int rmq_argtype_wrap(PyTypeObject *t, PyObject *error, const char *name)
{
    Py_INCREF(error);
    rmq_argtype_error = error;
    rmq_argtype_name = name;
    rmq_argtype_init = t->tp_init;
    t->tp_init = rmq_argtype_tp_init;
    if (t->tp_vectorcall != NULL) {
        rmq_argtype_vectorcall = t->tp_vectorcall;
        t->tp_vectorcall = rmq_argtype_call;
    }
    PyType_Modified(t);
    return 0;
}

#endif
