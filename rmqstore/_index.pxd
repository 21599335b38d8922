# The index kernels other modules call (verify's column pass).
from libc.stdint cimport int32_t, int64_t
from rmqstore._layout cimport DispatchRow

cdef int64_t keys_of(const char *raw, int64_t nraw, const DispatchRow *d, char *buf,
                     int32_t *hashes, int64_t *phys, int64_t *tss) noexcept nogil
