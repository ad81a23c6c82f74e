"""Tutorial: diagnosing SVGP fits with ArviZ (Pyro or NumPyro).

Counts over time from a smoothly varying rate, ``y_n ~ Poisson(exp(f(t_n)))``, fitted twice:
with 24 inducing points and with only 3 (too few to follow the rate). ``to_inference_data``
turns each fit into an ``arviz.InferenceData`` (posterior draws from the guide, posterior
predictive, pointwise log-likelihood, observed data and the ELBO trace), so the usual ArviZ
tools apply: PSIS-LOO and model comparison, Pareto-k values, LOO-PIT calibration and posterior
predictive checks. (For counts the LOO-PIT curve is not flat even for the right model: the data
are discrete.)

    python tutorials/arviz_diagnostics.py [--backend pyro|numpyro] [--quick] [--output outputs/arviz_pyro.png]
"""
import argparse
import pathlib

import numpy as np


def simulate(num_data, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 10, num_data))
    rate = np.exp(1.0 + np.sin(1.5 * t) + 0.5 * np.cos(4 * t))
    return t[:, None], rng.poisson(rate).astype(float)


def fit_and_export(backend, t, y, num_inducing, steps, quick):
    """Train ``GPModel(SVGP, Poisson)`` and export it; returns the ``InferenceData``."""
    Z = np.linspace(0, 10, num_inducing)[:, None]
    if backend == "pyro":
        import pyro
        import torch

        import pyro_sparsegp as lib

        pyro.clear_param_store()
        t, y, Z = (torch.tensor(a, dtype=torch.float32) for a in (t, y, Z))
    else:
        import jax.numpy as jnp

        import numpyro_sparsegp as lib

        t, y, Z = (jnp.asarray(a, jnp.float32) for a in (t, y, Z))
    gp = lib.SVGP(lib.Matern52(lengthscale=1.0), Z, name="gp")
    model = lib.GPModel(gp, lib.Poisson())
    result = lib.fit(model.model, model.guide, (t, y), num_steps=steps, lr=0.03, progress=not quick)
    return lib.to_inference_data(model, data=(t, y), num_samples=400 if quick else 1000, result=result)


def main(backend="pyro", quick=False, output=None):
    import arviz as az

    output = pathlib.Path(output or f"outputs/arviz_{backend}.png")
    output.parent.mkdir(parents=True, exist_ok=True)
    t, y = simulate(300 if quick else 1000)
    steps = 600 if quick else 3000
    fits = {f"M={m}": fit_and_export(backend, t, y, m, steps, quick) for m in (24, 3)}
    # ArviZ 1.x renamed the columns (elpd_loo -> elpd, p_loo -> p)
    arviz_1 = int(az.__version__.split(".")[0]) >= 1
    elpd, p = ("elpd", "p") if arviz_1 else ("elpd_loo", "p_loo")
    comparison = az.compare(fits) if arviz_1 else az.compare(fits, ic="loo")
    print(comparison[["rank", elpd, p, "elpd_diff", "dse"]].to_string())
    loo = az.loo(fits["M=24"], pointwise=True)
    print(f"M=24: elpd_loo {getattr(loo, elpd):.1f}, max Pareto k {float(loo.pareto_k.max()):.2f}")
    (plot_arviz_1 if arviz_1 else plot)(fits, loo, output)
    return comparison


def plot_elbo(fits, ax):
    for name, data in fits.items():
        ax.plot(data["sample_stats"]["step"], data["sample_stats"]["elbo"], label=name)
    ax.set(title="ELBO during training", xlabel="step", yscale="symlog")
    ax.legend()


def plot(fits, loo, output):
    """ArviZ 0.x: one figure of four panels."""
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    plot_elbo(fits, axes[0, 0])
    az.plot_ppc(fits["M=24"], num_pp_samples=100, ax=axes[0, 1])
    axes[0, 1].set_title("posterior predictive check (M=24)")
    az.plot_loo_pit(fits["M=24"], y="y", ax=axes[1, 0])
    axes[1, 0].set_title("LOO-PIT (M=24)")
    az.plot_khat(loo, ax=axes[1, 1], show_bins=True)
    axes[1, 1].set_title("Pareto k (M=24)")
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    print(f"wrote {output}")


def plot_arviz_1(fits, loo, output):
    """ArviZ 1.x draws each plot on a figure of its own: the ELBO panel in ``output``, the
    posterior predictive check, LOO-PIT and Pareto k beside it (``<output>_ppc.png``, ...)."""
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    plot_elbo(fits, ax)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    written = [output]
    for suffix, draw in (("ppc", lambda: az.plot_ppc_dist(fits["M=24"], num_samples=100)),
                         ("loo_pit", lambda: az.plot_loo_pit(fits["M=24"])),
                         ("khat", lambda: az.plot_khat(loo))):
        path = output.with_name(f"{output.stem}_{suffix}{output.suffix}")
        draw().savefig(path, dpi=100)
        written.append(path)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("pyro", "numpyro"), default="pyro")
    parser.add_argument("--quick", action="store_true", help="small data and few steps (for CI)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    main(args.backend, args.quick, args.output)
