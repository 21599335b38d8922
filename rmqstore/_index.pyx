# cython: boundscheck=False, wraparound=False, cdivision=True
"""IndexFile lookups: the slot probe + chain walk of selectPhyOffset with the GIL released,
and the read-back of the candidates (topic and real keys checked on the record before a
message is built), into message lists or columns (the hit sinks).

The file layout is in _index_file, which writes the files. Every value read from a file is
untrusted: slot values and prevIndex are checked against indexCount and the file's
capacity, and a chain walk only moves to strictly older entries, so it terminates on any
input."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.ref cimport Py_INCREF
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_FromObject
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy
import numpy as np
cimport numpy as cnp
from rmqstore._gate cimport ArgChecks, Gate
from rmqstore._gate import MISSING, misfit
from rmqstore._cext cimport rmq_ld32, rmq_ld64, rmq_prefetch
from rmqstore._segment cimport MappedSegment, SegmentList, pin, unpin
from rmqstore._index_file cimport HDR, build_hash, check_geometry, token_end
from rmqstore._layout cimport IndexEntry
from rmqstore._record cimport RecView, find_property
from rmqstore._message cimport MessageExt, build_ext, ext_in
from rmqstore._columns cimport Cols, cols_of, fill_at, new_columns, reserve_data, trim
from rmqstore._read cimport Span, pin_span, prefetch_at, record_at, span_prefetch, span_record, unpin_span
from rmqstore.errors import InvalidArgumentError

cnp.import_array()

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    ctypedef struct PyObject
    Py_ssize_t PyList_GET_SIZE(object o)
    PyObject *PyList_GET_ITEM(object o, Py_ssize_t i)
    void PyObject_GC_UnTrack(void *op)
    void PyObject_GC_Track(void *op)

DEFAULT_MAX_NUM = 64
cdef extern from *:
    """
    /* A spare chunk is reused once only its pool holds it; its bytes change, so does its hash. */
    static inline int rmq_sole(PyObject *o) { return Py_REFCNT(o) == 1; }
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    static inline void rmq_forget_hash(PyObject *o) { ((PyBytesObject *)o)->ob_shash = -1; }
    #pragma GCC diagnostic pop
    """
    bint rmq_sole(PyObject *o) noexcept
    void rmq_forget_hash(PyObject *o) noexcept
cdef enum:
    AHEAD = 8               # keys ahead whose slots/entries/records a batch query prefetches


# ---------------------------------------------------------------------------- reading

cdef struct FileView:
    const char *base
    int32_t slots
    int32_t entries


cdef inline bint time_matched(int64_t begin, int64_t end, int64_t bts, int64_t ets) noexcept nogil:
    """IndexFile.isTimeMatched."""
    return (begin < bts and end > ets) or (bts <= begin <= ets) or (bts <= end <= ets)


cdef inline int32_t chain_head(const FileView *f, int32_t h) noexcept nogil:
    """The newest entry of the chain of the slot of hash ``h`` (0: none)."""
    return rmq_ld32(f.base + HDR + <int64_t>(h % f.slots) * 4)


cdef inline int32_t chain_top(const FileView *f) noexcept nogil:
    """The highest entry a chain may name: the file's count (== count: being counted, and
    RocketMQ's reads it too) within the file; 0 when the file holds none (count 1)."""
    cdef int32_t count = rmq_ld32(f.base + 36)
    return 0 if count <= 1 else min(count, f.entries - 1)


cdef inline int32_t walk_chain(const FileView *f, int32_t idx, int32_t h, int64_t begin, int64_t end, bint exact,
                               int64_t *out, Py_ssize_t *n, Py_ssize_t max_num, Py_ssize_t *steps) noexcept nogil:
    """IndexFile.selectPhyOffset from entry ``idx`` on: walk the chain, newest first,
    appending to ``out[n:]`` (``n`` counted up) the offsets whose hash matches and whose
    time is in [begin, end], looking at ``steps`` entries at most (counted down). With
    ``exact`` (the caller then checks each record's own store time), every entry whose
    time could be in range (timeDiff is whole seconds, floored), and the chain is walked
    to its end: after a clock step back its times are not in order. Returns the entry to
    go on from when ``max_num`` offsets or the steps ran out before the chain, else 0."""
    cdef const char *b = f.base
    cdef int32_t top = chain_top(f), kh, td, prev
    cdef int64_t bts = rmq_ld64(b), t
    cdef const IndexEntry *ents = <const IndexEntry *>(b + HDR + <int64_t>f.slots * 4)
    cdef const IndexEntry *e
    while 0 < idx <= top:
        if n[0] >= max_num or steps[0] == 0:
            return idx
        steps[0] -= 1
        e = ents + idx
        kh = rmq_ld32(<const char *>&e.key_hash)
        td = rmq_ld32(<const char *>&e.time_diff)
        prev = rmq_ld32(<const char *>&e.prev_index)
        if td < 0:
            break
        t = bts + <int64_t>td * 1000
        if kh == h and ((t + 999 >= begin and t <= end) if exact else begin <= t <= end):
            out[n[0]] = rmq_ld64(<const char *>&e.phy_offset)
            n[0] += 1
        if prev <= 0 or prev >= idx or (t < begin and not exact):   # chains only point back: always terminates
            break
        idx = prev
    return 0


