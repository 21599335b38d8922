"""File-system helpers shared by the store's writers.

Every store file is opened with O_NOFOLLOW, so a symlink planted at its path raises
StoreIOError (ELOOP) instead of being written or read through; temporaries are created
with O_EXCL. The open and fsync calls here join the fault injection of cext/rmq_fault.h.
"""
import errno
import fcntl
import functools
import json
import os
import resource
import shutil
import stat
import struct

from rmqstore._segment import FAULT_FSYNC, FAULT_OPEN, fault_point
from rmqstore.errors import (
    CorruptStoreError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
    raise_errno,
    raise_not_regular,
)


def make_dirs(path, mode):
    """Create ``path`` and any missing parents, each with ``mode`` (os.makedirs gives the
    mode to the last directory only); a file in the way is a StoreIOError."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent != path:
        make_dirs(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise_errno(errno.ENOTDIR, path, "create directory")
    except OSError as e:
        raise_errno(e.errno or errno.EIO, path, "create directory")


def list_dir(path):
    """Names in the store directory ``path`` ([] when it does not exist); a symlink, a
    file or an unreadable directory is a StoreIOError."""
    refuse_symlink(path)
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise_errno(e.errno or errno.EIO, path, "list")


def number_name(name, limit):
    """The int an ASCII-digit file name ``name`` spells if it is at most ``limit``, else
    None (a store's file and directory names: offsets, queue ids, times)."""
    return int(name) if name.isascii() and name.isdigit() and int(name) <= limit else None


@functools.cache
def raise_open_file_limit():
    """Raise the process's soft limit on open files to its hard limit, once, as the JVM
    (so a RocketMQ broker) and Go's runtime do at start: a store keeps one descriptor per
    segment file, and a broker's store with a few hundred topics holds more files than
    the common soft limit of 1024. Best effort: a limit that cannot be raised stays."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20   # the kernel's default fs.nr_open
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        except (ValueError, OSError):
            pass


def store_dir(path, create, mode):
    """Make sure the store root ``path`` is a directory (created with ``mode`` when
    ``create``): StoreNotFoundError when it is missing, StoreIOError when it is a file."""
    if create:
        try:
            make_dirs(path, mode)
        except OSError as e:
            raise_errno(e.errno, e.filename or path, "create store directory")
    if not os.path.isdir(path):
        if not os.path.lexists(path):
            raise StoreNotFoundError(errno.ENOENT, "store directory does not exist", path)
        raise_errno(errno.ENOTDIR, path, "open store")


def refuse_symlink(path):
    """StoreIOError (ELOOP) when ``path`` is a symlink: store files and directories are
    never followed."""
    if os.path.islink(path):
        raise_errno(errno.ELOOP, path, "open")


def file_size(path):
    """Size of the store file ``path`` itself (lstat); a symlink, directory, FIFO or device
    is refused (StoreIOError), as open_file refuses it."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise_errno(e.errno, path, "stat")
    if stat.S_ISLNK(st.st_mode):
        raise_errno(errno.ELOOP, path, "open")
    if not stat.S_ISREG(st.st_mode):
        raise_not_regular(path, "open")
    return st.st_size


def open_reader(path):
    """The store file ``path`` opened for reading as a binary file object (open_file's
    checks: no symlink, a regular file)."""
    return os.fdopen(open_file(path, os.O_RDONLY), "rb")


def only_zeros(path):
    """Whether the store file ``path`` holds nothing but zeros (a file being created)."""
    with open_reader(path) as f:
        while chunk := f.read(1 << 20):
            if chunk.strip(b"\0"):
                return False
    return True


def open_file(path, flags, mode=0o600):
    """os.open with O_NOFOLLOW and O_CLOEXEC; an error becomes a StoreIOError naming ``path``
    (a symlink: ELOOP; a directory, FIFO or device where a file is due: not a regular
    file), except ENOENT, which stays FileNotFoundError for callers to test."""
    try:
        fault_point(FAULT_OPEN, path)
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)   # a FIFO: no wait
    except FileNotFoundError:
        raise
    except OSError as e:
        raise_errno(e.errno, path, "open")
    if not flags & os.O_DIRECTORY and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise_not_regular(path, "open")
    os.set_blocking(fd, True)
    return fd


LOCK_TRIES = 100   # lock files removed under a writer in turn: more is someone deleting stores in a loop


