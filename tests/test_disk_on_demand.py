"""Disk on demand: store files keep RocketMQ's sizes but are sparse; their blocks are
allocated (fallocate) in a window ahead of each writer, so a new store takes tens of MB,
and a full disk is a DiskFullError before a write, never SIGBUS inside one.

The full-disk cases fill a real small file system (a tmpfs mounted in a private user and
mount namespace, so no privilege is needed where user namespaces are allowed) from a child
process: a SIGBUS there kills the child and fails the test."""
import errno
import json
import os
import subprocess
import sys

import pytest

from rmqstore import DiskFullError, Message, MessageStore, StoreConfig
from rmqstore._segment import inject_fault

MIB = 1 << 20


def allocated(path):
    """Bytes of disk the files under ``path`` hold (what ``du`` counts)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.stat(os.path.join(d, f)).st_blocks * 512
    return total


def test_a_new_store_takes_tens_of_mb_not_gb(tmp_path):
    """RocketMQ's default sizes (1 GiB segments, 5.7 MiB consume queues, 400 MiB index
    files), 100 keyed messages in 4 queues: the files have their full sizes, but hold only
    their windows of blocks, open (with the next segment made ahead) and after close."""
    cfg = StoreConfig()
    with MessageStore(tmp_path / "s", cfg) as store:
        for i in range(100):
            store.put(Message("T", b"x" * 128, keys=f"k{i}"))
        store.wait_dispatched()
        open_bytes = allocated(tmp_path / "s")
        segs = store.commitlog.segments.segments
        assert [os.path.getsize(s.path) for s in segs] == [1 << 30] * len(segs)
    index_file = next((tmp_path / "s" / "index").iterdir())
    assert os.path.getsize(index_file) == 40 + 4 * cfg.index_slots + 20 * cfg.index_entries
    cq_file = tmp_path / "s" / "consumequeue" / "T" / "0" / "00000000000000000000"
    assert os.path.getsize(cq_file) == 20 * cfg.consume_queue_entries
    # windows: commitlog 16 MiB (+ the next segment's first 16 MiB while open), index
    # header and slots (20 MiB) + 1 MiB of entries, 1 MiB of each of the 4 consume queues
    assert open_bytes <= 16 * MIB + 16 * MIB + 21 * MIB + 4 * MIB + MIB
    assert allocated(tmp_path / "s") <= 16 * MIB + 21 * MIB + 4 * MIB + MIB
    with MessageStore(tmp_path / "s", read_only=True) as store:
        assert store.verify().ok
        assert [m.keys for m in store.query_by_key("T", "k99")] == [["k99"]]


def test_reserve_ahead_zero_allocates_whole_files(tmp_path):
    """``reserve_ahead_bytes=0`` is RocketMQ's own behaviour: every file fully allocated
    when it is made."""
    cfg = StoreConfig(commitlog_file_size=8 * MIB, consume_queue_entries=10_000, index_slots=1000,
                      index_entries=4000, reserve_ahead_bytes=0, warm_mapped_file=False)
    with MessageStore(tmp_path / "s", cfg) as store:
        store.put(Message("T", b"x", keys="k"), queue_id=0)
        store.wait_dispatched()
    assert allocated(tmp_path / "s" / "commitlog") >= 8 * MIB
    assert allocated(tmp_path / "s" / "consumequeue") >= 200_000
    assert allocated(tmp_path / "s" / "index") >= 40 + 4000 + 80_000


def test_the_window_follows_the_writer(tmp_path):
    """Blocks are allocated ahead of the write position, never far past it: after every
    put, ``[0, end of data)`` is allocated and at most one window (rounded to pages) more."""
    window = 64 << 10
    cfg = StoreConfig(commitlog_file_size=4 * MIB, reserve_ahead_bytes=window, warm_mapped_file=False,
                      message_index_enable=False)
    with MessageStore(tmp_path / "s", cfg) as store:
        for _ in range(3000):
            r = store.put(Message("T", os.urandom(1000)))
            seg = store.commitlog.segments.last
            assert seg.reserved >= seg.wrote_pos == r.phy_offset + r.size - seg.base_offset
            assert seg.reserved <= seg.wrote_pos + window + 4096
        used = allocated(tmp_path / "s" / "commitlog")
        data = store.max_phy_offset
        segments = len(store.commitlog.segments.segments)
    assert data <= used <= data + segments * (window + 4096)


def _crossing_config():
    return StoreConfig(commitlog_file_size=1 * MIB, reserve_ahead_bytes=16 << 10, warm_mapped_file=False,
                       message_index_enable=False)


def _fill_to_window(store, body):
    """Put until the next put of ``body`` needs blocks past the reserved window."""
    while True:
        seg = store.commitlog.segments.last
        if seg is not None and seg.reserved - seg.wrote_pos < len(body):
            return
        store.put(Message("T", body), queue_id=0)


@pytest.mark.parametrize("batch", [False, True])
def test_a_failed_reserve_is_disk_full_before_the_write(tmp_path, batch):
    """ENOSPC from fallocate when a put (or a batch) crosses the window: DiskFullError,
    nothing stored or dispatched, and the store goes on once there is room again."""
    body = b"y" * 1000
    with MessageStore(tmp_path / "s", _crossing_config()) as store:
        _fill_to_window(store, body)
        store.wait_dispatched()
        before, entries = store.max_phy_offset, store.max_offset("T", 0)
        inject_fault("fallocate", 1, errno.ENOSPC, "/commitlog/")
        try:
            with pytest.raises(DiskFullError):
                if batch:
                    store.put_batch([Message("T", body) for _ in range(40)], 0)
                else:
                    store.put(Message("T", body), queue_id=0)
        finally:
            inject_fault("fallocate", 0, errno.ENOSPC)
        store.wait_dispatched()
        assert store.max_phy_offset == before
        assert store.max_offset("T", 0) == entries
        r = store.put(Message("T", b"after"), queue_id=0)
        assert r.phy_offset == before
    with MessageStore(tmp_path / "s", _crossing_config()) as store:
        assert store.verify().ok
        assert store.get_by_offset(before).body == b"after"
        assert store.max_offset("T", 0) == entries + 1


def test_a_batch_reserves_in_every_segment_it_rolls_into(tmp_path):
    """A batch bigger than a window and a segment: the blocks of every segment it writes
    are allocated before its first record; ENOSPC on the second segment stores nothing."""
    body = b"z" * 4000
    with MessageStore(tmp_path / "s", _crossing_config()) as store:
        store.put(Message("T", b"first"), queue_id=0)
        before = store.max_phy_offset
        inject_fault("fallocate", 2, errno.ENOSPC, "/commitlog/")   # the 1st is the current segment's
        try:
            with pytest.raises(DiskFullError):
                store.put_batch([Message("T", body) for _ in range(400)], 0)   # 1.6 MB: rolls
        finally:
            inject_fault("fallocate", 0, errno.ENOSPC)
        assert store.max_phy_offset == before
        results = store.put_batch([Message("T", body) for _ in range(400)], 0)
        assert len(store.commitlog.segments.segments) >= 2
        for seg in store.commitlog.segments.segments:
            assert seg.reserved >= seg.wrote_pos
    with MessageStore(tmp_path / "s", _crossing_config(), read_only=True) as store:
        assert store.verify().ok
        assert store.get_by_offset(results[-1].phy_offset).body == body


def test_truncation_frees_the_cut_blocks(tmp_path):
    """Recovery's cut punches a hole: the cut bytes read as zeros and hold no disk."""
    cfg = _crossing_config().with_(reserve_ahead_bytes=0)   # a fully allocated segment
    with MessageStore(tmp_path / "s", cfg) as store:
        results = [store.put(Message("T", os.urandom(1000)), queue_id=0) for _ in range(200)]
    seg_path = tmp_path / "s" / "commitlog" / "00000000000000000000"
    assert allocated(seg_path.parent) >= 1 * MIB
    cut = results[100].phy_offset
    with open(seg_path, "r+b") as f:   # a damaged record: recovery cuts from here when asked
        f.seek(cut + 8)
        f.write(b"\xff" * 4)
    with MessageStore(tmp_path / "s", cfg, repair=True) as store:
        assert store.max_phy_offset == cut
    assert allocated(seg_path.parent) <= cut + 8192
    with open(seg_path, "rb") as f:
        f.seek(cut)
        assert f.read(1 * MIB - cut).strip(b"\0") == b""


