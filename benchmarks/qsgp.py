"""Suite ``qsgp``: quadruply stochastic GPs (Evans and Nair, 2020), two parts.

* ``speed``: median seconds per step of ``fit`` (float32, batch 500, both backends) for
  ``GPModel(QSGP(RBF, m, num_dense=10), Gaussian())`` with ``QuadruplyStochasticELBO(num_basis=1000,
  control_variates=500 rows)`` at growing ``m``, beside the exact-in-``m`` loss (``Trace_ELBO``)
  at the smallest ``m`` and our SVGP with 512 inducing points. The estimator's arithmetic does not
  grow with ``m``; the optimiser's pass over the q tables still does (``O(m)``: the tables are
  ordinary parameters, updated densely with zero gradients off the drawn rows).
* ``accuracy``: kin40k (split 0; a synthetic stand-in when the data are absent), standardised,
  Pyro: QSGP-0 (mean-field) and QSGP-10 on ``m`` random Fourier features of an ARD squared
  exponential, ``num_basis`` per draw, control variates on 500 support rows, AdaGrad (lr 0.1) for
  the q tables and Adam for the hyperparameters and noise; against our SVGP with 512 inducing
  points (Adam), all for the same number of steps at batch 500: test RMSE and NLPD (standardised
  units) and training seconds. The paper's Table 2 (m = 10^5, 10^5 steps on a GPU,
  hyperparameters frozen for the first 10^4) is the reference point; these runs are far shorter.
"""
import time

import numpy as np

from . import harness

PARTS = ("speed", "accuracy")
BATCH, NUM_DENSE, SUPPORT = 500, 10, 500


def settings(quick):
    if harness.tiny():
        return {"ms": (200, 400), "num_basis": 20, "repeats": 2, "block_seconds": 0.05, "warmup": 1, "svgp_M": 16,
                "accuracy_m": 200, "accuracy_num_basis": 20, "steps": 3, "support": 20, "batch": 50}
    if quick:
        return {"ms": (10_000, 100_000), "num_basis": 1000, "repeats": 3, "block_seconds": 0.3, "warmup": 2,
                "svgp_M": 512, "accuracy_m": 10_000, "accuracy_num_basis": 1000, "steps": 2000, "support": SUPPORT,
                "batch": BATCH}
    return {"ms": (10_000, 100_000, 1_000_000), "num_basis": 1000, "repeats": 5, "block_seconds": 1.0, "warmup": 2,
            "svgp_M": 512, "accuracy_m": 100_000, "accuracy_num_basis": 2000, "steps": 10_000, "support": SUPPORT,
            "batch": BATCH}


def run(quick, parts=PARTS):
    opts = settings(quick)
    rows = speed_rows(opts) if "speed" in parts else []
    if "accuracy" in parts:
        rows += accuracy_rows(opts)
    return rows


def tables(rows):
    out = []
    speed = [row for row in rows if row["part"] == "speed"]
    if speed:
        row = speed[0]
        out.append((f"qsgp speed: seconds per fit step, num_basis {row['num_basis']}, batch {row['batch']}, "
                    f"{row['dtype']}, {row['threads']} threads",
                    [("model", "model", "{}"), ("m", "m", "{}"), ("loss", "loss", "{}"),
                     ("Pyro", "seconds_pyro", "{:.4f} s"), ("NumPyro (jit)", "seconds_numpyro", "{:.4f} s")], speed))
    accuracy = [row for row in rows if row["part"] == "accuracy"]
    if accuracy:
        row = accuracy[0]
        out.append((f"qsgp accuracy: {row['dataset']}, Pyro, m = {row['m']} random Fourier features (ARD SE), "
                    f"num_basis {row['num_basis']}, control variates on {row['support']} rows, AdaGrad 0.1 (q) and Adam "
                    f"0.01, batch {row['batch']}, {row['steps']} steps, {row['dtype']}, {row['threads']} threads; "
                    "standardised target units",
                    [("model", "model", "{}"), ("RMSE", "rmse", "{:.4f}"), ("NLPD", "nlpd", "{:.4f}"),
                     ("seconds", "seconds", "{:.0f}")], accuracy))
    return out


# -- the models, built alike in both backends -------------------------------------------------------


def _lib(backend):
    if backend == "pyro":
        import torch

        import pyro_sparsegp as lib

        return lib, (lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)), torch.optim.Adagrad, {}
    import jax.numpy as jnp
    import numpyro

    import numpyro_sparsegp as lib

    return lib, (lambda a: jnp.asarray(np.asarray(a), dtype=jnp.float32)), numpyro.optim.Adagrad, {"momentum": 0.0}


