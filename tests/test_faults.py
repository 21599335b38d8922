"""Injected I/O faults (cext/rmq_fault.h) on every durable path: commitlog, consume queue,
index, checkpoint and consumer offsets. Once a flush has failed no put is acknowledged,
not even one already waiting for the group commit, and the store stays read-only until it
is reopened; reopening recovers a store that verifies and holds every acknowledged put.
Each scenario runs in a child process (this file run as a script), so a crash fails a test."""
import errno
import json
import os
import subprocess
import sys
import threading

import pytest

ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC}
# path -> (fault op, substring of the failing file's path)
FLUSH_PATHS = {
    "commitlog": ("msync", "/commitlog/"),
    "consume_queue": ("msync", "/consumequeue/"),
    "index": ("msync", "/index/"),
    "checkpoint": ("fsync", "checkpoint.tmp"),
    "consumer_offsets": ("fsync", "consumerOffset.json.tmp"),
    "checkpoint_open": ("open", "checkpoint.tmp"),
    "consumer_offsets_open": ("open", "consumerOffset.json.tmp"),
}


def _config():
    from rmqstore import StoreConfig
    return StoreConfig(flush_mode="sync", commitlog_file_size=64 << 10, consume_queue_entries=100, index_slots=64,
                       index_entries=512, warm_mapped_file=False, flush_cq_interval_ms=_INT_MAX)


_INT_MAX = (1 << 31) - 1


def _put_until_refused(store, tag, acked, errors):
    """Put until the store refuses. A put that began after the flush failure was recorded
    must not be acknowledged."""
    from rmqstore import Message, StoreReadOnlyError
    i = 0
    while True:
        failed_before = store.flusher.error is not None
        try:
            r = store.put(Message("T", f"{tag}-{i}".encode(), keys=f"{tag}-{i}"), queue_id=i % 2)
        except StoreReadOnlyError:
            errors.append(tag)
            return
        if failed_before:
            raise AssertionError(f"put {tag}-{i} acknowledged after the flush failed")
        acked.append((r.phy_offset, f"{tag}-{i}"))
        i += 1


