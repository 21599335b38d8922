"""Corruption: a seeded fuzzer over every file kind of a copied store. Commitlog records
(each header field, the topic bytes, length fields, PHYSICALOFFSET), BLANK end-of-file
records, consume-queue entries, index headers, slots and entries, the checkpoint,
``config/consumerOffset.json``, ``abort`` and ``lock``, and missing, extra, truncated and
zero-length files. Opening (writer, then read-only), reading, putting and verifying must
give a StoreError subclass or a working store: never another exception, a segfault, SIGBUS
or a hang (each batch runs in a subprocess with a timeout). Hypothesis fuzzes the record
decoder and the segment scanner."""
import os
import random
import shutil
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rmqstore
from rmqstore import CorruptRecordError, Message, MessageExt, MessageStore, StoreConfig, _read, _record, batch
from rmqstore._segment import MappedSegment

from reference_codec import encode_record

CFG = dict(commitlog_file_size=8192, consume_queue_entries=8, index_slots=16, index_entries=64,
           warm_mapped_file=False)
BLANK_MAGIC = 0xCBD43194
INDEX_HEADER = 40
PER_BATCH = 35

# The child opens and reads every mutated store named on its command line; it prints the
# case before touching it, so a crash names the case that caused it. A StoreError is a
# clean refusal; any other exception escapes and fails the batch.
READER = r"""
import os, sys
from rmqstore import Message, MessageStore, StoreConfig, StoreError
cfg = StoreConfig(commitlog_file_size=8192, consume_queue_entries=8, index_slots=16, index_entries=64,
                  warm_mapped_file=False)
def read_all(s):
    for m in s.scan(check_crc=True):
        m.body, m.properties
    for (t, q) in list(s.consume_queues.queues):
        off, n = s.min_offset(t, q), 0
        while n < 1000:
            r = s.get_messages(t, q, off, 8)
            for m in r.messages:
                m.body
            if r.next_offset == off:
                break
            off, n = r.next_offset, n + 1
        for e in s.consume_queue_entries(t, q):
            if int(e["phy_offset"]) >= s.max_phy_offset:   # read-only: CQ not cut at the end
                continue
            try:
                s.get_by_offset(int(e["phy_offset"]))
            except StoreError:
                pass
        s.offset_by_time(t, q, 0)
    if s.index is not None:
        for k in ("k0", "k7", "k33", "hot"):
            s.query_by_key("CorA", k)
    s.committed_offset("G", "CorA", 0)
    s.verify()
for case in sys.argv[1:]:
    print("case", case, flush=True)
    for read_only in (False, True):
        try:
            with MessageStore(case, cfg, read_only=read_only) as s:
                read_all(s)
                if not read_only:
                    s.put(Message("CorA", b"after", keys="k0"), 0)
                    s.commit_offset("G", "CorA", 0, 1)
        except StoreError as e:
            print("refused", type(e).__name__, str(e)[:200].replace("\n", " "), flush=True)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt") / "base"
    with MessageStore(path, StoreConfig(**CFG)) as s:
        for i in range(150):
            s.put(Message("CorA" if i % 3 else "CorB", b"%d:" % i * (i % 40 + 1), tags=f"t{i % 4}",
                          keys=[f"k{i}", "hot"]), queue_id=i % 3)
        s.commit_offset("G", "CorA", 0, 5)
        s.commit_offset("G", "CorB", 1, 2)
    return path


def _files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f not in ("lock", "abort"))


def _segments(root, sub):
    return sorted(os.path.join(root, sub, n) for n in os.listdir(os.path.join(root, sub)))


def _under(root, sub):
    return [f for f in _files(root) if f.startswith(os.path.join(root, sub) + os.sep)]


def _patch(f, pos, data):
    with open(f, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def _records(seg):
    """(position, total size, magic) of each record of a commitlog segment, BLANK included."""
    data = open(seg, "rb").read()
    out, pos = [], 0
    while pos + 8 <= len(data):
        total, magic = struct.unpack_from(">iI", data, pos)
        if total <= 0:
            break
        out.append((pos, total, magic))
        if magic == BLANK_MAGIC or total < 8:
            break
        pos += total
    return out, data


def _int(rng, width):
    lim = 1 << (8 * width - 1)
    return rng.choice([-1, 0, 1, lim - 1, -lim, rng.randrange(-lim, lim), 91, 8192]).to_bytes(width, "big", signed=True)


def m_flip(root, rng):
    f = rng.choice(_files(root))
    data = bytearray(open(f, "rb").read())
    if not data:
        return "flip empty " + f
    hot = len(data.rstrip(b"\0")) or len(data)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(hot)] ^= 1 << rng.randrange(8)
    open(f, "wb").write(data)
    return "flip " + f


def _record_field(root, rng, fields):
    """Overwrite one of ``fields`` of a random record of a random commitlog segment."""
    seg = rng.choice(_segments(root, "commitlog"))
    recs, data = _records(seg)
    msgs = [r for r in recs if r[2] != BLANK_MAGIC]
    if not msgs:
        return "no record in " + seg
    pos, total, _ = rng.choice(msgs)
    body_len = struct.unpack_from(">i", data, pos + 84)[0]
    topic_at = pos + 88 + body_len
    if not 0 <= topic_at < len(data):
        return "record too short " + seg
    field = rng.choice(fields)
    at, junk = {
        "total": (0, _int(rng, 4)), "magic": (4, _int(rng, 4)), "queue_id": (12, _int(rng, 4)),
        "queue_offset": (20, _int(rng, 8)), "phy_offset": (28, (pos + rng.choice([1, -1, 8192, 1 << 40]))
                                                            .to_bytes(8, "big", signed=True)),
        "sys_flag": (36, _int(rng, 4)), "body_len": (84, _int(rng, 4)),
        "topic_len": (88 + body_len, bytes([rng.randrange(256)])),
        "topic": (89 + body_len, rng.choice([b"../../x", b"..", b"/etc", b"a/b", b"\0\0", b"%%", b"\xff\xfe"])),
        "props_len": (89 + body_len + data[topic_at], _int(rng, 2)),
    }[field]
    if pos + at + len(junk) > len(data):
        return "record too short " + seg
    _patch(seg, pos + at, junk)
    return f"record {field} @{pos} {seg}"


def m_record_field(root, rng):
    """A header or length field of one commitlog record: size, magic, queue id, queue offset,
    PHYSICALOFFSET, sysflag, body length, properties length."""
    return _record_field(root, rng, ["total", "magic", "queue_id", "queue_offset", "phy_offset", "phy_offset",
                                     "sys_flag", "body_len", "props_len"])


def m_topic_bytes(root, rng):
    """The topic bytes or topic length of one record (not under the body CRC; issue 11 item 3)."""
    return _record_field(root, rng, ["topic_len", "topic", "topic"])


def m_blank(root, rng):
    """The BLANK record that ends a full segment: its size or magic."""
    for seg in rng.sample(_segments(root, "commitlog"), len(_segments(root, "commitlog"))):
        recs, _ = _records(seg)
        if recs and recs[-1][2] == BLANK_MAGIC:
            pos = recs[-1][0]
            at, junk = rng.choice([(0, _int(rng, 4)), (4, _int(rng, 4)), (0, b"\0" * 8)])
            _patch(seg, pos + at, junk)
            return f"blank +{at} @{pos} {seg}"
    return "no blank"


def m_consume_queue(root, rng):
    f = rng.choice(_under(root, "consumequeue"))
    pos = rng.randrange(max(1, os.path.getsize(f) // 20)) * 20
    junk = rng.choice([rng.randbytes(20), _int(rng, 8) + rng.randbytes(12),
                       (0).to_bytes(8, "big") + _int(rng, 4) + _int(rng, 8), b"\0" * 20])
    _patch(f, pos, junk)
    return f"cq @{pos} {f}"


def m_index(root, rng):
    """An index file's header (timestamps, offsets, counts), a hash slot or an entry."""
    f = rng.choice(_under(root, "index"))
    size = os.path.getsize(f)
    where = rng.choice(["header", "slot", "entry"])
    if where == "header" or size <= INDEX_HEADER + 16 * 4:
        pos, junk = rng.choice([(0, _int(rng, 8)), (8, _int(rng, 8)), (16, _int(rng, 8)), (24, _int(rng, 8)),
                                (32, _int(rng, 4)), (36, _int(rng, 4))])
    elif where == "slot":
        pos, junk = INDEX_HEADER + rng.randrange(16) * 4, _int(rng, 4)
    else:
        n = (size - INDEX_HEADER - 16 * 4) // 20
        pos = INDEX_HEADER + 16 * 4 + rng.randrange(max(1, n)) * 20 + rng.choice([0, 4, 12, 16])
        junk = _int(rng, 4)
    if pos + len(junk) > size:
        return "index too short " + f
    _patch(f, pos, junk)
    return f"index {where} @{pos} {f}"


