"""Memory follows data, not file sizes: verify and a writer's open and close of a store
with a default-size (1 GiB, sparse) commitlog segment stay under RSS_LIMIT, whether the
segment holds 100 messages or 600 MB. Peak RSS of a child process (ru_maxrss of
RUSAGE_CHILDREN), not a timing."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RSS_LIMIT = 256 << 20


def _peak_rss(code):
    """Peak RSS in bytes of a fresh interpreter running ``code`` (children of this process
    are waited for one at a time: ru_maxrss of RUSAGE_CHILDREN is the largest so far, so
    each run uses a grandchild measured by its own parent)."""
    wrapper = textwrap.dedent(f"""
        import resource, subprocess, sys
        p = subprocess.run([sys.executable, "-c", {code!r}])
        assert p.returncode == 0, p.returncode
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    """)
    p = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split()[-1])


def _make(path, messages, body):
    code = textwrap.dedent(f"""
        from rmqstore import Message, MessageStore, StoreConfig
        import numpy as np
        with MessageStore({str(path)!r}, StoreConfig(index_slots=1000, index_entries=4000,
                                                     flush_mode="async")) as s:
            left = {messages}
            while left:
                n = min(left, 2000)
                s.put_columns("Mem", np.full(n, {body!r}, dtype=object))
                left -= n
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))


def _verify(path):
    return textwrap.dedent(f"""
        from rmqstore import MessageStore
        with MessageStore({str(path)!r}, read_only=True) as s:
            assert s.verify().ok
    """)


def _open_close(path):
    return textwrap.dedent(f"""
        from rmqstore import MessageStore
        MessageStore({str(path)!r}).close()
    """)


def _crashed(path):
    open(os.path.join(path, "abort"), "w").close()


def test_small_store_in_a_sparse_segment(tmp_path):
    _make(tmp_path, 100, b"x" * 100)
    assert os.path.getsize(next((tmp_path / "commitlog").iterdir())) == 1 << 30
    assert _peak_rss(_verify(tmp_path)) <= RSS_LIMIT
    assert _peak_rss(_open_close(tmp_path)) <= RSS_LIMIT
    _crashed(tmp_path)   # an unclean shutdown's recovery reads the whole segment
    assert _peak_rss(_open_close(tmp_path)) <= RSS_LIMIT
    assert _peak_rss(_verify(tmp_path)) <= RSS_LIMIT


@pytest.mark.slow
def test_600mb_of_data(tmp_path):
    _make(tmp_path, 150_000, b"y" * 4000)
    assert _peak_rss(_verify(tmp_path)) <= RSS_LIMIT
    _crashed(tmp_path)
    assert _peak_rss(_open_close(tmp_path)) <= RSS_LIMIT
