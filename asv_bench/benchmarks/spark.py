"""Spark throughput, in one session: the "rocketmq" data source (all 20 columns, and a
5-column projection) beside a canned-Arrow ceiling (a Python data source yielding the same
Arrow batches prebuilt: what the Python Data Source API carries when decoding costs nothing),
the export job, the rocketmq writer beside a null Arrow writer (the ceiling of Spark's Python
writer API) twice: fed by the source, and fed by the exported Parquet (replay or migration:
the input costs less than the source's decoding and second shipping, so the writer's own rate
shows), reading the exported Parquet back, and a plain Spark
baseline, ``binaryFile`` + a Python UDF decoding records with ``struct``. The store has
16 MiB segments: the baseline holds a whole segment file and its decoded rows in the JVM heap
at once, and ran out of a 2 GB heap on 64 MiB ones (the session has 3 GB; a baseline that still
runs out is reported as failed, and the rest of the table printed).

Run directly for the figures (MB/s of commitlog, per core, and ratios):
    python asv_bench/benchmarks/spark.py [--messages 100000] [--cores 2] [--repeat 3]
Beside the wall-clock rates it prints the CPU each run cost (ms per MB of commitlog, median
of the rounds): the JVM's and its Python workers' (the Linux /proc accounting of the driver
JVM and every process under it, reaped workers included). On a machine shared with other
work the wall clock of a run swings more than the source's decoding costs; its CPU does not,
and the CPU ratios are what the source or writer adds to the canned ceiling or null writer
(kernel writeback threads are no process of Spark's and not counted).
Each writer run writes new stores (the last run's are removed between runs, untimed). The
writers end in durable stores (each store's close syncs its files), so on a slow disk they
show the disk's rate: ``TMPDIR=/dev/shm`` puts every file in memory, and then the writers
show what they cost in CPU.
"""
import json
import os
import shutil
import struct
import sys
import tempfile
import time

MESSAGES = 100_000
BODY = 1024
NARROW = ("topic", "queue_id", "queue_offset", "phy_offset", "store_timestamp")   # no body, map or list
CANNED = "rocketmq_canned"
NULL_SINK = "rocketmq_null_sink"


def _by_value():
    """Ship this module's functions and classes to Python workers by value: under asv it is
    ``benchmarks.spark``, a package the workers cannot import."""
    from pyspark import cloudpickle
    if __name__ != "__main__":
        cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _spark(cores):
    from rmqstore.spark import session
    _by_value()
    spark = session(f"local[{cores}]", spark_sql_shuffle_partitions=str(cores), spark_driver_memory="3g")
    spark.dataSource.register(_canned_source())
    spark.dataSource.register(_null_sink())
    return spark


def _null_sink():
    """The writer's ceiling: a Python Arrow writer that takes the batches and drops them."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class NullWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class NullSink(DataSource):
        @classmethod
        def name(cls):
            return NULL_SINK

        def writer(self, schema, overwrite):
            return NullWriter()
    return NullSink


def _canned_source():
    """The ceiling: a data source whose partitions are Arrow IPC files of prebuilt batches,
    memory-mapped and yielded as they are (option ``columns``: a zero-copy selection)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CannedReader(DataSourceReader):
        def __init__(self, files, columns):
            self.files, self.columns = files, columns

        def partitions(self):
            return [InputPartition(f) for f in self.files]

        def read(self, partition):
            import pyarrow as pa
            with pa.memory_map(partition.value) as src:
                reader = pa.ipc.open_file(src)
                for i in range(reader.num_record_batches):
                    rb = reader.get_batch(i)
                    yield rb.select(self.columns) if self.columns else rb

    class Canned(DataSource):
        @classmethod
        def name(cls):
            return CANNED

        def schema(self):
            from rmqstore.spark.source import _option_columns, _spark_schema
            return _spark_schema(_option_columns(self.options))

        def reader(self, schema):
            return CannedReader(json.loads(self.options["files"]), schema.fieldNames())
    return Canned


def _prebuild(store, root, partitions):
    """The source's own partitions and batches, decoded once into Arrow IPC files."""
    import pyarrow as pa

    from rmqstore.spark.source import Scan, plan
    scan = Scan({"path": store})
    files = []
    for i, part in enumerate(plan(scan.stores, scan.split_bytes, partitions)):
        files.append(os.path.join(root, f"canned-{i}.arrow"))
        with pa.OSFile(files[-1], "wb") as f, pa.ipc.new_file(f, _arrow_schema()) as w:
            for path, base, start, end in part.pieces:
                for rb in scan.read(part.store, path, base, start, end):
                    w.write_batch(rb)
    return files


