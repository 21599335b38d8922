"""Public batch decoder: commitlog segment byte ranges into columns and Arrow record batches.

This is the API the Spark data source and jobs use (never the kernels directly). A range
``[start, end)`` of a segment file owns the records that *start* inside it, so ranges cut at
arbitrary byte positions partition a segment exactly: a range that does not begin at 0 finds
its first record by searching for a record header whose PHYSICALOFFSET field equals its own
commitlog offset (the same search resynchronizes after a corrupt record in ``mode="skip"``).

Columns are ``_columns.decode_batch``'s dict of numpy arrays; ``to_arrow`` turns them into a
``pyarrow.RecordBatch``, and ``iter_arrow`` decodes records straight into Arrow batches of
the columns asked for (both with the ``_arrow`` kernel; pyarrow is needed only for them).
"""
from __future__ import annotations

import errno
import os
import re
from typing import Any, Iterator, Sequence

import numpy as np

import rmqstore._columns as _columns
import rmqstore._read as _read
from rmqstore import _record
from rmqstore._segment import MappedSegment
from rmqstore.arguments import checked, positive
from rmqstore.errors import CorruptRecordError, InvalidArgumentError, InvalidArgumentTypeError
from rmqstore.files import file_size, open_reader
from rmqstore.segments import list_segment_files

MODES = ("fail", "skip")
HOLE = "data ends (zeros) before records that follow"
_HEADER = re.compile(re.escape((_record.MAGIC_V1 & 0xFFFFFFFF).to_bytes(4, "big")) + b"|"
                     + re.escape((_record.MAGIC_V2 & 0xFFFFFFFF).to_bytes(4, "big")))


