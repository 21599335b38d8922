"""The ``rmqstore`` command: inspect, query, export, verify and repair store directories
(ours or a real RocketMQ broker's) from a shell.

Exit status: 0 success; 1 a store or I/O error (or stdin data ``put`` refuses); 2 a usage
error (an argument the parser or the store refuses); 3 the command ran and found a
difference or a problem (``diff``, ``verify``); 4 no message at the offset or msgId given
(``at``, ``msg``, ``--from``; a query or get that finds none succeeds with an empty
answer); 130 interrupted (Ctrl-C).
Errors are one line on stderr: ``rmqstore: error: ...``; with ``--json`` also a JSON
object ``{"error": ..., "exit": status}`` on stdout.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from typing import Sequence

from rmqstore import __version__
from rmqstore.cli import admin, console, maintain, put, read, serve, spark
from rmqstore.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Parser,
    UsageError,
    dumps,
    positive_int,
)
from rmqstore.display import shown
from rmqstore.errors import InvalidArgumentError, InvalidTopicError, MessageNotFoundError, StoreError


def _help_text(text: str) -> str:
    """Docstring text as a terminal shows it: no reStructuredText literal quotes."""
    return text.replace("``", "")


def _parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Options shared by subcommands: (--json only, --json + options of a store to open)."""
    j = Parser(add_help=False)
    j.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = Parser(add_help=False, parents=[j])
    p.add_argument("--index-slots", type=positive_int, metavar="N",
                   help="index hash slots of a foreign store (default RocketMQ's 5000000)")
    p.add_argument("--index-entries", type=positive_int, metavar="N",
                   help="index entries per file of a foreign store (default RocketMQ's 20000000)")
    return j, p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rmqstore", description=_help_text(__doc__.split("\n\n")[0]),
                     epilog=_help_text(__doc__.split("\n\n")[1]), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rmqstore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    json_only, store_opts = _parents()
    for module in (read, put, admin, maintain, spark, serve, console):
        module.register(sub, json_only, store_opts)
    return parser


def _error_text(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror and not isinstance(e, StoreError):
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e) or type(e).__name__


def _failed(status: int, text: str, as_json: bool) -> int:
    """Report a failure: one line on stderr and, with --json, ``{"error", "exit"}`` on
    stdout, so a script reading JSON gets JSON (unless stdout is what failed: full, or a
    closed pipe). Returns ``status``."""
    sys.stderr.write("rmqstore: interrupted\n" if status == EXIT_INTERRUPTED else f"rmqstore: error: {shown(text)}\n")
    if as_json:
        try:
            sys.stdout.write(dumps({"error": text, "exit": status}) + "\n")
            sys.stdout.flush()
        except OSError:
            _discard_stdout()
    return status


def _discard_stdout() -> None:
    """Send what stdout still buffers to /dev/null, so the flush at exit does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _standard_streams() -> bool:
    """Make the standard streams safe to use; False when stdout was closed (``>&-``).

    A closed descriptor 0, 1 or 2 is opened on /dev/null first: otherwise the next file
    opened (a store's ``lock``, a segment) would take its number, and output meant for the
    terminal (a Spark JVM's, say) would be written into it. Text the stream's encoding
    cannot hold (a store path of non-UTF-8 bytes, an ASCII terminal) is written as
    backslash escapes instead of failing."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(os.devnull)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    closed = sys.stdout is None
    if closed:
        sys.stdout = open(os.devnull, "w")
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    return not closed


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (the console script exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    if not _standard_streams():
        return _failed(EXIT_ERROR, "stdout is closed; redirect it to /dev/null to discard the output", False)
    try:
        args = build_parser().parse_args(argv)
        status = args.func(args)
        sys.stdout.flush()
        return EXIT_OK if status is None else status
    except UsageError as e:
        return _failed(EXIT_USAGE, str(e), as_json)
    except KeyboardInterrupt:
        return _failed(EXIT_INTERRUPTED, "interrupted", as_json)
    except MessageNotFoundError as e:
        return _failed(EXIT_NOT_FOUND, _error_text(e), as_json)
    except (InvalidArgumentError, InvalidTopicError) as e:   # a command-line value the store refuses
        return _failed(EXIT_USAGE, _error_text(e), as_json)
    except BrokenPipeError:
        # The reader went away (``| head``): silence the final flush too.
        _discard_stdout()
        return EXIT_OK
    except (CommandError, StoreError, OSError) as e:
        return _failed(EXIT_ERROR, _error_text(e), as_json)
