"""The public batch decoder under arguments a caller got wrong: column dicts changed or built
by hand, windows smaller than a record header, empty byte ranges. Each is an answer or an
InvalidArgumentError, never a read past an array (run in a child: it could crash), a loop
that never ends, or records counted twice."""
import subprocess
import sys
import textwrap

import pytest

from rmqstore import InvalidArgumentError, InvalidArgumentTypeError, Message, MessageStore, StoreConfig, batch

from conftest import SMALL_INDEX

CFG = StoreConfig(commitlog_file_size=1 << 16, warm_mapped_file=False, **SMALL_INDEX)
N = 40


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch") / "s"
    with MessageStore(root, CFG) as s:
        for i in range(N):
            s.put(Message("T", bytes([i]) * (7 * i), tags="a", keys=["k"]), 0)
    return root


def _child(code, *args, timeout=120):
    """Run ``code`` in a fresh interpreter (a crash or a hang fails the test, not the run)."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_to_arrow_refuses_columns_that_do_not_fit(store):
    """Counts above the arrays, offsets out of order or past the data, short host arrays,
    missing or unconvertible columns: InvalidArgumentError (a count above the arrays
    read past them, and offsets past the data copied from beyond it)."""
    out = _child("""
        import sys
        import numpy as np
        from rmqstore import InvalidArgumentError, batch
        root = sys.argv[1]
        path, base, _ = batch.segment_files(root)[0]
        cols = batch.decode_segment(path, base)
        n = cols["count"]
        bad = {"count": [n + 1, 10 ** 6, -1, 1 << 62, "5"], "phy_offset": [cols["phy_offset"][:3]],
               "body_offsets": [cols["body_offsets"] * 1000, cols["body_offsets"][::-1].copy(),
                                cols["body_offsets"] - 10 ** 9],
               "props_offsets": [cols["props_offsets"][:n]], "topic_data": [cols["topic_data"][:5]],
               "born_addr": [cols["born_addr"][:3]], "store_addr": [cols["store_addr"][: n - 1]],
               "flag": [np.array(["x"] * n)], "body_data": [None]}
        refused = 0
        for name, values in bad.items():
            for v in values:
                try:
                    batch.to_arrow({**cols, name: v}, root)
                except InvalidArgumentError:
                    refused += 1
                else:
                    raise AssertionError(f"{name}: {v!r} accepted")
        for name in ("count", "flag", "body_offsets", "born_addr"):
            try:
                batch.to_arrow({k: v for k, v in cols.items() if k != name}, root)
            except InvalidArgumentError:
                refused += 1
        print(refused, batch.to_arrow(cols, root).num_rows)
    """, store)
    assert out.split() == ["19", str(N)]


def test_concat_columns_refuses_what_does_not_concatenate(store):
    path, base, _ = batch.segment_files(store)[0]
    cols = batch.decode_segment(path, base)
    assert batch.concat_columns([cols, cols])["count"] == 2 * N
    for parts in ([], [cols, {"count": 1}], [{"a": 1}]):
        with pytest.raises(InvalidArgumentError):
            batch.concat_columns(parts)
    with pytest.raises(InvalidArgumentTypeError):
        batch.concat_columns(cols)


@pytest.mark.parametrize("batch_bytes", [1, 2, 3, 4, 9])
def test_windows_smaller_than_a_header_end(store, batch_bytes):
    """batch_bytes of 1..3 gave a window too short for TOTALSIZE, which reads as the end of
    data, and the loop went on from where it was, forever."""
    out = _child("""
        import sys
        from rmqstore import batch
        path, base, _ = batch.segment_files(sys.argv[1])[0]
        kw = {"batch_bytes": int(sys.argv[2])}
        print(sum(c["count"] for c in batch.iter_columns(path, base, **kw)),
              sum(b.num_rows for b in batch.iter_arrow(path, base, **kw)),
              sum(c["count"] for c in batch.iter_columns(path, base, 100, **kw)))
    """, store, batch_bytes, timeout=60)
    assert out.split() == [str(N), str(N), str(N - 1)]


def test_ranges_cut_anywhere_partition_the_segment(store):
    """Two ranges cut at any byte hold every record once: a range ending at 0 (or before)
    is empty, not the whole segment (a found position 0 read as 'none found')."""
    path, base, size = batch.segment_files(store)[0]
    for cut in [-5, 0, 1, 4, 8, 50, 51, 52, 500, size]:
        first = sum(c["count"] for c in batch.iter_columns(path, base, 0, cut))
        rest = sum(c["count"] for c in batch.iter_columns(path, base, max(cut, 0)))
        assert (first, first + rest) == ((0 if cut <= 0 else first), N), cut
        assert sum(b.num_rows for b in batch.iter_arrow(path, base, 0, cut)) == first


def test_column_dicts_of_any_dict_kind_and_parts_in_a_tuple(store):
    """The argument gate takes a dict subclass and a tuple of parts: so do the kernels
    behind it (a bare TypeError and a refusal before)."""
    import collections
    path, base, _ = batch.segment_files(store)[0]
    cols = next(batch.iter_columns(path, base))
    assert batch.to_arrow(collections.OrderedDict(cols), store).num_rows == batch.to_arrow(cols, store).num_rows
    assert batch.concat_columns((cols, cols))["count"] == 2 * cols["count"]
