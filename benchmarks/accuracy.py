"""Suite ``accuracy``: test RMSE and NLPD of our SVGP (Pyro; NumPyro under jit) and GPyTorch's
after the same number of SVI steps.

elevators, kin40k and protein (split 0); inputs and targets standardised with the training
statistics, predictions mapped back, so RMSE and NLPD are in the original units of ``y``. All
three start from the same inducing inputs (rows of the training set) and hyperparameters and see
the same minibatches, with the same Adam learning rate (:mod:`benchmarks.runners`; ours are
trained by the product's ``fit``). NLPD is the mean of ``-log N(y | mean, var)`` with the
predictive variance including the noise. Wall time is the training loop's, compilation included.
"""
import math
import time

import numpy as np

from . import harness, runners

DATASETS = ("elevators", "kin40k", "protein")
ORDER = ("ours_pyro", "ours_numpyro", "gpytorch")

COLUMNS = [
    ("dataset", "dataset", "{}"),
    ("implementation", "implementation", "{}"),
    ("test RMSE", "rmse", "{:.4f}"),
    ("test NLPD", "nlpd", "{:.4f}"),
    ("train seconds", "seconds", "{:.1f}"),
]


def settings(quick):
    if harness.tiny():
        return {"datasets": ("kin40k",), "M": 16, "batch": 256, "steps": 20, "lr": 0.01}
    if quick:
        return {"datasets": DATASETS, "M": 128, "batch": 1024, "steps": 200, "lr": 0.01}
    return {"datasets": DATASETS, "M": 512, "batch": 1024, "steps": 2000, "lr": 0.01}


def title(rows):
    row = rows[0]
    return (
        f"accuracy: split 0, M = {row['M']}, batch {row['batch']}, {row['steps']} Adam steps "
        f"(lr {row['lr']}), {row['dtype']}, {row['threads']} threads; RMSE and NLPD in original units"
    )


def metrics(y, mean, var):
    """Test RMSE and mean negative log predictive density of ``y`` under ``N(mean, var)``."""
    rmse = float(np.sqrt(np.mean((y - mean) ** 2)))
    nlpd = float(np.mean(0.5 * (math.log(2 * math.pi) + np.log(var) + (y - mean) ** 2 / var)))
    return rmse, nlpd


def run(quick):
    """One row per dataset and implementation."""
    opts = settings(quick)
    rows = []
    for name in opts["datasets"]:
        problem = harness.regression_problem(name)
        X, y, scaler = problem["X_train"], problem["y_train"], problem["y_scaler"]
        Z = harness.inducing_inputs(X, opts["M"])
        for key in ORDER:
            start = time.perf_counter()
            runner = runners.build([key], X, y, Z, opts["batch"], lr=opts["lr"])[key]
            losses = [runner.step() for _ in range(opts["steps"])]
            seconds = time.perf_counter() - start
            mean, var = runner.predict(problem["X_test"])
            runner.close()
            rmse, nlpd = metrics(problem["y_test"], scaler.inverse_transform(mean), scaler.inverse_variance(var))
            rows.append({
                "suite": "accuracy", "dataset": name, "synthetic": problem["synthetic"], "num_data": len(X),
                "num_test": len(problem["y_test"]), "input_dim": X.shape[1], "implementation": runners.RUNNERS[key].name,
                "key": key, "M": opts["M"], "batch": opts["batch"], "steps": opts["steps"], "lr": opts["lr"],
                "dtype": "float32", "threads": harness.threads(), "rmse": rmse, "nlpd": nlpd, "seconds": seconds,
                "final_loss": losses[-1],
            })
    return rows
