"""Suite ``cox``: held-out predictive log-likelihood and wall time of Cox-process fits (Pyro backend)
with the continuous likelihood (Gauss-Legendre quadrature; randomised stratified Monte Carlo)
against the binned likelihood at several grid sizes, and the recovery error of a known intensity.

Data: coal-mining disasters (1-D, 191 events) and redwood seedlings (2-D, 62 events), each split
by independent 80/20 thinning (fixed seed): the training events are a Poisson process of
intensity ``0.8 lambda`` and the test events one of ``0.2 lambda``. Each fit is
``CoxProcess(SVGP(Matern52, Z), window, integration, offset=log(n_train / |W|))`` trained by
``fit`` (Adam, lr 0.02, float64). The held-out score, per test event, is the expected
log-likelihood of the test pattern under ``q`` with the intensity scaled by 0.2 / 0.8,
``[sum_j E_q log lambda(x_j) - int_W E_q lambda] / n_test`` (a lower bound of the log predictive
density), evaluated for every method with the same fine Gauss-Legendre rule (256 nodes in 1-D,
64 x 64 in 2-D). ``simulated``: events from ``lambda(x) = exp(1 + 1.2 sin(x / 1.6))`` on [0, 10];
the recovery error is ``int |E_q lambda - lambda| / int lambda``. ``covariates``: the simulated
pattern of ``sparsegp_common.data.datasets.simulate_covariate_pattern`` (two covariate images, a GP term
of variance 0.1 and lengthscale 0.25, about 1,100 events, split 80/20 the same way), fitted with a
``Covariates`` mean (prior N(0, 10^2) on the coefficients; lr decayed 20-fold over the run) by the
default randomised rule, a fixed
32 x 32 Gauss-Legendre rule and the images' 40 x 40 pixel rule; the coefficients column gives the
covariates' fitted effects with their ``q`` standard deviations. ``gorillas``: a real pattern
with covariate images, in its own table (see :mod:`benchmarks.cox_gorillas`).

``simulate``: seconds and peak memory per pattern of ``CoxProcess.simulate`` in both backends, on
the shape of issue 31 (a 10 x 5 window, two 100 x 50 covariate images, about 2,000 events; see
:func:`simulate_problem`), each backend in a child process (``python -m benchmarks.cox simulate
BACKEND``, see :func:`main`) so that its peak resident memory is its own: the growth of the
resident set over the calls to ``simulate`` (its high-water mark reset through
``/proc/self/clear_refs`` first). Quick mode: Pyro only, half the window's sides (about 500 events).
"""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from . import cox_gorillas, harness

COLUMNS = [
    ("data", "dataset", "{}"), ("likelihood", "method", "{}"), ("points / cells", "points", "{}"),
    ("steps", "steps", "{}"), ("held-out log-lik / event", "heldout", "{:.3f}"),
    ("recovery error", "recovery", "{:.3f}"), ("coefficients (truth 0.6, -0.4)", "coefficients", "{}"),
    ("fit seconds", "seconds", "{:.1f}"),
]


def tables(rows):
    """``[(title, columns, rows)]``: the likelihoods and rules, the real ``gorillas`` pattern, then
    the cost of ``simulate``."""
    main = [r for r in rows if r.get("table") not in ("gorillas", "simulate")]
    gorillas = [r for r in rows if r.get("table") == "gorillas"]
    simulate = [r for r in rows if r.get("table") == "simulate"]
    title = "cox: Cox-process likelihoods, held-out log-likelihood (80/20 thinning) and wall time (Pyro, float64)"
    return ([(title, COLUMNS, main)] + ([(cox_gorillas.TITLE, cox_gorillas.COLUMNS, gorillas)] if gorillas else [])
            + ([(SIMULATE_TITLE, SIMULATE_COLUMNS, simulate)] if simulate else []))


