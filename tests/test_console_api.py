"""The console's JSON API and its safety rules, over HTTP on loopback (no browser): paging
that neither skips nor repeats, time seeks, every key hit with collisions removed, bounded
scans and regexes, parameters that cannot name a path, the token beyond loopback, the Host
check, the CSP, the CSRF header on the one POST, and the OpenAPI document."""
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from rmqstore import Message, MessageStore, StoreConfig

from conftest import CLEAN_498, CRASHED_498

pytest.importorskip("starlette", reason="the [console] extra is not installed")
from rmqstore.console import browser, limits, running  # noqa: E402
from rmqstore.console.app import build  # noqa: E402
from rmqstore.console.pages import PAGES  # noqa: E402

CFG = StoreConfig(commitlog_file_size=1 << 22, consume_queue_entries=1000, index_slots=10000, index_entries=40000)
HOT = 150   # messages sharing one key: more than RocketMQ's 64 a query


def queue_messages(s, topic):
    """Every message of ``topic``'s queues, read with getMessage page by page."""
    out = []
    for q in s.queue_ids(topic):
        pos = s.min_offset(topic, q)
        while pos < s.max_offset(topic, q):
            r = s.get_messages(topic, q, pos, 32)
            out.extend(r.messages)
            pos = r.next_offset
    return out


def _get(url, headers=None, method="GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _json(url):
    status, _, body = _get(url)
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("console-api") / "store")
    with MessageStore(root, CFG) as s:
        n = limits.SCAN_LIMIT + 5000
        s.put_columns("Bulk", [b"x%d" % i for i in range(n)], tags=[f"T{i % 7}" for i in range(n)])
        for i in range(HOT):
            s.put(Message("Hot", f"hot {i}".encode(), keys=["hot", f"k{i}"]))
        s.put(Message("Hot", b"needle in a haystack", tags="Needle", keys="needle"))
        s.wait_dispatched()
    return root


@pytest.fixture(scope="module")
def console(generated):
    paths = [generated] + ([str(CLEAN_498 / "store")] if (CLEAN_498 / "store").is_dir() else [])
    with running(paths) as (url, c):
        yield url.rstrip("/"), c


