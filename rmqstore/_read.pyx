# cython: boundscheck=False, wraparound=False, cdivision=True
"""Reads from commitlog segments: one record (decode_record, get_message), getMessage's
gather over consume-queue entries, and the GIL-free walks over a segment (scan_segment,
scan_dispatch). Every mapping is pinned (hold/release) while it is read."""
cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.list cimport PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy
import numpy as np
cimport numpy as cnp
from rmqstore._layout cimport *
from rmqstore._record cimport RecView, parse_record, parse_at, at_offset, find_property, tags_code_of, status_of, \
    status_text, raise_status, prefetch_bytes
from rmqstore._message cimport build_ext, ext_in
from rmqstore._cq cimport read_cq_entries
from rmqstore._segment cimport MappedSegment, let_go_behind, pin, unpin
from rmqstore._gate cimport Gate
from rmqstore.errors import (CorruptRecordError, InvalidArgumentError, InvalidArgumentTypeError,
                             MessageNotFoundError, StoreClosedError)
from rmqstore._cq import ENTRY_DTYPE

cnp.import_array()

def decode_record(MappedSegment seg not None, int64_t pos, int64_t limit, bint check_crc=False):
    """Decode the record at file position ``pos`` of ``seg``, reading no further than
    ``limit`` (the published write position). Returns a MessageExt, or a tuple
    ("blank"|"end", size) at a BLANK record / end of data; raises CorruptRecordError."""
    cdef RecView r
    cdef int code
    pin(seg)      # StoreClosedError when the segment is closed
    if pos < 0 or pos > seg.m.size:
        unpin(seg)
        raise InvalidArgumentError(f"{seg.path}: position {pos} outside 0..{seg.m.size}")
    try:
        code = parse_at(seg.m.base, seg.m.size, limit, pos, check_crc, &r)
        if code == REC_OK:
            return build_ext(seg.m.base + pos, &r, seg.base_offset + pos)
    finally:
        unpin(seg)
    if code == REC_END:
        return ("end", 0)
    if code == REC_BLANK:
        return ("blank", r.total)
    raise_status(code, seg.base_offset + pos, NULL)


cdef inline Py_ssize_t seg_index(list segs, int64_t offset) noexcept:
    """Index of the last segment of ``segs`` whose base is <= ``offset`` (-1: none)."""
    cdef Py_ssize_t lo = 0, hi = PyList_GET_SIZE(segs), mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if (<MappedSegment>segs[mid]).base_offset <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


cdef MappedSegment record_at(list segs, int64_t offset, bint check_crc, RecView *r, const char **p, int *code):
    """Parse the record starting at commitlog ``offset`` in ``segs`` (a snapshot of the
    segment list, ascending). ``*code`` gets REC_OK, REC_NOSEG / REC_END / REC_BLANK when
    no message starts there, or a negative REC_* when it is invalid (REC_NOTSTART: no
    record starts there, see at_offset). On REC_OK the segment holding it is returned pinned, ``*p`` at the
    record: the caller reads, then calls its release(). Otherwise None, nothing pinned.
    A closed segment raises StoreClosedError."""
    cdef Py_ssize_t i = seg_index(segs, offset)
    cdef MappedSegment seg
    code[0] = REC_NOSEG
    if offset < 0 or i < 0:
        return None
    seg = <MappedSegment>segs[i]
    pin(seg)
    if offset - seg.base_offset < seg.m.size:
        code[0] = parse_at(seg.m.base, seg.m.size, seg.wrote_pos, offset - seg.base_offset, check_crc, r)
        if code[0] == REC_OK and r.phy_offset != offset:
            code[0] = REC_PLACE
        code[0] = at_offset(seg.m.base, min(seg.wrote_pos, seg.m.size), offset - seg.base_offset, offset, code[0])
    if code[0] != REC_OK:
        unpin(seg)
        return None
    p[0] = seg.m.base + (offset - seg.base_offset)
    return seg


