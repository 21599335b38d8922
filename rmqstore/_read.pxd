# Reads of records from a commitlog segment list, each under a pin.
from libc.stdint cimport int32_t, int64_t
cimport numpy as cnp
from rmqstore._layout cimport REC_OK
from rmqstore._record cimport RecView, parse_at, prefetch_bytes
from rmqstore._segment cimport MappedSegment

cdef MappedSegment record_at(list segs, int64_t offset, bint check_crc, RecView *r, const char **p, int *code)
cdef void prefetch_at(list segs, int64_t offset, int64_t n) noexcept
cdef const char *entry_rows(cnp.ndarray entries, Py_ssize_t *n, Py_ssize_t *stride) except NULL


cdef struct SegRef:         # one pinned segment of a Span, as the GIL-free loops read it
    int64_t base_offset
    const char *base
    int64_t size
    int64_t limit           # published write position when pinned


cdef struct Span:           # the segments of a list holding a range of commitlog offsets, pinned
    SegRef *refs
    Py_ssize_t first        # index in the list of refs[0]
    Py_ssize_t n

cdef int pin_span(list segs, int64_t lo, int64_t hi, Span *s) except -1
cdef int unpin_span(list segs, Span *s) except -1


cdef inline Py_ssize_t span_index(const Span *s, int64_t offset) noexcept nogil:
    """Index in ``s.refs`` of the last segment whose base is <= ``offset`` (-1: none)."""
    cdef Py_ssize_t lo = 0, hi = s.n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if s.refs[mid].base_offset <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


cdef inline const char *span_record(const Span *s, int64_t offset, RecView *r, bint check_crc,
                                    int32_t size) noexcept nogil:
    """The record at commitlog ``offset`` in the pinned span when it is valid, there, and
    (``size`` >= 0) ``size`` bytes long; NULL otherwise."""
    cdef Py_ssize_t i = span_index(s, offset)
    cdef const SegRef *g
    if i < 0:
        return NULL
    g = &s.refs[i]
    if offset - g.base_offset >= g.size \
            or parse_at(g.base, g.size, g.limit, offset - g.base_offset, check_crc, r) != REC_OK:
        return NULL
    if r.phy_offset != offset or (size >= 0 and r.total != size):
        return NULL
    return g.base + (offset - g.base_offset)


cdef inline void span_prefetch(const Span *s, int64_t offset, int64_t size) noexcept nogil:
    """Start loading the record at commitlog ``offset`` (up to 512 bytes of it) into cache."""
    cdef Py_ssize_t i = span_index(s, offset)
    if i >= 0:
        prefetch_bytes(s.refs[i].base, offset - s.refs[i].base_offset, size, s.refs[i].limit)
