# cython: boundscheck=False, wraparound=False, cdivision=True
"""verify's kernel: the columns of a commitlog segment's messages (what consume queues and
index files are checked against), read in one pass over the mapping with the GIL released.
It copies no record bytes and takes the GIL back only for a topic it has not met before;
its arrays (megabytes: unmapping them takes a while) are freed with the GIL released too."""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp
import numpy as np
cimport numpy as cnp
from rmqstore._index_file cimport keys_of
from rmqstore._layout cimport DispatchRow, REC_OK, gets_cq_entry_c
from rmqstore._record cimport RecView, parse_record, tags_code_of
from rmqstore._segment cimport MappedSegment, let_go_behind, unpin

cnp.import_array()

cdef enum:
    TOPICS_SEEN = 16    # distinct topics numbered without the GIL

# The columns, in the order Columns holds their pointers.
ROW_COLUMNS = (("phy", np.int64), ("size", np.int32), ("queue_id", np.int32), ("queue_offset", np.int64),
               ("tags", np.int64), ("topic", np.int32), ("cq", np.bool_))
KEY_COLUMNS = (("key_hash", np.int32), ("key_phy", np.int64))


cdef struct Topics:     # the topics met last: where their bytes lie in the mapping, their numbers
    const char *at[TOPICS_SEEN]
    int32_t size[TOPICS_SEEN]
    int32_t number[TOPICS_SEEN]
    int n
    int last


cdef enum:              # columns: ROW_COLUMNS then KEY_COLUMNS, in order
    PHY, SIZE, QUEUE_ID, QUEUE_OFFSET, TAGS, TOPIC, CQ, KEY_HASH, KEY_PHY, NCOLUMNS


cdef struct Columns:    # the output arrays' data (by column), their capacities and fill
    void *data[NCOLUMNS]
    int64_t rows
    int64_t row_cap
    int64_t keys
    int64_t key_cap
    int64_t max_ts


cdef inline int32_t seen_topic(Topics *t, const char *p, int32_t n) noexcept nogil:
    """The number of the topic ``p[:n]`` when met lately (the last one first), else -1."""
    cdef int k, j
    for k in range(t.n):
        j = (t.last + k) % t.n
        if t.size[j] == n and memcmp(t.at[j], p, n) == 0:
            t.last = j
            return t.number[j]
    return -1


cdef inline void remember_topic(Topics *t, const char *p, int32_t n, int32_t number) noexcept nogil:
    """Keep ``p[:n]``'s number (once TOPICS_SEEN are kept, over the one after the last met)."""
    cdef int j = t.n if t.n < TOPICS_SEEN else (t.last + 1) % TOPICS_SEEN
    t.n = max(t.n, j + 1)
    t.at[j], t.size[j], t.number[j], t.last = p, n, number, j


cdef int32_t new_topic(const char *p, int32_t n, dict numbers, list names) except -1:
    """The number of topic ``p[:n]`` in ``names`` (appended, decoded, when new)."""
    key = PyBytes_FromStringAndSize(p, n)
    number = numbers.get(key)
    if number is None:
        number = numbers[key] = len(names)
        names.append(key.decode("utf-8", "replace"))
    return number


cdef inline void put_row(Columns *c, const char *p, const RecView *r, int64_t phy, int32_t topic) noexcept nogil:
    """Row ``c.rows`` from the record at ``p`` (commitlog offset ``phy``)."""
    cdef int64_t i = c.rows
    (<int64_t *>c.data[PHY])[i] = phy
    (<int32_t *>c.data[SIZE])[i] = r.total
    (<int32_t *>c.data[QUEUE_ID])[i] = r.queue_id
    (<int64_t *>c.data[QUEUE_OFFSET])[i] = r.queue_offset
    (<int64_t *>c.data[TAGS])[i] = tags_code_of(p + r.props_off, r.props_len)
    (<int32_t *>c.data[TOPIC])[i] = topic
    (<uint8_t *>c.data[CQ])[i] = gets_cq_entry_c(r.sys_flag)
    c.max_ts = max(c.max_ts, r.store_ts)
    c.rows += 1


cdef inline int64_t put_keys(Columns *c, const char *p, const RecView *r, int64_t phy) noexcept nogil:
    """The record's index keys at ``c.keys`` on; how many."""
    cdef DispatchRow d
    d.phy_offset, d.sys_flag, d.store_timestamp = phy, r.sys_flag, r.store_ts
    d.topic_off, d.topic_len, d.props_off, d.props_len = r.topic_off, r.topic_len, r.props_off, r.props_len
    return keys_of(p, r.total, &d, <int32_t *>c.data[KEY_HASH] + c.keys, <int64_t *>c.data[KEY_PHY] + c.keys,
                   NULL)


