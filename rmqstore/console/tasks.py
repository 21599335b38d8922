"""Health checks that read a whole store, run as background tasks: verify, digest (CRC32C of
every commitlog segment, as ``rmqstore digest``) and a recovery dry run (what recovery of a
crashed store would do, as ``rmqstore recover`` without ``--yes``). Each reports progress in
bytes and keeps its result; at most one of each kind runs per store at a time."""
from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any, Callable

from rmqstore import MessageStore, StoreConfig
from rmqstore.report import camel_keys, segment_digests, segment_files

KINDS = ("verify", "digest", "recovery")
KEEP = 32   # finished tasks remembered


class Task:
    """One run: ``state`` running | done | failed, ``done``/``total`` bytes, ``result``."""

    def __init__(self, number: int, kind: str, store: int, path: str, config: StoreConfig):
        self.id, self.kind, self.store, self.path, self.config = number, kind, store, path, config
        self.state, self.done = "running", 0
        self.error: str | None = None
        self.total = sum(n for _, _, n in segment_files(path))
        self.result: Any = None
        self.started, self.seconds = time.time(), 0.0

    def update(self, nbytes: int) -> None:
        self.done = min(self.total, self.done + nbytes)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "store": self.store, "state": self.state, "done": self.done,
                "total": self.total, "result": self.result, "error": self.error, "seconds": round(self.seconds, 3)}

    def run(self, work: Callable[[Task], Any]) -> None:
        t0 = time.monotonic()
        try:
            self.result = work(self)
            self.done, self.state = self.total, "done"
        except Exception as e:   # reported on the health page, never raised into the server
            self.error, self.state = f"{type(e).__name__}: {e}", "failed"
        self.seconds = time.monotonic() - t0


def _verify(task: Task) -> Any:
    with MessageStore(task.path, task.config, read_only=True) as s:
        return camel_keys(s.verify(progress=task.update).as_dict())


def _digest(task: Task) -> Any:
    return segment_digests(segment_files(task.path), task.update)


def _recovery(task: Task) -> Any:
    with MessageStore(task.path, task.config, read_only=True, progress=task.update) as s:
        return camel_keys({"dry_run": True, **dataclasses.asdict(s.recovery)})


WORK = {"verify": _verify, "digest": _digest, "recovery": _recovery}


class Tasks:
    """The console's health tasks by id: the running ones and the KEEP finished last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.tasks: dict[int, Task] = {}

    def start(self, kind: str, store: int, path: str, config: StoreConfig) -> Task:
        """A new task of ``kind`` on the store, or the one of that kind still running on it."""
        with self._lock:
            for t in self.tasks.values():
                if t.kind == kind and t.store == store and t.state == "running":
                    return t
            task = Task(next(self._ids), kind, store, path, config)
            self.tasks[task.id] = task
            for old in [t for t in self.tasks.values() if t.state != "running"][:-KEEP]:
                del self.tasks[old.id]
        threading.Thread(target=task.run, args=(WORK[kind],), name=f"console-{kind}", daemon=True).start()
        return task

    def of_store(self, store: int) -> list[Task]:
        """The tasks (running and kept) of the store numbered ``store``, oldest first."""
        return [t for t in self.tasks.values() if t.store == store]
