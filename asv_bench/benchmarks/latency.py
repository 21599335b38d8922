"""Per-call latency (rmqstore.latency) tracked by asv: p50 / p99 / p99.9 / max in µs of put
(async, at a segment rollover, SYNC with 1 and 8 threads) and get_messages of one message;
end-to-end latency across processes (rmqstore.end_to_end) beside sqlite3 WAL and LMDB."""
import shutil
import tempfile

from rmqstore import latency

CALLS = ["put async", "put async at rollover", "put SYNC, 1 thread(s)", "put SYNC, 8 thread(s)",
         "get_messages(1)"]


class Latency:
    params = [CALLS, ["p50", "p99", "p99.9", "max"]]
    param_names = ["call", "percentile"]
    timeout = 900

    def setup_cache(self):
        return latency.run(messages=100_000, sync_messages=1_000)

    def track_latency(self, results, call, percentile):
        return results[call][percentile] if call in results else float("nan")

    track_latency.unit = "µs"


class SyncGroupCommit:
    """Throughput of SYNC puts with 8 threads over that with 1: how well the native flusher
    groups concurrent waiters into one msync (one SYNC thread waits for every msync alone)."""
    timeout = 900

    def setup_cache(self):
        return {threads: latency.put_sync_rate(threads) for threads in (1, 8)}

    def track_sync_8_over_1(self, rates):
        return rates[8] / rates[1]

    track_sync_8_over_1.unit = "ratio"


class EndToEnd:
    """``end to end, <rate>, <size>``: writer process at a fixed rate, reader process
    following; per peer (rmqstore, sqlite3 WAL, LMDB when installed) in one run."""
    params = [["10k/s", "100k/s"], ["60 B", "1024 B"], ["rmqstore", "sqlite3 WAL", "LMDB"],
              ["p50", "p99", "p99.9", "p99.99", "max"]]
    param_names = ["rate", "size", "peer", "percentile"]
    timeout = 900

    def setup_cache(self):
        from rmqstore import end_to_end
        work = tempfile.mkdtemp(prefix="rmq-e2e-")
        try:
            return end_to_end.run(work, seconds=2.0)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def track_end_to_end(self, results, rate, size, peer, percentile):
        name = f"end to end, {rate}, {size}" + ("" if peer == "rmqstore" else f", {peer}")
        return results[name][percentile] if name in results else float("nan")

    track_end_to_end.unit = "µs"
