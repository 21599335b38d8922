"""put_arrow reads Arrow buffers in place: every layout of the same rows (slices, chunked
columns, 64-bit offsets, dictionaries, nulls) gives the records put writes for the
Messages they stand for, byte for byte; malformed arrays are errors that store nothing."""
import numpy as np
import pytest
from test_put_columns import CFG, _arrow_rows, _records

from rmqstore import InvalidArgumentError, InvalidArgumentTypeError, Message, MessageStore

pa = pytest.importorskip("pyarrow")
N = 90


def _cast(batch, types):
    """``batch`` with the named columns cast to the given types."""
    return pa.record_batch({c: batch.column(c).cast(types[c]) if c in types else batch.column(c)
                            for c in batch.schema.names})


def _large(batch):
    """64-bit offsets everywhere: large_string, large_binary, large_list, map of large_string."""
    s = pa.large_string()
    return _cast(batch, {"topic": s, "tags": s, "uniq_key": s, "born_host": s, "body": pa.large_binary(),
                         "keys": pa.large_list(s), "properties": pa.map_(s, s)})


def _dictionary(batch):
    """Dictionary-encoded strings, with index types of every width and signedness."""
    return _cast(batch, {"topic": pa.dictionary(pa.int32(), pa.string()),
                         "tags": pa.dictionary(pa.int8(), pa.string()),
                         "uniq_key": pa.dictionary(pa.uint16(), pa.string()),
                         "keys": pa.list_(pa.dictionary(pa.int64(), pa.string()))})


def _chunked(batch):
    """A table whose columns are chunked at different rows."""
    cols = {}
    for j, c in enumerate(batch.schema.names):
        cut = 1 + 13 * j % (N - 2)
        cols[c] = pa.chunked_array([batch.column(c).slice(0, cut), batch.column(c).slice(cut)])
    return pa.table(cols)


