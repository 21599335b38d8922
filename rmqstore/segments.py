"""SegmentQueue: an ordered run of fixed-size mapped files named by their start offset."""
import errno
import os

import numpy as np

from rmqstore._segment import MappedSegment, SegmentList, announce, flush_each, queue_end, queue_find
from rmqstore._toucher import Toucher
from rmqstore.errors import CorruptStoreError, StoreClosedError, StoreError
from rmqstore.files import file_size, list_dir, make_dirs, number_name, only_zeros

_MAX_OFFSET = (1 << 63) - 1


def segment_name(offset):
    return f"{offset:020d}"


def list_segment_files(directory):
    """(offset, path) of every segment file in ``directory`` (named by its start offset in
    20 ASCII digits), in offset order; a symlinked directory is refused. Another name of
    decimal digits ('123', 21 digits, one past int64, other scripts' digits), which
    RocketMQ would read as some offset, is a CorruptStoreError; other names are ignored."""
    found = []
    for n in list_dir(directory):
        if n.isdecimal():
            offset = number_name(n, _MAX_OFFSET) if len(n) == 20 else None
            if offset is None:
                raise CorruptStoreError(f"{os.path.join(directory, n)}: not a segment name (the start offset in 20 "
                                        f"digits, at most {_MAX_OFFSET})")
            found.append((offset, os.path.join(directory, n)))
    return sorted(found)


def detect_file_size(directories, configured):
    """The segment size of the files in ``directories`` (one segment queue each): the
    ``configured`` one when any file has it, else the size most of them have (the first
    one's on a tie), so that one damaged file is the one a size check then names; None
    when there are none. A file removed since the listing, or one that is no regular file
    (loading names it), is passed over."""
    sizes = []
    for directory in directories:
        for _, path in list_segment_files(directory):
            try:
                sizes.append(file_size(path))
            except OSError:
                pass
    if not sizes:
        return None
    return configured if configured in sizes else max(sizes, key=sizes.count)


