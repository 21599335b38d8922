"""The gRPC ``apache.rocketmq.v2.MessagingService`` over a MessageStore.

Every call answers with a protocol status; a request the endpoint cannot serve gets a
clear code (``UNSUPPORTED`` for recall, lite topics, offsets and pull), and an unexpected
failure becomes ``INTERNAL_SERVER_ERROR`` for that call only. Transactional messages are
served by rmqstore.endpoint.transactions; the telemetry stream carries its checks.
"""
from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
import weakref
import zlib
from typing import Any, Callable, Iterator, TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

from rmqstore._message import MessageExt
from rmqstore.endpoint.codec import DLQ_PREFIX, RETRY_PREFIX, RequestError, body_limit, to_proto, to_store
from rmqstore.endpoint.pop import Pop, check_filter
from rmqstore.endpoint.routes import Routes
from rmqstore.endpoint.transactions import Transactions, transaction_id
from rmqstore.errors import InvalidArgumentError, InvalidTopicError, MessageTooLargeError, StoreError
from rmqstore.store import MessageStore
from rmqstore.topics import validate_group, validate_topic

log = logging.getLogger("rmqstore.endpoint")
Code = definition_pb2.Code
Resolution = definition_pb2.TransactionResolution
F = TypeVar("F", bound=Callable[..., Any])
MAX_POLL_S = 60.0
DEFAULT_INVISIBLE_MS = 30_000


def _ms(d: Any) -> int:
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


def _store_error_code(e: StoreError) -> int:
    """The status of a store error: what the store refused in a client's request (a
    property with a separator inside, a message too large) is the client's error; the
    rest the server's."""
    if isinstance(e, MessageTooLargeError):
        return Code.MESSAGE_BODY_TOO_LARGE
    if isinstance(e, InvalidTopicError):
        return Code.ILLEGAL_TOPIC
    return Code.BAD_REQUEST if isinstance(e, InvalidArgumentError) else Code.INTERNAL_SERVER_ERROR


