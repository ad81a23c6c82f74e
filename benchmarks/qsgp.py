"""Suite ``qsgp``: quadruply stochastic GPs (Evans and Nair, 2020), five parts.

* ``speed``: median seconds per step of ``fit`` (float32, batch 500, both backends) and the peak
  resident memory while building and stepping, on 1,000,000 rows of flights_3m (kin40k where it
  is absent), for ``GPModel(QSGP(RBF, m, num_dense=10), Gaussian())`` with
  ``QuadruplyStochasticELBO(num_basis, control_variates=500 rows)`` (``num_basis`` 1,000 quick, 10,000
  full; ``m`` 10^4 and 10^6 quick, 10^3 to 10^7 full), beside the exact-in-``m`` loss (``Trace_ELBO``)
  at the smallest ``m`` and our SVGP with 512 inducing points. AdaGrad on the q tables makes
  ``fit`` step by rows (gathered, differentiated and updated in place), so nothing in a step
  grows with ``m``.
* ``inducing``: the paper's Table 3 protocol (App. I.2) on kin40k (``inducing_n`` random training
  rows: 5,000 quick, 20,000 full): QSGP-0 with an inducing point at every row (``m = n``),
  hyperparameters and noise held at an exact GP's on 1,000 rows, C's diagonal at Proposition 1's
  optimum from the start, ``num_basis`` = batch (1,000
  quick, 3,000 full, as the paper), the data and Nystrom control variates on 200 support rows,
  AdaGrad on the q tables (rates :data:`INDUCING_LR`, Pyro; full: :data:`INDUCING_LR_FULL`,
  NumPyro), augmented prediction: test RMSE and NLPD after several numbers of
  steps; then the same on the whitened basis (``whiten=True``, q_mu's rate
  :data:`INDUCING_LR_WHITENED`), and on it with the snapshot control variate instead of the
  support rows' (:data:`INDUCING_SNAPSHOT`; fewer steps: 300 and 1,000 quick, 1,000 and 3,000
  full), beside the exact GP on the same rows with the same hyperparameters (the posterior mean
  QSGP-0 converges to) and our SVGP (512 inducing inputs, batch 500, the same hyperparameters held)
  trained for as many seconds as QSGP-0 (batch 500).
* ``accuracy``: the paper's Table 2 protocol (Sec. 4, App. I.1) on kin40k, protein and
  keggdirected (the paper's "kegg"; split 0; synthetic stand-ins where the data are absent),
  standardised: every model starts from the hyperparameters of an exact GP fitted to 1,000
  random training rows (:func:`~benchmarks.harness.exact_gp_hyperparameters`); QSGP-0 (mean-field)
  (twice: C's diagonal from the prior, and from Proposition 1's optimum, :func:`accuracy_models`)
  and QSGP-100 (100 dense columns) on ``m`` random Fourier features of an ARD squared exponential,
  ``num_basis`` per draw, control variates on 500 support rows, AdaGrad (lr 0.1) for the q tables
  and Adam (``hyper_lr``) for the hyperparameters and noise, both rates decaying tenfold over the
  run, the hyperparameters held for its first tenth; beside them our SVGP with 512 inducing
  points (Adam, lr 0.01) trained for as many seconds as QSGP-0 (building and compiling
  included), and the paper's RMSE and MNLP (:data:`TABLE2`). Test RMSE and NLPD in standardised
  units, one split. Quick: ``m = 10^4``, ``num_basis = 1000``, 2,000 steps, Adam ``10^-3``; full:
  ``m = 10^5``, on the CPU ``num_basis = 2000`` and 10,000 steps (hours here), on a GPU
  (``--device cuda``) the paper's ``num_basis = 10^4``, ``10^5`` steps and Adam ``10^-5``. NumPyro
  on a GPU (its compiled step is the fast one there), Pyro on the CPU.
* ``convergence``: is the Table 2 gap the number of steps? QSGP-0 at the paper's ``m`` (10^5)
  and ``num_basis`` (10^4), from the exact GP's hyperparameters, through the paper's schedule
  (AdaGrad 0.1 and Adam 10^-5, both decaying tenfold over the run, the hyperparameters held for
  its first tenth), with the test RMSE and NLPD at several steps along it; then our SVGP with 512
  inducing inputs, scored at the same seconds (the issue's equal wall-clock comparison). Full:
  kin40k, protein and keggdirected, the paper's 10^5 steps at its batch and control-variate rows
  of 500 (NumPyro: 0.15 s a step on this CPU, 0.09 s with glibc's settings of docs/usage.md,
  "Training": 2.5 hours a set, and as long again for its SVGP);
  quick: kin40k, 5,000 steps at 100. With ``--state DIR`` each run keeps its checkpoint and rows
  in ``DIR`` and, stopped, continues from them when the command runs again
  (:class:`~benchmarks.harness.Resumable`).
* ``variance``: the paper's control-variate study (Sec. 4.2, Fig. 1) on kin40k: ``m`` random
  Fourier features (10^4) of the exact GP's squared exponential, ``mu`` one draw from the prior,
  ``n~ = m~ = 500``; for each number of support rows ``n_bar`` (0: no control variate), the
  variance over ``evaluations`` draws (1,000 full, 300 quick) of Theorem 1's data quadratic
  ``|Phi mu|^2`` as estimated, and of its gradient with respect to ``mu`` (per entry, averaged over
  the ``m`` entries), both relative to ``n_bar = 0``; the same index draws for every ``n_bar`` and
  nested support rows. Torch, float64: the estimator's statistics, not its speed.
"""
import gc
import time

