"""The endpoint figures script runs end to end (numbers not checked: the machine is shared)."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asv_bench"))
import endpoint_figures  # noqa: E402


def test_figures_run(tmp_path):
    res = endpoint_figures.run(messages=40, body_size=64, workdir=tmp_path)
    assert [r["messages"] for r in res["rows"]] == [40] * 6       # every send received back
    assert all(r["per_s"] > 0 and r["server_cpu_us_per_msg"] >= 0 for r in res["rows"])
