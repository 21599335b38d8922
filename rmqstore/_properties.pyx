# cython: boundscheck=False, wraparound=False, cdivision=True
"""Properties columns for ``put_columns`` / ``put_arrow``: each row's properties string laid
out as a record stores it (``name\\x01value`` pairs joined by ``\\x02``), built in one C
pass over the columns, with no Python object per message.

``arrow_rows`` gives Arrow columns the semantics of ``Message``: a properties map read as a
dict (a repeated name keeps its first place and takes its last value; a null value is not
written), then UNIQ_KEY, TAGS and KEYS columns set into it (in place when the map has the
name, else appended), then a generated UNIQ_KEY for a row that has none or an empty one,
as the store's ``generate_uniq_key`` stamps ``put``'s messages."""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcmp
from rmqstore._copy cimport copy_short
import numpy as np
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL


def properties_rows(bytes common not None, list names not None, list columns not None, Py_ssize_t n,
                    convert=None):
    """The properties column of ``n`` rows for put_columns: per row ``common`` (already laid
    out), then ``names[j]\\x01value`` for each column j whose value is not None, joined by
    \\x02. Values must be str without a \\x01/\\x02 inside; a value of another type is
    first replaced by ``convert(names[j], value)`` when given (in ``columns``, which are the
    caller's to change). Returns (bytes, int64 offsets)."""
    cdef Py_ssize_t i, j, vl, nc = len(columns), cl = len(common)
    cdef int64_t row, pos
    cdef const char *vp
    cdef const char *cp = PyBytes_AS_STRING(common)
    cdef char *out
    cdef list col
    offsets = np.zeros(n + 1, np.int64)
    cdef int64_t[::1] off = offsets
    cdef list name_bytes = [name.encode() for name in names]
    cdef int64_t[::1] name_len = np.array([len(b) for b in name_bytes] or [0], np.int64)
    for col in columns:
        if len(col) != n:
            raise InvalidArgumentError(f"{len(col)} values for {n} messages")
    for i in range(n):
        row = cl
        for j in range(nc):
            v = (<list>columns[j])[i]
            if v is None:
                continue
            if type(v) is not str and convert is not None:
                v = (<list>columns[j])[i] = convert(names[j], v)
            vp = _checked_text(v, names[j], &vl)
            row += (1 if row else 0) + name_len[j] + 1 + vl
        off[i + 1] = off[i] + row
    data = PyBytes_FromStringAndSize(NULL, off[n])
    out = PyBytes_AS_STRING(data)
    for i in range(n):
        pos = off[i]
        copy_short(out + pos, cp, cl)
        pos += cl
        for j in range(nc):
            v = (<list>columns[j])[i]
            if v is None:
                continue
            vp = PyUnicode_AsUTF8AndSize(v, &vl)
            if pos > off[i]:
                out[pos] = 2
                pos += 1
            copy_short(out + pos, PyBytes_AS_STRING(name_bytes[j]), name_len[j])
            pos += name_len[j]
            out[pos] = 1
            copy_short(out + pos + 1, vp, vl)
            pos += 1 + vl
    return data, offsets


cdef const char *_checked_text(object v, str what, Py_ssize_t *n) except NULL:
    cdef const char *p
    if type(v) is not str:
        raise InvalidArgumentTypeError(f"{what} must be str, not {type(v).__name__}")
    try:
        p = PyUnicode_AsUTF8AndSize(v, n)
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} {v!r}: not valid Unicode text (a lone surrogate?)") from None
    if not clean(p, n[0]):
        raise InvalidArgumentError(f"a {what} value holds a \\x01/\\x02 separator")
    return p


# ------------------------------------------------------------------------- from Arrow
# Arrow arrays are read in place, from their buffers: offsets of either width, validity
# bitmaps, a slice's offset, a dictionary's indices; every offset and index is checked
# against the buffers' sizes first, so a malformed array is an error, never a stray read.

