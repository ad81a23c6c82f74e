"""Tutorial: SVGP regression inside a hierarchical model, in Pyro.

Measurements from J sites share a smooth trend over time and each site has its own offset,
drawn from a population distribution (partial pooling, non-centred):

    y_n = f(t_n) + a[site_n] + eps_n,   eps_n ~ N(0, sigma^2),
    f ~ GP(0, Matern-5/2)                (SVGP component, 20 inducing points),
    a_j = mu + tau * z_j,  z_j ~ N(0, 1),  mu ~ N(0, 1),  tau ~ HalfNormal(1),  sigma ~ HalfNormal(1).

The GP component brings its own variational family; ``AutoNormal`` guides the rest. ``fit``
trains both together on minibatches drawn by the data plate, ``predict_f`` gives the trend with
its bands, and the plot compares trend and site offsets with the truth.

    python tutorials/hierarchical_regression_pyro.py [--quick] [--output outputs/hierarchical_pyro.png]
"""
import argparse
import pathlib

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_sparsegp as psg


def simulate(num_data, num_sites=8, seed=0):
    """Times ``(N, 1)``, site labels ``(N,)``, observations ``(N,)``, true offsets ``(J,)`` and trend."""
    rng = np.random.default_rng(seed)
    trend = lambda t: np.sin(t) + 0.3 * np.cos(3 * t)  # noqa: E731
    offsets = 0.5 + 0.8 * rng.standard_normal(num_sites)
    t = rng.uniform(0, 10, num_data)
    site = rng.integers(0, num_sites, num_data)
    y = trend(t) + offsets[site] + 0.3 * rng.standard_normal(num_data)
    return t[:, None], site, y, offsets, trend


def build(num_sites, batch_size):
    gp = psg.SVGP(psg.Matern52(lengthscale=1.0), torch.linspace(0, 10, 20)[:, None], name="gp")

    def model(t, site, y=None):
        data = pyro.plate("data", len(t), subsample_size=batch_size)
        f = gp.model(t, data)  # the trend at the minibatch; called outside the plate
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        tau = pyro.sample("tau", dist.HalfNormal(1.0))
        with pyro.plate("sites", num_sites):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        with data as idx:
            mean = f + mu + tau * z[site[idx]]
            pyro.sample("y", dist.Normal(mean, sigma), obs=None if y is None else y[idx])

    autoguide = AutoNormal(poutine.block(model, hide=list(gp.site_names)))

    def guide(t, site, y=None):
        gp.guide(t, pyro.plate("data", len(t), subsample_size=batch_size))
        autoguide(t, site, y)

    return gp, model, guide, autoguide


def main(quick=False, output="outputs/hierarchical_pyro.png"):
    pyro.clear_param_store()
    num_data, steps = (600, 800) if quick else (3000, 4000)
    t, site, y, offsets, trend = simulate(num_data)
    data = (torch.tensor(t, dtype=torch.float32), torch.tensor(site), torch.tensor(y, dtype=torch.float32))
    gp, model, guide, autoguide = build(len(offsets), batch_size=200)
    result = psg.fit(model, guide, data, num_steps=steps, lr=0.02, loss=TraceMeanField_ELBO(), progress=not quick)

    grid = torch.linspace(0, 10, 200)[:, None]
    mean, var = (a.numpy() for a in psg.predict_f(gp, grid))
    # f and the offsets are only identified up to a shared constant: compare centred curves
    draws = [autoguide(*data) for _ in range(500)]
    a = torch.stack([d["mu"] + d["tau"] * d["z"] for d in draws]).detach().numpy()
    shift = a.mean() - offsets.mean()
    truth = trend(grid[:, 0].numpy())
    trend_rmse = np.sqrt(np.mean((mean + shift - truth) ** 2))
    offset_rmse = np.sqrt(np.mean((a.mean(0) - shift - offsets) ** 2))
    print(f"final loss {np.mean(result.losses[-50:]):.1f}")
    print(f"trend RMSE {trend_rmse:.3f}, site offset RMSE {offset_rmse:.3f}")
    plot(grid[:, 0].numpy(), mean + shift, var, truth, t[:, 0], y - offsets[site], a - shift, offsets, result.losses, output)
    return trend_rmse, offset_rmse


def plot(grid, mean, var, truth, t, y_detrended, a_draws, offsets, losses, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    ax.scatter(t, y_detrended, s=3, alpha=0.3, color="grey", label="y - true offset")
    ax.plot(grid, truth, "k--", label="true trend")
    ax.plot(grid, mean, color="C0", label="posterior mean")
    ax.fill_between(grid, mean - 2 * np.sqrt(var), mean + 2 * np.sqrt(var), color="C0", alpha=0.3, label="±2 sd")
    ax.set(title="shared trend f(t)", xlabel="t")
    ax.legend(fontsize=8)
    ax = axes[1]
    sites = np.arange(len(offsets))
    ax.errorbar(sites, a_draws.mean(0), yerr=2 * a_draws.std(0), fmt="o", label="posterior ±2 sd")
    ax.scatter(sites, offsets, marker="x", color="k", zorder=3, label="truth")
    ax.set(title="site offsets a_j", xlabel="site")
    ax.legend(fontsize=8)
    axes[2].plot(losses)
    axes[2].set(title="loss (negative ELBO)", xlabel="step", yscale="symlog")
    fig.tight_layout()
    pathlib.Path(output).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    print(f"wrote {output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data and few steps (for CI)")
    parser.add_argument("--output", default="outputs/hierarchical_pyro.png")
    args = parser.parse_args()
    main(args.quick, args.output)
