cdef class Gate:
    cdef unsigned long *idents   # the thread of each operation inside (n of cap)
    cdef Py_ssize_t n, cap
    cdef public bint closing
    cdef str path
    cdef object on_closing
    cpdef enter(self)
    cpdef leave(self)


cdef class ArgChecks:
    cdef Py_ssize_t n
    cdef Py_ssize_t *pos         # argument position and kind of each check
    cdef int *kinds
    cdef list names, funcs
    cdef tuple run(self, tuple args, dict kwargs)
