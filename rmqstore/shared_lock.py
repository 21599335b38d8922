"""SharedLock: held by many at once in shared mode, or by one alone in exclusive mode."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class SharedLock:
    """A readers-writer lock: ``shared()`` holders run together (verify), an ``exclusive()``
    holder runs alone (rebuild). A waiting exclusive holder goes first: new shared holders
    wait behind it, so a stream of them cannot starve it. Not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharers = 0
        self._exclusive = False
        self._waiting = 0      # exclusive holders waiting

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._sharers += 1
        try:
            yield
        finally:
            with self._cond:
                self._sharers -= 1
                if not self._sharers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and not self._sharers)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
