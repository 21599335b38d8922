"""Recovery: the real RocketMQ crashed store recovers to what RocketMQ recovered; torn and
corrupt tails made here are cut at the last valid record, zero-filled, CQ kept consistent."""
import os
import struct
import time

import pytest

from rmqstore import CorruptRecordError, Message, MessageStore, StoreConfig
from rmqstore._segment import MappedSegment
from rmqstore.checkpoint import Checkpoint

from conftest import CRASHED_498, SMALL_INDEX, copy_store, load_jsonl_gz, tree_state

BODY_AT = 88          # body offset in a v1 record with IPv4 hosts (DESIGN.md field list)
TOPIC = "TopicR"


@pytest.fixture(scope="module")
def recovered_498():
    path = CRASHED_498 / "reader_recovered.jsonl.gz"
    if not path.is_file():
        pytest.skip("crashed fixture not available")
    lines = load_jsonl_gz(str(path))
    return (lines[0], [x for x in lines if x["type"] == "queue"], [x for x in lines if x["type"] == "msg"])


def test_crashed_fixture_recovers_like_rocketmq(tmp_path, recovered_498):
    info, queues, msgs = recovered_498
    assert info["abortFileBefore"] and (CRASHED_498 / "store" / "abort").exists()
    with MessageStore(copy_store(CRASHED_498 / "store", tmp_path)) as s:
        rep = s.recovery
        assert not rep.clean_shutdown
        assert (s.min_phy_offset, s.max_phy_offset) == (info["minPhyOffset"], info["maxPhyOffset"])
        assert rep.end_offset == info["maxPhyOffset"]
        assert rep.records_verified == 5282          # every acknowledged put (manifest)
        assert rep.segments_scanned == info["maxPhyOffset"] // 262144 + 1 - rep.start_offset // 262144
        assert sorted((q["topic"], q["queueId"]) for q in queues) == sorted(s.consume_queues.queues)
        for q in queues:
            assert (s.min_offset(q["topic"], q["queueId"]), s.max_offset(q["topic"], q["queueId"])) == \
                (q["minOffset"], q["maxOffset"]), q
        for m in msgs:
            e = s.consume_queue_entries(m["cqTopic"], m["cqQueueId"], m["cqOffset"], 1)
            assert [tuple(int(v) for v in e[0])] == [(m["cqPhyOffset"], m["cqSize"], m["cqTagsCode"])], m
            got = s.get_by_offset(m["commitLogOffset"])
            assert (got.msg_id, got.store_size, got.body_crc, got.queue_offset) == \
                (m["msgId"], m["storeSize"], m["bodyCRC"], m["queueOffset"])
    assert not (tmp_path / "store" / "abort").exists()


def test_crashed_fixture_read_only_changes_nothing(recovered_498):
    info, _, _ = recovered_498
    before = tree_state(CRASHED_498 / "store")
    with MessageStore(CRASHED_498 / "store", read_only=True) as s:
        assert (s.min_phy_offset, s.max_phy_offset) == (info["minPhyOffset"], info["maxPhyOffset"])
    assert tree_state(CRASHED_498 / "store") == before


# -- torn and corrupt tails made here ------------------------------------------------------

def _cfg(**kw):
    base = dict(commitlog_file_size=64 * 1024, consume_queue_entries=8, warm_mapped_file=False,
                **SMALL_INDEX,
                flush_interval_ms=10, flush_cq_interval_ms=10)
    base.update(kw)
    return StoreConfig(**base)


def _write(path, n, cfg):
    """n messages over 2 queues; returns their PutResults and bodies in put order."""
    bodies = [(b"body-%04d-" % i) * (i % 7 + 1) for i in range(n)]
    with MessageStore(path, cfg) as s:
        res = [s.put(Message(TOPIC, b, tags=f"t{i % 3}"), queue_id=i % 2) for i, b in enumerate(bodies)]
    return res, bodies


def _segment_file(path, offset, cfg):
    size = cfg.commitlog_file_size
    return os.path.join(path, "commitlog", f"{offset - offset % size:020d}"), offset % size


def _patch(path, offset, data, cfg):
    fname, pos = _segment_file(path, offset, cfg)
    with open(fname, "r+b") as f:
        f.seek(pos)
        f.write(data)