cdef Py_ssize_t select_file(FileView *f, int32_t h, int64_t begin, int64_t end, Py_ssize_t max_num,
                            int64_t *out, Py_ssize_t n, bint exact) noexcept nogil:
    """IndexFile.selectPhyOffset: walk_chain of ``h``'s slot; returns ``n`` and the offsets
    it appended."""
    cdef Py_ssize_t steps = PY_SSIZE_T_MAX
    walk_chain(f, chain_head(f, h), h, begin, end, exact, out, &n, max_num, &steps)
    return n


cdef class IndexFiles:
    """An immutable snapshot of the index files, newest first, for lock-free queries.

    Each query pins every mapped file it reads (a closed file is skipped), walks them (a
    batch of keys with the GIL released) and returns RocketMQ's IndexService.queryOffset
    answer. It keeps up to SPARES record copies (32 MiB) for query_many to reuse."""
    cdef list segs
    cdef FileView *views
    cdef Py_ssize_t n
    cdef list spares        # CHUNK-byte copies query_many reuses once their messages are gone

    def __cinit__(self, list files not None):
        """``files``: (MappedSegment, slots, entries) tuples, newest first."""
        cdef Py_ssize_t i
        cdef MappedSegment seg
        self.views = <FileView *>malloc(max(1, len(files)) * sizeof(FileView))
        if self.views == NULL:
            raise MemoryError()
        self.segs = []
        self.spares = []
        for i, (seg, slots, entries) in enumerate(files):
            check_geometry(seg, slots, entries)
            self.views[i].base = seg.m.base
            self.views[i].slots = slots
            self.views[i].entries = entries
            self.segs.append(seg)
        self.n = len(files)

    def __dealloc__(self):
        free(self.views)

    def __len__(self):
        return self.n

    cdef int pin_all(self, bint *pinned) except -1:
        cdef Py_ssize_t i
        cdef MappedSegment seg
        for i in range(self.n):
            seg = self.segs[i]
            pinned[i] = not (seg.closing or seg.unmapped)
            if pinned[i]:
                pin(seg)
        return 0

    cdef int unpin_all(self, bint *pinned) except -1:
        cdef Py_ssize_t i
        cdef MappedSegment seg
        for i in range(self.n):
            if pinned[i]:
                seg = self.segs[i]
                unpin(seg)
        return 0

    cdef void prefetch_chain(self, bint *pinned, int32_t h, bint entry) noexcept nogil:
        """Start loading the slot of hash ``h`` in every file, or with ``entry`` the newest
        entry its (by now cached) slot names: a batch of keys is walked AHEAD keys behind."""
        cdef Py_ssize_t i
        cdef const char *slot
        cdef int32_t idx, count
        for i in range(self.n):
            if not pinned[i]:
                continue
            slot = self.views[i].base + HDR + <int64_t>(h % self.views[i].slots) * 4
            if not entry:
                rmq_prefetch(slot)
                continue
            idx = rmq_ld32(slot)
            count = min(rmq_ld32(self.views[i].base + 36), self.views[i].entries - 1)
            if 0 < idx <= count:
                rmq_prefetch(<const IndexEntry *>(self.views[i].base + HDR + <int64_t>self.views[i].slots * 4)
                                   + idx)

    cdef Py_ssize_t walk(self, bint *pinned, int32_t h, int64_t begin, int64_t end, Py_ssize_t max_num,
                         int64_t *out, bint exact) noexcept nogil:
        """IndexService.queryOffset over all files, newest first; ``exact``: see
        select_file (no file is passed over by its header's times either)."""
        cdef Py_ssize_t i, n = 0
        cdef int64_t bts
        for i in range(self.n):
            if not pinned[i]:
                continue
            bts = rmq_ld64(self.views[i].base)
            if exact or time_matched(begin, end, bts, rmq_ld64(self.views[i].base + 8)):
                n = select_file(&self.views[i], h, begin, end, max_num, out, n, exact)
            if (bts < begin and not exact) or n >= max_num:
                break
        return n

    cdef object _query(self, object topic, object key, object max_num, object begin, object end,
                       Py_ssize_t cap, list log):
        """query's work: the offsets list, or with ``log`` (commitlog segments) the messages."""
        cdef Py_ssize_t tlen, klen, n, mn
        cdef int64_t b, e
        cdef const char *t
        cdef const char *k
        cdef char small[512]
        cdef char *buf = small
        cdef int64_t stack_out[64]
        cdef int64_t *out = stack_out
        cdef bint stack_pins[16]
        cdef bint *pinned = stack_pins
        cdef int32_t h
        topic = limits(topic, max_num, begin, end, cap, &mn, &b, &e)
        check_key(key)
        if mn == 0:
            return []
        t = PyUnicode_AsUTF8AndSize(topic, &tlen)
        k = PyUnicode_AsUTF8AndSize(key, &klen)
        if tlen + klen + 1 > 512:
            buf = <char *>malloc(tlen + klen + 1)
        if mn > 64:
            out = <int64_t *>malloc(mn * sizeof(int64_t))
        if self.n > 16:
            pinned = <bint *>malloc(self.n * sizeof(bint))
        try:
            if buf == NULL or out == NULL or pinned == NULL:
                raise MemoryError()
            h = build_hash(t, tlen, k, klen, buf)
            self.pin_all(pinned)
            try:       # with the GIL: a few cache misses, less than dropping and taking it back
                n = self.walk(pinned, h, b, e, mn, out, log is not None)
                sort_i64(out, n)
            finally:
                self.unpin_all(pinned)
            if log is not None:
                return keyed_messages(log, topic, k, klen, out, n, b, e)
            return [out[i] for i in range(n)]
        finally:
            if buf != small:
                free(buf)
            if out != stack_out:
                free(out)
            if pinned != stack_pins:
                free(pinned)

    def paths(self):
        """The files' paths, newest first: ``walk_page``'s file numbers index this list."""
        return [seg.path for seg in self.segs]

    def walk_page(self, topic, key, Py_ssize_t file_no, int32_t entry, max_num=64, begin=0, end=None,
                  Py_ssize_t steps=1 << 16, Py_ssize_t cap=64):
        """One page of a resumable walk over ``topic#key``'s chains: the commitlog offsets
        of the entries whose hash matches and whose time could be in [begin, end] (index
        times are whole seconds), newest first, at most ``max_num`` (at most ``cap``) and
        looking at no more than ``steps`` entries, from entry ``entry`` of file ``file_no``
        (files newest first; entry 0: the chain's head). Returns (offsets, file number,
        entry) to go on from, or (offsets, -1, 0) when the chains end: a page costs what it
        returns (plus the colliding entries between), never the hits before it. An entry
        outside its file's counted entries is an InvalidArgumentError."""
        cdef Py_ssize_t mn, n = 0, left = steps, i, k, tlen, klen
        cdef int64_t b, e
        cdef int32_t h, idx = entry
        cdef const char *tp
        cdef const char *kp
        cdef int64_t stack_out[64]
        cdef int64_t *out = stack_out
        cdef FileView *f
        cdef MappedSegment seg
        topic = limits(topic, max_num, begin, end, cap, &mn, &b, &e)
        check_key(key)
        if file_no < 0 or file_no > self.n or entry < 0:
            raise InvalidArgumentError(f"no index position {file_no}.{entry} in {self.n} files")
        tp = PyUnicode_AsUTF8AndSize(topic, &tlen)
        kp = PyUnicode_AsUTF8AndSize(key, &klen)
        buf = PyBytes_FromStringAndSize(NULL, tlen + klen + 1)
        h = build_hash(tp, tlen, kp, klen, PyBytes_AS_STRING(buf))
        if mn > 64:
            out = <int64_t *>malloc(mn * sizeof(int64_t))
            if out == NULL:
                raise MemoryError()
        try:
            i = file_no
            while i < self.n:
                seg = self.segs[i]
                if seg.closing or seg.unmapped:
                    i, idx = i + 1, 0
                    continue
                pin(seg)
                try:
                    f = &self.views[i]
                    if idx == 0:
                        idx = chain_head(f, h)
                    elif idx > chain_top(f):
                        raise InvalidArgumentError(
                            f"no index position {file_no}.{entry}: the file counts {chain_top(f)}")
                    idx = walk_chain(f, idx, h, b, e, True, out, &n, mn, &left)
                finally:
                    unpin(seg)
                if idx:
                    return [out[k] for k in range(n)], i, idx
                i += 1
            return [out[k] for k in range(n)], -1, 0
        finally:
            if out != stack_out:
                free(out)

    def query(self, topic, key, max_num=64, begin=0, end=None, Py_ssize_t cap=64):
        """Commitlog offsets of the entries whose hash equals ``topic#key``'s, newest
        ``max_num`` (at most ``cap``; files newest first), sorted ascending like
        queryMessage. ``end`` None is no limit; bad arguments raise InvalidArgumentError."""
        return self._query(topic, key, max_num, begin, end, cap, None)

    def query_messages(self, list log not None, topic, key, max_num=64, begin=0, end=None, Py_ssize_t cap=64):
        """``query`` read back from ``log`` (the commitlog's segment list): the messages of
        ``topic`` whose UNIQ_KEY or a KEYS token really is ``key``, newest first."""
        return self._query(topic, key, max_num, begin, end, cap, log)

    def query_many(self, topic, keys, max_num=64, begin=0, end=None, Py_ssize_t cap=64, list log=None,
                   bint columns=False):
        """``query`` for every key of the list ``keys`` in one call, hashing and chain walks
        with the GIL released: (offsets i64, bounds i64 of len(keys)+1), the offsets of key
        i being ``offsets[bounds[i]:bounds[i+1]]`` sorted ascending; with ``log``, a list per
        key of its messages as ``query_messages`` finds them (read back by keyed_batch), or
        with ``columns`` too, those messages as columns (keyed_columns)."""
        cdef Py_ssize_t nk, i, n = 0, tlen, klen = 0, cap_k = 0, mn
        cdef int64_t b, e
        cdef const char *t
        cdef bint *pinned
        cdef char *buf
        cdef int32_t *hs
        topic = limits(topic, max_num, begin, end, cap, &mn, &b, &e)
        keys = list(keys)
        PyObject_GC_UnTrack(<void *>keys)   # a temporary: collections need not walk it
        nk = len(keys)
        cdef Keys ks
        ks.p = <const char **>PyMem_Malloc(max(1, nk) * sizeof(const char *))
        ks.n = <Py_ssize_t *>PyMem_Malloc(max(1, nk) * sizeof(Py_ssize_t))
        ks.arena = NULL
        pinned = <bint *>PyMem_Malloc(max(1, self.n) * sizeof(bint))
        hs = <int32_t *>PyMem_Malloc(max(1, nk) * sizeof(int32_t))
        buf = NULL
        offsets = np.empty(nk * mn, np.int64)
        bounds = np.empty(nk + 1, np.int64)
        cdef int64_t *out = <int64_t *>cnp.PyArray_DATA(offsets)
        cdef int64_t *bd = <int64_t *>cnp.PyArray_DATA(bounds)
        try:
            if ks.p == NULL or ks.n == NULL or pinned == NULL or hs == NULL:
                raise MemoryError()
            cap_k = gather_keys(keys, nk, &ks)
            t = PyUnicode_AsUTF8AndSize(topic, &tlen)
            buf = <char *>PyMem_Malloc(tlen + cap_k + 1)
            if buf == NULL:
                raise MemoryError()
            self.pin_all(pinned)
            try:
                with nogil:
                    for i in range(nk):
                        hs[i] = build_hash(t, tlen, ks.p[i], ks.n[i], buf)
                    walk_keys(self, pinned, hs, nk, b, e, mn, out, bd, log is not None)
            finally:
                self.unpin_all(pinned)
            if log is None:
                return offsets[:bd[nk]], bounds
            if columns:
                return keyed_columns(log, topic, &ks, nk, out, bd, b, e)
            return keyed_batch(log, topic, &ks, nk, out, bd, self.spares, b, e)
        finally:
            PyMem_Free(buf)
            PyMem_Free(pinned)
            PyMem_Free(hs)
            PyMem_Free(ks.p)
            PyMem_Free(ks.n)
            PyMem_Free(ks.arena)


