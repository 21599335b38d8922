# The passes every columnar decoder makes: measuring a run of records, and filling the columns.
from libc.stdint cimport int32_t, int64_t, uint8_t
from rmqstore._record cimport RecView

cdef struct Extent:
    int64_t count           # valid records from the start
    int64_t end             # file position after them
    int64_t body_bytes      # their body, topic and properties bytes
    int64_t topic_bytes
    int64_t props_bytes
    int code                # REC_END, REC_BLANK or why the record at ``end`` is invalid
    int32_t blank_size      # TOTALSIZE of the BLANK record at ``end`` (code REC_BLANK)

cdef void measure(const char *base, int64_t pos, int64_t limit, bint check_crc, Extent *x) noexcept nogil


cdef struct Cols:           # where the next row of decode_batch's columns goes
    int64_t *f[15]          # BATCH_FIELDS, in order
    int64_t *o_body
    int64_t *o_topic
    int64_t *o_props
    uint8_t *a_born
    uint8_t *a_store
    char *bd
    char *td
    char *pd
    int64_t bo, to, po      # bytes of body/topic/props data filled so far

cdef dict new_columns(int64_t n, int64_t body_total, int64_t topic_total, int64_t props_total)
cdef void cols_of(dict out, Cols *c) except *
cdef void fill_at(Cols *c, int64_t i, const char *p, RecView *r) noexcept nogil
cdef void reserve_data(dict out, Cols *c, int64_t body, int64_t topic, int64_t props) except *
cdef void trim(dict out, int64_t n, const Cols *c) except *
