"""MessageStore: the public facade over commitlog, consume queues, index, dispatch and flush."""
import fcntl
import logging
import os
import shutil
import threading

import numpy as np

from rmqstore import _codec
from rmqstore.checkpoint import Checkpoint
from rmqstore.commitlog import CommitLog
from rmqstore.config import StoreConfig
from rmqstore.consume_queue import ConsumeQueueTable
from rmqstore.consumer import GetMessageResult, GetMessageStatus as S, TagFilter
from rmqstore.dispatch import Dispatcher
from rmqstore.errors import (CorruptRecordError, CorruptStoreError, InvalidArgumentError, MessageNotFoundError,
                             StoreClosedError, StoreLockedError, StoreReadOnlyError)
from rmqstore.flush import FlushService
from rmqstore.index import IndexService, UniqKeyGenerator
from rmqstore.offsets import ConsumerOffsets
from rmqstore.recovery import recover_commitlog
from rmqstore.segments import detect_file_size
from rmqstore.topics import SCHEDULE_TOPIC, is_safe_dirname
from rmqstore.verify import verify_store
from rmqstore.files import create_new, open_file, store_dir
from rmqstore import ownership

log = logging.getLogger(__name__)
_NO_CQ = (_codec.TRANSACTION_PREPARED, _codec.TRANSACTION_ROLLBACK)


def _detect_cq_entries(root):
    """Entries per consume-queue file of an existing store, from its first CQ file."""
    base = os.path.join(root, "consumequeue")
    try:
        for topic in sorted(os.listdir(base)):
            tdir = os.path.join(base, topic)
            for q in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else ():
                size = detect_file_size(os.path.join(tdir, q))
                if size and size % 20 == 0:
                    return size // 20
    except OSError:
        pass
    return None