cdef struct Strings:     # an Arrow string array (or a dictionary array of strings)
    const uint8_t *valid     # validity bitmap, NULL: no null
    const int32_t *off32     # offsets: int32, or (NULL) int64 in off64 (large_string)
    const int64_t *off64
    const char *data
    int64_t start, length    # the array's offset into its buffers (a slice), its rows
    const uint8_t *idx       # a dictionary array's indices (NULL: not one), idx_size bytes each
    int idx_size
    bint idx_signed
    Strings *values          # a dictionary array's dictionary


cdef struct Lists:       # rows of strings: a list array, or a string array as lists of one
    const uint8_t *valid
    const int32_t *off32     # off32 and off64 NULL: lists of one (row i is string i, null when it is)
    const int64_t *off64
    int64_t start
    Strings s


cdef inline bint bit(const uint8_t *bits, int64_t i) noexcept nogil:
    return bits == NULL or (bits[i >> 3] >> (i & 7)) & 1


cdef inline int64_t offset(const int32_t *o32, const int64_t *o64, int64_t i) noexcept nogil:
    return o32[i] if o32 != NULL else o64[i]


cdef inline int64_t index_at(const Strings *s, int64_t i) noexcept nogil:
    # (no ``a if signed else b``: Cython gives it the unsigned type, so -1 read as 255)
    if s.idx_signed:
        if s.idx_size == 1:
            return (<const int8_t *>s.idx)[i]
        if s.idx_size == 2:
            return (<const int16_t *>s.idx)[i]
        if s.idx_size == 4:
            return (<const int32_t *>s.idx)[i]
        return (<const int64_t *>s.idx)[i]
    if s.idx_size == 1:
        return s.idx[i]
    if s.idx_size == 2:
        return (<const uint16_t *>s.idx)[i]
    if s.idx_size == 4:
        return (<const uint32_t *>s.idx)[i]
    return (<const int64_t *>s.idx)[i]   # (uint64 past int64: negative, refused)


cdef inline const char *str_at(const Strings *s, int64_t i, int64_t *n) noexcept nogil:
    """Row i of ``s``: its bytes (``n[0]`` of them), NULL when it is null."""
    cdef int64_t a
    i += s.start
    if not bit(s.valid, i):
        return NULL
    if s.idx != NULL:
        i = index_at(s, i) + s.values.start
        s = s.values
        if not bit(s.valid, i):
            return NULL
    a = offset(s.off32, s.off64, i)
    n[0] = offset(s.off32, s.off64, i + 1) - a
    return s.data + a


cdef inline bint list_at(const Lists *l, int64_t i, int64_t *a, int64_t *b) noexcept nogil:
    """Whether row i of ``l`` is a list (not null); its strings are rows a .. b - 1 of l.s."""
    cdef int64_t n
    if l.off32 == NULL and l.off64 == NULL:
        a[0], b[0] = i, i + 1
        return str_at(&l.s, i, &n) != NULL
    i += l.start
    a[0], b[0] = offset(l.off32, l.off64, i), offset(l.off32, l.off64, i + 1)
    return bit(l.valid, i)


cdef const uint8_t *_address(buf, int64_t need, str what) except? NULL:
    """The bytes of a pyarrow Buffer that must hold ``need`` bytes (None: NULL)."""
    if buf is None:
        if need > 0:
            raise InvalidArgumentError(f"{what}: a buffer of {need} bytes is missing")
        return NULL
    if not buf.is_cpu:
        raise InvalidArgumentTypeError(f"{what}: an Arrow buffer in device memory")
    if buf.size < need:
        raise InvalidArgumentError(f"{what}: a buffer of {buf.size} bytes where {need} are due")
    return <const uint8_t *><uintptr_t>buf.address


cdef int check_offsets(const int32_t *o32, const int64_t *o64, int64_t start, int64_t n, int64_t end,
                       str what) except -1:
    """Offsets start .. start + n must not decrease and must lie within [0, end]."""
    cdef int64_t i, prev = offset(o32, o64, start)
    if prev < 0:
        raise InvalidArgumentError(f"{what}: offset {prev} is negative")
    for i in range(start + 1, start + n + 1):
        if offset(o32, o64, i) < prev:
            raise InvalidArgumentError(f"{what}: offsets decrease at row {i - start - 1}")
        prev = offset(o32, o64, i)
    if prev > end:
        raise InvalidArgumentError(f"{what}: offset {prev} beyond the {end} bytes or values there are")
    return 0


