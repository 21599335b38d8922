"""Retention never outruns dispatch, and a queue's offsets never shift: clean_expired keeps
the segments holding records not yet dispatched, the dispatcher never moves over records
it has not dispatched, a gap in queue offsets is kept (blank entries), and recovery checks
consume-queue entries against their records' QUEUEOFFSET and dispatches again where they
disagree."""
import os
import time

import pytest

import rmqstore.store as store_module
from rmqstore import GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.consume_queue import ENTRY

from conftest import SMALL_INDEX

HOUR = 3600


def _cfg(background):
    return StoreConfig(commitlog_file_size=4096, consume_queue_entries=4, warm_mapped_file=False, **SMALL_INDEX,
                       file_reserved_time=72, delete_when="04", disk_max_used_space_ratio=100,
                       background_dispatch=background)


def _delete_hour():
    t = time.localtime()
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday + 10, 4, 30, 0, 0, 0, -1))


def _expire_all(s, now):
    for seg in s.commitlog.segments.segments:
        os.utime(seg.path, (now - 73 * HOUR, now - 73 * HOUR))


def _check_offsets(s, results):
    """Every message still stored is found at the queue offset put returned."""
    lo, hi = s.min_offset("Ret", 0), s.max_offset("Ret", 0)
    assert hi == results[-1].queue_offset + 1
    for r in results:
        if r.queue_offset < lo:
            continue
        g = s.get_messages("Ret", 0, r.queue_offset, 1)
        assert g.status is GetMessageStatus.FOUND, (r.queue_offset, g.status, lo, hi)
        assert [(m.queue_offset, m.commitlog_offset) for m in g.messages] == [(r.queue_offset, r.phy_offset)]


def test_retention_keeps_undispatched_segments(tmp_path, monkeypatch):
    """A dispatcher far behind (the Python dispatch path stalled; the native loop, which
    never stalls so, is tested below): retention keeps every segment it has not read."""
    monkeypatch.setattr(store_module, "RETENTION_DISPATCH_WAIT", 0.05)
    s = MessageStore(tmp_path, _cfg(False))
    try:
        res = [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(20)]
        s.wait_dispatched(5)
        dispatched = s.dispatcher.reput_from
        with monkeypatch.context() as m:   # a dispatcher far behind: none of what follows is dispatched
            m.setattr(s.dispatcher, "run_once", lambda: False)
            res += [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(40)]
            now = _delete_hour()
            _expire_all(s, now)
            dry = s.clean_expired(now=now, dry_run=True)
            rep = s.clean_expired(now=now)
            assert s.dispatcher.reput_from == dispatched
        # what it deleted was dispatched: no segment gone ends after the dispatcher's position
        assert rep.min_phy_offset <= dispatched
        assert rep.segments_kept_undispatched > 0
        assert (dry.segments, dry.segments_kept_undispatched) == (rep.segments, rep.segments_kept_undispatched)
        assert s.wait_dispatched(5)
        _check_offsets(s, res)
        s.close()
        s = MessageStore(tmp_path, _cfg(False))
        _check_offsets(s, res)
        assert s.verify().ok
    finally:
        s.close()


def test_retention_beside_the_native_dispatcher(tmp_path, monkeypatch):
    """With the native dispatch thread running, retention deletes only what it has read:
    every queue offset put returned still names its message, before and after a reopen."""
    monkeypatch.setattr(store_module, "RETENTION_DISPATCH_WAIT", 0.05)
    s = MessageStore(tmp_path, _cfg(True))
    try:
        assert s.dispatcher.native
        res = [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(60)]
        now = _delete_hour()
        _expire_all(s, now)
        rep = s.clean_expired(now=now)
        assert rep.min_phy_offset <= s.dispatcher.reput_from
        assert s.wait_dispatched(5)
        _check_offsets(s, res)
        s.close()
        s = MessageStore(tmp_path, _cfg(True))
        _check_offsets(s, res)
        assert s.verify().ok
    finally:
        s.close()


def test_dispatch_first_then_retention(tmp_path):
    """Without a background dispatcher, retention dispatches what is written first, then
    deletes as before: the expired segments do go."""
    with MessageStore(tmp_path, _cfg(False)) as s:
        res = [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(60)]
        now = _delete_hour()
        _expire_all(s, now)
        rep = s.clean_expired(now=now)
        assert rep.segments_deleted >= 3
        _check_offsets(s, res)


def test_gap_in_queue_offsets_is_kept(tmp_path):
    """Records whose queue offsets jump (their predecessors deleted before dispatch) land at
    their own queue offsets; the gap reads as blank entries, nothing shifts."""
    with MessageStore(tmp_path, _cfg(False)) as s:
        cq = s.consume_queues.get_or_create("Ret", 0)
        assert cq.put(0, 100, 0, 0)
        assert cq.put(5000, 300, 0, 7)   # 4,900 commitlog bytes between: room for the 6 records missing
        assert cq.max_offset == 8
        e = cq.read(7, 1)
        assert (int(e["phy_offset"][0]), int(e["size"][0])) == (5000, 300)