cdef void walk_keys(IndexFiles f, bint *pinned, const int32_t *hs, Py_ssize_t nk, int64_t b, int64_t e,
                    Py_ssize_t mn, int64_t *out, int64_t *bd, bint exact) noexcept nogil:
    """The chain walks of query_many: the offsets of the key of hash ``hs[i]``, sorted,
    to ``out[bd[i]:bd[i+1]]``; slots and chain heads are loaded AHEAD keys in advance."""
    cdef Py_ssize_t i, n
    bd[0] = 0
    for i in range(nk):
        if i + 2 * AHEAD < nk:
            f.prefetch_chain(pinned, hs[i + 2 * AHEAD], False)
        if i + AHEAD < nk:
            f.prefetch_chain(pinned, hs[i + AHEAD], True)
        n = f.walk(pinned, hs[i], b, e, mn, out + bd[i], exact)
        sort_i64(out + bd[i], n)
        bd[i + 1] = bd[i] + n


cdef class KeyLookup:
    """MessageStore.query_by_key as one C call: its argument checks, the store's operation gate, and the index walk and
    read-back on the current IndexFiles (``index.view``) and commitlog segments
    (``segments.segments``), with no Python frame between them (see StoreWriter)."""
    cdef Gate gate
    cdef object index
    cdef SegmentList segments
    cdef ArgChecks checks
    cdef Py_ssize_t cap

    def __cinit__(self, Gate gate not None, index not None, SegmentList segments not None,
                  ArgChecks checks not None, Py_ssize_t cap):
        self.gate = gate
        self.index = index
        self.segments = segments
        self.checks = checks
        self.cap = cap

    def query_by_key(self, topic=MISSING, key=MISSING, max_num=64, begin=0, end=None, *more, **unknown):
        """MessageStore.query_by_key (see its documentation)."""
        if topic is MISSING or key is MISSING or more or unknown:
            misfit("query_by_key", (topic, key, max_num, begin, end), more, unknown)
        return self.gate.read_logics(query_once, self, self.checks.run((topic, key, max_num, begin, end), None))

    def rebind(self, index not None):
        """Query the index service ``index`` from now on (a rebuild's new one)."""
        self.index = index


