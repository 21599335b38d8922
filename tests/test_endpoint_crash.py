"""Consumption state across crashes: SIGKILL of ``rmqstore serve`` mid-consumption, and the
on-disk state (config/popState.json + popState.log) replayed, torn tails included."""
import json
import os
import signal
import stat
import subprocess
import sys
import time
import zlib

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq")

from rmqstore import CorruptStoreError, MessageStore, StoreConfig  # noqa: E402
from rmqstore.endpoint.codec import DELIVER_MS, deliver_at  # noqa: E402
from rmqstore.pop_state import PopState  # noqa: E402

from endpoint_client import consumer, message, producer, receive_all  # noqa: E402


def _start(store, log, options=()):
    """``rmqstore serve`` on a free port (sync flush, more ``options``); (process, address) once it listens."""
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rmqstore.cli", "serve", str(store), "--create",
                                 "--listen", "127.0.0.1:0", "--sync-flush", "--segment-size", str(1 << 20),
                                 "--index-slots", "1024", "--index-entries", "8192", *options],
                                stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(600):
        text = open(log, encoding="utf-8", errors="replace").read().split("=== start")[-1]
        if "listening on " in text:
            return proc, text.split("listening on ")[1].split()[0]
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {text}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("serve did not start")


def test_sigkill_mid_consumption(tmp_path):
    store, log = tmp_path / "store", tmp_path / "serve.log"
    log.write_text("=== start\n")
    proc, addr = _start(store, log)
    try:
        with producer(addr, "Tk") as p:
            sent = {p.send(message("Tk", f"m{i}".encode(), keys=(f"k{i}",))).message_id for i in range(200)}
        with consumer(addr, "G", "Tk") as c:
            acked = {m.message_id for m in receive_all(c, 100)}
            in_flight = receive_all(c, 20, invisible=2, ack=False)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        proc.kill()
    assert len(acked) >= 100 and in_flight
    with open(log, "a") as f:
        f.write("=== start\n")
    proc, addr = _start(store, log)
    try:
        with consumer(addr, "G", "Tk") as c:
            after = receive_all(c, len(sent) - len(acked))
            c.await_duration = 3
            assert c.receive(32, 30) == []
        ids = [m.message_id for m in after]
        assert len(ids) == len(set(ids))
        assert not set(ids) & acked                     # nothing acked comes back
        assert set(ids) | acked == sent                 # nothing acknowledged is lost
        assert all(m.delivery_attempt == 2 for m in after if m.message_id in {x.message_id for x in in_flight})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    text = log.read_text()
    assert text.count("connected from") >= 3 and "stopped" in text
    cfg = StoreConfig(commitlog_file_size=1 << 20, index_slots=1024, index_entries=8192)
    with MessageStore(store, cfg, read_only=True) as s:
        assert s.verify().ok
    for name in ("popState.json", "popState.log"):
        assert stat.S_IMODE(os.lstat(store / "config" / name).st_mode) == 0o600


def _state_with_entries(root):
    st = PopState(str(root))
    st.append([["r", "G", "T", 0, 5, 1000, 1, 7, 0], ["n", "G", "T", 0, 6]])
    st.sync(st.append([["r", "G", "T", 1, 2, 2000, 1, 8, 1], ["a", "G", "T", 0, 5], ["n", "G", "T", 1, 9]]))
    return st


