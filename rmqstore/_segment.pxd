from libc.stdint cimport int64_t
from rmqstore._cext cimport rmq_make_t, rmq_make_state, rmq_map_t, rmq_map_let_go, rmq_publish64

cdef class MappedSegment:
    cdef rmq_map_t m
    cdef rmq_make_t mk                  # made ahead (defer): how, and whether it is made yet
    cdef bytes fspath                   # the path mk names
    cdef readonly object path
    cdef readonly int64_t base_offset
    cdef public int64_t wrote_pos
    cdef int waiting                    # set by a thread waiting for wrote_pos to move (rmq_wake.h)
    cdef public int64_t flushed_pos
    cdef public int64_t store_timestamp
    cdef public int64_t ahead           # how far past a write ensure() reserves (0: the whole file)
    cdef int pins
    cdef int exports
    cdef bint closing
    cdef bint unmapped
    cdef int check_range(self, int64_t pos, int64_t n) except -1
    cdef int64_t pin_range(self, int64_t pos, int64_t limit) except -1
    cdef int raise_closed(self) except -1
    cdef int _unmap(self) except -1
    cdef int reserve_to(self, int64_t stop) except -1
    cdef int settle(self, int state) except -1


cdef inline void publish(MappedSegment seg, int64_t pos) noexcept nogil:
    """Move ``wrote_pos`` to ``pos`` (the writer), waking a thread waiting for it to move."""
    rmq_publish64(&seg.wrote_pos, pos, &seg.waiting)


cdef inline int ensure(MappedSegment seg, int64_t end) except -1:
    """Have the blocks of ``[0, end)`` allocated before a write there (DiskFullError, and
    nothing written, when the disk is full): one comparison when they already are."""
    if end <= seg.m.reserved:
        return 0
    return seg.reserve_to(end + seg.ahead if seg.ahead else seg.m.size)


cdef inline bint made(MappedSegment seg) noexcept:
    """Whether the segment is made: always, but for one made ahead (``defer``) still being made."""
    return rmq_make_state(&seg.mk) == 0


cdef inline int pin(MappedSegment seg) except -1:
    """hold(), inline for the kernels' per-record reads: pin the mapping so that unmapping
    waits for unpin(); StoreClosedError when the segment is closing."""
    if seg.closing or seg.unmapped:
        return seg.raise_closed()
    seg.pins += 1
    return 0


cdef inline int unpin(MappedSegment seg) except -1:
    """release(): drop a pin; the last one unmaps a closing segment."""
    seg.pins -= 1
    if seg.pins == 0 and seg.closing and not seg.unmapped:
        return seg._unmap()
    return 0

cdef int check(int rc, object path, str op) except -1
cdef int write_at(MappedSegment seg, int64_t pos, const char *buf, int64_t n) noexcept nogil
cdef int sync_range(rmq_map_t *m, int64_t pos, int64_t n) noexcept nogil
cdef int reserve_range(rmq_map_t *m, int64_t pos, int64_t n) noexcept nogil


cdef class SegmentList:
    cdef public list segments
    cdef public MappedSegment last
    cdef public object _end
    cdef public int64_t file_size
    cdef public dict premade
    cdef public object flusher
    cdef public object follower


cpdef int announce(SegmentList queue, MappedSegment seg) except -1


cpdef int64_t queue_end(SegmentList queue) except -1
cpdef MappedSegment queue_find(SegmentList queue, int64_t offset)


cdef enum:
    LET_GO_WINDOW = 16 << 20   # bytes a scan reads before the pages behind it leave the resident set


cdef inline int64_t let_go_behind(MappedSegment seg, int64_t start, int64_t pos, bint done) noexcept nogil:
    """A scan that reads each page once, at ``pos``, lets go of ``[start, pos)`` (see
    MappedSegment.let_go) once it spans LET_GO_WINDOW, or when ``done``; returns where
    the pages still held begin."""
    if pos - start < LET_GO_WINDOW and not (done and pos > start):
        return start
    rmq_map_let_go(&seg.m, start, pos - start)
    return pos