cdef object query_once(object lookup, tuple a):
    """KeyLookup's query on the index files of now (Gate.read_logics)."""
    cdef KeyLookup k = <KeyLookup>lookup
    cdef IndexFiles view = k.index.view
    return view._query(a[0], a[1], a[2], a[3], a[4], k.cap, k.segments.segments)


cdef str limits(object topic, object max_num, object begin, object end, Py_ssize_t cap,
               Py_ssize_t *mn, int64_t *b, int64_t *e):
    """Query arguments checked (InvalidArgumentError) and clamped: max_num to [0, cap],
    times to int64, ``end`` None to no limit. Returns the topic as a plain str (a str
    subclass as the str the read-back compares)."""
    if not isinstance(topic, str):
        raise InvalidArgumentError(f"topic must be a str, not {type(topic).__name__}")
    if not isinstance(max_num, int) or not isinstance(begin, int) or not (end is None or isinstance(end, int)):
        raise InvalidArgumentError("max_num, begin and end must be ints")
    cdef int64_t m = clamp64(max_num)
    mn[0] = 0 if m < 0 else (cap if m > cap else m)
    b[0] = clamp64(begin)
    e[0] = 0x7FFFFFFFFFFFFFFF if end is None else clamp64(end)
    return PyUnicode_FromObject(topic)


