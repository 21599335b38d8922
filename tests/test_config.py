"""Every StoreConfig field is range-checked when the config is built (the message names the
field and the range), values read from disk are checked before use, and a store path that
is not a directory is a clear StoreError."""
import dataclasses
import json
import os
import shutil
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore import (
    CorruptStoreError,
    InvalidArgumentError,
    Message,
    MessageStore,
    MessageTooLargeError,
    StoreConfig,
    StoreError,
    StoreIOError,
    StoreNotFoundError,
)

from conftest import SMALL_INDEX

INT_MAX = (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
BASE = dict(SMALL_INDEX, commitlog_file_size=64 << 10, consume_queue_entries=100, warm_mapped_file=False)


@pytest.mark.parametrize("field, value, allowed", [
    ("index_slots", 2 ** 40, "1..536870891"),
    ("index_entries", 2 ** 40, "2..107374180"),
    ("flush_interval_ms", 10 ** 30, "1..2147483647"),
    ("flush_cq_interval_ms", 0, "1..2147483647"),
    ("default_queue_nums", 2 ** 40, "1..2147483647"),
    ("default_queue_nums", 0, "1..2147483647"),
    ("commitlog_file_size", 1 << 31, "4096..2147483647"),
    ("consume_queue_entries", 1 << 30, "1..107374182"),
    ("max_message_size", -1, "1..2147483647"),
    ("max_msgs_num_batch", 10 ** 9, "1..65535"),
    ("disk_max_used_space_ratio", 101, "0..100"),
    ("flush_least_pages", 1.5, "0..2147483647"),
    ("file_reserved_time", True, "0..2147483647"),
    ("warm_ahead_bytes", "64", "0..2147483647"),
    ("file_mode", 0o1600, "0o600..0o777"),
    ("dir_mode", 0o500, "0o700..0o777"),
])
def test_out_of_range_int_names_field_and_range(field, value, allowed):
    with pytest.raises(InvalidArgumentError, match=rf"^{field} must be an int in {allowed}, not "):
        StoreConfig(**{field: value})


@pytest.mark.parametrize("kw, words", [
    (dict(index_slots=400_000_000, index_entries=50_000_000), "index_slots and index_entries"),
    (dict(flush_mode="fast"), "flush_mode"),
    (dict(message_version=3), "message_version"),
    (dict(message_index_enable=1), "message_index_enable must be True or False"),
    (dict(store_host="nohost"), "host 'nohost'"),
    (dict(store_host=("1.2.3.4", 1)), "store_host must be a string"),
    (dict(delete_when="24"), "delete_when"),
    (dict(delete_when="04;x"), "delete_when"),
    (dict(message_delay_level=""), "at least one level"),
    (dict(message_delay_level="1s -5s"), "bad level '-5s'"),
    (dict(message_delay_level="99999999999d"), "bad level"),
    (dict(message_delay_level="1y"), "bad level '1y'"),
    (dict(file_mode=0o200 | 0o400 | 0o1000), "file_mode"),
    (dict(file_mode=0o640 & ~0o200), "file_mode"),
    (dict(dir_mode=0o600), "dir_mode"),
])
def test_other_bad_fields_are_refused_by_name(kw, words):
    with pytest.raises(InvalidArgumentError, match=words.replace("(", r"\(")):
        StoreConfig(**kw)


def test_largest_intervals_keep_the_flusher_alive(tmp_path):
    """Intervals at their maximum (about 24.8 days) sleep instead of killing the flushers."""
    cfg = StoreConfig(**BASE, flush_interval_ms=INT_MAX, flush_cq_interval_ms=INT_MAX,
                      flush_thorough_interval_ms=INT_MAX, flush_cq_thorough_interval_ms=INT_MAX,
                      default_queue_nums=INT_MAX)
    with MessageStore(tmp_path / "s", cfg) as s:
        r = s.put(Message("T", b"x"))
        for th in s.flusher._threads:
            th.join(0.2)
            assert th.is_alive()
        assert s.flusher.error is None
    with MessageStore(tmp_path / "s", cfg, read_only=True) as s:
        assert s.get_by_offset(r.phy_offset).body == b"x"


_VALUES = st.one_of(
    st.integers(), st.integers(-(1 << 70), 1 << 70), st.integers(-2, 5), st.booleans(), st.none(),
    st.floats(allow_nan=True), st.text(max_size=12), st.binary(max_size=4),
    st.sampled_from(["sync", "async", "04", "04;05", "127.0.0.1:10911", "[::1]:1", "1s 2m", "3d", 0o600, 0o700,
                     0o777, INT_MAX, INT_MAX + 1, 4096, 107374182, 536870891]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_field_value_builds_a_working_config_or_is_refused(data):
    """Property: each field set to any value either gives a config that opens a store (put,
    close, reopen) or raises InvalidArgumentError. A max_message_size below one record
    refuses the put, as it should, and the store still reopens."""
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(StoreConfig)]), label="field")
    value = data.draw(_VALUES, label="value")
    try:
        cfg = StoreConfig(**{**BASE, field: value})
    except InvalidArgumentError:
        return
    d = tempfile.mkdtemp(prefix="rmq-cfg-")
    try:
        with MessageStore(os.path.join(d, "s"), cfg) as s:
            try:
                r = s.put(Message("T", b"x", keys="k"))
            except MessageTooLargeError:
                assert field == "max_message_size" and value < 100
                r = None
        with MessageStore(os.path.join(d, "s"), cfg) as s:
            assert s.verify().ok
            if r is not None:
                assert s.get_by_offset(r.phy_offset).body == b"x"
    finally:
        shutil.rmtree(d)


