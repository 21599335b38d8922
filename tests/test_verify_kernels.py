"""verify's kernels. _verify.segment_columns, its one GIL-free pass over a commitlog segment,
against the pure-Python reference codec: every record's columns and index keys, on
RocketMQ's fixture stores and on stores written here (delayed, PREPARED and ROLLBACK
messages, many topics, many keys, a broken record), whatever room it is told to expect.
_cq.check_entries (its galloping search) against np.searchsorted, entries in any order."""
import gc

import numpy as np
import pytest

from rmqstore import Message, MessageStore, StoreConfig, _cq, _verify

import reference_codec as ref
from conftest import CLEAN_498, V2_533

TRAN_PREPARED, TRAN_ROLLBACK = 0x4, 0xC


def _index_hash(s):
    h = ref.java_hash(s)
    return 0 if h == -(1 << 31) else abs(h)


def _expected(records):
    """The columns and keys of ``records`` (reference dicts), as lists, with topic names."""
    cols = {k: [] for k in ("phy", "size", "queue_id", "queue_offset", "tags", "topic", "cq", "key_hash", "key_phy")}
    for m in records:
        tran = m["sys_flag"] & 0xC
        for k, v in (("phy", m["phy_offset"]), ("size", m["store_size"]), ("queue_id", m["queue_id"]),
                     ("queue_offset", m["queue_offset"]), ("tags", m["tags_code"]), ("topic", m["topic"]),
                     ("cq", tran not in (TRAN_PREPARED, TRAN_ROLLBACK))):
            cols[k].append(v)
        if tran == TRAN_ROLLBACK:
            continue
        props = m["properties"]
        keys = ([props["UNIQ_KEY"]] if "UNIQ_KEY" in props else []) + \
            [k for k in props.get("KEYS", "").split(" ") if k]
        for k in keys:
            cols["key_hash"].append(_index_hash(f"{m['topic']}#{k}"))
            cols["key_phy"].append(m["phy_offset"])
    return cols


def _columns(store_dir, hint=None, with_keys=True):
    """segment_columns of every segment of a store (read-only), as lists with topic names,
    and the newest store timestamp."""
    out, newest = None, 0
    with MessageStore(store_dir, read_only=True) as s:
        for seg in s.commitlog.segments.segments:
            names: list = []
            cols, ts = _verify.segment_columns(seg, seg.size, seg.size // 100 if hint is None else hint, {}, names,
                                               with_keys)
            newest = max(newest, ts)
            lists = {k: a.tolist() for k, a in cols.items()}
            lists["topic"] = [names[t] for t in lists["topic"]]
            if out is None:
                out = lists
            else:
                for k, v in lists.items():
                    out[k] += v
    return out, newest


def _check(store_dir, **kw):
    records = list(ref.iter_commitlog(str(store_dir)))
    got, newest = _columns(store_dir, **kw)
    assert got == _expected(records)
    assert newest == max(m["store_timestamp"] for m in records)


@pytest.mark.parametrize("fixture", [CLEAN_498, V2_533], ids=["498-clean", "533-v2"])
def test_rocketmq_fixture_columns_match_the_reference(fixture):
    if not (fixture / "store").is_dir():
        pytest.skip("fixture not available")
    _check(fixture / "store")


def _own(path, topics=3, n=120, keys=2):
    cfg = StoreConfig(commitlog_file_size=16384, consume_queue_entries=50)
    with MessageStore(path, cfg) as s:
        for i in range(n):
            s.put(Message(f"T{i % topics}", b"b%d" % i * (i % 7 + 1), tags=f"tag{i % 4}",
                          keys=[f"k{i}-{j}" for j in range(keys)]), queue_id=i % 2)
        s.put(Message("T0", b"later", delay_level=3))
        s.put(Message("T1", b"prepared", sys_flag=TRAN_PREPARED, keys="kp"))
        s.put(Message("T1", b"rollback", sys_flag=TRAN_ROLLBACK, keys="kr"))
    return path


@pytest.mark.parametrize("hint", [None, 0, 1, 5], ids=["roomy", "none", "one", "five"])
def test_own_store_columns_whatever_the_room_expected(tmp_path, hint):
    """Rows and keys grow past the room asked for (one, five records) to the same columns."""
    _check(_own(tmp_path / "s"), hint=hint)


