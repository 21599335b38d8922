"""MessageStore: put/get/scan, rollover, limits, topic validation, RocketMQ's message
semantics (delay, transactions), reopen, SYNC durability on disk, lock, read-only,
use-after-close, checkpoint and abort file. Files are checked with the reference codec."""
import os
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from rmqstore import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidTopicError,
    Message,
    MessageNotFoundError,
    MessageStore,
    MessageTooLargeError,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
    StoreReadOnlyError,
)

import reference_codec as ref
from conftest import SMALL_INDEX

STORE_HOST = "10.0.0.1:10911"


def _cfg(**kw):
    """Default knobs, but 1 MiB segments and no pre-faulting: 2 shared cores."""
    kw.setdefault("commitlog_file_size", 1 << 20)
    kw.setdefault("consume_queue_entries", 1000)
    kw.setdefault("warm_mapped_file", False)
    return StoreConfig(**{**SMALL_INDEX, **kw})


def _now():
    return time.time_ns() // 1_000_000


def _msgs(n, topic="TopicA", size=100):
    return [Message(topic, bytes([i % 251]) * size, tags=f"Tag{i % 3}", keys=[f"k{i}", "hot"],
                    properties={"idx": str(i)}) for i in range(n)]


def test_put_get_roundtrip(tmp_path):
    cfg = _cfg(store_host=STORE_HOST)
    t0 = _now()
    with MessageStore(tmp_path / "s", cfg) as store:
        r = store.put(Message("orders", b"payload", tags="TagA", keys=["o-1", "c-9"],
                              properties={"region": "eu"}, born_host="[fd00::7]:5000", flag=9), queue_id=2)
        assert (r.phy_offset, r.queue_id, r.queue_offset, r.topic) == (0, 2, 0, "orders")
        assert t0 <= r.store_timestamp <= _now()
        assert r.msg_id == "0A00000100002A9F" + "%016X" % 0
        m = store.get_by_offset(0)
        assert (m.topic, m.body, m.tags, m.keys, m.queue_id, m.queue_offset, m.flag) == \
            ("orders", b"payload", "TagA", ["o-1", "c-9"], 2, 0, 9)
        assert m.properties["region"] == "eu"
        assert m.born_host == "[fd00:0:0:0:0:0:0:7]:5000" and m.store_host == STORE_HOST
        assert m.sys_flag & 0x10 and not m.sys_flag & 0x20
        assert m.store_size == r.size and m.msg_id == r.msg_id
        assert store.get_by_msg_id(r.msg_id).body == b"payload"
        r2 = store.put(Message("orders", b"second"), queue_id=2)
        assert (r2.phy_offset, r2.queue_offset) == (r.size, 1)
        assert [x.body for x in store.scan()] == [b"payload", b"second"]
        assert [x.body for x in store.scan(from_offset=r.size)] == [b"second"]

        other = "0A00000200002A9F" + "%016X" % 0
        with pytest.raises(MessageNotFoundError):
            store.get_by_msg_id(other)


def test_a_subclass_overriding_put_is_called(tmp_path):
    """put, put_batch, query_by_key and get_messages are C methods on a MessageStore, but a
    subclass's own still run."""
    seen = []

    class Logged(MessageStore):
        def put(self, msg, queue_id=None):
            seen.append("put")
            return super().put(msg, queue_id)

        def put_batch(self, msgs, queue_id=None):
            seen.append("put_batch")
            return super().put_batch(msgs, queue_id)

        def query_by_key(self, topic, key, max_num=64, begin=0, end=None):
            seen.append("query_by_key")
            return super().query_by_key(topic, key, max_num, begin, end)

        def get_messages(self, topic, queue_id, offset, max_count=32, tags=None):
            seen.append("get_messages")
            return super().get_messages(topic, queue_id, offset, max_count, tags)

    with Logged(tmp_path / "s", _cfg()) as s:
        s.put(Message("T", b"one", keys="k"))
        s.put_batch([Message("T", b"two")])
        assert [bytes(m.body) for m in s.scan()] == [b"one", b"two"]
        s.wait_dispatched()
        s.query_by_key("T", "k")
        assert [bytes(m.body) for m in s.get_messages("T", 0, 0).messages] == [b"one"]
    assert seen == ["put", "put_batch", "query_by_key", "get_messages"]