def m_checkpoint(root, rng):
    f = os.path.join(root, "checkpoint")
    pos = rng.choice([0, 8, 16])
    _patch(f, pos, rng.choice([_int(rng, 8), (-(1 << 63)).to_bytes(8, "big", signed=True),
                               ((1 << 63) - 1).to_bytes(8, "big")]))
    return f"checkpoint @{pos}"


def m_consumer_offsets(root, rng):
    f = os.path.join(root, "config", "consumerOffset.json")
    open(f, "wb").write(rng.choice([
        b"", b"{", b"[]", b"null", b'{"offsetTable": 5}', b'{"offsetTable": {"CorA@G": {"0": "x"}}}',
        b'{"offsetTable": {"CorA@G": {"0": 1e400}}}', b'{"offsetTable": {"noat": {"0": 1}}}',
        b'{"offsetTable": {"CorA@G": {"zero": 1}}}', b'{"offsetTable": {"CorA@G": {"0": -5}}}',
        b'{"offsetTable": {"CorA@G": {"0": 99999999999999999999999}}}', b"\xff\xfe\x00", rng.randbytes(40)]))
    return "consumerOffset.json"


def m_abort_lock(root, rng):
    choice = rng.choice(["abort garbage", "abort dir", "lock dir", "lock garbage", "lock empty"])
    name = os.path.join(root, choice.split()[0])
    if os.path.lexists(name):
        os.unlink(name)
    if choice.endswith("dir"):
        os.mkdir(name)
    else:
        open(name, "wb").write(b"" if choice.endswith("empty") else rng.randbytes(rng.randrange(1, 64)))
    return choice


