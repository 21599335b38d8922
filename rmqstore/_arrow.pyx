# cython: boundscheck=False, wraparound=False, cdivision=True
"""Commitlog records straight into Arrow arrays.

One builder fills Arrow buffers (int32 offsets + data for strings and binary, validity
bitmaps, list and map offsets) row by row with the GIL released: msgIds as upper-case hex,
hosts as ``a.b.c.d:port`` / ``[x:..:x]:port``, properties as a map, TAGS / UNIQ_KEY as
strings and KEYS as a list, parsed in one pass over each record's properties. Only the
requested columns are built. Rows come from mapped records (``decode``) or from
``_columns.decode_batch`` columns (``from_columns``); pyarrow takes the finished buffers
through the Arrow C data interface, without copying. Strings that are not valid UTF-8 get
U+FFFD replacements, like the single message decoder (the rare repair runs in Python)."""
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.string cimport memcmp, memcpy, memset
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
import operator
import numpy as np
cimport numpy as cnp
import pyarrow as pa
from rmqstore._cext cimport rmq_ld32
from rmqstore._layout cimport BORN_V6, STORE_V6
from rmqstore._record cimport RecView, parse_record, status_of
from rmqstore._columns cimport Extent, measure
from rmqstore._columns import BATCH_FIELDS
from rmqstore._copy cimport copy_short
from rmqstore._segment cimport MappedSegment, pin, unpin
from rmqstore._properties cimport check_offsets
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError

cnp.import_array()

cdef extern from "Python.h":
    int Py_IsInitialized() nogil

_TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([
    ("store", pa.string()), ("topic", pa.string()), ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()), ("phy_offset", pa.int64()), ("store_size", pa.int32()),
    ("msg_id", pa.string()), ("tags", pa.string()), ("keys", pa.list_(pa.string())),
    ("uniq_key", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("body_crc", pa.int32()), ("sys_flag", pa.int32()), ("flag", pa.int32()),
    ("born_timestamp", _TS), ("store_timestamp", _TS), ("born_host", pa.string()),
    ("store_host", pa.string()), ("reconsume_times", pa.int32()),
])
COLUMNS = tuple(SCHEMA.names)
_SCHEMAS = {}   # column names -> their schema: batches of a scan share one


def _schema_of(tuple names):
    schema = _SCHEMAS.get(names)
    if schema is None:
        if len(_SCHEMAS) >= 64:
            _SCHEMAS.clear()
        schema = _SCHEMAS[names] = pa.schema([SCHEMA.field(k) for k in names])
    return schema

cdef enum:   # column numbers, in SCHEMA order
    STORE, TOPIC, QUEUE_ID, QUEUE_OFFSET, PHY_OFFSET, STORE_SIZE, MSG_ID, TAGS, KEYS, UNIQ_KEY
    PROPERTIES, BODY, BODY_CRC, SYS_FLAG, FLAG, BORN_TS, STORE_TS, BORN_HOST, STORE_HOST, RECONSUME
    NCOL
    KEY_VALUES = NCOL, MAP_KEYS, MAP_VALUES, NSTR   # child string arrays

cdef int WIDTH[NCOL]                 # bytes a value of a fixed-width column; 0 for the others
for _i, _f in enumerate(SCHEMA):
    WIDTH[_i] = _f.type.bit_width // 8 if pa.types.is_primitive(_f.type) else 0
cdef int32_t MAX_DATA = 0x7FFFFFFF    # int32 offsets: bytes of one string column per batch
cdef int32_t HOST_MAX = 54            # '[' 39 ']' ':' 11
cdef int32_t ID_MAX = 56
cdef char HEX2[512]                   # byte -> two upper-case hex digits
for _i, _c in enumerate(b"".join(b"%02X" % i for i in range(256))):
    HEX2[_i] = _c
cdef const char *HEX_LOWER = b"0123456789abcdef"


cdef struct Fields:      # one message's fields, wherever they are read from
    const char *topic
    const char *body
    const char *props
    const uint8_t *born
    const uint8_t *store
    int32_t topic_len, body_len, props_len, born_len, store_len, born_port, store_port
    int32_t queue_id, total, body_crc, sys_flag, flag, reconsume
    int64_t queue_offset, phy, born_ts, store_ts


