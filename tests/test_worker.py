"""The background Worker, and how the commitlog's preallocation uses it: the writer takes
a new segment as soon as its file exists, not after its pages are faulted in."""
import logging
import threading
from concurrent.futures import Future

from rmqstore._segment import PREFAULT_AHEAD, MappedSegment
from rmqstore.segments import SegmentQueue
from rmqstore.worker import Worker


def test_jobs_run_in_order_and_a_failing_one_is_logged_not_fatal(caplog):
    w = Worker("test-worker")
    done = []

    def fail():
        raise ValueError("boom")
    with caplog.at_level(logging.ERROR, logger="rmqstore.worker"):
        w.submit(done.append, 1)
        w.submit(fail)
        w.submit(done.append, 2)
        w.shutdown()
    assert done == [1, 2]
    assert "boom" in caplog.text


def test_shutdown_waits_for_the_running_job_and_cancel_drops_the_queued_ones():
    w = Worker("test-worker")
    started, release = threading.Event(), threading.Event()
    done = []

    def slow():
        started.set()
        release.wait(10)
        done.append("slow")
    w.submit(slow)
    started.wait(10)
    w.submit(done.append, "queued")
    threading.Timer(0.05, release.set).start()
    w.shutdown(cancel=True)
    assert done == ["slow"]
    w.submit(done.append, "after")     # never runs, and does not block
    assert done == ["slow"]


class _ProbeSegment(MappedSegment):
    """Records, at each prefault, whether the future of its preallocation was done."""
    made: Future | None = None
    seen: list = []

    def prefault(self, pos=0, n=-1, mode=0):
        type(self).seen.append((self.made is not None and self.made.done(), mode))
        return super().prefault(pos, n, mode)


class _ProbeQueue(SegmentQueue):
    made: Future | None = None

    def _warm(self, offset, made):
        self.made = made
        return super()._warm(offset, made)

    def _open_new(self, offset):
        seg = super()._open_new(offset)
        probe = _ProbeSegment(seg.path, offset, self.file_size, readonly=False, ahead=self.reserve_ahead)
        seg.close()
        probe.wrote_pos = probe.flushed_pos = 0
        probe.made = self.made
        return probe


def test_a_preallocated_segment_is_handed_over_before_its_pages_are_faulted_in(tmp_path):
    # The roll that takes it waits for the file only: the prefault that follows uses
    # PREFAULT_AHEAD, which changes no byte, as the writer may be writing there already.
    _ProbeSegment.seen = []
    q = _ProbeQueue(tmp_path / "commitlog", 1 << 20, preallocate=True, prefault_bytes=1 << 18)
    try:
        q.prepare_first()
        q.roll(0)
        q.roll()                   # takes the one made ahead, and prepares the next
    finally:
        q.close()
    assert _ProbeSegment.seen, "no preallocation ran"
    assert all(done and mode == PREFAULT_AHEAD for done, mode in _ProbeSegment.seen)
