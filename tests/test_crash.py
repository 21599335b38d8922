"""Crash tests: a writer subprocess (put, put_batch and put_columns) is SIGKILLed at random
points (often mid-rollover of a tiny commitlog segment or consume-queue file); on reopen
every acknowledged message is present and byte-identical, nothing else appears
half-written, and the consume queues agree with the commitlog."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import rmqstore
from rmqstore import MessageStore, StoreConfig

from conftest import SMALL_INDEX

TOPICS = ("CrashA", "CrashB")

WRITER = r"""
import random, sys
from rmqstore import Message, MessageStore, StoreConfig
path, mode, trial, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
cfg = StoreConfig(commitlog_file_size=4096, consume_queue_entries=4, flush_mode=mode, warm_mapped_file=warm,
                  flush_interval_ms=5, flush_cq_interval_ms=5, index_slots=1000, index_entries=4000)
def body(i):
    r = random.Random(trial * 1_000_003 + i)
    return b"%d:%d:" % (trial, i) + r.randbytes(r.randrange(600))
out = sys.stdout
s = MessageStore(path, cfg)
out.write("R\n"); out.flush()
i = 0
while True:
    if i % 11 == 4:     # columns: no msgId comes back
        batch = [i, i + 1, i + 2, i + 3]
        acks = [(int(p), "-") for p in s.put_columns("CrashA", [body(j) for j in batch])["phy_offset"]]
    else:
        batch = [i] if i % 5 else [i, i + 1, i + 2]
        msgs = [Message("CrashA" if j % 3 else "CrashB", body(j)) for j in batch]
        res = s.put_batch(msgs) if len(batch) > 1 else [s.put(msgs[0])]
        acks = [(r.phy_offset, r.msg_id) for r in res]
    for j, (phy, msg_id) in zip(batch, acks):
        out.write(f"A {j} {phy} {msg_id}\n")
    i += len(batch)
    if mode == "async" and i % 7 < len(batch):
        s.flush()
        out.write(f"F {i}\n")
    out.flush()
"""


def _body(trial, i):
    r = random.Random(trial * 1_000_003 + i)
    return b"%d:%d:" % (trial, i) + r.randbytes(r.randrange(600))


def _run_and_kill(path, mode, trial, rng):
    """Start a writer, SIGKILL it at a random point; returns its ack lines."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
    warm = rng.random() < 0.5
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), mode, str(trial), "1" if warm else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    lines = []
    try:
        assert proc.stdout.readline() == "R\n", proc.stderr.read()
        for _ in range(rng.randrange(120)):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            lines.append(line)
        time.sleep(rng.random() * 0.004)
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += [x + "\n" for x in rest.split("\n")[:-1]]   # a last line without "\n" was never acked
    return lines


def _verify(path, acked, durable):
    """``acked``: {(trial, i): (phy, msg_id)} that must survive; ``durable`` the same kind."""
    with MessageStore(path, StoreConfig(flush_mode="sync", **SMALL_INDEX)) as s:
        msgs = {m.phy_offset: m for m in s.scan(check_crc=True)}
        for m in msgs.values():     # nothing but complete, known messages
            trial, i = map(int, bytes(m.body).split(b":", 2)[:2])
            assert bytes(m.body) == _body(trial, i), (trial, i)
        for (trial, i), (phy, msg_id) in durable.items():
            m = msgs.get(phy)
            assert m is not None, f"acknowledged message {trial}:{i} at {phy} lost ({s.recovery})"
            assert (m.msg_id if msg_id != "-" else "-", bytes(m.body)) == (msg_id, _body(trial, i))
        per_queue = {}
        for m in msgs.values():
            per_queue.setdefault((m.topic, m.queue_id), []).append(m)
        assert set(per_queue) <= set(s.consume_queues.queues)
        for (topic, q), ms in per_queue.items():
            ms.sort(key=lambda m: m.phy_offset)
            assert [m.queue_offset for m in ms] == list(range(len(ms))), (topic, q)   # contiguous
            entries = s.consume_queue_entries(topic, q)
            assert [(int(e["phy_offset"]), int(e["size"])) for e in entries] == \
                [(m.phy_offset, m.store_size) for m in ms], (topic, q)
        return len(msgs), s.recovery