def _crash_marker(path, flushed=0):
    """What a crash leaves: ``abort``, and a checkpoint whose last flush (physicMsgTimestamp)
    was at store time ``flushed`` (0: before any record these tests damage)."""
    open(os.path.join(path, "abort"), "wb").close()
    with open(os.path.join(path, "checkpoint"), "r+b") as f:
        f.write(struct.pack(">q", flushed))


def _flip(path, offset, cfg):
    fname, pos = _segment_file(path, offset, cfg)
    with open(fname, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x01]))


def _check_prefix(s, res, bodies, k, cfg):
    """Exactly messages [0, k) are stored, intact, with a consistent CQ and zeros after."""
    assert s.max_phy_offset == (res[k].phy_offset if k < len(res) else res[-1].phy_offset + res[-1].size)
    for r, b in zip(res[:k], bodies[:k], strict=False):
        m = s.get_by_offset(r.phy_offset)
        assert (m.msg_id, m.body) == (r.msg_id, b)
    for q in (0, 1):
        want = [(r.phy_offset, r.size) for r in res[:k][q::2]]
        got = [(int(e["phy_offset"]), int(e["size"])) for e in s.consume_queue_entries(TOPIC, q)]
        assert got == want
        assert s.max_offset(TOPIC, q) == len(want)
    fname, pos = _segment_file(s.path, s.max_phy_offset, cfg)
    with open(fname, "rb") as f:
        f.seek(pos)
        assert f.read().strip(b"\0") == b""


