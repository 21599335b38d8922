"""The background Worker, and how the commitlog's preallocation uses it: the writer takes
a new segment as soon as its file exists, not after its pages are faulted in."""
import logging
import threading
from concurrent.futures import Future

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


class _ProbeQueue(SegmentQueue):
    made: Future | None = None

    def _warm(self, offset, made):
        self.made = made
        return super()._warm(offset, made)


class _ProbeToucher:
    """Records, at each job handed to the native toucher, whether the future of the
    segment's preallocation was done; passes the job on."""

    def __init__(self, queue):
        self.queue, self.toucher, self.seen = queue, queue.toucher, []

    def submit(self, seg, start, stop, reserve=False):
        self.seen.append(self.queue.made is not None and self.queue.made.done())
        self.toucher.submit(seg, start, stop, reserve)

    def close(self):
        self.toucher.close()


def test_a_preallocated_segment_is_handed_over_before_its_pages_are_faulted_in(tmp_path):
    # The roll that takes it waits for the file only: the toucher (a native thread) faults
    # its pages in after, for writing without changing a byte (MADV_POPULATE_WRITE), as
    # the writer may be writing there already.
    q = _ProbeQueue(tmp_path / "commitlog", 1 << 20, preallocate=True, prefault_bytes=1 << 18)
    probe = q.toucher = _ProbeToucher(q)
    try:
        q.prepare_first()
        q.roll(0)
        q.roll()                   # takes the one made ahead, and prepares the next
    finally:
        q.close()
    assert probe.seen, "no preallocation ran"
    assert all(probe.seen)
