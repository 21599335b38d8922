"""Consumer-side semantics: tag expressions and RocketMQ's getMessage, its state machine
and its result."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import rmqstore._read as _read
from rmqstore._record import java_hash
from rmqstore.errors import InvalidArgumentError
from rmqstore.topics import is_safe_dirname

if TYPE_CHECKING:
    from rmqstore.commitlog import CommitLog
    from rmqstore.config import StoreConfig
    from rmqstore.consume_queue import ConsumeQueueTable

log = logging.getLogger(__name__)


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


_ALL = TagFilter(None)   # no expression: every message


def get_message(queues: ConsumeQueueTable, commitlog: CommitLog, config: StoreConfig, topic: str, queue_id: int,
                offset: int, max_count: int = 32, tags: str | None = None) -> GetMessageResult:
    """RocketMQ DefaultMessageStore.getMessage: up to ``max_count`` messages of one queue
    from ``offset``, filtered by a tag expression; statuses and next offsets as RocketMQ's
    (a call never crosses a consume-queue file)."""
    S = GetMessageStatus
    if not isinstance(max_count, int) or max_count <= 0:
        raise InvalidArgumentError(f"max_count must be a positive int, got {max_count!r}")
    if not isinstance(offset, int):
        raise InvalidArgumentError(f"offset must be an int, got {offset!r}")
    flt = TagFilter(tags) if tags is not None else _ALL
    cq = queues.get(topic, queue_id)
    if cq is None:
        # RocketMQ's findConsumeQueue creates any queue asked for, so an unknown
        # topic/queue answers NO_MESSAGE_IN_QUEUE; one that cannot exist does not.
        if not isinstance(queue_id, int) or queue_id < 0 or not isinstance(topic, str) \
                or not is_safe_dirname(topic):
            return GetMessageResult(S.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    lo, hi = cq.min_offset, cq.max_offset
    if hi == 0:
        return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
    if offset < lo:
        return GetMessageResult(S.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return GetMessageResult(S.OFFSET_OVERFLOW_ONE, offset, lo, hi)
    if offset > hi:
        # 4.9.8 and 5.3.3 both answer nextBeginOffset = maxOffset here (manifests)
        return GetMessageResult(S.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
    seg, pos, avail = cq.file_entries(offset)
    if avail == 0:
        per_file = config.consume_queue_entries
        return GetMessageResult(S.OFFSET_FOUND_NULL, offset - offset % per_file + per_file, lo, hi)
    # RocketMQ looks at up to 800 entries (16000 bytes) of the file. Without a tag filter
    # the first max_count usually decide the answer: read those, and the 800 only when the
    # walk used them all without filling the batch (holes, records gone).
    window = min(avail, max(800, max_count))
    first = window if flt.codes is not None else min(window, max_count)
    found = _gather(commitlog, config, seg, pos, first, max_count, flt)
    if len(found[0]) < max_count and found[1] == first < window:
        found = _gather(commitlog, config, seg, pos, window, max_count, flt)
    msgs, used, removing, problems = found
    status = S.FOUND if msgs else S.MESSAGE_WAS_REMOVING if removing else S.NO_MATCHED_MESSAGE
    res = GetMessageResult(status, offset + used, lo, hi, msgs)
    for k, phy, size, why in problems:
        res.problems.append((offset + k, phy, size))
        if why:
            log.warning("%s/%d offset %d: %s", topic, queue_id, offset + k, why)
    return res


def _gather(commitlog: CommitLog, config: StoreConfig, seg: Any, pos: int, count: int, max_count: int,
            flt: TagFilter) -> tuple[list[Any], int, bool, list[tuple[int, int, int, str | None]]]:
    """gather_messages over ``count`` CQ entries at ``pos`` of ``seg``, with the store's limits."""
    return _read.gather_messages(commitlog.segments.segments, seg, pos, count, max_count,
                                 config.max_transfer_count_on_message_in_memory,
                                 config.max_transfer_bytes_on_message_in_memory, commitlog.max_offset,
                                 commitlog.segments.file_size, flt.codes, flt.tags)