def qsgp_fit(backend, X, y, m, num_dense, num_basis, support, batch, loss="quadruply stochastic", seed=0, **extra):
    """``(FitSteps, model)`` of a QSGP (ARD squared exponential, lengthscales 1, noise 0.1)."""
    lib, array, adagrad, momentum = _lib(backend)
    if backend == "pyro":
        import pyro

        pyro.clear_param_store()
    kernel = lib.RBF(lengthscale=array(np.ones(X.shape[1])), variance=array(1.0))
    model = lib.GPModel(lib.QSGP(kernel, m, X.shape[1], num_dense=num_dense, seed=seed),
                        lib.Gaussian(variance=array(0.1)), num_data=len(X))
    if loss == "quadruply stochastic":
        rows = np.random.default_rng(seed).choice(len(X), support, replace=False)
        objective = lib.QuadruplyStochasticELBO(num_basis=num_basis, control_variates=array(X[rows]))
        groups = [{"params": "gp.q_*", "optimizer": adagrad, "lr": 0.1, **momentum}]
    else:
        objective, groups = None, None
    steps = harness.FitSteps(lib.fit, model.model, model.guide, (array(X), array(y)), batch_size=batch, lr=0.01,
                             seed=seed, loss=objective, param_groups=groups, **extra)
    return steps, model


def svgp_fit(backend, X, y, M, batch, seed=0):
    lib, array, _, _ = _lib(backend)
    if backend == "pyro":
        import pyro

        pyro.clear_param_store()
    kernel = lib.RBF(lengthscale=array(np.ones(X.shape[1])), variance=array(1.0))
    model = lib.GPModel(lib.SVGP(kernel, array(harness.inducing_inputs(X, M, seed))), lib.Gaussian(variance=array(0.1)),
                        num_data=len(X))
    return harness.FitSteps(lib.fit, model.model, model.guide, (array(X), array(y)), batch_size=batch, lr=0.01,
                            seed=seed), model


# -- speed ---------------------------------------------------------------------------------------


def speed_rows(opts):
    problem = harness.regression_problem("kin40k")
    X, y = problem["X_train"], problem["y_train"]
    configs = [(f"QSGP-{NUM_DENSE}", m, "quadruply stochastic") for m in opts["ms"]]
    configs.append((f"QSGP-{NUM_DENSE}", opts["ms"][0], "Trace_ELBO (exact in m)"))
    configs.append((f"SVGP-{opts['svgp_M']}", opts["svgp_M"], "Trace_ELBO"))
    rows = []
    for label, m, loss in configs:
        seconds = {}
        for backend in ("pyro", "numpyro"):
            if label.startswith("SVGP"):
                steps, _ = svgp_fit(backend, X, y, m, opts["batch"])
            else:
                steps, _ = qsgp_fit(backend, X, y, m, NUM_DENSE, opts["num_basis"], opts["support"], opts["batch"],
                                    loss="quadruply stochastic" if loss == "quadruply stochastic" else None)
            blocks = harness.time_steps({backend: steps.step}, opts["repeats"], opts["block_seconds"], opts["warmup"])
            steps.close()
            seconds[backend] = harness.median(blocks[backend])
        rows.append({"suite": "qsgp", "part": "speed", "model": label, "m": m, "loss": loss,
                     "num_basis": opts["num_basis"], "batch": opts["batch"], "seconds_pyro": seconds["pyro"],
                     "seconds_numpyro": seconds["numpyro"], "synthetic": problem["synthetic"], "dtype": "float32",
                     "threads": harness.threads()})
    return rows


# -- accuracy ------------------------------------------------------------------------------------


def accuracy_rows(opts):
    problem = harness.regression_problem("kin40k")
    X, y, Xt, yt, scaler = (problem[k] for k in ("X_train", "y_train", "X_test", "y_test", "y_scaler"))
    yt_std = scaler.transform(yt)
    rows = []
    for label, num_dense in (("QSGP-0", 0), (f"QSGP-{NUM_DENSE}", NUM_DENSE), (f"SVGP-{opts['svgp_M']}", None)):
        start = time.perf_counter()
        if num_dense is None:
            steps, model = svgp_fit("pyro", X, y, opts["svgp_M"], opts["batch"])
        else:
            steps, model = qsgp_fit("pyro", X, y, opts["accuracy_m"], num_dense, opts["accuracy_num_basis"],
                                    opts["support"], opts["batch"])
        for _ in range(opts["steps"]):
            steps.step()
        steps.close()
        seconds = time.perf_counter() - start
        import torch

        with torch.no_grad():
            prediction = model.predict_y(torch.as_tensor(Xt, dtype=torch.float32), batch_size=1000)
        mean, var = (prediction.mean.double().numpy(), prediction.variance.double().numpy())
        rows.append({"suite": "qsgp", "part": "accuracy", "dataset": "kin40k", "synthetic": problem["synthetic"],
                     "model": label, "m": opts["accuracy_m"] if num_dense is not None else opts["svgp_M"],
                     "num_basis": opts["accuracy_num_basis"], "support": opts["support"], "steps": opts["steps"],
                     "seconds": seconds,
                     "rmse": float(np.sqrt(np.mean((mean - yt_std) ** 2))), "nlpd": harness.gaussian_nlpd(mean, var, yt_std),
                     "batch": opts["batch"], "dtype": "float32", "threads": harness.threads()})
    return rows
