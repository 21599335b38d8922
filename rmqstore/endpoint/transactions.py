"""Transactional messages, stored and resolved as RocketMQ 5's broker does.

A transactional send stores a *half message* in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0: the
message with its real topic and queue in the ``REAL_TOPIC`` / ``REAL_QID`` properties,
``TRAN_MSG=true``, ``PGROUP`` (the producer group, which RocketMQ's proxy sets to the topic)
``CHECK_IMMUNITY_TIME_IN_SECONDS`` (the client's orphaned-transaction recovery delay; only
when the client sets one, as RocketMQ 5.3's proxy: without it the check waits
``timeout_ms``), and a transaction-free sys_flag (the broker resets PREPARED so the half topic gets consume-queue
entries). Consumers of the real topic never see it.

``EndTransaction`` COMMIT writes the message to its real topic and queue (REAL_* properties
dropped, sys_flag COMMIT, PREPAREDTRANSACTIONOFFSET = the half's commitlog offset): visible
once. COMMIT and ROLLBACK both append an *op message* to ``RMQ_SYS_TRANS_OP_HALF_TOPIC``
queue 0: tag ``d``, body the half's queue offset in decimal.

Checks (TransactionalMessageCheckService): every ``check_interval_ms`` the half messages
still open, stored before the round began and older than their immunity time
(``CHECK_IMMUNITY_TIME_IN_SECONDS`` when set, else ``timeout_ms``), are checked: a copy is
put back into the half topic with ``TRANSACTION_CHECK_TIMES`` + 1 and a
RecoverOrphanedTransactionCommand naming that copy goes to a producer of the group over its
telemetry stream (its TransactionChecker answers with EndTransaction). A half already
checked ``check_max`` times is discarded as RocketMQ discards it: copied to
``TRANS_CHECK_MAX_TIME_TOPIC`` and never delivered. The check progress (first half offset
still open) is kept as the group ``CID_RMQ_SYS_TRANS``'s consumer offset of the half queue,
and as its offset of the op queue the first op message naming a half at or past that
progress (every op before it names a half below it: not needed again).

Crash safety: the half and op topics are the durable record. On start the open set is
rebuilt, both queues read as a stream from their progress on: half copies minus those an
op message names, grouped by ``UNIQ_KEY`` (a transaction's copies are one transaction;
``put_half`` gives a message without one a new key); then the commitlog from the oldest
open copy is read for what a kill may have left between two writes: a COMMIT record of a
copy (its PREPAREDTRANSACTIONOFFSET names it; its op message never written) or a copy in
``TRANS_CHECK_MAX_TIME_TOPIC`` (discarded). Those are finished (the op written now), so
every transaction ends in exactly one outcome: committed once, rolled back, or discarded.

Thread-safety: one lock orders EndTransaction, the check round and sends of half messages.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2

from rmqstore._message import Message, MessageExt
from rmqstore.endpoint.codec import UNIQ_KEY, RequestError
from rmqstore.errors import StoreError
from rmqstore.store import MessageStore

Code = definition_pb2.Code
log = logging.getLogger("rmqstore.endpoint")

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"        # MixAll.CID_SYS_RMQ_TRANS: the check progress
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
REMOVE_TAG = "d"
TRAN_COMMIT = 0x8                        # MessageSysFlag.TRANSACTION_COMMIT_TYPE
TRAN_MASK = 0xC
# BrokerConfig's defaults (RocketMQ 5.3): transactionCheckInterval, transactionTimeOut, transactionCheckMax
CHECK_INTERVAL_MS = 30_000
TIMEOUT_MS = 6_000
CHECK_MAX = 15


@dataclass
class Open:
    """A transaction not yet resolved: its half copies (queue offset -> commitlog offset), newest last."""
    message_id: str
    topic: str
    copies: dict[int, int] = field(default_factory=dict)
    latest: MessageExt | None = None

    @property
    def transaction_id(self) -> str:
        return transaction_id(self.latest)  # type: ignore[arg-type]


def transaction_id(half: MessageExt) -> str:
    """A half copy's transaction id: its queue offset and commitlog offset."""
    return f"{half.queue_offset}.{half.phy_offset}"


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


