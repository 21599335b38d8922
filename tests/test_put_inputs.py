"""The put path under hostile input: wrong argument types never crash the process and raise
InvalidArgumentError; a body changed by another thread while it is written never gives a
record whose CRC disagrees with its bytes; a batch with one bad message stores none of it.
Anything that could crash runs in a child process, so a crash fails the test, not the run."""
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidTopicError,
    Message,
    MessageStore,
    MessageTooLargeError,
    StoreConfig,
    StoreError,
)

import reference_codec as ref
from conftest import SMALL_INDEX


def _cfg(**kw):
    return StoreConfig(**{**dict(commitlog_file_size=1 << 16, consume_queue_entries=100, warm_mapped_file=False),
                          **SMALL_INDEX, **kw})


CHILD = textwrap.dedent("""
    import sys
    from rmqstore import InvalidArgumentError, Message, MessageStore, StoreConfig
    cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, warm_mapped_file=False,
                      index_slots=1000, index_entries=4000)
    with MessageStore(sys.argv[1], cfg) as s:
        good = s.put(Message("T", b"kept"))
        calls = [lambda: s.put(None), lambda: s.put("str"), lambda: s.put(b"x"), lambda: s.put_batch(None),
                 lambda: s.put_batch([Message("T", b"a"), None]), lambda: s.put_batch("abc"),
                 lambda: s.put(Message("T", b"a"), queue_id="1"), lambda: s.put(Message("T", b"a"), queue_id=1.5),
                 lambda: s.put(Message("T", b"a"), queue_id=True), lambda: s.put(Message("T", b"a"), queue_id=-1),
                 lambda: s.put(Message("T", b"a"), queue_id=1 << 40)]
        for i, call in enumerate(calls):
            try:
                call()
            except InvalidArgumentError:
                continue
            print("no error from call", i)
            sys.exit(1)
        m = Message("T", b"x")
        for attr, value in (("topic", None), ("body", "text"), ("body", 7), ("properties", None),
                            ("body", memoryview(b"strided")[::2]),
                            ("body", __import__("numpy").zeros((4, 4), "u1")[:, 1])):
            old = getattr(m, attr)
            try:     # refused when set, or else when put
                setattr(m, attr, value)
                s.put(m)
            except InvalidArgumentError:
                pass
            else:
                print("no error with", attr, value)
                sys.exit(1)
            setattr(m, attr, old)
        assert bytes(s.get_by_offset(good.phy_offset).body) == b"kept"
        assert s.max_phy_offset == good.phy_offset + good.size     # nothing else was written
    print("ok")
""")


@pytest.mark.parametrize("uniq", [False, True])
def test_wrong_types_never_crash(tmp_path, uniq):
    child = CHILD.replace("index_entries=4000", f"index_entries=4000, generate_uniq_key={uniq}")
    p = subprocess.run([sys.executable, "-c", child, str(tmp_path / "s")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.returncode, p.stdout, p.stderr[-2000:])


def test_built_directly_objects_are_safe():
    """They describe stored records, so only the store makes them: built directly (which once
    read through a NULL host) they are refused."""
    from rmqstore import MessageExt, PutResult
    for cls in (PutResult, MessageExt):
        with pytest.raises(InvalidArgumentTypeError):
            cls()
        with pytest.raises(InvalidArgumentTypeError):
            cls(1, b"x", topic="T")


@pytest.mark.parametrize("args,kwargs", [((), {}), ((), {"body": b"x"}), (("T",), {"bogus": 1}),
                                         (("T", b"x", None, None, None, 5), {}), (("T",), {"topic": "U"})],
                         ids=["none", "no-topic", "unknown-keyword", "too-many", "topic-twice"])
def test_a_message_call_that_does_not_fit_is_an_invalid_argument(args, kwargs):
    """Message() with no topic, an unknown keyword or too many arguments raised Python's bare
    TypeError (its argument parsing), outside the StoreError hierarchy every other call of
    the API keeps to. It is an InvalidArgumentTypeError naming the call, still a TypeError."""
    with pytest.raises(InvalidArgumentTypeError, match=r"^Message\(\): ") as e:
        Message(*args, **kwargs)
    assert isinstance(e.value, StoreError) and isinstance(e.value, TypeError)


SCALAR = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(-(1 << 70), 1 << 70),
                   st.text(max_size=5), st.binary(max_size=5))
