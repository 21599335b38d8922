"""Indicative figures for the gRPC endpoint (rmqstore.endpoint), not an asv suite: it starts
``rmqstore serve`` in a child process on a fresh store and measures, with the official
client, send and receive rates with 1 and 4 producer threads, p50/p99 send latency and the
endpoint's CPU time per message (from /proc); then the same sends from a raw gRPC load
generator (pre-built SendMessage requests on plain stubs), which shows the server side
where the client is the bottleneck.

    python asv_bench/endpoint_figures.py [--messages 2000] [--body 128] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(store, log):
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rmqstore.cli", "serve", store, "--create",
                                 "--listen", "127.0.0.1:0", "--segment-size", str(64 << 20), "--index-slots", "65536",
                                 "--index-entries", "262144"], stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(300):
        text = open(log, encoding="utf-8", errors="replace").read()
        if "listening on " in text:
            return proc, text.split("listening on ")[1].split()[0]
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"serve did not start: {open(log).read()}")


def _percentile(values, q):
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def _client_send(addr, topic, n, threads, body):
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    lat, ends = [], []
    lock = threading.Lock()
    ready = threading.Barrier(threads + 1)

    def run(count):
        p = Producer(ClientConfiguration(addr, Credentials(), request_timeout=10), (topic,))
        p.startup()
        mine = []
        ready.wait()                     # producers started: time the sends only
        try:
            for i in range(count):
                m = Message()
                m.topic, m.body, m.tag = topic, body, "TagA"
                m.keys = f"k{i}"
                t = time.perf_counter()
                p.send(m)
                mine.append(time.perf_counter() - t)
            with lock:
                lat.extend(mine)
                ends.append(time.perf_counter())
        finally:
            p.shutdown()

    ths = [threading.Thread(target=run, args=(n // threads,)) for _ in range(threads)]
    for th in ths:
        th.start()
    ready.wait()
    t0 = time.perf_counter()
    for th in ths:
        th.join()
    return len(lat), max(ends) - t0, lat


def _client_receive(addr, topic, n):
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
    cfg = ClientConfiguration(addr, Credentials(), request_timeout=10)
    c = SimpleConsumer(cfg, "FigGroup" + topic, {topic: FilterExpression()}, await_duration=2)
    c.startup()
    got, t0 = 0, time.perf_counter()
    try:
        while got < n:
            batch = c.receive(32, 60)
            if not batch:
                break
            for m in batch:
                c.ack(m)
            got += len(batch)
    finally:
        c.shutdown()
    return got, time.perf_counter() - t0


def _raw_send(addr, topic, n, threads, body):
    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

    def request():
        req = service_pb2.SendMessageRequest()
        m = req.messages.add()
        m.topic.name, m.body = topic, body
        m.system_properties.message_id = uuid.uuid4().hex.upper()
        m.system_properties.tag = "TagA"
        m.system_properties.message_type = definition_pb2.MessageType.NORMAL
        return req

    def run(count):
        with grpc.insecure_channel(addr) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            reqs = [request() for _ in range(count)]
            for r in reqs:
                stub.SendMessage(r, timeout=30)

    ths = [threading.Thread(target=run, args=(n // threads,)) for _ in range(threads)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return n // threads * threads, time.perf_counter() - t0


def run(messages=2000, body_size=128, workdir=None):
    """The figures as a dict (one row per case)."""
    body = b"x" * body_size
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        proc, addr = _start(os.path.join(d, "store"), os.path.join(d, "serve.log"))
        try:
            for threads in (1, 4):
                topic = f"Fig{threads}"
                cpu0 = _cpu_seconds(proc.pid)
                sent, secs, lat = _client_send(addr, topic, messages, threads, body)
                cpu1 = _cpu_seconds(proc.pid)
                got, rsecs = _client_receive(addr, topic, sent)
                cpu2 = _cpu_seconds(proc.pid)
                rows.append({"case": f"client send, {threads} producer thread(s)", "messages": sent,
                             "per_s": sent / secs, "p50_ms": _percentile(lat, 50) * 1e3,
                             "p99_ms": _percentile(lat, 99) * 1e3, "server_cpu_us_per_msg": (cpu1 - cpu0) / sent * 1e6})
                rows.append({"case": f"client receive+ack (after {threads}-thread send)", "messages": got,
                             "per_s": got / rsecs, "server_cpu_us_per_msg": (cpu2 - cpu1) / max(got, 1) * 1e6})
            for threads in (1, 4):
                cpu0 = _cpu_seconds(proc.pid)
                sent, secs = _raw_send(addr, f"Raw{threads}", messages, threads, body)
                rows.append({"case": f"raw gRPC send, {threads} thread(s)", "messages": sent, "per_s": sent / secs,
                             "server_cpu_us_per_msg": (_cpu_seconds(proc.pid) - cpu0) / sent * 1e6})
        finally:
            proc.terminate()
            proc.wait(60)
    return {"messages": messages, "body_size": body_size, "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000, help="messages per case (default 2000)")
    ap.add_argument("--body", type=int, default=128, help="body size in bytes (default 128)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.messages, args.body)
    if args.json:
        print(json.dumps(res, indent=2))
        return res
    print(f"{'case':48} {'msgs':>6} {'msg/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'srv CPU us/msg':>15}")
    for r in res["rows"]:
        print(f"{r['case']:48} {r['messages']:6d} {r['per_s']:9.0f} {r.get('p50_ms', float('nan')):7.2f} "
              f"{r.get('p99_ms', float('nan')):7.2f} {r['server_cpu_us_per_msg']:15.0f}")
    return res


if __name__ == "__main__":
    main()