def check_start(MappedSegment seg not None, int64_t pos, int64_t limit):
    """Raise NotRecordStartError when no record can start at file position ``pos`` of
    ``seg`` (written up to ``limit``; 0: not known, and 36 zero bytes at ``pos`` are
    taken for the end of data, as is a header whose PHYSICALOFFSET is still 0: a record
    another process is writing), a position a caller gave (see at_offset); a valid
    record, a damaged one, BLANK or end of data pass."""
    cdef RecView r
    cdef int code
    cdef int64_t i
    pin(seg)
    try:
        if 0 <= pos < seg.m.size:
            code = parse_at(seg.m.base, seg.m.size, limit if limit > 0 else seg.m.size, pos, False, &r)
            if code == REC_OK and r.phy_offset != seg.base_offset + pos:
                code = REC_PLACE
            if limit <= 0:
                limit = seg.m.size
                if code == REC_END:
                    i = pos
                    while i < min(pos + 36, seg.m.size) and seg.m.base[i] == 0:
                        i += 1
                    if i == min(pos + 36, seg.m.size):
                        limit = pos
                elif code == REC_PLACE and r.phy_offset == 0:
                    code, limit = REC_END, pos
            code = at_offset(seg.m.base, min(limit, seg.m.size), pos, seg.base_offset + pos, code)
            if code == REC_NOTSTART:
                raise_status(code, seg.base_offset + pos, NULL)
    finally:
        unpin(seg)


cdef void prefetch_at(list segs, int64_t offset, int64_t n) noexcept:
    """Start loading the first ``n`` bytes (512 at most) of the record at commitlog
    ``offset`` into cache, fewer when the data ends before (GIL held; no pin: a prefetch
    reads nothing)."""
    cdef Py_ssize_t i = seg_index(segs, offset)
    cdef MappedSegment seg
    cdef int64_t limit
    if offset < 0 or i < 0:
        return
    seg = <MappedSegment>segs[i]
    if not (seg.closing or seg.unmapped):
        limit = min(seg.wrote_pos, seg.m.size)
        prefetch_bytes(seg.m.base, offset - seg.base_offset, min(n, limit - (offset - seg.base_offset)), limit)


cdef int pin_span(list segs, int64_t lo, int64_t hi, Span *s) except -1:
    """Pin the segments of ``segs`` (a snapshot, ascending) that hold commitlog offsets
    ``lo``..``hi`` into ``s`` (none when ``hi`` < ``lo``); StoreClosedError when one is
    closed, nothing left pinned. Release with unpin_span."""
    cdef Py_ssize_t i0 = max(0, seg_index(segs, lo)), i1 = seg_index(segs, hi) + 1, j
    cdef MappedSegment seg
    s.first = i0
    s.n = 0
    s.refs = <SegRef *>PyMem_Malloc(max(1, i1 - i0) * sizeof(SegRef))
    if s.refs == NULL:
        raise MemoryError()
    try:
        for j in range(i0, i1):
            seg = <MappedSegment>segs[j]
            pin(seg)
            s.refs[s.n].base_offset = seg.base_offset
            s.refs[s.n].base = seg.m.base
            s.refs[s.n].size = seg.m.size
            s.refs[s.n].limit = seg.wrote_pos
            s.n += 1
    except BaseException:
        unpin_span(segs, s)
        raise
    return 0


cdef int unpin_span(list segs, Span *s) except -1:
    """Release what pin_span pinned (once; a second call does nothing)."""
    cdef Py_ssize_t j, n = s.n
    s.n = 0
    try:
        for j in range(s.first, s.first + n):
            unpin(<MappedSegment>segs[j])
    finally:
        PyMem_Free(s.refs)
        s.refs = NULL
    return 0


def get_message(list segs not None, offset, bint check_crc=False):
    """The MessageExt whose record starts at commitlog ``offset`` in ``segs`` (a segment
    list snapshot); MessageNotFoundError when none does, CorruptRecordError when invalid."""
    cdef RecView r
    cdef const char *p = NULL
    cdef int64_t off
    cdef int code
    cdef MappedSegment seg
    try:
        off = offset
    except OverflowError:
        raise MessageNotFoundError(f"no commitlog segment holds offset {offset}") from None
    seg = record_at(segs, off, check_crc, &r, &p, &code)
    if seg is None:
        raise_status(code, off, &r)
    try:
        return build_ext(p, &r, off)
    finally:
        unpin(seg)


