from libc.stdint cimport int64_t
from rmqstore._cext cimport rmq_map_t

cdef class MappedSegment:
    cdef rmq_map_t m
    cdef readonly object path
    cdef readonly int64_t base_offset
    cdef public int64_t wrote_pos
    cdef public int64_t flushed_pos
    cdef public int64_t store_timestamp
    cdef int pins
    cdef int exports
    cdef bint closing
    cdef bint unmapped
    cdef int check_range(self, int64_t pos, int64_t n) except -1
    cdef int64_t pin_range(self, int64_t pos, int64_t limit) except -1
    cpdef hold(self)
    cpdef release(self)
    cdef _unpin(self)
    cdef _unmap(self)

cdef int check(int rc, object path, str op) except -1
