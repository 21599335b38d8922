# Small copies the kernels make per record or row, inline.
from libc.string cimport memcpy


cdef inline void copy_short(char *dst, const char *src, Py_ssize_t n) noexcept nogil:
    """memcpy for the short fields of a record (hosts, topic, properties): up to 32 bytes as
    two overlapping fixed-size moves, which the compiler inlines, instead of a library call
    per field."""
    if n >= 16:
        if n > 32:
            memcpy(dst, src, n)
            return
        memcpy(dst, src, 16)
        memcpy(dst + n - 16, src + n - 16, 16)
    elif n >= 8:
        memcpy(dst, src, 8)
        memcpy(dst + n - 8, src + n - 8, 8)
    elif n >= 4:
        memcpy(dst, src, 4)
        memcpy(dst + n - 4, src + n - 4, 4)
    elif n > 0:
        dst[0] = src[0]
        dst[n // 2] = src[n // 2]
        dst[n - 1] = src[n - 1]
