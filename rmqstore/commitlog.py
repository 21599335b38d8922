"""CommitLog: every message of every topic, appended to one run of segments."""
import threading
import time

from rmqstore import _codec
from rmqstore._codec import MessageExt
from rmqstore.errors import (CorruptRecordError, InvalidArgumentError, MessageNotFoundError,
                             StoreReadOnlyError)
from rmqstore.segments import SegmentQueue
from rmqstore.topics import SCHEDULE_TOPIC, validate_topic

TRAN_MASK = 0xC
_NO_CQ = (_codec.TRANSACTION_PREPARED, _codec.TRANSACTION_ROLLBACK)


def now_ms():
    return time.time_ns() // 1_000_000


class CommitLog:
    """The commitlog: records in RocketMQ's format, in files of ``commitlog_file_size``.

    Layout: ``commitlog/{offset:020d}``; a record never spans files: when it does not fit
    (with 8 bytes to spare) an 8-byte BLANK record ``[room left][0xCBD43194]`` ends the file
    and the record goes first in the next one. Zero TOTALSIZE marks the end of data.

    Thread-safety: ``put``/``put_batch`` serialize on one lock (append + roll + queue
    offset counters); reads take no lock and see only published bytes.
    Crash behaviour: see recovery.py; a torn tail is cut at the last valid record.
    """

    def __init__(self, root, config, readonly=False, segment_size=None):
        self.config = config
        self.readonly = readonly
        self.segments = SegmentQueue(f"{root}/commitlog", segment_size or config.commitlog_file_size, readonly,
                                     config.file_mode, config.dir_mode,
                                     preallocate=config.warm_mapped_file)
        self.store_host = _codec.pack_host(config.store_host)
        self.lock = threading.Lock()
        self.queue_offsets = {}        # (topic, queue_id) -> next queue offset
        self._round_robin = {}         # topic -> next queue id
        self._topics_ok = set()
        self._delay_levels = config.delay_levels_ms()
        self.failed = None             # sticky I/O error: the store turned read-only

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
        return self.segments.flushed_where

    # -- writing --------------------------------------------------------------------------
    def _check_writable(self):
        if self.readonly:
            raise StoreReadOnlyError("store opened read-only")
        if self.failed is not None:
            raise StoreReadOnlyError(f"store is read-only after an I/O error: {self.failed}") from self.failed

    def _route(self, msg, queue_id):
        """Effective (topic, queue_id, properties) after RocketMQ's delay rewrite."""
        topic = msg.topic
        if topic not in self._topics_ok:
            validate_topic(topic, self.config.message_version, self.config.strict_topic_names)
            self._topics_ok.add(topic)
        if queue_id is None:
            queue_id = self._round_robin.get(topic, 0)
            self._round_robin[topic] = (queue_id + 1) % self.config.default_queue_nums
        elif not 0 <= queue_id <= 0x7FFFFFFF:
            raise InvalidArgumentError(f"queue_id {queue_id} out of range")
        props = msg.properties
        delay = props.get("DELAY")
        if delay and (msg.sys_flag & TRAN_MASK) not in _NO_CQ:
            try:
                level = int(delay)
            except ValueError:
                raise InvalidArgumentError(f"DELAY property {delay!r} is not a level number") from None
            level = min(level, len(self._delay_levels))
            if level > 0:
                props = dict(props)
                props["DELAY"] = str(level)
                props["REAL_TOPIC"] = topic
                props["REAL_QID"] = str(queue_id)
                return SCHEDULE_TOPIC, level - 1, props
        return topic, queue_id, props

    def _append(self, msg, queue_id, store_ts):
        """Encode one message at the end (rolling as needed); caller holds the lock."""
        topic, queue_id, props = self._route(msg, queue_id)
        key = (topic, queue_id)
        tran = msg.sys_flag & TRAN_MASK
        queue_offset = 0 if tran in _NO_CQ else self.queue_offsets.get(key, 0)
        seg = self.segments.last
        if seg is None:
            seg = self.segments.roll(0)
        cfg = self.config
        res = _codec.append_message(seg, msg, topic, props, queue_id, queue_offset, store_ts,
                                    self.store_host, cfg.message_version, cfg.max_message_size)
        if res is None:   # BLANK written: the record goes first in a new segment
            seg = self.segments.roll()
            res = _codec.append_message(seg, msg, topic, props, queue_id, queue_offset, store_ts,
                                        self.store_host, cfg.message_version, cfg.max_message_size)
        if tran not in _NO_CQ:
            self.queue_offsets[key] = queue_offset + 1
        return res

    def put(self, msg, queue_id=None):
        self._check_writable()
        with self.lock:
            return self._append(msg, queue_id, now_ms())

    def put_batch(self, msgs, queue_id=None):
        """Append ``msgs`` under one lock acquisition, all with one store timestamp."""
        self._check_writable()
        out = []
        with self.lock:
            ts = now_ms()
            append = self._append
            for m in msgs:
                out.append(append(m, queue_id, ts))
        return out

    # -- reading --------------------------------------------------------------------------
    def get(self, offset, check_crc=False):
        """The MessageExt whose record starts at commitlog ``offset``."""
        seg = self.segments.find(offset)
        if seg is None or offset < 0:
            raise MessageNotFoundError(f"no commitlog segment holds offset {offset}")
        r = _codec.decode_record(seg, offset - seg.base_offset, seg.wrote_pos, check_crc)
        if not isinstance(r, MessageExt):
            raise MessageNotFoundError(f"no message at commitlog offset {offset} ({r[0]})")
        if r.phy_offset != offset:
            raise CorruptRecordError(f"commitlog offset {offset}: record says it is at {r.phy_offset}", offset)
        return r

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

    def next_segment_offset(self, offset):
        return offset + self.segments.file_size - offset % self.segments.file_size

    def scan(self, from_offset=0, to_offset=None, check_crc=False):
        """Every message from ``from_offset`` in commitlog order (skipping BLANK records)."""
        pos = max(from_offset, self.min_offset)
        while True:
            end = self.max_offset if to_offset is None else min(to_offset, self.max_offset)
            if pos >= end:
                return
            seg = self.segments.find(pos)
            if seg is None:
                return
            r = _codec.decode_record(seg, pos - seg.base_offset, seg.wrote_pos, check_crc)
            if isinstance(r, MessageExt):
                yield r
                pos += r.store_size
            else:   # BLANK record or end of this segment's data
                pos = seg.base_offset + seg.size

    def flush(self, least_pages=0):
        return self.segments.flush(least_pages)

    def close(self):
        self.segments.close()
