"""A Spark job's stderr holds what an operator's log should: no JVM start-up warnings, no
WARN lines and no carriage-return progress bars, unless asked for (verbose)."""
import subprocess
import sys

import pytest
from test_cli import ENV

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")

_JOB = """
import sys
from rmqstore.spark import session
spark = session("local[1]", verbose=sys.argv[1] == "verbose")
print(spark.range(200000).repartition(3).count())
spark.stop()
"""


def _stderr(mode):
    p = subprocess.run([sys.executable, "-c", _JOB, mode], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "200000", p.stderr
    return p.stderr


def test_quiet_by_default():
    err = _stderr("quiet")
    assert err == "", err


@pytest.mark.slow   # a second JVM start for the other side of the switch
def test_verbose_keeps_sparks_own_output():
    err = _stderr("verbose")
    assert "log level" in err and "WARN" in err, err
