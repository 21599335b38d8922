"""Spark, round 2: projection (a user schema or the columns option), the "rocketmq" writer and
its save modes, export options, and micro-batches bounded by maxBytesPerTrigger."""
import os
import shutil
from datetime import datetime, timezone

import pytest

from rmqstore import Message, MessageStore, StoreConfig, batch
from rmqstore.errors import CorruptRecordError, InvalidArgumentError

from conftest import SMALL_INDEX, holed_last_segment

pytestmark = pytest.mark.spark
pa = pytest.importorskip("pyarrow")
CONTENT = ("topic", "queue_id", "tags", "keys", "uniq_key", "properties", "body", "body_crc", "flag", "sys_flag",
           "born_timestamp", "born_host", "reconsume_times")
WRITE_OPTIONS = dict(indexSlots=1000, indexEntries=4000, commitlogFileSize=1 << 20, strictTopicNames="false")


def _varied_store(path, n=300):
    """A store whose messages vary in every field the writer takes."""
    cfg = StoreConfig(commitlog_file_size=64 * 1024, consume_queue_entries=50, **SMALL_INDEX)
    with MessageStore(path, cfg) as st:
        for i in range(n):
            st.put(Message(("TopicA", "TopicB", "%RETRY%g")[i % 3], bytes([i % 251]) * (i % 40),
                           tags=None if i % 5 == 0 else f"t{i % 4}", keys=None if i % 3 else [f"k{i}", "hot"],
                           properties={"UNIQ_KEY": f"U{i:08d}", "p": "v" * (i % 3 + 1)}, flag=i % 7,
                           sys_flag=0x1 if i % 11 == 0 else 0, born_timestamp=1_700_000_000_000 + i,
                           born_host="[fe80::1]:9" if i % 13 == 0 else f"10.0.0.{i % 9}:{1000 + i}",
                           reconsume_times=i % 2), queue_id=i % 4)
        st.wait_dispatched(10)
    return path


def _content(rows):
    out = [{c: (dict(r[c]) if c == "properties" else r[c]) for c in CONTENT} for r in rows]
    return sorted(out, key=lambda r: (r["topic"], r["uniq_key"] or "", r["body"]))


def _exception_text(excinfo):
    return str(excinfo.value)


def test_user_schema_and_columns_option_project(spark, clean_498):
    store, manifest = clean_498
    df = spark.read.format("rocketmq").schema("topic string, queue_id int, body binary").load(str(store))
    assert df.columns == ["topic", "queue_id", "body"]
    got = sorted((r.topic, r.queue_id, bytes(r.body)) for r in df.collect())
    full = spark.read.format("rocketmq").load(str(store)).select("topic", "queue_id", "body").collect()
    assert got == sorted((r.topic, r.queue_id, bytes(r.body)) for r in full) and len(got) == len(manifest["messages"])
    df = spark.read.format("rocketmq").option("columns", "msg_id, phy_offset").load(str(store))
    assert df.columns == ["msg_id", "phy_offset"]
    assert {r.phy_offset: r.msg_id for r in df.collect()} == \
        {m["commitLogOffset"]: m["msgId"] for m in manifest["messages"]}
    # a filter on a column outside the projection is still applied by the reader
    m = next(m for m in manifest["messages"] if m["uniqKey"])
    assert spark.read.format("rocketmq").option("columns", "phy_offset").option("uniqKey", m["uniqKey"]) \
        .load(str(store)).collect()[0].phy_offset == m["commitLogOffset"]


@pytest.mark.parametrize("reader,message", [
    (lambda r: r.schema("topic string, nope int"), "unknown column 'nope'"),
    (lambda r: r.schema("topic string, queue_id string"), "column 'queue_id' is int, not string"),
    (lambda r: r.option("columns", "topic,zzz"), "unknown column(s) ['zzz']"),
])
def test_projection_errors(spark, clean_498, reader, message):
    store, _ = clean_498
    with pytest.raises(Exception) as e:
        reader(spark.read.format("rocketmq")).load(str(store)).count()
    assert message in _exception_text(e)


