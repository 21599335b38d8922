"""The Arrow kernel (rmqstore._arrow via batch.iter_arrow / batch.to_arrow) against the row
decoder (MessageExt) on every record of the RocketMQ fixtures, projections, UTF-8 repair
and IPv6 hosts."""
import gc
import os
import random
import shutil
import string
from datetime import datetime, timezone

import numpy as np
import pytest

from rmqstore import MessageStore, StoreConfig, batch
from rmqstore._message import Message
from rmqstore._read import decode_record
from rmqstore._segment import MappedSegment
from rmqstore.errors import InvalidArgumentError

from conftest import CLEAN_498, CRASHED_498, SMALL_INDEX, V2_533

pa = pytest.importorskip("pyarrow")
STORES = {"498-clean": CLEAN_498, "498-crashed": CRASHED_498, "533-v2": V2_533}


def _row(m, store):
    """What the Arrow columns must hold for MessageExt ``m``, from the row decoder."""
    props = m.properties
    keys = props.get("KEYS")

    def ts(ms):
        return datetime.fromtimestamp(ms / 1000, timezone.utc)
    return dict(store=store, topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset,
                phy_offset=m.phy_offset, store_size=m.store_size, msg_id=m.msg_id, tags=props.get("TAGS"),
                keys=None if keys is None else [k for k in keys.split(" ") if k], uniq_key=props.get("UNIQ_KEY"),
                properties=props, body=bytes(m.body), body_crc=m.body_crc, sys_flag=m.sys_flag, flag=m.flag,
                born_timestamp=ts(m.born_timestamp), store_timestamp=ts(m.store_timestamp),
                born_host=m.born_host, store_host=m.store_host, reconsume_times=m.reconsume_times)


def _rows_by_row_decoder(store):
    """Every record of a store, decoded one by one (positions from the skip-mode scan)."""
    out = []
    for path, base, _ in batch.segment_files(store):
        seg = MappedSegment(path, base, 0, readonly=True)
        try:
            for cols in batch.iter_columns(path, base, mode="skip"):
                out += [_row(decode_record(seg, o - base, seg.size), str(store)) for o in cols["phy_offset"].tolist()]
        finally:
            seg.close()
    return out


def _normalize(rows):
    for r in rows:
        if r.get("properties") is not None:
            r["properties"] = dict(r["properties"])
    return rows


def _arrow_rows(store, columns=None, batch_bytes=4 << 20):
    bs = [rb for p, b, _ in batch.segment_files(store)
          for rb in batch.iter_arrow(p, b, store=store, columns=columns, mode="skip", batch_bytes=batch_bytes)]
    for rb in bs:   # the null counts the builder passes along agree with the values
        assert [c.null_count for c in rb.columns] == [c.to_pylist().count(None) for c in rb.columns]
    return _normalize(pa.Table.from_batches(bs).to_pylist()), bs


@pytest.fixture(scope="module", params=sorted(STORES))
def fixture_rows(request):
    store = STORES[request.param] / "store"
    if not store.is_dir():
        pytest.skip(f"fixture store {store} not available")
    return store, _rows_by_row_decoder(store)


def test_iter_arrow_equals_row_decoder(fixture_rows):
    store, expected = fixture_rows
    got, batches = _arrow_rows(store)
    assert len(expected) > 100
    assert got == expected
    for rb in batches:
        rb.validate(full=True)
        assert rb.schema == batch.arrow_schema()


def test_to_arrow_equals_iter_arrow(fixture_rows):
    store, expected = fixture_rows
    got = [r for p, b, _ in batch.segment_files(store) for c in batch.iter_columns(p, b, mode="skip", batch_bytes=5000)
           for r in _normalize(batch.to_arrow(c, store).to_pylist())]
    assert got == expected


def test_projection_equals_full_columns(fixture_rows):
    store, expected = fixture_rows
    rng = random.Random(13)
    names = list(batch.arrow_schema().names)
    for k in (1, 3, 5, 12):
        columns = rng.sample(names, k)
        got, batches = _arrow_rows(store, columns, batch_bytes=7777)
        assert all(rb.schema.names == columns for rb in batches)
        assert got == [{c: r[c] for c in columns} for r in expected]


