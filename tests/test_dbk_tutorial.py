"""The deep-basis-kernel tutorial runs in its quick mode on the step function and writes its plot."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_dbk_step(backend, tmp_path):
    output = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, str(ROOT / "tutorials" / "dbk_step.py"), "--quick", "--backend", backend,
                             "--output", str(output)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    found = {m.group(1).strip(): (float(m.group(2)), float(m.group(3))) for m in
             re.finditer(r"^(.+?)\s+RMSE ([\d.]+) .* noise ([\d.e+-]+)", result.stdout, re.M)}
    assert set(found) == {"RBF GP", "DBK-c (no correction)", "DBK (corrected)"}
    assert found["DBK-c (no correction)"][0] < found["RBF GP"][0]  # DBK follows the jumps
    assert found["DBK-c (no correction)"][1] < found["DBK (corrected)"][1]  # Theorem 1: the noise collapses
    assert output.stat().st_size > 10_000
