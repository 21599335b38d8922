"""The operation gate of a MessageStore: close() waits for the operations running, and once
it has begun, a new one raises StoreClosedError instead of starting."""
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdlib cimport free, malloc, realloc
from rmqstore.errors import InvalidArgumentTypeError, StoreClosedError, check_call

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object s)


cdef class Gate:
    """No lock, the GIL orders it: enter() registers the thread first and reads ``closing``
    after, while close() sets ``closing`` first and reads the registry after, so either
    close() waits for the operation or the operation sees ``closing`` and backs out. Thread
    idents, so close() called back from within an operation (a progress callback) does not
    wait for itself; kept in a C array (no Python object made per call). ``on_closing()``
    runs when an operation meets a closing gate (it raises if the store is already closed)."""

    def __cinit__(self, str path not None, on_closing not None):
        self.cap = 16
        self.idents = <unsigned long *>malloc(self.cap * sizeof(unsigned long))
        if self.idents == NULL:
            raise MemoryError()
        self.n = 0
        self.closing = False
        self.generation = 0
        self.swap_lock = None
        self.path = path
        self.on_closing = on_closing

    def __dealloc__(self):
        free(self.idents)

    cpdef enter(self):
        cdef unsigned long *grown
        if self.n == self.cap:
            grown = <unsigned long *>realloc(self.idents, 2 * self.cap * sizeof(unsigned long))
            if grown == NULL:
                raise MemoryError()
            self.idents, self.cap = grown, 2 * self.cap
        self.idents[self.n] = PyThread_get_thread_ident()
        self.n += 1
        if self.closing:
            self.leave()
            self.on_closing()
            raise StoreClosedError(f"{self.path}: store is closing")

    cpdef leave(self):
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef Py_ssize_t i = self.n - 1
        while i >= 0 and self.idents[i] != me:
            i -= 1
        if i >= 0:
            self.n -= 1
            self.idents[i] = self.idents[self.n]

    cdef bint swapped(self, long long generation) except -1:
        """After a read raised StoreClosedError: whether a rebuild or retention closed files
        since ``generation`` (read before the read began) or was closing them then, so the
        read met one of them; waits for that step to end, then the read is run again on what
        the store holds now (a seqlock: ``generation`` is odd during the step)."""
        if self.generation == generation and not generation & 1:
            return False
        with self.swap_lock:
            pass
        return True

    cdef object read_logics(self, LogicsRead read, object reader, tuple args):
        """``read(reader, args)``, a read of consume queues or the index, as an operation,
        run again when a rebuild or retention closed a file under it (swapped). A C
        function pointer, so a fast path's call makes no Python object for it."""
        cdef long long generation
        self.enter()
        try:
            while True:
                generation = self.generation
                try:
                    return read(reader, args)
                except StoreClosedError:
                    if not self.swapped(generation):
                        raise
        finally:
            self.leave()

    def others_running(self):
        """Whether an operation of another thread is still inside."""
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef Py_ssize_t i
        for i in range(self.n):
            if self.idents[i] != me:
                return True
        return False


cdef enum:     # kinds of argument ArgChecks knows without a call (others: their check function)
    KIND_OTHER = 0
    KIND_STR = 1
    KIND_INT64 = 2
    KIND_QUEUE_ID = 3   # an int in 0..2^31-1
    KIND_OR_NONE = 4    # added to a kind: None passes too
# the same for arguments.py (passes() reads the C constants: these Python names cost each
# checked argument two dict lookups and Python int arithmetic, 200 instructions)
ARG_OTHER, ARG_STR, ARG_INT64, ARG_QUEUE_ID, ARG_OR_NONE = KIND_OTHER, KIND_STR, KIND_INT64, KIND_QUEUE_ID, KIND_OR_NONE


cdef inline bint passes(int kind, object v) noexcept:
    """Whether ``v`` is certainly fine for ``kind``, so its check function need not run."""
    cdef int overflow = 0
    cdef long long x
    if v is None:
        return kind & KIND_OR_NONE
    kind &= ~KIND_OR_NONE
    if (kind == KIND_INT64 or kind == KIND_QUEUE_ID) and type(v) is int:
        x = PyLong_AsLongLongAndOverflow(v, &overflow)
        return overflow == 0 and (kind == KIND_INT64 or 0 <= x <= 0x7FFFFFFF)
    return kind == KIND_STR and type(v) is str and PyUnicode_IS_ASCII(v)


