"""Every public MessageStore method, called with arguments of the wrong type or out of
range, raises InvalidArgumentError (or another StoreError, e.g. MessageNotFoundError):
never a plain TypeError/ValueError, and nothing stored is lost."""
import copy
import gc
import inspect
import pickle
import subprocess
import sys

import numpy as np
import pytest

from rmqstore import (
    GetMessageResult,
    GetMessageStatus,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Message,
    MessageStore,
    StoreClosedError,
    StoreConfig,
    StoreError,
    batch,
)

from conftest import SMALL_INDEX

BAD = [None, True, 1.5, "1", b"x", "\ud800", -1, 1 << 70, [1], {"a": 1}]
CALLS = {
    "get_by_offset": (0,), "get_by_msg_id": ("0A00000100002A9F0000000000000000",), "queue_ids": ("T",),
    "min_offset": ("T", 0), "max_offset": ("T", 0), "consume_queue_entries": ("T", 0, 0, 1),
    "read_queue_columns": ("T", 0, 0, 1), "get_messages": ("T", 0, 0, 4), "offset_by_time": ("T", 0, 0),
    "commit_offset": ("g", "T", 0, 1), "committed_offset": ("g", "T", 0), "query_offsets": ("T", "k", 4, 0, None),
    "query_by_key": ("T", "k", 4, 0, None), "query_by_uniq_key": ("T", "u"), "put": (Message("T", b"x"), 0),
    "scan": (0, None, False), "query_keys": ("T", ["k"], 4, 0, None),
    "query_keys_columns": ("T", ["k"], 4, 0, None), "wait_dispatched": (1.0,),
    "verify": (None, 10), "clean_expired": (None, True), "rebuild": (None,),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, warm_mapped_file=False, **SMALL_INDEX)
    with MessageStore(tmp_path_factory.mktemp("args") / "s", cfg) as s:
        s.put(Message("T", b"kept", keys=["k"]), queue_id=0)
        s.wait_dispatched()
        yield s


@pytest.mark.parametrize("name", sorted(CALLS))
def test_bad_arguments_are_invalid_argument_errors(store, name):
    method, good = getattr(store, name), CALLS[name]
    for i in range(len(good)):
        for bad in BAD:
            args = list(good)
            args[i] = bad
            try:
                r = method(*args)
                if hasattr(r, "__next__"):
                    list(r)
            except InvalidArgumentError as e:
                assert isinstance(e, (TypeError, ValueError))
            except StoreError:
                pass
    assert bytes(store.get_messages("T", 0, 0, 4).messages[0].body) == b"kept"


QUEUE_ID_AT = {"min_offset": 1, "max_offset": 1, "consume_queue_entries": 1, "read_queue_columns": 1, "get_messages": 1,
               "offset_by_time": 1, "commit_offset": 2, "committed_offset": 2}


@pytest.mark.parametrize("name", sorted(QUEUE_ID_AT))
@pytest.mark.parametrize("qid", [-1, 1 << 31, np.int64(-5), np.int64(1 << 40)], ids=repr)
def test_queue_ids_no_queue_can_have_are_refused_on_every_call(store, name, qid):
    """A queue id outside 0..2^31-1, which put refuses, answered reads as an empty queue
    (get_messages -1: NO_MATCHED_LOGIC_QUEUE, max_offset 0...): InvalidArgumentError,
    on the C fast path (get_messages) as on the others."""
    args = list(CALLS[name])
    args[QUEUE_ID_AT[name]] = qid
    with pytest.raises(InvalidArgumentError, match="queue_id"):
        getattr(store, name)(*args)
    args[QUEUE_ID_AT[name]] = (1 << 31) - 1   # the largest is a queue id
    getattr(store, name)(*args)


@pytest.mark.parametrize("call", ["query_keys", "query_keys_columns"])
@pytest.mark.parametrize("bad", [b for b in BAD if b != "1"], ids=repr)   # "1" is a valid key
def test_bad_items_in_query_keys_are_invalid_argument_errors(store, bad, call):
    """An item of the keys sequence is checked like query_by_key's key: a lone surrogate
    was a bare UnicodeEncodeError from the batch path."""
    with pytest.raises(InvalidArgumentError):
        getattr(store, call)("T", ["k", bad])


class Name(str):
    """A str subclass (as enum.StrEnum members are) that hides its value behind __str__."""

    def __str__(self):
        return "not the value"


