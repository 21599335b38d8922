"""A Spark driver run in a subprocess by the tests (a process holds one SparkContext, and a
driver must be killable): ``jobs MASTER STORE WORK`` prints the jobs' results as JSON;
``stream STORE SINK CHECKPOINT MAX_BYTES UNTIL`` runs a streaming query from a store into a
Parquet sink until the sink holds UNTIL rows (0: until killed)."""
import hashlib
import json
import sys
import time


def jobs(master, store, work):
    from rmqstore.spark import jobs, session
    spark = session(master, spark_executor_memory="512m", spark_sql_shuffle_partitions="2")
    try:
        df = spark.read.format("rocketmq").load(store)
        rows = sorted((r.phy_offset, r.msg_id, r.topic, r.keys, hashlib.sha256(r.body).hexdigest())
                      for r in df.collect())
        projected = spark.read.format("rocketmq").schema("topic string, queue_id int, body binary").load(store) \
            .groupBy("topic", "queue_id").count().orderBy("topic", "queue_id").collect()
        export = jobs.export(spark, [store], f"{work}/pq")
        parquet = spark.read.parquet(f"{work}/pq").count()
        written = jobs.write(df.filter("topic not like 'SCHEDULE%'"), f"{work}/stores", indexSlots=1000,
                             indexEntries=4000, commitlogFileSize=1 << 20, strictTopicNames="false")
        back = spark.read.format("rocketmq").load(f"{work}/stores").count()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        print(json.dumps(dict(rows=hashlib.sha256(json.dumps(rows).encode()).hexdigest(), count=len(rows),
                              projected=[tuple(r) for r in projected], exported=export["messages"],
                              parquet=parquet, written=written["messages"], back=back, executors=executors,
                              master=spark.sparkContext.master)))
    finally:
        spark.stop()


def stream(store, sink, checkpoint, max_bytes, until):
    from rmqstore.spark import session
    spark = session("local[2]", spark_sql_shuffle_partitions="2")
    q = spark.readStream.format("rocketmq").option("maxBytesPerTrigger", max_bytes) \
        .option("columns", "phy_offset,body").load(store) \
        .writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint) \
        .trigger(processingTime="200 milliseconds").start()
    print("started", flush=True)
    while int(until) == 0 or _rows(spark, sink) < int(until):
        if q.exception() is not None:
            raise q.exception()
        time.sleep(0.3)
    q.stop()
    spark.stop()


def _rows(spark, sink):
    try:
        return spark.read.parquet(sink).count()
    except Exception:   # no committed batch yet
        return 0


if __name__ == "__main__":
    {"jobs": jobs, "stream": stream}[sys.argv[1]](*sys.argv[2:])
