"""rmqstore put: a dump/put round trip over the RocketMQ fixtures, and chunks that are all or
nothing (a refused input stores none of its chunk, and leaves no new store behind)."""
import json
import os
import subprocess
import sys

import pytest
from test_cli import ENV, error_line, put, run, run_json

from conftest import copy_store

# What a store assigns when it writes a record: differs after a round trip by design.
ASSIGNED = {"msgId", "commitLogOffset", "storeSize", "storeTimestamp", "storeHost", "version"}
STORE_V6 = 0x20   # sysFlag bit for an IPv6 store host: follows the writing store's host
SMALL = ("--segment-size", 1 << 20, "--index-slots", 1000, "--index-entries", 4000)


def test_dump_put_round_trip(fixture_store, tmp_path):
    """Every field a message carries comes back from dump | put | dump, binary bodies and
    topics outside RocketMQ's broker rule included; queue offsets too (queues are replayed
    in order into an empty store)."""
    name, store, man = fixture_store
    src = copy_store(store, tmp_path)
    dumped = run("dump", src).stdout
    before = [json.loads(x) for x in dumped.splitlines()]
    assert [d["commitLogOffset"] for d in before] == [m["commitLogOffset"] for m in man["messages"]]
    assert {d["bodyEncoding"] for d in before} == {"utf8", "base64"}
    assert any(d["topic"] == "SCHEDULE_TOPIC_XXXX" for d in before) or name == "533-v2"
    version = ("--message-version", 2) if name == "533-v2" else ()
    run("put", tmp_path / "copy", "--create", "--any-topic-name", *version, *SMALL, stdin=dumped)
    after = [json.loads(x) for x in run("dump", tmp_path / "copy").stdout.splitlines()]
    assert len(after) == len(before)
    for a, b in zip(before, after, strict=True):
        keep = set(a) - ASSIGNED - {"sysFlag"}
        assert {k: a[k] for k in keep} == {k: b[k] for k in keep}
        assert a["sysFlag"] & ~STORE_V6 == b["sysFlag"] & ~STORE_V6


def test_put_reads_body_encodings_and_checks_body_length(tmp_path):
    store = tmp_path / "s"
    (r1, r2) = put(store, {"topic": "T", "body": "AP/+", "bodyEncoding": "base64", "bodyLength": 3},
                   {"topic": "T", "body": "héllo", "uniqKey": "U1", "msgId": "ignored", "storeSize": -1},
                   extra=("--create", *map(str, SMALL)))
    assert run_json("at", store, r1["commitLogOffset"], "--body", "base64")["body"] == "AP/+"
    got = run_json("at", store, r2["commitLogOffset"])
    assert (got["body"], got["uniqKey"]) == ("héllo", "U1")
    for line, why in [({"topic": "T", "body": "abc", "bodyLength": 4}, "'bodyLength' is 4"),
                      ({"topic": "T", "bodyLength": 9}, "dumped with --body none"),
                      ({"topic": "T", "body": "x", "bodyEncoding": "hex"}, "'bodyEncoding'"),
                      ({"topic": "T", "body": "x", "nosuch": 1}, "unknown field(s) nosuch")]:
        assert why in error_line(run("put", store, stdin=json.dumps(line) + "\n", expect=1))
    assert len(run("dump", store).stdout.splitlines()) == 2


def _lines(*msgs):
    return "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in msgs)


GOOD = {"topic": "T1", "body": "ok"}


@pytest.mark.parametrize("bad", ["not json", json.dumps({"topic": "a/b", "body": "x"}),
                                 json.dumps({"topic": "T1", "body": 5}),
                                 json.dumps({"topic": "T1", "body": "x", "queueId": -1}),
                                 # nested past json's recursion: a traceback (RecursionError) before
                                 "[" * 100_000,
                                 # a key given twice: json kept the last ("T2") silently
                                 '{"topic": "T1", "topic": "T2", "body": "x"}',
                                 # refused by put_batch, not by the line's checks: the error named
                                 # no line and did not say the chunk was refused
                                 json.dumps({"topic": "T1", "body": "x", "properties": {"a\x01": "b"}}),
                                 json.dumps({"topic": "T1", "body": "x", "properties": {"DELAY": "abc"}})])
