"""Rebuild: consume queues and index files made again from the commitlog alone.

``consumequeue/`` and ``index/`` are removed and every record from the commitlog minimum
is dispatched again, so the new files hold the bytes incremental dispatch writes. The
index keeps the geometry (slots, entries per file) of the files it replaces.
"""
from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Callable

from rmqstore.consume_queue import ConsumeQueueTable
from rmqstore.dispatch import ConsumeQueueBuilder, Dispatcher, new_dispatcher
from rmqstore.index import IndexService

if TYPE_CHECKING:
    from rmqstore.checkpoint import Checkpoint
    from rmqstore.commitlog import CommitLog
    from rmqstore.config import StoreConfig


def fresh_logics(root: str, config: StoreConfig, commitlog: CommitLog, checkpoint: Checkpoint,
                 consume_queues: ConsumeQueueTable, index: IndexService | None
                 ) -> tuple[ConsumeQueueTable, IndexService | None, ConsumeQueueBuilder, Dispatcher]:
    """Close ``consume_queues`` and ``index``, delete their files and make empty new ones
    (the caller holds the write lock and has stopped dispatch). Returns the new table,
    index, CQ builder and a dispatcher at the commitlog minimum (not started): install
    them, then ``dispatch_all``."""
    cfg = config
    if index is not None:
        if index.files:   # keep the store's index geometry
            f = index.files[-1]
            cfg = cfg.with_(index_slots=f.slots, index_entries=f.entries)
        index.close()
    consume_queues.close()
    for name in ("consumequeue", "index"):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    table = ConsumeQueueTable.of_store(root, cfg)
    if index is not None:
        index = IndexService(root, cfg, checkpoint).load(True, commitlog.max_offset)
    builder = ConsumeQueueBuilder(table, cfg.delay_levels_ms())
    return table, index, builder, new_dispatcher(commitlog, commitlog.min_offset, builder, index)


def dispatch_all(commitlog: CommitLog, table: ConsumeQueueTable, d: Dispatcher,
                 progress: Callable[[int], object] | None = None) -> None:
    """Dispatch the whole commitlog with ``d`` (its ``error`` says where a bad record
    stopped it); ``progress(nbytes)`` follows. Should ``progress`` raise, the dispatch is
    still finished before the error propagates, so no queue is left half built."""
    done = d.reput_from
    try:
        while d.run_once():
            if progress is not None:
                progress(d.reput_from - done)
            done = d.reput_from
    finally:
        while d.run_once():
            pass
        commitlog.queue_offsets = {k: cq.max_offset for k, cq in table.queues.items()}
