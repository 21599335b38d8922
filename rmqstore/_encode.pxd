# The commitlog record encoder's C face (see _encode.pyx), for the Appender.
from libc.stdint cimport int32_t, int64_t
from rmqstore._cext cimport rmq_release, rmq_st32
from rmqstore._layout cimport C_BLANK
from rmqstore._message cimport Message, PutResult
from rmqstore._segment cimport MappedSegment


cdef enum:
    NOGIL_BYTES = 1 << 18     # put_columns releases the GIL to write a batch of at least this many bytes,
    STAGE_BYTES = 1 << 20     # encoding runs of up to this many bytes in a buffer written with pwrite


cdef struct Rows:
    # put_columns' columns as C arrays, row i at index i (see Appender.put_columns)
    const char **body               # a sequence's bodies, or NULL: body_base + body_off[i]
    const int64_t *body_len
    const char *body_base
    const int64_t *body_off
    const char *props
    const int64_t *po
    const char *hosts
    const int64_t *ho
    const int64_t *flg
    const int64_t *sfl
    const int64_t *bts
    const int64_t *rct
    const int64_t *tids
    const int32_t *qids
    const int64_t *slots
    const int64_t *sizes
    int64_t *next_off               # next queue offset per (topic, queue) slot
    int64_t *qoffs
    int64_t *phys
    const char **topic
    const int64_t *tlen
    const char *store_host
    int32_t hlen, host_bits


cdef struct RecordHead:
    # the fields of a record that precede its body (positions as in DESIGN.md)
    int64_t phy, total, queue_offset, born_ts, store_ts, prepared
    int32_t queue_id, flag, sys_flag, reconsume
    int version


cdef inline void seal(char *p, int32_t total) noexcept nogil:
    """Write the TOTALSIZE of the record at ``p``, whole but for it (rmq_order.h): one a
    crash cut short reads as the end of the log (size 0), never as a record with zeros
    where its topic or properties belong."""
    rmq_release()
    rmq_st32(p, total)


cdef inline void write_blank(char *p, int32_t room) noexcept nogil:
    """The BLANK record that ends a segment with ``room`` (>= 8) bytes left, sealed."""
    rmq_st32(p + 4, C_BLANK)
    seal(p, room)


cdef bytes properties_bytes(dict props, bint *delayed=*)
cdef int64_t record_size(bytes born, str topic, Py_ssize_t plen, bytes store_host, int version, int64_t max_size,
                         int64_t seg_size, Py_ssize_t blen) except -1
cdef object held_body(object body)
cdef PutResult encode(MappedSegment seg, Message msg, object body, bytes born, str topic, bytes props,
                      int32_t queue_id, int64_t queue_offset, int64_t store_ts, bytes store_host, int version,
                      int64_t max_size, int64_t total=*)
cdef Py_ssize_t write_run(Rows *r, RecordHead *h, Py_ssize_t i, Py_ssize_t n, char *out, int64_t seg_base,
                          int64_t seg_size, int64_t *wpos, int64_t warm_mark) noexcept nogil
cdef int write_staged(Rows *r, RecordHead *h, Py_ssize_t i, Py_ssize_t n, char *stage, MappedSegment seg,
                      int64_t *wpos, int64_t warm_mark, Py_ssize_t *j) except -1
