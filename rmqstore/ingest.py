"""Columnar ingest: bodies, tags, keys, properties and the other message fields given as
sequences, numpy or Arrow arrays become the columns the append kernel writes with no
Python object per message (``MessageStore.put_columns`` / ``put_arrow``).

A binary column is one bytes-like ``data`` buffer and ``n + 1`` int64 ``offsets``: row i
is ``data[offsets[i]:offsets[i + 1]]``. Properties are laid out as a record stores them
(``name\\x01value`` pairs joined by ``\\x02``), in the order ``Message`` uses: the given
properties, then TAGS, then KEYS, then UNIQ_KEY. Integer fields are int64 arrays; born
hosts are a binary column of packed hosts (an empty row: the store host).
"""
from __future__ import annotations

from collections import abc
from typing import Any, Callable, Mapping

import numpy as np

import rmqstore._pack as _pack
import rmqstore._properties as _properties
from rmqstore._message import Message, int_arg, keys_text, text_arg
from rmqstore._record import gets_cq_entry, pack_host, pack_hosts
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError
from rmqstore.topics import SCHEDULE_TOPIC

Column = tuple[Any, np.ndarray]   # (bytes-like data, int64 offsets)
_SEPARATORS = (b"\x01", b"\x02")


def _is_arrow(values: Any) -> bool:
    """Whether ``values`` is a pyarrow Array or ChunkedArray (a Table is not a column)."""
    return hasattr(values, "buffers") or hasattr(values, "num_chunks")


def _combined(values: Any) -> Any:
    """A pyarrow array: a ChunkedArray's one chunk as it is, or its chunks combined."""
    if not hasattr(values, "num_chunks"):
        return values
    return values.chunk(0) if values.num_chunks == 1 else _combine(values)


def _combine(chunked: Any) -> Any:
    """``chunked.combine_chunks()`` (a ChunkedArray or Table); chunks whose strings or bytes
    together pass int32 offsets (2 GiB): InvalidArgumentError, not pyarrow's ArrowInvalid."""
    import pyarrow as pa
    try:
        return chunked.combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as e:
        raise InvalidArgumentError(f"Arrow chunks that do not combine into one array ({e}): put smaller batches "
                                   "or large_binary / large_string columns") from None


def _arrow_bytes(arr: Any, what: str) -> Column:
    """(data, offsets) of a pyarrow binary/string array, nulls included (as empty rows)."""
    import pyarrow as pa
    t = arr.type
    if not (pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
            or pa.types.is_large_string(t)):
        raise InvalidArgumentTypeError(f"{what}: an Arrow column of {t} where binary or string is due")
    if len(arr) == 0:
        return b"", np.zeros(1, np.int64)
    _, off_buf, data_buf = arr.buffers()
    wide = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
    offsets = np.frombuffer(off_buf, np.int64 if wide else np.int32)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else b""
    return data, offsets.astype(np.int64)


def _arrow_binary(values: Any) -> Column | None:
    """(data, offsets) of a pyarrow binary/string array (chunks combined), else None."""
    if not _is_arrow(values):
        return None
    arr = _combined(values)
    col = _arrow_bytes(arr, "a column")
    if arr.null_count:
        raise InvalidArgumentError("a column holds nulls")
    return col


def _is_rows(values: Any) -> bool:
    """Whether ``values`` is an iterable of rows (not a str, a bytes-like or a 0-d array)."""
    return not isinstance(values, (str, bytes, bytearray, memoryview)) and hasattr(values, "__iter__") and \
        getattr(values, "ndim", 1) != 0


def body_column(values: Any) -> tuple[Any, np.ndarray | None]:
    """Bodies as the kernel takes them: an Arrow binary array as a column (data, offsets),
    a sequence of bytes-like objects as (a tuple of them, None): the kernel copies each
    from where it lies (_rows.BodyRows), so a list of bytes is copied once."""
    col = _arrow_binary(values)
    if col is not None:
        return col
    if not _is_rows(values):
        raise InvalidArgumentTypeError(f"bodies must be a sequence of bytes-like objects, not {type(values).__name__}")
    return tuple(values), None


