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
    rows = {r["case"]: r for r in res["rows"]}
    assert len(rows) == 12 and len([c for c in rows if c.startswith("no-op ")]) == 4
    for case, r in rows.items():
        if case.startswith("no-op "):
            assert r["messages"] >= 40 and case[6:] in rows           # the same raw load beside the endpoint
        else:
            assert r["messages"] == 40                               # every send received back
        assert r["per_s"] > 0 and r["server_cpu_us_per_msg"] >= 0 and r["client_cpu_us_per_msg"] >= 0
