# cython: boundscheck=False, wraparound=False, cdivision=True
"""RocketMQ commitlog record codec: encode straight into a mapped segment, decode one
record into a MessageExt or a byte range into columns. Every length read from disk is
checked against what remains before it is used."""
cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.list cimport PyList_GET_SIZE
from cpython.buffer cimport PyObject_CheckBuffer, PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.string cimport memcmp, memcpy, memchr, memset
from libc.stdlib cimport malloc, free
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_acquire_lock, PyThread_release_lock, NOWAIT_LOCK, WAIT_LOCK)
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME
import numpy as np
cimport numpy as cnp
from rmqstore._cext cimport *
from rmqstore._segment cimport MappedSegment
from rmqstore.errors import (CorruptRecordError, InvalidArgumentError, InvalidArgumentTypeError, MessageNotFoundError,
                             MessageTooLargeError, StoreClosedError)
from rmqstore._cq import ENTRY_DTYPE

cnp.import_array()

cdef extern from *:
    void __builtin_prefetch(const void *p) nogil

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

MAGIC_V1 = -626843481
MAGIC_V2 = -626843477
BLANK_MAGIC = -875286124
cdef int32_t C_MAGIC_V1 = -626843481
cdef int32_t C_MAGIC_V2 = -626843477
cdef int32_t C_BLANK = -875286124

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
cdef int32_t BORN_V6 = 0x10, STORE_V6 = 0x20
TRANSACTION_TYPE_MASK = TRANSACTION_MASK

# Decoder status codes, translated to exceptions in one place (record_error).
cdef enum:
    REC_OK = 0
    REC_END = 1          # TOTALSIZE 0: end of written data
    REC_BLANK = 2        # BLANK end-of-file record
    REC_SHORT = -1       # fewer bytes left than the record claims / than a header needs
    REC_MAGIC = -2       # unknown MAGICCODE
    REC_SIZE = -3        # TOTALSIZE out of range
    REC_FIELDS = -4      # field lengths do not add up to TOTALSIZE
    REC_CRC = -5         # BODYCRC mismatch
    REC_NOSEG = 3        # no segment holds the offset (read path only)
    REC_PLACE = -6       # a valid record that says it is at another offset (read path only)

_REASONS = {REC_SHORT: "truncated record", REC_MAGIC: "bad magic code", REC_SIZE: "bad total size",
            REC_FIELDS: "field lengths do not add up to the total size", REC_CRC: "body CRC mismatch",
            REC_PLACE: "PHYSICALOFFSET field names another offset"}
STATUS_CRC = _REASONS[REC_CRC]          # scan statuses that name one bad record, which can be stepped over
STATUS_PLACE = _REASONS[REC_PLACE]

cdef int parse_record(const char *p, int64_t avail, bint check_crc, RecView *r) noexcept nogil:
    """Validate and index the record at p (avail bytes readable). Pure C, no allocation."""
    cdef int64_t pos
    cdef int64_t i
    if avail < 8:
        for i in range(avail):
            if p[i] != 0:
                return REC_SHORT
        return REC_END
    r.total = rmq_ld32(p)
    r.magic = rmq_ld32(p + 4)
    if r.total == 0:
        return REC_END
    if r.magic == C_BLANK:
        return REC_BLANK if 8 <= r.total <= avail else REC_SIZE
    if r.magic != C_MAGIC_V1 and r.magic != C_MAGIC_V2:
        return REC_MAGIC
    if r.total < 0 or r.total > avail:
        return REC_SIZE if r.total < 0 else REC_SHORT
    if r.total < 91:
        return REC_SIZE
    r.body_crc = rmq_ld32(p + 8)
    r.queue_id = rmq_ld32(p + 12)
    r.flag = rmq_ld32(p + 16)
    r.queue_offset = rmq_ld64(p + 20)
    r.phy_offset = rmq_ld64(p + 28)
    r.sys_flag = rmq_ld32(p + 36)
    r.born_ts = rmq_ld64(p + 40)
    r.born_off = 48
    r.born_len = 16 if r.sys_flag & BORN_V6 else 4
    pos = 48 + r.born_len + 4
    r.store_len = 16 if r.sys_flag & STORE_V6 else 4
    # fixed part up to BODYLEN: storeTs 8 + host + port 4 + reconsume 4 + prepared 8 + bodylen 4
    if pos + 8 + r.store_len + 4 + 4 + 8 + 4 > r.total:
        return REC_FIELDS
    r.store_ts = rmq_ld64(p + pos)
    r.store_off = <int32_t>(pos + 8)
    pos += 8 + r.store_len + 4
    r.reconsume = rmq_ld32(p + pos)
    r.prepared = rmq_ld64(p + pos + 4)
    r.body_len = rmq_ld32(p + pos + 12)
    pos += 16
    if r.body_len < 0 or r.body_len > r.total - pos:
        return REC_FIELDS
    r.body_off = <int32_t>pos
    pos += r.body_len
    if r.magic == C_MAGIC_V1:
        if pos + 1 > r.total:
            return REC_FIELDS
        r.topic_len = <uint8_t>p[pos]   # 0..255; RocketMQ 4.x writes at most 127
        pos += 1
    else:
        if pos + 2 > r.total:
            return REC_FIELDS
        r.topic_len = rmq_ld16(p + pos)
        pos += 2
    if r.topic_len < 0 or r.topic_len > r.total - pos:
        return REC_FIELDS
    r.topic_off = <int32_t>pos
    pos += r.topic_len
    if pos + 2 > r.total:
        return REC_FIELDS
    r.props_len = rmq_ld16(p + pos)
    pos += 2
    if r.props_len < 0 or pos + r.props_len != r.total:
        return REC_FIELDS
    r.props_off = <int32_t>pos
    if check_crc and r.body_crc != body_crc(p + r.body_off, r.body_len):
        return REC_CRC
    return REC_OK


cdef inline int32_t body_crc(const char *p, int64_t n) noexcept nogil:
    cdef unsigned long c = crc32(0, NULL, 0)
    while n > 0x40000000:
        c = crc32(c, <const unsigned char *>p, 0x40000000)
        p += 0x40000000
        n -= 0x40000000
    c = crc32(c, <const unsigned char *>p, <unsigned int>n)
    return <int32_t>(c & 0x7FFFFFFF)


cdef int32_t copy_crc(char *dst, const char *src, Py_ssize_t n) noexcept nogil:
    """Copy ``n`` bytes to ``dst`` and return BODYCRC of the bytes as they stand at ``dst``:
    one pass in cache-sized chunks, each checksummed right after its copy. The CRC so
    always matches what was stored, even if another thread changes ``src`` meanwhile."""
    cdef unsigned long c = crc32(0, NULL, 0)
    cdef Py_ssize_t k
    while n > 0:
        k = n if n < 32768 else 32768
        memcpy(dst, src, k)
        c = crc32(c, <const unsigned char *>dst, <unsigned int>k)
        dst += k
        src += k
        n -= k
    return <int32_t>(c & 0x7FFFFFFF)