def rows_of(column: tuple[Any, np.ndarray | None]) -> int:
    """Rows of a body column (see body_column)."""
    data, offsets = column
    return len(data) if offsets is None else len(offsets) - 1


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
        return [text_arg(what, values)] * n
    if hasattr(values, "to_pylist"):
        try:
            values = values.to_pylist()
        except UnicodeDecodeError as e:   # an Arrow string array built from raw bytes
            raise InvalidArgumentError(f"{what}: a string that is not UTF-8 ({e})") from None
    elif not _is_rows(values):
        raise InvalidArgumentTypeError(f"{what} must be a str or one per message, not {type(values).__name__}")
    else:
        values = list(values)
    if len(values) != n:
        raise InvalidArgumentError(f"{len(values)} {what} for {n} messages")
    return values


def properties_column(n: int, tags: Any = None, keys: Any = None, properties: Mapping[str, str] | None = None,
                      uniq_key: Callable[[], str] | None = None) -> Column | None:
    """The properties column of ``n`` rows: ``properties`` (one dict for every row), then
    ``tags`` (a str for all rows or one per row; None: none), ``keys`` (per row a str or a
    list of str, joined by spaces), then a UNIQ_KEY from ``uniq_key()`` per row; a TAGS,
    KEYS or UNIQ_KEY that ``properties`` names is set in place, as Message and put set it
    (see _set_in_place). None when no row has any."""
    if properties is not None and not isinstance(properties, abc.Mapping):
        raise InvalidArgumentTypeError(f"properties must be a mapping of str to str, not {type(properties).__name__}")
    if properties is not None and "DELAY" in properties:
        raise InvalidArgumentError("put_columns does not delay messages: put them one by one with DELAY")
    props: dict[str, str | None] = {text_arg("property name", k): None if v is None else text_arg(f"property {k!r}", v)
                                    for k, v in (properties or {}).items()}
    common = b"\x02".join(_pair(k, v) for k, v in props.items() if v is not None)
    tag_rows, key_rows = _per_row(tags, n, "tags"), _per_row(keys, n, "keys")
    set_by = {"TAGS": tag_rows, "KEYS": key_rows, "UNIQ_KEY": None if uniq_key is None else [None] * n}
    if any(set_by.get(k) is not None for k in props):
        return _set_in_place(n, props, set_by, uniq_key)
    if tag_rows is None and key_rows is None and uniq_key is None:
        if not common:
            return None
        return common * n, np.arange(n + 1, dtype=np.int64) * len(common)
    if isinstance(tags, str):   # the same on every row: part of what every row starts with
        common = b"\x02".join(p for p in (common, _pair("TAGS", text_arg("tags", tags))) if p)
        tag_rows = None
        if key_rows is None and uniq_key is None:
            return common * n, np.arange(n + 1, dtype=np.int64) * len(common)
    names, columns = [], []
    if tag_rows is not None:
        names.append("TAGS")
        columns.append(tag_rows)
    if key_rows is not None:
        names.append("KEYS")
        columns.append(key_rows)
    if uniq_key is not None:
        names.append("UNIQ_KEY")
        columns.append([uniq_key() for _ in range(n)])
    data, offsets = _properties.properties_rows(common, names, columns, n, _row_text)
    return data, offsets


def _set_in_place(n: int, props: Mapping[str, str | None], set_by: dict[str, list[Any] | None],
                  uniq_key: Callable[[], str] | None) -> Column:
    """The properties column when ``props`` names what a column sets (``set_by``: TAGS,
    KEYS, UNIQ_KEY rows), as Message and put lay it out: each name where the dict has it,
    with a row's column value over the dict's (None: the dict's), then the names the dict
    lacks; a UNIQ_KEY generated where a row has none or an empty one."""
    names = list(props) + [k for k, rows in set_by.items() if rows is not None and k not in props]
    columns = []
    for name in names:
        rows, v = set_by.get(name), props.get(name)
        col = [v] * n if rows is None else [v if r is None else r for r in rows]
        columns.append([u or uniq_key() for u in col] if name == "UNIQ_KEY" and uniq_key is not None else col)
    data, offsets = _properties.properties_rows(b"", names, columns, n, _row_text)
    return data, offsets


def _row_text(name: str, value: Any) -> Any:
    """A row's value that is not a plain str as the str it is stored as: a str subclass by
    its value, KEYS given as anything but bytes or an int as keys_text joins them (other
    values as they are: the kernel refuses them)."""
    if isinstance(value, str):
        return text_arg(name, value)
    if name != "KEYS" or isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        return value
    return keys_text(value)


