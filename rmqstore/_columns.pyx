# cython: boundscheck=False, wraparound=False, cdivision=True
"""Columnar decoding: a run of a segment (decode_batch) or the records consume-queue
entries point at (decode_entries) into a dict of numpy arrays, Arrow-style, with the GIL
released and the segments read pinned."""
from libc.string cimport memcpy
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32, rmq_prefetch
from rmqstore._layout cimport *
from rmqstore._record cimport RecView, parse_record, tags_code_of, status_of, raise_status
from rmqstore._read cimport Span, entry_rows, pin_span, span_prefetch, span_record, unpin_span
from rmqstore._segment cimport MappedSegment, pin, unpin

cnp.import_array()

cdef enum:
    AHEAD = 8   # records ahead of the one measured whose header it prefetches

cdef void measure(const char *base, int64_t pos, int64_t limit, bint check_crc, Extent *x) noexcept nogil:
    """Validate the records of ``base[pos:limit]`` from ``pos`` up to the first that is not
    a message, counting them and their variable-length bytes: what a decoder sizes its
    output by before the second pass fills it. Each record's header is a cache miss the
    hardware does not see coming (one line a record, a page every few); prefetching where
    the header AHEAD records on is when they are the size of this one overlaps those misses
    (7% less CPU for all 20 Arrow columns of 1 KB messages; a wrong guess costs a useless
    prefetch)."""
    cdef RecView r
    cdef int64_t ahead
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
        ahead = pos + AHEAD * <int64_t>r.total
        if ahead + 64 < limit:
            rmq_prefetch(base + ahead)
            rmq_prefetch(base + ahead + 64)
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
    """Empty decode_batch columns for ``n`` records with these variable-length totals. The
    fixed-width columns are rows of one array, the offsets and the hosts likewise: one large
    allocation takes huge pages (numpy asks for them from 4 MiB), a column each would fault
    in 4 KiB at a time."""
    fixed = np.empty((len(BATCH_FIELDS) + 3, n + 1), np.int64)
    hosts = np.zeros((2, n, 16), np.uint8)
    out = {name: fixed[j, :n] for j, name in enumerate(BATCH_FIELDS)}
    out.update(body_data=np.empty(body_total, np.uint8), topic_data=np.empty(topic_total, np.uint8),
               props_data=np.empty(props_total, np.uint8),
               body_offsets=fixed[-3], topic_offsets=fixed[-2], props_offsets=fixed[-1],
               born_addr=hosts[0], store_addr=hosts[1])
    return out


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
    c.o_body[0] = c.o_topic[0] = c.o_props[0] = 0


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


cdef void fill_at(Cols *c, int64_t i, const char *p, RecView *r) noexcept nogil:
    """fill_row for the other modules' decoders."""
    fill_row(c, i, p, r)


cdef void reserve_data(dict out, Cols *c, int64_t body, int64_t topic, int64_t props) except *:
    """Room for ``body``, ``topic`` and ``props`` bytes more in the data columns of ``out``
    (a column that grows at least doubles, in a new array: numpy's huge pages), ``c``
    pointed at them again."""
    for name, used, more in (("body_data", c.bo, body), ("topic_data", c.to, topic), ("props_data", c.po, props)):
        if used + more > len(out[name]):
            grown = np.empty(max(used + more, 2 * len(out[name])), np.uint8)
            grown[:used] = out[name][:used]
            out[name] = grown
    c.bd = <char *>cnp.PyArray_DATA(out["body_data"])
    c.td = <char *>cnp.PyArray_DATA(out["topic_data"])
    c.pd = <char *>cnp.PyArray_DATA(out["props_data"])


cdef void trim(dict out, int64_t n, const Cols *c) except *:
    """The columns of ``out``, made for more rows or bytes than filled, cut to the first ``n``
    rows (views of the same memory)."""
    for name in BATCH_FIELDS + ("born_addr", "store_addr"):
        out[name] = out[name][:n]
    for part, used in (("body", c.bo), ("topic", c.to), ("props", c.po)):
        out[part + "_offsets"] = out[part + "_offsets"][:n + 1]
        out[part + "_data"] = out[part + "_data"][:used]


cdef void fill_batch(const char *base, int64_t avail, int64_t n, dict out) except *:
    """Second pass of decode_batch over ``n`` records the first pass validated."""
    cdef RecView r
    cdef Cols c
    cdef int64_t i, pos = 0
    cols_of(out, &c)
    with nogil:
        for i in range(n):
            parse_record(base + pos, avail - pos, False, &r)
            fill_row(&c, i, base + pos, &r)
            pos += r.total


