"""decode_batch and scan_segment release the GIL: two threads over the same segment take
about as long as one pass (time_parallel) where a loop of two passes takes twice (time_loop)."""
import threading

from rmqstore import MessageStore, _columns, _read

from .peers import QUEUES, TOPIC, StoreCase

THREADS = 2


class DecodeGIL(StoreCase):
    params = [["decode_batch", "scan_segment"]]
    param_names = ["kernel"]

    def setup(self, kernel):
        self.make(128, fill=True)
        seg = self.store.commitlog.segments.segments[0]
        if kernel == "decode_batch":
            self.work = lambda: _columns.decode_batch(seg, 0, seg.wrote_pos)
        else:
            self.work = lambda: _read.scan_segment(seg, 0, seg.wrote_pos, True)

    def time_loop(self, kernel):
        for _ in range(THREADS):
            self.work()

    def time_parallel(self, kernel):
        threads = [threading.Thread(target=self.work) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _in_threads(works):
    ts = [threading.Thread(target=work) for work in works]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


class StoreGIL(StoreCase):
    """Store calls whose kernels run without the GIL: the same work done twice, by one
    thread (time_loop) and by two at once (time_parallel). On 2 free cores the parallel run
    should take about half as long; track_speedup reports loop / parallel (median of 3).
    verify runs one at a time per handle (it excludes rebuild), so each thread verifies
    through a read-only handle of its own, as a second process would."""
    params = [["query_keys", "read_queue_columns", "verify"]]
    param_names = ["call"]

    def setup(self, call):
        self.make(128, fill=True)
        s = self.store
        keys = [f"key-{i}" for i in range(0, len(self.msgs), 4)]
        self.handles = []
        if call == "query_keys":
            self.works = [lambda: s.query_keys(TOPIC, keys)] * THREADS
        elif call == "read_queue_columns":
            self.works = [lambda: [s.read_queue_columns(TOPIC, q) for q in range(QUEUES)]] * THREADS
        else:
            self.handles = [MessageStore(self.dir, read_only=True) for _ in range(THREADS)]
            self.works = [h.verify for h in self.handles]

    def teardown(self, call):
        for h in self.handles:
            h.close()
        super().teardown(call)

    def time_loop(self, call):
        for work in self.works:
            work()

    def time_parallel(self, call):
        _in_threads(self.works)

    def track_speedup(self, call):
        import statistics
        import time
        loop, parallel = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            self.time_loop(call)
            t1 = time.perf_counter()
            self.time_parallel(call)
            t2 = time.perf_counter()
            loop.append(t1 - t0)
            parallel.append(t2 - t1)
        return statistics.median(loop) / statistics.median(parallel)

    track_speedup.unit = "x"