def lock_writer(store, mode):
    """A descriptor of ``store/lock`` holding the store's writer locks: whoever holds it is
    the store's one writer (a MessageStore opened for writing, a Spark rebuild into the
    store), until the descriptor is closed. StoreLockedError when another process holds it.

    Two locks, as two kinds of writer take them: an exclusive flock (rmqstore's own), and
    a write lock on byte 0, RocketMQ's: a broker's ``DefaultMessageStore.start`` takes
    ``FileChannel.tryLock(0, 1, false)``, a POSIX record lock, which no flock sees on
    Linux. Ours is an open-file-description lock: it conflicts with the broker's, and no
    other descriptor of the file this process closes lets it go, as a POSIX one would.

    A lock file its holder removed (a store being deleted, or renamed away) guards nothing
    once let go: a lock won on a file no longer at ``store/lock`` is dropped and the one
    there now is taken, so a writer never runs beside the removal it waited for."""
    path = os.path.join(store, "lock")
    for _ in range(LOCK_TRIES):
        fd = open_file(path, os.O_RDWR | os.O_CREAT, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _lock_first_byte(fd)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise_errno(e.errno, path, "lock")
            raise StoreLockedError(f"{store}: another process (an rmqstore writer, or a RocketMQ broker) has the "
                                   "store open for writing") from None
        if _still_at(fd, path):
            return fd
        os.close(fd)
    raise StoreLockedError(f"{store}: its lock file was removed or replaced {LOCK_TRIES} times while taking it "
                           "(another process is deleting the store)")


def _still_at(fd, path):
    """Whether the file open as ``fd`` is still the one at ``path``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def remove_entries(store, names):
    """Remove the entries ``names`` of the store directory ``store`` (a directory with its
    tree, a link but not its target), its lock file last: the caller holds the writer
    lock, which keeps other writers out only while that file is in place."""
    for name in sorted(set(names) - {"lock"}) + (["lock"] if "lock" in names else []):
        path = os.path.join(store, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def remove_if_empty(directory):
    """Remove ``directory`` if it is empty; one that holds anything (another writer's new
    store), or is gone, is left as it is."""
    try:
        os.rmdir(directory)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise


_FLOCK = struct.Struct("hhqqi4x")   # Linux's struct flock: l_type, l_whence, l_start, l_len, l_pid


def _lock_first_byte(fd):
    """A write lock on byte 0 of ``fd``'s file, as RocketMQ's broker takes it (OSError
    EAGAIN/EACCES when another process holds a lock there)."""
    if hasattr(fcntl, "F_OFD_SETLK"):
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    else:                       # no OFD locks (not Linux): a POSIX record lock
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)


MAX_WHOLE_FILE = 256 << 20   # a file read whole (consumer offsets, pop state): 10x a big broker's


def read_file(path, limit=MAX_WHOLE_FILE):
    """The store file ``path`` whole, refusing a symlink; FileNotFoundError when it does not
    exist. A file of more than ``limit`` bytes (an extended or sparse one would take all
    memory) is a CorruptStoreError."""
    with open_reader(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CorruptStoreError(f"{path}: more than {limit} bytes, too large for what it should hold")
    return data


def check_replaceable(path):
    """Whether a regular file is at ``path`` (False: nothing); StoreIOError for a symlink,
    directory, FIFO or anything else, which a writer must not remove or write through."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise_errno(errno.ELOOP, path, "create")
    if not stat.S_ISREG(st.st_mode):
        raise_not_regular(path, "create")
    return True


def remove_stale(path):
    """Remove ``path`` if it is a regular file (left by an earlier run); a symlink or
    anything else there is refused with StoreIOError, its target untouched."""
    if check_replaceable(path):
        os.unlink(path)


def create_new(path, data, mode):
    """Create ``path`` holding ``data`` after removing a stale regular file there
    (remove_stale); O_EXCL and O_NOFOLLOW, so nothing planted is written through."""
    remove_stale(path)
    _write_new(path, data, mode)


def _write_new(path, data, mode, durable=False):
    """Create ``path`` (O_EXCL, O_NOFOLLOW) holding all of ``data`` (a short write goes on),
    fsynced when ``durable``. On an error the file is removed, so a full disk leaves no
    empty or partial file behind, and the error is a StoreIOError (ENOSPC: DiskFullError):
    it was a bare OSError, from opening a writer on a full disk among others."""
    fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    done = False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            fsync(fd, path)
        done = True
    except OSError as e:
        if isinstance(e, StoreError):
            raise
        raise_errno(e.errno or errno.EIO, path, "write")
    finally:
        os.close(fd)
        if not done:
            try:
                os.unlink(path)
            except OSError:
                pass


def fsync(fd, path, data_only=False):
    """os.fsync (os.fdatasync with ``data_only``: not the times), through the fault
    injection; an error becomes a StoreIOError."""
    try:
        fault_point(FAULT_FSYNC, path)
        (os.fdatasync if data_only else os.fsync)(fd)
    except OSError as e:
        raise_errno(e.errno, path, "fsync")


def write_atomic(path, data, mode):
    """Replace ``path`` with ``data`` so a crash leaves the old or the new content: write a
    temp file (created anew: O_EXCL, O_NOFOLLOW), fsync it, rename it over ``path``, fsync
    the directory. A regular temp file left by a crash is removed first; anything else
    there (a symlink) is refused with StoreIOError."""
    tmp = path + ".tmp"
    remove_stale(tmp)
    _write_new(tmp, data, mode, durable=True)
    try:
        os.replace(tmp, path)
    except OSError as e:
        raise_errno(e.errno or errno.EIO, path, "rename")
    # the directory the rename went into, through any symlink on its way (a store root
    # reached by a link: opened O_NOFOLLOW as it stands, its first checkpoint failed)
    dfd = open_file(os.path.realpath(os.path.dirname(path) or "."), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(dfd, os.path.dirname(path))
    finally:
        os.close(dfd)


def _unique_keys(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {twice!r} given twice in one object")
    return obj


def parse_json(data, unique_keys=False):
    """json.loads of untrusted text (a store file, a request, a command's input): nesting
    deeper than the parser's recursion (json's RecursionError) is a ValueError like any
    malformed document; with ``unique_keys`` so is an object naming a key twice (json
    keeps the last silently)."""
    try:
        return json.loads(data, object_pairs_hook=_unique_keys if unique_keys else None)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
