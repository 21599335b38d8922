"""Consume queues and the consumer API: our CQ files read entry by entry by the reference
reader, getMessage statuses and next offsets, tag filtering (hash collisions included),
bad arguments, consumer offsets on disk, offset by time."""
import itertools
import json
import os
import struct
import time

import numpy as np
import pytest

from rmqstore import GetMessageStatus as S
from rmqstore import InvalidArgumentError, Message, MessageStore, StoreConfig, _cq
from rmqstore.errors import OutOfRangeError, StoreError

import reference_codec as ref
from conftest import SMALL_INDEX

PER_FILE = 10


def _cfg(**kw):
    kw.setdefault("commitlog_file_size", 1 << 16)
    kw.setdefault("consume_queue_entries", PER_FILE)
    kw.setdefault("warm_mapped_file", False)
    return StoreConfig(**{**SMALL_INDEX, **kw})


@pytest.fixture
def store(tmp_path):
    s = MessageStore(tmp_path / "s", _cfg())
    yield s
    s.close()


def _fill(store, topic, qid, tags_list):
    rs = [store.put(Message(topic, b"m%d" % i, tags=t, keys=[f"k{i}"]), queue_id=qid) for i, t in enumerate(tags_list)]
    store.wait_dispatched()
    return rs


def test_cq_files_match_reference_reader(tmp_path):
    root = tmp_path / "s"
    tags = [None, "TagA", "标签", "🚀", "TagB"]
    puts = {}
    with MessageStore(root, _cfg()) as store:
        for i in range(57):
            topic = ("TopicA", "%RETRY%g", "主题")[i % 3] if i % 3 != 2 else "T-2"
            qid = i % 2
            r = store.put(Message(topic, b"x" * (i * 7 % 90), tags=tags[i % 5]), queue_id=qid)
            puts.setdefault((topic, qid), []).append((r, tags[i % 5]))
        prep = store.put(Message("TopicA", b"p", sys_flag=0x4), queue_id=0)
        store.wait_dispatched()
    assert prep.queue_offset == 0
    for (topic, qid), rs in puts.items():
        want = [(n, r.phy_offset, r.size, ref.java_hash(t) if t is not None else 0) for n, (r, t) in enumerate(rs)]
        assert [r.queue_offset for r, _ in rs] == list(range(len(rs)))
        assert ref.read_cq_entries(root, topic, qid) == want
        d = root / "consumequeue" / topic / str(qid)
        files = ref.segment_files(d)
        assert [b for b, _ in files] == [i * PER_FILE * 20 for i in range(len(files))]
        assert all(os.path.getsize(p) == PER_FILE * 20 for _, p in files)
        assert len(files) == (len(rs) + PER_FILE - 1) // PER_FILE
    with MessageStore(root, _cfg(), read_only=True) as store:
        for (topic, qid), rs in puts.items():
            e = store.consume_queue_entries(topic, qid)
            assert e["phy_offset"].tolist() == [r.phy_offset for r, _ in rs]
            assert store.max_offset(topic, qid) == len(rs) and store.min_offset(topic, qid) == 0
        assert store.topics() == sorted({t for t, _ in puts})
        assert store.queue_ids("TopicA") == [0, 1]


