"""A store file truncated by another process while it is mapped (cext/rmq_guard.h).

Touching a page of a shared mapping past its file's end raises SIGBUS, which killed the
process. Now the page reads as zeros: readers report the records there as missing or
corrupt, a writer's flush fails (the store turns read-only, so nothing written there is
acknowledged in SYNC mode), and the process lives on. A SIGBUS anywhere else still kills
it. Each case runs in a child process, since the failure being tested is the child dying.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

ROLE = "RMQ_GUARD_CHILD"


def child(case, root, *flags):
    env = {**os.environ, ROLE: case}
    p = subprocess.run([sys.executable, *flags, __file__, str(root)], capture_output=True, text=True,
                       timeout=120, env=env)
    return p


def result(p):
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _store(root, **config):
    from rmqstore import Message, MessageStore, StoreConfig
    path = os.path.join(root, "s")
    with MessageStore(path, StoreConfig(commitlog_file_size=1 << 20, **config)) as st:
        acks = [st.put(Message("T", bytes([i % 251]) * 1000, keys=[f"k{i}"])) for i in range(2500)]
    return path, acks


def _first_segment(path):
    return os.path.join(path, "commitlog", sorted(os.listdir(os.path.join(path, "commitlog")))[0])


def _outcome(call):
    try:
        out = call()
    except Exception as e:   # the class is what the parent checks
        return {"raised": type(e).__name__, "store_error": _is_store_error(e)}
    return {"value": out}


def _is_store_error(e):
    from rmqstore.errors import StoreError
    return isinstance(e, StoreError)


def _reads(root, read_only):
    from rmqstore import MessageStore
    path, acks = _store(root)
    st = MessageStore(path, read_only=read_only)
    os.truncate(_first_segment(path), 4096)   # under the open store: 4 records of ~1 KB stay
    kept, lost, later = acks[1], acks[500], acks[2400]
    out = {
        "kept": _outcome(lambda: st.get_by_offset(kept.phy_offset).body.hex()),
        "lost": _outcome(lambda: st.get_by_offset(lost.phy_offset).body.hex()),
        "later": _outcome(lambda: st.get_by_offset(later.phy_offset).body.hex()),
        "scan": _outcome(lambda: sum(1 for _ in st.scan())),
        "verify_ok": _outcome(lambda: st.verify().ok),
        "query": _outcome(lambda: len(st.query_by_key("T", "k500"))),
    }
    st.close()
    return out


def _writes(root, mode):
    from rmqstore import Message, MessageStore, StoreConfig
    from rmqstore.errors import StoreError
    path = os.path.join(root, "w")
    st = MessageStore(path, StoreConfig(commitlog_file_size=1 << 20, flush_mode=mode))
    for _ in range(100):
        st.put(Message("T", b"x" * 1000))
    os.truncate(_first_segment(path), 0)
    acked = 0
    for _ in range(50):   # within the truncated segment
        try:
            st.put(Message("T", b"y" * 1000))
        except StoreError:
            break
        acked += 1
    out = {"acked": acked, "flush": _outcome(st.flush), "put": _outcome(lambda: st.put(Message("T", b"z")) and 1)}
    out["close"] = _outcome(st.close)
    return out


def _recovery(root):
    """Recovery reading a page of a file that is cut while it scans (and put back after):
    the zeros it saw are no end of data, so nothing may be cut there."""
    from rmqstore import MessageStore, recovery
    from rmqstore.errors import StoreIOError
    path, _ = _store(root)
    seg_path = _first_segment(path)
    with open(seg_path, "rb") as f:
        before = f.read()
    open(os.path.join(path, "abort"), "wb").close()   # an unclean shutdown: recovery scans
    real = recovery._read.scan_segment

    def scan_cut_meanwhile(seg, *args):
        if seg.path == seg_path and not seg.faulted:
            os.truncate(seg_path, 32768)
            seg.read(40000, 8)   # a page past the cut: the guard's zeros
            with open(seg_path, "r+b") as f:
                f.write(before)
        return real(seg, *args)
    recovery._read.scan_segment = scan_cut_meanwhile
    try:
        MessageStore(path)
        opened = "opened"
    except StoreIOError as e:
        opened = type(e).__name__
    with open(seg_path, "rb") as f:
        return {"open": opened, "unchanged": f.read() == before}


def _foreign(root):
    """A SIGBUS in a mapping that is not the store's: the process must still die."""
    import mmap
    _store(root)   # the guard is installed
    f = os.path.join(root, "plain")
    with open(f, "wb") as fh:
        fh.write(b"a" * 65536)
    fd = os.open(f, os.O_RDWR)
    m = mmap.mmap(fd, 65536)
    os.truncate(f, 0)
    print(m[40000])   # SIGBUS
    return {"survived": True}


