"""Pages faulted in, and disk blocks allocated, ahead of a writer on a native thread.

A fresh page costs the writer 10-20 us to fault in, and a Python thread doing it for him
took the GIL from him between its steps (up to the 5 ms switch interval). The toucher's
thread (cext/rmq_touch.c) takes no GIL: a job is queued with one C call, and the segments
it names stay pinned until it is done.
"""
cimport cython
from libc.stdint cimport int64_t
from rmqstore._cext cimport rmq_map_t
from rmqstore._segment cimport MappedSegment, pin, reserve_range, unpin
from rmqstore.errors import InvalidArgumentError, StoreIOError


cdef extern from "rmq_touch.h" nogil:
    ctypedef int (*rmq_reserve_fn)(rmq_map_t *m, int64_t off, int64_t length) noexcept nogil
    ctypedef struct rmq_toucher:
        int running
        int tid
    int rmq_toucher_init(rmq_toucher *t, rmq_reserve_fn reserve)
    int rmq_toucher_start(rmq_toucher *t, const char *name)
    int64_t rmq_toucher_submit(rmq_toucher *t, rmq_map_t *m, int64_t start, int64_t stop, int reserve)
    int64_t rmq_toucher_done(rmq_toucher *t)
    void rmq_toucher_stop(rmq_toucher *t)
    void rmq_toucher_destroy(rmq_toucher *t)


@cython.no_gc_clear   # __dealloc__ unpins what ``held`` holds
cdef class Toucher:
    """A native thread named ``name`` that runs ``submit``-ted jobs in order. Thread-safe for
    one submitter at a time under the GIL (the writer, or the segment preparer); ``close``
    drops jobs not started, joins the thread and unpins every segment. After ``os.fork``
    the child has no thread: its jobs never run (a forked child writes nothing)."""
    cdef rmq_toucher t
    cdef bint ready
    cdef list held        # [(ticket, segment)] pinned until that ticket is done

    def __cinit__(self, str name not None):
        rmq_toucher_init(&self.t, <rmq_reserve_fn>reserve_range)
        self.ready = True
        self.held = []
        rc = rmq_toucher_start(&self.t, name.encode()[:15])
        if rc:
            raise StoreIOError(-rc, "cannot start the page toucher thread", name)

    def __dealloc__(self):
        if self.ready:
            with nogil:
                rmq_toucher_stop(&self.t)
            for _, seg in self.held:
                try:
                    unpin(<MappedSegment>seg)
                except Exception:
                    pass
            rmq_toucher_destroy(&self.t)

    def submit(self, MappedSegment seg not None, int64_t start, int64_t stop, bint reserve=False):
        """Queue: (``reserve``) allocate the blocks of ``[0, stop)``, then fault
        ``[start, stop)`` in for writing, only where blocks are allocated, without changing
        a byte (a live writer may be writing there). StoreClosedError if ``seg`` is closed."""
        cdef int64_t ticket
        if not 0 <= start <= stop:
            raise InvalidArgumentError(f"touch range [{start}, {stop}) is not a range")
        self._let_go(rmq_toucher_done(&self.t))
        if not self.t.running:
            return
        pin(seg)
        ticket = rmq_toucher_submit(&self.t, &seg.m, start, min(stop, seg.m.size), reserve)
        if ticket < 0:
            unpin(seg)
            raise MemoryError("cannot queue a page-touch job")
        self.held.append((ticket, seg))

    cdef _let_go(self, int64_t done):
        cdef Py_ssize_t k = 0
        while k < len(self.held) and self.held[k][0] <= done:
            k += 1
        if k:
            gone, self.held = self.held[:k], self.held[k:]
            for _, seg in gone:
                unpin(<MappedSegment>seg)

    def close(self):
        """Drop queued jobs, join the thread once the job under way ends, unpin everything."""
        with nogil:
            rmq_toucher_stop(&self.t)
        self._let_go(1 << 62)

    @property
    def pending(self):
        """Jobs queued or under way."""
        return len(self.held) and sum(1 for ticket, _ in self.held if ticket > rmq_toucher_done(&self.t))

    @property
    def thread_id(self):
        return self.t.tid
