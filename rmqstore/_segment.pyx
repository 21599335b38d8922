# cython: boundscheck=False, wraparound=False
"""A typed view over one fixed-size mapped file (a commitlog, consume-queue or index segment)."""
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from libc.stdint cimport int64_t
from posix.time cimport nanosleep, timespec
import errno
import os

from rmqstore._cext cimport *
from rmqstore._layout cimport PF_READ, PF_WRITE, PF_AHEAD
from rmqstore.errors import (raise_errno, raise_not_regular, StoreClosedError, CorruptStoreError, InvalidArgumentError,
                             OutOfRangeError, StoreError, StoreIOError, StoreReadOnlyError, ViewExportedError)

# prefault() modes (_layout.PrefaultMode).
PREFAULT_READ = PF_READ
PREFAULT_WRITE = PF_WRITE
PREFAULT_AHEAD = PF_AHEAD


cdef int check(int rc, object path, str op) except -1:
    """The one place a C-layer status becomes an exception: 0 passes, RMQ_ESIZE (a file
    whose size is not the configured one) is a CorruptStoreError, RMQ_ENOTREG a StoreIOError
    (not a regular file), RMQ_EFAULTED a StoreIOError (EIO: the file changed under its
    mapping), -errno goes through errors.raise_errno's errno table."""
    if rc == 0:
        return 0
    if rc == RMQ_ESIZE:
        raise CorruptStoreError(f"{path}: file size differs from the configured size")
    if rc == RMQ_ENOTREG:
        raise_not_regular(path, op)
    if rc == RMQ_EFAULTED:
        raise StoreIOError(errno.EIO, f"{op}: the file changed under its mapping (truncated by another process, "
                                      f"or a page could not be read back); what was written there is lost", str(path))
    raise_errno(-rc, path, op)


cdef int write_at(MappedSegment seg, int64_t pos, const char *buf, int64_t n) noexcept nogil:
    """pwrite ``n`` bytes at file position ``pos`` of a segment the caller keeps mapped
    (rmq_map_write, here so that fault injection sees it): 0 or -errno."""
    return rmq_map_write(&seg.m, pos, buf, n)


cdef int sync_range(rmq_map_t *m, int64_t pos, int64_t n) noexcept nogil:
    """msync ``[pos, pos+n)`` of a mapping its owner keeps mapped (rmq_map_sync, here so that
    fault injection sees it; the native flusher calls it): 0 or a negative status."""
    return rmq_map_sync(m, pos, n)


cdef int reserve_range(rmq_map_t *m, int64_t pos, int64_t n) noexcept nogil:
    """Allocate the blocks of ``[pos, pos+n)`` of a mapping its owner keeps mapped
    (rmq_map_reserve, here so that fault injection sees it; the native toucher calls it)."""
    return rmq_map_reserve(m, pos, n)


