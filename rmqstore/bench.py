"""The standard workload, timed against peers in the same run.

Workload (issues 2 and 3): ``messages`` messages of ``body_size`` bytes to topic ``bench``,
8 queues round robin, one key each, tags ``TagA``, async flush; then every queue read back
with ``get_messages(max_count=32)`` and the whole log scanned in commitlog order; then
``LOOKUPS`` random keys (at most one per message) looked up, one call per key (``query_by_key``: the messages back)
and in one ``query_keys`` call, and in one ``query_keys_columns`` call (the messages as numpy
columns). The peers do the same work with what they have: sqlite3
(WAL, batched transactions, a (queue, offset) primary key paged ``ORDER BY qoff LIMIT 32``;
an index on the key column, built untimed, for lookups), LMDB if installed (one key per
(queue, offset), cursor reads; lookups go key -> (queue, offset) in a second database,
built untimed, -> record) and a pure-Python struct+mmap writer/reader of the RocketMQ
record format (no per-queue index: it only writes and scans).

Between writing and reading, each system makes what it wrote durable its own way, untimed
(rmqstore flush, sqlite3 wal_checkpoint, LMDB sync, msync), so the reads time reading data
at rest. Without it, rmqstore's flusher cleans the pages just written while get_messages
runs (an msync write-protects each page, with a TLB shootdown the reading thread takes),
and the first pass reads at about half its rate (300k messages: 2.4-2.9M msg/s, against
4.2-4.6M after a flush or a 2 s pause).

``python -m rmqstore.bench [--dir D] [--messages N] [--body-size B] [--batch K]``
"""
import argparse
import mmap
import os
import random
import shutil
import sqlite3
import struct
import sys
import tempfile
import time
import zlib

from rmqstore import Message, MessageStore, StoreConfig

TOPIC = "bench"
QUEUES = 8
TAGS = "TagA"
PAGE = 32
LOOKUPS = 100_000       # keys looked up, drawn at random from the workload's


def workload(messages, body_size, seed=0, pool=256):
    """(key, body) pairs: unique keys, bodies drawn from a fixed pool of random bytes."""
    rnd = random.Random(seed)
    bodies = [rnd.randbytes(body_size) for _ in range(min(pool, messages) or 1)]
    return [(f"key-{i}", bodies[i % len(bodies)]) for i in range(messages)]


def lookup_keys(items, n=LOOKUPS, seed=1):
    """``n`` keys of the workload ``items`` drawn at random (with repeats)."""
    rnd = random.Random(seed)
    return [items[rnd.randrange(len(items))][0] for _ in range(n)] if items else []


class Rmqstore:
    """rmqstore itself: put (or put_batch of ``batch``), get_messages per queue, scan."""

    name = "rmqstore"

    def __init__(self, directory, batch=0, config=None):
        self.batch = batch
        self.labels = {"write": f"put_batch({batch})" if batch else "put", "dispatch": "dispatch catch-up",
                       "read": "get_messages/32", "scan": "scan", "lookup": "query_by_key",
                       "lookup_batch": "query_keys", "lookup_columns": "query_keys_columns"}
        self.store = MessageStore(directory, (config or StoreConfig()).with_(default_queue_nums=QUEUES))

    def prepare(self, items):
        return [Message(TOPIC, body, tags=TAGS, keys=key) for key, body in items]

    def write(self, msgs):
        if self.batch:
            put_batch = self.store.put_batch
            for i in range(0, len(msgs), self.batch):
                put_batch(msgs[i:i + self.batch])
        else:
            put = self.store.put
            for m in msgs:
                put(m)

    def dispatch(self):
        """Wait until the consume queues hold everything put: (messages dispatched while
        waiting, lag in bytes when it began). Only those count: dispatch that kept up
        during the puts is not timed here (asv's consume_queue.CatchUp times a whole backlog)."""
        s = self.store
        lag = s.dispatch_lag
        before = sum(s.max_offset(TOPIC, q) for q in range(QUEUES))
        s.wait_dispatched()
        return sum(s.max_offset(TOPIC, q) for q in range(QUEUES)) - before, lag

    def settle(self):
        self.store.flush()

    def read(self):
        s = self.store
        n = nbytes = 0
        for q in range(QUEUES):
            offset = 0
            while True:
                r = s.get_messages(TOPIC, q, offset, PAGE)
                if not r.messages:
                    break
                for m in r.messages:
                    nbytes += len(m.body)
                n += len(r.messages)
                offset = r.next_offset
        return n, nbytes

    def scan(self):
        n = nbytes = 0
        for m in self.store.scan():
            n += 1
            nbytes += len(m.body)
        return n, nbytes

    def prepare_lookup(self, keys):
        """The keys made afresh, as the LMDB peer's are (it encodes them to bytes): the
        workload's own str objects lie scattered among the messages, a cache miss a key
        that has nothing to do with the store (about 200 ns of a 1.1 us lookup here)."""
        return [k.encode().decode() for k in keys]

    def lookup(self, keys):
        """query_by_key per key: (lookups, body bytes of the messages found)."""
        q, nbytes = self.store.query_by_key, 0
        for k in keys:
            for m in q(TOPIC, k):
                nbytes += len(m.body)
        return len(keys), nbytes

    def lookup_batch(self, keys):
        """One query_keys call for all the keys."""
        return len(keys), sum(len(m.body) for found in self.store.query_keys(TOPIC, keys) for m in found)

    def lookup_columns(self, keys):
        """One query_keys_columns call for all the keys."""
        cols = self.store.query_keys_columns(TOPIC, keys)
        return len(keys), len(cols["body_data"])

    def close(self):
        self.store.close()