def topic_column(topics: Any, n: int) -> tuple[list[str], np.ndarray | None]:
    """(distinct topics, each row's index into them; None when there is one topic)."""
    if isinstance(topics, str):
        return [topics], None
    rows = _per_row(topics, n, "topics")
    if rows is None:
        raise InvalidArgumentTypeError("topic must be a str or one per message, not None")
    names: dict[str, int] = {}
    ids = np.fromiter((names.setdefault(text_arg("topic", t), len(names)) for t in rows), np.int32, n)
    return list(names), ids


_MS = {"s": -1000, "ms": 1, "us": 1000, "ns": 1_000_000}   # timestamp unit -> divisor to ms (-: multiplier)


def _arrow_ints(values: Any, what: str, null: int, lo: int | None) -> np.ndarray:
    """An Arrow integer or timestamp (as ms) array as an int64 numpy array, nulls as
    ``null`` (numpy only when there is no null: pyarrow compute calls cost more than the
    rows of a batch)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = _combined(values)
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_timestamp(t)):
        raise InvalidArgumentTypeError(f"{what}: an Arrow column of {t} where integers are due")
    if pa.types.is_uint64(t) and len(arr) and pc.max(arr).as_py() >= 1 << 63:
        raise InvalidArgumentError(f"{what} {pc.max(arr).as_py()} out of range")
    if arr.null_count:
        arr = arr.cast(pa.int64())
        low = pc.min(arr).as_py()
        if lo is not None and low is not None and low < lo:
            raise InvalidArgumentError(f"{what} {low} is below {lo}")
        arr = arr.fill_null(null)
    elif lo is not None and len(arr) and arr.to_numpy().min() < lo:
        raise InvalidArgumentError(f"{what} {arr.to_numpy().min()} is below {lo}")
    a = arr.to_numpy(zero_copy_only=False)
    a = a.view(np.int64) if pa.types.is_timestamp(t) else a.astype(np.int64, copy=False)
    if pa.types.is_timestamp(t) and _MS[t.unit] < 0:   # seconds: to ms, where int64 holds them
        lim = np.iinfo(np.int64).max // 1000
        if len(a) and not -lim <= a.min() <= a.max() <= lim:
            raise InvalidArgumentError(f"{what}: {a.max() if a.max() > lim else a.min()} s is out of range in ms")
        a = a * 1000
    elif pa.types.is_timestamp(t) and _MS[t.unit] > 1:
        a = a // _MS[t.unit]
    return a


def int_column(values: Any, n: int, what: str, null: int = 0, lo: int | None = None) -> Any:
    """None, one int for every row, or ``n`` ints (a sequence, a numpy or an Arrow integer
    or timestamp array: timestamps as ms; None and nulls: ``null``) as an int or an int64
    array. A value below ``lo``: InvalidArgumentError; the kernel checks the rest of the
    range."""
    if values is None:
        return None
    if isinstance(values, np.ndarray) and values.ndim == 0:
        values = values[()]   # a 0-d array: its one value
    if isinstance(values, (bool, np.bool_, str, bytes, bytearray)) or not (
            hasattr(values, "__iter__") or hasattr(type(values), "__index__")):
        raise InvalidArgumentTypeError(f"{what} must be an int or one per message, not {type(values).__name__}")
    if not hasattr(values, "__iter__"):   # an int, a numpy integer, an __index__ object
        return np.full(n, int_arg(what, values, -(1 << 63) if lo is None else lo, (1 << 63) - 1), np.int64)
    if _is_arrow(values):
        a = _arrow_ints(values, what, null, lo)
    else:
        if isinstance(values, np.ma.MaskedArray):   # masked entries: nulls
            present: Any = values.compressed()
            if values.dtype.kind not in "iu":
                raise InvalidArgumentTypeError(f"{what} must be ints in the int64 range, not {values.dtype}")
            if values.dtype.kind == "u" and len(present) and present.max() > np.iinfo(np.int64).max:
                raise InvalidArgumentError(f"{what} {present.max()} out of range")
            a = np.ma.filled(values.astype(np.int64), null)    # (null may not fit an unsigned dtype)
        elif isinstance(values, np.ndarray):
            present = a = values
        else:
            values = list(values)   # (an iterator is read once)
            present = [v for v in values if v is not None]
            if any(isinstance(v, (bool, np.bool_)) for v in present):
                raise InvalidArgumentTypeError(f"{what} must be ints, not bool")
            try:
                a = np.asarray([null if v is None else v for v in values])
            except (ValueError, TypeError, OverflowError):   # ragged: [0, [1]]
                raise InvalidArgumentTypeError(f"{what} must be ints, one per message") from None
        if len(a) and a.dtype.kind not in "iu":
            raise InvalidArgumentTypeError(f"{what} must be ints in the int64 range, not {a.dtype}")
        if a.ndim != 1:   # nested: [[0], [1]]
            raise InvalidArgumentTypeError(f"{what} must be ints, one per message, not of shape {a.shape}")
        low = None if lo is None or not len(present) else min(present) if isinstance(present, list) else present.min()
        if low is not None and low < lo:
            raise InvalidArgumentError(f"{what} {low} is below {lo}")
    if a.shape != (n,):
        raise InvalidArgumentError(f"{len(a)} {what} for {n} messages")
    return a


def host_column(values: Any, n: int) -> Column | None:
    """Born hosts (None, one "ip:port" for every row, or one per row, a sequence or an Arrow
    string array; None and nulls: the store host) as a column of packed hosts (an empty
    row: the store host)."""
    if values is None:
        return None
    if isinstance(values, str):
        packed = pack_host(values)
        return packed * n, np.arange(n + 1, dtype=np.int64) * len(packed)
    if _is_arrow(values):
        import pyarrow as pa
        arr = _combined(values)
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            raise InvalidArgumentTypeError(f"born_host: an Arrow column of {arr.type} where strings are due")
        data, offsets = _arrow_bytes(arr, "born_host")
        col: Column = pack_hosts(offsets, data, _validity(arr))
    else:
        rows = [None if h is None else text_arg("born_host", h) for h in _per_row(values, n, "born hosts") or []]
        packed_of: dict[str, bytes] = {}
        col = _pack.pack_bytes([b"" if h is None else packed_of.get(h) or packed_of.setdefault(h, pack_host(h))
                                for h in rows])   # every item bytes
    if len(col[1]) != n + 1:
        raise InvalidArgumentError(f"{len(col[1]) - 1} born hosts for {n} messages")
    return col


def message_fields(n: int, flag: Any = None, sys_flag: Any = None, born_timestamp: Any = None,
                   born_host: Any = None, reconsume_times: Any = None) -> dict[str, Any]:
    """The kernel's keyword arguments for the fields put_columns takes per row or for all."""
    hosts = host_column(born_host, n)
    return {"flag": int_column(flag, n, "flag"), "sys_flag": int_column(sys_flag, n, "sys_flag"),
            "born_timestamp": int_column(born_timestamp, n, "born_timestamp"),
            "reconsume_times": int_column(reconsume_times, n, "reconsume_times"),
            "born_host_data": None if hosts is None else hosts[0],
            "born_host_offsets": None if hosts is None else hosts[1]}


