# The message classes the read and append kernels build.
from libc.stdint cimport int32_t, int64_t
from rmqstore._record cimport RecView

cdef class Message:          # a field set from Python is checked as __init__ checks it (__setattr__)
    cdef public str topic
    cdef public object body
    cdef public dict properties
    cdef public int32_t flag
    cdef public int32_t sys_flag
    cdef public int64_t born_timestamp
    cdef public bytes born_host_packed
    cdef public int32_t reconsume_times
    cdef public int64_t prepared_transaction_offset

cdef class PutResult:
    cdef readonly int64_t phy_offset
    cdef readonly int32_t size
    cdef readonly str topic
    cdef readonly int32_t queue_id
    cdef readonly int64_t queue_offset
    cdef readonly int64_t store_timestamp
    cdef bytes store_host

cdef struct Spots:           # where the fields of a record that move with its lengths lie
    int32_t store_off
    int32_t body_off
    int32_t body_len
    int32_t topic_off
    int32_t topic_len
    int32_t props_off
    int32_t props_len

cdef class MessageExt:
    cdef bytes _owner        # holds the record: its own copy, or one shared by a batch
    cdef const char *_p      # the record's first byte, inside _owner (its head read from there)
    cdef Spots s
    cdef object _topic, _props, _body
    cdef readonly int64_t store_offset   # where the record was read (== phy_offset when sane)

cpdef str text_arg(str name, object s)
cpdef str keys_text(object keys)
cdef object body_arg(object body)
cdef MessageExt build_ext(const char *p, RecView *r, int64_t store_offset)
cdef MessageExt ext_in(bytes owner, Py_ssize_t at, RecView *r, int64_t store_offset)
