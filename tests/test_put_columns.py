"""put_columns / put_arrow: columnar ingest writes the very records put writes (checked byte
for byte, store times aside), assigns queues and offsets as put does, and is all or nothing."""
import errno
import re

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


def _records(store):
    """Every record's bytes with STORETIMESTAMP zeroed, and BORNTIMESTAMP too where it is
    the store time (the message had none)."""
    out = []
    for m in store.scan():
        raw = bytearray(store.commitlog.read(m.phy_offset, m.store_size))
        store_ts = 48 + (20 if m.sys_flag & 0x10 else 8)   # after BORNHOST
        if raw[40:48] == raw[store_ts:store_ts + 8]:
            raw[40:48] = bytes(8)
        raw[store_ts:store_ts + 8] = bytes(8)
        out.append(bytes(raw))
    return out


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    bodies = [rng.bytes(int(rng.integers(0, 3000))) for _ in range(n)]
    tags = [None if i % 5 == 0 else f"tag{i % 3}" for i in range(n)]
    keys = [None if i % 4 == 0 else ([f"k{i}", f"g{i % 7}"] if i % 2 else f"k{i}") for i in range(n)]
    topics = [f"T{i % 2}" for i in range(n)]
    return topics, bodies, tags, keys


def _other_kinds(bodies, keys):
    """The same rows as other accepted kinds: bodies as bytearray / memoryview, key lists as
    tuples and iterators, the sequences as tuples (so put_columns takes its general path)."""
    bodies = tuple(bytearray(b) if i % 3 == 1 else memoryview(b) if i % 3 == 2 else b for i, b in enumerate(bodies))
    keys = tuple(iter(k) if isinstance(k, list) and i % 3 == 1 else tuple(k) if isinstance(k, list) else k
                 for i, k in enumerate(keys))
    return bodies, keys


class Name(str):
    """A str subclass (as enum.StrEnum members are) whose __str__ is not its value."""

    def __str__(self):
        return "not the value"


def _named(v):
    """``v`` with every str in it (also in lists and dict keys/values) as a Name."""
    if isinstance(v, str):
        return Name(v)
    if isinstance(v, list):
        return [_named(x) for x in v]
    if isinstance(v, dict):
        return {Name(k): _named(x) for k, x in v.items()}
    return v


@pytest.mark.parametrize("queues", ["round-robin", "given"])
@pytest.mark.parametrize("kinds", ["lists of bytes and str", "other sequences", "str subclasses"])
def test_same_records_as_put(tmp_path, queues, kinds):
    topics, bodies, tags, keys = _rows(120)
    qids = None if queues == "round-robin" else [i % 4 for i in range(120)]
    props = {"a": "1", "b": "two"}
    with MessageStore(tmp_path / "put", CFG) as s:
        for i in range(120):
            s.put(Message(topics[i], bodies[i], tags=tags[i], keys=keys[i], properties=props),
                  None if qids is None else qids[i])
        expected = _records(s)
    col_bodies, col_keys = (bodies, keys) if kinds != "other sequences" else _other_kinds(bodies, keys)
    col_topics, col_tags, col_props = topics, tags, props
    if kinds == "str subclasses":
        col_topics, col_tags, col_keys, col_props = _named(topics), _named(tags), _named(keys), _named(props)
    with MessageStore(tmp_path / "columns", CFG) as s:
        r = s.put_columns(col_topics, col_bodies, queue_ids=qids, tags=col_tags, keys=col_keys, properties=col_props)
        assert _records(s) == expected
        assert len(r["phy_offset"]) == 120 and int(r["phy_offset"][-1] + r["size"][-1]) == s.max_phy_offset
        s.wait_dispatched()
        for i in (0, 7, 119):
            m = s.get_by_offset(int(r["phy_offset"][i]))
            assert (m.topic, m.queue_id, m.queue_offset) == (topics[i], r["queue_id"][i], r["queue_offset"][i])
            got = s.get_messages(topics[i], int(r["queue_id"][i]), int(r["queue_offset"][i]), 1).messages[0]
            assert bytes(got.body) == bodies[i]


def test_one_str_subclass_for_every_row_is_stored_by_its_value(tmp_path):
    """tags and keys given once for all rows as str subclasses: stored as put stores the
    plain values (not their __str__, and a keys string not taken as a sequence)."""
    with MessageStore(tmp_path / "put", CFG) as s:
        for body in (b"a", b"b"):
            s.put(Message("T", body, tags="x", keys="k1 k2"), 0)
        expected = _records(s)
    with MessageStore(tmp_path / "columns", CFG) as s:
        s.put_columns(Name("T"), [b"a", b"b"], queue_ids=0, tags=Name("x"), keys=Name("k1 k2"))
        assert _records(s) == expected


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


