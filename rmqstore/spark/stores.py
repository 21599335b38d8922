"""Store directories as jobs name them: paths, globs and directories of stores."""
import glob
import os

from rmqstore.arguments import path_arg
from rmqstore.errors import InvalidArgumentError, InvalidArgumentTypeError


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