def m_files(root, rng):
    """A missing, extra, truncated or zero-length file."""
    files = _files(root)
    what = rng.choice(["missing", "extra", "truncate", "zero", "drop_middle"])
    if what == "missing":
        f = rng.choice(files)
        os.unlink(f)
    elif what == "truncate":
        f = rng.choice(files)
        os.truncate(f, rng.randrange(os.path.getsize(f) + 1))
    elif what == "zero":
        f = rng.choice(files)
        os.truncate(f, 0)
    elif what == "drop_middle":
        segs = _segments(root, "commitlog")
        f = segs[len(segs) // 2]
        os.unlink(f)
    else:
        d = rng.choice(["commitlog", "index", "consumequeue/CorA/1", "consumequeue/CorA", "consumequeue"])
        name = rng.choice([f"{rng.randrange(1 << 40):020d}", "junk", "99999999999999999999", "x" * 20])
        f = os.path.join(root, d, name)
        os.makedirs(os.path.dirname(f), exist_ok=True)
        if not os.path.exists(f):
            open(f, "wb").write(rng.randbytes(rng.choice([0, 20, 100, 8192])))
    return f"{what} {f}"


MUTATORS = [m_flip, m_flip, m_record_field, m_record_field, m_record_field, m_blank, m_consume_queue, m_index,
            m_index, m_checkpoint, m_consumer_offsets, m_abort_lock, m_files, m_files]


def _mutate(root, rng, mutators):
    """One or two seeded corruptions of the store at ``root``; returns what was done."""
    done = [rng.choice(mutators)(root, rng) for _ in range(rng.choice([1, 1, 1, 2]))]
    if rng.random() < 0.5 and not os.path.lexists(os.path.join(root, "abort")):
        open(os.path.join(root, "abort"), "wb").close()
    return "; ".join(done)


def _run_cases(base, tmp_path, seed, n, mutators=MUTATORS):
    rng = random.Random(seed)
    refused = 0
    for b in range(0, n, PER_BATCH):
        cases, what = [], {}
        for i in range(b, min(n, b + PER_BATCH)):
            dst = str(tmp_path / f"case{i}")
            shutil.copytree(base, dst)
            what[dst] = _mutate(dst, rng, mutators)
            cases.append(dst)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
        try:
            p = subprocess.run([sys.executable, "-c", READER, *cases], capture_output=True, text=True, timeout=180,
                               env=env)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            started = [x.split(" ", 1)[1] for x in out.splitlines() if x.startswith("case ")]
            pytest.fail(f"hang on {what.get(started[-1]) if started else None}")
        started = [x.split(" ", 1)[1] for x in p.stdout.splitlines() if x.startswith("case ")]
        last = started[-1] if started else None
        assert p.returncode == 0 and p.stdout.endswith("done\n"), \
            f"exit {p.returncode} on {what.get(last)}\n{p.stderr[-3000:]}"
        refused += p.stdout.count("refused")
        for c in cases:
            shutil.rmtree(c)
    return refused


def test_seeded_corruption(base_store, tmp_path):
    n = 105
    refused = _run_cases(base_store, tmp_path, seed=5, n=n)
    assert refused < 2 * n          # each case is opened twice; most corruptions are recovered from


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_seeded_corruption_many(base_store, tmp_path, seed):
    _run_cases(base_store, tmp_path, seed=1000 + seed, n=105)


def test_seeded_topic_bytes(base_store, tmp_path):
    """Topic bytes are not under the body CRC: any of them (NUL, '/', '..') gives a working
    store or a StoreError, never a path outside the store (tests/test_disk_truth.py)."""
    _run_cases(base_store, tmp_path, seed=7, n=70, mutators=[m_topic_bytes])


def test_missing_middle_segment_is_refused(base_store, tmp_path):
    dst = tmp_path / "s"
    shutil.copytree(base_store, dst)
    segs = _segments(dst, "commitlog")
    assert len(segs) >= 3
    os.unlink(segs[1])
    with pytest.raises(rmqstore.CorruptStoreError, match="missing segment"):
        MessageStore(dst, StoreConfig(**CFG))



@pytest.mark.parametrize("kind", ["commitlog", "consumequeue/CorA/1"])
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "read-only"])
def test_a_segment_named_near_the_largest_offset_is_refused(base_store, tmp_path, kind, read_only):
    """A segment (commitlog or consume queue) renamed so that it starts less than its size
    below 2^63: its end overflows int64. Opening was a bare OverflowError from the C
    position code (the CLI printed a traceback); it is now a CorruptStoreError naming it."""
    dst = tmp_path / "s"
    shutil.copytree(base_store, dst)
    segs = _segments(dst, kind)
    for f in segs[:-1]:
        os.unlink(f)
    os.rename(segs[-1], os.path.join(os.path.dirname(segs[-1]), f"{(1 << 63) - 100:020d}"))
    with pytest.raises(rmqstore.CorruptStoreError, match=f"starts at {(1 << 63) - 100}, its end is past"):
        MessageStore(dst, StoreConfig(**CFG), read_only=read_only)


