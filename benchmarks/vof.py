"""Suite ``vof``: variational orthogonal features (Burt et al., 2020), three parts.

* ``speed``: median seconds per SVI step (minibatch 1024, float32, Pyro) on a 2-D input problem
  (flights: hour of day and day of year, standardised; a synthetic 2-D set when the data are
  absent) for M in 256, 1024, 4096: Hermite features with diagonal and dense ``S`` (closed-form
  ``Kuf``, ``GPModel`` with ``Trace_ELBO``), Fourier features with diagonal ``S`` (Monte Carlo,
  collapsed loss, T = 50), beside our SVGP and GPyTorch's SVGP on M inducing points. The ratio is
  GPyTorch's median over the Hermite-diagonal one. Ours are steps of the product's ``fit``.
* ``fig3``: the paper's Fig. 3 analogue: ELBO against M for Hermite and Fourier features with
  dense and diagonal ``S``, 1000 inputs from N(0, 3^2), U[-sqrt(108), sqrt(108)] or a Gaussian
  mixture, targets from a GP (SE, variance 0.5, lengthscale 0.5) plus noise of sd 0.01, beside the
  exact log marginal likelihood (hyperparameters fitted by L-BFGS). For both ``S`` the optimal
  ``q(u)`` given ``Kuf`` is in closed form (dense: Titsias; diagonal: ``m* = (I + K K^T / s2)^-1
  K y / s2``, ``S*_mm = 1 / (1 + |K_m|^2 / s2)``), so L-BFGS optimises the hyperparameters and the
  feature parameter (``sigma_x`` or ``a``) of that bound in float64; Fourier features use the
  deterministic quadrature ``Kuf`` here (the Monte Carlo training is timed in ``speed`` and used in
  ``flights``). Written as rows and as ``outputs/benchmarks/vof_fig3.png`` (``vof_fig3_quick.png``
  with ``--quick``).
* ``flights``: 1M rows of flights_3m (fixed seed; delay against hour of day and day of year,
  standardised; 10% held out), trained for the same wall-clock time each: Hermite features
  (diagonal ``S``, M = 1024 and 4096) and our SVGP with M = 1024 (Pyro's ``fit``, float32, Adam,
  batch 1024); test RMSE and NLPD in minutes.
"""
import math
import time

import numpy as np

from . import harness, runners

FIG3_M = (11, 15, 21, 25, 31, 35, 41, 45, 51, 55, 61, 65, 71)


def settings(quick):
    if harness.tiny():
        return {"speed_M": (64,), "repeats": 2, "block_seconds": 0.05, "warmup": 1, "fig3_M": (11,), "fig3_n": 200,
                "fig3_iters": 15, "flights_rows": 20000, "flights_seconds": 2.0, "flights_M": (64,), "svgp_M": 64}
    if quick:
        return {"speed_M": (256,), "repeats": 3, "block_seconds": 0.3, "warmup": 2, "fig3_M": (11, 31), "fig3_n": 1000,
                "fig3_iters": 40, "flights_rows": 100000, "flights_seconds": 15.0, "flights_M": (1024,), "svgp_M": 256}
    return {"speed_M": (256, 1024, 4096), "repeats": 5, "block_seconds": 1.0, "warmup": 2, "fig3_M": FIG3_M,
            "fig3_n": 1000, "fig3_iters": 100, "flights_rows": 1_000_000, "flights_seconds": 300.0,
            "flights_M": (1024, 4096), "svgp_M": 1024}


# ---------------------------------------------------------------- data


def flights_2d(num_rows, seed=0):
    """``(X (n, 2), y (n,), synthetic)``: hour of day and day of year against delay (minutes)."""
    from sparsegp_common.data import datasets

    if (harness.data_dir() / "flights_3m").is_dir():
        X, y = datasets.load_flights(num_rows=num_rows, seed=seed, data_dir=harness.data_dir())
        return X[:, [0, 2]], y, False
    rng = np.random.default_rng(seed)
    X = np.stack([rng.integers(0, 24, num_rows), rng.integers(0, 181, num_rows)], 1).astype(np.float64)
    y = 10 * np.sin(X[:, 0] / 4) + 5 * np.cos(X[:, 1] / 30) + 20 * rng.standard_t(3, num_rows)
    return X, y, True


def standardised_split(X, y, seed=0, test_fraction=0.1):
    from sparsegp_common.data.datasets import Standardizer

    test = np.random.default_rng(seed).random(len(X)) < test_fraction
    xs, ys = Standardizer.fit(X[~test]), Standardizer.fit(y[~test])
    return xs.transform(X[~test]), ys.transform(y[~test]), xs.transform(X[test]), y[test], ys


# ---------------------------------------------------------------- speed