# -- values read from disk ---------------------------------------------------------------
def _written(tmp_path):
    root = tmp_path / "s"
    with MessageStore(root, StoreConfig(**BASE)) as s:
        offsets = [s.put(Message("T", f"m{i}".encode(), keys=f"k{i}"), queue_id=0).phy_offset for i in range(5)]
        s.commit_offset("g", "T", 0, 2)
    return root, offsets


@pytest.mark.parametrize("stamp", [LONG_MIN, LONG_MAX, -1, 1 << 60], ids=["min", "max", "minus1", "far-future"])
def test_checkpoint_timestamps_out_of_range_with_abort(tmp_path, stamp):
    """Long.MIN_VALUE (or any time no store can hold) in every checkpoint slot, plus an abort
    file: the writer opens, recovers from the first segment and keeps every message."""
    root, offsets = _written(tmp_path)
    page = bytearray((root / "checkpoint").read_bytes())
    struct.pack_into(">qqq", page, 0, stamp, stamp, stamp)
    (root / "checkpoint").write_bytes(bytes(page))
    (root / "abort").write_bytes(b"\xff" * 100)   # the contents of abort are never used
    with MessageStore(root, StoreConfig(**BASE), read_only=True) as s:   # verify names the bad times
        problems = [(p.kind, p.offset) for p in s.verify().problems]
        assert problems == [("checkpoint", 0), ("checkpoint", 8), ("checkpoint", 16)]
    with MessageStore(root, StoreConfig(**BASE)) as s:
        assert not s.clean_shutdown
        assert [s.get_by_offset(o).body for o in offsets] == [f"m{i}".encode() for i in range(5)]
        s.put(Message("T", b"after"))
        s.flush()
        assert s.verify().ok
    cp = struct.unpack_from(">qqq", (root / "checkpoint").read_bytes())
    assert all(0 < t < 1 << 52 for t in cp), cp   # rewritten with real store times