def _all_pages(url, first, order):
    seen, pages = [], 0
    page = _json(first)
    while True:
        seen += [(m["queueId"], m["queueOffset"]) for m in page["messages"]]
        pages += 1
        if not page["next"]:
            return seen, pages
        page = _json(f"{url}&order={order}&pos={page['next']}")


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_paging_neither_skips_nor_repeats(console, order):
    url, c = console
    s = c.stores[0].store()
    base = f"{url}/api/s/0/browse?topic=Hot&size=40"
    seen, pages = _all_pages(base, f"{base}&order={order}", order)
    expected = sorted(((m.store_timestamp, m.phy_offset), (m.queue_id, m.queue_offset))
                      for m in queue_messages(s, "Hot"))
    want = [p for _, p in expected]
    assert seen == (want if order == "oldest" else want[::-1])
    assert pages == -(-len(want) // 40)


def test_previous_is_the_page_before(console):
    url, _ = console
    base = f"{url}/api/s/0/browse?topic=Hot&size=30&order=oldest"
    first = _json(base)
    second = _json(f"{base}&pos={first['next']}")
    back = _json(f"{base}&pos={second['previous']}")
    assert back["messages"] == first["messages"]
    assert first["previous"] is None


def test_time_seek_is_the_first_message_at_or_after(console):
    url, c = console
    s = c.stores[0].store()
    msgs = sorted((m for m in queue_messages(s, "Hot")),
                  key=lambda m: (m.store_timestamp, m.phy_offset))
    t = msgs[len(msgs) // 2].store_timestamp
    page = _json(f"{url}/api/s/0/browse?topic=Hot&size=10&time={t}")
    assert [m["msgId"] for m in page["messages"]] == [m.msg_id for m in msgs if m.store_timestamp >= t][:10]
    newest = _json(f"{url}/api/s/0/browse?topic=Hot&size=10&time={t}&order=newest")
    assert [m["msgId"] for m in newest["messages"]] == [m.msg_id for m in msgs if m.store_timestamp <= t][::-1][:10]


def test_key_lookup_gives_every_hit_paged(console):
    url, c = console
    s = c.stores[0].store()
    expected = [m.msg_id for m in sorted(s.scan(), key=lambda m: -m.phy_offset)
                if m.topic == "Hot" and "hot" in (m.properties.get("KEYS") or "").split()]
    assert len(expected) == HOT
    found, cursor = [], ""
    while True:
        page = _json(f"{url}/api/s/0/lookup?kind=key&topic=Hot&value=hot&size=50{cursor}")
        found += [m["msgId"] for m in page["messages"]]
        if not page["next"]:
            break
        cursor = f"&cursor={page['next']}"
    assert found == expected


def test_colliding_keys_are_not_returned(console):
    url, c = console
    if len(c.stores.stores) < 2:
        pytest.skip("4.9.8 fixture not available")
    s = c.stores[1].store()
    for key in ("AaAa", "BBBB"):   # the same Java hashCode: RocketMQ's index returns both
        raw = {s.get_by_offset(o).msg_id for o in s.query_offsets("TopicA", key, 65535)}
        page = _json(f"{url}/api/s/1/lookup?kind=key&topic=TopicA&value={key}&size=200")
        shown = {m["msgId"] for m in page["messages"]}
        truth = {m.msg_id for m in s.scan() if m.topic == "TopicA" and key in (m.properties.get("KEYS") or "").split()}
        assert shown == truth and truth < raw


def test_content_filter_is_bounded_and_continues(console):
    url, c = console
    base = f"{url}/api/s/0/browse?topic=Bulk&size=10&q=no-such-text"
    page = _json(base)
    assert page["messages"] == [] and not page["complete"] and page["next"]
    assert page["scanned"] <= limits.SCAN_LIMIT
    total, p = page["scanned"], page
    while p["next"]:
        p = _json(f"{base}&pos={p['next']}")
        total += p["scanned"]
    s = c.stores[0].store()
    assert total == sum(s.max_offset("Bulk", q) for q in s.queue_ids("Bulk"))


def test_catastrophic_regex_stops_at_its_deadline(console):
    url, _ = console
    page = _json(f"{url}/api/s/0/browse?topic=Hot&size=5&mode=regex&q=" + urllib.request.quote("(h|h|ho)*(x+x+)+y"))
    assert page["messages"] == []
    status, _, body = _get(f"{url}/api/s/0/browse?topic=Hot&mode=regex&q=" + urllib.request.quote("(unclosed"))
    assert status == 400 and b"regular expression" in body


def test_regex_and_tags_find_what_they_name(console):
    url, c = console
    page = _json(f"{url}/api/s/0/browse?topic=Hot&mode=regex&q=" + urllib.request.quote("need.e"))
    assert [m["tags"] for m in page["messages"]] == ["Needle"]
    tagged = _json(f"{url}/api/s/0/browse?topic=Bulk&size=50&tags=" + urllib.request.quote("T3 || T5"))
    assert tagged["messages"] and {m["tags"] for m in tagged["messages"]} <= {"T3", "T5"}


@pytest.mark.parametrize("path", ["/api/s/..%2F..%2Fetc/overview", "/api/s/-1/overview", "/api/s/7/overview",
                                  "/api/s/0/browse?topic=..%2F..%2Fetc", "/api/s/0/browse?topic=Hot&size=100000",
                                  "/api/s/0/browse?topic=Hot&pos=0:1,99:0", "/api/s/0/message?offset=abc",
                                  "/api/s/0/lookup?kind=msgid&value=../../etc/passwd"])
def test_parameters_are_refused(console, path):
    url, _ = console
    status, _, body = _get(url + path)
    assert status in (400, 404), body
    assert "error" in json.loads(body)


def test_headers_host_check_and_csrf(console):
    url, _ = console
    status, headers, _ = _get(f"{url}/s/0/overview")
    assert status == 200
    assert "script-src 'self'" in headers["content-security-policy"] and "'unsafe-inline'" not in \
        headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert _get(f"{url}/s/0/overview", {"Host": "attacker.example"})[0] == 421
    assert _get(f"{url}/api/s/0/tasks?kind=verify", method="POST")[0] == 403


def test_verify_task_runs_in_the_background(console):
    url, c = console
    import re
    html = _get(f"{url}/s/0/health")[2].decode()
    csrf = re.search(r'name="csrf" content="([^"]+)"', html).group(1)
    status, _, body = _get(f"{url}/api/s/0/tasks?kind=digest", {"X-Console-CSRF": csrf}, "POST")
    assert status == 200
    task = json.loads(body)
    while task["state"] == "running":
        time.sleep(0.05)
        task = _json(f"{url}/api/tasks/{task['id']}")
    assert task["state"] == "done" and task["done"] == task["total"]
    import crc32c

    want = []
    for path in sorted((Path(c.stores[0].path) / "commitlog").iterdir()):
        with open(path, "rb") as f:
            want.append(f"{crc32c.crc32c(f.read()):08x}")
    assert [r["crc32c"] for r in task["result"]] == want


def test_token_required_beyond_loopback(generated):
    app, console = build([generated], token="s3cret", loopback=False)
    import socket
    import threading

    import uvicorn
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        while not server.started:
            pass
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        assert _get(f"{url}/api/s/0/overview")[0] == 401
        assert _get(f"{url}/api/s/0/overview", {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(f"{url}/api/s/0/overview", {"Authorization": "Bearer s3cret"})[0] == 200
        assert _get(f"{url}/api/s/0/overview", {"Cookie": "rmqstore_console=s3cret"})[0] == 200
    finally:
        server.should_exit = True
        t.join(10)
        console.stores.close()
        sock.close()


def test_openapi_describes_every_page(console):
    url, _ = console
    doc = _json(f"{url}/openapi.json")
    assert doc["openapi"].startswith("3.")
    for p in PAGES:
        assert f"/api/s/{{store}}/{p.name}" in doc["paths"]
        assert _get(f"{url}/api/s/0/{p.name}" + ("?name=Hot&topic=Hot&offset=0" if p.name != "overview" else ""))[0] \
            == 200


def test_overview_counts_and_chart(console):
    url, c = console
    s = c.stores[0].store()
    o = _json(f"{url}/api/s/0/overview")
    total = sum(s.max_offset(t, q) - s.min_offset(t, q) for t in s.topics() for q in s.queue_ids(t))
    assert o["messages"] == total
    assert sum(b["messages"] for b in o["chart"]["buckets"]) == total
    assert sum(b["bytes"] for b in o["chart"]["buckets"]) == s.max_phy_offset - s.min_phy_offset
    assert np.all(np.diff([b["start"] for b in o["chart"]["buckets"]]) % 60_000 == 0)


def test_endpoint_pop_state_is_shown(tmp_path):
    from rmqstore.pop_state import PopState
    root = str(tmp_path / "store")
    with MessageStore(root, CFG) as s:
        puts = [s.put(Message("Pop", f"m{i}".encode(), keys=f"p{i}"), queue_id=0) for i in range(3)]
        s.wait_dispatched()
        s.commit_offset("cg_pop", "Pop", 0, 1)
    st = PopState(root)
    until = int(time.time() * 1000) + 600_000
    st.sync(st.append([["r", "cg_pop", "Pop", 0, 1, until, 2, st.next_seq(), 0], ["n", "cg_pop", "Pop", 0, 2]]))
    with running([root]) as (url, _):
        url = url.rstrip("/")
        states = [_json(f"{url}/api/s/0/message?offset={p.phy_offset}")["endpointState"] for p in puts]
        groups = _json(f"{url}/api/s/0/groups")
    st.close()
    assert [[(x["group"], x["status"], x["attempts"]) for x in s] for s in states] == [
        [("cg_pop", "finished", None)], [("cg_pop", "in flight", 2)], [("cg_pop", "not delivered yet", None)]]
    assert states[1][0]["invisibleUntil"] == until
    assert [q["inFlight"] for q in groups["groups"][0]["queues"]] == [1]
    assert groups["groups"][0]["lag"] == 2


def test_recovery_dry_run_of_a_crashed_store():
    if not (CRASHED_498 / "store").is_dir():
        pytest.skip("crashed fixture not available")
    path = str(CRASHED_498 / "store")
    with MessageStore(path, read_only=True) as s:
        want = s.recovery
    with running([path]) as (url, c):
        url = url.rstrip("/")
        import re
        csrf = re.search(r'name="csrf" content="([^"]+)"', _get(f"{url}/s/0/health")[2].decode()).group(1)
        task = json.loads(_get(f"{url}/api/s/0/tasks?kind=recovery", {"X-Console-CSRF": csrf}, "POST")[2])
        while task["state"] == "running":
            time.sleep(0.05)
            task = _json(f"{url}/api/tasks/{task['id']}")
        assert _json(f"{url}/api/s/0/overview")["cleanShutdown"] is False
    assert task["state"] == "done", task
    assert task["result"]["dryRun"] is True and task["result"]["cleanShutdown"] is False
    assert task["result"]["endOffset"] == want.end_offset


def test_cli_console_serves_and_refuses_a_non_store(tmp_path, generated):
    import subprocess
    import sys
    bad = subprocess.run([sys.executable, "-m", "rmqstore.cli", "console", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "not a RocketMQ store" in bad.stderr
    proc = subprocess.Popen([sys.executable, "-m", "rmqstore.cli", "console", generated, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("rmqstore console: 1 store(s) at http://127.0.0.1:")
        url = line.split(" at ")[1].strip().rstrip("/")
        assert _json(f"{url}/api/stores")[0]["path"] == generated
    finally:
        proc.terminate()
        proc.wait(10)


def _csrf(url):
    import re
    return re.search(r'name="csrf" content="([^"]+)"', _get(f"{url}/s/0/dlq")[2].decode()).group(1)


def test_dlq_resend_only_with_a_writer_and_csrf(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, CFG) as w:
        dead = w.put(Message("%DLQ%cg_dead", b"dead body", tags="T1", keys=["k1", "k2"],
                             properties={"DLQ_ORIGIN_TOPIC": "Origin", "DLQ_ORIGIN_MESSAGE_ID": "ABC", "user": "v"}))
        plain = w.put(Message("Origin", b"alive"))
        w.wait_dispatched()
        with running([root]) as (url, _):   # no writer: the console writes nothing
            url = url.rstrip("/")
            assert "resend" not in _get(f"{url}/s/0/dlq")[2].decode().split("<main>")[1].split("Read-only")[0]
            status, _, body = _get(f"{url}/api/s/0/dlq/resend?offset={dead.phy_offset}",
                                   {"X-Console-CSRF": _csrf(url)}, "POST")
            assert status == 403 and b"writes are off" in body
        with running([root], writer=w) as (url, _):
            url = url.rstrip("/")
            assert 'class="resend"' in _get(f"{url}/s/0/dlq")[2].decode()
            assert _get(f"{url}/api/s/0/dlq/resend?offset={dead.phy_offset}", method="POST")[0] == 403
            csrf = _csrf(url)
            status, _, body = _get(f"{url}/api/s/0/dlq/resend?offset={plain.phy_offset}", {"X-Console-CSRF": csrf},
                                   "POST")
            assert status == 400 and b"not a %DLQ% topic" in body
            status, _, body = _get(f"{url}/api/s/0/dlq/resend?offset={dead.phy_offset}", {"X-Console-CSRF": csrf},
                                   "POST")
            assert status == 200, body
        out = json.loads(body)
        m = w.get_by_offset(out["commitLogOffset"])
    assert (m.topic, bytes(m.body), m.tags, m.properties["KEYS"]) == ("Origin", b"dead body", "T1", "k1 k2")
    assert m.properties["user"] == "v" and m.properties["CONSOLE_RESENT_FROM"] == dead.msg_id
    assert "DLQ_ORIGIN_TOPIC" not in m.properties
    assert (out["topic"], out["queueId"], out["queueOffset"], out["msgId"]) == \
        ("Origin", m.queue_id, m.queue_offset, m.msg_id)


def test_unique_key_and_offset_lookups(console):
    url, c = console
    if len(c.stores.stores) < 2:
        pytest.skip("4.9.8 fixture not available")
    s = c.stores[1].store()
    m = next(x for x in s.scan() if x.topic == "TopicA" and x.uniq_key and x.properties.get("KEYS"))
    page = _json(f"{url}/api/s/1/lookup?kind=uniq&topic=TopicA&value={m.uniq_key}")
    assert [x["msgId"] for x in page["messages"]] == [m.msg_id]
    token = m.properties["KEYS"].split()[0]   # a KEYS token is not a unique key
    assert _json(f"{url}/api/s/1/lookup?kind=uniq&topic=TopicA&value={urllib.request.quote(token)}")["messages"] == []
    page = _json(f"{url}/api/s/1/lookup?kind=offset&value={m.phy_offset}")
    assert [x["msgId"] for x in page["messages"]] == [m.msg_id]
    assert _get(f"{url}/api/s/1/lookup?kind=offset&value={m.phy_offset + 1}")[0] in (400, 404)


def test_consumer_groups_lists_committed_pairs(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, CFG) as w:
        w.put(Message("A", b"x"))
        w.commit_offset("g2", "A", 0, 1)
        w.commit_offset("g1", "A", 0, 1)
        w.commit_offset("g1", "B", 3, 0)
    with open(os.path.join(root, "config", "consumerOffset.json")) as f:
        table = json.load(f)
    table["offsetTable"]["no-separator"] = {"0": 1}   # RocketMQ skips keys that are not topic@group
    with open(os.path.join(root, "config", "consumerOffset.json"), "w") as f:
        json.dump(table, f)
    with MessageStore(root, CFG, read_only=True) as s:
        assert s.consumer_groups() == [("g1", "A"), ("g1", "B"), ("g2", "A")]


def test_serve_with_console(tmp_path):
    pytest.importorskip("grpc", reason="the endpoint extra is not installed")
    import subprocess
    import sys
    store = str(tmp_path / "store")
    proc = subprocess.Popen([sys.executable, "-m", "rmqstore.cli", "serve", store, "--create", "--listen",
                             "127.0.0.1:0", "--console", "127.0.0.1:0", "--segment-size", str(1 << 20),
                             "--index-slots", "1000", "--index-entries", "4000"],
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            if "rmqstore console at " in line:
                url = line.split(" at ")[1].strip().rstrip("/")
                break
        assert url, "no console URL printed"
        assert _json(f"{url}/api/stores")[0]["path"] == store
        assert _json(f"{url}/api/s/0/overview")["messages"] == 0
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_page_out_of_time_still_moves_on(console, monkeypatch):
    """With no time left at all, each filtered page still looks at one message, so walking
    "continue" links ends, having looked at every message once."""
    from rmqstore.console.filters import make_filter
    _, c = console
    s = c.stores[0].store()
    monkeypatch.setattr(limits, "DEADLINE", 0.0)
    pos = browser.start_positions(s, "Hot", s.queue_ids("Hot"), True, None, None)
    found, pages, looked = [], 0, 0
    while pos is not None:
        page = browser.browse(s, "Hot", pos, True, 10, None, make_filter("need.e", "regex"))
        found += [m["tags"] for m in page["messages"]]
        looked += page["scanned"]
        pages += 1
        pos = browser.parse_positions(page["next"]) if page["next"] else None
    total = sum(s.max_offset("Hot", q) for q in s.queue_ids("Hot"))
    assert found == ["Needle"] and looked == total and pages == total


def test_a_page_without_the_scan_slot_looks_at_one_message(console):
    """While another filtered scan holds the slot until this page's time is up, the page
    looks at one message and hands back its continue link (it neither waits on nor runs
    beside the other scan); once the slot is free, a page scans on from there."""
    from rmqstore.console.filters import make_filter
    _, c = console
    s = c.stores[0].store()
    pos = browser.start_positions(s, "Hot", s.queue_ids("Hot"), True, None, None)
    with browser._SCAN_SLOTS:
        page = browser.browse(s, "Hot", pos, True, 10, None, make_filter("need"), deadline=time.monotonic())
    assert page["scanned"] == 1 and not page["complete"] and page["next"]
    first = [m for q in s.queue_ids("Hot") for m in s.get_messages("Hot", q, 0, 1).messages]
    oldest = min(first, key=lambda m: (m.store_timestamp, m.phy_offset))
    assert browser.parse_positions(page["next"]) == {**pos, oldest.queue_id: 1}
    rest = browser.browse(s, "Hot", browser.parse_positions(page["next"]), True, 10, None, make_filter("need"))
    assert rest["scanned"] > 1


def test_cli_console_takes_a_foreign_index_geometry(tmp_path):
    import subprocess
    import sys
    root = str(tmp_path / "odd")
    with MessageStore(root, StoreConfig(index_slots=64, index_entries=512)) as w:   # not RocketMQ's 1:4
        w.put(Message("T", b"x", keys="k"))
    cmd = [sys.executable, "-m", "rmqstore.cli", "console", root, "--listen", "127.0.0.1:0"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--index-slots" in bad.stderr
    proc = subprocess.Popen(cmd + ["--index-slots", "64", "--index-entries", "512"], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split(" at ")[1].strip().rstrip("/")
        assert len(_json(f"{url}/api/s/0/lookup?kind=key&topic=T&value=k")["messages"]) == 1
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_deeply_nested_body_is_shown_as_text(tmp_path):
    """A body of 5000 '[' makes json.loads raise RecursionError: the message page still
    answers, with the text view and no JSON view."""
    root = str(tmp_path / "store")
    with MessageStore(root, CFG) as w:
        deep = w.put(Message("Deep", b"[" * 5000))
        fine = w.put(Message("Deep", b'{"a": [1, 2]}'))
    with running([root]) as (url, _):
        url = url.rstrip("/")
        doc = _json(f"{url}/api/s/0/message?offset={deep.phy_offset}")
        assert doc["views"]["json"] is None and doc["views"]["text"] == "[" * 5000
        assert _get(f"{url}/s/0/message?offset={deep.phy_offset}")[0] == 200
        assert json.loads(_json(f"{url}/api/s/0/message?offset={fine.phy_offset}")["views"]["json"]) == {"a": [1, 2]}


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_open_files_stay_bounded_on_a_live_store(tmp_path, monkeypatch):
    """While a writer appends, every look finds the store changed and reopens: a replaced
    handle is closed when its last request ends, so the open files stay about one handle's
    (each holds a file per queue) instead of growing with every reopening."""
    import threading

    from rmqstore.console import stores
    monkeypatch.setattr(stores, "RECHECK_SECONDS", 0.02)
    root = str(tmp_path / "store")
    queues = 40
    with MessageStore(root, CFG) as w:
        for q in range(queues):
            w.put(Message("Wide", b"first"), queue_id=q)
        w.wait_dispatched()
        before = _open_fds()
        with MessageStore(root, CFG, read_only=True) as extra:
            extra.get_messages("Wide", 0, 0, 1)
            handle_fds = _open_fds() - before
        assert handle_fds >= queues   # a file per queue at least: a leaked handle shows
        stop = threading.Event()

        def append():
            i = 0
            while not stop.is_set():
                w.put(Message("Wide", b"m%d" % i), queue_id=i % queues)
                i += 1
                time.sleep(0.002)

        t = threading.Thread(target=append, daemon=True)
        t.start()
        try:
            with running([root]) as (url, c):
                url = url.rstrip("/")
                start, most = _open_fds(), 0
                ends = time.monotonic() + 4
                while time.monotonic() < ends or (c.stores[0].generation < 10 and time.monotonic() < ends + 60):
                    assert _get(f"{url}/api/s/0/topic?name=Wide")[0] == 200
                    most = max(most, _open_fds())
                reopened = c.stores[0].generation
        finally:
            stop.set()
            t.join(10)
    assert reopened >= 10   # the test did make the console reopen
    # at any time: the current handle, a fresh one being opened and one a request still reads
    assert most - start <= 3 * handle_fds, (most - start, handle_fds, reopened)


def test_any_loopback_address_serves(generated):
    """--listen 127.0.0.2 is loopback (no token) and its requests name it in Host."""
    try:
        cm = running([generated], "127.0.0.2:0")
        url, _ = cm.__enter__()
    except OSError as e:
        pytest.skip(f"127.0.0.2 cannot be bound here: {e}")
    try:
        assert "token=" not in url
        url = url.rstrip("/")
        assert _get(f"{url}/api/s/0/overview")[0] == 200
        assert _get(f"{url}/api/s/0/overview", {"Host": "localhost"})[0] == 200
        assert _get(f"{url}/api/s/0/overview", {"Host": "attacker.example:80"})[0] == 421
    finally:
        cm.__exit__(None, None, None)


def _first_event(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.readline() + r.readline() + r.readline() + r.readline()


def test_tail_from_a_bad_position_is_refused(console):
    url, c = console
    s = c.stores[0].store()
    end = s.max_phy_offset
    for bad in (f"{url}/api/s/0/tail/events?from=7", f"{url}/api/s/0/tail/events?from={end + 1}"):
        status, _, body = _get(bad)
        assert status == 400 and "error" in json.loads(body), body
    assert _get(f"{url}/api/s/0/tail/events", {"Last-Event-ID": "7"})[0] == 400
    assert _get(f"{url}/api/s/0/tail/events", {"Last-Event-ID": "9" * 5000})[0] == 400
    second = next(iter(s.scan(0)))
    for start in (0, second.store_size, end):   # a record's start, or the end: the stream starts there
        status, head = _first_event(f"{url}/api/s/0/tail/events?from={start}")
        assert status == 200 and f"id: {start}\n".encode() in head and b"event: hello" in head


@pytest.mark.parametrize("path", ["/api/s/{n}/overview", "/api/s/{n}/message/raw?offset=0",
                                  "/api/s/0/message/raw?offset={n}", "/api/s/0/lookup?kind=offset&value={n}",
                                  "/api/s/0/message?offset={n}", "/api/s/0/browse?topic=Hot&queues=0,{n}",
                                  "/api/s/0/browse?topic=Hot&time={n}"])
def test_huge_numbers_are_refused(console, path):
    """Numbers of thousands of digits (int() refuses more than 4300; a 4000-digit offset
    overflows the store's API) are a 400 naming the parameter, never a 500."""
    url, _ = console
    for n in ("9" * 4000, "9" * 5000):
        status, _, body = _get(url + path.format(n=n))
        assert status == 400, (path, len(n), body[:200])
    status, _, body = _get(f"{url}/api/s/{'9' * 5000}/dlq/resend?offset=0", {"X-Console-CSRF": "x"}, "POST")
    assert status == 400


def test_a_bad_queue_id_is_named(console):
    url, _ = console
    status, _, body = _get(f"{url}/api/s/0/browse?topic=Hot&queues=0,x")
    assert status == 400 and "'x'" in json.loads(body)["error"]
    assert _json(f"{url}/api/s/0/browse?topic=Hot&queues=0,")["messages"]   # an empty item is no id


def test_pop_state_is_read_again_only_when_its_files_change(tmp_path):
    from rmqstore.console import pop
    from rmqstore.pop_state import PopState
    root = str(tmp_path / "store")
    with MessageStore(root, CFG) as s:
        s.put(Message("Pop", b"m"), queue_id=0)
    st = PopState(root)
    st.sync(st.append([["n", "cg_pop", "Pop", 0, 1]]))
    first = pop.read_state(root)
    assert pop.read_state(root) is first and first.queues[("cg_pop", "Pop", 0)].next == 1
    st.sync(st.append([["n", "cg_pop", "Pop", 0, 2]]))
    again = pop.read_state(root)
    st.close()
    assert again is not first and again.queues[("cg_pop", "Pop", 0)].next == 2


def test_key_pages_stay_exact_while_the_store_grows(tmp_path, monkeypatch):
    """A key lookup's next link, followed after more hits were appended and the console
    reopened the store, goes on where the page stopped (nothing skipped or repeated); a
    fresh lookup then starts with the new hits. A message naming the key twice (UNIQ_KEY
    and KEYS, KEYS twice) is listed once, also when its entries straddle a page."""
    from rmqstore.console import stores
    monkeypatch.setattr(stores, "RECHECK_SECONDS", 0.0)
    root = str(tmp_path / "store")
    with MessageStore(root, CFG) as w:
        puts = [w.put(Message("K", b"v%d" % i, keys="same same" if i % 3 else "same")) for i in range(30)]
        w.wait_dispatched()
        with running([root]) as (url, c):
            url = url.rstrip("/")
            page = _json(f"{url}/api/s/0/lookup?kind=key&topic=K&value=same&size=7")
            first = c.stores[0].generation
            newer = [w.put(Message("K", b"new%d" % i, keys="same")) for i in range(3)]
            w.wait_dispatched()
            for _ in range(200):
                _json(f"{url}/api/s/0/overview")
                if c.stores[0].generation > first:
                    break
                time.sleep(0.02)
            assert c.stores[0].generation > first
            got, nxt = [m["msgId"] for m in page["messages"]], page["next"]
            while nxt:
                more = _json(f"{url}/api/s/0/lookup?kind=key&topic=K&value=same&size=7&cursor={nxt}")
                got, nxt = got + [m["msgId"] for m in more["messages"]], more["next"]
            assert got == [p.msg_id for p in reversed(puts)]
            fresh = _json(f"{url}/api/s/0/lookup?kind=key&topic=K&value=same&size=50")
            assert [m["msgId"] for m in fresh["messages"]] == [p.msg_id for p in reversed(puts + newer)]
            name = page["next"].split(".")[0]
            for bad in ("x", "1:2", "nofile.3:5", f"{name}.99999999999:1", f"{name}.999999:1", f"{name}.-1:1"):
                assert _get(f"{url}/api/s/0/lookup?kind=key&topic=K&value=same&cursor={bad}")[0] == 400
