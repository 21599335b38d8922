"""Maintenance subcommands: verify (read-only), clean (retention now) and rebuild (consume
queues and index from the commitlog)."""
import dataclasses
import time

from rmqstore.cli.common import (
    EXIT_FOUND,
    human,
    nonneg_int,
    open_store,
    positive_int,
    print_fields,
    print_json,
    print_table,
    progress,
    require_store,
    seconds,
    segment_files,
    store_config,
)
from rmqstore.display import shown
from rmqstore.errors import DerivedFileError
from rmqstore.report import camel_keys
from rmqstore.store import MessageStore

_EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))


def _commitlog_files_bytes(store):
    """Bytes of the commitlog files (what recovery and then the rebuild's dispatch read)."""
    return 2 * sum(size for _, _, size in segment_files(store))


def _commitlog_bytes(s):
    segs = s.commitlog.segments
    return len(segs.segments) * segs.file_size


def cmd_verify(args):
    with open_store(args) as s:
        with progress(_commitlog_bytes(s), "verify") as bar:
            rep = s.verify(progress=bar.update)
    if args.json:
        print_json(camel_keys(rep.as_dict()))
    else:
        print_fields([("store", args.store), ("clean shutdown", rep.clean_shutdown),
                      ("commitlog", f"{rep.segments} segments, {rep.bytes} bytes, {rep.records} records, "
                                    f"end {rep.commitlog_end}"),
                      ("consume queues", f"{rep.consume_queues} queues, {rep.consume_queue_entries} entries"),
                      ("index", f"{rep.index_files} files, {rep.index_entries} entries"),
                      ("not dispatched yet", rep.undispatched), ("seconds", f"{rep.seconds:.3f}")], title="verify")
        if rep.problems:
            print()
            print_table(["kind", "offset", "problem"], [(p.kind, p.offset, p.message) for p in rep.problems])
        total = len(rep.problems) + rep.problems_omitted
        print("ok" if rep.ok else f"{total} problem(s)" if total else
              f"{rep.undispatched} message(s) missing from consume queues or index after a clean shutdown")
    return None if rep.ok else EXIT_FOUND


def cmd_clean(args):
    require_store(args.store)
    cfg = store_config(args)
    if args.force:
        cfg = cfg.with_(delete_when=_EVERY_HOUR)
    if args.reserved_hours is not None:
        cfg = cfg.with_(file_reserved_time=args.reserved_hours)
    with MessageStore(args.store, cfg, read_only=not args.yes) as s:
        rep = camel_keys(dataclasses.asdict(s.clean_expired(args.now, dry_run=not args.yes)))
    if args.json:
        return print_json(rep)
    title = "clean (dry run)" if rep["dryRun"] else "clean"
    print_fields(human((k, v) for k, v in rep.items() if k != "segments"), title=title)
    for path in rep["segments"]:
        print(("would delete " if rep["dryRun"] else "deleted ") + shown(path))
    if rep["dryRun"]:
        print(_dry_run_note("deleted", "delete"))


def _dry_run_note(done, verb):
    return f"dry run: nothing {done}. Run again with --yes to {verb}."


def _rebuild_plan(args):
    """What a rebuild would remove and dispatch again (a damaged consume-queue or index file,
    which a rebuild replaces unread, is named; what it held is not counted)."""
    try:
        with open_store(args) as s:
            return {"dryRun": True, **_logics_counts(s), "bytesToDispatch": s.max_phy_offset - s.min_phy_offset}
    except DerivedFileError as e:
        with MessageStore(args.store, store_config(args), read_only=True, rebuild=True) as s:
            return {"dryRun": True, "damaged": str(e.__cause__ or e),
                    "bytesToDispatch": s.max_phy_offset - s.min_phy_offset}


def _logics_counts(s):
    return {"consumeQueues": len(s.consume_queues.queues),
            "consumeQueueEntries": sum(cq.max_offset - cq.min_offset for cq in s.consume_queues.queues.values()),
            "indexFiles": len(s.index.files) if s.index is not None else 0}


def cmd_rebuild(args):
    t0 = time.monotonic()
    if not args.yes:
        out = _rebuild_plan(args)
        if args.json:
            return print_json(out)
        print_fields(human(out.items()), title="rebuild (dry run): would remove consumequeue/ and index/ and "
                     "dispatch the commitlog again")
        print(_dry_run_note("changed", "rebuild"))
        return None
    require_store(args.store)
    with progress(_commitlog_files_bytes(args.store), "rebuild") as bar, \
            MessageStore(args.store, store_config(args), rebuild=True, progress=bar.update) as s:
        out = {"dryRun": False, "bytesDispatched": s.max_phy_offset - s.min_phy_offset, **_logics_counts(s),
               "indexEntries": sum(f.count - 1 for f in s.index.files) if s.index is not None else 0}
    out["seconds"] = round(time.monotonic() - t0, 3)
    if args.json:
        return print_json(out)
    print_fields(human(out.items()), title="rebuild")


def register(sub, json_only, store_opts):
    p = sub.add_parser("verify", parents=[store_opts], help="check every record, consume queue and index file",
                       description="Check the whole store read-only: every commitlog record's structure and "
                       "body CRC, BLANK end-of-file records, each consume-queue entry against the record it "
                       "points at, index links and keys, checkpoint times. Exit status 3 when problems are "
                       "found; each names the file and offset.")
    p.add_argument("store")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("clean", parents=[store_opts], help="apply the retention rules now",
                       description="Delete expired commitlog segments (older than the reserved time, at a "
                       "deleteWhen hour, or at once when the disk is fuller than diskMaxUsedSpaceRatio) and "
                       "the consume-queue and index files below the new minimum; never the segment being "
                       "written. Without --yes it is a dry run: the store is opened read-only and the "
                       "command lists what it would delete and why.")
    p.add_argument("store")
    p.add_argument("--now", type=seconds, metavar="SECONDS", help="the time to apply the rules at (epoch seconds)")
    p.add_argument("--force", action="store_true", help="whatever the hour (deleteWhen), delete what has expired")
    p.add_argument("--reserved-hours", type=nonneg_int, metavar="H",
                   help="keep segments written in the last H hours (default RocketMQ's 72)")
    p.add_argument("--yes", action="store_true", help="delete (opens the store for writing); default: a dry run")
    p.set_defaults(func=cmd_clean)
    p = sub.add_parser("rebuild", parents=[store_opts], help="rebuild consume queues and index from the commitlog",
                       description="Remove consumequeue/ and index/ and dispatch the whole commitlog again, "
                       "writing the files incremental dispatch writes. They are not read first, so damaged "
                       "ones (that a plain open refuses) are replaced too. Without --yes it is a dry run that "
                       "says what would be removed and dispatched, and changes nothing.")
    p.add_argument("store")
    p.add_argument("--cq-entries", dest="consume_queue_entries", type=positive_int, metavar="N",
                   help="entries per consume-queue file when the store has none to measure (default 300000)")
    p.add_argument("--yes", action="store_true", help="rebuild (opens the store for writing); default: a dry run")
    p.set_defaults(func=cmd_rebuild)
