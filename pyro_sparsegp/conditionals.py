"""From q(u) to q(f(X)): the one place where the sparse-GP predictive formulas live.

With ``A = Luu^{-1} Kuf`` and ``B = A`` (whitened) or ``B = Luu^{-T} A`` (unwhitened):

    mean = B^T q_mu,    cov = Kff - A^T A + B^T S B,    S = q_sqrt q_sqrt^T.

``Luu=None`` stands for ``Kuu = I`` (features that are orthonormal by construction), where
whitening is the identity.
"""
import torch

from .linalg import solve_lower
from .variational import is_diagonal


def conditional(Kuf, Luu, Kff, q_mu, q_sqrt, *, whiten=True, full_cov=False):
    """Moments of q(f(X)).

    Args:
        Kuf: ``(M, N)`` or ``batch_shape + (M, N)``.
        Luu: lower Cholesky factor of Kuu, ``(..., M, M)``, or None for ``Kuu = I``.
        Kff: prior covariance, ``(..., N)`` diagonal, or ``(..., N, N)`` when ``full_cov``.
        q_mu, q_sqrt: the variational parameters (see :mod:`~pyro_sparsegp.variational`).
        whiten: whether ``u = Luu v`` with ``q(v) = N(q_mu, S)``.
        full_cov: return the full ``(..., N, N)`` covariance instead of the variances.

    Returns:
        ``mean`` of shape ``batch_shape + (N,)`` and ``var`` (``batch_shape + (N,)``) or
        ``cov`` (``batch_shape + (N, N)``).
    """
    A = Kuf if Luu is None else solve_lower(Luu, Kuf)
    B = A if (whiten or Luu is None) else solve_lower(Luu, A, transpose=True)
    mean = (q_mu.unsqueeze(-2) @ B).squeeze(-2)
    SB = q_sqrt.unsqueeze(-1) * B if is_diagonal(q_mu, q_sqrt) else q_sqrt.transpose(-1, -2) @ B
    if full_cov:
        return mean, Kff - A.transpose(-1, -2) @ A + SB.transpose(-1, -2) @ SB
    var = Kff - (A**2).sum(-2) + (SB**2).sum(-2)
    return mean, var.clamp_min(torch.finfo(var.dtype).tiny)
