"""Shared helpers of the rmqstore command: argument types, opening stores, output
(JSON documents and lines, tables, progress bars)."""
import argparse
import difflib
import json
import os
import re
import stat
import sys
import unicodedata

from tqdm import tqdm

from rmqstore import report
from rmqstore.config import StoreConfig
from rmqstore.display import local_time, shown
from rmqstore.store import MessageStore

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FOUND, EXIT_NOT_FOUND, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


class CommandError(Exception):
    """A failure the command reports as one line and exit status 1."""


class UsageError(Exception):
    """Bad command-line arguments: reported as one line and exit status 2."""


class _StoreOnce(argparse.Action):
    """argparse's ``store``, except that an option given twice is a usage error (argparse
    keeps the last value silently: ``--topic A --topic B`` read B)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(_GIVEN, set())
        if option_string is not None and self.dest in given:
            parser.error(f"argument {'/'.join(self.option_strings)}: given more than once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


_GIVEN = "_options_given"   # the namespace attribute _StoreOnce keeps while parsing


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are UsageError(``... (see PROG --help)``), which the
    command reports as its other errors (one line; JSON too with --json), and whose
    options take one value once (see _StoreOnce)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        ns.__dict__.pop(_GIVEN, None)
        return ns, extras

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


I64_MAX = (1 << 63) - 1


def nonneg_int(text, limit=I64_MAX):
    """An int in 0..``limit`` written in ASCII (decimal, or 0x / 0o / 0b): no spaces,
    underscores or other scripts' digits, which int() would take."""
    try:
        if not text.isascii() or "_" in text or text != text.strip():
            raise ValueError(text)
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    if v > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit}, got {v}")
    return v


def queue_id(text):
    """A queue id: an int in 0..2^31-1."""
    return nonneg_int(text, 0x7FFFFFFF)


def msg_id(text):
    """A msgId: 32 (IPv4) or 56 (IPv6) hex digits."""
    if not (text.isascii() and len(text) in (32, 56) and all(c in "0123456789abcdefABCDEF" for c in text)):
        raise argparse.ArgumentTypeError(f"not a msgId (32 or 56 hex digits): {text!r}")
    return text