cdef enum:
    PREFETCH = 16           # records ahead: a queue's records are scattered through the log


def decode_entries(list log not None, cnp.ndarray entries not None, bint check_crc=False):
    """Decode the records that consume-queue ``entries`` (ENTRY_DTYPE) point at in ``log``
    (a commitlog segment list snapshot) into decode_batch's columns, with the GIL released
    and the segments in their range pinned: one pass finds and checks the records and
    sizes the columns exactly, a second fills them. Hole entries are skipped; an entry
    whose record is gone, invalid, elsewhere or of another size is left out and its index
    listed in ``missing`` (int64). ``count`` is the number of rows."""
    cdef Py_ssize_t n, stride, nok = 0, nmiss = 0
    cdef const char *row
    cdef const char **recs
    cdef int64_t lo = 0, hi = -1
    cdef Extent x
    cdef Span span
    span.n = 0
    span.refs = NULL
    row = entry_rows(entries, &n, &stride)
    with nogil:
        entry_range(row, n, stride, &lo, &hi)
    missing = np.empty(n, np.int64)
    cdef int64_t *miss = <int64_t *>cnp.PyArray_DATA(missing)
    recs = <const char **>PyMem_Malloc(max(1, n) * sizeof(const char *))
    try:
        if recs == NULL:
            raise MemoryError()
        pin_span(log, lo, hi, &span)
        with nogil:
            nok = find_records(&span, row, n, stride, check_crc, recs, miss, &nmiss, &x)
        out = new_columns(nok, x.body_bytes, x.topic_bytes, x.props_bytes)
        fill_records(recs, nok, out)
    finally:
        unpin_span(log, &span)
        PyMem_Free(recs)
    out["count"] = nok
    out["missing"] = missing[:nmiss]
    return out


cdef void entry_range(const char *row, Py_ssize_t n, Py_ssize_t stride, int64_t *lo, int64_t *hi) noexcept nogil:
    """The lowest and highest commitlog offset the entries that name a record point at
    (``hi`` < ``lo`` when none does)."""
    cdef const CqEntry *e
    cdef Py_ssize_t k
    lo[0] = 0x7FFFFFFFFFFFFFFF
    hi[0] = -1
    for k in range(n):
        e = <const CqEntry *>(row + k * stride)
        if e.size != HOLE and e.size > 0 and e.phy_offset >= 0:
            lo[0] = min(lo[0], e.phy_offset)
            hi[0] = max(hi[0], e.phy_offset)


cdef Py_ssize_t find_records(const Span *span, const char *row, Py_ssize_t n, Py_ssize_t stride, bint check_crc,
                             const char **recs, int64_t *miss, Py_ssize_t *nmiss, Extent *x) noexcept nogil:
    """decode_entries' first pass: the records the entries point at into ``recs`` (their
    count returned), the indexes of the entries that lead to none into ``miss``, and the
    records' variable-length byte totals into ``x``."""
    cdef RecView r
    cdef const CqEntry *e
    cdef const char *p
    cdef Py_ssize_t k, nok = 0
    x.body_bytes = x.topic_bytes = x.props_bytes = 0
    nmiss[0] = 0
    for k in range(n):
        if k + PREFETCH < n:
            e = <const CqEntry *>(row + (k + PREFETCH) * stride)
            span_prefetch(span, e.phy_offset, e.size)
        e = <const CqEntry *>(row + k * stride)
        if e.size == HOLE:
            continue
        p = span_record(span, e.phy_offset, &r, check_crc, e.size)
        if p == NULL:
            miss[nmiss[0]] = k
            nmiss[0] += 1
            continue
        recs[nok] = p
        nok += 1
        x.body_bytes += r.body_len
        x.topic_bytes += r.topic_len
        x.props_bytes += r.props_len
    return nok


cdef void fill_records(const char **recs, Py_ssize_t n, dict out) except *:
    """decode_entries' second pass: the columns from the ``n`` records find_records checked
    (pinned), GIL released."""
    cdef RecView r
    cdef Cols c
    cdef Py_ssize_t i
    cols_of(out, &c)
    with nogil:
        for i in range(n):
            parse_record(recs[i], rmq_ld32(recs[i]), False, &r)
            fill_row(&c, i, recs[i], &r)