class Transactions:
    """Half messages, their resolution and the check round over ``store``.

    ``send_check(group, message, transaction_id)`` is called (with the lock held) to ask a
    producer of ``group``; it returns whether some producer was asked."""

    def __init__(self, store: MessageStore, send_check: Callable[[str, MessageExt, str], bool],
                 check_interval_ms: int = CHECK_INTERVAL_MS, timeout_ms: int = TIMEOUT_MS,
                 check_max: int = CHECK_MAX) -> None:
        self.store = store
        self.send_check = send_check
        self.check_interval_ms = check_interval_ms
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self.lock = threading.Lock()
        self.open: dict[str, Open] = {}
        self._ops: deque[tuple[int, int]] = deque()   # (op queue offset, latest half it names) past the progress
        self._ops_end = 0                              # the op queue's end as written
        self._stop = threading.Event()
        self._rebuild()
        self._thread = threading.Thread(target=self._run, name="rmqstore-transaction-check", daemon=True)
        self._thread.start()

    # -- the durable record ---------------------------------------------------------------
    def _read_queue(self, topic: str, start: int) -> Iterator[MessageExt]:
        """Queue 0 of ``topic`` from ``start`` (its first kept offset at least), 64 at a time."""
        if topic not in self.store.topics():
            return
        offset = max(start, self.store.min_offset(topic, 0))
        end = self.store.max_offset(topic, 0)
        while offset < end:
            res = self.store.get_messages(topic, 0, offset, 64)
            yield from res.messages
            if res.next_offset <= offset:
                break
            offset = res.next_offset

    def _rebuild(self) -> None:
        """The open transactions from the half and op topics (see the module docstring)."""
        store = self.store
        if HALF_TOPIC not in store.topics():
            return
        store.wait_dispatched()
        progress = max(0, store.committed_offset(CHECK_GROUP, HALF_TOPIC, 0))
        removed: set[int] = set()
        for op in self._read_queue(OP_TOPIC, max(0, store.committed_offset(CHECK_GROUP, OP_TOPIC, 0))):
            halves = [q for t in op.body.decode("ascii", "replace").split(",") if (q := _int(t, -1)) >= progress]
            if op.tags == REMOVE_TAG and halves:
                removed.update(halves)
                self._ops.append((op.queue_offset, max(halves)))
            self._ops_end = op.queue_offset + 1
        done: set[str] = set()
        for half in self._read_queue(HALF_TOPIC, progress):
            mid = half.uniq_key or half.msg_id
            if half.queue_offset in removed:
                done.add(mid)
                continue
            t = self.open.setdefault(mid, Open(mid, half.properties.get(REAL_TOPIC, "")))
            t.copies[half.queue_offset] = half.phy_offset
            t.latest = half
        for mid in done:       # a copy resolved: the transaction is (its other copies get ops now)
            if mid in self.open:
                self._write_ops(self.open.pop(mid))
        if self.open:
            self._finish_interrupted()
        self._save_progress()
        if self.open:
            log.info("%d open transaction(s) found in %s", len(self.open), HALF_TOPIC)

    def _finish_interrupted(self) -> None:
        """Transactions a kill left between their final write and its op message."""
        by_copy = {phy: t for t in self.open.values() for phy in t.copies.values()}
        for m in self.store.scan(min(by_copy)):
            committed = m.sys_flag & TRAN_MASK == TRAN_COMMIT
            t = by_copy.get(m.prepared_transaction_offset) if committed else self.open.get(m.uniq_key or "")
            if t is None or t.message_id not in self.open:
                continue
            mid = t.message_id
            committed = committed and m.topic == t.topic
            if committed or m.topic == DISCARD_TOPIC:
                log.info("transaction %s was %s before a restart; finishing it", mid,
                         "committed" if committed else "discarded")
                del self.open[mid]
                if committed:
                    self._write_ops(t)

    def _write_ops(self, t: Open) -> None:
        """Op messages for every copy of ``t`` (RocketMQ's body: one half queue offset)."""
        now = int(time.time() * 1000)
        halves = sorted(t.copies)
        puts = self.store.put_batch([Message(OP_TOPIC, str(q).encode(), tags=REMOVE_TAG, born_timestamp=now,
                                             properties={UNIQ_KEY: _new_key()}) for q in halves], [0] * len(halves))
        self._ops.extend((p.queue_offset, q) for p, q in zip(puts, halves, strict=True))
        self._ops_end = puts[-1].queue_offset + 1

    def _save_progress(self) -> None:
        first = min((q for t in self.open.values() for q in t.copies), default=None)
        if first is None:
            if HALF_TOPIC not in self.store.topics():
                return
            first = self.store.max_offset(HALF_TOPIC, 0)
        self.store.commit_offset(CHECK_GROUP, HALF_TOPIC, 0, first)   # first: saved in between, the op one lags
        while self._ops and self._ops[0][1] < first:
            self._ops.popleft()
        if self._ops_end:
            self.store.commit_offset(CHECK_GROUP, OP_TOPIC, 0, self._ops[0][0] if self._ops else self._ops_end)

    # -- sends and resolutions ------------------------------------------------------------
    def put_half(self, msg: Message, queue_id: int, immunity_s: int | None) -> MessageExt:
        """Store ``msg`` (bound for ``queue_id`` of its topic) as a half message; the stored half.
        ``immunity_s``: the client's recovery delay, None when it set none (checked after ``timeout_ms``).
        A message without ``UNIQ_KEY`` gets one (its copies are found by it)."""
        msg.properties.setdefault(UNIQ_KEY, _new_key())
        msg.properties.update({REAL_TOPIC: msg.topic, REAL_QID: str(queue_id), TRAN_MSG: "true", PGROUP: msg.topic})
        if immunity_s is not None:
            msg.properties[IMMUNITY_S] = str(immunity_s)
        topic, msg.topic = msg.topic, HALF_TOPIC
        with self.lock:
            stored = self.store.get_by_offset(self.store.put(msg, 0).phy_offset)
            mid = stored.uniq_key or stored.msg_id
            t = self.open.setdefault(mid, Open(mid, topic))
            t.copies[stored.queue_offset] = stored.phy_offset
            t.latest = stored
        return stored

    def _find(self, topic: str, message_id: str, tx_id: str) -> Open:
        t = self.open.get(message_id)
        q = tx_id.partition(".")[0]
        if t is None or t.topic != topic or not q.isdecimal() or tx_id != f"{int(q)}.{t.copies.get(int(q))}":
            raise RequestError(Code.INVALID_TRANSACTION_ID, f"no open transaction {tx_id!r} of message {message_id!r} "
                               f"in topic {topic!r} (unknown, or already committed, rolled back or discarded)")
        return t

    def end(self, topic: str, message_id: str, tx_id: str, commit: bool) -> None:
        """Commit or roll back the transaction ``tx_id`` names; RequestError when none is open."""
        with self.lock:
            t = self._find(topic, message_id, tx_id)
            if commit:
                self.store.put(_final(t.latest, int(tx_id.partition(".")[2])),  # type: ignore[arg-type]
                               _int(t.latest.properties.get(REAL_QID), 0))  # type: ignore[union-attr]
            self._write_ops(t)
            del self.open[message_id]
            self._save_progress()

    # -- the check round ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.check_interval_ms / 1000):
            try:
                self.check()
            except StoreError as e:
                log.error("transaction check round failed: %s", e)

    def check(self) -> None:
        """One check round (see the module docstring)."""
        start = int(time.time() * 1000)
        with self.lock:
            for t in sorted(self.open.values(), key=lambda t: max(t.copies)):
                half = t.latest
                assert half is not None
                if half.store_timestamp >= start:
                    continue
                props = half.properties
                immunity = _int(props.get(IMMUNITY_S), -1)
                immunity_ms = self.timeout_ms if immunity < 0 else immunity * 1000
                if start - half.born_timestamp < immunity_ms:
                    continue
                times = _int(props.get(CHECK_TIMES), 0)
                if times >= self.check_max:
                    self._discard(t)
                    continue
                copy = Message(HALF_TOPIC, half.body, properties={**props, CHECK_TIMES: str(times + 1)},
                               born_timestamp=half.born_timestamp, born_host=half.born_host or None)
                put = self.store.put(copy, 0)
                t.latest = self.store.get_by_offset(put.phy_offset)
                t.copies[t.latest.queue_offset] = t.latest.phy_offset
                if not self.send_check(props.get(PGROUP, t.topic), t.latest, t.transaction_id):
                    log.warning("transaction %s of topic %s: no producer of group %s connected to check it",
                                t.message_id, t.topic, props.get(PGROUP, t.topic))
            self._save_progress()

    def _discard(self, t: Open) -> None:
        half = t.latest
        assert half is not None
        log.warning("transaction %s of topic %s checked %d times unresolved: discarded to %s", t.message_id,
                    t.topic, self.check_max, DISCARD_TOPIC)
        self.store.put(Message(DISCARD_TOPIC, half.body, properties=half.properties,
                               born_timestamp=half.born_timestamp, born_host=half.born_host or None), 0)
        del self.open[t.message_id]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _new_key() -> str:
    return uuid.uuid4().hex.upper()


def _final(half: MessageExt, phy: int) -> Message:
    """The committed message for half copy ``half`` (EndTransactionProcessor.endMessageTransaction)."""
    props = {k: v for k, v in half.properties.items() if k not in (REAL_TOPIC, REAL_QID)}
    return Message(half.properties[REAL_TOPIC], half.body, properties=props, sys_flag=TRAN_COMMIT,
                   prepared_transaction_offset=phy, born_timestamp=half.born_timestamp,
                   born_host=half.born_host or None, reconsume_times=half.reconsume_times)
