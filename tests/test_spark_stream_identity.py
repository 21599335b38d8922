"""A streaming query's checkpoint names stores by what they are, not by the path string: a
restart through a link, a bind mount, a moved directory or a copy goes on where it was, and a
store it no longer finds is an error naming it, never a silent start from scratch."""
import json
import os
import shutil

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.errors import StoreNotFoundError

from conftest import SMALL_INDEX

pytestmark = pytest.mark.spark
pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
CFG = StoreConfig(commitlog_file_size=4096, warm_mapped_file=False, **SMALL_INDEX)


def _reader(path):
    from rmqstore.spark.source import Scan, _StreamReader
    options = {"path": str(path), "columns": "body"}
    return _StreamReader(Scan(options, ["body"]), options)


def _bodies(reader, start, end):
    return [b for part in reader.partitions(start, end) for rb in reader.read(part)
            for b in rb.column("body").to_pylist()]


def _checkpointed(path):
    """Offsets after a micro-batch that read everything, as Spark's checkpoint gives them back."""
    reader = _reader(path)
    start = json.loads(json.dumps(reader.initialOffset()))
    end = json.loads(json.dumps(reader.latestOffset(start)))
    return _bodies(reader, start, end), end


def _put(path, *bodies):
    with MessageStore(path, CFG) as st:
        st.put_batch([Message("T", b) for b in bodies])


def _restart_reads(path, checkpoint):
    reader = _reader(path)
    return _bodies(reader, checkpoint, json.loads(json.dumps(reader.latestOffset(checkpoint))))


def test_a_restart_through_a_link_reads_only_what_is_new(tmp_path):
    """The same store named through a symlink was a new store to the checkpoint: every
    message was read again."""
    _put(tmp_path / "s", *(b"m%d" % i for i in range(50)))
    first, checkpoint = _checkpointed(tmp_path / "s")
    assert len(first) == 50
    os.symlink(tmp_path / "s", tmp_path / "link")
    assert _restart_reads(tmp_path / "link", checkpoint) == []
    _put(tmp_path / "s", b"new")
    assert _restart_reads(tmp_path / "link", checkpoint) == [b"new"]


def test_a_moved_store_keeps_its_place_after_retention(tmp_path):
    """Renamed (another path, the same directory), and its first segment gone to retention
    (the first record, its identity, with it): the directory still tells it."""
    _put(tmp_path / "s", *(b"%04d" % i * 50 for i in range(200)))   # several 4 KiB segments
    first, checkpoint = _checkpointed(tmp_path / "s")
    os.rename(tmp_path / "s", tmp_path / "moved")
    segments = sorted(os.listdir(tmp_path / "moved" / "commitlog"))
    os.unlink(tmp_path / "moved" / "commitlog" / segments[0])
    assert len(first) == 200 and _restart_reads(tmp_path / "moved", checkpoint) == []


@pytest.mark.parametrize("writer", ["spark", "store"])
def test_a_copy_is_the_same_store(tmp_path, writer):
    """A copy holds the same records at the same offsets: a checkpoint goes on with it (as a
    Delta table's copy keeps its table id), whether the store has the id the Spark writer
    gives its stores or is known by its first record."""
    if writer == "spark":
        from rmqstore.spark.writer import store_config, write_store
        rb = pa.record_batch({"topic": pa.array(["T"] * 30), "body": pa.array([b"w%d" % i for i in range(30)])})
        write_store(str(tmp_path / "s"), store_config({"commitlogFileSize": "65536"}), [rb])
    else:
        _put(tmp_path / "s", *(b"w%d" % i for i in range(30)))
    first, checkpoint = _checkpointed(tmp_path / "s")
    shutil.copytree(tmp_path / "s", tmp_path / "copy")
    shutil.rmtree(tmp_path / "s")
    assert len(first) == 30 and _restart_reads(tmp_path / "copy", checkpoint) == []


def test_a_store_the_checkpoint_no_longer_finds_is_named(tmp_path):
    """Another store at the path (the old one removed): the checkpoint's store is not there,
    which is said, naming it, rather than reading the new one from its start as the old."""
    _put(tmp_path / "s", *(b"m%d" % i for i in range(20)))
    _, checkpoint = _checkpointed(tmp_path / "s")
    shutil.rmtree(tmp_path / "s")
    _put(tmp_path / "s", b"another store")
    reader = _reader(tmp_path / "s")
    with pytest.raises(StoreNotFoundError, match=f"no longer finds: {tmp_path / 's'} \\(head:0:"):
        reader.latestOffset(checkpoint)


def test_a_checkpoint_of_path_offsets_is_read_by_path(tmp_path):
    """Checkpoints written before stores had identities ({path: offset}) go on by path."""
    _put(tmp_path / "s", *(b"m%d" % i for i in range(20)))
    with MessageStore(tmp_path / "s", read_only=True) as s:
        end = s.max_phy_offset
    assert _restart_reads(tmp_path / "s", {str(tmp_path / "s"): end}) == []


@pytest.mark.slow
def test_a_streaming_query_restarted_through_a_link_writes_each_message_once(spark, tmp_path):
    """End to end, as the review saw it: a query with a file sink and a checkpoint, restarted
    with the store named through a symlink, held every message twice."""
    _put(tmp_path / "s", *(b"m%d" % i for i in range(20)))
    os.symlink(tmp_path / "s", tmp_path / "link")
    for path in (tmp_path / "s", tmp_path / "link"):
        q = spark.readStream.format("rocketmq").option("columns", "body").load(str(path)) \
            .writeStream.format("parquet").option("path", str(tmp_path / "sink")) \
            .option("checkpointLocation", str(tmp_path / "cp")).start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert sorted(bytes(r.body) for r in spark.read.parquet(str(tmp_path / "sink")).collect()) == \
        sorted(b"m%d" % i for i in range(20))
