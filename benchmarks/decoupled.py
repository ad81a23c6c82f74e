"""Suite ``decoupled``: the decoupled-basis prior against the SVGP, in two tables.

Speed: median seconds per SVI step at (M_alpha, M_beta) in (4096, 128), (16384, 128),
(16384, 512), in both backends, beside GPyTorch's SVGP with M = 1024 and our SVGP (Pyro) with
M = M_beta. kin40k (split 0, standardised), minibatch 1024, float32, SE-ARD kernel, Gaussian
likelihood. The decoupled steps use the unbiased subsampled KL (``kl_subsample_size=1024`` columns
of ``K_alpha``), as in the paper's linear-cost training, and the default Jacobi-preconditioned
parametrisation (its A.1); the bases start at the same random
training rows (the covariance basis at the first M_beta mean points). Timed blocks alternate
(:func:`~benchmarks.harness.time_steps`); the ratio is GPyTorch's median over the decoupled one
(above 1: faster than GPyTorch).

Accuracy at equal wall-clock time: decoupled (16384, 128) against our SVGP with M = 1024 (both
Pyro, trained by ``fit`` one step at a time), each for the same number of seconds in alternating slices (so that the machine's
load drifts over both alike), then test RMSE and NLPD (original units) on kin40k and protein
(split 0); and on SARCOS (the ``sarcos_test`` file, a random 90/10 split with seed 0, 7 outputs as
independent GPs batched in one component with ``num_latent = 7`` and a per-output noise, written as
a user model around the component), the normalised MSE of each output (test MSE over the test
targets' variance, as in the paper). SARCOS has only 4004 training rows, so its mean basis is
every training input.
"""
import time

import numpy as np

from . import harness, runners
from .accuracy import metrics

DATASET = "kin40k"
KL_SUBSAMPLE = 1024


def settings(quick):
    if harness.tiny():
        speed = {"sizes": ((256, 32),), "gpytorch_M": 64, "batch": 256, "repeats": 2, "block_seconds": 0.05,
                 "warmup": 1}
        accuracy = {"datasets": ("kin40k",), "sizes": (256, 32), "svgp_M": 64, "sarcos_sizes": (256, 16),
                    "sarcos_svgp_M": 32, "batch": 256, "seconds": 0.5, "slice_seconds": 0.25}
    elif quick:
        speed = {"sizes": ((4096, 128),), "gpytorch_M": 1024, "batch": 1024, "repeats": 3, "block_seconds": 0.3,
                 "warmup": 2}
        accuracy = {"datasets": ("kin40k",), "sizes": (2048, 64), "svgp_M": 256, "sarcos_sizes": (1024, 64),
                    "sarcos_svgp_M": 256, "batch": 1024, "seconds": 10.0, "slice_seconds": 2.0}
    else:
        speed = {"sizes": ((4096, 128), (16384, 128), (16384, 512)), "gpytorch_M": 1024, "batch": 1024,
                 "repeats": 7, "block_seconds": 1.5, "warmup": 3}
        accuracy = {"datasets": ("kin40k", "protein"), "sizes": (16384, 128), "svgp_M": 1024,
                    "sarcos_sizes": (16384, 128), "sarcos_svgp_M": 1024, "batch": 1024, "seconds": 180.0,
                    "slice_seconds": 10.0}
    return {"speed": speed, "accuracy": accuracy, "lr": 0.01}


class DecoupledPyro(runners.OursPyro):
    """The Pyro SVGP runner with a ``DecoupledGP`` prior: ``Z`` is the mean basis, its first
    ``M_beta`` rows the covariance basis."""

    name = "decoupled (Pyro)"
    key = "decoupled_pyro"
    likelihood_name = "decoupled_likelihood"
    M_beta = None

    def prior(self, kernel, Z):
        import pyro_sparsegp as psg

        return psg.DecoupledGP(kernel, Z, Z[: self.M_beta], kl_subsample_size=min(KL_SUBSAMPLE, len(Z)),
                               name="decoupled")


