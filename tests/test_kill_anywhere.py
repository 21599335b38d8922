"""Operator and lifecycle steps SIGKILLed at chosen points (the k-th file removal, the k-th
progress call), then the store reopened and checked against what was put: every message
there, every consume queue and key lookup agreeing with the commitlog."""
import os
import random
import shutil
import signal
import subprocess
import sys

import pytest

import rmqstore
from rmqstore import Message, MessageStore, StoreConfig

CFG = dict(commitlog_file_size=8192, consume_queue_entries=8, index_slots=16, index_entries=64)
N = 240
TOPICS = ("TA", "TB")

# Runs argv[2] (the step) on the store argv[1], SIGKILLing itself at the argv[3]-th call of
# os.unlink / os.rmdir (argv[4] "unlink") or of the progress callback (argv[4] "progress").
KILLER = r"""
import os, signal, sys
from rmqstore import MessageStore, StoreConfig
path, step, at, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cfg = StoreConfig(commitlog_file_size=8192, consume_queue_entries=8, index_slots=16, index_entries=64)
calls = 0
def tick(*_):
    global calls
    calls += 1
    if calls == at:
        os.kill(os.getpid(), signal.SIGKILL)
def killing(real):
    def f(*a, **kw):
        tick()
        return real(*a, **kw)
    return f
if where == "unlink":
    os.unlink, os.rmdir = killing(os.unlink), killing(os.rmdir)
progress = tick if where == "progress" else None
if step == "rebuild-open":
    MessageStore(path, cfg, rebuild=True, progress=progress).close()
elif step == "rebuild":
    with MessageStore(path, cfg) as s:
        s.rebuild(progress)
elif step == "repair":
    MessageStore(path, cfg, repair=True).close()
elif step == "clean":
    with MessageStore(path, cfg.with_(delete_when=";".join("%02d" % h for h in range(24)),
                                      file_reserved_time=0)) as s:
        s.clean_expired(now=4e9)
print(calls)
"""


def _body(i):
    r = random.Random(i)
    return b"m%d:" % i + r.randbytes(r.randrange(300))


