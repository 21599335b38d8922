"""Record codec: the Cython kernel against the pure-Python reference written from DESIGN.md.
Encode/decode roundtrips both ways, bad and corrupt records, Java hashCode, msgId, hosts."""
import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore import CorruptRecordError, InvalidArgumentError, Message, _encode, _read, _record
from rmqstore._segment import MappedSegment

import reference_codec as ref

SEG_SIZE = 1 << 20


# ---------------------------------------------------------------------------- codecs

class KernelCodec:
    name = "kernel"

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.n = 0

    def encode(self, topic, body, props, *, queue_id=0, queue_offset=0, sys_flag=0, flag=0, born_timestamp=0,
               born_host="127.0.0.1:1", store_timestamp=0, store_host="127.0.0.1:10911", reconsume_times=0,
               prepared_transaction_offset=0, version=1, phy_offset=0):
        self.n += 1
        seg = MappedSegment(self.dir / f"seg{self.n}", phy_offset, SEG_SIZE, create=True)
        try:
            seg.wrote_pos = 0
            msg = Message(topic, body, properties=props, flag=flag, sys_flag=sys_flag,
                          born_timestamp=born_timestamp, born_host=born_host, reconsume_times=reconsume_times,
                          prepared_transaction_offset=prepared_transaction_offset)
            r = _encode.append_message(seg, msg, topic, dict(props), queue_id, queue_offset, store_timestamp,
                                      _record.pack_host(store_host), version, 4 << 20)
            assert r.phy_offset == phy_offset
            return seg.read(0, r.size)
        finally:
            seg.close()

    @staticmethod
    def decode(data, offset=0, check_crc=False):
        m = _read.decode_bytes(data, offset, check_crc)
        return {"store_size": m.store_size, "magic": m.magic, "body_crc": m.body_crc, "queue_id": m.queue_id,
                "flag": m.flag, "queue_offset": m.queue_offset, "phy_offset": m.phy_offset, "sys_flag": m.sys_flag,
                "born_timestamp": m.born_timestamp, "born_host": m.born_host, "store_timestamp": m.store_timestamp,
                "store_host": m.store_host, "reconsume_times": m.reconsume_times,
                "prepared_transaction_offset": m.prepared_transaction_offset, "body": m.body, "topic": m.topic,
                "properties": m.properties, "properties_raw": m.properties_raw, "msg_id": m.msg_id,
                "tags_code": m.tags_code, "version": m.version}


class ReferenceCodec:
    name = "reference"

    def __init__(self, tmp_path):
        pass

    @staticmethod
    def encode(topic, body, props, **kw):
        return ref.encode_record(topic, body, props, **kw)

    @staticmethod
    def decode(data, offset=0, check_crc=False):
        r = ref.decode_record(data, 0, offset)
        if isinstance(r, tuple):
            raise ref.RefCorrupt("no message", offset)
        if check_crc and ref.body_crc(r["body"]) != r["body_crc"]:
            raise ref.RefCorrupt("crc", offset)
        return r


@pytest.fixture(params=[KernelCodec, ReferenceCodec], ids=lambda c: c.name)
def encoder(request, tmp_path):
    return request.param(tmp_path)


@pytest.fixture(params=[KernelCodec, ReferenceCodec], ids=lambda c: c.name)
def decoder(request, tmp_path):
    return request.param(tmp_path)


FIELDS = ("store_size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "phy_offset", "sys_flag",
          "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
          "prepared_transaction_offset", "body", "topic", "properties", "properties_raw", "msg_id", "tags_code",
          "version")

SAMPLE = dict(queue_id=3, queue_offset=77, sys_flag=0x8, flag=-5, born_timestamp=1_700_000_000_123,
              born_host="192.168.7.1:50000", store_timestamp=1_795_281_655_188, store_host="10.0.0.1:10911",
              reconsume_times=2, prepared_transaction_offset=4242, phy_offset=262144)


