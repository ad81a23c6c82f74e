"""Prediction: batched latent moments, predictive moments and quantiles of y through every
likelihood (against quadrature references), joint posterior samples and parameter substitution."""
import logging

import numpy as np
import pytest

import reference
from backends import NumPyroBackend, PyroBackend
from test_parity import LIKELIHOODS, build

MOMENT_LIKELIHOODS = sorted(LIKELIHOODS)


def params_of(name):
    return LIKELIHOODS[name][1]


def test_batched_latent_moments_equal_the_unbatched(backend):
    model, X, _ = build(backend, "gaussian", whiten=True, diagonal=False)
    mean, var = model.predict_f(X)
    mean_b, var_b = model.predict_f(X, batch_size=7)  # 30 rows: 4 batches, the last one partial
    mean_c, cov = model.predict_f(X, full_cov=True)
    for a, b in ((mean, mean_b), (var, var_b), (mean, mean_c), (var, np.diagonal(backend.numpy(cov)))):
        np.testing.assert_allclose(backend.numpy(a), backend.numpy(b), rtol=1e-12, atol=1e-14)
    assert backend.lib.predict_f(model.prior, X, batch_size=7)[0].shape == (30,)


@pytest.mark.parametrize("name", MOMENT_LIKELIHOODS)
def test_predictive_moments_match_quadrature(backend, name):
    model, X, _ = build(backend, name, whiten=True, diagonal=False)
    mean, var = (backend.numpy(a) for a in model.predict_f(X))
    pred = model.predict_y(X, batch_size=8)
    ref_mean, ref_var = reference.predictive_moments(name, mean, var, **params_of(name))
    np.testing.assert_allclose(backend.numpy(pred.mean), ref_mean, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(backend.numpy(pred.variance), ref_var, rtol=1e-5, atol=1e-9)
    assert pred.quantiles is None


@pytest.mark.parametrize("name, tol", [("gaussian", 1e-8), ("studentt", 0.06), ("poisson_exp", 0.0)])
def test_predictive_quantiles(backend, name, tol):
    """Closed form (Gaussian) or 20000 Monte Carlo draws against the quantiles of the CDF."""
    model, X, _ = build(backend, name, whiten=True, diagonal=False)
    X = X[:5]
    mean, var = (backend.numpy(a) for a in model.predict_f(X))
    levels = (0.1, 0.5, 0.9)
    q = backend.numpy(model.predict_y(X, quantiles=levels, num_samples=20000, seed=1).quantiles)
    assert q.shape == (3, 5)
    ref = np.array([[reference.predictive_quantile(name, m, v, p, **params_of(name)) for m, v in zip(mean, var)] for p in levels])
    if name == "poisson_exp":  # discrete: a count, the exact quantile or its neighbour
        assert np.all(q == np.round(q)) and np.all(np.abs(q - ref) <= 1) and np.mean(q == ref) > 0.8
        few = backend.numpy(model.predict_y(X, quantiles=levels, num_samples=4, seed=2).quantiles)
        assert np.all(few == np.round(few))  # a level between two draws takes the lower, not a blend
    else:
        np.testing.assert_allclose(q, ref, rtol=tol, atol=tol)
    if name == "gaussian":  # closed form: batches of rows (the last one partial) change nothing
        batched = model.predict_y(X, quantiles=levels, num_samples=20000, seed=1, batch_size=2).quantiles
        np.testing.assert_allclose(backend.numpy(batched), q, rtol=1e-12, atol=1e-12)


def test_softmax_probabilities(backend):
    rng = np.random.default_rng(0)
    X, Z = rng.normal(size=(12, 2)), rng.normal(size=(5, 2))
    gp = backend.lib.SVGP(backend.kernel("rbf", [1.0, 1.0], 1.0), backend.array(Z), num_latent=3)
    backend.set(gp, q_mu=rng.normal(size=(3, 5)))
    model = backend.lib.GPModel(gp, backend.lib.Softmax(3, num_samples=2000))
    pred = model.predict_y(backend.array(X))
    probs = backend.numpy(pred.mean)
    assert probs.shape == (12, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-10)
    np.testing.assert_allclose(backend.numpy(pred.variance), probs * (1 - probs))
    mean, _ = model.predict_f(backend.array(X))
    assert np.mean(np.argmax(probs, -1) == np.argmax(backend.numpy(mean), -1)) > 0.8
    with pytest.raises(ValueError, match="quantiles"):
        model.predict_y(backend.array(X), quantiles=(0.5,))


def test_joint_samples_have_the_posterior_moments(backend):
    model, X, _ = build(backend, "gaussian", whiten=True, diagonal=False)
    X = X[:6]
    S = 4000
    samples = backend.numpy(model.sample_f(X, num_samples=S, seed=3))
    assert samples.shape == (S, 6)
    mean, cov = (backend.numpy(a) for a in model.predict_f(X, full_cov=True))
    z = (samples.mean(0) - mean) / np.sqrt(np.diag(cov) / S)
    assert np.all(np.abs(z) < 4.5)
    np.testing.assert_allclose(np.cov(samples.T), cov, atol=0.1 * np.max(np.diag(cov)))
    again = backend.numpy(model.sample_f(X, num_samples=S, seed=3))
    np.testing.assert_array_equal(samples, again)
    other = backend.numpy(model.sample_f(X, num_samples=S, seed=4))  # another seed, other draws
    assert not np.any(np.all(samples == other, axis=-1))


def test_joint_samples_of_latent_functions_have_their_posterior_moments(backend):
    """``num_latent = 2``: draws ``(S, N, L)``, each latent function's mean and covariance those of
    ``predict_f(full_cov=True)`` (``(N, L)`` and ``(L, N, N)``) at the same points, in order."""
    rng, S = np.random.default_rng(1), 4000
    X, Z = rng.normal(size=(5, 2)), rng.normal(size=(4, 2))
    gp = backend.lib.SVGP(backend.kernel("rbf", [1.0, 1.0], 1.0), backend.array(Z), num_latent=2)
    q_sqrt = np.tril(0.3 * rng.normal(size=(2, 4, 4)), -1) + np.stack([np.diag(rng.uniform(0.3, 0.8, 4)) for _ in range(2)])
    backend.set(gp, q_mu=rng.normal(size=(2, 4)), q_sqrt=q_sqrt)  # each latent function its own q
    model = backend.lib.GPModel(gp, backend.lib.Softmax(2))  # a likelihood of two latent functions
    samples = backend.numpy(model.sample_f(backend.array(X), num_samples=S, seed=3))
    mean, cov = (backend.numpy(a) for a in model.predict_f(backend.array(X), full_cov=True))
    assert samples.shape == (S, 5, 2) and mean.shape == (5, 2) and cov.shape == (2, 5, 5)
    for latent in range(2):
        draws = samples[..., latent]
        z = (draws.mean(0) - mean[:, latent]) / np.sqrt(np.diag(cov[latent]) / S)
        assert np.all(np.abs(z) < 4.5), (latent, z)
        np.testing.assert_allclose(np.cov(draws.T), cov[latent], atol=0.1 * np.max(np.diag(cov[latent])))


def test_parameters_can_be_substituted(backend):
    model, X, _ = build(backend, "gaussian", whiten=True, diagonal=False)
    before = backend.numpy(model.predict_f(X)[0])
    params = {"gp.q_mu": backend.array(np.zeros(7)), "likelihood.variance": backend.array(0.5)}
    mean, var = model.predict_f(X, params=params)
    np.testing.assert_allclose(backend.numpy(mean), 0.0, atol=1e-14)
    pred = model.predict_y(X, params=params)
    np.testing.assert_allclose(backend.numpy(pred.variance), backend.numpy(var) + 0.5, rtol=1e-12)
    np.testing.assert_allclose(backend.numpy(model.predict_f(X)[0]), before)  # nothing changed for good


@pytest.mark.parametrize("name", MOMENT_LIKELIHOODS)
def test_backends_agree_on_predictions(name):
    results = []
    for backend in (PyroBackend(), NumPyroBackend()):
        backend.reset()
        model, X, _ = build(backend, name, whiten=True, diagonal=False)
        pred = model.predict_y(X, batch_size=8)
        results.append([backend.numpy(pred.mean), backend.numpy(pred.variance)])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("kwargs, match", [(dict(quantiles=(0.0, 0.5)), "quantiles"), (dict(quantiles=(1.5,)), "quantiles"), (dict(batch_size=0), "batch_size")])
def test_bad_prediction_arguments(backend, kwargs, match):
    model, X, _ = build(backend, "gaussian", whiten=True, diagonal=False)
    with pytest.raises(ValueError, match=match):
        model.predict_y(X, **kwargs)
    with pytest.raises(ValueError, match="X"):
        model.predict_y(X[:, :1])


def test_numpyro_predictions_compile_once_per_object_and_shape(caplog):
    """A second call with the same object and shapes (other parameter values included) reuses the
    compiled program; another batch shape, option or object compiles a new one. Compilations are
    counted from JAX's compile log: the sizes of the jit caches, counted before, once failed to grow
    for a new shape in a full run (eviction from JAX's process-wide cache is the suspect)."""
    import jax

    backend = NumPyroBackend()
    model, X, _ = build(backend, "gaussian", whiten=True, diagonal=False)

    def compiled(*names):
        messages = [r.getMessage() for r in caplog.records]
        return tuple(sum(m.startswith(f"Compiling jit({n})") for m in messages) for n in names)

    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        model.predict_f(X, batch_size=8)
        model.predict_y(X, batch_size=8, quantiles=(0.1, 0.9))
        assert compiled("_compiled_moments", "_compiled_predictive") == (1, 1)
        first = backend.numpy(model.predict_f(X, batch_size=8)[0])
        model.predict_y(X, batch_size=8, quantiles=(0.1, 0.9))
        moved = model.predict_f(X, batch_size=8, params={"gp.q_mu": backend.array(np.zeros(7))})[0]
        assert compiled("_compiled_moments", "_compiled_predictive") == (1, 1)
        np.testing.assert_allclose(backend.numpy(moved), 0.0, atol=1e-14)  # the values are not baked in
        np.testing.assert_array_equal(backend.numpy(model.predict_f(X, batch_size=8)[0]), first)
        model.predict_f(X, batch_size=5)
        assert compiled("_compiled_moments") == (2,)
