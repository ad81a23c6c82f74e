"""Pyro and NumPyro agree to 1e-8 in float64 for the same inputs and parameters."""
import numpy as np
import pytest

from backends import NumPyroBackend, PyroBackend
from test_svgp import KERN, problem

LIKELIHOODS = {  # constructor and float64 parameter values
    "gaussian": (lambda lib: lib.Gaussian(), {"variance": 0.2}),
    "poisson_exp": (lambda lib: lib.Poisson(), {}),
    "poisson_softplus": (lambda lib: lib.Poisson(link="softplus"), {}),
    "bernoulli_logit": (lambda lib: lib.Bernoulli(), {}),
    "studentt": (lambda lib: lib.StudentT(), {"df": 3.0, "scale": 0.5}),
}


def observations(name, rng, n):
    if name.startswith("poisson"):
        return rng.poisson(1.5, size=n).astype(float)
    if name.startswith("bernoulli"):
        return rng.integers(0, 2, size=n).astype(float)
    return rng.normal(size=n)


def build(backend, name, whiten, diagonal, rng_seed=0):
    X, Z, q_mu, q_sqrt = problem(np.random.default_rng(rng_seed), diagonal=diagonal)
    y = observations(name, np.random.default_rng(rng_seed + 1), len(X))
    make, params = LIKELIHOODS[name]
    lik = backend.set(make(backend.lib), **params)
    gp = backend.svgp(Z, KERN, q_mu, q_sqrt, whiten=whiten, diagonal=diagonal)
    return backend.lib.GPModel(gp, lik), backend.array(X), backend.array(y)


@pytest.mark.parametrize("name", sorted(LIKELIHOODS))
@pytest.mark.parametrize("whiten,diagonal", [(True, False), (False, False), (True, True)])
def test_elbo_and_predictions_agree(name, whiten, diagonal):
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        model, X, y = build(backend, name, whiten, diagonal)
        mean, var = model.predict_f(X)
        _, cov = model.predict_f(X, full_cov=True)
        loss = backend.loss(model.model, model.guide, X, y)
        results.append([float(backend.numpy(model.elbo(X, y))), -loss] + [backend.numpy(a) for a in (mean, var, cov)])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)
