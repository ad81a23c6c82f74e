"""Variational families: q(u) = N(q_mu, S) over ``batch_shape + (M,)``, ``S = q_sqrt q_sqrt^T``.

A family is a value object built from its parameters (``q_mu`` of shape ``batch_shape + (M,)``
and a scale whose shape the family defines); ``batch_shape`` is ``()`` or ``(L,)`` for L
independent latent functions. Each family answers what the strategies and objectives ask of
q(u), so a new family (block-diagonal, natural parameters) is a new class, not a new shape test:

* ``scale_project(B)``: ``q_sqrt^T B`` for ``B`` of shape ``batch_shape + (M, N)``;
* ``covariance_change(P1, P2)``: ``P1 (S - I) P2^T`` for ``P1``, ``P2`` ``(T, M)`` (what q changes
  in the prior's ``I``);
* ``kl(Luu=None)``: ``KL[q || N(0, Luu Luu^T)]`` summed over the batch (``Luu=None``: ``N(0, I)``);
* ``distribution(dist)``: q(u) as a distribution of the PPL's ``dist`` module;
* ``initial(...)`` (class method): parameters at the prior, and ``q_sqrt_constraint``.
"""
import array_api_compat
import numpy as np

from sparsegp_common.linalg import solve_lower
from sparsegp_common.ops import backend, device, namespace

__all__ = ["CholeskyGaussian", "DiagonalGaussian", "PointMass", "family", "prior_distribution"]  # what the backends re-export


class CholeskyGaussian:
    """Full covariance: ``q_sqrt`` is ``batch_shape + (M, M)`` lower triangular, positive diagonal."""

    q_sqrt_constraint = "lower_cholesky"

    def __init__(self, q_mu, q_sqrt):
        self.q_mu, self.q_sqrt = q_mu, q_sqrt

    @classmethod
    def initial(cls, num_inducing, batch_shape, like, Luu=None):
        """``(q_mu, q_sqrt)`` at the prior, ``q_mu = 0`` of shape ``batch_shape + (M,)``; the
        whitened tables (``Luu=None``) are built on the host, so that JAX compiles nothing."""
        shape = tuple(batch_shape) + (num_inducing,)
        return backend(like).from_host(np.zeros(shape), like), cls._initial_scale(shape, like, Luu)

    @staticmethod
    def _initial_scale(shape, like, Luu):
        """``q_sqrt = I`` (whitened) or ``Luu``, ``shape + (M,)``."""
        if Luu is None:
            return backend(like).from_host(np.broadcast_to(np.eye(shape[-1]), shape + shape[-1:]), like)
        xp = namespace(Luu)
        return xp.asarray(xp.broadcast_to(Luu, shape + shape[-1:]), copy=True)

    def scale_diagonal(self):
        return namespace(self.q_sqrt).linalg.diagonal(self.q_sqrt)

    def dense_scale(self):
        return self.q_sqrt

    def scale_project(self, B):
        return self.q_sqrt.mT @ B

    def covariance_change(self, P1, P2):
        return (P1 @ self.q_sqrt) @ (P2 @ self.q_sqrt).mT - P1 @ P2.mT

    def kl(self, Luu=None):
        return _gaussian_kl(self, Luu)

    def distribution(self, dist):
        # event axes from q_sqrt: q_mu may carry leading sample axes (a mean moved per draw)
        return dist.MultivariateNormal(self.q_mu, scale_tril=self.q_sqrt, validate_args=False).to_event(self.q_sqrt.ndim - 2)