class Index:
    """An integer that is no int (numpy's are alike): it has __index__."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def _lookalike(v):
    if type(v) is str:
        return Name(v)
    if type(v) is int:
        return Index(v)
    return v


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"put", "verify", "clean_expired", "rebuild", "commit_offset"}))
def test_str_subclasses_and_index_integers_are_taken_as_their_values(store, name):
    """Arguments the checks accept as str or int (a str subclass, an object with
    __index__) give the answer their plain values give, whichever path runs the call."""
    def answer(args):
        try:
            r = getattr(store, name)(*args)
            return repr(list(r) if hasattr(r, "__next__") else r)
        except StoreError as e:
            return f"{type(e).__name__}: {e}"

    assert answer([_lookalike(v) for v in CALLS[name]]) == answer(CALLS[name])


@pytest.mark.parametrize("position", range(4))
def test_bad_constructor_arguments(tmp_path, position):
    good = [str(tmp_path / "s"), StoreConfig(warm_mapped_file=False), False, None]
    for bad in BAD + ["", "a\0b", 0, 7]:
        args = list(good)
        args[position] = bad
        if position == 0 and isinstance(bad, str) and bad and "\0" not in bad:
            continue   # a relative directory name is a valid path
        if (position, bad) in ((1, None), (2, True), (3, None)):
            continue   # valid values
        with pytest.raises(InvalidArgumentError):
            MessageStore(*args).close()
    assert not any(tmp_path.iterdir())   # nothing was created


def test_progress_callback_failing_mid_rebuild_leaves_a_whole_store(tmp_path):
    """rebuild() propagates the callback's error, but only once every queue is rebuilt:
    reads, appends (at the right queue offsets) and verify go on as before."""
    cfg = StoreConfig(commitlog_file_size=1 << 14, consume_queue_entries=50, warm_mapped_file=False, **SMALL_INDEX)
    calls = []

    def progress(n):
        calls.append(n)
        raise KeyError("stop")

    with MessageStore(tmp_path / "s", cfg) as s:
        s.put_batch([Message("T", b"m%d" % i, keys=[f"k{i}"]) for i in range(300)], 0)
        with pytest.raises(KeyError):
            s.rebuild(progress)
        assert len(calls) == 1
        assert s.max_offset("T", 0) == 300 and s.put(Message("T", b"after"), 0).queue_offset == 300
        s.wait_dispatched()
        assert [m.body for m in s.get_messages("T", 0, 300, 2).messages] == [b"after"]
        assert [m.body for m in s.get_messages("T", 0, 0, 300).messages][:3] == [b"m0", b"m1", b"m2"]
        assert [m.body for m in s.query_by_key("T", "k7")] == [b"m7"]
        assert s.verify().ok


# Every public function of rmqstore.batch (the Spark data source's decoder) with each
# argument replaced by a bad value, in a child with a timeout: batch_bytes <= 0 used to
# loop forever, and None, floats, bytes, surrogates or a file as a store directory
# escaped as TypeError, OverflowError, UnicodeEncodeError or NotADirectoryError.
BATCH_SWEEP = r"""
import inspect, sys
from rmqstore import StoreError, batch
root = sys.argv[1]
seg, base, _ = batch.segment_files(root)[0]
calls = {"segment_files": [root], "count_records": [root], "end_offset": [root, 0], "advance": [root, 0, 4096],
         **{name: [seg, base, 0, None] for name in ("iter_columns", "iter_arrow", "decode_segment")}}
for name, good in calls.items():
    func = getattr(batch, name)
    params = list(inspect.signature(func).parameters)
    for i, param in enumerate(params):
        for bad in BAD + [0, seg + "/x"]:
            args, kwargs = list(good), {}
            if i < len(good):
                args[i] = bad
            else:
                kwargs[param] = bad
            try:
                r = func(*args, **kwargs)
                if hasattr(r, "__next__"):
                    list(r)
            except StoreError:
                pass
            except BaseException as e:
                print(f"{name}({param}={bad!r}): {type(e).__name__}: {e}")
