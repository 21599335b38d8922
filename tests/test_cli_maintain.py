"""rmqstore verify / clean / rebuild / recover, run in subprocesses against the RocketMQ 4.9.8
fixture (copied where the command writes, or damaged) and stores written here."""
import json
import os
import shutil
import time

import pytest
from test_cli import error_line, run

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.maintenance.retention import disk_used_ratio

from conftest import CLEAN_498, copy_store, tree_state

NOON = time.mktime((2026, 1, 15, 12, 0, 0, 0, 0, -1))      # local noon: not a deleteWhen ("04") hour


@pytest.fixture(scope="module")
def fixture_store():
    if not (CLEAN_498 / "store").is_dir():
        pytest.skip("fixture not available")
    return CLEAN_498 / "store"


def _files(root, sub):
    out = {}
    for d, _, names in os.walk(os.path.join(root, sub)):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), root)] = f.read()
    return out


def _flip_body_byte(store, offset):
    """Flip the last body byte of the record at commitlog ``offset``."""
    with MessageStore(store, read_only=True) as s:
        m = s.get_by_offset(offset)
        body_end = m.raw().find(m.body) + len(m.body)
        seg_size = s.commitlog.segments.file_size
    with open(os.path.join(store, "commitlog", f"{offset - offset % seg_size:020d}"), "r+b") as f:
        f.seek(offset % seg_size + body_end - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("name", ["verify", "clean", "rebuild"])
def test_help(name):
    assert run(name, "--help").stdout.startswith("usage: rmqstore " + name)


def test_verify_fixture_ok_and_unchanged(fixture_store):
    before = tree_state(fixture_store)
    rep = json.loads(run("verify", fixture_store, "--json").stdout)
    assert rep["ok"] and rep["problems"] == [] and rep["records"] == 5000
    assert run("verify", fixture_store).stdout.rstrip().endswith("ok")
    assert tree_state(fixture_store) == before


@pytest.mark.parametrize("nth", [100, -3], ids=["early-segment", "last-segments"])
def test_verify_damaged_copy_names_the_offset(tmp_path, fixture_store, nth):
    from conftest import load_manifest
    msgs = [m for m in load_manifest(str(CLEAN_498))["messages"] if m["bodyLength"] >= 16]
    offset = msgs[nth]["commitLogOffset"]
    store = copy_store(fixture_store, tmp_path)
    _flip_body_byte(store, offset)
    p = run("verify", store, "--json", expect=3)
    rep = json.loads(p.stdout)
    assert not rep["ok"]
    assert [(x["kind"], x["offset"]) for x in rep["problems"]] == [("commitlog", offset)]
    assert "CRC" in rep["problems"][0]["message"]
    human = run("verify", store, expect=3).stdout
    assert f"record at commitlog offset {offset}: body CRC mismatch" in human and "1 problem(s)" in human


def test_verify_bad_paths_and_arguments(tmp_path):
    assert "no such store directory" in error_line(run("verify", tmp_path / "nope", expect=1))
    (tmp_path / "plain").mkdir()
    assert "not a RocketMQ store" in error_line(run("verify", tmp_path / "plain", expect=1))
    run("verify", expect=2)
    assert "--now" in error_line(run("clean", tmp_path, "--now", "yesterday", expect=2))


def _own_store(path):
    cfg = StoreConfig(commitlog_file_size=4096, consume_queue_entries=10, index_slots=64, index_entries=256,
                      warm_mapped_file=False)
    with MessageStore(path, cfg) as s:
        for i in range(80):
            s.put(Message("T", b"m%d" % i * 20, keys=f"k{i}"), queue_id=i % 2)
        size, n = s.commitlog.segments.file_size, len(s.commitlog.segments.segments)
    old = NOON - 100 * 3600
    for f in (path / "commitlog").iterdir():
        os.utime(f, (old, old))
    return size, n


def test_clean_deletes_expired_segments_with_force(tmp_path):
    store = tmp_path / "own"
    size, n = _own_store(store)
    assert n > 3
    if disk_used_ratio(tmp_path) < StoreConfig().disk_max_used_space_ratio:
        rep = json.loads(run("clean", store, "--now", NOON, "--json").stdout)
        assert (rep["reason"], rep["segmentsDeleted"]) == ("", 0)      # not a deleteWhen hour
    rep = json.loads(run("clean", store, "--now", NOON, "--force", "--yes", "--json").stdout)
    assert rep["segmentsDeleted"] == min(10, n - 1) and rep["bytesFreed"] == rep["segmentsDeleted"] * size
    assert rep["minPhyOffset"] == rep["segmentsDeleted"] * size
    assert len(os.listdir(store / "commitlog")) == n - rep["segmentsDeleted"]
    assert json.loads(run("verify", store, "--json").stdout)["ok"]


def test_clean_keeps_what_is_younger_than_the_reserved_time(tmp_path):
    store = tmp_path / "own"
    _own_store(store)
    rep = json.loads(run("clean", store, "--now", NOON, "--force", "--reserved-hours", "200", "--yes", "--json").stdout)
    if rep["reason"] == "time":
        assert rep["segmentsDeleted"] == 0


def test_clean_refuses_a_locked_store(tmp_path):
    store = tmp_path / "own"
    _own_store(store)
    with MessageStore(store):
        assert "another process" in error_line(run("clean", store, "--force", "--yes", expect=1))


@pytest.mark.parametrize("cq", ["zeroed", "removed"])
def test_rebuild_fixture_copy_gives_rocketmqs_files(tmp_path, fixture_store, cq):
    store = copy_store(fixture_store, tmp_path)
    for f in [*(store / "index").iterdir(), *(store / "consumequeue").glob("*/*/*")]:
        f.write_bytes(b"\0" * f.stat().st_size)        # emptied: rebuild must not care
    if cq == "removed":                                 # nothing to measure the CQ file size on
        shutil.rmtree(store / "consumequeue")
    extra = ["--cq-entries", "100"] if cq == "removed" else []
    rep = json.loads(run("rebuild", store, "--yes", "--json", *extra).stdout)
    assert rep["consumeQueueEntries"] == 4980 and rep["indexEntries"] == 14902
    assert rep["bytesDispatched"] == 9106243
    assert _files(store, "consumequeue") == _files(fixture_store, "consumequeue")
    ours = _files(store, "index")
    theirs = _files(fixture_store, "index")
    assert [ours[k] for k in sorted(ours)] == [theirs[k] for k in sorted(theirs)]
    assert json.loads(run("verify", store, "--json").stdout)["ok"]


def test_recover_damaged_copy_then_verify(tmp_path, fixture_store):
    from conftest import load_manifest
    last = load_manifest(str(CLEAN_498))["messages"][-2]["commitLogOffset"]
    store = copy_store(fixture_store, tmp_path)
    _flip_body_byte(store, last)
    assert run("verify", store, expect=3)
    # the broker shut down cleanly, so the message after the damaged one was durable: a
    # plain writer refuses the store instead of cutting it; the dry run says so
    before = tree_state(store)
    refused = error_line(run("put", store, stdin='{"topic": "T", "body": "x"}\n', expect=1))
    assert f"cut the commitlog at offset {last}" in refused and "recover --yes" in refused
    assert json.loads(run("recover", store, "--json").stdout)["cutsDurableData"]
    assert tree_state(store) == before
    rep = json.loads(run("recover", store, "--yes", "--json").stdout)
    assert rep["endOffset"] == last and rep["commitlogBytesTruncated"] > 0
    # the commitlog, CQs and index agree again, and the checkpoint no longer counts the cut
    # messages as flushed (the fixture's logicsMsgTimestamp was the newest message's time)
    rep = json.loads(run("verify", store, "--json").stdout)
    assert rep["problems"] == []


def test_clean_is_a_dry_run_unless_told(tmp_path):
    """Plain ``clean`` changes no byte and names what it would delete; ``--yes`` then deletes
    exactly those segments."""
    store = tmp_path / "own"
    _own_store(store)
    before = tree_state(store)
    plan = json.loads(run("clean", store, "--now", NOON, "--force", "--json").stdout)
    assert plan["dryRun"] and plan["segmentsDeleted"] == len(plan["segments"]) > 0
    assert tree_state(store) == before
    text = run("clean", store, "--now", NOON, "--force").stdout
    assert "--yes" in text and all(f"would delete {p}" in text for p in plan["segments"])
    done = json.loads(run("clean", store, "--now", NOON, "--force", "--yes", "--json").stdout)
    assert not done["dryRun"] and done["segments"] == plan["segments"]
    assert done["minPhyOffset"] == plan["minPhyOffset"]
    assert not any(os.path.exists(p) for p in plan["segments"])


def test_rebuild_and_recover_are_dry_runs_unless_told(tmp_path, fixture_store):
    from conftest import load_manifest
    last = load_manifest(str(CLEAN_498))["messages"][-2]["commitLogOffset"]
    store = copy_store(fixture_store, tmp_path)
    _flip_body_byte(store, last)
    (store / "abort").write_bytes(b"")                       # as a crashed broker leaves it
    before = tree_state(store)
    plan = json.loads(run("rebuild", store, "--json").stdout)
    assert plan["dryRun"] and plan["bytesToDispatch"] == last and plan["consumeQueueEntries"] > 4900
    assert "--yes" in run("rebuild", store).stdout
    predicted = json.loads(run("recover", store, "--json").stdout)
    assert predicted["dryRun"] and predicted["endOffset"] == last
    assert "--yes" in run("recover", store).stdout
    assert tree_state(store) == before
    done = json.loads(run("recover", store, "--yes", "--json").stdout)
    assert not done["dryRun"] and done["endOffset"] == predicted["endOffset"]
    assert done["commitlogBytesTruncated"] == predicted["commitlogBytesTruncated"] > 0


def test_disk_ratio_is_computed_as_df_does(tmp_path, monkeypatch):
    """Root-reserved blocks are neither used nor available: 700 used, 250 available to users
    (50 more free only for root) is 700 / 950 = 73.7%, not 70% or 75%."""
    import subprocess
    from types import SimpleNamespace

    import rmqstore.maintenance.retention as retention
    real = retention.disk_used_ratio(str(tmp_path))
    df = subprocess.run(["df", "--output=pcent", str(tmp_path)], capture_output=True, text=True)
    if df.returncode == 0:                              # df rounds up to a whole percent
        pcent = int(df.stdout.split()[-1].rstrip("%"))
        assert pcent - 1 <= real <= pcent + 0.5
    fake = SimpleNamespace(f_blocks=1000, f_bfree=300, f_bavail=250, f_frsize=4096)
    monkeypatch.setattr(retention.os, "statvfs", lambda path: fake)
    assert abs(retention.disk_used_ratio("/x") - 100 * 700 / 950) < 1e-9