cdef inline int64_t clamp64(object v) except? -1:
    cdef int overflow = 0
    cdef int64_t x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow:
        return 0x7FFFFFFFFFFFFFFF if overflow > 0 else -0x7FFFFFFFFFFFFFFF - 1
    return x


cdef int check_key(object key) except -1:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"index key must be a non-empty str, got {key!r}")
    return 0


cdef struct Keys:           # query keys as UTF-8
    const char **p
    Py_ssize_t *n
    char *arena             # gather_keys' copy of the bytes (``p`` points into it)


cdef Py_ssize_t gather_keys(list keys, Py_ssize_t nk, Keys *ks) except -1:
    """Check the keys and copy their UTF-8 forms side by side into ``ks.arena``: the
    passes after read them in order, not scattered over the caller's str objects.
    Returns the longest key's length in bytes."""
    cdef Py_ssize_t i, size = 0, cap = 16 * max(1, nk), n, longest = 0
    cdef const char *u
    cdef char *grown
    ks.arena = <char *>PyMem_Malloc(cap)
    if ks.arena == NULL:
        raise MemoryError()
    for i in range(nk):
        if i + AHEAD < nk:      # the str objects lie scattered: load them ahead
            rmq_prefetch(PyList_GET_ITEM(keys, i + AHEAD))
        key = keys[i]
        if not isinstance(key, str):
            check_key(key)
        try:
            u = PyUnicode_AsUTF8AndSize(key, &n)
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(f"keys[{i}] is not valid Unicode text ({e.reason} at {e.start})") from None
        if n == 0:
            check_key(key)
        if size + n > cap:
            cap = max(2 * cap, size + n)
            grown = <char *>PyMem_Realloc(ks.arena, cap)
            if grown == NULL:
                raise MemoryError()
            ks.arena = grown
        memcpy(ks.arena + size, u, n)
        ks.n[i] = n
        size += n
        longest = max(longest, n)
    size = 0
    for i in range(nk):
        ks.p[i] = ks.arena + size
        size += ks.n[i]
    return longest


cdef struct Hit:            # a record keyed_batch keeps for key ``key``
    const char *p           # in the pinned mapping
    RecView r
    int64_t phy
    Py_ssize_t key
    bint unsure             # another topic's bytes: compared as str when the topic holds U+FFFD
    Py_ssize_t owner        # the shared copy it goes to, at byte ``at`` (``dst``)
    Py_ssize_t at
    char *dst


cdef enum:
    CHUNK = 1 << 16         # record bytes per shared copy (a longer record gets its own)
    SPARES = 512            # CHUNK-byte copies an IndexFiles keeps for reuse (32 MiB)
    BLOCK = 2048            # offsets keyed_batch reads back per block of keys
    RELEASE_MIN = 16        # records below which keyed_batch keeps the GIL: dropping and taking it
                            # back costs more, and may wait out another thread's switch interval


cdef class HitSink:
    """What keyed_hits hands each block of keys' hits to."""
    cdef int take(self, Hit *hits, Py_ssize_t nh, Py_ssize_t i0, Py_ssize_t i1) except -1:
        return 0