class HermitePyro(runners.OursPyro):
    """The Pyro SVGP runner with Hermite features (``Kuu = I``), diagonal or dense ``S``."""

    key = "hermite"

    def __init__(self, X, y, M, batch_size, lr, diagonal=True):
        self.M, self.diagonal = M, diagonal
        super().__init__(X, y, None, batch_size, lr)

    def build(self, Z):
        import torch

        import pyro_sparsegp as psg
        from pyro_sparsegp.vof import HermiteFeatures

        D = self.X.shape[1]
        kernel = psg.RBF(lengthscale=torch.full((D,), runners.LENGTHSCALE), variance=runners.VARIANCE)
        features = HermiteFeatures(self.M, torch.ones(D, dtype=torch.float32), kernel=kernel)
        name = f"hermite_{'diag' if self.diagonal else 'dense'}_{self.M}"
        prior = psg.SVGP(kernel, features, diagonal=self.diagonal, name=name)
        likelihood = psg.Gaussian(variance=runners.NOISE, name=f"{name}_likelihood")
        return psg.GPModel(prior, likelihood, num_data=len(self.X)), None


class FourierPyro(HermitePyro):
    """Fourier features (Monte Carlo, T = 50 per set, diagonal ``S``) with the collapsed loss."""

    def __init__(self, X, y, M, batch_size, lr):
        super().__init__(X, y, M, batch_size, lr, diagonal=True)

    def build(self, Z):
        import torch

        import pyro_sparsegp as psg
        from pyro_sparsegp.vof import CollapsedELBO, FourierFeatures, VOFModel

        D = self.X.shape[1]
        kernel = psg.RBF(lengthscale=torch.full((D,), runners.LENGTHSCALE), variance=runners.VARIANCE)
        features = FourierFeatures(self.M, torch.full((D,), 4.0), num_quadrature=64)
        prior = psg.SVGP(kernel, features, diagonal=True, name=f"fourier_{self.M}")
        likelihood = psg.Gaussian(variance=runners.NOISE, name=f"fourier_{self.M}_likelihood")
        return VOFModel(prior, likelihood, num_data=len(self.X)), CollapsedELBO()


def run_speed(opts):
    X, y, synthetic = flights_2d(200_000)
    X, y, _, _, _ = standardised_split(X, y)
    rows = []
    for M in opts["speed_M"]:
        Z = harness.inducing_inputs(X, M)
        group = runners.build(("ours_pyro", "gpytorch"), X, y, Z, 1024)
        group["hermite_diag"] = HermitePyro(X, y, M, 1024, 0.01, diagonal=True)
        group["hermite_dense"] = HermitePyro(X, y, M, 1024, 0.01, diagonal=False)
        group["fourier_diag"] = FourierPyro(X, y, M, 1024, 0.01)
        blocks = harness.time_steps({k: r.step for k, r in group.items()}, opts["repeats"], opts["block_seconds"],
                                    opts["warmup"])
        runners.close(group)
        s = {k: harness.median(v) for k, v in blocks.items()}
        rows.append({
            "suite": "vof", "part": "speed", "dataset": "flights 2-D", "synthetic": synthetic, "M": M, "batch": 1024,
            "dtype": "float32", "threads": harness.threads(), "repeats": opts["repeats"],
            "load_average": harness.load_average(), **{f"seconds_{k}": v for k, v in s.items()},
            "ratio": s["gpytorch"] / s["hermite_diag"],
        })
    return rows


# ---------------------------------------------------------------- Fig. 3


def fig3_data(kind, n, seed=0):
    """Inputs of the paper's Fig. 3 and targets from a GP prior sample (SE, v = 0.5, l = 0.5, noise sd 0.01)."""
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        x = rng.normal(0, 3, n)
    elif kind == "uniform":
        x = rng.uniform(-math.sqrt(108), math.sqrt(108), n)
    else:  # weights 0.7 / 0.3, variances 1 / 0.5, means giving mean 0 and sd 3
        mu1 = math.sqrt((9 - 0.7 - 0.15) * 0.3 / 0.7)
        comp = rng.random(n) < 0.7
        x = np.where(comp, rng.normal(mu1, 1.0, n), rng.normal(-0.7 * mu1 / 0.3, math.sqrt(0.5), n))
    K = 0.5 * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.25) + 1e-8 * np.eye(n)
    f = np.linalg.cholesky(K) @ rng.normal(size=n)
    return x[:, None], f + 0.01 * rng.normal(size=n)