# -- a real full file system -------------------------------------------------------------

# How to mount a small file system at /mnt in a private mount namespace: ext4 on a loop
# device (needs root) holds sparse files as most disks do; tmpfs takes a page even to read
# a hole, so files there are allocated whole (rmq_mmap.c).
MOUNTS = {
    "ext4": (["unshare", "-m"], "mkfs.ext4 -q -F {img} 8M && mount -o loop {img} /mnt"),
    "tmpfs": (["unshare", "-rm"], "mount -t tmpfs -o size=6m tmpfs /mnt"),
}


def _can_mount(fs, tmp):
    prefix, mount = MOUNTS[fs]
    try:
        r = subprocess.run(prefix + ["sh", "-c", mount.format(img=tmp / "probe.img")], capture_output=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def fill(path, body_size, keyed):
    """Child: fill the file system holding ``path`` through a store; then reopen it
    read-only and check every acknowledged put. Prints a JSON summary."""
    from rmqstore import StoreError
    cfg = StoreConfig(commitlog_file_size=1 * MIB, reserve_ahead_bytes=64 << 10, consume_queue_entries=1000,
                      index_slots=64, index_entries=2000, flush_mode="async")
    acked, errors = [], []
    store = MessageStore(path, cfg)
    i = 0
    while len(errors) < 20 and i < 200_000:
        try:
            r = store.put(Message("T", os.urandom(body_size), keys=f"k{i}" if keyed else None))
            acked.append((r.phy_offset, i))
        except StoreError as e:
            errors.append(type(e).__name__)
        i += 1
    try:
        store.close()
    except StoreError as e:
        errors.append("close:" + type(e).__name__)
    missing = []
    with MessageStore(path, cfg, read_only=True) as ro:
        for off, n in acked:
            try:
                ro.get_by_offset(off)
            except StoreError:
                missing.append(n)
    print(json.dumps({"acked": len(acked), "errors": sorted(set(errors)), "missing": missing}))


@pytest.mark.parametrize("fs", sorted(MOUNTS))
@pytest.mark.parametrize("body_size,keyed", [(16 << 10, False), (100, True)])
def test_a_full_file_system_never_kills_the_process(tmp_path, fs, body_size, keyed):
    """A small file system filled by 16 KiB bodies (the commitlog fills it) or by small
    keyed messages (consume queues and index grow too): the process lives, puts end in a
    DiskFullError (or the read-only state a failed flush leaves), and every acknowledged
    put reads back."""
    if not _can_mount(fs, tmp_path):
        pytest.skip(f"cannot mount a small {fs} here (needs root or user namespaces)")
    script = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
              f"from test_disk_on_demand import fill; fill('/mnt/store', {body_size}, {keyed})")
    prefix, mount = MOUNTS[fs]
    cmd = f"{mount.format(img=tmp_path / 'fs.img')} && exec {sys.executable} -c \"{script}\""
    r = subprocess.run(prefix + ["sh", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"child died ({r.returncode}): {r.stderr[-2000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["acked"] > 0
    assert "DiskFullError" in out["errors"] or "StoreReadOnlyError" in out["errors"], out["errors"]
    assert out["missing"] == []
