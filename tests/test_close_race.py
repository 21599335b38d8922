"""close() racing rebuild(), verify(), get_messages, query_* and put from other threads.

Each trial fills a small store, starts threads that call one kind of operation in a loop,
closes the store after a seeded pause, and then reopens it: every call must either succeed
or raise StoreClosedError, close() must return normally and release the lock, and the
reopened store must pass verify(). The trials run in a child process with a timeout, so a
crash or a hang fails the test instead of killing the run."""
import subprocess
import sys

import pytest

CHILD = r"""
import random, sys, threading, time
from rmqstore import Message, MessageStore, StoreClosedError, StoreConfig

CFG = StoreConfig(commitlog_file_size=16384, consume_queue_entries=16, index_slots=32, index_entries=128,
                  warm_mapped_file=False)
root, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
OPS = {
    "rebuild": lambda s, i: s.rebuild(),
    "verify": lambda s, i: s.verify(),
    "get_messages": lambda s, i: s.get_messages("Race", i % 2, 0, 32),
    "query_by_key": lambda s, i: s.query_by_key("Race", f"k{i % 50}"),
    "query_offsets": lambda s, i: s.query_offsets("Race", f"k{i % 50}"),
    "put": lambda s, i: s.put(Message("Race", b"x" * (i % 300), keys=f"k{i % 50}"), i % 2),
}
failures = []
for trial in range(trials):
    path = f"{root}/t{trial}"
    s = MessageStore(path, CFG)
    s.put_batch([Message("Race", b"y" * 200, keys=f"k{i}") for i in range(rnd.randrange(20, 150))], 0)
    kinds = rnd.sample(sorted(OPS), rnd.randrange(1, 4))
    stop = threading.Event()
    def loop(kind):
        i = 0
        while not stop.is_set():
            try:
                OPS[kind](s, i)
            except StoreClosedError:
                return
            except BaseException as e:
                failures.append(f"trial {trial} {kind}: {type(e).__name__}: {e}")
                return
            i += 1
    threads = [threading.Thread(target=loop, args=(k,)) for k in kinds for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(rnd.random() * 0.05)
    try:
        s.close()
    except BaseException as e:
        failures.append(f"trial {trial} close with {kinds}: {type(e).__name__}: {e}")
    stop.set()
    for t in threads:
        t.join()
    with MessageStore(path, CFG) as again:   # the lock is free again, else StoreLockedError
        rep = again.verify()
        if not rep.ok:
            failures.append(f"trial {trial} {kinds}: verify after reopen: {[p.message for p in rep.problems][:3]}")
print("\n".join(failures))
sys.exit(1 if failures else 0)
"""


def _run(tmp_path, trials, seed, timeout):
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(trials), str(seed)],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def test_close_races_operations(tmp_path):
    _run(tmp_path, 25, 11, 240)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_close_races_operations_many(tmp_path, seed):
    _run(tmp_path, 60, 100 + seed, 900)


def test_close_from_a_progress_callback_does_not_hang(tmp_path):
    code = r"""
import sys
from rmqstore import Message, MessageStore, StoreClosedError, StoreConfig
s = MessageStore(sys.argv[1], StoreConfig(commitlog_file_size=4096, warm_mapped_file=False))
s.put_batch([Message("T", b"z" * 500) for _ in range(20)])
try:
    s.verify(progress=lambda n: s.close())
except StoreClosedError:
    print("stopped")
assert s.closed
"""
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "stopped", p.stdout + p.stderr


EXIT_OPEN = r"""
import sys, threading
from rmqstore import Message, MessageStore, StoreConfig
s = MessageStore(sys.argv[1], StoreConfig(commitlog_file_size=1 << 20, index_slots=500, index_entries=2000))
for i in range(40):
    s.put(Message("T", b"m%d" % i), i % 2)
s.commit_offset("g", "T", 0, 7)
if sys.argv[2] == "blocked":   # a daemon thread stuck inside put_batch's iterable: exit does not wait for it
    stuck = threading.Event()
    def messages():
        yield Message("T", b"late")
        stuck.wait()
    threading.Thread(target=lambda: s.put_batch(messages()), daemon=True).start()
if sys.argv[2] == "busy":      # a daemon thread that keeps reading and writing until the exit stops it
    def work():
        while True:
            s.get_messages("T", 0, 0, 32)
            s.query_keys("T", ["k"] * 2000)     # most of the time inside the store
            s.put(Message("T", b"more", keys="k"), 1)
    threading.Thread(target=work, daemon=True).start()
    while s.max_offset("T", 1) < 100:
        pass
"""


@pytest.mark.parametrize("case", ["idle", "busy", "blocked"])
def test_interpreter_exit_closes_open_writers(tmp_path, case):
    """A script that ends with its writer open: the exit closes it (abort removed, the
    committed consumer offset written), as close() would, also while a daemon thread keeps
    calling it (its calls are refused from then on: it held the close off for good, so
    every next open ran recovery); one a daemon thread is stuck in is left as a crash
    would leave it, and the exit does not hang."""
    from rmqstore import MessageStore
    p = subprocess.run([sys.executable, "-c", EXIT_OPEN, str(tmp_path / "s"), case], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with MessageStore(tmp_path / "s", read_only=True) as s:
        assert s.clean_shutdown is (case != "blocked")
        if case != "blocked":
            assert s.committed_offset("g", "T", 0) == 7
        n = sum(1 for _ in s.scan())
        assert n == 40 if case != "busy" else n - 20 == s.max_offset("T", 1) >= 100