def methods(dim, quick):
    from sparsegp_common.objectives import windows

    n = 64 if dim == 1 else 32
    grids = (16, 64, 256) if dim == 1 else (8, 16, 32)
    rows = [("quadrature", n ** dim, windows.GaussLegendre(n)), ("stratified MC", n ** dim, windows.StratifiedMC(n))]
    rows += [("binned", g ** dim, windows.Binned(g)) for g in (grids[1:] if quick else grids)]
    return rows


def fit(events, window, rule, steps, lengthscale, num_inducing):
    import pyro
    import torch

    import pyro_sparsegp as psg

    pyro.clear_param_store()
    axes = [np.linspace(lo, hi, num_inducing) for lo, hi in window]
    Z = torch.as_tensor(np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], -1))
    kernel = psg.Matern52(lengthscale=torch.full((len(window),), float(lengthscale), dtype=torch.float64))
    offset = math.log(len(events) / float(np.prod(window[:, 1] - window[:, 0])))
    model = psg.CoxProcess(psg.SVGP(kernel, Z), window, integration=rule, offset=offset)
    start = time.perf_counter()
    result = psg.fit(model.model, model.guide, (torch.as_tensor(events),), num_steps=steps, lr=0.02, progress=False)
    return model, result, time.perf_counter() - start


def fit_covariates(pattern, events, rule, steps):
    """The covariate process of the ``covariates`` rows (Pyro, float64); returns the model, the
    FitResult and the seconds."""
    import pyro
    import pyro.distributions as dist
    import torch

    import pyro_sparsegp as psg

    pyro.clear_param_store()
    axis = np.linspace(0.1, 0.9, 5)
    Z = torch.as_tensor(np.stack([g.ravel() for g in np.meshgrid(axis, axis)], -1))
    prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(10.0, dtype=torch.float64))
    mean = psg.Covariates(pattern.raster, bias=math.log(len(events)), prior=prior)
    kernel = psg.Matern52(lengthscale=torch.full((2,), 0.3, dtype=torch.float64), variance=0.1)
    model = psg.CoxProcess(psg.SVGP(kernel, Z, mean_function=mean), pattern.window, integration=rule)
    start = time.perf_counter()
    result = psg.fit(model.model, model.guide, (torch.as_tensor(events),), num_steps=steps, lr=0.02,
                     lr_schedule=lambda step: 0.05 ** (step / steps), progress=False)
    return model, result, time.perf_counter() - start


def covariate_rows(steps):
    from sparsegp_common.data.datasets import simulate_covariate_pattern
    from sparsegp_common.objectives import windows

    pattern = simulate_covariate_pattern()
    keep = np.random.default_rng(0).uniform(size=len(pattern.events)) < 0.8
    train, test = pattern.events[keep], pattern.events[~keep]
    rows = []
    for method, points, rule in (("stratified MC (default)", 32**2, None), ("quadrature", 32**2, windows.GaussLegendre(32)),
                                 ("pixels", 40**2, pattern.raster.rule())):
        model, result, seconds = fit_covariates(pattern, train, rule, steps)
        loc = result.params["gp.mean_function.coefficients_loc"].numpy()
        sd = np.sqrt((result.params["gp.mean_function.coefficients_scale_tril"].numpy() ** 2).sum(-1))
        rows.append({"suite": "cox", "dataset": "covariates", "method": method, "points": points, "steps": steps,
                     "num_train": int(keep.sum()), "num_test": int((~keep).sum()), "seconds": seconds,
                     "heldout": heldout(model, result, test, pattern.window, math.log(0.2 / 0.8)),
                     "coefficients": ", ".join(f"{m:.3f} ± {s:.3f}" for m, s in zip(loc[1:], sd[1:])),
                     "coefficient_z": ((loc - pattern.coefficients) / sd)[1:].tolist()})
    return rows


