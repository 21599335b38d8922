"""The rmqstore exception hierarchy, and the one translator from errno to exceptions."""
import errno as _errno
import inspect
import os
import resource
from dataclasses import FrozenInstanceError


class StoreError(Exception):
    """Base class of every error rmqstore raises on purpose."""


class StoreClosedError(StoreError):
    """The store, segment or iterator was used after close()."""


class StoreLockedError(StoreError):
    """Another process holds the store's writer lock."""


class StoreReadOnlyError(StoreError, PermissionError):
    """A write was attempted on a store opened read-only (or made read-only by an I/O error)."""


class ReentrantCallError(StoreError, RuntimeError):
    """A call that would wait forever for what its own thread holds: a store method called
    from a callback (a progress function, put_batch's iterable) of an operation that holds
    the lock the method needs (put or close during rebuild, rebuild during verify)."""


class FrozenObjectError(StoreError, FrozenInstanceError):
    """An attribute of an immutable object (StoreConfig, PutResult, MessageExt) was set or
    deleted; an AttributeError, as dataclasses' FrozenInstanceError is."""


class InvalidTopicError(StoreError, ValueError):
    """A topic name the store refuses to create."""


class InvalidArgumentError(StoreError, ValueError):
    """An argument out of its allowed range."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of a type the call does not take (None where a message is due, a str body...)."""


class MessageTooLargeError(StoreError, ValueError):
    """A message larger than max_message_size or than a commitlog segment."""


class OutOfRangeError(StoreError, IndexError):
    """A position or range outside a file or a sequence."""


class ViewExportedError(StoreError, BufferError):
    """A segment cannot close while a zero-copy view of it is exported."""


class CorruptStoreError(StoreError):
    """A store file whose structure is not what the format allows."""


class DerivedFileError(CorruptStoreError):
    """A consume-queue or index file an open cannot use (wrong size, a gap, a directory or
    link where a file is due). They are derived from the commitlog: ``rmqstore rebuild``
    (``MessageStore(path, rebuild=True)``) regenerates them; the error's cause is the
    original one."""


class CorruptRecordError(CorruptStoreError, ValueError):
    """A commitlog record that fails validation; ``offset`` is where it starts."""

    def __init__(self, message, offset=None):
        super().__init__(message)
        self.offset = offset


class MessageNotFoundError(StoreError, KeyError):
    """No message at the given offset or msgId."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class NotRecordStartError(MessageNotFoundError, InvalidArgumentError):
    """No record starts at the commitlog offset a caller gave: it points inside a record (or
    its bytes there name another offset). The offset is wrong, the store is not corrupt;
    ``offset`` is the one given."""

    def __init__(self, message, offset=None):
        super().__init__(message)
        self.offset = offset


class StoreIOError(StoreError, OSError):
    """An operating-system error on a store file; ``filename`` names it."""


class StoreNotFoundError(StoreIOError, FileNotFoundError):
    """The store directory does not exist (and was not to be created)."""


class ForeignProcessError(StoreError):
    """A writer handle used in a process other than the one that opened it (after fork)."""


class DiskFullError(StoreIOError):
    """The disk (or quota) has no room for the write; nothing partial was kept."""


class ResourceLimitError(StoreIOError):
    """The process reached a system limit (open files, memory maps, memory) opening or
    mapping a store file; the files are not damaged: raise the limit and open again."""


_ERRNO_CLASSES = {
    _errno.ENOSPC: DiskFullError,
    _errno.EDQUOT: DiskFullError,
    _errno.EMFILE: ResourceLimitError,
    _errno.ENFILE: ResourceLimitError,
    _errno.ENOMEM: ResourceLimitError,
}
_FILES_HINT = "a store keeps one open file per commitlog segment, consume-queue file and index file"
_WHY = {
    _errno.ELOOP: "a symlink, which store files must not be",
    _errno.EMFILE: "too many open files: the process may have {nofile} ('ulimit -n'); " + _FILES_HINT,
    _errno.ENFILE: "too many open files in the system (fs.file-max); " + _FILES_HINT,
    _errno.ENOMEM: "out of memory, address space ('ulimit -v') or memory maps (vm.max_map_count: {maps}): "
                   "a store maps each of its files",
}


def raise_errno(code, path, what):
    """Raise the exception for ``errno`` ``code`` met while doing ``what`` on ``path``."""
    cls = _ERRNO_CLASSES.get(code, StoreIOError)
    why = _WHY.get(code, os.strerror(code))
    if code == _errno.EMFILE:
        why = why.format(nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    elif code == _errno.ENOMEM:
        why = why.format(maps=_max_map_count())
    raise cls(code, f"{what}: {why}", str(path))


def _max_map_count():
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):   # no /proc, or no descriptor left to read it
        return "?"


def raise_not_regular(path, what):
    """Raise the StoreIOError for a store file that is a directory, FIFO, socket or device."""
    raise StoreIOError(_errno.EINVAL, f"{what}: not a regular file", str(path))


def check_call(func, args, kwargs):
    """Raise InvalidArgumentTypeError when ``args`` and ``kwargs`` do not fit ``func``'s
    signature (an unknown keyword, too many or too few arguments): what a public entry
    calls when ``func(*args, **kwargs)`` raised TypeError, to tell a bad call from a
    TypeError of its own (re-raised by the caller)."""
    try:
        inspect.signature(func).bind(*args, **kwargs)
    except TypeError as e:
        raise InvalidArgumentTypeError(f"{func.__qualname__}(): {e}") from None
