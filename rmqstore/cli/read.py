"""Read-only subcommands: stats, get, msg, at, query, dump, tail. Each opens the store
read-only: no writer lock, no byte changed, works while a broker or writer has it open."""
import sys
import time

from rmqstore.cli.common import (
    duration,
    human,
    message_line,
    msg_id,
    nonneg_int,
    open_store,
    positive_int,
    print_fields,
    print_json,
    print_line,
    print_table,
    progress,
    queue_id,
    warn_unknown_topics,
)
from rmqstore.display import local_time
from rmqstore.errors import StoreError
from rmqstore.report import BODY_MODES, message_dict, store_stats


def cmd_stats(args):
    with open_store(args) as s:
        st = store_stats(s)
    if args.json:
        return print_json(st)
    cl = st["commitlog"]
    print_fields([("path", st["path"]), ("clean shutdown", st["cleanShutdown"]),
                  ("commitlog segments", f"{cl['segments']} x {cl['segmentSize']} B = {cl['bytes']} B"),
                  ("commitlog offsets", f"{cl['minOffset']} .. {cl['maxOffset']}"),
                  ("CQ entries per file", st["consumeQueueEntriesPerFile"])], title="store")
    print()
    print_fields(human(st["checkpoint"].items()), title="checkpoint")
    print()
    print_table(["topic", "queue", "min", "max", "messages"],
                [(q["topic"], q["queueId"], q["minOffset"], q["maxOffset"], q["messages"]) for q in st["queues"]])
    print()
    print_table(["index file", "entries", "begin time", "end time", "begin offset", "end offset"],
                [(i["file"], i["entries"], local_time(i["beginTimestamp"]), local_time(i["endTimestamp"]),
                  i["beginPhyOffset"],
                  i["endPhyOffset"]) for i in st["index"]])


def _print_message(args, m):
    d = message_dict(m, args.body)
    if args.json:
        return print_json(d)
    print_fields(human(d.items()))


def cmd_get(args):
    with open_store(args) as s:
        r = s.get_messages(args.topic, args.queue, args.offset, args.count, args.tags)
        warn_unknown_topics(s, [args.topic])
        out = {"status": r.status.value, "nextBeginOffset": r.next_offset, "minOffset": r.min_offset,
               "maxOffset": r.max_offset, "messages": [message_dict(m, args.body) for m in r.messages],
               "problems": [{"queueOffset": o, "commitLogOffset": p, "size": n} for o, p, n in r.problems]}
    if args.json:
        return print_json(out)
    print_fields([("status", out["status"]), ("next offset", out["nextBeginOffset"]),
                  ("queue offsets", f"{out['minOffset']} .. {out['maxOffset']}")])
    print_table(["queue offset", "commitlog offset", "size", "msgId", "tags", "keys"],
                [(d["queueOffset"], d["commitLogOffset"], d["storeSize"], d["msgId"], d["tags"], d["keys"])
                 for d in out["messages"]])
    for p in out["problems"]:
        print(f"problem: queue offset {p['queueOffset']} -> commitlog ({p['commitLogOffset']}, {p['size']})")


def cmd_msg(args):
    with open_store(args) as s:
        _print_message(args, s.get_by_msg_id(args.msg_id))


def cmd_at(args):
    with open_store(args) as s:
        _print_message(args, s.get_by_offset(args.offset))


def cmd_query(args):
    """Filtered (default): messages whose UNIQ_KEY or a KEYS token is the key, newest
    first. --raw: RocketMQ's queryMessage answer, key hashes only, offsets ascending."""
    with open_store(args) as s:
        if args.raw:
            msgs = [s.get_by_offset(o) for o in s.query_offsets(args.topic, args.key, args.max, args.begin, args.end)]
        else:
            msgs = s.query_by_key(args.topic, args.key, args.max, args.begin, args.end)
        warn_unknown_topics(s, [args.topic])
        out = [message_dict(m, args.body) for m in msgs]
    if args.json:
        return print_json(out)
    print_table(["commitlog offset", "queue", "queue offset", "store time", "msgId", "keys"],
                [(d["commitLogOffset"], d["queueId"], d["queueOffset"], local_time(d["storeTimestamp"]), d["msgId"],
                  d["keys"])
                 for d in out])


def _scan(s, args, start):
    """Messages from commitlog ``start`` (up to ``--to``) on the selected topics."""
    topics = set(args.topic or ())
    if not getattr(args, "warned", False):   # once: tail reopens the store
        warn_unknown_topics(s, sorted(topics))
        args.warned = True
    for m in s.scan(start, getattr(args, "to", None)):
        if not topics or m.topic in topics:
            yield m


