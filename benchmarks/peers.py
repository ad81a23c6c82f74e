"""Suite ``peers``: seconds per SVI step of our SVGP (Pyro; NumPyro under jit) beside GPyTorch's
SVGP and ``pyro.contrib.gp.models.VariationalSparseGP``.

kin40k (split 0, standardised), minibatch 1024, float32, 2 threads, SE-ARD kernel, Gaussian
likelihood, full Cholesky ``q(u)``, whitened, inducing inputs from the same training rows; all
four are built on the same problem and timed in the same run, their timed blocks alternating
(:func:`~benchmarks.harness.time_steps`). Each figure is the median seconds per step over the
blocks; ratios are GPyTorch's median over the other's (above 1: faster than GPyTorch). The steps
timed are those of :mod:`benchmarks.runners` (ours: steps of the product's ``fit``).
"""
from . import harness, runners

DATASET = "kin40k"
ORDER = ("ours_pyro", "ours_numpyro", "gpytorch", "contrib_gp")


def settings(quick):
    if harness.tiny():
        return {"sizes": (64,), "batch": 256, "repeats": 2, "block_seconds": 0.05, "warmup": 2}
    if quick:
        return {"sizes": (256, 1024), "batch": 1024, "repeats": 3, "block_seconds": 0.3, "warmup": 2}
    if harness.DEVICE != "cpu":  # steps of milliseconds: shorter blocks, within a GPU lease
        return {"sizes": (1024, 4096, 8192), "batch": 1024, "repeats": 5, "block_seconds": 0.4, "warmup": 3}
    return {"sizes": (256, 1024, 2048, 4096), "batch": 1024, "repeats": 7, "block_seconds": 1.5, "warmup": 3}


COLUMNS = (
    [("M", "M", "{}")]
    + [(runners.RUNNERS[key].name, f"seconds_{key}", "{:.4f} s") for key in ORDER]
    + [(f"GPyTorch / {runners.RUNNERS[key].name}", f"ratio_{key}", "{:.2f}") for key in ORDER if key != "gpytorch"]
)


def title(rows):
    row = rows[0]
    return (
        f"peers: median seconds per SVI step, {row['dataset']} (N = {row['num_data']}, D = {row['input_dim']}), "
        f"batch {row['batch']}, {row['dtype']}, {row['device']}, {row['threads']} threads, medians of {row['repeats']} blocks"
    )


def run(quick):
    """One row per M with the median seconds per step of each implementation and the ratios."""
    rows = runners.timed_rows("peers", DATASET, ORDER, settings(quick))
    for row in rows:
        for key in ORDER:
            if key != "gpytorch":
                row[f"ratio_{key}"] = row["seconds_gpytorch"] / row[f"seconds_{key}"]
    return rows
