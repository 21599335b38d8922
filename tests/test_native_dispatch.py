"""The native dispatch loop (rmqstore/_reput.pyx, docs/dispatch.md): the consume queues and
index it builds, against the reference codec's reading of the commitlog; steady-state
dispatch without the GIL; its thread joined on close and absent in a forked child."""
import errno
import gc
import os
import random
import subprocess
import sys
import time

import pytest

from rmqstore import Message, MessageStore, StoreConfig

import reference_codec as ref

TRANSACTIONS = [0, 0, 0, 0x4, 0xC, 0x8]   # NOT_TYPE, PREPARED, ROLLBACK, COMMIT


def _config(**kw):
    base = dict(commitlog_file_size=256 * 1024, consume_queue_entries=64, index_slots=32, index_entries=200,
                default_queue_nums=4)
    base.update(kw)
    return StoreConfig(**base)


def _put_mixed(store, n, rnd, start=0):
    for i in range(start, start + n):
        topic = f"T{rnd.randrange(6)}"
        keys = [f"k{i}", f"shared{i % 13}"] if rnd.random() < 0.7 else None
        delay = rnd.randrange(1, 20) if rnd.random() < 0.08 else None
        m = Message(topic, os.urandom(rnd.randrange(0, 400)), tags=f"tag{i % 5}" if i % 4 else None, keys=keys,
                    sys_flag=rnd.choice(TRANSACTIONS), delay_level=delay)
        store.put(m, queue_id=rnd.randrange(4))


def _expected(store_dir, delays):
    """Per queue, [(queue offset, phy, size, tags code)] the commitlog's records call for, and
    per (topic, key), the commitlog offsets of the records that carry it, from the reference
    codec alone."""
    queues, keys = {}, {}
    for r in ref.iter_commitlog(store_dir):
        tran = r["sys_flag"] & 0xC
        props = r["properties"]
        if tran not in (0x4, 0xC):
            tags = r["tags_code"]
            level = props.get("DELAY")
            if r["topic"] == "SCHEDULE_TOPIC_XXXX" and level and level.isdigit() and int(level) > 0:
                tags = r["store_timestamp"] + delays[min(int(level), len(delays)) - 1]
            queues.setdefault((r["topic"], r["queue_id"]), []).append(
                (r["queue_offset"], r["phy_offset"], r["store_size"], tags))
        if tran != 0xC:
            words = ([props["UNIQ_KEY"]] if props.get("UNIQ_KEY") else []) + \
                [w for w in props.get("KEYS", "").split(" ") if w]
            for w in words:
                keys.setdefault((r["topic"], w), []).append(r["phy_offset"])
    return queues, keys


def _assert_built_as_expected(store, path):
    queues, keys = _expected(str(path), store.config.delay_levels_ms())
    assert len(queues) > 20 and ("SCHEDULE_TOPIC_XXXX", 0) in [(t, 0) for t, _ in queues]
    for (topic, qid), want in queues.items():
        assert ref.read_cq_entries(str(path), topic, qid) == want, (topic, qid)
    cq_dir = path / "consumequeue"
    on_disk = {(t, q) for t in os.listdir(cq_dir) for q in map(int, os.listdir(cq_dir / t))}
    assert on_disk == set(queues)
    for (topic, key), phys in keys.items():
        assert store.query_offsets(topic, key, max_num=1000) == phys, (topic, key)
    assert sum(f.count - 1 for f in store.index.files) == sum(len(v) for v in keys.values())
    assert len(store.index.files) > 2


def test_native_loop_builds_the_queues_and_index_the_reference_reads(tmp_path):
    """Many topics and queues, keys, tags, delay levels, PREPARED / ROLLBACK / COMMIT
    messages, consume-queue, index and commitlog files rolled over: every queue holds
    exactly the entries the commitlog's records call for (PREPARED and ROLLBACK none,
    delayed ones their delivery time), every key finds exactly its records."""
    rnd = random.Random(7)
    path = tmp_path / "s"
    with MessageStore(path, _config()) as s:
        assert s.dispatcher.native
        _put_mixed(s, 400, rnd)
        s.wait_dispatched()
        _put_mixed(s, 2500, rnd, 400)
        assert s.wait_dispatched(timeout=60)
        assert s.dispatcher.native
        _assert_built_as_expected(s, path)


def test_native_loop_after_reopen_skips_what_the_queues_hold(tmp_path):
    """Reopened after a kill (no clean shutdown), dispatch starts again behind what the
    queues and index hold; the native loop skips every entry already there by commitlog
    offset, so no queue and no key gets one twice."""
    path = tmp_path / "s"
    child = (f"import random, os, sys; sys.path[:0] = {[os.path.dirname(__file__)]!r}\n"
             "from test_native_dispatch import _config, _put_mixed\n"
             "from rmqstore import MessageStore\n"
             f"s = MessageStore({str(path)!r}, _config())\n"
             "_put_mixed(s, 1500, random.Random(3))\n"
             "s.wait_dispatched(); s.flush()\n"
             "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", child], check=True, timeout=120)
    with MessageStore(path, _config()) as s:
        assert not s.clean_shutdown
        _put_mixed(s, 800, random.Random(4), 1500)
        assert s.wait_dispatched(timeout=60)
        _assert_built_as_expected(s, path)