LAYOUTS = {
    "record batch": (lambda b: b, slice(0, N)),
    "slice": (lambda b: b.slice(7, 61), slice(7, 68)),
    "slice of large": (lambda b: _large(b).slice(3, 80), slice(3, 83)),
    "large": (_large, slice(0, N)),
    "dictionary": (_dictionary, slice(0, N)),
    "slice of dictionary": (lambda b: _dictionary(b).slice(11, 50), slice(11, 61)),
    "chunked columns": (_chunked, slice(0, N)),
    "table of slices": (lambda b: pa.Table.from_batches([b.slice(0, 29), b.slice(29)]), slice(0, N)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_same_records_as_put(tmp_path, layout):
    make, rows = LAYOUTS[layout]
    batch, puts = _arrow_rows(pa, N)
    with MessageStore(tmp_path / "put", CFG) as s:
        for m, q in puts[rows]:
            s.put(m, q)
        expected = _records(s)
    with MessageStore(tmp_path / "arrow", CFG) as s:
        r = s.put_arrow(make(batch))
        assert len(r["phy_offset"]) == rows.stop - rows.start
        assert _records(s) == expected


@pytest.mark.parametrize("columns", [
    {"tags": ["TagA"] * 6, "keys": [f"key-{i}" for i in range(6)]},
    {"tags": ["TagA"] * 6, "keys": ["k"] * 6},
    {"keys": [["a", "b"]] * 6},
    {"tags": ["TagA"] * 5 + [None], "keys": ["k"] * 6},
    {"uniq_key": ["U"] * 6, "tags": ["TagA"] * 6},
    {"tags": pa.array(["TagA"] * 6).dictionary_encode(), "keys": pa.array([["k"]] * 6)},
])
def test_constant_columns(tmp_path, columns):
    """One topic, and columns with the same value on every row (a shared prefix where they
    lead the properties), as put stores them."""
    n = 6
    bodies = [bytes([i]) * i for i in range(n)]
    rows = {c: (v.to_pylist() if hasattr(v, "to_pylist") else v) for c, v in columns.items()}
    with MessageStore(tmp_path / "put", CFG) as s:
        for i in range(n):
            p = {"UNIQ_KEY": rows["uniq_key"][i]} if "uniq_key" in rows else {}
            s.put(Message("T", bodies[i], tags=rows.get("tags", [None] * n)[i], keys=rows.get("keys", [None] * n)[i],
                          properties=p))
        expected = _records(s)
    with MessageStore(tmp_path / "arrow", CFG) as s:
        s.put_arrow(pa.record_batch({"topic": ["T"] * n, "body": pa.array(bodies, pa.binary()), **columns}))
        assert _records(s) == expected


def test_constant_tags_then_generated_uniq_keys(tmp_path):
    """A generated UNIQ_KEY follows the shared prefix and the per-row keys, as put places it."""
    cfg = CFG.with_(generate_uniq_key=True)
    with MessageStore(tmp_path / "put", cfg) as s:
        s.put(Message("T", b"x", tags="TagA", keys="k0"))
        want = [list(m.properties) for m in s.scan()]
    with MessageStore(tmp_path / "arrow", cfg) as s:
        s.put_arrow(pa.record_batch({"topic": ["T"] * 3, "body": pa.array([b"x"] * 3, pa.binary()),
                                     "tags": ["TagA"] * 3, "keys": ["k0", "k1", "k2"]}))
        got = [m.properties for m in s.scan()]
    assert [list(p) for p in got] == want * 3 == [["TAGS", "KEYS", "UNIQ_KEY"]] * 3
    assert len({p["UNIQ_KEY"] for p in got}) == 3 and [p["KEYS"] for p in got] == ["k0", "k1", "k2"]


def test_separator_outside_the_slice_is_not_an_error(tmp_path):
    """A separator in the bytes under rows the slice leaves out: the column-wide check
    finds it, the row checks clear the rows."""
    batch = pa.record_batch({"topic": ["T"] * 3, "body": pa.array([b"x"] * 3, pa.binary()),
                             "tags": ["bad\x01", "a", "b"], "keys": pa.array([["k\x02"], ["x", "y"], []])})
    with MessageStore(tmp_path / "put", CFG) as s:
        s.put(Message("T", b"x", tags="a", keys=["x", "y"]))
        s.put(Message("T", b"x", tags="b", keys=[]))
        expected = _records(s)
    with MessageStore(tmp_path / "arrow", CFG) as s:
        s.put_arrow(batch.slice(1))
        assert _records(s) == expected


def _strings(offsets, data, width=4):
    """A string array over raw offsets and data (pyarrow's from_buffers checks their sizes
    and bounds, not their order)."""
    kind = pa.string() if width == 4 else pa.large_string()
    return pa.Array.from_buffers(kind, len(offsets) - 1, [None, pa.py_buffer(np.array(offsets, f"int{8 * width}")),
                                                          pa.py_buffer(data)])


@pytest.mark.parametrize("column,error,text", [
    ("tags", InvalidArgumentError, "offsets decrease"),
    ("topic", InvalidArgumentError, "offsets decrease"),
    ("dictionary", InvalidArgumentError, "dictionary index 7"),
    ("binary tags", InvalidArgumentTypeError, "binary"),
    ("separator in dictionary", InvalidArgumentError, "row 2"),
    ("list offsets", InvalidArgumentError, "KEYS"),
])
def test_malformed_arrays_store_nothing(tmp_path, column, error, text):
    cols = {"topic": pa.array(["T"] * 3), "body": pa.array([b"a"] * 3, pa.binary())}
    if column == "tags":
        cols["tags"] = _strings([0, 2, 1, 3], b"abc")
    elif column == "topic":
        cols["topic"] = _strings([0, 2, 1, 3], b"TTT", 8)
    elif column == "dictionary":
        cols["tags"] = pa.DictionaryArray.from_buffers(pa.dictionary(pa.int8(), pa.string()), 3,
                                                       [None, pa.py_buffer(np.array([0, 7, 1], np.int8))],
                                                       pa.array(["a", "b"]))
    elif column == "binary tags":
        cols["tags"] = pa.array([b"a"] * 3, pa.binary())
    elif column == "separator in dictionary":
        cols["tags"] = pa.array(["a", "a", "b\x02"]).dictionary_encode()
    elif column == "list offsets":
        cols["keys"] = pa.ListArray.from_buffers(pa.list_(pa.string()), 3,
                                                 [None, pa.py_buffer(np.array([0, 1, 9, 2], np.int32))],
                                                 children=[pa.array(["k", "l"])])
    with MessageStore(tmp_path / "s", CFG) as s:
        with pytest.raises(error, match=text):
            s.put_arrow(pa.record_batch(cols))
        assert s.max_phy_offset == 0


def _not_utf8(n, bad_row):
    """``n`` strings "s<i>", row ``bad_row`` holding a byte that UTF-8 never has (an array
    built from raw buffers: pyarrow does not check them)."""
    data = [f"s{i}".encode() for i in range(n)]
    data[bad_row] = b"s\xff"
    offsets = np.cumsum([0] + [len(d) for d in data])
    return _strings(offsets, b"".join(data))


@pytest.mark.parametrize("column", ["topic", "tags", "uniq_key", "keys", "property name", "property value",
                                    "put_columns tags", "put_columns topic"])
def test_strings_that_are_not_utf8_store_nothing(tmp_path, column):
    """Arrow promises UTF-8 strings; an array built from raw buffers need not keep it. They
    were written as they were (read back with U+FFFD in place of the bytes) or, with more
    than 256 topics, a UnicodeDecodeError."""
    n = 300
    cols = {"topic": pa.array([f"T{i % 3}" for i in range(n)]), "body": pa.array([b"a"] * n, pa.binary())}
    bad = _not_utf8(n, 7)
    if column in ("topic", "tags", "uniq_key"):   # (300 topics: more than the C path takes)
        cols[column] = bad
    elif column == "keys":
        cols["keys"] = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), bad)
    elif column.startswith("property"):
        names, values = (bad, pa.array(["v"] * n)) if column == "property name" else (pa.array(["p"] * n), bad)
        cols["properties"] = pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), names, values)
    with MessageStore(tmp_path / "s", CFG) as s:
        with pytest.raises(InvalidArgumentError, match="UTF"):
            if column == "put_columns tags":
                s.put_columns("T", [b"a"] * n, tags=bad)
            elif column == "put_columns topic":
                s.put_columns(bad, [b"a"] * n)
            else:
                s.put_arrow(pa.record_batch(cols))
        assert s.max_phy_offset == 0


