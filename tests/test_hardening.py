"""Hardening: store files owner-only by default (modes configurable); a full disk on append
gives DiskFullError with no partial record, reads keep working and writes resume when space
returns (a 2 MiB tmpfs, mounted when the tests may mount)."""
import errno
import os
import subprocess
import sys

import pytest

from rmqstore import DiskFullError, Message, MessageStore, StoreConfig


def _modes(root):
    """{relative path: permission bits} of every file and directory under ``root``."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = os.stat(p).st_mode & 0o777
    return out


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _store_modes(tmp_path, **modes):
    cfg = StoreConfig(commitlog_file_size=4096, consume_queue_entries=10, index_slots=16, index_entries=64, **modes)
    path = tmp_path / "store"
    with MessageStore(path, cfg) as s:
        for i in range(40):
            s.put(Message(f"T{i % 2}", b"x" * 100, keys=f"k{i}"), queue_id=i % 3)
        s.commit_offset("group", "T0", 0, 5)
    got = _modes(path)
    assert {"commitlog", "consumequeue/T1/2", "index", "checkpoint", "lock", "config/consumerOffset.json"} <= set(got)
    return path, got


@pytest.mark.parametrize("file_mode, dir_mode", [(0o600, 0o700), (0o640, 0o750)], ids=["default", "configured"])
def test_store_files_are_owner_only_by_default(tmp_path, umask_022, file_mode, dir_mode):
    modes = {} if file_mode == 0o600 else {"file_mode": file_mode, "dir_mode": dir_mode}
    path, got = _store_modes(tmp_path, **modes)
    parents = {"consumequeue", "consumequeue/T0", "consumequeue/T1"}      # see the test below
    assert {p: oct(m) for p, m in got.items()
            if p not in parents and m != (dir_mode if (path / p).is_dir() else file_mode)} == {}
    assert os.stat(path).st_mode & 0o777 == dir_mode


def test_consume_queue_parent_dirs_are_owner_only(tmp_path, umask_022):
    _, got = _store_modes(tmp_path)
    assert {got["consumequeue"], got["consumequeue/T0"], got["consumequeue/T1"]} == {0o700}


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs (skips where mounting is not permitted)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {p.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=True)


def _fill(d, leave):
    """Fill the file system of ``d`` up to ``leave`` free bytes; returns the filler's path."""
    st = os.statvfs(d)
    path = d / "filler"
    path.write_bytes(b"\xaa" * max(0, st.f_bavail * st.f_frsize - leave))
    return path


def _cfg(**kw):
    return StoreConfig(**{**dict(commitlog_file_size=128 << 10, consume_queue_entries=1000, index_slots=64,
                                 index_entries=512, warm_mapped_file=False, flush_interval_ms=10), **kw})


def test_full_disk_on_append(tiny_disk):
    cfg = _cfg()
    filler = _fill(tiny_disk, 700 << 10)
    store = tiny_disk / "store"
    s = MessageStore(store, cfg)
    acked = []
    with pytest.raises(DiskFullError) as e:
        for i in range(100_000):
            acked.append(s.put(Message("T", b"%06d" % i * 100, keys=f"k{i}"), queue_id=0))
    assert "No space left" in str(e.value) and e.value.filename.startswith(str(store / "commitlog"))
    assert len(acked) > 100
    end = acked[-1].phy_offset + acked[-1].size
    # no partial record: after the last acknowledged one only the BLANK end-of-file record
    seg = s.commitlog.segments.find(acked[-1].phy_offset)
    tail = seg.read(end - seg.base_offset, seg.size - (end - seg.base_offset))
    assert tail[4:8] == (-875286124).to_bytes(4, "big", signed=True) and not tail[8:].strip(b"\0")
    with pytest.raises(DiskFullError):
        s.put(Message("T", b"still full"), queue_id=0)
    # reads keep working
    assert s.wait_dispatched(10)
    assert s.get_by_offset(acked[-1].phy_offset).body == b"%06d" % (len(acked) - 1) * 100
    assert [m.body for m in s.get_messages("T", 0, 0, 4).messages] == [b"%06d" % i * 100 for i in range(4)]
    assert [m.queue_offset for m in s.query_by_key("T", f"k{len(acked) - 1}")] == [len(acked) - 1]
    # space returns: writes resume where they stopped
    filler.unlink()
    r = s.put(Message("T", b"after", keys="after"), queue_id=0)
    assert (r.phy_offset, r.queue_offset) == (s.commitlog.next_segment_offset(acked[-1].phy_offset), len(acked))
    assert s.wait_dispatched(10)
    assert s.get_messages("T", 0, r.queue_offset).messages[0].body == b"after"
    s.close()
    with MessageStore(store, cfg, read_only=True) as s:
        rep = s.verify()
        assert rep.ok and rep.records == len(acked) + 1, rep.problems


