"""Consumption state of the endpoint's consumer groups, kept crash-safe in the store directory.

For each (group, topic, queue id) the state is two things:

- ``next``: the first queue offset never handed out to the group. Every offset below it is
  finished (acked, filtered out, or moved to the dead-letter queue) unless it is pending.
- ``pending``: offset -> ``[invisible_until_ms, attempts, seq, fifo]`` for messages handed
  out and not yet acked, and for delayed messages held until their delivery time (attempts
  0); ``fifo`` is 1 when the message belongs to a FIFO message group.
  ``seq`` is the receipt generation: a receipt handle names it, and a redelivery or a
  change of invisible time gives a new one, so a stale handle is refused.

On disk, under ``STORE/config/``:

``popState.json``
    a snapshot ``{"version": 1, "seq": N, "queues": [[group, topic, queue_id, next,
    [[offset, until_ms, attempts, seq, fifo], ...]], ...]}``, replaced atomically (temp file,
    fsync, rename, fsync of the directory; ``rmqstore.files.write_atomic``).
``popState.log``
    an append-only log of changes made since that snapshot, one per line:
    ``CRC32HEX JSON\\n`` where CRC32 (zlib) covers the JSON text, followed by zeros (the
    room written ahead: see rule 1). Records:
    ``["r", g, t, q, offset, until_ms, attempts, seq, fifo]`` (set a pending entry),
    ``["a", g, t, q, offset]`` (finished: drop the pending entry),
    ``["n", g, t, q, next]`` (raise ``next``).

Durability rules:

1. An ack is appended and the log fsynced before the ack is answered, so an acked
   message is never handed out again, whatever kills the process afterwards. Acks of
   concurrent calls share one fsync (group commit: ``sync`` covers every record appended
   before it began), taken outside the state lock so appends go on meanwhile. The log is
   written ahead with zeros (``_LOG_ROOM`` bytes at a time, made durable with the file's
   size), so a record overwrites allocated blocks and its sync is an fdatasync with no
   metadata to commit: 150 µs, not the 870 µs of an fsync that grows the file. Once an
   fsync has failed (also one of a compaction: its snapshot, its new log), ``sync`` raises
   for good: nothing written before it is acknowledged.
2. Receives and ``next`` moves are appended without fsync: losing them in a crash only
   makes messages visible again (at-least-once), never loses one.
3. Replaying the log over the snapshot is idempotent (``r`` sets, ``a`` drops, ``n`` takes
   the maximum), so a crash between writing a new snapshot and emptying the log is safe.
4. Replay stops at the first line that is torn or fails its CRC (the unsynced tail of a
   crash; the zeros after the last record end in no newline: never a line) and truncates
   the log there. Both files are created 0600 with O_NOFOLLOW.
5. Every rename and truncation of these files runs inside ``guard`` (the endpoint's: an
   operation of the open store, which holds the writer lock): once the store has let the
   lock go, another writer may own the directory, and the files are left as they are.

Thread-safety: every method takes the instance lock; callers group their changes with
``with state.lock:`` and call ``sync`` after letting it go.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
import zlib
from typing import Any, Callable, ContextManager

from rmqstore.errors import CorruptStoreError, StoreClosedError, StoreIOError
from rmqstore.files import fsync, make_dirs, open_file, parse_json, read_file, write_atomic

log = logging.getLogger("rmqstore.endpoint")
QueueKey = tuple[str, str, int]
_COMPACT_BYTES = 4 << 20
_LOG_ROOM = 1 << 20   # zeros written ahead of the log's records at a time


def _int(v: Any, lo: int = -(1 << 63), hi: int = 1 << 63, what: str = "a 64-bit integer") -> int:
    """``v`` if it is an int in [lo, hi) (what the state holds), else ValueError."""
    if type(v) is not int or not lo <= v < hi:
        raise ValueError(f"{v!r} is not {what}")
    return v


def _queue_id(v: Any) -> int:
    return _int(v, 0, 1 << 31, "a queue id")


@functools.lru_cache(maxsize=4096)
def _json_text(s: str) -> str:
    return json.dumps(s)


def encode_record(rec: list[Any]) -> bytes:
    """A log record as ``json.dumps(rec, separators=(",", ":"))`` writes it: kind, group,
    topic, then integers (the names encoded once, not per record)."""
    op, g, t, *ints = rec
    return f"[{_json_text(op)},{_json_text(g)},{_json_text(t)},{','.join(map(str, ints))}]".encode()


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class QueueState:
    """``next`` and ``pending`` of one (group, topic, queue)."""

    __slots__ = ("next", "pending")

    def __init__(self, next_offset: int = 0) -> None:
        self.next = next_offset
        self.pending: dict[int, list[int]] = {}


class PopState:
    """The consumption state of every group (see the module docstring for the format)."""

    def __init__(self, root: str, file_mode: int = 0o600, dir_mode: int = 0o700,
                 guard: Callable[[], ContextManager[object]] = contextlib.nullcontext, read_only: bool = False) -> None:
        """Load the state of the store at ``root``; ``read_only``: only read the files (as
        they stand, also beside a live endpoint: a torn last log line ends the replay), never
        compact or create them (the console reads it so)."""
        self.dir = os.path.join(root, "config")
        self.snapshot_path = os.path.join(self.dir, "popState.json")
        self.log_path = os.path.join(self.dir, "popState.log")
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.guard = guard
        self.lock = threading.RLock()
        self.queues: dict[QueueKey, QueueState] = {}
        self._seq = 0
        self._fd = -1
        self._generation = 0     # log files started (a ticket of an older one is in a snapshot)
        self._synced = 0         # log bytes known on disk
        self._sync_lock = threading.Lock()
        self._sync_failed: OSError | None = None
        self._room = 0           # log bytes allocated (records, then zeros)
        self._grown = False      # the log grew since the last sync: the next one is a full fsync
        if read_only:
            self._load()
            return
        make_dirs(self.dir, dir_mode)
        self._load()
        self._compact()

    # -- loading --------------------------------------------------------------------------
    def _load(self) -> None:
        """The snapshot, then the log replayed over it. A file whose JSON is not the format
        (a value of the wrong type or out of range, a record too short) is a
        CorruptStoreError naming it; a torn or CRC-failing log line ends the replay."""
        path = self.snapshot_path
        try:
            try:
                snap = parse_json(read_file(path))
            except FileNotFoundError:
                snap = {"version": 1, "seq": 0, "queues": []}
            if snap["version"] != 1:    # a later format: reading it as this one would lose its state
                raise ValueError(f"version {snap['version']!r}, not 1")
            self._seq = _int(snap["seq"])
            for g, t, q, nxt, pending in snap["queues"]:
                qs = self.queue((str(g), str(t), _queue_id(q)))
                qs.next = _int(nxt, 0, what="a queue offset")
                for off, until, att, seq, fifo in pending:
                    qs.pending[_int(off)] = [_int(until), _int(att), _int(seq), _int(fifo)]
            path = self.log_path
            try:
                data = read_file(path)
            except FileNotFoundError:
                data = b""
            for line in data.split(b"\n")[:-1]:   # the last piece is empty or a torn line
                rec = self._parse(line)
                if rec is None:
                    break
                self._apply(rec)
        except (KeyError, IndexError, TypeError, ValueError, RecursionError) as e:
            raise CorruptStoreError(f"{path}: not consumption state ({type(e).__name__}: {e})") from None

    @staticmethod
    def _parse(line: bytes) -> list[Any] | None:
        crc, _, text = line.partition(b" ")
        try:
            if int(crc, 16) != zlib.crc32(text):
                return None
            rec = parse_json(text)
        except ValueError:
            return None
        return rec if isinstance(rec, list) and len(rec) >= 5 else None

    def _apply(self, rec: list[Any]) -> None:
        op, g, t, q = rec[0], str(rec[1]), str(rec[2]), _queue_id(rec[3])
        qs = self.queue((g, t, q))
        if op == "r":
            qs.pending[_int(rec[4])] = [_int(rec[5]), _int(rec[6]), _int(rec[7]), _int(rec[8])]
            self._seq = max(self._seq, _int(rec[7]))
        elif op == "a":
            qs.pending.pop(_int(rec[4]), None)
        elif op == "n":
            qs.next = max(qs.next, _int(rec[4], 0, what="a queue offset"))
        else:
            raise ValueError(f"record kind {op!r} (not r, a or n)")

    def _compact(self) -> None:
        """Write the whole state as a new snapshot, then start an empty log (inside ``guard``)."""
        with self.guard():
            self._compact_held()

    def _compact_held(self) -> None:
        """A failure is sticky as a failed fsync (rule 1); the log's descriptor is replaced only
        once the new one is open, so a failed open leaves no closed number to write to."""
        rows = [[g, t, q, qs.next, [[o, *e] for o, e in sorted(qs.pending.items())]]
                for (g, t, q), qs in self.queues.items()]
        try:
            write_atomic(self.snapshot_path, json.dumps({"version": 1, "seq": self._seq, "queues": rows}).encode(),
                         self.file_mode)
            fd = open_file(self.log_path, os.O_WRONLY | os.O_CREAT, self.file_mode)
            try:
                os.ftruncate(fd, 0)
                _write_all(fd, bytes(_LOG_ROOM), 0)
                fsync(fd, self.log_path)
            except BaseException:
                os.close(fd)
                raise
        except OSError as e:
            self._sync_failed = self._sync_failed or e
            raise
        old, self._fd = self._fd, fd
        if old >= 0:
            os.close(old)
        self._size = self._synced = 0
        self._room, self._grown = _LOG_ROOM, False
        self._generation += 1

    # -- changes --------------------------------------------------------------------------
    def queue(self, key: QueueKey) -> QueueState:
        qs = self.queues.get(key)
        if qs is None:
            qs = self.queues[key] = QueueState()
        return qs

    def next_seq(self) -> int:
        """A receipt generation never given before (also across restarts: time-based floor)."""
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    def append(self, records: list[list[Any]]) -> tuple[int, int]:
        """Apply ``records`` and append them to the log (not synced); the ticket ``sync``
        takes to make them durable."""
        with self.lock:
            out = []
            for rec in records:
                self._apply(rec)
                text = encode_record(rec)
                out.append(b"%08x %s\n" % (zlib.crc32(text), text))
            blob = b"".join(out)
            end = self._size + len(blob)
            if end > self._room:   # more room: its zeros and the new size go with the next sync (an fsync)
                _write_all(self._fd, bytes(end + _LOG_ROOM - self._room), self._room)
                self._room = end + _LOG_ROOM
                self._grown = True
            _write_all(self._fd, blob, self._size)
            self._size = end
            ticket = (self._generation, self._size)
            if self._size > _COMPACT_BYTES:
                self._compact()
            return ticket

    def sync(self, ticket: tuple[int, int]) -> None:
        """Make the records appended up to ``ticket`` durable (call without holding ``lock``).
        One caller's fsync covers what every thread appended before it began; the callers
        queued meanwhile find their records covered and return without one."""
        generation, upto = ticket
        with self._sync_lock:
            with self.lock:
                if self._sync_failed is not None:
                    raise StoreIOError(f"{self.log_path}: an earlier fsync failed ({self._sync_failed}); nothing "
                                       "written before it is acknowledged until the endpoint restarts")
                if generation != self._generation or self._synced >= upto:
                    return      # in a snapshot written since (durable), or synced by another caller
                fd, end = os.dup(self._fd), self._size   # a compaction may close the log's fd meanwhile
                grown, self._grown = self._grown, False
            try:
                fsync(fd, self.log_path, data_only=not grown)
            except OSError as e:
                self._sync_failed = e
                raise
            finally:
                os.close(fd)
            with self.lock:
                if generation == self._generation:
                    self._synced = max(self._synced, end)

    def close(self) -> None:
        """Compact and close the log; if ``guard`` refuses (the store is closed), only close
        it: the log holds every change, and the files are not the endpoint's to rewrite."""
        with self.lock:
            if self._fd >= 0:
                try:
                    self._compact()
                except StoreClosedError:
                    log.warning("%s: the store closed before the endpoint; consumption state left as the log "
                                "holds it", self.dir)
                finally:
                    os.close(self._fd)
                    self._fd = -1
