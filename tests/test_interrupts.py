"""A signal handler's exception (KeyboardInterrupt from SIGINT) arriving while a write runs.
CPython runs handlers between bytecodes, so they run inside whatever Python code a write
calls: the segment queue's roll, the warmer's callback. A put_batch or put_columns stores
all of its messages or none, a roll cut short loses no segment and blocks no later roll,
and close() still returns. Every scenario runs in a child process with a timeout (a hang
or a crash fails the test)."""
import json
import subprocess
import sys

import pytest

CHILD = r"""
import json, signal, sys
from rmqstore import Message, MessageStore, StoreConfig, StoreError

root, case = sys.argv[1], sys.argv[2]
cfg = StoreConfig(commitlog_file_size=256 << 10, consume_queue_entries=1000, index_slots=500, index_entries=2000,
                  warm_mapped_file=True, warm_ahead_bytes=64 << 10, reserve_ahead_bytes=64 << 10)
BATCH, BODY = 40, b"b" * 2000
store = MessageStore(root, cfg)
queue = store.commitlog.segments
acked, interrupted = 0, 0
inside = False   # the handler raises only inside a write, so none escapes between them


def write():
    if case == "put_columns":
        return len(store.put_columns("T", [BODY] * BATCH, keys="k")["phy_offset"])
    if case.startswith("prepare"):
        return len([store.put(Message("T", BODY, keys="k"))])
    return len(store.put_batch([Message("T", BODY, keys="k")] * BATCH))


def interrupt(*_):
    global inside
    if inside:
        inside = False
        raise KeyboardInterrupt


if case.startswith("prepare"):
    # an interrupt in _prepare once, before it hands the segment to the toucher or after: the
    # next roll and close() go on
    class Cut:
        def __init__(self, toucher):
            self.toucher = toucher
        def make(self, *args):
            queue.toucher = self.toucher
            if case == "prepare_after":
                self.toucher.make(*args)
            raise KeyboardInterrupt
    queue.toucher = Cut(queue.toucher)
    rounds = 1000
elif case == "roll":
    # what a batch rolls into it made before writing: a roll() that raises is not reached
    acked += write()   # the first segment is there
    def roll(*a):
        raise KeyboardInterrupt
    queue.roll = roll
    rounds = 40
else:
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.0003)
    rounds = 600
for _ in range(rounds):
    try:
        inside = True
        n = write()
        inside = False
        acked += n
    except KeyboardInterrupt:
        interrupted += 1
inside = False
signal.setitimer(signal.ITIMER_REAL, 0)
queue.__dict__.pop("roll", None)
stored = sum(1 for _ in store.scan())
store.close()
with MessageStore(root, cfg) as again:
    ok = again.verify().ok
    reopened = sum(1 for _ in again.scan())
print(json.dumps({"acked": acked, "interrupted": interrupted, "stored": stored, "reopened": reopened, "ok": ok}))
"""


def _run(tmp_path, case):
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "s"), case], capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["put_batch", "put_columns", "roll"])
def test_an_interrupted_batch_stores_all_or_nothing(tmp_path, case):
    """SIGALRM every 0.3 ms raising KeyboardInterrupt through batches of 40 that roll
    256 KiB segments (and a roll() that always raises): the store holds whole batches
    only, at least every acknowledged one, and reopens to the same count and verifies."""
    out = _run(tmp_path, case)
    assert out["stored"] % 40 == 0, out
    assert out["stored"] >= out["acked"] > 0, out
    assert out["reopened"] == out["stored"] and out["ok"], out
    if case == "roll":
        assert out["interrupted"] == 0, out


@pytest.mark.parametrize("case", ["prepare_before", "prepare_after"])
def test_an_interrupted_segment_preparation_blocks_nothing(tmp_path, case):
    """An interrupt in the background preparation of the next segment, before the job is
    queued (the next roll and close() used to wait forever for it) or after (the job then
    raced the next roll for the file): one put gets the KeyboardInterrupt, every later put
    and close() work, and the store holds what was acknowledged."""
    out = _run(tmp_path, case)
    assert out["interrupted"] == 1, out
    assert out["stored"] == out["acked"] == 999, out
    assert out["reopened"] == out["stored"] and out["ok"], out


def test_interrupt_deferred_in_a_write_that_then_fails_is_raised(tmp_path):
    """A KeyboardInterrupt raised in warm (a signal handler's) waits for the write's end;
    when the write then failed (here: no room for the segment it rolls into), it was
    dropped and the user's Ctrl-C lost. It is raised, the write's error its context."""
    from rmqstore import DiskFullError, Message, MessageStore, StoreConfig

    class Warmer:
        def submit(self, *args):
            raise KeyboardInterrupt

    def full(*args):
        raise DiskFullError(28, "no room", "x")

    cfg = StoreConfig(commitlog_file_size=256 << 10, consume_queue_entries=1000, index_slots=500,
                      index_entries=2000, warm_mapped_file=True, warm_ahead_bytes=64 << 10)
    with MessageStore(tmp_path / "s", cfg) as store:
        store.put(Message("T", b"first"))
        log = store.commitlog
        queue = log.segments
        for base in list(queue.premade):   # the next segment is not made ahead, nor at the roll
            queue._discard(queue.premade.pop(base))
        queue.make_room, queue.roll, queue._prepare = lambda *a: None, full, lambda *a: None
        warmer, log._warmer, log._warm_to, log.appender.warm_mark = log._warmer, Warmer(), 0, 0
        try:
            with pytest.raises(KeyboardInterrupt) as e:
                store.put_batch([Message("T", b"b" * 10_000)] * 40)
        finally:
            del queue.make_room, queue.roll, queue._prepare
            log._warmer = warmer
        assert isinstance(e.value.__context__, DiskFullError)
