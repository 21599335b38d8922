"""A store method called back from within an operation of the same thread (a progress
callback, put_batch's iterable) that holds what the method needs raises
ReentrantCallError, instead of waiting for itself forever (each case below used to hang:
put, put_columns, clean_expired, flush, wait_dispatched and close from rebuild's progress;
rebuild from verify's and verify from rebuild's; clean_expired from verify's, which
made verify fail on the files it deleted; put, rebuild or clean_expired from
put_batch's iterable). verify from put_batch's iterable is refused too: waiting there for
the maintenance lock, which a rebuild in another thread holds while it waits for the
write lock, would deadlock both. close() from put_batch's iterable closed the store under the
batch and left files verify refused. Calls that need nothing held still work. Run in a
child process, which faulthandler ends if a case hangs."""
import subprocess
import sys

REENTRY = r"""
import faulthandler, sys
from rmqstore import Message, MessageStore, ReentrantCallError, StoreClosedError, StoreConfig
faulthandler.dump_traceback_later(60, exit=True)
cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, index_slots=100, index_entries=400,
                  warm_mapped_file=False)
root = sys.argv[1]
with MessageStore(root, cfg) as s:
    s.put_batch([Message("T", b"x" * 100, keys=f"k{i}") for i in range(800)], 0)

def rebuild(s, inner):
    return s.rebuild(progress=lambda n: inner(s))

def verify(s, inner):
    return s.verify(progress=lambda n: inner(s))

def put_batch(s, inner):
    return s.put_batch(inner(s) and Message("T", b"o") or Message("T", b"o") for _ in range(2))

inner = {"put": lambda s: s.put(Message("T", b"i")), "put_columns": lambda s: s.put_columns("T", [b"i"]),
         "clean_expired": lambda s: s.clean_expired(), "flush": lambda s: s.flush(),
         "wait_dispatched": lambda s: s.wait_dispatched(), "close": lambda s: s.close(),
         "rebuild": lambda s: s.rebuild(), "verify": lambda s: s.verify(),
         "get_messages": lambda s: s.get_messages("T", 0, 0), "query_by_key": lambda s: s.query_by_key("T", "k1"),
         "commit_offset": lambda s: s.commit_offset("g", "T", 0, 1), "dry_run": lambda s: s.clean_expired(dry_run=True)}
refused = {rebuild: {"put", "put_columns", "clean_expired", "flush", "wait_dispatched", "close", "rebuild", "verify"},
           verify: {"rebuild", "clean_expired"},
           put_batch: {"put", "put_columns", "clean_expired", "rebuild", "close", "flush", "wait_dispatched",
                       "verify"}}
for outer, names in refused.items():
    for name, call in inner.items():
        with MessageStore(root, cfg) as s:
            try:
                outer(s, call)
                got = "ran"
            except ReentrantCallError:
                got = "refused"
            except StoreClosedError:
                got = "stopped"      # verify stops at its next step once close() has run
            want = "refused" if name in names else "stopped" if (outer, name) == (verify, "close") else "ran"
            if got != want:
                print(f"{outer.__name__} -> {name}: {got}, expected {want}")
        with MessageStore(root, cfg) as s:
            if not s.verify().ok:
                print(f"{outer.__name__} -> {name}: verify fails after")
print("done")
"""


def test_calls_back_into_an_operation_that_holds_their_lock(tmp_path):
    p = subprocess.run([sys.executable, "-c", REENTRY, str(tmp_path / "s")], capture_output=True, text=True,
                       timeout=300)
    assert (p.returncode, p.stdout) == (0, "done\n"), p.stderr[-3000:]