def test_non_ascii_strings_are_stored(tmp_path):
    """The UTF-8 check passes text that is not ASCII."""
    batch = pa.record_batch({"topic": ["T", "T"], "body": pa.array([b"a", b"b"]), "tags": ["é", None],
                             "keys": pa.array([["中文", "k"], []]), "properties": pa.array(
                                 [[("名", "值")], None], pa.map_(pa.string(), pa.string()))})
    with MessageStore(tmp_path / "put", CFG) as s:
        s.put(Message("T", b"a", tags="é", keys=["中文", "k"], properties={"名": "值"}))
        s.put(Message("T", b"b", keys=[]))
        expected = _records(s)
    with MessageStore(tmp_path / "arrow", CFG) as s:
        s.put_arrow(batch)
        assert _records(s) == expected


@pytest.mark.parametrize("width", [8, 16])
def test_a_negative_dictionary_index_is_refused(tmp_path, width):
    """Index -1 of a signed int8/int16 dictionary index was read as 255/65535, a valid
    index into a dictionary that large: that row stored another row's topic or tag."""
    size = 1 << width
    kind = pa.dictionary(pa.int8() if width == 8 else pa.int16(), pa.string())
    idx = np.array([0, -1, 1], f"int{width}")
    for column in ("topic", "tags"):
        arr = pa.DictionaryArray.from_buffers(kind, 3, [None, pa.py_buffer(idx)],
                                              pa.array([f"T{i}" for i in range(size)]))
        cols = {"topic": pa.array(["T"] * 3), "body": pa.array([b"a"] * 3, pa.binary()), column: arr}
        with MessageStore(tmp_path / column / str(width), CFG) as s:
            with pytest.raises(InvalidArgumentError, match="dictionary index -1"):
                s.put_arrow(pa.record_batch(cols))
            assert s.max_phy_offset == 0


def test_tags_and_uniq_keys_are_strings_as_put_takes_them(tmp_path):
    """A list column for TAGS or UNIQ_KEY was joined by spaces; put refuses a list of tags
    (and put_arrow did too for a batch that a DELAY row sends through put)."""
    for column in ("tags", "uniq_key"):
        batch = pa.record_batch({"topic": ["T", "T"], "body": pa.array([b"a", b"b"]),
                                 column: pa.array([["a", "b"], []])})
        with MessageStore(tmp_path / column, CFG) as s:
            with pytest.raises(InvalidArgumentTypeError, match="where strings are due"):
                s.put_arrow(batch)
            assert s.max_phy_offset == 0


def test_string_bodies_with_a_delay_row_as_without(tmp_path):
    """String bodies are their UTF-8 bytes, also in a batch put sends as Messages (one row
    has a DELAY level): put refused str bodies there."""
    t = pa.map_(pa.string(), pa.string())
    props = pa.array([[("DELAY", "2")], None], t)
    for kind in (pa.string(), pa.large_string()):
        with MessageStore(tmp_path / str(kind) / "binary", CFG) as s:
            s.put_arrow(pa.record_batch({"topic": ["T", "T"], "body": pa.array([b"x", "\u00e9".encode()]),
                                         "properties": props}))
            expected = _records(s)
        with MessageStore(tmp_path / str(kind) / "string", CFG) as s:
            s.put_arrow(pa.record_batch({"topic": ["T", "T"], "body": pa.array(["x", "\u00e9"], kind),
                                         "properties": props}))
            assert _records(s) == expected


@pytest.mark.slow
def test_chunks_past_int32_offsets_store_nothing(tmp_path):
    """Chunks of a binary column that together hold more than 2 GiB do not combine into one
    int32-offset array: pyarrow's ArrowInvalid came out of put_arrow / put_columns. (The
    chunks share one 72 MiB buffer.)"""
    chunk = pa.array([b"x" * (72 << 20)], pa.binary())
    body = pa.chunked_array([chunk] * 30)
    with MessageStore(tmp_path / "s", CFG) as s:
        with pytest.raises(InvalidArgumentError, match="do not combine"):
            s.put_arrow(pa.table({"topic": ["T"] * 30, "body": body}))
        with pytest.raises(InvalidArgumentError, match="do not combine"):
            s.put_columns("T", body)
        assert s.max_phy_offset == 0