cdef int check_utf8(arr, const Strings *s, int64_t lo, int64_t hi, str what) except -1:
    """Rows lo .. hi - 1 of string array ``arr`` must be UTF-8, as Arrow promises and an
    array built from raw buffers need not be: one pass in C when they are ASCII, else
    pyarrow's full validation of those rows."""
    cdef int64_t j, a = offset(s.off32, s.off64, s.start + lo), b = offset(s.off32, s.off64, s.start + hi)
    cdef uint8_t high = 0
    for j in range(a, b):   # (no early exit: it vectorizes)
        high |= <uint8_t>s.data[j]
    if high & 0x80:
        import pyarrow as pa
        try:
            arr.slice(lo, hi - lo).validate(full=True)
        except pa.ArrowInvalid as e:
            raise InvalidArgumentError(f"{what}: {e}") from None
    return 0


cdef const char *_EMPTY = ""   # the data of an array with no bytes: not NULL, which means a null


cdef class StringsView:
    """``Strings`` over a pyarrow string, large_string or dictionary<string> array (kept
    alive with its dictionary's view), whose rows ``lo`` .. ``hi`` - 1 (all: hi < 0) will be
    read: their offsets or indices are checked."""
    cdef Strings s
    cdef object arr
    cdef StringsView dictionary

    def __init__(self, arr, str what, int64_t lo=0, int64_t hi=-1):
        import pyarrow as pa
        cdef int64_t i, j, n = len(arr), k
        hi = n if hi < 0 else hi
        t = arr.type
        self.arr = arr
        self.s.start, self.s.length = arr.offset, n
        if pa.types.is_dictionary(t):
            self.dictionary = StringsView(arr.dictionary, what)
            if self.dictionary.s.idx != NULL:
                raise InvalidArgumentTypeError(f"{what}: an Arrow column of {t} where strings are due")
            self.s.values = &self.dictionary.s
            self.s.idx_size, self.s.idx_signed = t.index_type.bit_width // 8, pa.types.is_signed_integer(t.index_type)
            valid, idx = arr.buffers()[:2]
            self.s.valid = _address(valid, (self.s.start + n + 7) // 8, what) if arr.null_count else NULL
            self.s.idx = _address(idx, (self.s.start + n) * self.s.idx_size, what)
            k = len(arr.dictionary)
            for i in range(self.s.start + lo, self.s.start + hi):
                if bit(self.s.valid, i):
                    j = index_at(&self.s, i)
                    if j < 0 or j >= k:
                        raise InvalidArgumentError(f"{what}: row {i - self.s.start}: dictionary index {j} "
                                                   f"out of {k}")
            return
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise InvalidArgumentTypeError(f"{what}: an Arrow column of {t} where strings are due")
        valid, off, data = arr.buffers()
        width = 8 if pa.types.is_large_string(t) else 4
        self.s.valid = _address(valid, (self.s.start + n + 7) // 8, what) if arr.null_count else NULL
        if width == 4:
            self.s.off32 = <const int32_t *>_address(off, (self.s.start + n + 1) * 4 if n else 0, what)
        else:
            self.s.off64 = <const int64_t *>_address(off, (self.s.start + n + 1) * 8 if n else 0, what)
        self.s.data = <const char *>_address(data, 0, what) if data is not None and data.size else _EMPTY
        if hi > lo:
            check_offsets(self.s.off32, self.s.off64, self.s.start + lo, hi - lo, data.size if data is not None else 0, what)
            check_utf8(arr, &self.s, lo, hi, what)


cdef class ListsView:
    """``Lists`` over a pyarrow list or large_list of strings, or a strings array (lists of
    one; the only kind taken when ``strings_only``); for a map<string, string> array, the
    names (and ``items``, the values)."""
    cdef Lists l
    cdef object arr
    cdef StringsView strings, items

    def __init__(self, arr, str what, bint strings_only=False):
        import pyarrow as pa
        cdef int64_t n = len(arr), lo = 0, hi = 0
        t = arr.type
        self.arr = arr
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t)):
            self.strings = StringsView(arr, what)
            self.l.s = self.strings.s
            return
        if strings_only:
            raise InvalidArgumentTypeError(f"{what}: an Arrow column of {t} where strings are due")
        self.l.start = arr.offset
        valid, off = arr.buffers()[:2]
        self.l.valid = _address(valid, (self.l.start + n + 7) // 8, what) if arr.null_count else NULL
        if n:   # (an empty array may have no offsets: none is read)
            if pa.types.is_large_list(t):
                self.l.off64 = <const int64_t *>_address(off, (self.l.start + n + 1) * 8, what)
            else:
                self.l.off32 = <const int32_t *>_address(off, (self.l.start + n + 1) * 4, what)
            check_offsets(self.l.off32, self.l.off64, self.l.start, n, len(arr.values), what)
            lo, hi = offset(self.l.off32, self.l.off64, self.l.start), offset(self.l.off32, self.l.off64,
                                                                             self.l.start + n)
        if pa.types.is_map(t):   # (only the strings the rows hold are read, and checked)
            self.strings = StringsView(arr.values.field(0), f"{what} names", lo, hi)
            self.items = StringsView(arr.values.field(1), f"{what} values", lo, hi)
        else:
            self.strings = StringsView(arr.values, what, lo, hi)
        self.l.s = self.strings.s


cdef enum:
    TOPICS_MOST = 256     # topics topic_ids matches in C (more: pyarrow's dictionary_encode)


def topic_ids(arr):
    """(distinct topics, each row's index into them as int32; None when there is one) of a
    pyarrow strings column; None when it holds more than TOPICS_MOST topics. A null topic is
    an InvalidArgumentError naming its row."""
    cdef StringsView v = StringsView(arr, "topic")
    cdef Py_ssize_t i, n = len(arr), k, found = 0, last = 0
    cdef int64_t length
    cdef const char *p
    cdef const char *seen[TOPICS_MOST]
    cdef int64_t seen_len[TOPICS_MOST]
    ids_a = np.empty(n, np.int32)
    cdef int32_t[::1] ids = ids_a
    for i in range(n):
        p = str_at(&v.s, i, &length)
        if p == NULL:
            raise InvalidArgumentError(f"put_arrow: row {i} has no topic")
        if found and seen_len[last] == length and memcmp(seen[last], p, length) == 0:
            ids[i] = last
            continue
        for k in range(found):
            if seen_len[k] == length and memcmp(seen[k], p, length) == 0:
                break
        else:
            if found == TOPICS_MOST:
                return None
            k = found
            seen[k], seen_len[k] = p, length
            found += 1
        ids[i] = last = k
    try:
        names = [seen[k][:seen_len[k]].decode() for k in range(found)]
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"put_arrow: a topic that is not UTF-8 ({e})") from None
    return names, ids_a if found > 1 else None


