"""The harmonic tutorial runs in its quick mode: the two posterior components of the negation
recover the even and odd parts of the function, exactly (anti)symmetric, summing to ``f``; on
kin40k HVGP beats SVGPs with as many and twice as many points."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("SPARSEGP_DATA", ROOT.parent / "shared" / "data"))


def run(*args, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "tutorials" / "harmonic_regression.py"), "--quick", *args,
                             "--output", str(tmp_path / "plot.png")], capture_output=True, text=True, timeout=900,
                            cwd=ROOT, env={**os.environ, "SPARSEGP_DATA": str(SHARED)})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_even_odd_split(backend, tmp_path):
    """Both backends: the toy. Pyro also runs the kin40k part where the data are (skipped otherwise):
    HVGP 8 x 32 (PCA reflections) predicts better than the SVGPs with 32 and 64 points, and its
    trace error before training is the lowest, the paper's way of choosing a transformation."""
    kin40k = backend == "pyro" and (SHARED / "uci_kin40k").is_dir()
    stdout = run("--backend", backend, *(["--kin40k"] if kin40k else []), tmp_path=tmp_path)
    rmse = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.+?)\s+RMSE ([\d.]+)", stdout, re.M)}
    assert rmse["f"] < 0.1 and rmse["even part"] < 0.15 and rmse["odd part"] < 0.15, rmse
    assert float(re.search(r"symmetry .* ([\d.e+-]+)$", stdout, re.M).group(1)) < 1e-8
    assert float(re.search(r"sum .* ([\d.e+-]+)$", stdout, re.M).group(1)) < 1e-8
    assert (tmp_path / "plot.png").stat().st_size > 10_000
    if kin40k:
        pattern = r"^kin40k (\S+ \S+)\s+RMSE ([\d.]+)\s+NLPD ([-\d.]+)\s+trace error / n before training ([\d.]+)"
        rows = {m.group(1): tuple(float(m.group(i)) for i in (2, 3, 4)) for m in re.finditer(pattern, stdout, re.M)}
        assert set(rows) == {"SVGP M=32", "SVGP M=64", "HVGP 8x32"}, stdout
        hvgp = rows.pop("HVGP 8x32")
        for name, (rmse, nlpd, error) in rows.items():
            assert hvgp[0] < rmse and hvgp[1] < nlpd and hvgp[2] < error, (name, hvgp, rows)
