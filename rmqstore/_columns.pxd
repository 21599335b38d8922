# The first pass every columnar decoder makes over a run of records.
from libc.stdint cimport int32_t, int64_t

cdef struct Extent:
    int64_t count           # valid records from the start
    int64_t end             # file position after them
    int64_t body_bytes      # their body, topic and properties bytes
    int64_t topic_bytes
    int64_t props_bytes
    int code                # REC_END, REC_BLANK or why the record at ``end`` is invalid
    int32_t blank_size      # TOTALSIZE of the BLANK record at ``end`` (code REC_BLANK)

cdef void measure(const char *base, int64_t pos, int64_t limit, bint check_crc, Extent *x) noexcept nogil
