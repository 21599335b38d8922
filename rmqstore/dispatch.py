"""Dispatch ("reput"): follow the commitlog and feed consume queues, the index and any
other CommitLogDispatcher with each new message."""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence, overload

import numpy as np

import rmqstore._read as _read
import rmqstore._reput as _reput
from rmqstore import _cq, _record
from rmqstore._record import Status
from rmqstore._segment import Waker
from rmqstore.errors import CorruptRecordError, StoreIOError
from rmqstore.topics import SCHEDULE_TOPIC, is_safe_dirname

if TYPE_CHECKING:
    from rmqstore.commitlog import CommitLog
    from rmqstore.consume_queue import ConsumeQueueTable
    from rmqstore.index import IndexService

log = logging.getLogger(__name__)

HELPER_RECORDS = 16  # records the helper dispatches the Python way at a request of the native loop
IDLE_WAIT = 1.0      # seconds an idle dispatcher waits for the writer's segment to grow, at most
IDLE_NO_SEGMENT = 0.01   # ... where it has no segment to watch (none yet, or between two)
WAIT_STEP = 0.05         # wait_dispatched looks for a failure or a stall this often (native loop)


class _NativeOr:
    """An int attribute that the native loop keeps while it runs and the owner in ``_<name>``
    otherwise: ``loop`` names the owner's attribute holding the loop (or None), ``field`` the
    loop's attribute. A set goes to both, so the value survives the loop's detach."""

    def __init__(self, loop: str, field: str, doc: str) -> None:
        self.loop, self.field, self.__doc__ = loop, field, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.own = "_" + name

    @overload
    def __get__(self, obj: None, owner: type) -> _NativeOr: ...
    @overload
    def __get__(self, obj: object, owner: type) -> int: ...

    def __get__(self, obj: object, owner: type) -> int | _NativeOr:
        if obj is None:   # looked up on the class (help, pdoc)
            return self
        n = getattr(obj, self.loop)
        return getattr(obj, self.own) if n is None else getattr(n, self.field)

    def __set__(self, obj: object, value: int) -> None:
        setattr(obj, self.own, value)
        n = getattr(obj, self.loop)
        if n is not None:
            setattr(n, self.field, value)


class DispatchBatch:
    """Consecutive records read in one pass: ``rows`` (numpy, _read.DISPATCH_DTYPE), the
    records' ``raw`` bytes, each row's ``topic_ids`` (int32 indexes into ``topic_names``,
    which the dispatcher shares across batches) and each record's properties on demand."""

    __slots__ = ("rows", "raw", "topic_ids", "topic_names")

    def __init__(self, rows: np.ndarray, raw: bytes, topic_numbers: dict[bytes, int], topic_names: list[str]) -> None:
        self.rows = rows
        self.raw = raw
        self.topic_names = topic_names
        self.topic_ids = _cq.topic_ids(raw, rows["topic_off"], rows["topic_len"], topic_numbers, topic_names)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def topics(self) -> list[str]:
        """The topic of each row (str)."""
        names = self.topic_names
        return [names[i] for i in self.topic_ids.tolist()]

    def properties(self, i: int) -> dict[str, str]:
        row = self.rows[i]
        return _record.properties_from(self.raw, int(row["props_off"]), int(row["props_len"]))


