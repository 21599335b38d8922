"""ConsumeQueue: a topic/queue's index of commitlog positions, and the table of all of them."""
from __future__ import annotations

import bisect
import logging
import os
import threading
from typing import Callable

import numpy as np

from rmqstore import _cq
from rmqstore._segment import flush_each
from rmqstore.config import StoreConfig
from rmqstore.errors import CorruptStoreError, InvalidArgumentError
from rmqstore.files import list_dir
from rmqstore.segments import SegmentQueue
from rmqstore.topics import is_safe_dirname

log = logging.getLogger(__name__)
MAX_QUEUE_ID = (1 << 31) - 1
ENTRY = _cq.ENTRY_SIZE
MAX_LOGIC_OFFSET = (1 << 63) - 1   # of a consume queue's bytes (queue offset x 20)
MIN_RECORD = 92   # bytes of the smallest record: v1 fixed fields, IPv4 hosts, a 1-byte topic, no body
HOLE_SIZE = 0x7FFFFFFF   # RocketMQ fillPreBlank entries: (0, Integer.MAX_VALUE, 0)


def check_boundary(boundary: str) -> str:
    """``boundary`` if it names an offset_by_time rule, else InvalidArgumentError."""
    if boundary not in ("lower", "upper", "nearest"):
        raise InvalidArgumentError(f"boundary must be 'lower', 'upper' or 'nearest', not {boundary!r}")
    return boundary