def _arrow_schema():
    from rmqstore import batch
    return batch.arrow_schema()


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
    udf = F.udf(_decode_udf, ArrayType(row))   # pickled by value: see _by_value
    return spark.read.format("binaryFile").load(os.path.join(store, "commitlog")) \
        .select(F.explode(udf("content")).alias("m")).select("m.*")


def _commitlog_bytes(store):
    from rmqstore import batch
    return sum(int(c["store_size"].sum()) for p, b, _ in batch.segment_files(store) for c in batch.iter_columns(p, b))


class SparkDecode:
    """asv: seconds to decode one store through Spark (source vs ceiling vs baseline)."""

    timeout = 900

    def setup(self):
        self.tmp = tempfile.mkdtemp(prefix="rmq-bench-spark-")
        self.store = _write(self.tmp, MESSAGES)
        self.spark = _spark(2)
        self.canned = json.dumps(_prebuild(self.store, self.tmp, 4))

    def teardown(self):
        self.spark.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _source(self, columns=None):
        r = self.spark.read.format("rocketmq").option("minPartitions", "4")
        return (r.option("columns", ",".join(columns)) if columns else r).load(self.store)

    def _canned(self, columns=None):
        r = self.spark.read.format(CANNED).option("files", self.canned)
        return (r.option("columns", ",".join(columns)) if columns else r).load()

    def time_source_count(self):
        self._source().count()

    def time_canned_count(self):
        self._canned().count()

    def time_source_narrow_count(self):
        self._source(NARROW).count()

    def time_canned_narrow_count(self):
        self._canned(NARROW).count()

    def time_export(self):
        from rmqstore.spark import jobs
        jobs.export(self.spark, [self.store], os.path.join(self.tmp, "export"))

    def time_writer(self):
        from rmqstore.spark import jobs
        jobs.write(self._source(), os.path.join(self.tmp, "written"), mode="overwrite", **WRITER_OPTIONS)

    def time_null_writer(self):
        self._source().write.format(NULL_SINK).mode("append").save(os.path.join(self.tmp, "null"))

    def time_baseline_count(self):
        _baseline(self.spark, self.store).count()


WRITER_OPTIONS = dict(commitlogFileSize=64 << 20, indexSlots=100_000, indexEntries=400_000)