def test_layout_by_hand(encoder):
    """Byte positions of the v1 layout, computed from DESIGN.md."""
    body = b"hello"
    raw = encoder.encode("TopicA", body, {"TAGS": "TagA", "KEYS": "k1 k2"}, **SAMPLE)
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2"
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + len(body) + 1 + 6 + 2 + len(props)
    assert len(raw) == total
    assert struct.unpack_from(">iiiii", raw, 0) == (total, -626843481, zlib.crc32(body) & 0x7FFFFFFF, 3, -5)
    assert struct.unpack_from(">qqiq", raw, 20) == (77, 262144, 0x8, 1_700_000_000_123)
    assert raw[48:56] == bytes([192, 168, 7, 1]) + (50000).to_bytes(4, "big")
    assert struct.unpack_from(">q", raw, 56)[0] == 1_795_281_655_188
    assert raw[64:72] == bytes([10, 0, 0, 1]) + (10911).to_bytes(4, "big")
    assert struct.unpack_from(">iqi", raw, 72) == (2, 4242, 5)
    assert raw[88:93] == body
    assert raw[93] == 6 and raw[94:100] == b"TopicA"
    assert struct.unpack_from(">h", raw, 100)[0] == len(props) and raw[102:] == props


def test_v2_layout_by_hand(encoder):
    topic = "T" * 200
    raw = encoder.encode(topic, b"x", {}, version=2)
    assert struct.unpack_from(">i", raw, 4)[0] == -626843477
    body_end = 84 + 4 + 1
    assert struct.unpack_from(">h", raw, body_end)[0] == 200
    assert raw[body_end + 2:body_end + 202] == topic.encode()
    assert raw[-2:] == b"\0\0"


def test_cross_roundtrip(encoder, decoder):
    props = {"TAGS": "标签", "KEYS": "a b", "UNIQ_KEY": "0A0000", "p_uni": "värde-ü-値", "empty": ""}
    raw = encoder.encode("主题-Unicode-テスト-🚀", b"\x00\x01body" * 50, props, **SAMPLE)
    m = decoder.decode(raw, SAMPLE["phy_offset"], check_crc=True)
    assert m["topic"] == "主题-Unicode-テスト-🚀"
    assert m["body"] == b"\x00\x01body" * 50
    assert m["properties"] == {k: v for k, v in props.items() if v}   # RocketMQ drops empty values
    assert m["born_host"] == "192.168.7.1:50000" and m["store_host"] == "10.0.0.1:10911"
    assert m["msg_id"] == "0A00000100002A9F" + "%016X" % SAMPLE["phy_offset"]
    assert m["tags_code"] == ref.java_hash("标签")
    for k in ("queue_id", "queue_offset", "flag", "born_timestamp", "store_timestamp", "reconsume_times",
              "prepared_transaction_offset", "phy_offset"):
        assert m[k] == SAMPLE[k], k


def test_kernel_and_reference_encode_identical_bytes(tmp_path):
    kw = dict(SAMPLE, born_host="[fd00::1]:7", store_host="[2001:db8::2]:10911")
    props = {"TAGS": "TagA", "KEYS": "k", "x": "y"}
    a = KernelCodec(tmp_path).encode("TopicB-orders", b"payload", props, **kw)
    b = ReferenceCodec.encode("TopicB-orders", b"payload", props, **kw)
    assert a == b
    assert struct.unpack_from(">i", a, 36)[0] == 0x8 | 0x10 | 0x20


def test_trailing_separator_read_both(decoder, encoder):
    """4.9 writes no trailing \\x02, 5.x does: both decode to the same properties."""
    raw = ref.encode_record("T", b"", {"TAGS": "A", "k": "v"}, trailing_separator=True)
    assert raw.endswith(b"\x02")
    m = decoder.decode(raw)
    assert m["properties"] == {"TAGS": "A", "k": "v"}
    assert m["tags_code"] == ref.java_hash("A")


hosts = st.one_of(
    st.tuples(st.ip_addresses(v=4), st.integers(0, 65535)).map(lambda t: f"{t[0]}:{t[1]}"),
    st.tuples(st.ip_addresses(v=6), st.integers(0, 65535)).map(lambda t: f"[{t[0]}]:{t[1]}"))
prop_text = st.text(st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topic=st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True) | st.text(
           st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=30)
       .filter(lambda t: len(t.encode()) <= 127),
       body=st.binary(max_size=600),
       props=st.dictionaries(prop_text.filter(bool), prop_text, max_size=5),
       born=hosts, store=hosts, qid=st.integers(0, 2**31 - 1), qoff=st.integers(0, 2**63 - 1),
       sys_flag=st.sampled_from([0, 1, 4, 8, 12, 13]), flag=st.integers(-2**31, 2**31 - 1),
       ts=st.integers(0, 2**62), phy=st.integers(0, 2**40), version=st.sampled_from([1, 2]))
