"""The batched read paths give what reading one record at a time gives: scan's runs (one
buffer per run, records up to a byte budget, a longer record read alone, a corrupt one
stopping the run after the messages before it) and get_messages reading the first
max_count consume-queue entries before RocketMQ's 800-entry window."""
import os
import struct

import pytest

from rmqstore import CorruptRecordError, GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.commitlog import SCAN_BATCH, SCAN_BATCH_BYTES

from conftest import SMALL_INDEX


def _cfg(**kw):
    kw.setdefault("commitlog_file_size", 1 << 20)
    kw.setdefault("consume_queue_entries", 1000)
    return StoreConfig(**{**SMALL_INDEX, "warm_mapped_file": False, **kw})


def _one_by_one(root, start, stop, size=1 << 20):
    """Offsets of the records from ``start`` to ``stop``, followed record by record in the
    commitlog files (BLANKs end a file: jump to the next)."""
    out, pos = [], start
    while pos < stop:
        with open(root / "commitlog" / f"{pos - pos % size:020d}", "rb") as f:
            f.seek(pos % size)
            total, magic = struct.unpack(">ii", f.read(8))
        if magic == -875286124 or total == 0:
            pos += size - pos % size
            continue
        out.append(pos)
        pos += total
    return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A store of 3 * SCAN_BATCH small messages, with records longer than the scan's byte
    budget and a file boundary among them."""
    root = tmp_path_factory.mktemp("mixed") / "s"
    big = SCAN_BATCH_BYTES + 1000
    with MessageStore(root, _cfg(max_message_size=2 * big)) as s:
        for i in range(3 * SCAN_BATCH):
            body = bytes([i % 256]) * (big if i in (5, 6, 200, 300) else 10 + i % 50)
            s.put(Message("T", body, keys=[f"k{i}"]), queue_id=i % 2)
        s.wait_dispatched()
    return root


def test_scan_equals_record_by_record_reads(mixed):
    with MessageStore(mixed, _cfg(), read_only=True) as s:
        offsets = _one_by_one(mixed, s.min_phy_offset, s.max_phy_offset)
        assert len(offsets) == 3 * SCAN_BATCH and s.max_phy_offset > s.config.commitlog_file_size
        assert [m.phy_offset for m in s.scan()] == offsets
        assert list(s.scan()) == [s.get_by_offset(o) for o in offsets]
        spans = [(offsets[3], offsets[150]), (offsets[6], offsets[-1]), (offsets[7], offsets[-1] + 1), (0, offsets[7])]
        for a, b in spans:
            assert [m.phy_offset for m in s.scan(a, b)] == [o for o in offsets if a <= o < b]


def test_scan_stops_at_a_bad_crc_after_the_messages_before_it(mixed, copy_fixture):
    """A body byte flipped under an open store (recovery would cut the log there): scan
    with check_crc yields the messages before it, then raises; without, it yields all."""
    root = copy_fixture(mixed, name="bad")
    with MessageStore(root, _cfg(), read_only=True) as s:
        offsets = _one_by_one(root, 0, s.max_phy_offset)
        victim = s.get_by_offset(offsets[150])
        seg = root / "commitlog" / f"{0:020d}"
        body_at = seg.read_bytes().index(victim.body, offsets[150])
        fd = os.open(seg, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes([victim.body[0] ^ 0xFF]), body_at)
        finally:
            os.close(fd)
        assert s.get_by_offset(offsets[150]).body != victim.body
        seen = []
        with pytest.raises(CorruptRecordError):
            for m in s.scan(check_crc=True):
                seen.append(m.phy_offset)
        assert seen == offsets[:150]
        assert [m.phy_offset for m in s.scan()] == offsets


def test_get_messages_past_holes_reads_the_whole_window(tmp_path):
    """Twelve RocketMQ hole entries (queue offsets 2..13): from offset 2, max_count=4 still
    finds four messages (RocketMQ walks up to 800 entries), next offset after them."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        for i in range(20):
            s.put(Message("T", b"m%d" % i), queue_id=0)
        s.wait_dispatched()
    path = root / "consumequeue" / "T" / "0" / ("%020d" % 0)
    data = bytearray(path.read_bytes())
    for k in range(2, 14):
        struct.pack_into(">qiq", data, k * 20, 0, 0x7FFFFFFF, 0)
    path.write_bytes(bytes(data))
    with MessageStore(root, _cfg(), read_only=True) as s:
        r = s.get_messages("T", 0, 2, 4)
        assert r.status == GetMessageStatus.FOUND and r.next_offset == 18
        assert [m.body for m in r.messages] == [b"m14", b"m15", b"m16", b"m17"]
        # a hole after a message stops the batch (its size fails RocketMQ's isTheBatchFull)
        r = s.get_messages("T", 0, 0, 32)
        assert [m.body for m in r.messages] == [b"m0", b"m1"] and r.next_offset == 2
        r = s.get_messages("T", 0, 5, 20)
        assert [m.body for m in r.messages] == [b"m%d" % i for i in range(14, 20)] and r.next_offset == 20


@pytest.mark.parametrize("max_bytes", [1, 3, 7, 8, 9, 100])
def test_advance_moves_on_with_any_budget(tmp_path, max_bytes):
    """batch.advance reads at least one record's worth, whatever ``max_bytes``: a budget of
    1..7 bytes read TOTALSIZE's zero high byte as the end of data, and it returned
    ``start`` (a reader stepping with it never moved on)."""
    from rmqstore import batch
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=4096, warm_mapped_file=False,
                                                  **SMALL_INDEX)) as s:
        res = s.put_batch([Message("T", b"x" * 300) for _ in range(30)])   # BLANKs at segment ends too
    seg_ends = {base + size for _, base, size in batch.segment_files(tmp_path / "s")}
    pos, seen = 0, []
    while pos < res[-1].phy_offset + res[-1].size:
        nxt = batch.advance(tmp_path / "s", pos, max_bytes)
        assert nxt > pos
        seen.append(nxt)
        pos = nxt
    assert [p for p in seen if p not in seg_ends] == [r.phy_offset + r.size for r in res if
                                                      r.phy_offset + r.size not in seg_ends]