class DecoupledNumPyro(runners.OursNumPyro):
    """The NumPyro (jit) SVGP runner with a ``DecoupledGP`` prior, bases as in :class:`DecoupledPyro`."""

    name = "decoupled (NumPyro, jit)"
    key = "decoupled_numpyro"
    M_beta = None

    def prior(self, kernel, Z):
        import numpyro_sparsegp as nsg

        return nsg.DecoupledGP(kernel, Z, Z[: self.M_beta], kl_subsample_size=min(KL_SUBSAMPLE, len(Z)))


def with_beta(runner, M_beta):
    """``runner`` (a decoupled runner class) with its covariance basis size set."""
    return type(runner.__name__, (runner,), {"M_beta": M_beta})


class MultiOutputPyro(runners.Runner):
    """L independent outputs: one prior component with ``num_latent = L`` (its own kernel
    hyperparameters per output) inside a user model ``y_nl ~ N(f_l(x_n), noise_l)``, trained by
    ``fit`` with ``Trace_ELBO`` (one draw of ``f`` per row), the data plate drawing ``batch_size``
    rows per step."""

    def __init__(self, X, Y, Z, batch_size, lr, make_prior, name, seed=0):
        import pyro
        import torch
        from torch.distributions import constraints

        import pyro_sparsegp as psg

        self.name = self.key = name
        self.X, self.Y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(Y, dtype=torch.float32)
        L, D = Y.shape[1], X.shape[1]
        kernel = psg.RBF(lengthscale=torch.full((L, D), runners.LENGTHSCALE), variance=torch.full((L,), runners.VARIANCE))
        self.gp = make_prior(kernel, torch.as_tensor(Z, dtype=torch.float32), L, name)
        self.noise_name = f"{name}.noise"
        self.noise = lambda: pyro.param(self.noise_name, torch.full((L,), runners.NOISE), constraint=constraints.positive)
        self.fit = harness.FitSteps(psg.fit, self.model, self.guide, (self.X, self.Y), lr=lr, seed=seed,
                                    subsample_size=batch_size)

    def plate(self, subsample_size):
        import pyro

        return pyro.plate(f"{self.name}.data", len(self.X), subsample_size=subsample_size)

    def model(self, X, Y, subsample_size):
        import pyro
        import pyro.distributions as dist

        data = self.plate(subsample_size)
        f = self.gp.model(X, data)
        with data as idx:
            pyro.sample(f"{self.name}.y", dist.Normal(f, self.noise().sqrt()).to_event(1), obs=Y[idx])

    def guide(self, X, Y, subsample_size):
        self.gp.guide(X, self.plate(subsample_size))

    def step(self):
        return self.fit.step()

    def close(self):
        self.fit.close()

    def predict(self, X):
        """Predictive means and variances ``(T, L)``."""
        import pyro
        import torch

        with torch.no_grad():
            mean, var = self.gp.predict_f(torch.as_tensor(X, dtype=torch.float32))
            var = var + pyro.param(self.noise_name)
        return mean.double().numpy(), var.double().numpy()


def multi_output_prior(kind, M_beta=None):
    """A ``make_prior(kernel, Z, L, name)`` for :class:`MultiOutputPyro`: ``"svgp"`` or ``"decoupled"``."""
    import pyro_sparsegp as psg

    def make(kernel, Z, L, name):
        if kind == "svgp":
            return psg.SVGP(kernel, Z, num_latent=L, name=name)
        return psg.DecoupledGP(kernel, Z, Z[:M_beta], num_latent=L, kl_subsample_size=min(KL_SUBSAMPLE, len(Z)),
                               name=name)

    return make


def train_for(group, seconds, slice_seconds):
    """Train every runner of ``group`` for ``seconds`` of wall-clock time, in alternating slices.

    Returns:
        ``{key: (steps, seconds spent)}``.
    """
    spent, steps = dict.fromkeys(group, 0.0), dict.fromkeys(group, 0)
    while min(spent.values()) < seconds:
        for key, runner in group.items():
            if spent[key] >= seconds:
                continue
            start = time.perf_counter()
            while True:
                runner.step()
                steps[key] += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min(slice_seconds, seconds - spent[key]):
                    break
            spent[key] += elapsed
    return {key: (steps[key], spent[key]) for key in group}


