# cython: boundscheck=False, wraparound=False, cdivision=True
"""The message classes: Message (to put), PutResult (where a put landed), MessageExt (a
stored message decoded from its record), and the argument checks their constructors and
the store's methods share."""
cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.buffer cimport PyObject_CheckBuffer
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject_GenericSetAttr
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcmp
from rmqstore._cext cimport rmq_ld32, rmq_ld64
from rmqstore._layout cimport (AT_BODY_CRC, AT_BORN_HOST, AT_BORN_TS, AT_FLAG, AT_MAGIC, AT_PHY_OFFSET,
                               AT_QUEUE_ID, AT_QUEUE_OFFSET, AT_SYS_FLAG, AT_TOTAL, BORN_V6, C_MAGIC_V1, REC_OK,
                               STORE_V6, TRANSACTION_MASK, WRITABLE_SYS_FLAG)
from rmqstore._record cimport RecView, format_host, make_msg_id, parse_properties, parse_record, tags_code_of
from rmqstore._record import pack_host
from rmqstore.errors import CorruptRecordError, FrozenObjectError, InvalidArgumentError, InvalidArgumentTypeError

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

cdef extern from "rmq_argtype.h":
    int rmq_argtype_wrap(type t, object error, const char *name) except -1


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


cpdef str keys_text(object keys):
    """A sequence of str keys as the KEYS value, joined by spaces; InvalidArgumentTypeError
    for bytes and anything iter() refuses (a 0-d numpy array too, despite its __iter__),
    InvalidArgumentError for an empty key or one holding a space (RocketMQ's separator:
    "a b" would be read back, and indexed, as the two keys "a" and "b")."""
    if isinstance(keys, (bytes, bytearray)):
        it = None
    else:
        try:
            it = iter(keys)
        except TypeError:
            it = None
    if it is None:
        raise InvalidArgumentTypeError(f"keys must be a str or a sequence of str, not {type(keys).__name__}")
    keys = [text_arg("key", k) for k in it]
    for k in keys:
        if not k or " " in k:
            raise InvalidArgumentError(f"key {k!r} is empty or holds a space, the separator of KEYS")
    return " ".join(keys)


cdef list split_keys(object text):
    """The keys of a KEYS value as RocketMQ's index takes them: split at each space (its
    KEY_SEPARATOR, not at other whitespace: "a\\tb" is one key), empty ones dropped."""
    return [k for k in text.split(" ") if k] if text else []


cdef object body_arg(object body):
    """``body`` if it is a bytes-like object (bytes, bytearray, memoryview, numpy bytes...)."""
    if isinstance(body, str) or not PyObject_CheckBuffer(body):
        raise InvalidArgumentTypeError(f"body must be bytes-like (bytes, bytearray, memoryview), "
                                       f"not {type(body).__name__}")
    return body