def _topic(i):
    return TOPICS[i % 3 == 0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("kill") / "base"
    with MessageStore(path, StoreConfig(flush_mode="sync", **CFG)) as s:
        for i in range(N):
            s.put(Message(_topic(i), _body(i), keys=[f"k{i}"]), i % 2)
    return path


def _kill_at(path, step, at, where):
    """Run ``step`` on ``path`` until the ``at``-th call; returns the calls it made when
    it ran to the end (None when killed)."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
    p = subprocess.run([sys.executable, "-c", KILLER, str(path), step, str(at), where], capture_output=True,
                       text=True, env=env, timeout=60)
    if p.returncode == -signal.SIGKILL:
        return None
    assert p.returncode == 0, p.stderr
    return int(p.stdout)


def _check(path, suffix=False):
    """Reopened as a writer: all N messages (``suffix``: the last ones, some old segments
    deleted), queues and index agree with the commitlog."""
    with MessageStore(path, StoreConfig(**CFG)) as s:
        msgs = list(s.scan(check_crc=True))
        first = int(bytes(msgs[0].body).split(b":")[0][1:]) if suffix else 0
        assert [bytes(m.body) for m in msgs] == [_body(i) for i in range(first, N)], s.recovery
        for t in TOPICS:
            for q in (0, 1):
                want = [(m.phy_offset, m.store_size) for m in msgs if (m.topic, m.queue_id) == (t, q)]
                got = [(int(e["phy_offset"]), int(e["size"])) for e in s.consume_queue_entries(t, q)]
                assert got == want, (t, q, len(got), len(want))
                head = [m.phy_offset for m in s.get_messages(t, q, s.min_offset(t, q)).messages]
                assert head == [p for p, _ in want[:len(head)]] and (head or not want), (t, q)
        for i in range(first, N, 7):
            assert [bytes(m.body) for m in s.query_by_key(_topic(i), f"k{i}")] == [_body(i)], i
        assert s.verify().ok


@pytest.mark.parametrize("step", ["rebuild-open", "rebuild"])
def test_rebuild_killed_anywhere(built, tmp_path, step):
    """A rebuild killed while it removed consumequeue/ and index/ (files gone in listing
    order: a queue's first files without its later ones, one topic but not the other)
    or while it dispatched again: the next plain open found no abort file (rebuild
    --yes opens a cleanly closed store) or a checkpoint that counted every queue as
    durable, took the remains for whole and never dispatched again what was gone (a queue
    empty, keys not found)."""
    total = _kill_at(shutil.copytree(built, tmp_path / "full"), step, 0, "unlink")
    steps = [("unlink", k) for k in range(1, total, max(1, total // 6))] + [("progress", 2), ("progress", 5)]
    for n, (where, at) in enumerate(steps):
        path = shutil.copytree(built, tmp_path / f"s{n}")
        assert _kill_at(path, step, at, where) is None, (where, at)
        _check(path)


def test_clean_killed_anywhere(built, tmp_path):
    """Retention killed after deleting commitlog segments and before (or while) deleting
    the consume-queue files that point into them: the reopened queue began at its second
    file (correct_min_offset looked at the first file only), at entries pointing into
    deleted segments, so get_messages from min_offset found nothing."""
    total = _kill_at(shutil.copytree(built, tmp_path / "full"), "clean", 0, "unlink")
    for at in range(2, total, 3):
        path = shutil.copytree(built, tmp_path / f"s{at}")
        assert _kill_at(path, "clean", at, "unlink") is None, at
        _check(path, suffix=True)


SPARK_COMMIT = r"""
import os, signal, sys
import pyarrow as pa
from rmqstore.spark.writer import StoreWriter
out, at, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
calls = 0
def killing(real):
    def f(*a, **kw):
        global calls
        calls += 1
        if calls == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **kw)
    return f
w = StoreWriter(out, {"commitlogFileSize": "8192", "indexSlots": "16", "indexEntries": "64"}, True)
rows = lambda p: pa.RecordBatch.from_pydict({"topic": ["T"] * 20, "body": [b"%s:%d:%d" % (job.encode(), p, i)
                                                                          for i in range(20)]})
msgs = [w.write(iter([rows(p)])) for p in range(3)]
os.unlink, os.rmdir, os.replace, os.rename = map(killing, (os.unlink, os.rmdir, os.replace, os.rename))
w.commit(msgs)
print(calls)
"""


def _spark_commit(out, at, job):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
    p = subprocess.run([sys.executable, "-c", SPARK_COMMIT, str(out), str(at), job], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode in (0, -signal.SIGKILL), p.stderr
    return int(p.stdout) if p.returncode == 0 else None


def test_spark_overwrite_commit_killed_anywhere(tmp_path):
    """The Spark writer's commit (mode overwrite) killed at each file removal or rename:
    every part-* store there is whole (one job's 20 messages), and a ``_SUCCESS`` names
    exactly the stores there. An earlier store was deleted in place (killed, it stayed
    half there: a store of 0 messages), and the earlier job's ``_SUCCESS`` stood while
    its stores went and the new ones came."""
    pytest.importorskip("pyspark")
    import json
    _spark_commit(tmp_path / "old", 0, "old")
    total = _spark_commit(shutil.copytree(tmp_path / "old", tmp_path / "full"), 0, "new")
    for at in range(1, total, max(1, total // 8)):
        out = shutil.copytree(tmp_path / "old", tmp_path / f"o{at}", symlinks=True)
        assert _spark_commit(out, at, "new") is None
        parts = sorted(d for d in os.listdir(out) if d.startswith("part-"))
        for d in parts:
            with MessageStore(out / d, read_only=True) as s:
                assert [int(bytes(m.body).split(b":")[2]) for m in s.scan(check_crc=True)] == list(range(20)), (at, d)
        if (out / "_SUCCESS").exists():
            assert sorted(json.loads((out / "_SUCCESS").read_text())["stores"]) == parts, at


def test_spark_rebuild_into_the_store_stopped_part_way(built, tmp_path, monkeypatch):
    """jobs.rebuild into the store itself (its consumequeue/ and index/ removed first)
    stopped after writing some queues (a stand-in for the kill: the job's work raises
    half done): the store had no abort file and a checkpoint counting the old queues
    durable, so the next open took the queues written for all (TB's never came back)."""
    pytest.importorskip("pyspark")
    from rmqstore.spark import jobs
    path = shutil.copytree(built, tmp_path / "s")
    shutil.rmtree(path / "consumequeue")
    shutil.rmtree(path / "index")

    def half(spark, store, out_dir, cfg, t0):
        shutil.copytree(built / "consumequeue" / "TA", path / "consumequeue" / "TA")
        raise RuntimeError("killed")
    monkeypatch.setattr(jobs, "_rebuild", half)
    with pytest.raises(RuntimeError):
        jobs.rebuild(None, str(path), config=StoreConfig(**CFG))
    _check(path)


@pytest.mark.parametrize("gone", ["removed", "recreated"])
def test_read_only_open_beside_a_rebuild(built, tmp_path, monkeypatch, gone):
    """A read-only open while a live writer's rebuild removes a queue's files (newest
    first) and makes them again: files it listed are gone, or there again empty, before
    it opens them. It raised DerivedFileError (a file missing in the middle, or "0 bytes,
    expected 160"); it now reads the run of files before them (queue entries that are a
    prefix of the queue's messages)."""
    from rmqstore import segments
    path = shutil.copytree(built, tmp_path / "s")
    real = segments.list_segment_files
    queue = str(path / "consumequeue" / "TA" / "0")

    def listing(directory):
        files = real(directory)
        if directory == queue:
            os.unlink(files[-1][1])
            if gone == "removed":
                os.unlink(files[-2][1])
            else:
                os.truncate(files[-2][1], 0)
        return files
    monkeypatch.setattr(segments, "list_segment_files", listing)
    with MessageStore(path, StoreConfig(**CFG), read_only=True) as s:
        want = [(m.phy_offset, m.store_size) for m in s.scan() if (m.topic, m.queue_id) == ("TA", 0)]
        got = [(int(e["phy_offset"]), int(e["size"])) for e in s.consume_queue_entries("TA", 0)]
    assert 0 < len(got) < len(want) and got == want[:len(got)]


def test_repair_killed_anywhere(built, tmp_path):
    """``rmqstore recover --yes`` (repair) cutting the commitlog at a damaged record, killed
    while it deleted the files after the cut: they went oldest first, so a kill left a gap
    ("starts at 57344, expected 49152 (missing segment)") that no open, not even the
    repair again, accepted. Now newest first: the repair run again finishes the cut."""
    base = shutil.copytree(built, tmp_path / "base")
    with MessageStore(base, StoreConfig(**CFG), read_only=True) as s:   # a record in the last 3 segments
        bad = next(m for m in s.scan() if m.phy_offset > s.max_phy_offset - 2 * 8192)
        keep = [bytes(m.body) for m in s.scan(to_offset=bad.phy_offset)]
    seg = bad.phy_offset // 8192 * 8192
    with open(base / "commitlog" / f"{seg:020d}", "r+b") as f:
        f.seek(bad.phy_offset - seg + bad.store_size - 30)
        f.write(b"\xff\xfe")
    total = _kill_at(shutil.copytree(base, tmp_path / "full"), "repair", 0, "unlink")
    for at in range(1, total):
        path = shutil.copytree(base, tmp_path / f"s{at}")
        assert _kill_at(path, "repair", at, "unlink") is None, at
        with MessageStore(path, StoreConfig(**CFG), repair=True) as s:
            msgs = list(s.scan(check_crc=True))
            assert [bytes(m.body) for m in msgs] == keep, at
            for t in TOPICS:
                assert [int(e["phy_offset"]) for e in s.consume_queue_entries(t, 0)] == \
                    [m.phy_offset for m in msgs if (m.topic, m.queue_id) == (t, 0)], at


def test_export_over_an_earlier_one_stopped_while_deleting_it(built, tmp_path, monkeypatch):
    """jobs.export replacing an earlier export, killed while it deleted the earlier files
    (a stand-in: the deletion stops after one file): the earlier ``_SUCCESS`` stood over
    what was left of them. It now goes first."""
    pytest.importorskip("pyspark")
    from types import SimpleNamespace

    from rmqstore.spark import jobs
    out = tmp_path / "out"
    day = out / "topic=TA" / "date=2026-01-01"
    day.mkdir(parents=True)
    for n in range(3):
        (day / f"part-00000-{n}.parquet").write_bytes(b"x")
    (out / "_SUCCESS").write_bytes(b"")

    def killed(path, *a, **kw):
        os.unlink(day / "part-00000-0.parquet")
        raise KeyboardInterrupt
    monkeypatch.setattr(jobs.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        jobs.export(SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=1)), [str(built)], str(out))
    assert not (out / "_SUCCESS").exists()


def test_index_file_killed_while_created(built, tmp_path):
    """A kill between creating the next index file and sizing it (cext's create: open
    O_EXCL, then ftruncate) left an empty file as the newest: every writer open refused
    it (DerivedFileError "0 bytes fits neither 16 slots / 64 entries ..."). A writer now
    removes it, as it removes such a commitlog or consume-queue file (read-only opens
    already left it out)."""
    path = shutil.copytree(built, tmp_path / "s")
    newest = path / "index" / "29991231235959999"
    newest.write_bytes(b"")
    (path / "abort").write_bytes(b"")
    with MessageStore(path, StoreConfig(**CFG), read_only=True) as s:
        assert [bytes(m.body) for m in s.query_by_key("TA", "k1")] == [_body(1)]
    _check(path)
    assert not newest.exists()
