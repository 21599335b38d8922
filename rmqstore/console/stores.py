"""The stores a console serves: found once at start (a store directory, or a parent whose
subdirectories are stores, as the Spark source takes them), chosen by their number in that
list only, so no request parameter ever names a path. Each is open read-only; a read-only
handle does not see later appends, so a handle is replaced by a fresh one when the store's
commitlog end or consumer offsets file changed (looked at once a second, and opened on a
background thread, so no request waits for the open's recovery scan)."""
from __future__ import annotations

import logging
import os
import threading
import time

from rmqstore import MessageStore, NotRecordStartError, StoreConfig, StoreNotFoundError, batch
from rmqstore.errors import InvalidArgumentError, StoreError

log = logging.getLogger(__name__)


def console_config(base: StoreConfig | None = None) -> StoreConfig:
    """``base`` (a foreign store's index geometry, say) as the console opens stores: every
    hash match of a key in one index walk (the store's limit; RocketMQ's is 64)."""
    return (base or StoreConfig()).with_(max_msgs_num_batch=65_535)
RECHECK_SECONDS = 1.0
OLD_HANDLE_SECONDS = 60.0   # a replaced handle is closed this long after, when no request still reads it


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


class ServedStore:
    """One served store: its number, path, display name and a current read-only handle."""

    def __init__(self, number: int, path: str, config: StoreConfig):
        self.number, self.path, self.config = number, path, config
        parent, base = os.path.split(path.rstrip("/"))
        # a broker's store directory is often just "store": name it with its parent
        self.name = f"{os.path.basename(parent)}/{base}" if base == "store" and parent else base or path
        self._lock = threading.Lock()
        self._handle = MessageStore(path, config, read_only=True)
        self._stamp = _stamp(path)
        self._checked = time.monotonic()
        self._refreshing = self._closed = False
        self._retired: list[tuple[float, MessageStore]] = []
        self.generation = 0   # counts reopenings: cached answers keyed by it go stale with the handle

    def store(self) -> MessageStore:
        """The current handle. At most once a second a background thread looks whether the
        store changed and, if so, opens a fresh handle (recovery's scan of a big store takes
        a while) that later requests get; until then they read the current one."""
        now = time.monotonic()
        if now - self._checked >= RECHECK_SECONDS:
            with self._lock:
                if now - self._checked >= RECHECK_SECONDS and not self._refreshing:
                    self._checked, self._refreshing = now, True
                    threading.Thread(target=self._refresh, name="console-reopen", daemon=True).start()
        return self._handle

    def _refresh(self) -> None:
        try:
            stamp = _stamp(self.path, self._stamp[0])
            if stamp != self._stamp:
                fresh = MessageStore(self.path, self.config, read_only=True)
                with self._lock:
                    if self._closed:
                        self._retired.append((0.0, fresh))
                    else:
                        self._retired.append((time.monotonic(), self._handle))
                        self._handle, self._stamp = fresh, stamp
                        self.generation += 1
            self._close_retired(time.monotonic())
        except StoreError as e:   # a writer mid-change: the current handle stays, the next look retries
            log.warning("%s: not reopened (%s)", self.path, e)
        finally:
            with self._lock:
                self._refreshing = False
                self._checked = time.monotonic()

    def _close_retired(self, now: float) -> None:
        with self._lock:
            old = [h for t, h in self._retired if now - t > OLD_HANDLE_SECONDS]
            self._retired = [(t, h) for t, h in self._retired if now - t <= OLD_HANDLE_SECONDS]
        for h in old:
            h.close()   # waits for reads still running on it

    def close(self) -> None:
        with self._lock:
            self._closed = True
            handles = [h for _, h in self._retired] + [self._handle]
            self._retired = []
        for h in handles:
            h.close()


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
