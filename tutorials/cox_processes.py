"""Tutorial: log-Gaussian Cox processes for point patterns (Pyro or NumPyro).

Each pattern is fitted with ``CoxProcess(SVGP(...), window)`` and the default randomised
integration rule (fresh stratified nodes at every step):

* the 191 British coal-mining disasters 1851-1962 (1-D, ``offset=log(n / |W|)``): the posterior
  intensity with its 95% band shows the well-known drop in the rate around 1890 (from about 3 to
  about 1 per year); ``to_inference_data`` exports one log-likelihood term per event and
  ``az.loo`` runs on it;
* the redwood seedlings (2-D): the posterior intensity map beside the relative width of its 95%
  band (``plot_intensity``);
* covariate images (``simulate_covariate_pattern``: two images with known effects 0.6 and -0.4
  and a GP term): ``log lambda = b0 + b . c(x) + f(x)`` with a ``Covariates`` mean whose
  coefficients have a prior and are coupled with ``u`` in ``q``; the fitted effects with their
  standard deviations, and the intensity split into its covariate part and its GP part. A real
  pattern works the same way: ``load_image_pattern("gorillas")`` gives events, a polygon (pass
  ``Polygon(window)``) and images (a ``Raster``); see ``benchmarks/cox_gorillas.py``.

The data are read from ``--data-dir``, ``$SPARSEGP_DATA`` or ``../shared/data``; the plots go to
``outputs/``.

    python tutorials/cox_processes.py [--backend pyro|numpyro] [--quick] [--data-dir DIR] [--output-dir outputs]
"""
import argparse
import math
import os
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Backend:
    """The few backend-specific lines: arrays in and out, the library and the PPL's distributions."""

    def __init__(self, name):
        self.name = name
        if name == "pyro":
            import pyro
            import torch

            import pyro_sparsegp as lib

            self.lib, self._pyro, self._torch, self.dist = lib, pyro, torch, pyro.distributions
        else:
            import jax

            jax.config.update("jax_enable_x64", True)
            import numpyro.distributions as dist

            import numpyro_sparsegp as lib

            self.lib, self._jnp, self.dist = lib, jax.numpy, dist

    def array(self, a):
        a = np.asarray(a, dtype=np.float64)
        return self._torch.as_tensor(a) if self.name == "pyro" else self._jnp.asarray(a)

    def numpy(self, a):
        return a.detach().cpu().numpy() if self.name == "pyro" else np.asarray(a)

    def fit_cox(self, pattern, num_inducing, lengthscale, steps, name):
        """A Cox process on the pattern's window, trained by ``fit``; returns it and the FitResult."""
        lib, window = self.lib, pattern.window
        axes = [np.linspace(lo, hi, num_inducing) for lo, hi in window]
        Z = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=-1)
        kernel = lib.Matern52(lengthscale=self.array([lengthscale] * len(window)), variance=1.0)
        volume = float(np.prod(window[:, 1] - window[:, 0]))
        model = lib.CoxProcess(lib.SVGP(kernel, self.array(Z), name=name), window,
                               offset=math.log(len(pattern.events) / volume), name=f"{name}_events")
        return model, self.fit(model, pattern.events, steps)

    def fit(self, model, events, steps, lr_schedule=None):
        if self.name == "pyro":
            self._pyro.clear_param_store()
        return self.lib.fit(model.model, model.guide, (self.array(events),), num_steps=steps, lr=0.02,
                            lr_schedule=lr_schedule, progress=False)