def crc32_body(const unsigned char[:] data):
    """BODYCRC as RocketMQ computes it: zlib CRC-32 & 0x7FFFFFFF."""
    if data.shape[0] == 0:
        return 0
    return body_crc(<const char *>&data[0], data.shape[0])


def java_hash(s):
    """Java String.hashCode() of a str (or UTF-8 bytes), as a signed 32-bit int."""
    cdef Py_ssize_t n
    cdef const char *p
    if isinstance(s, str):
        p = PyUnicode_AsUTF8AndSize(s, &n)
    elif isinstance(s, bytes):
        p = PyBytes_AS_STRING(s)
        n = PyBytes_GET_SIZE(s)
    else:
        raise TypeError(f"java_hash takes str or bytes, not {type(s).__name__}")
    return rmq_java_hash(p, n)


cdef int record_error(int code, int64_t offset) except -1:
    raise CorruptRecordError(f"commitlog offset {offset}: {_REASONS.get(code, code)}", offset)


# ---------------------------------------------------------------------------- hosts

def pack_host(host):
    """'ip:port' / '[v6]:port' / (ip, port) -> address bytes + big-endian port (8 or 20 bytes)."""
    import ipaddress
    if isinstance(host, (tuple, list)):
        ip, port = host
    else:
        h = str(host).lstrip("/")
        ip, sep, port = h.rpartition(":")
        if not sep:
            raise InvalidArgumentError(f"host {host!r} is not 'ip:port'")
        ip = ip.strip("[]")
    try:
        addr = ipaddress.ip_address(ip)
        port = int(port)
    except ValueError as e:
        raise InvalidArgumentError(f"host {host!r}: {e}") from None
    if not 0 <= port <= 0x7FFFFFFF:
        raise InvalidArgumentError(f"host {host!r}: port out of range")
    return addr.packed + port.to_bytes(4, "big")


cdef str format_host(const char *p, int32_t alen):
    """Java InetSocketAddress style: a.b.c.d:port or [x:x:x:x:x:x:x:x]:port (no '::')."""
    cdef const uint8_t *u = <const uint8_t *>p
    cdef int32_t port = rmq_ld32(p + alen)
    if alen == 4:
        return f"{u[0]}.{u[1]}.{u[2]}.{u[3]}:{port}"
    parts = [format((u[2 * i] << 8) | u[2 * i + 1], "x") for i in range(8)]
    return f"[{':'.join(parts)}]:{port}"


cdef str make_msg_id(const char *host, int32_t alen, int64_t offset):
    cdef char buf[28]
    memcpy(buf, host, alen + 4)
    rmq_st64(buf + alen + 4, offset)
    return PyBytes_FromStringAndSize(buf, alen + 12).hex().upper()


def msg_id(bytes packed_store_host, int64_t offset):
    """msgId of the record at ``offset`` stored by ``packed_store_host`` (see pack_host)."""
    if len(packed_store_host) not in (8, 20):
        raise InvalidArgumentError("store host must be packed as 8 or 20 bytes")
    return make_msg_id(PyBytes_AS_STRING(packed_store_host), len(packed_store_host) - 4, offset)


def parse_msg_id(str msg_id):
    """msgId -> (packed store host, commitlog offset); raises InvalidArgumentError."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise InvalidArgumentError(f"msgId {msg_id!r} is not hexadecimal") from None
    if len(raw) not in (16, 28):
        raise InvalidArgumentError(f"msgId {msg_id!r} must be 32 or 56 hex digits")
    n = len(raw) - 8
    return raw[:n], int.from_bytes(raw[n:], "big", signed=True)


# ---------------------------------------------------------------------------- properties

cdef inline int32_t next_pair(const char *p, int32_t n, int32_t i, int32_t *k) noexcept nogil:
    """The end (next \\x02 or ``n``) of the name\\x01value pair starting at ``i``; ``k`` gets
    the position of its \\x01 (== the end when there is none)."""
    cdef int32_t j = i
    while j < n and p[j] != b'\x02':
        j += 1
    k[0] = i
    while k[0] < j and p[k[0]] != b'\x01':
        k[0] += 1
    return j


cdef dict parse_properties(const char *p, int32_t n):
    """RocketMQ string2messageProperties: name\\x01value pairs joined by \\x02; pairs with an
    empty name or value are dropped, a trailing separator is allowed."""
    cdef dict out = {}
    cdef int32_t i = 0, j, k
    while i < n:
        j = next_pair(p, n, i, &k)
        if k > i and k < j - 1:
            out[PyUnicode_DecodeUTF8(p + i, k - i, "replace")] = PyUnicode_DecodeUTF8(p + k + 1, j - k - 1, "replace")
        i = j + 1
    return out


cdef int find_property(const char *p, int32_t n, const char *name, int32_t nlen,
                       int32_t *voff, int32_t *vlen) noexcept nogil:
    """Find property ``name`` (last one wins, like a map); 1 when found with a non-empty value."""
    cdef int32_t i = 0, j, k
    cdef int found = 0
    while i < n:
        j = next_pair(p, n, i, &k)
        if k - i == nlen and k < j - 1 and memcmp(p + i, name, nlen) == 0:
            voff[0] = k + 1
            vlen[0] = j - k - 1
            found = 1
        i = j + 1
    return found


cdef inline int64_t tags_code_of(const char *props, int32_t plen) noexcept nogil:
    """Consume-queue tags code: Java hashCode of the TAGS property (0 when absent)."""
    cdef int32_t voff = 0, vlen = 0
    if find_property(props, plen, b"TAGS", 4, &voff, &vlen):
        return rmq_java_hash(props + voff, vlen)
    return 0


# ---------------------------------------------------------------------------- types

cpdef str text_arg(str name, object s):
    """``s`` if it is a str that encodes as UTF-8 (no lone surrogates), else InvalidArgumentError."""
    cdef Py_ssize_t n
    if not isinstance(s, str):
        raise InvalidArgumentTypeError(f"{name} must be str, not {type(s).__name__}")
    if type(s) is not str:
        s = str.__str__(s)
    try:
        PyUnicode_AsUTF8AndSize(s, &n)      # also caches the UTF-8 form the encoder uses
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{name} is not valid Unicode text ({e.reason} at {e.start})") from None
    return s


cdef object body_arg(object body):
    """``body`` if it is a bytes-like object (bytes, bytearray, memoryview, numpy bytes...)."""
    if isinstance(body, str) or not PyObject_CheckBuffer(body):
        raise InvalidArgumentTypeError(f"body must be bytes-like (bytes, bytearray, memoryview), "
                                       f"not {type(body).__name__}")
    return body


def int_arg(str name, object v, object lo, object hi):
    """``v`` as an int in [lo, hi]; bool, float and str are refused with InvalidArgumentError."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise InvalidArgumentTypeError(f"{name} must be an int, not {type(v).__name__}")
    v = v.__index__()
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{name} {v} out of range [{lo}, {hi}]")
    return v


