# cython: boundscheck=False, wraparound=False, cdivision=True
"""Columnar decoding: a run of a segment (decode_batch) or the records consume-queue
entries point at (decode_entries) into a dict of numpy arrays, Arrow-style, with the GIL
released and the segments read pinned."""
from cpython.list cimport PyList_GET_SIZE
from libc.string cimport memcpy
from libc.stdlib cimport malloc, free
from libc.stdint cimport int32_t, int64_t, uint8_t
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32
from rmqstore._layout cimport *
from rmqstore._record cimport RecView, parse_record, parse_at, tags_code_of, status_of, raise_status, prefetch_bytes
from rmqstore._read cimport entry_rows
from rmqstore._segment cimport MappedSegment, pin, unpin

cnp.import_array()

cdef void measure(const char *base, int64_t pos, int64_t limit, bint check_crc, Extent *x) noexcept nogil:
    """Validate the records of ``base[pos:limit]`` from ``pos`` up to the first that is not
    a message, counting them and their variable-length bytes: what a decoder sizes its
    output by before the second pass fills it."""
    cdef RecView r
    x.count = x.body_bytes = x.topic_bytes = x.props_bytes = 0
    x.code = REC_END
    x.blank_size = 0
    while pos < limit:
        x.code = parse_record(base + pos, limit - pos, check_crc, &r)
        if x.code != REC_OK:
            if x.code == REC_BLANK:
                x.blank_size = r.total
            break
        x.count += 1
        x.body_bytes += r.body_len
        x.topic_bytes += r.topic_len
        x.props_bytes += r.props_len
        pos += r.total
        x.code = REC_END
    x.end = pos


BATCH_FIELDS = ("phy_offset", "store_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
                "sys_flag", "born_timestamp", "store_timestamp", "reconsume_times",
                "prepared_transaction_offset", "tags_code", "born_port", "store_port")


def decode_batch(MappedSegment seg not None, int64_t pos, int64_t limit, bint check_crc=False,
                 bint skip_corrupt=False):
    """Decode every record in ``[pos, limit)`` of ``seg`` into columns (dict of numpy arrays).

    Variable-length fields come Arrow-style: ``body_data`` (uint8, all bodies back to back)
    with ``body_offsets`` (int64, n+1), and likewise ``topic_*`` and ``props_*``; hosts as
    ``born_addr`` / ``store_addr`` (uint8 [n,16], IPv4 in the first 4 bytes; the sys_flag
    bits say which) with ``*_port``. Bodies are copied exactly once. Stops at end of data or
    a BLANK record. A corrupt record raises CorruptRecordError, or with ``skip_corrupt`` ends
    the batch with ``corrupt_at`` set to its commitlog offset (else -1). ``end_pos`` is the
    file position where decoding stopped; ``stop`` (a _record.Status) says why."""
    cdef Extent x
    limit = seg.pin_range(pos, limit)
    try:
        with nogil:
            measure(seg.m.base, pos, limit, check_crc, &x)
        if x.code < 0 and not skip_corrupt:
            raise_status(x.code, seg.base_offset + x.end, NULL)
        out = new_columns(x.count, x.body_bytes, x.topic_bytes, x.props_bytes)
        fill_batch(seg.m.base + pos, limit - pos, x.count, out)
    finally:
        unpin(seg)
    out["count"] = x.count
    out["end_pos"] = x.end + x.blank_size
    out["corrupt_at"] = seg.base_offset + x.end if x.code < 0 else -1
    out["stop"] = status_of(x.code)
    return out


cdef dict new_columns(int64_t n, int64_t body_total, int64_t topic_total, int64_t props_total):
    """Empty decode_batch columns for ``n`` records with these variable-length totals."""
    out = {name: np.empty(n, np.int64) for name in BATCH_FIELDS}
    out.update(body_data=np.empty(body_total, np.uint8), topic_data=np.empty(topic_total, np.uint8),
               props_data=np.empty(props_total, np.uint8),
               body_offsets=np.empty(n + 1, np.int64), topic_offsets=np.empty(n + 1, np.int64),
               props_offsets=np.empty(n + 1, np.int64),
               born_addr=np.zeros((n, 16), np.uint8), store_addr=np.zeros((n, 16), np.uint8))
    return out