cdef int point(Columns *c, dict cols) except -1:
    """Point ``c`` at the arrays of ``cols`` (after they are made or grown)."""
    cdef int j
    for j, (name, _) in enumerate(ROW_COLUMNS + KEY_COLUMNS):
        c.data[j] = cnp.PyArray_DATA(cols[name])
    return 0


cdef void free_released(object capsule) noexcept:
    """Capsule destructor: free the memory of an ``empty`` array with the GIL released."""
    cdef void *p = PyCapsule_GetPointer(capsule, NULL)
    with nogil:
        free(p)


def empty(Py_ssize_t n, dtype):
    """An uninitialised 1-d array of ``n`` values of ``dtype`` whose memory is freed with
    the GIL released (np.empty frees it holding the GIL)."""
    dt = np.dtype(dtype)
    cdef cnp.npy_intp dims = n
    cdef void *p = malloc(max(n, 1) * dt.itemsize)
    if p == NULL:
        raise MemoryError()
    try:
        owner = PyCapsule_New(p, NULL, free_released)
    except BaseException:
        free(p)
        raise
    arr = cnp.PyArray_SimpleNewFromData(1, &dims, dt.num, p)
    cnp.set_array_base(arr, owner)
    return arr


def _grow(dict cols, spec, Py_ssize_t used, Py_ssize_t cap):
    """Give the columns of ``spec`` room for ``cap`` values, keeping the first ``used``."""
    for name, dtype in spec:
        grown = empty(cap, dtype)
        grown[:used] = cols[name][:used]
        cols[name] = grown


def segment_columns(MappedSegment seg not None, int64_t end, Py_ssize_t count, dict numbers not None,
                    list names not None, bint with_keys, bint let_go=False):
    """The messages of ``seg`` in ``[0, end)`` (about ``count`` of them: room is made for
    more), up to the first record that does not parse (BLANK, end of data), as columns:
    ``phy`` (commitlog offset), ``size``, ``queue_id``, ``queue_offset``, ``tags`` (tags
    code of the properties), ``topic`` (its number in ``names``: a new topic is decoded,
    appended and numbered in ``numbers``, its bytes -> number), ``cq`` (gets a consume-queue
    entry: not PREPARED or ROLLBACK) and, ``with_keys``, every index key's ``key_hash`` /
    ``key_phy`` in dispatch order. Body CRCs are not checked. Returns (dict of arrays,
    newest store timestamp or 0). ``let_go``: the pages read leave the resident set behind
    the scan (see MappedSegment.let_go)."""
    cdef Columns c
    cdef Topics seen
    cdef RecView r
    cdef int64_t pos = 0, limit, phy, held = 0
    cdef int32_t topic
    cdef bint more = True
    cdef const char *p
    count = max(count, 16)
    cols = {name: empty(count, dtype) for name, dtype in ROW_COLUMNS}
    cols.update({name: empty(count * 2 if with_keys else 0, dtype) for name, dtype in KEY_COLUMNS})
    c.rows = c.keys = c.max_ts = 0
    c.row_cap, c.key_cap = count, len(cols["key_hash"])
    seen.n = seen.last = 0
    limit = seg.pin_range(0, end)
    try:
        while more:
            point(&c, cols)
            with nogil:
                more = False
                while pos < limit:
                    p = seg.m.base + pos
                    if parse_record(p, limit - pos, False, &r) != REC_OK:
                        break
                    if c.rows == c.row_cap or (with_keys and c.keys + r.props_len // 2 + 2 > c.key_cap):
                        more = True     # no room for this record's row or its most keys
                        break
                    phy = seg.base_offset + pos
                    topic = seen_topic(&seen, p + r.topic_off, r.topic_len)
                    if topic < 0:
                        with gil:
                            topic = new_topic(p + r.topic_off, r.topic_len, numbers, names)
                        remember_topic(&seen, p + r.topic_off, r.topic_len, topic)
                    if with_keys:
                        c.keys += put_keys(&c, p, &r, phy)
                    put_row(&c, p, &r, phy, topic)
                    pos += r.total
                    if let_go:
                        held = let_go_behind(seg, held, pos, False)
                if let_go:
                    held = let_go_behind(seg, held, pos, True)
            if more:
                if c.rows == c.row_cap:
                    c.row_cap *= 2
                    _grow(cols, ROW_COLUMNS, c.rows, c.row_cap)
                if with_keys and c.keys + r.props_len // 2 + 2 > c.key_cap:
                    c.key_cap = 2 * c.key_cap + r.props_len // 2 + 2
                    _grow(cols, KEY_COLUMNS, c.keys, c.key_cap)
    finally:
        unpin(seg)
    for name, _ in ROW_COLUMNS:
        cols[name] = cols[name][:c.rows]
    for name, _ in KEY_COLUMNS:
        cols[name] = cols[name][:c.keys]
    return cols, c.max_ts
