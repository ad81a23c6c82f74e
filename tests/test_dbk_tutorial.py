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
    found = {m.group(1).strip(): (float(m.group(2)), float(m.group(3)), float(m.group(4))) for m in
             re.finditer(r"^(.+?)\s+RMSE ([\d.]+) .* coverage ([\d.]+)\s+noise ([\d.e+-]+)", result.stdout, re.M)}
    assert set(found) == {"RBF GP", "DBK-c (no correction)", "DBK (corrected)"}
    plain, corrected = found["DBK-c (no correction)"], found["DBK (corrected)"]
    assert plain[0] < found["RBF GP"][0]  # DBK follows the jumps
    assert plain[2] < corrected[2]  # Theorem 1: the noise collapses
    assert corrected[1] > plain[1] + 0.1  # and the corrected bands cover the truth where the plain ones do not
    assert output.stat().st_size > 10_000