def test_unknown_column_is_an_error(clean_498):
    store, _ = clean_498
    path, base, _ = batch.segment_files(store)[0]
    with pytest.raises(InvalidArgumentError, match="nope"):
        next(batch.iter_arrow(path, base, columns=["topic", "nope"]))


def test_invalid_utf8_is_replaced_like_the_row_decoder(clean_498, tmp_path):
    store, manifest = clean_498
    m = min(manifest["messages"], key=lambda m: m["commitLogOffset"])
    path, base, _ = batch.segment_files(store)[0]
    copy = tmp_path / "commitlog" / os.path.basename(path)
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    seg = MappedSegment(str(copy), base, 0, readonly=True)
    rec = decode_record(seg, m["commitLogOffset"] - base, seg.size)
    raw = rec.raw()
    seg.close()
    topic_at = raw.index(rec.topic.encode())
    props_at = raw.index(rec.properties_raw)
    with open(copy, "r+b") as f:   # an invalid byte in the topic and one in the first property
        f.seek(m["commitLogOffset"] - base + topic_at + 1)
        f.write(b"\xff")
        f.seek(m["commitLogOffset"] - base + props_at)
        f.write(b"\xc3")
    expected = _rows_by_row_decoder(tmp_path)
    assert "\ufffd" in expected[0]["topic"]
    assert any("\ufffd" in k for k in expected[0]["properties"])
    got, _ = _arrow_rows(tmp_path)
    assert got == expected


def test_ipv6_hosts_and_msg_ids(tmp_path):
    cfg = StoreConfig(store_host="[2001:db8::1]:10911", **SMALL_INDEX)
    with MessageStore(tmp_path / "s", cfg) as s:
        s.put_batch([Message("T6", b"x" * i, tags="a", keys=["k1", "k2"], born_host="[fe80::1:2]:7")
                     for i in range(5)])
        s.put(Message("T6", b"plain"))
    got, _ = _arrow_rows(tmp_path / "s")
    expected = _rows_by_row_decoder(tmp_path / "s")
    assert got == expected
    assert got[0]["store_host"] == "[2001:db8:0:0:0:0:0:1]:10911"
    assert got[0]["born_host"] == "[fe80:0:0:0:0:0:1:2]:7"
    assert len(got[0]["msg_id"]) == 56 and got[0]["keys"] == ["k1", "k2"]
    assert got[-1]["keys"] is None and got[-1]["tags"] is None



def test_values_of_every_short_length_and_mixed_record_sizes(tmp_path):
    """Strings of 0 to 40 bytes in every string column (the builder copies short values
    inline, in pieces by length) and records of mixed sizes (measure prefetches where a
    header would be were the next records the size of this one)."""
    rng = random.Random(16)
    msgs = []
    for n in range(41):
        text = "".join(rng.choice("abcXYZ019é") for _ in range(n))
        topic = "".join(rng.choice("abXY09_-") for _ in range(n))
        msgs.append(Message(topic or "T", bytes(rng.randrange(256) for _ in range(n * n * 7)),
                            tags=text or None, keys=[text] if n else None,
                            properties={"p" * (n + 1): text or "v", "UNIQ_KEY": text or "u"}))
    rng.shuffle(msgs)
    with MessageStore(tmp_path / "s", StoreConfig(store_host="10.0.0.1:10911", **SMALL_INDEX)) as s:
        for i in range(0, len(msgs), 7):
            s.put_batch(msgs[i:i + 7])
    got, batches = _arrow_rows(tmp_path / "s", batch_bytes=30000)
    assert len(batches) > 1 and got == _rows_by_row_decoder(tmp_path / "s")
    assert sorted(len(r["tags"] or "") for r in got) == list(range(41))


def test_child_arrays_at_their_densest(tmp_path):
    """KEYS of one-letter tokens and properties of one-letter pairs: the most KEYS tokens and
    map entries per byte of properties, which the builder sizes its child arrays by."""
    letters = string.ascii_letters
    with MessageStore(tmp_path / "s", StoreConfig(**SMALL_INDEX)) as s:
        s.put_batch([Message("T", b"", keys=list(letters[:k]) or None, properties={c: c for c in letters[:k]})
                     for k in range(len(letters) + 1)] * 20)
    got, batches = _arrow_rows(tmp_path / "s")
    assert len(batches) == 1 and got == _rows_by_row_decoder(tmp_path / "s")
    batches[0].validate(full=True)
    assert got[-1]["keys"] == list(letters) and len(got[-1]["properties"]) >= len(letters)


