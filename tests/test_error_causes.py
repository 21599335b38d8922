"""Errors that name the cause: a directory removed under a writer's open, a store this
user may not read, a topic the store does not hold."""
import os
import shutil
import subprocess
import sys

import pytest

from rmqstore import GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.errors import StoreError, StoreNotFoundError

from conftest import SMALL_INDEX

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg():
    return StoreConfig(commitlog_file_size=1 << 16, warm_mapped_file=False, **SMALL_INDEX)


def _cli(*args, user=None):
    def drop():
        if user is not None:
            os.setgid(user)
            os.setuid(user)
    return subprocess.run([sys.executable, "-m", "rmqstore", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT), preexec_fn=drop if user is not None else None)


def test_directory_removed_during_writer_open(tmp_path, monkeypatch):
    path = tmp_path / "s"
    with MessageStore(path, _cfg()) as s:
        s.put(Message("T", b"x"))
    import rmqstore.store as store_module
    real = store_module.CommitLog

    def removing(root, *a, **kw):   # another process removes the directory mid-open
        shutil.rmtree(root)
        return real(root, *a, **kw)
    monkeypatch.setattr(store_module, "CommitLog", removing)
    with pytest.raises(StoreError) as e:
        MessageStore(path, _cfg())
    assert isinstance(e.value, StoreNotFoundError) and str(path) in str(e.value)


def _cli_as_nobody(*args):
    """(exit status, stderr) of the CLI run in a forked child switched to user nobody (the
    venv's interpreter may not be runnable by it: the command runs in the fork)."""
    from rmqstore.cli import main
    main([*args[:-1], args[-1] + "-readable"])   # imports what the command needs (nobody cannot read the stdlib)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        try:
            os.dup2(w, 2)
            sys.stderr = open(2, "w", closefd=False)
            os.setgid(65534)
            os.setuid(65534)
            code = main(list(args))
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 99
        sys.stderr.flush()
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
@pytest.mark.parametrize("command", [["verify"], ["stats"], ["get", "--topic", "T", "--queue", "0", "--offset", "0"]])
def test_cli_without_permission_says_so(tmp_path, command):
    path = tmp_path / "s"
    with MessageStore(path, _cfg()) as s:
        s.put(Message("T", b"x"))
    shutil.copytree(path, str(path) + "-readable")
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o000)
    try:
        code, err = _cli_as_nobody(*command, str(path))
    finally:
        os.chmod(path, 0o700)
    assert code not in (0, 99), err
    assert "permission denied" in err.lower() and "not a RocketMQ store" not in err, err


def test_unknown_topic_answers_no_messages_and_cli_names_nearest(tmp_path):
    path = tmp_path / "s"
    with MessageStore(path, _cfg()) as s:
        s.put(Message("OrderEvents", b"x"), queue_id=0)
        s.put(Message("Payments", b"y"), queue_id=0)
        s.wait_dispatched(5)
        r = s.get_messages("OrderEvent", 0, 0)   # RocketMQ: an empty queue, no error
        assert r.messages == [] and r.status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
                                                 GetMessageStatus.NO_MESSAGE_IN_QUEUE)
    p = _cli("get", "--topic", "OrderEvent", "--queue", "0", "--offset", "0", str(path))
    assert p.returncode == 0, p.stderr
    assert "no topic 'OrderEvent'" in p.stderr and "OrderEvents" in p.stderr
    p = _cli("get", "--topic", "OrderEvents", "--queue", "0", "--offset", "0", str(path))
    assert "no topic" not in p.stderr
