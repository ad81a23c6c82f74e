"""The ``cox`` benchmark suite runs end to end in its quick mode (shrunk by ``SPARSEGP_BENCH_TINY``),
its ``simulate`` table included."""
import math

from test_benchmarks import run_suite


def test_cox_quick(tmp_path):
    stdout, rows = run_suite("cox", tmp_path)
    assert stdout.count("| simulated |") >= 3
    # the cost of simulate (a child process): a pattern of about int E_q lambda events
    simulate = [row for row in rows if row.get("table") == "simulate"]
    rows = [row for row in rows if row.get("table") != "simulate"]
    assert [row["backend"] for row in simulate] == ["pyro"] and "cox simulate:" in stdout
    assert simulate[0]["seconds"] > 0 and simulate[0]["candidates"] > simulate[0]["mean_count"] > 0
    assert 0.5 < simulate[0]["mean_count"] / simulate[0]["expected"] < 2  # a sanity check: 2 patterns, a short fit
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