class DiagonalGaussian(CholeskyGaussian):
    """Mean field: ``q_sqrt`` is ``batch_shape + (M,)``, positive."""

    q_sqrt_constraint = "positive"

    @staticmethod
    def _initial_scale(shape, like, Luu):
        """``q_sqrt``, ``shape``: ``1`` (whitened: the prior), else the diagonal nearest to the prior
        ``N(0, Kuu)``, ``S_ii = 1 / (Kuu^{-1})_ii`` (each ``u_i``'s variance given all the others),
        where the KL, ``(tr(Kuu^{-1} S) - log|S|) / 2 + const``, is least."""
        if Luu is None:
            return backend(like).from_host(np.ones(shape), like)
        xp = namespace(Luu)
        eye = xp.eye(Luu.shape[-1], dtype=Luu.dtype, device=device(Luu))
        precision = xp.sum(solve_lower(Luu, xp.broadcast_to(eye, Luu.shape)) ** 2, axis=-2)  # (L^-T L^-1)_ii
        return xp.asarray(xp.broadcast_to(1 / xp.sqrt(precision), shape), copy=True)

    def scale_diagonal(self):
        return self.q_sqrt

    def dense_scale(self):
        xp = namespace(self.q_sqrt)
        return self.q_sqrt[..., None] * xp.eye(self.q_sqrt.shape[-1], dtype=self.q_sqrt.dtype, device=device(self.q_sqrt))

    def scale_project(self, B):
        return self.q_sqrt[..., None] * B

    def covariance_change(self, P1, P2):
        return (P1 * (self.q_sqrt**2 - 1)) @ P2.mT  # S - I first: no cancellation near the prior

    def distribution(self, dist):
        return dist.Normal(self.q_mu, self.q_sqrt, validate_args=False).to_event(self.q_sqrt.ndim)


class PointMass(CholeskyGaussian):
    """``q(u) = delta(u - q_mu)``: ``u`` known (a draw, or values conditioned on). It has no
    covariance: ``scale_project`` is None, so a conditional's change is ``-A^T A`` alone."""

    def __init__(self, q_mu):
        super().__init__(q_mu, None)

    def scale_project(self, B):
        return None


def family(diagonal):
    """The family class for the ``diagonal`` flag of the prior components."""
    return DiagonalGaussian if diagonal else CholeskyGaussian


def prior_distribution(dist, q_mu, Luu=None):
    """``p(u)``: ``N(0, I)`` when whitened (``Luu=None``), else ``N(0, Luu Luu^T)``; event shape
    ``q_mu.shape``, as q's.

    The distributions of q and the prior are built unvalidated (``validate_args=False``): their
    parameters are valid by construction (constrained parameters, a Cholesky factor), and the
    PPLs' default checks would cost several operations and a device-to-host read each time,
    every step (Pyro) or as eager compilations before the first (NumPyro)."""
    xp = namespace(q_mu)
    zeros = xp.zeros_like(q_mu)
    if Luu is None:
        return dist.Normal(zeros, xp.ones_like(q_mu), validate_args=False).to_event(q_mu.ndim)
    scale_tril = xp.broadcast_to(Luu, tuple(q_mu.shape) + tuple(q_mu.shape[-1:]))
    return dist.MultivariateNormal(zeros, scale_tril=scale_tril, validate_args=False).to_event(q_mu.ndim - 1)


def _gaussian_kl(q, Luu):
    """``KL[N(q_mu, S) || N(0, K)]`` summed over the batch; ``Luu=None`` means ``K = I``."""
    xp = namespace(q.q_mu, Luu)
    M = q.q_mu.shape[-1]
    num = array_api_compat.size(q.q_mu) // M
    log_det_S = 2 * xp.sum(xp.log(xp.abs(q.scale_diagonal())))
    if Luu is None:
        trace, mahalanobis, log_det_K = xp.sum(q.q_sqrt**2), xp.sum(q.q_mu**2), 0.0
    else:
        trace = xp.sum(solve_lower(Luu, q.dense_scale()) ** 2)
        mahalanobis = xp.sum(solve_lower(Luu, q.q_mu[..., None]) ** 2)
        log_det_K = 2 * xp.sum(xp.broadcast_to(xp.log(xp.linalg.diagonal(Luu)), q.q_mu.shape))
    return 0.5 * (trace + mahalanobis - num * M + log_det_K - log_det_S)
