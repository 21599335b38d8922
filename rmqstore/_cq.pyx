# cython: boundscheck=False, wraparound=False, cdivision=True
"""Consume-queue kernels: 20-byte big-endian entries (commitlog offset i64, size i32,
tags code i64) appended into and read out of a mapped segment."""
from libc.stdint cimport int32_t, int64_t
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32, rmq_ld64, rmq_st32, rmq_st64
from rmqstore._segment cimport MappedSegment
from rmqstore.errors import StoreClosedError

cnp.import_array()

ENTRY_SIZE = 20
ENTRY_DTYPE = np.dtype([("phy_offset", "<i8"), ("size", "<i4"), ("tags_code", "<i8")], align=False)


def append_entry(MappedSegment seg, int64_t phy_offset, int32_t size, int64_t tags_code):
    """Write one entry at the write position and publish it."""
    cdef int64_t pos = seg.wrote_pos
    seg.check_range(pos, 20)
    cdef char *p = seg.m.base + pos
    rmq_st64(p, phy_offset)
    rmq_st32(p + 8, size)
    rmq_st64(p + 12, tags_code)
    seg.wrote_pos = pos + 20


def read_entries(MappedSegment seg, int64_t pos, int64_t count):
    """``count`` entries from file position ``pos`` as a numpy array of ENTRY_DTYPE."""
    cdef int64_t i
    cdef const char *src
    cdef char *dst
    seg.check_range(pos, count * 20)
    out = np.empty(count, ENTRY_DTYPE)
    if count == 0:
        return out
    if not seg.hold():
        raise StoreClosedError(f"{seg.path}: segment is closed")
    src = seg.m.base + pos
    dst = <char *>cnp.PyArray_DATA(out)
    try:
        with nogil:
            for i in range(count):
                (<int64_t *>dst)[0] = rmq_ld64(src)
                (<int32_t *>(dst + 8))[0] = rmq_ld32(src + 8)
                (<int64_t *>(dst + 12))[0] = rmq_ld64(src + 12)
                src += 20
                dst += 20
    finally:
        seg.release()
    return out


def valid_end(MappedSegment seg, int64_t pos, int64_t limit):
    """First position at or after ``pos`` whose entry is not valid (offset >= 0 and size > 0),
    as RocketMQ's ConsumeQueue.recover walks; returns (end, max_physic_end)."""
    cdef int64_t off, end_phy = -1
    cdef int32_t size
    if limit > seg.m.size:
        limit = seg.m.size
    seg.check_range(pos, limit - pos)
    with nogil:
        while pos + 20 <= limit:
            off = rmq_ld64(seg.m.base + pos)
            size = rmq_ld32(seg.m.base + pos + 8)
            if off < 0 or size <= 0:
                break
            if size != 0x7FFFFFFF:
                end_phy = off + size
            pos += 20
    return pos, end_phy
