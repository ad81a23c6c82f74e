"""Mean functions of a GP prior, written once for every backend: ``f = m + g``, ``g`` the method's
zero-mean GP.

Every mean function is linear in features of the inputs, ``m(X) = F(X) @ coefficients``, so one
formula serves them all: :class:`Constant` (``F = 1``), :class:`Linear` (``F = [1, X]``) and
:class:`Covariates` (``F = [1, c(X)]`` for covariates ``c``: a function of the inputs or a
:class:`~sparsegp_common.data.raster.Raster` of images). The coefficients are one learnable parameter
``<prior>.mean_function.coefficients`` of shape ``(P,)``, shared by all latent functions, or
``(L, P)``, one row per latent function; the intercept comes first.

A prior takes one as ``mean_function=``; its ``posterior().marginals`` then carry the mean, so
every objective, prediction, intensity and export includes it. ``predict_f(..., part="mean")``
and ``part="gp"`` give the two parts separately.
"""
import math

import numpy as np

from sparsegp_common.linalg import solve_lower
from sparsegp_common.ops import device, namespace

#: Initial scale of ``q`` (``coefficients_scale_tril = INIT_SCALE * I``) when the coefficients have a
#: prior, as autoguides start.
INIT_SCALE = 0.1


class MeanFunction:
    """Base class: ``m(X) = features(X) @ coefficients``; subclasses define :meth:`features`.

    With ``prior`` (a distribution of the PPL, e.g. ``Normal(0, 10)``, expanded to the
    coefficients' shape), the coefficients are a sample site ``<prior>.mean_function.coefficients``
    instead of a parameter: drawn from ``prior`` in the model and from ``q = N(loc, S)``,
    ``S = scale_tril scale_tril^T`` (parameters ``coefficients_loc`` and ``coefficients_scale_tril``
    ``(..., P, P)``: the coefficients' correlations are kept) in the prior component's guide, so a
    user's guide can take them over (hide them with ``site_names``) and the export holds their
    draws. Predictions integrate over ``q``: the mean function's part has variance ``F S F^T``.
    """

    def __init__(self, coefficients, prior=None):
        super().__init__()
        coefficients = self._checks.finite(self._checks.as_array(coefficients, "coefficients"), "coefficients")
        if coefficients.ndim not in (1, 2):
            raise ValueError(f"coefficients must have shape (P,) or (L, P), got {tuple(coefficients.shape)}")
        if prior is not None and not hasattr(prior, "log_prob"):
            raise TypeError(f"prior must be a distribution of the PPL, got {type(prior).__name__}")
        self.coefficient_prior = prior
        if prior is None:
            self._param("coefficients", coefficients)
        else:
            xp = namespace(coefficients)
            eye = INIT_SCALE * xp.eye(coefficients.shape[-1], dtype=coefficients.dtype, device=device(coefficients))
            self._param("coefficients_loc", coefficients)
            self._param("coefficients_scale_tril", xp.asarray(xp.broadcast_to(eye, coefficients.shape + eye.shape[-1:]),
                                                              copy=True), "lower_cholesky")

    @property
    def shape(self):
        """Shape of the coefficients, ``(P,)`` or ``(L, P)``."""
        return tuple((self.coefficients if self.coefficient_prior is None else self.coefficients_loc).shape)

    @property
    def num_features(self):
        return self.shape[-1]

    def features(self, X):
        """``F(X)``: ``(N, P)``."""
        raise NotImplementedError

    def evaluate(self, X, coefficients=None):
        """``m(X)``: ``(N,)`` for coefficients ``(P,)``, ``(N, L)`` for ``(L, P)``; with a prior, at
        the given (sampled) ``coefficients``."""
        c = coefficients
        if c is None:
            if self.coefficient_prior is not None:
                raise ValueError("this mean function's coefficients have a prior: its value needs sampled "
                                 "coefficients (this objective takes fitted coefficients only: drop the prior)")
            c = self.coefficients
        return _apply(self.features(X), c, len(self.shape) == 2)

    def moments(self, X):
        """``m(X)`` under ``q``: its mean ``(N,)`` / ``(N, L)``, and its loadings ``F(X) L_c``
        ``(N, P)`` / ``(L, N, P)`` on the standardised coefficients (``m = mean + loadings e``,
        ``e ~ N(0, I)``; None without a prior)."""
        F = self.features(X)
        if self.coefficient_prior is None:
            return _apply(F, self.coefficients, len(self.shape) == 2), None
        return _apply(F, self.coefficients_loc, len(self.shape) == 2), F @ self.coefficients_scale_tril

    def coefficient_distribution(self, guide):
        """The coefficients' prior (model) or ``q`` (guide), with event shape :attr:`shape`."""
        shape = self.shape
        if guide:
            q = self._dist.MultivariateNormal(self.coefficients_loc, scale_tril=self.coefficients_scale_tril)
            return q.to_event(len(shape) - 1)
        prior = self.coefficient_prior
        if tuple(prior.event_shape) == shape:
            return prior
        if tuple(prior.event_shape):
            raise ValueError(f"the prior's event shape {tuple(prior.event_shape)} does not match the coefficients' {shape}")
        return prior.expand(shape).to_event(len(shape))

    def coefficient_kl(self):
        """``KL[q || prior]`` of the coefficients in closed form, for a Normal prior (0 without a prior)."""
        prior = self.coefficient_prior
        if prior is None:
            return 0.0
        if not isinstance(prior, self._dist.Normal):
            raise NotImplementedError(
                "the closed-form ELBO (elbo()) needs a Normal prior on the coefficients; with another prior, "
                "train with model/guide (SVI), which samples them")
        m, L = self.coefficients_loc, self.coefficients_scale_tril
        xp = namespace(m, L)
        mu0 = xp.broadcast_to(xp.asarray(prior.loc, dtype=m.dtype, device=device(m)), m.shape)
        s0 = xp.broadcast_to(xp.asarray(prior.scale, dtype=m.dtype, device=device(m)), m.shape)
        trace = xp.sum(L**2 / (s0**2)[..., :, None])
        log_det = 2 * xp.sum(xp.log(s0)) - 2 * xp.sum(xp.log(xp.linalg.diagonal(L)))
        return 0.5 * (trace + xp.sum((m - mu0) ** 2 / s0**2) - math.prod(m.shape) + log_det)

    def _with_intercept(self, F):
        xp = namespace(F)
        return xp.concat([xp.ones((F.shape[0], 1), dtype=F.dtype, device=device(F)), F], axis=-1)