cdef enum Kind:          # where an entry's value comes from
    NULL_VALUE, DIRECT, JOINED


cdef struct Entry:       # one name of a row's properties dict
    const char *name
    const char *value    # DIRECT
    int64_t name_len, value_len
    Kind kind
    bint checked         # known to hold no separator
    int col              # JOINED: which of the UNIQ_KEY, TAGS, KEYS columns: its strings a .. b - 1,
    int64_t a, b         # joined by spaces


cdef int64_t find(Entry *e, int64_t start, int64_t end, const char *name, int64_t name_len) noexcept nogil:
    cdef int64_t k
    for k in range(start, end):
        if e[k].name_len == name_len and (name_len == 0 or e[k].name[0] == name[0]) \
                and memcmp(e[k].name, name, name_len) == 0:
            return k
    return -1


cdef inline bint clean(const char *p, int64_t n) noexcept nogil:
    """No \\x01 or \\x02 separator in ``p[:n]`` (a loop: the strings are short)."""
    cdef int64_t j
    for j in range(n):
        if <uint8_t>(p[j] - 1) < 2:
            return False
    return True


cdef bint clean_span(const char *p, int64_t n) noexcept nogil:
    """clean() for a column's bytes at once: a loop with no early exit, which vectorizes."""
    cdef int64_t j
    cdef uint8_t bad = 0
    for j in range(n):
        bad |= <uint8_t>(p[j] - 1) < 2
    return not bad


