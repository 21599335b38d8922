# cython: boundscheck=False, wraparound=False, cdivision=True
"""IndexFile writing kernels: the header, key extraction from dispatched records, RocketMQ
putKey into a mapped index file, and the truncation recovery makes.

File layout (big-endian)::

    @0   beginTimestamp i64 · endTimestamp i64 · beginPhyOffset i64 · endPhyOffset i64
    @32  hashSlotCount i32 · indexCount i32 (starts at 1: entry 0 is never used)
    @40  slots × i32 (entry number of the newest entry of the slot, 0 = empty)
    then entries × 20 bytes: keyHash i32 · phyOffset i64 · timeDiff i32 (s) · prevIndex i32

Lookups are in _index, the consistency check in _index_check. Every value read from a file
is untrusted: slot values and prevIndex are checked against indexCount and the capacity."""
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32, rmq_ld64, rmq_release, rmq_st32, rmq_st64
from rmqstore._segment cimport MappedSegment, ensure, unpin
from rmqstore._layout cimport DispatchRow, IndexEntry, TRANSACTION_MASK, TRAN_ROLLBACK
from rmqstore._record cimport IndexProps, index_props
from rmqstore.errors import CorruptStoreError, InvalidArgumentError, StoreReadOnlyError

cnp.import_array()

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

HEADER_SIZE = HDR
ENTRY_SIZE = sizeof(IndexEntry)
cdef int32_t INT_MAX = 0x7FFFFFFF


def file_size(int64_t slots, int64_t entries):
    """Bytes of an index file with this geometry."""
    return HDR + slots * 4 + entries * <int64_t>sizeof(IndexEntry)


def read_header(MappedSegment seg not None):
    """(beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount)."""
    seg.check_range(0, HDR)
    cdef const char *b = seg.m.base
    return rmq_ld64(b), rmq_ld64(b + 8), rmq_ld64(b + 16), rmq_ld64(b + 24), rmq_ld32(b + 32), rmq_ld32(b + 36)


def write_header(MappedSegment seg not None, int64_t begin_ts, int64_t end_ts, int64_t begin_phy, int64_t end_phy,
                 int32_t slot_count, int32_t index_count):
    """Write the 40-byte header, with the GIL released: its first write faults the page
    in: about 12 ms with the GIL held, in profiles of a loaded machine (see _cq.append_entry)."""
    seg.check_range(0, HDR)
    ensure(seg, HDR)
    cdef char *b = seg.m.base
    with nogil:
        rmq_st64(b, begin_ts)
        rmq_st64(b + 8, end_ts)
        rmq_st64(b + 16, begin_phy)
        rmq_st64(b + 24, end_phy)
        rmq_st32(b + 32, slot_count)
        rmq_st32(b + 36, index_count)


def key_hash(str key not None):
    """The index hash of an already built ``topic#key`` string."""
    cdef Py_ssize_t n
    cdef const char *p = PyUnicode_AsUTF8AndSize(key, &n)
    return index_hash(p, n)


cdef int32_t build_hash(const char *topic, Py_ssize_t tlen, const char *key, Py_ssize_t klen,
                        char *buf) noexcept nogil:
    """Hash of ``topic#key`` assembled in ``buf`` (tlen + klen + 1 bytes)."""
    memcpy(buf, topic, tlen)
    buf[tlen] = b'#'
    memcpy(buf + tlen + 1, key, klen)
    return index_hash(buf, tlen + 1 + klen)


# ---------------------------------------------------------------------------- key extraction

cdef int64_t keys_of(const char *raw, int64_t nraw, const DispatchRow *d,
                     int32_t *hashes, int64_t *phys, int64_t *tss) noexcept nogil:
    """Index keys of one DISPATCH_DTYPE row: UNIQ_KEY, then every non-empty space-separated
    KEYS token, written to the outputs (``tss`` may be NULL: no timestamps). Returns how many."""
    cdef int32_t toff = d.topic_off, tlen = d.topic_len
    cdef int32_t poff = d.props_off, plen = d.props_len
    cdef IndexProps ip
    if (d.sys_flag & TRANSACTION_MASK) == TRAN_ROLLBACK:
        return 0
    if toff < 0 or tlen < 0 or poff < 0 or plen < 0 or toff + tlen > nraw or poff + plen > nraw:
        return 0
    index_props(raw + poff, plen, &ip)
    return keys_at(topic_prefix(raw + toff, tlen), raw + poff, &ip, d.phy_offset, d.store_timestamp, hashes, phys, tss)


cdef int64_t keys_at(uint32_t prefix, const char *props, const IndexProps *ip, int64_t phy,
                     int64_t ts, int32_t *hashes, int64_t *phys, int64_t *tss) noexcept nogil:
    """keys_of for a record of the topic whose topic_prefix is ``prefix`` and whose properties
    ``index_props`` found (``ip``)."""
    cdef int32_t i, j, end
    cdef int64_t n = 0
    if ip.uniq_len:
        hashes[n] = topic_key_hash(prefix, props + ip.uniq_off, ip.uniq_len)
        phys[n] = phy
        if tss != NULL:
            tss[n] = ts
        n += 1
    if ip.keys_len:
        i, end = ip.keys_off, ip.keys_off + ip.keys_len
        while i < end:
            j = token_end(props, i, end)
            if j > i:
                hashes[n] = topic_key_hash(prefix, props + i, j - i)
                phys[n] = phy
                if tss != NULL:
                    tss[n] = ts
                n += 1
            i = j + 1
    return n


