"""Prediction from any GP prior component: latent moments, observed-value moments and quantiles
through a likelihood, and posterior function samples, in batches with bounded memory.

``params`` (e.g. ``FitResult.params``) substitutes parameter values; without it the objects' own
values are used (the trained ones after ``fit``, which writes them back). Each batch runs in one compiled program (the last batch is padded to the same shape).
The programs are compiled once per prior (and likelihood) object, option and batch shape: the
parameter values are arguments, not constants, so later calls (other values, the same shapes) reuse
them.
"""
import functools

import jax
import jax.numpy as jnp
from numpyro import handlers

from sparsegp_common.prediction import Prediction

from . import checks
from .linalg import cholesky

__all__ = ["Prediction", "predict_f", "predict_y", "sample_f"]


def _map_batches(fn, X, batch_size, *extra):
    """``fn(Xb, b, *extra)`` over row batches ``b`` of ``X`` (padded to equal size), results
    concatenated."""
    batch_size = checks.positive_int(batch_size, "batch_size")
    n = X.shape[0]
    size = min(batch_size, n)
    pad = -n % size
    Xp = jnp.concatenate([X, jnp.repeat(X[-1:], pad, axis=0)]) if pad else X
    compiled = fn if hasattr(fn, "lower") else jax.jit(fn)  # already jitted: its cache is kept
    parts = [compiled(Xp[i : i + size], i, *extra) for i in range(0, n + pad, size)]
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a)[:n], *parts)


def _values(params, *objects):
    """Every parameter value the objects read (``params`` where given, else their own values), as
    the argument of the compiled programs."""
    with handlers.trace() as trace, handlers.substitute(data=params or {}):
        for obj in objects:
            obj.bind()
    return {name: site["value"] for name, site in trace.items() if site["type"] == "param"}


@functools.partial(jax.jit, static_argnums=(3, 4))
def _moments(Xb, batch, values, prior, full_cov):
    with handlers.substitute(data=values):
        return prior.bind().posterior().marginals(Xb, full_cov=full_cov)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _predictive(Xb, batch, values, key, prior, likelihood, levels, num_samples):
    key = jax.random.fold_in(key, batch)
    with handlers.substitute(data=values):
        mean, var = prior.bind().posterior().marginals(Xb)
        bound = likelihood.bind()
        moments = bound.predictive_moments(mean, var, key=key)
        if levels is None:
            return moments, None
        q = bound.predictive_quantiles(mean, var, jnp.asarray(levels, mean.dtype), num_samples, key=key)
        return moments, q.T  # batches are concatenated along the first axis


def predict_f(prior, X, *, full_cov=False, batch_size=4096, params=None):
    """Moments of ``q(f(X))``.

    Args:
        prior: a GP prior component.
        X: inputs ``(N, D)``.
        full_cov: return the ``(N, N)`` (``(L, N, N)``) covariance instead of variances; then
            ``X`` is not batched.
        batch_size: rows per batch for the diagonal case (memory is O(batch_size * M)).
        params: optional ``{name: value}`` parameter values (e.g. ``FitResult.params``; by
            default the object's own values, which ``fit`` sets to the trained ones).

    Returns:
        mean ``(N,)`` (``(N, L)``) and variance of the same shape, or covariance.
    """
    X = checks.inputs(X, "X", prior.input_dim)
    values = _values(params, prior)
    if full_cov:
        return _moments(X, 0, values, prior, True)
    return _map_batches(_moments, X, batch_size, values, prior, False)


def predict_y(prior, likelihood, X, *, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
    """Moments and quantiles of the predictive ``p(y*) = int p(y* | f) q(f) df`` at ``X``.

    Args:
        prior, X, batch_size, params: as for :func:`predict_f`.
        likelihood: the observation model.
        quantiles: levels in (0, 1), e.g. ``(0.025, 0.5, 0.975)``, or None. Closed form for
            ``Gaussian``; otherwise from ``num_samples`` draws of ``y*`` per input (seeded by
            ``seed``).

    Returns:
        Prediction: ``mean``, ``variance`` and ``quantiles`` (``(Q, N)`` or None).
    """
    levels = None if quantiles is None else checks.probabilities(quantiles, "quantiles")
    X = checks.inputs(X, "X", prior.input_dim)
    values = _values(params, prior, likelihood)
    (mean, var), q = _map_batches(_predictive, X, batch_size, values, jax.random.PRNGKey(seed), prior, likelihood,
                                  levels, num_samples)
    return Prediction(mean, var, None if q is None else q.T)


def sample_f(prior, X, num_samples=1, *, seed=0, jitter=1e-6, params=None):
    """Joint draws of ``f(X)`` from ``q(f)``: shape ``(num_samples, N)`` (``(S, N, L)``).

    Uses the full ``N x N`` posterior covariance (plus ``jitter``), so ``N`` should be at most a
    few thousand; for per-point uncertainty of large test sets use :func:`predict_f`.
    """
    num_samples = checks.positive_int(num_samples, "num_samples")
    mean, cov = predict_f(prior, X, full_cov=True, params=params)
    L = cholesky(cov, jitter)
    key = jax.random.PRNGKey(seed)
    if mean.ndim == 1:
        eps = jax.random.normal(key, (num_samples, mean.shape[0], 1), dtype=mean.dtype)
        return mean + (L @ eps)[..., 0]
    eps = jax.random.normal(key, (num_samples, *L.shape[:-1], 1), dtype=mean.dtype)
    return mean + jnp.swapaxes((L @ eps)[..., 0], -1, -2)
