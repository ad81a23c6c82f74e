"""The stand-alone examples of the docs (docs/examples/standalone_*.py) and the README demo."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "docs" / "examples"))
import standalone_numpyro  # noqa: E402
import standalone_pyro  # noqa: E402


@pytest.mark.parametrize("example", [standalone_pyro, standalone_numpyro], ids=["pyro", "numpyro"])
def test_standalone_regression_and_classification(example):
    rmse, noise_sd = example.regression()
    assert rmse < 0.1 and 0.17 < noise_sd < 0.24
    assert example.classification() > 0.95


def test_demo_runs_and_writes_plot(tmp_path):
    output = tmp_path / "demo.png"
    result = subprocess.run([sys.executable, str(ROOT / "tutorials" / "banana_demo.py"), "--quick",
                             "--output", str(output)], capture_output=True, text=True, check=True, timeout=600)
    accuracies = [float(line.split("test accuracy")[1].split()[0]) for line in result.stdout.splitlines() if "test accuracy" in line]
    assert len(accuracies) == 2 and min(accuracies) > 0.8  # 300 steps; 0.88-0.90 after 2000
    assert output.stat().st_size > 10_000


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(quick_start) == 2
    steps = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert steps[-2:] == [quick_start[1], ".ci/newest"]  # then the newest-versions tier
