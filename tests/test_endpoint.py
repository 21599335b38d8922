"""The gRPC endpoint with the official RocketMQ 5 Python client: send and receive round
trips, tag filters, independent groups, redelivery, change of invisible time, DLQ, FIFO
order and delayed delivery."""
import collections
import threading
import time

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq")

from rocketmq.v5.exception import BadRequestException  # noqa: E402

from endpoint_client import client_config, consumer, message, producer, receive_all, running, stub  # noqa: E402


def _round_trip(tmp_path, per_topic):
    topics = ("RtA", "RtB")
    sent = {}
    with running(tmp_path / "s") as (store, _ep, addr):
        def produce(pid):
            with producer(addr, *topics) as p:
                for i in range(per_topic):
                    for t in topics:
                        body = f"{t}-{pid}-{i}".encode()
                        m = message(t, body, tag=f"Tag{i % 3}", keys=(f"k{pid}-{i}", f"x{i}"),
                                    properties={"pid": str(pid), "i": str(i)})
                        r = p.send(m)
                        sent[r.message_id] = (t, body, f"Tag{i % 3}", {f"k{pid}-{i}", f"x{i}"},
                                              {"pid": str(pid), "i": str(i)})
        threads = [threading.Thread(target=produce, args=(pid,)) for pid in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(sent) == 2 * 2 * per_topic
        for group in ("G1", "G2"):
            got = []
            for t in topics:
                with consumer(addr, group, t) as c:
                    got += receive_all(c, 2 * per_topic)
                    assert c.receive(32, 30) == []          # nothing left, nothing redelivered
            ids = collections.Counter(m.message_id for m in got)
            assert ids == collections.Counter(list(sent))         # every message exactly once
            for m in got:
                assert (m.topic, m.body, m.tag, set(m.keys), m.properties) == sent[m.message_id]
                assert m.delivery_attempt == 1
        for t in topics:                                      # progress mirrored for the store's tools
            for group in ("G1", "G2"):
                assert [store.committed_offset(group, t, q) for q in range(4)] == \
                    [store.max_offset(t, q) for q in range(4)]
        # stored as a broker stores it: msgId as UNIQ_KEY, keys in the index
        mid, (t, body, _tag, keys, _props) = next(iter(sent.items()))
        assert store.query_by_uniq_key(t, mid).body == body
        assert [m.body for m in store.query_by_key(t, sorted(keys)[0])] == [body]


def test_round_trip_small(tmp_path):
    _round_trip(tmp_path, 50)


@pytest.mark.slow
def test_round_trip_2x2x1000(tmp_path):
    _round_trip(tmp_path, 1000)


def test_tag_filter_and_independent_groups(tmp_path):
    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tf") as p:
            for i, tag in enumerate(["TagA", "TagB", "TagC", "TagA", "TagD"]):
                p.send(message("Tf", f"m{i}".encode(), tag=tag))
        with consumer(addr, "GA", "Tf", "TagA || TagB") as c:
            got = receive_all(c, 3)
            assert sorted(m.body for m in got) == [b"m0", b"m1", b"m3"]
            assert c.receive(32, 30) == []
        with consumer(addr, "GB", "Tf", "TagC") as c:
            assert [m.body for m in receive_all(c, 1)] == [b"m2"]
        with consumer(addr, "GC", "Tf") as c:
            assert sorted(m.body for m in receive_all(c, 5)) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_redelivery_after_invisible_time(tmp_path):
    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tr") as p:
            mid = p.send(message("Tr", b"again")).message_id
        with consumer(addr, "G", "Tr", await_duration=5) as c:
            first = c.receive(1, 1)
            assert [(m.message_id, m.delivery_attempt) for m in first] == [(mid, 1)]
            second = receive_all(c, 1, invisible=1, ack=False)   # not acked: comes back once invisible time is up
            assert [(m.message_id, m.delivery_attempt) for m in second] == [(mid, 2)]
            with pytest.raises(BadRequestException):
                c.ack(first[0])                                   # the first receipt is stale now
            c.ack(second[0])
            c.await_duration = 2
            assert c.receive(1, 1) == [] and c.receive(1, 1) == []


def test_change_invisible_duration(tmp_path):
    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tc") as p:
            mid = p.send(message("Tc", b"later")).message_id
        with consumer(addr, "G", "Tc", await_duration=5) as c:
            (m,) = c.receive(1, 300)
            old = m.receipt_handle
            c.change_invisible_duration(m, 1)                     # visible again in 1 s, not 300
            assert m.receipt_handle != old
            (again,) = receive_all(c, 1, ack=False)
            assert (again.message_id, again.delivery_attempt) == (mid, 2)
            c.ack(again)


def test_dead_letter_after_max_attempts(tmp_path):
    with running(tmp_path / "s", max_attempts=2) as (store, _ep, addr):
        with producer(addr, "Td") as p:
            mid = p.send(message("Td", b"poison", tag="TagP", keys=("pk",))).message_id
        with consumer(addr, "G", "Td", await_duration=3) as c:
            attempts = []
            for _ in range(4):
                attempts += [m.delivery_attempt for m in c.receive(1, 1)]
                time.sleep(1.1)
            assert attempts == [1, 2]                              # then moved to the DLQ
        with consumer(addr, "Dlq", "%DLQ%G") as c:
            (d,) = receive_all(c, 1)
            assert (d.message_id, d.body, d.tag, d.keys) == (mid, b"poison", "TagP", {"pk"})
        assert store.query_by_uniq_key("%DLQ%G", mid).reconsume_times == 1   # delivered twice


def test_fifo_order_within_message_group(tmp_path):
    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tq") as p:
            for i in range(30):
                p.send(message("Tq", f"{i % 3}:{i}".encode(), group=f"order-{i % 3}"))
        with consumer(addr, "G", "Tq", await_duration=1) as c:
            acked = collections.defaultdict(list)           # message group -> bodies in ack order
            (first,) = c.receive(1, 2)                       # not acked: redelivered in 2 s
            # its queue is blocked while it is in flight: the rest of its group waits behind it
            others = c.receive(32, 30)
            assert [m for m in others if m.message_group == first.message_group] == []
            for m in others:
                c.ack(m)
            for m in others + receive_all(c, 30 - len(others)):   # receive_all acks each
                acked[m.message_group].append(m.body)
            for g in range(3):
                assert acked[f"order-{g}"] == [f"{g}:{i}".encode() for i in range(g, 30, 3)]


def test_delayed_message_not_before_its_time(tmp_path):
    with running(tmp_path / "s") as (_s, _ep, addr):
        due = int(time.time()) + 3
        with producer(addr, "Tdl") as p:
            p.send(message("Tdl", b"later", deliver_at_s=due))
            p.send(message("Tdl", b"now"))
        with consumer(addr, "G", "Tdl", await_duration=1) as c:
            assert [m.body for m in c.receive(32, 30)] == [b"now"]
            (m,) = receive_all(c, 1)
            assert time.time() >= due
            assert (m.body, m.delivery_timestamp) == (b"later", due * 1000)


def test_push_consumer_consumes_and_retries(tmp_path):
    from rocketmq import (
        ConsumeResult,
        FilterExpression,
        MessageListener,
        PushConsumer,
    )

    done = threading.Event()
    seen = collections.defaultdict(list)

    class Listener(MessageListener):
        def consume(self, m):
            seen[m.body].append(m.delivery_attempt)
            if m.body == b"fail-once" and m.delivery_attempt == 1:
                return ConsumeResult.FAILURE          # nack: the client changes the invisible time
            if len(seen) == 20 and all(seen.values()) and seen[b"fail-once"][-1:] == [2]:
                done.set()
            return ConsumeResult.SUCCESS

    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tp") as p:
            for i in range(19):
                p.send(message("Tp", f"p{i}".encode(), tag="TagA"))
            p.send(message("Tp", b"fail-once", tag="TagA"))
        pc = PushConsumer(client_config(addr), "GP", Listener(),
                          {"Tp": FilterExpression("TagA")})
        pc.startup()
        try:
            done.wait(60)
        finally:
            pc.shutdown()
    assert {b: a for b, a in seen.items() if b != b"fail-once"} == {f"p{i}".encode(): [1] for i in range(19)}
    assert seen[b"fail-once"] == [1, 2]


def test_sent_messages_found_by_rmqstore_query(tmp_path, capsys):
    import json

    from rmqstore.cli import main
    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tcli") as p:
            mid = p.send(message("Tcli", b"find me", tag="TagQ", keys=("order-7",))).message_id
    for key in (mid, "order-7"):
        assert main(["query", str(tmp_path / "s"), "--topic", "Tcli", "--key", key, "--json",
                     "--index-slots", "1024", "--index-entries", "8192"]) == 0
        (found,) = json.loads(capsys.readouterr().out)
        assert (found["body"], found["uniqKey"], found["tags"], found["keys"]) == ("find me", mid, "TagQ", "order-7")


def test_long_polling_returns_a_message_sent_while_waiting(tmp_path):
    with running(tmp_path / "s") as (_s, _ep, addr):
        with producer(addr, "Tlp") as p, consumer(addr, "G", "Tlp", await_duration=30) as c:
            sender = threading.Timer(0.5, lambda: p.send(message("Tlp", b"while waiting")))
            sender.start()
            got = c.receive(32, 30)                                # one call: it waits for the send
            sender.join()
            assert [m.body for m in got] == [b"while waiting"]


def test_forward_to_dead_letter_queue(tmp_path):
    from rocketmq.grpc_protocol import service_pb2

    with running(tmp_path / "s") as (store, _ep, addr):
        with producer(addr, "Tfw") as p:
            mid = p.send(message("Tfw", b"give up")).message_id
        with consumer(addr, "G", "Tfw") as c:
            (m,) = receive_all(c, 1, ack=False)
            channel, s = stub(addr)
            with channel:
                req = service_pb2.ForwardMessageToDeadLetterQueueRequest(receipt_handle=m.receipt_handle,
                                                                         message_id=mid)
                req.group.name, req.topic.name = "G", "Tfw"
                assert s.ForwardMessageToDeadLetterQueue(req, timeout=10).status.code == 20000   # OK
            with pytest.raises(BadRequestException):
                c.ack(m)                                           # finished: the receipt is gone
        assert store.query_by_uniq_key("%DLQ%G", mid).body == b"give up"


def test_fifo_push_consumer_keeps_group_order(tmp_path):
    from rocketmq import (
        ConsumeResult,
        FilterExpression,
        MessageListener,
        PushConsumer,
    )

    order = collections.defaultdict(list)
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, m):
            order[m.message_group].append(m.body)
            if sum(map(len, order.values())) >= 20:
                done.set()
            return ConsumeResult.SUCCESS

    with running(tmp_path / "s", fifo_groups=frozenset({"GF"})) as (_s, _ep, addr):
        with producer(addr, "Tpf") as p:
            for i in range(20):
                p.send(message("Tpf", f"{i % 2}:{i}".encode(), group=f"g{i % 2}"))
        pc = PushConsumer(client_config(addr), "GF", Listener(), {"Tpf": FilterExpression()})
        pc.startup()
        try:
            assert pc.fifo
            done.wait(60)
        finally:
            pc.shutdown()
    for g in range(2):
        assert order[f"g{g}"] == [f"{g}:{i}".encode() for i in range(g, 20, 2)]


CHILDREN = """
import os, subprocess, sys
os.environ.pop("GRPC_ENABLE_FORK_SUPPORT", None)
from rmqstore import MessageStore
from rmqstore.endpoint import Endpoint
import grpc
with MessageStore(sys.argv[1]) as store:
    ep = Endpoint(store, "127.0.0.1:0")
    grpc.channel_ready_future(grpc.insecure_channel(ep.address)).result(timeout=10)
    failed = sum(subprocess.Popen(["/bin/sh", "-c", "exit 0"], stdin=subprocess.PIPE,
                                  preexec_fn=lambda: None).wait() != 0 for _ in range(300))
    ep.stop()
print("failed", failed)
"""


def test_children_forked_beside_a_running_endpoint_live(tmp_path):
    """A process serving the endpoint can still start programs the way PySpark starts its
    JVM (fork, close descriptors, exec): gRPC's fork handlers, on by default, killed about
    2% of such children."""
    import subprocess
    import sys
    env = {k: v for k, v in __import__("os").environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    p = subprocess.run([sys.executable, "-c", CHILDREN, str(tmp_path / "s")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.split() == ["failed", "0"], (p.stdout, p.stderr[-2000:])