def test_writer_round_trip_and_save_modes(spark, tmp_path):
    from rmqstore.spark import jobs
    src = _varied_store(tmp_path / "src")
    df = spark.read.format("rocketmq").load(str(src)).repartition(3)
    out = tmp_path / "out"
    summary = jobs.write(df, out, **WRITE_OPTIONS)
    stores = sorted(p for p in os.listdir(out) if not p.startswith("_"))
    assert summary["messages"] == 300 and summary["stores"] == len(stores) == 3
    assert summary["bytes"] == sum(batch.count_records(out / name)[1] for name in stores) \
        == batch.count_records(src)[1]
    back = spark.read.format("rocketmq").load(str(out))
    assert _content(back.collect()) == _content(df.collect())
    for name in stores:   # consume queues and index built, as the store's own dispatch would
        with MessageStore(out / name, StoreConfig(**{**SMALL_INDEX, "commitlog_file_size": 1 << 20}),
                          read_only=True) as st:
            queued = sum(len(st.consume_queue_entries(t, q)) for t in st.topics() for q in st.queue_ids(t))
            hot = st.query_by_key("TopicA", "hot", max_num=1000)
        rows = back.filter(back.store == str(out / name)).collect()
        assert len([r for r in rows if r.topic == "TopicA" and r.keys and "hot" in r.keys]) == len(hot) > 0
        assert queued == len(rows)
    with pytest.raises(Exception, match="already holds 3 RocketMQ store"):
        jobs.write(df, out, mode="error", **WRITE_OPTIONS)
    assert jobs.write(df, out, mode="Ignore", **WRITE_OPTIONS)["messages"] == 0   # any case, as Spark's modes
    jobs.write(df.limit(10), out, mode="APPEND", **WRITE_OPTIONS)
    assert spark.read.format("rocketmq").load(str(out)).count() == 310
    jobs.write(df.limit(7), out, mode="overwrite", **WRITE_OPTIONS)
    assert spark.read.format("rocketmq").load(str(out)).count() == 7
    assert not os.path.exists(out / "_temporary")
    # overwrite removes only its own stores, none while one is open, and no other store
    parts = sorted(p for p in os.listdir(out) if not p.startswith("_"))
    with MessageStore(out / parts[0], StoreConfig(**{**SMALL_INDEX, "commitlog_file_size": 1 << 20})):
        with pytest.raises(Exception, match="open for writing"):
            jobs.write(df.limit(3), out, mode="overwrite", **WRITE_OPTIONS)
    assert sorted(p for p in os.listdir(out) if not p.startswith("_")) == parts
    assert spark.read.format("rocketmq").load(str(out)).count() == 7
    broker = _varied_store(out / "store")
    with pytest.raises(Exception, match=r"did not write: \['store'\]"):
        jobs.write(df.limit(3), out, mode="overwrite", **WRITE_OPTIONS)
    assert batch.count_records(broker)[0] == 300 and sorted(os.listdir(out)) == sorted(parts + ["_SUCCESS", "store"])


def _records(path):
    """Every record of a store, STORETIMESTAMP zeroed."""
    out = []
    with MessageStore(path, StoreConfig(commitlog_file_size=64 * 1024, **SMALL_INDEX), read_only=True) as st:
        for m in st.scan():
            raw = bytearray(st.commitlog.read(m.phy_offset, m.store_size))
            at = 48 + (20 if m.sys_flag & 0x10 else 8)
            raw[at:at + 8] = bytes(8)
            out.append(bytes(raw))
    return out


def test_write_store_copies_a_store_record_for_record(tmp_path):
    """The writer (no Spark: its task body) turns the source's batches of a store back into
    the same records at the same offsets, store times aside, however the batches are cut."""
    from rmqstore.spark.writer import store_config, write_store
    src = _varied_store(tmp_path / "src")
    table = pa.Table.from_batches([rb for p, b, _ in batch.segment_files(src) for rb in batch.iter_arrow(p, b)])
    cfg = store_config({"commitlogFileSize": str(64 * 1024), "consumeQueueEntries": "50", "indexSlots": "1000",
                        "indexEntries": "4000"})
    assert write_store(tmp_path / "out", cfg, table.to_batches(max_chunksize=70)) == (300, batch.count_records(src)[1])
    assert _records(tmp_path / "out") == _records(src)


def test_write_store_names_a_row_without_topic_or_body(tmp_path):
    from rmqstore.errors import InvalidArgumentError
    from rmqstore.spark.writer import store_config, write_store
    good = pa.record_batch({"topic": ["T", "T"], "body": pa.array([b"a", b"b"], pa.binary())})
    for column, values in (("topic", ["T", None, "T"]), ("body", pa.array([b"", b"", None], pa.binary()))):
        rb = pa.record_batch({"topic": ["T"] * 3, "body": pa.array([b"x"] * 3, pa.binary()), column: values})
        with pytest.raises(InvalidArgumentError, match=rf"rocketmq writer: row {1 if column == 'topic' else 2} "
                                                      rf"has no {column}"):
            write_store(tmp_path / column, store_config({"commitlogFileSize": "65536", "indexSlots": "1000",
                                                          "indexEntries": "4000"}), [good, rb])
        with MessageStore(tmp_path / column, StoreConfig(**SMALL_INDEX), read_only=True) as st:
            assert [bytes(m.body) for m in st.scan()] == [b"a", b"b"]