cdef class Message:
    """A message to put. ``tags`` and ``keys`` live in ``properties`` as TAGS / KEYS,
    like RocketMQ's Message. ``sys_flag`` carries the transaction type and COMPRESSED."""
    cdef public str topic
    cdef public object body
    cdef public dict properties
    cdef public int32_t flag
    cdef public int32_t sys_flag
    cdef public int64_t born_timestamp
    cdef public bytes born_host_packed
    cdef public int32_t reconsume_times
    cdef public int64_t prepared_transaction_offset

    def __init__(self, topic, body=b"", tags=None, keys=None, properties=None, *, flag=0, sys_flag=0,
                 born_timestamp=0, born_host=None, reconsume_times=0, prepared_transaction_offset=0,
                 delay_level=None):
        cdef dict props = {}
        self.topic = text_arg("topic", topic)
        self.body = body_arg(body)
        if properties is not None:
            if not hasattr(properties, "items"):
                raise InvalidArgumentTypeError(f"properties must be a mapping of str to str, not "
                                               f"{type(properties).__name__}")
            for k, v in properties.items():
                props[text_arg("property name", k)] = None if v is None else text_arg(f"property {k!r}", v)
        if tags is not None:
            props["TAGS"] = text_arg("tags", tags)
        if keys is not None:
            if isinstance(keys, (bytes, bytearray)) or not hasattr(keys, "__iter__"):
                raise InvalidArgumentTypeError(f"keys must be a str or a sequence of str, not {type(keys).__name__}")
            props["KEYS"] = text_arg("keys", keys) if isinstance(keys, str) else \
                " ".join([text_arg("key", k) for k in keys])
        if delay_level is not None and int_arg("delay_level", delay_level, 0, 0x7FFFFFFF):
            props["DELAY"] = str(int(delay_level))
        self.properties = props
        self.flag = int_arg("flag", flag, -0x80000000, 0x7FFFFFFF)
        self.sys_flag = int_arg("sys_flag", sys_flag, 0, 0x7FFFFFFF)
        self.born_timestamp = int_arg("born_timestamp", born_timestamp, 0, 0x7FFFFFFFFFFFFFFF)
        self.born_host_packed = pack_host(born_host) if born_host is not None else None
        self.reconsume_times = int_arg("reconsume_times", reconsume_times, 0, 0x7FFFFFFF)
        self.prepared_transaction_offset = int_arg("prepared_transaction_offset", prepared_transaction_offset,
                                                   0, 0x7FFFFFFFFFFFFFFF)

    @property
    def tags(self):
        return self.properties.get("TAGS")

    @property
    def keys(self):
        return self.properties.get("KEYS", "").split()

    def __repr__(self):
        return f"Message(topic={self.topic!r}, body={len(self.body)} bytes, properties={self.properties!r})"


@cython.no_gc
cdef class PutResult:
    """Where a put landed: commitlog offset and size, queue id/offset, store time."""
    cdef readonly int64_t phy_offset
    cdef readonly int32_t size
    cdef readonly str topic
    cdef readonly int32_t queue_id
    cdef readonly int64_t queue_offset
    cdef readonly int64_t store_timestamp
    cdef bytes store_host

    def __init__(self, *args, **kwargs):
        raise InvalidArgumentTypeError("PutResult comes from put(); it is not built directly")

    @property
    def msg_id(self):
        return make_msg_id(PyBytes_AS_STRING(self.store_host), PyBytes_GET_SIZE(self.store_host) - 4, self.phy_offset)

    def __repr__(self):
        return (f"PutResult(msg_id={self.msg_id!r}, phy_offset={self.phy_offset}, size={self.size}, "
                f"topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset})")


@cython.no_gc
cdef class MessageExt:
    """A stored message, decoded from its record. Numeric fields are parsed eagerly;
    topic, body and properties are decoded from the record bytes on first access. Not
    GC-tracked (batch reads build many): it refers only to bytes, str and its properties
    dict, so it cannot be part of a cycle unless stored into that dict."""

    def __init__(self, *args, **kwargs):
        raise InvalidArgumentTypeError("MessageExt comes from the store's reads; it is not built directly")

    @property
    def phy_offset(self): return self.r.phy_offset
    @property
    def commitlog_offset(self): return self.r.phy_offset
    @property
    def store_size(self): return self.r.total
    @property
    def magic(self): return self.r.magic
    @property
    def version(self): return 1 if self.r.magic == C_MAGIC_V1 else 2
    @property
    def body_crc(self): return self.r.body_crc
    @property
    def queue_id(self): return self.r.queue_id
    @property
    def flag(self): return self.r.flag
    @property
    def queue_offset(self): return self.r.queue_offset
    @property
    def sys_flag(self): return self.r.sys_flag
    @property
    def born_timestamp(self): return self.r.born_ts
    @property
    def store_timestamp(self): return self.r.store_ts
    @property
    def reconsume_times(self): return self.r.reconsume
    @property
    def prepared_transaction_offset(self): return self.r.prepared
    @property
    def transaction_type(self): return self.r.sys_flag & TRANSACTION_MASK

    @property
    def born_host(self):
        return format_host(PyBytes_AS_STRING(self._raw) + self.r.born_off, self.r.born_len)

    @property
    def store_host(self):
        return format_host(PyBytes_AS_STRING(self._raw) + self.r.store_off, self.r.store_len)

    @property
    def store_host_packed(self):
        return self._raw[self.r.store_off:self.r.store_off + self.r.store_len + 4]

    @property
    def msg_id(self):
        return make_msg_id(PyBytes_AS_STRING(self._raw) + self.r.store_off, self.r.store_len, self.r.phy_offset)

    @property
    def topic(self):
        if self._topic is None:
            self._topic = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(self._raw) + self.r.topic_off, self.r.topic_len, "replace")
        return self._topic

    @property
    def body(self):
        if self._body is None:
            self._body = self._raw[self.r.body_off:self.r.body_off + self.r.body_len]
        return self._body

    @property
    def properties(self):
        if self._props is None:
            self._props = parse_properties(PyBytes_AS_STRING(self._raw) + self.r.props_off, self.r.props_len)
        return self._props

    @property
    def properties_raw(self):
        return self._raw[self.r.props_off:self.r.props_off + self.r.props_len]

    @property
    def tags(self): return self.properties.get("TAGS")
    @property
    def keys(self): return self.properties.get("KEYS", "").split()
    @property
    def uniq_key(self): return self.properties.get("UNIQ_KEY")
    @property
    def tags_code(self):
        return tags_code_of(PyBytes_AS_STRING(self._raw) + self.r.props_off, self.r.props_len)

    def raw(self):
        """The whole record as stored."""
        return self._raw

    def __repr__(self):
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"phy_offset={self.phy_offset}, size={self.store_size}, msg_id={self.msg_id!r})")


