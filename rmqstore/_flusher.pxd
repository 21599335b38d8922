from libc.stdint cimport int64_t
from rmqstore._cext cimport rmq_map_t

cdef extern from "rmq_flush.h" nogil:
    int RMQ_EROOT_GONE
    int RMQ_EROOT_REPLACED
    int RMQ_EBEHIND
    ctypedef int (*rmq_sync_fn)(rmq_map_t *m, int64_t off, int64_t length) noexcept nogil
    ctypedef struct rmq_flush_seg:
        rmq_map_t *m
        int64_t base
        int64_t size
        const int64_t *wrote
        int64_t *flushed
        const int64_t *store_ts
    ctypedef struct rmq_flusher:
        int64_t flushed_ts
        int64_t rounds
        int error
        int root_errno
        int64_t error_base
        int running
        int tid
    int rmq_flusher_init(rmq_flusher *f, const char *root, rmq_sync_fn sync, int64_t flushed)
    int rmq_flusher_start(rmq_flusher *f, int periodic, int64_t interval_ms, int64_t least_pages,
                          int64_t thorough_ms)
    void rmq_flusher_stop(rmq_flusher *f)
    int rmq_flusher_track(rmq_flusher *f, const rmq_flush_seg *s)
    int rmq_flusher_check_root(rmq_flusher *f)
    int rmq_flusher_flush(rmq_flusher *f, int64_t least_pages)
    int rmq_flusher_wait(rmq_flusher *f, int64_t offset)
    void rmq_flusher_destroy(rmq_flusher *f)
    int rmq_flusher_failed(const rmq_flusher *f)
    int64_t rmq_flusher_flushed(const rmq_flusher *f)


cdef class Flusher:
    cdef rmq_flusher f
    cdef bint ready
    cdef list held
    cdef readonly str root
    cdef object on_fail, exc
    cdef int64_t newest
    cdef object _raise(self, int rc)
    cdef inline bint failed(self) noexcept:
        return rmq_flusher_failed(&self.f) != 0