class Zero(MeanFunction):
    """``m = 0`` (the default of every prior): no parameters."""

    def __init__(self):
        super(MeanFunction, self).__init__()

    coefficient_prior = None
    shape = (0,)

    def evaluate(self, X, coefficients=None):
        return namespace(X).zeros(X.shape[:1], dtype=X.dtype, device=device(X))

    def moments(self, X):
        return self.evaluate(X), None


class Constant(MeanFunction):
    """``m(x) = c``.

    Args:
        value: initial ``c``: a number, or ``(L,)`` for one constant per latent function.
        prior: optional distribution of the coefficients (see :class:`MeanFunction`).
    """

    def __init__(self, value=0.0, prior=None):
        value = self._checks.as_array(_exact(value), "value")
        if value.ndim > 1:
            raise ValueError(f"value must be a number or have shape (L,), got {tuple(value.shape)}")
        super().__init__(value[..., None], prior)

    def features(self, X):
        return namespace(X).ones((X.shape[0], 1), dtype=X.dtype, device=device(X))


class Linear(MeanFunction):
    """``m(x) = b + x . w``; coefficients ``[b, w_1, ..., w_D]``.

    Args:
        weights: initial ``w``: ``(D,)``, or ``(L, D)`` for L latent functions.
        bias: initial ``b``: a number, or ``(L,)``.
        prior: optional distribution of the coefficients (see :class:`MeanFunction`).
    """

    def __init__(self, weights, bias=0.0, prior=None):
        super().__init__(_stack(self._checks, weights, bias), prior)

    def features(self, X):
        if X.shape[-1] != self.num_features - 1:
            raise ValueError(f"X has {X.shape[-1]} input dimensions but the linear mean has {self.num_features - 1} weights")
        return self._with_intercept(X)


