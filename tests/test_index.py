"""IndexFile and key queries: RocketMQ's answers on the fixture stores, index files rebuilt
byte for byte, our files checked entry by entry with an independent reader written from
DESIGN.md, colliding keys, rollover, damaged files, bad arguments and crash cuts."""
import os
import shutil
import struct

import pytest

from rmqstore import InvalidArgumentError, Message, MessageNotFoundError, MessageStore, StoreClosedError, StoreConfig
from rmqstore._record import TRANSACTION_PREPARED, TRANSACTION_ROLLBACK

from conftest import SMALL_INDEX, copy_store

LONG_MAX = (1 << 63) - 1


# ---------------------------------------------------------------- independent reference reader

def java_hash(s):
    """Java String.hashCode over UTF-16 code units, signed 32-bit."""
    units = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def index_hash(s):
    h = java_hash(s)
    return 0 if h == -(1 << 31) else abs(h)


def read_index_file(path, slots):
    """(header dict, slot values, entries as (hash, phy, time_diff, prev)) per DESIGN.md."""
    data = open(path, "rb").read()
    b_ts, e_ts, b_phy, e_phy, slot_count, count = struct.unpack_from(">qqqqii", data, 0)
    slot_vals = list(struct.unpack_from(f">{slots}i", data, 40))
    entries_at = 40 + 4 * slots
    ents = [struct.unpack_from(">iqii", data, entries_at + 20 * i) for i in range(count)]
    return dict(begin_ts=b_ts, end_ts=e_ts, begin_phy=b_phy, end_phy=e_phy, slot_count=slot_count,
                count=count, size=len(data)), slot_vals, ents


def index_files(root):
    d = os.path.join(root, "index")
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


# ---------------------------------------------------------------- RocketMQ's answers

def _hit_is_real(q, hit):
    return hit["topic"] == q["topic"] and (hit["uniqKey"] == q["key"] or q["key"] in (hit["keys"] or "").split(" "))


def _in_query(q, m):
    """Whether manifest message ``m`` answers key query ``q``: indexed, its topic, the key
    its UNIQ_KEY or a KEYS token, its store time in [begin, end]."""
    return m["indexed"] and _hit_is_real(q, m) and q["begin"] <= m["storeTimestamp"] <= q["end"]


