ctypedef object (*LogicsRead)(object reader, tuple args)   # one try of a read (Gate.read_logics)


cdef class Gate:
    cdef unsigned long *idents   # the thread of each operation inside (n of cap)
    cdef Py_ssize_t n, cap
    cdef public bint closing
    cdef public long long generation   # odd while a rebuild or retention closes files readers read
    cdef public object swap_lock       # held meanwhile (MessageStore._closing_files)
    cdef str path
    cdef object on_closing
    cpdef enter(self)
    cpdef leave(self)
    cdef bint swapped(self, long long generation) except -1
    cdef object read_logics(self, LogicsRead read, object reader, tuple args)


cdef class ArgChecks:
    cdef Py_ssize_t n
    cdef Py_ssize_t *pos         # argument position and kind of each check
    cdef int *kinds
    cdef list names, funcs
    cdef tuple run(self, tuple args, dict kwargs)
