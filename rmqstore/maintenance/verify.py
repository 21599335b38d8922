"""Verify: check a whole store against itself without changing a byte.

What is checked (``verify``, given a store's components; ``MessageStore.verify`` runs it):

1. Commitlog, segment by segment: every record's structure and body CRC (the scan kernel,
   GIL released). A CRC mismatch is reported and the scan goes on after the record (its
   structure still gives its length); a structural error ends that segment's scan. A
   segment before the last one holding data must end with a BLANK record that reaches the
   file end (the empty segments a writer makes ahead of its need are no data); nothing
   but zeros may follow the end of data. Pages are read once and let go of behind the
   scan, holes are not read: memory stays a few windows whatever the store's size.
2. Consume queues: every entry below the commitlog end must point at a record start, with
   the record's size, topic, queue id, queue offset (the entry's own) and tags code (the
   delivery time for SCHEDULE_TOPIC_XXXX); every message that gets a consume-queue entry
   must have one (one that is past its queue's end only counts as not dispatched yet,
   a problem after a clean shutdown). Compared as numpy arrays, never per record.
3. Index files: header sanity, slots and ``prevIndex`` links in range and strictly backwards
   (so every chain walk terminates), each entry reached exactly once from its hash's slot,
   and the entries equal, in order, the keys dispatch derives from the commitlog.
4. Checkpoint: no time past the newest stored message, nor in the future (a time a stored
   message has is no future: the clock stepped back since, which is no damage).

On a read-only open the commitlog files are scanned to their ends, so what recovery would
cut is reported; consume-queue and index checks stop at the (recovered) commitlog end. On a
writer, dispatch is caught up first and the check stops at the end seen then.
"""
from __future__ import annotations

import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

import rmqstore._cq as _cq
import rmqstore._index_check as _index_check
import rmqstore._read as _read
import rmqstore._verify as _verify
from rmqstore import _record
from rmqstore.checkpoint import PAGE
from rmqstore.dispatch import deliver_time
from rmqstore.segments import first_nonzero
from rmqstore.topics import SCHEDULE_TOPIC, is_safe_dirname

if TYPE_CHECKING:
    from rmqstore.checkpoint import Checkpoint
    from rmqstore.consume_queue import ConsumeQueueTable
    from rmqstore.index import IndexService
    from rmqstore.segments import SegmentQueue

Status = _record.Status
_STEP_OVER = (Status.CRC, Status.PLACE)     # statuses naming one bad record, which can be stepped over
_WORKERS = min(4, len(os.sched_getaffinity(0)))
_COLUMNS = dict(_verify.ROW_COLUMNS + _verify.KEY_COLUMNS)


@dataclass
class Problem:
    """One thing wrong. ``offset`` is a commitlog offset (kind ``commitlog``), a queue offset
    (``consume_queue``), a byte position in the file (``index``, ``checkpoint``)."""
    kind: str
    path: str
    offset: int
    message: str