class Dispatcher:
    """ReputMessageService: reads the commitlog from ``reput_from`` in batches (record
    parsing with the GIL released) and hands each batch to every registered consumer, in
    order. Runs on its own thread once started; ``catch_up()`` runs it inline (recovery).
    Without ``background`` no thread is started: ``wait_dispatched`` dispatches in the
    calling thread (a bulk load: no thread to wake per append, the batch just written still
    in the CPU's caches).

    The store's own dispatcher (``new_dispatcher``: consume queues, then the index, nothing
    added) runs, once started in the background, on a native thread (rmqstore._reput) that
    never takes the GIL: it appends the entries of known queues to their current files and
    the keys to the current index file, allocates their blocks and follows the writer into
    each segment it rolls to. What it cannot do (a new queue or file, a record that is not
    valid, blocks it failed to allocate) it hands to the ``rmq-reput-helper`` Python
    thread, which dispatches a few records there as above and resumes it (docs/dispatch.md)."""

    def __init__(self, commitlog: CommitLog, reput_from: int = 0, batch_records: int = 4096,
                 background: bool = True) -> None:
        self.commitlog = commitlog
        self._native: _reput.Reput | None = None   # the native loop, while it runs
        self._reput_from = reput_from
        self.native_parts: tuple[ConsumeQueueBuilder, IndexService | None] | None = None   # (new_dispatcher)
        self.batch_records = batch_records
        self.background = background
        self.consumers: list[Callable[[DispatchBatch], Any]] = []
        self.error: BaseException | None = None   # why dispatch stopped for good (a corrupt record, a bug)
        self.stalled: OSError | None = None       # the OSError it is retrying after (full disk)
        self._topic_numbers: dict[bytes, int] = {}   # topic bytes -> index in _topic_names
        self._topic_names: list[str] = []
        self._cond = threading.Condition()
        self._run_lock = threading.Lock()   # one run_once at a time (the thread's, or callers' without it)
        self._wake = Waker()
        self._stop = False
        self._thread: threading.Thread | None = None

    def add(self, consumer: Callable[[DispatchBatch], Any]) -> None:
        """Register ``consumer(batch)``; called for every batch after those before it."""
        self.consumers.append(consumer)

    reput_from = _NativeOr("_native", "position",
                           "Every record before this commitlog offset is dispatched (retention keeps them).")

    @property
    def native(self) -> bool:
        """Whether the native loop dispatches (started in the background, store consumers only)."""
        return self._native is not None

    @property
    def lag(self) -> int:
        return max(0, self.commitlog.max_offset - self.reput_from)

    def run_once(self) -> bool:
        """Dispatch one batch; returns False when there was nothing to do."""
        with self._run_lock:
            return self._run_once()

    def _run_once(self, records: int = 0) -> bool:
        """run_once's batch: ``records`` at most (0: ``batch_records``)."""
        records = records or self.batch_records
        cl = self.commitlog
        if self.error is not None or self.reput_from >= cl.max_offset:
            return False
        if self.reput_from < cl.min_offset:   # not by retention (it keeps what is not dispatched): files removed
            log.error("dispatch: commitlog offsets %d..%d were removed before they were dispatched; their "
                      "queue offsets stay blank", self.reput_from, cl.min_offset)
            self.reput_from = cl.min_offset
        start = self.reput_from
        seg = cl.segments.find(start)
        if seg is None:
            return False
        pos, limit = start - seg.base_offset, seg.wrote_pos   # bytes before limit are all written
        rows, raw, end, status = _read.scan_dispatch(seg, pos, limit, records)
        if len(rows):
            self._hand_on(rows, raw)
        if status is Status.BLANK or (status is Status.END and end >= seg.size):
            nxt = seg.base_offset + seg.size
        elif status is Status.END and (end >= limit or len(rows) == records):
            nxt = seg.base_offset + end
        else:   # a bad record, or zeros before the written end (a hole): waiting would never end
            why = "data ends (zeros) before the written end" if status is Status.END else status
            self.error = CorruptRecordError(f"commitlog offset {seg.base_offset + end}: {why}")
            log.error("dispatch stopped: %s", self.error)
            nxt = seg.base_offset + end
        self._moved_to(nxt)
        return nxt != start

    def _hand_on(self, rows: np.ndarray, raw: bytes) -> None:
        """Give every consumer the batch of ``rows`` (scan_dispatch's) and their ``raw`` bytes."""
        batch = DispatchBatch(rows, raw, self._topic_numbers, self._topic_names)
        for consumer in self.consumers:
            consumer(batch)

    def _moved_to(self, nxt: int) -> None:
        """Everything before commitlog offset ``nxt`` is dispatched: wake the waiters."""
        with self._cond:
            self.reput_from = nxt
            self._cond.notify_all()

    def dispatch_written(self, rows: np.ndarray, raw: bytes) -> bool:
        """Dispatch records just written from ``rows`` and ``raw``, what scan_dispatch would
        read back from them (see ``written_rows``), without reading the commitlog: only
        without ``background`` and when they are the next to dispatch (the first row at
        ``reput_from``). Returns whether it did; if not, or if a consumer raises (then
        in part), wait_dispatched scans them, as it retries a batch."""
        if self.background or not len(rows):
            return False
        with self._run_lock:
            if self.error is not None or self._stop or self.reput_from != int(rows["phy_offset"][0]):
                return False
            try:
                self._hand_on(rows, raw)
            except Exception as e:   # (a full disk) the scan retries it, and reports what it meets
                log.debug("dispatch of written rows at commitlog offset %d left to the scan: %s", self.reput_from, e)
                return False
            self._moved_to(int(rows["phy_offset"][-1] + rows["size"][-1]))
        return True

    def catch_up(self) -> None:
        """Dispatch everything written, in the calling thread: with the native loop (GIL
        released) for the store's dispatcher when no thread dispatches, else batch by batch."""
        if self._native is None and not self._stop and self._native_eligible():
            with self._run_lock:
                self._catch_up_native()
        while self.run_once():
            pass

    def _native_eligible(self) -> bool:
        parts = self.native_parts
        return parts is not None and self.consumers == [parts[0]] + ([parts[1].dispatch] if parts[1] else [])

    def _catch_up_native(self) -> None:
        """catch_up's native loop: run it here, serving its requests inline, until it is
        caught up, finds no segment, or a batch the Python way does not move."""
        assert self.native_parts is not None
        n = self._attach(*self.native_parts)
        try:
            while self.error is None:
                req = n.run_here()
                if req == _reput.Request.NONE:
                    break
                if req == _reput.Request.PYTHON:
                    self._pull()
                    if not self._run_once():
                        break
                if not self._push():
                    break
        finally:
            self._detach()

    def start(self) -> None:
        """Start the reput thread (none without ``background``): the native loop and its
        Python helper for the store's dispatcher, else a Python thread."""
        if not self.background:
            return
        if self.native_parts is not None and self._native_eligible():
            n = self._attach(*self.native_parts)
            n.set_segment(None)   # its first request: the helper hands it one once there is data
            n.start()
            self.commitlog.segments.follower = n   # offered every segment the writer rolls to
            self._thread = threading.Thread(target=self._serve, name="rmq-reput-helper", daemon=True)
        else:
            self._thread = threading.Thread(target=self._loop, name="rmq-reput", daemon=True)
        self._thread.start()

    # -- the native loop --------------------------------------------------------------------
    def _attach(self, builder: ConsumeQueueBuilder, index: IndexService | None) -> _reput.Reput:
        """Make the native loop and hand it the files (without a segment it asks the
        helper for one at once)."""
        n = _reput.Reput(self._reput_from, index is not None, list(builder.delays))
        self._slot_queues: list[Any] = []   # the ConsumeQueue of each of its slots
        n.cq_timestamp = builder.last_timestamp
        if index is not None:
            n.index_timestamp = index.last_ts
            index.native = n
        builder.native = n
        self._native = n
        self._push()
        return n

    def _push(self) -> bool:
        """Hand the native loop (paused) the files it writes as the Python side left them;
        False when no commitlog segment holds its position yet."""
        n = self._native
        assert n is not None and self.native_parts is not None
        builder, index = self.native_parts
        for (topic, qid), cq in builder.table.queues.items():
            kind = _reput.Kind.KIND_SCHEDULE if topic == SCHEDULE_TOPIC else _reput.Kind.KIND_NATIVE
            i = n.set_queue(topic.encode(), qid, kind, cq.segments.last, cq.max_physic_offset)
            if i == len(self._slot_queues):
                self._slot_queues.append(cq)
        if index is not None:
            f = index.files[-1] if index.files else None
            n.set_index(f and f.seg, f.slots if f else 0, f.entries if f else 0, len(index.files) > 1)
        seg = self.commitlog.segments.find(n.position)
        n.set_segment(seg)
        return seg is not None

    def _pull(self) -> None:
        """The queues' ends as the native loop left them, for the Python dispatch path."""
        n = self._native
        assert n is not None
        for i, cq in enumerate(self._slot_queues):
            cq.max_physic_offset = n.slot_max_phy(i)

    def _serve(self) -> None:
        """The rmq-reput-helper thread: serve the native loop's requests (a batch the Python
        way, or the next commitlog segment), off the writer's path. OSErrors stall it as in
        ``_loop``; anything else stops dispatch for good, the waiters woken. Its first
        request (the loop starts without a segment) waits, as the Python loop does between
        batches, until there is a record to read."""
        n = self._native
        assert n is not None
        backoff = 0.0
        started = False
        try:
            while not self._stop:
                req = n.wait_request()
                if req < 0:
                    return
                if self.error is not None:   # stopped for good: the loop stays paused
                    n.kick()
                    self._wake.wait_appended(None, 0, IDLE_WAIT)
                    self._wake.clear()
                    continue
                try:
                    with self._run_lock:
                        if req == _reput.Request.PYTHON:   # a few records: the GIL is the writer's
                            self._pull()
                            self._run_once(HELPER_RECORDS)
                        # nothing to read yet (an empty store, the writer's next segment): idle
                        ready = started and (req == _reput.Request.PYTHON
                                             or self.reput_from < self.commitlog.max_offset) and self._push()
                        started = True
                except OSError as e:
                    backoff = self._stall(e, backoff, n.kick)
                    continue
                self._resumed()
                backoff = 0.0
                if self.error is not None:
                    n.kick()
                elif ready:
                    n.resume()
                else:
                    self._idle()
        except BaseException as e:   # a bug: stop rather than skip messages
            log.exception("dispatch failed")
            self.error = e
            n.kick()

    def _detach(self) -> None:
        """After the native loop stopped: its state back into the Python objects, pins released."""
        n = self._native
        assert n is not None and self.native_parts is not None
        builder, index = self.native_parts
        self._pull()
        builder.native = None
        builder.last_timestamp = n.cq_timestamp
        if index is not None:
            index.native = None
            index.last_ts = max(index.last_ts, n.index_timestamp)
        self._reput_from = n.position
        n.release()
        self._native = None

    def _loop(self) -> None:
        """The reput thread. A consumer's OSError (a full disk) is retried with a backoff;
        anything else raised, by a consumer or the loop itself, stops dispatch for good:
        it is kept in ``error`` and the waiters are woken, never left waiting."""
        try:
            backoff = 0.0
            while not self._stop:
                try:
                    busy = self.run_once()
                except OSError as e:
                    backoff = self._stall(e, backoff, self._notify)
                    continue
                self._resumed()
                backoff = 0.0
                if not busy:
                    self._idle()
        except BaseException as e:   # a bug: stop rather than skip messages
            log.exception("dispatch failed")
            self.error = e
            self._notify()

    def _stall(self, e: OSError, backoff: float, wake: Callable[[], Any]) -> float:
        """A dispatch step's OSError (e.g. no room for a new CQ file): kept in ``stalled``
        (logged when the stall begins), the waiters woken by ``wake()``, then a wait of the
        backoff returned (10 ms, doubled at each retry up to 1 s); the step is retried,
        nothing skipped."""
        if self.stalled is None:
            log.error("dispatch stalled at commitlog offset %d: %s", self.reput_from, e)
        self.stalled = e
        wake()
        backoff = min(1.0, backoff * 2 or 0.01)
        self._wake.wait_appended(None, 0, backoff)
        self._wake.clear()
        return backoff

    def _resumed(self) -> None:
        """A dispatch step went through: any stall is over (logged)."""
        if self.stalled is not None:
            log.warning("dispatch resumed at commitlog offset %d", self.reput_from)
            self.stalled = None

    def _notify(self) -> None:
        """Wake the threads in wait_dispatched."""
        with self._cond:
            self._cond.notify_all()

    def _idle(self) -> None:
        """Wait until the writer appends past ``reput_from`` (RocketMQ's reput looks every
        millisecond; here a C loop does, without the GIL, so an idle dispatcher takes none
        from the threads reading the store), wait_dispatched or stop wakes it, or IDLE_WAIT
        passes. A writer moving to a new segment fills the last one first (BLANK), which
        ends the wait; the new segment is then found."""
        last = self.commitlog.segments.last
        if last is not None and last.base_offset <= self.reput_from < last.base_offset + last.size:
            self._wake.wait_appended(last, self.reput_from - last.base_offset, IDLE_WAIT)
        else:
            self._wake.wait_appended(None, 0, IDLE_NO_SEGMENT)
        self._wake.clear()

    def wait_dispatched(self, timeout: float | None = None) -> bool:
        """Block until everything written before the call is dispatched; False on timeout.
        Raises what stopped dispatch for good (CorruptRecordError at a bad record, or the
        consumer's own exception), and StoreIOError when it is stalled by an I/O error
        (full disk) and no timeout was given. Without ``background`` it dispatches in the
        calling thread, ``timeout`` aside (an OSError stops it as a stall does)."""
        target = self.commitlog.max_offset
        n = self._native
        if not self.background:
            self._dispatch_here()
        elif n is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not (self.reput_from >= target or self.error is not None or self._stop
                       or (timeout is None and self.stalled is not None)):
                left = WAIT_STEP if deadline is None else min(WAIT_STEP, deadline - time.monotonic())
                if left <= 0:
                    break
                n.wait_position(target, left)
        else:
            self._wake.set()
            with self._cond:
                self._cond.wait_for(lambda: self.reput_from >= target or self.error is not None or self._stop
                                         or (timeout is None and self.stalled is not None), timeout)
        if self.reput_from < target:
            if self.error is not None:
                raise self.error
            if timeout is None and self.stalled is not None:
                e = self.stalled
                raise StoreIOError(e.errno, f"dispatch stalled: {e.strerror or e}", e.filename) from e
        return self.reput_from >= target

    def _dispatch_here(self) -> None:
        """wait_dispatched without ``background``: dispatch until caught up or stopped."""
        try:
            while not self._stop and self.run_once():
                pass
            self.stalled = None
        except OSError as e:   # (e.g. no room for a new CQ file) the next call retries the batch
            self.stalled = e

    def stop(self) -> None:
        """Stop dispatch: the reput thread ends, waiters in wait_dispatched return (False if
        not reached); a batch being dispatched by a caller is finished first."""
        self._stop = True
        self._wake.set()
        self._notify()
        if self._native is not None:
            self.commitlog.segments.follower = None
            self._native.halt()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._run_lock:
            if self._native is not None:
                self._detach()