cdef int keyed_hits(list log, str topic, const Keys *ks, Py_ssize_t nk, const int64_t *offs, const int64_t *bd,
                    HitSink sink, int64_t b, int64_t e) except -1:
    """For each key i, the records at ``offs[bd[i]:bd[i+1]]`` (ascending), newest first,
    that really are ``topic``'s and hold the key: hash collisions, other topics, records
    gone (retention, past a recovered end) or invalid are skipped, and an offset listed
    twice (UNIQ_KEY equal to a KEYS token) gives one record.

    Keys go in blocks of about BLOCK offsets (so the working set stays in cache): each
    block's records are found and checked in place, with the GIL released (from
    RELEASE_MIN records on), and handed to ``sink`` while pinned and in cache."""
    cdef Py_ssize_t tlen, i, i0 = 0, i1, nh, most = 0
    cdef const char *t = PyUnicode_AsUTF8AndSize(topic, &tlen)
    cdef bint loose = "\ufffd" in topic
    cdef int64_t lo = 0x7FFFFFFFFFFFFFFF, hi = -1
    cdef Span span
    cdef Keys block
    cdef Hit *hits
    span.n = 0
    span.refs = NULL
    for i in range(bd[nk]):
        lo = min(lo, offs[i])
        hi = max(hi, offs[i])
    for i in range(nk):
        most = max(most, bd[i + 1] - bd[i])
    hits = <Hit *>PyMem_Malloc(max(1, min(bd[nk], BLOCK + most)) * sizeof(Hit))
    try:
        if hits == NULL:
            raise MemoryError()
        pin_span(log, lo, hi, &span)
        try:
            while i0 < nk:
                i1 = i0 + 1
                while i1 < nk and bd[i1 + 1] - bd[i0] <= BLOCK:
                    i1 += 1
                block.p = ks.p + i0
                block.n = ks.n + i0
                if bd[i1] - bd[i0] >= RELEASE_MIN:
                    with nogil:
                        nh = find_hits(&span, t, tlen, loose, &block, i1 - i0, offs, bd + i0, hits)
                else:
                    nh = find_hits(&span, t, tlen, loose, &block, i1 - i0, offs, bd + i0, hits)
                if loose:
                    nh = drop_unsure(hits, nh, topic)
                nh = drop_outside(hits, nh, b, e)
                sink.take(hits, nh, i0, i1)
                i0 = i1
        finally:
            unpin_span(log, &span)
    finally:
        PyMem_Free(hits)
    return 0


cdef class MessageLists(HitSink):
    """keyed_hits' records as a list of messages a key: copied, with the GIL released
    (from RELEASE_MIN records on), into shared bytes objects of about CHUNK bytes that
    their messages hold (reusing the ``spares`` no message holds any more, see
    reuse_chunk). The lists hold only messages, which are not GC-tracked, so they are
    untracked too: a batch of them does not set off garbage collections (a list a caller
    makes part of a cycle leaks)."""
    cdef list result
    cdef list spares
    cdef Py_ssize_t next_spare

    def __cinit__(self, Py_ssize_t nk, list spares not None):
        self.result = [None] * nk
        PyObject_GC_UnTrack(<void *>self.result)    # tracked again once filled: collections meanwhile skip it
        self.spares = spares
        self.next_spare = 0

    cdef int take(self, Hit *hits, Py_ssize_t nh, Py_ssize_t i0, Py_ssize_t i1) except -1:
        return build_lists(hits, nh, share_copies(hits, nh, self.spares, &self.next_spare), self.result, i0, i1)


cdef list keyed_batch(list log, str topic, const Keys *ks, Py_ssize_t nk, const int64_t *offs, const int64_t *bd,
                      list spares, int64_t b, int64_t e):
    """keyed_hits' messages, a list a key (MessageLists)."""
    cdef MessageLists lists = MessageLists(nk, spares)
    keyed_hits(log, topic, ks, nk, offs, bd, lists, b, e)
    PyObject_GC_Track(<void *>lists.result)
    return lists.result


cdef class MessageColumns(HitSink):
    """keyed_hits' records as decode_entries' columns (read_queue_columns' layout) and
    ``key`` (int64: each row's index in the keys): no object a message, the copying with
    the GIL released. The fixed-width columns have a row for every candidate (cut at the
    end); the data columns are sized from the first block and grow by doubling."""
    cdef dict out
    cdef Cols c
    cdef object keys
    cdef int64_t *kc
    cdef Py_ssize_t rows, candidates

    def __cinit__(self, Py_ssize_t candidates):
        self.out = new_columns(candidates, 0, 0, 0)
        self.keys = np.empty(candidates, np.int64)
        self.kc = <int64_t *>cnp.PyArray_DATA(self.keys)
        cols_of(self.out, &self.c)
        self.rows = 0
        self.candidates = candidates

    cdef int take(self, Hit *hits, Py_ssize_t nh, Py_ssize_t i0, Py_ssize_t i1) except -1:
        cdef int64_t body = 0, topics = 0, props = 0
        cdef double scale
        cdef Py_ssize_t i
        for i in range(nh):
            body += hits[i].r.body_len
            topics += hits[i].r.topic_len
            props += hits[i].r.props_len
        if self.rows == 0:      # room for all at this block's sizes, and a tenth more
            scale = 1.1 * self.candidates / max(1, nh)
            reserve_data(self.out, &self.c, <int64_t>(body * scale), <int64_t>(topics * scale),
                         <int64_t>(props * scale))
        reserve_data(self.out, &self.c, body, topics, props)
        with nogil:
            for i in range(nh):
                fill_at(&self.c, self.rows, hits[i].p, &hits[i].r)
                self.kc[self.rows] = i0 + hits[i].key
                self.rows += 1
        return 0

    cdef dict finish(self):
        trim(self.out, self.rows, &self.c)
        self.out["key"] = self.keys[:self.rows]
        self.out["count"] = self.rows
        return self.out


