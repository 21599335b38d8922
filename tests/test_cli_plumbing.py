"""The rmqstore command when its plumbing is hostile: Ctrl-C while Python imports, closed or
full standard streams, terminals that cannot show the text, message data holding terminal
control characters. Each case runs the command in a subprocess."""
import json
import os
import subprocess
import sys

import pytest
from test_cli import ENV, ROOT, default_sigint, put, run

from conftest import tree_state

# Ctrl-C arriving while ``rmqstore`` (numpy, the kernels) imports: the hook sends SIGINT at
# the first import of numpy, then lets the import go on, as a real Ctrl-C at that moment.
_INTERRUPTED_IMPORT = """
import builtins, os, signal, sys
real = builtins.__import__
def hook(name, *a, **k):
    if name == "numpy" and not hasattr(hook, "sent"):
        hook.sent = True
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *a, **k)
builtins.__import__ = hook
from rmqstore_command import main
sys.exit(main())
"""


def _run(args, *, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, close=()):
    """The command (through the console script's entry module) with descriptors ``close`` closed."""
    def setup():
        default_sigint()
        for fd in close:
            os.close(fd)
    p = subprocess.run([sys.executable, "-c", "import sys; from rmqstore_command import main; sys.exit(main())",
                        *map(str, args)], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, env=env,
                       preexec_fn=setup, timeout=120)
    assert b"Traceback" not in p.stderr, p.stderr.decode()
    return p


def test_console_script_is_the_entry_module():
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("[")[0]
    assert scripts.strip() == 'rmqstore = "rmqstore_command:main"'


def test_ctrl_c_while_importing_exits_130(tmp_path):
    p = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT, "stats", str(tmp_path)], capture_output=True,
                       text=True, env=ENV, timeout=120, preexec_fn=default_sigint)
    assert (p.returncode, p.stderr) == (130, "rmqstore: interrupted\n")


def test_closed_stdout_is_refused_before_anything_runs(tmp_path):
    """``>&-``: an error, and the store untouched (a store file never takes descriptor 1)."""
    store = tmp_path / "s"
    put(store, {"topic": "T", "body": "x"}, extra=("--create", "--segment-size", "4096"))
    before = tree_state(store)
    for cmd in (["recover", store, "--yes"], ["dump", store], ["stats", store, "--json"]):
        p = _run(cmd, close=(1,))
        assert p.returncode == 1 and b"stdout is closed" in p.stderr, cmd
    assert tree_state(store) == before


def test_closed_stdin_and_stderr(tmp_path):
    store = tmp_path / "s"
    p = _run(["put", store, "--create"], close=(0,))
    assert p.returncode == 0 and b"no messages on stdin" in p.stdout
    assert _run(["stats", tmp_path / "missing"], close=(2,)).returncode == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_full_stdout_is_an_error_with_json_too(tmp_path):
    with open("/dev/full", "wb") as full:
        for cmd in (["stats", tmp_path / "missing", "--json"], ["bench", "--messages", 5, "--no-peers", "--json",
                                                                 "--dir", tmp_path / "b"]):
            p = _run(cmd, stdout=full)
            assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, (cmd, p.stderr)


def test_text_the_terminal_cannot_hold(tmp_path):
    """A store path of non-UTF-8 bytes, topics beyond ASCII on an ASCII terminal: tables show
    escapes, JSON stays valid JSON."""
    store = os.path.join(os.fsencode(tmp_path), b"st\xff")
    put(os.fsdecode(store), {"topic": "T\u00e4", "body": "x"},
        extra=("--create", "--segment-size", "4096", "--any-topic-name"))
    doc = json.loads(_run(["stats", os.fsdecode(store), "--json"]).stdout)
    assert os.fsencode(doc["path"]) == store
    ascii_env = {**ENV, "PYTHONIOENCODING": "ascii"}
    doc = json.loads(_run(["stats", os.fsdecode(store), "--json"], env=ascii_env).stdout)
    assert doc["topics"] == ["T\u00e4"]
    p = _run(["stats", os.fsdecode(store)], env=ascii_env)
    assert p.returncode == 0 and b"T\\xe4" in p.stdout


