"""Key lookups on an indexed store: query_by_key one call per key, query_keys and query_keys_columns in one call,
query_offsets (RocketMQ's hash-only answer), and index build with put; peers in the same
run: sqlite3 with an indexed key column, LMDB key -> commitlog offset."""
import random
import shutil
import sqlite3
import tempfile

from rmqstore import Message, MessageStore, StoreConfig

TOPIC = "orders"
CONFIG = StoreConfig(commitlog_file_size=256 << 20, index_slots=500_000, index_entries=2_000_000)
LOOKUPS = 20_000


def _keys(n):
    return [f"key-{i}" for i in range(n)]


def _probes(n, seed=0):
    rng = random.Random(seed)
    return [f"key-{rng.randrange(n)}" for _ in range(LOOKUPS)]


class _Case:
    params = [[200_000]]
    param_names = ["messages"]
    number = 1
    repeat = 3
    warmup_time = 0
    timeout = 300

    def teardown(self, n):
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class StoreQuery(_Case):
    """rmqstore: the workload put in batches and dispatched into the index."""

    def setup(self, n):
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-idx-")
        self.store = MessageStore(self.dir, CONFIG)
        msgs = [Message(TOPIC, b"x" * 128, keys=k) for k in _keys(n)]
        for i in range(0, n, 1024):
            self.store.put_batch(msgs[i:i + 1024])
        self.store.wait_dispatched()
        self.probes = _probes(n)

    def close(self):
        self.store.close()

    def time_query_by_key(self, n):
        q = self.store.query_by_key
        for k in self.probes:
            q(TOPIC, k)

    def time_query_offsets(self, n):
        q = self.store.query_offsets
        for k in self.probes:
            q(TOPIC, k)

    def time_query_keys(self, n):
        self.store.query_keys(TOPIC, self.probes)

    def time_query_keys_columns(self, n):
        self.store.query_keys_columns(TOPIC, self.probes)


class StoreIndexBuild(_Case):
    """put_batch + dispatch with the index on, and off: the index must keep up with put."""
    params = [[200_000], [True, False]]
    param_names = ["messages", "index"]

    def setup(self, n, index):
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-idxb-")
        self.store = MessageStore(self.dir, CONFIG.with_(message_index_enable=index))
        self.msgs = [Message(TOPIC, b"x" * 128, keys=k) for k in _keys(n)]

    def close(self):
        self.store.close()

    def teardown(self, n, index):
        super().teardown(n)

    def time_put_and_index(self, n, index):
        for i in range(0, n, 1024):
            self.store.put_batch(self.msgs[i:i + 1024])
        self.store.wait_dispatched()


class SqliteQuery(_Case):
    """sqlite3: (key TEXT, off INTEGER) with an index on key; one SELECT per key."""

    def setup(self, n):
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-idx-sqlite-")
        self.db = sqlite3.connect(f"{self.dir}/k.db")
        self.db.execute("CREATE TABLE k (key TEXT, off INTEGER)")
        self.db.executemany("INSERT INTO k VALUES (?, ?)", ((f"{TOPIC}#{k}", i * 200) for i, k in enumerate(_keys(n))))
        self.db.execute("CREATE INDEX k_key ON k (key)")
        self.db.commit()
        self.probes = [f"{TOPIC}#{k}" for k in _probes(n)]

    def close(self):
        self.db.close()

    def time_query_by_key(self, n):
        cur = self.db.cursor()
        for k in self.probes:
            cur.execute("SELECT off FROM k WHERE key = ?", (k,)).fetchall()


class LmdbQuery(_Case):
    """LMDB: key -> 8-byte offset; one get per key in a read transaction."""

    def setup(self, n):
        import lmdb
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-idx-lmdb-")
        self.env = lmdb.open(self.dir, map_size=1 << 30)
        with self.env.begin(write=True) as txn:
            for i, k in enumerate(_keys(n)):
                txn.put(f"{TOPIC}#{k}".encode(), (i * 200).to_bytes(8, "big"))
        self.probes = [f"{TOPIC}#{k}" for k in _probes(n)]

    def close(self):
        self.env.close()

    def time_query_by_key(self, n):
        with self.env.begin() as txn:
            get = txn.get
            for k in self.probes:
                get(k.encode())