def heldout(model, result, test, window, log_scale):
    """Expected test log-likelihood per event with the intensity scaled by ``exp(log_scale)``."""
    import torch

    from sparsegp_common.objectives import windows

    rule = windows.GaussLegendre(256 if len(window) == 1 else 64).layout(windows.Rectangle(window))
    at = lambda X: model.prior.predict_f(torch.as_tensor(X), params=result.params)
    m_test, _ = at(test)
    m, v = at(rule.points)
    log_lam = m_test.numpy() + model.offset + log_scale
    integral = rule.weights @ np.exp(m.numpy() + v.numpy() / 2 + model.offset + log_scale)
    return (log_lam.sum() - integral) / len(test)


def recovery_error(model, result):
    import torch

    from sparsegp_common.objectives import windows

    rule = windows.GaussLegendre(256).layout(windows.Interval(0.0, 10.0))
    mean = model.intensity(torch.as_tensor(rule.points), quantiles=None, params=result.params).mean.numpy()
    truth = np.exp(1.0 + 1.2 * np.sin(rule.points[:, 0] / 1.6))
    return float(rule.weights @ np.abs(mean - truth) / (rule.weights @ truth))


def run(quick):
    from sparsegp_common.data.datasets import load_point_pattern

    steps = 60 if harness.tiny() else (400 if quick else 2000)
    rows = []
    for name, lengthscale, num_inducing in (("coal_disasters", 10.0, 20), ("redwood", 0.25, 6)):
        if not (harness.data_dir() / "point_patterns").is_dir():
            break
        pattern = load_point_pattern(name, harness.data_dir())
        keep = np.random.default_rng(0).uniform(size=len(pattern.events)) < 0.8
        train, test = pattern.events[keep], pattern.events[~keep]
        for method, points, rule in methods(len(pattern.window), quick):
            model, result, seconds = fit(train, pattern.window, rule, steps, lengthscale, num_inducing)
            rows.append({"suite": "cox", "dataset": name, "method": method, "points": points, "steps": steps,
                         "num_train": int(keep.sum()), "num_test": int((~keep).sum()), "seconds": seconds,
                         "heldout": heldout(model, result, test, pattern.window, math.log(0.2 / 0.8))})
    rng = np.random.default_rng(7)  # the simulated-intensity recovery (tests/test_cox.py)
    candidates = rng.uniform(0, 10, rng.poisson(math.exp(2.2) * 10))
    events = np.sort(candidates[np.log(rng.uniform(size=len(candidates))) < 1 + 1.2 * np.sin(candidates / 1.6) - 2.2])
    window = np.array([[0.0, 10.0]])
    for method, points, rule in methods(1, quick):
        model, result, seconds = fit(events[:, None], window, rule, steps, 1.5, 12)
        rows.append({"suite": "cox", "dataset": "simulated", "method": method, "points": points, "steps": steps,
                     "num_train": len(events), "seconds": seconds, "recovery": recovery_error(model, result)})
    name = "cox_gorillas_quick.png" if quick else "cox_gorillas.png"
    rows += covariate_rows(steps) + cox_gorillas.rows(steps, harness.REPO / "outputs" / "benchmarks" / name)
    return rows + simulate_rows(quick)


# ---------------------------------------------------------------- simulate: cost per pattern

SIMULATE_TITLE = ("cox simulate: seconds and peak memory per posterior pattern (10 x 5 window, 100 x 50 covariate "
                  "images, float64)")
SIMULATE_COLUMNS = [
    ("backend", "backend", "{}"), ("window", "window", "{}"), ("events", "num_events", "{}"),
    ("fit steps", "steps", "{}"), ("patterns", "patterns", "{}"), ("candidates / pattern", "candidates", "{:.0f}"),
    ("mean count", "mean_count", "{:.0f}"), ("int E_q lambda", "expected", "{:.0f}"),
    ("s / pattern (first)", "first_seconds", "{:.2f}"), ("s / pattern (others)", "seconds", "{:.2f}"),
    ("peak MB", "peak_mb", "{:.0f}"),
]


