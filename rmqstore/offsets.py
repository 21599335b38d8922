"""Consumer offsets: ``config/consumerOffset.json`` in RocketMQ's shape."""
import json
import os
import threading

from rmqstore.errors import CorruptStoreError
from rmqstore.files import make_dirs, write_atomic


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
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return self
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptStoreError(f"{self.path}: {e}") from None
        table = data.get("offsetTable", {}) if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise CorruptStoreError(f"{self.path}: no offsetTable object")
        self.table = {k: {int(q): int(o) for q, o in v.items()} for k, v in table.items()}
        return self

    def commit(self, group, topic, queue_id, offset):
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