def test_written_stores_rebuild_to_the_same_queues(spark, tmp_path):
    """A written store's consume queues are what rebuilding them from its commitlog gives."""
    from rmqstore.spark import jobs
    src = _varied_store(tmp_path / "src", 120)
    spark.read.format("rocketmq").load(str(src)).coalesce(1).write.format("rocketmq").mode("append") \
        .options(**{k: str(v) for k, v in WRITE_OPTIONS.items()}).option("consumeQueueEntries", "50") \
        .save(str(tmp_path / "out"))
    (store,) = [tmp_path / "out" / p for p in os.listdir(tmp_path / "out") if not p.startswith("_")]
    cfg = StoreConfig(consume_queue_entries=50, commitlog_file_size=1 << 20, **SMALL_INDEX)
    jobs.rebuild(spark, str(store), str(tmp_path / "rebuilt"), cfg)
    for sub, at_least in (("consumequeue", 12), ("index", 1)):
        want, got = _files(store / sub), _files(tmp_path / "rebuilt" / sub)
        assert len(want) >= at_least and got == want, sub


def _files(top):
    """{relative path: bytes} of the files under ``top``; index files (named by creation
    time) by their rank instead."""
    paths = sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)
    return {(i if top.name == "index" else p): open(top / p, "rb").read() for i, p in enumerate(paths)}


def test_writer_rejects_bad_schema(spark, tmp_path):
    df = spark.createDataFrame([("T", 1)], "topic string, queue_id int")
    with pytest.raises(Exception, match=r"column\(s\) \['body'\] are required"):
        df.write.format("rocketmq").mode("append").save(str(tmp_path / "o"))
    df = spark.createDataFrame([("T", b"x", "y")], "topic string, body binary, colour string")
    with pytest.raises(Exception, match="unknown column 'colour'"):
        df.write.format("rocketmq").mode("append").save(str(tmp_path / "o"))


def test_writer_takes_arrays_and_maps_that_cannot_hold_null(spark, tmp_path):
    """F.array / F.create_map make columns that cannot hold null: the writer refused them
    with "column 'keys' must be array<string>, not array<string>", which no user can act
    on. They are the same type for the writer, and are written and read back."""
    from pyspark.sql import functions as F

    from rmqstore.spark import jobs
    df = spark.createDataFrame([("T", b"x")], "topic string, body binary") \
        .withColumn("keys", F.array(F.lit("k1"), F.lit("k2"))) \
        .withColumn("properties", F.create_map(F.lit("a"), F.lit("b")))
    assert jobs.write(df, tmp_path / "o")["messages"] == 1
    (row,) = spark.read.format("rocketmq").load(str(tmp_path / "o")).select("keys", "properties").collect()
    assert row.keys == ["k1", "k2"] and row.properties["a"] == "b"


@pytest.mark.parametrize("options, named", [({"commitlogFileSize": "12"}, "commitlogFileSize"),
                                            ({"MESSAGEVERSION": "7"}, "messageVersion"),
                                            ({"storeHost": "nonsense"}, "storeHost")])
def test_writer_option_values_out_of_range_name_the_option(options, named):
    """A StoreConfig value out of range named the field (commitlog_file_size), not the
    option the user gave; now "option commitlogFileSize: ..."."""
    pytest.importorskip("pyspark")
    from rmqstore.spark.writer import store_config
    with pytest.raises(InvalidArgumentError, match=f"rocketmq writer: option {named}: "):
        store_config(options)


def test_export_row_groups_sorting_and_success_marker(spark, tmp_path):
    import pyarrow.parquet as pq

    from rmqstore.spark import jobs
    src = _varied_store(tmp_path / "src", 600)
    jobs.export(spark, [str(src)], tmp_path / "pq", row_group_rows=40, sort_by=["queue_id", "born_timestamp"],
                compression="zstd")
    assert os.path.getsize(tmp_path / "pq" / "_SUCCESS") == 0
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "pq") for f in fs if f.endswith(".parquet")]
    rows = 0
    for f in files:
        meta = pq.ParquetFile(f).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(s == 40 for s in sizes[:-1]) and 0 < sizes[-1] <= 40
        assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
        t = pq.read_table(f, columns=["queue_id", "born_timestamp"]).to_pylist()
        assert t == sorted(t, key=lambda r: (r["queue_id"], r["born_timestamp"]))
        rows += meta.num_rows
    assert rows == 600
    with pytest.raises(Exception, match="unknown column"):
        jobs.export(spark, [str(src)], tmp_path / "pq2", sort_by=["nope"])
    with pytest.raises(InvalidArgumentError, match="compression must be one of"):
        jobs.export(spark, [str(src)], tmp_path / "pq2", compression="zip")
    assert not os.path.exists(tmp_path / "pq2")


