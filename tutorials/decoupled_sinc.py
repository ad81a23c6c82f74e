"""Tutorial: decoupled mean and covariance bases (Cheng & Boots, 2017, Figure 1), Pyro or NumPyro.

500 noisy samples of a sinc function, fitted three ways with the same kernel and likelihood:

* (a) an SVGP with a shared basis of M = 10 inducing points,
* (b) a ``DecoupledGP`` with M_alpha = 100 mean points and M_beta = 10 covariance points,
* (c) an SVGP with M = 100.

(b) costs about as much as (a) per step (one 10 x 10 Cholesky; the mean basis enters linearly),
but its mean follows the function almost as well as (c); its variance keeps the overall shape
and stays conservative (it can never be smaller than with the richer covariance basis of (c)).
With ``--kin40k`` (and the data in ``$SPARSEGP_DATA`` or ``../shared/data``) the same comparison
runs on kin40k with M_alpha = 2048, M_beta = 128 against an SVGP with M = 128.

    python tutorials/decoupled_sinc.py [--backend pyro|numpyro] [--quick] [--kin40k] [--output outputs/decoupled_sinc.png]
"""
import argparse
import pathlib
import time

import numpy as np


def sinc_data(num_data=500, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-6, 6, size=(num_data, 1))
    y = np.sinc(X[:, 0]) + 0.1 * rng.normal(size=num_data)
    return X, y


class Backend:
    """The few calls that differ between Pyro and NumPyro."""

    def __init__(self, name):
        self.name = name
        if name == "pyro":
            import torch

            import pyro_sparsegp as lib

            self.array = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64))
        else:
            import jax

            jax.config.update("jax_enable_x64", True)
            import jax.numpy as jnp

            import numpyro_sparsegp as lib

            self.array = lambda a: jnp.asarray(np.asarray(a, dtype=np.float64))
        self.lib = lib

    def reset(self):
        if self.name == "pyro":
            import pyro

            pyro.clear_param_store()


def fit_model(backend, prior, X, y, steps, batch_size=None, lr=0.03):
    """Train ``GPModel(prior, Gaussian)`` with Adam and the paper's step-size decay."""
    lib = backend.lib
    model = lib.GPModel(prior, lib.Gaussian(variance=float(np.var(y)) / 10), num_data=len(X))
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (backend.array(X), backend.array(y)), num_steps=steps,
                     batch_size=batch_size, lr=lr, lr_schedule=lambda t: 1.0 / (1.0 + 0.1 * t**0.5), progress=False)
    seconds = time.perf_counter() - start
    return model, result, seconds


def evaluate(backend, model, result, X, y):
    """Test RMSE, mean negative log predictive density, and the predictive moments."""
    pred = model.predict_y(backend.array(X), params=result.params)
    mean, var = np.asarray(pred.mean, dtype=float), np.asarray(pred.variance, dtype=float)
    nlpd = 0.5 * np.mean(np.log(2 * np.pi * var) + (y - mean) ** 2 / var)
    return float(np.sqrt(np.mean((y - mean) ** 2))), float(nlpd), mean, var


def sinc(backend, quick):
    lib = backend.lib
    X, y = sinc_data()
    Xt = np.linspace(-6, 6, 400)[:, None]
    yt = np.sinc(Xt[:, 0])
    steps = 400 if quick else 2000
    perm = np.random.default_rng(1).permutation(len(X))
    Z100, Z10 = X[perm[:100]], X[perm[:10]]  # the covariance points start at the first mean points (A.2)
    rows = []
    # step sizes picked per method from {0.1, 0.03} as in the paper (Adam on the coefficients
    # a of a large, correlated mean basis needs the larger one)
    for label, lr, make in (
        ("shared M=10", 0.03, lambda: lib.SVGP(lib.RBF(lengthscale=backend.array([1.0])), backend.array(Z10))),
        ("decoupled M_alpha=100, M_beta=10", 0.1,
         lambda: lib.DecoupledGP(lib.RBF(lengthscale=backend.array([1.0])), backend.array(Z100), backend.array(Z10))),
        ("shared M=100", 0.03, lambda: lib.SVGP(lib.RBF(lengthscale=backend.array([1.0])), backend.array(Z100))),
    ):
        backend.reset()
        model, result, seconds = fit_model(backend, make(), X, y, steps, lr=lr)
        rmse, nlpd, mean, var = evaluate(backend, model, result, Xt, yt)
        rows.append((label, rmse, nlpd, mean, var, seconds))
        print(f"{label:34s} RMSE {rmse:.4f}  NLPD {nlpd:.3f}  ({seconds:.1f} s, {steps} steps)")
    return X, y, Xt, yt, rows


def kin40k(backend, quick):
    from sparsegp_common.data.datasets import Standardizer, load_uci

    lib = backend.lib
    X, y, Xt, yt = load_uci("kin40k", split=0)
    xs, ys = Standardizer.fit(X), Standardizer.fit(y)
    X, Xt, y, yt = xs.transform(X), xs.transform(Xt), ys.transform(y), ys.transform(yt)
    rng = np.random.default_rng(0)
    Ma, Mb = (512, 64) if quick else (2048, 128)
    Za = X[rng.choice(len(X), Ma, replace=False)]
    steps = 200 if quick else 2000
    for label, make in (
        (f"SVGP M={Mb}", lambda: lib.SVGP(lib.RBF(lengthscale=backend.array(np.ones(8))), backend.array(Za[:Mb]))),
        (f"decoupled M_alpha={Ma}, M_beta={Mb}",
         lambda: lib.DecoupledGP(lib.RBF(lengthscale=backend.array(np.ones(8))), backend.array(Za), backend.array(Za[:Mb]))),
    ):
        backend.reset()
        model, result, seconds = fit_model(backend, make(), X, y, steps, batch_size=1024, lr=0.01)
        rmse, nlpd, _, _ = evaluate(backend, model, result, Xt, yt)
        print(f"kin40k {label:30s} RMSE {rmse:.4f}  NLPD {nlpd:.3f}  ({seconds:.1f} s, {steps} steps)")


def plot(X, y, Xt, yt, rows, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, (label, rmse, nlpd, mean, var, _) in zip(axes, rows):
        sd = np.sqrt(var)
        ax.plot(X[:, 0], y, ".", ms=2, color="0.6", label="data")
        ax.plot(Xt[:, 0], yt, "k--", lw=1, label="sinc")
        ax.plot(Xt[:, 0], mean, "C0", label="predictive mean")
        ax.fill_between(Xt[:, 0], mean - 2 * sd, mean + 2 * sd, color="C0", alpha=0.2, label="±2 sd of y")
        ax.set_title(f"{label}\nRMSE {rmse:.3f}, NLPD {nlpd:.2f}")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    print(f"wrote {output}")


def main(backend="pyro", quick=False, with_kin40k=False, output=None):
    b = Backend(backend)
    X, y, Xt, yt, rows = sinc(b, quick)
    plot(X, y, Xt, yt, rows, pathlib.Path(output or f"outputs/decoupled_sinc_{backend}.png"))
    if with_kin40k:
        kin40k(b, quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["pyro", "numpyro"], default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    parser.add_argument("--kin40k", action="store_true", help="also compare on kin40k (needs the data)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    main(args.backend, args.quick, args.kin40k, args.output)