@pytest.mark.parametrize("bad", ["too-large", "queue-id", "queue-id-list", "body-type", "tags-separator", "key-type",
                                 "keys-type"])
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
    elif bad == "queue-id-list":        # a ragged column: numpy's own ValueError before
        kw["queue_ids"] = [0] * at + [[1]] + [0] * (n - at - 1)
        error = InvalidArgumentTypeError
    elif bad == "body-type":
        bodies[at] = "text"
        error = InvalidArgumentTypeError
    elif bad == "tags-separator":
        kw["tags"] = ["t"] * at + ["a\x02b"] + ["t"] * (n - at - 1)
        error = InvalidArgumentError
    else:
        kw["keys"] = ["k"] * at + [[1] if bad == "key-type" else 1] + ["k"] * (n - at - 1)
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


BULK = StoreConfig(commitlog_file_size=4 << 20, warm_mapped_file=False, default_queue_nums=3, **SMALL_INDEX)


def _immutable_batch(pa, columns):
    """A record batch of ``columns`` read back from Arrow IPC, as a Spark writer gets its
    batches."""
    batch = pa.record_batch(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return pa.ipc.open_stream(sink.getvalue()).read_next_batch()


@pytest.mark.parametrize("warm, kind", [(False, "list"), (True, "list"), (False, "arrow")])
def test_bulk_batch_same_records_as_put(tmp_path, warm, kind):
    """A batch of 256 KiB or more, written through the mapping behind the warmer, or without
    one encoded in runs of up to 1 MiB written with pwrite: the same records as put, across
    a segment roll, with rows too large for a run (written through the mapping) and
    PREPARED rows taking no queue offset; also for bodies in an Arrow column (as a Spark
    writer's batches come: read in place from one buffer)."""
    cfg = BULK.with_(warm_mapped_file=warm)
    rng = np.random.default_rng(7)
    n = 1200
    bodies = [rng.bytes(1_500_000 if i in (5, 900) else int(rng.integers(0, 6000))) for i in range(n)]
    sys_flag = [4 if i % 97 == 0 else 0 for i in range(n)]     # TRANSACTION_PREPARED_TYPE
    with MessageStore(tmp_path / "put", cfg) as s:
        for i, body in enumerate(bodies):
            s.put(Message("T", body, keys=f"k{i}", sys_flag=sys_flag[i]), i % 3)
        expected = _records(s)
    with MessageStore(tmp_path / "columns", cfg) as s:
        if kind == "list":
            r = s.put_columns("T", bodies, queue_ids=[i % 3 for i in range(n)], keys=[f"k{i}" for i in range(n)],
                              sys_flag=sys_flag)
        else:
            pa = pytest.importorskip("pyarrow")
            batch = _immutable_batch(pa, {"topic": ["T"] * n, "body": pa.array(bodies, pa.binary()),
                                          "queue_id": pa.array([i % 3 for i in range(n)], pa.int32()),
                                          "keys": [f"k{i}" for i in range(n)],
                                          "sys_flag": pa.array(sys_flag, pa.int32())})
            r = s.put_arrow(batch)
        assert len(s.commitlog.segments.segments) >= 2
        assert _records(s) == expected
        assert int(r["phy_offset"][-1] + r["size"][-1]) == s.max_phy_offset
    with MessageStore(tmp_path / "columns", cfg) as s:
        assert s.verify().ok


@pytest.mark.parametrize("kind", ["list", "arrow"])
def test_failed_bulk_write_turns_the_store_read_only(tmp_path, kind):
    """The second pwrite of a bulk batch fails: StoreIOError, and the store takes no more
    writes (a later record could leave whole records of the failed run behind its end,
    for recovery to take as written). The rows of the first run stay stored, those of the
    failed run are not, and the queue offsets they took are free again: after a reopen the
    next row takes the first of them, with no gap in the queue. Also for bodies in an
    Arrow column (put_arrow)."""
    from rmqstore import StoreIOError, StoreReadOnlyError
    from rmqstore._segment import inject_fault
    bodies = [b"%06d" % i + b"z" * 994 for i in range(3000)]     # 3 MB: runs of at most one 64 KiB segment
    with MessageStore(tmp_path / "s", CFG) as s:
        inject_fault("pwrite", 2, errno.EIO, "")
        try:
            with pytest.raises(StoreIOError):
                if kind == "list":
                    s.put_columns("T", bodies, queue_ids=0)
                else:
                    pa = pytest.importorskip("pyarrow")
                    s.put_arrow(_immutable_batch(pa, {"topic": ["T"] * 3000, "body": pa.array(bodies, pa.binary()),
                                                      "queue_id": pa.array([0] * 3000, pa.int32())}))
        finally:
            inject_fault("pwrite", 0, errno.EIO)
        with pytest.raises(StoreReadOnlyError, match="I/O error"):
            s.put(Message("T", b"refused"), queue_id=0)
        s.wait_dispatched()
        kept = s.max_offset("T", 0)
        assert 0 < kept < 3000 and [bytes(m.body) for m in s.scan()] == bodies[:kept]
        assert s.commitlog.queue_offsets[("T", 0)] == kept
    with MessageStore(tmp_path / "s", CFG) as s:
        assert [bytes(m.body) for m in s.scan()] == bodies[:kept]
        after = s.put(Message("T", b"after"), queue_id=0)
        assert after.queue_offset == kept
        s.wait_dispatched()
        got = s.get_messages("T", 0, 0, kept + 1).messages
        assert [m.queue_offset for m in got] == list(range(kept + 1)) and bytes(got[-1].body) == b"after"
        assert s.verify().ok


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


HOSTS = [None, "10.1.2.3:4567", "[fe80::1:2]:9876", "0.0.0.0:0", "[::]:65535"]
SYS_FLAGS = [0, 0x1, 0x4, 0x8, 0xC, 0x30 | 0x1, 0x30 | 0xD]   # compressed, PREPARED, COMMIT, ROLLBACK, host bits


def _fields(n):
    """Per message flag, sys_flag, born_timestamp, born_host, reconsume_times."""
    return ([(-1) ** i * (i * 7919 % 0x7FFFFFFF) for i in range(n)], [SYS_FLAGS[i % 7] for i in range(n)],
            [0 if i % 6 == 0 else 1_600_000_000_000 + i * 1001 for i in range(n)], [HOSTS[i % 5] for i in range(n)],
            [i % 17 for i in range(n)])


def test_message_fields_same_records_as_put(tmp_path):
    """flag, sys_flag (transaction types: queue offset 0 for PREPARED / ROLLBACK; the host
    bits follow the hosts), born time and host (IPv4 and IPv6) and reconsume times give
    the records put gives, with the same queue offsets."""
    n = 70
    topics, bodies, tags, keys = _rows(n, seed=5)
    flag, sys_flag, born_ts, born_host, reconsume = _fields(n)
    qids = [None if i % 3 == 0 else i % 2 for i in range(n)]
    with MessageStore(tmp_path / "put", CFG) as s:
        res = [s.put(Message(topics[i], bodies[i], tags=tags[i], keys=keys[i], flag=flag[i], sys_flag=sys_flag[i],
                             born_timestamp=born_ts[i], born_host=born_host[i], reconsume_times=reconsume[i]), qids[i])
               for i in range(n)]
        expected = _records(s)
    with MessageStore(tmp_path / "columns", CFG) as s:
        r = s.put_columns(topics, bodies, queue_ids=qids, tags=tags, keys=keys, flag=flag, sys_flag=np.array(sys_flag),
                          born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume)
        assert _records(s) == expected
        assert r["queue_offset"].tolist() == [x.queue_offset for x in res]
        assert r["queue_id"].tolist() == [x.queue_id for x in res]
        s.wait_dispatched()
        m = s.get_by_offset(int(r["phy_offset"][2]))
        assert (m.born_host, m.flag, m.reconsume_times) == ("[fe80:0:0:0:0:0:1:2]:9876", flag[2], 2)


def test_message_fields_for_every_row(tmp_path):
    """One value for all rows: the same records as giving it per row."""
    kw = dict(flag=-5, sys_flag=0x1, born_timestamp=1_234_567, born_host="[::1]:8", reconsume_times=3)
    with MessageStore(tmp_path / "put", CFG) as s:
        for b in (b"a", b"bc"):
            s.put(Message("T", b, **kw), 0)
        expected = _records(s)
    with MessageStore(tmp_path / "columns", CFG) as s:
        s.put_columns("T", [b"a", b"bc"], queue_ids=0, **kw)
        assert _records(s) == expected


def _arrow_rows(pa, n):
    """An Arrow batch of the source's columns that vary in every way the writer meets
    (nulls, empty lists, a map with duplicate and null values and names the columns set),
    and the put() arguments each row stands for."""
    topics, bodies, tags, _ = _rows(n, seed=9)
    flag, sys_flag, born_ts, born_host, reconsume = _fields(n)
    keys = [None if i % 4 == 0 else [] if i % 9 == 0 else [f"k{i}", "hot"] for i in range(n)]
    uniq = [None if i % 3 == 0 else f"U{i:06d}" for i in range(n)]
    props = [None if i % 5 == 0 else [("a", "1"), ("TAGS", "old"), ("b", None), ("a", "2"), ("UNIQ_KEY", "M")][:i % 6]
             for i in range(n)]
    qids = [None if i % 2 else i % 3 for i in range(n)]
    ts = [None if v == 0 else v * 1000 for v in born_ts]   # µs
    batch = pa.record_batch({
        "store": pa.array(["ignored"] * n), "topic": topics, "queue_id": pa.array(qids, pa.int32()), "tags": tags,
        "keys": pa.array(keys, pa.list_(pa.string())), "uniq_key": uniq,
        "properties": pa.array(props, pa.map_(pa.string(), pa.string())), "body": pa.array(bodies, pa.binary()),
        "sys_flag": pa.array(sys_flag, pa.int32()), "flag": pa.array([None if i % 8 == 1 else f for i, f in
                                                                      enumerate(flag)], pa.int32()),
        "born_timestamp": pa.array(ts, pa.timestamp("us", tz="UTC")), "born_host": born_host,
        "reconsume_times": pa.array(reconsume, pa.int32())})
    puts = []
    for i in range(n):
        p = dict(props[i]) if props[i] else {}
        if uniq[i] is not None:
            p["UNIQ_KEY"] = uniq[i]
        puts.append((Message(topics[i], bodies[i], tags=tags[i], keys=keys[i], properties=p,
                             flag=0 if i % 8 == 1 else flag[i], sys_flag=sys_flag[i], born_timestamp=born_ts[i],
                             born_host=born_host[i], reconsume_times=reconsume[i]), qids[i]))
    return batch, puts


@pytest.mark.parametrize("generate", [False, True])
def test_put_arrow_full_schema_same_records_as_put(tmp_path, generate):
    """Every column of the source's schema, nulls included, in batches sliced out of a
    table: the records put writes for the Message each row stands for. With generated
    unique keys (random per store) they are compared without them."""
    pa = pytest.importorskip("pyarrow")
    batch, puts = _arrow_rows(pa, 90)
    cfg = CFG.with_(generate_uniq_key=generate)
    with MessageStore(tmp_path / "put", cfg) as s:
        for m, q in puts:
            s.put(m, q)
        expected = _records(s)
        want_props = [dict(m.properties) for m in s.scan()]
    with MessageStore(tmp_path / "arrow", cfg) as s:
        for part in pa.Table.from_batches([batch]).to_batches(max_chunksize=40):   # slices of one table
            s.put_arrow(part)
        got_props = [dict(m.properties) for m in s.scan()]
        if generate:
            assert [list(p) for p in got_props] == [list(p) for p in want_props]   # same names, same order
            assert all(p["UNIQ_KEY"] for p in got_props)
            assert [p["UNIQ_KEY"] for p in got_props if p["UNIQ_KEY"].startswith("U")] == \
                [f"U{i:06d}" for i in range(90) if i % 3]
        else:
            assert _records(s) == expected and got_props == want_props


def test_put_arrow_delays_as_put(tmp_path):
    """A batch with a DELAY level goes as put moves it (to SCHEDULE_TOPIC_XXXX); a DELAY on
    that topic already, or of level 0, stays columnar and is written as is."""
    pa = pytest.importorskip("pyarrow")
    t = pa.map_(pa.string(), pa.string())
    rows = [("T", [("DELAY", "2")]), ("T", [("DELAY", "0")]), ("SCHEDULE_TOPIC_XXXX", [("DELAY", "3")]), ("T", None)]
    for part in (rows, rows[1:]):
        with MessageStore(tmp_path / f"put{len(part)}", CFG) as s:
            for topic, p in part:
                s.put(Message(topic, b"x", properties=dict(p or {})))
            expected = _records(s)
        with MessageStore(tmp_path / f"arrow{len(part)}", CFG) as s:
            r = s.put_arrow(pa.record_batch({"topic": [x[0] for x in part], "body": [b"x"] * len(part),
                                             "properties": pa.array([x[1] for x in part], t)}))
            assert _records(s) == expected and len(r["phy_offset"]) == len(part)
            assert s.get_by_offset(int(r["phy_offset"][0])).topic == ("SCHEDULE_TOPIC_XXXX" if part is rows else "T")


@pytest.mark.parametrize("kw,error", [
    ({"flag": [0, 1 << 31, 0]}, InvalidArgumentError),
    ({"sys_flag": -1}, InvalidArgumentError),
    ({"born_timestamp": [0, -5, 0]}, InvalidArgumentError),
    ({"reconsume_times": [1, 2]}, InvalidArgumentError),
    ({"reconsume_times": [0.5, 1, 2]}, InvalidArgumentTypeError),
    ({"flag": True}, InvalidArgumentTypeError),
    ({"born_host": [None, "nohost", None]}, InvalidArgumentError),
    ({"born_host": "1.2.3.4:99999999999"}, InvalidArgumentError),
    ({"born_host": ["1.2.3.4:65536", None, None]}, InvalidArgumentError),     # RocketMQ's decoder refuses it
    ({"born_host": [None, "[::1]:65536", None]}, InvalidArgumentError),
    ({"born_host": [None, 5, None]}, InvalidArgumentTypeError),
    ({"queue_ids": [0, None, -2]}, InvalidArgumentError),
])
def test_message_fields_checked_before_anything_is_written(tmp_path, kw, error):
    with MessageStore(tmp_path / "s", CFG) as s:
        with pytest.raises(error):
            s.put_columns("T", [b"a", b"b", b"c"], **kw)
        assert s.max_phy_offset == 0


@pytest.mark.parametrize("change,error,text", [
    (lambda b, pa: b.set_column(1, "topic", pa.array(["T", None, "T"])), InvalidArgumentError, "row 1 has no topic"),
    (lambda b, pa: b.set_column(2, "body", pa.array([b"", b"", None], pa.binary())), InvalidArgumentError,
     "row 2 has no body"),
    (lambda b, pa: b.append_column("keys", pa.array([["a"], ["b", None], []], pa.list_(pa.string()))),
     InvalidArgumentTypeError, "row 1"),
    (lambda b, pa: b.append_column("properties", pa.array([[], [("", "v")], []], pa.map_(pa.string(), pa.string()))),
     InvalidArgumentError, "row 1"),
    (lambda b, pa: b.append_column("tags", pa.array(["a", "b\x01", "c"])), InvalidArgumentError, "row 1"),
    (lambda b, pa: b.append_column("flag", pa.array(["1", "2", "3"])), InvalidArgumentTypeError, "flag"),
    (lambda b, pa: b.append_column("queue_id", pa.array([0, -1, None], pa.int32())), InvalidArgumentError,
     "queue_ids"),
    (lambda b, pa: b.append_column("born_host", pa.array(["1.2.3.4:5", "x", None])), InvalidArgumentError, "'x'"),
    (lambda b, pa: b.append_column("properties", pa.array([[], [], []], pa.map_(pa.string(), pa.int32()))),
     InvalidArgumentTypeError, "map<string, string>"),
    (lambda b, pa: b.append_column("born_timestamp", pa.array([1, 1 << 60, 2], pa.timestamp("s"))),
     InvalidArgumentError, "s is out of range in ms"),   # * 1000 wrapped around int64, stored a wrong time
    (lambda b, pa: b.append_column("body", b.column(2)), InvalidArgumentError, "['body'] appear more than once"),
    (lambda b, pa: b.to_pydict(), InvalidArgumentTypeError, "not dict"),
    (lambda b, pa: pa.RecordBatchReader.from_batches(b.schema, [b]), InvalidArgumentTypeError, "RecordBatchReader"),
])
def test_put_arrow_bad_rows_store_nothing(tmp_path, change, error, text):
    pa = pytest.importorskip("pyarrow")
    batch = change(pa.record_batch({"store": ["s"] * 3, "topic": ["T"] * 3, "body": pa.array([b"a"] * 3, pa.binary())}),
                   pa)
    with MessageStore(tmp_path / "s", CFG) as s:
        with pytest.raises(error, match=re.escape(text)):
            s.put_arrow(batch)
        assert s.max_phy_offset == 0


def test_put_arrow_of_no_rows_puts_none(tmp_path):
    pa = pytest.importorskip("pyarrow")
    with MessageStore(tmp_path / "s", CFG) as s:
        res = s.put_arrow(pa.table({"topic": pa.array([], pa.string()), "body": pa.array([], pa.binary())}))
        want = {"phy_offset": np.int64, "size": np.int64, "queue_id": np.int32, "queue_offset": np.int64}
        assert {k: (len(v), v.dtype) for k, v in res.items()} == {k: (0, t) for k, t in want.items()}
        assert s.max_phy_offset == 0


@pytest.mark.parametrize("host", ["1.2.3.4:5", "255.255.255.255:65535", "1.2.3.4:65536", "0.0.0.0:0", "10.0.0.1:0080",
                                  "/10.0.0.1:80", "[::1]:80", "[fe80::a:b]:1", "01.2.3.4:5", "256.1.1.1:1",
                                  "1.2.3.4:2147483648", "1.2.3.4:12345678901", "1.2.3:4", "1.2.3.4", "1.2.3.4:",
                                  ":5", "1.2.3.4:+5", "1.2.3.4.5:6", "a.b.c.d:1", ""])
def test_packed_host_column_is_pack_host(host):
    """The C packer of born-host columns agrees with pack_host (IPv4 in C, the rest in
    Python): the same bytes, or the same refusal."""
    from rmqstore._record import pack_host, pack_hosts
    data = host.encode()
    try:
        want = pack_host(host)
    except InvalidArgumentError:
        with pytest.raises(InvalidArgumentError):
            pack_hosts(np.array([0, len(data)], np.int64), data, np.ones(1, np.uint8))
        return
    packed, offsets = pack_hosts(np.array([0, len(data), len(data)], np.int64), data, np.array([1, 0], np.uint8))
    assert (packed, offsets.tolist()) == (want, [0, len(want), len(want)])


def test_kernel_refuses_bad_packed_hosts(tmp_path):
    with MessageStore(tmp_path / "s", CFG) as s:
        put = s.commitlog.appender.put_columns
        for data, offsets in ((b"12345", [0, 5]), (b"12345678", [0, 4, 8]), (b"12345678", [0, 9])):
            with pytest.raises(InvalidArgumentError):
                put(["T"], None, b"a", [0, 1], born_host_data=data, born_host_offsets=offsets)
        assert s.max_phy_offset == 0


def _bodies_of_every_kind():
    """Bodies as put takes them, each kind put_columns copies from where it lies: bytes,
    empty bytes, bytearray, a memoryview of part of a larger buffer, a numpy array, and a
    bytes subclass (numpy.bytes_)."""
    big = bytes(range(256)) * 40
    return [b"plain", b"", bytearray(b"mutable"), bytearray(), memoryview(big)[100:3100], memoryview(b""),
            np.frombuffer(big, np.uint8)[:777], np.arange(6, dtype=np.int32), np.bytes_(b"np-bytes"), big]


@pytest.mark.parametrize("container", [list, tuple, iter])
def test_every_body_kind_same_records_as_put(tmp_path, container):
    bodies = _bodies_of_every_kind()
    with MessageStore(tmp_path / "put", CFG) as s:
        for b in bodies:
            s.put(Message("T", b, tags="TagA", keys="k", properties={"p": "v"}), 1)
        expected = _records(s)
    with MessageStore(tmp_path / "columns", CFG) as s:
        r = s.put_columns("T", container(bodies), queue_ids=1, tags="TagA", keys=["k"] * len(bodies),
                          properties={"p": "v"})
        assert _records(s) == expected and r["size"].tolist() == [len(x) for x in expected]
        assert [bytes(m.body) for m in s.scan(check_crc=True)] == [bytes(memoryview(b)) for b in bodies]


@pytest.mark.parametrize("bad", ["too-large bytes", "too-large bytearray", "strided memoryview", "str", "int"])
def test_bad_body_item_stores_nothing_and_unpins(tmp_path, bad):
    bodies = [bytearray(b"a%d" % i) if i % 2 else b"b%d" % i for i in range(40)]
    bodies[17] = {"too-large bytes": b"x" * (1 << 16), "too-large bytearray": bytearray(1 << 16),
                  "strided memoryview": memoryview(b"abcdef")[::2], "str": "text", "int": 5}[bad]
    error = MessageTooLargeError if bad.startswith("too-large") else InvalidArgumentTypeError
    with MessageStore(tmp_path / "s", CFG) as s:
        s.put(Message("T", b"kept"))
        with pytest.raises(error):
            s.put_columns("T", bodies)
        assert [bytes(m.body) for m in s.scan()] == [b"kept"]
    for b in bodies:
        if isinstance(b, bytearray):
            b.extend(b"!")      # no buffer export left behind: a pinned bytearray cannot be resized


def test_bytearray_bodies_are_released_after_the_call(tmp_path):
    bodies = [bytearray(b"x" * 100) for _ in range(10)]
    with MessageStore(tmp_path / "s", CFG) as s:
        s.put_columns("T", bodies)
        for b in bodies:
            b.extend(b"y")


def test_bodies_changed_by_other_threads_during_the_call(tmp_path):
    """Another thread changes the list (items replaced, appended, removed) and the bytes of
    bytearray items while put_columns copies them with the GIL released: every record is a
    whole body some item held, and its CRC matches what was stored."""
    import threading
    size, n = 4000, 600          # 2.4 MB: written without the GIL
    bodies = [bytearray(bytes([i % 251]) * size) if i % 2 else bytes([i % 251]) * size for i in range(n)]
    stop = threading.Event()

    def mutate():
        k = 0
        while not stop.is_set():
            k += 1
            b = bodies[k % n]
            if isinstance(b, bytearray):
                b[k % size] = 255                                # its bytes change under the copy
            else:
                bodies[k % n] = bytes([254]) * size              # the list changes
            if k % 7 == 0:
                bodies.append(b"new")
                bodies.pop()

    cfg = CFG.with_(commitlog_file_size=1 << 22)
    with MessageStore(tmp_path / "s", cfg) as s:
        t = threading.Thread(target=mutate)
        t.start()
        try:
            results = [s.put_columns("T", bodies, queue_ids=0) for _ in range(5)]
        finally:
            stop.set()
            t.join()
        stored = list(s.scan(check_crc=True))
        assert len(stored) == sum(len(r["size"]) for r in results) >= 5 * n   # n, or n + 1 while one was appended
        for m in stored:
            body = bytes(m.body)
            assert body == b"new" or len(body) == size and len(set(body) - {254, 255}) <= 1   # one item's bytes
        s.wait_dispatched()
        assert s.verify().ok


class _Opaque:
    """Neither a sequence nor an int."""


class _Index:
    """An integer that is no int: it has __index__ (numpy's scalars are alike)."""

    def __index__(self):
        return 1


@pytest.mark.parametrize("name", ["topic", "bodies", "queue_ids", "tags", "keys", "properties", "flag",
                                  "born_timestamp", "born_host", "reconsume_times"])
def test_a_value_that_is_no_column_is_a_type_error(tmp_path, name):
    """A scalar of the wrong kind, or an object that is neither one value nor a column
    (a float, a 0-d array, a number where a str or a mapping is due), is an
    InvalidArgumentTypeError that stores nothing; a 0-d integer array or an __index__
    object is one int for every row, as an int is."""
    args = {"topic": "T", "bodies": [b"a", b"b"], "queue_ids": 0}
    with MessageStore(tmp_path / "s", CFG) as s:
        for bad in [5, 1.5, np.float64(1), np.array(b"ab"), np.array(1.5), np.array(True), _Opaque(), b"ab"]:
            if isinstance(bad, int) and name in ("queue_ids", "flag", "born_timestamp", "reconsume_times"):
                continue
            with pytest.raises(InvalidArgumentTypeError):
                s.put_columns(**{**args, name: bad})
        assert s.max_offset("T", 0) == 0
        if name in ("queue_ids", "flag", "reconsume_times"):
            for one in (np.array(1), _Index()):
                s.put_columns(**{**args, name: one})
            s.wait_dispatched()
            assert [getattr(m, {"queue_ids": "queue_id"}.get(name, name)) for m in s.scan()] == [1] * 4


@pytest.mark.parametrize("generate", [False, True])
def test_properties_naming_what_a_column_sets_as_put(tmp_path, generate):
    """properties that name TAGS, KEYS or UNIQ_KEY beside tags / keys columns (or generated
    unique keys) hold each name once, where the dict has it, with the row's value over the
    dict's, as put stores them (they were appended: a record with the name twice)."""
    cfg = CFG.with_(generate_uniq_key=generate)
    bodies, tags, keys = [b"a", b"bc", b"d"], ["x", None, ""], ["k", None, ["p", "q"]]
    props = {"a": "1", "KEYS": "dk", "TAGS": "dt", "b": None, "UNIQ_KEY": "u"}
    with MessageStore(tmp_path / "put", cfg) as s:
        for b, t, k in zip(bodies, tags, keys, strict=True):
            s.put(Message("T", b, tags=t, keys=k, properties=props), 0)
        for b in bodies:
            s.put(Message("T", b, tags="c", properties={"TAGS": "dt", "UNIQ_KEY": "u"}), 0)
        expected = _records(s)
    with MessageStore(tmp_path / "columns", cfg) as s:
        s.put_columns("T", bodies, queue_ids=0, tags=tags, keys=keys, properties=props)
        s.put_columns("T", bodies, queue_ids=0, tags="c", properties={"TAGS": "dt", "UNIQ_KEY": "u"})
        assert _records(s) == expected
        assert [list(m.properties) for m in s.scan()][:2] == [["a", "KEYS", "TAGS", "UNIQ_KEY"]] * 2


def test_an_empty_uniq_key_property_is_generated_in_place(tmp_path):
    with MessageStore(tmp_path / "s", CFG.with_(generate_uniq_key=True)) as s:
        s.put_columns("T", [b"a", b"b"], properties={"UNIQ_KEY": "", "z": "1"})
        got = [m.properties for m in s.scan()]
    assert [list(p) for p in got] == [["UNIQ_KEY", "z"]] * 2
    assert len({p["UNIQ_KEY"] for p in got}) == 2 and all(p["UNIQ_KEY"] for p in got)


@pytest.mark.parametrize("kw,error", [
    ({"topic": None}, InvalidArgumentTypeError),                                  # numpy's ValueError before
    ({"queue_ids": [[0], [1], [2]]}, InvalidArgumentTypeError),                   # TypeError from min()
    ({"queue_ids": np.zeros((1, 3), np.int64)}, InvalidArgumentTypeError),        # ValueError from min()
    ({"queue_ids": iter([-1, 0, 0])}, InvalidArgumentError),                      # read twice: the check saw none
    ({"born_host": [{"h": 1}, None, None]}, InvalidArgumentTypeError),            # unhashable: a TypeError
    ({"born_host": "ARROW_TABLE"}, InvalidArgumentTypeError),                     # AttributeError: num_chunks
    ({"flag": "ARROW_TABLE"}, InvalidArgumentTypeError),
    ({"bodies": "ARROW_TABLE"}, InvalidArgumentTypeError),
])
def test_columns_of_the_wrong_kind_store_nothing(tmp_path, kw, error):
    pa = pytest.importorskip("pyarrow")
    args = {"topic": "T", "bodies": [b"a", b"b", b"c"]}
    for k, v in kw.items():
        args[k] = pa.table({"c": [1, 2, 3]}) if isinstance(v, str) and v == "ARROW_TABLE" else v
    with MessageStore(tmp_path / "s", CFG) as s:
        with pytest.raises(error):
            s.put_columns(**args)
        assert s.max_phy_offset == 0


def test_masked_entries_of_an_integer_column_are_nulls(tmp_path):
    """A numpy masked array: its masked entries are None (round robin, 0), not the values
    under the mask."""
    qids = np.ma.masked_array([2, 7, 1], mask=[False, True, False])
    flags = np.ma.masked_array([5, 9, 6], mask=[False, True, False])
    with MessageStore(tmp_path / "s", CFG) as s:
        r = s.put_columns("T", [b"a", b"b", b"c"], queue_ids=qids, flag=flags)
        assert r["queue_id"].tolist() == [2, 0, 1]
        assert [m.flag for m in s.scan()] == [5, 0, 6]
        # unsigned: the null (-1 for queue ids) does not fit the dtype (numpy's TypeError before)
        r = s.put_columns("T", [b"d", b"e"], queue_ids=np.ma.masked_array(np.array([1, 3], np.uint8), mask=[0, 1]))
        assert r["queue_id"].tolist() == [1, 1]     # the null: round robin, on from the call before
        with pytest.raises(InvalidArgumentError):
            s.put_columns("T", [b"f"], queue_ids=np.ma.masked_array(np.array([1 << 63], np.uint64), mask=[0]))


@pytest.mark.parametrize("props", [{"\ud800": "v"}, {"k": "\ud800"}, {"\ud800": None}, {"TAGS": "d", "\ud800": None}])
def test_property_text_that_is_not_unicode_stores_nothing(tmp_path, props):
    """A lone surrogate in a property name or value is an InvalidArgumentError, as Message
    refuses it (a bare UnicodeEncodeError before, or a name with a None value let through)."""
    with MessageStore(tmp_path / "s", CFG) as s:
        s.put(Message("T", b"kept"))
        with pytest.raises(InvalidArgumentError):
            s.put_columns("T", [b"a", b"b"], tags=["x", "y"], properties=props)
        with pytest.raises(InvalidArgumentError):
            Message("T", b"a", properties=props)
        assert [bytes(m.body) for m in s.scan()] == [b"kept"]