class Covariates(MeanFunction):
    """``m(x) = b + c(x) . w`` for covariates ``c`` of the inputs; coefficients ``[b, w_1, ..., w_P]``.

    Args:
        covariates: a function ``c(X (N, D)) -> (N, P)`` of the backend's arrays, or a
            :class:`~sparsegp_common.data.raster.Raster` (images interpolated at the inputs).
        weights: initial ``w``: ``(P,)``, or ``(L, P)``; by default zeros.
        bias: initial ``b``: a number, or ``(L,)``.
        prior: optional distribution of the coefficients (see :class:`MeanFunction`).
    """

    def __init__(self, covariates, weights=None, bias=0.0, prior=None):
        if not callable(covariates) and not hasattr(covariates, "evaluate"):
            raise TypeError(f"covariates must be a function of X or a Raster, got {type(covariates).__name__}")
        if weights is None:
            count = getattr(covariates, "num_images", None)
            if count is None:
                raise ValueError("weights is required for a function of X (its number of covariates is unknown)")
            weights = [0.0] * count
        super().__init__(_stack(self._checks, weights, bias), prior)
        self.covariates = covariates

    def features(self, X):
        c = self.covariates.evaluate(X) if hasattr(self.covariates, "evaluate") else self.covariates(X)
        c = self._checks.as_array(c, "covariates(X)", like=X)
        if c.ndim == 1:
            c = c[:, None]
        if c.shape != (X.shape[0], self.num_features - 1):
            raise ValueError(f"covariates(X) has shape {tuple(c.shape)}, expected ({X.shape[0]}, {self.num_features - 1})")
        return self._with_intercept(c)


def _exact(value):
    """Numbers and NumPy values in float64, so that the prior's dtype (which the coefficients follow)
    decides their precision, not the default dtype of the PPL."""
    if isinstance(value, (int, float, list, tuple, np.ndarray, np.generic)) and not isinstance(value, bool):
        try:
            return np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            return value  # as_array names the argument in its error
    return value


def _stack(checks, weights, bias):
    """``[bias, weights]`` along the last axis: ``(1 + P,)`` or ``(L, 1 + P)``."""
    weights = checks.as_array(_exact(weights), "weights")
    bias = checks.as_array(_exact(bias), "bias", like=weights)
    if weights.ndim not in (1, 2):
        raise ValueError(f"weights must have shape (P,) or (L, P), got {tuple(weights.shape)}")
    xp = namespace(weights, bias)
    bias = xp.broadcast_to(bias, weights.shape[:-1])
    return xp.concat([bias[..., None], weights], axis=-1)


def _apply(F, c, per_latent):
    """``F c``: ``(N,)`` for ``c`` ``(P,)``, ``(N, L)`` for ``(L, P)`` (``per_latent``); draws of ``c``
    with leading sample axes (``sample_shape + (1,) + (P,)`` for a data plate at dim -1) broadcast."""
    return namespace(F, c).sum((F[:, None, :] if per_latent else F) * c, axis=-1)


def add_mean(mean, m):
    """``mean + m`` for ``mean`` ``(N,)`` or ``(N, L)`` and ``m`` ``(N,)`` (shared) or ``(N, L)``."""
    return mean + (m[:, None] if mean.ndim == 2 and m.ndim == 1 else m)