def test_statuses_and_next_offsets(store):
    _fill(store, "T", 0, ["A"] * 25)
    res = store.get_messages("T", 0, 0, 32)
    # a call never crosses a consume-queue file
    assert (res.status, len(res.messages), res.next_offset, res.min_offset, res.max_offset) == (S.FOUND, 10, 10, 0, 25)
    assert [m.queue_offset for m in res.messages] == list(range(10))
    res = store.get_messages("T", 0, 13, 4)
    assert [m.queue_offset for m in res.messages] == [13, 14, 15, 16] and res.next_offset == 17
    res = store.get_messages("T", 0, 25, 32)
    assert (res.status, res.next_offset, res.messages) == (S.OFFSET_OVERFLOW_ONE, 25, [])
    res = store.get_messages("T", 0, 1000, 32)
    assert (res.status, res.next_offset) == (S.OFFSET_OVERFLOW_BADLY, 25)
    res = store.get_messages("T", 0, -5, 32)
    assert (res.status, res.next_offset) == (S.OFFSET_TOO_SMALL, 0)
    res = store.get_messages("T", 1, 0, 32)            # a queue never written
    assert (res.status, res.next_offset, res.max_offset) == (S.NO_MESSAGE_IN_QUEUE, 0, 0)
    res = store.get_messages("Nope", 0, 7, 32)
    assert (res.status, res.next_offset) == (S.NO_MESSAGE_IN_QUEUE, 0)
    for topic in ("../T", "a/b"):
        assert store.get_messages(topic, 0, 0, 32).status == S.NO_MATCHED_LOGIC_QUEUE
    with pytest.raises(InvalidArgumentError, match="queue_id"):   # as a broker's pull refuses an illegal queue id
        store.get_messages("T", -1, 0, 32)
    res = store.get_messages("T", 0, 0, 32, tags="Other")
    assert (res.status, res.messages, res.next_offset) == (S.NO_MATCHED_MESSAGE, [], 10)


def test_transfer_count_limit(tmp_path):
    with MessageStore(tmp_path / "s", _cfg(consume_queue_entries=100, max_transfer_count_on_message_in_memory=7)) as s:
        _fill(s, "T", 0, ["A"] * 20)
        res = s.get_messages("T", 0, 0, 32)
        assert len(res.messages) == 7 and res.next_offset == 7


def test_offset_too_small_after_commitlog_head_removed(tmp_path):
    """Operator case: the oldest commitlog file is gone; entries pointing into it are below
    the queue's min offset (RocketMQ correctMinOffset)."""
    root = tmp_path / "s"
    cfg = _cfg(commitlog_file_size=4096, consume_queue_entries=100)
    with MessageStore(root, cfg) as s:
        rs = _fill(s, "T", 0, ["A"] * 40)
    first_kept = next(r for r in rs if r.phy_offset >= 4096)
    os.unlink(root / "commitlog" / ("%020d" % 0))
    with MessageStore(root, cfg) as s:
        lo = s.min_offset("T", 0)
        assert lo == first_kept.queue_offset > 0
        res = s.get_messages("T", 0, 0, 32)
        assert (res.status, res.next_offset, res.min_offset) == (S.OFFSET_TOO_SMALL, lo, lo)
        res = s.get_messages("T", 0, lo, 1)
        assert res.status == S.FOUND and res.messages[0].phy_offset == first_kept.phy_offset


def test_tag_filter_with_forced_hash_collision(store):
    from rmqstore._record import java_hash
    assert java_hash("Aa") == java_hash("BB")           # the collision is real
    tags = ["Aa", "BB", None, "Aa", "BB", "BB", "TagC", "Aa"]
    _fill(store, "C", 0, tags)
    e = store.consume_queue_entries("C", 0)
    assert e["tags_code"].tolist()[:2] == [2112, 2112]
    res = store.get_messages("C", 0, 0, 32, tags="Aa")
    assert [m.queue_offset for m in res.messages] == [i for i, t in enumerate(tags) if t == "Aa"]
    assert all(m.tags == "Aa" for m in res.messages)
    assert res.next_offset == len(tags)
    res = store.get_messages("C", 0, 0, 32, tags="BB || TagC")
    assert [m.tags for m in res.messages] == ["BB", "BB", "BB", "TagC"]
    res = store.get_messages("C", 0, 0, 32, tags=" * ")
    assert len(res.messages) == len(tags)
    res = store.get_messages("C", 0, 0, 2, tags="Aa")
    assert [m.queue_offset for m in res.messages] == [0, 3] and res.next_offset == 4


@pytest.mark.parametrize("max_count", [0, -1, 1.5, "3", None])
def test_bad_max_count(store, max_count):
    _fill(store, "T", 0, ["A"])
    with pytest.raises(InvalidArgumentError):
        store.get_messages("T", 0, 0, max_count)


