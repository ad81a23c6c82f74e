"""The ``dbk`` benchmark suite runs end to end in its tiny mode (``SPARSEGP_BENCH_TINY=1``)."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402

pytest.importorskip("gpytorch")


@pytest.mark.slow
def test_dbk_tiny(monkeypatch):
    monkeypatch.setenv("SPARSEGP_BENCH_TINY", "1")
    import benchmarks.dbk as suite

    rows = suite.run(quick=True)
    scaling = [row for row in rows if row["part"] == "scaling"]
    table = [row for row in rows if row["part"] == "table1"]
    assert [row["n"] for row in scaling] == [1000, 4000]
    assert all(row["seconds"] > 0 for row in scaling) and scaling[0]["per_point"] == pytest.approx(1.0)
    assert scaling[0]["ratio"] == pytest.approx(scaling[0]["seconds_gpytorch"] / scaling[0]["seconds"])
    assert {(row["dataset"], row["model"]) for row in table} == {
        (d, m) for d in ("pol", "protein") for m in ("DBK", "DBK-c", "SVDBK", "SVDBK-c", "SVGP")}
    for row in table:
        assert all(math.isfinite(row[k]) for k in ("mae", "rmse", "nll", "train_seconds"))
        assert 0 < row["rmse"] < 2.0 and row["mae"] <= row["rmse"]  # standardised targets
        assert row["paper_rmse"] == suite.PAPER[row["dataset"]][row["model"]][1]
    for title, columns, table_rows in suite.tables(rows):
        text = harness.markdown_table(columns, table_rows, title=title)
        assert text.count("\n|") == len(table_rows) + 2  # header, separator, rows
    assert "| table1 | pol | DBK |" in harness.markdown_table(suite.COLUMNS, rows, title=suite.title(rows))
