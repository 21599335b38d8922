"""PySpark integration: the "rocketmq" data source and the pipeline jobs (export, rebuild,
query, verify). Needs the ``[spark]`` extra (pyspark>=4, pyarrow)."""
from rmqstore.spark.source import RocketMQDataSource, find_stores, register

__all__ = ["RocketMQDataSource", "find_stores", "register", "session"]


def session(master="local[*]", app_name="rmqstore", **conf):
    """A SparkSession with the rocketmq source registered, filter pushdown on and the UI off
    (``conf`` keys use ``_`` for ``.``: ``spark_sql_shuffle_partitions=2``)."""
    import os
    import sys
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # workers use this interpreter
    b = SparkSession.builder.master(master).appName(app_name) \
        .config("spark.ui.enabled", "false").config("spark.sql.python.filterPushdown.enabled", "true") \
        .config("spark.sql.session.timeZone", "UTC")
    for k, v in conf.items():
        b = b.config(k.replace("_", "."), v)
    spark = b.getOrCreate()
    register(spark)
    return spark
