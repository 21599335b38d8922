"""StoreConfig(background_dispatch=False): no reput thread; wait_dispatched (and close)
build the consume queues and index in the calling thread, into the same files a store
dispatching in the background writes."""
import errno
import os
import shutil
import threading

import pytest

from rmqstore import Message, MessageStore, StoreConfig, StoreIOError

from conftest import SMALL_INDEX

CFG = dict(commitlog_file_size=64 * 1024, consume_queue_entries=10, **SMALL_INDEX)


def _put_varied(store, batches=6):
    for b in range(batches):
        n = 40 + b
        store.put_columns([f"T{i % 3}" for i in range(n)], [bytes([b, i]) * (i + 1) for i in range(n)],
                          tags=[f"tag{i % 4}" for i in range(n)], keys=[[f"k{b}-{i}", f"both{i}"] for i in range(n)])


def _bodies(store, topic, queue_id):
    out, offset = [], 0
    while offset < store.max_offset(topic, queue_id):
        r = store.get_messages(topic, queue_id, offset)
        out += [bytes(m.body).decode() for m in r.messages]
        offset = r.next_offset
    return out


def _files(top):
    """{relative path: bytes} of the files under ``top``; index files (named by creation
    time) by their rank instead."""
    paths = sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)
    return {(i if os.path.basename(top) == "index" else p): open(os.path.join(top, p), "rb").read()
            for i, p in enumerate(paths)}


def test_queues_and_index_are_built_by_wait_dispatched_in_the_caller(tmp_path):
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, **CFG)) as st:
        assert not [t for t in threading.enumerate() if t.name == "rmq-reput"]
        _put_varied(st, 1)
        assert st.dispatch_lag > 0 and st.max_offset("T0", 0) == 0   # nobody dispatched yet
        assert st.wait_dispatched() and st.dispatch_lag == 0
        assert st.max_offset("T0", 0) > 0
        assert [m.keys for m in st.query_by_key("T1", "k0-1")] == [["k0-1", "both1"]]
        first = st.get_messages("T2", 0, 0, 2).messages
        assert [bytes(m.body) for m in first] == [bytes([0, 2]) * 3, bytes([0, 14]) * 15]


def test_files_are_those_a_rebuild_dispatching_in_the_background_writes(tmp_path):
    """Consume queues (several files each) and index, dispatched a batch at a time by
    wait_dispatched and at close, are byte for byte what a default store's rebuild makes."""
    with MessageStore(tmp_path / "bulk", StoreConfig(background_dispatch=False, **CFG)) as st:
        for _ in range(3):
            _put_varied(st, 2)
            st.wait_dispatched()
        _put_varied(st, 2)   # left to close
    _assert_rebuild_makes_the_same(tmp_path)


def _assert_rebuild_makes_the_same(tmp_path):
    """The consume queues and index of the store at ``tmp_path/bulk`` are byte for byte
    what a default store's rebuild of a copy makes."""
    shutil.copytree(tmp_path / "bulk", tmp_path / "again")
    with MessageStore(tmp_path / "again", StoreConfig(**CFG), rebuild=True) as st:
        assert st.wait_dispatched()
    for sub in ("consumequeue", "index"):
        got, want = _files(tmp_path / "bulk" / sub), _files(tmp_path / "again" / sub)
        assert got == want and len(want) >= (24 if sub == "consumequeue" else 1), sub


def test_threads_putting_and_waiting_together_dispatch_each_message_once(tmp_path):
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, **CFG)) as st:
        def work(k):
            for i in range(40):
                st.put(Message("T", f"{k}-{i}".encode()), queue_id=k % 2)
                st.wait_dispatched()
        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = sorted(_bodies(st, "T", 0) + _bodies(st, "T", 1))
        assert got == sorted(f"{k}-{i}" for k in range(6) for i in range(40))
        assert st.max_offset("T", 0) == st.max_offset("T", 1) == 120


def test_a_failed_dispatch_is_a_store_io_error_and_the_next_call_resumes(tmp_path):
    from rmqstore._segment import inject_fault
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, **CFG)) as st:
        st.put(Message("T", b"first"), queue_id=0)
        st.wait_dispatched()
        st.put(Message("N", b"second"), queue_id=0)   # a new queue: its file fails to open
        inject_fault("open", 1, errno.ENOSPC, "/consumequeue/N/")
        try:
            with pytest.raises(StoreIOError, match="dispatch stalled"):
                st.wait_dispatched()
            inject_fault("open", 1, errno.ENOSPC, "/consumequeue/N/")
            assert not st.wait_dispatched(timeout=0)   # with a timeout: not caught up, no error
        finally:
            inject_fault("open", 0, errno.ENOSPC)
        assert st.max_offset("N", 0) == 0
        assert st.wait_dispatched()
        assert _bodies(st, "T", 0) + _bodies(st, "N", 0) == ["first", "second"]


def _put_arrow_varied(store, batches=6, dispatch=True):
    """Arrow batches of every field dispatch reads: topics, tags (some none), keys, a
    UNIQ_KEY, properties, PREPARED (0x4) and ROLLBACK (0xC) rows, IPv6 and IPv4 born hosts."""
    import pyarrow as pa
    for b in range(batches):
        n = 40 + b
        store.put_arrow(pa.record_batch({
            "topic": [f"T{i % 3}" for i in range(n)], "body": [bytes([b, i]) * (i + 1) * 16 for i in range(n)],
            "tags": [None if i % 5 == 0 else f"tag{i % 4}" for i in range(n)],
            "keys": [[f"k{b}-{i}", f"both{i}"] for i in range(n)],
            "uniq_key": [f"U{b}-{i}" if i % 2 else None for i in range(n)],
            "properties": pa.array([[("p", str(i))] if i % 3 else None for i in range(n)],
                                   pa.map_(pa.string(), pa.string())),
            "sys_flag": pa.array([(0, 0x4, 0xC, 0x8)[i % 4] for i in range(n)], pa.int32()),
            "born_host": [("[::1]:9" if i % 2 else "10.0.0.1:8") if i % 3 else None for i in range(n)]}),
            dispatch=dispatch)