cdef bint all_clean(const Strings *s, int64_t lo, int64_t hi, bint nulls) noexcept nogil:
    """Whether rows lo .. hi - 1 of ``s`` hold no separator (and, unless ``nulls``, no null),
    judged on the bytes that hold them (of a dictionary, all its strings) at once. False is
    only a maybe (a separator that no row holds): callers then check row by row."""
    cdef int64_t i, n
    cdef const Strings *d = s.values if s.idx != NULL else s
    cdef int64_t a = d.start + (0 if s.idx != NULL else lo)
    cdef int64_t b = d.start + (d.length if s.idx != NULL else hi)
    if not nulls and (s.valid != NULL or d.valid != NULL):
        for i in range(lo, hi):
            if str_at(s, i, &n) == NULL:
                return False
    return hi <= lo or clean_span(d.data + offset(d.off32, d.off64, a),
                                  offset(d.off32, d.off64, b) - offset(d.off32, d.off64, a))


cdef tuple _NAMES = (b"UNIQ_KEY", b"TAGS", b"KEYS")


cdef bint constant(const Lists *l, int64_t n, const char **p, int64_t *length) noexcept nogil:
    """Whether every one of the ``n`` rows of ``l`` is the same one string (``p[0]``,
    ``length[0]``: it)."""
    cdef int64_t i, x, y, m
    cdef const char *q
    for i in range(n):
        q = str_at(&l.s, x, &m) if list_at(l, i, &x, &y) and y - x == 1 else NULL
        if q == NULL or i > 0 and (m != length[0] or memcmp(q, p[0], m) != 0):
            return False
        p[0], length[0] = q, m
    return n > 0


