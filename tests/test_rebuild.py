"""store.rebuild(): consume queues and index files rebuilt from the commitlog equal, byte
for byte, what incremental dispatch wrote (ours) and what RocketMQ 4.9.8 wrote (fixture);
the store keeps working afterwards. Recovery reports progress."""
import json
import os
import shutil

import pytest
from test_cli import run

from rmqstore import (
    CorruptRecordError,
    CorruptStoreError,
    DerivedFileError,
    Message,
    MessageStore,
    StoreConfig,
    StoreNotFoundError,
    StoreReadOnlyError,
)

from conftest import CLEAN_498, copy_store, looping_in_threads, tree_state


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


def _index_file(root):
    return "index/" + min(os.listdir(root / "index"))


def _replace(p, make):
    p.unlink()
    make(p)


def _dir_to_file(p):
    shutil.rmtree(p)
    p.write_bytes(b"x")


CQ = "consumequeue/T0/0/00000000000000000000"
DAMAGE = {   # what a crash, a disk or an operator can leave of a derived file or directory
    "cq cut short": (CQ, lambda p: os.truncate(p, 50)),
    "cq empty": (CQ, lambda p: os.truncate(p, 0)),
    "cq grown": (CQ, lambda p: os.truncate(p, 1000)),
    "cq a directory": (CQ, lambda p: _replace(p, os.mkdir)),
    "cq a FIFO": (CQ, lambda p: _replace(p, os.mkfifo)),
    "cq a symlink": (CQ, lambda p: _replace(p, lambda q: q.symlink_to("/etc/hostname"))),
    "cq file missing": ("consumequeue/T0/0/00000000000000000200", os.unlink),   # a gap
    "queue dir a file": ("consumequeue/T0/0", _dir_to_file),
    "consumequeue a file": ("consumequeue", _dir_to_file),
    "index cut short": ("<index>", lambda p: os.truncate(p, 30)),
    "index grown": ("<index>", lambda p: os.truncate(p, p.stat().st_size + 7)),
    "index a directory": ("<index>", lambda p: _replace(p, os.mkdir)),
    "index a symlink": ("<index>", lambda p: _replace(p, lambda q: q.symlink_to("/etc/hostname"))),
    "index dir a file": ("index", _dir_to_file),
}


def _contents(s):
    """Every queue's messages and a key query's answer, as a store serves them."""
    queues = {(t, q): [(m.phy_offset, m.body) for m in s.get_messages(t, q, 0, 1000).messages]
              for t in ("T0", "T1", "T2") for q in range(3)}
    return queues, sorted(m.phy_offset for m in s.query_by_key("T1", "hot"))


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_derived_file_is_named_and_rebuild_regenerates_it(own, kind):
    """A consume-queue or index file an open cannot use made every open fail, rebuild
    included (it opened the store first), so nothing could repair it. A plain open still
    refuses it, with a DerivedFileError naming the file and the repair; MessageStore(path,
    rebuild=True) and ``rmqstore rebuild --yes`` regenerate both from the commitlog, which
    keeps every byte."""
    with MessageStore(own, _cfg(), read_only=True) as s:
        want = _contents(s)
    commitlog = _files(own, "commitlog")
    rel, damage = DAMAGE[kind]
    path = own / (_index_file(own) if rel == "<index>" else rel)
    damage(path)
    named = str(path.parent if kind == "cq file missing" else path)
    for ro in (False, True):
        with pytest.raises(DerivedFileError, match="rmqstore rebuild") as e:
            MessageStore(own, _cfg(), read_only=ro)
        assert named in str(e.value)
    if rel == "<index>":
        with MessageStore(own, _cfg(), rebuild=True) as s:
            assert _contents(s) == want
    else:
        plan = json.loads(run("rebuild", own, "--json").stdout)
        assert plan["dryRun"] and named in plan["damaged"]
        run("rebuild", own, "--yes", "--cq-entries", "10")   # when no file is left to measure
    with MessageStore(own, _cfg(), read_only=True) as s:
        assert _contents(s) == want and s.verify().ok
    assert _files(own, "commitlog") == commitlog
    assert os.path.exists("/etc/hostname")


def test_rebuild_read_only_reads_only_the_commitlog(own):
    """rebuild=True read-only (the dry run's view) changes nothing and reads no derived file."""
    os.truncate(own / "consumequeue/T0/0/00000000000000000000", 10)
    before = tree_state(own)
    with MessageStore(own, _cfg(), read_only=True, rebuild=True) as s:
        assert s.topics() == [] and s.query_by_key("T1", "hot") == [] and len(list(s.scan())) > 200
    assert tree_state(own) == before


