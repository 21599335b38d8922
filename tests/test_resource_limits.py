"""A store holds one open file per segment file: a broker's store with a few hundred
queues holds more than the common soft limit of 1024 open files. An open raises the soft
limit to the hard one (as the JVM does for a broker); past the hard limit it is a
ResourceLimitError that names the limit, never a damaged file to rebuild."""
import json
import resource
import subprocess
import sys
import textwrap

import pytest

from rmqstore import Message, MessageStore, StoreConfig

from conftest import tree_state

QUEUES = 150
CFG = dict(commitlog_file_size=1 << 20, consume_queue_entries=64, message_index_enable=False)


@pytest.fixture(scope="module")
def many_queues(tmp_path_factory):
    """A store with one consume-queue file in each of 150 queues."""
    root = tmp_path_factory.mktemp("limits") / "store"
    with MessageStore(root, StoreConfig(**CFG)) as s:
        for t in range(QUEUES):
            s.put(Message(f"T{t}", b"body-%d" % t), queue_id=0)
    return root


def _open_under(root, soft, hard, read_only):
    """Open the store in a child whose open-file limits are (soft, hard); what it saw."""
    code = textwrap.dedent(f"""
        import json, resource
        from rmqstore import MessageStore, StoreConfig, ResourceLimitError, StoreIOError
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
        try:
            with MessageStore({str(root)!r}, StoreConfig(**{CFG!r}), read_only={read_only}) as s:
                out = {{"body": s.get_messages("T{QUEUES - 1}", 0, 0).messages[0].body.decode(),
                        "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}}
        except StoreIOError as e:
            out = {{"error": type(e).__name__, "limit": isinstance(e, ResourceLimitError), "message": str(e)}}
        print(json.dumps(out))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("read_only", [True, False], ids=["reader", "writer"])
def test_the_soft_limit_is_raised_to_the_hard_one(many_queues, read_only):
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= 1024, "the test needs a hard limit of 1024"
    got = _open_under(many_queues, 100, 1024, read_only)
    assert got == {"body": f"body-{QUEUES - 1}", "soft": 1024}


@pytest.mark.parametrize("read_only", [True, False], ids=["reader", "writer"])
def test_past_the_hard_limit_the_error_names_the_limit_and_nothing_changes(many_queues, read_only):
    """It used to be a DerivedFileError telling the user to rebuild the consume queues."""
    before = tree_state(many_queues)
    got = _open_under(many_queues, 100, 100, read_only)
    assert got["error"] == "ResourceLimitError" and got["limit"]
    assert "ulimit -n" in got["message"] and "100" in got["message"] and "rebuild" not in got["message"]
    assert tree_state(many_queues) == before


def test_the_cli_says_which_limit(many_queues):
    p = subprocess.run(["bash", "-c", f'ulimit -n 100 && exec "$0" -m rmqstore stats {many_queues}', sys.executable],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "ulimit -n" in p.stderr and "rebuild" not in p.stderr


def test_address_space_exhausted_is_a_resource_limit(tmp_path):
    """A 1 GiB segment (sparse) mapped under an address-space limit: mmap's ENOMEM."""
    with MessageStore(tmp_path / "big") as s:
        s.put(Message("T", b"x"))
    code = textwrap.dedent(f"""
        import resource
        from rmqstore import MessageStore, ResourceLimitError
        size = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmSize:")) << 10
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
        try:
            MessageStore({str(tmp_path / "big")!r}, read_only=True)
        except ResourceLimitError as e:
            print(e)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "ulimit -v" in p.stdout and "vm.max_map_count" in p.stdout, (p.stdout, p.stderr)
