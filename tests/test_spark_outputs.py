"""Where the Spark jobs write: export replaces only an earlier export's directory, and no job
writes into a store it was not asked to (nor into one a broker or writer holds)."""
import json
import os
import time

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


def test_export_refuses_a_topic_whose_partition_directory_name_is_too_long(spark, tmp_path):
    """A topic of 100 '%' (RocketMQ's pattern allows them) is "topic=%25%25..." of 306
    bytes, over the file system's 255: export's tasks failed with a bare OSError
    (ENAMETOOLONG) after the earlier export had been deleted. Now the driver refuses it
    first, naming the topic and the limit, when a consume queue names the topic, and
    otherwise once the tasks have found it (they write none of its rows): no output is left
    half written and nothing is marked a success."""
    import shutil

    from rmqstore.spark import jobs
    a = str(tmp_path / "a")
    with MessageStore(a, StoreConfig(commitlog_file_size=1 << 16)) as st:
        st.put_batch([Message("%" * 100, b"long"), Message("T", b"short")])
        st.wait_dispatched(10)
    out = tmp_path / "pq"
    out.mkdir()
    (out / "_SUCCESS").write_text("")   # an earlier export's: kept while the export is refused up front
    with pytest.raises(InvalidArgumentError, match=r"at most 255 bytes.*has 306.*%%%"):
        jobs.export(spark, [a], out)
    assert os.listdir(out) == ["_SUCCESS"]
    shutil.rmtree(os.path.join(a, "consumequeue"))
    with pytest.raises(InvalidArgumentError, match=r"at most 255 bytes.*has 306"):
        jobs.export(spark, [a], out)
    assert not out.exists()


def test_rebuild_writes_into_no_other_store_and_not_under_a_writer(spark, stores, tmp_path):
    from rmqstore.spark import jobs
    a, b = stores
    with pytest.raises(InvalidArgumentError, match="inside the store"):
        jobs.rebuild(spark, a, b)
    with pytest.raises(InvalidArgumentError, match="inside the store"):
        jobs.rebuild(spark, a, os.path.join(b, "x"))
    empty = tmp_path / "empty"   # a writer's store whose queues are still empty
    with MessageStore(empty, StoreConfig(commitlog_file_size=1 << 16)):
        deadline = time.monotonic() + 30   # its first segment (and commitlog/) is made in the background
        while not (empty / "commitlog").is_dir() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(StoreLockedError):
            jobs.rebuild(spark, str(empty))
    assert jobs.rebuild(spark, str(empty))[1]["messages"] == 0   # the lock was released


def test_writer_refuses_a_path_inside_a_store_or_a_file(spark, stores, tmp_path):
    """Checked on the driver, before any task runs (a file gave each task a bare
    NotADirectoryError)."""
    a, b = stores
    df = spark.read.format("rocketmq").load(a)
    before = tree_state(b)
    (tmp_path / "file").write_text("keep")
    for out, reason in [(b, "is inside the store"), (os.path.join(b, "sub"), "is inside the store"),
                        (tmp_path / "file", "is not a directory")]:
        with pytest.raises(Exception, match=reason) as e:
            df.write.format("rocketmq").mode("append").save(str(out))
        assert "Failed to initialize Python data source writer" in str(e.value)
    assert tree_state(b) == before and (tmp_path / "file").read_text() == "keep"


def test_time_criteria_that_are_not_times():
    from rmqstore.spark.source import epoch_ms
    assert epoch_ms("2026-11-01T00:00+05:30") == 1_793_471_400_000   # 2026-10-31 18:30 UTC and epoch_ms("-5") == -5
    for bad in ("yesterday", "\u00b2", "2026-13-45", float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError):
            epoch_ms(bad)


@pytest.mark.slow
def test_spark_command_reports_the_cause_in_one_line(stores, tmp_path):
    """A job failing inside Spark (a bad criterion, a corrupt record): the rmqstore error as
    the command's one error line and JSON, not the JVM's and Python's tracebacks."""
    import subprocess
    import sys

    from test_cli import ENV
    a, _ = stores
    for args, status, why in [
            # refused inside Spark, by the source's reader: Spark wraps it in its own error
            (("--key", "a b"), 1, "InvalidArgumentError: rocketmq source: option key 'a b' names an empty, blank or "
                                  "(a key) space-holding value, which no message has"),
            # refused by jobs.query before any Spark job: a usage error, naming the argument
            (("--begin", "yesterday"), 2, "query: begin: not a time (epoch ms or ISO-8601): 'yesterday'")]:
        p = subprocess.run([sys.executable, "-m", "rmqstore", "spark", "--master", "local[1]", "query", a, *args,
                            "--json"], capture_output=True, text=True, env=ENV, timeout=300)
        assert p.returncode == status and "Traceback" not in p.stderr
        assert json.loads(p.stdout)["error"] == why
        assert [ln for ln in p.stderr.splitlines() if ln.startswith("rmqstore: error: ")] == [f"rmqstore: error: {why}"]


@pytest.mark.slow
def test_spark_export_of_a_corrupt_record_fails_in_one_line(stores, tmp_path):
    """spark export meeting a record with a bad magic code (--mode fail): the command's
    error was one line, but Spark's own log (the executor's ERROR and the task manager's
    WARN) put two Python tracebacks and the JVM's stack on stderr before it."""
    import subprocess
    import sys

    from test_cli import ENV
    a, _ = stores
    with open(os.path.join(a, "commitlog", f"{0:020d}"), "r+b") as f:
        f.seek(4)
        f.write(b"\x12\x34\x56\x78")
    p = subprocess.run([sys.executable, "-m", "rmqstore", "spark", "--master", "local[1]", "export", a, "--out",
                        str(tmp_path / "pq")], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert [ln for ln in p.stderr.splitlines() if "rmqstore: error: " in ln] == \
        [f"rmqstore: error: CorruptRecordError: {a}/commitlog/{0:020d}: commitlog offset 0: bad magic code"]
