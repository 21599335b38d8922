"""End-to-end latency across processes, as Chronicle Queue measures it: a writer process
puts at a fixed rate, a reader process follows the store, and each message's latency runs
from the time it was *due* to be sent (carried in its body: no coordinated omission, a
writer that falls behind is charged for it) to the reader's receipt.

The rmqstore reader follows one consume queue as a live consumer does: it maps the queue's
file and the commitlog read-only, waits for the next entry to become valid (its SIZE is
written last) and decodes the record it names, through the store's read kernels (a
read-only MessageStore shows the store as it was when opened). Peers in the same run do the
same through sqlite3 in WAL mode (a commit per message, the reader polling ``id >= ?``) and
LMDB (a transaction per message, a cursor from the next key) when ``lmdb`` is installed.
Both sides busy-wait (the writer for each due time, after a sleep when it is more than
200 µs away; the reader with a 20 µs nap after 200 empty polls), the same for every peer.
Clocks: CLOCK_MONOTONIC, one machine.
"""
import os
import sqlite3
import struct
import subprocess
import sys
import time

import numpy as np

from rmqstore.errors import InvalidArgumentError

TOPIC = "e2e"
HEAD = struct.Struct("<qq")   # message number, due time (monotonic ns)
SPINS = 200                   # empty polls before the reader naps
NAP = 20e-6
NAP_WRITER_NS = 200_000       # a writer this far before a due time sleeps (less the timer's slack) first
WARMUP = 0.05                 # the first 5% of messages are not counted
PEERS = ("rmqstore", "sqlite3 WAL", "LMDB")


def _payload(i, due, size):
    return HEAD.pack(i, due) + b"x" * (size - HEAD.size)


def _paced(count, rate):
    """(i, due) for each message; returns once each is due (sleeping while the wait is
    longer than NAP_WRITER, then busy-waiting)."""
    clock, period = time.monotonic_ns, 1e9 / rate
    t0 = clock() + 20_000_000
    for i in range(count):
        due = t0 + int(i * period)
        nap = due - clock() - NAP_WRITER_NS   # read once: a second read may already be past due
        if nap > 0:
            time.sleep(nap / 1e9)
        while clock() < due:
            pass
        yield i, due


# -- writers --------------------------------------------------------------------------------
def _store_config(count, size):
    from rmqstore import StoreConfig
    return StoreConfig(commitlog_file_size=max(1 << 26, 2 * count * (size + 256)),
                       consume_queue_entries=max(1 << 16, count + 16), default_queue_nums=1)


def write_rmqstore(path, count, rate, size):
    from rmqstore import Message, MessageStore
    with MessageStore(path, _store_config(count, size)) as s:
        put = s.put
        for i, due in _paced(count, rate):
            put(Message(TOPIC, _payload(i, due, size)), queue_id=0)
        s.wait_dispatched()


def write_sqlite(path, count, rate, size):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE IF NOT EXISTS m (id INTEGER PRIMARY KEY, body BLOB)")
    ins = "INSERT INTO m (id, body) VALUES (?, ?)"
    for i, due in _paced(count, rate):
        db.execute(ins, (i, _payload(i, due, size)))
    db.close()


def _lmdb_map_size(count, size):
    return max(1 << 28, 4 * count * (size + 64))


def write_lmdb(path, count, rate, size):
    import lmdb
    env = lmdb.open(path, map_size=_lmdb_map_size(count, size), sync=False, metasync=False)
    for i, due in _paced(count, rate):
        with env.begin(write=True) as txn:
            txn.put(i.to_bytes(8, "big"), _payload(i, due, size))
    env.close()


# -- readers: each returns the latencies (ns) of messages 0..count-1 --------------------------
def _wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.001)


def _follow(poll, count):
    """Call ``poll(n)`` (the bodies of the messages from number n on, maybe none) until
    ``count`` arrived; latency of each = receipt - its due time."""
    out = np.empty(count, np.int64)
    n = idle = 0
    clock = time.monotonic_ns
    while n < count:
        bodies = poll(n)
        if not bodies:
            idle += 1
            if idle > SPINS:
                time.sleep(NAP)
            continue
        idle = 0
        now = clock()
        for b in bodies:
            i, due = HEAD.unpack_from(b)
            if i != n:
                raise RuntimeError(f"message {i} arrived where {n} was due")
            out[i] = now - due
            n += 1
    return out


