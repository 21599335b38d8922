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

The commitlog is flushed on a native thread (``rmq-flush``, rmqstore/_flusher.pyx over
cext/rmq_flush.c) that takes no GIL: SYNC waiters sleep on its condition variable with the
GIL released, and the ASYNC cadence runs there too; the directory check of invariant 5 is
a stat it makes before every flush. Python keeps the policy: the checkpoint (written by
the ``rmq-flush-logics`` thread with the consume queues, off the writer's path), and
turning the first failure into StoreErrors on the next call. See docs/services.md.
"""
import logging
import threading
import time

from rmqstore._flusher import Flusher
from rmqstore.errors import StoreReadOnlyError

log = logging.getLogger(__name__)


class FlushService:
    """Flushes the commitlog (group commit or periodic, on the native flusher) and, on its
    own interval, the consume queues, index files, checkpoint and consumer offsets via
    ``flush_logics``, for the store directory ``root``."""

    def __init__(self, commitlog, config, checkpoint, flush_logics, root):
        self.root = root
        self.commitlog = commitlog
        self.config = config
        self.checkpoint = checkpoint
        self.flush_logics = flush_logics
        self._stop = threading.Event()
        self._threads = []
        self._error = None
        self.native = Flusher(root, commitlog.flushed_offset, self._fail)
        for seg in commitlog.segments.segments:   # from the first one holding unflushed bytes
            if seg.base_offset + seg.size > commitlog.flushed_offset:
                self.native.track(seg)
        commitlog.attach_flusher(self.native)

    def start(self):
        cfg = self.config
        self.native.start(cfg.flush_mode == "async", cfg.flush_interval_ms, cfg.flush_least_pages,
                          cfg.flush_thorough_interval_ms)
        th = threading.Thread(target=self._periodic, name="rmq-flush-logics", daemon=True,
                              args=(cfg.flush_cq_interval_ms, cfg.flush_cq_least_pages,
                                    cfg.flush_cq_thorough_interval_ms, self.flush_logics_now))
        th.start()
        self._threads.append(th)

    @property
    def error(self):
        """The first flush failure (sticky), or None."""
        if self._error is None:
            self.native.error   # noqa: B018 - reports a native failure to _fail
        return self._error

    def _fail(self, exc):
        if self._error is None:
            log.error("flush failed, store is now read-only: %s", exc)
            self._error = exc
            self.commitlog.failed = exc

    def _check_failed(self):
        """Raise StoreReadOnlyError once any flush has failed (invariant 4)."""
        if self.error is not None:
            raise StoreReadOnlyError(f"store is read-only after a failed flush: {self._error}") from self._error

    def _check_root(self):
        """StoreIOError when the store directory is gone or another one (invariant 5)."""
        self.native.check_root()

    def flush_logics_now(self, least_pages=0):
        """Flush consume queues, index files, consumer offsets and checkpoint; an I/O error
        turns the store read-only (invariant 4). The checkpoint's commitlog time is the
        native flusher's (invariant 3)."""
        self._check_failed()
        try:
            self._check_root()
            self._note_flushed()
            self.flush_logics(least_pages)
        except OSError as e:
            self._fail(e)
            raise StoreReadOnlyError(f"flush failed: {e}") from e

    def _note_flushed(self):
        """Tell the checkpoint what the native flusher made durable: the offset, read after
        the store time, covers the message of that time (invariant 3)."""
        ts = self.native.flushed_timestamp
        self.checkpoint.note_flushed(ts, self.native.flushed)

    def flush_commitlog(self, least_pages=0):
        """msync the commitlog now, in this thread (one flusher at a time); returns the
        flushed offset."""
        self._check_failed()
        try:
            flushed = self.native.flush(least_pages)
        except OSError as e:
            self._fail(e)
            raise StoreReadOnlyError(f"flush failed: {e}") from e
        self._note_flushed()
        return flushed

    def wait_flushed(self, offset):
        """SYNC mode group commit: return once ``offset`` is durable (the native flusher's
        wait, GIL released). Once any flush has failed every waiter raises
        StoreReadOnlyError (invariant 4)."""
        self.native.wait_flushed(offset)

    def _periodic(self, interval_ms, least_pages, thorough_ms, flush):
        """Call ``flush(least_pages)`` every ``interval_ms``, with 0 (everything) once per
        ``thorough_ms``; the first I/O error ends the loop (invariant 4), and so does any
        other error (a bug), which fails the store as an I/O error does: a flusher that
        ended unseen would leave every later put acknowledged and never flushed."""
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
        """Stop and join the flusher threads; flushes still work, in the caller."""
        self._stop.set()
        self.native.stop()
        for th in self._threads:
            th.join()
        self._threads = []

    def close(self):
        """stop(), and let go of the commitlog's segments (they may be unmapped now)."""
        self.stop()
        self.native.release()