def extract_keys(const uint8_t[:] raw not None, cnp.ndarray rows not None):
    """(hashes i32, phy_offsets i64, store_timestamps i64, newest) of every index key of
    ``rows`` (a contiguous _read.DISPATCH_DTYPE array over ``raw``), in dispatch order, and
    the largest store timestamp of the rows (0 for none); ROLLBACK messages have no keys.
    One pass over the properties: the outputs are sized for the most keys each row's
    properties can hold (a UNIQ_KEY, and a KEYS token per 2 bytes) and cut to fit (views:
    a copy, like numpy's max, releases the GIL and takes it back, a wait for the thread
    that puts)."""
    cdef int64_t nrows = rows.shape[0], i, k = 0, most, newest = 0
    cdef int64_t nraw = raw.shape[0]
    if rows.dtype.itemsize != sizeof(DispatchRow) or not rows.flags.c_contiguous:
        raise InvalidArgumentError("rows must be a contiguous DISPATCH_DTYPE array")
    cdef const char *base = NULL
    cdef const DispatchRow *rp = <const DispatchRow *>cnp.PyArray_DATA(rows)
    if nraw:
        base = <const char *>&raw[0]
    elif nrows:
        raise InvalidArgumentError("rows without raw record bytes")
    most = 1
    for i in range(nrows):
        if rp[i].props_len > 0:
            most += rp[i].props_len // 2 + 2
        if i == 0 or rp[i].store_timestamp > newest:
            newest = rp[i].store_timestamp
    hashes = np.empty(most, np.int32)
    phys = np.empty(most, np.int64)
    tss = np.empty(most, np.int64)
    cdef int32_t *ho = <int32_t *>cnp.PyArray_DATA(hashes)
    cdef int64_t *po = <int64_t *>cnp.PyArray_DATA(phys)
    cdef int64_t *to = <int64_t *>cnp.PyArray_DATA(tss)
    with nogil:
        for i in range(nrows):
            k += keys_of(base, nraw, rp + i, ho + k, po + k, to + k)
    return hashes[:k], phys[:k], tss[:k], newest


# ---------------------------------------------------------------------------- writing

cdef int check_geometry(MappedSegment seg, int64_t slots, int64_t entries) except -1:
    if slots <= 0 or entries < 2:
        raise InvalidArgumentError(f"index geometry {slots} slots / {entries} entries")
    seg.check_range(0, 0)
    if seg.m.size < HDR + slots * 4 + entries * <int64_t>sizeof(IndexEntry):
        raise CorruptStoreError(f"{seg.path}: {seg.m.size} bytes, too small for {slots} slots / {entries} entries")
    return 0


def put_entries(MappedSegment seg not None, int32_t slots, int32_t entries, const int32_t[::1] hashes not None,
                const int64_t[::1] phys not None, const int64_t[::1] tss not None, Py_ssize_t start):
    """RocketMQ IndexFile.putKey for keys ``start..`` until the file is full or a key was
    stored before the file began (put_keys); returns the index of the first key not
    written. Entry first, then slot, then header, in that
    order (rmq_order.h), so a concurrent reader sees either the old chain or the new one."""
    cdef Py_ssize_t i = start, n = hashes.shape[0]
    cdef char *b
    cdef int32_t count
    check_geometry(seg, slots, entries)
    if seg.m.readonly:
        raise StoreReadOnlyError(f"{seg.path}: opened read-only")
    if phys.shape[0] < n or tss.shape[0] < n or start < 0:
        raise InvalidArgumentError("hashes, phys and tss differ in length")
    b = seg.m.base
    count = max(1, rmq_ld32(b + 36))
    if count < entries:   # the header, the slots and every entry written here
        ensure(seg, HDR + slots * 4 + min(<int64_t>entries, count + max(0, n - start)) * sizeof(IndexEntry))
    with nogil:
        i = put_keys(b, slots, entries, &hashes[0] if n else NULL, &phys[0] if n else NULL,
                     &tss[0] if n else NULL, i, n)
    return i


