"""PySpark integration: the "rocketmq" data source and the pipeline jobs (export, rebuild,
query, verify). Needs the ``[spark]`` extra (pyspark>=4, pyarrow)."""
from rmqstore.spark.source import RocketMQDataSource, find_stores, register

__all__ = ["RocketMQDataSource", "find_stores", "register", "session"]


# Arrow batches from the JVM to Python workers (the rocketmq writer, Arrow UDFs) bounded by
# rows only (maxRecordsPerBatch, 10,000), as before Spark 4.0: under a byte limit Spark
# measures the batch after every row it adds, a fifth of the JVM's CPU when the writer
# replays Parquet (asv_bench/benchmarks/spark.py). Messages of MBs: pass a lower
# spark_sql_execution_arrow_maxRecordsPerBatch, or a byte limit back.
DEFAULTS = {"spark.ui.enabled": "false", "spark.sql.python.filterPushdown.enabled": "true",
            "spark.sql.session.timeZone": "UTC", "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}


def session(master=None, app_name="rmqstore", **conf):
    """A SparkSession with the rocketmq source registered, filter pushdown on, the UI off
    and Arrow batches to Python bounded by rows, not bytes (DEFAULTS; ``conf`` overrides
    them, its keys with ``_`` for ``.``: ``spark_sql_shuffle_partitions=2``). The master
    is ``master`` if given, else the one spark-submit passed, else ``$SPARK_MASTER``, else
    ``local[*]``."""
    import os
    import sys

    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # workers use this interpreter
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:   # not under spark-submit
        master = os.environ.get("SPARK_MASTER", "local[*]")
    b = SparkSession.builder.appName(app_name)
    if master is not None:
        b = b.master(master)
    for k, v in {**DEFAULTS, **{k.replace("_", "."): v for k, v in conf.items()}}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    register(spark)
    return spark
