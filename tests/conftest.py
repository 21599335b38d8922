"""Shared fixtures: the stores written by the real RocketMQ (read-only, manifests cached
per session), a small store config, and a helper that copies a fixture store to tmp."""
import contextlib
import functools
import gzip
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

# before any test imports grpc: see rmqstore/endpoint/__init__.py (Spark's JVM launch, a
# forked child, could otherwise die of gRPC's fork handlers)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

FIXTURES = Path(os.environ.get("RMQSTORE_FIXTURES", Path(__file__).resolve().parents[2] / "shared" / "fixtures"))
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures")

CLEAN_498 = FIXTURES / "rocketmq-4.9.8" / "clean"
CRASHED_498 = FIXTURES / "rocketmq-4.9.8" / "crashed"
V2_533 = FIXTURES / "rocketmq-5.3.3" / "v2"

FIXTURE_DIRS = {"498-clean": CLEAN_498, "533-v2": V2_533}


def _require(path):
    if not (path / "store").is_dir():
        pytest.skip(f"fixture store {path} not available")


@functools.lru_cache(maxsize=None)
def load_manifest(path):
    """The manifest of a fixture directory (parsed once per session: they are MBs)."""
    with open(Path(path) / "manifest.json", encoding="utf-8") as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def load_jsonl_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f)


@pytest.fixture(scope="session")
def clean_498():
    """(store dir, manifest) of the clean RocketMQ 4.9.8 store."""
    _require(CLEAN_498)
    return CLEAN_498 / "store", load_manifest(str(CLEAN_498))


@pytest.fixture(scope="session")
def v2_533():
    """(store dir, manifest) of the RocketMQ 5.3.3 store with v2 records."""
    _require(V2_533)
    return V2_533 / "store", load_manifest(str(V2_533))


@pytest.fixture(scope="session", params=sorted(FIXTURE_DIRS))
def fixture_store(request):
    """Both clean fixture stores in turn: (name, store dir, manifest)."""
    path = FIXTURE_DIRS[request.param]
    _require(path)
    return request.param, path / "store", load_manifest(str(path))


# The fixtures' index geometry: 84 KB index files instead of RocketMQ's 420 MB default, which
# is fallocated on disk for every store a test creates.
SMALL_INDEX = dict(index_slots=1000, index_entries=4000)


@pytest.fixture
def small_config():
    """Tiny segments so rollover happens within a few messages."""
    from rmqstore import StoreConfig
    return StoreConfig(commitlog_file_size=4096, consume_queue_entries=10, index_slots=64, index_entries=256,
                       flush_interval_ms=10, flush_cq_interval_ms=10, warm_mapped_file=False)


def holed_last_segment(root, n=300, first=100, lost=2):
    """A one-segment store whose records ``first .. first + lost - 1`` are zeros: (offset
    of the hole, offsets of the records after it, end of data)."""
    from rmqstore import Message, MessageStore, StoreConfig
    with MessageStore(root, StoreConfig(commitlog_file_size=1 << 20, **SMALL_INDEX)) as st:
        offsets = [st.put(Message("T", b"m%d" % i)).phy_offset for i in range(n)]
        end = st.max_phy_offset
    with open(root / "commitlog" / ("0" * 20), "r+b") as f:
        f.seek(offsets[first])
        f.write(bytes(offsets[first + lost] - offsets[first]))
    return offsets[first], offsets[first + lost:], end


def copy_store(src, tmp_path, name="store"):
    """Copy a (read-only) fixture store into ``tmp_path`` with writable permissions."""
    dst = Path(tmp_path) / name
    shutil.copytree(src, dst)
    for root, _dirs, files in os.walk(dst):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return dst


@pytest.fixture
def copy_fixture(tmp_path):
    return functools.partial(copy_store, tmp_path=tmp_path)


@contextlib.contextmanager
def looping_in_threads(calls):
    """Call each of ``calls`` over and over, each in a thread of its own, until the block
    ends; yields the list of the StoreErrors they raised meanwhile (as repr)."""
    from rmqstore import StoreError
    errors, stop = [], threading.Event()

    def loop(call):
        while not stop.is_set():
            try:
                call()
            except StoreError as e:
                errors.append(repr(e))
    threads = [threading.Thread(target=loop, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    try:
        yield errors
    finally:
        stop.set()
        for t in threads:
            t.join()


def tree_state(root):
    """{relative path: (size, mtime_ns, sha256)} of every file under ``root``, plus dirs."""
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        st = os.stat(dirpath)
        out[rel + "/"] = (st.st_mtime_ns,)
        for f in filenames:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            out[os.path.join(rel, f)] = (st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every Spark test module (a process holds one)."""
    pytest.importorskip("pyspark")
    from rmqstore.spark import session
    s = session("local[2]", spark_sql_shuffle_partitions="2", spark_default_parallelism="2")
    yield s
    s.stop()


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (--dist loadgroup), every Spark test runs on one worker, which holds
    the one SparkSession: two JVMs on a 2-core machine would each be slower than one."""
    for item in items:
        if "spark" in item.keywords or "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