cdef MessageExt build_ext(const char *p, RecView *r, int64_t store_offset):
    cdef MessageExt m = MessageExt.__new__(MessageExt)
    m._raw = PyBytes_FromStringAndSize(p, r.total)
    m.r = r[0]
    m.store_offset = store_offset
    return m


# ---------------------------------------------------------------------------- decode

def decode_record(MappedSegment seg, int64_t pos, int64_t limit, bint check_crc=False):
    """Decode the record at file position ``pos`` of ``seg``, reading no further than
    ``limit`` (the published write position). Returns a MessageExt, or a tuple
    ("blank"|"end", size) at a BLANK record / end of data; raises CorruptRecordError."""
    cdef RecView r
    cdef int code
    if seg.closing or seg.unmapped:
        raise StoreClosedError(f"{seg.path}: segment is closed")
    if pos < 0 or pos > seg.m.size:
        raise InvalidArgumentError(f"{seg.path}: position {pos} outside 0..{seg.m.size}")
    code = parse_at(seg.m.base, seg.m.size, limit, pos, check_crc, &r)
    if code == REC_OK:
        return build_ext(seg.m.base + pos, &r, seg.base_offset + pos)
    if code == REC_END:
        return ("end", 0)
    if code == REC_BLANK:
        return ("blank", r.total)
    record_error(code, seg.base_offset + pos)


cdef inline int parse_at(const char *base, int64_t size, int64_t limit, int64_t pos, bint check_crc,
                         RecView *r) noexcept nogil:
    """parse_record at ``pos`` of a mapping of ``size`` bytes published up to ``limit``."""
    if limit > size:
        limit = size
    if pos >= limit:   # past the published data: nothing is stored there (yet)
        return REC_END
    return parse_record(base + pos, limit - pos, check_crc, r)


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


cdef int record_at(list segs, int64_t offset, bint check_crc, RecView *r, const char **p) except -100:
    """Parse the record starting at commitlog ``offset`` in ``segs`` (a snapshot of the
    segment list, ascending): REC_OK with ``*p`` at it; REC_NOSEG, REC_END or REC_BLANK
    when no message starts there; a negative REC_* when it is invalid (REC_PLACE: it says
    it is elsewhere). A closed segment raises StoreClosedError. ``*p`` stays valid while
    the caller holds the GIL (unmapping needs it)."""
    cdef Py_ssize_t i = seg_index(segs, offset)
    cdef MappedSegment seg
    cdef int code
    if offset < 0 or i < 0:
        return REC_NOSEG
    seg = <MappedSegment>segs[i]
    if seg.closing or seg.unmapped:
        raise StoreClosedError(f"{seg.path}: segment is closed")
    if offset - seg.base_offset >= seg.m.size:
        return REC_NOSEG
    code = parse_at(seg.m.base, seg.m.size, seg.wrote_pos, offset - seg.base_offset, check_crc, r)
    if code == REC_OK:
        if r.phy_offset != offset:
            return REC_PLACE
        p[0] = seg.m.base + (offset - seg.base_offset)
    return code


cdef void prefetch_at(list segs, int64_t offset) noexcept:
    """Start loading the first 256 bytes of the record at commitlog ``offset`` into cache
    (GIL held; nothing is read), so that a later record_at does not wait for memory."""
    cdef Py_ssize_t i = seg_index(segs, offset)
    cdef MappedSegment seg
    cdef int64_t pos, k
    if offset < 0 or i < 0:
        return
    seg = <MappedSegment>segs[i]
    pos = offset - seg.base_offset
    if seg.closing or seg.unmapped or pos + 256 > seg.wrote_pos or pos + 256 > seg.m.size:
        return
    for k in range(0, 256, 64):
        __builtin_prefetch(seg.m.base + pos + k)


cdef str read_error_text(int code, int64_t offset, RecView *r):
    if code == REC_NOSEG:
        return f"no commitlog segment holds offset {offset}"
    if code == REC_END or code == REC_BLANK:
        return f"no message at commitlog offset {offset} ({'end' if code == REC_END else 'blank'})"
    if code == REC_PLACE:
        return f"commitlog offset {offset}: record says it is at {r.phy_offset}"
    return f"commitlog offset {offset}: {_REASONS.get(code, code)}"


cdef int raise_read_error(int code, int64_t offset, RecView *r) except -1:
    """The one translator of record_at statuses: MessageNotFoundError or CorruptRecordError."""
    if code > 0:
        raise MessageNotFoundError(read_error_text(code, offset, r))
    raise CorruptRecordError(read_error_text(code, offset, r), offset)


def get_message(list segs, offset, bint check_crc=False):
    """The MessageExt whose record starts at commitlog ``offset`` in ``segs`` (a segment
    list snapshot); MessageNotFoundError when none does, CorruptRecordError when invalid."""
    cdef RecView r
    cdef const char *p = NULL
    cdef int64_t off
    cdef int code
    try:
        off = offset
    except OverflowError:
        raise MessageNotFoundError(f"no commitlog segment holds offset {offset}") from None
    code = record_at(segs, off, check_crc, &r, &p)
    if code != REC_OK:
        raise_read_error(code, off, &r)
    return build_ext(p, &r, off)


cdef inline int64_t ld_native_i64(const char *p) noexcept nogil:
    cdef int64_t v
    memcpy(&v, p, 8)
    return v


cdef inline int32_t ld_i32(const char *p) noexcept nogil:
    cdef int32_t v
    memcpy(&v, p, 4)
    return v


cdef int32_t HOLE = 0x7FFFFFFF


cdef int check_entries(cnp.ndarray entries) except -1:
    if entries.dtype != ENTRY_DTYPE or entries.ndim != 1:
        raise InvalidArgumentError("entries must be a 1-d array of consume-queue ENTRY_DTYPE")
    return 0


