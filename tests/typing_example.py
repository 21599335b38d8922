"""A program using the whole public API, type-checked with ``mypy --strict`` by
tests/test_typing.py (and run there too), so the stubs cannot drift from the code."""
import sys

import numpy as np

from rmqstore import (
    GetMessageResult,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageNotFoundError,
    MessageStore,
    PutResult,
    StoreConfig,
    StoreError,
)


def main(path: str) -> int:
    config = StoreConfig(commitlog_file_size=1 << 20, warm_mapped_file=False, generate_uniq_key=True)
    with MessageStore(path, config) as store:
        one: PutResult = store.put(Message("orders", b"payload", tags="TagA", keys=["o-1"],
                                           properties={"region": "eu"}), queue_id=1)
        many: list[PutResult] = store.put_batch([Message("orders", b"x%d" % i) for i in range(10)])
        cols: dict[str, np.ndarray] = store.put_columns("orders", [b"c1", b"c2"], tags="TagB", keys=["o-2", None])
        assert store.wait_dispatched(10.0)
        got: MessageExt = store.get_by_offset(one.phy_offset)
        same: MessageExt = store.get_by_msg_id(one.msg_id)
        assert got.body == same.body == b"payload" and got.tags == "TagA" and got.keys == ["o-1"]
        bodies: list[bytes] = [m.body for m in store.scan(from_offset=0)]
        res: GetMessageResult = store.get_messages("orders", 1, 0, max_count=32, tags="TagA || TagB")
        first_found: MessageExt = res.messages[0]
        qcols = store.read_queue_columns("orders", 1)
        kcols = store.query_keys_columns("orders", ["o-1"])
        rows: int = qcols["count"]
        assert rows == len(qcols["queue_offset"]) and first_found.queue_offset == int(qcols["queue_offset"][0])
        assert kcols["count"] == 1 and int(kcols["key"][0]) == 0 and len(qcols["missing"]) == 0
        found: list[MessageExt] = store.query_by_key("orders", "o-1")
        batches: list[list[MessageExt]] = store.query_keys("orders", ["o-1", "o-2"])
        offsets: list[int] = store.query_offsets("orders", "o-1")
        uniq: str | None = got.uniq_key
        if uniq is not None:
            assert store.query_by_uniq_key("orders", uniq).phy_offset == one.phy_offset
        first: int = store.offset_by_time("orders", 1, got.store_timestamp, boundary="lower")
        store.commit_offset("billing", "orders", 1, res.next_offset)
        committed: int = store.committed_offset("billing", "orders", 1)
        queues: list[int] = store.queue_ids("orders")
        span = (store.min_offset("orders", 1), store.max_offset("orders", 1), store.min_phy_offset,
                store.max_phy_offset)
        report = store.verify()
        try:
            store.get_by_msg_id("not a msgId")
        except InvalidArgumentError:
            pass
        try:
            store.query_by_uniq_key("orders", "no-such-key")
        except MessageNotFoundError as e:
            problem: StoreError = e
            assert str(problem)
        print(len(many), len(cols["phy_offset"]), len(bodies), len(res.messages), len(found), len(batches),
              len(offsets), first, committed, queues, span, report.ok, store.topics())
        return 0 if report.ok and committed == res.next_offset else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