@pytest.mark.parametrize("expr", ["A ||", "|| A", "A || || B", "||", 5, b"A"])
def test_malformed_tag_expressions(store, expr):
    _fill(store, "T", 0, ["A"])
    with pytest.raises(InvalidArgumentError):
        store.get_messages("T", 0, 0, 32, tags=expr)


def test_cq_entry_pointing_into_a_record_is_reported(tmp_path):
    """An entry pointing 7 bytes into its message: after the previous message, so recovery
    keeps it, but the next entry starts before it ends, so recovery cuts the queue there
    and dispatches again, from the start of the segment (dispatching from where the
    damaged entry ends, inside a record, stopped the dispatcher at a bad magic code)."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        rs = _fill(s, "T", 0, ["A"] * 5)
    path = root / "consumequeue" / "T" / "0" / ("%020d" % 0)
    data = bytearray(path.read_bytes())
    struct.pack_into(">q", data, 2 * 20, rs[2].phy_offset + 7)
    path.write_bytes(bytes(data))
    with MessageStore(root, _cfg()) as s:
        res = s.get_messages("T", 0, 0, 32)
        assert [m.queue_offset for m in res.messages] == [0, 1, 3, 4]
        assert [p[0] for p in res.problems] == [2]
        assert res.next_offset == 5
        assert s.recovery.consume_queue_bytes_truncated == (PER_FILE - 3) * 20   # from entry 3 to the file end


def test_consumer_offsets_persisted_in_rocketmq_shape(tmp_path):
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        assert s.committed_offset("g1", "T", 0) == -1
        s.commit_offset("g1", "T", 0, 12)
        s.commit_offset("g1", "T", 3, 4)
        s.commit_offset("g2", "%RETRY%g2", 0, 1)
        s.commit_offset("g1", "T", 0, 13)
        assert s.committed_offset("g1", "T", 0) == 13
    with open(root / "config" / "consumerOffset.json", encoding="utf-8") as f:
        data = json.load(f)
    assert data == {"offsetTable": {"T@g1": {"0": 13, "3": 4}, "%RETRY%g2@g2": {"0": 1}}}
    assert not (root / "config" / "consumerOffset.json.tmp").exists()
    with MessageStore(root, _cfg(), read_only=True) as s:
        assert s.committed_offset("g1", "T", 0) == 13
        assert s.committed_offset("g1", "T", 3) == 4
        assert s.committed_offset("g2", "%RETRY%g2", 0) == 1
        assert s.committed_offset("g2", "T", 0) == -1



def test_commits_the_file_could_not_hold_are_refused(tmp_path):
    """A commit the reader of consumerOffset.json would refuse (queue id or offset out
    of range), or whose topic@group key would be another pair's ('T@a' + 'b' and 'T' +
    'a@b'), is an InvalidArgumentError: the store reopens with the good commits. So is a
    negative offset: -1 was taken and then read back as "none committed" (the group's
    place forgotten). An offset past the queue's end is taken, as a broker takes it."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        s.commit_offset("g", "T", 0, 7)
        for bad in [("g", "T", -1, 5), ("g", "T", 1 << 31, 5), ("g", "T", 0, -2), ("g", "T", 0, -1),
                    ("g", "T", 0, np.int64(-1)), ("a@b", "T", 0, 1), ("b", "T@a", 0, 2), ("", "T", 0, 1),
                    ("g", "", 0, 1)]:
            with pytest.raises(InvalidArgumentError):
                s.commit_offset(*bad)
        for bad in [-1, True, 1.0, "0"]:
            with pytest.raises(InvalidArgumentError):
                s.committed_offset("g", "T", bad)
        s.commit_offset("g", "T", 1, 1 << 40)
    with MessageStore(root, _cfg()) as s:
        assert [s.committed_offset("g", "T", q) for q in (0, 1, 2)] == [7, 1 << 40, -1]
        assert s.committed_offset("b", "T@a", 0) == s.committed_offset("a@b", "T", 0) == -1