cdef dict keyed_columns(list log, str topic, const Keys *ks, Py_ssize_t nk, const int64_t *offs, const int64_t *bd,
                        int64_t b, int64_t e):
    """keyed_hits' records as columns (MessageColumns), rows key by key, each key's newest first."""
    cdef MessageColumns cols = MessageColumns(bd[nk])
    keyed_hits(log, topic, ks, nk, offs, bd, cols, b, e)
    return cols.finish()


cdef int build_lists(const Hit *hits, Py_ssize_t nh, list owners, list result, Py_ssize_t i0, Py_ssize_t i1) except -1:
    """``result[i0:i1]``: per key of the block, the list of the messages of its hits."""
    cdef Py_ssize_t i, j, k = 0, m
    cdef list found
    cdef MessageExt msg
    for i in range(i1 - i0):
        j = k
        while j < nh and hits[j].key == i:
            j += 1
        found = PyList_New(j - k)
        for m in range(k, j):     # straight into the new list's slots: it holds each reference
            msg = ext_in(<bytes>owners[hits[m].owner], hits[m].at, &hits[m].r, hits[m].phy)
            Py_INCREF(msg)
            PyList_SET_ITEM(found, m - k, msg)
        PyObject_GC_UnTrack(<void *>found)
        result[i0 + i] = found
        k = j
    return 0


cdef Py_ssize_t find_hits(const Span *s, const char *t, Py_ssize_t tlen, bint loose, const Keys *ks, Py_ssize_t nk,
                          const int64_t *offs, const int64_t *bd, Hit *hits) noexcept nogil:
    """keyed_batch's GIL-free pass: the records that pass its checks into ``hits``, key by
    key, newest first; returns how many. The records of the key AHEAD on are loaded ahead."""
    cdef Py_ssize_t i, j, n = 0
    cdef RecView r
    cdef const char *p
    cdef Match match
    for i in range(nk):
        if i + AHEAD < nk:
            for j in range(bd[i + AHEAD], bd[i + AHEAD + 1]):
                span_prefetch(s, offs[j], 512)
        j = bd[i + 1]
        while j > bd[i]:
            j -= 1
            if j < bd[i + 1] - 1 and offs[j] == offs[j + 1]:
                continue
            p = span_record(s, offs[j], &r, False, -1)
            if p == NULL:
                continue
            match = key_match(p, &r, t, tlen, loose, ks.p[i], ks.n[i])
            if match == NO_MATCH:
                continue
            hits[n].p = p
            hits[n].r = r
            hits[n].phy = offs[j]
            hits[n].key = i
            hits[n].unsure = match == TOPIC_UNSURE
            n += 1
    return n


cdef enum Match:
    NO_MATCH = 0
    MATCH = 1
    TOPIC_UNSURE = 2        # holds the key, but the topic's bytes differ: compare the names as str


cdef inline Match key_match(const char *p, const RecView *r, const char *t, Py_ssize_t tlen, bint loose,
                            const char *k, Py_ssize_t klen) noexcept nogil:
    """Whether the record at ``p`` is of topic ``t`` and holds key ``k``. A stored name
    whose bytes differ may still decode, with replacement characters, to a topic that
    holds U+FFFD (``loose``): TOPIC_UNSURE leaves that comparison to the caller."""
    cdef bint unsure = not (r.topic_len == tlen and memcmp(p + r.topic_off, t, tlen) == 0)
    if (unsure and not loose) or not has_key(p + r.props_off, r.props_len, k, klen):
        return NO_MATCH
    return TOPIC_UNSURE if unsure else MATCH


cdef list keyed_messages(list log, str topic, const char *k, Py_ssize_t klen, const int64_t *offs, Py_ssize_t n,
                         int64_t b, int64_t e):
    """keyed_batch for one key's few offsets, with the GIL held (releasing it would cost
    more than the work): each record is checked in place under a pin of its own (its
    store time too: in [b, e]), then copied into its message."""
    cdef Py_ssize_t i, tlen
    cdef const char *t = PyUnicode_AsUTF8AndSize(topic, &tlen)
    cdef const char *p = NULL
    cdef RecView r
    cdef list out = []
    cdef int code
    cdef Match match
    cdef MappedSegment seg
    for i in range(n):          # its fields are read one after the other: load all their lines at once
        prefetch_at(log, offs[i], 512)
    for i in range(n - 1, -1, -1):
        if i < n - 1 and offs[i] == offs[i + 1]:
            continue
        seg = record_at(log, offs[i], False, &r, &p, &code)
        if seg is None:
            continue
        try:       # loose: a name that differs decodes to ``topic`` only if it holds U+FFFD
            match = key_match(p, &r, t, tlen, True, k, klen)
            if match == TOPIC_UNSURE and PyUnicode_DecodeUTF8(p + r.topic_off, r.topic_len, "replace") != topic:
                continue
            if match != NO_MATCH and b <= r.store_ts <= e:
                out.append(build_ext(p, &r, offs[i]))
        finally:
            unpin(seg)
    return out


