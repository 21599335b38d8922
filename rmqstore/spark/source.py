"""The "rocketmq" PySpark data source (Spark 4 Python Data Source API), batch and streaming.

``spark.read.format("rocketmq").load(path_or_glob)`` (or ``.load([paths])``) reads one or
many store directories; a path may also be a directory whose subdirectories are stores.
One partition per commitlog segment, or per ``splitBytes`` byte range of a larger one;
each decodes with ``rmqstore.batch`` and yields Arrow record batches.

Options: ``mode`` fail (default) | skip (corrupt records are skipped; each partition logs
what it skipped), ``checkCrc`` (false), ``splitBytes`` (32 MiB), ``minPartitions`` (1:
smaller splits, down to 4 MiB, until there are this many), ``batchBytes`` (4 MiB of records
per Arrow batch: cache-sized batches decode fastest), ``topic`` (comma-separated),
``since`` / ``until`` (store time: epoch ms or ISO-8601, ``until`` exclusive), ``key`` (one
of KEYS) and ``uniqKey``: applied in the reader, so only matches reach the JVM. With
``spark.sql.python.filterPushdown.enabled`` on (see ``register``), filters on ``topic``
(=, IN) and ``store_timestamp`` (<, <=, >, >=, =) are pushed down and applied in the reader.

Streaming (``spark.readStream``): offsets are ``{store path: commitlog offset}``, always
record boundaries; ``startingOffsets`` earliest (default) | latest. Each micro-batch reads
the records appended since the last one, so a query tails a live store.
"""
import functools
import glob
import json
import logging
import os
from datetime import datetime, timezone

import numpy as np
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from rmqstore import batch
from rmqstore.errors import InvalidArgumentError

log = logging.getLogger(__name__)
NAME = "rocketmq"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def _ddl():
    from pyspark.sql.pandas.types import from_arrow_schema
    return from_arrow_schema(batch.arrow_schema())


def find_stores(paths):
    """Store directories (holding ``commitlog/``) named by ``paths``: globs expanded, a
    directory that is not a store contributes its store subdirectories. Sorted, unique."""
    out = set()
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


def _paths(options):
    if "paths" in options:
        return json.loads(options["paths"])
    if "path" in options:
        return [p for p in options["path"].split(",") if p]
    raise InvalidArgumentError("rocketmq source: give a store path to load()")


def _epoch_ms(value):
    """Epoch ms from an int, a numeric string, an ISO-8601 string or a datetime (naive = UTC)."""
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        if value.lstrip("-").isdigit():
            return int(value)
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1000)
    raise InvalidArgumentError(f"not a timestamp: {value!r}")


