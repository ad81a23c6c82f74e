"""Prediction (``predict_f``, ``predict_y``, ``sample_f``, written once in
:mod:`sparsegp_common.inference.prediction`); NumPyro runs each batch in one program compiled once per
prior, likelihood, option and batch shape, with the parameter values as its arguments."""
import functools

import jax
import jax.numpy as jnp
from numpyro import handlers

from sparsegp_common.inference.prediction import ComponentState, Prediction, make_predictions

from . import checks

__all__ = ["ComponentState", "Prediction", "inspect", "predict_f", "predict_y", "sample_f"]


def _map_batches(fn, X, batch_size, *extra):
    """``fn(Xb, b, *extra)`` over row batches ``b`` of ``X`` (padded to equal size), results
    concatenated."""
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
def _compiled_moments(Xb, batch, values, prior, full_cov, part):
    with handlers.substitute(data=values):
        return prior.bind().posterior(part).marginals(Xb, full_cov=full_cov)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _compiled_predictive(Xb, batch, values, key, prior, likelihood, levels, num_samples):
    key = jax.random.fold_in(key, batch)
    with handlers.substitute(data=values):
        mean, var = prior.bind().posterior().marginals(Xb)
        bound = likelihood.bind()
        moments = bound.predictive_moments(mean, var, key=key)
        if levels is None:
            return moments, None
        q = bound.predictive_quantiles(mean, var, jnp.asarray(levels, mean.dtype), num_samples, key=key)
        return moments, q.T  # batches are concatenated along the first axis


def _moments(prior, X, full_cov, batch_size, params, part="f"):
    values = _values(params, prior)
    if full_cov:
        return _compiled_moments(X, 0, values, prior, True, part)
    return _map_batches(_compiled_moments, X, batch_size, values, prior, False, part)


def _predictive(prior, likelihood, X, levels, batch_size, num_samples, seed, params):
    values = _values(params, prior, likelihood)
    (mean, var), q = _map_batches(_compiled_predictive, X, batch_size, values, jax.random.PRNGKey(seed), prior,
                                  likelihood, levels, num_samples)
    return mean, var, None if q is None else q.T


def _key(seed, like):
    return jax.random.PRNGKey(seed)


def _evaluate(prior, params, fn):
    values = _values(params, prior)
    with handlers.substitute(data=values):
        return fn(prior.bind()), values


predict_f, predict_y, sample_f, inspect = make_predictions(_moments, _predictive, _key, _evaluate, checks, __name__)
