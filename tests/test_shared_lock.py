"""SharedLock (verify shares it, rebuild holds it alone) and two verifies of one store at once."""
import threading

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.shared_lock import SharedLock

WAIT = 30     # seconds before a thread that should get through is taken as stuck


def _thread(target):
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_sharers_hold_it_together():
    lock, inside = SharedLock(), threading.Barrier(3, timeout=WAIT)

    def share():
        with lock.shared():
            inside.wait()       # all three inside at once, or BrokenBarrierError
    ts = [_thread(share) for _ in range(2)]
    with lock.shared():
        inside.wait()
    for t in ts:
        t.join(WAIT)
    assert not inside.broken


def test_exclusive_waits_for_sharers_and_new_sharers_wait_for_it():
    lock, order = SharedLock(), []
    held, release = threading.Event(), threading.Event()

    def share_first():
        with lock.shared():
            held.set()
            release.wait(WAIT)
            order.append("shared 1 out")

    def exclusive():
        with lock.exclusive():
            order.append("exclusive")

    def share_later():
        with lock.shared():
            order.append("shared 2")
    a = _thread(share_first)
    held.wait(WAIT)
    b = _thread(exclusive)
    while not lock._waiting:        # the exclusive holder is queued
        b.join(0.001)
    c = _thread(share_later)
    c.join(0.2)
    assert order == []              # neither got in while the first sharer holds it
    release.set()
    for t in (a, b, c):
        t.join(WAIT)
    assert order == ["shared 1 out", "exclusive", "shared 2"]


def test_two_verifies_of_one_store_run_at_once(tmp_path):
    """Each verify's progress callback waits for the other's: they meet only if both run."""
    cfg = StoreConfig(commitlog_file_size=8192)
    with MessageStore(tmp_path, cfg) as s:
        for i in range(100):
            s.put(Message("T", b"x" * 100, keys=f"k{i}"))
        meet = threading.Barrier(2, timeout=WAIT)
        reports = []

        def verify():
            reports.append(s.verify(progress=lambda n: meet.wait()))
        t = _thread(verify)
        verify()
        t.join(WAIT)
        assert len(reports) == 2 and all(r.ok and r.records == 100 for r in reports)
        assert not meet.broken
