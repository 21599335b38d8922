"""The next segment made, pages faulted in and disk blocks allocated ahead of a writer, on a
native thread.

A fresh page costs the writer 10-20 us to fault in, and a Python thread doing it for him
took the GIL from him between its steps (up to the 5 ms switch interval). The toucher's
thread (cext/rmq_touch.c) takes no GIL: a job is queued with one C call, and the segments
it names stay pinned until it is done. Making a segment ahead (creating its file, allocating
and mapping it) took a Python thread the GIL between its steps the same way; the toucher
makes it too (``make``), so a roll only takes the mapped segment.
"""
cimport cython
from libc.stdint cimport int64_t
from rmqstore._cext cimport rmq_make_t, rmq_map_t
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
    int64_t rmq_toucher_make(rmq_toucher *t, rmq_map_t *m, rmq_make_t *mk, int64_t stop)
    int64_t rmq_toucher_done(rmq_toucher *t)
    void rmq_toucher_stop(rmq_toucher *t)
    void rmq_toucher_destroy(rmq_toucher *t)


@cython.no_gc_clear   # __dealloc__ unpins what ``held`` holds
cdef class Toucher:
    """A native thread named ``name`` that runs the jobs ``submit`` and ``make`` queue, in
    order. Thread-safe for one submitter at a time under the GIL (the writer); ``close``
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
        if not 0 <= start <= stop:
            raise InvalidArgumentError(f"touch range [{start}, {stop}) is not a range")
        if self._ready(seg):
            self._queue(seg, rmq_toucher_submit(&self.t, &seg.m, start, min(stop, seg.m.size), reserve))

    def make(self, MappedSegment seg not None, int64_t stop):
        """Queue making ``seg`` (one made ahead, ``defer``), then faulting ``[0, stop)`` of it
        in, only where blocks are allocated. Nothing is queued once closed, nor in a forked
        child: ``seg.made()`` then makes it in the caller."""
        if stop < 0:
            raise InvalidArgumentError(f"touch range [0, {stop}) is not a range")
        self._queue(seg, rmq_toucher_make(&self.t, &seg.m, &seg.mk, stop) if self._ready(seg) else 0)

    cdef bint _ready(self, MappedSegment seg) except -1:
        """Let go of finished jobs' segments; whether a job can be queued, ``seg`` pinned for it."""
        self._let_go(rmq_toucher_done(&self.t))
        if not self.t.running:
            return False
        pin(seg)
        return True

    cdef _queue(self, MappedSegment seg, int64_t ticket):
        if ticket < 0:
            unpin(seg)
            raise MemoryError("cannot queue a page-touch job")
        if ticket > 0:
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
