"""store.rebuild(): consume queues and index files rebuilt from the commitlog equal, byte
for byte, what incremental dispatch wrote (ours) and what RocketMQ 4.9.8 wrote (fixture);
the store keeps working afterwards. Recovery reports progress."""
import os

import pytest

from rmqstore import Message, MessageStore, StoreConfig, StoreReadOnlyError

from conftest import CLEAN_498, copy_store


def _cfg():
    return StoreConfig(commitlog_file_size=8192, consume_queue_entries=10, index_slots=64, index_entries=120,
                       flush_interval_ms=10, flush_cq_interval_ms=10, warm_mapped_file=False)


def _files(root, sub):
    """{relative path: bytes} under ``root/sub``."""
    out = {}
    base = os.path.join(root, sub)
    for d, _, names in os.walk(base):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), base)] = f.read()
    return out


def _index_contents(root):
    """Index file contents, oldest first (names are creation times, so they differ)."""
    files = _files(root, "index")
    return [files[k] for k in sorted(files)]


@pytest.fixture
def own(tmp_path):
    """A store written incrementally, in several puts and reopenings (so dispatch ran in
    batches of every size): 3 topics x 3 queues, keys, tags, delayed, PREPARED, ROLLBACK."""
    path = tmp_path / "own"
    for round_ in range(3):
        with MessageStore(path, _cfg()) as s:
            for i in range(round_ * 70, round_ * 70 + 70):
                s.put(Message(f"T{i % 3}", b"v%d" % i * (i % 11 + 1), tags=f"t{i % 4}", keys=[f"k{i}", "hot"]),
                      queue_id=i % 3)
                if i % 25 == 0:
                    s.wait_dispatched()
            s.put(Message("T1", b"delayed", delay_level=2))
            s.put(Message("T2", b"prepared", sys_flag=0x4, keys="p"))
            s.put(Message("T2", b"rolled back", sys_flag=0xC, keys="r"))
    return path


def test_rebuild_equals_incremental_dispatch(own):
    cq, index = _files(own, "consumequeue"), _index_contents(own)
    assert len(index) >= 3 and len(cq) > 9
    seen = []
    with MessageStore(own, _cfg()) as s:
        n = s.rebuild(progress=seen.append)
        assert n == s.max_phy_offset - s.min_phy_offset == sum(seen)
        assert s.verify().ok
    assert _files(own, "consumequeue") == cq
    assert _index_contents(own) == index


def test_store_works_after_rebuild(own):
    with MessageStore(own, _cfg()) as s:
        before = [s.max_offset(f"T{t}", q) for t in range(3) for q in range(3)]
        s.rebuild()
        assert [s.max_offset(f"T{t}", q) for t in range(3) for q in range(3)] == before
        r = s.put(Message("T0", b"after", keys="fresh"), queue_id=2)
        assert r.queue_offset == before[2]
        s.wait_dispatched()
        assert [m.body for m in s.get_messages("T0", 2, r.queue_offset).messages] == [b"after"]
        assert [m.body for m in s.query_by_key("T0", "fresh")] == [b"after"]
    with MessageStore(own, _cfg(), read_only=True) as s:
        rep = s.verify()
        assert rep.ok, rep.problems
        assert s.get_messages("T0", 2, r.queue_offset).messages[0].body == b"after"


def test_rebuild_refused_read_only(own):
    with MessageStore(own, _cfg(), read_only=True) as s:
        with pytest.raises(StoreReadOnlyError):
            s.rebuild()


def test_rebuild_of_rocketmq_store_matches_its_files(tmp_path):
    if not (CLEAN_498 / "store").is_dir():
        pytest.skip("fixture not available")
    src = CLEAN_498 / "store"
    cq, index = _files(src, "consumequeue"), _index_contents(src)
    path = copy_store(src, tmp_path)
    with MessageStore(path, StoreConfig(index_slots=1000, index_entries=4000)) as s:
        s.rebuild()
    assert _files(path, "consumequeue") == cq
    assert _index_contents(path) == index


def test_rebuild_keeps_a_foreign_index_geometry(tmp_path):
    if not (CLEAN_498 / "store").is_dir():
        pytest.skip("fixture not available")
    path = copy_store(CLEAN_498 / "store", tmp_path)
    with MessageStore(path) as s:          # default config: geometry comes from the files
        s.rebuild()
        assert {(f.slots, f.entries) for f in s.index.files} == {(1000, 4000)}


def test_recovery_reports_progress(own):
    open(own / "abort", "wb").close()
    os.unlink(own / "checkpoint")
    seen = []
    with MessageStore(own, _cfg(), progress=seen.append) as s:
        assert len(seen) == s.recovery.segments_scanned == len(s.commitlog.segments.segments)
        assert set(seen) == {8192}
