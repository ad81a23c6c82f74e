"""The VOF tutorial runs in its quick mode (the spec's Fig. 2 convergence smoke test: the trained
Fourier-feature bound stays below, and within a loose margin of, the exact log marginal likelihood)."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_vof_regression(backend, tmp_path):
    output = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, str(ROOT / "tutorials" / "vof_regression.py"), "--quick", "--backend", backend,
                             "--output", str(output)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    elbo, lml = map(float, re.search(r"ELBO (-?[\d.]+)\s+exact LML (-?[\d.]+)", result.stdout).groups())
    assert lml - 150 < elbo <= lml + 1e-6
    rmse = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.+?)\s+RMSE ([\d.]+)", result.stdout, re.MULTILINE)}
    assert rmse["fourier M=31 T=50"] < 0.6
    assert rmse["hermite M=200 diag"] < 0.1
    assert output.stat().st_size > 10_000
