"""Suite ``dbk``: deep basis kernels (Zhu, Yuchi & Xie, 2025), Pyro backend.

* Scaling: seconds for the exact DBK objective (log marginal likelihood and trace term) plus its
  gradient on the 1-D step function (paper section 4.1), r = 128, a 2 x 128 tanh MLP, float32, at
  n = 1e4, 1e5, 1e6; ``per point`` is seconds / n relative to the smallest n (1 = linear), beside
  GPyTorch's exact GP (RBF, ``ExactMarginalLogLikelihood``, its default CG solver) at n = 1e4,
  with glibc's malloc keeping freed memory (:data:`harness.RETAIN_FREED_MEMORY`).
* Table 1 on pol and protein with the paper's protocol: a random 70/10/20 split per seed of all
  rows, inputs scaled to [-1, 1] and targets standardised with the training rows' statistics,
  trained by ``pyro_sparsegp.fit`` (its early stopping and ``param_groups``): Adam (lr 1e-3,
  weight decay 1e-4 on the network only), a 2-block 128-unit tanh ResNet with r = 128, sigma^2
  from 1e-2; exact models full batch (evaluated every 100 of at most 10,000
  iterations, patience 2,000 iterations), SVI models and the SVGP baseline (M = 128 inducing
  inputs, RBF with lengthscales sqrt(D)) in minibatches of 256 (evaluated every 10 of at most
  2,000 epochs, patience 200 epochs); test MAE, RMSE and NLL (standardised targets) at the
  evaluation with the best validation NLL, and the training time to that point's end. The
  networks run in float32; exact DBK accumulates its moments and does its r x r algebra in
  float64 (pol, seed 0: the same test RMSE as a float64 network, 0.0797 against 0.0795, at
  0.05 s per iteration against 0.079 s).
  The network starts from torch's default initialisation and the kernel variance (the models'
  ``variance``, learned) so that the root mean prior variance |phi(x)|^2 over the training inputs
  is INIT_PRIOR_SD (the paper does not say; unscaled it is 3-5 here, and the corrected exact DBK
  then trains several times slower; 0.3 was chosen over 1 by validation NLL on pol, seed 0).
  Full mode: 5 seeds; quick mode: 1 seed and budgets cut to a few minutes; the paper's numbers are
  printed beside ours. ``python -m benchmarks.dbk cell DATASET MODEL SEED`` runs one model and
  seed of it (so that cells can run side by side) and ``python -m benchmarks.dbk table`` prints
  Table 1 from the cells run so far (see :func:`main`).
"""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from . import harness

# Table 1 of the paper: (MAE, RMSE, NLL, seconds) per dataset and model.
PAPER = {
    "pol": {"DBK": (0.0249, 0.0583, -1.5117, 48.0), "DBK-c": (0.0501, 0.0900, -0.9720, 21.0),
            "SVGP": (0.0982, 0.1599, -0.3441, 527.0), "SVDBK": (0.0806, 0.1263, -0.5228, 112.4),
            "SVDBK-c": (0.0808, 0.1271, -0.5378, 86.7)},
    "protein": {"DBK": (0.4592, 0.6525, 2.2843, 85.7), "DBK-c": (0.4925, 0.7279, 4.3396, 75.6),
                "SVGP": (0.6114, 0.7554, 1.1394, 1546.0), "SVDBK": (0.3730, 0.5519, 0.8425, 266.5),
                "SVDBK-c": (0.3922, 0.5631, 0.8724, 217.2)},
}
SHAPES = {"pol": (15000, 26), "protein": (45730, 9)}  # rows, inputs (for the synthetic stand-ins)
MODELS = ("DBK", "DBK-c", "SVDBK", "SVDBK-c", "SVGP")
RANK, BATCH, LR, WEIGHT_DECAY, NUM_INDUCING = 128, 256, 1e-3, 1e-4, 128
INIT_PRIOR_SD = 0.3  # sqrt(mean |phi(x)|^2) over the training inputs at initialisation


