"""Trials behind the decoupled suite's kin40k reading (issue 4): several variants trained side by side.

``python -m benchmarks.decoupled_trials SECONDS VARIANT [VARIANT ...]`` trains every variant for
``SECONDS`` of wall-clock time in alternating 10 s slices (:func:`benchmarks.decoupled.train_for`,
as the suite does), on kin40k split 0, batch 1024, float32, Pyro, Adam; with
``CHECKPOINTS=150,300,...`` (seconds) it evaluates at each of those times. Printed per variant and
checkpoint: steps, test RMSE and NLPD (original units), the learned noise, kernel variance and
lengthscales, and the trace floor at ``FLOOR_RANK`` (:func:`trace_floor`, in units of the noise).

A variant is ``kind[:key=value...]``:

* ``svgp``: our SVGP; ``M`` inducing points (1024), ``lr`` (0.01).
* ``decoupled``: ``DecoupledGP``; ``p`` parametrisation (``direct``), ``Ma``/``Mb`` basis sizes
  (16384/128), ``lr`` (0.01), ``alr``/``Llr`` a learning rate for ``a``/``L`` alone, ``ks`` the KL
  subsample size (1024), ``freeze=Z_alpha`` to keep the mean basis fixed, ``decay=c`` for the
  paper's schedule ``lr / (1 + c sqrt(t))``.
"""
import os
import sys

from . import harness


FLOOR_RANK, FLOOR_POINTS = 128, 5000


def trace_floor(kernel, X, rank):
    """The least mean trace term ``mean_n [k(x_n, x_n) - q(x_n, x_n)]`` that any ``rank`` inducing
    features (points, smoothed points, any linear functionals) can reach on the inputs ``X (N, D)``:
    the sum of the eigenvalues of ``K_XX`` beyond the ``rank`` largest, over N (float64).

    Every decoupled covariance basis of size M_beta pays at least this in its ELBO's variance term,
    ``N floor / (2 noise)``, whatever its mean basis, so a floor near the noise forces the kernel
    variance down and the noise up (issue 4's kin40k reading). On a random subsample of the
    training inputs it is an estimate that is low, if anything: it grows with the subsample."""
    import torch

    with torch.no_grad():
        K = kernel(torch.as_tensor(X, dtype=torch.float64))
        eig = torch.linalg.eigvalsh(K).flip(0)
    return float(eig[rank:].sum() / len(X))


def parse(variant):
    kind, *options = variant.split(":")
    if kind not in ("svgp", "decoupled"):
        raise ValueError(f"a variant starts with svgp or decoupled, got {variant!r}")
    return kind, dict(option.split("=", 1) for option in options)


def build(kind, opts, index, X, y, Z):
    import pyro
    import torch

    import pyro_sparsegp as psg

    from . import decoupled, runners

    lr = float(opts.get("lr", 0.01))
    batches = harness.minibatches(len(X), 1024)
    if kind == "svgp":
        runner = type("SVGP", (runners.OursPyro,), {
            "likelihood_name": f"likelihood{index}",
            "prior": lambda self, kernel, Z: psg.SVGP(kernel, Z, name=f"gp{index}")})
        return runner(X, y, Z[: int(opts.get("M", 1024))], batches, lr)
    Mb, ks = int(opts.get("Mb", 128)), int(opts.get("ks", 1024))
    runner = type("Decoupled", (decoupled.DecoupledPyro,), {
        "likelihood_name": f"likelihood{index}",
        "prior": lambda self, kernel, Z: psg.DecoupledGP(kernel, Z, Z[:Mb], parametrization=opts.get("p", "direct"),
                                                         kl_subsample_size=ks, name=f"gp{index}")})
    runner = runner(X, y, Z[: int(opts.get("Ma", 16384))], batches, lr)
    store, frozen = pyro.get_param_store(), opts.get("freeze", "").split(",")
    rates = {"a": float(opts.get("alr", lr)), "L": float(opts.get("Llr", lr))}
    groups = [{"params": [store.get_param(name).unconstrained()], "lr": rates.get(name.split(".")[-1], lr)}
              for name in store.keys() if name.startswith((f"gp{index}.", f"likelihood{index}."))
              and name.split(".")[-1] not in frozen]
    runner.opt = torch.optim.Adam(groups)
    if "decay" in opts:
        c = float(opts["decay"])
        schedule = torch.optim.lr_scheduler.LambdaLR(runner.opt, lambda t: 1 / (1 + c * t**0.5))
        step = runner.step
        runner.step = lambda: (step(), schedule.step())[0]
    return runner


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    seconds, variants = float(argv[0]), argv[1:]
    harness.pin_threads(2)
    import numpy as np
    import pyro
    import torch

    from .accuracy import metrics
    from .decoupled import train_for

    problem = harness.regression_problem("kin40k")
    X, y, scaler = problem["X_train"], problem["y_train"], problem["y_scaler"]
    Z = harness.inducing_inputs(X, 16384)
    pyro.clear_param_store()
    group = {v: build(*parse(v), i, X, y, Z) for i, v in enumerate(variants)}
    floor_X = X[np.random.default_rng(0).choice(len(X), min(FLOOR_POINTS, len(X)), replace=False)]
    checkpoints = [float(c) for c in os.environ.get("CHECKPOINTS", str(seconds)).split(",")]
    steps, previous = dict.fromkeys(group, 0), 0.0
    for checkpoint in checkpoints:
        for key, (count, _) in train_for(group, checkpoint - previous, 10.0).items():
            steps[key] += count
        previous = checkpoint
        for key, runner in group.items():
            mean, var = runner.predict(problem["X_test"])
            rmse, nlpd = metrics(problem["y_test"], scaler.inverse_transform(mean), scaler.inverse_variance(var))
            kernel = runner.gp.prior.kernel
            with torch.no_grad():
                noise = float(runner.gp.likelihood.variance)
                floor = trace_floor(kernel, floor_X, FLOOR_RANK) / noise
                print(f"{checkpoint:.0f} s  {key}  steps {steps[key]}  RMSE {rmse:.4f}  NLPD {nlpd:.4f}  "
                      f"noise {noise:.4f}  variance {float(kernel.variance):.3f}  "
                      f"lengthscales {np.round(kernel.lengthscale.numpy(), 2)}  "
                      f"trace floor (M={FLOOR_RANK}) {floor:.2f} x noise", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
