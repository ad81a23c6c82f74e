"""Prediction from any GP prior component, documented once for both backends: latent moments,
observed-value moments and quantiles through a likelihood, and joint posterior draws, in batches
with bounded memory.

``params`` (e.g. ``FitResult.params``) substitutes parameter values; without it the trained
values that ``fit`` leaves are used (Pyro's modules hold them; NumPyro's ``fit`` writes them back into
the objects). Pyro evaluates without an autograd graph; NumPyro runs each batch in one compiled
program (the last batch padded to the same shape), compiled once per prior (and likelihood)
object, option and batch shape, with the parameter values as arguments, so later calls reuse it.
"""
from typing import Any, NamedTuple, Optional

from sparsegp_common.checks import one_of, positive_int, probabilities
from sparsegp_common.linalg import cholesky
from sparsegp_common.ops import backend


PARTS = ("f", "mean", "gp", "components")


class Prediction(NamedTuple):
    """Moments of the predictive distribution of ``y`` (tensors in Pyro, arrays in NumPyro).

    Attributes:
        mean: ``(N,)`` (``(N, C)`` class probabilities for ``Softmax``).
        variance: same shape as ``mean``.
        quantiles: ``(Q, N)`` for the requested levels, or None.
    """

    mean: Any
    variance: Any
    quantiles: Optional[Any]


class ComponentState(NamedTuple):
    """A GP prior component read with its trained values (``prior.inspect()``).

    Attributes:
        kl: ``KL[q(u) || p(u)]``, a scalar (exact, also where training subsamples it).
        q_u: the distribution ``q(u)`` of the component's global site ``<name>.u`` (a PPL
            distribution; ``.mean``, ``.covariance_matrix``), or None for methods without one.
        params: ``{name: constrained value}`` of every parameter of the component, sorted by
            name (kernel hyperparameters, inducing inputs, ``q_mu``, ``q_sqrt``, ...).
    """

    kl: Any
    q_u: Any
    params: dict


INSPECT = """The component's KL, ``q(u)`` and parameter values, read with the trained values
    ``fit`` leaves (or ``params``, e.g. ``FitResult.params``), outside any inference; the same call
    in both backends.

    Returns:
        ComponentState: ``kl``, ``q_u`` and ``params``.
    """

PREDICT_F = """Moments of ``q(f(X))``.

    Args:
        prior: a GP prior component.
        X: inputs ``(N, D)``.
        full_cov: return the ``(N, N)`` (``(L, N, N)``) covariance instead of variances; then
            ``X`` is not batched.
        batch_size: rows per batch for the diagonal case (memory is O(batch_size * M)).
        part: ``"f"`` (``f = m + g``), ``"mean"`` (the prior's mean function ``m``: zero
            variance), ``"gp"`` (the zero-mean GP ``g``) or ``"components"`` (each component
            ``g_t`` of ``g = sum_t g_t``, for features with a component axis such as
            ``HarmonicFeatures``: mean and variance ``(N, T)``, ``(N, T, L)``).
        params: optional ``{name: value}`` parameter values (e.g. ``FitResult.params``); by
            default the trained values ``fit`` leaves.

    Returns:
        mean ``(N,)`` (``(N, L)``) and variance of the same shape, or covariance.
    """

PREDICT_Y = """Moments and quantiles of the predictive ``p(y*) = int p(y* | f) q(f) df`` at ``X``.

    Args:
        prior, X, batch_size, params: as for ``predict_f``.
        likelihood: the observation model.
        quantiles: levels in (0, 1), e.g. ``(0.025, 0.5, 0.975)``, or None. Closed form for
            ``Gaussian``; otherwise from ``num_samples`` draws of ``y*`` per input, seeded by
            ``seed`` (Pyro's global RNG is left untouched).

    Returns:
        Prediction: ``mean``, ``variance`` and ``quantiles`` (``(Q, N)`` or None).
    """

SAMPLE_F = """Joint draws of ``f(X)`` from ``q(f)``: shape ``(num_samples, N)`` (``(S, N, L)``).

    Uses the full ``N x N`` posterior covariance (plus ``jitter``), so ``N`` should be at most a
    few thousand; for per-point uncertainty of large test sets use ``predict_f``. The draws come
    from ``seed`` alone (Pyro's global RNG is left untouched).
    """


def joint_draws(mean, cov, num_samples, key, jitter):
    """``mean + chol(cov + jitter I) eps``: ``(S, N)`` from ``mean`` ``(N,)`` and ``cov``
    ``(N, N)``, or ``(S, N, L)`` from ``(N, L)`` and ``(L, N, N)``; ``eps`` from ``key``."""
    L = cholesky(cov, jitter)
    eps = backend(mean).normal(key, (num_samples,) + tuple(L.shape[:-1]) + (1,), mean)
    f = (L @ eps)[..., 0]
    return mean + (f if mean.ndim == 1 else f.mT)


def make_predictions(moments, predictive, key, evaluate, checks, module):
    """The backend's ``predict_f``, ``predict_y``, ``sample_f`` and ``inspect``, with their checks
    and docs written once, around the backend's evaluation:

    - ``moments(prior, X, full_cov, batch_size, params, part)``: ``(mean, var or cov)`` of
      ``q(f(X))`` (``prior.posterior(part)``);
    - ``predictive(prior, likelihood, X, levels, batch_size, num_samples, seed, params)``:
      ``(mean, variance, quantiles or None)`` of ``p(y*)``;
    - ``key(seed, like)``: a random key for :func:`joint_draws` on the device of ``like``;
    - ``evaluate(prior, params, fn)``: ``(fn(prior with its parameter values), {name: value})``;
    - ``checks``: the backend's ``checks`` module (``inputs``)."""

    def predict_f(prior, X, *, full_cov=False, batch_size=4096, part="f", params=None):
        X = checks.inputs(X, "X", prior.input_dim, like=prior.first_parameter())
        return moments(prior, X, full_cov, positive_int(batch_size, "batch_size"), params, one_of(part, "part", PARTS))

    def predict_y(prior, likelihood, X, *, quantiles=None, batch_size=4096, num_samples=1000, seed=0, params=None):
        levels = None if quantiles is None else probabilities(quantiles, "quantiles")
        X = checks.inputs(X, "X", prior.input_dim, like=prior.first_parameter())
        batch_size, num_samples = positive_int(batch_size, "batch_size"), positive_int(num_samples, "num_samples")
        return Prediction(*predictive(prior, likelihood, X, levels, batch_size, num_samples, seed, params))

    def sample_f(prior, X, num_samples=1, *, seed=0, jitter=1e-6, params=None):
        num_samples = positive_int(num_samples, "num_samples")
        mean, cov = predict_f(prior, X, full_cov=True, params=params)
        return joint_draws(mean, cov, num_samples, key(seed, mean), jitter)

    def inspect(prior, *, params=None):
        def read(bound):
            posterior = bound.posterior()
            return posterior.kl(), posterior.q_u()

        (kl, q_u), values = evaluate(prior, params, read)
        return ComponentState(kl, q_u, dict(sorted(values.items())))

    for fn, doc in ((predict_f, PREDICT_F), (predict_y, PREDICT_Y), (sample_f, SAMPLE_F), (inspect, INSPECT)):
        fn.__module__, fn.__doc__ = module, doc
    return predict_f, predict_y, sample_f, inspect