def test_full_disk_on_consume_queue_roll_resumes(tiny_disk):
    cfg = _cfg(commitlog_file_size=512 << 10, consume_queue_entries=20)
    with MessageStore(tiny_disk / "store", cfg) as s:
        s.put(Message("T", b"first"), queue_id=0)       # maps the whole commitlog segment
        assert s.wait_dispatched(10)
        filler = _fill(tiny_disk, 4096)
        for i in range(200):                          # needs new CQ files: no room for them
            s.put(Message("T", b"m%d" % i), queue_id=0)
        s.wait_dispatched(1)
        filler.unlink()
        assert s.wait_dispatched(10) and s.max_offset("T", 0) == 201


FSIZE_CHILD = r"""
import resource, signal, sys
from rmqstore import Message, MessageStore, StoreConfig, StoreError
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)   # as a host that embeds Python may leave it
root, case = sys.argv[1], sys.argv[2]
cfg = StoreConfig(commitlog_file_size=4 << 20, index_slots=100, index_entries=400, warm_mapped_file=False)
if case == "pwrite":   # the segment exists; bulk put_columns writes it with pwrite past the limit
    with MessageStore(root, cfg) as s:
        s.put(Message("T", b"first"))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    with MessageStore(root, cfg) as s:
        s.put_columns("T", [b"c" * 1000] * 3000)
except StoreError as e:
    print(type(e).__name__, e.errno)
"""


@pytest.mark.parametrize("case", ["create", "pwrite"])
def test_a_file_size_limit_is_an_error_not_sigxfsz(tmp_path, case):
    """RLIMIT_FSIZE below the segment size, with SIGXFSZ at its default action: creating a
    segment (ftruncate) or a bulk put_columns pwrite past the limit killed the process;
    it is now a StoreIOError (EFBIG), and the store reopens with what it held."""
    p = subprocess.run([sys.executable, "-c", FSIZE_CHILD, str(tmp_path / "s"), case], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"child died ({p.returncode}): {p.stderr[-2000:]}"
    assert p.stdout.split() == ["StoreIOError", str(errno.EFBIG)], p.stdout + p.stderr[-2000:]
    if case == "pwrite":
        with MessageStore(tmp_path / "s", read_only=True) as s:
            assert s.get_by_offset(0).body == b"first"


def test_opening_a_writer_on_a_full_disk_is_disk_full(tiny_disk):
    """A writer opened on a full disk: writing ``abort`` failed with a bare OSError (no
    StoreError) and left it empty, so the next open ran crash recovery. Now DiskFullError,
    no ``abort`` left, and once space is freed the store opens clean with its messages."""
    store = tiny_disk / "store"
    with MessageStore(store, _cfg()) as s:
        for i in range(20):
            s.put(Message("T", b"m%d" % i))
    filler = _fill(tiny_disk, 0)
    fd = os.open(filler, os.O_WRONLY | os.O_APPEND)
    try:   # the last partial block too
        while os.write(fd, b"\xaa"):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    with pytest.raises(DiskFullError, match="abort"):
        MessageStore(store, _cfg())
    assert not (store / "abort").exists()
    filler.unlink()
    with MessageStore(store, _cfg(), read_only=True) as s:
        assert s.clean_shutdown and [m.body for m in s.scan()] == [b"m%d" % i for i in range(20)]


@pytest.mark.parametrize("kind", ["dir", "fifo", "symlink"])
def test_an_abort_no_writer_can_replace_fails_the_open_first(tmp_path, kind):
    """``abort`` a directory or FIFO: a writer's open ran the whole crash recovery and
    only then failed to create ``abort``, saying "File exists", which tells nothing of
    what to remove. Now the open fails before recovery, saying what is there (not a
    regular file / a symlink), with no byte changed; once it is removed the store opens whole."""
    from rmqstore import StoreIOError
    store = tmp_path / "s"
    cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, index_slots=100, index_entries=400)
    with MessageStore(store, cfg) as s:
        for i in range(300):
            s.put(Message("T", b"m%d" % i, keys=f"k{i}"), i % 2)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    {"dir": lambda p: p.mkdir(), "fifo": os.mkfifo, "symlink": lambda p: p.symlink_to(tmp_path / "elsewhere")}[kind](
        store / "abort")
    with pytest.raises(StoreIOError, match="not a regular file|a symlink") as e:
        MessageStore(store, cfg)
    assert e.value.filename == str(store / "abort")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    (store / "abort").rmdir() if kind == "dir" else (store / "abort").unlink()
    with MessageStore(store, cfg) as s:
        assert [m.body for m in s.query_by_key("T", "k7")] == [b"m7"]
        assert [m.body for m in s.scan()] == [b"m%d" % i for i in range(300)]