cdef struct Cols:
    int64_t *f[15]          # BATCH_FIELDS, in order
    int64_t *o_body
    int64_t *o_topic
    int64_t *o_props
    uint8_t *a_born
    uint8_t *a_store
    char *bd
    char *td
    char *pd
    int64_t bo, to, po      # bytes of body/topic/props data filled so far


cdef void cols_of(dict out, Cols *c) except *:
    cdef int j
    for j, name in enumerate(BATCH_FIELDS):
        c.f[j] = <int64_t *>cnp.PyArray_DATA(out[name])
    c.o_body = <int64_t *>cnp.PyArray_DATA(out["body_offsets"])
    c.o_topic = <int64_t *>cnp.PyArray_DATA(out["topic_offsets"])
    c.o_props = <int64_t *>cnp.PyArray_DATA(out["props_offsets"])
    c.a_born = <uint8_t *>cnp.PyArray_DATA(out["born_addr"])
    c.a_store = <uint8_t *>cnp.PyArray_DATA(out["store_addr"])
    c.bd = <char *>cnp.PyArray_DATA(out["body_data"])
    c.td = <char *>cnp.PyArray_DATA(out["topic_data"])
    c.pd = <char *>cnp.PyArray_DATA(out["props_data"])
    c.bo = c.to = c.po = 0


cdef inline void fill_row(Cols *c, int64_t i, const char *p, RecView *r) noexcept nogil:
    """Row ``i`` of the columns from the record at ``p`` (already validated into ``r``)."""
    cdef int64_t v[15]      # BATCH_FIELDS, in order
    cdef int j
    v[:] = [r.phy_offset, r.total, r.magic, r.body_crc, r.queue_id, r.flag, r.queue_offset, r.sys_flag,
            r.born_ts, r.store_ts, r.reconsume, r.prepared, tags_code_of(p + r.props_off, r.props_len),
            rmq_ld32(p + r.born_off + r.born_len), rmq_ld32(p + r.store_off + r.store_len)]
    for j in range(15):
        c.f[j][i] = v[j]
    memcpy(c.a_born + i * 16, p + r.born_off, r.born_len)
    memcpy(c.a_store + i * 16, p + r.store_off, r.store_len)
    c.o_body[i] = c.bo
    c.o_topic[i] = c.to
    c.o_props[i] = c.po
    memcpy(c.bd + c.bo, p + r.body_off, r.body_len)
    memcpy(c.td + c.to, p + r.topic_off, r.topic_len)
    memcpy(c.pd + c.po, p + r.props_off, r.props_len)
    c.bo += r.body_len
    c.to += r.topic_len
    c.po += r.props_len
    c.o_body[i + 1] = c.bo
    c.o_topic[i + 1] = c.to
    c.o_props[i + 1] = c.po


cdef void fill_batch(const char *base, int64_t avail, int64_t n, dict out) except *:
    """Second pass of decode_batch over ``n`` records the first pass validated."""
    cdef RecView r
    cdef Cols c
    cdef int64_t i, pos = 0
    cols_of(out, &c)
    c.o_body[0] = c.o_topic[0] = c.o_props[0] = 0
    with nogil:
        for i in range(n):
            parse_record(base + pos, avail - pos, False, &r)
            fill_row(&c, i, base + pos, &r)
            pos += r.total


cdef struct SegRef:
    int64_t base_offset
    const char *base
    int64_t size
    int64_t limit           # published write position when pinned