import numpy as np

from . import harness

PARTS = ("speed", "accuracy", "inducing", "convergence", "variance")
BATCH, NUM_DENSE, SUPPORT = 500, 10, 500
HYPER_LR = 1e-3  # the paper's 1e-5 suits its 10^5 steps; shorter runs take a larger rate
ACCURACY_SETS, TABLE2_DENSE = ("kin40k", "protein", "keggdirected"), 100
PAPER_STEPS, PAPER_HYPER_LR = 100_000, 1e-5  # Table 2's schedule: its steps and Adam's rate
# Evans and Nair (2020), Table 2: RMSE (mean of 5 splits) and MNLP (the first split), standardised
# targets; their SVGP is GPflow's with 512 inducing inputs and the hyperparameters learnt
TABLE2 = {
    "kin40k": {"QSGP-0": (0.174, 0.135), "QSGP-100": (0.175, 0.139), "SVGP-512": (0.247, 0.055)},
    "protein": {"QSGP-0": (0.602, 1.34), "QSGP-100": (0.602, 1.34), "SVGP-512": (0.542, 1.06)},
    "keggdirected": {"QSGP-0": (0.135, -0.821), "QSGP-100": (0.135, -0.794), "SVGP-512": (0.124, -0.953)},
}
INDUCING_LR = (0.03, 0.5)  # AdaGrad's rates for q_mu and q_log_diag (the paper gives none)
INDUCING_LR_FULL = (0.01, 0.5)  # at 20,000 rows q_mu's 0.03 ran away at the third step (RESULTS)
INDUCING_LR_WHITENED = 0.1  # q_mu's rate on the whitened basis (ahead of 0.03, 0.3 and 1 at 5,000 rows: RESULTS)
INDUCING_SNAPSHOT = (5, 0.3)  # steps between snapshots, q_mu's rate (the gradient's noise fades: a larger rate)


def settings(quick):
    if harness.tiny():
        return {"ms": (200,), "num_basis": 20, "repeats": 2, "block_seconds": 0.05, "warmup": 1, "svgp_M": 16,
                "accuracy_sets": ("kin40k",), "accuracy_dense": 2, "hyper_lr": HYPER_LR,
                "accuracy_m": 200, "accuracy_num_basis": 20, "steps": 3, "support": 20, "batch": 50, "exact_points": 50,
                "inducing_n": 300, "inducing_num_basis": 50, "inducing_support": 20, "inducing_steps": (2, 4),
                "inducing_snapshot_steps": (2, 4),
                "inducing_lr": INDUCING_LR, "inducing_backend": "pyro",
                "inducing_lr_whitened": INDUCING_LR_WHITENED,
                "convergence_sets": ("kin40k",), "convergence_m": 200, "convergence_num_basis": 20, "convergence_batch": 20,
                "convergence_steps": (2, 4),
                "convergence_checkpoint_every": 1,
                "variance_m": 200, "variance_draws": 20, "variance_basis": 20, "variance_supports": (0, 10, 40),
                "evaluations": 20}
    if quick:
        return {"ms": (10_000, 1_000_000), "num_basis": 1000, "repeats": 3, "block_seconds": 0.3, "warmup": 2,
                "svgp_M": 512, "accuracy_sets": ACCURACY_SETS, "accuracy_dense": TABLE2_DENSE, "hyper_lr": HYPER_LR,
                "accuracy_m": 10_000, "accuracy_num_basis": 1000, "steps": 2000, "support": SUPPORT,
                "batch": BATCH, "exact_points": 1000, "inducing_n": 5000, "inducing_num_basis": 1000,
                "inducing_support": 200, "inducing_steps": (1000, 3000), "inducing_lr": INDUCING_LR,
                "inducing_snapshot_steps": (300, 1000),
                "inducing_lr_whitened": INDUCING_LR_WHITENED,
                "inducing_backend": "pyro",
                "convergence_sets": ("kin40k",), "convergence_m": 100_000, "convergence_num_basis": 10_000,
                "convergence_batch": 100,
                "convergence_steps": (1250, 2500, 5000), "convergence_checkpoint_every": 250,
                "variance_m": 10_000, "variance_draws": 500, "variance_basis": 500,
                "variance_supports": (0, 100, 300, 500, 1000), "evaluations": 300}
    return {"ms": (1_000, 10_000, 100_000, 1_000_000, 10_000_000), "num_basis": 10_000, "repeats": 5,
            "block_seconds": 1.0, "warmup": 2,
            "svgp_M": 512, "accuracy_sets": ACCURACY_SETS, "accuracy_dense": TABLE2_DENSE, "accuracy_m": 100_000,
            **({"accuracy_num_basis": 2000, "steps": 10_000, "hyper_lr": HYPER_LR} if harness.DEVICE == "cpu"
               else {"accuracy_num_basis": 10_000, "steps": PAPER_STEPS, "hyper_lr": PAPER_HYPER_LR}),  # on a GPU
            "support": SUPPORT,
            "batch": BATCH, "exact_points": 1000, "inducing_n": 20_000, "inducing_num_basis": 3000,
            "inducing_support": 200, "inducing_steps": (2000, 10_000, 30_000), "inducing_lr": INDUCING_LR_FULL,
            "inducing_snapshot_steps": (1000, 3000),  # 0.5 s a step at 20,000 rows (RESULTS)
            "inducing_lr_whitened": INDUCING_LR_WHITENED,
            "inducing_backend": "numpyro",  # 0.04 s a step at 20,000 rows with glibc's settings (docs/usage.md)
            "convergence_sets": ACCURACY_SETS, "convergence_m": 100_000, "convergence_num_basis": 10_000,
            "convergence_batch": BATCH,  # 0.09-0.15 s a step on this CPU: 2.5-4 hours, which --state can spread over runs
            "convergence_steps": (2500, 5000, 10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000,
                                  90_000, PAPER_STEPS), "convergence_checkpoint_every": 500,
            "variance_m": 10_000, "variance_draws": 500, "variance_basis": 500,
            "variance_supports": (0, 50, 100, 200, 300, 500, 1000, 2000), "evaluations": 1000}


