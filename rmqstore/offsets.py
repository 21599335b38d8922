"""Consumer offsets: ``config/consumerOffset.json`` in RocketMQ's shape."""
import json
import os
import threading

from rmqstore.errors import CorruptStoreError, InvalidArgumentError, StoreError
from rmqstore.files import make_dirs, parse_json, read_file, write_atomic
from rmqstore.topics import validate_group, validate_topic

_MAX_QUEUE_ID = (1 << 31) - 1
_REPAIR = ("consumer offsets are not in the commitlog: restore the file from a backup (a broker keeps "
           "consumerOffset.json.bak beside it), or move it away to open the store with none committed")
_MAX_OFFSET = (1 << 63) - 1


class ConsumerOffsets:
    """``{"offsetTable": {"topic@group": {"0": 12, ...}}}``, written atomically (temp file,
    fsync, rename, fsync dir) by ``persist``; thread-safe."""

    def __init__(self, root, file_mode=0o600, dir_mode=0o700):
        self.path = os.path.join(str(root), "config", "consumerOffset.json")
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.table = {}
        self.dirty = False
        self._lock = threading.Lock()

    def load(self):
        """Read the file; anything but ``{"topic@group": {"queueId": offset}}`` with queue
        ids 0..2^31-1 and offsets -1..2^63-1 is a CorruptStoreError."""
        try:
            data = parse_json(read_file(self.path))
            table = data.get("offsetTable", {}) if isinstance(data, dict) else None
            if not isinstance(table, dict):
                raise CorruptStoreError(f"{self.path}: no offsetTable object")
            self.table = {k: self._queue_offsets(k, v) for k, v in table.items()}
        except FileNotFoundError:
            return self
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptStoreError(f"{self.path}: {e}; {_REPAIR}") from None
        except StoreError as e:   # the checks above, or a directory, FIFO or link in its place
            raise CorruptStoreError(f"{e}; {_REPAIR}") from e
        return self

    def _queue_offsets(self, key, queues):
        if not isinstance(queues, dict):
            raise CorruptStoreError(f"{self.path}: {key!r} is not an object of queue offsets")
        out = {}
        for q, o in queues.items():
            if not (q.isascii() and q.isdigit() and int(q) <= _MAX_QUEUE_ID):
                raise CorruptStoreError(f"{self.path}: {key!r}: queue id {q!r} is not in 0..{_MAX_QUEUE_ID}")
            if type(o) is not int or not -1 <= o <= _MAX_OFFSET:
                raise CorruptStoreError(f"{self.path}: {key!r} queue {q}: offset {o!r} is not in -1..{_MAX_OFFSET}")
            out[int(q)] = o
        return out

    def commit(self, group, topic, queue_id, offset, strict=True):
        """Set an offset; what ``load`` would refuse is an InvalidArgumentError, so no
        commit can make the file unreadable: a queue id or offset out of range, or an
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
        if not -1 <= offset <= _MAX_OFFSET:
            raise InvalidArgumentError(f"offset {offset} is not in -1..{_MAX_OFFSET}")
        with self._lock:
            self.table.setdefault(f"{topic}@{group}", {})[int(queue_id)] = int(offset)
            self.dirty = True

    def get(self, group, topic, queue_id):
        return self.table.get(f"{topic}@{group}", {}).get(int(queue_id), -1)

    def persist(self):
        with self._lock:
            if not self.dirty:
                return
            body = {"offsetTable": {k: {str(q): o for q, o in sorted(v.items())} for k, v in self.table.items()}}
            self.dirty = False
        make_dirs(os.path.dirname(self.path), self.dir_mode)
        write_atomic(self.path, json.dumps(body, indent=2, ensure_ascii=False).encode(), self.file_mode)
