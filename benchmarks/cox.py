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
pattern of ``sparsegp_common.datasets.simulate_covariate_pattern`` (two covariate images, a GP term
of variance 0.1 and lengthscale 0.25, about 1,100 events, split 80/20 the same way), fitted with a
``Covariates`` mean (prior N(0, 10^2) on the coefficients; lr decayed 20-fold over the run) by the
default randomised rule, a fixed
32 x 32 Gauss-Legendre rule and the images' 40 x 40 pixel rule; the coefficients column gives the
covariates' fitted effects with their ``q`` standard deviations. ``gorillas``: a real pattern
with covariate images, in its own table (see :mod:`benchmarks.cox_gorillas`).
"""
import math
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
    """``[(title, columns, rows)]``: the likelihoods and rules, then the real ``gorillas`` pattern."""
    main = [r for r in rows if r.get("table") != "gorillas"]
    gorillas = [r for r in rows if r.get("table") == "gorillas"]
    title = "cox: Cox-process likelihoods, held-out log-likelihood (80/20 thinning) and wall time (Pyro, float64)"
    return [(title, COLUMNS, main)] + ([(cox_gorillas.TITLE, cox_gorillas.COLUMNS, gorillas)] if gorillas else [])


def methods(dim, quick):
    from sparsegp_common import windows

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
    from sparsegp_common import windows
    from sparsegp_common.datasets import simulate_covariate_pattern

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

    from sparsegp_common import windows

    rule = windows.GaussLegendre(256 if len(window) == 1 else 64).layout(windows.Rectangle(window))
    at = lambda X: model.prior.predict_f(torch.as_tensor(X), params=result.params)
    m_test, _ = at(test)
    m, v = at(rule.points)
    log_lam = m_test.numpy() + model.offset + log_scale
    integral = rule.weights @ np.exp(m.numpy() + v.numpy() / 2 + model.offset + log_scale)
    return (log_lam.sum() - integral) / len(test)


def recovery_error(model, result):
    import torch

    from sparsegp_common import windows

    rule = windows.GaussLegendre(256).layout(windows.Interval(0.0, 10.0))
    mean = model.intensity(torch.as_tensor(rule.points), quantiles=None, params=result.params).mean.numpy()
    truth = np.exp(1.0 + 1.2 * np.sin(rule.points[:, 0] / 1.6))
    return float(rule.weights @ np.abs(mean - truth) / (rule.weights @ truth))


def run(quick):
    from sparsegp_common.datasets import load_point_pattern

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
    return rows + covariate_rows(steps) + cox_gorillas.rows(steps, harness.REPO / "outputs" / "benchmarks" / name)
