"""Every kernel entry point refuses None (and no other type check is skipped) where it
takes an object it reads from: a TypeError or StoreError, never a crash. A Cython typed
argument without ``not None`` accepts None and dereferences it, so the sweep runs in a
child process: each call is made once as given (it must work) and then once per object
argument with None in its place."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from rmqstore import (_append, _arrow, _columns, _cq, _encode, _gate, _index, _index_file, _message, _read, _record,
                          _verify)
    from rmqstore._segment import MappedSegment, fault_point, inject_fault
    from rmqstore.errors import StoreError
    from rmqstore.segments import SegmentQueue

    root = sys.argv[1]
    host = _record.pack_host("127.0.0.1:10911")
    queue = SegmentQueue(root + "/commitlog", 1 << 16, False, 0o600, 0o700)
    seg = queue.roll(0)
    msg = _message.Message("t", b"body", tags="A")
    _encode.append_message(seg, msg, "t", {"TAGS": "A"}, 0, 0, 1, host, 2, 1 << 20)
    segs = queue.segments
    entries = np.zeros(1, _cq.ENTRY_DTYPE)
    entries["size"] = seg.wrote_pos
    cq = MappedSegment(root + "/cq", 0, 200, create=True)
    _cq.append_entry(cq, 0, seg.wrote_pos, 0)
    idx = MappedSegment(root + "/index", 0, _index_file.file_size(8, 8), create=True)
    rows, raw, _, _ = _read.scan_dispatch(seg, 0, seg.wrote_pos)
    i64, i32 = np.zeros(1, np.int64), np.zeros(1, np.int32)
    cols = _columns.decode_batch(seg, 0, seg.wrote_pos)
    f = lambda *a: (a[0], a[1], a[2])  # noqa: E731

    calls = [
        (_read.decode_record, (seg, 0, seg.wrote_pos)), (_read.get_message, (segs, 0)),
        (_read.gather_messages, (segs, cq, 0, 1, 4, 4, 1 << 20, seg.wrote_pos, 1 << 16, None, None)),
        (_read.scan_messages, (seg, 0, seg.wrote_pos, True, 8, 1 << 20)), (_read.Flatten, ([[1]], _gate.Gate("s", f))),
        (_read.decode_bytes, (seg.read(0, seg.wrote_pos),)), (_read.scan_segment, (seg, 0, seg.wrote_pos, True)),
        (_read.scan_dispatch, (seg, 0, seg.wrote_pos)),
        (_verify.segment_columns, (seg, seg.wrote_pos, 1, {}, [], True)),
        (_columns.decode_batch, (seg, 0, seg.wrote_pos)), (_columns.decode_entries, (segs, entries)),
        (_record.crc32_body, (b"x",)), (_record.java_hash, ("x",)), (_record.msg_id, (host, 0)),
        (_record.parse_msg_id, ("00" * 16,)), (_record.properties_from, (b"A\\x01B", 0, 3)),
        (_message.int_arg, ("n", 1, 0, 2)), (_message.Message, ("t", b"")),
        (_encode.append_message, (seg, msg, "t", {}, 0, 0, 1, host, 2, 1 << 20)),
        (_append.Appender, (queue, host, 2, 1 << 20, 8, f, f, f)),
        (_cq.append_entry, (cq, 0, 1, 0)), (_cq.read_entries, (cq, 0, 1)), (_cq.valid_end, (cq, 0, 20)),
        (_cq.append_entries, (cq, i64, i32, i64, 0, 1)), (_cq.topic_ids, (b"t", i32, i32 + 1, {}, [])),
        (_cq.group_entries, (rows, np.zeros(len(rows), np.int32), np.zeros(1, np.uint8))),
        (_cq.append_runs, ([cq], i64, i64, i32, i64, i64, np.array([0, 1]))),
        (_index_file.read_header, (idx,)), (_index_file.key_hash, ("k",)), (_index_file.extract_keys, (raw, rows)),
        (_index_file.put_entries, (idx, 8, 8, i32, i64, i64, 0)),
        (_index_file.truncate_entries, (idx, 8, 8, 1 << 20, 1 << 62)),
        (_index.IndexFiles, ([(idx, 8, 8)],)), (_index.IndexFiles([]).query_messages, (segs, "t", "k")),
        (_arrow.decode, (seg, 0, seg.wrote_pos, False, "s"), {4}), (_arrow.from_columns, (cols, "s"), {1}),
        (seg.write, (seg.wrote_pos, b"")), (inject_fault, ("open", 0, 5)), (fault_point, (0, "p")),
    ]
    tried = 0
    for fn, args, *may_be_none in calls:     # (the store name of an Arrow batch is any object's str)
        fn(*args)
        for i, a in enumerate(args):
            if a is None or isinstance(a, (int, float)) or i in (may_be_none or [()])[0]:
                continue
            bad = args[:i] + (None,) + args[i + 1:]
            try:
                fn(*bad)
            except (TypeError, StoreError):
                tried += 1
            else:
                raise AssertionError(f"{fn.__qualname__} accepted None as argument {i}")
    print("refused", tried)
""")


def test_kernel_entry_points_refuse_none(tmp_path):
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.split()[-1]) >= 40
