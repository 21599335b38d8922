"""Every shell line of README.md, run as shown against a copy of the RocketMQ 4.9.8 fixture
store, so the README cannot drift from the command. Placeholders are substituted (STORE,
STORE2, MSGID, PHYOFFSET, KEY); the only lines not run are listed in SKIP with the reason,
and the Spark lines run in the slow suite."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_store

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(bash|sh|console)\n(.*?)^```", re.M | re.S)

SKIP = {
    r"^pip install": "installs packages (the test environment has them)",
    r"\basv ": "runs the whole benchmark suite for minutes; tests/test_bench.py runs this asv sequence on one "
               "benchmark",
    r"^rmqstore serve": "serves until stopped; tests/test_endpoint*.py run the endpoint with the official client",
}
SLOW = {r"^rmqstore spark": "starts Spark in local mode (Java, about 20 s a job)"}


def shell_lines(text):
    """The commands of the README's bash/sh/console blocks, in order (continuations joined,
    console prompts stripped, blank and comment-only lines left out)."""
    out = []
    for _, body in FENCE.findall(text):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _matching(line, table):
    return next((reason for pattern, reason in table.items() if re.search(pattern, line)), None)


def test_readme_has_shell_lines_and_every_skip_is_used():
    lines = shell_lines(README.read_text(encoding="utf-8"))
    assert len(lines) >= 20
    for table in (SKIP, SLOW):
        for pattern in table:
            assert any(re.search(pattern, line) for line in lines), f"skip rule {pattern!r} matches nothing"


def _run_readme(clean_498, tmp_path, slow):
    store, man = clean_498
    copy_store(store, tmp_path)
    msg = man["messages"][0]
    subs = {"STORE2": str(tmp_path / "store2"), "STORE": str(tmp_path / "store"), "MSGID": msg["msgId"],
            "PHYOFFSET": str(msg["commitLogOffset"]), "KEY": msg["keys"].split()[0]}
    prelude = f'rmqstore() {{ "{sys.executable}" -m rmqstore "$@"; }}\npython() {{ "{sys.executable}" "$@"; }}\n'
    ran = []
    for line in shell_lines(README.read_text(encoding="utf-8")):
        if _matching(line, SKIP) or bool(_matching(line, SLOW)) != slow:
            continue
        cmd = line
        for name, value in subs.items():
            cmd = re.sub(rf"\b{name}\b", value, cmd)
        p = subprocess.run(["bash", "-c", prelude + cmd], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        allowed = {0, 3} if "exit status 3" in line else {0}
        assert p.returncode in allowed, (line, p.returncode, p.stdout[-1500:], p.stderr[-1500:])
        assert "Traceback" not in p.stderr, (line, p.stderr[-1500:])
        ran.append((line, p.stdout))
    return ran


def test_readme_shell_lines(clean_498, tmp_path):
    ran = dict(_run_readme(clean_498, tmp_path, slow=False))
    assert len(ran) >= 15
    # what the lines claim, checked on their output
    assert '"body": "hello"' in ran["rmqstore dump STORE2 --topic orders"]
    dumped = (tmp_path / "msgs.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(dumped) == len(clean_498[1]["messages"])
    assert "dry run" in ran["rmqstore recover STORE                       # dry run: what recovery would cut"]


@pytest.mark.slow
def test_readme_spark_lines(clean_498, tmp_path):
    pytest.importorskip("pyspark")
    assert len(_run_readme(clean_498, tmp_path, slow=True)) == 3


def test_asv_conf_names_this_project():
    """asv benchmarks this checkout ("repo": ".."), not RocketMQ's repository."""
    import json
    conf = json.loads((README.parent / "asv_bench" / "asv.conf.json").read_text())
    assert conf["repo"] == ".." and conf["project"] == "rmqstore"
    assert "rocketmq" not in json.dumps({k: v for k, v in conf.items() if k != "project"}).lower()