"""


def test_batch_functions_refuse_bad_arguments(tmp_path):
    pytest.importorskip("pyarrow")
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 14, warm_mapped_file=False)) as s:
        s.put_batch([Message("T", b"m%d" % i) for i in range(20)], 0)
    code = f"BAD = {BAD!r}\n{BATCH_SWEEP}"
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")


def _bad_calls(func, good):
    """Calls of ``func`` that do not fit its signature: one argument too many, an unknown
    keyword, none at all."""
    yield (*good, *[0] * (len(inspect.signature(func).parameters) + 1 - len(good))), {}
    yield good, {"no_such_argument": 1}
    yield (), {}


@pytest.mark.parametrize("name", sorted(CALLS) + ["put_batch"])
def test_calls_that_do_not_fit_the_signature(store, name):
    """A public method called with an argument too many, an unknown keyword or none
    raises InvalidArgumentTypeError (a bare TypeError before), and nothing is lost; the C
    methods (put, put_batch, get_messages, query_by_key) too."""
    method = getattr(store, name)
    for args, kwargs in _bad_calls(method, CALLS.get(name, ([Message("T", b"x")], 0))):
        if name in ("wait_dispatched", "verify", "clean_expired", "rebuild", "scan") and not args and not kwargs:
            continue   # every argument has a default
        with pytest.raises(InvalidArgumentTypeError):
            r = method(*args, **kwargs)
            list(r) if hasattr(r, "__next__") else None
    assert bytes(store.get_messages("T", 0, 0, 4).messages[0].body) == b"kept"


def test_c_methods_take_their_arguments_by_keyword(tmp_path):
    """put, put_batch, get_messages and query_by_key (C methods with defaults that mark a
    missing argument) take every argument by keyword as their documented signatures say."""
    with MessageStore(tmp_path / "s", StoreConfig(warm_mapped_file=False, **SMALL_INDEX)) as s:
        a = s.put(msg=Message("T", b"a", keys=["k"]), queue_id=1)
        b = s.put_batch(msgs=[Message("T", b"b", keys=["k"])], queue_id=1)[0]
        assert (a.queue_id, a.queue_offset, b.queue_id, b.queue_offset) == (1, 0, 1, 1)
        s.wait_dispatched()
        got = s.get_messages(topic="T", queue_id=1, offset=0, max_count=1, tags=None)
        assert [bytes(m.body) for m in got.messages] == [b"a"]
        assert [bytes(m.body) for m in s.query_by_key(topic="T", key="k", max_num=5, begin=0, end=None)] == [b"b", b"a"]


def test_constructors_refuse_unknown_fields_and_extra_arguments(tmp_path):
    """StoreConfig, StoreConfig.with_ and MessageStore: an unknown keyword or too many
    values is InvalidArgumentTypeError naming it (a bare TypeError before); no store made."""
    with pytest.raises(InvalidArgumentTypeError, match="unknown"):
        StoreConfig(unknown=1)
    with pytest.raises(InvalidArgumentTypeError, match="unknown"):
        StoreConfig().with_(unknown=1)
    with pytest.raises(InvalidArgumentTypeError):
        StoreConfig(*range(len(StoreConfig.names()) + 1))
    with pytest.raises(InvalidArgumentTypeError, match="foo"):
        MessageStore(tmp_path / "s", foo=1)
    with pytest.raises(InvalidArgumentTypeError):
        MessageStore(tmp_path / "s", None, False, None, 5)
    with pytest.raises(InvalidArgumentTypeError):
        MessageStore()
    with pytest.raises(InvalidArgumentTypeError, match="positional"):   # a bare TypeError before
        StoreConfig().with_(1)
    assert not any(tmp_path.iterdir())


class FsPath:
    """A path object whose __fspath__ returns ``v`` (or raises it)."""

    def __init__(self, v):
        self.v = v

    def __fspath__(self):
        if isinstance(self.v, Exception):
            raise self.v
        return self.v


class LoudStr(str):
    """A str subclass whose __str__ and __fspath__ raise."""

    def __str__(self):
        raise RuntimeError("__str__ called")

    def __fspath__(self):
        raise RuntimeError("__fspath__ called")


def test_path_objects_that_fail_or_lie(tmp_path):
    """A path whose __fspath__ returns an int or None (os.fspath's bare TypeError) or
    raises (the caller's exception) is an InvalidArgumentTypeError naming it; a str
    subclass is taken as its str value (its own __str__ raised from inside the store),
    bytes from __fspath__ as the file name they encode. Nothing is created for a refused one."""
    from rmqstore import batch
    for bad in (FsPath(5), FsPath(None), FsPath(RuntimeError("boom")), FsPath(TypeError("boom"))):
        with pytest.raises(InvalidArgumentTypeError, match="__fspath__"):
            MessageStore(bad, StoreConfig(warm_mapped_file=False))
        with pytest.raises(InvalidArgumentTypeError, match="__fspath__"):
            batch.segment_files(bad)
    assert not any(tmp_path.iterdir())
    cfg = StoreConfig(commitlog_file_size=1 << 16, warm_mapped_file=False, **SMALL_INDEX)
    with MessageStore(LoudStr(tmp_path / "a"), cfg) as s:
        s.put(Message("T", b"x"), 0)
        assert s.path == str(tmp_path / "a")
    with MessageStore(FsPath(bytes(tmp_path / "a")), cfg, read_only=True) as s:
        assert [m.body for m in s.scan()] == [b"x"]
    assert [f[1] for f in batch.segment_files(LoudStr(tmp_path / "a"))] == [0]


def test_batch_functions_refuse_calls_that_do_not_fit(tmp_path):
    from rmqstore import batch
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 14, warm_mapped_file=False)) as s:
        s.put(Message("T", b"m"), 0)
    seg, base, _ = batch.segment_files(tmp_path / "s")[0]
    calls = {"segment_files": [tmp_path / "s"], "count_records": [tmp_path / "s"], "end_offset": [tmp_path / "s", 0],
             "advance": [tmp_path / "s", 0, 4096], "iter_columns": [seg, base], "decode_segment": [seg, base],
             "to_arrow": [{}, "s"], "concat_columns": [[]]}
    for name, good in calls.items():
        for args, kwargs in _bad_calls(getattr(batch, name), good):
            with pytest.raises(InvalidArgumentTypeError):
                getattr(batch, name)(*args, **kwargs)


def test_a_typeerror_from_within_is_not_taken_for_a_bad_call(tmp_path):
    """The check runs only when a call fails, and only re-labels what the signature
    refuses: a TypeError the progress callback raises comes out as itself."""
    def progress(n):
        raise TypeError("from the callback")
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 14, warm_mapped_file=False)) as s:
        s.put(Message("T", b"m"), 0)
        with pytest.raises(TypeError, match="from the callback") as e:
            s.verify(progress)
        assert not isinstance(e.value, StoreError)


class LyingIndex:
    """An integer whose __index__ fails or returns no int (a float, a str)."""

    def __init__(self, result):
        self.result = result

    def __index__(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


LIARS = [LyingIndex(1.5), LyingIndex("1"), LyingIndex(RuntimeError("boom")), LyingIndex(TypeError("boom"))]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_index_that_fails_or_lies_is_an_invalid_argument(store, name):
    """Every int argument given an object whose __index__ returns a float or a str, or
    raises: a bare TypeError from a comparison inside, a float offset reaching numpy (and
    the caller's own exception) before; InvalidArgumentTypeError naming the argument now,
    on the C paths (put, get_messages, query_by_key) as on the others."""
    method, good = getattr(store, name), CALLS[name]
    positions = [i for i, v in enumerate(good) if type(v) is int]
    for i in positions:
        for liar in LIARS:
            args = list(good)
            args[i] = liar
            with pytest.raises(InvalidArgumentTypeError, match="__index__"):
                r = method(*args)
                list(r) if hasattr(r, "__next__") else None
    assert bytes(store.get_messages("T", 0, 0, 4).messages[0].body) == b"kept"


def test_message_fields_and_columns_refuse_a_lying_index(store):
    """Message's int fields and put_columns' one-int columns go through the same check."""
    for liar in LIARS:
        with pytest.raises(InvalidArgumentTypeError, match="__index__"):
            Message("T", b"x", flag=liar)
        with pytest.raises(InvalidArgumentTypeError, match="__index__"):
            Message("T", b"x", delay_level=liar)
        with pytest.raises(InvalidArgumentTypeError, match="__index__"):
            store.put_columns("T", [b"x"], liar)
    assert Message("T", b"x", delay_level=LyingIndex(2)).properties["DELAY"] == "2"


def test_a_store_cannot_be_copied_or_pickled(store):
    """copy.copy(store) shared the lock, maps and threads: collecting the copy closed the
    store under its owner. Copying or pickling is refused; the store goes on."""
    for dup in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(InvalidArgumentTypeError, match="open its path again"):
            dup(store)
    gc.collect()
    assert not store.closed and bytes(store.get_messages("T", 0, 0, 4).messages[0].body) == b"kept"


def test_scan_iterator_after_close_and_pickled(tmp_path):
    """A scan iterator kept handing out the rest of the batch it had read after the store
    closed; now every next() after close() raises StoreClosedError. Pickling or copying
    one is an InvalidArgumentTypeError, not Cython's bare TypeError."""
    s = MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=1 << 16, warm_mapped_file=False, **SMALL_INDEX))
    s.put_batch([Message("T", b"m%d" % i) for i in range(20)], 0)
    it = s.scan()
    assert next(it).body == b"m0"
    for dup in (copy.copy, pickle.dumps):
        with pytest.raises(InvalidArgumentTypeError):
            dup(it)
    s.close()
    for _ in range(2):
        with pytest.raises(StoreClosedError):
            next(it)
    with MessageStore(tmp_path / "s", StoreConfig(warm_mapped_file=False, **SMALL_INDEX)) as s:
        done = s.scan()
        assert [m.body for m in done] == [b"m%d" % i for i in range(20)]
    for _ in range(2):    # used up before the close: stays used up (the iterator protocol)
        with pytest.raises(StopIteration):
            next(done)


def test_get_message_status_of_an_unknown_value():
    assert GetMessageStatus("FOUND") is GetMessageStatus.FOUND
    for bad in (99, "found", None):
        with pytest.raises(InvalidArgumentError, match="not a GetMessageStatus"):
            GetMessageStatus(bad)


def test_immutable_objects_refuse_changes(store):
    """Setting or deleting an attribute of a PutResult, a MessageExt (Cython's bare
    AttributeError before) or a StoreConfig (dataclasses' FrozenInstanceError) is a
    FrozenObjectError, still an AttributeError and a FrozenInstanceError; nothing changes."""
    import dataclasses

    from rmqstore import FrozenObjectError
    res = store.put(Message("T", b"frozen"), 0)
    ext = store.get_by_offset(res.phy_offset)
    for obj, name in ((res, "size"), (res, "extra"), (ext, "topic"), (ext, "body"), (ext, "extra"),
                      (store.config, "flush_mode"), (store.config, "extra")):
        for change, args in ((setattr, (obj, name, 1)), (delattr, (obj, name))):
            with pytest.raises(FrozenObjectError, match=name) as e:
                change(*args)
            assert isinstance(e.value, (AttributeError, dataclasses.FrozenInstanceError))
    assert (res.size, ext.topic, ext.body, store.config.flush_mode) == (ext.store_size, "T", b"frozen", "async")
    assert pickle.loads(pickle.dumps(ext)).body == b"frozen" and copy.deepcopy(store.config) == store.config


GOOD_RESULT = (GetMessageStatus.FOUND, 1, 0, 2)


@pytest.mark.parametrize("args,kwargs", [
    ((), {}), (GOOD_RESULT[:3], {}), ((*GOOD_RESULT, [], [], 7), {}), (GOOD_RESULT, {"bogus": 1}),
    (("FOUNDX", 1, 0, 2), {}), ((1, 1, 0, 2), {}), ((GetMessageStatus.FOUND, "1", 0, 2), {}),
    ((GetMessageStatus.FOUND, 1, True, 2), {}), ((GetMessageStatus.FOUND, 1, 0, 1 << 70), {}),
    (GOOD_RESULT, {"messages": [1]}), (GOOD_RESULT, {"messages": ()}), (GOOD_RESULT, {"problems": [(1, 2)]}),
])
def test_get_message_result_built_by_hand_checks_its_arguments(args, kwargs):
    """GetMessageResult (a plain dataclass) took any field values and raised a bare
    TypeError for a call that did not fit; both are now InvalidArgumentErrors, while
    get_messages builds its results without the checks (it made them every call)."""
    with pytest.raises(InvalidArgumentError):
        GetMessageResult(*args, **kwargs)


def test_get_message_result_built_right_is_the_one_get_messages_makes(store):
    r = store.get_messages("T", 0, 0, 4)
    assert GetMessageResult(r.status.value, r.next_offset, r.min_offset, r.max_offset, r.messages,
                            r.problems) == r
    assert GetMessageResult(status="FOUND", next_offset=1, min_offset=0, max_offset=2).messages == []


def test_decode_stats_refuses_arguments():
    with pytest.raises(InvalidArgumentTypeError):
        batch.DecodeStats(1)


@pytest.mark.parametrize("call", ["query_keys", "put_batch", "put_columns keys", "Message keys"])
@pytest.mark.parametrize("zero_d", [np.array(1), np.array("k"), np.array(b"k")], ids=["int", "str", "bytes"])
def test_a_0d_array_where_a_sequence_is_due_is_an_invalid_argument(store, call, zero_d):
    """A 0-d numpy array has ``__iter__`` but iter() refuses it: taken for a sequence (keys,
    messages) it gave numpy's bare TypeError "iteration over a 0-d array". Now iterable
    means what iter() takes, and a 0-d array is InvalidArgumentTypeError; nothing is stored."""
    end = store.max_phy_offset
    run = {"query_keys": lambda: store.query_keys("T", zero_d),
           "put_batch": lambda: store.put_batch(zero_d),
           "put_columns keys": lambda: store.put_columns("T", [b"x"], keys=[zero_d]),
           "Message keys": lambda: store.put(Message("T", b"x", keys=zero_d))}[call]
    with pytest.raises(InvalidArgumentTypeError, match="ndarray"):
        run()
    assert store.max_phy_offset == end
    assert [r.body for r in store.query_by_key("T", "k")] == [b"kept"]
