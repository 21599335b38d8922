# cython: boundscheck=False, wraparound=False, cdivision=True
"""Consume-queue kernels: 20-byte big-endian entries (commitlog offset i64, size i32,
tags code i64) appended into and read out of a mapped segment."""
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcmp
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32, rmq_ld64, rmq_st32, rmq_st64
from rmqstore._layout cimport CqEntry, HOLE
from rmqstore._segment cimport MappedSegment, ensure, pin, unpin
from rmqstore.errors import OutOfRangeError

cnp.import_array()

ENTRY_SIZE = sizeof(CqEntry)
ENTRY_DTYPE = np.dtype([("phy_offset", "<i8"), ("size", "<i4"), ("tags_code", "<i8")], align=False)
assert ENTRY_DTYPE.itemsize == sizeof(CqEntry)


def append_entry(MappedSegment seg not None, int64_t phy_offset, int32_t size, int64_t tags_code):
    """Write one entry at the write position and publish it."""
    cdef int64_t pos = seg.wrote_pos
    seg.check_range(pos, 20)
    ensure(seg, pos + 20)
    cdef char *p = seg.m.base + pos
    rmq_st64(p, phy_offset)
    rmq_st32(p + 8, size)
    rmq_st64(p + 12, tags_code)
    seg.wrote_pos = pos + 20


def read_entries(MappedSegment seg not None, int64_t pos, int64_t count):
    """``count`` entries from file position ``pos`` as a numpy array of ENTRY_DTYPE."""
    seg.check_range(pos, count * 20)
    out = np.empty(count, ENTRY_DTYPE)
    if count > 0:
        read_cq_entries(seg, pos, count, <CqEntry *>cnp.PyArray_DATA(out))
    return out


def valid_end(MappedSegment seg not None, int64_t pos, int64_t limit):
    """First position at or after ``pos`` whose entry is not valid (offset >= 0 and size > 0),
    as RocketMQ's ConsumeQueue.recover walks; returns (end, max_physic_end)."""
    cdef int64_t off, end_phy = -1
    cdef int32_t size
    limit = seg.pin_range(pos, limit)
    try:
        with nogil:
            while pos + 20 <= limit:
                off = rmq_ld64(seg.m.base + pos)
                size = rmq_ld32(seg.m.base + pos + 8)
                if off < 0 or size <= 0:
                    break
                if size != HOLE:
                    end_phy = off + size
                pos += 20
    finally:
        unpin(seg)
    return pos, end_phy


def append_entries(MappedSegment seg not None, const int64_t[:] phy not None, const int32_t[:] size not None,
                   const int64_t[:] tags not None, Py_ssize_t start, Py_ssize_t stop):
    """Write entries ``[start, stop)`` of the arrays at the write position, as many as the
    segment has room for, and publish them; returns how many were written."""
    cdef Py_ssize_t i, n
    cdef char *p
    if start < 0 or stop > phy.shape[0] or stop > size.shape[0] or stop > tags.shape[0] or start > stop:
        raise OutOfRangeError(f"entry range [{start}, {stop}) outside the arrays")
    n = min(stop - start, (seg.m.size - seg.wrote_pos) // 20)
    seg.check_range(seg.wrote_pos, n * 20)
    ensure(seg, seg.wrote_pos + n * 20)
    p = seg.m.base + seg.wrote_pos
    with nogil:
        for i in range(start, start + n):
            rmq_st64(p, phy[i])
            rmq_st32(p + 8, size[i])
            rmq_st64(p + 12, tags[i])
            p += 20
    seg.wrote_pos += n * 20
    return n


def topic_ids(bytes raw not None, const int32_t[:] off not None, const int32_t[:] length not None,
              dict ids not None, list names not None):
    """Per-row topic number (an index into ``names``) of dispatch rows whose topics lie at
    ``raw[off:off+length]``; new topics are decoded once and appended to ``names``."""
    cdef Py_ssize_t i, n = off.shape[0], size = len(raw)
    cdef const char *base = raw
    cdef int32_t prev_off = -1, prev_len = -1, prev_id = -1
    out = np.empty(n, np.int32)
    cdef int32_t[::1] o = out
    for i in range(n):
        if off[i] < 0 or length[i] < 0 or off[i] + length[i] > size:
            raise OutOfRangeError(f"topic of row {i} outside the batch bytes")
        if prev_id >= 0 and length[i] == prev_len and memcmp(base + off[i], base + prev_off, prev_len) == 0:
            o[i] = prev_id
            continue
        key = raw[off[i]:off[i] + length[i]]
        tid = ids.get(key)
        if tid is None:
            tid = ids[key] = len(names)
            names.append(key.decode("utf-8", "replace"))
        prev_off, prev_len, prev_id = off[i], length[i], tid
        o[i] = prev_id
    return out
