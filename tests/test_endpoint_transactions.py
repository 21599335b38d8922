"""Transactional messages through the official client (begin_transaction, send(msg, tx),
commit / rollback, a TransactionChecker), stored as RocketMQ's broker stores them (half
topic, op topic), and resolved exactly once across a SIGKILL of the server."""
import os
import signal
import threading
import time

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq")

from rocketmq import Producer, TransactionChecker  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2, service_pb2  # noqa: E402
from test_endpoint_crash import _start  # noqa: E402

from rmqstore import Message, MessageStore, StoreConfig  # noqa: E402
from rmqstore.endpoint.transactions import Transactions, _final, transaction_id  # noqa: E402

from endpoint_client import client_config, consumer, endpoint_config, message, receive_all, running, stub  # noqa: E402

Code = definition_pb2.Code
Resolution = definition_pb2.TransactionResolution
HALF, OP, DISCARD = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"


class Checker(TransactionChecker):
    """Answers from ``decide(body)``; records what it was asked."""

    def __init__(self, decide):
        self.decide = decide
        self.asked = []
        self.lock = threading.Lock()

    def check(self, msg):
        with self.lock:
            self.asked.append(bytes(msg.body))
        return self.decide(bytes(msg.body))


def _producer(addr, checker, topic="Tx"):
    p = Producer(client_config(addr), (topic,), checker)
    p.startup()
    return p


def _send(p, body, topic="Tx"):
    tx = p.begin_transaction()
    receipt = p.send(message(topic, body, keys=(body.decode(),)), tx)
    return tx, receipt


def _wait(cond, limit_s=60):
    """Wait for ``cond()`` (a guard against a hang, not a timing assertion)."""
    end = time.monotonic() + limit_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.05)
    return cond()


def _bodies(store, topic):
    return sorted(m.body for m in store.scan() if m.topic == topic)


def test_commit_once_rollback_never_stored_as_rocketmq_stores_them(tmp_path):
    checker = Checker(lambda body: Resolution.ROLLBACK)
    with running(tmp_path / "s") as (store, _ep, addr):
        p = _producer(addr, checker)
        try:
            tx, committed = _send(p, b"commit")
            tx.commit()
            tx, rolled = _send(p, b"rollback")
            tx.rollback()
        finally:
            p.shutdown()
        with consumer(addr, "G", "Tx") as c:
            got = receive_all(c, 1, limit_s=10)
            c.await_duration = 2
            assert c.receive(32, 30) == []
        assert [m.body for m in got] == [b"commit"]
        assert got[0].message_id == committed.message_id
        assert got[0].message_type == definition_pb2.MessageType.TRANSACTION
        assert got[0].properties == {}                        # no RocketMQ-internal property shown as the user's
        store.wait_dispatched(10)
        halves = store.get_messages(HALF, 0, 0, 10).messages
        assert [h.body for h in halves] == [b"commit", b"rollback"]
        for h, receipt in zip(halves, (committed, rolled), strict=True):
            assert h.uniq_key == receipt.message_id
            assert h.properties["REAL_TOPIC"] == "Tx" and h.properties["TRAN_MSG"] == "true"
            assert h.properties["PGROUP"] == "Tx"
            assert int(h.properties["REAL_QID"]) in range(store.config.default_queue_nums)
            assert h.sys_flag & 0xC == 0                      # the broker resets PREPARED: the half queue is readable
        ops = store.get_messages(OP, 0, 0, 10).messages
        assert sorted((o.tags, o.body) for o in ops) == [("d", b"0"), ("d", b"1")]
        final = [m for m in store.scan() if m.topic == "Tx"]
        assert len(final) == 1 and final[0].sys_flag & 0xC == 0x8            # TRANSACTION_COMMIT_TYPE
        assert final[0].prepared_transaction_offset == halves[0].phy_offset
        assert final[0].queue_id == int(halves[0].properties["REAL_QID"])
        assert "REAL_TOPIC" not in final[0].properties and final[0].properties["TRAN_MSG"] == "true"
        assert checker.asked == []                            # resolved by the client: never checked


