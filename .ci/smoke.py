"""Smoke test of an installed rmqstore (sdist or wheel), run from outside the source tree:
write a store, read it back, and read the RocketMQ 4.9.8 fixture read-only."""
import json
import os
import sys
import tempfile

import rmqstore
from rmqstore import Message, MessageStore, StoreConfig

assert "site-packages" in rmqstore.__file__, rmqstore.__file__
package = os.path.dirname(rmqstore.__file__)
assert all(os.path.isfile(os.path.join(package, f)) for f in ("py.typed", "_message.pyi")), "type information missing"
DATA = ("console/templates/base.html", "console/static/console.js", "spark/log4j2.properties")
assert all(os.path.isfile(os.path.join(package, f)) for f in DATA), "package data missing"
with tempfile.TemporaryDirectory() as d:
    cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, index_slots=1000,
                      index_entries=4000, flush_mode="sync")
    with MessageStore(os.path.join(d, "s"), cfg) as s:
        rs = s.put_batch([Message("Smoke", b"m%d" % i, tags="T", keys=[f"k{i}"]) for i in range(500)])
        s.wait_dispatched()
        want = [b"m%d" % i for i, r in enumerate(rs) if r.queue_id == 0]
        got, offset = [], 0
        while len(got) < len(want):
            res = s.get_messages("Smoke", 0, offset, 32)
            got += [bytes(m.body) for m in res.messages]
            offset = res.next_offset
        assert got == want
        assert bytes(s.query_by_key("Smoke", "k7")[0].body) == b"m7"
        assert s.get_by_msg_id(rs[3].msg_id).queue_offset == rs[3].queue_offset
fixture = os.path.join(sys.argv[1], "rocketmq-4.9.8", "clean")
with open(os.path.join(fixture, "manifest.json")) as f:
    manifest = json.load(f)
with MessageStore(os.path.join(fixture, "store"), read_only=True) as s:
    assert sum(1 for _ in s.scan(check_crc=True)) == manifest["messageCount"]
print("smoke ok:", rmqstore.__file__)