def positive_int(text):
    v = nonneg_int(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


MAX_SECONDS = 1e9   # about 31 years: any wait longer is a mistake (time.sleep overflows near 9.2e9)


def seconds(text):
    """A number of seconds (a duration, or an epoch time the store checks): finite, >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def duration(text):
    """seconds() that a command waits: at most MAX_SECONDS."""
    v = seconds(text)
    if v > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS:.0f} seconds, got {text}")
    return v


_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def byte_size(text, minimum=1):
    """A size in bytes, at least ``minimum``, optionally with a binary suffix (either case):
    ``4096``, ``64K``, ``64M``, ``1G``."""
    unit = _SUFFIXES.get(text[-1:].upper(), 1)
    v = nonneg_int(text[:-1] if unit > 1 else text) * unit
    if v < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum} bytes, got {text}")
    return v


def store_config(args):
    """StoreConfig from the options (an existing store's segment sizes come from its files)."""
    changes = {k: getattr(args, k) for k in ("index_slots", "index_entries", "commitlog_file_size",
                                             "consume_queue_entries", "message_version") if getattr(args, k, None)}
    return StoreConfig(**changes)


def warn_unknown_topics(s, topics):
    """Say on stderr which of ``topics`` store ``s`` holds no consume queue for, naming the
    nearest topics it does hold; the answer itself stays RocketMQ's (no messages)."""
    held = s.topics()
    for topic in topics:
        if topic not in held:
            near = difflib.get_close_matches(topic, held, n=3, cutoff=0.5)
            hint = f"; nearest: {', '.join(near)}" if near else f"; it holds {len(held)} topic(s)"
            print(f"rmqstore: the store has no topic {topic!r}{hint}", file=sys.stderr)


def require_store(path):
    """Refuse a path that is not an existing store directory (before anything opens it),
    naming the cause: missing, not a directory, no permission to look, no commitlog/."""
    for where in (path, os.path.join(path, "commitlog")):
        try:
            st = os.stat(where)
        except PermissionError:
            raise CommandError(f"{where}: permission denied (the store cannot be read by this user)") from None
        except FileNotFoundError:
            if where == path:
                raise CommandError(f"{path}: no such store directory") from None
            raise CommandError(f"{path}: not a RocketMQ store (no commitlog/ directory)") from None
        except OSError as e:
            raise CommandError(f"{where}: {e.strerror or e}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CommandError(f"{where}: not a directory" if where == path else
                               f"{path}: not a RocketMQ store (commitlog is not a directory)")
    if not os.access(path, os.R_OK | os.X_OK) or not os.access(os.path.join(path, "commitlog"), os.R_OK | os.X_OK):
        raise CommandError(f"{path}: permission denied (the store cannot be read by this user)")


def segment_files(store):
    """(offset, path, size) of the commitlog segments of ``store``, refused first when it is no store."""
    require_store(store)
    return report.segment_files(store)


def open_store(args, read_only=True, create=False):
    """Open ``args.store``: read-only (no lock, nothing changes on disk) or as the writer."""
    if not create:
        require_store(args.store)
    return MessageStore(args.store, store_config(args), read_only=read_only)


def human(pairs):
    """(key, value) pairs of a JSON document as a table shows them: ``endOffset`` as
    ``end offset``, times (keys ending in ``Timestamp``) as local ISO-8601, fractions with
    three decimals, lists joined by ``; ``."""
    out = []
    for k, v in pairs:
        label = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", k).replace("_", " ").lower()
        if k.lower().endswith("timestamp"):
            v = local_time(v)
        elif isinstance(v, float):
            v = f"{v:.3f}"
        elif isinstance(v, list):
            v = "; ".join(map(str, v)) or None
        out.append((label, v))
    return out


def display_width(text):
    """Terminal columns ``text`` takes: wide and full-width characters (CJK) count two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1
               for c in text)


def pad(text, width):
    return text + " " * (width - display_width(text))


def _ascii_json():
    """True when stdout cannot take any Unicode character (an ASCII or Latin-1 locale):
    JSON then escapes them all (``\\u00e4``), so the document stays valid JSON."""
    return (sys.stdout.encoding or "").lower().replace("-", "").replace("_", "") != "utf8"


def dumps(obj):
    return json.dumps(obj, ensure_ascii=_ascii_json())


def print_json(obj):
    print(json.dumps(obj, ensure_ascii=_ascii_json(), indent=2))


def print_line(obj):
    sys.stdout.write(dumps(obj) + "\n")


def print_table(headers, rows, title=None):
    """Rows of cells under ``headers``, columns padded to their widest cell."""
    if title:
        print(title)
    cells = [[str(h) for h in headers]] + [["-" if c is None else shown(c) for c in r] for r in rows]
    widths = [max(display_width(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        print("  ".join(pad(c, w) for c, w in zip(r, widths, strict=False)).rstrip())
    if not rows:
        print("(none)")


def print_fields(pairs, title=None):
    """``name: value`` lines, names aligned."""
    if title:
        print(title)
    width = max((display_width(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        print(f"  {pad(k, width)}  {'-' if v is None else shown(v)}")


def message_line(m):
    """One line for a message in human output."""
    body = m.body[:40].decode("utf-8", "replace").replace("\n", " ")
    return shown(f"{m.phy_offset}  {m.topic}/{m.queue_id}@{m.queue_offset}  {m.msg_id}  tags={m.tags}  "
                 f"keys={m.properties.get('KEYS')}  {len(m.body)}B  {body!r}")


def progress(total, desc, unit="B"):
    """A tqdm bar on stderr, shown only when stderr is a terminal."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                disable=not sys.stderr.isatty(), leave=False)