def _validity(arr: Any) -> np.ndarray:
    """1 per valid row of a pyarrow array, 0 per null, as uint8."""
    if not arr.null_count:
        return np.ones(len(arr), np.uint8)
    return arr.is_valid().to_numpy(zero_copy_only=False).view(np.uint8)


def _topics(values: Any) -> tuple[list[str], np.ndarray | None]:
    """(distinct topics, each row's index into them; None when there is one) of an Arrow
    strings column (read in place, see _properties.topic_ids; many topics: by pyarrow)."""
    arr = _combined(values)
    found = _properties.topic_ids(arr)
    if found is not None:
        return found
    import pyarrow.compute as pc
    topics = pc.dictionary_encode(arr)
    if topics.null_count:
        raise InvalidArgumentError(f"put_arrow: row {topics.is_null().index(True).as_py()} has no topic")
    return [text_arg("topic", t) for t in topics.dictionary.to_pylist()], \
        topics.indices.to_numpy(zero_copy_only=False).astype(np.int32)


def arrow_columns(batch: Any, uniq_key: Callable[[], str] | None = None) -> tuple[Any, ...]:
    """The kernel's columns from an Arrow table or record batch with ``topic`` and ``body``
    and optional ``queue_id`` (null: round robin), ``tags``, ``keys`` (string or list of
    strings), ``uniq_key``, ``properties`` (map of strings), ``flag``, ``sys_flag``,
    ``born_timestamp`` (timestamp or int ms), ``born_host`` ("ip:port") and
    ``reconsume_times`` (nulls: as put_columns' defaults): (topics, topic ids, body column,
    properties column, queue ids, the kernel's keyword arguments). Properties are built
    as ``Message`` builds them, in one C pass over the Arrow buffers (see
    _properties.arrow_rows). Last, the rows
    put would move to SCHEDULE_TOPIC_XXXX (a DELAY level): the batch then goes as Messages
    (arrow_messages)."""
    import pyarrow as pa
    if not isinstance(batch, (pa.Table, pa.RecordBatch)):
        raise InvalidArgumentTypeError(f"put_arrow takes a pyarrow Table or RecordBatch, not {type(batch).__name__}")
    if isinstance(batch, pa.Table):
        batch = _combine(batch)
    names = batch.schema.names
    missing = [c for c in ("topic", "body") if c not in names]
    if missing:
        raise InvalidArgumentError(f"put_arrow: column(s) {missing} are required")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise InvalidArgumentError(f"put_arrow: column(s) {twice} appear more than once")
    n = batch.num_rows

    def col(name: str) -> Any:
        return _combined(batch.column(name))
    topic_names, topic_ids = _topics(col("topic"))
    if col("body").null_count:
        raise InvalidArgumentError(f"put_arrow: row {col('body').is_null().index(True).as_py()} has no body")
    data, offsets, delays = _properties.arrow_rows(n, col("properties") if "properties" in names else None,
                                                   [col(c) if c in names else None
                                                    for c in ("uniq_key", "tags", "keys")], uniq_key)
    fields = message_fields(n, *(col(c) if c in names else None
                                 for c in ("flag", "sys_flag", "born_timestamp", "born_host", "reconsume_times")))
    delayed = [row for row, level in delays if topic_names[0 if topic_ids is None else topic_ids[row]] != SCHEDULE_TOPIC
               and _delays(level)
               and gets_cq_entry(0 if fields["sys_flag"] is None else int(fields["sys_flag"][row]))]
    queue_ids = int_column(col("queue_id"), n, "queue_ids", -1, 0) if "queue_id" in names else None
    return (topic_names, topic_ids, body_column(col("body")), (data, offsets) if len(data) else None,
            queue_ids, fields, delayed)


