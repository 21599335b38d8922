"""The workload and the comparison peers shared by the suites.

The peers themselves (sqlite3 in WAL mode with batched transactions, LMDB, a pure-Python
struct+mmap writer/reader of the RocketMQ record format) live in ``rmqstore.bench`` so
that the README's job and these suites time the very same code."""
import shutil
import tempfile

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.bench import QUEUES, TAGS, TOPIC, Lmdb, Sqlite, StructMmap, workload

__all__ = ["CONFIG", "COUNTS", "QUEUES", "TOPIC", "Lmdb", "Sqlite", "StructMmap", "StoreCase", "PeerCase"]

CONFIG = StoreConfig(commitlog_file_size=256 << 20, default_queue_nums=QUEUES)
COUNTS = {128: 200_000, 16384: 10_000}   # messages per run by body size (~25-160 MB)


def messages(items):
    return [Message(TOPIC, body, tags=TAGS, keys=key) for key, body in items]


class StoreCase:
    """A fresh store in a temporary directory per repeat; ``fill`` puts the workload."""

    number = 1
    repeat = 3
    warmup_time = 0
    timeout = 300

    def make(self, body_size, fill=False):
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-")
        self.store = MessageStore(self.dir, CONFIG)
        self.msgs = messages(workload(COUNTS[body_size], body_size))
        if fill:
            for i in range(0, len(self.msgs), 1024):
                self.store.put_batch(self.msgs[i:i + 1024])
            self.store.wait_dispatched()

    def teardown(self, *params):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class PeerCase:
    """One peer (``peer`` is its class) in a temporary directory; ``fill`` writes the workload."""

    peer = None
    number = 1
    repeat = 3
    warmup_time = 0
    timeout = 300

    def make(self, body_size, fill=False):
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-peer-")
        self.system = self.peer(self.dir)
        self.data = self.system.prepare(workload(COUNTS[body_size], body_size))
        if fill:
            self.system.write(self.data)

    def teardown(self, *params):
        self.system.close()
        shutil.rmtree(self.dir, ignore_errors=True)