def test_max_bytes_per_trigger_bounds_micro_batches(spark, tmp_path):
    store = tmp_path / "backlog"
    with MessageStore(store, StoreConfig(commitlog_file_size=64 * 1024, **SMALL_INDEX)) as st:
        st.put_batch([Message("TopicA", b"m%04d" % i + b"." * 100) for i in range(1500)])
        size = batch.count_records(store)[1] // 1500
        q = spark.readStream.format("rocketmq").option("maxBytesPerTrigger", str(20 * size)) \
            .option("columns", "phy_offset,body").load(str(store)) \
            .writeStream.format("memory").queryName("bounded").start()
        try:
            q.processAllAvailable()
            progress = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
            got = [bytes(r.body)[:5] for r in spark.table("bounded").orderBy("phy_offset").collect()]
        finally:
            q.stop()
    assert got == [b"m%04d" % i for i in range(1500)]
    assert max(progress) <= 20 and len(progress) >= 1500 // 20


def test_advance_stops_on_record_boundaries(tmp_path):
    store = tmp_path / "s"
    with MessageStore(store, StoreConfig(commitlog_file_size=8192, **SMALL_INDEX)) as st:
        res = st.put_batch([Message("T", b"x" * 300) for _ in range(60)])
    starts = [r.phy_offset for r in res]
    ends = set(starts) | {r.phy_offset + r.size for r in res} | {p for p, _, _ in
                                                                 [(b, 0, 0) for _, b, _ in batch.segment_files(store)]}
    pos, steps = starts[0], 0
    while pos < res[-1].phy_offset + res[-1].size:
        nxt = batch.advance(store, pos, 1000)
        assert nxt > pos and nxt in ends
        assert nxt - pos <= 1000 or nxt == min(e for e in ends if e > pos)
        pos, steps = nxt, steps + 1
    assert pos == res[-1].phy_offset + res[-1].size and steps >= 60 * 300 // 1000


def test_born_timestamps_survive(spark, tmp_path):
    src = _varied_store(tmp_path / "src", 5)
    rows = spark.read.format("rocketmq").option("columns", "born_timestamp").load(str(src)).collect()
    assert sorted(r.born_timestamp for r in rows) == \
        [datetime.fromtimestamp((1_700_000_000_000 + i) / 1000, timezone.utc).replace(tzinfo=None) for i in range(5)]
    shutil.rmtree(src)


