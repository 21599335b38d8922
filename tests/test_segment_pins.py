"""MappedSegment pins and errors: hold() raises once closing, a pin defers the unmap, and
misuse raises StoreError subclasses that still match the builtin a caller may expect."""
import pytest

from rmqstore._segment import PREFAULT_AHEAD, PREFAULT_READ, PREFAULT_WRITE, MappedSegment
from rmqstore.errors import (
    InvalidArgumentError,
    OutOfRangeError,
    StoreClosedError,
    StoreError,
    StoreReadOnlyError,
    ViewExportedError,
)


def make(tmp_path, readonly=False):
    seg = MappedSegment(tmp_path / "00000000000000000000", 0, 4096, create=True)
    if readonly:
        seg.close()
        seg = MappedSegment(tmp_path / "00000000000000000000", 0, 4096, readonly=True)
    return seg


def test_hold_raises_once_closing(tmp_path):
    seg = make(tmp_path)
    seg.close()
    with pytest.raises(StoreClosedError):
        seg.hold()


def test_a_held_pin_defers_the_unmap(tmp_path):
    seg = make(tmp_path)
    seg.write(0, b"abcd")
    seg.hold()
    seg.close()
    assert seg.closed
    with pytest.raises(StoreClosedError):   # new readers are refused ...
        seg.read(0, 4)
    with pytest.raises(StoreClosedError):
        seg.hold()
    seg.release()                            # ... and the last release unmaps
    seg.close()                              # idempotent after the deferred unmap


def test_misuse_raises_store_errors_that_match_builtins(tmp_path):
    seg = make(tmp_path)
    with pytest.raises(OutOfRangeError) as e:
        seg.read(4000, 200)
    assert isinstance(e.value, (StoreError, IndexError)) and isinstance(e.value, IndexError)
    with pytest.raises(InvalidArgumentError):
        seg.prefault(0, 4096, 7)
    for mode in (PREFAULT_READ, PREFAULT_WRITE, PREFAULT_AHEAD):
        seg.prefault(0, 4096, mode)
    view = memoryview(seg)
    with pytest.raises(ViewExportedError) as e:
        seg.close()
    assert isinstance(e.value, BufferError)
    view.release()
    seg.close()
    ro = make(tmp_path, readonly=True)
    with pytest.raises(StoreReadOnlyError) as e:
        ro.write(0, b"x")
    assert isinstance(e.value, PermissionError)
    ro.close()
