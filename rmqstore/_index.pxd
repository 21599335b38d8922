# The index kernels other modules call (verify's column pass, the native dispatch loop).
from libc.stdint cimport int32_t, int64_t
from rmqstore._layout cimport DispatchRow

cdef int64_t keys_of(const char *raw, int64_t nraw, const DispatchRow *d, char *buf,
                     int32_t *hashes, int64_t *phys, int64_t *tss) noexcept nogil
cdef Py_ssize_t put_keys(char *b, int32_t slots, int32_t entries, const int32_t *hashes, const int64_t *phys,
                         const int64_t *tss, Py_ssize_t i, Py_ssize_t n) noexcept nogil