class ConsumeQueue:
    """The consume queue of one topic/queue.

    Layout: ``consumequeue/{topic}/{queueId}/{first logical byte:020d}``, files of
    ``entries_per_file`` x 20 bytes; entry n (queue offset n) sits at logical byte 20n::

        +--------------------+-----------+------------------+
        | commitlog off  i64 | size  i32 | tags code   i64  |   big-endian
        +--------------------+-----------+------------------+

    Thread-safety: only the dispatcher appends; readers use published positions.
    Crash behaviour: entries past the last valid one, or pointing past the recovered
    commitlog end, are cut by ``recover``/``truncate_dirty``; dispatch re-creates them.
    """

    def __init__(self, root: str, topic: str, queue_id: int, entries_per_file: int, readonly: bool = False,
                 file_mode: int = 0o600, dir_mode: int = 0o700, reserve_ahead: int = 0) -> None:
        if not is_safe_dirname(topic):      # never a path outside consumequeue/
            raise CorruptStoreError(f"topic {topic!r} cannot name a consume-queue directory")
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, topic, str(queue_id))
        # a small queue uses a few pages of its 6 MB file: no read-around filling the rest with zeros
        self.segments = SegmentQueue(self.directory, entries_per_file * ENTRY, readonly, file_mode, dir_mode,
                                     reserve_ahead=reserve_ahead, readahead=False)
        self.max_physic_offset = -1   # end (offset + size) of the last entry's message
        self.min_logic_offset = 0

    @property
    def file_size(self) -> int:
        return self.segments.file_size

    def load(self) -> ConsumeQueue:
        self.segments.load()
        return self

    def valid_end(self, ordered: bool = True) -> tuple[int, int]:
        """(the file offset after the last valid entry, the commitlog offset its message
        ends at, -1 with none) over the last three files, as RocketMQ's ConsumeQueue.recover
        reads them, and, if ``ordered``, up to an entry out of commitlog order (a writer's
        recovery cuts there and dispatches again; a read-only view shows such an entry
        and what follows, and reads report it); changes nothing."""
        segs = self.segments.segments
        end, phy_end = (segs[0].base_offset if segs else 0), -1
        for seg in segs[-3:]:
            pos, phy_end = _cq.valid_end(seg, 0, seg.size, phy_end, ordered)
            end = seg.base_offset + pos
            if pos < seg.size:
                break
        return end, phy_end

    def recover(self, valid: tuple[int, int] | None = None) -> int:
        """Set the write position after the last valid entry (RocketMQ ConsumeQueue.recover),
        ``valid`` if given (what valid_end returned); returns the bytes cut off."""
        if not self.segments.segments:
            return 0
        end, phy_end = valid or self.valid_end()
        if phy_end >= 0:
            self.max_physic_offset = phy_end
        cut = self.segments.truncate(end)
        self.min_logic_offset = self.segments.min_offset
        return cut

    def truncate_dirty(self, phy_offset: int) -> tuple[int, bool]:
        """Remove entries whose message ends after ``phy_offset`` (the recovered commitlog
        end): one starting at or after it (a crash's tail), or a damaged one whose size runs
        past it. Returns the bytes cut, and whether the first entry cut was such a damaged
        one (its message is in the log: to be dispatched again)."""
        segs = self.segments.segments
        if not segs:
            return 0, False
        end = self.max_logic_offset_bytes
        lo, hi = self.min_logic_offset // ENTRY, end // ENTRY
        # entries are in commitlog order: binary search the first one ending past phy_offset
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.entry(mid)
            if e is not None and e[1] != HOLE_SIZE and e[0] + e[1] > phy_offset:
                hi = mid
            else:
                lo = mid + 1
        if lo * ENTRY >= end:
            return 0, False
        first = self.entry(lo)
        return self._cut_at(lo), first is not None and first[0] < phy_offset

    def _cut_at(self, index: int) -> int:
        """Remove entries from queue offset ``index`` on; returns the bytes cut."""
        end = self._end_before(index)
        cut = self.segments.truncate(index * ENTRY)
        self.max_physic_offset = end
        return cut

    def _end_before(self, index: int) -> int:
        """Where the message of the last entry before ``index`` ends (of the 64 before it;
        -1 for none but blank ones)."""
        for i in range(index - 1, max(self.min_logic_offset // ENTRY, index - 64) - 1, -1):
            e = self.entry(i)
            if e is not None and e[1] != HOLE_SIZE:
                return e[0] + e[1]
        return -1

    def cut_shifted(self, queue_offset_at: Callable[[int], int | None]) -> int:
        """Recovery: remove the entries from the first one whose message's QUEUEOFFSET is
        ahead of the entry's own queue offset (``queue_offset_at(phy)``: a record's
        QUEUEOFFSET, None when it cannot be read), where dispatch would put it at its own
        offset (``put``: the commitlog bytes before it could hold the records missing;
        else the field is corrupt and the entry stays). Dispatch then puts them back where
        they belong. The newest entry is checked first and, when it is ahead, the first
        one ahead is found by binary search (a shift moves every later entry), so a sound
        queue costs one record read. Returns the bytes cut."""
        def ahead(i: int) -> bool | None:   # None: a blank entry or an unreadable record
            e = self.entry(i)
            if e is None or e[1] == HOLE_SIZE:
                return None
            q = queue_offset_at(e[0])
            return None if q is None else q > i
        lo, hi = self.min_offset, self.max_offset
        last = next((i for i in range(hi - 1, max(lo, hi - 64) - 1, -1) if ahead(i) is not None), None)
        if last is None or not ahead(last):
            return 0
        good, bad = lo - 1, last   # entries <= good are not ahead (or cannot tell), bad is
        while bad - good > 1:
            mid = (good + bad) // 2
            k = next((j for j in range(mid, bad) if ahead(j) is not None), bad)
            if k < bad and not ahead(k):
                good = k
            else:
                bad = mid if k == bad else k
        e = self.entry(bad)
        if e is None or e[1] == HOLE_SIZE:
            return 0
        q = queue_offset_at(e[0])
        if q is None or (q - bad) * MIN_RECORD > e[0] - self._end_before(bad):   # a corrupt QUEUEOFFSET: kept
            return 0
        log.error("%s: consume-queue entry %d points at the message of queue offset %d (entries shifted); cut "
                  "from there and dispatched again", self.directory, bad, q)
        return self._cut_at(bad)

    # -- positions ------------------------------------------------------------------------
    @property
    def max_logic_offset_bytes(self) -> int:
        return self.segments.max_offset

    @property
    def min_offset(self) -> int:
        """RocketMQ getMinOffsetInQueue."""
        return self.min_logic_offset // ENTRY

    @property
    def max_offset(self) -> int:
        """RocketMQ getMaxOffsetInQueue: the next queue offset to be written."""
        return self.segments.max_offset // ENTRY

    # -- writing --------------------------------------------------------------------------
    def put(self, phy_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Append the entry for ``queue_offset``; an entry already present is skipped
        (re-dispatch after recovery): one for a message that ends at or before the last
        entry's, or, as RocketMQ's putMessagePositionInfo, one for ``queue_offset``. A gap
        is filled with RocketMQ's blank entries (as far as the commitlog bytes skipped could
        hold the records missing; past that, a corrupt QUEUEOFFSET, it is appended where the
        queue is). A first offset whose file would end past
        int64 (a corrupt QUEUEOFFSET) starts at 0."""
        expect = queue_offset * ENTRY
        cur = self.segments.max_offset
        if expect < cur or phy_offset + size <= self.max_physic_offset:
            return False
        seg = self.segments.last
        if seg is None:
            if expect > MAX_LOGIC_OFFSET - self.file_size:   # no file can start there (int64)
                log.error("%s: first queue offset %d is past the largest one; starting at 0", self.directory,
                          queue_offset)
                expect = 0
            seg = self.segments.roll(expect - expect % self.file_size)
            self.min_logic_offset = expect
            cur = seg.base_offset
            if expect > cur:
                log.warning("%s: first queue offset %d; filling the file before it", self.directory, queue_offset)
        elif expect > cur and not self._gap_fits(cur, expect, phy_offset):
            # RocketMQ putMessagePositionInfo: "logic queue order maybe wrong", appends where
            # it is; filling a gap more records than the commitlog bytes between could hold
            # would let one corrupt QUEUEOFFSET create files without end
            log.error("%s: queue offset %d skips from %d, more records than commitlog offsets %d..%d can "
                      "hold (a corrupt QUEUEOFFSET); appending at %d", self.directory, queue_offset,
                      cur // ENTRY, self.max_physic_offset, phy_offset, cur // ENTRY)
            expect = cur
        elif expect > cur:   # its predecessors are gone (deleted before dispatch): offsets never shift
            log.error("%s: queue offsets %d..%d have no records left; blank entries keep queue offset %d at "
                      "its message", self.directory, cur // ENTRY, queue_offset - 1, queue_offset)
        while True:
            if seg.wrote_pos >= seg.size:
                seg = self.segments.roll()
            if seg.base_offset + seg.wrote_pos >= expect:
                break
            _cq.append_entry(seg, 0, HOLE_SIZE, 0)
        _cq.append_entry(seg, phy_offset, size, tags_code)
        self.max_physic_offset = phy_offset + size
        return True

    def _gap_fits(self, cur: int, expect: int, phy_offset: int) -> bool:
        """Whether the queue offsets missing between byte ``cur`` and ``expect`` could be
        records in the commitlog between the last entry's message and ``phy_offset``."""
        missing = (expect - cur) // ENTRY
        return 0 <= self.max_physic_offset and missing * MIN_RECORD <= phy_offset - self.max_physic_offset

    def put_run(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray, queue_offsets: np.ndarray) -> None:
        """Append many entries (numpy arrays, commitlog order): ``begin_run``, then
        ``end_run`` for what it leaves."""
        i = self.begin_run(phy, size, tags, queue_offsets)
        if i < len(phy):
            self.end_run(phy, size, tags, i)

    def begin_run(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray, queue_offsets: np.ndarray) -> int:
        """Append the entries of a run that need ``put``: the first (duplicates skipped, odd
        offsets handled), and all when the queue offsets then do not continue one by one.
        Returns where the rest, to be appended one after another by ``end_run``, begins:
        ``len(phy)`` when none is left."""
        n = len(phy)
        i = 0
        while i < n and not self.put(int(phy[i]), int(size[i]), int(tags[i]), int(queue_offsets[i])):
            i += 1
        if i == n:
            return n
        i += 1
        first = int(queue_offsets[i - 1])
        if i < n and int(queue_offsets[n - 1]) - first == n - i and \
                self.segments.max_offset == (first + 1) * ENTRY:
            return i
        for j in range(i, n):
            self.put(int(phy[j]), int(size[j]), int(tags[j]), int(queue_offsets[j]))
        return n

    def end_run(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray, i: int) -> None:
        """Append entries ``i..`` of a run whose entries before them are in (by ``begin_run``
        or the dispatcher's ``_cq.append_runs``), file by file; they continue one by one."""
        n = len(phy)
        while i < n:
            seg = self.segments.last
            if seg.wrote_pos >= seg.size:
                seg = self.segments.roll()
            i += _cq.append_entries(seg, phy, size, tags, i, n)
        self.max_physic_offset = int(phy[n - 1]) + int(size[n - 1])

    def flush(self, least_pages: int = 0) -> bool:
        return self.segments.flush(least_pages)

    # -- reading --------------------------------------------------------------------------
    def entry(self, index: int) -> tuple[int, int, int] | None:
        """(phy_offset, size, tags_code) of queue offset ``index``, or None."""
        arr = self.read(index, 1)
        if len(arr) == 0:
            return None
        e = arr[0]
        return int(e["phy_offset"]), int(e["size"]), int(e["tags_code"])

    def read(self, index: int, count: int, within_file: bool = False) -> np.ndarray:
        """Up to ``count`` entries from queue offset ``index`` as a numpy array
        (``phy_offset``, ``size``, ``tags_code``); ``within_file`` stops at the end of the
        file holding ``index``, like RocketMQ's getIndexBuffer."""
        pos = index * ENTRY
        if index < self.min_offset or count <= 0:
            return np.empty(0, _cq.ENTRY_DTYPE)
        parts, want = [], count
        while want > 0:
            seg = self.segments.find(pos)
            if seg is None:
                break
            rel = pos - seg.base_offset
            n = min(want, max(0, seg.wrote_pos - rel) // ENTRY)
            if n <= 0:
                break
            parts.append(_cq.read_entries(seg, rel, n))
            want -= n
            pos += n * ENTRY
            if within_file or rel + n * ENTRY < seg.size:
                break
        if not parts:
            return np.empty(0, _cq.ENTRY_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def offset_by_time(self, timestamp: int, store_timestamp_at: Callable[[int], int], min_phy_offset: int,
                       boundary: str = "lower") -> int:
        """The queue offset for ``timestamp`` (ms), by store times (``store_timestamp_at`` of a
        commitlog offset, negative when unreadable; entries pointing below ``min_phy_offset``,
        deleted by retention, count as older than any time). ``boundary``:

        - ``"lower"`` (RocketMQ 5.x BoundaryType.LOWER): the first offset stored at or after
          ``timestamp``; ``max_offset`` when every message is older. A consumer reset there
          skips nothing stored at or after the time, however many share its millisecond.
        - ``"upper"`` (BoundaryType.UPPER): the last offset stored at or before ``timestamp``;
          ``min_offset`` when every message is newer.
        - ``"nearest"``: RocketMQ 4.9's getOffsetInQueueByTime, exactly: the file chosen by
          time, then the exact hit or the nearer neighbour inside it (0 when unknown). It can
          land after messages stored at ``timestamp`` itself; kept for compatibility.
        """
        if check_boundary(boundary) == "nearest":
            return self._offset_by_time_49(timestamp, store_timestamp_at, min_phy_offset)

        def time_at(offset: int) -> int:
            e = self.read(offset, 1)
            phy = int(e[0]["phy_offset"]) if len(e) else -1
            return store_timestamp_at(phy) if phy >= min_phy_offset else -1

        lo, hi = self.min_offset, self.max_offset
        if boundary == "lower":
            return bisect.bisect_left(range(lo, hi), True, key=lambda o: time_at(o) >= timestamp) + lo
        return max(lo, bisect.bisect_left(range(lo, hi), True, key=lambda o: time_at(o) > timestamp) + lo - 1)

    def _offset_by_time_49(self, timestamp: int, store_timestamp_at: Callable[[int], int],
                           min_phy_offset: int) -> int:
        segs = self.segments.segments
        if not segs:
            return 0
        seg = segs[-1]
        for s in segs[:-1]:
            # RocketMQ takes the first file modified at or after the time; a file's last
            # entry is when it was last written.
            last = self.read((s.base_offset + s.wrote_pos) // ENTRY - 1, 1)
            if len(last) and store_timestamp_at(int(last[0]["phy_offset"])) >= timestamp:
                seg = s
                break
        base = seg.base_offset
        low = max(0, self.min_logic_offset - base)
        high = seg.wrote_pos - ENTRY
        target = left = right = -1
        left_v = right_v = -1
        while high >= low:
            mid = (low + high) // (2 * ENTRY) * ENTRY
            e = self.read((base + mid) // ENTRY, 1)
            if not len(e):
                return 0
            phy = int(e[0]["phy_offset"])
            if phy < min_phy_offset:
                low, left = mid + ENTRY, mid
                continue
            t = store_timestamp_at(phy)
            if t < 0:
                return 0
            if t == timestamp:
                target = mid
                break
            if t > timestamp:
                high, right, right_v = mid - ENTRY, mid, t
            else:
                low, left, left_v = mid + ENTRY, mid, t
        if target != -1:
            off = target
        elif left_v == -1:
            off = right
        elif right_v == -1:
            off = left
        else:
            off = right if abs(timestamp - left_v) > abs(timestamp - right_v) else left
        return (base + off) // ENTRY

    def delete_below(self, phy_min: int) -> int:
        """Retention: drop files whose every entry points below ``phy_min``; move the min
        logical offset to the first entry at or above it. Returns files deleted."""
        segs = self.segments.segments
        doomed = []
        for seg in segs[:-1]:
            last = _cq.read_entries(seg, seg.size - ENTRY, 1)[0]
            if last["phy_offset"] + max(0, last["size"]) <= phy_min and last["size"] != HOLE_SIZE:
                doomed.append(seg)
            else:
                break
        if doomed:
            self.segments.delete_segments(doomed)
        self.correct_min_offset(phy_min)
        return len(doomed)

    def correct_min_offset(self, phy_min: int) -> None:
        """RocketMQ correctMinOffset: the first entry whose message is still in the commitlog,
        past whole files of entries below it (retention killed between deleting commitlog
        segments and deleting their queue files leaves them: looking at the first file only,
        the queue began inside the second, at entries pointing into deleted segments)."""
        for seg in self.segments.segments:
            arr = _cq.read_entries(seg, 0, seg.wrote_pos // ENTRY)
            ok = np.nonzero((arr["phy_offset"] >= phy_min) & (arr["size"] != HOLE_SIZE))[0]
            idx = int(ok[0]) if len(ok) else len(arr)
            self.min_logic_offset = max(self.min_logic_offset, seg.base_offset + idx * ENTRY)
            if len(ok):
                return

    def close(self) -> None:
        self.segments.close()


def _queue_id(tdir: str, name: str, names: list[str]) -> int | None:
    """The queue id directory ``name`` of ``tdir`` holds: ``name`` is its decimal spelling
    (``"0"``, ``"12"``), or None when it names no queue. A name that RocketMQ's
    Integer.parseInt reads as a queue in another spelling (``"01"``, ``"+1"``, ``"-1"``,
    other scripts' digits) is a CorruptStoreError: RocketMQ would load the queue's
    canonical directory in its place, and two names for one queue must not shadow each
    other. Other names (not a Java int) are ignored, as RocketMQ ignores them."""
    digits = name[1:] if name[:1] in "+-" else name
    if not digits.isdecimal():
        return None
    value = -int(digits) if name[0] == "-" else int(digits)
    if name == str(value) and 0 <= value <= MAX_QUEUE_ID:
        return value
    if not -(1 << 31) <= value <= MAX_QUEUE_ID:
        return None   # Integer.parseInt refuses it too
    if value < 0:
        raise CorruptStoreError(f"{os.path.join(tdir, name)}: RocketMQ reads this directory name as queue {value}, "
                                f"which no queue id can be")
    also = " (a directory of that name is there too)" if str(value) in names else ""
    raise CorruptStoreError(f"{os.path.join(tdir, name)}: RocketMQ reads this directory name as queue {value}, "
                            f"whose directory is {os.path.join(tdir, str(value))}{also}")


class ConsumeQueueTable:
    """Every consume queue of a store, created on first dispatch of a topic/queue."""

    def __init__(self, root: str, entries_per_file: int, readonly: bool = False, file_mode: int = 0o600,
                 dir_mode: int = 0o700, reserve_ahead: int = 0) -> None:
        self.root = os.path.join(str(root), "consumequeue")
        self.entries_per_file = entries_per_file
        self.readonly = readonly
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.reserve_ahead = reserve_ahead
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    @classmethod
    def of_store(cls, root: str, cfg: StoreConfig, readonly: bool = False) -> ConsumeQueueTable:
        """The table of the store at ``root``, with ``cfg``'s file sizes, modes and disk window."""
        return cls(root, cfg.consume_queue_entries, readonly, cfg.file_mode, cfg.dir_mode, cfg.logics_reserve_ahead())

    def load(self) -> ConsumeQueueTable:
        """Open every topic/queue directory found on disk (any topic name a store holds)."""
        for topic in sorted(list_dir(self.root)):
            tdir = os.path.join(self.root, topic)
            if not is_safe_dirname(topic) or not os.path.isdir(tdir):   # a stray file (.DS_Store) is no topic,
                continue                                                  # as RocketMQ's loadConsumeQueue skips it
            names = list_dir(tdir)
            for qname in sorted(names):
                qid = _queue_id(tdir, qname, names)
                if qid is None:
                    continue
                cq = ConsumeQueue(self.root, topic, qid, self.entries_per_file, self.readonly,
                                  self.file_mode, self.dir_mode, self.reserve_ahead)
                try:
                    cq.load()
                except BaseException:
                    cq.close()
                    raise
                self.queues[(topic, qid)] = cq
        return self

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self.queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(self.root, topic, queue_id, self.entries_per_file, self.readonly,
                                      self.file_mode, self.dir_mode, self.reserve_ahead)
                    self.queues = {**self.queues, (topic, queue_id): cq}
        return cq

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.queues})

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for t, q in self.queues if t == topic)

    def max_physic_offset(self) -> int:
        return max((cq.max_physic_offset for cq in self.queues.values()), default=-1)

    def flush(self, least_pages: int = 0) -> bool:
        """Flush every queue, their msyncs made with the GIL released once (flush_each);
        returns whether any queue's flushed position moved."""
        queues = [cq.segments for cq in list(self.queues.values())]
        flush_each([seg for q in queues for seg in q.unflushed()], least_pages)
        return any([q.advance_flushed() for q in queues])

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
