"""put_columns / put_arrow: columnar ingest writes the very records put writes (checked byte
for byte, store times aside), assigns queues and offsets as put does, and is all or nothing."""
import errno

import numpy as np
import pytest

from rmqstore import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Message,
    MessageStore,
    MessageTooLargeError,
    StoreConfig,
)

from conftest import SMALL_INDEX

CFG = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=64, warm_mapped_file=False, default_queue_nums=3,
                  **SMALL_INDEX)
TIMES = [(40, 48), (56, 64)]   # BORNTIMESTAMP and STORETIMESTAMP of a record with IPv4 hosts


def _records(store):
    """Every record's bytes with its two timestamps zeroed."""
    out = []
    for m in store.scan():
        raw = bytearray(store.commitlog.read(m.phy_offset, m.store_size))
        for a, b in TIMES:
            raw[a:b] = bytes(b - a)
        out.append(bytes(raw))
    return out


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    bodies = [rng.bytes(int(rng.integers(0, 3000))) for _ in range(n)]
    tags = [None if i % 5 == 0 else f"tag{i % 3}" for i in range(n)]
    keys = [None if i % 4 == 0 else ([f"k{i}", f"g{i % 7}"] if i % 2 else f"k{i}") for i in range(n)]
    topics = [f"T{i % 2}" for i in range(n)]
    return topics, bodies, tags, keys


@pytest.mark.parametrize("queues", ["round-robin", "given"])
def test_same_records_as_put(tmp_path, queues):
    topics, bodies, tags, keys = _rows(120)
    qids = None if queues == "round-robin" else [i % 4 for i in range(120)]
    props = {"a": "1", "b": "two"}
    with MessageStore(tmp_path / "put", CFG) as s:
        for i in range(120):
            s.put(Message(topics[i], bodies[i], tags=tags[i], keys=keys[i], properties=props),
                  None if qids is None else qids[i])
        expected = _records(s)
    with MessageStore(tmp_path / "columns", CFG) as s:
        r = s.put_columns(topics, bodies, queue_ids=qids, tags=tags, keys=keys, properties=props)
        assert _records(s) == expected
        assert len(r["phy_offset"]) == 120 and int(r["phy_offset"][-1] + r["size"][-1]) == s.max_phy_offset
        s.wait_dispatched()
        for i in (0, 7, 119):
            m = s.get_by_offset(int(r["phy_offset"][i]))
            assert (m.topic, m.queue_id, m.queue_offset) == (topics[i], r["queue_id"][i], r["queue_offset"][i])
            got = s.get_messages(topics[i], int(r["queue_id"][i]), int(r["queue_offset"][i]), 1).messages[0]
            assert bytes(got.body) == bodies[i]


def test_queue_offsets_continue_across_put_and_put_columns(tmp_path):
    with MessageStore(tmp_path / "s", CFG) as s:
        a = s.put(Message("T", b"a"))
        r = s.put_columns("T", [b"b", b"c", b"d"])
        z = s.put(Message("T", b"z"))
        assert (a.queue_id, a.queue_offset) == (0, 0)
        assert r["queue_id"].tolist() == [1, 2, 0] and r["queue_offset"].tolist() == [0, 0, 1]
        assert (z.queue_id, z.queue_offset) == (1, 1)


def test_many_segments_and_reopen(tmp_path):
    bodies = [b"%05d" % i + b"x" * 500 for i in range(2000)]     # ~1.2 MB: about 20 segments
    with MessageStore(tmp_path / "s", CFG) as s:
        r = s.put_columns("T", bodies, queue_ids=0)
        assert r["queue_offset"].tolist() == list(range(2000))
    with MessageStore(tmp_path / "s", CFG) as s:
        assert [bytes(m.body) for m in s.scan()] == bodies
        assert s.verify().ok


