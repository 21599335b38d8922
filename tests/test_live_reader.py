"""Read-only opens of a store a live writer is appending to (issue 11 item 8).

A writer process appends numbered messages to a store with tiny segments, so commitlog,
consume-queue and index files are created, filled and rolled all the time, and closes and
reopens it every few hundred messages (the close removes the pre-made next segment). Beside
it, a reader process opens the store read-only again and again. Every open must succeed and
show a consistent prefix: message numbers 0..n-1 with no gap, never fewer than the open
before; consume-queue reads and key queries agree with the commitlog. ``rmqstore tail``
follows the same writer and must print every message once, in order.

Writer and reader run as child processes with a timeout, so a crash or a hang fails the test.
"""
import json
import os
import subprocess
import sys
import time

import pytest

COMMON = r"""
import sys, time
from rmqstore import Message, MessageStore, StoreConfig

def config(mode):
    return StoreConfig(commitlog_file_size=32 * 1024, consume_queue_entries=32, index_slots=16,
                       index_entries=64, flush_mode=mode, flush_interval_ms=5, default_queue_nums=2,
                       warm_ahead_bytes=32 * 1024)

def body(seq):
    return b"seq-%08d-" % seq + b"x" * (seq % 300)
"""

WRITER = COMMON + r"""
path, mode, stop_file = sys.argv[1:4]
seq = 0
while not __import__("os").path.exists(stop_file):
    with MessageStore(path, config(mode)) as s:
        for _ in range(200):
            s.put(Message("Live", body(seq), keys=f"k{seq}", tags=f"t{seq % 3}"))
            seq += 1
            if seq % 20 == 0:
                time.sleep(0.001)   # let the reader in between rolls
print(seq)
"""

READER = COMMON + r"""
import json
path, mode, opens = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen, problems = 0, []
for i in range(opens):
    try:
        with MessageStore(path, config(mode), read_only=True) as s:
            seqs = [int(m.body[4:12]) for m in s.scan()]
            if seqs != list(range(len(seqs))):
                problems.append(f"open {i}: not a prefix: {len(seqs)} messages")
            if len(seqs) < seen:
                problems.append(f"open {i}: {len(seqs)} messages after {seen}")
            seen = max(seen, len(seqs))
            from_queues = []
            for q in (s.queue_ids("Live") if "Live" in s.topics() else []):
                off = s.min_offset("Live", q)
                while True:
                    r = s.get_messages("Live", q, off, 32)
                    if not r.messages:
                        break
                    from_queues += [int(m.body[4:12]) for m in r.messages]
                    for m in r.messages:
                        if m.body != body(int(m.body[4:12])) or m.queue_id != q:
                            problems.append(f"open {i}: queue {q} offset {m.queue_offset} is wrong")
                    off = r.next_offset
                if r.problems:
                    problems.append(f"open {i}: queue {q}: {r.problems[:3]}")
            if len(set(from_queues)) != len(from_queues) or any(x >= len(seqs) for x in from_queues):
                problems.append(f"open {i}: queues hold {len(from_queues)} entries beyond the log")
            for seq in seqs[-3:]:
                for m in s.query_by_key("Live", f"k{seq}"):
                    if int(m.body[4:12]) != seq:
                        problems.append(f"open {i}: key k{seq} found message {m.body[:12]!r}")
    except Exception as e:
        problems.append(f"open {i}: {type(e).__name__}: {e}")
print(json.dumps({"seen": seen, "problems": problems}))
"""


def _run_live(tmp_path, mode, reader_cmd, timeout):
    path, stop = str(tmp_path / "live"), str(tmp_path / "stop")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path, mode, stop],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not os.path.exists(os.path.join(path, "commitlog")):   # the writer has opened once
            assert writer.poll() is None, writer.communicate()
            time.sleep(0.01)   # not a busy loop: on 2 cores it would starve the writer
        reader = subprocess.run(reader_cmd(path), capture_output=True, text=True, timeout=timeout)
    finally:
        open(stop, "w").close()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    return reader, int(out)


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("opens", [pytest.param(100, id="100-opens"),
                                   pytest.param(500, id="500-opens", marks=pytest.mark.slow)])
def test_read_only_opens_of_a_live_store(tmp_path, mode, opens):
    reader, written = _run_live(tmp_path, mode,
                                lambda path: [sys.executable, "-c", READER, path, mode, str(opens)], 600)
    assert reader.returncode == 0, reader.stderr
    result = json.loads(reader.stdout)
    assert result["problems"] == []
    assert 0 < result["seen"] <= written
    assert "Traceback" not in reader.stderr


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_tail_follows_a_live_writer(tmp_path, mode):
    count = 3000   # the writer closes and reopens every 200 messages, rolling segments throughout

    def tail(path):
        return [sys.executable, "-m", "rmqstore.cli", "tail", path, "--json", "--from", "0",
                "--interval", "0.01", "--max", str(count), "--timeout", "300"]
    reader, written = _run_live(tmp_path, mode, tail, 600)
    assert reader.returncode == 0, reader.stderr
    seqs = [int(json.loads(line)["body"][4:12]) for line in reader.stdout.splitlines()]
    assert seqs == list(range(count))
    assert written >= count


def _small_store(tmp_path, n=300):
    from rmqstore import Message, MessageStore, StoreConfig
    cfg = StoreConfig(commitlog_file_size=32 * 1024, warm_mapped_file=False)
    path = tmp_path / "s"
    with MessageStore(path, cfg) as s:
        s.put_batch([Message("T", b"m%05d" % i + b"x" * 100) for i in range(n)], 0)
        end = s.max_phy_offset
    return path, cfg, end


def test_files_removed_since_listing_are_left_out_read_only(tmp_path, monkeypatch):
    """A segment a live writer's retention (oldest) or close (pre-made newest) removes
    between the listing and the open: read-only leaves it out, a writer refuses."""
    from rmqstore import MessageStore, StoreIOError, segments
    path, cfg, end = _small_store(tmp_path)
    real = segments.list_segment_files

    def listing(directory):
        files = real(directory)
        if not directory.endswith("commitlog"):
            return files
        size = cfg.commitlog_file_size
        return [(-size, os.path.join(directory, "gone-head"))] + files + \
            [(files[-1][0] + size, os.path.join(directory, segments.segment_name(files[-1][0] + size)))]

    monkeypatch.setattr(segments, "list_segment_files", listing)
    with MessageStore(path, cfg, read_only=True) as s:
        assert s.max_phy_offset == end
        assert len(list(s.scan())) == 300
    with pytest.raises(StoreIOError):
        MessageStore(path, cfg)


def test_read_only_end_ignores_a_premade_empty_segment(tmp_path):
    """A live writer keeps the next segment made ahead; a reader's end of data is where
    the messages end, not that file's start."""
    from rmqstore import MessageStore, segments
    path, cfg, end = _small_store(tmp_path)
    base = (end // cfg.commitlog_file_size + 1) * cfg.commitlog_file_size
    with open(path / "commitlog" / segments.segment_name(base), "wb") as f:
        f.truncate(cfg.commitlog_file_size)
    with MessageStore(path, cfg, read_only=True) as s:
        assert s.max_phy_offset == end
        assert list(s.scan(end)) == [] and len(list(s.scan())) == 300
