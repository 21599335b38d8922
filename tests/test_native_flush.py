"""The commitlog's flusher is a native thread (``rmq-flush``): SYNC writers wait for it with
the GIL released and are released by it, a group of them shares one msync, a failed msync
acknowledges none of them, close joins it and a forked child has none. msync is held up
with the fault injection's stall (cext/rmq_fault.h), so nothing here depends on timing:
each wait polls for a state, under a generous deadline."""
import errno
import json
import os
import threading
import time

import pytest

from rmqstore import ForeignProcessError, Message, MessageStore, StoreConfig, StoreReadOnlyError
from rmqstore._segment import inject_fault, stall_fault, stalled_thread

WAITERS = 4


def _cfg(mode="sync"):
    return StoreConfig(flush_mode=mode, commitlog_file_size=64 << 10, consume_queue_entries=100, index_slots=64,
                       index_entries=512, warm_mapped_file=False)


def _until(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _threads():
    """{tid: name} of this process's threads, as the kernel names them."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except FileNotFoundError:   # ended since the listing
            pass
    return out


def _start_waiters(store, results):
    """WAITERS threads putting one SYNC message each; ``results[k]``: its PutResult or the
    exception it raised."""
    def put(k):
        try:
            results[k] = store.put(Message("T", b"w%d" % k))
        except Exception as e:   # noqa: BLE001 - the test looks at what each raised
            results[k] = e
    threads = [threading.Thread(target=put, args=(k,)) for k in range(WAITERS)]
    for t in threads:
        t.start()
    return threads


def _all_written(store, before):
    """Whether every waiter's record is in the commitlog (each waits for the flush now)."""
    return sum(1 for m in store.scan(from_offset=before)) == WAITERS


@pytest.fixture
def stalled_msync():
    """Cleared after the test, whatever it left armed."""
    try:
        yield
    finally:
        stall_fault("msync", False)
        inject_fault("msync", 0, errno.EIO)


def test_sync_waiters_are_released_by_the_native_flusher_without_the_gil(tmp_path, stalled_msync):
    with MessageStore(tmp_path / "s", _cfg()) as store:
        native = store.flusher.native
        stall_fault("msync", True, "/commitlog/")
        before, rounds = store.max_phy_offset, native.rounds
        results = {}
        threads = _start_waiters(store, results)
        _until(lambda: stalled_thread("msync") and _all_written(store, before), "the waiters' records and the msync")
        # the msync in progress is the flusher thread's, not a writer's
        tid = stalled_thread("msync")
        assert tid == native.thread_id and _threads()[tid] == "rmq-flush"
        # every writer waits, not acknowledged, while this thread runs Python freely
        spins = 0
        while spins < 100_000:
            spins += 1
        assert results == {} and all(t.is_alive() for t in threads)
        stall_fault("msync", False)
        for t in threads:
            t.join(30)
        assert sorted(r.phy_offset for r in results.values()) == \
            [m.phy_offset for m in store.scan(from_offset=before)]
        assert store.commitlog.flushed_offset >= max(r.phy_offset + r.size for r in results.values())
        # group commit: the stalled msync covered at least the first writer, one more all the rest
        assert 1 <= native.rounds - rounds <= 2


def test_a_failed_native_flush_acknowledges_no_waiter(tmp_path, stalled_msync):
    root = tmp_path / "s"
    store = MessageStore(root, _cfg())
    durable = store.put(Message("T", b"durable"))
    stall_fault("msync", True, "/commitlog/")
    before = store.max_phy_offset
    results = {}
    threads = _start_waiters(store, results)
    _until(lambda: stalled_thread("msync") and _all_written(store, before), "the waiters' records and the msync")
    inject_fault("msync", 1, errno.EIO, "/commitlog/")   # the stalled msync fails once it goes on
    stall_fault("msync", False)
    for t in threads:
        t.join(30)
    assert len(results) == WAITERS and all(isinstance(r, StoreReadOnlyError) for r in results.values()), results
    assert all(isinstance(r.__cause__, OSError) and r.__cause__.errno == errno.EIO for r in results.values())
    with pytest.raises(StoreReadOnlyError):   # sticky: the next put is refused before it is written
        store.put(Message("T", b"later"))
    with pytest.raises(StoreReadOnlyError):
        store.flush()
    store.close()
    inject_fault("msync", 0, errno.EIO)
    with MessageStore(root, _cfg()) as again:
        assert again.get_by_offset(durable.phy_offset).body == b"durable"
        assert b"later" not in [m.body for m in again.scan()]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_close_joins_every_native_thread(tmp_path, mode):
    before = set(_threads())
    store = MessageStore(tmp_path / "s", _cfg(mode).with_(warm_mapped_file=True))
    store.put(Message("T", b"x"))
    running = _threads()
    assert "rmq-flush" in {running[t] for t in set(running) - before}
    store.close()
    assert set(_threads()) <= before


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_background_threads_run_at_a_lower_priority(tmp_path, mode):
    """The toucher, and the flusher when nobody waits for it (ASYNC), run at nice +10 (cext/
    rmq_background.h); a SYNC store's flusher, which writers wait for, and the dispatch
    loop keep the process's priority."""
    def nice(tid):
        with open(f"/proc/self/task/{tid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])   # field 19 of proc(5): nice
    before = set(_threads())
    with MessageStore(tmp_path / "s", _cfg(mode).with_(warm_mapped_file=True)) as store:
        store.put(Message("T", b"x"))
        store.wait_dispatched()
        got = {name: nice(tid) for tid, name in _threads().items() if tid not in before}
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert got["rmq-touch"] == min(19, base + 10)
    assert got["rmq-flush"] == (min(19, base + 10) if mode == "async" else base)
    assert got["rmq-reput"] == base


def test_a_forked_child_has_no_native_thread_and_refuses_writes(tmp_path):
    store = MessageStore(tmp_path / "s", _cfg())
    store.put(Message("T", b"parent"))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child reports through the pipe
        os.close(r)
        out = {"threads": sorted(_threads().values())}
        try:
            store.put(Message("T", b"child"))
            out["put"] = "ok"
        except ForeignProcessError:
            out["put"] = "ForeignProcessError"
        except BaseException as e:   # noqa: BLE001 - reported, never raised in the child
            out["put"] = repr(e)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    assert len(got["threads"]) == 1 and "rmq-flush" not in got["threads"]
    assert got["put"] == "ForeignProcessError"
    assert store.put(Message("T", b"parent again")).phy_offset > 0   # the parent's flusher still serves it
    store.close()
    with MessageStore(tmp_path / "s", _cfg(), read_only=True) as again:
        assert [m.body for m in again.scan()] == [b"parent", b"parent again"]


def _wait_premade(queue, offset):
    _until(lambda: offset in queue.premade and queue.premade[offset].ready, f"segment {offset} made ahead")


def test_the_roll_takes_the_segment_made_ahead_without_python(tmp_path, monkeypatch):
    """The next commitlog file is made ahead and the appender's roll publishes it in C:
    SegmentQueue.roll, Python code on the writer's path, is not called (it fails here)."""
    seg_size = 64 << 10
    cfg = _cfg("async").with_(warm_mapped_file=True, warm_ahead_bytes=16 << 10)
    with MessageStore(tmp_path / "s", cfg) as store:
        queue = store.commitlog.segments
        store.put(Message("T", b"first"))
        _wait_premade(queue, seg_size)

        def roll(*_args):
            raise AssertionError("SegmentQueue.roll called on the writer's path")
        monkeypatch.setattr(queue, "roll", roll)
        rs = [store.put(Message("T", b"x" * 1000)) for _ in range(100)]   # about 100 KiB: one roll
        monkeypatch.undo()
        assert {r.phy_offset // seg_size for r in rs} == {0, 1}
        assert [s.base_offset for s in queue.segments] == [0, seg_size]
        _wait_premade(queue, 2 * seg_size)   # and the one after is being made again


def test_blocks_ahead_of_the_writer_are_allocated_by_the_native_toucher(tmp_path):
    """With a small reserve window and a larger warm-ahead window, the blocks past what the
    writer reserved itself are the toucher's work (thread ``rmq-touch``), queued in C."""
    cfg = _cfg("async").with_(commitlog_file_size=1 << 20, warm_mapped_file=True, warm_ahead_bytes=256 << 10,
                              reserve_ahead_bytes=4096)
    with MessageStore(tmp_path / "s", cfg) as store:
        log = store.commitlog
        toucher = log.segments.toucher
        _until(lambda: toucher.thread_id, "the toucher thread to run")
        assert log._warmer is toucher and _threads()[toucher.thread_id] == "rmq-touch"
        r = store.put(Message("T", b"x" * 100))
        _until(lambda: toucher.pending == 0, "the toucher's jobs")
        seg = log.segments.last
        assert seg.reserved >= r.phy_offset + r.size + (128 << 10) > r.phy_offset + r.size + 4096 + 4096
