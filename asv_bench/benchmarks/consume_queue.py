"""Consumers: dispatch keeps up with put, and catches up with a backlog (the native loop and
the Python batch path in one run); whole queues read with get_messages(32), as a
numpy consume-queue range, as columns through the CQ (read_queue_columns) and by batch
decode of the whole log; sqlite3 paging and LMDB cursors as peers."""
import shutil
import tempfile
import time

import numpy as np

from rmqstore import MessageStore, _columns
from rmqstore.bench import workload

from .peers import CONFIG, COUNTS, QUEUES, TOPIC, Lmdb, PeerCase, Sqlite, StoreCase, messages


class Dispatch(StoreCase):
    params = [[128]]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size)

    def time_put_until_dispatched(self, body_size):
        put_batch, msgs = self.store.put_batch, self.msgs
        for i in range(0, len(msgs), 1024):
            put_batch(msgs[i:i + 1024])
        self.store.wait_dispatched()

    def track_lag_at_last_put(self, body_size):
        """Bytes the dispatcher is behind when the last put returns."""
        put_batch, msgs = self.store.put_batch, self.msgs
        for i in range(0, len(msgs), 1024):
            put_batch(msgs[i:i + 1024])
        return self.store.dispatch_lag
    track_lag_at_last_put.unit = "bytes"


class CatchUp:
    """Dispatch of a backlog (a store reopened with undispatched records, a rebuild):
    ``catch_up`` over the whole workload put without dispatch, by the native loop or, with
    the store's dispatcher made an ordinary one, batch by batch in Python."""
    params = [[128], ["native", "python"]]
    param_names = ["body_size", "loop"]
    number = 1
    repeat = 3
    warmup_time = 0
    timeout = 300

    def setup(self, body_size, loop):
        self.dir = tempfile.mkdtemp(prefix="rmq-asv-")
        self.store = MessageStore(self.dir, CONFIG.with_(background_dispatch=False))
        msgs = messages(workload(COUNTS[body_size], body_size))
        for i in range(0, len(msgs), 1024):
            self.store.put_batch(msgs[i:i + 1024])
        if loop == "python":
            self.store.dispatcher.native_parts = None

    def teardown(self, *params):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_catch_up(self, body_size, loop):
        self.store.dispatcher.catch_up()

    def track_messages_per_second(self, body_size, loop):
        t = time.perf_counter()
        self.store.dispatcher.catch_up()
        return COUNTS[body_size] / (time.perf_counter() - t)
    track_messages_per_second.unit = "msg/s"


class ReadQueues(StoreCase):
    params = [[128]]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size, fill=True)

    def time_get_messages(self, body_size):
        s = self.store
        for q in range(QUEUES):
            offset = 0
            while True:
                r = s.get_messages(TOPIC, q, offset, 32)
                if not r.messages:
                    break
                offset = r.next_offset

    def time_cq_range_numpy(self, body_size):
        for q in range(QUEUES):
            self.store.consume_queue_entries(TOPIC, q)

    def time_read_queue_columns(self, body_size):
        """Each queue's messages decoded into columns through its CQ entries."""
        for q in range(QUEUES):
            self.store.read_queue_columns(TOPIC, q)

    def time_batch_decode_queues(self, body_size):
        """decode_batch of the segments, then each queue's rows picked by a numpy mask."""
        for seg in self.store.commitlog.segments.segments:
            cols = _columns.decode_batch(seg, 0, seg.wrote_pos)
            qid = cols["queue_id"]
            for q in range(QUEUES):
                np.flatnonzero(qid == q)


class _PeerQueues(PeerCase):
    params = [[128]]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size, fill=True)

    def time_read_queues(self, body_size):
        self.system.read()


class SqlitePaging(_PeerQueues):
    peer = Sqlite


class LmdbCursor(_PeerQueues):
    peer = Lmdb
