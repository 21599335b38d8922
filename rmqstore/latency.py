"""Latency of single calls: p50 / p99 / p99.9 / max of ``put`` and ``get_messages``.

Throughput hides the tail an embedding application feels. This times every call on its own
(``perf_counter_ns``) and reports the percentiles in microseconds for:

- ``put``, async flush, one thread, and what the puts that rolled to a new segment cost;
- ``put``, SYNC flush, with 1 and 8 threads (group commit: a call returns once durable),
  with their throughput and its ratio 8 threads / 1 thread;
- ``get_messages`` of one message at a random queue offset;
- ``end to end, <rate>, <size>``: a writer process putting at a fixed rate, a reader process
  following the store, each message timed from when it was due to its receipt (see
  rmqstore.end_to_end), beside sqlite3 WAL and LMDB doing the same.

``python -m rmqstore.latency [--dir D] [--messages N] [--body-size B] [--end-to-end-seconds S] [--long]``
"""
import argparse
import os
import random
import shutil
import tempfile
import threading
import time

import numpy as np

from rmqstore import Message, MessageStore, StoreConfig, end_to_end
from rmqstore.errors import InvalidArgumentError

TOPIC = "latency"
QUEUES = 8
SEGMENT = 16 << 20   # small segments, so a run crosses several rollovers


def percentiles(ns):
    """p50 / p99 / p99.9 / max of ``ns`` (nanoseconds), in microseconds."""
    a = np.asarray(ns, dtype=np.float64) / 1000.0
    p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
    return {"p50": p50, "p99": p99, "p99.9": p999, "max": float(a.max()), "calls": len(a)}


def _config(mode, segment=SEGMENT):
    return StoreConfig(commitlog_file_size=segment, flush_mode=mode, default_queue_nums=QUEUES)


def put_async(directory, messages, body, segment=SEGMENT):
    """Time every put of one thread; the puts that rolled are reported apart."""
    times = np.empty(messages, dtype=np.int64)
    rolled = []
    clock = time.perf_counter_ns
    with MessageStore(directory, _config("async", segment)) as s:
        put = s.put
        last_segment = -1
        for i in range(messages):
            m = Message(TOPIC, body, keys=f"k{i}")
            t0 = clock()
            r = put(m)
            times[i] = clock() - t0
            if r.phy_offset // segment != last_segment:
                last_segment = r.phy_offset // segment
                rolled.append(times[i])
        s.wait_dispatched()
    out = {"put async": percentiles(times)}
    if len(rolled) > 1:   # the first put of segment 0 is not a rollover
        out["put async at rollover"] = percentiles(rolled[1:])
    return out


