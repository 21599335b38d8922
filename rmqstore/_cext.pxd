# C declarations of cext/: every call is nogil and returns 0 or -errno.
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t

cdef extern from "rmq_endian.h" nogil:
    int16_t rmq_ld16(const char *p)
    int32_t rmq_ld32(const char *p)
    int64_t rmq_ld64(const char *p)
    void rmq_st16(char *p, int16_t x)
    void rmq_st32(char *p, int32_t x)
    void rmq_st64(char *p, int64_t x)

cdef extern from "rmq_order.h" nogil:
    void rmq_release()

cdef extern from "rmq_wake.h" nogil:
    void rmq_publish64(int64_t *pos, int64_t v, int *waiting)
    void rmq_wait64(const int64_t *pos, int64_t seen, int *waiting, long timeout_ns)

cdef extern from "rmq_prefetch.h" nogil:
    void rmq_prefetch(const void *p)

cdef extern from "rmq_mmap.h" nogil:
    int RMQ_CREATE
    int RMQ_READONLY
    int RMQ_NO_READAHEAD
    int RMQ_ESIZE
    int RMQ_ENOTREG
    int RMQ_EFAULTED
    ctypedef struct rmq_map_t:
        int fd
        char *base
        int64_t size
        int64_t reserved
        int readonly
        int dense
        int truncated
    int rmq_map_open(const char *path, int64_t size, int64_t reserve_bytes, int flags, int mode, rmq_map_t *m)
    int rmq_map_reserve(rmq_map_t *m, int64_t off, int64_t length)
    int rmq_map_discard(rmq_map_t *m, int64_t off, int64_t length)
    int rmq_map_sync(rmq_map_t *m, int64_t off, int64_t length)
    int rmq_map_let_go(rmq_map_t *m, int64_t off, int64_t length)
    int rmq_map_write(rmq_map_t *m, int64_t off, const char *buf, int64_t length)
    int rmq_map_prefault(rmq_map_t *m, int64_t off, int64_t length, int write)
    int rmq_map_close(rmq_map_t *m)
    int64_t rmq_page_size()
    int32_t rmq_java_hash(const char *s, size_t n)
    int32_t rmq_java_hash_from(uint32_t h, const char *s, size_t n)

cdef extern from "rmq_touch.h" nogil:
    int RMQ_MAKE_QUEUED
    int RMQ_MAKE_RUNNING
    int RMQ_MAKE_DROPPED
    ctypedef struct rmq_make_t:
        int state
    void rmq_make_init(rmq_make_t *mk, const char *path, int64_t size, int64_t reserve, int flags, int mode)
    int rmq_make_wait(rmq_make_t *mk, rmq_map_t *m)
    int rmq_make_drop(rmq_make_t *mk)
    int rmq_make_state(const rmq_make_t *mk)

cdef extern from "rmq_crc.h" nogil:
    uint32_t rmq_crc32(uint32_t crc, const char *buf, size_t length)

cdef extern from "rmq_fault.h" nogil:
    int rmq_fault_armed
    int RMQ_OP_OPEN
    int RMQ_OP_FSYNC
    int rmq_fault_set(int op, int64_t nth, int err, const char *match)
    int rmq_fault_hit(int op, const char *path, int fd)
    int rmq_fault_op(const char *name)
    int rmq_fault_stall(int op, int on, const char *match)
    int rmq_fault_stalled(int op)
