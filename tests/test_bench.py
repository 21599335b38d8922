"""rmqstore.bench: a tiny run of the standard workload counts every message on every system
(and every key looked up finds its one message)."""
import pytest

from rmqstore import StoreConfig, bench

from conftest import SMALL_INDEX

SMALL = StoreConfig(commitlog_file_size=1 << 20, consume_queue_entries=1000, **SMALL_INDEX)


def test_run_counts(tmp_path):
    lines = []
    rows = bench.run(tmp_path, messages=200, body_size=16, config=SMALL, out=lines.append)
    names = {r[0] for r in rows}
    assert {"rmqstore", "sqlite3", "struct+mmap"} <= names
    for name, kind, _label, count, _seconds, nbytes in rows:
        assert count == 200, (name, kind)
        if kind != "dispatch":
            assert nbytes == 200 * 16, (name, kind)
    kinds = [(r[0], r[1]) for r in rows if r[0] == "rmqstore"]
    assert kinds == [("rmqstore", k) for k in ("write", "dispatch", "read", "scan", "lookup", "lookup_batch",
                                                       "lookup_columns")]
    assert "lookup" in {r[1] for r in rows if r[0] == "sqlite3"}
    assert "200 messages x 16 B" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_run_put_batch_rmqstore_only(tmp_path):
    rows = bench.run(tmp_path, messages=100, body_size=8, batch=32, peers=False, config=SMALL, out=None)
    assert {r[0] for r in rows} == {"rmqstore"}
    assert rows[0][2] == "put_batch(32)" and all(r[3] == 100 for r in rows)


def test_struct_mmap_peer_writes_rocketmq_records(tmp_path):
    from rmqstore import _read
    peer = bench.StructMmap(str(tmp_path / "s"))
    peer.write(peer.prepare(bench.workload(3, 10)))
    try:
        m = _read.decode_bytes(bytes(peer.map[:peer.pos]), 0, True)
        assert (m.topic, m.queue_id, m.tags, m.keys, len(m.body)) == ("bench", 0, "TagA", ["key-0"], 10)
    finally:
        peer.close()


