"""Every public MessageStore method, called with arguments of the wrong type or out of
range, raises InvalidArgumentError (or another StoreError, e.g. MessageNotFoundError):
never a plain TypeError/ValueError, and nothing stored is lost."""
import pytest

from rmqstore import InvalidArgumentError, Message, MessageStore, StoreConfig, StoreError

from conftest import SMALL_INDEX

BAD = [None, True, 1.5, "1", b"x", "\ud800", -1, 1 << 70, [1], {"a": 1}]
CALLS = {
    "get_by_offset": (0,), "get_by_msg_id": ("0A00000100002A9F0000000000000000",), "queue_ids": ("T",),
    "min_offset": ("T", 0), "max_offset": ("T", 0), "consume_queue_entries": ("T", 0, 0, 1),
    "read_queue_columns": ("T", 0, 0, 1), "get_messages": ("T", 0, 0, 4), "offset_by_time": ("T", 0, 0),
    "commit_offset": ("g", "T", 0, 1), "committed_offset": ("g", "T", 0), "query_offsets": ("T", "k", 4, 0, None),
    "query_by_key": ("T", "k", 4, 0, None), "query_by_uniq_key": ("T", "u"), "put": (Message("T", b"x"), 0),
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
                method(*args)
            except InvalidArgumentError as e:
                assert isinstance(e, (TypeError, ValueError))
            except StoreError:
                pass
    assert bytes(store.get_messages("T", 0, 0, 4).messages[0].body) == b"kept"