ARG = st.one_of(SCALAR, st.lists(SCALAR, max_size=3), st.dictionaries(st.text(max_size=3), SCALAR, max_size=2))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topic=ARG, body=ARG, tags=ARG, keys=ARG, props=ARG, flag=ARG, delay=ARG)
def test_message_arguments_are_checked(topic, body, tags, keys, props, flag, delay):
    """Message(...) either builds a message whose fields have the documented types, or raises
    InvalidArgumentError (TypeError-flavoured for a wrong type): never anything else."""
    try:
        m = Message(topic, body, tags=tags, keys=keys, properties=props, flag=flag, delay_level=delay)
    except InvalidArgumentError as e:
        assert isinstance(e, (TypeError, ValueError))
        return
    assert isinstance(m.topic, str) and isinstance(m.properties, dict)
    memoryview(m.body)
    for k, v in m.properties.items():
        assert isinstance(k, str) and (v is None or isinstance(v, str))
        k.encode()
        if v is not None:
            v.encode()


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb"])
def test_surrogates_are_invalid_arguments(text):
    for kw in (dict(tags=text), dict(keys=[text]), dict(keys=text), dict(properties={"p": text}),
               dict(properties={text: "v"})):
        with pytest.raises(InvalidArgumentError):
            Message("T", b"x", **kw)
    with pytest.raises(InvalidArgumentTypeError):
        Message("T", "a str body")


def test_body_changed_during_put_keeps_crc_and_every_ack(tmp_path):
    """A bytearray body that another thread rewrites while puts run: every stored record's CRC
    matches its stored bytes, and after close and reopen every acknowledged put is there."""
    body = bytearray(200_000)
    stop = threading.Event()

    def scribble():
        i = 0
        while not stop.is_set():
            body[i % len(body)] = (body[i % len(body)] + 1) & 0xFF
            i += 4099

    t = threading.Thread(target=scribble)
    t.start()
    acked = []
    try:
        with MessageStore(tmp_path / "s", _cfg(commitlog_file_size=1 << 20, flush_mode="sync")) as s:
            for _ in range(60):
                acked.append(s.put(Message("T", body)))
    finally:
        stop.set()
        t.join()
    with MessageStore(tmp_path / "s", _cfg(commitlog_file_size=1 << 20)) as s:
        got = {m.phy_offset: m for m in s.scan(check_crc=True)}
        assert sorted(got) == [r.phy_offset for r in acked]
    records = list(ref.iter_commitlog(str(tmp_path / "s")))
    assert len(records) == len(acked)
    for rec in records:
        assert ref.body_crc(rec["body"]) == rec["body_crc"]


def test_properties_changed_during_put_are_stored_whole(tmp_path):
    """Another thread adds and removes a property while large bodies are written (their copy
    runs without the GIL): each record holds the properties as they stood at one moment,
    whole. (They were laid out after the copy, against a length taken before it: a third
    of such records came back with a torn properties string.)"""
    msg = Message("T", bytes(8_000_000), properties={"a": "1"})
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            msg.properties.update(long="v" * 500)   # calls: the GIL can change hands after either
            msg.properties.pop("long")

    cfg = _cfg(commitlog_file_size=1 << 26, max_message_size=1 << 24)
    t = threading.Thread(target=flip)
    t.start()
    try:
        with MessageStore(tmp_path / "s", cfg) as s:
            acked = [s.put(msg).phy_offset for _ in range(24)]
    finally:
        stop.set()
        t.join()
    with MessageStore(tmp_path / "s", cfg) as s:
        assert s.verify().ok
        got = [s.get_by_offset(phy).properties for phy in acked]
    assert [p for p in got if p not in ({"a": "1"}, {"a": "1", "long": "v" * 500})] == []
    assert [r["phy_offset"] for r in ref.iter_commitlog(str(tmp_path / "s"))] == acked