def int_arg(str name not None, object v, object lo, object hi):
    """``v`` as a plain int in [lo, hi]; bool, float and str are refused with
    InvalidArgumentError, and so is an ``__index__`` that fails or returns no int."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise InvalidArgumentTypeError(f"{name} must be an int, not {type(v).__name__}")
    try:
        v = PyNumber_Index(v)     # an exact int, or TypeError for an __index__ returning a non-int
    except Exception as e:
        raise InvalidArgumentTypeError(f"{name}: {type(v).__name__}.__index__() failed: "
                                       f"{type(e).__name__}: {e}") from e
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{name} {v} out of range [{lo}, {hi}]")
    return v


def sys_flag_arg(v, str name="sys_flag"):
    """``v`` as a sys_flag a writer takes: an int in [0, 2^31 - 1] setting no bit but
    COMPRESSED (0x1, the body as a producer compressed it), the transaction type (0xC) and
    the host IPv6 bits (0x30, set from the hosts anyway); InvalidArgumentError for one
    setting a bit whose meaning rmqstore does not implement, which a broker or client
    would act on (MULTI_TAGS 0x2, NEED_UNWRAP 0x40, INNER_BATCH 0x80, compression type 0x700...)."""
    v = int_arg(name, v, 0, 0x7FFFFFFF)
    if v & ~WRITABLE_SYS_FLAG:
        raise InvalidArgumentError(f"{name} {v:#x} sets bits {v & ~WRITABLE_SYS_FLAG:#x} rmqstore does not write "
                                   f"(it takes COMPRESSED 0x1, the transaction type 0xC and the host IPv6 bits 0x30)")
    return v


def queue_id_arg(queue_id):
    """None (round robin) or a queue id in [0, 2^31 - 1]; bool, float and str are refused."""
    return None if queue_id is None else int_arg("queue_id", queue_id, 0, 0x7FFFFFFF)


cdef class Message:
    """A message to put. ``tags`` and ``keys`` are stored in ``properties`` as TAGS and
    KEYS, as RocketMQ's Message keeps them. ``sys_flag`` carries what a producer set:
    COMPRESSED (0x1, the body as the producer compressed it) and the transaction type
    (0xC); a bit whose meaning rmqstore does not implement is refused.

    Message(topic, body=b"", tags=None, keys=None, properties=None, *, flag=0, sys_flag=0,
    born_timestamp=0, born_host=None, reconsume_times=0, prepared_transaction_offset=0,
    delay_level=None): ``topic`` a str; ``body`` any bytes-like object; ``tags`` a str;
    ``keys`` a str of space-separated keys or a sequence of keys (each non-empty, with no
    space); ``properties`` a mapping of str to str; ``flag`` a Java int; ``born_timestamp`` ms (0: the store time);
    ``born_host`` "ip:port" (None: the store host); ``delay_level`` a RocketMQ delay
    level (moves the message to SCHEDULE_TOPIC_XXXX until due). Raises
    InvalidArgumentError (InvalidArgumentTypeError for a wrong type) for a bad argument."""

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
            props["KEYS"] = text_arg("keys", keys) if isinstance(keys, str) else keys_text(keys)
        if delay_level is not None:
            delay_level = int_arg("delay_level", delay_level, 0, 0x7FFFFFFF)
            if delay_level:
                props["DELAY"] = str(delay_level)
        self.properties = props
        self.flag = int_arg("flag", flag, -0x80000000, 0x7FFFFFFF)
        self.sys_flag = sys_flag_arg(sys_flag)
        self.born_timestamp = int_arg("born_timestamp", born_timestamp, 0, 0x7FFFFFFFFFFFFFFF)
        self.born_host_packed = pack_host(born_host) if born_host is not None else None
        self.reconsume_times = int_arg("reconsume_times", reconsume_times, 0, 0x7FFFFFFF)
        self.prepared_transaction_offset = int_arg("prepared_transaction_offset", prepared_transaction_offset,
                                                   0, 0x7FFFFFFFFFFFFFFF)

    def __setattr__(self, name, value):
        """A field takes what __init__ takes (a str subclass as its str, an __index__
        integer as an int), or InvalidArgumentError."""
        check = FIELD_CHECKS.get(name)
        PyObject_GenericSetAttr(self, name, value if check is None else check(value))

    @property
    def tags(self):
        return self.properties.get("TAGS")

    @property
    def keys(self):
        return split_keys(self.properties.get("KEYS"))

    def __repr__(self):
        return f"Message(topic={self.topic!r}, body={len(self.body)} bytes, properties={self.properties!r})"


rmq_argtype_wrap(Message, InvalidArgumentTypeError, "Message()")   # Message() or Message(t, bogus=1): not a bare TypeError


def _properties_field(v):
    if not isinstance(v, dict):
        raise InvalidArgumentTypeError(f"properties must be a dict of str to str, not {type(v).__name__}")
    return v     # its names and values are checked when the message is put


def _packed_host_field(v):
    if v is not None and type(v) is not bytes:
        raise InvalidArgumentTypeError(f"born_host_packed must be bytes or None, not {type(v).__name__}")
    if v is not None and len(v) not in (8, 20):
        raise InvalidArgumentError(f"born_host_packed must be 8 (IPv4) or 20 (IPv6) bytes, not {len(v)}")
    return v


def _int_field(name, lo, hi):
    return lambda v: int_arg(name, v, lo, hi)


# Message's fields: the check of a value set from Python, the ranges as in Message.__init__
cdef dict FIELD_CHECKS = {
    "topic": lambda v: text_arg("topic", v),
    "body": lambda v: body_arg(v),
    "properties": _properties_field,
    "born_host_packed": _packed_host_field,
    "flag": _int_field("flag", -0x80000000, 0x7FFFFFFF),
    "sys_flag": sys_flag_arg,
    "born_timestamp": _int_field("born_timestamp", 0, 0x7FFFFFFFFFFFFFFF),
    "reconsume_times": _int_field("reconsume_times", 0, 0x7FFFFFFF),
    "prepared_transaction_offset": _int_field("prepared_transaction_offset", 0, 0x7FFFFFFFFFFFFFFF),
}


@cython.no_gc
@cython.freelist(64)
cdef class PutResult:
    """Where a put landed: commitlog offset and size, queue id/offset, store time."""

    def __init__(self, *args, **kwargs):
        raise InvalidArgumentTypeError("PutResult comes from put(); it is not built directly")

    def __setattr__(self, name, value):
        raise FrozenObjectError(f"PutResult is immutable: cannot set {name!r}")

    def __delattr__(self, name):
        raise FrozenObjectError(f"PutResult is immutable: cannot delete {name!r}")

    @property
    def msg_id(self):
        if self.store_host is None:
            raise InvalidArgumentTypeError("PutResult comes from put(); this one was made empty by __new__")
        return make_msg_id(PyBytes_AS_STRING(self.store_host), PyBytes_GET_SIZE(self.store_host) - 4, self.phy_offset)

    def __repr__(self):
        return (f"PutResult(msg_id={self.msg_id!r}, phy_offset={self.phy_offset}, size={self.size}, "
                f"topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset})")


cdef enum:
    KEPT_BODY = 480         # bodies from which a message keeps its copy: a shorter one's bytes fits pymalloc's blocks


# Batch reads build, and drop, 100,000s of messages at once: a freelist that large keeps their memory (12 MiB
# at most) rather than fault fresh allocator arenas in for every batch (query_keys of 100k keys: 1.45 -> 1.63 M/s).
@cython.no_gc
@cython.freelist(131072)
cdef class MessageExt:
    """A stored message, as the store's reads return it: every field of its record
    (``topic``, ``queue_id``, ``queue_offset``, ``phy_offset``, ``msg_id``, ``body``,
    ``tags``, ``keys``, ``properties``, times and hosts). Immutable, and independent of the
    store: it holds a copy of its record, or shares one copy of its batch's records with
    the other messages of a get_messages or scan call (that copy lives as long as one of
    them does), so it stays valid after the store is closed. Two messages are equal when
    they hold the same record read at the same offset; pickling and copying carry only the
    record.

    Memory: 96 bytes a message beside its record; numbers are read from the record at each
    access, topic and properties decoded on first access. Messages are not tracked by the
    garbage collector (batch reads make many), so a message stored into its own
    ``properties`` dict is never freed."""

    def __init__(self, *args, **kwargs):
        raise InvalidArgumentTypeError("MessageExt comes from the store's reads; it is not built directly")

    def __setattr__(self, name, value):
        raise FrozenObjectError(f"MessageExt is immutable (a stored message): cannot set {name!r}")

    def __delattr__(self, name):
        raise FrozenObjectError(f"MessageExt is immutable (a stored message): cannot delete {name!r}")

    @property
    def phy_offset(self): return rmq_ld64(rec(self) + AT_PHY_OFFSET)
    @property
    def commitlog_offset(self): return rmq_ld64(rec(self) + AT_PHY_OFFSET)
    @property
    def store_size(self): return total_of(self)
    @property
    def magic(self): return rmq_ld32(rec(self) + AT_MAGIC)
    @property
    def version(self): return 1 if rmq_ld32(rec(self) + AT_MAGIC) == C_MAGIC_V1 else 2
    @property
    def body_crc(self): return rmq_ld32(rec(self) + AT_BODY_CRC)
    @property
    def queue_id(self): return rmq_ld32(rec(self) + AT_QUEUE_ID)
    @property
    def flag(self): return rmq_ld32(rec(self) + AT_FLAG)
    @property
    def queue_offset(self): return rmq_ld64(rec(self) + AT_QUEUE_OFFSET)
    @property
    def sys_flag(self): return sys_flag_of(self)
    @property
    def born_timestamp(self): return rmq_ld64(rec(self) + AT_BORN_TS)
    @property
    def store_timestamp(self): return rmq_ld64(rec(self) + self.s.store_off - 8)
    @property
    def reconsume_times(self): return rmq_ld32(rec(self) + self.s.store_off + store_len(self) + 4)
    @property
    def prepared_transaction_offset(self): return rmq_ld64(rec(self) + self.s.store_off + store_len(self) + 8)
    @property
    def transaction_type(self): return sys_flag_of(self) & TRANSACTION_MASK

    @property
    def born_host(self):
        return format_host(rec(self) + AT_BORN_HOST, 16 if sys_flag_of(self) & BORN_V6 else 4)

    @property
    def store_host(self):
        return format_host(rec(self) + self.s.store_off, store_len(self))

    @property
    def store_host_packed(self):
        return PyBytes_FromStringAndSize(rec(self) + self.s.store_off, store_len(self) + 4)

    @property
    def msg_id(self):
        return make_msg_id(rec(self) + self.s.store_off, store_len(self), rmq_ld64(rec(self) + AT_PHY_OFFSET))

    @property
    def topic(self):
        if self._topic is None:
            self._topic = PyUnicode_DecodeUTF8(rec(self) + self.s.topic_off, self.s.topic_len, "replace")
        return self._topic

    @property
    def body(self):
        """The body as bytes. One of fewer than KEPT_BODY bytes is copied at each access
        rather than kept: a message keeping it would take twice the memory, and a batch of
        them (query_keys of 100,000 keys, each body read once) faults in fresh pages for
        all of those copies, where a copy dropped after use leaves its block to the next."""
        if self._body is not None:
            return self._body
        body = PyBytes_FromStringAndSize(rec(self) + self.s.body_off, self.s.body_len)
        if self.s.body_len >= KEPT_BODY:
            self._body = body
        return body

    @property
    def properties(self):
        if self._props is None:
            self._props = parse_properties(rec(self) + self.s.props_off, self.s.props_len)
        return self._props

    @property
    def properties_raw(self):
        return PyBytes_FromStringAndSize(rec(self) + self.s.props_off, self.s.props_len)

    @property
    def tags(self): return self.properties.get("TAGS")
    @property
    def keys(self): return split_keys(self.properties.get("KEYS"))
    @property
    def uniq_key(self): return self.properties.get("UNIQ_KEY")
    @property
    def tags_code(self):
        return tags_code_of(rec(self) + self.s.props_off, self.s.props_len)

    def raw(self):
        """The whole record as stored."""
        cdef int32_t total = total_of(self)
        if PyBytes_GET_SIZE(self._owner) == total:
            return self._owner
        return PyBytes_FromStringAndSize(rec(self), total)

    def __eq__(self, other):
        cdef MessageExt o
        if not isinstance(other, MessageExt):
            return NotImplemented
        o = <MessageExt>other
        cdef int32_t total = total_of(self)
        return self.store_offset == o.store_offset and total == total_of(o) and memcmp(rec(self), rec(o), total) == 0

    def __hash__(self):
        return hash((self.store_offset, self.store_size, self.body_crc, self.store_timestamp))

    def __reduce__(self):
        return restore_ext, (self.raw(), self.store_offset)

    def __repr__(self):
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"phy_offset={self.phy_offset}, size={self.store_size}, msg_id={self.msg_id!r})")


cdef inline int32_t total_of(MessageExt m) except? -1:
    return rmq_ld32(rec(m) + AT_TOTAL)


cdef inline int32_t sys_flag_of(MessageExt m) except? -1:
    return rmq_ld32(rec(m) + AT_SYS_FLAG)


cdef inline int32_t store_len(MessageExt m) except? -1:
    """STOREHOST's address length: 16 (IPv6) or 4 bytes."""
    return 16 if sys_flag_of(m) & STORE_V6 else 4