@dataclass
class VerifyReport:
    """What ``verify`` found; ``ok`` when ``problems`` is empty. ``undispatched`` counts
    messages not in their consume queue or index yet (a problem only after a clean
    shutdown: recovery re-dispatches them). At most ``max_problems`` are listed, the
    rest counted in ``problems_omitted``."""
    ok: bool = True
    clean_shutdown: bool = True
    segments: int = 0
    bytes: int = 0
    records: int = 0
    commitlog_end: int = 0
    consume_queues: int = 0
    consume_queue_entries: int = 0
    index_files: int = 0
    index_entries: int = 0
    undispatched: int = 0
    problems: list[Problem] = field(default_factory=list)
    problems_omitted: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Segment:
    """Step 1 for one commitlog segment (on a worker thread when there are several): its problems as
    (kind, path, offset, message) tuples, its record count and the columns of its messages
    (``_collect``: ``cols``), with topic numbers local to the segment (``names``)."""

    def __init__(self, seg, limit, last, delays, with_keys):
        self.seg, self.delays, self.with_keys = seg, delays, with_keys
        self.problems = []
        self.records = 0
        self.cols = {}
        self.numbers, self.names = {}, []
        self.max_store_ts = 0
        end, status = self._scan(limit)
        self._collect(end)
        self._segment_end(end, status, last, limit)

    def problem(self, offset, message):
        self.problems.append(("commitlog", self.seg.path, offset, message))

    def _scan(self, limit):
        """Structure, CRC and PHYSICALOFFSET field of every record; returns (end of
        records, scan status). A bad CRC or offset field is reported and stepped over."""
        seg, pos = self.seg, 0
        while True:
            end, n, status, _ = _read.scan_segment(seg, pos, limit, True, True, True)
            self.records += n
            if status not in _STEP_OVER:
                break
            off = seg.base_offset + end
            rec = _read.decode_record(seg, end, limit, False)
            why = "body CRC mismatch" if status is Status.CRC else f"its PHYSICALOFFSET field says {rec.phy_offset}"
            self.problem(off, f"record at commitlog offset {off}: {why}")
            self.records += 1
            pos = end + rec.store_size
        if status not in (Status.END, Status.BLANK):
            off = seg.base_offset + end
            self.problem(off, f"record at commitlog offset {off}: {status}; the {seg.size - end} bytes after "
                         f"it in {os.path.basename(seg.path)} are unreadable")
        return end, status

    def _collect(self, end):
        """The columns of the records before ``end`` (one kernel pass over the mapping)."""
        self.cols, self.max_store_ts = _verify.segment_columns(self.seg, end, self.records, self.numbers,
                                                               self.names, self.with_keys, True)   # GIL released
        self._schedule_tags(end)
        self._unsafe_topics()

    def _schedule_tags(self, end):
        """A SCHEDULE_TOPIC_XXXX message's tags code is its delivery time (dispatch.ConsumeQueueBuilder)."""
        if SCHEDULE_TOPIC not in self.names:
            return
        seg, cols = self.seg, self.cols
        tags = cols["tags"]
        for i in np.flatnonzero(cols["topic"] == self.names.index(SCHEDULE_TOPIC)).tolist():
            m = _read.decode_record(seg, int(cols["phy"][i]) - seg.base_offset, end)
            tags[i] = deliver_time(m.properties.get("DELAY"), m.store_timestamp, int(tags[i]), self.delays)

    def _unsafe_topics(self):
        """Records whose topic cannot name a consume-queue directory: dispatch gives them no
        entry (dispatch.ConsumeQueueBuilder); each is a problem."""
        unsafe = [i for i, name in enumerate(self.names) if not is_safe_dirname(name)]
        if not unsafe:
            return
        cols = self.cols
        bad = np.isin(cols["topic"], unsafe)
        for phy, t in zip(cols["phy"][bad].tolist(), cols["topic"][bad].tolist(), strict=True):
            self.problem(phy, f"record at commitlog offset {phy}: topic {self.names[t]!r} cannot "
                         "name a consume-queue directory")
        cols["cq"] &= ~bad

    def _segment_end(self, end, status, last, limit):
        seg = self.seg
        if status is Status.BLANK:
            if end != seg.size:
                self.problem(seg.base_offset + end, f"BLANK record ends at commitlog offset "
                             f"{seg.base_offset + end}, not at the segment end {seg.base_offset + seg.size}")
            return
        if status is not Status.END or end >= limit:
            return
        nz = first_nonzero(seg, end, limit)
        if nz >= 0:
            off = seg.base_offset + nz
            self.problem(off, f"non-zero bytes at commitlog offset {off}, after the end of data at "
                         f"{seg.base_offset + end}")
        elif not last:
            off = seg.base_offset + end
            self.problem(off, f"data ends at commitlog offset {off} without a BLANK record, {seg.size - end} "
                         "bytes before the segment end (recovery stops here)")


class _Records:
    """Columns of every message below the commitlog end, in commitlog order: ``phy``,
    ``size``, ``queue_id``, ``queue_offset``, ``tags`` (the CQ tags code), ``topic`` (an
    index into ``topic_names``), ``cq`` (gets a CQ entry), and every index key's
    ``key_hash`` / ``key_phy``."""

    def __init__(self, segments, end):
        numbers = {}
        for sg in segments:   # segment-local topic numbers -> store-wide ones
            remap = np.array([numbers.setdefault(n, len(numbers)) for n in sg.names], np.int32)
            if not np.array_equal(remap, np.arange(len(remap))):
                sg.cols["topic"] = remap[sg.cols["topic"]]
        self.topic_names = list(numbers)
        for k, dtype in _COLUMNS.items():
            setattr(self, k, _joined([sg.cols[k] for sg in segments], dtype))
        self.max_store_ts = max((sg.max_store_ts for sg in segments), default=0)
        if len(self.phy) and self.phy[-1] >= end:
            keep = self.phy < end
            for k in ("phy", "size", "queue_id", "queue_offset", "tags", "topic", "cq"):
                setattr(self, k, getattr(self, k)[keep])
        if len(self.key_phy) and self.key_phy[-1] >= end:
            keep = self.key_phy < end
            self.key_hash, self.key_phy = self.key_hash[keep], self.key_phy[keep]


