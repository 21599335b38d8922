"""Columnar ingest: bodies, tags, keys and properties given as sequences, numpy or Arrow
arrays become the ``(data, offsets)`` columns the append kernel writes with no Python
object per message (``MessageStore.put_columns`` / ``put_arrow``).

A column is one bytes-like ``data`` buffer and ``n + 1`` int64 ``offsets``: row i is
``data[offsets[i]:offsets[i + 1]]``. Properties are laid out as a record stores them
(``name\\x01value`` pairs joined by ``\\x02``), in the order ``Message`` uses: the given
properties, then TAGS, then KEYS, then UNIQ_KEY.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

import rmqstore._append as _append
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError

Column = tuple[Any, np.ndarray]   # (bytes-like data, int64 offsets)
_SEPARATORS = (b"\x01", b"\x02")


def _arrow_binary(values: Any) -> Column | None:
    """(data, offsets) of a pyarrow binary/string array (chunks combined), else None."""
    if not hasattr(values, "buffers") and not hasattr(values, "combine_chunks"):
        return None
    import pyarrow as pa
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type) or pa.types.is_large_binary(arr.type)
            or pa.types.is_large_string(arr.type)):
        raise InvalidArgumentTypeError(f"an Arrow column of {arr.type} where binary or string is due")
    if arr.null_count:
        raise InvalidArgumentError("a column holds nulls")
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int64 if wide else np.int32)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else b""
    return data, offsets.astype(np.int64)


def binary_column(values: Any, what: str) -> Column:
    """``values`` (a sequence of bytes-like objects, or an Arrow binary array) as a column."""
    col = _arrow_binary(values)
    if col is not None:
        return col
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not hasattr(values, "__iter__"):
        raise InvalidArgumentTypeError(f"{what} must be a sequence of bytes-like objects, not {type(values).__name__}")
    if all(type(v) is bytes for v in values):   # the common case, at C speed
        offsets = np.zeros(len(values) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
        return b"".join(values), offsets
    views = []
    for v in values:
        try:
            m = memoryview(v) if not isinstance(v, str) else None
        except TypeError:
            m = None
        if m is None or not m.c_contiguous:
            raise InvalidArgumentTypeError(f"{what}: {type(v).__name__} where contiguous bytes are due")
        views.append(m)
    offsets = np.zeros(len(views) + 1, np.int64)
    np.cumsum([m.nbytes for m in views], out=offsets[1:])
    return b"".join(views), offsets


def _text(name: str, v: Any) -> str:
    if type(v) is not str:
        raise InvalidArgumentTypeError(f"{name} must be str, not {type(v).__name__}")
    return v


def _pair(name: str, value: str) -> bytes:
    b = f"{name}\x01{value}".encode("utf-8", "strict")
    if not name or any(s in b[len(name.encode()) + 1:] or s in name.encode() for s in _SEPARATORS):
        raise InvalidArgumentError(f"property {name!r}: empty name or a \\x01/\\x02 separator inside")
    return b


def _per_row(values: Any, n: int, what: str) -> list[Any] | None:
    """None, one value for every row, or ``n`` values (Arrow arrays as Python lists)."""
    if values is None:
        return None
    if isinstance(values, str):
        return [values] * n
    if hasattr(values, "to_pylist"):
        values = values.to_pylist()
    if len(values) != n:
        raise InvalidArgumentError(f"{len(values)} {what} for {n} messages")
    return list(values)


def properties_column(n: int, tags: Any = None, keys: Any = None, properties: Mapping[str, str] | None = None,
                      uniq_key: Callable[[], str] | None = None) -> Column | None:
    """The properties column of ``n`` rows: ``properties`` (one dict for every row), then
    ``tags`` (a str for all rows or one per row; None: none), ``keys`` (per row a str or a
    list of str, joined by spaces), then a UNIQ_KEY from ``uniq_key()`` per row. None when
    no row has any."""
    common = b"\x02".join(_pair(_text("property name", k), _text(f"property {k!r}", v))
                          for k, v in (properties or {}).items() if v is not None)
    tag_rows, key_rows = _per_row(tags, n, "tags"), _per_row(keys, n, "keys")
    if tag_rows is None and key_rows is None and uniq_key is None:
        if not common:
            return None
        return common * n, np.arange(n + 1, dtype=np.int64) * len(common)
    if isinstance(tags, str) and key_rows is None and uniq_key is None:   # the same string on every row
        row = b"\x02".join(p for p in (common, _pair("TAGS", tags)) if p)
        return row * n, np.arange(n + 1, dtype=np.int64) * len(row)
    names, columns = [], []
    if tag_rows is not None:
        names.append("TAGS")
        columns.append(tag_rows)
    if key_rows is not None:
        names.append("KEYS")
        columns.append([k if k is None or type(k) is str else " ".join(_text("key", x) for x in k)
                        for k in key_rows])
    if uniq_key is not None:
        names.append("UNIQ_KEY")
        columns.append([uniq_key() for _ in range(n)])
    data, offsets = _append.properties_rows(common, names, columns, n)
    return data, offsets


def topic_column(topics: Any, n: int) -> tuple[list[str], np.ndarray | None]:
    """(distinct topics, each row's index into them; None when there is one topic)."""
    if isinstance(topics, str):
        return [topics], None
    rows = _per_row(topics, n, "topics") or []
    names: dict[str, int] = {}
    ids = np.fromiter((names.setdefault(_text("topic", t), len(names)) for t in rows), np.int32, n)
    return list(names), ids


def arrow_columns(batch: Any, uniq_key: Callable[[], str] | None = None) -> tuple[Any, ...]:
    """The kernel's columns from an Arrow table or record batch with ``topic`` and ``body``
    and optional ``queue_id``, ``tags``, ``keys`` (string or list of strings) and
    ``properties`` (map of strings): (topics, topic ids, body column, properties column,
    queue ids). Tags and keys are joined with Arrow compute kernels, not per row in Python."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks()
    names = batch.schema.names
    missing = [c for c in ("topic", "body") if c not in names]
    if missing:
        raise InvalidArgumentError(f"put_arrow: column(s) {missing} are required")
    n = batch.num_rows
    col = batch.column
    topics = pc.dictionary_encode(col("topic")).combine_chunks() if isinstance(col("topic"), pa.ChunkedArray) \
        else pc.dictionary_encode(col("topic"))
    if topics.null_count:
        raise InvalidArgumentError("put_arrow: a row has no topic")
    topic_names = [_text("topic", t) for t in topics.dictionary.to_pylist()]
    topic_ids = topics.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    parts = []   # per row "name\x01value\x02" or "" (no nulls), joined and the last \x02 cut
    if "properties" in names and col("properties").null_count < n:
        parts.append(pa.array([b"".join(_pair(_text("property name", k), _text(f"property {k!r}", v)) + b"\x02"
                                        for k, v in (row or ()) if v is not None)
                               for row in col("properties").to_pylist()], pa.binary()).cast(pa.string()))
    for name, prefix in (("tags", "TAGS\x01"), ("keys", "KEYS\x01")):
        if name not in names:
            continue
        values = col(name)
        if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            values = pc.binary_join(values, " ")
        values = values.cast(pa.string())
        if pc.any(pc.match_substring_regex(values, "[\x01\x02]")).as_py():
            raise InvalidArgumentError(f"put_arrow: a {name} value holds a \\x01/\\x02 separator")
        parts.append(pc.binary_join_element_wise(prefix, values, "\x02", "").fill_null(""))
    if uniq_key is not None:
        parts.append(pa.array([f"UNIQ_KEY\x01{uniq_key()}\x02" for _ in range(n)], pa.string()))
    props = None
    if parts:
        joined = pc.binary_join_element_wise(*parts, "") if len(parts) > 1 else parts[0]
        props = _arrow_binary(pc.utf8_rtrim(joined, characters="\x02").cast(pa.binary()))
    queue_ids = None
    if "queue_id" in names:
        q = col("queue_id")
        if q.null_count:
            raise InvalidArgumentError("put_arrow: a row has a null queue_id")
        queue_ids = q.to_numpy(zero_copy_only=False)
    return topic_names, topic_ids, binary_column(col("body"), "body"), props, queue_ids
