"""The console in a real browser (headless Chromium from Debian, driven by Selenium through
/usr/bin/chromedriver): every page on the RocketMQ 4.9.8 and 5.3.3 fixtures and a generated
store, what is shown compared with the library's own answers, a store of hostile strings
rendered inert, and a message put after the tail page opened arriving in it. One browser
and one console (serving all the stores) for the module. Screenshots of every page go to
the test's tmp directory."""
import os
import time

import pytest
from test_console_api import queue_messages

from rmqstore import Message, MessageStore, StoreConfig

from conftest import CLEAN_498, V2_533

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the [test] extra)")
pytest.importorskip("starlette", reason="the [console] extra is not installed")
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from rmqstore.console import running  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                reason="headless Chromium is not installed (apt-get install chromium chromium-driver; "
                                       ".ci/run does)")
HOSTILE = "<script>window.__pwned=1</script>\"'&\u202egnp.exe\x1b[2J\x07"
HOSTILE_TOPIC = "<img src=x onerror=\"window.__pwned=1\">\u202e'"
GROUP = "cg_console"


def _generated(root):
    """A store with orders over 4 queues (keys, tags), a DLQ, committed offsets and hostile
    strings in a topic, tags, keys, properties and bodies."""
    cfg = StoreConfig(commitlog_file_size=1 << 20, consume_queue_entries=100, index_slots=1000, index_entries=4000,
                      strict_topic_names=False)
    with MessageStore(root, cfg) as s:
        for i in range(300):
            s.put(Message("Orders", f'{{"order": {i}}}'.encode(), tags=f"Tag{i % 3}", keys=[f"order-{i}", "shared"]))
        for i in range(5):
            s.put(Message("%DLQ%" + GROUP, f"dead {i}".encode(), keys=f"dead-{i}",
                          properties={"RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": f"ORIGIN{i:028d}"}))
        for _ in range(3):
            s.put(Message("Orders", HOSTILE.encode(), tags=HOSTILE, keys=[HOSTILE, "hostile"],
                          properties={HOSTILE: HOSTILE}))
            s.put(Message(HOSTILE_TOPIC, HOSTILE.encode(), tags=HOSTILE, keys="hostile"))
        s.wait_dispatched()
        for q in s.queue_ids("Orders"):
            s.commit_offset(GROUP, "Orders", q, 10 * (q + 1))
    return cfg


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(paths served, tmp dir): the two fixtures and the generated store."""
    for f in (CLEAN_498, V2_533):
        if not (f / "store").is_dir():
            pytest.skip(f"fixture store {f} not available")
    tmp = tmp_path_factory.mktemp("console")
    _generated(str(tmp / "generated"))
    return [str(CLEAN_498 / "store"), str(V2_533 / "store"), str(tmp / "generated")], tmp


@pytest.fixture(scope="module")
def console(stores):
    with running(stores[0]) as (url, c):
        yield url.rstrip("/"), c


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
              "--disable-gpu", "--no-first-run"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def _open(browser, url, shots, name):
    browser.get(url)
    assert browser.execute_script("return window.__pwned") is None
    browser.save_screenshot(str(shots / f"{name}.png"))
    return browser


def _texts(browser, css):
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, css)]


def _rows(browser, table):
    return [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")]


def _merged(s, topic):
    """Every message of ``topic`` in the browser's oldest-first order: by store time,
    then commitlog offset (read from the library, queue by queue)."""
    return sorted(queue_messages(s, topic), key=lambda m: (m.store_timestamp, m.phy_offset))


@pytest.mark.parametrize("number", [0, 1, 2], ids=["rocketmq-4.9.8", "rocketmq-5.3.3", "generated"])
def test_every_page(console, browser, stores, number, tmp_path):
    url, c = console
    s = c.stores[number].store()
    base = f"{url}/s/{number}"
    _open(browser, f"{base}/overview", tmp_path, "overview")
    total = sum(s.max_offset(t, q) - s.min_offset(t, q) for t in s.topics() for q in s.queue_ids(t))
    assert browser.find_element(By.ID, "messages").text == str(total)
    assert browser.find_element(By.ID, "max-offset").text == str(s.max_phy_offset)
    assert browser.find_element(By.ID, "topic-count").text == str(len(s.topics()))

    browser.find_element(By.ID, "nav-topics").click()
    browser.save_screenshot(str(tmp_path / "topics.png"))
    rows = _rows(browser, "topics")
    assert len(rows) == len(s.topics())
    counts = {t: sum(s.max_offset(t, q) - s.min_offset(t, q) for q in s.queue_ids(t)) for t in s.topics()}
    assert sorted(int(r[3]) for r in rows) == sorted(counts.values())
    topic = max(counts, key=lambda t: (counts[t], t.isascii()))   # the biggest topic
    browser.find_element(By.CSS_SELECTOR, f"#topics a.topic[href*='{_quoted(topic)}']").click()
    browser.save_screenshot(str(tmp_path / "topic.png"))
    assert len(_rows(browser, "queues")) == len(s.queue_ids(topic))
    assert browser.find_element(By.ID, "topic-messages").text == str(counts[topic])

    browser.find_element(By.ID, "browse").click()
    browser.save_screenshot(str(tmp_path / "browse.png"))
    expected = _merged(s, topic)
    shown = _texts(browser, "table.messages a.msg")
    assert shown == [m.msg_id for m in expected[:50]]
    assert [" ".join(k.split()) for k in _texts(browser, "table.messages td.keys")] == \
        [" ".join((m.properties.get("KEYS") or "").split()) for m in expected[:50]]
    browser.find_element(By.ID, "next").click()
    assert _texts(browser, "table.messages a.msg") == [m.msg_id for m in expected[50:100]]
    browser.find_element(By.ID, "prev").click()
    assert _texts(browser, "table.messages a.msg") == shown

    m = expected[len(expected) // 2]
    _open(browser, f"{base}/browse?topic={_quoted(topic)}&time={m.store_timestamp}&size=5", tmp_path, "browse-time")
    first = [x for x in expected if x.store_timestamp >= m.store_timestamp][:5]
    assert _texts(browser, "table.messages a.msg") == [x.msg_id for x in first]

    browser.find_element(By.CSS_SELECTOR, "table.messages a.msg").click()
    browser.save_screenshot(str(tmp_path / "message.png"))
    got = s.get_by_offset(first[0].phy_offset)
    assert browser.find_element(By.ID, "f-msgId").text == got.msg_id
    assert browser.find_element(By.ID, "f-commitLogOffset").text == str(got.phy_offset)
    assert browser.find_element(By.ID, "f-queueOffset").text == str(got.queue_offset)
    browser.find_element(By.ID, "view-hex").click()
    assert browser.find_element(By.ID, "body").text.startswith("00000000")

    key = next(k for x in expected for k in (x.properties.get("KEYS") or "").split(" ") if k)
    holders = [x.msg_id for x in sorted(s.scan(), key=lambda x: -x.phy_offset)
               if x.topic == topic and key in (x.properties.get("KEYS") or "").split(" ")]
    _open(browser, f"{base}/lookup?kind=key&topic={_quoted(topic)}&value={_quoted(key)}&size=7", tmp_path, "lookup")
    found = _texts(browser, "table.messages a.msg")
    while browser.find_elements(By.ID, "next"):
        browser.find_element(By.ID, "next").click()
        found += _texts(browser, "table.messages a.msg")
    assert found == holders
    _open(browser, f"{base}/lookup?kind=msgid&value={got.msg_id}", tmp_path, "lookup-msgid")
    assert _texts(browser, "table.messages a.msg") == [got.msg_id]

    _open(browser, f"{base}/groups", tmp_path, "groups")
    lag = {g: sum(max(0, s.max_offset(t, q) - (s.committed_offset(g, t, q) if s.committed_offset(g, t, q) >= 0
                                                else s.min_offset(t, q))) for q in s.queue_ids(t))
           for g, t in s.consumer_groups()}
    assert browser.find_element(By.ID, "total-lag").text == str(sum(lag.values()))
    _open(browser, f"{base}/dlq", tmp_path, "dlq")
    dlqs = [t for t in s.topics() if t.startswith("%DLQ%")]
    assert _texts(browser, ".dlq-count") == [str(counts[t]) for t in dlqs]

    _open(browser, f"{base}/health", tmp_path, "health-start")
    browser.find_element(By.ID, "start-verify").click()
    WebDriverWait(browser, 30).until(lambda b: "done" in b.find_element(By.CSS_SELECTOR, "#task-verify h2").text)
    browser.save_screenshot(str(tmp_path / "health.png"))
    result = dict(r[:2] for r in _rows_css(browser, "#task-verify table.result tbody tr"))
    report = s.verify()
    assert result["ok"] == str(report.ok).lower()
    assert result["records"] == str(report.records)
    _open(browser, f"{base}/tail", tmp_path, "tail")
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "tail-status").text == "live")


def _rows_css(browser, css):
    return [[c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in browser.find_elements(By.CSS_SELECTOR, css)]


def _quoted(text):
    from urllib.parse import quote
    return quote(text, safe="")


def test_hostile_strings_render_inert(console, browser, tmp_path):
    url, c = console
    s = c.stores[2].store()
    base = f"{url}/s/2"
    hostile = [m for m in s.scan() if m.tags == HOSTILE]
    _open(browser, f"{base}/topics", tmp_path, "hostile-topics")
    assert any("<img src=x" in t for t in _texts(browser, "#topics a.topic"))
    _open(browser, f"{base}/browse?topic={_quoted(HOSTILE_TOPIC)}", tmp_path, "hostile-browse")
    tags = _texts(browser, "table.messages td.tags")
    assert len(tags) == 3 and all(t.startswith("<script>window.__pwned=1</script>") for t in tags)
    assert all("\\u202e" in t and "\\x1b" in t and "\u202e" not in t for t in tags)   # shown, not obeyed
    _open(browser, f"{base}/message?offset={hostile[0].phy_offset}", tmp_path, "hostile-message")
    assert browser.find_element(By.ID, "body").text.startswith("<script>window.__pwned=1</script>\"'&")
    assert browser.find_element(By.ID, "f-tags").text.startswith("<script>")
    _open(browser, f"{base}/lookup?kind=key&topic=Orders&value=hostile", tmp_path, "hostile-lookup")
    assert len(_texts(browser, "table.messages a.msg")) == 3
    assert all(k.startswith("<script>window.__pwned=1</script>") for k in _texts(browser, "table.messages td.keys"))
    _open(browser, f"{base}/tail", tmp_path, "hostile-tail")
    assert browser.execute_script("return window.__pwned") is None


def test_message_put_after_opening_arrives_in_live_tail(console, browser, stores, tmp_path):
    url, c = console
    _open(browser, f"{url}/s/2/tail", tmp_path, "tail-before")
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "tail-status").text == "live")
    marker = f"tail-{time.time_ns()}"
    cfg = StoreConfig(commitlog_file_size=1 << 20, consume_queue_entries=100, index_slots=1000, index_entries=4000,
                      strict_topic_names=False)
    with MessageStore(stores[0][2], cfg) as w:
        put = w.put(Message("Orders", f"{marker} {HOSTILE}".encode(), tags="Live", keys=marker))
    try:
        WebDriverWait(browser, 20).until(lambda b: any(marker in t for t in _texts(b, "#tail tbody td")))
    except TimeoutException:
        browser.save_screenshot(str(tmp_path / "tail-missing.png"))
        raise
    browser.save_screenshot(str(tmp_path / "tail-after.png"))
    row = browser.find_element(By.CSS_SELECTOR, f"#tail tbody tr[data-offset='{put.phy_offset}']")
    assert put.msg_id in row.text
    assert browser.execute_script("return window.__pwned") is None
    browser.find_element(By.ID, "tail-pause").click()
    assert browser.find_element(By.ID, "tail-status").text == "paused"
    with MessageStore(stores[0][2], cfg) as w:   # put while paused: shown on resume, from where it paused
        during = w.put(Message("Orders", f"{marker} while paused".encode(), keys=marker + "-paused"))
    time.sleep(1)
    assert not browser.find_elements(By.CSS_SELECTOR, f"#tail tbody tr[data-offset='{during.phy_offset}']")
    browser.find_element(By.ID, "tail-pause").click()
    WebDriverWait(browser, 20).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, f"#tail tbody tr[data-offset='{during.phy_offset}']"))


def test_group_lag_refreshes_on_a_live_store(console, browser, stores, tmp_path):
    url, c = console
    _open(browser, f"{url}/s/2/groups", tmp_path, "groups-before")
    before = int(browser.find_element(By.ID, "total-lag").text)
    cfg = StoreConfig(commitlog_file_size=1 << 20, consume_queue_entries=100, index_slots=1000, index_entries=4000,
                      strict_topic_names=False)
    with MessageStore(stores[0][2], cfg) as w:
        w.commit_offset(GROUP, "Orders", 0, w.max_offset("Orders", 0))
        s = w
        lag = sum(max(0, s.max_offset(t, q) - s.committed_offset(g, t, q)) for g, t in s.consumer_groups()
                  for q in s.queue_ids(t))
    assert lag < before
    WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(   # the table is redrawn
        lambda b: b.find_element(By.ID, "total-lag").text == str(lag))
    browser.save_screenshot(str(tmp_path / "groups-after.png"))