def _answer(response: type) -> Callable[[F], F]:
    """Turn RequestError / StoreError / anything else raised by a unary call into a status."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: MessagingService, request: Any, context: Any) -> Any:
            try:
                return method(self, request, context)
            except RequestError as e:
                code, text = e.code, str(e)
            except StoreError as e:
                code, text = _store_error_code(e), f"{type(e).__name__}: {e}"
            except Exception as e:   # noqa: BLE001 - one failed call must not stop the endpoint
                log.exception("%s failed", method.__name__)
                code, text = Code.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}"
            res = response()
            res.status.code, res.status.message = code, text
            return res
        return run  # type: ignore[return-value]
    return wrap


def _ok(res: Any) -> Any:
    res.status.code, res.status.message = Code.OK, "OK"
    return res


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """The servicer: routes, send, POP receive/ack, settings exchange."""

    def __init__(self, store: MessageStore, pop: Pop, routes: Routes, endpoints: definition_pb2.Endpoints,
                 max_attempts: int, fifo_groups: frozenset[str] = frozenset(), sessions: int = 96,
                 long_polls: int = 96) -> None:
        """A telemetry stream (each client keeps one open) and a receive waiting for messages
        each hold a worker thread: ``sessions`` streams may be open at once (past them a
        client is refused with RESOURCE_EXHAUSTED) and ``long_polls`` receives may wait (past
        them a receive answers at once), so connected clients and waiting consumers can
        never take every worker and leave sends, acks and routes queued behind them."""
        self.sessions = threading.BoundedSemaphore(sessions)
        self.session_limit = sessions
        self.long_polls = threading.BoundedSemaphore(long_polls)
        self.store = store
        self.pop = pop
        self.routes = routes
        self.endpoints = endpoints
        self.max_attempts = max_attempts
        self.fifo_groups = fifo_groups
        self.stopping = threading.Event()
        self.max_body = body_limit(store.config.max_message_size, store.config.commitlog_file_size)
        self.transactions: Transactions | None = None   # set by the Endpoint before it serves
        self._producers: dict[str, list[queue.SimpleQueue[Any]]] = {}   # topic -> its producers' streams
        self._producers_lock = threading.Lock()
        self._ended: weakref.WeakSet[queue.SimpleQueue[Any]] = weakref.WeakSet()   # streams closed
        self._turn = itertools.count()

    # -- routes and clients ---------------------------------------------------------------
    @_answer(service_pb2.QueryRouteResponse)
    def QueryRoute(self, request: Any, context: Any) -> Any:
        res = service_pb2.QueryRouteResponse()
        eps = request.endpoints if request.endpoints.addresses else self.endpoints
        self.routes.message_queues(_name(request.topic), eps, res.message_queues)
        return _ok(res)

    @_answer(service_pb2.QueryAssignmentResponse)
    def QueryAssignment(self, request: Any, context: Any) -> Any:
        res = service_pb2.QueryAssignmentResponse()
        eps = request.endpoints if request.endpoints.addresses else self.endpoints
        routes = service_pb2.QueryRouteResponse()
        self.routes.message_queues(_name(request.topic), eps, routes.message_queues)
        for mq in routes.message_queues:
            res.assignments.add().message_queue.CopyFrom(mq)
        return _ok(res)

    @_answer(service_pb2.HeartbeatResponse)
    def Heartbeat(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.HeartbeatResponse())

    @_answer(service_pb2.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        log.debug("client %s terminating (group %r)", _client_id(context), request.group.name)
        return _ok(service_pb2.NotifyClientTerminationResponse())

    def Telemetry(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        """Settings exchange (each settings command is answered with the server's settings)
        and, to the producers of a topic, the checks of its open transactions. A thread
        reads the client's commands; this one writes what is queued for the client."""
        client = _client_id(context)
        if not self.sessions.acquire(blocking=False):
            log.warning("client %s from %s refused: %d clients connected", client, context.peer(), self.session_limit)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.session_limit} clients connected, the most this "
                          "endpoint serves (rmqstore serve --workers)")
        log.info("client %s connected from %s", client, context.peer())
        out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        topics: set[str] = set()

        def read() -> None:
            try:
                for cmd in request_iterator:
                    if cmd.HasField("settings"):
                        if cmd.settings.HasField("publishing"):
                            self._publishes(out, topics, {t.name for t in cmd.settings.publishing.topics}, True)
                        out.put(self._settings(cmd.settings))
            except grpc.RpcError:   # the stream ended under the reader
                pass
            finally:
                out.put(None)
        context.add_callback(lambda: out.put(None))
        threading.Thread(target=read, name=f"rmqstore-telemetry-{client}", daemon=True).start()
        try:
            while (cmd := out.get()) is not None:
                yield cmd
        finally:
            self._publishes(out, topics, set(), False)
            self.sessions.release()
            log.info("client %s disconnected", client)

    def _publishes(self, stream: queue.SimpleQueue[Any], now: set[str], topics: set[str], live: bool) -> None:
        """Register ``stream`` as a producer of ``topics`` instead of ``now`` (``live``
        False: the stream ended, and later registrations by its reader are ignored)."""
        with self._producers_lock:
            if stream in self._ended:
                return
            for t in now - topics:
                self._producers[t].remove(stream)
                if not self._producers[t]:
                    del self._producers[t]
            for t in topics - now:
                self._producers.setdefault(t, []).append(stream)
            now.clear()
            now.update(topics)
            if not live:
                self._ended.add(stream)

    def send_check(self, group: str, half: MessageExt, transaction_id: str) -> bool:
        """Ask one producer of ``group`` (RocketMQ's proxy makes a topic its own producer
        group) to resolve the half message ``half``; False when none is connected."""
        with self._producers_lock:
            streams = self._producers.get(group)
            stream = streams[next(self._turn) % len(streams)] if streams else None
        if stream is None:
            return False
        cmd = service_pb2.TelemetryCommand()
        rec = cmd.recover_orphaned_transaction_command
        to_proto(half, rec.message, "", 0, 0)
        rec.message.topic.name = group
        rec.transaction_id = transaction_id
        stream.put(cmd)
        return True

    def _settings(self, asked: definition_pb2.Settings) -> service_pb2.TelemetryCommand:
        out = service_pb2.TelemetryCommand()
        s = out.settings
        s.CopyFrom(asked)
        s.backoff_policy.max_attempts = self.max_attempts if asked.HasField("subscription") else 3
        s.backoff_policy.exponential_backoff.initial.seconds = 1
        s.backoff_policy.exponential_backoff.max.seconds = 10
        s.backoff_policy.exponential_backoff.multiplier = 2.0
        if asked.HasField("publishing"):
            s.publishing.max_body_size = self.max_body
            s.publishing.validate_message_type = True
        if asked.HasField("subscription"):
            s.subscription.fifo = asked.subscription.group.name in self.fifo_groups
            s.subscription.receive_batch_size = s.subscription.receive_batch_size or 32
            if not s.subscription.HasField("long_polling_timeout"):
                s.subscription.long_polling_timeout.seconds = 20
        return _ok(out)

    # -- send -----------------------------------------------------------------------------
    @_answer(service_pb2.SendMessageResponse)
    def SendMessage(self, request: Any, context: Any) -> Any:
        if len(request.messages) == 0:
            raise RequestError(Code.MESSAGE_CORRUPTED, "no message to send")
        topic = request.messages[0].topic
        if len(request.messages) > 1 and any(pb.topic != topic for pb in request.messages):   # as RocketMQ's proxy
            raise RequestError(Code.MESSAGE_CORRUPTED, f"the messages of a send name several topics "
                               f"({sorted({pb.topic.name for pb in request.messages})[:4]}); one send, one topic")
        if any(pb.system_properties.message_type == definition_pb2.MessageType.TRANSACTION for pb in request.messages):
            return self._send_half(request, context)
        queues = self.routes.queues(_name(topic))
        peer = context.peer()
        msgs, qids = [], []
        for pb in request.messages:
            msg = to_store(pb, peer, self.max_body)
            group = pb.system_properties.message_group
            qid = queues[(_hash(group) if group else next(self._turn)) % len(queues)]
            if msg.topic.startswith(RETRY_PREFIX):
                qid = self._retry(msg, pb.system_properties.delivery_attempt, qid)
            msgs.append(msg)
            qids.append(qid)
        res = service_pb2.SendMessageResponse()   # all or nothing: a refused message stores none of the request
        for pb, put in zip(request.messages, self.store.put_batch(msgs, qids), strict=True):
            e = res.entries.add()
            _ok(e)
            e.message_id = pb.system_properties.message_id
            e.offset = put.queue_offset
        self.pop.notify()
        return _ok(res)

    def _retry(self, msg: Any, attempt: int, qid: int) -> int:
        """A send to a group's retry topic, as RocketMQ's broker takes one: its delivery
        attempt is the record's reconsume times, and past the group's last attempt it goes to
        the group's dead-letter topic (queue 0) instead. The queue id it is stored in."""
        msg.reconsume_times = max(0, attempt)
        if attempt < self.max_attempts:
            return qid
        msg.topic = DLQ_PREFIX + msg.topic[len(RETRY_PREFIX):]
        self.routes.queues(msg.topic)
        return 0

    def _send_half(self, request: Any, context: Any) -> Any:
        """A transactional send: one message, stored as a half message."""
        if len(request.messages) != 1:
            raise RequestError(Code.MESSAGE_CORRUPTED, "a transactional send holds exactly one message")
        pb = request.messages[0]
        if pb.system_properties.message_group or pb.system_properties.HasField("delivery_timestamp"):
            raise RequestError(Code.MESSAGE_CORRUPTED, "a transactional message cannot have a message group or a "
                               "delivery time")
        queues = self.routes.queues(_name(pb.topic))
        msg = to_store(pb, context.peer(), self.max_body)
        assert self.transactions is not None
        sp = pb.system_properties   # the immunity only when the client set a recovery delay (as the proxy)
        immunity = sp.orphaned_transaction_recovery_duration.seconds \
            if sp.HasField("orphaned_transaction_recovery_duration") else None
        half = self.transactions.put_half(msg, queues[next(self._turn) % len(queues)], immunity)
        res = service_pb2.SendMessageResponse()
        e = _ok(res.entries.add())
        e.message_id, e.offset = pb.system_properties.message_id, half.queue_offset
        e.transaction_id = transaction_id(half)
        return _ok(res)

    @_answer(service_pb2.EndTransactionResponse)
    def EndTransaction(self, request: Any, context: Any) -> Any:
        resolution = request.resolution
        if resolution not in (Resolution.COMMIT, Resolution.ROLLBACK):
            raise RequestError(Code.BAD_REQUEST,
                               f"transaction resolution {resolution} is neither COMMIT nor ROLLBACK")
        assert self.transactions is not None
        self.transactions.end(_name(request.topic), request.message_id, request.transaction_id,
                              resolution == Resolution.COMMIT)
        self.pop.notify()
        return _ok(service_pb2.EndTransactionResponse())

    # -- receive and ack ------------------------------------------------------------------
    def ReceiveMessage(self, request: Any, context: Any) -> Iterator[Any]:
        try:
            group, topic = _name(request.group), _name(request.message_queue.topic)
            if not group or "@" in group:   # '@' separates topic and group in consumerOffset.json
                raise RequestError(Code.ILLEGAL_CONSUMER_GROUP, f"consumer group {group!r} is empty or holds '@'")
            cfg = self.store.config
            try:   # a group commit_offset refuses (the messages were handed out, the answer failed), or
                # whose dead-letter topic the store refuses (past its last attempt a message could not
                # move there, and every receive of the group failed from then on)
                validate_group(group, cfg.strict_topic_names)
                validate_topic(DLQ_PREFIX + group, cfg.message_version, cfg.strict_topic_names)
            except (InvalidArgumentError, InvalidTopicError) as e:
                raise RequestError(Code.ILLEGAL_CONSUMER_GROUP, f"consumer group: {e}") from None
            expr = request.filter_expression
            if expr.type not in (definition_pb2.FilterType.TAG, definition_pb2.FilterType.FILTER_TYPE_UNSPECIFIED):
                raise RequestError(Code.UNSUPPORTED, "only TAG filter expressions are supported")
            expression = check_filter(expr.expression or "*")
            if request.batch_size <= 0 or request.batch_size > 1024:
                raise RequestError(Code.BAD_REQUEST, f"batch_size {request.batch_size} out of range 1..1024")
            invisible = _ms(request.invisible_duration) if request.HasField("invisible_duration") \
                else DEFAULT_INVISIBLE_MS
            if invisible < 0 or invisible > 12 * 3600 * 1000:
                raise RequestError(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible} ms out of range")
            queues = self.routes.queues(topic)
            qid = request.message_queue.id
            start = queues.index(qid) if qid in queues else qid % len(queues) if qid >= 0 else 0
            queues = queues[start:] + queues[:start]
            deadline = time.monotonic() + min(MAX_POLL_S, _ms(request.long_polling_timeout) / 1000)
            if self.long_polls.acquire(blocking=False):
                try:
                    got = self._poll(context, group, topic, queues, expression, request.batch_size, invisible,
                                     deadline)
                finally:
                    self.long_polls.release()
            else:   # as many waiting as may: look once, the client polls again
                got = self._poll(context, group, topic, queues, expression, request.batch_size, invisible, 0.0)
        except RequestError as e:
            yield _status(service_pb2.ReceiveMessageResponse(), e.code, str(e))
            return
        except StoreError as e:
            yield _status(service_pb2.ReceiveMessageResponse(), _store_error_code(e), str(e))
            return
        if not got:
            yield _status(service_pb2.ReceiveMessageResponse(), Code.MESSAGE_NOT_FOUND, "no new message")
            return
        yield _ok(service_pb2.ReceiveMessageResponse())
        stamp = service_pb2.ReceiveMessageResponse()
        stamp.delivery_timestamp.GetCurrentTime()
        yield stamp
        for d in got:
            r = service_pb2.ReceiveMessageResponse()
            to_proto(d.message, r.message, d.receipt, d.attempt, invisible)
            yield r

    def _poll(self, context: Any, group: str, topic: str, queues: list[int], expression: str, batch: int,
              invisible: int, deadline: float) -> list[Any]:
        """Long polling: receive until something is ready, the deadline, a cancel or a stop."""
        while True:
            got = self.pop.receive(group, topic, queues, expression, batch, invisible)
            left = deadline - time.monotonic()
            if got or left <= 0 or self.stopping.is_set() or not context.is_active():
                return got
            with self.pop.arrived:
                self.pop.arrived.wait(min(left, 0.1))

    @_answer(service_pb2.AckMessageResponse)
    def AckMessage(self, request: Any, context: Any) -> Any:
        res = service_pb2.AckMessageResponse()
        errors = self.pop.ack(_name(request.group), _name(request.topic), [e.receipt_handle for e in request.entries])
        for entry, err in zip(request.entries, errors, strict=True):
            out = res.entries.add()
            out.message_id, out.receipt_handle = entry.message_id, entry.receipt_handle
            if err is None:
                _ok(out)
            else:
                _status(out, err.code, str(err))
        if len(errors) == 1 and errors[0] is not None:
            raise errors[0]
        if any(errors):
            return _status(res, Code.MULTIPLE_RESULTS, "some acks failed")
        return _ok(res)

    @_answer(service_pb2.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        invisible = _ms(request.invisible_duration)
        if invisible < 0 or invisible > 12 * 3600 * 1000:
            raise RequestError(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible} ms out of range")
        res = service_pb2.ChangeInvisibleDurationResponse()
        res.receipt_handle = self.pop.change_invisible(_name(request.group), _name(request.topic),
                                                       request.receipt_handle, invisible)
        self.pop.notify()
        return _ok(res)

    @_answer(service_pb2.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        self.pop.dead_letter(_name(request.group), _name(request.topic), request.receipt_handle)
        return _ok(service_pb2.ForwardMessageToDeadLetterQueueResponse())

    # -- unsupported ----------------------------------------------------------------------
    def _unsupported(self, response: type, what: str) -> Any:
        return _status(response(), Code.UNSUPPORTED, f"{what} is not supported by the rmqstore endpoint")

    def RecallMessage(self, request: Any, context: Any) -> Any:
        return self._unsupported(service_pb2.RecallMessageResponse, "RecallMessage")

    def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return self._unsupported(service_pb2.SyncLiteSubscriptionResponse, "SyncLiteSubscription")

    def UpdateOffset(self, request: Any, context: Any) -> Any:
        return self._unsupported(service_pb2.UpdateOffsetResponse, "UpdateOffset")

    def GetOffset(self, request: Any, context: Any) -> Any:
        return self._unsupported(service_pb2.GetOffsetResponse, "GetOffset")

    def QueryOffset(self, request: Any, context: Any) -> Any:
        return self._unsupported(service_pb2.QueryOffsetResponse, "QueryOffset")

    def PullMessage(self, request: Any, context: Any) -> Iterator[Any]:
        yield self._unsupported(service_pb2.PullMessageResponse, "PullMessage")


def _name(resource: Any) -> str:
    """A topic's or group's name. A resource namespace is UNSUPPORTED: RocketMQ's proxy makes
    it part of the name, and taking the bare name would mix the namespaces' messages."""
    if resource.resource_namespace:
        raise RequestError(Code.UNSUPPORTED, f"resource namespace {resource.resource_namespace!r} (of "
                           f"{resource.name!r}): namespaces are not supported by the rmqstore endpoint")
    return str(resource.name)


def _status(res: Any, code: int, message: str) -> Any:
    res.status.code, res.status.message = code, message
    return res


def _client_id(context: Any) -> str:
    for k, v in context.invocation_metadata():
        if k == "x-mq-client-id":
            return str(v)
    return "(no client id)"


def _hash(group: str) -> int:
    """Stable queue choice for a FIFO message group."""
    return zlib.crc32(group.encode("utf-8"))
