# cython: boundscheck=False, wraparound=False, cdivision=True
"""A list of bytes packed as a column, as ``put_columns`` takes born hosts: one bytes object
holding them all and int64 offsets (row i is ``data[off[i]:off[i + 1]]``), in one C pass."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int64_t
from libc.string cimport memcpy
import numpy as np


def pack_bytes(list values not None):
    """(data, offsets) of a list whose items are all exactly ``bytes``; None when one is
    not (the caller takes the general path)."""
    values = list(values)   # our own: nothing (a finaliser run by an allocation) can change it
    cdef Py_ssize_t i, n = PyList_GET_SIZE(values)
    cdef object v
    cdef char *out
    offsets = np.empty(n + 1, np.int64)
    cdef int64_t[::1] off = offsets
    off[0] = 0
    for i in range(n):
        v = <object>PyList_GET_ITEM(values, i)
        if not PyBytes_CheckExact(v):
            return None
        off[i + 1] = off[i] + PyBytes_GET_SIZE(v)
    data = PyBytes_FromStringAndSize(NULL, off[n])
    out = PyBytes_AS_STRING(data)
    for i in range(n):
        v = <object>PyList_GET_ITEM(values, i)
        memcpy(out + off[i], PyBytes_AS_STRING(v), off[i + 1] - off[i])
    return data, offsets