cdef const char *entry_rows(cnp.ndarray entries, Py_ssize_t *n, Py_ssize_t *stride) except NULL:
    """The first CqEntry of ``entries`` (checked to be a 1-d ENTRY_DTYPE array), with their
    count and the bytes from one to the next."""
    if entries.dtype != ENTRY_DTYPE or entries.ndim != 1:
        raise InvalidArgumentError("entries must be a 1-d array of consume-queue ENTRY_DTYPE")
    n[0] = entries.shape[0]
    stride[0] = entries.strides[0]
    return <const char *>cnp.PyArray_DATA(entries)


cdef enum:
    PREFETCH_AHEAD = 8    # gather_messages starts loading a record this many entries ahead


cdef struct Found:      # a record gather_messages hands out, read under a pin it holds
    const char *p
    RecView r
    int64_t phy


cdef void copy_found(const Found *found, Py_ssize_t n, char *q) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        memcpy(q, found[i].p, found[i].r.total)
        q += found[i].r.total


def gather_messages(list segs not None, MappedSegment cq_seg not None, int64_t cq_pos, Py_ssize_t n,
                    Py_ssize_t max_count, Py_ssize_t max_msgs, int64_t max_bytes, int64_t cl_max, int64_t file_size,
                    codes, tags):
    """RocketMQ getMessage's loop over the ``n`` consume-queue entries at file position
    ``cq_pos`` of ``cq_seg`` (queue order; the caller keeps them below its write position),
    reading ``segs`` (a commitlog segment list snapshot, files of ``file_size``): hole
    entries are skipped; an entry must pass the tags-code filter ``codes`` (a set, None for
    all), point inside ``cl_max``, lead to a record of its size at its offset and, when
    ``tags`` (a set of str) is given, that record's TAGS must be one of them. Stops before
    the entry that would pass ``max_count`` / ``max_msgs`` messages or ``max_bytes``; after
    a record that is gone, skips the rest of its commitlog file.

    Returns (messages, entries consumed, removing, problems): ``removing`` when a record
    was gone before any message was found; problems are (entry index, phy, size, text to
    log or None). Each record's segment is pinned while it is read, and the found ones'
    until the end, when their records are copied (the GIL released for NOGIL_MIN bytes or
    more) into one buffer that the messages share."""
    cdef Py_ssize_t i, used = 0, nmsg = 0, cap
    cdef int64_t total = 0, at = 0
    cdef bint removing = False
    cdef list msgs = [], problems = [], held = []
    cdef MappedSegment seg
    cdef CqEntry *entries
    cdef Found *found
    cdef char *q
    if n <= 0:
        return msgs, 0, False, problems
    cap = max(1, min(max_count, max_msgs, n))   # the first message is always taken
    entries = <CqEntry *>PyMem_Malloc(n * sizeof(CqEntry))
    found = <Found *>PyMem_Malloc(cap * sizeof(Found))
    try:
        if entries == NULL or found == NULL:
            raise MemoryError()
        read_cq_entries(cq_seg, cq_pos, n, entries)
        gather_loop(segs, entries, n, max_bytes, cl_max, file_size, codes, tags,
                    found, cap, held, problems, &used, &nmsg, &total, &removing)
        owner = PyBytes_FromStringAndSize(NULL, total)
        q = PyBytes_AS_STRING(owner)
        if total >= NOGIL_MIN:
            with nogil:
                copy_found(found, nmsg, q)
        else:
            copy_found(found, nmsg, q)
        at = 0
        for i in range(nmsg):
            msgs.append(ext_in(owner, at, &found[i].r, found[i].phy))
            at += found[i].r.total
    finally:
        for seg in held:
            unpin(seg)
        PyMem_Free(found)
        PyMem_Free(entries)
    return msgs, used, removing, problems