class SegmentQueue(SegmentList):
    """Segments of ``file_size`` bytes in ``directory``; file N starts at offset N.

    Layout: ``{directory}/{start offset:020d}``, each exactly ``file_size`` bytes and
    starting where the previous one ends. Loading refuses a file of another size or a gap
    (CorruptStoreError), so nothing shorter than its mapping is ever mapped.

    Thread-safety: one writer appends/rolls (holding the store's write lock); readers call
    ``find`` without locks (the list is replaced, never mutated in place). The next segment
    is put in ``premade`` before it exists and made (its file created, allocated and
    mapped, then its first pages faulted in) by a native thread (``toucher``, ``rmq-touch``)
    that never takes the GIL, like RocketMQ's AllocateMappedFileService and warmMappedFile;
    the appender's roll takes it in C once made (a pointer swap), a roll that comes first
    makes it itself or waits (MappedSegment.made). ``segments``, ``last``, ``file_size``,
    ``_end`` and ``premade`` are SegmentList's C fields.
    """

    def __init__(self, directory, file_size, readonly=False, file_mode=0o600, dir_mode=0o700,
                 preallocate=False, prefault_bytes=-1, reserve_ahead=0, readahead=True):
        self.directory = str(directory)
        self.file_size = file_size
        self.readahead = readahead             # False: new files are mapped without read-around
        self.readonly = readonly
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.segments = []      # replaced, never changed, as segments come and go; with the newest
        self.last = None        # of them, read per put, key query and get_messages
        self.toucher = Toucher("rmq-touch") if preallocate and not readonly else None
        self.prefault_bytes = prefault_bytes   # of a preallocated segment; -1 = all of it
        self.reserve_ahead = reserve_ahead     # disk blocks allocated ahead of the writer; 0 = whole files
        self.premade = {}      # offset -> MappedSegment made ahead, or by make_room (a C field)
        self._closed = False
        self.flushed_where = 0
        self._end = None       # read-only: where recovery found the data to end
        self.dropped = False   # load() left out a short newest file of zeros

    # -- loading -----------------------------------------------------------------------
    def load(self):
        """Map every existing segment (read-write unless read-only). Positions start at
        the full size; recovery sets the real ones. Read-only, files a live writer removes
        (retention oldest first; close, the newest; a rebuild, newest first) or is still
        creating are left out: the rest is a consistent run."""
        segs = []
        files = list_segment_files(self.directory)
        try:
            for k, (offset, path) in enumerate(files):
                try:
                    seg = self._load_one(offset, path, files[k + 1:], segs)
                except OSError as e:
                    if e.errno != errno.ENOENT or not self.readonly:
                        raise
                    if segs:   # removed since listing by a live writer's close (the newest) or rebuild
                        break   # (newest first, so the rest is gone too): what was read is a run
                    continue   # ... or its retention (oldest first)
                if seg is None:   # being created: what a writer makes after it is not there yet
                    break
                segs.append(seg)
        except BaseException:
            for s in segs:
                s.close()
            raise
        self._publish(segs)
        return self

    def _being_made(self, path, size, later):
        """Whether the short file ``path`` is one a writer is creating, or a kill cut while it
        created it (before it reserved its blocks): the newest, holding only zeros; read-only
        also the last one still there (a live rebuild makes files again once it removed
        them all) or one growing under us."""
        if later and (not self.readonly or any(os.path.lexists(p) for _, p in later)):
            return False
        return only_zeros(path) or self.readonly and file_size(path) != size

    def _load_one(self, offset, path, later, segs):
        size = file_size(path)
        if size < self.file_size and self._being_made(path, size, later):
            if not self.readonly:
                os.unlink(path)
            self.dropped = True
            return None
        if size != self.file_size:
            raise CorruptStoreError(f"{path}: {size} bytes, expected {self.file_size}")
        if offset > _MAX_OFFSET - self.file_size:   # its end would overflow every int64 position
            raise CorruptStoreError(f"{path}: starts at {offset}, its end is past the largest offset {_MAX_OFFSET}")
        if segs and offset != segs[-1].base_offset + self.file_size:
            raise CorruptStoreError(
                f"{path}: starts at {offset}, expected {segs[-1].base_offset + self.file_size}"
                " (missing segment)")
        seg = MappedSegment(path, offset, self.file_size, readonly=self.readonly, ahead=self.reserve_ahead)
        seg.wrote_pos = seg.flushed_pos = self.file_size
        return seg

    def _publish(self, segs):
        self.segments = segs
        self.last = segs[-1] if segs else None
        if segs:
            announce(self, segs[-1])

    # -- lookup -------------------------------------------------------------------------
    @property
    def min_offset(self):
        segs = self.segments
        return segs[0].base_offset if segs else -1

    @property
    def max_offset(self):
        """End of written data: last segment's base + its write position (0 when empty)."""
        return queue_end(self)

    def find(self, offset):
        """The segment holding ``offset``, or None."""
        return queue_find(self, offset) if 0 <= offset < 1 << 63 else None

    # -- writing ------------------------------------------------------------------------
    def _new(self, offset, defer=False):
        return MappedSegment(os.path.join(self.directory, segment_name(offset)), offset, self.file_size,
                             create=True, mode=self.file_mode, reserve=self.reserve_ahead or -1,
                             ahead=self.reserve_ahead, readahead=self.readahead, defer=defer)

    def _open_new(self, offset):
        make_dirs(self.directory, self.dir_mode)
        seg = self._new(offset)
        seg.wrote_pos = seg.flushed_pos = 0
        return seg

    def _take(self, offset):
        """The segment made ahead at ``offset`` (made here or waited for, see
        MappedSegment.made), or None: none is there, or making it failed (it is dropped,
        and the caller's own open says why)."""
        seg = self.premade.get(offset)
        if seg is None:
            return None
        try:
            seg.made()
        except StoreError:
            if self.premade.get(offset) is seg:
                del self.premade[offset]
            return None
        return seg

    def roll(self, offset=None):
        """Append a new segment at ``offset`` (default: after the last) and return it. Each
        step leaves the segment where the next roll finds it (``premade``, or its file,
        which creating opens again), so an exception a signal handler raises anywhere in
        between (KeyboardInterrupt) loses nothing and blocks no later roll."""
        if self._closed:
            raise StoreClosedError(f"{self.directory}: closed")
        if offset is None:
            offset = self.max_offset if not self.segments else self.segments[-1].base_offset + self.file_size
        seg = self._take(offset) or self._open_new(offset)
        self._publish(self.segments + [seg])
        self.premade.pop(offset, None)
        self._prepare(offset + self.file_size)
        return seg

    def prepare_first(self):
        """An empty queue that preallocates starts making its first segment now, in the
        background, so the first append does not wait for a file to be created. The queue's
        directory is made for it, never the store's (one removed meanwhile is the open's
        to report)."""
        if self.last is None and os.path.isdir(os.path.dirname(self.directory)):
            make_dirs(self.directory, self.dir_mode)
            self._prepare(0)

    def _prepare(self, offset):
        """Have the toucher's thread make the segment at ``offset`` for the next roll, then
        fault its first pages in (a roll used to wait for the whole prefault: 4-11 ms for
        16 MiB). It is in ``premade`` before it is handed over: an interrupt in between
        leaves it for the roll to make (MappedSegment.made), never a file nobody knows of."""
        if self.toucher is not None and not self._closed and offset not in self.premade:
            seg = self._new(offset, defer=True)
            self.premade[offset] = seg
            want = self.prefault_bytes if self.prefault_bytes >= 0 else self.file_size
            self.toucher.make(seg, want)   # never a page without its block (the thread clamps)

    def make_room(self, last, ends):
        """Create now the segments after ``last`` that an append is about to roll into, one
        per entry of ``ends``, with their disk blocks up to that end allocated, so a full
        disk fails a batch before any of it is written. All or none: on an error the files
        made here are removed."""
        made = []
        try:
            for k, end in enumerate(ends, 1):
                base = last.base_offset + k * self.file_size
                seg = self._take(base)
                if seg is None:
                    self.premade[base] = seg = self._open_new(base)
                    made.append(seg)
                seg.reserve(end)
        except BaseException:
            for seg in made:
                del self.premade[seg.base_offset]
                self._delete(seg)
            raise

    def flush(self, least_pages=0):
        """Flush every segment from the one holding ``flushed_where`` (one retention deleted
        meanwhile is passed over); returns whether the flushed position moved. OSError
        propagates (the caller makes the store read-only)."""
        flush_each(self.unflushed(), least_pages)
        return self.advance_flushed()

    def unflushed(self):
        """The segments from the one holding ``flushed_where`` on."""
        return [seg for seg in self.segments if seg.base_offset + self.file_size > self.flushed_where]

    def advance_flushed(self):
        """Move ``flushed_where`` past what the segments' own flushed positions cover
        (after flush_each); returns whether it moved."""
        before = self.flushed_where
        for seg in self.unflushed():
            if seg.closed:   # retention deleted it since the list was read: nothing to keep
                continue
            self.flushed_where = seg.base_offset + seg.flushed_pos
            if seg.flushed_pos < seg.wrote_pos:
                break
        return self.flushed_where != before

    def truncate(self, offset):
        """Drop everything at and after ``offset``: later files are deleted, newest first (a
        kill meanwhile leaves a run of files, not one with a gap that no open accepts), then
        the one holding it gets its tail zero-filled (when anything but zeros is there).
        Segments made ahead past ``offset`` go first: left on disk, a kill would leave a gap
        before them that no open accepts. Returns the bytes of old data discarded (0 when
        only unwritten space followed)."""
        for base in sorted((b for b in self.premade if b > offset), reverse=True):
            self._discard(self.premade.pop(base))
        after = [self._bytes_after(seg, offset) for seg in self.segments]
        keep = [seg for seg in self.segments if not self._wholly_after(seg, offset)]
        for seg in reversed(self.segments[len(keep):]):
            self._delete(seg)
        for seg, dropped in zip(keep, after, strict=False):   # keep is a prefix of the segments
            pos = offset - seg.base_offset
            if pos < seg.size:
                if not self.readonly and dropped:
                    seg.zero(pos, seg.size - pos)
                    seg.sync_all()
                seg.wrote_pos = seg.flushed_pos = pos
        self._publish(keep)
        self.flushed_where = min(self.flushed_where, offset)
        return sum(after)

    def view_until(self, offset):
        """Read-only: the data ends at ``offset`` (what a writer's recovery would keep).
        Segments after it stay mapped for ``verify`` but hold no readable data, so a live
        writer's pre-made next file does not move the end; no file is touched."""
        for seg in self.segments:
            seg.wrote_pos = seg.flushed_pos = min(seg.size, max(0, offset - seg.base_offset))
        self._end = offset

    def bytes_after(self, offset):
        """The bytes of old data ``truncate(offset)`` would discard; changes nothing."""
        return sum(self._bytes_after(seg, offset) for seg in self.segments)

    def _wholly_after(self, seg, offset):
        return seg.base_offset > offset or (seg.base_offset == offset and seg is not self.segments[0])

    def _bytes_after(self, seg, offset):
        if self._wholly_after(seg, offset):
            return seg.size if _has_data(seg, 0) else 0
        pos = offset - seg.base_offset
        return seg.size - pos if pos < seg.size and _has_data(seg, pos) else 0

    def delete_segments(self, segs):
        """Remove these (old) segments from the queue and the disk."""
        gone = set(id(s) for s in segs)
        self._publish([s for s in self.segments if id(s) not in gone])
        for s in segs:
            self._delete(s)

    def prepare_next(self):
        """Start making the segment after the last in the background (what roll() does
        itself), after an append took segments from ``premade``."""
        self._prepare(self.last.base_offset + self.file_size)

    def _discard(self, seg):
        """Remove a segment made ahead and never used (it holds no data, so reopening sees
        none); one not made yet is dropped, one being made waited for."""
        if seg.drop():
            self._delete(seg)

    def _unused(self, offset):
        """Whether a segment made ahead at ``offset`` lies past the last segment in use, so
        no write reached it. One at an offset in use is that segment's own file (a roll took
        the segment made ahead while a signal stopped the bookkeeping after it): never removed."""
        return self.last is None or offset > self.last.base_offset

    def _delete(self, seg):
        seg.close()
        if not self.readonly:
            try:
                os.unlink(seg.path)
            except FileNotFoundError:
                pass

    def close(self):
        self._closed = True
        if self.toucher is not None:
            self.toucher.close()   # the make under way ends first; those queued are dropped below
        for seg in self.premade.values():   # made ahead, or for a batch that then failed: no data
            if self._unused(seg.base_offset):
                self._discard(seg)
        self.premade = {}
        for seg in self.segments:
            seg.close()


