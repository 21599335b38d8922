# cython: boundscheck=False, wraparound=False, cdivision=True
"""Consume-queue kernels: 20-byte big-endian entries (commitlog offset i64, size i32,
tags code i64) appended into and read out of a mapped segment."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcmp, memset
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32, rmq_ld64
from rmqstore._layout cimport PAGE_SHIFT, CqEntry, DispatchRow, HOLE, gets_cq_entry_c
from rmqstore._segment cimport MappedSegment, ensure, pin, unpin
from rmqstore.errors import InvalidArgumentError, OutOfRangeError

cdef enum:
    TOPICS_SEEN = 16   # distinct topics topic_ids tells apart without the GIL

cnp.import_array()

ENTRY_SIZE = sizeof(CqEntry)
ENTRY_DTYPE = np.dtype([("phy_offset", "<i8"), ("size", "<i4"), ("tags_code", "<i8")], align=False)
assert ENTRY_DTYPE.itemsize == sizeof(CqEntry)


def append_entry(MappedSegment seg not None, int64_t phy_offset, int32_t size, int64_t tags_code):
    """Write one entry at the write position and publish it. An entry that is the first
    to touch a page is written with the GIL released: the dispatcher writes these, and the
    page fault (milliseconds on a busy disk) would otherwise stall every other thread."""
    cdef int64_t pos = seg.wrote_pos
    seg.check_range(pos, 20)
    ensure(seg, pos + 20)
    cdef char *p = seg.m.base + pos
    if (pos - 1) >> PAGE_SHIFT == (pos + 19) >> PAGE_SHIFT:
        store_entry(p, phy_offset, size, tags_code)
    else:
        with nogil:
            store_entry(p, phy_offset, size, tags_code)
    seg.wrote_pos = pos + 20


def read_entries(MappedSegment seg not None, int64_t pos, int64_t count):
    """``count`` entries from file position ``pos`` as a numpy array of ENTRY_DTYPE."""
    seg.check_range(pos, count * 20)
    out = np.empty(count, ENTRY_DTYPE)
    if count > 0:
        read_cq_entries(seg, pos, count, <CqEntry *>cnp.PyArray_DATA(out))
    return out


def valid_end(MappedSegment seg not None, int64_t pos, int64_t limit, int64_t end_phy=-1, bint ordered=True):
    """First position at or after ``pos`` whose entry is not valid, and the commitlog
    offset the last valid one's message ends at (``end_phy``: that of the entries before
    ``pos``, -1 for none). Valid as RocketMQ's ConsumeQueue.recover walks (offset >= 0 and
    size > 0), and, if ``ordered``, in commitlog order: a message starting before the
    previous one ends is damage (a torn or overwritten entry), not a message dispatched
    after it."""
    cdef int64_t off
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
                    if off < end_phy and ordered:
                        break
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
            store_entry(p, phy[i], size[i], tags[i])
            p += 20
    seg.wrote_pos += n * 20
    return n


def append_runs(list segs not None, const int64_t[:] ends not None, const int64_t[:] phy not None,
                const int32_t[:] size not None, const int64_t[:] tags not None,
                const int64_t[:] queue_offsets not None, const int64_t[:] starts not None):
    """The consume-queue writes of a dispatch batch in one GIL-free pass. Run k is entries
    ``[starts[k], starts[k + 1])`` of the arrays, for the queue whose last file is
    ``segs[k]`` (None: no file yet) and whose last entry's message ends at ``ends[k]``. A
    run whose queue offsets go on one by one from where that file ends, and whose first
    message ends after ``ends[k]``, is written there and published, as far as the file
    has room; returns how many entries each run got, 0 for the others
    (``ConsumeQueue.put_run`` takes them: a duplicate, a gap, a first file). One call per
    queue, or Python code per entry, released the GIL and took it back once a queue while
    a putting thread waited for it."""
    cdef Py_ssize_t k, i, nseg = len(segs), narr = min(phy.shape[0], size.shape[0], tags.shape[0],
                                                        queue_offsets.shape[0])
    cdef MappedSegment seg
    cdef int64_t lo, hi, pinned = 0
    if starts.shape[0] != nseg + 1 or ends.shape[0] != nseg:
        raise InvalidArgumentError(f"{nseg} segments, {ends.shape[0]} ends, {starts.shape[0]} run starts")
    if len(set(id(x) for x in segs if x is not None)) != sum(x is not None for x in segs):
        raise InvalidArgumentError("a segment appears twice")
    for k in range(nseg):
        if starts[k] < 0 or starts[k + 1] > narr or starts[k] > starts[k + 1]:
            raise OutOfRangeError(f"entry range [{starts[k]}, {starts[k + 1]}) outside the arrays")
    counts = np.zeros(nseg, np.int64)
    cdef int64_t[::1] n = counts
    cdef char **dst = <char **>malloc((nseg + 1) * sizeof(char *))
    if dst == NULL:
        raise MemoryError()
    try:
        for k in range(nseg):
            if segs[k] is None:
                continue
            seg = segs[k]
            lo, hi = starts[k], starts[k + 1]
            # queue_offsets[lo] is checked in range before it is added to (no overflow)
            if lo == hi or not 0 <= queue_offsets[lo] <= (seg.base_offset + seg.wrote_pos) // 20 \
                    or queue_offsets[lo] * 20 != seg.base_offset + seg.wrote_pos \
                    or queue_offsets[hi - 1] != queue_offsets[lo] + (hi - lo - 1) \
                    or phy[lo] + size[lo] <= ends[k]:
                continue
            n[k] = min(hi - lo, (seg.m.size - seg.wrote_pos) // 20)
            seg.check_range(seg.wrote_pos, n[k] * 20)
            ensure(seg, seg.wrote_pos + n[k] * 20)
        for k in range(nseg):
            if n[k]:
                seg = segs[k]
                pin(seg)
                pinned = k + 1
                dst[k] = seg.m.base + seg.wrote_pos
        with nogil:
            for k in range(nseg):
                for i in range(starts[k], starts[k] + n[k]):
                    store_entry(dst[k], phy[i], size[i], tags[i])
                    dst[k] += 20
        for k in range(nseg):
            if n[k]:
                seg = segs[k]
                seg.wrote_pos += n[k] * 20
    finally:
        for k in range(pinned):
            if n[k]:
                unpin(<MappedSegment>segs[k])
        free(dst)
    return counts


cdef struct Seen:   # the topics topic_ids met last, as (offset, length) in the batch bytes
    int32_t off[TOPICS_SEEN]
    int32_t len[TOPICS_SEEN]
    int32_t id[TOPICS_SEEN]
    int n
    int last


cdef Py_ssize_t match_seen(const char *base, Py_ssize_t size, const int32_t[:] off, const int32_t[:] length,
                           Py_ssize_t i, Py_ssize_t n, Seen *s, int32_t *o) noexcept nogil:
    """Number rows ``i..`` whose topics are in ``s``; returns the first row with another
    one (or out of bounds), ``n`` when none is."""
    cdef int j, k
    for i in range(i, n):
        if off[i] < 0 or length[i] < 0 or off[i] + length[i] > size:
            return i
        for k in range(s.n):
            j = (s.last + k) % s.n   # the previous row's topic first
            if length[i] == s.len[j] and memcmp(base + off[i], base + s.off[j], s.len[j]) == 0:
                o[i], s.last = s.id[j], j
                break
        else:
            return i
    return n


def topic_ids(bytes raw not None, const int32_t[:] off not None, const int32_t[:] length not None,
              dict ids not None, list names not None):
    """Per-row topic number (an index into ``names``) of dispatch rows whose topics lie at
    ``raw[off:off+length]``; new topics are decoded once and appended to ``names``. Rows
    of the last TOPICS_SEEN topics are matched without the GIL, in one stretch up to the
    next row of another topic (in a batch of one topic: once, after its first row)."""
    cdef Py_ssize_t i = 0, n = off.shape[0], size = len(raw)
    cdef const char *base = raw
    cdef Seen seen
    seen.n = seen.last = 0
    if off.shape[0] > length.shape[0]:
        raise OutOfRangeError("fewer topic lengths than offsets")
    out = np.empty(n, np.int32)
    cdef int32_t[::1] o = out
    while i < n:
        if seen.n:
            with nogil:
                i = match_seen(base, size, off, length, i, n, &seen, &o[0])
            if i == n:
                break
        if off[i] < 0 or length[i] < 0 or off[i] + length[i] > size:
            raise OutOfRangeError(f"topic of row {i} outside the batch bytes")
        key = raw[off[i]:off[i] + length[i]]
        tid = ids.get(key)
        if tid is None:
            tid = ids[key] = len(names)
            names.append(key.decode("utf-8", "replace"))
        seen.last = seen.n if seen.n < TOPICS_SEEN else i % TOPICS_SEEN
        seen.n = max(seen.n, seen.last + 1)
        seen.off[seen.last], seen.len[seen.last], seen.id[seen.last] = off[i], length[i], tid
        o[i] = tid
        i += 1
    return out


cdef inline Py_ssize_t lower_bound(const int64_t *a, Py_ssize_t n, int64_t x, Py_ssize_t hint) noexcept nogil:
    """The first index of ascending ``a[:n]`` whose value is >= ``x`` (``n`` when none),
    galloping out from ``hint``: a queue's entries come in commitlog order, so each is
    found a few messages after the one before."""
    cdef Py_ssize_t lo = 0, hi = n, step = 1, mid
    if hint < n and a[hint] < x:
        lo = hint + 1
        while hint + step < n and a[hint + step] < x:
            lo = hint + step + 1
            step *= 2
        hi = min(hint + step, n)
    elif hint < n:
        hi = hint
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def check_entries(cnp.ndarray entries not None, int64_t end, int32_t topic, int32_t queue_id, int64_t first,
                  const int64_t[:] phy not None, const int32_t[:] size not None, const int32_t[:] topics not None,
                  const int32_t[:] queue_ids not None, const int64_t[:] queue_offsets not None,
                  const int64_t[:] tags not None, const uint8_t[:] gets_entry not None, uint8_t[:] covered not None):
    """verify's check of one queue's ``entries`` (ENTRY_DTYPE, queue offsets from ``first``)
    against the commitlog's messages (columns ordered by ``phy``), GIL released: an entry
    that names a record below ``end`` must point at the start of a message of its size,
    topic, queue, queue offset and tags code that gets an entry; such messages are marked
    in ``covered``. Returns (indexes of the entries that fail, the index of the message at
    their offset or -1) as int64 arrays."""
    cdef Py_ssize_t n, k, nrec = phy.shape[0], nbad = 0, lo = 0
    cdef const CqEntry *e
    if entries.dtype != ENTRY_DTYPE or entries.ndim != 1 or not entries.flags.c_contiguous:
        raise InvalidArgumentError("entries must be a contiguous 1-d array of ENTRY_DTYPE")
    if not (size.shape[0] == topics.shape[0] == queue_ids.shape[0] == queue_offsets.shape[0] == tags.shape[0]
            == gets_entry.shape[0] == covered.shape[0] == nrec):
        raise InvalidArgumentError("message columns differ in length")
    n = entries.shape[0]
    bad = np.empty(n, np.int64)
    rec = np.empty(n, np.int64)
    cdef int64_t *bo = <int64_t *>cnp.PyArray_DATA(bad)
    cdef int64_t *ro = <int64_t *>cnp.PyArray_DATA(rec)
    e = <const CqEntry *>cnp.PyArray_DATA(entries)
    with nogil:
        for k in range(n):
            if e[k].size == HOLE or e[k].phy_offset >= end:
                continue
            lo = lower_bound(&phy[0], nrec, e[k].phy_offset, lo)    # the first message at or after the entry
            if lo < nrec and phy[lo] == e[k].phy_offset:
                if size[lo] == e[k].size and topics[lo] == topic and queue_ids[lo] == queue_id \
                        and queue_offsets[lo] == first + k and tags[lo] == e[k].tags_code and gets_entry[lo]:
                    covered[lo] = 1
                    continue
                ro[nbad] = lo
            else:
                ro[nbad] = -1
            bo[nbad] = k
            nbad += 1
    return bad[:nbad], rec[:nbad]


cdef int cmp_key(const void *a, const void *b) noexcept nogil:
    cdef int64_t x = (<const int64_t *>a)[0], y = (<const int64_t *>b)[0]
    return (x > y) - (x < y)


def group_entries(cnp.ndarray rows not None, const int32_t[:] topic_ids not None,
                  const uint8_t[:] unsafe_topic not None):
    """The consume-queue entries of dispatch ``rows`` (a contiguous _read.DISPATCH_DTYPE
    array): every row but PREPARED and ROLLBACK messages and those whose topic id (in
    ``topic_ids``) is marked in ``unsafe_topic``, grouped by (topic id, queue id) in
    ascending order, commitlog order kept within a group. Returns ``(row, phy, size, tags,
    queue_offset, starts, bad)``: the entries' columns (int64 but ``size`` int32), group k
    being ``[starts[k], starts[k + 1])`` of them, and ``bad`` the indexes of the rows left
    out for their topic.

    One C stretch with the GIL released. numpy's sort, isin and fancy indexing did this
    before: a dozen calls a batch, each releasing the GIL and taking it back, with Python
    code holding it in between."""
    cdef Py_ssize_t n = rows.shape[0], ntopics = unsafe_topic.shape[0], i, g, ngroups = 0, cap = 1, nk = 0, nbad = 0
    cdef const DispatchRow *rp
    cdef int64_t *so
    cdef int64_t *bo
    cdef int64_t *ro
    cdef int64_t *po
    cdef int32_t *zo
    cdef int64_t *to
    cdef int64_t *qo
    cdef int64_t *slot_key = NULL
    cdef Py_ssize_t *slot_group = NULL
    cdef Py_ssize_t *row_group = NULL
    cdef int64_t *group_key = NULL
    cdef Py_ssize_t *at = NULL
    cdef Py_ssize_t *rank = NULL
    if rows.dtype.itemsize != sizeof(DispatchRow) or rows.ndim != 1 or not rows.flags.c_contiguous:
        raise InvalidArgumentError("rows must be a contiguous 1-d DISPATCH_DTYPE array")
    if topic_ids.shape[0] != n:
        raise InvalidArgumentError(f"{topic_ids.shape[0]} topic ids for {n} rows")
    rp = <const DispatchRow *>cnp.PyArray_DATA(rows)
    for i in range(n):
        if topic_ids[i] < 0 or topic_ids[i] >= ntopics:
            raise OutOfRangeError(f"topic id {topic_ids[i]} of row {i} outside 0..{ntopics}")
    while cap < 2 * n:
        cap *= 2
    bad = np.empty(n, np.int64)
    bo = <int64_t *>cnp.PyArray_DATA(bad)
    try:
        # open addressing: slot_key/slot_group per (topic, queue) key; row_group per row (-1: no entry)
        slot_key = <int64_t *>malloc(cap * sizeof(int64_t))
        slot_group = <Py_ssize_t *>malloc(cap * sizeof(Py_ssize_t))
        row_group = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        group_key = <int64_t *>malloc((2 * n + 2) * sizeof(int64_t))   # (key, group) pairs
        at = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        rank = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
        if not (slot_key and slot_group and row_group and group_key and at and rank):
            raise MemoryError()
        memset(slot_group, 0xFF, cap * sizeof(Py_ssize_t))
        # sized for the most there can be and cut after, so that one GIL-free stretch does it all
        row, phy, size = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int32)
        tags, qoff, starts = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n + 1, np.int64)
        ro, po, zo = <int64_t *>cnp.PyArray_DATA(row), <int64_t *>cnp.PyArray_DATA(phy), <int32_t *>cnp.PyArray_DATA(size)
        to, qo = <int64_t *>cnp.PyArray_DATA(tags), <int64_t *>cnp.PyArray_DATA(qoff)
        so = <int64_t *>cnp.PyArray_DATA(starts)
        with nogil:
            ngroups = find_groups(rp, n, topic_ids, unsafe_topic, cap, slot_key, slot_group, row_group, group_key,
                                  at, bo, &nbad, &nk)
            qsort(group_key, ngroups, 2 * sizeof(int64_t), cmp_key)   # the keys are distinct
            so[0] = 0
            for g in range(ngroups):   # group_key[2g + 1]: the group g-th in key order
                rank[group_key[2 * g + 1]] = g
                so[g + 1] = so[g] + at[group_key[2 * g + 1]]
            for g in range(ngroups):
                at[g] = so[rank[g]]    # where group g's next entry goes
            fill_groups(rp, n, row_group, at, ro, po, zo, to, qo)
        return row[:nk], phy[:nk], size[:nk], tags[:nk], qoff[:nk], starts[:ngroups + 1], bad[:nbad]
    finally:
        free(slot_key)
        free(slot_group)
        free(row_group)
        free(group_key)
        free(at)
        free(rank)


cdef Py_ssize_t find_groups(const DispatchRow *rp, Py_ssize_t n, const int32_t[:] topic_ids,
                            const uint8_t[:] unsafe_topic, Py_ssize_t cap, int64_t *slot_key, Py_ssize_t *slot_group,
                            Py_ssize_t *row_group, int64_t *group_key, Py_ssize_t *count, int64_t *bad,
                            Py_ssize_t *nbad, Py_ssize_t *nk) noexcept nogil:
    """Give each row with an entry its group (``row_group``, -1 for none), the groups
    their (key, group) pairs in ``group_key`` and their sizes in ``count``; rows of unsafe
    topics go to ``bad``. Returns the number of groups."""
    cdef Py_ssize_t i, g, ngroups = 0
    cdef int64_t key
    cdef int32_t tid
    for i in range(n):
        tid = topic_ids[i]
        row_group[i] = -1
        if not gets_cq_entry_c(rp[i].sys_flag):
            continue
        if unsafe_topic[tid]:
            bad[nbad[0]] = i
            nbad[0] += 1
            continue
        key = (<int64_t>tid << 32) | <uint32_t>rp[i].queue_id
        g = ((<uint64_t>key * 0x9E3779B97F4A7C15ULL) >> 32) & (cap - 1)
        while slot_group[g] >= 0 and slot_key[g] != key:
            g = (g + 1) & (cap - 1)
        if slot_group[g] < 0:
            slot_key[g], slot_group[g] = key, ngroups
            group_key[2 * ngroups], group_key[2 * ngroups + 1] = key, ngroups
            count[ngroups] = 0
            ngroups += 1
        row_group[i] = slot_group[g]
        count[slot_group[g]] += 1
        nk[0] += 1
    return ngroups


cdef void fill_groups(const DispatchRow *rp, Py_ssize_t n, const Py_ssize_t *row_group, Py_ssize_t *at,
                      int64_t *row, int64_t *phy, int32_t *size, int64_t *tags, int64_t *qoff) noexcept nogil:
    """Scatter each row with an entry to the next place of its group (``at``)."""
    cdef Py_ssize_t i, k
    for i in range(n):
        if row_group[i] >= 0:
            k = at[row_group[i]]
            at[row_group[i]] = k + 1
            row[k], phy[k], size[k], tags[k], qoff[k] = i, rp[i].phy_offset, rp[i].size, rp[i].tags_code, \
                rp[i].queue_offset
