"""ruff over the package, tests and benchmarks, with the rules in pyproject.toml."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the [test] extra)")
    p = subprocess.run([ruff, "check", "rmqstore", "tests", "asv_bench"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
