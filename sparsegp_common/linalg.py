"""Cholesky factorisation with jitter escalation, and triangular solves, for any backend."""
from sparsegp_common.messages import cholesky_failed
from sparsegp_common.ops import backend, device, namespace


class CholeskyError(RuntimeError):
    """A covariance matrix could not be factorised even after jitter escalation."""


def cholesky(A, jitter=1e-6, max_tries=3, dtype=None):
    """Lower Cholesky factor of ``A + jitter * I``, shape ``(..., M, M)``.

    On failure the jitter is multiplied by 10 up to ``max_tries`` times before a
    :class:`CholeskyError` is raised (under JAX tracing a final failure gives NaN instead).
    ``dtype`` (a dtype, or its name such as ``"float64"``) factorises in another precision and
    returns the factor in the dtype of ``A``; JAX factorises in float64 even without
    ``jax_enable_x64`` (differentiating in ``A``'s dtype then).
    """
    dtype, levels, message = _escalation(A, jitter, max_tries, dtype)
    return backend(A).cholesky(A, levels, message, dtype)


def cholesky_and_solve(K, B, jitter=1e-6, max_tries=3, dtype=None):
    """``L = cholesky(K, jitter, max_tries, dtype)`` and ``A = L^{-1} B``, differentiated as one.

    The whitened SVGP reaches ``Kuu`` only through ``A = Luu^{-1} Kuf`` (Hensman et al., 2015),
    and the two steps together have the gradient of :func:`cholesky_and_solve_cotangents`: without
    a cotangent of ``L`` from elsewhere it needs two triangular solves of ``M x M`` right-hand sides
    and no ``M x M x M`` product, 2 M^3 fewer flops than differentiating the factorisation and the
    solve one after the other. Shapes: ``K (..., M, M)``, ``B (..., M, N)``, batch shapes
    broadcasting; returns ``L (..., M, M)`` and ``A`` with the broadcast batch shape. A factor in
    another ``dtype`` takes the two steps (see :func:`cholesky`).
    """
    dtype, levels, message = _escalation(K, jitter, max_tries, dtype)
    if dtype != K.dtype:
        L = backend(K).cholesky(K, levels, message, dtype)
        return L, solve_lower(L, B)
    return backend(K, B).cholesky_and_solve(K, B, levels, message)


def cholesky_and_solve_cotangents(L, A, L_bar=None, A_bar=None):
    """Reverse mode of :func:`cholesky_and_solve`: the cotangents ``(K_bar, B_bar)`` of ``K`` and
    ``B`` given those of ``L`` and ``A`` (None: not used; their return is then None).

    With ``P = L^T L_bar - A_bar A^T`` (the solve's share of ``L_bar`` enters as ``-A_bar A^T``,
    whose strictly upper part ``Phi`` drops), ``K_bar = L^{-T} Phi(P) L^{-1}`` symmetrised,
    ``Phi`` taking the lower triangle and half the diagonal (Murray, 2016, "Differentiation of
    the Cholesky decomposition", eq. 10), and ``B_bar = L^{-T} A_bar``.
    """
    ops = backend(L)
    B_bar = None if A_bar is None else ops.solve_lower(L, A_bar, True)
    P = None if A_bar is None else -(A_bar @ A.mT)
    if P is not None and tuple(P.shape) != tuple(L.shape):
        P = sum_to(P, tuple(L.shape))  # over B's batch axes that L lacks
    if L_bar is not None:
        P = L.mT @ L_bar if P is None else P + L.mT @ L_bar
    if P is None:
        return None, None
    return factor_cotangent(L, P), B_bar


def factor_cotangent(L, P):
    """``K_bar = L^{-T} Phi(P) L^{-1}`` symmetrised, for ``P = L^T L_bar`` plus what reaches ``L``
    through its solves (see :func:`cholesky_and_solve_cotangents`), ``P`` of ``L``'s shape."""
    xp, ops = namespace(L), backend(L)
    low = xp.tril(P)
    sym = low + low.mT - P * xp.eye(P.shape[-1], dtype=P.dtype, device=device(P))  # Phi(P) + Phi(P)^T
    return 0.5 * ops.solve_lower(L, ops.solve_lower(L, sym, True).mT, True).mT


def phi_inner(L, dK):
    """``Phi(L^{-1} dK L^{-T})`` for the symmetric part of ``dK`` (Phi: the lower triangle, half
    the diagonal): ``L^{-1} dL``, the factor's tangent (Murray, 2016)."""
    xp, ops = namespace(L, dK), backend(L, dK)
    dK = 0.5 * (dK + dK.mT)
    inner = ops.solve_lower(L, ops.solve_lower(L, dK).mT)
    return xp.tril(inner) - 0.5 * xp.eye(L.shape[-1], dtype=L.dtype, device=device(L)) * inner


def sum_to(x, shape):
    """``x`` summed over the leading axes and the broadcast (size-1) axes of ``shape``."""
    xp = namespace(x)
    if x.ndim > len(shape):
        x = xp.sum(x, axis=tuple(range(x.ndim - len(shape))))
    axes = tuple(i for i, (have, want) in enumerate(zip(x.shape, shape)) if want == 1 and have != 1)
    return xp.sum(x, axis=axes, keepdims=True) if axes else x


def _escalation(A, jitter, max_tries, dtype):
    """The factorisation's dtype, its jitter levels and the message of a final failure."""
    xp = namespace(A)
    dtype = A.dtype if dtype is None else getattr(xp, dtype) if isinstance(dtype, str) else dtype
    base = jitter if jitter > 0 else float(xp.finfo(dtype).eps)
    levels = [jitter] + [base * 10.0**i for i in range(1, max_tries + 1)]
    return dtype, levels, cholesky_failed(A.shape, dtype, levels[-1])


def solve_lower(L, B, transpose=False):
    """``L^{-1} B``, or ``L^{-T} B`` with ``transpose``, for lower-triangular ``L``.

    Args:
        L: ``(..., M, M)`` lower triangular with non-zero diagonal.
        B: ``(..., M, K)``; the batch shapes of ``L`` and ``B`` broadcast.

    Returns:
        ``(..., M, K)`` with the broadcast batch shape.
    """
    return backend(L, B).solve_lower(L, B, transpose)