SPEED_COLUMNS = [
    ("M_alpha", "M_alpha", "{}"), ("M_beta", "M_beta", "{}"),
    ("decoupled (Pyro)", "seconds_decoupled", "{:.4f} s"),
    ("decoupled (NumPyro, jit)", "seconds_decoupled_numpyro", "{:.4f} s"),
    ("ours SVGP M=M_beta (Pyro)", "seconds_svgp", "{:.4f} s"),
    ("GPyTorch SVGP", "seconds_gpytorch", "{:.4f} s"),
    ("GPyTorch / decoupled (Pyro)", "ratio", "{:.2f}"),
    ("GPyTorch / decoupled (NumPyro)", "ratio_numpyro", "{:.2f}"),
]
ACCURACY_COLUMNS = [
    ("dataset", "dataset", "{}"), ("model", "model", "{}"), ("seconds", "seconds", "{:.0f}"),
    ("steps", "steps", "{}"), ("test RMSE", "rmse", "{:.4f}"), ("test NLPD", "nlpd", "{:.4f}"),
    ("nMSE per output", "nmse_text", "{}"), ("mean nMSE", "nmse_mean", "{:.4f}"),
]
COLUMNS = SPEED_COLUMNS  # the first table; :func:`tables` gives both


def title(rows):
    return tables(rows)[0][0]


def tables(rows):
    """``[(title, columns, rows)]``: the speed table and the accuracy table."""
    speed = [row for row in rows if row["part"] == "speed"]
    accuracy = [row for row in rows if row["part"] == "accuracy"]
    out = []
    if speed:
        row = speed[0]
        out.append((
            f"decoupled speed: median seconds per SVI step, {row['dataset']} (N = {row['num_data']}, "
            f"D = {row['input_dim']}), batch {row['batch']}, {row['dtype']}, {row['threads']} threads, GPyTorch SVGP "
            f"with M = {row['gpytorch_M']}, medians of {row['repeats']} blocks",
            SPEED_COLUMNS, speed,
        ))
    if accuracy:
        row = accuracy[0]
        out.append((
            f"decoupled accuracy at equal wall-clock time: {row['budget']:.0f} s each (alternating "
            f"{row['slice_seconds']:.0f} s slices), batch {row['batch']}, Adam lr {row['lr']}, float32, "
            f"{row['threads']} threads, split 0 (SARCOS: random 90/10)",
            ACCURACY_COLUMNS, accuracy,
        ))
    return out


def run(quick):
    opts = settings(quick)
    return speed_rows(opts["speed"], opts["lr"]) + accuracy_rows(opts["accuracy"], opts["lr"])


def speed_rows(opts, lr):
    problem = harness.regression_problem(DATASET)
    X, y = problem["X_train"], problem["y_train"]
    rows = []
    for Ma, Mb in opts["sizes"]:
        Za = harness.inducing_inputs(X, Ma)
        group = runners.build(("ours_pyro",), X, y, Za[:Mb], opts["batch"], lr=lr)
        for key, runner, Z in (("gpytorch", runners.GPyTorch, Za[: opts["gpytorch_M"]]),
                               ("decoupled", with_beta(DecoupledPyro, Mb), Za),
                               ("decoupled_numpyro", with_beta(DecoupledNumPyro, Mb), Za)):
            group[key] = runner(X, y, Z, opts["batch"], lr)
        blocks = harness.time_steps({key: r.step for key, r in group.items()}, opts["repeats"], opts["block_seconds"],
                                    opts["warmup"])
        runners.close(group)
        seconds = {key: harness.median(values) for key, values in blocks.items()}
        rows.append({
            "suite": "decoupled", "part": "speed", "dataset": DATASET, "synthetic": problem["synthetic"],
            "num_data": len(X), "input_dim": X.shape[1], "M_alpha": Ma, "M_beta": Mb,
            "gpytorch_M": opts["gpytorch_M"], "batch": opts["batch"], "dtype": "float32",
            "threads": harness.threads(), "repeats": opts["repeats"], "load_average": harness.load_average(),
            "seconds_decoupled": seconds["decoupled"], "seconds_decoupled_numpyro": seconds["decoupled_numpyro"],
            "seconds_svgp": seconds["ours_pyro"], "seconds_gpytorch": seconds["gpytorch"],
            "ratio": seconds["gpytorch"] / seconds["decoupled"],
            "ratio_numpyro": seconds["gpytorch"] / seconds["decoupled_numpyro"],
        })
    return rows