def test_an_orphan_is_resolved_by_the_checker(tmp_path):
    """A half the client never ends is checked over the telemetry stream: the checker's
    COMMIT delivers it once, its ROLLBACK never; each check put back a copy with
    TRANSACTION_CHECK_TIMES counted."""
    checker = Checker(lambda body: Resolution.COMMIT if body == b"yes" else Resolution.ROLLBACK)
    with running(tmp_path / "s", transaction_check_interval_ms=200, transaction_timeout_ms=0) as (store, ep, addr):
        p = _producer(addr, checker)
        try:
            _send(p, b"yes")
            _send(p, b"no")
            assert _wait(lambda: not ep.transactions.open)
        finally:
            p.shutdown()
        assert sorted(checker.asked) == [b"no", b"yes"]
        with consumer(addr, "G", "Tx") as c:
            got = receive_all(c, 1, limit_s=10)
            c.await_duration = 2
            assert c.receive(32, 30) == []
        assert [m.body for m in got] == [b"yes"]
        store.wait_dispatched(10)
        copies = [h for h in store.get_messages(HALF, 0, 0, 10).messages if "TRANSACTION_CHECK_TIMES" in h.properties]
        assert sorted((h.body, h.properties["TRANSACTION_CHECK_TIMES"]) for h in copies) == [(b"no", "1"),
                                                                                            (b"yes", "1")]
        assert store.committed_offset("CID_RMQ_SYS_TRANS", HALF, 0) == store.max_offset(HALF, 0)


def _raw_half(s, body, recovery_s=None):
    """A transactional send over the raw stub, with an orphaned-transaction recovery delay
    when ``recovery_s`` is given (the official client sets none)."""
    req = service_pb2.SendMessageRequest()
    m = req.messages.add()
    m.topic.name, m.body = "Tx", body
    m.system_properties.message_id = "01RAW" + body.decode()
    m.system_properties.message_type = definition_pb2.MessageType.TRANSACTION
    if recovery_s is not None:
        m.system_properties.orphaned_transaction_recovery_duration.seconds = recovery_s
    res = s.SendMessage(req, timeout=10)
    assert res.status.code == Code.OK


def test_a_half_is_not_checked_before_the_transaction_timeout(tmp_path):
    """A client that sets no recovery delay (the official one): its half carries no
    CHECK_IMMUNITY_TIME_IN_SECONDS, so it is immune for transaction_timeout_ms, not checked
    at the first round while its producer may still run the local transaction. A client
    delay, also 0, is written and used as RocketMQ 5.3's proxy and broker use it."""
    checker = Checker(lambda body: Resolution.ROLLBACK)
    with running(tmp_path / "s", transaction_check_interval_ms=50, transaction_timeout_ms=3_600_000) as (store, ep,
                                                                                                        addr):
        p = _producer(addr, checker)
        try:
            _send(p, b"local")
            channel, s = stub(addr)
            with channel:
                _raw_half(s, b"unset")
                _raw_half(s, b"hour", 3600)
                _raw_half(s, b"zero", 0)
            assert _wait(lambda: len(ep.transactions.open) == 3)     # the zero-delay one checked and rolled back
            for _ in range(3):
                ep.transactions.check()                              # rounds run now: still immune
        finally:
            p.shutdown()
        assert checker.asked == [b"zero"]
        store.wait_dispatched(10)
        props = {h.body: h.properties for h in store.get_messages(HALF, 0, 0, 10).messages
                 if "TRANSACTION_CHECK_TIMES" not in h.properties}
        assert {b: pr.get("CHECK_IMMUNITY_TIME_IN_SECONDS") for b, pr in props.items()} == {
            b"local": None, b"unset": None, b"hour": "3600", b"zero": "0"}