def run(quick, parts=PARTS):
    opts = settings(quick)
    rows = speed_rows(opts) if "speed" in parts else []
    if "accuracy" in parts:
        rows += accuracy_rows(opts)
    if "inducing" in parts:
        rows += inducing_rows(opts)
    if "convergence" in parts:
        rows += convergence_rows(opts)
    if "variance" in parts:
        rows += variance_rows(opts)
    return rows


def _speed_title(row):
    return (f"qsgp speed: seconds per fit step, {row['dataset']}, num_basis {row['num_basis']}, batch "
            f"{row['batch']}, control variates on {SUPPORT} rows, {row['dtype']}, {row['threads']} threads; "
            "peak: the resident memory's high-water mark while building and stepping, above the resident set before")


BACKEND_NAMES = {"pyro": "Pyro", "numpyro": "NumPyro"}


def _accuracy_title(row):
    return (f"qsgp accuracy (the paper's Table 2 protocol): split 0, {BACKEND_NAMES[row['backend']]} on "
            f"{row['device']}, m = {row['m']} random Fourier features (ARD SE), num_basis {row['num_basis']}, "
            f"control variates on {row['support']} rows, AdaGrad 0.1 (q) and Adam {row['hyper_lr']:g} (held for "
            f"the first tenth), both decaying tenfold, {row['steps']} steps; SVGP: Adam 0.01 for as many seconds "
            f"as QSGP-0; all from an exact GP's hyperparameters, batch {row['batch']}, {row['dtype']}, "
            f"{row['threads']} threads; standardised target units; the paper's RMSE is the mean of 5 splits, its "
            "MNLP the first split's")


def _inducing_title(row):
    backend = BACKEND_NAMES[row.get("backend", "pyro")]  # rows from before the part named its backend: Pyro
    return (f"qsgp inducing points (the paper's Table 3 protocol): {row['dataset']}, {backend}, {row['n']} training "
            f"rows, QSGP-0 with an inducing point at each (m = n), hyperparameters (noise too) held at an exact "
            f"GP's on 1,000 rows, C's diagonal from Proposition 1's optimum, num_basis = batch = "
            f"{row['num_basis']}, data and Nystrom control variates on {row['support']} rows, AdaGrad "
            f"{row['lr'][0]:g} (q_mu) and {row['lr'][1]:g} (q_log_diag), augmented prediction; beside it the "
            f"exact GP on the same rows and hyperparameters and our SVGP with the same hyperparameters held, "
            f"trained for as many seconds; {row['dtype']}, {row['threads']} threads; standardised target units")


def _convergence_title(row):
    return (f"qsgp convergence (the paper's Table 2 protocol along one run per set): split 0, "
            f"{BACKEND_NAMES[row['backend']]} on {row['device']}, QSGP-0 on m = {row['m']} random Fourier "
            f"features (ARD SE), num_basis {row['num_basis']}, batch and control-variate rows {row['batch']}, from "
            f"an exact GP's hyperparameters, AdaGrad 0.1 (q) and Adam {row['hyper_lr']:g} (held for the first "
            f"tenth), both decaying tenfold over {row['total_steps']} steps; SVGP: Adam 0.01 from the same "
            f"hyperparameters, scored at QSGP-0's seconds; {row['dtype']}, {row['threads']} threads; "
            "standardised target units")


def _variance_title(row):
    return (f"qsgp control variates (the paper's Fig. 1 study): {row['dataset']}, m = {row['m']} random Fourier "
            f"features of the exact GP's squared exponential, mu a prior draw, n~ = {row['num_rows']}, m~ = "
            f"{row['num_basis']}, {row['evaluations']} evaluations per row (the same draws in every row), "
            f"{row['dtype']}; variances relative to no control variate; z: the estimates' mean against the "
            f"exact |Phi mu|^2 in standard errors")


