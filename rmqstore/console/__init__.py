"""``rmqstore console``: a read-only web UI and JSON API over store directories (RocketMQ
Dashboard's message pages, offline, without its caps). Install with ``pip install
rmqstore[console]``; ``serve`` runs it, ``app.build`` gives the ASGI application."""
from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
import sys
import threading
import time
from typing import Any, Iterator


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a --listen host or a Host header's name, ``[v6]`` or bare) names
    this machine's loopback: ``localhost``, 127.0.0.0/8 or ::1. The console binds without a
    token only there, and on loopback answers only requests whose Host header passes this."""
    if host.lower() == "localhost":
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


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP (with proto 0,
    # a keep-alive answer written in two parts waits for the client's delayed ACK, 40 ms)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)   # connections made once the URL is printed wait for the server instead of failing
    return sock


def _server(paths: list[str], host: str, port: int, writer: Any = None,
            config: Any = None) -> tuple[Any, socket.socket, str, Any]:
    """(uvicorn server, bound socket, URL, Console) for the stores at ``paths``."""
    import uvicorn

    from rmqstore.console.app import build

    loopback = is_loopback(host)
    token = None if loopback else secrets.token_urlsafe(24)
    app, console = build(paths, token, loopback, writer, config)
    try:
        sock = _bind(host, port)
    except BaseException:
        console.stores.close()
        raise
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{sock.getsockname()[1]}/" + (f"?token={token}" if token else "")
    config = uvicorn.Config(app, log_level="warning", limit_concurrency=128, timeout_graceful_shutdown=2)
    return uvicorn.Server(config), sock, url, console


def serve(paths: list[str], listen: str = "127.0.0.1:8080", out: Any = sys.stdout, config: Any = None) -> None:
    """Serve the stores at ``paths`` until interrupted; prints the URL (with the token when
    listening beyond loopback, where one is required). ``config``: a StoreConfig the stores
    are opened with (a foreign store's index geometry)."""
    server, sock, url, console = _server(paths, *split_listen(listen), None, config)
    print(f"rmqstore console: {len(console.stores.stores)} store(s) at {url}", file=out, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        console.stores.close()
        sock.close()


@contextlib.contextmanager
def running(paths: list[str], listen: str = "127.0.0.1:0", writer: Any = None,
            config: Any = None) -> Iterator[tuple[str, Any]]:
    """The console serving ``paths`` on a background thread (for tests, benchmarks and
    embedding): yields (URL, Console); stops and closes the stores on exit. ``writer``: the
    open writer MessageStore of one of them, which allows the DLQ page's resend (the one
    write the console makes; off without it). ``config`` as in serve."""
    server, sock, url, console = _server(paths, *split_listen(listen), writer, config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="rmqstore-console", daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        yield url, console
    finally:
        server.should_exit = True
        thread.join(10)
        console.stores.close()
        sock.close()