def optimal_q_bound(Kuf, y, noise, kff, diagonal):
    """The ELBO at the optimal ``q(u)`` of the family, given ``Kuf`` ``(M, N)`` (torch, float64)."""
    import torch

    M = Kuf.shape[0]
    P = torch.eye(M, dtype=Kuf.dtype) + Kuf @ Kuf.T / noise
    LP = torch.linalg.cholesky(P)
    b = Kuf @ y / noise
    m = torch.cholesky_solve(b[:, None], LP)[:, 0]
    resid = y - Kuf.T @ m
    n = y.shape[0]
    fit = -0.5 * n * torch.log(2 * math.pi * noise) - 0.5 * (resid**2).sum() / noise - 0.5 * (kff - (Kuf**2).sum(0)).sum() / noise
    if diagonal:
        s = 1 / torch.diagonal(P)
        return fit - 0.5 * (s * torch.diagonal(P)).sum() - 0.5 * (m**2).sum() + 0.5 * M + 0.5 * torch.log(s).sum()
    # dense: S* = P^-1, tr(P S*) = M and log det S* = -log det P
    return fit - 0.5 * M - 0.5 * (m**2).sum() + 0.5 * M - torch.log(torch.diagonal(LP)).sum()


def lbfgs(params, objective, iters):
    import torch

    opt = torch.optim.LBFGS(params, lr=1, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = -objective()
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        return float(objective())


def exact_lml(X, y, iters):
    import torch

    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    raw = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (math.log(0.5), math.log(0.5), math.log(1e-3))]

    def objective():
        ls, v, noise = (torch.exp(r) for r in raw)
        K = v * torch.exp(-0.5 * (Xt - Xt.T) ** 2 / ls**2) + (noise + 1e-10) * torch.eye(len(yt), dtype=torch.float64)
        L = torch.linalg.cholesky(K)
        a = torch.linalg.solve_triangular(L, yt[:, None], upper=False)[:, 0]
        return -0.5 * (a**2).sum() - torch.log(torch.diagonal(L)).sum() - 0.5 * len(yt) * math.log(2 * math.pi)

    return lbfgs(raw, objective, iters)