def test_partitioned_writer_splits_buffers_and_reopens(tmp_path, monkeypatch):
    """The export task's writer (no Spark): rows land in topic=/date= files, equal to what
    went in; under a small memory cap and one open file at a time it writes smaller row
    groups and more files, and still loses and repeats nothing."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from rmqstore.spark import partitioned
    src = _varied_store(tmp_path / "src", 600)
    batches = [rb for p, b, _ in batch.segment_files(src) for rb in batch.iter_arrow(p, b, batch_bytes=4096)]
    want = pa.Table.from_batches(batches)
    day = datetime.fromtimestamp(want.column("store_timestamp")[0].value / 1e6, timezone.utc).date()
    for cap, max_open in ((1 << 30, 128), (2000, 1)):
        monkeypatch.setattr(partitioned, "MAX_OPEN", max_open)
        out = tmp_path / f"out{max_open}"
        w = partitioned.PartitionedWriter(str(out), 7, batch.arrow_schema(), 64, buffer_bytes=cap)
        for rb in batches:
            w.write(rb)
        w.close()
        assert sorted(os.listdir(out)) == ["_temporary", "topic=%25RETRY%25g", "topic=TopicA", "topic=TopicB"]
        files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]
        assert all(f.startswith(str(out / "topic=")) and f"/date={day}/part-00007-" in f for f in files)
        groups = [pq.ParquetFile(f).metadata.row_group(i).num_rows for f in files
                  for i in range(pq.ParquetFile(f).metadata.num_row_groups)]
        if max_open == 128:   # one file per partition, full row groups but the last
            assert len(files) == 3 and sorted(groups, reverse=True)[:6] == [64] * 6
        else:
            assert len(files) > 3 and max(groups) < 64
        got = ds.dataset(str(out), partitioning="hive", exclude_invalid_files=True).to_table()
        cols = [c for c in batch.arrow_schema().names if c != "topic"]
        assert got.select(cols).sort_by("phy_offset").to_pylist() == want.select(cols).sort_by("phy_offset").to_pylist()
        assert sorted(got.column("topic").to_pylist()) == sorted(want.column("topic").to_pylist())


@pytest.mark.parametrize("options", [
    {"splitBytes": "abc"}, {"splitBytes": "1e3"}, {"splitBytes": "1_0"}, {"splitBytes": " 12"}, {"splitBytes": "0"},
    {"batchBytes": "-1"}, {"batchBytes": str(1 << 70)}, {"minPartitions": "0"}, {"minPartitions": "x"},
    {"checkCrc": "yes"}, {"checkCrc": "1"}, {"since": "--5"}, {"until": "-"}, {"paths": "[not json"},
    {"paths": '{"a": 1}'}, {"paths": "[1, 2]"}, {"paths": "[" * 100_000}, {"maxBytesPerTrigger": "-1"},
    {"maxBytesPerTrigger": "lots"}, {"splitBytes": "9" * 5000}, {"since": "9" * 5000},
    {"topic": ""}, {"topic": "T,,U"}, {"topic": " "}, {"key": ""}, {"key": "k1 k2"}, {"uniqKey": ""},
], ids=lambda o: repr(o)[:40])
def test_source_options_of_the_wrong_form_name_the_option(tmp_path, options):
    """Source options int() or json.loads refused with a bare ValueError ("abc", "1e3",
    "--5", a malformed paths list), or took loosely ("1_0", " 12"), or that were silently
    false (checkCrc "yes"): InvalidArgumentError naming the option, before any Spark job.
    A topic, key or uniqKey no message can have (empty, blank, a key with a space) gave
    every row (topic "") or none, silently."""
    pytest.importorskip("pyspark")
    from rmqstore.spark.source import Scan, _StreamReader
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 16, **SMALL_INDEX)) as st:
        st.put(Message("T", b"x"))
    given = {"path": str(tmp_path / "s"), **options}
    with pytest.raises(InvalidArgumentError, match=next(iter(options))):
        _StreamReader(Scan(given), given)
    good = {"path": str(tmp_path / "s"), "splitBytes": "4096", "checkCrc": "TRUE", "since": "-5"}
    scan = Scan(good)
    assert (scan.split_bytes, scan.check_crc, scan.since) == (4096, True, -5)


def test_list_options_are_read_alike(tmp_path, caplog):
    """The topic option kept blanks ("TA, TB" read TA only, silently) where columns stripped
    them; both go through one parser now: names stripped, and a blank name or a name given
    twice is an InvalidArgumentError naming the option. A topic no store holds reads no rows
    (as a broker answers it), and is logged with the nearest held."""
    pytest.importorskip("pyspark")
    from rmqstore.spark.source import Scan, plan, projection
    from rmqstore.spark.source import _spark_schema as spark_schema
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 16, **SMALL_INDEX)) as st:
        st.put_batch([Message(t, t.encode()) for t in ("TA", "TB", "TC")])
    store = str(tmp_path / "s")
    options = {"path": store, "topic": " TA, TB ", "columns": " body , topic"}
    scan = Scan(options, projection(spark_schema(["body", "topic"]), options))
    assert scan.topics == {"TA", "TB"}
    with caplog.at_level("WARNING", "rmqstore.spark.source"):
        Scan({"path": store, "topic": "TA,TX"})
    assert "no store holds topic 'TX' (nearest: [" in caplog.text and "'TA' (" not in caplog.text
    assert sorted(r for part in plan(scan.stores) for path, base, start, end in part.pieces
                  for rb in scan.read(part.store, path, base, start, end) for r in rb.column("topic").to_pylist()) \
        == ["TA", "TB"]
    for name, value, message in (("topic", "TA,,TB", "name 2 is blank"), ("topic", "TA, TA", r"\['TA'\] twice"),
                                 ("columns", "body,", "name 2 is blank"), ("columns", "body, body", "twice")):
        with pytest.raises(InvalidArgumentError, match=f"option {name} .*{message}"):
            Scan({"path": store, name: value}, projection(spark_schema(["body"]), {name: value}))


def test_a_split_that_would_make_too_many_partitions_is_refused(tmp_path):
    """splitBytes 1 planned a partition per commitlog byte: a 1 GiB segment took the driver
    a billion ranges (memory and time without end). Now a plan of over MAX_PARTITIONS is
    InvalidArgumentError naming splitBytes and the least that works."""
    pytest.importorskip("pyspark")
    from rmqstore.spark.source import MAX_PARTITIONS, Scan, plan
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 16, **SMALL_INDEX)) as st:
        st.put_batch([Message("T", b"x" * 1000) for _ in range(70)])   # two 64 KiB segments
    scan = Scan({"path": str(tmp_path / "s"), "splitBytes": "1"})
    with pytest.raises(InvalidArgumentError, match="splitBytes 1 cuts 131072 bytes.*give splitBytes 2 or more"):
        plan(scan.stores, scan.split_bytes)
    assert 2 * MAX_PARTITIONS > 131072 > MAX_PARTITIONS and len(plan(scan.stores, 2)) == 65536


@pytest.mark.parametrize("value", ["1_000", " 1000", "1000 ", "\u0661\u0660\u0660\u0660", "1e3", "lots", "9" * 5000],
                         ids=lambda v: repr(v)[:20])
def test_writer_int_options_are_plain_integers(value):
    """The writer's StoreConfig options took what int() takes ("1_000", " 1000", other
    scripts' digits); only ASCII digits (and a sign) now, InvalidArgumentError naming the
    option; the range is StoreConfig's."""
    pytest.importorskip("pyspark")
    from rmqstore.spark.writer import store_config
    with pytest.raises(InvalidArgumentError, match="indexSlots"):
        store_config({"indexSlots": value})
    assert store_config({"indexSlots": "1000", "INDEXENTRIES": 4000}).index_entries == 4000