def accuracy_rows(opts, lr):
    import pyro

    rows = []
    common = {"suite": "decoupled", "part": "accuracy", "budget": opts["seconds"],
              "slice_seconds": opts["slice_seconds"], "batch": opts["batch"], "lr": lr, "threads": harness.threads()}
    for name in opts["datasets"]:
        problem = harness.regression_problem(name)
        X, y, scaler = problem["X_train"], problem["y_train"], problem["y_scaler"]
        Ma, Mb = opts["sizes"]
        Za = harness.inducing_inputs(X, Ma)
        pyro.clear_param_store()
        group = {}
        group[f"decoupled ({Ma}, {Mb})"] = with_beta(DecoupledPyro, Mb)(X, y, Za, opts["batch"], lr)
        group[f"SVGP M={opts['svgp_M']}"] = runners.OursPyro(X, y, Za[: opts["svgp_M"]], opts["batch"], lr)
        for model, (steps, seconds) in train_for(group, opts["seconds"], opts["slice_seconds"]).items():
            mean, var = group[model].predict(problem["X_test"])
            rmse, nlpd = metrics(problem["y_test"], scaler.inverse_transform(mean), scaler.inverse_variance(var))
            rows.append({**common, "dataset": name, "synthetic": problem["synthetic"], "model": model,
                         "steps": steps, "seconds": seconds, "rmse": rmse, "nlpd": nlpd})
        runners.close(group)
    rows.extend(sarcos_rows(opts, common, lr))
    return rows


def sarcos_split(seed=0):
    """SARCOS test file split 90/10 at random; inputs and each output standardised with the
    training statistics. Returns ``(X_train, Y_train, X_test, Y_test)``, or None without data."""
    from sparsegp_common.data.datasets import Standardizer, load_sarcos

    try:
        X, Y = load_sarcos(harness.data_dir())
    except FileNotFoundError:
        return None
    test = np.zeros(len(X), bool)
    test[np.random.default_rng(seed).choice(len(X), len(X) // 10, replace=False)] = True
    x_scaler, y_scaler = Standardizer.fit(X[~test]), Standardizer.fit(Y[~test])
    return (x_scaler.transform(X[~test]), y_scaler.transform(Y[~test]), x_scaler.transform(X[test]),
            y_scaler.transform(Y[test]))


def sarcos_rows(opts, common, lr):
    import pyro

    split = sarcos_split()
    if split is None:
        return []
    X, Y, X_test, Y_test = split
    Ma, Mb = min(opts["sarcos_sizes"][0], len(X)), opts["sarcos_sizes"][1]
    Za = X if Ma == len(X) else harness.inducing_inputs(X, Ma)
    pyro.clear_param_store()
    models = {f"decoupled ({Ma}, {Mb})": (multi_output_prior("decoupled", Mb), Za),
              f"SVGP M={opts['sarcos_svgp_M']}": (multi_output_prior("svgp"), Za[: opts["sarcos_svgp_M"]])}
    group = {model: MultiOutputPyro(X, Y, Z, min(opts["batch"], len(X)), lr, make, f"sarcos{i}")
             for i, (model, (make, Z)) in enumerate(models.items())}
    rows = []
    for model, (steps, seconds) in train_for(group, opts["seconds"], opts["slice_seconds"]).items():
        mean, _ = group[model].predict(X_test)
        nmse = ((Y_test - mean) ** 2).mean(0) / Y_test.var(0)
        rows.append({**common, "dataset": "sarcos", "synthetic": False, "model": model, "steps": steps,
                     "seconds": seconds, "nmse": nmse.tolist(), "nmse_mean": float(nmse.mean()),
                     "nmse_text": " ".join(f"{v:.3f}" for v in nmse)})
    runners.close(group)
    return rows
