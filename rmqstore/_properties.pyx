# cython: boundscheck=False, wraparound=False, cdivision=True
"""Properties columns for ``put_columns`` / ``put_arrow``: each row's properties string laid
out as a record stores it (``name\\x01value`` pairs joined by ``\\x02``), built in one C
pass over the columns, with no Python object per message.

``arrow_rows`` gives Arrow columns the semantics of ``Message``: a properties map read as a
dict (a repeated name keeps its first place and takes its last value; a null value is not
written), then UNIQ_KEY, TAGS and KEYS columns set into it (in place when the map has the
name, else appended), then a generated UNIQ_KEY for a row that has none or an empty one,
as the store's ``generate_uniq_key`` stamps ``put``'s messages."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy
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

cdef struct Strings:     # an Arrow string array: row i is data[off[i]:off[i + 1]] when valid[i]
    const int64_t *off
    const char *data
    const uint8_t *valid


cdef struct Lists:       # rows of strings (a list array; a string array is lists of one)
    const int64_t *off   # row i holds strings off[i] .. off[i + 1] - 1 of s
    const uint8_t *valid
    Strings s


cdef enum Kind:          # where an entry's value comes from
    NULL_VALUE, DIRECT, JOINED


cdef struct Entry:       # one name of a row's properties dict
    const char *name
    const char *value    # DIRECT
    int64_t name_len, value_len
    Kind kind
    int col              # JOINED: which of the UNIQ_KEY, TAGS, KEYS columns (values joined by spaces)


cdef class _Held:
    """The numpy arrays behind the C views, kept alive for the call."""
    cdef list arrays

    def __cinit__(self):
        self.arrays = []

    cdef const void *keep(self, object a, object dtype) except NULL:
        cdef const uint8_t[::1] v
        a = np.ascontiguousarray(a, dtype=dtype)
        self.arrays.append(a)
        v = a.view(np.uint8).reshape(-1)
        return &v[0] if v.shape[0] else <const void *>b""

    cdef int strings(self, Strings *s, tuple col, Py_ssize_t rows) except -1:
        """``col`` = (int64 offsets of ``rows + 1``, data bytes, uint8 validity of ``rows``)."""
        off, data, valid = col
        off = np.ascontiguousarray(off, dtype=np.int64)
        if off.shape != (rows + 1,) or np.asarray(valid).shape != (rows,):
            raise InvalidArgumentError(f"a strings column needs {rows + 1} offsets and {rows} validity flags")
        if rows and (off[0] < 0 or off[rows] > len(data) or np.any(np.diff(off) < 0)):
            raise InvalidArgumentError("string offsets must not decrease and must lie within the data")
        s.off = <const int64_t *>self.keep(off, np.int64)
        s.data = <const char *>self.keep(np.frombuffer(data, np.uint8) if len(data) else np.zeros(0, np.uint8), np.uint8)
        s.valid = <const uint8_t *>self.keep(valid, np.uint8)
        return 0


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


cdef tuple _NAMES = (b"UNIQ_KEY", b"TAGS", b"KEYS")


def arrow_rows(Py_ssize_t n, tuple props=None, list columns=None, generate=None):
    """The properties column of ``n`` rows (see the module doc), from numpy views of Arrow
    arrays: ``props`` None or (row offsets into the entries (n + 1), row validity (n),
    names (offsets, data, validity), values (offsets, data, validity)); ``columns`` three
    of None or (list offsets (n + 1), list validity (n), strings (offsets, data, validity))
    for UNIQ_KEY, TAGS and KEYS (the strings of a row joined by spaces; a string column is
    lists of one); ``generate()`` a new UNIQ_KEY str (None: none generated).

    Returns (data bytes, int64 offsets, [(row, DELAY value bytes)] for the rows whose
    properties hold a DELAY value). InvalidArgumentError names the row of an empty name, a
    separator inside a name or value, or a null key in a KEYS list."""
    cdef Py_ssize_t i
    cdef int64_t m = 0, k, j, c, a, total = 0, cap, row_len, widest = 0
    cdef _Held held = _Held()
    cdef Strings names, values
    cdef Lists cols[3]
    cdef bint have[3]
    cdef const char *col_name[3]
    cdef int64_t col_name_len[3]
    cdef const int64_t *entry_off = NULL
    cdef const uint8_t *entry_valid = NULL
    cdef Entry *e = NULL
    cdef char *out = NULL
    cdef char *grown
    cdef list delays = []
    columns = columns if columns is not None else [None, None, None]
    if len(columns) != 3:
        raise InvalidArgumentError("arrow_rows takes the UNIQ_KEY, TAGS and KEYS columns")
    if props is not None:
        row_off, row_valid, name_col, value_col = props
        row_off = np.ascontiguousarray(row_off, dtype=np.int64)
        if row_off.shape != (n + 1,) or np.asarray(row_valid).shape != (n,):
            raise InvalidArgumentError(f"properties need {n + 1} row offsets and {n} validity flags")
        if n and (row_off[0] < 0 or np.any(np.diff(row_off) < 0)):
            raise InvalidArgumentError("property row offsets must not decrease")
        m = int(row_off[n]) if n else 0
        widest = int(np.diff(row_off).max()) if n else 0
        entry_off = <const int64_t *>held.keep(row_off, np.int64)
        entry_valid = <const uint8_t *>held.keep(row_valid, np.uint8)
        held.strings(&names, name_col, m)
        held.strings(&values, value_col, m)
    for c in range(3):
        col_name[c], col_name_len[c] = PyBytes_AS_STRING(_NAMES[c]), len(<bytes>_NAMES[c])
        have[c] = columns[c] is not None
        if have[c]:
            list_off, list_valid, strings = columns[c]
            list_off = np.ascontiguousarray(list_off, dtype=np.int64)
            if list_off.shape != (n + 1,) or np.asarray(list_valid).shape != (n,) \
                    or (n and (list_off[0] < 0 or np.any(np.diff(list_off) < 0))):
                raise InvalidArgumentError(f"{_NAMES[c].decode()}: {n + 1} non-decreasing list offsets "
                                           f"and {n} validity flags are due")
            cols[c].off = <const int64_t *>held.keep(list_off, np.int64)
            cols[c].valid = <const uint8_t *>held.keep(list_valid, np.uint8)
            held.strings(&cols[c].s, strings, int(list_off[n]) if n else 0)
    offsets = np.zeros(n + 1, np.int64)
    cdef int64_t[::1] row_end = offsets
    cap = 64 * n + 64
    e = <Entry *>malloc(sizeof(Entry) * (widest + 4))
    out = <char *>malloc(cap)
    try:
        if e == NULL or out == NULL:
            raise MemoryError()
        for i in range(n):
            # the row's dict, in order: the map's names, then the columns', then a generated UNIQ_KEY
            k = 0
            if entry_off != NULL and entry_valid[i]:
                for j in range(entry_off[i], entry_off[i + 1]):
                    a = find(e, 0, k, names.data + names.off[j], names.off[j + 1] - names.off[j])
                    if a < 0:
                        a = k
                        k += 1
                        e[a].name, e[a].name_len = names.data + names.off[j], names.off[j + 1] - names.off[j]
                    e[a].kind = DIRECT if values.valid[j] else NULL_VALUE
                    e[a].value, e[a].value_len = values.data + values.off[j], values.off[j + 1] - values.off[j]
            for c in range(3):
                if have[c] and cols[c].valid[i]:
                    a = find(e, 0, k, col_name[c], col_name_len[c])
                    if a < 0:
                        a = k
                        k += 1
                        e[a].name, e[a].name_len = col_name[c], col_name_len[c]
                    e[a].kind, e[a].col = JOINED, c
            if generate is not None:
                a = find(e, 0, k, b"UNIQ_KEY", 8)
                if a < 0:
                    a = k
                    k += 1
                    e[a].name = b"UNIQ_KEY"
                    e[a].name_len = 8
                    e[a].kind = NULL_VALUE
                if e[a].kind == NULL_VALUE or joined_len(cols, &e[a], i) == 0:
                    key = generate()
                    key = key.encode() if type(key) is str else bytes(key)   # alive until the row is written
                    e[a].kind, e[a].value, e[a].value_len = DIRECT, PyBytes_AS_STRING(key), len(key)
            # check and measure, then lay out
            row_len = 0
            for a in range(k):
                if e[a].kind == NULL_VALUE:
                    continue
                if e[a].name_len == 0 or not clean(e[a].name, e[a].name_len) or \
                        (e[a].kind == DIRECT and not clean(e[a].value, e[a].value_len)):
                    raise InvalidArgumentError(f"row {i}: property {bytes(e[a].name[:e[a].name_len])!r}: empty name "
                                               "or a \\x01/\\x02 separator inside")
                if e[a].kind == JOINED:
                    check_joined(cols, &e[a], i)
                elif e[a].name_len == 5 and memcmp(e[a].name, b"DELAY", 5) == 0:
                    delays.append((i, e[a].value[:e[a].value_len]))
                row_len += (1 if row_len else 0) + e[a].name_len + 1 + joined_len(cols, &e[a], i)
            if total + row_len > cap:
                cap = max(2 * cap, total + row_len)
                grown = <char *>realloc(out, cap)
                if grown == NULL:
                    raise MemoryError()
                out = grown
            for a in range(k):
                if e[a].kind == NULL_VALUE:
                    continue
                if total > row_end[i]:
                    out[total] = 2
                    total += 1
                memcpy(out + total, e[a].name, e[a].name_len)
                out[total + e[a].name_len] = 1
                total += e[a].name_len + 1
                if e[a].kind == DIRECT:
                    memcpy(out + total, e[a].value, e[a].value_len)
                    total += e[a].value_len
                else:
                    total = write_joined(out, total, cols, &e[a], i)
            row_end[i + 1] = total
        return PyBytes_FromStringAndSize(out, total), offsets, delays
    finally:
        free(e)
        free(out)


cdef int64_t joined_len(Lists *cols, Entry *e, Py_ssize_t i) noexcept:
    """Bytes of an entry's value; of a JOINED one, the row's strings and a space between
    each two."""
    cdef Lists *l
    cdef int64_t a, b
    if e.kind != JOINED:
        return e.value_len
    l = &cols[e.col]
    a, b = l.off[i], l.off[i + 1]
    return (l.s.off[b] - l.s.off[a]) + (b - a - 1 if b > a else 0)


cdef int check_joined(Lists *cols, Entry *e, Py_ssize_t i) except -1:
    cdef Lists *l = &cols[e.col]
    cdef int64_t j
    for j in range(l.off[i], l.off[i + 1]):
        if not l.s.valid[j]:
            raise InvalidArgumentTypeError(f"row {i}: a null in {_NAMES[e.col].decode()}")
        if not clean(l.s.data + l.s.off[j], l.s.off[j + 1] - l.s.off[j]):
            raise InvalidArgumentError(f"row {i}: a {_NAMES[e.col].decode()} value holds a \\x01/\\x02 separator")
    return 0


cdef int64_t write_joined(char *out, int64_t pos, Lists *cols, Entry *e, Py_ssize_t i) noexcept:
    cdef Lists *l = &cols[e.col]
    cdef int64_t j
    for j in range(l.off[i], l.off[i + 1]):
        if j > l.off[i]:
            out[pos] = b' '
            pos += 1
        memcpy(out + pos, l.s.data + l.s.off[j], l.s.off[j + 1] - l.s.off[j])
        pos += l.s.off[j + 1] - l.s.off[j]
    return pos
