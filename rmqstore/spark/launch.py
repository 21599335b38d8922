"""Starting Spark for rmqstore: the session's defaults, and a quiet JVM unless asked otherwise.

Quiet means what an operator's log should hold: Spark's own log at ERROR (a packaged log4j2
configuration replaces the WARN default and its "Using Spark's default log4j profile"
banners), no console progress bars (carriage returns in a log), and the JVM's start-up
notice about incubator modules (Spark 4 adds jdk.incubator.vector to every JVM) dropped from
the driver's stderr; everything else the driver JVM writes there is passed on.
"""
import os
import re
import subprocess
import sys
import threading
from importlib import resources

# Arrow batches from the JVM to Python workers (the rocketmq writer, Arrow UDFs) bounded by
# rows only (maxRecordsPerBatch, 10,000), as before Spark 4.0: under a byte limit Spark
# measures the batch after every row it adds, a fifth of the JVM's CPU when the writer
# replays Parquet (asv_bench/benchmarks/spark.py). Messages of MBs: pass a lower
# spark_sql_execution_arrow_maxRecordsPerBatch, or a byte limit back.
DEFAULTS = {"spark.ui.enabled": "false", "spark.sql.python.filterPushdown.enabled": "true",
            "spark.sql.session.timeZone": "UTC", "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}
_JVM_NOISE = re.compile(rb"^WARNING: Using incubator modules:")


def _quiet_conf() -> dict[str, str]:
    log4j = resources.files("rmqstore.spark") / "log4j2.properties"
    return {"spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}"}


def _forward(stream) -> None:
    """Copy the driver JVM's stderr to ours (whatever sys.stderr is then), less the start-up noise."""
    for line in iter(stream.readline, b""):
        if not _JVM_NOISE.match(line):
            sys.stderr.write(line.decode(errors="replace"))
            sys.stderr.flush()


def _start_quiet_jvm(conf) -> None:
    """Launch the driver JVM with its stderr through _forward, and make it the SparkContext's."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_forward, args=(gateway.proc.stderr,), name="rmqstore-spark-stderr",
                     daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def session(master=None, app_name="rmqstore", verbose=False, **conf):
    """A SparkSession with the rocketmq source registered, filter pushdown on, the UI off
    and Arrow batches to Python bounded by rows, not bytes (DEFAULTS; ``conf`` overrides
    them, its keys with ``_`` for ``.``: ``spark_sql_shuffle_partitions=2``). The master
    is ``master`` if given, else the one spark-submit passed, else ``$SPARK_MASTER``, else
    ``local[*]``. Spark logs only errors and draws no progress bars unless ``verbose``."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from rmqstore.spark.source import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)   # workers use this interpreter
    launched = "PYSPARK_GATEWAY_PORT" in os.environ           # under spark-submit: its JVM is running
    if master is None and not launched:
        master = os.environ.get("SPARK_MASTER", "local[*]")
    settings = {**DEFAULTS, **({} if verbose else _quiet_conf()), **{k.replace("_", "."): v for k, v in conf.items()}}
    spark_conf = SparkConf().setAppName(app_name).setAll(list(settings.items()))
    if master is not None:
        spark_conf.setMaster(master)
    if not verbose and not launched and SparkContext._active_spark_context is None:
        _start_quiet_jvm(spark_conf)
    spark = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    register(spark)
    return spark
