"""Cholesky factorisation with jitter escalation, and triangular solves, for any backend."""
from sparsegp_common.messages import cholesky_failed
from sparsegp_common.ops import backend, namespace


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
    xp = namespace(A)
    dtype = A.dtype if dtype is None else getattr(xp, dtype) if isinstance(dtype, str) else dtype
    base = jitter if jitter > 0 else float(xp.finfo(dtype).eps)
    levels = [jitter] + [base * 10.0**i for i in range(1, max_tries + 1)]
    return backend(A).cholesky(A, levels, cholesky_failed(A.shape, dtype, levels[-1]), dtype)


def solve_lower(L, B, transpose=False):
    """``L^{-1} B``, or ``L^{-T} B`` with ``transpose``, for lower-triangular ``L``.

    Args:
        L: ``(..., M, M)`` lower triangular with non-zero diagonal.
        B: ``(..., M, K)``; the batch shapes of ``L`` and ``B`` broadcast.

    Returns:
        ``(..., M, K)`` with the broadcast batch shape.
    """
    return backend(L, B).solve_lower(L, B, transpose)
