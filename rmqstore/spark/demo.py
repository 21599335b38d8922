"""The pipeline end to end on the embedded default (``local[*]``): write a few stores with
MessageStore, export them to Parquet with Spark, read a 5-column projection, run a
cross-store key query, write one store back through the rocketmq writer, print figures.

    python -m rmqstore.spark.demo [--dir D] [--stores 3] [--messages 100000]
"""
import argparse
import os
import shutil
import tempfile
import time

from rmqstore import Message, MessageStore, StoreConfig


def write_stores(root, stores, messages, body_size=256):
    """``stores`` stores of ``messages`` messages each (4 topics; every 1000th has key "hot").
    Returns (store paths, commitlog bytes written)."""
    paths, nbytes = [], 0
    body = os.urandom(body_size)
    for s in range(stores):
        path = os.path.join(root, f"broker-{s}")
        with MessageStore(path, StoreConfig(commitlog_file_size=64 << 20)) as st:
            for start in range(0, messages, 1000):
                st.put_batch([Message(f"Topic{i % 4}", body, tags=f"tag{i % 8}",
                                      keys=[f"order-{s}-{i}"] + (["hot"] if i % 1000 == 0 else []))
                              for i in range(start, min(start + 1000, messages))])
            st.wait_dispatched(60)
            nbytes += st.max_phy_offset - st.min_phy_offset
        paths.append(path)
    return paths, nbytes


def _rate(what, count, nbytes, secs):
    """One figures line: ``what: count, N MB of commitlog in S s (R MB/s)``."""
    return f"{what}: {count}, {nbytes / 1e6:.1f} MB of commitlog in {secs:.1f} s ({nbytes / 1e6 / secs:.0f} MB/s)"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rmqstore.spark.demo",
                                 description=" ".join(__doc__.split("\n\n")[0].replace("``", "").split()))
    ap.add_argument("--dir", help="work directory, new or empty, kept afterwards (default: a temporary one, "
                    "removed)")
    ap.add_argument("--stores", type=int, default=3, metavar="N", help="store directories to write (3)")
    ap.add_argument("--messages", type=int, default=100_000, metavar="N",
                    help="messages per store, 256-byte bodies over 4 topics (100000)")
    ap.add_argument("--verbose", action="store_true", help="Spark's warnings and progress bars on stderr")
    ap.add_argument("--master", help="Spark master URL (default: spark-submit's, $SPARK_MASTER or local[*])")
    args = ap.parse_args(argv)
    if args.dir and os.path.exists(args.dir) and (not os.path.isdir(args.dir) or os.listdir(args.dir)):
        ap.error(f"--dir {args.dir}: must be a new or empty directory (the demo writes stores named broker-N, "
                 "parquet/ and rewritten/ in it)")
    root = args.dir or tempfile.mkdtemp(prefix="rmqstore-demo-")
    from rmqstore.spark import jobs, session
    t0 = time.perf_counter()
    paths, nbytes = write_stores(root, args.stores, args.messages)
    print(_rate(f"write {args.stores} stores under {root}", f"{args.stores * args.messages} messages", nbytes,
                time.perf_counter() - t0))
    t1 = time.perf_counter()
    spark = session(args.master, verbose=args.verbose, spark_sql_shuffle_partitions="4")
    print(f"spark session ({spark.sparkContext.master}): started in {time.perf_counter() - t1:.1f} s")
    try:
        s = jobs.export(spark, paths, os.path.join(root, "parquet"))
        print(_rate("export to Parquet", f"{s['messages']} messages", s["bytes"], s["seconds"]) + f" -> {s['out']}")
        for run in ("first: starts the source's Python workers", "again"):
            t1 = time.perf_counter()
            hits = jobs.query(spark, [os.path.join(root, "broker-*")], key="hot") \
                .select("store", "topic", "phy_offset").collect()
            print(_rate(f"query key='hot' across {len(paths)} stores ({run})", f"{len(hits)} hits scanning", nbytes,
                        time.perf_counter() - t1))
        t1 = time.perf_counter()
        n = jobs.read(spark, paths, columns="topic,queue_id,queue_offset,phy_offset,store_timestamp").count()
        print(_rate("read 5 columns (projection)", f"{n} rows", nbytes, time.perf_counter() - t1))
        t1 = time.perf_counter()
        w = jobs.write(jobs.read(spark, paths[:1]), os.path.join(root, "rewritten"), mode="overwrite",
                       commitlogFileSize=64 << 20)
        print(_rate(f"write {paths[0]} back with the rocketmq writer ({w['stores']} stores)",
                    f"{w['messages']} messages", w["bytes"], time.perf_counter() - t1))
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