@pytest.mark.parametrize("rel,content", [("checkpoint", None), ("config/consumerOffset.json", b"{garbage"),
                                         ("config/consumerOffset.json", None)])
def test_damaged_checkpoint_or_offsets_error_says_how_to_repair(own, rel, content):
    """A checkpoint or consumer-offset file that cannot be read was a bare error; it now
    says what the file is for and how to repair it (neither is derived from the commitlog
    as consume queues are, so rebuild does not remake them)."""
    p = own / rel
    p.unlink(missing_ok=True)
    p.parent.mkdir(exist_ok=True)
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    with pytest.raises(CorruptStoreError, match="remove it" if rel == "checkpoint" else "backup"):
        MessageStore(own, _cfg())


@pytest.mark.parametrize("name", ["01", "0001", "+1", "-0", "-1", "\u0661"])
def test_a_queue_directory_spelled_another_way_is_refused_and_rebuilt(own, name):
    """Directories ``0001`` and ``1`` both loaded as queue 1, the second one's files
    mapped over the first's (RocketMQ's Integer.parseInt reads them alike). A directory
    name RocketMQ reads as a queue id in another spelling than its decimal one is now a
    DerivedFileError naming both, and rebuild makes the queues again from the commitlog."""
    with MessageStore(own, _cfg(), read_only=True) as s:
        want = _contents(s)
    shutil.copytree(own / "consumequeue/T1/1", own / "consumequeue/T1" / name)
    with pytest.raises(DerivedFileError, match="rmqstore rebuild") as e:
        MessageStore(own, _cfg())
    assert str(own / "consumequeue/T1" / name) in str(e.value)
    if name != "-1":
        assert str(own / "consumequeue/T1" / str(int(name))) in str(e.value)
    with MessageStore(own, _cfg(), rebuild=True) as s:
        assert _contents(s) == want and s.queue_ids("T1") == [1]


@pytest.mark.parametrize("name", ["abc", " 1", "1 ", "2147483648", "99999999999999999999"])
def test_names_that_are_no_queue_id_are_ignored_as_rocketmq_ignores_them(own, name):
    shutil.copytree(own / "consumequeue/T1/1", own / "consumequeue/T1" / name)
    with MessageStore(own, _cfg()) as s:
        assert s.queue_ids("T1") == [1]


@pytest.mark.parametrize("stray", ["consumequeue/.DS_Store", "consumequeue/README", "consumequeue/T1/notes.txt"])
def test_a_stray_file_among_the_queues_is_ignored(own, stray):
    """A file where no queue directory is due (a desktop's .DS_Store, a note) made every
    open fail, read-only ones too; RocketMQ's loadConsumeQueue passes over it, and so do we."""
    with MessageStore(own, _cfg(), read_only=True) as s:
        want = _contents(s)
    (own / stray).write_bytes(b"x")
    for ro in (True, False):
        with MessageStore(own, _cfg(), read_only=ro) as s:
            assert _contents(s) == want


@pytest.mark.parametrize("sub", ["commitlog", "consumequeue/T1/1"])
@pytest.mark.parametrize("name", ["0", "123", "0" * 21, "9" * 20, "\u0661" * 20])
def test_a_segment_named_other_digits_is_refused(own, sub, name):
    """A file of decimal digits that is no 20-digit offset (RocketMQ's Long.parseLong reads
    it as one) was passed over: a renamed commitlog segment's records left out unseen.
    It is a CorruptStoreError naming it (a DerivedFileError in a consume queue)."""
    (own / sub / name).write_bytes(b"\0" * 200)
    with pytest.raises(CorruptStoreError, match="not a segment name") as e:
        MessageStore(own, _cfg(), read_only=True)
    assert str(own / sub / name) in str(e.value)
    assert isinstance(e.value, DerivedFileError) == (sub != "commitlog")