class Sqlite:
    """sqlite3 in WAL mode (synchronous=NORMAL, like async flush), one row per message
    keyed by (queue id, queue offset), a transaction per ``commit_every`` rows."""

    name = "sqlite3"
    labels = {"write": "insert, txn/1000", "read": "LIMIT 32 paging", "scan": "select all",
              "lookup": "WHERE keys = ?"}

    def __init__(self, directory, batch=0, commit_every=1000):
        os.makedirs(directory, exist_ok=True)
        self.db = sqlite3.connect(os.path.join(directory, "bench.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS msg (qid INTEGER, qoff INTEGER, ts INTEGER, tags TEXT,"
                        " keys TEXT, body BLOB, PRIMARY KEY (qid, qoff)) WITHOUT ROWID")
        self.commit_every = batch or commit_every
        self.next = [0] * QUEUES

    def prepare(self, items):
        return items

    def write(self, items):
        db, nxt, sql = self.db, self.next, "INSERT INTO msg VALUES (?, ?, ?, ?, ?, ?)"
        for i in range(0, len(items), self.commit_every):
            ts = time.time_ns() // 1_000_000
            rows = []
            for j, (key, body) in enumerate(items[i:i + self.commit_every], i):
                q = j % QUEUES
                rows.append((q, nxt[q], ts, TAGS, key, body))
                nxt[q] += 1
            db.execute("BEGIN")
            db.executemany(sql, rows)
            db.execute("COMMIT")

    def read(self):
        n = nbytes = 0
        sql = "SELECT qoff, keys, tags, body FROM msg WHERE qid = ? AND qoff >= ? ORDER BY qoff LIMIT ?"
        for q in range(QUEUES):
            offset = 0
            while True:
                rows = self.db.execute(sql, (q, offset, PAGE)).fetchall()
                if not rows:
                    break
                n += len(rows)
                nbytes += sum(len(r[3]) for r in rows)
                offset = rows[-1][0] + 1
        return n, nbytes

    def scan(self):
        n = nbytes = 0
        for (body,) in self.db.execute("SELECT body FROM msg"):
            n += 1
            nbytes += len(body)
        return n, nbytes

    def prepare_lookup(self, keys):
        self.db.execute("CREATE INDEX IF NOT EXISTS msg_keys ON msg (keys)")
        return keys

    def lookup(self, keys):
        n, nbytes, cur = 0, 0, self.db.cursor()
        for k in keys:
            for (body,) in cur.execute("SELECT body FROM msg WHERE keys = ?", (k,)).fetchall():
                nbytes += len(body)
            n += 1
        return n, nbytes

    def settle(self):
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self):
        self.db.close()