class MessageStore:
    """A RocketMQ store directory, opened for writing (one process, OS lock on ``lock``)
    or read-only (any number of processes, no lock, nothing on disk changes).

    Layout: ``commitlog/``, ``consumequeue/{topic}/{queueId}/``, ``index/``,
    ``checkpoint``, ``abort`` (present while a writer has it open), ``lock``,
    ``config/consumerOffset.json``. Segment sizes of an existing store are taken from
    its files when they differ from the config.

    Thread-safety: any number of threads may put, get and query; appends serialize on one
    lock, reads take none. Crash behaviour: see recovery.py and flush.py.
    """

    def __init__(self, path, config=None, read_only=False, progress=None):
        self.path = os.path.abspath(str(path))
        cfg = config or StoreConfig()
        self.read_only = read_only
        self._closed = True
        self._lock_fd = None
        self._close_lock = threading.Lock()
        self._logics_lock = threading.Lock()   # flush() and the flusher both write the checkpoint
        store_dir(self.path, not read_only, cfg.dir_mode)
        if not read_only:
            self._acquire_lock(cfg)
        try:
            self._open(cfg, progress)
        except BaseException:
            self._release_lock()
            raise
        ownership.bind(self)
        self._closed = False

    # -- opening --------------------------------------------------------------------------
    def _acquire_lock(self, cfg):
        fd = open_file(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT, cfg.file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(f"{self.path}: another process has the store open for writing") from None
        self._lock_fd = fd

    def _release_lock(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open(self, cfg, progress=None):
        cl_size = detect_file_size(os.path.join(self.path, "commitlog"))
        if cl_size and cl_size != cfg.commitlog_file_size:
            log.info("%s: using the store's commitlog segment size %d", self.path, cl_size)
            try:
                cfg = cfg.with_(commitlog_file_size=cl_size)
            except InvalidArgumentError:
                raise CorruptStoreError(f"{self.path}/commitlog: first segment is {cl_size} bytes") from None
        cq_entries = _detect_cq_entries(self.path)
        if cq_entries and cq_entries != cfg.consume_queue_entries:
            cfg = cfg.with_(consume_queue_entries=cq_entries)
        self.config = cfg
        self._delays = cfg.delay_levels_ms()
        self._sync = cfg.flush_mode == "sync" and not self.read_only
        self._uniq = UniqKeyGenerator(_codec.pack_host(cfg.store_host)) if cfg.generate_uniq_key else None
        self.abort_path = os.path.join(self.path, "abort")
        self.clean_shutdown = not os.path.lexists(self.abort_path)
        self.checkpoint = Checkpoint(os.path.join(self.path, "checkpoint"), cfg.file_mode).load()
        self.commitlog = CommitLog(self.path, cfg, self.read_only)
        self.consume_queues = ConsumeQueueTable(self.path, cfg.consume_queue_entries, self.read_only,
                                                cfg.file_mode, cfg.dir_mode)
        self.offsets = ConsumerOffsets(self.path, cfg.file_mode, cfg.dir_mode)
        self.index = None
        self.dispatcher = None
        self.flusher = None
        try:
            self.commitlog.segments.load()
            self.consume_queues.load()
            self.offsets.load()
            self._recover(progress)
            if not self.read_only:
                create_new(self.abort_path, str(os.getpid()).encode(), cfg.file_mode)
                self.flusher = FlushService(self.commitlog, cfg, self.checkpoint, self._flush_logics)
                self.flusher.start()
                self.dispatcher.start()
        except BaseException:
            self._teardown()
            raise

    def _recover(self, progress=None):
        cfg = self.config
        self.recovery = rep = recover_commitlog(self.commitlog, self.clean_shutdown, self.checkpoint,
                                                cfg.check_crc_on_recover, cfg.message_index_enable, progress)
        end = self.commitlog.max_offset
        for cq in self.consume_queues.queues.values():   # read-only: positions only, files untouched
            rep.consume_queue_bytes_truncated += cq.recover() + cq.truncate_dirty(end)
            cq.correct_min_offset(self.commitlog.min_offset)
        if cfg.message_index_enable:
            self.index = IndexService(self.path, cfg, self.checkpoint, self.read_only).load(self.clean_shutdown, end)
            rep.index_entries_dropped = self.index.entries_dropped
        reput = max(self.consume_queues.max_physic_offset(), self.commitlog.min_offset, 0)
        if not self.clean_shutdown:
            reput = min(reput, rep.start_offset)
        if self.index is not None and self.index.resume_offset is not None:
            reput = max(min(reput, self.index.resume_offset), self.commitlog.min_offset)
        self.dispatcher = self._new_dispatcher(reput)
        if not self.read_only:
            before = self.dispatcher.reput_from
            self.dispatcher.catch_up()
            rep.records_redispatched = self.dispatcher.reput_from - before
        self.commitlog.queue_offsets = {k: cq.max_offset for k, cq in self.consume_queues.queues.items()}

    # -- dispatch -------------------------------------------------------------------------
    def _new_dispatcher(self, reput):
        d = Dispatcher(self.commitlog, reput)
        d.add(self._dispatch_cq)
        if self.index is not None:
            d.add(self.index.dispatch)
        return d

    def _cq_tags(self, batch):
        """Each row's consume-queue tags code: the tags hash, or for a SCHEDULE_TOPIC_XXXX
        message its delivery time."""
        rows = batch.rows
        tags = rows["tags_code"].copy()
        names = batch.topic_names
        if SCHEDULE_TOPIC in names:
            for i in np.nonzero(batch.topic_ids == names.index(SCHEDULE_TOPIC))[0].tolist():
                tags[i] = self._deliver_time(batch.properties(i).get("DELAY"), int(rows["store_timestamp"][i]), tags[i])
        return tags

    def _dispatch_cq(self, batch):
        """CommitLogDispatcherBuildConsumeQueue: one CQ entry per message, except PREPARED
        and ROLLBACK; delayed messages carry their delivery time as tags code. Rows are
        grouped by topic/queue and each run is written by the CQ kernel."""
        rows = batch.rows
        tran = rows["sys_flag"] & 0xC
        keep = np.nonzero((tran != _codec.TRANSACTION_PREPARED) & (tran != _codec.TRANSACTION_ROLLBACK))[0]
        if not len(keep):
            return
        tags = self._cq_tags(batch)
        names = batch.topic_names
        key = (batch.topic_ids[keep].astype(np.int64) << 32) | (rows["queue_id"][keep].astype(np.int64) & 0xFFFFFFFF)
        perm = np.argsort(key, kind="stable")
        order, key = keep[perm], key[perm]
        bounds = np.flatnonzero(np.diff(key)) + 1
        phy, size, qoff = rows["phy_offset"][order], rows["size"][order], rows["queue_offset"][order]
        tags = tags[order]
        table = self.consume_queues
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(order)]):
            cq = table.get_or_create(names[batch.topic_ids[order[lo]]], int(rows["queue_id"][order[lo]]))
            cq.put_run(phy[lo:hi], size[lo:hi], tags[lo:hi], qoff[lo:hi])
        self._last_cq_timestamp = int(rows["store_timestamp"][keep[-1]])

    def _deliver_time(self, level, store_ts, tags_code):
        """RocketMQ computeDeliverTimestamp for a SCHEDULE_TOPIC_XXXX message's DELAY level."""
        if level is None or not level.isdigit():
            return tags_code
        delays = self._delays
        lv = min(int(level), len(delays))
        return store_ts + delays[lv - 1] if lv > 0 else tags_code

    _last_cq_timestamp = 0

    def _flush_logics(self, least_pages):
        with self._logics_lock:
            cp = self.checkpoint
            ts = self._last_cq_timestamp
            self.consume_queues.flush(least_pages)
            if least_pages == 0 and ts:
                cp.logics_msg_timestamp = max(cp.logics_msg_timestamp, ts)
            if self.index is not None:
                self.index.flush(least_pages)
            self.offsets.persist()
            cp.flush()

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def closed(self):
        return self._closed

    def _check_open(self):
        if self._closed:
            ownership.check_owner(self)
            raise StoreClosedError(f"{self.path}: store is closed")

    def close(self):
        """Dispatch what is left, flush everything, write the checkpoint, remove ``abort``
        and release the lock. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                if not self.read_only and self.commitlog.failed is None:
                    self.dispatcher.stop()
                    self.dispatcher.catch_up()
                    self.flusher.stop()
                    self.flusher.flush_commitlog(0)
                    self.flusher.flush_logics_now(0)
                    os.unlink(self.abort_path)
            finally:
                self._teardown()

    def _teardown(self):
        if self.dispatcher is not None:
            self.dispatcher.stop()
        if self.flusher is not None:
            self.flusher.stop()
        if self.index is not None:
            self.index.close()
        self.consume_queues.close()
        self.commitlog.close()
        self._release_lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass

    # -- writing --------------------------------------------------------------------------
    def put(self, msg, queue_id=None):
        """Append one message; returns a PutResult. In SYNC mode it is durable on return."""
        if self._closed:
            self._check_open()
        if self._uniq is not None:
            self._uniq.stamp(msg)
        res = self.commitlog.put(msg, queue_id)
        if self._sync:
            self.flusher.wait_flushed(res.phy_offset + res.size)
        return res

    def put_batch(self, msgs, queue_id=None):
        """Append many messages under one lock and (SYNC) one flush; list of PutResult."""
        self._check_open()
        if self._uniq is not None:
            msgs = list(msgs)
            for m in msgs:
                self._uniq.stamp(m)
        res = self.commitlog.put_batch(msgs, queue_id)
        if res and self._sync:
            self.flusher.wait_flushed(res[-1].phy_offset + res[-1].size)
        return res

    def flush(self):
        """Make everything written so far durable, consume queues and checkpoint included."""
        self._check_open()
        if self.read_only:
            return
        self.flusher.flush_commitlog(0)
        self.flusher.flush_logics_now(0)

    # -- reading the commitlog ------------------------------------------------------------
    def get_by_offset(self, phy_offset):
        self._check_open()
        return self.commitlog.get(phy_offset)

    def get_by_msg_id(self, msg_id):
        """The message a msgId names (it encodes the store host and commitlog offset)."""
        self._check_open()
        host, offset = _codec.parse_msg_id(msg_id)
        m = self.commitlog.get(offset)
        if m.store_host_packed != host:
            raise MessageNotFoundError(f"msgId {msg_id}: stored by another host")
        return m

    def scan(self, from_offset=0, to_offset=None, check_crc=False):
        self._check_open()
        return self.commitlog.scan(from_offset, to_offset, check_crc)

    @property
    def min_phy_offset(self):
        return self.commitlog.min_offset

    @property
    def max_phy_offset(self):
        return self.commitlog.max_offset

    # -- dispatch state -------------------------------------------------------------------
    def wait_dispatched(self, timeout=None):
        self._check_open()
        if self.read_only:
            return True
        return self.dispatcher.wait_dispatched(timeout)

    @property
    def dispatch_lag(self):
        return self.dispatcher.lag if not self.read_only else 0

    # -- consume queues -------------------------------------------------------------------
    def topics(self):
        return self.consume_queues.topics()

    def queue_ids(self, topic):
        return self.consume_queues.queue_ids(topic)

    def min_offset(self, topic, queue_id):
        cq = self.consume_queues.get(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def max_offset(self, topic, queue_id):
        cq = self.consume_queues.get(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def consume_queue_entries(self, topic, queue_id, offset=0, count=None):
        """Raw CQ entries as a numpy structured array (phy_offset, size, tags_code)."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return _empty_entries()
        if count is None:
            count = max(0, cq.max_offset - offset)
        return cq.read(max(offset, cq.min_offset), count)

    def read_queue_columns(self, topic, queue_id, offset=0, count=None, check_crc=False):
        """The messages of one queue from ``offset`` (``count`` consume-queue entries, default
        all) decoded into columns as ``_codec.decode_batch`` lays them out, in one pass with
        the GIL released; ``missing`` lists the queue offsets whose record could not be read."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        start = max(offset, cq.min_offset) if cq is not None else offset
        entries = cq.read(start, cq.max_offset - start if count is None else count) if cq is not None \
            else _empty_entries()
        cols = _codec.decode_entries(self.commitlog.segments.segments, entries, check_crc)
        cols["missing"] += start
        return cols

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None):
        """RocketMQ DefaultMessageStore.getMessage: up to ``max_count`` messages of one
        queue from ``offset``, filtered by a tag expression; statuses and next offsets as
        RocketMQ's (a call never crosses a consume-queue file)."""
        self._check_open()
        if not isinstance(max_count, int) or max_count <= 0:
            raise InvalidArgumentError(f"max_count must be a positive int, got {max_count!r}")
        if not isinstance(offset, int):
            raise InvalidArgumentError(f"offset must be an int, got {offset!r}")
        flt = TagFilter(tags)
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            # RocketMQ's findConsumeQueue creates any queue asked for, so an unknown
            # topic/queue answers NO_MESSAGE_IN_QUEUE; one that cannot exist does not.
            if not isinstance(queue_id, int) or queue_id < 0 or not isinstance(topic, str) \
                    or not is_safe_dirname(topic):
                return GetMessageResult(S.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
            return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetMessageResult(S.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetMessageResult(S.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            # 4.9.8 and 5.3.3 both answer nextBeginOffset = maxOffset here (manifests)
            return GetMessageResult(S.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        cfg = self.config
        entries = cq.read(offset, max(800, max_count), within_file=True)
        if len(entries) == 0:
            seg_end = offset - offset % cfg.consume_queue_entries + cfg.consume_queue_entries
            return GetMessageResult(S.OFFSET_FOUND_NULL, seg_end, lo, hi)
        cl = self.commitlog
        msgs, used, removing, problems = _codec.gather_messages(
            cl.segments.segments, entries, max_count, cfg.max_transfer_count_on_message_in_memory,
            cfg.max_transfer_bytes_on_message_in_memory, cl.max_offset, cl.segments.file_size,
            flt.codes, flt.tags)
        status = S.FOUND if msgs else S.MESSAGE_WAS_REMOVING if removing else S.NO_MATCHED_MESSAGE
        res = GetMessageResult(status, offset + used, lo, hi, msgs)
        for k, phy, size, why in problems:
            res.problems.append((offset + k, phy, size))
            if why:
                log.warning("%s/%d offset %d: %s", topic, queue_id, offset + k, why)
        return res

    def offset_by_time(self, topic, queue_id, timestamp):
        """RocketMQ getOffsetInQueueByTime: binary search of store times in the CQ file
        chosen for ``timestamp``; returns the nearest queue offset (0 when unknown)."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None or not cq.segments.segments:
            return 0
        segs = cq.segments.segments
        store_ts = self.commitlog.store_timestamp_at
        seg = segs[-1]
        for s in segs[:-1]:
            # RocketMQ takes the first file modified at or after the time; a file's last
            # entry is when it was last written.
            last = cq.read((s.base_offset + s.wrote_pos) // 20 - 1, 1)
            if len(last) and store_ts(int(last[0]["phy_offset"])) >= timestamp:
                seg = s
                break
        base = seg.base_offset
        low = max(0, cq.min_logic_offset - base)
        high = seg.wrote_pos - 20
        min_phy = self.commitlog.min_offset
        target = left = right = -1
        left_v = right_v = -1
        while high >= low:
            mid = (low + high) // 40 * 20
            e = cq.read((base + mid) // 20, 1)
            if not len(e):
                return 0
            phy = int(e[0]["phy_offset"])
            if phy < min_phy:
                low, left = mid + 20, mid
                continue
            t = store_ts(phy)
            if t < 0:
                return 0
            if t == timestamp:
                target = mid
                break
            if t > timestamp:
                high, right, right_v = mid - 20, mid, t
            else:
                low, left, left_v = mid + 20, mid, t
        if target != -1:
            off = target
        elif left_v == -1:
            off = right
        elif right_v == -1:
            off = left
        else:
            off = right if abs(timestamp - left_v) > abs(timestamp - right_v) else left
        return (base + off) // 20

    # -- consumer offsets -----------------------------------------------------------------
    def commit_offset(self, group, topic, queue_id, offset):
        self._check_open()
        if self.read_only:
            raise StoreReadOnlyError("store opened read-only")
        self.offsets.commit(group, topic, queue_id, offset)

    def committed_offset(self, group, topic, queue_id):
        """The committed offset, or -1 when the group never committed one."""
        return self.offsets.get(group, topic, queue_id)

    # -- index queries --------------------------------------------------------------------
    def _index_or_raise(self):
        self._check_open()
        if self.index is None:
            raise InvalidArgumentError(f"{self.path}: message_index_enable is off")
        return self.index

    def query_offsets(self, topic, key, max_num=64, begin=0, end=None):
        """What RocketMQ's DefaultMessageStore.queryMessage finds for ``key`` in ``topic``
        stored in [begin, end] ms: the commitlog offsets of the newest ``max_num`` (at most
        max_msgs_num_batch) index entries whose key *hash* matches, sorted ascending."""
        return self._index_or_raise().query_offsets(topic, key, max_num, begin, end)

    def query_by_key(self, topic, key, max_num=64, begin=0, end=None):
        """The messages of ``topic`` whose UNIQ_KEY or a KEYS token is ``key``, newest
        first: query_offsets minus hash collisions (each candidate's record is checked in
        place, in C, before a message is built)."""
        index = self.index
        if index is None or self._closed:
            self._index_or_raise()
        return index.view.query_messages(self.commitlog.segments.segments, topic, key, max_num, begin, end,
                                         self.config.max_msgs_num_batch)

    def query_keys(self, topic, keys, max_num=64, begin=0, end=None):
        """query_by_key for many keys in one index pass; a list per key, in ``keys`` order."""
        return self._index_or_raise().view.query_many(topic, keys, max_num, begin, end, self.config.max_msgs_num_batch,
                                                      self.commitlog.segments.segments)

    def query_by_uniq_key(self, topic, uniq_key):
        """The newest message of ``topic`` whose UNIQ_KEY is ``uniq_key``."""
        for m in self.query_by_key(topic, uniq_key, self.config.max_msgs_num_batch):
            if m.uniq_key == uniq_key:
                return m
        raise MessageNotFoundError(f"{topic}: no message with UNIQ_KEY {uniq_key!r}")

    # -- retention ------------------------------------------------------------------------
    def clean_expired(self, now=None):
        """Delete expired commitlog segments and the CQ/index files below the new minimum
        (rules in retention.py); ``now`` in seconds since the epoch. Returns a report."""
        self._check_open()
        if self.read_only:
            raise StoreReadOnlyError("store opened read-only")
        from rmqstore.retention import clean_expired
        with self.commitlog.lock:
            return clean_expired(self, now)

    # -- maintenance ----------------------------------------------------------------------
    def verify(self, progress=None):
        """Check the whole store (rules in verify.py): records and CRCs, consume queues and
        index against the commitlog, checkpoint times. Changes nothing; returns a
        VerifyReport. ``progress(nbytes)`` is called after each commitlog segment."""
        self._check_open()
        return verify_store(self, progress)

    def rebuild(self, progress=None):
        """Rebuild every consume queue and index file from the commitlog: ``consumequeue/``
        and ``index/`` are removed and everything from the commitlog minimum is dispatched
        again, giving the files incremental dispatch writes. Appends wait meanwhile; readers
        see the queues grow back. ``progress(nbytes)`` follows the dispatch. Returns the
        commitlog bytes dispatched; raises CorruptRecordError where a bad record stops it."""
        self._check_open()
        if self.read_only:
            raise StoreReadOnlyError("store opened read-only")
        cfg = self.config
        with self.commitlog.lock, self._logics_lock:
            self.dispatcher.stop()
            if self.index is not None:
                if self.index.files:   # keep the store's index geometry
                    f = self.index.files[-1]
                    cfg = cfg.with_(index_slots=f.slots, index_entries=f.entries)
                self.index.close()
            self.consume_queues.close()
            for name in ("consumequeue", "index"):
                shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
            self.consume_queues = ConsumeQueueTable(self.path, cfg.consume_queue_entries, False, cfg.file_mode,
                                                    cfg.dir_mode)
            if self.index is not None:
                self.index = IndexService(self.path, cfg, self.checkpoint).load(True, self.commitlog.max_offset)
            start = done = self.commitlog.min_offset
            self.dispatcher = d = self._new_dispatcher(start)
            while d.run_once():
                if progress is not None:
                    progress(d.reput_from - done)
                done = d.reput_from
            self.commitlog.queue_offsets = {k: cq.max_offset for k, cq in self.consume_queues.queues.items()}
            d.start()
        self.flush()
        if d.error is not None:
            raise CorruptRecordError(f"{self.path}: rebuild stopped: {d.error}")
        return d.reput_from - start


def _empty_entries():
    import numpy as np
    from rmqstore._cq import ENTRY_DTYPE
    return np.empty(0, ENTRY_DTYPE)
