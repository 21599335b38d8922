"""MappedSegment pins and errors: hold() raises once closing, a pin defers the unmap, and
misuse raises StoreError subclasses that still match the builtin a caller may expect."""
import subprocess
import sys

import pytest

from rmqstore._segment import PREFAULT_AHEAD, PREFAULT_READ, PREFAULT_WRITE, MappedSegment
from rmqstore.errors import (
    InvalidArgumentError,
    OutOfRangeError,
    StoreClosedError,
    StoreError,
    StoreReadOnlyError,
    ViewExportedError,
)


def make(tmp_path, readonly=False):
    seg = MappedSegment(tmp_path / "00000000000000000000", 0, 4096, create=True)
    if readonly:
        seg.close()
        seg = MappedSegment(tmp_path / "00000000000000000000", 0, 4096, readonly=True)
    return seg


def test_hold_raises_once_closing(tmp_path):
    seg = make(tmp_path)
    seg.close()
    with pytest.raises(StoreClosedError):
        seg.hold()


def test_a_held_pin_defers_the_unmap(tmp_path):
    seg = make(tmp_path)
    seg.write(0, b"abcd")
    seg.hold()
    seg.close()
    assert seg.closed
    with pytest.raises(StoreClosedError):   # new readers are refused ...
        seg.read(0, 4)
    with pytest.raises(StoreClosedError):
        seg.hold()
    seg.release()                            # ... and the last release unmaps
    seg.close()                              # idempotent after the deferred unmap


def test_misuse_raises_store_errors_that_match_builtins(tmp_path):
    seg = make(tmp_path)
    with pytest.raises(OutOfRangeError) as e:
        seg.read(4000, 200)
    assert isinstance(e.value, (StoreError, IndexError)) and isinstance(e.value, IndexError)
    with pytest.raises(InvalidArgumentError):
        seg.prefault(0, 4096, 7)
    for mode in (PREFAULT_READ, PREFAULT_WRITE, PREFAULT_AHEAD):
        seg.prefault(0, 4096, mode)
    view = memoryview(seg)
    with pytest.raises(ViewExportedError) as e:
        seg.close()
    assert isinstance(e.value, BufferError)
    view.release()
    seg.close()
    ro = make(tmp_path, readonly=True)
    with pytest.raises(StoreReadOnlyError) as e:
        ro.write(0, b"x")
    assert isinstance(e.value, PermissionError)
    ro.close()


_CLOSE_MID_READ = r"""
import sys
from rmqstore import Message, MessageStore, StoreConfig, _read
from rmqstore.errors import StoreClosedError

# no warming thread: its prefault pin would defer the unmap by itself
store = MessageStore(sys.argv[1], StoreConfig(warm_mapped_file=False, commitlog_file_size=1 << 20))
store.put(Message("t", b"x" * 3000, tags="A"), queue_id=0)
store.wait_dispatched()
segs = store.commitlog.segments.segments
cq_seg = store.consume_queues.get("t", 0).segments.find(0)
cq_pos, n = 0, cq_seg.wrote_pos // 20

class ClosesTheSegment:
    # the tag test runs while the record is being read: close its segment right then
    def __contains__(self, tag):
        segs[0].close()
        return tag == "A"

msgs, used, _, problems = _read.gather_messages(segs, cq_seg, cq_pos, n, 32, 32, 1 << 20, store.max_phy_offset,
                                                store.commitlog.segments.file_size, None, ClosesTheSegment())
assert (used, problems) == (1, []) and msgs[0].body == b"x" * 3000, (used, problems)
try:
    segs[0].hold()
except StoreClosedError:
    print("unmapped after the read")
"""


def test_gather_reads_a_segment_closed_mid_read_under_its_pin(tmp_path):
    """gather_messages holds the record's segment while it reads it: a close() from a
    callback during the read (here the tags filter) waits for the pin instead of unmapping
    the bytes still to be copied. Without the pin the child dies reading unmapped memory."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", _CLOSE_MID_READ, str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "unmapped after the read"


def _resident_kb(path):
    """Rss (KiB) of this process's mapping of ``path``, from /proc/self/smaps."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            return next(int(x.split()[1]) for x in lines[i + 1:] if x.startswith("Rss:"))
    raise AssertionError(f"{path} is not mapped")


@pytest.mark.parametrize("mode", [PREFAULT_WRITE, PREFAULT_AHEAD])
def test_prefault_in_steps_covers_the_whole_range(tmp_path, mode):
    """The populate goes in steps (so it never holds the mmap lock long): a range of
    several steps and a part is resident to its last page, and nothing past it."""
    path = tmp_path / "00000000000000000000"
    seg = MappedSegment(path, 0, 8 << 20, create=True)
    try:
        assert _resident_kb(path) == 0
        seg.prefault(4096, (5 << 20) + 3 * 4096 + 100, mode)   # pages 1 .. 1 + 1280 + 3: steps of 2 MiB
        assert _resident_kb(path) == 4 * (1280 + 4)
    finally:
        seg.close()


@pytest.mark.parametrize("args", [(2 ** 70, 4096), (0, "4096")])
def test_a_constructor_that_fails_first_closes_no_other_descriptor(tmp_path, args):
    """A MappedSegment whose arguments fail to convert (before it opens anything) used to
    close descriptor 0 as it was freed, its zeroed fd field: in a process whose stdin is
    closed that is a store file or the writer lock. Checked in a child, on its fd 0."""
    code = f"""
import os, sys
from rmqstore._segment import MappedSegment
os.dup2(os.open(sys.argv[1], os.O_RDWR | os.O_CREAT), 0)
try:
    MappedSegment(sys.argv[1], *{args!r})
except (OverflowError, TypeError):
    pass
os.fstat(0)
"""
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