def settings(quick):
    if harness.tiny():
        return {"sizes": (1000, 4000), "gpytorch_n": 1000, "repeats": 2, "block_seconds": 0.05, "rows": 300, "seeds": 1,
                "exact": (10, 5, 10), "svi": (1, 1, 1)}
    if quick:
        return {"sizes": (10_000, 100_000), "gpytorch_n": 10_000, "repeats": 3, "block_seconds": 0.3, "rows": None,
                "seeds": 1, "exact": (250, 50, 150), "svi": (8, 2, 4)}
    # (max iterations or epochs, evaluate every, patience): the paper's budgets
    return {"sizes": (10_000, 100_000, 1_000_000), "gpytorch_n": 10_000, "repeats": 5, "block_seconds": 1.0,
            "rows": None, "seeds": 5, "exact": (10_000, 100, 2_000), "svi": (2_000, 10, 200)}


# ---------------------------------------------------------------- scaling


def scaling(opts):
    """The scaling rows, measured in a child process (``python -m benchmarks.dbk scaling``) started
    with :data:`harness.RETAIN_FREED_MEMORY`."""
    command = [sys.executable, "-m", "benchmarks.dbk", "scaling", json.dumps(opts)]
    env = {**os.environ, **harness.RETAIN_FREED_MEMORY}
    done = subprocess.run(command, cwd=harness.REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the scaling benchmark failed:\n{done.stderr}")
    return json.loads(done.stdout)


def _scaling(opts):
    import torch

    from pyro_sparsegp.dbk import MLP, ExactDBK
    from sparsegp_common.data.step import step_data

    malloc = "freed memory retained" if all(os.environ.get(k) == v for k, v in harness.RETAIN_FREED_MEMORY.items()) else "default"
    steps, sizes = {}, opts["sizes"]
    for n in sizes:
        X, y = (torch.as_tensor(a, dtype=torch.float32) for a in step_data(n, seed=0))
        model = ExactDBK(MLP(1, rank=RANK, dtype=torch.float32, seed=0), name=f"dbk{n}")
        steps[n] = _gradient_step(model, X, y)
    steps["gpytorch"] = _gpytorch_step(*step_data(opts["gpytorch_n"], seed=0))
    blocks = harness.time_steps(steps, opts["repeats"], opts["block_seconds"], warmup=1)
    seconds = {key: harness.median(values) for key, values in blocks.items()}
    base = seconds[sizes[0]] / sizes[0]
    rows = []
    for n in sizes:
        row = {"suite": "dbk", "part": "scaling", "dataset": "step", "model": "exact DBK (Pyro)", "n": n, "rank": RANK,
               "seconds": seconds[n], "per_point": seconds[n] / n / base, "threads": harness.threads(),
               "repeats": opts["repeats"], "dtype": "float32", "malloc": malloc}
        if n == opts["gpytorch_n"]:
            row.update(seconds_gpytorch=seconds["gpytorch"], ratio=seconds["gpytorch"] / seconds[n])
        rows.append(row)
    return rows


def _gradient_step(model, X, y):
    def step():
        for p in model.parameters():
            p.grad = None
        value = -model.objective(X, y)
        value.backward()
        return value

    return step


def _gpytorch_step(X, y, device="cpu", dtype="float32"):
    import gpytorch
    import torch

    dtype = getattr(torch, dtype)
    X, y = (torch.as_tensor(a, dtype=dtype, device=device) for a in (X, y))

    class ExactGP(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(X, y, likelihood)
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(torch.zeros_like(x[:, 0]), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGP(likelihood).to(device=device, dtype=dtype)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()

    def step():
        model.zero_grad()
        value = -mll(model(X), y)
        value.backward()
        return value

    return step


# ---------------------------------------------------------------- Table 1


def split(name, seed, rows=None):
    """The paper's protocol on all rows of UCI set ``name``: random 70/10/20 split, inputs onto
    [-1, 1], targets standardised (training statistics). Returns dict of float64 arrays and whether
    the data are a synthetic stand-in."""
    from sparsegp_common.data.datasets import MinMaxScaler, Standardizer, load_uci

    if (harness.data_dir() / f"uci_{name}").is_dir():
        part = load_uci(name, split=0, data_dir=harness.data_dir())
        X, y, synthetic = np.vstack([part.X_train, part.X_test]), np.concatenate([part.y_train, part.y_test]), False
    else:
        n, D = SHAPES[name]
        r = np.random.default_rng(0)
        X = r.uniform(-1, 1, size=(n, D))
        y, synthetic = np.sin(3 * X @ r.normal(size=D) / np.sqrt(D)) + 0.1 * r.normal(size=n), True
    perm = np.random.default_rng(seed).permutation(len(X))[:rows]
    a, b = int(0.7 * len(perm)), int(0.8 * len(perm))
    idx = {"train": perm[:a], "val": perm[a:b], "test": perm[b:]}
    xs, ys = MinMaxScaler.fit(X[idx["train"]]), Standardizer.fit(y[idx["train"]])
    data = {key: (xs.transform(X[i]), ys.transform(y[i])) for key, i in idx.items()}
    return data, synthetic


def metrics(mean, var, y):
    mean, var = (np.asarray(a.detach().cpu(), dtype=np.float64) for a in (mean, var))
    err = y - mean
    return {"mae": float(np.abs(err).mean()), "rmse": float(np.sqrt((err**2).mean())),
            "nll": harness.gaussian_nlpd(mean, var, y)}


class Trained:
    """One model of Table 1: built here, trained by :meth:`fit`; ``evaluate(X)`` -> predictive
    mean and variance."""

    def __init__(self, label, data, seed):
        import pyro
        import torch

        from pyro_sparsegp import RBF, SVGP, Gaussian, GPModel
        from pyro_sparsegp.dbk import SVDBK, ExactDBK, ResNet

        pyro.clear_param_store()
        self.label, self.exact, self.seed = label, label.startswith("DBK"), seed
        dtype = torch.float32
        (X, y), D = data["train"], data["train"][0].shape[1]
        self.X, self.y = torch.as_tensor(X, dtype=dtype), torch.as_tensor(y, dtype=dtype)
        correction = not label.endswith("-c")
        if label != "SVGP":
            net = ResNet(D, rank=RANK, dtype=dtype, seed=seed)
            with torch.no_grad():
                variance = INIT_PRIOR_SD**2 / float((net(self.X) ** 2).sum(-1).mean())
        if self.exact:
            self.model = ExactDBK(net, variance=variance, variance_correction=correction)
        else:
            if label == "SVGP":
                Z = harness.inducing_inputs(X, min(NUM_INDUCING, len(X)), seed=seed)
                self.prior = SVGP(RBF(lengthscale=torch.full((D,), math.sqrt(D), dtype=dtype)), torch.as_tensor(Z, dtype=dtype))
            else:
                self.prior = SVDBK(net, variance=variance, variance_correction=correction)
            self.model = GPModel(self.prior, Gaussian(variance=1e-2), num_data=len(X))
        self.batch_size = min(BATCH, len(X))
        self.steps_per_round = 1 if self.exact else len(X) // self.batch_size

    def fit(self, rounds, every, patience, validation):
        """Train with the product's ``fit``: Adam (lr ``LR``) with weight decay on the network only,
        ``rounds`` iterations (exact models, full batch) or epochs (SVI, batches of ``BATCH``),
        ``validation(params)`` every ``every`` rounds, stopping after ``patience`` rounds without
        improvement and ending at the best evaluation's parameters. Returns the ``FitResult``."""
        import pyro_sparsegp as psg

        if patience % every or rounds % every:
            raise ValueError(f"patience ({patience}) and rounds ({rounds}) must be multiples of the evaluation "
                             f"interval ({every}): fit evaluates every {every} rounds only")
        if self.exact:  # the exact objective (moments accumulated in float64), as loss(model, guide, X, y)
            length = {"num_steps": rounds, "loss": lambda model, guide, X, y: -self.model.objective(X, y)}
        else:
            length = {"num_epochs": rounds, "batch_size": self.batch_size}
        groups = None if self.label == "SVGP" else [{"params": "*.net.*", "weight_decay": WEIGHT_DECAY}]
        return psg.fit(self.model.model, self.model.guide, (self.X, self.y), lr=LR, param_groups=groups,
                       validation=validation, eval_every=every * self.steps_per_round, patience=patience // every,
                       seed=self.seed, progress=False, **length)

    def evaluate(self, X):
        import torch

        from pyro_sparsegp import predict_y

        X = torch.as_tensor(X, dtype=self.X.dtype)
        if self.exact:
            return self.model.calibrate(self.X, self.y).predict_y(X)[:2]
        if self.label == "SVGP":
            return self.model.predict_y(X)[:2]
        # M over the training inputs for the corrected predictive (a new object: training goes on unchanged)
        return predict_y(self.prior.calibrate(self.X), self.model.likelihood, X)[:2]


def budget(label, opts):
    """(max iterations or epochs, evaluate every, patience) of model ``label``."""
    return opts["exact"] if label.startswith("DBK") else opts["svi"]


def train(label, data, seed, budget, log=None):
    """Train with early stopping on validation NLL; test metrics at the best evaluation, and the
    training seconds (evaluations excluded) up to it. ``log(text)``, when given, receives a line
    per evaluation."""
    max_rounds, every, patience = budget
    trained = Trained(label, data, seed)
    evaluations, best = [], {"val_nll": math.inf, "rounds": None}
    clock = {"start": time.perf_counter(), "evaluating": 0.0}

    def validation(params):  # Pyro's param store holds the current values
        start = time.perf_counter()
        val = metrics(*trained.evaluate(data["val"][0]), data["val"][1])["nll"]
        evaluations.append(start - clock["start"] - clock["evaluating"])
        rounds = len(evaluations) * every
        if best["rounds"] is None or val < best["val_nll"]:
            best.update(val_nll=val, rounds=rounds, train_seconds=evaluations[-1])
        if log is not None:
            log(f"{label} {rounds}/{max_rounds}: validation NLL {val:.4f}, best {best['val_nll']:.4f} at "
                f"{best['rounds']}, {evaluations[-1]:.0f} s")
        clock["evaluating"] += time.perf_counter() - start
        return val

    trained.fit(max_rounds, every, patience, validation)  # ends at the best evaluation's parameters
    return {**best, **metrics(*trained.evaluate(data["test"][0]), data["test"][1])}


def cell(name, label, seed, opts, log=None):
    """One model and seed of Table 1 (a JSON-ready row): the test metrics at the best validation NLL."""
    data, synthetic = split(name, seed, opts["rows"])
    return {"suite": "dbk", "part": "cell", "dataset": name, "model": label, "seed": seed, "synthetic": synthetic,
            "n": len(data["train"][1]), "threads": harness.threads(), "budget": list(budget(label, opts)),
            **train(label, data, seed, budget(label, opts), log)}


def summarise(cells):
    """Table 1 rows from cells: mean and standard deviation over the seeds of each dataset and
    model (the paper's are over 5), its numbers beside ours."""
    rows = []
    for name in PAPER:
        for label in MODELS:
            runs = [c for c in cells if c["dataset"] == name and c["model"] == label]
            if not runs:
                continue
            row = {"suite": "dbk", "part": "table1", "dataset": name, "model": label,
                   "synthetic": any(c["synthetic"] for c in runs), "n": runs[0]["n"], "seeds": len(runs),
                   "threads": runs[0]["threads"], "budget": list(runs[0]["budget"])}
            for key in ("mae", "rmse", "nll", "train_seconds", "val_nll"):
                values = [run[key] for run in runs]
                row[key], row[f"{key}_sd"] = float(np.mean(values)), float(np.std(values))
            row["paper_mae"], row["paper_rmse"], row["paper_nll"], row["paper_train_seconds"] = PAPER[name][label]
            rows.append(row)
    return rows


def table1(opts):
    return summarise([cell(name, label, seed, opts) for name in PAPER for seed in range(opts["seeds"]) for label in MODELS])


# ---------------------------------------------------------------- tables


SCALING_COLUMNS = [
    ("n", "n", "{:,}"), ("exact DBK value + gradient", "seconds", "{:.4f} s"), ("per point (1 = linear)", "per_point", "{:.2f}"),
    ("GPyTorch exact GP", "seconds_gpytorch", "{:.4f} s"), ("GPyTorch / DBK", "ratio", "{:.1f}"),
]
TABLE1_COLUMNS = [
    ("dataset", "dataset", "{}"), ("model", "model", "{}"), ("seeds", "seeds", "{}"), ("MAE", "mae", "{:.4f}"),
    ("paper MAE", "paper_mae", "{:.4f}"), ("RMSE", "rmse", "{:.4f}"), ("sd", "rmse_sd", "{:.4f}"),
    ("paper RMSE", "paper_rmse", "{:.4f}"), ("NLL", "nll", "{:.4f}"), ("sd", "nll_sd", "{:.4f}"),
    ("paper NLL", "paper_nll", "{:.4f}"), ("time", "train_seconds", "{:.1f} s"), ("paper time", "paper_train_seconds", "{:.1f} s"),
]
COLUMNS = [("part", "part", "{}")] + TABLE1_COLUMNS[:2] + SCALING_COLUMNS + TABLE1_COLUMNS[2:]


def title(rows):
    return f"dbk: exact DBK scaling and Table 1 (pol, protein), {rows[0]['threads']} threads"


def table1_table(table_rows):
    """(title, columns, rows) of the Table 1 part."""
    budgets = {kind: next((tuple(r["budget"]) for r in table_rows if r["model"].startswith("DBK") == exact), None)
               for kind, exact in (("exact", True), ("SVI", False))}
    return (f"dbk Table 1: test metrics on standardised targets at the best validation NLL, mean and sd over seeds "
            f"(max iterations / epochs, evaluate every, patience: exact {budgets['exact']}, SVI {budgets['SVI']}), "
            "the paper's numbers beside ours", TABLE1_COLUMNS, table_rows)


def tables(rows):
    scaling_rows = [r for r in rows if r["part"] == "scaling"]
    first = scaling_rows[0]
    return [
        (f"dbk scaling: median seconds for the exact DBK objective + gradient on the step function, r = {first['rank']}, "
         f"{first['dtype']}, {first['threads']} threads, medians of {first['repeats']} blocks, malloc: {first['malloc']}", SCALING_COLUMNS, scaling_rows),
        table1_table([r for r in rows if r["part"] == "table1"]),
    ]


def run(quick):
    opts = settings(quick)
    return scaling(opts) + table1(opts)


# ---------------------------------------------------------------- Table 1 one cell at a time

CELLS = harness.REPO / "outputs" / "benchmarks" / "dbk_cells.jsonl"


def main(argv=None):
    """``python -m benchmarks.dbk cell DATASET MODEL SEED [--quick] [--threads N] [--out PATH]``
    trains one model of Table 1 for one seed and appends its row (a JSON line) to PATH;
    ``python -m benchmarks.dbk table [--out PATH]`` prints Table 1 from the rows in PATH (the last
    one of each dataset, model and seed). The cells are the full suite's Table 1 in parts that can
    run side by side."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.dbk", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("cell", help="train one model for one seed")
    one.add_argument("dataset", choices=sorted(PAPER))
    one.add_argument("model", choices=MODELS)
    one.add_argument("seed", type=int)
    one.add_argument("--quick", action="store_true", help="the quick budgets")
    one.add_argument("--threads", type=int, default=1, help="threads for torch (default 1)")
    one.add_argument("--out", default=str(CELLS))
    table = commands.add_parser("table", help="Table 1 from the cells")
    table.add_argument("--out", default=str(CELLS))
    timing = commands.add_parser("scaling", help="the scaling rows as JSON (what scaling() runs in a child process)")
    timing.add_argument("opts", type=json.loads, help="settings(quick) as JSON")
    args = parser.parse_args(argv)
    if args.command == "scaling":
        print(json.dumps(_scaling(args.opts)))
        return
    if args.command == "table":
        with open(args.out) as f:
            rows = [json.loads(line) for line in f]
        latest = {(r["dataset"], r["model"], r["seed"]): r for r in rows if r.get("part") == "cell"}
        title, columns, table_rows = table1_table(summarise(list(latest.values())))
        print(harness.markdown_table(columns, table_rows, title=title))
        return
    if args.threads < 1:
        parser.error(f"--threads must be a positive integer, got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)  # not harness.pin_threads: cells side by side need different CPUs
    row = cell(args.dataset, args.model, args.seed, settings(args.quick), log=lambda text: print(text, file=sys.stderr, flush=True))
    command = " ".join(["python", "-m", "benchmarks.dbk", *(sys.argv[1:] if argv is None else argv)])
    harness.write_jsonl(args.out, [row], {**harness.environment(), "quick": args.quick, "command": command})
    print(json.dumps(row))


if __name__ == "__main__":
    main()