def put_sync(directory, messages, body, threads):
    """Time every SYNC put across ``threads`` threads (each call returns once flushed)."""
    per_thread = max(1, messages // threads)
    times = [np.empty(per_thread, dtype=np.int64) for _ in range(threads)]
    clock = time.perf_counter_ns
    with MessageStore(directory, _config("sync")) as s:
        start = clock()

        def work(out):
            for i in range(per_thread):
                m = Message(TOPIC, body)
                t0 = clock()
                s.put(m)
                out[i] = clock() - t0
        workers = [threading.Thread(target=work, args=(t,)) for t in times]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = clock() - start
    out = percentiles(np.concatenate(times))
    out["msg/s"] = per_thread * threads / (elapsed / 1e9)
    return out


def put_sync_rate(threads, messages=2_000, body_size=128):
    """SYNC puts per second with ``threads`` threads, in a temporary store (asv's ratio)."""
    work = tempfile.mkdtemp(prefix="rmq-latency-")
    try:
        return put_sync(os.path.join(work, "s"), messages, os.urandom(body_size), threads)["msg/s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def get_one(directory, reads, seed=0):
    """Time ``get_messages(max_count=1)`` at random offsets of the async run's queues."""
    rnd = random.Random(seed)
    clock = time.perf_counter_ns
    times = np.empty(reads, dtype=np.int64)
    with MessageStore(directory, read_only=True) as s:
        ends = [s.max_offset(TOPIC, q) for q in range(QUEUES)]
        picks = [(q, rnd.randrange(ends[q])) for q in (rnd.randrange(QUEUES) for _ in range(reads))]
        for i, (q, off) in enumerate(picks):
            t0 = clock()
            r = s.get_messages(TOPIC, q, off, 1)
            times[i] = clock() - t0
            if len(r.messages) != 1:
                raise RuntimeError(f"get_messages({TOPIC}, {q}, {off}, 1) gave {len(r.messages)} messages")
    return percentiles(times)


def run(directory=None, messages=300_000, body_size=128, sync_messages=2_000, segment=SEGMENT, e2e_seconds=0.0):
    """Every measurement above, its stores in a new directory inside ``directory`` (kept)
    or in the system's temporary directory (removed); returns {name: percentiles}.
    InvalidArgumentError, before anything is made, for counts that leave a queue empty or
    make no call. ``e2e_seconds``: how long each end-to-end row runs (0: none)."""
    if messages < QUEUES or sync_messages < 1 or body_size < 0:
        raise InvalidArgumentError(f"latency needs at least {QUEUES} messages (one a queue), a SYNC message and a "
                                   f"body size >= 0, not {messages}, {sync_messages}, {body_size}")
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rmq-latency-", dir=directory)
    body = os.urandom(body_size)
    try:
        results = put_async(os.path.join(work, "async"), messages, body, segment)
        results["get_messages(1)"] = get_one(os.path.join(work, "async"), min(messages, 100_000))
        for threads in (1, 8):
            results[f"put SYNC, {threads} thread(s)"] = put_sync(
                os.path.join(work, f"sync{threads}"), sync_messages, body, threads)
        if e2e_seconds:
            results.update(end_to_end.run(work, seconds=e2e_seconds))
        return results
    finally:
        if directory is None:
            shutil.rmtree(work, ignore_errors=True)


def sync_scaling(results):
    """Throughput of SYNC puts with 8 threads over that with 1 (group commit), or None."""
    one, eight = results.get("put SYNC, 1 thread(s)"), results.get("put SYNC, 8 thread(s)")
    return eight["msg/s"] / one["msg/s"] if one and eight else None


def format_table(results):
    lines = [f"{'call':<42}{'calls':>9}{'p50 µs':>12}{'p99 µs':>12}{'p99.9 µs':>12}{'p99.99 µs':>12}"
             f"{'max µs':>12}{'msg/s':>10}"]
    for name, p in results.items():
        p9999 = f"{p['p99.99']:>11.2f}" if "p99.99" in p else f"{'':>11}"
        rate = f"{p['msg/s']:>10.0f}" if "msg/s" in p else ""
        lines.append(f"{name:<42}{p['calls']:>9} {p['p50']:>11.2f} {p['p99']:>11.2f} {p['p99.9']:>11.2f} {p9999}"
                     f" {p['max']:>11.1f}{rate}")
    ratio = sync_scaling(results)
    if ratio is not None:
        lines.append(f"put SYNC throughput, 8 threads / 1 thread: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m rmqstore.latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="where to make the work directory, kept afterwards (default: the "
                   "system's temporary directory, removed after)")
    p.add_argument("--messages", type=int, default=300_000, help="async puts (300000)")
    p.add_argument("--sync-messages", type=int, default=2_000, help="SYNC puts per thread count (2000)")
    p.add_argument("--body-size", type=int, default=128, help="bytes per body (128)")
    p.add_argument("--end-to-end-seconds", type=float, default=None, metavar="S",
                   help="seconds each end-to-end row runs (1; 10 with --long; 0: none)")
    p.add_argument("--long", action="store_true", help="the quiet-machine run: end-to-end rows of 10 s")
    a = p.parse_args(argv)
    e2e = a.end_to_end_seconds if a.end_to_end_seconds is not None else 10.0 if a.long else 1.0
    try:
        print(format_table(run(a.dir, a.messages, a.body_size, a.sync_messages, e2e_seconds=e2e)))
    except InvalidArgumentError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()
