"""Indicative figures for the gRPC endpoint (rmqstore.endpoint), not an asv suite: it starts
``rmqstore serve`` in a child process on a fresh store and measures, with the official
client, send and receive+ack rates with 1 and 4 threads, p50/p99 send latency, the
endpoint's CPU time per message (from /proc) and the client's own CPU per message; then a
raw gRPC load (pre-built requests on plain stubs: sends, then receives of 32 with one ack a
message as the official consumer acks) against the endpoint and, in the same run, against a
no-op ``MessagingService`` on grpcio's server (another child process answering OK with the
same response shapes): the ceiling grpcio itself sets on this machine.

    python asv_bench/endpoint_figures.py [--messages 2000] [--body 128] [--json]
    python asv_bench/endpoint_figures.py --noop-server [--listen 127.0.0.1:0]   # the peer alone
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

THREADS = (1, 4)
BATCH = 32


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _wait_listening(proc, log):
    for _ in range(300):
        text = open(log, encoding="utf-8", errors="replace").read()
        if "listening on " in text:
            return proc, text.split("listening on ")[1].split()[0]
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not start: {open(log).read()}")


def _start(store, log):
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rmqstore.cli", "serve", store, "--create",
                                 "--listen", "127.0.0.1:0", "--segment-size", str(64 << 20), "--index-slots", "65536",
                                 "--index-entries", "262144"], stdout=subprocess.DEVNULL, stderr=err)
    return _wait_listening(proc, log)


def _start_noop(log):
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--noop-server"],
                                stdout=subprocess.DEVNULL, stderr=err)
    return _wait_listening(proc, log)


def noop_server(listen="127.0.0.1:0", workers=256):
    """A MessagingService that stores nothing: SendMessage answers OK per message, a receive
    streams status, delivery time and ``batch_size`` copies of one message, acks answer OK.
    Served as the endpoint is served (grpcio's sync server, the same pool size)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc
    ok = definition_pb2.Code.OK

    class Noop(service_pb2_grpc.MessagingServiceServicer):
        def __init__(self):
            self.offset = 0
            self.template = definition_pb2.Message()
            self.template.topic.name, self.template.body = "Noop", b"x" * 128
            sp = self.template.system_properties
            sp.message_id, sp.tag, sp.receipt_handle = "0" * 32, "TagA", "0.0.1"
            sp.message_type = definition_pb2.MessageType.NORMAL

        def SendMessage(self, request, context):
            res = service_pb2.SendMessageResponse()
            for pb in request.messages:
                e = res.entries.add()
                e.status.code, e.status.message = ok, "OK"
                e.message_id, e.offset = pb.system_properties.message_id, self.offset
                self.offset += 1
            res.status.code, res.status.message = ok, "OK"
            return res

        def ReceiveMessage(self, request, context):
            first = service_pb2.ReceiveMessageResponse()
            first.status.code, first.status.message = ok, "OK"
            yield first
            stamp = service_pb2.ReceiveMessageResponse()
            stamp.delivery_timestamp.GetCurrentTime()
            yield stamp
            for _ in range(request.batch_size):
                r = service_pb2.ReceiveMessageResponse()
                r.message.CopyFrom(self.template)
                yield r

        def AckMessage(self, request, context):
            res = service_pb2.AckMessageResponse()
            for entry in request.entries:
                out = res.entries.add()
                out.message_id, out.receipt_handle = entry.message_id, entry.receipt_handle
                out.status.code, out.status.message = ok, "OK"
            res.status.code, res.status.message = ok, "OK"
            return res

    server = grpc.server(ThreadPoolExecutor(max_workers=workers))
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Noop(), server)
    port = server.add_insecure_port(listen)
    server.start()
    print(f"no-op MessagingService listening on {listen.rpartition(':')[0]}:{port}", file=sys.stderr, flush=True)
    server.wait_for_termination()


def _percentile(values, q):
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else 0.0)