def test_rebuild_never_cuts_the_commitlog(tmp_path):
    """A record damaged in one of the last three segments (recovery checks those after a
    clean shutdown) made a rebuild's open cut the commitlog there, deleting every later
    record with the derived files it was to regenerate. MessageStore(path, rebuild=True)
    and rmqstore rebuild --yes now refuse, changing nothing; recover --yes makes the cut."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        offsets = [s.put(Message("T", b"x" * 100)).phy_offset for _ in range(300)]
    victim = offsets[-20]
    seg = victim - victim % 8192
    with open(root / "commitlog" / f"{seg:020d}", "r+b") as f:
        f.seek(victim - seg + 4)
        f.write(b"\0\0\0\0")   # its magic code
    before = tree_state(root)
    with pytest.raises(CorruptRecordError, match="recover") as e:
        MessageStore(root, _cfg(), rebuild=True)
    assert e.value.offset == victim and tree_state(root) == before
    assert "recover" in run("rebuild", root, "--yes", expect=1).stderr and tree_state(root) == before


@pytest.mark.parametrize("read_only", [False, True])
def test_rebuild_of_a_directory_that_is_no_store_removes_nothing(tmp_path, read_only):
    """``MessageStore(path, rebuild=True)`` on a directory with no commitlog/ (a mistyped
    path, a web root with an ``index/``) removed its ``consumequeue/`` and ``index/`` with
    everything in them, and made a new store there. Now it is a StoreNotFoundError and the
    directory is left exactly as it was (no lock, checkpoint or commitlog/ made)."""
    d = tmp_path / "site"
    (d / "index").mkdir(parents=True)
    (d / "index" / "page.html").write_text("precious")
    (d / "consumequeue" / "T").mkdir(parents=True)
    (d / "consumequeue" / "T" / "notes").write_text("mine")
    before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    with pytest.raises(StoreNotFoundError, match="not a store to rebuild"):
        MessageStore(d, rebuild=True, read_only=read_only)
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == before
    assert (d / "index" / "page.html").read_text() == "precious"


def _keyed_store(path, n=300):
    s = MessageStore(path, StoreConfig(commitlog_file_size=1 << 18, consume_queue_entries=500, index_slots=1000,
                                       index_entries=4000, warm_mapped_file=False))
    for i in range(n):
        s.put(Message("T", b"x%d" % i, keys=[f"k{i}"]), queue_id=i % 3)
    s.wait_dispatched()
    return s


def test_methods_taken_before_a_rebuild_keep_reading(tmp_path):
    """get_messages and query_by_key are C methods bound to the consume queues and index;
    a rebuild made new ones and bound new methods, so one taken before (``get =
    store.get_messages``) raised StoreClosedError on every call after the rebuild, and
    query_by_key answered [] for a stored key. Now the rebuild rebinds the same readers."""
    with _keyed_store(tmp_path / "s") as s:
        get, by_key = s.get_messages, s.query_by_key
        s.rebuild()
        assert len(get("T", 0, 0, 32).messages) == 32
        assert [m.body for m in by_key("T", "k7")] == [b"x7"]


def test_reads_racing_a_rebuild_never_find_the_store_closed(tmp_path):
    """Reads of consume queues and the index in other threads while rebuilds run: a read
    that met a file the rebuild had just closed raised StoreClosedError ("segment is
    closed", "index is closed") on a store still open. Now such a read runs again on the
    rebuild's new files: no StoreError at all, and every message reads back after."""
    import time

    with _keyed_store(tmp_path / "s") as s:
        get, by_key = s.get_messages, s.query_by_key
        reads = [lambda: get("T", 1, 5, 32), lambda: by_key("T", "k9"), lambda: s.query_offsets("T", "k9"),
                 lambda: s.query_keys("T", ["k1", "k2"]), lambda: s.query_keys_columns("T", ["k1"]),
                 lambda: s.read_queue_columns("T", 0, 0, 50), lambda: s.consume_queue_entries("T", 1, 0, 50),
                 lambda: s.offset_by_time("T", 2, int(time.time() * 1000)), lambda: s.min_offset("T", 1)]
        with looping_in_threads(reads) as errors:
            for _ in range(15):
                s.rebuild()
        assert errors == []
        assert [s.max_offset("T", q) for q in range(3)] == [100] * 3
        assert [len(s.get_messages("T", q, 68, 32).messages) for q in range(3)] == [32] * 3
        assert [m.body for m in s.query_by_key("T", "k299")] == [b"x299"]


def test_a_read_run_again_after_a_rebuild_reads_a_generator_of_keys_whole(tmp_path):
    """A read that met files a rebuild closed runs again; keys given as a generator were
    used up by the first run, so the second answered for no key at all. Keys are now taken
    as a list before the first run."""
    from rmqstore import StoreClosedError
    with _keyed_store(tmp_path / "s") as s:
        real, calls = s._index_or_raise, []

        class Closing:   # an index a rebuild closes while the query walks it
            class view:
                @staticmethod
                def query_many(topic, keys, *args):
                    list(keys)
                    s._gate.generation += 2
                    raise StoreClosedError("index is closed")

        def closed_once():
            calls.append(1)
            return Closing if len(calls) == 1 else real()
        s._index_or_raise = closed_once
        found = s.query_keys("T", (k for k in ["k3", "k4"]))
        assert [[m.body for m in ms] for ms in found] == [[b"x3"], [b"x4"]] and len(calls) == 2
