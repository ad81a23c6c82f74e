"""Trials behind the decoupled suite's kin40k reading (issue 4): several variants trained side by side.

``python -m benchmarks.decoupled_trials SECONDS VARIANT [VARIANT ...]`` trains every variant for
``SECONDS`` of wall-clock time in alternating 10 s slices (:func:`benchmarks.decoupled.train_for`,
as the suite does), on kin40k split 0, batch 1024, float32, Pyro, Adam; with
``CHECKPOINTS=150,300,...`` (seconds) it evaluates at each of those times. Printed per variant and
checkpoint: steps, test RMSE and NLPD (original units), the learned noise, kernel variance and
lengthscales.

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
                print(f"{checkpoint:.0f} s  {key}  steps {steps[key]}  RMSE {rmse:.4f}  NLPD {nlpd:.4f}  "
                      f"noise {float(runner.gp.likelihood.variance):.4f}  variance {float(kernel.variance):.3f}  "
                      f"lengthscales {np.round(kernel.lengthscale.numpy(), 2)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
