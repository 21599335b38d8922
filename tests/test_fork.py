"""A writer handle used in a forked child raises ForeignProcessError (a StoreError) and
touches no file: the parent's abort file, pre-made next segment and lock survive the
child's close() and exit. Read-only handles keep reading in the child. The forking runs
in a child process (this file run as a script)."""
import fcntl
import gc
import json
import os
import subprocess
import sys

from rmqstore import ForeignProcessError, Message, MessageStore, StoreConfig, StoreError, StoreLockedError

SEG = 64 << 10


def _cfg():
    return StoreConfig(commitlog_file_size=SEG, consume_queue_entries=100, index_slots=64, index_entries=512,
                       warm_mapped_file=True, warm_ahead_bytes=4096)


def _in_child(fn):
    """Run ``fn()`` in a forked child; returns what it returned (JSON over a pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn()
        except BaseException as e:   # report, never fall back into the parent's code
            out = {"crash": repr(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)


def _outcome(call):
    try:
        call()
        return "ok"
    except StoreError as e:
        return type(e).__name__


def writer_scenario(root):
    s = MessageStore(root, _cfg())
    first = s.put(Message("T", b"parent-0", keys="p0"), queue_id=0)
    s.wait_dispatched()
    next_seg = os.path.join(root, "commitlog", f"{SEG:020d}")
    s.commitlog.segments.premade[SEG].made()   # the pre-made next segment exists now

    def child():
        out = {name: _outcome(call) for name, call in [
            ("put", lambda: s.put(Message("T", b"child"))),
            ("put_batch", lambda: s.put_batch([Message("T", b"child")])),
            ("flush", s.flush),
            ("commit_offset", lambda: s.commit_offset("g", "T", 0, 1)),
            ("get_by_offset", lambda: s.get_by_offset(0)),
            ("get_messages", lambda: s.get_messages("T", 0, 0)),
            ("query_by_key", lambda: s.query_by_key("T", "p0")),
            ("verify", s.verify),
            ("rebuild", s.rebuild),
            ("close", s.close),
            ("close again", s.close),
            ("open a writer", lambda: MessageStore(root, _cfg())),
        ]}
        out["closed"] = s.closed
        gc.collect()
        return out

    def child_drops_handle():
        nonlocal s
        s = None
        gc.collect()     # the handle's finalizer runs in the child
        return {}

    def child_exits():   # the child ends through interpreter exit, atexit hooks and all
        sys.exit(0)

    got = _in_child(child)
    _in_child(child_drops_handle)
    pid = os.fork()
    if pid == 0:
        child_exits()
    os.waitpid(pid, 0)
    after = {"abort": os.path.exists(os.path.join(root, "abort")), "next_segment": os.path.exists(next_seg)}
    fd = os.open(os.path.join(root, "lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        after["lock_held"] = False
    except BlockingIOError:
        after["lock_held"] = True
    finally:
        os.close(fd)
    second = s.put(Message("T", b"parent-1"), queue_id=0)
    after["parent_offsets"] = [first.phy_offset, second.phy_offset]
    s.close()
    with MessageStore(root, _cfg(), read_only=True) as r:
        after["bodies"] = [m.body.decode() for m in r.scan()]
        after["verify_ok"] = r.verify().ok
    return {"child": got, "after": after}


def reader_scenario(root):
    with MessageStore(root, _cfg()) as s:
        for i in range(3):
            s.put(Message("T", f"m{i}".encode()), queue_id=0)
    r = MessageStore(root, _cfg(), read_only=True)

    def child():
        out = {"bodies": [m.body.decode() for m in r.scan()],
               "get_messages": len(r.get_messages("T", 0, 0).messages)}
        r.close()
        return out

    got = _in_child(child)
    got["parent_still_reads"] = r.get_by_offset(0).body.decode()
    r.close()
    return got


def _run(what, root):
    import rmqstore
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(rmqstore.__file__))}
    p = subprocess.run([sys.executable, __file__, what, str(root)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_forked_writer_handle_refuses_everything_and_touches_nothing(tmp_path):
    got = _run("writer", tmp_path / "s")
    child, after = got["child"], got["after"]
    foreign = ForeignProcessError.__name__
    assert issubclass(ForeignProcessError, StoreError)
    calls = ["put", "put_batch", "flush", "commit_offset", "get_by_offset", "get_messages", "query_by_key", "verify",
             "rebuild"]
    assert {k: child[k] for k in calls} == {k: foreign for k in calls}
    assert child["close"] == child["close again"] == "ok" and child["closed"] is True
    assert child["open a writer"] == StoreLockedError.__name__
    assert after["abort"] and after["next_segment"] and after["lock_held"]
    # the parent writes on where it was, and only its messages are stored
    assert after["parent_offsets"][1] > after["parent_offsets"][0]
    assert after["bodies"] == ["parent-0", "parent-1"] and after["verify_ok"]


def test_forked_read_only_handle_keeps_reading(tmp_path):
    got = _run("reader", tmp_path / "s")
    assert got == {"bodies": ["m0", "m1", "m2"], "get_messages": 3, "parent_still_reads": "m0"}


if __name__ == "__main__":
    scenario = {"writer": writer_scenario, "reader": reader_scenario}[sys.argv[1]]
    print(json.dumps(scenario(sys.argv[2])))