def written_rows(names: Sequence[str], topic_ids: Any, props: tuple[Any, Any] | None, fields: dict[str, Any],
                 written: tuple[Any, ...], store_host_len: int) -> tuple[np.ndarray, bytes] | None:
    """The dispatch rows and raw bytes of the records put_columns wrote (``written``: its
    phy offsets, sizes, queue ids, queue offsets and store timestamp) from the columns it
    wrote them from (``names``, ``topic_ids``, ``props`` and ``fields`` as it took them),
    the same as scan_dispatch reads back from them (_read.column_rows); None for columns
    too large for one batch."""
    phy, size, qid, qoff, ts = written
    n = len(phy)

    def ints(values: Any, rows: int) -> np.ndarray:
        return np.zeros(rows, np.int64) if values is None else \
            np.ascontiguousarray(np.broadcast_to(np.asarray(values, np.int64), (rows,)))
    data, offsets = props if props is not None else (b"", None)
    return _read.column_rows(phy, size, qid, qoff, ints(fields.get("sys_flag"), n), ts, ints(topic_ids, n),
                             [t.encode() for t in names], data, ints(offsets, n + 1),
                             ints(fields.get("born_host_offsets"), n + 1), store_host_len)


def deliver_time(level: str | None, store_ts: int, tags_code: int, delays: Sequence[int]) -> int:
    """RocketMQ computeDeliverTimestamp: the consume-queue tags code of a SCHEDULE_TOPIC_XXXX
    message with DELAY ``level``, its store time plus the level's delay (``delays[level-1]``,
    the last level for larger ones); ``tags_code`` unchanged for no or a bad level."""
    try:   # digits as Java's parseInt reads them ('\u0663' is 3); '\u00b2' passes isdigit, not int
        lv = min(int(level), len(delays)) if level is not None and level.isdigit() else 0
    except ValueError:
        return tags_code
    return store_ts + delays[lv - 1] if lv > 0 else tags_code


