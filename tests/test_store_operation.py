"""MessageStore.operation(): a caller's own step on the store directory runs as one of the
store's operations (close waits for it; after close it is refused)."""
import threading

import pytest

from rmqstore import MessageStore
from rmqstore.errors import StoreClosedError


def test_close_waits_for_an_operation_and_refuses_one_after(tmp_path):
    store = MessageStore(str(tmp_path / "s"))
    inside, release, closed = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def step():
        with store.operation():
            inside.set()
            release.wait(10)
            seen.append(store.closed)   # close() has not run while the step was inside

    t = threading.Thread(target=step)
    t.start()
    assert inside.wait(10)
    closer = threading.Thread(target=lambda: (store.close(), closed.set()))
    closer.start()
    while True:                          # until close() has begun: a new operation is refused
        try:
            with store.operation():
                pass
        except StoreClosedError:
            break
    assert not store.closed and not closed.is_set()   # close() waits for the step inside
    release.set()
    t.join(10)
    closer.join(10)
    assert closed.is_set() and store.closed and seen == [False]
    with pytest.raises(StoreClosedError):
        with store.operation():
            pytest.fail("an operation ran on a closed store")
