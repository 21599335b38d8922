"""Flush services: when written bytes become durable, and the checkpoint that says so.

Durability invariants (enforced here, relied on by recovery.py):

1. SYNC: ``put`` returns only after msync covered every byte of its record. Concurrent
   writers share one msync (group commit): a waiter whose bytes a flush already covered
   returns without flushing again.
2. ASYNC: a flusher thread msyncs the commitlog every ``flush_interval_ms`` once at least
   ``flush_least_pages`` pages are dirty, and everything every
   ``flush_thorough_interval_ms``; a crash may lose only what no flush has covered yet.
3. The checkpoint's physicMsgTimestamp is the store time of a message whose bytes, and all
   before them, were flushed before the checkpoint is written; likewise logicsMsgTimestamp
   for consume queues and indexMsgTimestamp for index files. Recovery may trust nothing
   past those times.
4. An I/O error while flushing makes the store read-only until reopened (sticky): a write
   that cannot be made durable is never acknowledged. After the first failed msync/fsync
   of any file (commitlog, consume queue, index, checkpoint, consumer offsets) no flush is
   retried and no waiter returns normally, not even one already queued in
   ``wait_flushed``: the failed pages may have been dropped from the page cache, so a
   later msync that succeeds proves nothing (the "fsyncgate" pattern). Reopening runs
   recovery, which trusts only what is on disk.
5. Every flush first checks that the store directory is still the one opened (device and
   inode): one removed or replaced while open (``rm -rf``, ``mv`` and a new directory)
   fails it as an I/O error does (invariant 4). Otherwise msync on unlinked files
   succeeded, puts were acknowledged that no file holds, and the checkpoint and consumer
   offsets went into whatever directory now had the name.
"""
import errno
import logging
import os
import threading
import time

from rmqstore.errors import StoreIOError, StoreReadOnlyError

log = logging.getLogger(__name__)


class FlushService:
    """Flushes the commitlog (group commit or periodic) and, on its own interval, the
    consume queues, index files, checkpoint and consumer offsets via ``flush_logics``,
    for the store directory ``root``."""

    def __init__(self, commitlog, config, checkpoint, flush_logics, root):
        self.root = root
        st = os.stat(root)
        self._root_id = (st.st_dev, st.st_ino)
        self.commitlog = commitlog
        self.config = config
        self.checkpoint = checkpoint
        self.flush_logics = flush_logics
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = []
        self.error = None

    def start(self):
        cfg = self.config
        loops = [("logics", cfg.flush_cq_interval_ms, cfg.flush_cq_least_pages, cfg.flush_cq_thorough_interval_ms,
                  self.flush_logics_now)]
        if cfg.flush_mode == "async":
            loops.append(("commitlog", cfg.flush_interval_ms, cfg.flush_least_pages, cfg.flush_thorough_interval_ms,
                          self.flush_commitlog))
        for name, *args in loops:
            th = threading.Thread(target=self._periodic, args=args, name=f"rmq-flush-{name}", daemon=True)
            th.start()
            self._threads.append(th)

    def _fail(self, exc):
        if self.error is None:
            log.error("flush failed, store is now read-only: %s", exc)
            self.error = exc
            self.commitlog.failed = exc

    def _check_root(self):
        """StoreIOError when the store directory is gone or another one (invariant 5)."""
        try:
            st = os.stat(self.root)
        except OSError as e:
            raise StoreIOError(e.errno, "store directory gone while open", self.root) from None
        if (st.st_dev, st.st_ino) != self._root_id:
            raise StoreIOError(errno.ESTALE, "store directory replaced while open", self.root)

    def _check_failed(self):
        """Raise StoreReadOnlyError once any flush has failed (invariant 4)."""
        if self.error is not None:
            raise StoreReadOnlyError(f"store is read-only after a failed flush: {self.error}") from self.error

    def flush_logics_now(self, least_pages=0):
        """Flush consume queues, index files, consumer offsets and checkpoint; an I/O error
        turns the store read-only (invariant 4)."""
        self._check_failed()
        try:
            self._check_root()
            self.flush_logics(least_pages)
        except OSError as e:
            self._fail(e)
            raise StoreReadOnlyError(f"flush failed: {e}") from e

    def flush_commitlog(self, least_pages=0):
        """msync the commitlog (one flusher at a time); returns the flushed offset."""
        with self._flush_lock:
            return self._flush_locked(least_pages)

    def _flush_locked(self, least_pages):
        self._check_failed()
        cl = self.commitlog
        seg = cl.segments.last
        ts = seg.store_timestamp if seg is not None else 0   # read before the end: invariant 3
        end = cl.max_offset
        try:
            self._check_root()
            cl.flush(least_pages)
        except OSError as e:
            self._fail(e)
            raise StoreReadOnlyError(f"flush failed: {e}") from e
        if cl.flushed_offset >= end:
            self.checkpoint.note_flushed(ts, end)
        return cl.flushed_offset

    def wait_flushed(self, offset):
        """SYNC mode group commit: return once ``offset`` is durable. Writers that queue
        behind a flush in progress find their bytes covered by it and return at once.
        Once any flush has failed every waiter raises StoreReadOnlyError (invariant 4)."""
        if self.commitlog.flushed_offset < offset:
            with self._flush_lock:
                if self.commitlog.flushed_offset < offset:
                    self._flush_locked(0)
        self._check_failed()

    def _periodic(self, interval_ms, least_pages, thorough_ms, flush):
        """Call ``flush(least_pages)`` every ``interval_ms``, with 0 (everything) once per
        ``thorough_ms``; the first I/O error ends the loop (invariant 4), and so does any
        other error (a bug), which fails the store as an I/O error does: a flusher that
        ended unseen would leave every later ASYNC put acknowledged and never flushed."""
        last_thorough = time.monotonic()
        while not self._stop.wait(interval_ms / 1000):
            least, now = least_pages, time.monotonic()
            if (now - last_thorough) * 1000 >= thorough_ms:
                least, last_thorough = 0, now
            try:
                flush(least)
            except (OSError, StoreReadOnlyError) as e:
                self._fail(e)
                return
            except Exception as e:   # noqa: BLE001 - a bug: stop writes rather than leave them unflushed
                log.exception("flusher failed")
                self._fail(e)
                return

    def stop(self):
        self._stop.set()
        for th in self._threads:
            th.join()
        self._threads = []
