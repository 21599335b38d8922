cdef class Gate:
    cdef list running
    cdef public bint closing
    cdef str path
    cdef object on_closing
    cpdef enter(self)
    cpdef leave(self)
