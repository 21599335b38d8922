"""decode_batch and scan_segment release the GIL: two threads over the same segment take
about as long as one pass (time_parallel) where a loop of two passes takes twice (time_loop)."""
import statistics
import threading
import time

from rmqstore import _columns, _read

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
        _in_threads(self.work, THREADS)


def _in_threads(work, threads):
    """Run ``work`` once in each of ``threads`` threads at once; re-raise the first error
    (a thread that failed fast would otherwise pass for a fast parallel run)."""
    errors = []

    def run():
        try:
            work()
        except BaseException as e:
            errors.append(e)
    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


class StoreGIL(StoreCase):
    """Store calls whose kernels run without the GIL: the same work done twice, by one
    thread (time_loop) and by two at once (time_parallel). On 2 free cores the parallel run
    should take about half as long; track_speedup reports loop / parallel (medians of 5
    rounds after a warm-up, the order alternating between rounds). Only meaningful on a
    machine with THREADS idle cores. Verifies run at once (only a rebuild waits for them)."""
    params = [["query_keys", "query_keys_columns", "read_queue_columns", "verify"]]
    param_names = ["call"]

    def setup(self, call):
        self.make(128, fill=True)
        s = self.store
        keys = [f"key-{i}" for i in range(0, len(self.msgs), 4)]
        if call.startswith("query_keys"):
            self.work = lambda: getattr(s, call)(TOPIC, keys)
        elif call == "read_queue_columns":
            self.work = lambda: [s.read_queue_columns(TOPIC, q) for q in range(QUEUES)]
        else:
            self.work = s.verify

    def time_loop(self, call):
        for _ in range(THREADS):
            self.work()

    def time_parallel(self, call):
        _in_threads(self.work, THREADS)

    def track_speedup(self, call):
        self.work()     # warm: page cache, mappings, lazily built state
        loop, parallel = [], []
        runs = [(self.time_loop, loop), (self.time_parallel, parallel)]
        for i in range(5):
            for timed, out in runs if i % 2 == 0 else runs[::-1]:
                t0 = time.perf_counter()
                timed(call)
                out.append(time.perf_counter() - t0)
        return statistics.median(loop) / statistics.median(parallel)

    track_speedup.unit = "x"