cdef int gather_loop(list segs, const CqEntry *entries, Py_ssize_t n, int64_t max_bytes, int64_t cl_max, int64_t file_size, codes, tags,
                     Found *found, Py_ssize_t cap, list held, list problems, Py_ssize_t *used_out,
                     Py_ssize_t *nmsg_out, int64_t *total_out, bint *removing_out) except -1:
    """gather_messages' walk over the entries: fills ``found`` (``cap`` at most: the
    max_count / max_msgs limit), leaving each found record's segment pinned once in ``held``."""
    cdef RecView r
    cdef const char *p = NULL
    cdef const CqEntry *e
    cdef Py_ssize_t k, used = 0, nmsg = 0
    cdef int64_t phy, total = 0, skip_below = 0
    cdef int32_t size, voff = 0, vlen = 0
    cdef int code
    cdef bint skipping = False, removing = False, wanted, keep
    cdef MappedSegment seg, last_held = None
    for k in range(min(n, PREFETCH_AHEAD)):
        prefetch_at(segs, entries[k].phy_offset, 256)
    for k in range(n):
        if k + PREFETCH_AHEAD < n:      # the records of queue order lie apart: load ahead
            prefetch_at(segs, entries[k + PREFETCH_AHEAD].phy_offset, 256)
        e = &entries[k]
        phy = e.phy_offset
        size = e.size
        if skipping and phy < skip_below:
            used += 1
            continue
        if nmsg and (nmsg >= cap or total + size > max_bytes):
            break
        used += 1
        if size == HOLE:
            continue
        if codes is not None and e.tags_code not in codes:
            continue
        if phy < 0 or size <= 0 or phy + size > cl_max:
            problems.append((k, phy, size, f"CQ entry ({phy}, {size}) points outside the commitlog"))
            continue
        seg = record_at(segs, phy, False, &r, &p, &code)
        if code > 0:
            removing |= not nmsg
            skipping = True
            skip_below = phy + file_size - phy % file_size
            continue
        if code < 0:
            problems.append((k, phy, size, status_text(code, phy, &r)))
            continue
        wanted = keep = False
        try:
            if r.total != size:
                problems.append((k, phy, size, None))
                continue
            wanted = tags is None or (find_property(p + r.props_off, r.props_len, b"TAGS", 4, &voff, &vlen)
                                      and PyUnicode_DecodeUTF8(p + r.props_off + voff, vlen, "replace") in tags)
            if wanted:
                found[nmsg].p = p
                found[nmsg].r = r
                found[nmsg].phy = phy
                if seg is not last_held:    # hold one pin per segment until the copy
                    held.append(seg)
                    last_held = seg
                    keep = True
        finally:
            if not keep:
                unpin(seg)
        if wanted:
            total += size
            nmsg += 1
            skipping = False
    used_out[0] = used
    nmsg_out[0] = nmsg
    total_out[0] = total
    removing_out[0] = removing
    return 0


def decode_bytes(const unsigned char[:] data not None, int64_t offset=0, bint check_crc=False):
    """Decode the record at the start of ``data`` (read from commitlog ``offset``)."""
    cdef RecView r
    cdef bytes b = bytes(data)
    cdef int code = parse_record(PyBytes_AS_STRING(b), len(b), check_crc, &r)
    if code == REC_OK:
        return build_ext(PyBytes_AS_STRING(b), &r, offset)
    if code == REC_END or code == REC_BLANK:
        raise CorruptRecordError(f"commitlog offset {offset}: no message here", offset)
    raise_status(code, offset, NULL)


def scan_messages(MappedSegment seg not None, int64_t pos, int64_t stop, bint check_crc, Py_ssize_t max_count,
                  int64_t max_bytes):
    """The next messages of a commitlog scan from file position ``pos`` of ``seg``: whole
    valid records below its published write position that start before ``stop``, where
    their PHYSICALOFFSET says, at most ``max_count`` of them in at most ``max_bytes``.

    Their bytes are copied once, GIL released, into one buffer the messages share, and
    (``check_crc``) their CRCs checked on that copy. Returns (messages, file position after
    the last); none when the first record is not one of these (BLANK, end of data, corrupt,
    misplaced, longer than ``max_bytes``): the caller reads that one alone."""
    cdef RecView r
    cdef int64_t limit, end = pos, at = 0, phy = seg.base_offset + pos
    cdef Py_ssize_t n = 0, i
    cdef const char *q
    cdef list msgs = []
    if pos < 0 or pos >= min(seg.wrote_pos, seg.m.size) or pos >= stop:
        return msgs, pos
    limit = seg.pin_range(pos, seg.wrote_pos)
    try:
        with nogil:
            while n < max_count and end < stop:
                if parse_record(seg.m.base + end, min(limit - end, max_bytes - (end - pos)), False, &r) != REC_OK \
                        or r.phy_offset != phy + (end - pos):
                    break
                end += r.total
                n += 1
        if n:
            owner = PyBytes_FromStringAndSize(NULL, end - pos)
            q = PyBytes_AS_STRING(owner)
            if end - pos >= NOGIL_MIN:
                with nogil:
                    memcpy(<char *>q, seg.m.base + pos, end - pos)
            else:
                memcpy(<char *>q, seg.m.base + pos, end - pos)
    finally:
        unpin(seg)
    if n == 0:
        return msgs, pos
    if check_crc:
        n = crc_prefix(q, end - pos, n)
    for i in range(n):      # the copy parses as the mapping did (CRC aside): it is a snapshot
        parse_record(q + at, end - pos - at, False, &r)
        msgs.append(ext_in(owner, at, &r, phy + at))
        at += r.total
    return msgs, pos + at