def _scanned(store):
    """Each record's dispatch row as scan_dispatch reads it back from the commitlog, its
    topic and properties bytes in place of their positions."""
    from rmqstore import _read
    out = []
    for seg in store.commitlog.segments.segments:
        rows, raw, _, _ = _read.scan_dispatch(seg, 0, seg.wrote_pos)
        out += _plain(rows, raw)
    return out


def _plain(rows, raw):
    return [(*(int(r[f]) for f in ("phy_offset", "size", "queue_id", "queue_offset", "sys_flag", "tags_code",
                                   "store_timestamp")),
             raw[r["topic_off"]:r["topic_off"] + r["topic_len"]], raw[r["props_off"]:r["props_off"] + r["props_len"]])
            for r in rows]


@pytest.mark.parametrize("store_host", ["127.0.0.1:10911", "[fe80::1]:10911"])
def test_put_with_dispatch_hands_on_the_rows_a_scan_reads_back(tmp_path, store_host):
    """put_arrow / put_columns with dispatch: the rows the consumers get, built from the
    columns, are those scan_dispatch reads from the records (every field, sys_flag's host
    bits included), over segment rolls; nothing is left for wait_dispatched."""
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, store_host=store_host, **CFG)) as st:
        got = []
        st.dispatcher.add(lambda batch: got.extend(_plain(batch.rows, batch.raw)))
        for _ in range(4):
            _put_arrow_varied(st, 2)
            assert st.dispatch_lag == 0   # dispatched by the put
        n = len(got)
        st.put_columns("T0", [b"a", b"b"], tags=["x", None], keys=[["k"], None], dispatch=True)
        assert st.dispatch_lag == 0 and len(got) == n + 2
        assert len(st.commitlog.segments.segments) > 3   # rolls inside batches
        assert got == _scanned(st)


def test_put_with_dispatch_behind_a_lag_leaves_it_to_wait_dispatched(tmp_path):
    """Rows whose predecessors are not dispatched yet are not dispatched ahead of them."""
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, **CFG)) as st:
        _put_arrow_varied(st, 1, dispatch=False)
        lag = st.dispatch_lag
        _put_arrow_varied(st, 1)
        assert st.dispatch_lag > lag and st.max_offset("T0", 0) == 0
        assert st.wait_dispatched() and st.dispatch_lag == 0
        _put_arrow_varied(st, 1)
        assert st.dispatch_lag == 0


@pytest.mark.parametrize("wait", [True, False])
def test_files_dispatched_by_put_are_those_a_rebuild_writes(tmp_path, wait):
    """Consume queues and index dispatched by put_arrow(dispatch=True), with or without a
    wait_dispatched after each batch, are byte for byte what a default store's rebuild
    makes, as they are when wait_dispatched scans the records."""
    with MessageStore(tmp_path / "bulk", StoreConfig(background_dispatch=False, **CFG)) as st:
        for _ in range(4):
            _put_arrow_varied(st, 2)
            if wait:
                st.wait_dispatched()
    _assert_rebuild_makes_the_same(tmp_path)


def test_a_dispatch_by_put_that_fails_is_left_to_wait_dispatched(tmp_path):
    """A consumer failing in a put's dispatch (a full disk) fails not the put, whose rows
    are stored: wait_dispatched scans them and reports the error as it does, then resumes."""
    from rmqstore._segment import inject_fault
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, **CFG)) as st:
        st.put_columns("T", [b"first"], queue_ids=0, dispatch=True)
        assert st.dispatch_lag == 0
        inject_fault("open", 1, errno.ENOSPC, "/consumequeue/N/")   # a new queue: its file fails to open
        try:
            st.put_columns("N", [b"second"], queue_ids=0, dispatch=True)
            assert st.dispatch_lag > 0
            inject_fault("open", 1, errno.ENOSPC, "/consumequeue/N/")
            with pytest.raises(StoreIOError, match="dispatch stalled"):
                st.wait_dispatched()
        finally:
            inject_fault("open", 0, errno.ENOSPC)
        assert st.wait_dispatched()
        assert _bodies(st, "T", 0) + _bodies(st, "N", 0) == ["first", "second"]


def test_threads_putting_with_dispatch_dispatch_each_message_once_in_order(tmp_path):
    """Threads whose put_columns(dispatch=True) race: a batch whose predecessor is not
    dispatched yet is left to the scan; each message gets one entry, in commitlog order."""
    with MessageStore(tmp_path / "s", StoreConfig(background_dispatch=False, **CFG)) as st:
        def work(k):
            for i in range(30):
                st.put_columns("T", [f"{k}-{i}-{j}".encode() for j in range(3)], queue_ids=0, dispatch=True)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert st.wait_dispatched()
        got = _bodies(st, "T", 0)
        assert [m.body.decode() for m in st.scan()] == got
        assert sorted(got) == sorted(f"{k}-{i}-{j}" for k in range(4) for i in range(30) for j in range(3))
