"""What the rmqstore command prints: one JSON key convention (camelCase) for every
subcommand, tables with local ISO-8601 times and columns aligned by display width."""
import json
import re
import subprocess
import sys
import time
import unicodedata
from datetime import datetime

from test_cli import ENV, put, run

from conftest import copy_store

CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def _keys(obj, path=""):
    """Every dict key in ``obj`` with its path, skipping the keys of ``properties`` (message data)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}", k
            if k != "properties":
                yield from _keys(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for v in obj:
            yield from _keys(v, path + "[]")


def _documents(text):
    """A JSON document, or JSON lines."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines()]


def test_every_json_output_uses_camel_case(clean_498, tmp_path):
    store, man = clean_498
    copy = copy_store(store, tmp_path)
    m = man["messages"][0]
    commands = [["stats", copy], ["get", copy, "--topic", "TopicA", "--queue", 2, "--offset", 0, "--count", 2],
                ["msg", copy, m["msgId"]], ["at", copy, m["commitLogOffset"]],
                ["query", copy, "--topic", "TopicA", "--key", "order-0"], ["dump", copy, "--to", 20000],
                ["recover", copy], ["digest", copy], ["diff", copy, store], ["verify", copy],
                ["clean", copy, "--now", time.time()], ["rebuild", copy], ["rebuild", copy, "--yes"],
                ["recover", copy, "--yes"],
                ["bench", "--messages", 50, "--no-peers", "--dir", tmp_path / "bench"]]
    seen = set()
    for cmd in commands:
        out = run(*cmd, "--json").stdout
        for doc in _documents(out):
            bad = [p for p, k in _keys(doc) if not CAMEL.match(k)]
            assert not bad, (cmd[0], bad)
            seen.update(k for _, k in _keys(doc))
        assert out.strip(), cmd
    # the keys that were snake_case before: recover, clean and verify
    assert {"cleanShutdown", "endOffset", "dryRun", "segmentsDeleted", "problemsOmitted", "bytesFreed"} <= seen
    res = put(tmp_path / "new", {"topic": "T", "body": "x"}, extra=("--create", "--segment-size", "4096"))
    assert all(CAMEL.match(k) for k in res[0])



def test_errors_with_json_are_json_on_stdout(clean_498, tmp_path):
    """With --json a failing command (a usage error, a store error, a missing store) prints
    one JSON object naming the error and its exit status on stdout, besides its line on stderr."""
    store, _ = clean_498
    (tmp_path / "file").write_text("x")
    cases = [(2, ["get", store, "--topic", "T"]), (2, ["at", store, "-5"]), (4, ["at", store, 3]),
             (1, ["stats", tmp_path / "file"]), (1, ["verify", tmp_path / "none"]), (2, ["stats", "--bogus"])]
    for status, cmd in cases:
        p = run(*cmd, "--json", expect=status)
        err = p.stderr.removeprefix("rmqstore: error: ").rstrip("\n")
        assert json.loads(p.stdout) == {"error": err, "exit": status}, cmd
        assert "\n" not in err and err

def _width(text):
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def test_tables_align_by_display_width_and_show_local_times(clean_498):
    store, man = clean_498
    out = run("stats", store).stdout
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("topic "))
    column = lines[header].index("queue")
    rows = lines[header + 1:lines.index("", header)]
    cjk = [r for r in rows if r.startswith("主题")]
    assert cjk and len(rows) > len(cjk)
    for r in rows:     # the queue number starts under "queue" in every row, CJK topics included
        prefix = re.match(r"^(.*\S +)\d+ +\d+ +\d+ +\d+$", r).group(1)
        assert _width(prefix) == column, r
    # the checkpoint has its own heading, its times as local ISO-8601 (epoch ms stay in JSON)
    assert "\ncheckpoint\n" in out
    ms = man["checkpoint"]["physicMsgTimestamp"]
    local = datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    assert re.search(rf"physic msg timestamp +{re.escape(local)}\n", out)
    assert str(ms) not in out
    m = man["messages"][0]
    out = run("at", store, m["commitLogOffset"]).stdout
    when = datetime.fromtimestamp(m["storeTimestamp"] / 1000).astimezone().isoformat(timespec="milliseconds")
    assert f"store timestamp              {when}" in out


def test_recover_prints_rounded_seconds(clean_498):
    out = run("recover", clean_498[0]).stdout
    assert re.search(r"\n  seconds +\d+\.\d{3}\n", out), out
    assert run("--help").stdout.count("``") == 0


def test_helps_of_the_modules():
    """python -m rmqstore.spark.demo / rmqstore.bench: whole descriptions, every option explained,
    and one line naming the [bench] extra when LMDB is missing."""
    demo = subprocess.run([sys.executable, "-m", "rmqstore.spark.demo", "--help"], capture_output=True, text=True,
                          env=ENV, timeout=60).stdout
    assert "print figures." in " ".join(demo.split()) and "``" not in demo
    assert re.search(r"--stores N +\w", demo) and re.search(r"--messages N +\w", demo)
    hide_lmdb = "import sys; sys.modules['lmdb'] = None; from rmqstore import bench; print(bench.systems())"
    p = subprocess.run([sys.executable, "-c", hide_lmdb], capture_output=True, text=True, env=ENV, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "LMDB left out" in lines[0] and "rmqstore[bench]" in lines[0]
    assert "Lmdb" not in p.stdout and "Sqlite" in p.stdout
