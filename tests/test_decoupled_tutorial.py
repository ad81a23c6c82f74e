"""The decoupled-bases tutorial runs in its quick mode, beats the shared M=10 basis and writes its plot."""
import re
import subprocess
import sys
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_decoupled_sinc(backend, tmp_path):
    output = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, str(ROOT / "tutorials" / "decoupled_sinc.py"), "--quick", "--backend", backend,
                             "--output", str(output)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rmse = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.+?)\s+RMSE ([\d.]+)", result.stdout, re.M)}
    assert rmse["decoupled M_alpha=100, M_beta=10"] < rmse["shared M=10"]
    assert rmse["shared M=100"] < 0.05  # the noise sd is 0.1; the test targets are noise-free
    assert output.stat().st_size > 10_000