def scenario(path, kind, err, waiters):
    """Run one fault scenario on a new store at ``path``; returns a dict of what happened."""
    from rmqstore import Message, MessageStore, StoreReadOnlyError
    from rmqstore._segment import inject_fault
    op, match = FLUSH_PATHS[kind]
    out = {}
    store = MessageStore(path, _config())
    acked, refused = [], []
    if kind != "commitlog":   # something durable first: the fault must not undo it
        for i in range(5):
            r = store.put(Message("T", f"pre-{i}".encode(), keys=f"pre-{i}"), queue_id=i % 2)
            acked.append((r.phy_offset, f"pre-{i}"))
        store.commit_offset("g", "T", 0, 3)
        store.wait_dispatched()
    inject_fault(op, 1, err, match)
    if kind != "commitlog":
        try:
            store.flush()
        except StoreReadOnlyError as e:
            out["flush_error"] = type(e.__cause__).__name__ + ":" + str(getattr(e.__cause__, "errno", None))
    threads = [threading.Thread(target=_put_until_refused, args=(store, f"w{k}", acked, refused))
               for k in range(waiters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["refused"] = len(refused)
    out["acked_after_fault"] = sum(1 for _, b in acked if not b.startswith("pre-"))
    try:
        store.flush()
        out["flush_after"] = "ok"
    except StoreReadOnlyError:
        out["flush_after"] = "read-only"
    try:
        store.close()
    except StoreReadOnlyError:
        pass
    out["abort_left"] = os.path.exists(os.path.join(path, "abort"))
    inject_fault(op, 0, err, match)
    with MessageStore(path, _config()) as s:
        out["verify_ok"] = s.verify().ok
        out["acked_readable"] = all(s.get_by_offset(off).body.decode() == body for off, body in acked)
        out["acked"] = len(acked)
        out["offset_kept"] = s.committed_offset("g", "T", 0)
        s.put(Message("T", b"after reopen"))
    return out


def child_env(**extra):
    """The environment of a child process that imports this checkout's rmqstore and tests."""
    import rmqstore
    paths = [os.path.dirname(os.path.dirname(rmqstore.__file__)), os.path.dirname(os.path.abspath(__file__))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def _run(*args):
    p = subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True, timeout=300,
                       env=child_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("err", sorted(ERRNOS))
@pytest.mark.parametrize("kind", sorted(FLUSH_PATHS))
@pytest.mark.parametrize("waiters", [1, 4], ids=["single", "group"])
def test_failed_flush_acknowledges_nothing_later(tmp_path, kind, err, waiters):
    got = _run("flush", tmp_path / "s", kind, ERRNOS[err], waiters)
    assert got["refused"] == waiters                 # every writer ended refused...
    assert got["acked_after_fault"] == 0            # ...and none was acknowledged after the fault
    assert got["flush_after"] == "read-only"        # sticky: no retry succeeds
    assert got["abort_left"] is True                # close() after the failure is not a clean shutdown
    assert got["verify_ok"] is True and got["acked_readable"] is True
    if kind != "commitlog":
        assert got["flush_error"] == ("StoreIOError" if err == "EIO" else "DiskFullError") + f":{ERRNOS[err]}"
        assert got["acked"] == 5
    if kind.startswith("consumer_offsets"):
        assert got["offset_kept"] in (-1, 3)        # the old file or the new one, never a torn one


def space_scenario(path, op, err):
    """A failed fallocate/ftruncate/open while a put creates a commitlog segment: the put
    raises, nothing partial is kept, and the next put (space back) succeeds."""
    from rmqstore import Message, MessageStore
    from rmqstore._segment import inject_fault
    out = {}
    with MessageStore(path, _config().with_(flush_mode="async")) as s:
        if op == "ftruncate":   # a file system without fallocate falls back to ftruncate
            inject_fault("fallocate", 1, errno.EOPNOTSUPP, "/commitlog/")
        inject_fault(op, 1, err, "/commitlog/")
        try:
            s.put(Message("T", b"first"))
            out["first"] = "stored"
        except OSError as e:
            out["first"] = f"{type(e).__name__}:{e.errno}"
        out["files"] = sorted(os.listdir(os.path.join(path, "commitlog")))
        r = s.put(Message("T", b"second"))
        out["second_offset"] = r.phy_offset
    with MessageStore(path, _config()) as s:
        out["bodies"] = [m.body.decode() for m in s.scan()]
        out["verify_ok"] = s.verify().ok
    return out


@pytest.mark.parametrize("err", sorted(ERRNOS))
@pytest.mark.parametrize("op", ["fallocate", "ftruncate", "open"])
def test_failed_segment_create_keeps_nothing(tmp_path, op, err):
    got = _run("space", tmp_path / "s", op, ERRNOS[err])
    assert got["first"] == ("StoreIOError" if err == "EIO" else "DiskFullError") + f":{ERRNOS[err]}"
    assert got["files"] == []
    assert got["second_offset"] == 0
    assert got["bodies"] == ["second"] and got["verify_ok"] is True


def batch_scenario(path, op, err, warm, rolls):
    """A put_batch that rolls into ``rolls`` new segments while the disk is full: it raises
    and stores none of its messages (none dispatched either); the same batch goes in once
    there is space again, and the store reopens and verifies."""
    from rmqstore import Message, MessageStore
    from rmqstore._segment import inject_fault
    out = {}
    cfg = _config().with_(flush_mode="async", warm_mapped_file=warm == "warm", warm_ahead_bytes=16 << 10)
    first = [Message("T", b"a" * 500) for _ in range(100)]           # 100 x ~600 B: most of segment 0
    batch = [Message("T", b"b%04d" % i + b"b" * 500, keys=f"b{i}") for i in range(100 * rolls)]
    with MessageStore(path, cfg) as s:
        s.put_batch(first, 0)
        s.wait_dispatched(10)
        inject_fault(op, 1 if rolls == 1 or warm == "warm" else 2, err, "/commitlog/")
        try:
            s.put_batch(batch, 0)
            out["batch"] = "stored"
        except OSError as e:
            out["batch"] = f"{type(e).__name__}:{e.errno}"
        s.wait_dispatched(10)
        out["queue_after_fault"] = s.max_offset("T", 0)
        out["log_after_fault"] = sum(1 for _ in s.scan())
        s.put_batch(batch, 0)
    with MessageStore(path, _config()) as s:
        out["bodies"] = [m.body[:5].decode() for m in s.scan()]
        out["verify_ok"] = s.verify().ok
    return out


@pytest.mark.parametrize("rolls", [1, 2])
@pytest.mark.parametrize("warm", ["cold", "warm"])
@pytest.mark.parametrize("op", ["fallocate", "open"])
def test_batch_that_rolls_on_a_full_disk_stores_nothing(tmp_path, op, warm, rolls):
    got = _run("batch", tmp_path / "s", op, errno.ENOSPC, warm, rolls)
    if got["batch"] == "stored":   # the fault hit a segment made ahead of the batch, in the background
        assert warm == "warm"
    else:
        assert got["batch"] == f"DiskFullError:{errno.ENOSPC}"
        assert got["queue_after_fault"] == 100 and got["log_after_fault"] == 100
    expected = ["aaaaa"] * 100 + [f"b{i:04d}" for i in range(100 * rolls)] * (2 if got["batch"] == "stored" else 1)
    assert got["bodies"] == expected and got["verify_ok"] is True


def test_faults_armed_from_the_environment(tmp_path):
    """RMQ_FAULTS arms a fault as the library loads: the 1st commitlog msync fails."""
    code = ("import sys; from rmqstore import *; from test_faults import _config\n"
            "s = MessageStore(sys.argv[1], _config())\n"
            "try:\n    s.put(Message('T', b'x')); print('acked')\n"
            "except StoreReadOnlyError as e:\n    print('refused', e.__cause__.errno)\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                       env=child_env(RMQ_FAULTS="msync:1:EIO:/commitlog/"), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["refused", str(errno.EIO)]


def test_inject_fault_rejects_unknown_operations():
    from rmqstore._segment import inject_fault
    with pytest.raises(ValueError):
        inject_fault("write", 1, errno.EIO)
    with pytest.raises(ValueError):
        inject_fault("msync", 1, 0)


if __name__ == "__main__":
    what, path, *rest = sys.argv[1:]
    if what == "flush":
        result = scenario(path, rest[0], int(rest[1]), int(rest[2]))
    elif what == "batch":
        result = batch_scenario(path, rest[0], int(rest[1]), rest[2], int(rest[3]))
    else:
        result = space_scenario(path, rest[0], int(rest[1]))
    print(json.dumps(result))


@pytest.mark.parametrize("how", ["moved", "removed", "abort_removed"])
def test_a_store_directory_moved_or_removed_while_open_acknowledges_nothing(tmp_path, how):
    """The store directory renamed away (and a new one made in its place) or removed
    while a SYNC writer has it open: msync of the files still succeeded, so puts were
    acknowledged that no file under the name holds, and the checkpoint went into the new
    directory. The flush now checks the directory first: puts are refused as after a
    failed flush, the moved store reopens with every acknowledged put, and the new
    directory gets no checkpoint or consumer offsets. Only ``abort`` removed: close()
    returns normally (it raised FileNotFoundError)."""
    import shutil

    from rmqstore import Message, MessageStore, StoreReadOnlyError
    root, moved = tmp_path / "s", tmp_path / "s.moved"
    store = MessageStore(root, _config())
    acked = [store.put(Message("T", b"m%d" % i)).phy_offset for i in range(10)]
    store.wait_dispatched()   # else the reput thread may add a queue file while rmtree empties the directory
    if how == "abort_removed":
        os.unlink(root / "abort")
        store.close()
        with MessageStore(root, _config(), read_only=True) as again:
            assert again.clean_shutdown and sum(1 for _ in again.scan()) == 10
        return
    if how == "moved":
        os.rename(root, moved)
        os.mkdir(root)
    else:
        shutil.copytree(root, moved)   # what an acknowledged put must be found in
        shutil.rmtree(root)
    with pytest.raises(StoreReadOnlyError, match="store directory"):
        store.put(Message("T", b"late"))
    store.commit_offset("g", "T", 0, 3)
    with pytest.raises(StoreReadOnlyError):
        store.flush()
    store.close()
    assert not {"checkpoint", "config"} & set(os.listdir(root) if root.exists() else ())
    with MessageStore(moved, _config(), read_only=True) as again:
        assert [again.get_by_offset(o).body for o in acked] == [b"m%d" % i for i in range(10)]


def test_a_flusher_that_fails_otherwise_than_by_io_fails_the_store(tmp_path):
    """An ASYNC flusher thread ended unseen on any exception but an I/O error (a retention
    closing a file under it did that): every later put was acknowledged and never flushed
    until close. Such an error now fails the store as a failed flush does (invariant 4):
    the next put raises StoreReadOnlyError, and the store reopens with what it held. (The
    commitlog's flusher is native, with no Python code to fail: see the next test.)"""
    import time

    from rmqstore import Message, MessageStore, StoreConfig, StoreReadOnlyError
    cfg = StoreConfig(flush_mode="async", commitlog_file_size=64 << 10, consume_queue_entries=100, index_slots=64,
                      index_entries=512, warm_mapped_file=False, flush_interval_ms=5, flush_cq_interval_ms=5)
    with MessageStore(tmp_path / "s", cfg) as store:
        kept = store.put(Message("T", b"kept"))
        target = store.consume_queues

        def broken(*_args):
            raise RuntimeError("a bug in a flush")
        target.flush = broken
        deadline = time.monotonic() + 10
        with pytest.raises(StoreReadOnlyError):
            while time.monotonic() < deadline:
                store.put(Message("T", b"later"))
                time.sleep(0.01)
        del target.flush
    with MessageStore(tmp_path / "s", cfg, read_only=True) as store:
        assert store.get_by_offset(kept.phy_offset).body == b"kept"


def test_a_failed_async_native_flush_fails_the_next_put(tmp_path):
    """The ASYNC cadence runs on the native flusher: an msync it fails on its own, with no
    caller to tell, still makes the next put raise StoreReadOnlyError (invariant 4), and the
    store reopens with what it held."""
    import time

    from rmqstore import Message, MessageStore, StoreConfig, StoreReadOnlyError
    from rmqstore._segment import inject_fault
    cfg = StoreConfig(flush_mode="async", commitlog_file_size=64 << 10, consume_queue_entries=100, index_slots=64,
                      index_entries=512, warm_mapped_file=False, flush_interval_ms=5, flush_least_pages=0)
    with MessageStore(tmp_path / "s", cfg) as store:
        kept = store.put(Message("T", b"kept"))
        store.flush()
        inject_fault("msync", 1, errno.EIO, "/commitlog/")
        try:
            deadline = time.monotonic() + 10
            with pytest.raises(StoreReadOnlyError, match="msync"):
                while time.monotonic() < deadline:
                    store.put(Message("T", b"later"))
                    time.sleep(0.01)
        finally:
            inject_fault("msync", 0, errno.EIO)
        assert isinstance(store.flusher.error, OSError) and store.flusher.error.errno == errno.EIO
    with MessageStore(tmp_path / "s", cfg, read_only=True) as store:
        assert store.get_by_offset(kept.phy_offset).body == b"kept"
