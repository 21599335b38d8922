# cython: boundscheck=False, wraparound=False, cdivision=True
"""One commitlog record: parse and validate it (parse_record), its body CRC, its
properties string, hosts and msgId, and the one translator of decoder statuses into
exceptions. Pure functions over bytes; no segment, no store."""
import enum

import numpy as np

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcmp, memcpy
from libc.stdint cimport int32_t, int64_t, uint8_t
from rmqstore._cext cimport *
from rmqstore._layout cimport *
from rmqstore.errors import (CorruptRecordError, InvalidArgumentError, InvalidArgumentTypeError, MessageNotFoundError,
                             NotRecordStartError, OutOfRangeError)

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

MAGIC_V1 = C_MAGIC_V1
MAGIC_V2 = C_MAGIC_V2
BLANK_MAGIC = C_BLANK

SYSFLAG_COMPRESSED = COMPRESSED
SYSFLAG_MULTI_TAGS = MULTI_TAGS
TRANSACTION_NOT_TYPE = TRAN_NOT_TYPE
TRANSACTION_PREPARED = TRAN_PREPARED
TRANSACTION_COMMIT = TRAN_COMMIT
TRANSACTION_ROLLBACK = TRAN_ROLLBACK
SYSFLAG_BORNHOST_V6 = BORN_V6
SYSFLAG_STOREHOST_V6 = STORE_V6
TRANSACTION_TYPE_MASK = TRANSACTION_MASK


def gets_cq_entry(sys_flag):
    """Whether a message of this sys_flag gets a consume-queue entry (for a numpy array:
    which rows do): all but PREPARED and ROLLBACK transaction messages. The Python form of
    _layout.gets_cq_entry_c, which the appender and the consume-queue grouping apply."""
    tran = sys_flag & TRANSACTION_MASK
    return (tran != TRAN_PREPARED) & (tran != TRAN_ROLLBACK)


class Status(str, enum.Enum):
    """Why a walk over records stopped (scan_segment, scan_dispatch, decode_batch): END and
    BLANK end a file's data, the others name the invalid record. Each member is its reason
    text, so it prints as one; match on the member. (str, Enum) with __str__/__format__
    rather than enum.StrEnum, which Python 3.10 lacks."""
    END = "end"
    BLANK = "blank"
    SHORT = "truncated record"
    MAGIC = "bad magic code"
    SIZE = "bad total size"
    FIELDS = "field lengths do not add up to the total size"
    CRC = "body CRC mismatch"
    PLACE = "PHYSICALOFFSET field names another offset"

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)


_STATUS = {REC_END: Status.END, REC_BLANK: Status.BLANK, REC_SHORT: Status.SHORT, REC_MAGIC: Status.MAGIC,
           REC_SIZE: Status.SIZE, REC_FIELDS: Status.FIELDS, REC_CRC: Status.CRC, REC_PLACE: Status.PLACE}


cdef object status_of(int code):
    """The Status member of a decoder status code."""
    return _STATUS[code]


cdef str status_text(int code, int64_t offset, RecView *r):
    """What a decoder status means at commitlog ``offset`` (``r`` is read only for REC_PLACE)."""
    if code == REC_NOSEG:
        return f"no commitlog segment holds offset {offset}"
    if code == REC_END or code == REC_BLANK:
        return f"no message at commitlog offset {offset} ({_STATUS[code]})"
    if code == REC_PLACE and r != NULL:
        return f"commitlog offset {offset}: record says it is at {r.phy_offset}"
    if code == REC_NOTSTART:
        return f"no record starts at commitlog offset {offset} (it lies inside a record, or is not a record's offset)"
    return f"commitlog offset {offset}: {_STATUS[code]}"


cdef int raise_status(int code, int64_t offset, RecView *r) except -1:
    """The one translator of decoder statuses: no record there (REC_NOSEG, REC_END,
    REC_BLANK) is MessageNotFoundError, a caller's offset inside a record (REC_NOTSTART)
    NotRecordStartError, an invalid record CorruptRecordError."""
    if code == REC_NOTSTART:
        raise NotRecordStartError(status_text(code, offset, r), offset)
    if code > 0:
        raise MessageNotFoundError(status_text(code, offset, r))
    raise CorruptRecordError(status_text(code, offset, r), offset)


def crc32_body(const unsigned char[:] data not None):
    """BODYCRC as RocketMQ computes it: CRC-32 (zlib's, java.util.zip.CRC32's) & 0x7FFFFFFF."""
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
        raise InvalidArgumentTypeError(f"java_hash takes str or bytes, not {type(s).__name__}")
    return rmq_java_hash(p, n)


# ---------------------------------------------------------------------------- hosts