def coal(backend, pattern, steps, output_dir, num_draws):
    import arviz as az
    import matplotlib.pyplot as plt

    model, result = backend.fit_cox(pattern, num_inducing=20, lengthscale=10.0, steps=steps, name="coal")
    (lo, hi), = pattern.window
    t = np.linspace(lo, hi, 400)
    pred = model.intensity(backend.array(t[:, None]), quantiles=(0.025, 0.975), params=result.params)
    mean, (low, high) = backend.numpy(pred.mean), backend.numpy(pred.quantiles)
    before, after = mean[(t > 1855) & (t < 1885)].mean(), mean[(t > 1895) & (t < 1945)].mean()
    print(f"coal: posterior mean rate {before:.2f}/year in 1855-1885, {after:.2f}/year in 1895-1945 "
          f"(ratio {before / after:.2f}); final ELBO {-result.losses[-1]:.1f}")

    idata = backend.lib.to_inference_data(model, data=(backend.array(pattern.events),), num_samples=num_draws,
                                          result=result)
    loo = az.loo(idata)
    elpd = loo.elpd if hasattr(loo, "elpd") else loo.elpd_loo  # ArviZ 1.x renamed it
    print(f"coal: elpd_loo {elpd:.1f} over {loo.n_data_points} events, "
          f"max Pareto k {float(loo.pareto_k.max()):.2f}")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.fill_between(t, low, high, alpha=0.3, label="95% band")
    ax.plot(t, mean, label="posterior mean intensity")
    ax.plot(pattern.events[:, 0], np.full(len(pattern.events), -0.15), "|k", ms=8, label="disasters")
    ax.set(xlabel="year", ylabel="disasters per year", title="Coal-mining disasters: Cox-process intensity")
    ax.legend(loc="upper right")
    fig.tight_layout()
    path = output_dir / f"cox_coal_{backend.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def redwood(backend, pattern, steps, output_dir):
    import matplotlib.pyplot as plt

    model, result = backend.fit_cox(pattern, num_inducing=6, lengthscale=0.25, steps=steps, name="redwood")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, stat in zip(axes, ("mean", "width")):
        model.plot_intensity(backend.array(pattern.events), stat=stat, ax=ax, params=result.params, resolution=60)
    mean = backend.numpy(model.intensity(backend.array(pattern.events), quantiles=None, params=result.params).mean)
    print(f"redwood: {len(pattern.events)} events, posterior mean intensity at them from {mean.min():.0f} to "
          f"{mean.max():.0f} per unit area; final ELBO {-result.losses[-1]:.1f}")
    fig.tight_layout()
    path = output_dir / f"cox_maps_{backend.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def covariates(backend, steps, output_dir):
    """``log lambda = b0 + b . c(x) + f(x)`` on a simulated pattern with known effects."""
    import matplotlib.pyplot as plt

    from sparsegp_common.data.datasets import simulate_covariate_pattern

    lib = backend.lib
    pattern = simulate_covariate_pattern(seed=4)  # two standardised images, a GP term (variance 0.1)
    prior = backend.dist.Normal(backend.array(0.0), backend.array(10.0))
    mean = lib.Covariates(pattern.raster, bias=math.log(len(pattern.events)), prior=prior)
    axis = np.linspace(0.1, 0.9, 5)
    Z = np.stack([g.ravel() for g in np.meshgrid(axis, axis)], axis=-1)
    gp = lib.SVGP(lib.Matern52(lengthscale=backend.array([0.3, 0.3]), variance=0.1), backend.array(Z),
                  mean_function=mean, name="cov")
    model = lib.CoxProcess(gp, pattern.window, name="cov_events")
    # the randomised rule's noise keeps q's correlations moving at a fixed rate: decay it
    result = backend.fit(model, pattern.events, steps, lr_schedule=lambda step: 0.05 ** (step / steps))
    loc = backend.numpy(result.params["cov.mean_function.coefficients_loc"])
    sd = np.sqrt((backend.numpy(result.params["cov.mean_function.coefficients_scale_tril"]) ** 2).sum(-1))
    effects = ", ".join(f"{name} {m:.2f} ± {s:.2f} (truth {t:.2f})"
                        for name, m, s, t in zip(pattern.raster.names, loc[1:], sd[1:], pattern.coefficients[1:]))
    print(f"covariates: {len(pattern.events)} events; effects per sd: {effects}")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, part in zip(axes, ("f", "mean", "gp")):
        model.plot_intensity(backend.array(pattern.events), part=part, ax=ax, params=result.params, resolution=60)
    fig.tight_layout()
    path = output_dir / f"cox_covariates_{backend.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(backend_name="pyro", quick=False, data_dir=None, output_dir="outputs"):
    import matplotlib

    matplotlib.use("Agg")
    from sparsegp_common.data.datasets import load_point_pattern

    data_dir = data_dir or os.environ.get("SPARSEGP_DATA") or ROOT.parent / "shared" / "data"
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    backend = Backend(backend_name)
    paths = [coal(backend, load_point_pattern("coal_disasters", data_dir), 400 if quick else 2000, output_dir,
                  200 if quick else 1000),
             redwood(backend, load_point_pattern("redwood", data_dir), 300 if quick else 1500, output_dir),
             covariates(backend, 600 if quick else 1500, output_dir)]
    print("plots:", ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("pyro", "numpyro"), default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer steps and draws (for CI)")
    parser.add_argument("--data-dir", default=None, help="folder holding point_patterns/")
    parser.add_argument("--output-dir", default="outputs")
    args = parser.parse_args()
    main(args.backend, args.quick, args.data_dir, args.output_dir)
