"""Store directories as jobs name them (paths, globs, directories of stores), and which
store a directory is, whatever path names it."""
import glob
import hashlib
import os
import re
import uuid

from rmqstore import batch
from rmqstore.arguments import path_arg
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError
from rmqstore.files import open_reader, read_file, write_atomic


def store_paths(paths):
    """``paths`` as a list of path strings: one str or os.PathLike is one path (not its
    characters), else each item must be one (non-empty, no NUL: InvalidArgumentError)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif isinstance(paths, (bytes, bytearray)) or not hasattr(paths, "__iter__"):
        raise InvalidArgumentTypeError(f"stores must be a path or a list of paths, not {type(paths).__name__}")
    return [path_arg("store path", p) for p in paths]


def find_stores(paths):
    """Store directories (holding ``commitlog/``) named by ``paths`` (see store_paths):
    globs expanded, a directory that is not a store contributes its store subdirectories.
    Sorted, unique."""
    out = set()
    paths = store_paths(paths)
    for p in paths:
        matches = sorted(glob.glob(os.path.expanduser(p))) or [p]
        for m in matches:
            if os.path.isdir(os.path.join(m, "commitlog")):
                out.add(os.path.abspath(m))
            elif os.path.isdir(m):
                out.update(os.path.abspath(os.path.join(m, d)) for d in os.listdir(m)
                           if os.path.isdir(os.path.join(m, d, "commitlog")))
    if not out:
        raise InvalidArgumentError(f"no RocketMQ store (a directory with commitlog/) at {paths}")
    return sorted(out)


def enclosing_store(path):
    """The store directory ``path`` is or lies inside (its nearest ancestor holding
    ``commitlog/``), or None: no job writes its output there."""
    p = os.path.realpath(path_arg("output path", path))
    while True:
        if os.path.isdir(os.path.join(p, "commitlog")):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


ID_FILE = "storeid"   # in the store root: a random id the Spark writer gives the stores it makes
_ID = re.compile(r"[0-9a-f]{32}")
_HEAD_BYTES = 1 << 20   # of the first record, hashed


def write_store_id(store, mode):
    """Give the new store ``store`` (its writer lock held) a random id of its own, which its
    copies keep: a stream's checkpoint finds it by that id at any path."""
    write_atomic(os.path.join(store, ID_FILE), uuid.uuid4().hex.encode(), mode)


def store_identity(store):
    """(key, root) of the store directory ``store``, the same whatever path names it (a link,
    a bind mount, a moved mount point). ``key``: ``id:<hex>``, the id the Spark writer
    gave it (its copies share it), else ``head:<first segment>:<hash>``, from its first
    record's bytes (a copy shares it; retention, removing the first segment, changes it;
    ``empty`` while there is no record). ``root``: ``<device>:<inode>`` of the directory,
    which retention does not change."""
    st = os.stat(store)
    root = f"{st.st_dev}:{st.st_ino}"
    try:
        text = read_file(os.path.join(store, ID_FILE), 64).decode("ascii", "replace").strip()
    except FileNotFoundError:
        text = ""
    if _ID.fullmatch(text):
        return f"id:{text}", root
    files = batch.segment_files(store)
    if not files:
        return "head:none", root
    path, base, _ = files[0]
    with open_reader(path) as f:
        head = f.read(4)
        size = int.from_bytes(head, "big", signed=True) if len(head) == 4 else 0
        digest = hashlib.sha256(head + f.read(min(max(size, 4), _HEAD_BYTES) - 4)).hexdigest()[:32] \
            if size > 0 else "empty"
    return f"head:{base}:{digest}", root
