"""``rmqstore put``: append messages read as JSON lines (what ``dump`` writes) from stdin,
all or nothing per chunk of lines."""
import base64
import binascii
import io
import os
import sys

from rmqstore._message import Message, queue_id_arg
from rmqstore.cli.common import CommandError, byte_size, positive_int, print_line, require_store, store_config
from rmqstore.errors import StoreError
from rmqstore.files import parse_json, remove_entries, remove_if_empty
from rmqstore.store import MessageStore
from rmqstore.topics import validate_topic

# Fields ``put`` reads: a message as ``dump`` writes it (RocketMQ's MessageExt names). The ones
# the store assigns when it writes a record are accepted and ignored, so a dump line can be put
# back as it is; ``bodyLength`` is checked against the body.
_PUT_FIELDS = {"topic", "body", "bodyEncoding", "tags", "keys", "properties", "uniqKey", "queueId", "flag",
               "sysFlag", "bornTimestamp", "bornHost", "reconsumeTimes", "preparedTransactionOffset", "delayLevel",
               "bodyLength"}
_ASSIGNED_FIELDS = {"queueOffset", "commitLogOffset", "storeSize", "msgId", "storeTimestamp", "storeHost",
                    "bodyCRC", "version"}
_MESSAGE_ARGS = {"flag": "flag", "sysFlag": "sys_flag", "bornTimestamp": "born_timestamp", "bornHost": "born_host",
                 "reconsumeTimes": "reconsume_times", "preparedTransactionOffset": "prepared_transaction_offset",
                 "delayLevel": "delay_level"}


def _body(d):
    body, encoding = d.get("body"), d.get("bodyEncoding", "utf8")
    if "body" not in d:
        if d.get("bodyLength"):
            raise ValueError(f"no 'body' for a message of {d['bodyLength']} bytes (dumped with --body none?)")
        return b""
    if not isinstance(body, str):
        raise ValueError("'body' must be a string")
    if encoding == "utf8":
        data = body.encode("utf-8")
    elif encoding == "base64":
        data = base64.b64decode(body, validate=True)
    else:
        raise ValueError(f"'bodyEncoding' must be 'utf8' or 'base64', not {encoding!r}")
    if d.get("bodyLength", len(data)) != len(data):
        raise ValueError(f"'bodyLength' is {d['bodyLength']} but the body has {len(data)} bytes")
    return data


def parse_put_line(line):
    """A JSON object -> (Message, queue id or None). Raises ValueError with the reason."""
    d = parse_json(line, unique_keys=True)
    if not isinstance(d, dict):
        raise ValueError("expected a JSON object")
    unknown = set(d) - _PUT_FIELDS - _ASSIGNED_FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(_PUT_FIELDS))})")
    if not isinstance(d.get("topic"), str):
        raise ValueError("'topic' (a string) is required")
    props = d.get("properties")
    if d.get("uniqKey") is not None:
        if not isinstance(props, dict) and props is not None:
            raise ValueError("'properties' must be an object")
        props = {**(props or {}), "UNIQ_KEY": d["uniqKey"]}
    msg = Message(d["topic"], _body(d), tags=d.get("tags"), keys=d.get("keys"), properties=props,
                  **{arg: d[field] for field, arg in _MESSAGE_ARGS.items() if d.get(field) is not None})
    queue_id = d.get("queueId")
    return msg, None if queue_id is None else queue_id_arg(queue_id)


def _read_chunks(lines, size):
    """Lists of up to ``size`` (line number, text) pairs, blank lines left out."""
    chunk = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            chunk.append((n, line))
            if len(chunk) == size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _stdin_lines():
    """stdin's lines as UTF-8, what ``dump`` writes, whatever the locale; bytes that are not
    UTF-8 are kept as lone surrogates, for _parse_chunk to refuse naming their line (a JSON
    error such as "Expecting value: line 1 column 1" said nothing of the encoding)."""
    return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")


def _parse_chunk(chunk, config):
    """[(Message, queue id)] of a chunk, every line checked (fields, types, topic name, queue id)
    before anything is written. Raises CommandError naming the first bad line."""
    out = []
    for n, line in chunk:
        try:
            line.encode()
        except UnicodeEncodeError as e:   # bytes _stdin_lines kept as lone surrogates
            raise CommandError(f"stdin line {n}: not UTF-8 text (at character {e.start + 1})") from None
        try:
            msg, queue_id = parse_put_line(line)
            validate_topic(msg.topic, config.message_version, config.strict_topic_names)
        except (ValueError, TypeError, binascii.Error, StoreError) as e:
            raise CommandError(f"stdin line {n}: {e}") from None
        out.append((msg, queue_id))
    return out


def _put_chunk(store, chunk, parsed):
    """Write a checked chunk as one put_batch, each message with its queue id (None: round
    robin): all or nothing. A message put_batch refuses (a property it cannot encode, a
    record too large) is a CommandError naming its line."""
    try:
        return store.put_batch([m for m, _ in parsed], [q for _, q in parsed])
    except StoreError as e:
        if getattr(e, "message_index", None) is None:
            raise
        raise CommandError(f"stdin line {chunk[e.message_index][0]}: {e}") from None