@pytest.mark.parametrize("bad", ["too-large", "queue-id", "body-type", "tags-separator", "key-type"])
def test_all_or_nothing(tmp_path, bad):
    n, at = 50, 31
    bodies = [b"m%d" % i for i in range(n)]
    kw = {}
    if bad == "too-large":
        bodies[at] = b"x" * (1 << 16)
        error = MessageTooLargeError
    elif bad == "queue-id":
        kw["queue_ids"] = [0] * at + [-1] + [0] * (n - at - 1)
        error = InvalidArgumentError
    elif bad == "body-type":
        bodies[at] = "text"
        error = InvalidArgumentTypeError
    elif bad == "tags-separator":
        kw["tags"] = ["t"] * at + ["a\x02b"] + ["t"] * (n - at - 1)
        error = InvalidArgumentError
    else:
        kw["keys"] = ["k"] * at + [[1]] + ["k"] * (n - at - 1)
        error = InvalidArgumentTypeError
    with MessageStore(tmp_path / "s", CFG) as s:
        s.put(Message("T", b"kept"))
        with pytest.raises(error):
            s.put_columns("T", bodies, **kw)
        s.wait_dispatched()
        assert [bytes(m.body) for m in s.scan()] == [b"kept"] and s.max_offset("T", 0) == 1


def test_full_disk_stores_nothing(tmp_path):
    from rmqstore._segment import inject_fault
    with MessageStore(tmp_path / "s", CFG) as s:
        s.put_columns("T", [b"a" * 500] * 100, queue_ids=0)
        inject_fault("open", 1, errno.ENOSPC, "/commitlog/")
        try:
            with pytest.raises(OSError):
                s.put_columns("T", [b"b" * 500] * 300, queue_ids=0)
        finally:
            inject_fault("open", 0, errno.ENOSPC)
        s.wait_dispatched()
        assert s.max_offset("T", 0) == 100 and sum(1 for _ in s.scan()) == 100


def test_uniq_keys_are_generated(tmp_path):
    with MessageStore(tmp_path / "s", CFG.with_(generate_uniq_key=True)) as s:
        s.put_columns("T", [b"a", b"b"])
        s.wait_dispatched()
        ms = list(s.scan())
        assert len({m.uniq_key for m in ms}) == 2 and all(m.uniq_key for m in ms)
        assert bytes(s.query_by_uniq_key("T", ms[1].uniq_key).body) == b"b"


def test_put_arrow_equals_put_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    topics, bodies, tags, keys = _rows(80, seed=3)
    keys = [None if k is None else ([k] if isinstance(k, str) else k) for k in keys]
    with MessageStore(tmp_path / "columns", CFG) as s:
        s.put_columns(topics, bodies, queue_ids=[i % 3 for i in range(80)], tags=tags, keys=keys)
        expected = _records(s)
    batch = pa.record_batch({"topic": topics, "body": pa.array(bodies, pa.binary()), "tags": tags,
                             "keys": pa.array(keys, pa.list_(pa.string())),
                             "queue_id": pa.array([i % 3 for i in range(80)], pa.int32())})
    with MessageStore(tmp_path / "arrow", CFG) as s:
        r = s.put_arrow(pa.Table.from_batches([batch]))
        assert _records(s) == expected and len(r["phy_offset"]) == 80


def test_put_batch_takes_a_queue_id_per_message(tmp_path):
    with MessageStore(tmp_path / "s", CFG) as s:
        r = s.put_batch([Message("T", b"a"), Message("T", b"b"), Message("T", b"c")], [2, None, 2])
        assert [(x.queue_id, x.queue_offset) for x in r] == [(2, 0), (0, 0), (2, 1)]
        for qids in ([0, 1], [0, 1, 2, 3], [0, -1, 0], (0, "1", 0)):
            with pytest.raises(InvalidArgumentError):
                s.put_batch([Message("T", b"x")] * 3, qids)
        with pytest.raises(MessageTooLargeError):   # the last one, in another queue: none stored
            s.put_batch([Message("T", b"d"), Message("T", b"x" * (1 << 16))], [0, 1])
        assert sum(1 for _ in s.scan()) == 3
