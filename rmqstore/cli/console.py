"""``rmqstore console``: the read-only web UI and JSON API (rmqstore.console)."""
import argparse

from rmqstore.cli.common import CommandError, store_config


def cmd_console(args: argparse.Namespace) -> int:
    try:
        from rmqstore.console import serve
    except ImportError as e:
        raise CommandError(f"the console needs the [console] extra: pip install 'rmqstore[console]' ({e})") from None
    try:
        serve(args.stores, args.listen, config=store_config(args))
    except ImportError as e:
        raise CommandError(f"the console needs the [console] extra: pip install 'rmqstore[console]' ({e})") from None
    except ValueError as e:
        raise CommandError(str(e)) from None
    return 0


def register(sub: argparse._SubParsersAction, json_only: argparse.ArgumentParser,
             store_opts: argparse.ArgumentParser) -> None:
    p = sub.add_parser("console", parents=[store_opts], help="read-only web UI and JSON API over stores",
                       description="Serve a read-only web console and JSON API (described at /openapi.json) over "
                       "STORE directories (or directories whose subdirectories are stores) until Ctrl-C. Binds "
                       "loopback by default; listening on any other address requires the token printed with "
                       "the URL.")
    p.add_argument("stores", nargs="+", metavar="STORE")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="address to listen on (default loopback 127.0.0.1:8080; port 0 picks a free one)")
    p.set_defaults(func=cmd_console)