def gather_messages(list segs, cnp.ndarray entries, Py_ssize_t max_count, Py_ssize_t max_msgs,
                    int64_t max_bytes, int64_t cl_max, int64_t file_size, codes, tags):
    """RocketMQ getMessage's loop over consume-queue ``entries`` (ENTRY_DTYPE, queue order)
    reading ``segs`` (a commitlog segment list snapshot, files of ``file_size``): hole
    entries are skipped; an entry must pass the tags-code filter ``codes`` (a set, None for
    all), point inside ``cl_max``, lead to a record of its size at its offset and, when
    ``tags`` (a set of str) is given, that record's TAGS must be one of them. Stops before
    the entry that would pass ``max_count`` / ``max_msgs`` messages or ``max_bytes``; after
    a record that is gone, skips the rest of its commitlog file.

    Returns (messages, entries consumed, removing, problems): ``removing`` when a record
    was gone before any message was found; problems are (entry index, phy, size, text to
    log or None). Runs with the GIL held: a call reads a bounded run of one CQ file and
    builds an object per message, and the mappings cannot go away meanwhile."""
    cdef RecView r
    cdef const char *p = NULL
    cdef const char *row
    cdef Py_ssize_t n, k, used = 0, nmsg = 0
    cdef Py_ssize_t stride
    cdef int64_t phy, tc, total = 0, skip_below = 0
    cdef int32_t size, voff = 0, vlen = 0
    cdef int code
    cdef bint skipping = False, removing = False
    cdef list msgs = [], problems = []
    check_entries(entries)
    n = entries.shape[0]
    stride = entries.strides[0]
    row = <const char *>cnp.PyArray_DATA(entries)
    for k in range(n):
        phy = ld_native_i64(row + k * stride)
        size = ld_i32(row + k * stride + 8)
        if skipping and phy < skip_below:
            used += 1
            continue
        if nmsg and (nmsg >= max_count or total + size > max_bytes or nmsg > max_msgs - 1):
            break
        used += 1
        if size == HOLE:
            continue
        if codes is not None:
            tc = ld_native_i64(row + k * stride + 12)
            if tc not in codes:
                continue
        if phy < 0 or size <= 0 or phy + size > cl_max:
            problems.append((k, phy, size, f"CQ entry ({phy}, {size}) points outside the commitlog"))
            continue
        code = record_at(segs, phy, False, &r, &p)
        if code > 0:
            removing |= not nmsg
            skipping = True
            skip_below = phy + file_size - phy % file_size
            continue
        if code < 0:
            problems.append((k, phy, size, read_error_text(code, phy, &r)))
            continue
        if r.total != size:
            problems.append((k, phy, size, None))
            continue
        if tags is not None and not (find_property(p + r.props_off, r.props_len, b"TAGS", 4, &voff, &vlen)
                                     and PyUnicode_DecodeUTF8(p + r.props_off + voff, vlen, "replace") in tags):
            continue
        msgs.append(build_ext(p, &r, phy))
        total += size
        nmsg += 1
        skipping = False
    return msgs, used, removing, problems


def decode_bytes(const unsigned char[:] data, int64_t offset=0, bint check_crc=False):
    """Decode the record at the start of ``data`` (read from commitlog ``offset``)."""
    cdef RecView r
    cdef bytes b = bytes(data)
    cdef int code = parse_record(PyBytes_AS_STRING(b), len(b), check_crc, &r)
    if code == REC_OK:
        return build_ext(PyBytes_AS_STRING(b), &r, offset)
    if code in (REC_END, REC_BLANK):
        raise CorruptRecordError(f"commitlog offset {offset}: no message here", offset)
    record_error(code, offset)


def scan_segment(MappedSegment seg, int64_t pos, int64_t limit, bint check_crc, bint check_place=False):
    """Walk records from ``pos`` with the GIL released. Returns (end_pos, count, status)
    where status is "end" (zero TOTALSIZE / limit), "blank" (BLANK record: end_pos is the
    file end) or the reason the record at end_pos is invalid. ``check_place`` also stops at
    a record whose PHYSICALOFFSET field is not where it lies (verify; recovery, like
    RocketMQ's, does not look at that field)."""
    cdef RecView r
    cdef int code = REC_END
    cdef int64_t count = 0, base_offset = seg.base_offset
    cdef const char *base
    if limit > seg.m.size:
        limit = seg.m.size
    seg.check_range(pos, limit - pos)
    seg.hold()
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
            if pos >= limit and code == REC_OK:
                code = REC_END
    finally:
        seg.release()
    if code == REC_BLANK:
        return (pos + r.total, count, "blank")
    if code == REC_END:
        return (pos, count, "end")
    return (pos, count, _REASONS[code])


DISPATCH_DTYPE = np.dtype([("phy_offset", "<i8"), ("size", "<i4"), ("queue_id", "<i4"),
                           ("queue_offset", "<i8"), ("sys_flag", "<i4"), ("tags_code", "<i8"),
                           ("store_timestamp", "<i8"), ("topic_off", "<i4"), ("topic_len", "<i4"),
                           ("props_off", "<i4"), ("props_len", "<i4")], align=False)


def scan_dispatch(MappedSegment seg, int64_t pos, int64_t limit, int64_t max_records=1 << 30):
    """Index the records in ``[pos, limit)`` for dispatch with the GIL released.

    Returns (rows of DISPATCH_DTYPE, raw bytes of the records read, end_pos, status):
    topic/props positions are relative to ``raw``; status is "end", "blank" (end_pos is
    then the file end) or why the record at end_pos is invalid."""
    cdef RecView r
    cdef int code = REC_END
    cdef int64_t n = 0, start = pos, end = pos
    if limit > seg.m.size:
        limit = seg.m.size
    seg.check_range(pos, limit - pos)
    seg.hold()
    try:
        with nogil:
            while end < limit and n < max_records:
                code = parse_record(seg.m.base + end, limit - end, False, &r)
                if code != REC_OK:
                    break
                end += r.total
                n += 1
                code = REC_END
        rows = np.empty(n, DISPATCH_DTYPE)
        _dispatch_fill(seg.m.base + start, limit - start, n, rows, seg.base_offset + start)
        raw = PyBytes_FromStringAndSize(seg.m.base + start, end - start)
        if code == REC_BLANK:
            return rows, raw, end + r.total, "blank"
    finally:
        seg.release()
    return rows, raw, end, "end" if code == REC_END else _REASONS[code]


cdef void _dispatch_fill(const char *base, int64_t avail, int64_t n, cnp.ndarray rows, int64_t phy) noexcept:
    """Fill ``n`` rows from records already validated by the caller's first pass."""
    cdef RecView r
    cdef int64_t i, pos = 0
    cdef char *row = <char *>cnp.PyArray_DATA(rows)
    cdef const char *p
    with nogil:
        for i in range(n):
            p = base + pos
            parse_record(p, avail - pos, False, &r)
            (<int64_t *>row)[0] = phy + pos
            (<int32_t *>(row + 8))[0] = r.total
            (<int32_t *>(row + 12))[0] = r.queue_id
            (<int64_t *>(row + 16))[0] = r.queue_offset
            (<int32_t *>(row + 24))[0] = r.sys_flag
            (<int64_t *>(row + 28))[0] = tags_code_of(p + r.props_off, r.props_len)
            (<int64_t *>(row + 36))[0] = r.store_ts
            (<int32_t *>(row + 44))[0] = <int32_t>(pos + r.topic_off)
            (<int32_t *>(row + 48))[0] = r.topic_len
            (<int32_t *>(row + 52))[0] = <int32_t>(pos + r.props_off)
            (<int32_t *>(row + 56))[0] = r.props_len
            pos += r.total
            row += 60