def test_implausible_gap_still_appends_in_place(tmp_path):
    """A QUEUEOFFSET jump larger than the commitlog bytes between could hold (a corrupt
    field) does not create files of blank entries: it is appended where the queue is."""
    with MessageStore(tmp_path, _cfg(False)) as s:
        cq = s.consume_queues.get_or_create("Ret", 0)
        assert cq.put(0, 100, 0, 0)
        assert cq.put(200, 300, 0, 10 ** 12)
        assert cq.max_offset == 2


def _shift_queue(root, drop_from, drop_to):
    """Remove entries [drop_from, drop_to) of Ret/0's consume queue, shifting the later ones
    down (the damage an earlier retention-ahead-of-dispatch left on disk)."""
    qdir = os.path.join(root, "consumequeue", "Ret", "0")
    names = sorted(os.listdir(qdir))
    blob = b"".join(open(os.path.join(qdir, n), "rb").read() for n in names)
    used = blob.rstrip(b"\0")
    used += b"\0" * (-len(used) % ENTRY)
    entries = [used[i:i + ENTRY] for i in range(0, len(used), ENTRY)]
    entries = entries[:drop_from] + entries[drop_to:]
    blob = b"".join(entries).ljust(len(blob), b"\0")
    size = os.path.getsize(os.path.join(qdir, names[0]))
    for k, n in enumerate(names):
        with open(os.path.join(qdir, n), "r+b") as f:
            f.write(blob[k * size:(k + 1) * size])


@pytest.mark.parametrize("clean", [True, False])
def test_recovery_repairs_shifted_queue_offsets(tmp_path, clean):
    with MessageStore(tmp_path, _cfg(False)) as s:
        res = [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(30)]
    _shift_queue(str(tmp_path), 10, 20)
    if not clean:
        open(os.path.join(tmp_path, "abort"), "w").close()
    with MessageStore(tmp_path, _cfg(False)) as s:
        assert s.recovery.consume_queue_bytes_truncated > 0
        _check_offsets(s, res[20:])
        for off in range(10, 20):   # those entries are gone from the queue: none hands out another message
            g = s.get_messages("Ret", 0, off, 1)
            assert [m.queue_offset for m in g.messages] in ([], [off])


_KILL_CHILD = """
import os, sys, time
sys.path.insert(0, {tests!r})
from rmqstore import Message, MessageStore
from test_retention_dispatch import _cfg, _delete_hour, _expire_all
s = MessageStore({path!r}, _cfg({background!r}).with_(flush_mode="sync"))
now = _delete_hour()
i = 0
while True:
    r = s.put(Message("Ret", b"x" * 300, keys="k%d" % i), queue_id=0)
    print(r.queue_offset, r.phy_offset, flush=True)   # acknowledged: durable (SYNC)
    i += 1
    if i % 7 == 0:
        _expire_all(s, now)
        s.clean_expired(now=now)
"""


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True])
def test_kills_during_retention_keep_queue_offsets(tmp_path, background):
    """A SYNC writer running retention every few puts is killed at random moments; after
    each kill every acknowledged message still stored is at the queue offset put returned,
    and the queue's offsets have no gap but what retention removed."""
    import random
    import signal
    import subprocess
    import sys
    rng = random.Random(35)
    tests = os.path.dirname(os.path.abspath(__file__))
    acked = {}
    for _ in range(8):
        p = subprocess.Popen([sys.executable, "-c", _KILL_CHILD.format(tests=tests, path=str(tmp_path),
                                                                      background=background)],
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.path.dirname(tests)))
        deadline = rng.uniform(0.3, 1.5)
        import time
        t0 = time.monotonic()
        for line in p.stdout:
            q, phy = map(int, line.split())
            acked[q] = phy
            if time.monotonic() - t0 > deadline:
                break
        p.send_signal(signal.SIGKILL)
        for line in p.stdout:   # what it printed before the kill was acknowledged
            q, phy = map(int, line.split())
            acked[q] = phy
        p.wait()
        with MessageStore(tmp_path, _cfg(background)) as s:
            lo = s.min_offset("Ret", 0)
            assert s.max_offset("Ret", 0) >= max(acked) + 1
            for q, phy in acked.items():
                if q < lo:
                    continue
                g = s.get_messages("Ret", 0, q, 1)
                assert [(m.queue_offset, m.commitlog_offset) for m in g.messages] == [(q, phy)], (q, g.status)
