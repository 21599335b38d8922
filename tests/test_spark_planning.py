"""The Spark source plans its partitions by where a store's data ends, not by its files' sizes."""
import pytest

from rmqstore import Message, MessageStore, StoreConfig, batch

from conftest import SMALL_INDEX

pytestmark = pytest.mark.spark
pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")


def _rows(scan, parts):
    return [r for part in parts for path, base, start, end in part.pieces
            for rb in scan.read(part.store, path, base, start, end) for r in rb.column("body").to_pylist()]


def test_a_writer_store_of_small_data_in_a_1_gib_segment_is_one_partition(tmp_path):
    """The Spark writer's stores (default options) have one sparse 1 GiB segment: 4,000
    small messages were planned as 32 tasks of 32 MiB, 31 of them decoding zeros. Planned by
    where the data ends, they are one, and it holds every message."""
    from rmqstore.spark.source import Scan, plan
    from rmqstore.spark.writer import store_config, write_store
    bodies = [b"m%05d" % i for i in range(4000)]
    rb = pa.record_batch({"topic": pa.array(["T"] * 4000), "body": pa.array(bodies, pa.binary())})
    store = str(tmp_path / "w")
    assert write_store(store, store_config({}), [rb])[0] == 4000
    assert [size for _, _, size in batch.segment_files(store)] == [1 << 30]   # one sparse 1 GiB segment
    scan = Scan({"path": store, "columns": "body"}, ["body"])
    parts = plan(scan.stores, scan.split_bytes)
    assert len(parts) == 1
    assert _rows(scan, parts) == bodies
    # the plan ends where the file system holds data: the records, and blocks reserved ahead
    # of them (read once, ext4 counts those too), far below the segment's 1 GiB
    assert batch.end_offset(store) <= parts[0].pieces[-1][3] <= scan.split_bytes


def test_zeros_at_the_end_of_a_segment_with_data_after_it_stay_planned(tmp_path):
    """A segment whose data stops short of its end while a later segment holds data (its
    BLANK record lost: a hole) is still read to its end, so a reader in mode fail reports
    the hole rather than skipping it in silence."""
    from rmqstore.spark.source import Scan, data_segments
    cfg = StoreConfig(commitlog_file_size=1 << 16, **SMALL_INDEX)
    with MessageStore(tmp_path / "s", cfg) as st:
        st.put_batch([Message("T", b"x" * 1000) for _ in range(100)])   # two segments and some
    files = batch.segment_files(tmp_path / "s")
    planned = data_segments(Scan({"path": str(tmp_path / "s")}).stores[0])
    assert [p for p, _, _ in planned] == [p for p, _, _ in files]
    assert [n for _, _, n in planned[:-1]] == [n for _, _, n in files[:-1]]   # data after them: whole
    assert batch.end_offset(tmp_path / "s") - files[-1][1] <= planned[-1][2] <= files[-1][2]
