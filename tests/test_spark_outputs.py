"""Where the Spark jobs write: export replaces only an earlier export's directory, and no job
writes into a store it was not asked to (nor into one a broker or writer holds)."""
import os

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.errors import InvalidArgumentError, StoreLockedError

from conftest import tree_state

pytestmark = pytest.mark.spark


def _store(path, n=20):
    with MessageStore(path, StoreConfig(commitlog_file_size=1 << 16)) as st:
        for i in range(n):
            st.put(Message("T", b"m%d" % i, keys=[f"k{i}"]))
        st.wait_dispatched(10)
    return str(path)


@pytest.fixture
def stores(tmp_path):
    return _store(tmp_path / "a"), _store(tmp_path / "b")


def test_export_refuses_what_it_did_not_write(spark, stores, tmp_path):
    from rmqstore.spark import jobs
    a, b = stores
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("keep")
    (tmp_path / "link").symlink_to(other)
    (tmp_path / "file").write_text("keep")
    before = {p: tree_state(p) for p in (a, b, other)}
    for out, reason in [(other, "holds files an export did not write"), (a, "overlaps the store"),
                        (tmp_path, "overlaps the store"), (os.path.join(a, "pq"), "overlaps the store"),
                        (os.path.join(b, "pq"), "inside the store"), (tmp_path / "link", "not a directory"),
                        (tmp_path / "file", "not a directory")]:
        with pytest.raises(InvalidArgumentError, match=reason):
            jobs.export(spark, [a], out)
    assert {p: tree_state(p) for p in (a, b, other)} == before


def test_export_replaces_an_earlier_export(spark, stores, tmp_path):
    from rmqstore.spark import jobs
    a, _ = stores
    out = tmp_path / "pq"
    out.mkdir()   # empty: taken
    assert jobs.export(spark, [a], out)["messages"] == 20
    first = sorted(os.listdir(out))
    assert "_SUCCESS" in first and any(n.startswith("topic=") for n in first)
    assert jobs.export(spark, [a], out)["messages"] == 20
    assert spark.read.parquet(str(out)).count() == 20


def test_rebuild_writes_into_no_other_store_and_not_under_a_writer(spark, stores, tmp_path):
    from rmqstore.spark import jobs
    a, b = stores
    with pytest.raises(InvalidArgumentError, match="inside the store"):
        jobs.rebuild(spark, a, b)
    with pytest.raises(InvalidArgumentError, match="inside the store"):
        jobs.rebuild(spark, a, os.path.join(b, "x"))
    empty = tmp_path / "empty"   # a writer's store whose queues are still empty
    with MessageStore(empty, StoreConfig(commitlog_file_size=1 << 16)):
        with pytest.raises(StoreLockedError):
            jobs.rebuild(spark, str(empty))
    assert jobs.rebuild(spark, str(empty))[1]["messages"] == 0   # the lock was released


def test_writer_refuses_a_path_inside_a_store(spark, stores):
    a, b = stores
    df = spark.read.format("rocketmq").load(a)
    before = tree_state(b)
    for out in (b, os.path.join(b, "sub")):
        with pytest.raises(Exception, match="is inside the store"):
            df.write.format("rocketmq").mode("append").save(out)
    assert tree_state(b) == before