def main(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=MESSAGES)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of runs; each figure is its best round")
    args = ap.parse_args(argv)
    from rmqstore import batch
    from rmqstore.spark import jobs
    tmp = tempfile.mkdtemp(prefix="rmq-bench-spark-")
    try:
        store = _write(tmp, args.messages)
        nbytes = _commitlog_bytes(store)
        spark = _spark(args.cores)
        parts = 2 * args.cores
        canned = json.dumps(_prebuild(store, tmp, parts))
        try:
            def source(columns=None):
                r = spark.read.format("rocketmq").option("minPartitions", str(parts))
                return (r.option("columns", ",".join(columns)) if columns else r).load(store)

            def ceiling(columns=None):
                r = spark.read.format(CANNED).option("files", canned)
                return (r.option("columns", ",".join(columns)) if columns else r).load()
            export_dir = os.path.join(tmp, "export")

            def replay():
                """The exported Parquet, as the columns the writer stores (not those a store assigns)."""
                from rmqstore.spark.writer import ASSIGNED
                return spark.read.parquet(export_dir).select(*[c for c in _arrow_schema().names if c not in ASSIGNED])
            runs = {
                "source -> count": lambda: source().count(),
                "canned Arrow -> count": lambda: ceiling().count(),
                "source 5 cols -> count": lambda: source(NARROW).count(),
                "canned Arrow 5 cols -> count": lambda: ceiling(NARROW).count(),
                # before the writers, which leave the heap too full for it
                "binaryFile+UDF -> count": lambda: _baseline(spark, store).count(),
                "export job -> parquet": lambda: jobs.export(spark, [store], export_dir),
                "parquet -> sum(length(body))": lambda: spark.read.parquet(export_dir)
                .selectExpr("sum(length(body))").first(),
                "writer (source -> stores)": lambda: jobs.write(source(), os.path.join(tmp, "written"),
                                                                mode="overwrite", **WRITER_OPTIONS),
                "null Arrow writer (source ->)": lambda: source().write.format(NULL_SINK).mode("append")
                .save(os.path.join(tmp, "null")),
                "writer (parquet -> stores)": lambda: jobs.write(replay(), os.path.join(tmp, "replayed"),
                                                                 mode="overwrite", **WRITER_OPTIONS),
                "null Arrow writer (parquet ->)": lambda: replay().write.format(NULL_SINK).mode("append")
                .save(os.path.join(tmp, "null")),
            }
            runs["source -> count"]()   # warm up workers and the page cache
            runs["canned Arrow -> count"]()
            runs["null Arrow writer (source ->)"]()   # its first run starts the writer's Python workers
            print(f"{args.messages} messages, {nbytes / 1e6:.1f} MB of commitlog, local[{args.cores}], "
                  f"{os.cpu_count()} CPUs (loaded machine: figures are rough)")
            jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
            secs, cpus = {}, {}
            for rep in range(args.repeat):   # rounds interleave the runs: load changes hit them alike
                for name, fn in runs.items():
                    if rep == 0 or not name.startswith("binaryFile"):   # writers too: their first run imports the store
                        try:
                            c = _cpu_seconds(jvm)
                            secs[name] = min(secs.get(name, float("inf")), _timed(fn))
                            cpus.setdefault(name, []).append(_cpu_seconds(jvm) - c)
                        except Exception as e:   # the baseline may exhaust the JVM heap
                            if not name.startswith("binaryFile"):
                                raise
                            print(f"{name}: failed ({type(e).__name__}), left out", flush=True)
                        for out in ("written", "replayed"):   # so no writer run times removing the last one's
                            shutil.rmtree(os.path.join(tmp, out), ignore_errors=True)
            cpu = {name: sorted(c)[len(c) // 2] / nbytes * 1e9 for name, c in cpus.items()}   # ms/MB
            for name, t in secs.items():
                mbs = nbytes / t / 1e6
                print(f"{name:30s} {t:7.2f} s {mbs:8.1f} MB/s {mbs / args.cores:8.1f} MB/s/core "
                      f"{cpu[name]:6.2f} ms CPU/MB", flush=True)
            segs = batch.segment_files(store)
            in_process = {
                "iter_arrow, 20 cols": lambda: [rb for p, b, _ in segs for rb in batch.iter_arrow(p, b)],
                "iter_arrow, 5 cols": lambda: [rb for p, b, _ in segs for rb in batch.iter_arrow(p, b, columns=NARROW)],
                "iter_columns + to_arrow": lambda: [batch.to_arrow(c, store) for p, b, _ in segs
                                                    for c in batch.iter_columns(p, b, batch_bytes=4 << 20)],
            }
            for name, fn in in_process.items():
                t = min(_timed(fn) for _ in range(3))
                print(f"in-process {name:19s} {t:7.2f} s {nbytes / t / 1e6:8.1f} MB/s (1 core, no Spark)")
            for a, b in (("source -> count", "canned Arrow -> count"),
                         ("source 5 cols -> count", "canned Arrow 5 cols -> count"),
                         ("source -> count", "binaryFile+UDF -> count"),
                         ("export job -> parquet", "binaryFile+UDF -> count"),
                         ("writer (source -> stores)", "null Arrow writer (source ->)"),
                         ("writer (parquet -> stores)", "null Arrow writer (parquet ->)"),
                         ("parquet -> sum(length(body))", "source -> count")):
                if a in secs and b in secs:
                    print(f"{a:30s} {secs[b] / secs[a]:6.2f}x {b} (CPU: {cpu[b] / cpu[a]:.2f}x)")
        finally:
            spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cpu_seconds(pid):
    """CPU seconds (user + system, reaped children's included) of process ``pid`` and every
    process under it, from /proc (0 where there is none)."""
    children, stats = {}, {}
    for p in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        try:
            with open(f"/proc/{p}/stat") as f:
                stats[int(p)] = f.read().rsplit(")", 1)[1].split()
        except OSError:   # gone meanwhile
            continue
        children.setdefault(int(stats[int(p)][1]), []).append(int(p))
    todo, ticks = [pid], 0
    while todo:
        p = todo.pop()
        if p in stats:
            ticks += sum(int(v) for v in stats[p][11:15])   # utime, stime, cutime, cstime
        todo += children.get(p, [])
    return ticks / os.sysconf("SC_CLK_TCK")


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main(sys.argv[1:])