BATCH_FIELDS = ("phy_offset", "store_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
                "sys_flag", "born_timestamp", "store_timestamp", "reconsume_times",
                "prepared_transaction_offset", "tags_code", "born_port", "store_port")


def decode_batch(MappedSegment seg, int64_t pos, int64_t limit, bint check_crc=False, bint skip_corrupt=False):
    """Decode every record in ``[pos, limit)`` of ``seg`` into columns (dict of numpy arrays).

    Variable-length fields come Arrow-style: ``body_data`` (uint8, all bodies back to back)
    with ``body_offsets`` (int64, n+1), and likewise ``topic_*`` and ``props_*``; hosts as
    ``born_addr`` / ``store_addr`` (uint8 [n,16], IPv4 in the first 4 bytes; the sys_flag
    bits say which) with ``*_port``. Bodies are copied exactly once. Stops at end of data or
    a BLANK record. A corrupt record raises CorruptRecordError, or with ``skip_corrupt`` ends
    the batch with ``corrupt_at`` set to its commitlog offset (else -1). ``end_pos`` is the
    file position where decoding stopped; ``stop`` says why."""
    cdef RecView r
    cdef int code = REC_END
    cdef int64_t n = 0, p = pos, body_total = 0, topic_total = 0, props_total = 0
    if limit > seg.m.size:
        limit = seg.m.size
    seg.check_range(pos, limit - pos)
    seg.hold()
    try:
        with nogil:
            while p < limit:
                code = parse_record(seg.m.base + p, limit - p, check_crc, &r)
                if code != REC_OK:
                    break
                n += 1
                body_total += r.body_len
                topic_total += r.topic_len
                props_total += r.props_len
                p += r.total
                code = REC_END
        if code < 0 and not skip_corrupt:
            record_error(code, seg.base_offset + p)
        out = new_columns(n, body_total, topic_total, props_total)
        _fill_batch(seg.m.base + pos, limit - pos, n, out)
        if code == REC_BLANK:
            p += r.total
    finally:
        seg.release()
    out["count"] = n
    out["end_pos"] = p
    out["corrupt_at"] = seg.base_offset + p if code < 0 else -1
    out["stop"] = "blank" if code == REC_BLANK else ("end" if code == REC_END else _REASONS[code])
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
    c.f[0][i] = r.phy_offset
    c.f[1][i] = r.total
    c.f[2][i] = r.magic
    c.f[3][i] = r.body_crc
    c.f[4][i] = r.queue_id
    c.f[5][i] = r.flag
    c.f[6][i] = r.queue_offset
    c.f[7][i] = r.sys_flag
    c.f[8][i] = r.born_ts
    c.f[9][i] = r.store_ts
    c.f[10][i] = r.reconsume
    c.f[11][i] = r.prepared
    c.f[12][i] = tags_code_of(p + r.props_off, r.props_len)
    c.f[13][i] = rmq_ld32(p + r.born_off + r.born_len)
    c.f[14][i] = rmq_ld32(p + r.store_off + r.store_len)
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


cdef void _fill_batch(const char *base, int64_t avail, int64_t n, dict out) except *:
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
    cdef int64_t pos, k
    if i < 0 or size <= 0:
        return
    pos = offset - refs[i].base_offset
    if pos + size > refs[i].limit:
        return
    k = 0
    while k < size and k < 512:
        __builtin_prefetch(refs[i].base + pos + k)
        k += 64


def decode_entries(list log, cnp.ndarray entries, bint check_crc=False):
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
    cdef int64_t phy, lo = 0x7FFFFFFFFFFFFFFF, hi = -1, nok = 0, rows = 0, nbytes = 0
    cdef int32_t size
    cdef RecView r
    cdef Cols c
    cdef MappedSegment seg
    check_entries(entries)
    n = entries.shape[0]
    stride = entries.strides[0]
    row = <const char *>cnp.PyArray_DATA(entries)
    for k in range(n):
        phy = ld_native_i64(row + k * stride)
        size = ld_i32(row + k * stride + 8)
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
            seg.hold()
            refs[nref].base_offset = seg.base_offset
            refs[nref].base = seg.m.base
            refs[nref].size = seg.m.size
            refs[nref].limit = seg.wrote_pos
            nref += 1
        with nogil:
            for k in range(n):
                if k + PREFETCH < n:
                    prefetch_record(refs, nref, ld_native_i64(row + (k + PREFETCH) * stride),
                                    ld_i32(row + (k + PREFETCH) * stride + 8))
                size = ld_i32(row + k * stride + 8)
                if size == HOLE:
                    continue
                p = seg_ref_find(refs, nref, ld_native_i64(row + k * stride), &r, check_crc, size)
                if p == NULL:
                    miss[nmiss] = k
                    nmiss += 1
                else:
                    fill_row(&c, nok, p, &r)
                    nok += 1
    finally:
        for j in range(i0, i0 + nref):
            (<MappedSegment>log[j]).release()
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


# ---------------------------------------------------------------------------- encode

cdef Py_ssize_t props_length(dict props) except -1:
    """Bytes of the properties string (4.9 layout: no trailing separator); validates it."""
    cdef Py_ssize_t total = 0, kl, vl
    cdef const char *kp
    cdef const char *vp
    for k, v in props.items():
        if v is None:
            continue
        if type(k) is not str or type(v) is not str:
            raise InvalidArgumentError(f"property {k!r}: names and values must be str")
        try:
            kp = PyUnicode_AsUTF8AndSize(k, &kl)
            vp = PyUnicode_AsUTF8AndSize(v, &vl)
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"property {k!r}: not valid Unicode text (a lone surrogate?)") from None
        if kl == 0 or memchr(kp, 1, kl) or memchr(kp, 2, kl) or memchr(vp, 1, vl) or memchr(vp, 2, vl):
            raise InvalidArgumentError(f"property {k!r}: empty name or a \\x01/\\x02 separator inside")
        total += kl + vl + 2
    return total - 1 if total else 0


cdef void write_properties(char *out, dict props) noexcept:
    cdef Py_ssize_t kl, vl
    cdef const char *kp
    cdef const char *vp
    cdef bint first = True
    for k, v in props.items():
        if v is None:
            continue
        kp = PyUnicode_AsUTF8AndSize(k, &kl)
        vp = PyUnicode_AsUTF8AndSize(v, &vl)
        if not first:
            out[0] = 2
            out += 1
        first = False
        memcpy(out, kp, kl)
        out[kl] = 1
        memcpy(out + kl + 1, vp, vl)
        out += kl + 1 + vl