def simulate_problem(size=1.0, seed=0):
    """Issue 31's shape: a ``10 size x 5 size`` window with two standardised covariate images of
    ``100 size x 50 size`` pixels (a wave and a slope), ``log lambda = log 40 + 0.3 wave - 0.2 slope
    + g`` with ``g`` a squared-exponential GP draw (variance 0.1, lengthscale 1; 300 random Fourier
    features), simulated by thinning: about ``2,000 size^2`` events. Returns ``(raster, events
    (n, 2), window (2, 2))``."""
    from sparsegp_common.data.raster import Raster

    rng = np.random.default_rng(seed)
    window = np.array([[0.0, 10.0 * size], [0.0, 5.0 * size]])
    width, height = round(100 * size), round(50 * size)
    x = (np.arange(width) + 0.5) / width * window[0, 1]
    y = (np.arange(height) + 0.5) / height * window[1, 1]
    gx, gy = np.meshgrid(x, y, indexing="xy")  # rows run up in y
    images = np.stack([np.sin(2 * np.pi * gx / 5) * np.cos(np.pi * gy / 5), (gx / 10 - 0.3) ** 2 + gy / 5])
    raster = Raster(images, window, standardize=True, names=("wave", "slope"))
    omega, phase = rng.normal(size=(300, 2)), rng.uniform(0, 2 * np.pi, 300)
    weights = rng.normal(size=300) * np.sqrt(2 * 0.1 / 300)

    def log_intensity(X):
        return math.log(40.0) + raster.evaluate(X) @ np.array([0.3, -0.2]) + np.cos(X @ omega.T + phase) @ weights

    low, sides = window[:, 0], window[:, 1] - window[:, 0]
    bound = np.exp(log_intensity(low + rng.uniform(size=(20000, 2)) * sides).max() + 0.5)
    candidates = low + rng.uniform(size=(rng.poisson(bound * np.prod(sides)), 2)) * sides
    keep = rng.uniform(size=len(candidates)) < np.exp(log_intensity(candidates)) / bound
    return raster, candidates[keep], window


def simulate_cost(backend, size=1.0, steps=300, patterns=3, simulate_kwargs=None):
    """One row of the ``simulate`` table, measured in this process: the covariate model of
    :func:`simulate_problem` (``Covariates`` mean with prior N(0, 10^2) coupled with an SVGP,
    Matern-5/2, 12 x 6 inducing inputs; default randomised rule) fitted by ``fit`` (``steps`` Adam
    steps, lr 0.05, float64), then ``patterns`` calls of ``simulate(num_samples=1, seed=i)``
    (with ``simulate_kwargs``), each timed; the first includes NumPyro's compilation."""
    from sparsegp_common.objectives import windows

    raster, events, window = simulate_problem(size)
    if backend == "pyro":
        import pyro
        import pyro.distributions as dist
        import torch

        import pyro_sparsegp as lib

        pyro.clear_param_store()
        array = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64))  # noqa: E731
    else:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import numpyro.distributions as dist

        import numpyro_sparsegp as lib

        array = lambda a: jnp.asarray(np.asarray(a, dtype=np.float64))  # noqa: E731
    axes = [np.linspace(lo + (hi - lo) / 20, hi - (hi - lo) / 20, n) for (lo, hi), n in zip(window, (12, 6))]
    Z = np.stack([g.ravel() for g in np.meshgrid(*axes)], axis=-1)
    mean = lib.Covariates(raster, bias=math.log(len(events)), prior=dist.Normal(array(0.0), array(10.0)))
    gp = lib.SVGP(lib.Matern52(lengthscale=array([1.0, 1.0]), variance=0.1), array(Z), mean_function=mean)
    model = lib.CoxProcess(gp, window)
    start = time.perf_counter()
    result = lib.fit(model.model, model.guide, (array(events),), num_steps=steps, lr=0.05, progress=False)
    fit_seconds = time.perf_counter() - start
    rule = windows.GaussLegendre(64).layout(windows.Rectangle(window))
    intensity = model.intensity(array(rule.points), quantiles=None, params=result.params).mean
    expected = float(rule.weights @ np.asarray(intensity))

    candidates, thin = [], windows.thin  # count the candidates of each draw (the function is unchanged)

    def counting_thin(window, log_bound, draw, rng, *args, **kwargs):
        def counted(X, seed):
            candidates.append(len(X))
            return draw(X, seed)

        return thin(window, log_bound, counted, rng, *args, **kwargs)

    windows.thin = counting_thin
    resident, _ = harness.memory()
    reset = harness.reset_peak()
    seconds, counts = [], []
    try:
        for i in range(patterns):
            start = time.perf_counter()
            pattern = model.simulate(num_samples=1, seed=i, params=result.params, **(simulate_kwargs or {}))[0]
            counts.append(len(pattern))
            seconds.append(time.perf_counter() - start)
    finally:
        windows.thin = thin
    _, peak = harness.memory()
    return {"suite": "cox", "table": "simulate", "backend": backend, "size": size,
            "window": f"{window[0, 1]:g} x {window[1, 1]:g}", "num_events": len(events), "steps": steps,
            "fit_seconds": fit_seconds, "patterns": patterns, "draws": len(candidates),
            "candidates": float(np.mean(candidates)), "mean_count": float(np.mean(counts)), "expected": expected,
            "first_seconds": seconds[0], "seconds": float(np.median(seconds[1:] if patterns > 1 else seconds)),
            "all_seconds": seconds, "peak_mb": peak - resident if reset and peak is not None else float("nan"),
            "simulate_kwargs": simulate_kwargs or {}}