def test_a_bad_line_stores_none_of_its_chunk(tmp_path, bad):
    store = tmp_path / "s"
    put(store, GOOD, extra=("--create", *map(str, SMALL)))
    p = run("put", store, stdin=_lines(GOOD, {**GOOD, "queueId": 3}, bad), expect=1)
    assert "stdin line 3" in error_line(p) and "lines 1-3 refused, none of it stored" in p.stderr
    assert len(run("dump", store).stdout.splitlines()) == 1
    p = run("put", store, "--chunk", 2, stdin=_lines(GOOD, {**GOOD, "queueId": 3}, bad), expect=1)
    assert "lines 3-3 refused" in p.stderr and "2 message(s) of earlier chunks stored" in p.stderr
    assert len(run("dump", store).stdout.splitlines()) == 3


def test_a_line_that_is_not_utf8_is_refused_as_such(tmp_path):
    """Bytes that are not UTF-8 on stdin were reported as a JSON error ("Expecting value:
    line 1 column 1"), or depended on the locale; now the line is named as not UTF-8."""
    store = tmp_path / "s"
    put(store, GOOD, extra=("--create", *map(str, SMALL)))
    for bad in (b"\xff" + _lines(GOOD).encode(), b'{"topic": "T1", "body": "caf\xe9"}\n'):   # Latin-1, not UTF-8
        p = subprocess.run([sys.executable, "-m", "rmqstore", "put", str(store)], input=_lines(GOOD).encode() + bad,
                           capture_output=True, env={**ENV, "LC_ALL": "C.UTF-8"}, timeout=120)
        assert p.returncode == 1 and b"stdin line 2: not UTF-8 text" in p.stderr, p.stderr
        assert b"lines 1-2 refused, none of it stored" in p.stderr
    assert len(run("dump", store).stdout.splitlines()) == 1


def test_an_oversized_record_after_other_queues_stores_none_of_its_chunk(tmp_path):
    """A chunk mixing queue ids (and round robin) is one put_batch: a record too large for
    the segments, last in the chunk, stores none of it."""
    store = tmp_path / "s"
    put(store, GOOD, extra=("--create", "--segment-size", 4096))
    lines = _lines({**GOOD, "queueId": 0}, {**GOOD, "queueId": 2}, GOOD, {"topic": "T1", "body": "x" * 5000})
    p = run("put", store, stdin=lines, expect=1)
    assert "stdin line 4" in error_line(p) and "exceeds the limit" in p.stderr
    assert len(run("dump", store).stdout.splitlines()) == 1
    out = run("put", store, "--json", stdin=_lines({**GOOD, "queueId": 0}, {**GOOD, "queueId": 2}, GOOD)).stdout
    assert [json.loads(x)["queueId"] for x in out.splitlines() if "queueId" in x][:2] == [0, 2]


@pytest.mark.parametrize("bad", ["not json", json.dumps({"topic": "a/b", "body": "x"}),
                                 json.dumps({"topic": "T1", "body": "x" * 5000})])
@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_input_creates_nothing(tmp_path, bad, existing):
    """Into a new store: nothing is left behind (no checkpoint, lock or commitlog), whether the
    line is refused before the store is opened or by put_batch itself (a record larger than
    the 4 KiB segments)."""
    store = tmp_path / "new"
    if existing:
        store.mkdir()
    p = run("put", store, "--create", "--segment-size", 4096, stdin=_lines(GOOD, bad), expect=1)
    assert "none of it stored" in error_line(p) or "exceeds the limit" in p.stderr
    assert os.path.isdir(store) is existing
    assert not existing or os.listdir(store) == []


def test_put_says_what_it_stored(tmp_path):
    store = tmp_path / "s"
    out = run("put", store, "--create", "--chunk", 2, *SMALL, stdin=_lines(*[GOOD] * 3)).stdout
    assert "stdin lines 1-2: 2 message(s) stored" in out
    assert "3 message(s) stored in 2 chunk(s) (all or nothing per chunk of up to 2 lines)" in out
    assert "all or nothing per chunk" in " ".join(run("put", "--help").stdout.split()).lower()
    assert "nothing stored, no store created" in run("put", tmp_path / "none", "--create", stdin="").stdout
    assert not os.path.exists(tmp_path / "none")
    assert "no such store directory" in error_line(run("put", tmp_path / "typo", stdin=_lines(GOOD), expect=1))
