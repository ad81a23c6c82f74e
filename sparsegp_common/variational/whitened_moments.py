"""The whitened SVGP's ``q(f)`` marginals with a full-covariance ``q(v)``, from ``Kuu`` and ``Kuf``
to the mean and the variance change, differentiated as one step.

With ``L = chol(Kuu + jitter I)``, ``A = L^{-1} Kuf`` and ``S' = q_sqrt q_sqrt^T - I``:

    mean = A^T q_mu,    change = diag(A^T S' A)    (the ``-A^T A + A^T S A`` of
    :func:`~sparsegp_common.variational.conditionals.update`).

Differentiated operation by operation, a step multiplies four ``M x M x N`` products (``q_sqrt^T A``
forward, two for its reverse, and ``A_bar A^T`` in the factorisation's reverse). All four
cotangents meet in ``G = A diag(change_bar) A^T``: ``q_sqrt_bar = 2 G q_sqrt``, and the
factorisation's ``A_bar A^T = 2 S' G + q_mu (A mean_bar)^T``, so that together they take two
``M x M x N`` products (``S' A`` and ``G``) and three of ``M x M x M``: fewer flops where the
minibatch has at least ``1.5 M`` points, which :func:`worth_fusing` decides.
"""
from sparsegp_common.linalg import _escalation, cholesky_and_solve, factor_cotangent, phi_inner, solve_lower, sum_to
from sparsegp_common.ops import backend, device, namespace
from sparsegp_common.variational import CholeskyGaussian
from sparsegp_common.variational.conditionals import update

__all__ = ["cotangents", "factor_and_moments", "moments", "tangents", "whitened_moments", "whitened_update", "worth_fusing"]


def whitened_update(K, Kuf, q, jitter=1e-6, dtype=None, full_cov=False, cross=None):
    """``(L, moments)``: the factor of ``K = Kuu`` and the whitened strategy's
    :func:`~sparsegp_common.variational.conditionals.update` from ``Kuf``, by
    :func:`whitened_moments` where it applies (a full-covariance q, the variances only, a factor
    in ``K``'s dtype, and :func:`worth_fusing`), else by ``cholesky_and_solve`` and ``update``."""
    factor_dtype, levels, message = _escalation(K, jitter, 3, dtype)
    if (type(q) is CholeskyGaussian and not full_cov and cross is None and factor_dtype == K.dtype
            and worth_fusing(K.shape[-1], Kuf.shape[-1])):
        L, mean, change = whitened_moments(K, Kuf, q.q_mu, q.q_sqrt, levels, message)
        return L, (mean, change)
    L, A = cholesky_and_solve(K, Kuf, jitter, dtype=dtype)
    return L, update(A, None, q, whiten=True, full_cov=full_cov, cross=cross)


def worth_fusing(num_inducing, num_points):
    """Whether the fused step does fewer flops: ``2 M^2 N + 3 M^3 <= 4 M^2 N``, i.e. ``N >= 1.5 M``."""
    return 2 * num_points >= 3 * num_inducing


def whitened_moments(K, Kuf, q_mu, q_sqrt, levels, message):
    """``(L, mean, change)`` for ``K = Kuu`` ``(..., M, M)``, ``Kuf`` ``(..., M, N)``, ``q_mu``
    ``(..., M)`` and the lower-triangular ``q_sqrt`` ``(..., M, M)`` (batch shapes broadcasting),
    the factor taken with the first of the jitter ``levels`` that succeeds (``message``: the
    error of a final failure, :func:`sparsegp_common.linalg.cholesky`); ``mean`` and ``change``
    ``(..., N)``. Its reverse mode is :func:`cotangents` (torch), its forward mode
    :func:`tangents` (JAX, which transposes it)."""
    return backend(K, Kuf, q_mu, q_sqrt).whitened_moments(K, Kuf, q_mu, q_sqrt, tuple(levels), message)


