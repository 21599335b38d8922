"""POP consumption over the store: receive with an invisible time, ack, change the invisible
time, redeliver with the attempt counted, move to ``%DLQ%group`` after the last attempt.

Rules (RocketMQ 5's POP semantics, reduced to one node):

- A receive first hands out pending messages whose invisible time has passed (offset
  order, attempt + 1), then messages never handed out, from ``next``, that match the tag
  filter; messages that do not match are finished for the group.
- A message whose next attempt would exceed ``max_attempts`` goes to ``%DLQ%group`` and is
  finished instead.
- A delayed message (``__STARTDELIVERTIME`` in the future) becomes a pending entry with 0
  attempts, invisible until its delivery time.
- FIFO: while a message carrying a message group is in flight (handed out, invisible) in
  a queue, nothing more is handed out from that queue, so the group's order holds.

Each group's progress (its first unfinished offset per queue) is mirrored into the store's
consumer offsets (``config/consumerOffset.json``) so the store's tools see it; the PopState
is what the endpoint trusts.

Receipt handles are ``q.offset.seq`` (queue id, queue offset, receipt generation).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from rocketmq.grpc_protocol import definition_pb2

from rmqstore._message import MessageExt
from rmqstore.consumer import GetMessageStatus, TagFilter
from rmqstore.endpoint.codec import MESSAGE_GROUP, RequestError, deliver_at, to_dead_letter
from rmqstore.errors import InvalidArgumentError, MessageTooLargeError, StoreError
from rmqstore.pop_state import PopState, QueueState
from rmqstore.store import MessageStore

Code = definition_pb2.Code
log = logging.getLogger("rmqstore.endpoint")

_GONE = (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.MESSAGE_WAS_REMOVING)


class _NotYet(Exception):
    """A pending message the queue does not reach now (see Pop._message)."""


@dataclass
class Delivery:
    """One message handed out: the stored message, its receipt handle and attempt."""
    message: MessageExt
    receipt: str
    attempt: int


def check_filter(expression: str) -> str:
    """A tag expression the store's TagFilter accepts; RequestError otherwise."""
    try:
        TagFilter(expression)
    except InvalidArgumentError as e:
        raise RequestError(Code.ILLEGAL_FILTER_EXPRESSION, str(e)) from None
    if any("|" in p for p in expression.split("||")):
        raise RequestError(Code.ILLEGAL_FILTER_EXPRESSION, f"malformed tag expression {expression!r}")
    return expression


def parse_receipt(handle: str) -> tuple[int, int, int]:
    try:
        q, off, seq = (int(x) for x in handle.split("."))
    except ValueError:
        raise RequestError(Code.INVALID_RECEIPT_HANDLE, f"malformed receipt handle {handle!r}") from None
    return q, off, seq


