"""MessageStore: the public facade over commitlog, consume queues, index, dispatch and flush.
It opens and closes the components and delegates to them; the rules live in the modules it
names (dispatch.py, consume_queue.py, consumer.py, maintenance/)."""
from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

import rmqstore._append as _append
import rmqstore._columns as _columns
import rmqstore._consume as _consume
import rmqstore._gate as _gate
import rmqstore._index as _index
from rmqstore import _message, _record, ingest, ownership
from rmqstore._cq import ENTRY_DTYPE
from rmqstore.arguments import arg_checks, checked
from rmqstore.checkpoint import Checkpoint
from rmqstore.column_types import KeyColumns, QueueColumns
from rmqstore.commitlog import CommitLog
from rmqstore.config import StoreConfig
from rmqstore.consume_queue import ConsumeQueueTable, check_boundary
from rmqstore.consumer import GetMessageResult
from rmqstore.dispatch import ConsumeQueueBuilder, Dispatcher, new_dispatcher, written_rows
from rmqstore.errors import (
    CorruptRecordError,
    CorruptStoreError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MessageNotFoundError,
    ReentrantCallError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
    StoreReadOnlyError,
)
from rmqstore.files import check_replaceable, create_new, lock_writer, raise_open_file_limit, store_dir
from rmqstore.flush import FlushService
from rmqstore.index import IndexService
from rmqstore.maintenance.rebuild import damaged_logics, dispatch_all, fresh_logics, keep_index_geometry, remove_logics
from rmqstore.maintenance.retention import RetentionReport, clean_expired
from rmqstore.maintenance.verify import VerifyReport
from rmqstore.maintenance.verify import verify as verify_components
from rmqstore.offsets import ConsumerOffsets
from rmqstore.recovery import CUT_ANY, CUT_NONE, CUT_TORN, recover_commitlog
from rmqstore.segments import detect_file_size
from rmqstore.shared_lock import SharedLock

log = logging.getLogger(__name__)
Progress = Callable[[int], object]
QueueId = int   # a queue id: 0..2^31-1, checked as such (arguments.ARG_CHECKS)
F = TypeVar("F", bound=Callable[..., Any])
RETENTION_DISPATCH_WAIT = 30.0   # seconds clean_expired waits for dispatch before deleting


def _gated(method: F) -> F:
    """Run ``method`` as an in-flight operation: close() waits for it to end, and once
    close() has begun it raises StoreClosedError instead of starting. Annotated arguments
    are checked first (see arguments.arg_checks). The wrapper is C (_gate.gated)."""
    return functools.wraps(method)(_gate.gated(method, arg_checks(method, 1)))  # type: ignore[return-value]


def _gated_read(method: F) -> F:
    """_gated for a read of consume queues or the index: should a rebuild close them under
    it (StoreClosedError on an open store), it runs again on the new ones."""
    return functools.wraps(method)(_gate.gated(method, arg_checks(method, 1), True))  # type: ignore[return-value]


def _detect_cq_entries(root: str, configured: int) -> int | None:
    """Entries per consume-queue file of an existing store (see detect_file_size)."""
    base = os.path.join(root, "consumequeue")
    try:
        dirs = [os.path.join(base, t, q) for t in sorted(os.listdir(base)) if os.path.isdir(os.path.join(base, t))
                for q in sorted(os.listdir(os.path.join(base, t)))]
        size = detect_file_size([d for d in dirs if os.path.isdir(d)], 20 * configured)
    except (OSError, CorruptStoreError):   # loading them names what is wrong
        return None
    return size // 20 if size and size % 20 == 0 else None