def test_a_batch_writes_what_was_checked(tmp_path):
    """Messages changed while their batch is written (here from the pre-fault hand-off the
    append makes between two records, as another thread could) are stored as they were
    when the batch was checked: the whole batch, nothing refused halfway."""
    first = bytearray(b"a" * 100)
    msgs = [Message("T", first), Message("T", b"b" * 100, properties={"p": "1"})]
    refused = []

    class Meddler:   # stands in for the warmer; the appender calls it after the first record
        def submit(self, *args):
            msgs[1].body = b"x" * (1 << 20)           # over max_message_size
            msgs[1].born_host_packed = bytes([10, 0, 0, 9, 0, 0, 0, 1])   # another host (a bad one is refused when set)
            msgs[1].properties["q"] = "2"
            try:
                first.extend(b"more")
            except BufferError:                     # held until written: it cannot be resized
                refused.append(True)

    with MessageStore(tmp_path / "s", _cfg(warm_mapped_file=True, max_message_size=1 << 16)) as s:
        warmer, s.commitlog._warmer = s.commitlog._warmer, Meddler()
        s.commitlog.appender.warm_mark = 0
        try:
            res = s.put_batch(msgs)
        finally:
            s.commitlog._warmer = warmer
        got = [s.get_by_offset(r.phy_offset) for r in res]
    assert refused == [True]
    assert [bytes(m.body) for m in got] == [b"a" * 100, b"b" * 100]
    assert got[1].properties == {"p": "1"} and got[1].born_host == got[1].store_host


BAD = [Message("bad/topic", b"x"), Message("T", b"x" * (1 << 17)), Message("T", b"x", properties={"a\x01": "v"})]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 30), where=st.floats(0, 1), bad=st.sampled_from(range(len(BAD))))
def test_put_batch_is_all_or_nothing(tmp_path_factory, n, where, bad):
    root = tmp_path_factory.mktemp("batch") / "s"
    with MessageStore(root, _cfg(max_message_size=1 << 16)) as s:
        before = s.put(Message("T", b"first"))
        batch = [Message("T", b"m%d" % i, keys=[f"k{i}"]) for i in range(n)]
        batch.insert(int(where * n), BAD[bad])
        with pytest.raises(StoreError):
            s.put_batch(batch)
        assert s.max_phy_offset == before.phy_offset + before.size
        s.wait_dispatched()
        assert s.max_offset("T", before.queue_id) == 1
        assert not s.query_by_key("T", "k0")
        after = s.put(Message("T", b"after"))
        assert after.phy_offset == before.phy_offset + before.size


class _Name(str):
    def __str__(self):
        return "not the value"


@pytest.mark.parametrize("attr, good, bad", [
    ("topic", "U", [None, 5, b"T", "\ud800"]),
    ("body", b"new", [None, "text", 7]),
    ("properties", {"a": "1"}, [None, [("a", "1")], "a=1"]),
    ("flag", -5, [None, 1.5, True, "1", 1 << 31]),
    ("sys_flag", 4, [None, -1, 1 << 31]),
    ("born_timestamp", 123, [None, -1, 1 << 63, 1.5]),
    ("born_host_packed", bytes([10, 0, 0, 9, 0, 0, 0, 1]), [b"abc", "10.0.0.9:1", bytearray(8)]),
    ("reconsume_times", 2, [None, -1, 1 << 31]),
    ("prepared_transaction_offset", 9, [None, -1, 1 << 63]),
])
def test_message_fields_set_are_checked_as_the_constructor_checks_them(attr, good, bad):
    """Setting a Message field takes what Message() takes (a str subclass by its value) and
    refuses the rest with InvalidArgumentError, never a bare TypeError/OverflowError."""
    m = Message("T", b"x")
    for v in bad:
        with pytest.raises(InvalidArgumentError):
            setattr(m, attr, v)
    setattr(m, attr, good)
    assert getattr(m, attr) == good
    m.topic = _Name("V")
    assert type(m.topic) is str and m.topic == "V"


