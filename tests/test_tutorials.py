"""The tutorials run end to end in their quick mode, reach their stated accuracy and write plots."""
import re
import subprocess
import sys
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(script, *args):
    result = subprocess.run([sys.executable, str(ROOT / "tutorials" / script), "--quick", *args],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_hierarchical_regression(backend, tmp_path):
    output = tmp_path / "plot.png"
    out = run(f"hierarchical_regression_{backend}.py", "--output", str(output))
    trend, offsets = map(float, re.search(r"trend RMSE ([\d.]+), site offset RMSE ([\d.]+)", out).groups())
    assert trend < 0.25 and offsets < 0.1  # the noise sd is 0.3; offsets spread 0.8
    assert output.stat().st_size > 10_000


# The max Pareto k of the quick float32 NumPyro run follows its rounding: 0.77, 1.85, 2.03 and 2.31
# have been seen with other thread counts, installs and Cholesky gradient rules (the same model and
# data). Issue 21 pins the transitive versions and revisits the export.
ARVIZ_NUMPYRO_DRIFT = pytest.mark.xfail(reason="max Pareto k of the float32 NumPyro run follows its rounding", strict=False)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pyro", pytest.param("numpyro", marks=ARVIZ_NUMPYRO_DRIFT)])
def test_arviz_diagnostics(backend, tmp_path):
    output = tmp_path / "plot.png"
    out = run("arviz_diagnostics.py", "--backend", backend, "--output", str(output))
    table = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("M=") and "elpd" not in line}
    assert table["M=24"][1] == "0" and table["M=3"][1] == "1"  # LOO ranks the adequate model first
    k = float(re.search(r"max Pareto k ([\d.]+)", out).group(1))
    assert k < 1.0
    assert output.stat().st_size > 10_000


@pytest.mark.slow
def test_qsgp_flights(tmp_path):
    """The quick run on flights_3m (skipped without the data): it times a step at each m (the
    times are the benchmark's business: a busy machine skews them) and the trained model is at
    least as good as the constant predictor."""
    import os

    shared = pathlib.Path(os.environ.get("SPARSEGP_DATA") or ROOT.parent / "shared" / "data")
    if not (shared / "flights_3m" / "flights_3m.npz").exists():
        pytest.skip(f"flights_3m is not in {shared} ($SPARSEGP_DATA, else ../shared/data)")
    output = tmp_path / "plot.png"
    out = run("qsgp_flights.py", "--data-dir", str(shared), "--output", str(output))
    ratio = float(re.search(r"takes ([\d.]+) x the step", out).group(1))
    rmse, constant = map(float, re.search(r"test RMSE ([\d.]+) \(constant predictor ([\d.]+)\)", out).groups())
    assert ratio > 0 and rmse <= constant, out
    assert output.stat().st_size > 10_000


@pytest.mark.slow
def test_qsgp_rvm(tmp_path):
    """The quick run: the mean follows sinc and empirical Bayes spreads the precisions apart (the
    functions far from the data's structure are on their way to being pruned)."""
    output = tmp_path / "plot.png"
    out = run("qsgp_rvm.py", "--output", str(output))
    rmse = float(re.search(r"test RMSE ([\d.]+)", out).group(1))
    low, high = (float(v) for v in re.search(r"precisions s: min ([\d.e+-]+), median [\d.e+-]+, max ([\d.e+-]+)",
                                              out).groups())
    assert rmse < 0.25 and high > 100 * low, out
    assert output.stat().st_size > 10_000


@pytest.mark.slow
def test_qsgp_regression(tmp_path):
    output = tmp_path / "plot.png"
    out = run("qsgp_regression.py", "--output", str(output))
    rmse, coverage = map(float, re.search(r"test RMSE ([\d.]+) .*coverage ([\d.]+)", out).groups())
    assert rmse < 0.2 and coverage > 0.9  # the function's amplitude is 1.5; the noise sd 0.2
    assert output.stat().st_size > 10_000