def test_roundtrip_property(tmp_path, topic, body, props, born, store, qid, qoff, sys_flag, flag, ts, phy, version):
    kw = dict(queue_id=qid, queue_offset=qoff, sys_flag=sys_flag, flag=flag, born_timestamp=ts + 1,
              born_host=born, store_timestamp=ts, store_host=store, phy_offset=phy, version=version)
    raw = KernelCodec(tmp_path).encode(topic, body, props, **kw)
    assert raw == ReferenceCodec.encode(topic, body, props, **kw)
    k = KernelCodec.decode(raw, phy, check_crc=True)
    r = ReferenceCodec.decode(raw, phy, check_crc=True)
    for f in FIELDS:
        assert k[f] == r[f], f
    assert k["topic"] == topic and k["body"] == body
    assert k["properties"] == {a: b for a, b in props.items() if b}
    assert k["sys_flag"] & 0xF == sys_flag
    assert k["born_host"] == ref.format_host(ref.pack_host(born)[:-4], int(born.rpartition(":")[2]))
    assert k["msg_id"] == ref.msg_id(ref.pack_host(store), phy)
    assert k["version"] == version


# ---------------------------------------------------------------------------- bad input

def _valid(tmp_path):
    return ReferenceCodec.encode("TopicA", b"some body bytes", {"TAGS": "A", "KEYS": "x y"}, **SAMPLE)


def _patch(raw, off, fmt, value):
    b = bytearray(raw)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


BODYLEN_AT = 84


@pytest.mark.parametrize("case", ["truncated", "bad_magic", "total_too_big", "total_negative", "total_tiny",
                                  "bodylen_too_big", "bodylen_negative", "topiclen_past_end",
                                  "propslen_mismatch", "propslen_negative"])
def test_corrupt_records_raise_with_offset(tmp_path, decoder, case):
    raw = _valid(tmp_path)
    n = len(raw)
    blen = 15
    bad = {
        "truncated": raw[:n - 5],
        "bad_magic": _patch(raw, 4, ">i", 0x12345678),
        "total_too_big": _patch(raw, 0, ">i", n + 100),
        "total_negative": _patch(raw, 0, ">i", -50),
        "total_tiny": _patch(raw, 0, ">i", 20)[:20],
        "bodylen_too_big": _patch(raw, BODYLEN_AT, ">i", 10_000),
        "bodylen_negative": _patch(raw, BODYLEN_AT, ">i", -1),
        "topiclen_past_end": _patch(raw, BODYLEN_AT + 4 + blen, ">B", 250),
        "propslen_mismatch": _patch(raw, BODYLEN_AT + 4 + blen + 1 + 6, ">h", 3),
        "propslen_negative": _patch(raw, BODYLEN_AT + 4 + blen + 1 + 6, ">h", -3),
    }[case]
    exc = CorruptRecordError if decoder.name == "kernel" else ref.RefCorrupt
    with pytest.raises(exc) as ei:
        decoder.decode(bad, 123456)
    assert ei.value.offset == 123456
    if decoder.name == "kernel":
        assert "123456" in str(ei.value)


def test_crc_mismatch_detected_only_when_asked(tmp_path):
    raw = bytearray(_valid(tmp_path))
    raw[BODYLEN_AT + 4] ^= 0xFF
    assert KernelCodec.decode(bytes(raw), 9)["body"][0] == ord("s") ^ 0xFF
    with pytest.raises(CorruptRecordError) as ei:
        KernelCodec.decode(bytes(raw), 9, check_crc=True)
    assert ei.value.offset == 9