cdef Py_ssize_t crc_prefix(const char *q, int64_t size, Py_ssize_t n) noexcept:
    """How many of the ``n`` records at ``q`` (``size`` bytes) pass their body CRC before
    the first that does not (GIL released for NOGIL_MIN bytes or more)."""
    if size < NOGIL_MIN:
        return crc_run(q, size, n)
    with nogil:
        return crc_run(q, size, n)


cdef Py_ssize_t crc_run(const char *q, int64_t size, Py_ssize_t n) noexcept nogil:
    cdef RecView r
    cdef int64_t at = 0
    cdef Py_ssize_t i = 0
    while i < n and parse_record(q + at, size - at, True, &r) == REC_OK:
        at += r.total
        i += 1
    return i


@cython.final
cdef class Flatten:
    """An iterator over the items of the lists ``chunks`` yields (a scan's batches), with
    no Python frame per item; once ``gate`` (the store's) is closing, StoreClosedError,
    also for the items of a batch already read. Once used up it stays so (StopIteration),
    closed store or not, as the iterator protocol wants."""
    cdef object chunks
    cdef list batch
    cdef Py_ssize_t i
    cdef Gate gate

    def __cinit__(self, chunks, Gate gate not None):
        self.chunks = iter(chunks)
        self.batch = []
        self.i = 0
        self.gate = gate

    def __iter__(self):
        return self

    def __reduce__(self):
        raise InvalidArgumentTypeError("a scan iterator cannot be pickled or copied; scan again from an offset")

    def __next__(self):
        if self.chunks is None:
            raise StopIteration
        if self.gate.closing:
            raise StoreClosedError(f"{self.gate.path}: store is closed")
        while self.i >= PyList_GET_SIZE(self.batch):
            try:
                self.batch = next(self.chunks)
            except StopIteration:
                self.chunks = None
                raise
            self.i = 0
        self.i += 1
        return self.batch[self.i - 1]


def scan_segment(MappedSegment seg not None, int64_t pos, int64_t limit, bint check_crc, bint check_place=False,
                 bint let_go=False):
    """Walk records from ``pos`` with the GIL released. Returns (end_pos, count, status,
    last_ts) where status (a _record.Status) is END (zero TOTALSIZE / limit), BLANK (BLANK
    record: end_pos is the file end) or why the record at end_pos is invalid, and newest_ts
    is the newest store time of the valid records passed (0: none; the newest, not the
    last: store times need not grow along the log, the clock may step back). ``check_place`` also
    stops at a record whose PHYSICALOFFSET field is not where it lies (verify; recovery,
    like RocketMQ's, does not look at that field). ``let_go``: the pages read leave the
    resident set behind the scan (verify, recovery: memory follows a window, not the file)."""
    cdef RecView r
    cdef int code = REC_END
    cdef int64_t count = 0, last_ts = 0, base_offset = seg.base_offset, held = pos
    cdef const char *base
    limit = seg.pin_range(pos, limit)
    base = seg.m.base
    try:
        with nogil:
            while pos < limit:
                code = parse_record(base + pos, limit - pos, check_crc, &r)
                if code != REC_OK:
                    break
                if check_place and r.phy_offset != base_offset + pos:
                    code = REC_PLACE
                    break
                pos += r.total
                count += 1
                if r.store_ts > last_ts:
                    last_ts = r.store_ts
                if let_go:
                    held = let_go_behind(seg, held, pos, False)
            if let_go:
                let_go_behind(seg, held, pos, True)
            if pos >= limit and code == REC_OK:
                code = REC_END
    finally:
        unpin(seg)
    if code == REC_BLANK:
        pos += r.total
    return (pos, count, status_of(code), last_ts)