# part -> (title of its first row, columns)
TABLES = {
    "speed": (_speed_title, [("model", "model", "{}"), ("m", "m", "{}"), ("loss", "loss", "{}"),
                             ("Pyro", "seconds_pyro", "{:.4f} s"), ("NumPyro (jit)", "seconds_numpyro", "{:.4f} s"),
                             ("Pyro peak", "peak_mb_pyro", "{:.0f} MB"),
                             ("NumPyro peak", "peak_mb_numpyro", "{:.0f} MB")]),
    "accuracy": (_accuracy_title, [("dataset", "dataset", "{}"), ("model", "model", "{}"), ("steps", "steps", "{}"),
                                   ("RMSE", "rmse", "{:.4f}"), ("NLPD", "nlpd", "{:.4f}"),
                                   ("paper's RMSE", "paper_rmse", "{:.3f}"), ("paper's MNLP", "paper_mnlp", "{:.3f}"),
                                   ("seconds", "seconds", "{:.0f}")]),
    "inducing": (_inducing_title, [("model", "model", "{}"), ("steps", "steps", "{}"), ("RMSE", "rmse", "{:.4f}"),
                                   ("NLPD", "nlpd", "{:.4f}"), ("seconds", "seconds", "{:.0f}")]),
    "convergence": (_convergence_title, [("dataset", "dataset", "{}"), ("model", "model", "{}"),
                                         ("steps", "steps", "{}"), ("RMSE", "rmse", "{:.4f}"),
                                         ("NLPD", "nlpd", "{:.4f}"), ("paper's RMSE", "paper_rmse", "{:.3f}"),
                                         ("paper's MNLP", "paper_mnlp", "{:.3f}"), ("seconds", "seconds", "{:.0f}")]),
    "variance": (_variance_title, [("support rows n_bar", "support", "{}"),
                                   ("variance of the estimate", "value_ratio", "{:.4f}"),
                                   ("variance of its gradient (mean over entries)", "gradient_ratio", "{:.4f}"),
                                   ("z", "z", "{:+.2f}")]),
}


def tables(rows):
    out = []
    for part, (title, columns) in TABLES.items():
        chosen = [row for row in rows if row["part"] == part]
        if chosen:
            out.append((title(chosen[0]), columns, chosen))
    return out


# -- the models, built alike in both backends -------------------------------------------------------


def _lib(backend):
    if backend == "pyro":
        import torch

        import pyro_sparsegp as lib

        return lib, harness.tensor, torch.optim.Adagrad, {}
    import jax.numpy as jnp
    import numpyro

    import numpyro_sparsegp as lib

    return lib, (lambda a: jnp.asarray(np.asarray(a), dtype=jnp.float32)), numpyro.optim.Adagrad, {"momentum": 0.0}


def qsgp_fit(backend, X, y, m, num_dense, num_basis, support, batch, loss="quadruply stochastic", seed=0,
             hypers=None, num_steps=None, hyper_lr=HYPER_LR, optimal_diagonal=False, **extra):
    """``(FitSteps, model)`` of a QSGP (ARD squared exponential). ``hypers``: initial
    ``(lengthscales, variance, noise)`` (default 1, 1, 0.1); with ``num_steps``, the paper's schedule
    (Sec. 4): AdaGrad's rate decays tenfold over the run, and the hyperparameters (Adam, lr
    ``hyper_lr``, the same decay) are held for the first tenth of it. ``optimal_diagonal``: C's
    diagonal columns start at Proposition 1's optimum for the initial hyperparameters."""
    lib, array, adagrad, momentum = _lib(backend)
    if backend == "pyro":
        import pyro

        pyro.clear_param_store()
    lengthscales, variance, noise = hypers or (np.ones(X.shape[1]), 1.0, 0.1)
    kernel = lib.RBF(lengthscale=array(lengthscales), variance=array(variance))
    prior = lib.QSGP(kernel, m, X.shape[1], num_dense=num_dense, seed=seed)
    if optimal_diagonal:
        prior.set_optimal_diagonal(array(X), noise)
    model = lib.GPModel(prior, lib.Gaussian(variance=array(noise)), num_data=len(X))
    objective, groups, lr = None, None, 0.01
    if loss == "quadruply stochastic":
        rows = np.random.default_rng(seed).choice(len(X), support, replace=False)
        objective = lib.QuadruplyStochasticELBO(num_basis=num_basis, control_variates=array(X[rows]))
        groups = [{"params": "gp.q_*", "optimizer": adagrad, "lr": 0.1, **momentum}]
        if num_steps is not None:
            hold = num_steps // 10

            def decay(t):
                return 0.1 ** (t / num_steps)

            groups[0]["lr_schedule"] = decay
            groups.append({"params": "*", "lr_schedule": lambda t: (t >= hold) * decay(t)})
            lr = hyper_lr
    steps = harness.FitSteps(lib.fit, model.model, model.guide, (array(X), array(y)), batch_size=batch, lr=lr,
                             seed=seed, loss=objective, param_groups=groups, **extra)
    return steps, model


def inducing_fit(backend, X, y, num_basis, support, batch, hypers, lr=(0.1, 0.5), seed=0, whiten=False,
                 snapshot_every=None, **extra):
    """``(FitSteps, model)`` of the paper's Table 3 model (App. I.2): QSGP-0 with an inducing point
    at every row of ``X`` (``Phi = S = K``, the ARD squared exponential at ``hypers``
    ``(lengthscales, variance, noise)``, held with the noise), C's diagonal at Proposition 1's
    optimum from the start, Proposition 4's augmented variance, the data and Nystrom control
    variates on ``support`` rows, AdaGrad at ``lr`` (``q_mu``, ``q_log_diag``); ``whiten``: on the
    rotated functions ``L^-1 k(Z, .)`` with ``S = I`` instead (no Nystrom rows); ``snapshot_every``:
    the snapshot control variate over all the rows, taken that often, instead of the support rows'."""
    lib, array, adagrad, momentum = _lib(backend)
    if backend == "pyro":
        import pyro

        pyro.clear_param_store()
    lengthscales, variance, noise = hypers
    kernel = lib.RBF(lengthscale=array(lengthscales), variance=array(variance))
    prior = lib.QSGP(kernel, inducing_points=array(X), augment_noise=noise, whiten=whiten)
    prior.set_optimal_diagonal(array(X), noise)  # exact while the hyperparameters are held (Proposition 1)
    model = lib.GPModel(prior, lib.Gaussian(variance=array(noise)), num_data=len(X))
    rows = np.random.default_rng(seed).choice(len(X), support, replace=False)
    if snapshot_every is None:
        objective = lib.QuadruplyStochasticELBO(num_basis=num_basis, control_variates=array(X[rows]))
    else:
        objective = lib.QuadruplyStochasticELBO(num_basis=num_basis, snapshot=(array(X), array(y)),
                                                snapshot_every=snapshot_every)
    groups = [{"params": "gp.q_log_diag", "optimizer": adagrad, "lr": lr[1], **momentum},
              {"params": "gp.q_*", "optimizer": adagrad, "lr": lr[0], **momentum},
              {"params": "*", "lr_schedule": lambda t: 0.0}]  # the noise held
    steps = harness.FitSteps(lib.fit, model.model, model.guide, (array(X), array(y)), batch_size=batch,
                             seed=seed, loss=objective, param_groups=groups, **extra)
    return steps, model


