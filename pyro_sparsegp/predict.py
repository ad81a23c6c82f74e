"""Prediction from any GP prior component: latent moments, observed-value moments and quantiles
through a likelihood, and posterior function samples, in batches with bounded memory.

``params`` (e.g. ``FitResult.params``) substitutes parameter values; by default they are read from
Pyro's param store, where ``fit`` leaves them.
"""
import contextlib

import torch
from pyro import poutine

from sparsegp_common.prediction import Prediction

from . import checks
from .linalg import cholesky
from .params import active

__all__ = ["Prediction", "predict_f", "predict_y", "sample_f"]


@contextlib.contextmanager
def _evaluating(module, params, seed=None):
    """``module`` active, without autograd graph, with optional parameter values and a local RNG seed."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if params is not None:  # only the module's own: substitute warns about names it does not see
            own = {k: v for k, v in params.items() if k.startswith(module.name + ".")}
            stack.enter_context(poutine.substitute(data=own))
        stack.enter_context(active(module))
        if seed is not None:
            stack.enter_context(torch.random.fork_rng())  # the global RNG is left as it was
            torch.manual_seed(seed)
        yield


def _batches(X, batch_size):
    batch_size = checks.positive_int(batch_size, "batch_size")
    return [X[i : i + batch_size] for i in range(0, X.shape[0], batch_size)]


def predict_f(prior, X, *, full_cov=False, batch_size=4096, params=None):
    """Moments of ``q(f(X))``.

    Args:
        prior: a GP prior component.
        X: inputs ``(N, D)``.
        full_cov: return the ``(N, N)`` (``(L, N, N)``) covariance instead of variances; then
            ``X`` is not batched.
        batch_size: rows per batch for the diagonal case (memory is O(batch_size * M)).
        params: optional ``{name: value}`` parameter values.

    Returns:
        mean ``(N,)`` (``(N, L)``) and variance of the same shape, or covariance.
    """
    X = checks.inputs(X, "X", prior.input_dim)
    with _evaluating(prior, params):
        posterior = prior.posterior()
        if full_cov:
            return posterior.marginals(X, full_cov=True)
        parts = [posterior.marginals(Xb) for Xb in _batches(X, batch_size)]
    return torch.cat([m for m, _ in parts]), torch.cat([v for _, v in parts])


def predict_y(prior, likelihood, X, *, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
    """Moments and quantiles of the predictive ``p(y*) = int p(y* | f) q(f) df`` at ``X``.

    Args:
        prior, X, batch_size, params: as for :func:`predict_f`.
        likelihood: the observation model.
        quantiles: levels in (0, 1), e.g. ``(0.025, 0.5, 0.975)``, or None. Closed form for
            ``Gaussian``; otherwise from ``num_samples`` draws of ``y*`` per input (seeded by
            ``seed``; the global RNG is left untouched).

    Returns:
        Prediction: ``mean``, ``variance`` and ``quantiles`` (``(Q, N)`` or None).
    """
    levels = None if quantiles is None else checks.probabilities(quantiles, "quantiles")
    mean, var = predict_f(prior, X, batch_size=batch_size, params=params)
    with _evaluating(likelihood, params, seed):
        moments = [likelihood.predictive_moments(m, v) for m, v in zip(mean.split(batch_size), var.split(batch_size))]
        q = None
        if levels is not None:
            q = torch.cat([
                likelihood.predictive_quantiles(m, v, torch.as_tensor(levels, dtype=m.dtype), num_samples)
                for m, v in zip(mean.split(batch_size), var.split(batch_size))
            ], dim=-1)
    return Prediction(torch.cat([a for a, _ in moments]), torch.cat([b for _, b in moments]), q)


def sample_f(prior, X, num_samples=1, *, seed=0, jitter=1e-6, params=None):
    """Joint draws of ``f(X)`` from ``q(f)``: shape ``(num_samples, N)`` (``(S, N, L)``).

    Uses the full ``N x N`` posterior covariance (plus ``jitter``), so ``N`` should be at most a
    few thousand; for per-point uncertainty of large test sets use :func:`predict_f`.
    """
    num_samples = checks.positive_int(num_samples, "num_samples")
    mean, cov = predict_f(prior, X, full_cov=True, params=params)
    with torch.random.fork_rng():  # the global RNG is left as it was
        torch.manual_seed(seed)
        L = cholesky(cov, jitter)
        if mean.dim() == 1:
            eps = torch.randn(num_samples, mean.shape[0], 1, dtype=mean.dtype, device=mean.device)
            return mean + (L @ eps).squeeze(-1)
        eps = torch.randn(num_samples, *L.shape[:-1], 1, dtype=mean.dtype, device=mean.device)
        return mean + (L @ eps).squeeze(-1).transpose(-1, -2)