SCAN_WINDOW = 16 << 20   # bytes first_nonzero compares before letting go of their pages


def first_nonzero(seg, pos, end):
    """Offset (in ``seg``) of the first byte but zero in ``[pos, end)``, -1 when none. Only
    the parts the file holds data for are read (holes are zeros: a 1 GiB segment with
    little written costs milliseconds and no memory), a window at a time, each window's
    pages let go of once compared, so memory stays a window whatever the file's size."""
    for lo, hi in seg.data_ranges(pos, end):
        for w in range(lo, hi, SCAN_WINDOW):
            n = min(hi, w + SCAN_WINDOW) - w
            # a copy, not a view: no export of the segment outlives this call (a traceback
            # holding one made the caller's close on an error refuse with ViewExportedError)
            nz = _first_nonzero(np.frombuffer(seg.read(w, n), np.uint8), w)
            seg.let_go(w, n)
            if nz >= 0:
                return nz
    return -1


def _first_nonzero(chunk, at):
    """``at`` plus the index of the first non-zero byte of ``chunk`` (aligned words
    compared first), -1 for none."""
    head = -at % 8
    words = chunk[head:head + (len(chunk) - head) // 8 * 8].view(np.uint64)
    if not (chunk[:head].any() or words.any() or chunk[head + len(words) * 8:].any()):
        return -1
    return at + int(np.flatnonzero(chunk)[0])


def _has_data(seg, pos, probe=4096):
    """Whether anything but zeros follows ``pos`` within the first ``probe`` bytes."""
    n = min(probe, seg.size - pos)
    return n > 0 and bool(seg.read(pos, n).strip(b"\0"))