def factor_and_moments(K, Kuf, q_mu, q_sqrt, levels, message):
    """The forward pass: ``(L, mean, change, saved)``, ``saved`` as :func:`moments` gives it."""
    L = backend(K).cholesky(K, levels, message, K.dtype)
    return (L,) + moments(L, Kuf, q_mu, q_sqrt)


def moments(L, Kuf, q_mu, q_sqrt):
    """The forward pass from the factor ``L``: ``(mean, change)`` and what the derivatives reuse,
    ``A = L^{-1} Kuf``, ``S' = q_sqrt q_sqrt^T - I`` and ``S' A``."""
    xp = namespace(L, Kuf, q_mu, q_sqrt)
    A = solve_lower(L, Kuf)
    S = q_sqrt @ q_sqrt.mT - xp.eye(q_sqrt.shape[-1], dtype=q_sqrt.dtype, device=device(q_sqrt))
    SA = S @ A
    return (q_mu[..., None, :] @ A)[..., 0, :], xp.sum(A * SA, axis=-2), (A, S, SA)


def tangents(L, saved, q_mu, q_sqrt, dK, dKuf, dq_mu, dq_sqrt):
    """``(dL, dmean, dchange)`` given the tangents of ``(K, Kuf, q_mu, q_sqrt)``, written so that
    their transposition multiplies the ``M x M x N`` products of :func:`cotangents` only: with
    ``P = Phi(L^-1 dK L^-T)``, ``dA = L^-1 dKuf - P A``, and ``dchange = 2 diag(A^T S' L^-1 dKuf)
    + diag(A^T (dS' - 2 P^T S') A)``, one tangent ``M x M`` matrix multiplying ``A``."""
    xp = namespace(L, q_mu, q_sqrt)
    A, S, SA = saved
    P = phi_inner(L, dK)
    dA = solve_lower(L, dKuf)
    dS = dq_sqrt @ q_sqrt.mT
    dS = dS + dS.mT  # X + X^T: transposed, one product (dq q^T + q dq^T would take two)
    dmean = ((dq_mu - (q_mu[..., None, :] @ P)[..., 0, :])[..., None, :] @ A)[..., 0, :] + (q_mu[..., None, :] @ dA)[..., 0, :]
    dchange = 2 * xp.sum(dA * SA, axis=-2) + xp.sum(A * ((dS - 2 * P.mT @ S) @ A), axis=-2)
    return L @ P, dmean, dchange


def cotangents(L, saved, q_mu, q_sqrt, L_bar=None, mean_bar=None, change_bar=None):
    """Reverse mode of :func:`whitened_moments`: ``(K_bar, Kuf_bar, q_mu_bar, q_sqrt_bar)``, each
    with the batch shape of the products (the caller sums it to its input's), given the
    cotangents of ``L``, ``mean`` and ``change`` (None: not used)."""
    A, S, SA = saved
    A_bar = q_mu_bar = q_sqrt_bar = P = None  # P: A_bar A^T, the solves' share of the factor's cotangent
    if change_bar is not None:
        G = (A * change_bar[..., None, :]) @ A.mT
        q_sqrt_bar = 2 * G @ q_sqrt
        A_bar, P = 2 * SA * change_bar[..., None, :], 2 * S @ G
    if mean_bar is not None:
        q_mu_bar = (A @ mean_bar[..., :, None])[..., 0]
        outer = q_mu[..., :, None] * mean_bar[..., None, :]
        A_bar = outer if A_bar is None else A_bar + outer
        outer = q_mu[..., :, None] * q_mu_bar[..., None, :]
        P = outer if P is None else P + outer
    Kuf_bar = None if A_bar is None else solve_lower(L, A_bar, transpose=True)
    if P is not None:
        P = -sum_to(P, tuple(L.shape))  # over the batch axes that L lacks
    if L_bar is not None:
        P = L.mT @ L_bar if P is None else P + L.mT @ L_bar
    K_bar = None if P is None else factor_cotangent(L, P)
    return K_bar, Kuf_bar, q_mu_bar, q_sqrt_bar