@pytest.mark.parametrize("table", [
    [], {"T@g": []}, {"T@g": {"x": 1}}, {"T@g": {"0": "5"}}, {"T@g": {"0": 1.5}}, {"T@g": {"0": True}},
    {"T@g": {"0": 1 << 64}}, {"T@g": {"0": -2}}, {"T@g": {"-1": 3}}, {"T@g": {"4294967296": 3}},
    {"T@g": {"٣": 3}}, {"T@g": {"0": None}},
], ids=repr)
def test_bad_consumer_offsets_are_corrupt_store_errors(tmp_path, table):
    root, _ = _written(tmp_path)
    (root / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": table}))
    with pytest.raises(CorruptStoreError, match="consumerOffset.json"):
        MessageStore(root, StoreConfig(**BASE))


def test_deeply_nested_consumer_offsets_are_corrupt(tmp_path):
    root, _ = _written(tmp_path)
    (root / "config" / "consumerOffset.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorruptStoreError):
        MessageStore(root, StoreConfig(**BASE), read_only=True)


def test_consumer_offsets_at_their_limits_load(tmp_path):
    root, _ = _written(tmp_path)
    (root / "config" / "consumerOffset.json").write_text(
        '{"offsetTable": {"T@g": {"0": -1, "2147483647": 9223372036854775807}}}')
    with MessageStore(root, StoreConfig(**BASE), read_only=True) as s:
        assert s.committed_offset("g", "T", 0) == -1
        assert s.committed_offset("g", "T", INT_MAX) == LONG_MAX


def _offsets_file(root, suffix=""):
    with open(root / "config" / f"consumerOffset.json{suffix}", encoding="utf-8") as f:
        return json.load(f)["offsetTable"]


def test_consumer_offsets_keep_the_version_they_replace_in_bak(tmp_path):
    """As a broker's MixAll.string2File: each persist first keeps the file it replaces in
    consumerOffset.json.bak (the first one, with nothing to replace, keeps none)."""
    root, _ = _written(tmp_path)   # committed 2 and closed: one persist
    assert _offsets_file(root) == {"T@g": {"0": 2}}
    assert not (root / "config" / "consumerOffset.json.bak").exists()
    with MessageStore(root, StoreConfig(**BASE)) as s:
        s.commit_offset("g", "T", 0, 4)
    assert _offsets_file(root) == {"T@g": {"0": 4}} and _offsets_file(root, ".bak") == {"T@g": {"0": 2}}
    with MessageStore(root, StoreConfig(**BASE)) as s:
        s.commit_offset("g", "T", 0, 5)
    assert _offsets_file(root) == {"T@g": {"0": 5}} and _offsets_file(root, ".bak") == {"T@g": {"0": 4}}


def test_consumer_offsets_keep_the_members_a_broker_writes_beside_the_table(tmp_path):
    """A 5.x broker's consumerOffset.json also holds dataVersion and pullOffsetTable; a
    commit rewrote the file with the offsetTable alone, dropping them from the broker's
    config. They are now written back as read, in the file's order."""
    root, _ = _written(tmp_path)
    path = root / "config" / "consumerOffset.json"
    version = {"counter": 7, "stateVersion": 0, "timestamp": 1700000000000}
    pulls = {"T@g": {"0": 2}}
    path.write_text(json.dumps({"dataVersion": version, "offsetTable": {"T@g": {"0": 2}, "%RETRY%g@g": {"0": 1}},
                                "pullOffsetTable": pulls}))
    with MessageStore(root, StoreConfig(**BASE)) as s:
        s.commit_offset("g", "T", 0, 4)
    with open(path) as f:
        doc = json.load(f)
    assert list(doc) == ["dataVersion", "offsetTable", "pullOffsetTable"]
    assert doc["dataVersion"] == version and doc["pullOffsetTable"] == pulls
    assert doc["offsetTable"] == {"T@g": {"0": 4}, "%RETRY%g@g": {"0": 1}}


@pytest.mark.parametrize("damage", [None, b"", b"{garbage", b"[]", b'{"offsetTable": {"T@g": {"0": "x"}}}'],
                         ids=["missing", "empty", "garbage", "list", "bad-offset"])
def test_unreadable_consumer_offsets_give_way_to_bak(tmp_path, caplog, damage):
    """A missing or unreadable consumerOffset.json was an error (or, missing, no offsets at
    all: a broker that stops between its delete and rename leaves only the .bak). As
    RocketMQ's ConfigManager does, the .bak now stands in, with a warning, and the next
    persist writes the file again."""
    root, _ = _written(tmp_path)
    with MessageStore(root, StoreConfig(**BASE)) as s:
        s.commit_offset("g", "T", 0, 4)   # .bak: 2, file: 4
    main = root / "config" / "consumerOffset.json"
    main.unlink()
    if damage is not None:
        main.write_bytes(damage)
    with MessageStore(root, StoreConfig(**BASE), read_only=True) as s:
        assert s.committed_offset("g", "T", 0) == 2
    assert "consumerOffset.json.bak" in caplog.text
    assert main.exists() == (damage is not None)   # a read-only open writes nothing
    with MessageStore(root, StoreConfig(**BASE)) as s:
        assert s.committed_offset("g", "T", 0) == 2
        s.commit_offset("g", "T", 1, 7)
    assert _offsets_file(root) == {"T@g": {"0": 2, "1": 7}} and _offsets_file(root, ".bak") == {"T@g": {"0": 2}}


@pytest.mark.parametrize("main,bak", [(b"{garbage", b"{garbage"), (b"{garbage", None), (None, b"[1]"),
                                      ("dir", b'{"offsetTable": {}}')], ids=["both-bad", "no-bak", "bad-bak", "dir"])
def test_consumer_offsets_with_no_good_version_are_corrupt(tmp_path, main, bak):
    """No readable version: CorruptStoreError naming the file (a directory, FIFO or link in
    its place is refused, never stood in for), and nothing rewritten."""
    root, _ = _written(tmp_path)
    cfg = root / "config"
    (cfg / "consumerOffset.json").unlink()
    for name, content in (("consumerOffset.json", main), ("consumerOffset.json.bak", bak)):
        if content == "dir":
            (cfg / name).mkdir()
        elif content is not None:
            (cfg / name).write_bytes(content)
    before = {p.name: p.read_bytes() for p in cfg.iterdir() if p.is_file()}
    with pytest.raises(CorruptStoreError, match="consumerOffset.json"):
        MessageStore(root, StoreConfig(**BASE))
    assert {p.name: p.read_bytes() for p in cfg.iterdir() if p.is_file()} == before


# -- the store path ----------------------------------------------------------------------
@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "read-only"])
def test_store_path_that_is_a_file(tmp_path, read_only):
    path = tmp_path / "afile"
    path.write_bytes(b"not a store")
    with pytest.raises(StoreIOError, match="Not a directory") as e:
        MessageStore(path, StoreConfig(**BASE), read_only=read_only)
    assert isinstance(e.value, StoreError) and e.value.filename == str(path)
    assert path.read_bytes() == b"not a store"


def test_missing_store_read_only(tmp_path):
    with pytest.raises(StoreNotFoundError) as e:
        MessageStore(tmp_path / "missing", read_only=True)
    assert isinstance(e.value, StoreError) and isinstance(e.value, FileNotFoundError)
    assert not (tmp_path / "missing").exists()


def test_store_path_below_a_file(tmp_path):
    (tmp_path / "afile").write_bytes(b"")
    with pytest.raises(StoreError):
        MessageStore(tmp_path / "afile" / "s", StoreConfig(**BASE))