cdef int64_t record_size(Message msg, str topic, dict props, bytes store_host, int version, int64_t max_size,
                         int64_t seg_size, Py_ssize_t blen) except -1:
    """Bytes of the record ``msg`` makes with this effective topic and properties, after
    checking everything the encoder would refuse (hosts, topic and properties lengths, the
    size limits), so a batch can be checked whole before any of it is written."""
    cdef Py_ssize_t tlen, plen
    cdef bytes born = msg.born_host_packed if msg.born_host_packed is not None else store_host
    cdef int32_t born_alen = len(born) - 4, store_alen = len(store_host) - 4
    cdef int64_t total
    PyUnicode_AsUTF8AndSize(topic, &tlen)
    if (born_alen != 4 and born_alen != 16) or (store_alen != 4 and store_alen != 16):
        raise InvalidArgumentError("hosts must be packed as 8 or 20 bytes")
    if version == 1 and tlen > 255 or tlen > 32767:
        raise InvalidArgumentError(f"topic of {tlen} bytes does not fit message version {version}")
    plen = props_length(props)
    if plen > 32767:
        raise MessageTooLargeError(f"properties of {plen} bytes exceed 32767")
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born_alen + 4 + 8 + store_alen + 4 + 4 + 8 \
        + 4 + blen + (1 if version == 1 else 2) + tlen + 2 + plen
    if total > max_size or total + 8 > seg_size:
        raise MessageTooLargeError(f"message of {total} bytes exceeds the limit ({min(max_size, seg_size - 8)} bytes)")
    return total


cdef Py_ssize_t body_length(object body) except -1:
    cdef Py_buffer view
    if PyBytes_CheckExact(body):
        return PyBytes_GET_SIZE(body)
    body_arg(body)
    try:
        PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    except (BufferError, ValueError, TypeError) as e:   # e.g. a strided memoryview or array
        raise InvalidArgumentTypeError(f"body must be one contiguous run of bytes: {e}") from None
    PyBuffer_Release(&view)
    return view.len


cdef PutResult encode(MappedSegment seg, Message msg, str topic, dict props, int32_t queue_id,
                      int64_t queue_offset, int64_t store_ts, bytes store_host, int version,
                      int64_t max_size):
    """Encode ``msg`` (with the given effective topic, properties and queue) at the segment's
    write position. Returns a PutResult, or None when the record does not fit: then the
    BLANK end-of-file record has been written and the caller rolls to a new segment."""
    cdef Py_ssize_t tlen, blen
    cdef const char *tp = PyUnicode_AsUTF8AndSize(topic, &tlen)
    cdef const char *bp
    cdef Py_buffer view
    cdef bint have_view = False
    cdef bytes born = msg.born_host_packed if msg.born_host_packed is not None else store_host
    cdef int32_t born_alen = len(born) - 4, store_alen = len(store_host) - 4
    cdef int32_t sys_flag, crc
    cdef int64_t total, room, wpos
    cdef char *p
    cdef PutResult res
    if seg.m.readonly or seg.closing or seg.unmapped:
        raise StoreClosedError(f"{seg.path}: segment not writable")
    if PyBytes_CheckExact(msg.body):
        bp = PyBytes_AS_STRING(msg.body)
        blen = PyBytes_GET_SIZE(msg.body)
    else:
        PyObject_GetBuffer(body_arg(msg.body), &view, PyBUF_SIMPLE)
        have_view = True
        bp = <const char *>view.buf
        blen = view.len
    try:
        total = record_size(msg, topic, props, store_host, version, max_size, seg.m.size, blen)
        wpos = seg.wrote_pos
        room = seg.m.size - wpos
        p = seg.m.base + wpos
        if total + 8 > room:
            if room >= 8:   # a full segment (room 0) already ends with its BLANK record
                rmq_st32(p, <int32_t>room)
                rmq_st32(p + 4, C_BLANK)
            seg.wrote_pos = seg.m.size
            return None
        sys_flag = (msg.sys_flag & ~(BORN_V6 | STORE_V6)) | (BORN_V6 if born_alen == 16 else 0) \
            | (STORE_V6 if store_alen == 16 else 0)
        rmq_st32(p, <int32_t>total)
        rmq_st32(p + 4, C_MAGIC_V1 if version == 1 else C_MAGIC_V2)
        rmq_st32(p + 12, queue_id)
        rmq_st32(p + 16, msg.flag)
        rmq_st64(p + 20, queue_offset)
        rmq_st64(p + 28, seg.base_offset + wpos)
        rmq_st32(p + 36, sys_flag)
        rmq_st64(p + 40, msg.born_timestamp if msg.born_timestamp else store_ts)
        p += 48
        memcpy(p, PyBytes_AS_STRING(born), born_alen + 4)
        p += born_alen + 4
        rmq_st64(p, store_ts)
        memcpy(p + 8, PyBytes_AS_STRING(store_host), store_alen + 4)
        p += 8 + store_alen + 4
        rmq_st32(p, msg.reconsume_times)
        rmq_st64(p + 4, msg.prepared_transaction_offset)
        rmq_st32(p + 12, <int32_t>blen)
        p += 16
        if blen >= 65536:
            with nogil:
                crc = copy_crc(p, bp, blen)
        else:
            crc = copy_crc(p, bp, blen)
        rmq_st32(seg.m.base + wpos + 8, crc)
        p += blen
        if version == 1:
            p[0] = <char>tlen
            p += 1
        else:
            rmq_st16(p, <int16_t>tlen)
            p += 2
        memcpy(p, tp, tlen)
        p += tlen
        rmq_st16(p, <int16_t>(seg.m.base + wpos + total - (p + 2)))    # what remains: the properties
        write_properties(p + 2, props)
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


def append_message(MappedSegment seg, Message msg, str topic, dict props, int32_t queue_id,
                   int64_t queue_offset, int64_t store_ts, bytes store_host, int version,
                   int64_t max_size):
    """One record at the segment's write position (see encode); None when it did not fit."""
    return encode(seg, msg, topic, props, queue_id, queue_offset, store_ts, store_host, version, max_size)


cdef inline int64_t now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


@cython.final
cdef class _TopicState:
    """One topic's write state: next round-robin queue id, next offset per queue id."""
    cdef int32_t next_qid
    cdef bint checked                   # the name passed check_topic
    cdef dict offsets                   # queue id -> next queue offset

    def __cinit__(self):
        self.offsets = {}


