"""From q(u) to q(f(X)): the one place where the sparse-GP predictive formulas live.

With ``A = Luu^{-1} Kuf`` and ``B = A`` (whitened) or ``B = Luu^{-T} A`` (unwhitened):

    mean = B^T q_mu,    cov = Kff - A^T A + B^T S B,    S = q_sqrt q_sqrt^T.

``Luu=None`` stands for ``Kuu = I`` (features that are orthonormal by construction), where
whitening is the identity. The strategies say which ``B``: :class:`Whitened` and
:class:`Unwhitened` here; decoupled and weight-space strategies reuse :func:`conditional`.
"""
from .linalg import solve_lower
from .ops import namespace


def conditional(Kuf, Luu, Kff, q, *, whiten=True, full_cov=False):
    """Moments of q(f(X)).

    Args:
        Kuf: ``(M, N)`` or ``batch_shape + (M, N)``.
        Luu: lower Cholesky factor of Kuu, ``(..., M, M)``, or None for ``Kuu = I``.
        Kff: prior covariance, ``(..., N)`` diagonal, or ``(..., N, N)`` when ``full_cov``.
        q: the variational distribution (a family of :mod:`~sparsegp_common.variational`).
        whiten: whether ``u = Luu v`` with ``q(v) = N(q_mu, S)``.
        full_cov: return the full ``(..., N, N)`` covariance instead of the variances.

    Returns:
        ``mean`` of shape ``batch_shape + (N,)`` and ``var`` (``batch_shape + (N,)``) or
        ``cov`` (``batch_shape + (N, N)``).
    """
    xp = namespace(Kuf, Luu, Kff)
    A = Kuf if Luu is None else solve_lower(Luu, Kuf)
    B = A if (whiten or Luu is None) else solve_lower(Luu, A, transpose=True)
    mean = (q.q_mu[..., None, :] @ B)[..., 0, :]
    SB = q.scale_project(B)
    if full_cov:
        return mean, Kff - A.mT @ A + SB.mT @ SB
    var = Kff - xp.sum(A**2, axis=-2) + xp.sum(SB**2, axis=-2)
    return mean, xp.clip(var, min=float(xp.finfo(var.dtype).tiny))


class Whitened:
    """``u = Luu v`` with q over ``v`` and prior ``N(0, I)``."""

    whiten = True

    def prior_factor(self, Luu):
        return None

    def marginals(self, Kuf, Luu, Kff, q, full_cov=False):
        return conditional(Kuf, Luu, Kff, q, whiten=self.whiten, full_cov=full_cov)


class Unwhitened(Whitened):
    """q over ``u`` itself, prior ``N(0, Kuu)``."""

    whiten = False

    def prior_factor(self, Luu):
        return Luu


def strategy(whiten):
    return Whitened() if whiten else Unwhitened()