def svgp_fit(backend, X, y, M, batch, seed=0, hypers=None, hold=False, **extra):
    """``(FitSteps, model)`` of our SVGP with ``M`` random training rows as its initial inducing
    inputs (Adam, lr 0.01; with ``hold`` the kernel and the noise held at ``hypers``, the inducing
    inputs learnt); ``extra``: more arguments of ``fit``."""
    lib, array, _, _ = _lib(backend)
    if backend == "pyro":
        import pyro

        pyro.clear_param_store()
    lengthscales, variance, noise = hypers or (np.ones(X.shape[1]), 1.0, 0.1)
    kernel = lib.RBF(lengthscale=array(lengthscales), variance=array(variance))
    model = lib.GPModel(lib.SVGP(kernel, array(harness.inducing_inputs(X, M, seed))), lib.Gaussian(variance=array(noise)),
                        num_data=len(X))
    groups = [{"params": ["gp.kernel.*", "likelihood.*"], "lr_schedule": lambda t: 0.0}] if hold else None
    return harness.FitSteps(lib.fit, model.model, model.guide, (array(X), array(y)), batch_size=batch, lr=0.01,
                            seed=seed, param_groups=groups, **extra), model


# -- speed ---------------------------------------------------------------------------------------


def speed_problem():
    """``(name, X, y)``: 1,000,000 rows of flights_3m standardised (the issue's set), or kin40k's
    training rows where flights_3m is absent (tiny runs: always kin40k)."""
    from sparsegp_common.data.datasets import load_flights

    if not harness.tiny():
        try:
            X, y = load_flights(num_rows=1_000_000, seed=0, data_dir=harness.data_dir())
        except (FileNotFoundError, ValueError):
            pass
        else:
            X = (X - X.mean(0)) / X.std(0)
            return "flights_3m (1M rows)", X, (y - y.mean()) / y.std()
    problem = harness.regression_problem("kin40k")
    return "kin40k" + (" (synthetic)" if problem["synthetic"] else ""), problem["X_train"], problem["y_train"]


def speed_rows(opts):
    dataset, X, y = speed_problem()
    configs = [(f"QSGP-{NUM_DENSE}", m, "quadruply stochastic") for m in opts["ms"]]
    configs.append((f"QSGP-{NUM_DENSE}", opts["ms"][0], "Trace_ELBO (exact in m)"))
    configs.append((f"SVGP-{opts['svgp_M']}", opts["svgp_M"], "Trace_ELBO"))
    rows = []
    for label, m, loss in configs:
        seconds, peak = {}, {}
        for backend in ("pyro", "numpyro"):
            gc.collect()
            resident, _ = harness.memory()
            reset = harness.reset_peak()
            if label.startswith("SVGP"):
                steps, _ = svgp_fit(backend, X, y, m, opts["batch"])
            else:
                steps, _ = qsgp_fit(backend, X, y, m, NUM_DENSE, opts["num_basis"], opts["support"], opts["batch"],
                                    loss="quadruply stochastic" if loss == "quadruply stochastic" else None)
            blocks = harness.time_steps({backend: steps.step}, opts["repeats"], opts["block_seconds"], opts["warmup"])
            _, high = harness.memory()
            steps.close()
            del steps
            seconds[backend] = harness.median(blocks[backend])
            peak[backend] = high - resident if reset and high is not None else float("nan")
        rows.append({"suite": "qsgp", "part": "speed", "dataset": dataset, "model": label, "m": m, "loss": loss,
                     "num_basis": opts["num_basis"], "batch": opts["batch"], "seconds_pyro": seconds["pyro"],
                     "seconds_numpyro": seconds["numpyro"], "peak_mb_pyro": peak["pyro"],
                     "peak_mb_numpyro": peak["numpyro"], "dtype": "float32", "threads": harness.threads()})
    return rows


# -- accuracy ------------------------------------------------------------------------------------


def accuracy_backend():
    """NumPyro on a GPU (its compiled step is the fast one there), Pyro on the CPU."""
    return "pyro" if harness.DEVICE == "cpu" else "numpyro"


