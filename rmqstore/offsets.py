"""Consumer offsets: ``config/consumerOffset.json`` in RocketMQ's shape, with the previous
version kept in ``consumerOffset.json.bak`` as a broker keeps it."""
import json
import logging
import os
import threading

from rmqstore.errors import CorruptStoreError, InvalidArgumentError, StoreError
from rmqstore.files import make_dirs, parse_json, read_file, write_atomic
from rmqstore.topics import validate_group, validate_topic

log = logging.getLogger(__name__)

_MAX_QUEUE_ID = (1 << 31) - 1
_REPAIR = ("consumer offsets are not in the commitlog and consumerOffset.json.bak cannot stand in: restore "
           "the file from a backup, or move it away to open the store with none committed")
_MAX_OFFSET = (1 << 63) - 1


class _Unparsable(CorruptStoreError):
    """A consumer-offset file whose bytes are not a table of offsets."""

    def __str__(self):
        return f"{super().__str__()}; {_REPAIR}"


class ConsumerOffsets:
    """``{"offsetTable": {"topic@group": {"0": 12, ...}}}``, written atomically (temp file,
    fsync, rename, fsync dir) by ``persist``, which first keeps the version it replaces in
    ``.bak`` (RocketMQ's MixAll.string2File); thread-safe. The file's other members (a
    5.x broker's ``dataVersion`` and ``pullOffsetTable``) are written back as read."""

    def __init__(self, root, file_mode=0o600, dir_mode=0o700):
        self.path = os.path.join(str(root), "config", "consumerOffset.json")
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.table = {}
        self.members = {"offsetTable": None}   # the file's members in order (offsetTable's from ``table``)
        self.dirty = False
        self._saved = None   # the bytes of the last good version read or written: the next .bak
        self._lock = threading.Lock()

    def load(self):
        """Read the file. Anything but ``{"topic@group": {"queueId": offset}}`` with queue
        ids 0..2^31-1 and offsets -1..2^63-1 is unreadable. As RocketMQ's ConfigManager
        does, a missing or unreadable file gives way to ``.bak`` (a broker that stopped
        between its delete and rename leaves only that), logged and rewritten at the next
        persist. An unreadable file with no readable ``.bak``, or a directory, FIFO or link
        in its place, is a CorruptStoreError."""
        try:
            self.table, self.members, self._saved = self._read(self.path)
        except FileNotFoundError:
            self._from_backup(None)
        except _Unparsable as e:
            self._from_backup(e)
        return self

    def _from_backup(self, failure):
        bak = self.path + ".bak"
        try:
            self.table, self.members, self._saved = self._read(bak)
        except FileNotFoundError:
            if failure is not None:
                raise failure from None
            return   # neither file: no offset committed yet
        except CorruptStoreError as e:
            raise (failure or e) from None
        log.warning("%s: %s; consumer offsets read from %s (the version before the last)", self.path,
                    "missing" if failure is None else failure.args[0], bak)
        self.dirty = True

    def _read(self, path):
        """(table, the file's members, the file's bytes) of the file at ``path``.
        FileNotFoundError; _Unparsable for what the bytes hold; CorruptStoreError for what
        is there instead of a file."""
        try:
            raw = read_file(path)
        except FileNotFoundError:
            raise
        except StoreError as e:
            raise CorruptStoreError(f"{e}; {_REPAIR}") from e
        try:
            data = parse_json(raw)
            table = data.get("offsetTable", {}) if isinstance(data, dict) else None
            if not isinstance(table, dict):
                raise _Unparsable(f"{path}: no offsetTable object")
            return {k: self._queue_offsets(path, k, v) for k, v in table.items()}, {**data, "offsetTable": None}, raw
        except (ValueError, UnicodeDecodeError) as e:
            raise _Unparsable(f"{path}: {e}") from None

    @staticmethod
    def _queue_offsets(path, key, queues):
        if not isinstance(queues, dict):
            raise _Unparsable(f"{path}: {key!r} is not an object of queue offsets")
        out = {}
        for q, o in queues.items():
            if not (q.isascii() and q.isdigit() and int(q) <= _MAX_QUEUE_ID):
                raise _Unparsable(f"{path}: {key!r}: queue id {q!r} is not in 0..{_MAX_QUEUE_ID}")
            if type(o) is not int or not -1 <= o <= _MAX_OFFSET:
                raise _Unparsable(f"{path}: {key!r} queue {q}: offset {o!r} is not in -1..{_MAX_OFFSET}")
            out[int(q)] = o
        return out

    def commit(self, group, topic, queue_id, offset, strict=True):
        """Set an offset; what ``load`` would refuse is an InvalidArgumentError, so no
        commit can make the file unreadable: a queue id or offset out of range (an offset
        is 0..2^63-1: -1, which a file may hold, reads as "none committed", so committing
        it would silently forget the group's place; one past the queue's end is taken, as a
        broker takes it, since the queue may grow to it), or an
        empty topic or group or one with ``@`` (``"T@a" + "@b"`` and ``"T" + "@a@b"``
        would share the key ``T@a@b``). ``group`` must be a group name (see
        topics.validate_group), ``topic`` one a store can hold (RocketMQ's rule or not:
        a foreign store's topic may be any)."""
        for name, v in (("group", group), ("topic", topic)):
            if not v or "@" in v:
                raise InvalidArgumentError(f"{name} {v!r} is empty or holds '@', the topic@group separator")
        validate_group(group, strict)
        validate_topic(topic, version=2, strict=False)
        if not 0 <= queue_id <= _MAX_QUEUE_ID:
            raise InvalidArgumentError(f"queue_id {queue_id} is not in 0..{_MAX_QUEUE_ID}")
        if not 0 <= offset <= _MAX_OFFSET:
            raise InvalidArgumentError(f"offset {offset} is not in 0..{_MAX_OFFSET}")
        with self._lock:
            self.table.setdefault(f"{topic}@{group}", {})[int(queue_id)] = int(offset)
            self.dirty = True

    def get(self, group, topic, queue_id):
        return self.table.get(f"{topic}@{group}", {}).get(int(queue_id), -1)

    def persist(self):
        with self._lock:
            if not self.dirty:
                return
            table = {k: {str(q): o for q, o in sorted(v.items())} for k, v in self.table.items()}
            body = {k: table if k == "offsetTable" else v for k, v in self.members.items()}
            self.dirty = False
        data = json.dumps(body, indent=2, ensure_ascii=False).encode()
        try:
            make_dirs(os.path.dirname(self.path), self.dir_mode)
            if self._saved is not None:
                write_atomic(self.path + ".bak", self._saved, self.file_mode)
            write_atomic(self.path, data, self.file_mode)
        except BaseException:
            self.dirty = True   # written at the next persist: a failed write loses no commit
            raise
        self._saved = data