def test_seeded_corruption_agrees_with_reference(tmp_path):
    """Flip random bytes of valid records: the kernel either decodes exactly what the
    reference decodes or raises CorruptRecordError when the reference rejects it."""
    rng = random.Random(20261121)
    base = [_valid(tmp_path),
            ReferenceCodec.encode("T" * 200, b"\xff" * 40, {"a": "b"}, version=2, born_host="[::1]:1",
                                  store_host="[fd00::2]:10911")]
    outcomes = {"ok": 0, "rejected": 0}
    for i in range(1500):
        raw = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if rng.random() < 0.2:
            raw = raw[:rng.randrange(len(raw))]
        raw = bytes(raw)
        try:
            want = ReferenceCodec.decode(raw, i)
        except ref.RefCorrupt:
            want = None
        try:
            got = KernelCodec.decode(raw, i)
        except CorruptRecordError as e:
            assert e.offset == i
            got = None
        if want is None or got is None:
            # the kernel is at least as strict as the reference (it also rejects total < 91)
            assert got is None, (i, raw.hex())
            outcomes["rejected"] += 1
            continue
        outcomes["ok"] += 1
        for f in FIELDS:
            assert got[f] == want[f], (i, f)
    assert outcomes["ok"] > 100 and outcomes["rejected"] > 100, outcomes


def test_blank_and_end_are_not_messages():
    blank = struct.pack(">ii", 64, -875286124) + bytes(56)
    with pytest.raises(CorruptRecordError):
        _read.decode_bytes(blank, 0)
    assert ref.decode_record(blank) == ("blank", 64)
    with pytest.raises(CorruptRecordError):
        _read.decode_bytes(bytes(100), 0)
    assert ref.decode_record(bytes(100)) == ("end", 0)


# ---------------------------------------------------------------------------- hashes, ids, hosts

@pytest.mark.parametrize("impl", [_record.java_hash, ref.java_hash], ids=["kernel", "reference"])
def test_java_hash(impl):
    assert impl("") == 0
    assert impl("a") == 97
    assert impl("Aa") == impl("BB") == 31 * 65 + 97 == 2112
    assert len({impl(k) for k in ("AaAa", "AaBB", "BBAa", "BBBB")}) == 1
    # "hello": sum of c * 31^(n-1-i), wrapped to int32 (99162322, known Java value)
    h = 0
    for c in "hello":
        h = (h * 31 + ord(c)) & 0xFFFFFFFF
    assert impl("hello") == h == 99162322
    # non-BMP: hashed as the UTF-16 surrogate pair D83D DE80
    assert impl("🚀") == 31 * 0xD83D + 0xDE80
    # overflow wraps to a negative int32
    long = "z" * 20
    assert impl(long) < 0 or impl(long) == ref.java_hash(long)


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_java_hash_kernel_matches_reference(s):
    assert _record.java_hash(s) == ref.java_hash(s)
    assert _record.java_hash(s.encode()) == ref.java_hash(s)


def test_java_hash_ascii_runs_around_other_characters():
    """The kernel takes 8 ASCII bytes at a time, then 4: runs of every length, cut by a multi-byte
    character (or a byte that is not UTF-8) anywhere, hash as one character at a time does."""
    text = "the quick brown fox#key-0123456789"
    for n in range(len(text) + 1):
        for mid in ("", "é", "标", "🚀"):
            for cut in range(0, n + 1, 3):
                s = text[:cut] + mid + text[cut:n]
                assert _record.java_hash(s) == _record.java_hash(s.encode()) == ref.java_hash(s)
        half = n // 2
        bad = text[:half].encode() + b"\xff" + text[half:n].encode()
        assert _record.java_hash(bad) == ref.java_hash(text[:half] + "\ufffd" + text[half:n])


def test_crc32_body():
    assert _record.crc32_body(b"") == 0
    assert _record.crc32_body(b"123456789") == 0xCBF43926 & 0x7FFFFFFF


def test_msg_id_roundtrip_ipv4_and_ipv6():
    h4 = _record.pack_host("10.0.0.1:10911")
    assert h4 == bytes([10, 0, 0, 1, 0, 0, 0x2A, 0x9F])
    mid = _record.msg_id(h4, 262144)
    assert mid == "0A00000100002A9F0000000000040000" and len(mid) == 32
    assert _record.parse_msg_id(mid) == (h4, 262144)
    assert _record.parse_msg_id(mid.lower()) == (h4, 262144)
    h6 = _record.pack_host("[fd00::2]:10911")
    assert len(h6) == 20
    mid6 = _record.msg_id(h6, 7)
    assert len(mid6) == 56 and mid6 == "FD000000000000000000000000000002" + "00002A9F" + "%016X" % 7
    assert _record.parse_msg_id(mid6) == (h6, 7)
    assert _record.pack_host(("fd00::2", 10911)) == h6
    assert _record.pack_host("/10.0.0.1:10911") == h4