@checked()
def segment_files(store_path: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """(path, base offset, size in bytes) of every commitlog segment of a store, in order;
    a segment that is a symlink, FIFO, directory or device is a StoreIOError, as when the
    store opens."""
    return [(p, base, file_size(p))
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


def _hole(seg, path, at, limit, search=True):
    """Where records go on when the zeros at ``at`` of ``seg`` are a hole, not the end of
    data: the first record header after them in the range (before ``limit``; ``search``
    False: not looked for, a walk of a live store's last segment would do it on every
    call), else ``limit`` when, the range reaching the segment's end, a later segment of
    the directory holds data (a segment ends with a BLANK record). None: no hole. ``at`` is
    read again last: a live writer's record or BLANK landing meanwhile is no hole. Run once
    per range, where its data ends."""
    if seg.read(at, 4) != bytes(4):
        return None
    found = next((p for a, b in _data_ranges(path, at + 1, limit) if (p := _sync(seg, a, b)) is not None),
                 None) if search else None
    if found is None and limit >= seg.size and _later_data(path, seg.base_offset):
        found = limit
    return found if found is not None and seg.read(at, 4) == bytes(4) else None


def _data_ranges(path, start, end):
    """The parts of ``[start, end)`` of the file at ``path`` that may hold data, by
    SEEK_DATA / SEEK_HOLE: a search for records after the end of data skips the holes (most
    of a new 1 GiB segment) instead of reading them. The whole range where the file system
    cannot tell."""
    with open_reader(path) as f:
        fd = f.fileno()
        while start < end:
            try:
                a = os.lseek(fd, start, os.SEEK_DATA)
                b = os.lseek(fd, a, os.SEEK_HOLE)
            except OSError as e:
                if e.errno == errno.ENXIO:   # no data after start
                    return
                yield start, end
                return
            if a >= end:
                return
            yield a, min(b, end)
            start = b


def data_end(path: str | os.PathLike[str], size: int) -> int:
    """Where data may end in the segment file ``path`` of ``size`` bytes: the end of the
    last part the file system holds data for (0: nothing but a hole), ``size`` where it
    cannot tell. Every record starts before it; after it the file reads as zeros (most of
    a new 1 GiB segment, which a reader planned by file size decoded for nothing)."""
    return max((end for _, end in _data_ranges(path, 0, size)), default=0)


def _refuse_hole(seg, path, at, limit, status, search=True):
    """CorruptRecordError when a walk of ``seg`` that stopped at ``at`` with ``status``
    met zeros that are a hole (see ``_hole``), not the end of data."""
    if status == "end" and at < limit and _hole(seg, path, at, limit, search) is not None:
        raise CorruptRecordError(f"{path}: commitlog offset {seg.base_offset + at}: {HOLE}", seg.base_offset + at)


def _later_data(path, base_offset):
    """Whether a segment file after the one at ``base_offset`` in ``path``'s directory starts
    with a record (not zeros: a writer's next segment made ahead)."""
    for base, p in list_segment_files(os.path.dirname(path)):
        if base > base_offset:
            with open_reader(p) as f:
                if f.read(4).strip(b"\0"):
                    return True
    return False


class DecodeStats:
    """What one or more ``iter_columns`` calls read: records, record bytes, corrupt regions
    skipped and their bytes, and the commitlog offset of each corrupt record met."""

    __slots__ = ("records", "bytes", "corrupt", "skipped_bytes", "corrupt_offsets")

    @checked(skip=1)
    def __init__(self) -> None:
        self.records = self.bytes = self.corrupt = self.skipped_bytes = 0
        self.corrupt_offsets: list[int] = []

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}


@checked()
def iter_columns(path: str | os.PathLike[str], base_offset: int, start: int = 0, end: int | None = None, *,
                 check_crc: bool = False, mode: str = "fail", batch_bytes: int = 32 << 20,
                 stats: DecodeStats | None = None, aligned: bool = False) -> Iterator[dict[str, Any]]:
    """Yield column dicts (see ``_columns.decode_batch``) for the records of segment file
    ``path`` that start in ``[start, end)``, about ``batch_bytes`` of records per dict.

    ``mode="fail"`` raises CorruptRecordError (naming the path and commitlog offset) at the
    first invalid record; ``mode="skip"`` skips to the next valid record header and counts
    the region in ``stats`` (a DecodeStats). Decoding stops at end of data or a BLANK record.
    ``aligned`` says ``start`` and ``end`` are record boundaries (e.g. from ``end_offset``):
    no header search (NotRecordStartError when no record can start at ``start``), and
    nothing at or after ``end`` is read even if written meanwhile.
    """
    def decode(seg, pos, window):
        cols = _columns.decode_batch(seg, pos, window, check_crc, True)
        return cols, {"count": cols["count"], "bytes": int(cols["store_size"].sum()),
                      "end_pos": cols["end_pos"], "stop": cols["stop"]}
    return _iter_decoded(decode, path, base_offset, start, end, mode, batch_bytes, stats, aligned)


@checked()
def iter_arrow(path: str | os.PathLike[str], base_offset: int, start: int = 0, end: int | None = None, *,
               store: str | os.PathLike[str] | None = None, columns: Sequence[str] | None = None,
               check_crc: bool = False, mode: str = "fail", batch_bytes: int = 4 << 20,
               stats: DecodeStats | None = None, aligned: bool = False) -> Iterator[Any]:
    """Yield ``pyarrow.RecordBatch``es of ``columns`` (names of ``arrow_schema()``, in the
    order given; default all) decoded straight from the records, as ``iter_columns`` reads
    them (same arguments); ``store`` fills the ``store`` column. Only the requested columns
    are built. Needs pyarrow."""
    import rmqstore._arrow as _arrow
    columns = _arrow.check_columns(columns)
    label = "" if store is None else os.fspath(store)
    batch_bytes = min(batch_bytes, 1 << 30)   # Arrow's int32 offsets: < 2 GiB per column (checked below)

    def decode(seg, pos, window):
        return _arrow.decode(seg, pos, window, check_crc, label, columns)
    return _iter_decoded(decode, path, base_offset, start, end, mode, batch_bytes, stats, aligned)


def _iter_decoded(decode, path, base_offset, start, end, mode, batch_bytes, stats, aligned):
    """The decoding loop of ``iter_columns`` / ``iter_arrow`` (its arguments checked now,
    not at the first ``next``): ``decode(seg, pos, window)`` returns (batch, info with
    count, bytes, end_pos and stop)."""
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {MODES}, not {mode!r}")
    if stats is not None and not isinstance(stats, DecodeStats):
        raise InvalidArgumentTypeError(f"stats must be a DecodeStats or None, not {type(stats).__name__}")
    positive("batch_bytes", batch_bytes)
    if aligned and start > 0:
        seg = MappedSegment(path, base_offset, 0, readonly=True)
        try:
            _read.check_start(seg, start, 0)   # NotRecordStartError: ``start`` is inside a record
        finally:
            seg.close()
    return _decoded(decode, path, base_offset, start, end, mode, batch_bytes,
                    DecodeStats() if stats is None else stats, aligned)


def _decoded(decode, path, base_offset, start, end, mode, batch_bytes, stats, aligned):
    seg = MappedSegment(path, base_offset, 0, readonly=True)
    try:
        size = seg.size
        end = size if end is None else min(end, size)
        if aligned:
            pos, limit = start, end
        else:
            pos = start if start == 0 else _sync(seg, start, end)
            found = None if end >= size else _sync(seg, end, size)   # (0 is a position, not "none")
            limit = size if found is None else found
        need = 0   # window size needed for a record larger than batch_bytes
        while pos is not None and pos < limit:
            window = min(limit, pos + max(batch_bytes, need, 8))   # a record header at least
            out, info = decode(seg, pos, window)
            if info["count"]:
                stats.records += info["count"]
                stats.bytes += info["bytes"]
                yield out
            stop, at = info["stop"], info["end_pos"]
            total = int.from_bytes(seg.read(at, 4), "big", signed=True) if at + 4 <= size else 0
            resume = _hole(seg, path, at, limit) if stop == "end" and total == 0 and at < limit else None
            if resume is not None:
                stop = HOLE
            elif stop == "blank" or (stop == "end" and (window == limit or total == 0)):
                return
            if window < limit and (stop == "end" or at > pos):
                pos, need = at, 0   # the window ended on or cut a record: go on from there
                continue
            if window < limit and total > window - at:
                need = total        # one record (or BLANK) larger than the window
                continue
            if mode == "fail":
                raise CorruptRecordError(f"{path}: commitlog offset {base_offset + at}: {stop}", base_offset + at)
            pos = resume if resume is not None else _sync(seg, at + 1, limit)   # past a hole: where _hole found records
            stats.corrupt += 1
            stats.corrupt_offsets.append(base_offset + at)
            stats.skipped_bytes += (limit if pos is None else pos) - at
    finally:
        seg.close()


@checked()
def end_offset(store_path: str | os.PathLike[str], hint: int = 0) -> int:
    """Commitlog offset where a store's written data ends (a record boundary): the end of
    the last segment holding data (a writer may have preallocated empty ones after it),
    walking headers from ``hint`` when it lies in that segment (NotRecordStartError when
    no record can start there). 0 for no segments."""
    for path, base, size in reversed(segment_files(store_path)):
        seg = MappedSegment(path, base, 0, readonly=True)
        try:
            pos = hint - base if base <= hint < base + size else 0
            _read.check_start(seg, pos, 0)
            # check_place: a record still being written (its PHYSICALOFFSET not there yet) ends the data
            end, _, status, _ = _read.scan_segment(seg, pos, size, False, True)
        finally:
            seg.close()
        if end > 0 or status != "end" or base <= hint:
            return base + (size if status == "blank" else end)
    return 0


@checked()
def count_records(store_path: str | os.PathLike[str]) -> tuple[int, int]:
    """(records, bytes of records) in a store's commitlog, walking record headers."""
    records = nbytes = 0
    for path, base, size in segment_files(store_path):
        seg = MappedSegment(path, base, 0, readonly=True)
        try:
            end, count, status, _ = _read.scan_segment(seg, 0, size, False)
            _refuse_hole(seg, path, end, size, status)
        finally:
            seg.close()
        records, nbytes = records + count, nbytes + end
    return records, nbytes


@checked()
def advance(store_path: str | os.PathLike[str], start: int, max_bytes: int) -> int:
    """The record boundary reached by reading at most ``max_bytes`` of a store's commitlog
    from offset ``start`` (a record boundary, else NotRecordStartError), BLANK records and
    segment ends included; at least one record's worth when there is one, so a reader
    always moves on."""
    pos, budget = start, max_bytes
    for path, base, size in segment_files(store_path):
        if pos >= base + size:
            continue
        pos = max(pos, base)
        seg = MappedSegment(path, base, 0, readonly=True)
        try:
            rel = pos - base
            if pos == start:
                _read.check_start(seg, rel, 0)
            # a record header at least: a window of 1..7 bytes would read TOTALSIZE's zero high byte as an end
            end, count, status, _ = _read.scan_segment(seg, rel, min(size, rel + max(budget, 8)), False)
            if count == 0 and pos == start and status not in ("end", "blank") and rel + 4 <= size:
                total = int.from_bytes(seg.read(rel, 4), "big", signed=True)   # one record over budget
                end, count, status, _ = _read.scan_segment(seg, rel, min(size, rel + max(total, 0)), False)
            _refuse_hole(seg, path, end, size, status, False)
        finally:
            seg.close()
        budget -= end - rel
        if status != "blank" or budget <= 0:
            return base + end
        pos = base + size
    return pos


@checked()
def after_hole(store_path: str | os.PathLike[str], offset: int) -> int | None:
    """Where a store's records go on after the zeros at commitlog ``offset`` (where
    ``end_offset`` saw its data end) when those zeros are a hole: the next record's offset
    (or the next segment's start when the hole runs to the end of its segment, a later one
    holding data). None when they are the end of data. It reads the rest of the segment
    (the parts SEEK_DATA reports, see ``_hole``), so a tailing reader runs it only when it
    stops moving."""
    for path, base, size in segment_files(store_path):
        if base <= offset < base + size:
            seg = MappedSegment(path, base, 0, readonly=True)
            try:
                found = _hole(seg, path, offset - base, size)
                return None if found is None else base + found
            finally:
                seg.close()
    return None


@checked()
def decode_segment(path: str | os.PathLike[str], base_offset: int, start: int = 0, end: int | None = None,
                   check_crc: bool = False, mode: str = "fail") -> dict[str, Any]:
    """All records of ``path`` starting in ``[start, end)`` as one column dict (concatenated)."""
    parts = list(iter_columns(path, base_offset, start, end, check_crc=check_crc, mode=mode, batch_bytes=1 << 62))
    if len(parts) == 1:
        return parts[0]
    if not parts:   # no records: empty columns
        seg = MappedSegment(path, base_offset, 0, readonly=True)
        try:
            return _columns.decode_batch(seg, 0, 0)
        finally:
            seg.close()
    return concat_columns(parts)


@checked()
def concat_columns(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate column dicts (offset columns rebased). Dicts that are not all alike
    (``iter_columns``' output): InvalidArgumentError."""
    if not parts:
        raise InvalidArgumentError("concat_columns needs at least one column dict")
    out = {}
    try:
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
    except KeyError as e:
        raise InvalidArgumentError(f"parts: a column dict without {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise InvalidArgumentTypeError(f"parts: column dicts that do not concatenate ({e})") from None
    return out


# ------------------------------------------------------------------------------- Arrow

def arrow_schema():
    """The Arrow schema of ``to_arrow`` and ``iter_arrow`` (the Spark data source's schema)."""
    import rmqstore._arrow as _arrow
    return _arrow.SCHEMA


@checked()
def to_arrow(cols: dict[str, Any], store_path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> Any:
    """A ``pyarrow.RecordBatch`` of the decoded ``cols`` (schema: ``arrow_schema()``, or the
    ``columns`` named, in that order)."""
    import rmqstore._arrow as _arrow
    return _arrow.from_columns(dict(cols), str(store_path), columns)   # (it takes an exact dict)
