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


def rebuild(root: str, config: StoreConfig, commitlog: CommitLog, checkpoint: Checkpoint,
            consume_queues: ConsumeQueueTable, index: IndexService | None,
            progress: Callable[[int], object] | None = None
            ) -> tuple[ConsumeQueueTable, IndexService | None, ConsumeQueueBuilder, Dispatcher]:
    """Close ``consume_queues`` and ``index``, delete their files and dispatch the whole
    commitlog into new ones (the caller holds the write lock and has stopped dispatch).
    ``progress(nbytes)`` follows the dispatch. Returns the new table, index, CQ builder and
    dispatcher (not started; its ``error`` says where a bad record stopped it)."""
    cfg = config
    if index is not None:
        if index.files:   # keep the store's index geometry
            f = index.files[-1]
            cfg = cfg.with_(index_slots=f.slots, index_entries=f.entries)
        index.close()
    consume_queues.close()
    for name in ("consumequeue", "index"):
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    table = ConsumeQueueTable(root, cfg.consume_queue_entries, False, cfg.file_mode, cfg.dir_mode)
    if index is not None:
        index = IndexService(root, cfg, checkpoint).load(True, commitlog.max_offset)
    builder = ConsumeQueueBuilder(table, cfg.delay_levels_ms())
    done = commitlog.min_offset
    d = new_dispatcher(commitlog, done, builder, index)
    while d.run_once():
        if progress is not None:
            progress(d.reput_from - done)
        done = d.reput_from
    commitlog.queue_offsets = {k: cq.max_offset for k, cq in table.queues.items()}
    return table, index, builder, d