def test_pushed_time_filters_keep_a_bound_of_zero(tmp_path):
    """``until`` (or ``since``) 0 is a bound like any other: a pushed filter narrows it, never
    widens it (``self.until or ...`` took 0 for no bound: rows after time 0 came back)."""
    pytest.importorskip("pyspark")
    from pyspark.sql.datasource import GreaterThanOrEqual, LessThan

    from rmqstore.spark.source import Scan, plan
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 16, **SMALL_INDEX)) as st:
        st.put(Message("T", b"x"))
    scan = Scan({"path": str(tmp_path / "s"), "until": "0", "since": "0"})
    scan.push([LessThan(("store_timestamp",), 10 ** 18), GreaterThanOrEqual(("store_timestamp",), -(10 ** 18))])
    assert (scan.since, scan.until) == (0, 0)
    assert [rb.num_rows for part in plan(scan.stores) for path, base, start, end in part.pieces
            for rb in scan.read(part.store, path, base, start, end)] == []


@pytest.mark.spark
def test_unknown_options_are_refused_in_any_case(spark, tmp_path):
    """An option the source, the stream source or the writer does not take (a typo:
    chekCrc, a StoreConfig field in snake case) was ignored silently; it is now an
    InvalidArgumentError naming it and listing the valid ones. Names are case-insensitive
    as Spark passes them; Spark itself passes only path or paths."""
    src = _varied_store(tmp_path / "src", 20)
    def read():   # a DataFrameReader keeps the options it was given
        return spark.read.format("rocketmq")
    with pytest.raises(Exception, match=r"unknown option\(s\) \['chekcrc'\].*checkCrc"):
        read().option("chekCrc", "true").load(str(src)).count()
    with pytest.raises(Exception, match=r"unknown option\(s\) \['maxbytespertrigger'\]"):
        read().option("maxBytesPerTrigger", "10").load(str(src)).count()   # a stream's, not a batch's
    assert read().option("CHECKCRC", "true").option("Topic", "TopicA").load([str(src)]).count() == 7
    with pytest.raises(Exception, match=r"unknown option\(s\) \['splitbytes'\]"):
        spark.readStream.format("rocketmq").option("splitBytes", "1000").load(str(src)) \
            .writeStream.format("memory").queryName("bad_option").start().processAllAvailable()
    df = read().load(str(src))
    with pytest.raises(Exception, match=r"unknown option\(s\) \['commitlog_file_size'\].*commitlogFileSize"):
        df.write.format("rocketmq").mode("append").option("commitlog_file_size", "65536").save(str(tmp_path / "w"))
    df.write.format("rocketmq").mode("append").option("COMMITLOGFILESIZE", "65536").options(**WRITE_OPTIONS) \
        .save(str(tmp_path / "w"))
    assert spark.read.format("rocketmq").load(str(tmp_path / "w")).count() == 20


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_a_stream_at_a_hole_in_the_last_segment_does_not_stop_in_silence(tmp_path, monkeypatch, mode):
    """Zeros inside the last segment with records after them (a hole) stopped a stream there
    for good, every later trigger finding no new data. Once it stays at zeros for
    HOLE_SETTLE_SECONDS, the stream checks them: mode fail raises CorruptRecordError at the
    hole, mode skip goes on, the reader counting the hole as a corrupt region."""
    pytest.importorskip("pyspark")
    from rmqstore.spark import source
    at, after, end = holed_last_segment(tmp_path / "s")
    store = str(tmp_path / "s")
    options = {"path": store, "mode": mode}
    reader = source._StreamReader(source.Scan(options), options)
    assert reader.positions(reader.latestOffset({store: 0})) == {store: at}
    # not settled yet: a record may be in flight
    assert reader.positions(reader.latestOffset({store: at})) == {store: at}
    monkeypatch.setattr(source, "HOLE_SETTLE_SECONDS", 0.0)
    if mode == "fail":
        with pytest.raises(CorruptRecordError, match="zeros") as e:
            reader.latestOffset({store: at})
        assert e.value.offset == at
        return
    assert reader.positions(reader.latestOffset({store: at})) == {store: end}
    rows = [r for part in reader.partitions({store: at}, {store: end}) for rb in reader.read(part)
            for r in rb.column("phy_offset").to_pylist()]
    assert rows == after