def test_a_half_is_checked_once_its_transaction_timeout_passed(tmp_path):
    """The same half without a client delay, a timeout of 300 ms: checked once it is older."""
    checker = Checker(lambda body: Resolution.COMMIT)
    with running(tmp_path / "s", transaction_check_interval_ms=100, transaction_timeout_ms=300) as (store, ep, addr):
        p = _producer(addr, checker)
        try:
            _send(p, b"late")
            assert _wait(lambda: not ep.transactions.open)
        finally:
            p.shutdown()
        assert checker.asked == [b"late"]
        store.wait_dispatched(10)
        halves = store.get_messages(HALF, 0, 0, 10).messages
        assert halves[-1].store_timestamp - halves[0].born_timestamp >= 300   # the copy put back after the timeout
        assert _bodies(store, "Tx") == [b"late"]


def test_unresolved_after_the_check_max_is_discarded(tmp_path):
    """A checker that never answers COMMIT or ROLLBACK: after transaction_check_max checks
    the half goes to TRANS_CHECK_MAX_TIME_TOPIC and is never delivered."""
    checker = Checker(lambda body: Resolution.TRANSACTION_RESOLUTION_UNSPECIFIED)
    with running(tmp_path / "s", transaction_check_interval_ms=200, transaction_timeout_ms=0,
                 transaction_check_max=2) as (store, ep, addr):
        p = _producer(addr, checker)
        try:
            _send(p, b"undecided")
            assert _wait(lambda: not ep.transactions.open)
        finally:
            p.shutdown()
        assert checker.asked == [b"undecided"] * 2
        assert _bodies(store, DISCARD) == [b"undecided"] and _bodies(store, "Tx") == []


def test_forged_and_repeated_ends_are_refused(tmp_path):
    with running(tmp_path / "s") as (store, ep, addr):
        p = _producer(addr, Checker(lambda body: Resolution.ROLLBACK))
        try:
            tx, receipt = _send(p, b"once")
        finally:
            p.shutdown()
        channel, s = stub(addr)
        with channel:
            def end(tid, mid=receipt.message_id, topic="Tx", resolution=Resolution.COMMIT):
                req = service_pb2.EndTransactionRequest(message_id=mid, transaction_id=tid, resolution=resolution)
                req.topic.name = topic
                return s.EndTransaction(req, timeout=10).status.code
            tid = receipt.transaction_id
            for forged in ("", "x", "0.1", tid + "0", "1." + tid.split(".")[1]):
                assert end(forged) == Code.INVALID_TRANSACTION_ID
            assert end(tid, mid="other") == Code.INVALID_TRANSACTION_ID
            assert end(tid, topic="Other") == Code.INVALID_TRANSACTION_ID
            assert end(tid, resolution=Resolution.TRANSACTION_RESOLUTION_UNSPECIFIED) == Code.BAD_REQUEST
            assert end(tid) == Code.OK
            assert end(tid) == end(tid, resolution=Resolution.ROLLBACK) == Code.INVALID_TRANSACTION_ID
        assert _bodies(store, "Tx") == [b"once"]


def test_a_commit_cut_before_its_op_message_is_finished_at_start(tmp_path):
    """A kill between writing the committed message and its op message: at the next start
    the commit is found in the commitlog and the op written; the message is not checked
    (a checker's COMMIT would have delivered it twice)."""
    cfg = endpoint_config()
    asked = []
    with MessageStore(tmp_path / "s", cfg) as store:
        tx = Transactions(store, lambda *a: asked.append(a) or True, 60_000)
        half = tx.put_half(Message("Tx", b"cut", properties={"UNIQ_KEY": "ID1"}), 0, 0)
        tx.put_half(Message("Tx", b"open", properties={"UNIQ_KEY": "ID2"}), 1, 0)
        store.put(_final(half, half.phy_offset), 0)          # the kill comes before the op message
        tx.close()
    with MessageStore(tmp_path / "s", cfg) as store:
        tx = Transactions(store, lambda *a: asked.append(a) or True, 60_000, 0)
        assert set(tx.open) == {"ID2"}
        store.wait_dispatched(10)
        assert [o.body for o in store.get_messages(OP, 0, 0, 10).messages] == [str(half.queue_offset).encode()]
        tx.check()
        assert [a[1].body for a in asked] == [b"open"]
        tx.close()
        assert _bodies(store, "Tx") == [b"cut"]