def arrow_rows(Py_ssize_t n, props=None, list columns=None, generate=None):
    """The properties column of ``n`` rows (see the module doc), read in place from pyarrow
    arrays: ``props`` None or a map<string, string> array; ``columns`` three of None or a
    strings or dictionary<strings> array (string columns of any offset width) for
    UNIQ_KEY, TAGS and KEYS, KEYS also a list of strings (joined by spaces; a strings
    column is lists of one); ``generate()`` a new UNIQ_KEY str (None: none generated).
    Strings must be UTF-8 (an array built from raw buffers is checked).

    Returns (data bytearray, int64 offsets, [(row, DELAY value bytes)] for the rows whose
    properties hold a DELAY value). InvalidArgumentError names the row of an empty name, a
    separator inside a name or value, or a null key in a KEYS list; InvalidArgumentTypeError
    a column of another type."""
    cdef Py_ssize_t i
    cdef int64_t k, j, c, a, total = 0, cap, row_len, widest = 0, name_len, value_len, x, y
    cdef ListsView entries = None
    cdef list views = [None, None, None]
    cdef Lists cols[3]
    cdef bint have[3]
    cdef bint col_ok[3]
    cdef bint entries_ok = False
    cdef const char *col_name[3]
    cdef int64_t col_name_len[3]
    cdef const char *name
    cdef const char *value
    cdef Entry *e = NULL
    cdef char *out
    cdef list delays = []
    cdef bytes prefix = b""
    columns = columns if columns is not None else [None, None, None]
    if len(columns) != 3:
        raise InvalidArgumentError("arrow_rows takes the UNIQ_KEY, TAGS and KEYS columns")
    if any(col is not None and len(col) != n for col in [props, *columns]):
        raise InvalidArgumentError(f"a column of another length than the batch's {n} rows")
    if props is not None:
        try:
            entries = ListsView(props, "properties")
        except InvalidArgumentTypeError:
            entries = None
        if entries is None or entries.items is None:
            raise InvalidArgumentTypeError(f"put_arrow: properties are {props.type}, not map<string, string>")
        for i in range(n):
            if list_at(&entries.l, i, &x, &y):
                widest = max(widest, y - x)
        if n:
            x, y = offset(entries.l.off32, entries.l.off64, entries.l.start), \
                offset(entries.l.off32, entries.l.off64, entries.l.start + n)
            entries_ok = all_clean(&entries.l.s, x, y, False) and all_clean(&entries.items.s, x, y, True)
    for c in range(3):
        col_name[c], col_name_len[c] = PyBytes_AS_STRING(_NAMES[c]), len(<bytes>_NAMES[c])
        have[c] = columns[c] is not None
        if have[c]:
            views[c] = ListsView(columns[c], _NAMES[c].decode(), c != 2)   # (KEYS may be lists, as put takes them)
            cols[c] = (<ListsView>views[c]).l
            if cols[c].off32 == NULL and cols[c].off64 == NULL:   # lists of one (or no row)
                col_ok[c] = all_clean(&cols[c].s, 0, n, True)
            else:
                if c == 2:
                    check_key_lists(&cols[c], n)
                col_ok[c] = all_clean(&cols[c].s, offset(cols[c].off32, cols[c].off64, cols[c].start),
                                      offset(cols[c].off32, cols[c].off64, cols[c].start + n), False)
    for c in range(3 if props is None else 0):   # leading columns of one string for every row: a prefix
        if not have[c]:
            continue
        if c == 0 or not col_ok[c] or not constant(&cols[c], n, &value, &value_len):
            break
        prefix += (b"\x02" if prefix else b"") + _NAMES[c] + b"\x01" + value[:value_len]
        have[c] = False
    offsets = np.zeros(n + 1, np.int64)
    cdef int64_t[::1] row_end = offsets
    cdef const char *prefix_p = prefix
    cdef int64_t prefix_len = len(prefix)
    cap = 64 * n + 64 + prefix_len * n
    e = <Entry *>malloc(sizeof(Entry) * (widest + 4))
    data = PyByteArray_FromStringAndSize(NULL, cap)   # laid out in place, then cut to size
    out = PyByteArray_AS_STRING(data)
    try:
        if e == NULL:
            raise MemoryError()
        for i in range(n):
            # the row's dict, in order: the map's names, then the columns', then a generated UNIQ_KEY
            k = 0
            if entries is not None and list_at(&entries.l, i, &x, &y):
                for j in range(x, y):
                    name = str_at(&entries.l.s, j, &name_len)
                    if name == NULL:    # before find: a null leaves name_len unset
                        raise InvalidArgumentError(f"row {i}: a property with a null name")
                    a = find(e, 0, k, name, name_len)
                    if a < 0:
                        a = k
                        k += 1
                        e[a].name, e[a].name_len = name, name_len
                    value = str_at(&entries.items.s, j, &value_len)
                    e[a].kind = DIRECT if value != NULL else NULL_VALUE
                    e[a].checked = entries_ok
                    e[a].value, e[a].value_len = value, value_len
            for c in range(3):
                if have[c] and list_at(&cols[c], i, &x, &y):
                    a = find(e, 0, k, col_name[c], col_name_len[c])
                    if a < 0:
                        a = k
                        k += 1
                        e[a].name, e[a].name_len = col_name[c], col_name_len[c]
                    e[a].checked = col_ok[c]
                    value = str_at(&cols[c].s, x, &value_len) if y - x == 1 else NULL
                    if value != NULL:   # one string: the value as it is
                        e[a].kind, e[a].value, e[a].value_len = DIRECT, value, value_len
                    else:
                        e[a].kind, e[a].col, e[a].a, e[a].b = JOINED, c, x, y
            if generate is not None:
                a = find(e, 0, k, b"UNIQ_KEY", 8)
                if a < 0:
                    a = k
                    k += 1
                    e[a].name = b"UNIQ_KEY"
                    e[a].name_len = 8
                    e[a].kind = NULL_VALUE
                if e[a].kind == NULL_VALUE or joined_len(cols, &e[a]) == 0:
                    key = generate()
                    key = key.encode() if type(key) is str else bytes(key)   # alive until the row is written
                    e[a].kind, e[a].value, e[a].value_len = DIRECT, PyBytes_AS_STRING(key), len(key)
                    e[a].checked = False
            # check and measure, then lay out
            row_len = prefix_len
            for a in range(k):
                if e[a].kind == NULL_VALUE:
                    continue
                if e[a].name_len == 0 or not e[a].checked and (not clean(e[a].name, e[a].name_len) or (
                        e[a].kind == DIRECT and not clean(e[a].value, e[a].value_len))):
                    raise InvalidArgumentError(f"row {i}: property {bytes(e[a].name[:e[a].name_len])!r}: empty name "
                                               "or a \\x01/\\x02 separator inside")
                if e[a].kind == JOINED:
                    if not e[a].checked:
                        check_joined(cols, &e[a], i)
                elif e[a].name_len == 5 and memcmp(e[a].name, b"DELAY", 5) == 0:
                    delays.append((i, e[a].value[:e[a].value_len]))
                row_len += (1 if row_len else 0) + e[a].name_len + 1 + joined_len(cols, &e[a])
            if total + row_len > cap:
                cap = max(2 * cap, total + row_len)
                PyByteArray_Resize(data, cap)
                out = PyByteArray_AS_STRING(data)
            copy_short(out + total, prefix_p, prefix_len)
            total += prefix_len
            for a in range(k):
                if e[a].kind == NULL_VALUE:
                    continue
                if total > row_end[i]:
                    out[total] = 2
                    total += 1
                copy_short(out + total, e[a].name, e[a].name_len)
                out[total + e[a].name_len] = 1
                total += e[a].name_len + 1
                if e[a].kind == DIRECT:
                    copy_short(out + total, e[a].value, e[a].value_len)
                    total += e[a].value_len
                else:
                    total = write_joined(out, total, cols, &e[a])
            row_end[i + 1] = total
        PyByteArray_Resize(data, total)
        return data, offsets, delays
    finally:
        free(e)


