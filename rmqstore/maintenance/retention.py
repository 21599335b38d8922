"""Retention: delete expired commitlog segments and the consume-queue and index files that
only point into them (RocketMQ CleanCommitLogService / CleanConsumeQueueService).

A segment's age is its file's mtime, as RocketMQ's ``deleteExpiredFileByTime``: the last
write to it, i.e. about its newest message's store time. Segments go oldest first, at
most ``BATCH`` per call, never the one being written; they go when it is a ``delete_when``
hour and they are older than ``file_reserved_time`` hours, or at once (whatever their age)
while disk use is at or above ``disk_max_used_space_ratio`` percent. Disk use is counted
as ``df`` counts it, so blocks reserved for root make no disk look fuller than it is.
A dry run (``dry_run=True``) works out the same plan and deletes nothing.

Retention never outruns dispatch: a segment holding a record the dispatcher has not yet
handed to the consume queues and the index (at or past ``dispatched``) is kept, however
old, and the report says how many were kept for it (``segments_kept_undispatched``).
Deleting it would lose the message from its queue, and the dispatcher would have to jump
over it. The store dispatches what is written before it applies the rules, so this only
holds segments back while dispatch is stalled or stopped.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
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
    """What one ``clean_expired`` call did (or, in a dry run, would do)."""
    reason: str = ""              # "", "time" or "disk"
    dry_run: bool = False
    segments: list[str] = field(default_factory=list)     # paths of the segments deleted
    segments_deleted: int = 0
    segments_kept_undispatched: int = 0   # expired, but holding records not dispatched yet
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
    """Percent of the file system holding ``path`` in use, as ``df`` shows it: used blocks
    over used plus those available to unprivileged users (root's reserve counts as neither)."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    return 100.0 * used / (used + st.f_bavail) if used + st.f_bavail else 0.0


def clean_expired(config: StoreConfig, commitlog: SegmentQueue, consume_queues: ConsumeQueueTable,
                  index: IndexService | None, dispatched: int, now: float | None = None,
                  dry_run: bool = False) -> RetentionReport:
    """Apply the rules once to a store's commitlog segments, consume queues and index (the
    caller holds the write lock); returns a RetentionReport. ``dispatched``: the commitlog
    offset before which every record is dispatched; no segment ending after it goes. With
    ``dry_run`` nothing is deleted: the report names the segments that would go (and the
    consume-queue and index files below the new minimum offset would follow them)."""
    now = time.time() if now is None else now
    rep = RetentionReport(dry_run=dry_run, disk_used_ratio=disk_used_ratio(commitlog.directory))
    if rep.disk_used_ratio >= config.disk_max_used_space_ratio:
        rep.reason = "disk"
    elif is_delete_hour(config.delete_when, now):
        rep.reason = "time"
    doomed = []
    if rep.reason:
        for seg in commitlog.segments[:-1][:BATCH]:
            if rep.reason == "time" and os.path.getmtime(seg.path) + config.file_reserved_time * 3600 > now:
                break
            if seg.base_offset + seg.size > dispatched:
                rep.segments_kept_undispatched += 1
            elif not rep.segments_kept_undispatched:
                doomed.append(seg)
    if rep.segments_kept_undispatched:
        log.warning("retention: %d expired commitlog segments kept: they hold records not dispatched yet "
                    "(dispatch is at commitlog offset %d)", rep.segments_kept_undispatched, dispatched)
    rep.segments = [s.path for s in doomed]
    rep.segments_deleted = len(doomed)
    rep.bytes_freed = sum(s.size for s in doomed)
    if dry_run:
        rep.min_phy_offset = doomed[-1].base_offset + doomed[-1].size if doomed else max(commitlog.min_offset, 0)
        return rep
    if doomed:
        commitlog.delete_segments(doomed)
        log.info("retention (%s): deleted %d commitlog segments, min offset now %d", rep.reason,
                 len(doomed), commitlog.min_offset)
    rep.min_phy_offset = max(commitlog.min_offset, 0)
    for cq in list(consume_queues.queues.values()):
        rep.consume_queue_files_deleted += cq.delete_below(rep.min_phy_offset)
    if index is not None:
        rep.index_files_deleted = index.delete_expired(rep.min_phy_offset) or 0
    return rep
