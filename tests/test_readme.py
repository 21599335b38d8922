"""Every code block of README.md and docs/*.md, run as shown, so the docs cannot drift from
the code. Shell lines run against a copy of the RocketMQ 4.9.8 fixture store, with the
placeholders substituted (STORE, STORE2, MSGID, PHYOFFSET, KEY); Python blocks run as
scripts, in page order in one directory a page, with the paths under ``/data/`` moved
into it (``/data/brokers/a/store`` is a copy of the same store). The only shell lines not
run are listed in SKIP with the reason, blocks that cannot run here carry a
``<!-- norun: reason -->`` tag and are counted in NORUN, and the Spark blocks run in the
slow suite."""
import json
import re
import subprocess
import sys
from collections import Counter

import pytest
from doc_pages import ROOT, RUNNABLE, blocks, name, pages

from conftest import copy_store

SKIP = {
    r"^pip install": "installs packages (the test environment has them)",
    r"\basv ": "runs the whole benchmark suite for minutes; tests/test_bench.py runs this asv sequence on one "
               "benchmark",
    r"^rmqstore serve": "serves until stopped; tests/test_endpoint*.py run the endpoint with the official client",
    r"^rmqstore console": "serves until stopped; tests/test_console*.py drive it in headless Chromium",
    r"\bpdoc\b": "builds the API pages (and the site); tests/test_typing.py and tests/test_doc_links.py build them",
}
SLOW = r"^rmqstore spark|\brmqstore\.spark\b"
SLOW_REASON = "starts Spark in local mode (Java, about 20 s a job)"
# page -> blocks tagged norun; a new tag must be counted here
NORUN = {"docs/benchmarks.md": 1, "docs/dispatch.md": 1, "docs/endpoint.md": 2}
# What a block's output must show, where the page says what it prints.
SHOWS = {
    "README.md": ["FOUND 32 32", "[b'payload']", "received [b'hello']", "dry run"],
    "docs/guide.md": ["[0, 1, 2, 3]", "TopicA"],
    "docs/cli.md": ['"body": "hello"'],
    "docs/operating.md": ["dry run"],
}
SHOWS_SLOW = {"docs/spark.md": ["True"]}


def shell_lines(body):
    """The commands of a bash/sh/console block, in order (continuations joined, console
    prompts stripped, blank and comment-only lines left out)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _matching(line, table):
    return next((reason for pattern, reason in table.items() if re.search(pattern, line)), None)


def _steps(page):
    """(kind, text) for what the page runs, in order: ("sh", line) or ("py", block)."""
    for b in blocks(page):
        if b.norun is not None:
            continue
        if b.lang == "python":
            yield "py", b.body
        else:
            yield from (("sh", line) for line in shell_lines(b.body))


def _is_slow(text):
    return re.search(SLOW, text, re.M) is not None


def test_every_block_is_runnable_and_every_norun_is_counted():
    norun, langs = Counter(), Counter()
    for page in pages():
        for b in blocks(page):
            langs[b.lang] += 1
            assert b.lang in RUNNABLE, f"{b.page}:{b.line}: a ```{b.lang} block (runnable: {sorted(RUNNABLE)})"
            if b.norun is not None:
                assert len(b.norun) >= 10, f"{b.page}:{b.line}: say why the block cannot run here"
                norun[b.page] += 1
        tags = page.read_text(encoding="utf-8").count("<!-- norun:")
        assert tags == norun[name(page)], f"{name(page)}: a norun tag not right above its block's fence"
    assert dict(norun) == NORUN
    assert langs["python"] >= 8 and langs["bash"] >= 10


def test_docs_have_shell_lines_and_every_skip_is_used():
    lines = [text for page in pages() for kind, text in _steps(page) if kind == "sh"]
    assert len(lines) >= 25
    for pattern in SKIP:
        assert any(re.search(pattern, line) for line in lines), f"skip rule {pattern!r} matches nothing"
    assert any(_is_slow(line) for line in lines)


def _run_page(page, clean_498, tmp_path, slow):
    """Run the page's steps (the slow ones, or the others) in ``tmp_path``; returns what
    they printed, one string per step run."""
    store, man = clean_498
    copy_store(store, tmp_path)
    if any('"/data/' in text for kind, text in _steps(page) if kind == "py"):
        copy_store(store, tmp_path / "data" / "brokers" / "a")
    msg = man["messages"][0]
    subs = {"STORE2": str(tmp_path / "store2"), "STORE": str(tmp_path / "store"), "MSGID": msg["msgId"],
            "PHYOFFSET": str(msg["commitLogOffset"]), "KEY": msg["keys"].split()[0]}
    prelude = f'rmqstore() {{ "{sys.executable}" -m rmqstore "$@"; }}\npython() {{ "{sys.executable}" "$@"; }}\n'
    out = []
    for i, (kind, text) in enumerate(_steps(page)):
        if kind == "sh" and _matching(text, SKIP) or _is_slow(text) != slow:
            continue
        if kind == "sh":
            cmd = text
            for name, value in subs.items():
                cmd = re.sub(rf"\b{name}\b", value, cmd)
            argv = ["bash", "-c", prelude + cmd]
        else:
            script = tmp_path / f"block{i}.py"
            script.write_text(text.replace('"/data/', f'"{tmp_path}/data/'), encoding="utf-8")
            argv = [sys.executable, str(script)]
        p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        allowed = {0, 3} if "exit status 3" in text else {0}
        assert p.returncode in allowed, (text, p.returncode, p.stdout[-1500:], p.stderr[-3000:])
        assert "Traceback" not in p.stderr, (text, p.stderr[-3000:])
        out.append(p.stdout)
    return out


FAST_PAGES = [p for p in pages() if any(not _is_slow(t) and not (k == "sh" and _matching(t, SKIP))
                                        for k, t in _steps(p))]
SLOW_PAGES = [p for p in pages() if any(_is_slow(t) for _, t in _steps(p))]


@pytest.mark.parametrize("page", FAST_PAGES, ids=lambda p: p.name)
def test_page_runs(page, clean_498, tmp_path):
    out = "\n".join(_run_page(page, clean_498, tmp_path, slow=False))
    key = name(page)
    for shown in SHOWS.get(key, []):
        assert shown in out, (key, shown)
    if key == "docs/cli.md":   # the dump holds every message of the fixture store
        dumped = (tmp_path / "msgs.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(dumped) == len(clean_498[1]["messages"])
        assert {json.loads(line)["msgId"] for line in dumped} == {m["msgId"] for m in clean_498[1]["messages"]}


def test_expected_output_names_pages_that_run():
    assert set(SHOWS) <= {name(p) for p in FAST_PAGES} and set(SHOWS_SLOW) <= {name(p) for p in SLOW_PAGES}


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES, ids=lambda p: p.name)
def test_page_spark_blocks_run(page, clean_498, tmp_path):
    pytest.importorskip("pyspark")
    out = "\n".join(_run_page(page, clean_498, tmp_path, slow=True))
    key = name(page)
    for shown in SHOWS_SLOW.get(key, []):
        assert shown in out, (key, shown)
    if key == "docs/spark.md":   # local mode and the standalone cluster both count every message
        assert out.split().count(str(len(clean_498[1]["messages"]))) == 2, out


def test_asv_conf_names_this_project():
    """asv benchmarks this checkout ("repo": ".."), not RocketMQ's repository."""
    conf = json.loads((ROOT / "asv_bench" / "asv.conf.json").read_text())
    assert conf["repo"] == ".." and conf["project"] == "rmqstore"
    assert "rocketmq" not in json.dumps({k: v for k, v in conf.items() if k != "project"}).lower()
