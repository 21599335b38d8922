"""StoreConfig: RocketMQ's MessageStoreConfig knobs under snake_case names, same defaults."""
import functools
from dataclasses import dataclass, fields, replace

from rmqstore.errors import FrozenObjectError, InvalidArgumentError, check_call

_DELAY_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_INT_MAX = (1 << 31) - 1          # Java int: what RocketMQ's MessageStoreConfig holds
_MAX_DELAY_MS = 100 * 365 * 86_400_000
_INDEX_HEADER = 40

# Allowed range of every int field (inclusive). File sizes stay below 2 GiB as RocketMQ's
# int-sized mapped files do; counts that size buffers stay small.
_RANGES = {
    "commitlog_file_size": (4096, _INT_MAX),
    "consume_queue_entries": (1, _INT_MAX // 20),
    "index_slots": (1, (_INT_MAX - _INDEX_HEADER - 40) // 4),
    "index_entries": (2, (_INT_MAX - _INDEX_HEADER - 4) // 20),
    "flush_interval_ms": (1, _INT_MAX),
    "flush_least_pages": (0, _INT_MAX),
    "flush_thorough_interval_ms": (0, _INT_MAX),
    "flush_cq_interval_ms": (1, _INT_MAX),
    "flush_cq_least_pages": (0, _INT_MAX),
    "flush_cq_thorough_interval_ms": (0, _INT_MAX),
    "sync_flush_timeout_ms": (1, _INT_MAX),
    "max_message_size": (1, _INT_MAX),
    "message_version": (1, 2),
    "default_queue_nums": (1, _INT_MAX),
    "max_msgs_num_batch": (1, 65_535),
    "max_transfer_count_on_message_in_memory": (1, 65_535),
    "max_transfer_bytes_on_message_in_memory": (1, _INT_MAX),
    "file_reserved_time": (0, _INT_MAX),
    "disk_max_used_space_ratio": (0, 100),   # a percentage
    "warm_ahead_bytes": (0, _INT_MAX),
    "reserve_ahead_bytes": (0, _INT_MAX),
    "file_mode": (0o600, 0o777),   # the owner must read and write (the store reopens its files)
    "dir_mode": (0o700, 0o777),
}
_CHOICES = {"flush_mode": ("sync", "async")}


@dataclass(frozen=True)
class StoreConfig:
    """Every size, interval and limit of a store. Sizes in bytes, intervals in ms."""

    commitlog_file_size: int = 1 << 30
    consume_queue_entries: int = 300_000
    index_slots: int = 5_000_000
    index_entries: int = 20_000_000
    message_index_enable: bool = True
    generate_uniq_key: bool = False
    flush_mode: str = "async"
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    flush_cq_interval_ms: int = 1000
    flush_cq_least_pages: int = 2
    flush_cq_thorough_interval_ms: int = 60_000
    sync_flush_timeout_ms: int = 5000
    max_message_size: int = 4 * 1024 * 1024
    message_version: int = 1
    store_host: str = "127.0.0.1:10911"
    default_queue_nums: int = 4
    max_msgs_num_batch: int = 64
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    check_crc_on_recover: bool = True
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    strict_topic_names: bool = True
    warm_mapped_file: bool = True
    background_dispatch: bool = True   # False: consume queues and index built by wait_dispatched() / close()
    warm_ahead_bytes: int = 16 * 1024 * 1024
    reserve_ahead_bytes: int = 16 * 1024 * 1024   # disk blocks allocated ahead of a writer; 0: whole files
    file_mode: int = 0o600
    dir_mode: int = 0o700

    def __post_init__(self):
        """Check every field's type and range (InvalidArgumentError naming the field)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is bool and type(value) is not bool:
                raise InvalidArgumentError(f"{f.name} must be True or False, not {value!r}")
            if f.type is str and type(value) is not str:
                raise InvalidArgumentError(f"{f.name} must be a string, not {value!r}")
            if f.type is int:
                lo, hi = _RANGES[f.name]
                if type(value) is not int or not lo <= value <= hi:
                    show = oct if f.name.endswith("_mode") else str
                    raise InvalidArgumentError(f"{f.name} must be an int in {show(lo)}..{show(hi)}, not "
                                               f"{show(value) if type(value) is int else repr(value)}")
            if f.name in _CHOICES and value not in _CHOICES[f.name]:
                raise InvalidArgumentError(f"{f.name} must be one of {_CHOICES[f.name]}, not {value!r}")
        index_size = _INDEX_HEADER + 4 * self.index_slots + 20 * self.index_entries
        if index_size > _INT_MAX:
            raise InvalidArgumentError(f"index_slots and index_entries give a {index_size}-byte index file "
                                       f"(40 + 4*slots + 20*entries must be at most {_INT_MAX})")
        for h in self.delete_when.split(";"):
            if not (h.strip().isascii() and h.strip().isdigit() and int(h) <= 23):
                raise InvalidArgumentError(f"delete_when must be hours 00..23 joined by ';', not {self.delete_when!r}")
        from rmqstore._record import pack_host
        pack_host(self.store_host)
        if not self.delay_levels_ms():
            raise InvalidArgumentError("message_delay_level must name at least one level")

    def delay_levels_ms(self):
        """Delay per level (level 1 first), parsed from message_delay_level."""
        out = []
        for tok in self.message_delay_level.split():
            n = tok[:-1]
            if not (n.isascii() and n.isdigit()) or tok[-1] not in _DELAY_UNITS \
                    or not 0 < int(n) * _DELAY_UNITS[tok[-1]] <= _MAX_DELAY_MS:
                raise InvalidArgumentError(f"message_delay_level: bad level {tok!r} (a count of s, m, h or d, "
                                           f"more than 0 and at most {_MAX_DELAY_MS} ms)")
            out.append(int(n) * _DELAY_UNITS[tok[-1]])
        return out

    def logics_reserve_ahead(self):
        """How far ahead of their writer consume-queue and index files get their disk blocks:
        a 16th of the commitlog's window (an entry is 20 bytes, a small record 150 and
        more), at least a page; 0 (whole files at creation) stays 0."""
        return max(4096, self.reserve_ahead_bytes // 16) if self.reserve_ahead_bytes else 0

    def with_(self, **changes):
        """A copy with the fields in ``changes`` replaced (checked like a new StoreConfig)."""
        return replace(self, **changes)

    @classmethod
    def names(cls):
        return [f.name for f in fields(cls)]


def _checked_call(method):
    """A method of StoreConfig (its generated __init__, with_), an unknown field name or a
    call that does not fit an InvalidArgumentTypeError (see errors.check_call) rather than
    a bare TypeError."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except TypeError:
            check_call(method, args, kwargs)
            raise
    return run


def _frozen(self, name, *value):
    """StoreConfig's __setattr__ / __delattr__: FrozenObjectError (a FrozenInstanceError)."""
    raise FrozenObjectError(f"StoreConfig is immutable: cannot change {name!r} (with_() makes a changed copy)")


StoreConfig.__init__ = _checked_call(StoreConfig.__init__)   # type: ignore[method-assign]
StoreConfig.__setattr__ = StoreConfig.__delattr__ = _frozen   # type: ignore[method-assign]
StoreConfig.with_ = _checked_call(StoreConfig.with_)   # type: ignore[method-assign]
