# One commitlog record as every kernel reads it: the parsed view and its helpers.
from libc.stdint cimport int32_t, int64_t
from rmqstore._cext cimport rmq_java_hash
from rmqstore._layout cimport REC_END

cdef extern from *:
    void __builtin_prefetch(const void *p) nogil

cdef struct RecView:
    int32_t total
    int32_t magic
    int32_t body_crc
    int32_t queue_id
    int32_t flag
    int64_t queue_offset
    int64_t phy_offset
    int32_t sys_flag
    int64_t born_ts
    int32_t born_off      # relative to the record start
    int32_t born_len      # address bytes, 4 or 16 (port follows)
    int64_t store_ts
    int32_t store_off
    int32_t store_len
    int32_t reconsume
    int64_t prepared
    int32_t body_off
    int32_t body_len
    int32_t topic_off
    int32_t topic_len
    int32_t props_off
    int32_t props_len

cdef int parse_record(const char *p, int64_t avail, bint check_crc, RecView *r) noexcept nogil
cdef int32_t copy_crc(char *dst, const char *src, Py_ssize_t n) noexcept nogil
cdef str format_host(const char *p, int32_t alen)
cdef str make_msg_id(const char *host, int32_t alen, int64_t offset)
cdef dict parse_properties(const char *p, int32_t n)
cdef int find_property(const char *p, int32_t n, const char *name, int32_t nlen,
                       int32_t *voff, int32_t *vlen) noexcept nogil
cdef str status_text(int code, int64_t offset, RecView *r)
cdef int raise_status(int code, int64_t offset, RecView *r) except -1
cdef object status_of(int code)


cdef inline int parse_at(const char *base, int64_t size, int64_t limit, int64_t pos, bint check_crc,
                         RecView *r) noexcept nogil:
    """parse_record at ``pos`` of a mapping of ``size`` bytes published up to ``limit``."""
    if limit > size:
        limit = size
    if pos >= limit:   # past the published data: nothing is stored there (yet)
        return REC_END
    return parse_record(base + pos, limit - pos, check_crc, r)


cdef inline int64_t tags_code_of(const char *props, int32_t plen) noexcept nogil:
    """Consume-queue tags code: Java hashCode of the TAGS property (0 when absent)."""
    cdef int32_t voff = 0, vlen = 0
    if find_property(props, plen, b"TAGS", 4, &voff, &vlen):
        return rmq_java_hash(props + voff, vlen)
    return 0


cdef inline void prefetch_bytes(const char *base, int64_t pos, int64_t n, int64_t limit) noexcept nogil:
    """Start loading ``n`` bytes (512 at most) at ``base + pos`` into cache when they lie
    below ``limit``. A prefetch only hints: it reads nothing and cannot fault."""
    cdef int64_t k = 0
    if n <= 0 or pos < 0 or pos + n > limit:
        return
    while k < n and k < 512:
        __builtin_prefetch(base + pos + k)
        k += 64