cdef inline const char *rec(MessageExt m) except NULL:
    """The record of ``m``; InvalidArgumentTypeError for one made empty by
    ``MessageExt.__new__`` (no record to read: its pointer is NULL)."""
    if m._p == NULL:
        raise InvalidArgumentTypeError("MessageExt comes from the store's reads; this one was made empty by __new__")
    return m._p


def restore_ext(bytes raw not None, int64_t store_offset):
    """The MessageExt of the record ``raw`` read at ``store_offset`` (unpickling);
    CorruptRecordError when ``raw`` is not one whole valid record."""
    cdef RecView r
    cdef int code = parse_record(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), False, &r)
    if code == REC_OK and r.total == PyBytes_GET_SIZE(raw):
        return ext_in(raw, 0, &r, store_offset)
    raise CorruptRecordError(f"commitlog offset {store_offset}: not one whole message record", store_offset)


cdef MessageExt build_ext(const char *p, RecView *r, int64_t store_offset):
    """A message holding its own copy of the record at ``p``."""
    return ext_in(PyBytes_FromStringAndSize(p, r.total), 0, r, store_offset)


cdef MessageExt ext_in(bytes owner, Py_ssize_t at, RecView *r, int64_t store_offset):
    """A message over the record at byte ``at`` of ``owner`` (which it keeps alive)."""
    cdef MessageExt m = MessageExt.__new__(MessageExt)
    m._owner = owner
    m._p = PyBytes_AS_STRING(owner) + at
    m.s.store_off = r.store_off
    m.s.body_off = r.body_off
    m.s.body_len = r.body_len
    m.s.topic_off = r.topic_off
    m.s.topic_len = r.topic_len
    m.s.props_off = r.props_off
    m.s.props_len = r.props_len
    m.store_offset = store_offset
    return m
