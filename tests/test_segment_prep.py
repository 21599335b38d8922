"""Segments made ahead of the writer on the native toucher thread (``rmq-touch``): the file is
created, allocated and mapped there without the GIL, and a roll takes the mapped segment. A
roll that comes first makes it itself; a failed make is the roll's own open's to report;
close drops what was not made and removes what was made and never used."""
import errno
import os
import time

import pytest

from rmqstore import StoreIOError
from rmqstore._segment import inject_fault, stall_fault, stalled_thread
from rmqstore.segments import SegmentQueue, segment_name

SIZE = 1 << 20


def _comm(tid):
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def _stalled_open():
    """The thread id stalled in a segment's open (stall_fault), waited for 60 s at most."""
    deadline = time.monotonic() + 60
    while not stalled_thread("open"):
        assert time.monotonic() < deadline, "no open stalled"
        os.sched_yield()
    return stalled_thread("open")


def _queue(tmp_path, **kw):
    return SegmentQueue(tmp_path / "commitlog", SIZE, preallocate=True, prefault_bytes=1 << 18, **kw)


def test_the_next_segment_is_made_on_the_native_toucher_thread(tmp_path):
    q = _queue(tmp_path)
    name = segment_name(SIZE)
    stall_fault("open", True, name)
    try:
        q.roll(0)                              # hands the segment at SIZE to the toucher
        assert _comm(_stalled_open()) == "rmq-touch"   # the make's open, held until let go
        assert not q.premade[SIZE].ready
    finally:
        stall_fault("open", False)
    try:
        seg = q.roll()                         # waits for the make under way, takes it
        assert seg.base_offset == SIZE and seg.ready and seg.size == SIZE and seg.wrote_pos == 0
        assert [s.base_offset for s in q.segments] == [0, SIZE]
        assert set(q.premade) == {2 * SIZE}    # and the one after is handed over
    finally:
        q.close()


def test_a_roll_before_the_thread_starts_on_it_makes_the_segment_itself(tmp_path):
    q = _queue(tmp_path)
    q.toucher.close()                          # as in a forked child: no thread runs jobs
    try:
        q.prepare_first()
        assert not q.premade[0].ready
        seg = q.roll(0)
        assert seg is not None and seg.ready and os.path.getsize(seg.path) == SIZE
    finally:
        q.close()


def test_a_failed_make_is_retried_by_the_roll_and_a_lasting_one_raised(tmp_path):
    q = _queue(tmp_path)
    try:
        inject_fault("fallocate", 1, errno.ENOSPC, "")   # the make's, on the toucher's thread
        q.prepare_first()
        seg = q.roll(0)                                  # its own open succeeds
        assert seg.ready and q.segments == [seg]
        # a directory where the next file is due: the make and the roll's own open both fail
        stall_fault("open", True, segment_name(2 * SIZE))
        q.roll()
        os.mkdir(q.premade[2 * SIZE].path)
        stall_fault("open", False)
        with pytest.raises(StoreIOError):
            q.roll()
        assert [s.base_offset for s in q.segments] == [0, SIZE] and 2 * SIZE not in q.premade
    finally:
        stall_fault("open", False)
        inject_fault("fallocate", 0, errno.ENOSPC)
        q.close()


def test_close_removes_the_unused_segment_made_ahead_and_keeps_those_in_use(tmp_path):
    q = _queue(tmp_path)
    q.roll(0)
    q.premade[SIZE].made()
    made_ahead = q.premade[SIZE].path
    assert os.path.getsize(made_ahead) == SIZE
    q.close()
    assert sorted(os.listdir(tmp_path / "commitlog")) == [segment_name(0)]


def test_a_segment_dropped_before_it_is_made_leaves_no_file(tmp_path):
    q = _queue(tmp_path)
    stall_fault("open", True, segment_name(SIZE))   # before the roll: the make may start at once
    try:
        q.roll(0)
        _stalled_open()                        # the thread is busy making SIZE: queue one more
        q._prepare(2 * SIZE)
        later = q.premade[2 * SIZE]
        assert later.drop() is False and not later.ready
    finally:
        stall_fault("open", False)
    q.close()
    assert sorted(os.listdir(tmp_path / "commitlog")) == [segment_name(0)]


def test_truncation_removes_the_segments_made_ahead_past_it(tmp_path):
    q = _queue(tmp_path)
    q.roll(0)
    q.roll()
    q.premade[2 * SIZE].made()
    q.truncate(SIZE // 2)          # a kill now must leave a run of files, not 0 and 2
    assert sorted(os.listdir(tmp_path / "commitlog")) == [segment_name(0)] and not q.premade
    assert q.roll().base_offset == SIZE and 2 * SIZE in q.premade   # and the next is made ahead again
    q.close()