def test_state_snapshot_nested_too_deeply_is_corrupt(tmp_path):
    """A popState.json nested past json's recursion limit was a RecursionError out of
    PopState (the endpoint could not start with a clear error): CorruptStoreError now; a
    log record nested so deeply ends the replay as a torn one does."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "popState.json").write_text("[" * 100_000)
    with pytest.raises(CorruptStoreError, match="nested too deeply"):
        PopState(str(tmp_path))
    (tmp_path / "config" / "popState.json").unlink()
    text = b"[" * 100_000
    (tmp_path / "config" / "popState.log").write_bytes(b"%x " % zlib.crc32(text) + text + b"\n")
    st = PopState(str(tmp_path))
    assert st.queues == {}
    st.close()


@pytest.mark.parametrize("snapshot,log_record", [
    ({"version": 2, "seq": 0, "queues": []}, None),
    ({"seq": 0, "queues": []}, None),
    ({"version": 1, "seq": 0, "queues": [["G", "T", 0, -5, []]]}, None),
    (None, ["x", "G", "T", 0, 5]),
    (None, ["n", "G", "T", 0, -1]),
], ids=["later-version", "no-version", "negative-next", "unknown-record", "negative-next-record"])
def test_state_of_another_format_is_corrupt(tmp_path, snapshot, log_record):
    """A snapshot of another version (or none), a negative next offset, or a log record of
    a kind this version does not write was read as if it were this format, silently; it
    is now a CorruptStoreError naming the file, and the files are left as they were."""
    import json
    (tmp_path / "config").mkdir()
    files = {}
    if snapshot is not None:
        files["popState.json"] = json.dumps(snapshot).encode()
    if log_record is not None:
        text = json.dumps(log_record).encode()
        files["popState.log"] = b"%x " % zlib.crc32(text) + text + b"\n"
    for name, data in files.items():
        (tmp_path / "config" / name).write_bytes(data)
    with pytest.raises(CorruptStoreError, match="not consumption state"):
        PopState(str(tmp_path))
    assert {n: (tmp_path / "config" / n).read_bytes() for n in files} == files


def test_state_replays_log_and_stops_at_a_torn_tail(tmp_path):
    st = _state_with_entries(tmp_path)
    log = tmp_path / "config" / "popState.log"
    good = log.read_bytes().rstrip(b"\0")              # the records, not the zeros written ahead
    os.close(st._fd)                                     # a crash: no snapshot written
    # a torn last record, then a record with a bad CRC: both ignored
    log.write_bytes(good + b'0000 ["a","G","T",1,2]\n' + b'deadbeef ["n","G","T",1,99]')
    st2 = PopState(str(tmp_path))
    assert st2.queue(("G", "T", 0)).next == 6 and st2.queue(("G", "T", 0)).pending == {}
    assert st2.queue(("G", "T", 1)).next == 9 and st2.queue(("G", "T", 1)).pending == {2: [2000, 1, 8, 1]}
    assert st2.next_seq() > 8
    assert log.read_bytes().strip(b"\0") == b""           # compacted into the snapshot at open: no record
    st2.close()


def test_state_replay_over_its_own_snapshot_is_idempotent(tmp_path):
    st = _state_with_entries(tmp_path)
    log = tmp_path / "config" / "popState.log"
    records = log.read_bytes()
    st.close()                                           # snapshot holds everything, log emptied
    log.write_bytes(records)                             # crash between snapshot rename and log truncate
    st2 = PopState(str(tmp_path))
    assert {k: (q.next, q.pending) for k, q in st2.queues.items()} == {
        ("G", "T", 0): (6, {}), ("G", "T", 1): (9, {2: [2000, 1, 8, 1]})}
    st2.close()


def _logged(rec):
    text = json.dumps(rec).encode()
    return b"%08x %s\n" % (zlib.crc32(text), text)


@pytest.mark.parametrize("name,data", [
    ("popState.json", b'{"version": 1, "seq": 1e400, "queues": []}'),
    ("popState.json", b'{"version": 1, "seq": 1, "queues": [["G", "T", "0", 0, []]]}'),
    ("popState.json", b'{"version": 1, "seq": 1, "queues": [["G", "T", 0, 0, [[1, 2, 3]]]]}'),
    ("popState.json", b"[" * 100000 + b"]" * 100000),
    ("popState.log", _logged(["r", "G", "T", 0, 5])),
    ("popState.log", _logged(["n", "G", "T", -1, 5])),
    ("popState.log", _logged(["a", "G", "T", 0, "x"])),
    ("popState.log", _logged(["r", "G", "T", 0, 5, 1e400, 1, 1, 0])),
    ("popState.log", _logged(["n", "G", "T", 0, 1 << 70])),
], ids=["seq-inf", "queue-str", "pending-short", "nested", "r-short", "queue-neg", "offset-str", "until-inf",
        "next-huge"])
def test_state_files_that_lie_are_corrupt_store_errors(tmp_path, name, data):
    """A snapshot or a log line (with a good CRC) whose JSON is not the format: each was a
    bare OverflowError, IndexError, ValueError or RecursionError from the endpoint's start
    (or a value past int64 kept for later); now a CorruptStoreError naming the file."""
    _state_with_entries(tmp_path).close()
    path = tmp_path / "config" / name
    path.write_bytes(data if name.endswith("json") else path.read_bytes().rstrip(b"\0") + data)
    with pytest.raises(CorruptStoreError, match=name):
        PopState(str(tmp_path))


def test_a_delivery_time_past_int64_is_not_a_delay():
    """A __STARTDELIVERTIME property of 30 digits (from disk) went into the pop state as a
    number no int64 holds; it is read as no delay."""
    class M:
        properties = {DELIVER_MS: "9" * 30}
    assert deliver_at(M) == 0
    M.properties = {DELIVER_MS: "1700000000000"}
    assert deliver_at(M) == 1700000000000


def test_concurrent_acks_share_one_fsync_and_each_waits_for_it(tmp_path, monkeypatch):
    """Group commit of the state log: threads that appended before a sync began are covered
    by its one fsync (each had one of its own, in turn under the state lock); each sync
    returns only once an fsync covering its records has ended; an fsync that failed fails
    every later sync (nothing written before it is acknowledged)."""
    import threading

    from rmqstore import StoreIOError
    from rmqstore import pop_state as state_module
    synced = []

    def counted(fd, path, data_only=False):
        with open(path, "rb") as f:
            synced.append(len(f.read().rstrip(b"\0")))   # the records' bytes (zeros follow them)
    st = PopState(str(tmp_path))
    monkeypatch.setattr(state_module, "fsync", counted)
    appended = threading.Barrier(8)
    covered = []

    def ack(i):
        ticket = st.append([["a", "G", "T", 0, i]])
        appended.wait()
        st.sync(ticket)
        covered.append(max(synced) >= ticket[1])
    threads = [threading.Thread(target=ack, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert covered == [True] * 8 and len(synced) == 1
    st.sync(st.append([["a", "G", "T", 0, 99]]))
    assert len(synced) == 2

    def failing(fd, path, data_only=False):
        raise StoreIOError("fsync: EIO")
    monkeypatch.setattr(state_module, "fsync", failing)
    with pytest.raises(StoreIOError):
        st.sync(st.append([["a", "G", "T", 0, 100]]))
    monkeypatch.setattr(state_module, "fsync", counted)
    with pytest.raises(StoreIOError, match="earlier fsync failed"):
        st.sync(st.append([["a", "G", "T", 0, 101]]))


@pytest.mark.parametrize("op, match, err", [("fsync", "popState.json", "EIO"), ("fsync", "config", "EIO"),
                                             ("fsync", "popState.log", "EIO"), ("open", "popState.log", "EMFILE")])
def test_a_failed_compaction_fails_every_later_ack(tmp_path, monkeypatch, op, match, err):
    """A compaction (the log past its size) whose snapshot fsync, directory fsync, new-log
    fsync or new-log open fails: that append raises, and every later sync raises too, also
    once the disk works again (nothing written before the failure is acknowledged). A failed
    open leaves the old log's descriptor open: a file opened since (which could get a closed
    descriptor's number) gets none of the log's lines."""
    import errno

    from rmqstore import StoreIOError
    from rmqstore import pop_state as state_module
    from rmqstore._segment import inject_fault
    st = PopState(str(tmp_path))
    st.sync(st.append([["a", "G", "T", 0, 1]]))
    monkeypatch.setattr(state_module, "_COMPACT_BYTES", 0)          # the next append compacts
    inject_fault(op, 1, getattr(errno, err), match)
    try:
        with pytest.raises(StoreIOError):
            st.append([["a", "G", "T", 0, 2]])
    finally:
        inject_fault(op, 0, errno.EIO)
    monkeypatch.setattr(state_module, "_COMPACT_BYTES", 4 << 20)
    other = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o600)   # gets the lowest free number
    try:
        with pytest.raises(StoreIOError, match="earlier fsync failed"):
            st.sync(st.append([["a", "G", "T", 0, 3]]))
        assert os.fstat(other).st_size == 0
    finally:
        os.close(other)
    st.close()
    again = PopState(str(tmp_path))
    assert again.queues[("G", "T", 0)].pending == {} and again._sync_failed is None


def test_state_files_are_left_alone_once_the_store_lets_its_lock_go(tmp_path):
    """The store closed under a running endpoint (its writer lock let go), another writer
    opens the directory, and the endpoint stops: the stop rewrote popState.json (a rename)
    and truncated popState.log in a directory it no longer owned. Now every rename and
    truncation of the state files runs as an operation of the open store, and after the
    close both are left as they were (the log holds the state)."""
    from endpoint_client import endpoint_config, running
    cfg = endpoint_config()
    root = tmp_path / "s"
    with running(root, cfg) as (store, ep, addr):
        with producer(addr, "T") as p:
            for i in range(3):
                p.send(message("T", b"m%d" % i))
        with consumer(addr, "G", "T") as c:
            assert len(receive_all(c, 3)) == 3
        files = [root / "config" / n for n in ("popState.json", "popState.log")]
        assert files[1].stat().st_size > 0
        store.close()
        before = [(os.stat(f).st_ino, f.read_bytes()) for f in files]
        with MessageStore(root, cfg):                    # another writer holds the lock now
            ep.stop()
            assert [(os.stat(f).st_ino, f.read_bytes()) for f in files] == before
    st = PopState(str(root))
    assert sum(len(q.pending) for q in st.queues.values()) == 0 and sum(q.next for q in st.queues.values()) == 3
    st.close()


@pytest.mark.parametrize("rec", [["r", "G", "T", 0, 5, 1000, 1, 7, 0], ["a", "g\"\\\u00e9\u4e2d", "%DLQ%T", 3, 1 << 62],
                                 ["n", "", "T\x01", 2147483647, 0]])
def test_state_records_are_written_as_json_writes_them(rec):
    """The log's record encoder (names encoded once) writes what json.dumps writes."""
    from rmqstore.pop_state import encode_record
    assert encode_record(rec) == json.dumps(rec, separators=(",", ":")).encode()