def test_fixture_query_offsets_and_query_by_key(fixture_store):
    name, store_dir, manifest = fixture_store
    queries = manifest["queries"][0]["queryMessage"]
    collisions = 0
    with MessageStore(store_dir, read_only=True) as store:
        for q in queries:
            expected = [h["commitLogOffset"] for h in q["hits"]]
            got = store.query_offsets(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
            assert got == expected, (name, q["key"], q["begin"], q["end"])
            real = sorted({h["commitLogOffset"] for h in q["hits"] if _hit_is_real(q, h)}, reverse=True)
            collisions += len(expected) - len(real)
            # the filtered answer checks each message's own store time (docs/durability.md): it holds
            # RocketMQ's real hits whose store time is in the range (its whole-second times also let
            # in messages stored up to a second past the end), and maybe more of the newest messages
            # truly in the range, which its early stop misses
            truth = sorted((m["commitLogOffset"] for m in manifest["messages"] if _in_query(q, m)), reverse=True)
            msgs = store.query_by_key(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
            got = [m.phy_offset for m in msgs]
            assert got == truth[:len(got)] and set(real) & set(truth) <= set(got), (name, q["key"])
            batch = store.query_keys(q["topic"], [q["key"], q["key"]], q["maxNum"], q["begin"], q["end"])
            assert [[m.phy_offset for m in ms] for ms in batch] == [got, got]
            cols = store.query_keys_columns(q["topic"], [q["key"], q["key"]], q["maxNum"], q["begin"], q["end"])
            assert cols["key"].tolist() == [0] * len(got) + [1] * len(got)
            assert cols["phy_offset"].tolist() == got + got
    assert collisions > 0   # AaAa/AaBB/BBAa/BBBB share a hash: RocketMQ returns each other's messages


def test_fixture_uniq_key_and_msg_id(clean_498):
    store_dir, manifest = clean_498
    with MessageStore(store_dir, read_only=True) as store:
        for m in manifest["messages"][::97]:
            if not m["uniqKey"] or not m["indexed"]:
                continue
            got = store.query_by_uniq_key(m["topic"], m["uniqKey"])
            assert got.phy_offset == m["commitLogOffset"] and got.msg_id == m["msgId"]
            assert store.get_by_msg_id(m["msgId"]).phy_offset == m["commitLogOffset"]
        with pytest.raises(MessageNotFoundError):
            store.query_by_uniq_key("TopicA", "0A00000110925EEDF00D0000FFFFFFFF")


@pytest.mark.parametrize("fixture", ["498-clean", "533-v2"])
def test_rebuilt_index_is_byte_identical_to_rocketmq(fixture, tmp_path):
    from conftest import FIXTURE_DIRS, _require
    _require(FIXTURE_DIRS[fixture])
    src = FIXTURE_DIRS[fixture] / "store"
    root = copy_store(src, tmp_path)
    shutil.rmtree(root / "index")
    shutil.rmtree(root / "consumequeue")   # so the reopen re-dispatches the whole commitlog
    cfg = StoreConfig(**SMALL_INDEX, warm_mapped_file=False, message_version=2)
    MessageStore(root, cfg).close()
    ours, theirs = index_files(root), index_files(src)
    assert len(ours) == len(theirs) and len(ours) > 1
    for a, b in zip(ours, theirs, strict=False):
        assert open(a, "rb").read() == open(b, "rb").read(), (a, b)


# ---------------------------------------------------------------- our files, entry by entry

MIN_HASH_TOPIC = "T"


def min_value_key(prefix):
    """A key k such that Java hashCode(prefix + k) == Integer.MIN_VALUE (printable ASCII)."""
    n = 7
    target = (-(1 << 31) - java_hash(prefix) * pow(31, n)) & 0xFFFFFFFF
    target = (target - sum(65 * pow(31, n - 1 - i) for i in range(n))) & 0xFFFFFFFF
    digits = []
    for i in range(n):
        w = pow(31, n - 1 - i)
        digits.append(target // w)
        target %= w
    key = "".join(chr(65 + d) for d in digits)
    assert java_hash(prefix + key) == -(1 << 31)
    return key


def _put_keyed(store, specs):
    """specs: (topic, keys, uniq, sys_flag); returns the PutResults."""
    out = []
    for topic, keys, uniq, flag in specs:
        props = {"UNIQ_KEY": uniq} if uniq else {}
        out.append(store.put(Message(topic, b"x", keys=keys, properties=props, sys_flag=flag)))
    return out


def test_own_files_match_reference_reader_with_collisions_and_rollover(tmp_path):
    slots, entries = 3, 6      # 5 entries per file (entry 0 unused)
    cfg = StoreConfig(index_slots=slots, index_entries=entries, warm_mapped_file=False)
    weird = min_value_key(MIN_HASH_TOPIC + "#")
    specs = [("T", "AaAa BBBB", "U1", 0), ("T", "  AaAa   x ", None, 0), ("T", "BBBB", "U2", TRANSACTION_ROLLBACK),
             ("T", "AaBB", "U3", TRANSACTION_PREPARED), ("T", weird, None, 0), ("Q", "AaAa", "U1", 0),
             ("T", "", "", 0), ("T", "ключ 🚀", None, 0), ("T", "AaAa", None, 0)]
    with MessageStore(tmp_path / "s", cfg) as store:
        res = _put_keyed(store, specs)
        store.wait_dispatched(5)
        store.flush()
        # expected entries in order: (index key, phy, store time)
        expected = []
        for (topic, keys, uniq, flag), r in zip(specs, res, strict=False):
            if flag == TRANSACTION_ROLLBACK:
                continue
            for k in ([uniq] if uniq else []) + [t for t in keys.split(" ") if t]:
                expected.append((f"{topic}#{k}", r.phy_offset, r.store_timestamp))
        files = index_files(tmp_path / "s")
        assert len(files) == -(-len(expected) // (entries - 1))
        pos = 0
        prev_end = None
        for path in files:
            hdr, slot_vals, ents = read_index_file(path, slots)
            assert hdr["size"] == 40 + 4 * slots + 20 * entries
            mine = expected[pos:pos + hdr["count"] - 1]
            pos += len(mine)
            assert ents[0] == (0, 0, 0, 0)
            newest = {}
            for i, (key, phy, ts) in enumerate(mine, start=1):
                h, e_phy, diff, prev = ents[i]
                assert (h, e_phy) == (index_hash(key), phy)
                base = (prev_end or (0, 0))[1] if i == 1 else hdr["begin_ts"]
                assert diff == (max(0, (ts - base) // 1000) if base > 0 else 0)
                slot = h % slots
                assert prev == newest.get(slot, 0)
                newest[slot] = i
            assert slot_vals == [newest.get(s, 0) for s in range(slots)]
            assert hdr["slot_count"] == len(newest)
            assert (hdr["begin_phy"], hdr["begin_ts"]) == (mine[0][1], mine[0][2])
            assert (hdr["end_phy"], hdr["end_ts"]) == (mine[-1][1], mine[-1][2])
            prev_end = (hdr["end_phy"], hdr["end_ts"])
        assert pos == len(expected)
        assert index_hash(f"T#{weird}") == 0

        by = {key: [phy for k, phy, _ in expected if k == key] for key, _, _ in expected}
        for key, phys in by.items():
            topic, k = key.split("#", 1)
            got = [m.phy_offset for m in store.query_by_key(topic, k)]
            assert got == sorted(set(phys), reverse=True), key
        # RocketMQ's answer includes the colliding BBBB and AaBB entries of topic T
        t_collide = sorted(phy for k, phy, _ in expected if k in ("T#AaAa", "T#BBBB", "T#AaBB"))
        assert store.query_offsets("T", "AaAa") == t_collide
        assert store.query_offsets("T", weird) == [res[4].phy_offset]
        assert [m.phy_offset for m in store.query_by_key("T", "BBBB")] == [res[0].phy_offset]
        assert store.query_by_uniq_key("T", "U3").phy_offset == res[3].phy_offset   # PREPARED is indexed
        with pytest.raises(MessageNotFoundError):
            store.query_by_uniq_key("T", "U2")                                       # ROLLBACK is not


def test_query_limits_and_time_ranges(tmp_path):
    cfg = StoreConfig(index_slots=8, index_entries=50, warm_mapped_file=False, max_msgs_num_batch=64)
    with MessageStore(tmp_path / "s", cfg) as store:
        res = [store.put(Message("T", b"x", keys="hot")) for _ in range(120)]
        store.wait_dispatched(5)
        phys = [r.phy_offset for r in res]
        assert len(index_files(tmp_path / "s")) == 3
        assert store.query_offsets("T", "hot", max_num=10 ** 9) == phys[-64:]   # capped at 64
        assert store.query_offsets("T", "hot", max_num=5) == phys[-5:]
        assert store.query_offsets("T", "hot", max_num=0) == []
        assert store.query_offsets("T", "hot", max_num=-3) == []
        assert store.query_offsets("T", "hot", 64, begin=LONG_MAX, end=0) == []       # inverted
        assert store.query_offsets("T", "hot", 64, begin=10 ** 30, end=10 ** 40) == []  # beyond i64
        assert store.query_offsets("T", "hot", 64, begin=0, end=1) == []               # before any message
        assert store.query_offsets("T", "nope") == []
        assert store.query_by_key("T", "hot a") == []                                   # separator in key
        for bad in ("", None, 7, b"hot"):
            with pytest.raises(InvalidArgumentError):
                store.query_offsets("T", bad)
            with pytest.raises(InvalidArgumentError):
                store.query_by_key("T", bad)
        with pytest.raises(InvalidArgumentError):
            store.query_keys("T", ["hot", ""])
        assert store.query_keys("T", []) == []
    with pytest.raises(StoreClosedError):
        store.query_offsets("T", "hot")
    with MessageStore(tmp_path / "s", cfg.with_(message_index_enable=False)) as store:
        with pytest.raises(InvalidArgumentError):
            store.query_offsets("T", "hot")


# ---------------------------------------------------------------- damaged files

def _patch(path, offset, fmt, *values):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, *values))


def test_damaged_chains_terminate(clean_498, tmp_path):
    src, manifest = clean_498
    q = next(q for q in manifest["queries"][0]["queryMessage"] if q["key"] == "hot" and q["maxNum"] == 64)
    slots = 1000
    entries_at = 40 + 4 * slots
    newest = index_files(src)[-1]
    _, slot_vals, ents = read_index_file(newest, slots)
    head = slot_vals[q["slot"]]
    cases = {
        "self loop": lambda p: _patch(p, entries_at + 20 * head + 16, ">i", head),
        "forward loop": lambda p: _patch(p, entries_at + 20 * ents[head][3] + 16, ">i", head),
        "huge slot": lambda p: _patch(p, 40 + 4 * q["slot"], ">i", 0x7FFFFFFF),
        "negative slot": lambda p: _patch(p, 40 + 4 * q["slot"], ">i", -5),
        "count beyond capacity": lambda p: _patch(p, 36, ">i", 0x7FFFFFFF),
        "negative time": lambda p: _patch(p, entries_at + 20 * head + 12, ">i", -1),
        "garbage entries": lambda p: _patch(p, entries_at, "4000s", bytes(range(256)) * 15 + bytes(160)),
    }
    for name, damage in cases.items():
        root = copy_store(src, tmp_path, name.replace(" ", "_"))
        damage(index_files(root)[-1])
        with MessageStore(root, read_only=True) as store:
            got = store.query_offsets(q["topic"], q["key"])
            assert len(got) <= 64 and got == sorted(got), name
            for m in store.query_by_key(q["topic"], q["key"]):
                assert "hot" in m.keys
            store.query_keys(q["topic"], ["hot", "AaAa", "user-5"])


def test_file_of_unknown_geometry_is_refused(tmp_path):
    from rmqstore.errors import CorruptStoreError
    root = tmp_path / "s"
    MessageStore(root, StoreConfig(commitlog_file_size=1 << 16, warm_mapped_file=False,
                                   **SMALL_INDEX)).close()
    os.makedirs(root / "index", exist_ok=True)
    with open(root / "index" / "20260101000000000", "wb") as f:
        f.write(b"\0" * 1001)
    with pytest.raises(CorruptStoreError):
        MessageStore(root, read_only=True)


# ---------------------------------------------------------------- durability

def test_checkpoint_and_unclean_shutdown_cut(tmp_path):
    cfg = StoreConfig(index_slots=16, index_entries=40, warm_mapped_file=False)
    root = tmp_path / "s"
    with MessageStore(root, cfg) as store:
        first = _put_keyed(store, [("T", f"a{i} b{i}", None, 0) for i in range(30)])
        store.wait_dispatched(5)
        store.flush()
        flushed_ts = store.checkpoint.index_msg_timestamp
        assert flushed_ts == first[-1].store_timestamp
    baseline = {f: open(f, "rb").read() for f in index_files(root)}
    # pretend the last flush happened an hour earlier and the process died
    with open(root / "checkpoint", "r+b") as f:
        f.seek(16)
        f.write(struct.pack(">q", flushed_ts - 3_600_000))
    open(root / "abort", "wb").close()
    with MessageStore(root, cfg) as store:
        assert store.recovery.index_entries_dropped == 60
        store.wait_dispatched(5)
        assert [m.phy_offset for m in store.query_by_key("T", "b7")] == [first[7].phy_offset]
    # re-dispatch rebuilt exactly what was cut (the first file name is kept; later ones are new)
    rebuilt = [open(f, "rb").read() for f in index_files(root)]
    assert rebuilt == list(baseline.values())


def test_keys_of_kept_entries_survive_a_crash_that_lost_later_entries(tmp_path):
    """A crash after the index's last flush: the entries written since never reached the
    disk (zeros), while the slot page, written back, points at them. Recovery cuts the
    entries newer than the checkpoint; it followed each slot back through the cut
    entries' links, met zeros and emptied the slot, so every earlier key of that slot
    was gone for good (re-dispatch adds only the messages after the cut). The slots are
    rebuilt from the entries kept."""
    import time
    slots, hdr, cut = 4, 40, 20
    cfg = StoreConfig(index_slots=slots, index_entries=100, commitlog_file_size=1 << 16, warm_mapped_file=False)
    root = tmp_path / "s"
    with MessageStore(root, cfg) as store:
        res = _put_keyed(store, [("T", f"a{i} b{i}", None, 0) for i in range(cut)])
        time.sleep(1.1)   # the checkpoint's index time keeps what is a second older than it
        res += _put_keyed(store, [("T", f"a{i} b{i}", None, 0) for i in range(cut, 30)])
    (path,) = index_files(root)
    with open(path, "r+b") as f:   # entries 1 + 2i and 2 + 2i are message i's
        f.seek(hdr + slots * 4 + (1 + 2 * cut) * 20)
        f.write(b"\0" * (2 * (30 - cut) * 20))
    open(root / "abort", "wb").close()
    with open(root / "checkpoint", "r+b") as f:   # the index flushed up to message cut - 1
        f.seek(16)
        f.write(struct.pack(">q", res[cut].store_timestamp))
    with MessageStore(root, cfg) as store:
        assert store.recovery.index_entries_dropped == 2 * (30 - cut)
        store.wait_dispatched(5)
        for i in range(30):
            for key in (f"a{i}", f"b{i}"):
                assert [m.phy_offset for m in store.query_by_key("T", key)] == [res[i].phy_offset], key
        assert store.verify().ok


def test_a_kill_between_slot_and_header_loses_no_key(tmp_path):
    """The state a SIGKILL between put_entries' slot store and its header's leaves: the
    last entry whole, its slot pointing at it, the header's count (and last offset and
    time) one entry behind. The header looked consistent, so recovery kept the file as it
    was; the re-dispatched message's entry took the slot as invalid (not below the count)
    and dropped the chain behind it: keys of earlier messages of that slot were gone for
    good. After a crash the newest file is always truncated, its slots rebuilt."""
    slots, hdr = 4, 40
    cfg = StoreConfig(index_slots=slots, index_entries=100, commitlog_file_size=1 << 16, warm_mapped_file=False)
    root = tmp_path / "s"
    with MessageStore(root, cfg) as store:
        res = _put_keyed(store, [("T", f"k{i}", None, 0) for i in range(10)])
    (path,) = index_files(root)
    b = bytearray(open(path, "rb").read())
    bts, count = struct.unpack_from(">q", b, 0)[0], struct.unpack_from(">i", b, 36)[0]
    assert count == 11
    _, phy9, td9, _ = struct.unpack_from(">iqii", b, hdr + slots * 4 + 9 * 20)
    struct.pack_into(">q", b, 8, bts + td9 * 1000)
    struct.pack_into(">q", b, 24, phy9)
    struct.pack_into(">i", b, 36, 10)
    open(path, "wb").write(bytes(b))
    open(root / "abort", "wb").close()
    with open(root / "checkpoint", "r+b") as f:   # keyless messages after them flushed the index checkpoint
        f.seek(16)
        f.write(struct.pack(">q", res[-1].store_timestamp + 5000))
    with MessageStore(root, cfg) as store:
        store.wait_dispatched(5)
        for i in range(10):
            assert [m.phy_offset for m in store.query_by_key("T", f"k{i}")] == [res[i].phy_offset], i


def test_generate_uniq_key(tmp_path):
    cfg = StoreConfig(generate_uniq_key=True, warm_mapped_file=False, commitlog_file_size=1 << 16,
                      **SMALL_INDEX)
    with MessageStore(tmp_path / "s", cfg) as store:
        r1 = store.put(Message("T", b"a"))
        r2 = store.put(Message("T", b"b", properties={"UNIQ_KEY": "mine"}))
        store.wait_dispatched(5)
        u1 = store.get_by_offset(r1.phy_offset).uniq_key
        assert len(u1) == 32 and int(u1, 16) >= 0 and u1 == u1.upper()
        assert store.get_by_offset(r2.phy_offset).uniq_key == "mine"
        assert store.query_by_uniq_key("T", u1).phy_offset == r1.phy_offset
    with MessageStore(tmp_path / "t", cfg.with_(generate_uniq_key=False)) as store:
        r = store.put(Message("T", b"a"))
        assert store.get_by_offset(r.phy_offset).uniq_key is None


def test_query_keys_matches_a_scan_oracle(tmp_path):
    """query_keys and query_by_key against an oracle built by scanning every message: the
    messages of the topic holding the key as UNIQ_KEY or a KEYS token, newest first, once
    each; across commitlog segments and blocks of keys, with records larger than a shared
    copy's chunk, keys on several messages, a UNIQ_KEY equal to a KEYS token, another topic with the same keys
    and keys never stored. The messages outlive the store; the per-key lists are not
    GC-tracked (they hold only messages)."""
    import gc
    import random
    rng = random.Random(5)
    cfg = StoreConfig(commitlog_file_size=1 << 18, warm_mapped_file=False, **SMALL_INDEX)
    with MessageStore(tmp_path / "s", cfg) as store:
        for i in range(400):
            body = rng.randbytes(rng.choice([10, 300, 5000, 100_000 if i % 97 == 0 else 20]))
            keys = [f"k{rng.randrange(150)}" for _ in range(rng.randrange(0, 3))]
            props = {"UNIQ_KEY": keys[0]} if keys and i % 7 == 0 else {}
            store.put(Message("T" if i % 5 else "U", body, keys=keys, properties=props))
        store.wait_dispatched(5)
        assert len(store.commitlog.segments.segments) >= 3
        oracle = {}
        for m in store.scan():
            if m.topic == "T":
                for k in {*m.keys, m.uniq_key} - {None}:
                    oracle.setdefault(k, []).append(m)
        probes = ([f"k{i}" for i in range(160)] + ["k3", "nope"]) * 12    # > 2048 offsets: several blocks
        got = store.query_keys("T", probes)
        assert sum(map(len, got)) > 2048 and gc.is_tracked(got)
        for k, msgs in zip(probes, got, strict=True):
            want = sorted(oracle.get(k, []), key=lambda m: -m.phy_offset)[:64]
            assert msgs == want, k
            assert store.query_by_key("T", k) == want, k
            assert not gc.is_tracked(msgs)
        assert any(len(x) > 1 for x in got)
        cols = store.query_keys_columns("T", probes)
    assert [m.body for m in got[3]] == [m.body for m in sorted(oracle["k3"], key=lambda m: -m.phy_offset)]
    _assert_columns_are_messages(cols, got)


def _assert_columns_are_messages(cols, found):
    """query_keys_columns' rows are query_keys' messages, key by key, field by field."""
    rows = [(i, m) for i, msgs in enumerate(found) for m in msgs]
    assert cols["count"] == len(rows) and cols["key"].tolist() == [i for i, _ in rows]
    for name in ("phy_offset", "queue_id", "queue_offset", "store_timestamp", "born_timestamp", "sys_flag",
                 "body_crc", "store_size", "reconsume_times"):
        assert cols[name].tolist() == [getattr(m, name) for _, m in rows], name
    for part, attr in (("body", "body"), ("topic", "topic")):
        data, at = cols[part + "_data"], cols[part + "_offsets"]
        values = [bytes(data[at[j]:at[j + 1]]) for j in range(len(rows))]
        assert values == [getattr(m, attr) if part == "body" else m.topic.encode() for _, m in rows], part


def test_query_keys_columns_own_their_memory_and_hold_the_rows_found(tmp_path):
    """The columns own their memory (the store can close under them), are cut to the rows
    found (keys never stored, and a topic that holds none of the keys, give no row), and
    an empty key list gives empty columns."""
    cfg = StoreConfig(warm_mapped_file=False, **SMALL_INDEX)
    with MessageStore(tmp_path / "s", cfg) as store:
        for i in range(3000):
            store.put(Message("T", bytes([i % 251]) * (1 + i % 700), keys=[f"k{i}", f"g{i % 3}"]))
        store.wait_dispatched(5)
        keys = [f"k{i}" for i in range(0, 3000, 7)] + ["nope", "g1"]
        found = store.query_keys("T", keys)
        cols = store.query_keys_columns("T", keys)
        other = store.query_keys_columns("U", keys)
        empty = store.query_keys_columns("T", [])
    _assert_columns_are_messages(cols, found)
    assert len(found[-1]) == 64 and not found[-2]
    assert other["count"] == 0 and len(other["body_offsets"]) == 1 and len(other["body_data"]) == 0
    assert empty["count"] == 0 and len(empty["key"]) == 0


def test_a_clock_set_back_does_not_stall_the_next_index_file(tmp_path, monkeypatch):
    """Index files are named by creation time and must sort after the last one. With the
    clock set back two hours the name search counted up from now 1 ms at a time, past the
    last file's name: 7.2 million steps, half a minute with the dispatcher stalled (a day
    back: minutes). The next file is now named just past the last one at once."""
    import time

    from rmqstore.index import name_ms
    cfg = StoreConfig(commitlog_file_size=1 << 20, index_slots=100, index_entries=400)
    with MessageStore(tmp_path, cfg) as s:
        for i in range(300):
            s.put(Message("T", b"x", keys=f"k{i}"))
        assert s.wait_dispatched(10)
        real = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real() - 2 * 3600 * 10**9)
        for i in range(300):   # fills the first file: the next one is made under the set-back clock
            s.put(Message("T", b"x", keys=f"j{i}"))
        assert s.wait_dispatched(5)
        monkeypatch.undo()
        names = sorted(os.listdir(tmp_path / "index"))
        assert len(names) == 2 and len(s.query_by_key("T", "j299")) == 1
        assert name_ms(names[1]) - name_ms(names[0]) == 1   # just past the last, not hours on


def test_extract_keys_gives_the_newest_store_time_of_the_rows():
    """Dispatch moves indexMsgTimestamp to the newest store time of a batch's rows, keys or
    not, whatever their order (a clock set back): extract_keys returns it beside the keys."""
    import numpy as np

    from rmqstore import _index_file
    from rmqstore._read import DISPATCH_DTYPE
    rows = np.zeros(3, DISPATCH_DTYPE)
    rows["store_timestamp"] = [5_000, 9_000, 3_000]   # no properties: no keys
    hashes, phys, tss, newest = _index_file.extract_keys(b"x", rows)
    assert (len(hashes), len(phys), len(tss), newest) == (0, 0, 0, 9_000)
    assert _index_file.extract_keys(b"", rows[:0])[3] == 0


@pytest.mark.parametrize("topic,key", [(b"T", b"k1"), ("t\u00e9\U0001f600".encode(), "\u00e9k".encode()),
                                       (b"t\xe4", b"\x80k"), (b"t\xf0\x9f", b"\x98\x80")])
def test_extract_keys_hashes_topic_and_key_as_one_string(topic, key):
    """A key's hash continues from its topic's (``topic#`` is not copied before the key): the
    same as the hash of the joined string, also where the topic ends in a cut UTF-8 sequence
    or the key starts with continuation bytes (each is U+FFFD alone, never joined across '#')."""
    import numpy as np

    from rmqstore import _index_file
    from rmqstore._read import DISPATCH_DTYPE

    from reference_codec import java_hash
    props = b"UNIQ_KEY\x01" + key + b"\x02KEYS\x01" + key + b" x"
    raw = topic + props
    rows = np.zeros(1, DISPATCH_DTYPE)
    rows["topic_len"], rows["props_off"], rows["props_len"] = len(topic), len(topic), len(props)
    hashes = _index_file.extract_keys(raw, rows)[0]
    want = [abs(java_hash((topic + b"#" + k).decode("utf-8", "replace"))) for k in (key, key, b"x")]
    assert hashes.tolist() == want


def test_query_keys_reuses_copies_only_once_no_message_holds_them(tmp_path):
    """query_keys copies records into shared chunks it reuses once their messages are
    gone. Messages kept from one call stay intact through later calls over other keys,
    and a reused chunk returned by raw() (a record of exactly one chunk) hashes as its
    new bytes, not as the bytes it held before."""
    import gc
    cfg = StoreConfig(warm_mapped_file=False, **SMALL_INDEX)
    with MessageStore(tmp_path / "s", cfg) as store:
        size = store.get_by_offset(store.put(Message("T", b"x" * 1000, keys="c0")).phy_offset).store_size
        for k, fill in (("c1", b"1"), ("c2", b"2")):     # records of exactly 64 KiB
            store.put(Message("T", fill * (1000 + (1 << 16) - size), keys=k))
        for i in range(3000):
            store.put(Message("T", bytes([i % 251]) * (100 + i % 300), keys=f"k{i}"))
        store.wait_dispatched(5)
        keys = [f"k{i}" for i in range(3000)]
        kept = [found[0] for found in store.query_keys("T", keys)[::37]]
        want = [(m.phy_offset, bytes(m.raw())) for m in kept]
        for _ in range(3):
            for found in store.query_keys("T", keys[1::2] + keys[::2]):
                assert len(found) == 1
            gc.collect()
            assert [(m.phy_offset, m.raw()) for m in kept] == want
        (one,), = store.query_keys("T", ["c1"])
        raw = one.raw()
        assert len(raw) == 1 << 16 and hash(raw) == hash(bytes(bytearray(raw)))
        del one, raw
        (two,), = store.query_keys("T", ["c2"])
        raw = two.raw()
        assert raw[-(1 << 10):] != b"1" * (1 << 10)
        assert raw == store.get_by_offset(two.phy_offset).raw() and hash(raw) == hash(bytes(bytearray(raw)))


@pytest.mark.parametrize("page", [1, 2, 3, 7])
def test_query_offsets_page_walks_every_match_newest_first_in_pages(tmp_path, page):
    """Pages resumed from their tokens give every entry whose hash is the key's (colliding
    keys' included, as query_offsets), newest first, across many small index files, each
    once: the reference is the puts' keys hashed here. A token not of this index is refused."""
    cfg = StoreConfig(index_slots=3, index_entries=6, warm_mapped_file=False)   # 5 entries a file
    keys = ["hot", "AaAa", "BBBB", "hot hot", "cold", "AaAa hot"]
    with MessageStore(tmp_path / "s", cfg) as s:
        res = [s.put(Message("T", b"m%d" % i, keys=keys[i % len(keys)])) for i in range(40)]
        s.wait_dispatched(5)
        for key in ("hot", "AaAa"):
            want = []
            for r in reversed(res):
                m = s.get_by_offset(r.phy_offset)
                tokens = ([m.uniq_key] if m.uniq_key else []) + [t for t in m.properties["KEYS"].split(" ") if t]
                want += [r.phy_offset for t in tokens if index_hash(f"T#{t}") == index_hash(f"T#{key}")]
            got, token, pages = [], None, 0
            while True:
                offsets, token = s.query_offsets_page("T", key, page, resume=token)
                assert len(offsets) <= page
                got += offsets
                pages += 1
                if token is None:
                    break
            assert got == want and pages >= len(want) // page
            assert sorted(got) == sorted(s.query_offsets("T", key, 64))
        name = os.path.basename(index_files(tmp_path / "s")[0])
        for bad in ("x", "00000000000000000.1", f"{name}.7", f"{name}.-1", f"{name}.99999999999", f"{name}"):
            with pytest.raises(InvalidArgumentError):
                s.query_offsets_page("T", "hot", 4, resume=bad)


def test_query_offsets_page_reads_files_of_one_entry(tmp_path):
    """With two entries a file (the first unused), each file holds one key's entry: pages
    walk them as query_offsets does (the page walk once took such a file for empty)."""
    cfg = StoreConfig(index_slots=3, index_entries=2, warm_mapped_file=False)
    with MessageStore(tmp_path / "s", cfg) as s:
        res = [s.put(Message("T", b"m%d" % i, keys="k")) for i in range(4)]
        s.wait_dispatched(5)
        got, token = [], None
        while True:
            offsets, token = s.query_offsets_page("T", "k", 3, resume=token)
            got += offsets
            if token is None:
                break
        assert got == [r.phy_offset for r in reversed(res)] and sorted(got) == s.query_offsets("T", "k", 64)
