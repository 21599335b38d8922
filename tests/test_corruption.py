"""Corruption: seeded loops that flip bytes, truncate files, remove a middle segment and
write garbage into CQ entries and index slots of a copied store. Opening and reading must
give CorruptStoreError / CorruptRecordError / MessageNotFoundError or a recovered store:
never another exception, a segfault, SIGBUS or a hang (each loop runs in a subprocess with
a timeout). Hypothesis fuzzes the record decoder and the segment scanner."""
import os
import random
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rmqstore
from rmqstore import CorruptRecordError, Message, MessageExt, MessageStore, StoreConfig, _codec
from rmqstore._segment import MappedSegment

from reference_codec import encode_record

CFG = dict(commitlog_file_size=8192, consume_queue_entries=8, index_slots=16, index_entries=64,
           warm_mapped_file=False)

# The child opens and reads every mutated store named on its command line; it prints the
# case before touching it, so a crash names the case that caused it.
READER = r"""
import os, sys
from rmqstore import (CorruptStoreError, MessageNotFoundError, MessageStore, StoreConfig)
cfg = StoreConfig(commitlog_file_size=8192, consume_queue_entries=8, index_slots=16, index_entries=64,
                  warm_mapped_file=False)
def read_all(s):
    for m in s.scan(check_crc=True):
        m.body, m.properties
    for (t, q) in list(s.consume_queues.queues):
        off, n = s.min_offset(t, q), 0
        while n < 1000:
            r = s.get_messages(t, q, off, 8)
            for m in r.messages:
                m.body
            if r.next_offset == off:
                break
            off, n = r.next_offset, n + 1
        for e in s.consume_queue_entries(t, q):
            if int(e["phy_offset"]) >= s.max_phy_offset:   # read-only: CQ not cut at the end
                continue
            try:
                s.get_by_offset(int(e["phy_offset"]))
            except MessageNotFoundError:
                pass
    if s.index is not None:
        for k in ("k0", "k7", "k33"):
            s.query_by_key("CorA", k)
for case in sys.argv[1:]:
    print("case", case, flush=True)
    try:
        with MessageStore(case, cfg) as s:
            read_all(s)
        with MessageStore(case, cfg, read_only=True) as s:
            read_all(s)
    except (CorruptStoreError, MessageNotFoundError) as e:
        print("refused", type(e).__name__, e, flush=True)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt") / "base"
    with MessageStore(path, StoreConfig(**CFG)) as s:
        for i in range(150):
            s.put(Message("CorA" if i % 3 else "CorB", b"%d:" % i * (i % 40 + 1), tags=f"t{i % 4}",
                          keys=[f"k{i}", "hot"]), queue_id=i % 3)
    return path


def _files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f not in ("lock", "abort"))


def _segments(root, sub):
    return sorted(os.path.join(root, sub, n) for n in os.listdir(os.path.join(root, sub)))


def _mutate(root, rng):
    """One seeded corruption of the store at ``root``; returns what was done."""
    kind = rng.choice(["flip", "flip", "truncate", "drop_middle", "cq_garbage", "length", "index_garbage"])
    files = _files(root)
    if kind == "flip":
        f = rng.choice(files)
        data = bytearray(open(f, "rb").read())
        if not data:
            return "flip nothing"
        hot = len(data.rstrip(b"\0")) or len(data)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(hot)] ^= 1 << rng.randrange(8)
        open(f, "wb").write(data)
    elif kind == "truncate":
        f = rng.choice(files)
        os.truncate(f, rng.randrange(os.path.getsize(f) + 1))
    elif kind == "drop_middle":
        segs = _segments(root, "commitlog")
        f = segs[len(segs) // 2]
        os.unlink(f)
    elif kind in ("cq_garbage", "length", "index_garbage"):
        if kind == "cq_garbage":
            f = rng.choice([x for x in files if "consumequeue" in x])
            pos = rng.randrange(max(1, os.path.getsize(f) // 20)) * 20
            junk = rng.randbytes(20) if rng.random() < 0.5 else (rng.choice([-1, 1 << 40, 0x7FFFFFFF])
                                                              .to_bytes(8, "big", signed=True) + rng.randbytes(12))
        elif kind == "length":
            f = rng.choice(_segments(root, "commitlog"))
            pos = rng.randrange(0, os.path.getsize(f) - 4)
            junk = rng.choice([0x7FFFFFFF, -5, 91, 4096, 1 << 20]).to_bytes(4, "big", signed=True)
        else:
            idx = [x for x in files if os.sep + "index" + os.sep in x]
            if not idx:
                return "no index"
            f = rng.choice(idx)
            pos = rng.randrange(0, os.path.getsize(f) - 4)
            junk = rng.choice([-1, 1 << 30, 3, 0x7FFFFFFF]).to_bytes(4, "big", signed=True)
        with open(f, "r+b") as fh:
            fh.seek(pos)
            fh.write(junk)
    if rng.random() < 0.5:
        open(os.path.join(root, "abort"), "wb").close()
    return f"{kind} {f}"


def _run_cases(base, tmp_path, seed, n):
    rng = random.Random(seed)
    cases, what = [], {}
    for i in range(n):
        dst = str(tmp_path / f"case{i}")
        shutil.copytree(base, dst)
        what[dst] = _mutate(dst, rng)
        cases.append(dst)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
    p = subprocess.run([sys.executable, "-c", READER, *cases], capture_output=True, text=True, timeout=120, env=env)
    started = [x.split(" ", 1)[1] for x in p.stdout.splitlines() if x.startswith("case ")]
    last = started[-1] if started else None
    assert p.returncode == 0 and p.stdout.endswith("done\n"), \
        f"exit {p.returncode} on {what.get(last)}\n{p.stderr[-3000:]}"
    return p.stdout.count("refused")


def test_seeded_corruption(base_store, tmp_path):
    refused = _run_cases(base_store, tmp_path, seed=5, n=40)
    assert refused < 40          # most corruptions are recovered from, not refused


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_seeded_corruption_many(base_store, tmp_path, seed):
    _run_cases(base_store, tmp_path, seed=1000 + seed, n=60)


def test_missing_middle_segment_is_refused(base_store, tmp_path):
    dst = tmp_path / "s"
    shutil.copytree(base_store, dst)
    segs = _segments(dst, "commitlog")
    assert len(segs) >= 3
    os.unlink(segs[1])
    with pytest.raises(rmqstore.CorruptStoreError, match="missing segment"):
        MessageStore(dst, StoreConfig(**CFG))


# -- decoder fuzzing -------------------------------------------------------------------------

VALID = encode_record("FuzzTopic", b"hello fuzz body", {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U"},
                      queue_offset=3, phy_offset=0, store_timestamp=123)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_decode_bytes_random(data, crc):
    try:
        m = _codec.decode_bytes(data, 0, crc)
    except CorruptRecordError:
        return
    assert isinstance(m, MessageExt) and 91 <= m.store_size <= len(data)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, len(VALID)))
def test_decode_bytes_mutated_record(patches, cut):
    data = bytearray(VALID)
    for pos, val in patches:
        data[pos] = val
    data = bytes(data[:cut])
    try:
        m = _codec.decode_bytes(data, 0, True)
    except CorruptRecordError:
        return
    assert m.store_size <= len(data) and m.body_crc == _codec.crc32_body(m.body)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_scan_segment_random(tmp_path_factory, data, crc):
    path = tmp_path_factory.mktemp("fuzz") / "00000000000000000000"
    content = (VALID * 3 + data)[:4096].ljust(4096, b"\0")
    path.write_bytes(content)
    seg = MappedSegment(str(path), 0, 4096, readonly=True)
    try:
        end, count, status = _codec.scan_segment(seg, 0, 4096, crc)
        assert count >= 3 and 3 * len(VALID) <= end <= 4096
        assert status in ("end", "blank", "truncated record", "bad magic code", "bad total size",
                          "field lengths do not add up to the total size", "body CRC mismatch")
    finally:
        seg.close()
