"""store.verify(): clean stores (ours and RocketMQ's) verify ok; damage made here at known
offsets (a body byte, a consume-queue entry, an index slot or link, the checkpoint) is
reported as exactly one problem at that offset."""
import os
import struct

import pytest

from rmqstore import Message, MessageStore, StoreConfig

from conftest import CLEAN_498, CRASHED_498, V2_533, tree_state

BODY_AT = 88          # body offset in a v1 record with IPv4 hosts
SLOTS = 64


def _cfg():
    return StoreConfig(commitlog_file_size=8192, consume_queue_entries=10, index_slots=SLOTS, index_entries=200,
                       flush_interval_ms=10, flush_cq_interval_ms=10, warm_mapped_file=False)


@pytest.fixture
def own(tmp_path):
    """A closed store of ours: 3 topics x 2 queues, keys, tags, a delayed and PREPARED /
    ROLLBACK messages, several commitlog, CQ and index files. Returns (path, PutResults)."""
    path = tmp_path / "own"
    res = []
    with MessageStore(path, _cfg()) as s:
        for i in range(150):
            m = Message(f"T{i % 3}", b"body-%d-" % i * (i % 9 + 1), tags=f"tag{i % 4}", keys=[f"k{i}", f"g{i % 5}"])
            res.append(s.put(m, queue_id=i % 2))
        s.put(Message("T0", b"later", delay_level=3))
        s.put(Message("T1", b"prepared", sys_flag=0x4))
        s.put(Message("T1", b"rollback", sys_flag=0xC))
    return path, res


def _verify(path):
    with MessageStore(path, _cfg(), read_only=True) as s:
        return s.verify()


def _patch(path, data, at):
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _only_problem(rep, kind):
    assert not rep.ok
    assert [p.kind for p in rep.problems] == [kind], rep.problems
    return rep.problems[0]


def test_own_store_verifies_ok_and_changes_nothing(own):
    path, res = own
    before = tree_state(path)
    rep = _verify(path)
    assert rep.ok, rep.problems
    assert rep.records == 153 and rep.segments > 2
    assert rep.consume_queue_entries == 151           # PREPARED and ROLLBACK get no entry
    assert rep.consume_queues == 7                    # 3 topics x 2 queues + SCHEDULE_TOPIC_XXXX/2
    assert rep.index_entries == 2 * 150 and rep.index_files >= 2
    assert rep.bytes == sum(os.path.getsize(path / "commitlog" / f) for f in os.listdir(path / "commitlog"))
    assert tree_state(path) == before


def test_writer_verifies_while_open(tmp_path):
    with MessageStore(tmp_path, _cfg()) as s:
        for i in range(40):
            s.put(Message("W", b"x" * i, keys=f"k{i}"), queue_id=i % 3)
        seen = []
        rep = s.verify(progress=seen.append)
        assert rep.ok and rep.records == 40 and rep.undispatched == 0, rep.problems
        assert sum(seen) == len(s.commitlog.segments.segments) * 8192


@pytest.mark.parametrize("fixture", [CLEAN_498, V2_533], ids=["498-clean", "533-v2"])
def test_rocketmq_clean_stores_verify_ok(fixture):
    if not (fixture / "store").is_dir():
        pytest.skip("fixture not available")
    with MessageStore(fixture / "store", read_only=True) as s:
        rep = s.verify()
    assert rep.ok, rep.problems[:5]
    assert rep.records == {CLEAN_498: 5000, V2_533: 3034}[fixture]
    assert rep.undispatched == 0


def test_crashed_fixture_reports_lag_not_problems():
    if not (CRASHED_498 / "store").is_dir():
        pytest.skip("fixture not available")
    with MessageStore(CRASHED_498 / "store", read_only=True) as s:
        rep = s.verify()
    assert not rep.clean_shutdown and rep.ok and rep.problems == []
    assert rep.records == 5282 and rep.undispatched > 0   # recovery re-dispatches them


@pytest.mark.parametrize("which", [3, 148], ids=["first-segment", "last-segments"])
def test_flipped_body_byte_is_a_crc_problem_at_its_offset(own, which):
    path, res = own
    r = res[which]
    seg = path / "commitlog" / f"{r.phy_offset - r.phy_offset % 8192:020d}"
    _patch(seg, b"\xff", r.phy_offset % 8192 + BODY_AT + 2)
    p = _only_problem(_verify(path), "commitlog")
    assert p.offset == r.phy_offset and "CRC" in p.message and str(r.phy_offset) in p.message
    assert p.path == str(seg)


