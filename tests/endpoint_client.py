"""Helpers for the endpoint tests: an in-process endpoint on a fresh store, the official
client's producer and simple consumer, and a raw gRPC stub for requests the client never sends."""
from __future__ import annotations

import contextlib
import time

import grpc
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import service_pb2_grpc

from rmqstore import MessageStore, StoreConfig
from rmqstore.endpoint import Endpoint


def client_config(addr):
    """The client's configuration, with a request timeout that a loaded shared machine's
    fsync stalls stay under (the client's default is 3 s)."""
    return ClientConfiguration(addr, Credentials(), request_timeout=10)


def endpoint_config(**changes):
    base = dict(commitlog_file_size=1 << 20, consume_queue_entries=1000, index_slots=1024, index_entries=8192,
                warm_mapped_file=False)
    base.update(changes)
    return StoreConfig(**base)


@contextlib.contextmanager
def running(path, config=None, **options):
    """(store, endpoint, "127.0.0.1:port") for an endpoint on a free loopback port."""
    with MessageStore(path, config or endpoint_config()) as store:
        ep = Endpoint(store, "127.0.0.1:0", **options)
        try:
            yield store, ep, f"127.0.0.1:{ep.port}"
        finally:
            ep.stop()


@contextlib.contextmanager
def producer(addr, *topics):
    p = Producer(client_config(addr), topics)
    p.startup()
    try:
        yield p
    finally:
        p.shutdown()


@contextlib.contextmanager
def consumer(addr, group, topic, expression="*", await_duration=1):
    c = SimpleConsumer(client_config(addr), group, {topic: FilterExpression(expression)},
                       await_duration=await_duration)
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def message(topic, body, tag=None, keys=(), properties=None, group=None, deliver_at_s=None):
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for k in keys:
        m.keys = k
    for k, v in (properties or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    if deliver_at_s:
        m.delivery_timestamp = deliver_at_s
    return m


def receive_all(c, want, invisible=30, ack=True, limit_s=60):
    """Receive (and ack) until ``want`` messages came or nothing came for ``limit_s`` (a guard
    against a hang, not a timing assertion)."""
    got = []
    quiet_since = time.monotonic()
    while len(got) < want and time.monotonic() - quiet_since < limit_s:
        batch = c.receive(32, invisible)
        if batch:
            quiet_since = time.monotonic()
        for m in batch:
            got.append(m)
            if ack:
                c.ack(m)
    return got


def stub(addr):
    channel = grpc.insecure_channel(addr)
    return channel, service_pb2_grpc.MessagingServiceStub(channel)