def test_torn_last_record_is_cut(tmp_path):
    cfg = _cfg()
    res, bodies = _write(tmp_path, 40, cfg)
    last = res[-1]
    _patch(tmp_path, last.phy_offset + last.size // 2, b"\0" * (last.size - last.size // 2), cfg)
    _crash_marker(tmp_path)
    with MessageStore(tmp_path, cfg) as s:
        assert not s.recovery.clean_shutdown and not s.recovery.cuts_durable_data
        assert s.recovery.end_offset == last.phy_offset
        assert s.recovery.stop_reason != "end"
        assert s.recovery.commitlog_bytes_truncated > 0
        assert s.recovery.consume_queue_bytes_truncated >= 20     # at least the last message's CQ entry
        _check_prefix(s, res, bodies, 39, cfg)
        nxt = s.put(Message(TOPIC, b"after"), queue_id=1)
        assert (nxt.phy_offset, nxt.queue_offset) == (last.phy_offset, 19)
    with MessageStore(tmp_path, cfg) as s:
        assert s.get_by_offset(nxt.phy_offset).body == b"after"
        assert s.max_offset(TOPIC, 1) == 20


def _write_in_two_flushes(path, cfg, k, n):
    """n messages, the first k flushed and stored at least 5 ms before the rest."""
    with MessageStore(path, cfg) as s:
        res = [s.put(Message(TOPIC, b"early-%d" % i), queue_id=i % 2) for i in range(k)]
        s.flush()
        time.sleep(0.005)
        res += [s.put(Message(TOPIC, b"late-%d" % i), queue_id=i % 2) for i in range(k, n)]
    return res, [b"early-%d" % i for i in range(k)] + [b"late-%d" % i for i in range(k, n)]


def _damage(path, cfg, how, rec):
    if how == "crc":
        _flip(path, rec.phy_offset + BODY_AT, cfg)
    elif how == "torn":
        _patch(path, rec.phy_offset + rec.size // 2, b"\0" * (rec.size - rec.size // 2), cfg)
    else:   # a page of zeros: the record at its start reads as the end of the data
        _patch(path, rec.phy_offset, b"\0" * 4096, cfg)


@pytest.mark.parametrize("how", ["crc", "torn", "zeros"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "abort"])
def test_damage_to_flushed_records_is_cut_only_when_asked(tmp_path, clean, how):
    """A record damaged where recovery would stop, with records after it that were durable:
    everything after a clean shutdown, after a crash those stored up to the checkpoint's
    last flush. A writer open used to cut them all (as RocketMQ does), losing acknowledged
    messages; it now refuses and changes no byte, a read-only open shows the cut, and
    ``repair=True`` (``rmqstore recover --yes``) makes it, and lowers the checkpoint's
    times to the last message kept (verify found them counting the cut ones as flushed)."""
    cfg = _cfg()
    res, bodies = _write_in_two_flushes(tmp_path, cfg, 20, 200)
    k = 10
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        flushed = s.get_by_offset(res[-1].phy_offset).store_timestamp
    _damage(tmp_path, cfg, how, res[k])
    if not clean:   # the crash came after the late records were flushed
        _crash_marker(tmp_path, flushed)
    before = tree_state(tmp_path)
    with pytest.raises(CorruptRecordError, match=f"cut the commitlog at offset {res[k].phy_offset}.*recover --yes"):
        MessageStore(tmp_path, cfg)
    assert tree_state(tmp_path) == before
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        assert s.recovery.cuts_durable_data and s.recovery.end_offset == res[k].phy_offset
    with pytest.raises(CorruptRecordError, match="recover --yes"):
        MessageStore(tmp_path, cfg, rebuild=True)
    assert tree_state(tmp_path) == before
    with MessageStore(tmp_path, cfg, repair=True, rebuild=how == "zeros") as s:
        assert s.recovery.end_offset == res[k].phy_offset and s.recovery.cuts_durable_data
        _check_prefix(s, res, bodies, k, cfg)
    with MessageStore(tmp_path, cfg) as s:   # repaired: a plain open is clean again
        _check_prefix(s, res, bodies, k, cfg)
        assert s.verify().problems == []
        kept = s.get_by_offset(res[k - 1].phy_offset).store_timestamp
    cp = Checkpoint(tmp_path / "checkpoint").load()
    assert max(cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) <= kept


def test_garbage_after_last_record_is_zeroed(tmp_path):
    cfg = _cfg()
    res, bodies = _write(tmp_path, 30, cfg)
    end = res[-1].phy_offset + res[-1].size
    _patch(tmp_path, end, b"\xde\xad\xbe\xef" * 8, cfg)
    _patch(tmp_path, end + 20_000, b"\x7f" * 64, cfg)     # beyond the first page after the end
    _crash_marker(tmp_path)
    with MessageStore(tmp_path, cfg) as s:
        assert s.recovery.end_offset == end
        assert "magic" in s.recovery.stop_reason
        assert s.recovery.commitlog_bytes_truncated > 0
        _check_prefix(s, res, bodies, 30, cfg)


def test_garbage_far_into_a_sparse_segment_is_zeroed(tmp_path):
    """A large segment with little written is mostly holes: recovery reads only the parts
    the file holds data for, and still finds stale bytes far past the disk window."""
    cfg = _cfg(commitlog_file_size=256 << 20, reserve_ahead_bytes=1 << 20)
    res, bodies = _write(tmp_path, 30, cfg)
    end = res[-1].phy_offset + res[-1].size
    _patch(tmp_path, 200 << 20, b"\x7f" * 64, cfg)     # a lone block far past the reserved window
    _crash_marker(tmp_path)
    with MessageStore(tmp_path, cfg) as s:
        assert s.recovery.end_offset == end
        assert s.recovery.commitlog_bytes_truncated > 0
        _check_prefix(s, res, bodies, 30, cfg)
        seg = s.commitlog.segments.segments[0]
        assert all(lo < (200 << 20) for lo, _ in seg.data_ranges(end, seg.size))   # the block is freed


def test_data_ranges_cover_every_written_byte(tmp_path):
    """data_ranges is never short of a byte written; holes (never written) are left out."""
    size, page = 64 << 20, os.sysconf("SC_PAGE_SIZE")
    path = str(tmp_path / "f")
    spots = [0, page * 3 + 5, 5 << 20, (40 << 20) + 17, size - 1]
    with open(path, "wb") as f:     # a sparse file with islands, as another writer may leave one
        f.truncate(size)
        for p in spots:
            f.seek(p)
            f.write(b"\x01")
    seg = MappedSegment(path, 0, size)
    try:
        ranges = seg.data_ranges(0, size)
        assert all(any(lo <= p < hi for lo, hi in ranges) for p in spots)
        if os.stat(path).st_blocks * 512 < size // 4:                   # the file system keeps holes
            assert sum(hi - lo for lo, hi in ranges) < size // 4
        assert seg.data_ranges(size - 1, size) == [(size - 1, size)]
        assert seg.data_ranges(10, 10) == []
    finally:
        seg.close()


def test_a_zeroed_last_segment_of_a_clean_store_is_cut_only_when_asked(tmp_path):
    """Only zeros are left of the messages in the last segment: nothing after the cut to
    see, but the consume queues of a clean shutdown point at them. A writer open used to
    delete the segment and cut the queues; it now refuses, and ``repair`` cuts."""
    cfg = _cfg(commitlog_file_size=4096)
    res, bodies = _write(tmp_path, 120, cfg)
    last = sorted(os.listdir(tmp_path / "commitlog"))[-1]
    first_lost = next(i for i, r in enumerate(res) if r.phy_offset >= int(last))
    with open(tmp_path / "commitlog" / last, "r+b") as f:
        f.write(b"\0" * 4096)
    before = tree_state(tmp_path)
    with pytest.raises(CorruptRecordError, match=f"cut the commitlog at offset {int(last)}.*consume queues hold"):
        MessageStore(tmp_path, cfg)
    assert tree_state(tmp_path) == before
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        assert s.recovery.cuts_durable_data
    with MessageStore(tmp_path, cfg, repair=True) as s:
        assert s.max_phy_offset == int(last)
        assert [s.get_by_offset(r.phy_offset).body for r in res[:first_lost]] == bodies[:first_lost]
        assert sum(s.max_offset(TOPIC, q) for q in (0, 1)) == first_lost
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        assert s.verify().problems == []


def test_bad_crc_after_the_last_flush_is_cut_there(tmp_path):
    """After a crash, a record stored after the checkpoint's last flush is a torn tail:
    recovery cuts there, whatever follows."""
    cfg = _cfg()
    res, bodies = _write_in_two_flushes(tmp_path, cfg, 20, 60)
    k = 25
    _flip(tmp_path, res[k].phy_offset + BODY_AT, cfg)
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        early = s.get_by_offset(res[19].phy_offset).store_timestamp
    _crash_marker(tmp_path, early)
    with MessageStore(tmp_path, cfg) as s:
        rep = s.recovery
        assert rep.stop_reason == f"body CRC mismatch at commitlog offset {res[k].phy_offset}"
        assert not rep.cuts_durable_data
        assert rep.records_verified == k
        assert rep.consume_queue_bytes_truncated >= (60 - k) * 20
        _check_prefix(s, res, bodies, k, cfg)


def test_lost_consume_queue_is_redispatched(tmp_path):
    cfg = _cfg()
    res, bodies = _write(tmp_path, 50, cfg)
    # the CQ of queue 1 lost its last file (crash before it was flushed)
    qdir = tmp_path / "consumequeue" / TOPIC / "1"
    files = sorted(os.listdir(qdir))
    os.unlink(qdir / files[-1])
    _crash_marker(tmp_path)
    with MessageStore(tmp_path, cfg) as s:
        assert s.recovery.commitlog_bytes_redispatched > 0
        _check_prefix(s, res, bodies, 50, cfg)


@pytest.mark.parametrize("damage", ["offset unwritten", "points back", "overlaps"])
def test_a_consume_queue_entry_out_of_commitlog_order_is_cut_and_redispatched(tmp_path, damage):
    """A crash left an entry of a queue's newest file with its size and tags written but
    not its offset (gcc ordered the stores so; seen once in the crash tests), or an entry
    damaged to point back into the log. Recovery took every entry with offset >= 0 and
    size > 0 (as RocketMQ's ConsumeQueue.recover): the entry stayed, pointing at another
    message, and dispatch skipped the message as already there. Entries must follow the
    commitlog: recovery cuts the queue at the first one that does not, and dispatches
    the messages again."""
    cfg = _cfg()
    res, bodies = _write(tmp_path, 60, cfg)
    qdir = tmp_path / "consumequeue" / TOPIC / "0"
    path = qdir / sorted(os.listdir(qdir))[-1]
    mine = res[::2]        # queue 0's messages, in order
    first = int(os.path.basename(path)) // 20
    entries = len(mine) - first     # written in that file
    assert entries >= 4
    k = entries - 1 if damage == "offset unwritten" else entries // 2
    phy = {"offset unwritten": 0, "points back": mine[first + k - 3].phy_offset,
           "overlaps": mine[first + k - 1].phy_offset + 1}[damage]
    with open(path, "r+b") as f:
        f.seek(k * 20)
        f.write(struct.pack(">q", phy))
    _crash_marker(tmp_path, flushed=res[-1].store_timestamp)
    with MessageStore(tmp_path, cfg, read_only=True) as s:   # shows the queue as it is; reads report it
        assert s.max_offset(TOPIC, 0) == len(mine)
        got = s.get_messages(TOPIC, 0, first + k, 1)
        assert [p[0] for p in got.problems] == [first + k]
    with MessageStore(tmp_path, cfg) as s:
        assert s.recovery.consume_queue_bytes_truncated >= (entries - k) * 20
        _check_prefix(s, res, bodies, 60, cfg)
        assert s.verify().ok


def test_records_whose_queue_offsets_run_ahead_are_dispatched_once(tmp_path):
    """Records 5..9 of queue 0 carry queue offsets 15..19 (RocketMQ logs "logic queue
    order maybe wrong" and appends such entries where the queue ends), and queue 1's
    last entry is damaged, so recovery dispatches the segment again. Dispatch took an
    entry as present by its queue offset alone and appended these five a second time,
    out of commitlog order: the next open cut them and dispatched them again, on every
    open. As RocketMQ's putMessagePositionInfo, a message ending at or before the queue's
    last entry's is taken as dispatched."""
    cfg = _cfg(commitlog_file_size=1 << 20)
    with MessageStore(tmp_path, cfg) as s:
        r0 = [s.put(Message(TOPIC, b"q0-%d" % i), queue_id=0) for i in range(10)]
        r1 = [s.put(Message(TOPIC, b"q1-%d" % i), queue_id=1) for i in range(10)]
    for i in range(5, 10):
        _patch(tmp_path, r0[i].phy_offset + 20, struct.pack(">q", 10 + i), cfg)
    qdir = tmp_path / "consumequeue" / TOPIC / "1"
    with open(qdir / sorted(os.listdir(qdir))[-1], "r+b") as f:
        f.seek((len(r1) - 1) % 8 * 20)
        f.write(struct.pack(">q", r1[-3].phy_offset))
    for attempt in range(3):
        with MessageStore(tmp_path, cfg) as s:
            assert (s.recovery.consume_queue_bytes_truncated > 0) == (attempt == 0)
            for q in (0, 1):
                got = [bytes(s.get_by_offset(int(e["phy_offset"])).body) for e in s.consume_queue_entries(TOPIC, q)]
                assert got == [b"q%d-%d" % (q, i) for i in range(10)]


def test_a_consume_queue_entry_running_past_the_log_is_cut(tmp_path):
    """A clean store whose queue's last entry has a size running past the commitlog's
    end (damage): recovery kept it, and no message of that queue could be dispatched
    again (each ends before it: taken as dispatched). An entry whose message would end
    past the log is cut, and its message dispatched again."""
    cfg = _cfg()
    res, bodies = _write(tmp_path, 60, cfg)
    qdir = tmp_path / "consumequeue" / TOPIC / "0"
    path = qdir / sorted(os.listdir(qdir))[-1]
    last = (len(res[::2]) - 1) % 8
    with open(path, "r+b") as f:
        f.seek(last * 20 + 8)
        f.write(struct.pack(">i", 1 << 30))
    with MessageStore(tmp_path, cfg) as s:
        assert s.recovery.commitlog_bytes_redispatched > 0
        _check_prefix(s, res, bodies, 60, cfg)
        r = s.put(Message(TOPIC, b"after"), queue_id=0)
        s.wait_dispatched()
        assert s.get_messages(TOPIC, 0, r.queue_offset, 1).messages[0].body == b"after"


def test_segment_boundary_recovery(tmp_path):
    """Torn first record of a newly rolled segment: the end is that segment's start."""
    cfg = _cfg(commitlog_file_size=4096)
    res, bodies = _write(tmp_path, 120, cfg)
    first_in_seg = next(i for i, r in enumerate(res) if i and r.phy_offset // 4096 != res[i - 1].phy_offset // 4096)
    # cut every message from there: zero its segment from the first record on
    start = res[first_in_seg].phy_offset
    assert start % 4096 == 0
    _patch(tmp_path, start, b"\0" * 8 + b"\x55" * 40, cfg)
    _crash_marker(tmp_path)
    with MessageStore(tmp_path, cfg) as s:
        assert s.recovery.end_offset == start
        assert s.max_phy_offset == start
        for r, b in zip(res[:first_in_seg], bodies, strict=False):
            assert s.get_by_offset(r.phy_offset).body == b
        assert sum(s.max_offset(TOPIC, q) for q in (0, 1)) == first_in_seg
        nxt = s.put(Message(TOPIC, b"x"), queue_id=0)
        assert nxt.phy_offset == start


@pytest.mark.parametrize("damage", ["empty", "garbage", "ones"])
def test_damaged_consume_queue_of_a_clean_store_is_redispatched(tmp_path, damage):
    """The newest file of a consume queue damaged after a clean shutdown (emptied, its
    head overwritten, all 0xFF): a writer's recovery cuts it at the damage and dispatches those messages
    again. It used to dispatch only from the furthest queue's end, as after a clean
    shutdown nothing is behind: that queue's messages stayed unreachable, verify failed
    on every open."""
    cfg = _cfg()
    res, bodies = _write(tmp_path, 60, cfg)
    qdir = tmp_path / "consumequeue" / TOPIC / "0"   # not the queue of the last message
    path = qdir / sorted(os.listdir(qdir))[-1]   # recovery checks the newest files, as RocketMQ's does
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if damage == "empty":
            f.truncate(0)
        else:
            f.write(os.urandom(64) if damage == "garbage" else b"\xff" * size)
    with MessageStore(tmp_path, cfg) as s:
        assert s.clean_shutdown and s.recovery.commitlog_bytes_redispatched > 0
        _check_prefix(s, res, bodies, 60, cfg)
        assert s.verify().ok


@pytest.mark.parametrize("where", ["commitlog", "consumequeue"])
@pytest.mark.parametrize("first", [True, False], ids=["first", "later"])
def test_a_segment_of_the_wrong_size_is_the_one_named(tmp_path, where, first):
    """One segment cut short, the first or a later one: the error names that file. The
    size used to be taken from the first file alone, so a short first file made every
    healthy one "the wrong size" (and the message named a file that was fine)."""
    from rmqstore import CorruptStoreError
    cfg = _cfg(commitlog_file_size=4096)
    _write(tmp_path, 200, cfg)
    d = tmp_path / where if where == "commitlog" else tmp_path / "consumequeue" / TOPIC / "0"
    files = sorted(os.listdir(d))
    assert len(files) >= 3
    bad = d / files[0 if first else 1]
    os.truncate(bad, os.path.getsize(bad) // 2)
    for read_only in (True, False):
        with pytest.raises(CorruptStoreError, match=str(bad)):
            MessageStore(tmp_path, cfg, read_only=read_only)


@pytest.mark.parametrize("length", [0, 10, 23])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "abort"])
def test_a_checkpoint_cut_short_reads_as_zeros(tmp_path, length, clean):
    """A checkpoint too short to hold its three times reads as zeros, as out-of-range
    times do (and as RocketMQ, mapping the page, reads it): recovery checks from the first
    segment and keeps every message; verify names the page until a writer rewrites it.
    The store used to refuse to open (CorruptStoreError) on the one file that is a hint."""
    cfg = _cfg()
    res, bodies = _write(tmp_path, 40, cfg)
    os.truncate(tmp_path / "checkpoint", length)
    if not clean:
        _crash_marker(tmp_path)
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        assert [p.path for p in s.verify().problems] == [str(tmp_path / "checkpoint")]
    with MessageStore(tmp_path, cfg) as s:
        _check_prefix(s, res, bodies, 40, cfg)
        s.flush()                            # the writer's own handle: the page is rewritten
        assert s.verify().ok
    with MessageStore(tmp_path, cfg, read_only=True) as s:
        assert s.verify().ok
    assert os.path.getsize(tmp_path / "checkpoint") == 4096


def test_zeros_inside_an_earlier_segment_stop_dispatch_with_an_error(tmp_path):
    """The first of four segments zero-filled after a clean shutdown (recovery checks the
    last three): dispatch from there finds the data ending before the written end. It
    used to wait there for ever, so rebuild() returned as if done with the queues empty and
    verify() or wait_dispatched() never returned; it is now the dispatcher's
    CorruptRecordError, like a bad record, naming the offset."""
    cfg = _cfg(commitlog_file_size=4096)
    res, _ = _write(tmp_path, 120, cfg)
    assert res[-1].phy_offset >= 3 * 4096
    with open(_segment_file(tmp_path, 0, cfg)[0], "r+b") as f:
        f.write(b"\0" * 4096)
    with MessageStore(tmp_path, cfg) as s:
        assert s.clean_shutdown and s.max_phy_offset == res[-1].phy_offset + res[-1].size
        with pytest.raises(CorruptRecordError, match="commitlog offset 0: data ends"):
            s.rebuild()
        with pytest.raises(CorruptRecordError, match="commitlog offset 0"):
            s.wait_dispatched(timeout=5)
