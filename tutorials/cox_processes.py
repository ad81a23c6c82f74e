"""Tutorial: log-Gaussian Cox processes for point patterns (Pyro or NumPyro).

Three classic patterns, each fitted with ``CoxProcess(SVGP(...), window, offset=log(n / |W|))``:

* the 191 British coal-mining disasters 1851-1962 (1-D): the posterior intensity with its 95%
  band shows the well-known drop in the rate around 1890 (from about 3 to about 1 per year);
  ``to_inference_data`` exports one log-likelihood term per event and ``az.loo`` runs on it;
* the redwood seedlings and the Japanese pines (2-D): posterior intensity maps beside the
  relative width of their 95% bands.

The integral over the window is a Gauss-Legendre rule (64 nodes in 1-D, 32 x 32 in 2-D). The
data are read from ``--data-dir``, ``$SPARSEGP_DATA`` or ``../shared/data``; the plots go to
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
    """The few backend-specific lines: arrays in and out, the library."""

    def __init__(self, name):
        self.name = name
        if name == "pyro":
            import pyro
            import torch

            import pyro_sparsegp as lib

            self.lib, self._pyro, self._torch = lib, pyro, torch
        else:
            import jax

            jax.config.update("jax_enable_x64", True)
            import numpyro_sparsegp as lib

            self.lib, self._jnp = lib, jax.numpy

    def array(self, a):
        a = np.asarray(a, dtype=np.float64)
        return self._torch.as_tensor(a) if self.name == "pyro" else self._jnp.asarray(a)

    def numpy(self, a):
        return a.detach().cpu().numpy() if self.name == "pyro" else np.asarray(a)

    def fit_cox(self, pattern, num_inducing, lengthscale, steps, name):
        """A Cox process on the pattern's window, trained by ``fit``; returns it and the FitResult."""
        lib, window = self.lib, pattern.window
        if self.name == "pyro":
            self._pyro.clear_param_store()
        axes = [np.linspace(lo, hi, num_inducing) for lo, hi in window]
        Z = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=-1)
        kernel = lib.Matern52(lengthscale=self.array([lengthscale] * len(window)), variance=1.0)
        volume = float(np.prod(window[:, 1] - window[:, 0]))
        model = lib.CoxProcess(lib.SVGP(kernel, self.array(Z), name=name), window,
                               offset=math.log(len(pattern.events) / volume), name=f"{name}_events")
        result = lib.fit(model.model, model.guide, (self.array(pattern.events),), num_steps=steps, lr=0.02,
                         progress=False)
        return model, result


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


def maps(backend, patterns, steps, output_dir):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(patterns), 2, figsize=(9, 4.2 * len(patterns)), squeeze=False)
    for row, (name, pattern) in zip(axes, patterns.items()):
        model, result = backend.fit_cox(pattern, num_inducing=6, lengthscale=0.25, steps=steps, name=name)
        (x0, x1), (y0, y1) = pattern.window
        gx, gy = np.meshgrid(np.linspace(x0, x1, 60), np.linspace(y0, y1, 60))
        grid = np.stack([gx.ravel(), gy.ravel()], axis=-1)
        pred = model.intensity(backend.array(grid), quantiles=(0.025, 0.975), params=result.params)
        mean, (low, high) = backend.numpy(pred.mean), backend.numpy(pred.quantiles)
        print(f"{name}: {len(pattern.events)} events, intensity from {mean.min():.0f} to {mean.max():.0f} per unit area "
              f"(mean {mean.mean():.0f}); final ELBO {-result.losses[-1]:.1f}")
        for ax, values, title in ((row[0], mean, "posterior mean intensity"),
                                  (row[1], (high - low) / mean, "95% band width / mean")):
            image = ax.pcolormesh(gx, gy, values.reshape(gx.shape), shading="auto", cmap="viridis")
            ax.plot(*pattern.events.T, ".", color="white", ms=4, mec="black", mew=0.4)
            ax.set(title=f"{name}: {title}", aspect="equal")
            fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    path = output_dir / f"cox_maps_{backend.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(backend_name="pyro", quick=False, data_dir=None, output_dir="outputs"):
    import matplotlib

    matplotlib.use("Agg")
    from sparsegp_common.datasets import load_point_pattern

    data_dir = data_dir or os.environ.get("SPARSEGP_DATA") or ROOT.parent / "shared" / "data"
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    backend = Backend(backend_name)
    patterns = {name: load_point_pattern(name, data_dir) for name in ("coal_disasters", "redwood", "japanesepines")}
    paths = [coal(backend, patterns.pop("coal_disasters"), 400 if quick else 2000, output_dir, 200 if quick else 1000)]
    paths.append(maps(backend, patterns, 300 if quick else 1500, output_dir))
    print("plots:", ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("pyro", "numpyro"), default="pyro")
    parser.add_argument("--quick", action="store_true", help="fewer steps and draws (for CI)")
    parser.add_argument("--data-dir", default=None, help="folder holding point_patterns/")
    parser.add_argument("--output-dir", default="outputs")
    args = parser.parse_args()
    main(args.backend, args.quick, args.data_dir, args.output_dir)
