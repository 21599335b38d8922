"""Subcommands over whole stores: recover, digest, diff, bench."""
import argparse
import dataclasses

import numpy as np

from rmqstore.cli.common import (
    EXIT_FOUND,
    CommandError,
    byte_size,
    human,
    nonneg_int,
    positive_int,
    print_fields,
    print_json,
    print_table,
    progress,
    segment_files,
    store_config,
)
from rmqstore.config import StoreConfig
from rmqstore.files import open_reader
from rmqstore.report import camel_keys, digest_segments, segment_digests
from rmqstore.store import MessageStore

_CHUNK = 1 << 20


def cmd_recover(args):
    files = segment_files(args.store)
    with progress(sum(n for _, _, n in files), "recover") as bar, \
            MessageStore(args.store, store_config(args), read_only=not args.yes, progress=bar.update,
                         repair=args.yes) as s:
        rep = camel_keys({"dry_run": not args.yes, **dataclasses.asdict(s.recovery)})
    rep["seconds"] = round(rep["seconds"], 6)
    if args.json:
        return print_json(rep)
    print_fields(human(rep.items()), title="recovery (dry run: what it would do)" if not args.yes else "recovery")
    if not args.yes:
        print("dry run: nothing changed. Run again with --yes to recover (back the store up first).")


# -- digests ---------------------------------------------------------------------------------
def cmd_digest(args):
    files = segment_files(args.store)
    with progress(sum(n for _, _, n in files), "digest") as bar:
        rows = segment_digests(files, bar.update)
    if args.json:
        return print_json(rows)
    print_table(["segment", "size", "crc32c"], [(r["file"], r["size"], r["crc32c"]) for r in rows])


def _first_difference(path_a, path_b, size):
    """Offset of the first differing byte of two segment files (a missing file reads as
    zeros, like space never written), or None."""
    fa = open_reader(path_a) if path_a else None
    fb = open_reader(path_b) if path_b else None
    try:
        pos = 0
        while pos < size:
            a = fa.read(_CHUNK) if fa else bytes(min(_CHUNK, size - pos))
            b = fb.read(_CHUNK) if fb else bytes(min(_CHUNK, size - pos))
            if a != b:
                n = min(len(a), len(b))
                ne = np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n)
                return pos + (int(ne.argmax()) if ne.any() else n)
            if not a:
                return None
            pos += len(a)
        return None
    finally:
        for f in (fa, fb):
            if f:
                f.close()


def cmd_diff(args):
    """Over the offsets both stores hold: segments whose digests differ are compared byte
    by byte; the first differing byte is where the stores diverge."""
    a, b = segment_files(args.store), segment_files(args.other)
    sizes = {n for _, _, n in a + b}
    if len(sizes) > 1:
        raise CommandError(f"commitlog segment sizes differ: {sorted(sizes)}")
    size = sizes.pop() if sizes else 0
    start = max(a[0][0] if a else 0, b[0][0] if b else 0)
    a = [f for f in a if f[0] >= start]
    b = [f for f in b if f[0] >= start]
    with progress(sum(n for _, _, n in a + b), "diff") as bar:
        da, db = digest_segments(a, bar.update), digest_segments(b, bar.update)
    pa, pb = {o: p for o, p, _ in a}, {o: p for o, p, _ in b}
    diverge = None
    for off in sorted(set(da) | set(db)):
        if da.get(off) != db.get(off):
            at = _first_difference(pa.get(off), pb.get(off), size)
            if at is not None:
                diverge = off + at
                break
    out = {"identical": diverge is None, "firstDiffOffset": diverge, "comparedFrom": start,
           "segmentsA": len(a), "segmentsB": len(b)}
    if args.json:
        print_json(out)
    else:
        print("identical" if diverge is None else f"stores diverge at commitlog offset {diverge}")
    return None if diverge is None else EXIT_FOUND


def _body_size(text):
    """A bench body size: at most the store's message size limit."""
    v, limit = byte_size(text, minimum=0), StoreConfig().max_message_size
    if v > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit} (the store's message size limit), got {v}")
    return v


def cmd_bench(args):
    from rmqstore import bench  # imports the peers (sqlite3, LMDB) only when asked
    rows = bench.run(args.dir, args.messages, args.body_size, args.batch, peers=not args.no_peers,
                     out=None if args.json else print)
    if args.json:
        print_json([{"system": name, "operation": kind, "label": label, "count": n, "seconds": sec,
                     "bodyBytes": nbytes} for name, kind, label, n, sec, nbytes in rows])


def register(sub, json_only, store_opts):
    p = sub.add_parser("recover", parents=[store_opts], help="run crash recovery and report what it did",
                       description="With --yes: open the store for writing, which recovers it (truncating the "
                       "commitlog at its first invalid record, a torn tail or damage, and rebuilding consume-queue "
                       "entries), close it cleanly, and print the report. Without --yes a dry run: the store is "
                       "opened read-only and the report says what recovery would cut, and whether that cut "
                       "discards durable data (cutsDurableData: a plain writer open then refuses the store); "
                       "nothing changes.")
    p.add_argument("store")
    p.add_argument("--yes", action="store_true", help="recover (opens the store for writing); default: a dry run")
    p.set_defaults(func=cmd_recover)
    p = sub.add_parser("digest", parents=[json_only], help="CRC32C of every commitlog segment",
                       description="CRC32C of every commitlog segment file, for backup and replica checks.")
    p.add_argument("store")
    p.set_defaults(func=cmd_digest)
    p = sub.add_parser("diff", parents=[json_only], help="first commitlog offset where two stores diverge",
                       description="First commitlog offset where two stores (a master and a replica, a "
                       "store and its backup) diverge: digests first, then bytes. Exit status 3 when "
                       "they differ.")
    p.add_argument("store", metavar="STORE_A")
    p.add_argument("other", metavar="STORE_B")
    p.set_defaults(func=cmd_diff)
    p = sub.add_parser("bench", parents=[json_only], help="the standard workload, rmqstore beside its peers",
                       description="Put, read back per queue, scan and look keys up in a workload on rmqstore "
                       "and, beside it, sqlite3, LMDB (if installed) and a pure-Python reader/writer; prints a "
                       "table.")
    p.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    p.add_argument("--messages", type=positive_int, default=1_000_000, metavar="N", help="messages (1000000)")
    p.add_argument("--body-size", type=_body_size, default=128, metavar="BYTES", help="body size, e.g. 1K (128)")
    p.add_argument("--batch", type=nonneg_int, default=0, metavar="K", help="put_batch of K (0: single puts)")
    p.add_argument("--no-peers", action="store_true", help="time rmqstore only")
    p.set_defaults(func=cmd_bench)
