"""PySpark integration: the "rocketmq" data source and the pipeline jobs (export, rebuild,
query, verify). Needs the ``[spark]`` extra (pyspark>=4, pyarrow)."""
from rmqstore.spark.source import RocketMQDataSource, find_stores, register

__all__ = ["RocketMQDataSource", "find_stores", "register", "session"]


def session(master=None, app_name="rmqstore", **conf):
    """A SparkSession with the rocketmq source registered, filter pushdown on and the UI off
    (``conf`` keys use ``_`` for ``.``: ``spark_sql_shuffle_partitions=2``). The master is
    ``master`` if given, else the one spark-submit passed, else ``$SPARK_MASTER``, else
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
    b = b.config("spark.ui.enabled", "false").config("spark.sql.python.filterPushdown.enabled", "true") \
        .config("spark.sql.session.timeZone", "UTC")
    for k, v in conf.items():
        b = b.config(k.replace("_", "."), v)
    spark = b.getOrCreate()
    register(spark)
    return spark