@pytest.mark.parametrize("bad", ["", "XYZ", "0A00", "0A00000100002A9F00000000000400", "G" * 32])
def test_parse_msg_id_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        _record.parse_msg_id(bad)


@pytest.mark.parametrize("bad", ["10.0.0.1", "nohost:1", "10.0.0.1:-1", "[::1]:x", "1.2.3.4:99999999999",
                                 # int() took these ports; a tuple of another length or a port of
                                 # another type was a bare ValueError/TypeError, a float one truncated
                                 "1.2.3.4:1_000", "1.2.3.4: 12", "1.2.3.4:+5", "1.2.3.4:\u0661\u0662",
                                 ("1.2.3.4",), ("1.2.3.4", 1, 2), ("1.2.3.4", None), ("1.2.3.4", 1.7),
                                 ("1.2.3.4", "12"), ("1.2.3.4", True), (None, 5), b"1.2.3.4:5", 5])
def test_pack_host_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        _record.pack_host(bad)
    with pytest.raises(InvalidArgumentError):
        Message("T", b"x", born_host=bad)


@given(st.lists(st.sampled_from(["TAGS", "TAGSX", "XTAGS", "TAG", "KEYS", "\x01", "\x02", "A", "b c", "值"]),
                max_size=14))
@settings(max_examples=400, deadline=None)
def test_tags_code_of_any_properties_string_matches_reference(parts):
    """The kernel's property lookup (the consume-queue tags code) on properties strings with
    repeated, empty, prefixed and separator-holding pairs, against RocketMQ's map rules in
    the reference parser (last non-empty value wins)."""
    props = "".join(parts).encode()
    raw = bytearray(ref.encode_record("T", b"body", {}))
    assert raw[-2:] == b"\0\0"
    raw[-2:] = struct.pack(">h", len(props)) + props
    raw[0:4] = struct.pack(">i", len(raw))
    tags = ref.parse_properties(props).get("TAGS")
    assert _read.decode_bytes(bytes(raw), 0, True).tags_code == (ref.java_hash(tags) if tags else 0)


def test_scan_dispatch_rows_point_at_each_records_topic_and_properties(tmp_path):
    # Records laid out by the reference encoder (v1 and v2, an empty properties string, a
    # large body): every row names its record's fields, and ``raw`` holds exactly the
    # topics and properties strings, in record order, and no body byte.
    recs = [("TopicA", b"a" * 100, {"TAGS": "t1", "KEYS": "k1 k2"}, 1),
            ("B", b"\x00" * 70_000, {}, 1),
            ("TopicC" * 40, b"c", {"UNIQ_KEY": "U1", "DELAY": "3"}, 2)]
    buf, pos = bytearray(), 0
    for i, (topic, body, props, version) in enumerate(recs):
        raw = ref.encode_record(topic, body, props, queue_id=i, queue_offset=10 + i, phy_offset=pos,
                                store_timestamp=1_700_000_000_000 + i, version=version)
        buf += raw
        pos += len(raw)
    path = tmp_path / "seg"
    path.write_bytes(bytes(buf) + b"\x00" * 4096)
    seg = MappedSegment(str(path), 0, len(buf) + 4096)
    try:
        rows, raw, end, status = _read.scan_dispatch(seg, 0, len(buf) + 4096)
    finally:
        seg.close()
    assert (end, status) == (len(buf), _record.Status.END)
    props_bytes = [ref.encode_properties(p) for _, _, p, _ in recs]
    assert raw == b"".join(t.encode() + p for (t, _, _, _), p in zip(recs, props_bytes, strict=True))
    for row, (topic, _, props, _), pb in zip(rows, recs, props_bytes, strict=True):
        assert raw[row["topic_off"]:row["topic_off"] + row["topic_len"]] == topic.encode()
        assert raw[row["props_off"]:row["props_off"] + row["props_len"]] == pb
        assert _record.properties_from(raw, int(row["props_off"]), int(row["props_len"])) == props
    assert rows["queue_offset"].tolist() == [10, 11, 12]
    assert rows["store_timestamp"].tolist() == [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002]