def predict(backend, model, X, params=None):
    """``(mean, var)`` of ``p(y*)`` at ``X`` as float64 NumPy arrays, at ``params`` (None: the values
    the last ``fit`` left; in the middle of a NumPyro fit, pass its current ones)."""
    if backend == "pyro":
        import torch

        with torch.no_grad():
            prediction = model.predict_y(harness.tensor(X), batch_size=1000, params=params)
        return tuple(a.double().cpu().numpy() for a in (prediction.mean, prediction.variance))
    import jax.numpy as jnp

    prediction = model.predict_y(jnp.asarray(X, dtype=jnp.float32), batch_size=1000, params=params)
    return tuple(np.asarray(a, dtype=np.float64) for a in (prediction.mean, prediction.variance))


def scores(mean, var, y):
    """Test RMSE and NLPD of ``y`` under ``N(mean, var)``, as row entries."""
    return {"rmse": float(np.sqrt(np.mean((mean - y) ** 2))), "nlpd": harness.gaussian_nlpd(mean, var, y)}


def steps_until(steps, start, seconds):
    """Step ``steps`` (at least once) until ``seconds`` after ``start``; returns how many steps."""
    done = 0
    while done < 1 or time.perf_counter() - start < seconds:
        steps.step()
        done += 1
    return done


def step_through(steps, checkpoints):
    """Step ``steps`` (a :class:`~benchmarks.harness.FitSteps`) up to each of the increasing step
    counts ``checkpoints``, yielding each on reaching it; a fit resumed from a checkpoint skips
    those it has passed."""
    for checkpoint in checkpoints:
        while steps.state is None or steps.state.step < checkpoint:
            steps.step()
        if steps.state.step == checkpoint:
            yield checkpoint


def accuracy_models(opts):
    """``(label, num_dense, optimal_diagonal, the paper's row)`` of the accuracy part, in order: the
    SVGP last (it trains for QSGP-0's seconds). The paper does not say how C started; the second
    row starts its diagonal columns at Proposition 1's optimum (exact while the hyperparameters are
    held), so that its predictive variances are those of a converged diagonal."""
    dense = opts["accuracy_dense"]
    return (("QSGP-0", 0, False, "QSGP-0"), ("QSGP-0, C's diagonal at Proposition 1", 0, True, "QSGP-0"),
            (f"QSGP-{dense}", dense, False, f"QSGP-{TABLE2_DENSE}"), (f"SVGP-{opts['svgp_M']}", None, False, "SVGP-512"))


def accuracy_rows(opts):
    backend, rows = accuracy_backend(), []
    for name in opts["accuracy_sets"]:
        problem = harness.regression_problem(name)
        X, y, Xt, yt, scaler = (problem[k] for k in ("X_train", "y_train", "X_test", "y_test", "y_scaler"))
        yt_std = scaler.transform(yt)
        hypers = harness.exact_gp_hyperparameters(X, y, num_points=opts["exact_points"])
        budget = None  # QSGP-0's seconds, the SVGP's budget
        for label, num_dense, optimal_diagonal, paper in accuracy_models(opts):
            start = time.perf_counter()
            if num_dense is None:
                steps, model = svgp_fit(backend, X, y, opts["svgp_M"], opts["batch"], hypers=hypers)
                done = steps_until(steps, start, budget)
            else:
                steps, model = qsgp_fit(backend, X, y, opts["accuracy_m"], num_dense, opts["accuracy_num_basis"],
                                        opts["support"], opts["batch"], hypers=hypers, num_steps=opts["steps"],
                                        hyper_lr=opts["hyper_lr"], optimal_diagonal=optimal_diagonal)
                for done in range(1, opts["steps"] + 1):
                    steps.step()
            steps.close()
            seconds = time.perf_counter() - start
            budget = budget or seconds
            mean, var = predict(backend, model, Xt)
            rows.append({"suite": "qsgp", "part": "accuracy", "dataset": name, "synthetic": problem["synthetic"],
                         "backend": backend, "device": harness.device_name(), "model": label,
                         "m": opts["accuracy_m"] if num_dense is not None else opts["svgp_M"],
                         "num_basis": opts["accuracy_num_basis"], "support": opts["support"], "steps": done,
                         "seconds": seconds, "hyper_lr": opts["hyper_lr"], **scores(mean, var, yt_std),
                         "paper_rmse": TABLE2[name][paper][0],
                         "paper_mnlp": TABLE2[name][paper][1], "batch": opts["batch"], "dtype": "float32",
                         "threads": harness.threads()})
    return rows


# -- inducing points at every training row (Table 3) ---------------------------------------------------


