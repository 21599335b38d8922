"""Symlinks planted in a store are refused (StoreError), never followed: their targets
keep their bytes and mode. FIFOs, directories where files are due and files where
directories are due are StoreErrors too, never a hang or a bare OSError. Files the store
creates are 0600 whatever the umask."""
import os
import shutil
import subprocess
import sys

import pytest

from rmqstore import Message, MessageStore, StoreConfig, StoreError, StoreIOError, batch

from conftest import SMALL_INDEX

SEG = 4096 * 4


def _cfg(**kw):
    return StoreConfig(**{**SMALL_INDEX, "commitlog_file_size": SEG, "consume_queue_entries": 100,
                          "warm_mapped_file": False, **kw})


def _store(root):
    with MessageStore(root, _cfg()) as s:
        for i in range(5):
            s.put(Message("T", b"x" * 100, keys=f"k{i}"), queue_id=0)
        s.commit_offset("g", "T", 0, 2)


def _index_file(root):
    return "index/" + sorted(os.listdir(root / "index"))[0]


# store path -> what the planted link replaces: "file" (an existing store file, moved
# away), "new" (a path the store creates while open), "dir" (a store directory)
PLANTS = {
    "abort": "new", "lock": "file", "checkpoint": "file", "checkpoint.tmp": "new",
    "config/consumerOffset.json": "file", "config/consumerOffset.json.tmp": "new",
    "commitlog/00000000000000000000": "file", f"commitlog/{SEG:020d}": "new",
    "consumequeue/T/0/00000000000000000000": "file", "index": "dir", "consumequeue/T": "dir",
    "consumequeue/T/0": "dir", "commitlog": "dir", "<index file>": "file",
}


def _use(root):
    """Open the store and use everything that writes: StoreError wherever it is refused."""
    with MessageStore(root, _cfg()) as s:
        for i in range(200):    # rolls into the second commitlog segment
            s.put(Message("T", b"y" * 100, keys=f"n{i}"), queue_id=0)
        s.commit_offset("g", "T", 0, 7)
        s.wait_dispatched()
        s.flush()


@pytest.mark.parametrize("rel", sorted(PLANTS))
def test_planted_symlink_is_refused_and_its_target_untouched(tmp_path, rel):
    root = tmp_path / "store"
    _store(root)
    if rel == "<index file>":
        rel = _index_file(root)
    kind = PLANTS.get(rel, "file")
    link = root / rel
    victim = tmp_path / "victim"
    if kind == "dir":
        os.rename(link, victim)          # the store's own directory, now reached by a link
        before = {p: (victim / p).read_bytes() for p in os.listdir(victim) if (victim / p).is_file()}
        link.symlink_to(victim, target_is_directory=True)
    else:
        victim.write_bytes(b"precious" * 1000 if kind == "new" else link.read_bytes())
        os.chmod(victim, 0o644)
        if kind == "file":
            link.unlink()
        link.symlink_to(victim)
        before = victim.read_bytes()
    with pytest.raises(StoreError, match="symlink"):
        _use(root)
    assert os.path.islink(link)
    if kind == "dir":
        assert {p: (victim / p).read_bytes() for p in os.listdir(victim) if (victim / p).is_file()} == before
    else:
        assert victim.read_bytes() == before and os.stat(victim).st_mode & 0o777 == 0o644


@pytest.mark.parametrize("rel", ["commitlog/00000000000000000000", "checkpoint", "config/consumerOffset.json"])
def test_read_only_open_refuses_symlinked_files(tmp_path, rel):
    root = tmp_path / "store"
    _store(root)
    victim = tmp_path / "victim"
    os.rename(root / rel, victim)
    (root / rel).symlink_to(victim)
    with pytest.raises(StoreError, match="symlink"):
        MessageStore(root, _cfg(), read_only=True)


def test_dangling_symlink_segment_is_refused(tmp_path):
    root = tmp_path / "store"
    _store(root)
    (root / "commitlog" / f"{SEG:020d}").symlink_to(tmp_path / "nowhere")
    with pytest.raises(StoreError, match="symlink"):
        MessageStore(root, _cfg())
    assert not (tmp_path / "nowhere").exists()


def test_stale_regular_temporaries_are_replaced(tmp_path):
    """A temp file a crash left behind (a regular file) does not block later writes."""
    root = tmp_path / "store"
    _store(root)
    (root / "checkpoint.tmp").write_bytes(b"stale")
    (root / "config" / "consumerOffset.json.tmp").write_bytes(b"stale")
    (root / "abort").write_bytes(b"stale")
    with MessageStore(root, _cfg()) as s:
        s.commit_offset("g", "T", 0, 4)
        s.flush()
    with MessageStore(root, _cfg(), read_only=True) as s:
        assert s.committed_offset("g", "T", 0) == 4
    assert not (root / "checkpoint.tmp").exists() and not (root / "abort").exists()