def cmd_dump(args):
    with open_store(args) as s:
        start = max(args.from_offset or 0, s.min_phy_offset)
        end = s.max_phy_offset if args.to is None else min(args.to, s.max_phy_offset)
        with progress(max(0, end - start), "dump") as bar:
            pos = start
            for m in _scan(s, args, start):
                print_line(message_dict(m, args.body))
                bar.update(m.phy_offset + m.store_size - pos)
                pos = m.phy_offset + m.store_size


def cmd_tail(args):
    """Poll: reopen read-only (a read-only store does not see later appends) and print
    what was appended after the last message printed. Once following, a reopen that fails
    (a live writer mid-change, a store being restored) is reported and retried."""
    pos, printed, last_error = args.from_offset, 0, None
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        try:
            with open_store(args) as s:
                if pos is None:
                    pos = s.max_phy_offset
                for m in _scan(s, args, pos):
                    print_line(message_dict(m, args.body)) if args.json else print(message_line(m))
                    pos = m.phy_offset + m.store_size
                    printed += 1
                    if args.max and printed >= args.max:
                        return
                pos = max(pos, s.max_phy_offset)
        except StoreError as e:
            if pos is None:
                raise
            if str(e) != last_error:   # once per distinct error, not every poll
                print(f"rmqstore tail: {e}; retrying", file=sys.stderr)
            last_error = str(e)
        sys.stdout.flush()
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(args.interval)


def register(sub, json_only, store_opts):
    def add(name, func, help_, *, body=False):
        p = sub.add_parser(name, parents=[store_opts], help=help_, description=help_)
        p.add_argument("store", help="store directory (opened read-only)")
        if body:
            p.add_argument("--body", choices=BODY_MODES, default="utf8",
                           help="message bodies as UTF-8 text (base64 when not UTF-8), base64, or none")
        p.set_defaults(func=func)
        return p

    add("stats", cmd_stats, "segments, offsets, topics and queues, index files, checkpoint, shutdown state")
    p = add("get", cmd_get, "messages of one queue from an offset (RocketMQ getMessage)", body=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--queue", type=queue_id, required=True, metavar="Q")
    p.add_argument("--offset", type=nonneg_int, required=True, metavar="N", help="queue offset")
    p.add_argument("--count", type=positive_int, default=32, metavar="K", help="at most K messages (32)")
    p.add_argument("--tags", metavar="EXPR", help="tag expression, e.g. 'TagA || TagB' (default all)")
    p = add("msg", cmd_msg, "the message a msgId names", body=True)
    p.add_argument("msg_id", type=msg_id, metavar="MSGID")
    p = add("at", cmd_at, "the message at a commitlog offset", body=True)
    p.add_argument("offset", type=nonneg_int, metavar="PHYOFFSET")
    p = add("query", cmd_query, "messages by key (UNIQ_KEY or a KEYS token) through the index", body=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--begin", type=nonneg_int, default=0, metavar="MS", help="stored at or after (epoch ms)")
    p.add_argument("--end", type=nonneg_int, metavar="MS", help="stored at or before (epoch ms)")
    p.add_argument("--max", type=positive_int, default=64, metavar="N", help="newest N index hits (64)")
    p.add_argument("--raw", action="store_true",
                   help="RocketMQ's exact answer: hash matches (colliding keys included), offsets ascending")
    dump = add("dump", cmd_dump, "every message as JSON lines in commitlog order (--json is implied)", body=True)
    tail = add("tail", cmd_tail, "follow messages appended from now on (Ctrl-C stops)", body=True)
    for p in (dump, tail):
        p.add_argument("--topic", action="append", metavar="T", help="only this topic (repeatable)")
    dump.add_argument("--from", dest="from_offset", type=nonneg_int, metavar="PHYOFFSET",
                      help="start at this commitlog offset")
    dump.add_argument("--to", type=nonneg_int, metavar="PHYOFFSET", help="stop before this commitlog offset")
    tail.add_argument("--from", dest="from_offset", type=nonneg_int, metavar="PHYOFFSET",
                      help="start at this commitlog offset (default: the current end)")
    tail.add_argument("--interval", type=duration, default=1.0, metavar="SECONDS", help="poll interval (1)")
    tail.add_argument("--max", type=positive_int, metavar="N", help="exit after N messages")
    tail.add_argument("--timeout", type=duration, metavar="SECONDS", help="exit after SECONDS")