cdef Py_ssize_t put_keys(char *b, int32_t slots, int32_t entries, const int32_t *hashes, const int64_t *phys,
                         const int64_t *tss, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """put_entries' loop over the file at ``b`` (geometry checked, blocks reserved by the
    caller): keys ``i..n`` until the file is full, or up to a key stored before the file's
    beginTimestamp (RocketMQ writes it with timeDiff 0, a time it was not stored at; the
    caller starts a new file, whose times begin there); returns the first key not written."""
    cdef char *sp
    cdef IndexEntry *e
    cdef int32_t count = max(1, rmq_ld32(b + 36)), h, sv
    cdef int64_t diff, bts
    while i < n and count < entries:
        bts = rmq_ld64(b)
        if count > 1 and bts > 0 and tss[i] < bts:
            break   # stored before the file began (a clock stepped back): the caller starts a new file
        h = hashes[i]
        if h < 0:
            h = 0
        sp = b + HDR + (h % slots) * 4
        sv = rmq_ld32(sp)
        if sv <= 0 or sv >= count:
            sv = 0
        diff = (tss[i] - bts) // 1000
        if bts <= 0 or diff < 0:
            diff = 0
        elif diff > INT_MAX:
            diff = INT_MAX
        e = <IndexEntry *>(b + HDR + <int64_t>slots * 4) + count
        rmq_st32(<char *>&e.key_hash, h)
        rmq_st64(<char *>&e.phy_offset, phys[i])
        rmq_st32(<char *>&e.time_diff, <int32_t>diff)
        rmq_st32(<char *>&e.prev_index, sv)
        rmq_release()
        rmq_st32(sp, count)
        rmq_release()
        if count <= 1:
            rmq_st64(b + 16, phys[i])
            rmq_st64(b, tss[i])
        if sv == 0:
            rmq_st32(b + 32, rmq_ld32(b + 32) + 1)
        count += 1
        rmq_st32(b + 36, count)
        rmq_st64(b + 24, phys[i])
        rmq_st64(b + 8, tss[i])
        i += 1
    return i


cdef int32_t sane_prefix(const IndexEntry *ents, int32_t count, int64_t bts, int64_t phy_end,
                         int64_t ts_limit) noexcept nogil:
    """The end of the longest sane prefix of entries ``[1, count)`` (truncate_entries)."""
    cdef const IndexEntry *e
    cdef int64_t phy, prev_phy = -1
    cdef int32_t td, prev, keep = 1
    while keep < count:
        e = ents + keep
        phy = rmq_ld64(<const char *>&e.phy_offset)
        td = rmq_ld32(<const char *>&e.time_diff)
        prev = rmq_ld32(<const char *>&e.prev_index)
        if rmq_ld32(<const char *>&e.key_hash) < 0 or phy < prev_phy or phy >= phy_end or td < 0 or prev < 0 \
                or prev >= keep or bts + <int64_t>td * 1000 > ts_limit:
            break
        prev_phy = phy
        keep += 1
    return keep


def truncate_entries(MappedSegment seg not None, int32_t slots, int32_t entries, int64_t phy_end, int64_t ts_limit,
                     bint dry_run=False):
    """Keep the longest prefix of entries that is sane (key hash >= 0, phy offsets
    non-decreasing and below ``phy_end``, prevIndex pointing strictly back, time <=
    ``ts_limit``), zero the rest, point each slot at its last kept entry and rewrite the
    header. Returns (kept, dropped). The slots are rebuilt from the kept entries, not
    followed back through the cut ones: a crash may have left a slot pointing at an entry
    whose page never reached the disk, and its zero link would cut the chain short. Each
    slot is stored once, and only if it changes, for queries running meanwhile. With
    ``dry_run`` nothing is written (read-only segments too): what it would keep and drop."""
    cdef int64_t bts, i, s
    cdef int32_t count, keep = 1, used = 0
    cdef char *b
    cdef IndexEntry *e
    cdef IndexEntry *ents
    cdef int32_t *heads
    check_geometry(seg, slots, entries)
    if seg.m.readonly and not dry_run:
        raise StoreReadOnlyError(f"{seg.path}: opened read-only")
    b = seg.m.base
    count = rmq_ld32(b + 36)
    if count < 1 or count > entries:
        count = entries if count > entries else 1
    bts = rmq_ld64(b)
    ents = <IndexEntry *>(b + HDR + <int64_t>slots * 4)
    if dry_run:
        seg.pin_range(0, HDR + slots * 4 + <int64_t>count * sizeof(IndexEntry))
        try:
            with nogil:
                keep = sane_prefix(ents, count, bts, phy_end, ts_limit)
        finally:
            unpin(seg)
        return keep, count - keep
    ensure(seg, HDR + slots * 4 + <int64_t>count * sizeof(IndexEntry))
    heads = <int32_t *>calloc(slots, sizeof(int32_t))
    if heads == NULL:
        raise MemoryError()
    try:
        with nogil:
            keep = sane_prefix(ents, count, bts, phy_end, ts_limit)
            for i in range(1, keep):
                heads[rmq_ld32(<char *>&ents[i].key_hash) % slots] = <int32_t>i
            for s in range(slots):
                used += heads[s] != 0
                if rmq_ld32(b + HDR + s * 4) != heads[s]:
                    rmq_st32(b + HDR + s * 4, heads[s])
            rmq_release()
            memset(&ents[keep], 0, <size_t>(count - keep) * sizeof(IndexEntry))
    finally:
        free(heads)
    if keep > 1:
        e = ents + keep - 1
        rmq_st64(b + 24, rmq_ld64(<char *>&e.phy_offset))
        rmq_st64(b + 8, bts + <int64_t>rmq_ld32(<char *>&e.time_diff) * 1000)
    rmq_st32(b + 32, used)
    rmq_st32(b + 36, keep)
    return keep, count - keep