def test_query_by_key_takes_keywords_and_checks_them(tmp_path):
    """query_by_key is a C method on a MessageStore: keywords, defaults and the argument
    checks are those of MessageStore.query_by_key."""
    with MessageStore(tmp_path / "s", _cfg()) as s:
        s.put_batch([Message("T", f"b{i}".encode(), keys=f"k{i % 2}") for i in range(5)])
        s.wait_dispatched()
        want = [b"b4", b"b2", b"b0"]
        assert [bytes(m.body) for m in s.query_by_key("T", "k0")] == want
        assert [bytes(m.body) for m in s.query_by_key(key="k0", topic="T", max_num=2)] == want[:2]
        assert s.query_by_key("T", "k0", end=0) == []
        with pytest.raises(InvalidArgumentTypeError):
            s.query_by_key("T", b"k0")
        with pytest.raises(InvalidArgumentTypeError):
            s.query_by_key("T", "k0", max_num="2")
        with pytest.raises(TypeError):
            s.query_by_key("T", "k0", colour=1)
    with pytest.raises(StoreClosedError):
        s.query_by_key("T", "k0")


def test_get_past_end_is_not_found(tmp_path):
    with MessageStore(tmp_path / "s", _cfg()) as store:
        r = store.put(Message("T", b"x"))
        with pytest.raises(MessageNotFoundError):
            store.get_by_offset(r.size + 1000)      # inside the segment, past the written end
        assert list(store.scan(from_offset=r.size + 1000)) == []


def test_get_beyond_segments_is_not_found(tmp_path):
    with MessageStore(tmp_path / "s", _cfg(commitlog_file_size=4096)) as store:
        r = store.put(Message("T", b"x"))
        for off in (-1, 4096, 1 << 40):
            with pytest.raises(MessageNotFoundError):
                store.get_by_offset(off)
        with pytest.raises(MessageNotFoundError):
            store.get_by_msg_id("7F00000100002A9F" + "%016X" % 4096)
        assert store.get_by_offset(r.phy_offset).body == b"x"


def test_round_robin_queues_and_put_batch(tmp_path):
    with MessageStore(tmp_path / "s", _cfg(default_queue_nums=3)) as store:
        rs = store.put_batch(_msgs(7))
        assert [r.queue_id for r in rs] == [0, 1, 2, 0, 1, 2, 0]
        assert [r.queue_offset for r in rs] == [0, 0, 0, 1, 1, 1, 2]
        assert len({r.store_timestamp for r in rs}) == 1
        offs = [r.phy_offset for r in rs]
        assert offs == sorted(offs) and all(offs[i] + rs[i].size == offs[i + 1] for i in range(6))
        assert store.put_batch([]) == []
        assert [m.properties["idx"] for m in store.scan()] == [str(i) for i in range(7)]


def test_files_parse_with_reference_decoder(tmp_path):
    cfg = _cfg(store_host="[2001:db8::1]:10911")
    with MessageStore(tmp_path / "s", cfg) as store:
        rs = store.put_batch(_msgs(20, "Topic-x"), queue_id=1)
        rs += [store.put(Message("%RETRY%g", b"", tags="标签"), queue_id=0)]
    recs = list(ref.iter_commitlog(tmp_path / "s"))
    assert [r["phy_offset"] for r in recs] == [r.phy_offset for r in rs]
    for rec, r in zip(recs, rs, strict=False):
        assert rec["store_size"] == r.size and rec["msg_id"] == r.msg_id
        assert rec["magic"] == ref.MAGIC_V1
        assert rec["store_host"] == "[2001:db8:0:0:0:0:0:1]:10911"
        assert rec["body_crc"] == ref.body_crc(rec["body"])
        assert b"\x02" not in rec["properties_raw"][-1:]    # 4.9 layout: no trailing separator
    assert recs[-1]["topic"] == "%RETRY%g" and recs[-1]["tags_code"] == ref.java_hash("标签")


