"""CommitLog: every message of every topic, appended to one run of segments."""

import logging

import rmqstore._append as _append
import rmqstore._read as _read
from rmqstore import _record
from rmqstore._message import MessageExt
from rmqstore.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    MessageNotFoundError,
    StoreClosedError,
    StoreReadOnlyError,
)
from rmqstore.index import UniqKeyGenerator
from rmqstore.segments import SegmentQueue
from rmqstore.topics import SCHEDULE_TOPIC, validate_topic

# scan reads records in runs of at most this many / this many bytes, copied into one buffer
# that their messages share (a message kept alive keeps its run's buffer alive)
SCAN_BATCH = 128
log = logging.getLogger(__name__)
SCAN_BATCH_BYTES = 256 << 10


class CommitLog:
    """The commitlog: records in RocketMQ's format, in files of ``commitlog_file_size``.

    Layout: ``commitlog/{offset:020d}``; a record never spans files: when it does not fit
    (with 8 bytes to spare) an 8-byte BLANK record ``[room left][0xCBD43194]`` ends the file
    and the record goes first in the next one. Zero TOTALSIZE marks the end of data.

    Thread-safety: ``put``/``put_batch`` serialize on one lock (append + roll + queue
    offset counters, all in ``_append.Appender``); reads take no lock and see only
    published bytes. Pages ahead of the writer are faulted in, and their disk blocks
    allocated, by the segment queue's native toucher thread (no GIL).
    Crash behaviour: see recovery.py; a torn tail is cut at the last valid record.
    """

    def __init__(self, root, config, readonly=False, segment_size=None):
        self.config = config
        self.readonly = readonly
        self.segments = SegmentQueue(f"{root}/commitlog", segment_size or config.commitlog_file_size, readonly,
                                     config.file_mode, config.dir_mode,
                                     preallocate=config.warm_mapped_file, prefault_bytes=config.warm_ahead_bytes,
                                     reserve_ahead=config.reserve_ahead_bytes)
        self.store_host = _record.pack_host(config.store_host)
        self._delay_levels = config.delay_levels_ms()
        self.uniq_key = UniqKeyGenerator(self.store_host) if config.generate_uniq_key else None
        warm = config.warm_mapped_file and config.warm_ahead_bytes > 0 and not readonly
        # without a warmer, bulk batches go in with pwrite: a page the writer first touches
        # through the mapping is filled with zeros before the copy, which costs more than it
        self.appender = _append.Appender(self.segments, self.store_host, config.message_version,
                                         config.max_message_size, config.default_queue_nums,
                                         self._check_topic, self._delay, self._warm_ahead,
                                         self.uniq_key.stamp if self.uniq_key is not None else None,
                                         stage_bulk=not warm)
        self.lock = self.appender   # the write lock: ``with commitlog.lock:`` excludes appends
        self._warmer = self.segments.toucher if warm else None
        self._warm_to = 0              # commitlog offset faulted in (or queued) so far
        self.flusher = None            # the native flusher (_flusher.Flusher) once a writer's starts

    def attach_flusher(self, flusher):
        """Flush through ``flusher`` from now on; every segment published is tracked by it."""
        self.flusher = flusher
        self.segments.flusher = flusher

    # -- positions ------------------------------------------------------------------------
    @property
    def min_offset(self):
        segs = self.segments.segments
        return segs[0].base_offset if segs else 0

    @property
    def max_offset(self):
        return self.segments.max_offset

    @property
    def flushed_offset(self):
        return self.segments.flushed_where if self.flusher is None else self.flusher.flushed

    @property
    def failed(self):
        """The sticky I/O error that turned the store read-only, or None (kept in the
        appender, whose put checks it in C; the native flusher's reported there when met)."""
        if self.appender.failed is None and self.flusher is not None:
            self.flusher.error   # noqa: B018 - reports a native failure (FlushService._fail sets it)
        return self.appender.failed

    @failed.setter
    def failed(self, exc):
        self.appender.failed = exc

    @property
    def queue_offsets(self):
        """(topic, queue_id) -> next queue offset."""
        return self.appender.queue_offsets

    @queue_offsets.setter
    def queue_offsets(self, table):
        self.appender.queue_offsets = table

    # -- writing --------------------------------------------------------------------------
    def check_writable(self):
        if self.readonly:
            raise StoreReadOnlyError("store opened read-only")
        if self.failed is not None:
            raise StoreReadOnlyError(f"store is read-only after an I/O error: {self.failed}") from self.failed

    def _check_topic(self, topic):
        validate_topic(topic, self.config.message_version, self.config.strict_topic_names)

    def _delay(self, msg, topic, queue_id, props):
        """RocketMQ 4.9's delay rewrite: a DELAY level moves the message to
        SCHEDULE_TOPIC_XXXX queue level-1, with REAL_TOPIC / REAL_QID properties. A message
        already on SCHEDULE_TOPIC_XXXX (a delayed record copied from another store, e.g. by
        ``rmqstore dump`` and ``put``) keeps its topic, queue and properties."""
        delay = props.get("DELAY")
        if not delay or topic == SCHEDULE_TOPIC or not _record.gets_cq_entry(msg.sys_flag):
            return topic, queue_id, props
        try:
            level = int(delay)
        except ValueError:
            raise InvalidArgumentError(f"DELAY property {delay!r} is not a level number") from None
        level = min(level, len(self._delay_levels))
        if level <= 0:
            return topic, queue_id, props
        props = dict(props)
        props["DELAY"] = str(level)
        props["REAL_TOPIC"] = topic
        props["REAL_QID"] = str(queue_id)
        return SCHEDULE_TOPIC, level - 1, props

    def _warm_ahead(self, seg):
        """Have the toucher allocate the blocks of the next ``warm_ahead_bytes`` of ``seg``
        and fault them in (a fresh page costs ~10-20 us to fault in here; the writer should
        not pay it), and set the next mark. A full disk fails there unseen; the writer's own
        reserve then raises DiskFullError before its write."""
        base, end = seg.base_offset, seg.base_offset + seg.size
        pos = base + seg.wrote_pos
        if self._warmer is None:
            self.appender.warm_mark = 1 << 62
            return
        ahead = self.config.warm_ahead_bytes
        start, stop = max(self._warm_to, pos), min(end, pos + ahead)
        if stop > start:
            self._warmer.submit(seg, start - base, stop - base, True)
            self._warm_to = stop
        self.appender.warm_mark = min(end, pos + ahead // 2)

    def put_columns(self, topics, topic_ids, body, props, queue_ids, fields):
        """Append rows given as columns (see _append.Appender.put_columns; ``fields``: its
        keyword arguments)."""
        if self.readonly or self.failed is not None:
            self.check_writable()
        return self.appender.put_columns(topics, topic_ids, body[0], body[1], *(props or (None, None)),
                                         queue_ids, **fields)

    # -- reading --------------------------------------------------------------------------
    def get(self, offset, check_crc=False):
        """The MessageExt whose record starts at commitlog ``offset``."""
        return _read.get_message(self.segments.segments, offset, check_crc)

    def read(self, offset, size):
        """Raw bytes ``[offset, offset+size)`` if they lie in one segment's written part."""
        seg = self.segments.find(offset)
        if seg is None or size < 0 or offset - seg.base_offset + size > seg.wrote_pos:
            raise MessageNotFoundError(f"commitlog range [{offset}, {offset + size}) is not stored")
        return seg.read(offset - seg.base_offset, size)

    def store_timestamp_at(self, offset):
        """STORETIMESTAMP of the record at ``offset`` (RocketMQ pickupStoreTimestamp), or -1."""
        try:
            return self.get(offset).store_timestamp
        except (MessageNotFoundError, CorruptRecordError):
            return -1

    def queue_offset_at(self, offset):
        """QUEUEOFFSET of the message record at ``offset``, or None where none can be read
        (deleted, past the written end, not a message)."""
        try:
            head = self.read(offset, 28)
        except MessageNotFoundError:
            return None
        magic = int.from_bytes(head[4:8], "big", signed=True)
        if magic not in (_record.MAGIC_V1, _record.MAGIC_V2):
            return None
        return int.from_bytes(head[20:28], "big", signed=True)

    def let_go(self, start, end):
        """Drop the pages of commitlog ``[start, end)`` from the resident set (read once by
        a scan, such as a recovery's dispatch; the data stays, see MappedSegment.let_go)."""
        for seg in self.segments.segments:
            lo, hi = max(start, seg.base_offset), min(end, seg.base_offset + seg.size)
            if lo < hi:
                seg.let_go(lo - seg.base_offset, hi - lo)

    def next_segment_offset(self, offset):
        return offset + self.segments.file_size - offset % self.segments.file_size

    def scan(self, gate, from_offset=0, to_offset=None, check_crc=False):
        """Every message from ``from_offset`` in commitlog order (skipping BLANK records),
        until the store's ``gate`` closes; NotRecordStartError now when a record cannot
        start at ``from_offset``."""
        seg = self.segments.find(from_offset) if from_offset > self.min_offset else None
        if seg is not None:
            _read.check_start(seg, from_offset - seg.base_offset, seg.wrote_pos)
        return _read.Flatten(self._scan_batches(from_offset, to_offset, check_crc), gate)

    def _scan_batches(self, from_offset, to_offset, check_crc):
        """scan's messages in lists: runs of valid records read by the kernel, and whatever
        stops a run (BLANK, end of data, a corrupt record) read alone. Segments retention
        deleted under the scan are passed over: it goes on at the new minimum."""
        pos = from_offset
        while True:
            pos = max(pos, self.min_offset)
            end = self.max_offset if to_offset is None else min(to_offset, self.max_offset)
            if pos >= end:
                return
            seg = self.segments.find(pos)
            if seg is None:
                return
            try:
                msgs, nxt = _read.scan_messages(seg, pos - seg.base_offset, end - seg.base_offset, check_crc,
                                                SCAN_BATCH, SCAN_BATCH_BYTES)
                r = None if msgs else _read.decode_record(seg, pos - seg.base_offset, seg.wrote_pos, check_crc)
            except StoreClosedError:
                if seg.base_offset >= self.min_offset:   # the store closed, not retention
                    raise
                continue
            if msgs:
                yield msgs
                pos = seg.base_offset + nxt
                continue
            if isinstance(r, MessageExt):
                if r.phy_offset != pos:     # its msgId would name another message
                    raise CorruptRecordError(f"record at commitlog offset {pos}: its PHYSICALOFFSET field says "
                                             f"{r.phy_offset}", pos)
                yield [r]
                pos += r.store_size
            elif r[0] == "end":   # zeros before the end of data (pos < end): a hole, not the end
                raise CorruptRecordError(f"{seg.path}: commitlog offset {pos}: data ends (zeros) before the "
                                         f"end of data at {self.max_offset}", pos)
            else:   # a BLANK record: the rest of the segment is unused
                pos = seg.base_offset + seg.size

    def flush(self, least_pages=0):
        """msync what is written (``least_pages`` as MappedSegment.flush); whether the
        flushed offset moved. OSError when it failed."""
        if self.flusher is None:
            return self.segments.flush(least_pages)
        before = self.flusher.flushed
        return self.flusher.flush(least_pages) != before

    def close(self):
        self.appender.release_stage()
        self.segments.close()   # the toucher first: jobs not started are dropped
