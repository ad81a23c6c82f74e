"""Mean functions of a GP prior, written once for every backend: ``f = m + g``, ``g`` the method's
zero-mean GP.

Every mean function is linear in features of the inputs, ``m(X) = F(X) @ coefficients``, so one
formula serves them all: :class:`Constant` (``F = 1``), :class:`Linear` (``F = [1, X]``) and
:class:`Covariates` (``F = [1, c(X)]`` for covariates ``c``: a function of the inputs or a
:class:`~sparsegp_common.raster.Raster` of images). The coefficients are one learnable parameter
``<prior>.mean_function.coefficients`` of shape ``(P,)``, shared by all latent functions, or
``(L, P)``, one row per latent function; the intercept comes first.

A prior takes one as ``mean_function=``; its ``posterior().marginals`` then carry the mean, so
every objective, prediction, intensity and export includes it. ``predict_f(..., part="mean")``
and ``part="gp"`` give the two parts separately.
"""
import numpy as np

from .ops import device, namespace


class MeanFunction:
    """Base class: ``m(X) = features(X) @ coefficients``; subclasses define :meth:`features`."""

    def __init__(self, coefficients):
        super().__init__()
        coefficients = self._checks.finite(self._checks.as_array(coefficients, "coefficients"), "coefficients")
        if coefficients.ndim not in (1, 2):
            raise ValueError(f"coefficients must have shape (P,) or (L, P), got {tuple(coefficients.shape)}")
        self._param("coefficients", coefficients)

    @property
    def num_features(self):
        return self.coefficients.shape[-1]

    def features(self, X):
        """``F(X)``: ``(N, P)``."""
        raise NotImplementedError

    def evaluate(self, X):
        """``m(X)``: ``(N,)`` for coefficients ``(P,)``, ``(N, L)`` for ``(L, P)``."""
        F = self.features(X)
        c = self.coefficients
        return F @ c if c.ndim == 1 else F @ c.mT

    def _with_intercept(self, F):
        xp = namespace(F)
        return xp.concat([xp.ones((F.shape[0], 1), dtype=F.dtype, device=device(F)), F], axis=-1)


class Zero(MeanFunction):
    """``m = 0`` (the default of every prior): no parameters."""

    def __init__(self):
        super(MeanFunction, self).__init__()

    def evaluate(self, X):
        return namespace(X).zeros(X.shape[:1], dtype=X.dtype, device=device(X))


class Constant(MeanFunction):
    """``m(x) = c``.

    Args:
        value: initial ``c``: a number, or ``(L,)`` for one constant per latent function.
    """

    def __init__(self, value=0.0):
        value = self._checks.as_array(_exact(value), "value")
        if value.ndim > 1:
            raise ValueError(f"value must be a number or have shape (L,), got {tuple(value.shape)}")
        super().__init__(value[..., None])

    def features(self, X):
        return namespace(X).ones((X.shape[0], 1), dtype=X.dtype, device=device(X))


class Linear(MeanFunction):
    """``m(x) = b + x . w``; coefficients ``[b, w_1, ..., w_D]``.

    Args:
        weights: initial ``w``: ``(D,)``, or ``(L, D)`` for L latent functions.
        bias: initial ``b``: a number, or ``(L,)``.
    """

    def __init__(self, weights, bias=0.0):
        super().__init__(_stack(self._checks, weights, bias))

    def features(self, X):
        if X.shape[-1] != self.num_features - 1:
            raise ValueError(f"X has {X.shape[-1]} input dimensions but the linear mean has {self.num_features - 1} weights")
        return self._with_intercept(X)


class Covariates(MeanFunction):
    """``m(x) = b + c(x) . w`` for covariates ``c`` of the inputs; coefficients ``[b, w_1, ..., w_P]``.

    Args:
        covariates: a function ``c(X (N, D)) -> (N, P)`` of the backend's arrays, or a
            :class:`~sparsegp_common.raster.Raster` (images interpolated at the inputs).
        weights: initial ``w``: ``(P,)``, or ``(L, P)``; by default zeros.
        bias: initial ``b``: a number, or ``(L,)``.
    """

    def __init__(self, covariates, weights=None, bias=0.0):
        if not callable(covariates) and not hasattr(covariates, "evaluate"):
            raise TypeError(f"covariates must be a function of X or a Raster, got {type(covariates).__name__}")
        if weights is None:
            count = getattr(covariates, "num_images", None)
            if count is None:
                raise ValueError("weights is required for a function of X (its number of covariates is unknown)")
            weights = [0.0] * count
        super().__init__(_stack(self._checks, weights, bias))
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


def add_mean(mean, m):
    """``mean + m`` for ``mean`` ``(N,)`` or ``(N, L)`` and ``m`` ``(N,)`` (shared) or ``(N, L)``."""
    return mean + (m[:, None] if mean.ndim == 2 and m.ndim == 1 else m)


class MeanShifted:
    """``q(f)`` of a prior with a mean function: the method's posterior of ``g`` (every attribute
    but ``marginals`` is its own), with ``m(X)`` added to the means. ``part`` selects ``"f"``
    (``m + g``), ``"gp"`` (``g``) or ``"mean"`` (``m``, zero variance)."""

    def __init__(self, gp, mean_function, part="f"):
        self.gp, self.mean_function, self.part = gp, mean_function, part

    def __getattr__(self, name):
        return getattr(self.gp, name)

    def marginals(self, X, full_cov=False):
        mean, var = self.gp.marginals(X, full_cov)
        if self.part == "gp":
            return mean, var
        m = self.mean_function.evaluate(X)
        if self.part == "mean":
            xp = namespace(mean)
            return add_mean(xp.zeros_like(mean), m), xp.zeros_like(var)
        return add_mean(mean, m), var


CLASSES = (MeanFunction, Zero, Constant, Linear, Covariates)
