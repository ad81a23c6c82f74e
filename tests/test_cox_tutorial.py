"""The Cox-process tutorial runs in quick mode on the shared point patterns (skipped when absent),
shows the drop of the coal-mining disaster rate around 1890, recovers the covariate effects of a
simulated pattern and writes its plots."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("SPARSEGP_DATA", ROOT.parent / "shared" / "data"))


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "point_patterns").is_dir(), reason=f"{SHARED}/point_patterns is absent")
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_cox_tutorial(backend, tmp_path):
    if backend == "pyro":
        pytest.importorskip("torch")  # absent from the newest-versions tier
    result = subprocess.run(
        [sys.executable, str(ROOT / "tutorials" / "cox_processes.py"), "--quick", "--backend", backend,
         "--data-dir", str(SHARED), "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = map(float, re.search(r"([\d.]+)/year in 1855-1885, ([\d.]+)/year", result.stdout).groups())
    assert 2.3 < before < 4.0 and 0.6 < after < 1.5  # about 3 per year before 1890, 1 after
    assert float(re.search(r"max Pareto k ([\d.]+)", result.stdout).group(1)) < 0.7
    # the covariates' effects (per sd of each image) within 2 of their reported sd of the truth
    effects = re.findall(r"(\w+) (-?[\d.]+) ± ([\d.]+) \(truth (-?[\d.]+)\)", result.stdout)
    assert [name for name, *_ in effects] == ["wave", "slope"], result.stdout
    for _, estimate, sd, truth in effects:
        assert abs(float(estimate) - float(truth)) < 2 * float(sd) and float(sd) < 0.12, effects
    for name in ("coal", "maps", "covariates"):
        assert (tmp_path / f"cox_{name}_{backend}.png").stat().st_size > 20_000
