"""_verify.segment_columns, verify's one GIL-free pass over a commitlog segment, against the
pure-Python reference codec: every record's columns and index keys, on RocketMQ's fixture
stores and on stores written here (delayed, PREPARED and ROLLBACK messages, many topics,
many keys, a broken record), whatever room it is told to expect."""
import pytest

from rmqstore import Message, MessageStore, StoreConfig, _verify

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
