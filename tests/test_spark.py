"""The public batch decoder (rmqstore.batch) and the Spark pipeline (rmqstore.spark) against
the RocketMQ 4.9.8 fixture manifest and stores written by the project."""
import hashlib
import os
import shutil

import pytest

from rmqstore import batch
from rmqstore.errors import CorruptRecordError

from conftest import SMALL_INDEX, holed_last_segment

pa = pytest.importorskip("pyarrow")


def _expected(m):
    """A manifest message as the columns to_arrow produces."""
    return dict(topic=m["topic"], queue_id=m["queueId"], queue_offset=m["queueOffset"], phy_offset=m["commitLogOffset"],
                store_size=m["storeSize"], msg_id=m["msgId"], uniq_key=m["uniqKey"], tags=m["tags"],
                keys=[k for k in m["keys"].split(" ") if k] if m["keys"] is not None else None,
                properties=m["properties"], body_crc=m["bodyCRC"], sys_flag=m["sysFlag"], flag=m["flag"],
                reconsume_times=m["reconsumeTimes"], born_host=m["bornHost"].lstrip("/"),
                store_host=m["storeHost"].lstrip("/"), born_ms=m["bornTimestamp"], store_ms=m["storeTimestamp"],
                body_sha256=m["bodySha256"])


def _actual(row):
    out = {k: row[k] for k in ("topic", "queue_id", "queue_offset", "phy_offset", "store_size", "msg_id", "uniq_key",
                               "tags", "keys", "body_crc", "sys_flag", "flag", "reconsume_times", "born_host",
                               "store_host")}
    out.update(properties=dict(row["properties"]), born_ms=round(row["born_timestamp"].timestamp() * 1000),
               store_ms=round(row["store_timestamp"].timestamp() * 1000),
               body_sha256=hashlib.sha256(row["body"]).hexdigest())
    return out


def _offsets(store, step=None, batch_bytes=32 << 20):
    out = []
    for path, base, size in batch.segment_files(store):
        for start in range(0, size, step or size):
            for cols in batch.iter_columns(path, base, start, start + (step or size), batch_bytes=batch_bytes):
                out += cols["phy_offset"].tolist()
    return out


def test_to_arrow_matches_manifest(clean_498):
    store, manifest = clean_498
    rows = pa.Table.from_batches([batch.to_arrow(c, store) for p, b, _ in batch.segment_files(store)
                                  for c in batch.iter_columns(p, b, check_crc=True)]).to_pylist()
    assert [_actual(r) for r in rows] == [_expected(m) for m in sorted(manifest["messages"],
                                                                        key=lambda m: m["commitLogOffset"])]
    assert {r["store"] for r in rows} == {str(store)}


@pytest.mark.parametrize("step,batch_bytes", [(1000, 100), (10007, 3000), (65536, 1 << 20)])
def test_byte_ranges_partition_segments(fixture_store, step, batch_bytes):
    _, store, manifest = fixture_store
    expected = sorted(m["commitLogOffset"] for m in manifest["messages"])
    assert _offsets(store) == expected
    assert _offsets(store, step, batch_bytes) == expected


def test_corrupt_record_fail_and_skip(clean_498, tmp_path):
    store, manifest = clean_498
    path, base, _ = batch.segment_files(store)[1]
    offsets = [m["commitLogOffset"] for m in manifest["messages"] if base <= m["commitLogOffset"] < base + 262144]
    bad = sorted(offsets)[5]
    copy = tmp_path / os.path.basename(path)
    shutil.copyfile(path, copy)
    with open(copy, "r+b") as f:   # break the magic code of the sixth record
        f.seek(bad - base + 4)
        f.write(b"\0\0\0\0")
    with pytest.raises(CorruptRecordError) as e:
        batch.decode_segment(str(copy), base)
    assert e.value.offset == bad and str(copy) in str(e.value)
    stats = batch.DecodeStats()
    got = [o for c in batch.iter_columns(str(copy), base, mode="skip", stats=stats) for o in c["phy_offset"].tolist()]
    assert got == sorted(o for o in offsets if o != bad)
    assert (stats.corrupt, stats.corrupt_offsets, stats.records) == (1, [bad], len(offsets) - 1)
    assert stats.skipped_bytes == sorted(offsets)[6] - bad


# ------------------------------------------------------------------------------ Spark

def _write_store(path, n, topics=("TopicA", "TopicB"), start=0):
    from rmqstore import Message, MessageStore, StoreConfig
    cfg = StoreConfig(commitlog_file_size=64 * 1024, consume_queue_entries=20, index_slots=64, index_entries=256)
    with MessageStore(path, cfg) as st:
        for i in range(start, start + n):
            st.put(Message(topics[i % len(topics)], f"body-{path.name}-{i}".encode() * (i % 7 + 1),
                           tags=f"t{i % 3}", keys=[f"k{i}", "hot"] if i % 10 == 0 else [f"k{i}"]))
        st.wait_dispatched(10)
    return cfg


