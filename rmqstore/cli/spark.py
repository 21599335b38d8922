"""``rmqstore spark``: the jobs of rmqstore.spark.jobs over many stores (export, rebuild,
query, verify), on ``local[*]`` or the cluster ``--master`` names."""
import re
import sys
import time

from rmqstore import batch
from rmqstore.cli.common import (
    EXIT_FOUND,
    CommandError,
    human,
    positive_int,
    print_fields,
    print_json,
    print_line,
    print_table,
)
from rmqstore.config import StoreConfig
from rmqstore.display import local_time
from rmqstore.report import camel_keys

# query's columns, under the names ``dump`` gives them (RocketMQ's MessageExt names)
_QUERY_COLUMNS = {"store": "store", "topic": "topic", "queue_id": "queueId", "queue_offset": "queueOffset",
                  "phy_offset": "commitLogOffset", "msg_id": "msgId", "keys": "keys", "uniq_key": "uniqKey",
                  "store_timestamp": "storeTimestamp"}


def _jobs():
    try:
        from rmqstore.spark import jobs, session
    except ImportError as e:
        raise CommandError(f"the spark jobs need the [spark] extra (pip install 'rmqstore[spark]'): {e}") from None
    return jobs, session


def _print_summary(args, summary):
    if args.json:
        print_json(camel_keys(summary))
    else:
        print_fields(human(camel_keys(summary).items()), title=summary["job"])


def _export(args, jobs, spark):
    _print_summary(args, jobs.export(spark, args.stores, args.out, args.mode, compression=args.compression,
                                     row_group_rows=args.row_group_rows,
                                     sort_by=args.sort_by.split(",") if args.sort_by else None))


def _rebuild(args, jobs, spark):
    config = StoreConfig(consume_queue_entries=args.entries_per_file, index_slots=args.index_slots,
                         index_entries=args.index_entries)
    _print_summary(args, jobs.rebuild(spark, args.store, args.out, config)[1])


def _query(args, jobs, spark):
    t0 = time.perf_counter()
    df = jobs.query(spark, args.stores, args.topic, args.key, args.uniq_key, args.begin, args.end)
    rows = [{_QUERY_COLUMNS[k]: v for k, v in r.asDict().items()}
            for r in df.select(*_QUERY_COLUMNS).orderBy("store", "phy_offset").limit(args.limit).collect()]
    for r in rows:
        r["storeTimestamp"] = int(r["storeTimestamp"].timestamp() * 1000)   # epoch ms, as dump gives it
        r["keys"] = " ".join(r["keys"] or ()) or None
    if args.json:
        for r in rows:
            print_line(r)
    else:
        print_table(["store", "commitlog offset", "topic", "queue", "queue offset", "store time", "msgId", "keys"],
                    [(r["store"], r["commitLogOffset"], r["topic"], r["queueId"], r["queueOffset"],
                      local_time(r["storeTimestamp"]), r["msgId"], r["keys"]) for r in rows])
    print(f"query: {len(rows)} message(s) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def _verify(args, jobs, spark):
    reports, summary = jobs.verify(spark, args.stores)
    if args.json:
        print_json(camel_keys({"stores": [{"store": s, **r} for s, r in reports.items()], "summary": summary}))
    else:
        print_table(["store", "ok", "records", "bytes", "corrupt regions", "skipped bytes", "problems"],
                    [(s, r["ok"], r["records"], r["bytes"], r["corrupt"], r["skipped_bytes"],
                      "; ".join(r["problems"] + [f"corrupt record at {o}" for o in r["corrupt_offsets"]]) or None)
                     for s, r in reports.items()])
        print(f"verify: {summary['bad_stores']} of {len(reports)} store(s) with problems, "
              f"{summary['seconds']:.1f} s")
    return EXIT_FOUND if summary["bad_stores"] else None


# the last "module.SomeError: message" line of a Spark error's text (a task's or a reader's traceback)
_CAUSE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.M)


def _spark_failure(e):
    """A Spark error as one line: the exception a task or a data source raised (an rmqstore
    error, mostly), not the JVM's and Python's tracebacks around it."""
    causes = _CAUSE.findall(str(e))
    return "{}: {}".format(*causes[-1]) if causes else str(e).strip().split("\n")[0]


def cmd_spark(args):
    jobs, session = _jobs()
    from pyspark.errors import PySparkException  # there once _jobs found the [spark] extra
    spark = session(args.master, verbose=args.verbose)
    # a failed task's ERROR/WARN logs carry the JVM and Python tracebacks; the cause is reported below
    spark.sparkContext.setLogLevel("FATAL")
    try:
        return args.job(args, jobs, spark)
    except PySparkException as e:
        raise CommandError(_spark_failure(e)) from None
    finally:
        spark.stop()