def _sent(root):
    """SIGBUS sent with kill is not a fault in a store mapping: the default action runs."""
    _store(root)
    os.kill(os.getpid(), signal.SIGBUS)
    return {"survived": True}


@pytest.mark.parametrize("read_only", [True, False])
def test_reads_past_a_truncation_report_missing_records(tmp_path, read_only):
    out = result(child(f"reads:{int(read_only)}", tmp_path))
    assert out["kept"] == {"value": (bytes([1]) * 1000).hex()}          # before the new end: intact
    assert out["later"] == {"value": (bytes([2400 % 251]) * 1000).hex()}  # another segment: intact
    assert out["lost"]["store_error"], out["lost"]                       # zeros: no record there
    assert out["scan"]["raised"] == "CorruptRecordError"
    assert out["verify_ok"] == {"value": False}
    assert out["query"] == {"value": 0}


def test_sync_puts_into_a_truncated_segment_are_never_acknowledged(tmp_path):
    out = result(child("writes:sync", tmp_path))
    assert out["acked"] == 0
    assert out["flush"]["raised"] == "StoreReadOnlyError"
    assert out["put"]["raised"] == "StoreReadOnlyError"
    assert out["close"] == {"value": None}


def test_async_flush_of_a_truncated_segment_turns_the_store_read_only(tmp_path):
    out = result(child("writes:async", tmp_path))
    assert out["flush"]["raised"] == "StoreReadOnlyError"   # what async puts wrote there is lost
    assert out["put"]["raised"] == "StoreReadOnlyError"
    assert out["close"] == {"value": None}


def test_recovery_cuts_nothing_where_the_file_changed_under_it(tmp_path):
    assert result(child("recovery", tmp_path)) == {"open": "StoreIOError", "unchanged": True}


def test_a_flush_after_a_truncation_it_did_not_fault_on_fails(tmp_path):
    """A truncation drops dirty pages without a fault in this process, and msync of pages
    that are gone succeeds: flush() reported durable what was lost."""
    from rmqstore import Message, MessageStore, StoreConfig
    from rmqstore.errors import StoreReadOnlyError
    st = MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 20, flush_interval_ms=60_000))
    try:
        for _ in range(100):
            st.put(Message("T", b"x" * 1000))
        os.truncate(_first_segment(str(tmp_path / "s")), 0)
        with pytest.raises(StoreReadOnlyError, match="changed under its mapping"):
            st.flush()
        with pytest.raises(StoreReadOnlyError):
            st.put(Message("T", b"y"))
    finally:
        st.close()


@pytest.mark.parametrize("flags", [(), ("-X", "faulthandler")])
def test_a_sigbus_outside_the_store_still_kills(tmp_path, flags):
    p = child("foreign", tmp_path, *flags)
    assert p.returncode == -signal.SIGBUS, (p.returncode, p.stderr[-2000:])
    if flags:
        assert "Bus error" in p.stderr   # faulthandler, installed first, still reports it


def test_a_sigbus_sent_with_kill_still_kills(tmp_path):
    p = child("sent", tmp_path)
    assert p.returncode == -signal.SIGBUS, (p.returncode, p.stderr[-2000:])


if __name__ == "__main__":
    case, _, arg = os.environ[ROLE].partition(":")
    root = sys.argv[1]
    run = {"reads": lambda: _reads(root, arg == "1"), "writes": lambda: _writes(root, arg),
           "recovery": lambda: _recovery(root),
           "foreign": lambda: _foreign(root), "sent": lambda: _sent(root)}[case]
    print(json.dumps(run()))