def _starts_with_data(seg: Any) -> bool:
    """Whether a record (or anything but zeros) begins segment ``seg``."""
    return seg.size >= 4 and seg.read(0, 4) != b"\0\0\0\0"


def _joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """``parts`` as one array (itself when there is one)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype)


def _slot(f: Any, s: int) -> int:
    """Slot ``s`` of index file ``f``, to name it in a problem."""
    with memoryview(f.seg) as mv:
        return int(struct.unpack_from(">i", mv, 40 + 4 * s)[0])


def _entry(f: Any, i: int) -> tuple[int, int, int, int]:
    """Entry ``i`` of index file ``f`` (hash, phy offset, timeDiff, prevIndex), to name it in a problem."""
    with memoryview(f.seg) as mv:
        return struct.unpack_from(">iqii", mv, 40 + 4 * f.slots + 20 * i)


class _Verifier:
    def __init__(self, commitlog, consume_queues, index, checkpoint, delays, read_only, clean_shutdown,
                 max_problems):
        self.segments, self.queues, self.index_service = commitlog, consume_queues, index
        self.cp, self.delays, self.read_only = checkpoint, delays, read_only
        self.max_problems = max_problems
        self.rep = VerifyReport(clean_shutdown=clean_shutdown)
        self.recs = None

    def problem(self, kind, path, offset, message):
        rep = self.rep
        rep.ok = False
        if len(rep.problems) < self.max_problems:
            rep.problems.append(Problem(kind, path, int(offset), message))
        else:
            rep.problems_omitted += 1

    def lag(self, n):
        """``n`` messages not dispatched yet."""
        self.rep.undispatched += n
        if n and self.rep.clean_shutdown:
            self.rep.ok = False

    # -- 1. commitlog -------------------------------------------------------------------------
    def commitlog(self, end, progress):
        """Step 1 over every segment (``_checked``), results in order."""
        segs = self.segments.segments
        # the last segment holding data ends without a BLANK record: so may the writer's
        # pre-made next one (and any after it), which hold nothing
        last = next((k for k in range(len(segs) - 1, -1, -1) if _starts_with_data(segs[k])), 0)
        jobs = [(seg, seg.size if self.read_only else min(seg.size, end - seg.base_offset), k >= last)
                for k, seg in enumerate(segs)]
        done = []
        for (seg, limit, _), sg in zip(jobs, self._checked(jobs), strict=True):
            for p in sg.problems:
                self.problem(*p)
            self.rep.segments += 1
            self.rep.records += sg.records
            self.rep.bytes += limit
            done.append(sg)
            if progress is not None:
                progress(seg.size)
        if self.read_only:   # check everything on disk, also past where a writer's recovery would cut
            end = max([end] + [int(sg.cols["phy"][-1] + sg.cols["size"][-1]) for sg in done if len(sg.cols["phy"])])
        self.recs = _Records(done, end)
        return end

    def _checked(self, jobs):
        """A _Segment per job, in order: on worker threads when there are several (the
        kernels release the GIL), on this one for one (no thread to start)."""
        keys = self.index_service is not None

        def check(job):
            return _Segment(*job, self.delays, keys)
        if len(jobs) < 2:
            yield from map(check, jobs)
            return
        with ThreadPoolExecutor(_WORKERS, thread_name_prefix="rmq-verify") as pool:
            yield from pool.map(check, jobs)

    # -- 2. consume queues ----------------------------------------------------------------------
    def consume_queues(self, end):
        recs, rep = self.recs, self.rep
        tid = {name: i for i, name in enumerate(recs.topic_names)}
        covered = np.zeros(len(recs.phy), bool)
        bad = set()          # (topic id, queue id, queue offset) of entries already reported
        bounds = {}          # (topic id, queue id) -> (min, max) queue offset
        for (topic, qid), cq in sorted(self.queues.queues.items()):
            rep.consume_queues += 1
            lo, hi = cq.min_offset, cq.max_offset
            e = cq.read(lo, hi - lo)
            rep.consume_queue_entries += len(e)
            t = tid.get(topic, -1)
            bounds[(t, qid)] = (lo, hi)
            wrong, at = _cq.check_entries(e, end, t, qid, lo, recs.phy, recs.size, recs.topic, recs.queue_id,
                                          recs.queue_offset, recs.tags, recs.cq.view(np.uint8),
                                          covered.view(np.uint8))     # GIL released
            for j, r in zip(wrong.tolist(), at.tolist(), strict=True):
                bad.add((t, qid, lo + j))
                self._cq_problem(cq, lo + j, e[j], r if r >= 0 else None, topic, qid)
        self._missing(covered, bounds, bad)

    def _cq_problem(self, cq, qoff, entry, rec, topic, qid):
        recs = self.recs
        phy, size, tags = int(entry["phy_offset"]), int(entry["size"]), int(entry["tags_code"])
        where = f"{topic}/{qid} queue offset {qoff} (commitlog offset {phy}, size {size})"
        if rec is None:
            why = "no record starts at that commitlog offset"
        elif not recs.cq[rec] and not is_safe_dirname(recs.topic_names[recs.topic[rec]]):
            why = f"the record's topic {recs.topic_names[recs.topic[rec]]!r} cannot name a consume-queue directory"
        elif not recs.cq[rec]:
            why = "the record is a PREPARED or ROLLBACK message, which get no entry"
        else:
            got = {"size": int(recs.size[rec]), "topic": recs.topic_names[recs.topic[rec]],
                   "queue id": int(recs.queue_id[rec]), "queue offset": int(recs.queue_offset[rec]),
                   "tags code": int(recs.tags[rec])}
            want = {"size": size, "topic": topic, "queue id": qid, "queue offset": qoff, "tags code": tags}
            why = "; ".join(f"record {k} is {got[k]!r}, entry says {want[k]!r}" for k in got if got[k] != want[k])
        self.problem("consume_queue", cq.directory, qoff, f"consume queue {where}: {why}")

    def _missing(self, covered, bounds, bad):
        """Messages that should have a consume-queue entry and have none."""
        recs = self.recs
        todo = np.flatnonzero(recs.cq & ~covered)
        if not len(todo):
            return
        lag = 0
        for r in todo.tolist():
            t, qid, qoff = int(recs.topic[r]), int(recs.queue_id[r]), int(recs.queue_offset[r])
            lo, hi = bounds.get((t, qid), (0, 0))
            if qoff >= hi:
                lag += 1
            elif qoff >= lo and (t, qid, qoff) not in bad:
                self.problem("consume_queue", self.queues.root, qoff,
                             f"message at commitlog offset {recs.phy[r]} ({recs.topic_names[t]}/{qid} queue "
                             f"offset {qoff}) has no consume-queue entry")
        self.lag(lag)

    # -- 3. index -------------------------------------------------------------------------------
    def index(self, end):
        idx = self.index_service
        if idx is None:
            return
        got_hash, got_phy = [], []
        files = idx.files
        for f in files:
            h, p = self._index_file(f, end)
            got_hash.append(h)
            got_phy.append(p)
        self.rep.index_files = len(files)
        if not files:
            self.lag(len(np.unique(self.recs.key_phy)))
            return
        got_hash, got_phy = _joined(got_hash, np.int32), _joined(got_phy, np.int64)
        self.rep.index_entries = len(got_hash)
        self._index_sequence(files, got_hash, got_phy)

    def _index_file(self, f, end):
        """Structure of one file; returns (key hashes, commitlog offsets) of its entries below ``end``."""
        path = f.seg.path
        begin_ts, end_ts, begin_phy, end_phy, used, count = f.header
        empty = (np.empty(0, np.int32), np.empty(0, np.int64))
        if not 1 <= count <= f.entries:
            self.problem("index", path, 36, f"{path}: indexCount {count} outside 1..{f.entries}")
            return empty
        if count > 1 and begin_phy > end_phy:   # times may: endTimestamp is the last entry's, the clock steps back
            self.problem("index", path, 0, f"{path}: header commitlog offsets {begin_phy}..{end_phy} run backwards")
        ent_at = 40 + 4 * f.slots
        found, hashes, phy = _index_check.check_file(f.seg, f.slots, f.entries, count)   # GIL released
        for s in found["bad_slots"]:
            self.problem("index", path, 40 + 4 * s, f"{path}: slot {s} holds {_slot(f, s)}, outside 0..{count - 1}")
        if used != found["used"] and not found["bad_slots"]:
            self.problem("index", path, 32, f"{path}: hashSlotCount {used}, {found['used']} slots used")
        for i in found["broken"]:
            e = _entry(f, i)
            self.problem("index", path, ent_at + 20 * i, f"{path}: entry {i} (hash {e[0]}, prevIndex "
                         f"{e[3]}, timeDiff {e[2]}) is not a valid backward link")
        for s in found["wrong_heads"]:
            h = _entry(f, _slot(f, s))[0]
            self.problem("index", path, 40 + 4 * s, f"{path}: slot {s} points at entry {_slot(f, s)}, whose hash "
                         f"{h} belongs to slot {h % f.slots}")
        for i in found["astray"]:
            self.problem("index", path, ent_at + 20 * i,
                         f"{path}: entry {i} links to entry {_entry(f, i)[3]} of another slot")
        for i, refs in zip(found["odd"], found["odd_refs"], strict=True):
            self.problem("index", path, ent_at + 20 * i, f"{path}: entry {i} is reached {refs} times from "
                         "slots and chains, not once")
        i = found["back"]
        if i:
            self.problem("index", path, ent_at + 20 * i, f"{path}: entry {i} points at commitlog offset {phy[i - 1]}, "
                         f"before entry {i - 1}'s {phy[i - 2]}")
        keep = (phy < end) & (phy >= self.segments.min_offset)   # below: removed by retention
        return (hashes, phy) if keep.all() else (hashes[keep], phy[keep])

    def _index_sequence(self, files, got_hash, got_phy):
        """The entries equal the keys dispatch derives from the commitlog (from the first
        indexed message on; a message whose keys began in a deleted file may be partial)."""
        recs = self.recs
        exp_hash, exp_phy = recs.key_hash, recs.key_phy
        if len(got_phy):
            first = int(got_phy[0])
            start = int(np.searchsorted(exp_phy, first, "left"))
            at_first = int(np.searchsorted(exp_phy, first, "right")) - start
            start += max(0, at_first - int(np.count_nonzero(got_phy == first)))
            exp_hash, exp_phy = exp_hash[start:], exp_phy[start:]
        n = min(len(got_hash), len(exp_hash))
        diff = np.flatnonzero((got_hash[:n] != exp_hash[:n]) | (got_phy[:n] != exp_phy[:n]))
        if len(diff):
            i = int(diff[0])
            self.problem("index", self._entry_path(files, i), int(got_phy[i]),
                         f"index entry #{i} (hash {got_hash[i]}, commitlog offset {got_phy[i]}) should be "
                         f"hash {exp_hash[i]} of the message at {exp_phy[i]}")
        elif len(got_hash) > n:
            self.problem("index", self._entry_path(files, n), int(got_phy[n]),
                         f"{len(got_hash) - n} index entries from commitlog offset {got_phy[n]} match no message key")
        elif len(exp_hash) > n:
            self.lag(len(np.unique(exp_phy[n:])))

    @staticmethod
    def _entry_path(files, i):
        for f in files:
            i -= max(0, f.count - 1)
            if i < 0:
                return f.seg.path
        return files[-1].seg.path

    # -- 4. checkpoint --------------------------------------------------------------------------
    def checkpoint(self, now_ms):
        cp = self.cp
        if not cp.existed:
            return
        if cp.short is not None:
            self.problem("checkpoint", cp.path, 0, f"{cp.path}: {cp.short} bytes, expected a {PAGE}-byte page")
        newest = self.recs.max_store_ts
        for pos, name in ((0, "physicMsgTimestamp"), (8, "logicsMsgTimestamp"), (16, "indexMsgTimestamp")):
            ts = cp.as_dict()[name] or cp.rejected.get(name, 0)   # loading read an out-of-range time as 0
            if ts < 0:
                self.problem("checkpoint", cp.path, pos, f"{cp.path}: {name} {ts} is negative")
            elif ts > now_ms and ts > newest:   # a stored message has that time: the clock stepped back since
                self.problem("checkpoint", cp.path, pos, f"{cp.path}: {name} {ts} is in the future (now {now_ms})")
            elif newest and ts > newest:
                self.problem("checkpoint", cp.path, pos, f"{cp.path}: {name} {ts} is after the newest stored "
                             f"message ({newest}): messages it counted as flushed are gone")


def verify(commitlog: SegmentQueue, consume_queues: ConsumeQueueTable, index: IndexService | None,
           checkpoint: Checkpoint, delays: Sequence[int], *, read_only: bool, clean_shutdown: bool,
           progress: Callable[[int], object] | None = None, max_problems: int = 1000) -> VerifyReport:
    """Check a store's components (``commitlog`` is its segment queue) as described above,
    up to the commitlog end (on a writer the caller catches dispatch up first); returns a
    VerifyReport. ``delays`` (ms per level) give delayed messages their tags code.
    ``progress(nbytes)`` is called after each commitlog segment."""
    t0 = time.monotonic()
    end = commitlog.max_offset
    v = _Verifier(commitlog, consume_queues, index, checkpoint, delays, read_only, clean_shutdown, max_problems)
    v.rep.commitlog_end = end
    end = v.commitlog(end, progress)
    v.consume_queues(end)
    v.index(end)
    v.checkpoint(time.time_ns() // 1_000_000)
    v.rep.seconds = time.monotonic() - t0
    return v.rep
