"""Pipeline jobs over many stores: export to Parquet, rebuild consume queues, query, verify.

Each job is a function taking a SparkSession and returning a result plus a summary dict;
``main(argv)`` runs them as ``rmqstore spark export|rebuild|query|verify``. Spark's console
progress bar shows progress; each job ends with a one-line summary.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from rmqstore import batch
from rmqstore.config import StoreConfig
from rmqstore.errors import InvalidArgumentError
from rmqstore.segments import segment_name
from rmqstore.spark.source import NAME, find_stores, plan

_ENTRY = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
_HOLE = (0, 0x7FFFFFFF, 0)   # RocketMQ's fillPreBlank entry
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


def read(spark, stores, **options):
    """The stores as a DataFrame (the "rocketmq" source; ``options`` as strings)."""
    return spark.read.format(NAME).options(**{k: str(v) for k, v in options.items()}).load(list(stores))


def export(spark, stores, out_dir, mode="fail"):
    """Write the stores' messages to Parquet under ``out_dir``, partitioned by topic and
    store date (UTC). Returns a summary (messages, commitlog bytes, seconds, MB/s)."""
    from pyspark.sql import functions as F
    t0 = time.perf_counter()
    df = read(spark, stores, mode=mode).withColumn("date", F.to_date("store_timestamp"))
    df.write.mode("overwrite").partitionBy("topic", "date").parquet(str(out_dir))
    row = spark.read.parquet(str(out_dir)).agg(F.count("*").alias("n"), F.sum("store_size").alias("b")).first()
    return _summary("export", t0, row["n"], row["b"] or 0, out=str(out_dir))


def query(spark, stores, topic=None, key=None, uniq_key=None, begin=None, end=None):
    """Messages of ``stores`` matching every given criterion: topic, a key (one of KEYS),
    a unique key, store time in ``[begin, end)`` (epoch ms, ISO-8601 or datetime)."""
    from pyspark.sql import functions as F
    options = {"topic": topic} if topic else {}
    if begin is not None:
        options["since"] = begin
    if end is not None:
        options["until"] = end
    df = read(spark, stores, **options)
    if key is not None:
        df = df.filter(F.array_contains("keys", key))
    if uniq_key is not None:
        df = df.filter(F.col("uniq_key") == uniq_key)
    return df


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
    for (p, base, size), (_, nbase, _) in zip(files, files[1:]):
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
    parts = [(r.store, r.pieces) for r in plan(stores, 128 << 20)]
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
            tx = cols["sys_flag"] & 0xC
            tags = cols["tags_code"].copy()
            for i in np.nonzero(np.array([t == SCHEDULE_TOPIC for t in topics]))[0]:
                level = _property(cols, i, "DELAY")
                if level is not None and level.isdigit() and int(level) > 0:
                    tags[i] = cols["store_timestamp"][i] + delays[min(int(level), len(delays)) - 1]
            for i in np.nonzero((tx != 0x4) & (tx != 0xC))[0]:
                out.setdefault((topics[i], int(cols["queue_id"][i])), []).append(
                    (int(cols["queue_offset"][i]), int(cols["phy_offset"][i]), int(cols["store_size"][i]), int(tags[i])))
    return list(out.items())


def _topics(cols):
    data, off = cols["topic_data"].tobytes(), cols["topic_offsets"].tolist()
    return [data[a:b].decode("utf-8", "replace") for a, b in zip(off[:-1], off[1:])]


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


def rebuild(spark, store, out_dir=None, config=None):
    """Rebuild a store's consume queues from its commitlog in parallel (one task per range of
    segments decodes; one task per queue writes), into ``out_dir`` (default: the store's
    ``consumequeue/``, which must not exist yet). Index files are not rebuilt yet.
    Returns ({(topic, queue id): (entries, files)}, summary)."""
    t0 = time.perf_counter()
    cfg = config or StoreConfig()
    store = find_stores([store])[0]
    out_dir = os.path.abspath(out_dir or os.path.join(store, "consumequeue"))
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise InvalidArgumentError(f"{out_dir}: not empty; rebuild writes into a new directory")
    delays, per_file = cfg.delay_levels_ms(), cfg.consume_queue_entries
    parts = [r.pieces for r in plan([store], 128 << 20)]
    sc = spark.sparkContext
    result = sc.parallelize(parts, max(1, len(parts))).flatMap(lambda p: _cq_entries(p, delays)) \
        .reduceByKey(lambda a, b: a + b) \
        .map(lambda kv: (kv[0], write_consume_queue(os.path.join(out_dir, kv[0][0], str(kv[0][1])), kv[1], per_file))) \
        .collectAsMap()
    return result, _summary("rebuild", t0, sum(e for e, _ in result.values()), 0, queues=len(result), out=out_dir)


def _summary(job, t0, messages, nbytes, **extra):
    secs = time.perf_counter() - t0
    return dict(job=job, messages=int(messages), bytes=int(nbytes), seconds=round(secs, 3),
                mb_per_s=round(nbytes / secs / 1e6, 1) if secs > 0 else 0.0, **extra)


def main(argv=None):
    """``rmqstore spark export|rebuild|query|verify ...``; returns the exit status."""
    ap = argparse.ArgumentParser(prog="rmqstore spark", description=__doc__.splitlines()[0])
    ap.add_argument("--master", default="local[*]")
    sub = ap.add_subparsers(dest="job", required=True)
    p = sub.add_parser("export", help="stores to Parquet, partitioned by topic and date")
    p.add_argument("stores", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=batch.MODES, default="fail")
    p = sub.add_parser("rebuild", help="rebuild a store's consume queues from its commitlog")
    p.add_argument("store")
    p.add_argument("--out")
    p.add_argument("--entries-per-file", type=int, default=StoreConfig().consume_queue_entries)
    p = sub.add_parser("query", help="messages by key / unique key / time range")
    p.add_argument("stores", nargs="+")
    for opt in ("--topic", "--key", "--uniq-key", "--begin", "--end"):
        p.add_argument(opt)
    p.add_argument("--limit", type=int, default=20)
    p = sub.add_parser("verify", help="check CRCs and structure, one report per store")
    p.add_argument("stores", nargs="+")
    args = ap.parse_args(argv)
    from rmqstore.spark import session
    spark = session(args.master)
    try:
        if args.job == "export":
            summary = export(spark, args.stores, args.out, args.mode)
            status = 0
        elif args.job == "rebuild":
            _, summary = rebuild(spark, args.store, args.out,
                                 StoreConfig(consume_queue_entries=args.entries_per_file))
            status = 0
        elif args.job == "query":
            df = query(spark, args.stores, args.topic, args.key, args.uniq_key, args.begin, args.end)
            t0 = time.perf_counter()
            rows = df.select("store", "topic", "queue_id", "queue_offset", "phy_offset", "msg_id", "keys",
                             "uniq_key", "store_timestamp").orderBy("store", "phy_offset").limit(args.limit).collect()
            for r in rows:
                print(json.dumps(r.asDict(), default=str, ensure_ascii=False))
            summary = _summary("query", t0, len(rows), 0)
            status = 0
        else:
            reports, summary = verify(spark, args.stores)
            for s, r in reports.items():
                print(json.dumps({"store": s, **r}))
            status = 0 if summary["bad_stores"] == 0 else 1
        print(json.dumps(summary), file=sys.stderr)
        return status
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
