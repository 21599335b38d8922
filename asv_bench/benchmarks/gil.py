"""decode_batch and scan_segment release the GIL: two threads over the same segment take
about as long as one pass (time_parallel) where a loop of two passes takes twice (time_loop)."""
import threading

from rmqstore import _columns, _read

from .peers import StoreCase

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
