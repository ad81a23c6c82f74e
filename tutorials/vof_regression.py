"""Tutorial: variational orthogonal features (Burt, Rasmussen & van der Wilk, 2020), Pyro or NumPyro.

Two regressions with ``Kuu = I`` (no Cholesky of ``Kuu``):

* (a) the paper's Fig. 2 setting: 80 points on [-3, 3], a Matérn-5/2 GP (lengthscale 0.2) plus
  noise of sd 0.03, M = 31 Fourier features on the frequency box [-a, a] trained with the
  collapsed Monte Carlo estimator (two randomised grids of T = 50 frequencies per step, ``a``
  learned). ``Kuf`` is never formed in training; prediction uses Gauss-Legendre quadrature. It
  prints the final (quadrature) ELBO beside the exact log marginal likelihood at the same
  hyperparameters, and the test RMSE of both.
* (b) 20,000 points of a smooth function, M = 200 Hermite features (closed-form ``Kuf`` for the
  squared-exponential kernel) with a diagonal ``S``, minibatches of 500, trained with the
  sampled-``u`` model/guide pair and ``TraceMeanField_ELBO``.

    python tutorials/vof_regression.py [--backend pyro|numpyro] [--quick] [--output outputs/vof_regression.png]
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
            import pyro
            import torch

            import pyro_sparsegp as lib
            from pyro_sparsegp import vof

            self.array = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64))
            self.mean_field = pyro.infer.TraceMeanField_ELBO
        else:
            import jax

            jax.config.update("jax_enable_x64", True)
            import jax.numpy as jnp
            import numpyro

            import numpyro_sparsegp as lib
            from numpyro_sparsegp import vof

            self.array = lambda a: jnp.asarray(np.asarray(a, dtype=np.float64))
            self.mean_field = numpyro.infer.TraceMeanField_ELBO
        self.lib, self.vof = lib, vof

    def reset(self):
        if self.name == "pyro":
            import pyro

            pyro.clear_param_store()

    def numpy(self, x):
        return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def matern52(x, z, lengthscale=0.2, variance=1.0):
    r = math.sqrt(5) * np.abs(x[:, None] - z[None, :]) / lengthscale
    return variance * (1 + r + r**2 / 3) * np.exp(-r)


def fig2_data(seed=0):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, 80))
    xt = np.linspace(-3, 3, 300)
    xa = np.concatenate([x, xt])
    f = np.linalg.cholesky(matern52(xa, xa) + 1e-8 * np.eye(len(xa))) @ rng.normal(size=len(xa))
    return x[:, None], f[:80] + 0.03 * rng.normal(size=80), xt[:, None], f[80:]


def exact_gp(x, y, xt, lengthscale, variance, noise):
    """Exact posterior mean and log marginal likelihood with the given hyperparameters."""
    K = matern52(x[:, 0], x[:, 0], lengthscale, variance) + noise * np.eye(len(x))
    L = np.linalg.cholesky(K)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y))
    lml = -0.5 * y @ alpha - np.log(np.diag(L)).sum() - 0.5 * len(y) * math.log(2 * math.pi)
    return matern52(xt[:, 0], x[:, 0], lengthscale, variance) @ alpha, lml


def fourier_fig2(b, quick):
    lib, vof = b.lib, b.vof
    X, y, Xt, ft = fig2_data()
    b.reset()
    kernel = lib.Matern52(lengthscale=b.array([0.2]), variance=1.0)
    gp = lib.SVGP(kernel, vof.FourierFeatures(31, b.array([8.0]), num_samples=50), diagonal=True)
    model = vof.VOFModel(gp, lib.Gaussian(variance=0.01))
    steps = 1500 if quick else 8000
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (b.array(X), b.array(y)), num_steps=steps, lr=0.01,
                     loss=vof.CollapsedELBO(), progress=False)
    seconds = time.perf_counter() - start
    p = {k: float(np.ravel(b.numpy(v))[0]) for k, v in result.params.items()
         if k.endswith(("lengthscale", "kernel.variance", "likelihood.variance", ".a"))}
    ls, var, noise, a = p["gp.kernel.lengthscale"], p["gp.kernel.variance"], p["likelihood.variance"], p["gp.features.a"]
    exact_elbo = elbo_at(b, model, X, y, result.params)
    mean, lml = exact_gp(X, y, Xt, ls, var, noise)
    pred = model.predict_f(b.array(Xt), params=result.params)
    vmean, vvar = b.numpy(pred[0]), b.numpy(pred[1])
    print(f"fourier M=31 T=50  ELBO {exact_elbo:.2f}  exact LML {lml:.2f}  (a = {a:.2f}, lengthscale {ls:.3f}, "
          f"noise sd {math.sqrt(noise):.3f}; {steps} steps, {seconds:.1f} s)")
    print(f"fourier M=31 T=50  RMSE {np.sqrt(np.mean((vmean - ft) ** 2)):.4f}")
    print(f"exact GP           RMSE {np.sqrt(np.mean((mean - ft) ** 2)):.4f}")
    return X, y, Xt, ft, vmean, vvar, mean


def elbo_at(b, model, X, y, params):
    """The deterministic (quadrature ``Kuf``) bound at ``params``."""
    exact = b.lib.GPModel(model.prior, model.likelihood)
    if b.name == "pyro":
        import pyro
        import torch

        with torch.no_grad(), pyro.poutine.substitute(data=params):
            return float(exact.elbo(b.array(X), b.array(y)))
    from numpyro import handlers

    with handlers.substitute(data=params):
        return float(exact.elbo(b.array(X), b.array(y)))


def hermite_large(b, quick):
    lib, vof = b.lib, b.vof
    rng = np.random.default_rng(1)
    n = 20_000
    X = rng.normal(size=(n, 1))
    y = np.sin(3 * X[:, 0]) + 0.3 * X[:, 0] ** 2 + 0.2 * rng.normal(size=n)
    Xt = np.linspace(-2.5, 2.5, 200)[:, None]
    ft = np.sin(3 * Xt[:, 0]) + 0.3 * Xt[:, 0] ** 2
    b.reset()
    kernel = lib.RBF(lengthscale=b.array([0.5]), variance=1.0)
    gp = lib.SVGP(kernel, vof.HermiteFeatures(200, b.array([1.0]), kernel=kernel), diagonal=True, name="hermite")
    model = vof.VOFModel(gp, lib.Gaussian(variance=0.1, name="hermite_likelihood"), num_data=n)
    steps = 400 if quick else 3000
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (b.array(X), b.array(y)), num_steps=steps, batch_size=500, lr=0.02,
                     loss=b.mean_field(), progress=False)
    seconds = time.perf_counter() - start
    pred = model.predict_y(b.array(Xt), params=result.params)
    mean = b.numpy(pred.mean)
    print(f"hermite M=200 diag RMSE {np.sqrt(np.mean((mean - ft) ** 2)):.4f}  ({steps} steps of 500, {seconds:.1f} s)")


def plot(X, y, Xt, ft, vmean, vvar, exact_mean, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    sd = np.sqrt(np.maximum(vvar, 0))
    ax.plot(X[:, 0], y, "k.", ms=4, label="data")
    ax.plot(Xt[:, 0], ft, "k--", lw=1, label="true f")
    ax.plot(Xt[:, 0], exact_mean, "C1", label="exact GP mean")
    ax.plot(Xt[:, 0], vmean, "C0", label="Fourier VOF mean (M = 31)")
    ax.fill_between(Xt[:, 0], vmean - 2 * sd, vmean + 2 * sd, color="C0", alpha=0.2, label="±2 sd of f")
    ax.legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    print(f"wrote {output}")


def main(backend="pyro", quick=False, output=None):
    b = Backend(backend)
    results = fourier_fig2(b, quick)
    plot(*results, pathlib.Path(output or f"outputs/vof_regression_{backend}.png"))
    hermite_large(b, quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["pyro", "numpyro"], default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    main(args.backend, args.quick, args.output)