def test_a_stream_at_the_end_of_data_finds_no_hole(tmp_path, monkeypatch):
    """The zeros after the last record (more may come) are no hole: the stream waits there."""
    pytest.importorskip("pyspark")
    from rmqstore.spark import source
    monkeypatch.setattr(source, "HOLE_SETTLE_SECONDS", 0.0)
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 20, **SMALL_INDEX)) as st:
        st.put_batch([Message("T", b"m%d" % i) for i in range(50)])
        end = st.max_phy_offset
        store = str(tmp_path / "s")
        reader = source._StreamReader(source.Scan({"path": store}), {"path": store})
        for _ in range(3):
            assert reader.positions(reader.latestOffset({store: end})) == {store: end}
        st.put(Message("T", b"more"))
        assert reader.positions(reader.latestOffset({store: end})) == {store: st.max_phy_offset}


def test_spark_job_paths_are_checked_as_paths(tmp_path):
    """A path with a NUL given to a job's output (``jobs.export``/``write``/``rebuild``, the
    writer) raised a bare ValueError from os.path; and one store path given as a str, not a
    list, was taken character by character ("no RocketMQ store at /the/store", which was
    one). Now a str or PathLike is one path, and a path that cannot be one (empty, NUL, not
    a path) is an InvalidArgumentError, raised before Spark is asked for anything."""
    from rmqstore.spark import jobs
    from rmqstore.spark.source import find_stores
    from rmqstore.spark.writer import StoreWriter
    store = str(_varied_store(tmp_path / "s", n=3))
    assert find_stores(store) == find_stores(tmp_path / "s") == find_stores([store]) == [store]
    calls = [lambda p: jobs.export(None, [store], p), lambda p: jobs.write(None, p),
             lambda p: jobs.rebuild(None, store, p), lambda p: StoreWriter(p, {}, True),
             lambda p: find_stores([store, p])]
    for bad in ("a\x00b", "", 5):
        for call in calls:
            with pytest.raises(InvalidArgumentError, match="(?i)path"):
                call(bad)
    with pytest.raises(InvalidArgumentError, match="a path or a list of paths"):
        find_stores(None)
    assert sorted(os.listdir(tmp_path)) == ["s"]


@pytest.mark.parametrize("job,kwargs", [("export", dict(row_group_rows="x")), ("export", dict(row_group_rows=None)),
                                        ("export", dict(row_group_rows=1.5)), ("export", dict(sort_by="topic")),
                                        ("export", dict(sort_by=5)), ("rebuild", dict(config=5)),
                                        ("rebuild", dict(config="x"))])
def test_spark_job_options_are_checked(tmp_path, job, kwargs):
    """jobs.export(row_group_rows="x") raised a bare TypeError, row_group_rows=1.5 went on
    to Spark, sort_by="topic" was read as the columns t, o, p, i, c, and jobs.rebuild(
    config=5) an AttributeError from deep inside: each is now an InvalidArgumentError
    before Spark is used or a file made."""
    from rmqstore.spark import jobs
    store = str(_varied_store(tmp_path / "s", n=3))
    call = {"export": lambda: jobs.export(None, [store], tmp_path / "out", **kwargs),
            "rebuild": lambda: jobs.rebuild(None, store, tmp_path / "out", **kwargs)}[job]
    with pytest.raises(InvalidArgumentError) as e:
        call()
    assert "'t', 'o'" not in str(e.value)   # sort_by="topic" named the unknown columns t, o, p, i, c
    assert sorted(os.listdir(tmp_path)) == ["s"]


