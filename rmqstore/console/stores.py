"""The stores a console serves: found once at start (a store directory, or a parent whose
subdirectories are stores, as the Spark source takes them), chosen by their number in that
list only, so no request parameter ever names a path. Each is open read-only; a read-only
handle does not see later appends, so when a request arrives, at least RECHECK_SECONDS
after the last look, the console looks whether the store's commitlog end or consumer
offsets file changed and, if so, opens a fresh handle on a background thread (no request
waits for the open's recovery scan). Requests hold the handle they read (``reading``); a
replaced handle is closed as soon as the last request reading it ends, so a live store
costs one handle plus those of the requests in flight."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Iterator

from rmqstore import MessageStore, NotRecordStartError, StoreConfig, StoreNotFoundError, batch
from rmqstore.errors import InvalidArgumentError, StoreError

log = logging.getLogger(__name__)
RECHECK_SECONDS = 1.0   # least time between two looks whether a store changed


def console_config(base: StoreConfig | None = None) -> StoreConfig:
    """``base`` (a foreign store's index geometry, say) as the console opens stores: a key
    lookup's index page as large as a console page (the store caps it at
    max_msgs_num_batch; RocketMQ's is 64)."""
    return (base or StoreConfig()).with_(max_msgs_num_batch=65_535)


def find_stores(paths: list[str]) -> list[str]:
    """Store directories (holding ``commitlog/``) named by ``paths``: a path that is not a
    store contributes its store subdirectories. Unique, in the order given."""
    out: list[str] = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isdir(os.path.join(p, "commitlog")):
            found = [p]
        elif os.path.isdir(p):
            found = sorted(os.path.join(p, d) for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, "commitlog")))
        else:
            raise StoreNotFoundError(f"{p}: no such directory")
        if not found:
            raise StoreNotFoundError(f"{p}: not a RocketMQ store and holds none (no commitlog/ directory)")
        out.extend(f for f in found if f not in out)
    return out


def _stamp(path: str, hint: int = 0) -> tuple[int, int]:
    """What changes when a writer appends or commits offsets: the commitlog data end (walked
    from ``hint``, the end seen last) and the consumer offsets file's modification time."""
    try:
        offsets = os.stat(os.path.join(path, "config", "consumerOffset.json")).st_mtime_ns
    except OSError:
        offsets = 0
    try:
        end = batch.end_offset(path, hint)
    except NotRecordStartError:   # the segment at hint was removed or rewritten
        end = batch.end_offset(path)
    return end, offsets


class Handle:
    """One read-only MessageStore of a served store, with the number of requests reading it
    (plus one while it is the current handle)."""

    def __init__(self, store: MessageStore):
        self.store = store
        self.refs = 1


class ServedStore:
    """One served store: its number, path, display name and its current read-only handle."""

    def __init__(self, number: int, path: str, config: StoreConfig):
        self.number, self.path, self.config = number, path, config
        parent, base = os.path.split(path.rstrip("/"))
        # a broker's store directory is often just "store": name it with its parent
        self.name = f"{os.path.basename(parent)}/{base}" if base == "store" and parent else base or path
        self._lock = threading.Lock()
        self.generation = 0   # counts reopenings
        self._handle = Handle(MessageStore(path, config, read_only=True))
        self._stamp = _stamp(path)
        self._checked = time.monotonic()
        self._refreshing = self._closed = False

    def store(self) -> MessageStore:
        """The current handle, not held: only for a store no writer changes (a replaced
        handle is closed when its last reader ends). Requests use ``reading``."""
        return self._handle.store

    @contextlib.contextmanager
    def reading(self) -> Iterator[Handle]:
        """The current handle, held open until the block ends. A request arriving at least
        RECHECK_SECONDS after the last look starts a look on a background thread: a fresh
        handle, when the store changed, serves the requests after it."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise StoreError(f"{self.path}: the console is shutting down")
            if now - self._checked >= RECHECK_SECONDS and not self._refreshing:
                self._refreshing = True
                threading.Thread(target=self._refresh, name="console-reopen", daemon=True).start()
            h = self._handle
            h.refs += 1
        try:
            yield h
        finally:
            self._release(h)

    def _release(self, h: Handle) -> None:
        with self._lock:
            h.refs -= 1
            last = h.refs == 0
        if last:
            h.store.close()

    def _refresh(self) -> None:
        old = None
        try:
            stamp = _stamp(self.path, self._stamp[0])
            if stamp != self._stamp:
                fresh = MessageStore(self.path, self.config, read_only=True)
                with self._lock:
                    if self._closed:
                        fresh.close()
                    else:
                        self.generation += 1
                        old, self._handle = self._handle, Handle(fresh)
                        self._stamp = stamp
        except StoreError as e:   # a writer mid-change: the current handle stays, the next look retries
            log.warning("%s: not reopened (%s)", self.path, e)
        finally:
            with self._lock:
                self._refreshing = False
                self._checked = time.monotonic()
        if old is not None:
            self._release(old)   # its current-handle reference: closed now, or by its last reader

    def close(self) -> None:
        """Close the current handle (a request still reading it closes it when it ends)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release(self._handle)


class StoreSet:
    """The served stores, by number."""

    def __init__(self, paths: list[str], config: StoreConfig | None = None):
        self.stores: list[ServedStore] = []
        cfg = console_config(config)
        try:
            for i, p in enumerate(find_stores(paths)):
                self.stores.append(ServedStore(i, p, cfg))
        except BaseException:
            self.close()
            raise

    def __getitem__(self, number: int) -> ServedStore:
        if not 0 <= number < len(self.stores):
            raise InvalidArgumentError(f"no store number {number} (0..{len(self.stores) - 1})")
        return self.stores[number]

    def close(self) -> None:
        for s in self.stores:
            s.close()
