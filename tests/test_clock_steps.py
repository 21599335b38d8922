"""A clock that steps back: no durability decision rests on store times growing. Records
are given store times lower than earlier ones by patching STORETIMESTAMP (not covered by
the body CRC), as a writer whose clock was set back 5 s would have written them."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.checkpoint import Checkpoint

from conftest import SMALL_INDEX

STEP_MS = 5000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(**kw):
    return StoreConfig(commitlog_file_size=1 << 20, warm_mapped_file=False, flush_interval_ms=600_000,
                       flush_cq_interval_ms=600_000, **SMALL_INDEX, **kw)


# TOTALSIZE..BORNTIMESTAMP (4+4+4+4+4+8+8+4+8) + BORNHOST (IPv4 + port, 8): STORETIMESTAMP
STORE_TS_AT = 56


def _set_store_time(root, phy, ts, cfg):
    seg_size = cfg.commitlog_file_size
    path = os.path.join(root, "commitlog", "%020d" % (phy - phy % seg_size))
    with open(path, "r+b") as f:
        f.seek(phy % seg_size + STORE_TS_AT)
        f.write(struct.pack(">q", ts))


def _crash_after_step_back(root, cfg_kw):
    """A writer puts 50 messages, flushes (the checkpoint counts them), puts 50 more, and is
    killed; the second 50 are then given store times 5 s before the first 50's newest,
    and a torn record is left after them. Returns the put results as (phy, size, ts)."""
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {ROOT!r} + "/tests")
        from rmqstore import Message, MessageStore, StoreConfig
        from test_clock_steps import _cfg
        s = MessageStore({root!r}, _cfg(**{cfg_kw!r}))
        out = [s.put(Message("Clock", b"a" * 200, keys="k%d" % i)) for i in range(50)]
        s.flush()
        out += [s.put(Message("Clock", b"b" * 200, keys="k%d" % i)) for i in range(50, 100)]
        print(json.dumps([(r.phy_offset, r.size, r.store_timestamp) for r in out]), flush=True)
        os.kill(os.getpid(), 9)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == -signal.SIGKILL, p.stderr
    res = json.loads(p.stdout)
    cfg = _cfg(**cfg_kw)
    newest_flushed = max(ts for _, _, ts in res[:50])
    for k, (phy, _, _) in enumerate(res[50:]):
        _set_store_time(root, phy, newest_flushed - STEP_MS + k, cfg)
    end = res[-1][0] + res[-1][1]
    seg_size = cfg.commitlog_file_size
    with open(os.path.join(root, "commitlog", "%020d" % (end - end % seg_size)), "r+b") as f:
        f.seek(end % seg_size)
        f.write(struct.pack(">ii", 300, 0x12345678) + b"\x07" * 100)   # a torn record: bad magic
    return res


def test_torn_tail_after_step_back_opens(tmp_path):
    res = _crash_after_step_back(str(tmp_path), {})
    cp = Checkpoint(os.path.join(tmp_path, "checkpoint")).load()
    assert cp.physic_msg_timestamp > max(ts for _, _, ts in res[:50]) - STEP_MS   # the clock went back past it
    with MessageStore(tmp_path, _cfg(), read_only=True) as ro:   # recover's dry run
        assert not ro.recovery.cuts_durable_data
        assert ro.recovery.end_offset == res[-1][0] + res[-1][1]
    with MessageStore(tmp_path, _cfg()) as s:   # no CorruptRecordError: only the torn record goes
        assert s.recovery.end_offset == res[-1][0] + res[-1][1]
        assert [s.get_by_offset(phy).store_size for phy, _, _ in res] == [size for _, size, _ in res]
        assert sum(s.max_offset("Clock", q) for q in s.queue_ids("Clock")) == 100
        assert s.verify().ok


def test_cli_recover_dry_run_after_step_back(tmp_path):
    _crash_after_step_back(str(tmp_path), {})
    p = subprocess.run([sys.executable, "-m", "rmqstore", "recover", "--json", str(tmp_path)],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    assert "cutsDurableData\": false" in p.stdout.replace(" ", "").replace("\":f", "\": f") or \
        json.loads(p.stdout).get("cutsDurableData") is False


def test_verify_healthy_store_after_step_back(tmp_path):
    """A message stored before the clock was set back 10 s: its store time, and the
    checkpoint's, are 'in the future' of now; index times run backwards. None is damage."""
    cfg = _cfg(background_dispatch=False)
    with MessageStore(tmp_path, cfg) as s:
        first = [s.put(Message("Clock", b"x" * 100, keys="a%d" % i), queue_id=0) for i in range(5)]
        ahead = max(r.store_timestamp for r in first) + 10_000
        for r in first:   # as if stored with the clock 10 s ahead, before it was set back
            _set_store_time(str(tmp_path), r.phy_offset, ahead, cfg)
        later = [s.put(Message("Clock", b"y" * 100, keys="b%d" % i), queue_id=0) for i in range(5)]
        s.wait_dispatched()
        s.checkpoint.physic_msg_timestamp = ahead
    with MessageStore(tmp_path, cfg) as s:
        rep = s.verify()
        assert rep.ok, rep.problems
        # a key stored before its index file began starts a new file (RocketMQ would write it
        # with timeDiff 0, at a time it was not stored)
        assert [f.header[0] for f in s.index.files] == [ahead, later[0].store_timestamp]
    index_file = os.path.join(tmp_path, "index", sorted(os.listdir(tmp_path / "index"))[0])
    with open(index_file, "r+b") as f:   # RocketMQ's own header after a step back: endTimestamp < beginTimestamp
        f.seek(8)
        f.write(struct.pack(">q", ahead - 3000))
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        rep = s.verify()
        assert rep.ok, rep.problems
        got = s.query_by_key("Clock", "b3", begin=later[3].store_timestamp - 1, end=later[3].store_timestamp + 1)
        assert [m.commitlog_offset for m in got] == [later[3].phy_offset]
        got = s.query_by_key("Clock", "a2", begin=ahead - 1, end=ahead + 1)
        assert [m.commitlog_offset for m in got] == [first[2].phy_offset]