cdef class MappedSegment:
    """One file of ``size`` bytes mapped shared, named by ``base_offset``.

    Positions: ``wrote_pos`` (bytes appended, published after the copy) >= ``flushed_pos``
    (bytes known durable). Only the store's single writer moves ``wrote_pos``; readers
    read below it without locks. Every access is checked against the mapped size, which
    is what ``fstat`` reported at open time, so a short file can never be touched; a file
    another process truncates while it is mapped reads as zeros past its new end and can
    no longer be flushed (cext/rmq_guard.h: no SIGBUS either way). ``hold()``/``release()``
    pin the mapping across GIL-free work; ``close()`` waits for the last pin and is refused
    while a zero-copy view is exported.
    """

    def __cinit__(self, path, int64_t base_offset, int64_t size, bint create=False,
                  bint readonly=False, int mode=0o600, int64_t reserve=-1, int64_t ahead=0, bint readahead=True,
                  bint defer=False):
        """``readahead=False``: a file this creates is mapped without read-around (a file
        written in small steps, of which a store may use a few pages: see rmq_map_open).
        ``defer``: a segment made ahead, its file not created here but by the toucher's
        thread (Toucher.make) or by ``made()``, whichever comes first (cext/rmq_touch.h)."""
        cdef bytes bpath = os.fsencode(str(path))
        cdef const char *cpath = bpath
        cdef int flags = (RMQ_CREATE if create else 0) | (RMQ_READONLY if readonly else 0) | \
            (0 if readahead else RMQ_NO_READAHEAD)
        cdef int rc
        self.m.fd = -1
        self.m.base = NULL
        self.path = str(path)
        self.base_offset = base_offset
        if reserve < 0:   # the whole file (the C layer clamps a larger one to the file)
            reserve = size
        if ahead < 0:
            raise InvalidArgumentError(f"ahead {ahead} is negative")
        self.ahead = ahead
        if defer:
            if not create or readonly:
                raise InvalidArgumentError("only a file created for writing is made ahead")
            self.fspath = bpath
            rmq_make_init(&self.mk, self.fspath, size, reserve, flags, mode)
            return
        with nogil:
            rc = rmq_map_open(cpath, size, reserve, flags, mode, &self.m)
        check(rc, self.path, "open/map")

    @property
    def ready(self):
        """False while a segment made ahead (``defer``) is not made yet."""
        return made(self)

    def made(self):
        """Have a segment made ahead made: here, with the GIL released, if the toucher's
        thread has not started on it (an interrupt may have kept it from being handed over,
        or the thread is busy), else once that thread is done. Raises what making it met;
        a no-op once made."""
        cdef int st = rmq_make_state(&self.mk)
        if st != 0:
            with nogil:
                st = rmq_make_wait(&self.mk, &self.m)
            self.settle(st)

    def drop(self):
        """Drop a segment made ahead unless it is being made (then wait for it); returns
        whether its file was made (then the caller's to remove; closing only unmaps it)."""
        cdef int st = rmq_make_state(&self.mk)
        if st != 0:
            with nogil:
                st = rmq_make_drop(&self.mk)
            if st != 0:
                self.unmapped = True   # never mapped
        return st == 0

    cdef int settle(self, int state) except -1:
        """The final state of a make: a segment not made is closed, and why is raised."""
        if state == 0:
            return 0
        self.unmapped = True
        if state == RMQ_MAKE_DROPPED:
            raise StoreClosedError(f"{self.path}: dropped before it was made")
        if state == RMQ_MAKE_RUNNING:
            raise StoreError(f"{self.path}: being made by the process this one was forked from")
        return check(state, self.path, "create/map")

    def __dealloc__(self):
        # path is set right after m.fd = -1: without it __cinit__ failed first (an argument
        # out of range, an interrupt in fsencode) and m.fd is the zeroed 0, someone else's
        if self.path is not None and not self.unmapped:
            rmq_map_close(&self.m)

    @property
    def size(self):
        return self.m.size

    @property
    def faulted(self):
        """Whether the file changed under the mapping (a SIGBUS met, see cext/rmq_guard.h, or
        found shorter after a flush): zeros read from it may be no end of data."""
        return self.m.truncated > 0

    @property
    def reserved(self):
        """``[0, reserved)`` has its disk blocks allocated: what a file made here got, 0 for
        one found on disk (the first write past its data reserves from 0, a no-op on blocks
        already there)."""
        return self.m.reserved

    @property
    def readonly(self):
        return bool(self.m.readonly)

    @property
    def closed(self):
        return self.closing or self.unmapped

    cdef int check_range(self, int64_t pos, int64_t n) except -1:
        if self.closing or self.unmapped or not made(self):
            raise StoreClosedError(f"{self.path}: segment is closed")
        if pos < 0 or n < 0 or pos > self.m.size or n > self.m.size - pos:
            raise OutOfRangeError(f"{self.path}: range [{pos}, {pos + n}) outside 0..{self.m.size}")
        return 0

    cdef int64_t pin_range(self, int64_t pos, int64_t limit) except -1:
        """Check ``[pos, limit)`` (``limit`` clamped to the file) and hold(): a kernel then
        reads it with the GIL released and calls release(). Returns the clamped limit."""
        if limit > self.m.size:
            limit = self.m.size
        self.check_range(pos, limit - pos)
        pin(self)
        return limit

    def read(self, int64_t pos, int64_t n):
        """Copy ``n`` bytes at ``pos`` (file-relative) out of the mapping."""
        self.check_range(pos, n)
        return PyBytes_FromStringAndSize(self.m.base + pos, n)

    def write(self, int64_t pos, const unsigned char[:] data not None):
        """Copy ``data`` into the mapping at ``pos``; does not move ``wrote_pos``."""
        cdef int64_t n = data.shape[0]
        if self.m.readonly:
            raise StoreReadOnlyError(f"{self.path}: opened read-only")
        self.check_range(pos, n)
        ensure(self, pos + n)
        if n:
            with nogil:
                memcpy(self.m.base + pos, &data[0], n)

    def zero(self, int64_t pos, int64_t n):
        """Zero ``[pos, pos+n)`` so truncated bytes never look like data: a hole is punched
        (its blocks freed), or zeros are written where the file system has no holes."""
        cdef int rc
        if self.m.readonly:
            raise StoreReadOnlyError(f"{self.path}: opened read-only")
        self.check_range(pos, n)
        pin(self)
        try:
            with nogil:
                rc = rmq_map_discard(&self.m, pos, n)
        finally:
            unpin(self)
        check(rc, self.path, "zero")
        if pos < self.m.reserved and not self.m.dense:   # [0, reserved) must stay allocated
            self.m.reserved = pos - pos % rmq_page_size()

    def let_go(self, int64_t pos, int64_t n):
        """Drop the whole pages of ``[pos, pos+n)`` from the process's resident set
        (madvise MADV_DONTNEED on the shared file mapping): the data stays in the file and
        the page cache, and a later read maps it again. For scans that read a page once."""
        cdef int rc
        self.check_range(pos, n)
        pin(self)
        try:
            with nogil:
                rc = rmq_map_let_go(&self.m, pos, n)
        finally:
            unpin(self)
        check(rc, self.path, "let go")

    def data_ranges(self, int64_t pos, int64_t end):
        """The parts of ``[pos, end)`` (``end`` clamped to the file) the file system holds data
        for, as [(start, stop)], found with lseek SEEK_DATA / SEEK_HOLE: the rest are holes,
        which read as zeros. The whole range where the file system cannot tell."""
        cdef list out = []
        if end > self.m.size:
            end = self.m.size
        if pos >= end:
            return out
        self.check_range(pos, end - pos)
        if not hasattr(os, "SEEK_DATA"):
            return [(pos, end)]
        pin(self)    # the descriptor stays open meanwhile
        try:
            while pos < end:
                try:
                    start = os.lseek(self.m.fd, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno != errno.ENXIO:    # ENXIO: nothing but a hole up to the end of the file
                        out.append((pos, end))    # e.g. EINVAL: no SEEK_DATA on this file system
                    break
                if start >= end:
                    break
                stop = min(end, os.lseek(self.m.fd, start, os.SEEK_HOLE))
                out.append((start, stop))
                pos = stop
        finally:
            unpin(self)
        return out

    def reserve(self, int64_t end):
        """Allocate the disk blocks of ``[0, end)`` (clamped to the file) now, with the GIL
        released; DiskFullError when the disk is full. Returns the bytes reserved."""
        if end > self.m.reserved:
            self.reserve_to(end)
        return self.m.reserved

    cdef int reserve_to(self, int64_t stop) except -1:
        """Allocate the blocks from ``reserved`` to ``stop`` (rounded up to a page, clamped
        to the file)."""
        cdef int64_t ps = rmq_page_size(), start = self.m.reserved
        cdef int rc
        if self.m.readonly:
            raise StoreReadOnlyError(f"{self.path}: opened read-only")
        stop = min(self.m.size, (stop + ps - 1) // ps * ps)
        self.check_range(0, 0)
        pin(self)
        try:
            with nogil:
                rc = rmq_map_reserve(&self.m, start, stop - start)
        finally:
            unpin(self)
        check(rc, self.path, "allocate disk blocks for")
        if stop > self.m.reserved:
            self.m.reserved = stop
        return 0

    def flush(self, int least_pages=0):
        """msync ``[flushed_pos, wrote_pos)`` if at least ``least_pages`` dirty pages (or the
        file is full); returns the new flushed position. Errors raise ``OSError``."""
        cdef int64_t wrote = self.wrote_pos, flushed = self.flushed_pos
        cdef int rc
        if not flush_due(self, least_pages):
            return flushed
        self.check_range(flushed, wrote - flushed)
        pin(self)
        try:
            with nogil:
                rc = rmq_map_sync(&self.m, flushed, wrote - flushed)
        finally:
            unpin(self)
        check(rc, self.path, "msync")
        if wrote > self.flushed_pos:
            self.flushed_pos = wrote
        return self.flushed_pos

    def sync_all(self):
        """msync the whole file (used after recovery rewrites)."""
        cdef int rc
        self.check_range(0, 0)
        with nogil:
            rc = rmq_map_sync(&self.m, 0, self.m.size)
        check(rc, self.path, "msync")

    def prefault(self, int64_t pos=0, int64_t n=-1, int mode=PF_WRITE):
        """Fault pages in with the GIL released: PREFAULT_WRITE warms a segment nobody uses
        yet, PREFAULT_AHEAD warms ahead of a live writer without touching bytes,
        PREFAULT_READ for reading."""
        cdef int rc
        if n < 0:
            n = self.m.size - pos
        if mode != PF_READ and mode != PF_WRITE and mode != PF_AHEAD:
            raise InvalidArgumentError(f"prefault mode {mode} is not a PREFAULT_* constant")
        self.check_range(pos, n)
        pin(self)
        try:
            with nogil:
                rc = rmq_map_prefault(&self.m, pos, n, mode)
        finally:
            unpin(self)
        check(rc, self.path, "prefault")

    def hold(self):
        """Pin the mapping (unmapping waits for the last release()); raises
        ``StoreClosedError`` when the segment is already closing. Kernels call pin()."""
        pin(self)

    def release(self):
        """Drop a pin hold() took; the last one unmaps a closing segment."""
        unpin(self)

    cdef int raise_closed(self) except -1:
        raise StoreClosedError(f"{self.path}: segment is closed")

    cdef int _unmap(self) except -1:
        cdef int rc = rmq_map_close(&self.m)
        self.unmapped = True
        return check(rc, self.path, "munmap")

    def close(self):
        """Unmap now, or when the last pin is released. Idempotent."""
        if self.exports:
            raise ViewExportedError(f"{self.path}: {self.exports} zero-copy view(s) still exported")
        if not made(self) and not self.drop():   # never made: nothing mapped
            return
        if self.closing or self.unmapped:
            return
        self.closing = True
        if self.pins == 0:
            self._unmap()

    def __getbuffer__(self, Py_buffer *view, int flags):
        """Zero-copy, read-only view of the whole file; blocks close() while it lives."""
        self.check_range(0, 0)
        PyBuffer_FillInfo(view, self, self.m.base, self.m.size, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1

    def __repr__(self):
        return f"<MappedSegment {self.path} wrote={self.wrote_pos} flushed={self.flushed_pos}>"


def inject_fault(str op not None, int64_t nth, int err, str match=""):
    """Tests only: make the ``nth`` next ``op`` ("open", "msync", "fallocate", "ftruncate",
    "fsync", "pwrite") on a file whose path contains ``match`` fail with errno ``err``; nth 0 disarms.
    The same as the RMQ_FAULTS environment variable (cext/rmq_fault.h)."""
    cdef bytes bop = op.encode(), bmatch = match.encode()
    if rmq_fault_set(rmq_fault_op(bop), nth, err, bmatch) < 0:
        raise InvalidArgumentError(f"bad fault {op!r} nth={nth} errno={err} match={match!r}")


def stall_fault(str op not None, bint on, str match=""):
    """Tests only: ``on`` makes every ``op`` (as inject_fault's) on a file whose path
    contains ``match`` wait, in whatever thread makes it and with no GIL, until called again
    with ``on`` False; a fault inject_fault armed for that call is met after the wait."""
    cdef bytes bop = op.encode(), bmatch = match.encode()
    if rmq_fault_stall(rmq_fault_op(bop), on, bmatch) < 0:
        raise InvalidArgumentError(f"bad stall {op!r} match={match!r}")


def stalled_thread(str op not None):
    """Tests only: the native thread id of the last ``op`` call that stalled since
    stall_fault(op, True), or 0."""
    return rmq_fault_stalled(rmq_fault_op(op.encode()))


FAULT_OPEN = RMQ_OP_OPEN
FAULT_FSYNC = RMQ_OP_FSYNC


def fault_point(int op, str path not None):
    """Raise the OSError an armed fault asks for at this ``op`` (FAULT_OPEN, FAULT_FSYNC)
    on ``path``: how the Python-level writers (files.py) join the injection. When no fault
    is armed this is one flag test."""
    cdef int err
    if not rmq_fault_armed:
        return
    err = rmq_fault_hit(op, os.fsencode(path), -1)
    if err:
        raise OSError(err, os.strerror(err), path)


cdef bint flush_due(MappedSegment seg, int least_pages) noexcept:
    """Whether ``seg.flush(least_pages)`` has bytes to msync: some written past the flushed
    position, at least ``least_pages`` pages of them unless the file is full."""
    cdef int64_t ps = rmq_page_size(), wrote = seg.wrote_pos, flushed = seg.flushed_pos
    if wrote <= flushed:
        return False
    return not (least_pages > 0 and wrote < seg.m.size and (wrote // ps - flushed // ps) < least_pages)


def flush_each(list segs, int least_pages=0):
    """``seg.flush(least_pages)`` of every segment of ``segs``, their msyncs made with the
    GIL released once for them all: a thread that takes the GIL back from a writer putting
    in a loop holds that writer up each time. Segments closed meanwhile (retention) are
    passed over. The first failed msync ends it and raises, as flush does; the segments
    before it are flushed."""
    cdef Py_ssize_t n = len(segs), k = 0, i, done = 0
    cdef int rc = 0
    cdef MappedSegment seg
    cdef rmq_map_t **maps = <rmq_map_t **>malloc(max(1, n) * sizeof(rmq_map_t *))
    cdef int64_t *spans = <int64_t *>malloc(max(1, n) * 2 * sizeof(int64_t))
    cdef list held = []
    if maps == NULL or spans == NULL:
        free(maps)
        free(spans)
        raise MemoryError()
    try:
        for seg in segs:
            if seg.closing or seg.unmapped or not made(seg) or not flush_due(seg, least_pages):
                continue
            pin(seg)
            held.append(seg)
            maps[k], spans[2 * k], spans[2 * k + 1] = &seg.m, seg.flushed_pos, seg.wrote_pos
            k += 1
        with nogil:
            for i in range(k):
                rc = rmq_map_sync(maps[i], spans[2 * i], spans[2 * i + 1] - spans[2 * i])
                if rc:
                    break
                done += 1
        for i in range(done):
            seg = <MappedSegment>held[i]
            if spans[2 * i + 1] > seg.flushed_pos:
                seg.flushed_pos = spans[2 * i + 1]
        if rc:
            check(rc, (<MappedSegment>held[done]).path, "msync")
    finally:
        for seg in held:
            unpin(seg)
        free(maps)
        free(spans)


cdef class SegmentList:
    """What SegmentQueue publishes for readers and the appender, who read it per call as C
    fields (an attribute of a plain Python object cost a put 160 instructions):
    ``segments`` (a list replaced, never changed, as segments come and go), ``last`` (its
    newest, or None), ``file_size``, ``_end`` (read-only: where recovery found the
    data to end; None on a writer) and ``premade`` (base offset -> segment that make_room
    created ahead of a batch, for the appender to take and publish in C: see
    Appender._roll), ``flusher`` (None, or the native flusher that must track every
    segment published: _flusher.Flusher.track) and ``follower`` (None, or the native
    dispatch loop, offered every segment published: _reput.Reput.offer)."""


cpdef int announce(SegmentList queue, MappedSegment seg) except -1:
    """Tell the flusher and the dispatch loop of ``queue``'s newly published last ``seg``."""
    if queue.flusher is not None:
        queue.flusher.track(seg)
    if queue.follower is not None:
        queue.follower.offer(seg)
    return 0


cpdef int64_t queue_end(SegmentList queue) except -1:
    """SegmentQueue.max_offset: the end of written data, ``queue._end`` when recovery set
    one (read-only), else the newest segment's base plus its write position (0: none).
    A C function so that readers in C (get_messages) need no Python frame for it."""
    cdef MappedSegment last
    if queue._end is not None:
        return queue._end
    last = queue.last
    return 0 if last is None else last.base_offset + last.wrote_pos


cpdef MappedSegment queue_find(SegmentList queue, int64_t offset):
    """SegmentQueue.find: the segment of ``queue.segments`` (a list replaced, never
    changed, when segments come and go) that holds ``offset``, or None. A closed segment
    is found too: reading it raises StoreClosedError."""
    cdef list segs = queue.segments
    cdef Py_ssize_t lo = 0, hi = len(segs), mid
    cdef MappedSegment seg
    while lo < hi:      # the first segment whose base is past ``offset``
        mid = (lo + hi) >> 1
        if (<MappedSegment>segs[mid]).base_offset <= offset:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return None
    seg = <MappedSegment>segs[lo - 1]
    return seg if offset - seg.base_offset < queue.file_size else None


cdef extern from *:
    """
    static inline int rmq_flag_get(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rmq_flag_put(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int64_t rmq_pos_get(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    """
    int rmq_flag_get(const int *p) nogil
    void rmq_flag_put(int *p, int v) nogil
    int64_t rmq_pos_get(const int64_t *p) nogil


cdef class Waker:
    """A background thread's sleep that takes no GIL: ``wait_appended`` polls a segment's
    write position and the flag every millisecond with the GIL released, so an idle thread
    never takes the GIL from the threads doing work; ``set`` (from any thread) ends a wait
    early, ``clear`` re-arms it."""
    cdef int flag

    def set(self):
        rmq_flag_put(&self.flag, 1)

    def clear(self):
        rmq_flag_put(&self.flag, 0)

    def wait_appended(self, MappedSegment seg, int64_t pos, double timeout):
        """Until ``seg`` is written past ``pos`` (True; a writer moving on to the next
        segment first fills this one), or the flag is set or ``timeout`` seconds pass
        (False). ``seg`` None: the flag and the time only."""
        cdef const int64_t *wrote = NULL if seg is None else &seg.wrote_pos
        cdef int64_t steps = <int64_t>(timeout * 1000.0) if timeout > 0 else 0
        cdef timespec ms
        cdef bint grew = False
        ms.tv_sec, ms.tv_nsec = 0, 1000000
        with nogil:
            while True:
                if wrote != NULL and rmq_pos_get(wrote) > pos:
                    grew = True
                    break
                if rmq_flag_get(&self.flag) or steps <= 0:
                    break
                nanosleep(&ms, NULL)
                steps -= 1
        return grew
