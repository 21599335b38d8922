# put_columns' inputs (see _rows.pyx), for the Appender.
from libc.stdint cimport int64_t


cdef const int64_t[::1] column_offsets(object offsets, Py_ssize_t data_len, str what) except *
cdef const int64_t[::1] zeros(Py_ssize_t n)
cdef const int64_t[::1] int_column(object values, Py_ssize_t n, int64_t lo, int64_t hi, str what) except *


cdef class BodyRows:
    cdef const char **ptr           # a sequence's items (NULL for a column)
    cdef int64_t *len
    cdef const char *base           # a column: row i at base + off[i]
    cdef const int64_t[::1] off
    cdef Py_buffer *views           # per row, where pinned[i]
    cdef char *pinned
    cdef Py_ssize_t n
    cdef object keep
    cdef const unsigned char[::1] data

    cdef int _pin(self, Py_ssize_t i, object v) except -1
    cdef void _release(self) noexcept

    cdef inline int64_t length(self, Py_ssize_t i) noexcept:
        return self.len[i] if self.ptr != NULL else self.off[i + 1] - self.off[i]
