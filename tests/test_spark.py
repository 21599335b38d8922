"""The public batch decoder (rmqstore.batch) and the Spark pipeline (rmqstore.spark) against
the RocketMQ 4.9.8 fixture manifest and stores written by the project."""
import hashlib
import os
import shutil

import pytest

from rmqstore import batch
from rmqstore.errors import CorruptRecordError

pa = pytest.importorskip("pyarrow")


def _expected(m):
    """A manifest message as the columns to_arrow produces."""
    return dict(topic=m["topic"], queue_id=m["queueId"], queue_offset=m["queueOffset"], phy_offset=m["commitLogOffset"],
                store_size=m["storeSize"], msg_id=m["msgId"], uniq_key=m["uniqKey"], tags=m["tags"],
                keys=[k for k in m["keys"].split(" ") if k] if m["keys"] is not None else None,
                properties=m["properties"], body_crc=m["bodyCRC"], sys_flag=m["sysFlag"], flag=m["flag"],
                reconsume_times=m["reconsumeTimes"], born_host=m["bornHost"].lstrip("/"),
                store_host=m["storeHost"].lstrip("/"), born_ms=m["bornTimestamp"], store_ms=m["storeTimestamp"],
                body_sha256=m["bodySha256"])


def _actual(row):
    out = {k: row[k] for k in ("topic", "queue_id", "queue_offset", "phy_offset", "store_size", "msg_id", "uniq_key",
                               "tags", "keys", "body_crc", "sys_flag", "flag", "reconsume_times", "born_host",
                               "store_host")}
    out.update(properties=dict(row["properties"]), born_ms=round(row["born_timestamp"].timestamp() * 1000),
               store_ms=round(row["store_timestamp"].timestamp() * 1000),
               body_sha256=hashlib.sha256(row["body"]).hexdigest())
    return out


def _offsets(store, step=None, batch_bytes=32 << 20):
    out = []
    for path, base, size in batch.segment_files(store):
        for start in range(0, size, step or size):
            for cols in batch.iter_columns(path, base, start, start + (step or size), batch_bytes=batch_bytes):
                out += cols["phy_offset"].tolist()
    return out


def test_to_arrow_matches_manifest(clean_498):
    store, manifest = clean_498
    rows = pa.Table.from_batches([batch.to_arrow(c, store) for p, b, _ in batch.segment_files(store)
                                  for c in batch.iter_columns(p, b, check_crc=True)]).to_pylist()
    assert [_actual(r) for r in rows] == [_expected(m) for m in sorted(manifest["messages"],
                                                                        key=lambda m: m["commitLogOffset"])]
    assert {r["store"] for r in rows} == {str(store)}


@pytest.mark.parametrize("step,batch_bytes", [(1000, 100), (10007, 3000), (65536, 1 << 20)])
def test_byte_ranges_partition_segments(fixture_store, step, batch_bytes):
    _, store, manifest = fixture_store
    expected = sorted(m["commitLogOffset"] for m in manifest["messages"])
    assert _offsets(store) == expected
    assert _offsets(store, step, batch_bytes) == expected


def test_corrupt_record_fail_and_skip(clean_498, tmp_path):
    store, manifest = clean_498
    path, base, _ = batch.segment_files(store)[1]
    offsets = [m["commitLogOffset"] for m in manifest["messages"] if base <= m["commitLogOffset"] < base + 262144]
    bad = sorted(offsets)[5]
    copy = tmp_path / os.path.basename(path)
    shutil.copyfile(path, copy)
    with open(copy, "r+b") as f:   # break the magic code of the sixth record
        f.seek(bad - base + 4)
        f.write(b"\0\0\0\0")
    with pytest.raises(CorruptRecordError) as e:
        batch.decode_segment(str(copy), base)
    assert e.value.offset == bad and str(copy) in str(e.value)
    stats = batch.DecodeStats()
    got = [o for c in batch.iter_columns(str(copy), base, mode="skip", stats=stats) for o in c["phy_offset"].tolist()]
    assert got == sorted(o for o in offsets if o != bad)
    assert (stats.corrupt, stats.corrupt_offsets, stats.records) == (1, [bad], len(offsets) - 1)
    assert stats.skipped_bytes == sorted(offsets)[6] - bad
