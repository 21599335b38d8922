"""Public batch decoder: commitlog segment byte ranges into columns and Arrow record batches.

This is the API the Spark data source and jobs use (never ``_codec`` directly). A range
``[start, end)`` of a segment file owns the records that *start* inside it, so ranges cut at
arbitrary byte positions partition a segment exactly: a range that does not begin at 0 finds
its first record by searching for a record header whose PHYSICALOFFSET field equals its own
commitlog offset (the same search resynchronizes after a corrupt record in ``mode="skip"``).

Columns are ``_codec.decode_batch``'s dict of numpy arrays; ``to_arrow`` turns them into a
``pyarrow.RecordBatch`` (pyarrow is needed only for that), vectorized: bodies reference the
decoded buffer without a second copy, properties are split with Arrow compute kernels.
"""
import os
import re

import numpy as np

from rmqstore import _codec
from rmqstore._segment import MappedSegment
from rmqstore.errors import CorruptRecordError, InvalidArgumentError
from rmqstore.segments import list_segment_files

MODES = ("fail", "skip")
_HEADER = re.compile(re.escape((_codec.MAGIC_V1 & 0xFFFFFFFF).to_bytes(4, "big")) + b"|"
                     + re.escape((_codec.MAGIC_V2 & 0xFFFFFFFF).to_bytes(4, "big")))
_HEX = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), np.uint8).reshape(256, 2)


def segment_files(store_path):
    """(path, base offset, size in bytes) of every commitlog segment of a store, in order."""
    return [(p, base, os.path.getsize(p))
            for base, p in list_segment_files(os.path.join(str(store_path), "commitlog"))]


def _sync(seg, pos, limit):
    """Position of the first record header at or after ``pos`` (before ``limit``), or None.
    A header is a message magic code whose PHYSICALOFFSET equals the record's own offset."""
    with memoryview(seg) as mv:
        for m in _HEADER.finditer(mv, pos + 4, min(limit + 8, len(mv))):
            p = m.start() - 4
            if p + 36 <= len(mv) and int.from_bytes(mv[p + 28:p + 36], "big", signed=True) == seg.base_offset + p:
                return p
    return None


class DecodeStats:
    """What one or more ``iter_columns`` calls read: records, record bytes, corrupt regions
    skipped and their bytes, and the commitlog offset of each corrupt record met."""

    __slots__ = ("records", "bytes", "corrupt", "skipped_bytes", "corrupt_offsets")

    def __init__(self):
        self.records = self.bytes = self.corrupt = self.skipped_bytes = 0
        self.corrupt_offsets = []

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}