@pytest.mark.spark
def test_source_reads_fixture(spark, clean_498):
    store, manifest = clean_498
    rows = spark.read.format("rocketmq").load(str(store)).collect()
    assert sorted((_actual(r.asDict()) for r in rows), key=lambda r: r["phy_offset"]) == \
        [_expected(m) for m in sorted(manifest["messages"], key=lambda m: m["commitLogOffset"])]


@pytest.mark.spark
def test_query_by_key_across_stores(spark, clean_498, tmp_path):
    from rmqstore.spark import jobs
    store, manifest = clean_498
    _write_store(tmp_path / "s1", 120)
    q = next(q for q in manifest["queries"][0]["queryMessage"] if q["key"] == "hot" or len(q["hits"]) > 3)
    want = sorted(m["commitLogOffset"] for m in manifest["messages"] if m["topic"] == q["topic"]
                  and q["key"] in (m["keys"] or "").split(" "))
    got = jobs.query(spark, [str(store), str(tmp_path / "*")], topic=q["topic"], key=q["key"]).collect()
    assert sorted(r.phy_offset for r in got) == want and {r.store for r in got} == {str(store)}
    assert {h["commitLogOffset"] for h in q["hits"]} <= set(want) or len(q["hits"]) == 64
    hot = jobs.query(spark, [str(store), str(tmp_path / "*")], key="hot", topic="TopicA").collect()
    assert sorted(r.keys[0] for r in hot if r.store.endswith("s1")) == sorted(f"k{i}" for i in range(0, 120, 10))
    m = next(m for m in manifest["messages"][1234:] if m["uniqKey"])
    assert [r.phy_offset for r in jobs.query(spark, [str(store)], uniq_key=m["uniqKey"]).collect()] == \
        [m["commitLogOffset"]]
    timed = jobs.query(spark, [str(store)], begin=manifest["messages"][100]["storeTimestamp"],
                       end=manifest["messages"][200]["storeTimestamp"]).count()
    assert timed == sum(manifest["messages"][100]["storeTimestamp"] <= m["storeTimestamp"]
                        < manifest["messages"][200]["storeTimestamp"] for m in manifest["messages"])


@pytest.mark.spark
def test_export_parquet_partitioned_by_topic_and_date(spark, clean_498, tmp_path):
    from collections import Counter
    from datetime import datetime, timezone

    from rmqstore.spark import jobs
    store, manifest = clean_498
    _write_store(tmp_path / "s1", 50, topics=("%RETRY%g|x",))
    summary = jobs.export(spark, [str(store), str(tmp_path / "s1")], tmp_path / "pq")
    msgs = manifest["messages"]
    assert summary["messages"] == len(msgs) + 50 and summary["bytes"] == sum(m["storeSize"] for m in msgs) + \
        sum(len(c["phy_offset"]) and int(c["store_size"].sum())
            for p, b, _ in batch.segment_files(tmp_path / "s1") for c in batch.iter_columns(p, b))
    df = spark.read.parquet(str(tmp_path / "pq"))
    rows = {(r.store, r.phy_offset): r for r in df.collect()}
    assert Counter(r.topic for r in rows.values()) == Counter([m["topic"] for m in msgs] + ["%RETRY%g|x"] * 50)
    for m in msgs[::50]:
        r = rows[(str(store), m["commitLogOffset"])]
        assert _actual(r.asDict()) == _expected(m)
        assert r.date == datetime.fromtimestamp(m["storeTimestamp"] / 1000, timezone.utc).date()


def _files(root, sub):
    """{relative path: bytes} of every file under ``root/sub``; index files (named by creation
    time) by their rank instead."""
    top = os.path.join(root, sub)
    if sub == "index":
        return {i: open(os.path.join(top, n), "rb").read() for i, n in enumerate(sorted(os.listdir(top)))}
    return {os.path.relpath(os.path.join(d, f), top): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(top) for f in fs}


@pytest.mark.spark
def test_rebuild_byte_identical_to_incremental_dispatch(spark, tmp_path):
    from rmqstore.spark import jobs
    store = tmp_path / "s"
    cfg = _write_store(store, 400, topics=("TopicA", "TopicB", "TopicC"))
    damaged = shutil.copytree(store, tmp_path / "damaged")   # its own index, which it read first, cut short
    os.truncate(os.path.join(damaged, "index", min(os.listdir(store / "index"))), 10)
    result, summary = jobs.rebuild(spark, str(damaged), str(tmp_path / "out"), cfg)
    assert summary["messages"] == 400 and len(result) == 3 * cfg.default_queue_nums
    assert (summary["index_files"], summary["index_entries"]) == (2, 400 + 40)   # k<i> and "hot": 255 a file
    for sub, at_least in (("consumequeue", 13), ("index", 2)):
        want, got = _files(store, sub), _files(tmp_path / "out", sub)
        assert len(want) >= at_least and got == want, sub