DISPATCH_DTYPE = np.dtype([("phy_offset", "<i8"), ("size", "<i4"), ("queue_id", "<i4"),
                           ("queue_offset", "<i8"), ("sys_flag", "<i4"), ("tags_code", "<i8"),
                           ("store_timestamp", "<i8"), ("topic_off", "<i4"), ("topic_len", "<i4"),
                           ("props_off", "<i4"), ("props_len", "<i4")], align=False)
assert DISPATCH_DTYPE.itemsize == sizeof(DispatchRow)


def scan_dispatch(MappedSegment seg not None, int64_t pos, int64_t limit, int64_t max_records=1 << 30):
    """Index the records in ``[pos, limit)`` for dispatch with the GIL released.

    Returns (rows of DISPATCH_DTYPE, raw, end_pos, status): ``raw`` holds each record's
    topic and properties bytes, which the rows' topic/props positions point into (not the
    bodies: dispatch never reads them, and copying them cost as much as the write did for
    large bodies); status (a _record.Status) is END, BLANK (end_pos is then the file end)
    or why the record at end_pos is invalid."""
    cdef RecView r
    cdef int code = REC_END
    cdef int64_t n = 0, start = pos, end = pos, kept = 0
    cdef char *q
    cdef DispatchRow *out
    limit = seg.pin_range(pos, limit)
    try:
        with nogil:
            while end < limit and n < max_records:
                code = parse_record(seg.m.base + end, limit - end, False, &r)
                if code != REC_OK:
                    break
                end += r.total
                kept += r.topic_len + r.props_len
                n += 1
                code = REC_END
        rows = np.empty(n, DISPATCH_DTYPE)
        raw = PyBytes_FromStringAndSize(NULL, kept)
        q = PyBytes_AS_STRING(raw)
        out = <DispatchRow *>cnp.PyArray_DATA(rows)
        with nogil:
            dispatch_fill(seg.m.base + start, limit - start, n, out, seg.base_offset + start, q)
    finally:
        unpin(seg)
    if code == REC_BLANK:
        end += r.total
    return rows, raw, end, status_of(code)


cdef inline int64_t fill_row(DispatchRow *row, int64_t phy, int32_t size, int32_t queue_id, int64_t queue_offset,
                             int32_t sys_flag, int64_t store_ts, const char *topic, int32_t topic_len,
                             const char *props, int32_t props_len, char *raw, int64_t at) noexcept nogil:
    """One dispatch row (its tags code read from ``props``), its topic and properties bytes
    copied to ``raw`` at ``at``, where the row points; returns the position after them."""
    row.phy_offset, row.size, row.queue_id, row.queue_offset = phy, size, queue_id, queue_offset
    row.sys_flag = sys_flag
    row.tags_code = tags_code_of(props, props_len)
    row.store_timestamp = store_ts
    row.topic_off, row.topic_len = <int32_t>at, topic_len
    memcpy(raw + at, topic, topic_len)
    at += topic_len
    row.props_off, row.props_len = <int32_t>at, props_len
    memcpy(raw + at, props, props_len)
    return at + props_len


cdef void dispatch_fill(const char *base, int64_t avail, int64_t n, DispatchRow *row, int64_t phy,
                        char *raw) noexcept nogil:
    """Fill ``n`` rows from records already validated by the caller's first pass, and copy
    each one's topic and properties bytes to ``raw``, where the rows point."""
    cdef RecView r
    cdef int64_t i, pos = 0, at = 0
    cdef const char *p
    for i in range(n):
        p = base + pos
        parse_record(p, avail - pos, False, &r)
        at = fill_row(row, phy + pos, r.total, r.queue_id, r.queue_offset, r.sys_flag, r.store_ts,
                      p + r.topic_off, r.topic_len, p + r.props_off, r.props_len, raw, at)
        pos += r.total
        row += 1


