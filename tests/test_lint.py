"""ruff over the package, tests and benchmarks, and mypy over the package, with the rules in
pyproject.toml."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name):
    exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip(f"{name} is not installed (it comes with the [test] extra)")
    return exe


def test_ruff_is_clean():
    p = subprocess.run([_tool("ruff"), "check", "rmqstore", "rmqstore_command.py", "tests", "asv_bench"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_is_clean():
    p = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)   # files etc. in pyproject.toml
    assert p.returncode == 0, p.stdout + p.stderr
