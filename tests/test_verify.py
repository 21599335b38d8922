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
        rep = s.verify(max_problems=5)
    assert len(rep.problems) == 5 and rep.problems_omitted == 15
    assert [p.offset for p in rep.problems] == [r.phy_offset for r in res[:5]]


def _numpy_index_problems(f, slots, end):
    """The index-file structure checks as verify made them with numpy before they moved
    into a kernel: (file position, message) of each problem, the oracle for the kernel's."""
    import numpy as np
    data = f.read_bytes()
    begin_ts, end_ts, begin_phy, end_phy, used, count = struct.unpack_from(">qqqqii", data)
    out = []
    ent_at = 40 + 4 * slots
    slot = np.frombuffer(data, ">i4", slots, 40).astype(np.int64)
    ents = np.frombuffer(data, [("hash", ">i4"), ("phy", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")], count, ent_at)
    bad = np.flatnonzero((slot < 0) | (slot >= count))
    out += [(40 + 4 * s, f"slot {s} holds {slot[s]}, outside 0..{count - 1}") for s in bad[:3].tolist()]
    if used != np.count_nonzero(slot) and not len(bad):
        out.append((32, f"hashSlotCount {used}, {np.count_nonzero(slot)} slots used"))
    n = np.arange(count)
    prev, hashes = ents["prev"].astype(np.int64), ents["hash"].astype(np.int64)
    broken = (prev[1:] < 0) | (prev[1:] >= n[1:]) | (hashes[1:] < 0) | (ents["time_diff"][1:] < 0)
    out += [(ent_at + 20 * i, f"entry {i} (hash {hashes[i]}, prevIndex {prev[i]}, timeDiff {ents['time_diff'][i]}) "
             "is not a valid backward link") for i in (np.flatnonzero(broken)[:3] + 1).tolist()]
    if not len(bad) and not broken.any():
        heads = np.flatnonzero(slot)
        wrong = heads[hashes[slot[heads]] % slots != heads]
        out += [(40 + 4 * s, f"slot {s} points at entry {slot[s]}, whose hash {hashes[slot[s]]} belongs to slot "
                 f"{hashes[slot[s]] % slots}") for s in wrong[:3].tolist()]
        links = np.flatnonzero(prev > 0)
        astray = links[hashes[prev[links]] % slots != hashes[links] % slots]
        out += [(ent_at + 20 * i, f"entry {i} links to entry {prev[i]} of another slot") for i in astray[:3].tolist()]
        refs = np.bincount(np.concatenate([slot[heads], prev[links]]), minlength=count)
        out += [(ent_at + 20 * i, f"entry {i} is reached {refs[i]} times from slots and chains, not once")
                for i in (np.flatnonzero(refs[1:] != 1) + 1)[:3].tolist()]
    phy = ents["phy"][1:].astype(np.int64)
    back = np.flatnonzero(np.diff(phy) < 0)
    if len(back):
        i = int(back[0]) + 2
        out.append((ent_at + 20 * i, f"entry {i} points at commitlog offset {phy[i - 1]}, before entry {i - 1}'s "
                    f"{phy[i - 2]}"))
    return out


def _index_damage(f, case):
    data = f.read_bytes()
    ent_at = 40 + 4 * SLOTS
    ent = [struct.unpack_from(">iqii", data, ent_at + 20 * i) for i in range(struct.unpack_from(">i", data, 36)[0])]
    slot = struct.unpack_from(f">{SLOTS}i", data, 40)
    if case == "wrong head":       # a slot names an entry of another slot: it is then reached twice
        s = next(s for s in range(SLOTS) if slot[s] and slot[(s + 1) % SLOTS])
        _patch(f, struct.pack(">i", slot[(s + 1) % SLOTS]), 40 + 4 * s)
    elif case == "astray link":    # a link into another slot's chain
        i = next(i for i in range(2, len(ent)) if ent[i][3] and ent[i - 1][0] % SLOTS != ent[i][0] % SLOTS)
        _patch(f, struct.pack(">i", i - 1), ent_at + 20 * i + 16)
    elif case == "offsets back":
        _patch(f, struct.pack(">q", ent[20][1] - 1000), ent_at + 20 * 30 + 4)
    elif case == "slot count":
        _patch(f, struct.pack(">i", 3), 32)
    elif case == "slots out of range":
        for s in (3, 9, 11, 40):
            _patch(f, struct.pack(">i", -2 if s % 2 else 10**6), 40 + 4 * s)
    elif case == "broken links":
        for i in (4, 6, 8, 12):
            _patch(f, struct.pack(">i", i + 1), ent_at + 20 * i + 16)


@pytest.mark.parametrize("case", ["clean", "wrong head", "astray link", "offsets back", "slot count",
                                  "slots out of range", "broken links"])
def test_index_file_checks_match_the_numpy_oracle(own, case):
    """Every index problem verify reports, on a clean file and damaged ones, is the one the
    numpy checks (the oracle above) find at the same position with the same words."""
    path, _ = own
    f = _index_file(path)
    _index_damage(f, case)
    want = _numpy_index_problems(f, SLOTS, 1 << 62)
    got = [(p.offset, p.message) for p in _verify(path).problems if p.kind == "index" and p.path == str(f)]
    got = [(off, msg.split(": ", 1)[1]) for off, msg in got if "should be hash" not in msg and "match no" not in msg]
    assert got == want
    assert bool(want) == (case != "clean")


@pytest.mark.parametrize("field, value, words", [
    ("size", 7, "record size is"), ("tags", 12345, "record tags code is"),
    ("phy", 1 << 40, "has no consume-queue entry"), ("size", 0x7FFFFFFF, "has no consume-queue entry")])
def test_consume_queue_entry_fields(own, field, value, words):
    """Each field of an entry is checked against the record it names: a wrong size or tags
    code; an entry past the commitlog end or a hole is not followed, so its message has
    none."""
    path, res = own
    f = path / "consumequeue" / "T1" / "0" / f"{0:020d}"
    at = {"phy": (0, ">q"), "size": (8, ">i"), "tags": (12, ">q")}[field]
    _patch(f, struct.pack(at[1], value), 4 * 20 + at[0])
    p = _only_problem(_verify(path), "consume_queue")
    assert words in p.message and p.offset == 4


def test_record_whose_topic_cannot_name_a_directory(tmp_path):
    """Topic bytes are not under the body CRC: a record whose topic became ``../a`` gets no
    consume-queue entry from dispatch, and verify names it (and the entry that points at it)."""
    path = tmp_path / "s"
    with MessageStore(path, _cfg()) as s:
        s.put(Message("T0aa", b"first"), queue_id=0)
        hit = s.put(Message("T0aa", b"second"), queue_id=0)
    seg = path / "commitlog" / f"{0:020d}"
    data = seg.read_bytes()
    at = data.index(b"T0aa", hit.phy_offset)
    _patch(seg, b"../a", at)
    rep = _verify(path)
    off = hit.phy_offset
    assert rep.problems[0].kind == "commitlog" and rep.problems[0].offset == off
    assert rep.problems[0].message == \
        f"record at commitlog offset {off}: topic '../a' cannot name a consume-queue directory"
    assert [p.kind for p in rep.problems[1:]] == ["consume_queue"]
    assert rep.problems[1].offset == 1 and f"T0aa/0 queue offset 1 (commitlog offset {off}," in rep.problems[1].message
    assert "topic '../a' cannot name a consume-queue directory" in rep.problems[1].message
    assert "PREPARED" not in rep.problems[1].message