def read_rmqstore(path, count, size):
    from rmqstore import _cq, _read
    from rmqstore._segment import MappedSegment
    cfg = _store_config(count, size)
    cq_path = os.path.join(path, "consumequeue", TOPIC, "0", "0" * 20)
    cl_path = os.path.join(path, "commitlog", "0" * 20)
    _wait_for(cq_path)
    while os.path.getsize(cq_path) < cfg.consume_queue_entries * 20:
        time.sleep(0.001)
    cq = MappedSegment(cq_path, 0, cfg.consume_queue_entries * 20, readonly=True)
    cl = MappedSegment(cl_path, 0, cfg.commitlog_file_size, readonly=True)
    limit = cq.size

    def poll(n):
        end, _ = _cq.valid_end(cq, n * 20, limit, -1, False)
        k = (end - n * 20) // 20
        if not k:
            return ()
        entries = _cq.read_entries(cq, n * 20, k)
        return [_read.decode_record(cl, int(phy), cl.size).body for phy in entries["phy_offset"].tolist()]
    return _follow(poll, count)


def read_sqlite(path, count, size):
    _wait_for(path)
    db = sqlite3.connect(path, isolation_level=None)
    while True:
        try:
            db.execute("SELECT 1 FROM m LIMIT 1")
            break
        except sqlite3.OperationalError:
            time.sleep(0.001)
    q = "SELECT body FROM m WHERE id >= ? ORDER BY id"
    return _follow(lambda n: [r[0] for r in db.execute(q, (n,))], count)


def read_lmdb(path, count, size):
    import lmdb
    _wait_for(os.path.join(path, "data.mdb"))
    env = lmdb.open(path, map_size=_lmdb_map_size(count, size), readonly=True, lock=True, max_readers=8)

    def poll(n):
        with env.begin() as txn:
            cur = txn.cursor()
            if not cur.set_range(n.to_bytes(8, "big")):
                return ()
            return [bytes(v) for v in cur.iternext(keys=False)]
    return _follow(poll, count)


ROLES = {"rmqstore": (write_rmqstore, read_rmqstore), "sqlite3 WAL": (write_sqlite, read_sqlite),
         "LMDB": (write_lmdb, read_lmdb)}


def percentiles(ns):
    a = np.asarray(ns, np.float64)[int(len(ns) * WARMUP):] / 1000.0
    p = np.percentile(a, [50, 99, 99.9, 99.99])
    return {"p50": p[0], "p99": p[1], "p99.9": p[2], "p99.99": p[3], "max": float(a.max()), "calls": len(a)}


def run_one(peer, directory, rate, size, seconds):
    """One writer and one reader process for ``peer``; the reader's percentiles (µs)."""
    count = max(100, int(rate * seconds))
    path = os.path.join(directory, f"{peer.split()[0].lower()}-{rate}-{size}")
    out = path + ".npy"
    cmd = [sys.executable, "-m", "rmqstore.end_to_end"]
    args = [peer, path, str(count), str(rate), str(size)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    reader = subprocess.Popen(cmd + ["read", *args, out], env=env)
    try:
        subprocess.run(cmd + ["write", *args], env=env, check=True, timeout=seconds * 10 + 120)
        reader.wait(timeout=seconds * 10 + 120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    if reader.returncode:
        raise RuntimeError(f"end-to-end reader of {peer} exited with {reader.returncode}")
    return percentiles(np.load(out))


def peers():
    """The peers available here (LMDB when the lmdb package is installed)."""
    try:
        import lmdb  # noqa: F401
    except ImportError:
        return PEERS[:2]
    return PEERS


def run(directory, rates=(10_000, 100_000), sizes=(60, 1024), seconds=1.0):
    """Rows ``end to end, <rate>, <size>`` (and the peers' ``..., <peer>``) of percentiles."""
    if seconds <= 0 or any(r <= 0 for r in rates) or any(s < HEAD.size for s in sizes):
        raise InvalidArgumentError(f"end to end needs rates > 0, sizes >= {HEAD.size} and seconds > 0")
    results = {}
    for rate in rates:
        for size in sizes:
            for peer in peers():
                name = f"end to end, {rate // 1000}k/s, {size} B" + ("" if peer == "rmqstore" else f", {peer}")
                results[name] = run_one(peer, directory, rate, size, seconds)
    return results


def main(argv):
    """``python -m rmqstore.end_to_end read|write PEER PATH COUNT RATE SIZE [OUT]`` (run's roles)."""
    role, peer, path, count, rate, size = argv[:6]
    write, read = ROLES[peer]
    if role == "write":
        write(path, int(count), int(rate), int(size))
    else:
        np.save(argv[6], read(path, int(count), int(size)))


if __name__ == "__main__":
    main(sys.argv[1:])
