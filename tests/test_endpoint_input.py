"""The endpoint under bad input: garbage on the port, undecodable requests, oversize
messages, unknown topics with auto-create off, bad filter expressions, stale receipts and
unsupported calls. Each gets a clear status (or gRPC error) and the endpoint keeps serving."""
import os
import socket
import threading
import time

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("rocketmq")

from rocketmq.grpc_protocol import definition_pb2, service_pb2  # noqa: E402
from rocketmq.v5.exception import BadRequestException, IllegalArgumentException  # noqa: E402

from rmqstore import Message  # noqa: E402
from rmqstore.errors import MessageTooLargeError  # noqa: E402

from endpoint_client import consumer, endpoint_config, message, producer, receive_all, running, stub  # noqa: E402

Code = definition_pb2.Code


@pytest.fixture
def strict(tmp_path):
    """An endpoint with auto-create off, a 1 KiB message limit (bodies up to 653 bytes: the rest
    is room for the record's other fields) and one topic "Known"."""
    with running(tmp_path / "s", endpoint_config(max_message_size=1024), auto_create=False) as (store, ep, addr):
        store.put(Message("Known", b"seed", tags="TagA"))
        store.wait_dispatched(10)
        channel, s = stub(addr)
        with channel:
            yield store, addr, s


def _route_ok(s):
    res = s.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="Known")), timeout=10)
    assert res.status.code == Code.OK and sorted(q.id for q in res.message_queues) == [0, 1, 2, 3]


def _send_request(topic, body):
    req = service_pb2.SendMessageRequest()
    m = req.messages.add()
    m.topic.name = topic
    m.body = body
    m.system_properties.message_id = "01ABCDEF"
    m.system_properties.message_type = definition_pb2.MessageType.NORMAL
    return req


def _receive(s, expression, filter_type=definition_pb2.FilterType.TAG, batch=8):
    req = service_pb2.ReceiveMessageRequest(batch_size=batch)
    req.group.name = "G"
    req.message_queue.topic.name = "Known"
    req.filter_expression.type = filter_type
    req.filter_expression.expression = expression
    return list(s.ReceiveMessage(req, timeout=10))


def test_garbage_bytes_on_the_port(strict):
    _store, addr, s = strict
    host, port = addr.rsplit(":", 1)
    h2_preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096), h2_preface + b"\xff" * 64):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(junk)
            try:
                sock.recv(1024)
            except OSError:
                pass
    _route_ok(s)


def test_undecodable_request_gets_a_grpc_error(strict):
    _store, addr, s = strict
    channel = grpc.insecure_channel(addr)
    raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\xff\xff\xff\xff not a protobuf", timeout=10)
    assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    channel.close()
    _route_ok(s)


def test_oversize_and_empty_messages(strict):
    store, addr, s = strict
    res = s.SendMessage(_send_request("Known", b"x" * 1025), timeout=10)
    assert res.status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert s.SendMessage(_send_request("Known", b""), timeout=10).status.code == Code.MESSAGE_BODY_EMPTY
    far = _send_request("Known", b"x")
    far.messages[0].system_properties.delivery_timestamp.seconds = 2 ** 40
    assert s.SendMessage(far, timeout=10).status.code == Code.ILLEGAL_DELIVERY_TIME
    assert s.SendMessage(_send_request("Known", b"x" * 600), timeout=10).status.code == Code.OK
    assert store.max_offset("Known", 0) + store.max_offset("Known", 1) >= 1
    with producer(addr, "Known") as p, pytest.raises(IllegalArgumentException):
        p.send(message("Known", b"y" * 2000))          # the client learnt the limit from the settings
    _route_ok(s)


def test_unknown_topic_with_auto_create_off(strict):
    _store, addr, s = strict
    res = s.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="Nope")), timeout=10)
    assert res.status.code == Code.TOPIC_NOT_FOUND
    assert s.SendMessage(_send_request("Nope", b"x"), timeout=10).status.code == Code.TOPIC_NOT_FOUND
    assert s.SendMessage(_send_request("bad/topic", b"x"), timeout=10).status.code == Code.ILLEGAL_TOPIC
    with producer(addr) as p, pytest.raises(Exception, match="route"):
        p.send(message("Nope", b"x"))
    _route_ok(s)


def test_bad_filter_expressions(strict):
    _store, addr, s = strict
    for expr in ("TagA ||", "|| TagB", "TagA ||| TagB"):
        (res,) = _receive(s, expr)
        assert res.status.code == Code.ILLEGAL_FILTER_EXPRESSION, expr
    (res,) = _receive(s, "a > 1", definition_pb2.FilterType.SQL)
    assert res.status.code == Code.UNSUPPORTED
    (res,) = _receive(s, "*", batch=0)
    assert res.status.code == Code.BAD_REQUEST
    with consumer(addr, "G2", "Known", "TagA ||") as c, pytest.raises(BadRequestException):
        c.receive(1, 10)
    got = _receive(s, "TagA || TagB")
    assert got[0].status.code == Code.OK
    assert [r.message.body for r in got if r.HasField("message")] == [b"seed"]


