"""``rmqstore serve``: run the RocketMQ 5 gRPC endpoint (rmqstore.endpoint) on a store."""
import argparse
import contextlib
import dataclasses
import logging
import sys
from typing import Any, Iterator

from rmqstore.cli.common import CommandError, byte_size, nonneg_int, positive_int, require_store, store_config
from rmqstore.store import MessageStore


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.create:
        require_store(args.store)
    try:
        from rmqstore.endpoint import serve
    except ImportError as e:
        raise CommandError(f"the endpoint needs grpcio and rocketmq-python-client ({e})") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("rmqstore.endpoint").setLevel(logging.INFO)
    cfg = store_config(args)
    if args.sync_flush:
        cfg = dataclasses.replace(cfg, flush_mode="sync")
    if args.allow_writes and args.console is None:
        raise CommandError("--allow-writes is for the console: give --console too")
    with MessageStore(args.store, cfg) as store, _console(args, store):
        serve(store, args.listen, auto_create=not args.no_auto_create, max_attempts=args.max_attempts,
              fifo_groups=frozenset(args.fifo_group), workers=args.workers,
              transaction_check_interval_ms=args.transaction_check_interval,
              transaction_timeout_ms=args.transaction_timeout, transaction_check_max=args.transaction_check_max)
    return 0


def _console(args: argparse.Namespace, store: MessageStore) -> Any:
    """With --console, the web console on the served store, beside the endpoint (read-only
    but for the DLQ page's resend with --allow-writes)."""
    if args.console is None:
        return contextlib.nullcontext()
    try:
        from rmqstore.console import running, split_listen
        split_listen(args.console)
    except ImportError as e:
        raise CommandError(f"--console needs the [console] extra ({e})") from None
    except ValueError as e:
        raise CommandError(str(e)) from None
    return _announced(running([args.store], args.console, store if args.allow_writes else None, store.config))


@contextlib.contextmanager
def _announced(console: Any) -> Iterator[None]:
    with console as (url, _):
        print(f"rmqstore console at {url}", file=sys.stderr, flush=True)
        yield


def register(sub: argparse._SubParsersAction, json_only: argparse.ArgumentParser,
             store_opts: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[store_opts], help="serve the store to RocketMQ 5 clients (gRPC)",
                       description="Run a single-node RocketMQ 5 endpoint (the proxy's gRPC MessagingService) "
                       "on STORE (with --create, made if it is not a store yet) until SIGINT or SIGTERM; then "
                       "flush and close. Official clients produce and consume through it unchanged.")
    p.add_argument("store")
    p.add_argument("--create", action="store_true",
                   help="create the store if it does not exist (refused without it, so a mistyped path "
                   "does not become a new store)")
    p.add_argument("--listen", default="127.0.0.1:8081", metavar="HOST:PORT",
                   help="address to listen on (default loopback 127.0.0.1:8081)")
    p.add_argument("--no-auto-create", action="store_true",
                   help="refuse topics the store does not hold (default: create them on first use)")
    p.add_argument("--max-attempts", type=positive_int, default=17, metavar="N",
                   help="deliveries before a message goes to %%DLQ%%group (default 17)")
    p.add_argument("--fifo-group", action="append", default=[], metavar="GROUP",
                   help="tell push consumers of GROUP to consume in FIFO order (repeatable)")
    p.add_argument("--segment-size", dest="commitlog_file_size", type=byte_size, metavar="BYTES",
                   help="commitlog segment size of a new store, e.g. 64M (default RocketMQ's 1G)")
    p.add_argument("--sync-flush", action="store_true", help="acknowledge a send only once it is on disk")
    p.add_argument("--workers", type=positive_int, default=256, metavar="N",
                   help="gRPC worker threads, at least 4 (default 256): each connected client holds one and each "
                        "waiting receive another, within three quarters of them (N * 3/8 clients)")
    p.add_argument("--transaction-check-interval", type=positive_int, default=30_000, metavar="MS",
                   help="how often open transactions are checked with their producers (default 30000, "
                        "RocketMQ's transactionCheckInterval)")
    p.add_argument("--transaction-timeout", type=nonneg_int, default=6_000, metavar="MS",
                   help="age before a transaction without the client's own recovery delay is checked (default "
                        "6000, RocketMQ's transactionTimeOut)")
    p.add_argument("--transaction-check-max", type=positive_int, default=15, metavar="N",
                   help="checks before an unresolved transaction is discarded to TRANS_CHECK_MAX_TIME_TOPIC "
                        "(default 15, RocketMQ's transactionCheckMax)")
    p.add_argument("--console", nargs="?", const="127.0.0.1:8080", metavar="HOST:PORT",
                   help="also serve the read-only web console on the store (default 127.0.0.1:8080)")
    p.add_argument("--allow-writes", action="store_true",
                   help="let the console's DLQ page resend a dead letter to its origin topic (its only write; "
                        "CSRF-protected; off by default)")
    p.set_defaults(func=cmd_serve)