def vof_bound(X, y, M, features, diagonal, iters):
    import pyro
    import torch

    import pyro_sparsegp as psg
    from pyro_sparsegp import vof

    pyro.clear_param_store()
    kernel = psg.RBF(lengthscale=torch.tensor([0.5], dtype=torch.float64), variance=torch.tensor(0.5, dtype=torch.float64))
    if features == "hermite":
        feats = vof.HermiteFeatures(M, torch.tensor([3.0], dtype=torch.float64), kernel=kernel)
    else:  # a covering the spectral mass of l = 0.5 while K pi / a spans the inputs
        feats = vof.FourierFeatures(M, torch.tensor([float(np.clip((M // 2) * math.pi / np.abs(X).max(), 2.0, 12.0))],
                                                    dtype=torch.float64), num_quadrature=max(256, 8 * M))
    gp = psg.SVGP(kernel, feats, diagonal=diagonal, name="fig3")
    lik = psg.Gaussian(variance=torch.tensor(1e-3, dtype=torch.float64), name="fig3_likelihood")
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)

    def objective():
        with psg.params.active(gp, lik):
            K = psg.Kuf(gp.features, gp.kernel, Xt)
            return optimal_q_bound(K, yt, lik.variance, gp.kernel.K_diag(Xt), diagonal)

    params = harness.traced_params(objective)  # q(u) is at its optimum: not a parameter here
    return lbfgs(list(params.values()), objective, iters)


def run_fig3(opts):
    rows = []
    for kind in ("gaussian", "uniform", "mixture"):
        X, y = fig3_data(kind, opts["fig3_n"])
        lml = exact_lml(X, y, opts["fig3_iters"])
        for features in ("hermite", "fourier"):
            for M in opts["fig3_M"]:
                row = {"suite": "vof", "part": "fig3", "inputs": kind, "features": features, "M": M, "lml": lml,
                       "num_data": len(X)}
                for diagonal in (False, True):
                    start = time.perf_counter()
                    row["elbo_" + ("diag" if diagonal else "dense")] = vof_bound(X, y, M, features, diagonal, opts["fig3_iters"])
                    row["seconds"] = row.get("seconds", 0) + time.perf_counter() - start
                rows.append(row)
    return rows


def plot_fig3(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6), sharex=True)
    for i, features in enumerate(("fourier", "hermite")):
        for j, kind in enumerate(("gaussian", "uniform", "mixture")):
            sel = [r for r in rows if r["features"] == features and r["inputs"] == kind]
            ax = axes[i, j]
            if not sel:
                continue
            M = [r["M"] for r in sel]
            ax.plot(M, [r["elbo_dense"] for r in sel], "o-", color="tab:blue", label="dense S")
            ax.plot(M, [r["elbo_diag"] for r in sel], "s--", color="tab:green", label="diagonal S")
            ax.axhline(sel[0]["lml"], color="k", lw=1, label="exact LML")
            lo = sel[0]["lml"] - 3 * max(1.0, abs(sel[0]["lml"]))
            ax.set_ylim(max(lo, min(min(r["elbo_diag"] for r in sel), min(r["elbo_dense"] for r in sel)) - 10),
                        sel[0]["lml"] + 0.05 * abs(sel[0]["lml"]) + 5)
            ax.set_title(f"{features}, {kind} inputs")
            if j == 0:
                ax.set_ylabel("ELBO")
            if i == 1:
                ax.set_xlabel("M")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- flights


def train_for(runner, seconds, min_steps=5):
    start, steps = time.perf_counter(), 0
    while steps < min_steps or time.perf_counter() - start < seconds:
        runner.step()
        steps += 1
    return steps, time.perf_counter() - start


def run_flights(opts):
    X, y, synthetic = flights_2d(opts["flights_rows"])
    Xtr, ytr, Xte, yte, ys = standardised_split(X, y)
    Xte, yte = Xte[:100_000], yte[:100_000]
    candidates = {f"hermite_diag_M{M}": (lambda M=M: HermitePyro(Xtr, ytr, M, 1024, 0.01))
                  for M in opts["flights_M"]}
    M = opts["svgp_M"]
    candidates[f"svgp_M{M}"] = lambda: runners.build(("ours_pyro",), Xtr, ytr, harness.inducing_inputs(Xtr, M), 1024)["ours_pyro"]
    rows = []
    for name, make in candidates.items():
        runner = make()
        steps, seconds = train_for(runner, opts["flights_seconds"])
        mean, var = runner.predict(Xte)
        runner.close()
        mean, var = ys.inverse_transform(mean), ys.inverse_variance(var)
        rows.append({
            "suite": "vof", "part": "flights", "dataset": "flights_3m", "synthetic": synthetic, "method": name,
            "num_data": len(Xtr), "num_test": len(Xte), "steps": steps, "seconds": seconds,
            "rmse": float(np.sqrt(np.mean((mean - yte) ** 2))),
            "nlpd": harness.gaussian_nlpd(mean, var, yte),
        })
    return rows


# ---------------------------------------------------------------- suite interface


SPEED_COLUMNS = [
    ("M", "M", "{}"), ("Hermite diag", "seconds_hermite_diag", "{:.4f} s"),
    ("Hermite dense", "seconds_hermite_dense", "{:.4f} s"), ("Fourier diag (MC)", "seconds_fourier_diag", "{:.4f} s"),
    ("ours SVGP", "seconds_ours_pyro", "{:.4f} s"), ("GPyTorch SVGP", "seconds_gpytorch", "{:.4f} s"),
    ("GPyTorch / Hermite diag", "ratio", "{:.1f}"),
]
FIG3_COLUMNS = [
    ("inputs", "inputs", "{}"), ("features", "features", "{}"), ("M", "M", "{}"), ("ELBO dense", "elbo_dense", "{:.1f}"),
    ("ELBO diag", "elbo_diag", "{:.1f}"), ("exact LML", "lml", "{:.1f}"),
]
FLIGHTS_COLUMNS = [
    ("method", "method", "{}"), ("seconds", "seconds", "{:.0f}"), ("steps", "steps", "{}"),
    ("RMSE (min)", "rmse", "{:.3f}"), ("NLPD", "nlpd", "{:.4f}"),
]
COLUMNS = SPEED_COLUMNS  # the first table; :func:`tables` gives all three


def title(rows):
    return tables(rows)[0][0]


def tables(rows):
    """``[(title, columns, rows)]``: speed, the Fig. 3 analogue and flights."""
    parts = {part: [r for r in rows if r["part"] == part] for part in ("speed", "fig3", "flights")}
    threads = parts["speed"][0]["threads"] if parts["speed"] else "?"
    titles = {
        "speed": f"vof speed: median seconds per SVI step, 2-D flights inputs, batch 1024, float32, {threads} threads",
        "fig3": "vof Fig. 3 analogue: ELBO at the optimal q(u) against M (L-BFGS), beside the exact log marginal likelihood",
        "flights": "vof flights: test RMSE and NLPD at equal wall-clock time",
    }
    columns = {"speed": SPEED_COLUMNS, "fig3": FIG3_COLUMNS, "flights": FLIGHTS_COLUMNS}
    return [(titles[part], columns[part], part_rows) for part, part_rows in parts.items() if part_rows]


def run(quick):
    opts = settings(quick)
    rows = run_speed(opts) + run_fig3(opts) + run_flights(opts)
    name = "vof_fig3_quick.png" if quick else "vof_fig3.png"
    plot_fig3([r for r in rows if r["part"] == "fig3"], harness.REPO / "outputs" / "benchmarks" / name)
    return rows
