# One commitlog record as every kernel reads it: the parsed view and its helpers.
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memchr, memcmp
from rmqstore._cext cimport rmq_crc32, rmq_java_hash, rmq_ld16, rmq_ld32, rmq_ld64, rmq_prefetch
from rmqstore._layout cimport *

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

cdef struct IndexProps:   # the properties dispatch reads: offsets into the properties string, length 0 for none
    int32_t tags_off
    int32_t tags_len
    int32_t uniq_off
    int32_t uniq_len
    int32_t keys_off
    int32_t keys_len

cdef str format_host(const char *p, int32_t alen)
cdef str make_msg_id(const char *host, int32_t alen, int64_t offset)
cdef dict parse_properties(const char *p, int32_t n)
cdef int find_property(const char *p, int32_t n, const char *name, int32_t nlen,
                       int32_t *voff, int32_t *vlen) noexcept nogil
cdef str status_text(int code, int64_t offset, RecView *r)
cdef int raise_status(int code, int64_t offset, RecView *r) except -1
cdef object status_of(int code)


# parse_record and body_crc are defined here, inline, because every record walk (scans,
# dispatch, columns, Arrow) calls them once per record from its own module.

cdef inline int32_t body_crc(const char *p, int64_t n) noexcept nogil:
    return <int32_t>(rmq_crc32(0, p, <size_t>n) & 0x7FFFFFFF)


cdef inline int parse_record(const char *p, int64_t avail, bint check_crc, RecView *r) noexcept nogil:
    """Validate and index the record at p (avail bytes readable). Pure C, no allocation."""
    cdef int64_t pos
    cdef int64_t i
    if avail < 8:
        for i in range(avail):
            if p[i] != 0:
                return REC_SHORT
        return REC_END
    r.total = rmq_ld32(p + AT_TOTAL)
    r.magic = rmq_ld32(p + AT_MAGIC)
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
    r.body_crc = rmq_ld32(p + AT_BODY_CRC)
    r.queue_id = rmq_ld32(p + AT_QUEUE_ID)
    r.flag = rmq_ld32(p + AT_FLAG)
    r.queue_offset = rmq_ld64(p + AT_QUEUE_OFFSET)
    r.phy_offset = rmq_ld64(p + AT_PHY_OFFSET)
    r.sys_flag = rmq_ld32(p + AT_SYS_FLAG)
    r.born_ts = rmq_ld64(p + AT_BORN_TS)
    r.born_off = AT_BORN_HOST
    r.born_len = 16 if r.sys_flag & BORN_V6 else 4
    pos = AT_BORN_HOST + r.born_len + 4
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


cdef inline int parse_at(const char *base, int64_t size, int64_t limit, int64_t pos, bint check_crc,
                         RecView *r) noexcept nogil:
    """parse_record at ``pos`` of a mapping of ``size`` bytes published up to ``limit``."""
    if limit > size:
        limit = size
    if pos >= limit:   # past the published data: nothing is stored there (yet)
        return REC_END
    return parse_record(base + pos, limit - pos, check_crc, r)


cdef inline int at_offset(const char *base, int64_t limit, int64_t pos, int64_t offset, int code) noexcept nogil:
    """``code``, parse_at's status at file position ``pos`` (commitlog ``offset``) of a mapping
    written up to ``limit``, or REC_NOTSTART when no record can start there: what is there
    is invalid, says it is elsewhere, or reads as end of data below ``limit``, and its
    PHYSICALOFFSET bytes do not name ``offset``. So a caller's offset into the middle of a
    record reads as a wrong offset, while a record that names its own place but is
    damaged stays a corrupt one. ``limit`` 0: where data ends is not known."""
    if code == REC_OK or code == REC_BLANK or code == REC_NOSEG or (code == REC_END and pos >= limit):
        return code
    if pos + AT_PHY_OFFSET + 8 <= limit and rmq_ld64(base + pos + AT_PHY_OFFSET) == offset and code != REC_PLACE:
        return code
    return REC_NOTSTART


cdef inline void index_props(const char *p, int32_t n, IndexProps *out) noexcept nogil:
    """find_property of TAGS, UNIQ_KEY and KEYS in one pass over the pairs (dispatch reads
    all three of every record): each found with a non-empty value, the last one winning."""
    cdef int32_t i = 0, j
    cdef const char *q
    out.tags_len = out.uniq_len = out.keys_len = 0
    while i < n:
        q = <const char *>memchr(p + i, 2, n - i)
        j = <int32_t>(q - p) if q != NULL else n
        if j - i > 5 and p[i + 4] == 1:
            if memcmp(p + i, b"TAGS", 4) == 0:
                out.tags_off, out.tags_len = i + 5, j - i - 5
            elif memcmp(p + i, b"KEYS", 4) == 0:
                out.keys_off, out.keys_len = i + 5, j - i - 5
        elif j - i > 9 and p[i + 8] == 1 and memcmp(p + i, b"UNIQ_KEY", 8) == 0:
            out.uniq_off, out.uniq_len = i + 9, j - i - 9
        i = j + 1


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
        rmq_prefetch(base + pos + k)
        k += 64
