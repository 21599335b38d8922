"""Consumer-side semantics: tag expressions and what RocketMQ's getMessage answers (its
statuses and result); the read itself is _consume.QueueReader."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rmqstore._record import java_hash
from rmqstore.errors import InvalidArgumentError


class GetMessageStatus(str, Enum):
    """RocketMQ's GetMessageStatus."""
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"

    @classmethod
    def _missing_(cls, value: object) -> GetMessageStatus:
        raise InvalidArgumentError(f"{value!r} is not a GetMessageStatus (one of {', '.join(cls.__members__)})")


@dataclass
class GetMessageResult:
    """What get_messages found: ``status`` (RocketMQ's GetMessageStatus), ``messages``
    (MessageExt, in queue order), ``next_offset`` (where the next call starts),
    ``min_offset``/``max_offset`` of the queue, and ``problems``: (queue offset, commitlog
    offset, size) of entries that could not be followed to a record."""

    status: GetMessageStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[Any] = field(default_factory=list)
    problems: list[tuple[int, int, int]] = field(default_factory=list)   # CQ entries that could not be followed


class TagFilter:
    """A subscription expression: ``*`` (or None/empty) or ``TagA || TagB``. Matching
    compares the consume queue's tags hash first, then the message's real tags, so hash
    collisions never leak a wrong message."""

    __slots__ = ("tags", "codes")

    def __init__(self, expression: str | None) -> None:
        self.tags: frozenset[str] | None = None
        self.codes: frozenset[int] | None = None
        if expression is None:
            return
        if not isinstance(expression, str):
            raise InvalidArgumentError(f"tag expression must be str, not {type(expression).__name__}")
        expr = expression.strip()
        if expr in ("", "*"):
            return
        parts = [p.strip() for p in expr.split("||")]
        if any(not p for p in parts):
            raise InvalidArgumentError(f"malformed tag expression {expression!r}")
        self.tags = frozenset(parts)
        self.codes = frozenset(java_hash(p) for p in parts)