def inducing_rows(opts):
    problem = harness.regression_problem("kin40k")
    X, y, Xt, yt, scaler = (problem[k] for k in ("X_train", "y_train", "X_test", "y_test", "y_scaler"))
    yt_std = scaler.transform(yt)
    hypers = harness.exact_gp_hyperparameters(X, y, num_points=opts["exact_points"])
    n = min(opts["inducing_n"], len(X))
    rows = np.random.default_rng(0).choice(len(X), n, replace=False)
    X, y = X[rows], y[rows]
    backend = opts["inducing_backend"]
    base = {"suite": "qsgp", "part": "inducing", "dataset": "kin40k", "synthetic": problem["synthetic"], "n": n,
            "num_basis": opts["inducing_num_basis"], "support": opts["inducing_support"], "lr": opts["inducing_lr"],
            "backend": backend, "dtype": "float32", "threads": harness.threads()}
    start = time.perf_counter()
    mean, var = harness.exact_gp_predict(X, y, Xt, hypers)
    out = [{**base, "model": f"exact GP (n = {n})", "steps": 0, "seconds": time.perf_counter() - start,
            **scores(mean, var, yt_std)}]
    lr, rate = opts["inducing_lr"], opts["inducing_lr_whitened"]
    every, snapshot_rate = INDUCING_SNAPSHOT
    runs = (("QSGP-0", False, lr, None, opts["inducing_steps"]),
            (f"QSGP-0, whitened (AdaGrad {rate:g} on q_mu)", True, (rate, lr[1]), None, opts["inducing_steps"]),
            (f"QSGP-0, whitened, snapshot every {every} (AdaGrad {snapshot_rate:g} on q_mu)", True,
             (snapshot_rate, lr[1]), every, opts["inducing_snapshot_steps"]))
    for label, whiten, rates, snapshot_every, checkpoints in runs:
        start = time.perf_counter()
        steps, model = inducing_fit(backend, X, y, opts["inducing_num_basis"], opts["inducing_support"],
                                    opts["inducing_num_basis"], hypers, lr=rates, whiten=whiten,
                                    snapshot_every=snapshot_every)
        for done in step_through(steps, checkpoints):
            mean, var = predict(backend, model, Xt, steps.params)
            out.append({**base, "model": label, "steps": done, "seconds": time.perf_counter() - start,
                        **scores(mean, var, yt_std)})
        steps.close()
        if not whiten:
            budget = out[-1]["seconds"]
    # our SVGP with the same hyperparameters held, for as long as QSGP-0 (on the kernel functions) trained
    start = time.perf_counter()
    steps, model = svgp_fit(backend, X, y, opts["svgp_M"], opts["batch"], hypers=hypers, hold=True)
    done = steps_until(steps, start, budget)
    steps.close()
    mean, var = predict(backend, model, Xt)
    out.append({**base, "model": f"SVGP-{opts['svgp_M']} (held, same seconds)", "steps": done,
                "seconds": time.perf_counter() - start, **scores(mean, var, yt_std)})
    return out


# -- one long run of the Table 2 protocol ------------------------------------------------------------


def convergence_rows(opts, backend="numpyro"):
    """QSGP-0's test RMSE and NLPD after each of ``convergence_steps`` steps of one run of the
    paper's Table 2 schedule (see the module docstring) on each of ``convergence_sets``, then our
    SVGP's at each of those rows' seconds (:func:`equal_time_run`), in ``backend`` (NumPyro's
    step is the faster on this CPU too since its ``cos`` is a polynomial there). The QSGP runs
    come first: with ``--state`` the part spreads over several processes."""
    problems = {name: convergence_problem(name, opts) for name in opts["convergence_sets"]}
    runs = {name: convergence_run(opts, backend, problem) for name, problem in problems.items()}
    return [row for rows in runs.values() for row in rows] + [
        row for name, problem in problems.items()
        for row in equal_time_run(opts, backend, problem, [r["seconds"] for r in runs[name]])]


def convergence_problem(name, opts):
    """The set ``name``'s split 0, standardised (test targets too), and the exact GP's
    hyperparameters on ``exact_points`` of its rows, as the convergence part's runs take them."""
    problem = harness.regression_problem(name)
    return {"name": name, "X": problem["X_train"], "y": problem["y_train"], "Xt": problem["X_test"],
            "yt": problem["y_scaler"].transform(problem["y_test"]), "synthetic": problem["synthetic"],
            "hypers": harness.exact_gp_hyperparameters(problem["X_train"], problem["y_train"],
                                                       num_points=opts["exact_points"])}


def _convergence_base(opts, backend, problem, model, paper):
    return {"suite": "qsgp", "part": "convergence",
            "dataset": problem["name"] + (" (synthetic)" if problem["synthetic"] else ""), "backend": backend,
            "device": harness.device_name(), "model": model, "batch": opts["convergence_batch"],
            "paper_rmse": TABLE2[problem["name"]][paper][0], "paper_mnlp": TABLE2[problem["name"]][paper][1],
            "dtype": "float32", "threads": harness.threads()}


def _resumable(name, every, backend):
    """The run's :class:`~benchmarks.harness.Resumable` with ``--state``, else None."""
    return None if harness.STATE is None else harness.Resumable(name, every, backend)


def convergence_run(opts, backend, problem):
    """The QSGP-0 rows of :func:`convergence_rows` on one ``problem``."""
    checkpoints, batch, m = opts["convergence_steps"], opts["convergence_batch"], opts["convergence_m"]
    base = {**_convergence_base(opts, backend, problem, "QSGP-0", "QSGP-0"), "m": m,
            "num_basis": opts["convergence_num_basis"], "total_steps": checkpoints[-1], "hyper_lr": PAPER_HYPER_LR}
    run = _resumable(f"qsgp-convergence-{problem['name']}-{backend}-m{m}-basis{base['num_basis']}-batch{batch}-"
                     f"steps{checkpoints[-1]}", opts["convergence_checkpoint_every"], backend)
    if run and run.rows and run.rows[-1]["steps"] == checkpoints[-1]:
        return run.rows
    start = time.perf_counter()
    steps, model = qsgp_fit(backend, problem["X"], problem["y"], m, 0, base["num_basis"], batch, batch,
                            hypers=problem["hypers"], num_steps=checkpoints[-1], hyper_lr=PAPER_HYPER_LR,
                            **(run.fit_options() if run else {}))
    out = []
    for done in step_through(steps, checkpoints):
        seconds = run.seconds() if run else time.perf_counter() - start
        out.append({**base, "steps": done, "seconds": seconds,
                    **scores(*predict(backend, model, problem["Xt"], steps.params), problem["yt"])})
        if run:
            run.record(out[-1])
    steps.close()
    return run.rows if run else out