def test_a_batch_owns_its_memory_and_gives_it_back(clean_498):
    """A batch's columns stay whole after the segment is closed and the batch dropped (their
    memory reused by then would show); the memory goes back to pyarrow's pool with the last
    column."""
    store, _ = clean_498
    path, base, _ = batch.segment_files(store)[0]
    gc.collect()
    before = pa.total_allocated_bytes()
    rbs = list(batch.iter_arrow(path, base, store=store, mode="skip"))
    kept = {k: rbs[0].column(k) for k in ("body", "properties", "keys", "msg_id")}
    want = {k: a.to_pylist() for k, a in kept.items()}
    del rbs
    gc.collect()
    scratch = [pa.allocate_buffer(1 << k) for k in range(6, 24) for _ in range(4)]
    for block in scratch:   # the pool's freed blocks taken and overwritten
        np.frombuffer(block, np.uint8)[:] = 0xFF
    assert {k: a.to_pylist() for k, a in kept.items()} == want
    assert pa.total_allocated_bytes() > before
    del kept, scratch, block
    gc.collect()
    assert pa.total_allocated_bytes() == before


# The child flips 60 seeded random bytes in each copy of a fixture segment (with CRCs
# checked, some 30 corrupt regions a copy; bytes of topics and properties are hit too) and
# checks that the Arrow kernel, skipping corrupt records, gives what to_arrow gives over the
# numpy decoder.
FLIPPER = r"""
import os, random, shutil, sys
import pyarrow as pa
from rmqstore import batch
src, work, seeds = sys.argv[1], sys.argv[2], range(int(sys.argv[3]))
base = int(os.path.basename(src))
for seed in seeds:
    print(seed, flush=True)
    path = os.path.join(work, os.path.basename(src))
    shutil.copyfile(src, path)
    rng = random.Random(seed)
    with open(path, "r+b") as f:
        size = os.path.getsize(path)
        for _ in range(60):
            f.seek(rng.randrange(size))
            f.write(bytes([rng.randrange(256)]))
    for batch_bytes, crc in ((3000, True), (1 << 20, False)):
        want = [batch.to_arrow(c, "s") for c in batch.iter_columns(path, base, mode="skip", batch_bytes=batch_bytes,
                                                                    check_crc=crc)]
        got = list(batch.iter_arrow(path, base, store="s", mode="skip", batch_bytes=batch_bytes, check_crc=crc))
        for rb in got:
            rb.validate(full=True)
        assert pa.Table.from_batches(got, batch.arrow_schema()).equals(
            pa.Table.from_batches(want, batch.arrow_schema())), seed
print("done")
"""


def test_corrupted_segments_decode_alike_without_crashing(clean_498, tmp_path):
    import subprocess
    import sys
    store, _ = clean_498
    path, _, _ = batch.segment_files(store)[0]
    p = subprocess.run([sys.executable, "-c", FLIPPER, path, str(tmp_path), "25"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.endswith("done\n"), (p.stdout[-200:], p.stderr[-2000:])


def test_a_batch_of_70k_records_decodes_like_the_numpy_decoder(tmp_path):
    # one batch of 70k small records (more than an int16 or a 64 Ki table would count) equals
    # the numpy decoder's, through the rows either side of 65536
    n = 70_000
    with MessageStore(tmp_path / "s", StoreConfig(**SMALL_INDEX)) as s:
        for start in range(0, n, 10_000):
            s.put_batch([Message(f"T{i % 3}", b"b%d" % i, tags=f"t{i % 5}", keys=[f"k{i}"], flag=i)
                         for i in range(start, start + 10_000)])
    (path, base, _), = batch.segment_files(tmp_path / "s")
    got = list(batch.iter_arrow(path, base, store="s", batch_bytes=1 << 30))
    assert len(got) == 1 and got[0].num_rows == n
    got[0].validate(full=True)
    expected = batch.to_arrow(batch.decode_segment(path, base), "s")
    assert got[0].equals(expected)
    assert got[0].column("flag").to_pylist()[65530:65540] == list(range(65530, 65540))
    assert got[0].column("body")[n - 1].as_py() == b"b69999"