def _remove_new_entries(path, before, lock):
    """Undo a store creation: remove what appeared in ``path`` (``before``: its entries then,
    None when ``path`` did not exist), while ``lock`` (a descriptor of ``path/lock``) holds
    the writer lock, so no writer opens the store meanwhile and has its puts removed. The
    lock file goes last, then the directory if nothing else is in it (a writer that took
    a new lock file once ours was gone keeps its store). The lock is let go at the end."""
    try:
        remove_entries(path, set(os.listdir(path)) - (before or set()))
        if before is None:
            remove_if_empty(path)
    finally:
        os.close(lock)


def cmd_put(args):
    new = not os.path.isdir(os.path.join(args.store, "commitlog"))
    if not args.create or not new:
        require_store(args.store)
    before = set(os.listdir(args.store)) if new and os.path.isdir(args.store) else None
    config = store_config(args)
    if args.any_topic_name:
        config = config.with_(strict_topic_names=False)
    stored, chunks, store = 0, 0, None
    try:
        for chunk in _read_chunks(_stdin_lines(), args.chunk):
            lines = f"lines {chunk[0][0]}-{chunk[-1][0]}"
            try:
                parsed = _parse_chunk(chunk, config)
                if store is None:   # a new store is created only once the first chunk is good
                    store = MessageStore(args.store, config)
                    # records already there: another writer made the store first, it is not ours to undo
                    new = new and store.max_phy_offset == 0
                results = _put_chunk(store, chunk, parsed)
            except CommandError as e:
                raise CommandError(f"{e}; chunk of stdin {lines} refused, none of it stored "
                                   f"({stored} message(s) of earlier chunks stored)") from None
            stored, chunks = stored + len(results), chunks + 1
            if args.json:
                for r in results:
                    print_line({"msgId": r.msg_id, "topic": r.topic, "queueId": r.queue_id,
                                "queueOffset": r.queue_offset, "commitLogOffset": r.phy_offset,
                                "storeSize": r.size, "storeTimestamp": r.store_timestamp})
            else:
                print(f"stdin {lines}: {len(results)} message(s) stored, commitlog offsets "
                      f"{results[0].phy_offset}..{results[-1].phy_offset + results[-1].size}")
    except BaseException as e:
        if store is not None:
            opened, store = store, None
            if not new or stored:
                opened.close()
            else:
                _remove_new_entries(args.store, before, opened.close_keeping_lock())
                if isinstance(e, CommandError):
                    raise CommandError(f"{e}; the new store was removed") from None
        raise
    finally:
        if store is not None:
            store.close()
    if not args.json:
        print(f"{stored} message(s) stored in {chunks} chunk(s) (all or nothing per chunk of up to {args.chunk} "
              "lines)" if chunks else
              "no messages on stdin: nothing stored" + (", no store created" if new else ""))


def register(sub, json_only, store_opts):
    p = sub.add_parser("put", parents=[store_opts], help="append messages read as JSON lines from stdin",
                       description="Append one message per JSON line of stdin, as 'rmqstore dump' writes them: "
                       "topic (required), body with bodyEncoding (utf8, the default, or base64), tags, keys "
                       "(a string or a list), properties, uniqKey, queueId (default: round robin), flag, "
                       "sysFlag, bornTimestamp, bornHost, reconsumeTimes, preparedTransactionOffset, delayLevel. "
                       "The fields a store assigns (queueOffset, commitLogOffset, storeSize, msgId, "
                       "storeTimestamp, storeHost, bodyCRC, version) are ignored; bodyLength is checked. "
                       "All or nothing per chunk: every line of a chunk (--chunk lines) is checked before any "
                       "of it is written, so a bad line stores none of its chunk (earlier chunks stay "
                       "stored). A new store is created (--create) only once the first chunk is good. "
                       "--json prints one result line per message; the table says what each chunk stored.")
    p.add_argument("store", help="store directory (opened for writing)")
    p.add_argument("--create", action="store_true",
                   help="create the store if it does not exist (refused without it, so a mistyped path "
                   "does not become a new store)")
    p.add_argument("--chunk", type=positive_int, default=1000, metavar="LINES",
                   help="lines per all-or-nothing chunk (1000)")
    p.add_argument("--any-topic-name", action="store_true",
                   help="accept any topic a store can hold, not only RocketMQ's broker rule [%%|a-zA-Z0-9_-] "
                   "(to put back a dump of a store with such topics)")
    p.add_argument("--message-version", type=int, choices=(1, 2),
                   help="record version of a new store (default 1; 2 holds topics of up to 255 bytes)")
    p.add_argument("--segment-size", dest="commitlog_file_size", type=byte_size, metavar="BYTES",
                   help="commitlog segment size of a new store, e.g. 64M (default RocketMQ's 1G)")
    p.add_argument("--cq-entries", dest="consume_queue_entries", type=positive_int, metavar="N",
                   help="entries per consume-queue file of a new store (default 300000)")
    p.set_defaults(func=cmd_put)
