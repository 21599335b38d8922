# Consume-queue entries as the read kernels take them, and as writers store them.
from libc.stdint cimport int32_t, int64_t
from rmqstore._cext cimport rmq_ld32, rmq_ld64, rmq_release, rmq_st32, rmq_st64
from rmqstore._layout cimport NOGIL_MIN, CqEntry
from rmqstore._segment cimport MappedSegment, pin, unpin


cdef inline void decode_entries(const char *src, int64_t count, CqEntry *out) noexcept nogil:
    cdef int64_t i
    for i in range(count):
        out[i].phy_offset = rmq_ld64(src)
        out[i].size = rmq_ld32(src + 8)
        out[i].tags_code = rmq_ld64(src + 12)
        src += 20


cdef inline int read_cq_entries(MappedSegment seg, int64_t pos, int64_t count, CqEntry *out) except -1:
    """Decode ``count`` big-endian entries at file position ``pos`` of ``seg`` into ``out``
    (native order), checked against the mapping and pinned, the GIL released for many."""
    seg.check_range(pos, count * 20)
    pin(seg)
    if count * 20 >= NOGIL_MIN:
        with nogil:
            decode_entries(seg.m.base + pos, count, out)
    else:
        decode_entries(seg.m.base + pos, count, out)
    return unpin(seg)


cdef inline void store_entry(char *p, int64_t phy_offset, int32_t size, int64_t tags_code) noexcept nogil:
    """SIZE last (rmq_order.h): an entry a crash cut short reads as size 0, the end of the
    queue, never as a valid entry with a zero offset or tags code."""
    rmq_st64(p, phy_offset)
    rmq_st64(p + 12, tags_code)
    rmq_release()
    rmq_st32(p + 8, size)
