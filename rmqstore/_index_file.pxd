# The index file's layout and the kernels other modules call: lookups (_index), the check
# (_index_check), verify's column pass (_verify) and the native dispatch loop (_reput).
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memchr
from rmqstore._cext cimport rmq_java_hash, rmq_java_hash_from
from rmqstore._layout cimport DispatchRow
from rmqstore._record cimport IndexProps
from rmqstore._segment cimport MappedSegment

cdef enum:
    HDR = 40    # header bytes; the slots follow


cdef inline int32_t index_abs(int32_t h) noexcept nogil:
    """abs of a key's Java hashCode, 0 for Integer.MIN_VALUE (IndexFile.indexKeyHashMethod)."""
    if h == <int32_t>0x80000000:
        return 0
    return -h if h < 0 else h


cdef inline int32_t index_hash(const char *s, Py_ssize_t n) noexcept nogil:
    """The index hash of a UTF-8 key."""
    return index_abs(rmq_java_hash(s, n))


cdef inline uint32_t topic_prefix(const char *topic, Py_ssize_t tlen) noexcept nogil:
    """Java hashCode of ``topic + "#"``, where every index key of the topic starts (topic_key_hash)."""
    return <uint32_t>rmq_java_hash(topic, tlen) * 31 + 35


cdef inline int32_t topic_key_hash(uint32_t prefix, const char *key, Py_ssize_t klen) noexcept nogil:
    """The index hash of ``topic#key`` from its topic's ``prefix`` (topic_prefix), the key not
    copied after the topic."""
    return index_abs(rmq_java_hash_from(prefix, key, klen))


cdef inline Py_ssize_t token_end(const char *p, Py_ssize_t i, Py_ssize_t end) noexcept nogil:
    """End of the KEYS token starting at ``i`` (the next space, or ``end``)."""
    cdef const char *q = NULL
    if i < end:
        q = <const char *>memchr(p + i, b' ', <size_t>(end - i))
    return end if q == NULL else q - p


cdef int32_t build_hash(const char *topic, Py_ssize_t tlen, const char *key, Py_ssize_t klen,
                        char *buf) noexcept nogil
cdef int check_geometry(MappedSegment seg, int64_t slots, int64_t entries) except -1
cdef int64_t keys_of(const char *raw, int64_t nraw, const DispatchRow *d,
                     int32_t *hashes, int64_t *phys, int64_t *tss) noexcept nogil
cdef int64_t keys_at(uint32_t prefix, const char *props, const IndexProps *ip, int64_t phy,
                     int64_t ts, int32_t *hashes, int64_t *phys, int64_t *tss) noexcept nogil
cdef Py_ssize_t put_keys(char *b, int32_t slots, int32_t entries, const int32_t *hashes, const int64_t *phys,
                         const int64_t *tss, Py_ssize_t i, Py_ssize_t n) noexcept nogil