def pack_host(host):
    """'ip:port' / '[v6]:port' / (ip, port) -> address bytes + big-endian port (8 or 20 bytes).
    The port is 0..65535: RocketMQ's decoder makes an InetSocketAddress of it, which
    refuses any other, so a record holding one could not be consumed."""
    import ipaddress
    from rmqstore._message import int_arg, text_arg
    if isinstance(host, (tuple, list)):
        if len(host) != 2:
            raise InvalidArgumentError(f"host {host!r} is not an (ip, port) pair")
        ip, port = text_arg("host ip", host[0]), int_arg("host port", host[1], 0, 65535)
    else:
        ip, sep, digits = text_arg("host", host).lstrip("/").rpartition(":")
        if not sep:
            raise InvalidArgumentError(f"host {host!r} is not 'ip:port'")
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 10):   # int() would take " 1", "1_0", "+1"
            raise InvalidArgumentError(f"host {host!r}: port {digits!r} is not up to 10 decimal digits")
        ip, port = ip.strip("[]"), int(digits)
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as e:
        raise InvalidArgumentError(f"host {host!r}: {e}") from None
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"host {host!r}: port {port} is not in 0..65535")
    return addr.packed + port.to_bytes(4, "big")


cdef int pack_v4(const char *s, Py_ssize_t n, char *out) noexcept nogil:
    """``a.b.c.d:port`` in its plain form (decimal octets <= 255 without leading zeros, a
    port of 1 to 10 digits <= 65535) packed into ``out`` (8 bytes): 1, else 0 (not that
    form: pack_host decides)."""
    cdef Py_ssize_t i = 0, start
    cdef int part
    cdef int64_t v
    for part in range(5):
        start, v = i, 0
        while i < n and i - start < 10 and 48 <= <uint8_t>s[i] <= 57:
            v = v * 10 + (s[i] - 48)
            i += 1
        if i == start or (part < 4 and (v > 255 or (i - start > 1 and s[start] == 48))) or v > 65535:
            return 0
        if part < 4:
            out[part] = <char>v
            if i >= n or s[i] != (58 if part == 3 else 46):   # ':' after the last octet, else '.'
                return 0
            i += 1
        else:
            rmq_st32(out + 4, <int32_t>v)
    return i == n


def pack_hosts(offsets, data, valid):
    """pack_host of each row of a string column (``offsets`` n + 1 int64 into ``data``,
    ``valid`` n uint8; a null row: no host, 0 bytes), IPv4 hosts in C: (packed bytes,
    int64 offsets)."""
    cdef const int64_t[::1] off = offsets
    cdef const unsigned char[::1] d = data if len(data) else b"\0"
    cdef const unsigned char[::1] ok = valid
    cdef Py_ssize_t i, n = ok.shape[0], pos = 0
    cdef char *o
    cdef dict others = {}
    if off.shape[0] != n + 1 or (n and (off[0] < 0 or off[n] > len(data))):
        raise InvalidArgumentError(f"hosts: {n + 1} offsets within the data are due")
    out = PyBytes_FromStringAndSize(NULL, 20 * n)
    o = PyBytes_AS_STRING(out)
    result = np.zeros(n + 1, np.int64)
    cdef int64_t[::1] at = result
    for i in range(n):
        if ok[i]:
            if off[i + 1] < off[i]:
                raise InvalidArgumentError(f"hosts: offsets decrease at row {i}")
            if pack_v4(<const char *>&d[0] + off[i], off[i + 1] - off[i], o + pos):
                pos += 8
            else:
                text = bytes(d[off[i]:off[i + 1]]).decode("utf-8", "replace")
                packed = others.get(text)
                if packed is None:
                    packed = others[text] = pack_host(text)
                memcpy(o + pos, PyBytes_AS_STRING(packed), len(packed))
                pos += len(packed)
        at[i + 1] = pos
    return out[:pos], result


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


def msg_id(bytes packed_store_host not None, int64_t offset):
    """msgId of the record at ``offset`` stored by ``packed_store_host`` (see pack_host)."""
    if len(packed_store_host) not in (8, 20):
        raise InvalidArgumentError("store host must be packed as 8 or 20 bytes")
    return make_msg_id(PyBytes_AS_STRING(packed_store_host), len(packed_store_host) - 4, offset)


def parse_msg_id(str msg_id not None):
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
    """Find property ``name`` (no \\x01 or \\x02 inside; last one wins, like a map); 1 when
    found with a non-empty value. Each pair's end is found by memchr and its name compared
    in place: about 3x faster than scanning each pair byte by byte for both separators.
    Dispatch, which reads TAGS, UNIQ_KEY and KEYS of every record, finds the three in one
    pass (index_props, _record.pxd)."""
    cdef int32_t i = 0, j
    cdef const char *q
    cdef int found = 0
    while i < n:
        q = <const char *>memchr(p + i, 2, n - i)
        j = <int32_t>(q - p) if q != NULL else n
        if j - i > nlen + 1 and p[i + nlen] == 1 and memcmp(p + i, name, nlen) == 0:
            voff[0] = i + nlen + 1
            vlen[0] = j - i - nlen - 1
            found = 1
        i = j + 1
    return found


def properties_from(const unsigned char[:] raw not None, Py_ssize_t off, Py_ssize_t n):
    """Parse the properties string at ``raw[off:off+n]`` (bounds checked) into a dict."""
    if off < 0 or n < 0 or off + n > raw.shape[0]:
        raise OutOfRangeError("properties range outside the buffer")
    if n == 0:
        return {}
    return parse_properties(<const char *>&raw[off], <int32_t>n)