def test_an_extended_consumer_offsets_file_is_refused_in_bounded_memory(base_store, tmp_path):
    """config/consumerOffset.json extended (sparse) to 8 GiB: it was read whole, a
    MemoryError (or the machine's memory) in a process capped at 1 GiB; now a
    CorruptStoreError naming it, from the writer and read-only opens alike."""
    dst = tmp_path / "s"
    shutil.copytree(base_store, dst)
    os.truncate(dst / "config" / "consumerOffset.json", 8 << 30)
    code = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from rmqstore import CorruptStoreError, MessageStore, StoreConfig
for ro in (True, False):
    try:
        MessageStore({str(dst)!r}, StoreConfig(**{CFG!r}), read_only=ro)
    except CorruptStoreError as e:
        assert "consumerOffset.json: more than" in str(e), e
    else:
        raise AssertionError("opened")
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(rmqstore.__file__)))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]

# -- decoder fuzzing -------------------------------------------------------------------------

VALID = encode_record("FuzzTopic", b"hello fuzz body", {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U"},
                      queue_offset=3, phy_offset=0, store_timestamp=123)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_decode_bytes_random(data, crc):
    try:
        m = _read.decode_bytes(data, 0, crc)
    except CorruptRecordError:
        return
    assert isinstance(m, MessageExt) and 91 <= m.store_size <= len(data)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, len(VALID)))
def test_decode_bytes_mutated_record(patches, cut):
    data = bytearray(VALID)
    for pos, val in patches:
        data[pos] = val
    data = bytes(data[:cut])
    try:
        m = _read.decode_bytes(data, 0, True)
    except CorruptRecordError:
        return
    assert m.store_size <= len(data) and m.body_crc == _record.crc32_body(m.body)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_scan_segment_random(tmp_path_factory, data, crc):
    path = tmp_path_factory.mktemp("fuzz") / "00000000000000000000"
    content = (VALID * 3 + data)[:4096].ljust(4096, b"\0")
    path.write_bytes(content)
    seg = MappedSegment(str(path), 0, 4096, readonly=True)
    try:
        end, count, status, _ = _read.scan_segment(seg, 0, 4096, crc)
        assert count >= 3 and 3 * len(VALID) <= end <= 4096
        assert status in ("end", "blank", "truncated record", "bad magic code", "bad total size",
                          "field lengths do not add up to the total size", "body CRC mismatch")
    finally:
        seg.close()