def test_commits_naming_no_possible_group_or_topic_are_refused(tmp_path):
    """A group outside RocketMQ's rule (Validators.checkGroup: "g g", "g\n", NUL, more
    than 255 characters) or a topic no store can hold ("a/b", over 255 bytes) was stored
    in consumerOffset.json; now InvalidArgumentError (InvalidTopicError for the topic).
    Without strict_topic_names any group of up to 255 characters is taken, and a topic
    outside the rule (a foreign store's) always is."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        for bad in [("g g", "T"), ("g\n", "T"), ("g\x00", "T"), ("g" * 256, "T"), ("g", "a/b"), ("g", "T" * 256),
                    ("g", "..")]:
            with pytest.raises(StoreError, match="group|topic") as e:
                s.commit_offset(*bad, 0, 1)
            assert isinstance(e.value, ValueError)
        s.commit_offset("g" * 255, "\u503c", 0, 3)
    with MessageStore(root, _cfg(strict_topic_names=False)) as s:
        s.commit_offset("g g", "T", 0, 2)
        with pytest.raises(InvalidArgumentError):
            s.commit_offset("g" * 256, "T", 0, 1)
    with MessageStore(root, _cfg()) as s:
        assert (s.committed_offset("g" * 255, "\u503c", 0), s.committed_offset("g g", "T", 0)) == (3, 2)
        assert s.committed_offset("g\n", "T", 0) == -1

@pytest.mark.parametrize("per_file", [100, 5])
def test_offset_by_time(tmp_path, per_file):
    """4.9 rule: choose the first CQ file whose last entry was stored at or after the time
    (else the last file), then the exact hit or the nearer neighbour inside that file."""
    with MessageStore(tmp_path / "s", _cfg(consume_queue_entries=per_file)) as s:
        rs = []
        for i in range(12):
            rs.append(s.put(Message("T", b"t%d" % i), queue_id=0))
            t = rs[-1].store_timestamp
            while time.time_ns() // 1_000_000 <= t + 1:     # distinct, spaced store times
                time.sleep(0.001)
        s.wait_dispatched()
        ts = [r.store_timestamp for r in rs]

        def nearest(topic, t):
            return s.offset_by_time(topic, 0, t, boundary="nearest")

        assert ts == sorted(set(ts))
        assert nearest("T", 0) == 0
        assert nearest("T", ts[0]) == 0
        for i, t in enumerate(ts):
            assert nearest("T", t) == i                 # exact hit
        for i in range(len(ts) - 1):      # between two: the nearer one, the left one on a tie
            gap = ts[i + 1] - ts[i]
            assert gap >= 2
            if (i + 1) % per_file == 0:   # the next file is chosen; its entries are all later
                assert nearest("T", ts[i] + 1) == i + 1
                assert nearest("T", ts[i + 1] - 1) == i + 1
                continue
            assert nearest("T", ts[i] + 1) == i
            assert nearest("T", ts[i + 1] - 1) == (i + 1 if gap > 2 else i)
        assert nearest("T", ts[-1] + 3_600_000) == len(ts) - 1   # 4.9: last entry
        assert nearest("Nope", ts[0]) == 0


def test_cq_entries_past_commitlog_end_are_not_followed(tmp_path):
    """A truncated commitlog (or a corrupt CQ tail): entries pointing past the commitlog end
    are dropped on open, read-only included, and never followed."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        rs = _fill(s, "T", 0, ["A"] * 6)
    path = root / "consumequeue" / "T" / "0" / ("%020d" % 0)
    data = bytearray(path.read_bytes())
    struct.pack_into(">qiq", data, 6 * 20, 1 << 40, 100, 0)       # a 7th entry far past the end
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    with MessageStore(root, _cfg(), read_only=True) as s:
        assert s.max_offset("T", 0) == 6
        res = s.get_messages("T", 0, 0, 32)
        assert [m.phy_offset for m in res.messages] == [r.phy_offset for r in rs]
        assert s.get_messages("T", 0, 6, 32).status == S.OFFSET_OVERFLOW_ONE
    assert path.read_bytes() == before
    with MessageStore(root, _cfg()) as s:
        assert s.max_offset("T", 0) == 6
        r = s.put(Message("T", b"new", tags="A"), queue_id=0)
        s.wait_dispatched()
        assert r.queue_offset == 6
        assert s.get_messages("T", 0, 6, 32).messages[0].body == b"new"
    assert ref.read_cq_entries(root, "T", 0)[6][1] == r.phy_offset


