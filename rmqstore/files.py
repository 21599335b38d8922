"""File-system helpers shared by the store's writers."""
import os


def make_dirs(path, mode):
    """Create ``path`` and any missing parents, each with ``mode`` (os.makedirs gives the
    mode to the last directory only)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent != path:
        make_dirs(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass


def write_atomic(path, data, mode):
    """Replace ``path`` with ``data`` so a crash leaves the old or the new content: write a
    temp file, fsync it, rename it over ``path``, fsync the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
