"""``rmqstore console``: a read-only web UI and JSON API over store directories (RocketMQ
Dashboard's message pages, offline, without its caps). Install with ``pip install
rmqstore[console]``; ``serve`` runs it, ``app.build`` gives the ASGI application."""
from __future__ import annotations

import ipaddress
import secrets
import socket
import sys
from typing import Any

LOOPBACK_HOSTS = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


def serve(paths: list[str], listen: str = "127.0.0.1:8080", out: Any = sys.stdout) -> None:
    """Serve the stores at ``paths`` until interrupted; prints the URL (with the token when
    listening beyond loopback, where one is required)."""
    import uvicorn

    from rmqstore.console.app import build

    host, port = split_listen(listen)
    loopback = is_loopback(host)
    token = None if loopback else secrets.token_urlsafe(24)
    app, console = build(paths, token, loopback)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    print(f"rmqstore console: {len(console.stores.stores)} store(s) at {url}", file=out, flush=True)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning", limit_concurrency=128,
                                      timeout_graceful_shutdown=2)).run(sockets=[sock])
    finally:
        console.stores.close()
        sock.close()