def iter_columns(path, base_offset, start=0, end=None, *, check_crc=False, mode="fail",
                 batch_bytes=32 << 20, stats=None, aligned=False):
    """Yield column dicts (see ``_codec.decode_batch``) for the records of segment file
    ``path`` that start in ``[start, end)``, about ``batch_bytes`` of records per dict.

    ``mode="fail"`` raises CorruptRecordError (naming the path and commitlog offset) at the
    first invalid record; ``mode="skip"`` skips to the next valid record header and counts
    the region in ``stats`` (a DecodeStats). Decoding stops at end of data or a BLANK record.
    ``aligned`` says ``start`` and ``end`` are record boundaries (e.g. from ``end_offset``):
    no header search, and nothing at or after ``end`` is read even if written meanwhile.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {MODES}, not {mode!r}")
    stats = stats if stats is not None else DecodeStats()
    seg = MappedSegment(path, base_offset, 0, readonly=True)
    try:
        size = seg.size
        end = size if end is None else min(end, size)
        if aligned:
            pos, limit = start, end
        else:
            pos = start if start == 0 else _sync(seg, start, end)
            limit = size if end >= size else (_sync(seg, end, size) or size)
        need = 0   # window size needed for a record larger than batch_bytes
        while pos is not None and pos < limit:
            window = min(limit, pos + max(batch_bytes, need))
            cols = _codec.decode_batch(seg, pos, window, check_crc, True)
            if cols["count"]:
                stats.records += cols["count"]
                stats.bytes += int(cols["store_size"].sum())
                yield cols
            stop, at = cols["stop"], cols["end_pos"]
            total = int.from_bytes(seg.read(at, 4), "big", signed=True) if at + 4 <= size else 0
            if stop == "blank" or (stop == "end" and (window == limit or total == 0)):
                return
            if window < limit and (stop == "end" or at > pos):
                pos, need = at, 0   # the window ended on or cut a record: go on from there
                continue
            if window < limit and total > window - at:
                need = total        # one record (or BLANK) larger than the window
                continue
            if mode == "fail":
                raise CorruptRecordError(f"{path}: commitlog offset {base_offset + at}: {stop}", base_offset + at)
            pos = _sync(seg, at + 1, limit)
            stats.corrupt += 1
            stats.corrupt_offsets.append(base_offset + at)
            stats.skipped_bytes += (limit if pos is None else pos) - at
    finally:
        seg.close()


def end_offset(store_path, hint=0):
    """Commitlog offset where a store's written data ends (a record boundary): the end of
    the last segment holding data (a writer may have preallocated empty ones after it),
    walking headers from ``hint`` when it lies in that segment. 0 for no segments."""
    for path, base, size in reversed(segment_files(store_path)):
        seg = MappedSegment(path, base, 0, readonly=True)
        try:
            pos = hint - base if base <= hint < base + size else 0
            end, _, status = _codec.scan_segment(seg, pos, size, False)
        finally:
            seg.close()
        if end > 0 or status != "end" or base <= hint:
            return base + (size if status == "blank" else end)
    return 0


def decode_segment(path, base_offset, start=0, end=None, check_crc=False, mode="fail"):
    """All records of ``path`` starting in ``[start, end)`` as one column dict (concatenated)."""
    parts = list(iter_columns(path, base_offset, start, end, check_crc=check_crc, mode=mode, batch_bytes=1 << 62))
    if len(parts) == 1:
        return parts[0]
    if not parts:   # no records: empty columns
        seg = MappedSegment(path, base_offset, 0, readonly=True)
        try:
            return _codec.decode_batch(seg, 0, 0)
        finally:
            seg.close()
    return concat_columns(parts)


def concat_columns(parts):
    """Concatenate column dicts (offset columns rebased)."""
    out = {}
    for k, v in parts[0].items():
        if not isinstance(v, np.ndarray):
            continue
        if k.endswith("_offsets"):
            data = k[:-len("_offsets")] + "_data"
            shifts = np.cumsum([0] + [len(p[data]) for p in parts[:-1]])
            out[k] = np.concatenate([p[k][:-1] + s for p, s in zip(parts, shifts, strict=False)]
                                    + [[shifts[-1] + len(parts[-1][data])]])
        else:
            out[k] = np.concatenate([p[k] for p in parts])
    out["count"] = sum(p["count"] for p in parts)
    return out


# ------------------------------------------------------------------------------- Arrow

def arrow_schema():
    """The Arrow schema of ``to_arrow`` (the Spark data source's schema)."""
    import pyarrow as pa
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([
        ("store", pa.string()), ("topic", pa.string()), ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()), ("phy_offset", pa.int64()), ("store_size", pa.int32()),
        ("msg_id", pa.string()), ("tags", pa.string()), ("keys", pa.list_(pa.string())),
        ("uniq_key", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()), ("body_crc", pa.int32()), ("sys_flag", pa.int32()), ("flag", pa.int32()),
        ("born_timestamp", ts), ("store_timestamp", ts), ("born_host", pa.string()),
        ("store_host", pa.string()), ("reconsume_times", pa.int32()),
    ])


def _strings(pa, data, offsets, binary=False):
    """A string (or binary) array over ``data`` without copying it; invalid UTF-8 is
    replaced (U+FFFD) like the single-message decoder does."""
    n = len(offsets) - 1
    arr = pa.Array.from_buffers(pa.binary() if binary else pa.string(), n,
                                [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])
    if not binary:
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            raw = data.tobytes()
            arr = pa.array([raw[a:b].decode("utf-8", "replace")
                            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=False)],
                           pa.string())
    return arr


def _rebuild_list(pa, offsets, keep, values):
    """List offsets after dropping the flattened entries where ``keep`` is False."""
    kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    return pa.array(kept[offsets].astype(np.int32)), values.filter(pa.array(keep))


def _properties(pa, pc, cols, n):
    """(map array, entry keys, entry values, row of each entry) of the properties strings,
    parsed like RocketMQ's string2messageProperties (empty names/values dropped)."""
    props = _strings(pa, cols["props_data"], cols["props_offsets"])
    parts = pc.split_pattern(props, "\x02")
    kv = pc.extract_regex(parts.flatten(), r"(?s)^(?P<k>[^\x01]+)\x01(?P<v>.+)$")
    keep = kv.is_valid().to_numpy(zero_copy_only=False)
    offsets, kv = _rebuild_list(pa, parts.offsets.to_numpy(), keep, kv)
    keys, values = kv.field("k"), kv.field("v")
    rows = np.repeat(np.arange(n), np.diff(offsets.to_numpy()))
    return pa.MapArray.from_arrays(offsets, keys, values), keys, values, rows