def _put_holding_the_gil(store, messages, seconds):
    """Put ``messages`` round-robin over queues 0..3 of their topic, then busy-wait until
    dispatch reaches the end, the GIL held throughout (switch interval 1000 s, no call that
    releases it): a Python thread cannot move meanwhile. Returns the position reached and
    the end."""
    d = store.dispatcher
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    try:
        for i, m in enumerate(messages):
            store.put(m, queue_id=i % 4)
        target = store.max_phy_offset
        deadline = time.perf_counter() + seconds
        while d.reput_from < target and time.perf_counter() < deadline:
            pass
        return d.reput_from, target
    finally:
        sys.setswitchinterval(old)


def _warm(store):
    """A first message in each of queues 0..3 of topic G: their files are made."""
    for q in range(4):
        store.put(Message("G", b"x", keys=f"warm{q}"), queue_id=q)
    store.wait_dispatched()


def test_steady_state_dispatch_takes_no_gil(tmp_path):
    """Once its queues and files are known, the native loop dispatches while one Python
    thread holds the GIL throughout. A Python reput thread cannot move then."""
    path = tmp_path / "s"
    with MessageStore(path, _config(commitlog_file_size=64 << 20, consume_queue_entries=100_000,
                                    index_entries=100_000, reserve_ahead_bytes=0)) as s:
        _warm(s)
        msgs = [Message("G", b"y" * 100, keys=f"k{i}", tags="t") for i in range(2000)]
        reached, target = _put_holding_the_gil(s, msgs, 5)
        assert reached == target
        assert [s.max_offset("G", q) for q in range(4)] == [501] * 4
        assert s.query_offsets("G", "k1999") == [s.get_messages("G", 3, 500, 1).messages[0].phy_offset]


def test_rolls_and_allocation_take_no_gil(tmp_path):
    """The loop follows the writer into each commitlog segment it rolls to (offered at the
    roll) and allocates the blocks of its consume-queue and index files as they fill
    (``reserve_ahead_bytes``), all while one Python thread holds the GIL throughout: no
    request waits for the Python helper."""
    path = tmp_path / "s"
    with MessageStore(path, _config(commitlog_file_size=256 << 10, consume_queue_entries=100_000,
                                    index_entries=100_000, reserve_ahead_bytes=64 << 10)) as s:
        _warm(s)
        d = s.dispatcher
        requests, segments = d._native.requests, len(s.commitlog.segments.segments)
        cq_blocks = [s.consume_queues.queues[("G", q)].segments.last.reserved for q in range(4)]
        msgs = [Message("G", b"y" * 200, keys=f"k{i}") for i in range(8000)]
        reached, target = _put_holding_the_gil(s, msgs, 10)
        assert reached == target
        assert len(s.commitlog.segments.segments) - segments >= 5   # rolled into five new segments or more
        assert d._native.requests == requests
        assert [s.max_offset("G", q) for q in range(4)] == [2001] * 4
        grown = [s.consume_queues.queues[("G", q)].segments.last.reserved for q in range(4)]
        assert all(g >= 2001 * 20 > c for g, c in zip(grown, cq_blocks, strict=True))
        assert s.query_offsets("G", "k7999") == [s.get_messages("G", 3, 2000, 1).messages[0].phy_offset]


def test_failed_allocation_in_the_loop_loses_nothing(tmp_path):
    """A consume-queue file's blocks that the loop fails to allocate (ENOSPC once) leave the
    record to the Python path, which allocates them again: every entry is there, once."""
    from rmqstore._segment import inject_fault
    path = tmp_path / "s"
    with MessageStore(path, _config(consume_queue_entries=100_000, reserve_ahead_bytes=64 << 10)) as s:
        s.put(Message("G", b"x"), queue_id=0)
        s.wait_dispatched()
        inject_fault("fallocate", 1, errno.ENOSPC, "/consumequeue/")
        try:
            for i in range(1000):
                s.put(Message("G", b"y%d" % i), queue_id=0)
            assert s.wait_dispatched(timeout=30)
        finally:
            inject_fault("fallocate", 0, errno.ENOSPC)
        got = [m for start in range(0, 1001, 32) for m in s.get_messages("G", 0, start, 32).messages]
        assert [m.body for m in got] == [b"x"] + [b"y%d" % i for i in range(1000)]
        assert [m.queue_offset for m in got] == list(range(1001))


def _threads_named(name):
    out = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                out.append(f.read().strip())
        except FileNotFoundError:
            pass
    return out.count(name)


def test_close_joins_the_native_thread(tmp_path):
    gc.collect()   # a store an earlier test left to the collector joins its thread now, not midway
    before = _threads_named("rmq-reput")
    s = MessageStore(tmp_path / "s", _config())
    s.put(Message("A", b"x"))
    assert s.dispatcher.native and _threads_named("rmq-reput") == before + 1
    s.close()
    assert _threads_named("rmq-reput") == before
    assert not s.dispatcher.native


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_has_no_native_thread(tmp_path):
    """A child forked beside a running loop has no dispatch thread, and exits cleanly (its
    handle is disowned: nothing is joined or written there)."""
    s = MessageStore(tmp_path / "s", _config())
    try:
        s.put(Message("A", b"x"))
        s.wait_dispatched()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:   # pragma: no cover (the child)
            os.close(r)
            os.write(w, b"%d %d" % (_threads_named("rmq-reput"), s.dispatcher._native.running))
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            got = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert got == b"0 0"
        s.put(Message("A", b"y"))
        assert s.wait_dispatched(timeout=30) and s.max_offset("A", 0) + s.max_offset("A", 1) + \
            s.max_offset("A", 2) + s.max_offset("A", 3) == 2
    finally:
        s.close()
