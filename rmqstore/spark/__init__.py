"""PySpark integration: the "rocketmq" data source and the pipeline jobs (export, rebuild,
query, verify). Needs the ``[spark]`` extra (pyspark>=4, pyarrow)."""
from rmqstore.spark.launch import DEFAULTS, session
from rmqstore.spark.source import RocketMQDataSource, find_stores, register

__all__ = ["DEFAULTS", "RocketMQDataSource", "find_stores", "register", "session"]
