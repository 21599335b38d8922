# cython: boundscheck=False, wraparound=False, cdivision=True
"""IndexFile consistency check (verify): every entry's slot, chain and order looked at in
one pass with the GIL released; what is wrong is counted by kind, the first few shown.
The file layout is in _index_file."""
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport rmq_ld32, rmq_ld64
from rmqstore._index_file cimport HDR, check_geometry
from rmqstore._layout cimport IndexEntry
from rmqstore._segment cimport MappedSegment, pin, unpin
from rmqstore.errors import InvalidArgumentError

cnp.import_array()


cdef enum:
    SHOWN = 3               # findings of each kind check_file lists (the rest are counted)


cdef struct Findings:       # what check_file finds, by kind: how many, and the first SHOWN
    int64_t n
    int64_t at[SHOWN]


cdef inline void note(Findings *f, int64_t i) noexcept nogil:
    if f.n < SHOWN:
        f.at[f.n] = i
    f.n += 1


cdef inline int64_t slot_of(int64_t h, int64_t slots) noexcept nogil:
    """``h`` modulo ``slots``, never negative (Python's %)."""
    h %= slots
    return h + slots if h < 0 else h


def check_file(MappedSegment seg not None, int32_t slots, int32_t entries, int32_t count):
    """The structure checks verify makes on one index file of ``count`` entries (1 <=
    count <= entries, the caller checks), GIL released, the file pinned:

    - ``bad_slots``: slots holding a value outside 0..count-1; ``used``: slots not 0;
    - ``broken``: entries (from 1) whose prevIndex is not in 0..i-1, or whose hash or timeDiff is negative;
    - only when neither: ``wrong_heads`` (slots naming an entry of another slot),
      ``astray`` (entries linking to an entry of another slot) and ``odd`` (entries reached
      other than exactly once from slots and links; ``odd_refs`` how often);
    - ``back``: the first entry whose commitlog offset is below the one before it (0: none).

    Each finding kind is the first three positions (a list) and ``<kind>_count``. Returns
    (findings dict, hashes i32, phy offsets i64) of entries 1..count-1."""
    cdef int64_t i, h, s, p, phy, prev_phy = 0, back = 0, used = 0
    cdef int32_t *refs = NULL
    cdef Findings bad, broken, heads, astray, odd
    cdef const char *b
    cdef const char *sl
    cdef const IndexEntry *ents
    check_geometry(seg, slots, entries)
    if not 1 <= count <= entries:
        raise InvalidArgumentError(f"{seg.path}: count {count} outside 1..{entries}")
    hashes = np.empty(count - 1, np.int32)
    phys = np.empty(count - 1, np.int64)
    cdef int32_t *ho = <int32_t *>cnp.PyArray_DATA(hashes)
    cdef int64_t *po = <int64_t *>cnp.PyArray_DATA(phys)
    bad.n = broken.n = heads.n = astray.n = odd.n = 0
    refs = <int32_t *>PyMem_Malloc(count * sizeof(int32_t))
    if refs == NULL:
        raise MemoryError()
    try:
        pin(seg)
        try:
            b = seg.m.base
            sl = b + HDR
            ents = <const IndexEntry *>(b + HDR + <int64_t>slots * 4)
            with nogil:
                for s in range(slots):
                    p = rmq_ld32(sl + s * 4)
                    if p < 0 or p >= count:
                        note(&bad, s)
                    elif p:
                        used += 1
                for i in range(1, count):
                    p = rmq_ld32(<const char *>&ents[i].prev_index)
                    h = rmq_ld32(<const char *>&ents[i].key_hash)
                    phy = rmq_ld64(<const char *>&ents[i].phy_offset)
                    if p < 0 or p >= i or h < 0 or rmq_ld32(<const char *>&ents[i].time_diff) < 0:
                        note(&broken, i)
                    if i > 1 and phy < prev_phy and back == 0:
                        back = i
                    prev_phy = phy
                    ho[i - 1] = <int32_t>h
                    po[i - 1] = phy
                if bad.n == 0 and broken.n == 0:
                    check_chains(sl, ents, slots, count, refs, &heads, &astray, &odd)
        finally:
            unpin(seg)
        found = {"used": used, "back": back}
        listed(found, "bad_slots", &bad)
        listed(found, "broken", &broken)
        listed(found, "wrong_heads", &heads)
        listed(found, "astray", &astray)
        listed(found, "odd", &odd)
        found["odd_refs"] = [refs[i] for i in found["odd"]]
    finally:
        PyMem_Free(refs)
    return found, hashes, phys


cdef int listed(dict found, str name, Findings *f) except -1:
    found[name] = [f.at[i] for i in range(min(f.n, SHOWN))]
    found[name + "_count"] = f.n
    return 0


cdef void check_chains(const char *sl, const IndexEntry *ents, int64_t slots, int64_t count, int32_t *refs,
                       Findings *heads, Findings *astray, Findings *odd) noexcept nogil:
    """check_file's chain checks, on slots and links already known to be in range: every
    entry is the head of its hash's slot or the prevIndex of exactly one entry of that
    slot (``refs`` gets how often each is reached). Entry 0 takes part like the others."""
    cdef int64_t i, s, p
    memset(refs, 0, count * sizeof(int32_t))
    for s in range(slots):
        p = rmq_ld32(sl + s * 4)
        if p:
            refs[p] += 1
            if slot_of(rmq_ld32(<const char *>&ents[p].key_hash), slots) != s:
                note(heads, s)
    for i in range(count):
        p = rmq_ld32(<const char *>&ents[i].prev_index)
        if p <= 0 or p >= count:
            continue
        refs[p] += 1
        if slot_of(rmq_ld32(<const char *>&ents[p].key_hash), slots) != \
                slot_of(rmq_ld32(<const char *>&ents[i].key_hash), slots):
            note(astray, i)
    for i in range(1, count):
        if refs[i] != 1:
            note(odd, i)
