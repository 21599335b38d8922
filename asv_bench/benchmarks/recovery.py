"""Recovery and verify over a 256 MiB commitlog (1 KiB bodies, keys, tags, 8 queues):
abnormal recovery with CRC checking from the first segment (``abort`` present, no
checkpoint) read-only and as the writer (which also re-dispatches), and ``verify``.
Each ``track_*`` reports commitlog bytes per second."""
import os
import time

from rmqstore import Message, MessageStore, StoreConfig

SIZE = 256 << 20
CONFIG = StoreConfig(commitlog_file_size=64 << 20, default_queue_nums=8)
BODY = 1024


def build(path, size=SIZE, body=BODY):
    """Fill a store at ``path`` with about ``size`` commitlog bytes; returns the bytes written."""
    payload = bytes(range(256)) * (body // 256)
    with MessageStore(path, CONFIG) as s:
        n = 0
        while s.max_phy_offset < size - CONFIG.commitlog_file_size // 64:
            s.put_batch([Message("TopicRecovery", payload, tags=f"t{(n + i) % 4}", keys=f"k{n + i}")
                         for i in range(1024)])
            n += 1024
        return s.max_phy_offset


def crash(path):
    """Make the next open an abnormal recovery of every segment: ``abort`` left behind and
    no checkpoint to start later from."""
    open(os.path.join(path, "abort"), "wb").close()
    try:
        os.unlink(os.path.join(path, "checkpoint"))
    except FileNotFoundError:
        pass


class Recovery:
    number = 1
    repeat = 3
    warmup_time = 0
    timeout = 600

    def setup_cache(self):
        """Built once, in the directory asv runs setup_cache in (and removes afterwards)."""
        path = os.path.abspath("rmq-recovery-store")
        build(path)
        return path

    def setup(self, path):
        crash(path)

    def time_abnormal_recovery_read_only(self, path):
        MessageStore(path, read_only=True).close()

    def time_abnormal_recovery(self, path):
        MessageStore(path).close()

    def time_verify(self, path):
        with MessageStore(path, read_only=True) as s:
            s.verify()

    def track_abnormal_recovery_bytes_per_second(self, path):
        t0 = time.perf_counter()
        with MessageStore(path, read_only=True) as s:
            n = s.recovery.end_offset - s.recovery.start_offset
        return n / (time.perf_counter() - t0)
    track_abnormal_recovery_bytes_per_second.unit = "bytes/s"

    def track_verify_bytes_per_second(self, path):
        with MessageStore(path, read_only=True) as s:
            t0 = time.perf_counter()
            rep = s.verify()
            return rep.bytes / (time.perf_counter() - t0)
    track_verify_bytes_per_second.unit = "bytes/s"