def register(sub, json_only, store_opts):
    p = sub.add_parser("spark", help="pipeline jobs on Spark: export, rebuild, query, verify",
                       description="Jobs over many stores at once on Spark (the [spark] extra): each task "
                       "decodes a commitlog range. Runs on local[*] unless --master (or spark-submit, or "
                       "$SPARK_MASTER) names a cluster; the stores must then be at the same path on every "
                       "host. 'rmqstore spark JOB --help' describes each job.")
    p.add_argument("--master", metavar="URL",
                   help="Spark master URL, e.g. spark://host:7077 (default: spark-submit's, $SPARK_MASTER "
                   "or local[*])")
    p.add_argument("--verbose", action="store_true",
                   help="Spark's own warnings and progress bars on stderr (default: errors only)")
    jobs = p.add_subparsers(dest="job_name", metavar="JOB", parser_class=type(p))
    jobs.required = True

    def job(name, func, help_, description):
        j = jobs.add_parser(name, parents=[json_only], help=help_, description=description)
        j.set_defaults(func=cmd_spark, job=func)
        return j

    j = job("export", _export, "stores to Parquet, partitioned by topic and date",
            "Write every message of the stores to Parquet under --out (new, empty, or an earlier "
            "export's, which is replaced; any other directory is refused), in Spark's "
            "topic=/date= layout (store date, UTC), then a _SUCCESS marker. Prints messages, bytes, "
            "seconds and MB/s.")
    j.add_argument("stores", nargs="+", metavar="STORE", help="store directories or glob patterns")
    j.add_argument("--out", required=True, metavar="DIR", help="output directory (every executor must see it)")
    j.add_argument("--mode", choices=batch.MODES, default="fail",
                   help="on a corrupt record: fail the job (default) or skip it")
    j.add_argument("--row-group-rows", type=positive_int, default=1 << 17, metavar="N",
                   help="rows per Parquet row group (131072)")
    j.add_argument("--sort-by", metavar="COLUMNS", help="comma-separated columns to sort each task's rows by")
    j.add_argument("--compression", default="snappy", metavar="CODEC",
                   help="Parquet codec: none, snappy (default), gzip, brotli, lz4 or zstd")
    j = job("rebuild", _rebuild, "a store's consume queues and index files from its commitlog",
            "Write a store's consumequeue/ and index/ again from its commitlog: consume queues in "
            "parallel, the index on the driver. Both directories must be empty or absent under --out "
            "(default: the store itself).")
    j.add_argument("store", metavar="STORE", help="store directory")
    j.add_argument("--out", metavar="DIR", help="where to write consumequeue/ and index/ (default: STORE)")
    j.add_argument("--entries-per-file", type=positive_int, default=StoreConfig().consume_queue_entries,
                   metavar="N", help="entries per consume-queue file (RocketMQ's 300000)")
    j.add_argument("--index-slots", type=positive_int, default=StoreConfig().index_slots, metavar="N",
                   help="hash slots per index file (RocketMQ's 5000000)")
    j.add_argument("--index-entries", type=positive_int, default=StoreConfig().index_entries, metavar="N",
                   help="entries per index file (RocketMQ's 20000000)")
    j = job("query", _query, "messages by topic, key, unique key or store time across stores",
            "Messages of the stores matching every criterion given, in store and commitlog order; the "
            "readers apply the criteria, so only matches reach Spark.")
    j.add_argument("stores", nargs="+", metavar="STORE", help="store directories or glob patterns")
    j.add_argument("--topic", help="only this topic")
    j.add_argument("--key", help="a key (one of the message's KEYS)")
    j.add_argument("--uniq-key", metavar="KEY", help="the unique key (UNIQ_KEY, the client's msgId)")
    j.add_argument("--begin", metavar="TIME", help="stored at or after (epoch ms or ISO-8601)")
    j.add_argument("--end", metavar="TIME", help="stored before (epoch ms or ISO-8601)")
    j.add_argument("--limit", type=positive_int, default=20, metavar="N", help="at most N messages (20)")
    j = job("verify", _verify, "check every record's structure and body CRC, one report per store",
            "Check every commitlog record's structure and body CRC, and the segment layout, in parallel; "
            "one report per store. Exit status 3 when a store has problems.")
    j.add_argument("stores", nargs="+", metavar="STORE", help="store directories or glob patterns")
