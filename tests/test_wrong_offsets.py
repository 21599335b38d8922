"""A commitlog offset a caller gives that is not where a record starts (inside a record,
or on a copy of a record inside a body) is NotRecordStartError: a wrong offset, not a
corrupt store (it used to be CorruptRecordError, "bad magic code"). Every read taking
such an offset says so: get_by_offset, get_by_msg_id, scan's start, and the batch
readers' aligned start, advance and end_offset. A damaged record that names its own
offset stays CorruptRecordError."""
import os

import pytest

from rmqstore import (
    CorruptRecordError,
    Message,
    MessageNotFoundError,
    MessageStore,
    NotRecordStartError,
    StoreConfig,
    batch,
)
from rmqstore._record import pack_host

from conftest import SMALL_INDEX

CFG = StoreConfig(commitlog_file_size=1 << 14, warm_mapped_file=False, **SMALL_INDEX)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Records, one of whose bodies holds an exact copy of another record (a valid record
    that says it is elsewhere)."""
    root = tmp_path_factory.mktemp("wrong") / "s"
    with MessageStore(root, CFG) as s:
        rs = [s.put(Message("T", b"body-%d" % i * (i + 1), keys=[f"k{i}"]), queue_id=0) for i in range(5)]
        s.flush()
        copy = bytes(s.commitlog.read(rs[1].phy_offset, rs[1].size))
        rs.append(s.put(Message("T", b"head" + copy + b"tail"), queue_id=0))
    return root, rs


def test_every_offset_inside_a_record_is_a_wrong_offset(store):
    root, rs = store
    starts = {r.phy_offset for r in rs}
    end = rs[-1].phy_offset + rs[-1].size
    host = pack_host(CFG.store_host).hex().upper()   # a msgId: host and port, then the offset
    seg, base, _ = batch.segment_files(root)[0]
    with open(seg, "rb") as f:
        data = f.read()
    with MessageStore(root, CFG, read_only=True) as s:
        for off in range(end):
            if off in starts:
                assert s.get_by_offset(off).phy_offset == off
                continue
            with pytest.raises(NotRecordStartError) as e:
                s.get_by_offset(off)
            assert e.value.offset == off and f"offset {off}" in str(e.value)
            with pytest.raises(NotRecordStartError):
                s.get_by_msg_id(f"{host}{off:016X}")
            with pytest.raises(NotRecordStartError):
                s.scan(off)                       # at the call, not at the first next()
            if data[off:off + 36] == bytes(36):
                continue   # the batch readers do not know where data ends: zeros read as its end
            with pytest.raises(NotRecordStartError):
                batch.iter_columns(seg, base, off, aligned=True)
            with pytest.raises(NotRecordStartError):
                batch.advance(root, off, 4096)
            with pytest.raises(NotRecordStartError):
                batch.end_offset(root, off)
        assert [m.phy_offset for m in s.scan(rs[2].phy_offset)] == [r.phy_offset for r in rs[2:]]
        with pytest.raises(MessageNotFoundError) as e:   # past the data: not found, not a wrong offset
            s.get_by_offset(end)
        assert not isinstance(e.value, NotRecordStartError)
    assert batch.advance(root, rs[2].phy_offset, 1) == rs[3].phy_offset
    assert batch.end_offset(root, rs[2].phy_offset) == end


def test_a_wrong_offset_is_both_not_found_and_an_invalid_argument():
    from rmqstore import InvalidArgumentError
    assert issubclass(NotRecordStartError, MessageNotFoundError)
    assert issubclass(NotRecordStartError, InvalidArgumentError)
    assert not issubclass(NotRecordStartError, CorruptRecordError)


def test_a_damaged_record_at_its_own_offset_is_still_corrupt(tmp_path):
    """The wrong-offset answer is for bytes that do not name the offset: a record whose
    magic code is damaged (here under an open store, whose recovery would otherwise cut
    the log there) but whose PHYSICALOFFSET names its place is CorruptRecordError."""
    with MessageStore(tmp_path / "s", CFG) as s:
        rs = [s.put(Message("T", b"b%d" % i), queue_id=0) for i in range(3)]
        s.flush()
        with open(os.path.join(tmp_path, "s", "commitlog", f"{0:020d}"), "r+b") as f:
            f.seek(rs[1].phy_offset + 4)
            f.write(b"\0\0\0\0")
        with pytest.raises(CorruptRecordError) as e:
            s.get_by_offset(rs[1].phy_offset)
        assert not isinstance(e.value, NotRecordStartError)
        assert s.get_by_offset(rs[0].phy_offset).body == b"b0"


def test_get_messages_names_a_cq_entry_inside_a_record(tmp_path, caplog):
    """A consume-queue entry pointing inside a record is listed in problems, and logged
    as such; the other entries are read."""
    root = tmp_path / "s"
    with MessageStore(root, CFG) as s:
        rs = [s.put(Message("T", b"b%d" % i), queue_id=0) for i in range(3)]
        s.wait_dispatched()
    cq = os.path.join(root, "consumequeue", "T", "0", f"{0:020d}")
    with open(cq, "r+b") as f:
        f.seek(20)
        f.write((rs[1].phy_offset + 7).to_bytes(8, "big"))
    with MessageStore(root, CFG, read_only=True) as s:
        res = s.get_messages("T", 0, 0, 8)
        assert [m.phy_offset for m in res.messages] == [rs[0].phy_offset, rs[2].phy_offset]
        assert [p[1] for p in res.problems] == [rs[1].phy_offset + 7]
    assert f"no record starts at commitlog offset {rs[1].phy_offset + 7}" in caplog.text


def test_a_record_being_written_at_the_end_is_the_end_of_data(tmp_path):
    """A reader that does not know where data ends (the batch readers; the Spark stream
    asking end_offset from its last end) can meet the record another process is writing,
    its header there but its PHYSICALOFFSET not yet: that is the end of data, not a wrong
    offset."""
    root = tmp_path / "s"
    with MessageStore(root, CFG) as s:
        rs = [s.put(Message("T", b"b%d" % i), queue_id=0) for i in range(3)]
        s.flush()
        end = rs[-1].phy_offset + rs[-1].size
        partial = bytearray(s.commitlog.read(rs[-1].phy_offset, rs[-1].size))
    partial[28:36] = bytes(8)   # PHYSICALOFFSET not written yet
    seg, base, _ = batch.segment_files(root)[0]
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(partial)
    assert batch.end_offset(root, end) == end
    assert batch.end_offset(root, rs[0].phy_offset) == end
