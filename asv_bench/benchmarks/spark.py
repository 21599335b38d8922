"""Spark decode throughput: the "rocketmq" data source (into a count, into Parquet) and the
export job against a plain Spark baseline, ``binaryFile`` + a Python UDF decoding records with
``struct``, in one session. The store has 16 MiB segments: the baseline holds a whole segment
file and its decoded rows in the JVM heap at once, and ran out of a 2 GB heap on 64 MiB ones.

Run directly for the figures (MB/s of commitlog, per core, and the ratio to the baseline):
    python asv_bench/benchmarks/spark.py [--messages 100000] [--cores 2]
"""
import os
import shutil
import struct
import sys
import tempfile
import time

MESSAGES = 100_000
BODY = 1024


def _spark(cores):
    from rmqstore.spark import session
    return session(f"local[{cores}]", spark_sql_shuffle_partitions=str(cores), spark_driver_memory="2g")


def _write(root, messages):
    from rmqstore import Message, MessageStore, StoreConfig
    path = os.path.join(root, "store")
    body = bytes(range(256)) * (BODY // 256)
    with MessageStore(path, StoreConfig(commitlog_file_size=16 << 20)) as st:
        for start in range(0, messages, 1000):
            st.put_batch([Message(f"Topic{i % 4}", body, tags="t", keys=[f"k{i}"])
                          for i in range(start, min(start + 1000, messages))])
    return path


def _decode_udf(content):
    """The baseline: every record of one segment file, decoded with struct."""
    out, pos, n = [], 0, len(content)
    while pos + 8 <= n:
        total, magic = struct.unpack_from(">ii", content, pos)
        if total == 0 or magic == -875286124:
            break
        (crc, qid, flag, qoff, phy, sysflag, born) = struct.unpack_from(">iiiqqiq", content, pos + 8)
        p = pos + 48 + (20 if sysflag & 0x10 else 8)
        store_ts = struct.unpack_from(">q", content, p)[0]
        p += 8 + (20 if sysflag & 0x20 else 8) + 12
        blen = struct.unpack_from(">i", content, p)[0]
        body = bytes(content[p + 4:p + 4 + blen])
        p += 4 + blen
        tlen = content[p]
        topic = bytes(content[p + 1:p + 1 + tlen]).decode()
        p += 1 + tlen
        plen = struct.unpack_from(">h", content, p)[0]
        props = bytes(content[p + 2:p + 2 + plen]).decode()
        out.append((topic, qid, qoff, phy, body, props, store_ts))
        pos += total
    return out


def _baseline(spark, store):
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType
    row = StructType([StructField("topic", StringType()), StructField("queue_id", IntegerType()),
                      StructField("queue_offset", LongType()), StructField("phy_offset", LongType()),
                      StructField("body", BinaryType()), StructField("props", StringType()),
                      StructField("store_ts", LongType())])
    udf = F.udf(_decode_udf, ArrayType(row))
    return spark.read.format("binaryFile").load(os.path.join(store, "commitlog")) \
        .select(F.explode(udf("content")).alias("m")).select("m.*")


def _commitlog_bytes(store):
    from rmqstore import batch
    return sum(int(c["store_size"].sum()) for p, b, _ in batch.segment_files(store) for c in batch.iter_columns(p, b))


class SparkDecode:
    """asv: seconds to decode one store through Spark (source vs baseline)."""

    timeout = 600

    def setup(self):
        self.tmp = tempfile.mkdtemp(prefix="rmq-bench-spark-")
        self.store = _write(self.tmp, MESSAGES)
        self.spark = _spark(2)

    def teardown(self):
        self.spark.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_source_count(self):
        self.spark.read.format("rocketmq").load(self.store).count()

    def time_source_parquet(self):
        self.spark.read.format("rocketmq").load(self.store).write.mode("overwrite").parquet(
            os.path.join(self.tmp, "pq"))

    def time_export(self):
        from rmqstore.spark import jobs
        jobs.export(self.spark, [self.store], os.path.join(self.tmp, "export"))

    def time_baseline_count(self):
        _baseline(self.spark, self.store).count()


def main(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=MESSAGES)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args(argv)
    from rmqstore import batch
    from rmqstore.spark import jobs
    tmp = tempfile.mkdtemp(prefix="rmq-bench-spark-")
    try:
        store = _write(tmp, args.messages)
        nbytes = _commitlog_bytes(store)
        spark = _spark(args.cores)
        try:
            source = lambda: spark.read.format("rocketmq").load(store)  # noqa: E731
            runs = {
                "source -> count": lambda: source().count(),
                "source -> sum(length(body))": lambda: source().selectExpr("sum(length(body))").first(),
                "source -> parquet (Spark)": lambda: source().write.mode("overwrite").parquet(os.path.join(tmp, "pq")),
                "export job -> parquet": lambda: jobs.export(spark, [store], os.path.join(tmp, "export")),
                "binaryFile+UDF -> count": lambda: _baseline(spark, store).count(),
                "binaryFile+UDF -> parquet": lambda: _baseline(spark, store).write.mode("overwrite")
                .parquet(os.path.join(tmp, "pq2")),
            }
            runs["source -> count"]()   # warm up workers and the page cache
            print(f"{args.messages} messages, {nbytes / 1e6:.1f} MB of commitlog, local[{args.cores}]")
            secs = {}
            for name, fn in runs.items():
                secs[name] = t = min(_timed(fn) for _ in range(1 if name.startswith("binaryFile") else 2))
                mbs = nbytes / t / 1e6
                print(f"{name:28s} {t:7.2f} s {mbs:8.1f} MB/s {mbs / args.cores:8.1f} MB/s/core", flush=True)
            t = _timed(lambda: [batch.to_arrow(c, store) for p, b, _ in batch.segment_files(store)
                                for c in batch.iter_columns(p, b, batch_bytes=4 << 20)])
            print(f"{'in-process decode+Arrow':28s} {t:7.2f} s {nbytes / t / 1e6:8.1f} MB/s (1 core, no Spark)")
            for name, base in (("count", "binaryFile+UDF -> count"), ("parquet", "binaryFile+UDF -> parquet")):
                for run in [r for r in runs if name in r and not r.startswith("binaryFile")]:
                    print(f"{run:28s} {secs[base] / secs[run]:6.1f}x the baseline")
        finally:
            spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main(sys.argv[1:])
