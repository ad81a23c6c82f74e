"""Seconds per SVI step of the SVGP: ours (Pyro, NumPyro under jit) beside pyro.contrib.gp.

Synthetic regression (n = 20000, D = 8, standardised), minibatch 1024, float32, M inducing
points, Gaussian likelihood. Each figure is the median over ``--repeats`` blocks of ``--steps``
steps, after warm-up (and compilation). Run on an otherwise idle machine:

    python benchmarks/svgp_step.py [--sizes 128 512 1024] [--threads 2]
"""
import argparse
import statistics
import time

import numpy as np


def data(n=20000, D=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    y = (np.sin(X @ rng.normal(size=D) / np.sqrt(D)) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return X, y


def timed(step, steps, repeats):
    for _ in range(3):
        step()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            result = step()
        getattr(result, "block_until_ready", lambda: None)()
        blocks.append((time.perf_counter() - start) / steps)
    return statistics.median(blocks)


def ours_pyro(X, y, M, batch):
    import pyro
    import torch

    import pyro_sparsegp as psg

    pyro.clear_param_store()
    X, y = torch.tensor(X), torch.tensor(y)
    model = psg.GPModel(psg.SVGP(psg.RBF(lengthscale=torch.ones(X.shape[1])), X[:M]), psg.Gaussian(0.1))
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    return lambda: svi.step(X, y, subsample_size=batch)


def contrib_pyro(X, y, M, batch):
    import pyro
    import pyro.contrib.gp as gp
    import torch

    pyro.clear_param_store()
    X, y = torch.tensor(X), torch.tensor(y)
    kernel = gp.kernels.RBF(input_dim=X.shape[1], lengthscale=torch.ones(X.shape[1]))
    model = gp.models.VariationalSparseGP(X[:batch], y[:batch], kernel, X[:M].clone(),
                                          gp.likelihoods.Gaussian(variance=torch.tensor(0.1)),
                                          num_data=len(X), whiten=True)
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.TraceMeanField_ELBO())

    def step():
        idx = torch.randint(len(X), (batch,))
        model.set_data(X[idx], y[idx])
        return svi.step()

    return step


def ours_numpyro(X, y, M, batch):
    import jax
    import jax.numpy as jnp
    import numpyro

    import numpyro_sparsegp as nsg

    X, y = jnp.asarray(X), jnp.asarray(y)
    model = nsg.GPModel(nsg.SVGP(nsg.RBF(lengthscale=jnp.ones(X.shape[1])), X[:M]), nsg.Gaussian(0.1))
    svi = numpyro.infer.SVI(model.model, model.guide, numpyro.optim.Adam(0.01), numpyro.infer.Trace_ELBO())
    state = [svi.init(jax.random.PRNGKey(0), X, y, subsample_size=batch)]
    update = jax.jit(lambda s: svi.update(s, X, y, subsample_size=batch))

    def step():
        state[0], loss = update(state[0])
        return loss

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    X, y = data()
    runs = {"ours (Pyro)": ours_pyro, "ours (NumPyro, jit)": ours_numpyro, "pyro.contrib.gp": contrib_pyro}
    print(f"| M | {' | '.join(runs)} | contrib.gp / ours (Pyro) |")
    print("|---" * (len(runs) + 2) + "|")
    for M in args.sizes:
        seconds = {name: timed(make(X, y, M, args.batch), args.steps, args.repeats) for name, make in runs.items()}
        cells = " | ".join(f"{1e3 * s:.1f} ms" for s in seconds.values())
        print(f"| {M} | {cells} | {seconds['pyro.contrib.gp'] / seconds['ours (Pyro)']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
