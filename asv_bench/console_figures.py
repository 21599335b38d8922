"""Indicative latency figures for ``rmqstore console`` (not an asv suite): writes a store of
``--messages`` messages (keys and tags on each, 4 queues), starts the console on it in a
child process on loopback, and sends each page's requests from a bounded closed-loop load
generator (``--clients`` connections, ``--requests`` requests a page, random offsets, keys and
times), printing p50/p99 per page beside the time ``rmqstore ... --json`` takes to answer the
same question (a fresh process each time: interpreter start and store open included).

    python asv_bench/console_figures.py [--messages 200000] [--requests 200] [--clients 4] [--live 0]
        [--keep STORE] [--only PAGE] [--json]

``--live RATE`` keeps putting RATE messages a second while the pages are measured (a live
store: the console reopens its read-only handle as the store grows).

The target scale is tens of millions of messages: ``--messages 20000000 --keep STORE`` needs
7.2 GB of disk and about 100 s to write, once (later runs with ``--keep STORE`` measure it).
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import quote

import numpy as np

from rmqstore import Message, MessageStore, StoreConfig

TOPIC = "Bench"
QUEUES = 4
BATCH = 100_000


def write_store(root: str, messages: int) -> None:
    """The store: ``messages`` 200-byte bodies on TOPIC, each with keys ``k<i>`` and ``g<i % 1000>``
    and tag ``T<i % 5>``; ``bench_group`` committed half way on each queue."""
    cfg = StoreConfig(commitlog_file_size=256 << 20, background_dispatch=False)
    body = b"x" * 200
    with MessageStore(root, cfg) as s:
        for start in range(0, messages, BATCH):
            n = min(BATCH, messages - start)
            rows = range(start, start + n)
            s.put_columns(TOPIC, [body] * n, queue_ids=np.arange(start, start + n) % QUEUES,
                          tags=[f"T{i % 5}" for i in rows],
                          keys=[f"k{i} g{i % 1000}" for i in rows], dispatch=True)   # KEYS text: space-separated
        s.wait_dispatched()
        for q in range(QUEUES):
            s.commit_offset("bench_group", TOPIC, q, s.max_offset(TOPIC, q) // 2)


def store_times(s: MessageStore) -> tuple[int, int]:
    """(first, last) store time of queue 0 of TOPIC."""
    first = s.get_by_offset(int(s.consume_queue_entries(TOPIC, 0, 0, 1)["phy_offset"][0]))
    last = s.get_by_offset(int(s.consume_queue_entries(TOPIC, 0, s.max_offset(TOPIC, 0) - 1, 1)["phy_offset"][0]))
    return first.store_timestamp, last.store_timestamp


def append_live(store: str, rate: int, stop: threading.Event) -> None:
    """Put ``rate`` messages a second on TOPIC until ``stop``."""
    with MessageStore(store, StoreConfig(commitlog_file_size=256 << 20)) as s:
        n = 0
        while not stop.wait(1 / rate):
            s.put(Message(TOPIC, b"live %d" % n, tags="Live", keys=f"live{n}"))
            n += 1


def start_console(store: str) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "rmqstore.cli", "console", store, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if " at http://" not in line:
        proc.kill()
        raise RuntimeError(f"console did not start: {line!r}")
    hostport = line.split(" at http://")[1].split("/")[0]
    host, port = hostport.rsplit(":", 1)
    return proc, host, int(port)


def load(host: str, port: int, paths: list[str], clients: int) -> list[float]:
    """Latencies (s) of GETs of ``paths``, shared out over ``clients`` keep-alive connections,
    each sending its next request when the last answer is in (closed loop, so bounded)."""
    lat: list[float] = []
    lock = threading.Lock()
    todo = iter(paths)

    def client():
        conn = http.client.HTTPConnection(host, port, timeout=30)
        mine = []
        while True:
            with lock:
                path = next(todo, None)
            if path is None:
                break
            t0 = time.perf_counter()
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            mine.append(time.perf_counter() - t0)
            if r.status != 200:
                raise RuntimeError(f"{path}: HTTP {r.status}")
        conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(lat) != len(paths):
        raise RuntimeError(f"{len(paths) - len(lat)} requests failed")
    return lat


def cli_time(args: list[str], runs: int = 5) -> float:
    """Median wall time of ``rmqstore ARGS --json`` (a fresh process each run)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rmqstore.cli", *args, "--json"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--requests", type=int, default=200, help="requests a page (200)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent connections (4)")
    ap.add_argument("--live", type=int, default=0, metavar="RATE", help="puts a second while measuring (0)")
    ap.add_argument("--dir", help="store parent directory (default a temp dir, removed after)")
    ap.add_argument("--keep", metavar="STORE", help="the store's directory, kept after the run: written when it "
                    "holds no store, measured as it is when it does (--messages then ignored)")
    ap.add_argument("--only", metavar="TEXT", help="measure only the pages whose name holds TEXT")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rnd = random.Random(7)
    with contextlib.ExitStack() as cleanup:
        store = a.keep or os.path.join(cleanup.enter_context(tempfile.TemporaryDirectory(dir=a.dir)), "store")
        wrote = None
        if not os.path.isdir(os.path.join(store, "commitlog")):
            t0 = time.perf_counter()
            write_store(store, a.messages)
            wrote = time.perf_counter() - t0
        with MessageStore(store, read_only=True) as s:
            a.messages = sum(s.max_offset(TOPIC, q) for q in range(QUEUES))
            first, last = store_times(s)
        per_queue = a.messages // QUEUES
        with MessageStore(store, read_only=True) as s:
            offsets = [int(s.consume_queue_entries(TOPIC, q, o, 1)["phy_offset"][0])
                       for q, o in ((rnd.randrange(QUEUES), rnd.randrange(per_queue)) for _ in range(a.requests))]
            ids = [s.get_by_offset(o).msg_id for o in offsets]
        n = a.requests

        def keys():
            return [f"k{rnd.randrange(a.messages)}" for _ in range(n)]

        q, o = rnd.randrange(QUEUES), rnd.randrange(per_queue)
        k = f"k{rnd.randrange(a.messages)}"
        pages = [
            ("overview", ["/api/s/0/overview"] * n, ["stats", store]),
            ("topics", ["/api/s/0/topics"] * n, ["stats", store]),
            ("topic", [f"/api/s/0/topic?name={TOPIC}"] * n, ["stats", store]),
            ("browse (offset, 32)", [f"/api/s/0/browse?topic={TOPIC}&queues={rnd.randrange(QUEUES)}&size=32&offset="
                                     f"{rnd.randrange(per_queue)}" for _ in range(n)],
             ["get", store, "--topic", TOPIC, "--queue", str(q), "--offset", str(o), "--count", "32"]),
            ("browse (time, all queues, 50)", [f"/api/s/0/browse?topic={TOPIC}&time={rnd.randint(first, last)}"
                                               for _ in range(n)], None),
            ("browse (tag filter)", [f"/api/s/0/browse?topic={TOPIC}&tags=T3&offset={rnd.randrange(per_queue)}"
                                     for _ in range(n)], None),
            ("browse (content substring, rare)", [f"/api/s/0/browse?topic={TOPIC}&q=k{rnd.randrange(a.messages)}%20"
                                                  f"&offset={rnd.randrange(per_queue)}" for _ in range(n)], None),
            ("browse (content regex)", [f"/api/s/0/browse?topic={TOPIC}&mode=regex&q=k{rnd.randrange(10)}7"
                                        f"%5B0-9%5D*3%20&offset={rnd.randrange(per_queue)}" for _ in range(n)], None),
            ("browse page (HTML)", [f"/s/0/browse?topic={TOPIC}&offset={rnd.randrange(per_queue)}" for _ in range(n)],
             None),
            ("lookup key", [f"/api/s/0/lookup?kind=key&topic={TOPIC}&value={x}" for x in keys()],
             ["query", store, "--topic", TOPIC, "--key", k]),
            ("lookup key, messages/1000 hits, page 1",
             [f"/api/s/0/lookup?kind=key&topic={TOPIC}&value=g{rnd.randrange(1000)}" for _ in range(n)],
             ["query", store, "--topic", TOPIC, "--key", "g1", "--max", "64"]),
            ("lookup msgId", [f"/api/s/0/lookup?kind=msgid&value={quote(i)}" for i in ids], ["msg", store, ids[0]]),
            ("message detail", [f"/api/s/0/message?offset={x}" for x in offsets], ["at", store, str(offsets[0])]),
            ("message page (HTML)", [f"/s/0/message?offset={x}" for x in offsets], None),
            ("topics, by rate", ["/api/s/0/topics?sort=rate&desc=1"] * n, None),
            ("health", ["/api/s/0/health"] * n, None),
            ("consumer groups", ["/api/s/0/groups"] * n, None),
            ("dlq", ["/api/s/0/dlq"] * n, None),
        ]
        pages = [p for p in pages if a.only is None or a.only in p[0]]
        proc, host, port = start_console(store)
        stop = threading.Event()
        writer = threading.Thread(target=append_live, args=(store, a.live, stop)) if a.live else None
        if writer:
            writer.start()
        try:
            load(host, port, [p for _, paths, _ in pages for p in paths[:10]], 1)   # warm up
            rows = []
            for name, paths, cli in pages:
                lat = load(host, port, paths, a.clients)
                rows.append({"page": name, "requests": len(lat), "p50_ms": round(pct(lat, 50) * 1000, 2),
                             "p99_ms": round(pct(lat, 99) * 1000, 2),
                             "cli_json_ms": round(cli_time(cli) * 1000, 1) if cli else None,
                             "cli": " ".join(["rmqstore", cli[0], "..."]) if cli else None})
        finally:
            stop.set()
            if writer:
                writer.join()
            proc.terminate()
            proc.wait(10)
    if a.json:
        print(json.dumps({"messages": a.messages, "clients": a.clients, "live": a.live,
                          "write_seconds": None if wrote is None else round(wrote, 1),
                          "pages": rows}, indent=2))
        return
    made = "a kept store" if wrote is None else f"{wrote:.1f} s to write"
    print(f"{a.messages} messages ({made}), {a.clients} clients, {a.requests} requests a page"
          + (f", {a.live} puts/s meanwhile" if a.live else ""))
    print(f"{'page':36} {'p50 ms':>8} {'p99 ms':>8} {'CLI --json ms':>14}  CLI")
    for r in rows:
        cli = "-" if r["cli_json_ms"] is None else f"{r['cli_json_ms']:.1f}"
        print(f"{r['page']:36} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {cli:>14}  {r['cli'] or '-'}")


if __name__ == "__main__":
    main()
