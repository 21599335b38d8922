"""The ``checkpoint`` file: the store times up to which each structure is durable."""
import logging
import struct

from rmqstore.errors import CorruptStoreError, StoreIOError
from rmqstore.files import open_reader, write_atomic

log = logging.getLogger(__name__)
PAGE = 4096
_FIELDS = struct.Struct(">qqqqq")
_OURS = struct.Struct(">qq")   # @40 flushedPhyOffset, @48 flushedStamp
MAX_TIMESTAMP = 1 << 52   # ms: year 144,683; anything later (or negative) is not a store time


class Checkpoint:
    """One 4 KiB page, big-endian::

        @0  physicMsgTimestamp   i64   store time of the last flushed commitlog message
        @8  logicsMsgTimestamp   i64   ... of the last flushed consume-queue entry
        @16 indexMsgTimestamp    i64   ... of the last flushed index entry
        @24 masterFlushedOffset  i64   (5.x)
        @32 confirmPhyOffset     i64   (5.x)
        @40 flushedPhyOffset     i64   (rmqstore) commitlog offset flushed when @0 was set
        @48 flushedStamp         i64   (rmqstore) the @0 value @40 belongs to
        rest zero

    RocketMQ reads only @0..@40 and writes its fields in place, so a broker that writes
    the page after us leaves @40 stale: @40 counts only while @48 still equals @0
    (``flushed_offset``). Recovery decides what is durable by that offset, not by store
    times, which need not grow along the log (a clock stepped back).

    Written whole to a temp file, fsynced, renamed over the old one, then the directory
    fsynced, so a crash leaves either the old or the new page. Not thread-safe: the
    flush service is its one writer.
    """

    def __init__(self, path, file_mode=0o600):
        self.path = str(path)
        self.file_mode = file_mode
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0
        self.flushed_phy_offset = 0   # see flushed_offset
        self._flushed_stamp = -1
        self.existed = False
        self.rejected = {}   # as_dict() name -> the out-of-range value the file held
        self.short = None    # the length of a page cut short (read as zeros)

    def load(self):
        """Read the page. A timestamp outside 0..MAX_TIMESTAMP, or a page too short to
        hold the three, cannot be trusted, so it reads as 0, which makes recovery check
        everything from the first segment."""
        try:
            with open_reader(self.path) as f:
                data = f.read(PAGE)   # the page; anything after it is not read
        except FileNotFoundError:
            return self
        except StoreIOError as e:   # a directory, FIFO or link in its place
            raise CorruptStoreError(f"{e}; the checkpoint only tells recovery where to start: remove it and "
                                    "recovery checks the commitlog from its first segment") from e
        if len(data) < 24:   # cut short: no time in it can be trusted (RocketMQ maps it as zeros)
            log.warning("%s: %d bytes, not a %d-byte page: recovering from the start", self.path, len(data), PAGE)
            self.short, data = len(data), b""
        data = data.ljust(56, b"\0")
        fields = list(_FIELDS.unpack_from(data))
        self.flushed_phy_offset, self._flushed_stamp = _OURS.unpack_from(data, 40)
        for i, name in enumerate(("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp")):
            if not 0 <= fields[i] <= MAX_TIMESTAMP:
                log.warning("%s: %s is %d, out of range: recovering from the start", self.path, name, fields[i])
                self.rejected[name], fields[i] = fields[i], 0
        (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
         self.master_flushed_offset, self.confirm_phy_offset) = fields
        self.existed = True
        return self

    @property
    def flushed_offset(self):
        """The commitlog offset before which every byte was flushed when the checkpoint was
        written, by our writer; None where the page does not say (a RocketMQ store, or a
        broker wrote the page after us)."""
        if not self.existed or self.flushed_phy_offset <= 0 or self._flushed_stamp != self.physic_msg_timestamp:
            return None
        return self.flushed_phy_offset

    def note_flushed(self, ts, offset):
        """The commitlog is flushed up to ``offset``; ``ts`` is the store time of a message
        before it (0: none). physicMsgTimestamp never goes back (RocketMQ's max)."""
        if ts:
            self.physic_msg_timestamp = max(self.physic_msg_timestamp, ts)
        self.flushed_phy_offset = max(self.flushed_phy_offset if self.flushed_offset else 0, offset)
        self._flushed_stamp = self.physic_msg_timestamp

    def forget_cut(self, offset, newest):
        """Before a cut at commitlog ``offset``: no time past ``newest`` (the newest store
        time kept) and no offset past ``offset`` stays counted as flushed; returns whether
        anything changed (then the caller flushes the page)."""
        known = self.flushed_offset
        names = ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp")
        changed = any(getattr(self, n) > newest for n in names) or (known or 0) > offset
        for n in names:
            setattr(self, n, min(getattr(self, n), newest))
        if known:
            self.flushed_phy_offset, self._flushed_stamp = min(known, offset), self.physic_msg_timestamp
        return changed

    @property
    def min_timestamp(self):
        """The oldest of the three times: recovery restarts from the segment holding it
        (RocketMQ CheckPoint.getMinTimestamp, less 3 s of clock slack)."""
        m = min(self.physic_msg_timestamp, self.logics_msg_timestamp)
        return max(0, m - 3000)

    @property
    def min_timestamp_index(self):
        return min(self.min_timestamp, self.index_msg_timestamp)

    def to_bytes(self):
        head = _FIELDS.pack(self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
                            self.master_flushed_offset, self.confirm_phy_offset)
        if self.flushed_offset:
            head += _OURS.pack(self.flushed_phy_offset, self._flushed_stamp)
        return head.ljust(PAGE, b"\0")

    def flush(self):
        write_atomic(self.path, self.to_bytes(), self.file_mode)
        self.short, self.rejected = None, {}   # what load found wrong is no longer in the file

    def as_dict(self):
        return {"physicMsgTimestamp": self.physic_msg_timestamp, "logicsMsgTimestamp": self.logics_msg_timestamp,
                "indexMsgTimestamp": self.index_msg_timestamp, "masterFlushedOffset": self.master_flushed_offset,
                "confirmPhyOffset": self.confirm_phy_offset}
