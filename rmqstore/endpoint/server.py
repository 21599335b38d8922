"""Run the endpoint: a grpc server bound to one address, serving one MessageStore."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2, service_pb2_grpc

from rmqstore._message import text_arg
from rmqstore.arguments import checked
from rmqstore.endpoint.pop import Pop
from rmqstore.endpoint.routes import Routes
from rmqstore.endpoint.service import MessagingService
from rmqstore.endpoint.transactions import CHECK_INTERVAL_MS, CHECK_MAX, TIMEOUT_MS, Transactions
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError, StoreClosedError
from rmqstore.pop_state import PopState
from rmqstore.store import MessageStore

log = logging.getLogger("rmqstore.endpoint")
_served: set[str] = set()   # the stores endpoints of this process serve (real paths)
_served_lock = threading.Lock()
MIN_WORKERS = 4


def _endpoints(host: str, port: int) -> definition_pb2.Endpoints:
    eps = definition_pb2.Endpoints()
    eps.scheme = definition_pb2.AddressScheme.IPv6 if ":" in host else definition_pb2.AddressScheme.IPv4
    a = eps.addresses.add()
    a.host, a.port = host, port
    return eps


class Endpoint:
    """A started endpoint. ``port`` is the bound port (useful with ``host:0``); ``stop()``
    ends the calls in progress, flushes and closes the consumption state (not the store,
    which the caller owns). A store is served by one endpoint at a time: a second one would
    hand out the messages the first handed out, and the two would overwrite each other's
    consumption state; a read-only store is refused too, as serving writes that state into
    it (``config/popState.json``) and sends write messages.

    Transactional messages are checked every ``transaction_check_interval_ms`` once older
    than ``transaction_timeout_ms`` (or the client's recovery delay), at most
    ``transaction_check_max`` times (RocketMQ's transactionCheckInterval, transactionTimeOut,
    transactionCheckMax; see rmqstore.endpoint.transactions)."""

    @checked(skip=1)
    def __init__(self, store: MessageStore, listen: str = "127.0.0.1:8081", auto_create: bool = True,
                 max_attempts: int = 17, fifo_groups: Iterable[str] = (), workers: int = 256,
                 transaction_check_interval_ms: int = CHECK_INTERVAL_MS, transaction_timeout_ms: int = TIMEOUT_MS,
                 transaction_check_max: int = CHECK_MAX) -> None:
        if not isinstance(store, MessageStore):
            raise InvalidArgumentTypeError(f"Endpoint serves a MessageStore, not {type(store).__name__}")
        if max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts ({max_attempts}) must be at least 1")
        if workers < MIN_WORKERS:
            raise InvalidArgumentError(f"workers ({workers}) must be at least {MIN_WORKERS}: two for short calls, one "
                                       "for a connected client and one for a waiting receive")
        if transaction_check_interval_ms < 1 or transaction_timeout_ms < 0 or transaction_check_max < 1:
            raise InvalidArgumentError(f"transaction check interval ({transaction_check_interval_ms} ms) and check "
                                       f"max ({transaction_check_max}) must be at least 1, the timeout "
                                       f"({transaction_timeout_ms} ms) at least 0")
        self._tx_options = (transaction_check_interval_ms, transaction_timeout_ms, transaction_check_max)
        fifo_groups = frozenset(text_arg("fifo group", g) for g in fifo_groups)
        host, sep, port = listen.rpartition(":")
        if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
            raise InvalidArgumentError(f"listen address {listen!r} is not host:port (port 0..65535)")
        if store.read_only:
            raise InvalidArgumentError(f"{store.path}: a store opened read-only cannot be served (sends and the "
                                       "consumption state write into it)")
        self._key = os.path.realpath(store.path)
        with _served_lock:
            if self._key in _served:
                raise InvalidArgumentError(f"{store.path}: already served by another endpoint of this process; "
                                           "stop it first (two would deliver each message twice)")
            _served.add(self._key)
        try:
            self._start(store, listen, auto_create, max_attempts, fifo_groups, workers, host)
        except BaseException:
            with _served_lock:
                _served.discard(self._key)
            raise

    def _start(self, store: MessageStore, listen: str, auto_create: bool, max_attempts: int,
               fifo_groups: frozenset[str], workers: int, host: str) -> None:
        self.store = store
        self.state = PopState(store.path, store.config.file_mode, store.config.dir_mode, store.operation)
        self.pop = Pop(store, self.state, max_attempts)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rmqstore-endpoint"),
                                  options=[("grpc.max_receive_message_length", store.config.max_message_size + 65536)])
        try:   # grpcio before 1.58 returns 0 for an address it cannot bind, later ones raise RuntimeError
            self.port = self.server.add_insecure_port(listen)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            self.state.close()
            raise InvalidArgumentError(f"cannot listen on {listen!r} (in use, not this host's, or not an address)")
        bare = host.strip("[]")
        advertised = "127.0.0.1" if bare in ("0.0.0.0", "", "localhost") else "::1" if bare == "::" else bare
        self.address = f"{host}:{self.port}"
        held = max(0, workers - max(2, workers // 4))   # a quarter (2 at least) kept for the short calls
        self.service = MessagingService(store, self.pop, Routes(store, auto_create), _endpoints(advertised, self.port),
                                        max_attempts, fifo_groups, sessions=held // 2, long_polls=held - held // 2)
        try:
            self.transactions = Transactions(store, self.service.send_check, *self._tx_options)
        except BaseException:
            self.state.close()
            raise
        self.service.transactions = self.transactions
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, self.server)
        self.server.start()
        self._stopped = threading.Event()
        log.info("rmqstore endpoint listening on %s (store %s)", self.address, store.path)

    def stop(self, grace: float = 1.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.service.stopping.set()
        self.pop.notify()
        self.server.stop(grace).wait()
        try:
            with contextlib.suppress(StoreClosedError):   # closed under the endpoint: nothing to flush
                self.store.flush()
        finally:
            self.transactions.close()
            self.state.close()
            with _served_lock:
                _served.discard(self._key)
        log.info("rmqstore endpoint on %s stopped", self.address)

    def wait(self) -> None:
        self._stopped.wait()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(store: MessageStore, listen: str = "127.0.0.1:8081", **options: Any) -> None:
    """Serve ``store`` on ``listen`` until SIGINT or SIGTERM, then stop cleanly (main thread only)."""
    ep = Endpoint(store, listen, **options)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        ep.stop()