class Lmdb:
    """LMDB (py-lmdb), no fsync per commit (like async flush): key = big-endian (queue id,
    queue offset), value = store time, keys, tags, body; a transaction per ``commit_every``."""

    name = "lmdb"
    labels = {"write": "put, txn/1000", "read": "cursor", "scan": "cursor", "lookup": "key->offset->record"}
    _HEAD = struct.Struct(">qHH")
    _WHERE = struct.Struct(">iq")

    def __init__(self, directory, batch=0, commit_every=1000, map_size=8 << 30):
        import lmdb
        self.env = lmdb.open(directory, map_size=map_size, sync=False, metasync=False, writemap=True)
        self.directory, self.key_env = directory, None
        self.commit_every = batch or commit_every
        self.next = [0] * QUEUES

    def prepare(self, items):
        return [(key.encode(), body) for key, body in items]

    def write(self, items):
        nxt, head, tags = self.next, self._HEAD.pack, TAGS.encode()
        for i in range(0, len(items), self.commit_every):
            ts = time.time_ns() // 1_000_000
            with self.env.begin(write=True) as txn:
                put = txn.put
                for j, (key, body) in enumerate(items[i:i + self.commit_every], i):
                    q = j % QUEUES
                    put(self._WHERE.pack(q, nxt[q]), head(ts, len(key), len(tags)) + key + tags + body, append=False)
                    nxt[q] += 1

    def _values(self, txn, start=None):
        cur = txn.cursor()
        if start is not None:
            cur.set_range(start)
        return cur.iternext(keys=True, values=True)

    def read(self):
        n = nbytes = 0
        skip = self._HEAD.size
        with self.env.begin(buffers=False) as txn:
            for _key, value in self._values(txn):
                h = self._HEAD.unpack_from(value)
                nbytes += len(value) - skip - h[1] - h[2]
                n += 1
        return n, nbytes

    scan = read   # keys sort by (queue, offset): one cursor pass reads every queue in order

    def prepare_lookup(self, keys):
        """A key -> (queue, offset) environment beside, from the records (untimed); the keys as bytes."""
        import lmdb
        self.key_env = lmdb.open(os.path.join(self.directory, "keys"), map_size=1 << 30, sync=False,
                                 metasync=False, writemap=True)
        skip = self._HEAD.size
        with self.env.begin() as txn, self.key_env.begin(write=True) as ktxn:
            for where, value in txn.cursor():
                h = self._HEAD.unpack_from(value)
                ktxn.put(value[skip:skip + h[1]], where)
        return [k.encode() for k in keys]

    def lookup(self, keys):
        n = nbytes = 0
        skip, unpack = self._HEAD.size, self._HEAD.unpack_from
        with self.env.begin(buffers=False) as txn, self.key_env.begin(buffers=False) as ktxn:
            get, kget = txn.get, ktxn.get
            for k in keys:
                where = kget(k)
                if where is not None:
                    value = get(where)
                    h = unpack(value)
                    nbytes += len(value) - skip - h[1] - h[2]
                n += 1
        return n, nbytes

    def settle(self):
        self.env.sync(True)

    def close(self):
        if self.key_env is not None:
            self.key_env.close()
        self.env.close()


class StructMmap:
    """A pure-Python writer/reader of RocketMQ v1 records (struct + mmap + zlib.crc32) in
    one pre-sized file: the same bytes rmqstore writes, without the Cython kernels."""

    name = "struct+mmap"
    labels = {"write": "pack_into", "scan": "unpack_from"}
    _HEAD = struct.Struct(">iiiiiqqiq8sq8siqi")   # through BODYLEN; hosts as 4-byte IP + port
    _MAGIC = -626843481

    def __init__(self, directory, batch=0, size=None):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "00000000000000000000")
        self.size = size
        self.map = None
        self.pos = 0
        self.next = [0] * QUEUES
        self.host = bytes([127, 0, 0, 1]) + (10911).to_bytes(4, "big")

    def prepare(self, items):
        if self.map is None:
            need = sum(self._HEAD.size + len(b) + 3 + len(TOPIC) + 32 + len(k) for k, b in items) + 8
            with open(self.path, "wb") as f:
                f.truncate(self.size or need)
            self._f = open(self.path, "r+b")
            self.map = mmap.mmap(self._f.fileno(), 0)
        return [(f"TAGS\x01{TAGS}\x02KEYS\x01{k}".encode(), b) for k, b in items]

    def write(self, items):
        m, head, pack, crc, nxt = self.map, self._HEAD, self._HEAD.pack_into, zlib.crc32, self.next
        topic = TOPIC.encode()
        tail = struct.Struct(f">B{len(topic)}sh")
        pos, hs = self.pos, head.size
        ts = time.time_ns() // 1_000_000
        for j, (props, body) in enumerate(items):
            q = j % QUEUES
            total = hs + len(body) + tail.size + len(props)
            pack(m, pos, total, self._MAGIC, crc(body) & 0x7FFFFFFF, q, 0, nxt[q], pos, 0, ts,
                 self.host, ts, self.host, 0, 0, len(body))
            p = pos + hs
            m[p:p + len(body)] = body
            p += len(body)
            tail.pack_into(m, p, len(topic), topic, len(props))
            p += tail.size
            m[p:p + len(props)] = props
            nxt[q] += 1
            pos += total
        self.pos = pos

    read = None   # no per-queue index

    def scan(self):
        m, unpack, n, nbytes, pos = self.map, self._HEAD.unpack_from, 0, 0, 0
        hs = self._HEAD.size
        while pos + 8 <= len(m):
            rec = unpack(m, pos)
            if rec[0] == 0:
                break
            body = m[pos + hs:pos + hs + rec[-1]]
            n += 1
            nbytes += len(body)
            pos += rec[0]
        return n, nbytes

    def settle(self):
        self.map.flush()

    def close(self):
        if self.map is not None:
            self.map.flush()
            self.map.close()
            self._f.close()