class MeanShifted:
    """``q(f)`` of a prior with a mean function: the method's posterior of ``g`` (every attribute
    but ``marginals`` and ``kl`` is its own), with ``m(X)`` added to the means. ``part`` selects
    ``"f"`` (``m + g``), ``"gp"`` (``g``) or ``"mean"`` (``m``). Coefficients with a prior are
    integrated over ``q``, independent of ``q(g)``; :meth:`given` the values sampled at their
    site (the model and guide), the posterior conditional on them."""

    coefficients = None

    def __init__(self, gp, mean_function, part="f"):
        self.gp, self.mean_function, self.part = gp, mean_function, part

    def __getattr__(self, name):
        return getattr(self.gp, name)

    def given(self, coefficients):
        """This posterior given sampled coefficients (a new object; this one is unchanged)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, coefficients=coefficients)
        return new

    def kl(self):
        """The GP's KL plus the coefficients' ``KL[q || prior]`` (none once they are sampled sites)."""
        kl = self.gp.kl()
        return kl if self.coefficients is not None else kl + self.mean_function.coefficient_kl()

    def marginals(self, X, full_cov=False):
        mean, var = self.gp.marginals(X, full_cov)
        if self.part == "gp":
            return mean, var
        if self.coefficients is not None:
            return self._plus(mean, var, self.mean_function.evaluate(X, self.coefficients))
        return self._plus(mean, var, *self.mean_function.moments(X), full_cov)

    def _plus(self, mean, var, m, loadings=None, full_cov=False):
        """The ``part`` of ``g``'s moments (``mean``, ``var``) and of ``m``, plus the variance
        ``loadings loadings^T`` (``(N, P)`` or ``(L, N, P)``) of the standardised coefficients."""
        xp = namespace(mean)
        if self.part == "mean":
            mean, var = xp.zeros_like(mean), xp.zeros_like(var)
        if self.part != "gp":
            mean = add_mean(mean, m)
        if loadings is None:
            return mean, var
        if full_cov:
            return mean, var + loadings @ loadings.mT
        extra = xp.sum(loadings**2, axis=-1)
        return mean, add_mean(var, extra if extra.ndim == 1 else extra.mT)


class CoupledMean(MeanShifted):
    """``q(f)`` of an SVGP whose mean function has Gaussian-prior coefficients ``c``, jointly
    Gaussian with the GP's inducing variables ``v`` (``u``, or its whitened ``v``):

        c = coefficients_loc + L_c e,    v = q_mu + W e + q_sqrt eta,    e, eta ~ N(0, I),

    i.e. the joint Cholesky factor ``[[L_c, 0], [W, q_sqrt]]`` with ``W = q_sqrt_cross``
    ``(..., M, P)``. A coefficient confounded with the GP then gets its posterior spread (an
    independent ``q(c) q(v)`` is too sure of it); ``W = 0`` is that independent ``q``.

    Given sampled ``c`` (the model and guide) the GP's posterior is the SVGP's own with ``q_mu``
    moved by ``W e``, its KL the closed form at that ``q_mu`` (valid for any ``q(c)``, also a
    user's guide's); integrated over
    ``c``, ``f = F c + g`` has the ``e``-loadings ``F L_c + B^T W`` and the KL gains the
    coefficients' KL and ``E_e |W e|^2 / 2`` (:meth:`SVGPPosterior.cross_kl`)."""

    def __init__(self, gp, mean_function, part, cross):
        super().__init__(gp, mean_function, part)
        self.cross = cross

    def _standardised(self):
        """``e = L_c^{-1} (c - loc)`` at the sampled coefficients: ``sample_shape + (P,)`` / ``(L, P)``."""
        mf = self.mean_function
        return solve_lower(mf.coefficients_scale_tril, (self.coefficients - mf.coefficients_loc)[..., None])[..., 0]

    def _shift(self):
        """``W e``, the move of ``q_mu`` given the coefficients: ``sample_shape + q_mu.shape``."""
        e, W = self._standardised(), self.cross
        coefficient_batch = self.mean_function.shape[:-1]
        sample_shape = tuple(e.shape[:e.ndim - len(self.mean_function.shape)])
        ones = (1,) * (W.ndim - 2 - len(coefficient_batch))  # component axes, and the latent axis of shared ones
        e = namespace(e).reshape(e, sample_shape + ones + tuple(coefficient_batch) + (1, e.shape[-1]))
        return namespace(e).sum(W * e, axis=-1)

    def kl(self):
        if self.coefficients is not None:
            return self.gp.kl() + self.gp.shift_kl(self._shift())
        return self.gp.kl() + self.gp.cross_kl(self.cross) + self.mean_function.coefficient_kl()

    def q_u(self):
        """``q(u | c)`` once ``c`` is sampled, else its marginal."""
        if self.coefficients is not None:
            return self.gp.q_u(shift=self._shift())
        return self.gp.q_u(cross=self.cross)

    def marginals(self, X, full_cov=False):
        mf = self.mean_function
        mean, var, loadings = self.gp.marginals(X, full_cov, self.cross)
        if self.coefficients is not None:  # q(g | c): its mean moves by B^T W e
            xp, e = namespace(loadings), self._standardised()
            if loadings.ndim == 3:  # (L, N, P) -> (N, L, P), points first as in the means
                loadings = xp.permute_dims(loadings, (1, 0, 2))
                e = e[..., None, :] if len(mf.shape) == 1 else e
            mean = mean + xp.sum(loadings * e, axis=-1)
            return self._plus(mean, var, mf.evaluate(X, self.coefficients))
        if self.part == "gp":
            return self._plus(mean, var, None, loadings, full_cov)
        m, mean_loadings = mf.moments(X)
        return self._plus(mean, var, m, mean_loadings if self.part == "mean" else loadings + mean_loadings, full_cov)


CLASSES = (MeanFunction, Zero, Constant, Linear, Covariates)
