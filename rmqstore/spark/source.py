"""The "rocketmq" PySpark data source (Spark 4 Python Data Source API), batch and streaming.

``spark.read.format("rocketmq").load(path_or_glob)`` (or ``.load([paths])``) reads one or
many store directories; a path may also be a directory whose subdirectories are stores.
One partition per commitlog segment, or per ``splitBytes`` byte range of a larger one, as
far as the segment holds data (not its file size: see ``plan``);
each decodes with ``rmqstore.batch.iter_arrow`` straight into Arrow record batches. Only the
columns of the schema are decoded: give one (``.schema("topic string, body binary")``) or
the ``columns`` option (comma-separated names); an unknown column or another type is an
InvalidArgumentError naming it. ``df.write.format("rocketmq")`` writes stores (see
``rmqstore.spark.writer``). Executors open segment files by the paths the driver planned:
stores must be at the same path everywhere, else the task fails with StoreIOError.

Options: ``mode`` fail (default) | skip (corrupt records are skipped; each partition logs
what it skipped), ``checkCrc`` (false), ``splitBytes`` (32 MiB), ``minPartitions`` (1:
smaller splits, down to 4 MiB, until there are this many), ``batchBytes`` (1 MiB of records
per Arrow batch: a batch goes to the JVM while it is still in the core's cache), ``topic``
(comma-separated), ``since`` / ``until`` (store time: epoch ms or ISO-8601, ``until``
exclusive), ``key`` (one of KEYS) and ``uniqKey``: applied in the reader, so only matches
reach the JVM. With ``spark.sql.python.filterPushdown.enabled`` on (see ``register``),
filters on ``topic`` (=, IN) and ``store_timestamp`` (<, <=, >, >=, =) are pushed down and
applied in the reader.
An option the source does not take (names in any case) is an InvalidArgumentError.

Streaming (``spark.readStream``): offsets are commitlog offsets (always record boundaries)
per store, the store named by its identity, not its path (see ``_StreamReader``);
``startingOffsets`` earliest (default) | latest. Each micro-batch reads
the records appended since the last one, so a query tails a live store; with a checkpoint
and a file sink it restarts exactly once. ``maxBytesPerTrigger`` (ReadMaxBytes) bounds the
commitlog bytes a micro-batch takes, shared among the stores with a backlog. A stream that
stays at zeros with records after them (a hole) fails there (mode fail) or goes on past it
(mode skip); see ``_StreamReader._end``.
"""
import difflib
import errno
import functools
import logging
import math
import os
import socket
import time
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
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

from rmqstore import batch
from rmqstore.arguments import decimal_int
from rmqstore.errors import CorruptRecordError, InvalidArgumentError, StoreIOError, StoreNotFoundError
from rmqstore.files import parse_json
from rmqstore.spark.options import bool_option, check_options, int_option, list_option
from rmqstore.spark.stores import find_stores, store_identity