def _restarted(path, read):
    """A store reopened at ``path`` whose queue reads are recorded in ``read`` (topic, offset)."""
    store = MessageStore(path, endpoint_config())
    get = store.get_messages
    store.get_messages = lambda topic, q, offset, n: read.append((topic, offset)) or get(topic, q, offset, n)
    return store


def test_a_restart_reads_only_the_ops_past_their_progress(tmp_path):
    """The op queue's progress (CID_RMQ_SYS_TRANS's offset of it, as RocketMQ keeps it) stays
    at the first op naming a half at or past the check progress: ops of halves behind an open
    one are read again at a start (still needed), ops all of whose halves are behind the
    progress are not."""
    path, cid = tmp_path / "s", "CID_RMQ_SYS_TRANS"
    with MessageStore(path, endpoint_config()) as store:
        tx = Transactions(store, lambda *a: True, 60_000)
        halves = [tx.put_half(Message("Tx", b"m%d" % i, properties={"UNIQ_KEY": f"ID{i}"}), 0, None)
                  for i in range(5)]
        for h in halves[1:4]:                                   # op offsets 0, 1, 2 name halves 1, 2, 3
            tx.end("Tx", h.uniq_key, transaction_id(h), False)
        assert store.committed_offset(cid, HALF, 0) == 0 and store.committed_offset(cid, OP, 0) == 0
        tx.close()
    read = []
    with _restarted(path, read) as store:
        tx = Transactions(store, lambda *a: True, 60_000)
        assert set(tx.open) == {"ID0", "ID4"}
        assert [o for t, o in read if t == OP] == [0]           # the three ops, one read from their progress
        tx.end("Tx", "ID0", transaction_id(halves[0]), True)     # op 3: every op now names a half below 4
        assert store.committed_offset(cid, HALF, 0) == 4 and store.committed_offset(cid, OP, 0) == 4
        tx.close()
    read.clear()
    with _restarted(path, read) as store:
        tx = Transactions(store, lambda *a: True, 60_000)
        assert set(tx.open) == {"ID4"}
        assert [t for t, o in read if t == OP] == []            # no op read again
        tx.end("Tx", "ID4", transaction_id(halves[4]), False)
        store.wait_dispatched(10)
        assert store.committed_offset(cid, OP, 0) == store.max_offset(OP, 0) == 5
        tx.close()
        assert _bodies(store, "Tx") == [b"m0"]


def test_a_half_without_uniq_key_is_finished_after_a_cut_commit(tmp_path):
    """put_half gives a message without UNIQ_KEY one; a half stored without one (keyed by its
    msgId) whose commit was cut before its op message is found by the commit's
    PREPAREDTRANSACTIONOFFSET at the next start, and finished once."""
    path = tmp_path / "s"
    with MessageStore(path, endpoint_config()) as store:
        tx = Transactions(store, lambda *a: True, 60_000)
        keyed = tx.put_half(Message("Tx", b"given"), 0, None)
        assert keyed.uniq_key and set(tx.open) == {keyed.uniq_key}
        put = store.put(Message(HALF, b"keyless", properties={"REAL_TOPIC": "Tx", "REAL_QID": "1", "TRAN_MSG": "true",
                                                              "PGROUP": "Tx"}), 0)
        keyless = store.get_by_offset(put.phy_offset)
        assert not keyless.uniq_key
        store.put(_final(keyless, keyless.phy_offset), 1)      # the kill comes before its op message
        tx.close()
    with MessageStore(path, endpoint_config()) as store:
        tx = Transactions(store, lambda *a: True, 60_000)
        assert set(tx.open) == {keyed.uniq_key}
        store.wait_dispatched(10)
        assert [o.body for o in store.get_messages(OP, 0, 0, 10).messages] == [str(keyless.queue_offset).encode()]
        tx.close()
        assert _bodies(store, "Tx") == [b"keyless"]


