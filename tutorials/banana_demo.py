"""Demo: a GP inside a larger Bayesian classifier, trained by SVI in Pyro and in NumPyro.

    logit p(y = 1 | x) = b + w . x + f(x),   b ~ N(0, 2^2),  w ~ N(0, I),  f ~ GP (SVGP, Matérn-5/2)

on the 400-point "banana" set (``tutorials/data/banana.csv``; see its README for source and
licence). The linear part is guided by an autoguide, the GP by its own variational family; a
random quarter of the points is held out for the test metrics. Writes a plot of the predictive
probability of both backends.

    python tutorials/banana_demo.py [--steps 2000 | --quick] [--output outputs/banana_demo.png]
"""
import argparse
import pathlib
import time

import numpy as np

DATA = pathlib.Path(__file__).parent / "data" / "banana.csv"


def load(seed=0):
    data = np.loadtxt(DATA, delimiter=",", skiprows=1)
    X, y = data[:, :2], data[:, 2]
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:100], order[100:]
    return X[train], y[train], X[test], y[test]


def run_pyro(Xtr, ytr, Xte, steps, batch_size=100, num_draws=500):
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro import poutine
    from pyro.infer import TraceMeanField_ELBO
    from pyro.infer.autoguide import AutoNormal

    import pyro_sparsegp as psg

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    X, y = torch.tensor(Xtr), torch.tensor(ytr)
    Z = X[torch.randperm(len(X))[:24]]
    gp = psg.SVGP(psg.Matern52(lengthscale=torch.ones(2, dtype=X.dtype)), Z, name="gp")

    def model(X, y=None):
        data = pyro.plate("data", len(X), subsample_size=min(batch_size, len(X)))
        f = gp.model(X, data)
        b = pyro.sample("b", dist.Normal(0.0, 2.0))
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=X.dtype), 1.0).to_event(1))
        with data as idx:
            pyro.sample("y", dist.Bernoulli(logits=b + X[idx] @ w + f), obs=None if y is None else y[idx])

    autoguide = AutoNormal(poutine.block(model, hide=list(gp.site_names)))

    def guide(X, y=None):
        gp.guide(X, pyro.plate("data", len(X), subsample_size=min(batch_size, len(X))))
        autoguide(X, y)

    psg.fit(model, guide, (X, y), num_steps=steps, lr=0.02, loss=TraceMeanField_ELBO(), progress=False)

    def predict(Xnew):
        """p(y = 1 | x) averaged over draws of b, w and f from the guide."""
        with torch.no_grad():
            Xnew = torch.as_tensor(Xnew)
            mean, var = gp.predict_f(Xnew)
            draws = [autoguide(X) for _ in range(num_draws)]
            b, w = (torch.stack([d[name] for d in draws]) for name in ("b", "w"))
            f = mean + var.sqrt() * torch.randn(num_draws, len(Xnew), dtype=mean.dtype)
            return torch.sigmoid(b[:, None] + w @ Xnew.T + f).mean(0).numpy()

    return predict


def run_numpyro(Xtr, ytr, Xte, steps, batch_size=100, num_draws=500):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro import handlers
    from numpyro.infer import TraceMeanField_ELBO
    from numpyro.infer.autoguide import AutoNormal

    import numpyro_sparsegp as nsg

    X, y = jnp.asarray(Xtr, jnp.float32), jnp.asarray(ytr, jnp.float32)
    Z = X[np.random.default_rng(0).permutation(len(X))[:24]]
    gp = nsg.SVGP(nsg.Matern52(lengthscale=jnp.ones(2)), Z, name="gp")

    def model(X, y=None):
        data = numpyro.plate("data", len(X), subsample_size=min(batch_size, len(X)))
        f = gp.model(X, data)
        b = numpyro.sample("b", dist.Normal(0.0, 2.0))
        w = numpyro.sample("w", dist.Normal(jnp.zeros(2), 1.0).to_event(1))
        with data as idx:
            numpyro.sample("y", dist.Bernoulli(logits=b + X[idx] @ w + f), obs=None if y is None else y[idx])

    autoguide = AutoNormal(handlers.block(model, hide=list(gp.site_names)))

    def guide(X, y=None):
        gp.guide(X, numpyro.plate("data", len(X), subsample_size=min(batch_size, len(X))))
        autoguide(X, y)

    params = nsg.fit(model, guide, (X, y), num_steps=steps, lr=0.02, loss=TraceMeanField_ELBO(), progress=False).params

    def predict(Xnew):
        Xnew = jnp.asarray(Xnew, jnp.float32)
        mean, var = nsg.predict_f(gp, Xnew, params=params)
        draws = autoguide.sample_posterior(jax.random.PRNGKey(1), params, sample_shape=(num_draws,))
        f = mean + jnp.sqrt(var) * jax.random.normal(jax.random.PRNGKey(2), (num_draws, len(Xnew)))
        return np.asarray(jax.nn.sigmoid(draws["b"][:, None] + draws["w"] @ Xnew.T + f).mean(0))

    return predict


def metrics(p, y):
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return {"accuracy": np.mean((p > 0.5) == y), "nll": -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--output", default="outputs/banana_demo.png")
    parser.add_argument("--quick", action="store_true", help="300 steps (for CI)")
    args = parser.parse_args()
    if args.quick:
        args.steps = 300
    Xtr, ytr, Xte, yte = load()
    print(f"banana: {len(ytr)} training and {len(yte)} test points; {args.steps} SVI steps per backend")
    grid = np.stack(np.meshgrid(np.linspace(-3.2, 3.2, 80), np.linspace(-3.2, 3.2, 80)), -1).reshape(-1, 2)
    surfaces = {}
    for name, run in (("Pyro", run_pyro), ("NumPyro", run_numpyro)):
        start = time.time()
        predict = run(Xtr, ytr, Xte, args.steps)
        scores = metrics(predict(Xte), yte)
        print(f"{name:8s} test accuracy {scores['accuracy']:.3f}  test NLL {scores['nll']:.3f}  "
              f"({time.time() - start:.1f} s)")
        surfaces[name] = predict(grid).reshape(80, 80)
    plot(surfaces, Xtr, ytr, Xte, yte, pathlib.Path(args.output))


def plot(surfaces, Xtr, ytr, Xte, yte, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(surfaces), figsize=(5.5 * len(surfaces), 5), sharey=True)
    xs = np.linspace(-3.2, 3.2, 80)
    for ax, (name, p) in zip(axes, surfaces.items()):
        im = ax.contourf(xs, xs, p, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.8)
        ax.contour(xs, xs, p, levels=[0.5], colors="k", linewidths=2)
        for X, y, marker, label in ((Xtr, ytr, "o", "train"), (Xte, yte, "s", "test")):
            ax.scatter(*X.T, c=y, cmap="RdBu_r", marker=marker, edgecolors="k", s=18, vmin=0, vmax=1, label=label)
        ax.set_title(f"{name}: p(y = 1 | x), linear + GP logit")
        ax.set_xlabel("x1")
        ax.legend(loc="lower right")
    axes[0].set_ylabel("x2")
    fig.colorbar(im, ax=axes, shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
