"""A full disk says it once: on a small tmpfs, the put that meets ENOSPC raises
DiskFullError; no background thread prints a traceback, close() returns (saying what it
could not write) and the next open recovers everything acknowledged, logging no negative
time."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


@pytest.mark.parametrize("flush_mode", ["sync", "async"])
def test_full_disk_is_one_error(small_tmpfs, flush_mode):
    code = textwrap.dedent(f"""
        import logging, os
        logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(name)s: %(message)s")
        from rmqstore import Message, MessageStore, StoreConfig
        from rmqstore.errors import DiskFullError
        path = os.path.join({str(small_tmpfs)!r}, "s")
        cfg = StoreConfig(commitlog_file_size=4 << 20, index_slots=1000, index_entries=4000,
                          flush_mode={flush_mode!r})
        s = MessageStore(path, cfg)
        acked = 0
        try:
            while True:
                acked += len(s.put_batch([Message("T", b"x" * 4000) for _ in range(50)]))
        except DiskFullError as e:
            print("RAISED", type(e).__name__)
        print("CLOSE", s.close())
        with MessageStore(path, cfg, read_only=True) as r:
            got = sum(r.max_offset("T", q) for q in r.queue_ids("T"))
            ends = r.max_phy_offset
        print("ACKED", acked, "ENDS", ends)
        import subprocess   # room again (an operator freed some): a writer's open dispatches what close could not
        subprocess.run(["mount", "-o", "remount,size=64m", {str(small_tmpfs)!r}], check=True)
        with MessageStore(path, cfg) as w:
            print("FOUND", sum(w.max_offset("T", q) for q in w.queue_ids("T")))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    out, err = p.stdout, p.stderr
    assert p.returncode == 0, err
    assert "RAISED DiskFullError" in out and "CLOSE None" in out
    assert "Traceback" not in err and "Bad address" not in err, err
    assert "time -" not in err, err
    acked = int(out.split("ACKED ")[1].split()[0])
    assert acked > 0 and f"FOUND {acked}" in out, out