def test_read_queue_columns_match_get_messages(tmp_path):
    """The columnar read of a queue holds what get_messages returns, row for row; an entry
    pointing into a record is listed as missing, holes are skipped."""
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as s:
        _fill(s, "T", 0, ["A", None, "标签", "B"] * 6)
        _fill(s, "U", 0, ["A"])
    path = root / "consumequeue" / "T" / "0" / ("%020d" % 0)
    data = bytearray(path.read_bytes())
    phy, size = struct.unpack_from(">qi", data, 3 * 20)
    struct.pack_into(">qi", data, 3 * 20, phy + 7, size - 7)     # inside its record, before the next
    struct.pack_into(">qiq", data, 5 * 20, 0, 0x7FFFFFFF, 0)             # a RocketMQ hole entry
    path.write_bytes(bytes(data))
    with MessageStore(root, _cfg(), read_only=True) as s:
        want = []
        offset = 0
        while (r := s.get_messages("T", 0, offset, 32)).messages:
            want += r.messages
            offset = r.next_offset
        cols = s.read_queue_columns("T", 0)
        assert cols["count"] == len(want) == 22 and cols["missing"].tolist() == [3]
        assert cols["queue_offset"].tolist() == [m.queue_offset for m in want]
        assert cols["tags_code"].tolist() == [m.tags_code for m in want]
        bo, po = cols["body_offsets"], cols["props_offsets"]
        for i, m in enumerate(want):
            assert bytes(cols["body_data"][bo[i]:bo[i + 1]]) == m.body
            assert bytes(cols["props_data"][po[i]:po[i + 1]]) == m.properties_raw
        part = s.read_queue_columns("T", 0, 10, 4)
        assert part["queue_offset"].tolist() == [10, 11, 12, 13] and part["count"] == 4
        assert s.read_queue_columns("T", 0, 24)["count"] == 0
        assert s.read_queue_columns("Nope", 0)["count"] == 0



@pytest.mark.parametrize("per_file", [100, 3])
def test_offset_by_time_boundaries_with_ties(tmp_path, per_file):
    """boundary="lower" / "upper" against a brute-force oracle over every stored time: batches
    share one store timestamp (ties, straddling CQ files when per_file is 3), times before,
    between, at and after the queue's range."""
    with MessageStore(tmp_path / "s", _cfg(consume_queue_entries=per_file)) as s:
        for n in (4, 1, 5, 2, 3):
            rs = s.put_batch([Message("T", b"x")] * n, queue_id=0)
            while time.time_ns() // 1_000_000 <= rs[-1].store_timestamp + 2:
                time.sleep(0.001)
        s.wait_dispatched()
        times = [s.get_messages("T", 0, o, 1).messages[0].store_timestamp for o in range(s.max_offset("T", 0))]
        assert len(set(times)) == 5 and times == sorted(times)
        probes = sorted({t + d for t in times for d in (-1, 0, 1)} | {0, times[-1] + 10**6})
        for t in probes:
            lower = next((i for i, x in enumerate(times) if x >= t), len(times))
            upper = max([i for i, x in enumerate(times) if x <= t], default=0)
            assert s.offset_by_time("T", 0, t) == lower, t
            assert s.offset_by_time("T", 0, t, boundary="lower") == lower, t
            assert s.offset_by_time("T", 0, t, boundary="upper") == upper, t
            # a consumer reset to t sees every message stored at or after t
            assert all(x < t for x in times[:lower]) and all(x >= t for x in times[lower:])
        assert s.offset_by_time("Nope", 0, times[0]) == 0
        with pytest.raises(InvalidArgumentError):
            s.offset_by_time("T", 0, times[0], boundary="middle")