cdef struct Str:         # a string/binary array being filled
    int32_t *off
    char *data
    uint8_t *valid
    int64_t pos, nulls
    bint bad              # some value is not valid UTF-8


cdef struct HostCache:   # the previous row's host, raw and formatted: hosts repeat
    uint8_t raw[16]
    int32_t alen, port, at, size


cdef struct Builder:
    bint want[NCOL]
    Str s[NSTR]
    void *fixed[NCOL]
    int32_t *list_off
    uint8_t *list_valid
    int32_t *map_off
    int64_t nk, nm        # key tokens and map entries so far
    int64_t list_nulls    # rows without KEYS
    const char *store
    int32_t store_len
    HostCache hosts[2]


# ------------------------------------------------------------------------- row writers

cdef inline bint utf8_ok(const uint8_t *p, int64_t n) noexcept nogil:
    """Well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF)."""
    cdef int64_t i = 0
    cdef uint8_t c, c1
    cdef uint64_t w
    while i < n:
        if i + 8 <= n:
            memcpy(&w, p + i, 8)
            if w & 0x8080808080808080ULL == 0:
                i += 8
                continue
        c = p[i]
        if c < 0x80:
            i += 1
        elif 0xC2 <= c <= 0xDF:
            if i + 1 >= n or p[i + 1] & 0xC0 != 0x80:
                return False
            i += 2
        elif 0xE0 <= c <= 0xEF:
            if i + 2 >= n or p[i + 2] & 0xC0 != 0x80:
                return False
            c1 = p[i + 1]
            if c1 & 0xC0 != 0x80 or (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
        elif 0xF0 <= c <= 0xF4:
            if i + 3 >= n or p[i + 2] & 0xC0 != 0x80 or p[i + 3] & 0xC0 != 0x80:
                return False
            c1 = p[i + 1]
            if c1 & 0xC0 != 0x80 or (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
                return False
            i += 4
        else:
            return False
    return True


cdef inline void put(Str *s, int64_t i, const char *p, int64_t n) noexcept nogil:
    """Value ``i`` of ``s``: the ``n`` bytes at ``p``."""
    copy_short(s.data + s.pos, p, n)
    s.pos += n
    s.off[i + 1] = <int32_t>s.pos
    if s.valid != NULL:
        s.valid[i >> 3] |= 1 << (i & 7)


cdef inline void put_null(Str *s, int64_t i) noexcept nogil:
    s.off[i + 1] = <int32_t>s.pos
    s.nulls += 1


cdef inline int32_t put_decimal(char *out, int32_t v) noexcept nogil:
    """``v`` in decimal at ``out``; returns the length."""
    cdef char tmp[12]
    cdef int32_t n = 0, k = 0
    cdef int64_t u = v
    if u < 0:
        out[k] = b'-'
        k += 1
        u = -u
    while True:
        tmp[n] = <char>(48 + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    while n > 0:
        n -= 1
        out[k] = tmp[n]
        k += 1
    return k


cdef inline int32_t format_host(char *out, const uint8_t *a, int32_t alen, int32_t port) noexcept nogil:
    """Java InetSocketAddress style: a.b.c.d:port or [x:x:x:x:x:x:x:x]:port (no '::')."""
    cdef int32_t k = 0, g, j, v, started
    if alen == 4:
        for j in range(4):
            if j:
                out[k] = b'.'
                k += 1
            k += put_decimal(out + k, a[j])
    else:
        out[k] = b'['
        k += 1
        for j in range(8):
            if j:
                out[k] = b':'
                k += 1
            v = (a[2 * j] << 8) | a[2 * j + 1]
            started = 0
            for g in range(12, -1, -4):
                if (v >> g) & 0xF or started or g == 0:
                    out[k] = HEX_LOWER[(v >> g) & 0xF]
                    k += 1
                    started = 1
        out[k] = b']'
        k += 1
    out[k] = b':'
    k += 1
    return k + put_decimal(out + k, port)


cdef inline void put_host(Str *s, HostCache *c, int64_t i, const uint8_t *a, int32_t alen,
                          int32_t port) noexcept nogil:
    if not (alen == c.alen and port == c.port and memcmp(a, c.raw, alen) == 0):
        c.alen, c.port, c.at = alen, port, <int32_t>s.pos
        memcpy(c.raw, a, alen)
        c.size = format_host(s.data + s.pos, a, alen, port)
    else:
        copy_short(s.data + s.pos, s.data + c.at, c.size)
    s.pos += c.size
    s.off[i + 1] = <int32_t>s.pos


cdef inline void put_msg_id(Str *s, int64_t i, Fields *f) noexcept nogil:
    """Upper-case hex of store address + port + physical offset (big-endian)."""
    cdef char *o = s.data + s.pos
    cdef int32_t j
    cdef uint64_t v
    for j in range(f.store_len):
        memcpy(o + 2 * j, HEX2 + 2 * f.store[j], 2)
    o += 2 * f.store_len
    v = <uint32_t>f.store_port
    for j in range(3, -1, -1):
        memcpy(o + 2 * j, HEX2 + 2 * (v & 0xFF), 2)
        v >>= 8
    v = <uint64_t>f.phy
    for j in range(11, 3, -1):
        memcpy(o + 2 * j, HEX2 + 2 * (v & 0xFF), 2)
        v >>= 8
    s.pos += 2 * f.store_len + 24
    s.off[i + 1] = <int32_t>s.pos


cdef inline void put_props(Builder *b, int64_t i, const char *p, int32_t n) noexcept nogil:
    """Properties (RocketMQ string2messageProperties: name\\x01value pairs joined by \\x02,
    pairs with an empty name or value dropped) into the map, TAGS, KEYS and UNIQ_KEY
    columns; for the single-valued ones the last pair wins. The string is checked as UTF-8
    once: cut at ASCII separators, its pieces are valid when it is."""
    cdef int32_t a = 0, j, k, e
    cdef int32_t tag_at = -1, tag_len = 0, uniq_at = -1, uniq_len = 0, keys_at = -1, keys_len = 0
    cdef bint bad = not utf8_ok(<const uint8_t *>p, n)
    while a < n:
        k = a
        while k < n and p[k] != b'\x01' and p[k] != b'\x02':
            k += 1
        j = k
        if k < n and p[k] == b'\x01':
            while j < n and p[j] != b'\x02':
                j += 1
        if a < k < j - 1:
            if b.want[PROPERTIES]:
                put(&b.s[MAP_KEYS], b.nm, p + a, k - a)
                put(&b.s[MAP_VALUES], b.nm, p + k + 1, j - k - 1)
                b.nm += 1
            if k - a == 4 and memcmp(p + a, b"TAGS", 4) == 0:
                tag_at, tag_len = k + 1, j - k - 1
            elif k - a == 4 and memcmp(p + a, b"KEYS", 4) == 0:
                keys_at, keys_len = k + 1, j - k - 1
            elif k - a == 8 and memcmp(p + a, b"UNIQ_KEY", 8) == 0:
                uniq_at, uniq_len = k + 1, j - k - 1
        a = j + 1
    if b.want[PROPERTIES]:
        b.map_off[i + 1] = <int32_t>b.nm
        b.s[MAP_KEYS].bad |= bad
        b.s[MAP_VALUES].bad |= bad
    if b.want[TAGS]:
        if tag_at >= 0:
            put(&b.s[TAGS], i, p + tag_at, tag_len)
            b.s[TAGS].bad |= bad
        else:
            put_null(&b.s[TAGS], i)
    if b.want[UNIQ_KEY]:
        if uniq_at >= 0:
            put(&b.s[UNIQ_KEY], i, p + uniq_at, uniq_len)
            b.s[UNIQ_KEY].bad |= bad
        else:
            put_null(&b.s[UNIQ_KEY], i)
    if b.want[KEYS]:
        if keys_at >= 0:   # space-separated, empty tokens dropped
            b.list_valid[i >> 3] |= 1 << (i & 7)
            b.s[KEY_VALUES].bad |= bad
            a, e = keys_at, keys_at + keys_len
            while a < e:
                j = a
                while j < e and p[j] != b' ':
                    j += 1
                if j > a:
                    put(&b.s[KEY_VALUES], b.nk, p + a, j - a)
                    b.nk += 1
                a = j + 1
        else:
            b.list_nulls += 1
        b.list_off[i + 1] = <int32_t>b.nk


cdef void add_row(Builder *b, int64_t i, Fields *f) noexcept nogil:
    """Row ``i`` of every wanted column."""
    if b.want[STORE]:
        put(&b.s[STORE], i, b.store, b.store_len)
    if b.want[TOPIC]:
        put(&b.s[TOPIC], i, f.topic, f.topic_len)
        if not utf8_ok(<const uint8_t *>f.topic, f.topic_len):
            b.s[TOPIC].bad = True
    if b.want[QUEUE_ID]:
        (<int32_t *>b.fixed[QUEUE_ID])[i] = f.queue_id
    if b.want[QUEUE_OFFSET]:
        (<int64_t *>b.fixed[QUEUE_OFFSET])[i] = f.queue_offset
    if b.want[PHY_OFFSET]:
        (<int64_t *>b.fixed[PHY_OFFSET])[i] = f.phy
    if b.want[STORE_SIZE]:
        (<int32_t *>b.fixed[STORE_SIZE])[i] = f.total
    if b.want[MSG_ID]:
        put_msg_id(&b.s[MSG_ID], i, f)
    if b.want[TAGS] or b.want[KEYS] or b.want[UNIQ_KEY] or b.want[PROPERTIES]:
        put_props(b, i, f.props, f.props_len)
    if b.want[BODY]:
        put(&b.s[BODY], i, f.body, f.body_len)
    if b.want[BODY_CRC]:
        (<int32_t *>b.fixed[BODY_CRC])[i] = f.body_crc
    if b.want[SYS_FLAG]:
        (<int32_t *>b.fixed[SYS_FLAG])[i] = f.sys_flag
    if b.want[FLAG]:
        (<int32_t *>b.fixed[FLAG])[i] = f.flag
    if b.want[BORN_TS]:
        (<int64_t *>b.fixed[BORN_TS])[i] = f.born_ts * 1000
    if b.want[STORE_TS]:
        (<int64_t *>b.fixed[STORE_TS])[i] = f.store_ts * 1000
    if b.want[BORN_HOST]:
        put_host(&b.s[BORN_HOST], &b.hosts[0], i, f.born, f.born_len, f.born_port)
    if b.want[STORE_HOST]:
        put_host(&b.s[STORE_HOST], &b.hosts[1], i, f.store, f.store_len, f.store_port)
    if b.want[RECONSUME]:
        (<int32_t *>b.fixed[RECONSUME])[i] = f.reconsume


cdef inline void fields_of_record(const char *p, RecView *r, Fields *f) noexcept nogil:
    f.topic, f.topic_len = p + r.topic_off, r.topic_len
    f.body, f.body_len = p + r.body_off, r.body_len
    f.props, f.props_len = p + r.props_off, r.props_len
    f.born, f.born_len = <const uint8_t *>p + r.born_off, r.born_len
    f.born_port = rmq_ld32(p + r.born_off + r.born_len)
    f.store, f.store_len = <const uint8_t *>p + r.store_off, r.store_len
    f.store_port = rmq_ld32(p + r.store_off + r.store_len)
    f.queue_id, f.total, f.body_crc, f.sys_flag = r.queue_id, r.total, r.body_crc, r.sys_flag
    f.flag, f.reconsume, f.queue_offset, f.phy = r.flag, r.reconsume, r.queue_offset, r.phy_offset
    f.born_ts, f.store_ts = r.born_ts, r.store_ts


# ------------------------------------------------------------------------ allocation

cdef struct ArrowArray:  # the Arrow C data interface's array
    int64_t length
    int64_t null_count
    int64_t offset
    int64_t n_buffers
    int64_t n_children
    const void **buffers
    ArrowArray **children
    ArrowArray *dictionary
    void (*release)(ArrowArray *) noexcept nogil
    void *private_data

cdef enum:
    ENTRIES = NSTR       # the properties map's struct child
    NNODE                # the arrays under a batch: columns, then child arrays
    ALIGN = 64


cdef struct Arena:       # one batch's arrays; its buffers follow, ALIGN-aligned
    ArrowArray node[NNODE]
    const void *buf[NNODE][3]
    const void *batch_buf[1]
    ArrowArray *kid[NCOL + 4]   # the batch's columns, keys' child, the map's, the map's two


cdef void release_batch(ArrowArray *a) noexcept nogil:
    """Drop the pyarrow buffer the batch lives in (any thread; none at exit)."""
    if Py_IsInitialized():
        with gil:
            Py_DECREF(<object>a.private_data)
    a.release = NULL


cdef void release_child(ArrowArray *a) noexcept nogil:
    a.release = NULL     # its memory goes with the batch's arena


cdef inline char *take(char **at, int64_t *total, int64_t size) noexcept nogil:
    """The next ``size`` bytes at ``at[0]`` (NULL while only measuring), counted in ``total``."""
    cdef char *p = at[0]
    size = (size + ALIGN - 1) & ~(<int64_t>ALIGN - 1)
    total[0] += size
    if p != NULL:
        at[0] = p + size
    return p


cdef ArrowArray *node(Arena *a, int i, int64_t length, int64_t nulls, int nbuf, const void *b0, const void *b1,
                      const void *b2, int nkid, ArrowArray **kids) noexcept nogil:
    """Array ``i`` of arena ``a``: ``nbuf`` buffers and ``nkid`` children."""
    cdef ArrowArray *x = &a.node[i]
    x.length, x.null_count, x.offset, x.n_buffers, x.n_children = length, nulls, 0, nbuf, nkid
    a.buf[i][0], a.buf[i][1], a.buf[i][2] = b0, b1, b2
    x.buffers, x.children, x.dictionary = a.buf[i], kids, NULL
    x.release, x.private_data = release_child, NULL
    return x


cdef ArrowArray *string_node(Arena *a, Str *s, int i, int64_t length) noexcept nogil:
    return node(a, i, length, s.nulls, 3, s.valid if s.nulls else NULL, s.off, s.data, 0, NULL)


cdef class _Batch:
    """One batch being built. Its buffers are carved from one buffer of pyarrow's memory
    pool (which keeps freed pages for the next batch), handed to pyarrow through the Arrow
    C data interface (no copy, no Python object per column) and freed when pyarrow drops the
    last array of the batch. pyarrow keeps child arrays inside the batch it imported and
    never moves one out, so the batch's release covers them all."""
    cdef Builder b
    cdef int64_t n, topic_total, body_total, props_total
    cdef int ncols
    cdef int order[NCOL]
    cdef tuple names
    cdef object memory   # the pyarrow buffer holding the arena
    cdef Arena *arena
    cdef bytes store

    def __init__(self, columns, int64_t n, int64_t topic_total, int64_t body_total, int64_t props_total, store):
        cdef int k
        cdef int64_t total
        self.n, self.names = n, tuple(columns)
        self.topic_total, self.body_total, self.props_total = topic_total, body_total, props_total
        self.store = str(store).encode("utf-8", "replace")
        self.b.store, self.b.store_len = self.store, len(self.store)
        self.b.nk = self.b.nm = self.b.list_nulls = 0
        self.b.hosts[0].alen = self.b.hosts[1].alen = -1
        memset(self.b.s, 0, sizeof(self.b.s))
        memset(self.b.want, 0, sizeof(self.b.want))
        memset(self.b.fixed, 0, sizeof(self.b.fixed))
        self.ncols = len(self.names)
        for k, name in enumerate(self.names):
            self.order[k] = COLUMNS.index(name)
            self.b.want[self.order[k]] = True
        for k in range(NSTR):
            if self._wants(k) and self._data_size(k) > MAX_DATA:
                raise InvalidArgumentError(f"{self._data_size(k)} bytes for column {_column_name(k)} in one Arrow "
                                           f"batch; decode smaller batches (at most {MAX_DATA} bytes)")
        total = self._carve(NULL)
        self.memory = pa.allocate_buffer(sizeof(Arena) + 2 * ALIGN + total)
        self.arena = <Arena *>((<uintptr_t>self.memory.address + ALIGN - 1) & ~(<uintptr_t>ALIGN - 1))
        self._carve(<char *>self.arena + ((sizeof(Arena) + ALIGN - 1) & ~(<size_t>ALIGN - 1)))

    cdef bint _wants(self, int c):
        """Whether string array ``c`` (a column or child array) is built."""
        if c == KEY_VALUES:
            return self.b.want[KEYS]
        if c == MAP_KEYS or c == MAP_VALUES:
            return self.b.want[PROPERTIES]
        return c < NCOL and c != KEYS and c != PROPERTIES and not WIDTH[c] and self.b.want[c]

    cdef int64_t _data_size(self, int c):
        """Most data bytes string array ``c`` can hold for the batch."""
        if c == STORE:
            return self.n * self.b.store_len
        if c == TOPIC or c == BODY:
            return self.topic_total if c == TOPIC else self.body_total
        if c == MSG_ID:
            return self.n * ID_MAX
        if c == BORN_HOST or c == STORE_HOST:
            return self.n * HOST_MAX
        return self.props_total

    cdef int64_t _carve(self, char *at):
        """Point the builder's buffers into ``at`` (NULL: only measure them); returns their
        bytes. A child array holds at most one KEYS token per 2 bytes of properties (with its
        space) or one pair per 3 (name, 0x01, value), plus one per record."""
        cdef int64_t n = self.n, total = 0, rows
        cdef int c
        cdef Str *s
        for c in range(NSTR):
            if self._wants(c):
                s = &self.b.s[c]
                rows = n if c < NCOL else self.props_total // (2 if c == KEY_VALUES else 3) + n
                s.off = <int32_t *>take(&at, &total, 4 * (rows + 1))
                s.data = take(&at, &total, self._data_size(c))
                if c == TAGS or c == UNIQ_KEY:
                    s.valid = <uint8_t *>take(&at, &total, (n + 7) >> 3)
                if at != NULL:
                    s.off[0] = 0
                    if s.valid != NULL:
                        memset(s.valid, 0, (n + 7) >> 3)
        for c in range(NCOL):
            if self.b.want[c] and WIDTH[c]:
                self.b.fixed[c] = take(&at, &total, n * WIDTH[c])
        if self.b.want[KEYS]:
            self.b.list_off = <int32_t *>take(&at, &total, 4 * (n + 1))
            self.b.list_valid = <uint8_t *>take(&at, &total, (n + 7) >> 3)
            if at != NULL:
                self.b.list_off[0] = 0
                memset(self.b.list_valid, 0, (n + 7) >> 3)
        if self.b.want[PROPERTIES]:
            self.b.map_off = <int32_t *>take(&at, &total, 4 * (n + 1))
            if at != NULL:
                self.b.map_off[0] = 0
        return total

    cdef ArrowArray *_column(self, int c) noexcept nogil:
        """The array of column ``c`` (its children made too)."""
        cdef Arena *a = self.arena
        cdef Builder *b = &self.b
        if c == KEYS:
            a.kid[NCOL] = string_node(a, &b.s[KEY_VALUES], KEY_VALUES, b.nk)
            return node(a, c, self.n, b.list_nulls, 2, b.list_valid if b.list_nulls else NULL, b.list_off, NULL,
                        1, &a.kid[NCOL])
        if c == PROPERTIES:
            a.kid[NCOL + 2] = string_node(a, &b.s[MAP_KEYS], MAP_KEYS, b.nm)
            a.kid[NCOL + 3] = string_node(a, &b.s[MAP_VALUES], MAP_VALUES, b.nm)
            a.kid[NCOL + 1] = node(a, ENTRIES, b.nm, 0, 1, NULL, NULL, NULL, 2, &a.kid[NCOL + 2])
            return node(a, c, self.n, 0, 2, NULL, b.map_off, NULL, 1, &a.kid[NCOL + 1])
        if b.fixed[c] != NULL:
            return node(a, c, self.n, 0, 2, NULL, b.fixed[c], NULL, 0, NULL)
        return string_node(a, &b.s[c], c, self.n)

    cdef object record_batch(self):
        """The finished columns as a ``pyarrow.RecordBatch`` (in the requested order); the
        builder is spent."""
        cdef ArrowArray batch
        cdef int k
        bad = {_column_name(c) for c in range(NSTR) if self._wants(c) and self.b.s[c].bad}
        for k in range(self.ncols):
            self.arena.kid[k] = self._column(self.order[k])
        self.arena.batch_buf[0] = NULL
        batch.length, batch.null_count, batch.offset, batch.n_buffers, batch.n_children = self.n, 0, 0, 1, self.ncols
        batch.buffers, batch.children, batch.dictionary = self.arena.batch_buf, self.arena.kid, NULL
        batch.release, batch.private_data = release_batch, <void *>self.memory
        Py_INCREF(self.memory)   # the batch's, dropped by its release
        try:
            rb = pa.RecordBatch._import_from_c(<uintptr_t>&batch, _schema_of(self.names))
        finally:
            if batch.release != NULL:   # not taken
                batch.release(&batch)
        return _repaired(rb, bad) if bad else rb


def _column_name(int c):
    return COLUMNS[c] if c < NCOL else {KEY_VALUES: "keys", MAP_KEYS: "properties", MAP_VALUES: "properties"}[c]


def _repaired(rb, names):
    """``rb`` with the strings of columns ``names`` made valid UTF-8 (see _valid_utf8)."""
    return pa.RecordBatch.from_arrays([_valid_utf8(col) if name in names else col
                                       for name, col in zip(rb.schema.names, rb.columns)], schema=rb.schema)


def _valid_utf8(a):
    """String, list-of-string or string-map array ``a`` with each value's invalid UTF-8
    replaced by U+FFFD."""
    t = a.type
    if pa.types.is_map(t):
        entries = pa.StructArray.from_arrays([_valid_utf8(a.keys), _valid_utf8(a.items)],
                                             fields=[t.key_field, t.item_field])
        return pa.Array.from_buffers(t, len(a), a.buffers()[:2], children=[entries])
    if pa.types.is_list(t):
        return pa.Array.from_buffers(t, len(a), a.buffers()[:2], null_count=a.null_count,
                                     children=[_valid_utf8(a.values)])
    valid, off, data = a.buffers()
    bounds = np.frombuffer(off, np.int32, len(a) + 1).tolist()
    raw = b"" if data is None else data.to_pybytes()
    values = [raw[i:j].decode("utf-8", "replace").encode() for i, j in zip(bounds, bounds[1:])]
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.Array.from_buffers(t, len(a), [valid, pa.py_buffer(off), pa.py_buffer(b"".join(values))],
                                 null_count=a.null_count)


def check_columns(columns):
    """``columns`` (names of ``SCHEMA``) as a tuple; InvalidArgumentError names unknown ones."""
    if columns is None:
        return COLUMNS
    columns = tuple(columns)
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise InvalidArgumentError(f"unknown column(s) {unknown}; the columns are {list(COLUMNS)}")
    if len(set(columns)) != len(columns):
        raise InvalidArgumentError(f"column listed twice in {list(columns)}")
    return columns


# -------------------------------------------------------------------------- drivers

def decode(MappedSegment seg not None, int64_t pos, int64_t limit, bint check_crc, store, columns=None):
    """The records in ``[pos, limit)`` of ``seg`` as a ``pyarrow.RecordBatch`` of ``columns``
    (default: all of ``SCHEMA``), plus where and why decoding stopped: ``(batch, info)``,
    info holding ``count``, ``bytes`` (record bytes), ``end_pos`` (file position), ``stop``
    ("end", "blank" or the reason the record at ``end_pos`` is corrupt). Stops at end of data,
    a BLANK record or the first corrupt record."""
    cdef RecView r
    cdef Fields f
    cdef Extent x
    cdef int64_t i, p
    cdef _Batch out
    columns = check_columns(columns)
    limit = seg.pin_range(pos, limit)
    try:
        with nogil:
            measure(seg.m.base, pos, limit, check_crc, &x)
        out = _Batch(columns, x.count, x.topic_bytes, x.body_bytes, x.props_bytes, store)
        with nogil:
            p = pos
            for i in range(x.count):
                parse_record(seg.m.base + p, limit - p, False, &r)
                fields_of_record(seg.m.base + p, &r, &f)
                add_row(&out.b, i, &f)
                p += r.total
    finally:
        unpin(seg)
    info = {"count": x.count, "bytes": x.end - pos, "end_pos": x.end + x.blank_size, "stop": status_of(x.code)}
    return out.record_batch(), info


def _column(dict cols, str name, dtype, int64_t rows):
    """``cols[name]``: a count (dtype None) as an int >= 0, else the first ``rows`` items
    (all when 0) of its items as a flat array of ``dtype`` (hosts are 16 bytes a row).
    Columns a caller built or changed are an InvalidArgumentError where they do not fit,
    never a read past an array."""
    if name not in cols:
        raise InvalidArgumentError(f"decoded columns have no {name!r}")
    try:
        count = operator.index(cols[name]) if dtype is None else None
        a = None if dtype is None else np.ascontiguousarray(cols[name], dtype).reshape(-1)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgumentTypeError(f"decoded column {name!r}: {e}") from None
    if a is None:
        if not 0 <= count < 1 << 62:
            raise InvalidArgumentError(f"decoded columns: count {count} out of range")
        return count
    if len(a) < rows:
        raise InvalidArgumentError(f"decoded column {name!r} holds {len(a)} items where {rows} are due")
    return a[:rows] if rows else a


def from_columns(dict cols not None, store, columns=None):
    """``_columns.decode_batch`` columns as a ``pyarrow.RecordBatch`` of ``columns``."""
    cdef Fields f
    cdef int64_t n = _column(cols, "count", None, 0), i
    cdef const int64_t *fx[15]
    cdef int j
    columns = check_columns(columns)
    ints = [_column(cols, name, np.int64, n) for name in BATCH_FIELDS]
    for j in range(15):
        fx[j] = <const int64_t *>cnp.PyArray_DATA(ints[j])
    data = {k: _column(cols, k + "_data", np.uint8, 0) for k in ("topic", "body", "props")}
    offs = {k: _column(cols, k + "_offsets", np.int64, n + 1) for k in ("topic", "body", "props")}
    for k in offs:   # every row's bytes within its data
        check_offsets(NULL, <const int64_t *>cnp.PyArray_DATA(offs[k]), 0, n, len(data[k]), k + "_offsets")
    born, store_addr = _column(cols, "born_addr", np.uint8, 16 * n), _column(cols, "store_addr", np.uint8, 16 * n)
    cdef const char *td = <const char *>cnp.PyArray_DATA(data["topic"])
    cdef const char *bd = <const char *>cnp.PyArray_DATA(data["body"])
    cdef const char *pd = <const char *>cnp.PyArray_DATA(data["props"])
    cdef const int64_t *to = <const int64_t *>cnp.PyArray_DATA(offs["topic"])
    cdef const int64_t *bo = <const int64_t *>cnp.PyArray_DATA(offs["body"])
    cdef const int64_t *po = <const int64_t *>cnp.PyArray_DATA(offs["props"])
    cdef const uint8_t *ba = <const uint8_t *>cnp.PyArray_DATA(born)
    cdef const uint8_t *sa = <const uint8_t *>cnp.PyArray_DATA(store_addr)
    cdef _Batch out = _Batch(columns, n, to[n] - to[0] if n else 0, bo[n] - bo[0] if n else 0,
                             po[n] - po[0] if n else 0, store)
    with nogil:
        for i in range(n):
            f.phy, f.total, f.body_crc, f.queue_id = fx[0][i], <int32_t>fx[1][i], <int32_t>fx[3][i], <int32_t>fx[4][i]
            f.flag, f.queue_offset, f.sys_flag, f.born_ts = <int32_t>fx[5][i], fx[6][i], <int32_t>fx[7][i], fx[8][i]
            f.store_ts, f.reconsume = fx[9][i], <int32_t>fx[10][i]
            f.born_port, f.store_port = <int32_t>fx[13][i], <int32_t>fx[14][i]
            f.topic, f.topic_len = td + to[i], <int32_t>(to[i + 1] - to[i])
            f.body, f.body_len = bd + bo[i], <int32_t>(bo[i + 1] - bo[i])
            f.props, f.props_len = pd + po[i], <int32_t>(po[i + 1] - po[i])
            f.born, f.born_len = ba + 16 * i, 16 if f.sys_flag & BORN_V6 else 4
            f.store, f.store_len = sa + 16 * i, 16 if f.sys_flag & STORE_V6 else 4
            add_row(&out.b, i, &f)
    return out.record_batch()
