"""Retention: delete expired commitlog segments and the consume-queue and index files that
only point into them (RocketMQ CleanCommitLogService / CleanConsumeQueueService).

A segment's age is its file's mtime, as RocketMQ's ``deleteExpiredFileByTime``: the last
write to it, i.e. about its newest message's store time. Segments go oldest first, at
most ``BATCH`` per call, never the one being written; they go when it is a ``delete_when``
hour and they are older than ``file_reserved_time`` hours, or at once (whatever their age)
while disk use is at or above ``disk_max_used_space_ratio`` percent.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmqstore.config import StoreConfig
    from rmqstore.consume_queue import ConsumeQueueTable
    from rmqstore.index import IndexService
    from rmqstore.segments import SegmentQueue

log = logging.getLogger(__name__)
BATCH = 10   # RocketMQ deleteCommitLogFilesInterval batch: DELETE_FILES_BATCH_MAX


@dataclass
class RetentionReport:
    """What one ``clean_expired`` call did."""
    reason: str = ""              # "", "time" or "disk"
    segments_deleted: int = 0
    bytes_freed: int = 0
    consume_queue_files_deleted: int = 0
    index_files_deleted: int = 0
    min_phy_offset: int = 0
    disk_used_ratio: float = 0.0


def is_delete_hour(delete_when: str, now: float) -> bool:
    """Whether local time ``now`` (seconds) falls in one of ``delete_when``'s hours ("04;05")."""
    hour = time.localtime(now).tm_hour
    return any(h.strip().isdigit() and int(h) == hour for h in delete_when.split(";"))


def disk_used_ratio(path: str) -> float:
    u = shutil.disk_usage(path)
    return 100.0 * (u.total - u.free) / u.total if u.total else 0.0


def clean_expired(config: StoreConfig, commitlog: SegmentQueue, consume_queues: ConsumeQueueTable,
                  index: IndexService | None, now: float | None = None) -> RetentionReport:
    """Apply the rules once to a store's commitlog segments, consume queues and index (the
    caller holds the write lock); returns a RetentionReport."""
    now = time.time() if now is None else now
    rep = RetentionReport(disk_used_ratio=disk_used_ratio(commitlog.directory))
    if rep.disk_used_ratio >= config.disk_max_used_space_ratio:
        rep.reason = "disk"
    elif is_delete_hour(config.delete_when, now):
        rep.reason = "time"
    doomed = []
    if rep.reason:
        for seg in commitlog.segments[:-1][:BATCH]:
            if rep.reason == "time" and os.path.getmtime(seg.path) + config.file_reserved_time * 3600 > now:
                break
            doomed.append(seg)
    if doomed:
        rep.segments_deleted = len(doomed)
        rep.bytes_freed = sum(s.size for s in doomed)
        commitlog.delete_segments(doomed)
        log.info("retention (%s): deleted %d commitlog segments, min offset now %d", rep.reason,
                 len(doomed), commitlog.min_offset)
    rep.min_phy_offset = max(commitlog.min_offset, 0)
    for cq in list(consume_queues.queues.values()):
        rep.consume_queue_files_deleted += cq.delete_below(rep.min_phy_offset)
    if index is not None:
        rep.index_files_deleted = index.delete_expired(rep.min_phy_offset) or 0
    return rep