@pytest.mark.parametrize("layout", [{"_SUCCESS": "", "topic=T/notes.csv": "mine"},
                                    {"topic=T/date=2026-01-01/data.csv": "mine"},
                                    {"topic=T/date=2026-01-01/part-00000-0.parquet/x": "a dir"},
                                    {"_SUCCESS/x": "a dir"}])
def test_export_replaces_no_other_data_partitioned_by_topic(tmp_path, layout):
    """export replaces an earlier export's directory, and took any directory whose entries
    were named ``topic=...`` (plus ``_SUCCESS``) for one: another tool's data partitioned by
    topic (``topic=T/notes.csv``) was deleted. Now only ``topic=T/date=D/part-*.parquet``
    files count, and anything else is refused and left as it was."""
    from rmqstore.spark import jobs
    store = str(_varied_store(tmp_path / "s", n=3))
    out = tmp_path / "data"
    for rel, text in layout.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(InvalidArgumentError, match="export did not write"):
        jobs.export(None, [store], out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_overwrite_refuses_a_link_named_as_its_own_store(tmp_path):
    """``mode("overwrite")`` took a symlink named ``part-*`` (to a store elsewhere) for one
    of its own stores: the commit removed the real part-* stores, then failed on the link
    with a bare OSError ("Cannot call rmtree on a symbolic link"), half done. Now a link is
    a store the writer did not write: refused before a task runs, every file left as it was;
    a broker's store and files that are no store are kept too."""
    from rmqstore.spark.writer import StoreWriter
    out = tmp_path / "brokers"
    _varied_store(out / "broker-a", n=5)
    _varied_store(tmp_path / "elsewhere", n=3)
    (out / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(InvalidArgumentError, match="broker-a"):
        StoreWriter(str(out), {}, True)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    shutil.rmtree(out / "broker-a")
    os.symlink(tmp_path / "elsewhere", out / "part-00000-0123456789ab-abcdef")
    with pytest.raises(InvalidArgumentError, match="part-00000"):
        StoreWriter(str(out), {}, True)
    os.unlink(out / "part-00000-0123456789ab-abcdef")
    _varied_store(out / "part-00001-0123456789ab-abcdef", n=2)
    w = StoreWriter(str(out), {}, True)
    w.commit([])
    assert sorted(os.listdir(out)) == ["_SUCCESS", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    with MessageStore(tmp_path / "elsewhere", read_only=True) as st:
        assert sum(1 for _ in st.scan()) == 3


@pytest.mark.parametrize("name", ["begin", "end"])
def test_query_names_its_own_time_argument(name):
    """jobs.query(begin="yesterday") was refused as "option since": the source's option,
    not the argument given. Now the error names begin or end, before any Spark job."""
    pytest.importorskip("pyspark")
    from rmqstore.spark import jobs
    with pytest.raises(InvalidArgumentError, match=f"^query: {name}: not a time"):
        jobs.query(None, ["/nonexistent"], **{name: "yesterday"})


def test_python_writers_get_arrow_batches_bounded_by_rows_not_bytes(spark, tmp_path):
    """session() lifts Spark's 64 MB limit on the Arrow batches a Python writer is sent
    (rmqstore.spark.DEFAULTS): 72 MB of rows arrive as one batch, under maxRecordsPerBatch;
    a byte limit given back splits them."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Recorder(DataSourceArrowWriter):
        def __init__(self, log):
            self.log = log

        def write(self, iterator):
            with open(self.log, "a") as f:
                f.writelines(f"{rb.num_rows}\n" for rb in iterator)
            return WriterCommitMessage()

    class RecordingSink(DataSource):
        @classmethod
        def name(cls):
            return "rmq_test_batch_recorder"

        def writer(self, schema, overwrite):
            return Recorder(self.options["path"])

    def batches(log, **conf):
        before = {k: spark.conf.get(k) for k in conf}
        try:
            for k, v in conf.items():
                spark.conf.set(k, v)
            spark.range(0, 2400, numPartitions=1).selectExpr("repeat('x', 30000) AS s") \
                .write.format("rmq_test_batch_recorder").mode("append").save(str(tmp_path / log))
        finally:
            for k, v in before.items():
                spark.conf.set(k, v)
        with open(tmp_path / log) as f:
            return [int(n) for n in f]
    spark.dataSource.register(RecordingSink)
    assert batches("default") == [2400]
    limited = batches("limited", **{"spark.sql.execution.arrow.maxBytesPerBatch": str(1 << 20)})
    assert sum(limited) == 2400 and len(limited) >= 60   # 1 MB: about 34 rows of 30 KB each