def _lookup(pa, pc, keys, values, rows, n, name):
    """Per row, the value of property ``name`` (the last one wins, like a map), or null."""
    hit = pc.equal(keys, name).to_numpy(zero_copy_only=False)
    idx = np.full(n, -1, np.int64)
    idx[rows[hit]] = np.nonzero(hit)[0]
    return values.take(pa.array(idx, mask=idx < 0))


def _hosts(pa, addr, port, v6):
    """'a.b.c.d:port' / '[x:..:x]:port' strings (formatted once per distinct host: rows are
    grouped by a 64-bit hash, checked for collisions, with an exact sort as fallback)."""
    cols = np.stack([addr[:, :8].copy().view(np.uint64)[:, 0], addr[:, 8:].copy().view(np.uint64)[:, 0],
                     port.astype(np.uint64) | (v6.astype(np.uint64) << np.uint64(32))], 1)
    with np.errstate(over="ignore"):
        h = cols[:, 0] * np.uint64(0x9E3779B97F4A7C15) ^ cols[:, 1] * np.uint64(0xC2B2AE3D27D4EB4F) ^ cols[:, 2]
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    if not (cols[first][inverse] == cols).all():
        _, first, inverse = np.unique(cols, axis=0, return_index=True, return_inverse=True)
    names = []
    for i in first.tolist():
        a, p = addr[i], int(port[i])
        if v6[i]:
            groups = ":".join(format((int(a[2 * k]) << 8) | int(a[2 * k + 1]), "x") for k in range(8))
            names.append(f"[{groups}]:{p}")
        else:
            names.append(f"{a[0]}.{a[1]}.{a[2]}.{a[3]}:{p}")
    return pa.array(names, pa.string()).take(pa.array(inverse.reshape(-1)))


def _msg_ids(pa, addr, port, phy, v6):
    """msgId: upper-case hex of store address + port + physical offset (32 or 56 digits)."""
    n = len(phy)
    raw = np.zeros((n, 28), np.uint8)
    tail = np.concatenate([port.astype(">i4").view(np.uint8).reshape(-1, 4),
                           phy.astype(">i8").view(np.uint8).reshape(-1, 8)], 1)
    raw[:, :16] = addr
    raw[~v6, 4:16] = tail[~v6]
    raw[v6, 16:28] = tail[v6]
    chars = _HEX[raw].reshape(n, 56)
    width = np.where(v6, 56, 32)
    data = chars[np.arange(56)[None, :] < width[:, None]]
    offsets = np.concatenate([[0], np.cumsum(width)]).astype(np.int64)
    return _strings(pa, data, offsets)


def to_arrow(cols, store_path):
    """A ``pyarrow.RecordBatch`` (schema: ``arrow_schema()``) of the decoded ``cols``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    n = int(cols["count"])
    sys_flag = cols["sys_flag"]
    born_v6 = (sys_flag & _codec.SYSFLAG_BORNHOST_V6) != 0
    store_v6 = (sys_flag & _codec.SYSFLAG_STOREHOST_V6) != 0
    pmap, pkeys, pvalues, rows = _properties(pa, pc, cols, n)
    keys_str = _lookup(pa, pc, pkeys, pvalues, rows, n, "KEYS")
    split = pc.split_pattern(keys_str, " ")
    flat = split.flatten()
    koffsets, kvalues = _rebuild_list(pa, split.offsets.to_numpy(),
                                      pc.not_equal(flat, "").to_numpy(zero_copy_only=False), flat)
    keys = pa.ListArray.from_arrays(koffsets, kvalues, mask=keys_str.is_null())
    ts = pa.timestamp("us", tz="UTC")
    i32 = lambda name: pa.array(cols[name].astype(np.int32))  # noqa: E731
    arrays = [
        pa.array([str(store_path)], pa.string()).take(np.zeros(n, np.int64)),
        _strings(pa, cols["topic_data"], cols["topic_offsets"]),
        i32("queue_id"), pa.array(cols["queue_offset"]), pa.array(cols["phy_offset"]), i32("store_size"),
        _msg_ids(pa, cols["store_addr"], cols["store_port"], cols["phy_offset"], store_v6),
        _lookup(pa, pc, pkeys, pvalues, rows, n, "TAGS"), keys,
        _lookup(pa, pc, pkeys, pvalues, rows, n, "UNIQ_KEY"), pmap,
        _strings(pa, cols["body_data"], cols["body_offsets"], binary=True),
        i32("body_crc"), i32("sys_flag"), i32("flag"),
        pa.array(cols["born_timestamp"] * 1000, ts), pa.array(cols["store_timestamp"] * 1000, ts),
        _hosts(pa, cols["born_addr"], cols["born_port"], born_v6),
        _hosts(pa, cols["store_addr"], cols["store_port"], store_v6),
        i32("reconsume_times"),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())
