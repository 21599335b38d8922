# The offsets check every reader of caller-given columns runs before it follows them.
from libc.stdint cimport int32_t, int64_t

cdef int check_offsets(const int32_t *o32, const int64_t *o64, int64_t start, int64_t n, int64_t end,
                       str what) except -1
