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