def test_properties_are_laid_out_and_checked_byte_by_byte(tmp_path):
    """put checks names and values for the \\x01 / \\x02 separators a word at a time: a
    separator at any position of a name or value of 1 to 20 bytes is refused (nothing
    stored), and the neighbouring bytes (\\x00, \\x03, \\x7f, \\x80..) are stored as given,
    the record's properties string equal to the reference encoder's, in the dict's order."""
    lengths = range(1, 21)
    with MessageStore(tmp_path / "s", _cfg(commitlog_file_size=1 << 22)) as s:
        for n in lengths:
            for at in range(n):
                for sep in "\x01\x02":
                    text = "a" * at + sep + "b" * (n - at - 1)
                    for props in ({text: "v"}, {"k": text}, {"k": "v", "DELAY": "1", "n": text}):
                        msg = Message("T", b"x")
                        msg.properties = props   # not through Message(), which checks them too
                        with pytest.raises(InvalidArgumentError):
                            s.put(msg)
        assert s.max_offset("T", 0) == 0 and list(s.scan()) == []
        stored = []
        for n in lengths:
            for ch in "\x00\x03\x7f\x80é\u20ac":
                props = {"k" + ch * n: ch * n, ch * n: "v" * n}
                s.put(Message("T", b"x", properties=props))
                stored.append(props)
    recs = list(ref.iter_commitlog(str(tmp_path / "s")))
    assert [r["properties_raw"] for r in recs] == [ref.encode_properties(p) for p in stored]


