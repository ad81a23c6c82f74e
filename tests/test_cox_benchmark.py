"""The ``cox`` benchmark suite runs end to end in its quick mode (shrunk by ``SPARSEGP_BENCH_TINY``)."""
import math

from test_benchmarks import run_suite


def test_cox_quick(tmp_path):
    stdout, rows = run_suite("cox", tmp_path)
    assert stdout.count("| simulated |") >= 3
    methods = {row["method"] for row in rows}
    assert {"quadrature", "stratified MC", "binned"} <= methods
    for row in rows:
        assert row["suite"] == "cox" and row["seconds"] > 0
        if row["dataset"] == "simulated":
            assert 0 < row["recovery"] < 0.5  # integrated absolute error relative to the truth
        else:
            assert math.isfinite(row["heldout"])
    assert any(row["dataset"] == "simulated" for row in rows)
    covariates = {row["method"]: row for row in rows if row["dataset"] == "covariates"}
    assert set(covariates) == {"stratified MC (default)", "quadrature", "pixels"}
    assert all(len(row["coefficient_z"]) == 2 and "±" in row["coefficients"] for row in covariates.values())
