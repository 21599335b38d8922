"""Nothing guessed where two readings fit: an index file's geometry is not recorded in it
(the header's hashSlotCount counts used slots), and 97 slots / 4,000 entries is as long
as 957 / 3,828 (RocketMQ's 1:4). Opened without options, such a store is refused with the
readings named, not read (and written) at the wrong geometry."""
import os

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore._index_file import file_size, read_header
from rmqstore.errors import DerivedFileError

ODD = dict(index_slots=97, index_entries=4000)


def _cfg(**kw):
    return StoreConfig(commitlog_file_size=1 << 20, warm_mapped_file=False, **kw)


def _index_file(path):
    d = os.path.join(path, "index")
    return os.path.join(d, sorted(os.listdir(d))[-1])


def test_two_geometries_of_one_size():
    assert file_size(97, 4000) == file_size(957, 3828)


@pytest.mark.parametrize("read_only", [True, False])
def test_ambiguous_geometry_is_refused_with_the_readings_named(tmp_path, read_only):
    with MessageStore(tmp_path, _cfg(**ODD)) as s:
        for i in range(600):
            s.put(Message("Geo", b"x", keys="k%d" % i))
    with pytest.raises(DerivedFileError) as e:
        MessageStore(tmp_path, _cfg(), read_only=read_only)
    msg = str(e.value)
    assert "957 slots / 3828 entries" in msg and "--index-slots" in msg and "index_slots" in msg
    with MessageStore(tmp_path, _cfg(**ODD), read_only=read_only) as s:   # told: it reads, all keys found
        assert all(len(s.query_by_key("Geo", "k%d" % i)) == 1 for i in range(600))
        assert s.verify().ok


def test_confirmed_one_to_four_geometry_still_opens(tmp_path):
    """A store made with a 1:4 geometry (RocketMQ's shape), opened without options: its
    entries confirm the reading."""
    with MessageStore(tmp_path, _cfg(index_slots=250, index_entries=1000)) as s:
        for i in range(300):
            s.put(Message("Geo", b"x", keys="k%d" % i))
    with MessageStore(tmp_path, _cfg()) as s:
        assert s.index.files[0].slots == 250
        assert all(len(s.query_by_key("Geo", "k%d" % i)) == 1 for i in range(300))
        for i in range(300, 400):
            s.put(Message("Geo", b"x", keys="k%d" % i))
    with MessageStore(tmp_path, _cfg(index_slots=250, index_entries=1000)) as s:
        assert all(len(s.query_by_key("Geo", "k%d" % i)) == 1 for i in range(400))
        assert s.verify().ok


def test_writer_without_options_never_writes_a_wrong_geometry(tmp_path):
    with MessageStore(tmp_path, _cfg(**ODD)) as s:
        s.put(Message("Geo", b"x", keys="first"))
    before = open(_index_file(tmp_path), "rb").read()
    with pytest.raises(DerivedFileError):
        MessageStore(tmp_path, _cfg())
    assert open(_index_file(tmp_path), "rb").read() == before
    with MessageStore(tmp_path, _cfg(**ODD), read_only=True) as s:
        assert read_header(s.index.files[0].seg)[5] == 2