@pytest.mark.slow   # asv builds its environment and runs a suite: about 30 s
def test_asv_run_and_publish_from_a_clean_tree(tmp_path):
    """The documented asv sequence (asv_bench/README.md) ends in a site with results: run with
    ``--set-commit-hash`` (results of an ``existing`` environment are kept only with it), then
    publish. Results and site go to a temporary directory, not the tree."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    asv = shutil.which("asv", path=os.path.dirname(sys.executable))
    conf = json.load(open(os.path.join(root, "asv_bench", "asv.conf.json")))
    conf.update(repo=root, benchmark_dir=os.path.join(root, "asv_bench", "benchmarks"),
                results_dir=str(tmp_path / "results"), html_dir=str(tmp_path / "html"),
                env_dir=str(tmp_path / "env"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        import pytest
        pytest.skip("not a git checkout (asv needs a commit to file results under)")
    with open(asv, errors="replace") as f:      # asv runs the benchmarks with the python it is installed in
        interp = f.readline()[2:].split() or [sys.executable]
    where = subprocess.run([*interp, "-c", "import rmqstore; print(rmqstore.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True).stdout.strip()
    if not where.startswith(os.path.join(root, "rmqstore")):
        import pytest
        pytest.skip(f"asv's python imports another rmqstore ({where}), not this tree")
    common = dict(cwd=tmp_path, capture_output=True, text=True, timeout=300)
    subprocess.run([asv, "machine", "--yes"], **common)
    p = subprocess.run([asv, "run", "--quick", "--python=same", "--set-commit-hash", head.stdout.strip(),
                        "--bench", "append.Put"], **common)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([asv, "publish"], **common)
    assert p.returncode == 0, p.stdout + p.stderr
    graphs = list((tmp_path / "html" / "graphs").rglob("append.Put.time_put.json"))
    assert graphs and json.loads(graphs[0].read_text()), "published site has no results"


def test_latency_percentiles_by_hand():
    from rmqstore import latency
    p = latency.percentiles(range(1000, 101_000, 1000))   # 1..100 µs
    assert (p["p50"], p["max"], p["calls"]) == (50.5, 100.0, 100)
    assert abs(p["p99"] - 99.01) < 1e-9 and abs(p["p99.9"] - 99.901) < 1e-9


def test_latency_run_times_every_call(tmp_path):
    from rmqstore import latency
    results = latency.run(str(tmp_path), messages=3000, body_size=100, sync_messages=16, segment=64 << 10)
    assert list(results) == ["put async", "put async at rollover", "get_messages(1)",
                             "put SYNC, 1 thread(s)", "put SYNC, 8 thread(s)"]
    assert results["put async"]["calls"] == 3000 and results["put SYNC, 8 thread(s)"]["calls"] == 16
    from rmqstore import MessageStore
    work, = tmp_path.iterdir()      # a directory of its own inside the one given
    with MessageStore(work / "async", read_only=True) as s:
        segments_used = {m.phy_offset // (64 << 10) for m in s.scan()}
    assert results["put async at rollover"]["calls"] == len(segments_used) - 1 > 0
    for p in results.values():
        assert 0 < p["p50"] <= p["p99"] <= p["p99.9"] <= p["max"]
    assert "p99.9 µs" in latency.format_table(results).splitlines()[0]
    one, eight = (results[f"put SYNC, {n} thread(s)"]["msg/s"] for n in (1, 8))
    assert one > 0 and eight > 0 and latency.sync_scaling(results) == eight / one
    assert latency.format_table(results).splitlines()[-1] == \
        f"put SYNC throughput, 8 threads / 1 thread: {eight / one:.2f}x"


@pytest.mark.parametrize("peer", ["rmqstore", "sqlite3 WAL"])
def test_end_to_end_row_times_every_message_in_order(tmp_path, peer):
    """A writer process at 2000 msg/s for 0.25 s, a reader process following: every message
    arrives, in order (the reader raises otherwise), each timed from its due time; the first
    5% are warm-up."""
    from rmqstore import end_to_end, latency
    p = end_to_end.run_one(peer, str(tmp_path), 2000, 60, 0.25)
    assert p["calls"] == 500 - 25
    assert 0 < p["p50"] <= p["p99"] <= p["p99.9"] <= p["p99.99"] <= p["max"]
    assert "p99.99 µs" in latency.format_table({"end to end, 2k/s, 60 B": p}).splitlines()[0]


def test_work_directories_leave_what_is_there_alone(tmp_path, capsys):
    """--dir names where the bench, latency and demo work, not what they may remove or write
    into: the bench removed DIR/rmqstore, DIR/lmdb... (a checkout named rmqstore, say), the
    latency run wrote into a store at DIR/async, the demo appended to DIR/broker-0. Bench and
    latency now work in a new directory inside DIR; the demo takes only a new or empty one."""
    import pytest

    from rmqstore import Message, MessageStore, latency
    from rmqstore.spark import demo
    (tmp_path / "rmqstore").mkdir()
    (tmp_path / "rmqstore" / "keep").write_text("mine")
    bench.run(tmp_path, messages=50, body_size=8, config=SMALL, out=None)
    assert [p.name for p in tmp_path.iterdir()] == ["rmqstore"]
    assert (tmp_path / "rmqstore" / "keep").read_text() == "mine"
    with MessageStore(tmp_path / "async", SMALL) as s:
        s.put(Message("T", b"only"))
    latency.run(str(tmp_path), messages=100, body_size=8, sync_messages=4, segment=64 << 10)
    with MessageStore(tmp_path / "async", SMALL, read_only=True) as s:
        assert [m.body for m in s.scan()] == [b"only"]
    with pytest.raises(SystemExit) as e:
        demo.main(["--dir", str(tmp_path), "--stores", "1", "--messages", "10"])
    assert e.value.code == 2 and "new or empty" in capsys.readouterr().err
    assert not (tmp_path / "broker-0").exists()


@pytest.mark.parametrize("counts", [dict(messages=5), dict(messages=-1), dict(sync_messages=0), dict(body_size=-1)])
def test_latency_counts_that_cannot_run_are_invalid_arguments(tmp_path, counts):
    """latency.run(messages=5) (fewer than its 8 queues) died in random.randrange with a
    bare ValueError, after making its stores; now an InvalidArgumentError, nothing made."""
    from rmqstore import InvalidArgumentError, latency
    with pytest.raises(InvalidArgumentError, match="at least 8 messages"):
        latency.run(str(tmp_path), **{"messages": 100, "sync_messages": 2, **counts})
    assert list(tmp_path.iterdir()) == []
