"""The GP component inside users' own Pyro and NumPyro models (docs/examples/embedded_*.py)."""
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as ndist
import pyro
import pyro.distributions as pdist
import pytest
import torch

from test_parity import build

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "docs" / "examples"))
import embedded_numpyro  # noqa: E402
import embedded_pyro  # noqa: E402

TOLERANCE = 0.15  # largest error of a centred group effect (true effects span -0.8..0.8)


def centred(a):
    a = np.asarray(a)
    return a - a.mean()


def test_pyro_group_effects_recovered():
    x, g, y, effect = embedded_pyro.simulate()
    gp, autoguide, losses = embedded_pyro.fit(x, g, y, num_groups=len(effect))
    estimate = autoguide.median()["effect"].detach().numpy()
    assert np.abs(centred(estimate) - centred(effect.numpy())).max() < TOLERANCE
    assert np.mean(losses[-100:]) < np.mean(losses[:100])
    mean, _ = gp.predict_f(torch.linspace(-2.5, 2.5, 11)[:, None])
    true = np.sin(2 * np.linspace(-2.5, 2.5, 11))
    assert np.corrcoef(mean.detach().numpy(), true)[0, 1] > 0.95


def test_numpyro_group_effects_recovered():
    x, g, y, effect = embedded_numpyro.simulate()
    gp, autoguide, result = embedded_numpyro.fit(x, g, y, num_groups=len(effect), elbo=numpyro.infer.Trace_ELBO())
    estimate = autoguide.median(result.params)["effect"]
    assert np.abs(centred(estimate) - centred(effect)).max() < TOLERANCE
    mean, _ = numpyro.handlers.substitute(gp.predict_f, data=result.params)(jnp.linspace(-2.5, 2.5, 11)[:, None])
    assert np.corrcoef(np.asarray(mean), np.sin(2 * np.linspace(-2.5, 2.5, 11)))[0, 1] > 0.95


@pytest.mark.parametrize("mean_field", [False, True])
def test_component_elbo_is_the_hensman_bound_in_expectation(backend, mean_field):
    """Averaged over minibatches and draws of f, the user model's loss is minus the SVGP ELBO."""
    reference, X, y = build(backend, "gaussian", whiten=True, diagonal=False)
    expected = float(backend.numpy(reference.elbo(X, y)))
    model, guide = backend.user_model(reference.prior, 0.2)
    R = 600
    estimates = -backend.losses(model, guide, X, y, replicates=R, mean_field=mean_field)
    z = (estimates.mean() - expected) / (estimates.std() / np.sqrt(R))
    assert abs(z) < 4.0, z


def test_two_components_in_one_model(backend):
    """Two GPs with different names: an additive model f1(x1) + f2(x2)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(200, 2))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * rng.normal(size=200)
    gp1 = backend.svgp(np.linspace(-2, 2, 8)[:, None], name="trend")
    gp2 = backend.svgp(np.linspace(-2, 2, 8)[:, None], name="season")
    X1, X2, ya = backend.array(X[:, :1]), backend.array(X[:, 1:]), backend.array(y)
    if backend.name == "pyro":
        def model(X1, X2, y):
            data = pyro.plate("data", 200, subsample_size=50)
            f = gp1.model(X1, data) + gp2.model(X2, data)
            with data as idx:
                pyro.sample("y", pdist.Normal(f, 0.1), obs=y[idx])

        def guide(X1, X2, y):
            data = pyro.plate("data", 200, subsample_size=50)
            gp1.guide(X1, data)
            gp2.guide(X2, data)
    else:
        def model(X1, X2, y):
            data = numpyro.plate("data", 200, subsample_size=50)
            f = gp1.model(X1, data) + gp2.model(X2, data)
            with data as idx:
                numpyro.sample("y", ndist.Normal(f, 0.1), obs=y[idx])

        def guide(X1, X2, y):
            data = numpyro.plate("data", 200, subsample_size=50)
            gp1.guide(X1, data)
            gp2.guide(X2, data)
    sites = backend.trace(model, X1, X2, ya)
    assert {"trend.u", "trend.f", "trend.kl", "season.u", "season.f", "season.kl"} <= set(sites)
    losses, params = backend.train(model, guide, (X1, X2, ya), steps=600, lr=0.02)
    assert {"trend.q_mu", "season.q_mu", "trend.kernel.lengthscale", "season.features.Z"} <= set(params)
    assert np.mean(losses[-50:]) < 0.2 * np.mean(losses[:50])


def test_component_misuse_raises(backend):
    gp = backend.svgp(np.zeros((3, 1)))
    X = backend.array(np.zeros((20, 1)))
    if backend.name == "pyro":
        plate = pyro.plate("data", 20, subsample_size=5)
        trace = pyro.poutine.trace(gp.model).get_trace
        with pytest.raises(ValueError, match="outside"):
            with plate:
                trace(X, plate)
        with pytest.raises(ValueError, match="rows"):
            trace(X[:7], plate)
    else:
        def inside():
            plate = numpyro.plate("data", 20, subsample_size=5)
            with plate:
                gp.model(X, plate)

        def mismatch():
            gp.model(X[:7], numpyro.plate("data", 20, subsample_size=5))

        for fn, message in ((inside, "outside"), (mismatch, "rows")):
            with pytest.raises(ValueError, match=message):
                numpyro.handlers.seed(fn, jax.random.PRNGKey(0))()
