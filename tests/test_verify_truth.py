"""verify and recover tell the truth: a store that lost nothing to a kill -9 of our own
writer verifies clean (the pre-made next segment is no data), a recover dry run predicts
what --yes does, and every figure names its unit."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import CRASHED_498, copy_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def _cli_json(*args):
    p = subprocess.run([sys.executable, "-m", "rmqstore", *map(str, args), "--json"], capture_output=True, text=True,
                       timeout=120, env=ENV)
    assert p.returncode in (0, 3), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_verify_after_kill_of_our_writer(tmp_path):
    code = textwrap.dedent(f"""
        import os
        from rmqstore import Message, MessageStore, StoreConfig
        s = MessageStore({str(tmp_path)!r}, StoreConfig(commitlog_file_size=1 << 20, flush_mode="sync",
                                                        index_slots=1000, index_entries=4000))
        for i in range(3000):
            s.put(Message("T", b"x" * 500, keys="k%d" % i))
        assert s.wait_dispatched(30)
        os.kill(os.getpid(), 9)
    """)
    p = subprocess.run([sys.executable, "-c", code], env=ENV, timeout=120, capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    segs = sorted(os.listdir(tmp_path / "commitlog"))
    assert len(segs) >= 3   # the segment being written and the one made ahead of it
    rc, rep = _cli_json("verify", tmp_path)
    assert rc == 0 and rep["ok"], rep["problems"]
    assert rep["records"] == 3000


def _fields(rep):
    keys = ("endOffset", "commitlogBytesTruncated", "consumeQueueBytesTruncated", "indexEntriesDropped",
            "commitlogBytesRedispatched", "cutsDurableData")
    return {k: rep[k] for k in keys}


def test_recover_dry_run_predicts_the_real_run(tmp_path):
    if not (CRASHED_498 / "store").is_dir():
        pytest.skip("crashed fixture not available")
    store = copy_store(CRASHED_498 / "store", tmp_path)
    _, dry = _cli_json("recover", store)
    assert dry["dryRun"] is True
    _, real = _cli_json("recover", store, "--yes")
    assert real["dryRun"] is False
    assert _fields(dry) == _fields(real)
    assert real["indexEntriesDropped"] > 0 and real["commitlogBytesRedispatched"] > 0
    assert "recordsRedispatched" not in real   # a byte count is named as bytes
