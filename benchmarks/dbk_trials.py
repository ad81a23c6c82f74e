"""Trials behind the dbk suite's Table 1 reading (issue 5): the backbone network on its own.

``python -m benchmarks.dbk_trials DATASET [--seeds 0 1 ...] [--epochs 300] [--standardise]``
trains the Table 1 network (:class:`pyro_sparsegp.dbk.ResNet`, 2 blocks of 128 tanh units) with a
single output as a plain regression network: squared error, Adam (lr 1e-3, weight decay 1e-4),
batches of 256, on the suite's split of each seed (:func:`benchmarks.dbk.split`: 70/10/20, inputs
onto [-1, 1], standardised targets). With ``--standardise`` the inputs are standardised instead
(training statistics). Printed per seed: train, validation and test RMSE at the evaluation (every
10 epochs) with the best validation RMSE.

A rank-1 SVDBK is this network with a Bayesian scalar last weight, so its RMSE bounds what the
backbone contributes: the paper's SVDBK-r on protein reports 0.5590.
"""
import argparse

import numpy as np

from . import harness
from .dbk import BATCH, LR, WEIGHT_DECAY, split


def standardised(data):
    """The split with inputs standardised by the training rows' statistics (constant columns kept)."""
    X = data["train"][0]
    mean, sd = X.mean(0), X.std(0)
    sd[sd == 0] = 1.0
    return {key: ((x - mean) / sd, y) for key, (x, y) in data.items()}


def backbone(name, seed, epochs=300, standardise=False, rows=None):
    """Train the backbone on one seed; returns ``{"epoch", "train", "val", "test"}`` (RMSEs) at the
    best validation RMSE."""
    import torch

    from pyro_sparsegp.dbk import ResNet

    data, _ = split(name, seed, rows)
    if standardise:
        data = standardised(data)
    X, y, Xv, yv, Xt, yt = (torch.as_tensor(a, dtype=torch.float32) for part in ("train", "val", "test") for a in data[part])
    net = ResNet(X.shape[1], rank=1, dtype=torch.float32, seed=seed)
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    batches = harness.minibatches(len(X), min(BATCH, len(X)), seed=seed)
    best = None
    for epoch in range(1, epochs + 1):
        for _ in range(max(len(X) // BATCH, 1)):
            idx = torch.as_tensor(next(batches))
            opt.zero_grad()
            ((net(X[idx])[:, 0] - y[idx]) ** 2).mean().backward()
            opt.step()
        if epoch % 10 and epoch != epochs:
            continue
        with torch.no_grad():
            train, val, test = (float(((net(A)[:, 0] - b) ** 2).mean().sqrt()) for A, b in ((X, y), (Xv, yv), (Xt, yt)))
        if best is None or val < best["val"]:
            best = {"epoch": epoch, "train": train, "val": val, "test": test}
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dbk_trials", description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=["pol", "protein"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--standardise", action="store_true", help="standardised inputs instead of [-1, 1]")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    tests = []
    for seed in args.seeds:
        best = backbone(args.dataset, seed, args.epochs, args.standardise)
        tests.append(best["test"])
        print(f"{args.dataset} seed {seed}: best validation at epoch {best['epoch']}, RMSE train {best['train']:.4f} "
              f"validation {best['val']:.4f} test {best['test']:.4f}", flush=True)
    print(f"test RMSE mean {np.mean(tests):.4f} (sd {np.std(tests):.4f}) over {len(tests)} seed(s)")


if __name__ == "__main__":
    main()