cdef Py_ssize_t drop_outside(Hit *hits, Py_ssize_t n, int64_t b, int64_t e) noexcept:
    """Keep the hits whose record's store time is in [b, e]; returns how many remain, in order."""
    cdef Py_ssize_t i, k = 0
    for i in range(n):
        if b <= hits[i].r.store_ts <= e:
            hits[k] = hits[i]
            k += 1
    return k


cdef Py_ssize_t drop_unsure(Hit *hits, Py_ssize_t n, str topic):
    """Keep, of the hits of another topic's bytes, those whose stored name decodes (with
    replacement characters) to ``topic``; returns how many hits remain, in order."""
    cdef Py_ssize_t i, k = 0
    for i in range(n):
        if hits[i].unsure and PyUnicode_DecodeUTF8(hits[i].p + hits[i].r.topic_off, hits[i].r.topic_len,
                                                   "replace") != topic:
            continue
        hits[k] = hits[i]
        k += 1
    return k


cdef list share_copies(Hit *hits, Py_ssize_t n, list spares, Py_ssize_t *next_spare):
    """Copy the hits' records (pinned) into bytes objects of about CHUNK bytes, in order,
    the copying with the GIL released; returns those objects, each hit naming its own.
    A copy of CHUNK / 4 bytes or more goes to a CHUNK-byte spare (reuse_chunk)."""
    cdef list owners = []
    cdef Py_ssize_t i = 0, j
    cdef int64_t size
    cdef char *q
    while i < n:
        size = hits[i].r.total
        j = i + 1
        while j < n and size + hits[j].r.total <= CHUNK:
            size += hits[j].r.total
            j += 1
        if CHUNK // 4 <= size <= CHUNK:
            owner = reuse_chunk(spares, next_spare)
        else:
            owner = PyBytes_FromStringAndSize(NULL, size)
        q = PyBytes_AS_STRING(owner)
        size = 0
        while i < j:
            hits[i].owner = len(owners)
            hits[i].at = size
            hits[i].dst = q + size
            size += hits[i].r.total
            i += 1
        owners.append(owner)
    if n >= RELEASE_MIN:
        with nogil:
            copy_hits(hits, n)
    else:
        copy_hits(hits, n)
    return owners


cdef bytes reuse_chunk(list spares, Py_ssize_t *next_spare):
    """A CHUNK-byte bytes object to copy records into: the first of ``spares`` from
    ``next_spare`` on that only ``spares`` holds (no message, and no one else, reads it
    any more; checked with the GIL held, so no other thread takes it meanwhile), else a new
    one, kept in ``spares`` while they are fewer than SPARES. A batch of fresh copies costs a
    page fault per 4 KiB (glibc hands freed 64 KiB blocks back to the kernel): ~6,000 for
    100,000 keys, a fifth of query_keys' time."""
    cdef PyObject *c
    while next_spare[0] < PyList_GET_SIZE(spares):
        c = PyList_GET_ITEM(spares, next_spare[0])
        next_spare[0] += 1
        if rmq_sole(c):
            rmq_forget_hash(c)
            return <bytes>c
    owner = PyBytes_FromStringAndSize(NULL, CHUNK)
    if PyList_GET_SIZE(spares) < SPARES:
        spares.append(owner)
    return owner


cdef void copy_hits(Hit *hits, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        memcpy(hits[i].dst, hits[i].p, hits[i].r.total)


cdef void sort_i64(int64_t *a, Py_ssize_t n) noexcept nogil:
    """Insertion sort: n is at most max_num, and chains come out nearly descending."""
    cdef Py_ssize_t i, j
    cdef int64_t v
    for i in range(1, n):
        v = a[i]
        j = i - 1
        while j >= 0 and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


cdef bint has_key(const char *p, int32_t n, const char *k, Py_ssize_t klen) noexcept nogil:
    cdef int32_t voff = 0, vlen = 0
    cdef Py_ssize_t i, j
    if n == 0 or klen == 0:
        return False
    if find_property(p, n, b"UNIQ_KEY", 8, &voff, &vlen) and vlen == klen and memcmp(p + voff, k, klen) == 0:
        return True
    if find_property(p, n, b"KEYS", 4, &voff, &vlen):
        i = voff
        while i < voff + vlen:
            j = token_end(p, i, voff + vlen)
            if j - i == klen and memcmp(p + i, k, klen) == 0:
                return True
            i = j + 1
    return False
