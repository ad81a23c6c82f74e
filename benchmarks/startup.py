"""Suite ``startup``: a NumPyro user's wait for the first step and for the ArviZ export.

The model is ``docs/usage.md``'s NumPyro example (section c): counts with a GP trend and group
effects, ``y_n ~ Poisson(exp(f(x_n) + effect[g_n]))``, ``f`` an SVGP component (Matern-5/2, 16
inducing points), six group effects and their scale under an ``AutoNormal``, 3,000 points and a
data plate that subsamples 256 rows, float32. Each measurement runs in a fresh process (JAX's
compilation caches empty, as for a user starting a script): the seconds from building the SVGP
component to the end of ``fit``'s first step (the component's construction, ``SVI.init`` and the
compilation of the step), then, after training, the seconds of ``to_inference_data`` with 400
draws (ArviZ imported before). The same model without the GP (``f = 0``) runs beside it; the
difference is the library's share. A last row times a ``GPModel`` (the same SVGP component, a
Poisson likelihood on ``exp(f)``, ``fit`` with batches of 256): the library's own model and guide,
no autoguide. Figures are medians over fresh processes.
"""
import json
import subprocess
import sys
import time

import numpy as np

from . import harness

COLUMNS = [
    ("model", "variant", "{}"), ("seconds to the first step", "first_step", "{:.2f}"),
    ("seconds of the export", "export", "{:.2f}"), ("draws", "draws", "{}"), ("points", "points", "{}"),
    ("processes", "repeats", "{}"),
]
VARIANTS = ("with the SVGP component", "without it (f = 0)", "a GPModel (SVGP, no autoguide)")


def title(rows):
    return (f"startup: docs/usage.md's NumPyro example, fresh processes, {rows[0]['threads']} threads, "
            "medians (the third row: the difference of the first two, the library's share)")


def measure(variant, num_data, num_steps, draws):
    """One fresh process's seconds to the first step and of the export (run in the child) of
    ``VARIANTS[variant]``."""
    import arviz  # noqa: F401 (imported before the export is timed, as a user's notebook has it)
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro import handlers
    from numpyro.infer.autoguide import AutoNormal

    import numpyro_sparsegp as nsg

    rng = np.random.default_rng(0)
    num_groups = 6
    x = rng.uniform(-3, 3, (num_data, 1)).astype(np.float32)
    g = rng.integers(0, num_groups, num_data)
    y = rng.poisson(np.exp(0.3 + np.sin(2 * x[:, 0]) + np.linspace(-0.8, 0.8, num_groups)[g])).astype(np.float32)
    x, g, y = jnp.asarray(x), jnp.asarray(g), jnp.asarray(y)
    jax.block_until_ready(y)
    start = time.perf_counter()  # building the component is part of the wait
    with_gp = variant != 1
    gp = nsg.SVGP(nsg.Matern52(lengthscale=1.0), jnp.linspace(-3, 3, 16)[:, None], name="gp") if with_gp else None
    if variant == 2:
        gp_model = nsg.GPModel(gp, nsg.Poisson(), num_data=num_data)
        return _timed(start, gp_model.model, gp_model.guide, (x, y), num_steps, draws, 256,
                      lambda result: nsg.to_inference_data(gp_model, data=(x, y), num_samples=draws, result=result))

    def model(x, g, y):
        data = numpyro.plate("data", len(x), subsample_size=256)
        f = gp.model(x, data) if with_gp else 0.0
        scale = numpyro.sample("scale", dist.HalfNormal(1.0))
        with numpyro.plate("groups", num_groups):
            effect = numpyro.sample("effect", dist.Normal(0.0, scale))
        with data as idx:
            numpyro.sample("y", dist.Poisson(jnp.exp(f + effect[..., g[idx]])), obs=y[idx])

    autoguide = AutoNormal(handlers.block(model, hide=list(gp.site_names) if with_gp else []))

    def guide(x, g, y):
        data = numpyro.plate("data", len(x), subsample_size=256)
        if with_gp:
            gp.guide(x, data)
        autoguide(x, g, y)

    return _timed(start, model, guide, (x, g, y), num_steps, draws, None,
                  lambda result: nsg.to_inference_data(model, guide, (x, g, y), num_samples=draws, result=result))


def _timed(start, model, guide, data, num_steps, draws, batch_size, export):
    import numpyro_sparsegp as nsg

    running = nsg.fit.steps(model, guide, data, num_steps=num_steps, lr=0.02, batch_size=batch_size, progress=False)
    next(running)
    first_step = time.perf_counter() - start
    try:
        while True:
            next(running)
    except StopIteration as end:
        result = end.value
    start = time.perf_counter()
    export(result)
    return {"first_step": first_step, "export": time.perf_counter() - start}


def run(quick):
    num_data, num_steps, draws, repeats = (300, 2, 20, 1) if harness.tiny() else (
        (3000, 50, 400, 1) if quick else (3000, 200, 400, 3))
    rows = []
    for index, variant in enumerate(VARIANTS):
        args = json.dumps([index, num_data, num_steps, draws])
        code = f"import json; from benchmarks.startup import measure; print(json.dumps(measure(*json.loads({args!r}))))"
        runs = [json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                          cwd=harness.REPO).stdout.strip().splitlines()[-1]) for _ in range(repeats)]
        rows.append({"suite": "startup", "variant": variant, "points": num_data, "draws": draws, "repeats": repeats,
                     "threads": harness.threads(), "runs": runs,
                     **{key: float(np.median([r[key] for r in runs])) for key in ("first_step", "export")}})
    rows.insert(2, {**rows[0], "variant": "the library's share", "runs": None,
                    **{key: rows[0][key] - rows[1][key] for key in ("first_step", "export")}})
    return rows
