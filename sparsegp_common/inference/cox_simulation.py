"""Posterior-predictive point patterns of a Cox process (:meth:`CoxProcess.simulate
<sparsegp_common.objectives.cox.CoxProcess.simulate>`): thinning with draws of ``f`` whose memory is
linear in the number of candidates."""
import math
import warnings

import numpy as np

from sparsegp_common.linalg import cholesky
from sparsegp_common.objectives import windows
from sparsegp_common.ops import device, namespace
from sparsegp_common.variational import PointMass
from sparsegp_common.variational.conditionals import conditional


def simulate(cox, num_samples, seed, params, batch_size, num_anchors):
    """:meth:`CoxProcess.simulate <sparsegp_common.objectives.cox.CoxProcess.simulate>` of ``cox``."""
    checks = cox._checks
    num_samples = checks.positive_int(num_samples, "num_samples")
    batch_size = checks.positive_int(batch_size, "batch_size")
    anchors = windows.anchor_points(cox.window, checks.positive_int(num_anchors, "num_anchors"))
    grid = cox.window.default_rule().layout(cox.window).points
    grid = cox.as_array(np.concatenate([grid[cox.window.contains(grid)], anchors]))  # a Polygon's inside only
    mean, var = cox._predict.predict_f(cox.prior, grid, params=params)
    xp = namespace(mean, var)
    log_bound = float(xp.max(mean + 5 * xp.sqrt(var) + cox.offset_at(grid)))

    def moments(points):  # of log lambda = f + offset at NumPy points
        X = cox.as_array(points)
        mean, cov = cox._predict.predict_f(cox.prior, X, full_cov=True, params=params)
        return mean + cox.offset_at(X), cov

    draws = AnchoredDraws(moments, anchors, batch_size, checks.host)
    rng = np.random.default_rng(seed)
    patterns = [cox.as_array(windows.thin(cox.window, log_bound, draws, rng)) for _ in range(num_samples)]
    if max(draws.unexplained, default=0.0) > 0.01:
        warnings.warn(
            f"CoxProcess.simulate: the {len(anchors)} anchor points left up to {max(draws.unexplained):.1%} of the "
            "variance of f at the candidates, drawn independently per candidate (its correlation dropped); "
            "pass a larger num_anchors for a closer joint draw.", UserWarning, stacklevel=3)
    return patterns


def padded(X, size):
    """NumPy ``X`` ``(n, d)`` with its last row repeated up to ``size >= n`` rows."""
    return np.concatenate([X, np.repeat(X[-1:], size - len(X), axis=0)])


def simulation_jitter(cov):
    """The jitter of :class:`AnchoredDraws`' factorisations: ``1e-6`` (float32: ``1e-4``) times
    the mean variance on ``cov``'s diagonal, at least ``1e-12``."""
    xp = namespace(cov)
    scale = float(xp.mean(xp.linalg.diagonal(cov)))
    return max(scale * (1e-6 if cov.dtype == xp.float64 else 1e-4), 1e-12)


class AnchoredDraws:
    """Draws of a Gaussian process ``g`` (``f + offset`` in :meth:`CoxProcess.simulate`) given only
    through ``moments``, one per call, with memory linear in the number of points.

    ``draws(X, seed)`` for ``C <= batch_size`` rows: ``mean + chol(cov + jitter I) eps``, the joint
    draw. More: a joint draw ``y_R = mean_R + L_R eps_R`` at the ``R`` anchors (``L_R =
    chol(cov_RR + jitter I)``, computed once; the jitter acts as an observation noise on the
    anchors' values), then each batch ``B`` of rows from ``q(g_B | y_R)``, per row::

        g_b = mean_b + v_b^T eps_R + sqrt(cov_bb - |v_b|^2) eps_b,    v_b = L_R^{-1} cov_Rb,

    whose marginal is ``N(mean_b, cov_bb)`` exactly and whose covariance with the anchors and,
    through them, with the other rows is ``q``'s; rows are independent given ``y_R``. Rows are
    batched and padded on the host (a single joint draw to a power of two), so that NumPyro
    compiles few shapes.

    Args:
        moments: ``moments(P) -> (mean (n,), cov (n, n))`` of ``g`` at NumPy points ``P (n, d)``,
            in the backend's arrays.
        anchors: NumPy ``(R, d)``.
        batch_size: rows per batch.
        host: the backend's ``checks.host`` (an array as NumPy).

    Attributes:
        unexplained: per call, the fraction of the variance drawn independently per row,
            ``sum_b (cov_bb - |v_b|^2) / sum_b cov_bb`` (0 for a joint draw).
    """

    def __init__(self, moments, anchors, batch_size, host):
        self.moments, self.anchors, self.batch_size, self.host = moments, anchors, batch_size, host
        self.unexplained, self._factor = [], None

    def anchor_factor(self):
        """``L_R``, once."""
        if self._factor is None:
            _, cov = self.moments(self.anchors)
            self._factor = cholesky(cov, simulation_jitter(cov))
        return self._factor

    def __call__(self, X, seed):
        """One draw at the rows of NumPy ``X`` ``(C, d)``, from the NumPy ``seed``: NumPy ``(C,)``."""
        rng, C, B = np.random.default_rng(seed), len(X), self.batch_size
        if C <= B:
            size = min(2 ** math.ceil(math.log2(max(C, 1))), B)
            mean, cov = self.moments(padded(X, size))
            L = cholesky(cov, simulation_jitter(cov))
            self.unexplained.append(0.0)
            return self.host(mean + (L @ self._normal(rng, size, L)[:, None])[:, 0])[:C]
        L_R = self.anchor_factor()
        xp, R = namespace(L_R), L_R.shape[0]
        eps_R = self._normal(rng, R, L_R)
        parts, residual, total = [], 0.0, 0.0
        for start in range(0, C, B):
            n = min(B, C - start)
            mean, cov = self.moments(np.concatenate([self.anchors, padded(X[start : start + n], B)]))
            marginal = xp.linalg.diagonal(cov)[R:]
            shift, var = conditional(cov[:R, R:], L_R, marginal, PointMass(eps_R))  # given the anchors
            g = mean[R:] + shift + xp.sqrt(var) * self._normal(rng, B, L_R)
            parts.append(self.host(g)[:n])  # sliced on the host: a new shape would compile in NumPyro
            residual, total = residual + self.host(var)[:n].sum(), total + self.host(marginal)[:n].sum()
        self.unexplained.append(float(residual / max(total, np.finfo(np.float64).tiny)))
        return np.concatenate(parts)

    @staticmethod
    def _normal(rng, n, like):
        return namespace(like).asarray(rng.standard_normal(n), dtype=like.dtype, device=device(like))
