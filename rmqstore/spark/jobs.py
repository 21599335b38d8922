"""Pipeline jobs over many stores: export to Parquet, rebuild consume queues and index
files, query, verify.

Each job is a function taking a SparkSession and returning a result plus a summary dict;
``rmqstore spark export|rebuild|query|verify`` (rmqstore.cli.spark) runs them from a shell.
Spark's console progress bar shows progress.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rmqstore import MessageStore, _record, batch
from rmqstore.arguments import checked
from rmqstore.checkpoint import Checkpoint
from rmqstore.config import StoreConfig
from rmqstore.dispatch import Dispatcher, deliver_time
from rmqstore.errors import InvalidArgumentError
from rmqstore.files import lock_writer, remove_stale
from rmqstore.index import IndexService
from rmqstore.maintenance.rebuild import mark_logics_lost
from rmqstore.segments import segment_name
from rmqstore.spark.partitioned import name_max, topic_dir
from rmqstore.spark.source import NAME, Scan, data_segments, epoch_ms, plan
from rmqstore.spark.stores import enclosing_store, find_stores, store_paths

_ENTRY = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
_HOLE = (0, 0x7FFFFFFF, 0)   # RocketMQ's fillPreBlank entry
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


def _tasks(spark):
    """Partitions to ask for: two per core, so a slow task does not idle the others."""
    return 2 * spark.sparkContext.defaultParallelism


def read(spark, stores, **options):
    """The stores as a DataFrame (the "rocketmq" source; ``options`` as strings)."""
    options.setdefault("minPartitions", _tasks(spark))
    return spark.read.format(NAME).options(**{k: str(v) for k, v in options.items()}).load(store_paths(stores))


def _export_part(scan, index, part, out_dir, compression, row_group_rows, sort_by, longest):
    """Write partition number ``index``'s records as Parquet files under ``out_dir`` in
    Spark's layout topic=/date= (see ``partitioned``); returns (messages, commitlog bytes,
    the topics whose directory name would be over ``longest`` bytes, not written)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rmqstore.spark.partitioned import PartitionedWriter
    schema = batch.arrow_schema()
    seen = [0, 0]

    def batches():
        for path, base, start, end in part.pieces:
            for rb in scan.read(part.store, path, base, start, end):
                seen[0] += rb.num_rows
                seen[1] += pc.sum(rb.column("store_size")).as_py() or 0
                yield rb

    data = batches()
    if sort_by:   # within the task's files, as Spark's sortWithinPartitions
        data = pa.Table.from_batches(list(data), schema).sort_by([(c, "ascending") for c in sort_by]).to_batches()
    writer = PartitionedWriter(out_dir, index, schema, row_group_rows, compression, name_max=longest)
    for rb in data:
        writer.write(rb)
    writer.close()
    return seen[0], seen[1], writer.too_long


EXPORT_SPLIT = (32 << 20, 1 << 30)
EXPORT_BATCH = 4 << 20         # each batch is split by topic and day: larger than the source's 1 MiB
SORTED_SPLIT_MAX = 256 << 20   # a sorting task holds its rows twice (read, sorted)
PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")


def _codec_available(name):
    import pyarrow as pa
    return isinstance(name, str) and name.lower() in PARQUET_CODECS and \
        (name.lower() == "none" or pa.Codec.is_available(name.lower()))


