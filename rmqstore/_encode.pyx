# cython: boundscheck=False, wraparound=False, cdivision=True
"""Commitlog records laid out in bytes: a Message encoded straight into the mapped last
segment (encode), and runs of put_columns' rows (write_run, or write_staged through a
buffer and pwrite). The properties string and record size are checked here too."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_Check
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from rmqstore._cext cimport rmq_crc32, rmq_ld32, rmq_st16, rmq_st32, rmq_st64
from rmqstore._copy cimport copy_short
from rmqstore._layout cimport *
from rmqstore._message cimport Message, PutResult, body_arg
from rmqstore._segment cimport MappedSegment, check, ensure, publish, write_at
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError, MessageTooLargeError, StoreClosedError

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
            publish(seg, seg.m.size)
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
    publish(seg, wpos + total)
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
