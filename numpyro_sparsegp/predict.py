"""Prediction from any GP prior component (documented in :mod:`sparsegp_common.prediction`)."""
import functools

import jax
import jax.numpy as jnp
from numpyro import handlers

from sparsegp_common import prediction as core
from sparsegp_common.prediction import Prediction

from . import checks

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


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _moments(Xb, batch, values, prior, full_cov, state):
    with handlers.substitute(data=values):
        return prior.bind().posterior().marginals(Xb, full_cov=full_cov)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7, 8))
def _predictive(Xb, batch, values, key, prior, likelihood, levels, num_samples, state):
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
    X = checks.inputs(X, "X", prior.input_dim)
    values = _values(params, prior)
    if full_cov:
        return _moments(X, 0, values, prior, True, prior.static_state())
    return _map_batches(_moments, X, batch_size, values, prior, False, prior.static_state())


def predict_y(prior, likelihood, X, *, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
    levels = None if quantiles is None else checks.probabilities(quantiles, "quantiles")
    X = checks.inputs(X, "X", prior.input_dim)
    values = _values(params, prior, likelihood)
    (mean, var), q = _map_batches(_predictive, X, batch_size, values, jax.random.PRNGKey(seed), prior, likelihood,
                                  levels, num_samples, prior.static_state())
    return Prediction(mean, var, None if q is None else q.T)


def sample_f(prior, X, num_samples=1, *, seed=0, jitter=1e-6, params=None):
    num_samples = checks.positive_int(num_samples, "num_samples")
    mean, cov = predict_f(prior, X, full_cov=True, params=params)
    return core.joint_draws(mean, cov, num_samples, jax.random.PRNGKey(seed), jitter)


predict_f.__doc__, predict_y.__doc__, sample_f.__doc__ = core.PREDICT_F, core.PREDICT_Y, core.SAMPLE_F
