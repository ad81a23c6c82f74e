"""The ``vof`` benchmark suite runs end to end in its tiny quick mode through the entry point."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("gpytorch")

@pytest.mark.slow
def test_vof_quick_tiny(tmp_path):
    env = {**os.environ, "SPARSEGP_BENCH_TINY": "1", "PYTHONWARNINGS": "ignore"}
    # XLA_FLAGS kept: the harness replaces its thread flags and keeps the rest (the suite's emitters)
    out = tmp_path / "vof.jsonl"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "vof", "--quick", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    parts = {row["part"] for row in rows}
    assert parts == {"speed", "fig3", "flights"}
    for row in rows:
        assert row["suite"] == "vof"
        if row["part"] == "speed":
            for key in ("hermite_diag", "hermite_dense", "fourier_diag", "ours_pyro", "gpytorch"):
                assert row[f"seconds_{key}"] > 0
            assert row["ratio"] == pytest.approx(row["seconds_gpytorch"] / row["seconds_hermite_diag"])
        elif row["part"] == "fig3":
            assert row["elbo_dense"] <= row["lml"] + 1e-6 and row["elbo_diag"] <= row["lml"] + 1e-6
            assert math.isfinite(row["elbo_diag"]) and math.isfinite(row["elbo_dense"])
        else:
            assert row["steps"] >= 5 and math.isfinite(row["rmse"]) and math.isfinite(row["nlpd"])
    headers = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert any(h.startswith("| M | Hermite diag |") for h in headers)
    assert any(h.startswith("| inputs | features | M | ELBO dense |") for h in headers)
    assert any(h.startswith("| method | seconds | steps |") for h in headers)
    assert (REPO / "outputs" / "benchmarks" / "vof_fig3_quick.png").stat().st_size > 10_000