log = logging.getLogger(__name__)
NAME = "rocketmq"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def _spark_schema(columns=None):
    """The Spark schema of ``columns`` (default: all of ``batch.arrow_schema()``)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    full = batch.arrow_schema()
    return from_arrow_schema(full if columns is None else _pa().schema([full.field(c) for c in columns]))


def _option_columns(options):
    """The ``columns`` option (comma-separated names) as a tuple, checked; None if absent."""
    names = list_option(options, "columns")
    if names is None:
        return None
    known = batch.arrow_schema().names
    unknown = [c for c in names if c not in known]
    if unknown:
        raise InvalidArgumentError(f"rocketmq source: unknown column(s) {unknown} in the columns option; "
                                   f"the columns are {known}")
    return names


def projection(schema, options):
    """The columns to decode for a reader given Spark ``schema`` (the user's, or ours): each
    field must be one of the source's columns with its type; a ``columns`` option must name
    the same fields. InvalidArgumentError names the column at fault."""
    full = {f.name: f.dataType for f in _spark_schema().fields}
    names = tuple(schema.fieldNames())
    for f in schema.fields:
        if f.name not in full:
            raise InvalidArgumentError(f"rocketmq source: unknown column {f.name!r}; the columns are {list(full)}")
        if f.dataType != full[f.name]:
            raise InvalidArgumentError(f"rocketmq source: column {f.name!r} is {full[f.name].simpleString()}, "
                                       f"not {f.dataType.simpleString()}")
    wanted = _option_columns(options)
    if wanted is not None and wanted != names:
        raise InvalidArgumentError(f"rocketmq source: the columns option {list(wanted)} differs from the schema "
                                   f"{list(names)}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"rocketmq source: a column is listed twice in {list(names)}")
    return names


def _paths(options):
    if "paths" in options:
        try:
            paths = parse_json(options["paths"])
        except ValueError:
            paths = None
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise InvalidArgumentError(f"rocketmq source: option paths must be a JSON list of str, "
                                       f"not {options['paths']!r}")
        return paths
    if "path" in options:
        return [p for p in options["path"].split(",") if p]
    raise InvalidArgumentError("rocketmq source: give a store path to load()")


# the options each side takes; Spark itself passes only ``path`` (load(p), save(p)) or
# ``paths`` (load([...])), and every name case-insensitively (lower-cased)
READ_OPTIONS = ("path", "paths", "columns", "mode", "checkCrc", "batchBytes", "topic", "since", "until", "key",
                "uniqKey")
BATCH_OPTIONS = READ_OPTIONS + ("splitBytes", "minPartitions")
STREAM_OPTIONS = READ_OPTIONS + ("startingOffsets", "maxBytesPerTrigger")


def _time_option(options, name):
    """Option ``name`` as epoch ms (see epoch_ms), None when absent."""
    if name not in options:
        return None
    try:
        return epoch_ms(options[name])
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"rocketmq source: option {name}: {e}") from None


def epoch_ms(value):
    """Epoch ms from an int, a numeric string, an ISO-8601 string or a datetime (naive = UTC)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        ms = decimal_int(value)
        if ms is not None:
            return ms
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidArgumentError(f"not a time (epoch ms or ISO-8601): {value!r}") from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return round(value.timestamp() * 1000)
    raise InvalidArgumentError(f"not a timestamp: {value!r}")


def _warn_unheld_topics(stores, topics):
    """Log the topics of the topic option that no store's consume queues name (a typo reads
    no rows, as a broker answers a topic it does not hold), with the nearest they hold."""
    held = {t for s in stores if os.path.isdir(cq := os.path.join(s, "consumequeue")) for t in os.listdir(cq)}
    for t in sorted(set(topics) - held):
        if held:
            log.warning("rocketmq source: no store holds topic %r (nearest: %s)", t,
                        difflib.get_close_matches(t, sorted(held), 3, 0.5) or "none close")


class Scan:
    """What a reader reads, and the filters it applies: picklable, shared by all readers."""

    def __init__(self, options, columns=None):
        self.stores = find_stores(_paths(options))
        self.columns = tuple(batch.arrow_schema().names) if columns is None else tuple(columns)
        self.mode = options.get("mode", "fail")
        if self.mode not in batch.MODES:
            raise InvalidArgumentError(f"rocketmq source: mode must be one of {batch.MODES}, not {self.mode!r}")
        self.check_crc = bool_option(options, "checkCrc")
        self.split_bytes = int_option(options, "splitBytes", 32 << 20, 1)
        self.min_partitions = int_option(options, "minPartitions", 1, 1)
        self.batch_bytes = int_option(options, "batchBytes", 1 << 20, 1)
        topics = list_option(options, "topic")
        self.topics = None if topics is None else set(topics)
        self.since = _time_option(options, "since")   # inclusive
        self.until = _time_option(options, "until")   # exclusive
        self.key = options.get("key")
        self.uniq_key = options.get("uniqKey")
        for name, values in (("topic", self.topics or ()), ("key", [self.key]), ("uniqKey", [self.uniq_key])):
            if any(v is not None and (not v or v.isspace() or name == "key" and " " in v) for v in values):
                raise InvalidArgumentError(f"rocketmq source: option {name} {options.get(name)!r} names an empty, "
                                           "blank or (a key) space-holding value, which no message has")
        if self.topics:
            _warn_unheld_topics(self.stores, self.topics)

    def push(self, filters):
        """Take the filters this scan applies exactly; return the others."""
        rest = []
        for f in filters:
            col = getattr(f, "attribute", None)   # Not, And... have none: not pushed
            if col == ("topic",) and isinstance(f, (EqualTo, In)):
                vals = {f.value} if isinstance(f, EqualTo) else set(f.value)
                self.topics = vals if self.topics is None else self.topics & vals
            elif col == ("store_timestamp",) and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual,
                                                                 LessThan, LessThanOrEqual)):
                us = _epoch_us(f.value)
                lo = {EqualTo: us, GreaterThan: us + 1, GreaterThanOrEqual: us}.get(type(f))
                hi = {EqualTo: us + 1, LessThan: us, LessThanOrEqual: us + 1}.get(type(f))
                if lo is not None:   # store times are whole ms: round the µs bound up
                    self.since = -(-lo // 1000) if self.since is None else max(self.since, -(-lo // 1000))
                if hi is not None:
                    self.until = -(-hi // 1000) if self.until is None else min(self.until, -(-hi // 1000))
            else:
                rest.append(f)
        return rest

    def read(self, store, path, base, start, end, aligned=False):
        """Arrow record batches (of ``columns``) of the records starting in ``[start, end)``
        of one segment, filtered."""
        import pyarrow.compute as pc
        pa = _pa()
        filters = [c for c, on in (("topic", self.topics is not None), ("keys", self.key is not None),
                                   ("uniq_key", self.uniq_key is not None),
                                   ("store_timestamp", self.since is not None or self.until is not None)) if on]
        need = self.columns + tuple(c for c in filters if c not in self.columns)
        if not os.path.exists(path):
            raise StoreIOError(errno.ENOENT, f"commitlog segment planned on the driver is not visible on executor "
                               f"host {socket.gethostname()}: stores must be at the same path on the driver and "
                               f"every executor (a shared filesystem)", path)
        stats = batch.DecodeStats()
        for rb in batch.iter_arrow(path, base, start, end, store=store, columns=need, check_crc=self.check_crc,
                                   mode=self.mode, batch_bytes=self.batch_bytes, stats=stats, aligned=aligned):
            masks = []
            if self.topics is not None:
                masks.append(pc.is_in(rb.column("topic"), value_set=pa.array(sorted(self.topics), pa.string())))
            if self.since is not None or self.until is not None:
                us = rb.column("store_timestamp").cast(pa.int64()).to_numpy()
                lo = -(1 << 62) if self.since is None else self.since * 1000
                hi = 1 << 62 if self.until is None else self.until * 1000
                masks.append(pa.array((us >= lo) & (us < hi)))
            if self.key is not None:
                keys = rb.column("keys")
                rows = pc.list_parent_indices(keys).to_numpy()[pc.equal(pc.list_flatten(keys), self.key)
                                                               .to_numpy(zero_copy_only=False)]
                hit = np.zeros(rb.num_rows, bool)
                hit[rows] = True
                masks.append(pa.array(hit))
            if self.uniq_key is not None:
                masks.append(pc.fill_null(pc.equal(rb.column("uniq_key"), self.uniq_key), False))
            if masks:
                rb = rb.filter(functools.reduce(pc.and_, masks))
            if len(need) > len(self.columns):
                rb = rb.select(list(self.columns))
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


MAX_PARTITIONS = 100_000


def data_segments(store):
    """(path, base offset, bytes to read) of ``store``'s commitlog segments: each read up to
    where its data ends (``batch.data_end``), not its file size, unless a later segment holds
    data (zeros at its end are then a hole, which the reader reports)."""
    files = batch.segment_files(store)
    out, later = [], False
    for path, base, size in reversed(files):
        end = batch.data_end(path, size)
        out.append((path, base, size if later else end))
        later = later or end > 0
    return out[::-1]


def plan(stores, split_bytes=32 << 20, min_partitions=1):
    """Ranges of about ``split_bytes`` (less, down to 4 MiB, to make ``min_partitions``) of
    where the stores hold data (``data_segments``): small segments packed together, large
    ones split."""
    files = {store: data_segments(store) for store in stores}
    total = sum(size for fs in files.values() for _, _, size in fs)
    split_bytes = min(split_bytes, max(4 << 20, -(-total // max(min_partitions, 1))))
    ranges = sum(-(-size // split_bytes) for fs in files.values() for _, _, size in fs)
    if ranges > MAX_PARTITIONS:   # the plan alone would take the driver's memory and time
        raise InvalidArgumentError(f"rocketmq source: splitBytes {split_bytes} cuts {total} bytes of commitlog into "
                                   f"{ranges} partitions, over {MAX_PARTITIONS}; give splitBytes "
                                   f"{-(-total // MAX_PARTITIONS)} or more")
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


HOLE_SETTLE_SECONDS = 1.0   # a stream stopped at zeros this long checks they are no hole (a writer's
HOLE_CHECK_SECONDS = 10.0   # record in flight fills them sooner), then again this often while stopped


def _other_store(was, now):
    """Whether store keys ``was`` and ``now`` (see ``stores.store_identity``) tell two stores."""
    was, now = was.split("@")[0].split(":"), now.split("@")[0].split(":")
    if was[0] == now[0] == "id":
        return was != now
    return was[0] == now[0] == "head" and len(was) == len(now) == 3 and was[1] == now[1] and \
        "empty" not in (was[2], now[2]) and was != now


class _StreamReader(DataSourceStreamReader):
    """Offsets name each store by its identity (``stores.store_identity``), not its path:
    ``{key: {"offset": commitlog offset, "store": path, "root": device:inode}}``, so a
    query restarted from its checkpoint with a store named through another path (a link,
    a bind mount, a moved mount point, a copy) goes on where it was; a store the
    checkpoint names that the query cannot find any more is a StoreNotFoundError naming
    it, not a start from scratch. Checkpoints of before (``{path: offset}``) are read by
    path."""

    def __init__(self, scan, options):
        self.scan = scan
        self.starting = options.get("startingOffsets", "earliest")
        if self.starting not in ("earliest", "latest"):
            raise InvalidArgumentError("rocketmq source: option startingOffsets must be 'earliest' or 'latest'")
        self.max_bytes = int_option(options, "maxBytesPerTrigger", 0, 0)
        self._stopped = {}   # store -> (offset it stopped at, since, last hole check): monotonic times
        ids = {s: store_identity(s) for s in scan.stores}
        keys = [key for key, _ in ids.values()]
        # two stores of one identity (copies read together): told apart by their directories
        self.keys = {s: key if keys.count(key) == 1 else f"{key}@{root}" for s, (key, root) in ids.items()}
        self.roots = {s: root for s, (_, root) in ids.items()}

    def getDefaultReadLimit(self):
        return ReadMaxBytes(self.max_bytes) if self.max_bytes else ReadAllAvailable()

    def _offsets(self, positions):
        """Offsets as the checkpoint holds them, from {store: commitlog offset}."""
        return {self.keys[s]: {"offset": positions[s], "store": s, "root": self.roots[s]} for s in self.scan.stores}

    def positions(self, offsets):
        """{store: commitlog offset} of ``offsets`` (this reader's, or a checkpoint's): each
        entry found by the store's key, else by its directory (device and inode) unless its
        first record tells another store (retention removing the first segment changes a
        key from the first record, not the directory), else, in a checkpoint of before,
        by path. A store with no entry (new to the query) starts at its first segment.
        StoreNotFoundError names the entries no store of the query matches."""
        by_key = {k: s for s, k in self.keys.items()}
        out, lost = {}, []
        for key, value in (offsets or {}).items():
            if isinstance(value, int):   # {path: offset}
                store = next((s for s in self.scan.stores if os.path.realpath(s) == os.path.realpath(key)), None)
                where, offset = key, value
            elif isinstance(value, dict) and isinstance(value.get("offset"), int):
                store = by_key.get(key) or self._same_directory(key, value.get("root"))
                where, offset = value.get("store", "?"), value["offset"]
            else:
                raise InvalidArgumentError(f"rocketmq stream source: {key!r}: {value!r} is no offset of this source")
            if store is None or store in out:
                lost.append(f"{where} ({key})")
            else:
                out[store] = offset
        if lost:
            raise StoreNotFoundError(errno.ENOENT, f"rocketmq stream source: the checkpoint names {len(lost)} store(s) "
                                     f"this query no longer finds: {', '.join(lost)}; it reads {self.scan.stores}. "
                                     "A store is found at any path by its identity; one removed, or replaced by "
                                     "another store, is not: start the query from a new checkpoint to read "
                                     "these stores from their start", lost[0])
        return {s: out[s] if s in out else self._first(s) for s in self.scan.stores}

    def _same_directory(self, key, root):
        """The store of the query in directory ``root`` (device:inode) unless its key tells
        another store than checkpoint key ``key``: another id, or another first record in
        the same first segment (inode numbers are used again once a directory is gone)."""
        return next((s for s, r in self.roots.items() if r == root and not _other_store(key, self.keys[s])), None)

    @staticmethod
    def _first(store):
        return files[0][1] if (files := batch.segment_files(store)) else 0

    def initialOffset(self):
        if self.starting == "latest":
            return self._offsets({s: batch.end_offset(s) for s in self.scan.stores})
        return self._offsets({s: self._first(s) for s in self.scan.stores})

    def latestOffset(self, start=None, limit=None):
        """Where written data ends in each store; with a ReadMaxBytes limit, no further than
        that many commitlog bytes past ``start`` in all (shared among stores with a backlog,
        at least one record each)."""
        start = self.positions(start)
        latest = {s: self._end(s, start[s]) for s in self.scan.stores}
        if isinstance(limit, ReadMaxBytes):
            behind = [s for s in self.scan.stores if latest[s] > start[s]]
            share = max(1, limit.max_bytes // max(1, len(behind)))
            for s in behind:
                if latest[s] - start[s] > share:
                    latest[s] = min(latest[s], batch.advance(s, start[s], share))
        return self._offsets(latest)

    def _end(self, store, start):
        """end_offset of ``store``. Zeros with records after them (a hole) would stop the
        stream there for good, in silence: once it has stayed at an offset for
        HOLE_SETTLE_SECONDS, that is checked (again every HOLE_CHECK_SECONDS while it
        stays). Mode fail raises CorruptRecordError; mode skip goes on past the hole, which
        the reader counts as a corrupt region."""
        end, now = batch.end_offset(store, start), time.monotonic()
        at, since, checked = self._stopped.get(store, (None, now, -math.inf))
        if end > start or at != end:
            self._stopped[store] = (end, now, -math.inf)
            return end
        if now - since < HOLE_SETTLE_SECONDS or now - checked < HOLE_CHECK_SECONDS:
            return end
        self._stopped[store] = (end, since, now)
        after = batch.after_hole(store, end)
        if after is None:
            return end
        if self.scan.mode == "fail":
            raise CorruptRecordError(f"{store}: commitlog offset {end}: {batch.HOLE}; the stream cannot go on "
                                     "(mode skip skips it)", end)
        log.warning("%s: commitlog offset %d: %s; the stream goes on at %d", store, end, batch.HOLE, after)
        return batch.end_offset(store, after)

    def partitions(self, start, end):
        out = []
        start, end = self.positions(start), self.positions(end)
        for store in self.scan.stores:
            lo, hi = start[store], end[store]
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
        return _spark_schema(_option_columns(self.options))

    def reader(self, schema):
        check_options(self.options, BATCH_OPTIONS, "source")
        return _Reader(Scan(self.options, projection(schema, self.options)))

    def writer(self, schema, overwrite):
        from rmqstore.spark.writer import StoreWriter, check_schema
        check_schema(schema, _spark_schema())
        if "path" not in self.options:
            raise InvalidArgumentError("rocketmq writer: give the output directory to save()")
        return StoreWriter(self.options["path"], self.options, overwrite)

    def streamReader(self, schema):
        check_options(self.options, STREAM_OPTIONS, "stream source")
        return _StreamReader(Scan(self.options, projection(schema, self.options)), self.options)


class RocketMQPushdownDataSource(RocketMQDataSource):
    """The same source with filter pushdown (needs ``spark.sql.python.filterPushdown.enabled``)."""

    def reader(self, schema):
        check_options(self.options, BATCH_OPTIONS, "source")
        return _PushdownReader(Scan(self.options, projection(schema, self.options)))


def register(spark):
    """Register ``format("rocketmq")`` on ``spark``, with filter pushdown when the session
    enables it (Spark refuses a pushdown-capable Python reader otherwise)."""
    pushdown = spark.conf.get(PUSHDOWN_CONF, "false").lower() == "true"
    spark.dataSource.register(RocketMQPushdownDataSource if pushdown else RocketMQDataSource)