def _topic_rows(topics):
    """Raw bytes holding ``topics`` back to back, with their offsets and lengths (int32)."""
    raw = b"".join(t.encode() for t in topics)
    lengths = np.array([len(t.encode()) for t in topics], np.int32)
    return raw, np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32), lengths


def test_topic_ids_numbers_topics_in_first_seen_order_past_the_no_gil_cache():
    # 40 distinct topics, more than topic_ids keeps without the GIL: rotating, repeated, evicted, met again
    topics = [f"T{(i * 7) % 40}" for i in range(200)] + ["T3", "T3", "Ü", "T39", "Ü"]
    raw, off, length = _topic_rows(topics)
    ids, names = {}, ["earlier"]
    got = _cq.topic_ids(raw, off, length, ids, names)
    assert [names[i] for i in got.tolist()] == topics
    assert names[0] == "earlier" and len(names) == 42 and len(set(names)) == 42
    assert names[1:4] == ["T0", "T7", "T14"]
    again = _cq.topic_ids(raw, off, length, ids, names)   # a later batch: same numbers, no new names
    assert again.tolist() == got.tolist() and len(names) == 42


def test_topic_ids_refuses_a_topic_outside_the_bytes_even_after_cached_ones():
    raw, off, length = _topic_rows(["A", "B", "A"])
    with pytest.raises(OutOfRangeError):
        _cq.topic_ids(raw, off, np.array([1, 1, 5], np.int32), {}, [])


def test_single_entries_across_page_boundaries_read_back_as_written(tmp_path):
    # append_entry writes the entry that first touches a page with the GIL released: the
    # bytes, as DESIGN.md lays an entry out (big-endian offset i64, size i32, tags i64),
    # must be the same whichever way it went.
    from rmqstore._segment import MappedSegment
    seg = MappedSegment(str(tmp_path / "cq"), 0, 20 * 1000, create=True)
    try:
        seg.wrote_pos = 0
        for i in range(1000):      # 20-byte entries straddle 4 KiB boundaries at 4080, 8180, ...
            _cq.append_entry(seg, 1_000_000 + i, 100 + i, -i)
        raw = open(tmp_path / "cq", "rb").read()
    finally:
        seg.close()
    assert seg.wrote_pos == 20 * 1000
    for i in (0, 203, 204, 205, 409, 999):
        assert struct.unpack_from(">qiq", raw, 20 * i) == (1_000_000 + i, 100 + i, -i)