def _threads(n, threads, run):
    """Run ``run(count)`` in ``threads`` threads (``n`` split between them); the seconds taken."""
    ths = [threading.Thread(target=run, args=(n // threads,)) for _ in range(threads)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.perf_counter() - t0


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
    t0, c0 = time.perf_counter(), _own_cpu()
    for th in ths:
        th.join()
    return len(lat), max(ends) - t0, lat, _own_cpu() - c0


def _client_receive(addr, topic, n):
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
    cfg = ClientConfiguration(addr, Credentials(), request_timeout=10)
    c = SimpleConsumer(cfg, "FigGroup" + topic, {topic: FilterExpression()}, await_duration=2)
    c.startup()
    got, t0, c0 = 0, time.perf_counter(), _own_cpu()
    try:
        while got < n:
            batch = c.receive(BATCH, 60)
            if not batch:
                break
            for m in batch:
                c.ack(m)
            got += len(batch)
    finally:
        c.shutdown()
    return got, time.perf_counter() - t0, _own_cpu() - c0


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

    return n // threads * threads, _threads(n, threads, run)


def _raw_receive(addr, topic, n, threads):
    """Receive and ack ``n`` messages (``threads`` consumers of one group, batches of 32,
    one AckMessage a message); the messages acked and the seconds taken."""
    import grpc
    from rocketmq.grpc_protocol import service_pb2, service_pb2_grpc
    acked = [0]
    lock = threading.Lock()

    def run(_count):
        with grpc.insecure_channel(addr) as ch:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            req = service_pb2.ReceiveMessageRequest(batch_size=BATCH)
            req.group.name, req.message_queue.topic.name = "RawGroup" + topic, topic
            req.long_polling_timeout.seconds = 2
            req.invisible_duration.seconds = 60
            empty = 0
            while acked[0] < n and empty < 3:
                req.batch_size = max(1, min(BATCH, n - acked[0]))
                msgs = [r.message for r in stub.ReceiveMessage(req, timeout=30) if r.HasField("message")]
                empty = 0 if msgs else empty + 1
                for m in msgs:
                    ack = service_pb2.AckMessageRequest(group=req.group, topic=req.message_queue.topic)
                    ack.entries.add(message_id=m.system_properties.message_id,
                                    receipt_handle=m.system_properties.receipt_handle)
                    stub.AckMessage(ack, timeout=30)
                with lock:
                    acked[0] += len(msgs)

    secs = _threads(n, threads, run)
    return acked[0], secs


def _row(case, done, secs, pid, cpu0, own0):
    return {"case": case, "messages": done, "per_s": done / secs,
            "server_cpu_us_per_msg": (_cpu_seconds(pid) - cpu0) / max(done, 1) * 1e6,
            "client_cpu_us_per_msg": (_own_cpu() - own0) / max(done, 1) * 1e6}


def _raw_rows(addr, pid, messages, body, peer):
    """Raw send and receive+ack rows for one server (``peer``: "" or "no-op ")."""
    rows = []
    for threads in THREADS:
        topic = f"Raw{threads}"
        cpu0, own0 = _cpu_seconds(pid), _own_cpu()
        done, secs = _raw_send(addr, topic, messages, threads, body)
        rows.append(_row(f"{peer}raw gRPC send, {threads} thread(s)", done, secs, pid, cpu0, own0))
        cpu0, own0 = _cpu_seconds(pid), _own_cpu()
        done, secs = _raw_receive(addr, topic, done, threads)
        rows.append(_row(f"{peer}raw gRPC receive+ack, {threads} thread(s)", done, secs, pid, cpu0, own0))
    return rows


def run(messages=2000, body_size=128, workdir=None):
    """The figures as a dict (one row per case)."""
    body = b"x" * body_size
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        proc, addr = _start(os.path.join(d, "store"), os.path.join(d, "serve.log"))
        noop, noop_addr = _start_noop(os.path.join(d, "noop.log"))
        try:
            for threads in THREADS:
                topic = f"Fig{threads}"
                cpu0 = _cpu_seconds(proc.pid)
                sent, secs, lat, own = _client_send(addr, topic, messages, threads, body)
                cpu1 = _cpu_seconds(proc.pid)
                got, rsecs, rown = _client_receive(addr, topic, sent)
                cpu2 = _cpu_seconds(proc.pid)
                rows.append({"case": f"client send, {threads} producer thread(s)", "messages": sent,
                             "per_s": sent / secs, "p50_ms": _percentile(lat, 50) * 1e3,
                             "p99_ms": _percentile(lat, 99) * 1e3, "server_cpu_us_per_msg": (cpu1 - cpu0) / sent * 1e6,
                             "client_cpu_us_per_msg": own / sent * 1e6})
                rows.append({"case": f"client receive+ack (after {threads}-thread send)", "messages": got,
                             "per_s": got / rsecs, "server_cpu_us_per_msg": (cpu2 - cpu1) / max(got, 1) * 1e6,
                             "client_cpu_us_per_msg": rown / max(got, 1) * 1e6})
            rows += _raw_rows(addr, proc.pid, messages, body, "")
            rows += _raw_rows(noop_addr, noop.pid, messages, body, "no-op ")
        finally:
            for p in (proc, noop):
                p.terminate()
            for p in (proc, noop):
                p.wait(60)
    return {"messages": messages, "body_size": body_size, "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000, help="messages per case (default 2000)")
    ap.add_argument("--body", type=int, default=128, help="body size in bytes (default 128)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--noop-server", action="store_true", help="serve the no-op MessagingService only")
    ap.add_argument("--listen", default="127.0.0.1:0", help="the no-op server's address (default 127.0.0.1:0)")
    args = ap.parse_args(argv)
    if args.noop_server:
        return noop_server(args.listen)
    res = run(args.messages, args.body)
    if args.json:
        print(json.dumps(res, indent=2))
        return res
    print(f"{'case':46} {'msgs':>6} {'msg/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'srv CPU us/msg':>15} "
          f"{'cli CPU us/msg':>15}")
    for r in res["rows"]:
        print(f"{r['case']:46} {r['messages']:6d} {r['per_s']:8.0f} {r.get('p50_ms', float('nan')):7.2f} "
              f"{r.get('p99_ms', float('nan')):7.2f} {r['server_cpu_us_per_msg']:15.0f} "
              f"{r['client_cpu_us_per_msg']:15.0f}")
    return res


if __name__ == "__main__":
    main()