class ConsumeQueueBuilder:
    """CommitLogDispatcherBuildConsumeQueue: one CQ entry per message, except PREPARED and
    ROLLBACK; delayed messages carry their delivery time as tags code. Rows are grouped by
    topic/queue and each run is written by the CQ kernel. ``last_timestamp`` is the store
    time of the newest message given an entry (the checkpoint's logicsMsgTimestamp).

    A record whose topic cannot be a directory name (``topics.is_safe_dirname``: topic bytes
    are not under the body CRC, so a damaged or crafted record can hold ``../x``) gets no
    entry and creates nothing: it is logged and its offset kept in ``unsafe_topics`` (verify
    reports such records as corrupt), and dispatch goes on behind it."""

    def __init__(self, table: ConsumeQueueTable, delays: Sequence[int]) -> None:
        self.table = table
        self.delays = delays
        self.native: _reput.Reput | None = None   # the native loop that also gives entries, while it runs
        self._last_timestamp = 0
        self.unsafe_topics: list[int] = []     # commitlog offsets of records skipped for their topic
        self._unsafe = np.zeros(0, np.uint8)   # per topic id of the dispatcher's names: cannot be a dirname

    last_timestamp = _NativeOr("native", "cq_timestamp", "Store time of the newest message given an entry.")

    def __call__(self, batch: DispatchBatch) -> None:
        rows, names = batch.rows, batch.topic_names
        if len(self._unsafe) < len(names):
            self._unsafe = np.array([not is_safe_dirname(name) for name in names], np.uint8)
        row, phy, size, tags, qoff, starts, bad = _cq.group_entries(rows, batch.topic_ids, self._unsafe)
        for at in rows["phy_offset"][bad].tolist():
            log.error("dispatch: record at commitlog offset %d has a topic that cannot be a directory "
                      "name; no consume-queue entry", at)
            self.unsafe_topics.append(at)
        if not len(row):
            return
        bounds = starts.tolist()
        queues, last = [], 0
        for lo, hi in itertools.pairwise(bounds):
            first, last = int(row[lo]), max(last, int(row[hi - 1]))   # a group keeps commitlog order
            topic = names[batch.topic_ids[first]]
            if topic == SCHEDULE_TOPIC:
                self._deliver_times(batch, row[lo:hi], tags[lo:hi])
            queues.append(self.table.get_or_create(topic, int(rows["queue_id"][first])))
        # every queue whose offsets go on from its file's end in one GIL-free pass; the rest
        # (a duplicate, a gap, a new file, one filled) by ConsumeQueue
        done = _cq.append_runs([cq.segments.last for cq in queues],
                               np.array([cq.max_physic_offset for cq in queues], np.int64),
                               phy, size, tags, qoff, starts).tolist()
        for cq, lo, hi, k in zip(queues, bounds[:-1], bounds[1:], done, strict=True):
            if k:   # written in part or whole: end_run writes what is left
                cq.end_run(phy[lo:hi], size[lo:hi], tags[lo:hi], k)
            else:
                cq.put_run(phy[lo:hi], size[lo:hi], tags[lo:hi], qoff[lo:hi])
        self.last_timestamp = int(rows["store_timestamp"][last])

    def _deliver_times(self, batch: DispatchBatch, rows: np.ndarray, tags: np.ndarray) -> None:
        """Set the tags code of SCHEDULE_TOPIC_XXXX ``rows`` to their delivery time."""
        stamps = batch.rows["store_timestamp"]
        for k, i in enumerate(rows.tolist()):
            tags[k] = deliver_time(batch.properties(i).get("DELAY"), int(stamps[i]), int(tags[k]), self.delays)


def new_dispatcher(commitlog: CommitLog, reput_from: int, cq_builder: ConsumeQueueBuilder,
                   index: IndexService | None, background: bool = True) -> Dispatcher:
    """The store's dispatcher: consume queues first, then the index (when enabled)."""
    d = Dispatcher(commitlog, reput_from, background=background)
    d.native_parts = (cq_builder, index)
    d.add(cq_builder)
    if index is not None:
        d.add(index.dispatch)
    return d
