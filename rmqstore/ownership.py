"""Store handles belong to the process that opened them.

After ``fork`` the child shares the parent's files, lock and mappings but not its threads;
a writer handle used there would append at offsets the parent also writes, and its
``close()`` would delete the parent's ``abort`` file and pre-made segment. So in the child
every writer handle is marked closed at once (``os.register_at_fork``) and its methods
raise ForeignProcessError; ``close()`` there touches no file and leaves the lock to the
parent. Read-only handles change nothing on disk and keep working in the child.
"""
from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import Any, Protocol

from rmqstore.errors import ForeignProcessError, StoreError


class StoreHandle(Protocol):
    """What ownership needs of a store handle (rmqstore.store.MessageStore): this module
    sits below the store, so it names no store class (imports go one way)."""
    path: str
    read_only: bool
    _owner_pid: int
    _closed: bool
    _gate: Any

    def close(self) -> None: ...


_writers: weakref.WeakSet[StoreHandle] = weakref.WeakSet()


def bind(store: StoreHandle) -> None:
    """Record the opening process of ``store``; a writer is disowned in forked children."""
    store._owner_pid = os.getpid()
    if not store.read_only:
        _writers.add(store)


def check_owner(store: StoreHandle) -> None:
    """Raise ForeignProcessError when writer ``store`` is used outside the process that
    opened it."""
    if not store.read_only and store._owner_pid != os.getpid():
        raise ForeignProcessError(f"{store.path}: opened by process {store._owner_pid}, used in {os.getpid()}"
                                  " (a writer handle does not survive fork; open the store again)")


def _disown_in_child() -> None:
    for store in list(_writers):
        store._closed = True
        store._gate.closing = True   # put and put_batch pass only the gate
    _writers.clear()


os.register_at_fork(after_in_child=_disown_in_child)


EXIT_WAIT = 2.0


def _close_at_exit() -> None:
    """Close the writers left open at interpreter exit. New operations are refused first
    (daemon threads still calling the store get StoreClosedError), so a thread that keeps
    calling cannot hold the close off; one still inside after EXIT_WAIT leaves the store
    unclosed (``abort`` stays: the next open recovers, as after a crash)."""
    for store in list(_writers):
        store._gate.closing = True
        give_up = time.monotonic() + EXIT_WAIT
        while store._gate.others_running() and time.monotonic() < give_up:
            time.sleep(0.001)
        if store._gate.others_running():
            continue
        try:
            store.close()
        except (StoreError, OSError):
            pass   # as a finaliser: nothing to report to, close() released what it could


atexit.register(_close_at_exit)
