"""A Spark standalone cluster on localhost, started from the pyspark install: one master and
one worker (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``)
bound to 127.0.0.1, so jobs run in executor JVMs of their own, as on a real cluster.

    with standalone_cluster(cores=2, memory="1g") as master:   # "spark://127.0.0.1:PORT"
        spark = rmqstore.spark.session(master)

Used by the tests and the README; ``python -m rmqstore.spark.cluster`` runs one until
interrupted. Every process is started in a session of its own and stopped (SIGTERM, then
SIGKILL) on exit, within bounded time.
"""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from rmqstore.errors import StoreError


class ClusterError(StoreError):
    """The local cluster did not come up in time (the log excerpt says why)."""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_class():
    import pyspark
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def _start(args, log, env):
    with open(log, "wb") as out:
        return subprocess.Popen([_spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_for(log, text, proc, deadline):
    while time.monotonic() < deadline:
        with open(log, "rb") as f:
            if text in f.read():
                return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    with open(log, "rb") as f:
        tail = f.read()[-2000:].decode("utf-8", "replace")
    raise ClusterError(f"{log}: no {text.decode()!r} within the time limit; log ends:\n{tail}")


def _stop(proc, grace=10):
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace)


@contextlib.contextmanager
def standalone_cluster(cores=2, memory="1g", timeout=90, work_dir=None):
    """Start a master and a worker (``cores``, ``memory`` for executors) on 127.0.0.1;
    yield the master URL; stop both on exit. ClusterError if they are not up within
    ``timeout`` seconds. Executors run this interpreter (PYSPARK_PYTHON)."""
    own_dir = work_dir is None
    work_dir = tempfile.mkdtemp(prefix="rmq-spark-cluster-") if own_dir else str(work_dir)
    os.makedirs(work_dir, exist_ok=True)
    port = _free_port()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_MASTER_HOST="127.0.0.1",
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
               SPARK_LOG_DIR=work_dir, SPARK_WORKER_DIR=os.path.join(work_dir, "work"),
               SPARK_DAEMON_MEMORY="512m")
    master_log, worker_log = os.path.join(work_dir, "master.log"), os.path.join(work_dir, "worker.log")
    url = f"spark://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    procs = []
    try:
        procs.append(_start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                             "--webui-port", str(_free_port())], master_log, env))
        _wait_for(master_log, b"I have been elected leader", procs[0], deadline)
        procs.append(_start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores",
                             str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                             "--work-dir", os.path.join(work_dir, "work")], worker_log, env))
        _wait_for(master_log, b"Registering worker", procs[1], deadline)
        yield url
    finally:
        for p in reversed(procs):
            _stop(p)
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)


def main():
    """Run a local cluster until interrupted, printing its master URL."""
    with standalone_cluster() as url:
        print(url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
