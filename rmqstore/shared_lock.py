"""SharedLock: held by many at once in shared mode, or by one alone in exclusive mode."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from rmqstore.errors import ReentrantCallError


class SharedLock:
    """A readers-writer lock: ``shared()`` holders run together (verify), an ``exclusive()``
    holder runs alone (rebuild). A waiting exclusive holder goes first: new shared holders
    wait behind it, so a stream of them cannot starve it. A thread already sharing it may
    share it again without waiting; any other re-entry (from a callback run under it)
    would wait for itself, and raises ReentrantCallError."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharers: dict[int, int] = {}   # thread ident -> times it shares the lock
        self._exclusive: int | None = None   # the thread holding it exclusively
        self._waiting = 0      # exclusive holders waiting

    def _refuse_reentry(self, me: int, exclusive: bool) -> None:
        if self._exclusive == me or (exclusive and me in self._sharers):
            raise ReentrantCallError("this thread already runs a rebuild or verify of the store (this call comes "
                                     "from its callback) and would wait for it forever")

    @contextmanager
    def shared(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            self._refuse_reentry(me, False)
            if me not in self._sharers:
                self._cond.wait_for(lambda: self._exclusive is None and not self._waiting)
            self._sharers[me] = self._sharers.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._sharers[me] -= 1
                if not self._sharers[me]:
                    del self._sharers[me]
                if not self._sharers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            self._refuse_reentry(me, True)
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self._exclusive is None and not self._sharers)
            finally:
                self._waiting -= 1
            self._exclusive = me
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = None
                self._cond.notify_all()

    @property
    def exclusive_here(self) -> bool:
        """Whether this thread holds the lock exclusively (is inside a rebuild)."""
        return self._exclusive == threading.get_ident()