class MessageStore:
    """A RocketMQ store directory, opened for writing (one process, OS lock on ``lock``)
    or read-only (any number of processes, no lock, nothing on disk changes).

    Layout: ``commitlog/``, ``consumequeue/{topic}/{queueId}/``, ``index/``,
    ``checkpoint``, ``abort`` (present while a writer has it open), ``lock``,
    ``config/consumerOffset.json``. Segment sizes of an existing store are taken from
    its files when they differ from the config.

    Thread-safety: any number of threads may put, get and query; appends serialize on one
    lock, reads take none.

    Crash behaviour: a record, consume-queue entry or index entry counts only once it is
    whole, so a crash leaves no half-written message. With ``flush_mode="sync"`` a put
    returns once its record is on disk; with ``"async"`` a crash loses at most what the
    flusher (every ``flush_interval_ms``) had not written yet. A writer's open recovers:
    it cuts a torn tail written after the last flush and builds again the queue and index
    entries it misses; it refuses to cut data that was already durable (see ``repair``).
    An I/O error while flushing makes the store read-only until it is reopened.
    """

    @checked(skip=1)
    def __init__(self, path: str | os.PathLike[str], config: StoreConfig | None = None, read_only: bool = False,
                 progress: Progress | None = None, rebuild: bool = False, repair: bool = False) -> None:
        """Open (or, writing, create) the store at ``path`` and recover it.

        Args:
            path: the store directory (a str or os.PathLike; not empty).
            config: sizes, intervals and limits (StoreConfig(); segment sizes of an
                existing store are taken from its files).
            read_only: open without the writer lock and change no byte; any number of
                read-only handles may be open, also beside a live writer.
            progress: called with a byte count as recovery (and a rebuild's dispatch) proceeds.
            rebuild: do not read ``consumequeue/`` and ``index/``, whatever state they are
                in: a writer removes them after recovery and dispatches the whole commitlog
                again (as rebuild() does; CorruptRecordError where a bad record stops it,
                or where recovery would cut commitlog data, which a rebuild does only
                with ``repair``);
                read-only, they are left alone and the store has none (a dry run's view).
            repair: a writer's recovery cuts the commitlog at the first invalid record
                even where data it holds as durable follows (``rmqstore recover --yes``).
                Without it such an open raises CorruptRecordError and changes nothing;
                a torn tail left by a crash (records written after the last flush) is cut
                either way.

        Raises:
            InvalidArgumentError: a bad argument. StoreNotFoundError: no directory
            (read-only), no commitlog/ in it to rebuild from (``rebuild=True``), or a
            store file that vanished during the open (its path named).
            StoreLockedError: another writer holds it. CorruptRecordError: damage
            recovery would cut only with ``repair``. CorruptStoreError,
            StoreIOError: files it cannot use. DerivedFileError: a consume-queue or index
            file it cannot use (``rebuild=True`` regenerates them)."""
        self.path = os.path.abspath(str(path))
        cfg = config or StoreConfig()
        self.read_only = read_only
        self._closed = True
        self._lock_fd: int | None = None
        self._owner_pid = os.getpid()
        self._close_lock = threading.Lock()
        self._maintenance = SharedLock()   # verifies run together; a rebuild (it swaps the dispatcher), a clean alone
        self._gate = _gate.Gate(self.path, self._check_open)   # see _gate.pyx; put and put_batch pass it too
        self._gate.swap_lock = threading.Lock()
        # flush() and the flusher write the checkpoint; rebuild and retention close the files they flush
        self._logics_lock = threading.Lock()
        if rebuild and not os.path.isdir(os.path.join(self.path, "commitlog")):   # before anything is made
            raise StoreNotFoundError(errno.ENOENT, "not a store to rebuild (no commitlog/ directory); its "
                                     "consumequeue/ and index/ were left alone", self.path)
        try:
            store_dir(self.path, not read_only, cfg.dir_mode)
            raise_open_file_limit()
            if not read_only:
                self._acquire_lock(cfg)
            try:
                self._open(cfg, progress, rebuild, repair)
            except BaseException:
                self._release_lock()
                raise
        except FileNotFoundError as e:
            if isinstance(e, StoreError):
                raise
            # a file the open had just seen is gone: the directory removed or emptied under it
            raise StoreNotFoundError(errno.ENOENT, "a store file vanished while the store was being opened "
                                     "(is another process removing the directory?)", e.filename or self.path) from e
        ownership.bind(self)
        self._closed = False

    # -- opening --------------------------------------------------------------------------
    def _acquire_lock(self, cfg: StoreConfig) -> None:
        self._lock_fd = lock_writer(self.path, cfg.file_mode)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open(self, cfg: StoreConfig, progress: Progress | None, rebuild: bool, repair: bool) -> None:
        cl_size = detect_file_size([os.path.join(self.path, "commitlog")], cfg.commitlog_file_size)
        if cl_size and cl_size != cfg.commitlog_file_size:
            log.info("%s: using the store's commitlog segment size %d", self.path, cl_size)
            try:
                cfg = cfg.with_(commitlog_file_size=cl_size)
            except InvalidArgumentError:
                raise CorruptStoreError(f"{self.path}/commitlog: first segment is {cl_size} bytes") from None
        if rebuild:
            cfg = keep_index_geometry(self.path, cfg)
        cq_entries = _detect_cq_entries(self.path, cfg.consume_queue_entries)
        if cq_entries and cq_entries != cfg.consume_queue_entries:
            cfg = cfg.with_(consume_queue_entries=cq_entries)
        self.config = cfg
        self._sync = cfg.flush_mode == "sync" and not self.read_only
        self.abort_path = os.path.join(self.path, "abort")
        self.clean_shutdown = not os.path.lexists(self.abort_path)
        if not self.read_only:   # one a writer cannot replace fails the open before recovery changes a file
            check_replaceable(self.abort_path)
        self.checkpoint = Checkpoint(os.path.join(self.path, "checkpoint"), cfg.file_mode).load()
        self.commitlog = CommitLog(self.path, cfg, self.read_only)
        self.consume_queues = ConsumeQueueTable.of_store(self.path, cfg, self.read_only)
        self.offsets = ConsumerOffsets(self.path, cfg.file_mode, cfg.dir_mode)
        self.index: IndexService | None = None
        self.dispatcher: Dispatcher          # set by _recover
        self.flusher: FlushService           # set below on a writer; _teardown copes with neither
        try:
            self.commitlog.segments.load()
            if not rebuild:
                with damaged_logics(self.path):
                    self.consume_queues.load()
            self.offsets.load()
            self._recover(progress, rebuild, CUT_ANY if repair else CUT_NONE if rebuild else CUT_TORN)
            if not self.read_only:
                self.commitlog.segments.prepare_first()
                create_new(self.abort_path, str(os.getpid()).encode(), cfg.file_mode)
                self.flusher = FlushService(self.commitlog, cfg, self.checkpoint, self._flush_logics, self.path)
                self.flusher.start()
                self.dispatcher.start()
        except BaseException:
            self._teardown()
            raise
        self._writer = _append.StoreWriter(self._gate, self.commitlog.appender, self.read_only,
                                           None if self.read_only else self.flusher.native, self._sync,
                                           self.commitlog.check_writable)
        # the instance's put / put_batch are the writer's C methods (no Python frame per call),
        # unless a subclass overrides them
        if type(self).put is MessageStore.put:
            self.put = self._writer.put   # type: ignore[method-assign]
        if type(self).put_batch is MessageStore.put_batch:
            self.put_batch = self._writer.put_batch   # type: ignore[method-assign]
        self._bind_readers()

    def _bind_readers(self) -> None:
        """The instance's get_messages and query_by_key: C methods over the consume queues
        and the index service (see put), unless a subclass overrides them. A rebuild rebinds
        these readers to its new queues and index, so a method taken before
        (``get = store.get_messages``) keeps working."""
        cfg = self.config
        self._reader = _consume.QueueReader(
            self._gate, arg_checks(inspect.unwrap(MessageStore.get_messages), 1), self.consume_queues,
            self.commitlog.segments, (cfg.max_transfer_count_on_message_in_memory,
                                      cfg.max_transfer_bytes_on_message_in_memory, cfg.consume_queue_entries))
        self._key_lookup = None if self.index is None else _index.KeyLookup(
            self._gate, self.index, self.commitlog.segments, arg_checks(inspect.unwrap(MessageStore.query_by_key), 1),
            cfg.max_msgs_num_batch)
        if type(self).get_messages is MessageStore.get_messages:
            self.get_messages = self._reader.get_messages   # type: ignore[method-assign]
        if self._key_lookup is not None and type(self).query_by_key is MessageStore.query_by_key:
            self.query_by_key = self._key_lookup.query_by_key   # type: ignore[method-assign]

    def _recover(self, progress: Progress | None, rebuild: bool, may_cut: str) -> None:
        cfg = self.config
        valid = {key: cq.valid_end(ordered=not self.read_only) for key, cq in self.consume_queues.queues.items()}
        # after a clean shutdown every consume-queue entry points at a durable message; one
        # past the commitlog's files is a damaged entry, which recovery cuts as before
        last = self.commitlog.segments.last
        files_end = last.base_offset + last.size if last is not None else 0
        referenced = max((e for _, e in valid.values() if e <= files_end), default=-1) if self.clean_shutdown else -1
        self.recovery = rep = recover_commitlog(self.commitlog, self.clean_shutdown, self.checkpoint,
                                                cfg.check_crc_on_recover, cfg.message_index_enable, progress,
                                                may_cut, referenced)
        if rebuild and not self.read_only:
            remove_logics(self.path, self.checkpoint)
        end = self.commitlog.max_offset
        damaged = end   # dispatch again from where the first damaged consume queue now ends
        for key, cq in self.consume_queues.queues.items():   # read-only: positions only, files untouched
            cut = cq.recover(valid[key])
            tail, inside = cq.truncate_dirty(end)
            cut += cq.cut_shifted(self.commitlog.queue_offset_at)   # entries at other messages' queue offsets
            rep.consume_queue_bytes_truncated += cut + tail
            cq.correct_min_offset(self.commitlog.min_offset)
            if cut or inside or cq.segments.dropped:   # entries lost to damage (or a torn write)
                # from the start of the segment its last entry's message ends in: a record
                # starts there, even if that entry is damaged too (dispatching what the
                # queues hold again skips it)
                seg = self.commitlog.segments.find(max(cq.max_physic_offset, 0))
                damaged = min(damaged, seg.base_offset if seg is not None else max(cq.max_physic_offset, 0))
        if cfg.message_index_enable:
            self.index = IndexService(self.path, cfg, self.checkpoint, self.read_only)
            if not (rebuild and self.read_only):
                with damaged_logics(self.path):
                    self.index.load(self.clean_shutdown, end)
            rep.index_entries_dropped = self.index.entries_dropped
        reput = min(self.consume_queues.max_physic_offset(), damaged)
        reput = max(reput, self.commitlog.min_offset, 0)
        if not self.clean_shutdown:
            reput = min(reput, rep.start_offset)
        if self.index is not None and self.index.resume_offset is not None:
            reput = max(min(reput, self.index.resume_offset), self.commitlog.min_offset)
        self._cq_builder = ConsumeQueueBuilder(self.consume_queues, cfg.delay_levels_ms())
        self.dispatcher = new_dispatcher(self.commitlog, reput, self._cq_builder, self.index,
                                         cfg.background_dispatch)
        if self.read_only:   # a dry run: what a writer's open would dispatch
            rep.commitlog_bytes_redispatched = max(0, self.commitlog.max_offset - self.dispatcher.reput_from)
        else:
            d = self.dispatcher
            before = d.reput_from
            dispatch_all(self.commitlog, self.consume_queues, d, progress if rebuild else None)
            rep.commitlog_bytes_redispatched = d.reput_from - before
            if rebuild and d.error is not None:
                raise CorruptRecordError(f"{self.path}: rebuild stopped: {d.error}") from d.error
        self.commitlog.queue_offsets = {k: cq.max_offset for k, cq in self.consume_queues.queues.items()}

    def _flush_logics(self, least_pages: int) -> None:
        with self._logics_lock:
            cp = self.checkpoint
            ts = self._cq_builder.last_timestamp
            self.consume_queues.flush(least_pages)
            if least_pages == 0 and ts:
                cp.logics_msg_timestamp = max(cp.logics_msg_timestamp, ts)
            if self.index is not None:
                self.index.flush(least_pages)
            self.offsets.persist()
            cp.flush()

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether close() has run (or begun)."""
        return self._closed

    def _check_open(self) -> None:
        """The guard every public method calls first."""
        if self._closed:
            ownership.check_owner(self)
            raise StoreClosedError(f"{self.path}: store is closed")

    def _stop_if_closing(self) -> None:
        """The safe point long operations (verify) pass between steps."""
        if self._gate.closing:
            raise StoreClosedError(f"{self.path}: store closed during the operation")

    def operation(self) -> contextlib.AbstractContextManager[None]:
        """``with store.operation():`` runs a step of the caller's own on files inside the
        store directory as one of the store's operations: close() (which lets the writer lock
        go) waits for it to end, and once close() has begun it raises StoreClosedError instead
        of starting (a closed store raises it at the call). So a file kept beside the store's
        own (the endpoint's consumption state) is renamed or truncated only while this handle
        holds the lock, never under another writer that took it since."""
        self._check_open()
        return self._in_gate()

    @contextlib.contextmanager
    def _in_gate(self) -> Iterator[None]:
        self._gate.enter()
        try:
            yield
        finally:
            self._gate.leave()

    def _reentrant(self) -> bool:
        """Whether this thread is inside rebuild (its progress callback) or holds the write
        lock (put_batch's iterable)."""
        return self._maintenance.exclusive_here or self.commitlog.appender.held_here

    def _refuse_reentry(self, what: str) -> None:
        """ReentrantCallError when this thread is inside rebuild (its progress callback) or
        holds the write lock (put_batch's iterable), which hold what ``what`` needs."""
        if self._reentrant():
            raise ReentrantCallError(f"{self.path}: {what} called from within rebuild or a write (its callback "
                                     "or iterable) would wait for it forever, or pull the store from under it")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise StoreReadOnlyError("store opened read-only")

    def close(self) -> None:
        """Dispatch what is left, flush everything, write the checkpoint, remove ``abort``
        and release the lock. Idempotent. Operations already running (put, get, query,
        verify, rebuild, clean) end first: verify stops at its next segment with
        StoreClosedError, the others finish; later calls raise StoreClosedError."""
        with self._close_lock:
            if self._closed:
                return
            self._refuse_reentry("close()")
            self._gate.closing = True
            while self._gate.others_running():     # not this thread's own (a callback)
                time.sleep(0.0005)
            self._closed = True
            try:
                if not self.read_only and self.commitlog.failed is None:
                    self.dispatcher.stop()
                    self._close_dispatch()
                    self.flusher.stop()
                    self.flusher.flush_commitlog(0)   # raises only if acknowledged data may not be durable
                    if self._close_logics():
                        with contextlib.suppress(FileNotFoundError):   # removed by someone else: no error
                            os.unlink(self.abort_path)
            finally:
                self._teardown()

    def close_keeping_lock(self) -> int:
        """close(), the writer lock kept: returns a descriptor holding it (the same open
        file, so its flock and byte-0 lock stay) for the caller to close once it has
        removed or renamed the store's files, which no other writer may open meanwhile
        (``put --create`` undoing a store it made, a Spark overwrite). StoreReadOnlyError
        on a read-only handle, StoreClosedError on a closed one."""
        self._check_writable()
        if self._lock_fd is None:   # a writer that is open holds it
            raise StoreClosedError("store closed")
        fd = os.dup(self._lock_fd)
        try:
            self.close()
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _close_dispatch(self) -> None:
        """close(): dispatch what is left. A full disk (no room for a consume-queue or index
        file) is said once and is no error: the messages are in the commitlog, and the
        next open dispatches them."""
        try:
            self.dispatcher.catch_up()
        except OSError as e:
            log.warning("%s: closed with commitlog offsets %d..%d not yet in consume queues and index (%s); "
                        "the next open dispatches them", self.path, self.dispatcher.reput_from,
                        self.commitlog.max_offset, e.strerror or e)

    def _close_logics(self) -> bool:
        """close(): flush consume queues, index, consumer offsets and checkpoint; returns
        whether they were. On a full disk (no room for the checkpoint's new page) that is
        said once and ``abort`` stays: the next open recovers as after a crash, and loses
        nothing flushed to the commitlog."""
        try:
            self.flusher.flush_logics_now(0)
        except StoreReadOnlyError as e:
            cause = e.__cause__
            if not isinstance(cause, OSError) or cause.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("%s: closed without writing the checkpoint and consumer offsets (%s): the commitlog is "
                        "flushed; the next open recovers from it as after a crash", self.path, cause.strerror or cause)
            return False
        return True

    def _teardown(self) -> None:
        if getattr(self, "dispatcher", None) is not None:
            self.dispatcher.stop()
        if getattr(self, "flusher", None) is not None:
            self.flusher.close()
        if self.index is not None:
            self.index.close()
        self.consume_queues.close()
        self.commitlog.close()
        self._release_lock()

    def __enter__(self) -> MessageStore:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce_ex__(self, protocol: Any) -> Any:
        """A store is a live handle (its lock, maps and threads): pickling or copying one
        is refused. A copy shared them, and closing it (even by collecting it) closed
        this one; open the path again instead."""
        raise InvalidArgumentTypeError(f"{self.path}: a MessageStore cannot be pickled or copied; "
                                       "open its path again")

    # what close() may raise from a finaliser; bound to the class, so still there at interpreter shutdown
    _CLOSE_ERRORS = (StoreError, OSError)

    def __del__(self) -> None:
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except self._CLOSE_ERRORS:
            pass   # a finaliser cannot raise; close() has released everything regardless

    # -- writing --------------------------------------------------------------------------
    def put(self, msg: _message.Message, queue_id: int | None = None) -> _message.PutResult:
        """Append one message.

        Args:
            msg: the Message.
            queue_id: its queue (None: round robin over ``default_queue_nums``).

        Returns:
            PutResult (msgId, commitlog offset and size, queue id and offset). In SYNC
            flush mode the message is durable when this returns.

        Raises:
            InvalidArgumentError, MessageTooLargeError: nothing was stored.
            StoreReadOnlyError: read-only, or a flush failed earlier. DiskFullError.
            StoreClosedError. A KeyboardInterrupt that arrives while the record is written
            is raised once it is stored (and, SYNC, before the flush wait): the message
            may be stored though the call raised."""
        return self._writer.put(msg, queue_id)   # gated, checked and (SYNC) waited for in C

    def put_batch(self, msgs: Iterable[_message.Message],
                  queue_id: int | Sequence[int | None] | None = None) -> list[_message.PutResult]:
        """Append many messages under one lock with one store time (SYNC: one flush).

        Args:
            msgs: an iterable of Message.
            queue_id: the queue of all of them, a list or tuple of one queue id (or None)
                per message, or None (round robin per message).

        Returns:
            a PutResult per message, in order.

        Raises:
            as put; all or nothing: a bad message anywhere, or a full disk, stores none
            (a KeyboardInterrupt during the write is raised after the whole batch). An
            error about message i says "put_batch message i: ..." and has ``message_index`` i."""
        return self._writer.put_batch(msgs, queue_id)

    @_gated
    def put_columns(self, topic: Any, bodies: Any, queue_ids: Any = None, tags: Any = None, keys: Any = None,
                    properties: Mapping[str, str] | None = None, *, flag: Any = None, sys_flag: Any = None,
                    born_timestamp: Any = None, born_host: Any = None,
                    reconsume_times: Any = None, dispatch: bool = False) -> dict[str, np.ndarray]:
        """Append many messages given as columns, with no Python object per message.

        Args:
            topic: one topic for every message, or one per message.
            bodies: a sequence of bytes-like objects, or an Arrow binary array.
            queue_ids: None (round robin per topic), one queue id, or one per message (None:
                that one round robin).
            tags: None, one tag for every message, or one (or None) per message.
            keys: None, or per message a key, a list of keys or None.
            properties: properties every message gets (no DELAY: delayed messages go
                through ``put``).
            flag, sys_flag, reconsume_times: None (0), one int for every message, or one
                per message (a sequence, numpy or Arrow array; None or null: 0), in
                Message's ranges. ``sys_flag``'s host IPv6 bits are set from the hosts;
                PREPARED / ROLLBACK messages get queue offset 0, as put gives them.
            born_timestamp: as flag, in ms since the epoch (an Arrow timestamp array is
                converted); 0, None or null: the store time.
            born_host: None (the store host), one "ip:port" for every message, or one
                (or None) per message; IPv4 or IPv6 ("[v6]:port").
            dispatch: on a store without ``background_dispatch``, build the rows' consume-queue
                and index entries now, from these columns, without reading the records back
                (as ``wait_dispatched`` would build them), when everything before them is
                dispatched; else ``wait_dispatched`` builds them.

        With ``generate_uniq_key`` each message gets a UNIQ_KEY. The records are the ones
        ``put`` writes for the same messages. All or nothing, under one lock and (SYNC) one
        flush wait.

        Returns:
            numpy arrays ``phy_offset``, ``size``, ``queue_id`` and ``queue_offset``.

        Raises:
            InvalidArgumentError (InvalidArgumentTypeError for a wrong type: a column of
            another length, an int out of range, a bad host), MessageTooLargeError,
            DiskFullError: nothing was written.
            StoreIOError from writing (without ``warm_mapped_file``, batches of 256 KiB or
            more go in with pwrite, in runs of up to 1 MiB): the rows of the runs before
            the failed one are stored, and after a crash some of that run may be too; the
            store is then read-only, as after a failed flush.
        """
        self._check_open()
        body = ingest.body_column(bodies)
        n = ingest.rows_of(body)
        names, ids = ingest.topic_column(topic, n)
        props = ingest.properties_column(n, tags, keys, properties, self.commitlog.uniq_key)
        fields = ingest.message_fields(n, flag, sys_flag, born_timestamp, born_host, reconsume_times)
        return self._put_columns(names, ids, body, props, ingest.int_column(queue_ids, n, "queue_ids", -1, 0), fields,
                                 dispatch)

    @_gated
    def put_arrow(self, data: Any, dispatch: bool = False) -> dict[str, np.ndarray]:
        """``put_columns`` of a pyarrow Table or RecordBatch.

        Args:
            data: columns ``topic`` and ``body`` (no nulls), optional ``queue_id``, ``tags``,
                ``keys`` (string or list of strings), ``uniq_key``, ``properties`` (map of
                strings), ``flag``, ``sys_flag``, ``born_timestamp`` (timestamp or int ms),
                ``born_host`` ("ip:port") and ``reconsume_times``: the columns of
                ``batch.arrow_schema()`` a message has before it is stored (the others are
                ignored). Nulls: put_columns' defaults. Each row is stored as ``put``
                stores ``Message(topic, body, tags, keys, {**properties, "UNIQ_KEY":
                uniq_key}, flag=..., ...)``.
            dispatch: as put_columns' (not for a batch put as Messages, see below).

        A batch with a row put would move to SCHEDULE_TOPIC_XXXX (a DELAY level) is put as
        Messages with put_batch, which moves it.

        Returns and raises as put_columns."""
        self._check_open()
        names, ids, body, props, queue_ids, fields, delayed = ingest.arrow_columns(data, self.commitlog.uniq_key)
        if names and not delayed:   # (no rows name no topic: the Message path puts none)
            return self._put_columns(names, ids, body, props, queue_ids, fields, dispatch)
        qids = None if queue_ids is None else [None if q < 0 else q for q in queue_ids.tolist()]
        res = self._writer.put_batch(ingest.arrow_messages(data, fields), qids)
        return {"phy_offset": np.array([r.phy_offset for r in res], np.int64),
                "size": np.array([r.size for r in res], np.int64),
                "queue_id": np.array([r.queue_id for r in res], np.int32),
                "queue_offset": np.array([r.queue_offset for r in res], np.int64)}

    def _put_columns(self, names: list[str], ids: Any, body: Any, props: Any, queue_ids: Any,
                     fields: dict[str, Any], dispatch: bool = False) -> dict[str, np.ndarray]:
        written = self.commitlog.put_columns(names, ids, body, props, queue_ids, fields)
        phy, size, qid, qoff, _ = written
        d = self.dispatcher
        if dispatch and len(phy) and not d.background and d.reput_from == phy[0]:
            rows = written_rows(names, ids, props, fields, written, len(self.commitlog.store_host))
            if rows is not None:
                d.dispatch_written(*rows)
        if len(phy) and self._sync:
            self.flusher.wait_flushed(int(phy[-1] + size[-1]))
        return {"phy_offset": phy, "size": size, "queue_id": qid, "queue_offset": qoff}

    @_gated
    def flush(self) -> None:
        """Make everything written so far durable, consume queues and checkpoint included."""
        self._check_open()
        if self.read_only:
            return
        self._refuse_reentry("flush()")
        self.flusher.flush_commitlog(0)
        self.flusher.flush_logics_now(0)

    # -- reading the commitlog ------------------------------------------------------------
    @_gated
    def get_by_offset(self, phy_offset: int) -> _message.MessageExt:
        """The message whose record starts at commitlog offset ``phy_offset``.

        Returns:
            MessageExt.

        Raises:
            MessageNotFoundError: no record starts there. CorruptRecordError."""
        self._check_open()
        return self.commitlog.get(phy_offset)

    @_gated
    def get_by_msg_id(self, msg_id: str) -> _message.MessageExt:
        """The message a msgId names (it encodes the store host and commitlog offset).

        Args:
            msg_id: 32 (IPv4) or 56 (IPv6) hex digits.

        Returns:
            MessageExt.

        Raises:
            InvalidArgumentError: not a msgId. MessageNotFoundError: no such record,
            or one stored by another host."""
        self._check_open()
        host, offset = _record.parse_msg_id(msg_id)
        m = self.commitlog.get(offset)
        if m.store_host_packed != host:
            raise MessageNotFoundError(f"msgId {msg_id}: stored by another host")
        return m

    @_gated
    def scan(self, from_offset: int = 0, to_offset: int | None = None,
             check_crc: bool = False) -> Iterator[_message.MessageExt]:
        """Every message in commitlog order, BLANK records skipped.

        Args:
            from_offset: commitlog offset to start at (clamped to the minimum).
            to_offset: stop before this offset (None: the end).
            check_crc: verify each body CRC (CorruptRecordError on a mismatch).

        Returns:
            an iterator of MessageExt."""
        self._check_open()
        return self.commitlog.scan(self._gate, from_offset, to_offset, check_crc)

    @property
    def min_phy_offset(self) -> int:
        """The smallest commitlog offset still stored."""
        self._check_open()
        return self.commitlog.min_offset

    @property
    def max_phy_offset(self) -> int:
        """The commitlog offset where the next message will be written (end of data)."""
        self._check_open()
        return self.commitlog.max_offset

    # -- dispatch state -------------------------------------------------------------------
    @checked(skip=1)
    def wait_dispatched(self, timeout: float | None = None) -> bool:
        """Wait until the consume queues and index hold every message put so far (without
        ``background_dispatch``: build them, in this thread).

        Args:
            timeout: seconds to wait at most (None: no limit).

        Returns:
            True when caught up (always on a read-only store), False on timeout."""
        self._check_open()
        if self.read_only:
            return True
        self._refuse_reentry("wait_dispatched()")
        while True:
            d = self.dispatcher
            ok = d.wait_dispatched(timeout)
            if d is self.dispatcher or timeout is not None:   # else a rebuild replaced it: wait on the new one
                return ok

    @property
    def dispatch_lag(self) -> int:
        """Commitlog bytes not yet dispatched to the consume queues and index."""
        self._check_open()
        return self.dispatcher.lag if not self.read_only else 0

    # -- consume queues -------------------------------------------------------------------
    @_gated
    def topics(self) -> list[str]:
        """The topics that have consume queues, sorted."""
        self._check_open()
        return self.consume_queues.topics()

    @_gated_read
    def queue_ids(self, topic: str) -> list[int]:
        """The queue ids of ``topic`` that have a consume queue, sorted ([] if none)."""
        self._check_open()
        return self.consume_queues.queue_ids(topic)

    @_gated_read
    def min_offset(self, topic: str, queue_id: QueueId) -> int:
        """The smallest queue offset still stored in queue ``queue_id`` of ``topic`` (0 if no queue)."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    @_gated_read
    def max_offset(self, topic: str, queue_id: QueueId) -> int:
        """The queue offset the next message of ``queue_id`` of ``topic`` gets (0 if no queue)."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    @_gated_read
    def consume_queue_entries(self, topic: str, queue_id: QueueId, offset: int = 0,
                              count: int | None = None) -> np.ndarray:
        """Raw consume-queue entries of one queue.

        Args:
            topic, queue_id: the queue.
            offset: first queue offset (clamped to the minimum).
            count: entries to read (None: to the end).

        Returns:
            a numpy structured array (phy_offset, size, tags_code)."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return np.empty(0, ENTRY_DTYPE)
        if count is None:
            count = max(0, cq.max_offset - offset)
        return cq.read(max(offset, cq.min_offset), count)

    @_gated_read
    def read_queue_columns(self, topic: str, queue_id: QueueId, offset: int = 0, count: int | None = None,
                           check_crc: bool = False) -> QueueColumns:
        """The messages of one queue decoded into numpy columns, GIL released.

        Args:
            topic, queue_id: the queue.
            offset: first queue offset; count: entries to read (None: all).
            check_crc: verify body CRCs.

        Returns:
            QueueColumns: a dict of numpy columns, a row a message in queue order (every
            stored field; bodies, topics and properties as Arrow-style data and offsets),
            ``count``, and ``missing``: the queue offsets whose record could not be read."""
        self._check_open()
        cq = self.consume_queues.get(topic, queue_id)
        start = max(offset, cq.min_offset) if cq is not None else offset
        entries = cq.read(start, cq.max_offset - start if count is None else count) if cq is not None \
            else np.empty(0, ENTRY_DTYPE)
        cols = _columns.decode_entries(self.commitlog.segments.segments, entries, check_crc)
        cols["missing"] += start
        return cols

    def get_messages(self, topic: str, queue_id: QueueId, offset: int, max_count: int = 32,
                     tags: str | None = None) -> GetMessageResult:
        """RocketMQ's getMessage: up to ``max_count`` messages of one queue.

        Args:
            topic, queue_id: the queue.
            offset: first queue offset to read.
            max_count: at most this many messages (positive).
            tags: a tag expression (``TagA || TagB``; None or ``*``: all).

        Returns:
            GetMessageResult: status, messages, next/min/max offsets and ``problems``
            (entries that could not be followed)."""
        return self._reader.get_messages(topic, queue_id, offset, max_count, tags)   # gated and checked in C

    @_gated_read
    def offset_by_time(self, topic: str, queue_id: QueueId, timestamp: int, boundary: str = "lower") -> int:
        """The queue offset for a store time (RocketMQ getOffsetInQueueByTime).

        Args:
            topic, queue_id: the queue (0 when it does not exist).
            timestamp: ms since the epoch.
            boundary: ``"lower"`` (the first message stored at or after it; the max offset
                when none), ``"upper"`` (the last stored at or before it; the min offset
                when none) or ``"nearest"`` (RocketMQ 4.9's rule exactly).

        Raises:
            InvalidArgumentError: an unknown ``boundary``."""
        self._check_open()
        check_boundary(boundary)
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp, self.commitlog.store_timestamp_at, self.commitlog.min_offset, boundary)

    # -- consumer offsets -----------------------------------------------------------------
    @_gated
    def commit_offset(self, group: str, topic: str, queue_id: QueueId, offset: int) -> None:
        """Record that ``group`` has consumed ``topic``/``queue_id`` up to ``offset``
        (kept in ``config/consumerOffset.json`` as a broker keeps it).

        Raises:
            StoreReadOnlyError: on a read-only store.
            InvalidArgumentError: a negative offset (-1 would read back as none committed),
                a queue id outside 0..2^31-1, an empty group or topic or one with '@'."""
        self._check_writable()
        self.offsets.commit(group, topic, queue_id, offset, self.config.strict_topic_names)

    @_gated
    def committed_offset(self, group: str, topic: str, queue_id: QueueId) -> int:
        """The offset ``group`` committed for ``topic``/``queue_id``, or -1 if none."""
        self._check_open()
        return self.offsets.get(group, topic, queue_id)

    @_gated
    def consumer_groups(self) -> list[tuple[str, str]]:
        """The (group, topic) pairs with committed offsets, sorted (keys of
        ``config/consumerOffset.json`` that are not one ``topic@group`` are left out, as
        RocketMQ leaves them out)."""
        self._check_open()
        pairs = (key.split("@") for key in list(self.offsets.table))
        return sorted((p[1], p[0]) for p in pairs if len(p) == 2)

    # -- index queries --------------------------------------------------------------------
    def _index_or_raise(self) -> IndexService:
        self._check_open()
        if self.index is None:
            raise InvalidArgumentError(f"{self.path}: message_index_enable is off")
        return self.index

    @_gated_read
    def query_offsets(self, topic: str, key: str, max_num: int = 64, begin: int = 0,
                      end: int | None = None) -> list[int]:
        """RocketMQ's queryMessage: commitlog offsets whose index key hash matches.

        Args:
            topic, key: what to look up.
            max_num: newest entries at most (capped at max_msgs_num_batch).
            begin, end: store time range in ms (end None: no limit).

        Returns:
            offsets sorted ascending (hash collisions included, as RocketMQ returns them).

        Raises:
            InvalidArgumentError: message_index_enable is off."""
        return self._index_or_raise().query_offsets(topic, key, max_num, begin, end)

    @_gated_read
    def query_offsets_page(self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int | None = None,
                           resume: str | None = None) -> tuple[list[int], str | None]:
        """query_offsets a page at a time: every hash match, newest first, each page costing
        its own entries (and colliding keys' between them), never those of the pages before.

        Args:
            topic, key, begin, end: as query_offsets.
            max_num: offsets a page holds at most (capped at max_msgs_num_batch).
            resume: None for the first page, else the token the last page returned.

        Returns:
            (offsets newest first, hash collisions included; the next page's resume
            token, or None after the last page). A page may hold fewer than ``max_num``
            offsets and still have a next one (it looks at 65,536 entries at most).

        Raises:
            InvalidArgumentError: message_index_enable is off, or ``resume`` is not a
            token of this store's index files (or names one since deleted)."""
        return self._index_or_raise().query_page(topic, key, max_num, begin, end, resume)

    @_gated_read
    def query_by_key(self, topic: str, key: str, max_num: int = 64, begin: int = 0,
                     end: int | None = None) -> list[_message.MessageExt]:
        """The messages of ``topic`` whose UNIQ_KEY or a KEYS token is ``key``, newest first.

        Args:
            topic, key: what to look up.
            max_num, begin, end: as query_offsets.

        Returns:
            a list of MessageExt (hash collisions removed)."""
        return self._index_or_raise().view.query_messages(self.commitlog.segments.segments, topic, key, max_num,
                                                          begin, end, self.config.max_msgs_num_batch)

    @_gated_read
    def query_keys(self, topic: str, keys: Sequence[str], max_num: int = 64, begin: int = 0,
                   end: int | None = None) -> list[list[_message.MessageExt]]:
        """query_by_key for many keys in one index pass.

        Args:
            topic: the topic; keys: a sequence of str.
            max_num, begin, end: as query_offsets, per key.

        Returns:
            a list of MessageExt lists, one per key in ``keys`` order."""
        return self._index_or_raise().view.query_many(topic, keys, max_num, begin, end, self.config.max_msgs_num_batch,
                                                      self.commitlog.segments.segments)

    @_gated_read
    def query_keys_columns(self, topic: str, keys: Sequence[str], max_num: int = 64, begin: int = 0,
                           end: int | None = None) -> KeyColumns:
        """query_keys' messages as numpy columns: no Python object a message, and all but the
        columns' allocation with the GIL released, so threads run it in parallel.

        Args:
            topic, keys, max_num, begin, end: as query_keys.

        Returns:
            KeyColumns: read_queue_columns' columns (without ``missing``), a row a message
            found, key by key in ``keys`` order and each key's newest first, with ``key``
            (int64): the index in ``keys`` of the row's key."""
        return self._index_or_raise().view.query_many(topic, keys, max_num, begin, end, self.config.max_msgs_num_batch,
                                                      self.commitlog.segments.segments, True)

    @_gated
    def query_by_uniq_key(self, topic: str, uniq_key: str) -> _message.MessageExt:
        """The newest message of ``topic`` whose UNIQ_KEY is ``uniq_key``.

        Raises:
            MessageNotFoundError: none."""
        self._check_open()
        for m in self.query_by_key(topic, uniq_key, self.config.max_msgs_num_batch):
            if m.uniq_key == uniq_key:
                return m
        raise MessageNotFoundError(f"{topic}: no message with UNIQ_KEY {uniq_key!r}")

    # -- maintenance ----------------------------------------------------------------------
    @_gated
    def clean_expired(self, now: float | None = None, dry_run: bool = False) -> RetentionReport:
        """Delete expired commitlog segments and the CQ/index files below the new minimum,
        as RocketMQ's retention does: oldest first, at most 10 a call, never the segment being
        written; a segment goes when it is a ``delete_when`` hour and its last write is older
        than ``file_reserved_time`` hours, or at once while disk use (as ``df`` counts it) is
        at or above ``disk_max_used_space_ratio`` percent. ``now`` in seconds since the
        epoch (None: the current time). Returns a RetentionReport. ``dry_run=True`` deletes
        nothing (and works read-only): the report names what would be deleted and why.
        Raises StoreReadOnlyError on a read-only store unless ``dry_run``. Waits for running
        verifies (which read the files it deletes)."""
        if dry_run:
            self._check_open()
            # a writer dispatches what is written before deleting (below); a read-only view
            # predicts a writer's run, which dispatches everything first
            dispatched = self.commitlog.max_offset if self.read_only else self.dispatcher.reput_from \
                if self._reentrant() else self._dispatch_before_retention()
            return clean_expired(self.config, self.commitlog.segments, self.consume_queues, self.index,
                                 dispatched, now, True)
        self._check_writable()
        self._refuse_reentry("clean_expired()")   # before the maintenance lock: the write lock is taken after it
        self._dispatch_before_retention()
        # not under a verify reading the files, nor under the flusher flushing them (_logics_lock)
        with self._maintenance.exclusive(), self.commitlog.lock, self._logics_lock, self._closing_files():
            return clean_expired(self.config, self.commitlog.segments, self.consume_queues, self.index,
                                 self.dispatcher.reput_from, now)

    def _dispatch_before_retention(self) -> int:
        """Dispatch what is written (waiting up to RETENTION_DISPATCH_WAIT seconds) so that
        retention can delete it; returns how far dispatch got. A stopped or stalled
        dispatcher is no error here: retention then keeps what it has not dispatched."""
        with contextlib.suppress(Exception):   # what stopped dispatch is logged (and raised) by it
            self.dispatcher.wait_dispatched(RETENTION_DISPATCH_WAIT)
        return self.dispatcher.reput_from

    @contextlib.contextmanager
    def _closing_files(self) -> Iterator[None]:
        """Around a maintenance step that closes files readers may be reading (rebuild's
        swap, retention's deletes): a read that meets one closed waits for the step to end
        and runs again (Gate.swapped), so it never raises StoreClosedError on an open store."""
        with self._gate.swap_lock:
            self._gate.generation += 1
            try:
                yield
            finally:
                self._gate.generation += 1

    @_gated
    def verify(self, progress: Progress | None = None, max_problems: int = 1000) -> VerifyReport:
        """Check the whole store: every record's structure and body CRC; every consume-queue
        entry points at its record (size, topic, queue, offset, tag code) and every message
        has its entry; the index files' structure, and their entries equal the keys the
        commitlog holds; no checkpoint time past the newest message. Changes nothing; returns
        a VerifyReport listing at most ``max_problems``. ``progress(nbytes)`` is called
        after each commitlog segment. Verifies in several threads run at once; a rebuild
        waits for them."""
        self._check_open()
        if max_problems < 0:
            raise InvalidArgumentError(f"max_problems must be >= 0, got {max_problems}")

        def step(nbytes: int) -> None:
            self._stop_if_closing()
            if progress is not None:
                progress(nbytes)
        self._refuse_reentry("verify()")   # inside a write, waiting for a rebuild that waits for it would deadlock
        with self._maintenance.shared():
            if not self.read_only:
                self.dispatcher.wait_dispatched()
            return verify_components(self.commitlog.segments, self.consume_queues, self.index, self.checkpoint,
                                     self.config.delay_levels_ms(), read_only=self.read_only,
                                     clean_shutdown=self.clean_shutdown, progress=step, max_problems=max_problems)

    @_gated
    def rebuild(self, progress: Progress | None = None) -> int:
        """Rebuild every consume queue and index file from the commitlog: ``consumequeue/``
        and ``index/`` are removed and every record is dispatched again (index files keep their
        slot and entry counts). Appends wait meanwhile; readers see the queues grow back.
        ``progress(nbytes)`` follows the dispatch. Returns the commitlog bytes dispatched;
        raises CorruptRecordError where a bad record stops it."""
        self._check_writable()
        self._refuse_reentry("rebuild()")
        with self._maintenance.exclusive(), self.commitlog.lock, self._logics_lock:
            self.dispatcher.stop()
            start = self.commitlog.min_offset
            with self._closing_files():
                self.consume_queues, self.index, self._cq_builder, d = fresh_logics(
                    self.path, self.config, self.commitlog, self.checkpoint, self.consume_queues, self.index)
                self.dispatcher = d
                self._reader.rebind(self.consume_queues)
                if self._key_lookup is not None:
                    self._key_lookup.rebind(self.index)
            try:
                dispatch_all(self.commitlog, self.consume_queues, d, progress)
            finally:
                d.start()
        self.flush()
        if d.error is not None:
            raise CorruptRecordError(f"{self.path}: rebuild stopped: {d.error}") from d.error
        return d.reput_from - start