cdef class Appender:
    """The write side of a commitlog: picks the queue id (round robin per topic when none
    is given), assigns the queue offset (PREPARED / ROLLBACK get 0 and do not advance it)
    and encodes the record at the end of the last segment, rolling when it is full; a
    batch runs as one C loop with one store timestamp.

    Policy stays in Python callbacks, called only when needed: ``check_topic(topic)`` the
    first time a topic is written (raises if the name is not allowed), ``delay(msg, topic,
    queue_id, props)`` -> (topic, queue_id, props) for a message with a DELAY property, and
    ``warm(seg)`` once the end of written data reaches ``warm_mark`` (a commitlog offset),
    and ``stamp(msg)`` (None: off) on every message before it is checked (UNIQ_KEY).
    Thread-safe: ``put``/``put_batch`` hold the appender's own write lock, a C lock taken
    without a Python call when free (waiting for it releases the GIL). ``with appender:``
    holds it for other writers of the commitlog (retention, truncation)."""
    cdef public int64_t warm_mark
    cdef PyThread_type_lock _lock
    cdef dict topics                    # topic -> _TopicState
    cdef object segments, check_topic, delay, warm, stamp
    cdef MappedSegment seg              # the last segment, during a call
    cdef bytes store_host
    cdef int version
    cdef int32_t queue_nums
    cdef int64_t max_size

    def __init__(self, segments, bytes store_host, int version, int64_t max_size, int32_t queue_nums,
                 check_topic, delay, warm, stamp=None):
        if queue_nums <= 0:
            raise InvalidArgumentError("queue_nums must be positive")
        self.segments = segments
        self.store_host = store_host
        self.version = version
        self.max_size = max_size
        self.queue_nums = queue_nums
        self.check_topic = check_topic
        self.delay = delay
        self.warm = warm
        self.stamp = stamp
        self.topics = {}
        self.warm_mark = 0
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("cannot allocate the commitlog write lock")

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    cdef inline void _acquire(self) noexcept:
        if not PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self._lock, WAIT_LOCK)

    def __enter__(self):
        self._acquire()
        return self

    def __exit__(self, *exc):
        PyThread_release_lock(self._lock)

    @property
    def queue_offsets(self):
        """(topic, queue_id) -> next queue offset, as a new dict."""
        cdef _TopicState st
        return {(t, q): o for t, st in self.topics.items() for q, o in st.offsets.items()}

    @queue_offsets.setter
    def queue_offsets(self, table):
        cdef _TopicState st
        for st in self.topics.values():
            st.offsets.clear()
        for (t, q), o in table.items():
            self._state(t).offsets[q] = o

    cdef _TopicState _state(self, str topic):
        cdef _TopicState st = self.topics.get(topic)
        if st is None:
            st = self.topics[topic] = _TopicState()
        return st

    def put(self, msg, queue_id=None):
        """Append one message; returns its PutResult."""
        cdef tuple plan
        if not isinstance(msg, Message):
            raise InvalidArgumentTypeError(f"put takes a Message, not {type(msg).__name__}")
        queue_id = queue_id_arg(queue_id)
        self._acquire()
        try:
            plan = self._plan(<Message>msg, queue_id)
            self.seg = self._last()
            return self._write(plan, now_ms())
        finally:
            PyThread_release_lock(self._lock)

    def put_batch(self, msgs, queue_id=None):
        """Append every message of ``msgs`` with one store timestamp; list of PutResult.
        All or nothing: every message is checked (type, topic, properties, size, queue id),
        and every segment it rolls into is created, before the first is written, so a bad
        message anywhere or a full disk stores none of them."""
        cdef list plans = [], out = []
        queue_id = queue_id_arg(queue_id)
        if isinstance(msgs, (str, bytes, Message)) or not hasattr(msgs, "__iter__"):
            raise InvalidArgumentTypeError(f"put_batch takes an iterable of Message, not {type(msgs).__name__}")
        self._acquire()
        try:
            for m in msgs:
                if not isinstance(m, Message):
                    raise InvalidArgumentTypeError(f"put_batch: {type(m).__name__} where a Message is due")
                plans.append(self._plan(<Message>m, queue_id))
            ts = now_ms()
            self.seg = self._last()
            total = sum([plan[5] for plan in plans])
            if total + 8 > self.seg.m.size - self.seg.wrote_pos:   # it rolls: make the files first
                self.segments.make_room(self.seg, [plan[5] for plan in plans])
            for plan in plans:
                out.append(self._write(plan, ts))
            return out
        finally:
            PyThread_release_lock(self._lock)

    cdef MappedSegment _last(self):
        segs = self.segments.segments
        return segs[len(segs) - 1] if segs else self.segments.roll(0)

    cdef tuple _plan(self, Message msg, object queue_id):
        """Check ``msg`` and decide where it goes: (msg, topic, props, queue id, topic state).
        Raises before anything is written; only the round-robin position moves."""
        cdef str topic = text_arg("topic", msg.topic)
        cdef dict props
        cdef _TopicState st = self.topics.get(topic)
        cdef int32_t qid
        cdef int64_t size
        if msg.properties is None:
            raise InvalidArgumentTypeError("message properties must be a dict, not None")
        if self.stamp is not None:
            self.stamp(msg)
        props = msg.properties
        if st is None or not st.checked:
            self.check_topic(topic)
            st = self._state(topic)
            st.checked = True
        if queue_id is None:
            qid = st.next_qid
            st.next_qid = (qid + 1) % self.queue_nums
        else:
            qid = queue_id
        if "DELAY" in props:
            topic, qid, props = self.delay(msg, topic, qid, props)
            st = self._state(topic)
        size = record_size(msg, topic, props, self.store_host, self.version, self.max_size,
                           self.segments.file_size, body_length(msg.body))
        return (msg, topic, props, qid, st, size)

    cdef PutResult _write(self, tuple plan, int64_t ts):
        """Encode a planned message at the end of the log (rolling when the segment is full):
        the queue offset is taken here, PREPARED / ROLLBACK get 0 and do not advance it."""
        cdef Message msg = plan[0]
        cdef str topic = plan[1]
        cdef dict props = plan[2]
        cdef int32_t qid = plan[3], tran = msg.sys_flag & TRANSACTION_MASK
        cdef _TopicState st = plan[4]
        cdef bint counted = tran != TRAN_PREPARED and tran != TRAN_ROLLBACK
        cdef int64_t qoff = 0
        cdef object v
        cdef PutResult res
        if counted:
            v = st.offsets.get(qid)
            if v is not None:
                qoff = v
        res = encode(self.seg, msg, topic, props, qid, qoff, ts, self.store_host, self.version, self.max_size)
        if res is None:
            self.seg = self.segments.roll()
            res = encode(self.seg, msg, topic, props, qid, qoff, ts, self.store_host, self.version, self.max_size)
        if counted:
            st.offsets[qid] = qoff + 1
        if res.phy_offset + res.size >= self.warm_mark:
            self.warm(self.seg)
        return res


def queue_id_arg(queue_id):
    """None (round robin) or a queue id in [0, 2^31 - 1]; bool, float and str are refused."""
    return None if queue_id is None else int_arg("queue_id", queue_id, 0, 0x7FFFFFFF)


def properties_from(const unsigned char[:] raw, Py_ssize_t off, Py_ssize_t n):
    """Parse the properties string at ``raw[off:off+n]`` (bounds checked) into a dict."""
    if off < 0 or n < 0 or off + n > raw.shape[0]:
        raise IndexError("properties range outside the buffer")
    if n == 0:
        return {}
    return parse_properties(<const char *>&raw[off], <int32_t>n)
