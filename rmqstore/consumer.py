"""Consumer-side semantics: tag expressions and what RocketMQ's getMessage answers (its
statuses and result); the read itself is _consume.QueueReader."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from rmqstore._message import MessageExt
from rmqstore._record import java_hash
from rmqstore.arguments import checked
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError


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
    offset, size) of entries that could not be followed to a record.

    Built by hand (in a test double, say), every argument is checked: InvalidArgumentError
    for a bad value, InvalidArgumentTypeError for a wrong type or a call that does not fit."""

    status: GetMessageStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    problems: list[tuple[int, int, int]] = field(default_factory=list)   # CQ entries that could not be followed


fill_result = GetMessageResult.__init__   # get_messages fills its results in C with it: no checks


def _checked_init(self: GetMessageResult, status: GetMessageStatus, next_offset: int, min_offset: int,
                  max_offset: int, messages: list[MessageExt] | None = None,
                  problems: list[tuple[int, int, int]] | None = None) -> None:
    """A result built by hand, every argument checked.

    Args:
        status: a GetMessageStatus (or its name); next_offset, min_offset, max_offset:
            int64 queue offsets; messages: a list of MessageExt (None: []); problems: a
            list of (queue offset, commitlog offset, size) int tuples (None: [])."""
    if not isinstance(status, str):
        raise InvalidArgumentTypeError(f"status must be a GetMessageStatus, not {type(status).__name__}")
    fill_result(self, GetMessageStatus(status), next_offset, min_offset, max_offset,
                _list_of("messages", messages, lambda m: isinstance(m, MessageExt), "MessageExt"),
                _list_of("problems", problems, lambda p: type(p) is tuple and len(p) == 3 and
                         all(type(v) is int for v in p), "(int, int, int) tuples"))


_checked_init.__name__, _checked_init.__qualname__ = "__init__", "GetMessageResult.__init__"
setattr(GetMessageResult, "__init__", checked(skip=1)(_checked_init))   # noqa: B010 - mypy refuses a method assigned


def _list_of(name: str, v: Any, ok: Callable[[Any], bool], what: str) -> list[Any]:
    """``v`` (None: []) when it is a list whose every element passes ``ok``."""
    if v is None:
        return []
    if not isinstance(v, list) or not all(ok(x) for x in v):
        raise InvalidArgumentTypeError(f"{name} must be a list of {what}, not {type(v).__name__} {v!r:.80}")
    return v


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

