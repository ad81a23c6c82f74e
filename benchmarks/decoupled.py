"""Suite ``decoupled``: seconds per SVI step of the decoupled-basis prior (Pyro) at
(M_alpha, M_beta) in (4096, 128), (16384, 128), (16384, 512), beside GPyTorch's SVGP with
M = 1024 and our SVGP (Pyro) with M = M_beta.

kin40k (split 0, standardised), minibatch 1024, float32, SE-ARD kernel, Gaussian likelihood.
The decoupled steps use the unbiased subsampled KL (``kl_subsample_size=1024`` columns of
``K_alpha``), as in the paper's linear-cost training; the bases start at the same random training
rows (the covariance basis at the first M_beta mean points). Timed blocks alternate
(:func:`~benchmarks.harness.time_steps`); each figure is the median seconds per step, and the ratio
is GPyTorch's (M = 1024) median over the decoupled one (above 1: faster than GPyTorch).
The accuracy-at-equal-time comparison of the issue is not part of this suite yet.
"""
from . import harness, runners

DATASET = "kin40k"


def settings(quick):
    if harness.tiny():
        return {"sizes": ((256, 32),), "gpytorch_M": 64, "batch": 256, "repeats": 2, "block_seconds": 0.05, "warmup": 1}
    if quick:
        return {"sizes": ((4096, 128),), "gpytorch_M": 1024, "batch": 1024, "repeats": 3, "block_seconds": 0.3, "warmup": 2}
    return {"sizes": ((4096, 128), (16384, 128), (16384, 512)), "gpytorch_M": 1024, "batch": 1024, "repeats": 7,
            "block_seconds": 1.5, "warmup": 3}


class DecoupledPyro(runners.OursPyro):
    """The Pyro SVGP runner with a ``DecoupledGP`` prior (same kernel, likelihood, loss and step)."""

    name = "decoupled (Pyro)"
    key = "decoupled_pyro"

    def __init__(self, X, y, Za, Mb, batches, lr):
        import pyro
        import torch
        from pyro import poutine

        import pyro_sparsegp as psg

        self.X, self.y = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
        kernel = psg.RBF(lengthscale=torch.full((X.shape[1],), runners.LENGTHSCALE), variance=runners.VARIANCE)
        Z = torch.as_tensor(Za, dtype=torch.float32)
        prior = psg.DecoupledGP(kernel, Z, Z[:Mb], kl_subsample_size=min(1024, len(Z)), name="decoupled")
        likelihood = psg.Gaussian(variance=runners.NOISE, name="decoupled_likelihood")
        self.gp = psg.GPModel(prior, likelihood, num_data=len(X))
        self.loss = pyro.infer.Trace_ELBO().differentiable_loss
        self.batches = batches
        with poutine.trace(param_only=True) as capture:
            self.loss(self.gp.model, self.gp.guide, self.X[:2], self.y[:2])
        store = pyro.get_param_store()
        self.opt = torch.optim.Adam([store.get_param(n).unconstrained() for n in sorted(capture.trace.nodes)], lr=lr)


COLUMNS = [
    ("M_alpha", "M_alpha", "{}"), ("M_beta", "M_beta", "{}"),
    ("decoupled (Pyro)", "seconds_decoupled", "{:.4f} s"),
    ("ours SVGP M=M_beta (Pyro)", "seconds_svgp", "{:.4f} s"),
    ("GPyTorch SVGP", "seconds_gpytorch", "{:.4f} s"),
    ("GPyTorch / decoupled", "ratio", "{:.2f}"),
]


def title(rows):
    row = rows[0]
    return (
        f"decoupled: median seconds per SVI step, {row['dataset']} (N = {row['num_data']}, D = {row['input_dim']}), "
        f"batch {row['batch']}, {row['dtype']}, {row['threads']} threads, GPyTorch SVGP with M = {row['gpytorch_M']}, "
        f"medians of {row['repeats']} blocks"
    )


def run(quick):
    opts = settings(quick)
    problem = harness.regression_problem(DATASET)
    X, y = problem["X_train"], problem["y_train"]
    rows = []
    for Ma, Mb in opts["sizes"]:
        Za = harness.inducing_inputs(X, Ma)
        group = runners.build(("ours_pyro",), X, y, Za[:Mb], opts["batch"])
        group["gpytorch"] = runners.RUNNERS["gpytorch"](X, y, Za[: opts["gpytorch_M"]],
                                                          harness.minibatches(len(X), opts["batch"]), 0.01)
        group["decoupled"] = DecoupledPyro(X, y, Za, Mb, harness.minibatches(len(X), opts["batch"]), 0.01)
        blocks = harness.time_steps({key: r.step for key, r in group.items()}, opts["repeats"], opts["block_seconds"],
                                    opts["warmup"])
        del group
        seconds = {key: harness.median(values) for key, values in blocks.items()}
        rows.append({
            "suite": "decoupled", "dataset": DATASET, "synthetic": problem["synthetic"], "num_data": len(X),
            "input_dim": X.shape[1], "M_alpha": Ma, "M_beta": Mb, "gpytorch_M": opts["gpytorch_M"],
            "batch": opts["batch"], "dtype": "float32", "threads": harness.threads(), "repeats": opts["repeats"],
            "seconds_decoupled": seconds["decoupled"], "seconds_svgp": seconds["ours_pyro"],
            "seconds_gpytorch": seconds["gpytorch"], "ratio": seconds["gpytorch"] / seconds["decoupled"],
        })
    return rows