def test_broken_record_structure_ends_that_segment(own):
    path, res = own
    r = res[5]
    seg = path / "commitlog" / f"{r.phy_offset - r.phy_offset % 8192:020d}"
    _patch(seg, b"\x12\x34\x56\x78", r.phy_offset % 8192 + 4)           # magic
    rep = _verify(path)
    assert rep.problems[0].kind == "commitlog" and rep.problems[0].offset == r.phy_offset
    assert "magic" in rep.problems[0].message
    # the records after it cannot be read (a writer's recovery would cut them): their CQ
    # entries point nowhere, and the checkpoint counted some of them as flushed
    assert {p.kind for p in rep.problems[1:]} <= {"consume_queue", "index", "checkpoint"}


def test_consume_queue_entry_pointing_elsewhere(own):
    path, res = own
    q0 = [r for r in res if r.topic == "T1" and r.queue_id == 0]
    other = q0[3]                       # queue offset 12 (entry 2 of the second file) -> message 3
    f = path / "consumequeue" / "T1" / "0" / f"{10 * 20:020d}"
    _patch(f, struct.pack(">q", other.phy_offset), 2 * 20)
    p = _only_problem(_verify(path), "consume_queue")
    assert p.offset == 12 and str(other.phy_offset) in p.message and "queue offset is 3" in p.message
    assert p.path == str(path / "consumequeue" / "T1" / "0")


def test_consume_queue_entry_into_the_middle_of_a_record(own):
    path, res = own
    r = [r for r in res if r.topic == "T2" and r.queue_id == 1][0]
    _patch(path / "consumequeue" / "T2" / "1" / f"{0:020d}", struct.pack(">q", r.phy_offset + 7), 0)
    p = _only_problem(_verify(path), "consume_queue")
    assert p.offset == 0 and "no record starts" in p.message


def _index_file(path):
    return sorted((path / "index").iterdir())[0]


def test_index_slot_garbage(own):
    path, _ = own
    f = _index_file(path)
    _patch(f, struct.pack(">i", 0x7FFF0000), 40 + 4 * 17)
    p = _only_problem(_verify(path), "index")
    assert p.offset == 40 + 4 * 17 and "slot 17" in p.message and p.path == str(f)


def test_index_link_forward_is_reported(own):
    path, _ = own
    f = _index_file(path)
    entry = 40 + 4 * SLOTS + 20 * 5
    _patch(f, struct.pack(">i", 9), entry + 16)       # prevIndex of entry 5 -> 9 (a loop)
    rep = _verify(path)
    assert rep.problems[0].kind == "index" and rep.problems[0].offset == entry
    assert "entry 5" in rep.problems[0].message


def test_index_entry_for_the_wrong_message(own):
    path, res = own
    f = _index_file(path)
    entry = 40 + 4 * SLOTS + 20 * 7
    _patch(f, struct.pack(">q", res[10].phy_offset), entry + 4)     # entry 7 is res[3]'s first key
    rep = _verify(path)
    assert any(p.kind == "index" and p.offset == res[10].phy_offset and "#6" in p.message for p in rep.problems)


def test_checkpoint_in_the_future(own):
    path, _ = own
    _patch(path / "checkpoint", struct.pack(">q", (1 << 62)), 8)
    p = _only_problem(_verify(path), "checkpoint")
    assert p.offset == 8 and "logicsMsgTimestamp" in p.message and "future" in p.message


def test_missing_blank_record_and_stale_bytes(own):
    path, res = own
    segs = sorted((path / "commitlog").iterdir())
    with open(segs[0], "r+b") as f:                    # zero the BLANK record ending segment 0
        data = f.read()
        blank = data.rindex(struct.pack(">i", -875286124)) - 4
        f.seek(blank)
        f.write(b"\0" * 8)
    _patch(segs[-1], b"\x01", 8192 - 1)              # junk after the end of data
    kinds = [(p.kind, p.offset) for p in _verify(path).problems]
    assert ("commitlog", blank) in kinds
    assert ("commitlog", int(segs[-1].name) + 8191) in kinds


def test_problems_are_capped(own):
    path, res = own
    for r in res[:20]:
        seg = path / "commitlog" / f"{r.phy_offset - r.phy_offset % 8192:020d}"
        _patch(seg, b"\xff", r.phy_offset % 8192 + BODY_AT)
    with MessageStore(path, _cfg(), read_only=True) as s:
        from rmqstore.maintenance.verify import verify_store
        rep = verify_store(s, max_problems=5)
    assert len(rep.problems) == 5 and rep.problems_omitted == 15
    assert [p.offset for p in rep.problems] == [r.phy_offset for r in res[:5]]
