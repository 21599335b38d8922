# cython: boundscheck=False, wraparound=False, cdivision=True
"""put_columns' inputs: offset and integer columns checked, and the bodies held where
they lie (BodyRows) until the call ends."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdlib cimport calloc, free, malloc
from libc.stdint cimport int64_t
import numpy as np
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError


cdef const int64_t[::1] column_offsets(object offsets, Py_ssize_t data_len, str what) except *:
    """``offsets`` as int64, checked: n + 1 non-decreasing values within [0, data_len]."""
    cdef const int64_t[::1] o = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef Py_ssize_t i
    if o.shape[0] < 1 or o[0] < 0 or o[o.shape[0] - 1] > data_len:
        raise InvalidArgumentError(f"{what} offsets must run from >= 0 to <= {data_len}")
    for i in range(o.shape[0] - 1):
        if o[i + 1] < o[i]:
            raise InvalidArgumentError(f"{what} offsets must not decrease (row {i})")
    return o


cdef object _zeros = np.zeros(0, np.int64)


cdef const int64_t[::1] zeros(Py_ssize_t n):
    """``n`` int64 zeros, read only, shared by the calls (a column given as None: no fresh
    pages to fault in and fill per call)."""
    global _zeros
    if _zeros.shape[0] < n:
        _zeros = np.zeros(n, np.int64)
        _zeros.flags.writeable = False
    return _zeros[:n]


cdef const int64_t[::1] int_column(object values, Py_ssize_t n, int64_t lo, int64_t hi, str what) except *:
    """``values`` as ``n`` int64s in [lo, hi] (None: ``n`` zeros)."""
    if values is None:
        return zeros(n)
    a = np.asarray(values)
    if a.shape != (n,) or (n and a.dtype.kind not in "iu"):
        raise InvalidArgumentTypeError(f"{what} must be {n} ints")
    if n and (a.min() < lo or a.max() > hi):
        raise InvalidArgumentError(f"{what} must be in [{lo}, {hi}]")
    return np.ascontiguousarray(a, dtype=np.int64)


cdef class BodyRows:
    """The bodies of a put_columns call where they lie, and what keeps those bytes in place
    until the call ends: a contiguous column's buffer (``data`` with n + 1 ``offsets``,
    read in place), or a sequence of bytes-like items (``offsets`` None) as (pointer,
    length) per row, the items held as our own
    tuple; bytes are immutable and any other item is pinned by a buffer export (a
    bytearray cannot be resized meanwhile; its bytes may still change: the CRC is taken
    from the copy). So a list of bytes is copied once, into the mapping."""

    def __cinit__(self, data, offsets):
        cdef Py_ssize_t i
        cdef tuple items
        cdef object v
        if offsets is None:
            if isinstance(data, (str, bytes, bytearray, memoryview)) or not hasattr(data, "__iter__"):
                raise InvalidArgumentTypeError(f"bodies must be a sequence of bytes-like objects, "
                                               f"not {type(data).__name__}")
            items = self.keep = tuple(data)
            self.n = len(items)
        else:
            self.data = data
            self.off = column_offsets(offsets, self.data.shape[0], "body")
            self.n = self.off.shape[0] - 1
            self.base = ""
            if self.data.shape[0]:
                self.base = <const char *>&self.data[0]
            return
        self.ptr = <const char **>malloc(max(self.n, 1) * sizeof(char *))
        self.len = <int64_t *>malloc(max(self.n, 1) * sizeof(int64_t))
        if self.ptr == NULL or self.len == NULL:
            raise MemoryError()
        for i in range(self.n):
            v = items[i]
            if PyBytes_CheckExact(v):
                self.ptr[i], self.len[i] = PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v)
            else:
                self._pin(i, v)

    cdef int _pin(self, Py_ssize_t i, object v) except -1:
        if self.views == NULL:
            self.views = <Py_buffer *>calloc(self.n, sizeof(Py_buffer))
            self.pinned = <char *>calloc(self.n, 1)
            if self.views == NULL or self.pinned == NULL:
                raise MemoryError()
        if not isinstance(v, str):
            try:
                PyObject_GetBuffer(v, &self.views[i], PyBUF_SIMPLE)   # fails for strided views
                self.pinned[i] = 1
            except (BufferError, TypeError, ValueError):
                pass
        if not self.pinned[i]:
            raise InvalidArgumentTypeError(f"bodies: {type(v).__name__} where contiguous bytes are due")
        self.ptr[i], self.len[i] = <const char *>self.views[i].buf, self.views[i].len
        return 0

    def __len__(self):
        return self.n

    def release(self):
        """Drop the buffer exports (also done when the object goes)."""
        self._release()

    cdef void _release(self) noexcept:
        cdef Py_ssize_t i
        if self.views != NULL:
            for i in range(self.n):
                if self.pinned[i]:
                    PyBuffer_Release(&self.views[i])
            free(self.views)
            free(self.pinned)
            self.views, self.pinned = NULL, NULL

    def __dealloc__(self):
        self._release()
        free(self.ptr)
        free(self.len)
