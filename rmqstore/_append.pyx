# cython: boundscheck=False, wraparound=False, cdivision=True
"""The write side: encode a Message as a commitlog record straight into the mapped last
segment, and the Appender that puts messages and batches under the commitlog's write
lock."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_Check
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_get_thread_ident,
                               PyThread_acquire_lock, PyThread_release_lock, NOWAIT_LOCK, WAIT_LOCK)
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME
from rmqstore._cext cimport rmq_crc32, rmq_ld32, rmq_release, rmq_st16, rmq_st32, rmq_st64
from rmqstore._copy cimport copy_short
from rmqstore._layout cimport *
from rmqstore._message cimport Message, PutResult, text_arg, body_arg
from rmqstore._message import queue_id_arg, sys_flag_arg
from rmqstore._segment cimport MappedSegment, SegmentList, check, ensure, write_at
from rmqstore._gate cimport Gate
from rmqstore._flusher cimport Flusher
from rmqstore._gate import MISSING, misfit
import numpy as np
from rmqstore.errors import (InvalidArgumentError, InvalidArgumentTypeError, InvalidTopicError, MessageTooLargeError,
                             ReentrantCallError, StoreClosedError)

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    const char *utf8_of "PyUnicode_AsUTF8AndSize"(PyObject *s, Py_ssize_t *size) except NULL


cdef enum:
    PROPS_MAX = 32767       # bytes of a record's properties string (its length is an int16)


cdef inline bint separator_in(uint64_t w) noexcept:
    """Whether a byte of ``w`` is \\x01 or \\x02 (a byte of ``w ^ b`` is zero where ``w`` holds ``b``)."""
    cdef uint64_t ones = 0x0101010101010101ULL, x = w ^ ones, y = w ^ (ones << 1)
    return ((x - ones) & ~x | (y - ones) & ~y) & 0x8080808080808080ULL != 0


cdef inline bint has_separator(const char *p, Py_ssize_t n) noexcept:
    """Whether ``p[:n]`` holds \\x01 or \\x02, which split the properties string: eight
    bytes at a time, the last word overlapping the one before (short strings: two
    overlapping halves)."""
    cdef uint64_t w
    cdef uint32_t a, b
    cdef Py_ssize_t i = 0
    if n >= 8:
        while i + 8 < n:
            memcpy(&w, p + i, 8)
            if separator_in(w):
                return True
            i += 8
        memcpy(&w, p + n - 8, 8)
        return separator_in(w)
    if n >= 4:
        memcpy(&a, p, 4)
        memcpy(&b, p + n - 4, 4)
        return separator_in(<uint64_t>a << 32 | b)
    for i in range(n):
        if <unsigned char>(p[i] - 1) < 2:
            return True
    return False


cdef enum:
    PROPS_SMALL = 512       # properties laid out on the stack up to this size, past it on the heap


cdef bytes properties_bytes(dict props, bint *delayed=NULL):
    """The properties string a record stores (4.9 layout: name\\x01value pairs joined by
    \\x02, no trailing separator; None values left out), checked: names and values str,
    valid Unicode, no empty name, no separator inside; at most PROPS_MAX bytes. One pass over
    the dict with borrowed references, so no Python code may run in it (a str subclass's
    __eq__ could change the dict): names are compared by their UTF-8 bytes. A dict another
    thread changes cannot make the record disagree with its length. ``delayed``: set when
    a DELAY property has a value."""
    cdef char small[PROPS_SMALL]
    cdef char *buf = small
    cdef char *grown
    cdef Py_ssize_t kl, vl, n = 0, need, at = 0, cap = PROPS_SMALL
    cdef const char *kp
    cdef const char *vp
    cdef char *out
    cdef PyObject *k
    cdef PyObject *v
    try:
        while PyDict_Next(props, &at, &k, &v):     # borrowed: no Python code runs in this loop
            if v == <PyObject *>None:
                continue
            if not PyUnicode_Check(<object>k) or not PyUnicode_Check(<object>v):   # a subclass by its value
                raise InvalidArgumentTypeError(f"property {<object>k!r}: names and values must be str")
            kp = utf8_of(k, &kl)
            vp = utf8_of(v, &vl)
            if kl == 0 or has_separator(kp, kl) or has_separator(vp, vl):
                raise InvalidArgumentError(f"property {<object>k!r}: empty name or a \\x01/\\x02 separator inside")
            if delayed != NULL and kl == 5 and memcmp(kp, b"DELAY", 5) == 0:
                delayed[0] = True
            need = (1 if n else 0) + kl + 1 + vl
            if n + need > cap and n + need <= PROPS_MAX:
                grown = <char *>malloc(PROPS_MAX)
                if grown == NULL:
                    raise MemoryError()
                memcpy(grown, buf, n)
                buf, cap = grown, PROPS_MAX
            if n + need <= cap:
                out = buf + n
                if n:
                    out[0] = 2
                    out += 1
                memcpy(out, kp, kl)
                out[kl] = 1
                memcpy(out + kl + 1, vp, vl)
            n += need       # past PROPS_MAX: only counted, to name the size below
        if n > PROPS_MAX:
            raise MessageTooLargeError(f"properties of {n} bytes exceed {PROPS_MAX}")
        return PyBytes_FromStringAndSize(buf, n)
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"property {<object>k!r}: not valid Unicode text (a lone surrogate?)") from None
    finally:
        if buf != small:
            free(buf)


cdef int64_t record_size(bytes born, str topic, Py_ssize_t plen, bytes store_host, int version, int64_t max_size,
                         int64_t seg_size, Py_ssize_t blen) except -1:
    """Bytes of the record a message makes with this born host (None: the store host),
    effective topic, properties length and body length, after checking everything the
    encoder would refuse (hosts, topic and properties lengths, the size limits), so a batch
    can be checked whole before any of it is written."""
    cdef Py_ssize_t tlen
    if born is None:
        born = store_host
    cdef int32_t born_alen = len(born) - 4, store_alen = len(store_host) - 4
    cdef int64_t total
    PyUnicode_AsUTF8AndSize(topic, &tlen)
    if (born_alen != 4 and born_alen != 16) or (store_alen != 4 and store_alen != 16):
        raise InvalidArgumentError("hosts must be packed as 8 or 20 bytes")
    if version == 1 and tlen > 255 or tlen > 32767:
        raise InvalidArgumentError(f"topic of {tlen} bytes does not fit message version {version}")
    if plen > PROPS_MAX:
        raise MessageTooLargeError(f"properties of {plen} bytes exceed {PROPS_MAX}")
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born_alen + 4 + 8 + store_alen + 4 + 4 + 8 \
        + 4 + blen + (1 if version == 1 else 2) + tlen + 2 + plen
    if total > max_size or total + 8 > seg_size:
        raise MessageTooLargeError(f"message of {total} bytes exceeds the limit ({min(max_size, seg_size - 8)} bytes)")
    return total


cdef object held_body(object body):
    """``body`` as the planned message keeps it until it is written: bytes as they are,
    another bytes-like object through a memoryview, whose export stops a bytearray from
    being resized meanwhile (its bytes may still change: the CRC is taken from the copy)."""
    if PyBytes_CheckExact(body):
        return body
    body_arg(body)
    try:
        view = memoryview(body)
        if not view.c_contiguous:
            raise BufferError("not C-contiguous")
    except (BufferError, ValueError, TypeError) as e:   # e.g. a strided memoryview or array
        raise InvalidArgumentTypeError(f"body must be one contiguous run of bytes: {e}") from None
    return view


cdef int32_t copy_crc(char *dst, const char *src, Py_ssize_t n) noexcept nogil:
    """Copy ``n`` bytes to ``dst`` and return BODYCRC of the bytes as they stand at ``dst``:
    one pass in cache-sized chunks, each checksummed right after its copy. The CRC so
    always matches what was stored, even if another thread changes ``src`` meanwhile."""
    cdef uint32_t c = 0
    cdef Py_ssize_t k
    while n > 0:
        k = n if n < 32768 else 32768
        memcpy(dst, src, k)
        c = rmq_crc32(c, dst, <size_t>k)
        dst += k
        src += k
        n -= k
    return <int32_t>(c & 0x7FFFFFFF)


cdef inline void seal(char *p, int32_t total) noexcept nogil:
    """Write the TOTALSIZE of the record at ``p``, whole but for it (rmq_order.h): one a
    crash cut short reads as the end of the log (size 0), never as a record with zeros
    where its topic or properties belong."""
    rmq_release()
    rmq_st32(p, total)


cdef inline void write_blank(char *p, int32_t room) noexcept nogil:
    """The BLANK record that ends a segment with ``room`` (>= 8) bytes left, sealed."""
    rmq_st32(p + 4, C_BLANK)
    seal(p, room)


cdef struct RecordHead:
    # the fields of a record that precede its body (positions as in DESIGN.md)
    int64_t phy, total, queue_offset, born_ts, store_ts, prepared
    int32_t queue_id, flag, sys_flag, reconsume
    int version


cdef char *write_record(char *p, RecordHead *h, const char *born, int32_t born_len, const char *store,
                        int32_t store_len, const char *body, int64_t blen, const char *tp,
                        Py_ssize_t tlen) noexcept nogil:
    """A record up to its properties at ``p`` (``born``/``store``: packed hosts of
    ``*_len`` bytes), the body CRC taken from the copy, but for its TOTALSIZE, which
    ``seal`` writes once the properties are in; returns where their length goes."""
    cdef char *start = p
    rmq_st32(p + 4, C_MAGIC_V1 if h.version == 1 else C_MAGIC_V2)
    rmq_st32(p + 12, h.queue_id)
    rmq_st32(p + 16, h.flag)
    rmq_st64(p + 20, h.queue_offset)
    rmq_st64(p + 28, h.phy)
    rmq_st32(p + 36, h.sys_flag)
    rmq_st64(p + 40, h.born_ts)
    p += 48
    copy_short(p, born, born_len)
    p += born_len
    rmq_st64(p, h.store_ts)
    copy_short(p + 8, store, store_len)
    p += 8 + store_len
    rmq_st32(p, h.reconsume)
    rmq_st64(p + 4, h.prepared)
    rmq_st32(p + 12, <int32_t>blen)
    p += 16
    rmq_st32(start + 8, copy_crc(p, body, blen))
    p += blen
    if h.version == 1:
        p[0] = <char>tlen
        p += 1
    else:
        rmq_st16(p, <int16_t>tlen)
        p += 2
    copy_short(p, tp, tlen)
    return p + tlen


cdef PutResult encode(MappedSegment seg, Message msg, object body, bytes born, str topic, bytes props,
                      int32_t queue_id, int64_t queue_offset, int64_t store_ts, bytes store_host, int version,
                      int64_t max_size, int64_t total=-1):
    """Encode ``msg`` with the given body, born host, effective topic, properties and queue
    (what was checked, not the message's attributes now) at the segment's write position.
    ``total``: the record's size as record_size gave it for these (-1: checked here).
    Returns a PutResult, or None when the record does not fit: then the BLANK end-of-file
    record has been written and the caller rolls to a new segment."""
    cdef Py_ssize_t tlen, blen
    cdef const char *tp = PyUnicode_AsUTF8AndSize(topic, &tlen)
    cdef const char *bp
    cdef Py_buffer view
    cdef bint have_view = False
    cdef int32_t born_alen, store_alen = len(store_host) - 4
    cdef const char *born_p
    cdef const char *store_p = PyBytes_AS_STRING(store_host)
    cdef int64_t room, wpos
    cdef char *p
    cdef RecordHead h
    cdef PutResult res
    if seg.m.readonly or seg.closing or seg.unmapped:
        raise StoreClosedError(f"{seg.path}: segment not writable")
    if born is None:
        born = store_host
    born_alen = len(born) - 4
    born_p = PyBytes_AS_STRING(born)
    if PyBytes_CheckExact(body):
        bp = PyBytes_AS_STRING(body)
        blen = PyBytes_GET_SIZE(body)
    else:
        PyObject_GetBuffer(body_arg(body), &view, PyBUF_SIMPLE)
        have_view = True
        bp = <const char *>view.buf
        blen = view.len
    try:
        if total < 0:
            total = record_size(born, topic, len(props), store_host, version, max_size, seg.m.size, blen)
        wpos = seg.wrote_pos
        room = seg.m.size - wpos
        p = seg.m.base + wpos
        if total + 8 > room:
            if room >= 8:   # a full segment (room 0) already ends with its BLANK record
                ensure(seg, wpos + 8)
                write_blank(p, <int32_t>room)
            seg.wrote_pos = seg.m.size
            return None
        ensure(seg, wpos + total)
        h.phy, h.total, h.queue_offset, h.store_ts = seg.base_offset + wpos, total, queue_offset, store_ts
        h.born_ts = msg.born_timestamp if msg.born_timestamp else store_ts
        h.prepared, h.queue_id, h.flag, h.reconsume = msg.prepared_transaction_offset, queue_id, msg.flag, \
            msg.reconsume_times
        h.sys_flag = (msg.sys_flag & ~(BORN_V6 | STORE_V6)) | (BORN_V6 if born_alen == 16 else 0) \
            | (STORE_V6 if store_alen == 16 else 0)
        h.version = version
        if blen >= 65536:
            with nogil:
                p = write_record(p, &h, born_p, born_alen + 4, store_p, store_alen + 4, bp, blen, tp, tlen)
        else:
            p = write_record(p, &h, born_p, born_alen + 4, store_p, store_alen + 4, bp, blen, tp, tlen)
        rmq_st16(p, <int16_t>len(props))
        memcpy(p + 2, PyBytes_AS_STRING(props), len(props))
        seal(seg.m.base + wpos, <int32_t>total)
    finally:
        if have_view:
            PyBuffer_Release(&view)
    seg.wrote_pos = wpos + total
    seg.store_timestamp = store_ts
    res = PutResult.__new__(PutResult)
    res.phy_offset = seg.base_offset + wpos
    res.size = <int32_t>total
    res.topic = topic
    res.queue_id = queue_id
    res.queue_offset = queue_offset
    res.store_timestamp = store_ts
    res.store_host = store_host
    return res


def append_message(MappedSegment seg not None, Message msg not None, str topic not None, dict props not None,
                   int32_t queue_id, int64_t queue_offset, int64_t store_ts, bytes store_host not None, int version,
                   int64_t max_size):
    """One record at the segment's write position (see encode); None when it did not fit."""
    return encode(seg, msg, msg.body, msg.born_host_packed, topic, properties_bytes(props), queue_id, queue_offset,
                  store_ts, store_host, version, max_size)


cdef const int64_t[::1] column_offsets(object offsets, Py_ssize_t data_len, str what) except *:
    """``offsets`` as int64, checked: n + 1 non-decreasing values within [0, data_len]."""
    cdef const int64_t[::1] o = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef Py_ssize_t i
    if o.shape[0] < 1 or o[0] < 0 or o[o.shape[0] - 1] > data_len:
        raise InvalidArgumentError(f"{what} offsets must run from >= 0 to <= {data_len}")
    for i in range(o.shape[0] - 1):
        if o[i + 1] < o[i]:
            raise InvalidArgumentError(f"{what} offsets must not decrease (row {i})")
    return o


cdef object _zeros = np.zeros(0, np.int64)


cdef const int64_t[::1] zeros(Py_ssize_t n):
    """``n`` int64 zeros, read only, shared by the calls (a column given as None: no fresh
    pages to fault in and fill per call)."""
    global _zeros
    if _zeros.shape[0] < n:
        _zeros = np.zeros(n, np.int64)
        _zeros.flags.writeable = False
    return _zeros[:n]


cdef const int64_t[::1] int_column(object values, Py_ssize_t n, int64_t lo, int64_t hi, str what) except *:
    """``values`` as ``n`` int64s in [lo, hi] (None: ``n`` zeros)."""
    if values is None:
        return zeros(n)
    a = np.asarray(values)
    if a.shape != (n,) or (n and a.dtype.kind not in "iu"):
        raise InvalidArgumentTypeError(f"{what} must be {n} ints")
    if n and (a.min() < lo or a.max() > hi):
        raise InvalidArgumentError(f"{what} must be in [{lo}, {hi}]")
    return np.ascontiguousarray(a, dtype=np.int64)


cdef class BodyRows:
    """The bodies of a put_columns call where they lie, and what keeps those bytes in place
    until the call ends: a contiguous column's buffer (``data`` with n + 1 ``offsets``,
    read in place), or a sequence of bytes-like items (``offsets`` None) as (pointer,
    length) per row, the items held as our own
    tuple; bytes are immutable and any other item is pinned by a buffer export (a
    bytearray cannot be resized meanwhile; its bytes may still change: the CRC is taken
    from the copy). So a list of bytes is copied once, into the mapping."""
    cdef const char **ptr           # a sequence's items (NULL for a column)
    cdef int64_t *len
    cdef const char *base           # a column: row i at base + off[i]
    cdef const int64_t[::1] off
    cdef Py_buffer *views           # per row, where pinned[i]
    cdef char *pinned
    cdef Py_ssize_t n
    cdef object keep
    cdef const unsigned char[::1] data

    def __cinit__(self, data, offsets):
        cdef Py_ssize_t i
        cdef tuple items
        cdef object v
        if offsets is None:
            if isinstance(data, (str, bytes, bytearray, memoryview)) or not hasattr(data, "__iter__"):
                raise InvalidArgumentTypeError(f"bodies must be a sequence of bytes-like objects, "
                                               f"not {type(data).__name__}")
            items = self.keep = tuple(data)
            self.n = len(items)
        else:
            self.data = data
            self.off = column_offsets(offsets, self.data.shape[0], "body")
            self.n = self.off.shape[0] - 1
            self.base = ""
            if self.data.shape[0]:
                self.base = <const char *>&self.data[0]
            return
        self.ptr = <const char **>malloc(max(self.n, 1) * sizeof(char *))
        self.len = <int64_t *>malloc(max(self.n, 1) * sizeof(int64_t))
        if self.ptr == NULL or self.len == NULL:
            raise MemoryError()
        for i in range(self.n):
            v = items[i]
            if PyBytes_CheckExact(v):
                self.ptr[i], self.len[i] = PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v)
            else:
                self._pin(i, v)

    cdef int _pin(self, Py_ssize_t i, object v) except -1:
        if self.views == NULL:
            self.views = <Py_buffer *>calloc(self.n, sizeof(Py_buffer))
            self.pinned = <char *>calloc(self.n, 1)
            if self.views == NULL or self.pinned == NULL:
                raise MemoryError()
        if not isinstance(v, str):
            try:
                PyObject_GetBuffer(v, &self.views[i], PyBUF_SIMPLE)   # fails for strided views
                self.pinned[i] = 1
            except (BufferError, TypeError, ValueError):
                pass
        if not self.pinned[i]:
            raise InvalidArgumentTypeError(f"bodies: {type(v).__name__} where contiguous bytes are due")
        self.ptr[i], self.len[i] = <const char *>self.views[i].buf, self.views[i].len
        return 0

    def __len__(self):
        return self.n

    cdef inline int64_t length(self, Py_ssize_t i) noexcept:
        return self.len[i] if self.ptr != NULL else self.off[i + 1] - self.off[i]

    def release(self):
        """Drop the buffer exports (also done when the object goes)."""
        self._release()

    cdef void _release(self) noexcept:
        cdef Py_ssize_t i
        if self.views != NULL:
            for i in range(self.n):
                if self.pinned[i]:
                    PyBuffer_Release(&self.views[i])
            free(self.views)
            free(self.pinned)
            self.views, self.pinned = NULL, NULL

    def __dealloc__(self):
        self._release()
        free(self.ptr)
        free(self.len)


