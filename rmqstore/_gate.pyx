"""The operation gate of a MessageStore: close() waits for the operations running, and once
it has begun, a new one raises StoreClosedError instead of starting."""
from cpython.pythread cimport PyThread_get_thread_ident
from rmqstore.errors import StoreClosedError


cdef class Gate:
    """No lock, the GIL orders it: enter() registers the thread first and reads ``closing``
    after, while close() sets ``closing`` first and reads the registry after, so either
    close() waits for the operation or the operation sees ``closing`` and backs out. Thread
    idents, so close() called back from within an operation (a progress callback) does not
    wait for itself. ``on_closing()`` runs when an operation meets a closing gate (it raises
    if the store is already closed)."""

    def __cinit__(self, str path not None, on_closing not None):
        self.running = []
        self.closing = False
        self.path = path
        self.on_closing = on_closing

    cpdef enter(self):
        self.running.append(PyThread_get_thread_ident())
        if self.closing:
            self.leave()
            self.on_closing()
            raise StoreClosedError(f"{self.path}: store is closing")

    cpdef leave(self):
        self.running.remove(PyThread_get_thread_ident())

    def others_running(self):
        """Whether an operation of another thread is still inside."""
        cdef unsigned long me = PyThread_get_thread_ident()
        return any(t != me for t in list(self.running))   # a copy: others enter and leave meanwhile