class Scan:
    """What a reader reads, and the filters it applies: picklable, shared by all readers."""

    def __init__(self, options):
        self.stores = find_stores(_paths(options))
        self.mode = options.get("mode", "fail")
        if self.mode not in batch.MODES:
            raise InvalidArgumentError(f"rocketmq source: mode must be one of {batch.MODES}, not {self.mode!r}")
        self.check_crc = options.get("checkCrc", "false").lower() == "true"
        self.split_bytes = max(1, int(options.get("splitBytes", 32 << 20)))
        self.min_partitions = int(options.get("minPartitions", 1))
        self.batch_bytes = int(options.get("batchBytes", 4 << 20))
        topics = options.get("topic")
        self.topics = set(topics.split(",")) if topics else None
        self.since = _epoch_ms(options["since"]) if "since" in options else None   # inclusive
        self.until = _epoch_ms(options["until"]) if "until" in options else None   # exclusive
        self.key = options.get("key")
        self.uniq_key = options.get("uniqKey")

    def push(self, filters):
        """Take the filters this scan applies exactly; return the others."""
        rest = []
        for f in filters:
            col = f.attribute
            if col == ("topic",) and isinstance(f, (EqualTo, In)):
                vals = {f.value} if isinstance(f, EqualTo) else set(f.value)
                self.topics = vals if self.topics is None else self.topics & vals
            elif col == ("store_timestamp",) and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual,
                                                                 LessThan, LessThanOrEqual)):
                us = _epoch_us(f.value)
                lo = {EqualTo: us, GreaterThan: us + 1, GreaterThanOrEqual: us}.get(type(f))
                hi = {EqualTo: us + 1, LessThan: us, LessThanOrEqual: us + 1}.get(type(f))
                if lo is not None:   # store times are whole ms: round the µs bound up
                    self.since = max(self.since or -(1 << 62), -(-lo // 1000))
                if hi is not None:
                    self.until = min(self.until or (1 << 62), -(-hi // 1000))
            else:
                rest.append(f)
        return rest

    def read(self, store, path, base, start, end, aligned=False):
        """Arrow record batches of the records starting in ``[start, end)`` of one segment."""
        import pyarrow.compute as pc
        stats = batch.DecodeStats()
        for cols in batch.iter_columns(path, base, start, end, check_crc=self.check_crc, mode=self.mode,
                                       batch_bytes=self.batch_bytes, stats=stats, aligned=aligned):
            rb = batch.to_arrow(cols, store)
            masks = []
            if self.topics is not None:
                masks.append(pc.is_in(rb.column("topic"), value_set=_pa().array(sorted(self.topics), _pa().string())))
            if self.since is not None or self.until is not None:
                ms = cols["store_timestamp"]
                masks.append(_pa().array((ms >= (self.since if self.since is not None else ms.min()))
                                         & (ms < (self.until if self.until is not None else ms.max() + 1))))
            if self.key is not None:
                keys = rb.column("keys")
                rows = pc.list_parent_indices(keys).to_numpy()[pc.equal(pc.list_flatten(keys), self.key)
                                                               .to_numpy(zero_copy_only=False)]
                hit = np.zeros(rb.num_rows, bool)
                hit[rows] = True
                masks.append(_pa().array(hit))
            if self.uniq_key is not None:
                masks.append(pc.fill_null(pc.equal(rb.column("uniq_key"), self.uniq_key), False))
            if masks:
                rb = rb.filter(functools.reduce(pc.and_, masks))
            if rb.num_rows:
                yield rb
        if stats.corrupt:
            log.warning("%s [%d, %d): skipped %d corrupt region(s), %d bytes, at commitlog offsets %s",
                        path, start, end, stats.corrupt, stats.skipped_bytes, stats.corrupt_offsets)


def _pa():
    import pyarrow
    return pyarrow


def _epoch_us(value):
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(value) * 1000


class Ranges(InputPartition):
    """One task's work: ``pieces`` of one store, each (segment path, base offset, start,
    end), the records starting in ``[start, end)`` of that segment."""

    def __init__(self, store, pieces):
        super().__init__((store, pieces))
        self.store, self.pieces = store, pieces


def plan(stores, split_bytes=32 << 20, min_partitions=1):
    """Ranges of about ``split_bytes`` (less, down to 4 MiB, to make ``min_partitions``):
    small segments packed together, large ones split."""
    files = {store: batch.segment_files(store) for store in stores}
    total = sum(size for fs in files.values() for _, _, size in fs)
    split_bytes = min(split_bytes, max(4 << 20, -(-total // max(min_partitions, 1))))
    out = []
    for store in stores:
        pieces, total = [], 0
        for path, base, size in files[store]:
            for s in range(0, size, split_bytes):
                e = min(s + split_bytes, size)
                if pieces and total + e - s > split_bytes:
                    out.append(Ranges(store, pieces))
                    pieces, total = [], 0
                pieces.append((path, base, s, e))
                total += e - s
        if pieces:
            out.append(Ranges(store, pieces))
    return out


class _Reader(DataSourceReader):
    def __init__(self, scan):
        self.scan = scan

    def partitions(self):
        return plan(self.scan.stores, self.scan.split_bytes, self.scan.min_partitions) or [Ranges(None, [])]

    def read(self, partition):
        for path, base, start, end in partition.pieces:
            yield from self.scan.read(partition.store, path, base, start, end)


class _PushdownReader(_Reader):
    def pushFilters(self, filters):
        return self.scan.push(filters)


class _StreamReader(DataSourceStreamReader):
    def __init__(self, scan, options):
        self.scan = scan
        self.starting = options.get("startingOffsets", "earliest")
        if self.starting not in ("earliest", "latest"):
            raise InvalidArgumentError("startingOffsets must be 'earliest' or 'latest'")

    def initialOffset(self):
        if self.starting == "latest":
            return {s: batch.end_offset(s) for s in self.scan.stores}
        return {s: (files[0][1] if (files := batch.segment_files(s)) else 0) for s in self.scan.stores}

    def latestOffset(self, start=None, limit=None):
        start = start or {}
        return {s: batch.end_offset(s, start.get(s, 0)) for s in self.scan.stores}

    def partitions(self, start, end):
        out = []
        for store in self.scan.stores:
            lo, hi = start.get(store, 0), end.get(store, 0)
            pieces = [(path, base, max(lo, base) - base, min(hi, base + size) - base)
                      for path, base, size in batch.segment_files(store) if max(lo, base) < min(hi, base + size)]
            if pieces:
                out.append(Ranges(store, pieces))
        return out

    def read(self, partition):
        for path, base, start, end in partition.pieces:
            yield from self.scan.read(partition.store, path, base, start, end, aligned=True)

    def commit(self, end):
        pass


class RocketMQDataSource(DataSource):
    """``format("rocketmq")``: RocketMQ store directories as a DataFrame (see module doc)."""

    @classmethod
    def name(cls):
        return NAME

    def schema(self):
        return _ddl()

    def reader(self, schema):
        return _Reader(Scan(self.options))

    def streamReader(self, schema):
        return _StreamReader(Scan(self.options), self.options)


class RocketMQPushdownDataSource(RocketMQDataSource):
    """The same source with filter pushdown (needs ``spark.sql.python.filterPushdown.enabled``)."""

    def reader(self, schema):
        return _PushdownReader(Scan(self.options))


def register(spark):
    """Register ``format("rocketmq")`` on ``spark``, with filter pushdown when the session
    enables it (Spark refuses a pushdown-capable Python reader otherwise)."""
    pushdown = spark.conf.get(PUSHDOWN_CONF, "false").lower() == "true"
    spark.dataSource.register(RocketMQPushdownDataSource if pushdown else RocketMQDataSource)
