"""Topic routes: which topics exist and how many queues each has, for one single-node broker.

A topic exists when the store holds it, or once a client used it with auto-create on (it
gets ``default_queue_nums`` queues, like a broker with ``autoCreateTopicEnable``). Its
queues are ids 0 to ``default_queue_nums - 1`` and every id the store holds for it: not
every id up to the largest (one message in queue 2^20 made a route of a million queues).
A group's retry and dead-letter topics (``%RETRY%``, ``%DLQ%``) have one queue, 0, as the
broker makes them (retryQueueNums, DLQ_NUMS_PER_GROUP), and every id the store holds.
"""
from __future__ import annotations

import threading

from rocketmq.grpc_protocol import definition_pb2

from rmqstore.endpoint.codec import RequestError
from rmqstore.errors import InvalidTopicError
from rmqstore.store import MessageStore
from rmqstore.topics import validate_topic

Code = definition_pb2.Code
BROKER_NAME = "rmqstore"
ACCEPTED_TYPES = (definition_pb2.MessageType.NORMAL, definition_pb2.MessageType.FIFO,
                  definition_pb2.MessageType.DELAY, definition_pb2.MessageType.TRANSACTION)
# RocketMQ's TopicValidator.isSystemTopic, which its proxy refuses to route, send to or receive from
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXXX_V2", "BenchmarkTest",
                           "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                           "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})


class Routes:
    """Known topics and their queue counts; thread-safe."""

    def __init__(self, store: MessageStore, auto_create: bool = True) -> None:
        self.store = store
        self.auto_create = auto_create
        self._created: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def queues(self, topic: str, create: bool = True) -> list[int]:
        """The queue ids of ``topic``; RequestError when it is invalid, or unknown and not created."""
        try:
            validate_topic(topic)
        except InvalidTopicError as e:
            raise RequestError(Code.ILLEGAL_TOPIC, str(e)) from None
        if topic in SYSTEM_TOPICS or topic.startswith("rmq_sys_"):   # SCHEDULE_TOPIC_XXXX holds delayed messages
            raise RequestError(Code.ILLEGAL_TOPIC, f"cannot access system topic {topic!r}")
        with self._lock:
            queues = self._created.get(topic)
            if queues is None:
                ids = self.store.queue_ids(topic)
                if not ids and not (self.auto_create and create):
                    raise RequestError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist (auto-create is off)")
                base = 1 if topic.startswith(("%RETRY%", "%DLQ%")) else self.store.config.default_queue_nums
                queues = self._created[topic] = sorted(set(range(base)).union(ids))
        return list(queues)

    def message_queues(self, topic: str, endpoints: definition_pb2.Endpoints,
                       out: object) -> None:
        """Append the protocol MessageQueue of every queue of ``topic`` to repeated field ``out``."""
        for q in self.queues(topic):
            mq = out.add()  # type: ignore[attr-defined]
            mq.topic.name = topic
            mq.id = q
            mq.permission = definition_pb2.Permission.READ_WRITE
            mq.broker.name = BROKER_NAME
            mq.broker.id = 0
            mq.broker.endpoints.CopyFrom(endpoints)
            mq.accept_message_types.extend(ACCEPTED_TYPES)
