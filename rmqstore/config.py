"""StoreConfig: RocketMQ's MessageStoreConfig knobs under snake_case names, same defaults."""
from dataclasses import dataclass, fields, replace

from rmqstore.errors import InvalidArgumentError

_DELAY_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


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
    warm_ahead_bytes: int = 64 * 1024 * 1024
    file_mode: int = 0o600
    dir_mode: int = 0o700

    def __post_init__(self):
        if self.flush_mode not in ("sync", "async"):
            raise InvalidArgumentError(f"flush_mode must be 'sync' or 'async', not {self.flush_mode!r}")
        if self.message_version not in (1, 2):
            raise InvalidArgumentError("message_version must be 1 or 2")
        if self.commitlog_file_size < 4096 or self.commitlog_file_size > (1 << 31) - 1:
            raise InvalidArgumentError("commitlog_file_size must be 4 KiB .. 2 GiB-1")
        for name in ("consume_queue_entries", "index_slots", "index_entries", "default_queue_nums",
                     "max_msgs_num_batch", "max_message_size", "flush_interval_ms", "flush_cq_interval_ms"):
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} must be positive")
        if self.index_entries < 2:
            raise InvalidArgumentError("index_entries must be at least 2 (entry 0 is unused)")
        self.delay_levels_ms()

    def delay_levels_ms(self):
        """Delay per level (level 1 first), parsed from message_delay_level."""
        out = []
        for tok in self.message_delay_level.split():
            try:
                out.append(int(tok[:-1]) * _DELAY_UNITS[tok[-1]])
            except (KeyError, ValueError):
                raise InvalidArgumentError(f"bad delay level {tok!r}") from None
        return out

    def with_(self, **changes):
        return replace(self, **changes)

    @classmethod
    def names(cls):
        return [f.name for f in fields(cls)]