cdef enum:
    NOGIL_BYTES = 1 << 18     # put_columns releases the GIL to write a batch of at least this many bytes,
    STAGE_BYTES = 1 << 20     # encoding runs of up to this many bytes in a buffer written with pwrite


cdef struct Rows:
    # put_columns' columns as C arrays, row i at index i (see Appender.put_columns)
    const char **body               # a sequence's bodies, or NULL: body_base + body_off[i]
    const int64_t *body_len
    const char *body_base
    const int64_t *body_off
    const char *props
    const int64_t *po
    const char *hosts
    const int64_t *ho
    const int64_t *flg
    const int64_t *sfl
    const int64_t *bts
    const int64_t *rct
    const int64_t *tids
    const int32_t *qids
    const int64_t *slots
    const int64_t *sizes
    int64_t *next_off               # next queue offset per (topic, queue) slot
    int64_t *qoffs
    int64_t *phys
    const char **topic
    const int64_t *tlen
    const char *store_host
    int32_t hlen, host_bits


cdef Py_ssize_t write_run(Rows *r, RecordHead *h, Py_ssize_t i, Py_ssize_t n, char *out, int64_t seg_base,
                          int64_t seg_size, int64_t *wpos, int64_t warm_mark) noexcept nogil:
    """Write rows ``i``.. from segment position ``*wpos`` on, to ``out`` (where that
    position's byte goes), while they fit before ``seg_size`` (a record and an 8-byte
    BLANK), stopping after the row that reaches ``warm_mark``; returns the next row and
    leaves ``*wpos`` past the last record written. Takes each row's queue offset
    (PREPARED / ROLLBACK: 0, not advancing)."""
    cdef int64_t start = wpos[0], pos = wpos[0], plen
    cdef int32_t born_len
    cdef char *p
    cdef const char *body
    cdef int64_t blen
    while i < n and r.sizes[i] + 8 <= seg_size - pos:
        if not gets_cq_entry_c(r.sfl[i]):
            r.qoffs[i] = 0
        else:
            r.qoffs[i] = r.next_off[r.slots[i]]
            r.next_off[r.slots[i]] += 1
        born_len = <int32_t>(r.ho[i + 1] - r.ho[i])
        r.phys[i] = seg_base + pos
        h.phy, h.total, h.queue_offset, h.queue_id = r.phys[i], r.sizes[i], r.qoffs[i], r.qids[i]
        h.flag, h.reconsume, h.born_ts = <int32_t>r.flg[i], <int32_t>r.rct[i], r.bts[i] if r.bts[i] else h.store_ts
        h.sys_flag = (<int32_t>r.sfl[i] & ~(BORN_V6 | STORE_V6)) | r.host_bits \
            | (BORN_V6 if born_len == 20 or born_len == 0 and r.hlen == 20 else 0)
        if r.body != NULL:
            body, blen = r.body[i], r.body_len[i]
        else:
            body, blen = r.body_base + r.body_off[i], r.body_off[i + 1] - r.body_off[i]
        p = write_record(out + (pos - start), h, r.hosts + r.ho[i] if born_len else r.store_host,
                         born_len if born_len else r.hlen, r.store_host, r.hlen, body, blen,
                         r.topic[r.tids[i]], r.tlen[r.tids[i]])
        plen = r.po[i + 1] - r.po[i]
        rmq_st16(p, <int16_t>plen)
        copy_short(p + 2, r.props + r.po[i], plen)
        seal(out + (pos - start), <int32_t>r.sizes[i])
        pos += r.sizes[i]
        i += 1
        if seg_base + pos >= warm_mark:
            break
    wpos[0] = pos
    return i