def equal_time_run(opts, backend, problem, budgets):
    """Our SVGP (``svgp_M`` inducing inputs, Adam 0.01, from the same exact GP's hyperparameters,
    learnt), scored once each of the increasing ``budgets`` (seconds of training, the QSGP rows')
    has passed, a step at least after the row before; with ``--state`` it continues a stopped run
    too."""
    M, batch = opts["svgp_M"], opts["convergence_batch"]
    base = {**_convergence_base(opts, backend, problem, f"SVGP-{M} (as many seconds)", "SVGP-512"), "m": M}
    run = _resumable(f"qsgp-convergence-{problem['name']}-{backend}-svgp{M}-batch{batch}",
                     opts["convergence_checkpoint_every"], backend)
    reached = {row["budget"] for row in run.rows} if run else set()
    budgets = [budget for budget in budgets if budget not in reached]
    if not budgets:
        return run.rows if run else []
    start, last = time.perf_counter(), run.rows[-1]["steps"] if run and run.rows else 0
    steps, model = svgp_fit(backend, problem["X"], problem["y"], M, batch, hypers=problem["hypers"],
                            **(run.fit_options() if run else {}))

    def seconds():
        return run.seconds() if run else time.perf_counter() - start

    out = []
    for budget in budgets:
        while steps.state is None or steps.state.step <= last or seconds() < budget:  # past the row before too
            steps.step()
        last = steps.state.step
        out.append({**base, "budget": budget, "steps": last, "seconds": seconds(),
                    **scores(*predict(backend, model, problem["Xt"], steps.params), problem["yt"])})
        if run:
            run.record(out[-1])
    steps.close()
    return run.rows if run else out


# -- the control variates' variance reduction (Fig. 1) -------------------------------------------------


def variance_rows(opts):
    import torch

    import pyro_sparsegp as lib
    from sparsegp_common.features.random_fourier import RandomFourierBasis
    from sparsegp_common.objectives.control_variates import Support, initial_state, pair

    problem = harness.regression_problem("kin40k")
    X, y = problem["X_train"], problem["y_train"]
    lengthscales, variance, _ = harness.exact_gp_hyperparameters(X, y, num_points=opts["exact_points"])
    n, m = len(X), opts["variance_m"]
    kernel = lib.RBF(lengthscale=torch.tensor(lengthscales, dtype=torch.float64),
                     variance=torch.tensor(variance, dtype=torch.float64))
    basis, X = RandomFourierBasis(kernel, m, X.shape[1]), torch.as_tensor(X, dtype=torch.float64)
    rng = np.random.default_rng(0)
    mu = torch.as_tensor(rng.normal(size=(m, 1)))  # a prior draw: S = I
    with torch.no_grad():
        exact = sum(float((basis.features(X[i:i + 2000], torch.arange(m)) @ mu).pow(2).sum())
                    for i in range(0, n, 2000))
    order = torch.as_tensor(rng.permutation(n))
    num_rows, num_basis, evaluations = opts["variance_draws"], opts["variance_basis"], opts["evaluations"]
    draws = [tuple(torch.as_tensor(rng.integers(0, size, count)) for size, count in
                   ((n, num_rows), (m, num_basis), (m, num_basis))) for _ in range(evaluations)]
    base = {"suite": "qsgp", "part": "variance", "dataset": "kin40k" + (" (synthetic)" if problem["synthetic"] else ""),
            "m": m, "num_rows": num_rows, "num_basis": num_basis, "evaluations": evaluations, "dtype": "float64",
            "threads": harness.threads()}
    out = []
    for n_bar in opts["variance_supports"]:
        support = Support(X[order[:n_bar]], basis) if n_bar else None
        a = initial_state(support, mu).detach() if n_bar else None
        values, total, squares = [], torch.zeros(m, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
        for rows, I, J in draws:
            mu_I, mu_J = mu[I].requires_grad_(), mu[J].requires_grad_()
            Phi_I, Phi_J = basis.features(X[rows], I), basis.features(X[rows], J)
            estimate = (n / num_rows) * (m / num_basis) ** 2 * ((Phi_J @ mu_J) * (Phi_I @ mu_I)).sum()
            if n_bar:
                estimate = estimate + pair(support, a, mu_I, mu_J, I, J, m, num_data=n, noise=1.0)
            g_I, g_J = torch.autograd.grad(estimate, (mu_I, mu_J))
            gradient = torch.zeros(m, dtype=torch.float64).index_add_(0, I, g_I[:, 0]).index_add_(0, J, g_J[:, 0])
            values.append(float(estimate.detach()))
            total += gradient
            squares += gradient**2
        values = np.array(values)
        gradient_variance = float((squares / evaluations - (total / evaluations) ** 2).mean())
        out.append({**base, "support": n_bar, "value_variance": float(values.var()),
                    "gradient_variance": gradient_variance,
                    "z": float((values.mean() - exact) / (values.std() / np.sqrt(evaluations))), "exact": exact})
    for row in out:
        row["value_ratio"] = row["value_variance"] / out[0]["value_variance"]
        row["gradient_ratio"] = row["gradient_variance"] / out[0]["gradient_variance"]
    return out
