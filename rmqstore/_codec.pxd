# The record view and decoder other kernels (_index) read commitlog records with.
from libc.stdint cimport int32_t, int64_t

# sys_flag bits every kernel tests: the transaction type is (sys_flag & TRANSACTION_MASK).
cdef enum:
    TRANSACTION_MASK = 0xC
    TRAN_PREPARED = 0x4
    TRAN_ROLLBACK = 0xC

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

cdef class MessageExt:
    cdef bytes _raw
    cdef RecView r
    cdef object _topic, _props, _body
    cdef readonly int64_t store_offset   # where the record was read (== phy_offset when sane)

cdef int parse_record(const char *p, int64_t avail, bint check_crc, RecView *r) noexcept nogil
cdef MessageExt build_ext(const char *p, RecView *r, int64_t store_offset)
cdef int record_at(list segs, int64_t offset, bint check_crc, RecView *r, const char **p) except -100
cdef int raise_read_error(int code, int64_t offset, RecView *r) except -1
cdef void prefetch_at(list segs, int64_t offset) noexcept
cdef int find_property(const char *p, int32_t n, const char *name, int32_t nlen,
                       int32_t *voff, int32_t *vlen) noexcept nogil