cdef class ArgChecks:
    """The argument checks of a store method, from (position, name, kind, check(name,
    value)) tuples: run() checks the arguments given (positional or by keyword), the
    common valid kinds passing without a call. A check returns the value the method is
    to see (a str subclass as a str, an ``__index__`` integer as an int), which takes
    the argument's place."""

    def __cinit__(self, list checks not None):
        cdef Py_ssize_t j
        self.n = len(checks)
        self.pos = <Py_ssize_t *>malloc(max(1, self.n) * sizeof(Py_ssize_t))
        self.kinds = <int *>malloc(max(1, self.n) * sizeof(int))
        if self.pos == NULL or self.kinds == NULL:
            raise MemoryError()
        for j in range(self.n):
            self.pos[j], self.kinds[j] = checks[j][0], checks[j][2]
        self.names = [c[1] for c in checks]
        self.funcs = [c[3] for c in checks]

    def __dealloc__(self):
        free(self.pos)
        free(self.kinds)

    def __call__(self, tuple args not None, dict kwargs=None):
        return self.run(args, kwargs)

    cdef tuple run(self, tuple args, dict kwargs):
        """``args`` checked, or a copy holding the values the checks changed; a changed
        keyword argument is replaced in ``kwargs``."""
        cdef Py_ssize_t j, n = len(args)
        cdef list changed = None
        for j in range(self.n):
            if self.pos[j] < n:
                v = args[self.pos[j]]
            elif kwargs and self.names[j] in kwargs:
                v = kwargs[self.names[j]]
            else:
                continue
            if passes(self.kinds[j], v):
                continue
            w = self.funcs[j](self.names[j], v)
            if w is v:
                continue
            if self.pos[j] < n:
                if changed is None:
                    changed = list(args)
                changed[self.pos[j]] = w
            else:
                kwargs[self.names[j]] = w
        return args if changed is None else tuple(changed)


MISSING = object()     # the default of a C fast path's required parameters: not given


def misfit(str name, tuple params, tuple more, dict unknown):
    """Raise InvalidArgumentTypeError for a call of MessageStore.``name`` through a C fast
    path (put, get_messages...) that does not fit its signature: ``params`` the values its
    parameters got (MISSING: none), ``more`` the extra positional arguments, ``unknown``
    the unknown keywords. (Cython's own TypeError would not be a StoreError; gated methods
    raise this for the same calls.)"""
    import inspect
    from rmqstore.store import MessageStore
    func = inspect.unwrap(getattr(MessageStore, name))
    args, kwargs, gap = [], dict(unknown), False
    for p, v in zip(list(inspect.signature(func).parameters)[1:], params):   # the call as given, near enough
        if v is MISSING:
            gap = True
        elif gap:
            kwargs[p] = v
        else:
            args.append(v)
    check_call(func, (None, *args, *more), kwargs)
    raise InvalidArgumentTypeError(f"MessageStore.{name}(): a call that does not fit its signature")


def gated(method, ArgChecks checks not None, bint reads_logics=False):
    """``method`` of a store run as an operation of the store's ``_gate`` (see Gate), its
    arguments checked first, a call that does not fit its signature an
    InvalidArgumentTypeError: the whole wrapper in C. ``reads_logics``: a read of consume
    queues or the index, run again when a rebuild or retention closed files under it
    (Gate.swapped)."""
    def run(self, *args, **kwargs):
        cdef Gate gate
        cdef tuple given = args
        cdef long long generation
        args = checks.run(args, kwargs)
        gate = self._gate
        gate.enter()
        try:
            while True:
                generation = gate.generation
                try:
                    return method(self, *args, **kwargs)
                except StoreClosedError:
                    if not reads_logics or not gate.swapped(generation):
                        raise
        except TypeError:
            check_call(method, (self, *given), kwargs)   # InvalidArgumentTypeError for a bad call
            raise
        finally:
            gate.leave()
    return run
