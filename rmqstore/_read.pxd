# Reads of single records from a commitlog segment list, each under a pin.
from libc.stdint cimport int64_t
cimport numpy as cnp
from rmqstore._record cimport RecView
from rmqstore._segment cimport MappedSegment

cdef MappedSegment record_at(list segs, int64_t offset, bint check_crc, RecView *r, const char **p, int *code)
cdef void prefetch_at(list segs, int64_t offset) noexcept
cdef const char *entry_rows(cnp.ndarray entries, Py_ssize_t *n, Py_ssize_t *stride) except NULL