@pytest.mark.spark
def test_rebuild_fixture_byte_identical_to_rocketmq(spark, clean_498, tmp_path):
    from rmqstore import StoreConfig
    from rmqstore.spark import jobs
    store, manifest = clean_498
    cfg = StoreConfig(consume_queue_entries=100, **SMALL_INDEX, warm_mapped_file=False)
    _, summary = jobs.rebuild(spark, str(store), str(tmp_path), cfg)
    assert summary["messages"] == sum(m["inConsumeQueue"] for m in manifest["messages"])
    for sub in ("consumequeue", "index"):
        want, got = _files(store, sub), _files(tmp_path, sub)
        assert len(want) > 1 and got.keys() == want.keys(), sub
        assert [k for k in want if got[k] != want[k]] == [], sub


@pytest.mark.spark
def test_verify_reports_corruption(spark, clean_498, tmp_path):
    from rmqstore.spark import jobs
    store, manifest = clean_498
    copy = tmp_path / "broken"
    shutil.copytree(store / "commitlog", copy / "commitlog")
    victim = sorted(m["commitLogOffset"] for m in manifest["messages"])[10]
    path = copy / "commitlog" / f"{0:020d}"
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:   # flip a body byte: the CRC no longer matches
        f.seek(victim + 200)
        b = f.read(1)
        f.seek(victim + 200)
        f.write(bytes([b[0] ^ 0xFF]))
    reports, summary = jobs.verify(spark, [str(store), str(copy)])
    assert reports[str(store)]["ok"] and reports[str(store)]["records"] == 5000
    bad = reports[str(copy)]
    assert not bad["ok"] and bad["corrupt_offsets"] == [victim] and bad["records"] == 4999
    assert summary["bad_stores"] == 1


@pytest.mark.spark
def test_a_hole_in_an_earlier_segment_fails_export_and_verify(spark, tmp_path):
    """A zeroed first segment (of eight) was skipped in silence by spark export, the
    source and spark verify (ok, 40 records fewer); export and the source now raise,
    verify reports the hole."""
    from test_corruption import _holed_store

    from rmqstore.spark import jobs
    at = _holed_store(tmp_path / "s", "whole")
    reports, _ = jobs.verify(spark, [str(tmp_path / "s")])
    assert not reports[str(tmp_path / "s")]["ok"] and reports[str(tmp_path / "s")]["corrupt_offsets"] == [at]
    with pytest.raises(Exception, match="zeros"):
        jobs.export(spark, [str(tmp_path / "s")], tmp_path / "pq")
    with pytest.raises(Exception, match="zeros"):
        spark.read.format("rocketmq").load(str(tmp_path / "s")).count()


@pytest.mark.spark
def test_stream_picks_up_appended_messages(spark, tmp_path):
    from rmqstore import Message, MessageStore, StoreConfig
    store = tmp_path / "live"
    with MessageStore(store, StoreConfig(commitlog_file_size=64 * 1024, **SMALL_INDEX)) as st:
        st.put_batch([Message("TopicA", b"x%d" % i) for i in range(30)])
        q = spark.readStream.format("rocketmq").load(str(store)).select("phy_offset", "body") \
            .writeStream.format("memory").queryName("live_tail").start()
        try:
            q.processAllAvailable()
            first = spark.table("live_tail").count()
            st.put_batch([Message("TopicA", b"y%d" % i) for i in range(2000)])   # rolls segments
            q.processAllAvailable()
            bodies = [bytes(r.body) for r in spark.table("live_tail").orderBy("phy_offset").collect()]
        finally:
            q.stop()
    assert first == 30
    assert bodies == [b"x%d" % i for i in range(30)] + [b"y%d" % i for i in range(2000)]


def test_a_stream_fails_at_a_hole_in_the_last_segment(spark, tmp_path):
    """End to end: a streaming query over a store with a hole in its last segment took the
    records before it and then waited there for good, in silence. It now fails, naming the
    hole, once it has stayed there HOLE_SETTLE_SECONDS."""
    at, _, _ = holed_last_segment(tmp_path / "s")
    q = spark.readStream.format("rocketmq").load(str(tmp_path / "s")).select("phy_offset") \
        .writeStream.format("memory").queryName("holed_tail").start()
    from pyspark.errors import StreamingQueryException
    try:
        with pytest.raises(StreamingQueryException, match=f"offset {at}: data ends \\(zeros\\)"):
            q.awaitTermination(120)
    finally:
        q.stop()
    assert spark.table("holed_tail").count() == 100   # the records before the hole