cdef void untake(Rows *r, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    """Give back the queue offsets write_run took for rows ``[i, j)``."""
    while j > i:
        j -= 1
        if gets_cq_entry_c(r.sfl[j]):
            r.next_off[r.slots[j]] -= 1


cdef int write_staged(Rows *r, RecordHead *h, Py_ssize_t i, Py_ssize_t n, char *stage, MappedSegment seg,
                      int64_t *wpos, int64_t warm_mark, Py_ssize_t *j) except -1:
    """write_run for a bulk batch: rows ``i``.. encoded into ``stage`` (STAGE_BYTES), then
    written to the file with one pwrite, which spares the kernel filling each fresh page
    with zeros before the copy (see rmq_map_write). The first record's TOTALSIZE goes in
    after the rest, through the mapping (one store), so a pwrite a kill cut short leaves
    the end of the log where the run begins, not a last record cut off inside. A row too large for the stage is
    written through the mapping. Sets ``j`` to the next row; if the pwrite fails, the
    rows are not published, their queue offsets are given back and StoreIOError is raised
    (the caller makes it the store's sticky error: a later write could leave whole records
    of this run behind its own end, for recovery to take as written)."""
    cdef int64_t pos = wpos[0]
    cdef int rc = 0
    cdef int32_t total
    with nogil:
        j[0] = write_run(r, h, i, n, stage, seg.base_offset, min(seg.m.size, pos + STAGE_BYTES), wpos, warm_mark)
        if j[0] > i:
            total = rmq_ld32(stage)
            memset(stage, 0, 4)
            rc = write_at(seg, pos, stage, wpos[0] - pos)
            if rc == 0:
                seal(seg.m.base + pos, total)
            if rc:
                untake(r, i, j[0])
                wpos[0] = pos
        else:
            j[0] = write_run(r, h, i, n, seg.m.base + pos, seg.base_offset, seg.m.size, wpos, warm_mark)
    return check(rc, seg.path, "pwrite")


cdef inline int64_t now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef enum:
    DENSE_QUEUES = 1024     # queue ids below this keep their next offset in a C array
cdef int64_t NOT_SET = -0x7FFFFFFFFFFFFFFF - 1     # in that array: no offset set for the queue


@cython.final
cdef class _TopicState:
    """One topic's write state: next round-robin queue id, next offset per queue id (0
    until one is set): ids in [0, DENSE_QUEUES) in a C array, grown to the largest id met
    (a dict of ints cost a put 370 instructions), the rest in a dict."""
    cdef int32_t next_qid
    cdef bint checked                   # the name passed check_topic
    cdef int64_t *dense                 # next offset per queue id below ndense, or NOT_SET
    cdef int32_t ndense
    cdef dict sparse                    # other queue ids (a corrupt record's may be negative) -> next offset

    def __cinit__(self):
        self.sparse = {}

    def __dealloc__(self):
        free(self.dense)

    cdef inline int64_t next_offset(self, int64_t qid) except? -1:
        if 0 <= qid < self.ndense:
            return 0 if self.dense[qid] == NOT_SET else self.dense[qid]
        return 0 if 0 <= qid < DENSE_QUEUES else self.sparse.get(qid, 0)

    cdef int set_next(self, int64_t qid, int64_t offset) except -1:
        cdef int32_t n, i
        cdef int64_t *grown
        if offset == NOT_SET:
            raise InvalidArgumentError(f"queue {qid}: next offset {offset} is out of range")
        if not 0 <= qid < DENSE_QUEUES:
            self.sparse[qid] = offset
            return 0
        if qid >= self.ndense:
            n = min(DENSE_QUEUES, max(qid + 1, 2 * self.ndense, 8))
            grown = <int64_t *>realloc(self.dense, n * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError()
            for i in range(self.ndense, n):
                grown[i] = NOT_SET
            self.dense, self.ndense = grown, n
        self.dense[qid] = offset
        return 0

    cdef dict offsets(self):
        """Queue id -> next offset, of the queues set."""
        cdef int32_t q
        out = {q: self.dense[q] for q in range(self.ndense) if self.dense[q] != NOT_SET}
        out.update(self.sparse)
        return out

    cdef void clear(self) noexcept:
        free(self.dense)
        self.dense, self.ndense = NULL, 0
        self.sparse.clear()


@cython.final
@cython.no_gc           # refers to nothing that refers back to it
@cython.freelist(8)
cdef class _Plan:
    """A checked message and where it goes (Appender._plan): what _write encodes."""
    cdef Message msg
    cdef str topic                      # the effective topic (DELAY: SCHEDULE_TOPIC_XXXX)
    cdef bytes props                    # the properties string, laid out
    cdef int32_t queue_id
    cdef _TopicState state              # the topic's
    cdef int64_t size                   # of the record
    cdef object body                    # held: bytes, or a memoryview of the caller's buffer
    cdef bytes born                     # packed born host, None: the store's


cdef class Appender:
    """The write side of a commitlog: picks the queue id (round robin per topic when none
    is given), assigns the queue offset (PREPARED / ROLLBACK get 0 and do not advance it)
    and encodes the record at the end of the last segment, rolling when it is full; a
    batch runs as one C loop with one store timestamp. Queue ids, offsets and the
    transaction rule stay here, not in Python: the same rules in Python over the encoder
    measured 1.74 us per put against 1.00 us (issue 10).

    Policy stays in Python callbacks, called only when needed: ``check_topic(topic)`` the
    first time a topic is written (raises if the name is not allowed), ``delay(msg, topic,
    queue_id, props)`` -> (topic, queue_id, props) for a message with a DELAY property, and
    ``warm(seg)`` once the end of written data reaches ``warm_mark`` (a commitlog offset),
    and ``stamp(msg)`` (None: off) on every message before it is checked (UNIQ_KEY).
    ``stage_bulk``: put_columns writes batches of NOGIL_BYTES or more with pwrite
    (write_staged), for a commitlog whose pages nobody faults in ahead of the writer.
    The segment queue is used through its public face only: ``last``, ``roll()``,
    ``make_room()``, ``premade``, ``prepare_next()`` and ``file_size`` (read once: it never
    changes).
    Thread-safe: ``put``/``put_batch`` hold the appender's own write lock, a C lock taken
    without a Python call when free (waiting for it releases the GIL). ``with appender:``
    holds it for other writers of the commitlog (retention, truncation).
    ``failed``: the commitlog's sticky I/O error (CommitLog.failed), None while writable."""
    cdef public int64_t warm_mark
    cdef public object failed
    cdef PyThread_type_lock _lock
    cdef unsigned long holder       # the thread holding _lock (0: none), to refuse a re-entrant take
    cdef dict topics                    # topic -> _TopicState
    cdef bint stage_bulk
    cdef char *stage                    # put_columns' bulk runs (STAGE_BYTES, allocated on first use)
    cdef str last_topic                 # the topic _plan checked last, and its state
    cdef _TopicState last_state
    cdef object segments, check_topic, delay, warm, stamp
    cdef SegmentList published          # segments, for its C fields
    cdef MappedSegment seg              # the last segment, during a call
    cdef bytes store_host
    cdef int version
    cdef int32_t queue_nums
    cdef int64_t max_size
    cdef int64_t seg_size               # the segments' file size
    cdef bint rolled                    # _roll took a segment of published.premade: prepare_next due
    cdef object deferred                # what warm raised in the middle of a write, raised at its end

    def __cinit__(self, segments, bytes store_host not None, int version, int64_t max_size, int32_t queue_nums,
                  check_topic, delay, warm, stamp=None, bint stage_bulk=False):
        if queue_nums <= 0:
            raise InvalidArgumentError("queue_nums must be positive")
        if not isinstance(segments, SegmentList) or not (callable(check_topic) and callable(delay) and callable(warm)):
            raise InvalidArgumentTypeError("an Appender takes a segment queue and callable check_topic, delay, warm")
        self.segments = self.published = segments
        self.store_host = store_host
        self.version = version
        self.max_size = max_size
        self.seg_size = self.published.file_size
        self.queue_nums = queue_nums
        self.check_topic = check_topic
        self.delay = delay
        self.warm = warm
        self.stamp = stamp
        self.stage_bulk = stage_bulk
        self.topics = {}
        self.warm_mark = 0
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("cannot allocate the commitlog write lock")

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)
        free(self.stage)

    cdef inline int _acquire(self) except -1:
        """Take the write lock; ReentrantCallError if this thread holds it already (a put
        from a callback run under it: rebuild's progress, put_batch's iterable), which
        would wait for itself forever."""
        cdef unsigned long me = PyThread_get_thread_ident()
        if not PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            if self.holder == me:
                raise ReentrantCallError("the commitlog write lock is held by this thread: a write (or rebuild, "
                                         "clean_expired) from within one (its callback or iterable) would wait forever")
            with nogil:
                PyThread_acquire_lock(self._lock, WAIT_LOCK)
        self.holder = me
        return 0

    cdef inline int _release(self) except -1:
        """Release the write lock. Warm's error is still pending only when the write failed
        after it: a KeyboardInterrupt (or SystemExit) is raised then, the write's error its
        context, so the user's Ctrl-C is not lost; an ordinary error of warm only cost
        warmth and gives way to the write's."""
        cdef object e = self.deferred
        self.holder = 0
        self.deferred = None
        PyThread_release_lock(self._lock)
        if e is not None and not isinstance(e, Exception):
            raise e
        return 0

    def __enter__(self):
        self._acquire()
        return self

    def __exit__(self, *exc):
        self._release()

    def release_stage(self):
        """Free put_columns' bulk buffer now (at close: a closed store may wait for a
        collection to be freed); a later bulk batch allocates it again."""
        self._acquire()
        free(self.stage)
        self.stage = NULL
        self._release()

    @property
    def held_here(self):
        """Whether this thread holds the write lock (is inside a write, rebuild or clean)."""
        return self.holder == PyThread_get_thread_ident()

    @property
    def queue_offsets(self):
        """(topic, queue_id) -> next queue offset, as a new dict."""
        cdef _TopicState st
        return {(t, q): o for t, st in self.topics.items() for q, o in st.offsets().items()}

    @queue_offsets.setter
    def queue_offsets(self, table):
        cdef _TopicState st
        for st in self.topics.values():
            st.clear()
        for (t, q), o in table.items():
            self._state(t).set_next(q, o)

    cdef _TopicState _state(self, str topic):
        cdef _TopicState st = self.topics.get(topic)
        if st is None:
            st = self.topics[topic] = _TopicState()
        return st

    def put(self, msg, queue_id=None):
        """Append one message; returns its PutResult."""
        return self._put(msg, queue_id)

    cdef PutResult _put(self, object msg, object queue_id):
        cdef _Plan plan
        cdef PutResult res
        if not isinstance(msg, Message):
            raise InvalidArgumentTypeError(f"put takes a Message, not {type(msg).__name__}")
        if queue_id is not None:
            queue_id = queue_id_arg(queue_id)
        self._acquire()
        try:
            plan = self._plan(<Message>msg, queue_id)
            self.seg = self._last()
            res = self._write(plan, now_ms())
            if self.rolled or self.deferred is not None:
                self._finish()
            return res
        finally:
            self._release()

    def put_batch(self, msgs, queue_id=None):
        """Append every message of ``msgs`` with one store timestamp; list of PutResult.
        ``queue_id``: None (round robin), one queue id, or a list/tuple of one per message
        (each a queue id or None).
        All or nothing: every message is checked (type, topic, properties, size, queue id),
        and every segment it rolls into is created, before the first is written, so a bad
        message anywhere or a full disk stores none of them."""
        return self._put_batch(msgs, queue_id)

    cdef list _put_batch(self, object msgs, object queue_id):
        # an error checking message i names it: "put_batch message i: ...", .message_index i
        cdef list plans = [], out = [], qids = None
        cdef Py_ssize_t i = 0
        if isinstance(queue_id, (list, tuple)):
            qids = [queue_id_arg(q) for q in queue_id]
        else:
            queue_id = queue_id_arg(queue_id)
        it = None
        if not isinstance(msgs, (str, bytes, Message)):
            try:   # what iter() refuses (an int, a 0-d numpy array despite its __iter__) is no iterable
                it = iter(msgs)
            except TypeError:
                pass
        if it is None:
            raise InvalidArgumentTypeError(f"put_batch takes an iterable of Message, not {type(msgs).__name__}")
        self._acquire()
        try:
            for m in it:
                if not isinstance(m, Message):
                    raise batch_error(InvalidArgumentTypeError(f"{type(m).__name__} where a Message is due"), i)
                if qids is not None:
                    if i >= len(qids):
                        raise InvalidArgumentError(f"put_batch: more messages than the {len(qids)} queue ids")
                    queue_id = qids[i]
                try:
                    plans.append(self._plan(<Message>m, queue_id))
                except (InvalidArgumentError, InvalidTopicError, MessageTooLargeError) as e:
                    raise batch_error(e, i) from None
                i += 1
            if qids is not None and i != len(qids):
                raise InvalidArgumentError(f"put_batch: {i} messages for {len(qids)} queue ids")
            ts = now_ms()
            self.seg = self._last()
            self._make_room(np.array([(<_Plan>plan).size for plan in plans], np.int64))
            for plan in plans:
                out.append(self._write(plan, ts))
            if self.rolled or self.deferred is not None:
                self._finish()
            return out
        finally:
            self._release()

    def put_columns(self, list topics not None, topic_ids, body_data not None, body_offsets,
                    props_data=None, props_offsets=None, queue_ids=None, *, flag=None, sys_flag=None,
                    born_timestamp=None, reconsume_times=None, born_host_data=None, born_host_offsets=None):
        """Append ``n`` messages from columns, with no Python object per message: row i goes
        to ``topics[topic_ids[i]]`` (``topic_ids`` None: all to ``topics[0]``), its body is
        ``body_data[body_offsets[i]:body_offsets[i + 1]]`` (``body_offsets`` None: item i of
        the sequence ``body_data``, copied from where it is, see BodyRows) and its properties string
        (RocketMQ's ``name\\x01value\\x02...``, checked by the caller) likewise from
        ``props_data``/``props_offsets`` (None: none). ``queue_ids``: None (round robin per
        topic), an int, or ``n`` ints (-1: that row round robin). Optional ``n`` ints each
        (None: all 0): ``flag``, ``sys_flag`` (the host IPv6 bits are set from the hosts;
        PREPARED / ROLLBACK rows get queue offset 0, as put gives them),
        ``born_timestamp`` (ms; 0: the store time) and ``reconsume_times``. Born hosts
        packed (8 or 20 bytes) as a column like the bodies (None, or 0 bytes: the store
        host). One store timestamp, one lock; all or nothing: every size and queue id
        is checked, and every segment the batch rolls into is made, before the first record
        is written. The records are written with the GIL released, in runs that end where
        the segment ends or the warm mark is passed. Returns numpy arrays (phy_offset,
        size, queue_id, queue_offset) and the records' store timestamp."""
        cdef BodyRows bodies = BodyRows(body_data, body_offsets)
        cdef const unsigned char[::1] pd = props_data if props_data is not None else b""
        cdef Py_ssize_t n = bodies.n, i, j, nt = len(topics), tlen
        cdef const int64_t[::1] po
        cdef const int64_t[::1] flg = int_column(flag, n, -0x80000000, 0x7FFFFFFF, "flag")
        cdef const int64_t[::1] sfl = int_column(sys_flag, n, 0, 0x7FFFFFFF, "sys_flag")
        if n and np.bitwise_or.reduce(sfl) & ~WRITABLE_SYS_FLAG:
            i = np.flatnonzero(np.asarray(sfl) & ~WRITABLE_SYS_FLAG)[0]
            sys_flag_arg(sfl[i], f"row {i}'s sys_flag")
        cdef const int64_t[::1] bts = int_column(born_timestamp, n, 0, 0x7FFFFFFFFFFFFFFF, "born_timestamp")
        cdef const int64_t[::1] rct = int_column(reconsume_times, n, 0, 0x7FFFFFFF, "reconsume_times")
        cdef const unsigned char[::1] hd = born_host_data if born_host_data is not None else b"\0"
        cdef const int64_t[::1] ho = column_offsets(born_host_offsets, hd.shape[0], "born host") \
            if born_host_data is not None else zeros(n + 1)
        if ho.shape[0] != n + 1:
            raise InvalidArgumentError(f"{ho.shape[0] - 1} born hosts for {n} bodies")
        cdef const int64_t[::1] tids = int_column(topic_ids, n, 0, nt - 1, "topic_ids")
        cdef const char *store_p = PyBytes_AS_STRING(self.store_host)
        cdef int32_t hlen = <int32_t>len(self.store_host), born_len
        cdef int32_t host_bits = STORE_V6 if hlen == 20 else 0
        cdef int64_t fixed, plen, total, ts = 0, wpos, seg_size = self.seg_size, batch_bytes = 0
        cdef Rows r
        cdef list names = [], encoded = [], states = []
        cdef const int64_t[::1] slots
        cdef int64_t[::1] next_off
        next_a = None
        cdef int64_t[::1] tlens = np.empty(len(topics), np.int64)
        cdef _TopicState st
        cdef MappedSegment seg
        cdef RecordHead h
        sizes_a, phys_a = np.empty(n, np.int64), np.empty(n, np.int64)
        qids_a, qoffs_a = np.empty(n, np.int32), np.empty(n, np.int64)
        cdef int64_t[::1] sizes = sizes_a, phys = phys_a, qoffs = qoffs_a
        cdef int32_t[::1] qids = qids_a
        if props_data is None:
            po = zeros(n + 1)
        else:
            po = column_offsets(props_offsets, pd.shape[0], "properties")
            if po.shape[0] != n + 1:
                raise InvalidArgumentError(f"{po.shape[0] - 1} properties for {n} bodies")
        if nt == 0:
            raise InvalidArgumentError("put_columns needs a topic")
        for i, name in enumerate(topics):
            name = text_arg("topic", name)
            PyUnicode_AsUTF8AndSize(name, &tlen)
            if self.version == 1 and tlen > 255 or tlen > 32767:
                raise InvalidArgumentError(f"topic of {tlen} bytes does not fit message version {self.version}")
            names.append(name)
            encoded.append(name.encode())
            tlens[i] = tlen
        fixed = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + hlen + 4 + 8 + 4 + (1 if self.version == 1 else 2) + 2
        for i in range(n):
            plen = po[i + 1] - po[i]
            if plen > 32767:
                raise MessageTooLargeError(f"row {i}: properties of {plen} bytes exceed 32767")
            born_len = <int32_t>(ho[i + 1] - ho[i]) if ho[i + 1] > ho[i] else hlen
            if born_len != 8 and born_len != 20:
                raise InvalidArgumentError(f"row {i}: a born host packed in {born_len} bytes, not 8 or 20")
            total = fixed + born_len + tlens[tids[i]] + bodies.length(i) + plen
            if total > self.max_size or total + 8 > seg_size:
                raise MessageTooLargeError(f"row {i}: message of {total} bytes exceeds the limit "
                                           f"({min(self.max_size, seg_size - 8)} bytes)")
            sizes[i] = total
            batch_bytes += total
        if queue_ids is not None and not isinstance(queue_ids, int):
            qids_a[:] = int_column(queue_ids, n, -1, 0x7FFFFFFF, "queue_ids")
        else:
            qids_a[:] = -1 if queue_ids is None else queue_id_arg(queue_ids)
        self._acquire()
        try:
            for name in names:
                st = self.topics.get(name)
                if st is None or not st.checked:
                    self.check_topic(name)
                    st = self._state(name)
                    st.checked = True
                states.append(st)
            for i in range(n):
                if qids[i] < 0:
                    st = states[tids[i]]
                    qids[i] = st.next_qid
                    st.next_qid = (st.next_qid + 1) % self.queue_nums
            # every (topic, queue) the batch touches gets a slot; its next offset sits in a C array
            top = int(qids_a.max()) + 1 if n else 1
            tids_a = np.asarray(tids)
            if nt * top <= 1 << 16:   # few topics and queues: dense slots, no sort
                dense = tids_a * top + qids_a
                used = np.flatnonzero(np.bincount(dense, minlength=nt * top))
                keys_a = (used // top) << 32 | used % top
                slot_of = np.empty(nt * top, np.int64)
                slot_of[used] = np.arange(len(used))
                slots_v = slot_of[dense]
            else:
                keys_a, slots_v = np.unique(tids_a << 32 | qids_a, return_inverse=True)
                slots_v = slots_v.astype(np.int64)
            slots = slots_v
            next_a = np.array([(<_TopicState>states[k >> 32]).next_offset(k & 0xFFFFFFFF) for k in keys_a.tolist()],
                              np.int64)
            first_a = next_a.copy()
            next_off = next_a
            seg = self.seg = self._last()
            self._make_room(sizes_a)
            ts = now_ms()
            h.store_ts, h.prepared, h.version = ts, 0, self.version
            topic_ptrs = np.array([<size_t>PyBytes_AS_STRING(b) for b in encoded], np.uintp)
            r.body, r.body_len, r.body_base = bodies.ptr, bodies.len, bodies.base
            if bodies.ptr == NULL:
                r.body_off = &bodies.off[0]
            r.props, r.po = "", &po[0]
            if pd.shape[0]:
                r.props = <const char *>&pd[0]
            r.hosts, r.ho = <const char *>&hd[0], &ho[0]
            r.flg, r.sfl, r.bts, r.rct, r.tids = &flg[0], &sfl[0], &bts[0], &rct[0], &tids[0]
            r.qids, r.slots, r.sizes, r.next_off, r.qoffs, r.phys = &qids[0], &slots[0], &sizes[0], \
                &next_off[0], &qoffs[0], &phys[0]
            r.topic, r.tlen = <const char **><size_t>topic_ptrs.ctypes.data, &tlens[0]
            r.store_host, r.hlen, r.host_bits = store_p, hlen, host_bits
            i = 0
            while i < n:
                wpos = seg.wrote_pos
                if sizes[i] + 8 > seg.m.size - wpos:
                    if seg.m.size - wpos >= 8:
                        write_blank(seg.m.base + wpos, <int32_t>(seg.m.size - wpos))
                    seg.wrote_pos = seg.m.size
                    seg = self.seg = self._roll()
                    continue
                if seg.m.readonly or seg.closing or seg.unmapped:
                    raise StoreClosedError(f"{seg.path}: segment not writable")
                if batch_bytes >= NOGIL_BYTES and self.stage_bulk:
                    if self.stage == NULL:
                        self.stage = <char *>malloc(STAGE_BYTES)
                        if self.stage == NULL:
                            raise MemoryError()
                    try:
                        write_staged(&r, &h, i, n, self.stage, seg, &wpos, self.warm_mark, &j)
                    except OSError as e:
                        self.failed = e
                        raise
                elif batch_bytes >= NOGIL_BYTES:
                    with nogil:
                        j = write_run(&r, &h, i, n, seg.m.base + wpos, seg.base_offset, seg.m.size, &wpos,
                                      self.warm_mark)
                else:
                    j = write_run(&r, &h, i, n, seg.m.base + wpos, seg.base_offset, seg.m.size, &wpos, self.warm_mark)
                seg.wrote_pos = wpos
                seg.store_timestamp = ts
                if seg.base_offset + wpos >= self.warm_mark:
                    self._warm_now(seg)
                i = j
            if self.rolled or self.deferred is not None:
                self._finish()
        finally:
            if next_a is not None:   # the offsets taken, also by rows written before an error
                for k, first, nxt in zip(keys_a.tolist(), first_a.tolist(), next_a.tolist()):
                    if nxt != first:
                        (<_TopicState>states[k >> 32]).set_next(k & 0xFFFFFFFF, nxt)
            self._release()
        return phys_a, sizes_a, qids_a, qoffs_a, ts

    cdef _make_room(self, const int64_t[::1] sizes):
        """Before a batch writes anything, allocate the disk blocks that appending records of
        ``sizes`` will write: in the last segment, and in every segment it rolls into, which
        the segment queue creates now (the encoder's rule: a record and an 8-byte BLANK
        must fit, else BLANK and roll)."""
        cdef int64_t pos = self.seg.wrote_pos, seg_size = self.seg.m.size
        cdef Py_ssize_t i
        cdef list ends = []
        for i in range(sizes.shape[0]):
            if sizes[i] + 8 > seg_size - pos:
                ends.append(min(pos + 8, seg_size))   # the BLANK record
                pos = 0
            pos += sizes[i]
        ends.append(pos)
        ensure(self.seg, ends[0])
        if len(ends) > 1:
            self.segments.make_room(self.seg, ends[1:])

    cdef MappedSegment _roll(self):
        """The segment after the last, for a write under way. One that _make_room made is
        taken from ``premade`` and published here with no Python code run, so no signal
        handler runs either: its exception (KeyboardInterrupt) cannot stop a batch half
        written, nor a roll half done. Else the segment queue's roll()."""
        cdef SegmentList q = self.published
        cdef MappedSegment seg = None
        if q.premade:
            seg = q.premade.pop(q.last.base_offset + self.seg_size, None)
        if seg is None:
            return self.segments.roll()
        q.segments = q.segments + [seg]
        q.last = seg
        if q.flusher is not None:
            q.flusher.track(seg)
        self.rolled = True
        return seg

    cdef _warm_now(self, MappedSegment seg):
        """warm(seg) in the middle of a write: what it raises (a signal handler's
        KeyboardInterrupt, run in its Python code) waits for the write's end (_finish), so
        a batch is not left half written; only warmth is lost."""
        try:
            self.warm(seg)
        except BaseException as e:
            if self.deferred is None:
                self.deferred = e

    cdef _finish(self):
        """After a write that rolled into made segments or met an error in warm: the next
        segment starts in the background, and warm's error is raised."""
        cdef object e = self.deferred
        if self.rolled:
            self.rolled = False
            self.segments.prepare_next()
        if e is not None:
            self.deferred = None
            raise e

    cdef MappedSegment _last(self):
        cdef MappedSegment last = self.published.last
        return last if last is not None else self.segments.roll(0)

    cdef _Plan _plan(self, Message msg, object queue_id):
        """Check ``msg`` and decide where it goes (a _Plan). What is written is what was checked
        here, whatever another thread does to ``msg`` meanwhile. Raises before anything is
        written; only the round-robin position moves."""
        cdef str topic = text_arg("topic", msg.topic)
        cdef dict props
        cdef _TopicState st = self.last_state if topic is self.last_topic else self.topics.get(topic)
        cdef int32_t qid
        cdef _Plan plan
        cdef bint delayed = False
        if msg.properties is None:
            raise InvalidArgumentTypeError("message properties must be a dict, not None")
        if msg.sys_flag & ~WRITABLE_SYS_FLAG:   # one set through the field's descriptor, past Message's check
            sys_flag_arg(msg.sys_flag)
        if self.stamp is not None:
            self.stamp(msg)
        props = msg.properties
        if st is None or not st.checked:
            self.check_topic(topic)
            st = self._state(topic)
            st.checked = True
        self.last_topic, self.last_state = topic, st
        if queue_id is None:
            qid = st.next_qid
            st.next_qid = (qid + 1) % self.queue_nums
        else:
            qid = queue_id
        plan = _Plan.__new__(_Plan)
        plan.props = properties_bytes(props, &delayed)
        if delayed:
            topic, qid, props = self.delay(msg, topic, qid, props)
            st = self._state(topic)
            plan.props = properties_bytes(props)
        plan.msg, plan.topic, plan.queue_id, plan.state = msg, topic, qid, st
        plan.body = body = held_body(msg.body)
        plan.born = msg.born_host_packed
        plan.size = record_size(plan.born, topic, len(plan.props), self.store_host, self.version, self.max_size,
                                self.seg_size, len(body) if type(body) is bytes else (<memoryview>body).nbytes)
        return plan

    cdef PutResult _write(self, _Plan plan, int64_t ts):
        """Encode a planned message at the end of the log (rolling when the segment is full):
        the queue offset is taken here, PREPARED / ROLLBACK get 0 and do not advance it."""
        cdef Message msg = plan.msg
        cdef int32_t qid = plan.queue_id
        cdef _TopicState st = plan.state
        cdef bint counted = gets_cq_entry_c(msg.sys_flag)
        cdef int64_t qoff = st.next_offset(qid) if counted else 0
        cdef PutResult res
        res = encode(self.seg, msg, plan.body, plan.born, plan.topic, plan.props, qid, qoff, ts, self.store_host,
                     self.version, self.max_size, plan.size)
        if res is None:
            self.seg = self._roll()
            res = encode(self.seg, msg, plan.body, plan.born, plan.topic, plan.props, qid, qoff, ts, self.store_host,
                         self.version, self.max_size, plan.size)
        if counted:
            st.set_next(qid, qoff + 1)
        if res.phy_offset + res.size >= self.warm_mark:
            self._warm_now(self.seg)
        return res


cdef object batch_error(object e, Py_ssize_t i):
    """``e``, raised checking put_batch's message ``i``, as an error of its type naming it."""
    err = type(e)(f"put_batch message {i}: {e}")
    err.message_index = i
    return err


cdef class StoreWriter:
    """MessageStore.put and put_batch as one C call each: the store's operation gate, the
    writable check, the append and, in SYNC mode, the wait for the flush, with no Python
    frame between them (they were 0.7 of the 1.2 us a put cost).
    ``refuse()`` raises why the store takes no writes; it is called when the commitlog is
    read-only, the appender's ``failed`` (a failed flush) is set or ``flusher`` (the native
    one, None: read-only) met a failure. ``sync``: each call waits for the flusher to cover
    its records (SYNC mode), with the GIL released."""
    cdef Gate gate
    cdef Appender appender
    cdef Flusher flusher
    cdef object refuse
    cdef bint readonly, sync

    def __cinit__(self, Gate gate not None, Appender appender not None, bint readonly, Flusher flusher, bint sync,
                  refuse not None):
        self.gate = gate
        self.appender = appender
        self.readonly = readonly
        self.flusher = flusher
        self.sync = sync and flusher is not None
        self.refuse = refuse

    def put(self, msg=MISSING, queue_id=None, *more, **unknown):
        """MessageStore.put (see its documentation)."""
        if msg is MISSING or more or unknown:
            misfit("put", (msg, queue_id), more, unknown)
        return self._append(False, msg, queue_id)

    def put_batch(self, msgs=MISSING, queue_id=None, *more, **unknown):
        """MessageStore.put_batch (see its documentation)."""
        if msgs is MISSING or more or unknown:
            misfit("put_batch", (msgs, queue_id), more, unknown)
        return self._append(True, msgs, queue_id)

    cdef object _append(self, bint batch, object what, object queue_id):
        cdef PutResult last
        self.gate.enter()
        try:
            if self.readonly or self.appender.failed is not None or (self.flusher is not None and self.flusher.failed()):
                self.refuse()
            out = self.appender._put_batch(what, queue_id) if batch else self.appender._put(what, queue_id)
            if self.sync and (not batch or out):
                last = out[len(out) - 1] if batch else out
                self.flusher.wait_flushed(last.phy_offset + last.size)
            return out
        finally:
            self.gate.leave()
