"""Dispatch ("reput"): follow the commitlog and feed consume queues, the index and any
other CommitLogDispatcher with each new message."""
import logging
import threading

from rmqstore import _codec, _cq
from rmqstore.errors import CorruptRecordError, StoreIOError

log = logging.getLogger(__name__)


class DispatchBatch:
    """Consecutive records read in one pass: ``rows`` (numpy, _codec.DISPATCH_DTYPE), the
    records' ``raw`` bytes, each row's ``topic_ids`` (int32 indexes into ``topic_names``,
    which the dispatcher shares across batches) and each record's properties on demand."""

    __slots__ = ("rows", "raw", "topic_ids", "topic_names")

    def __init__(self, rows, raw, topic_numbers, topic_names):
        self.rows = rows
        self.raw = raw
        self.topic_names = topic_names
        self.topic_ids = _cq.topic_ids(raw, rows["topic_off"], rows["topic_len"], topic_numbers, topic_names)

    def __len__(self):
        return len(self.rows)

    @property
    def topics(self):
        """The topic of each row (str)."""
        names = self.topic_names
        return [names[i] for i in self.topic_ids.tolist()]

    def properties(self, i):
        row = self.rows[i]
        return _codec.properties_from(self.raw, int(row["props_off"]), int(row["props_len"]))


class Dispatcher:
    """ReputMessageService: reads the commitlog from ``reput_from`` in batches (record
    parsing with the GIL released) and hands each batch to every registered consumer, in
    order. Runs on its own thread once started; ``catch_up()`` runs it inline (recovery)."""

    def __init__(self, commitlog, reput_from=0, batch_records=4096):
        self.commitlog = commitlog
        self.reput_from = reput_from
        self.batch_records = batch_records
        self.consumers = []
        self.error = None      # why dispatch stopped for good (a corrupt record, a bug)
        self.stalled = None    # the OSError it is retrying after (full disk)
        self._topic_numbers = {}   # topic bytes -> index in _topic_names
        self._topic_names = []
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self._thread = None

    def add(self, consumer):
        """Register ``consumer(batch)``; called for every batch after those before it."""
        self.consumers.append(consumer)

    @property
    def lag(self):
        return max(0, self.commitlog.max_offset - self.reput_from)

    def run_once(self):
        """Dispatch one batch; returns False when there was nothing to do."""
        cl = self.commitlog
        if self.error is not None or self.reput_from >= cl.max_offset:
            return False
        if self.reput_from < cl.min_offset:
            self.reput_from = cl.min_offset
        start = self.reput_from
        seg = cl.segments.find(start)
        if seg is None:
            return False
        pos = start - seg.base_offset
        rows, raw, end, status = _codec.scan_dispatch(seg, pos, seg.wrote_pos, self.batch_records)
        if len(rows):
            batch = DispatchBatch(rows, raw, self._topic_numbers, self._topic_names)
            for consumer in self.consumers:
                consumer(batch)
        if status == "blank" or (status == "end" and end >= seg.size):
            nxt = seg.base_offset + seg.size
        elif status == "end":
            nxt = seg.base_offset + end
        else:
            self.error = f"commitlog offset {seg.base_offset + end}: {status}"
            log.error("dispatch stopped: %s", self.error)
            nxt = seg.base_offset + end
        with self._cond:
            self.reput_from = nxt
            self._cond.notify_all()
        return nxt != start

    def catch_up(self):
        while self.run_once():
            pass

    def start(self):
        self._thread = threading.Thread(target=self._loop, name="rmq-reput", daemon=True)
        self._thread.start()

    def _loop(self):
        backoff = 0.0
        while not self._stop:
            try:
                busy = self.run_once()
            except OSError as e:   # e.g. no room for a new CQ file: retry the batch, skip nothing
                if self.stalled is None:
                    log.error("dispatch stalled at commitlog offset %d: %s", self.reput_from, e)
                self.stalled = e
                with self._cond:
                    self._cond.notify_all()
                backoff = min(1.0, backoff * 2 or 0.01)
                self._wake.wait(backoff)
                self._wake.clear()
                continue
            except Exception as e:   # a bug in a consumer: stop rather than skip messages
                log.exception("dispatch failed")
                self.error = f"dispatch failed: {e!r}"
                with self._cond:
                    self._cond.notify_all()
                return
            if self.stalled is not None:
                log.warning("dispatch resumed at commitlog offset %d", self.reput_from)
                self.stalled = None
            backoff = 0.0
            if not busy:
                self._wake.wait(0.001)
                self._wake.clear()

    def wait_dispatched(self, timeout=None):
        """Block until everything written before the call is dispatched; False on timeout.
        Raises CorruptRecordError if dispatch stopped at a bad record, and StoreIOError
        when it is stalled by an I/O error (full disk) and no timeout was given."""
        target = self.commitlog.max_offset
        self._wake.set()
        with self._cond:
            ok = self._cond.wait_for(lambda: self.reput_from >= target or self.error is not None
                                     or (timeout is None and self.stalled is not None), timeout)
        if self.reput_from < target:
            if self.error is not None:
                raise CorruptRecordError(self.error)
            if timeout is None and self.stalled is not None:
                e = self.stalled
                raise StoreIOError(e.errno, f"dispatch stalled: {e.strerror or e}", e.filename) from e
        return ok

    def stop(self):
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