def _child_ok(tmp_path, code):
    """Run ``code`` (which prints "ok" last) in a child process: a crash fails the test only."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.returncode, p.stdout, p.stderr[-2000:])


def test_a_property_name_whose_eq_changes_the_dict_is_stored_as_given(tmp_path):
    """The properties are laid out from borrowed references, so no Python code may run
    meanwhile: a str subclass name is compared by its bytes, never by its __eq__ (which
    emptied the dict under the loop: the record held a name read from freed memory)."""
    _child_ok(tmp_path, """
        import gc, sys
        from rmqstore import Message, MessageStore, StoreConfig

        class Evil(str):
            __hash__ = str.__hash__

            def __eq__(self, other):
                M.properties.clear()
                M.properties.update({f"x{i}": "y" * 50 for i in range(100)})
                gc.collect()
                return False

        with MessageStore(sys.argv[1], StoreConfig(warm_mapped_file=False)) as s:
            M = Message("T", b"b")
            M.properties = {Evil("ABCDE"): "v" * 1000, "k2": "w"}   # five characters, as DELAY
            r = s.put(M)
            assert len(M.properties) == 2, "__eq__ ran"
            assert s.get_by_offset(r.phy_offset).properties == {"ABCDE": "v" * 1000, "k2": "w"}
        print("ok")
    """)


def test_put_from_a_thread_with_the_smallest_stack(tmp_path):
    """Laying out properties takes a few hundred bytes of stack (a 32 KiB buffer crashed a
    thread started with threading.stack_size(32768), the least Python allows); larger
    properties go to the heap."""
    _child_ok(tmp_path, """
        import sys, threading
        from rmqstore import Message, MessageStore, StoreConfig
        threading.stack_size(32768)
        out = []
        with MessageStore(sys.argv[1], StoreConfig(warm_mapped_file=False)) as s:
            def work():
                for n in (1, 600, 32000):
                    out.append(s.put(Message("T", b"x", properties={"p": "v" * n})))
            t = threading.Thread(target=work)
            t.start()
            t.join()
            assert [s.get_by_offset(r.phy_offset).properties["p"] for r in out] == ["v", "v" * 600, "v" * 32000]
        print("ok")
    """)


@pytest.mark.parametrize("bad,error", [(Message("T", b"x", properties={"a\x01": "b"}), InvalidArgumentError),
                                       (Message("T", b"x", properties={"DELAY": "abc"}), InvalidArgumentError),
                                       (Message("a/b", b"x"), InvalidTopicError),
                                       (Message("T", b"x" * 70_000), MessageTooLargeError),
                                       ("not a message", InvalidArgumentTypeError)])
def test_put_batch_names_the_message_it_refuses(tmp_path, bad, error):
    """A batch refused for one message said why but not which message: now the error (of the
    same type) starts "put_batch message i:" and carries ``message_index`` i; nothing is stored."""
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 16)) as store:
        with pytest.raises(error, match="^put_batch message 2: ") as e:
            store.put_batch([Message("T", b"a"), Message("T", b"b"), bad, Message("T", b"c")])
        assert e.value.message_index == 2
        assert store.max_phy_offset == 0


def test_keys_split_only_at_spaces_as_the_index_and_arrow_do(tmp_path):
    """RocketMQ's KEY_SEPARATOR is one space: a KEYS value "a\\tb  c\\u00a0d" holds the keys
    "a\\tb" and "c\\u00a0d", as the index and the Arrow decoder (Spark's keys column) read
    it. Message.keys and MessageExt.keys split at any whitespace and said ["a", "b", "c",
    "d"]: keys the index does not hold, and not those it does."""
    import rmqstore.batch as batch
    value = "a\tb  c\u00a0d "
    want = ["a\tb", "c\u00a0d"]
    assert Message("T", b"x", keys=value).keys == want
    with MessageStore(tmp_path / "s", _cfg()) as s:
        r = s.put(Message("T", b"x", keys=value))
        s.wait_dispatched()
        assert s.get_by_offset(r.phy_offset).keys == want
        assert [m.keys for m in s.scan()] == [want]
        for k in want:
            assert [m.phy_offset for m in s.query_by_key("T", k)] == [r.phy_offset]
    (path, base, _size), = batch.segment_files(tmp_path / "s")
    (rb,) = batch.iter_arrow(path, base, columns=["keys"])
    assert rb.column("keys").to_pylist() == [want]


def _put_keys(s, how, keys):
    import pyarrow as pa
    if how == "put":
        return s.put(Message("T", b"x", keys=keys))
    if how == "put_batch":
        return s.put_batch([Message("T", b"ok"), Message("T", b"x", keys=keys)])
    if how == "put_columns":
        return s.put_columns("T", [b"ok", b"x"], keys=[None, keys])
    kind = pa.list_(pa.string()) if how == "put_arrow" else pa.large_list(pa.large_string())
    return s.put_arrow(pa.table({"topic": ["T", "T"], "body": [b"ok", b"x"], "keys": pa.array([["k"], keys], kind)}))


@pytest.mark.parametrize("how", ["put", "put_batch", "put_columns", "put_arrow", "put_arrow_large"])
@pytest.mark.parametrize("keys", [["a b"], ["k", "a b"], ["k", ""]])
def test_a_key_holding_the_keys_separator_is_refused(tmp_path, how, keys):
    """A list of keys is stored joined by spaces, RocketMQ's KEY_SEPARATOR: the key "a b"
    was stored as KEYS "a b", which the index, a broker and every reader take as the keys
    "a" and "b" (and an empty key vanished). Every write path now refuses such a key with
    InvalidArgumentError and stores nothing; a str of space-separated keys stays allowed."""
    with MessageStore(tmp_path / "s", _cfg()) as s:
        with pytest.raises(InvalidArgumentError, match="separator of KEYS"):
            _put_keys(s, how, keys)
        assert list(s.scan()) == []
        _put_keys(s, how, ["k1", "k2"])
        assert [m.keys for m in s.scan()][-1] == ["k1", "k2"]
        assert s.put(Message("T", b"x", keys="k3 k4")).size > 0
