"""Values read from disk are checked before use: a record's topic (not under the body CRC)
becomes a path only if it is one safe component, and a record's own PHYSICALOFFSET field
must say where it lies. Records are damaged by byte patches at known offsets (DESIGN.md's
v1 layout with IPv4 hosts: PHYSICALOFFSET at 28, BODYLEN at 84, body at 88)."""
import os
import shutil
import struct

import pytest

from rmqstore import CorruptRecordError, Message, MessageNotFoundError, MessageStore, StoreConfig

from conftest import SMALL_INDEX

TOPIC = "TopicXYZW1"          # 10 bytes, as long as "../../../x"
CFG = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, warm_mapped_file=False, **SMALL_INDEX)
BODY_AT, PHY_AT, QOFF_AT = 88, 28, 20


def _write(root, n=6, topic=TOPIC):
    with MessageStore(root, CFG) as s:
        rs = [s.put(Message(topic, b"body-%d" % i, keys=[f"k{i}"]), queue_id=0) for i in range(n)]
    return rs


def _patch(root, offset, data):
    with open(os.path.join(root, "commitlog", f"{0:020d}"), "r+b") as f:
        f.seek(offset)
        f.write(data)


def _tree(path):
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, ds, ns in os.walk(path) for n in ds + ns)


@pytest.mark.parametrize("topic, evil", [(TOPIC, "../../../x"), (TOPIC, "a/../../.."), (TOPIC, "..\x00xxxxxxx"),
                                         (TOPIC, "\x00" * 10), ("AB", ".."), ("A", ".")])
@pytest.mark.parametrize("read_only", [False, True])
def test_topic_from_disk_never_escapes(tmp_path, topic, evil, read_only):
    root = tmp_path / "box" / "s"
    rs = _write(root, topic=topic)
    assert len(evil) == len(topic)
    _patch(root, rs[2].phy_offset + BODY_AT + len(b"body-2") + 1, evil.encode())
    if not read_only:
        shutil.rmtree(root / "consumequeue")            # so the open dispatches the commitlog again
    outside = _tree(tmp_path)
    with MessageStore(root, CFG, read_only=read_only) as s:
        s.wait_dispatched()
        if not read_only:   # the others are dispatched as ever; the bad one gets no entry, creates nothing
            got, off = [], 0   # its queue offset stays blank (offsets never shift): a consumer reads past it
            while (r := s.get_messages(topic, 0, off, 32)).messages or r.next_offset > off:
                got += [(m.queue_offset, bytes(m.body)) for m in r.messages]
                off = r.next_offset
            assert got == [(i, b"body-%d" % i) for i in (0, 1, 3, 4, 5)]
        rep = s.verify()
        assert not rep.ok
        assert any(p.offset == rs[2].phy_offset and "topic" in p.message for p in rep.problems)
        if not read_only:
            later = s.put(Message(topic, b"after"), queue_id=0)
            s.wait_dispatched()
            assert later.queue_offset == 6
            assert s.get_messages(topic, 0, 6, 1).messages[0].phy_offset == later.phy_offset
    now = _tree(tmp_path)
    assert [p for p in now if not p.startswith(os.path.join("box", "s"))] == \
        [p for p in outside if not p.startswith(os.path.join("box", "s"))]
    assert not any(".." in p.split(os.sep) for p in now)


def test_missing_consumequeue_directory_is_rebuilt(tmp_path):
    root = tmp_path / "s"
    rs = _write(root)
    shutil.rmtree(root / "consumequeue")
    with MessageStore(root, CFG) as s:
        s.wait_dispatched()
        assert [m.phy_offset for m in s.get_messages(TOPIC, 0, 0, 32).messages] == [r.phy_offset for r in rs]
        assert s.verify().ok


def test_wrong_physical_offset_field(tmp_path):
    """A record whose PHYSICALOFFSET field names another offset: verify reports it; reads say
    so (get_by_offset raises, get_messages lists it in problems, scan raises there rather
    than yield a msgId that names another message)."""
    root = tmp_path / "s"
    rs = _write(root)
    bad = rs[3]
    _patch(root, bad.phy_offset + PHY_AT, struct.pack(">q", rs[1].phy_offset))
    with MessageStore(root, CFG, read_only=True) as s:
        rep = s.verify()
        assert not rep.ok
        assert [p.offset for p in rep.problems if "PHYSICALOFFSET" in p.message] == [bad.phy_offset]
        assert rep.records == len(rs)                     # stepped over, the rest checked
        with pytest.raises((CorruptRecordError, MessageNotFoundError)):
            s.get_by_offset(bad.phy_offset)
        res = s.get_messages(TOPIC, 0, 0, 32)
        assert [m.phy_offset for m in res.messages] == [r.phy_offset for r in rs if r is not bad]
        assert [p[1] for p in res.problems] == [bad.phy_offset]
        seen = []
        with pytest.raises(CorruptRecordError) as e:
            for m in s.scan():
                seen.append(m.msg_id)
        assert e.value.offset == bad.phy_offset
        assert seen == [r.msg_id for r in rs[:3]]


@pytest.mark.parametrize("queue_offset", [1 << 62, (1 << 63) - 1])
def test_first_queue_offset_past_int64_starts_the_queue_at_zero(tmp_path, queue_offset):
    """The first record of a queue (consume queues lost, dispatched again) whose QUEUEOFFSET
    field times 20 passes int64: the writer's open was a bare OverflowError from making a
    consume-queue file there. The queue now starts at 0, as a skipping offset is appended
    where the queue is (logged), and the rest of the queue follows."""
    root = tmp_path / "s"
    rs = _write(root)
    _patch(root, rs[0].phy_offset + QOFF_AT, struct.pack(">q", queue_offset))
    shutil.rmtree(root / "consumequeue")
    with MessageStore(root, CFG) as s:
        s.wait_dispatched()
        assert [int(e["phy_offset"]) for e in s.consume_queue_entries(TOPIC, 0)] == [r.phy_offset for r in rs]