def _cached_pages(path):
    """How many pages of the file ``path`` are in the page cache (mincore over a mapping)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    assert addr != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
    try:
        assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        return sum(v & 1 for v in vec)
    finally:
        libc.munmap(addr, size)


def test_a_new_queue_file_is_not_filled_by_read_around(tmp_path):
    """A consume-queue file takes 20 bytes a message. Its first write fault used to read
    around (up to read_ahead_kb: 8 MB here), filling the page cache with zeros of the whole
    6 MB file, 1-11 ms per new file: most of a small store's dispatch (a Spark writer task
    makes 8 of them). New files are mapped without read-around: one page is cached."""
    with MessageStore(tmp_path, StoreConfig(**SMALL_INDEX, default_queue_nums=1)) as s:
        s.put(Message("T", b"x" * 100))
        s.wait_dispatched()
        path = s.consume_queues.get("T", 0).segments.last.path
        assert os.path.getsize(path) == 300_000 * 20
        assert _cached_pages(path) <= 2


def _group_oracle(sys_flag, topic_ids, queue_ids, unsafe):
    """What dispatch gives consume-queue entries, by plain loops: (groups {(topic id, queue
    id as unsigned): [row, ...]} in commitlog order, rows left out for their topic)."""
    groups, bad = {}, []
    for i, (flag, tid, qid) in enumerate(zip(sys_flag, topic_ids, queue_ids, strict=True)):
        if flag & 0xC in (0x4, 0xC):   # PREPARED, ROLLBACK
            continue
        if unsafe[tid]:
            bad.append(i)
        else:
            groups.setdefault((tid, qid & 0xFFFFFFFF), []).append(i)
    return dict(sorted(groups.items())), bad


@pytest.mark.parametrize("seed", range(6))
def test_group_entries_matches_plain_grouping(seed):
    """The dispatcher's C grouping: every row's entry in its (topic, queue) group, groups in
    key order (negative queue ids last, as unsigned), commitlog order within, PREPARED and
    ROLLBACK rows and unsafe topics left out, the entry columns copied from the row."""
    from rmqstore._read import DISPATCH_DTYPE
    rnd = np.random.default_rng(seed)
    n = [0, 1, 7, 4096, 5000, 300][seed]
    rows = np.zeros(n, DISPATCH_DTYPE)
    rows["phy_offset"] = np.cumsum(rnd.integers(1, 500, n))
    rows["size"] = rnd.integers(1, 1 << 30, n)
    rows["queue_id"] = rnd.choice([0, 1, 2, 7, -1, 1 << 31 - 1, -(1 << 31)], n)
    rows["queue_offset"] = rnd.integers(0, 1 << 62, n)
    rows["sys_flag"] = rnd.choice([0, 0x4, 0x8, 0xC, 0x1, 0x8 | 0x2], n)
    rows["tags_code"] = rnd.integers(-(1 << 63), 1 << 63, n, dtype=np.int64)
    ntopics = [1, 2, 3, 40, 5, 2000][seed]
    topic_ids = rnd.integers(0, ntopics, n).astype(np.int32)
    unsafe = (rnd.random(ntopics) < 0.2).astype(np.uint8)
    row, phy, size, tags, qoff, starts, bad = _cq.group_entries(rows, topic_ids, unsafe)
    groups, want_bad = _group_oracle(rows["sys_flag"].tolist(), topic_ids.tolist(), rows["queue_id"].tolist(),
                                     unsafe.tolist())
    assert bad.tolist() == want_bad
    assert starts.tolist() == [0, *itertools.accumulate(len(g) for g in groups.values())]
    assert row.tolist() == [i for g in groups.values() for i in g]
    for col, name in ((phy, "phy_offset"), (size, "size"), (tags, "tags_code"), (qoff, "queue_offset")):
        assert col.tolist() == [rows[name][i] for i in row.tolist()]


def test_group_entries_rejects_bad_arguments():
    from rmqstore._read import DISPATCH_DTYPE
    rows = np.zeros(3, DISPATCH_DTYPE)
    with pytest.raises(OutOfRangeError):
        _cq.group_entries(rows, np.array([0, 2, 0], np.int32), np.zeros(2, np.uint8))
    with pytest.raises(OutOfRangeError):
        _cq.group_entries(rows, np.array([0, -1, 0], np.int32), np.zeros(2, np.uint8))
    with pytest.raises(InvalidArgumentError):
        _cq.group_entries(rows, np.zeros(2, np.int32), np.zeros(2, np.uint8))
    with pytest.raises(InvalidArgumentError):
        _cq.group_entries(rows[::2], np.zeros(2, np.int32), np.zeros(2, np.uint8))


@pytest.mark.parametrize("per_file", [7, 1000])
def test_mixed_batch_entries(tmp_path, per_file):
    """One dispatch batch of several topics and queues, transactions and delayed messages:
    each queue's entries are the puts that went to it, in order, with their sizes and tags
    hashes (delivery times for SCHEDULE_TOPIC_XXXX), the others none; with small files a
    queue's run fills several."""
    cfg = _cfg(consume_queue_entries=per_file, commitlog_file_size=1 << 20)
    rnd = np.random.default_rng(1)
    want = {}
    with MessageStore(tmp_path / "s", cfg) as store:
        store.dispatcher.stop()   # one batch for all of them
        for i in range(600):
            topic = ["A", "B", "C"][int(rnd.integers(3))]
            tran = [0, 0, 0x4, 0xC, 0x8][int(rnd.integers(5))]
            delay = int(rnd.integers(1, 4)) if rnd.random() < 0.1 else 0
            m = Message(topic, b"x" * int(rnd.integers(1, 50)), tags=f"t{i % 7}", delay_level=delay, sys_flag=tran)
            r = store.put(m, queue_id=int(rnd.integers(4)))
            if tran in (0x4, 0xC):   # PREPARED and ROLLBACK get no entry
                continue
            stored = store.get_by_offset(r.phy_offset)
            tags = stored.store_timestamp + [1000, 5000, 10_000][delay - 1] if delay else ref.java_hash(f"t{i % 7}")
            want.setdefault((r.topic, r.queue_id), []).append((r.phy_offset, stored.store_size, tags))
        store.dispatcher.catch_up()
        assert {("SCHEDULE_TOPIC_XXXX", 0), ("A", 0), ("C", 3)} <= set(want)
        for (topic, qid), entries in want.items():
            got = store.consume_queue_entries(topic, qid)
            assert [tuple(int(e[k]) for k in ("phy_offset", "size", "tags_code")) for e in got] == entries
        assert sum(len(store.consume_queue_entries(t, q)) for t in ("A", "B", "C") for q in range(4)) == \
            sum(len(v) for (t, _), v in want.items() if t != "SCHEDULE_TOPIC_XXXX")