def test_every_created_file_is_0600_under_a_lax_umask(tmp_path):
    old = os.umask(0)
    try:
        root = tmp_path / "store"
        _store(root)
        with MessageStore(root, _cfg()) as s:   # reopened: abort and temporaries again
            s.put(Message("T", b"z"))
            abort_mode = os.stat(root / "abort").st_mode & 0o777
    finally:
        os.umask(old)
    assert abort_mode == 0o600
    modes = {os.path.relpath(os.path.join(d, n), root): os.stat(os.path.join(d, n)).st_mode & 0o777
             for d, _, names in os.walk(root) for n in names}
    assert modes and set(modes.values()) == {0o600}, modes


# A child opens the store (read-only, then writing), reads, puts and verifies, printing
# what escaped that is no StoreError; a FIFO used to block open() forever.
OPENER = r"""
import sys
from rmqstore import Message, MessageStore, StoreConfig, StoreError, StoreIOError, batch
cfg = StoreConfig(commitlog_file_size=int(sys.argv[2]), consume_queue_entries=100, warm_mapped_file=False)
for ro in (True, False):
    try:
        with MessageStore(sys.argv[1], cfg, read_only=ro) as s:
            s.get_messages("T", 0, 0, 4), s.query_by_key("T", "k1"), s.verify()
            if not ro:
                s.put(Message("T", b"new"), 0), s.commit_offset("g", "T", 0, 3)
    except StoreError:
        pass
    except BaseException as e:
        print(ro, type(e).__name__, e)
"""
PLACED = {   # what takes a store path's place: a FIFO, a directory, a file, odd names
    "fifo": ["checkpoint", "config/consumerOffset.json", "lock", "abort", "commitlog/00000000000000000000",
             f"commitlog/{SEG:020d}", "consumequeue/T/0/00000000000000000000", "<index file>"],
    "dir": ["checkpoint", "config/consumerOffset.json", "lock", f"commitlog/{SEG:020d}",
            "consumequeue/T/0/00000000000000000000", "<index file>"],
    "file": ["commitlog", "consumequeue", "consumequeue/T", "consumequeue/T/0", "index", "config"],
    "name": ["consumequeue/T/99999999999999999999", "consumequeue/T/\u00b2", "commitlog/" + "\u00b2" * 20,
             "index/\u00b2"],
}


@pytest.mark.parametrize("kind", sorted(PLACED))
def test_special_files_and_wrong_kinds_are_store_errors(tmp_path, kind):
    roots = []
    for i, rel in enumerate(PLACED[kind]):
        root = tmp_path / str(i)
        _store(root)
        os.remove(root / "lock")
        path = root / (_index_file(root) if rel == "<index file>" else rel)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        os.makedirs(path.parent, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "file":
            path.write_bytes(b"x")
        else:
            os.makedirs(path)
        roots.append(root)
    for root in roots:
        p = subprocess.run([sys.executable, "-c", OPENER, str(root), str(SEG)], capture_output=True, text=True,
                           timeout=120)
        assert (p.returncode, p.stdout) == (0, "") and "Traceback" not in p.stderr, (root, p.stderr)


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_digest_and_diff_read_no_planted_segment(tmp_path, plant):
    """The command's digest and diff read segments as the store does: a FIFO (open()
    used to wait for a writer forever) or a symlink (read through to its target) is an
    error, exit status 1."""
    _store(tmp_path / "s")
    seg = tmp_path / "s" / f"commitlog/{SEG:020d}"
    if plant == "fifo":
        os.mkfifo(seg)
    else:
        (tmp_path / "target").write_bytes(b"\0" * SEG)
        os.symlink(tmp_path / "target", seg)
    for cmd in (["digest", tmp_path / "s"], ["diff", tmp_path / "s", tmp_path / "s"]):
        p = subprocess.run([sys.executable, "-m", "rmqstore", *map(str, cmd)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 1 and p.stderr.startswith("rmqstore: error: ") and "Traceback" not in p.stderr


@pytest.mark.parametrize("plant", ["fifo", "dir", "symlink"])
def test_the_batch_decoder_lists_no_planted_segment(tmp_path, plant):
    """batch.segment_files, the Spark source's and jobs' listing, took a FIFO or directory
    segment for an empty one (size 0: skipped, so spark export succeeded without its
    records) and sized a symlink by its target; it now refuses them as the store's open
    does, with a StoreIOError naming the file."""
    _store(tmp_path / "s")
    seg = tmp_path / "s" / f"commitlog/{SEG:020d}"
    if plant == "fifo":
        os.mkfifo(seg)
    elif plant == "dir":
        os.mkdir(seg)
    else:
        (tmp_path / "target").write_bytes(b"\0" * SEG)
        os.symlink(tmp_path / "target", seg)
    with pytest.raises(StoreIOError, match=f"{SEG:020d}"):
        batch.segment_files(tmp_path / "s")


def test_a_store_root_reached_through_a_symlink_works(tmp_path):
    """Operators link a store directory into place (/var/lib/store -> /data/store). The
    root is not a planted store file: opened through the link it writes, checkpoints
    and closes cleanly (the checkpoint's directory fsync opened the link O_NOFOLLOW, so
    the first flush made the store read-only)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data", target_is_directory=True)
    _use(tmp_path / "link")
    with MessageStore(tmp_path / "link", _cfg(), read_only=True) as s:
        assert s.clean_shutdown and s.committed_offset("g", "T", 0) == 7
        assert sum(1 for _ in s.scan()) == 200 and s.verify().ok