def systems():
    """The systems compared: rmqstore first, then the peers that can run here."""
    out = [Rmqstore, Sqlite, StructMmap]
    try:
        import lmdb  # noqa: F401
        out.insert(2, Lmdb)
    except ImportError:
        print("bench: LMDB left out (py-lmdb is not installed; pip install 'rmqstore[bench]' brings it)",
              file=sys.stderr)
    return out


def run(directory=None, messages=1_000_000, body_size=128, batch=0, peers=True, config=None, out=print):
    """Run the workload on rmqstore (with ``config``, default: RocketMQ's defaults and 8
    queues) and the peers in a new directory inside ``directory`` (default: the system's
    temporary directory), removed afterwards: nothing already in ``directory`` is touched.
    Returns rows (system, kind, label, count, seconds, body_bytes) where kind
    is "write", "dispatch" (rmqstore: waiting for the consume queues after the last put;
    count is then the messages still to dispatch and body_bytes the lag in bytes), "read" (every queue, pages of 32),
    "scan", "lookup" (LOOKUPS keys, one call each), "lookup_batch" or "lookup_columns" (the
    same in one call; count is then keys, not messages)."""
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="rmqstore-bench-", dir=directory)
    items = workload(messages, body_size)
    rows = []
    try:
        for cls in systems() if peers else [Rmqstore]:
            path = os.path.join(directory, cls.name.replace("+", "-"))
            system = cls(path, batch=batch, config=config) if cls is Rmqstore else cls(path, batch=batch)
            try:
                data = system.prepare(items)
                t = time.perf_counter()
                system.write(data)
                rows.append((cls.name, "write", system.labels["write"], messages, time.perf_counter() - t,
                             messages * body_size))
                del data
                for kind in ("dispatch", "settle", "read", "scan"):
                    fn = getattr(system, kind, None)
                    if fn is None:
                        continue
                    t = time.perf_counter()
                    if kind == "settle":   # untimed: see the module doc
                        fn()
                        continue
                    n, nbytes = fn()
                    rows.append((cls.name, kind, system.labels[kind], n, time.perf_counter() - t, nbytes))
                if hasattr(system, "prepare_lookup"):
                    keys = system.prepare_lookup(lookup_keys(items, min(LOOKUPS, messages)))
                    for kind in ("lookup", "lookup_batch", "lookup_columns"):
                        if hasattr(system, kind):
                            t = time.perf_counter()
                            n, nbytes = getattr(system, kind)(keys)
                            rows.append((cls.name, kind, system.labels[kind], n, time.perf_counter() - t, nbytes))
            finally:
                system.close()
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if out is not None:
        out(format_table(rows, messages, body_size))
    return rows


def format_table(rows, messages, body_size):
    """The rows as a text table; the last column is how many times faster rmqstore is."""
    ours = {kind: n / sec for name, kind, _, n, sec, _ in rows if name == Rmqstore.name and sec > 0}
    lines = [f"{messages:,} messages x {body_size} B, topic {TOPIC!r}, {QUEUES} queues, tags {TAGS}",
             f"{'system':<12} {'operation':<18} {'count':>10} {'seconds':>8} {'msg/s':>12} {'body MB/s':>9}"
             f" {'rmqstore x':>10}"]
    for name, kind, label, n, sec, nbytes in rows:
        sec = max(sec, 1e-9)
        ratio = f"{ours[kind] / (n / sec):.1f}" if name != Rmqstore.name and kind in ours else ""
        lines.append(f"{name:<12} {label:<18} {n:>10,} {sec:>8.2f} {n / sec:>12,.0f} {nbytes / sec / 1e6:>9.1f}"
                     f" {ratio:>10}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m rmqstore.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="where to make the work directory, removed afterwards (default: "
                   "the system's temporary directory)")
    p.add_argument("--messages", type=int, default=1_000_000, metavar="N", help="messages to put (1000000)")
    p.add_argument("--body-size", type=int, default=128, metavar="BYTES", help="body size (128)")
    p.add_argument("--batch", type=int, default=0, help="put_batch of this many (0: put in a loop)")
    p.add_argument("--no-peers", action="store_true", help="time rmqstore only")
    a = p.parse_args(argv)
    run(a.dir, a.messages, a.body_size, a.batch, peers=not a.no_peers)


if __name__ == "__main__":
    main()