def test_append_runs(tmp_path):
    """A batch's runs written in one pass: each run whose queue offsets go on one by one
    from its file's end is written there as far as the file has room; a run after a gap,
    a duplicate (by queue offset, or a message ending at or before the queue's last
    entry's) or without a file gets nothing; bad arguments write nothing."""
    from rmqstore._segment import MappedSegment
    segs = [MappedSegment(tmp_path / f"f{k}", 0, 5 * _cq.ENTRY_SIZE, create=True) for k in range(4)]
    try:
        _cq.append_entry(segs[1], 99, 9, 999)
        _cq.append_entry(segs[3], 98, 8, 888)
        phy, size, tags = np.arange(15, dtype=np.int64) * 100, np.arange(15, dtype=np.int32) + 1, -np.arange(15)
        qoff = np.array([0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 3, 4, 0, 1])
        runs = [segs[0], segs[1], None, segs[2], segs[3]]
        starts = np.array([0, 2, 10, 11, 13, 15])
        ends = np.array([-1, 99 + 9, -1, -1, 98 + 8])
        before = [s.wrote_pos for s in segs]
        for bad in ([0, 2, 10, 11, 13, 16], [0, 2, 1, 11, 13, 15], [-1, 2, 10, 11, 13, 15]):
            with pytest.raises(OutOfRangeError):
                _cq.append_runs(runs, ends, phy, size, tags, qoff, np.array(bad))
        with pytest.raises(InvalidArgumentError):
            _cq.append_runs([segs[0], segs[0]], ends[:2], phy, size, tags, qoff, np.array([0, 1, 2]))
        with pytest.raises(InvalidArgumentError):
            _cq.append_runs(runs, ends, phy, size, tags, qoff, starts[:-1])
        with pytest.raises(InvalidArgumentError):
            _cq.append_runs(runs, ends[:-1], phy, size, tags, qoff, starts)
        # each run's first message ends at or before its queue's last one: dispatched already
        assert _cq.append_runs(runs, np.array([1, 200 + 3, -1, 10**9, 10**9]), phy, size, tags, qoff,
                               starts).tolist() == [0] * 5
        assert [s.wrote_pos for s in segs] == before
        done = _cq.append_runs(runs, ends, phy, size, tags, qoff, starts)
        assert done.tolist() == [2, 4, 0, 0, 0]   # room for 4 of 8; no file; a gap (3 after 0); 0 after 1
        got = [[tuple(int(x) for x in e) for e in _cq.read_entries(s, 0, s.wrote_pos // _cq.ENTRY_SIZE)] for s in segs]
        assert got == [[(0, 1, 0), (100, 2, -1)], [(99, 9, 999), (200, 3, -2), (300, 4, -3), (400, 5, -4),
                                                   (500, 6, -5)], [], [(98, 8, 888)]]
    finally:
        for s in segs:
            s.close()
