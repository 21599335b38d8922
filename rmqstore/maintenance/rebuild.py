"""Rebuild: consume queues and index files made again from the commitlog alone.

``consumequeue/`` and ``index/`` are removed and every record from the commitlog minimum
is dispatched again, so the new files hold the bytes incremental dispatch writes. The
index keeps the geometry (slots, entries per file) of the files it replaces.

Both are derived from the commitlog, so whatever state they are in (zeroed, cut short,
garbage, a directory or link where a file is due) a rebuild replaces them: a store whose
open refuses one of them (a DerivedFileError) opens with
``MessageStore(path, rebuild=True)``, which never reads them (``rmqstore rebuild --yes``).
"""
from __future__ import annotations

import contextlib
import errno
import os
from typing import TYPE_CHECKING, Callable, Iterator

from rmqstore.consume_queue import ConsumeQueueTable
from rmqstore.dispatch import ConsumeQueueBuilder, Dispatcher, new_dispatcher
from rmqstore.errors import (
    CorruptStoreError,
    DerivedFileError,
    DiskFullError,
    ResourceLimitError,
    StoreError,
    StoreIOError,
    raise_errno,
)
from rmqstore.files import check_replaceable, create_new, file_size, list_dir
from rmqstore.index import IndexService, detect_geometry
from rmqstore.segments import SCAN_WINDOW as LET_GO_WINDOW

if TYPE_CHECKING:
    from rmqstore.checkpoint import Checkpoint
    from rmqstore.commitlog import CommitLog
    from rmqstore.config import StoreConfig

LOGICS = ("consumequeue", "index")


@contextlib.contextmanager
def damaged_logics(root: str) -> Iterator[None]:
    """Turn a consume-queue or index file an open cannot use into a DerivedFileError
    that says how to repair it (a full disk or a system limit stays what it is: no file is
    damaged)."""
    try:
        yield
    except (CorruptStoreError, StoreIOError) as e:
        if isinstance(e, (DiskFullError, ResourceLimitError, DerivedFileError)):
            raise
        raise DerivedFileError(f"{e}; consume queues and index files are derived from the commitlog: "
                               f"'rmqstore rebuild {root} --yes' (MessageStore(path, rebuild=True)) "
                               "regenerates them") from e


def keep_index_geometry(root: str, config: StoreConfig) -> StoreConfig:
    """``config`` with the slots and entries of the newest index file whose size fits a
    geometry (damaged ones passed over), so a rebuild keeps the store's index shape."""
    directory = os.path.join(root, "index")
    try:
        names = sorted((n for n in list_dir(directory) if n.isascii() and n.isdigit()), reverse=True)
    except StoreIOError:
        return config
    for name in names:
        path = os.path.join(directory, name)
        try:
            slots, entries = detect_geometry(path, file_size(path), config.index_slots, config.index_entries, True)
        except (OSError, CorruptStoreError):
            continue
        return config.with_(index_slots=slots, index_entries=entries)
    return config


def remove_logics(root: str, checkpoint: Checkpoint) -> None:
    """Remove ``consumequeue/`` and ``index/`` whatever they hold; a file, FIFO or link in
    their place is removed itself (a link's target is never touched). StoreIOError when
    something cannot be removed.

    A rebuild killed part way must leave no set of files that looks whole: they are
    marked lost first (mark_logics_lost), and each directory's files go newest first, so
    what is left of a queue or an index is a prefix that dispatch continues (removed in
    listing order, a queue kept its newer files without its first ones, or a whole topic
    was gone while the others stood, and a clean open dispatched neither again)."""
    mark_logics_lost(root, checkpoint)
    for name in LOGICS:
        path = os.path.join(root, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                _remove_tree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        except OSError as e:
            raise_errno(e.errno or errno.EIO, e.filename or path, "remove for rebuild")


def mark_logics_lost(root: str, checkpoint: Checkpoint) -> bool:
    """Before consume queues and index files are removed or written anew: set the
    checkpoint's logics and index times to 0 and make ``abort``, so an open after a kill
    meanwhile recovers as after a crash, from the first segment, and dispatches everything
    again. Returns whether ``abort`` was there already."""
    checkpoint.logics_msg_timestamp = checkpoint.index_msg_timestamp = 0
    checkpoint.flush()
    abort = os.path.join(root, "abort")
    if check_replaceable(abort):
        return True
    create_new(abort, str(os.getpid()).encode(), checkpoint.file_mode)
    return False


def _remove_tree(path: str) -> None:
    """shutil.rmtree, but each directory's files newest (highest name) first; links inside
    are unlinked, not followed."""
    for where, dirs, files in os.walk(path, topdown=False):
        for name in sorted(files, reverse=True) + [d for d in dirs if os.path.islink(os.path.join(where, d))]:
            os.unlink(os.path.join(where, name))
        os.rmdir(where)


def fresh_logics(root: str, config: StoreConfig, commitlog: CommitLog, checkpoint: Checkpoint,
                 consume_queues: ConsumeQueueTable, index: IndexService | None
                 ) -> tuple[ConsumeQueueTable, IndexService | None, ConsumeQueueBuilder, Dispatcher]:
    """Close ``consume_queues`` and ``index``, delete their files and make empty new ones
    (the caller holds the write lock and has stopped dispatch). Returns the new table,
    index, CQ builder and a dispatcher at the commitlog minimum (not started): install
    them, then ``dispatch_all``."""
    cfg = keep_index_geometry(root, config)
    if index is not None:
        index.close()
    consume_queues.close()
    remove_logics(root, checkpoint)
    table = ConsumeQueueTable.of_store(root, cfg)
    if index is not None:
        index = IndexService(root, cfg, checkpoint).load(True, commitlog.max_offset)
    builder = ConsumeQueueBuilder(table, cfg.delay_levels_ms())
    return table, index, builder, new_dispatcher(commitlog, commitlog.min_offset, builder, index,
                                                 cfg.background_dispatch)


def dispatch_all(commitlog: CommitLog, table: ConsumeQueueTable, d: Dispatcher,
                 progress: Callable[[int], object] | None = None) -> None:
    """Dispatch the whole commitlog with ``d`` (its ``error`` says where a bad record
    stopped it); ``progress(nbytes)`` follows. Should ``progress`` raise, the dispatch is
    still finished before the error propagates, so no queue is left half built. The pages
    read are let go of behind it, a window at a time: memory does not grow with the log."""
    done = held = d.reput_from
    try:
        while d.run_once():
            if progress is not None:
                progress(d.reput_from - done)
            done = d.reput_from
            if done - held >= LET_GO_WINDOW:
                commitlog.let_go(held, done)
                held = done
    finally:
        while d.run_once():
            pass
        with contextlib.suppress(StoreError):   # (a segment closed meanwhile: nothing held there)
            commitlog.let_go(held, d.reput_from)
        commitlog.queue_offsets = {k: cq.max_offset for k, cq in table.queues.items()}