def column_rows(const int64_t[::1] phy not None, const int64_t[::1] size not None, const int32_t[::1] queue_id not None,
                const int64_t[::1] queue_offset not None, const int64_t[::1] sys_flag not None, int64_t store_ts,
                const int64_t[::1] topic_ids not None, list topics not None, const unsigned char[::1] props not None,
                const int64_t[::1] props_offsets not None, const int64_t[::1] born_offsets not None,
                int32_t store_host_len):
    """What scan_dispatch returns for records put_columns just wrote (rows and raw, the
    same bytes), from the columns it wrote them from: ``phy`` .. ``queue_offset`` as it
    returned them, ``sys_flag`` as given (the host IPv6 bits set here as the kernel sets
    them, from ``born_offsets``, n + 1 offsets of the packed born hosts, a row of 0 bytes
    being the store host), its store timestamp, each row's index into ``topics`` (UTF-8
    bytes) and the properties column (``props`` with n + 1 ``props_offsets``). None when
    raw would pass the int32 positions of the rows (the caller scans instead)."""
    cdef Py_ssize_t n = phy.shape[0], i, nt = len(topics)
    cdef int64_t kept = 0, at = 0, p0, plen, blen
    cdef int32_t flag
    cdef const char **tp
    cdef int32_t *tl
    cdef char *q
    cdef DispatchRow *row
    cdef const char *pd = ""
    if not (size.shape[0] == queue_id.shape[0] == queue_offset.shape[0] == sys_flag.shape[0] == topic_ids.shape[0]
            == n == props_offsets.shape[0] - 1 == born_offsets.shape[0] - 1):
        raise InvalidArgumentError(f"column_rows: columns of different lengths for {n} rows")
    if not all(isinstance(t, bytes) for t in topics):
        raise InvalidArgumentTypeError("column_rows: topics must be bytes")
    for i in range(n):
        if not 0 <= topic_ids[i] < nt:
            raise InvalidArgumentError(f"column_rows: row {i}: topic id {topic_ids[i]} not below {nt}")
        if not 0 <= props_offsets[i] <= props_offsets[i + 1] <= props.shape[0]:
            raise InvalidArgumentError(f"column_rows: row {i}: properties offsets out of range")
        kept += len(<bytes>topics[topic_ids[i]]) + props_offsets[i + 1] - props_offsets[i]
    if kept > 0x7FFFFFFF:
        return None
    tp = <const char **>PyMem_Malloc(max(nt, 1) * sizeof(char *))
    tl = <int32_t *>PyMem_Malloc(max(nt, 1) * sizeof(int32_t))
    if tp == NULL or tl == NULL:
        PyMem_Free(tp)
        PyMem_Free(tl)
        raise MemoryError()
    for i in range(nt):
        tp[i], tl[i] = PyBytes_AS_STRING(topics[i]), <int32_t>len(<bytes>topics[i])
    if props.shape[0]:
        pd = <const char *>&props[0]
    rows = np.empty(n, DISPATCH_DTYPE)
    raw = PyBytes_FromStringAndSize(NULL, kept)
    q = PyBytes_AS_STRING(raw)
    row = <DispatchRow *>cnp.PyArray_DATA(rows)
    with nogil:
        for i in range(n):
            p0, plen = props_offsets[i], props_offsets[i + 1] - props_offsets[i]
            blen = born_offsets[i + 1] - born_offsets[i]
            flag = (<int32_t>sys_flag[i] & ~(BORN_V6 | STORE_V6)) | (STORE_V6 if store_host_len == 20 else 0) \
                | (BORN_V6 if blen == 20 or blen == 0 and store_host_len == 20 else 0)
            at = fill_row(row, phy[i], <int32_t>size[i], queue_id[i], queue_offset[i], flag, store_ts,
                          tp[topic_ids[i]], tl[topic_ids[i]], pd + p0, <int32_t>plen, q, at)
            row += 1
    PyMem_Free(tp)
    PyMem_Free(tl)
    return rows, raw