def simulate_rows(quick):
    """The ``simulate`` table: :func:`simulate_cost` for each backend in a child process."""
    if harness.tiny():
        settings, backends = ["--size", "0.3", "--steps", "30", "--patterns", "2"], ("pyro",)
    elif quick:  # NumPyro's fit alone would compile for 15 s
        settings, backends = ["--size", "0.5", "--patterns", "3"], ("pyro",)
    else:
        settings, backends = ["--size", "1", "--patterns", "3"], ("pyro", "numpyro")
    rows = []
    for backend in backends:
        command = [sys.executable, "-m", "benchmarks.cox", "simulate", backend, *settings]
        done = subprocess.run(command, cwd=harness.REPO, env=dict(os.environ), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the simulate benchmark failed ({backend}):\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.splitlines()[-1]))
    return rows


def main(argv=None):
    """``python -m benchmarks.cox simulate BACKEND [--size S] [--steps N] [--patterns P]
    [--batch-size B] [--num-anchors R] [--threads T]`` prints one row of the ``simulate`` table as
    JSON (and the table); ``--batch-size`` and ``--num-anchors`` go to ``simulate`` (a batch size
    above the candidates' count draws ``f`` jointly from the full covariance, as before issue 31)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.cox", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("simulate", help="the cost of CoxProcess.simulate in one backend")
    one.add_argument("backend", choices=("pyro", "numpyro"))
    one.add_argument("--size", type=float, default=1.0, help="scale of the window's sides (1: 10 x 5)")
    one.add_argument("--steps", type=int, default=300, help="Adam steps of the fit (default 300)")
    one.add_argument("--patterns", type=int, default=3, help="patterns simulated, each timed (default 3)")
    one.add_argument("--batch-size", type=int, default=None)
    one.add_argument("--num-anchors", type=int, default=None)
    one.add_argument("--threads", type=int, default=2, help="threads for torch and XLA (default 2)")
    args = parser.parse_args(argv)
    harness.pin_threads(args.threads)  # before torch or JAX is imported
    kwargs = {k: v for k, v in (("batch_size", args.batch_size), ("num_anchors", args.num_anchors)) if v is not None}
    row = simulate_cost(args.backend, args.size, args.steps, args.patterns, kwargs)
    print(harness.markdown_table(SIMULATE_COLUMNS, [row], title=SIMULATE_TITLE), file=sys.stderr)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