def test_sigkill_between_half_and_resolution(tmp_path):
    """Halves committed, rolled back and left open, then SIGKILL of ``rmqstore serve``:
    after a restart each ends in exactly one outcome: committed ones delivered once, rolled
    back ones never, open ones resolved by the checker (once)."""
    store, log = tmp_path / "store", tmp_path / "serve.log"
    log.write_text("=== start\n")
    opts = ["--transaction-check-interval", "300", "--transaction-timeout", "0"]
    proc, addr = _start(store, log, opts)
    try:
        p = _producer(addr, Checker(lambda body: Resolution.TRANSACTION_RESOLUTION_UNSPECIFIED))
        try:
            # checks run meanwhile and this checker answers nothing: ends race with them
            for i in range(10):
                tx, _ = _send(p, b"c%d" % i)
                tx.commit()
                tx, _ = _send(p, b"r%d" % i)
                tx.rollback()
                _send(p, b"o%d" % i)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            p.shutdown()
    finally:
        proc.kill()
    with open(log, "a") as f:
        f.write("=== start\n")
    checker = Checker(lambda body: Resolution.COMMIT if int(body[1:]) % 2 else Resolution.ROLLBACK)
    proc, addr = _start(store, log, opts)
    try:
        p = _producer(addr, checker)
        try:
            with consumer(addr, "G", "Tx") as c:
                got = receive_all(c, 15, limit_s=30)
                c.await_duration = 3
                assert c.receive(32, 30) == []
        finally:
            p.shutdown()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    bodies = sorted(m.body for m in got)
    assert bodies == sorted([b"c%d" % i for i in range(10)] + [b"o%d" % i for i in range(1, 10, 2)])
    assert sorted(set(checker.asked)) == sorted(b"o%d" % i for i in range(10))
    cfg = StoreConfig(commitlog_file_size=1 << 20, index_slots=1024, index_entries=8192)
    with MessageStore(store, cfg, read_only=True) as s:
        assert s.verify().ok
        assert sorted(m.body for m in s.scan() if m.topic == "Tx") == bodies     # stored once each


def test_an_orphan_of_a_producer_gone_is_resolved_by_another(tmp_path):
    """The producer that sent the half shuts down without ending it: the checks go to the
    producers of the topic still connected (none for a while: the check is counted and
    nothing is sent to the gone one), and a producer started later resolves it, once."""
    silent = Checker(lambda body: Resolution.TRANSACTION_RESOLUTION_UNSPECIFIED)
    later = Checker(lambda body: Resolution.COMMIT)
    with running(tmp_path / "s", transaction_check_interval_ms=200, transaction_timeout_ms=0) as (store, ep, addr):
        p = _producer(addr, silent)
        try:
            _send(p, b"left")
        finally:
            p.shutdown()
        asked_before = len(silent.asked)
        assert _wait(lambda: "TRANSACTION_CHECK_TIMES" in ep.transactions.open[next(iter(ep.transactions.open))]
                     .latest.properties and not ep.service._producers)
        p = _producer(addr, later)
        try:
            assert _wait(lambda: not ep.transactions.open)
        finally:
            p.shutdown()
        assert len(silent.asked) == asked_before and later.asked[:1] == [b"left"]
        with consumer(addr, "G", "Tx") as c:
            got = receive_all(c, 1, limit_s=10)
            c.await_duration = 2
            assert c.receive(32, 30) == []
        assert [m.body for m in got] == [b"left"]
