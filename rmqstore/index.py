"""IndexService: RocketMQ's IndexFiles (key -> commitlog offsets), built by dispatch."""
import bisect
import errno
import itertools
import logging
import os
import struct
import threading
import time

import numpy as np

import rmqstore._index as _index
import rmqstore._index_file as _index_file
from rmqstore._segment import MappedSegment
from rmqstore.errors import CorruptStoreError, InvalidArgumentError, StoreClosedError
from rmqstore.files import file_size, list_dir, make_dirs, open_reader

log = logging.getLogger(__name__)
LONG_MAX = (1 << 63) - 1


def file_name(ms):
    """``yyyyMMddHHmmssSSS`` in local time, as RocketMQ's UtilAll.timeMillisToHumanString."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


def name_ms(name):
    """The latest time in ms that file_name turns into ``name`` (local time: a wall-clock
    hour that comes twice is taken the second time); 0 for a name of another form."""
    try:
        fields = time.strptime(name[:14], "%Y%m%d%H%M%S")
        ms = int(name[14:]) if len(name) == 17 else -1
    except ValueError:
        return 0
    if ms < 0:
        return 0
    times = [int(time.mktime(fields[:8] + (dst,))) * 1000 + ms for dst in (0, 1)]
    return max([t for t in times if file_name(t) == name] or [0])


GEOMETRY_SAMPLE = 4096   # slot heads checked against their entries when a geometry is inferred


def detect_geometry(path, size, slots, entries, unconfirmed_ok=False):
    """(slots, entries) of an index file. The file does not record its geometry (the
    header's hashSlotCount counts used slots), and every size fits many: the configured
    one is taken when the size fits it (the caller's word, RocketMQ's defaults unless told
    otherwise). Else RocketMQ's 1:4 slots-to-entries ratio is taken only when the file's
    contents confirm it: its entries read at that geometry must be what the slots say (each
    head's key hash in its slot, links back in range). Nothing is guessed: where the
    contents cannot tell (no entries yet) or deny it, CorruptStoreError (a DerivedFileError
    once the open adds how to rebuild) names the reading that fits and the options that
    choose one (97 slots / 4,000 entries is as long as 957 / 3,828, and reading one as the
    other loses keys). ``unconfirmed_ok``: a file with no
    entries may take the 1:4 reading (a rebuild, which writes every file anew, keeps the
    shape of one emptied)."""
    if size == _index_file.file_size(slots, entries):
        return slots, entries
    if size > 40 and (size - 40) % 84 == 0:
        s = (size - 40) // 84
        why = _contents_deny(path, s, 4 * s)
        if why is None or (unconfirmed_ok and why is NO_ENTRIES):
            return s, 4 * s
        raise CorruptStoreError(f"{path}: {size} bytes is not the configured {slots} slots / {entries} entries; "
                               f"it fits {s} slots / {4 * s} entries (RocketMQ's 1:4), but {why}. Pass the "
                               "geometry the store was made with: StoreConfig(index_slots=..., index_entries=...), "
                               "or rmqstore --index-slots N --index-entries N (any N, M with "
                               f"40 + 4*N + 20*M = {size})")
    raise CorruptStoreError(f"{path}: {size} bytes fits neither {slots} slots / {entries} entries "
                           "nor a 1:4 slots-to-entries geometry (a store made with other index_slots / "
                           "index_entries needs them given: StoreConfig, or rmqstore --index-slots N "
                           "--index-entries N)")


NO_ENTRIES = "it holds no entry that could confirm it"


def _contents_deny(path, slots, entries):
    """Why index file ``path`` does not read as ``slots`` / ``entries`` (None when its
    entries agree with its slots: of up to GEOMETRY_SAMPLE slot heads, most must point at
    an entry whose key hash belongs to that slot, with its link back in range; a few that
    do not are damage, which verify reports, not another geometry)."""
    try:
        with open_reader(path) as f:
            head = f.read(40)
            count = int.from_bytes(head[36:40], "big", signed=True) if len(head) == 40 else 0
            if count <= 1:
                return NO_ENTRIES
            f.seek(40)
            heads = np.frombuffer(f.read(4 * slots), ">i4")
            used = np.flatnonzero(heads)
            if not len(used):
                return NO_ENTRIES
            sample = used[np.linspace(0, len(used) - 1, min(len(used), GEOMETRY_SAMPLE)).astype(np.int64)].tolist()
            bad, first = 0, None
            for s in sample:
                i = int(heads[s])
                ok = 0 < i < min(count, entries)
                if ok:
                    f.seek(40 + 4 * slots + 20 * i)
                    key_hash, _, _, prev = struct.unpack(">iqii", f.read(20))
                    ok = key_hash >= 0 and key_hash % slots == s and 0 <= prev < i
                if not ok:
                    bad += 1
                    first = first if first is not None else (s, i)
            if 2 * bad > len(sample):
                return f"{bad} of {len(sample)} slots checked then point at entries of other slots (slot " \
                       f"{first[0]} at entry {first[1]})"
    except OSError:
        return None   # opening it names the error
    return None


def _being_changed(error, path, newest):
    """Whether a read-only open met an index file a live writer is removing or creating:
    gone since the listing, or the newest one still empty (its size is reserved in one step)."""
    if isinstance(error, OSError):
        return error.errno == errno.ENOENT
    try:
        return newest and file_size(path) == 0
    except OSError as e:
        return e.errno == errno.ENOENT


class IndexFile:
    """One mapped index file and its geometry (see _index_file for the byte layout)."""

    __slots__ = ("seg", "slots", "entries", "synced")

    def __init__(self, seg, slots, entries):
        self.seg = seg
        self.slots = slots
        self.entries = entries
        self.synced = -1          # indexCount at the last msync

    @property
    def header(self):
        return _index_file.read_header(self.seg)

    @property
    def count(self):
        return _index_file.read_header(self.seg)[5]

    @property
    def full(self):
        return self.count >= self.entries


PAGE_STEPS = 1 << 16   # index entries one query_page looks at, at most (colliding keys' among them)


class IndexService:
    """The ``index/`` directory: IndexFiles named by creation time, oldest first.

    Layout: ``index/{yyyyMMddHHmmssSSS}``, each 40 + 4·slots + 20·entries bytes (header,
    hash slots, entries; details in _index_file). Keys are ``topic#UNIQ_KEY`` and
    ``topic#token`` for every non-empty space-separated KEYS token; a full file rolls to a
    new one whose header continues from the last file's end.

    Thread-safety: one writer (the dispatch thread) appends and rolls; queries run on an
    immutable snapshot of the files (``IndexFiles``) swapped in on roll/delete, lock-free.
    ``flush`` may run on another thread.

    Crash behaviour: ``flush`` msyncs every file written since the last flush, then sets
    the checkpoint's ``indexMsgTimestamp`` to the store time of the last dispatched message
    it captured beforehand, so every entry of a message stored before that time is durable.
    After an unclean shutdown ``load`` keeps, per file, the longest sane prefix of entries
    stored a second before that time (and below the recovered commitlog end), repoints the
    slots into it and deletes files left empty; ``resume_offset`` tells dispatch where to
    start again so the cut entries are rebuilt (re-dispatching indexed messages is a no-op).
    """

    def __init__(self, root, config, checkpoint, readonly=False):
        self.directory = os.path.join(str(root), "index")
        self.config = config
        self.checkpoint = checkpoint
        self.readonly = readonly
        self.files = []
        self.view = _index.IndexFiles([])
        self.resume_offset = None
        self.entries_dropped = 0
        self.native = None         # the native dispatch loop, while it runs (it keeps last_ts then)
        self._last_ts = 0          # store time of the last message dispatched (dispatch thread)
        self._flush_lock = threading.Lock()
        self._closed = False

    # -- loading and recovery -------------------------------------------------------------
    def load(self, clean_shutdown, commitlog_end):
        """Map every index file; unless read-only, cut entries at or past ``commitlog_end``
        and, after an unclean shutdown, entries newer than the checkpoint allows."""
        cfg = self.config
        names = sorted(n for n in list_dir(self.directory) if n.isascii() and n.isdigit())
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                slots, entries = detect_geometry(path, file_size(path), cfg.index_slots, cfg.index_entries)
                seg = MappedSegment(path, 0, _index_file.file_size(slots, entries), readonly=self.readonly,
                                    ahead=cfg.logics_reserve_ahead())
            except (OSError, CorruptStoreError) as e:
                if not self.readonly and name == names[-1] and isinstance(e, CorruptStoreError) and not file_size(path):
                    os.unlink(path)   # a kill between creating it and sizing it (ftruncate): nothing in it
                    continue
                if self.readonly and _being_changed(e, path, name == names[-1]):
                    continue   # a live writer's retention removed it, or it is creating it
                raise
            self.files.append(IndexFile(seg, slots, entries))
        ts_limit = LONG_MAX if clean_shutdown else self.checkpoint.index_msg_timestamp - 1000
        self._cut(commitlog_end, ts_limit, not clean_shutdown, dry_run=self.readonly)
        self._publish()
        return self

    def _cut(self, phy_end, ts_limit, crashed, dry_run=False):
        """Truncate the first file with entries past ``phy_end`` or ``ts_limit``, delete the
        files after it; after a crash (``crashed``) the newest file at least, whose header a
        kill may have left behind its slots (a slot pointing at the entry not yet counted,
        the last entry's offset not yet in the header). ``dry_run`` (a read-only open)
        changes nothing and only counts ``entries_dropped``, as a writer's open would."""
        for i, f in enumerate(self.files):
            _, end_ts, _, end_phy, _, count = f.header
            if end_phy < phy_end and end_ts <= ts_limit and count <= f.entries and \
                    not (crashed and f is self.files[-1]):
                continue
            kept, dropped = _index_file.truncate_entries(f.seg, f.slots, f.entries, phy_end, ts_limit, dry_run)
            self.entries_dropped += dropped
            gone = self.files[i + (kept > 1 or i == 0):]
            self.entries_dropped += sum(max(0, g.count - 1) for g in gone if g is not f)
            if dry_run:
                return
            if kept == 1 and i == 0:   # nothing left: back to a fresh file, re-dispatch everything
                _index_file.write_header(f.seg, 0, 0, 0, 0, 0, 1)
            for g in gone:
                g.seg.close()
                os.unlink(g.seg.path)
            self.files = self.files[:len(self.files) - len(gone)]
            for g in self.files[i:]:
                g.seg.sync_all()
            last = self.files[-1].header if self.files else None
            self.resume_offset = last[3] if last else 0
            since = "any store time (the checkpoint counts none flushed)" if ts_limit < 0 else \
                "no store time" if ts_limit == LONG_MAX else f"store time {ts_limit} ms"
            log.log(logging.WARNING if self.entries_dropped else logging.INFO,
                    "index: cut %d entries at commitlog offset %d or after %s; re-dispatch from %d",
                    self.entries_dropped, phy_end, since, self.resume_offset)
            return

    @property
    def last_ts(self):
        """Newest store time of the messages dispatched to the index."""
        n = self.native
        return self._last_ts if n is None else max(self._last_ts, n.index_timestamp)

    @last_ts.setter
    def last_ts(self, value):
        self._last_ts = value

    def _publish(self):
        self.view = _index.IndexFiles([(f.seg, f.slots, f.entries) for f in reversed(self.files)])

    # -- building -------------------------------------------------------------------------
    def _new_file(self):
        cfg = self.config
        slots, entries = (self.files[-1].slots, self.files[-1].entries) if self.files else \
            (cfg.index_slots, cfg.index_entries)
        make_dirs(self.directory, cfg.dir_mode)
        ms = time.time_ns() // 1_000_000
        if self.files:   # a clock set back: start past the last file's name, not from now by 1 ms steps
            ms = max(ms, name_ms(os.path.basename(self.files[-1].seg.path)) + 1)
        while True:
            path = os.path.join(self.directory, file_name(ms))
            if not os.path.exists(path) and (not self.files or path > self.files[-1].seg.path):
                break
            ms += 1
        ahead = cfg.logics_reserve_ahead()   # the header and slots now, entries as they come
        seg = MappedSegment(path, 0, _index_file.file_size(slots, entries), create=True, mode=cfg.file_mode,
                            reserve=_index_file.file_size(slots, 0) + ahead if ahead else -1, ahead=ahead)
        if self.files:   # continue from the last file (RocketMQ: only positive values)
            _, end_ts, _, end_phy, _, _ = self.files[-1].header
            _index_file.write_header(seg, max(end_ts, 0), max(end_ts, 0), max(end_phy, 0), max(end_phy, 0), 0, 1)
        else:
            _index_file.write_header(seg, 0, 0, 0, 0, 0, 1)
        f = IndexFile(seg, slots, entries)
        self.files = self.files + [f]
        self._publish()
        return f

    def dispatch(self, batch):
        """CommitLogDispatcherBuildIndex for one DispatchBatch. Messages at or before the
        last indexed commitlog offset are skipped, so re-dispatch never duplicates."""
        if self._closed:
            raise StoreClosedError(f"{self.directory}: index is closed")
        rows = batch.rows
        if not len(rows):
            return
        if self.files:
            _, _, _, end_phy, _, count = self.files[-1].header
            indexed = count > 1 or len(self.files) > 1
            # bisect, not np.searchsorted: that copies the strided column, handing the GIL off
            cut = bisect.bisect_right if indexed else bisect.bisect_left
            rows = rows[cut(rows["phy_offset"], end_phy):]
        hashes, phys, tss, newest = _index_file.extract_keys(batch.raw, rows)
        i, n, stepped_back = 0, len(hashes), False
        while i < n:
            f = self.files[-1] if self.files and not self.files[-1].full and not stepped_back else self._new_file()
            i = _index_file.put_entries(f.seg, f.slots, f.entries, hashes, phys, tss, i)
            stepped_back = i < n and not f.full   # a key stored before the file began: a new file begins at it
        if len(rows):
            self.last_ts = max(self.last_ts, newest)

    # -- durability -----------------------------------------------------------------------
    def flush(self, least_pages=0):
        """msync the files written since the last flush (when at least ``least_pages``
        pages of entries are new, or always with 0) and advance indexMsgTimestamp."""
        if self.readonly or self._closed:
            return
        with self._flush_lock:
            ts = self.last_ts
            files = self.files
            todo = []
            new_entries = 0
            for f in reversed(files):
                c = f.count
                if c == f.synced:
                    break
                todo.append((f, c))
                new_entries += c - max(f.synced, 1)
            if least_pages > 0 and todo and new_entries * 20 < least_pages * 4096:
                return
            for f, c in todo:
                f.seg.sync_all()
                f.synced = c
            if ts > self.checkpoint.index_msg_timestamp:
                self.checkpoint.index_msg_timestamp = ts

    # -- queries --------------------------------------------------------------------------
    def query_offsets(self, topic, key, max_num=64, begin=0, end=None):
        """IndexService.queryOffset, sorted ascending (DefaultMessageStore.queryMessage)."""
        self._check_open()
        return self.view.query(topic, key, max_num, begin, end, self.config.max_msgs_num_batch)

    def query_page(self, topic, key, max_num=64, begin=0, end=None, resume=None):
        """query_offsets a page at a time, newest first: (offsets, the token the next page
        resumes from, or None after the last). A token is ``FILE.ENTRY``: an index file's
        name and the chain entry in it to go on from; it stays valid while that file is
        kept (appends after it do not move it)."""
        self._check_open()
        view = self.view
        names = [os.path.basename(p) for p in view.paths()]
        file_no, entry = 0, 0
        if resume is not None:
            name, _, number = str(resume).partition(".")
            if not (name in names and number.isascii() and number.isdigit() and len(number) <= 10
                    and int(number) < 1 << 31):
                raise InvalidArgumentError(f"not a resume token of this index (FILE.ENTRY, the file kept): {resume!r}")
            file_no, entry = names.index(name), int(number)
        offsets, file_no, entry = view.walk_page(topic, key, file_no, entry, max_num, begin, end, PAGE_STEPS,
                                                 self.config.max_msgs_num_batch)
        return offsets, None if file_no < 0 else f"{names[file_no]}.{entry}"

    def _check_open(self):
        if self._closed:
            raise StoreClosedError(f"{self.directory}: index is closed")

    # -- retention and lifecycle ----------------------------------------------------------
    def delete_expired(self, min_phy_offset):
        """Delete the oldest files whose every entry points below ``min_phy_offset``
        (never the newest file); returns how many."""
        old = []
        for f in self.files[:-1]:
            if f.header[3] >= min_phy_offset:
                break
            old.append(f)
        if old:
            self.files = self.files[len(old):]
            self._publish()
            for f in old:
                f.seg.close()
                if not self.readonly:
                    os.unlink(f.seg.path)
        return len(old)

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Unmap every file (queries in flight finish first). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.view = _index.IndexFiles([])
        for f in self.files:
            f.seg.close()


class UniqKeyGenerator:
    """RocketMQ-style unique keys (MessageClientIDSetter) for messages put without one:
    32 upper-case hex digits = IPv4 (4 bytes) · pid (2) · a random per-store value (4) ·
    ms since the start of the current month (4) · counter (2). Thread-safe."""

    def __init__(self, packed_host):
        addr = packed_host[:-4][-4:]
        self._prefix = (addr + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)).hex().upper()
        self._counter = itertools.count()
        self._month = (0, -1)      # (start ms of the month, start ms of the next)

    def _month_bounds(self, now_ms):
        t = time.localtime(now_ms // 1000)
        start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)
        y, m = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        return start, int(time.mktime((y, m, 1, 0, 0, 0, 0, 0, -1)) * 1000)

    def __call__(self):
        now = time.time_ns() // 1_000_000
        start, nxt = self._month
        if not start <= now < nxt:
            self._month = (start, nxt) = self._month_bounds(now)
        return f"{self._prefix}{(now - start) & 0xFFFFFFFF:08X}{next(self._counter) & 0xFFFF:04X}"

    def stamp(self, msg):
        """Give ``msg`` a UNIQ_KEY property unless it has a non-empty one (as a producer does)."""
        if not msg.properties.get("UNIQ_KEY"):
            msg.properties["UNIQ_KEY"] = self()