def test_what_the_store_refuses_in_a_request_is_the_clients_error(strict):
    """A user property or message id holding a \x01/\x02 separator (or an empty
    property name) is refused (INTERNAL_SERVER_ERROR before), with the code RocketMQ's proxy
    answers for a control character there. A consumer group outside RocketMQ's rule ("G G", over 255 characters) is
    ILLEGAL_CONSUMER_GROUP before anything is handed out (commit_offset refused it after
    the messages were made invisible). Nothing stored is lost."""
    store, _addr, s = strict
    for change, code in ((lambda m: m.user_properties.update({"a\x01": "b"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
                         (lambda m: m.user_properties.update({"": "b"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
                         (lambda m: m.user_properties.update({"a": "b\x02c"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
                         (lambda m: setattr(m.system_properties, "message_id", "01\x02AB"), Code.ILLEGAL_MESSAGE_ID)):
        req = _send_request("Known", b"x")
        change(req.messages[0])
        assert s.SendMessage(req, timeout=10).status.code == code
    for group in ("G G", "G\n", "G" * 256):
        req = service_pb2.ReceiveMessageRequest(batch_size=8)
        req.group.name, req.message_queue.topic.name = group, "Known"
        (res,) = list(s.ReceiveMessage(req, timeout=10))
        assert res.status.code == Code.ILLEGAL_CONSUMER_GROUP, group
    got = _receive(s, "*")
    assert [r.message.body for r in got if r.HasField("message")] == [b"seed"]
    assert store.max_offset("Known", 0) + store.max_offset("Known", 1) + store.max_offset("Known", 2) \
        + store.max_offset("Known", 3) == 1


def _stored(store, topic="Known"):
    store.wait_dispatched(10)
    return sum(store.max_offset(topic, q) for q in store.queue_ids(topic))


@pytest.mark.parametrize("name", ["DELAY", "REAL_TOPIC", "TRAN_MSG", "WAIT", "TIMER_DELIVER_MS", "RECONSUME_TIME"])
def test_system_property_names_are_refused_in_a_send(strict, name):
    """A user property named as one of RocketMQ's system properties (MessageConst's
    STRING_HASH_SET, which its proxy refuses): DELAY=3 was answered OK and the store's
    delay rewrite moved the message to SCHEDULE_TOPIC_XXXX, so no consumer of the topic
    ever got the acknowledged message. Now ILLEGAL_MESSAGE_PROPERTY_KEY, nothing stored."""
    store, _addr, s = strict
    req = _send_request("Known", b"x")
    req.messages[0].user_properties[name] = "3"
    res = s.SendMessage(req, timeout=10)
    assert res.status.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY and name in res.status.message
    assert _stored(store) == 1 and "SCHEDULE_TOPIC_XXXX" not in store.topics()


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_x"])
def test_system_topics_are_refused(strict, topic):
    """RocketMQ's system topics (TopicValidator.isSystemTopic), which its proxy refuses
    ("cannot access system topic"), were served: a receive from SCHEDULE_TOPIC_XXXX handed
    out a message the store holds there for a delay of 2 hours at once, and sends went
    there too. Now routes, sends and receives of them answer ILLEGAL_TOPIC."""
    store, _addr, s = strict
    store.put(Message("Known", b"later", properties={"DELAY": "18"}))
    store.wait_dispatched(10)
    res = s.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), timeout=10)
    assert res.status.code == Code.ILLEGAL_TOPIC
    assert s.SendMessage(_send_request(topic, b"x"), timeout=10).status.code == Code.ILLEGAL_TOPIC
    req = service_pb2.ReceiveMessageRequest(batch_size=8)
    req.group.name, req.message_queue.topic.name = "G", topic
    assert [r.status.code for r in s.ReceiveMessage(req, timeout=10)] == [Code.ILLEGAL_TOPIC]
    assert [m.body for m in store.scan()] == [b"seed", b"later"]


@pytest.mark.parametrize("tag", ["a\nb", "\x1b[2J", " ", "a\x01b", "a\x85b", "a|b"])
def test_blank_tags_and_tags_with_control_characters_are_refused(strict, tag):
    """RocketMQ's proxy (GrpcValidator.validateTag) refuses a blank tag and one holding '|'
    or a control character with ILLEGAL_MESSAGE_TAG; only '|' was refused here, and a tag
    such as "a\\nb" or "\\x1b[2J" was stored. Now all of them are, and nothing is stored."""
    store, _addr, s = strict
    req = _send_request("Known", b"x")
    req.messages[0].system_properties.tag = tag
    assert s.SendMessage(req, timeout=10).status.code == Code.ILLEGAL_MESSAGE_TAG
    req.messages[0].system_properties.tag = "a b"
    assert s.SendMessage(req, timeout=10).status.code == Code.OK
    assert [m.tags for m in store.scan()] == ["TagA", "a b"]


def test_a_pending_message_the_queue_does_not_reach_now_is_kept(strict):
    """A handed-out message whose invisible time passed is read again for its next
    delivery; when the queue did not reach it (a rebuild in the same process making the
    queue again answers NO_MESSAGE_IN_QUEUE or OFFSET_OVERFLOW_*), it was taken as removed
    by retention and finished: never delivered again, though stored. Now it stays pending
    and comes back once the queue reaches it; only a removed or unreadable one is finished."""
    store, _addr, s = strict

    def receive():
        req = service_pb2.ReceiveMessageRequest(batch_size=8)
        req.group.name, req.message_queue.topic.name = "G", "Known"
        req.invisible_duration.seconds = 1
        return [r.message for r in s.ReceiveMessage(req, timeout=10) if r.HasField("message")]
    assert [(m.body, m.system_properties.delivery_attempt) for m in receive()] == [(b"seed", 1)]
    real = store.get_messages
    store.get_messages = lambda topic, *args, **kwargs: real("Rebuilding", *args, **kwargs)
    try:
        time.sleep(1.2)
        assert receive() == []
    finally:
        store.get_messages = real
    assert [(m.body, m.system_properties.delivery_attempt) for m in receive()] == [(b"seed", 2)]


def test_a_group_whose_dead_letter_topic_cannot_exist_is_refused(tmp_path):
    """Groups may have 255 characters, topics 127 bytes: for a group of 123 or more, a
    message past its last attempt could not move to "%DLQ%" + group (the store refused the
    topic), and from then on every receive of the group answered ILLEGAL_TOPIC: its other
    messages were never delivered. Now such a group is refused (ILLEGAL_CONSUMER_GROUP)
    before anything is handed out; one of 122 works, dead letters included."""
    with running(tmp_path / "s", max_attempts=1) as (store, _ep, addr):
        store.put(Message("Known", b"m1"), queue_id=0)
        store.wait_dispatched(10)
        channel, s = stub(addr)
        with channel:
            def receive(group):
                req = service_pb2.ReceiveMessageRequest(batch_size=8)
                req.group.name, req.message_queue.topic.name = group, "Known"
                req.invisible_duration.seconds = 1
                got = list(s.ReceiveMessage(req, timeout=10))
                return got[0].status.code, [r.message.body for r in got if r.HasField("message")]
            assert receive("G" * 123) == (Code.ILLEGAL_CONSUMER_GROUP, [])
            assert receive("G" * 122) == (Code.OK, [b"m1"])
            time.sleep(1.2)
            assert receive("G" * 122) == (Code.MESSAGE_NOT_FOUND, [])    # past its last attempt: dead-lettered
            store.wait_dispatched(10)
            assert [m.body for m in store.scan() if m.topic == "%DLQ%" + "G" * 122] == [b"m1"]


def test_a_send_of_several_messages_is_all_or_nothing(strict):
    """A request of two messages whose second the store refuses (its record is over the
    1 KiB limit, the body alone is not): the first was stored while the answer said
    MESSAGE_BODY_TOO_LARGE, so a client retrying the request stored it twice. Now the
    request is one put_batch: refused whole, nothing stored; a good pair is stored."""
    store, _addr, s = strict
    req = _send_request("Known", b"x")
    big = req.messages.add()
    big.CopyFrom(req.messages[0])
    big.body, big.system_properties.message_id = b"y" * 1024, "01ABCDF0"
    res = s.SendMessage(req, timeout=10)
    assert res.status.code == Code.MESSAGE_BODY_TOO_LARGE and len(res.entries) == 0
    assert _stored(store) == 1
    big.body = b"y"
    res = s.SendMessage(req, timeout=10)
    assert res.status.code == Code.OK and [e.status.code for e in res.entries] == [Code.OK, Code.OK]
    assert _stored(store) == 3


def test_a_send_naming_several_topics_is_refused_whole(strict):
    """RocketMQ's proxy answers MESSAGE_CORRUPTED to a send whose messages name more than
    one topic (or namespace), and to a send of none; the endpoint stored a message in each
    topic (and answered BAD_REQUEST to an empty send). Now both are MESSAGE_CORRUPTED and
    nothing is stored."""
    store, _addr, s = strict
    req = _send_request("Known", b"x")
    other = req.messages.add()
    other.CopyFrom(req.messages[0])
    other.topic.name = "Other"
    res = s.SendMessage(req, timeout=10)
    assert res.status.code == Code.MESSAGE_CORRUPTED and "Other" in res.status.message
    other.topic.name, other.topic.resource_namespace = "Known", "ns"
    assert s.SendMessage(req, timeout=10).status.code == Code.MESSAGE_CORRUPTED
    assert s.SendMessage(service_pb2.SendMessageRequest(), timeout=10).status.code == Code.MESSAGE_CORRUPTED
    assert _stored(store) == 1 and "Other" not in store.topics()
    other.topic.resource_namespace = ""
    assert s.SendMessage(req, timeout=10).status.code == Code.OK and _stored(store) == 3


def _props(n, size=1):
    return {f"p{i}": "v" * size for i in range(n)}


@pytest.mark.parametrize("field, value, code", [
    ("message_id", " ", Code.ILLEGAL_MESSAGE_ID),
    ("message_id", "01\x7fAB", Code.ILLEGAL_MESSAGE_ID),
    ("message_id", "M" * 33000, Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("message_group", " ", Code.ILLEGAL_MESSAGE_GROUP),
    ("message_group", "g\x02", Code.ILLEGAL_MESSAGE_GROUP),
    ("message_group", "g" * 64, Code.ILLEGAL_MESSAGE_GROUP),
    ("user_properties", {"k": "a\tb"}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ("user_properties", _props(129), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("user_properties", _props(2, 8200), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("keys", ["k\x07"], Code.ILLEGAL_MESSAGE_KEY),
])
def test_send_fields_are_checked_as_rocketmqs_proxy_checks_them(strict, field, value, code):
    """RocketMQ's proxy (SendMessageActivity) refuses a blank message id, a message group
    that is blank, holds a control character or has 64 bytes or more, more than 128 user
    properties or over 16 KiB of them, and control characters in keys and properties. The
    endpoint stored most of them (a group "g\x02" got BAD_REQUEST from the store, a 33000
    character message id MESSAGE_BODY_TOO_LARGE). Now each is refused with the proxy's
    code; nothing is stored."""
    store, _addr, s = strict
    req = _send_request("Known", b"x")
    m = req.messages[0]
    if field == "user_properties":
        m.user_properties.update(value)
    elif field == "keys":
        m.system_properties.keys.extend(value)
    else:
        setattr(m.system_properties, field, value)
    res = s.SendMessage(req, timeout=10)
    assert res.status.code == code, res.status.message
    assert _stored(store) == 1


def test_what_the_proxy_accepts_in_a_send_is_stored(strict):
    """An empty message group is none, an invalid born time is ignored (the proxy does not
    use it: the endpoint refused 2^62 s with ILLEGAL_MESSAGE_PROPERTY_KEY)."""
    store, _addr, s = strict
    req = _send_request("Known", b"x")
    sp = req.messages[0].system_properties
    sp.message_group, sp.born_timestamp.seconds = "", 2 ** 62
    t0 = int(time.time() * 1000)
    assert s.SendMessage(req, timeout=10).status.code == Code.OK
    m = list(store.scan())[-1]
    assert "__SHARDINGKEY" not in m.properties and m.born_timestamp >= t0


def test_a_dead_letter_copy_the_store_refuses_does_not_stop_the_group(tmp_path):
    """A message within max_message_size whose dead-letter copy is not (the origin
    properties make it larger): past its last attempt every receive of the group failed
    with MESSAGE_BODY_TOO_LARGE, for ever, so no later message of any queue was delivered.
    Now the message is finished for the group (it stays in its topic, the refusal is
    logged) and the group goes on."""
    with running(tmp_path / "s", endpoint_config(max_message_size=1024), max_attempts=1) as (store, _ep, addr):
        size = 1024
        while True:   # the largest body the store takes: its dead-letter copy is larger
            try:
                store.put(Message("Known", b"x" * size), queue_id=0)
                break
            except MessageTooLargeError:
                size -= 1
        channel, s = stub(addr)
        with channel:
            def receive():
                req = service_pb2.ReceiveMessageRequest(batch_size=8)
                req.group.name, req.message_queue.topic.name = "G", "Known"
                req.invisible_duration.seconds = 1
                got = list(s.ReceiveMessage(req, timeout=10))
                return got[0].status.code, [len(r.message.body) for r in got if r.HasField("message")]
            store.wait_dispatched(10)
            assert receive() == (Code.OK, [size])
            time.sleep(1.2)
            store.put(Message("Known", b"later"), queue_id=1)
            store.wait_dispatched(10)
            assert receive() == (Code.OK, [5])
            assert receive() == (Code.MESSAGE_NOT_FOUND, [])
        assert len(list(store.scan())) == 2 and "%DLQ%G" not in store.topics()


def test_a_store_is_served_by_one_endpoint_and_never_read_only(tmp_path):
    """Two endpoints on one store each handed out its message (each kept its own
    consumption state in the same popState files): one message, delivered twice at once.
    An endpoint on a store opened read-only wrote popState.json into it. Both are now
    InvalidArgumentError; once the first endpoint stops, another may serve the store."""
    from rmqstore import MessageStore
    from rmqstore.endpoint import Endpoint
    from rmqstore.errors import InvalidArgumentError
    with running(tmp_path / "s") as (store, _ep, _addr):
        with pytest.raises(InvalidArgumentError, match="already served"):
            Endpoint(store, "127.0.0.1:0")
    with MessageStore(tmp_path / "s", read_only=True) as ro:
        before = sorted(os.listdir(tmp_path / "s" / "config"))
        with pytest.raises(InvalidArgumentError, match="read-only"):
            Endpoint(ro, "127.0.0.1:0")
        assert sorted(os.listdir(tmp_path / "s" / "config")) == before
    with running(tmp_path / "s") as (_store, ep, _addr):
        assert ep.port > 0


def test_a_queue_id_far_above_the_others_makes_no_giant_route(tmp_path):
    """One message in queue 2^20 (put by the library or the Spark writer) made the topic's
    route every id up to it: QueryRoute answered 53 MB (past the client's 4 MiB limit) and
    each receive looked in a million queues (7 s). Now the route is ids 0..3 and the ones
    the store holds; a receive naming the far queue starts there, a FIFO send picks among them."""
    with running(tmp_path / "s") as (store, _ep, addr):
        store.put(Message("T", b"far"), queue_id=1 << 20)
        store.wait_dispatched(10)
        channel, s = stub(addr)
        with channel:
            res = s.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="T")), timeout=10)
            assert res.status.code == Code.OK and [q.id for q in res.message_queues] == [0, 1, 2, 3, 1 << 20]
            req = service_pb2.ReceiveMessageRequest(batch_size=8)
            req.group.name, req.message_queue.topic.name, req.message_queue.id = "G", "T", 1 << 20
            t0 = time.monotonic()
            assert [r.message.body for r in s.ReceiveMessage(req, timeout=10) if r.HasField("message")] == [b"far"]
            assert time.monotonic() - t0 < 2
            send = _send_request("T", b"x")
            for group in ("g1", "g2", "g3", "g4", "g5", "g6"):
                send.messages[0].system_properties.message_group = group
                assert s.SendMessage(send, timeout=10).status.code == Code.OK
        store.wait_dispatched(10)
        assert set(store.queue_ids("T")) <= {0, 1, 2, 3, 1 << 20}


def test_gzip_bodies_are_stored_whole_or_refused(strict):
    """A GZIP body cut short was stored as the part that decompressed (and answered OK); of
    two GZIP members only the first was stored; bytes after the GZIP data were dropped;
    a body that is not GZIP was INTERNAL_SERVER_ERROR with a logged traceback. Now all
    members are stored, and the rest is MESSAGE_CORRUPTED, nothing stored."""
    import gzip
    store, _addr, s = strict
    one = gzip.compress(b"hello " * 100)

    def send(body):
        req = _send_request("Known", body)
        req.messages[0].system_properties.body_encoding = definition_pb2.Encoding.GZIP
        return s.SendMessage(req, timeout=10).status.code
    for bad in (one[:len(one) // 2], one + b"junk", b"\x1f\x8bnot gzip", b"plain"):
        assert send(bad) == Code.MESSAGE_CORRUPTED
    assert send(one) == Code.OK and send(gzip.compress(b"a" * 400) + gzip.compress(b"b" * 200)) == Code.OK
    assert send(gzip.compress(b"x" * 1025)) == Code.MESSAGE_BODY_TOO_LARGE
    store.wait_dispatched(10)
    assert [m.body for m in store.scan()] == [b"seed", b"hello " * 100, b"a" * 400 + b"b" * 200]


def test_resource_namespaces_are_unsupported(strict):
    """RocketMQ's proxy makes a resource namespace part of the topic's and group's names;
    the endpoint dropped it, so sends to "ns1"/T and "ns2"/T went to one topic T and a
    consumer of either namespace got both. Now a namespace in any call is UNSUPPORTED and
    nothing is stored or handed out."""
    store, _addr, s = strict
    ns = definition_pb2.Resource(name="Known", resource_namespace="ns1")
    req = _send_request("Known", b"x")
    req.messages[0].topic.CopyFrom(ns)
    assert s.SendMessage(req, timeout=10).status.code == Code.UNSUPPORTED
    assert s.QueryRoute(service_pb2.QueryRouteRequest(topic=ns), timeout=10).status.code == Code.UNSUPPORTED
    group = definition_pb2.Resource(name="G", resource_namespace="ns1")
    assert s.QueryAssignment(service_pb2.QueryAssignmentRequest(topic=ns, group=group), timeout=10).status.code \
        == Code.UNSUPPORTED
    for g, t in ((group, definition_pb2.Resource(name="Known")), (definition_pb2.Resource(name="G"), ns)):
        recv = service_pb2.ReceiveMessageRequest(batch_size=8, group=g)
        recv.message_queue.topic.CopyFrom(t)
        assert [r.status.code for r in s.ReceiveMessage(recv, timeout=10)] == [Code.UNSUPPORTED]
        ack = service_pb2.AckMessageRequest(group=g, topic=t)
        ack.entries.add(message_id="m", receipt_handle="0.0.1")
        assert s.AckMessage(ack, timeout=10).status.code == Code.UNSUPPORTED
        cid = service_pb2.ChangeInvisibleDurationRequest(group=g, topic=t, receipt_handle="0.0.1")
        assert s.ChangeInvisibleDuration(cid, timeout=10).status.code == Code.UNSUPPORTED
        dlq = service_pb2.ForwardMessageToDeadLetterQueueRequest(group=g, topic=t, receipt_handle="0.0.1")
        assert s.ForwardMessageToDeadLetterQueue(dlq, timeout=10).status.code == Code.UNSUPPORTED
    assert _stored(store) == 1
    assert [r.message.body for r in _receive(s, "*") if r.HasField("message")] == [b"seed"]


def test_stale_receipts_and_unsupported_calls(strict):
    _store, _addr, s = strict
    req = service_pb2.AckMessageRequest()
    req.group.name, req.topic.name = "G", "Known"
    for handle in ("garbage", "0.0.1", ""):
        req.entries.add(message_id="m", receipt_handle=handle)
    res = s.AckMessage(req, timeout=10)
    assert res.status.code == Code.MULTIPLE_RESULTS
    assert {e.status.code for e in res.entries} == {Code.INVALID_RECEIPT_HANDLE}
    cid = service_pb2.ChangeInvisibleDurationRequest(receipt_handle="0.0.1")
    assert s.ChangeInvisibleDuration(cid, timeout=10).status.code == Code.INVALID_RECEIPT_HANDLE
    end = service_pb2.EndTransactionRequest(resolution=definition_pb2.TransactionResolution.COMMIT)
    assert s.EndTransaction(end, timeout=10).status.code == Code.INVALID_TRANSACTION_ID
    assert s.RecallMessage(service_pb2.RecallMessageRequest(), timeout=10).status.code == Code.UNSUPPORTED
    tx = _send_request("Known", b"x")
    tx.messages[0].system_properties.message_type = definition_pb2.MessageType.TRANSACTION
    tx.messages.add().CopyFrom(tx.messages[0])
    assert s.SendMessage(tx, timeout=10).status.code == Code.MESSAGE_CORRUPTED     # one half message a send
    _route_ok(s)


def test_forged_receipt_handles_add_no_state(tmp_path):
    """Acks, invisible-time changes and dead-letter moves naming groups, topics and queues
    the endpoint never handed out answer INVALID_RECEIPT_HANDLE and leave nothing behind
    (they added an empty queue state each, kept in every snapshot from then on)."""
    with running(tmp_path / "s") as (_store, ep, addr):
        channel, s = stub(addr)
        with channel:
            for i in range(50):
                group, topic, handle = definition_pb2.Resource(name=f"G{i}"), definition_pb2.Resource(name=f"T{i}"), \
                    f"{i * 7919}.{i}.{i}"
                ack = service_pb2.AckMessageRequest(group=group, topic=topic)
                ack.entries.add(message_id="m", receipt_handle=handle)
                assert s.AckMessage(ack, timeout=10).status.code == Code.INVALID_RECEIPT_HANDLE
                cid = service_pb2.ChangeInvisibleDurationRequest(group=group, topic=topic, receipt_handle=handle)
                assert s.ChangeInvisibleDuration(cid, timeout=10).status.code == Code.INVALID_RECEIPT_HANDLE
                dlq = service_pb2.ForwardMessageToDeadLetterQueueRequest(group=group, topic=topic,
                                                                          receipt_handle=handle)
                assert s.ForwardMessageToDeadLetterQueue(dlq, timeout=10).status.code == Code.INVALID_RECEIPT_HANDLE
        assert ep.state.queues == {}
    with open(tmp_path / "s" / "config" / "popState.json") as f:
        assert '"G1"' not in f.read()


def test_store_closed_under_the_endpoint(tmp_path):
    """The caller closes the store while the endpoint serves: calls answer a status naming
    the closed store, and stop() still ends cleanly and closes the consumption state (it
    raised StoreClosedError before closing it)."""
    with running(tmp_path / "s") as (store, ep, addr):
        store.close()
        channel, s = stub(addr)
        with channel:
            res = s.SendMessage(_send_request("T", b"x"), timeout=10)
            assert res.status.code == Code.INTERNAL_SERVER_ERROR and "closed" in res.status.message
            req = service_pb2.ReceiveMessageRequest(batch_size=8)
            req.group.name, req.message_queue.topic.name = "G", "T"
            got = list(s.ReceiveMessage(req, timeout=10))
            assert [r.status.code for r in got] == [Code.INTERNAL_SERVER_ERROR]
        ep.stop()   # raised StoreClosedError


def test_connected_clients_and_waiting_consumers_cannot_take_every_worker(tmp_path):
    """Each client's telemetry stream and each long-polling receive holds a worker thread;
    with as many of them as workers, every other call queued behind them (a DoS by idle
    clients alone). Of 4 workers, 2 are now kept for short calls, one may hold a telemetry
    stream (a second client is refused with RESOURCE_EXHAUSTED) and one a waiting receive
    (others answer at once), and sends and routes are served meanwhile."""
    with running(tmp_path / "s", workers=4) as (_store, _ep, addr):
        channel, s = stub(addr)
        with channel:
            _route_ok(s)
            hold = threading.Event()

            def settings():
                cmd = service_pb2.TelemetryCommand()
                cmd.settings.publishing.topics.add().name = "Known"
                yield cmd
                hold.wait(30)
            first = s.Telemetry(settings())
            assert next(first).status.code == Code.OK
            second = s.Telemetry(settings())
            with pytest.raises(grpc.RpcError) as e:
                next(second)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "clients connected" in e.value.details()
            done = []

            def wait_long():
                req = service_pb2.ReceiveMessageRequest(batch_size=8)
                req.group.name, req.message_queue.topic.name = "G", "Known"
                req.long_polling_timeout.seconds = 8
                got = list(s.ReceiveMessage(req, timeout=30))
                done.append([r.status.code for r in got])
            polls = [threading.Thread(target=wait_long) for _ in range(3)]
            for t in polls:
                t.start()
            give_up = time.monotonic() + 6     # well before the 8 s poll ends
            while len(done) < 2 and time.monotonic() < give_up:
                time.sleep(0.05)
            assert done == [[Code.MESSAGE_NOT_FOUND]] * 2      # one waits, two answered at once
            res = s.SendMessage(_send_request("Other", b"x"), timeout=30)
            assert res.status.code == Code.OK and len(done) == 2     # served while one poll still waits
            _route_ok(s)
            for t in polls:
                t.join()
            assert done == [[Code.MESSAGE_NOT_FOUND]] * 3
            hold.set()
            first.cancel()


@pytest.mark.parametrize("listen", ["127.0.0.1:70000", "127.0.0.1:65536", "999.1.1.1:80", "192.0.2.1:80",
                                    "127.0.0.1:\u0661\u0662", "in-use"])
def test_a_listen_address_that_cannot_be_bound_is_refused(tmp_path, listen):
    """A port above 65535 was taken modulo 65536 (":70000" listened on 4464), and an
    address grpc cannot bind (not an IP, not this host's, a port in use) raised grpc's bare
    RuntimeError, a traceback from ``rmqstore serve``: now InvalidArgumentError, with the
    consumption state closed and the store still open and whole."""
    from rmqstore import MessageStore
    from rmqstore.endpoint import Endpoint
    from rmqstore.errors import InvalidArgumentError
    with socket.socket() as busy, MessageStore(tmp_path / "s") as store:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if listen == "in-use":
            listen = f"127.0.0.1:{busy.getsockname()[1]}"
        store.put(Message("T", b"kept"))
        with pytest.raises(InvalidArgumentError, match="listen"):
            Endpoint(store, listen)
        assert [m.body for m in store.scan()] == [b"kept"]


@pytest.mark.parametrize("kwargs", [dict(workers=0), dict(max_attempts=0), dict(max_attempts=None), dict(listen=None),
                                    dict(listen=8081), dict(fifo_groups="G1"), dict(fifo_groups=[1]),
                                    dict(auto_create="no"), dict(store=None)])
def test_endpoint_arguments_are_checked(tmp_path, kwargs):
    """Endpoint's (and serve's) own arguments went unchecked: workers=0 was a bare
    ValueError from the thread pool, listen=None an AttributeError, max_attempts 0 or None
    and auto_create "no" were taken (every message dead-lettered, or a TypeError in each
    receive), and fifo_groups="G1" made the groups "G" and "1". Now each is an
    InvalidArgumentError before anything is bound or opened."""
    from rmqstore import MessageStore
    from rmqstore.endpoint import Endpoint
    from rmqstore.errors import InvalidArgumentError
    with MessageStore(tmp_path / "s") as store:
        args = {"store": store, "listen": "127.0.0.1:0", **kwargs}
        with pytest.raises(InvalidArgumentError):
            Endpoint(args.pop("store"), **args)
    assert not os.path.exists(tmp_path / "s" / "config" / "popState.json")


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_too_few_workers_are_refused(tmp_path, workers):
    """1 to 3 workers left no slot for a client's telemetry stream: every client was refused
    ("0 clients connected") by an endpoint that had started. Now such an endpoint is an
    InvalidArgumentError naming the minimum, before anything is bound; 4 serve a client."""
    from rmqstore import MessageStore
    from rmqstore.endpoint import Endpoint
    from rmqstore.errors import InvalidArgumentError
    with MessageStore(tmp_path / "s", endpoint_config()) as store:
        with pytest.raises(InvalidArgumentError, match="at least 4"):
            Endpoint(store, "127.0.0.1:0", workers=workers)
    with running(tmp_path / "s", workers=4) as (_store, _ep, addr), producer(addr, "T") as p:
        assert p.send(message("T", b"served")).message_id


def _advertised_body_size(s, topic):
    cmd = service_pb2.TelemetryCommand()
    cmd.settings.publishing.topics.add().name = topic
    stream = s.Telemetry(iter([cmd]))
    try:
        return next(stream).settings.publishing.max_body_size
    finally:
        stream.cancel()


@pytest.mark.parametrize("limit", [1024, 256 * 1024])
def test_a_body_of_the_advertised_size_is_stored(tmp_path, limit):
    """Clients were told the whole record's limit as their largest body, so a body of
    exactly that size passed the client's check and was refused by the store. The size told
    is now one the store takes whatever the topic and properties (a limit under twice the
    largest properties: whatever the topic, with a few properties): such a body is stored
    and delivered, one byte more is refused by the client."""
    with running(tmp_path / "s", endpoint_config(max_message_size=limit)) as (store, _ep, addr):
        channel, s = stub(addr)
        with channel:
            size = _advertised_body_size(s, "T")
        assert 0 < size < limit
        props = {"p": "v" * (40 if limit == 1024 else 16000)}
        with producer(addr, "T") as p:
            receipt = p.send(message("T", b"b" * size, tag="TagA", keys=("k1",), properties=props))
            with pytest.raises(IllegalArgumentException):
                p.send(message("T", b"b" * (size + 1)))
        with consumer(addr, "G", "T") as c:
            got = receive_all(c, 1, limit_s=10)
        assert [(m.message_id, len(m.body)) for m in got] == [(receipt.message_id, size)]


def test_retry_and_dead_letter_topics_take_sends_as_the_broker_does(tmp_path):
    """A producer may send to a group's %RETRY% and %DLQ% topics, as RocketMQ's proxy lets
    it: they have one queue, 0 (the broker's retryQueueNums and DLQ_NUMS_PER_GROUP; they got
    default_queue_nums), a send to %RETRY%group keeps its delivery attempt as the record's
    reconsume times, and past the group's last attempt goes to %DLQ%group instead."""
    with running(tmp_path / "s", max_attempts=3) as (store, _ep, addr):
        channel, s = stub(addr)
        with channel:
            for topic in ("%RETRY%G", "%DLQ%G"):
                res = s.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), timeout=10)
                assert res.status.code == Code.OK and [q.id for q in res.message_queues] == [0]
            for attempt, body in ((2, b"again"), (3, b"spent")):
                req = _send_request("%RETRY%G", body)
                req.messages[0].system_properties.delivery_attempt = attempt
                req.messages[0].system_properties.message_id = body.hex()
                assert s.SendMessage(req, timeout=10).status.code == Code.OK
        with producer(addr, "%DLQ%G") as p:
            p.send(message("%DLQ%G", b"direct"))
        store.wait_dispatched(10)
        stored = {(m.topic, m.queue_id, m.body, m.reconsume_times) for m in store.scan()}
        assert stored == {("%RETRY%G", 0, b"again", 2), ("%DLQ%G", 0, b"spent", 3), ("%DLQ%G", 0, b"direct", 0)}
        with consumer(addr, "Dlq", "%DLQ%G") as c:
            assert sorted(m.body for m in receive_all(c, 2, limit_s=10)) == [b"direct", b"spent"]
