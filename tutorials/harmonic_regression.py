"""Tutorial: the harmonic kernel decomposition (Sun, Shi, Wilson & Grosse, ICML 2021), Pyro or NumPyro.

* (a) The even/odd split: 200 noisy points of ``f(x) = sin(2x) + 0.6 cos(1.5x)`` on [-3, 3].
  Under the negation ``x -> -x`` (T~ = 2) the kernel splits into two orthogonal kernels and ``f``
  into its even and odd parts, each with its own 8 inducing points and its own q block
  (``SVGP(kernel, HarmonicFeatures(Z, Negation()))``, HVGP 2 x 8). ``predict_f(...,
  part="components")`` gives the two posterior components: they recover ``0.6 cos(1.5x)`` and
  ``sin(2x)``, are exactly symmetric and antisymmetric, and sum to the fit of ``f``.
* (b) With ``--kin40k`` (the data in ``$SPARSEGP_DATA`` or ``../shared/data``): the paper's
  regression recipe, 3-way negation along the principal directions of the inputs (T = 8), a
  Matérn-3/2 kernel with one lengthscale from the median heuristic, against SVGPs with M and 2M
  inducing points, the same number of Adam steps each; test RMSE and NLPD (standardised targets)
  and the Nystrom trace errors (the paper's Eq. 24) that explain the ranking.

    python tutorials/harmonic_regression.py [--backend pyro|numpyro] [--quick] [--kin40k] [--output outputs/harmonic.png]
"""
import argparse
import math
import pathlib
import time

import numpy as np


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

    def numpy(self, x):
        return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def toy_data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(200, 1))
    return x, np.sin(2 * x[:, 0]) + 0.6 * np.cos(1.5 * x[:, 0]) + 0.2 * rng.normal(size=200)


def even_odd(b, quick):
    lib, harmonic = b.lib, b.lib.harmonic
    X, y = toy_data()
    Z = np.linspace(-2.8, 2.8, 8)[:, None]  # copied to both components
    gp = lib.SVGP(lib.Matern52(lengthscale=b.array([1.0])), harmonic.HarmonicFeatures(b.array(Z), harmonic.Negation()))
    model = lib.GPModel(gp, lib.Gaussian(variance=0.1))
    steps = 800 if quick else 3000
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (b.array(X), b.array(y)), num_steps=steps, lr=0.02, progress=False)
    seconds = time.perf_counter() - start
    grid = np.linspace(-3, 3, 201)[:, None]  # symmetric about 0: grid[::-1] = -grid
    mean, var = (b.numpy(a) for a in model.predict_f(b.array(grid), params=result.params))
    parts, parts_var = (b.numpy(a) for a in model.predict_f(b.array(grid), part="components", params=result.params))
    truth = {"even": 0.6 * np.cos(1.5 * grid[:, 0]), "odd": np.sin(2 * grid[:, 0])}
    print(f"HVGP 2x8 (negation)  {steps} steps, {seconds:.1f} s")
    print(f"f         RMSE {np.sqrt(np.mean((mean - truth['even'] - truth['odd']) ** 2)):.4f}")
    for t, name in enumerate(("even", "odd")):
        print(f"{name} part RMSE {np.sqrt(np.mean((parts[:, t] - truth[name]) ** 2)):.4f}")
    sign = np.array([1.0, -1.0])
    print(f"symmetry  max |g_t(-x) - (+-)g_t(x)| {np.abs(parts[::-1] - sign * parts).max():.2e}")
    print(f"sum       max |g_0 + g_1 - f| {np.abs(parts.sum(1) - mean).max():.2e}")
    return X, y, grid, mean, var, parts, parts_var, truth


def kin40k(b, quick, M):
    from sparsegp_common.data.datasets import load_uci

    lib, harmonic = b.lib, b.lib.harmonic
    X, y, Xt, yt = load_uci("kin40k", split=0)
    x_mean, x_sd, y_mean, y_sd = X.mean(0), X.std(0), y.mean(), y.std()
    X, Xt, y, yt = (X - x_mean) / x_sd, (Xt - x_mean) / x_sd, (y - y_mean) / y_sd, (yt - y_mean) / y_sd
    rng = np.random.default_rng(0)
    sub = X[rng.choice(len(X), 1000, replace=False)]
    lengthscale = float(np.median(np.linalg.norm(sub[:, None] - sub[None], axis=-1)[np.triu_indices(1000, 1)]))
    pca = harmonic.Reflections.pca(X, num_ways=3)  # T = 8
    steps = 300 if quick else 5000
    rows = {}
    for name, size, transformation in ((f"SVGP M={M}", M, None), (f"SVGP M={2 * M}", 2 * M, None),
                                       (f"HVGP 8x{M}", M, pca)):
        Z = b.array(X[rng.choice(len(X), size, replace=False)])
        kernel = lib.Matern32(lengthscale=b.array([lengthscale]))
        features = Z if transformation is None else harmonic.HarmonicFeatures(Z, transformation)
        # before training, at the median-heuristic lengthscale: the paper's way of choosing a transformation
        error = harmonic.trace_error(kernel, features if transformation is not None else lib.InducingPoints(Z),
                                     b.array(X[:2000])) / 2000
        model = lib.GPModel(lib.SVGP(kernel, features, name=f"gp{len(rows)}"),
                            lib.Gaussian(variance=0.1, name=f"noise{len(rows)}"), num_data=len(X))
        start = time.perf_counter()
        result = lib.fit(model.model, model.guide, (b.array(X), b.array(y)), num_steps=steps, batch_size=256,
                         lr=0.003 if not quick else 0.01, progress=False)
        seconds = time.perf_counter() - start
        pred = model.predict_y(b.array(Xt), params=result.params)
        mean, var = b.numpy(pred.mean), b.numpy(pred.variance)
        rmse = math.sqrt(np.mean((mean - yt) ** 2))
        nlpd = float(np.mean(0.5 * np.log(2 * np.pi * var) + (yt - mean) ** 2 / (2 * var)))
        rows[name] = (rmse, nlpd, error, seconds)
        print(f"kin40k {name:14s} RMSE {rmse:.4f}  NLPD {nlpd:.4f}  trace error / n before training {error:.4f}  "
              f"({steps} steps of 256, {seconds:.1f} s)")
    return rows


def plot(X, y, grid, mean, var, parts, parts_var, truth, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    g = grid[:, 0]
    panels = [("f = even + odd", mean, var, truth["even"] + truth["odd"]),
              ("even component g_0", parts[:, 0], parts_var[:, 0], truth["even"]),
              ("odd component g_1", parts[:, 1], parts_var[:, 1], truth["odd"])]
    for ax, (title, m, v, true) in zip(axes, panels):
        if title.startswith("f"):
            ax.plot(X[:, 0], y, "k.", ms=3, label="data")
        ax.plot(g, true, "k--", lw=1, label="truth")
        ax.plot(g, m, "C0", label="posterior mean")
        ax.fill_between(g, m - 2 * np.sqrt(v), m + 2 * np.sqrt(v), color="C0", alpha=0.2, label="±2 sd")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    print(f"wrote {output}")


def main(backend="pyro", quick=False, with_kin40k=False, output=None):
    b = Backend(backend)
    plot(*even_odd(b, quick), pathlib.Path(output or f"outputs/harmonic_{backend}.png"))
    if with_kin40k:
        kin40k(b, quick, M=32 if quick else 512)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["pyro", "numpyro"], default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    parser.add_argument("--kin40k", action="store_true", help="also compare on kin40k (needs the data)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    main(args.backend, args.quick, args.kin40k, args.output)