class Pop:
    """Receive/ack/change-invisible for every group, over ``store`` and a PopState."""

    def __init__(self, store: MessageStore, state: PopState, max_attempts: int = 17) -> None:
        self.store = store
        self.state = state
        self.max_attempts = max_attempts
        self.arrived = threading.Condition()

    def notify(self) -> None:
        with self.arrived:
            self.arrived.notify_all()

    def _message(self, topic: str, q: int, offset: int) -> MessageExt | None:
        """The stored message at ``offset``; None when it is gone for good (retention removed
        it, or its record cannot be read). _NotYet when the queue does not reach it now (a
        rebuild in the same process is making the queue again): it stays pending."""
        res = self.store.get_messages(topic, q, offset, 1)
        if res.messages and res.messages[0].queue_offset == offset:
            return res.messages[0]
        if res.problems or res.status in _GONE:
            return None
        raise _NotYet(offset)

    def receive(self, group: str, topic: str, queues: list[int], expression: str, batch: int,
                invisible_ms: int) -> list[Delivery]:
        """Up to ``batch`` deliveries from ``queues`` (tried in that order); [] when none is ready."""
        out: list[Delivery] = []
        for q in queues:
            if len(out) >= batch:
                break
            out.extend(self._receive_queue(group, topic, q, expression, batch - len(out), invisible_ms))
        return out

    def _receive_queue(self, group: str, topic: str, q: int, expression: str, batch: int,
                       invisible_ms: int) -> list[Delivery]:
        st = self.state
        with st.lock:
            qs = st.queue((group, topic, q))
            now = int(time.time() * 1000)
            if any(e[3] and e[1] > 0 and e[0] > now for e in qs.pending.values()):
                return []
            records: list[list[Any]] = []
            out: list[Delivery] = []
            try:   # what was done is recorded even if a later step fails: a dead letter is written once
                for off in sorted(o for o, e in qs.pending.items() if e[0] <= now):
                    if len(out) >= batch:
                        break
                    attempts = qs.pending[off][1] + 1
                    try:
                        m = self._message(topic, q, off)
                    except _NotYet:
                        continue
                    if m is None:                                  # removed by retention
                        records.append(["a", group, topic, q, off])
                    elif attempts > self.max_attempts:
                        self._to_dead_letter(m, group, attempts - 1)
                        records.append(["a", group, topic, q, off])
                    else:
                        out.append(self._hand_out(records, group, topic, q, m, attempts, now + invisible_ms))
                # a FIFO message handed out again: new messages wait behind it
                if len(out) < batch and not any(r[0] == "r" and r[8] for r in records):
                    self._receive_new(qs, group, topic, q, expression, batch - len(out), now, invisible_ms, records,
                                      out)
            finally:
                st.append(records)
                if records:
                    self._commit(group, topic, q)
            return out

    def _to_dead_letter(self, m: MessageExt, group: str, attempts: int) -> None:
        """Write ``m``'s copy to ``%DLQ%group``. A copy the store refuses (the origin
        properties take it past max_message_size or the properties limit) is logged and
        not written: the message is finished for the group all the same and stays in its
        topic, where retrying could never succeed and would stop every receive of the group."""
        try:
            self.store.put(to_dead_letter(m, group, attempts), 0)   # the broker's one DLQ queue
        except (MessageTooLargeError, InvalidArgumentError) as e:
            log.error("group %s: the dead-letter copy of %s queue %d offset %d was refused (%s); the message "
                      "is finished for the group and stays in its topic", group, m.topic, m.queue_id,
                      m.queue_offset, e)

    def _commit(self, group: str, topic: str, q: int) -> None:
        """Mirror the group's progress (first offset not finished) into consumerOffset.json,
        for the store's tools; the POP state stays the authority."""
        qs = self.state.queue((group, topic, q))
        self.store.commit_offset(group, topic, q, min(qs.pending, default=qs.next))

    def _receive_new(self, qs: QueueState, group: str, topic: str, q: int, expression: str, batch: int, now: int,
                     invisible_ms: int, records: list[list[Any]], out: list[Delivery]) -> None:
        res = self.store.get_messages(topic, q, qs.next, batch, expression)
        for m in res.messages:
            due = deliver_at(m)
            if due > now:
                records.append(["r", group, topic, q, m.queue_offset, due, 0, self.state.next_seq(), 0])
            else:
                out.append(self._hand_out(records, group, topic, q, m, 1, now + invisible_ms))
        if res.next_offset > qs.next:
            records.append(["n", group, topic, q, res.next_offset])

    def _hand_out(self, records: list[list[Any]], group: str, topic: str, q: int, m: MessageExt, attempt: int,
                  until: int) -> Delivery:
        seq = self.state.next_seq()
        records.append(["r", group, topic, q, m.queue_offset, until, attempt, seq, int(MESSAGE_GROUP in m.properties)])
        return Delivery(m, f"{q}.{m.queue_offset}.{seq}", attempt)

    def _pending(self, group: str, topic: str, handle: str) -> tuple[int, int, list[int]]:
        q, off, seq = parse_receipt(handle)
        qs = self.state.queues.get((group, topic, q))   # a forged handle must not add state
        entry = None if qs is None else qs.pending.get(off)
        if entry is None or entry[2] != seq:
            raise RequestError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle {handle!r} is stale or unknown")
        return q, off, entry

    def ack(self, group: str, topic: str, handles: list[str]) -> list[RequestError | None]:
        """Finish the messages ``handles`` name; durable before it returns. Per handle: None or the error."""
        results: list[RequestError | None] = []
        with self.state.lock:
            records: list[list[Any]] = []
            for h in handles:
                try:
                    q, off, _ = self._pending(group, topic, h)
                    records.append(["a", group, topic, q, off])
                    results.append(None)
                except RequestError as e:
                    results.append(e)
            ticket = self.state.append(records)
            for q in {r[3] for r in records}:
                self._commit(group, topic, q)
        self.state.sync(ticket)      # with other threads' acks (group commit), the lock let go
        return results

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """Make a handed-out message visible again after ``invisible_ms``; the new receipt handle."""
        with self.state.lock:
            q, off, entry = self._pending(group, topic, handle)
            seq = self.state.next_seq()
            until = int(time.time() * 1000) + invisible_ms
            ticket = self.state.append([["r", group, topic, q, off, until, entry[1], seq, entry[3]]])
        self.state.sync(ticket)
        return f"{q}.{off}.{seq}"

    def dead_letter(self, group: str, topic: str, handle: str) -> None:
        """Move a handed-out message to ``%DLQ%group`` now (the push consumer's FIFO give-up)."""
        with self.state.lock:
            q, off, entry = self._pending(group, topic, handle)
            try:
                m = self._message(topic, q, off)
            except _NotYet:
                raise RequestError(Code.INTERNAL_SERVER_ERROR, f"queue offset {off} cannot be read now (the "
                                   "store is rebuilding its queues); try again") from None
            if m is not None:
                try:
                    self._to_dead_letter(m, group, entry[1])
                except StoreError as e:
                    raise RequestError(Code.INTERNAL_SERVER_ERROR, str(e)) from None
            ticket = self.state.append([["a", group, topic, q, off]])
        self.state.sync(ticket)

    def next_due_ms(self, group: str, topic: str, queues: list[int]) -> int | None:
        """The earliest invisible-until among the pending messages of these queues."""
        with self.state.lock:
            times = [e[0] for q in queues for e in self.state.queue((group, topic, q)).pending.values()]
        return min(times) if times else None
