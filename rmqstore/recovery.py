"""Recovery: bring commitlog, consume queues and index back to one consistent state.

Durability invariants (what recovery may assume, see flush.py, and what it restores):

1. A record is valid when its structure parses (magic, every length within TOTALSIZE) and,
   with ``check_crc_on_recover``, its BODYCRC matches. The commitlog ends at the first
   record that is not valid; everything after it is zero-filled and later files deleted,
   so stale bytes never look like data.
2. Clean shutdown (no ``abort`` file): only the last three segments are verified
   (RocketMQ recoverNormally).
3. Unclean shutdown (``abort`` present): verification starts at the newest segment whose
   first record was stored no later than the checkpoint's minimum time (physic, logics
   and, with the index, index times, less 3 s), since everything before it was flushed
   everywhere (RocketMQ recoverAbnormally), and never after the segment holding the
   checkpoint's flushed offset (ours; RocketMQ has none): no durability decision rests on
   store times growing, since a clock may step back.
4. Consume-queue entries and index entries pointing at or past the recovered end are cut;
   dispatch then starts at the furthest consume-queue entry (or, after an unclean
   shutdown, at the verified segment) and re-creates whatever is missing. Re-dispatching
   an entry that already exists is a no-op. An entry whose message's QUEUEOFFSET is not
   the entry's own queue offset (a queue shifted by records lost before dispatch) is cut
   with every entry after it, and dispatch puts them back at their own queue offsets,
   blank entries standing for messages that are gone: a queue's offsets never shift.
5. The whole tail of the segment holding the recovered end is checked for stale bytes
   (pages of a torn write may reach the disk out of order; a page of zeros may hide data
   after it), not just the first page after it, and zero-filled when any are found.
6. A segment whose first record does not parse is never a starting point: recovery then
   starts earlier (at worst at the first segment) instead of failing to open.
7. Recovery cuts only what a crash can have left: a torn tail written after the last flush.
   Data after the cut point that was already durable (anything after a clean shutdown,
   also messages the consume queues of a clean shutdown point at where only zeros are
   left; after an unclean one, records stored up to the checkpoint's physicMsgTimestamp)
   means the log is damaged, not torn (after an unclean shutdown: data before the
   checkpoint's flushed offset; in a RocketMQ store, whose checkpoint has no offset, no
   record kept as new as its physicMsgTimestamp): a writer open then raises CorruptRecordError and
   changes nothing, unless asked to cut (``CUT_ANY``: ``rmqstore recover --yes``).
   RocketMQ cuts either way.
"""
import errno
import logging
import time
from dataclasses import dataclass, field