def _crash_loop(path, mode, trials, seed):
    rng = random.Random(seed)
    acked, durable = {}, {}
    stored = 0
    for trial in range(trials):
        pending = {}
        for line in _run_and_kill(path, mode, trial, rng):
            kind, *f = line.split()
            if kind == "A":
                pending[(trial, int(f[0]))] = (int(f[1]), f[2])
            elif kind == "F":
                durable.update({k: v for k, v in pending.items() if k[1] < int(f[0])})
        acked.update(pending)
        if mode == "sync":
            durable.update(pending)
        stored, rep = _verify(path, acked, durable)
        assert not rep.clean_shutdown
    assert stored >= len(durable) > trials
    return stored


def test_sync_flush_kills(tmp_path):
    _crash_loop(tmp_path / "store", "sync", 14, seed=1)


def test_async_flush_kills(tmp_path):
    _crash_loop(tmp_path / "store", "async", 6, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_sync_flush_kills_many(tmp_path, seed):
    _crash_loop(tmp_path / "store", "sync", 50, seed=100 + seed)


@pytest.mark.slow
def test_async_flush_kills_many(tmp_path):
    _crash_loop(tmp_path / "store", "async", 50, seed=200)


TORN_WRITER = r"""
import sys
from rmqstore import Message, MessageStore, StoreConfig
path, trial, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
s = MessageStore(path, StoreConfig(commitlog_file_size=1 << 20, warm_mapped_file=warm, flush_mode="async",
                                   index_slots=1000, index_entries=4000))
def props(g):
    return {"P": f"{trial}:{g}:".ljust(30000, "x")}
sys.stdout.write("R\n"); sys.stdout.flush()
i = 0
while True:
    if i % 3 == 0:
        s.put(Message("T", b"%d:%d" % (trial, i), properties=props(i)))
        n = 1
    elif i % 3 == 1:
        n = 3
        s.put_batch([Message("T", b"%d:%d" % (trial, j), properties=props(j)) for j in range(i, i + n)])
    else:   # over 256 KiB: encoded in a buffer, then one pwrite (warm_mapped_file off)
        n = 12
        s.put_columns("T", [b"%d:%d" % (trial, j) for j in range(i, i + n)], properties=props(i))
    i += n
    sys.stdout.write(f"A {i}\n"); sys.stdout.flush()
"""


def test_a_kill_mid_record_leaves_no_torn_record(tmp_path):
    """Records of 30 KB of properties, written by put (in place), put_batch and a bulk
    put_columns (one pwrite), SIGKILLed at random points: after recovery every record is
    whole. A record's TOTALSIZE went first: killed while its properties were copied (or in
    the middle of the pwrite), it stayed with zeros in them, its body CRC good, and
    recovery took it as a message. TOTALSIZE now goes last."""
    _torn_record_kills(tmp_path / "store", 10, seed=7)


@pytest.mark.slow
def test_many_kills_mid_record_leave_no_torn_record(tmp_path):
    _torn_record_kills(tmp_path / "store", 50, seed=8)


def _torn_record_kills(path, trials, seed):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
    rng = random.Random(seed)
    seen = 0
    for trial in range(trials):
        proc = subprocess.Popen([sys.executable, "-c", TORN_WRITER, str(path), str(trial), str(trial % 2)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        try:
            assert proc.stdout.readline() == "R\n", proc.stderr.read()
            for _ in range(rng.randrange(1, 30)):
                assert proc.stdout.readline(), proc.stderr.read()
            time.sleep(rng.random() * 0.002)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with MessageStore(path, StoreConfig(**SMALL_INDEX)) as s:
            msgs = list(s.scan(check_crc=True))
            for m in msgs:
                t, i = map(int, bytes(m.body).split(b":"))
                t2, g, pad = m.properties["P"].split(":")
                assert (int(t2), pad) == (t, "x" * len(pad)) and 0 <= i - int(g) < 12, (t, i)
                assert len(m.properties["P"]) == 30000, (t, i)
        assert len(msgs) > seen
        seen = len(msgs)