def _holed_store(root, how):
    """Eight 8 KiB segments written and closed cleanly, then zeros put into the first one
    (recovery checks only the last three): from a record boundary to its end, a run in its
    middle, or all of it."""
    cfg = StoreConfig(commitlog_file_size=8192, consume_queue_entries=10, index_slots=64, index_entries=256,
                      warm_mapped_file=False)
    with MessageStore(root, cfg) as s:
        offsets = [s.put(Message("T", b"x" * 100, keys=[f"k{i}"])).phy_offset for i in range(300)]
    at = offsets[10]
    with open(os.path.join(root, "commitlog", "0" * 20), "r+b") as f:
        f.seek(0 if how == "whole" else at)
        f.write(bytes({"whole": 8192, "tail": 8192 - at, "middle": 2 * (offsets[1] - offsets[0])}[how]))
    return 0 if how == "whole" else at


@pytest.mark.parametrize("how", ["whole", "tail", "middle"])
def test_a_hole_in_an_earlier_segment_is_no_silent_end(tmp_path, how):
    """Zeros where an earlier segment's records were ended that segment for scan() and
    the batch decoder (the Spark source's and jobs'): they went on at the next segment, so
    the records lost were skipped in silence, though verify() flagged them. Now scan and
    the decoder raise CorruptRecordError at the hole, mode="skip" counts it as a corrupt
    region, and count_records / advance (the stream's step) refuse it too."""
    root = tmp_path / "s"
    at = _holed_store(root, how)
    with MessageStore(root, read_only=True) as s:
        assert not s.verify().ok
        it = s.scan()
        with pytest.raises(CorruptRecordError, match="zeros") as e:
            for _ in it:
                pass
        assert e.value.offset == at
    files = batch.segment_files(root)
    with pytest.raises(CorruptRecordError, match="zeros"):
        for path, base, size in files:
            for _ in batch.iter_columns(path, base, 0, size):
                pass
    stats = batch.DecodeStats()
    for path, base, size in files:
        for lo in range(0, size, 3000):   # ranges cut anywhere, as the Spark jobs plan them
            for _ in batch.iter_columns(path, base, lo, min(size, lo + 3000), mode="skip", stats=stats):
                pass
    assert stats.corrupt_offsets == [at]
    with pytest.raises(CorruptRecordError, match="zeros"):
        batch.count_records(root)
    with pytest.raises(CorruptRecordError, match="zeros"):
        batch.advance(root, at, 1 << 20)


def test_the_search_for_records_after_the_data_skips_holes(tmp_path):
    """Telling a hole from the end of data searched the rest of the segment for a record:
    all of a new 1 GiB segment's holes read, 3.3 s for a store of ten messages. It reads
    only the parts SEEK_DATA reports (holes of a sparse file are never read)."""
    f = tmp_path / "sparse"
    with open(f, "wb") as fh:
        fh.write(b"a" * 4096)
        fh.seek(32 << 20)
        fh.write(b"b" * 4096)
        fh.truncate(64 << 20)
    ranges = list(batch._data_ranges(str(f), 1, 64 << 20))
    assert sum(b - a for a, b in ranges) <= 8192 + 2 * 4096   # blocks of the two writes, not 64 MiB
    assert ranges[0][0] <= 4095 and any(a <= 32 << 20 < b for a, b in ranges)


def test_the_end_of_data_is_no_hole(tmp_path):
    """The zeros after the last record, and a writer's empty segment made ahead, end the
    data as before."""
    cfg = StoreConfig(commitlog_file_size=8192, warm_mapped_file=False, message_index_enable=False)
    with MessageStore(tmp_path / "s", cfg) as s:
        for _ in range(100):
            s.put(Message("T", b"x" * 100))
    last = max(int(n) for n in os.listdir(tmp_path / "s" / "commitlog"))
    (tmp_path / "s" / "commitlog" / f"{last + 8192:020d}").write_bytes(bytes(8192))   # made ahead, empty
    with MessageStore(tmp_path / "s", cfg, read_only=True) as s:
        assert len(list(s.scan())) == 100
    assert batch.count_records(tmp_path / "s")[0] == 100
    assert sum(c["count"] for p, b, n in batch.segment_files(tmp_path / "s") for c in batch.iter_columns(p, b, 0, n)) \
        == 100