def test_rollover_blank_record_bytes(tmp_path, small_config):
    root = tmp_path / "s"
    with MessageStore(root, small_config) as store:
        rs = [store.put(m, queue_id=0) for m in _msgs(40, size=300)]
    size = small_config.commitlog_file_size
    files = ref.segment_files(root / "commitlog")
    assert len(files) > 2
    assert [b for b, _ in files] == [i * size for i in range(len(files))]
    assert all(os.path.getsize(p) == size for _, p in files)
    assert all(os.path.basename(p) == "%020d" % b for b, p in files)
    by_file = {}
    for r in rs:
        by_file.setdefault(r.phy_offset // size, []).append(r)
        assert r.phy_offset // size == (r.phy_offset + r.size - 1) // size    # never spans files
    for i, (base, path) in enumerate(files[:-1]):
        last = by_file[i][-1]
        end = last.phy_offset + last.size - base
        room = size - end
        assert room < by_file[i + 1][0].size + 8        # it really did not fit
        with open(path, "rb") as f:
            data = f.read()
        assert data[end:end + 8] == struct.pack(">i", room) + bytes.fromhex("CBD43194")
        assert data[end + 8:] == bytes(room - 8)
        assert by_file[i + 1][0].phy_offset == base + size
    assert [r["phy_offset"] for r in ref.iter_commitlog(root)] == [r.phy_offset for r in rs]


def test_message_too_large(tmp_path, small_config):
    with MessageStore(tmp_path / "s", small_config.with_(max_message_size=2000)) as store:
        ok = store.put(Message("T", b"a" * 100), queue_id=0)
        with pytest.raises(MessageTooLargeError):
            store.put(Message("T", b"b" * 3000), queue_id=0)      # > max_message_size
    with MessageStore(tmp_path / "s", small_config.with_(max_message_size=1 << 20)) as store:
        with pytest.raises(MessageTooLargeError):
            store.put(Message("T", b"c" * small_config.commitlog_file_size), queue_id=0)   # > a segment
        assert store.get_by_offset(ok.phy_offset).body == b"a" * 100
        r = store.put(Message("T", b"d"), queue_id=0)
        assert [m.body for m in store.scan()] == [b"a" * 100, b"d"]
        assert r.queue_offset == 1


@pytest.mark.parametrize("topic", ["", ".", "..", "../escape", "a/b", "/abs", "a\x00b", "a\\b", "has space",
                                   "x" * 128, "é" * 64, "ü", "T\n"])   # "T\n": the broker rule matched it (re $)
def test_invalid_topic_refused(tmp_path, topic):
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as store:
        keep = store.put(Message("Good", b"kept"))
        with pytest.raises(InvalidTopicError):
            store.put(Message(topic, b"x"))
        with pytest.raises(InvalidTopicError):
            store.put_batch([Message("Good", b"y"), Message(topic, b"x")])
        store.wait_dispatched()
        assert store.get_by_offset(keep.phy_offset).body == b"kept"
        assert store.topics() == ["Good"]
    assert not (tmp_path / "escape").exists()
    assert sorted(os.listdir(root / "consumequeue")) == ["Good"]


def test_topic_length_limits(tmp_path):
    with MessageStore(tmp_path / "s", _cfg()) as store:
        r = store.put(Message("T" * 127, b"x"))           # v1 maximum
        assert store.get_by_offset(r.phy_offset).topic == "T" * 127
    with MessageStore(tmp_path / "s2", _cfg(message_version=2)) as store:
        r = store.put(Message("T" * 200, b"x"))
        m = store.get_by_offset(r.phy_offset)
        assert m.topic == "T" * 200 and m.magic == ref.MAGIC_V2
        with pytest.raises(InvalidTopicError):
            store.put(Message("T" * 256, b"x"))           # cannot be a directory name
    with MessageStore(tmp_path / "s3", _cfg(strict_topic_names=False)) as store:
        with pytest.raises(InvalidTopicError):
            store.put(Message("é" * 64, b"x"))             # 128 bytes although 64 UTF-16 chars


def test_delay_level_rewrite(tmp_path):
    cfg = _cfg()
    delays = {1: 1000, 3: 10_000, 18: 7_200_000}
    with MessageStore(tmp_path / "s", cfg) as store:
        rs = {lv: store.put(Message("orders", b"later", tags="TagA", delay_level=lv), queue_id=3)
              for lv in delays}
        over = store.put(Message("orders", b"max", delay_level=99), queue_id=1)
        plain = store.put(Message("orders", b"now", tags="TagA"), queue_id=3)
        store.wait_dispatched()
        for lv, r in rs.items():
            assert (r.topic, r.queue_id) == ("SCHEDULE_TOPIC_XXXX", lv - 1)
            m = store.get_by_offset(r.phy_offset)
            assert m.topic == "SCHEDULE_TOPIC_XXXX" and m.queue_id == lv - 1
            assert m.properties["REAL_TOPIC"] == "orders" and m.properties["REAL_QID"] == "3"
            assert m.properties["DELAY"] == str(lv)
            e = store.consume_queue_entries("SCHEDULE_TOPIC_XXXX", lv - 1)
            assert int(e[0]["phy_offset"]) == r.phy_offset and r.queue_offset == 0
            assert int(e[0]["tags_code"]) == m.store_timestamp + delays[lv]
        assert (over.topic, over.queue_id, over.queue_offset) == ("SCHEDULE_TOPIC_XXXX", 17, 1)   # clamped
        e = store.consume_queue_entries("SCHEDULE_TOPIC_XXXX", 17)
        assert int(e[1]["phy_offset"]) == over.phy_offset
        assert int(e[1]["tags_code"]) == over.store_timestamp + delays[18]
        assert plain.queue_offset == 0 and plain.topic == "orders"
        assert store.max_offset("orders", 3) == 1



@pytest.mark.parametrize("level", ["\u00b2", "\u00b2\u00b3", "", "x", "-1", None])
def test_a_delay_level_that_is_no_number_keeps_the_tags_code(level):
    """A SCHEDULE_TOPIC_XXXX record of another store whose DELAY is no number ('\u00b2'
    passes str.isdigit but not int()) is dispatched with its tags code, as RocketMQ does
    for a bad level, instead of stopping dispatch with a ValueError; digits of other
    scripts count, as Java's parseInt (and put) read them."""
    from rmqstore.dispatch import deliver_time
    assert deliver_time(level, 5_000, 7, [1000, 2000]) == 7
    assert deliver_time("1", 5_000, 7, [1000, 2000]) == deliver_time("\u0661", 5_000, 7, [1000, 2000]) == 6_000

def test_transactions_prepared_rollback_no_cq(tmp_path):
    with MessageStore(tmp_path / "s", _cfg()) as store:
        a = store.put(Message("tx", b"n0"), queue_id=0)
        p = store.put(Message("tx", b"prep", sys_flag=0x4), queue_id=0)
        rb = store.put(Message("tx", b"rollback", sys_flag=0xC, prepared_transaction_offset=p.phy_offset), queue_id=0)
        c = store.put(Message("tx", b"commit", sys_flag=0x8, prepared_transaction_offset=p.phy_offset), queue_id=0)
        b = store.put(Message("tx", b"n1"), queue_id=0)
        store.wait_dispatched()
        assert [r.queue_offset for r in (a, p, rb, c, b)] == [0, 0, 0, 1, 2]
        assert store.get_by_offset(p.phy_offset).queue_offset == 0
        assert store.get_by_offset(rb.phy_offset).prepared_transaction_offset == p.phy_offset
        e = store.consume_queue_entries("tx", 0)
        assert e["phy_offset"].tolist() == [a.phy_offset, c.phy_offset, b.phy_offset]
        assert [m.body for m in store.get_messages("tx", 0, 0).messages] == [b"n0", b"commit", b"n1"]


def test_compressed_flag_passes_through(tmp_path):
    with MessageStore(tmp_path / "s", _cfg()) as store:
        r = store.put(Message("T", b"x\x9c", sys_flag=0x1))
        assert store.get_by_offset(r.phy_offset).sys_flag & 0x1


@pytest.mark.parametrize("bits", [0x2, 0x40, 0x80, 0x100, 0x700, 1 << 30])
def test_sys_flag_bits_rmqstore_does_not_implement_are_refused(tmp_path, bits):
    """MULTI_TAGS, 5.x's NEED_UNWRAP / INNER_BATCH / compression type and unnamed bits were
    stored as given, so a 5.x broker would unwrap or split the body as a batch: every write
    path refuses them (InvalidArgumentError), storing nothing; the bits a writer takes
    (COMPRESSED, the transaction type, the IPv6 bits recomputed from the hosts) pass."""
    import pyarrow as pa
    with MessageStore(tmp_path / "s", _cfg()) as store:
        kept = store.put(Message("T", b"k", sys_flag=0x1 | 0x8 | 0x30))
        m = Message("T", b"x")
        Message.__dict__["sys_flag"].__set__(m, bits | 0x8)   # past Message's own check
        calls = [lambda: Message("T", b"x", sys_flag=bits), lambda: setattr(Message("T"), "sys_flag", bits),
                 lambda: store.put(m), lambda: store.put_batch([Message("T", b"y"), m]),
                 lambda: store.put_columns("T", [b"a", b"b"], sys_flag=[0, bits]),
                 lambda: store.put_columns("T", [b"a"], sys_flag=np.int32(bits)),
                 lambda: store.put_arrow(pa.table({"topic": ["T"], "body": [b"a"],
                                                   "sys_flag": pa.array([bits], pa.int32())}))]
        for call in calls:
            with pytest.raises(InvalidArgumentError, match="sys_flag"):
                call()
        assert [(x.body, x.sys_flag) for x in store.scan()] == [(b"k", 0x9)]
        assert kept.phy_offset == 0


def test_reopen_preserves_messages_and_queue_offsets(tmp_path, small_config):
    root = tmp_path / "s"
    with MessageStore(root, small_config) as store:
        first = [store.put(m) for m in _msgs(30, size=200)]
        first += store.put_batch(_msgs(5, "TopicB"), queue_id=2)
    with MessageStore(root, small_config) as store:
        assert store.clean_shutdown
        got = list(store.scan())
        assert [(m.phy_offset, m.topic, m.queue_id, m.queue_offset, m.body) for m in got] == \
            [(r.phy_offset, r.topic, r.queue_id, r.queue_offset, store.get_by_offset(r.phy_offset).body)
             for r in first]
        assert store.max_offset("TopicA", 1) == 8 and store.max_offset("TopicB", 2) == 5
        more = store.put(Message("TopicA", b"next"), queue_id=1)
        assert more.queue_offset == 8
        assert store.put(Message("TopicB", b"next"), queue_id=2).queue_offset == 5
        assert more.phy_offset >= first[-1].phy_offset + first[-1].size
    with MessageStore(root, small_config, read_only=True) as store:
        assert store.get_by_offset(more.phy_offset).body == b"next"
        assert store.max_offset("TopicA", 1) == 9


def test_sync_put_is_on_disk_when_it_returns(tmp_path):
    root = tmp_path / "s"
    cfg = _cfg(flush_mode="sync", commitlog_file_size=1 << 20)
    with MessageStore(root, cfg) as store:
        for i in range(5):
            body = os.urandom(64) + bytes([i])
            r = store.put(Message("sync", body), queue_id=0)
            assert store.commitlog.flushed_offset >= r.phy_offset + r.size
            with open(root / "commitlog" / ("%020d" % 0), "rb") as f:   # read(2), not the map
                f.seek(r.phy_offset)
                rec = ref.decode_record(f.read(r.size))
            assert rec["body"] == body and rec["phy_offset"] == r.phy_offset
        rs = store.put_batch([Message("sync", b"b%d" % i) for i in range(3)])
        assert store.commitlog.flushed_offset >= rs[-1].phy_offset + rs[-1].size


def test_second_writer_gets_store_locked(tmp_path):
    root = tmp_path / "s"
    code = textwrap.dedent(f"""
        import sys
        from rmqstore import MessageStore, StoreLockedError
        try:
            MessageStore({str(root)!r})
        except StoreLockedError:
            sys.exit(17)
        sys.exit(0)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with MessageStore(root, _cfg()) as store:
        store.put(Message("T", b"x"))
        p = subprocess.run([sys.executable, "-c", code], env=env, timeout=120)
        assert p.returncode == 17
        # readers in other processes are fine
        ro = subprocess.run([sys.executable, "-c", f"from rmqstore import MessageStore; "
                             f"s = MessageStore({str(root)!r}, read_only=True); s.close()"], env=env, timeout=120)
        assert ro.returncode == 0
    p = subprocess.run([sys.executable, "-c", code], env=env, timeout=120)
    assert p.returncode == 0


BROKER_LOCK = """
import java.io.RandomAccessFile;
import java.nio.channels.FileLock;
public class BrokerLock {   // the lock a RocketMQ broker takes in DefaultMessageStore.start()
    public static void main(String[] a) throws Exception {
        RandomAccessFile f = new RandomAccessFile(a[0], "rw");
        FileLock lock = f.getChannel().tryLock(0, 1, false);
        System.out.println(lock == null ? "busy" : "locked");
        System.out.flush();
        System.in.read();   // held until the test closes our stdin
    }
}
"""


def test_a_rocketmq_broker_and_a_writer_lock_each_other_out(tmp_path):
    """A broker locks byte 0 of ``store/lock`` with FileChannel.tryLock, a POSIX record
    lock that a flock does not see: a writer opened beside a running broker and ran
    recovery under it, and a broker started beside a writer. Now each refuses the other,
    and a read-only open still works beside a broker. (A real JVM takes the lock.)"""
    import shutil
    if shutil.which("javac") is None:
        pytest.skip("needs a JDK (javac): the broker's lock is taken by Java's own FileChannel")
    (tmp_path / "BrokerLock.java").write_text(BROKER_LOCK)
    subprocess.run(["javac", "BrokerLock.java"], cwd=tmp_path, check=True, timeout=120)
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as store:
        store.put(Message("T", b"x"))

    def broker():
        p = subprocess.Popen(["java", "-cp", str(tmp_path), "BrokerLock", str(root / "lock")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        return p, p.stdout.readline().strip()

    p, said = broker()
    try:
        assert said == "locked"
        with pytest.raises(StoreLockedError, match="RocketMQ broker"):
            MessageStore(root, _cfg())
        with MessageStore(root, _cfg(), read_only=True) as ro:
            assert ro.get_by_offset(0).body == b"x"
    finally:
        p.communicate("", timeout=60)
    with MessageStore(root, _cfg()) as store:
        p, said = broker()
        p.communicate("", timeout=60)
        assert said == "busy"
        with pytest.raises(StoreLockedError):       # and a second writer in this process
            MessageStore(root, _cfg())
        assert store.put(Message("T", b"y")).phy_offset > 0    # whose failed open let no lock go
        p, said = broker()
        p.communicate("", timeout=60)
        assert said == "busy"


def test_read_only_refuses_writes(tmp_path):
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as store:
        store.put(Message("T", b"x"))
    with MessageStore(root, read_only=True) as store:
        with pytest.raises(StoreReadOnlyError):
            store.put(Message("T", b"y"))
        with pytest.raises(StoreReadOnlyError):
            store.put_batch([Message("T", b"y")])
        with pytest.raises(StoreReadOnlyError):
            store.commit_offset("g", "T", 0, 1)
        assert [m.body for m in store.scan()] == [b"x"]
    with pytest.raises(FileNotFoundError):
        MessageStore(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()


def test_use_after_close(tmp_path):
    store = MessageStore(tmp_path / "s", _cfg())
    r = store.put(Message("T", b"x"))
    it = store.scan()
    store.close()
    store.close()                      # idempotent
    assert store.closed
    for call in (lambda: store.put(Message("T", b"y")), lambda: store.put_batch([Message("T", b"y")]),
                 lambda: store.get_by_offset(r.phy_offset), lambda: store.get_by_msg_id(r.msg_id),
                 lambda: list(store.scan()), lambda: store.get_messages("T", 0, 0),
                 lambda: store.flush(), lambda: store.wait_dispatched(), lambda: store.offset_by_time("T", 0, 0),
                 lambda: store.consume_queue_entries("T", 0), lambda: store.commit_offset("g", "T", 0, 1)):
        with pytest.raises(StoreClosedError):
            call()
    with pytest.raises(StoreClosedError):
        next(it)


# plausible arguments, by parameter name, for any public MessageStore method
_ARGS = {"msg": Message("T", b"y"), "msgs": [Message("T", b"y")], "queue_id": 0, "phy_offset": 0,
         "msg_id": "0A0000010000270F0000000000000000", "topic": "T", "offset": 0, "group": "g", "key": "k",
         "keys": ["k"], "uniq_key": "u", "timestamp": 0, "bodies": [b"y"], "data": None}


@pytest.mark.parametrize("read_only", [False, True])
def test_every_public_method_refuses_a_closed_store(tmp_path, read_only):
    """Swept by introspection, so a method added later is covered: after close() every
    public method and property raises StoreClosedError instead of answering stale values."""
    import inspect
    with MessageStore(tmp_path / "s", _cfg()) as s:
        s.put(Message("T", b"x"))
    store = MessageStore(tmp_path / "s", _cfg(), read_only=read_only)
    store.close()
    swept = []
    for name, attr in inspect.getmembers(MessageStore):
        if name.startswith("_") or name in ("close", "closed"):
            continue
        if isinstance(attr, property):
            call = lambda name=name: getattr(store, name)   # noqa: E731
        else:
            params = list(inspect.signature(attr).parameters.values())[1:]
            args = [_ARGS[p.name] for p in params if p.default is inspect.Parameter.empty]
            call = lambda attr=attr, args=args: attr(store, *args)   # noqa: E731
        with pytest.raises(StoreClosedError):
            call()
        swept.append(name)
    with pytest.raises(StoreClosedError):
        store.__enter__()
    assert {"topics", "max_offset", "dispatch_lag", "max_phy_offset", "committed_offset", "put",
            "get_messages", "verify", "rebuild", "clean_expired", "query_by_key"} <= set(swept)


def test_a_dispatch_bug_surfaces_as_itself(tmp_path):
    """A consumer's exception stops dispatch and is what wait_dispatched raises (not a
    CorruptRecordError built from its text)."""
    bug = RuntimeError("consumer bug")

    def broken(batch):
        raise bug

    with MessageStore(tmp_path / "s", _cfg()) as store:
        store.dispatcher.add(broken)
        store.put(Message("T", b"x"))
        with pytest.raises(RuntimeError) as caught:
            store.wait_dispatched()
        assert caught.value is bug and store.dispatcher.error is bug


def test_checkpoint_and_abort_file(tmp_path):
    root = tmp_path / "s"
    t0 = _now()
    store = MessageStore(root, _cfg())
    try:
        assert (root / "abort").exists()
        assert (root / "lock").exists()
        rs = [store.put(Message("T", b"x%d" % i)) for i in range(10)]
    finally:
        store.close()
    t1 = _now()
    assert not (root / "abort").exists()
    data = (root / "checkpoint").read_bytes()
    assert len(data) == 4096
    phys, logics, index = struct.unpack_from(">qqq", data, 0)
    assert data[40:] == bytes(4096 - 40)
    last_ts = max(r.store_timestamp for r in rs)
    assert phys == last_ts and t0 <= phys <= t1
    assert logics == last_ts
    assert index == 0 or t0 <= index <= t1
    with MessageStore(root, _cfg()) as store:
        assert store.clean_shutdown


def test_unclean_shutdown_is_detected(tmp_path):
    root = tmp_path / "s"
    with MessageStore(root, _cfg()) as store:
        store.put(Message("T", b"x"))
    (root / "abort").write_bytes(b"")
    with MessageStore(root, _cfg()) as store:
        assert not store.clean_shutdown
        assert [m.body for m in store.scan()] == [b"x"]


def test_bad_message_input_is_refused_and_nothing_lost(tmp_path):
    from rmqstore import InvalidArgumentError
    with MessageStore(tmp_path / "s", _cfg()) as store:
        ok = store.put(Message("T", bytearray(b"from a bytearray"), properties={"k": "v"}), queue_id=0)
        mv = store.put(Message("T", memoryview(b"--view--")[2:6]), queue_id=0)
        for props in ({"a\x01b": "v"}, {"k": "v\x02w"}, {"": "v"}, {"k": 5}):
            with pytest.raises(InvalidArgumentError):
                store.put(Message("T", b"x", properties=props), queue_id=0)
        with pytest.raises(InvalidArgumentError):
            store.put(Message("T", b"x"), queue_id=-1)
        with pytest.raises(InvalidArgumentError):
            Message("T", b"x", born_host="not-a-host")
        with pytest.raises(InvalidArgumentError):
            store.put(Message("T", b"x", properties={"DELAY": "soon"}), queue_id=0)
        nxt = store.put(Message("T", b"after"), queue_id=0)
        assert nxt.queue_offset == 2 and nxt.phy_offset == mv.phy_offset + mv.size
        assert [m.body for m in store.scan()] == [b"from a bytearray", b"view", b"after"]
        assert store.get_by_offset(ok.phy_offset).properties == {"k": "v"}


def test_next_queue_offsets_hold_any_value(tmp_path):
    """Whatever next offset recovery sets is kept and used, negative ones too (-1 on a
    queue above 1023 was taken for an error with none set: SIGSEGV; -5 below it came back
    as 0). Run in a child process: a crash fails the test, not the run."""
    code = textwrap.dedent("""
        import sys
        from rmqstore import Message, MessageStore, StoreConfig
        with MessageStore(sys.argv[1], StoreConfig(warm_mapped_file=False)) as s:
            table = {("T", 2000): -1, ("T", 5): -5, ("T", 6): 0}
            s.commitlog.queue_offsets = table
            assert s.commitlog.queue_offsets == table, s.commitlog.queue_offsets
            got = [s.put(Message("T", b"x"), queue_id=q).queue_offset for q in (2000, 5, 6)]
            assert got == [-1, -5, 0], got
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.returncode, p.stdout, p.stderr[-2000:])


def test_next_queue_offsets_hold_any_queue_id(tmp_path):
    """The appender's next offset per queue (ids 0..1023 kept in a C array, others in a
    dict) takes back what recovery gives it, for any id a consume-queue directory or a
    corrupt record may name (negative ones wrote outside the array: SIGABRT), and puts
    continue from there."""
    with MessageStore(tmp_path / "s", _cfg()) as s:
        table = {("T", 0): 5, ("T", 7): 0, ("T", 1023): 2, ("T", 1024): 9, ("T", -3): 4, ("U", (1 << 31) - 1): 1,
                 ("U", -(1 << 40)): 6}
        s.commitlog.queue_offsets = table
        assert s.commitlog.queue_offsets == table
        got = [s.put(Message(t, b"x"), queue_id=q).queue_offset for t, q in (("T", 0), ("T", 7), ("T", 1024),
                                                                             ("U", (1 << 31) - 1), ("T", 3))]
        assert got == [5, 0, 9, 1, 0]
        s.commitlog.queue_offsets = {("T", 7): 3}
        assert s.commitlog.queue_offsets == {("T", 7): 3}