def _export_parts(stores, tasks, hi=EXPORT_SPLIT[1]):
    """The export's tasks: the stores' commitlogs shared out among ``tasks``, each share
    within EXPORT_SPLIT (at most ``hi``). Few large tasks: a Python task costs about 0.1 s
    to schedule whatever it does, as much as writing 50 MB of Parquet. Whole small segments
    are packed into a share, so up to half more per share is taken when that saves a small
    last task."""
    total = sum(size for s in stores for _, _, size in data_segments(s))
    lo = EXPORT_SPLIT[0]
    split = min(hi, max(lo, -(-total // max(1, tasks))))
    for k in range(5):
        parts = plan(stores, min(hi, split + k * split // 8))
        if len(parts) <= tasks:
            return parts
    return plan(stores, split)


def _is_export(out):
    """True when directory ``out`` holds only what an export leaves (finished or not):
    ``_SUCCESS``, ``_temporary/`` and ``topic=T/date=D/part-*.parquet`` files, none a link.
    Another tool's data partitioned by topic is not taken for one."""
    def only(path, test):
        with os.scandir(path) as it:
            return all(test(e) and not e.is_symlink() for e in it)

    def day(e):
        return e.name.startswith("date=") and e.is_dir() and only(e.path, lambda f: f.is_file() and
                                                                   f.name.startswith("part-") and
                                                                   f.name.endswith(".parquet"))
    return only(out, lambda e: (e.name, e.is_file()) == ("_SUCCESS", True) or
                (e.name, e.is_dir()) == ("_temporary", True) or
                (e.name.startswith("topic=") and e.is_dir() and only(e.path, day)))


def _refuse_long_topics(topics, longest):
    """InvalidArgumentError naming the topics whose partition directory (``topic=`` and the
    topic, escaped as Spark escapes it) would be over ``longest`` bytes, the file system's
    limit on a name: Spark's readers take the topic from that name, so it cannot be shortened."""
    bad = sorted(t for t in topics if len(topic_dir(t).encode()) > longest)
    if bad:
        raise InvalidArgumentError(f"export: {len(bad)} topic(s) cannot be partition directories: a name may have "
                                   f"at most {longest} bytes, and {topic_dir(bad[0])[:60]!r}... has "
                                   f"{len(topic_dir(bad[0]).encode())} (topics {[t[:40] for t in bad[:3]]}); "
                                   "read such topics with spark.read.format('rocketmq') instead")


def _export_dir(out_dir, stores):
    """``out_dir`` as an absolute path, once it is safe for export to replace: absent, empty,
    or an earlier export's output. Anything else is refused (InvalidArgumentError), as
    nothing but an export's own files may be deleted: a symlink, a file, a directory of
    other files, a store or a directory holding or inside one of ``stores``."""
    out = os.path.abspath(out_dir)
    real = os.path.realpath(out)
    for s in map(os.path.realpath, stores):
        if os.path.commonpath([real, s]) in (real, s):
            raise InvalidArgumentError(f"export: --out {out} overlaps the store {s} it reads")
    if enclosing_store(out):
        raise InvalidArgumentError(f"export: --out {out} is inside the store {enclosing_store(out)}")
    if os.path.islink(out) or (os.path.lexists(out) and not os.path.isdir(out)):
        raise InvalidArgumentError(f"export: --out {out} is not a directory (a symlink or a file)")
    if os.path.isdir(out) and not _is_export(out):
        raise InvalidArgumentError(f"export: --out {out} holds files an export did not write; export replaces "
                                   "its directory, so give a new or empty one (or an earlier export's)")
    return out


@checked()
def export(spark, stores, out_dir: str | os.PathLike[str], mode: str = "fail", compression: str = "snappy",
           row_group_rows: int = 1 << 17, sort_by: Sequence[str] | None = None):
    """Write the stores' messages to Parquet under ``out_dir`` (new, empty or an earlier
    export's, which is replaced; anything else is refused, see ``_export_dir``), partitioned by
    topic and store date (UTC) in the Hive layout ``spark.read.parquet`` reads back (with
    ``topic`` and ``date`` columns), then an empty ``_SUCCESS`` marker as Spark's writers do.
    Each task decodes its commitlog range and writes its own files with pyarrow
    (``partitioned.PartitionedWriter``): no shuffle, no row conversion in the JVM. There are
    two tasks per core, each of a share of the commitlog between 32 MiB and 1 GiB (256 MiB
    with ``sort_by``).

    Options: ``compression`` the Parquet codec of every column (snappy; "none", "lz4",
    "zstd"...); ``row_group_rows`` rows per row group (131072; a file's last row group
    fewer); ``sort_by`` column names to sort each task's rows by before writing, as
    ``sortWithinPartitions`` does (the task's rows are then held in memory at once).
    Dictionary encoding is used for store, tags, born_host and store_host only, min/max
    statistics are written for every column but body, keys, properties and uniq_key.
    ``out_dir`` must be a path every executor sees (any path in local mode). Returns a
    summary (messages, commitlog bytes, seconds, MB/s)."""
    t0 = time.perf_counter()
    if row_group_rows < 1:
        raise InvalidArgumentError(f"row_group_rows must be positive, not {row_group_rows}")
    if not _codec_available(compression):
        raise InvalidArgumentError(f"export: compression must be one of {PARQUET_CODECS} (available here), "
                                   f"not {compression!r}")
    sort_by = list(sort_by or ())
    unknown = [c for c in sort_by if c not in batch.arrow_schema().names]
    if unknown:
        raise InvalidArgumentError(f"export: cannot sort by unknown column(s) {unknown}")
    stores = find_stores(stores)
    out_dir = _export_dir(out_dir, stores)
    longest = name_max(os.fspath(out_dir))
    for store in stores:   # the topics the consume queues name, before anything is replaced
        cq = os.path.join(store, "consumequeue")
        _refuse_long_topics(os.listdir(cq) if os.path.isdir(cq) else (), longest)
    scan = Scan({"paths": json.dumps(stores), "mode": mode, "batchBytes": str(EXPORT_BATCH)})
    parts = _export_parts(stores, _tasks(spark), SORTED_SPLIT_MAX if sort_by else EXPORT_SPLIT[1])
    if os.path.isdir(out_dir):   # _SUCCESS first: killed part way, no marker stands over half the files
        remove_stale(os.path.join(out_dir, "_SUCCESS"))
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    done = spark.sparkContext.parallelize(list(enumerate(parts)), max(1, len(parts))) \
        .map(lambda ip: _export_part(scan, ip[0], ip[1], out_dir, compression, row_group_rows, sort_by,
                                     longest)).collect()
    too_long = set().union(*(t for _, _, t in done))
    if too_long:   # topics no consume queue names: found by the tasks, which wrote none of their rows
        shutil.rmtree(out_dir)
        _refuse_long_topics(too_long, longest)
    shutil.rmtree(os.path.join(out_dir, "_temporary"), ignore_errors=True)
    open(os.path.join(out_dir, "_SUCCESS"), "wb").close()
    return _summary("export", t0, sum(n for n, _, _ in done), sum(b for _, b, _ in done), out=out_dir)


WRITE_MODES = ("error", "errorifexists", "ignore", "append", "overwrite")


@checked()
def write(df, out_dir: str | os.PathLike[str], mode: str = "error", **options):
    """Write DataFrame ``df`` as RocketMQ stores under ``out_dir`` (the "rocketmq" writer:
    one store per task; ``options`` as its StoreConfig options, e.g. ``indexSlots``), with
    Spark's save modes, in any case as Spark takes them: error (default; errorifexists)
    refuses a directory that already holds a store, ignore then writes nothing, append adds
    stores, overwrite replaces them. Returns a summary (messages and commitlog bytes
    written, stores, seconds, MB/s), from the ``_SUCCESS`` summary the writer leaves."""
    from rmqstore.spark.writer import SUCCESS, stores_in
    mode = mode.lower()
    if mode not in WRITE_MODES:
        raise InvalidArgumentError(f"write mode must be one of {WRITE_MODES}, not {mode!r}")
    t0 = time.perf_counter()
    out_dir = os.path.abspath(out_dir)
    before = set(stores_in(out_dir)) if os.path.isdir(out_dir) else set()
    if before and mode in ("error", "errorifexists"):
        raise InvalidArgumentError(f"{out_dir}: already holds {len(before)} RocketMQ store(s) (mode {mode!r})")
    if before and mode == "ignore":
        return _summary("write", t0, 0, 0, stores=0, out=out_dir)
    df.write.format(NAME).mode("overwrite" if mode == "overwrite" else "append") \
        .options(**{k: str(v) for k, v in options.items()}).save(out_dir)
    with open(os.path.join(out_dir, SUCCESS)) as f:
        counts = json.load(f)["stores"].values()
    return _summary("write", t0, sum(n for n, _ in counts), sum(b for _, b in counts), stores=len(counts),
                    out=out_dir)


def query(spark, stores, topic=None, key=None, uniq_key=None, begin=None, end=None):
    """Messages of ``stores`` matching every given criterion: topic, a key (one of KEYS),
    a unique key, store time in ``[begin, end)`` (epoch ms, ISO-8601 or datetime). The
    criteria are applied by the source's readers, so only matches reach the JVM."""
    criteria = dict(topic=topic, key=key, uniqKey=uniq_key, since=_query_ms("begin", begin),
                    until=_query_ms("end", end))
    return read(spark, stores, **{k: v for k, v in criteria.items() if v is not None})


def _query_ms(name, value):
    """query's ``name`` (begin or end) as epoch ms, None when not given; InvalidArgumentError
    naming it (the source's own error names its option, since or until)."""
    try:
        return None if value is None else epoch_ms(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"query: {name}: {e}") from None


def _verify_pieces(pieces):
    for store, parts in pieces:
        stats = batch.DecodeStats()
        for path, base, start, end in parts:
            for _ in batch.iter_columns(path, base, start, end, check_crc=True, mode="skip", stats=stats):
                pass
        yield store, stats.as_dict()


def _structure(store):
    """Structural problems of a store's commitlog files (sizes, gaps)."""
    files = batch.segment_files(store)
    problems = []
    for (p, base, size), (_, nbase, _) in zip(files, files[1:], strict=False):
        if nbase != base + size:
            problems.append(f"{p}: next segment starts at {nbase}, expected {base + size}")
    if files and len({size for _, _, size in files}) > 1:
        problems.append(f"segment sizes differ: {sorted({size for _, _, size in files})}")
    return problems


def verify(spark, stores):
    """Check every record's structure and body CRC in parallel. Returns ({store: report},
    summary); a report has records, bytes, corrupt (regions), corrupt_offsets, skipped_bytes,
    problems (segment layout) and ok."""
    t0 = time.perf_counter()
    stores = find_stores(stores)
    parts = [(r.store, r.pieces) for r in plan(stores, min_partitions=_tasks(spark))]
    sc = spark.sparkContext
    merged = sc.parallelize(parts, max(1, len(parts))).mapPartitions(_verify_pieces) \
        .reduceByKey(lambda a, b: {k: a[k] + b[k] for k in a}).collectAsMap()
    reports = {}
    for s in stores:
        r = dict(merged.get(s, batch.DecodeStats().as_dict()))
        r["corrupt_offsets"] = sorted(r["corrupt_offsets"])
        r["problems"] = _structure(s)
        r["ok"] = not r["corrupt"] and not r["problems"]
        reports[s] = r
    return reports, _summary("verify", t0, sum(r["records"] for r in reports.values()),
                             sum(r["bytes"] for r in reports.values()),
                             bad_stores=sum(not r["ok"] for r in reports.values()))


# ------------------------------------------------------------------------------ rebuild

def _cq_entries(parts, delays):
    """((topic, queue id), rows) per queue for one task's ranges; rows are structured
    (qoff, phy, size, tags) in commitlog order, PREPARED/ROLLBACK left out."""
    out = {}
    for path, base, start, end in parts:
        for cols in batch.iter_columns(path, base, start, end):
            topics = _topics(cols)
            tags = cols["tags_code"].copy()
            for i in np.nonzero(np.array([t == SCHEDULE_TOPIC for t in topics]))[0]:
                tags[i] = deliver_time(_property(cols, i, "DELAY"), int(cols["store_timestamp"][i]), tags[i], delays)
            for i in np.nonzero(_record.gets_cq_entry(cols["sys_flag"]))[0]:
                out.setdefault((topics[i], int(cols["queue_id"][i])), []).append(
                    (int(cols["queue_offset"][i]), int(cols["phy_offset"][i]), int(cols["store_size"][i]),
                     int(tags[i])))
    return list(out.items())


def _topics(cols):
    data, off = cols["topic_data"].tobytes(), cols["topic_offsets"].tolist()
    return [data[a:b].decode("utf-8", "replace") for a, b in zip(off[:-1], off[1:], strict=False)]


def _property(cols, i, name):
    """Property ``name`` of row ``i`` (the last one wins), or None."""
    a, b = int(cols["props_offsets"][i]), int(cols["props_offsets"][i + 1])
    value = None
    for pair in cols["props_data"][a:b].tobytes().decode("utf-8", "replace").split("\x02"):
        k, sep, v = pair.partition("\x01")
        if k == name and sep and v:
            value = v
    return value


def write_consume_queue(directory, rows, entries_per_file):
    """Write one queue's files as incremental dispatch does: entry n at byte 20n, files of
    ``entries_per_file`` entries (zero-filled), blank entries before a first offset that is
    not at a file start; an offset below the end is a re-dispatch (skipped), one beyond it
    is appended at the end (RocketMQ's "logic queue order maybe wrong")."""
    rows = sorted(rows, key=lambda r: r[1])
    first = rows[0][0]
    entries = [_HOLE] * (first % entries_per_file)
    base = first - first % entries_per_file
    for qoff, phy, size, tags in rows:
        if qoff < base + len(entries):
            continue
        entries.append((phy, size, tags))
    arr = np.array(entries, _ENTRY)
    file_bytes = entries_per_file * _ENTRY.itemsize
    os.makedirs(directory, exist_ok=True)
    nfiles = -(-len(arr) // entries_per_file)
    for f in range(nfiles):
        chunk = arr[f * entries_per_file:(f + 1) * entries_per_file].tobytes()
        with open(os.path.join(directory, segment_name(base * _ENTRY.itemsize + f * file_bytes)), "wb") as fh:
            fh.write(chunk + bytes(file_bytes - len(chunk)))
    return len(rows), nfiles


def rebuild_index(store, out_root, config=None):
    """Rebuild a store's index files into ``out_root/index/`` by replaying its commitlog
    through IndexService in order, as incremental dispatch does (sequential by nature).
    Returns (files, entries)."""
    shape = config or StoreConfig()
    with MessageStore(store, config, read_only=True, rebuild=True) as src:   # its own CQs and index unread
        cl = src.commitlog
        cfg = src.config.with_(index_slots=shape.index_slots, index_entries=shape.index_entries)
        index = IndexService(out_root, cfg, Checkpoint(os.path.join(out_root, "checkpoint")))
        try:
            index.load(True, cl.max_offset)
            dispatcher = Dispatcher(cl, cl.min_offset)
            dispatcher.add(index.dispatch)
            dispatcher.catch_up()
            index.flush()
            return len(index.files), sum(f.count - 1 for f in index.files)
        finally:
            index.close()


@checked()
def rebuild(spark, store, out_dir: str | os.PathLike[str] | None = None, config: StoreConfig | None = None):
    """Rebuild a store's consume queues and index files from its commitlog into
    ``out_dir/consumequeue/`` and ``out_dir/index/`` (default ``out_dir``: the store; both
    must be empty or absent), byte-identical to what incremental dispatch writes. Consume
    queues are built in parallel (one task per commitlog range decodes, one task per queue
    writes) while the driver replays the commitlog into the index (``config`` geometry;
    skipped with ``message_index_enable`` off). Rebuilding into the store itself holds its
    writer lock, so it is refused while a broker or writer has the store open. Returns ({(topic, queue id): (entries,
    files)}, summary)."""
    t0 = time.perf_counter()
    cfg = config or StoreConfig()
    store = find_stores([store])[0]
    out_dir = os.path.abspath(out_dir or store)
    around = enclosing_store(out_dir)
    if around is not None and not around == os.path.realpath(out_dir) == os.path.realpath(store):
        raise InvalidArgumentError(f"rebuild: --out {out_dir} is inside the store {around}, not the one rebuilt")
    cq_dir = os.path.join(out_dir, "consumequeue")
    for d in (cq_dir, os.path.join(out_dir, "index")):
        if os.path.isdir(d) and os.listdir(d):
            raise InvalidArgumentError(f"{d}: not empty; rebuild writes into a new directory")
    lock = lock_writer(store, cfg.file_mode) if around else None   # no broker or writer on it meanwhile
    try:
        if lock is None:
            return _rebuild(spark, store, out_dir, cfg, t0)
        # killed part way, the queues written so far are not taken for all (see remove_logics)
        crashed = mark_logics_lost(store, Checkpoint(os.path.join(store, "checkpoint"), cfg.file_mode).load())
        out = _rebuild(spark, store, out_dir, cfg, t0)
        if not crashed:
            os.unlink(os.path.join(store, "abort"))
        return out
    finally:
        if lock is not None:
            os.close(lock)


def _rebuild(spark, store, out_dir, cfg, t0):
    """rebuild's work, once its output directory is checked (and, the store's own, locked)."""
    cq_dir = os.path.join(out_dir, "consumequeue")
    delays, per_file = cfg.delay_levels_ms(), cfg.consume_queue_entries
    parts = [r.pieces for r in plan([store], min_partitions=_tasks(spark))]
    with ThreadPoolExecutor(1, "rmq-rebuild-index") as pool:
        index = pool.submit(rebuild_index, store, out_dir, cfg) if cfg.message_index_enable else None
        result = spark.sparkContext.parallelize(parts, max(1, len(parts))).flatMap(lambda p: _cq_entries(p, delays)) \
            .reduceByKey(lambda a, b: a + b) \
            .map(lambda kv: (kv[0], write_consume_queue(os.path.join(cq_dir, kv[0][0], str(kv[0][1])), kv[1],
                                                        per_file))) \
            .collectAsMap()
        files, entries = index.result() if index else (0, 0)
    return result, _summary("rebuild", t0, sum(e for e, _ in result.values()), 0, queues=len(result),
                            index_files=files, index_entries=entries, out=out_dir)


def _summary(job, t0, messages, nbytes, **extra):
    secs = time.perf_counter() - t0
    return dict(job=job, messages=int(messages), bytes=int(nbytes), seconds=round(secs, 3),
                mb_per_second=round(nbytes / secs / 1e6, 1) if secs > 0 else 0.0, **extra)