def arrow_messages(batch: Any, fields: dict[str, Any]) -> list[Message]:
    """The Messages of an Arrow batch (see arrow_columns; ``fields`` as it gives them), for
    a batch with a row put would delay: the delay rewrite runs per message in put."""
    import pyarrow as pa
    if isinstance(batch, pa.Table):
        batch = _combine(batch)
    n, names = batch.num_rows, batch.schema.names
    none: list[Any] = [None] * n
    rows: dict[str, list[Any]] = {c: batch.column(c).to_pylist() if c in names else none
                                  for c in ("topic", "tags", "keys", "uniq_key", "properties")}
    body = batch.column("body")
    if pa.types.is_string(body.type) or pa.types.is_large_string(body.type):   # bytes, as the columns take them
        body = body.cast(pa.binary() if pa.types.is_string(body.type) else pa.large_binary())
    rows["body"] = body.to_pylist()
    flag, sys_flag, born_ts, reconsume = (np.zeros(n, np.int64) if fields[c] is None else fields[c]
                                          for c in ("flag", "sys_flag", "born_timestamp", "reconsume_times"))
    hosts, at = fields["born_host_data"], fields["born_host_offsets"]
    out = []
    for i in range(n):
        p = dict(rows["properties"][i]) if rows["properties"][i] else {}
        if rows["uniq_key"][i] is not None:
            p["UNIQ_KEY"] = rows["uniq_key"][i]
        m = Message(rows["topic"][i], rows["body"][i], tags=rows["tags"][i], keys=rows["keys"][i], properties=p,
                    flag=int(flag[i]), sys_flag=int(sys_flag[i]), born_timestamp=int(born_ts[i]),
                    reconsume_times=int(reconsume[i]))
        if at is not None and at[i + 1] > at[i]:
            m.born_host_packed = bytes(hosts[at[i]:at[i + 1]])
        out.append(m)
    return out


def _delays(level: bytes) -> bool:
    """Whether put would move a message with this DELAY value to SCHEDULE_TOPIC_XXXX (a
    level above 0, or a value put refuses)."""
    try:
        return int(level) > 0
    except ValueError:
        return True