cdef int check_key_lists(const Lists *l, int64_t n) except -1:
    """InvalidArgumentError naming the row of an empty key, or one holding a space (the KEYS
    separator: "a b" would be read back, and indexed, as "a" and "b"), in a list of keys."""
    cdef int64_t i, j, x, y, m
    cdef const char *p
    for i in range(n):
        if list_at(l, i, &x, &y):
            for j in range(x, y):
                p = str_at(&l.s, j, &m)
                if p != NULL and (m == 0 or memchr(p, b' ', m) != NULL):
                    raise InvalidArgumentError(f"row {i}: key {p[:m].decode('utf-8', 'replace')!r} is empty or "
                                               "holds a space, the separator of KEYS")
    return 0


cdef int64_t joined_len(const Lists *cols, const Entry *e) noexcept nogil:
    """Bytes of an entry's value; of a JOINED one, its strings and a space between each two."""
    cdef int64_t j, n, total = 0
    if e.kind != JOINED:
        return e.value_len
    for j in range(e.a, e.b):
        if str_at(&cols[e.col].s, j, &n) != NULL:
            total += n
    return total + (e.b - e.a - 1 if e.b > e.a else 0)


cdef int check_joined(const Lists *cols, const Entry *e, Py_ssize_t i) except -1:
    cdef int64_t j, n
    cdef const char *p
    for j in range(e.a, e.b):
        p = str_at(&cols[e.col].s, j, &n)
        if p == NULL:
            raise InvalidArgumentTypeError(f"row {i}: a null in {_NAMES[e.col].decode()}")
        if not clean(p, n):
            raise InvalidArgumentError(f"row {i}: a {_NAMES[e.col].decode()} value holds a \\x01/\\x02 separator")
    return 0


cdef int64_t write_joined(char *out, int64_t pos, const Lists *cols, const Entry *e) noexcept nogil:
    cdef int64_t j, n
    cdef const char *p
    for j in range(e.a, e.b):
        if j > e.a:
            out[pos] = b' '
            pos += 1
        p = str_at(&cols[e.col].s, j, &n)
        copy_short(out + pos, p, n)
        pos += n
    return pos
