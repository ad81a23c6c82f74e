"""The ``dbk`` benchmark suite runs end to end in its tiny mode (``SPARSEGP_BENCH_TINY=1``)."""
import json
import math
import sys
from pathlib import Path

import numpy as np
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
    assert all(row["malloc"] == "freed memory retained" for row in scaling)  # measured in a child with that malloc
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


@pytest.mark.slow
def test_dbk_cells_and_their_table(monkeypatch, tmp_path, capsys):
    """``python -m benchmarks.dbk cell ...`` appends one row per run; ``table`` keeps the last row of
    each dataset, model and seed and prints Table 1 from them."""
    import torch

    monkeypatch.setenv("SPARSEGP_BENCH_TINY", "1")
    import benchmarks.dbk as suite

    out, threads = str(tmp_path / "cells.jsonl"), torch.get_num_threads()
    try:
        for args in (["pol", "DBK", "0"], ["pol", "DBK", "1"], ["pol", "SVDBK", "0"], ["pol", "DBK", "1"]):
            suite.main(["cell", *args, "--out", out])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 4 and rows[0]["command"] == f"python -m benchmarks.dbk cell pol DBK 0 --out {out}"
    assert all(math.isfinite(r["rmse"]) and r["part"] == "cell" for r in rows)
    assert "DBK 10/10: validation NLL" in capsys.readouterr().err  # a line per evaluation
    suite.main(["table", "--out", out])
    table = capsys.readouterr().out
    dbk = [line for line in table.splitlines() if line.startswith("| pol | DBK |")]
    assert len(dbk) == 1 and dbk[0].split("|")[3].strip() == "2"  # seeds 0 and 1, the repeated cell once
    mean = np.mean([rows[0]["rmse"], rows[3]["rmse"]])
    assert f"{mean:.4f}" in dbk[0]
    assert "| pol | SVDBK | 1 |" in table and "protein" not in table