import rmqstore._read as _read
from rmqstore import _message
from rmqstore.errors import CorruptRecordError, StoreIOError
from rmqstore.segments import first_nonzero

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What recovery did; ``store.recovery`` keeps the last one."""
    clean_shutdown: bool
    segments_scanned: int = 0
    records_verified: int = 0
    start_offset: int = 0
    end_offset: int = 0
    commitlog_bytes_truncated: int = 0
    consume_queue_bytes_truncated: int = 0
    index_entries_dropped: int = 0
    commitlog_bytes_redispatched: int = 0   # bytes of commitlog dispatched again (a dry run: would be)
    stop_reason: str = "end"
    cuts_durable_data: bool = False   # invariant 7: a plain writer open refuses this cut
    seconds: float = 0.0
    notes: list = field(default_factory=list)


_PROGRESS_SECONDS = 5.0


def _first_store_timestamp(seg):
    """Store time of the segment's first record; 0 when it is not a message (RocketMQ
    isMappedFileMatchedRecover)."""
    try:
        r = _read.decode_record(seg, 0, seg.size, False)
    except CorruptRecordError:
        return 0
    return r.store_timestamp if isinstance(r, _message.MessageExt) else 0


def _start_index(segments, clean, checkpoint, index_enabled):
    """The segment verification starts at (invariants 2, 3): by the checkpoint's times as
    RocketMQ's isMappedFileMatchedRecover, and never after the segment holding the
    checkpoint's flushed offset (a clock stepped back gives a later segment an older
    first record, which the times alone take as flushed)."""
    if clean or not checkpoint.existed:
        return max(0, len(segments) - 3) if clean else 0
    limit = checkpoint.min_timestamp_index if index_enabled else checkpoint.min_timestamp
    by_time = next((i for i in range(len(segments) - 1, -1, -1)
                    if 0 < _first_store_timestamp(segments[i]) <= limit), 0)
    flushed = checkpoint.flushed_offset
    if flushed is None:
        return by_time
    by_offset = max((i for i, seg in enumerate(segments) if seg.base_offset <= flushed), default=0)
    return min(by_time, by_offset)


CUT_NONE, CUT_TORN, CUT_ANY = "none", "torn", "any"   # what a writer's recovery may cut (invariant 7)


def recover_commitlog(commitlog, clean, checkpoint, check_crc, index_enabled, progress=None, cut=CUT_TORN,
                      referenced=-1):
    """Find the end of valid data, truncate after it; returns a RecoveryReport. ``cut``:
    what a writer may discard: CUT_TORN a torn tail only (invariant 7), CUT_ANY whatever
    follows the first invalid record (``rmqstore recover --yes``), CUT_NONE nothing (a
    rebuild, which regenerates derived files); past that, CorruptRecordError and no change.
    ``referenced``: the commitlog offset up to which durable messages are known to lie
    (the consume queues' after a clean shutdown), so lost to a cut even where only zeros
    are left of them."""
    t0 = time.monotonic()
    rep = RecoveryReport(clean_shutdown=clean)
    segs = commitlog.segments.segments
    if not segs:
        return rep
    i = _start_index(segs, clean, checkpoint, index_enabled)
    rep.start_offset = segs[i].base_offset
    end = rep.start_offset
    next_log = t0 + _PROGRESS_SECONDS
    last_ts = 0
    for seg in segs[i:]:
        pos, count, status, ts = _read.scan_segment(seg, 0, seg.size, check_crc, False, True)
        last_ts = max(last_ts, ts)
        if seg.faulted:   # the zeros it read are a file changed under it, not the end of data: cut nothing
            raise StoreIOError(errno.EIO, "recovery: the file changed under its mapping (truncated by another "
                                          "process, or a page could not be read back)", seg.path)
        rep.segments_scanned += 1
        rep.records_verified += count
        if progress is not None:
            progress(seg.size)
        if time.monotonic() >= next_log:
            next_log += _PROGRESS_SECONDS
            log.info("recovery: %d/%d segments, %d records verified", rep.segments_scanned,
                     len(segs) - i, rep.records_verified)
        if status == "blank":
            end = seg.base_offset + seg.size
            continue
        end = seg.base_offset + pos
        if status != "end":
            rep.stop_reason = f"{status} at commitlog offset {end}"
        break
    rep.end_offset = end
    after = _data_after(segs, end)
    # invariant 7, by the checkpoint's flushed offset; in a store whose checkpoint has none
    # (RocketMQ's), by its time: the last flush reached a record of that store time, so
    # if no record kept is as new, flushed records lie past the cut (the newest kept, not
    # the last: a clock stepped back makes later records older)
    if (after or referenced > end) and not last_ts and i:   # none before the cut in the segments scanned
        last_ts = _read.scan_segment(segs[i - 1], 0, segs[i - 1].size, False, False, True)[3]
    flushed_offset = checkpoint.flushed_offset
    if flushed_offset is not None:
        flushed_past = end < flushed_offset
    else:
        flushed_past = last_ts < (checkpoint.physic_msg_timestamp if checkpoint.existed else 0)
    rep.cuts_durable_data = (after and (clean or flushed_past)) or referenced > end
    if after or rep.cuts_durable_data:
        why = ("a clean shutdown had flushed" if clean else "the checkpoint counts as flushed"
               ) if rep.cuts_durable_data else "a crash left unflushed (a torn tail)"
        if referenced > end:
            why += (f" (consume queues hold messages up to offset {referenced}; if instead a consume queue "
                    "is damaged, 'rmqstore rebuild --yes STORE' regenerates them)")
        if commitlog.readonly:   # maybe a record a live writer is still copying in
            log.info("read-only open: valid data ends at %d (%s; %s)", end, rep.stop_reason, why)
        elif cut == CUT_NONE or (cut == CUT_TORN and rep.cuts_durable_data):
            raise CorruptRecordError(f"{commitlog.segments.directory}: recovery would cut the commitlog at offset "
                                     f"{end} ({rep.stop_reason}) and discard the data after it, which {why}: "
                                     "nothing was changed. 'rmqstore recover STORE' shows the cut; back the store "
                                     "up, then 'rmqstore recover --yes STORE' makes it", end)
        else:
            log.warning("recovery: %s (%s); truncating", rep.stop_reason, why)
    if not commitlog.readonly:
        if after or rep.cuts_durable_data:   # before: a kill in the cut leaves no time counting what it removed
            _forget_cut(checkpoint, end, last_ts)
        rep.commitlog_bytes_truncated = commitlog.segments.truncate(end)
        if after:   # the probe truncate() makes misses data past a page of zeros
            rep.commitlog_bytes_truncated += _zero_stale_tail(commitlog.segments.find(end), end)
    else:   # what the writer's recovery would cut, reported; the files are left alone
        rep.commitlog_bytes_truncated = commitlog.segments.bytes_after(end)
        commitlog.segments.view_until(end)
    commitlog.segments.flushed_where = end
    rep.seconds = time.monotonic() - t0
    log.info("recovery (%s shutdown): %d segments, %d records verified from %d, end %d, %d bytes truncated, "
             "%.3f s", "clean" if clean else "unclean", rep.segments_scanned, rep.records_verified,
             rep.start_offset, end, rep.commitlog_bytes_truncated, rep.seconds)
    return rep


def _forget_cut(checkpoint, end, newest):
    """Before a cut at ``end``, lower every checkpoint time past ``newest``, the newest
    store time kept, and the flushed offset past ``end``: else the checkpoint counts as
    flushed messages that are gone, and verify reports the repaired store as damaged. A
    lower time only makes recovery start earlier."""
    if checkpoint.forget_cut(end, newest):
        checkpoint.flush()


def _data_after(segs, end):
    """Whether any byte but zero lies at or after commitlog offset ``end`` (holes are skipped)."""
    return any(_stale(seg, max(0, end - seg.base_offset)) for seg in segs if seg.base_offset + seg.size > end)


def _zero_stale_tail(seg, end):
    """Invariant 5: zero-fill ``[end, segment end)`` if anything but zeros is left there;
    returns the bytes zeroed."""
    if seg is None:
        return 0
    pos = end - seg.base_offset
    if not _stale(seg, pos):
        return 0
    log.warning("recovery: stale bytes after commitlog offset %d in %s; zero-filling", end, seg.path)
    seg.zero(pos, seg.size - pos)
    seg.sync_all()
    return seg.size - pos


def _stale(seg, pos):
    """Whether anything but zeros lies in ``[pos, segment end)`` (holes are not read)."""
    return first_nonzero(seg, pos, seg.size) >= 0
