"""The commitlog's flusher on a native thread, and SYNC group commit without the GIL.

A SYNC ``put`` asks for its end offset and sleeps on a condition variable with the GIL
released; the flusher thread (``rmq-flush``, cext/rmq_flush.c) msyncs everything written
so far and wakes every waiter it covered, so writers that arrive during one msync share
the next. The ASYNC cadence (``flush_interval_ms``, ``flush_least_pages``,
``flush_thorough_interval_ms``) runs on the same thread. Python keeps the policy
(flush.py): what a failure means, the checkpoint, when to start and stop.
"""
import errno
import os

cimport cython
from libc.stdint cimport int64_t
from rmqstore._segment cimport MappedSegment, check, sync_range, pin, unpin
from rmqstore.errors import StoreError, StoreIOError, StoreReadOnlyError


@cython.no_gc_clear   # __dealloc__ unpins what ``held`` holds
cdef class Flusher:
    """Flushes the segments it tracks for the store directory ``root``; everything before
    ``flushed`` (a commitlog offset) is durable. ``on_fail(exc)`` is called once, from the
    first Python call that meets the first failure (msync error, the directory gone or
    replaced), which is sticky: no flush is tried again and every waiter raises.

    Thread-safety: ``track`` is called by the writer under the GIL (the segment queue
    publishes a segment); ``wait_flushed`` from any number of threads; the native thread
    reads the tracked segments under its own mutex. A tracked segment is pinned, so it
    stays mapped until it is wholly flushed (or ``release``), whatever closes it.
    After ``os.fork`` the child has no thread: a wait there flushes in the caller."""

    def __cinit__(self, root not None, int64_t flushed, on_fail not None):
        cdef bytes broot = os.fsencode(root)   # a path of any bytes, as the os module takes it
        rc = rmq_flusher_init(&self.f, broot, <rmq_sync_fn>sync_range, flushed)
        if rc:
            raise StoreIOError(-rc, "store directory cannot be opened for flushing", str(root))
        self.ready = True
        self.root = str(root)
        self.held = []
        self.on_fail = on_fail
        self.newest = -1

    def __dealloc__(self):
        if self.ready:
            with nogil:
                rmq_flusher_stop(&self.f)
            for seg in self.held:
                try:
                    unpin(<MappedSegment>seg)
                except Exception:
                    pass
            rmq_flusher_destroy(&self.f)

    def start(self, bint periodic, int64_t interval_ms, int64_t least_pages, int64_t thorough_ms):
        """Start the thread (``periodic``: the ASYNC cadence too, else waiters only)."""
        rc = rmq_flusher_start(&self.f, periodic, interval_ms, least_pages, thorough_ms)
        if rc:
            raise StoreIOError(-rc, "cannot start the flusher thread", self.root)

    def stop(self):
        """Stop the thread and join it (idempotent); flushes still work, in the caller."""
        with nogil:
            rmq_flusher_stop(&self.f)

    def release(self):
        """Stop, and unpin every tracked segment (at close: they may then be unmapped)."""
        self.stop()
        held, self.held = self.held, []
        for seg in held:
            unpin(<MappedSegment>seg)

    def track(self, MappedSegment seg not None):
        """Flush ``seg`` from now on, if it is newer than every segment tracked; segments
        wholly flushed are let go (unpinned). No Python code runs here."""
        cdef rmq_flush_seg s
        cdef int dropped
        if seg.base_offset <= self.newest:
            return
        pin(seg)
        s.m, s.base, s.size = &seg.m, seg.base_offset, seg.m.size
        s.wrote, s.flushed, s.store_ts = &seg.wrote_pos, &seg.flushed_pos, &seg.store_timestamp
        dropped = rmq_flusher_track(&self.f, &s)
        if dropped < 0:
            unpin(seg)
            raise MemoryError("cannot track a segment to flush")
        self.held.append(seg)
        self.newest = seg.base_offset
        if dropped:
            done, self.held = self.held[:dropped], self.held[dropped:]
            for old in done:
                unpin(<MappedSegment>old)

    def flush(self, int64_t least_pages=0):
        """Flush now in this thread, with the GIL released; the flushed offset. OSError
        (a StoreIOError) when the flush failed, now or before."""
        cdef int rc
        with nogil:
            rc = rmq_flusher_flush(&self.f, least_pages)
        if rc and rmq_flusher_failed(&self.f):
            raise self.error
        if rc:
            raise StoreIOError(-rc, "flush", self.root)
        return rmq_flusher_flushed(&self.f)

    def check_root(self):
        """StoreIOError when the store directory is gone or another one (flush.py,
        invariant 5), or when a flush failed before."""
        cdef int rc
        with nogil:
            rc = rmq_flusher_check_root(&self.f)
        if rc:
            raise self.error

    def wait_flushed(self, int64_t offset):
        """Return once everything before ``offset`` is durable, waiting (GIL released) for
        the flusher thread; StoreReadOnlyError once any flush has failed (invariant 4)."""
        cdef int rc
        if rmq_flusher_flushed(&self.f) >= offset and not rmq_flusher_failed(&self.f):
            return
        with nogil:
            rc = rmq_flusher_wait(&self.f, offset)
        if rc:
            self._raise(rc)

    cdef object _raise(self, int rc):
        if not rmq_flusher_failed(&self.f):   # RMQ_EBEHIND of a wait that flushed itself
            raise StoreIOError(errno.EIO, f"flush did not reach commitlog offset {self.flushed}", self.root)
        exc = self.error
        raise StoreReadOnlyError(f"store is read-only after a failed flush: {exc}") from exc

    @property
    def error(self):
        """The exception of the first failure (reported to ``on_fail`` once), or None."""
        cdef int rc = rmq_flusher_failed(&self.f)
        if rc == 0 or self.exc is not None:
            return self.exc
        if rc == RMQ_EROOT_GONE:
            exc = StoreIOError(self.f.root_errno, "store directory gone while open", self.root)
        elif rc == RMQ_EROOT_REPLACED:
            exc = StoreIOError(errno.ESTALE, "store directory replaced while open", self.root)
        elif rc == RMQ_EBEHIND or rc == -errno.ENOMEM:
            exc = StoreIOError(errno.ENOMEM if rc == -errno.ENOMEM else errno.EIO, "the flusher could not cover what was "
                               "written (out of memory, or a segment it was not told of)", self.root)
        else:
            path = next((s.path for s in self.held if (<MappedSegment>s).base_offset == self.f.error_base),
                        f"{self.root}/commitlog")
            try:
                check(rc, path, "msync")
            except (StoreError, OSError) as e:
                exc = e
        self.exc = exc
        self.on_fail(exc)
        return exc

    @property
    def flushed(self):
        """The commitlog offset before which everything is durable."""
        return rmq_flusher_flushed(&self.f)

    @property
    def flushed_timestamp(self):
        """Store time of a message wholly flushed with all before it (0: none yet)."""
        return self.f.flushed_ts

    @property
    def rounds(self):
        """Flushes that synced anything (each covered every waiter then waiting)."""
        return self.f.rounds

    @property
    def thread_id(self):
        """The native thread's id (gettid), 0 before it ran; see ``running``."""
        return self.f.tid

    @property
    def running(self):
        return bool(self.f.running)
