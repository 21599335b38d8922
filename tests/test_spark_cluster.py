"""Spark beyond one JVM: the jobs on a standalone cluster on localhost (executors in JVMs of
their own) give what local mode gives; a streaming query into a Parquet sink, stopped and
restarted mid-stream and once SIGKILLed, ends with every message exactly once. Drivers run
in subprocesses (tests/spark_driver.py)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.errors import StoreIOError

from conftest import SMALL_INDEX

pytest.importorskip("pyspark")
DRIVER = Path(__file__).with_name("spark_driver.py")


def _driver(*args, timeout=300):
    """Run tests/spark_driver.py; on timeout its whole process group (with the JVM) is killed."""
    p = subprocess.Popen([sys.executable, str(DRIVER), *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    assert p.returncode == 0, err[-3000:]
    return out


@pytest.fixture
def cluster(tmp_path):
    """A standalone master and worker on 127.0.0.1 (started within 90 s, always stopped)."""
    from rmqstore.spark.cluster import standalone_cluster
    with standalone_cluster(cores=2, memory="1g", timeout=90, work_dir=tmp_path / "cluster") as master:
        yield master


@pytest.mark.spark
@pytest.mark.slow
def test_jobs_on_a_standalone_cluster_equal_local_mode(cluster, clean_498, tmp_path):
    store, manifest = clean_498
    master = cluster
    local = json.loads(_driver("jobs", "local[2]", store, tmp_path / "local").splitlines()[-1])
    remote = json.loads(_driver("jobs", master, store, tmp_path / "remote").splitlines()[-1])
    assert remote["master"] == master and remote["executors"] >= 2   # the driver and an executor JVM
    assert local["count"] == len(manifest["messages"]) == remote["count"] == remote["exported"] == remote["parquet"]
    for k in ("rows", "projected", "written", "back"):
        assert remote[k] == local[k], k
    assert remote["back"] == remote["written"] > 0


def test_a_store_missing_on_an_executor_is_a_clear_error(clean_498):
    from rmqstore.spark.source import Scan
    store, _ = clean_498
    scan = Scan({"path": str(store)})
    with pytest.raises(StoreIOError, match="same path on the driver and every executor") as e:
        list(scan.read(str(store), "/no/such/store/commitlog/00000000000000000000", 0, 0, 1 << 20))
    assert e.value.filename == "/no/such/store/commitlog/00000000000000000000"


def _sink_bodies(spark, sink):
    return sorted(bytes(r.body) for r in spark.read.parquet(str(sink)).select("body").collect())


@pytest.mark.spark
@pytest.mark.slow
def test_stream_to_parquet_exactly_once_across_stop_and_sigkill(spark, tmp_path):
    store, sink, ckpt = tmp_path / "live", tmp_path / "sink", tmp_path / "ckpt"
    total = 6000
    with MessageStore(store, StoreConfig(commitlog_file_size=256 * 1024, **SMALL_INDEX)) as st:
        st.put_batch([Message("TopicA", b"%06d" % i) for i in range(2000)])

        def append_more():
            for start in range(2000, total, 200):
                st.put_batch([Message("TopicA", b"%06d" % i) for i in range(start, start + 200)])
                time.sleep(0.1)
        writer = threading.Thread(target=append_more)
        writer.start()
        try:
            # 1: stopped mid-stream, gracefully, once 1000 rows are in the sink
            _driver("stream", store, sink, ckpt, 8192, 1000)
            first = len(_sink_bodies(spark, sink))
            assert 1000 <= first < total
            # 2: restarted, then SIGKILLed (driver and its JVM) while batches are running
            p = subprocess.Popen([sys.executable, str(DRIVER), *map(str, ("stream", store, sink, ckpt, 8192, 0))],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and len(_sink_bodies(spark, sink)) < first + 500:
                    time.sleep(0.5)
            finally:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
            killed_at = len(_sink_bodies(spark, sink))
        finally:
            writer.join(60)
        # 3: restarted once more, runs until the sink holds everything
        _driver("stream", store, sink, ckpt, 8192, total)
    bodies = _sink_bodies(spark, sink)
    assert first < killed_at < total
    assert bodies == [b"%06d" % i for i in range(total)]   # no gap, no duplicate
