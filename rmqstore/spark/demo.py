"""The pipeline end to end on the embedded default (``local[*]``): write a few stores with
MessageStore, export them to Parquet with Spark, run a cross-store key query, print figures.

    python -m rmqstore.spark.demo [--dir D] [--stores 3] [--messages 100000]
"""
import argparse
import os
import tempfile
import time

from rmqstore import Message, MessageStore, StoreConfig


def write_stores(root, stores, messages, body_size=256):
    """``stores`` stores of ``messages`` messages each (4 topics; every 1000th has key "hot")."""
    paths = []
    body = os.urandom(body_size)
    for s in range(stores):
        path = os.path.join(root, f"broker-{s}")
        with MessageStore(path, StoreConfig(commitlog_file_size=64 << 20)) as st:
            for start in range(0, messages, 1000):
                st.put_batch([Message(f"Topic{i % 4}", body, tags=f"tag{i % 8}",
                                      keys=[f"order-{s}-{i}"] + (["hot"] if i % 1000 == 0 else []))
                              for i in range(start, min(start + 1000, messages))])
            st.wait_dispatched(60)
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rmqstore.spark.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--stores", type=int, default=3)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="rmqstore-demo-")
    from rmqstore.spark import jobs, session
    t0 = time.perf_counter()
    paths = write_stores(root, args.stores, args.messages)
    t_write = time.perf_counter() - t0
    print(f"wrote {args.stores} stores x {args.messages} messages in {t_write:.1f} s under {root}")
    spark = session(args.master, spark_sql_shuffle_partitions="4")
    try:
        s = jobs.export(spark, paths, os.path.join(root, "parquet"))
        print(f"export: {s['messages']} messages, {s['bytes'] / 1e6:.1f} MB of commitlog in {s['seconds']:.1f} s "
              f"({s['mb_per_s']} MB/s) -> {s['out']}")
        t1 = time.perf_counter()
        hits = jobs.query(spark, [os.path.join(root, "broker-*")], key="hot").select("store", "topic", "phy_offset") \
            .collect()
        print(f"query key='hot' across {len(paths)} stores: {len(hits)} messages in "
              f"{time.perf_counter() - t1:.1f} s")
    finally:
        spark.stop()
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
