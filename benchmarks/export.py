"""Suite ``export``: wall time of ``to_inference_data`` on a user's hierarchical Bernoulli model in
both backends, and the shape of the pointwise log-likelihood it returns.

The model (as ``docs/usage.md`` writes one): ``y_n ~ Bernoulli(sigmoid(f(x_n) + effect[g_n]))``
with ``f`` an SVGP (Matern-5/2, 16 inducing points), 30 group effects under a ``groups`` plate
with an ``AutoNormal`` guide, 3,000 points, and a data plate that subsamples 256 rows per step.
It is trained for 200 steps by ``fit`` (float64), then exported with 1,000 draws, either as it
was trained (``subsampling plate``: the export walks the full data) or with its plate told not to
subsample (``full plate``: the workaround the export needed before it walked the plate itself).
The time is the median of ``repeats`` exports; a failed export is reported with its error.
"""
import time

import numpy as np

from . import harness

COLUMNS = [
    ("backend", "backend", "{}"), ("model at export", "variant", "{}"), ("draws", "draws", "{}"),
    ("points", "points", "{}"), ("log_likelihood shape", "shape", "{}"), ("seconds", "seconds", "{:.2f}"),
    ("error", "error", "{}"),
]
GROUPS, INDUCING, BATCH = 30, 16, 256


def title(rows):
    return "export: to_inference_data of a hierarchical Bernoulli model (float64, median of repeats)"


def _ppl(backend):
    """(library, PPL, handlers, array constructor) of a backend."""
    if backend == "pyro":
        import pyro
        import pyro.infer.autoguide
        import torch

        import pyro_sparsegp

        torch.set_default_dtype(torch.float64)
        return pyro_sparsegp, pyro, pyro.poutine, torch.as_tensor
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.infer.autoguide
    from numpyro import handlers

    import numpyro_sparsegp

    jax.config.update("jax_enable_x64", True)
    return numpyro_sparsegp, numpyro, handlers, jnp.asarray


def problem(backend, num_data):
    """The data, model and guide of the module docstring (``subsample_size`` a model argument)."""
    lib, ppl, handlers, array = _ppl(backend)
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (num_data, 1))
    g = rng.integers(0, GROUPS, num_data)
    logits = np.sin(2 * X[:, 0]) + np.linspace(-1, 1, GROUPS)[g]
    y = (rng.uniform(size=num_data) < 1 / (1 + np.exp(-logits))).astype(float)
    gp = lib.SVGP(lib.Matern52(lengthscale=1.0), array(np.linspace(-3, 3, INDUCING)[:, None]), name="gp")
    D = ppl.distributions

    def model(X, g, y, subsample_size=BATCH):
        scale = ppl.sample("scale", D.HalfNormal(1.0))
        with ppl.plate("groups", GROUPS):
            effect = ppl.sample("effect", D.Normal(0.0, scale))
        data = ppl.plate("data", len(X), subsample_size=subsample_size)
        f = gp.model(X, data)
        with data as idx:
            ppl.sample("y", D.Bernoulli(logits=f + effect[..., g[idx]]), obs=y[idx])

    autoguide = ppl.infer.autoguide.AutoNormal(handlers.block(model, hide=list(gp.site_names)))

    def guide(X, g, y, subsample_size=BATCH):
        gp.guide(X, ppl.plate("data", len(X), subsample_size=subsample_size))
        autoguide(X, g, y, subsample_size)

    return lib, (array(X), array(g), array(y)), model, guide


def measure(backend, num_data, draws, steps, repeats):
    lib, data, model, guide = problem(backend, num_data)
    result = lib.fit(model, guide, data, num_steps=steps, lr=0.02, progress=False)
    rows = []
    for variant, kwargs in (("subsampling plate", {}), ("full plate", {"subsample_size": None})):
        row = {"suite": "export", "backend": backend, "variant": variant, "draws": draws, "points": num_data, "error": "",
               "threads": harness.threads()}
        try:
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                idata = lib.to_inference_data(model, guide, data, num_samples=draws, result=result, **kwargs)
                seconds.append(time.perf_counter() - start)
            row.update(seconds=float(np.median(seconds)), shape=tuple(idata.log_likelihood["y"].shape),
                       all_seconds=seconds)
        except Exception as error:  # an export that fails is a result of this suite
            row.update(seconds=float("nan"), shape="", error=f"{type(error).__name__}: {str(error)[:100]}")
        rows.append(row)
    return rows


def run(quick):
    num_data, draws, steps, repeats = (300, 40, 20, 1) if harness.tiny() else (
        (3000, 200, 100, 1) if quick else (3000, 1000, 200, 3))
    return [row for backend in ("pyro", "numpyro") for row in measure(backend, num_data, draws, steps, repeats)]