cdef inline Py_ssize_t seg_ref_index(SegRef *refs, Py_ssize_t n, int64_t offset) noexcept nogil:
    """Index of the last pinned segment whose base is <= ``offset`` (-1: none)."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if refs[mid].base_offset <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


cdef inline const char *seg_ref_find(SegRef *refs, Py_ssize_t n, int64_t offset, RecView *r, bint check_crc,
                                     int32_t size) noexcept nogil:
    """The record at commitlog ``offset`` in the pinned ``refs`` when it is valid, there,
    and ``size`` bytes long; NULL otherwise."""
    cdef Py_ssize_t i = seg_ref_index(refs, n, offset)
    cdef int64_t pos
    if i < 0:
        return NULL
    pos = offset - refs[i].base_offset
    if pos >= refs[i].size or parse_at(refs[i].base, refs[i].size, refs[i].limit, pos, check_crc, r) != REC_OK:
        return NULL
    if r.phy_offset != offset or r.total != size:
        return NULL
    return refs[i].base + pos


cdef enum:
    PREFETCH = 16           # records ahead: a queue's records are scattered through the log


cdef inline void prefetch_record(SegRef *refs, Py_ssize_t n, int64_t offset, int32_t size) noexcept nogil:
    """Start loading the record at commitlog ``offset`` (up to 512 bytes of it) into cache."""
    cdef Py_ssize_t i = seg_ref_index(refs, n, offset)
    if i >= 0:
        prefetch_bytes(refs[i].base, offset - refs[i].base_offset, size, refs[i].limit)


def decode_entries(list log not None, cnp.ndarray entries not None, bint check_crc=False):
    """Decode the records that consume-queue ``entries`` (ENTRY_DTYPE) point at in ``log``
    (a commitlog segment list snapshot) into decode_batch's columns, in one pass with the
    GIL released and the segments in their range pinned. Hole entries are skipped; an entry
    whose record is gone, invalid, elsewhere or of another size is left out and its index
    listed in ``missing`` (int64). ``count`` is the number of rows. The data columns are
    sized from the entry sizes and returned as views of what was filled."""
    cdef Py_ssize_t n, k, i0 = 0, i1 = 0, nref = 0, j, nmiss = 0
    cdef Py_ssize_t stride
    cdef const char *row
    cdef const char *p
    cdef const CqEntry *e
    cdef int64_t phy, lo = 0x7FFFFFFFFFFFFFFF, hi = -1, nok = 0, rows = 0, nbytes = 0
    cdef int32_t size
    cdef RecView r
    cdef Cols c
    cdef MappedSegment seg
    row = entry_rows(entries, &n, &stride)
    for k in range(n):
        phy = (<const CqEntry *>(row + k * stride)).phy_offset
        size = (<const CqEntry *>(row + k * stride)).size
        if size != HOLE and size > 0 and phy >= 0:
            lo = min(lo, phy)
            hi = max(hi, phy)
            rows += 1
            nbytes += size
    for j in range(PyList_GET_SIZE(log)):       # the segments holding [lo, hi]
        seg = <MappedSegment>log[j]
        if seg.base_offset <= lo:
            i0 = j
        if seg.base_offset <= hi:
            i1 = j + 1
    cdef SegRef *refs = <SegRef *>malloc(max(1, i1 - i0) * sizeof(SegRef))
    missing = np.empty(n, np.int64)
    cdef int64_t *miss = <int64_t *>cnp.PyArray_DATA(missing)
    out = new_columns(rows, nbytes, nbytes, nbytes)   # a record's parts are each shorter than it
    cols_of(out, &c)
    c.o_body[0] = c.o_topic[0] = c.o_props[0] = 0
    try:
        if refs == NULL:
            raise MemoryError()
        for j in range(i0, i1):
            seg = <MappedSegment>log[j]
            pin(seg)
            refs[nref].base_offset = seg.base_offset
            refs[nref].base = seg.m.base
            refs[nref].size = seg.m.size
            refs[nref].limit = seg.wrote_pos
            nref += 1
        with nogil:
            for k in range(n):
                if k + PREFETCH < n:
                    e = <const CqEntry *>(row + (k + PREFETCH) * stride)
                    prefetch_record(refs, nref, e.phy_offset, e.size)
                e = <const CqEntry *>(row + k * stride)
                size = e.size
                if size == HOLE:
                    continue
                p = seg_ref_find(refs, nref, e.phy_offset, &r, check_crc, size)
                if p == NULL:
                    miss[nmiss] = k
                    nmiss += 1
                else:
                    fill_row(&c, nok, p, &r)
                    nok += 1
    finally:
        for j in range(i0, i0 + nref):
            unpin(<MappedSegment>log[j])
        free(refs)
    for name in BATCH_FIELDS + ("born_addr", "store_addr"):
        out[name] = out[name][:nok]
    for name in ("body", "topic", "props"):
        out[name + "_offsets"] = out[name + "_offsets"][:nok + 1]
    out["body_data"] = out["body_data"][:c.bo]
    out["topic_data"] = out["topic_data"][:c.to]
    out["props_data"] = out["props_data"][:c.po]
    out["count"] = nok
    out["missing"] = missing[:nmiss]
    return out