def test_terminal_controls_in_message_data_are_escaped(tmp_path):
    """A sender's tags, keys and topic reach the operator's terminal: escape sequences (clear
    the screen), line separators and bidi overrides are shown as escapes, never sent raw."""
    store = tmp_path / "s"
    put(store, {"topic": "T", "body": "b\x1b]0;title\x07", "tags": "\x1b[2J",
                "keys": ["k\u2028x", "\u202eevil", "z\u200bw\u200f\u061c\ufeff"]},
        extra=("--create", "--segment-size", "4096"))
    outputs = [run(*cmd).stdout for cmd in (["get", store, "--topic", "T", "--queue", 0, "--offset", 0],
                                             ["tail", store, "--from", 0, "--max", 1], ["at", store, 0],
                                             ["query", store, "--topic", "T", "--key", "k\u2028x"])]
    for out in outputs:
        assert not any(c in out for c in "\x1b\x07\u2028\u202e\u200b\u200f\u061c\ufeff"), out
    assert "\\x1b[2J" in outputs[0] and "\\u202eevil" in outputs[1]
    assert "z\\u200bw\\u200f\\u061c\\ufeff" in outputs[2]   # zero-width and bidi marks: visible too
    assert json.loads(run("at", store, 0, "--json").stdout)["tags"] == "\x1b[2J"


def test_numbers_a_command_cannot_use_are_usage_errors(tmp_path):
    """Durations and sizes argparse accepted as floats or ints and Python then refused
    (time.sleep, random.randbytes): a traceback before, exit status 2 now."""
    store = tmp_path / "s"
    put(store, {"topic": "T", "body": "x"}, extra=("--create", "--segment-size", "4096"))
    for cmd in (["tail", store, "--interval", "-1"], ["tail", store, "--interval", "nan"],
                ["tail", store, "--interval", "1e308"], ["tail", store, "--timeout", "inf"],
                ["clean", store, "--now", "nan"], ["bench", "--messages", 1, "--body-size", 10 ** 15, "--no-peers"]):
        p = _run([*cmd, "--json"])
        assert p.returncode == 2 and json.loads(p.stdout)["exit"] == 2, cmd


def test_spark_jobs_without_pyspark_say_which_extra(tmp_path):
    """Without the [spark] extra (pyspark not importable), a spark job is one line naming
    the extra and exit 1, not an ImportError traceback."""
    store = tmp_path / "s"
    put(store, {"topic": "T", "body": "x"}, extra=("--create", "--segment-size", "4096"))
    blocked = "import sys; sys.modules['pyspark'] = None; from rmqstore_command import main; sys.exit(main())"
    p = subprocess.run([sys.executable, "-c", blocked, "spark", "verify", str(store)], capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "[spark] extra" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_options_given_twice_and_numbers_out_of_range_are_usage_errors(tmp_path):
    """An option given twice (argparse kept the last value silently), a queue id past
    2^31-1 or an offset past 2^63-1 (exit 1 with the library's name for it), and integers
    int() takes that are no plain ASCII number ("1_0", " 0", Arabic-Indic digits: read as
    10, 0 and 0) are usage errors, exit status 2, JSON too."""
    store = tmp_path / "s"
    put(store, {"topic": "T", "body": "x"}, extra=("--create", "--segment-size", "4096"))
    get = ["get", store, "--topic", "T", "--offset", "0"]
    for cmd in ([*get, "--queue", "0", "--topic", "U"],
                [*get, "--queue", "0", "--index-slots", "8", "--index-slots", "9"], [*get, "--queue", "2147483648"],
                [*get, "--queue", "1_0"], [*get, "--queue", " 0"],
                [*get, "--queue", "\u0660"], ["at", store, 1 << 63], ["dump", store, "--from", 1 << 63]):
        p = _run([*cmd, "--json"])
        assert (p.returncode, json.loads(p.stdout)["exit"]) == (2, 2), cmd
    assert json.loads(_run([*get, "--queue", "0", "--json"]).stdout)["messages"][0]["body"] == "x"