def test_more_topics_than_it_remembers(tmp_path):
    """40 topics in turn: more than the kernel numbers without the GIL."""
    _check(_own(tmp_path / "s", topics=40, n=200, keys=1), hint=1)


def test_many_keys_per_message(tmp_path):
    _check(_own(tmp_path / "s", n=30, keys=40), hint=1)


def test_without_keys(tmp_path):
    path = _own(tmp_path / "s")
    got, _ = _columns(path, with_keys=False)
    want = _expected(list(ref.iter_commitlog(str(path))))
    assert got["key_hash"] == got["key_phy"] == []
    assert {k: v for k, v in got.items() if not k.startswith("key")} == \
        {k: v for k, v in want.items() if not k.startswith("key")}


def test_stops_at_a_broken_record(tmp_path):
    """A record whose TOTALSIZE is damaged ends the columns before it."""
    path = _own(tmp_path / "s", n=20)
    records = list(ref.iter_commitlog(str(path)))
    first = ref.segment_files(str(path / "commitlog"))[0][1]
    with open(first, "r+b") as f:
        f.seek(records[5]["phy_offset"])
        f.write((-7).to_bytes(4, "big", signed=True))
    with MessageStore(path, read_only=True) as s:
        seg = s.commitlog.segments.segments[0]
        cols, _ = _verify.segment_columns(seg, seg.size, 1, {}, [], True)
    assert cols["phy"].tolist() == [m["phy_offset"] for m in records[:5]]
    assert cols["key_phy"].tolist() == [m["phy_offset"] for m in records[:5] for _ in range(2)]


def test_empty_arrays_live_as_long_as_their_views():
    a = _verify.empty(1000, np.int64)
    a[:] = np.arange(1000)
    view = a[10:13]
    del a
    gc.collect()
    assert view.tolist() == [10, 11, 12]
    assert _verify.empty(0, np.bool_).shape == (0,)


@pytest.mark.parametrize("seed", range(6))
def test_check_entries_finds_what_searchsorted_finds(seed):
    """Messages at random ascending offsets, one queue's entries pointing at them, at
    offsets between them and past the end, in order and shuffled (a search from the last
    hit must also look backwards): the failing entries and the message each names."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    phy = np.cumsum(rng.integers(1, 50, n)).astype(np.int64)
    size = rng.integers(1, 9, n).astype(np.int32)
    tags = rng.integers(0, 3, n).astype(np.int64)
    zeros32, ones = np.zeros(n, np.int32), np.ones(n, np.uint8)
    m = int(rng.integers(1, 300))
    pick = rng.integers(0, n, m) if seed % 2 else np.sort(rng.integers(0, n, m))
    entries = np.zeros(m, _cq.ENTRY_DTYPE)
    entries["phy_offset"] = phy[pick] + (rng.random(m) < 0.2)       # some between messages
    entries["size"], entries["tags_code"] = size[pick], tags[pick]
    qoff = np.arange(m, dtype=np.int64)
    queue_offsets = np.full(n, -1, np.int64)
    queue_offsets[pick] = qoff                # the last entry naming a message owns it
    end = int(phy[-1])                        # entries at the last message or after: not checked
    covered = np.zeros(n, np.uint8)
    wrong, at = _cq.check_entries(entries, end, 0, 0, 0, phy, size, zeros32, zeros32, queue_offsets, tags, ones,
                                  covered)
    want_wrong, want_at = [], []
    for k, e in enumerate(entries):
        if e["phy_offset"] >= end:
            continue
        i = int(np.searchsorted(phy, e["phy_offset"]))
        if i < n and phy[i] == e["phy_offset"]:
            if queue_offsets[i] == k:
                continue
            want_at.append(i)
        else:
            want_at.append(-1)
        want_wrong.append(k)
    assert wrong.tolist() == want_wrong and at.tolist() == want_at
    assert np.flatnonzero(covered).tolist() == sorted({int(pick[k]) for k in range(m)
                                                      if k not in want_wrong and entries[k]["phy_offset"] < end})
