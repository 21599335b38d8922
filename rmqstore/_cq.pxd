# Consume-queue entries as the read kernels take them.
from libc.stdint cimport int64_t
from rmqstore._cext cimport rmq_ld32, rmq_ld64
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
