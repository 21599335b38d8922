"""Worker: one background thread that runs the jobs handed to it, in order."""
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Worker:
    """A daemon thread, started at once, that runs ``submit``-ted jobs in order.

    The writer hands it work on its own path (the next segment, pages to fault in ahead),
    so a hand-over must be cheap: ``submit`` is one queue put, about 9 us here, where
    ``ThreadPoolExecutor.submit`` took about 70 us (its Future, locks and thread-count
    check) and its first call started the thread (2-5 ms). Jobs report results their own
    way (a Future they are given); an exception a job raises is logged and dropped.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; jobs submitted after ``shutdown`` never run."""
        self._jobs.put((fn, args))

    def shutdown(self, cancel: bool = False) -> None:
        """Stop the thread once the queued jobs have run (``cancel``: drop those not
        started yet) and wait for it."""
        if cancel:
            try:
                while True:
                    self._jobs.get_nowait()
            except queue.Empty:
                pass
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args = job
            try:
                fn(*args)
            except Exception:
                log.exception("background job %s failed", getattr(fn, "__qualname__", fn))
